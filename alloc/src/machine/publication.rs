//! The pod network consumers read: what is published to their ConfigMaps, what each
//! publication in flight or landed puts there, what each output's watch shows, and so which
//! ranges consumers may not hold yet (allocation from a range waits until they do).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use tracing::info;

use super::core::Core;
use super::{Effect, Watch};
use crate::podnetwork::{ConfigMapRef, OutputContent, OutputKind, PodNetwork, covered};

/// A consumer output of the pod network and what its watch last showed.
#[derive(Clone, Debug)]
struct Output {
    target: ConfigMapRef,
    kind: OutputKind,
    /// `None` until the watch has listed it; an absent ConfigMap holds nothing.
    seen: Option<OutputContent>,
    /// Whether the current (re)list returned the object.
    listed: bool,
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
}

impl Publication {
    pub(super) fn new(outputs: &[(ConfigMapRef, OutputKind)], extra: Vec<IpNet>) -> Self {
        let outputs = outputs
            .iter()
            .map(|(target, kind)| Output {
                target: target.clone(),
                kind: *kind,
                seen: None,
                listed: false,
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
            .map(|o| o.kind.desired(network, extra))
            .collect()
    }

    /// A network is written. What was sent before it landed before it or was skipped.
    pub(super) fn on_published(&mut self, network: &PodNetwork) {
        let desired = self.desired(network);
        // The publisher writes in order and skips only what a newer network replaced, so this
        // one accounts for every publication sent before it, whatever their content.
        self.network_in_flight.retain(|(seq, _)| *seq > network.seq);
        self.network_landed = Some(desired);
    }

    /// One event of the watch of output `index`.
    pub(super) fn on_watch(&mut self, index: usize, w: Watch<ConfigMap>) -> OutputSeen {
        match w {
            Watch::ListStart => {
                if let Some(o) = self.outputs.get_mut(index) {
                    o.listed = false;
                }
                OutputSeen::default()
            }
            Watch::Listed(cm) | Watch::Applied(cm) => OutputSeen {
                changed: self.on_output(index, Some(&cm.data.unwrap_or_default())),
                listed: false,
            },
            Watch::Deleted(_) => OutputSeen {
                changed: self.on_output(index, None),
                listed: false,
            },
            Watch::ListDone => {
                // Listed without the object: it does not exist, and holds nothing.
                let unlisted = self.outputs.get(index).is_some_and(|o| !o.listed);
                OutputSeen {
                    changed: unlisted && self.on_output(index, None),
                    listed: true,
                }
            }
        }
    }

    /// An output's ConfigMap changed (our write, a user's edit, a delete): whether what it
    /// holds changed (allocation is gated on it), after asking to write it again when it is
    /// not what we last asked for.
    fn on_output(&mut self, index: usize, data: Option<&BTreeMap<String, String>>) -> bool {
        let Some(output) = self.outputs.get_mut(index) else {
            return false;
        };
        output.listed |= data.is_some();
        let content = data.map(|d| output.kind.read(d)).unwrap_or_default();
        let drifted = self
            .network_sent
            .as_ref()
            .and_then(|sent| sent.get(index))
            .is_some_and(|sent| *sent != content);
        if drifted {
            info!(configmap = %output.target, "published pod network differs from what was written; writing it again");
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
        self.outputs
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
                (!missing.is_empty())
                    .then(|| format!("ConfigMap {} includes {}", o.target, missing.join(", ")))
            })
            .collect()
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
    use crate::podnetwork::ConfigRanges;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn one_output() -> Publication {
        let target = ConfigMapRef {
            namespace: "nodeipam-system".into(),
            name: "pod-network".into(),
        };
        Publication::new(&[(target, OutputKind::PodNetwork)], Vec::new())
    }

    /// The pod network of one active config of `range`, as publication `seq`.
    fn network_of(range: &str, seq: u64) -> PodNetwork {
        let config = ConfigRanges {
            name: "c".into(),
            families: vec![(net(range), 0, 4)],
            nodes: 0,
            deleting: false,
            enabled: true,
            drained: false,
        };
        PodNetwork {
            seq,
            ..PodNetwork::new(&[config], &[])
        }
    }

    fn holding(network: &PodNetwork) -> Watch<ConfigMap> {
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
}
