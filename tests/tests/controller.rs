//! End-to-end tests of the allocation loop against a real kube-apiserver and etcd: families,
//! pending nodes, release and reuse, drain, disable, restart, migration, Service CIDRs,
//! status, and an API server that goes away for a while, each ending with the global
//! no-overlap invariant; and Node lists read as protobuf.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use nodeipam_controller::app::write_timeout;
use nodeipam_controller::metrics::Metrics;
use nodeipam_controller::reconcile::leader::{Election, LeaseOptions};
use nodeipam_controller::reconcile::{self, Context, Options};
use nodeipam_crd::Allocation;
use support::*;
use tokio::sync::watch;
use tokio::task::JoinHandle;

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
    // Warned once it has waited the start-up grace (30 s) with no config at all.
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

/// A status patch of a NodeIPAMConfig costs the API server about three node patches. Nodes
/// arriving every 100 ms move the counts at every status tick (200 ms); the counts reach the
/// status at most once a second, and the last of them lands, with the flip of Exhausted when
/// the stream takes the last block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_nodes_moves_the_status_counts_at_most_once_a_second() {
    use nodeipam_controller::alloc::status::counts_only;
    const NODES: usize = 64;
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    // 64 blocks of /27: the stream takes every one.
    create_ready_config(&c, "stream", spec(family("10.30.0.0/21", 27), None, None)).await;
    let (log, _recorder) =
        support::record::record(Api::<nodeipam_crd::NodeIPAMConfig>::all(c.clone()));
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    let started = Instant::now();
    for i in 0..NODES {
        pace.tick().await;
        create_node(&c, &format!("s{i:02}"), &[]).await;
    }
    for i in 0..NODES {
        wait_cidrs(&c, &format!("s{i:02}")).await;
    }
    assert_status_matches(&c, "stream").await;
    let seconds = started.elapsed().as_secs();

    let mut statuses: Vec<nodeipam_crd::NodeIPAMConfigStatus> = log
        .lock()
        .expect("log")
        .iter()
        .filter_map(|(_, _, cfg)| cfg.status.clone())
        .collect();
    statuses.dedup();
    let counts_writes = statuses
        .windows(2)
        .filter(|w| counts_only(&w[0], &w[1]))
        .count();
    assert!(
        counts_writes as u64 <= seconds + 2,
        "{counts_writes} writes of counts alone in {seconds} s: {:#?}",
        statuses.iter().map(|s| s.nodes).collect::<Vec<_>>()
    );
    let last = statuses.last().expect("a status");
    assert_eq!(last.nodes, Some(NODES as u64));
    assert!(
        last.conditions
            .iter()
            .any(|c| c.type_ == "Exhausted" && c.status == "True"),
        "{last:?}"
    );
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

// ----- an API server that goes away for a while -----

/// How long the API server stays away: three lease durations, and several watch retries.
const OUTAGE: Duration = Duration::from_secs(12);
/// A short lease (seconds), so that it certainly expires during the outage.
const LEASE_DURATION: u64 = 4;
const LEASE_GRACE: u64 = 2;
const LEASE_NAME: &str = "nodeipam-controller";
const IDENTITY: &str = "outage-test";

/// The controller in this process, wired as `nodeipam run` wires it: with leader election
/// (and the takeover delay that comes with it), or always leader.
struct Running {
    reconcile: JoinHandle<()>,
    election: Option<Election>,
    _always: Option<watch::Sender<bool>>,
    metrics: Arc<Metrics>,
}

