//! The nemesis: three replicas, each behind a fault proxy of its own, and faults drawn from the
//! seed — freeze a replica (SIGSTOP) for up to twice the lease, kill it and start it again,
//! step its wall clock (libfaketime, the monotonic clock untouched as NTP leaves it), answer
//! its writes 500 and land them up to a minute later, throttle it (429), hold its writes up to
//! a minute, delete the Lease, restart the API server. Faults aim at the leader more often than
//! not: a deposed leader's late write is what the fences are for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, DeleteParams};
use nodeipam_testenv::fault_proxy::{Action, Origin, Rule, RuleHandle};
use nodeipam_testenv::{ControlPlane, FaultProxy};
use rustix::process::{Signal, kill_process};

use super::{Rng, workload};
use crate::support::process::{NAMESPACE, Replica, SA_GROUPS, SA_USER};

/// A 15 s lease renewed 5 s before it runs out, as in faults.rs.
pub const FLAGS: &[&str] = &[
    "--lease-duration=15",
    "--lease-grace=5",
    "--kube-api-qps=200",
    "--kube-api-burst=200",
];
const LEASE: &str = "nodeipam-controller";
const LEASE_SECS: u64 = 15;
/// The longest a write is held or landed late.
pub const LATEST_LANDING: Duration = Duration::from_secs(60);
/// How long a fault rule stays before it is taken away, matched or not.
const RULE_LIFE: Duration = Duration::from_secs(60);
const NAMES: [&str; 3] = ["replica-a", "replica-b", "replica-c"];
/// Where Debian's libfaketime is (the multi-threaded build, for tokio).
const LIBFAKETIME: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
];

/// One replica's slot: its proxy, its clock, the process when it runs.
struct Slot {
    name: &'static str,
    proxy: FaultProxy,
    kubeconfig: PathBuf,
    clock: PathBuf,
    process: Option<Replica>,
    incarnation: u32,
    frozen_until: Option<Instant>,
    rules: Vec<(Instant, RuleHandle)>,
}

pub struct Nemesis {
    pub cp: ControlPlane,
    admin: Client,
    dir: PathBuf,
    libfaketime: String,
    slots: Vec<Slot>,
    pub log: Vec<String>,
    /// Writes answered 500 that landed later: (what, the API server's status) → how many.
    pub landings: BTreeMap<(String, u16), u64>,
    began: Instant,
}

fn libfaketime() -> String {
    std::env::var("NODEIPAM_LIBFAKETIME")
        .ok()
        .or_else(|| {
            LIBFAKETIME
                .iter()
                .find(|p| Path::new(p).exists())
                .map(|p| p.to_string())
        })
        .unwrap_or_else(|| {
            panic!(
                "step=chaos-libfaketime: Debian's libfaketime is not installed ({}); \
                 hack/test.sh installs it, or `apt-get install libfaketime`",
                LIBFAKETIME.join(", ")
            )
        })
}

impl Nemesis {
    /// Starts the three replicas, each behind its own fault proxy, and waits for a leader.
    pub async fn start(cp: ControlPlane, dir: &Path, began: Instant) -> Nemesis {
        let libfaketime = libfaketime();
        let mut slots = Vec::new();
        for name in NAMES {
            let proxy = FaultProxy::for_user(&cp, SA_USER, SA_GROUPS)
                .unwrap_or_else(|e| panic!("step=chaos-fault-proxy {name}: {e}"));
            let kubeconfig = dir.join(format!("{name}.kubeconfig"));
            proxy
                .write_kubeconfig(&kubeconfig)
                .unwrap_or_else(|e| panic!("step=chaos-kubeconfig {name}: {e}"));
            let clock = dir.join(format!("{name}.clock"));
            std::fs::write(&clock, "+0\n").expect("step=chaos-clock: write the clock file");
            slots.push(Slot {
                name,
                proxy,
                kubeconfig,
                clock,
                process: None,
                incarnation: 0,
                frozen_until: None,
                rules: Vec::new(),
            });
        }
        let admin = cp.client();
        let mut n = Nemesis {
            cp,
            admin,
            dir: dir.to_path_buf(),
            libfaketime,
            slots,
            log: Vec::new(),
            landings: BTreeMap::new(),
            began,
        };
        for i in 0..n.slots.len() {
            n.launch(i).await;
        }
        n
    }

    fn note(&mut self, what: String) {
        let line = format!("{:7.1}s {what}", self.began.elapsed().as_secs_f64());
        println!("nemesis: {line}");
        self.log.push(line);
    }

