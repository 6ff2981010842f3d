//! End-to-end tests of the allocation loop against a real kube-apiserver and etcd: families,
//! pending nodes, release and reuse, drain, disable, restart, migration, Service CIDRs and
//! status, each ending with the global no-overlap invariant.

mod support;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use nodeipam_controller::reconcile::Options;
use nodeipam_crd::Allocation;
use support::*;

#[tokio::test]
async fn families_dual_stack_ipv4_only_ipv6_only() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
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
        "v4only",
        spec(
            family("10.200.0.0/16", 26),
            None,
            selector(&[("stack", "In", &["v4"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "v6only",
        spec(
            None,
            family("fd00:200::/104", 120),
            selector(&[("stack", "In", &["v6"])]),
        ),
    )
    .await;
    create_node(&c, "dual-a", &[]).await;
    create_node(&c, "four-a", &[("stack", "v4")]).await;
    create_node(&c, "six-a", &[("stack", "v6")]).await;

    let dual = wait_cidrs(&c, "dual-a").await;
    assert_eq!(dual.len(), 2, "{dual:?}");
    assert!(
        dual[0].starts_with("10.100.") && dual[0].ends_with("/24"),
        "IPv4 first: {dual:?}"
    );
    assert!(
        dual[1].starts_with("fd00:100:") && dual[1].ends_with("/64"),
        "{dual:?}"
    );
    let node = get_node(&c, "dual-a").await.expect("node");
    assert_eq!(
        node.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
        Some(dual[0].clone()),
        "spec.podCIDR is the first block"
    );

    let four = wait_cidrs(&c, "four-a").await;
    assert_eq!(four.len(), 1);
    assert!(
        four[0].starts_with("10.200.") && four[0].ends_with("/26"),
        "{four:?}"
    );
    let six = wait_cidrs(&c, "six-a").await;
    assert_eq!(six.len(), 1);
    assert!(
        six[0].starts_with("fd00:200:") && six[0].ends_with("/120"),
        "{six:?}"
    );

    for name in ["dual", "v4only", "v6only"] {
        wait_condition(&c, name, "Ready", "True", Some("Accepting")).await;
        assert_status_matches(&c, name).await;
        let cfg = get_config(&c, name).await.expect("config");
        assert!(
            cfg.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&nodeipam_crd::FINALIZER.to_string())
        );
    }
    let dual_cfg = get_config(&c, "dual").await.expect("config");
    let st = dual_cfg.status.expect("status");
    assert_eq!(st.ipv4.map(|f| f.capacity), Some(256));
    assert_eq!(st.ipv6.map(|f| f.capacity), Some(65536));
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn nodes_waiting_for_a_config_get_blocks_once_it_exists() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    for i in 0..5 {
        create_node(&c, &format!("early-{i}"), &[]).await;
    }
    wait_event(&c, "early-0", "CIDRNotAvailable").await;
    assert!(pod_cidrs(&get_node(&c, "early-0").await.expect("node")).is_empty());
    create_config(&c, "late", spec(family("10.50.0.0/16", 24), None, None)).await;
    for i in 0..5 {
        let cidrs = wait_cidrs(&c, &format!("early-{i}")).await;
        assert!(cidrs[0].starts_with("10.50."), "{cidrs:?}");
    }
    assert_status_matches(&c, "late").await;
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn release_and_reuse_in_a_slash_23() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_config(&c, "tiny", spec(family("10.9.0.0/23", 24), None, None)).await;
    create_node(&c, "a", &[]).await;
    let a = wait_cidrs(&c, "a").await;
    create_node(&c, "b", &[]).await;
    let b = wait_cidrs(&c, "b").await;
    assert_ne!(a, b);
    wait_condition(&c, "tiny", "Exhausted", "True", Some("Exhausted")).await;
    create_node(&c, "c", &[]).await;
    wait_event(&c, "c", "CIDRNotAvailable").await;
    assert!(
        pod_cidrs(&get_node(&c, "c").await.expect("node")).is_empty(),
        "c must stay pending"
    );
    delete_node(&c, "a").await;
    let got = wait_cidrs(&c, "c").await;
    assert_eq!(got, a, "c takes a's block");
    assert_status_matches(&c, "tiny").await;
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn a_node_held_by_a_finalizer_keeps_its_block() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_config(&c, "one", spec(family("10.7.0.0/24", 24), None, None)).await;
    let mut held = node("held", &[], &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    create_node_obj(&c, held).await;
    let block = wait_cidrs(&c, "held").await;
    delete_node(&c, "held").await;
    create_node(&c, "next", &[]).await;
    wait_event(&c, "next", "CIDRNotAvailable").await;
    // The node is terminating but still exists: its block must not move.
    let n = get_node(&c, "held")
        .await
        .expect("still there while the finalizer holds it");
    assert!(n.metadata.deletion_timestamp.is_some());
    assert!(
        pod_cidrs(&get_node(&c, "next").await.expect("node")).is_empty(),
        "block released too early (kubernetes#127792)"
    );
    let api: Api<Node> = Api::all(c.clone());
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
    assert_eq!(wait_cidrs(&c, "next").await, block);
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn selection_precedence() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    // Each row: configs created, then a node with labels; the node must land in `want`.
    create_ready_config(&c, "catchall", spec(family("10.0.0.0/16", 24), None, None)).await;
    create_ready_config(
        &c,
        "zone-a",
        spec(
            family("10.1.0.0/16", 24),
            None,
            selector(&[("zone", "In", &["a"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "zone-a-gpu",
        spec(
            family("10.2.0.0/16", 24),
            None,
            selector(&[("zone", "In", &["a"]), ("gpu", "Exists", &[])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "rack-small",
        spec(
            family("10.3.0.0/22", 24),
            None,
            selector(&[("rack", "In", &["r1", "r2"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "rack-big",
        spec(
            family("10.4.0.0/16", 24),
            None,
            selector(&[("rack", "In", &["r1"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "mask-24",
        spec(
            family("10.5.0.0/16", 24),
            None,
            selector(&[("tier", "In", &["x"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "mask-25",
        spec(
            family("10.6.0.0/17", 25),
            None,
            selector(&[("tier", "In", &["x"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "sel-b",
        spec(
            family("10.7.0.0/16", 24),
            None,
            selector(&[("pool", "In", &["p", "q"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "sel-a",
        spec(
            family("10.8.0.0/16", 24),
            None,
            selector(&[("pool", "In", &["p"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "cidr-high",
        spec(
            family("10.10.0.0/16", 24),
            None,
            selector(&[("cidr", "In", &["t"])]),
        ),
    )
    .await;
    create_ready_config(
        &c,
        "cidr-low",
        spec(
            family("10.9.0.0/16", 24),
            None,
            selector(&[("cidr", "In", &["t"])]),
        ),
    )
    .await;
    type Row<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
    let rows: &[Row<'_>] = &[
        ("plain", &[], "10.0."),
        ("zone", &[("zone", "a")], "10.1."),
        ("more-requirements", &[("zone", "a"), ("gpu", "1")], "10.2."),
        ("fewer-free-blocks", &[("rack", "r1")], "10.3."),
        ("larger-mask", &[("tier", "x")], "10.6."),
        // Selector strings: "pool In (p)" < "pool In (p,q)".
        ("smaller-selector", &[("pool", "p")], "10.8."),
        ("lower-cidr-numerically", &[("cidr", "t")], "10.9."),
    ];
    for (name, labels, _) in rows {
        create_node(&c, name, labels).await;
    }
    for (name, _, want) in rows {
        let got = wait_cidrs(&c, name).await;
        assert!(
            got[0].starts_with(want),
            "{name}: got {got:?}, want {want}*"
        );
    }
    // Identical configs but the name overlap each other: the older one (then the smaller
    // name, when created in the same second) wins and the other is marked Overlap.
    create_ready_config(
        &c,
        "tie-b",
        spec(
            family("10.11.0.0/16", 24),
            None,
            selector(&[("tie", "In", &["1"])]),
        ),
    )
    .await;
    create_config(
        &c,
        "tie-a",
        spec(
            family("10.11.0.0/16", 24),
            None,
            selector(&[("tie", "In", &["1"])]),
        ),
    )
    .await;
    let (winner, loser) = wait_for("one tie config marked Overlap", || async {
        for (w, l) in [("tie-a", "tie-b"), ("tie-b", "tie-a")] {
            let cfg = get_config(&c, l).await?;
            if condition(&cfg, "Ready") == Some(("False".into(), "Overlap".into())) {
                return Some((w, l));
            }
        }
        None
    })
    .await;
    let (a, b) = (
        get_config(&c, winner).await.expect("winner"),
        get_config(&c, loser).await.expect("loser"),
    );
    let key = |x: &nodeipam_crd::NodeIPAMConfig| {
        (
            x.metadata.creation_timestamp.clone().map(|t| t.0),
            x.metadata.name.clone(),
        )
    };
    assert!(
        key(&a) < key(&b),
        "the older (then smaller-named) config must win the overlap"
    );
    create_node(&c, "tie-node", &[("tie", "1")]).await;
    assert!(wait_cidrs(&c, "tie-node").await[0].starts_with("10.11."));
    let n = get_node(&c, "tie-node").await.expect("node");
    assert_eq!(
        n.metadata
            .annotations
            .unwrap_or_default()
            .get("nodeipam.io/config")
            .map(String::as_str),
        Some(winner)
    );
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn deleting_a_config_with_nodes_drains_it() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_ready_config(
        &c,
        "first",
        spec(
            family("10.1.0.0/16", 24),
            None,
            selector(&[("pool", "In", &["x"])]),
        ),
    )
    .await;
    create_config(&c, "second", spec(family("10.2.0.0/16", 24), None, None)).await;
    create_node(&c, "n1", &[("pool", "x")]).await;
    create_node(&c, "n2", &[("pool", "x")]).await;
    assert!(wait_cidrs(&c, "n1").await[0].starts_with("10.1."));
    assert!(wait_cidrs(&c, "n2").await[0].starts_with("10.1."));
    // A consumer (CNI, proxy) holds the config until it has reconfigured.
    let api: Api<nodeipam_crd::NodeIPAMConfig> = Api::all(c.clone());
    api.patch("first", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(serde_json::json!([
        {"op": "add", "path": "/metadata/finalizers/-", "value": "cni.example.com/reconfigured"}
    ])).expect("patch")))
    .await
    .expect("add consumer finalizer");
    delete_config(&c, "first").await;
    let cfg = wait_condition(&c, "first", "Drained", "False", Some("NodesRemaining")).await;
    let msg = cfg
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|x| x.type_ == "Drained"))
        .map(|x| x.message.clone())
        .unwrap_or_default();
    assert!(
        msg.contains("2 node(s)") && msg.contains("n1") && msg.contains("n2"),
        "{msg}"
    );
    wait_condition(&c, "first", "Ready", "False", Some("Terminating")).await;
    // New nodes go to the next matching config.
    create_node(&c, "n3", &[("pool", "x")]).await;
    assert!(wait_cidrs(&c, "n3").await[0].starts_with("10.2."));
    delete_node(&c, "n1").await;
    delete_node(&c, "n2").await;
    let cfg = wait_condition(&c, "first", "Drained", "True", Some("NoNodes")).await;
    wait_event(&c, "first", "Drained").await;
    // Ours is gone, the consumer's stays: the object stays, Drained=True, until it lets go.
    wait_for("our finalizer to go", || async {
        let f = get_config(&c, "first")
            .await?
            .metadata
            .finalizers
            .unwrap_or_default();
        (f == vec!["cni.example.com/reconfigured".to_string()]).then_some(())
    })
    .await;
    assert!(cfg.metadata.deletion_timestamp.is_some());
    api.patch(
        "first",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("consumer lets go");
    wait_for("the config to be gone", || async {
        get_config(&c, "first").await.is_none().then_some(())
    })
    .await;
    assert_status_matches(&c, "second").await;
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn deleting_an_empty_config_goes_away() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_config(&c, "empty", spec(family("10.1.0.0/16", 24), None, None)).await;
    wait_for("finalizer", || async {
        get_config(&c, "empty")
            .await?
            .metadata
            .finalizers
            .filter(|f| !f.is_empty())
            .map(|_| ())
    })
    .await;
    delete_config(&c, "empty").await;
    wait_for("the config to be gone", || async {
        get_config(&c, "empty").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn disabled_config_stops_and_resumes() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_config(&c, "cfg", spec(family("10.3.0.0/16", 24), None, None)).await;
    create_node(&c, "a", &[]).await;
    let a = wait_cidrs(&c, "a").await;
    set_allocation(&c, "cfg", Allocation::Disabled).await;
    wait_condition(&c, "cfg", "Ready", "False", Some("Disabled")).await;
    wait_condition(&c, "cfg", "Drained", "False", Some("NodesRemaining")).await;
    create_node(&c, "b", &[]).await;
    wait_event(&c, "b", "CIDRNotAvailable").await;
    assert!(pod_cidrs(&get_node(&c, "b").await.expect("node")).is_empty());
    assert_eq!(
        pod_cidrs(&get_node(&c, "a").await.expect("node")),
        a,
        "existing blocks stay"
    );
    delete_node(&c, "a").await;
    wait_condition(&c, "cfg", "Drained", "True", Some("NoNodes")).await;
    set_allocation(&c, "cfg", Allocation::Enabled).await;
    wait_condition(&c, "cfg", "Drained", "False", Some("Active")).await;
    wait_cidrs(&c, "b").await;
    assert_status_matches(&c, "cfg").await;
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn restart_rebuilds_state_without_duplicates() {
    let cp = control_plane().await;
    let c = cp.client();
    let ctl = start_controller(c.clone(), Options::default());
    create_config(
        &c,
        "cfg",
        spec(family("10.4.0.0/24", 28), family("fd00:4::/64", 80), None),
    )
    .await;
    for i in 0..8 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    for i in 0..8 {
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    stop_controller(ctl).await;
    // While it is down: delete some nodes and create others.
    for i in 0..4 {
        delete_node(&c, &format!("n{i}")).await;
    }
    for i in 8..20 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    let _ctl = start_controller(c.clone(), Options::default());
    for i in 4..20 {
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    assert_status_matches(&c, "cfg").await;
    let cfg = get_config(&c, "cfg").await.expect("config");
    assert_eq!(cfg.status.and_then(|s| s.nodes), Some(16));
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn migration_adopts_existing_pod_cidrs() {
    let cp = control_plane().await;
    let c = cp.client();
    create_config(&c, "cfg", spec(family("10.20.0.0/16", 24), None, None)).await;
    // Nodes from kcm's nodeipam: inside the config, outside every config, and two overlapping.
    create_node_obj(&c, node("inside-1", &[], &["10.20.0.0/24"])).await;
    create_node_obj(&c, node("inside-2", &[], &["10.20.5.0/24"])).await;
    create_node_obj(&c, node("outside", &[], &["192.168.50.0/24"])).await;
    create_node_obj(&c, node("dup-a", &[], &["10.20.8.0/23"])).await;
    create_node_obj(&c, node("dup-b", &[], &["10.20.9.0/24"])).await;
    let _ctl = start_controller(c.clone(), Options::default());
    wait_event(&c, "outside", "UnmanagedPodCIDR").await;
    wait_event(&c, "dup-a", "OverlappingPodCIDR").await;
    wait_event(&c, "dup-b", "OverlappingPodCIDR").await;
    // New nodes never get an adopted block.
    for i in 0..10 {
        create_node(&c, &format!("new-{i}"), &[]).await;
    }
    for i in 0..10 {
        let got = wait_cidrs(&c, &format!("new-{i}")).await;
        assert!(
            ![
                "10.20.0.0/24",
                "10.20.5.0/24",
                "10.20.8.0/24",
                "10.20.9.0/24"
            ]
            .contains(&got[0].as_str()),
            "{got:?}"
        );
    }
    // Nothing pre-existing was changed.
    assert_eq!(
        pod_cidrs(&get_node(&c, "outside").await.expect("node")),
        vec!["192.168.50.0/24"]
    );
    assert_eq!(
        pod_cidrs(&get_node(&c, "dup-a").await.expect("node")),
        vec!["10.20.8.0/23"]
    );
    // Releasing one of the overlapping pair keeps the other's block occupied.
    delete_node(&c, "dup-a").await;
    for i in 10..14 {
        create_node(&c, &format!("new-{i}"), &[]).await;
        let got = wait_cidrs(&c, &format!("new-{i}")).await;
        assert_ne!(got[0], "10.20.9.0/24", "dup-b's block handed out");
    }
    assert_status_matches(&c, "cfg").await;
    let metrics = _ctl.metrics.encode();
    assert!(
        metrics.contains("nodeipam_unmanaged_pod_cidrs 1"),
        "{metrics}"
    );
    assert_invariant(&c, &[("dup-a", "dup-b")]).await;
}

#[tokio::test]
async fn a_label_change_after_allocation_does_not_break_release() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_config(
        &c,
        "gpu",
        spec(
            family("10.30.0.0/23", 24),
            None,
            selector(&[("gpu", "Exists", &[])]),
        ),
    )
    .await;
    create_node(&c, "g1", &[("gpu", "1")]).await;
    let block = wait_cidrs(&c, "g1").await;
    let api: Api<Node> = Api::all(c.clone());
    api.patch(
        "g1",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"gpu": null, "other": "x"}}})),
    )
    .await
    .expect("relabel");
    create_node(&c, "g2", &[("gpu", "1")]).await;
    wait_cidrs(&c, "g2").await;
    create_node(&c, "g3", &[("gpu", "1")]).await;
    wait_event(&c, "g3", "CIDRNotAvailable").await;
    delete_node(&c, "g1").await;
    assert_eq!(
        wait_cidrs(&c, "g3").await,
        block,
        "g1's block was released despite its new labels"
    );
    assert_status_matches(&c, "gpu").await;
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn service_cidrs_are_never_handed_out() {
    let cp = control_plane().await;
    let c = cp.client();
    // The harness's apiserver has --service-cluster-ip-range=10.96.0.0/16, published as the
    // "kubernetes" ServiceCIDR; the flag adds another.
    let options = Options {
        service_cidrs: vec!["10.97.2.0/24".parse().expect("cidr")],
        ..Options::default()
    };
    let _ctl = start_controller(c.clone(), options);
    create_config(&c, "wide", spec(family("10.96.0.0/14", 16), None, None)).await;
    for i in 0..3 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    // Four /16 blocks; 10.96.0.0/16 (ServiceCIDR) and 10.97.0.0/16 (overlaps the flag's
    // 10.97.2.0/24) are never handed out, so exactly two nodes get one and one waits.
    let mut got = wait_for("two nodes allocated", || async {
        let mut got = Vec::new();
        for i in 0..3 {
            got.extend(pod_cidrs(&get_node(&c, &format!("n{i}")).await?));
        }
        (got.len() == 2).then_some(got)
    })
    .await;
    got.sort();
    assert_eq!(
        got,
        vec!["10.98.0.0/16".to_string(), "10.99.0.0/16".to_string()]
    );
    wait_condition(&c, "wide", "Exhausted", "True", None).await;
    let mut waiting = 0;
    for i in 0..3 {
        if pod_cidrs(&get_node(&c, &format!("n{i}")).await.expect("node")).is_empty() {
            wait_event(&c, &format!("n{i}"), "CIDRNotAvailable").await;
            waiting += 1;
        }
    }
    assert_eq!(waiting, 1);
    assert_invariant(&c, &[]).await;
}

/// The safety of every podCIDR write rests on the API server refusing a patch whose UID is not
/// the object's: a write can then never land on a node recreated under the same name.
#[tokio::test]
async fn a_write_with_a_stale_uid_is_refused_by_the_api_server() {
    let cp = control_plane().await;
    let c = cp.client();
    create_node(&c, "recreated", &[]).await;
    let api: Api<Node> = Api::all(c.clone());
    let patch = serde_json::json!({
        "metadata": {"uid": "00000000-0000-0000-0000-000000000000"},
        "spec": {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"]},
    });
    let err = api
        .patch("recreated", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("a patch carrying another object's UID must fail");
    match err {
        kube::Error::Api(s) => assert!(
            s.code == 409 || s.code == 422,
            "expected a conflict or invalid, got {} {}",
            s.code,
            s.message
        ),
        other => panic!("expected an API error, got {other}"),
    }
    let n = get_node(&c, "recreated").await.expect("node");
    assert!(
        pod_cidrs(&n).is_empty(),
        "the refused write must leave no podCIDRs"
    );
}