impl Running {
    async fn start(client: Client, elected: bool) -> Running {
        let metrics = Arc::new(Metrics::new());
        let options = Options {
            takeover_delay: if elected {
                write_timeout(LEASE_GRACE)
            } else {
                Duration::ZERO
            },
            write_timeout: write_timeout(LEASE_GRACE),
            ..Options::default()
        };
        let ctx = Arc::new(Context::new(client.clone(), options, metrics.clone()));
        let (election, always, leadership) = if elected {
            let election = Election::start(
                client,
                LeaseOptions {
                    namespace: "default".into(),
                    name: LEASE_NAME.into(),
                    identity: IDENTITY.into(),
                    duration: LEASE_DURATION,
                    grace: LEASE_GRACE,
                    took: Default::default(),
                    session: Default::default(),
                    settle: write_timeout(LEASE_GRACE) + Duration::from_secs(1),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("start leader election: {e}"));
            let leadership = election.leadership();
            (Some(election), None, leadership)
        } else {
            let (tx, rx) = reconcile::always_leader();
            (None, Some(tx), rx)
        };
        Running {
            reconcile: tokio::spawn(reconcile::run(ctx, leadership)),
            election,
            _always: always,
            metrics,
        }
    }

    /// Panics unless every task of the controller still runs (none panicked or returned).
    fn assert_alive(&self, when: &str) {
        assert!(
            !self.reconcile.is_finished(),
            "the allocation loop ended {when}"
        );
        if let Some(election) = &self.election {
            assert!(election.is_running(), "leader election ended {when}");
        }
    }

    async fn wait_leader(&self, leader: bool, what: &str) {
        let want = i64::from(leader);
        wait_for(what, || async {
            (self.metrics.leader.get() == want).then_some(())
        })
        .await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.reconcile.abort();
    }
}

async fn lease_holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get_opt(LEASE_NAME)
        .await
        .expect("get the lease")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// The API server stops for [`OUTAGE`] while the controller runs, and comes back on the same
/// etcd. Nothing panics or exits, allocation resumes (with leader election: the leader steps
/// down when its lease cannot be renewed, takes it again and rebuilds), a node deleted after
/// the outage gives its blocks back, and no two nodes overlap.
async fn api_server_goes_away_for_a_while(elected: bool) {
    let mut cp = control_plane().await;
    let c = cp.client();
    let mut ctl = Running::start(c.clone(), elected).await;
    ctl.wait_leader(true, "leadership before the outage").await;
    // Four blocks per family: the nodes created after the outage fit only if the deleted
    // node's blocks come back.
    create_ready_config(
        &c,
        "tight",
        spec(family("10.60.0.0/26", 28), family("fd00:60::/64", 66), None),
    )
    .await;
    for i in 0..3 {
        create_node(&c, &format!("a{i}"), &[]).await;
    }
    let mut before = Vec::new();
    for i in 0..3 {
        before.push(wait_cidrs(&c, &format!("a{i}")).await);
    }

    // kube-apiserver stops listening at SIGTERM but may wait out the grace period for open
    // watches: the outage starts now.
    let down = Instant::now();
    cp.stop_apiserver().await;
    if elected {
        // Renewals fail, and the lease runs out long before the API server is back: the
        // leader must stop allocating on its own, as the lease manager cannot tell it.
        ctl.wait_leader(
            false,
            "the leader to step down while its lease cannot be renewed",
        )
        .await;
    }
    tokio::time::sleep(OUTAGE.saturating_sub(down.elapsed())).await;
    ctl.assert_alive("while the API server was away");
    cp.check_running().expect("etcd still runs");
    cp.restart_apiserver()
        .await
        .unwrap_or_else(|e| panic!("restart kube-apiserver: {e}"));

    // The clients made before the restart keep working.
    delete_node(&c, "a0").await;
    for name in ["b0", "b1"] {
        create_node(&c, name, &[]).await;
    }
    let b0 = wait_cidrs(&c, "b0").await;
    let b1 = wait_cidrs(&c, "b1").await;
    // Only four blocks per family: b0 and b1 together must hold every block a0 gave back.
    let handed_out: Vec<&String> = b0.iter().chain(&b1).collect();
    assert!(
        before[0].iter().all(|c| handed_out.contains(&c)),
        "a0's blocks {:?} were not handed out again (b0 {b0:?}, b1 {b1:?})",
        before[0]
    );
    for (i, cidrs) in before.iter().enumerate().skip(1) {
        let now = pod_cidrs(&get_node(&c, &format!("a{i}")).await.expect("node"));
        assert_eq!(&now, cidrs, "a{i}'s blocks changed");
    }
    ctl.wait_leader(true, "leadership after the outage").await;
    if elected {
        assert_eq!(
            lease_holder(&c).await.as_deref(),
            Some(IDENTITY),
            "the lease is ours again"
        );
    }
    ctl.assert_alive("after the API server came back");
    assert_status_matches(&c, "tight").await;
    let cfg = get_config(&c, "tight").await.expect("config");
    let st = cfg.status.expect("status");
    assert_eq!(st.nodes, Some(4), "a1, a2, b0 and b1");
    assert_eq!(st.ipv4.map(|f| (f.allocated, f.capacity)), Some((4, 4)));
    assert_eq!(st.ipv6.map(|f| (f.allocated, f.capacity)), Some((4, 4)));
    assert_invariant(&c, &[]).await;
    if let Some(election) = ctl.election.take() {
        election.release().await.expect("release the lease");
    }
}

#[tokio::test]
async fn an_api_server_outage_with_leader_election() {
    api_server_goes_away_for_a_while(true).await;
}

#[tokio::test]
async fn an_api_server_outage_without_leader_election() {
    api_server_goes_away_for_a_while(false).await;
}

/// Two replicas read the Lease when its holder had let it go; one takes it, then the
/// other acts on its stale read. Its write is refused (the version it read is gone) and the
/// Lease still names the first: a lock that wrote the holder without that precondition would
/// have displaced it, and both would allocate until one of them read the Lease again.
#[tokio::test]
async fn a_lock_acting_on_a_stale_read_of_the_lease_displaces_nobody() {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::PostParams;
    use nodeipam_controller::reconcile::leader::field_manager;
    use nodeipam_controller::reconcile::lease_lock::Lock;
    const NAME: &str = "stale-read";
    let cp = control_plane().await;
    let c = cp.client();
    let api: Api<Lease> = Api::namespaced(c.clone(), "default");
    // Let go by its last holder: free to whoever locks it first.
    let mut free = Lease::default();
    free.metadata.name = Some(NAME.into());
    free.spec = Some(LeaseSpec {
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    });
    api.create(&PostParams::default(), &free)
        .await
        .expect("create the free lease");
    let lock = |id: &str| {
        Lock::new(
            api.clone(),
            NAME,
            id,
            field_manager(id),
            (15, 5),
            Duration::from_secs(1),
        )
    };
    let (b, c2) = (lock("replica-b"), lock("replica-c"));
    let holder = || async {
        api.get(NAME)
            .await
            .expect("read the lease")
            .spec
            .and_then(|s| s.holder_identity)
    };

    let stale = api.get(NAME).await.expect("replica-b's read");
    assert!(c2.attempt().await.expect("replica-c's attempt").leader);
    assert_eq!(
        b.act(Some(&stale))
            .await
            .expect("replica-b acts on its read"),
        None,
        "a write on a version that is gone must be refused"
    );
    assert_eq!(holder().await.as_deref(), Some("replica-c"));
    // Its next attempt reads the Lease again: held, so it waits to see it unchanged for a term.
    let next = b.attempt().await.expect("replica-b's next attempt");
    assert!(!next.leader);
    assert!(next.next > std::time::Instant::now() + Duration::from_secs(10));

    // Other writes to the Lease (the hand-over mark, the leader's finalizer) cost the holder
    // nothing: its renewal reads again and writes on the new version.
    let mark = serde_json::json!({ "metadata": { "annotations": { "x": "y" } } });
    api.patch(NAME, &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .expect("annotate");
    assert!(c2.attempt().await.expect("replica-c renews").leader);
    // Let go, it is free for replica-b at once.
    c2.release(true).await.expect("replica-c lets go");
    assert_eq!(holder().await, None);
    assert!(b.attempt().await.expect("replica-b takes it").leader);
    assert_eq!(holder().await.as_deref(), Some("replica-b"));
    let spec = api.get(NAME).await.expect("lease").spec.expect("spec");
    assert_eq!(spec.lease_transitions, Some(2), "replica-c, then replica-b");
}

/// Nodes listed as protobuf (how the node watch lists them) are the Nodes a JSON list reads,
/// on the API server's own bytes and page by page through the controller's client; a failed
/// list still carries the API server's Status.
#[tokio::test]
async fn node_lists_read_as_protobuf_match_json() {
    use kube::api::ListParams;
    use nodeipam_controller::node::{IpamNode, protobuf};
    let cp = control_plane().await;
    let c = cp.client();
    let dual = node(
        "dual",
        &[("zone", "a"), ("rack", "r1")],
        &["10.9.0.0/24", "fd00:9::/64"],
    );
    create_node_obj(&c, dual).await;
    create_node_obj(&c, node("v4", &[("zone", "b")], &["10.9.1.0/24"])).await;
    for i in 0..5 {
        create_node(&c, &format!("plain-{i}"), &[]).await;
    }
    let json = Api::<IpamNode>::all(c.clone())
        .list(&ListParams::default())
        .await
        .expect("json list");
    assert_eq!(json.items.len(), 7);
    assert!(
        json.items
            .iter()
            .any(|n| n.cidrs().map(|c| c.len()) == Ok(2))
    );

    let req = http::Request::get("/api/v1/nodes")
        .header(http::header::ACCEPT, "application/vnd.kubernetes.protobuf")
        .body(kube::client::Body::empty())
        .expect("request");
    let res = c.send(req).await.expect("protobuf list");
    let content_type = res.headers()[http::header::CONTENT_TYPE].clone();
    assert_eq!(content_type, "application/vnd.kubernetes.protobuf");
    let bytes = res.into_body().collect_bytes().await.expect("body");
    let raw = protobuf::node_list(&bytes).expect("the API server's bytes decode");
    assert_eq!(raw.items, json.items);
    assert!(raw.resource_version.is_some());

    let pb = Api::<IpamNode>::all(nodeipam_controller::node_lists::client(c.clone()));
    let (mut items, mut pages, mut token) = (Vec::new(), 0, None);
    loop {
        let mut params = ListParams::default().limit(2);
        params.continue_token = token;
        let page = pb.list(&params).await.expect("a page");
        items.extend(page.items);
        pages += 1;
        token = page.metadata.continue_;
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 4);
    assert_eq!(items, json.items);

    let bad = ListParams::default().limit(2).continue_token("not-a-token");
    match pb.list(&bad).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 400, "{status:?}");
            assert!(status.message.contains("continue"), "{status:?}");
        }
        other => panic!("expected the API server's Status, got {other:?}"),
    }
}

