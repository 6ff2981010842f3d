//! The NodeIPAMPools and their children: each pool's decision (carve, retire, status), the
//! children being retired, when each child became empty, and how fast each pool's children
//! hand out blocks. The carves in flight are `Carves`'.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use tracing::{debug, info, warn};

use super::carves::{Carves, child_config};
use super::configs::{ConfigSeen, Configs};
use super::core::Core;
use super::statuses::Statuses;
use super::{Effect, Metric};
use crate::effects::{
    self, ChildConfig, CreateOutcome, DeleteOutcome, EnableChild, EnableOutcome, Note,
};
use crate::ipam::ConfigFacts;
use crate::pool::{
    self as scaling, Carve, ChildView, DEMAND_WINDOW, PoolInput, PoolStatus, PoolWorld,
};
use crate::selection::{self, NodeView};

/// A pool and what the last decision found.
#[derive(Clone, Debug)]
struct PoolSeen {
    input: PoolInput,
    /// The pool can still grow (or is growing): its nodes wait without a warning.
    room: bool,
}

/// What one pool's decision leaves to the other parts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Scaled {
    /// Children now being retired: they hand out nothing from now on.
    pub(super) retired: Vec<String>,
    /// The pool can no longer grow: nodes that waited for it without a warning get one now.
    pub(super) stopped_growing: bool,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Pools {
    pools: BTreeMap<String, PoolSeen>,
    carves: Carves,
    /// Children whose delete we asked for, by name, with the uid: they hand out nothing more.
    retiring: BTreeMap<String, Option<String>>,
    /// Children whose enable we asked for, by name, with the resourceVersion it was sent at:
    /// not asked again until the watch shows the child moved or the answer says it failed.
    enabling: BTreeMap<String, Option<String>>,
    /// When each pool child's node count last became 0.
    empty_since: HashMap<String, Duration>,
    /// The status we last wrote per pool.
    pool_written: HashMap<String, PoolStatus>,
    /// When each pool's children handed out their recent blocks, oldest first.
    handed_out: HashMap<String, VecDeque<Duration>>,
}

impl Pools {
    /// Carves asked for and not yet seen as configs.
    pub(super) fn carves_in_flight(&self) -> usize {
        self.carves.len()
    }

    /// Whether the child `name` is being retired by its pool.
    pub(super) fn is_retiring(&self, name: &str) -> bool {
        self.retiring.contains_key(name)
    }

    pub(super) fn on_pool(&mut self, pool: PoolInput) {
        let name = pool.name.clone();
        let previous = self.pools.remove(&name);
        let same_object = previous
            .as_ref()
            .is_none_or(|p| p.input.uid.is_none() || p.input.uid == pool.uid);
        if !same_object {
            // Another object under the same name: the old one's carves and status are moot.
            self.carves.forget_pool(&name);
            self.pool_written.remove(&name);
        }
        // A status that is not the one we wrote was edited by someone else (or predates us).
        if self
            .pool_written
            .get(&name)
            .is_some_and(|w| Some(w) != pool.status.as_ref())
        {
            self.pool_written.remove(&name);
        }
        let room = previous.is_none_or(|p| p.room);
        self.pools.insert(name, PoolSeen { input: pool, room });
    }

    /// A pool is gone; nodes that waited for it without a warning get one once tried again.
    pub(super) fn on_pool_gone(&mut self, name: &str, core: &mut Core) {
        info!(pool = %name, "NodeIPAMPool gone; its children go with it (ownerReference)");
        self.pools.remove(name);
        self.carves.pool_gone(name);
        self.pool_written.remove(name);
        self.handed_out.remove(name);
        core.metric(Metric::PoolGone(name.to_string()));
    }

    /// The pools a (re)list lacks.
    pub(super) fn missing_from(&self, seen: &HashSet<String>) -> Vec<String> {
        self.pools
            .keys()
            .filter(|n| !seen.contains(*n))
            .cloned()
            .collect()
    }

    /// The config watch shows `name`: a carve of it is done, and a delete of ours shows as
    /// deleting (or a new object).
    pub(super) fn config_seen(&mut self, name: &str, configs: &Configs) {
        let Some(seen) = configs.get(name) else {
            return;
        };
        self.carves.config_seen(name, seen);
        if self
            .enabling
            .get(name)
            .is_some_and(|rv| rv.as_ref() != seen.resource_version())
        {
            self.enabling.remove(name);
        }
        if seen.deleting()
            || self
                .retiring
                .get(name)
                .is_some_and(|u| u.is_some() && u.as_ref() != seen.uid())
        {
            self.retiring.remove(name);
        }
    }

