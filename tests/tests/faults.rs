//! End-to-end tests of the single-writer argument (docs/single-writer.md) under faults only a
//! proxy can make: a leader behind the fault proxy (`nodeipam_testenv::fault_proxy`) gets a
//! 500 for a write that commits later, cannot read its Lease while its writes still pass, or
//! is throttled; a standby talks to the API server directly. In each, the next leader waits
//! for whatever the first may still do, and no two nodes ever share a block.

mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use http::Method;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use nodeipam_controller::reconcile::handover::{HANDOVER_ANNOTATION, SETTLED};
use nodeipam_testenv::fault_proxy::{Action, Rule};
use nodeipam_testenv::{ControlPlane, FaultProxy};
use rustix::process::Signal;
use serde_json::json;
use support::process::{NAMESPACE, Replica, SA_GROUPS, SA_USER, install_rbac, sa_kubeconfig};
use support::*;

const LEASE: &str = "nodeipam-controller";
/// A 15 s lease renewed 5 s before it runs out: a 4.5 s write timeout and take-over wait.
const FLAGS: &[&str] = &[
    "--lease-duration=15",
    "--lease-grace=5",
    "--kube-api-qps=200",
    "--kube-api-burst=200",
];

/// A control plane, replica-a leading through a fault proxy, replica-b standing by directly,
/// and a config whose first node holds a block.
struct Pair {
    cp: ControlPlane,
    admin: Client,
    _dir: tempfile::TempDir,
    proxy: FaultProxy,
    a: Replica,
    b: Replica,
    /// replica-b's own proxy, when it talks through one ([`Pair::start_b_proxied`]).
    proxy_b: Option<FaultProxy>,
}

impl Pair {
    async fn start(cidr: &str, mask: u8) -> Pair {
        Self::start_with(cidr, mask, false).await
    }

    /// As [`start`](Self::start), with replica-b behind a fault proxy of its own too.
    async fn start_b_proxied(cidr: &str, mask: u8) -> Pair {
        Self::start_with(cidr, mask, true).await
    }

    async fn start_with(cidr: &str, mask: u8, b_proxied: bool) -> Pair {
        let cp = control_plane().await;
        let admin = cp.client();
        let dir = tempfile::tempdir().expect("temp dir");
        install_rbac(&cp).await;
        let (proxy, through) = sa_proxy(&cp, dir.path(), "through-proxy.kubeconfig");
        let a = Replica::start_plain(dir.path(), &through, "replica-a", FLAGS).await;
        a.wait_leader_metric(1.0).await;
        let (b_kubeconfig, proxy_b) = if b_proxied {
            let (proxy_b, path) = sa_proxy(&cp, dir.path(), "through-proxy-b.kubeconfig");
            (path, Some(proxy_b))
        } else {
            (sa_kubeconfig(&cp, dir.path(), "nodeipam-controller"), None)
        };
        let b = Replica::start_plain(dir.path(), &b_kubeconfig, "replica-b", FLAGS).await;
        create_ready_config(&admin, "pool", spec(family(cidr, mask), None, None)).await;
        create_node(&admin, "warm", &[]).await;
        wait_cidrs(&admin, "warm").await;
        Pair {
            cp,
            admin,
            _dir: dir,
            proxy,
            a,
            b,
            proxy_b,
        }
    }
}

impl Pair {
    /// Stops both replicas (SIGTERM) and the control plane.
    async fn stop(mut self) {
        for r in [&mut self.a, &mut self.b] {
            r.signal(Signal::TERM);
            r.wait_exit().await;
        }
        self.cp.stop().await;
    }
}

/// A fault proxy for the controller's ServiceAccount, and a kubeconfig through it written to
/// `dir/file`.
fn sa_proxy(cp: &ControlPlane, dir: &std::path::Path, file: &str) -> (FaultProxy, PathBuf) {
    let proxy = FaultProxy::for_user(cp, SA_USER, SA_GROUPS)
        .unwrap_or_else(|e| panic!("step=start-fault-proxy {file}: {e}"));
    let path = dir.join(file);
    proxy
        .write_kubeconfig(&path)
        .unwrap_or_else(|e| panic!("step=fault-proxy-kubeconfig {file}: {e}"));
    (proxy, path)
}

/// The podCIDR writes (PATCHes) of node `name` get `action`.
fn node_patch(name: &str, action: Action) -> Rule {
    Rule::new(Some(Method::PATCH), format!("/api/v1/nodes/{name}"), action)
}

/// A write answered 500 at once that reaches the API server 40 s later and commits (an etcd
/// timeout behind the 500): long after a take-over.
const LATE: Action = Action::Answer {
    status: 500,
    then_land_after: Some(Duration::from_secs(40)),
};

