//! The allocation core as a state machine: `Machine::handle` takes one fact (a watch event, a
//! write's outcome, a re-read, a tick) with the time, and returns the effects (writes, config
//! jobs, the pod network to publish, events, metrics). It never awaits and never reads a
//! clock, so the same inputs always give the same effects: the simulator in the tests drives it
//! through event orders and faults no end-to-end test could reach.
//!
//! One machine owns the state of one leadership term; being its only owner is what makes the
//! controller a single writer.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{ConfigMap, NodeSelector};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_core::{Resource, ResourceExt};
use nodeipam_crd::{
    Allocation as AllocationSwitch, FINALIZER, NodeIPAMConfig, NodeIPAMConfigStatus,
};
use tracing::{debug, error, info, warn};

use super::effects::{
    self, ChildConfig, ConfigJob, CreateOutcome, DeleteOutcome, Note, WriteJob, WriteResult,
};
use super::ipam::{AllocateError, ConfigInput, Ipam, NodeSeen, Phase, nets_overlap};
use super::outcome::{Decision, NodeNow, WriteOutcome, decide};
use super::podnetwork::{ConfigMapRef, OutputContent, OutputKind, PodNetwork, covered};
use super::pool::{
    self as scaling, Carve, ChildView, DEMAND_WINDOW, PoolInput, PoolStatus, PoolWorld,
};
use super::selection::{self, NodeView};
use super::status::{counts_only, desired_status};
use crate::node::IpamNode;

/// How long a failed re-read of a node missing from a relist waits before it is tried again.
const REREAD_RETRY: Duration = Duration::from_secs(5);

/// How long a node may wait behind a config's gate (our finalizer, consumers learning the
/// range) or for a pool to carve before it is warned about: at start-up and in a burst every
/// node waits a moment, and a Warning must mean that something is wrong.
pub const GATE_GRACE: Duration = Duration::from_secs(30);

/// How often a config's status is written while only its counts move (blocks allocated,
/// nodes, how many still hold blocks): a status patch of a NodeIPAMConfig costs the API server
/// about three node patches (a CRD is validated and stored as JSON), and in a burst the counts
/// move at every tick. A flipped condition, a new generation or capacity go out at once.
pub const STATUS_COUNTS_EVERY: Duration = Duration::from_secs(1);

/// How long a created child may take to show in the config watch before its create is sent
/// again (the same range under the same name: AlreadyExists if it is there after all).
const CARVE_RECHECK: Duration = Duration::from_secs(30);

/// The source name of the `--service-cidr` flag among the Service ranges.
pub const SERVICE_FLAG_SOURCE: &str = "--service-cidr";

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

/// What the machine remembers of a config object besides the allocation state.
#[derive(Clone, Debug)]
struct ConfigSeen {
    /// The allocation state's view, before gates.
    base: ConfigInput,
    uid: Option<String>,
    generation: Option<i64>,
    has_finalizer: bool,
    deleting: bool,
    status: Option<NodeIPAMConfigStatus>,
    /// Allocation waits: the status says (or a status of ours on its way says) Drained, and
    /// consumers may act on that. See `update_drain_gate`.
    drain_gate: bool,
    finalizer_requested: bool,
    /// The uid of the NodeIPAMPool named by its controller ownerReference, if any.
    owner_uid: Option<String>,
}

/// A pool and what the last decision found.
#[derive(Clone, Debug)]
struct PoolSeen {
    input: PoolInput,
    /// The pool can still grow (or is growing): its nodes wait without a warning.
    room: bool,
}

/// A carve asked for and not yet seen in the config watch.
#[derive(Clone, Debug)]
struct CarveInFlight {
    pool: String,
    pool_uid: Option<String>,
    carve: Carve,
    /// The step at which the create was answered (created, or already there): a config list
    /// started after it that lacks the child means the child is gone again.
    answered: Option<u64>,
    /// The time of that answer.
    answered_at: Duration,
    /// The create failed, perhaps after landing: it is asked again, the same range under the
    /// same name, so a landed one is found (AlreadyExists) rather than a second one made.
    failed: bool,
    /// Creates sent and not yet answered: until none is, one may still land (again, after a
    /// user deleted the child), so the carve still counts.
    sent: u32,
    /// The child has shown in the config watch.
    seen: bool,
    /// Creates that failed in a row, and when the next may go.
    failures: u32,
    retry_at: Duration,
}

/// A node waiting for a block.
#[derive(Clone, Debug)]
struct PendingNode {
    uid: Option<String>,
    /// Its resourceVersion as last read, for the write's precondition.
    version: Option<String>,
    labels: BTreeMap<String, String>,
    warned: bool,
    /// Since when it has waited only behind gates, if it does.
    waiting_since: Option<Duration>,
    /// Not before then: the API server refused every write of its last blocks.
    retry_at: Option<Duration>,
}

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

/// A watch, to track its lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    Nodes,
    Configs,
    Services,
    Pools,
    Output(usize),
}

#[derive(Clone)]
pub struct Machine {
    options: Options,
    now: Now,
    ipam: Ipam,
    synced: bool,
    /// Watches whose first list is complete.
    listed: HashSet<Source>,
    /// Names returned by a (re)list in progress.
    relist: HashMap<Source, HashSet<String>>,
    pending: BTreeMap<String, PendingNode>,
    configs: BTreeMap<String, ConfigSeen>,
    /// The status we last wrote per config: the previous conditions for the next one, even
    /// before the watch shows our write.
    written: HashMap<String, NodeIPAMConfigStatus>,
    dirty: BTreeSet<String>,
    unmanaged_dirty: bool,
    reported: HashSet<(String, IpNet)>,
    invalid_reported: HashSet<String>,
    outputs: Vec<Output>,
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
    /// Nodes missing from a relist whose re-read failed: the UID asked about, and when to ask
    /// again.
    rereads_due: BTreeMap<String, (Option<String>, Duration)>,
    /// The statuses sent per config and not yet reported written, oldest first. The config
    /// writer writes one job at a time and may skip a status a newer one replaced.
    status_in_flight: HashMap<String, Vec<NodeIPAMConfigStatus>>,
    /// The status last reported written per config.
    status_landed: HashMap<String, NodeIPAMConfigStatus>,
    /// When each config's status was last sent: counts wait for `STATUS_COUNTS_EVERY`.
    status_sent_at: HashMap<String, Duration>,
    network_dirty: bool,
    pools: BTreeMap<String, PoolSeen>,
    /// Carves in flight, by child name.
    carves: BTreeMap<String, CarveInFlight>,
    /// Children whose delete we asked for, by name, with the uid: they hand out nothing more.
    retiring: BTreeMap<String, Option<String>>,
    /// When each pool child's node count last became 0.
    empty_since: HashMap<String, Duration>,
    /// The status we last wrote per pool.
    pool_written: HashMap<String, PoolStatus>,
    /// Each config's facts as its last status flush computed them (every change that moves
    /// them marks the config for one): what pool decisions read.
    facts: HashMap<String, super::ipam::ConfigFacts>,
    /// When each pool's children handed out their recent blocks, oldest first.
    handed_out: HashMap<String, VecDeque<Duration>>,
    /// Carved children not yet accepting: their pool, and when the carve was decided.
    scale_started: HashMap<String, (String, Duration)>,
    /// Inputs handled so far: orders create answers against config lists.
    step: u64,
    /// The step at which the config list in progress started.
    configs_list_step: u64,
    effects: Vec<Effect>,
}

