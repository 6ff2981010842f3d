//! The NodeIPAMConfig objects as the watch last showed them, our finalizer on them (asked
//! for once at a time), and the gates that hold allocation from a config back: its pool
//! retiring it, our finalizer missing, a status consumers may read saying Drained, consumers
//! not holding its ranges yet.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeSelector;
use kube_core::{Resource, ResourceExt};
use nodeipam_crd::{
    Allocation as AllocationSwitch, FINALIZER, NodeIPAMConfig, NodeIPAMConfigStatus,
};

use super::Effect;
use super::core::Core;
use super::pools::Pools;
use super::publication::Publication;
use super::statuses::{Statuses, says_drained};
use crate::effects::ConfigJob;
use crate::ipam::{ConfigInput, Ipam};

/// What the machine remembers of a config object besides the allocation state.
#[derive(Clone, Debug)]
pub(super) struct ConfigSeen {
    /// The allocation state's view, before gates.
    base: ConfigInput,
    uid: Option<String>,
    generation: Option<i64>,
    has_finalizer: bool,
    deleting: bool,
    status: Option<NodeIPAMConfigStatus>,
    /// Allocation waits: the status says (or a status of ours on its way says) Drained, and
    /// consumers may act on that. See `Configs::drain_gate`.
    drain_gate: bool,
    finalizer_requested: bool,
    /// The uid of the NodeIPAMPool named by its controller ownerReference, if any.
    owner_uid: Option<String>,
    resource_version: Option<String>,
}

impl ConfigSeen {
    /// The allocation state's view of the object, before gates.
    pub(super) fn input(&self) -> &ConfigInput {
        &self.base
    }

    pub(super) fn uid(&self) -> Option<&String> {
        self.uid.as_ref()
    }

    pub(super) fn generation(&self) -> Option<i64> {
        self.generation
    }

    pub(super) fn has_finalizer(&self) -> bool {
        self.has_finalizer
    }

    pub(super) fn deleting(&self) -> bool {
        self.deleting
    }

    /// The status the watch shows.
    pub(super) fn status(&self) -> Option<&NodeIPAMConfigStatus> {
        self.status.as_ref()
    }

    /// The uid of the NodeIPAMPool named by its controller ownerReference, if any.
    pub(super) fn owner_uid(&self) -> Option<&String> {
        self.owner_uid.as_ref()
    }

    pub(super) fn resource_version(&self) -> Option<&String> {
        self.resource_version.as_ref()
    }

