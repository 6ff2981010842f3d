//! The configs' statuses: which configs' status must be counted again, what each one should
//! say (and its metrics), the statuses we sent, in flight and landed, the counts held back
//! to once a `STATUS_COUNTS_EVERY`, and the unmanaged podCIDRs already reported.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use nodeipam_crd::NodeIPAMConfigStatus;
use tracing::{info, warn};

use super::configs::Configs;
use super::core::Core;
use super::{Effect, Metric, STATUS_COUNTS_EVERY};
use crate::effects::{self, ConfigJob, Note};
use crate::ipam::{ConfigFacts, Ipam};
use crate::status::{counts_only, desired_status};

#[derive(Clone, Debug, Default)]
pub(super) struct Statuses {
    /// Configs whose status is counted again at the next flush.
    dirty: BTreeSet<String>,
    /// The unmanaged podCIDRs may have changed: counted and reported at the next flush.
    unmanaged_dirty: bool,
    /// Unmanaged podCIDRs already told about, with their node.
    reported: HashSet<(String, IpNet)>,
    /// The status we last wrote per config: the previous conditions for the next one, even
    /// before the watch shows our write.
    written: HashMap<String, NodeIPAMConfigStatus>,
    /// The statuses sent per config and not yet reported written, oldest first. The config
    /// writer writes one job at a time and may skip a status a newer one replaced.
    status_in_flight: HashMap<String, Vec<NodeIPAMConfigStatus>>,
    /// The status last reported written per config.
    status_landed: HashMap<String, NodeIPAMConfigStatus>,
    /// When each config's status was last sent: counts wait for `STATUS_COUNTS_EVERY`.
    status_sent_at: HashMap<String, Duration>,
    /// Each config's facts as its last status flush computed them (every change that moves
    /// them marks the config for one): what pool decisions read.
    facts: HashMap<String, ConfigFacts>,
}

/// What one config's flush did.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Flushed {
    /// A status was sent: its drain gate may move.
    pub(super) sent: bool,
    /// Our finalizer may go, from the object with this uid: nothing holds, is being given or
    /// may still receive a block.
    pub(super) release: Option<Option<String>>,
}

impl Statuses {
    /// Marks the configs whose ranges `cidrs` touch for a status update.
    pub(super) fn touch(&mut self, ipam: &Ipam, cidrs: &[IpNet]) {
        for c in cidrs {
            self.dirty.extend(ipam.configs_touching(c));
        }
    }

    /// Marks one config for a status update.
    pub(super) fn mark(&mut self, name: String) {
        self.dirty.insert(name);
    }

    /// Marks every one of `names` for a status update.
    pub(super) fn mark_all(&mut self, names: impl IntoIterator<Item = String>) {
        self.dirty.extend(names);
    }

    /// The unmanaged podCIDRs may have changed.
    pub(super) fn unmanaged_moved(&mut self) {
        self.unmanaged_dirty = true;
    }

    /// A node is gone: its unmanaged podCIDRs are told about again if they come back.
    pub(super) fn forget_node(&mut self, name: &str) {
        self.reported.retain(|(n, _)| n != name);
    }

    /// What is remembered of our writes to a config object that is gone.
    pub(super) fn forget(&mut self, name: &str) {
        self.written.remove(name);
        self.status_in_flight.remove(name);
        self.status_landed.remove(name);
        self.status_sent_at.remove(name);
    }

    /// A config is gone: its writes and its facts are forgotten.
    pub(super) fn config_gone(&mut self, name: &str) {
        self.forget(name);
        self.facts.remove(name);
    }

    /// The watch shows a config's `status`. A status that is not the one we wrote was edited
    /// by someone else (or predates us): the object, not our memory of the write, is what the
    /// next flush compares with.
    pub(super) fn object_shows(&mut self, name: &str, status: Option<&NodeIPAMConfigStatus>) {
        if self.written.get(name).is_some_and(|w| Some(w) != status) {
            self.written.remove(name);
        }
    }

    /// Whether a status of ours that says Drained is on its way to the config, or landed
    /// while the watch may still lag behind it.
    pub(super) fn drained_on_its_way(&self, name: &str) -> bool {
        self.status_in_flight
            .get(name)
            .is_some_and(|l| l.iter().any(|s| says_drained(Some(s))))
            || says_drained(self.status_landed.get(name))
    }

