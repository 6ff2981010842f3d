//! End-to-end tests of nodeipam as it is deployed: the `config/` manifests against the real
//! API server's schema, and the `nodeipam` binary run as child processes with exactly the
//! ServiceAccount identity of `config/rbac`. Every feature works with those rights and nothing
//! more is allowed; a leader SIGKILLed during a burst of node creations is replaced with no
//! duplicate podCIDRs; the metrics match the cluster; SIGTERM releases the lease; a Lease
//! deleted, locked twice or displaced under a leader never lets two replicas allocate at once.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodeipam_controller::reconcile::handover::{HANDOVER_ANNOTATION, SETTLED};
use nodeipam_crd::{FINALIZER, NodeIPAMConfig};
use nodeipam_testenv::ControlPlane;
use rustix::process::Signal;
use serde_json::{Value, json};
use support::process::{
    NAMESPACE, Replica, SA_GROUPS, SA_USER, config_path, free_port, install_rbac, kubectl_ok,
    metric, nodeipam_bin, register_webhook_by_url, sa_kubeconfig,
};
use support::*;

const LEASE: &str = "nodeipam-controller";
const SECRET: &str = "nodeipam-webhook-tls";
const VWC: &str = "nodeipam-webhook";
/// flannel's ConfigMap and the namespace of kube-flannel.yml (flannel 0.20 and later).
const FLANNEL_CONFIGMAP: &str = "kube-flannel-cfg";
const FLANNEL_NAMESPACE: &str = "kube-flannel";
/// A short lease so that a killed leader is replaced within seconds.
const FAST_LEASE: &[&str] = &["--lease-duration=4", "--lease-grace=2"];

// ----- helpers -----

/// The objects of a multi-document YAML stream.
fn yaml_docs(text: &str) -> Vec<Value> {
    nodeipam_testenv::yaml::documents(text).expect("YAML documents")
}

fn find_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the rendered manifests"))
}

/// The controller's Lease, if it exists.
async fn lease(client: &Client) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get_opt(LEASE)
        .await
        .expect("get lease")
}

/// The replica the Lease names: its holder identity without the random suffix.
async fn lease_holder(client: &Client) -> Option<String> {
    lease(client)
        .await
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .map(|h| nodeipam_controller::app::holder_name(&h).to_string())
}

/// The hand-over mark a leader that stopped cleanly leaves on the Lease.
async fn lease_handover(client: &Client) -> Option<String> {
    lease(client)
        .await
        .and_then(|l| l.annotations().get(HANDOVER_ANNOTATION).cloned())
}

/// A replica's count of take-overs by kind (clean or unclean); 0 when it has none.
async fn takeovers(replica: &Replica, handover: &str) -> f64 {
    replica
        .gauge("nodeipam_leader_takeovers_total", &[("handover", handover)])
        .await
        .unwrap_or(0.0)
}

async fn wait_holder(client: &Client, want: &str) {
    wait_for(&format!("lease holder {want}"), || async {
        (lease_holder(client).await.as_deref() == Some(want)).then_some(())
    })
    .await;
}

fn dual_stack(v4: &str, v6: &str) -> nodeipam_crd::NodeIPAMConfigSpec {
    spec(family(v4, 24), family(v6, 64), None)
}

/// Creates `names` nodes, at most `parallel` requests at a time, calling `midway` once half
/// of them have been sent.
async fn create_nodes(
    client: &Client,
    names: Vec<String>,
    parallel: usize,
    midway: impl FnOnce(usize),
) -> usize {
    let total = names.len();
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
    let created = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut midway = Some(midway);
    for (i, name) in names.into_iter().enumerate() {
        if i == total / 2
            && let Some(f) = midway.take()
        {
            f(created.load(Ordering::SeqCst));
        }
        let permit = gate.clone().acquire_owned().await.expect("semaphore");
        let (client, created) = (client.clone(), created.clone());
        tasks.spawn(async move {
            create_node(&client, &name, &[]).await;
            created.fetch_add(1, Ordering::SeqCst);
            drop(permit);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("node creation task");
    }
    created.load(Ordering::SeqCst)
}

/// Waits until every node has `families` podCIDRs; returns how many nodes there are.
async fn wait_all_allocated(client: &Client, families: usize) -> usize {
    wait_all_allocated_for(client, families, WAIT).await
}

/// [`wait_all_allocated`] for up to `limit`, listing every half second (the lists are large).
async fn wait_all_allocated_for(client: &Client, families: usize, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let listed = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await;
        if let Ok(nodes) = listed
            && nodes.items.iter().all(|n| pod_cidrs(n).len() == families)
        {
            return nodes.items.len();
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for every node to have its podCIDRs"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn allocated_count(client: &Client) -> usize {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .filter(|n| !pod_cidrs(n).is_empty())
        .count()
}

fn forbidden<T: std::fmt::Debug>(what: &str, result: Result<T, kube::Error>) {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden for the controller, got {other:?}"),
    }
}

// ----- tests -----

/// The manifests are valid for the real API server (strict field validation, the CRD
/// installs, samples pass the CRD's schema and CEL rules), their flags parse in the real
/// binary, and the registered webhook fails closed while no replica answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_apply_to_the_real_api_server() {
    // No CRD installed: config/default must bring its own.
    let cp = ControlPlane::builder()
        .install_crds(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("the control plane did not start: {e}"));
    let client = cp.client();

    // A server-side dry run of everything: admission and schema, nothing persisted. The
    // namespace must exist for the namespaced objects to pass admission in a dry run.
    kubectl_ok(
        &cp,
        &["apply", "-f", &config_path("manager/namespace.yaml")],
    )
    .await;
    let out = kubectl_ok(
        &cp,
        &["apply", "-k", &config_path("default"), "--dry-run=server"],
    )
    .await;
    for object in [
        "customresourcedefinition.apiextensions.k8s.io/nodeipamconfigs.nodeipam.io",
        "serviceaccount/nodeipam-controller",
        "role.rbac.authorization.k8s.io/nodeipam-controller",
        "clusterrole.rbac.authorization.k8s.io/nodeipam-controller",
        "rolebinding.rbac.authorization.k8s.io/nodeipam-controller",
        "clusterrolebinding.rbac.authorization.k8s.io/nodeipam-controller",
        "service/nodeipam-webhook",
        "deployment.apps/nodeipam-controller",
        "poddisruptionbudget.policy/nodeipam-controller",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/nodeipam-webhook",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(object) && l.contains("(server dry run)")),
            "{object} missing from the dry run:\n{out}"
        );
    }

    // The CRD for real, then the samples against its schema and CEL rules (no webhook yet).
    kubectl_ok(&cp, &["apply", "-k", &config_path("crd")]).await;
    kubectl_ok(
        &cp,
        &[
            "wait",
            "--for=condition=Established",
            "crd/nodeipamconfigs.nodeipam.io",
            "--timeout=60s",
        ],
    )
    .await;
    let out = kubectl_ok(&cp, &["apply", "-k", &config_path("samples")]).await;
    for name in ["dual-stack", "gpu-pool", "wide-ipv6"] {
        assert!(
            out.contains(&format!("nodeipamconfig.nodeipam.io/{name} created")),
            "sample {name} not created:\n{out}"
        );
    }

    // Everything for real. No scheduler runs here, so the Deployment never starts a pod; the
    // webhook configuration is live, though.
    kubectl_ok(&cp, &["apply", "-k", &config_path("default")]).await;
    let rendered = kubectl_ok(&cp, &["kustomize", &config_path("default")]).await;
    let docs = yaml_docs(&rendered);
    let deploy = find_kind(&docs, "Deployment");
    let pod = &deploy["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );

    // The ports the probes and the Service use are the ones the flags open.
    let args: Vec<String> = serde_json::from_value(container["args"].clone()).expect("args");
    let port_of = |flag: &str| -> u16 {
        args.iter()
            .find_map(|a| a.strip_prefix(flag))
            .and_then(|addr| addr.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("no {flag} in {args:?}"))
    };
    let named = |name: &str| -> u16 {
        container["ports"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("no container port named {name}"))
    };
    assert_eq!(named("metrics"), port_of("--metrics-bind-address="));
    assert_eq!(named("probes"), port_of("--health-probe-bind-address="));
    assert_eq!(named("webhook"), port_of("--webhook-addr="));
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "probes");
        // Probes bind loopback; with host networking the kubelet reaches them there.
        assert_eq!(container[probe]["httpGet"]["host"], "127.0.0.1");
    }
    let service = find_kind(&docs, "Service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "webhook");
    let env: Vec<&str> = container["env"]
        .as_array()
        .map(|e| e.iter().filter_map(|v| v["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(env.contains(&"POD_NAME") && env.contains(&"POD_NAMESPACE"));
    assert_flags_parse(&args).await;

    // failurePolicy Fail: with no replica behind the Service, creates are refused...
    let err = Api::<NodeIPAMConfig>::all(client.clone())
        .create(
            &PostParams::default(),
            &NodeIPAMConfig::new("refused", dual_stack("10.40.0.0/16", "fd00:40::/48")),
        )
        .await
        .expect_err("the webhook fails closed");
    assert!(
        err.to_string().contains("failed calling webhook"),
        "unexpected error: {err}"
    );
    // ...but deletes are not intercepted: a config can always drain.
    kubectl_ok(
        &cp,
        &["delete", "nodeipamconfig", "gpu-pool", "--wait=false"],
    )
    .await;

    // The cert-manager overlay against stand-in cert-manager CRDs (any fields accepted).
    for (plural, kind) in [("certificates", "Certificate"), ("issuers", "Issuer")] {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.cert-manager.io")},
            "spec": {
                "group": "cert-manager.io",
                "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}],
            },
        });
        let path = cp.dir().join(format!("{plural}.json"));
        std::fs::write(&path, crd.to_string()).expect("write stand-in CRD");
        kubectl_ok(&cp, &["apply", "-f", &path.display().to_string()]).await;
        kubectl_ok(
            &cp,
            &[
                "wait",
                "--for=condition=Established",
                &format!("crd/{plural}.cert-manager.io"),
                "--timeout=60s",
            ],
        )
        .await;
    }
    let out = kubectl_ok(
        &cp,
        &[
            "apply",
            "-k",
            &config_path("certmanager"),
            "--dry-run=server",
        ],
    )
    .await;
    assert!(
        out.contains("certificate.cert-manager.io/nodeipam-webhook-cert"),
        "{out}"
    );
    let docs = yaml_docs(&kubectl_ok(&cp, &["kustomize", &config_path("certmanager")]).await);
    let vwc = find_kind(&docs, "ValidatingWebhookConfiguration");
    assert_eq!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "nodeipam-system/nodeipam-webhook-cert"
    );
    let container = &find_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = serde_json::from_value(container["args"].clone()).expect("args");
    assert!(args.iter().any(|a| a == "--cert-mode=files"), "{args:?}");
    let cert_dir = args
        .iter()
        .find_map(|a| a.strip_prefix("--cert-dir="))
        .expect("--cert-dir");
    assert_eq!(container["volumeMounts"][0]["mountPath"], cert_dir);
    assert_flags_parse(&args).await;

    cp.stop().await;
}

