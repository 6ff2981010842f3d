//! End-to-end tests of what an operator meets on day one, with the `nodeipam` binary run as a
//! child process under the ServiceAccount of `config/rbac`: `/metrics` over HTTPS only for
//! callers the API server authenticates and authorizes; `/healthz` failing when the election
//! or the webhook server stops making progress; the shipped roles granting what they say and
//! no more; `KUBECONFIG` lists and `--context`; the command line's `version`, `completion` and
//! `ranges -o`.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_testenv::{ControlPlane, workspace_root};
use serde_json::json;
use support::process::{
    NAMESPACE, Replica, SA_USER, config_path, free_port, http_get, install_rbac, kubectl,
    kubectl_ok, nodeipam_bin,
};
use support::scrape;
use support::*;

/// A short lease, so that a stalled election is noticed within the tests' wait.
const FAST_LEASE: &[&str] = &[
    "--leader-elect-lease-duration=4s",
    "--leader-elect-renew-deadline=2s",
    "--leader-elect-retry-period=500ms",
];

// ----- helpers -----

/// One HTTPS GET on loopback, with `Authorization: Bearer <token>` when given.
async fn https_get(port: u16, path: &str, token: Option<&str>) -> Result<(u16, String), String> {
    scrape::https_get(&format!("127.0.0.1:{port}"), path, token).await
}

/// Creates a ServiceAccount and returns a token for it (TokenRequest, as `kubectl create
/// token`).
async fn service_account_token(cp: &ControlPlane, ns: &str, name: &str) -> String {
    namespace(&cp.client(), ns).await;
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    Api::<ServiceAccount>::namespaced(cp.client(), ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap_or_else(|e| panic!("step=create-sa: {ns}/{name}: {e}"));
    kubectl_ok(cp, &["-n", ns, "create", "token", name])
        .await
        .trim()
        .to_string()
}

async fn bind_cluster_role(cp: &ControlPlane, binding: &str, role: &str, subject: Subject) {
    let crb = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(binding.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![subject]),
    };
    Api::<ClusterRoleBinding>::all(cp.client())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap_or_else(|e| panic!("step=bind: {binding} -> {role}: {e}"));
}

fn sa_subject(ns: &str, name: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(ns.into()),
        api_group: None,
    }
}

fn user_subject(name: &str) -> Subject {
    Subject {
        kind: "User".into(),
        name: name.into(),
        namespace: None,
        api_group: Some("rbac.authorization.k8s.io".into()),
    }
}

/// `kubectl auth can-i` as `user`: a SubjectAccessReview by the API server.
async fn can_i(cp: &ControlPlane, user: &str, args: &[&str]) -> bool {
    let mut full = vec!["auth", "can-i"];
    full.extend_from_slice(args);
    let as_user = format!("--as={user}");
    full.push(&as_user);
    let (ok, out, err) = kubectl(cp, &full).await;
    match out.trim() {
        "yes" => true,
        "no" => false,
        _ => panic!("step=can-i: kubectl {full:?}: ok={ok} out={out:?} err={err:?}"),
    }
}

// ----- tests -----

/// `/metrics` is HTTPS, refuses a caller without a token (401) and one whose token is valid
/// but who may not get /metrics (403), and serves one bound to nodeipam-metrics-reader. The
/// probes stay plain HTTP on their own port, without the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_only_to_authenticated_and_authorized_callers() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    // -v 4: klog's debug level, which logs each authorized scrape.
    let replica = Replica::start(
        &cp,
        dir.path(),
        "metrics-0",
        &["--leader-elect=false", "-v", "4"],
    )
    .await;

    // The stranger's token comes first: it also creates the namespace.
    let stranger = service_account_token(&cp, "monitoring", "stranger").await;
    let scraper = scrape::metrics_reader_token(&cp.client(), "monitoring", "prometheus").await;

    let port = replica.metrics_port;
    let (status, body) = https_get(port, "/metrics", None)
        .await
        .expect("no token: answered");
    assert_eq!(status, 401, "no token: {body}");
    let (status, body) = https_get(port, "/metrics", Some("not-a-token"))
        .await
        .expect("bad token: answered");
    assert_eq!(status, 401, "a token the API server rejects: {body}");
    let (status, body) = https_get(port, "/metrics", Some(&stranger))
        .await
        .expect("stranger: answered");
    assert_eq!(status, 403, "authenticated, not authorized: {body}");
    assert!(
        body.contains("system:serviceaccount:monitoring:stranger")
            && body.contains("nodeipam-metrics-reader"),
        "the refusal names the caller and the role: {body}"
    );
    // RBAC takes effect within moments of the binding.
    let body = wait_for("the scraper's authorized scrape", || async {
        match https_get(port, "/metrics", Some(&scraper)).await {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    })
    .await;
    assert!(body.contains("nodeipam_leader"), "metrics served: {body}");

    // Plain HTTP on the metrics port gets nothing; the probe port has no metrics.
    assert!(
        !matches!(http_get(port, "/metrics").await, Some((200, _))),
        "metrics over plain HTTP"
    );
    assert_eq!(
        http_get(replica.probe_port, "/metrics").await.map(|r| r.0),
        Some(404)
    );
    assert!(
        http_get(replica.probe_port, "/readyz").await.is_some(),
        "/readyz answers on the probe port"
    );
    // The TokenReview and SubjectAccessReview rights are in config/rbac.
    replica.assert_never_forbidden();
    let log = std::fs::read_to_string(&replica.log).expect("read the replica's log");
    assert!(
        log.contains("metrics scrape authorized")
            && log.contains("system:serviceaccount:monitoring:prometheus"),
        "-v 4 logs at debug level:\n{}",
        replica.log_tail()
    );
    assert!(!log.contains('\u{1b}'), "colour codes in a log file");
    cp.stop().await;
}

