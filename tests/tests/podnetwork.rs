//! End-to-end tests of the published pod network: ordered add and remove proven by
//! resourceVersions, ip-masq-agent sync keeping user settings, and `nodeipam ranges` golden
//! output and errors.

mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use nodeipam_controller::reconcile::Options;
use nodeipam_crd::{Allocation, NodeIPAMConfig};
use support::record::record;
use support::*;

const NS: &str = "nodeipam-system";
const CM: &str = "nodeipam-pod-network";

fn cm_has(cm: &ConfigMap, key: &str, cidr: &str) -> bool {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .is_some_and(|v| v.split(',').any(|c| c == cidr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_add_publishes_a_range_before_its_first_block() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let (cms, _cms_recorder) = record(Api::<ConfigMap>::namespaced(c.clone(), NS));
    let (nodes, _nodes_recorder) = record(Api::<Node>::all(c.clone()));
    let _ctl = start_controller(c.clone(), publishing(None, &["169.254.0.0/16"]));
    // Nodes exist first, so allocation from the new config is immediately wanted.
    for i in 0..5 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    create_config(
        &c,
        "fresh",
        spec(family("10.60.0.0/16", 24), family("fd00:60::/48", 64), None),
    )
    .await;
    for i in 0..5 {
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    let cms = cms.lock().expect("lock").clone();
    let first_cm = cms
        .iter()
        .filter(|(_, _, cm)| {
            cm.name_any() == CM
                && cm_has(cm, "ipv4", "10.60.0.0/16")
                && cm_has(cm, "ipv6", "fd00:60::/48")
        })
        .map(|(rv, _, _)| *rv)
        .min()
        .expect("a ConfigMap revision with the new range");
    let first_node = nodes
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, _, n)| pod_cidrs(n).iter().any(|c| c.starts_with("10.60.")))
        .map(|(rv, _, _)| *rv)
        .min()
        .expect("a node revision with a block");
    assert!(
        first_cm < first_node,
        "the range was published at {first_cm}, after the first block at {first_node}"
    );
    let cm = Api::<ConfigMap>::namespaced(c.clone(), NS)
        .get(CM)
        .await
        .expect("configmap");
    let data = cm.data.unwrap_or_default();
    assert_eq!(
        data.get("active").map(String::as_str),
        Some("10.60.0.0/16,fd00:60::/48")
    );
    assert_eq!(
        data.get("aggregated").map(String::as_str),
        Some("10.60.0.0/16,fd00:60::/48")
    );
    assert!(data.get("observedAt").is_some_and(|t| t.ends_with('Z')));
    assert_invariant(&c, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_remove_keeps_a_range_until_drained() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let _ctl = start_controller(c.clone(), publishing(None, &["169.254.0.0/16"]));
    create_ready_config(
        &c,
        "old",
        spec(
            family("10.61.0.0/16", 24),
            None,
            selector(&[("pool", "In", &["old"])]),
        ),
    )
    .await;
    create_ready_config(&c, "keep", spec(family("10.62.0.0/16", 24), None, None)).await;
    create_node(&c, "o1", &[("pool", "old")]).await;
    wait_cidrs(&c, "o1").await;
    let (cms, _cms_recorder) = record(Api::<ConfigMap>::namespaced(c.clone(), NS));
    let (nodes, _nodes_recorder) = record(Api::<Node>::all(c.clone()));
    delete_config(&c, "old").await;
    wait_condition(&c, "old", "Drained", "False", Some("NodesRemaining")).await;
    wait_for("old listed as draining", || async {
        let cm = Api::<ConfigMap>::namespaced(c.clone(), NS)
            .get(CM)
            .await
            .ok()?;
        (cm_has(&cm, "draining", "10.61.0.0/16") && !cm_has(&cm, "active", "10.61.0.0/16"))
            .then_some(())
    })
    .await;
    delete_node(&c, "o1").await;
    wait_for("old to leave the pod network", || async {
        let cm = Api::<ConfigMap>::namespaced(c.clone(), NS)
            .get(CM)
            .await
            .ok()?;
        (!cm_has(&cm, "ipv4", "10.61.0.0/16") && cm_has(&cm, "ipv4", "10.62.0.0/16")).then_some(())
    })
    .await;
    let node_gone = nodes
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, deleted, n)| *deleted && n.name_any() == "o1")
        .map(|(rv, _, _)| *rv)
        .min()
        .expect("the node's delete event");
    let cms = cms.lock().expect("lock").clone();
    for (rv, _, cm) in &cms {
        if !cm_has(cm, "ipv4", "10.61.0.0/16") {
            assert!(
                *rv > node_gone,
                "the range left at {rv} while node o1 (gone at {node_gone}) still held a block"
            );
        }
    }
    wait_for("the config to be gone", || async {
        get_config(&c, "old").await.is_none().then_some(())
    })
    .await;
}