    /// A pool's child created disabled and awaiting its enable: it carries the marker and
    /// its allocation is Disabled.
    pub(super) fn awaiting(&self) -> bool {
        self.base.awaiting
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct Configs {
    configs: BTreeMap<String, ConfigSeen>,
}

impl Configs {
    pub(super) fn len(&self) -> usize {
        self.configs.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    pub(super) fn contains(&self, name: &str) -> bool {
        self.configs.contains_key(name)
    }

    pub(super) fn get(&self, name: &str) -> Option<&ConfigSeen> {
        self.configs.get(name)
    }

    /// Every config's name, in order.
    pub(super) fn names(&self) -> impl Iterator<Item = &String> {
        self.configs.keys()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&String, &ConfigSeen)> {
        self.configs.iter()
    }

    /// The node selector of a known config.
    pub(super) fn selector(&self, name: &str) -> Option<Option<&NodeSelector>> {
        self.configs.get(name).map(|s| s.base.selector.as_ref())
    }

    /// A config object as the watch shows it (marked for a status flush): whether anything
    /// allocation or other configs depend on changed (its spec, our finalizer, its drain
    /// gate); then its gates are the allocation state's to learn.
    pub(super) fn on_config(
        &mut self,
        obj: NodeIPAMConfig,
        statuses: &mut Statuses,
        core: &mut Core,
    ) -> bool {
        let name = obj.name_any();
        let has_finalizer = obj.finalizers().iter().any(|f| f == FINALIZER);
        let deleting = obj.meta().deletion_timestamp.is_some();
        let mut previous = self.configs.remove(&name);
        if previous
            .as_ref()
            .is_some_and(|p| p.uid.is_some() && p.uid != obj.uid())
        {
            // Another object under the same name (its delete fell between two lists): nothing
            // remembered of the old one applies to it.
            previous = None;
            statuses.forget(&name);
        }
        let finalizer_requested = previous
            .as_ref()
            .is_some_and(|p| p.finalizer_requested && !has_finalizer);
        let owner_uid = obj
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "NodeIPAMPool")
            .map(|o| o.uid.clone());
        let mut seen = ConfigSeen {
            base: config_input(&obj),
            uid: obj.uid(),
            generation: obj.meta().generation,
            has_finalizer,
            deleting,
            drain_gate: false,
            status: obj.status.clone(),
            finalizer_requested,
            owner_uid,
            resource_version: obj.resource_version(),
        };
        if !has_finalizer && !deleting && !seen.finalizer_requested {
            seen.finalizer_requested = true;
            core.push(Effect::Config(ConfigJob::AddFinalizer {
                name: name.clone(),
            }));
        }
        statuses.object_shows(&name, seen.status.as_ref());
        seen.drain_gate = Self::drain_gate(&name, &seen, statuses);
        let gates = |s: &ConfigSeen| (s.has_finalizer, s.drain_gate);
        let before = previous.map(|p| (gates(&p), p.base));
        let unchanged = before.as_ref() == Some(&(gates(&seen), seen.base.clone()));
        self.configs.insert(name.clone(), seen);
        statuses.mark(name);
        // Unchanged: only status or metadata moved (our own status write, most often).
        !unchanged
    }

    pub(super) fn remove(&mut self, name: &str) {
        self.configs.remove(name);
    }

    /// Every config without our finalizer (and not being deleted) gets it asked for, once at
    /// a time.
    pub(super) fn request_finalizers(&mut self, core: &mut Core) {
        let missing: Vec<String> = self
            .configs
            .iter_mut()
            .filter(|(_, s)| !s.has_finalizer && !s.deleting && !s.finalizer_requested)
            .map(|(name, s)| {
                s.finalizer_requested = true;
                name.clone()
            })
            .collect();
        for name in missing {
            core.push(Effect::Config(ConfigJob::AddFinalizer { name }));
        }
    }

    /// Our finalizer was added, or the config was gone. Done, but the object may have been
    /// another one by then: the next tick asks again if the finalizer is still missing.
    pub(super) fn finalizer_answered(&mut self, name: &str) {
        if let Some(seen) = self.configs.get_mut(name) {
            seen.finalizer_requested = false;
        }
    }

    /// Drained is a promise to consumers that no node holds a block from the config, and
    /// they may act on it (forget its ranges). So a config enabled again after it drained
    /// hands out nothing while any status that consumers may read says Drained: the one the
    /// watch shows, ours on its way, or ours landed while the watch still lags behind it.
    fn drain_gate(name: &str, seen: &ConfigSeen, statuses: &Statuses) -> bool {
        says_drained(seen.status.as_ref()) || statuses.drained_on_its_way(name)
    }

    /// The drain gate again, after a status of ours was sent or landed: the new gate if it
    /// moved (then the allocation state must learn it).
    pub(super) fn update_drain_gate(&mut self, name: &str, statuses: &Statuses) -> Option<bool> {
        let seen = self.configs.get_mut(name)?;
        let gate = Self::drain_gate(name, seen, statuses);
        if gate == seen.drain_gate {
            return None;
        }
        seen.drain_gate = gate;
        Some(gate)
    }

    /// Every config's gate again, after what consumers know changed: only the configs whose
    /// gate moved change (and are marked for a status flush). The configs whose gate opened.
    pub(super) fn regate(
        &self,
        pools: &Pools,
        publication: &Publication,
        statuses: &mut Statuses,
        ipam: &mut Ipam,
    ) -> BTreeSet<String> {
        let mut opened = BTreeSet::new();
        for name in self.configs.keys() {
            let input = self.gated(name, pools, publication);
            let before = ipam.config_gate(name);
            if before == Some(input.gate.as_deref()) {
                continue;
            }
            if input.gate.is_none() {
                opened.insert(name.clone());
            }
            ipam.upsert_config(input);
            statuses.mark(name.clone());
        }
        opened
    }

    /// The config's input with the gates that hold back allocation: our finalizer must be on
    /// it (so it cannot vanish while nodes hold blocks), and consumers must know its ranges.
    pub(super) fn gated(
        &self,
        name: &str,
        pools: &Pools,
        publication: &Publication,
    ) -> ConfigInput {
        let Some(seen) = self.configs.get(name) else {
            return ConfigInput {
                name: name.to_string(),
                ..ConfigInput::default()
            };
        };
        let mut input = seen.base.clone();
        if pools.is_retiring(name) {
            input.gate = Some("being retired by its NodeIPAMPool".into());
            return input;
        }
        if !seen.has_finalizer {
            input.gate = Some(format!("waiting for the {FINALIZER} finalizer"));
            return input;
        }
        // Drained is a promise to consumers that no node holds a block: a config enabled again
        // hands out nothing until its status says otherwise.
        if seen.drain_gate {
            input.gate = Some("waiting until its status no longer says Drained".into());
            return input;
        }
        let ranges: Vec<IpNet> = [input.ipv4, input.ipv6]
            .into_iter()
            .flatten()
            .map(|(r, _)| r)
            .collect();
        let behind = publication.behind(&ranges);
        if !behind.is_empty() {
            input.gate = Some(format!("waiting until {}", behind.join(" and ")));
        }
        input
    }
}

/// The allocation state's view of a config object. An unparsable spec becomes `invalid` with
/// the validation errors, never a panic.
pub fn config_input(obj: &NodeIPAMConfig) -> ConfigInput {
    let spec = &obj.spec;
    let errors = nodeipam_crd::validation::validate_spec(spec);
    let invalid = (!errors.is_empty()).then(|| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    });
    // An invalid spec still claims its ranges (published, protected, counted), as parsed by
    // the vocabulary the webhook shares; only allocation waits for a valid one.
    let claimed = nodeipam_crd::Ranges::claimed(spec);
    let family = |r: Option<nodeipam_crd::FamilyRange>| r.map(|r| (r.cidr, r.per_node_mask_size));
    ConfigInput {
        name: obj.name_any(),
        created: obj
            .meta()
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        ipv4: family(claimed.ipv4),
        ipv6: family(claimed.ipv6),
        selector: spec.node_selector.clone(),
        enabled: spec.allocation == AllocationSwitch::Enabled,
        awaiting: crate::pool::awaits_enable(obj),
        deleting: obj.meta().deletion_timestamp.is_some(),
        invalid,
        gate: None,
        provisional: !obj.finalizers().iter().any(|f| f == FINALIZER),
        pool: obj.labels().get(crate::pool::POOL_LABEL).cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::config;
    use crate::machine::statuses::drained;

    fn one(finalized: bool) -> NodeIPAMConfig {
        let family = Some(("10.0.0.0/24", 26));
        config("c", "u1", 1, (family, None), None, finalized)
    }

    fn finalizer_requests(core: &mut Core) -> usize {
        core.take()
            .iter()
            .filter(|e| matches!(e, Effect::Config(ConfigJob::AddFinalizer { .. })))
            .count()
    }

    #[test]
    fn our_finalizer_is_asked_for_once_at_a_time() {
        let (mut configs, mut statuses) = (Configs::default(), Statuses::default());
        let mut core = Core::new(Ipam::new());
        assert!(configs.on_config(one(false), &mut statuses, &mut core));
        assert_eq!(finalizer_requests(&mut core), 1);
        assert!(
            !configs.on_config(one(false), &mut statuses, &mut core),
            "the same object again moves nothing"
        );
        configs.request_finalizers(&mut core);
        assert_eq!(finalizer_requests(&mut core), 0, "still asked for");
        configs.finalizer_answered("c");
        configs.request_finalizers(&mut core);
        assert_eq!(
            finalizer_requests(&mut core),
            1,
            "answered and still missing"
        );
        assert!(configs.on_config(one(true), &mut statuses, &mut core));
        configs.request_finalizers(&mut core);
        assert_eq!(finalizer_requests(&mut core), 0);
    }

    #[test]
    fn a_config_waits_for_our_finalizer_and_while_its_status_says_drained() {
        let (mut configs, mut statuses) = (Configs::default(), Statuses::default());
        let mut core = Core::new(Ipam::new());
        let (pools, publication) = (Pools::default(), Publication::new(&[], Vec::new()));
        let gate = |c: &Configs| c.gated("c", &pools, &publication).gate;
        configs.on_config(one(false), &mut statuses, &mut core);
        let finalizer = format!("waiting for the {FINALIZER} finalizer");
        assert_eq!(gate(&configs), Some(finalizer));
        let mut was_drained = one(true);
        was_drained.status = Some(drained());
        configs.on_config(was_drained, &mut statuses, &mut core);
        let drain = "waiting until its status no longer says Drained";
        assert_eq!(gate(&configs).as_deref(), Some(drain));
        assert_eq!(configs.update_drain_gate("c", &statuses), None, "unmoved");
        assert!(configs.on_config(one(true), &mut statuses, &mut core));
        assert_eq!(gate(&configs), None, "no output to wait for");
    }

    #[test]
    fn only_the_configs_whose_gate_moved_are_given_to_the_allocation_state_again() {
        let (mut configs, mut statuses) = (Configs::default(), Statuses::default());
        let mut core = Core::new(Ipam::new());
        let (pools, publication) = (Pools::default(), Publication::new(&[], Vec::new()));
        configs.on_config(one(true), &mut statuses, &mut core);
        let mut ipam = Ipam::new();
        let opened = configs.regate(&pools, &publication, &mut statuses, &mut ipam);
        assert_eq!(opened, BTreeSet::from(["c".to_string()]));
        let again = configs.regate(&pools, &publication, &mut statuses, &mut ipam);
        assert!(again.is_empty());
    }
}
