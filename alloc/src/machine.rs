//! The allocation core as a state machine: `Machine::handle` takes one fact (a watch event, a
//! write's outcome, a re-read, a tick) with the time, and returns the effects (writes, config
//! jobs, the pod network to publish, events, metrics). It never awaits and never reads a
//! clock, so the same inputs always give the same effects: the simulator in the tests drives it
//! through event orders and faults no end-to-end test could reach.
//!
//! One machine owns the state of one leadership term; being its only owner is what makes the
//! controller a single writer.
//!
//! The machine routes each input to the parts that own what it is about, each with its own
//! state, reading another part only through its methods:
//! - `core`: the allocation state, the time, whether every watch has listed, the effects;
//! - `lists`: the watches' (re)lists;
//! - `revisions`: the versions objects were seen at, and a relist that shows storage went
//!   back in time (then nothing more is allocated);
//! - `nodes`: the nodes waiting for a block and every attempt to give them one;
//! - `writes`: what becomes of a podCIDR write, and the re-reads of nodes a relist lacks;
//! - `configs`: the config objects, our finalizer on them, and their gates;
//! - `statuses`: what each config's status says, sent, in flight and landed;
//! - `publication`: the pod network consumers read, and which ranges they hold;
//! - `pools` and `carves`: the pools' decisions and the carves in flight;
//! - `services`: the Service ranges.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use kube_core::ResourceExt;
use nodeipam_crd::NodeIPAMConfig;
use tracing::info;

use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::effects::{ConfigJob, DeleteOutcome, Note};
use crate::ipam::Ipam;
use crate::node::IpamNode;
use crate::podnetwork::PodNetwork;
use crate::pool::PoolInput;
use configs::Configs;
use core::Core;
use lists::{Lists, Source};
use nodes::{Around, Nodes};
use pools::Pools;
use publication::{OutputSeen, Publication};
use statuses::Statuses;
use writes::Writes;

pub use configs::config_input;
pub use io::{Effect, Input, Metric, Now, Options, Watch};
pub use revisions::{Revisions, WentBack};
pub use services::SERVICE_FLAG_SOURCE;

mod carves;
mod configs;
mod core;
mod io;
mod lists;
mod nodes;
mod pools;
mod publication;
mod revisions;
mod services;
mod statuses;
mod writes;

#[cfg(test)]
mod tests;

/// How long a node may wait behind a config's gate (our finalizer, consumers learning the
/// range) or for a pool to carve before it is warned about: at start-up and in a burst every
/// node waits a moment, and a Warning must mean that something is wrong.
pub const GATE_GRACE: Duration = Duration::from_secs(30);

/// How often a config's status is written while only its counts move (blocks allocated,
/// nodes, how many still hold blocks): a status patch of a NodeIPAMConfig costs the API server
/// about three node patches (a CRD is validated and stored as JSON), and in a burst the counts
/// move at every tick. A flipped condition, a new generation or capacity go out at once.
pub const STATUS_COUNTS_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct Machine {
    core: Core,
    lists: Lists,
    revisions: Revisions,
    nodes: Nodes,
    writes: Writes,
    configs: Configs,
    statuses: Statuses,
    publication: Publication,
    pools: Pools,
}

impl Machine {
    pub fn new(options: Options) -> Self {
        let mut ipam = Ipam::new();
        services::from_flag(&mut ipam, options.service_cidrs);
        let lists = Lists::new(
            options.outputs.len(),
            options.service_cidr_api,
            options.pools,
        );
        Machine {
            core: Core::new(ipam),
            lists,
            revisions: options.revisions,
            nodes: Nodes::new(options.panic_on_node),
            writes: Writes::new(options.write_attempts, options.retry_rejected_after),
            configs: Configs::default(),
            statuses: Statuses::default(),
            publication: Publication::new(&options.outputs, options.extra_non_masquerade),
            pools: Pools::default(),
        }
    }