    /// Starts slot `i`'s replica in a folder of its own (its log kept for each incarnation).
    async fn launch(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.incarnation += 1;
        let dir = self.dir.join(format!("{}-{}", slot.name, slot.incarnation));
        std::fs::create_dir_all(&dir).expect("step=chaos-launch: replica folder");
        let clock = slot.clock.display().to_string();
        let env = [
            ("LD_PRELOAD", self.libfaketime.as_str()),
            ("FAKETIME_TIMESTAMP_FILE", clock.as_str()),
            ("FAKETIME_CACHE_DURATION", "1"),
            ("DONT_FAKE_MONOTONIC", "1"),
        ];
        let replica =
            Replica::start_plain_with_env(&dir, &slot.kubeconfig, slot.name, FLAGS, &env).await;
        slot.process = Some(replica);
    }

    /// The replica the Lease names, if the API server answers.
    async fn leader(&self) -> Option<usize> {
        let api: Api<Lease> = Api::namespaced(self.admin.clone(), NAMESPACE);
        let lease = api.get_opt(LEASE).await.ok()??;
        let holder = lease.spec?.holder_identity?;
        // The identity is the name given with a random suffix (one per process).
        let name = nodeipam_controller::alloc::lease::holder_name(&holder);
        NAMES.iter().position(|n| *n == name)
    }

    /// The slot a fault aims at: the leader seven times in ten.
    async fn target(&self, rng: &mut Rng) -> usize {
        match self.leader().await {
            Some(l) if rng.below(10) < 7 => l,
            _ => rng.below(3) as usize,
        }
    }

