//! Prometheus metrics of the controller and webhook. Where a meaning matches
//! kube-controller-manager's cidrset metrics, the same names are used so dashboards carry over;
//! so are the process, leader election and API client metrics every Kubernetes component has.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

use crate::api_metrics::ApiMetrics;
use crate::process_metrics::{self, ProcessCollector};

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

/// A condition of a config, as kube-state-metrics labels conditions: the series of the
/// current status is 1, the other two are 0.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigCondition {
    pub config: String,
    pub condition: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigName {
    pub config: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolName {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Kind {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Handover {
    pub handover: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SealResult {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SealStep {
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    pub result: String,
}

/// What the binary was built from, as Kubernetes components label `kubernetes_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildInfo {
    pub version: String,
    pub commit: String,
    pub rustc: String,
}

/// client-go's label of `leader_election_master_status`: the lease's name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseName {
    pub name: String,
}

pub struct Metrics {
    pub allocations: Family<ClusterCidr, Counter>,
    pub releases: Family<ClusterCidr, Counter>,
    pub usage: Family<ClusterCidr, Gauge<f64, AtomicU64>>,
    /// kcm's `cirdset_max_cidrs` (kcm's spelling): blocks in the range.
    pub max_cidrs: Family<ClusterCidr, Gauge>,
    pub tries: Family<ClusterCidr, Histogram>,
    pub blocks_allocated: Family<ConfigFamily, Gauge>,
    pub blocks_capacity: Family<ConfigFamily, Gauge>,
    pub conditions: Family<ConfigCondition, Gauge>,
    pub draining: Family<ConfigName, Gauge>,
    pub pending_nodes: Gauge,
    pub unmanaged_pod_cidrs: Gauge,
    pub pod_network_bytes: Gauge,
    pub leaked_blocks: Gauge,
    /// 1 once a relist showed the API's storage went back in time: allocation is stopped
    /// until the process restarts.
    pub storage_went_back: Gauge,
    pub assignment_failures: Counter,
    pub reconcile_errors: Family<Kind, Counter>,
    pub reconcile_duration: Histogram,
    pub leader: Gauge,
    pub takeovers: Family<Handover, Counter>,
    pub seals: Family<SealResult, Counter>,
    pub seal_retries: Family<SealStep, Counter>,
    /// When the allocation loop last took a step (seconds since the epoch): liveness.
    pub allocation_step: Gauge,
    pub admissions: Family<Outcome, Counter>,
    pub pool_ranges: Family<PoolName, Gauge>,
    pub pool_carves: Family<PoolName, Counter>,
    pub pool_retires: Family<PoolName, Counter>,
    pub pool_scale_up: Family<PoolName, Histogram>,
    pub build_info: Family<BuildInfo, Gauge>,
    /// client-go's `leader_election_master_status`: 1 while this replica holds the lease.
    pub lease_held: Family<LeaseName, Gauge>,
    /// 1 while this replica's webhook is ready and answers ([`crate::health::webhook_serving`]).
    pub webhook_serving: Gauge,
    /// 1 when start-up found a Service range to keep out of pod ranges ([`crate::startup`]).
    pub service_ranges_known: Gauge,
    /// NodeIPAMConfig ranges outside the consumers' pod network at start-up.
    pub ranges_outside_pod_network: Gauge,
    pub api: ApiMetrics,
    pub registry: Registry,
    /// Every registered family: its full name and type (for [`Metrics::exposed_names`]).
    registered: Vec<(String, MetricType)>,
}

/// Registers into one prefixed sub-registry and records what it registered.
struct Registrar<'a> {
    registry: &'a mut Registry,
    prefix: &'static str,
    names: &'a mut Vec<(String, MetricType)>,
}

impl Registrar<'_> {
    fn register<M: Metric + TypedMetric>(&mut self, name: &str, help: &str, metric: M) {
        let full = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}_{name}", self.prefix)
        };
        self.names.push((full, M::TYPE));
        self.registry.register(name, help, metric);
    }
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
            max_cidrs: Family::default(),
            tries: Family::new_with_constructor(tries),
            blocks_allocated: Family::default(),
            blocks_capacity: Family::default(),
            conditions: Family::default(),
            draining: Family::default(),
            pending_nodes: Gauge::default(),
            unmanaged_pod_cidrs: Gauge::default(),
            pod_network_bytes: Gauge::default(),
            leaked_blocks: Gauge::default(),
            storage_went_back: Gauge::default(),
            assignment_failures: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.0001, 4.0, 10)),
            leader: Gauge::default(),
            takeovers: Family::default(),
            seals: Family::default(),
            seal_retries: Family::default(),
            allocation_step: Gauge::default(),
            admissions: Family::default(),
            pool_ranges: Family::default(),
            pool_carves: Family::default(),
            pool_retires: Family::default(),
            pool_scale_up: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.1, 2.0, 12))
            }),
            build_info: Family::default(),
            lease_held: Family::default(),
            webhook_serving: Gauge::default(),
            service_ranges_known: Gauge::default(),
            ranges_outside_pod_network: Gauge::default(),
            api: ApiMetrics::default(),
            registry: Registry::default(),
            registered: Vec::new(),
        };
        let mut names = Vec::new();
        m.register_common(&mut names);
        let mut kcm = Registrar {
            prefix: "node_ipam_controller",
            registry: m.registry.sub_registry_with_prefix("node_ipam_controller"),
            names: &mut names,
        };
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
        // kcm registers this one misspelled ("cirdset"); the same name keeps its dashboards.
        kcm.register(
            "cirdset_max_cidrs",
            "Blocks in the range (the most that can be allocated)",
            m.max_cidrs.clone(),
        );
        kcm.register(
            "cidrset_allocation_tries_per_request",
            "Configs tried per allocation request",
            m.tries.clone(),
        );
        let mut own = Registrar {
            prefix: "nodeipam",
            registry: m.registry.sub_registry_with_prefix("nodeipam"),
            names: &mut names,
        };
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
            "config_condition",
            "A config's status conditions: 1 for the current status of each condition",
            m.conditions.clone(),
        );
        own.register(
            "config_draining",
            "1 while a deleted or disabled config still has nodes holding its blocks",
            m.draining.clone(),
        );
        own.register(
            "pending_nodes",
            "Nodes waiting for their podCIDRs: no config can give them a block, or their podCIDR write has not been seen to land yet",
            m.pending_nodes.clone(),
        );
        own.register(
            "unmanaged_pod_cidrs",
            "podCIDRs held by nodes that lie in no config",
            m.unmanaged_pod_cidrs.clone(),
        );
        own.register(
            "pod_network_configmap_bytes",
            "Bytes of data in the pod-network ConfigMap as last written or tried, against the API server's limit of 1048576",
            m.pod_network_bytes.clone(),
        );
        own.register(
            "leaked_blocks",
            "Blocks kept occupied now after an ambiguous write, until the write can no longer land",
            m.leaked_blocks.clone(),
        );
        own.register(
            "storage_went_back",
            "1 once a relist returned an object older than it was seen (etcd restored from an older backup): allocation is stopped until the controller restarts",
            m.storage_went_back.clone(),
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
            "leader_takeovers",
            "Times this replica became the allocating leader, by what it waited for: clean (nothing: the previous leader vouched that none of its writes can still land, or nothing was ever allocated), unclean (the previous leader's writes in flight) or unknown (its whole term, then its writes: the Lease was missing or freed by hand)",
            m.takeovers.clone(),
        );
        own.register(
            "takeover_sealed_nodes",
            "Nodes without podCIDRs a new leader wrote to before its first podCIDR write, so that no write of a previous leader can land on them: sealed (the seal landed, or the node is gone)",
            m.seals.clone(),
        );
        own.register(
            "takeover_seal_retries",
            "Retries of a take-over's seal, by step: list (the Node list failed) or write (a Node's seal was throttled, refused or not answered); the new leader allocates nothing until every Node is sealed",
            m.seal_retries.clone(),
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
        own.register(
            "pool_ranges",
            "Ranges (active child NodeIPAMConfigs) of a NodeIPAMPool",
            m.pool_ranges.clone(),
        );
        own.register(
            "pool_ranges_carved",
            "Child ranges a NodeIPAMPool carved",
            m.pool_carves.clone(),
        );
        own.register(
            "pool_ranges_retired",
            "Empty child ranges a NodeIPAMPool retired",
            m.pool_retires.clone(),
        );
        own.register(
            "pool_scale_up_seconds",
            "From a pool's decision to carve to the new range accepting allocations (published)",
            m.pool_scale_up.clone(),
        );
        own.register(
            "build_info",
            "1, labelled with the version, git commit and rustc version the binary was built from",
            m.build_info.clone(),
        );
        own.register(
            "webhook_serving",
            "1 while this replica's webhook is ready (cluster listed once, certificate loaded) and answered its own check within 30 s",
            m.webhook_serving.clone(),
        );
        own.register(
            "service_ranges_known",
            "1 when start-up found a Service range to keep out of pod ranges (--service-cidr or ServiceCIDR objects), else 0",
            m.service_ranges_known.clone(),
        );
        own.register(
            "ranges_outside_pod_network",
            "NodeIPAMConfig ranges outside the consumers' pod network (--pod-network-supernet, flannel's Network) at start-up",
            m.ranges_outside_pod_network.clone(),
        );
        own.register(
            "api_requests",
            "Requests to the API server, by verb (as apiserver_request_total reports it), resource, subresource and code",
            m.api.by_resource.clone(),
        );
        m.build_info
            .get_or_create(&BuildInfo {
                version: crate::version::VERSION.into(),
                commit: crate::version::GIT_COMMIT.into(),
                rustc: crate::version::RUSTC.into(),
            })
            .set(1);
        m.registered = names;
        m
    }

    /// The families under the names every Kubernetes component exposes (no prefix): the
    /// process collector, leader election and client-go's request metrics.
    fn register_common(&mut self, names: &mut Vec<(String, MetricType)>) {
        self.registry.register_collector(Box::new(ProcessCollector));
        for (name, _, kind) in process_metrics::FAMILIES {
            names.push((name.to_string(), kind));
        }
        let mut root = Registrar {
            prefix: "",
            registry: &mut self.registry,
            names,
        };
        root.register(
            "leader_election_master_status",
            "1 while this replica holds the lease named by the label, else 0",
            self.lease_held.clone(),
        );
        root.register(
            "rest_client_requests",
            "HTTP requests to the API server, by status code, method and host",
            self.api.requests.clone(),
        );
        root.register(
            "rest_client_request_duration_seconds",
            "Latency of requests to the API server until the response's headers, by verb (the HTTP method) and host",
            self.api.duration.clone(),
        );
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Whether this replica holds the lease `name` (client-go's `leader_election_master_status`).
    pub fn set_lease_held(&self, name: &str, held: bool) {
        self.lease_held
            .get_or_create(&LeaseName { name: name.into() })
            .set(i64::from(held));
    }

    /// A take-over's seal: how many Nodes it sealed.
    pub fn sealed(&self, sealed: usize) {
        self.seals
            .get_or_create(&SealResult {
                result: "sealed".into(),
            })
            .inc_by(sealed as u64);
    }

    /// A take-over's seal tried a step again (`list` or `write`).
    pub fn seal_retried(&self, step: &str) {
        self.seal_retries
            .get_or_create(&SealStep { step: step.into() })
            .inc();
    }

    /// This replica became the allocating leader; `handover` is clean, unclean or unknown.
    pub fn took_over(&self, handover: &str) {
        self.takeovers
            .get_or_create(&Handover {
                handover: handover.into(),
            })
            .inc();
    }

    /// The allocation loop took a step now.
    pub fn allocation_stepped(&self) {
        self.allocation_step
            .set(k8s_openapi::jiff::Timestamp::now().as_second());
    }

    /// kcm's max gauge for `range`: `capacity` blocks.
    pub fn range_capacity(&self, range: &ipnet::IpNet, capacity: u64) {
        self.max_cidrs
            .get_or_create(&cidr_label(range))
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
    }

    /// The condition and draining gauges of `config` from the status the leader computed.
    pub fn observe_status(&self, config: &str, status: &nodeipam_crd::NodeIPAMConfigStatus) {
        for c in &status.conditions {
            for value in ["True", "False", "Unknown"] {
                self.conditions
                    .get_or_create(&ConfigCondition {
                        config: config.into(),
                        condition: c.type_.clone(),
                        status: value.into(),
                    })
                    .set(i64::from(c.status == value));
            }
        }
        let draining = status.conditions.iter().any(|c| {
            c.type_ == nodeipam_crd::CONDITION_DRAINED
                && c.status == "False"
                && c.reason == nodeipam_crd::REASON_NODES_REMAINING
        });
        self.draining
            .get_or_create(&ConfigName {
                config: config.into(),
            })
            .set(i64::from(draining));
    }

    /// Drops the per-config series of a config that is gone, so that no alert fires on the
    /// last state of an object that no longer exists.
    pub fn forget_config(&self, config: &str) {
        for condition in [
            nodeipam_crd::CONDITION_READY,
            nodeipam_crd::CONDITION_EXHAUSTED,
            nodeipam_crd::CONDITION_DRAINED,
        ] {
            for status in ["True", "False", "Unknown"] {
                self.conditions.remove(&ConfigCondition {
                    config: config.into(),
                    condition: condition.into(),
                    status: status.into(),
                });
            }
        }
        self.draining.remove(&ConfigName {
            config: config.into(),
        });
        for family in ["ipv4", "ipv6"] {
            let label = ConfigFamily {
                config: config.into(),
                family: family.into(),
            };
            self.blocks_allocated.remove(&label);
            self.blocks_capacity.remove(&label);
        }
    }

    pub fn pool_ranges(&self, pool: &str, ranges: u64) {
        self.pool_ranges
            .get_or_create(&PoolName { pool: pool.into() })
            .set(i64::try_from(ranges).unwrap_or(i64::MAX));
    }

    pub fn pool_carved(&self, pool: &str) {
        self.pool_carves
            .get_or_create(&PoolName { pool: pool.into() })
            .inc();
    }

    pub fn pool_retired(&self, pool: &str) {
        self.pool_retires
            .get_or_create(&PoolName { pool: pool.into() })
            .inc();
    }

    pub fn pool_scaled_up(&self, pool: &str, seconds: f64) {
        self.pool_scale_up
            .get_or_create(&PoolName { pool: pool.into() })
            .observe(seconds);
    }

    /// Drops the series of a pool that is gone.
    pub fn forget_pool(&self, pool: &str) {
        let label = PoolName { pool: pool.into() };
        self.pool_ranges.remove(&label);
        self.pool_carves.remove(&label);
        self.pool_retires.remove(&label);
        self.pool_scale_up.remove(&label);
    }

    /// Every metric family this registry exposes, as Prometheus names them in queries
    /// (`_total` on counters; `_bucket`, `_sum`, `_count` on histograms), whether or not it has
    /// a series yet (the text encoding leaves out families without one).
    pub fn exposed_names(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, kind) in &self.registered {
            match kind {
                MetricType::Counter => out.push(format!("{name}_total")),
                MetricType::Histogram => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        out.push(format!("{name}{suffix}"));
                    }
                }
                _ => out.push(name.clone()),
            }
        }
        out
    }

    /// Every registered family by its base name (a counter without `_total`), with its type
    /// as the text encoding spells it: what docs/metrics.md documents.
    pub fn families(&self) -> Vec<(String, &'static str)> {
        self.registered
            .iter()
            .map(|(name, kind)| {
                let kind = match kind {
                    MetricType::Counter => "counter",
                    MetricType::Gauge => "gauge",
                    MetricType::Histogram => "histogram",
                    MetricType::Info => "info",
                    _ => "unknown",
                };
                (name.clone(), kind)
            })
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use nodeipam_crd::NodeIPAMConfigStatus;

    /// kube-controller-manager's cidrset metrics, names and label as its
    /// pkg/controller/nodeipam/ipam/cidrset/metrics.go registers them (v1.37), including
    /// its spelling of `cirdset_max_cidrs`.
    const KCM: [&str; 5] = [
        "node_ipam_controller_cidrset_cidrs_allocations_total",
        "node_ipam_controller_cidrset_cidrs_releases_total",
        "node_ipam_controller_cirdset_max_cidrs",
        "node_ipam_controller_cidrset_usage_cidrs",
        "node_ipam_controller_cidrset_allocation_tries_per_request_bucket",
    ];

    #[test]
    fn kcm_cidrset_metrics_are_all_exposed() {
        let m = Metrics::new();
        let names = m.exposed_names();
        for name in KCM {
            assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
        }
    }

    #[test]
    fn the_metrics_of_every_kubernetes_component_keep_their_names() {
        let m = Metrics::new();
        let names = m.exposed_names();
        for name in [
            "process_cpu_seconds_total",
            "process_start_time_seconds",
            "leader_election_master_status",
            "rest_client_requests_total",
            "rest_client_request_duration_seconds_bucket",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing: {names:?}");
        }
        m.set_lease_held("nodeipam-controller", true);
        let text = m.encode();
        for sample in [
            "process_cpu_seconds_total ",
            "process_open_fds ",
            "leader_election_master_status{name=\"nodeipam-controller\"} 1",
            &format!(
                "nodeipam_build_info{{version=\"{}\",commit=\"{}\",rustc=\"{}\"}} 1",
                crate::version::VERSION,
                crate::version::GIT_COMMIT,
                crate::version::RUSTC
            ),
        ] {
            assert!(text.contains(sample), "{sample} missing:\n{text}");
        }
    }

    #[test]
    fn kcm_metrics_carry_the_cluster_cidr_label() {
        let m = Metrics::new();
        let range: ipnet::IpNet = "10.0.0.0/16".parse().unwrap();
        m.range_capacity(&range, 256);
        m.usage.get_or_create(&cidr_label(&range)).set(0.5);
        let text = m.encode();
        assert!(
            text.contains(
                "node_ipam_controller_cirdset_max_cidrs{clusterCIDR=\"10.0.0.0/16\"} 256"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "node_ipam_controller_cidrset_usage_cidrs{clusterCIDR=\"10.0.0.0/16\"} 0.5"
            ),
            "{text}"
        );
    }

    fn status(conditions: &[(&str, &str, &str)]) -> NodeIPAMConfigStatus {
        NodeIPAMConfigStatus {
            conditions: conditions
                .iter()
                .map(|(t, s, r)| Condition {
                    type_: (*t).into(),
                    status: (*s).into(),
                    reason: (*r).into(),
                    message: String::new(),
                    observed_generation: None,
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                })
                .collect(),
            ..NodeIPAMConfigStatus::default()
        }
    }

    fn sample(m: &Metrics, series: &str) -> Option<String> {
        m.encode()
            .lines()
            .find_map(|l| l.strip_prefix(series).map(|v| v.trim().to_string()))
    }

    #[test]
    fn conditions_and_draining_follow_the_status() {
        let m = Metrics::new();
        m.observe_status(
            "a",
            &status(&[
                ("Ready", "False", "Terminating"),
                ("Exhausted", "True", "Exhausted"),
                ("Drained", "False", "NodesRemaining"),
            ]),
        );
        let cond = |c: &str, s: &str| {
            sample(
                &m,
                &format!(
                    "nodeipam_config_condition{{config=\"a\",condition=\"{c}\",status=\"{s}\"}}"
                ),
            )
        };
        assert_eq!(cond("Exhausted", "True").as_deref(), Some("1"));
        assert_eq!(cond("Exhausted", "False").as_deref(), Some("0"));
        assert_eq!(cond("Ready", "False").as_deref(), Some("1"));
        assert_eq!(
            sample(&m, "nodeipam_config_draining{config=\"a\"}").as_deref(),
            Some("1")
        );

        m.forget_config("a");
        assert_eq!(sample(&m, "nodeipam_config_draining{config=\"a\"}"), None);
        assert_eq!(cond("Exhausted", "True"), None);

        // An active config is not draining though its Drained condition is False; a drained
        // one is not draining any more.
        for (config, drained) in [
            ("b", ("Drained", "False", "Active")),
            ("a", ("Drained", "True", "NoNodes")),
        ] {
            m.observe_status(config, &status(&[drained]));
            assert_eq!(
                sample(
                    &m,
                    &format!("nodeipam_config_draining{{config=\"{config}\"}}")
                )
                .as_deref(),
                Some("0"),
                "{config}"
            );
        }
    }
}
