//! The simulator: controller processes (a leader, a deposed leader whose writes still land, a
//! restarted one) around the model API server, driven by a list of actions. A seeded generator
//! makes the list; the run checks the invariants after every action, then lets the world calm
//! down and checks liveness against a freshly started machine.

pub mod leadership;
pub mod world;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use ipnet::IpNet;
use kube_core::DynamicObject;
use nodeipam_alloc::effects::{
    ChildConfig, ConfigJob, CreateOutcome, DeleteOutcome, EnableChild, EnableOutcome, WriteJob,
    WriteResult,
};
use nodeipam_alloc::fence::{self, PUBLISHED_BY, Send};
use nodeipam_alloc::fixtures;
use nodeipam_alloc::ipam::{Holder, nets_overlap};
use nodeipam_alloc::machine::{self, Effect, Input, Machine, Now};
use nodeipam_alloc::outcome::{NodeNow, WriteOutcome};
use nodeipam_alloc::outputs::{MANAGED_BY, holds_spec, stale};
use nodeipam_alloc::podnetwork::{PodNetwork, covered, ip_masq_agent_config};
use nodeipam_alloc::pool::{POOL_LABEL, PoolStatus, awaits_enable};
use nodeipam_crd::pool::{
    NodeIPAMPool, NodeIPAMPoolSpec, PoolFamilySpec, PoolHeadroom, PoolRanges, PoolScaleDown,
};
use nodeipam_crd::{Allocation, CONDITION_DRAINED, NodeIPAMConfig};
use serde::{Deserialize, Serialize};

use world::{Change, NodeObj, Patched, Stream, World, controller_uid, output};

/// How a podCIDR write fares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteFault {
    None,
    /// It landed but the answer was lost.
    LandedUnanswered,
    /// It never reached etcd and the answer was lost.
    LostUnanswered,
    /// An admission policy or RBAC refused it (403).
    Refused,
    Throttled,
    /// As `LostUnanswered`, and the GET after it failed too.
    LostUnreadable,
    /// Refused before it was sent (the term over, a hand-over begun): it never lands.
    NotSent,
    /// Stuck in the API server: unanswered, not landed yet (the GET shows the node as it was),
    /// and it may land at any later step (`Action::LandLate`) until the takeover delay of a new
    /// leader is over.
    LandsLate,
}

/// What a user (or another controller) does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum User {
    CreateNode {
        name: u8,
        pool_b: bool,
    },
    CreateUnmanagedNode {
        name: u8,
    },
    DeleteNode {
        pick: u8,
    },
    RecreateNode {
        pick: u8,
    },
    CreateConfig {
        menu: u8,
    },
    DeleteConfig {
        pick: u8,
    },
    ToggleConfig {
        pick: u8,
    },
    /// Toggles the config created last.
    ToggleNewest,
    /// Deletes the config created last.
    DeleteNewest,
    /// Creates again, as a new object, the config (not a pool's child) that went last.
    CreateAgain,
    SetService {
        name: u8,
        menu: u8,
    },
    DeleteService {
        name: u8,
    },
    EditOutput {
        index: u8,
        delete: bool,
    },
    EditStatus {
        pick: u8,
    },
    CreatePool {
        menu: u8,
    },
    EditPool {
        pick: u8,
        menu: u8,
    },
    DeletePool {
        pick: u8,
    },
}

/// How a pool job (a child's create, enable or delete, a pool's status) fares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolFault {
    None,
    /// Refused or lost before it landed.
    Failed,
    /// It landed but the answer was lost.
    LandedUnanswered,
    /// Sent and not answered: it may land at any later step (`Sent`). A create or delete is
    /// answered as failed; a status stays queued (the writer retries it).
    Stuck,
}

/// What a pool asked the driver for.
#[derive(Clone, Debug)]
enum PoolJob {
    Create(ChildConfig),
    /// A child created disabled, enabled at the version the decision saw.
    Enable(EnableChild),
    Delete {
        name: String,
        uid: Option<String>,
        only_awaiting: bool,
    },
    Status {
        name: String,
        uid: Option<String>,
        status: PoolStatus,
    },
}

/// A write other than a podCIDR one, sent and not answered (500 or a timeout): it may still
/// land at any later step (`Action::LandSent`), even after a successor started. Only the
/// precondition it was sent with (`fence`, or what the real writer tests) can stop it; each is
/// landed through the model API server as the writer sends it, even when it is answered.
#[derive(Clone, Debug)]
enum Sent {
    Status {
        name: String,
        patch: serde_json::Value,
    },
    Object {
        index: usize,
        name: String,
        object: Box<DynamicObject>,
        send: Send,
    },
    Delete {
        index: usize,
        name: String,
        at: (Option<String>, Option<String>),
    },
    /// Our finalizer added or removed: the JSON patch `finalizer_patch` made from the read.
    Finalizers {
        name: String,
        patch: serde_json::Value,
    },
    /// A pool's child: created by its deterministic name.
    Create(ChildConfig),
    /// A pool's child enabled: the JSON patch `fence::enable_patch` makes (the version and
    /// UID the decision saw tested, the marker removed, allocation Enabled).
    Enable {
        name: String,
        patch: serde_json::Value,
    },
    /// A pool's child deleted at the UID and resourceVersion read just before.
    ChildDelete {
        name: String,
        at: (Option<String>, Option<String>),
    },
    PoolStatus {
        name: String,
        uid: Option<String>,
        status: PoolStatus,
    },
}

/// The finalizer patch `config_writer.rs edit_finalizers` sends after its GET, or none when
/// it sends nothing: the test of the resourceVersion it read (and of the UID, for a removal),
/// then our finalizer added or taken off by its index.
fn finalizer_patch(
    world: &World,
    name: &str,
    add: bool,
    uid: Option<&str>,
) -> Option<serde_json::Value> {
    use serde_json::json;
    let current = world.configs.get(name)?;
    if uid.is_some() && current.metadata.uid.as_deref() != uid {
        return None;
    }
    let finalizers = current.metadata.finalizers.clone().unwrap_or_default();
    let index = finalizers.iter().position(|f| f == nodeipam_crd::FINALIZER);
    let rv = current
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let mut ops = vec![json!({ "op": "test", "path": "/metadata/resourceVersion", "value": rv })];
    if let Some(uid) = uid {
        ops.push(json!({ "op": "test", "path": "/metadata/uid", "value": uid }));
    }
    let deleting = current.metadata.deletion_timestamp.is_some();
    ops.push(match (add, index) {
        (true, Some(_)) | (false, None) => return None,
        (true, None) if deleting => return None,
        (true, None) if finalizers.is_empty() => {
            json!({ "op": "add", "path": "/metadata/finalizers", "value": [nodeipam_crd::FINALIZER] })
        }
        (true, None) => {
            json!({ "op": "add", "path": "/metadata/finalizers/-", "value": nodeipam_crd::FINALIZER })
        }
        (false, Some(i)) => json!({ "op": "remove", "path": format!("/metadata/finalizers/{i}") }),
    });
    Some(serde_json::Value::Array(ops))
}

/// One publish's writes, sent as the publisher sends them: each at the precondition
/// `fence::send` decides from the object as read, signed `by`; write number `late` (counting
/// down) is left stuck in the API server instead.
struct Writer {
    by: String,
    late: Option<usize>,
    sent: Vec<Sent>,
}

impl Writer {
    /// Sends `write`, or leaves it stuck (then the publish fails: its answer never came).
    fn send(&mut self, world: &mut World, write: Sent) -> Result<(), String> {
        match self.late {
            Some(0) => {
                self.late = None;
                self.sent.push(write);
                return Err("no answer within 10s".into());
            }
            Some(n) => self.late = Some(n - 1),
            None => {}
        }
        match write {
            Sent::Object {
                index,
                name,
                object,
                send,
            } => world.send_object(index, &name, *object, &send),
            Sent::Delete { index, name, at } => world.delete_object_at(index, &name, at),
            _ => unreachable!("a publish writes only outputs"),
        }
    }

    /// The ConfigMap of output `index` with `data`, signed; `holds`: it has that already.
    fn configmap(
        &mut self,
        world: &mut World,
        index: usize,
        data: BTreeMap<String, String>,
        holds: bool,
    ) -> Result<(), String> {
        let read = world.outputs[index]
            .values()
            .next()
            .map(|o| o.metadata.clone());
        let send = fence::send(read.as_ref(), holds, &self.by);
        if send == Send::Skip {
            return Ok(());
        }
        let mut object = world::configmap(index, data);
        object
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(PUBLISHED_BY.into(), self.by.clone());
        let name = object.metadata.name.clone().unwrap_or_default();
        let write = Sent::Object {
            index,
            name,
            object: Box::new(object),
            send,
        };
        self.send(world, write)
            .map_err(|why| format!("{}: {why}", output(index)))
    }

    /// Output 2 as the real publisher writes a many-object output: each pool the network
    /// wants (skipped only when it holds the spec and this process signed it), then ours it
    /// no longer wants removed at the version listed. `fail` stops it after that many steps.
    fn pools(
        &mut self,
        world: &mut World,
        network: &PodNetwork,
        fail: Option<u8>,
    ) -> Result<(), String> {
        let mut wanted = output(2).objects(network);
        for (_, body) in &mut wanted {
            body["metadata"]["annotations"][PUBLISHED_BY] = self.by.clone().into();
        }
        let fail_at = fail.map(|f| usize::from(f) % (wanted.len() + 1));
        for (i, (name, body)) in wanted.iter().enumerate() {
            if fail_at == Some(i) {
                return Err(format!("writing {name}: the write timed out"));
            }
            let read = world.outputs[2].get(name);
            let holds = read.is_some_and(|o| holds_spec(o, body));
            let send = fence::send(read.map(|o| &o.metadata), holds, &self.by);
            if send == Send::Skip {
                continue;
            }
            let object = Box::new(serde_json::from_value(body.clone()).expect("our own pool"));
            let write = Sent::Object {
                index: 2,
                name: name.clone(),
                object,
                send,
            };
            self.send(world, write)
                .map_err(|why| format!("writing {name}: {why}"))?;
        }
        if fail_at == Some(wanted.len()) {
            return Err("listing ours: the request timed out".into());
        }
        let listed: Vec<(String, _)> = world.outputs[2]
            .iter()
            .map(|(n, o)| (n.clone(), fence::delete_at(&o.metadata)))
            .collect();
        let names: Vec<String> = listed.iter().map(|(n, _)| n.clone()).collect();
        for name in stale(&wanted, &names) {
            let at = listed
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, at)| at.clone())
                .unwrap_or_default();
            let write = Sent::Delete { index: 2, name, at };
            match self.send(world, write) {
                Ok(()) => {}
                Err(why) if why.starts_with("404") => {}
                Err(why) => return Err(format!("removing: {why}")),
            }
        }
        Ok(())
    }
}

/// One step of a schedule. `pick`s choose among what is there at that moment (modulo), so a
/// shrunk schedule still means something.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Deliver {
        proc: u8,
        stream: Stream,
    },
    Answer {
        proc: u8,
        pick: u8,
    },
    Write {
        proc: u8,
        pick: u8,
        fault: WriteFault,
    },
    /// A write stuck in the API server (`WriteFault::LandsLate`) lands now, if it still can.
    LandLate {
        proc: u8,
        pick: u8,
    },
    ConfigJob {
        proc: u8,
        pick: u8,
        fail: bool,
        /// The write (a status, a finalizer's add or removal) is sent and left unanswered: it
        /// stays queued (the writer retries) and may land later (`Sent`).
        #[serde(default)]
        late: bool,
    },
    PoolJob {
        proc: u8,
        pick: u8,
        fault: PoolFault,
    },
    Publish {
        proc: u8,
        fail_first: bool,
        fail_second: bool,
        /// The Calico IPPools' write fails after this many (modulo the pools written and the
        /// removal of stale ones): a network written in part.
        #[serde(default)]
        fail_pools: Option<u8>,
        /// This write of the publish (modulo those it makes) is sent and left unanswered: the
        /// publish fails there and may land later (`Sent`).
        #[serde(default)]
        late: Option<u8>,
    },
    /// A write of `Sent` lands now, if its precondition still holds.
    LandSent {
        proc: u8,
        pick: u8,
    },
    Reread {
        proc: u8,
        pick: u8,
        fail: bool,
    },
    Tick {
        proc: u8,
        advance_ms: u32,
    },
    Resync {
        proc: u8,
    },
    Relist {
        proc: u8,
        stream: Stream,
    },
    /// The leader loses its lease; a new process takes over (its writes in flight may land
    /// until the new one lists, as the takeover delay allows).
    Failover,
    /// The new leader, after its takeover delay, lists everything.
    StartLeader,
    ClockJump {
        seconds: i32,
    },
    User(User),
}