/// The late landing of a held write whose path ends with `suffix`, once it has happened.
async fn landed(proxy: &FaultProxy, suffix: &str) -> nodeipam_testenv::fault_proxy::Exchange {
    wait_for(&format!("the held write to {suffix} to arrive"), || async {
        proxy.log().into_iter().find(|e| {
            e.path.ends_with(suffix) && e.origin == nodeipam_testenv::fault_proxy::Origin::Landed
        })
    })
    .await
}

/// Disables `config` with replica-a leading, lets replica-a's first PATCH to `path` after that
/// be answered 500 and land 40 s later ([`LATE`]), and kills replica-a once it was sent.
async fn disable_with_a_stuck_write(
    admin: &Client,
    proxy: &FaultProxy,
    a: &mut Replica,
    config: &str,
    path: &str,
) {
    let late = proxy.add(Rule::new(Some(Method::PATCH), path, LATE).times(1));
    set_allocation(admin, config, nodeipam_crd::Allocation::Disabled).await;
    wait_for(
        &format!("replica-a's write to {path} after disabling {config}"),
        || async { (late.matched() >= 1).then_some(()) },
    )
    .await;
    a.signal(Signal::KILL);
    a.wait_exit().await;
}

/// Stops the surviving replica (it must exit cleanly) and the control plane.
async fn finish(mut b: Replica, cp: ControlPlane) {
    b.signal(Signal::TERM);
    assert!(b.wait_exit().await.success());
    cp.stop().await;
}

async fn lease(client: &Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get_opt(LEASE)
        .await
        .expect("get lease")
}

async fn takeovers(replica: &Replica, handover: &str) -> f64 {
    replica
        .gauge("nodeipam_leader_takeovers_total", &[("handover", handover)])
        .await
        .unwrap_or(0.0)
}

/// A write answered 500 may still commit (an etcd timeout behind it): a leader that stops
/// after one must not vouch on the Lease that none of its writes can land, and its successor
/// waits them out. Here the 500'd write does land, 3 s later, after the leader was stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_answered_500_is_not_handed_over_as_settled() {
    let Pair {
        cp,
        admin,
        _dir,
        proxy,
        mut a,
        b,
        ..
    } = Pair::start("10.82.0.0/16", 24).await;
    let late = proxy.add(
        node_patch(
            "late",
            Action::Answer {
                status: 500,
                then_land_after: Some(Duration::from_secs(3)),
            },
        )
        .times(1),
    );
    create_node(&admin, "late", &[]).await;
    wait_for(
        "replica-a's write to node late to be answered 500",
        || async { (late.matched() == 1).then_some(()) },
    )
    .await;
    a.signal(Signal::TERM);
    assert!(a.wait_exit().await.success(), "{}", a.log_tail());
    let mark = lease(&admin)
        .await
        .and_then(|l| l.annotations().get(HANDOVER_ANNOTATION).cloned());
    assert_ne!(
        mark.as_deref(),
        Some(SETTLED),
        "replica-a vouched for a write answered 500:\n{}",
        a.log_tail()
    );
    b.wait_leader_metric(1.0).await;
    create_node(&admin, "after", &[]).await;
    wait_cidrs(&admin, "after").await;
    wait_cidrs(&admin, "late").await;
    assert_invariant(&admin, &[]).await;
    assert_eq!(takeovers(&b, "clean").await, 0.0, "{}", b.log_tail());
    assert_eq!(takeovers(&b, "unclean").await, 1.0, "{}", b.log_tail());
    finish(b, cp).await;
}

/// A Lease deleted by hand with its leader's finalizer stripped vanishes at once, while its
/// leader may go on writing until its own term runs out (here it cannot read the Lease, so it
/// does not notice). The replica that creates the next Lease knows nothing of that leader: it
/// waits a whole term and the write timeout before it writes, and the nodes streamed
/// meanwhile never share a block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_deleted_with_its_finalizer_stripped_makes_the_next_leader_wait_out_the_term() {
    let pair = Pair::start("10.83.0.0/16", 26).await;
    let (admin, proxy) = (pair.admin.clone(), &pair.proxy);
    // From now on replica-a reads (and so renews) its Lease no more; its other calls pass.
    let blind = proxy.add(Rule::new(
        None,
        format!("/leases/{LEASE}"),
        Action::Answer {
            status: 503,
            then_land_after: None,
        },
    ));
    wait_for("replica-a to fail to read its Lease", || async {
        (blind.matched() >= 1).then_some(())
    })
    .await;
    let leases = Api::<Lease>::namespaced(admin.clone(), NAMESPACE);
    let strip = json!({ "metadata": { "finalizers": null } });
    leases
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .expect("strip the Lease's finalizers");
    leases
        .delete(LEASE, &DeleteParams::default())
        .await
        .expect("delete the Lease");
    let deleted_at = Instant::now();
    // Nodes keep coming while replica-a goes on (until its term ends, under 15 s after its
    // last renewal) and replica-b takes the next Lease.
    let mut created = 0usize;
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    while deleted_at.elapsed() < Duration::from_secs(12) {
        pace.tick().await;
        for _ in 0..8 {
            create_node(&admin, &format!("stream-{created:04}"), &[]).await;
            created += 1;
        }
    }
    for i in 0..created {
        wait_cidrs(&admin, &format!("stream-{i:04}")).await;
    }
    assert_invariant(&admin, &[]).await;
    let next = lease(&admin).await.expect("a next Lease");
    let holder = next
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.starts_with("replica-b_"), "{holder}");
    assert_eq!(
        takeovers(&pair.b, "unknown").await,
        1.0,
        "replica-b waited out replica-a's term:\n{}",
        pair.b.log_tail()
    );
    assert_eq!(
        takeovers(&pair.b, "clean").await,
        0.0,
        "{}",
        pair.b.log_tail()
    );
    pair.stop().await;
}