    /// Thaws replicas whose freeze is over and takes away rules that have lived their life.
    pub fn tick(&mut self) {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            if self.slots[i].frozen_until.is_some_and(|t| t <= now) {
                self.thaw(i);
            }
            self.slots[i].rules.retain(|(until, rule)| {
                let keep = *until > now;
                if !keep {
                    rule.remove();
                }
                keep
            });
        }
    }

    /// Counts the late writes that landed since the last call, by kind and status: a 2xx
    /// landed, a 409 or 422 was refused by a precondition (a fence or a UID).
    pub fn count_landings(&mut self) {
        for slot in &self.slots {
            let log = slot.proxy.log();
            slot.proxy.clear_log();
            for x in log.iter().filter(|x| x.origin == Origin::Landed) {
                let key = (format!("{} {}", x.method, kind(&x.path)), x.status);
                *self.landings.entry(key).or_default() += 1;
            }
        }
    }

    fn thaw(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.frozen_until = None;
        if let Some(pid) = slot.process.as_ref().and_then(Replica::pid) {
            let _ = kill_process(pid, Signal::CONT);
        }
        let name = slot.name;
        self.note(format!("thaw {name}"));
    }

    /// One fault, drawn from `rng`.
    pub async fn strike(&mut self, rng: &mut Rng, tally: &Mutex<workload::Tally>) {
        let i = self.target(rng).await;
        match rng.below(100) {
            0..10 => self.freeze(i, rng),
            10..17 => self.kill(i, rng).await,
            17..24 => self.step_clock(i, rng),
            24..38 => self.fail_and_land_later(i, rng),
            38..47 => self.throttle(i, rng),
            47..58 => self.hold(i, rng),
            58..88 => self.depose_mid_write(i, rng, tally).await,
            88..94 => self.delete_lease().await,
            _ => self.restart_apiserver().await,
        }
    }

    fn freeze(&mut self, i: usize, rng: &mut Rng) {
        let slot = &mut self.slots[i];
        let Some(pid) = slot.process.as_ref().and_then(Replica::pid) else {
            return;
        };
        if slot.frozen_until.is_some() {
            return;
        }
        let secs = rng.between(2, 2 * LEASE_SECS);
        let _ = kill_process(pid, Signal::STOP);
        slot.frozen_until = Some(Instant::now() + Duration::from_secs(secs));
        let name = slot.name;
        self.note(format!("freeze {name} for {secs}s"));
    }

    async fn kill(&mut self, i: usize, rng: &mut Rng) {
        let slot = &mut self.slots[i];
        if let Some(mut replica) = slot.process.take() {
            if let Some(pid) = replica.pid() {
                let _ = kill_process(pid, Signal::KILL);
            }
            replica.wait_exit().await;
        }
        slot.frozen_until = None;
        let pause = rng.between(0, 5);
        let name = slot.name;
        self.note(format!("kill {name}; start it again in {pause}s"));
        tokio::time::sleep(Duration::from_secs(pause)).await;
        self.launch(i).await;
    }

    fn step_clock(&mut self, i: usize, rng: &mut Rng) {
        let offset = rng.between(0, 120) as i64 - 60;
        let slot = &self.slots[i];
        std::fs::write(&slot.clock, format!("{offset:+}\n")).expect("write the clock file");
        let name = slot.name;
        self.note(format!("step {name}'s wall clock to {offset:+}s"));
    }

    fn add_rule(&mut self, i: usize, rule: Rule, what: String) {
        let handle = self.slots[i].proxy.add(rule);
        self.slots[i]
            .rules
            .push((Instant::now() + RULE_LIFE, handle));
        let name = self.slots[i].name;
        self.note(format!("{name}: {what}"));
    }

    fn fail_and_land_later(&mut self, i: usize, rng: &mut Rng) {
        let (method, path) = write_target(rng);
        let after = Duration::from_secs(rng.between(1, LATEST_LANDING.as_secs()));
        let times = rng.between(1, 4);
        let action = Action::Answer {
            status: 500,
            then_land_after: Some(after),
        };
        let rule = Rule::new(Some(method.clone()), path, action).times(times);
        let what =
            format!("the next {times} {method} '{path}' answered 500, landing {after:?} later");
        self.add_rule(i, rule, what);
    }

    /// The storm the fences are for: every write of the replica but its Lease's answered 500
    /// and landing 20 s to a minute later (an etcd election behind the API server: late enough
    /// for a successor to take over first), and the replica frozen or killed once a podCIDR
    /// write is on its way, so a successor acts before it lands. The Lease's writes and the
    /// seal's pass, so the replica leads on unaware until it stops.
    async fn depose_mid_write(&mut self, i: usize, rng: &mut Rng, tally: &Mutex<workload::Tally>) {
        let after = Duration::from_secs(rng.between(20, LATEST_LANDING.as_secs()));
        let action = Action::Answer {
            status: 500,
            then_land_after: Some(after),
        };
        let first = self.slots[i].rules.len();
        self.add_rule(
            i,
            Rule::new(None, "/leases", Action::Forward),
            "Lease writes pass".into(),
        );
        // A podCIDR write is the one to catch: it is what two leaders can give twice.
        let nodes = Rule::new(Some(Method::PATCH), "/api/v1/nodes/", action.clone())
            .body("podCIDRs")
            .times(20);
        let what = format!("every podCIDR write answered 500, landing {after:?} later");
        self.add_rule(i, nodes, what);
        let seals = Rule::new(Some(Method::PATCH), "/api/v1/nodes/", Action::Forward);
        self.add_rule(i, seals, "other node PATCHes (seals) pass".into());
        for method in [Method::PATCH, Method::PUT, Method::POST, Method::DELETE] {
            let rule = Rule::new(Some(method.clone()), "", action.clone()).times(20);
            let what = format!("every {method} answered 500, landing {after:?} later");
            self.add_rule(i, rule, what);
        }
        // Strike once a podCIDR write is on its way (or after some seconds without one).
        let deadline = Instant::now() + Duration::from_secs(rng.between(1, 15));
        let caught = |slot: &Slot| slot.rules[first + 1].1.matched() > 0;
        while Instant::now() < deadline && !caught(&self.slots[i]) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rules = &self.slots[i].rules;
        let held: u64 = rules[first + 1].1.matched()
            + rules[first + 3..]
                .iter()
                .map(|(_, r)| r.matched())
                .sum::<u64>();
        let name = self.slots[i].name;
        self.note(format!("{name}: {held} writes on their way"));
        tokio::time::sleep(Duration::from_millis(rng.between(0, 1000))).await;
        if rng.below(2) == 0 {
            self.kill(i, rng).await;
        } else {
            self.freeze(i, rng);
        }
        // What was caught still lands late; what the replica sends next goes through, so
        // that it can lead again (a replica that can write nothing stalls the whole run).
        for (_, rule) in self.slots[i].rules.drain(first..) {
            rule.remove();
        }
        if let Some(caught) = self.caught_node(i) {
            let group = caught.rsplit_once('-').map_or("", |(_, g)| g).to_string();
            let until = Instant::now() + after + Duration::from_secs(5);
            tally.lock().expect("tally").calm.insert(group, until);
            self.fill_before(&caught, rng).await;
        }
    }

    /// The node of a podCIDR write slot `i`'s proxy answered itself, if any (in
    /// [`Self::depose_mid_write`] only podCIDR writes to nodes are answered by the proxy).
    fn caught_node(&self, i: usize) -> Option<String> {
        self.slots[i].proxy.log().iter().rev().find_map(|x| {
            let injected = x.origin == Origin::Injected && x.method == Method::PATCH;
            let name = x.path.strip_prefix("/api/v1/nodes/")?;
            (injected && !name.contains('/')).then(|| name.to_string())
        })
    }

    /// The worst moment for nodes to arrive: while a deposed leader's write for `caught` is on
    /// its way, as many nodes of the same group as it has free blocks, named to sort before
    /// every other (a digit first), so a successor gives them every free block, the one that
    /// write carries included, and `caught` waits: the late write must then be refused, or two
    /// nodes hold that block.
    async fn fill_before(&mut self, caught: &str, rng: &mut Rng) {
        let group = caught.rsplit_once('-').map_or("", |(_, g)| g).to_string();
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.admin.clone());
        let lp = kube::api::ListParams::default().labels(&format!("{}={group}", workload::GROUP));
        let held = match api.list(&lp).await {
            Ok(list) => list.items.iter().filter(|n| has_pod_cidrs(n)).count(),
            Err(e) => {
                self.note(format!("list the nodes of {group}: {e}"));
                return;
            }
        };
        let free = workload::capacity(&group).saturating_sub(held).max(1);
        for _ in 0..free {
            let word: String = (0..4)
                .map(|_| char::from(b'a' + rng.below(26) as u8))
                .collect();
            let name = format!("0{word}-{group}");
            let node = crate::support::node(&name, &[(workload::GROUP, group.as_str())], &[]);
            let r = api.create(&Default::default(), &node).await;
            let said = r.map_or_else(|e| e.to_string(), |_| "created".into());
            self.note(format!("node {name} arrives before {caught}: {said}"));
        }
    }

    fn throttle(&mut self, i: usize, rng: &mut Rng) {
        let path = PATHS[rng.below(PATHS.len() as u64) as usize];
        let times = rng.between(5, 60);
        let rule = Rule::new(
            None,
            path,
            Action::Throttle {
                retry_after_secs: 1,
            },
        )
        .times(times);
        self.add_rule(
            i,
            rule,
            format!("the next {times} requests '{path}' answered 429"),
        );
    }

    fn hold(&mut self, i: usize, rng: &mut Rng) {
        let (method, path) = write_target(rng);
        let delay = Duration::from_secs(rng.between(1, LATEST_LANDING.as_secs()));
        let times = rng.between(1, 4);
        let rule = Rule::new(Some(method.clone()), path, Action::Delay(delay)).times(times);
        let what = format!("the next {times} {method} '{path}' held {delay:?}");
        self.add_rule(i, rule, what);
    }

    async fn delete_lease(&mut self) {
        let api: Api<Lease> = Api::namespaced(self.admin.clone(), NAMESPACE);
        let r = api.delete(LEASE, &DeleteParams::default()).await;
        self.note(format!(
            "delete the Lease: {}",
            r.map_or_else(|e| e.to_string(), |_| "done".into())
        ));
    }

    async fn restart_apiserver(&mut self) {
        self.note("restart the API server".into());
        self.cp
            .restart_apiserver()
            .await
            .unwrap_or_else(|e| panic!("step=chaos-restart-apiserver: {e}"));
    }

    /// Ends every fault: thaws, clocks back, rules gone, every replica running.
    pub async fn heal(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].frozen_until.is_some() {
                self.thaw(i);
            }
            let slot = &mut self.slots[i];
            for (_, rule) in slot.rules.drain(..) {
                rule.remove();
            }
            slot.proxy.clear_rules();
            std::fs::write(&slot.clock, "+0\n").expect("write the clock file");
            if slot.process.is_none() {
                self.launch(i).await;
            }
        }
        self.note("healed: every replica running, no fault left".into());
    }

    /// Stops the replicas (SIGTERM) and the control plane.
    pub async fn stop(mut self) {
        for slot in &mut self.slots {
            if let Some(mut r) = slot.process.take() {
                r.signal(Signal::TERM);
                r.wait_exit().await;
            }
        }
        self.cp.stop().await;
    }
}