/// A broken invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub rule: &'static str,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.rule, self.detail)
    }
}

/// The settings of one simulated cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setup {
    pub outputs: usize,
    pub service_flag: bool,
    /// Refused writes before the machine gives up: with one, a refusal after an ambiguous
    /// attempt leaks the blocks often enough for the leaks to be explored.
    #[serde(default = "three")]
    pub write_attempts: u32,
}

fn three() -> u32 {
    3
}

/// A config of the menu: name, IPv4 and IPv6 `(cidr, mask)`, whether it selects `pool=b`.
type MenuConfig = (
    &'static str,
    Option<(&'static str, u8)>,
    Option<(&'static str, u8)>,
    bool,
);

const CONFIG_MENU: [MenuConfig; 6] = [
    ("a", Some(("10.0.0.0/28", 30)), None, false),
    ("b", Some(("10.0.0.16/29", 30)), None, true),
    ("c", Some(("10.0.0.0/27", 30)), None, false),
    (
        "d",
        Some(("10.0.1.0/29", 30)),
        Some(("fd00::/124", 126)),
        true,
    ),
    ("e", None, Some(("fd00:1::/125", 126)), false),
    ("f", Some(("10.0.2.0/30", 30)), None, false),
];
const SERVICE_MENU: [&[&str]; 4] = [
    &["10.0.0.4/30"],
    &["10.0.0.16/30", "fd00::/126"],
    &["10.0.1.0/30"],
    &["10.0.2.0/30", "fd00:1::/126"],
];
/// A pool of the menu: name, IPv4 and IPv6 `(budget, range mask, per-node mask)`, whether it
/// selects `pool=b`, `(min, max, headroom)`, emptyFor.
type MenuPool = (
    &'static str,
    Option<(&'static [&'static str], u8, u8)>,
    Option<(&'static [&'static str], u8, u8)>,
    bool,
    (u32, u32, u32),
    &'static str,
);

/// Small budgets, so that exhaustion and retirement happen; `r` shares its budget with the
/// hand-made configs and the Service ranges.
const POOL_MENU: [MenuPool; 3] = [
    (
        "p",
        Some((&["10.1.0.0/27"], 29, 30)),
        None,
        false,
        (1, 3, 1),
        "30s",
    ),
    (
        "q",
        Some((&["10.2.0.0/28"], 29, 30)),
        Some((&["fd02::/123"], 125, 126)),
        true,
        (0, 4, 2),
        "0s",
    ),
    (
        "r",
        Some((&["10.0.0.0/26"], 29, 30)),
        None,
        false,
        (1, 4, 2),
        "1m",
    ),
];
/// Longer than every emptyFor of the menu and its edits: at rest, one such pause retires
/// every child due.
const LONG_REST_MS: u32 = 200_000;
const SERVICE_FLAG: &str = "10.0.0.24/30";
const RETRY_REJECTED_AFTER: Duration = Duration::from_secs(60);

/// One controller process.
struct Process {
    machine: Machine,
    queues: BTreeMap<Stream, VecDeque<Change>>,
    writes: Vec<WriteJob>,
    /// Writes stuck in the API server, whose sender had its (ambiguous) answer: they may land.
    late: Vec<WriteJob>,
    /// Other writes stuck in the API server: they may land at any later step, however late.
    sent: Vec<Sent>,
    /// This process's signature on what it publishes (`fence::PUBLISHED_BY`).
    by: String,
    config_jobs: Vec<ConfigJob>,
    pool_jobs: Vec<PoolJob>,
    publish: Option<PodNetwork>,
    rereads: Vec<(String, Option<String>)>,
    answers: Vec<Input>,
    mono: Duration,
    /// Service ranges as this process's watch delivered them, and the flag's.
    services: BTreeMap<String, Vec<IpNet>>,
    /// The names a Service (re)list in progress returned.
    services_listed: BTreeSet<String>,
    /// Subscribed to the watches: the leader; a deposed one only finishes its writes.
    leading: bool,
    /// Started: has listed.
    started: bool,
}

pub struct Sim {
    pub setup: Setup,
    world: World,
    procs: Vec<Process>,
    wall: i64,
    pub steps: usize,
    /// Pools whose ranges a user changed (a child toggled, max lowered): their count may
    /// exceed max through no decision of ours.
    max_tampered: BTreeSet<String>,
    /// Time passed, as every tick advanced it.
    elapsed: Duration,
    /// When a node last held a block of each pool child (by uid), or when it was created.
    last_held: BTreeMap<String, Duration>,
    /// The shortest emptyFor each pool (by name) ever had.
    min_empty_for: BTreeMap<String, Duration>,
    /// Every input and effect, in order, when asked for (`run_traced`): a seed must name one
    /// trace, or a failure found once could not be replayed.
    trace: Option<Vec<String>>,
}

fn streams(outputs: usize, services: bool) -> Vec<Stream> {
    let mut s = vec![Stream::Nodes, Stream::Configs, Stream::Pools];
    s.extend((0..outputs).map(Stream::Output));
    if services {
        s.push(Stream::Services);
    }
    s
}

impl Sim {
    pub fn new(setup: Setup) -> Self {
        let mut sim = Sim {
            world: World::new(setup.outputs),
            setup,
            procs: Vec::new(),
            wall: 1_800_000_000,
            steps: 0,
            max_tampered: BTreeSet::new(),
            elapsed: Duration::ZERO,
            last_held: BTreeMap::new(),
            min_empty_for: BTreeMap::new(),
            trace: None,
        };
        sim.procs.push(sim.process());
        sim.start(0);
        sim
    }

    fn options(&self) -> machine::Options {
        machine::Options {
            service_cidrs: if self.setup.service_flag {
                vec![SERVICE_FLAG.parse().expect("flag literal")]
            } else {
                Vec::new()
            },
            service_cidr_api: true,
            pools: true,
            write_attempts: self.setup.write_attempts,
            retry_rejected_after: RETRY_REJECTED_AFTER,
            outputs: (0..self.setup.outputs).map(output).collect(),
            extra_non_masquerade: Vec::new(),
            panic_on_node: None,
            // The simulated objects carry no resourceVersions: no relist is ever evidence.
            revisions: machine::Revisions::default(),
        }
    }

    fn process(&self) -> Process {
        let mut services = BTreeMap::new();
        if self.setup.service_flag {
            services.insert(
                "--service-cidr".to_string(),
                vec![SERVICE_FLAG.parse().expect("flag literal")],
            );
        }
        Process {
            machine: Machine::new(self.options()),
            queues: BTreeMap::new(),
            writes: Vec::new(),
            late: Vec::new(),
            sent: Vec::new(),
            by: format!("process-{}", self.procs.len()),
            config_jobs: Vec::new(),
            pool_jobs: Vec::new(),
            publish: None,
            rereads: Vec::new(),
            answers: Vec::new(),
            mono: Duration::ZERO,
            services,
            services_listed: BTreeSet::new(),
            leading: true,
            started: false,
        }
    }

    /// The process lists every watch: from now on it sees every change.
    fn start(&mut self, p: usize) {
        for s in streams(self.setup.outputs, true) {
            let list = self.world.list(s);
            self.procs[p].queues.insert(s, list.into());
        }
        self.procs[p].started = true;
    }

    fn leader(&self) -> usize {
        self.procs.len() - 1
    }

    fn now(&self, p: usize) -> Now {
        Now {
            mono: self.procs[p].mono,
            wall_seconds: self.wall,
        }
    }

    /// Changes of the world go to every process that watches.
    fn broadcast(&mut self) {
        for change in self.world.drain_changes() {
            for proc in self.procs.iter_mut().filter(|p| p.leading && p.started) {
                proc.queues
                    .entry(change.stream())
                    .or_default()
                    .push_back(change.clone());
            }
        }
    }

    fn handle(&mut self, p: usize, input: Input) -> Result<(), Violation> {
        let now = self.now(p);
        if let Input::Service(w) = &input {
            let proc = &mut self.procs[p];
            track_service(&mut proc.services, &mut proc.services_listed, w);
        }
        if verbose() {
            eprintln!("  [{p}] <- {}", brief(&format!("{input:?}")));
        }
        if let Some(trace) = &mut self.trace {
            trace.push(format!("[{p}] <- {input:?}"));
        }
        let effects = self.procs[p].machine.handle(now, input);
        if let Some(trace) = &mut self.trace {
            trace.extend(effects.iter().map(|e| format!("[{p}] -> {e:?}")));
        }
        for effect in effects {
            if verbose() && !matches!(effect, Effect::Metric(_)) {
                eprintln!("  [{p}] -> {}", brief(&format!("{effect:?}")));
            }
            self.take(p, effect)?;
        }
        Ok(())
    }

    /// Queues an effect as the driver would, checking what can be checked when it is asked.
    fn take(&mut self, p: usize, effect: Effect) -> Result<(), Violation> {
        // An over-max retire of a child awaiting its enable is sent only if, as read just
        // before, it still awaits (the writer's check): it is checked when sent (`pool_job`).
        if let Effect::DeleteConfig {
            name,
            only_awaiting: false,
            ..
        } = &effect
        {
            self.check_retire(name)?;
        }
        let proc = &mut self.procs[p];
        match effect {
            Effect::Write(job) => {
                for block in &job.cidrs {
                    for (source, ranges) in &proc.services {
                        if ranges.iter().any(|r| nets_overlap(r, block)) {
                            return Err(Violation {
                                rule: "no podCIDR in a Service range",
                                detail: format!(
                                    "process {p} asked to write {block} to {} while Service range {source} {ranges:?} was known",
                                    job.node
                                ),
                            });
                        }
                    }
                }
                proc.writes.push(job);
            }
            Effect::Config(job) => {
                // One pending job per config and kind, the newest, as the config writer keeps.
                proc.config_jobs.retain(|j| j.key() != job.key());
                proc.config_jobs.push(job);
            }
            Effect::Publish(network) => proc.publish = Some(network),
            Effect::Reread { node, uid } => proc.rereads.push((node, uid)),
            Effect::Note(_) | Effect::Metric(_) => {}
            Effect::CreateConfig(child) => proc.pool_jobs.push(PoolJob::Create(child)),
            Effect::EnableConfig(child) => proc.pool_jobs.push(PoolJob::Enable(child)),
            Effect::DeleteConfig {
                name,
                uid,
                only_awaiting,
            } => {
                proc.pool_jobs.push(PoolJob::Delete {
                    name,
                    uid,
                    only_awaiting,
                });
            }
            Effect::PoolStatus { name, uid, status } => {
                // One pending status per pool, the newest, as the writer keeps.
                proc.pool_jobs
                    .retain(|j| !matches!(j, PoolJob::Status { name: n, .. } if *n == name));
                proc.pool_jobs.push(PoolJob::Status { name, uid, status });
            }
        }
        Ok(())
    }