/// A leader throttled by API Priority and Fairness (429 with a long Retry-After) on its
/// status writes sees each 429 and retries with its own short backoff, logged (naming the
/// throttling) and counted, instead of sleeping out the Retry-After inside the client; once
/// the throttling ends the status lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_status_write_is_retried_by_our_backoff_not_held_in_the_client() {
    let pair = Pair::start("10.84.0.0/16", 24).await;
    let (admin, proxy) = (pair.admin.clone(), &pair.proxy);
    let throttled = proxy.add(Rule::new(
        Some(Method::PATCH),
        "/nodeipamconfigs/second/status",
        Action::Throttle {
            retry_after_secs: 600,
        },
    ));
    let cfg =
        nodeipam_crd::NodeIPAMConfig::new("second", spec(family("10.85.0.0/16", 24), None, None));
    Api::<nodeipam_crd::NodeIPAMConfig>::all(admin.clone())
        .create(&Default::default(), &cfg)
        .await
        .expect("create config second");
    // Several sends within seconds: each one our own retry, not a client asleep for 600 s.
    wait_for("replica-a to send the throttled status again", || async {
        (throttled.matched() >= 3).then_some(())
    })
    .await;
    let errors = pair
        .a
        .gauge(
            "nodeipam_reconcile_errors_total",
            &[("kind", "config_write")],
        )
        .await
        .unwrap_or(0.0);
    assert!(errors >= 2.0, "throttled writes are counted: {errors}");
    // The log says what happened: throttled, not a request that hung until our timeout (as
    // one retried inside the client for the Retry-After would).
    let log = pair.a.log_text();
    let said = log
        .lines()
        .filter(|l| l.contains("writing NodeIPAMConfig failed; will retry"))
        .any(|l| l.contains("TooManyRequests"));
    assert!(said, "no retry logged with the 429:\n{}", pair.a.log_tail());
    throttled.remove();
    wait_for("the status of config second once unthrottled", || async {
        let cfg = get_config(&admin, "second").await?;
        cfg.status.filter(|s| s.observed_generation.is_some())
    })
    .await;
    pair.stop().await;
}

/// A podCIDR write throttled (429) is retried with the writer's backoff, the same blocks,
/// counted, and lands once the throttling ends: no retry hidden in the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_node_write_is_retried_and_lands() {
    let pair = Pair::start("10.86.0.0/16", 24).await;
    let (admin, proxy) = (pair.admin.clone(), &pair.proxy);
    let throttled = proxy.add(
        node_patch(
            "slow",
            Action::Throttle {
                retry_after_secs: 600,
            },
        )
        .times(3),
    );
    create_node(&admin, "slow", &[]).await;
    wait_cidrs(&admin, "slow").await;
    assert_eq!(
        throttled.matched(),
        3,
        "each throttled attempt came back to us"
    );
    let errors = pair
        .a
        .gauge("nodeipam_reconcile_errors_total", &[("kind", "node_write")])
        .await
        .unwrap_or(0.0);
    assert!(errors >= 3.0, "throttled writes are counted: {errors}");
    assert_invariant(&admin, &[]).await;
    pair.stop().await;
}

