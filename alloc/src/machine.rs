//! The allocation core as a state machine: `Machine::handle` takes one fact (a watch event, a
//! write's outcome, a re-read, a tick) with the time, and returns the effects (writes, config
//! jobs, the pod network to publish, events, metrics). It never awaits and never reads a
//! clock, so the same inputs always give the same effects: the simulator in the tests drives it
//! through event orders and faults no end-to-end test could reach.
//!
//! One machine owns the state of one leadership term; being its only owner is what makes the
//! controller a single writer.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube_core::{Resource, ResourceExt};
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMConfigStatus};
use tracing::info;

use super::effects::{
    ChildConfig, ConfigJob, CreateOutcome, DeleteOutcome, Note, WriteJob, WriteResult,
};
use super::ipam::{ConfigInput, Ipam};
use super::outcome::NodeNow;
use super::podnetwork::{ConfigMapRef, OutputKind, PodNetwork};
use super::pool::{PoolInput, PoolStatus};
use crate::node::IpamNode;
use configs::Configs;
pub use configs::config_input;
use core::Core;
use lists::{Lists, Source};
use nodes::{Around, Nodes};
use pools::Pools;
use publication::Publication;
use statuses::Statuses;
use writes::Writes;

/// How long a node may wait behind a config's gate (our finalizer, consumers learning the
/// range) or for a pool to carve before it is warned about: at start-up and in a burst every
/// node waits a moment, and a Warning must mean that something is wrong.
pub const GATE_GRACE: Duration = Duration::from_secs(30);

/// How often a config's status is written while only its counts move (blocks allocated,
/// nodes, how many still hold blocks): a status patch of a NodeIPAMConfig costs the API server
/// about three node patches (a CRD is validated and stored as JSON), and in a burst the counts
/// move at every tick. A flipped condition, a new generation or capacity go out at once.
pub const STATUS_COUNTS_EVERY: Duration = Duration::from_secs(1);

/// What a machine is told once, when it starts.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Service CIDRs from the `--service-cidr` flag, for clusters without ServiceCIDR objects.
    pub service_cidrs: Vec<IpNet>,
    /// Whether the API serves ServiceCIDR objects: then their list is awaited before allocating.
    pub service_cidr_api: bool,
    /// Whether NodeIPAMPools are watched: then their list is awaited too.
    pub pools: bool,
    /// How many refused writes of the same blocks before we give up on them.
    pub write_attempts: u32,
    /// How long a node whose write we gave up on waits before it is tried again from scratch.
    pub retry_rejected_after: Duration,
    /// The consumer outputs of the pod network; a range is allocated from only once every one
    /// of them holds it.
    pub outputs: Vec<(ConfigMapRef, OutputKind)>,
    /// Added to ip-masq-agent's `nonMasqueradeCIDRs`.
    pub extra_non_masquerade: Vec<IpNet>,
    /// A test fault: the machine panics when it sees a Node of this name.
    pub panic_on_node: Option<String>,
}

/// The time, as the driver's clocks tell it: monotonic since the machine started, and the wall
/// clock in whole seconds (what conditions carry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Now {
    pub mono: Duration,
    pub wall_seconds: i64,
}

/// One event of a watch: a (re)list is `ListStart`, one `Listed` per object, `ListDone`.
#[derive(Clone, Debug)]
pub enum Watch<T> {
    ListStart,
    Listed(T),
    ListDone,
    Applied(T),
    Deleted(T),
}

/// Every fact the world can tell the machine.
// Each input is moved once into `handle`; boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Input {
    Node(Watch<IpamNode>),
    Config(Watch<NodeIPAMConfig>),
    Service(Watch<ServiceCIDR>),
    /// NodeIPAMPools, as the driver maps them.
    Pool(Watch<PoolInput>),
    /// The answer to `Effect::CreateConfig`.
    ConfigCreated {
        config: ChildConfig,
        outcome: CreateOutcome,
    },
    /// The answer to `Effect::DeleteConfig`.
    ConfigDeleted {
        name: String,
        uid: Option<String>,
        outcome: DeleteOutcome,
    },
    /// A published ConfigMap, by its index in `Options::outputs`.
    Output(usize, Watch<ConfigMap>),
    /// The answer to `Effect::Reread`.
    Reread {
        node: String,
        uid: Option<String>,
        now: NodeNow,
    },
    /// The outcome of an `Effect::Write`.
    Written(WriteResult),
    /// An `Effect::Config` job is done: written, or moot because its config is gone.
    ConfigWritten(ConfigJob),
    /// An `Effect::Publish` is written to every output. The publisher writes one network
    /// at a time and may skip one a newer network replaced.
    Published(PodNetwork),
    /// Periodic: coalesced status, publication, parked nodes whose time came.
    Tick,
    /// Rarely: every pending node is tried again.
    Resync,
}