/// The Deployment's arguments are flags the binary knows: with them it gets as far as
/// reading the (missing) kubeconfig instead of failing to parse.
async fn assert_flags_parse(args: &[String]) {
    let out = tokio::process::Command::new(nodeipam_bin())
        .env_clear()
        .args(args)
        .arg("--kubeconfig=/nonexistent/kubeconfig")
        .output()
        .await
        .expect("run nodeipam");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/nonexistent/kubeconfig"),
        "nodeipam {args:?} did not get to reading its kubeconfig:\n{stderr}"
    );
}

/// flannel's ConfigMap as kube-flannel.yml (and hack/cluster.sh) makes it, with NETWORK.
async fn create_flannel_configmap(client: &Client, network: &str) {
    namespace(client, FLANNEL_NAMESPACE).await;
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": FLANNEL_CONFIGMAP, "namespace": FLANNEL_NAMESPACE},
        "data": {"net-conf.json": format!(r#"{{"Network": "{network}", "Backend": {{"Type": "vxlan"}}}}"#)},
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), FLANNEL_NAMESPACE)
        .create(&PostParams::default(), &cm)
        .await
        .expect("step=create-flannel-configmap");
}

/// `nodeipam run` as the ServiceAccount of `config/rbac` does everything (allocation,
/// finalizers, status, events, leader election, managed TLS with caBundle patching, the
/// webhook, learning flannel's Network) without one refusal, and cannot do what it was not
/// granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_allows_every_feature_and_nothing_more() {
    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    // Holds every range below: nothing is outside, only the read is under test.
    create_flannel_configmap(&admin, "10.128.0.0/9").await;
    let kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");
    let mut replica = Replica::start_plain(dir.path(), &kubeconfig, "rbac-0", &[]).await;
    register_webhook_by_url(&admin, replica.webhook_port).await;

    // flannel's Network is learnt from its ConfigMap (a refused read is a warning that
    // assert_never_forbidden below catches).
    wait_for("flannel's Network read", || async {
        replica
            .log_text()
            .lines()
            .any(|l| l.contains("flannel's pod network read") && l.contains("10.128.0.0/9"))
            .then_some(())
    })
    .await;

    // Leader election: the lease is created and held.
    wait_holder(&admin, "rbac-0").await;
    replica.wait_leader_metric(1.0).await;

    // Managed TLS: the Secret is written and its CA patched into the webhook configuration.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let ca = wait_for("the webhook Secret", || async {
        secrets
            .get_opt(SECRET)
            .await
            .ok()??
            .data?
            .get("ca.crt")
            .map(|b| b.0.clone())
    })
    .await;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    wait_for("caBundle patched with the Secret's CA", || async {
        let vwc = vwcs.get(VWC).await.ok()?;
        vwc.webhooks?
            .iter()
            .all(|h| h.client_config.ca_bundle.as_ref().map(|b| &b.0) == Some(&ca))
            .then_some(())
    })
    .await;

    // The webhook answers through the API server: a range only it can refuse is refused.
    let configs: Api<NodeIPAMConfig> = Api::all(admin.clone());
    wait_for("the API server to call the webhook", || async {
        let probe = NodeIPAMConfig::new("probe", spec(family("10.96.0.0/16", 24), None, None));
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match configs.create(&dry, &probe).await {
            Err(kube::Error::Api(s)) if s.message.contains("overlaps the Service range") => {
                Some(())
            }
            _ => None,
        }
    })
    .await;

    // Allocation, finalizer and status.
    // Not a catch-all: a node the tiny config cannot serve must find no other config.
    let not_tiny = selector(&[("pool", "NotIn", &["tiny"])]);
    create_ready_config(
        &admin,
        "main",
        spec(
            family("10.128.0.0/16", 24),
            family("fd00:128::/48", 64),
            not_tiny,
        ),
    )
    .await;
    let tiny = selector(&[("pool", "In", &["tiny"])]);
    create_ready_config(
        &admin,
        "tiny",
        spec(family("10.200.0.0/30", 30), None, tiny),
    )
    .await;
    for i in 0..5 {
        create_node(&admin, &format!("node-{i}"), &[]).await;
    }
    for i in 0..2 {
        create_node(&admin, &format!("tiny-{i}"), &[("pool", "tiny")]).await;
    }
    for i in 0..5 {
        assert_eq!(wait_cidrs(&admin, &format!("node-{i}")).await.len(), 2);
    }
    let main = get_config(&admin, "main").await.expect("config main");
    assert!(main.finalizers().iter().any(|f| f == FINALIZER));
    assert_status_matches(&admin, "main").await;

    // Events: one tiny node got the only block; the other is pending with a warning and the
    // config reports exhaustion.
    let (held, pending) = wait_for("one tiny node allocated", || async {
        let a = pod_cidrs(&get_node(&admin, "tiny-0").await?);
        let b = pod_cidrs(&get_node(&admin, "tiny-1").await?);
        match (a.is_empty(), b.is_empty()) {
            (false, true) => Some(("tiny-0", "tiny-1")),
            (true, false) => Some(("tiny-1", "tiny-0")),
            _ => None,
        }
    })
    .await;
    wait_event(&admin, pending, "CIDRNotAvailable").await;
    wait_event(&admin, "tiny", "Exhausted").await;

    // Drain: the deleted config stays until its node is gone, then the finalizer is removed.
    delete_config(&admin, "tiny").await;
    wait_condition(&admin, "tiny", "Drained", "False", Some("NodesRemaining")).await;
    delete_node(&admin, held).await;
    delete_node(&admin, pending).await;
    wait_for("config tiny gone", || async {
        get_config(&admin, "tiny").await.is_none().then_some(())
    })
    .await;

    // Nothing beyond the grant.
    let sa = cp
        .client_for(SA_USER, SA_GROUPS)
        .await
        .expect("client for the ServiceAccount");
    let merge = PatchParams::default();
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    forbidden(
        "patch a Pod",
        Api::<Pod>::namespaced(sa.clone(), "default")
            .patch("any", &merge, &Patch::Merge(&label))
            .await,
    );
    forbidden(
        "read the same Secret name in another namespace",
        Api::<Secret>::namespaced(sa.clone(), "default")
            .get(SECRET)
            .await,
    );
    forbidden(
        "read another Secret in its own namespace",
        Api::<Secret>::namespaced(sa.clone(), NAMESPACE)
            .get("someone-else")
            .await,
    );
    forbidden(
        "list Secrets in its own namespace",
        Api::<Secret>::namespaced(sa.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await,
    );
    forbidden(
        "delete a Node",
        Api::<Node>::all(sa.clone())
            .delete("node-0", &DeleteParams::default())
            .await,
    );
    // It deletes the configs a pool carved one by one, never a collection; it writes no
    // config by update, and no pool but its status.
    let pool: nodeipam_crd::NodeIPAMPool = serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMPool",
        "metadata": {"name": "any"},
        "spec": {"ipv4": {"cidrs": ["10.129.0.0/16"], "rangeMaskSize": 20, "perNodeMaskSize": 24}},
    }))
    .expect("a NodeIPAMPool");
    forbidden(
        "delete every NodeIPAMConfig at once",
        Api::<NodeIPAMConfig>::all(sa.clone())
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await,
    );
    forbidden(
        "update a NodeIPAMConfig",
        Api::<NodeIPAMConfig>::all(sa.clone())
            .replace("main", &PostParams::default(), &main)
            .await,
    );
    forbidden(
        "create a NodeIPAMPool",
        Api::<nodeipam_crd::NodeIPAMPool>::all(sa.clone())
            .create(&PostParams::default(), &pool)
            .await,
    );
    forbidden(
        "delete a NodeIPAMPool",
        Api::<nodeipam_crd::NodeIPAMPool>::all(sa.clone())
            .delete("any", &DeleteParams::default())
            .await,
    );
    forbidden(
        "patch a NodeIPAMPool's spec",
        Api::<nodeipam_crd::NodeIPAMPool>::all(sa.clone())
            .patch("any", &merge, &Patch::Merge(&label))
            .await,
    );
    forbidden(
        "read another webhook configuration",
        Api::<ValidatingWebhookConfiguration>::all(sa.clone())
            .get("someone-else")
            .await,
    );
    forbidden(
        "delete its lease",
        Api::<Lease>::namespaced(sa.clone(), NAMESPACE)
            .delete(LEASE, &DeleteParams::default())
            .await,
    );
    let flannel = Api::<ConfigMap>::namespaced(sa.clone(), FLANNEL_NAMESPACE);
    forbidden(
        "read another ConfigMap in flannel's namespace",
        flannel.get("someone-else").await,
    );
    forbidden(
        "list ConfigMaps in flannel's namespace",
        flannel.list(&ListParams::default()).await,
    );
    forbidden(
        "write flannel's ConfigMap",
        flannel
            .patch(FLANNEL_CONFIGMAP, &merge, &Patch::Merge(&label))
            .await,
    );
    forbidden(
        "write a ConfigMap in kube-system",
        Api::<ConfigMap>::namespaced(sa.clone(), "kube-system")
            .patch("any", &merge, &Patch::Merge(&label))
            .await,
    );

    replica.assert_never_forbidden();
    assert_invariant(&admin, &[]).await;

    // SIGTERM: a clean exit that releases the lease (nobody else could have taken it).
    replica.signal(Signal::TERM);
    let status = replica.wait_exit().await;
    assert!(status.success(), "exit after SIGTERM: {status}");
    assert_eq!(lease_holder(&admin).await, None, "the lease was released");
    replica.assert_never_forbidden();
    cp.stop().await;
}

