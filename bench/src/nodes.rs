//! The loader: Node objects shaped like a kubelet's registration (labels, capacity, addresses),
//! created as fast as the API server takes them with a bounded number in flight.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde::{Deserialize, Serialize};

use nodeipam_controller::ratelimit::RateLimiter as Limiter;

/// Label on every Node the benchmarks create; its value names the group (burst, existing, probe).
pub const BENCH_LABEL: &str = "bench.nodeipam.io/group";

/// A Node named `name` in `group`, like a kubelet registers it; `pod_cidr` pre-set if given.
pub fn node(name: &str, group: &str, index: u32, pod_cidr: Option<&IpNet>) -> Node {
    let labels = BTreeMap::from([
        (BENCH_LABEL.to_string(), group.to_string()),
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        (
            "node.kubernetes.io/instance-type".to_string(),
            "bench-8x32".to_string(),
        ),
    ]);
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity("8".into())),
        ("memory".to_string(), Quantity("32Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
        ("ephemeral-storage".to_string(), Quantity("100Gi".into())),
    ]);
    let ip = format!("172.16.{}.{}", (index >> 8) & 0xff, index & 0xff);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: pod_cidr.map(ToString::to_string),
            pod_cidrs: pod_cidr.map(|c| vec![c.to_string()]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip,
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.to_string(),
                },
            ]),
            ..NodeStatus::default()
        }),
    }
}

/// What the loader saw.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadReport {
    pub created: usize,
    /// Seconds from the first request sent to the last answer.
    pub seconds: f64,
    pub per_second: f64,
    /// Requests sent again after a 429, a 5xx or a transport error.
    pub retries: u64,
    #[serde(skip)]
    pub first_sent: Option<Instant>,
}

/// Creates every node with at most `concurrency` requests in flight, each through `limiter`.
/// Fails on the first error that is not worth a retry, or after 10 tries of one node.
pub async fn create_all(
    client: &kube::Client,
    nodes: Vec<Node>,
    concurrency: usize,
    limiter: Arc<Limiter>,
) -> anyhow::Result<LoadReport> {
    let api: Api<Node> = Api::all(client.clone());
    let retries = Arc::new(AtomicU64::new(0));
    let count = nodes.len();
    let began = Instant::now();
    let mut results = futures::stream::iter(nodes)
        .map(|node| {
            let (api, limiter, retries) = (api.clone(), limiter.clone(), retries.clone());
            async move { create_one(&api, &node, &limiter, &retries).await }
        })
        .buffer_unordered(concurrency.max(1));
    while let Some(result) = results.next().await {
        result?;
    }
    let seconds = began.elapsed().as_secs_f64();
    Ok(LoadReport {
        created: count,
        seconds,
        per_second: count as f64 / seconds.max(1e-9),
        retries: retries.load(Ordering::Relaxed),
        first_sent: Some(began),
    })
}

async fn create_one(
    api: &Api<Node>,
    node: &Node,
    limiter: &Limiter,
    retries: &AtomicU64,
) -> anyhow::Result<()> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let mut attempt = 0u32;
    loop {
        limiter.acquire().await;
        let err = match api.create(&PostParams::default(), node).await {
            Ok(_) => return Ok(()),
            // An earlier try landed although its answer was lost.
            Err(kube::Error::Api(s)) if s.code == 409 && attempt > 0 => return Ok(()),
            Err(kube::Error::Api(s)) if s.code != 429 && s.code < 500 => {
                bail!("creating node {name}: {} {}", s.code, s.message)
            }
            Err(e) => e,
        };
        attempt += 1;
        if attempt >= 10 {
            return Err(err).with_context(|| format!("creating node {name}: {attempt} tries"));
        }
        retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
    }
}

/// `count` blocks of `range` carved into `/mask`, in order, skipping any that overlap `exclude`.
pub fn blocks(
    range: IpNet,
    mask: u8,
    exclude: &[IpNet],
    count: usize,
) -> anyhow::Result<Vec<IpNet>> {
    let all = range
        .subnets(mask)
        .with_context(|| format!("/{mask} blocks of {range}"))?;
    let picked: Vec<IpNet> = all
        .filter(|b| !exclude.iter().any(|e| e.contains(b) || b.contains(e)))
        .take(count)
        .collect();
    if picked.len() < count {
        bail!(
            "{range} has only {} free /{mask} blocks, {count} needed",
            picked.len()
        );
    }
    Ok(picked)
}

/// Fills the cluster with `n` nodes named `existing-NNNNNN` that hold the first `n` free `/mask`
/// blocks of the cluster CIDR, as if allocated earlier; `concurrency` creates in flight.
pub async fn fill(
    kubeconfig: &std::path::Path,
    mask: u8,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<LoadReport> {
    let range: IpNet = crate::common::CLUSTER_CIDR.parse()?;
    let service: IpNet = crate::common::SERVICE_RANGE.parse()?;
    let batch = blocks(range, mask, &[service], n)?
        .iter()
        .enumerate()
        .map(|(i, b)| node(&format!("existing-{i:06}"), "existing", i as u32, Some(b)))
        .collect();
    let loader = crate::client(kubeconfig).await?;
    let unlimited = Arc::new(Limiter::new(0.0, 1));
    create_all(&loader, batch, concurrency, unlimited)
        .await
        .context("filling the cluster with nodes that hold podCIDRs")
}

/// One node of its own group `group`, for an observer to time its podCIDRs.
pub async fn create_probe(client: &kube::Client, group: &str) -> anyhow::Result<()> {
    let unlimited = Arc::new(Limiter::new(0.0, 1));
    create_all(client, vec![node(group, group, 0, None)], 1, unlimited).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_skip_the_excluded_range() {
        let range: IpNet = "10.0.0.0/8".parse().expect("cidr");
        let svc: IpNet = "10.96.0.0/16".parse().expect("cidr");
        let b = blocks(range, 24, &[svc], 96 * 256 + 2).expect("enough");
        assert_eq!(b[96 * 256 - 1].to_string(), "10.95.255.0/24");
        assert_eq!(b[96 * 256].to_string(), "10.97.0.0/24");
        assert!(blocks("10.0.0.0/30".parse().expect("cidr"), 31, &[], 3).is_err());
    }

    #[test]
    fn node_shape() {
        let cidr: IpNet = "10.0.1.0/24".parse().expect("cidr");
        let n = node("n-1", "burst", 258, Some(&cidr));
        let spec = n.spec.expect("spec");
        assert_eq!(spec.pod_cidrs, Some(vec!["10.0.1.0/24".to_string()]));
        let addr = &n.status.expect("status").addresses.expect("addresses")[0];
        assert_eq!(addr.address, "172.16.1.2");
    }
}
