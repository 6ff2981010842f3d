//! `kubectl nodeipam check` and `status`, decided: the cluster as read (configs, Nodes, Service
//! ranges, published outputs) recounted by the controller's own rules, and every place where
//! what is written disagrees with the recount. Pure: the caller reads the objects.
//!
//! The recount is what a new leader does at start-up: the allocation state built from the
//! configs ([`config_input`]), the Service ranges and the Nodes' podCIDRs
//! ([`Ipam::observe_node`], which also finds overlaps and unmanaged podCIDRs), then each
//! config's status ([`desired_status`]) and the pod network ([`Ipam::network`]) from it. Only
//! what is on the objects counts, so it needs no controller running.
//!
//! ## What disagrees
//! - two nodes' podCIDRs overlap, a podCIDR lies in a Service range or in no config;
//! - a status counts more blocks than the nodes hold: a leak (a write whose outcome the
//!   controller could not learn, counted until it can no longer land) or a stale count;
//! - any other status count, or its `Drained` condition, differs from the recount;
//! - a published output misses a range of the pod network (or is not there).
//!
//! ## Damage and lag
//! Each finding has a [`Cause`]. Damage (an overlap, a podCIDR in a Service range or in no
//! config, one that does not parse) is on the Nodes themselves: the controller never makes it
//! and does not mend it, so one look is enough. Lag (a status count, a condition, a missing
//! status, an output that trails the pod network) is what a working controller shows for a
//! moment after any change: counts are written at most once a `STATUS_COUNTS_EVERY`, and an
//! output follows the configs and nodes it is made from. Those are looked at again after
//! [`SETTLE`]; [`confirmed`] keeps the ones that did not settle.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_core::{DynamicObject, ResourceExt};
use nodeipam_crd::{CONDITION_DRAINED, FamilyStatus, NodeIPAMConfig, NodeIPAMConfigStatus};
use serde::Serialize;

use crate::ipam::Ipam;
use crate::machine::{STATUS_COUNTS_EVERY, config_input};
use crate::node::IpamNode;
use crate::podnetwork::{
    ConfigMapRef, OutputContent, OutputKind, OutputRef, PodNetwork, RangeState, covered,
};
use crate::selection::{self, NodeView};
use crate::status::desired_status;

/// A published output as read: where it is and what is there (`None`: it is not there, or
/// its kind is not served).
#[derive(Clone, Debug)]
pub struct Output {
    pub target: OutputRef,
    pub held: Option<Held>,
}

/// What an output's read found.
#[derive(Clone, Debug)]
pub enum Held {
    /// A ConfigMap's data.
    Data(BTreeMap<String, String>),
    /// A typed output's objects of ours, by name.
    Objects(BTreeMap<String, DynamicObject>),
}

impl Output {
    /// A ConfigMap output, as read.
    pub fn configmap(
        target: &ConfigMapRef,
        kind: OutputKind,
        data: Option<BTreeMap<String, String>>,
    ) -> Self {
        Output {
            target: OutputRef::configmap(target, kind),
            held: data.map(Held::Data),
        }
    }

    /// What it holds as its consumers read it, by the controller's own reading.
    fn content(&self) -> Option<OutputContent> {
        Some(match self.held.as_ref()? {
            Held::Data(data) => self.target.kind.read(data),
            Held::Objects(objects) => self.target.kind.read_objects(objects),
        })
    }
}

/// Everything the checks look at, as read from the API.
#[derive(Clone, Copy, Debug)]
pub struct Cluster<'a> {
    pub configs: &'a [NodeIPAMConfig],
    pub nodes: &'a [IpamNode],
    /// Service ranges by source (a ServiceCIDR's name).
    pub services: &'a [(String, Vec<IpNet>)],
    pub outputs: &'a [Output],
    /// What the controller adds to ip-masq-agent's `nonMasqueradeCIDRs`.
    pub extra_non_masquerade: &'a [IpNet],
}