    /// A config list that started at step `started` is done.
    pub(super) fn configs_relisted(&mut self, started: u64, seen: &HashSet<String>) {
        self.carves.configs_relisted(started, seen);
    }

    pub(super) fn config_gone(&mut self, name: &str) {
        self.retiring.remove(name);
        self.enabling.remove(name);
        self.empty_since.remove(name);
        self.carves.config_gone(name);
    }

    pub(super) fn on_config_created(
        &mut self,
        config: &ChildConfig,
        outcome: CreateOutcome,
        core: &mut Core,
    ) {
        self.carves.on_config_created(config, outcome, core);
    }

    /// The answer to an enable. Landed: the watch shows it soon (until then it is not asked
    /// again). Refused by its precondition, or failed: decided again at the next decision,
    /// from what the watch shows then (an unanswered one that lands later changes nothing
    /// the decision relies on: the child counted toward max while it awaited).
    pub(super) fn on_config_enabled(
        &mut self,
        child: &EnableChild,
        outcome: EnableOutcome,
        core: &mut Core,
    ) {
        if self.enabling.get(&child.name) != Some(&child.resource_version) {
            return;
        }
        match outcome {
            EnableOutcome::Enabled => return,
            EnableOutcome::Moved(why) => {
                debug!(pool = %child.pool, config = %child.name, reason = %why, "a child changed since it was read; deciding again");
            }
            EnableOutcome::Failed(why) => {
                warn!(pool = %child.pool, config = %child.name, reason = %why, "enabling a pool's child config failed; deciding again");
                core.metric(Metric::Error("config_enable"));
            }
        }
        self.enabling.remove(&child.name);
    }

    /// The answer to a retire: whether the child is handed back (its delete failed or found
    /// it gone), so that its gate is decided again.
    pub(super) fn on_config_deleted(
        &mut self,
        name: &str,
        uid: Option<&str>,
        outcome: DeleteOutcome,
        core: &mut Core,
    ) -> bool {
        if self.retiring.get(name).is_none_or(|u| u.as_deref() != uid) {
            return false;
        }
        match outcome {
            // The watch shows it deleting soon; until then it stays held back.
            DeleteOutcome::Deleted => return false,
            DeleteOutcome::Gone => {}
            DeleteOutcome::Failed(why) => {
                warn!(config = %name, reason = %why, "retiring a pool's child config failed; deciding again");
                core.metric(Metric::Error("config_delete"));
            }
        }
        self.retiring.remove(name);
        true
    }

    /// A carved child accepts allocations for the first time.
    pub(super) fn scaled_up(&mut self, name: &str, core: &mut Core) {
        self.carves.scaled_up(name, core);
    }

    /// A block of `config` was handed out at `now`: the config is not empty, and if it is a
    /// pool's child, its pool's demand grew.
    pub(super) fn block_handed_out(&mut self, config: &str, configs: &Configs, now: Duration) {
        self.empty_since.remove(config);
        if let Some(pool) = self.child_pool(config, configs).map(str::to_string) {
            self.handed_out.entry(pool).or_default().push_back(now);
        }
    }

    /// Blocks `pool`'s children handed out within the last [`DEMAND_WINDOW`].
    fn demand(&mut self, pool: &str, now: Duration) -> u64 {
        let since = now.saturating_sub(DEMAND_WINDOW);
        let Some(times) = self.handed_out.get_mut(pool) else {
            return 0;
        };
        while times.front().is_some_and(|t| *t < since) {
            times.pop_front();
        }
        times.len() as u64
    }

