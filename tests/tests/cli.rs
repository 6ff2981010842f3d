//! End-to-end tests of `kubectl nodeipam`, the plugin binary run as a process with a
//! kubeconfig against the real API server, beside the real `nodeipam` controller binary:
//! `status` (leader, usage, pending nodes and why, the published outputs), `ranges` (what
//! `nodeipam ranges` prints), plugin discovery and completion by kubectl, and `check`, which reports every
//! inconsistency made by hand while the controller is stopped and none once it is fixed.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use nodeipam_crd::{Allocation, NodeIPAMConfig};
use nodeipam_testenv::ControlPlane;
use rustix::process::Signal;
use serde_json::json;
use support::process::{NAMESPACE, Replica, install_rbac, nodeipam_bin, plugin_bin};
use support::*;

/// What a run of the plugin gave: exit code, stdout, stderr.
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

/// Runs `kubectl-nodeipam <args>` with the admin kubeconfig and nothing else of this
/// process's environment.
async fn plugin(cp: &ControlPlane, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(plugin_bin())
        .env_clear()
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("step=run-plugin: kubectl-nodeipam {args:?}: {e}"));
    Run {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the plugin until `done` accepts what it printed; returns that run.
async fn plugin_until(
    cp: &ControlPlane,
    args: &[&str],
    what: &str,
    done: impl Fn(&Run) -> bool,
) -> Run {
    let mut last = None;
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let run = plugin(cp, args).await;
            if done(&run) {
                return run;
            }
            last = Some(format!("exit {:?}\n{}{}", run.code, run.out, run.err));
            // A process per try: no need to spin.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}; last run:\n{}",
            last.unwrap_or_default()
        )
    })
}

/// The line of `text` that starts with `first` (a table row by its first column).
fn row<'a>(text: &'a str, first: &str) -> &'a str {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{text}"))
}

/// Waits until replica `name` holds the Lease; returns its identity there (the name, `_`, a
/// suffix of its process).
async fn wait_leader(cp: &ControlPlane, name: &str) -> String {
    let api: Api<Lease> = Api::namespaced(cp.client(), NAMESPACE);
    wait_for(&format!("{name} to hold the Lease"), || async {
        let lease = api.get_opt("nodeipam-controller").await.ok()??;
        let holder = lease.spec?.holder_identity?;
        holder.starts_with(&format!("{name}_")).then_some(holder)
    })
    .await
}