/// The allocation state rebuilt from the objects, and what rebuilding it found.
#[derive(Clone)]
pub struct Recount {
    pub ipam: Ipam,
    /// Each overlapping pair once: (node, its podCIDR, the other node, the other's podCIDR).
    pub overlaps: Vec<(String, IpNet, String, IpNet)>,
    /// podCIDRs in no config's range: (node, podCIDR).
    pub unmanaged: Vec<(String, IpNet)>,
    /// Nodes whose podCIDRs do not parse: (node, why).
    pub unparsable: Vec<(String, String)>,
    /// Every node's podCIDRs, by name.
    pub held: BTreeMap<String, Vec<IpNet>>,
}

/// Rebuilds the allocation state as a new leader would: configs first, then the Service
/// ranges, then every node's podCIDRs in name order.
pub fn recount(cluster: &Cluster<'_>) -> Recount {
    let mut ipam = Ipam::new();
    for c in cluster.configs {
        ipam.upsert_config(config_input(c));
    }
    for (source, cidrs) in cluster.services {
        ipam.set_service_cidrs(source, cidrs.clone());
    }
    let mut out = Recount {
        ipam,
        overlaps: Vec::new(),
        unmanaged: Vec::new(),
        unparsable: Vec::new(),
        held: BTreeMap::new(),
    };
    for n in sorted(cluster.nodes) {
        let name = n.name_any();
        let cidrs = match n.cidrs() {
            Ok(c) if c.is_empty() => continue,
            Ok(c) => c,
            Err(e) => {
                out.unparsable.push((name, e));
                continue;
            }
        };
        let found = out.ipam.observe_node(&name, n.uid().as_deref(), &cidrs);
        for (other, ours, theirs) in found.conflicts {
            out.overlaps.push((name.clone(), ours, other, theirs));
        }
        out.unmanaged
            .extend(found.unmanaged.into_iter().map(|c| (name.clone(), c)));
        out.held.insert(name, cidrs);
    }
    out
}

fn sorted(nodes: &[IpamNode]) -> Vec<&IpamNode> {
    let mut list: Vec<&IpamNode> = nodes.iter().collect();
    list.sort_by_key(|n| n.name_any());
    list
}

/// One inconsistency, as `check` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum Finding {
    /// Two nodes hold overlapping podCIDRs.
    Overlap {
        node: String,
        cidr: IpNet,
        other_node: String,
        other_cidr: IpNet,
    },
    /// A podCIDR lies in a Service range.
    ServiceRange {
        node: String,
        cidr: IpNet,
        service_cidr: String,
        range: IpNet,
    },
    /// A podCIDR lies in no config's range.
    OutsideConfigs { node: String, cidr: IpNet },
    /// A node's podCIDRs do not parse.
    BadPodCidr { node: String, error: String },
    /// A config has no status: the controller has not counted it.
    NoStatus { config: String },
    /// A status describes an older generation of the spec.
    StaleStatus {
        config: String,
        observed: Option<i64>,
        generation: Option<i64>,
    },
    /// A status counts more blocks allocated than the nodes hold.
    Leaked {
        config: String,
        family: &'static str,
        counted: u64,
        held: u64,
    },
    /// Any other status count that differs from the recount.
    Count {
        config: String,
        field: String,
        status: Option<u64>,
        recount: u64,
    },
    /// A config's `Drained` condition says what the nodes contradict.
    Drained {
        config: String,
        status: String,
        why: String,
    },
    /// A published output is not there.
    MissingOutput { output: String },
    /// A published output lacks a range of the pod network.
    Unpublished {
        output: String,
        cidr: IpNet,
        state: RangeState,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Overlap {
                node,
                cidr,
                other_node,
                other_cidr,
            } => write!(
                f,
                "overlap: node {node} podCIDR {cidr} overlaps {other_cidr} of node {other_node}"
            ),
            Finding::ServiceRange {
                node,
                cidr,
                service_cidr,
                range,
            } => write!(
                f,
                "service-range: node {node} podCIDR {cidr} lies in Service range {range} (ServiceCIDR {service_cidr})"
            ),
            Finding::OutsideConfigs { node, cidr } => write!(
                f,
                "outside-configs: node {node} podCIDR {cidr} lies in no NodeIPAMConfig (kept as unmanaged)"
            ),
            Finding::BadPodCidr { node, error } => write!(f, "bad-pod-cidr: node {node}: {error}"),
            Finding::NoStatus { config } => write!(
                f,
                "no-status: NodeIPAMConfig {config} has no status: the controller has not counted it"
            ),
            Finding::StaleStatus {
                config,
                observed,
                generation,
            } => write!(
                f,
                "stale-status: NodeIPAMConfig {config} status describes generation {} of {}",
                show(*observed),
                show(*generation)
            ),
            Finding::Leaked {
                config,
                family,
                counted,
                held,
            } => write!(
                f,
                "leaked: NodeIPAMConfig {config} status.{family}.allocated counts {counted} block(s) but nodes hold {held}"
            ),
            Finding::Count {
                config,
                field,
                status,
                recount,
            } => write!(
                f,
                "count: NodeIPAMConfig {config} status.{field} is {} but a recount from the Nodes gives {recount}",
                show(*status)
            ),
            Finding::Drained {
                config,
                status,
                why,
            } => write!(
                f,
                "drained: NodeIPAMConfig {config} says Drained={status} but {why}"
            ),
            Finding::MissingOutput { output } => write!(
                f,
                "unpublished: {output} does not exist: consumers know no pod network"
            ),
            Finding::Unpublished {
                output,
                cidr,
                state,
            } => write!(
                f,
                "unpublished: {output} lacks {cidr} ({} range of the pod network)",
                state.as_str()
            ),
        }
    }
}