/// Every action the machine asks for.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Write podCIDRs (with the Node's UID as a precondition) and answer with `Input::Written`.
    Write(WriteJob),
    Config(ConfigJob),
    /// Write the pod network to every output.
    Publish(PodNetwork),
    Note(Note),
    /// GET the node and answer with `Input::Reread`: it was missing from a relist.
    Reread {
        node: String,
        uid: Option<String>,
    },
    Metric(Metric),
    /// Create a pool's child config; answer with `Input::ConfigCreated`.
    CreateConfig(ChildConfig),
    /// Delete a pool's empty child config, only the object `uid`; answer with
    /// `Input::ConfigDeleted`.
    DeleteConfig {
        name: String,
        uid: Option<String>,
    },
    /// Write a pool's status, only to the object `uid`.
    PoolStatus {
        name: String,
        uid: Option<String>,
        status: PoolStatus,
    },
}

/// A metric change; ranges are the config ranges the blocks came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Metric {
    Allocated(IpNet),
    Released(IpNet),
    /// Blocks leaked now (kept occupied after an ambiguous write): up when a write is given
    /// up, down when a leak ends.
    Leaked(u64),
    AssignmentFailure,
    Error(&'static str),
    Usage {
        range: IpNet,
        ratio: f64,
    },
    Blocks {
        config: String,
        family: &'static str,
        allocated: u64,
        capacity: u64,
    },
    Pending(usize),
    Unmanaged(usize),
    /// kcm's max gauge: the blocks in a range.
    Capacity {
        range: IpNet,
        blocks: u64,
    },
    /// The status the machine computed for a config (its condition and draining gauges).
    Status {
        config: String,
        status: NodeIPAMConfigStatus,
    },
    /// A config is gone: drop its series.
    ConfigGone(String),
    /// The ranges a pool has (its active children).
    PoolRanges {
        pool: String,
        ranges: u64,
    },
    RangeCarved {
        pool: String,
    },
    RangeRetired {
        pool: String,
    },
    /// From a pool's decision to carve (its headroom breached) to the new range accepting
    /// allocations (its gates open: finalizer on, published).
    ScaleUpSeconds {
        pool: String,
        seconds: f64,
    },
    /// A pool is gone: drop its series.
    PoolGone(String),
}

#[derive(Clone)]
pub struct Machine {
    /// The allocation state, the time, the effects.
    core: Core,
    lists: Lists,
    nodes: Nodes,
    configs: Configs,
    statuses: Statuses,
    publication: Publication,
    writes: Writes,
    pools: Pools,
}

impl Machine {
    pub fn new(options: Options) -> Self {
        let mut ipam = Ipam::new();
        services::from_flag(&mut ipam, options.service_cidrs);
        let publication = Publication::new(&options.outputs, options.extra_non_masquerade);
        let nodes = Nodes::new(options.panic_on_node);
        let lists = Lists::new(
            options.outputs.len(),
            options.service_cidr_api,
            options.pools,
        );
        Machine {
            core: Core::new(ipam),
            lists,
            nodes,
            configs: Configs::default(),
            statuses: Statuses::default(),
            publication,
            writes: Writes::new(options.write_attempts, options.retry_rejected_after),
            pools: Pools::default(),
        }
    }