/// `status` shows the leader, each config's usage, the node no config has room for with the
/// controller's reason, and the published ConfigMap current; `ranges` prints what `nodeipam
/// ranges` does, also when kubectl finds the plugin on PATH; kubectl completes its words
/// through the completer link; `check` is clean; a context not in the kubeconfig is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_ranges_and_a_clean_check_beside_a_running_controller() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let _replica = Replica::start(&cp, dir.path(), "cli-0", &[]).await;
    let identity = wait_leader(&cp, "cli-0").await;
    let admin = cp.client();
    let worker = selector(&[("role", "In", &["worker"])]);
    let gpu = selector(&[("pool", "In", &["gpu"])]);
    create_ready_config(
        &admin,
        "general",
        spec(family("10.100.0.0/16", 24), None, worker),
    )
    .await;
    create_ready_config(&admin, "gpu", spec(family("10.200.0.0/24", 24), None, gpu)).await;
    for (name, labels) in [
        ("w1", [("role", "worker")]),
        ("w2", [("role", "worker")]),
        ("g1", [("pool", "gpu")]),
        ("g2", [("pool", "gpu")]),
    ] {
        create_node(&admin, name, &labels).await;
    }
    for name in ["w1", "w2"] {
        wait_cidrs(&admin, name).await;
    }
    // g1 and g2 race for gpu's one block; the other waits.
    let (holder, waiting) = wait_for("one gpu node to get the block", || async {
        let g1 = get_node(&admin, "g1").await.map(|n| pod_cidrs(&n))?;
        let g2 = get_node(&admin, "g2").await.map(|n| pod_cidrs(&n))?;
        match (g1.is_empty(), g2.is_empty()) {
            (false, true) => Some(("g1", "g2")),
            (true, false) => Some(("g2", "g1")),
            _ => None,
        }
    })
    .await;
    assert_status_matches(&admin, "general").await;
    assert_status_matches(&admin, "gpu").await;

    let status = plugin_until(
        &cp,
        &["status"],
        "status to show the outputs current",
        |r| {
            r.code == Some(0)
                && r.out.lines().any(|l| {
                    l.split_whitespace().collect::<Vec<_>>()
                        == ["nodeipam-system/nodeipam-pod-network", "yes", "yes", "-"]
                })
        },
    )
    .await
    .out;
    let leader = row(&status, &identity);
    assert!(
        leader.contains("nodeipam-system/nodeipam-controller"),
        "{status}"
    );
    let general: Vec<&str> = row(&status, "general").split_whitespace().collect();
    assert_eq!(
        general,
        [
            "general",
            "10.100.0.0/16",
            "-",
            "2",
            "2/256",
            "True",
            "False"
        ],
        "{status}"
    );
    assert!(row(&status, "gpu").contains("1/1"), "{status}");
    let pending = row(&status, waiting);
    assert!(
        pending.contains("gpu") && pending.contains("no matching NodeIPAMConfig has a free block"),
        "{status}"
    );
    assert!(
        !status.contains(&format!("\n{holder} ")),
        "{holder} is not pending:\n{status}"
    );

    let json = plugin(&cp, &["status", "-o", "json"]).await;
    let v: serde_json::Value =
        serde_json::from_str(&json.out).unwrap_or_else(|e| panic!("{e}: {}", json.out));
    assert_eq!(v["leader"]["holder"], identity.as_str());
    assert_eq!(v["leader"]["lease"], "nodeipam-system/nodeipam-controller");
    assert!(v["leader"]["leaseTransitions"].is_number(), "{v}");
    assert!(v["leader"]["renewTime"].is_string(), "{v}");
    assert_eq!(v["configs"][0]["ipv4Usage"]["allocated"], 2);
    assert_eq!(v["pending"][0]["node"], waiting);
    assert_eq!(v["outputs"][0]["current"], true);
    let yaml = plugin(&cp, &["status", "-o", "yaml"]).await;
    let y: serde_json::Value = serde_saphyr::from_str(&yaml.out).expect("status -o yaml parses");
    assert_eq!(y["pending"][0]["selectedBy"][0], "gpu");

    // ranges: the same bytes as the controller binary's own command.
    let kubeconfig = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    let ours = tokio::process::Command::new(nodeipam_bin())
        .env_clear()
        .args(["ranges", &kubeconfig, "-o", "wide"])
        .output()
        .await
        .expect("run nodeipam ranges");
    let ranges = plugin(&cp, &["ranges", "-o", "wide"]).await;
    assert_eq!(ranges.code, Some(0), "{}", ranges.err);
    assert_eq!(ranges.out, String::from_utf8_lossy(&ours.stdout));
    assert!(
        ranges.out.contains("10.200.0.0/24") && ranges.out.contains("100.0%"),
        "{}",
        ranges.out
    );
    // kubectl finds the plugin on PATH and hands it the arguments after its name; the
    // plugin reads $KUBECONFIG as kubectl does.
    let plugin_dir = plugin_bin()
        .parent()
        .map(Path::to_path_buf)
        .expect("plugin folder");
    let kubectl = cp.kubectl().get_program().to_os_string();
    let out = tokio::process::Command::new(kubectl)
        .env_clear()
        .env("PATH", &plugin_dir)
        .env("KUBECONFIG", cp.kubeconfig_path())
        .args(["nodeipam", "ranges", "-o", "wide"])
        .output()
        .await
        .expect("run kubectl nodeipam");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        ranges.out,
        "kubectl nodeipam: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // `kubectl nodeipam <TAB>`: kubectl asks kubectl_complete-nodeipam, a link to the plugin.
    let links = dir.path().join("bin");
    std::fs::create_dir(&links).expect("step=link-completer: mkdir");
    std::os::unix::fs::symlink(plugin_bin(), links.join("kubectl-nodeipam"))
        .expect("step=link-completer: plugin");
    std::os::unix::fs::symlink(plugin_bin(), links.join("kubectl_complete-nodeipam"))
        .expect("step=link-completer: completer");
    let kubectl = cp.kubectl().get_program().to_os_string();
    let complete = |words: &'static [&'static str]| {
        let kubectl = kubectl.clone();
        let links = links.clone();
        async move {
            let out = tokio::process::Command::new(kubectl)
                .env_clear()
                .env("PATH", &links)
                .arg("__completeNoDesc")
                .args(words)
                .output()
                .await
                .expect("run kubectl __complete");
            String::from_utf8_lossy(&out.stdout).into_owned()
        }
    };
    assert_eq!(complete(&["nodeipam", "ch"]).await, "check\n:4\n");
    assert_eq!(
        complete(&["nodeipam", "status", "-o", ""]).await,
        "table\nwide\njson\nyaml\n:4\n"
    );

    let clean = plugin_until(&cp, &["check"], "a clean check", |r| r.code == Some(0)).await;
    assert!(
        clean
            .out
            .starts_with("No inconsistencies: 4 node(s), 2 NodeIPAMConfig(s)"),
        "{}",
        clean.out
    );
    let json = plugin(&cp, &["check", "-o", "json"]).await;
    assert_eq!(
        (json.code, json.out.trim()),
        (Some(0), "[]"),
        "{}",
        json.err
    );

    let missing = plugin(&cp, &["status", "--context=missing"]).await;
    assert_eq!(missing.code, Some(2), "{}", missing.out);
    assert!(
        missing.err.contains("missing"),
        "the context is named: {}",
        missing.err
    );
    let completion = plugin(&cp, &["completion", "bash"]).await;
    assert!(
        completion.code == Some(0)
            && completion.out.contains("kubectl-nodeipam")
            && completion.out.contains("check"),
        "{}",
        completion.out
    );
    cp.stop().await;
}

