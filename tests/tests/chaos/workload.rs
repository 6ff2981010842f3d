//! The cluster's own churn during the soak: nodes arriving and leaving (names reused, as an
//! autoscaler does), two configs switched off and on, one of them deleted and created again
//! over a new range, and a pool carving ranges for a third group of nodes and retiring them.
//! Every step is drawn from the seed; a step the API server refuses (it may be restarting) is
//! logged and skipped.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodeipam_crd::{
    Allocation, NodeIPAMConfig, NodeIPAMPool, NodeIPAMPoolSpec, PoolFamilySpec, PoolHeadroom,
    PoolRanges, PoolScaleDown,
};

use super::Rng;
use crate::support::{family, node, spec};

/// The label that says which config (or the pool) serves a node.
pub const GROUP: &str = "chaos.nodeipam.io/group";
/// At most this many nodes of a group exist at once: a few more than ca and cb can serve, so
/// new nodes get a block at once when one is free and wait for one otherwise.
const PER_GROUP: usize = 6;
/// The configs the workload switches off and on: (name, first range). /28 blocks, 4 a range,
/// for up to [`PER_GROUP`] nodes each.
pub const CONFIGS: [(&str, &str); 2] = [("ca", "10.10.0.0/26"), ("cb", "10.20.0.0/26")];
/// How many nodes of each group can hold a block at once: ca, cb, the pool.
const CAPACITY: [usize; 3] = [4, 4, 8];
pub const POOL: &str = "cp";

/// The groups: a node's label says which config (or the pool) serves it.
const GROUPS: [&str; 3] = ["ca", "cb", POOL];

/// How many nodes of `group` can hold a block at once (0 for a group not ours).
pub fn capacity(group: &str) -> usize {
    GROUPS
        .iter()
        .position(|g| *g == group)
        .map_or(0, |i| CAPACITY[i])
}

/// The range of the `n`th incarnation of config cb (the first is [`CONFIGS`]'s).
fn cb_range(n: u32) -> String {
    format!("10.20.{}.0/26", n % 256)
}

pub fn config_spec(name: &str, cidr: &str) -> nodeipam_crd::NodeIPAMConfigSpec {
    let selector = crate::support::selector(&[(GROUP, "In", &[name])]);
    spec(family(cidr, 28), None, selector)
}

/// /26 ranges of /28 blocks carved from a /25: 4 nodes a range, at most 2 ranges.
pub fn pool_spec() -> NodeIPAMPoolSpec {
    NodeIPAMPoolSpec {
        ipv4: Some(PoolFamilySpec {
            cidrs: vec!["10.30.0.0/25".into()],
            range_mask_size: 26,
            per_node_mask_size: 28,
        }),
        ipv6: None,
        node_selector: crate::support::selector(&[(GROUP, "In", &[POOL])]),
        ranges: PoolRanges { min: 1, max: 2 },
        headroom: PoolHeadroom { blocks: 1 },
        scale_down: PoolScaleDown {
            empty_for: "10s".into(),
        },
    }
}

/// The workload's log and what it did.
#[derive(Default)]
pub struct Tally {
    pub log: Vec<String>,
    pub created: u64,
    pub deleted: u64,
    pub toggles: u64,
    pub refused: u64,
    /// Why steps were refused, with how often.
    pub refusals: BTreeMap<String, u64>,
    /// Names of nodes deleted, to reuse.
    pub gone: Vec<String>,
    /// How many configs named cb have been created (the range of the next).
    pub cb_incarnations: u32,
    /// Groups the nemesis has a late podCIDR write on its way for, and until when: none of
    /// their nodes is deleted and their config is left as it is, so the blocks the nemesis
    /// filled stay taken and the caught node still waits when that write lands.
    pub calm: BTreeMap<String, std::time::Instant>,
}

impl Tally {
    fn calm(&self, group: &str) -> bool {
        self.calm
            .get(group)
            .is_some_and(|until| *until > std::time::Instant::now())
    }
}

pub fn start(
    admin: Client,
    seed: u64,
    began: std::time::Instant,
) -> (Arc<Mutex<Tally>>, tokio::task::JoinHandle<()>) {
    let tally = Arc::new(Mutex::new(Tally {
        cb_incarnations: 1,
        ..Tally::default()
    }));
    let out = tally.clone();
    let task = tokio::spawn(async move {
        let mut rng = Rng::new(seed ^ 0x05EE_D0FC_4A05);
        loop {
            if let Some(line) = churn(&admin, &mut rng, &out).await {
                let line = format!("{:7.1}s {line}", began.elapsed().as_secs_f64());
                out.lock().expect("tally").log.push(line);
            }
            tokio::time::sleep(Duration::from_millis(rng.between(200, 1500))).await;
        }
    });
    (tally, task)
}

