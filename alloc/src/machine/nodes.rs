//! The Node objects as allocation sees them: the nodes waiting for a block (whether warned,
//! since when they wait behind gates, until when they are parked), every attempt to give one
//! a block, and what a node's arrival, change or departure frees or adopts.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeSelector;
use kube_core::ResourceExt;
use tracing::{debug, info, warn};

use super::configs::Configs;
use super::core::Core;
use super::pools::Pools;
use super::statuses::Statuses;
use super::{Effect, GATE_GRACE, Metric};
use crate::effects::{self, Note, WriteJob};
use crate::ipam::{AllocateError, NodeSeen, Phase};
use crate::node::IpamNode;
use crate::seal::Fence;
use crate::selection::{self, NodeView};

/// The parts a node's handling reaches besides the nodes: the allocation state and effects,
/// the statuses it marks, the configs that select nodes, the pools that may grow for them.
pub(super) struct Around<'a> {
    pub(super) core: &'a mut Core,
    pub(super) statuses: &'a mut Statuses,
    pub(super) configs: &'a Configs,
    pub(super) pools: &'a mut Pools,
}

impl Around<'_> {
    /// Marks the configs whose ranges `cidrs` touch for a status update.
    pub(super) fn touch(&mut self, cidrs: &[IpNet]) {
        self.statuses.touch(self.core.ipam(), cidrs);
    }
}

/// The parts a node's handling reaches, owned: for the parts' tests.
#[cfg(test)]
pub(super) struct World {
    pub(super) core: Core,
    pub(super) statuses: Statuses,
    pub(super) configs: Configs,
    pub(super) pools: Pools,
}

#[cfg(test)]
impl World {
    /// Every watch has listed; nothing is known yet.
    pub(super) fn synced() -> Self {
        let mut core = Core::new(crate::ipam::Ipam::new());
        core.set_synced();
        World {
            core,
            statuses: Statuses::default(),
            configs: Configs::default(),
            pools: Pools::default(),
        }
    }

    pub(super) fn around(&mut self) -> Around<'_> {
        Around {
            core: &mut self.core,
            statuses: &mut self.statuses,
            configs: &self.configs,
            pools: &mut self.pools,
        }
    }
}

/// A node waiting for a block.
#[derive(Clone, Debug)]
struct PendingNode {
    uid: Option<String>,
    /// Its seal as last read, for the write's precondition.
    fence: Fence,
    labels: BTreeMap<String, String>,
    warned: bool,
    /// Since when it has waited only behind gates, if it does.
    waiting_since: Option<Duration>,
    /// Not before then: the API server refused every write of its last blocks.
    retry_at: Option<Duration>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Nodes {
    pending: BTreeMap<String, PendingNode>,
    /// Nodes whose invalid podCIDR was told about.
    invalid_reported: HashSet<String>,
    /// A test fault: the machine panics when it sees a Node of this name.
    panic_on_node: Option<String>,
}

impl Nodes {
    pub(super) fn new(panic_on_node: Option<String>) -> Self {
        Nodes {
            panic_on_node,
            ..Nodes::default()
        }
    }

    /// How many nodes wait for a block.
    pub(super) fn len(&self) -> usize {
        self.pending.len()
    }

    pub(super) fn is_pending(&self, name: &str) -> bool {
        self.pending.contains_key(name)
    }

    /// The nodes waiting for a block, in order.
    pub(super) fn waiting(&self) -> impl Iterator<Item = NodeView<'_>> {
        self.pending.iter().map(|(name, p)| NodeView {
            name,
            labels: &p.labels,
        })
    }

    /// The UID of a waiting node, if known.
    pub(super) fn uid(&self, name: &str) -> Option<&String> {
        self.pending.get(name).and_then(|p| p.uid.as_ref())
    }

    pub(super) fn on_node(&mut self, node: IpamNode, cx: &mut Around<'_>) {
        let name = node.name_any();
        if self.panic_on_node.as_deref() == Some(name.as_str()) {
            // A bug in the loop itself, for the supervision tests.
            panic!("injected fault: panic on node {name}");
        }
        let uid = node.uid();
        match node.cidrs() {
            Ok(cidrs) if cidrs.is_empty() => {
                let fence = Fence::of(&node);
                self.on_empty_node(name, uid, fence, node.labels().clone(), cx);
            }
            Ok(cidrs) => self.on_node_with_cidrs(&name, uid.as_deref(), &cidrs, cx),
            Err(message) => {
                // Immutable garbage: nothing we may change; say so once.
                self.pending.remove(&name);
                if self.invalid_reported.insert(name.clone()) {
                    warn!(node = %name, %message, "node has an invalid podCIDR");
                    let note = Note::node(
                        &name,
                        uid.as_deref(),
                        true,
                        effects::INVALID_POD_CIDR,
                        message,
                    );
                    cx.core.note(note);
                }
            }
        }
    }