/// The paths a fault picks from: the objects the fences guard, and everything.
const PATHS: &[&str] = &[
    "/api/v1/nodes",
    "/configmaps",
    "/nodeipamconfigs",
    "/nodeipampools",
    "/leases",
    "",
];

fn has_pod_cidrs(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.as_ref())
        .is_some_and(|c| !c.is_empty())
}

/// What a request's path writes, for [`Nemesis::count_landings`].
fn kind(path: &str) -> String {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // /api/v1/<kind>/... or /api/v1/namespaces/<ns>/<kind>/... (and /apis/<group>/<version>/).
    let rest = match parts.first() {
        Some(&"apis") => parts.get(3..),
        _ => parts.get(2..),
    }
    .unwrap_or(&[]);
    let rest = match rest.first() {
        Some(&"namespaces") if rest.len() > 2 => &rest[2..],
        _ => rest,
    };
    let sub = if rest.len() > 2 { rest[2] } else { "" };
    match (rest.first(), sub) {
        (Some(k), "") => k.to_string(),
        (Some(k), sub) => format!("{k}/{sub}"),
        (None, _) => path.to_string(),
    }
}

fn write_target(rng: &mut Rng) -> (Method, &'static str) {
    let method = match rng.below(10) {
        0..5 => Method::PATCH,
        5..7 => Method::PUT,
        7..9 => Method::POST,
        _ => Method::DELETE,
    };
    (method, PATHS[rng.below(PATHS.len() as u64) as usize])
}