/// `--metrics-secure=false` serves plain, unauthenticated metrics (a scrape over a private
/// network, or a sidecar proxy), and `--metrics-bind-address=0` turns metrics off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_be_plain_or_off() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let plain = Replica::start(
        &cp,
        dir.path(),
        "plain-0",
        &[
            "--leader-elect=false",
            "--metrics-secure=false",
            "--disable-webhook",
        ],
    )
    .await;
    let (status, body) = http_get(plain.metrics_port, "/metrics")
        .await
        .expect("plain metrics answered");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("nodeipam_leader"), "{body}");
    drop(plain);
    let off = Replica::start_with_env(
        &cp,
        dir.path(),
        "off-0",
        &[
            "--leader-elect=false",
            "--metrics-bind-address=0",
            "--disable-webhook",
        ],
        // RUST_LOG is honoured when neither --log-level nor -v is given.
        &[("RUST_LOG", "debug")],
    )
    .await;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", off.metrics_port))
            .await
            .is_err(),
        "nothing listens on the metrics port"
    );
    let log = wait_for("a debug line under RUST_LOG", || async {
        let log = std::fs::read_to_string(&off.log).ok()?;
        log.contains("DEBUG").then_some(log)
    })
    .await;
    assert!(!log.contains('\u{1b}'), "colour codes in a log file");
    cp.stop().await;
}

/// A leader whose election loop hangs keeps reporting leadership while its lease runs out:
/// /healthz must fail so that the kubelet restarts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_fails_when_the_election_stops_making_progress() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let mut args = vec!["--inject-fault=stall-election", "--disable-webhook"];
    args.extend_from_slice(FAST_LEASE);
    let replica = Replica::start(&cp, dir.path(), "stall-election-0", &args).await;
    let why = replica.wait_unhealthy().await;
    assert!(why.contains("leader election"), "/healthz said: {why}");
    cp.stop().await;
}

/// A webhook server that accepts nothing (its task alive, its port bound) fails /healthz.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_fails_when_the_webhook_server_stops_answering() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let replica = Replica::start(
        &cp,
        dir.path(),
        "stall-webhook-0",
        &["--inject-fault=stall-webhook", "--leader-elect=false"],
    )
    .await;
    let why = replica.wait_unhealthy().await;
    assert!(why.contains("webhook server"), "/healthz said: {why}");
    cp.stop().await;
}

