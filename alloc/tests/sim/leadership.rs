//! Leadership in the simulator: 2-3 controller processes elect themselves on one Lease and
//! hand out blocks to Nodes, through every rule of `nodeipam_alloc::lease` (the lock's
//! `decide` and `Unchanged`, the fence's `holds` and `ours`, `takeover`, `wait`,
//! `release_mark`, `releasable`, `next_mark`, `unclaimable`, `identity`) and
//! `outcome::may_still_land` / `classify`, as the controller runs them
//! (`controller/src/reconcile/{lease_lock,leader,handover}.rs`, `app.rs`), driven by a seeded
//! schedule. One schedule in four opens with a hand edit under a live leader (`opening`):
//! random schedules almost never line one up with the rest it takes to matter.
//!
//! The world: a Lease store with resourceVersions whose every write by a process is a
//! compare-and-swap of the version it read (a replace: refused once that version is gone);
//! hand edits (holder cleared, holder renamed, the Lease deleted with its finalizer stripped,
//! or deleted the ordinary way and kept terminating by our finalizer); Nodes whose podCIDR (one
//! block, an integer) can only be set while empty. Every process has its own monotonic clock
//! (running within ±1 % of true time, and on through a pause) and its own wall clock (any
//! skew, stepped forward and back), can be frozen for a while (a VM pause, a GC), SIGKILLed
//! (no mark) or stopped cleanly (settle, the settled mark, the release marked stopped), and
//! restarted under the same pod name. A node write is answered as the schedule says (2xx,
//! 400, 409, 422, 429, 500, 502, 503, 504, a reset, no answer) and, unless the answer rules it
//! out (a 2xx landed before it was answered, a 4xx never lands), lands at any moment up to the
//! bound D after it was sent, or never: before or after its answer, and beyond the bound after
//! its sender gave up and after the successor listed.
//!
//! A session as the controller's: once the fence holds, claim the Lease (the mark off, our
//! finalizer on), wait as `lease::wait` says, claim again, list the Nodes (what landed by then
//! is seen, later changes arrive by a watch that lags), then give each pending node the lowest
//! block it does not know to be taken, handling each answer as the node writer does
//! (`classify`; after a refusal or a doubt the node is read again).
//!
//! A Lease being deleted as the controller lets it go (`leader::Release`, `finish_deletion`):
//! once our finalizer is all that keeps it and it names us or nobody, a settle after the
//! first read that showed it so; the next Lease marked as `next_mark` says, from whether the
//! process was leading with its session begun up to that read.
//!
//! Checked after every step: no two Nodes hold the same block, and no two processes hold per
//! the fence at the same moment (except across a hand edit of the Lease: a Lease renamed or
//! freed under a live leader is only seen at its next read, and it is the take-over wait that
//! keeps the two apart; the block check says whether it does).
//!
//! THE TIMING ASSUMPTION (docs/single-writer.md, step 2): a write commits within the write
//! timeout of being sent, by the time its sender gives up on it, or never. A successor lists
//! only a take-over wait (the write timeout) after the last moment the predecessor could send,
//! so it sees every write that will ever land. D is that bound; any pause of the sender
//! between its fence check and its request leaving counts in D. `Setup::beyond` lets writes
//! land up to a minute after they were sent (a handler that runs on to the API server's
//! request timeout, a sender frozen with the request in its buffers): then a write can land
//! after the successor listed and a block is given twice, the known limitation that only a
//! fence free of timing removes ("What would remove the timing assumption").
//!
//! Not modelled: the real allocation machine (blocks are integers, one range, no configs: a
//! Node's UID, deletion or re-creation; `allocated_before` is "a session ever listed", which
//! leaves out the gap docs/single-writer.md names), answers to the Lease writes other than
//! success, a conflict or none, Lease writes that commit late (the gap between a read and its
//! write is as close as it gets), and clocks that stop during a pause.

use std::collections::BTreeMap;
use std::time::Duration;

use nodeipam_alloc::lease::{self, LeaseView, Mark, Step, Took, Unchanged};
use nodeipam_alloc::outcome::{Answer, classify, may_still_land};
use nodeipam_alloc::seal;

use super::{Rng, Violation};

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The controller's defaults: a 15 s Lease renewed 5 s before it ends, a fence margin and
/// poll of a quarter of that grace (capped at 1 s), the write timeout of `app::write_timeout`.
const DURATION: Duration = ms(15_000);
const RENEW_AFTER: Duration = ms(10_000);
const MARGIN: Duration = ms(1_000);
const POLL: Duration = ms(1_000);
const RETRY: Duration = ms(1_000);
const WRITE_TIMEOUT: Duration = ms(4_500);
/// How soon a throttled round of the seal is tried again.
const SEAL_RETRY: Duration = ms(200);
/// How long a replica waits after it first saw a Lease being deleted before it lets it go.
const SETTLE: Duration = ms(5_500);
/// How long a stopping process waits for its writes (`run_until`).
const STOP_LIMIT: Duration = ms(5_500);
/// Reads and conflicting writes in one lock attempt.
const TRIES: usize = 3;
/// D beyond the bound.
const BEYOND: Duration = ms(60_000);
const BLOCKS: u32 = 64;
/// Microseconds since the epoch of true time zero.
const WALL_ZERO: i64 = 1_800_000_000_000_000;

/// The settings of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setup {
    /// Per process slot: the monotonic clock's rate off true time (in 1/10,000) and the wall
    /// clock's offset (seconds).
    pub drift: Vec<i64>,
    pub skew: Vec<i64>,
    /// Slots 0 and 1 run under one pod name (a copied manifest).
    pub shared_name: bool,
    /// The names of the Nodes there at the start.
    pub nodes: Vec<u8>,
    /// Writes land up to a minute after they were sent, beyond the bound.
    pub beyond: bool,
}