/// The seal, shown where no timing can help: replica-a's podCIDR write for node zzz-late is
/// answered 500 at once and reaches the API server 40 s later, long after replica-a was
/// killed, replica-b took over (the lease's term and the write timeout) and gave the block
/// replica-a had chosen, the last one of the config, to node aaa-new. The write tests the
/// seal of zzz-late replica-a read; replica-b's seal changed it, so the write's test fails
/// (422) and no two nodes share a block. Without the seal (or without the write's test of
/// it), it lands and zzz-late and aaa-new hold the same block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_lands_after_the_take_over_wait_is_sealed_off() {
    // Two blocks: warm holds the first, the second is the one both leaders choose.
    let Pair {
        cp,
        admin,
        _dir,
        proxy,
        mut a,
        b,
        ..
    } = Pair::start("10.87.0.0/23", 24).await;
    let late = proxy.add(node_patch("zzz-late", LATE));
    create_node(&admin, "zzz-late", &[]).await;
    wait_for(
        "replica-a's write to node zzz-late to be answered 500",
        || async { (late.matched() >= 1).then_some(()) },
    )
    .await;
    let sent = Instant::now();
    a.signal(Signal::KILL);
    a.wait_exit().await;
    create_node(&admin, "aaa-new", &[]).await;
    b.wait_leader_metric(1.0).await;
    let given = wait_cidrs(&admin, "aaa-new").await;
    assert_eq!(
        given,
        vec!["10.87.1.0/24".to_string()],
        "replica-b gives the block replica-a chose to another node"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(40),
        "the take-over took longer than the write's delay: the test shows nothing"
    );
    let landed = landed(&proxy, "/nodes/zzz-late").await;
    assert_invariant(&admin, &[]).await;
    assert_eq!(
        landed.status, 422,
        "the late write's test of the seal failed: {landed:?}"
    );
    let node = get_node(&admin, "zzz-late").await.expect("node zzz-late");
    assert_eq!(
        node.spec.and_then(|s| s.pod_cidrs),
        None,
        "zzz-late stays empty"
    );
    let sealed = b
        .gauge(
            "nodeipam_takeover_sealed_nodes_total",
            &[("result", "sealed")],
        )
        .await
        .unwrap_or(0.0);
    assert!(
        sealed >= 1.0,
        "replica-b sealed zzz-late: {sealed}\n{}",
        b.log_tail()
    );
    assert_eq!(takeovers(&b, "unclean").await, 1.0, "{}", b.log_tail());
    finish(b, cp).await;
}

/// The seal never gives up (issue 45): replica-b takes over from a replica-a killed with a
/// write for node zzz-late answered 500 that lands 40 s after it was sent, and meets a
/// throttled API server: its first two Node lists for the seal and its first six seal writes
/// to zzz-late are answered 429 (more tries than any fixed limit of five). It lists and writes
/// again until zzz-late is sealed, allocating nothing meanwhile, then gives the block
/// replica-a chose to aaa-new; the late write fails its test of the seal. A seal that gave up
/// (on the failed list or after five throttled writes) left zzz-late to the take-over wait
/// alone: the late write landed, and zzz-late and aaa-new held the same block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_seal_is_retried_until_every_node_is_sealed() {
    let Pair {
        cp,
        admin,
        _dir,
        proxy,
        mut a,
        b,
        proxy_b,
    } = Pair::start_b_proxied("10.89.0.0/23", 24).await;
    let proxy_b = proxy_b.expect("replica-b talks through its own proxy");
    let late = proxy.add(node_patch("zzz-late", LATE));
    let throttle = Action::Throttle {
        retry_after_secs: 1,
    };
    let lists = proxy_b.add(
        Rule::new(Some(Method::GET), "/api/v1/nodes", throttle.clone())
            .query("limit=")
            .times(2),
    );
    let seals = proxy_b.add(node_patch("zzz-late", throttle).times(6));
    create_node(&admin, "zzz-late", &[]).await;
    wait_for(
        "replica-a's write to node zzz-late to be answered 500",
        || async { (late.matched() >= 1).then_some(()) },
    )
    .await;
    a.signal(Signal::KILL);
    a.wait_exit().await;
    create_node(&admin, "aaa-new", &[]).await;
    // During replica-b's take-over (it counts as leader only once the seal is done).
    wait_for("replica-b's sixth throttled seal of zzz-late", || async {
        (seals.matched() >= 6).then_some(())
    })
    .await;
    assert_eq!(lists.matched(), 2, "the seal's node lists were throttled");
    let node = get_node(&admin, "aaa-new").await.expect("node aaa-new");
    assert_eq!(
        pod_cidrs(&node),
        Vec::<String>::new(),
        "nothing is allocated while a node is unsealed\n{}",
        b.log_tail()
    );
    b.wait_leader_metric(1.0).await;
    let given = wait_cidrs(&admin, "aaa-new").await;
    assert_eq!(given, vec!["10.89.1.0/24".to_string()]);
    let landed = landed(&proxy, "/nodes/zzz-late").await;
    assert_invariant(&admin, &[]).await;
    assert_eq!(
        landed.status, 422,
        "the late write met the seal: {landed:?}"
    );
    for (step, at_least) in [("list", 2.0), ("write", 6.0)] {
        let retries = b
            .gauge("nodeipam_takeover_seal_retries_total", &[("step", step)])
            .await
            .unwrap_or(0.0);
        assert!(
            retries >= at_least,
            "the seal retried its {step}s: {retries}\n{}",
            b.log_tail()
        );
    }
    finish(b, cp).await;
}

