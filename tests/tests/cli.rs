//! End-to-end tests of `kubectl nodeipam`, the plugin binary run as a process with a
//! kubeconfig against the real API server, beside the real `nodeipam` controller binary:
//! `status` (leader, usage, pending nodes and why, the published outputs), `ranges` (what
//! `nodeipam ranges` prints), plugin discovery and completion by kubectl, and `check`, which reports every
//! inconsistency made by hand while the controller is stopped and none once it is fixed;
//! `migrate clustercidr`, node-ipam-controller's ClusterCIDRs (in CRDs of its schema) made
//! NodeIPAMConfigs and the controller adopting the podCIDRs they gave.

mod support;

use std::path::Path;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use nodeipam_crd::{Allocation, NodeIPAMConfig};
use nodeipam_testenv::ControlPlane;
use rustix::process::Signal;
use serde_json::json;
use support::process::{
    NAMESPACE, Replica, install_rbac, kubectl_ok, nodeipam_bin, plugin, plugin_bin, plugin_until,
};
use support::*;

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
                        == [
                            "ConfigMap",
                            "nodeipam-system/nodeipam-pod-network",
                            "yes",
                            "yes",
                            "-",
                        ]
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
/// exit 1, in JSON too: the damage at once, the rest (what lag could cause) after a second look
/// finds it unchanged; once the nodes are gone and the controller has rewritten what it owns,
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
    // The counts, the condition and the output could be the controller's lag: they were
    // looked at again, and reported because nothing rewrote them.
    assert!(found.err.contains("looking again in 5s"), "{}", found.err);
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

/// With the controller running, `check` right after a node is deleted (the status counts are
/// written at most once a second, so they may still count it) finds nothing: what the
/// controller's lag causes is looked at again and has settled. A hand-made overlap is real
/// damage: exit 1, named first; once that node is deleted, a check at once is clean again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_right_after_a_node_is_deleted_is_clean_and_an_overlap_is_reported() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let _replica = Replica::start(&cp, dir.path(), "lag-0", &[]).await;
    wait_leader(&cp, "lag-0").await;
    let admin = cp.client();
    create_ready_config(
        &admin,
        "general",
        spec(family("10.110.0.0/16", 24), None, None),
    )
    .await;
    for name in ["a1", "a2", "a3"] {
        create_node(&admin, name, &[]).await;
        wait_cidrs(&admin, name).await;
    }
    plugin_until(&cp, &["check"], "a clean check before the delete", |r| {
        r.code == Some(0)
    })
    .await;
    for name in ["b1", "b2", "b3", "b4", "b5", "b6"] {
        create_node(&admin, name, &[]).await;
        wait_cidrs(&admin, name).await;
    }
    // Two at a time: the first deletion's counts are written at once, the second's wait
    // their second, and check runs in it.
    for pair in [["b1", "b2"], ["b3", "b4"], ["b5", "b6"]] {
        delete_node(&admin, pair[0]).await;
        delete_node(&admin, pair[1]).await;
        let after = plugin(&cp, &["check"]).await;
        assert_eq!(
            after.code,
            Some(0),
            "check right after deleting {pair:?} reported the controller's lag:\n{}{}",
            after.out,
            after.err
        );
    }
    create_node(&admin, "a4", &[]).await;
    let a4 = wait_cidrs(&admin, "a4").await;

    create_node_obj(&admin, node("rogue", &[], &[&a4[0]])).await;
    let found = plugin(&cp, &["check"]).await;
    assert_eq!(found.code, Some(1), "{}{}", found.out, found.err);
    let overlap = format!(
        "overlap: node rogue podCIDR {} overlaps {} of node a4",
        a4[0], a4[0]
    );
    assert_eq!(
        found.out.lines().next(),
        Some(overlap.as_str()),
        "{}",
        found.out
    );
    // The demo's case: the rogue node goes, and check runs at once.
    delete_node(&admin, "rogue").await;
    let gone = plugin(&cp, &["check"]).await;
    assert_eq!(
        gone.code,
        Some(0),
        "check right after deleting rogue reported the controller's lag:\n{}{}",
        gone.out,
        gone.err
    );
    assert!(
        gone.out.starts_with("No inconsistencies: 4 node(s)"),
        "{}",
        gone.out
    );
    cp.stop().await;
}