/// A config disabled until it drained, then enabled again: its status says Drained until the
/// controller writes otherwise, and consumers may act on that (forget the range). No block
/// may be handed out from it before the status stops saying Drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_enabled_config_is_no_longer_drained_before_its_first_block() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_ready_config(&c, "again", spec(family("10.61.0.0/16", 24), None, None)).await;
    set_allocation(&c, "again", Allocation::Disabled).await;
    wait_condition(&c, "again", "Drained", "True", None).await;
    let (configs, _configs_recorder) = record(Api::<NodeIPAMConfig>::all(c.clone()));
    let (nodes, _nodes_recorder) = record(Api::<Node>::all(c.clone()));
    // Nodes wait first, so a block is wanted the moment the config is enabled.
    for i in 0..3 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    set_allocation(&c, "again", Allocation::Enabled).await;
    for i in 0..3 {
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    wait_condition(&c, "again", "Drained", "False", None).await;
    let undrained = configs
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, _, cfg)| {
            cfg.spec.allocation == Allocation::Enabled
                && condition(cfg, "Drained").is_some_and(|(status, _)| status != "True")
        })
        .map(|(rv, _, _)| *rv)
        .min()
        .expect("a config revision that is no longer Drained");
    let first_node = nodes
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, _, n)| pod_cidrs(n).iter().any(|c| c.starts_with("10.61.")))
        .map(|(rv, _, _)| *rv)
        .min()
        .expect("a node revision with a block");
    assert!(
        undrained < first_node,
        "a node got a block (rv {first_node}) while the config still said Drained (until rv {undrained})"
    );
    assert_invariant(&c, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_masq_agent_is_kept_in_sync_with_user_settings() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    namespace(&c, "kube-system").await;
    let masq: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    let user = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some("ip-masq-agent".into()), ..Default::default() },
        data: Some(BTreeMap::from([
            ("config".to_string(), "nonMasqueradeCIDRs:\n- 1.2.3.0/24\nmasqLinkLocal: true\nmasqLinkLocalIPv6: false\nresyncInterval: 60s\n".to_string()),
            ("notes".to_string(), "owned by the platform team".to_string()),
        ])),
        ..Default::default()
    };
    masq.create(&PostParams::default(), &user)
        .await
        .expect("create ip-masq-agent ConfigMap");
    let _ctl = start_controller(
        c.clone(),
        publishing(Some("kube-system/ip-masq-agent"), &["169.254.0.0/16"]),
    );
    create_config(&c, "pods", spec(family("10.63.0.0/16", 24), None, None)).await;
    let config = |cm: &ConfigMap| -> serde_json::Value {
        serde_saphyr::from_str(
            cm.data
                .as_ref()
                .and_then(|d| d.get("config"))
                .map_or("", String::as_str),
        )
        .expect("config parses")
    };
    let list = |v: &serde_json::Value| -> Vec<String> {
        v["nonMasqueradeCIDRs"]
            .as_array()
            .map(|s| {
                s.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let cm = wait_for("ip-masq-agent to list the pod range", || async {
        let cm = masq.get("ip-masq-agent").await.ok()?;
        list(&config(&cm))
            .contains(&"10.63.0.0/16".to_string())
            .then_some(cm)
    })
    .await;
    let v = config(&cm);
    assert_eq!(
        list(&v),
        vec!["10.63.0.0/16".to_string(), "169.254.0.0/16".to_string()]
    );
    assert_eq!(v["masqLinkLocal"], serde_json::Value::Bool(true));
    assert_eq!(v["masqLinkLocalIPv6"], serde_json::Value::Bool(false));
    assert_eq!(v["resyncInterval"], serde_json::Value::String("60s".into()));
    assert_eq!(
        cm.data
            .as_ref()
            .and_then(|d| d.get("notes"))
            .map(String::as_str),
        Some("owned by the platform team")
    );
    // And back out once drained.
    delete_config(&c, "pods").await;
    wait_for("ip-masq-agent to drop the drained range", || async {
        let cm = masq.get("ip-masq-agent").await.ok()?;
        let v = config(&cm);
        (list(&v) == vec!["169.254.0.0/16".to_string()]
            && v["masqLinkLocal"] == serde_json::Value::Bool(true))
        .then_some(())
    })
    .await;
}

/// The `nodeipam` binary next to this test's build (`<target>/debug/nodeipam`).
fn nodeipam_bin() -> PathBuf {
    if let Ok(p) = std::env::var("NODEIPAM_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("test executable path");
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("nodeipam"))
        .expect("target dir");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p nodeipam-controller --bin nodeipam` (hack/test.sh does)",
        bin.display()
    );
    bin
}

fn ranges(kubeconfig: &std::path::Path, format: &str) -> (bool, String, String) {
    let out = std::process::Command::new(nodeipam_bin())
        .args(["ranges", "--kubeconfig"])
        .arg(kubeconfig)
        .args(["--format", format])
        .output()
        .expect("run nodeipam ranges");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn golden(name: &str, got: &str) {
    let path = nodeipam_testenv::workspace_root()
        .join("tests/tests/golden")
        .join(name);
    if std::env::var("UPDATE_GOLDEN").is_ok() {
        std::fs::write(&path, got).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (set UPDATE_GOLDEN=1 to create it)", path.display()));
    assert_eq!(got, want, "{name} differs from {}", path.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_command_golden_output() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let _ctl = start_controller(c.clone(), publishing(None, &["169.254.0.0/16"]));
    create_ready_config(
        &c,
        "dual",
        spec(
            family("10.100.0.0/16", 24),
            family("fd00:100::/48", 64),
            None,
        ),
    )
    .await;
    create_ready_config(
        &c,
        "gpu",
        spec(
            family("10.101.0.0/20", 24),
            None,
            selector(&[("gpu", "Exists", &[])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "retiring",
        spec(
            family("10.102.0.0/24", 26),
            None,
            selector(&[("old", "Exists", &[])]),
        ),
    )
    .await;
    create_node_obj(&c, node("legacy", &[], &["192.168.7.0/24"])).await;
    for (n, l) in [
        ("a", vec![]),
        ("b", vec![]),
        ("g", vec![("gpu", "1")]),
        ("r", vec![("old", "1")]),
    ] {
        create_node(&c, n, &l).await;
        wait_cidrs(&c, n).await;
    }
    delete_config(&c, "retiring").await;
    wait_condition(&c, "retiring", "Drained", "False", Some("NodesRemaining")).await;
    for name in ["dual", "gpu", "retiring"] {
        assert_status_matches(&c, name).await;
    }
    let kc = cp.kubeconfig_path().to_path_buf();
    for (format, file) in [
        ("table", "ranges.table.txt"),
        ("json", "ranges.json"),
        ("ip-masq-agent", "ranges.ip-masq-agent.yaml"),
        ("no-masquerade-cidrs", "ranges.no-masquerade-cidrs.yaml"),
    ] {
        let (ok, out, err) = ranges(&kc, format);
        assert!(ok, "ranges --format {format} failed: {err}");
        golden(file, &out);
    }
    let (ok, _, err) = ranges(&kc, "kube-proxy");
    assert!(!ok, "several IPv4 ranges cannot be one --cluster-cidr");
    assert!(err.contains("--detect-local-mode=NodeCIDR"), "{err}");
    // One range per family can.
    let api: Api<nodeipam_crd::NodeIPAMConfig> = Api::all(c.clone());
    for n in ["g", "r", "legacy"] {
        delete_node(&c, n).await;
    }
    api.delete("gpu", &Default::default())
        .await
        .expect("delete gpu");
    wait_for("only dual left", || async {
        let (ok, out, _) = ranges(&kc, "table");
        (ok && !out.contains("10.101.") && !out.contains("10.102.") && !out.contains("192.168."))
            .then_some(())
    })
    .await;
    let (ok, out, err) = ranges(&kc, "kube-proxy");
    assert!(ok, "{err}");
    assert_eq!(out, "--cluster-cidr=10.100.0.0/16,fd00:100::/48\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_command_errors_are_clear() {
    let cp = nodeipam_testenv::ControlPlane::builder()
        .install_crds(false)
        .start()
        .await
        .expect("control plane");
    let (ok, _, err) = ranges(cp.kubeconfig_path(), "table");
    assert!(!ok);
    assert!(
        err.contains("CRD") && err.contains("not installed"),
        "{err}"
    );
    // A kubeconfig pointing at a port nobody listens on.
    let dir = tempfile::tempdir().expect("tempdir");
    let dead = dir.path().join("kubeconfig");
    let text = std::fs::read_to_string(cp.kubeconfig_path()).expect("kubeconfig");
    let port = cp
        .server_url()
        .rsplit(':')
        .next()
        .expect("port")
        .to_string();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    std::fs::write(
        &dead,
        text.replace(&format!(":{port}"), &format!(":{closed}")),
    )
    .expect("write");
    let (ok, _, err) = ranges(&dead, "table");
    assert!(!ok);
    assert!(
        err.contains("cannot reach the Kubernetes API server"),
        "{err}"
    );
}

/// Warning events with `reason` about any object.
async fn warnings(c: &kube::Client, reason: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(c.clone());
    let list = api.list(&Default::default()).await.expect("list events");
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .map(|e| {
            let who = e.regarding.and_then(|r| r.name).unwrap_or_default();
            format!("{who}: {}", e.note.unwrap_or_default())
        })
        .collect()
}

/// Waits a little for events still on their way, then fails if any says CIDRNotAvailable.
async fn assert_no_cidr_warnings(c: &kube::Client) {
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let found = warnings(c, "CIDRNotAvailable").await;
    assert!(
        found.is_empty(),
        "nodes that only waited behind a start-up gate were warned: {} events, e.g. {:?}",
        found.len(),
        found.iter().take(3).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_wait_only_behind_start_up_gates_get_no_warning() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    // As a new user has it: the config has no finalizer yet, nothing is published yet, and
    // the nodes are there before the controller starts.
    create_config(&c, "pods", spec(family("10.61.0.0/16", 24), None, None)).await;
    for i in 0..60 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    let _ctl = start_controller(c.clone(), publishing(None, &[]));
    for i in 0..60 {
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    assert_no_cidr_warnings(&c).await;
    assert_invariant(&c, &[]).await;
}

/// A first install as `kubectl apply` makes it: the controller is up and has read the nodes a
/// moment before the config that selects them is created. They wait for no reason an operator
/// must act on, and a Warning must mean that something is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_whose_config_comes_moments_after_them_get_no_warning() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    for i in 0..60 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    let ctl = start_controller(c.clone(), publishing(None, &[]));
    wait_for("the controller to hold the 60 nodes as pending", || {
        let metrics = ctl.metrics.encode();
        async move { metrics.contains("nodeipam_pending_nodes 60").then_some(()) }
    })
    .await;
    create_config(&c, "pods", spec(family("10.63.0.0/16", 24), None, None)).await;
    for i in 0..60 {
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    assert_no_cidr_warnings(&c).await;
    assert_invariant(&c, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_onto_new_and_overlapping_configs_warns_nobody() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let _ctl = start_controller(c.clone(), publishing(None, &[]));
    create_config(&c, "older", spec(family("10.62.0.0/16", 24), None, None)).await;
    create_config(&c, "younger", spec(family("10.62.0.0/17", 24), None, None)).await;
    let creates = (0..60).map(|i| {
        let c = c.clone();
        async move { create_node(&c, &format!("b{i}"), &[]).await }
    });
    futures::future::join_all(creates).await;
    for i in 0..60 {
        let got = wait_cidrs(&c, &format!("b{i}")).await;
        assert!(got[0].starts_with("10.62."), "{got:?}");
    }
    assert_no_cidr_warnings(&c).await;
    assert_invariant(&c, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_network_configmap_is_written_only_when_its_content_changes() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let (cms, _recorder) = record(Api::<ConfigMap>::namespaced(c.clone(), NS));
    let ctl = start_controller(c.clone(), publishing(None, &[]));
    create_config(&c, "pods", spec(family("10.63.0.0/16", 24), None, None)).await;
    let creates = (0..120).map(|i| {
        let c = c.clone();
        async move { create_node(&c, &format!("w{i}"), &[]).await }
    });
    futures::future::join_all(creates).await;
    for i in 0..120 {
        wait_cidrs(&c, &format!("w{i}")).await;
    }
    // Time for any late rewrite (the status flushes every 200 ms) to show.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let log = cms.lock().expect("log").clone();
    let versions: Vec<BTreeMap<String, String>> = log
        .iter()
        .filter(|(_, deleted, cm)| !deleted && cm.name_any() == CM)
        .map(|(_, _, cm)| {
            let mut data = cm.data.clone().unwrap_or_default();
            data.remove("observedAt");
            data
        })
        .collect();
    assert!(!versions.is_empty(), "the pod network was never published");
    let unchanged: Vec<&BTreeMap<String, String>> = versions
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| &w[1])
        .collect();
    assert!(
        unchanged.is_empty(),
        "{} of {} writes of {CM} changed nothing but observedAt, e.g. {:?}",
        unchanged.len(),
        versions.len(),
        unchanged.first()
    );
    // The size gauge tells what the ConfigMap holds, against the API server's limit.
    let written = Api::<ConfigMap>::namespaced(c.clone(), NS)
        .get(CM)
        .await
        .expect("the pod network")
        .data
        .unwrap_or_default();
    let bytes: usize = written.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(bytes > 0);
    let gauge = format!("nodeipam_pod_network_configmap_bytes {bytes}\n");
    assert!(ctl.metrics.encode().contains(&gauge), "{gauge}");
    assert_invariant(&c, &[]).await;
}

/// A cluster moving from kcm: tens of thousands of nodes hold podCIDRs that no config covers
/// yet. Each is part of the pod network, but listed one by one they pass the API server's
/// 1 MiB limit on a ConfigMap, and the pod network could not be published at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_unmanaged_pod_cidrs_still_fit_the_published_configmap() {
    use futures::StreamExt;
    use ipnet::IpNet;
    const NODES: u32 = 17_000;
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    // Dual-stack blocks, adjacent as kcm hands them out: a /28 of 10.0.0.0/12 and a /64 of
    // fd00:77::/48 each, 64 bytes of ConfigMap per node when listed one by one.
    let blocks = |i: u32| {
        let v4 = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + i * 16);
        [format!("{v4}/28"), format!("fd00:77:0:{i:x}::/64")]
    };
    futures::stream::iter(0..NODES)
        .map(|i| {
            let c = c.clone();
            let [v4, v6] = blocks(i);
            async move {
                let n = node(&format!("kcm-{i:05}"), &[], &[&v4, &v6]);
                Api::<Node>::all(c)
                    .create(&PostParams::default(), &n)
                    .await
                    .expect("create node")
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    let _ctl = start_controller(c.clone(), publishing(None, &[]));
    let held: Vec<IpNet> = (0..NODES)
        .flat_map(blocks)
        .map(|b| b.parse().expect("cidr"))
        .collect();
    let cms = Api::<ConfigMap>::namespaced(c.clone(), NS);
    let data = wait_for("the pod network published with every held block", || {
        let cms = cms.clone();
        let held = held.clone();
        async move {
            let data = cms.get_opt(CM).await.ok()??.data?;
            let listed = |key: &str| -> Vec<IpNet> {
                data.get(key)
                    .into_iter()
                    .flat_map(|v| v.split(',').filter_map(|c| c.parse().ok()))
                    .collect()
            };
            let all: Vec<IpNet> = listed("ipv4").into_iter().chain(listed("ipv6")).collect();
            let unmanaged = listed("unmanaged");
            let covers =
                |list: &[IpNet]| held.iter().all(|b| nodeipam_crd::range::covered(b, list));
            (covers(&all) && covers(&unmanaged)).then_some(data)
        }
    })
    .await;
    let size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(
        size < 4096,
        "the held blocks merge into a few ranges: {data:?}"
    );
}