/// One step of a schedule; `p` picks a process slot (modulo), so a shrunk schedule still
/// means something.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The process does the next thing it has to: an answer, a stop, its lock's attempt, its
    /// poll, a deletion to finish, or a step of its session (`roll` decides a write's fate).
    Run {
        p: u8,
        roll: u64,
    },
    Tick {
        ms: u32,
    },
    /// The lock's read alone, and later the write it decided (a read gone stale).
    Read {
        p: u8,
    },
    Write {
        p: u8,
        lost: bool,
    },
    Node {
        name: u8,
    },
    Pause {
        p: u8,
        ms: u32,
    },
    WallStep {
        p: u8,
        secs: i32,
    },
    Kill {
        p: u8,
    },
    Stop {
        p: u8,
    },
    Start {
        p: u8,
    },
    /// Hand edits of the Lease.
    Free,
    Rename {
        to: u8,
    },
    Delete {
        strip: bool,
    },
}

/// The Lease as stored.
#[derive(Default)]
struct Store {
    lease: Option<LeaseView>,
    version: u64,
    /// Hand edits so far.
    edits: u64,
}

impl Store {
    /// Writes `new` if the Lease is still the version `read` is (a replace); a terminating
    /// Lease left without finalizer is gone.
    fn replace(&mut self, read: &LeaseView, new: LeaseView) -> bool {
        if self
            .lease
            .as_ref()
            .is_none_or(|l| l.version != read.version)
        {
            return false;
        }
        self.put(new);
        true
    }

    fn put(&mut self, mut new: LeaseView) {
        self.version += 1;
        new.version = self.version.to_string();
        self.lease = (!new.terminating || new.finalized).then_some(new);
    }

    /// Creates the Lease unless it exists: free, marked as given.
    fn create(&mut self, mark: Option<Mark>) -> bool {
        if self.lease.is_some() {
            return false;
        }
        self.put(LeaseView {
            mark,
            ..LeaseView::default()
        });
        true
    }

    /// An edit by hand, not on any version: counts as one.
    fn edit(&mut self, change: impl FnOnce(&mut LeaseView)) {
        if let Some(mut l) = self.lease.clone() {
            change(&mut l);
            self.put(l);
            self.edits += 1;
        }
    }
}

/// The Lease writes of the lock and the hand-over, as `lease_lock.rs` and `handover.rs` build
/// them.
fn taken(read: &LeaseView, identity: &str, wall: i64) -> LeaseView {
    LeaseView {
        holder: Some(identity.to_string()),
        ..renewed(read, wall)
    }
}

fn renewed(read: &LeaseView, wall: i64) -> LeaseView {
    LeaseView {
        renewed: Some(wall),
        duration: Some(DURATION),
        ..read.clone()
    }
}

fn released(read: &LeaseView, led: bool) -> LeaseView {
    LeaseView {
        holder: None,
        renewed: None,
        duration: None,
        mark: lease::release_mark(read.mark, led),
        ..read.clone()
    }
}

fn marked(read: &LeaseView, mark: Option<Mark>) -> LeaseView {
    LeaseView {
        mark,
        // On while unmarked (a leader's writes may be in flight), off with the mark.
        finalized: mark.is_none(),
        ..read.clone()
    }
}

struct Node {
    name: u8,
    block: Option<u32>,
    /// Its seal annotation, which only a seal changes: what every podCIDR write tests. (A
    /// kubelet's status updates move the Node's resourceVersion, not this: they change nothing
    /// a write tests, so they are not modelled.)
    seal: u64,
}

/// A node write in the world.
struct Flight {
    proc: u32,
    session: u64,
    node: usize,
    block: u32,
    /// The node's seal the write was sent for: it lands only while that seal stands.
    seal: u64,
    sent: Duration,
    /// The answer and when it arrives (`None`: never; the sender gives up a write timeout
    /// after it sent, on its own clock).
    status: Option<u16>,
    answer_at: Option<Duration>,
    commit_at: Option<Duration>,
    done: bool,
}

/// What one process slot keeps across restarts: the host's clocks and the pod name.
struct Host {
    name: String,
    mono: Duration,
    rate: i64,
    wall: i64,
    frozen_until: Duration,
    starts: u64,
}

/// The lock's state (`lease_lock::Lock`).
struct Lock {
    unchanged: Unchanged<Duration>,
    /// When the write that last made or kept us the holder was sent, and how we took it.
    held: Option<(Duration, Option<Took>)>,
    /// What the lock last reported: claimed.
    leader: bool,
    next: Duration,
    read: Option<Read>,
}

struct Read {
    view: Option<LeaseView>,
    unchanged: Duration,
    sent: Duration,
}

impl Lock {
    fn new(now: Duration) -> Self {
        Lock {
            unchanged: Unchanged::default(),
            held: None,
            leader: false,
            next: now,
            read: None,
        }
    }
}

/// A session's picture of the Nodes.
struct View {
    id: u64,
    /// How far the watch has delivered the world's changes.
    cursor: usize,
    nodes: BTreeMap<usize, Option<u32>>,
    /// The seal of each node last read, for the next write's precondition.
    seals: BTreeMap<usize, u64>,
    /// Blocks this session gave and is not sure of yet, and whether a write is in flight.
    mine: BTreeMap<usize, (u32, bool)>,
}

enum Session {
    Off,
    Waiting {
        until: Duration,
        /// When it seals the nodes (`seal::after`), or tries its seal again, until it is done.
        seal_at: Option<Duration>,
        /// The nodes its seal has yet to settle, once its list succeeded.
        unsealed: Option<Vec<usize>>,
    },
    Active(View),
    /// Stopping: sends nothing more, waits for what it sent.
    Closed(View),
}

struct Proc {
    uid: u32,
    identity: String,
    lock: Lock,
    /// The fence's last read showed the Lease ours.
    ours: bool,
    /// The hand edits made by the lock's last write, and by the read that showed it ours.
    wrote_in: u64,
    read_in: u64,
    next_poll: Duration,
    release_since: Option<Duration>,
    /// It was leading, its session begun, up to the read that set `release_since`.
    release_led: bool,
    session: Session,
    /// Writes of ours in flight, and whether one ended without ruling itself out
    /// (`handover::InFlight`).
    flying: usize,
    unanswered: bool,
    stopping: Option<Duration>,
}

pub struct Sim {
    setup: Setup,
    now: Duration,
    store: Store,
    hosts: Vec<Host>,
    procs: Vec<Option<Proc>>,
    nodes: Vec<Node>,
    /// Every node change, for the watches.
    changes: Vec<usize>,
    flights: Vec<Flight>,
    /// A session ever listed: our finalizer is on a config (`allocated_before`).
    allocated: bool,
    uids: u32,
    sessions: u64,
    /// What happened, kept only to tell a failing schedule's story.
    story: Option<Vec<String>>,
}