    /// Takes one fact at `now`; returns what to do about it.
    pub fn handle(&mut self, now: Now, input: Input) -> Vec<Effect> {
        self.core.begin(now);
        match input {
            Input::Node(w) => self.on_watch(Source::Nodes, w, Self::on_node, |m, n| {
                m.on_node_gone(&n.name_any(), n.uid().as_deref());
            }),
            Input::Config(w) => self.on_watch(Source::Configs, w, Self::on_config, |m, c| {
                m.on_config_gone(&c.name_any());
            }),
            Input::Service(w) => self.on_watch(
                Source::Services,
                w,
                |m, s| {
                    let (_, nodes, mut cx) = m.parts();
                    services::applied(&s, nodes, &mut cx);
                },
                |m, s| {
                    let (_, nodes, mut cx) = m.parts();
                    services::gone(&s.name_any(), nodes, &mut cx);
                },
            ),
            Input::Pool(w) => match w {
                Watch::ListStart => self.list_started(Source::Pools),
                Watch::Listed(p) => {
                    self.list_saw(Source::Pools, p.name.clone());
                    self.pools.on_pool(p);
                }
                Watch::Applied(p) => self.pools.on_pool(p),
                Watch::Deleted(p) => self.on_pool_gone(&p.name),
                Watch::ListDone => self.list_done(Source::Pools),
            },
            Input::ConfigCreated { config, outcome } => {
                self.pools
                    .on_config_created(&config, outcome, &mut self.core);
            }
            Input::ConfigDeleted { name, uid, outcome } => {
                self.on_config_deleted(&name, uid.as_deref(), outcome);
            }
            Input::Output(i, w) => self.on_output_watch(i, w),
            Input::Reread { node, uid, now } => {
                let (writes, nodes, mut cx) = self.parts();
                writes.on_reread(&node, uid.as_deref(), now, nodes, &mut cx);
            }
            Input::Written(result) => {
                let (writes, nodes, mut cx) = self.parts();
                writes.on_write_result(result, nodes, &mut cx);
            }
            Input::ConfigWritten(job) => self.on_config_written(&job),
            Input::Published(network) => self.on_published(&network),
            Input::Tick => {
                self.configs.request_finalizers(&mut self.core);
                self.writes.reread_due(&mut self.core);
                let (_, nodes, mut cx) = self.parts();
                nodes.wake_parked(&mut cx);
                nodes.warn_long_waits(&mut cx);
                self.flush_status();
                self.scale_pools();
                self.publish_network();
            }
            Input::Resync => self.retry_pending(),
        }
        // What consumers must learn goes out now, not at the next tick: a new range (a carve
        // above all) hands out nothing before it is published. Only content changes are sent.
        if self.publication.is_dirty() {
            self.publish_network();
        }
        // Gauges that follow the state are set after every step so they are never stale.
        self.core
            .push(Effect::Metric(Metric::Pending(self.nodes.len())));
        self.core.take()
    }

    /// Whether everything has been read once: only then is anything allocated.
    pub fn synced(&self) -> bool {
        self.core.synced()
    }

    /// The allocation state, for the simulator's checks and for logs.
    pub fn ipam(&self) -> &Ipam {
        self.core.ipam()
    }

    /// How many nodes wait for a block.
    pub fn pending(&self) -> usize {
        self.nodes.len()
    }

    /// Carves asked for and not yet seen as configs, for the simulator's checks.
    pub fn carves_in_flight(&self) -> usize {
        self.pools.carves_in_flight()
    }

    /// The configs this machine knows, for `retry_pending` benches and checks.
    pub fn config_count(&self) -> usize {
        self.configs.len()
    }

    // ----- watches and lists -----

    /// One event of a watched resource: the list bookkeeping is the same for every kind,
    /// what an object's arrival and departure mean is the kind's own.
    fn on_watch<T: Resource<DynamicType = ()>>(
        &mut self,
        source: Source,
        w: Watch<T>,
        apply: fn(&mut Self, T),
        gone: fn(&mut Self, T),
    ) {
        match w {
            Watch::ListStart => self.list_started(source),
            Watch::Listed(obj) => {
                self.list_saw(source, obj.name_any());
                apply(self, obj);
            }
            Watch::Applied(obj) => apply(self, obj),
            Watch::Deleted(obj) => gone(self, obj),
            Watch::ListDone => self.list_done(source),
        }
    }

    fn on_output_watch(&mut self, index: usize, w: Watch<ConfigMap>) {
        let seen = self.publication.on_watch(index, w);
        if seen.changed {
            self.regate();
        }
        if seen.listed {
            self.list_done(Source::Output(index));
        }
    }

    fn list_started(&mut self, source: Source) {
        self.lists.started(source, self.core.step());
    }

    fn list_saw(&mut self, source: Source, name: String) {
        self.lists.saw(source, name);
    }