/// Writes `status` fields of a config by hand, as only the controller should.
async fn patch_status(cp: &ControlPlane, name: &str, status: serde_json::Value) {
    Api::<NodeIPAMConfig>::all(cp.client())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("step=patch-status: {name}: {e}"));
}

/// With the controller stopped, each inconsistency is made by hand: a node created with
/// another's podCIDR, one inside the Service range, one in no config, a config's allocated
/// count raised, the published ConfigMap edited to miss a range, and `Drained=True` written on
/// a disabled config whose node still holds a block. `check` reports each, one line apiece,
/// exit 1, in JSON too; once the nodes are gone and the controller has rewritten what it owns,
/// it reports none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_each_inconsistency_made_by_hand_and_none_once_fixed() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let mut replica = Replica::start(&cp, dir.path(), "cli-0", &[]).await;
    wait_leader(&cp, "cli-0").await;
    let admin = cp.client();
    let old = selector(&[("role", "In", &["old"])]);
    create_ready_config(
        &admin,
        "general",
        spec(family("10.100.0.0/16", 24), None, None),
    )
    .await;
    create_ready_config(&admin, "old", spec(family("10.50.0.0/24", 26), None, old)).await;
    create_node(&admin, "w1", &[]).await;
    create_node(&admin, "w2", &[]).await;
    create_node(&admin, "o1", &[("role", "old")]).await;
    let w1 = wait_cidrs(&admin, "w1").await;
    wait_cidrs(&admin, "w2").await;
    let o1 = wait_cidrs(&admin, "o1").await;
    set_allocation(&admin, "old", Allocation::Disabled).await;
    wait_condition(&admin, "old", "Drained", "False", Some("NodesRemaining")).await;
    assert_status_matches(&admin, "general").await;
    plugin_until(&cp, &["check"], "a clean check before the edits", |r| {
        r.code == Some(0)
    })
    .await;

    replica.signal(Signal::TERM);
    replica.wait_exit().await;

    create_node_obj(&admin, node("x1", &[], &[&w1[0]])).await;
    create_node_obj(&admin, node("s1", &[], &["10.96.5.0/24"])).await;
    create_node_obj(&admin, node("u1", &[], &["192.168.77.0/24"])).await;
    patch_status(
        &cp,
        "general",
        json!({ "ipv4": { "capacity": 256, "allocated": 5 } }),
    )
    .await;
    let mut conditions = get_config(&admin, "old")
        .await
        .and_then(|c| c.status)
        .expect("old has a status")
        .conditions;
    for c in conditions.iter_mut().filter(|c| c.type_ == "Drained") {
        c.status = "True".into();
        c.reason = "NoNodes".into();
    }
    patch_status(&cp, "old", json!({ "conditions": conditions })).await;
    Api::<ConfigMap>::namespaced(admin.clone(), NAMESPACE)
        .patch(
            "nodeipam-pod-network",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "ipv4": "10.100.0.0/16" } })),
        )
        .await
        .expect("step=edit-configmap");

    let found = plugin(&cp, &["check"]).await;
    assert_eq!(found.code, Some(1), "{}{}", found.out, found.err);
    let want = [
        format!("overlap: node x1 podCIDR {} overlaps {} of node w1", w1[0], w1[0]),
        "service-range: node s1 podCIDR 10.96.5.0/24 lies in Service range 10.96.0.0/16 (ServiceCIDR kubernetes)".into(),
        "outside-configs: node s1 podCIDR 10.96.5.0/24 lies in no NodeIPAMConfig (kept as unmanaged)".into(),
        "outside-configs: node u1 podCIDR 192.168.77.0/24 lies in no NodeIPAMConfig (kept as unmanaged)".into(),
        "leaked: NodeIPAMConfig general status.ipv4.allocated counts 5 block(s) but nodes hold 2".into(),
        "count: NodeIPAMConfig general status.nodes is 2 but a recount from the Nodes gives 3".into(),
        "drained: NodeIPAMConfig old says Drained=True but 1 node(s) still hold blocks: o1".into(),
        "unpublished: ConfigMap nodeipam-system/nodeipam-pod-network lacks 10.50.0.0/24 (Disabled range of the pod network)".into(),
        "unpublished: ConfigMap nodeipam-system/nodeipam-pod-network lacks 10.96.5.0/24 (Unmanaged range of the pod network)".into(),
        "unpublished: ConfigMap nodeipam-system/nodeipam-pod-network lacks 192.168.77.0/24 (Unmanaged range of the pod network)".into(),
    ];
    assert_eq!(
        found.out.lines().collect::<Vec<_>>(),
        want,
        "o1 holds {o1:?}"
    );
    let json = plugin(&cp, &["check", "-o", "json"]).await;
    assert_eq!(json.code, Some(1));
    let list: Vec<serde_json::Value> =
        serde_json::from_str(&json.out).expect("check -o json parses");
    let kinds: Vec<&str> = list.iter().filter_map(|f| f["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "overlap",
            "service-range",
            "outside-configs",
            "outside-configs",
            "leaked",
            "count",
            "drained",
            "unpublished",
            "unpublished",
            "unpublished"
        ]
    );
    assert_eq!(list[4]["counted"], 5);
    assert_eq!(list[4]["held"], 2);

    for name in ["x1", "s1", "u1"] {
        delete_node(&admin, name).await;
    }
    let _next = Replica::start(&cp, dir.path(), "cli-1", &[]).await;
    let clean = plugin_until(
        &cp,
        &["check"],
        "the controller to rewrite what it owns",
        |r| r.code == Some(0),
    )
    .await;
    assert_eq!(
        clean.out,
        "No inconsistencies: 3 node(s), 2 NodeIPAMConfig(s), 1 Service range(s), 1 published output(s) checked.\n"
    );
    cp.stop().await;
}