    /// Carries out one action; actions that do not apply now do nothing.
    pub fn act(&mut self, action: &Action) -> Result<(), Violation> {
        self.steps += 1;
        if verbose() {
            eprintln!("{}: {action:?}", self.steps);
        }
        match action {
            Action::Deliver { proc, stream } => {
                let p = self.proc(*proc);
                let Some(p) = p.filter(|&p| self.procs[p].leading) else {
                    return Ok(());
                };
                let change = self.procs[p]
                    .queues
                    .get_mut(stream)
                    .and_then(VecDeque::pop_front);
                if let Some(change) = change {
                    self.handle(p, change.into_input())?;
                }
            }
            Action::Answer { proc, pick } => {
                if let Some(p) = self.proc(*proc).filter(|&p| self.procs[p].leading) {
                    let answers = &mut self.procs[p].answers;
                    let ready = deliverable(answers);
                    if !ready.is_empty() {
                        let input = answers.remove(ready[*pick as usize % ready.len()]);
                        self.handle(p, input)?;
                    }
                }
            }
            Action::Write { proc, pick, fault } => {
                if let Some(p) = self.proc(*proc) {
                    self.write(p, *pick, *fault)?;
                }
            }
            Action::LandLate { proc, pick } => {
                if let Some(p) = self.proc(*proc) {
                    let late = &mut self.procs[p].late;
                    if !late.is_empty() {
                        let job = late.remove(*pick as usize % late.len());
                        // Nobody waits for the answer any more; the UID precondition and the
                        // immutable podCIDRs decide whether it still lands.
                        let _ = self
                            .world
                            .patch_node(&job.node, job.uid.as_deref(), &job.cidrs);
                    }
                }
            }
            Action::ConfigJob {
                proc,
                pick,
                fail,
                late,
            } => {
                if let Some(p) = self.proc(*proc) {
                    self.config_job(p, *pick, *fail, *late)?;
                }
            }
            Action::LandSent { proc, pick } => {
                if let Some(p) = self.proc(*proc) {
                    let sent = &mut self.procs[p].sent;
                    if !sent.is_empty() {
                        let write = sent.remove(*pick as usize % sent.len());
                        // Nobody waits for the answer any more: its precondition decides.
                        self.land(write)?;
                    }
                }
            }
            Action::PoolJob { proc, pick, fault } => {
                if let Some(p) = self.proc(*proc) {
                    self.pool_job(p, *pick, *fault)?;
                }
            }
            Action::Publish {
                proc,
                fail_first,
                fail_second,
                fail_pools,
                late,
            } => {
                if let Some(p) = self.proc(*proc) {
                    let late = late.map(usize::from);
                    self.publish(p, [*fail_first, *fail_second], *fail_pools, late);
                }
            }
            Action::Reread { proc, pick, fail } => {
                if let Some(p) = self.proc(*proc) {
                    let rereads = &mut self.procs[p].rereads;
                    if !rereads.is_empty() {
                        let (node, uid) = rereads.remove(*pick as usize % rereads.len());
                        let now = if *fail {
                            NodeNow::Unknown("GET timed out".into())
                        } else {
                            self.world.read_node(&node)
                        };
                        self.procs[p].answers.push(Input::Reread { node, uid, now });
                    }
                }
            }
            Action::Tick { proc, advance_ms } => {
                if let Some(p) = self.proc(*proc).filter(|&p| self.procs[p].leading) {
                    self.elapsed += Duration::from_millis(u64::from(*advance_ms));
                    self.procs[p].mono += Duration::from_millis(u64::from(*advance_ms));
                    self.wall += i64::from(*advance_ms / 1000);
                    self.handle(p, Input::Tick)?;
                }
            }
            Action::Resync { proc } => {
                if let Some(p) = self.proc(*proc).filter(|&p| self.procs[p].leading) {
                    self.handle(p, Input::Resync)?;
                }
            }
            Action::Relist { proc, stream } => {
                let p = self.proc(*proc);
                if let Some(p) = p.filter(|&p| self.procs[p].leading && self.procs[p].started) {
                    // A watch that expired lists again: what was queued is superseded.
                    let list = self.world.list(*stream);
                    self.procs[p].queues.insert(*stream, list.into());
                }
            }
            Action::Failover => self.failover(),
            Action::StartLeader => {
                let l = self.leader();
                if !self.procs[l].started {
                    // The takeover delay is over: whatever the old leaders still had in flight
                    // timed out without landing, but for the writes stuck in the API server
                    // (`sent`): nothing but their preconditions stops those.
                    for old in &mut self.procs[..l] {
                        old.writes.clear();
                        old.late.clear();
                        old.config_jobs.clear();
                        old.pool_jobs.clear();
                        old.publish = None;
                        old.rereads.clear();
                    }
                    self.start(l);
                }
            }
            Action::ClockJump { seconds } => self.wall += i64::from(*seconds),
            Action::User(u) => self.user(u),
        }
        self.broadcast();
        self.note_pools();
        self.check()?;
        self.check_if_stuck_writes_land()
    }

    /// A stuck write (`Sent`) may land at any step, this one too: each is landed now in a copy
    /// of the world and the invariants its kind could break are checked there. So a missing
    /// precondition is found at the first moment it matters, not only when the schedule
    /// happens to land the write then.
    fn check_if_stuck_writes_land(&mut self) -> Result<(), Violation> {
        let stuck: Vec<Sent> = self.procs.iter().flat_map(|p| p.sent.clone()).collect();
        for write in stuck {
            if self.refused_now(&write) {
                continue;
            }
            let saved = self.world.clone();
            let checked = self.land(write.clone()).and_then(|()| {
                self.check_published()?;
                self.check_drained()?;
                self.check_blocks_have_a_config()?;
                self.check_pools()
            });
            self.world = saved;
            checked.map_err(|v| Violation {
                rule: v.rule,
                detail: format!(
                    "{} if this stuck write landed now: {}",
                    v.detail,
                    brief(&format!("{write:?}"))
                ),
            })?;
        }
        Ok(())
    }

    /// Whether the API server would refuse `write` now, by a precondition it carries that
    /// no longer holds (its object gone, replaced or written since): then it changes nothing,
    /// and no copy of the world is needed to know. Only what is sure; the rest is landed.
    fn refused_now(&self, write: &Sent) -> bool {
        let moved = |want: &Option<String>, have: &Option<String>| want.is_some() && want != have;
        let configs = &self.world.configs;
        match write {
            Sent::Finalizers { name, patch } => configs.get(name).is_none_or(|c| {
                let rv = c.metadata.resource_version.as_deref().unwrap_or_default();
                patch.as_array().into_iter().flatten().any(|op| {
                    op["op"] == "test"
                        && op["path"] == "/metadata/resourceVersion"
                        && op["value"] != rv
                })
            }),
            Sent::ChildDelete { name, at } => configs.get(name).is_none_or(|c| {
                moved(&at.0, &c.metadata.uid) || moved(&at.1, &c.metadata.resource_version)
            }),
            Sent::Create(child) => configs.contains_key(&child.name),
            Sent::Enable { name, patch } => configs.get(name).is_none_or(|c| {
                let rv = c.metadata.resource_version.as_deref().unwrap_or_default();
                patch.as_array().into_iter().flatten().any(|op| {
                    op["op"] == "test"
                        && op["path"] == "/metadata/resourceVersion"
                        && op["value"] != rv
                })
            }),
            Sent::Delete { index, name, at } => {
                self.world.outputs[*index].get(name).is_none_or(|o| {
                    moved(&at.0, &o.metadata.uid) || moved(&at.1, &o.metadata.resource_version)
                })
            }
            Sent::Object {
                index, name, send, ..
            } => {
                let have = self.world.outputs[*index].get(name);
                match send {
                    Send::Create => have.is_some(),
                    Send::At {
                        resource_version: Some(v),
                    } => have.is_none_or(|o| o.metadata.resource_version.as_ref() != Some(v)),
                    _ => false,
                }
            }
            Sent::Status { name, .. } => !configs.contains_key(name),
            Sent::PoolStatus { name, uid, .. } => self
                .world
                .pools
                .get(name)
                .is_none_or(|p| moved(uid, &p.metadata.uid)),
        }
    }