/// A healthy replica stays healthy: the webhook self-check and the election both progress.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_working_replica_stays_live() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let mut args = vec![];
    args.extend_from_slice(FAST_LEASE);
    let replica = Replica::start(&cp, dir.path(), "live-0", &args).await;
    // Past the election's stall limit (2 x 4 s + 10 s) and the webhook's (30 s), counted by
    // the lease's renewals rather than by the clock: eighteen renewals, 2 s apart.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cp.client(), NAMESPACE);
    let mut renewals = std::collections::BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while renewals.len() < 18 {
        assert!(
            Instant::now() < deadline,
            "step=renewals: only {} lease renewals seen",
            renewals.len()
        );
        if let Ok(Some(lease)) = leases.get_opt("nodeipam-controller").await
            && let Some(renewed) = lease.spec.and_then(|s| s.renew_time)
        {
            renewals.insert(renewed.0.to_string());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let answer = http_get(replica.probe_port, "/healthz").await;
    assert_eq!(answer.as_ref().map(|a| a.0), Some(200), "{answer:?}");
    replica.assert_never_forbidden();
    cp.stop().await;
}

/// The shipped roles grant what they say and no more, as the API server judges them
/// (SubjectAccessReviews through `kubectl auth can-i --as`), and a consumer really adds and
/// removes its own finalizer as its ServiceAccount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipped_roles_grant_what_they_say_and_no_more() {
    let cp = control_plane().await;
    install_rbac(&cp).await;
    kubectl_ok(&cp, &["apply", "-k", &config_path("ip-masq-agent")]).await;

    // The controller: the reviews behind secure metrics; no ConfigMap create in kube-system
    // (the ip-masq-agent overlay grants get/list/watch/patch on that one ConfigMap).
    let ctl = SA_USER;
    assert!(can_i(&cp, ctl, &["create", "tokenreviews.authentication.k8s.io"]).await);
    assert!(
        can_i(
            &cp,
            ctl,
            &["create", "subjectaccessreviews.authorization.k8s.io"]
        )
        .await
    );
    assert!(!can_i(&cp, ctl, &["create", "configmaps", "-n", "kube-system"]).await);
    assert!(
        can_i(
            &cp,
            ctl,
            &["patch", "configmaps/ip-masq-agent", "-n", "kube-system"]
        )
        .await
    );
    assert!(
        !can_i(
            &cp,
            ctl,
            &["patch", "configmaps/other", "-n", "kube-system"]
        )
        .await
    );
    assert!(
        !can_i(
            &cp,
            ctl,
            &["update", "configmaps/nodeipam-pod-network", "-n", NAMESPACE]
        )
        .await
    );
    assert!(!can_i(&cp, ctl, &["get", "/metrics"]).await);

    // NodeIPAMPools: the controller reads them and writes their status; it carves children
    // (create) and retires them (delete), and changes no pool, no pool's spec, and no config
    // by update.
    for verb in ["get", "list", "watch"] {
        assert!(can_i(&cp, ctl, &[verb, "nodeipampools"]).await, "{verb}");
    }
    for verb in ["create", "update", "patch", "delete", "deletecollection"] {
        assert!(!can_i(&cp, ctl, &[verb, "nodeipampools"]).await, "{verb}");
    }
    assert!(
        can_i(
            &cp,
            ctl,
            &["patch", "nodeipampools", "--subresource=status"]
        )
        .await
    );
    assert!(
        !can_i(
            &cp,
            ctl,
            &["update", "nodeipampools", "--subresource=status"]
        )
        .await
    );
    assert!(
        !can_i(
            &cp,
            ctl,
            &["update", "nodeipampools", "--subresource=finalizers"]
        )
        .await
    );
    for verb in ["create", "delete", "patch", "get", "list", "watch"] {
        assert!(can_i(&cp, ctl, &[verb, "nodeipamconfigs"]).await, "{verb}");
    }
    for verb in ["update", "deletecollection"] {
        assert!(!can_i(&cp, ctl, &[verb, "nodeipamconfigs"]).await, "{verb}");
    }
    assert!(!can_i(&cp, ctl, &["delete", "nodes"]).await);

    // A scraper bound to the metrics reader role may get /metrics, nothing else.
    bind_cluster_role(
        &cp,
        "scraper-metrics",
        "nodeipam-metrics-reader",
        user_subject("scraper"),
    )
    .await;
    assert!(can_i(&cp, "scraper", &["get", "/metrics"]).await);
    assert!(!can_i(&cp, "scraper", &["get", "/debug/pprof/"]).await);
    assert!(!can_i(&cp, "scraper", &["list", "nodeipamconfigs"]).await);
    assert!(!can_i(&cp, "scraper", &["list", "nodeipampools"]).await);

    // Viewer and editor roles (what view/edit aggregate): read; write but not status.
    bind_cluster_role(
        &cp,
        "alice-view",
        "nodeipam-nodeipamconfig-viewer",
        user_subject("alice"),
    )
    .await;
    bind_cluster_role(
        &cp,
        "bob-edit",
        "nodeipam-nodeipamconfig-editor",
        user_subject("bob"),
    )
    .await;
    assert!(can_i(&cp, "alice", &["list", "nodeipamconfigs"]).await);
    assert!(can_i(&cp, "alice", &["watch", "nodeipamconfigs"]).await);
    assert!(!can_i(&cp, "alice", &["create", "nodeipamconfigs"]).await);
    assert!(!can_i(&cp, "alice", &["patch", "nodeipamconfigs"]).await);
    assert!(can_i(&cp, "bob", &["create", "nodeipamconfigs"]).await);
    assert!(can_i(&cp, "bob", &["delete", "nodeipamconfigs"]).await);
    assert!(
        !can_i(
            &cp,
            "bob",
            &["patch", "nodeipamconfigs", "--subresource=status"]
        )
        .await
    );
    // The same for pools, which the same two roles cover.
    assert!(can_i(&cp, "alice", &["list", "nodeipampools"]).await);
    assert!(
        can_i(
            &cp,
            "alice",
            &["get", "nodeipampools", "--subresource=status"]
        )
        .await
    );
    assert!(!can_i(&cp, "alice", &["create", "nodeipampools"]).await);
    assert!(can_i(&cp, "bob", &["create", "nodeipampools"]).await);
    assert!(can_i(&cp, "bob", &["update", "nodeipampools"]).await);
    assert!(can_i(&cp, "bob", &["delete", "nodeipampools"]).await);
    assert!(
        !can_i(
            &cp,
            "bob",
            &["patch", "nodeipampools", "--subresource=status"]
        )
        .await
    );
    // The built-in view and edit roles pick them up through kube-controller-manager's
    // clusterrole-aggregation controller (the only controller run here).
    let kcm_log = std::fs::File::create(cp.log_dir().join("kcm-aggregation.log"))
        .expect("step=kcm: log file");
    let kcm_err = kcm_log.try_clone().expect("step=kcm: log handle");
    let _kcm = tokio::process::Command::new(cp.assets_dir().join("kube-controller-manager"))
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .args([
            "--controllers=clusterrole-aggregation",
            "--leader-elect=false",
            "--secure-port=0",
        ])
        .stdin(Stdio::null())
        .stdout(kcm_log)
        .stderr(kcm_err)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("step=kcm: start kube-controller-manager: {e}"));
    bind_cluster_role(&cp, "carol-view", "view", user_subject("carol")).await;
    bind_cluster_role(&cp, "dave-edit", "edit", user_subject("dave")).await;
    wait_for(
        "view to aggregate nodeipam-nodeipamconfig-viewer",
        || async {
            can_i(&cp, "carol", &["list", "nodeipamconfigs"])
                .await
                .then_some(())
        },
    )
    .await;
    wait_for(
        "edit to aggregate nodeipam-nodeipamconfig-editor",
        || async {
            can_i(&cp, "dave", &["create", "nodeipamconfigs"])
                .await
                .then_some(())
        },
    )
    .await;
    assert!(!can_i(&cp, "carol", &["create", "nodeipamconfigs"]).await);
    assert!(can_i(&cp, "carol", &["watch", "nodeipampools"]).await);
    assert!(!can_i(&cp, "carol", &["create", "nodeipampools"]).await);
    assert!(can_i(&cp, "dave", &["create", "nodeipampools"]).await);
    let rendered = kubectl_ok(&cp, &["kustomize", &config_path("rbac")]).await;
    for (role, label) in [
        (
            "nodeipam-nodeipamconfig-viewer",
            "rbac.authorization.k8s.io/aggregate-to-view",
        ),
        (
            "nodeipam-nodeipamconfig-editor",
            "rbac.authorization.k8s.io/aggregate-to-edit",
        ),
    ] {
        let labels = kubectl_ok(
            &cp,
            &[
                "get",
                "clusterrole",
                role,
                "-o",
                "jsonpath={.metadata.labels}",
            ],
        )
        .await;
        assert!(labels.contains(label), "{role} lacks {label}: {labels}");
        assert!(rendered.contains(role));
    }

    // A consumer: reads the published pod network and nothing else there; adds and removes
    // its own finalizer, acting as its ServiceAccount.
    let consumer_ns = "cni-system";
    namespace(&cp.client(), consumer_ns).await;
    let consumer = format!("system:serviceaccount:{consumer_ns}:cni");
    bind_cluster_role(
        &cp,
        "cni-consumer",
        "nodeipam-pod-network-consumer",
        sa_subject(consumer_ns, "cni"),
    )
    .await;
    kubectl_ok(
        &cp,
        &[
            "-n",
            NAMESPACE,
            "create",
            "rolebinding",
            "cni-pod-network",
            "--role=nodeipam-pod-network-reader",
            &format!("--serviceaccount={consumer_ns}:cni"),
        ],
    )
    .await;
    assert!(
        can_i(
            &cp,
            &consumer,
            &["get", "configmaps/nodeipam-pod-network", "-n", NAMESPACE]
        )
        .await
    );
    assert!(
        !can_i(
            &cp,
            &consumer,
            &["get", "configmaps/other", "-n", NAMESPACE]
        )
        .await
    );
    assert!(!can_i(&cp, &consumer, &["get", "secrets", "-n", NAMESPACE]).await);
    assert!(!can_i(&cp, &consumer, &["create", "nodeipamconfigs"]).await);
    assert!(!can_i(&cp, &consumer, &["delete", "nodeipamconfigs"]).await);
    assert!(can_i(&cp, &consumer, &["watch", "nodeipamconfigs"]).await);

    let admin = cp.client();
    create_config(
        &admin,
        "consumed",
        spec(family("10.70.0.0/16", 24), None, None),
    )
    .await;
    let as_consumer = cp
        .impersonating(
            &consumer,
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{consumer_ns}"),
                "system:authenticated",
            ],
        )
        .unwrap_or_else(|e| panic!("step=impersonate: {e}"));
    let configs: Api<NodeIPAMConfig> = Api::all(as_consumer);
    let cfg = configs
        .get("consumed")
        .await
        .expect("the consumer reads configs");
    let mut finalizers = cfg.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push("cni.example.com/reconfigured".into());
    let add = json!({"metadata": {"finalizers": finalizers, "resourceVersion": cfg.metadata.resource_version}});
    configs
        .patch("consumed", &PatchParams::default(), &Patch::Merge(&add))
        .await
        .expect("the consumer adds its finalizer");
    let cfg = configs.get("consumed").await.expect("read back");
    let kept: Vec<String> = cfg
        .metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != "cni.example.com/reconfigured")
        .collect();
    let remove =
        json!({"metadata": {"finalizers": kept, "resourceVersion": cfg.metadata.resource_version}});
    configs
        .patch("consumed", &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .expect("the consumer removes its finalizer");
    let cms: Api<ConfigMap> = Api::namespaced(
        cp.impersonating(&consumer, &["system:authenticated"])
            .expect("impersonate"),
        NAMESPACE,
    );
    match cms.get_opt("nodeipam-pod-network").await {
        Ok(_) => {}
        Err(e) => panic!("the consumer may read the pod-network ConfigMap: {e}"),
    }
    cp.stop().await;
}

