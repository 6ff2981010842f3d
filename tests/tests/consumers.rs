//! End-to-end tests of the typed consumer outputs (Calico's IPPools and GlobalNetworkSet,
//! Cilium's CiliumCIDRGroup) against CRDs that follow each project's documented schema: a
//! range is in each before its first block and leaves only after it drained (proven by
//! resourceVersions), an edited or deleted output is repaired, objects without our label are
//! never touched, and a missing CRD holds allocation back with a message naming the output.

mod support;

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Node;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodeipam_controller::alloc::outputs::{
    CalicoPools, Encapsulation, OutputKind, OutputRef, is_ours,
};
use nodeipam_testenv::ControlPlane;
use serde_json::{Value, json};
use support::process::{Run, plugin_until};
use support::record::{Log, record};
use support::*;

const NS: &str = "nodeipam-system";
const NAME: &str = "nodeipam-pod-network";

fn crds() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/consumer-crds")
}

/// A control plane with the consumers' CRDs installed and the controller's namespace.
async fn with_consumer_crds() -> (ControlPlane, Client) {
    let cp = control_plane().await;
    cp.install_crds(&crds())
        .await
        .expect("install the consumer CRDs");
    let c = cp.client();
    namespace(&c, NS).await;
    (cp, c)
}

/// An IPPool as someone other than nodeipam would create it: no label of ours.
fn their_pool(name: &str, spec: Value) -> DynamicObject {
    let pool = json!({
        "apiVersion": "projectcalico.org/v3", "kind": "IPPool",
        "metadata": { "name": name },
        "spec": spec,
    });
    serde_json::from_value(pool).expect("pool")
}

fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').expect("group/version");
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn ip_pools(c: &kube::Client) -> Api<DynamicObject> {
    let r = resource("projectcalico.org/v3", "IPPool", "ippools");
    Api::all_with(c.clone(), &r)
}

fn network_sets(c: &kube::Client) -> Api<DynamicObject> {
    let r = resource(
        "projectcalico.org/v3",
        "GlobalNetworkSet",
        "globalnetworksets",
    );
    Api::all_with(c.clone(), &r)
}

fn cidr_groups(c: &kube::Client) -> Api<DynamicObject> {
    let r = resource("cilium.io/v2", "CiliumCIDRGroup", "ciliumcidrgroups");
    Api::all_with(c.clone(), &r)
}

/// Every typed output: VXLAN pools with natOutgoing, a network set and a CIDR group.
fn typed() -> Vec<OutputRef> {
    let pools = CalicoPools {
        nat_outgoing: true,
        encapsulation: Encapsulation::Vxlan,
        disabled: false,
    };
    vec![
        OutputRef::typed(
            OutputKind::CalicoIPPools(pools),
            "projectcalico.org/v3",
            None,
        ),
        OutputRef::typed(
            OutputKind::CalicoNetworkSet,
            "projectcalico.org/v3",
            Some(NAME),
        ),
        OutputRef::typed(OutputKind::CiliumCIDRGroup, "cilium.io/v2", Some(NAME)),
    ]
}

fn options(outputs: Vec<OutputRef>) -> nodeipam_controller::reconcile::Options {
    let mut o = publishing(None, &[]);
    o.publish.typed = outputs;
    o
}

fn list(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str().map(String::from))
        .collect()
}

/// Whether a recorded object holds `cidr`: a pool of it, or a set or group listing it.
fn holds(o: &DynamicObject, cidr: &str) -> bool {
    let spec = &o.data["spec"];
    spec["cidr"] == cidr
        || list(&spec["nets"]).iter().any(|c| c == cidr)
        || list(&spec["externalCIDRs"]).iter().any(|c| c == cidr)
}

/// The first resourceVersion at which an object of `log` (not deleted) held `cidr`.
fn first_holding(log: &Log<DynamicObject>, cidr: &str) -> Option<u64> {
    let log = log.lock().expect("lock");
    log.iter()
        .filter(|(_, deleted, o)| !deleted && holds(o, cidr))
        .map(|(rv, _, _)| *rv)
        .min()
}

