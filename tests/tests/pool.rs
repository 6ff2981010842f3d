//! End-to-end tests of NodeIPAMPools against a real API server: a burst of nodes outgrows the
//! first range and every podCIDR is handed out with no manual step, each carved range is
//! published before its first block, empty ranges retire down to `ranges.min`, a used-up budget
//! says Exhausted, dual stack beside a hand-made config and a Service range, a controller
//! killed mid-carve leaves no duplicate or orphan child, and a deleted pool's children drain
//! before they go.
//!
//! The controller runs in this process without its webhook (but for the webhook's own test).
//! Deleting a pool runs kube-controller-manager's garbage collector beside the API server, as
//! a cluster has it: it deletes the children, and each drains before it is forgotten.

mod support;

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::networking::v1::{ServiceCIDR, ServiceCIDRSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodeipam_controller::reconcile::Options;
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_crd::pool::{
    NodeIPAMPool, NodeIPAMPoolSpec, POOL_LABEL, PoolFamilySpec, PoolHeadroom, PoolRanges,
    PoolScaleDown, is_child_of,
};
use support::record::record;
use support::*;

const NS: &str = "nodeipam-system";
const CM: &str = "nodeipam-pod-network";
const MASQ: &str = "ip-masq-agent";

/// Whether the pod-network ConfigMap `cm` lists `range`.
fn publishes(cm: &ConfigMap, range: &IpNet) -> bool {
    let key = if range.addr().is_ipv4() {
        "ipv4"
    } else {
        "ipv6"
    };
    cm.name_any() == CM
        && cm
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .is_some_and(|v| v.split(',').any(|x| x == range.to_string()))
}

/// The CIDRs of ip-masq-agent's `nonMasqueradeCIDRs`.
fn non_masquerade(cm: &ConfigMap) -> Vec<IpNet> {
    let text = cm.data.as_ref().and_then(|d| d.get("config"));
    let doc: serde_json::Value =
        serde_saphyr::from_str(text.map_or("", String::as_str)).unwrap_or(serde_json::Value::Null);
    doc["nonMasqueradeCIDRs"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|c| c.as_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn pool_family(cidrs: &[&str], range: u8, node: u8) -> Option<PoolFamilySpec> {
    Some(PoolFamilySpec {
        cidrs: cidrs.iter().map(ToString::to_string).collect(),
        range_mask_size: range,
        per_node_mask_size: node,
    })
}

fn pool_spec(
    ipv4: Option<PoolFamilySpec>,
    ipv6: Option<PoolFamilySpec>,
    (min, max, headroom): (u32, u32, u32),
    empty_for: &str,
) -> NodeIPAMPoolSpec {
    NodeIPAMPoolSpec {
        ipv4,
        ipv6,
        node_selector: None,
        ranges: PoolRanges { min, max },
        headroom: PoolHeadroom { blocks: headroom },
        scale_down: PoolScaleDown {
            empty_for: empty_for.into(),
        },
    }
}

async fn create_pool(client: &Client, name: &str, spec: NodeIPAMPoolSpec) -> NodeIPAMPool {
    let api: Api<NodeIPAMPool> = Api::all(client.clone());
    api.create(&PostParams::default(), &NodeIPAMPool::new(name, spec))
        .await
        .unwrap_or_else(|e| panic!("create NodeIPAMPool {name}: {e}"))
}

/// The pool `name` of /26 ranges of /28 blocks (4 nodes a range) in `space` (min 1, max 8,
/// headroom 1, `empty_for`), then `n` nodes `<prefix>0…`, each served.
async fn pool_of_fours_with_nodes(
    client: &Client,
    (name, space, empty_for): (&str, &str, &str),
    prefix: &str,
    n: usize,
) -> NodeIPAMPool {
    let spec = pool_spec(pool_family(&[space], 26, 28), None, (1, 8, 1), empty_for);
    let pool = create_pool(client, name, spec).await;
    for i in 0..n {
        create_node(client, &format!("{prefix}{i}"), &[]).await;
    }
    for i in 0..n {
        wait_cidrs(client, &format!("{prefix}{i}")).await;
    }
    pool
}

async fn get_pool(client: &Client, name: &str) -> NodeIPAMPool {
    Api::<NodeIPAMPool>::all(client.clone())
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get pool {name}: {e}"))
}

/// Every NodeIPAMConfig, or `None` if the list fails (for `wait_for`).
async fn all_configs(client: &Client) -> Option<Vec<NodeIPAMConfig>> {
    let api = Api::<NodeIPAMConfig>::all(client.clone());
    Some(api.list(&ListParams::default()).await.ok()?.items)
}

/// The pool's children that exist and are not being deleted.
async fn children(client: &Client, pool: &NodeIPAMPool) -> Vec<NodeIPAMConfig> {
    Api::<NodeIPAMConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list configs")
        .items
        .into_iter()
        .filter(|c| is_child_of(c, pool) && c.metadata.deletion_timestamp.is_none())
        .collect()
}

fn config_ranges(c: &NodeIPAMConfig) -> Vec<IpNet> {
    [&c.spec.ipv4, &c.spec.ipv6]
        .into_iter()
        .flatten()
        .filter_map(|f| f.cidr.parse().ok())
        .collect()
}

fn pool_condition(p: &NodeIPAMPool, type_: &str) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Every config labelled for a pool is a child of a live pool, and no two children overlap.
async fn assert_no_duplicate_or_orphan(client: &Client) {
    let pools: Vec<NodeIPAMPool> = Api::<NodeIPAMPool>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list pools")
        .items;
    let configs = Api::<NodeIPAMConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list configs")
        .items;
    let labelled: Vec<&NodeIPAMConfig> = configs
        .iter()
        .filter(|c| c.labels().contains_key(POOL_LABEL))
        .collect();
    for c in &labelled {
        assert!(
            pools.iter().any(|p| is_child_of(c, p)),
            "{} is labelled for a pool but is no live pool's child",
            c.name_any()
        );
    }
    for (i, a) in labelled.iter().enumerate() {
        for b in &labelled[i + 1..] {
            for ra in config_ranges(a) {
                for rb in config_ranges(b) {
                    assert!(
                        !nodeipam_crd::overlaps(&ra, &rb),
                        "children {} ({ra}) and {} ({rb}) overlap",
                        a.name_any(),
                        b.name_any()
                    );
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_outgrows_the_first_range_each_new_range_published_first_then_retires_to_min() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let (cms, _cms_recorder) = record(Api::<ConfigMap>::namespaced(c.clone(), NS));
    let (nodes, _nodes_recorder) = record(Api::<Node>::all(c.clone()));
    let (configs, _configs_recorder) = record(Api::<NodeIPAMConfig>::all(c.clone()));
    // ip-masq-agent's ConfigMap exists (its owner makes it); ours is only nonMasqueradeCIDRs.
    let masq = ConfigMap {
        metadata: ObjectMeta {
            name: Some(MASQ.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "config".to_string(),
            "nonMasqueradeCIDRs: []\n".to_string(),
        )])),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(c.clone(), NS)
        .create(&PostParams::default(), &masq)
        .await
        .expect("create the ip-masq-agent ConfigMap");
    let masq_ref = format!("{NS}/{MASQ}");
    let _ctl = start_controller(c.clone(), publishing(Some(&masq_ref), &[]));
    // 10 nodes need at least 3 ranges of 4 blocks.
    let pool = pool_of_fours_with_nodes(&c, ("pods", "10.70.0.0/16", "2s"), "n", 10).await;
    let kids = children(&c, &pool).await;
    assert!(kids.len() >= 3, "{} children for 10 nodes", kids.len());
    assert!(kids.len() <= 8);
    wait_event(&c, "pods", "RangeCarved").await;
    // Each child's range was in the published ConfigMap before any node held a block of it.
    let cms = cms.lock().expect("lock").clone();
    let nodes_log = nodes.lock().expect("lock").clone();
    for kid in &kids {
        for range in config_ranges(kid) {
            let published = cms
                .iter()
                .filter(|(_, deleted, cm)| !deleted && publishes(cm, &range))
                .map(|(rv, _, _)| *rv)
                .min();
            let first_block = nodes_log
                .iter()
                .filter(|(_, deleted, n)| {
                    !deleted
                        && pod_cidrs(n).iter().any(|b| {
                            b.parse::<IpNet>()
                                .is_ok_and(|b| nodeipam_crd::overlaps(&range, &b))
                        })
                })
                .map(|(rv, _, _)| *rv)
                .min();
            // ip-masq-agent may hold it merged with its neighbours: covered is enough.
            let masqueraded = cms
                .iter()
                .filter(|(_, deleted, cm)| {
                    !deleted
                        && cm.name_any() == MASQ
                        && non_masquerade(cm)
                            .iter()
                            .any(|c| c.contains(&range.network()) && c.contains(&range.broadcast()))
                })
                .map(|(rv, _, _)| *rv)
                .min();
            if let Some(first_block) = first_block {
                let published = published.unwrap_or_else(|| panic!("{range} never published"));
                assert!(
                    published < first_block,
                    "{range} published at {published}, after its first block at {first_block}"
                );
                let masqueraded = masqueraded
                    .unwrap_or_else(|| panic!("{range} never in ip-masq-agent's config"));
                assert!(
                    masqueraded < first_block,
                    "{range} in ip-masq-agent's config at {masqueraded}, after its first block at {first_block}"
                );
            }
        }
    }
    // Each child was created held: its first version already carries our finalizer, so no
    // finalizer write stands between a carve and its first block.
    let configs_log = configs.lock().expect("lock").clone();
    for kid in &kids {
        let first = configs_log
            .iter()
            .filter(|(_, _, c)| c.uid() == kid.uid())
            .min_by_key(|(rv, _, _)| *rv)
            .map(|(_, _, c)| c.finalizers().to_vec())
            .unwrap_or_else(|| panic!("{} never recorded", kid.name_any()));
        assert_eq!(first, [nodeipam_crd::FINALIZER], "{}", kid.name_any());
    }
    assert_invariant(&c, &[]).await;
    assert_no_duplicate_or_orphan(&c).await;
    // Every node goes: the extra ranges retire after emptyFor, down to min.
    for i in 0..10 {
        delete_node(&c, &format!("n{i}")).await;
    }
    wait_for("the pool to retire down to one range", || async {
        (children(&c, &pool).await.len() == 1).then_some(())
    })
    .await;
    wait_event(&c, "pods", "RangeRetired").await;
    wait_for("retired children to be gone", || async {
        let all = all_configs(&c).await?;
        (all.len() == 1).then_some(())
    })
    .await;
    // The lowest range stays; the status says so once the next decision wrote it.
    let status = wait_for("the pool status to show one range", || async {
        let status = get_pool(&c, "pods").await.status?;
        (status.ranges.len() == 1).then_some(status)
    })
    .await;
    assert_eq!(status.ranges[0].ipv4.as_deref(), Some("10.70.0.0/26"));
    assert_eq!(status.ranges[0].state, "Active");
    assert_eq!(status.ipv4.map(|f| f.ranges), Some(1));
    assert_no_duplicate_or_orphan(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_up_budget_says_exhausted_and_the_waiting_node_is_told() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    // Two /27 ranges of /28 blocks: 4 nodes fit.
    create_pool(
        &c,
        "small",
        pool_spec(
            pool_family(&["10.71.0.0/26"], 27, 28),
            None,
            (1, 4, 0),
            "30m",
        ),
    )
    .await;
    for i in 0..4 {
        create_node(&c, &format!("s{i}"), &[]).await;
    }
    for i in 0..4 {
        wait_cidrs(&c, &format!("s{i}")).await;
    }
    create_node(&c, "late", &[]).await;
    wait_for("the pool to say Exhausted", || async {
        let p = get_pool(&c, "small").await;
        (pool_condition(&p, "Exhausted") == Some(("True".into(), "BudgetExhausted".into())))
            .then_some(())
    })
    .await;
    wait_event(&c, "late", "CIDRNotAvailable").await;
    wait_event(&c, "small", "PoolExhausted").await;
    // The nodes that got a block were never told there was none.
    for i in 0..4 {
        assert!(
            events_for(&c, &format!("s{i}"), "CIDRNotAvailable")
                .await
                .is_empty(),
            "s{i} was warned while its pool could still grow"
        );
    }
    let p = get_pool(&c, "small").await;
    let v4 = p.status.and_then(|s| s.ipv4).expect("ipv4 status");
    assert_eq!((v4.ranges, v4.capacity, v4.allocated), (2, 4, 4));
    assert_invariant(&c, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// The webhook (not running here) would refuse a pool whose CIDRs hold a hand-made config; the
/// controller must not depend on it, and a Service range can land in a pool's CIDRs anyway.
async fn a_dual_stack_pool_carves_around_a_hand_made_config_and_a_service_range() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let _ctl = start_controller(c.clone(), publishing(None, &[]));
    create_ready_config(
        &c,
        "hand",
        spec(
            family("10.72.0.0/24", 26),
            family("fd72::/64", 66),
            selector(&[("hand", "In", &["yes"])]),
        ),
    )
    .await;
    let services: Api<ServiceCIDR> = Api::all(c.clone());
    services
        .create(
            &PostParams::default(),
            &ServiceCIDR {
                metadata: ObjectMeta {
                    name: Some("extra".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(ServiceCIDRSpec {
                    cidrs: Some(vec!["10.72.1.0/24".into()]),
                }),
                status: None,
            },
        )
        .await
        .expect("create ServiceCIDR");
    // /24 and /64 ranges of 4 blocks each, in lockstep.
    let pool = create_pool(
        &c,
        "ds",
        pool_spec(
            pool_family(&["10.72.0.0/22"], 24, 26),
            pool_family(&["fd72::/62"], 64, 66),
            (1, 4, 1),
            "30m",
        ),
    )
    .await;
    create_node(&c, "h1", &[("hand", "yes")]).await;
    for i in 0..6 {
        create_node(&c, &format!("d{i}"), &[]).await;
    }
    let hand = wait_cidrs(&c, "h1").await;
    assert!(hand[0].starts_with("10.72.0."), "{hand:?}");
    for i in 0..6 {
        let cidrs = wait_cidrs(&c, &format!("d{i}")).await;
        assert_eq!(cidrs.len(), 2, "dual stack: {cidrs:?}");
        let v4: IpNet = cidrs[0].parse().expect("v4");
        assert!(
            ["10.72.2.0/24", "10.72.3.0/24"]
                .iter()
                .any(|r| r.parse::<IpNet>().expect("r").contains(&v4)),
            "d{i} got {v4}: not around the hand-made config and the Service range"
        );
        let v6: IpNet = cidrs[1].parse().expect("v6");
        assert!(!"fd72::/64".parse::<IpNet>().expect("r").contains(&v6));
    }
    let mut names: Vec<String> = children(&c, &pool)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    assert_eq!(names, ["ds-10-72-2-0-24", "ds-10-72-3-0-24"]);
    assert_invariant(&c, &[]).await;
    assert_no_duplicate_or_orphan(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_mid_carve_leaves_no_duplicate_or_orphan_child() {
    let cp = control_plane().await;
    let c = cp.client();
    let pool = create_pool(
        &c,
        "kill",
        pool_spec(
            pool_family(&["10.73.0.0/16"], 27, 29),
            None,
            (1, 16, 2),
            "2s",
        ),
    )
    .await;
    for i in 0..16 {
        create_node(&c, &format!("k{i}"), &[]).await;
    }
    // Kill the controller again and again while it carves; each new one starts from a list.
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    for round in 0..6 {
        let ctl = start_controller(c.clone(), Options::default());
        let wait = 150 + 120 * round as u64;
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        stop_controller(ctl).await;
        seen.insert(round, children(&c, &pool).await.len());
        assert_no_duplicate_or_orphan(&c).await;
    }
    let _ctl = start_controller(c.clone(), Options::default());
    for i in 0..16 {
        wait_cidrs(&c, &format!("k{i}")).await;
    }
    // 16 nodes and 2 of headroom in ranges of 4: 5 ranges once the burst is over. The burst
    // may have carved ahead of demand; those ranges stay empty and retire after emptyFor,
    // the highest first, down to what the headroom needs: the lowest five, and not one more.
    let kids = wait_for("the pool to settle at five ranges", || async {
        let p = get_pool(&c, "kill").await;
        let kids = children(&c, &pool).await;
        (pool_condition(&p, "Scaling").map(|(s, _)| s) == Some("False".into()) && kids.len() == 5)
            .then_some(kids)
    })
    .await;
    let mut ranges: Vec<String> = kids
        .iter()
        .map(|k| k.spec.ipv4.as_ref().expect("ipv4").cidr.clone())
        .collect();
    ranges.sort_by_key(|r| r.parse::<IpNet>().expect("cidr"));
    assert_eq!(
        ranges,
        [
            "10.73.0.0/27",
            "10.73.0.32/27",
            "10.73.0.64/27",
            "10.73.0.96/27",
            "10.73.0.128/27"
        ],
        "children after restarts {seen:?}"
    );
    assert_invariant(&c, &[]).await;
    assert_no_duplicate_or_orphan(&c).await;
}

/// Deleting a pool deletes its children through kube-controller-manager's garbage collector
/// (started for this test, as a cluster runs it), and each drains like any deleted config:
/// held by our finalizer while a node holds a block from it, published until its last node is
/// gone, and only then forgotten (checked by resourceVersion order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pool_deletes_its_children_each_forgotten_only_after_it_drained() {
    let mut cp = control_plane().await;
    if let Err(e) = cp.start_garbage_collector().await {
        panic!("{e}");
    }
    let c = cp.client();
    namespace(&c, NS).await;
    let (cms, _cms_recorder) = record(Api::<ConfigMap>::namespaced(c.clone(), NS));
    let (nodes, _nodes_recorder) = record(Api::<Node>::all(c.clone()));
    let _ctl = start_controller(c.clone(), publishing(None, &[]));
    // 6 nodes need at least 2 ranges of 4 blocks. Nothing retires by itself.
    let pool = pool_of_fours_with_nodes(&c, ("gone", "10.74.0.0/16", "1h"), "g", 6).await;
    let kids = children(&c, &pool).await;
    assert!(kids.len() >= 2, "{} children for 6 nodes", kids.len());
    let held: Vec<IpNet> = Api::<Node>::all(c.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .flat_map(pod_cidrs)
        .map(|b| b.parse().expect("podCIDR parses"))
        .collect();

    Api::<NodeIPAMPool>::all(c.clone())
        .delete("gone", &DeleteParams::default())
        .await
        .expect("delete the pool");
    // The collector deletes every child; those a node holds a block from stay, held and
    // still published, the others go at once.
    let left = wait_for("the garbage collector to delete the children", || async {
        let all = all_configs(&c).await?;
        let holding = |k: &NodeIPAMConfig| {
            config_ranges(k)
                .iter()
                .any(|r| held.iter().any(|b| r.contains(b)))
        };
        (all.iter()
            .all(|k| k.metadata.deletion_timestamp.is_some() && holding(k)))
        .then_some(all)
    })
    .await;
    for block in &held {
        assert!(
            left.iter()
                .any(|k| config_ranges(k).iter().any(|r| r.contains(block))),
            "{block} is held, but the child it came from is gone: {left:?}"
        );
    }
    assert!(
        Api::<NodeIPAMPool>::all(c.clone())
            .get_opt("gone")
            .await
            .expect("get the pool")
            .is_none(),
        "the deleted pool is still there"
    );
    let cm = Api::<ConfigMap>::namespaced(c.clone(), NS)
        .get(CM)
        .await
        .expect("the pod-network ConfigMap");
    for k in &left {
        for range in config_ranges(k) {
            assert!(
                publishes(&cm, &range),
                "{range} is held but not published: {cm:?}"
            );
        }
    }
    assert_invariant(&c, &[]).await;

    // The nodes go: every child drains and goes, and the pool's space leaves the pod network.
    for i in 0..6 {
        delete_node(&c, &format!("g{i}")).await;
    }
    wait_for("every child to be gone", || async {
        let all = all_configs(&c).await?;
        all.is_empty().then_some(())
    })
    .await;
    let pool_space: IpNet = "10.74.0.0/16".parse().expect("cidr");
    wait_for("the pool's ranges to leave the pod network", || async {
        let cm = Api::<ConfigMap>::namespaced(c.clone(), NS)
            .get(CM)
            .await
            .ok()?;
        let v4 = cm.data.as_ref()?.get("ipv4").cloned().unwrap_or_default();
        (!v4.split(',')
            .filter_map(|x| x.parse::<IpNet>().ok())
            .any(|r| pool_space.contains(&r)))
        .then_some(())
    })
    .await;
    // Each range was forgotten only after the last node holding a block from it was deleted.
    let cms = cms.lock().expect("lock").clone();
    let nodes_log = nodes.lock().expect("lock").clone();
    for k in &left {
        for range in config_ranges(k) {
            let last_holder_gone = nodes_log
                .iter()
                .filter(|(_, deleted, n)| {
                    *deleted
                        && pod_cidrs(n)
                            .iter()
                            .any(|b| b.parse::<IpNet>().is_ok_and(|b| range.contains(&b)))
                })
                .map(|(rv, _, _)| *rv)
                .max()
                .unwrap_or_else(|| panic!("no node held a block of {range}"));
            let first_published = cms
                .iter()
                .filter(|(_, deleted, cm)| !deleted && publishes(cm, &range))
                .map(|(rv, _, _)| *rv)
                .min()
                .unwrap_or_else(|| panic!("{range} never published"));
            let forgotten = cms
                .iter()
                .filter(|(rv, deleted, cm)| {
                    !deleted
                        && cm.name_any() == CM
                        && *rv > first_published
                        && !publishes(cm, &range)
                })
                .map(|(rv, _, _)| *rv)
                .min()
                .unwrap_or_else(|| panic!("{range} never left the pod network"));
            assert!(
                forgotten > last_holder_gone,
                "{range} left the pod network at {forgotten}, before its last node went at {last_holder_gone}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_admits_the_children_the_controller_carves_and_no_one_elses() {
    let cp = control_plane().await;
    let c = cp.client();
    let hook = with_webhook(&cp).await;
    let _ctl = start_controller(c.clone(), Options::default());
    let pool = create_pool(
        &c,
        "guarded",
        pool_spec(
            pool_family(&["10.74.0.0/16"], 27, 29),
            pool_family(&["fd74::/48"], 124, 126),
            (1, 8, 1),
            "30m",
        ),
    )
    .await;
    for i in 0..9 {
        create_node(&c, &format!("g{i}"), &[]).await;
    }
    for i in 0..9 {
        let cidrs = wait_cidrs(&c, &format!("g{i}")).await;
        assert_eq!(cidrs.len(), 2, "{cidrs:?}");
    }
    let kids = children(&c, &pool).await;
    assert!(kids.len() >= 3, "{} children", kids.len());
    // A hand-made config inside the pool's space is refused: only its children may be there.
    let api: Api<NodeIPAMConfig> = Api::all(c.clone());
    let intruder = NodeIPAMConfig::new("intruder", spec(family("10.74.200.0/24", 28), None, None));
    match api.create(&PostParams::default(), &intruder).await {
        Err(kube::Error::Api(s)) => assert!(
            s.message.contains("not a child of that pool"),
            "{}",
            s.message
        ),
        Ok(_) => panic!("a config inside the pool's space was admitted"),
        Err(e) => panic!("{e}"),
    }
    assert_invariant(&c, &[]).await;
    assert_no_duplicate_or_orphan(&c).await;
    hook.abort();
}

/// Every child is created `Disabled` and marked awaiting its enable, and the controller then
/// enables it (at the version it read) and it serves. A create that lands late (here the
/// controller's own child object for the next range, landing while the pool has its max: what
/// an answer of 500 whose create commits later leaves behind) is never enabled: the pool
/// counts it, finds itself over max and retires it, and at no revision are more than max
/// children enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_is_created_disabled_then_enabled_and_a_late_create_is_never_enabled_past_max() {
    use nodeipam_controller::alloc::effects::ChildConfig;
    use nodeipam_crd::Allocation;
    use nodeipam_crd::pool::{AWAITING_ENABLE, child_name};

    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let (configs, _configs_recorder) = record(Api::<NodeIPAMConfig>::all(c.clone()));
    let _ctl = start_controller(c.clone(), publishing(None, &[]));
    // At most one range of 4 blocks.
    let spec = pool_spec(
        pool_family(&["10.74.0.0/24"], 26, 28),
        None,
        (1, 1, 0),
        "30m",
    );
    let pool = create_pool(&c, "one", spec).await;
    create_node(&c, "a0", &[]).await;
    wait_cidrs(&c, "a0").await;
    let kids = children(&c, &pool).await;
    assert_eq!(kids.len(), 1, "{kids:?}");
    let first = kids[0].name_any();
    let awaiting = |o: &NodeIPAMConfig| o.annotations().contains_key(AWAITING_ENABLE);
    assert_eq!(kids[0].spec.allocation, Allocation::Enabled);
    assert!(!awaiting(&kids[0]), "the marker is removed by the enable");
    let created = configs
        .lock()
        .expect("lock")
        .iter()
        .find(|(_, _, o)| o.name_any() == first)
        .map(|(_, _, o)| o.clone())
        .expect("the child's first version");
    assert_eq!(created.spec.allocation, Allocation::Disabled);
    assert!(awaiting(&created), "created with the marker: {created:?}");

    // A late create of the next range lands.
    let range: IpNet = "10.74.0.64/26".parse().expect("range");
    let late = ChildConfig {
        pool: "one".into(),
        pool_uid: pool.uid(),
        name: child_name("one", &range),
        ipv4: Some((range, 28)),
        ipv6: None,
        selector: None,
    };
    let api = Api::<NodeIPAMConfig>::all(c.clone());
    api.create(&PostParams::default(), &late.object())
        .await
        .expect("the late create lands");
    wait_for("the late child to be retired", || async {
        match api.get_opt(&late.name).await {
            Ok(None) => Some(()),
            Ok(Some(o)) => o.metadata.deletion_timestamp.map(|_| ()),
            Err(_) => None,
        }
    })
    .await;
    wait_event(&c, "one", "RangeRetired").await;
    // Replay every recorded version in revision order: never two children enabled at once,
    // and the late one never enabled.
    let mut log = configs.lock().expect("lock").clone();
    log.sort_by_key(|(rv, _, _)| *rv);
    let mut now: BTreeMap<String, NodeIPAMConfig> = BTreeMap::new();
    for (rv, deleted, o) in log {
        if deleted {
            now.remove(&o.name_any());
        } else {
            now.insert(o.name_any(), o);
        }
        let enabled: Vec<&String> = now
            .iter()
            .filter(|(_, o)| {
                is_child_of(o, &pool)
                    && o.spec.allocation == Allocation::Enabled
                    && o.metadata.deletion_timestamp.is_none()
            })
            .map(|(n, _)| n)
            .collect();
        assert!(
            enabled.len() <= 1,
            "at revision {rv}: {enabled:?} enabled, max 1"
        );
        assert!(
            !enabled.contains(&&late.name),
            "at revision {rv}: the late child was enabled"
        );
    }
    // The node is still served by the first child, and the pool still has its one range.
    assert_eq!(children(&c, &pool).await.len(), 1);
    assert_no_duplicate_or_orphan(&c).await;
}