/// Two replicas, one allocating; the leader is SIGKILLed halfway through a burst of 500 node
/// creations and the other takes over: every node ends up with podCIDRs, none overlap, and the
/// status and the new leader's metrics match the cluster. Then a fresh third replica stands
/// by, the leader gets SIGTERM, exits 0 and releases the lease to it, and the third one's
/// metrics count exactly what it allocates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_during_a_node_burst() {
    const BURST: usize = 500;
    const WARMUP: usize = 10;
    const AFTER: usize = 20;
    let (v4, v6) = ("10.128.0.0/14", "fd00:128::/48");

    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");
    let mut fast: Vec<&str> = FAST_LEASE.to_vec();
    fast.extend(["--kube-api-qps=200", "--kube-api-burst=200"]);

    let mut a = Replica::start_plain(dir.path(), &kubeconfig, "replica-a", &fast).await;
    wait_holder(&admin, "replica-a").await;
    let mut b = Replica::start_plain(dir.path(), &kubeconfig, "replica-b", &fast).await;
    a.wait_leader_metric(1.0).await;

    create_ready_config(&admin, "pool", dual_stack(v4, v6)).await;
    for i in 0..WARMUP {
        create_node(&admin, &format!("warm-{i}"), &[]).await;
    }
    wait_all_allocated(&admin, 2).await;

    // Only the leader allocates.
    let allocations = "node_ipam_controller_cidrset_cidrs_allocations_total";
    let clusterv4 = [("clusterCIDR", v4)];
    assert_eq!(a.gauge(allocations, &clusterv4).await, Some(WARMUP as f64));
    assert_eq!(b.gauge("nodeipam_leader", &[]).await, Some(0.0));
    assert_eq!(b.gauge(allocations, &clusterv4).await.unwrap_or(0.0), 0.0);

    // The burst, with the leader killed halfway.
    let names: Vec<String> = (0..BURST).map(|i| format!("burst-{i:03}")).collect();
    let mut killed_at = None;
    let mut done_before_kill = 0;
    let burst_began = Instant::now();
    let created = create_nodes(&admin, names, 32, |created| {
        a.signal(Signal::KILL);
        killed_at = Some(Instant::now());
        done_before_kill = created;
    })
    .await;
    let burst_took = burst_began.elapsed();
    let killed_at = killed_at.expect("the leader was killed during the burst");
    assert_eq!(created, BURST);
    let a_status = a.wait_exit().await;
    assert!(!a_status.success(), "replica-a was killed: {a_status}");
    let allocated_at_kill_plus = allocated_count(&admin).await;

    wait_holder(&admin, "replica-b").await;
    let takeover = killed_at.elapsed();
    b.wait_leader_metric(1.0).await;
    // A killed leader vouches for nothing: the standby waited out its last writes.
    assert_eq!(takeovers(&b, "unclean").await, 1.0);
    assert_eq!(takeovers(&b, "clean").await, 0.0);
    let nodes = wait_all_allocated(&admin, 2).await;
    let all_allocated = killed_at.elapsed();
    assert_eq!(nodes, WARMUP + BURST);
    assert_invariant(&admin, &[]).await;
    assert_status_matches(&admin, "pool").await;
    eprintln!(
        "failover: {BURST} nodes created in {:.1}s; replica-a SIGKILLed after {done_before_kill} \
         creates ({allocated_at_kill_plus} nodes allocated right after); replica-b held the \
         lease {:.1}s after the kill and all {nodes} nodes had podCIDRs {:.1}s after it",
        burst_took.as_secs_f64(),
        takeover.as_secs_f64(),
        all_allocated.as_secs_f64()
    );

    // The new leader's gauges match the cluster (it rebuilt them from the Nodes).
    let blocks = "nodeipam_config_blocks_allocated";
    let status = get_config(&admin, "pool")
        .await
        .and_then(|c| c.status)
        .expect("status of pool");
    let metrics = b.metrics().await;
    for (family, st) in [("ipv4", status.ipv4), ("ipv6", status.ipv6)] {
        let labels = [("config", "pool"), ("family", family)];
        assert_eq!(metric(&metrics, blocks, &labels), Some(nodes as f64));
        assert_eq!(st.map(|f| f.allocated), Some(nodes as u64));
    }
    assert_eq!(metric(&metrics, "nodeipam_pending_nodes", &[]), Some(0.0));
    // It handed out blocks. The counter also counts retried hand-outs, so it is only checked
    // to be positive here; replica-c's count below is exact.
    let by_b = metric(&metrics, allocations, &clusterv4).unwrap_or(0.0);
    let released_by_b = metric(
        &metrics,
        "node_ipam_controller_cidrset_cidrs_releases_total",
        &clusterv4,
    )
    .unwrap_or(0.0);
    assert!(by_b >= 1.0, "replica-b allocated nothing");
    eprintln!(
        "failover: replica-b handed out {by_b} IPv4 blocks and released {released_by_b}; \
         {} were pending when replica-a died",
        nodes - allocated_at_kill_plus
    );

    // A replacement stands by. SIGTERM: the leader clears the lease's holder before it exits;
    // the standby takes it when it next reads the lease.
    let mut c = Replica::start_plain(dir.path(), &kubeconfig, "replica-c", &fast).await;
    assert_eq!(c.gauge("nodeipam_leader", &[]).await, Some(0.0));
    let term_at = Instant::now();
    b.signal(Signal::TERM);
    let b_status = b.wait_exit().await;
    assert!(b_status.success(), "replica-b after SIGTERM: {b_status}");
    assert_ne!(
        lease_holder(&admin).await.as_deref(),
        Some("replica-b"),
        "replica-b released the lease before exiting"
    );
    assert!(b.log_text().contains("lease released"), "{}", b.log_tail());
    wait_holder(&admin, "replica-c").await;
    // replica-b stopped with every write answered and said so; replica-c trusted it.
    wait_for("replica-c's clean take-over", || async {
        (takeovers(&c, "clean").await == 1.0).then_some(())
    })
    .await;
    assert_eq!(takeovers(&c, "unclean").await, 0.0);
    eprintln!(
        "handover: replica-b exited 0 after SIGTERM; replica-c held the lease {:.1}s after it",
        term_at.elapsed().as_secs_f64()
    );
    c.wait_leader_metric(1.0).await;

    // Metrics match the cluster exactly: replica-c allocates only what comes after.
    for i in 0..AFTER {
        create_node(&admin, &format!("after-{i}"), &[]).await;
    }
    let nodes = wait_all_allocated(&admin, 2).await;
    assert_eq!(nodes, WARMUP + BURST + AFTER);
    assert_status_matches(&admin, "pool").await;
    let want: BTreeMap<&str, f64> = [("ipv4", nodes as f64), ("ipv6", nodes as f64)].into();
    wait_for("replica-c's metrics to match the cluster", || async {
        let m = c.metrics().await;
        let ok = want.iter().all(|(family, n)| {
            metric(&m, blocks, &[("config", "pool"), ("family", family)]) == Some(*n)
        }) && metric(&m, allocations, &clusterv4) == Some(AFTER as f64)
            && metric(&m, allocations, &[("clusterCIDR", v6)]) == Some(AFTER as f64)
            && metric(&m, "nodeipam_pending_nodes", &[]) == Some(0.0);
        ok.then_some(())
    })
    .await;
    assert_invariant(&admin, &[]).await;

    for r in [&a, &b, &c] {
        r.assert_never_forbidden();
    }
    c.signal(Signal::TERM);
    assert!(c.wait_exit().await.success());
    cp.stop().await;
}

