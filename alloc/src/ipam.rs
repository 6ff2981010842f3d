//! The cluster's allocation state: every config's block sets, every occupied CIDR and who holds
//! it, and the decisions made on them (adopt, allocate, confirm, release, leak). Pure: no client.
//!
//! Safety rests on one rule: every CIDR that a node, a Service range or a leak holds is occupied
//! in *every* config set whose range it overlaps. A set therefore never hands out a block that
//! overlaps anything held, whichever config the holder came from, and configs that overlap each
//! other cannot produce a duplicate either.
//!
//! A leak is a write whose outcome cannot be known: it may still land. Until it can no longer
//! land, its blocks stay occupied and it holds their config exactly as a node being written
//! does (drain, our finalizer, the published pod network, a pool's retirement all wait for it;
//! see [`ConfigFacts::held`]). A write lands at most once, and carries the Node's UID as a
//! precondition; podCIDRs are immutable once set. So a leak ends when:
//! - the node shows the leaked blocks: the write landed, and the node holds them now;
//! - the object it was written to (by UID) shows other podCIDRs, is deleted (its delete event,
//!   or a 404 on a fresh GET), or is replaced by another object of the same name;
//! - or the state is rebuilt (a new leader lists the Nodes: what landed by then is seen).
//!
//! An empty node with the same UID ends nothing: the write may still be on its way. A leak
//! without a UID (a write sent without the precondition) may land on any object of the name,
//! so only the first and the last end it.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeSelector;
/// Overlap as the webhook decides it: one implementation, in `nodeipam_crd::range`. Kept under
/// this name because the simulator's invariants call it so.
pub use nodeipam_crd::range::overlaps as nets_overlap;
use nodeipam_crd::range::{FamilyRange, blocks_covered};

use crate::cidrset::CidrSet;
use crate::podnetwork::{ConfigRanges, PodNetwork};
use crate::selection::{self, Candidate, NodeView};

/// What the state needs to know about one NodeIPAMConfig, prepared by the caller.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigInput {
    pub name: String,
    /// Seconds since the epoch; the older config wins an overlap, then the smaller name.
    pub created: i64,
    pub ipv4: Option<(IpNet, u8)>,
    pub ipv6: Option<(IpNet, u8)>,
    pub selector: Option<NodeSelector>,
    pub enabled: bool,
    /// A pool's child created disabled, awaiting its enable by its pool (it carries
    /// [`crate::pool::AWAITING_ENABLE`] and is Disabled): it serves nothing yet, but it is no
    /// stopped config either: not Drained, and its ranges are published ahead, like a carve's.
    pub awaiting: bool,
    pub deleting: bool,
    /// Why the spec is unusable, when it is (it bypassed or predates the CRD's rules).
    pub invalid: Option<String>,
    /// Why allocation must wait although the spec allows it (our finalizer is not on the
    /// object yet, or the pod network that includes it is not published yet).
    pub gate: Option<String>,
    /// Our finalizer is not on the object yet: it may vanish at any moment, so it takes no
    /// block off a younger config's count (which would then drain too early).
    pub provisional: bool,
    /// The NodeIPAMPool it was carved from (its pool label), if any: selection fills a pool's
    /// children lowest first.
    pub pool: Option<String>,
}

impl ConfigInput {
    fn families(&self) -> impl Iterator<Item = (IpNet, u8)> + '_ {
        self.ipv4.iter().chain(self.ipv6.iter()).copied()
    }

    fn overlap_order(&self) -> (i64, &str) {
        (self.created, &self.name)
    }
}

#[derive(Clone)]
struct ConfigState {
    input: ConfigInput,
    v4: Option<CidrSet>,
    v6: Option<CidrSet>,
    /// Set when an older config overlaps this one: it then allocates nothing.
    overlap: Option<String>,
}

impl ConfigState {
    fn sets(&self) -> impl Iterator<Item = &CidrSet> {
        self.v4.iter().chain(self.v6.iter())
    }

    fn sets_mut(&mut self) -> impl Iterator<Item = &mut CidrSet> {
        self.v4.iter_mut().chain(self.v6.iter_mut())
    }

    fn set_for(&self, cidr: &IpNet) -> Option<&CidrSet> {
        match cidr {
            IpNet::V4(_) => self.v4.as_ref(),
            IpNet::V6(_) => self.v6.as_ref(),
        }
    }

    fn set_for_mut(&mut self, cidr: &IpNet) -> Option<&mut CidrSet> {
        match cidr {
            IpNet::V4(_) => self.v4.as_mut(),
            IpNet::V6(_) => self.v6.as_mut(),
        }
    }

    /// Accepting new allocations, ignoring capacity.
    fn accepting(&self) -> bool {
        self.usable() && self.input.gate.is_none()
    }

    /// Would hand out a block but for its gate.
    fn held_back(&self) -> bool {
        self.usable() && self.input.gate.is_some() && self.free_blocks() > 0
    }

    /// Enabled, valid, alive and sized; gate and capacity aside.
    fn usable(&self) -> bool {
        self.input.enabled
            && !self.input.deleting
            && self.input.invalid.is_none()
            && self.overlap.is_none()
            && self.v4.is_some() == self.input.ipv4.is_some()
            && self.v6.is_some() == self.input.ipv6.is_some()
            && (self.v4.is_some() || self.v6.is_some())
    }