impl Sim {
    /// The world at the start, every process started; `tell`: keep the story.
    pub fn new(setup: &Setup, tell: bool) -> Self {
        let hosts = (0..setup.drift.len()).map(|i| host(setup, i)).collect();
        let mut sim = Sim {
            setup: setup.clone(),
            now: Duration::ZERO,
            store: Store::default(),
            hosts,
            procs: (0..setup.drift.len()).map(|_| None).collect(),
            nodes: Vec::new(),
            changes: Vec::new(),
            flights: Vec::new(),
            allocated: false,
            uids: 0,
            sessions: 0,
            story: tell.then(Vec::new),
        };
        for name in &setup.nodes {
            sim.add_node(*name);
        }
        for slot in 0..sim.procs.len() {
            sim.start(slot);
        }
        sim
    }

    /// Tells the story, if anyone listens (a search does not: it only runs).
    fn say(&mut self, text: impl FnOnce(&Sim) -> String) {
        if self.story.is_some() {
            let line = format!("{:>9.3}s {}", self.now.as_secs_f64(), text(self));
            if let Some(story) = self.story.as_mut() {
                story.push(line);
            }
        }
    }

    fn slot(&self, p: u8) -> usize {
        usize::from(p) % self.procs.len()
    }

    fn mono(&self, slot: usize) -> Duration {
        self.hosts[slot].mono
    }

    fn wall(&self, slot: usize) -> i64 {
        let now = i64::try_from(self.now.as_micros()).unwrap_or(i64::MAX);
        WALL_ZERO + now + self.hosts[slot].wall
    }

    fn awake(&self, slot: usize) -> bool {
        self.procs[slot].is_some() && self.hosts[slot].frozen_until <= self.now
    }

    /// Applies one action, then checks the invariants.
    pub fn act(&mut self, action: &Action) -> Result<(), Violation> {
        match *action {
            Action::Tick { ms } => self.tick(Duration::from_millis(ms.into())),
            Action::Node { name } => self.add_node(name),
            Action::Pause { p, ms } => self.pause(self.slot(p), ms),
            Action::WallStep { p, secs } => {
                let slot = self.slot(p);
                self.hosts[slot].wall += i64::from(secs) * 1_000_000;
            }
            Action::Kill { p } => self.kill(self.slot(p)),
            Action::Stop { p } => self.stop(self.slot(p)),
            Action::Start { p } => self.start(self.slot(p)),
            Action::Free => self.free(),
            Action::Rename { to } => self.rename(to),
            Action::Delete { strip } => self.delete(strip),
            Action::Run { p, roll } => self.awake_do(p, |s, slot| s.run(slot, roll)),
            Action::Read { p } => self.awake_do(p, Sim::read),
            Action::Write { p, lost } => self.awake_do(p, |s, slot| {
                s.write(slot, lost);
            }),
        }
        self.check()
    }

    fn awake_do(&mut self, p: u8, f: impl FnOnce(&mut Sim, usize)) {
        let slot = self.slot(p);
        if self.awake(slot) {
            self.answers(slot);
            self.lapse(slot);
            f(self, slot);
        }
    }

    /// The controller drops its session the moment the fence stops holding (a timer at
    /// `step_down_at`, a read): so does any fence that lapsed since the process last acted.
    /// A stopping session only waits for its writes.
    fn lapse(&mut self, slot: usize) {
        let holds = self.holds(slot);
        let p = self.proc(slot);
        if !holds && matches!(p.session, Session::Waiting { .. } | Session::Active(_)) {
            p.session = Session::Off;
        }
    }

    // ---- time, faults and hand edits ----

    /// True time passes: the writes due commit in order, every clock runs at its rate.
    fn tick(&mut self, by: Duration) {
        let end = self.now + by;
        let mut due: Vec<(Duration, usize)> = (self.flights.iter().enumerate())
            .filter_map(|(i, f)| f.commit_at.filter(|at| *at <= end).map(|at| (at, i)))
            .collect();
        due.sort();
        for (at, i) in due {
            self.now = self.now.max(at);
            self.commit(i);
        }
        self.now = end;
        for h in &mut self.hosts {
            let micros = by.as_micros() as i64 * (10_000 + h.rate) / 10_000;
            h.mono += Duration::from_micros(micros.max(0) as u64);
        }
    }

    /// A write reaches storage: it lands only on a Node without a block (podCIDRs are
    /// immutable), and a 2xx answer says what happened.
    fn commit(&mut self, i: usize) {
        let (node, block) = (self.flights[i].node, self.flights[i].block);
        self.flights[i].commit_at = None;
        let current = self.nodes[node].seal == self.flights[i].seal;
        let landed = self.nodes[node].block.is_none() && current;
        if landed {
            self.nodes[node].block = Some(block);
            self.changes.push(node);
        }
        let f = &mut self.flights[i];
        if f.status.is_some_and(|s| (200..300).contains(&s)) && !landed {
            // A failed test of the fence and a write to immutable podCIDRs are both 422.
            f.status = Some(422);
        }
        let (name, proc) = (self.nodes[node].name, self.flights[i].proc);
        let what = if landed {
            "lands"
        } else if !current {
            "arrives after a seal: its test fails"
        } else {
            "lands on a taken node: refused"
        };
        self.say(|_| format!("node {name} <- {block} (from #{proc}) {what}"));
    }

    fn add_node(&mut self, name: u8) {
        if self.nodes.iter().all(|n| n.name != name) {
            self.nodes.push(Node {
                name,
                block: None,
                seal: 0,
            });
            self.changes.push(self.nodes.len() - 1);
        }
    }

    fn pause(&mut self, slot: usize, ms: u32) {
        let until = self.now + Duration::from_millis(ms.into());
        self.hosts[slot].frozen_until = self.hosts[slot].frozen_until.max(until);
    }

    fn kill(&mut self, slot: usize) {
        if let Some(p) = self.procs[slot].take() {
            self.say(|_| format!("#{} {} is killed", p.uid, p.identity));
        }
    }

