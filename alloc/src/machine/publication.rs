//! The pod network consumers read: what is published to their ConfigMaps, what each
//! publication in flight or landed puts there, what each output's watch shows, and so which
//! ranges consumers may not hold yet (allocation from a range waits until they do).

use std::collections::BTreeMap;

use ipnet::IpNet;
use kube_core::{DynamicObject, ResourceExt};
use tracing::info;

use super::core::Core;
use super::{Effect, Watch};
use crate::podnetwork::{OutputContent, OutputRef, PodNetwork, covered};

/// A consumer output of the pod network and what its watch last showed.
#[derive(Clone, Debug)]
struct Output {
    target: OutputRef,
    /// The objects the watch shows, by name: one for a ConfigMap or a single typed object,
    /// every IPPool of ours for the pools.
    objects: BTreeMap<String, DynamicObject>,
    /// What a (re)list in progress returned so far; it replaces `objects` when done.
    relist: Option<BTreeMap<String, DynamicObject>>,
    /// `None` until the watch has listed; an absent object holds nothing.
    seen: Option<OutputContent>,
    /// Why the watch could not list, while it has never listed.
    failed: Option<String>,
}

/// What an output's watch event changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct OutputSeen {
    /// What the output holds changed: every config's gate again.
    pub(super) changed: bool,
    /// The output's watch has listed.
    pub(super) listed: bool,
}

#[derive(Clone, Debug)]
pub(super) struct Publication {
    outputs: Vec<Output>,
    /// Added to ip-masq-agent's `nonMasqueradeCIDRs`.
    extra_non_masquerade: Vec<IpNet>,
    /// What the outputs were last asked to hold; sent again when an output drifts from it.
    network_sent: Option<Vec<OutputContent>>,
    /// What each network sent and not yet reported written puts in the outputs, oldest first:
    /// until then it may still land, and what it lacks is not safely published.
    network_in_flight: Vec<(u64, Vec<OutputContent>)>,
    /// The number of the last publication sent.
    network_seq: u64,
    /// What the network last reported written put in the outputs: a watch event older than
    /// that write is stale.
    network_landed: Option<Vec<OutputContent>>,
    /// What consumers read may have changed: the network is computed again.
    network_dirty: bool,
    /// Why the publisher's last attempt failed (the output and the error), until a network
    /// is written: a range waiting for an output says why it is behind, not only that it is.
    write_error: Option<String>,
}

/// How much of a write error a condition message carries: enough to name the object and the
/// reason, not an API server's whole answer.
const WRITE_ERROR_CHARS: usize = 300;

impl Publication {
    pub(super) fn new(outputs: &[OutputRef], extra: Vec<IpNet>) -> Self {
        let outputs = outputs
            .iter()
            .map(|target| Output {
                target: target.clone(),
                objects: BTreeMap::new(),
                relist: None,
                seen: None,
                failed: None,
            })
            .collect();
        Publication {
            outputs,
            extra_non_masquerade: extra,
            network_sent: None,
            network_in_flight: Vec::new(),
            network_seq: 0,
            network_landed: None,
            network_dirty: true,
            write_error: None,
        }
    }

    /// What consumers read may have changed: computed again at the end of the step.
    pub(super) fn mark_dirty(&mut self) {
        self.network_dirty = true;
    }

    pub(super) fn is_dirty(&self) -> bool {
        self.network_dirty
    }

    /// Publishes the pod network when what consumers read changed. Drained configs leave it
    /// here, and only here, so a range leaves consumers' view only after its last node is gone.
    pub(super) fn publish(&mut self, core: &mut Core) {
        if !core.synced() || self.outputs.is_empty() || !std::mem::take(&mut self.network_dirty) {
            return;
        }
        let network = network(core);
        // What consumers read, not the counts beside it: a new node changes no output.
        let desired = self.desired(&network);
        if self.network_sent.as_ref() != Some(&desired) {
            self.network_seq += 1;
            let seq = self.network_seq;
            core.push(Effect::Publish(PodNetwork { seq, ..network }));
            self.network_in_flight.push((seq, desired.clone()));
            self.network_sent = Some(desired);
        }
    }

    fn desired(&self, network: &PodNetwork) -> Vec<OutputContent> {
        let extra = &self.extra_non_masquerade;
        self.outputs
            .iter()
            .map(|o| o.target.desired(network, extra))
            .collect()
    }

    /// A network is written. What was sent before it landed before it or was skipped.
    pub(super) fn on_published(&mut self, network: &PodNetwork) {
        let desired = self.desired(network);
        // The publisher writes in order and skips only what a newer network replaced, so this
        // one accounts for every publication sent before it, whatever their content.
        self.network_in_flight.retain(|(seq, _)| *seq > network.seq);
        self.network_landed = Some(desired);
        self.write_error = None;
    }