/// How long `check` waits before it looks again at what the controller's lag can cause:
/// several status intervals, for the change to reach the controller's watch, the count's
/// turn (`STATUS_COUNTS_EVERY`) and the status write, on a busy API server too.
pub const SETTLE: Duration = Duration::from_secs(5 * STATUS_COUNTS_EVERY.as_secs());

/// Why a finding is there, and so whether one look is enough to report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Wrong on the Nodes: a working controller never shows it. Reported at once.
    Damage,
    /// What a working controller shows for a moment after a change (a status or an output
    /// not yet rewritten). Reported only when a second look, [`SETTLE`] later, finds it again.
    Lag,
}

impl Finding {
    /// Whether the objects are damaged or may only be behind the controller's next write.
    pub fn cause(&self) -> Cause {
        match self {
            Finding::Overlap { .. }
            | Finding::ServiceRange { .. }
            | Finding::OutsideConfigs { .. }
            | Finding::BadPodCidr { .. } => Cause::Damage,
            // An output lacking a range a node holds is harmful, but the controller makes it
            // for a moment too: adopting the podCIDRs of a config just created, publishing a
            // podCIDR another component set, recreating a deleted output.
            Finding::NoStatus { .. }
            | Finding::StaleStatus { .. }
            | Finding::Leaked { .. }
            | Finding::Count { .. }
            | Finding::Drained { .. }
            | Finding::MissingOutput { .. }
            | Finding::Unpublished { .. } => Cause::Lag,
        }
    }

    /// Whether `later`, found on a second look, is this finding not settled: the same field of
    /// the same object still disagrees with the same recount. A status rewritten to another
    /// wrong value still counts; a recount that moved (nodes still coming and going) means the
    /// cluster was changing, so the second look may be lag again and is not a confirmation.
    pub fn persists_as(&self, later: &Finding) -> bool {
        use Finding as F;
        match (self, later) {
            (
                F::Leaked {
                    config,
                    family,
                    held,
                    ..
                },
                F::Leaked {
                    config: c,
                    family: f,
                    held: h,
                    ..
                },
            ) => (config, family, held) == (c, f, h),
            (
                F::Count {
                    config,
                    field,
                    recount,
                    ..
                },
                F::Count {
                    config: c,
                    field: f,
                    recount: r,
                    ..
                },
            ) => (config, field, recount) == (c, f, r),
            (
                F::Drained { config, why, .. },
                F::Drained {
                    config: c, why: w, ..
                },
            ) => (config, why) == (c, w),
            (F::NoStatus { config }, F::NoStatus { config: c }) => config == c,
            (
                F::StaleStatus {
                    config, generation, ..
                },
                F::StaleStatus {
                    config: c,
                    generation: g,
                    ..
                },
            ) => (config, generation) == (c, g),
            (F::MissingOutput { output }, F::MissingOutput { output: o }) => output == o,
            (
                F::Unpublished {
                    output,
                    cidr,
                    state,
                },
                F::Unpublished {
                    output: o,
                    cidr: c,
                    state: s,
                },
            ) => (output, cidr, state) == (o, c, s),
            // Damage needs no second look; different kinds are different findings.
            _ => false,
        }
    }
}