    /// A config's status is written. The config writer writes one job at a time, so a status
    /// reported written is what the object holds now (unless someone edits it later).
    pub(super) fn landed(&mut self, name: &str, status: &NodeIPAMConfigStatus) {
        // What was sent before it landed before it or was replaced by a newer one.
        if let Some(in_flight) = self.status_in_flight.get_mut(name)
            && let Some(at) = in_flight.iter().rposition(|s| s == status)
        {
            in_flight.drain(..=at);
        }
        self.status_landed.insert(name.to_string(), status.clone());
    }

    /// A config's facts as of the last status flush, if it had one.
    pub(super) fn facts(&self, name: &str) -> Option<&ConfigFacts> {
        self.facts.get(name)
    }

    /// A flush begins: whether what consumers read may have changed, and the configs to
    /// flush. The unmanaged podCIDRs are counted and reported now if they moved.
    pub(super) fn begin_flush(&mut self, core: &mut Core) -> (bool, BTreeSet<String>) {
        // Before the flag is cleared below: unmanaged podCIDRs are part of the pod network.
        let network_moved = !self.dirty.is_empty() || self.unmanaged_dirty;
        if std::mem::take(&mut self.unmanaged_dirty) {
            self.report_unmanaged(core);
        }
        (network_moved, std::mem::take(&mut self.dirty))
    }

    fn report_unmanaged(&mut self, core: &mut Core) {
        let unmanaged = core.ipam().unmanaged();
        core.metric(Metric::Unmanaged(unmanaged.len()));
        for (cidr, node) in unmanaged {
            if self.reported.insert((node.clone(), cidr)) {
                warn!(node = %node, %cidr, "podCIDR lies in no NodeIPAMConfig: unmanaged, left as it is");
                let uid = core.ipam().node(&node).and_then(|r| r.uid.clone());
                let message = format!(
                    "podCIDR {cidr} lies in no NodeIPAMConfig; it is kept and counted as unmanaged"
                );
                let note = Note::node(
                    &node,
                    uid.as_deref(),
                    true,
                    effects::UNMANAGED_POD_CIDR,
                    message,
                );
                core.note(note);
            }
        }
    }

    /// One config's status and its metrics, from the allocation state; `None` when the
    /// config or its facts are gone.
    pub(super) fn flush_config(
        &mut self,
        name: &str,
        configs: &Configs,
        core: &mut Core,
        now: &Time,
    ) -> Option<Flushed> {
        let (Some(seen), Some(facts)) = (configs.get(name), core.ipam().config_facts(name)) else {
            return None;
        };
        let ranges = [seen.input().ipv4, seen.input().ipv6];
        let mut metrics = Vec::new();
        for ((family, f), range) in [("ipv4", facts.ipv4), ("ipv6", facts.ipv6)]
            .into_iter()
            .zip(ranges)
        {
            let Some(f) = f else { continue };
            if let Some((range, _)) = range
                && f.capacity > 0
            {
                // kcm's usage gauge: the fraction of the range's blocks in use, by any config.
                let ratio = f.occupied as f64 / f.capacity as f64;
                metrics.push(Metric::Usage { range, ratio });
                metrics.push(Metric::Capacity {
                    range,
                    blocks: f.capacity,
                });
            }
            metrics.push(Metric::Blocks {
                config: name.to_string(),
                family,
                allocated: f.allocated,
                capacity: f.capacity,
            });
        }
        let previous: &[Condition] = self
            .written
            .get(name)
            .or(seen.status())
            .map_or(&[], |s| s.conditions.as_slice());
        let (status, transitions) = desired_status(&facts, seen.generation(), previous, now);
        self.facts.insert(name.to_string(), facts.clone());
        metrics.push(Metric::Status {
            config: name.to_string(),
            status: status.clone(),
        });
        // A landed status that says Drained holds allocation back until a later one lands.
        let undrain = says_drained(self.status_landed.get(name))
            && !says_drained(Some(&status))
            && self.status_in_flight.get(name).and_then(|l| l.last()) != Some(&status);
        let current = self.written.get(name).or(seen.status());
        let unchanged = !undrain && current == Some(&status);
        // Counts alone wait for their time; the config stays dirty until then.
        let counts_wait = !undrain
            && current.is_some_and(|c| counts_only(c, &status))
            && self
                .status_sent_at
                .get(name)
                .is_some_and(|at| core.mono().saturating_sub(*at) < STATUS_COUNTS_EVERY);
        let (uid, deleting, has_finalizer) =
            (seen.uid().cloned(), seen.deleting(), seen.has_finalizer());
        for m in metrics {
            core.metric(m);
        }
        for t in transitions.iter().filter(|t| t.status == "True") {
            let (warning, reason) = match t.type_ {
                nodeipam_crd::CONDITION_DRAINED => (false, effects::DRAINED),
                nodeipam_crd::CONDITION_EXHAUSTED => (true, effects::EXHAUSTED),
                _ => continue,
            };
            info!(config = %name, reason, "condition turned True");
            let note = Note::config(name, uid.as_deref(), warning, reason, t.message.clone());
            core.note(note);
        }
        let mut sent = false;
        if !unchanged && counts_wait {
            self.dirty.insert(name.to_string());
        } else if !unchanged {
            self.status_sent_at.insert(name.to_string(), core.mono());
            core.push(Effect::Config(ConfigJob::Status {
                name: name.to_string(),
                uid: uid.clone(),
                status: status.clone(),
            }));
            let in_flight = self.status_in_flight.entry(name.to_string()).or_default();
            if in_flight.last() != Some(&status) {
                in_flight.push(status.clone());
            }
            self.written.insert(name.to_string(), status);
            sent = true;
        }
        // The finalizer goes only when nothing holds, is being given or may still receive a
        // block.
        let release = (deleting && has_finalizer && !facts.held()).then_some(uid);
        Some(Flushed { sent, release })
    }
}

