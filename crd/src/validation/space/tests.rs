use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;
use crate::pool::{PoolHeadroom, PoolRanges, PoolScaleDown};
use crate::types::{Allocation, FamilySpec, NodeIPAMConfigSpec};

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn pool(name: &str, v4: &[&str], v6: &[&str]) -> NodeIPAMPool {
    let family = |cidrs: &[&str], range, node| {
        (!cidrs.is_empty()).then(|| PoolFamilySpec {
            cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
            range_mask_size: range,
            per_node_mask_size: node,
        })
    };
    let mut p = NodeIPAMPool::new(
        name,
        NodeIPAMPoolSpec {
            ipv4: family(v4, 20, 24),
            ipv6: family(v6, 56, 60),
            node_selector: None,
            ranges: PoolRanges::default(),
            headroom: PoolHeadroom::default(),
            scale_down: PoolScaleDown::default(),
        },
    );
    p.metadata.uid = Some(format!("uid-{name}"));
    p
}

fn config(name: &str, v4: Option<&str>, v6: Option<&str>) -> NodeIPAMConfig {
    NodeIPAMConfig::new(
        name,
        NodeIPAMConfigSpec {
            ipv4: v4.map(|c| FamilySpec {
                cidr: c.into(),
                per_node_mask_size: 24,
            }),
            ipv6: v6.map(|c| FamilySpec {
                cidr: c.into(),
                per_node_mask_size: 60,
            }),
            node_selector: None,
            allocation: Allocation::Enabled,
        },
    )
}

/// `config` made a child of `pool`: its controller owner reference and label.
fn child_of(mut config: NodeIPAMConfig, pool: &NodeIPAMPool) -> NodeIPAMConfig {
    config.metadata.labels = Some(BTreeMap::from([(POOL_LABEL.to_owned(), pool.name_any())]));
    config.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "nodeipam.io/v1alpha1".into(),
        kind: "NodeIPAMPool".into(),
        name: pool.name_any(),
        uid: pool.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    config
}

fn all(_: &PoolCidr) -> bool {
    true
}

fn paths_and_details(errors: &[FieldError]) -> Vec<(String, String)> {
    errors
        .iter()
        .map(|e| (e.path.clone(), e.to_string()))
        .collect()
}

#[test]
fn pools_must_not_overlap_each_other() {
    let gpu = pool("gpu", &["10.64.0.0/14", "10.128.0.0/16"], &["fd00:10::/48"]);
    let cpu = pool("cpu", &["10.128.0.0/17"], &["fd00:20::/48"]);
    let errors = pool_conflicts(&gpu, all, [&cpu, &gpu], [], &[]);
    let found = paths_and_details(&errors);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].0, "spec.ipv4.cidrs[1]");
    assert!(
        found[0].1.contains(
            "overlaps 10.128.0.0/17 (spec.ipv4.cidrs[0]) of NodeIPAMPool \"cpu\" (10.128.0.0/16 contains 10.128.0.0/17)"
        ),
        "{found:#?}"
    );
    // Only the CIDRs `fresh` selects are checked.
    let appended = pool_conflicts(&gpu, |c| c.index == 0, [&cpu], [], &[]);
    assert_eq!(appended, []);
    // The same pool (by name) is never its own conflict.
    assert_eq!(pool_conflicts(&gpu, all, [&gpu], [], &[]), []);
}

#[test]
fn pools_must_not_overlap_service_ranges() {
    let gpu = pool("gpu", &["10.64.0.0/14"], &[]);
    let services = [ServiceRangeRef {
        cidr: net("10.66.0.0/16"),
        source: "ServiceCIDR \"kubernetes\"",
    }];
    let found = paths_and_details(&pool_conflicts(&gpu, all, [], [], &services));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].0, "spec.ipv4.cidrs[0]");
    assert!(
        found[0]
            .1
            .contains("overlaps the Service range 10.66.0.0/16 of ServiceCIDR \"kubernetes\""),
        "{found:#?}"
    );
}