impl Machine {
    pub fn new(options: Options) -> Self {
        let mut ipam = Ipam::new();
        ipam.set_service_cidrs(SERVICE_FLAG_SOURCE, options.service_cidrs.clone());
        let outputs = options
            .outputs
            .iter()
            .map(|(target, kind)| Output {
                target: target.clone(),
                kind: *kind,
                seen: None,
                listed: false,
            })
            .collect();
        Machine {
            options,
            now: Now::default(),
            ipam,
            synced: false,
            listed: HashSet::new(),
            relist: HashMap::new(),
            pending: BTreeMap::new(),
            configs: BTreeMap::new(),
            written: HashMap::new(),
            dirty: BTreeSet::new(),
            unmanaged_dirty: false,
            reported: HashSet::new(),
            invalid_reported: HashSet::new(),
            outputs,
            network_sent: None,
            network_in_flight: Vec::new(),
            network_seq: 0,
            network_landed: None,
            rereads_due: BTreeMap::new(),
            status_in_flight: HashMap::new(),
            status_landed: HashMap::new(),
            status_sent_at: HashMap::new(),
            network_dirty: true,
            pools: BTreeMap::new(),
            carves: BTreeMap::new(),
            retiring: BTreeMap::new(),
            empty_since: HashMap::new(),
            pool_written: HashMap::new(),
            scale_started: HashMap::new(),
            handed_out: HashMap::new(),
            facts: HashMap::new(),
            step: 0,
            configs_list_step: 0,
            effects: Vec::new(),
        }
    }