    fn stop(&mut self, slot: usize) {
        if self.procs[slot].is_none() {
            return;
        }
        self.lapse(slot);
        let mono = self.mono(slot);
        if let Some(p) = self.procs[slot].as_mut().filter(|p| p.stopping.is_none()) {
            p.stopping = Some(mono);
            p.session = match std::mem::replace(&mut p.session, Session::Off) {
                Session::Active(v) => Session::Closed(v),
                // A standby, or a leader still waiting: it sent nothing to vouch for.
                _ => Session::Off,
            };
        }
    }

    /// A process starts with a fresh identity under its slot's pod name, and creates the
    /// Lease if it is missing, unmarked (`leader::build_lock`).
    fn start(&mut self, slot: usize) {
        if self.procs[slot].is_some() {
            return;
        }
        self.hosts[slot].starts += 1;
        self.uids += 1;
        let h = &self.hosts[slot];
        let suffix = format!("{:08x}", (slot as u64) << 24 | h.starts);
        let identity = lease::identity(&h.name, &suffix);
        let (mono, uid) = (h.mono, self.uids);
        self.say(|_| format!("#{uid} {identity} starts"));
        self.store.create(None);
        self.procs[slot] = Some(Proc {
            uid: self.uids,
            identity,
            lock: Lock::new(mono),
            ours: false,
            wrote_in: 0,
            read_in: 0,
            next_poll: mono,
            release_since: None,
            release_led: false,
            session: Session::Off,
            flying: 0,
            unanswered: false,
            stopping: None,
        });
    }

    fn free(&mut self) {
        self.say(|_| "the lease is freed by hand".into());
        self.store.edit(|l| l.holder = None);
    }

    /// The holder renamed to a live process, or (`to` past the last slot) to nobody we know.
    fn rename(&mut self, to: u8) {
        let live = self.procs.get(usize::from(to)).and_then(Option::as_ref);
        let name = live.map_or("someone-else".into(), |p| p.identity.clone());
        self.say(|_| format!("the lease is renamed to {name} by hand"));
        self.store.edit(|l| l.holder = Some(name));
    }

    /// A deletion by hand: with the finalizer stripped (or none on it) it is gone at once;
    /// the ordinary way, our finalizer keeps it terminating, also right after another hand
    /// edit (then the replica that lets it go must not create the next one settled:
    /// `lease::next_mark`).
    fn delete(&mut self, strip: bool) {
        let Some(l) = self.store.lease.clone() else {
            return;
        };
        if strip || !l.finalized {
            self.say(|_| "the lease is deleted, finalizer stripped".into());
            self.store.lease = None;
            self.store.edits += 1;
        } else {
            self.say(|_| "the lease is deleted: terminating".into());
            self.store.put(LeaseView {
                terminating: true,
                ..l
            });
        }
    }

    // ---- one process ----

    fn proc(&mut self, slot: usize) -> &mut Proc {
        self.procs[slot].as_mut().expect("a live process")
    }

    /// Whether the process leads now, per its fence (`leader::Fence::holds`).
    fn holds(&self, slot: usize) -> bool {
        let Some(p) = &self.procs[slot] else {
            return false;
        };
        let until = p.lock.held.map(|(sent, _)| sent + DURATION);
        lease::holds(p.lock.leader, p.ours, until, MARGIN, self.mono(slot))
    }

    /// Everything that is due, and a step of the session: mostly after the lock and the
    /// fence's read, sometimes before (the session acts on the fence's last read).
    fn run(&mut self, slot: usize, roll: u64) {
        let mut rng = Rng::new(roll);
        if self.proc(slot).stopping.is_some() && self.stop_step(slot) {
            return;
        }
        let first = rng.below(3) == 0;
        if first {
            self.session(slot, &mut rng);
        }
        self.due(slot, &mut rng);
        if !first {
            self.session(slot, &mut rng);
        }
    }

    fn due(&mut self, slot: usize, rng: &mut Rng) {
        let mono = self.mono(slot);
        if self.proc(slot).lock.next <= mono {
            self.attempt(slot, rng.below(20) == 0);
        }
        if self.proc(slot).next_poll <= mono {
            self.poll(slot);
        }
        let release = self.proc(slot).release_since;
        if release.is_some_and(|at| at + SETTLE <= mono) && !self.holds(slot) {
            self.finish_deletion(slot);
        }
    }

    fn session(&mut self, slot: usize, rng: &mut Rng) {
        if rng.below(2) == 0 {
            self.deliver(slot);
        }
        self.session_step(slot, rng);
    }

    fn set_leader(&mut self, slot: usize, leader: bool) {
        let p = self.proc(slot);
        if p.lock.leader != leader {
            // `Fence::claim`: a fresh read must show it ours.
            p.lock.leader = leader;
            p.ours = false;
        }
    }

    /// The lock's attempt (`Lock::attempt`): read and act, again on a conflict.
    fn attempt(&mut self, slot: usize, lost: bool) {
        for _ in 0..TRIES {
            self.read(slot);
            if self.write(slot, lost) {
                return;
            }
        }
        let next = self.mono(slot) + RETRY;
        let p = self.proc(slot);
        p.lock.held = None;
        p.lock.next = next;
        self.set_leader(slot, false);
    }

    fn read(&mut self, slot: usize) {
        let (view, mono) = (self.store.lease.clone(), self.mono(slot));
        let lock = &mut self.proc(slot).lock;
        let unchanged = lock.unchanged.note(view.as_ref(), mono);
        lock.read = Some(Read {
            view,
            unchanged,
            sent: mono,
        });
    }