/// A rolling update's clean stop with a realistic lease (15 s, renewed 5 s before expiry): the
/// leader gets SIGTERM, stops allocating and releases the lease; the standby takes it and a
/// node created right after the leader exited gets podCIDRs. How long that took is logged,
/// never asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_lease_to_the_standby() {
    const LEASE_FLAGS: &[&str] = &["--lease-duration=15", "--lease-grace=5"];
    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");

    let mut a = Replica::start_plain(dir.path(), &kubeconfig, "replica-a", LEASE_FLAGS).await;
    wait_holder(&admin, "replica-a").await;
    let mut b = Replica::start_plain(dir.path(), &kubeconfig, "replica-b", LEASE_FLAGS).await;
    a.wait_leader_metric(1.0).await;
    create_ready_config(&admin, "pool", dual_stack("10.140.0.0/16", "fd00:140::/48")).await;
    create_node(&admin, "before", &[]).await;
    wait_cidrs(&admin, "before").await;
    assert_eq!(b.gauge("nodeipam_leader", &[]).await, Some(0.0));

    let term_at = Instant::now();
    a.signal(Signal::TERM);
    let a_status = a.wait_exit().await;
    assert!(a_status.success(), "replica-a after SIGTERM: {a_status}");
    let exited = term_at.elapsed();
    let log = a.log_text();
    assert!(log.contains("lease released"), "{}", a.log_tail());
    assert!(
        log.contains("every write answered: the lease tells the next leader it need not wait"),
        "{}",
        a.log_tail()
    );
    assert_ne!(
        lease_holder(&admin).await.as_deref(),
        Some("replica-a"),
        "replica-a released the lease before exiting"
    );
    create_node(&admin, "after", &[]).await;
    wait_holder(&admin, "replica-b").await;
    let held = term_at.elapsed();
    let cidrs = wait_cidrs(&admin, "after").await;
    let allocated = term_at.elapsed();
    assert_eq!(cidrs.len(), 2, "{cidrs:?}");
    assert_eq!(b.gauge("nodeipam_leader", &[]).await, Some(1.0));
    assert_invariant(&admin, &[]).await;
    // replica-b skipped the take-over wait on replica-a's word, and took the word off the
    // Lease before it wrote: a crash of replica-b must not be mistaken for a clean stop.
    assert_eq!(takeovers(&b, "clean").await, 1.0);
    assert_eq!(takeovers(&b, "unclean").await, 0.0);
    assert!(
        b.log_text().contains("allocating at once"),
        "{}",
        b.log_tail()
    );
    assert_eq!(lease_handover(&admin).await, None);
    eprintln!(
        "clean handover (lease 15s, grace 5s): replica-a exited {:.2}s after SIGTERM; \
         replica-b held the lease {:.2}s and node 'after' had podCIDRs {:.2}s after it",
        exited.as_secs_f64(),
        held.as_secs_f64(),
        allocated.as_secs_f64()
    );

    a.assert_never_forbidden();
    b.assert_never_forbidden();
    b.signal(Signal::TERM);
    assert!(b.wait_exit().await.success());
    // With no standby the mark stays on the released Lease for whoever leads next.
    assert_eq!(lease_handover(&admin).await.as_deref(), Some(SETTLED));
    assert_eq!(lease_holder(&admin).await, None);
    cp.stop().await;
}