/// The resourceVersions after `after` at which `cidr` stopped being held: a pool of it
/// deleted, or a set or group written without it after holding it.
fn left_at(log: &Log<DynamicObject>, cidr: &str, after: u64) -> Vec<u64> {
    let log = log.lock().expect("lock");
    let mut held = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for (rv, deleted, o) in log.iter() {
        let now = !deleted && holds(o, cidr);
        if held.insert(o.name_any(), now) == Some(true) && !now && *rv > after {
            out.push(*rv);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_outputs_hold_a_range_before_its_first_block_and_until_it_drained() {
    let (_cp, c) = with_consumer_crds().await;
    // Someone else's pool, without our label: never touched.
    let theirs = their_pool(
        "default-ipv4-ippool",
        json!({ "cidr": "192.168.0.0/16", "natOutgoing": true, "ipipMode": "Always" }),
    );
    let theirs = ip_pools(&c)
        .create(&PostParams::default(), &theirs)
        .await
        .expect("create a pool nodeipam does not own");
    let (pools, _r1) = record(ip_pools(&c));
    let (sets, _r2) = record(network_sets(&c));
    let (groups, _r3) = record(cidr_groups(&c));
    let (nodes, _r4) = record(Api::<Node>::all(c.clone()));
    let _ctl = start_controller(c.clone(), options(typed()));
    for i in 0..3 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    create_config(
        &c,
        "fresh",
        spec(family("10.70.0.0/16", 24), family("fd00:70::/48", 64), None),
    )
    .await;
    for i in 0..3 {
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    let first_block = nodes
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, _, n)| pod_cidrs(n).iter().any(|c| c.starts_with("10.70.")))
        .map(|(rv, _, _)| *rv)
        .min()
        .expect("a node revision with a block");
    for (what, log) in [
        ("IPPool", &pools),
        ("GlobalNetworkSet", &sets),
        ("CiliumCIDRGroup", &groups),
    ] {
        for cidr in ["10.70.0.0/16", "fd00:70::/48"] {
            // The recorder may lag; the order is the resourceVersions'.
            let at = wait_for(
                &format!("the recorder to see a {what} hold {cidr}"),
                || async { first_holding(log, cidr) },
            )
            .await;
            assert!(
                at < first_block,
                "{what} held {cidr} at {at}, after the first block at {first_block}"
            );
        }
    }
    let v4 = ip_pools(&c)
        .get("nodeipam-10-70-0-0-16")
        .await
        .expect("our IPv4 pool");
    assert_eq!(
        v4.labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("nodeipam")
    );
    let s = &v4.data["spec"];
    assert_eq!(
        (
            s["natOutgoing"].clone(),
            s["vxlanMode"].clone(),
            s["ipipMode"].clone()
        ),
        (json!(true), json!("Always"), json!("Never"))
    );
    assert_eq!(s["disabled"], json!(false));
    ip_pools(&c)
        .get("nodeipam-fd00-70---48")
        .await
        .expect("our IPv6 pool");

    // Edited or deleted by hand: written again.
    let empty = json!({ "spec": { "externalCIDRs": [] } });
    cidr_groups(&c)
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&empty))
        .await
        .expect("empty the group by hand");
    ip_pools(&c)
        .delete("nodeipam-10-70-0-0-16", &Default::default())
        .await
        .expect("delete our pool by hand");
    let repaired = wait_for("the group and the pool to be repaired", || async {
        let group = cidr_groups(&c).get(NAME).await.ok()?;
        let pool = ip_pools(&c).get("nodeipam-10-70-0-0-16").await.ok()?;
        (list(&group.data["spec"]["externalCIDRs"]) == ["10.70.0.0/16", "fd00:70::/48"]
            && pool.data["spec"]["cidr"] == "10.70.0.0/16")
            .then(|| support::record::rv(&group).max(support::record::rv(&pool)))
    })
    .await;

    // Removed: held while nodes hold blocks, gone only after the last one.
    delete_config(&c, "fresh").await;
    wait_condition(&c, "fresh", "Drained", "False", Some("NodesRemaining")).await;
    for i in 0..3 {
        delete_node(&c, &format!("n{i}")).await;
    }
    wait_for("the range to leave every typed output", || async {
        let set = network_sets(&c).get(NAME).await.ok()?;
        let gone = ip_pools(&c)
            .get_opt("nodeipam-10-70-0-0-16")
            .await
            .ok()?
            .is_none();
        (gone && list(&set.data["spec"]["nets"]).is_empty()).then_some(())
    })
    .await;
    let last_node = nodes
        .lock()
        .expect("lock")
        .iter()
        .filter(|(_, deleted, _)| *deleted)
        .map(|(rv, _, _)| *rv)
        .max()
        .expect("the nodes' delete events");
    for (what, log) in [
        ("IPPool", &pools),
        ("GlobalNetworkSet", &sets),
        ("CiliumCIDRGroup", &groups),
    ] {
        let left = left_at(log, "10.70.0.0/16", repaired);
        assert!(!left.is_empty(), "{what} never dropped the range");
        for rv in left {
            assert!(
                rv > last_node,
                "{what} dropped the range at {rv}, before the last node left at {last_node}"
            );
        }
    }
    let now = ip_pools(&c)
        .get("default-ipv4-ippool")
        .await
        .expect("their pool");
    assert_eq!(
        now.resource_version(),
        theirs.resource_version(),
        "their pool was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_the_same_name_without_our_label_is_not_written_over() {
    let (_cp, c) = with_consumer_crds().await;
    let squatter = their_pool(
        "nodeipam-10-72-0-0-16",
        json!({ "cidr": "10.72.0.0/16", "disabled": true }),
    );
    let squatter = ip_pools(&c)
        .create(&PostParams::default(), &squatter)
        .await
        .expect("create a pool under our name");
    let _ctl = start_controller(c.clone(), options(typed()));
    create_node(&c, "n0", &[]).await;
    create_config(&c, "taken", spec(family("10.72.0.0/16", 24), None, None)).await;
    // The condition says what is behind and why: the write it cannot make.
    let what = "Ready=False naming the pool in the way";
    let ready = wait_condition_where(&c, "taken", what, "Ready", |ready| {
        ready.status == "False" && ready.message.contains("exists without the label")
    })
    .await;
    let message = ready.message;
    assert!(
        message.contains(
            "the IPPools labelled app.kubernetes.io/managed-by=nodeipam includes 10.72.0.0/16"
        ) && message.contains("IPPool nodeipam-10-72-0-0-16"),
        "{message}"
    );
    assert!(
        pod_cidrs(&get_node(&c, "n0").await.expect("node")).is_empty(),
        "allocated before the pools held the range"
    );
    let now = ip_pools(&c)
        .get("nodeipam-10-72-0-0-16")
        .await
        .expect("the pool");
    assert_eq!(
        now.resource_version(),
        squatter.resource_version(),
        "a pool without our label was written"
    );
    // Once it is out of the way, ours is written, the range is allocated from, and the
    // condition no longer carries the old reason.
    ip_pools(&c)
        .delete("nodeipam-10-72-0-0-16", &DeleteParams::default())
        .await
        .expect("delete their pool");
    wait_cidrs(&c, "n0").await;
    let ours = ip_pools(&c)
        .get("nodeipam-10-72-0-0-16")
        .await
        .expect("our pool");
    assert!(is_ours(&ours), "{:?}", ours.metadata.labels);
    let ready =
        wait_condition_where(&c, "taken", "Ready=True", "Ready", |r| r.status == "True").await;
    assert!(
        !ready.message.contains("without the label"),
        "{}",
        ready.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_crd_holds_allocation_back_and_names_the_output() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let group = OutputRef::typed(OutputKind::CiliumCIDRGroup, "cilium.io/v2", Some(NAME));
    let _ctl = start_controller(c.clone(), options(vec![group]));
    create_node(&c, "n0", &[]).await;
    create_config(&c, "pods", spec(family("10.73.0.0/16", 24), None, None)).await;
    let what = "Ready=False naming the missing CRD";
    let cfg = wait_condition_where(&c, "pods", what, "Ready", |ready| {
        ready.status == "False" && ready.message.contains("CRD installed")
    })
    .await;
    assert!(
        cfg.message
            .contains("CiliumCIDRGroup nodeipam-pod-network can be read")
            && cfg.message.contains("ciliumcidrgroups/cilium.io/v2"),
        "{}",
        cfg.message
    );
    assert!(
        pod_cidrs(&get_node(&c, "n0").await.expect("node")).is_empty(),
        "allocated with no CIDR group"
    );
    // The CRD arrives: the group is written, then the node gets its block.
    cp.install_crds(&crds())
        .await
        .expect("install the consumer CRDs");
    wait_cidrs(&c, "n0").await;
    let group = cidr_groups(&c).get(NAME).await.expect("the CIDR group");
    assert_eq!(list(&group.data["spec"]["externalCIDRs"]), ["10.73.0.0/16"]);
    wait_condition(&c, "pods", "Ready", "True", None).await;
}

/// Calico's API server refuses a pool smaller than one of its blocks (by default /26 for IPv4,
/// /122 for IPv6); nodeipam's ranges may be smaller (a pool's carved ranges often are). Each
/// pool says a block size its range fits, so every range gets a pool Calico accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_smaller_than_calicos_default_block_gets_a_pool_calico_accepts() {
    let (_cp, c) = with_consumer_crds().await;
    let _ctl = start_controller(c.clone(), options(typed()));
    create_node(&c, "n0", &[]).await;
    create_config(
        &c,
        "small",
        spec(
            family("10.74.0.0/28", 30),
            family("fd00:74::/124", 126),
            None,
        ),
    )
    .await;
    wait_cidrs(&c, "n0").await;
    for (name, cidr, block) in [
        ("nodeipam-10-74-0-0-28", "10.74.0.0/28", 28),
        ("nodeipam-fd00-74---124", "fd00:74::/124", 124),
    ] {
        let pool = ip_pools(&c).get(name).await.expect("the range's pool");
        assert_eq!(pool.data["spec"]["cidr"], cidr);
        assert_eq!(pool.data["spec"]["blockSize"], block, "{name}");
    }
    wait_condition(&c, "small", "Ready", "True", None).await;
}

/// `kubectl nodeipam check`, given the controller's typed-output flags, reads the typed
/// outputs as the controller does: clean while the controller keeps them, a pool deleted
/// behind its back is a range unpublished, and clean again once the controller repaired it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_the_typed_outputs_by_the_controllers_flags() {
    let (cp, c) = with_consumer_crds().await;
    let ctl = start_controller(c.clone(), options(typed()));
    create_node(&c, "n0", &[]).await;
    create_config(&c, "pods", spec(family("10.75.0.0/16", 24), None, None)).await;
    wait_cidrs(&c, "n0").await;
    let typed_flags = [
        "--calico-ip-pools",
        "--calico-ip-pool-encapsulation=VXLAN",
        "--calico-network-set=nodeipam-pod-network",
        "--cilium-cidr-group=nodeipam-pod-network",
    ];
    let clean = |r: &Run| r.code == Some(0);
    let first = check_until(&cp, &typed_flags, "a clean check", clean).await;
    assert!(
        first.out.contains("4 published output(s) checked"),
        "{}",
        first.out
    );

    stop_controller(ctl).await;
    ip_pools(&c)
        .delete("nodeipam-10-75-0-0-16", &DeleteParams::default())
        .await
        .expect("delete our pool");
    let found = check_until(&cp, &typed_flags, "the pool found missing", |r| {
        r.code == Some(1)
    })
    .await;
    assert_eq!(
        found.out.lines().collect::<Vec<_>>(),
        [
            "unpublished: the IPPools labelled app.kubernetes.io/managed-by=nodeipam lacks 10.75.0.0/16 (Active range of the pod network)"
        ],
        "{}",
        found.err
    );
    // Without the flags only the ConfigMap is read, and it is whole.
    let configmap_only = check_until(&cp, &[], "a check of the ConfigMap", clean).await;
    let checked = |r: &Run, n: usize| r.out.contains(&format!("{n} published output(s) checked"));
    assert!(checked(&configmap_only, 1), "{}", configmap_only.out);

    let _ctl = start_controller(c.clone(), options(typed()));
    check_until(&cp, &typed_flags, "a clean check after the repair", clean).await;
}

/// Runs `kubectl nodeipam check FLAGS` until `done` holds.
async fn check_until(
    cp: &ControlPlane,
    flags: &[&str],
    what: &str,
    done: impl Fn(&Run) -> bool,
) -> Run {
    let args: Vec<&str> = std::iter::once("check")
        .chain(flags.iter().copied())
        .collect();
    plugin_until(cp, &args, what, done).await
}