/// One step of churn; what it did, if anything.
async fn churn(admin: &Client, rng: &mut Rng, tally: &Mutex<Tally>) -> Option<String> {
    let roll = rng.below(100);
    let result = match roll {
        0..45 => create_nodes(admin, rng, tally).await,
        45..85 => delete_node(admin, rng, tally).await,
        85..97 => toggle(admin, rng, tally).await,
        _ => replace_cb(admin, tally).await,
    };
    let mut t = tally.lock().expect("tally");
    match &result {
        Ok(Some(what)) if what.starts_with("created node") => {
            t.created += what.matches("created node").count() as u64;
        }
        Ok(Some(what)) if what.starts_with("deleted node") => t.deleted += 1,
        Ok(Some(what)) if what.contains("allocation") => t.toggles += 1,
        Err(e) => {
            t.refused += 1;
            *t.refusals.entry(reason(e)).or_default() += 1;
        }
        _ => {}
    }
    match result {
        Ok(line) => line,
        Err(e) => Some(format!("refused: {e}")),
    }
}

/// A refusal's kind: the API server's code and reason, or the client's error without detail.
fn reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.reason),
        other => other.to_string().chars().take(60).collect(),
    }
}

/// One node, or now and then a wave of up to five (an autoscaler's scale-up).
async fn create_nodes(
    admin: &Client,
    rng: &mut Rng,
    tally: &Mutex<Tally>,
) -> Result<Option<String>, kube::Error> {
    let wave = if rng.below(4) == 0 {
        rng.between(2, 5)
    } else {
        1
    };
    let mut created = Vec::new();
    for _ in 0..wave {
        if let Some(line) = create_node(admin, rng, tally).await? {
            created.push(line);
        }
    }
    Ok((!created.is_empty()).then(|| created.join("; ")))
}

/// A new node name: random letters (so a new node may sort anywhere among those waiting, as
/// an autoscaler's do) and its group, or a name that was deleted before (names are reused).
fn name(rng: &mut Rng, tally: &Mutex<Tally>) -> String {
    let t = tally.lock().expect("tally");
    if !t.gone.is_empty() && rng.below(3) == 0 {
        return t.gone[rng.below(t.gone.len() as u64) as usize].clone();
    }
    let word: String = (0..5)
        .map(|_| char::from(b'a' + rng.below(26) as u8))
        .collect();
    format!("{word}-{}", GROUPS[rng.below(3) as usize])
}

/// The group a node's name ends with.
fn group_of(name: &str) -> &str {
    name.rsplit_once('-').map_or(name, |(_, g)| g)
}

async fn create_node(
    admin: &Client,
    rng: &mut Rng,
    tally: &Mutex<Tally>,
) -> Result<Option<String>, kube::Error> {
    let name = name(rng, tally);
    let g = group_of(&name);
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let lp = kube::api::ListParams::default().labels(&format!("{GROUP}={g}"));
    let group = api.list_metadata(&lp).await?.items;
    if group.len() >= PER_GROUP || group.iter().any(|n| n.name_any() == name) {
        return Ok(None);
    }
    api.create(&PostParams::default(), &node(&name, &[(GROUP, g)], &[]))
        .await?;
    Ok(Some(format!("created node {name}")))
}