    /// The pool a config is a child of: it carries the pool's label and a controller
    /// ownerReference to the pool object we know.
    fn child_pool<'a>(&self, config: &str, configs: &'a Configs) -> Option<&'a str> {
        let seen = configs.get(config)?;
        let pool = seen.input().pool.as_deref()?;
        let p = self.pools.get(pool)?;
        (p.input.uid.is_none() || seen.owner_uid() == p.input.uid.as_ref()).then_some(pool)
    }

    /// The pool that will take a pending node, if any: the best matching one by its selector.
    fn pool_for(&self, node: NodeView<'_>) -> Option<&PoolSeen> {
        self.pools
            .values()
            .filter(|p| p.input.invalid.is_none() && !p.input.deleting)
            .filter_map(|p| selection::match_score(p.input.selector.as_ref(), node).map(|s| (s, p)))
            .max_by(|(sa, pa), (sb, pb)| sa.cmp(sb).then(pb.input.name.cmp(&pa.input.name)))
            .map(|(_, p)| p)
    }

    /// A pool that selects the node can still grow: its wait is not a shortage to warn about.
    pub(super) fn may_grow(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let node = NodeView { name, labels };
        self.pool_for(node).is_some_and(|p| p.room)
    }

    /// Whether `pool` is the one that will take the pending node.
    pub(super) fn takes(&self, pool: &str, node: NodeView<'_>) -> bool {
        self.pool_for(node).is_some_and(|p| p.input.name == pool)
    }

    /// A round of decisions begins (once every watch has listed): the pools to decide for,
    /// each with the pending nodes among `waiting` it would take that no other config can
    /// serve.
    pub(super) fn begin_scaling<'n>(
        &mut self,
        waiting: impl Iterator<Item = NodeView<'n>>,
        configs: &Configs,
        statuses: &Statuses,
        core: &Core,
    ) -> Vec<(String, u64)> {
        if self.pools.is_empty() {
            return Vec::new();
        }
        self.carves.recheck(core.mono());
        let pending = self.pending_per_pool(waiting, configs, statuses, core);
        self.pools
            .keys()
            .map(|name| (name.clone(), pending.get(name).copied().unwrap_or(0)))
            .collect()
    }

    /// Per pool, the pending nodes it would take that no other config can serve.
    fn pending_per_pool<'n>(
        &self,
        waiting: impl Iterator<Item = NodeView<'n>>,
        configs: &Configs,
        statuses: &Statuses,
        core: &Core,
    ) -> HashMap<String, u64> {
        let mut waiting = waiting.peekable();
        if waiting.peek().is_none() {
            return HashMap::new();
        }
        let others: Vec<&ConfigSeen> = configs
            .iter()
            .filter(|(name, _)| self.child_pool(name, configs).is_none())
            .filter(|(name, _)| {
                config_facts(name, statuses, core).is_some_and(|f| {
                    let free = [f.ipv4, f.ipv6].into_iter().flatten().map(|x| x.free).min();
                    f.enabled
                        && !f.deleting
                        && f.invalid.is_none()
                        && f.overlap.is_none()
                        && free.unwrap_or(0) > 0
                })
            })
            .map(|(_, seen)| seen)
            .collect();
        let mut out = HashMap::new();
        for node in waiting {
            let served = others
                .iter()
                .any(|c| selection::match_score(c.input().selector.as_ref(), node).is_some());
            if served {
                continue;
            }
            if let Some(pool) = self.pool_for(node) {
                *out.entry(pool.input.name.clone()).or_insert(0u64) += 1;
            }
        }
        out
    }

    fn child_view(
        &self,
        name: &str,
        seen: &ConfigSeen,
        statuses: &Statuses,
        core: &Core,
    ) -> ChildView {
        let facts = config_facts(name, statuses, core).unwrap_or_default();
        let families = [facts.ipv4, facts.ipv6];
        let free = families.iter().flatten().map(|f| f.free).min().unwrap_or(0);
        let allocated = families
            .iter()
            .flatten()
            .map(|f| f.allocated)
            .max()
            .unwrap_or(0);
        ChildView {
            name: name.to_string(),
            uid: seen.uid().cloned(),
            ipv4: seen.input().ipv4.map(|(r, _)| r),
            ipv6: seen.input().ipv6.map(|(r, _)| r),
            enabled: seen.input().enabled,
            awaiting: seen.awaiting(),
            resource_version: seen.resource_version().cloned(),
            deleting: seen.deleting(),
            usable: facts.invalid.is_none() && facts.overlap.is_none(),
            accepting: facts.accepting,
            allocated,
            free,
            held: facts.held(),
            empty_since: self.empty_since.get(name).copied(),
            retiring: self.retiring.contains_key(name),
        }
    }

    /// One pool's decision: carve, retire, status.
    pub(super) fn scale_pool(
        &mut self,
        name: &str,
        pending: u64,
        wall: &Time,
        configs: &Configs,
        statuses: &Statuses,
        core: &mut Core,
    ) -> Scaled {
        let Some(pool) = self.pools.get(name) else {
            return Scaled::default();
        };
        let input = pool.input.clone();
        let now = core.mono();
        let child_names: Vec<String> = configs
            .names()
            .filter(|c| self.child_pool(c, configs) == Some(name))
            .cloned()
            .collect();
        let mut children = Vec::with_capacity(child_names.len());
        for c in &child_names {
            let Some(seen) = configs.get(c) else {
                continue;
            };
            let mut view = self.child_view(c, seen, statuses, core);
            if !view.held {
                view.empty_since = Some(*self.empty_since.entry(c.clone()).or_insert(now));
            } else {
                self.empty_since.remove(c);
                view.empty_since = None;
            }
            children.push(view);
        }
        let mut occupied: Vec<IpNet> = configs
            .iter()
            .filter(|(c, _)| self.child_pool(c, configs) != Some(name))
            .flat_map(|(_, s)| [s.input().ipv4, s.input().ipv6].into_iter().flatten())
            .map(|(r, _)| r)
            .collect();
        occupied.extend(
            self.pools
                .iter()
                .filter(|(n, _)| n.as_str() != name)
                .flat_map(|(_, p)| p.input.budget().copied()),
        );
        occupied.extend(core.ipam().service_ranges());
        occupied.extend(core.ipam().unmanaged().into_iter().map(|(c, _)| c));
        self.carves
            .retry_failed(name, &input, &occupied, |c| configs.contains(c), core);
        let demand = self.demand(name, now);
        // A carve whose child is there counts as the child, unless the child is being deleted
        // while a create of it may still land.
        let leaving: Vec<String> = children
            .iter()
            .filter(|c| c.deleting || c.retiring)
            .map(|c| c.name.clone())
            .collect();
        let in_flight = self.carves.in_flight(name, &child_names, &leaving);
        let previous: Vec<Condition> = self
            .pool_written
            .get(name)
            .or(input.status.as_ref())
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        // A range whose child name a config of another owner holds (a hand-made config
        // named like a child) cannot be created: decide again without it.
        let mut decision;
        let mut attempts = 0;
        loop {
            let world = PoolWorld {
                pool: &input,
                children: &children,
                occupied: &occupied,
                pending,
                in_flight: &in_flight,
                demand,
                now,
            };
            decision = scaling::decide(&world, &previous, wall);
            let taken: Vec<IpNet> = decision
                .carves
                .iter()
                .filter(|c| configs.contains(&c.name))
                .flat_map(Carve::ranges)
                .collect();
            attempts += 1;
            if taken.is_empty() || attempts > 8 {
                break;
            }
            warn!(pool = %name, ?taken, "a config of another owner holds a child's name; carving elsewhere");
            occupied.extend(taken);
        }
        let uid = input.uid.clone();
        let free: u64 = children
            .iter()
            .filter(|c| c.active() && c.usable)
            .map(|c| c.free)
            .sum();
        for carve in &decision.carves {
            if configs.contains(&carve.name) {
                // Still taken after every attempt above: creating it would only find it there.
                debug!(pool = %name, config = %carve.name, "a config of another owner holds the child's name");
                continue;
            }
            let child = child_config(name, &input, carve);
            let ranges: Vec<String> = carve.ranges().map(|r| r.to_string()).collect();
            info!(pool = %name, config = %carve.name, ?ranges, pending, free, "carving a range");
            let message = format!(
                "carved {} as NodeIPAMConfig {}: {pending} node(s) wait, {free} block(s) free, headroom {}",
                ranges.join(" and "),
                carve.name,
                input.headroom
            );
            core.note(Note::pool(
                name,
                uid.as_deref(),
                false,
                effects::RANGE_CARVED,
                message,
            ));
            core.metric(Metric::RangeCarved {
                pool: name.to_string(),
            });
            core.push(Effect::CreateConfig(child));
            self.carves.started(name, uid.clone(), carve, now);
        }
        let mut retired = Vec::with_capacity(decision.retires.len());
        for retire in &decision.retires {
            let ranges: Vec<String> = children
                .iter()
                .filter(|c| c.name == retire.name)
                .flat_map(|c| c.ipv4.into_iter().chain(c.ipv6))
                .map(|r| r.to_string())
                .collect();
            let message = if retire.over_max {
                info!(pool = %name, config = %retire.name, ?ranges, max = input.max, "retiring a range never enabled: the pool has more than its max");
                format!(
                    "retiring NodeIPAMConfig {} ({}): never enabled, and the pool has more than its maximum of {} ranges (a create landed late)",
                    retire.name,
                    ranges.join(" and "),
                    input.max
                )
            } else {
                info!(pool = %name, config = %retire.name, ?ranges, "retiring an empty range");
                format!(
                    "retiring NodeIPAMConfig {} ({}): empty for {}s",
                    retire.name,
                    ranges.join(" and "),
                    input.empty_for.as_secs()
                )
            };
            core.note(Note::pool(
                name,
                uid.as_deref(),
                false,
                effects::RANGE_RETIRED,
                message,
            ));
            core.metric(Metric::RangeRetired {
                pool: name.to_string(),
            });
            self.retiring
                .insert(retire.name.clone(), retire.uid.clone());
            core.push(Effect::DeleteConfig {
                name: retire.name.clone(),
                uid: retire.uid.clone(),
                only_awaiting: retire.over_max,
            });
            // It hands out nothing from now on.
            retired.push(retire.name.clone());
        }
        for enable in &decision.enables {
            if self.enabling.get(&enable.name) == Some(&enable.resource_version) {
                // Asked for at this version already.
                continue;
            }
            info!(pool = %name, config = %enable.name, "enabling a carved range");
            self.enabling
                .insert(enable.name.clone(), enable.resource_version.clone());
            core.push(Effect::EnableConfig(EnableChild {
                pool: name.to_string(),
                name: enable.name.clone(),
                uid: enable.uid.clone(),
                resource_version: enable.resource_version.clone(),
            }));
        }
        for (type_, message) in &decision.turned_true {
            if *type_ == nodeipam_crd::CONDITION_EXHAUSTED {
                warn!(pool = %name, %message, "pool exhausted");
                core.note(Note::pool(
                    name,
                    uid.as_deref(),
                    true,
                    effects::POOL_EXHAUSTED,
                    message.clone(),
                ));
            }
        }
        // Every retire is of a child that counts (enabled, or awaiting its enable).
        let ranges = (children.iter().filter(|c| c.counts()).count() + decision.carves.len())
            .saturating_sub(decision.retires.len());
        core.metric(Metric::PoolRanges {
            pool: name.to_string(),
            ranges: ranges as u64,
        });
        let current = self.pool_written.get(name).or(input.status.as_ref());
        if !input.deleting && current != Some(&decision.status) {
            core.push(Effect::PoolStatus {
                name: name.to_string(),
                uid: uid.clone(),
                status: decision.status.clone(),
            });
            self.pool_written
                .insert(name.to_string(), decision.status.clone());
        }
        // A child awaiting its enable within max is a carve not done yet: the pool grows.
        let growing = decision.room
            || !in_flight.is_empty()
            || !decision.carves.is_empty()
            || !decision.enables.is_empty();
        let was = self.pools.get(name).is_some_and(|p| p.room);
        if let Some(p) = self.pools.get_mut(name) {
            p.room = growing;
        }
        Scaled {
            retired,
            stopped_growing: was && !growing,
        }
    }
}