    fn list_done(&mut self, source: Source) {
        let seen = self.lists.finished(source);
        self.on_relisted(source, &seen);
        let all = self.lists.listed(source);
        if !self.core.synced() && all {
            self.on_synced();
        }
    }

    /// Everything is read: only now may anything be allocated.
    fn on_synced(&mut self) {
        self.core.set_synced();
        info!(
            nodes = self.core.ipam().node_count(),
            configs = self.configs.len(),
            pending = self.nodes.len(),
            "allocation state rebuilt from the API"
        );
        self.statuses.unmanaged_moved();
        self.statuses.mark_all(self.configs.names().cloned());
        self.retry_pending();
        self.flush_status();
    }

    /// After a (re)list, what we know but the list lacks may be gone. Nodes are confirmed with
    /// a fresh GET before their blocks are released: a watch may lag, a GET does not.
    fn on_relisted(&mut self, source: Source, seen: &HashSet<String>) {
        match source {
            Source::Nodes => self.writes.relisted(seen, &self.nodes, &mut self.core),
            Source::Configs => {
                let gone: Vec<String> = self
                    .configs
                    .names()
                    .filter(|n| !seen.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    self.on_config_gone(&name);
                }
                // A child created before this list started and not in it is gone again
                // (its create and delete both fell between two lists).
                let started = self.lists.configs_list_step();
                self.pools.configs_relisted(started, seen);
            }
            Source::Services => {
                let (_, nodes, mut cx) = self.parts();
                services::relisted(seen, nodes, &mut cx);
            }
            Source::Pools => {
                for name in self.pools.missing_from(seen) {
                    self.on_pool_gone(&name);
                }
            }
            Source::Output(_) => {}
        }
    }

    // ----- nodes -----

    /// The writes and the nodes, and the parts their handling reaches.
    fn parts(&mut self) -> (&mut Writes, &mut Nodes, Around<'_>) {
        let Machine {
            core,
            writes,
            nodes,
            configs,
            statuses,
            pools,
            ..
        } = self;
        let cx = Around {
            core,
            statuses,
            configs,
            pools,
        };
        (writes, nodes, cx)
    }

    fn on_node(&mut self, node: IpamNode) {
        let (_, nodes, mut cx) = self.parts();
        nodes.on_node(node, &mut cx);
    }

    fn on_node_gone(&mut self, name: &str, uid: Option<&str>) {
        let (_, nodes, mut cx) = self.parts();
        nodes.on_node_gone(name, uid, &mut cx);
    }

    /// Once every watch has listed, every pending node again: capacity may have appeared.
    fn retry_pending(&mut self) {
        if self.core.synced() {
            let (_, nodes, mut cx) = self.parts();
            nodes.retry_pending(&mut cx);
        }
    }

    fn retry_pending_for(&mut self, configs: &BTreeSet<String>) {
        let (_, nodes, mut cx) = self.parts();
        nodes.retry_pending_for(configs, &mut cx);
    }

    // ----- configs -----

    fn on_config(&mut self, obj: NodeIPAMConfig) {
        let name = obj.name_any();
        let moved = self
            .configs
            .on_config(obj, &mut self.statuses, &mut self.core);
        self.pools.config_seen(&name, &self.configs);
        if !moved {
            // Only status or metadata moved (our own status write, most often): nothing that
            // allocation or other configs depend on.
            return;
        }
        let input = self.gated(&name);
        let open = input.gate.is_none();
        self.core.ipam_mut().upsert_config(input);
        if open {
            self.pools.scaled_up(&name, &mut self.core);
        }
        // Overlaps and which config owns a block (so every config's Ready and counts) may
        // change with any config.
        self.statuses.mark_all(self.configs.names().cloned());
        self.statuses.unmanaged_moved();
        self.publication.mark_dirty();
        if self.core.synced() {
            self.retry_pending();
        }
    }

    fn on_config_gone(&mut self, name: &str) {
        info!(config = %name, "NodeIPAMConfig gone");
        self.core.metric(Metric::ConfigGone(name.to_string()));
        self.configs.remove(name);
        self.statuses.config_gone(name);
        self.pools.config_gone(name);
        self.core.ipam_mut().remove_config(name);
        self.publication.mark_dirty();
        // Its blocks are the next oldest config's now (and overlaps may be gone): every
        // status is counted again.
        self.statuses.mark_all(self.configs.names().cloned());
        self.statuses.unmanaged_moved();
        if self.core.synced() {
            self.retry_pending();
        }
    }