    fn free_blocks(&self) -> u64 {
        self.sets().map(CidrSet::free).min().unwrap_or(0)
    }
}

/// Who holds an occupied CIDR.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    Node(String),
    /// A Service CIDR, by its source (a ServiceCIDR object name, or the flag).
    Service(String),
    /// Blocks a write to this node may or may not have landed with; kept until that write can
    /// no longer land (see the module doc).
    Leaked(String),
}

/// Whether a node's blocks are confirmed on the Node object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Read from the Node's `spec.podCIDRs`.
    Held,
    /// Chosen by us; the write has not been confirmed yet.
    Writing { ticket: u64, node_deleted: bool },
}

/// The blocks one node holds, remembered by CIDR (never by labels, which may change).
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRecord {
    pub uid: Option<String>,
    pub cidrs: Vec<IpNet>,
    pub phase: Phase,
}

/// A write whose outcome is unknown: the object it was sent to and its blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct Leak {
    /// The UID precondition it carried, if any.
    pub uid: Option<String>,
    pub cidrs: Vec<IpNet>,
}

/// What was just learned of a node, which may end its leaks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NodeSeen<'a> {
    /// An object of the name, with its UID and its podCIDRs (none yet, if empty).
    Object {
        uid: Option<&'a str>,
        cidrs: &'a [IpNet],
    },
    /// The object with this UID was deleted.
    Deleted { uid: Option<&'a str> },
    /// No object of the name exists (a 404 on a fresh GET).
    Absent,
}

/// A decision to give `cidrs` (IPv4 first) from `config` to a node; confirm or abandon it with
/// `ticket` once the write's outcome is known.
#[derive(Clone, Debug, PartialEq)]
pub struct Allocation {
    pub config: String,
    pub cidrs: Vec<IpNet>,
    pub ticket: u64,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum AllocateError {
    #[error("no NodeIPAMConfig selects this node")]
    NoMatchingConfig,
    #[error("no matching NodeIPAMConfig has a free block (considered: {considered})")]
    NoCapacity { considered: String },
    /// A matching config has free blocks but holds them back for now (our finalizer is not on
    /// it yet, consumers do not know its ranges yet): the node waits, nothing is wrong yet.
    #[error("waiting for {waiting}")]
    Waiting { waiting: String },
    #[error("the node already holds blocks")]
    AlreadyHolds,
}

/// What adopting a node's existing podCIDRs found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Adoption {
    /// podCIDRs that lie in no config (counted as unmanaged, never changed).
    pub unmanaged: Vec<IpNet>,
    /// Other nodes whose podCIDRs overlap this node's, with the overlapping pair.
    pub conflicts: Vec<(String, IpNet, IpNet)>,
    /// Blocks we had chosen for this node that turned out not to be its own.
    pub released: Vec<IpNet>,
}

/// Counts and facts for one config's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigFacts {
    pub ipv4: Option<FamilyFacts>,
    pub ipv6: Option<FamilyFacts>,
    /// Nodes holding a block of the config's, their write seen to land: one that overlaps
    /// its ranges and lies in no older config's range (see `config_facts`).
    pub nodes: u64,
    /// A few of those node names, sorted, for messages.
    pub sample_nodes: Vec<String>,
    /// Nodes whose block is still being written: not counted in `nodes` nor in a family's
    /// `allocated` (they are not served yet), but the finalizer must stay for them.
    pub writing: u64,
    /// Nodes with a leaked write into the config's blocks (its outcome unknown: it may still
    /// land), and a few of their names, sorted.
    pub leaked: u64,
    pub sample_leaked: Vec<String>,
    pub accepting: bool,
    pub enabled: bool,
    /// See [`ConfigInput::awaiting`].
    pub awaiting: bool,
    pub deleting: bool,
    pub invalid: Option<String>,
    pub overlap: Option<String>,
    pub gate: Option<String>,
}

impl ConfigFacts {
    /// Whether anything holds a block of the config: a node, a write on its way, or a leak
    /// (a write whose outcome is unknown, which may still land). Drained, the removal of our
    /// finalizer, leaving the published pod network and a pool's retirement of a child all
    /// wait on this, and only on this.
    pub fn held(&self) -> bool {
        self.nodes > 0 || self.writing > 0 || self.leaked > 0
    }