/// The ip-masq-agent overlay is enough to keep an existing kube-system/ip-masq-agent in
/// sync, without create on ConfigMaps in kube-system.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_masq_agent_overlay_syncs_an_existing_configmap() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    kubectl_ok(&cp, &["apply", "-k", &config_path("ip-masq-agent")]).await;
    kubectl_ok(
        &cp,
        &["-n", "kube-system", "create", "configmap", "ip-masq-agent"],
    )
    .await;
    let replica = Replica::start(
        &cp,
        dir.path(),
        "masq-0",
        &[
            "--leader-elect=false",
            "--disable-webhook",
            "--ip-masq-agent-configmap=kube-system/ip-masq-agent",
        ],
    )
    .await;
    let admin = cp.client();
    create_ready_config(&admin, "masq", spec(family("10.71.0.0/16", 24), None, None)).await;
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "kube-system");
    wait_for("ip-masq-agent to list 10.71.0.0/16", || async {
        let cm = cms.get_opt("ip-masq-agent").await.ok()??;
        cm.data?
            .get("config")?
            .contains("10.71.0.0/16")
            .then_some(())
    })
    .await;
    replica.assert_never_forbidden();
    cp.stop().await;
}

/// `KUBECONFIG=a:b` is merged as kubectl merges it, and `--context` picks a context from any
/// of the files; `--kubeconfig` reads exactly one file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_lists_and_contexts() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let admin_path = cp.kubeconfig_path().to_path_buf();
    let admin: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(&admin_path).expect("read the admin kubeconfig"),
    )
    .expect("admin kubeconfig parses");
    let admin_context = admin["current-context"]
        .as_str()
        .expect("current-context")
        .to_string();
    // First in the list, so its current-context wins: a server nobody listens on.
    let elsewhere = dir.path().join("elsewhere.yaml");
    std::fs::write(
        &elsewhere,
        serde_saphyr::to_string(&json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "elsewhere", "cluster": {"server": format!("https://127.0.0.1:{}", free_port())}}],
            "users": [{"name": "nobody", "user": {}}],
            "contexts": [{"name": "elsewhere", "context": {"cluster": "elsewhere", "user": "nobody"}}],
            "current-context": "elsewhere",
        }))
        .expect("yaml"),
    )
    .expect("write elsewhere.yaml");
    let list = format!("{}:{}", elsewhere.display(), admin_path.display());
    let ranges = |envs: Vec<(&'static str, String)>, args: Vec<String>| async move {
        let out = tokio::process::Command::new(nodeipam_bin())
            .env_clear()
            .envs(envs)
            .arg("ranges")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run nodeipam ranges");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = ranges(vec![("KUBECONFIG", list.clone())], vec![]).await;
    assert!(!ok, "the first file's current-context points nowhere");
    assert!(err.contains("cannot reach"), "{err}");
    let (ok, out, err) = ranges(
        vec![("KUBECONFIG", list.clone())],
        vec![format!("--context={admin_context}")],
    )
    .await;
    assert!(ok, "--context from the second file of KUBECONFIG: {err}");
    assert!(out.starts_with("CIDR"), "{out}");
    let (ok, _, err) = ranges(vec![("KUBECONFIG", list)], vec!["--context=missing".into()]).await;
    assert!(
        !ok && err.contains("missing"),
        "an unknown context is named: {err}"
    );
    let (ok, _, err) = ranges(
        vec![("KUBECONFIG", elsewhere.display().to_string())],
        vec![format!("--kubeconfig={}", admin_path.display())],
    )
    .await;
    assert!(ok, "--kubeconfig wins over KUBECONFIG: {err}");
    cp.stop().await;
}