    /// What `lease::decide` says about the last read, done (`Lock::act`); false on a
    /// conflict. A `lost` answer leaves the lock as it was (an error, retried).
    fn write(&mut self, slot: usize, lost: bool) -> bool {
        let wall = self.wall(slot);
        let p = self.proc(slot);
        let Some(Read {
            view,
            unchanged,
            sent,
        }) = p.lock.read.take()
        else {
            return true;
        };
        let step = lease::decide(view.as_ref(), &p.identity, unchanged);
        let (read, new, took) = match (step, view) {
            (Step::Wait(left), _) => return self.not_held(slot, sent + left),
            (Step::Missing, _) | (_, None) => return self.not_held(slot, sent + RETRY),
            (Step::Renew, Some(read)) => (read.clone(), renewed(&read, wall), None),
            (Step::Take, Some(read)) => {
                let took = Some(lease::took(&read));
                (read.clone(), taken(&read, &p.identity, wall), took)
            }
        };
        if !self.store.replace(&read, new) {
            return false;
        }
        if lost {
            let next = self.mono(slot) + RETRY;
            self.proc(slot).lock.next = next;
        } else {
            self.held(slot, sent, took);
        }
        true
    }

    /// Our write made or kept us the holder: our term counts from when it was sent.
    fn held(&mut self, slot: usize, sent: Duration, took: Option<Took>) {
        let edits = self.store.edits;
        let p = self.proc(slot);
        // A renewal keeps how we came to hold it.
        let how = took.or_else(|| p.lock.held.and_then(|(_, t)| t));
        p.lock.held = Some((sent, how));
        p.lock.next = sent + RENEW_AFTER;
        p.wrote_in = edits;
        let id = p.identity.clone();
        if let Some(took) = took {
            self.say(|_| format!("{id} takes the lease ({took:?})"));
        }
        self.set_leader(slot, true);
    }

    fn not_held(&mut self, slot: usize, next: Duration) -> bool {
        let p = self.proc(slot);
        p.lock.held = None;
        p.lock.next = next;
        self.set_leader(slot, false);
        true
    }

    /// The election's read (`leader::elect`): counts toward `Unchanged`, feeds the fence, and
    /// a free or missing Lease gets a fresh lock at once.
    fn poll(&mut self, slot: usize) {
        let (view, mono, edits) = (self.store.lease.clone(), self.mono(slot), self.store.edits);
        // Before this read changes what the fence says.
        let leading = self.holds(slot);
        let p = self.proc(slot);
        let leading = leading && matches!(p.session, Session::Active(_));
        p.lock.unchanged.note(view.as_ref(), mono);
        p.next_poll = mono + POLL;
        if !view
            .as_ref()
            .is_some_and(|v| lease::releasable(v, &p.identity))
        {
            p.release_since = None;
        } else if p.release_since.is_none() {
            p.release_since = Some(mono);
            p.release_led = leading;
        }
        let free = view
            .as_ref()
            .is_none_or(|v| v.holder.as_deref().is_none_or(str::is_empty));
        if p.lock.leader {
            p.ours = view.as_ref().is_some_and(|v| lease::ours(v, &p.identity));
            p.read_in = edits;
        }
        if (p.lock.leader && view.is_none()) || (!p.lock.leader && free) {
            self.store.create(None);
            self.proc(slot).lock = Lock::new(mono);
            self.set_leader(slot, false);
        }
    }

    /// `leader::finish_deletion`: our finalizer off, and the next Lease created marked as
    /// `lease::next_mark` says.
    fn finish_deletion(&mut self, slot: usize) {
        let p = self.proc(slot);
        p.release_since = None;
        let (id, led) = (p.identity.clone(), p.release_led);
        // `SessionState::in_doubt`: a write of our last session in flight or unanswered.
        let answered = !p.unanswered && p.flying == 0;
        let Some(cur) = self.store.lease.clone() else {
            return;
        };
        if lease::releasable(&cur, &id) {
            let done = LeaseView {
                finalized: false,
                ..cur.clone()
            };
            self.store.replace(&cur, done);
            let mark = lease::next_mark(&cur, &id, led, answered);
            let created = self.store.create(mark);
            self.say(|_| format!("{id} lets the deleted lease go (created {mark:?}: {created})"));
        }
    }

    // ---- the session ----

    /// `reconcile::take_over` and the session after it.
    fn session_step(&mut self, slot: usize, rng: &mut Rng) {
        let (holds, mono) = (self.holds(slot), self.mono(slot));
        let p = self.proc(slot);
        if p.stopping.is_some() {
            return;
        }
        if !holds {
            // Leadership lost: the session is dropped, its writes fly on.
            if !matches!(p.session, Session::Closed(_)) {
                p.session = Session::Off;
            }
            return;
        }
        match p.session {
            Session::Off => self.take_over(slot, rng),
            Session::Waiting {
                seal_at: Some(at), ..
            } if at <= mono => self.seal(slot, rng),
            Session::Waiting {
                until,
                seal_at: None,
                ..
            } if until <= mono => {
                if self.claim(slot).is_some() {
                    self.list(slot);
                }
            }
            Session::Active(_) => self.send(slot, rng),
            Session::Waiting { .. } | Session::Closed(_) => {}
        }
    }

    fn take_over(&mut self, slot: usize, rng: &mut Rng) {
        let Some(took) = self.claim(slot) else {
            return;
        };
        let wait = lease::wait(took, self.allocated, WRITE_TIMEOUT, DURATION);
        let after = seal::after(took, self.allocated, DURATION);
        let mono = self.mono(slot);
        let p = self.proc(slot);
        p.session = Session::Waiting {
            until: mono + wait,
            seal_at: after.map(|a| mono + a),
            unsealed: None,
        };
        let id = p.identity.clone();
        self.say(|_| format!("{id} takes over {took:?}: waits {wait:?}, seals after {after:?}"));
        if after == Some(Duration::ZERO) {
            self.seal(slot, rng);
        }
        let sealed = matches!(
            self.proc(slot).session,
            Session::Waiting { seal_at: None, .. }
        );
        if wait.is_zero() && sealed {
            self.list(slot);
        }
    }