#[test]
fn pools_must_not_overlap_configs_they_did_not_carve() {
    let gpu = pool("gpu", &["10.64.0.0/14"], &["fd00:10::/48"]);
    let hand_made = config("hand-made", Some("10.65.0.0/20"), None);
    let v6_hand_made = config("v6", None, Some("fd00:10:0:100::/56"));
    let child = child_of(config("gpu-10-64-0-0-20", Some("10.64.0.0/20"), None), &gpu);
    let elsewhere = config("elsewhere", Some("10.0.0.0/16"), None);
    let found = paths_and_details(&pool_conflicts(
        &gpu,
        all,
        [],
        [&hand_made, &child, &elsewhere, &v6_hand_made],
        &[],
    ));
    assert_eq!(found.len(), 2, "{found:#?}");
    assert_eq!(found[0].0, "spec.ipv4.cidrs[0]");
    assert!(
        found[0].1.contains("NodeIPAMConfig \"hand-made\"")
            && found[0].1.contains("not a child of this pool"),
        "{found:#?}"
    );
    assert_eq!(found[1].0, "spec.ipv6.cidrs[0]");
    assert!(found[1].1.contains("NodeIPAMConfig \"v6\""), "{found:#?}");
}

#[test]
fn configs_inside_a_pool_must_be_its_children() {
    let gpu = pool("gpu", &["10.64.0.0/14"], &["fd00:10::/48"]);
    let cpu = pool("cpu", &["10.128.0.0/16"], &[]);
    let pools = [&gpu, &cpu];

    // A hand-made config inside the pool.
    let user = config("user", Some("10.64.16.0/20"), None);
    let found = paths_and_details(&config_pool_conflicts(&user, [true, true], pools));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].0, "spec.ipv4.cidr");
    assert!(
        found[0].1.contains("of NodeIPAMPool \"gpu\"")
            && found[0].1.contains("is not a child of that pool"),
        "{found:#?}"
    );
    // One that covers the pool.
    let wide = config("wide", Some("10.0.0.0/8"), None);
    let found = paths_and_details(&config_pool_conflicts(&wide, [true, true], pools));
    assert_eq!(found.len(), 2, "both pools: {found:#?}");

    // A child inside its pool, both families.
    let child = child_of(
        config(
            "gpu-10-64-0-0-20",
            Some("10.64.0.0/20"),
            Some("fd00:10::/56"),
        ),
        &gpu,
    );
    assert_eq!(config_pool_conflicts(&child, [true, true], pools), []);

    // A child outside its pool: IPv6 outside, and IPv4 inside another pool.
    let stray = child_of(
        config("gpu-stray", Some("10.128.0.0/20"), Some("fd00:99::/56")),
        &gpu,
    );
    let found = paths_and_details(&config_pool_conflicts(&stray, [true, true], pools));
    let paths: Vec<&str> = found.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(
        paths,
        ["spec.ipv4.cidr", "spec.ipv4.cidr", "spec.ipv6.cidr"],
        "{found:#?}"
    );
    assert!(found[0].1.contains("NodeIPAMPool \"cpu\""), "{found:#?}");
    assert!(
        found[1]
            .1
            .contains("lies outside NodeIPAMPool \"gpu\" (its IPv4 CIDRs: [10.64.0.0/14])"),
        "{found:#?}"
    );
    assert!(
        found[2].1.contains("lies outside NodeIPAMPool \"gpu\""),
        "{found:#?}"
    );

    // Label alone does not make a child.
    let mut labelled = config("labelled", Some("10.64.32.0/20"), None);
    labelled.metadata.labels = Some(BTreeMap::from([(POOL_LABEL.to_owned(), "gpu".into())]));
    assert_eq!(
        config_pool_conflicts(&labelled, [true, true], pools).len(),
        1
    );

    // Outside every pool: nothing to say; unchecked families are skipped.
    assert_eq!(
        config_pool_conflicts(
            &config("free", Some("10.0.0.0/16"), None),
            [true, true],
            pools
        ),
        []
    );
    assert_eq!(config_pool_conflicts(&user, [false, true], pools), []);
}