/// A config's facts as of the last status flush, or counted now.
fn config_facts(name: &str, statuses: &Statuses, core: &Core) -> Option<ConfigFacts> {
    match statuses.facts(name) {
        Some(f) => Some(f.clone()),
        None => core.ipam().config_facts(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{pool, selecting};
    use crate::ipam::Ipam;

    fn labelled(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("pool".to_string(), value.to_string())])
    }

    #[test]
    fn a_node_a_pool_that_can_grow_selects_waits_without_a_warning() {
        let mut pools = Pools::default();
        let family = Some((&["10.0.0.0/16"][..], 24, 26));
        let input = pool(
            "p",
            "pu",
            (family, None),
            (0, 4, 1),
            60,
            Some(selecting("pool", "p")),
        );
        pools.on_pool(input);
        assert!(pools.may_grow("a", &labelled("p")));
        assert!(!pools.may_grow("b", &labelled("q")), "no pool selects it");
        let node = NodeView {
            name: "a",
            labels: &labelled("p"),
        };
        assert!(pools.takes("p", node));
        if let Some(p) = pools.pools.get_mut("p") {
            p.room = false;
        }
        assert!(
            !pools.may_grow("a", &labelled("p")),
            "its pool is at its budget"
        );
        assert_eq!(pools.missing_from(&HashSet::new()), vec!["p".to_string()]);
    }

    #[test]
    fn only_the_answer_for_the_retired_object_hands_a_child_back() {
        let mut pools = Pools::default();
        let mut core = Core::new(Ipam::new());
        pools.retiring.insert("c".into(), Some("u1".into()));
        let gone = |p: &mut Pools, uid, core: &mut Core| {
            p.on_config_deleted("c", Some(uid), DeleteOutcome::Gone, core)
        };
        assert!(
            !gone(&mut pools, "u2", &mut core),
            "another object's answer"
        );
        let deleted = pools.on_config_deleted("c", Some("u1"), DeleteOutcome::Deleted, &mut core);
        assert!(!deleted, "held back until the watch shows it deleting");
        assert!(pools.is_retiring("c"));
        assert!(gone(&mut pools, "u1", &mut core));
        assert!(!pools.is_retiring("c"));
    }
}