    // ----- pools -----

    fn on_pool_gone(&mut self, name: &str) {
        self.pools.on_pool_gone(name, &mut self.core);
        if self.core.synced() {
            // Nodes that waited for it without a warning get one now.
            self.retry_pending();
        }
    }

    fn on_config_deleted(&mut self, name: &str, uid: Option<&str>, outcome: DeleteOutcome) {
        let handed_back = self
            .pools
            .on_config_deleted(name, uid, outcome, &mut self.core);
        if handed_back && self.configs.contains(name) {
            self.regate();
        }
    }

    /// Every pool's decision: carve, retire, status.
    fn scale_pools(&mut self) {
        if !self.core.synced() {
            return;
        }
        let pools = self.pools.begin_scaling(
            self.nodes.waiting(),
            &self.configs,
            &self.statuses,
            &self.core,
        );
        let wall = self.core.wall();
        for (name, waiting) in pools {
            let scaled = self.pools.scale_pool(
                &name,
                waiting,
                &wall,
                &self.configs,
                &self.statuses,
                &mut self.core,
            );
            for child in &scaled.retired {
                let gated = self.gated(child);
                self.core.ipam_mut().upsert_config(gated);
                self.statuses.mark(child.clone());
            }
            if scaled.stopped_growing {
                let (_, nodes, mut cx) = self.parts();
                nodes.retry_pending_of_pool(&name, &mut cx);
            }
        }
    }

    // ----- status -----

    fn flush_status(&mut self) {
        if !self.core.synced() {
            return;
        }
        let (network_moved, names) = self.statuses.begin_flush(&mut self.core);
        if network_moved {
            self.publication.mark_dirty();
        }
        let now = self.core.wall();
        for name in names {
            let flushed = self
                .statuses
                .flush_config(&name, &self.configs, &mut self.core, &now);
            let Some(flushed) = flushed else { continue };
            if flushed.sent {
                self.update_drain_gate(&name);
            }
            if let Some(uid) = flushed.release {
                self.core
                    .push(Effect::Config(ConfigJob::RemoveFinalizer { name, uid }));
            }
        }
    }

    /// A config job is done. The config writer writes one job at a time, so a status reported
    /// written is what the object holds now (unless someone edits it later).
    fn on_config_written(&mut self, job: &ConfigJob) {
        if let ConfigJob::AddFinalizer { name } = job {
            self.configs.finalizer_answered(name);
        }
        if let ConfigJob::Status { name, status, .. } = job {
            self.statuses.landed(name, status);
            self.update_drain_gate(name);
        }
    }

    /// A status of ours was sent or landed: the drain gate may move.
    fn update_drain_gate(&mut self, name: &str) {
        let Some(gate) = self.configs.update_drain_gate(name, &self.statuses) else {
            return;
        };
        let input = self.gated(name);
        self.core.ipam_mut().upsert_config(input);
        self.statuses.mark(name.to_string());
        if !gate {
            self.retry_pending_for(&BTreeSet::from([name.to_string()]));
        }
    }

    // ----- the published pod network -----

    fn publish_network(&mut self) {
        self.publication.publish(&self.configs, &mut self.core);
    }

    /// The pod network as the allocation state has it now.
    pub fn network(&self) -> PodNetwork {
        publication::network(&self.configs, &self.core)
    }

    /// A network is written: gates may open.
    fn on_published(&mut self, network: &PodNetwork) {
        self.publication.on_published(network);
        self.regate();
    }

    /// Every config's gate again, after what consumers know changed.
    /// Only the configs whose gate moved change; only those whose gate opened can serve more.
    fn regate(&mut self) {
        let opened = self.configs.regate(
            &self.pools,
            &self.publication,
            &mut self.statuses,
            self.core.ipam_mut(),
        );
        for name in &opened {
            self.pools.scaled_up(name, &mut self.core);
        }
        self.retry_pending_for(&opened);
    }

    /// The config's input with its gates.
    fn gated(&self, name: &str) -> ConfigInput {
        self.configs.gated(name, &self.pools, &self.publication)
    }
}

mod carves;
mod configs;
mod core;
mod lists;
mod nodes;
mod pools;
mod publication;
mod services;
mod statuses;
mod writes;

#[cfg(test)]
mod tests;