    fn on_node_with_cidrs(
        &mut self,
        name: &str,
        uid: Option<&str>,
        cidrs: &[IpNet],
        cx: &mut Around<'_>,
    ) {
        self.pending.remove(name);
        // The same object as before: a new object under the same name (seen in a relist)
        // must take over the record, or its deletion would never free the blocks.
        let unchanged = cx.core.ipam().node(name).is_some_and(|r| {
            r.cidrs == cidrs && r.phase == Phase::Held && (uid.is_none() || r.uid.as_deref() == uid)
        });
        if !unchanged {
            self.adopt(name, uid, cidrs, cx);
        }
        // After the adoption: leaked blocks that landed are the node's now, not free.
        self.settle_leaks(name, NodeSeen::Object { uid, cidrs }, cx);
    }

    fn adopt(&mut self, name: &str, uid: Option<&str>, cidrs: &[IpNet], cx: &mut Around<'_>) {
        let adoption = cx.core.ipam_mut().observe_node(name, uid, cidrs);
        for (other, ours, theirs) in &adoption.conflicts {
            let message = format!(
                "podCIDR {ours} of node {name} overlaps podCIDR {theirs} of node {other}; both stay occupied"
            );
            warn!(node = %name, %other, %ours, %theirs, "overlapping podCIDRs");
            let about_this = Note::node(
                name,
                uid,
                true,
                effects::OVERLAPPING_POD_CIDR,
                message.clone(),
            );
            let about_other = Note::node(other, None, true, effects::OVERLAPPING_POD_CIDR, message);
            cx.core.note(about_this);
            cx.core.note(about_other);
        }
        if !adoption.unmanaged.is_empty() {
            cx.statuses.unmanaged_moved();
        }
        cx.touch(cidrs);
        if !adoption.released.is_empty() {
            cx.touch(&adoption.released);
            self.retry_pending_near(&adoption.released, cx);
        }
    }

    fn on_empty_node(
        &mut self,
        name: String,
        uid: Option<String>,
        fence: Fence,
        labels: BTreeMap<String, String>,
        cx: &mut Around<'_>,
    ) {
        match cx.core.ipam().node(&name).map(|r| r.uid.clone()) {
            // Our write is in flight or landed and the watch lags: nothing to do.
            Some(old) if uid.is_none() || old.is_none() || old == uid => return,
            // A new object under an old name: the old one is gone.
            Some(old) => {
                let freed = cx.core.ipam_mut().node_gone(&name, old.as_deref());
                self.freed(&freed, cx);
            }
            None => {}
        }
        let (warned, waiting_since, retry_at) =
            self.pending.get(&name).map_or((false, None, None), |p| {
                (p.warned, p.waiting_since, p.retry_at)
            });
        let node = PendingNode {
            uid,
            fence,
            labels,
            warned,
            waiting_since,
            retry_at,
        };
        let seen_uid = node.uid.clone();
        self.pending.insert(name.clone(), node);
        // Another object of the name ends the old one's leaks; an empty one with the same UID
        // ends none (the write may still be on its way).
        let seen = NodeSeen::Object {
            uid: seen_uid.as_deref(),
            cidrs: &[],
        };
        self.settle_leaks(&name, seen, cx);
        if cx.core.synced() {
            self.try_allocate(&name, cx);
        }
    }

    /// The node `name` is gone: the object `uid` if known, else whichever.
    pub(super) fn on_node_gone(&mut self, name: &str, uid: Option<&str>, cx: &mut Around<'_>) {
        if self
            .pending
            .get(name)
            .is_some_and(|p| uid.is_none() || p.uid.is_none() || p.uid.as_deref() == uid)
        {
            self.pending.remove(name);
        }
        cx.statuses.forget_node(name);
        self.invalid_reported.remove(name);
        let freed = cx.core.ipam_mut().node_gone(name, uid);
        if !freed.is_empty() {
            debug!(node = %name, ?freed, "node gone: blocks released");
            self.freed(&freed, cx);
        }
        self.settle_leaks(name, NodeSeen::Deleted { uid }, cx);
    }

    /// Leaks of `name` that what was just seen proves can no longer land end (the rule is in
    /// `ipam`'s module doc): their config no longer waits for them, and their blocks are free
    /// unless the node holds them now.
    pub(super) fn settle_leaks(&mut self, name: &str, seen: NodeSeen<'_>, cx: &mut Around<'_>) {
        let ended = cx.core.ipam_mut().settle_leaks(name, seen);
        if ended.is_empty() {
            return;
        }
        info!(node = %name, ?ended, "leaked blocks settled: the write can no longer land");
        cx.core
            .metric(Metric::Leaked(cx.core.ipam().leaked_blocks()));
        cx.touch(&ended);
        let freed: Vec<IpNet> = ended
            .into_iter()
            .filter(|c| !cx.core.ipam().is_held(c))
            .collect();
        self.freed(&freed, cx);
    }

