//! Smoke tests of the harness against the real etcd and kube-apiserver: version, Node podCIDR
//! rules, authentication and RBAC, CRD installation, webhook registration, parallel starts,
//! clean-up, the `control-plane` runner, the error for missing binaries, and restarting the
//! API server on the same etcd.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use nodeipam_testenv::{ControlPlane, HarnessError, K8S_VERSION, Step};
use serde_json::json;

async fn start() -> ControlPlane {
    let cp = match ControlPlane::builder().install_crds(false).start().await {
        Ok(cp) => cp,
        Err(e) => panic!("control plane did not start: {e}"),
    };
    let t = cp.startup_timings();
    eprintln!(
        "control plane {} ready in {:.2}s (etcd {:.2}s, kube-apiserver {:.2}s, {} attempt(s))",
        cp.server_url(),
        t.total.as_secs_f64(),
        t.etcd.as_secs_f64(),
        t.apiserver.as_secs_f64(),
        t.attempts
    );
    cp
}

fn api_error(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(status) => status,
        other => panic!("expected an API error, got {other}"),
    }
}

/// Retries `f` until it returns `Some` (RBAC and webhook changes reach the API server's caches
/// a moment after the write).
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn version_and_node_pod_cidrs() {
    let cp = start().await;
    let client = cp.client();

    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, K8S_VERSION);
    assert_eq!(version.git_version, "v1.37.2");
    let out = std::process::Command::new(cp.assets_dir().join("kube-apiserver"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "Kubernetes v1.37.2"
    );

    let nodes: Api<Node> = Api::all(client);
    let node = Node {
        metadata: ObjectMeta {
            name: Some("smoke-a".into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await.unwrap();

    let set = json!({"spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24", "fd00::/64"]}});
    nodes
        .patch("smoke-a", &PatchParams::default(), &Patch::Merge(&set))
        .await
        .unwrap();
    let spec = nodes.get("smoke-a").await.unwrap().spec.unwrap();
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.1.0.0/24"));
    assert_eq!(
        spec.pod_cidrs.unwrap(),
        vec!["10.1.0.0/24".to_string(), "fd00::/64".to_string()]
    );

    let change =
        json!({"spec": {"podCIDR": "10.2.0.0/24", "podCIDRs": ["10.2.0.0/24", "fd00::/64"]}});
    let err = nodes
        .patch("smoke-a", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap_err();
    let status = api_error(err);
    assert_eq!(status.code, 422, "{status:?}");
    assert_eq!(status.reason, "Invalid", "{status:?}");
    assert!(
        status.message.contains("podCIDR") && status.message.contains("may not change"),
        "{}",
        status.message
    );
    // Unchanged after the refusal.
    let spec = nodes.get("smoke-a").await.unwrap().spec.unwrap();
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.1.0.0/24"));
}

#[tokio::test]
async fn authentication_and_rbac() {
    let cp = start().await;
    let admin = cp.client();
    let list = ListParams::default();
    Api::<Node>::all(admin.clone()).list(&list).await.unwrap();

    let alice = cp.client_for("alice", &[]).await.unwrap();
    let status = api_error(Api::<Node>::all(alice).list(&list).await.unwrap_err());
    assert_eq!(status.code, 403, "{status:?}");
    assert!(status.message.contains("\"alice\""), "{}", status.message);

    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some("node-reader".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..PolicyRule::default()
        }]),
        ..ClusterRole::default()
    };
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("node-readers".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "node-reader".into(),
        },
        subjects: Some(vec![
            Subject {
                kind: "User".into(),
                name: "bob".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Subject::default()
            },
            Subject {
                kind: "Group".into(),
                name: "readers".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                ..Subject::default()
            },
        ]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // Impersonation: the admin acting as bob gets bob's permissions.
    let bob = cp.impersonating("bob", &[]).unwrap();
    let bob_nodes = &Api::<Node>::all(bob);
    let list_ref = &list;
    eventually("bob may list nodes", || async move {
        bob_nodes.list(list_ref).await.ok()
    })
    .await;
    // ...and no more than that.
    let status = api_error(
        Api::<ClusterRole>::all(cp.impersonating("bob", &[]).unwrap())
            .list(&list)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 403);

    // A client certificate with several groups: the second O= grants the access.
    let carol = cp.client_for("carol", &["other", "readers"]).await.unwrap();
    let carol_nodes = &Api::<Node>::all(carol);
    eventually("carol (group readers) may list nodes", || async move {
        carol_nodes.list(list_ref).await.ok()
    })
    .await;

    // Alice is still refused: the binding is not for her.
    let alice = cp.client_for("alice", &[]).await.unwrap();
    let status = api_error(Api::<Node>::all(alice).list(&list).await.unwrap_err());
    assert_eq!(status.code, 403);

    // A child process with a written kubeconfig runs as that identity.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("carol.kubeconfig");
    cp.write_kubeconfig_for("carol", &["other", "readers"], &kubeconfig)
        .unwrap();
    let out = cp
        .kubectl()
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["auth", "whoami", "-o", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let whoami: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(whoami["status"]["userInfo"]["username"], "carol");
    let groups = whoami["status"]["userInfo"]["groups"].to_string();
    assert!(
        groups.contains("other") && groups.contains("readers"),
        "{groups}"
    );

    // The admin kubeconfig works for kubectl as-is.
    let out = cp
        .kubectl()
        .args(["get", "namespaces", "-o", "name"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/kube-system"));
}

const WIDGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.nodeipam.test
spec:
  group: smoke.nodeipam.test
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
"#;

/// `(group, served versions, plural)` of every CRD in the YAML files of `dir`.
fn crds_in(dir: &Path) -> Vec<(String, Vec<String>, String)> {
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for v in nodeipam_testenv::yaml::documents(&text).unwrap() {
            let spec = &v["spec"];
            let versions = spec["versions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|v| v["served"] == true)
                .map(|v| v["name"].as_str().unwrap().to_string())
                .collect();
            out.push((
                spec["group"].as_str().unwrap().to_string(),
                versions,
                spec["names"]["plural"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

async fn assert_in_discovery(client: &kube::Client, group: &str, version: &str, plural: &str) {
    let list = client
        .list_api_group_resources(&format!("{group}/{version}"))
        .await
        .unwrap();
    assert!(
        list.resources.iter().any(|r| r.name == plural),
        "{group}/{version} does not list {plural}"
    );
}

#[tokio::test]
async fn crd_installation() {
    // The default start installs the project's CRDs from config/crd/bases when they exist.
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.client();
    let project = nodeipam_testenv::crd_dir();
    if project.is_dir() {
        let crds = crds_in(&project);
        assert!(!crds.is_empty(), "{} has no CRDs", project.display());
        for (group, versions, plural) in &crds {
            for version in versions {
                assert_in_discovery(&client, group, version, plural).await;
            }
        }
        eprintln!("project CRDs served: {crds:?}");
    } else {
        eprintln!(
            "NOTE: {} does not exist yet: only the test's own CRD is checked",
            project.display()
        );
    }

    // A CRD of our own, so this test does not depend on the project's.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("widgets.yaml"), WIDGET_CRD).unwrap();
    let names = cp.install_crds(dir.path()).await.unwrap();
    assert_eq!(names, vec!["widgets.smoke.nodeipam.test".to_string()]);
    assert_in_discovery(&client, "smoke.nodeipam.test", "v1", "widgets").await;

    // Served right away: an object can be created and read back without waiting.
    let gvk = GroupVersionKind::gvk("smoke.nodeipam.test", "v1", "Widget");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut widget = DynamicObject::new("w1", &resource);
    widget.data = json!({"spec": {"size": 3}});
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    let back = widgets.get("w1").await.unwrap();
    assert_eq!(back.data["spec"]["size"], 3);

    // Installing again is an idempotent apply.
    cp.install_crds(dir.path()).await.unwrap();

    // A folder with something other than CRDs is refused, naming the step.
    std::fs::write(
        dir.path().join("zz-configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    )
    .unwrap();
    let err = cp.install_crds(dir.path()).await.unwrap_err();
    assert_eq!(err.step(), Step::InstallCrds);
    assert!(err.to_string().contains("zz-configmap.yaml"), "{err}");
}

#[tokio::test]
async fn validating_webhook_registration() {
    let cp = start().await;
    let nodes: &Api<Node> = &Api::all(cp.client());
    // Nothing listens here: a Fail policy must refuse, an Ignore policy must let through.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("https://127.0.0.1:{closed}/validate");
    let rules = || {
        vec![RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec!["CREATE".into()]),
            resources: Some(vec!["nodes".into()]),
            scope: Some("*".into()),
        }]
    };
    let name = "nodes.smoke.nodeipam.test";
    cp.register_validating_webhook(name, &url, cp.ca_pem().as_bytes(), rules(), "Fail")
        .await
        .unwrap();
    let node = &|n: &str| Node {
        metadata: ObjectMeta {
            name: Some(n.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    let status = eventually("the webhook refuses node creation", || async move {
        match nodes.create(&PostParams::default(), &node("refused")).await {
            Err(kube::Error::Api(status)) => Some(status),
            Ok(_) => {
                // Created before the webhook took effect: clean up and retry.
                let _ = nodes.delete("refused", &Default::default()).await;
                None
            }
            Err(_) => None,
        }
    })
    .await;
    assert!(status.message.contains(name), "{}", status.message);

    cp.register_validating_webhook(name, &url, cp.ca_pem().as_bytes(), rules(), "Ignore")
        .await
        .unwrap();
    eventually("an Ignore policy lets nodes through", || async move {
        nodes
            .create(&PostParams::default(), &node("allowed"))
            .await
            .ok()
    })
    .await;

    let err = cp
        .register_validating_webhook(name, &url, b"", rules(), "Maybe")
        .await
        .unwrap_err();
    assert_eq!(err.step(), Step::RegisterWebhook);
}

#[tokio::test]
async fn parallel_control_planes_are_isolated_and_cleaned_up() {
    let (a, b) = tokio::join!(start(), start());
    assert_ne!(a.server_url(), b.server_url());
    assert_ne!(a.etcd_url(), b.etcd_url());
    assert_ne!(a.dir(), b.dir());

    // An object in one is not in the other.
    let ns = |n: &str| k8s_openapi::api::core::v1::Namespace {
        metadata: ObjectMeta {
            name: Some(n.into()),
            ..ObjectMeta::default()
        },
        ..Default::default()
    };
    Api::all(a.client())
        .create(&PostParams::default(), &ns("only-in-a"))
        .await
        .unwrap();
    let in_b = Api::<k8s_openapi::api::core::v1::Namespace>::all(b.client())
        .get_opt("only-in-a")
        .await
        .unwrap();
    assert!(in_b.is_none());

    // Drop kills both servers and removes the temp folder.
    let dir = a.dir().to_path_buf();
    let port: u16 = a.server_url().rsplit(':').next().unwrap().parse().unwrap();
    assert!(dir.join("admin.kubeconfig").is_file());
    drop(a);
    assert!(!dir.exists(), "{} still exists", dir.display());
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());

    // stop() is the graceful way, with the same clean-up.
    let dir = b.dir().to_path_buf();
    let began = Instant::now();
    b.stop().await;
    eprintln!("graceful stop took {:.2}s", began.elapsed().as_secs_f64());
    assert!(!dir.exists());
}

#[tokio::test]
async fn control_plane_runner_publishes_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let crds = tempfile::tempdir().unwrap();
    std::fs::write(crds.path().join("widgets.yaml"), WIDGET_CRD).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_control-plane"))
        .arg("--dir")
        .arg(dir.path())
        .arg("--crds")
        .arg(crds.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !kubeconfig.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("runner exited ({status}) before writing the kubeconfig:\n{err}");
        }
        assert!(Instant::now() < deadline, "no kubeconfig after 90s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The published kubeconfig works, and the CRDs were installed before it appeared.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    assert_eq!(
        client.apiserver_version().await.unwrap().git_version,
        K8S_VERSION
    );
    assert_in_discovery(&client, "smoke.nodeipam.test", "v1", "widgets").await;
    assert!(dir.path().join("logs/kube-apiserver.log").is_file());
    assert!(dir.path().join("logs/etcd.log").is_file());

    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "runner still running 30s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");
    assert!(!kubeconfig.exists(), "kubeconfig left behind after stop");
    // The folder itself is the user's: kept, with its logs.
    assert!(dir.path().join("logs/kube-apiserver.log").is_file());
    assert!(client.apiserver_version().await.is_err());
}

/// Paths come from the checkout that runs, not from where the runner was compiled: with
/// `NODEIPAM_ROOT` (which hack/lib.sh exports) pointing at another tree, the runner installs
/// that tree's `config/crd/bases`, here a Widget CRD instead of NodeIPAMConfig.
#[tokio::test]
async fn control_plane_runner_takes_its_crds_from_nodeipam_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let bases = root.path().join("config/crd/bases");
    std::fs::create_dir_all(&bases).unwrap();
    std::fs::write(bases.join("widgets.yaml"), WIDGET_CRD).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_control-plane"))
        .arg("--dir")
        .arg(dir.path())
        .env("NODEIPAM_ROOT", root.path())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !kubeconfig.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("runner exited ({status}) before writing the kubeconfig");
        }
        assert!(Instant::now() < deadline, "no kubeconfig after 90s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    assert_in_discovery(&client, "smoke.nodeipam.test", "v1", "widgets").await;
    let groups = client.list_api_groups().await.unwrap();
    assert!(
        !groups.groups.iter().any(|g| g.name == "nodeipam.io"),
        "the runner installed the CRDs of the tree it was compiled in"
    );
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("runner stops within 30s of SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn missing_binaries_name_the_step_and_the_fix() {
    let missing = Path::new("/nonexistent/nodeipam-assets");
    let err: HarnessError = ControlPlane::builder()
        .assets_dir(missing)
        .start()
        .await
        .err()
        .expect("start must fail without binaries");
    assert_eq!(err.step(), Step::LocateBinaries);
    let text = err.to_string();
    assert!(text.contains("locate binaries"), "{text}");
    assert!(text.contains("etcd"), "{text}");
    assert!(text.contains("/nonexistent/nodeipam-assets"), "{text}");
    assert!(text.contains("hack/control-plane.sh build"), "{text}");
}

#[tokio::test]
async fn apiserver_failure_names_step_binary_and_log() {
    let err = ControlPlane::builder()
        .install_crds(false)
        .apiserver_arg("--no-such-flag=1")
        .start()
        .await
        .err()
        .expect("an unknown flag must stop kube-apiserver");
    assert_eq!(err.step(), Step::WaitReadyz, "{err}");
    assert_eq!(err.binary(), Some("kube-apiserver"));
    let log = err.log_path().expect("a log path").to_path_buf();
    let text = err.to_string();
    assert!(
        text.contains("wait /readyz") && text.contains("exited early"),
        "{text}"
    );
    assert!(text.contains(&log.display().to_string()), "{text}");
    // The tail of the log is in the message, and the log is kept for reading.
    assert!(text.contains("no-such-flag"), "{text}");
    assert!(log.is_file());
    let dir = log.parent().and_then(Path::parent).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn apiserver_restart_keeps_data_url_and_clients() {
    let mut cp = start().await;
    let admin = cp.client();
    // A client made before the restart, with its own certificate.
    let alice = cp
        .client_for("alice", &["system:masters"])
        .await
        .expect("client for alice");
    let url = cp.server_url().to_string();
    let nodes: Api<Node> = Api::all(admin.clone());
    let mut survivor = Node::default();
    survivor.metadata.name = Some("survivor".into());
    nodes
        .create(&PostParams::default(), &survivor)
        .await
        .expect("create node");

    cp.stop_apiserver().await;
    cp.check_running()
        .expect("a stopped kube-apiserver is not a crash");
    match nodes.get("survivor").await {
        Err(kube::Error::Api(s)) => panic!("no API server should answer, got {s:?}"),
        Err(_) => {}
        Ok(_) => panic!("the API server answered while stopped"),
    }

    cp.restart_apiserver()
        .await
        .unwrap_or_else(|e| panic!("restart: {e}"));
    assert_eq!(cp.server_url(), url, "same URL");
    // etcd kept the data; the old clients reconnect to the same URL with the same CA.
    let got = eventually("the node through the admin client", || async {
        nodes.get("survivor").await.ok()
    })
    .await;
    assert_eq!(got.metadata.name.as_deref(), Some("survivor"));
    Api::<Node>::all(alice)
        .get("survivor")
        .await
        .expect("alice's client works after the restart");

    // Restarting a running API server stops it first.
    cp.restart_apiserver()
        .await
        .unwrap_or_else(|e| panic!("second restart: {e}"));
    cp.check_running().expect("both still running");
    nodes
        .get("survivor")
        .await
        .expect("the node after the second restart");
    let log = std::fs::read_to_string(cp.log_dir().join("kube-apiserver.log")).expect("log");
    assert!(
        log.contains("restarting kube-apiserver"),
        "restarts are marked in the log"
    );
    cp.stop().await;
}

#[tokio::test]
async fn a_panicking_test_keeps_the_folder_with_its_logs() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let cp = start().await;
        let _ = tx.send(cp.dir().to_path_buf());
        panic!("deliberate failure while the control plane is up");
    });
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    let dir = rx.await.unwrap();
    assert!(
        dir.join("logs/kube-apiserver.log").is_file(),
        "{}",
        dir.display()
    );
    assert!(dir.join("logs/etcd.log").is_file());
    assert!(dir.join("admin.kubeconfig").is_file());
    // The bulky etcd data is not kept.
    assert!(!dir.join("etcd-data").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