    /// Takes one fact at `now`; returns what to do about it.
    pub fn handle(&mut self, now: Now, input: Input) -> Vec<Effect> {
        self.now = now;
        self.step += 1;
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
                |m, s| m.on_service(&s),
                |m, s| m.on_service_gone(&s.name_any()),
            ),
            Input::Pool(w) => match w {
                Watch::ListStart => self.list_started(Source::Pools),
                Watch::Listed(p) => {
                    self.list_saw(Source::Pools, p.name.clone());
                    self.on_pool(p);
                }
                Watch::Applied(p) => self.on_pool(p),
                Watch::Deleted(p) => self.on_pool_gone(&p.name),
                Watch::ListDone => self.list_done(Source::Pools),
            },
            Input::ConfigCreated { config, outcome } => self.on_config_created(&config, outcome),
            Input::ConfigDeleted { name, uid, outcome } => {
                self.on_config_deleted(&name, uid.as_deref(), outcome);
            }
            Input::Output(i, w) => self.on_output_watch(i, w),
            Input::Reread { node, uid, now } => self.on_reread(&node, uid.as_deref(), now),
            Input::Written(result) => self.on_write_result(result),
            Input::ConfigWritten(job) => self.on_config_written(&job),
            Input::Published(network) => self.on_published(&network),
            Input::Tick => {
                self.request_finalizers();
                self.reread_due();
                self.wake_parked();
                self.warn_long_waits();
                self.flush_status();
                self.scale_pools();
                self.publish_network();
            }
            Input::Resync => {
                if self.synced {
                    self.retry_pending();
                }
            }
        }
        // What consumers must learn goes out now, not at the next tick: a new range (a carve
        // above all) hands out nothing before it is published. Only content changes are sent.
        if self.network_dirty {
            self.publish_network();
        }
        // Gauges that follow the state are set after every step so they are never stale.
        self.effects
            .push(Effect::Metric(Metric::Pending(self.pending.len())));
        std::mem::take(&mut self.effects)
    }

    /// Whether everything has been read once: only then is anything allocated.
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The allocation state, for the simulator's checks and for logs.
    pub fn ipam(&self) -> &Ipam {
        &self.ipam
    }

    /// How many nodes wait for a block.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Carves asked for and not yet seen as configs, for the simulator's checks.
    pub fn carves_in_flight(&self) -> usize {
        self.carves.len()
    }

    /// The configs this machine knows, for `retry_pending` benches and checks.
    pub fn config_count(&self) -> usize {
        self.configs.len()
    }

    fn push(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    fn note(&mut self, note: Note) {
        self.push(Effect::Note(note));
    }

    fn metric(&mut self, metric: Metric) {
        self.push(Effect::Metric(metric));
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
        match w {
            Watch::ListStart => {
                if let Some(o) = self.outputs.get_mut(index) {
                    o.listed = false;
                }
            }
            Watch::Listed(cm) | Watch::Applied(cm) => {
                self.on_output(index, Some(&cm.data.unwrap_or_default()));
            }
            Watch::Deleted(_) => self.on_output(index, None),
            Watch::ListDone => {
                // Listed without the object: it does not exist, and holds nothing.
                if self.outputs.get(index).is_some_and(|o| !o.listed) {
                    self.on_output(index, None);
                }
                self.list_done(Source::Output(index));
            }
        }
    }

    fn list_started(&mut self, source: Source) {
        if source == Source::Configs {
            self.configs_list_step = self.step;
        }
        self.relist.insert(source, HashSet::new());
    }

    fn list_saw(&mut self, source: Source, name: String) {
        self.relist.entry(source).or_default().insert(name);
    }

    fn list_done(&mut self, source: Source) {
        let seen = self.relist.remove(&source).unwrap_or_default();
        self.on_relisted(source, &seen);
        self.listed.insert(source);
        let needed = 2
            + self.outputs.len()
            + usize::from(self.options.service_cidr_api)
            + usize::from(self.options.pools);
        if !self.synced && self.listed.len() >= needed {
            self.on_synced();
        }
    }

    /// Everything is read: only now may anything be allocated.
    fn on_synced(&mut self) {
        self.synced = true;
        info!(
            nodes = self.ipam.node_count(),
            configs = self.configs.len(),
            pending = self.pending.len(),
            "allocation state rebuilt from the API"
        );
        self.unmanaged_dirty = true;
        self.dirty.extend(self.configs.keys().cloned());
        self.retry_pending();
        self.flush_status();
    }

    /// After a (re)list, what we know but the list lacks may be gone. Nodes are confirmed with
    /// a fresh GET before their blocks are released: a watch may lag, a GET does not.
    fn on_relisted(&mut self, source: Source, seen: &HashSet<String>) {
        match source {
            Source::Nodes => {
                let missing: Vec<(String, Option<String>)> = self
                    .ipam
                    .node_names()
                    .chain(self.pending.keys().map(String::as_str))
                    .filter(|n| !seen.contains(*n))
                    .map(|n| {
                        let uid = match self.ipam.node(n) {
                            Some(r) => r.uid.clone(),
                            None => self.pending.get(n).and_then(|p| p.uid.clone()),
                        };
                        (n.to_string(), uid)
                    })
                    .collect();
                // A leaked write's node deleted while the watch was down: only a GET tells.
                let leaked: Vec<(String, Option<String>)> = self
                    .ipam
                    .leaked_nodes()
                    .filter(|(n, _)| !seen.contains(*n))
                    .filter(|(n, _)| !missing.iter().any(|(m, _)| m == n))
                    .map(|(n, uid)| (n.to_string(), uid.map(str::to_string)))
                    .collect();
                for (node, uid) in missing.into_iter().chain(leaked) {
                    self.push(Effect::Reread { node, uid });
                }
            }
            Source::Configs => {
                let gone: Vec<String> = self
                    .configs
                    .keys()
                    .filter(|n| !seen.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    self.on_config_gone(&name);
                }
                // A child created before this list started and not in it is gone again
                // (its create and delete both fell between two lists).
                let started = self.configs_list_step;
                self.carves.retain(|name, c| {
                    c.sent > 0 || c.answered.is_none_or(|at| at >= started) || seen.contains(name)
                });
            }
            Source::Services => {
                let gone: Vec<String> = self
                    .ipam
                    .service_sources()
                    .filter_map(|s| s.strip_prefix("servicecidr/"))
                    .filter(|n| !seen.contains(*n))
                    .map(str::to_string)
                    .collect();
                for name in gone {
                    self.on_service_gone(&name);
                }
            }
            Source::Pools => {
                let gone: Vec<String> = self
                    .pools
                    .keys()
                    .filter(|n| !seen.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    self.on_pool_gone(&name);
                }
            }
            Source::Output(_) => {}
        }
    }

    /// A node missing from a relist, read again. `uid` is the object we asked about: a newer
    /// object of the same name keeps its blocks.
    fn on_reread(&mut self, node: &str, uid: Option<&str>, now: NodeNow) {
        match now {
            NodeNow::Gone => {
                self.on_node_gone(node, uid);
                self.settle_leaks(node, NodeSeen::Absent);
            }
            // Not known either way: ask again later, or its blocks stay held for good.
            NodeNow::Unknown(why) => {
                debug!(node, %why, "re-reading a node missing from the relist failed; retrying");
                let at = self.now.mono + REREAD_RETRY;
                self.rereads_due
                    .insert(node.to_string(), (uid.map(str::to_string), at));
            }
            NodeNow::Has { uid, cidrs } => {
                debug!(node, ?cidrs, "missing from the relist but still there");
                let seen = NodeSeen::Object {
                    uid: uid.as_deref(),
                    cidrs: &cidrs,
                };
                self.settle_leaks(node, seen);
            }
            NodeNow::Empty { uid, .. } => {
                debug!(node, "missing from the relist but still there");
                let seen = NodeSeen::Object {
                    uid: uid.as_deref(),
                    cidrs: &[],
                };
                self.settle_leaks(node, seen);
            }
        }
    }

    /// Re-reads that failed are asked again once their time comes.
    fn reread_due(&mut self) {
        let now = self.now.mono;
        let due: Vec<String> = self
            .rereads_due
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for node in due {
            if let Some((uid, _)) = self.rereads_due.remove(&node) {
                self.push(Effect::Reread { node, uid });
            }
        }
    }

    // ----- nodes -----

    fn on_node(&mut self, node: IpamNode) {
        let name = node.name_any();
        if self.options.panic_on_node.as_deref() == Some(name.as_str()) {
            // A bug in the loop itself, for the supervision tests.
            panic!("injected fault: panic on node {name}");
        }
        let uid = node.uid();
        match node.cidrs() {
            Ok(cidrs) if cidrs.is_empty() => {
                let version = node.metadata.resource_version.clone();
                self.on_empty_node(name, uid, version, node.labels().clone());
            }
            Ok(cidrs) => self.on_node_with_cidrs(&name, uid.as_deref(), &cidrs),
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
                    self.note(note);
                }
            }
        }
    }

    fn on_node_with_cidrs(&mut self, name: &str, uid: Option<&str>, cidrs: &[IpNet]) {
        self.pending.remove(name);
        // The same object as before: a new object under the same name (seen in a relist)
        // must take over the record, or its deletion would never free the blocks.
        let unchanged = self.ipam.node(name).is_some_and(|r| {
            r.cidrs == cidrs && r.phase == Phase::Held && (uid.is_none() || r.uid.as_deref() == uid)
        });
        if !unchanged {
            self.adopt(name, uid, cidrs);
        }
        // After the adoption: leaked blocks that landed are the node's now, not free.
        self.settle_leaks(name, NodeSeen::Object { uid, cidrs });
    }

    fn adopt(&mut self, name: &str, uid: Option<&str>, cidrs: &[IpNet]) {
        let adoption = self.ipam.observe_node(name, uid, cidrs);
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
            self.note(about_this);
            self.note(about_other);
        }
        if !adoption.unmanaged.is_empty() {
            self.unmanaged_dirty = true;
        }
        self.touch(cidrs);
        if !adoption.released.is_empty() {
            self.touch(&adoption.released);
            self.retry_pending_near(&adoption.released);
        }
    }

    fn on_empty_node(
        &mut self,
        name: String,
        uid: Option<String>,
        version: Option<String>,
        labels: BTreeMap<String, String>,
    ) {
        match self.ipam.node(&name).map(|r| r.uid.clone()) {
            // Our write is in flight or landed and the watch lags: nothing to do.
            Some(old) if uid.is_none() || old.is_none() || old == uid => return,
            // A new object under an old name: the old one is gone.
            Some(old) => {
                let freed = self.ipam.node_gone(&name, old.as_deref());
                self.freed(&freed);
            }
            None => {}
        }
        let (warned, waiting_since, retry_at) =
            self.pending.get(&name).map_or((false, None, None), |p| {
                (p.warned, p.waiting_since, p.retry_at)
            });
        let node = PendingNode {
            uid,
            version,
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
        self.settle_leaks(&name, seen);
        if self.synced {
            self.try_allocate(&name);
        }
    }

    fn on_node_gone(&mut self, name: &str, uid: Option<&str>) {
        if self
            .pending
            .get(name)
            .is_some_and(|p| uid.is_none() || p.uid.is_none() || p.uid.as_deref() == uid)
        {
            self.pending.remove(name);
        }
        self.reported.retain(|(n, _)| n != name);
        self.invalid_reported.remove(name);
        let freed = self.ipam.node_gone(name, uid);
        if !freed.is_empty() {
            debug!(node = %name, ?freed, "node gone: blocks released");
            self.freed(&freed);
        }
        self.settle_leaks(name, NodeSeen::Deleted { uid });
    }

    /// Leaks of `name` that what was just seen proves can no longer land end (the rule is in
    /// `ipam`'s module doc): their config no longer waits for them, and their blocks are free
    /// unless the node holds them now.
    fn settle_leaks(&mut self, name: &str, seen: NodeSeen<'_>) {
        let ended = self.ipam.settle_leaks(name, seen);
        if ended.is_empty() {
            return;
        }
        info!(node = %name, ?ended, "leaked blocks settled: the write can no longer land");
        self.metric(Metric::Leaked(self.ipam.leaked_blocks()));
        self.touch(&ended);
        let freed: Vec<IpNet> = ended
            .into_iter()
            .filter(|c| !self.ipam.is_held(c))
            .collect();
        self.freed(&freed);
    }

    fn freed(&mut self, cidrs: &[IpNet]) {
        for c in cidrs {
            let range = self
                .ipam
                .owner_of(c)
                .and_then(|o| self.ipam.config_range(o, c));
            if let Some(range) = range {
                self.metric(Metric::Released(range));
            }
        }
        self.touch(cidrs);
        self.unmanaged_dirty = true;
        self.retry_pending_near(cidrs);
    }

    /// Tries again the pending nodes that a config whose range holds one of `cidrs` serves:
    /// capacity appeared there and nowhere else.
    fn retry_pending_near(&mut self, cidrs: &[IpNet]) {
        let configs: BTreeSet<String> = cidrs
            .iter()
            .flat_map(|c| self.ipam.configs_touching(c))
            .collect();
        self.retry_pending_for(&configs);
    }

    /// Tries again the pending nodes one of `configs` selects: an event that changed only
    /// those costs pending × |configs| selector checks, not pending × every config.
    fn retry_pending_for(&mut self, configs: &BTreeSet<String>) {
        if !self.synced || configs.is_empty() {
            return;
        }
        let selectors: Vec<Option<&NodeSelector>> = configs
            .iter()
            .filter_map(|c| self.configs.get(c))
            .map(|s| s.base.selector.as_ref())
            .collect();
        let names: Vec<String> = self
            .pending
            .iter()
            .filter(|(name, p)| {
                let node = NodeView {
                    name,
                    labels: &p.labels,
                };
                selectors
                    .iter()
                    .any(|s| selection::match_score(*s, node).is_some())
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in names {
            self.try_allocate(&name);
        }
    }

    /// Marks the configs whose ranges `cidrs` touch for a status update.
    fn touch(&mut self, cidrs: &[IpNet]) {
        for c in cidrs {
            self.dirty.extend(self.ipam.configs_touching(c));
        }
    }

    fn try_allocate(&mut self, name: &str) {
        let Some(p) = self.pending.get(name) else {
            return;
        };
        if p.retry_at.is_some_and(|at| at > self.now.mono) {
            return;
        }
        let (uid, version, labels) = (p.uid.clone(), p.version.clone(), p.labels.clone());
        match self.ipam.allocate(name, uid.as_deref(), &labels) {
            Ok(a) => {
                self.pending.remove(name);
                self.empty_since.remove(&a.config);
                if let Some(pool) = self.child_pool(&a.config).map(str::to_string) {
                    self.handed_out
                        .entry(pool)
                        .or_default()
                        .push_back(self.now.mono);
                }
                debug!(node = %name, config = %a.config, cidrs = ?a.cidrs, "allocated");
                for c in &a.cidrs {
                    if let Some(range) = self.ipam.config_range(&a.config, c) {
                        self.metric(Metric::Allocated(range));
                    }
                }
                self.touch(&a.cidrs);
                self.push(Effect::Write(WriteJob {
                    node: name.to_string(),
                    uid,
                    version,
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
                let growing = self.pool_may_grow(name, &labels);
                self.not_allocated(name, uid.as_deref(), &e, growing);
            }
        }
    }

    /// A node that got no block is warned once, unless it only waits behind gates that
    /// usually open within moments, for a pool that is growing (`growing`), or for the first
    /// config (a first install applies the controller and its configs together): then only
    /// once it has waited `GATE_GRACE`.
    fn not_allocated(&mut self, name: &str, uid: Option<&str>, e: &AllocateError, growing: bool) {
        let now = self.now.mono;
        let first_config_due = self.configs.is_empty() && *e == AllocateError::NoMatchingConfig;
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
        self.note(note);
    }

    /// Nodes that have waited behind a gate for `GATE_GRACE` are tried again, to warn them.
    fn warn_long_waits(&mut self) {
        let now = self.now.mono;
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
            self.try_allocate(&name);
        }
    }

    /// Tries every pending node again: capacity may have appeared.
    fn retry_pending(&mut self) {
        let names: Vec<String> = self.pending.keys().cloned().collect();
        for name in names {
            self.try_allocate(&name);
        }
    }

    /// Nodes whose writes we gave up on are tried again, from scratch, once their time comes.
    fn wake_parked(&mut self) {
        if !self.synced {
            return;
        }
        let now = self.now.mono;
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
            self.try_allocate(&name);
        }
    }

    // ----- write outcomes -----

    fn on_write_result(&mut self, result: WriteResult) {
        let WriteResult { job, outcome } = result;
        let current = matches!(
            self.ipam.node(&job.node).map(|r| r.phase),
            Some(Phase::Writing { ticket, .. }) if ticket == job.ticket
        );
        if !current {
            debug!(node = %job.node, "stale write outcome ignored");
            return;
        }
        let decision = decide(&outcome, &job.cidrs, job.uid.as_deref(), job.was_ambiguous);
        debug!(node = %job.node, ?outcome, ?decision, "write outcome");
        match decision {
            Decision::Confirm { uid } => {
                self.ipam.confirm(&job.node, job.ticket, uid.as_deref());
                if self.ipam.node(&job.node).is_none() {
                    // It landed on an object deleted meanwhile.
                    self.freed(&job.cidrs);
                }
                self.touch(&job.cidrs);
            }
            Decision::Adopt { uid, cidrs } => {
                let adoption = self.ipam.observe_node(&job.node, uid.as_deref(), &cidrs);
                self.touch(&cidrs);
                self.freed(&adoption.released);
            }
            Decision::Release => {
                let freed = self.ipam.abandon(&job.node, job.ticket);
                self.freed(&freed);
            }
            Decision::Leak => {
                let leaked = self.leak(&job);
                error!(node = %job.node, ?leaked, "write outcome unknowable: blocks kept occupied, and their config held, until the write can no longer land");
            }
            Decision::Retry => return self.retry_write(job, &outcome),
        }
        // The record is resolved; a newer object of the same name may be waiting.
        if self.pending.contains_key(&job.node) {
            self.try_allocate(&job.node);
        }
    }

    /// The same blocks again, unless the API server refused them too often.
    fn retry_write(&mut self, job: WriteJob, outcome: &WriteOutcome) {
        let ambiguous = job.was_ambiguous || matches!(outcome, WriteOutcome::Ambiguous { .. });
        // A conflict is the Node changing under us, not a refusal of the blocks.
        let rejected = matches!(outcome, WriteOutcome::Rejected { .. });
        let rejections = job.rejections + u32::from(rejected);
        let why = match outcome {
            WriteOutcome::Rejected { reason, .. }
            | WriteOutcome::Conflict { reason, .. }
            | WriteOutcome::Ambiguous { reason, .. } => reason.clone(),
            other => format!("{other:?}"),
        };
        if let Some((source, range)) = job
            .cidrs
            .iter()
            .find_map(|c| self.ipam.service_range_over(c))
        {
            return self.choose_again(
                job,
                ambiguous,
                &format!("{range} is now a Service range ({source})"),
            );
        }
        if rejected && rejections >= self.options.write_attempts.max(1) {
            return self.give_up(job, rejections, ambiguous, &why);
        }
        let attempt = job.attempt + 1;
        if attempt == 3 {
            let message = format!(
                "writing podCIDRs {:?} keeps failing: {why}; retrying",
                job.cidrs
            );
            let note = Note::node(
                &job.node,
                job.uid.as_deref(),
                true,
                effects::CIDR_ASSIGNMENT_FAILED,
                message,
            );
            self.note(note);
        }
        warn!(node = %job.node, attempt, ?outcome, "podCIDR write did not land; retrying the same blocks");
        self.metric(Metric::Error("node_write"));
        // The same blocks, on the version of the Node read since, if one was.
        let version = match outcome {
            WriteOutcome::Rejected { now, .. }
            | WriteOutcome::Conflict { now, .. }
            | WriteOutcome::Ambiguous { now, .. } => match now {
                NodeNow::Empty { version, .. } => version.clone().or(job.version.clone()),
                _ => job.version.clone(),
            },
            _ => job.version.clone(),
        };
        self.push(Effect::Write(WriteJob {
            attempt,
            rejections,
            was_ambiguous: ambiguous,
            version,
            ..job
        }));
    }

    /// The blocks were chosen before something made them wrong (a Service range created over
    /// them): rather than write them again, let them go and choose again. Only if an earlier
    /// attempt was ambiguous may they be on the node already; then they stay occupied, and a
    /// new choice that finds them there adopts them.
    fn choose_again(&mut self, job: WriteJob, ambiguous: bool, why: &str) {
        info!(node = %job.node, cidrs = ?job.cidrs, reason = why, "not writing these blocks again; choosing new ones");
        if ambiguous {
            self.leak(&job);
        } else {
            let freed = self.ipam.abandon(&job.node, job.ticket);
            self.touch(&freed);
            self.unmanaged_dirty = true;
        }
        let again = PendingNode {
            uid: job.uid,
            version: job.version,
            labels: job.labels,
            warned: false,
            waiting_since: None,
            retry_at: None,
        };
        self.repend(&job.node, again);
        if self.synced {
            self.try_allocate(&job.node);
        }
    }

    /// The API server refused every write of these blocks (an admission policy on Nodes, a
    /// 403): stop, free the blocks so a Terminating config can drain, and try the node again
    /// from scratch later. Refused writes changed nothing; only if an earlier attempt was
    /// ambiguous might the blocks be on the node, and then they stay occupied.
    fn give_up(&mut self, job: WriteJob, rejections: u32, ambiguous: bool, why: &str) {
        let after = self.options.retry_rejected_after;
        if ambiguous {
            self.leak(&job);
        } else {
            let freed = self.ipam.abandon(&job.node, job.ticket);
            self.touch(&freed);
            self.unmanaged_dirty = true;
        }
        self.metric(Metric::AssignmentFailure);
        self.metric(Metric::Error("node_write"));
        warn!(node = %job.node, rejections, reason = %why, "podCIDR write refused every time: gave up; the node is tried again later");
        let message = format!(
            "gave up writing podCIDRs {:?} after {rejections} refused attempts: {why}; {} and the node is tried again in {}s",
            job.cidrs,
            if ambiguous {
                "the blocks stay reserved (an earlier attempt may have landed)"
            } else {
                "the blocks are released"
            },
            after.as_secs()
        );
        let note = Note::node(
            &job.node,
            job.uid.as_deref(),
            true,
            effects::CIDR_ASSIGNMENT_FAILED,
            message,
        );
        self.note(note);
        let parked = PendingNode {
            uid: job.uid,
            version: job.version,
            labels: job.labels,
            warned: true,
            waiting_since: None,
            retry_at: Some(self.now.mono + after),
        };
        self.repend(&job.node, parked);
        if self.synced {
            self.retry_pending();
        }
    }

    /// The node of a write we stopped waits again, unless a newer object of the same name
    /// already waits in its place (the UID precondition keeps the old one's writes off it).
    fn repend(&mut self, name: &str, node: PendingNode) {
        let newer = self
            .pending
            .get(name)
            .is_some_and(|p| p.uid.is_some() && p.uid != node.uid);
        if !newer {
            self.pending.insert(name.to_string(), node);
        }
    }

    /// Keeps a write's blocks occupied, and their config held, until the write can no longer
    /// land, rather than risk a duplicate.
    fn leak(&mut self, job: &WriteJob) -> Vec<IpNet> {
        let leaked = self.ipam.leak(&job.node, job.ticket);
        self.metric(Metric::Leaked(self.ipam.leaked_blocks()));
        self.touch(&leaked);
        leaked
    }

    // ----- configs -----

    fn on_config(&mut self, obj: NodeIPAMConfig) {
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
            self.forget_config(&name);
        }
        let finalizer_requested = previous
            .as_ref()
            .is_some_and(|p| p.finalizer_requested && !has_finalizer);
        // The carve that made it is done (only if it is that carve's child: an object of
        // another owner under the name, such as an old pool's child on its way out, is not);
        // a delete of ours shows as deleting (or a new object).
        let owner_uid = obj
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "NodeIPAMPool")
            .map(|o| o.uid.clone());
        if let Some(c) = self.carves.get_mut(&name).filter(|c| {
            obj.labels().get(scaling::POOL_LABEL) == Some(&c.pool)
                && (c.pool_uid.is_none() || owner_uid == c.pool_uid)
        }) {
            c.seen = true;
            if c.sent == 0 {
                self.carves.remove(&name);
            }
        }
        if deleting
            || self
                .retiring
                .get(&name)
                .is_some_and(|u| u.is_some() && *u != obj.uid())
        {
            self.retiring.remove(&name);
        }
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
        };
        if !has_finalizer && !deleting && !seen.finalizer_requested {
            seen.finalizer_requested = true;
            self.push(Effect::Config(ConfigJob::AddFinalizer {
                name: name.clone(),
            }));
        }
        // A status that is not the one we wrote was edited by someone else (or predates us):
        // the object, not our memory of the write, is what the next flush compares with.
        if self
            .written
            .get(&name)
            .is_some_and(|w| Some(w) != seen.status.as_ref())
        {
            self.written.remove(&name);
        }
        seen.drain_gate = self.drain_gate(&name, &seen);
        let gates = |s: &ConfigSeen| (s.has_finalizer, s.drain_gate);
        let before = previous.map(|p| (gates(&p), p.base));
        let unchanged = before.as_ref() == Some(&(gates(&seen), seen.base.clone()));
        self.configs.insert(name.clone(), seen);
        self.dirty.insert(name.clone());
        if unchanged {
            // Only status or metadata moved (our own status write, most often): nothing that
            // allocation or other configs depend on.
            return;
        }
        let input = self.gated(&name);
        let open = input.gate.is_none();
        self.ipam.upsert_config(input);
        if open {
            self.scaled_up(&name);
        }
        // Overlaps and which config owns a block (so every config's Ready and counts) may
        // change with any config.
        self.dirty.extend(self.configs.keys().cloned());
        self.unmanaged_dirty = true;
        self.network_dirty = true;
        if self.synced {
            self.retry_pending();
        }
    }

    /// What is remembered of our writes to a config object that is gone.
    fn forget_config(&mut self, name: &str) {
        self.written.remove(name);
        self.status_in_flight.remove(name);
        self.status_landed.remove(name);
        self.status_sent_at.remove(name);
    }

    fn on_config_gone(&mut self, name: &str) {
        info!(config = %name, "NodeIPAMConfig gone");
        self.metric(Metric::ConfigGone(name.to_string()));
        self.configs.remove(name);
        self.forget_config(name);
        self.retiring.remove(name);
        self.empty_since.remove(name);
        self.facts.remove(name);
        self.scale_started.remove(name);
        self.ipam.remove_config(name);
        self.network_dirty = true;
        // Its blocks are the next oldest config's now (and overlaps may be gone): every
        // status is counted again.
        self.dirty.extend(self.configs.keys().cloned());
        self.unmanaged_dirty = true;
        if self.synced {
            self.retry_pending();
        }
    }

    // ----- Service CIDRs -----

    fn on_service(&mut self, obj: &ServiceCIDR) {
        let name = obj.name_any();
        let cidrs: Vec<IpNet> = obj
            .spec
            .as_ref()
            .and_then(|s| s.cidrs.clone())
            .unwrap_or_default()
            .iter()
            .filter_map(|c| c.parse::<IpNet>().ok())
            .collect();
        self.ipam
            .set_service_cidrs(&format!("servicecidr/{name}"), cidrs.clone());
        self.touch(&cidrs);
        // An update may also have freed blocks (a range removed from the object).
        self.dirty.extend(self.configs.keys().cloned());
        if self.synced {
            self.retry_pending();
        }
    }

    fn on_service_gone(&mut self, name: &str) {
        self.ipam
            .set_service_cidrs(&format!("servicecidr/{name}"), Vec::new());
        self.dirty.extend(self.configs.keys().cloned());
        if self.synced {
            self.retry_pending();
        }
    }

    // ----- pools -----

    fn on_pool(&mut self, pool: PoolInput) {
        let name = pool.name.clone();
        let previous = self.pools.remove(&name);
        let same_object = previous
            .as_ref()
            .is_none_or(|p| p.input.uid.is_none() || p.input.uid == pool.uid);
        if !same_object {
            // Another object under the same name: the old one's carves and status are moot.
            self.carves.retain(|_, c| c.pool != name);
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

    fn on_pool_gone(&mut self, name: &str) {
        info!(pool = %name, "NodeIPAMPool gone; its children go with it (ownerReference)");
        self.pools.remove(name);
        self.carves.retain(|_, c| c.pool != name);
        self.pool_written.remove(name);
        self.scale_started.retain(|_, (pool, _)| pool != name);
        self.handed_out.remove(name);
        self.metric(Metric::PoolGone(name.to_string()));
        if self.synced {
            // Nodes that waited for it without a warning get one now.
            self.retry_pending();
        }
    }

    fn on_config_created(&mut self, config: &ChildConfig, outcome: CreateOutcome) {
        match outcome {
            CreateOutcome::Created | CreateOutcome::AlreadyExists => {
                if outcome == CreateOutcome::AlreadyExists {
                    info!(pool = %config.pool, config = %config.name, "child config already exists (a retry, or another leader's)");
                }
                let (step, now) = (self.step, self.now.mono);
                // Only the carve the create was for: a late answer to an old pool's create
                // of the same name says nothing about this one.
                if let Some(c) = self
                    .carves
                    .get_mut(&config.name)
                    .filter(|c| c.pool_uid == config.pool_uid)
                {
                    c.answered = Some(step);
                    c.answered_at = now;
                    c.failed = false;
                    c.failures = 0;
                    c.sent = c.sent.saturating_sub(1);
                }
            }
            CreateOutcome::Failed(why) => {
                warn!(pool = %config.pool, config = %config.name, reason = %why, "creating a child config failed; asking again");
                self.metric(Metric::Error("config_create"));
                let now = self.now.mono;
                let mut tell = None;
                if let Some(c) = self
                    .carves
                    .get_mut(&config.name)
                    .filter(|c| c.pool_uid == config.pool_uid)
                {
                    c.failed = !c.seen;
                    c.sent = c.sent.saturating_sub(1);
                    c.failures += 1;
                    // 0.5 s, 1 s, 2 s ... at most a minute between attempts.
                    let backoff = Duration::from_millis(250u64 << c.failures.min(8));
                    c.retry_at = now + backoff.min(Duration::from_secs(60));
                    if c.failures == 3 {
                        tell = Some(format!(
                            "creating NodeIPAMConfig {} keeps failing: {why}; retrying",
                            config.name
                        ));
                    }
                }
                if let Some(message) = tell {
                    let uid = config.pool_uid.as_deref();
                    let note = Note::pool(
                        &config.pool,
                        uid,
                        true,
                        effects::RANGE_CARVE_FAILED,
                        message,
                    );
                    self.note(note);
                }
            }
        }
        if self
            .carves
            .get(&config.name)
            .is_some_and(|c| c.seen && c.sent == 0)
        {
            self.carves.remove(&config.name);
        }
    }

    fn on_config_deleted(&mut self, name: &str, uid: Option<&str>, outcome: DeleteOutcome) {
        if self.retiring.get(name).is_none_or(|u| u.as_deref() != uid) {
            return;
        }
        match outcome {
            // The watch shows it deleting soon; until then it stays held back.
            DeleteOutcome::Deleted => return,
            DeleteOutcome::Gone => {}
            DeleteOutcome::Failed(why) => {
                warn!(config = %name, reason = %why, "retiring a pool's child config failed; deciding again");
                self.metric(Metric::Error("config_delete"));
            }
        }
        self.retiring.remove(name);
        if self.configs.contains_key(name) {
            self.regate();
        }
    }

    /// Blocks `pool`'s children handed out within the last [`DEMAND_WINDOW`].
    fn demand(&mut self, pool: &str) -> u64 {
        let since = self.now.mono.saturating_sub(DEMAND_WINDOW);
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
    fn child_pool(&self, config: &str) -> Option<&str> {
        let seen = self.configs.get(config)?;
        let pool = seen.base.pool.as_deref()?;
        let p = self.pools.get(pool)?;
        (p.input.uid.is_none() || seen.owner_uid == p.input.uid).then_some(pool)
    }

    /// The pool that will take a pending node, if any: the best matching one by its selector.
    fn pool_for<'a>(&'a self, node: NodeView<'_>) -> Option<&'a PoolSeen> {
        self.pools
            .values()
            .filter(|p| p.input.invalid.is_none() && !p.input.deleting)
            .filter_map(|p| selection::match_score(p.input.selector.as_ref(), node).map(|s| (s, p)))
            .max_by(|(sa, pa), (sb, pb)| sa.cmp(sb).then(pb.input.name.cmp(&pa.input.name)))
            .map(|(_, p)| p)
    }

    /// A pool that selects the node can still grow: its wait is not a shortage to warn about.
    fn pool_may_grow(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let node = NodeView { name, labels };
        self.pool_for(node).is_some_and(|p| p.room)
    }

    /// A carved child accepts allocations for the first time: how long scaling up took.
    fn scaled_up(&mut self, name: &str) {
        if let Some((pool, since)) = self.scale_started.remove(name) {
            let seconds = self.now.mono.saturating_sub(since).as_secs_f64();
            info!(pool = %pool, config = %name, seconds, "carved range accepts allocations");
            self.metric(Metric::ScaleUpSeconds { pool, seconds });
        }
    }

    /// Every pool's decision: carve, retire, status.
    fn scale_pools(&mut self) {
        if !self.synced || self.pools.is_empty() {
            return;
        }
        // A child created a while ago and still not seen: its watch events may have fallen
        // into a relist that answered before the create did. Ask again.
        let now = self.now.mono;
        for c in self.carves.values_mut() {
            if c.answered.is_some()
                && !c.seen
                && c.sent == 0
                && now.saturating_sub(c.answered_at) >= CARVE_RECHECK
            {
                c.answered = None;
                c.failed = true;
            }
        }
        let pending = self.pending_per_pool();
        let wall = Time(
            k8s_openapi::jiff::Timestamp::from_second(self.now.wall_seconds).unwrap_or_default(),
        );
        let names: Vec<String> = self.pools.keys().cloned().collect();
        for name in names {
            let waiting = pending.get(&name).copied().unwrap_or(0);
            self.scale_pool(&name, waiting, &wall);
        }
    }

    /// Creates that failed are asked again as they were, unless their range is taken by
    /// now (then the create cannot have landed: the webhook refuses an overlap) or the pool
    /// no longer has it in its budget.
    fn retry_failed_carves(&mut self, pool: &str, input: &PoolInput, occupied: &[IpNet]) {
        let failed: Vec<String> = self
            .carves
            .iter()
            .filter(|(_, c)| {
                c.pool == pool && c.failed && c.sent == 0 && !c.seen && c.retry_at <= self.now.mono
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in failed {
            let Some(c) = self.carves.get(&name) else {
                continue;
            };
            let in_budget = c
                .carve
                .ranges()
                .all(|r| input.budget().any(|b| b.contains(&r)));
            let clear = c
                .carve
                .ranges()
                .all(|r| !occupied.iter().any(|o| nets_overlap(o, &r)));
            if !in_budget || !clear || self.configs.contains_key(&name) {
                info!(pool, config = %name, "a failed carve is moot now; deciding again");
                self.carves.remove(&name);
                self.scale_started.remove(&name);
                continue;
            }
            let child = self.child_config(pool, input, &c.carve);
            if let Some(c) = self.carves.get_mut(&name) {
                c.failed = false;
                c.sent += 1;
            }
            self.push(Effect::CreateConfig(child));
        }
    }

    fn child_config(&self, pool: &str, input: &PoolInput, carve: &Carve) -> ChildConfig {
        ChildConfig {
            pool: pool.to_string(),
            pool_uid: input.uid.clone(),
            name: carve.name.clone(),
            ipv4: carve.ipv4.zip(input.ipv4.as_ref().map(|f| f.per_node_mask)),
            ipv6: carve.ipv6.zip(input.ipv6.as_ref().map(|f| f.per_node_mask)),
            selector: input.selector.clone(),
        }
    }

    /// Per pool, the pending nodes it would take that no other config can serve.
    fn pending_per_pool(&self) -> HashMap<String, u64> {
        if self.pending.is_empty() {
            return HashMap::new();
        }
        let others: Vec<&ConfigSeen> = self
            .configs
            .iter()
            .filter(|(name, _)| self.child_pool(name).is_none())
            .filter(|(name, _)| {
                self.config_facts(name).is_some_and(|f| {
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
        for (name, p) in &self.pending {
            let node = NodeView {
                name,
                labels: &p.labels,
            };
            let served = others
                .iter()
                .any(|c| selection::match_score(c.base.selector.as_ref(), node).is_some());
            if served {
                continue;
            }
            if let Some(pool) = self.pool_for(node) {
                *out.entry(pool.input.name.clone()).or_insert(0u64) += 1;
            }
        }
        out
    }

    /// A config's facts as of the last status flush, or counted now.
    fn config_facts(&self, name: &str) -> Option<super::ipam::ConfigFacts> {
        match self.facts.get(name) {
            Some(f) => Some(f.clone()),
            None => self.ipam.config_facts(name),
        }
    }

    fn child_view(&self, name: &str, seen: &ConfigSeen) -> ChildView {
        let facts = self.config_facts(name).unwrap_or_default();
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
            uid: seen.uid.clone(),
            ipv4: seen.base.ipv4.map(|(r, _)| r),
            ipv6: seen.base.ipv6.map(|(r, _)| r),
            enabled: seen.base.enabled,
            deleting: seen.deleting,
            usable: facts.invalid.is_none() && facts.overlap.is_none(),
            accepting: facts.accepting,
            allocated,
            free,
            held: facts.held(),
            empty_since: self.empty_since.get(name).copied(),
            retiring: self.retiring.contains_key(name),
        }
    }

    fn scale_pool(&mut self, name: &str, pending: u64, wall: &Time) {
        let Some(pool) = self.pools.get(name) else {
            return;
        };
        let input = pool.input.clone();
        let now = self.now.mono;
        let child_names: Vec<String> = self
            .configs
            .keys()
            .filter(|c| self.child_pool(c) == Some(name))
            .cloned()
            .collect();
        let mut children = Vec::with_capacity(child_names.len());
        for c in &child_names {
            let Some(seen) = self.configs.get(c) else {
                continue;
            };
            let mut view = self.child_view(c, seen);
            if !view.held {
                view.empty_since = Some(*self.empty_since.entry(c.clone()).or_insert(now));
            } else {
                self.empty_since.remove(c);
                view.empty_since = None;
            }
            children.push(view);
        }
        let mut occupied: Vec<IpNet> = self
            .configs
            .iter()
            .filter(|(c, _)| self.child_pool(c) != Some(name))
            .flat_map(|(_, s)| [s.base.ipv4, s.base.ipv6].into_iter().flatten())
            .map(|(r, _)| r)
            .collect();
        occupied.extend(
            self.pools
                .iter()
                .filter(|(n, _)| n.as_str() != name)
                .flat_map(|(_, p)| p.input.budget().copied()),
        );
        occupied.extend(self.ipam.service_ranges());
        occupied.extend(self.ipam.unmanaged().into_iter().map(|(c, _)| c));
        self.retry_failed_carves(name, &input, &occupied);
        let demand = self.demand(name);
        // A carve whose child is there counts as the child.
        let in_flight: Vec<Carve> = self
            .carves
            .iter()
            .filter(|(n, c)| c.pool == name && !child_names.contains(n))
            .map(|(_, c)| c.carve.clone())
            .collect();
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
                .filter(|c| self.configs.contains_key(&c.name))
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
            if self.configs.contains_key(&carve.name) {
                // Still taken after every attempt above: creating it would only find it there.
                debug!(pool = %name, config = %carve.name, "a config of another owner holds the child's name");
                continue;
            }
            let child = self.child_config(name, &input, carve);
            let ranges: Vec<String> = carve.ranges().map(|r| r.to_string()).collect();
            info!(pool = %name, config = %carve.name, ?ranges, pending, free, "carving a range");
            let message = format!(
                "carved {} as NodeIPAMConfig {}: {pending} node(s) wait, {free} block(s) free, headroom {}",
                ranges.join(" and "),
                carve.name,
                input.headroom
            );
            self.note(Note::pool(
                name,
                uid.as_deref(),
                false,
                effects::RANGE_CARVED,
                message,
            ));
            self.metric(Metric::RangeCarved {
                pool: name.to_string(),
            });
            self.push(Effect::CreateConfig(child));
            self.carves.insert(
                carve.name.clone(),
                CarveInFlight {
                    pool: name.to_string(),
                    pool_uid: uid.clone(),
                    carve: carve.clone(),
                    answered: None,
                    answered_at: Duration::ZERO,
                    failed: false,
                    sent: 1,
                    seen: false,
                    failures: 0,
                    retry_at: Duration::ZERO,
                },
            );
            self.scale_started
                .insert(carve.name.clone(), (name.to_string(), now));
        }
        for retire in &decision.retires {
            let ranges: Vec<String> = children
                .iter()
                .filter(|c| c.name == retire.name)
                .flat_map(|c| c.ipv4.into_iter().chain(c.ipv6))
                .map(|r| r.to_string())
                .collect();
            info!(pool = %name, config = %retire.name, ?ranges, "retiring an empty range");
            let message = format!(
                "retiring NodeIPAMConfig {} ({}): empty for {}s",
                retire.name,
                ranges.join(" and "),
                input.empty_for.as_secs()
            );
            self.note(Note::pool(
                name,
                uid.as_deref(),
                false,
                effects::RANGE_RETIRED,
                message,
            ));
            self.metric(Metric::RangeRetired {
                pool: name.to_string(),
            });
            self.retiring
                .insert(retire.name.clone(), retire.uid.clone());
            self.push(Effect::DeleteConfig {
                name: retire.name.clone(),
                uid: retire.uid.clone(),
            });
            // It hands out nothing from now on.
            let gated = self.gated(&retire.name);
            self.ipam.upsert_config(gated);
            self.dirty.insert(retire.name.clone());
        }
        for (type_, message) in &decision.turned_true {
            if *type_ == nodeipam_crd::CONDITION_EXHAUSTED {
                warn!(pool = %name, %message, "pool exhausted");
                self.note(Note::pool(
                    name,
                    uid.as_deref(),
                    true,
                    effects::POOL_EXHAUSTED,
                    message.clone(),
                ));
            }
        }
        let ranges = children.iter().filter(|c| c.active()).count() + decision.carves.len()
            - decision.retires.len();
        self.metric(Metric::PoolRanges {
            pool: name.to_string(),
            ranges: ranges as u64,
        });
        let current = self.pool_written.get(name).or(input.status.as_ref());
        if !input.deleting && current != Some(&decision.status) {
            self.push(Effect::PoolStatus {
                name: name.to_string(),
                uid: uid.clone(),
                status: decision.status.clone(),
            });
            self.pool_written
                .insert(name.to_string(), decision.status.clone());
        }
        let growing = decision.room || !in_flight.is_empty() || !decision.carves.is_empty();
        let was = self.pools.get(name).is_some_and(|p| p.room);
        if let Some(p) = self.pools.get_mut(name) {
            p.room = growing;
        }
        if was && !growing {
            // Nodes that waited for it without a warning get one now.
            let names: Vec<String> = self
                .pending
                .iter()
                .filter(|(n, p)| {
                    let node = NodeView {
                        name: n,
                        labels: &p.labels,
                    };
                    self.pool_for(node).is_some_and(|p| p.input.name == name)
                })
                .map(|(n, _)| n.clone())
                .collect();
            for n in names {
                self.try_allocate(&n);
            }
        }
    }

    // ----- status -----

    fn flush_status(&mut self) {
        if !self.synced {
            return;
        }
        // Before the flag is cleared below: unmanaged podCIDRs are part of the pod network.
        if !self.dirty.is_empty() || self.unmanaged_dirty {
            self.network_dirty = true;
        }
        if std::mem::take(&mut self.unmanaged_dirty) {
            self.report_unmanaged();
        }
        let now = Time(
            k8s_openapi::jiff::Timestamp::from_second(self.now.wall_seconds).unwrap_or_default(),
        );
        for name in std::mem::take(&mut self.dirty) {
            self.flush_config(&name, &now);
        }
    }

    fn report_unmanaged(&mut self) {
        let unmanaged = self.ipam.unmanaged();
        self.metric(Metric::Unmanaged(unmanaged.len()));
        for (cidr, node) in unmanaged {
            if self.reported.insert((node.clone(), cidr)) {
                warn!(node = %node, %cidr, "podCIDR lies in no NodeIPAMConfig: unmanaged, left as it is");
                let uid = self.ipam.node(&node).and_then(|r| r.uid.clone());
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
                self.note(note);
            }
        }
    }

    /// One config's status, its metrics and its finalizer, from the allocation state.
    fn flush_config(&mut self, name: &str, now: &Time) {
        let (Some(seen), Some(facts)) = (self.configs.get(name), self.ipam.config_facts(name))
        else {
            return;
        };
        let ranges = [seen.base.ipv4, seen.base.ipv6];
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
            .or(seen.status.as_ref())
            .map_or(&[], |s| s.conditions.as_slice());
        let (status, transitions) = desired_status(&facts, seen.generation, previous, now);
        self.facts.insert(name.to_string(), facts.clone());
        metrics.push(Metric::Status {
            config: name.to_string(),
            status: status.clone(),
        });
        // A landed status that says Drained holds allocation back until a later one lands.
        let undrain = says_drained(self.status_landed.get(name))
            && !says_drained(Some(&status))
            && self.status_in_flight.get(name).and_then(|l| l.last()) != Some(&status);
        let current = self.written.get(name).or(seen.status.as_ref());
        let unchanged = !undrain && current == Some(&status);
        // Counts alone wait for their time; the config stays dirty until then.
        let counts_wait = !undrain
            && current.is_some_and(|c| counts_only(c, &status))
            && self
                .status_sent_at
                .get(name)
                .is_some_and(|at| self.now.mono.saturating_sub(*at) < STATUS_COUNTS_EVERY);
        let (uid, deleting, has_finalizer) = (seen.uid.clone(), seen.deleting, seen.has_finalizer);
        for m in metrics {
            self.metric(m);
        }
        for t in transitions.iter().filter(|t| t.status == "True") {
            let (warning, reason) = match t.type_ {
                nodeipam_crd::CONDITION_DRAINED => (false, effects::DRAINED),
                nodeipam_crd::CONDITION_EXHAUSTED => (true, effects::EXHAUSTED),
                _ => continue,
            };
            info!(config = %name, reason, "condition turned True");
            let note = Note::config(name, uid.as_deref(), warning, reason, t.message.clone());
            self.note(note);
        }
        if !unchanged && counts_wait {
            self.dirty.insert(name.to_string());
        } else if !unchanged {
            self.status_sent_at.insert(name.to_string(), self.now.mono);
            self.push(Effect::Config(ConfigJob::Status {
                name: name.to_string(),
                uid: uid.clone(),
                status: status.clone(),
            }));
            let in_flight = self.status_in_flight.entry(name.to_string()).or_default();
            if in_flight.last() != Some(&status) {
                in_flight.push(status.clone());
            }
            self.written.insert(name.to_string(), status);
            self.update_drain_gate(name);
        }
        // The finalizer goes only when nothing holds, is being given or may still receive a
        // block.
        if deleting && has_finalizer && !facts.held() {
            self.push(Effect::Config(ConfigJob::RemoveFinalizer {
                name: name.to_string(),
                uid,
            }));
        }
    }

    /// Every config without our finalizer (and not being deleted) gets it asked for, once at
    /// a time.
    fn request_finalizers(&mut self) {
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
            self.push(Effect::Config(ConfigJob::AddFinalizer { name }));
        }
    }

    /// A config job is done. The config writer writes one job at a time, so a status reported
    /// written is what the object holds now (unless someone edits it later).
    fn on_config_written(&mut self, job: &ConfigJob) {
        // Done, but the object may have been another one by then: the next tick asks again
        // if the finalizer is still missing.
        if let ConfigJob::AddFinalizer { name } = job
            && let Some(seen) = self.configs.get_mut(name)
        {
            seen.finalizer_requested = false;
        }
        if let ConfigJob::Status { name, status, .. } = job {
            // What was sent before it landed before it or was replaced by a newer one.
            if let Some(in_flight) = self.status_in_flight.get_mut(name)
                && let Some(at) = in_flight.iter().rposition(|s| s == status)
            {
                in_flight.drain(..=at);
            }
            self.status_landed.insert(name.clone(), status.clone());
            self.update_drain_gate(name);
        }
    }

    /// Drained is a promise to consumers that no node holds a block from the config, and
    /// they may act on it (forget its ranges). So a config enabled again after it drained
    /// hands out nothing while any status that consumers may read says Drained: the one the
    /// watch shows, ours on its way, or ours landed while the watch still lags behind it.
    fn drain_gate(&self, name: &str, seen: &ConfigSeen) -> bool {
        says_drained(seen.status.as_ref())
            || self
                .status_in_flight
                .get(name)
                .is_some_and(|l| l.iter().any(|s| says_drained(Some(s))))
            || says_drained(self.status_landed.get(name))
    }

    fn update_drain_gate(&mut self, name: &str) {
        let Some(seen) = self.configs.get(name) else {
            return;
        };
        let gate = self.drain_gate(name, seen);
        if gate == seen.drain_gate {
            return;
        }
        if let Some(seen) = self.configs.get_mut(name) {
            seen.drain_gate = gate;
        }
        let input = self.gated(name);
        self.ipam.upsert_config(input);
        self.dirty.insert(name.to_string());
        if !gate {
            self.retry_pending_for(&BTreeSet::from([name.to_string()]));
        }
    }

    // ----- the published pod network -----

    /// Publishes the pod network when what consumers read changed. Drained configs leave it
    /// here, and only here, so a range leaves consumers' view only after its last node is gone.
    fn publish_network(&mut self) {
        if !self.synced || self.outputs.is_empty() || !std::mem::take(&mut self.network_dirty) {
            return;
        }
        let network = self.network();
        // What consumers read, not the counts beside it: a new node changes no output.
        let extra = &self.options.extra_non_masquerade;
        let desired: Vec<OutputContent> = self
            .outputs
            .iter()
            .map(|o| o.kind.desired(&network, extra))
            .collect();
        if self.network_sent.as_ref() != Some(&desired) {
            self.network_seq += 1;
            let seq = self.network_seq;
            self.push(Effect::Publish(PodNetwork { seq, ..network }));
            self.network_in_flight.push((seq, desired.clone()));
            self.network_sent = Some(desired);
        }
    }

    /// The pod network as the allocation state has it now.
    pub fn network(&self) -> PodNetwork {
        self.ipam.network()
    }

    /// A network is written. What was sent before it landed before it or was skipped.
    fn on_published(&mut self, network: &PodNetwork) {
        let extra = &self.options.extra_non_masquerade;
        let desired: Vec<OutputContent> = self
            .outputs
            .iter()
            .map(|o| o.kind.desired(network, extra))
            .collect();
        // The publisher writes in order and skips only what a newer network replaced, so this
        // one accounts for every publication sent before it, whatever their content.
        self.network_in_flight.retain(|(seq, _)| *seq > network.seq);
        self.network_landed = Some(desired);
        self.regate();
    }

    /// An output's ConfigMap changed (our write, a user's edit, a delete): gate allocation on
    /// what it holds now, and write it again when it is not what we last asked for.
    fn on_output(&mut self, index: usize, data: Option<&BTreeMap<String, String>>) {
        let Some(output) = self.outputs.get_mut(index) else {
            return;
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
            return;
        }
        output.seen = Some(content);
        self.regate();
    }

    /// Every config's gate again, after what consumers know changed.
    /// Only the configs whose gate moved change; only those whose gate opened can serve more.
    fn regate(&mut self) {
        let names: Vec<String> = self.configs.keys().cloned().collect();
        let mut opened = BTreeSet::new();
        for name in names {
            let input = self.gated(&name);
            let before = self.ipam.config_gate(&name);
            if before == Some(input.gate.as_deref()) {
                continue;
            }
            if input.gate.is_none() {
                opened.insert(name.clone());
            }
            self.ipam.upsert_config(input);
            self.dirty.insert(name);
        }
        for name in &opened {
            self.scaled_up(name);
        }
        self.retry_pending_for(&opened);
    }

    /// The config's input with the gates that hold back allocation: our finalizer must be on
    /// it (so it cannot vanish while nodes hold blocks), and consumers must know its ranges.
    fn gated(&self, name: &str) -> ConfigInput {
        let Some(seen) = self.configs.get(name) else {
            return ConfigInput {
                name: name.to_string(),
                ..ConfigInput::default()
            };
        };
        let mut input = seen.base.clone();
        if self.retiring.contains_key(name) {
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
        let behind: Vec<String> = self
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
                (!missing.is_empty())
                    .then(|| format!("ConfigMap {} includes {}", o.target, missing.join(", ")))
            })
            .collect();
        if !behind.is_empty() {
            input.gate = Some(format!("waiting until {}", behind.join(" and ")));
        }
        input
    }
}

fn says_drained(status: Option<&NodeIPAMConfigStatus>) -> bool {
    status.is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == nodeipam_crd::CONDITION_DRAINED && c.status == "True")
    })
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
        deleting: obj.meta().deletion_timestamp.is_some(),
        invalid,
        gate: None,
        provisional: !obj.finalizers().iter().any(|f| f == FINALIZER),
        pool: obj.labels().get(crate::pool::POOL_LABEL).cloned(),
    }
}

#[cfg(test)]
mod tests;
