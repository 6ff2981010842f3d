//! Prometheus metrics of the controller and webhook. Where a meaning matches
//! kube-controller-manager's cidrset metrics, the same names are used so dashboards carry over.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// kcm's `clusterCIDR` label, kept by name for dashboard compatibility.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ClusterCidr(pub String);

impl EncodeLabelSet for ClusterCidr {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        [("clusterCIDR", self.0.as_str())].encode(encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigFamily {
    pub config: String,
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub result: String,
}

pub struct Metrics {
    pub allocations: Family<ClusterCidr, Counter>,
    pub releases: Family<ClusterCidr, Counter>,
    pub usage: Family<ClusterCidr, Gauge<f64, AtomicU64>>,
    pub tries: Family<ClusterCidr, Histogram>,
    pub blocks_allocated: Family<ConfigFamily, Gauge>,
    pub blocks_capacity: Family<ConfigFamily, Gauge>,
    pub pending_nodes: Gauge,
    pub unmanaged_pod_cidrs: Gauge,
    pub leaked_blocks: Gauge,
    pub assignment_failures: Counter,
    pub reconcile_errors: Family<Kind, Counter>,
    pub reconcile_duration: Histogram,
    pub leader: Gauge,
    /// When the allocation loop last took a step (seconds since the epoch): liveness.
    pub allocation_step: Gauge,
    pub admissions: Family<Outcome, Counter>,
    pub registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let tries = || Histogram::new(exponential_buckets(1.0, 2.0, 10));
        let mut m = Metrics {
            allocations: Family::default(),
            releases: Family::default(),
            usage: Family::default(),
            tries: Family::new_with_constructor(tries),
            blocks_allocated: Family::default(),
            blocks_capacity: Family::default(),
            pending_nodes: Gauge::default(),
            unmanaged_pod_cidrs: Gauge::default(),
            leaked_blocks: Gauge::default(),
            assignment_failures: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0001, 4.0, 10)),
            leader: Gauge::default(),
            allocation_step: Gauge::default(),
            admissions: Family::default(),
            registry: Registry::default(),
        };
        let kcm = m.registry.sub_registry_with_prefix("node_ipam_controller");
        kcm.register(
            "cidrset_cidrs_allocations",
            "Blocks handed out, per range",
            m.allocations.clone(),
        );
        kcm.register(
            "cidrset_cidrs_releases",
            "Blocks released, per range",
            m.releases.clone(),
        );
        kcm.register(
            "cidrset_usage_cidrs",
            "Fraction of the range's blocks in use",
            m.usage.clone(),
        );
        kcm.register(
            "cidrset_allocation_tries_per_request",
            "Configs tried per allocation request",
            m.tries.clone(),
        );
        let own = m.registry.sub_registry_with_prefix("nodeipam");
        own.register(
            "config_blocks_allocated",
            "Blocks held by nodes, per config and family",
            m.blocks_allocated.clone(),
        );
        own.register(
            "config_blocks_capacity",
            "Blocks in the range, per config and family",
            m.blocks_capacity.clone(),
        );
        own.register(
            "pending_nodes",
            "Nodes waiting for a block",
            m.pending_nodes.clone(),
        );
        own.register(
            "unmanaged_pod_cidrs",
            "podCIDRs held by nodes that lie in no config",
            m.unmanaged_pod_cidrs.clone(),
        );
        own.register(
            "leaked_blocks",
            "Blocks kept occupied after an ambiguous write, until restart",
            m.leaked_blocks.clone(),
        );
        own.register(
            "cidr_assignment_failures",
            "podCIDR writes given up on after the API server refused every attempt",
            m.assignment_failures.clone(),
        );
        own.register(
            "reconcile_errors",
            "Errors of the API side, by kind",
            m.reconcile_errors.clone(),
        );
        own.register(
            "reconcile_duration_seconds",
            "Time to handle one event in the allocation loop",
            m.reconcile_duration.clone(),
        );
        own.register(
            "leader",
            "1 while this replica holds the lease and allocates",
            m.leader.clone(),
        );
        own.register(
            "allocation_loop_last_step_timestamp_seconds",
            "When the leader's allocation loop last handled an event or tick",
            m.allocation_step.clone(),
        );
        own.register(
            "webhook_admissions",
            "Admission reviews answered, by result",
            m.admissions.clone(),
        );
        m
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// The allocation loop took a step now.
    pub fn allocation_stepped(&self) {
        self.allocation_step
            .set(k8s_openapi::jiff::Timestamp::now().as_second());
    }

    pub fn reconcile_error(&self, kind: &str) {
        self.reconcile_errors
            .get_or_create(&Kind { kind: kind.into() })
            .inc();
    }

    pub fn admission(&self, result: &str) {
        self.admissions
            .get_or_create(&Outcome {
                result: result.into(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The kcm label for a range.
pub fn cidr_label(range: &ipnet::IpNet) -> ClusterCidr {
    ClusterCidr(range.to_string())
}