    /// Takes one fact at `now`; returns what to do about it.
    pub fn handle(&mut self, now: Now, input: Input) -> Vec<Effect> {
        self.core.begin(now);
        if self.revisions.went_back().is_some() {
            // Storage went back in time: what the API says now may lack blocks that nodes
            // hold. Nothing is decided any more, in this term or a later one.
            return Vec::new();
        }
        match input {
            Input::Node(w) => self.on_watch(Source::Nodes, w, name, Self::on_node, Self::node_gone),
            Input::Config(w) => {
                self.on_watch(Source::Configs, w, name, Self::on_config, |m, c| {
                    m.on_config_gone(&c.name_any());
                });
            }
            Input::Service(w) => self.on_watch(
                Source::Services,
                w,
                name,
                |m, s| m.with_nodes(|nodes, cx| services::applied(&s, nodes, cx)),
                |m, s| m.with_nodes(|nodes, cx| services::gone(&s.name_any(), nodes, cx)),
            ),
            Input::Pool(w) => self.on_watch(
                Source::Pools,
                w,
                |p| p.name.clone(),
                |m, p| m.pools.on_pool(p),
                |m, p| m.on_pool_gone(&p.name),
            ),
            Input::ConfigCreated { config, outcome } => {
                self.pools
                    .on_config_created(&config, outcome, &mut self.core);
            }
            Input::ConfigEnabled { child, outcome } => {
                self.pools
                    .on_config_enabled(&child, outcome, &mut self.core);
            }
            Input::ConfigDeleted { name, uid, outcome } => {
                self.on_config_deleted(&name, uid.as_deref(), outcome);
            }
            Input::Output(i, w) => {
                let seen = self.publication.on_watch(i, w);
                self.on_output_seen(i, seen);
            }
            Input::OutputFailed(i, why) => {
                let seen = self.publication.on_failed(i, why);
                self.on_output_seen(i, seen);
            }
            Input::Reread { node, uid, now } => {
                let (writes, nodes, mut cx) = self.parts();
                writes.on_reread(&node, uid.as_deref(), now, nodes, &mut cx);
            }
            Input::Written(result) => {
                let (writes, nodes, mut cx) = self.parts();
                writes.on_write_result(result, nodes, &mut cx);
            }
            Input::ConfigWritten(job) => self.on_config_written(&job),
            Input::Published(network) => {
                self.publication.on_published(&network);
                self.regate();
            }
            Input::PublishFailed(why) => {
                if self.publication.on_publish_failed(why) {
                    self.regate();
                }
            }
            Input::Tick => self.tick(),
            Input::Resync => self.retry_pending(),
        }
        if self.revisions.went_back().is_some() {
            // Found by this input: only its warning and metric go out.
            return self.core.take();
        }
        // What consumers must learn goes out now, not at the next tick: a new range (a carve
        // above all) hands out nothing before it is published. Only content changes are sent.
        if self.publication.is_dirty() {
            self.publish_network();
        }
        // Gauges that follow the state are set after every step so they are never stale. A
        // node whose podCIDR write has not been seen to land still waits: it counts.
        let pending = self.nodes.len() + self.core.ipam().writing();
        self.core.push(Effect::Metric(Metric::Pending(pending)));
        self.core.take()
    }

    /// Whether everything has been read once: only then is anything allocated.
    pub fn synced(&self) -> bool {
        self.core.synced()
    }

    /// Whether (and where) a relist showed that storage went back in time: then the machine
    /// allocates nothing, and handles no more inputs.
    pub fn went_back(&self) -> Option<&WentBack> {
        self.revisions.went_back()
    }