/// A long-lived task that panics must not leave a leader that holds the Lease and does nothing:
/// the replica steps down and exits non-zero, and the standby serves. The fault is injected
/// through a flag that only debug builds (the ones tests run) honour.
async fn a_panic_ends_the_leader_and_the_standby_takes_over(fault: &str, base: u8) {
    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");
    let mut faulty = FAST_LEASE.to_vec();
    let flag = format!("--inject-fault={fault}:boom");
    faulty.push(&flag);
    let mut a = Replica::start_plain(dir.path(), &kubeconfig, "replica-a", &faulty).await;
    wait_holder(&admin, "replica-a").await;
    let mut b = Replica::start_plain(dir.path(), &kubeconfig, "replica-b", FAST_LEASE).await;
    let (v4, v6) = (format!("10.{base}.0.0/16"), format!("fd00:{base}::/48"));
    create_ready_config(&admin, "pool", dual_stack(&v4, &v6)).await;
    create_node(&admin, "before", &[]).await;
    wait_cidrs(&admin, "before").await;

    create_node(&admin, "boom", &[]).await;
    let status = a.wait_exit().await;
    assert!(
        !status.success(),
        "replica-a must exit non-zero after a task panicked ({fault}): {status}"
    );
    let log = a.log_text();
    assert!(
        log.contains("the allocation task panicked") && log.contains("stopping"),
        "replica-a must say which task ended:\n{}",
        a.log_tail()
    );
    wait_holder(&admin, "replica-b").await;
    let cidrs = wait_cidrs(&admin, "boom").await;
    assert_eq!(cidrs.len(), 2, "{cidrs:?}");
    assert_invariant(&admin, &[]).await;
    b.signal(Signal::TERM);
    assert!(b.wait_exit().await.success());
    cp.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_allocation_loop_ends_the_leader_and_the_standby_takes_over() {
    a_panic_ends_the_leader_and_the_standby_takes_over("panic-on-node", 150).await;
}

/// A panic in one of the session's helpers (here the node writer) goes up the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_node_writer_ends_the_leader_and_the_standby_takes_over() {
    a_panic_ends_the_leader_and_the_standby_takes_over("panic-in-writer", 153).await;
}

/// Finalizer updates do not go to the webhook (its matchConditions send only creates and spec
/// changes), so a drained config is released while the webhook is down; creates still fail
/// closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_config_is_released_while_the_webhook_is_down() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(
        c.clone(),
        nodeipam_controller::reconcile::Options::default(),
    );
    create_ready_config(&c, "pool", spec(family("10.151.0.0/16", 24), None, None)).await;
    create_node(&c, "n0", &[]).await;
    wait_cidrs(&c, "n0").await;
    // The manifest's webhook, pointed at a port where nothing answers.
    register_webhook_by_url(&c, free_port()).await;
    let api: Api<NodeIPAMConfig> = Api::all(c.clone());
    wait_for("the webhook to fail closed on creates", || async {
        let obj = NodeIPAMConfig::new("refused", spec(family("10.152.0.0/16", 24), None, None));
        match api.create(&PostParams::default(), &obj).await {
            Err(e) if e.to_string().contains("failed calling webhook") => Some(()),
            _ => None,
        }
    })
    .await;
    delete_config(&c, "pool").await;
    wait_condition(&c, "pool", "Drained", "False", Some("NodesRemaining")).await;
    delete_node(&c, "n0").await;
    wait_for("the drained config to be released", || async {
        get_config(&c, "pool").await.is_none().then_some(())
    })
    .await;
    cp.stop().await;
}

/// `--ip-masq-agent-configmap` needs the pod network ConfigMap: refused, not ignored.
#[tokio::test]
async fn ip_masq_agent_without_the_pod_network_configmap_is_refused() {
    let out = tokio::process::Command::new(nodeipam_bin())
        .env_clear()
        .args([
            "run",
            "--pod-network-configmap=",
            "--ip-masq-agent-configmap=kube-system/ip-masq-agent",
            "--kubeconfig=/nonexistent/kubeconfig",
        ])
        .output()
        .await
        .expect("run nodeipam");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--ip-masq-agent-configmap") && stderr.contains("--pod-network-configmap"),
        "the error must name both flags:\n{stderr}"
    );
    assert!(
        !stderr.contains("/nonexistent/kubeconfig"),
        "refused before anything else:\n{stderr}"
    );
}

/// Whether the Lease exists with a deletion pending.
async fn lease_being_deleted(client: &Client) -> bool {
    lease(client)
        .await
        .is_some_and(|l| l.metadata.deletion_timestamp.is_some())
}

/// When the Lease was last renewed, if it exists.
async fn lease_renewed(client: &Client) -> Option<String> {
    lease(client)
        .await
        .and_then(|l| l.spec)
        .and_then(|s| s.renew_time)
        .map(|t| format!("{:?}", t.0))
}