/// `ranges -o` takes kubectl's output names, against a real cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_outputs_like_kubectl() {
    let cp = control_plane().await;
    let admin = cp.client();
    create_config(&admin, "out", spec(family("10.72.0.0/16", 24), None, None)).await;
    let kubeconfig = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    let run = |output: &'static str| {
        let kubeconfig = kubeconfig.clone();
        async move {
            let out = tokio::process::Command::new(nodeipam_bin())
                .env_clear()
                .args(["ranges", &kubeconfig, "-o", output])
                .output()
                .await
                .expect("run nodeipam ranges");
            assert!(
                out.status.success(),
                "ranges -o {output}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    assert_eq!(run("name").await, "10.72.0.0/16\n");
    let yaml: serde_json::Value = serde_saphyr::from_str(&run("yaml").await).expect("yaml");
    assert_eq!(yaml["entries"][0]["config"], "out");
    let json: serde_json::Value = serde_json::from_str(&run("json").await).expect("json");
    assert_eq!(json["entries"][0]["cidr"], "10.72.0.0/16");
    assert!(
        run("wide")
            .await
            .lines()
            .next()
            .is_some_and(|h| h.contains("USAGE"))
    );
    let out = tokio::process::Command::new(nodeipam_bin())
        .env_clear()
        .args(["ranges", &kubeconfig, "-o", "xml"])
        .output()
        .await
        .expect("run nodeipam ranges");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--output"), "{err}");
    cp.stop().await;
}

/// `version` names the commit and the build date; `completion` prints a script per shell;
/// a bad flag value is refused naming the flag and the reason; logs written to a file carry
/// no colour codes, and `-v`/`RUST_LOG` change what is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_line_basics() {
    let run = |args: Vec<&'static str>, envs: Vec<(&'static str, &'static str)>| async move {
        let out = tokio::process::Command::new(nodeipam_bin())
            .env_clear()
            .envs(envs)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run nodeipam");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, _) = run(vec!["version"], vec![]).await;
    assert!(ok);
    let commit = out
        .lines()
        .find_map(|l| l.strip_prefix("git commit: "))
        .unwrap_or_else(|| panic!("no commit line: {out}"));
    assert!(
        commit == "unknown"
            || (commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{commit}"
    );
    assert!(out.contains("build date: 20"), "{out}");
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef nodeipam"),
        ("fish", "complete -c nodeipam"),
    ] {
        let (ok, out, err) = run(vec!["completion", shell], vec![]).await;
        assert!(
            ok && out.contains(marker),
            "completion {shell}: {err}\n{out}"
        );
    }
    let (ok, _, err) = run(vec!["run", "--leader-elect-lease-duration=15"], vec![]).await;
    assert!(
        !ok && err.contains("--leader-elect-lease-duration") && err.contains("unit"),
        "{err}"
    );
    let (ok, _, err) = run(vec!["run", "--kube-api-qps=fast"], vec![]).await;
    assert!(!ok && err.contains("--kube-api-qps"), "{err}");
    let (ok, _, err) = run(
        vec![
            "run",
            "--metrics-bind-address=127.0.0.1:7",
            "--health-probe-bind-address=127.0.0.1:7",
        ],
        vec![],
    )
    .await;
    assert!(
        !ok && err.contains("--metrics-bind-address")
            && err.contains("--health-probe-bind-address"),
        "HTTPS metrics and plain probes cannot share an address: {err}"
    );

    // Logging to a pipe: no escape codes; a bad filter is named by its source. A kubeconfig
    // that does not exist ends the run right after logging starts.
    let missing = vec![
        "run",
        "--kubeconfig=/nonexistent/kubeconfig",
        "--leader-elect=false",
    ];
    let (ok, out, err) = run(missing.clone(), vec![]).await;
    assert!(!ok && err.contains("/nonexistent/kubeconfig"), "{err}");
    assert!(
        !out.contains('\u{1b}') && !err.contains('\u{1b}'),
        "colour codes in a pipe: {out:?}"
    );
    let (_, out, err) = run(missing.clone(), vec![("RUST_LOG", "x=notalevel")]).await;
    assert!(
        err.contains("RUST_LOG="),
        "a bad RUST_LOG is named: {err}{out}"
    );
    let (_, _, err) = run(
        vec![
            "run",
            "--log-level=x=notalevel",
            "--kubeconfig=/nonexistent/kubeconfig",
        ],
        vec![],
    )
    .await;
    assert!(
        err.contains("--log-level="),
        "a bad --log-level is named: {err}"
    );
}