    /// It hands out no block and is not about to: being deleted, or disabled (but for a
    /// pool's child awaiting its enable, which is about to). Drained once nothing is held.
    pub fn stopped(&self) -> bool {
        self.deleting || (!self.enabled && !self.awaiting)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyFacts {
    pub capacity: u64,
    /// The config's blocks in the range that nodes (or leaks) hold: by the same rule as
    /// `ConfigFacts::nodes`, so a block inside an older config's range is not counted.
    pub allocated: u64,
    /// Blocks in the range that nodes (or leaks) hold, whichever config they belong to: what
    /// the range's usage gauge shows (two configs with the same range show the same usage).
    pub occupied: u64,
    /// Blocks the set can still hand out (Service CIDRs and holders excluded).
    pub free: u64,
}

/// The allocation state. One instance lives in the leader's allocation loop and is rebuilt
/// from the API whenever leadership is gained.
#[derive(Clone, Default)]
pub struct Ipam {
    configs: BTreeMap<String, ConfigState>,
    holders: BTreeMap<IpNet, Vec<Holder>>,
    nodes: HashMap<String, NodeRecord>,
    /// How many of `nodes` are [`Phase::Writing`]: podCIDR writes not yet seen to land, so
    /// nodes still waiting for their podCIDRs (kept as the records change, never counted).
    writing: usize,
    /// Leaked writes, by node name (a node may leak again after new blocks were chosen).
    leaks: BTreeMap<String, Vec<Leak>>,
    services: BTreeMap<String, Vec<IpNet>>,
    next_ticket: u64,
}

const SAMPLE_NODES: usize = 5;

impl Ipam {
    pub fn new() -> Self {
        Self::default()
    }

    // ----- configs -----

    /// Adds or updates a config. A change of ranges rebuilds its sets from the holders.
    pub fn upsert_config(&mut self, input: ConfigInput) {
        let same_ranges = self.configs.get(&input.name).is_some_and(|c| {
            c.input.ipv4 == input.ipv4
                && c.input.ipv6 == input.ipv6
                && c.input.invalid == input.invalid
        });
        if same_ranges {
            if let Some(state) = self.configs.get_mut(&input.name) {
                state.input = input;
            }
        } else {
            let state = self.build_config(input);
            self.configs.insert(state.input.name.clone(), state);
        }
        self.recompute_overlaps();
    }

    pub fn remove_config(&mut self, name: &str) {
        self.configs.remove(name);
        self.recompute_overlaps();
    }

    /// The gate the config was last given, if the config is known.
    pub fn config_gate(&self, name: &str) -> Option<Option<&str>> {
        self.configs.get(name).map(|c| c.input.gate.as_deref())
    }

    pub fn config_names(&self) -> impl Iterator<Item = &str> {
        self.configs.keys().map(String::as_str)
    }

    fn build_config(&self, input: ConfigInput) -> ConfigState {
        let mut state = ConfigState {
            v4: None,
            v6: None,
            overlap: None,
            input,
        };
        if state.input.invalid.is_some() {
            return state;
        }
        let mut problems = Vec::new();
        for (range, mask) in state.input.families().collect::<Vec<_>>() {
            match CidrSet::new(range, mask) {
                Ok(mut set) => {
                    for (held, _) in overlapping(&self.holders, range) {
                        // Every holder overlapping the range must be occupied; a failure here
                        // would mean a block could be handed out twice, so the set is dropped.
                        if let Err(e) = set.occupy(*held) {
                            problems.push(format!("occupying {held} in {range}: {e}"));
                        }
                    }
                    match range {
                        IpNet::V4(_) => state.v4 = Some(set),
                        IpNet::V6(_) => state.v6 = Some(set),
                    }
                }
                Err(e) => problems.push(format!("{range} with per-node mask {mask}: {e}")),
            }
        }
        if !problems.is_empty() {
            state.v4 = None;
            state.v6 = None;
            state.input.invalid = Some(problems.join("; "));
        }
        state
    }

    fn recompute_overlaps(&mut self) {
        let inputs: Vec<(String, (i64, String), Vec<IpNet>)> = self
            .configs
            .values()
            .filter(|c| c.input.invalid.is_none())
            .map(|c| {
                let (t, n) = c.input.overlap_order();
                (
                    c.input.name.clone(),
                    (t, n.to_string()),
                    c.input.families().map(|(r, _)| r).collect(),
                )
            })
            .collect();
        for state in self.configs.values_mut() {
            state.overlap = None;
        }
        for (name, order, ranges) in &inputs {
            let mut found = Vec::new();
            for (other, other_order, other_ranges) in &inputs {
                if other == name || other_order > order {
                    continue;
                }
                for ours in ranges {
                    for theirs in other_ranges.iter().filter(|t| nets_overlap(ours, t)) {
                        found.push(format!(
                            "{ours} overlaps {theirs} of older NodeIPAMConfig {other}"
                        ));
                    }
                }
            }
            if !found.is_empty()
                && let Some(state) = self.configs.get_mut(name)
            {
                state.overlap = Some(found.join("; "));
            }
        }
    }

    // ----- Service CIDRs -----

    /// Replaces the Service CIDRs known under `source`. Blocks overlapping them are never
    /// handed out.
    pub fn set_service_cidrs(&mut self, source: &str, cidrs: Vec<IpNet>) {
        let mut cidrs: Vec<IpNet> = cidrs.into_iter().map(|c| c.trunc()).collect();
        cidrs.sort();
        cidrs.dedup();
        let old = self.services.remove(source).unwrap_or_default();
        let holder = Holder::Service(source.to_string());
        // Only what changed: a CIDR both old and new must never lose its holder (an update of
        // the same ServiceCIDR re-sends the same ranges, and a holder is one entry per source).
        for c in old.iter().filter(|c| !cidrs.contains(c)) {
            self.remove_holder(*c, &holder);
        }
        for c in cidrs.iter().filter(|c| !old.contains(c)) {
            self.add_holder(*c, holder.clone());
        }
        if !cidrs.is_empty() {
            self.services.insert(source.to_string(), cidrs);
        }
    }

    // ----- nodes -----

    pub fn node(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.get(name)
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub fn node_names(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// Records the podCIDRs a Node object already carries (at start-up, on migration, or when
    /// a write is confirmed by the watch). podCIDRs are immutable once set, so whatever we had
    /// chosen for this node that differs can never land and is released.
    pub fn observe_node(&mut self, name: &str, uid: Option<&str>, cidrs: &[IpNet]) -> Adoption {
        let cidrs: Vec<IpNet> = cidrs.iter().map(|c| c.trunc()).collect();
        let mut adoption = Adoption::default();
        if let Some(rec) = self.nodes.get_mut(name)
            && rec.cidrs == cidrs
        {
            if matches!(rec.phase, Phase::Writing { .. }) {
                self.writing -= 1;
            }
            rec.phase = Phase::Held;
            if uid.is_some() {
                rec.uid = uid.map(str::to_string);
            }
            return adoption;
        }
        if let Some(old) = self.remove_node(name) {
            for c in &old.cidrs {
                self.remove_holder(*c, &Holder::Node(name.to_string()));
            }
            adoption.released = old.cidrs;
        }
        let holder = Holder::Node(name.to_string());
        for c in &cidrs {
            for (other_cidr, others) in overlapping(&self.holders, *c) {
                for other in others {
                    // A leaked block may sit on a node we cannot see yet: a conflict too.
                    if let Holder::Node(other) | Holder::Leaked(other) = other
                        && other != name
                    {
                        adoption.conflicts.push((other.clone(), *c, *other_cidr));
                    }
                }
            }
            if !self
                .configs
                .values()
                .any(|s| s.input.families().any(|(r, _)| nets_overlap(&r, c)))
            {
                adoption.unmanaged.push(*c);
            }
        }
        for c in &cidrs {
            self.add_holder(*c, holder.clone());
        }
        self.insert_node(
            name.to_string(),
            NodeRecord {
                uid: uid.map(str::to_string),
                cidrs,
                phase: Phase::Held,
            },
        );
        adoption
    }

    /// Picks the config for a node without podCIDRs and takes one block per family from it,
    /// atomically: if a later family fails, the earlier block goes back and the next config is
    /// tried. The blocks stay reserved for the node until [`Ipam::confirm`] or
    /// [`Ipam::abandon`].
    pub fn allocate(
        &mut self,
        name: &str,
        uid: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Result<Allocation, AllocateError> {
        if self.nodes.contains_key(name) {
            return Err(AllocateError::AlreadyHolds);
        }
        let usable: Vec<&ConfigState> = self.configs.values().filter(|c| c.accepting()).collect();
        let candidates: Vec<Candidate<'_>> = usable
            .iter()
            .map(|c| Candidate {
                name: &c.input.name,
                selector: c.input.selector.as_ref(),
                free_blocks: c.free_blocks(),
                ipv4: c.input.ipv4,
                ipv6: c.input.ipv6,
                pool: c.input.pool.as_deref(),
            })
            .collect();
        let node = NodeView { name, labels };
        let ranked: Vec<String> = selection::rank(&candidates, node)
            .into_iter()
            .map(|i| candidates[i].name.to_string())
            .collect();
        let any_match = self
            .configs
            .values()
            .any(|c| selection::match_score(c.input.selector.as_ref(), node).is_some());
        // A config only a gate keeps shut (our finalizer, the publication) that matches the
        // node better than an open one holds it: the selector says where the node belongs, and
        // a block taken from a catch-all meanwhile would stay with the node for its lifetime.
        let held = self
            .configs
            .values()
            .filter(|c| c.held_back())
            .filter_map(|c| selection::match_score(c.input.selector.as_ref(), node))
            .max();
        for config in &ranked {
            let score = self
                .configs
                .get(config)
                .and_then(|c| selection::match_score(c.input.selector.as_ref(), node));
            if held > score {
                break;
            }
            if let Some(cidrs) = self.take_blocks(config) {
                for c in &cidrs {
                    self.add_holder(*c, Holder::Node(name.to_string()));
                }
                self.next_ticket += 1;
                let ticket = self.next_ticket;
                self.insert_node(
                    name.to_string(),
                    NodeRecord {
                        uid: uid.map(str::to_string),
                        cidrs: cidrs.clone(),
                        phase: Phase::Writing {
                            ticket,
                            node_deleted: false,
                        },
                    },
                );
                return Ok(Allocation {
                    config: config.clone(),
                    cidrs,
                    ticket,
                });
            }
        }
        if ranked.is_empty() && !any_match {
            return Err(AllocateError::NoMatchingConfig);
        }
        let waiting: Vec<String> = self
            .configs
            .values()
            .filter(|c| {
                c.held_back() && selection::match_score(c.input.selector.as_ref(), node).is_some()
            })
            .map(|c| format!("{} ({})", c.input.name, unavailable_reason(c)))
            .collect();
        if !waiting.is_empty() {
            return Err(AllocateError::Waiting {
                waiting: waiting.join(", "),
            });
        }
        let considered: Vec<String> = self
            .configs
            .values()
            .filter(|c| selection::match_score(c.input.selector.as_ref(), node).is_some())
            .map(|c| format!("{} ({})", c.input.name, unavailable_reason(c)))
            .collect();
        Err(AllocateError::NoCapacity {
            considered: considered.join(", "),
        })
    }

    /// One block per family of `config`, IPv4 first, or nothing.
    fn take_blocks(&mut self, config: &str) -> Option<Vec<IpNet>> {
        let state = self.configs.get_mut(config)?;
        let mut taken = Vec::new();
        for set in state.sets_mut() {
            match set.allocate() {
                Ok(block) => taken.push(block),
                Err(_) => break,
            }
        }
        if taken.len() == state.sets().count() && !taken.is_empty() {
            return Some(taken);
        }
        // Give back what the earlier family took; nothing else held it (it was free).
        for block in taken {
            if let Some(set) = state.set_for_mut(&block) {
                let _ = set.release(block);
            }
        }
        None
    }

    /// The write for `ticket` landed and the Node (with `uid`) now carries the blocks.
    /// Returns false when the ticket is stale (the record changed meanwhile).
    pub fn confirm(&mut self, name: &str, ticket: u64, uid: Option<&str>) -> bool {
        let Some(rec) = self.nodes.get_mut(name) else {
            return false;
        };
        let Phase::Writing {
            ticket: t,
            node_deleted,
        } = rec.phase
        else {
            return false;
        };
        if t != ticket {
            return false;
        }
        let old_uid = rec.uid.clone();
        if node_deleted && (uid.is_none() || uid.map(str::to_string) == old_uid) {
            // Landed on the object that has since been deleted: the blocks are free.
            self.release_node(name);
            return true;
        }
        rec.phase = Phase::Held;
        self.writing -= 1;
        if uid.is_some() {
            rec.uid = uid.map(str::to_string);
        }
        true
    }

    /// The write for `ticket` definitely failed: the blocks never reached the node.
    pub fn abandon(&mut self, name: &str, ticket: u64) -> Vec<IpNet> {
        match self.nodes.get(name).map(|r| r.phase) {
            Some(Phase::Writing { ticket: t, .. }) if t == ticket => self.release_node(name),
            _ => Vec::new(),
        }
    }

    /// The write for `ticket` may or may not have landed and the node can't tell us: keep the
    /// blocks occupied (leak) rather than risk handing them out twice, until the write can no
    /// longer land ([`Ipam::settle_leaks`]).
    pub fn leak(&mut self, name: &str, ticket: u64) -> Vec<IpNet> {
        let Some(Phase::Writing { ticket: t, .. }) = self.nodes.get(name).map(|r| r.phase) else {
            return Vec::new();
        };
        if t != ticket {
            return Vec::new();
        }
        let Some(rec) = self.remove_node(name) else {
            return Vec::new();
        };
        for c in &rec.cidrs {
            self.add_holder(*c, Holder::Leaked(name.to_string()));
            self.remove_holder(*c, &Holder::Node(name.to_string()));
        }
        self.leaks.entry(name.to_string()).or_default().push(Leak {
            uid: rec.uid,
            cidrs: rec.cidrs.clone(),
        });
        rec.cidrs
    }

    /// Ends the leaks of node `name` that what was just seen proves can no longer land (the
    /// rule is in the module doc). Returns their blocks; those nobody else holds are free.
    pub fn settle_leaks(&mut self, name: &str, seen: NodeSeen<'_>) -> Vec<IpNet> {
        let Some(leaks) = self.leaks.get_mut(name) else {
            return Vec::new();
        };
        let over = |leak: &Leak| match seen {
            NodeSeen::Object { uid, cidrs } => {
                let landed = !cidrs.is_empty() && leak.cidrs == cidrs;
                let same = uid.is_none() || leak.uid.as_deref() == uid;
                // Seen landed: a write lands once. Otherwise only the object it was sent to
                // can receive it: other podCIDRs on that object (immutable), or another object.
                landed || (leak.uid.is_some() && (!same || !cidrs.is_empty()))
            }
            NodeSeen::Deleted { uid } => leak.uid.is_some() && leak.uid.as_deref() == uid,
            NodeSeen::Absent => leak.uid.is_some(),
        };
        let mut ended = Vec::new();
        leaks.retain(|leak| {
            if over(leak) {
                ended.extend(leak.cidrs.iter().copied());
                false
            } else {
                true
            }
        });
        let kept: Vec<IpNet> = leaks.iter().flat_map(|l| l.cidrs.iter().copied()).collect();
        if leaks.is_empty() {
            self.leaks.remove(name);
        }
        let holder = Holder::Leaked(name.to_string());
        for c in ended.iter().filter(|c| !kept.contains(c)) {
            self.remove_holder(*c, &holder);
        }
        ended
    }

    /// How many blocks leaks keep occupied now.
    pub fn leaked_blocks(&self) -> u64 {
        self.leaks
            .values()
            .flatten()
            .map(|l| l.cidrs.len() as u64)
            .sum()
    }

    /// Nodes with leaks, with the UID of their first: what a relist that lacks them asks about.
    pub fn leaked_nodes(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.leaks
            .iter()
            .map(|(n, l)| (n.as_str(), l.first().and_then(|l| l.uid.as_deref())))
    }

    /// Whether anything (a node, a Service range, a leak) holds exactly `cidr`.
    pub fn is_held(&self, cidr: &IpNet) -> bool {
        self.holders.contains_key(&cidr.trunc())
    }

    /// The Node object `uid` is really gone (a delete event or a 404 on a fresh GET).
    /// Returns the blocks freed; a write still in flight decides on its own outcome.
    pub fn node_gone(&mut self, name: &str, uid: Option<&str>) -> Vec<IpNet> {
        let Some(rec) = self.nodes.get_mut(name) else {
            return Vec::new();
        };
        if uid.is_some() && rec.uid.is_some() && uid.map(str::to_string) != rec.uid {
            // A different object of the same name; the one we track is not the one deleted.
            return Vec::new();
        }
        match &mut rec.phase {
            Phase::Writing { node_deleted, .. } => {
                *node_deleted = true;
                Vec::new()
            }
            Phase::Held => self.release_node(name),
        }
    }

    fn release_node(&mut self, name: &str) -> Vec<IpNet> {
        let Some(rec) = self.remove_node(name) else {
            return Vec::new();
        };
        for c in &rec.cidrs {
            self.remove_holder(*c, &Holder::Node(name.to_string()));
        }
        rec.cidrs
    }

    /// How many podCIDR writes have not been seen to land: their nodes still wait.
    pub fn writing(&self) -> usize {
        self.writing
    }

    /// Every record goes in through here, so that `writing` stays true.
    fn insert_node(&mut self, name: String, rec: NodeRecord) {
        self.writing += usize::from(matches!(rec.phase, Phase::Writing { .. }));
        if let Some(old) = self.nodes.insert(name, rec) {
            self.writing -= usize::from(matches!(old.phase, Phase::Writing { .. }));
        }
    }

    /// ... and out through here.
    fn remove_node(&mut self, name: &str) -> Option<NodeRecord> {
        let rec = self.nodes.remove(name)?;
        self.writing -= usize::from(matches!(rec.phase, Phase::Writing { .. }));
        Some(rec)
    }

    // ----- holders -----

    fn add_holder(&mut self, cidr: IpNet, holder: Holder) {
        let cidr = cidr.trunc();
        for state in self.configs.values_mut() {
            if let Some(set) = state.set_for_mut(&cidr)
                && nets_overlap(&set.range(), &cidr)
            {
                // occupy only fails when the CIDR misses the range, which was just checked.
                let _ = set.occupy(cidr);
            }
        }
        let list = self.holders.entry(cidr).or_default();
        if !list.contains(&holder) {
            list.push(holder);
            list.sort();
        }
    }

    fn remove_holder(&mut self, cidr: IpNet, holder: &Holder) {
        let cidr = cidr.trunc();
        let Some(list) = self.holders.get_mut(&cidr) else {
            return;
        };
        list.retain(|h| h != holder);
        if !list.is_empty() {
            return;
        }
        self.holders.remove(&cidr);
        // Clear the bits, then put back every other holder that shares any of them: nested or
        // overlapping CIDRs (two nodes adopted with overlapping podCIDRs, a Service range, or
        // two small CIDRs inside one bigger block of another config) must stay occupied.
        let holders = &self.holders;
        for state in self.configs.values_mut() {
            for set in state.sets_mut() {
                let range = set.range();
                if !nets_overlap(&range, &cidr) {
                    continue;
                }
                // The bits cleared cover whole blocks, which may be larger than `cidr`.
                let span = if cidr.prefix_len() > set.per_node_mask_size() {
                    IpNet::new(cidr.network(), set.per_node_mask_size()).map_or(cidr, |n| n.trunc())
                } else {
                    cidr
                };
                let _ = set.release(cidr);
                for (other, _) in
                    overlapping(holders, span).filter(|(o, _)| nets_overlap(&range, o))
                {
                    let _ = set.occupy(*other);
                }
            }
        }
    }

    /// Every occupied CIDR with its holders, for invariant checks and the published ranges.
    pub fn holders(&self) -> impl Iterator<Item = (&IpNet, &[Holder])> {
        self.holders.iter().map(|(c, h)| (c, h.as_slice()))
    }

    /// Node-held CIDRs that overlap no config's range.
    pub fn unmanaged(&self) -> Vec<(IpNet, String)> {
        let mut out = Vec::new();
        for (cidr, holders) in &self.holders {
            let managed = self
                .configs
                .values()
                .any(|s| s.input.families().any(|(r, _)| nets_overlap(&r, cidr)));
            if managed {
                continue;
            }
            for h in holders {
                if let Holder::Node(n) = h {
                    out.push((*cidr, n.clone()));
                }
            }
        }
        out
    }

    /// The pod network as this state has it: every config's ranges with their counts (one
    /// whose facts say drained leaves), and the unmanaged podCIDRs. What the leader publishes,
    /// and what `check` compares the published outputs with.
    pub fn network(&self) -> PodNetwork {
        let configs: Vec<ConfigRanges> = self
            .configs
            .iter()
            .filter_map(|(name, state)| {
                let facts = self.config_facts(name)?;
                let families = [
                    (state.input.ipv4, facts.ipv4),
                    (state.input.ipv6, facts.ipv6),
                ]
                .into_iter()
                .filter_map(|(range, f)| {
                    range.map(|(r, _)| {
                        (r, f.map_or(0, |f| f.allocated), f.map_or(0, |f| f.capacity))
                    })
                })
                .collect();
                let stopped = facts.stopped();
                Some(ConfigRanges {
                    name: name.clone(),
                    families,
                    nodes: facts.nodes,
                    deleting: facts.deleting,
                    enabled: facts.enabled,
                    drained: stopped && !facts.held(),
                })
            })
            .collect();
        PodNetwork::new(&configs, &self.unmanaged())
    }

    // ----- facts for status -----

    /// Counts for a config's status. It runs on every status tick while anything changes,
    /// over every node of the config, so it walks the holders once, looks each node up once,
    /// and allocates nothing per node: no name set, no clones, only the few sample names kept.
    pub fn config_facts(&self, name: &str) -> Option<ConfigFacts> {
        let state = self.configs.get(name)?;
        let mut nodes = 0u64;
        let mut writing = 0u64;
        let mut sample: Vec<&str> = Vec::with_capacity(SAMPLE_NODES + 1);
        // Leaks are rare: a plain set of names, so a node leaked in both families counts once.
        let mut leaked: Vec<&str> = Vec::new();
        let mut facts = ConfigFacts {
            accepting: state.accepting(),
            enabled: state.input.enabled,
            awaiting: state.input.awaiting,
            deleting: state.input.deleting,
            invalid: state.input.invalid.clone(),
            overlap: state.overlap.clone(),
            gate: state.input.gate.clone(),
            ..ConfigFacts::default()
        };
        // Which config a block belongs to: the oldest one whose range contains it (among
        // those with our finalizer). A block inside an older config's range is that config's,
        // never this one's, so the younger of two overlapping configs drains without waiting
        // for the older one's nodes; both `nodes` and `allocated` count by this one rule, so
        // they move together, and when the older config goes its blocks are this one's.
        let older = self.older_ranges(state);
        let ours = |cidr: &IpNet| !older.iter().any(|o| o.contains(cidr));
        let mut counted_range: Option<IpNet> = None;
        for (range, mask) in state.input.families() {
            let mut held = Vec::new();
            // Blocks in use whichever config they belong to: the range's usage.
            let mut occupied = Vec::new();
            for (cidr, holders) in overlapping(&self.holders, range) {
                let mut by_node_or_leak = false;
                // By a node whose write landed, or a leak (which may have landed).
                let mut allocated = false;
                let owned = ours(cidr);
                for h in holders {
                    match h {
                        Holder::Node(n) => {
                            by_node_or_leak = true;
                            if !owned {
                                continue;
                            }
                            // A node holds one podCIDR per family, so it shows up once per
                            // range; in the second family it was counted already if its
                            // record holds one of our blocks in the first.
                            let record = self.nodes.get(n);
                            let landed =
                                !matches!(record.map(|r| r.phase), Some(Phase::Writing { .. }));
                            allocated |= landed;
                            let counted = counted_range.is_some_and(|first| {
                                record.is_some_and(|r| {
                                    r.cidrs.iter().any(|c| nets_overlap(&first, c) && ours(c))
                                })
                            });
                            if counted {
                                continue;
                            }
                            if landed {
                                nodes += 1;
                            } else {
                                writing += 1;
                            }
                            offer_sample(&mut sample, n);
                        }
                        Holder::Leaked(n) => {
                            by_node_or_leak = true;
                            allocated = true;
                            if owned && let Err(at) = leaked.binary_search(&n.as_str()) {
                                leaked.insert(at, n);
                            }
                        }
                        Holder::Service(_) => {}
                    }
                }
                // Allocated counts the blocks `nodes` counts the holders of (and leaks), and
                // no others.
                if allocated && owned {
                    held.push(*cidr);
                }
                if by_node_or_leak {
                    occupied.push(*cidr);
                }
            }
            // Without a set (an invalid config) the status still shows the range's size; one
            // too large to count shows 0, as it always has.
            let capacity = state.set_for(&range).map_or_else(
                || {
                    let claimed = FamilyRange {
                        cidr: range,
                        per_node_mask_size: mask,
                    };
                    claimed.blocks().unwrap_or(0)
                },
                CidrSet::capacity,
            );
            let fam = FamilyFacts {
                capacity,
                allocated: blocks_covered(range, mask, &held),
                occupied: blocks_covered(range, mask, &occupied),
                free: state.set_for(&range).map_or(0, CidrSet::free),
            };
            match range {
                IpNet::V4(_) => facts.ipv4 = Some(fam),
                IpNet::V6(_) => facts.ipv6 = Some(fam),
            }
            counted_range.get_or_insert(range);
        }
        facts.nodes = nodes;
        facts.writing = writing;
        facts.leaked = leaked.len() as u64;
        facts.sample_leaked = leaked
            .into_iter()
            .take(SAMPLE_NODES)
            .map(str::to_string)
            .collect();
        facts.sample_nodes = sample.into_iter().map(str::to_string).collect();
        Some(facts)
    }

    /// The ranges of the configs older than `state` (in overlap order) that overlap one of its
    /// ranges: usually none, as the webhook refuses overlaps.
    fn older_ranges(&self, state: &ConfigState) -> Vec<IpNet> {
        let order = state.input.overlap_order();
        self.configs
            .values()
            .filter(|c| c.input.overlap_order() < order && !c.input.provisional)
            .flat_map(|c| c.input.families().map(|(r, _)| r))
            .filter(|r| {
                state
                    .input
                    .families()
                    .any(|(ours, _)| nets_overlap(r, &ours))
            })
            .collect()
    }

    /// Configs whose ranges overlap `cidr`: the ones whose facts change when it is held or freed.
    pub fn configs_touching(&self, cidr: &IpNet) -> Vec<String> {
        self.configs
            .values()
            .filter(|s| s.input.families().any(|(r, _)| nets_overlap(&r, cidr)))
            .map(|s| s.input.name.clone())
            .collect()
    }

    /// The config whose range contains `cidr`, oldest first: what the controller says holds it.
    pub fn owner_of(&self, cidr: &IpNet) -> Option<&str> {
        self.configs
            .values()
            .filter(|s| s.input.families().any(|(r, _)| r.contains(cidr)))
            .min_by(|a, b| a.input.overlap_order().cmp(&b.input.overlap_order()))
            .map(|s| s.input.name.as_str())
    }

    /// The range of `config` in the family of `cidr`.
    pub fn config_range(&self, config: &str, cidr: &IpNet) -> Option<IpNet> {
        let state = self.configs.get(config)?;
        match cidr {
            IpNet::V4(_) => state.input.ipv4.map(|(r, _)| r),
            IpNet::V6(_) => state.input.ipv6.map(|(r, _)| r),
        }
    }

    /// Names under which Service CIDRs are known.
    /// The Service range (with its source) that overlaps `cidr`, if any.
    pub fn service_range_over(&self, cidr: &IpNet) -> Option<(&str, IpNet)> {
        self.services.iter().find_map(|(source, ranges)| {
            let range = ranges.iter().find(|r| nets_overlap(r, cidr))?;
            Some((source.as_str(), *range))
        })
    }

    /// Every Service range, of every source.
    pub fn service_ranges(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.services.values().flatten().copied()
    }

    pub fn service_sources(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(String::as_str)
    }

    /// Approximate heap bytes of the sets, for metrics.
    pub fn memory_bytes(&self) -> usize {
        self.configs
            .values()
            .flat_map(|c| c.sets())
            .map(CidrSet::memory_bytes)
            .sum()
    }
}

fn unavailable_reason(c: &ConfigState) -> String {
    if let Some(why) = &c.input.invalid {
        return format!("invalid: {why}");
    }
    if c.input.deleting {
        return "terminating".into();
    }
    if !c.input.enabled {
        return "disabled".into();
    }
    if c.overlap.is_some() {
        return "overlaps an older config".into();
    }
    if let Some(why) = &c.input.gate {
        return why.clone();
    }
    if c.free_blocks() == 0 {
        return "exhausted".into();
    }
    "not usable".into()
}

/// Every key of `holders` that overlaps `net`: those that start inside it, and its supernets.
/// Keeps the `SAMPLE_NODES` smallest names seen, sorted.
fn offer_sample<'a>(sample: &mut Vec<&'a str>, name: &'a str) {
    if sample.len() == SAMPLE_NODES && sample.last().is_some_and(|last| name >= *last) {
        return;
    }
    let at = sample.partition_point(|s| *s < name);
    sample.insert(at, name);
    sample.truncate(SAMPLE_NODES);
}

fn overlapping<'a, V>(
    holders: &'a BTreeMap<IpNet, V>,
    net: IpNet,
) -> impl Iterator<Item = (&'a IpNet, &'a V)> + 'a {
    let net = net.trunc();
    let (lo, hi) = match net {
        IpNet::V4(n) => (
            IpNet::new(IpAddr::V4(n.network()), 0),
            IpNet::new(IpAddr::V4(n.broadcast()), 32),
        ),
        IpNet::V6(n) => (
            IpNet::new(IpAddr::V6(n.network()), 0),
            IpNet::new(IpAddr::V6(n.broadcast()), 128),
        ),
    };
    let inside = match (lo, hi) {
        (Ok(lo), Ok(hi)) => Some(holders.range(lo..=hi)),
        _ => None,
    };
    // Supernets start before `net` (or at its address with a shorter prefix, already found
    // above), so look each one up exactly.
    let supers = (0..net.prefix_len()).filter_map(move |len| {
        let sup = IpNet::new(net.network(), len).ok()?.trunc();
        if sup.network() == net.network() {
            return None;
        }
        holders.get_key_value(&sup)
    });
    inside.into_iter().flatten().chain(supers)
}

#[cfg(test)]
mod tests;