    /// The seal (`reconcile::seal`): a write to every node without a block gives it a new seal,
    /// so that no write sent on an older one can land. One step is a round: its list, while it
    /// has none, or its writes to the nodes still unsealed and their answers. The API server
    /// throttles a list or a write one time in five; what failed is tried again a moment later,
    /// until `seal::done` (a write of a predecessor landing in between is in the list the
    /// session makes after).
    fn seal(&mut self, slot: usize, rng: &mut Rng) {
        let mono = self.mono(slot);
        let Session::Waiting { unsealed, .. } = &self.proc(slot).session else {
            return;
        };
        let mut left = unsealed.clone();
        let mut sealed = Vec::new();
        let listed = match &mut left {
            None if rng.below(5) == 0 => false,
            None => {
                let empty = self
                    .nodes
                    .iter()
                    .enumerate()
                    .filter(|(_, n)| n.block.is_none());
                left = Some(empty.map(|(i, _)| i).collect());
                true
            }
            Some(targets) => {
                targets.retain(|&i| {
                    let answer = if rng.below(5) == 0 {
                        Answer::Throttled
                    } else {
                        Answer::Applied
                    };
                    if answer == Answer::Applied {
                        self.nodes[i].seal += 1;
                        self.changes.push(i);
                        sealed.push(i);
                    }
                    !seal::sealed(answer)
                });
                false
            }
        };
        let done = seal::done(left.as_ref().map(Vec::len));
        let again = if listed { Duration::ZERO } else { SEAL_RETRY };
        let p = self.proc(slot);
        if let Session::Waiting {
            seal_at, unsealed, ..
        } = &mut p.session
        {
            *seal_at = (!done).then_some(mono + again);
            *unsealed = left;
        }
        let id = p.identity.clone();
        self.say(|s| {
            let names: Vec<u8> = sealed.iter().map(|i| s.nodes[*i].name).collect();
            format!("{id} seals nodes {names:?} (listed: {listed}, done: {done})")
        });
    }

    /// `handover::claim`: the Lease must name us and not be being deleted; the mark comes
    /// off and our finalizer goes on (on the version read).
    fn claim(&mut self, slot: usize) -> Option<lease::Takeover> {
        let cur = self.store.lease.clone()?;
        let p = self.proc(slot);
        if lease::unclaimable(&cur, &p.identity).is_some() {
            return None;
        }
        let took = lease::takeover(&cur, &p.identity, p.lock.held.and_then(|(_, t)| t));
        if cur.mark.is_some() || !cur.finalized {
            self.store.replace(&cur, marked(&cur, None));
        }
        Some(took)
    }

    /// The session begins: what landed by now is seen. Our finalizer goes on a config at
    /// once, before any block is given (in the controller a little later: a Lease edited by
    /// hand in between is the gap docs/single-writer.md names, not modelled).
    fn list(&mut self, slot: usize) {
        self.sessions += 1;
        self.allocated = true;
        let view = View {
            id: self.sessions,
            cursor: self.changes.len(),
            nodes: (self.nodes.iter().enumerate())
                .map(|(i, n)| (i, n.block))
                .collect(),
            seals: (self.nodes.iter().enumerate())
                .map(|(i, n)| (i, n.seal))
                .collect(),
            mine: BTreeMap::new(),
        };
        let p = self.proc(slot);
        // `InFlight::begin`: a request of an aborted session still unwinding keeps the doubt.
        p.unanswered = p.flying > 0;
        p.session = Session::Active(view);
        let id = p.identity.clone();
        self.say(|s| {
            let seen: Vec<_> = s.nodes.iter().map(|n| (n.name, n.block)).collect();
            format!("{id} lists (name, block): {seen:?}")
        });
    }

    /// The watch delivers what changed since the session last heard.
    fn deliver(&mut self, slot: usize) {
        let changes = &self.changes;
        let nodes = &self.nodes;
        let Some(p) = self.procs[slot].as_mut() else {
            return;
        };
        let (Session::Active(v) | Session::Closed(v)) = &mut p.session else {
            return;
        };
        for &i in &changes[v.cursor..] {
            v.nodes.insert(i, nodes[i].block);
            v.seals.insert(i, nodes[i].seal);
            // On a node that holds a block, ours (the same, or one that can no longer land)
            // is settled.
            if nodes[i].block.is_some() {
                v.mine.remove(&i);
            }
        }
        v.cursor = changes.len();
    }

    /// One write: the lowest-named node this session knows as pending gets the lowest block
    /// it does not know to be taken (or the block it gave before, again).
    fn send(&mut self, slot: usize, rng: &mut Rng) {
        let Some((node, block)) = self.choose(slot) else {
            return;
        };
        let mono = self.mono(slot);
        let p = self.proc(slot);
        let Session::Active(v) = &mut p.session else {
            return;
        };
        v.mine.insert(node, (block, true));
        let seal = v.seals.get(&node).copied().unwrap_or_default();
        let (uid, session) = (p.uid, v.id);
        p.flying += 1;
        let (status, answer, commit) = fate(rng, self.bound());
        let (answer_at, commit_at) = (answer.map(|d| self.now + d), commit.map(|d| self.now + d));
        let name = self.nodes[node].name;
        self.say(|_| {
            format!("#{uid} sends node {name} <- {block}: answer {status:?} at {answer_at:?}, lands at {commit_at:?}")
        });
        self.flights.push(Flight {
            proc: uid,
            session,
            node,
            block,
            seal,
            sent: mono,
            status,
            answer_at,
            commit_at,
            done: false,
        });
    }

    /// D: how long after it was sent a write may still land.
    fn bound(&self) -> Duration {
        if self.setup.beyond {
            BEYOND
        } else {
            WRITE_TIMEOUT
        }
    }

    fn choose(&self, slot: usize) -> Option<(usize, u32)> {
        let Some(Proc {
            session: Session::Active(v),
            ..
        }) = &self.procs[slot]
        else {
            return None;
        };
        let pending = (v.nodes.iter())
            .filter(|(i, b)| b.is_none() && v.mine.get(i).is_none_or(|(_, flying)| !flying))
            .map(|(i, _)| *i)
            .min_by_key(|i| self.nodes[*i].name)?;
        let taken = |b: &u32| {
            v.nodes.values().any(|n| *n == Some(*b)) || v.mine.values().any(|(m, _)| m == b)
        };
        let block = match v.mine.get(&pending) {
            Some((b, _)) => *b,
            None => (0..BLOCKS).find(|b| !taken(b))?,
        };
        Some((pending, block))
    }