    /// Blocks are free again: counted, and the nodes that could take them tried again.
    pub(super) fn freed(&mut self, cidrs: &[IpNet], cx: &mut Around<'_>) {
        for c in cidrs {
            let range = cx
                .core
                .ipam()
                .owner_of(c)
                .and_then(|o| cx.core.ipam().config_range(o, c));
            if let Some(range) = range {
                cx.core.metric(Metric::Released(range));
            }
        }
        cx.touch(cidrs);
        cx.statuses.unmanaged_moved();
        self.retry_pending_near(cidrs, cx);
    }

    /// Tries again the pending nodes that a config whose range holds one of `cidrs` serves:
    /// capacity appeared there and nowhere else.
    fn retry_pending_near(&mut self, cidrs: &[IpNet], cx: &mut Around<'_>) {
        let configs: BTreeSet<String> = cidrs
            .iter()
            .flat_map(|c| cx.core.ipam().configs_touching(c))
            .collect();
        self.retry_pending_for(&configs, cx);
    }

    /// Tries again the pending nodes one of `configs` selects: an event that changed only
    /// those costs pending × |configs| selector checks, not pending × every config.
    pub(super) fn retry_pending_for(&mut self, configs: &BTreeSet<String>, cx: &mut Around<'_>) {
        if !cx.core.synced() || configs.is_empty() {
            return;
        }
        let known: &Configs = cx.configs;
        let selectors: Vec<Option<&NodeSelector>> =
            configs.iter().filter_map(|c| known.selector(c)).collect();
        let names: Vec<String> = self
            .waiting()
            .filter(|node| {
                selectors
                    .iter()
                    .any(|s| selection::match_score(*s, *node).is_some())
            })
            .map(|node| node.name.to_string())
            .collect();
        for name in names {
            self.try_allocate(&name, cx);
        }
    }

    /// Tries again the pending nodes `pool` would take: it stopped growing, and nodes that
    /// waited for it without a warning get one now.
    pub(super) fn retry_pending_of_pool(&mut self, pool: &str, cx: &mut Around<'_>) {
        let names: Vec<String> = self
            .waiting()
            .filter(|node| cx.pools.takes(pool, *node))
            .map(|node| node.name.to_string())
            .collect();
        for n in names {
            self.try_allocate(&n, cx);
        }
    }

    pub(super) fn try_allocate(&mut self, name: &str, cx: &mut Around<'_>) {
        let Some(p) = self.pending.get(name) else {
            return;
        };
        if p.retry_at.is_some_and(|at| at > cx.core.mono()) {
            return;
        }
        let (uid, fence, labels) = (p.uid.clone(), p.fence.clone(), p.labels.clone());
        match cx.core.ipam_mut().allocate(name, uid.as_deref(), &labels) {
            Ok(a) => {
                self.pending.remove(name);
                cx.pools
                    .block_handed_out(&a.config, cx.configs, cx.core.mono());
                debug!(node = %name, config = %a.config, cidrs = ?a.cidrs, "allocated");
                for c in &a.cidrs {
                    if let Some(range) = cx.core.ipam().config_range(&a.config, c) {
                        cx.core.metric(Metric::Allocated(range));
                    }
                }
                cx.touch(&a.cidrs);
                cx.core.push(Effect::Write(WriteJob {
                    node: name.to_string(),
                    uid,
                    fence,
                    labels,
                    config: a.config,
                    cidrs: a.cidrs,
                    ticket: a.ticket,
                    attempt: 0,
                    rejections: 0,
                    was_ambiguous: false,
                }));
            }
            Err(AllocateError::AlreadyHolds) => {
                // The previous record resolves first (its write outcome); then we come back.
            }
            Err(e) => {
                let growing = cx.pools.may_grow(name, &labels);
                self.not_allocated(name, uid.as_deref(), &e, growing, cx);
            }
        }
    }

    /// A node that got no block is warned once, unless it only waits behind gates that
    /// usually open within moments, for a pool that is growing (`growing`), or for the first
    /// config (a first install applies the controller and its configs together): then only
    /// once it has waited `GATE_GRACE`.
    fn not_allocated(
        &mut self,
        name: &str,
        uid: Option<&str>,
        e: &AllocateError,
        growing: bool,
        cx: &mut Around<'_>,
    ) {
        let now = cx.core.mono();
        let first_config_due = cx.configs.is_empty() && *e == AllocateError::NoMatchingConfig;
        let Some(p) = self.pending.get_mut(name) else {
            return;
        };
        if growing || first_config_due || matches!(e, AllocateError::Waiting { .. }) {
            let since = *p.waiting_since.get_or_insert(now);
            if now.saturating_sub(since) < GATE_GRACE {
                debug!(node = %name, reason = %e, "node waits behind a gate");
                return;
            }
        } else {
            p.waiting_since = None;
        }
        if std::mem::replace(&mut p.warned, true) {
            return;
        }
        info!(node = %name, reason = %e, "no block available; node stays pending");
        let message = format!("Node {name} has no podCIDR yet: {e}");
        let note = Note::node(name, uid, true, effects::CIDR_NOT_AVAILABLE, message);
        cx.core.note(note);
    }