/// An admin deletes the Lease under a live leader, the usual way to force a failover, right
/// after the leader renewed it: the leader would believe in its Lease for a whole renewal
/// period (10 s) while a standby takes a new one within a second. Nodes keep coming through
/// that time; no two of them may ever hold the same block, and every node still gets its
/// podCIDRs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_lease_under_a_live_leader_never_hands_a_block_out_twice() {
    const FLAGS: &[&str] = &[
        "--lease-duration=15",
        "--lease-grace=5",
        "--kube-api-qps=200",
        "--kube-api-burst=200",
    ];
    const STREAM: Duration = Duration::from_secs(11);
    // `solo` keeps the rest (the temporary folder) alive to the end.
    let (solo, mut b) = Solo::serving_with_standby(FLAGS, "10.64.0.0/12", 26, "warm").await;
    let Solo {
        cp, admin, mut a, ..
    } = solo;

    // Just after a renewal and the read that confirms it (a second later), so that replica-a
    // has most of a renewal period to go on believing in its Lease.
    let renewed = lease_renewed(&admin).await;
    wait_for("replica-a to renew the lease", || async {
        (lease_renewed(&admin).await != renewed).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    Api::<Lease>::namespaced(admin.clone(), NAMESPACE)
        .delete(LEASE, &DeleteParams::default())
        .await
        .expect("delete the lease");
    let deleted_at = Instant::now();
    // The leader's finalizer keeps it, led by nobody, until the leader's writes are over.
    assert!(
        lease_being_deleted(&admin).await,
        "the lease vanished under a live leader"
    );

    // Nodes keep coming, faster than a leader at 200 requests a second writes them, while
    // either replica may think it leads (without the finalizer: replica-b from about 5.5 s
    // after the deletion, replica-a until its next read, about 9 s; both then work through a
    // backlog, which is how they come to pick the same blocks); then they stop. At a fixed
    // pace, at most 64 every 100 ms (3.2 times the leader's rate): unpaced, a quiet machine
    // created 17,000 in the 11 s, more than the 16,384 blocks of the range.
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut created = 0;
    while deleted_at.elapsed() < STREAM {
        pace.tick().await;
        let names: Vec<String> = (created..created + 64)
            .map(|i| format!("stream-{i:05}"))
            .collect();
        created += create_nodes(&admin, names, 8, |_| {}).await;
    }
    assert!(
        created < 1 << (26 - 12),
        "{created} nodes outgrow the range"
    );
    // The next leader starts once replica-a let the Lease go, with thousands of nodes to
    // catch up on at 200 requests a second: give it minutes on a busy machine.
    let nodes = wait_all_allocated_for(&admin, 1, Duration::from_secs(240)).await;
    assert_eq!(nodes, created + 1);
    assert_invariant(&admin, &[]).await;
    // A fresh Lease: whoever took it had nothing to wait out.
    assert!(!lease_being_deleted(&admin).await);
    let holder = lease_holder(&admin)
        .await
        .expect("a new leader holds the lease");
    let (leader, other) = if holder == "replica-a" {
        (&a, &b)
    } else {
        (&b, &a)
    };
    // replica-a's first start (no Lease yet) was clean. The take of the fresh one is clean
    // only if replica-a's session had every write answered when the deletion stopped it;
    // in this burst it was stopped with writes in flight (they may still land), so it
    // created the fresh Lease unmarked and its next leader waited out a term (`unknown`).
    let count = |kind| {
        let (a, b) = (&a, &b);
        async move { takeovers(a, kind).await + takeovers(b, kind).await }
    };
    let (clean, unknown) = (count("clean").await, count("unknown").await);
    assert_eq!(
        (clean + unknown, clean >= 1.0),
        (2.0, true),
        "replica-a:\n{}\nreplica-b:\n{}",
        a.metrics().await,
        b.metrics().await
    );
    if unknown > 0.0 {
        let unmarked = "created the next lease unmarked";
        assert!(
            a.log_text().contains(unmarked),
            "an unknown take-over of a Lease replica-a let go marked: {}",
            a.log_tail()
        );
    }
    assert_eq!(takeovers(&a, "unclean").await, 0.0, "{}", a.log_tail());
    assert_eq!(takeovers(&b, "unclean").await, 0.0, "{}", b.log_tail());
    let released = "the lease is being deleted and our writes are over: let it go";
    assert!(
        a.log_text().contains(released),
        "replica-a let the lease go: {}",
        a.log_tail()
    );
    eprintln!(
        "lease deleted under replica-a: {created} nodes created in the {}s after it, none \
         sharing a block; {holder} leads on a fresh lease",
        STREAM.as_secs()
    );
    for r in [leader, other] {
        r.assert_never_forbidden();
    }
    a.signal(Signal::TERM);
    b.signal(Signal::TERM);
    assert!(a.wait_exit().await.success());
    assert!(b.wait_exit().await.success());
    cp.stop().await;
}

/// A Lease freed by hand (its holder cleared) under a live leader and then deleted the
/// ordinary way: our finalizer keeps it, terminating, naming nobody or the standby that took
/// it meanwhile, neither of which led on it, while the leader the hand edit displaced may go
/// on sending until its own term ends (it stops at its next read, unless that read fails or
/// it is paused). So the replica that lets it go creates the next Lease unmarked, not
/// settled, and whoever takes that waits out a whole term and the write timeout before it
/// writes: an `unknown` take-over (docs/single-writer.md, step 1c).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_freed_by_hand_then_deleted_makes_the_next_leader_wait_out_the_term() {
    const FLAGS: &[&str] = &["--lease-duration=15", "--lease-grace=5"];
    // `solo` keeps the rest (the temporary folder) alive to the end.
    let (solo, mut b) = Solo::serving_with_standby(FLAGS, "10.79.0.0/16", 24, "before").await;
    let Solo {
        cp, admin, mut a, ..
    } = solo;
    // replica-a's first start: no config carried our finalizer, nothing to wait for.
    let clean = takeovers(&a, "clean").await + takeovers(&b, "clean").await;
    assert_eq!(clean, 1.0, "{}", a.log_tail());

    // Just after a renewal, so that replica-a's lock is not due again for 10 s: the standby,
    // which reads the Lease every second, is the one that finds it free.
    let renewed = lease_renewed(&admin).await;
    wait_for("replica-a to renew the lease", || async {
        (lease_renewed(&admin).await != renewed).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leases = Api::<Lease>::namespaced(admin.clone(), NAMESPACE);
    let free = json!({ "spec": { "holderIdentity": null } });
    leases
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(&free))
        .await
        .expect("free the lease by hand");
    leases
        .delete(LEASE, &DeleteParams::default())
        .await
        .expect("delete the lease");
    assert!(
        lease_being_deleted(&admin).await,
        "our finalizer keeps the lease"
    );

    // The next Lease, as first seen (nobody takes it for seconds: both locks claim the old
    // one until their next renewal): not marked settled.
    let next = wait_for("the next lease", || async {
        lease(&admin)
            .await
            .filter(|l| l.metadata.deletion_timestamp.is_none())
    })
    .await;
    assert_ne!(
        next.annotations()
            .get(HANDOVER_ANNOTATION)
            .map(String::as_str),
        Some(SETTLED),
        "the next lease vouches for a leader displaced by hand:\nreplica-a:\n{}\nreplica-b:\n{}",
        a.log_tail(),
        b.log_tail()
    );
    let logs = || format!("{}\n{}", a.log_text(), b.log_text());
    assert!(
        logs().contains("created the next lease unmarked"),
        "replica-a:\n{}\nreplica-b:\n{}",
        a.log_tail(),
        b.log_tail()
    );
    assert!(!logs().contains("created the next lease, marked settled"));

    // Whoever takes it counts an unknown take-over and waits it out before it writes.
    wait_for("the next leader's take-over", || async {
        let unknown = takeovers(&a, "unknown").await + takeovers(&b, "unknown").await;
        (unknown >= 1.0).then_some(())
    })
    .await;
    create_node(&admin, "after", &[]).await;
    wait_cidrs(&admin, "after").await;
    assert_invariant(&admin, &[]).await;
    let unknown = takeovers(&a, "unknown").await + takeovers(&b, "unknown").await;
    assert_eq!(unknown, 1.0, "{}\n{}", a.log_tail(), b.log_tail());
    let clean = takeovers(&a, "clean").await + takeovers(&b, "clean").await;
    assert_eq!(clean, 1.0, "{}\n{}", a.log_tail(), b.log_tail());
    for r in [&a, &b] {
        assert_eq!(takeovers(r, "unclean").await, 0.0, "{}", r.log_tail());
        r.assert_never_forbidden();
    }
    let released = |r: &Replica| r.log_text().contains("created the next lease unmarked");
    eprintln!(
        "lease freed by hand and deleted: {} let it go and created the next one unmarked; {} \
         took that over unknown",
        if released(&a) {
            "replica-a"
        } else {
            "replica-b"
        },
        lease_holder(&admin).await.unwrap_or_default(),
    );
    a.signal(Signal::TERM);
    b.signal(Signal::TERM);
    assert!(a.wait_exit().await.success());
    assert!(b.wait_exit().await.success());
    cp.stop().await;
}

/// Makes the Lease name `holder`, renewed now for 15 s, as a hand edit (or a lock that does
/// not write on the version it read) would; returns when.
async fn displace(admin: &Client, holder: &str) -> Instant {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let displaced = json!({ "spec": {
        "holderIdentity": holder,
        "acquireTime": now,
        "renewTime": now,
        "leaseDurationSeconds": 15,
    }});
    Api::<Lease>::namespaced(admin.clone(), NAMESPACE)
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(&displaced))
        .await
        .expect("displace the leader");
    Instant::now()
}