/// A config's status is fenced by the generation it was computed for (issue 45, the third
/// sequence): replica-a computes Drained=True for the disabled, empty config spare; that
/// status write is answered 500 and reaches the API server 40 s later. Meanwhile replica-a is
/// killed, spare is enabled again, and replica-b gives node on-spare a block of it. The late
/// write tests spare's generation, which the re-enabling moved, and is refused (422): spare
/// never says Drained=True while on-spare holds its block. Tested by the UID alone, it
/// landed (200) and said so until replica-b noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_drained_status_for_an_older_generation_is_refused() {
    // One block, held by warm: a new node can only be served by spare.
    let Pair {
        cp,
        admin,
        _dir,
        proxy,
        mut a,
        b,
        ..
    } = Pair::start("10.90.0.0/24", 24).await;
    create_ready_config(
        &admin,
        "spare",
        spec(family("10.91.0.0/16", 24), None, None),
    )
    .await;
    let status = "/nodeipamconfigs/spare/status";
    disable_with_a_stuck_write(&admin, &proxy, &mut a, "spare", status).await;
    set_allocation(&admin, "spare", nodeipam_crd::Allocation::Enabled).await;
    create_node(&admin, "on-spare", &[]).await;
    b.wait_leader_metric(1.0).await;
    let given = wait_cidrs(&admin, "on-spare").await;
    assert!(
        given[0].starts_with("10.91."),
        "on-spare holds a block of spare: {given:?}"
    );
    let landed = landed(&proxy, "/nodeipamconfigs/spare/status").await;
    let spare = get_config(&admin, "spare").await.expect("config spare");
    assert_ne!(
        condition(&spare, "Drained").map(|(status, _)| status),
        Some("True".to_string()),
        "spare says Drained=True while on-spare holds its block"
    );
    assert_eq!(
        landed.status, 422,
        "the late Drained=True was written over a re-enabled config: {landed:?}"
    );
    assert_invariant(&admin, &[]).await;
    finish(b, cp).await;
}

/// The published pod network is fenced (issue 45, the second sequence): replica-a's publish
/// of the network with config first's range (and not yet second's) is answered 500 and reaches
/// the API server 40 s later. replica-a is killed, config second is created, and replica-b
/// publishes both ranges and gives node on-second a block of second. The late publish carries
/// the version of the ConfigMap replica-a read, which later publishes moved, and is refused
/// (409): the ConfigMap never lacks second's range while on-second holds a block of it.
/// Applied with no precondition (server-side apply, forced), it landed (200) and dropped the
/// range until replica-b noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_publish_never_drops_a_range_in_use() {
    use k8s_openapi::api::core::v1::ConfigMap;
    // One block, held by warm: a new node can only be served by second.
    let Pair {
        cp,
        admin,
        _dir,
        proxy,
        mut a,
        b,
        ..
    } = Pair::start("10.92.0.0/24", 24).await;
    let path = format!("/api/v1/namespaces/{NAMESPACE}/configmaps/nodeipam-pod-network");
    let late = proxy.add(Rule::new(Some(Method::PATCH), path.clone(), LATE).times(1));
    // A range no node is served from, only published.
    let nowhere = selector(&[("zone", "In", &["nowhere"])]);
    create_ready_config(
        &admin,
        "first",
        spec(family("10.93.0.0/24", 24), None, nowhere),
    )
    .await;
    assert_eq!(
        late.matched(),
        1,
        "replica-a's publish of first's range was held"
    );
    a.signal(Signal::KILL);
    a.wait_exit().await;
    create_config(
        &admin,
        "second",
        spec(family("10.94.0.0/24", 24), None, None),
    )
    .await;
    create_node(&admin, "on-second", &[]).await;
    b.wait_leader_metric(1.0).await;
    let given = wait_cidrs(&admin, "on-second").await;
    assert_eq!(given, vec!["10.94.0.0/24".to_string()]);
    let landed = landed(&proxy, &path).await;
    let network = Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
        .get("nodeipam-pod-network")
        .await
        .expect("the pod network ConfigMap");
    let ipv4 = network
        .data
        .and_then(|d| d.get("ipv4").cloned())
        .unwrap_or_default();
    assert!(
        ipv4.contains("10.94.0.0/24"),
        "the published network lacks second's range while on-second holds a block of it: {ipv4}"
    );
    assert_eq!(
        landed.status, 409,
        "the late publish was applied over a newer one: {landed:?}"
    );
    assert_invariant(&admin, &[]).await;
    finish(b, cp).await;
}