/// Nodes whose kubelets write their status (registration, Ready, heartbeats) while the
/// controller's writes wait in a long queue (a low QPS): every node is served, and nearly all
/// with one podCIDR write. A write preconditioned on the whole Node's resourceVersion would
/// meet a 409 after nearly every heartbeat and fall further behind with each retry (issue 45:
/// 464 of 5,000 nodes served in five minutes); the fence must be something only a successor's
/// seal moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_status_updates_never_hold_up_a_podcidr_write() {
    use nodeipam_testenv::FaultProxy;
    use nodeipam_testenv::fault_proxy::{Action, Rule};
    use nodeipam_testenv::kubelet::{Kubelets, Timing};

    const NODES: usize = 200;
    let cp = control_plane().await;
    let admin = cp.client();
    // The controller talks through the proxy only so that its podCIDR writes can be counted.
    let proxy = FaultProxy::for_user(&cp, "nodeipam-under-test", &["system:masters"])
        .unwrap_or_else(|e| panic!("step=start-fault-proxy: {e}"));
    let writes = proxy.add(Rule::new(
        Some(http::Method::PATCH),
        "/api/v1/nodes/",
        Action::Forward,
    ));
    let through = proxy
        .client()
        .unwrap_or_else(|e| panic!("step=fault-proxy-client: {e}"));
    // 20 writes a second: the last of 200 nodes waits about 10 s for its turn, through a
    // Ready update and several heartbeats.
    let ctl = start_controller(
        through,
        Options {
            qps: 20.0,
            burst: 20,
            ..Options::default()
        },
    );
    create_ready_config(
        &admin,
        "busy",
        spec(family("10.124.0.0/16", 24), None, None),
    )
    .await;
    let names: Vec<String> = (0..NODES).map(|i| format!("kubelet-{i:03}")).collect();
    // A kubelet's timing, but a heartbeat every 2-3 s rather than 20-25 s: the queue here is
    // seconds long, not minutes.
    let kubelets = Kubelets::start(
        admin.clone(),
        names.clone(),
        Timing {
            heartbeat: (Duration::from_secs(2), Duration::from_secs(3)),
            ..Timing::kubelet()
        },
    );
    for name in &names {
        create_node(&admin, name, &[]).await;
    }
    // A node whose write waits in the queue has no podCIDRs yet: it must count as pending.
    let most_pending = {
        let metrics = ctl.metrics.clone();
        tokio::spawn(async move {
            let mut most = 0;
            loop {
                most = most.max(metrics.pending_nodes.get());
                if most > 0 {
                    return most;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let nodes: Api<Node> = Api::all(admin.clone());
    wait_for(&format!("podCIDRs on all {NODES} nodes"), || async {
        let list = nodes.list(&Default::default()).await.ok()?;
        let served = list.items.iter().filter(|n| !pod_cidrs(n).is_empty());
        (served.count() == NODES).then_some(())
    })
    .await;
    let most_pending = tokio::time::timeout(Duration::from_secs(1), most_pending)
        .await
        .ok()
        .and_then(Result::ok);
    assert!(
        most_pending.is_some_and(|n| n > 0),
        "nodes whose writes waited in the queue were never counted as pending"
    );
    let updates = kubelets.updates();
    drop(kubelets);
    let sent = writes.matched();
    assert!(
        updates as usize > 2 * NODES,
        "the kubelets made only {updates} status updates: the test did not load the nodes"
    );
    assert!(
        sent as f64 <= NODES as f64 * 1.05,
        "{sent} podCIDR writes for {NODES} nodes (at most 1.05 a node allowed), while the kubelets made {updates} status updates"
    );
    wait_for("no node pending once all are served", || async {
        (ctl.metrics.pending_nodes.get() == 0).then_some(())
    })
    .await;
    assert_invariant(&admin, &[]).await;
    assert_status_matches(&admin, "busy").await;
    cp.stop().await;
}