/// Whether a status says Drained: a promise to consumers that no node holds a block.
pub(super) fn says_drained(status: Option<&NodeIPAMConfigStatus>) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == nodeipam_crd::CONDITION_DRAINED && c.status == "True")
    })
}

/// A status that says Drained, for the parts' tests.
#[cfg(test)]
pub(super) fn drained() -> NodeIPAMConfigStatus {
    NodeIPAMConfigStatus {
        conditions: vec![Condition {
            type_: nodeipam_crd::CONDITION_DRAINED.into(),
            status: "True".into(),
            reason: "Drained".into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }],
        ..NodeIPAMConfigStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: u64) -> NodeIPAMConfigStatus {
        NodeIPAMConfigStatus {
            nodes: Some(n),
            ..NodeIPAMConfigStatus::default()
        }
    }

    #[test]
    fn a_status_edited_by_someone_else_is_no_longer_taken_for_ours() {
        let mut s = Statuses::default();
        s.written.insert("c".into(), nodes(1));
        s.object_shows("c", Some(&nodes(1)));
        assert!(s.written.contains_key("c"), "the object shows our write");
        s.object_shows("c", Some(&nodes(7)));
        assert!(!s.written.contains_key("c"));
    }

    #[test]
    fn drained_is_on_its_way_in_flight_and_landed_until_a_later_status_lands() {
        let mut s = Statuses::default();
        assert!(!s.drained_on_its_way("c"));
        s.status_in_flight
            .insert("c".into(), vec![drained(), nodes(1)]);
        assert!(s.drained_on_its_way("c"));
        s.landed("c", &drained());
        assert_eq!(
            s.status_in_flight["c"],
            vec![nodes(1)],
            "it and what came before"
        );
        assert!(s.drained_on_its_way("c"), "landed: consumers may read it");
        s.landed("c", &nodes(1));
        assert!(!s.drained_on_its_way("c"));
        assert!(s.status_in_flight["c"].is_empty());
    }

    #[test]
    fn a_flush_takes_the_marked_configs_and_says_whether_the_pod_network_may_move() {
        let mut core = Core::new(Ipam::new());
        let mut s = Statuses::default();
        assert_eq!(s.begin_flush(&mut core), (false, BTreeSet::new()));
        s.mark("b".into());
        s.mark_all(["a".to_string()]);
        let (moved, names) = s.begin_flush(&mut core);
        assert!(moved);
        assert_eq!(names, BTreeSet::from(["a".to_string(), "b".to_string()]));
        assert!(core.take().is_empty());
        s.unmanaged_moved();
        let (moved, names) = s.begin_flush(&mut core);
        assert!(moved, "unmanaged podCIDRs are part of the pod network");
        assert!(names.is_empty());
        assert!(matches!(
            core.take()[..],
            [Effect::Metric(Metric::Unmanaged(0))]
        ));
    }
}