/// A successor relies on no published network before its own publish moved it (issue 45;
/// found by the simulator, `simulator.rs a_successor_relies_on_no_output_until_its_own_publish_moved_it`):
/// replica-a publishes config spare's range, then, spare disabled and empty, the network
/// without it; that publish is answered 500 and reaches the API server 40 s later. replica-a
/// is killed, spare is enabled again, and every publish of replica-b is answered 500. The
/// ConfigMap replica-b reads still holds spare's range, but at the version the late write was
/// sent on: until its own publish lands, replica-b must give node on-spare nothing of spare.
/// Before, it allocated on what it read, and the late write then dropped a range in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_relies_on_no_published_network_before_its_own_publish_lands() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use nodeipam_crd::Allocation;
    // One block, held by warm: a new node can only be served by spare.
    let Pair {
        cp,
        admin,
        _dir,
        proxy,
        mut a,
        b,
        proxy_b,
    } = Pair::start_b_proxied("10.95.0.0/24", 24).await;
    let proxy_b = proxy_b.expect("replica-b talks through its own proxy");
    create_ready_config(
        &admin,
        "spare",
        spec(family("10.93.0.0/16", 24), None, None),
    )
    .await;
    let path = format!("/api/v1/namespaces/{NAMESPACE}/configmaps/nodeipam-pod-network");
    disable_with_a_stuck_write(&admin, &proxy, &mut a, "spare", &path).await;
    let refuse = Action::Answer {
        status: 500,
        then_land_after: None,
    };
    let refused = proxy_b.add(Rule::new(Some(Method::PATCH), path.clone(), refuse));
    set_allocation(&admin, "spare", Allocation::Enabled).await;
    create_node(&admin, "on-spare", &[]).await;
    b.wait_leader_metric(1.0).await;
    wait_for("replica-b's publish to be answered 500", || async {
        (refused.matched() >= 1).then_some(())
    })
    .await;
    let landed = landed(&proxy, &path).await;
    assert_eq!(
        landed.status, 200,
        "nothing wrote the ConfigMap since replica-a read it: its late publish lands"
    );
    let node = get_node(&admin, "on-spare").await.expect("node on-spare");
    assert_eq!(
        pod_cidrs(&node),
        Vec::<String>::new(),
        "replica-b gave on-spare a block of spare before its own publish landed, and the late \
         publish dropped spare's range\n{}",
        b.log_tail()
    );
    refused.remove();
    let given = wait_cidrs(&admin, "on-spare").await;
    assert!(given[0].starts_with("10.93."), "on-spare holds {given:?}");
    let network = Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
        .get("nodeipam-pod-network")
        .await
        .expect("the pod network ConfigMap");
    let ipv4 = network
        .data
        .and_then(|d| d.get("ipv4").cloned())
        .unwrap_or_default();
    assert!(ipv4.contains("10.93.0.0/16"), "{ipv4}");
    assert_invariant(&admin, &[]).await;
    finish(b, cp).await;
}

/// A leak is counted while it lasts, not forever: replica-a's write for node leaky is
/// answered 500 and every retry is refused (422) until it gives the write up (eight refusals,
/// about 51 s of backoff), keeping the block occupied (a leak: the first write may still
/// land); 75 s after it was sent the write does land, the node shows the block, and the leak
/// ends. `nodeipam_leaked_blocks` goes 1 → 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leak_that_ends_is_no_longer_counted() {
    let pair = Pair::start("10.88.0.0/16", 24).await;
    let (admin, proxy) = (pair.admin.clone(), &pair.proxy);
    let first = proxy.add(
        node_patch(
            "leaky",
            Action::Answer {
                status: 500,
                then_land_after: Some(Duration::from_secs(75)),
            },
        )
        .times(1),
    );
    let refused = proxy.add(node_patch(
        "leaky",
        Action::Answer {
            status: 422,
            then_land_after: None,
        },
    ));
    create_node(&admin, "leaky", &[]).await;
    let leaked = || async {
        pair.a
            .gauge("nodeipam_leaked_blocks", &[])
            .await
            .unwrap_or(0.0)
    };
    // Eight refusals take up to 51 s of jittered backoff (100 ms doubling, each plus up to as
    // much again) before replica-a gives up: WAIT on top, for the writes themselves on a busy
    // machine.
    wait_for_within(
        Duration::from_secs(51) + WAIT,
        "replica-a to give the write up and leak its block",
        || async { (leaked().await == 1.0).then_some(()) },
    )
    .await;
    assert_eq!(first.matched(), 1);
    assert!(refused.matched() >= 1, "the retries were refused");
    // The first write lands 75 s after it was sent, whenever replica-a gave up.
    let cidrs = wait_for_within(Duration::from_secs(75) + WAIT, "the late write", || async {
        get_node(&admin, "leaky")
            .await
            .map(|n| pod_cidrs(&n))
            .filter(|c| !c.is_empty())
    })
    .await;
    assert_eq!(
        cidrs,
        vec!["10.88.1.0/24".to_string()],
        "the late write landed"
    );
    wait_for("the leak to end and the gauge to say so", || async {
        (leaked().await == 0.0).then_some(())
    })
    .await;
    assert_invariant(&admin, &[]).await;
    pair.stop().await;
}

