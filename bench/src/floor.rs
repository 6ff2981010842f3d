//! The floor: the least a podCIDR allocator can do. It watches Nodes and writes the next
//! precomputed block into each node without podCIDRs, with bounded concurrency and the same
//! token bucket as the loader; no state beyond a counter, no status, no events, no checks.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use nodeipam_controller::node::IpamNode;
use nodeipam_controller::ratelimit::RateLimiter as Limiter;

#[derive(Debug, Clone, clap::Args)]
pub struct FloorArgs {
    #[arg(long)]
    pub kubeconfig: PathBuf,
    #[arg(long, default_value = "10.0.0.0/8")]
    pub cidr: IpNet,
    #[arg(long, default_value_t = 24)]
    pub mask: u8,
    /// Ranges whose blocks are never handed out (the Service range).
    #[arg(long, value_delimiter = ',')]
    pub exclude: Vec<IpNet>,
    /// Patches in flight at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    #[arg(long, default_value_t = 50.0)]
    pub qps: f64,
    #[arg(long, default_value_t = 100)]
    pub burst: u32,
    /// How the watch reads the nodes there are: pages of 500 (kube's default, like nodeipam),
    /// one unpaged list, or a streaming list (a watch with sendInitialEvents).
    #[arg(long, value_enum, default_value_t = InitialList::Paged)]
    pub initial_list: InitialList,
    /// Page size of a paged initial list.
    #[arg(long, default_value_t = 500)]
    pub page_size: u32,
    /// Write what nodeipam writes: also its annotation, with the node's UID as a precondition.
    #[arg(long)]
    pub like_nodeipam: bool,
    /// Parse only name, uid, resourceVersion, labels and podCIDRs of each Node.
    #[arg(long)]
    pub slim: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum InitialList {
    Paged,
    Unpaged,
    Streaming,
}

impl InitialList {
    fn config(self, page_size: u32) -> watcher::Config {
        let config = watcher::Config::default();
        match self {
            InitialList::Paged => config.page_size(page_size),
            InitialList::Unpaged => watcher::Config {
                page_size: None,
                ..config
            },
            InitialList::Streaming => config.streaming_lists(),
        }
    }
}

/// What the floor reads of a Node.
pub trait PodCidrs {
    fn pod_cidrs(&self) -> Vec<String>;
}

impl PodCidrs for Node {
    fn pod_cidrs(&self) -> Vec<String> {
        self.spec
            .as_ref()
            .and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
    }
}

impl PodCidrs for IpamNode {
    fn pod_cidrs(&self) -> Vec<String> {
        self.pod_cidrs.clone().unwrap_or_default()
    }
}

/// Runs until killed. Prints `floor: synced` once the initial list is done.
pub async fn run(args: FloorArgs) -> anyhow::Result<()> {
    let client = crate::client(&args.kubeconfig).await?;
    if args.slim {
        run_with(Api::<IpamNode>::all(client), args).await
    } else {
        run_with(Api::<Node>::all(client), args).await
    }
}

async fn run_with<K>(api: Api<K>, args: FloorArgs) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = ()>
        + PodCidrs
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let limiter = Arc::new(Limiter::new(args.qps, args.burst));
    let permits = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let exclude = args.exclude.clone();
    let mut free = args
        .cidr
        .subnets(args.mask)
        .with_context(|| format!("/{} blocks of {}", args.mask, args.cidr))?
        .filter(move |b| !exclude.iter().any(|e| e.contains(b) || b.contains(e)));
    // Blocks found on nodes (a restart): skipped when handing out.
    let mut taken: HashSet<IpNet> = HashSet::new();
    let mut asked: HashSet<String> = HashSet::new();
    let mut waiting: Vec<(String, Option<String>)> = Vec::new();
    let mut synced = false;
    let mut writes = JoinSet::new();

    let mut events = watcher::watcher(api.clone(), args.initial_list.config(args.page_size))
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        while let Some(done) = writes.try_join_next() {
            done.context("a patch task failed")??;
        }
        // The nodes to give a block now: those that waited for the initial list, or a new one.
        let ready = match event {
            Ok(Event::Apply(node) | Event::InitApply(node)) => {
                let cidrs = node.pod_cidrs();
                if !cidrs.is_empty() {
                    taken.extend(cidrs.iter().filter_map(|c| c.parse::<IpNet>().ok()));
                    continue;
                }
                let name = node.name_any();
                if !asked.insert(name.clone()) {
                    continue;
                }
                let uid = node.meta().uid.clone();
                if !synced {
                    waiting.push((name, uid));
                    continue;
                }
                vec![(name, uid)]
            }
            Ok(Event::InitDone) => {
                if !synced {
                    synced = true;
                    eprintln!("floor: synced");
                }
                std::mem::take(&mut waiting)
            }
            Ok(Event::Init | Event::Delete(_)) => continue,
            Err(e) => {
                eprintln!("floor: watch error: {e}");
                continue;
            }
        };
        for (name, uid) in ready {
            let block = next_free(&mut free, &taken)?;
            let body = body(&block, uid.as_deref(), args.like_nodeipam);
            writes.spawn(patch(
                api.clone(),
                name,
                body,
                permits.clone(),
                limiter.clone(),
            ));
        }
    }
    bail!("the node watch ended")
}

fn next_free(
    free: &mut impl Iterator<Item = IpNet>,
    taken: &HashSet<IpNet>,
) -> anyhow::Result<IpNet> {
    free.find(|b| !taken.contains(b))
        .context("no free block left")
}

/// The merge patch: the podCIDRs; like nodeipam's, also the UID precondition and annotation.
fn body(block: &IpNet, uid: Option<&str>, like_nodeipam: bool) -> serde_json::Value {
    let cidr = block.to_string();
    let mut body = json!({ "spec": { "podCIDR": cidr, "podCIDRs": [cidr] } });
    if like_nodeipam {
        body["metadata"] = json!({ "uid": uid, "annotations": { "nodeipam.io/config": "bench" } });
    }
    body
}

async fn patch<K>(
    api: Api<K>,
    name: String,
    body: serde_json::Value,
    permits: Arc<Semaphore>,
    limiter: Arc<Limiter>,
) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let _permit = permits.acquire_owned().await?;
    let params = PatchParams::default();
    let mut attempt = 0u32;
    loop {
        limiter.acquire().await;
        match api.patch(&name, &params, &Patch::Merge(&body)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) => {
                attempt += 1;
                if attempt >= 5 {
                    return Err(e).with_context(|| format!("patching node {name}"));
                }
                eprintln!("floor: patching node {name}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
        }
    }
}