/// The findings of one look split by [`Cause`]: damage, and lag still to confirm.
pub fn split(findings: Vec<Finding>) -> (Vec<Finding>, Vec<Finding>) {
    findings
        .into_iter()
        .partition(|f| f.cause() == Cause::Damage)
}

/// The lag findings of a first look that a second look still finds ([`Finding::persists_as`]),
/// as the second look found them (the newer values).
pub fn confirmed(first: &[Finding], second: &[Finding]) -> Vec<Finding> {
    second
        .iter()
        .filter(|later| later.cause() == Cause::Lag && first.iter().any(|f| f.persists_as(later)))
        .cloned()
        .collect()
}

fn show<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "unset".into(), |v| v.to_string())
}

/// Every inconsistency in `cluster`, nodes first, then configs, then outputs.
pub fn check(cluster: &Cluster<'_>) -> Vec<Finding> {
    let r = recount(cluster);
    let mut out: Vec<Finding> = Vec::new();
    out.extend(
        r.overlaps
            .iter()
            .map(|(node, cidr, other, theirs)| Finding::Overlap {
                node: node.clone(),
                cidr: *cidr,
                other_node: other.clone(),
                other_cidr: *theirs,
            }),
    );
    for (node, cidrs) in &r.held {
        for cidr in cidrs {
            if let Some((source, range)) = r.ipam.service_range_over(cidr) {
                out.push(Finding::ServiceRange {
                    node: node.clone(),
                    cidr: *cidr,
                    service_cidr: source.to_string(),
                    range,
                });
            }
        }
    }
    out.extend(
        r.unmanaged
            .iter()
            .map(|(node, cidr)| Finding::OutsideConfigs {
                node: node.clone(),
                cidr: *cidr,
            }),
    );
    out.extend(
        r.unparsable
            .iter()
            .map(|(node, error)| Finding::BadPodCidr {
                node: node.clone(),
                error: error.clone(),
            }),
    );
    let mut configs: Vec<&NodeIPAMConfig> = cluster.configs.iter().collect();
    configs.sort_by_key(|c| c.name_any());
    for c in configs {
        out.extend(status_findings(c, &r.ipam));
    }
    let network = r.ipam.network();
    for (o, state) in cluster.outputs.iter().zip(outputs(cluster, &network)) {
        let output = o.target.to_string();
        match state.missing {
            None => out.push(Finding::MissingOutput { output }),
            Some(missing) => {
                out.extend(
                    missing
                        .into_iter()
                        .map(|(cidr, state)| Finding::Unpublished {
                            output: output.clone(),
                            cidr,
                            state,
                        }),
                )
            }
        }
    }
    out
}

/// Where a config's written status disagrees with the status the recount gives it.
fn status_findings(config: &NodeIPAMConfig, ipam: &Ipam) -> Vec<Finding> {
    let name = config.name_any();
    let Some(written) = &config.status else {
        return vec![Finding::NoStatus { config: name }];
    };
    let Some(facts) = ipam.config_facts(&name) else {
        return Vec::new();
    };
    let generation = config.metadata.generation;
    // The time only stamps flipped conditions, which are not compared.
    let (want, _) = desired_status(
        &facts,
        generation,
        &written.conditions,
        &Time(Default::default()),
    );
    let mut out = Vec::new();
    if written.observed_generation != generation {
        out.push(Finding::StaleStatus {
            config: name.clone(),
            observed: written.observed_generation,
            generation,
        });
    }
    for (family, w, d) in [
        ("ipv4", written.ipv4, want.ipv4),
        ("ipv6", written.ipv6, want.ipv6),
    ] {
        out.extend(family_findings(&name, family, w, d));
    }
    let nodes = want.nodes.unwrap_or(0);
    if written.nodes != Some(nodes) {
        out.push(Finding::Count {
            config: name.clone(),
            field: "nodes".into(),
            status: written.nodes,
            recount: nodes,
        });
    }
    out.extend(drained_finding(&name, written, &want));
    out
}