/// `--kube-api-qps`/`--kube-api-burst` limit every request of the client, reads included (as
/// kube-controller-manager's): `ranges` lists configs, then nodes. With a burst of two and a
/// token every 1000 s it finishes; with a burst of one its second list waits for a token, so
/// it is still waiting when the other, started together, is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_api_qps_limits_every_request() {
    let cp = control_plane().await;
    let kubeconfig = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    let spawn = |burst: &'static str| {
        tokio::process::Command::new(nodeipam_bin())
            .env_clear()
            .args(["ranges", &kubeconfig, "--kube-api-qps=0.001"])
            .arg(format!("--kube-api-burst={burst}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn nodeipam ranges")
    };
    let mut one = spawn("1");
    let two = spawn("2");
    let out = two
        .wait_with_output()
        .await
        .expect("ranges with a burst of two");
    assert!(
        out.status.success(),
        "two requests fit a burst of two: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        one.try_wait().expect("poll the other ranges"),
        None,
        "a burst of one let the second request through"
    );
    one.kill().await.expect("stop the waiting ranges");
    cp.stop().await;
}

/// A podCIDR write that waits for its token in the client's rate limiter has not been sent,
/// so it is never called ambiguous however long it waits: its timeout (4.5 s here) starts
/// when it goes. With 2 requests a second and 24 nodes at once, the last writes wait about
/// 10 s for their turn; before, each past the timeout was "no answer within 4.5s", counted
/// as an error, re-read and written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waiting_for_its_token_is_never_ambiguous() {
    const NODES: usize = 24;
    let cp = control_plane().await;
    let client = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let kubeconfig = support::process::sa_kubeconfig(&cp, dir.path(), "slow-0");
    let replica = Replica::start_plain(
        dir.path(),
        &kubeconfig,
        "slow-0",
        &[
            "--leader-elect=false",
            "--kube-api-qps=2",
            "--kube-api-burst=1",
            "--write-concurrency=32",
        ],
    )
    .await;
    create_ready_config(
        &client,
        "slow",
        spec(family("10.124.0.0/16", 24), None, None),
    )
    .await;
    let names: Vec<String> = (0..NODES).map(|i| format!("queued-{i:02}")).collect();
    for name in &names {
        create_node(&client, name, &[]).await;
    }
    let mut blocks = Vec::new();
    for name in &names {
        blocks.extend(wait_cidrs(&client, name).await);
    }
    blocks.sort();
    blocks.dedup();
    assert_eq!(blocks.len(), NODES, "one block each: {blocks:?}");
    let log = replica.log_text();
    assert!(
        !log.contains("Ambiguous") && !log.contains("no answer within"),
        "a write that only waited for its token was called in doubt:\n{}",
        replica.log_tail()
    );
    assert_eq!(
        replica
            .gauge("nodeipam_reconcile_errors_total", &[("kind", "node_write")])
            .await,
        None,
        "no podCIDR write failed"
    );
    assert_invariant(&client, &[]).await;
    drop(replica);
    cp.stop().await;
}