async fn delete_node(
    admin: &Client,
    rng: &mut Rng,
    tally: &Mutex<Tally>,
) -> Result<Option<String>, kube::Error> {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let lp = kube::api::ListParams::default().labels(GROUP);
    let mut nodes = api.list_metadata(&lp).await?.items;
    {
        let t = tally.lock().expect("tally");
        nodes.retain(|n| !t.calm(n.labels().get(GROUP).map_or("", String::as_str)));
    }
    if nodes.is_empty() {
        return Ok(None);
    }
    let name = nodes[rng.below(nodes.len() as u64) as usize].name_any();
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => {
            let mut t = tally.lock().expect("tally");
            if !t.gone.contains(&name) && t.gone.len() < 64 {
                t.gone.push(name.clone());
            }
            Ok(Some(format!("deleted node {name}")))
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

async fn toggle(
    admin: &Client,
    rng: &mut Rng,
    tally: &Mutex<Tally>,
) -> Result<Option<String>, kube::Error> {
    let (name, _) = CONFIGS[rng.below(2) as usize];
    if tally.lock().expect("tally").calm(name) {
        return Ok(None);
    }
    let api: Api<NodeIPAMConfig> = Api::all(admin.clone());
    let Some(cfg) = api.get_opt(name).await? else {
        return Ok(None);
    };
    // Off now and then, on again soon: a config switched off serves nobody, and a run whose
    // configs are mostly off tries the writers little.
    let next = match cfg.spec.allocation {
        Allocation::Enabled if rng.below(3) == 0 => Allocation::Disabled,
        Allocation::Enabled => return Ok(None),
        Allocation::Disabled => Allocation::Enabled,
    };
    let patch = serde_json::json!({ "spec": { "allocation": next } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(Some(format!("set {name} allocation {next:?}")))
}

/// Deletes config cb (it drains as its nodes leave, then goes), or, once it is gone, creates
/// it again over the next range.
async fn replace_cb(admin: &Client, tally: &Mutex<Tally>) -> Result<Option<String>, kube::Error> {
    let api: Api<NodeIPAMConfig> = Api::all(admin.clone());
    match api.get_opt("cb").await? {
        Some(cfg) if cfg.metadata.deletion_timestamp.is_some() => Ok(None),
        Some(_) if tally.lock().expect("tally").calm("cb") => Ok(None),
        Some(_) => {
            api.delete("cb", &DeleteParams::default()).await?;
            Ok(Some("deleted config cb".into()))
        }
        None => {
            let n = tally.lock().expect("tally").cb_incarnations;
            let range = cb_range(n);
            let obj = NodeIPAMConfig::new("cb", config_spec("cb", &range));
            api.create(&PostParams::default(), &obj).await?;
            tally.lock().expect("tally").cb_incarnations += 1;
            Ok(Some(format!("created config cb over {range}")))
        }
    }
}

/// Creates the configs and the pool the workload starts from.
pub async fn install(admin: &Client) {
    for (name, cidr) in CONFIGS {
        crate::support::create_config(admin, name, config_spec(name, cidr)).await;
    }
    Api::<NodeIPAMPool>::all(admin.clone())
        .create(
            &PostParams::default(),
            &NodeIPAMPool::new(POOL, pool_spec()),
        )
        .await
        .unwrap_or_else(|e| panic!("step=chaos-install: create NodeIPAMPool {POOL}: {e}"));
}

/// Ends the churn: every config enabled again, cb there, so every node can be served.
pub async fn enable_all(admin: &Client, tally: &Mutex<Tally>) {
    let api: Api<NodeIPAMConfig> = Api::all(admin.clone());
    let cb = api.get_opt("cb").await.expect("get config cb");
    if cb.is_some_and(|c| c.metadata.deletion_timestamp.is_some()) {
        // Its nodes hold it (that is the drain): they go, as when an operator retires a range.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
        let lp = kube::api::ListParams::default().labels(&format!("{GROUP}=cb"));
        nodes
            .delete_collection(&DeleteParams::default(), &lp)
            .await
            .expect("delete the nodes of config cb");
    }
    crate::support::wait_for("config cb to be deleted or present", || async {
        match api.get_opt("cb").await.ok()? {
            Some(c) if c.metadata.deletion_timestamp.is_some() => None,
            Some(_) => Some(()),
            None => replace_cb(admin, tally).await.ok().map(|_| ()),
        }
    })
    .await;
    for (name, _) in CONFIGS {
        crate::support::set_allocation(admin, name, Allocation::Enabled).await;
    }
}

/// Deletes nodes of each group beyond what its range can serve (those waiting first), so that
/// every node left must be served once the faults stop.
pub async fn trim(admin: &Client) {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    for (g, cap) in GROUPS.iter().zip(CAPACITY) {
        let lp = kube::api::ListParams::default().labels(&format!("{GROUP}={g}"));
        let mut nodes = api.list(&lp).await.expect("list nodes").items;
        // Waiting ones first: false sorts before true.
        nodes.sort_by_key(|n| n.spec.as_ref().and_then(|s| s.pod_cidrs.as_ref()).is_some());
        let extra = nodes.len().saturating_sub(cap);
        for n in &nodes[..extra] {
            match api.delete(&n.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => panic!("step=chaos-trim: delete node {}: {e}", n.name_any()),
            }
        }
    }
}

/// Each node's podCIDRs, for the final check that every node was served.
pub async fn nodes(admin: &Client) -> BTreeMap<String, Vec<String>> {
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    api.list(&Default::default())
        .await
        .expect("list nodes")
        .items
        .into_iter()
        .map(|n| {
            let cidrs = n.spec.clone().and_then(|s| s.pod_cidrs).unwrap_or_default();
            (n.name_any(), cidrs)
        })
        .collect()
}