    /// The versions seen, handed over at the end of a term so that the next term's machine
    /// (`Options::revisions`) compares its relists with them.
    pub fn take_revisions(&mut self) -> Revisions {
        std::mem::take(&mut self.revisions)
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

    /// The pod network as the allocation state has it now.
    pub fn network(&self) -> PodNetwork {
        publication::network(&self.core)
    }

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

    fn with_nodes(&mut self, f: impl FnOnce(&mut Nodes, &mut Around<'_>)) {
        let (_, nodes, mut cx) = self.parts();
        f(nodes, &mut cx);
    }

    /// Periodic: finalizers asked again, failed re-reads and parked nodes whose time came,
    /// long waits warned, statuses flushed, pools decided, the pod network published.
    fn tick(&mut self) {
        self.configs.request_finalizers(&mut self.core);
        self.writes.reread_due(&mut self.core);
        self.with_nodes(|nodes, cx| {
            nodes.wake_parked(cx);
            nodes.warn_long_waits(cx);
        });
        self.flush_status();
        self.scale_pools();
        self.publish_network();
    }

    // ----- watches and lists -----

    /// One event of a watched resource: the list bookkeeping is the same for every kind,
    /// what an object's arrival and departure mean is the kind's own.
    fn on_watch<T: Versioned>(
        &mut self,
        source: Source,
        w: Watch<T>,
        name: fn(&T) -> String,
        apply: fn(&mut Self, T),
        gone: fn(&mut Self, T),
    ) {
        let stream = source.resource();
        match w {
            Watch::ListStart => {
                self.lists.started(source, self.core.step());
                self.revisions.list_started(stream);
            }
            Watch::Listed(obj) => {
                let (uid, rv) = obj.version();
                let n = name(&obj);
                if let Some(found) = self.revisions.listed(stream, &n, uid, rv) {
                    // Checked before the object is applied: what it would allocate is
                    // exactly what must not be.
                    self.storage_went_back(found);
                    return;
                }
                self.lists.saw(source, n);
                apply(self, obj);
            }
            Watch::Applied(obj) => {
                let (uid, rv) = obj.version();
                self.revisions.applied(stream, uid, rv);
                apply(self, obj);
            }
            Watch::Deleted(obj) => {
                self.revisions.deleted(stream, obj.version().0);
                gone(self, obj);
            }
            Watch::ListDone => {
                self.revisions.list_done(stream);
                self.list_done(source);
            }
        }
    }

    /// A relist showed storage went back in time: allocation stops for good (the effects of
    /// this input are only the warning and the metric).
    fn storage_went_back(&mut self, found: WentBack) {
        let note = match found.stream {
            "nodes" => Some(Note::node(
                &found.name,
                Some(&found.uid),
                true,
                STORAGE_WENT_BACK,
                found.to_string(),
            )),
            "nodeipamconfigs" => Some(Note::config(
                &found.name,
                Some(&found.uid),
                true,
                STORAGE_WENT_BACK,
                found.to_string(),
            )),
            _ => None,
        };
        if let Some(note) = note {
            self.core.note(note);
        }
        self.core.metric(Metric::StorageWentBack(found));
    }

    fn on_output_seen(&mut self, index: usize, seen: OutputSeen) {
        if seen.changed {
            self.regate();
        }
        if seen.listed {
            self.list_done(Source::Output(index));
        }
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
            Source::Services => self.with_nodes(|nodes, cx| services::relisted(seen, nodes, cx)),
            Source::Pools => {
                for name in self.pools.missing_from(seen) {
                    self.on_pool_gone(&name);
                }
            }
            Source::Output(_) => {}
        }
    }

    // ----- nodes -----

    fn on_node(&mut self, node: IpamNode) {
        self.with_nodes(|nodes, cx| nodes.on_node(node, cx));
    }

    fn node_gone(&mut self, node: IpamNode) {
        let (name, uid) = (node.name_any(), node.uid());
        self.with_nodes(|nodes, cx| nodes.on_node_gone(&name, uid.as_deref(), cx));
    }

    /// Once every watch has listed, every pending node again: capacity may have appeared.
    fn retry_pending(&mut self) {
        if self.core.synced() {
            self.with_nodes(Nodes::retry_pending);
        }
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
        if self.regate_one(&name) {
            self.pools.scaled_up(&name, &mut self.core);
        }
        // Overlaps and which config owns a block (so every config's Ready and counts) may
        // change with any config.
        self.configs_moved();
    }

    fn on_config_gone(&mut self, name: &str) {
        info!(config = %name, "NodeIPAMConfig gone");
        self.core.metric(Metric::ConfigGone(name.to_string()));
        self.configs.remove(name);
        self.statuses.config_gone(name);
        self.pools.config_gone(name);
        self.core.ipam_mut().remove_config(name);
        // Its blocks are the next oldest config's now (and overlaps may be gone): every
        // status is counted again.
        self.configs_moved();
    }

    /// A config came, went or changed what allocation reads of it: every status, the
    /// unmanaged podCIDRs, the pod network and every pending node may move.
    fn configs_moved(&mut self) {
        self.statuses.mark_all(self.configs.names().cloned());
        self.statuses.unmanaged_moved();
        self.publication.mark_dirty();
        self.retry_pending();
    }

    /// A config job is done. The config writer writes one job at a time, so a status reported
    /// written is what the object holds now (unless someone edits it later).
    fn on_config_written(&mut self, job: &ConfigJob) {
        match job {
            ConfigJob::AddFinalizer { name } => self.configs.finalizer_answered(name),
            ConfigJob::Status { name, status, .. } => {
                self.statuses.landed(name, status);
                self.update_drain_gate(name);
            }
            ConfigJob::RemoveFinalizer { .. } => {}
        }
    }

    /// A status of ours was sent or landed: the drain gate may move.
    fn update_drain_gate(&mut self, name: &str) {
        let Some(gate) = self.configs.update_drain_gate(name, &self.statuses) else {
            return;
        };
        self.regate_one(name);
        if !gate {
            let opened = BTreeSet::from([name.to_string()]);
            self.with_nodes(|nodes, cx| nodes.retry_pending_for(&opened, cx));
        }
    }

    /// One config's gates again, into the allocation state (marked for a status flush):
    /// whether it accepts allocations now.
    fn regate_one(&mut self, name: &str) -> bool {
        let input = self.configs.gated(name, &self.pools, &self.publication);
        let open = input.gate.is_none();
        self.core.ipam_mut().upsert_config(input);
        self.statuses.mark(name.to_string());
        open
    }

    /// Every config's gate again, after what consumers know changed. Only those whose gate
    /// opened can serve more.
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
        self.with_nodes(|nodes, cx| nodes.retry_pending_for(&opened, cx));
    }

