//! The soak, as Jepsen and etcd's robustness tests do it (issue 45, item 7): three `nodeipam`
//! replicas, each behind its own fault proxy, serve a cluster whose nodes come and go and
//! whose configs and pool change, while a nemesis ([`nemesis`]) picks faults at random; a
//! checker ([`history`]) replays every revision etcd commits against the rule above all. At the
//! end the faults stop, and every node must be served and every count right.
//!
//! `NODEIPAM_CHAOS_MINUTES` (default 3, what CI runs) and `NODEIPAM_CHAOS_SEED` (default: from
//! the clock) set the run; `hack/chaos.sh --minutes N [--seed S]` runs it alone. The seed fixes
//! the order and kind of every fault and workload step, not their timing against the replicas,
//! so a replay is the same storm, not the same interleaving: the nemesis log printed at the end
//! is what to read.

#[path = "../support/mod.rs"]
mod support;

mod history;
mod nemesis;
mod workload;

use std::time::{Duration, Instant};

use kube::Api;
use kube::ResourceExt;
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_testenv::ControlPlane;
use support::process::install_rbac;

/// A small seeded generator (splitmix64): the same seed, the same faults in the same order.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn draw(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.draw() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a whole number")),
    )
}

async fn control_plane() -> ControlPlane {
    ControlPlane::builder()
        .apiserver_arg("--storage-media-type=application/json")
        .apiserver_arg("--etcd-compaction-interval=0")
        .start()
        .await
        .unwrap_or_else(|e| panic!("step=chaos-control-plane: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_under_a_nemesis_never_break_the_rule() {
    let minutes = env_u64("NODEIPAM_CHAOS_MINUTES").unwrap_or(3);
    let seed = env_u64("NODEIPAM_CHAOS_SEED").unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        now.map_or(1, |d| d.as_nanos() as u64)
    });
    println!("chaos: seed {seed}, {minutes} minutes (NODEIPAM_CHAOS_SEED={seed} replays it)");
    let began = Instant::now();
    let cp = control_plane().await;
    let admin = cp.client();
    install_rbac(&cp).await;
    let checker = history::Checker::start(cp.etcd_url());
    let dir = tempfile::tempdir().expect("temp dir");
    // NODEIPAM_CHAOS_KEEP=1 keeps every replica's log (one folder per start) for reading.
    let dir_path = if std::env::var_os("NODEIPAM_CHAOS_KEEP").is_some() {
        let kept = dir.keep();
        println!("chaos: replica logs kept in {}", kept.display());
        kept
    } else {
        dir.path().to_path_buf()
    };
    let mut nemesis = nemesis::Nemesis::start(cp, &dir_path, began).await;
    workload::install(&admin).await;
    let (tally, churn) = workload::start(admin.clone(), seed, began);

    let mut rng = Rng::new(seed);
    let end = began + Duration::from_secs(minutes * 60);
    let mut next = Instant::now();
    while Instant::now() < end && checker.violations().is_empty() {
        nemesis.tick();
        nemesis.count_landings();
        if Instant::now() >= next {
            nemesis.strike(&mut rng, &tally).await;
            next = Instant::now() + Duration::from_millis(rng.between(1000, 6000));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    churn.abort();
    nemesis.heal().await;
    // A violation seen is the finding: report it as the checker saw it (the revision, the
    // objects), not as whatever the settling that follows would trip on next.
    if checker.violations().is_empty() {
        settle(&admin, &tally, &checker).await;
    }
    nemesis.count_landings();
    println!(
        "chaos: late writes landed (what, status: how many): {:?}",
        nemesis.landings
    );

    let violations = report(seed, &nemesis.log, &tally, &checker);
    if !violations.is_empty() {
        println!("--- nemesis log ---\n{}", nemesis.log.join("\n"));
        let log = tally.lock().expect("tally").log.join("\n");
        println!("--- workload log ---\n{log}");
        panic!(
            "INVARIANT BROKEN (seed {seed}, replay with NODEIPAM_CHAOS_SEED={seed}):\n{}",
            violations.join("\n")
        );
    }
    nemesis.stop().await;
}

/// Prints what the run did; the violations found.
fn report(
    seed: u64,
    faults: &[String],
    tally: &std::sync::Mutex<workload::Tally>,
    checker: &history::Checker,
) -> Vec<String> {
    let t = tally.lock().expect("tally");
    let f = checker.findings.lock().expect("findings");
    println!(
        "chaos: seed {seed}: {} faults; nodes created {}, deleted {}, {} toggles, {} steps \
         refused ({:?}); {} changes replayed to revision {} ({} reconnects)",
        faults.len(),
        t.created,
        t.deleted,
        t.toggles,
        t.refused,
        t.refusals,
        f.changes,
        f.revision,
        f.reconnects
    );
    f.violations.clone()
}

/// After the faults: every late write landed, every config enabled, every node served, every
/// status count right, and the checker has replayed all of it.
async fn settle(
    admin: &kube::Client,
    tally: &std::sync::Mutex<workload::Tally>,
    checker: &history::Checker,
) {
    // A write answered 500 or held lands at most this long after it was sent.
    tokio::time::sleep(nemesis::LATEST_LANDING + Duration::from_secs(5)).await;
    workload::enable_all(admin, tally).await;
    workload::trim(admin).await;
    let nodes = workload::nodes(admin).await;
    for name in nodes.keys() {
        support::wait_cidrs(admin, name).await;
    }
    let configs = Api::<NodeIPAMConfig>::all(admin.clone())
        .list(&Default::default())
        .await
        .expect("list configs")
        .items;
    for c in &configs {
        support::assert_status_matches(admin, &c.name_any()).await;
    }
    support::assert_invariant(admin, &[]).await;
    let now: u64 = Api::<NodeIPAMConfig>::all(admin.clone())
        .list(&Default::default())
        .await
        .expect("list configs")
        .metadata
        .resource_version
        .and_then(|v| v.parse().ok())
        .expect("a list's resourceVersion");
    support::wait_for("the checker to replay every revision", || async {
        (checker.revision() >= now).then_some(())
    })
    .await;
}