/// A replica that starts while the API server fails its Lease create (a 500, a 429, a 403 as
/// from an API server whose RBAC cache is not yet filled, and a 500 that lands a moment later
/// anyway) keeps asking instead of exiting, then leads and serves: a blip of the API server
/// during a rolling update must not crash-loop the pods.
/// Found by the soak (tests/tests/chaos): a 500 on that create ended the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_lease_create_fails_at_start_keeps_asking_and_leads() {
    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let (proxy, through) = sa_proxy(&cp, dir.path(), "through-proxy.kubeconfig");
    let create = |action| Rule::new(Some(Method::POST), "/leases", action).times(1);
    let fail = |land| Action::Answer {
        status: 500,
        then_land_after: land,
    };
    let forbidden = Action::Answer {
        status: 403,
        then_land_after: None,
    };
    let failed = [
        proxy.add(create(fail(None))),
        proxy.add(create(Action::Throttle {
            retry_after_secs: 1,
        })),
        // As an API server that has just started answers before its RBAC cache is filled.
        proxy.add(create(forbidden)),
        proxy.add(create(fail(Some(Duration::from_millis(300))))),
    ];
    let mut a = Replica::start_plain(dir.path(), &through, "replica-a", FLAGS).await;
    a.wait_leader_metric(1.0).await;
    for rule in &failed {
        assert_eq!(rule.matched(), 1, "every failing create was sent");
    }
    assert!(a.exited().is_none(), "replica-a exited:\n{}", a.log_tail());
    create_ready_config(&admin, "pool", spec(family("10.94.0.0/16", 24), None, None)).await;
    create_node(&admin, "n1", &[]).await;
    wait_cidrs(&admin, "n1").await;
    a.signal(Signal::TERM);
    a.wait_exit().await;
    cp.stop().await;
}

/// A leader sends nothing after its own term, whatever its tasks believe (issue 45; found by
/// the soak, seed 20261208: a replica frozen past its term woke with writes due, and its
/// publisher rewrote the pod network at the version its successor had just written before its
/// election loop had noticed that the term was over; the successor's range was gone from the
/// ConfigMap for 10 ms while nodes held blocks of it). Here the same late notice, made
/// certain: replica-a's election loop hangs once it leads (the `stall-election` fault), so
/// nothing inside the process takes leadership back, and replica-b takes over when the Lease
/// runs out. Then a config and a node arrive: replica-a, whose allocation session still runs,
/// must send no write at all (its proxy sees none), and replica-b serves the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_election_hangs_sends_nothing_after_its_term() {
    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    create_config(&admin, "pool", spec(family("10.71.0.0/24", 28), None, None)).await;
    let (proxy, through) = sa_proxy(&cp, dir.path(), "through-proxy.kubeconfig");
    let mut flags = FLAGS.to_vec();
    flags.push("--inject-fault=stall-election");
    let mut a = Replica::start_plain(dir.path(), &through, "replica-a", &flags).await;
    a.wait_leader_metric(1.0).await;
    create_node(&admin, "warm", &[]).await;
    wait_cidrs(&admin, "warm").await;
    let b_kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");
    let b = Replica::start_plain(dir.path(), &b_kubeconfig, "replica-b", FLAGS).await;
    wait_for("replica-b to hold the Lease", || async {
        let holder = lease(&admin).await?.spec?.holder_identity?;
        (nodeipam_controller::alloc::lease::holder_name(&holder) == "replica-b").then_some(())
    })
    .await;
    assert_eq!(
        a.gauge("nodeipam_leader", &[]).await,
        Some(1.0),
        "replica-a still believes it leads (its election hangs)"
    );
    proxy.clear_log();
    let second = selector(&[("zone", "In", &["second"])]);
    create_config(
        &admin,
        "second",
        spec(family("10.72.0.0/24", 28), None, second),
    )
    .await;
    create_node(&admin, "on-second", &[("zone", "second")]).await;
    wait_cidrs(&admin, "on-second").await;
    // replica-a's session sees all of it too; what it would send it sends within moments.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sent: Vec<String> = proxy
        .log()
        .into_iter()
        .filter(|x| {
            x.method != Method::GET && !x.path.contains("/events") && !x.path.contains("/leases")
        })
        .map(|x| format!("{} {} -> {}", x.method, x.path, x.status))
        .collect();
    assert!(
        sent.is_empty(),
        "replica-a wrote after its term ended and replica-b took over: {sent:#?}"
    );
    assert_invariant(&admin, &[]).await;
    a.signal(Signal::KILL);
    a.wait_exit().await;
    finish(b, cp).await;
}