    /// The publisher could not write the newest network; it retries by itself. Whether the
    /// reason changed (the waiting configs' messages then change with it).
    pub(super) fn on_publish_failed(&mut self, why: String) -> bool {
        let why = match why.char_indices().nth(WRITE_ERROR_CHARS) {
            Some((end, _)) => format!("{}...", &why[..end]),
            None => why,
        };
        let changed = self.write_error.as_ref() != Some(&why);
        self.write_error = Some(why);
        changed
    }

    /// One event of the watch of output `index`. A (re)list replaces what the output holds
    /// only once it is complete: a list in pages must not look like objects removed.
    pub(super) fn on_watch(&mut self, index: usize, w: Watch<DynamicObject>) -> OutputSeen {
        let Some(output) = self.outputs.get_mut(index) else {
            return OutputSeen::default();
        };
        match w {
            Watch::ListStart => {
                output.relist = Some(BTreeMap::new());
                return OutputSeen::default();
            }
            Watch::Listed(o) => {
                if let Some(relist) = &mut output.relist {
                    relist.insert(o.name_any(), o);
                    return OutputSeen::default();
                }
                output.objects.insert(o.name_any(), o);
            }
            // A change during a relist is in the list's result too.
            Watch::Applied(o) => {
                if let Some(relist) = &mut output.relist {
                    relist.insert(o.name_any(), o.clone());
                }
                output.objects.insert(o.name_any(), o);
            }
            Watch::Deleted(o) => {
                if let Some(relist) = &mut output.relist {
                    relist.remove(&o.name_any());
                }
                output.objects.remove(&o.name_any());
            }
            Watch::ListDone => {
                output.objects = output.relist.take().unwrap_or_default();
                let failed = output.failed.take().is_some();
                let changed = self.on_output(index);
                return OutputSeen {
                    changed: changed || failed,
                    listed: true,
                };
            }
        }
        OutputSeen {
            changed: self.on_output(index),
            listed: false,
        }
    }

    /// The watch of output `index` cannot list. Until it ever has, the output holds nothing
    /// and counts as listed, so that the ranges waiting for it say why instead of nothing
    /// being decided at all; once it has, a failure is the watch's to retry.
    pub(super) fn on_failed(&mut self, index: usize, why: String) -> OutputSeen {
        let Some(output) = self.outputs.get_mut(index) else {
            return OutputSeen::default();
        };
        if output.seen.is_some() {
            return OutputSeen::default();
        }
        let changed = output.failed.as_ref() != Some(&why);
        output.failed = Some(why);
        OutputSeen {
            changed,
            listed: true,
        }
    }

    /// An output's objects changed (our write, a user's edit, a delete): whether what it
    /// holds changed (allocation is gated on it), after asking to write it again when it is
    /// not what we last asked for.
    fn on_output(&mut self, index: usize) -> bool {
        let Some(output) = self.outputs.get_mut(index) else {
            return false;
        };
        let content = output.target.kind.read_objects(&output.objects);
        let drifted = self
            .network_sent
            .as_ref()
            .and_then(|sent| sent.get(index))
            .is_some_and(|sent| *sent != content);
        if drifted {
            info!(output = %output.target, "published pod network differs from what was written; writing it again");
            self.network_sent = None;
            self.network_dirty = true;
        }
        if output.seen.as_ref() == Some(&content) {
            return false;
        }
        output.seen = Some(content);
        true
    }

    /// What allocation from `ranges` waits for: each output that does not hold all of them,
    /// or that a publication in flight or landed lacks one of, with the ranges it lacks.
    pub(super) fn behind(&self, ranges: &[IpNet]) -> Vec<String> {
        let mut behind: Vec<String> = self
            .outputs
            .iter()
            .enumerate()
            .filter_map(|(index, o)| {
                let cidrs = o.seen.as_ref().map_or(&[][..], |c| c.cidrs.as_slice());
                // Ours on its way, and ours landed (the watch may still show an older one).
                let in_flight = self.network_in_flight.iter().map(|(_, d)| d);
                let sent = in_flight.chain(&self.network_landed);
                let sent = sent.filter_map(|d| d.get(index));
                let sent: Vec<&[IpNet]> = sent.map(|c| c.cidrs.as_slice()).collect();
                let missing: Vec<String> = ranges
                    .iter()
                    .filter(|r| !covered(r, cidrs) || sent.iter().any(|c| !covered(r, c)))
                    .map(ToString::to_string)
                    .collect();
                if let Some(why) = o.failed.as_ref().filter(|_| o.seen.is_none()) {
                    return Some(format!("{} can be read ({why})", o.target));
                }
                (!missing.is_empty())
                    .then(|| format!("{} includes {}", o.target, missing.join(", ")))
            })
            .collect();
        // Nothing a predecessor wrote is relied on before this process's own first publish
        // landed: that write signed every output anew and so moved its version, and only from
        // then on is a deposed leader's late write, sent on the version it read, refused
        // (docs/single-writer.md, "Every write").
        if behind.is_empty() && self.network_landed.is_none() && !self.outputs.is_empty() {
            behind.push("this process's first publish of the pod network lands".into());
        }
        if let (Some(last), Some(why)) = (behind.last_mut(), &self.write_error) {
            last.push_str(&format!(" (the last write failed: {why})"));
        }
        behind
    }
}