    /// Nodes that have waited behind a gate for `GATE_GRACE` are tried again, to warn them.
    pub(super) fn warn_long_waits(&mut self, cx: &mut Around<'_>) {
        let now = cx.core.mono();
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.warned)
            .filter(|(_, p)| {
                p.waiting_since
                    .is_some_and(|s| now.saturating_sub(s) >= GATE_GRACE)
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            self.try_allocate(&name, cx);
        }
    }

    /// Tries every pending node again: capacity may have appeared.
    pub(super) fn retry_pending(&mut self, cx: &mut Around<'_>) {
        let names: Vec<String> = self.pending.keys().cloned().collect();
        for name in names {
            self.try_allocate(&name, cx);
        }
    }

    /// Nodes whose writes we gave up on are tried again, from scratch, once their time comes.
    pub(super) fn wake_parked(&mut self, cx: &mut Around<'_>) {
        if !cx.core.synced() {
            return;
        }
        let now = cx.core.mono();
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.retry_at.is_some_and(|at| at <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            if let Some(p) = self.pending.get_mut(&name) {
                p.retry_at = None;
            }
            self.try_allocate(&name, cx);
        }
    }

    /// The node of a write we stopped waits again (warned and parked until `retry_at` if
    /// given), unless a newer object of the same name already waits in its place (the UID
    /// precondition keeps the old one's writes off it).
    pub(super) fn repend(&mut self, job: WriteJob, retry_at: Option<Duration>) {
        let node = PendingNode {
            uid: job.uid,
            fence: job.fence,
            labels: job.labels,
            warned: retry_at.is_some(),
            waiting_since: None,
            retry_at,
        };
        let name = job.node;
        let newer = self
            .pending
            .get(&name)
            .is_some_and(|p| p.uid.is_some() && p.uid != node.uid);
        if !newer {
            self.pending.insert(name, node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::node;

    fn job(node: &str, uid: &str) -> WriteJob {
        WriteJob {
            node: node.into(),
            uid: Some(uid.into()),
            fence: Fence::default(),
            labels: BTreeMap::new(),
            config: "c".into(),
            cidrs: Vec::new(),
            ticket: 1,
            attempt: 0,
            rejections: 0,
            was_ambiguous: false,
        }
    }

    fn notes(core: &mut Core) -> usize {
        core.take()
            .iter()
            .filter(|e| matches!(e, Effect::Note(_)))
            .count()
    }

    #[test]
    fn before_the_first_config_a_node_waits_without_a_warning_until_the_grace_ends() {
        let mut world = World::synced();
        let mut nodes = Nodes::default();
        nodes.on_node(node("a", "u-a", &[], &[]), &mut world.around());
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes.uid("a"), Some(&"u-a".to_string()));
        assert_eq!(
            notes(&mut world.core),
            0,
            "a first install applies its configs next"
        );
        world.core.begin(super::super::Now {
            mono: GATE_GRACE,
            wall_seconds: 0,
        });
        nodes.warn_long_waits(&mut world.around());
        assert_eq!(notes(&mut world.core), 1);
        nodes.warn_long_waits(&mut world.around());
        assert_eq!(notes(&mut world.core), 0, "warned once");
        nodes.on_node_gone("a", Some("u-other"), &mut world.around());
        assert!(nodes.is_pending("a"), "another object's deletion");
        nodes.on_node_gone("a", Some("u-a"), &mut world.around());
        assert_eq!(nodes.len(), 0);
    }

    #[test]
    fn a_stopped_write_waits_again_unless_a_newer_object_waits_in_its_place() {
        let mut world = World::synced();
        let mut nodes = Nodes::default();
        nodes.on_node(node("a", "u-new", &[], &[]), &mut world.around());
        nodes.repend(job("a", "u-old"), None);
        assert_eq!(nodes.uid("a"), Some(&"u-new".to_string()));
        nodes.repend(job("b", "u-b"), Some(Duration::from_secs(60)));
        assert!(nodes.is_pending("b"));
        let waiting: Vec<&str> = nodes.waiting().map(|n| n.name).collect();
        assert_eq!(waiting, ["a", "b"]);
    }
}