/// node-ipam-controller's ClusterCIDR CRD with the schema of its chart (the fields a
/// conversion reads), at `versions` (the first stores). kube-controller-manager 1.25 to 1.28's
/// own `networking.k8s.io/v1alpha1` cannot be a CRD: the API server's built-in group answers
/// that path (the plugin reads it the same way; its unit tests cover that group's objects).
fn clustercidr_crd(versions: &[&str]) -> serde_json::Value {
    let group = "networking.x-k8s.io";
    let schema = json!({"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["perNodeHostBits"], "properties": {
            "perNodeHostBits": {"type": "integer", "format": "int32"},
            "ipv4": {"type": "string"},
            "ipv6": {"type": "string"},
            "nodeSelector": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        }},
    }}});
    let versions: Vec<_> = versions
        .iter()
        .enumerate()
        .map(|(i, v)| json!({"name": v, "served": true, "storage": i == 0, "schema": schema}))
        .collect();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("clustercidrs.{group}")},
        "spec": {
            "group": group, "scope": "Cluster", "versions": versions,
            "names": {"kind": "ClusterCIDR", "listKind": "ClusterCIDRList",
                      "plural": "clustercidrs", "singular": "clustercidr"},
        },
    })
}

fn clustercidr(api_version: &str, name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": api_version, "kind": "ClusterCIDR",
        "metadata": {"name": name, "finalizers": ["networking.x-k8s.io/cluster-cidr-finalizer"]},
        "spec": spec,
    })
}

/// Writes `objects` as one JSON List file (JSON is YAML) and returns its path.
fn write_list(dir: &Path, file: &str, objects: &[serde_json::Value]) -> String {
    let path = dir.join(file);
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(&path, list.to_string()).expect("step=write-manifest");
    path.display().to_string()
}