    /// The answers that arrived for `slot`, and the writes it gave up on (`InFlight` and the
    /// node writer).
    fn answers(&mut self, slot: usize) {
        let (now, mono) = (self.now, self.mono(slot));
        let uid = self.proc(slot).uid;
        for i in 0..self.flights.len() {
            let f = &self.flights[i];
            let arrived = f
                .answer_at
                .map_or(mono >= f.sent + WRITE_TIMEOUT, |at| at <= now);
            if f.proc == uid && !f.done && arrived {
                self.flights[i].done = true;
                self.answered(slot, i);
            }
        }
    }

    fn answered(&mut self, slot: usize, i: usize) {
        let f = &self.flights[i];
        let (status, node, block, session) = (f.status, f.node, f.block, f.session);
        let (now_block, now_seal) = (self.nodes[node].block, self.nodes[node].seal);
        let p = self.proc(slot);
        p.flying -= 1;
        p.unanswered |= may_still_land(status);
        let (Session::Active(v) | Session::Closed(v)) = &mut p.session else {
            return;
        };
        if v.id != session || v.mine.get(&node).is_none_or(|(b, _)| *b != block) {
            return;
        }
        match (classify(status), now_block) {
            (Answer::Applied, _) => settle(v, node, Some(block)),
            (Answer::Throttled, _) => {
                v.mine.insert(node, (block, false));
            }
            // Refused or in doubt, and the node read again is empty: the same block again,
            // on the seal read.
            (_, None) => {
                v.mine.insert(node, (block, false));
                v.seals.insert(node, now_seal);
            }
            // Refused or in doubt, and the node read again holds a block: ours is settled.
            (_, held) => settle(v, node, held),
        }
    }

    /// A stopping process: once its writes are answered (or at its limit), the hand-over
    /// (`app::hand_over`, `Election::release`). False while it still waits.
    fn stop_step(&mut self, slot: usize) -> bool {
        let mono = self.mono(slot);
        let p = self.proc(slot);
        let since = p.stopping.unwrap_or(mono);
        let settled = match &p.session {
            Session::Closed(_) if p.flying > 0 && mono < since + STOP_LIMIT => return false,
            Session::Closed(_) => p.flying == 0 && !p.unanswered,
            _ => false,
        };
        // A session ran and was not lost before the stop (`SessionState::led`).
        let led = matches!(p.session, Session::Closed(_));
        let id = p.identity.clone();
        if settled {
            self.mark_settled(&id);
        }
        if let Some(cur) = self
            .store
            .lease
            .clone()
            .filter(|l| l.holder.as_deref() == Some(&id))
        {
            self.store.replace(&cur, released(&cur, led));
        }
        self.say(|_| format!("{id} stops (settled: {settled})"));
        self.procs[slot] = None;
        true
    }

    /// `handover::mark`: on the version read, if it still names us.
    fn mark_settled(&mut self, id: &str) {
        if let Some(cur) = self
            .store
            .lease
            .clone()
            .filter(|l| l.holder.as_deref() == Some(id))
        {
            self.store.replace(&cur, marked(&cur, Some(Mark::Settled)));
        }
    }

    // ---- the invariants ----

    fn check(&self) -> Result<(), Violation> {
        self.check_blocks()?;
        self.check_fences()
    }

    fn check_blocks(&self) -> Result<(), Violation> {
        let mut owner: BTreeMap<u32, u8> = BTreeMap::new();
        for n in &self.nodes {
            let Some(b) = n.block else { continue };
            if let Some(other) = owner.insert(b, n.name) {
                return Err(Violation {
                    rule: "a block on two nodes",
                    detail: format!("block {b} is on nodes {other} and {}", n.name),
                });
            }
        }
        Ok(())
    }

    /// Two processes that hold at once are a violation unless a hand edit came between what
    /// makes either hold: its lock's last write and the read that showed the Lease ours.
    fn check_fences(&self) -> Result<(), Violation> {
        let holders: Vec<&Proc> = (0..self.procs.len())
            .filter(|s| self.holds(*s))
            .filter_map(|s| self.procs[s].as_ref())
            .collect();
        let same = |a: &Proc, b: &Proc| {
            [a.read_in, b.wrote_in, b.read_in]
                .iter()
                .all(|e| *e == a.wrote_in)
        };
        for (i, a) in holders.iter().enumerate() {
            if let Some(b) = holders[i + 1..].iter().find(|b| same(a, b)) {
                return Err(Violation {
                    rule: "two processes hold per the fence",
                    detail: format!("{} and {} both lead", a.identity, b.identity),
                });
            }
        }
        Ok(())
    }
}

/// A block this session was not sure of is settled: the node holds `held` (ours or another,
/// after which ours can no longer land).
fn settle(v: &mut View, node: usize, held: Option<u32>) {
    v.nodes.insert(node, held);
    v.mine.remove(&node);
}

/// How a write fares, as the schedule's `rng` says: its answer, when it arrives (`None`:
/// never) and when it lands (`None`: never), after its sending. A 2xx landed before it was
/// answered; a 4xx never lands; anything else may land at any moment up to `bound`, or never.
fn fate(rng: &mut Rng, bound: Duration) -> (Option<u16>, Option<Duration>, Option<Duration>) {
    let within = |rng: &mut Rng, d: Duration| ms(1 + rng.below(d.as_millis() as u64));
    let status = status(rng);
    let answered = status.is_some() || rng.below(2) == 0;
    let (commit, answer) = match status {
        Some(200) => {
            let c = within(rng, WRITE_TIMEOUT * 4 / 10);
            (Some(c), c + within(rng, WRITE_TIMEOUT * 4 / 10))
        }
        // The world's truth, not the rule under test: a 4xx was refused before storage.
        Some(c) if (400..500).contains(&c) => (None, within(rng, WRITE_TIMEOUT * 8 / 10)),
        _ => {
            let c = (rng.below(2) == 0).then(|| within(rng, bound));
            (c, within(rng, WRITE_TIMEOUT * 8 / 10))
        }
    };
    (status, answered.then_some(answer), commit)
}

/// The answer's status: `None` for a reset connection or no answer at all.
fn status(rng: &mut Rng) -> Option<u16> {
    match rng.below(100) {
        0..45 => Some(200),
        45..48 => Some(400),
        48..51 => Some(409),
        51..54 => Some(422),
        54..60 => Some(429),
        60..68 => Some(500),
        68..73 => Some(502),
        73..78 => Some(503),
        78..86 => Some(504),
        _ => None,
    }
}