/// Until `until`, `node` has no podCIDRs and `replica` does not lead: the Lease names another.
async fn assert_unserved(admin: &Client, replica: &Replica, node: &str, until: Instant) {
    while Instant::now() < until {
        let got = get_node(admin, node).await.expect("the node");
        assert!(
            pod_cidrs(&got).is_empty(),
            "{node} was served on a Lease that names another replica: {}",
            replica.log_tail()
        );
        assert_eq!(replica.gauge("nodeipam_leader", &[]).await, Some(0.0));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One replica of the installed identity, leading, on a fresh control plane.
struct Solo {
    cp: ControlPlane,
    admin: Client,
    dir: tempfile::TempDir,
    kubeconfig: std::path::PathBuf,
    a: Replica,
}

impl Solo {
    async fn start() -> Solo {
        Solo::start_with(FAST_LEASE).await
    }

    async fn start_with(flags: &[&str]) -> Solo {
        let cp = control_plane().await;
        let admin = cp.client();
        let dir = tempfile::tempdir().expect("temp dir");
        install_rbac(&cp).await;
        let kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");
        let a = Replica::start_plain(dir.path(), &kubeconfig, "replica-a", flags).await;
        a.wait_leader_metric(1.0).await;
        Solo {
            cp,
            admin,
            dir,
            kubeconfig,
            a,
        }
    }

    /// [`Solo::start_with`], a standby `replica-b`, and one config of `cidr` and `mask` whose
    /// first node, `node`, holds a block.
    async fn serving_with_standby(
        flags: &[&str],
        cidr: &str,
        mask: u8,
        node: &str,
    ) -> (Solo, Replica) {
        let solo = Solo::start_with(flags).await;
        let b = Replica::start_plain(solo.dir.path(), &solo.kubeconfig, "replica-b", flags).await;
        create_ready_config(&solo.admin, "pool", spec(family(cidr, mask), None, None)).await;
        create_node(&solo.admin, node, &[]).await;
        wait_cidrs(&solo.admin, node).await;
        (solo, b)
    }
}

/// SIGTERM, a clean exit, and the control plane stopped.
async fn stop(replica: &mut Replica, cp: ControlPlane) {
    replica.signal(Signal::TERM);
    assert!(replica.wait_exit().await.success());
    cp.stop().await;
}

/// A single replica whose Lease is deleted: it stops leading, lets the Lease go once its writes
/// are over, takes a fresh one and allocates again. The first start of all creates the Lease
/// and allocates at once: no Lease, no earlier leader whose writes could still land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_replica_whose_lease_is_deleted_leads_again_on_a_fresh_one() {
    let Solo {
        cp,
        admin,
        dir: _dir,
        kubeconfig: _,
        mut a,
    } = Solo::start().await;
    assert_eq!(takeovers(&a, "clean").await, 1.0, "{}", a.log_tail());
    assert_eq!(takeovers(&a, "unclean").await, 0.0);
    create_ready_config(&admin, "pool", spec(family("10.72.0.0/16", 24), None, None)).await;
    create_node(&admin, "before", &[]).await;
    wait_cidrs(&admin, "before").await;

    Api::<Lease>::namespaced(admin.clone(), NAMESPACE)
        .delete(LEASE, &DeleteParams::default())
        .await
        .expect("delete the lease");
    assert!(lease_being_deleted(&admin).await);
    wait_for("a fresh lease held by replica-a", || async {
        let fresh = !lease_being_deleted(&admin).await;
        (fresh && lease_holder(&admin).await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    create_node(&admin, "after", &[]).await;
    wait_cidrs(&admin, "after").await;
    assert_eq!(takeovers(&a, "clean").await, 2.0, "{}", a.log_tail());
    assert_eq!(takeovers(&a, "unclean").await, 0.0);
    assert_invariant(&admin, &[]).await;
    a.assert_never_forbidden();
    stop(&mut a, cp).await;
}

/// Two replicas that both found the Lease free both lock it; a lock is a replace of the
/// version its replica read, so the API server refuses (409) the one that comes second,
/// however late, instead of letting it overwrite the first: else both would lead. Here the
/// second lock is sent by hand, with the service account and exactly as replica-b's lock
/// writes it, on a version of the Lease read before replica-a renewed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_found_the_lease_free_cannot_lock_it_over_the_one_that_took_it() {
    let Solo {
        cp,
        admin,
        dir: _dir,
        kubeconfig,
        mut a,
    } = Solo::start().await;

    let leases = Api::<Lease>::namespaced(admin.clone(), NAMESPACE);
    let mut seen = leases.get(LEASE).await.expect("replica-b's read");
    let version = seen.metadata.resource_version.clone();
    wait_for("replica-a to renew the lease", || async {
        let now = leases.get(LEASE).await.ok()?;
        (now.metadata.resource_version != version).then_some(())
    })
    .await;
    // What replica-b saw: free.
    if let Some(spec) = seen.spec.as_mut() {
        spec.holder_identity = None;
    }
    let lock = nodeipam_controller::reconcile::lease_lock::taken(
        &seen,
        "replica-b",
        4,
        std::time::SystemTime::now(),
    );
    let params = kube::api::PostParams {
        field_manager: Some(nodeipam_controller::reconcile::leader::field_manager(
            "replica-b",
        )),
        ..kube::api::PostParams::default()
    };
    let sa = Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig).expect("read the kubeconfig"),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("kubeconfig"),
    )
    .expect("client");
    let result = Api::<Lease>::namespaced(sa, NAMESPACE)
        .replace(LEASE, &params, &lock)
        .await;
    match result {
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        other => panic!("replica-b's lock of a Lease replica-a holds was not refused: {other:?}"),
    }
    assert_eq!(lease_holder(&admin).await.as_deref(), Some("replica-a"));
    a.assert_never_forbidden();
    stop(&mut a, cp).await;
}

/// A replica that took an expired Lease waits out the dead leader's writes; the Lease may come
/// to name another replica meanwhile (our lock writes only on the version it read, but a hand
/// edit or another lock need not). The one that waited must not allocate on a Lease that no
/// longer names it: it reads the Lease again before its first write. Here the displacement is
/// made by hand, the moment replica-b begins its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_displaced_during_its_take_over_wait_does_not_allocate() {
    const FLAGS: &[&str] = &["--lease-duration=15", "--lease-grace=5"];
    // `solo` keeps the rest (the temporary folder) alive to the end.
    let (solo, mut b) = Solo::serving_with_standby(FLAGS, "10.76.0.0/16", 24, "before").await;
    let Solo {
        cp, admin, mut a, ..
    } = solo;

    a.signal(Signal::KILL);
    assert!(!a.wait_exit().await.success());
    let waiting = "leadership gained: letting writes of a previous leader settle";
    wait_for(
        "replica-b to take the expired lease and begin its wait",
        || async { b.log_text().contains(waiting).then_some(()) },
    )
    .await;
    let displaced_at = displace(&admin, "replica-c").await;
    create_node(&admin, "after", &[]).await;
    // Past the end of replica-b's wait (4.5 s), before its next read of the Lease (10 s).
    assert_unserved(&admin, &b, "after", displaced_at + Duration::from_secs(8)).await;
    // replica-c never renews: once its Lease expires, replica-b takes it and allocates.
    wait_cidrs(&admin, "after").await;
    assert_invariant(&admin, &[]).await;
    b.assert_never_forbidden();
    stop(&mut b, cp).await;
}