fn family_findings(
    config: &str,
    family: &'static str,
    written: Option<FamilyStatus>,
    want: Option<FamilyStatus>,
) -> Vec<Finding> {
    let Some(want) = want else {
        return Vec::new();
    };
    let count = |field: &str, status: Option<u64>, recount: u64| Finding::Count {
        config: config.to_string(),
        field: format!("{family}.{field}"),
        status,
        recount,
    };
    let Some(written) = written else {
        return vec![count("allocated", None, want.allocated)];
    };
    let mut out = Vec::new();
    if written.allocated > want.allocated {
        out.push(Finding::Leaked {
            config: config.to_string(),
            family,
            counted: written.allocated,
            held: want.allocated,
        });
    } else if written.allocated < want.allocated {
        out.push(count("allocated", Some(written.allocated), want.allocated));
    }
    if written.capacity != want.capacity {
        out.push(count("capacity", Some(written.capacity), want.capacity));
    }
    out
}

/// The written `Drained` against the one the recount gives, which says why in its message.
fn drained_finding(
    config: &str,
    written: &NodeIPAMConfigStatus,
    want: &NodeIPAMConfigStatus,
) -> Option<Finding> {
    let drained = |s: &NodeIPAMConfigStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_DRAINED)
            .cloned()
    };
    let (w, d) = (drained(written)?, drained(want)?);
    (w.status != d.status).then(|| Finding::Drained {
        config: config.to_string(),
        status: w.status,
        why: d.message,
    })
}

/// A published output against the pod network the recount gives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputState {
    /// The output's kind: ConfigMap, IPPool, GlobalNetworkSet, CiliumCIDRGroup.
    pub kind: String,
    /// `namespace/name`, `name`, or the label that marks a many-object output's objects.
    pub target: String,
    /// The ranges of the pod network it lacks, with their state; `None` when it is not there.
    pub missing: Option<Vec<(IpNet, RangeState)>>,
    /// Whether what of it is ours equals what the controller would write now.
    pub current: bool,
}

/// Each output: whether it is there, what it lacks, whether it is current.
pub fn outputs(cluster: &Cluster<'_>, network: &PodNetwork) -> Vec<OutputState> {
    cluster
        .outputs
        .iter()
        .map(|o| {
            let Some(read) = o.content() else {
                return OutputState {
                    kind: o.target.kind.resource().into(),
                    target: o.target.locator(),
                    missing: None,
                    current: false,
                };
            };
            let missing = network
                .entries
                .iter()
                .filter(|e| !covered(&e.cidr, &read.cidrs))
                .map(|e| (e.cidr, e.state))
                .collect();
            OutputState {
                kind: o.target.kind.resource().into(),
                target: o.target.locator(),
                missing: Some(missing),
                current: read == o.target.desired(network, cluster.extra_non_masquerade),
            }
        })
        .collect()
}

/// A node waiting for a podCIDR that some config selects, and why it waits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub node: String,
    /// The configs whose selectors match it.
    pub selected_by: Vec<String>,
    pub reason: String,
}

/// The nodes without podCIDRs that a config selects, in name order, each with what the
/// controller's allocation says of it now. Each allocation that would succeed takes its
/// blocks before the next node is asked, as the controller's would.
pub fn pending(cluster: &Cluster<'_>, recount: &Recount) -> Vec<Pending> {
    let mut ipam = recount.ipam.clone();
    let mut out = Vec::new();
    for n in sorted(cluster.nodes) {
        if !n.cidrs().is_ok_and(|c| c.is_empty()) {
            continue;
        }
        let name = n.name_any();
        let view = NodeView {
            name: &name,
            labels: n.labels(),
        };
        let selected_by: Vec<String> = cluster
            .configs
            .iter()
            .filter(|c| selection::match_score(c.spec.node_selector.as_ref(), view).is_some())
            .map(ResourceExt::name_any)
            .collect();
        if selected_by.is_empty() {
            continue;
        }
        let reason = match ipam.allocate(&name, n.uid().as_deref(), n.labels()) {
            Ok(a) => format!(
                "not written yet: the controller would give it {} from {}",
                a.cidrs
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
                a.config
            ),
            Err(e) => e.to_string(),
        };
        out.push(Pending {
            node: name,
            selected_by,
            reason,
        });
    }
    out
}

#[cfg(test)]
mod tests;