/// The peak resident memory (VmHWM) of process `pid`, in MiB.
fn peak_rss_mib(pid: rustix::process::Pid) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.as_raw_nonzero()))
        .expect("read /proc/<pid>/status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kib / 1024.0
}

/// One hostile POST to the webhook at `port`: `declared` bytes announced, `sent` of them sent
/// (a body of `[0,0,…` when `json`, else zeros), then the connection held for `hold`.
async fn hostile_review(port: u16, declared: usize, sent: usize, json: bool, hold: Duration) {
    use tokio::io::AsyncWriteExt;
    let Ok(mut tls) = scrape::tls_connect(&format!("127.0.0.1:{port}")).await else {
        return;
    };
    let head = format!(
        "POST /validate-nodeipamconfig HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    );
    if tls.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let chunk: Vec<u8> = if json {
        std::iter::once(b'[')
            .chain(b"0,".iter().copied().cycle().take(64 * 1024 - 1))
            .collect()
    } else {
        vec![0; 64 * 1024]
    };
    let mut left = sent;
    while left > 0 {
        let n = left.min(chunk.len());
        if tls.write_all(&chunk[..n]).await.is_err() {
            return;
        }
        left -= n;
    }
    tokio::time::sleep(hold).await;
}

/// A flood of hostile reviews from anyone who can reach the webhook's port (it serves every
/// replica, the leader's included) costs bounded memory and never stops allocation: 96
/// connections announcing 8 MiB bodies and sending all but the last byte (refused unread:
/// over the 1 MiB limit), 96 sending 1 MiB minus a byte and holding (read 8 at a time, each
/// answered 408 after 5 s), and 32 complete 1 MiB bodies of `[0,0,…` (parsed one at a time).
/// Before the limits, the first wave alone took the process from 25 to about 800 MiB. Peak
/// RSS stays under 128 MiB, nodes created during the flood get their podCIDRs, and the API
/// server's own reviews are answered after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_hostile_reviews_costs_bounded_memory_and_never_stops_allocation() {
    const MIB: usize = 1024 * 1024;
    let cp = control_plane().await;
    let client = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let kubeconfig = support::process::sa_kubeconfig(&cp, dir.path(), "flooded-0");
    let replica = Replica::start_plain(
        dir.path(),
        &kubeconfig,
        "flooded-0",
        &["--leader-elect=false"],
    )
    .await;
    support::process::register_webhook_by_url(&client, replica.webhook_port).await;
    create_ready_config(
        &client,
        "flooded",
        spec(family("10.124.0.0/16", 24), None, None),
    )
    .await;
    let pid = replica.pid().expect("the replica's pid");
    let before = peak_rss_mib(pid);
    let port = replica.webhook_port;
    let hold = Duration::from_secs(8);
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..96 {
        flood.spawn(hostile_review(port, 8 * MIB, 8 * MIB - 1, false, hold));
        flood.spawn(hostile_review(port, MIB, MIB - 1, false, hold));
    }
    for _ in 0..32 {
        flood.spawn(hostile_review(port, MIB, MIB, true, hold));
    }
    // Allocation goes on meanwhile.
    for i in 0..8 {
        create_node(&client, &format!("during-{i}"), &[]).await;
    }
    for i in 0..8 {
        wait_cidrs(&client, &format!("during-{i}")).await;
    }
    while flood.join_next().await.is_some() {}
    let peak = peak_rss_mib(pid);
    assert!(
        peak < 128.0,
        "peak RSS {peak:.0} MiB (from {before:.0} MiB before the flood) under hostile reviews"
    );
    // The API server's reviews are answered again: a config over the Service range is refused
    // by the webhook.
    wait_webhook_answers(
        &client,
        "the webhook to answer the API server after the flood",
    )
    .await;
    eprintln!("peak RSS under the flood: {peak:.1} MiB (before: {before:.1} MiB)");
    assert_invariant(&client, &[]).await;
    drop(replica);
    cp.stop().await;
}