    // ----- statuses and the pod network -----

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

    fn publish_network(&mut self) {
        self.publication.publish(&mut self.core);
    }

    // ----- pools -----

    fn on_pool_gone(&mut self, name: &str) {
        self.pools.on_pool_gone(name, &mut self.core);
        // Nodes that waited for it without a warning get one now.
        self.retry_pending();
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
            // A child being retired hands out nothing from now on.
            for child in &scaled.retired {
                self.regate_one(child);
            }
            if scaled.stopped_growing {
                self.with_nodes(|nodes, cx| nodes.retry_pending_of_pool(&name, cx));
            }
        }
    }
}

/// The reason of the Warning event about an object a relist showed older than it was seen.
pub const STORAGE_WENT_BACK: &str = "StorageWentBack";

/// A watched object's UID and resourceVersion, as far as its kind carries them.
trait Versioned {
    fn version(&self) -> (Option<&str>, Option<&str>);
}

fn meta_version(meta: &ObjectMeta) -> (Option<&str>, Option<&str>) {
    (meta.uid.as_deref(), meta.resource_version.as_deref())
}

impl Versioned for IpamNode {
    fn version(&self) -> (Option<&str>, Option<&str>) {
        meta_version(&self.metadata)
    }
}

impl Versioned for NodeIPAMConfig {
    fn version(&self) -> (Option<&str>, Option<&str>) {
        meta_version(&self.metadata)
    }
}

impl Versioned for ServiceCIDR {
    fn version(&self) -> (Option<&str>, Option<&str>) {
        meta_version(&self.metadata)
    }
}

impl Versioned for PoolInput {
    /// The decision's view of a pool carries no resourceVersion: pools are never evidence.
    fn version(&self) -> (Option<&str>, Option<&str>) {
        (self.uid.as_deref(), None)
    }
}

/// A watched object's name.
fn name<T: ResourceExt>(obj: &T) -> String {
    obj.name_any()
}