/// The pod network as the allocation state has it now.
pub(super) fn network(core: &Core) -> PodNetwork {
    core.ipam().network()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::configmap;
    use crate::outputs::CalicoPools;
    use crate::podnetwork::{ConfigMapRef, ConfigRanges, OutputKind};

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn one_output() -> Publication {
        let target = ConfigMapRef {
            namespace: "nodeipam-system".into(),
            name: "pod-network".into(),
        };
        let output = OutputRef::configmap(&target, OutputKind::PodNetwork);
        Publication::new(&[output], Vec::new())
    }

    fn ip_pools() -> OutputRef {
        let kind = OutputKind::CalicoIPPools(CalicoPools::default());
        OutputRef::typed(kind, "projectcalico.org/v3", None)
    }

    /// The IPPools we would write for `network`, as their watch shows them.
    fn pools_of(network: &PodNetwork) -> Vec<DynamicObject> {
        ip_pools()
            .objects(network)
            .into_iter()
            .map(|(_, o)| serde_json::from_value(o).expect("an object"))
            .collect()
    }

    /// The pod network of one active config of `range`, as publication `seq`.
    fn network_of(range: &str, seq: u64) -> PodNetwork {
        PodNetwork {
            seq,
            ..PodNetwork::new(&[config_of("c", range)], &[])
        }
    }

    /// An active config of `range`.
    fn config_of(name: &str, range: &str) -> ConfigRanges {
        ConfigRanges {
            name: name.into(),
            families: vec![(net(range), 0, 4)],
            nodes: 0,
            deleting: false,
            enabled: true,
            drained: false,
        }
    }

    fn holding(network: &PodNetwork) -> Watch<DynamicObject> {
        let data = network.configmap_data("0");
        Watch::Applied(configmap("nodeipam-system", "pod-network", data))
    }

    #[test]
    fn a_range_waits_until_the_output_holds_it() {
        let mut p = one_output();
        let range = [net("10.0.0.0/24")];
        assert_eq!(
            p.behind(&range),
            vec!["ConfigMap nodeipam-system/pod-network includes 10.0.0.0/24".to_string()],
            "not listed yet: it holds nothing"
        );
        let seen = p.on_watch(0, holding(&network_of("10.0.0.0/24", 0)));
        assert_eq!(
            seen,
            OutputSeen {
                changed: true,
                listed: false
            }
        );
        assert_eq!(
            p.behind(&range),
            vec!["this process's first publish of the pod network lands".to_string()],
            "a predecessor's ConfigMap is not relied on before this process's publish moved it"
        );
        p.on_published(&network_of("10.0.0.0/24", 1));
        assert!(p.behind(&range).is_empty());
        let again = p.on_watch(0, holding(&network_of("10.0.0.0/24", 0)));
        assert!(!again.changed, "the same content moves no gate");
    }

    #[test]
    fn a_publication_in_flight_or_landed_that_lacks_a_range_keeps_it_behind() {
        let mut p = one_output();
        let range = [net("10.0.0.0/24")];
        p.on_watch(0, holding(&network_of("10.0.0.0/24", 0)));
        let without = network_of("10.1.0.0/24", 3);
        let desired = p.desired(&without);
        p.network_in_flight.push((3, desired));
        assert_eq!(p.behind(&range).len(), 1, "on its way, it may still land");
        p.on_published(&without);
        assert!(p.network_in_flight.is_empty());
        assert_eq!(p.behind(&range).len(), 1, "landed: the watch may lag");
        p.on_published(&network_of("10.0.0.0/24", 4));
        assert!(p.behind(&range).is_empty());
    }

    #[test]
    fn an_output_that_drifts_from_what_was_sent_is_sent_again() {
        let mut p = one_output();
        let sent = network_of("10.0.0.0/24", 1);
        p.network_sent = Some(p.desired(&sent));
        p.network_dirty = false;
        p.on_watch(0, holding(&sent));
        assert!(!p.is_dirty(), "it holds what was sent");
        let deleted = configmap("nodeipam-system", "pod-network", BTreeMap::new());
        p.on_watch(0, Watch::Deleted(deleted));
        assert!(p.is_dirty(), "deleted: written again");
        assert!(p.network_sent.is_none());
    }

    #[test]
    fn an_output_a_list_lacks_holds_nothing() {
        let mut p = one_output();
        p.on_watch(0, holding(&network_of("10.0.0.0/24", 0)));
        p.on_watch(0, Watch::ListStart);
        let done = p.on_watch(0, Watch::ListDone);
        assert_eq!(
            done,
            OutputSeen {
                changed: true,
                listed: true
            }
        );
        assert_eq!(p.behind(&[net("10.0.0.0/24")]).len(), 1);
    }

    #[test]
    fn a_failed_write_says_why_until_a_network_is_written() {
        let mut p = one_output();
        let range = [net("10.0.0.0/24")];
        let why = "IPPool nodeipam-10-0-0-0-24 exists without the label".to_string();
        assert!(p.on_publish_failed(why.clone()));
        assert!(!p.on_publish_failed(why.clone()), "the same reason again");
        let behind = p.behind(&range);
        assert_eq!(behind.len(), 1);
        assert!(
            behind[0].ends_with(&format!(
                "includes 10.0.0.0/24 (the last write failed: {why})"
            )),
            "{behind:?}"
        );
        let long = "x".repeat(5000);
        assert!(p.on_publish_failed(long));
        let behind = p.behind(&range);
        assert!(
            behind[0].len() < 500 && behind[0].ends_with("x...)"),
            "{behind:?}"
        );
        p.on_published(&network_of("10.0.0.0/24", 1));
        let behind = p.behind(&range);
        assert!(!behind[0].contains("failed"), "{behind:?}");
        // Nothing behind: no message, whatever failed.
        p.on_publish_failed(why);
        p.on_watch(0, holding(&network_of("10.0.0.0/24", 1)));
        assert!(p.behind(&range).is_empty());
    }

    #[test]
    fn an_output_whose_watch_cannot_list_holds_nothing_and_says_why() {
        let mut p = one_output();
        p.on_published(&network_of("10.0.0.0/24", 1));
        let why = "the API server does not serve it".to_string();
        let seen = p.on_failed(0, why.clone());
        assert_eq!(
            seen,
            OutputSeen {
                changed: true,
                listed: true
            },
            "counts as listed: the ranges can say what they wait for"
        );
        assert_eq!(
            p.behind(&[net("10.0.0.0/24")]),
            vec![format!(
                "ConfigMap nodeipam-system/pod-network can be read ({why})"
            )]
        );
        assert!(!p.on_failed(0, why).changed, "the same failure again");
        p.on_watch(0, Watch::ListStart);
        let Watch::Applied(cm) = holding(&network_of("10.0.0.0/24", 0)) else {
            unreachable!("holding is an apply")
        };
        p.on_watch(0, Watch::Listed(cm));
        p.on_watch(0, Watch::ListDone);
        assert!(p.behind(&[net("10.0.0.0/24")]).is_empty(), "listed at last");
        let later = p.on_failed(0, "connection reset".into());
        assert_eq!(
            later,
            OutputSeen::default(),
            "a listed output's watch retries by itself"
        );
        assert!(p.behind(&[net("10.0.0.0/24")]).is_empty());
    }

    #[test]
    fn a_relist_of_many_objects_replaces_them_only_when_complete() {
        let mut p = Publication::new(&[ip_pools()], Vec::new());
        let both = PodNetwork::new(
            &[config_of("a", "10.0.0.0/24"), config_of("b", "10.1.0.0/24")],
            &[],
        );
        let ranges = [net("10.0.0.0/24"), net("10.1.0.0/24")];
        p.on_published(&both);
        p.on_watch(0, Watch::ListStart);
        let pools = pools_of(&both);
        assert_eq!(pools.len(), 2);
        for pool in &pools {
            p.on_watch(0, Watch::Listed(pool.clone()));
        }
        assert_eq!(p.behind(&ranges).len(), 1, "not until the list is done");
        p.on_watch(0, Watch::ListDone);
        assert!(p.behind(&ranges).is_empty());
        // A relist in progress that has returned one pool so far removes nothing yet.
        p.on_watch(0, Watch::ListStart);
        p.on_watch(0, Watch::Listed(pools[1].clone()));
        assert!(p.behind(&ranges).is_empty());
        p.on_watch(0, Watch::ListDone);
        assert_eq!(
            p.behind(&ranges),
            vec![format!("{} includes 10.0.0.0/24", ip_pools())],
            "the complete list lacks the first pool"
        );
        p.on_watch(0, Watch::Applied(pools[0].clone()));
        assert!(p.behind(&ranges).is_empty());
        p.on_watch(0, Watch::Deleted(pools[1].clone()));
        assert_eq!(p.behind(&ranges).len(), 1);
    }
}