/// The NodeIPAMConfigs a `migrate` run printed, by name: (ipv4, ipv6, selector, allocation).
fn printed(docs: &[serde_json::Value]) -> Vec<(String, serde_json::Value)> {
    docs.iter()
        .map(|d| {
            (
                d["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                d["spec"].clone(),
            )
        })
        .collect()
}

/// A cut-over from node-ipam-controller (docs/install.md): its ClusterCIDRs in both CRD versions,
/// one being deleted, and nodes holding the podCIDRs it gave. An overlapping ClusterCIDR makes
/// `migrate` refuse and create nothing; without it, `migrate` prints the NodeIPAMConfigs (the
/// same from the cluster as from a file), `--apply` creates them and a second run leaves them
/// alone. The controller then adopts every podCIDR and changes none: new nodes get blocks
/// around them, by the same selectors, the deleted range hands out nothing and stays undrained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_clustercidr_converts_and_the_controller_adopts_every_podcidr() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let crds = dir.path().join("crds");
    std::fs::create_dir(&crds).expect("step=write-crds");
    let crd = clustercidr_crd(&["v1", "v1alpha1"]).to_string();
    std::fs::write(crds.join("clustercidrs.yaml"), crd).expect("step=write-crds");
    cp.install_crds(&crds)
        .await
        .expect("step=install-clustercidr-crds");
    let gpu_selector = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "pool", "operator": "In", "values": ["gpu"]}]}]});
    let objects = [
        clustercidr(
            "networking.x-k8s.io/v1",
            "general",
            json!({"perNodeHostBits": 8, "ipv4": "10.80.0.0/16", "ipv6": "fd00:80::/104"}),
        ),
        clustercidr(
            "networking.x-k8s.io/v1",
            "gpu",
            json!({"perNodeHostBits": 6, "ipv4": "10.90.0.0/20", "nodeSelector": gpu_selector.clone()}),
        ),
        clustercidr(
            // Written as the older version: read back once, as v1.
            "networking.x-k8s.io/v1alpha1",
            "legacy",
            json!({"perNodeHostBits": 8, "ipv4": "10.70.0.0/16", "nodeSelector":
                {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "role", "operator": "In", "values": ["legacy"]}]}]}}),
        ),
    ];
    let file = write_list(dir.path(), "clustercidrs.json", &objects);
    kubectl_ok(&cp, &["apply", "-f", &file]).await;
    // Being deleted: node-ipam-controller's finalizer holds it while nodes use it.
    kubectl_ok(
        &cp,
        &[
            "delete",
            "clustercidrs.networking.x-k8s.io",
            "legacy",
            "--wait=false",
        ],
    )
    .await;
    let admin = cp.client();
    let held = [
        (
            "n-general",
            vec![],
            vec!["10.80.3.0/24", "fd00:80::300/120"],
        ),
        ("n-gpu", vec![("pool", "gpu")], vec!["10.90.0.0/26"]),
        ("n-legacy", vec![("role", "legacy")], vec!["10.70.0.0/24"]),
    ];
    for (name, labels, cidrs) in &held {
        create_node_obj(&admin, node(name, labels, cidrs)).await;
    }

    // node-ipam-controller lets ClusterCIDRs overlap; nodeipam refuses, all or nothing.
    let overlap = write_list(
        dir.path(),
        "overlap.json",
        &[clustercidr(
            "networking.x-k8s.io/v1",
            "inner",
            json!({"perNodeHostBits": 8, "ipv4": "10.80.128.0/17"}),
        )],
    );
    kubectl_ok(&cp, &["apply", "-f", &overlap]).await;
    let refused = plugin(&cp, &["migrate", "clustercidr", "--apply"]).await;
    assert_eq!(refused.code, Some(1), "{}{}", refused.out, refused.err);
    assert!(
        refused.err.contains(
            "error: ClusterCIDR \"inner\": IPv4 range 10.80.128.0/17 overlaps 10.80.0.0/16 of ClusterCIDR \"general\""
        ) && refused.err.contains("nothing was created"),
        "{}",
        refused.err
    );
    let configs: Api<NodeIPAMConfig> = Api::all(admin.clone());
    let none = configs
        .list(&Default::default())
        .await
        .expect("list configs");
    assert!(none.items.is_empty(), "nothing created: {:?}", none.items);
    kubectl_ok(
        &cp,
        &[
            "patch",
            "clustercidrs.networking.x-k8s.io",
            "inner",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    )
    .await;
    kubectl_ok(
        &cp,
        &["delete", "clustercidrs.networking.x-k8s.io", "inner"],
    )
    .await;

    // Printed from the cluster: the group read once, at v1 (it serves two versions).
    let run = plugin(&cp, &["migrate", "clustercidr"]).await;
    assert_eq!(run.code, Some(0), "{}", run.err);
    assert!(
        run.err.contains(
            "Warning: ClusterCIDR \"legacy\": it is being deleted: the NodeIPAMConfig is Disabled"
        ),
        "{}",
        run.err
    );
    let docs = nodeipam_testenv::yaml::documents(&run.out).expect("migrate prints YAML");
    let specs = printed(&docs);
    let names: Vec<&str> = specs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["general", "gpu", "legacy"], "{}", run.out);
    assert_eq!(
        specs[0].1,
        json!({"ipv4": {"cidr": "10.80.0.0/16", "perNodeMaskSize": 24},
               "ipv6": {"cidr": "fd00:80::/104", "perNodeMaskSize": 120},
               "allocation": "Enabled"})
    );
    assert_eq!(
        specs[1].1,
        json!({"ipv4": {"cidr": "10.90.0.0/20", "perNodeMaskSize": 26},
               "nodeSelector": gpu_selector, "allocation": "Enabled"})
    );
    assert_eq!(specs[2].1["allocation"], "Disabled");
    assert_eq!(
        docs[2]["metadata"]["annotations"]["nodeipam.io/migrated-from"],
        "networking.x-k8s.io/v1 legacy"
    );
    assert!(
        docs[1]["metadata"].get("finalizers").is_none(),
        "{}",
        docs[1]
    );
    // The same from manifests, without a cluster (a kubeconfig that leads nowhere).
    let from_file = tokio::process::Command::new(plugin_bin())
        .env_clear()
        .args([
            "--kubeconfig=/nonexistent",
            "migrate",
            "clustercidr",
            "-o",
            "json",
            "-f",
            &file,
        ])
        .output()
        .await
        .expect("step=run-plugin");
    assert!(
        from_file.status.success(),
        "{}",
        String::from_utf8_lossy(&from_file.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&from_file.stdout).expect("a JSON List");
    let file_specs = printed(list["items"].as_array().expect("items"));
    // The file's legacy is not being deleted: it stays Enabled there.
    assert_eq!(file_specs[..2], specs[..2]);
    assert_eq!(file_specs[2].1["allocation"], "Enabled");

    let applied = plugin(&cp, &["migrate", "clustercidr", "--apply"]).await;
    assert_eq!(applied.code, Some(0), "{}", applied.err);
    assert_eq!(
        applied.out,
        "nodeipamconfig.nodeipam.io/general created\nnodeipamconfig.nodeipam.io/gpu created\nnodeipamconfig.nodeipam.io/legacy created\n"
    );
    let again = plugin(&cp, &["migrate", "clustercidr", "--apply"]).await;
    assert_eq!(again.code, Some(0), "{}", again.err);
    assert_eq!(
        again.out.matches(" unchanged\n").count(),
        3,
        "{}",
        again.out
    );

    // Cut-over: nodeipam starts and adopts what node-ipam-controller gave.
    install_rbac(&cp).await;
    let _replica = Replica::start(&cp, dir.path(), "migrate-0", &[]).await;
    // Nodes arrive at once, while the configs wait for the finalizer and the publication: a
    // node gpu selects waits for it rather than take a block from general.
    for (name, labels) in [
        ("new-gpu", &[("pool", "gpu")][..]),
        ("new-legacy", &[("role", "legacy")][..]),
        ("new-plain", &[][..]),
    ] {
        create_node(&admin, name, labels).await;
    }
    assert_eq!(
        wait_cidrs(&admin, "new-gpu").await,
        ["10.90.0.64/26"],
        "around n-gpu's block"
    );
    // legacy hands out nothing (Disabled): general serves every node, around n-general.
    let general: Vec<Vec<String>> = [
        wait_cidrs(&admin, "new-legacy").await,
        wait_cidrs(&admin, "new-plain").await,
    ]
    .into();
    let mut v4: Vec<&str> = general.iter().map(|c| c[0].as_str()).collect();
    v4.sort_unstable();
    assert_eq!(v4, ["10.80.0.0/24", "10.80.1.0/24"], "{general:?}");
    assert!(
        general
            .iter()
            .all(|c| c.len() == 2 && c[1].starts_with("fd00:80::")),
        "{general:?}"
    );
    for (name, _, cidrs) in &held {
        let node = get_node(&admin, name).await.expect("node");
        assert_eq!(pod_cidrs(&node), *cidrs, "{name}'s podCIDRs unchanged");
    }
    for name in ["general", "gpu", "legacy"] {
        assert_status_matches(&admin, name).await;
    }
    let legacy = wait_condition(&admin, "legacy", "Drained", "False", Some("NodesRemaining")).await;
    assert_eq!(
        legacy.status.and_then(|s| s.nodes),
        Some(1),
        "n-legacy's block is counted"
    );
    let clean = plugin_until(&cp, &["check"], "a clean check", |r| r.code == Some(0)).await;
    assert!(
        clean
            .out
            .starts_with("No inconsistencies: 6 node(s), 3 NodeIPAMConfig(s)"),
        "{}",
        clean.out
    );
    cp.stop().await;
}