fn host(setup: &Setup, slot: usize) -> Host {
    let name = if setup.shared_name && slot == 1 {
        0
    } else {
        slot
    };
    Host {
        name: format!("nodeipam-{name}"),
        mono: ms(100_000 * (slot as u64 + 1)),
        rate: setup.drift[slot],
        wall: setup.skew[slot] * 1_000_000,
        frozen_until: Duration::ZERO,
        starts: 0,
    }
}

/// A seed's setup and schedule.
pub fn generate(seed: u64, steps: usize, beyond: bool) -> (Setup, Vec<Action>) {
    let mut rng = Rng::new(seed);
    let procs = 2 + rng.below(2) as usize;
    let setup = Setup {
        drift: (0..procs).map(|_| rng.below(201) as i64 - 100).collect(),
        skew: (0..procs)
            .map(|_| rng.below(2 * 86_400) as i64 - 86_400)
            .collect(),
        shared_name: rng.below(4) == 0,
        nodes: (0..rng.below(4)).map(|_| rng.below(256) as u8).collect(),
        beyond,
    };
    let mut actions: Vec<Action> = (0..steps).map(|_| action(&mut rng)).collect();
    // From a stream of its own, so that the schedules without one stay as they were.
    let mut open = Rng::new(seed ^ 0x005e_ed0f_ed17);
    if open.below(4) == 0 {
        actions.splice(0..0, opening(&mut open));
        actions.truncate(steps);
    }
    (setup, actions)
}

/// The opening of one schedule in four: a hand edit under a live leader. Slot 0 takes the
/// Lease and allocates; it is paused for a few seconds (and not run for longer); the Lease is
/// freed or renamed by hand and soon after deleted, mostly the ordinary way; a Node comes; the
/// other slots run through the next seconds, and then slot 0 again, within its term. Random
/// schedules almost never line these up (not once in 500,000 seeds), and it is where a
/// displaced leader that still sends meets a successor that does not wait for it.
fn opening(rng: &mut Rng) -> Vec<Action> {
    let mut a = Vec::new();
    let run = |a: &mut Vec<Action>, rng: &mut Rng, p: u8| {
        a.push(Action::Run {
            p,
            roll: rng.next(),
        });
    };
    for _ in 0..4 {
        run(&mut a, rng, 0);
    }
    for _ in 0..rng.below(3) {
        a.push(Action::Node {
            name: rng.below(256) as u8,
        });
        run(&mut a, rng, 0);
    }
    a.push(Action::Tick {
        ms: 200 + rng.below(800) as u32,
    });
    for p in 0..3 {
        run(&mut a, rng, p);
    }
    a.push(Action::Pause {
        p: 0,
        ms: 2_000 + rng.below(12_000) as u32,
    });
    a.push(match rng.below(3) {
        0 | 1 => Action::Free,
        _ => Action::Rename {
            to: rng.below(4) as u8,
        },
    });
    for _ in 0..rng.below(4) {
        let p = 1 + rng.below(2) as u8;
        run(&mut a, rng, p);
        a.push(Action::Tick {
            ms: 50 + rng.below(1_450) as u32,
        });
    }
    a.push(Action::Delete {
        strip: rng.below(4) == 0,
    });
    a.push(Action::Node {
        name: rng.below(256) as u8,
    });
    for _ in 0..6 + rng.below(10) {
        run(&mut a, rng, 1);
        run(&mut a, rng, 2);
        a.push(Action::Tick {
            ms: 300 + rng.below(1_200) as u32,
        });
    }
    for _ in 0..3 {
        run(&mut a, rng, 0);
    }
    a
}

fn action(rng: &mut Rng) -> Action {
    let p = rng.below(3) as u8;
    match rng.below(1000) {
        0..520 => Action::Run {
            p,
            roll: rng.next(),
        },
        520..760 => Action::Tick {
            ms: if rng.below(10) == 0 {
                1_500 + rng.below(18_500) as u32
            } else {
                50 + rng.below(1_450) as u32
            },
        },
        760..820 => Action::Node {
            name: rng.below(256) as u8,
        },
        820..850 => Action::Read { p },
        850..880 => Action::Write {
            p,
            lost: rng.below(10) == 0,
        },
        880..900 => Action::Pause {
            p,
            ms: 1_000 + rng.below(29_000) as u32,
        },
        900..915 => Action::WallStep {
            p,
            secs: rng.below(14_400) as i32 - 7_200,
        },
        915..922 => Action::Kill { p },
        922..937 => Action::Stop { p },
        937..990 => Action::Start { p },
        990..992 => Action::Free,
        992..995 => Action::Rename {
            to: rng.below(4) as u8,
        },
        _ => Action::Delete {
            strip: rng.below(2) == 0,
        },
    }
}

/// Runs a schedule; on a violation, which action broke it.
pub fn run(setup: &Setup, actions: &[Action]) -> Result<(), (usize, Violation)> {
    let mut sim = Sim::new(setup, false);
    for (i, action) in actions.iter().enumerate() {
        sim.act(action).map_err(|v| (i, v))?;
    }
    Ok(())
}

/// What happened in a schedule, up to the step that broke it.
pub fn story(setup: &Setup, actions: &[Action]) -> Vec<String> {
    let mut sim = Sim::new(setup, true);
    for (i, action) in actions.iter().enumerate() {
        sim.say(|_| format!("step {i}: {action:?}"));
        if sim.act(action).is_err() {
            break;
        }
    }
    sim.story.unwrap_or_default()
}

/// The shortest schedule found that still breaks the same rule: drops chunks, then single
/// actions, while the failure stays.
pub fn shrink(setup: &Setup, actions: &[Action], rule: &str) -> Vec<Action> {
    let fails = |a: &[Action]| matches!(run(setup, a), Err((_, v)) if v.rule == rule);
    let mut current = actions.to_vec();
    if let Err((at, _)) = run(setup, &current) {
        current.truncate(at + 1);
    }
    let mut chunk = current.len() / 2;
    while chunk >= 1 {
        let mut start = 0;
        while start < current.len() {
            let mut candidate = current.clone();
            candidate.drain(start..(start + chunk).min(current.len()));
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