/// A leader whose Lease comes to name another replica, just after it renewed it, stops at
/// its next read of the Lease, not at its next renewal (10 s later): the other replica may be
/// one that took the Lease from under it (a lease manager whose release of an expired Lease
/// lands late), and it allocates after its take-over wait (4.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_lease_names_another_stops_at_its_next_read() {
    const FLAGS: &[&str] = &["--lease-duration=15", "--lease-grace=5"];
    let solo = Solo::start_with(FLAGS).await;
    let Solo {
        cp, admin, mut a, ..
    } = solo;
    create_ready_config(&admin, "pool", spec(family("10.78.0.0/16", 24), None, None)).await;
    create_node(&admin, "before", &[]).await;
    wait_cidrs(&admin, "before").await;

    // After a renewal and the read that confirms it (a second later).
    let renewed = lease_renewed(&admin).await;
    wait_for("replica-a to renew the lease", || async {
        (lease_renewed(&admin).await != renewed).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let displaced_at = displace(&admin, "replica-c").await;
    // Reads of the Lease come every second; a node created 3 s after the displacement must
    // wait for a leader, until 7 s after it (replica-a's next renewal is due at about 8 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    create_node(&admin, "after", &[]).await;
    assert_unserved(&admin, &a, "after", displaced_at + Duration::from_secs(7)).await;
    // replica-c never renews: once its Lease expires, replica-a takes it back and allocates.
    wait_cidrs(&admin, "after").await;
    assert_invariant(&admin, &[]).await;
    a.assert_never_forbidden();
    stop(&mut a, cp).await;
}

/// Creates nodes `<prefix>-NNNN`, 16 at a time every quarter second, for `span`, checking
/// `each` after every batch; returns how many it created.
async fn stream_nodes<F, Fut>(admin: &Client, prefix: &str, span: Duration, mut each: F) -> usize
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let until = Instant::now() + span;
    let mut created = 0;
    while Instant::now() < until {
        let names: Vec<String> = (created..created + 16)
            .map(|i| format!("{prefix}-{i:04}"))
            .collect();
        created += create_nodes(admin, names, 8, |_| {}).await;
        each().await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    created
}

/// Every replica in the cluster, by its metrics: how many say they lead right now.
async fn leaders(replicas: &[&Replica]) -> usize {
    let mut n = 0;
    for r in replicas {
        if r.gauge("nodeipam_leader", &[]).await == Some(1.0) {
            n += 1;
        }
    }
    n
}

/// Two processes given the same pod name (a copied manifest, `POD_NAME` unset in both) each
/// take the Lease's renewals for their own unless their identities differ: both would lead
/// and hand out the same blocks. Every process adds a random suffix to its name, so the
/// second one is a standby, and the nodes streamed meanwhile never share a block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_given_the_same_pod_name_never_both_lead() {
    let (solo, twin) = {
        let solo = Solo::start_with(FAST_LEASE).await;
        let other = tempfile::tempdir().expect("temp dir");
        let twin =
            Replica::start_plain(other.path(), &solo.kubeconfig, "replica-a", FAST_LEASE).await;
        (solo, (twin, other))
    };
    let (mut twin, _other) = twin;
    let Solo {
        cp, admin, mut a, ..
    } = solo;
    create_ready_config(&admin, "pool", spec(family("10.80.0.0/16", 26), None, None)).await;
    // Longer than a lease duration (4 s) and its renewals, with nodes coming all the while.
    let created = stream_nodes(&admin, "twin", Duration::from_secs(10), || async {
        assert!(
            leaders(&[&a, &twin]).await <= 1,
            "two processes named replica-a both lead:\n{}\n---\n{}",
            a.log_tail(),
            twin.log_tail()
        );
    })
    .await;
    let nodes = wait_all_allocated(&admin, 1).await;
    assert_eq!(nodes, created);
    assert_invariant(&admin, &[]).await;
    assert_eq!(leaders(&[&a, &twin]).await, 1, "one of them leads");
    let holder = lease(&admin)
        .await
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .expect("a holder");
    assert!(
        holder.starts_with("replica-a_"),
        "the pod name with a random suffix: {holder}"
    );
    for r in [&a, &twin] {
        r.assert_never_forbidden();
    }
    twin.signal(Signal::TERM);
    assert!(twin.wait_exit().await.success());
    stop(&mut a, cp).await;
}

/// A leader whose wall clock runs an hour behind (an NTP step, a VM resumed) writes renewal
/// times that read as long expired to every other replica. Expiry is judged by how long a
/// replica has seen the Lease unchanged on its own monotonic clock, so the standby never takes
/// the Lease of a live leader that renews it, and only one of them ever allocates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_clock_runs_behind_keeps_its_lease_from_a_standby() {
    let behind: Vec<&str> = FAST_LEASE
        .iter()
        .copied()
        .chain(["--inject-fault=clock-offset:-3600"])
        .collect();
    let solo = Solo::start_with(&behind).await;
    let Solo {
        cp,
        admin,
        dir,
        kubeconfig,
        mut a,
    } = solo;
    let mut b = Replica::start_plain(dir.path(), &kubeconfig, "replica-b", FAST_LEASE).await;
    create_ready_config(&admin, "pool", spec(family("10.81.0.0/16", 26), None, None)).await;
    // Three lease durations (4 s), nodes coming all the while.
    let created = stream_nodes(&admin, "skew", Duration::from_secs(12), || async {
        assert_eq!(
            lease_holder(&admin).await.as_deref(),
            Some("replica-a"),
            "the standby took a live leader's Lease:\n{}",
            b.log_tail()
        );
        assert_eq!(b.gauge("nodeipam_leader", &[]).await, Some(0.0));
    })
    .await;
    let nodes = wait_all_allocated(&admin, 1).await;
    assert_eq!(nodes, created);
    assert_invariant(&admin, &[]).await;
    for kind in ["clean", "unclean", "unknown"] {
        assert_eq!(takeovers(&b, kind).await, 0.0, "{}", b.log_tail());
    }
    b.signal(Signal::TERM);
    assert!(b.wait_exit().await.success());
    stop(&mut a, cp).await;
}

/// This process's identity, as `replica`'s log states it at start-up.
fn identity_of(replica: &Replica, name: &str) -> String {
    let log = replica.log_text();
    let at = log
        .find(&format!("identity={name}_"))
        .unwrap_or_else(|| panic!("no identity in the log of {name}:\n{}", replica.log_tail()));
    let rest = &log[at + "identity=".len()..];
    let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The Lease renamed by hand to the standby while replica-a leads; the standby stops
/// (SIGTERM) while it still waits out replica-a's term, before it ever led. Its release must
/// not say `stopped`: the leader the rename displaced may still be sending until its own term
/// ends, and a `stopped` mark would let the next leader wait only the write timeout. The next
/// leader counts an `unknown` take-over instead, and no two nodes share a block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_renamed_holder_by_hand_that_stops_before_it_led_marks_nothing() {
    const FLAGS: &[&str] = &[
        "--lease-duration=15",
        "--lease-grace=5",
        "--kube-api-qps=200",
        "--kube-api-burst=200",
    ];
    let (solo, mut b) = Solo::serving_with_standby(FLAGS, "10.74.0.0/16", 24, "warm").await;
    let Solo {
        cp, admin, mut a, ..
    } = solo;
    let standby = identity_of(&b, "replica-b");
    displace(&admin, &standby).await;
    let waiting = "leadership gained on a lease that was missing or freed by hand";
    wait_for(
        "replica-b to take the renamed Lease and wait out a term",
        || async { b.log_text().contains(waiting).then_some(()) },
    )
    .await;
    b.signal(Signal::TERM);
    assert!(b.wait_exit().await.success(), "{}", b.log_tail());
    create_node(&admin, "after", &[]).await;
    wait_cidrs(&admin, "after").await;
    assert_eq!(lease_holder(&admin).await.as_deref(), Some("replica-a"));
    // replica-b never led: its release said nothing of replica-a, which takes the Lease
    // back and waits out a whole term (a `stopped` mark would have made it `unclean`).
    assert_eq!(takeovers(&a, "unknown").await, 1.0, "{}", a.log_tail());
    assert_eq!(takeovers(&a, "unclean").await, 0.0, "{}", a.log_tail());
    assert_invariant(&admin, &[]).await;
    a.signal(Signal::TERM);
    assert!(a.wait_exit().await.success());
    cp.stop().await;
}