/// The IPPools nodeipam publishes for Calico whose `spec.cidr` is `cidr`.
async fn ip_pools_of(admin: &Client, cidr: &str) -> Vec<kube::api::DynamicObject> {
    let r = kube::discovery::ApiResource {
        group: "projectcalico.org".into(),
        version: "v3".into(),
        api_version: "projectcalico.org/v3".into(),
        kind: "IPPool".into(),
        plural: "ippools".into(),
    };
    Api::<kube::api::DynamicObject>::all_with(admin.clone(), &r)
        .list(&Default::default())
        .await
        .expect("list IPPools")
        .items
        .into_iter()
        .filter(|p| p.data["spec"]["cidr"] == cidr)
        .collect()
}

/// Issue 45's fourth sequence, end to end with two replicas and Calico's CRDs: replica-a
/// deletes the IPPool of config spare once spare is disabled and drained; that delete is
/// answered 500 and reaches the API server 40 s later. replica-a is killed, spare is enabled
/// again and a node gets a block of it from replica-b, whose first session rewrote the
/// IPPool it agreed with (moving its version). The late delete, sent at the version
/// replica-a listed, must be refused: the IPPool of a range in use stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_ip_pool_delete_never_removes_a_range_in_use() {
    let cp = control_plane().await;
    let crds = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/consumer-crds");
    cp.install_crds(&crds)
        .await
        .expect("step=install-consumer-crds");
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    support::process::kubectl_ok(
        &cp,
        &[
            "apply",
            "-f",
            &support::process::config_path("calico/rbac.yaml"),
        ],
    )
    .await;
    let mut flags = FLAGS.to_vec();
    flags.push("--calico-ip-pools");
    let (proxy, through) = sa_proxy(&cp, dir.path(), "through-proxy.kubeconfig");
    let mut a = Replica::start_plain(dir.path(), &through, "replica-a", &flags).await;
    a.wait_leader_metric(1.0).await;
    let b_kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");
    let b = Replica::start_plain(dir.path(), &b_kubeconfig, "replica-b", &flags).await;
    let spare = selector(&[("zone", "In", &["spare"])]);
    create_ready_config(
        &admin,
        "spare",
        spec(family("10.74.0.0/24", 28), None, spare),
    )
    .await;
    create_node(&admin, "on-spare", &[("zone", "spare")]).await;
    wait_cidrs(&admin, "on-spare").await;
    wait_for("replica-a's IPPool for spare", || async {
        (!ip_pools_of(&admin, "10.74.0.0/24").await.is_empty()).then_some(())
    })
    .await;
    let late = proxy.add(Rule::new(Some(Method::DELETE), "/ippools/", LATE).times(1));
    set_allocation(&admin, "spare", nodeipam_crd::Allocation::Disabled).await;
    delete_node(&admin, "on-spare").await;
    wait_for("replica-a's delete of spare's IPPool", || async {
        (late.matched() >= 1).then_some(())
    })
    .await;
    a.signal(Signal::KILL);
    a.wait_exit().await;
    set_allocation(&admin, "spare", nodeipam_crd::Allocation::Enabled).await;
    create_node(&admin, "again-on-spare", &[("zone", "spare")]).await;
    b.wait_leader_metric(1.0).await;
    let given = wait_cidrs(&admin, "again-on-spare").await;
    assert!(
        given.iter().all(|c| c.starts_with("10.74.")),
        "again-on-spare got {given:?}, not a block of spare"
    );
    let landed = wait_for("the held IPPool delete to arrive", || async {
        proxy.log().into_iter().find(|e| {
            e.path.contains("/ippools/")
                && e.origin == nodeipam_testenv::fault_proxy::Origin::Landed
        })
    })
    .await;
    assert!(
        !ip_pools_of(&admin, "10.74.0.0/24").await.is_empty(),
        "spare's IPPool is gone while again-on-spare holds a block of it (the late delete: {landed:?})"
    );
    assert_eq!(
        landed.status, 409,
        "the late delete was not refused by its precondition: {landed:?}"
    );
    assert_invariant(&admin, &[]).await;
    finish(b, cp).await;
}