/// `hack/control-plane.sh build` needs no Go when the binaries of the current inputs are
/// cached, and says so when they are not (run against a scratch folder, never the real
/// cache).
#[tokio::test]
async fn control_plane_script_needs_no_go_with_cached_binaries() {
    let script = workspace_root().join("hack/control-plane.sh");
    let assets = tempfile::tempdir().expect("temp dir");
    for b in [
        "kube-apiserver",
        "kube-controller-manager",
        "kubectl",
        "etcd",
    ] {
        let path = assets.path().join(b);
        std::fs::write(&path, "#!/bin/sh\n").expect("fake binary");
        let mut perms = std::fs::metadata(&path).expect("stat").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).expect("chmod");
    }
    // PATH without any folder that holds a `go`.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let no_go =
        std::env::join_paths(std::env::split_paths(&path).filter(|d| !d.join("go").exists()))
            .expect("PATH");
    let run = |arg: &'static str| {
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg(arg)
            .env("PATH", &no_go)
            .env("NODEIPAM_ASSETS", assets.path())
            .output()
            .unwrap_or_else(|e| panic!("step=control-plane-script: {e}"));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, inputs, err) = run("inputs");
    assert!(ok && inputs.len() == 16, "inputs: {inputs:?} {err}");
    let (ok, _, err) = run("build");
    assert!(
        !ok && err.contains("'go' is not installed"),
        "no stamp: {err}"
    );
    std::fs::write(assets.path().join(".stamp"), format!("{inputs} go1.0\n")).expect("stamp");
    let (ok, _, err) = run("build");
    assert!(
        ok && err.contains("Go not installed, not needed"),
        "cached: {err}"
    );
    std::fs::write(assets.path().join(".stamp"), "0000000000000000 go1.0\n").expect("stamp");
    let (ok, _, err) = run("build");
    assert!(
        !ok && err.contains("no binaries built from these inputs"),
        "stale: {err}"
    );
}

/// `--metrics-cert-dir` serves the mounted certificate instead of a generated one, and a
/// replaced certificate (cert-manager renewing it) is served without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_serve_a_mounted_certificate_and_its_renewal() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let certs = dir.path().join("metrics-certs");
    std::fs::create_dir_all(&certs).expect("cert dir");
    let write_pair = || {
        let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
            .expect("generate a certificate");
        // The key first: a poll between the two writes sees a mismatched pair and keeps the
        // old one.
        std::fs::write(certs.join("tls.key"), pair.signing_key.serialize_pem()).expect("key");
        std::fs::write(certs.join("tls.crt"), pair.cert.pem()).expect("cert");
        pair.cert.der().to_vec()
    };
    let first = write_pair();
    let cert_dir = format!("--metrics-cert-dir={}", certs.display());
    let replica = Replica::start(
        &cp,
        dir.path(),
        "certs-0",
        &["--leader-elect=false", "--disable-webhook", &cert_dir],
    )
    .await;
    let addr = format!("127.0.0.1:{}", replica.metrics_port);
    assert_eq!(
        scrape::served_leaf(&addr).await.expect("served"),
        first,
        "the mounted certificate is served"
    );
    let second = write_pair();
    wait_for("the renewed certificate to be served", || async {
        (scrape::served_leaf(&addr).await.ok()? == second).then_some(())
    })
    .await;
    cp.stop().await;
}

/// config/manager runs with the binary's default ports (so `--help` tells the truth about a
/// deployment), probes where the kubelet of a host-network pod reaches them, and the
/// tolerations of a controller that runs before the pod network exists.
#[test]
fn the_manifest_uses_the_default_ports_and_tolerations() {
    use clap::Parser;
    use nodeipam_controller::cli::{Cli, Command};
    let text = std::fs::read_to_string(config_path("manager/manager.yaml"))
        .expect("read config/manager/manager.yaml");
    let deploy: serde_json::Value = serde_saphyr::from_str(&text).expect("manager.yaml parses");
    let pod = &deploy["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<String> = serde_json::from_value(container["args"].clone()).expect("args");
    let Command::Run(manifest) =
        Cli::try_parse_from(std::iter::once("nodeipam".to_string()).chain(args.clone()))
            .expect("the manifest's args parse")
            .command
    else {
        panic!("the manifest does not run `nodeipam run`: {args:?}")
    };
    let Command::Run(defaults) = Cli::try_parse_from(["nodeipam", "run"])
        .expect("defaults")
        .command
    else {
        panic!("run expected")
    };
    let port = |a: Option<std::net::SocketAddr>| a.map(|a| a.port());
    let (m_metrics, m_probes, m_secure) = manifest.listeners();
    let (d_metrics, d_probes, d_secure) = defaults.listeners();
    assert_eq!(port(m_metrics), port(d_metrics), "metrics port");
    assert_eq!(port(m_probes), port(d_probes), "probe port");
    assert_eq!(
        manifest.webhook_addr.port(),
        defaults.webhook_addr.port(),
        "webhook port"
    );
    assert!(m_secure && d_secure, "metrics are HTTPS in both");
    assert_eq!(
        m_probes.map(|a| a.ip().to_string()).as_deref(),
        Some("127.0.0.1"),
        "probes on loopback only"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["host"], "127.0.0.1", "{probe}");
    }
    let tolerated: Vec<&str> = pod["tolerations"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["key"].as_str()).collect())
        .unwrap_or_default();
    for key in [
        "node-role.kubernetes.io/control-plane",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/network-unavailable",
    ] {
        assert!(
            tolerated.contains(&key),
            "{key} not tolerated: {tolerated:?}"
        );
    }
}