    /// What the pool checks need of the history: when each child last held a block, the
    /// shortest emptyFor of each pool.
    fn note_pools(&mut self) {
        for (name, pool) in &self.world.pools {
            let empty_for = nodeipam_crd::duration::parse(&pool.spec.scale_down.empty_for)
                .unwrap_or(Duration::ZERO);
            let shortest = self.min_empty_for.entry(name.clone()).or_insert(empty_for);
            *shortest = (*shortest).min(empty_for);
        }
        let held: Vec<IpNet> = self.held().into_iter().map(|(_, b, _)| b).collect();
        let mut now_held = Vec::new();
        for (name, c) in &self.world.configs {
            let is_child = c
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(POOL_LABEL));
            if !is_child {
                continue;
            }
            let uid = c.metadata.uid.clone().unwrap_or_default();
            let own = self
                .world
                .config_ranges
                .get(name)
                .map_or(&[][..], Vec::as_slice);
            if !self.last_held.contains_key(&uid)
                || held.iter().any(|b| own.iter().any(|r| nets_overlap(r, b)))
            {
                now_held.push(uid);
            }
        }
        for uid in now_held {
            self.last_held.insert(uid, self.elapsed);
        }
    }

    /// A pool retires only a child that no node holds a block of, and that has been so for
    /// its emptyFor.
    fn check_retire(&self, name: &str) -> Result<(), Violation> {
        let Some(c) = self.world.configs.get(name) else {
            return Ok(());
        };
        if let Some((node, block, _)) = self
            .held()
            .into_iter()
            .find(|(_, b, _)| ranges(c).iter().any(|r| nets_overlap(r, b)))
        {
            return Err(Violation {
                rule: "a pool retires only empty children",
                detail: format!("retiring {name} while {node} holds {block}"),
            });
        }
        // A child that never served (created disabled, awaiting its enable) may be retired at
        // once: its pool has more than max children that count (a create landed late).
        if awaits_enable(c) {
            return Ok(());
        }
        let pool = c
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(POOL_LABEL))
            .cloned()
            .unwrap_or_default();
        let empty_for = self
            .min_empty_for
            .get(&pool)
            .copied()
            .unwrap_or(Duration::ZERO);
        if let Some(last) = self
            .last_held
            .get(c.metadata.uid.as_deref().unwrap_or_default())
            && self.elapsed.saturating_sub(*last) < empty_for
        {
            return Err(Violation {
                rule: "a pool retires a child only after emptyFor",
                detail: format!(
                    "retiring {name} {:?} after its last block, emptyFor {empty_for:?}",
                    self.elapsed.saturating_sub(*last)
                ),
            });
        }
        Ok(())
    }

    /// `proc` counts back from the newest process: 0 is the leader, 1 the one before.
    fn proc(&self, proc: u8) -> Option<usize> {
        self.leader().checked_sub(usize::from(proc))
    }

    fn failover(&mut self) {
        let l = self.leader();
        if !self.procs[l].started {
            return;
        }
        let old = &mut self.procs[l];
        old.leading = false;
        old.queues.clear();
        old.answers.clear();
        let new = self.process();
        self.procs.push(Process {
            started: false,
            ..new
        });
    }

    fn write(&mut self, p: usize, pick: u8, fault: WriteFault) -> Result<(), Violation> {
        let proc = &mut self.procs[p];
        if proc.writes.is_empty() {
            return Ok(());
        }
        let job = proc.writes.remove(pick as usize % proc.writes.len());
        if fault == WriteFault::LandsLate {
            let outcome = WriteOutcome::Ambiguous {
                reason: "no answer within 10s".into(),
                now: self.world.read_node(&job.node),
            };
            let proc = &mut self.procs[p];
            proc.late.push(job.clone());
            proc.answers
                .push(Input::Written(WriteResult { job, outcome }));
            return Ok(());
        }
        let lands = matches!(fault, WriteFault::None | WriteFault::LandedUnanswered);
        let patched = if lands {
            Some(
                self.world
                    .patch_node(&job.node, job.uid.as_deref(), &job.cidrs),
            )
        } else {
            None
        };
        let reread = |world: &World| world.read_node(&job.node);
        let outcome = match (fault, patched) {
            (WriteFault::None, Some(Patched::Applied(cidrs, uid))) => WriteOutcome::Applied {
                uid: Some(uid),
                cidrs,
            },
            (WriteFault::None, Some(Patched::Missing)) => WriteOutcome::Missing,
            (WriteFault::None, Some(Patched::Refused(reason))) => WriteOutcome::Rejected {
                reason,
                now: reread(&self.world),
            },
            (WriteFault::Refused, _) => WriteOutcome::Rejected {
                reason: "403 Forbidden: denied by an admission policy".into(),
                now: reread(&self.world),
            },
            (WriteFault::Throttled, _) => WriteOutcome::Throttled,
            (WriteFault::NotSent, _) => WriteOutcome::NotSent {
                reason: "not sent: this replica's term is over".into(),
            },
            (WriteFault::LostUnreadable, _) => WriteOutcome::Ambiguous {
                reason: "connection reset".into(),
                now: NodeNow::Unknown("GET timed out".into()),
            },
            _ => WriteOutcome::Ambiguous {
                reason: "no answer within 10s".into(),
                now: reread(&self.world),
            },
        };
        self.procs[p]
            .answers
            .push(Input::Written(WriteResult { job, outcome }));
        Ok(())
    }

    fn config_job(&mut self, p: usize, pick: u8, fail: bool, late: bool) -> Result<(), Violation> {
        let proc = &self.procs[p];
        if proc.config_jobs.is_empty() {
            return Ok(());
        }
        let i = pick as usize % proc.config_jobs.len();
        if late {
            // Sent, unanswered: it stays queued (the writer retries it), and may land later
            // all the same.
            if let Some(write) = self.config_write(&proc.config_jobs[i]) {
                self.procs[p].sent.push(write);
            }
            return Ok(());
        }
        if fail {
            // A failed write stays queued: the config writer retries it.
            return Ok(());
        }
        let job = self.procs[p].config_jobs.remove(i);
        self.procs[p]
            .answers
            .push(Input::ConfigWritten(job.clone()));
        // Refused when its tests fail: the writer takes that as done (the config was created
        // again or edited since), as `config_writer.rs` does.
        match self.config_write(&job) {
            Some(write) => self.land(write),
            None => Ok(()),
        }
    }

    /// The write the config writer sends for `job` now (after its read, for a finalizer), if
    /// any.
    fn config_write(&self, job: &ConfigJob) -> Option<Sent> {
        match job {
            ConfigJob::Status { name, uid, status } => Some(Sent::Status {
                name: name.clone(),
                patch: fence::status_patch(uid.as_deref(), status),
            }),
            ConfigJob::AddFinalizer { name } => {
                let patch = finalizer_patch(&self.world, name, true, None)?;
                let name = name.clone();
                Some(Sent::Finalizers { name, patch })
            }
            ConfigJob::RemoveFinalizer { name, uid } => {
                let patch = finalizer_patch(&self.world, name, false, uid.as_deref())?;
                let name = name.clone();
                Some(Sent::Finalizers { name, patch })
            }
        }
    }

    /// The pool writer: a child's create or delete, or a pool's status. A stuck one is
    /// answered as the writer answers a timeout, and may land later (`Sent`).
    fn pool_job(&mut self, p: usize, pick: u8, fault: PoolFault) -> Result<(), Violation> {
        let proc = &mut self.procs[p];
        if proc.pool_jobs.is_empty() {
            return Ok(());
        }
        let job = proc.pool_jobs.remove(pick as usize % proc.pool_jobs.len());
        let write = self.pool_write(&job);
        if let (
            PoolJob::Delete {
                name,
                only_awaiting: true,
                ..
            },
            Ok(_),
        ) = (&job, &write)
        {
            self.check_retire(name)?;
        }
        let answer = match (&write, fault) {
            (Err(gone), _) => Ok(gone.clone()),
            (Ok(_), PoolFault::Failed) => Err("403 Forbidden".to_string()),
            (Ok(write), PoolFault::Stuck) => {
                self.procs[p].sent.push(write.clone());
                Err("no answer within 10s".to_string())
            }
            (Ok(write), _) => {
                let landed = self.land_pool(write.clone());
                match fault {
                    PoolFault::LandedUnanswered => Err("no answer within 10s".to_string()),
                    _ => Ok(landed),
                }
            }
        };
        self.answer_pool(p, job, answer);
        Ok(())
    }

    /// The write the pool writer sends for `job` now (a delete after its read), or the answer
    /// it gives without one (a delete of a child gone or replaced).
    fn pool_write(&self, job: &PoolJob) -> Result<Sent, Option<String>> {
        Ok(match job {
            PoolJob::Create(child) => Sent::Create(child.clone()),
            PoolJob::Enable(child) => {
                let Some(rv) = child.resource_version.as_deref() else {
                    return Err(Some("409 no resourceVersion to enable it at".into()));
                };
                Sent::Enable {
                    name: child.name.clone(),
                    patch: fence::enable_patch(child.uid.as_deref(), rv),
                }
            }
            PoolJob::Delete {
                name,
                uid,
                only_awaiting,
            } => {
                let read = self.world.configs.get(name);
                let read = read.filter(|c| uid.is_none() || c.metadata.uid == *uid);
                let Some(read) = read else {
                    return Err(Some(format!("404 NotFound: {name}")));
                };
                if *only_awaiting && !awaits_enable(read) {
                    return Err(Some("it was enabled since it was decided on".into()));
                }
                let at = (
                    read.metadata.uid.clone(),
                    read.metadata.resource_version.clone(),
                );
                Sent::ChildDelete {
                    name: name.clone(),
                    at,
                }
            }
            PoolJob::Status { name, uid, status } => Sent::PoolStatus {
                name: name.clone(),
                uid: uid.clone(),
                status: status.clone(),
            },
        })
    }

    /// A pool write lands now, if it can: `None`, or the API server's refusal.
    fn land_pool(&mut self, write: Sent) -> Option<String> {
        match write {
            Sent::Create(child) => match self.world.create_config(child.object(), self.wall) {
                CreateOutcome::Created => None,
                CreateOutcome::AlreadyExists => Some("409 AlreadyExists".into()),
                CreateOutcome::Failed(why) => Some(why),
            },
            Sent::Enable { name, patch } => self.world.patch_config(&name, &patch).err(),
            Sent::ChildDelete { name, at } => {
                self.world.delete_config_at(&name, at, self.wall).err()
            }
            Sent::PoolStatus { name, uid, status } => self
                .world
                .write_pool_status(&name, uid.as_deref(), status)
                .err(),
            _ => unreachable!("not a pool write"),
        }
    }

    /// The pool writer's answer: `Ok` with the API server's refusal, if any (`None` also for
    /// a delete it did not send, the child gone); `Err` when no answer came.
    fn answer_pool(&mut self, p: usize, job: PoolJob, answer: Result<Option<String>, String>) {
        let proc = &mut self.procs[p];
        match job {
            PoolJob::Create(config) => {
                let outcome = match answer {
                    Ok(None) => CreateOutcome::Created,
                    Ok(Some(why)) if why.starts_with("409 AlreadyExists") => {
                        CreateOutcome::AlreadyExists
                    }
                    Ok(Some(why)) | Err(why) => CreateOutcome::Failed(why),
                };
                proc.answers.push(Input::ConfigCreated { config, outcome });
            }
            PoolJob::Enable(child) => {
                let outcome = match answer {
                    Ok(None) => EnableOutcome::Enabled,
                    Ok(Some(why))
                        if why.starts_with("404")
                            || why.starts_with("409")
                            || why.starts_with("422") =>
                    {
                        EnableOutcome::Moved(why)
                    }
                    Ok(Some(why)) | Err(why) => EnableOutcome::Failed(why),
                };
                proc.answers.push(Input::ConfigEnabled { child, outcome });
            }
            PoolJob::Delete { name, uid, .. } => {
                let outcome = match answer {
                    Ok(None) => DeleteOutcome::Deleted,
                    Ok(Some(why)) if why.starts_with("404") => DeleteOutcome::Gone,
                    Ok(Some(why)) | Err(why) => DeleteOutcome::Failed(why),
                };
                proc.answers
                    .push(Input::ConfigDeleted { name, uid, outcome });
            }
            PoolJob::Status { name, uid, status } => {
                if answer.is_ok() {
                    return;
                }
                // The writer retries it, unless a newer status replaced it.
                let newer = proc
                    .pool_jobs
                    .iter()
                    .any(|j| matches!(j, PoolJob::Status { name: n, .. } if *n == name));
                if !newer {
                    proc.pool_jobs.push(PoolJob::Status { name, uid, status });
                }
            }
        }
    }

    /// A write of `Sent` lands, if its precondition still holds. A finalizer removal that
    /// takes the config with it is checked as the config's release.
    fn land(&mut self, write: Sent) -> Result<(), Violation> {
        let refused = match write {
            Sent::Status { name, patch } => (!self.world.patch_status(&name, &patch))
                .then(|| format!("status of {name}: a test failed")),
            Sent::Object {
                index,
                name,
                object,
                send,
            } => self.world.send_object(index, &name, *object, &send).err(),
            Sent::Delete { index, name, at } => self.world.delete_object_at(index, &name, at).err(),
            Sent::Finalizers { name, patch } => match self.world.patch_finalizers(&name, &patch) {
                Ok(Some(gone)) => return self.check_released(&gone),
                Ok(None) => None,
                Err(why) => Some(why),
            },
            pool => self.land_pool(pool),
        };
        if verbose() {
            eprintln!("  a write: {}", refused.as_deref().unwrap_or("lands"));
        }
        Ok(())
    }

    /// The publisher: our ConfigMap first, then ip-masq-agent's, then the Calico IPPools;
    /// any may fail, the pools after some of them are written. Each write is sent as the real
    /// publisher sends it (`fence::send`, signed by the process); write number `late` is left
    /// stuck in the API server instead (`Sent`) and the publish fails there.
    fn publish(&mut self, p: usize, fail: [bool; 2], fail_pools: Option<u8>, late: Option<usize>) {
        let Some(network) = self.procs[p].publish.clone() else {
            return;
        };
        let mut writer = Writer {
            by: self.procs[p].by.clone(),
            late,
            sent: Vec::new(),
        };
        let result = self.publish_outputs(&mut writer, &network, fail, fail_pools);
        let proc = &mut self.procs[p];
        proc.sent.extend(writer.sent);
        match result {
            Ok(()) => {
                proc.publish = None;
                proc.answers.push(Input::Published(network));
            }
            // A failed attempt is retried with the publication kept, and reported, as the
            // real publisher does.
            Err(why) => proc.answers.push(Input::PublishFailed(why)),
        }
    }

    fn publish_outputs(
        &mut self,
        writer: &mut Writer,
        network: &PodNetwork,
        fail: [bool; 2],
        fail_pools: Option<u8>,
    ) -> Result<(), String> {
        let timed_out = |i: usize| format!("{}: the write timed out", output(i));
        if fail[0] {
            return Err(timed_out(0));
        }
        // Always written: its data carries the time of the publish.
        let data = network.configmap_data(&self.wall.to_string());
        writer.configmap(&mut self.world, 0, data, false)?;
        self.world.output_tampered[0] = false;
        if self.setup.outputs > 1 {
            if fail[1] {
                return Err(timed_out(1));
            }
            let mut data = self.world.configmap_data(1).unwrap_or_default();
            let current = data.get("config").cloned();
            let config =
                ip_masq_agent_config(current.as_deref(), network, &[]).expect("our own config");
            let holds = current.as_deref() == Some(config.as_str());
            data.insert("config".into(), config);
            writer.configmap(&mut self.world, 1, data, holds)?;
            self.world.output_tampered[1] = false;
        }
        if self.setup.outputs > 2 {
            writer
                .pools(&mut self.world, network, fail_pools)
                .map_err(|why| format!("{}: {why}", output(2)))?;
            self.world.output_tampered[2] = false;
        }
        Ok(())
    }

    fn user(&mut self, u: &User) {
        let pick = |n: usize, i: u8| (n > 0).then(|| usize::from(i) % n);
        match u {
            User::CreateNode { name, pool_b } => {
                let name = format!("n{}", name % 8);
                if !self.world.nodes.contains_key(&name) {
                    let labels = if *pool_b {
                        vec![("pool".to_string(), "b".to_string())]
                    } else {
                        Vec::new()
                    };
                    let uid = self.world.uid("node");
                    let node = NodeObj {
                        uid,
                        labels,
                        cidrs: Vec::new(),
                        ours: false,
                    };
                    self.world.put_node(&name, node);
                }
            }
            User::CreateUnmanagedNode { name } => {
                let name = format!("u{}", name % 3);
                if !self.world.nodes.contains_key(&name) {
                    let uid = self.world.uid("node");
                    let cidr = format!("192.168.{}.0/24", name.trim_start_matches('u'));
                    let node = NodeObj {
                        uid,
                        labels: Vec::new(),
                        cidrs: vec![cidr],
                        ours: false,
                    };
                    self.world.put_node(&name, node);
                }
            }
            User::DeleteNode { pick: i } => {
                if let Some(i) = pick(self.world.nodes.len(), *i) {
                    let name = self.world.nodes.keys().nth(i).cloned().unwrap_or_default();
                    self.world.delete_node(&name);
                }
            }
            User::RecreateNode { pick: i } => {
                if let Some(i) = pick(self.world.nodes.len(), *i) {
                    let name = self.world.nodes.keys().nth(i).cloned().unwrap_or_default();
                    if name.starts_with('n') {
                        let labels = self.world.nodes[&name].labels.clone();
                        self.world.delete_node(&name);
                        let uid = self.world.uid("node");
                        let node = NodeObj {
                            uid,
                            labels,
                            cidrs: Vec::new(),
                            ours: false,
                        };
                        self.world.put_node(&name, node);
                    }
                }
            }
            User::CreateConfig { menu } => {
                let (name, v4, v6, pool_b) = CONFIG_MENU[usize::from(*menu) % CONFIG_MENU.len()];
                if !self.world.configs.contains_key(name) {
                    let uid = self.world.uid("config");
                    let selector = pool_b.then(|| fixtures::selecting("pool", "b"));
                    let c = fixtures::config(name, &uid, self.wall, (v4, v6), selector, false);
                    self.world.put_config(c);
                }
            }
            User::DeleteConfig { pick: i } => {
                if let Some(i) = pick(self.world.configs.len(), *i) {
                    let name = self
                        .world
                        .configs
                        .keys()
                        .nth(i)
                        .cloned()
                        .unwrap_or_default();
                    self.world.delete_config(&name, self.wall);
                }
            }
            User::DeleteNewest => {
                let newest = self
                    .world
                    .configs
                    .values()
                    .min_by_key(|c| Reverse(order(c)));
                if let Some(name) = newest.and_then(|c| c.metadata.name.clone()) {
                    self.world.delete_config(&name, self.wall);
                }
            }
            User::CreateAgain => self.create_again(),
            User::ToggleConfig { .. } | User::ToggleNewest => {
                let chosen = match u {
                    User::ToggleConfig { pick: i } => pick(self.world.configs.len(), *i),
                    _ => (0..self.world.configs.len())
                        .max_by_key(|&i| self.world.configs.values().nth(i).map(order)),
                };
                if let Some(i) = chosen {
                    let mut c = self.world.configs.values().nth(i).cloned().expect("picked");
                    if let Some(pool) = c.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL)) {
                        self.max_tampered.insert(pool.clone());
                    }
                    c.spec.allocation = match c.spec.allocation {
                        Allocation::Enabled => Allocation::Disabled,
                        Allocation::Disabled => Allocation::Enabled,
                    };
                    c.metadata.generation = Some(c.metadata.generation.unwrap_or(1) + 1);
                    self.world.put_config(c);
                }
            }
            User::SetService { name, menu } => {
                let cidrs = SERVICE_MENU[usize::from(*menu) % SERVICE_MENU.len()];
                let cidrs = cidrs.iter().map(ToString::to_string).collect();
                self.world.put_service(&format!("s{}", name % 2), cidrs);
            }
            User::DeleteService { name } => self.world.delete_service(&format!("s{}", name % 2)),
            User::EditOutput { index, delete } => {
                let i = usize::from(*index);
                if i < self.setup.outputs {
                    self.edit_output(i, *delete);
                    self.world.output_tampered[i] = true;
                }
            }
            User::CreatePool { menu } => {
                let m = POOL_MENU[usize::from(*menu) % POOL_MENU.len()];
                if !self.world.pools.contains_key(m.0) {
                    let uid = self.world.uid("pool");
                    let pool = pool_object(m, &uid, self.wall);
                    self.world.put_pool(pool);
                }
            }
            User::EditPool { pick: i, menu } => {
                if let Some(i) = pick(self.world.pools.len(), *i) {
                    let mut p = self.world.pools.values().nth(i).cloned().expect("picked");
                    let name = p.metadata.name.clone().unwrap_or_default();
                    let spec = &mut p.spec;
                    match menu % 6 {
                        0 => spec.headroom.blocks = 0,
                        1 => spec.headroom.blocks = 3,
                        // Invalid when max was lowered to 1: the pool then decides nothing.
                        2 => spec.ranges.min = 2,
                        3 => {
                            spec.ranges.max = 1;
                            spec.ranges.min = spec.ranges.min.min(1);
                            self.max_tampered.insert(name);
                        }
                        4 => spec.scale_down.empty_for = "0s".into(),
                        _ => spec.scale_down.empty_for = "2m".into(),
                    }
                    p.metadata.generation = Some(p.metadata.generation.unwrap_or(1) + 1);
                    self.world.put_pool(p);
                }
            }
            User::DeletePool { pick: i } => {
                if let Some(i) = pick(self.world.pools.len(), *i) {
                    let name = self.world.pools.keys().nth(i).cloned().unwrap_or_default();
                    self.world.delete_pool(&name, self.wall);
                }
            }
            User::EditStatus { pick: i } => {
                if let Some(i) = pick(self.world.configs.len(), *i) {
                    let mut c = self.world.configs.values().nth(i).cloned().expect("picked");
                    let name = c.metadata.name.clone().unwrap_or_default();
                    let mut status = c.status.clone().unwrap_or_default();
                    status.nodes = Some(999);
                    c.status = Some(status);
                    self.world.put_config(c);
                    self.world.status_tampered.insert(name, true);
                }
            }
        }
    }

    /// The config that went last, created again under its name: a new object (a new UID)
    /// with the same spec.
    fn create_again(&mut self) {
        let Some(gone) = self.world.last_gone.clone() else {
            return;
        };
        let name = gone.metadata.name.clone().unwrap_or_default();
        if self.world.configs.contains_key(&name) || controller_uid(&gone).is_some() {
            return;
        }
        let mut c = NodeIPAMConfig::new(&name, gone.spec.clone());
        c.metadata.uid = Some(self.world.uid("config"));
        c.metadata.generation = Some(1);
        c.metadata.creation_timestamp = Some(world::time(self.wall));
        self.world.put_config(c);
    }

    /// A hand edit of output `i`: a ConfigMap replaced by one that holds nothing of ours, or
    /// deleted; one of our IPPools given another CIDR, or deleted (with none, a pool of ours
    /// that no range wants is made).
    fn edit_output(&mut self, i: usize, delete: bool) {
        if i < 2 {
            let data = (!delete).then(|| BTreeMap::from([("edited".into(), "by hand".into())]));
            self.world.put_configmap(i, data);
            return;
        }
        let first = self.world.outputs[i].iter().next();
        let (name, mut pool) = match first {
            Some((name, pool)) => (name.clone(), pool.clone()),
            None if delete => return,
            None => {
                let pool = serde_json::json!({
                    "apiVersion": "crd.projectcalico.org/v1",
                    "kind": "IPPool",
                    "metadata": { "name": "nodeipam-by-hand", "labels": { MANAGED_BY.0: MANAGED_BY.1 } },
                    "spec": { "cidr": "10.99.0.0/24" },
                });
                let pool = serde_json::from_value(pool).expect("a pool is a dynamic object");
                ("nodeipam-by-hand".to_string(), pool)
            }
        };
        if !delete {
            pool.data["spec"]["cidr"] = "192.168.0.0/24".into();
        }
        self.world.put_object(i, &name, (!delete).then_some(pool));
    }

    // ----- invariants -----

    /// Checked after every action.
    fn check(&self) -> Result<(), Violation> {
        self.check_no_overlap()?;
        self.check_published()?;
        self.check_drained()?;
        self.check_blocks_have_a_config()?;
        self.check_pools()
    }

    /// Children of pools: no two overlap, each lies in its pool's budget, and no pool has more
    /// active children than its max.
    fn check_pools(&self) -> Result<(), Violation> {
        let children: Vec<(&String, &NodeIPAMConfig, &String)> = self
            .world
            .configs
            .iter()
            .filter_map(|(n, c)| {
                let pool = c.metadata.labels.as_ref()?.get(POOL_LABEL)?;
                Some((n, c, pool))
            })
            .collect();
        let parsed: Vec<&[IpNet]> = children
            .iter()
            .map(|(n, _, _)| {
                self.world
                    .config_ranges
                    .get(*n)
                    .map_or(&[][..], Vec::as_slice)
            })
            .collect();
        for (i, (a, _, _)) in children.iter().enumerate() {
            for (j, (b, _, _)) in children.iter().enumerate().skip(i + 1) {
                for ra in parsed[i] {
                    if let Some(rb) = parsed[j].iter().find(|rb| nets_overlap(ra, rb)) {
                        return Err(Violation {
                            rule: "no two children of pools overlap",
                            detail: format!("{a} has {ra} and {b} has {rb}"),
                        });
                    }
                }
            }
        }
        for (pool_name, pool) in &self.world.pools {
            let ours: Vec<&NodeIPAMConfig> = children
                .iter()
                .filter(|(_, c, p)| *p == pool_name && controller_uid(c) == pool.metadata.uid)
                .map(|(_, c, _)| *c)
                .collect();
            let budget: Vec<IpNet> = [&pool.spec.ipv4, &pool.spec.ipv6]
                .into_iter()
                .flatten()
                .flat_map(|f| f.cidrs.iter().filter_map(|c| c.parse::<IpNet>().ok()))
                .collect();
            for c in &ours {
                for r in ranges(c) {
                    if !budget.iter().any(|b| b.contains(&r)) {
                        return Err(Violation {
                            rule: "every child lies in its pool's budget",
                            detail: format!(
                                "{} has {r}, outside {budget:?} of pool {pool_name}",
                                c.metadata.name.as_deref().unwrap_or("")
                            ),
                        });
                    }
                }
            }
            let active = ours
                .iter()
                .filter(|c| {
                    c.metadata.deletion_timestamp.is_none()
                        && c.spec.allocation == Allocation::Enabled
                })
                .count();
            if !self.max_tampered.contains(pool_name) && active > pool.spec.ranges.max as usize {
                return Err(Violation {
                    rule: "no pool has more ranges than its max",
                    detail: format!(
                        "pool {pool_name} has {active} active children, max {}",
                        pool.spec.ranges.max
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every block a node holds or may still receive: a write stuck in the API server lands
    /// later unless its node is gone, replaced (the UID precondition) or has podCIDRs by then.
    /// The last field says whether a controller wrote it.
    fn held(&self) -> Vec<(&str, IpNet, bool)> {
        let landed = self.world.nodes.iter().flat_map(|(name, n)| {
            n.nets()
                .into_iter()
                .map(move |c| (name.as_str(), c, n.ours))
        });
        let may_land = self
            .procs
            .iter()
            .flat_map(|p| &p.late)
            .filter(|job| {
                self.world.nodes.get(&job.node).is_some_and(|n| {
                    n.cidrs.is_empty() && job.uid.as_ref().is_none_or(|u| *u == n.uid)
                })
            })
            .flat_map(|job| job.cidrs.iter().map(|c| (job.node.as_str(), *c, true)));
        landed.chain(may_land).collect()
    }

    fn check_no_overlap(&self) -> Result<(), Violation> {
        let held = self.held();
        for (i, (a, ca, _)) in held.iter().enumerate() {
            for (b, cb, _) in &held[i + 1..] {
                if a != b && nets_overlap(ca, cb) {
                    return Err(Violation {
                        rule: "no two nodes hold overlapping podCIDRs",
                        detail: format!("{a} holds {ca} and {b} holds {cb}"),
                    });
                }
            }
        }
        Ok(())
    }

    fn check_published(&self) -> Result<(), Violation> {
        for (i, objects) in self.world.outputs.iter().enumerate() {
            if self.world.output_tampered[i] {
                continue;
            }
            let cidrs = output(i).kind.read_objects(objects).cidrs;
            for (node, block, ours) in self.held() {
                if ours && !covered(&block, &cidrs) {
                    return Err(Violation {
                        rule: "every range a node holds a block from is published",
                        detail: format!("{node} holds {block} but {} has {cidrs:?}", output(i)),
                    });
                }
            }
        }
        Ok(())
    }

    /// The config that owns a block: the oldest whose range contains it.
    fn owner(&self, block: &IpNet) -> Option<&NodeIPAMConfig> {
        self.world
            .configs
            .iter()
            .filter(|(name, _)| {
                self.world
                    .config_ranges
                    .get(*name)
                    .is_some_and(|rs| rs.iter().any(|r| r.contains(block)))
            })
            .map(|(_, c)| c)
            .min_by_key(|c| order(c))
    }

    fn check_drained(&self) -> Result<(), Violation> {
        for (name, c) in &self.world.configs {
            if self
                .world
                .status_tampered
                .get(name)
                .copied()
                .unwrap_or(false)
            {
                continue;
            }
            let drained = c.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|k| k.type_ == CONDITION_DRAINED && k.status == "True")
            });
            if !drained {
                continue;
            }
            for (node, block, _) in self.held() {
                if self.owner(&block).and_then(|o| o.metadata.name.as_deref()) == Some(name) {
                    return Err(Violation {
                        rule: "Drained only when no node holds a block",
                        detail: format!("{name} is Drained while {node} holds {block}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Every block we wrote lies in a config that still exists (its finalizer held it).
    fn check_blocks_have_a_config(&self) -> Result<(), Violation> {
        for (node, block, ours) in self.held() {
            if ours && self.owner(&block).is_none() {
                return Err(Violation {
                    rule: "a config is removed only when no node holds a block from it",
                    detail: format!("{node} holds {block}, which no config contains"),
                });
            }
        }
        Ok(())
    }

    fn check_released(&self, gone: &NodeIPAMConfig) -> Result<(), Violation> {
        let name = gone.metadata.name.clone().unwrap_or_default();
        for (node, block, _) in self.held() {
            let older_owner = self.owner(&block).is_some_and(|o| order(o) < order(gone));
            if ranges(gone).iter().any(|r| r.contains(&block)) && !older_owner {
                return Err(Violation {
                    rule: "the finalizer goes only when no node holds a block",
                    detail: format!("{name} released while {node} holds {block}"),
                });
            }
        }
        Ok(())
    }

    // ----- quiescence and liveness -----

    /// No more faults and no user: everything in flight lands, every event is delivered, time
    /// passes beyond every retry. Then a freshly started machine must agree with the world.
    pub fn calm(&mut self) -> Result<(), Violation> {
        if !self.procs[self.leader()].started {
            self.act(&Action::StartLeader)?;
        }
        let l = self.leader();
        // Whatever is still stuck in the API server lands (or is refused) before the rest.
        for back in 0..=l {
            while !self.procs[l - back].sent.is_empty() {
                let proc = u8::try_from(back).unwrap_or(u8::MAX);
                self.act(&Action::LandSent { proc, pick: 0 })?;
            }
        }
        let mut rested = false;
        for round in 0..400 {
            let mut busy = false;
            for s in streams(self.setup.outputs, true) {
                while self.procs[l].queues.get(&s).is_some_and(|q| !q.is_empty()) {
                    self.act(&Action::Deliver { proc: 0, stream: s })?;
                    busy = true;
                }
            }
            while !self.procs[l].writes.is_empty() {
                let fault = WriteFault::None;
                self.act(&Action::Write {
                    proc: 0,
                    pick: 0,
                    fault,
                })?;
                busy = true;
            }
            while !self.procs[l].late.is_empty() {
                self.act(&Action::LandLate { proc: 0, pick: 0 })?;
                busy = true;
            }
            while !self.procs[l].rereads.is_empty() {
                self.act(&Action::Reread {
                    proc: 0,
                    pick: 0,
                    fail: false,
                })?;
                busy = true;
            }
            while !self.procs[l].answers.is_empty() {
                self.act(&Action::Answer { proc: 0, pick: 0 })?;
                busy = true;
            }
            while !self.procs[l].pool_jobs.is_empty() {
                self.act(&Action::PoolJob {
                    proc: 0,
                    pick: 0,
                    fault: PoolFault::None,
                })?;
                busy = true;
            }
            while !self.procs[l].config_jobs.is_empty() {
                self.act(&Action::ConfigJob {
                    proc: 0,
                    pick: 0,
                    fail: false,
                    late: false,
                })?;
                busy = true;
            }
            if self.procs[l].publish.is_some() {
                let publish = Action::Publish {
                    proc: 0,
                    fail_first: false,
                    fail_second: false,
                    fail_pools: None,
                    late: None,
                };
                self.act(&publish)?;
                busy = true;
            }
            // Time passes: parked nodes wake, coalesced status and publication go out.
            let advance_ms = if round % 10 == 9 { 61_000 } else { 300 };
            self.act(&Action::Tick {
                proc: 0,
                advance_ms,
            })?;
            if !busy && round > 20 && self.quiet(l) {
                if rested {
                    return self.check_liveness();
                }
                // One pause longer than any emptyFor: every child due retires, and then
                // the world must be quiet again.
                self.act(&Action::Tick {
                    proc: 0,
                    advance_ms: LONG_REST_MS,
                })?;
                rested = true;
            } else {
                rested = false;
            }
        }
        Err(Violation {
            rule: "the controller comes to rest",
            detail: format!(
                "still busy after 400 calm rounds: {} writes, {} config jobs, publish {}",
                self.procs[l].writes.len(),
                self.procs[l].config_jobs.len(),
                self.procs[l].publish.is_some()
            ),
        })
    }

    /// The leader does everything it has to do, with no fault, until nothing is left (its
    /// publishes only when `publish`): for schedules written by hand.
    pub fn settle(&mut self, publish: bool) -> Result<(), Violation> {
        for _ in 0..50 {
            let l = self.leader();
            let p = &self.procs[l];
            let mut next = Vec::new();
            for (s, q) in &p.queues {
                next.extend(q.iter().map(|_| Action::Deliver {
                    proc: 0,
                    stream: *s,
                }));
            }
            let write = |fault| Action::Write {
                proc: 0,
                pick: 0,
                fault,
            };
            next.extend(p.writes.iter().map(|_| write(WriteFault::None)));
            next.extend(
                p.answers
                    .iter()
                    .map(|_| Action::Answer { proc: 0, pick: 0 }),
            );
            next.extend(p.config_jobs.iter().map(|_| Action::ConfigJob {
                proc: 0,
                pick: 0,
                fail: false,
                late: false,
            }));
            next.extend(p.pool_jobs.iter().map(|_| Action::PoolJob {
                proc: 0,
                pick: 0,
                fault: PoolFault::None,
            }));
            if publish && p.publish.is_some() {
                next.push(Action::Publish {
                    proc: 0,
                    fail_first: false,
                    fail_second: false,
                    fail_pools: None,
                    late: None,
                });
            }
            next.push(Action::Tick {
                proc: 0,
                advance_ms: 1_100,
            });
            for action in &next {
                self.act(action)?;
            }
        }
        Ok(())
    }

    /// What a block's node holds now, by node name.
    pub fn podcidrs(&self, node: &str) -> Vec<String> {
        self.world
            .nodes
            .get(node)
            .map(|n| n.cidrs.clone())
            .unwrap_or_default()
    }

    /// The leader's config jobs not yet written, in the order `Action::ConfigJob` picks them.
    pub fn config_jobs(&self) -> &[ConfigJob] {
        &self.procs[self.leader()].config_jobs
    }

    /// The config `name` as the API server holds it.
    pub fn config(&self, name: &str) -> Option<&NodeIPAMConfig> {
        self.world.configs.get(name)
    }

    fn quiet(&self, l: usize) -> bool {
        let p = &self.procs[l];
        p.queues.values().all(VecDeque::is_empty)
            && p.writes.is_empty()
            && p.late.is_empty()
            && p.config_jobs.is_empty()
            && p.pool_jobs.is_empty()
            && p.publish.is_none()
            && p.answers.is_empty()
            && p.rereads.is_empty()
    }

    /// At rest, a deleted config that holds no block of its own is gone. Checked against the
    /// world, not against a fresh machine that could share the running one's mistake. (At rest
    /// every config carries our finalizer, so ownership is the oldest config's, as here.)
    fn check_drained_configs_went(&self) -> Result<(), Violation> {
        let leaked = self.leaked();
        for (name, c) in &self.world.configs {
            // A leak holds its config until its write can no longer land (a write lost for
            // good still counts until its node goes, gets podCIDRs, or a restart).
            if c.metadata.deletion_timestamp.is_none() || leak_holds(c, &leaked) {
                continue;
            }
            let owned = self.held().into_iter().any(|(_, block, _)| {
                self.owner(&block).and_then(|o| o.metadata.name.as_deref()) == Some(name)
            });
            if !owned {
                return Err(Violation {
                    rule: "every drained config loses our finalizer",
                    detail: format!(
                        "at rest, {name} is deleted, holds no block, and is still there"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The blocks the leader keeps for writes whose outcome it does not know.
    fn leaked(&self) -> Vec<IpNet> {
        self.procs[self.leader()]
            .machine
            .ipam()
            .holders()
            .filter(|(_, holders)| holders.iter().any(|h| matches!(h, Holder::Leaked(_))))
            .map(|(block, _)| *block)
            .collect()
    }

    /// At rest, no node waits for a block while the pool that selects it best could carve one
    /// more range: checked against the world, not against a fresh machine that could share
    /// the running one's mistake.
    fn check_pools_serve(&self) -> Result<(), Violation> {
        let leaks = self.procs[self.leader()]
            .machine
            .ipam()
            .holders()
            .any(|(_, holders)| holders.iter().any(|h| matches!(h, Holder::Leaked(_))));
        if leaks {
            return Ok(());
        }
        let mut taken: Vec<IpNet> = self.world.configs.values().flat_map(ranges).collect();
        taken.extend(
            self.world
                .services
                .values()
                .flatten()
                .filter_map(|c| c.parse::<IpNet>().ok()),
        );
        if self.setup.service_flag {
            taken.push(SERVICE_FLAG.parse().expect("flag literal"));
        }
        for (name, node) in self.world.nodes.iter().filter(|(_, n)| n.cidrs.is_empty()) {
            let labels: BTreeMap<String, String> = node.labels.iter().cloned().collect();
            let view = nodeipam_alloc::selection::NodeView {
                name,
                labels: &labels,
            };
            let best = self
                .world
                .pools
                .values()
                .map(nodeipam_alloc::pool::pool_input)
                .filter(|p| p.invalid.is_none())
                .filter_map(|p| {
                    nodeipam_alloc::selection::match_score(p.selector.as_ref(), view)
                        .map(|s| (s, p))
                })
                .max_by(|(sa, pa), (sb, pb)| sa.cmp(sb).then(pb.name.cmp(&pa.name)));
            let Some((_, pool)) = best else {
                continue;
            };
            if self.max_tampered.contains(&pool.name) {
                continue;
            }
            let active = self
                .world
                .configs
                .values()
                .filter(|c| {
                    controller_uid(c) == pool.uid
                        && c.metadata.deletion_timestamp.is_none()
                        && c.spec.allocation == Allocation::Enabled
                })
                .count();
            if active >= pool.max as usize {
                continue;
            }
            let mut others = taken.clone();
            others.extend(
                self.world
                    .pools
                    .values()
                    .filter(|p| p.metadata.name.as_deref() != Some(pool.name.as_str()))
                    .flat_map(|p| {
                        nodeipam_alloc::pool::pool_input(p)
                            .budget()
                            .copied()
                            .collect::<Vec<_>>()
                    }),
            );
            let room: Vec<IpNet> = pool
                .families()
                .map(|f| nodeipam_alloc::pool::lowest_free(&f.cidrs, f.range_mask, &others))
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default();
            if !room.is_empty() {
                return Err(Violation {
                    rule: "pending matching nodes get blocks while the budget has room",
                    detail: format!(
                        "at rest, {name} waits while pool {} could carve {room:?}",
                        pool.name
                    ),
                });
            }
        }
        Ok(())
    }

    /// A machine started now from the world: it must find nothing to do but what the running
    /// one already did.
    fn check_liveness(&self) -> Result<(), Violation> {
        self.check_drained_configs_went()?;
        self.check_pools_serve()?;
        let mut fresh = Machine::new(self.options());
        let now = Now {
            mono: Duration::from_secs(3600),
            wall_seconds: self.wall,
        };
        let mut effects = Vec::new();
        for s in streams(self.setup.outputs, true) {
            for change in self.world.list(s) {
                effects.extend(fresh.handle(now, change.into_input()));
            }
        }
        // Its first publish lands (at rest the outputs hold it already): until then it relies
        // on no output.
        let published: Vec<Input> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Publish(network) => Some(Input::Published(network.clone())),
                _ => None,
            })
            .collect();
        for input in published {
            effects.extend(fresh.handle(now, input));
        }
        effects.extend(fresh.handle(now, Input::Tick));
        // Later than every emptyFor: a child the running machine should have retired shows.
        let later = Now {
            mono: Duration::from_secs(3600 * 3),
            wall_seconds: self.wall,
        };
        effects.extend(fresh.handle(later, Input::Tick));
        let leaked = self.leaked();
        let leaky = |name: &str| {
            self.world
                .configs
                .get(name)
                .is_some_and(|c| leak_holds(c, &leaked))
        };
        for e in &effects {
            match e {
                // A block the running machine leaked is taken for it until a restart.
                Effect::Write(job)
                    if job
                        .cidrs
                        .iter()
                        .any(|c| leaked.iter().any(|b| nets_overlap(b, c))) => {}
                Effect::Write(job) => {
                    return Err(Violation {
                        rule: "every node some config can serve has podCIDRs",
                        detail: format!(
                            "at rest, {} has none, yet a fresh start gives it {:?} from {}",
                            job.node, job.cidrs, job.config
                        ),
                    });
                }
                // The running machine holds it for a leak; a restart forgets the leak.
                Effect::Config(ConfigJob::RemoveFinalizer { name, .. }) if leaky(name) => {}
                Effect::Config(ConfigJob::RemoveFinalizer { name, .. }) => {
                    return Err(Violation {
                        rule: "every drained config loses our finalizer",
                        detail: format!("at rest, {name} is drained but keeps the finalizer"),
                    });
                }
                Effect::Config(ConfigJob::AddFinalizer { name }) => {
                    return Err(Violation {
                        rule: "every config gets our finalizer",
                        detail: format!("at rest, {name} has no finalizer"),
                    });
                }
                // Leaked blocks count as allocated until a restart forgets them.
                Effect::Config(ConfigJob::Status { name, .. }) if leaky(name) => {}
                Effect::CreateConfig(child) => {
                    return Err(Violation {
                        rule: "pending matching nodes get blocks while the budget has room",
                        detail: format!(
                            "at rest, a fresh start carves {:?} {:?} for pool {}",
                            child.ipv4, child.ipv6, child.pool
                        ),
                    });
                }
                Effect::EnableConfig(child) => {
                    return Err(Violation {
                        rule: "a pool's children within its max are enabled",
                        detail: format!(
                            "at rest, a fresh start enables {} of pool {}",
                            child.name, child.pool
                        ),
                    });
                }
                Effect::DeleteConfig { name, .. } if !leaky(name) => {
                    return Err(Violation {
                        rule: "empty children beyond min retire after emptyFor",
                        detail: format!("at rest, a fresh start retires {name}"),
                    });
                }
                Effect::PoolStatus { name, status, .. } => {
                    let world = self.world.pools.get(name).and_then(|p| p.status.as_ref());
                    let facts = |s: &PoolStatus| {
                        let conditions: Vec<(String, String, String)> = s
                            .conditions
                            .iter()
                            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
                            .collect();
                        (s.ranges.clone(), s.ipv4, s.ipv6, conditions)
                    };
                    let leaks = self.world.configs.values().any(|c| {
                        c.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL)) == Some(name)
                            && leaky(c.metadata.name.as_deref().unwrap_or(""))
                    });
                    if !leaks && world.map(facts) != Some(facts(status)) {
                        return Err(Violation {
                            rule: "a pool's status equals a recount",
                            detail: format!("{name}: status {world:?}, recount {status:?}"),
                        });
                    }
                }
                Effect::Config(ConfigJob::Status { name, status, .. }) => {
                    let world = self.world.configs.get(name).and_then(|c| c.status.as_ref());
                    let counts = |s: &nodeipam_crd::NodeIPAMConfigStatus| (s.nodes, s.ipv4, s.ipv6);
                    if world.map(counts) != Some(counts(status)) {
                        return Err(Violation {
                            rule: "status counts equal a recount",
                            detail: format!("{name}: status {world:?}, recount {status:?}"),
                        });
                    }
                }
                _ => {}
            }
        }
        let mut truth = fresh.network();
        // A range a leak holds stays published until the leak ends, which a restart forgets:
        // then the running machine's network is the truth, if it differs from the fresh one's
        // only by such ranges.
        let leaky_ranges: Vec<IpNet> = self
            .world
            .configs
            .values()
            .filter(|c| leak_holds(c, &leaked))
            .flat_map(ranges)
            .collect();
        if !leaky_ranges.is_empty() {
            let running = self.procs[self.leader()].machine.network();
            let (ours, theirs) = (running.cidrs(), truth.cidrs());
            if !theirs.is_subset(&ours)
                || ours.difference(&theirs).any(|c| !leaky_ranges.contains(c))
            {
                return Err(Violation {
                    rule: "the published outputs equal the truth",
                    detail: format!(
                        "the running machine's network {ours:?} differs from a fresh start's {theirs:?} by more than the leaked ranges {leaky_ranges:?}"
                    ),
                });
            }
            truth = running;
        }
        for (i, objects) in self.world.outputs.iter().enumerate() {
            let output = output(i);
            let want = output.desired(&truth, &[]).cidrs;
            let have = output.kind.read_objects(objects).cidrs;
            if want != have {
                return Err(Violation {
                    rule: "the published outputs equal the truth",
                    detail: format!("{output}: published {have:?}, truth {want:?}"),
                });
            }
        }
        Ok(())
    }
}

/// The answers that may come next: write outcomes and re-reads in any order (they run
/// concurrently), but the config writer's and the publisher's reports in the order they were
/// written (each is one task writing one thing at a time).
fn deliverable(answers: &[Input]) -> Vec<usize> {
    let first = |f: fn(&Input) -> bool| answers.iter().position(f);
    let config = first(|a| matches!(a, Input::ConfigWritten(_)));
    let published = first(|a| matches!(a, Input::Published(_)));
    answers
        .iter()
        .enumerate()
        .filter(|(i, a)| match a {
            Input::ConfigWritten(_) => Some(*i) == config,
            Input::Published(_) => Some(*i) == published,
            _ => true,
        })
        .map(|(i, _)| i)
        .collect()
}

/// `NODEIPAM_SIM_VERBOSE=1` prints every action, input and effect of a replay.
fn verbose() -> bool {
    std::env::var_os("NODEIPAM_SIM_VERBOSE").is_some()
}

fn brief(text: &str) -> String {
    let text: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.char_indices().nth(400) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

fn track_service(
    services: &mut BTreeMap<String, Vec<IpNet>>,
    listed: &mut BTreeSet<String>,
    w: &nodeipam_alloc::machine::Watch<k8s_openapi::api::networking::v1::ServiceCIDR>,
) {
    use nodeipam_alloc::machine::Watch;
    let cidrs = |s: &k8s_openapi::api::networking::v1::ServiceCIDR| -> Vec<IpNet> {
        s.spec
            .as_ref()
            .and_then(|s| s.cidrs.clone())
            .unwrap_or_default()
            .iter()
            .filter_map(|c| c.parse().ok())
            .collect()
    };
    let name = |s: &k8s_openapi::api::networking::v1::ServiceCIDR| {
        s.metadata.name.clone().unwrap_or_default()
    };
    match w {
        Watch::ListStart => listed.clear(),
        Watch::Listed(s) => {
            listed.insert(name(s));
            services.insert(name(s), cidrs(s));
        }
        Watch::Applied(s) => {
            services.insert(name(s), cidrs(s));
        }
        // Removal is safe to forget at once: a later block in the range is no longer wrong.
        Watch::Deleted(s) => {
            services.remove(&name(s));
        }
        // What a relist lacks is gone (the flag's ranges are not a watched object).
        Watch::ListDone => {
            services.retain(|source, _| source.starts_with("--") || listed.contains(source));
        }
    }
}

/// Whether one of `leaked` lies in the config's ranges: the leak holds it.
fn leak_holds(c: &NodeIPAMConfig, leaked: &[IpNet]) -> bool {
    ranges(c)
        .iter()
        .any(|r| leaked.iter().any(|b| nets_overlap(r, b)))
}

fn ranges(c: &NodeIPAMConfig) -> Vec<IpNet> {
    [&c.spec.ipv4, &c.spec.ipv6]
        .into_iter()
        .flatten()
        .filter_map(|f| f.cidr.parse().ok())
        .collect()
}

/// Which of two overlapping configs is the older, as the allocation state decides it.
fn order(c: &NodeIPAMConfig) -> (i64, String) {
    let created = c.metadata.creation_timestamp.as_ref();
    let name = c.metadata.name.clone().unwrap_or_default();
    (created.map_or(i64::MAX, |t| t.0.as_second()), name)
}

// ----- schedules -----

/// SplitMix64: small, fast, and the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn byte(&mut self) -> u8 {
        (self.next() & 0xff) as u8
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A seed's setup and schedule.
pub fn generate(seed: u64, steps: usize) -> (Setup, Vec<Action>) {
    let mut rng = Rng::new(seed);
    let setup = Setup {
        outputs: rng.below(4) as usize,
        service_flag: rng.chance(50),
        // From the seed, not the generator: the rest of each schedule stays as it was.
        write_attempts: if seed % 2 == 1 { 1 } else { 3 },
    };
    let all_streams = streams(setup.outputs, true);
    // One seed in four follows deleted configs and new pools with the late writes of their
    // release and retirement, drawn from a second generator: the other seeds' schedules stay
    // as they were (the seeds the mutations are found at stay meaningful).
    let mut side = (seed % 4 == 3).then(|| Rng::new(seed ^ 0x005E_ED0F_1A7E));
    let mut actions = Vec::with_capacity(steps);
    if rng.chance(60) {
        actions.push(Action::User(User::CreatePool { menu: rng.byte() }));
    }
    while actions.len() < steps {
        let proc = u8::from(rng.chance(15));
        let action = match rng.below(100) {
            0..=2 => Action::PoolJob {
                proc,
                pick: rng.byte(),
                fault: match rng.below(10) {
                    0 => PoolFault::Failed,
                    1 => PoolFault::LandedUnanswered,
                    2 => PoolFault::Stuck,
                    _ => PoolFault::None,
                },
            },
            3 if rng.chance(50) => Action::LandLate {
                proc,
                pick: rng.byte(),
            },
            3 => Action::LandSent {
                proc,
                pick: rng.byte(),
            },
            4..=34 => Action::Deliver {
                proc: 0,
                stream: all_streams[rng.below(all_streams.len() as u64) as usize],
            },
            35..=46 => Action::Write {
                proc,
                pick: rng.byte(),
                fault: match rng.below(20) {
                    0 => WriteFault::LandedUnanswered,
                    1 => WriteFault::LostUnanswered,
                    2 | 3 => WriteFault::Refused,
                    4 => WriteFault::Throttled,
                    5 => WriteFault::LostUnreadable,
                    6 => WriteFault::LandsLate,
                    7 => WriteFault::NotSent,
                    _ => WriteFault::None,
                },
            },
            47..=56 => Action::Answer {
                proc: 0,
                pick: rng.byte(),
            },
            57..=63 => Action::ConfigJob {
                proc,
                pick: rng.byte(),
                fail: rng.chance(10),
                late: rng.chance(10),
            },
            64..=67 => Action::Publish {
                proc,
                fail_first: rng.chance(10),
                fail_second: rng.chance(20),
                fail_pools: rng.chance(20).then(|| rng.byte()),
                late: rng.chance(15).then(|| rng.byte() % 4),
            },
            68..=69 => Action::Reread {
                proc: 0,
                pick: rng.byte(),
                fail: rng.chance(20),
            },
            70..=76 => Action::Tick {
                proc: 0,
                advance_ms: if rng.chance(5) { 61_000 } else { 200 },
            },
            77 => Action::Resync { proc: 0 },
            78 => Action::Relist {
                proc: 0,
                stream: all_streams[rng.below(all_streams.len() as u64) as usize],
            },
            79 => {
                if rng.chance(30) {
                    Action::Failover
                } else {
                    Action::StartLeader
                }
            }
            80 => Action::ClockJump {
                seconds: if rng.chance(50) { -3600 } else { 86_400 },
            },
            _ => Action::User(user(&mut rng)),
        };
        let created = matches!(action, Action::User(User::CreateConfig { .. }));
        let deleted = matches!(action, Action::User(User::DeleteConfig { .. }));
        let pooled = matches!(action, Action::User(User::CreatePool { .. }));
        actions.push(action);
        if created && rng.chance(25) {
            actions.extend(deposed_mid_toggle(&mut rng, &all_streams));
        }
        if let Some(side) = side.as_mut().filter(|_| deleted || pooled)
            && side.chance(50)
        {
            actions.extend(if deleted {
                released_then_created_again(side, &all_streams)
            } else {
                retired_then_used(side, &all_streams)
            });
        }
    }
    actions.truncate(steps);
    (setup, actions)
}

/// The sequence the fences of issue 45 are about, which uniform steps reach too rarely: the
/// leader publishes a config just created, it is disabled, a write about it (a publish or a
/// status) is left stuck, the leader is deposed, the successor starts, the config is enabled
/// again and a node arrives, and the successor works on; the stuck write may land at any step
/// after (each step checks what it would do).
fn deposed_mid_toggle(rng: &mut Rng, streams: &[Stream]) -> Vec<Action> {
    let mut out = Vec::new();
    let work = |rng: &mut Rng, out: &mut Vec<Action>, rounds: usize| {
        work(rng, out, streams, rounds);
    };
    let publish = |late: Option<u8>| Action::Publish {
        proc: 0,
        fail_first: false,
        fail_second: false,
        fail_pools: None,
        late,
    };
    work(rng, &mut out, 3);
    out.push(publish(None));
    work(rng, &mut out, 2);
    out.push(Action::User(User::ToggleNewest));
    work(rng, &mut out, 3);
    out.push(if rng.chance(50) {
        publish(Some(rng.byte() % 4))
    } else {
        Action::ConfigJob {
            proc: 0,
            pick: rng.byte(),
            fail: false,
            late: true,
        }
    });
    out.push(Action::Failover);
    out.push(Action::StartLeader);
    out.push(Action::User(User::ToggleNewest));
    out.push(Action::User(User::CreateNode {
        name: rng.byte(),
        pool_b: rng.chance(30),
    }));
    // A list delivers one object a step: enough rounds for the successor's lists.
    work(rng, &mut out, 14);
    out
}

/// A config just deleted: its release (our finalizer's removal) may be left stuck, the leader
/// may be deposed, then the config is created again under its name (a new object), a node
/// gets a block of it and it is deleted in turn; the stuck removal may land at any step after
/// (each step checks what it would do).
fn released_then_created_again(rng: &mut Rng, streams: &[Stream]) -> Vec<Action> {
    let mut out = Vec::new();
    for _ in 0..4 {
        work(rng, &mut out, streams, 1);
        out.push(Action::ConfigJob {
            proc: 0,
            pick: rng.byte(),
            fail: false,
            late: true,
        });
    }
    if rng.chance(50) {
        out.extend([Action::Failover, Action::StartLeader]);
    }
    work(rng, &mut out, streams, 6);
    out.push(Action::User(User::CreateAgain));
    out.push(Action::User(User::CreateNode {
        name: rng.byte(),
        pool_b: rng.chance(30),
    }));
    work(rng, &mut out, streams, 10);
    out.push(Action::User(User::DeleteNewest));
    work(rng, &mut out, streams, 3);
    out
}

/// A pool just created: its children are carved, then left empty past emptyFor; the pool's
/// writes (a retiring child's delete among them) may be left stuck, the leader may be deposed,
/// and nodes arrive that the children serve; the stuck writes may land at any step after (each
/// step checks what they would do).
fn retired_then_used(rng: &mut Rng, streams: &[Stream]) -> Vec<Action> {
    let mut out = Vec::new();
    let pool_job = |rng: &mut Rng, fault| Action::PoolJob {
        proc: 0,
        pick: rng.byte(),
        fault,
    };
    for _ in 0..6 {
        work(rng, &mut out, streams, 1);
        out.push(pool_job(rng, PoolFault::None));
    }
    out.push(Action::Tick {
        proc: 0,
        advance_ms: 61_000,
    });
    for _ in 0..3 {
        work(rng, &mut out, streams, 1);
        out.push(pool_job(rng, PoolFault::Stuck));
    }
    if rng.chance(50) {
        out.extend([Action::Failover, Action::StartLeader]);
    }
    for _ in 0..2 {
        out.push(Action::User(User::CreateNode {
            name: rng.byte(),
            pool_b: rng.chance(50),
        }));
    }
    for _ in 0..12 {
        work(rng, &mut out, streams, 1);
        out.push(pool_job(rng, PoolFault::None));
        out.push(Action::Publish {
            proc: 0,
            fail_first: false,
            fail_second: false,
            fail_pools: None,
            late: None,
        });
    }
    out
}

/// Rounds of the leader at work: every stream delivered, an answer, a write and a config job
/// carried out, a tick.
fn work(rng: &mut Rng, out: &mut Vec<Action>, streams: &[Stream], rounds: usize) {
    for _ in 0..rounds {
        for stream in streams {
            out.push(Action::Deliver {
                proc: 0,
                stream: *stream,
            });
        }
        let pick = rng.byte();
        out.push(Action::Answer { proc: 0, pick });
        out.push(Action::Write {
            proc: 0,
            pick,
            fault: WriteFault::None,
        });
        out.push(Action::ConfigJob {
            proc: 0,
            pick,
            fail: false,
            late: false,
        });
        out.push(Action::Tick {
            proc: 0,
            advance_ms: 1_100,
        });
    }
}

fn user(rng: &mut Rng) -> User {
    match rng.below(110) {
        0..=29 => User::CreateNode {
            name: rng.byte(),
            pool_b: rng.chance(30),
        },
        30..=32 => User::CreateUnmanagedNode { name: rng.byte() },
        33..=47 => User::DeleteNode { pick: rng.byte() },
        48..=52 => User::RecreateNode { pick: rng.byte() },
        53..=67 => User::CreateConfig { menu: rng.byte() },
        68..=75 => User::DeleteConfig { pick: rng.byte() },
        76..=80 => User::ToggleConfig { pick: rng.byte() },
        81..=86 => User::SetService {
            name: rng.byte(),
            menu: rng.byte(),
        },
        87..=89 => User::DeleteService { name: rng.byte() },
        90..=94 => User::EditOutput {
            index: rng.byte() % 3,
            delete: rng.chance(50),
        },
        95..=99 => User::EditStatus { pick: rng.byte() },
        100..=104 => User::CreatePool { menu: rng.byte() },
        105..=107 => User::EditPool {
            pick: rng.byte(),
            menu: rng.byte(),
        },
        _ => User::DeletePool { pick: rng.byte() },
    }
}

/// A pool object of the menu.
fn pool_object(m: MenuPool, uid: &str, now: i64) -> NodeIPAMPool {
    let (name, v4, v6, pool_b, (min, max, headroom), empty_for) = m;
    let family = |f: Option<(&[&str], u8, u8)>| {
        f.map(|(cidrs, range, node)| PoolFamilySpec {
            cidrs: cidrs.iter().map(ToString::to_string).collect(),
            range_mask_size: range,
            per_node_mask_size: node,
        })
    };
    let spec = NodeIPAMPoolSpec {
        ipv4: family(v4),
        ipv6: family(v6),
        node_selector: pool_b.then(|| fixtures::selecting("pool", "b")),
        ranges: PoolRanges { min, max },
        headroom: PoolHeadroom { blocks: headroom },
        scale_down: PoolScaleDown {
            empty_for: empty_for.into(),
        },
    };
    let mut pool = NodeIPAMPool::new(name, spec);
    pool.metadata.uid = Some(uid.into());
    pool.metadata.generation = Some(1);
    pool.metadata.creation_timestamp = Some(world::time(now));
    pool
}

/// Runs a schedule, then calms the world and checks liveness. On a violation: which action.
pub fn run(setup: &Setup, actions: &[Action]) -> Result<(), (usize, Violation)> {
    let mut sim = Sim::new(setup.clone());
    for (i, action) in actions.iter().enumerate() {
        sim.act(action).map_err(|v| (i, v))?;
    }
    sim.calm().map_err(|v| (actions.len(), v))
}

/// Runs a schedule as `run` does and returns every input and effect the machines saw, in order.
pub fn run_traced(
    setup: &Setup,
    actions: &[Action],
) -> (Result<(), (usize, Violation)>, Vec<String>) {
    let mut sim = Sim::new(setup.clone());
    sim.trace = Some(Vec::new());
    let mut result = Ok(());
    for (i, action) in actions.iter().enumerate() {
        if let Err(v) = sim.act(action) {
            result = Err((i, v));
            break;
        }
    }
    if result.is_ok() {
        result = sim.calm().map_err(|v| (actions.len(), v));
    }
    (result, sim.trace.take().unwrap_or_default())
}

/// The shortest schedule found that still breaks the same rule: drops chunks, then single
/// actions, while the failure stays.
pub fn shrink(setup: &Setup, actions: &[Action], rule: &str) -> Vec<Action> {
    let fails = |a: &[Action]| matches!(run(setup, a), Err((_, v)) if v.rule == rule);
    let mut current = actions.to_vec();
    if let Err((at, _)) = run(setup, &current) {
        current.truncate((at + 1).min(current.len()));
    }
    let mut chunk = current.len() / 2;
    while chunk >= 1 {
        let mut start = 0;
        while start < current.len() {
            let mut candidate = current.clone();
            let end = (start + chunk).min(candidate.len());
            candidate.drain(start..end);
            if fails(&candidate) {
                current = candidate;
            } else {
                start += chunk;
            }
        }
        chunk /= 2;
    }
    current
}
