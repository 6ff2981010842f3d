use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

use super::*;
use crate::pool::{PoolHeadroom, PoolRanges, PoolScaleDown};
use crate::validation::FieldErrorKind;

fn family(cidrs: &[&str], range: u8, node: u8) -> PoolFamilySpec {
    PoolFamilySpec {
        cidrs: cidrs.iter().map(|c| (*c).to_owned()).collect(),
        range_mask_size: range,
        per_node_mask_size: node,
    }
}

fn spec() -> NodeIPAMPoolSpec {
    NodeIPAMPoolSpec {
        ipv4: Some(family(&["10.64.0.0/14", "10.128.0.0/16"], 20, 24)),
        ipv6: Some(family(&["fd00:10:64::/48"], 56, 60)),
        node_selector: None,
        ranges: PoolRanges::default(),
        headroom: PoolHeadroom::default(),
        scale_down: PoolScaleDown::default(),
    }
}

/// The errors of `spec`, as (path, kind, detail).
fn errors(spec: &NodeIPAMPoolSpec) -> Vec<(String, FieldErrorKind, String)> {
    spec.parse()
        .expect_err("spec must be refused")
        .into_iter()
        .map(|e| (e.path.clone(), e.kind, e.to_string()))
        .collect()
}

/// Exactly one error, on `path`, whose message contains `needle`.
fn refused(spec: &NodeIPAMPoolSpec, path: &str, needle: &str) {
    let found = errors(spec);
    assert!(
        found.len() == 1 && found[0].0 == path && found[0].2.contains(needle),
        "want one error on {path} containing {needle:?}, got {found:#?}"
    );
}

#[test]
fn a_good_dual_stack_pool_parses_with_its_budget() {
    let pool = spec().parse().expect("valid");
    let v4 = pool.ipv4.as_ref().expect("ipv4");
    assert_eq!(v4.cidrs.len(), 2);
    assert_eq!(v4.blocks_per_range(), 16);
    // A /14 holds 64 /20s and a /16 16 more; IPv6's /48 holds 256 /56s; ranges.max is 32.
    assert_eq!(v4.budget_ranges(), 80);
    assert_eq!(pool.ipv6.as_ref().map(PoolFamily::budget_ranges), Some(256));
    assert_eq!(pool.budget_ranges(), 32);
    assert_eq!(pool.budget_blocks(), 32 * 16);
    assert_eq!(pool.naming_family(), Family::V4);
    assert_eq!(pool.empty_for, Duration::from_secs(1800));
    assert_eq!((pool.min_ranges, pool.max_ranges), (1, 32));
    assert_eq!(pool.headroom_blocks, 16);
    let child = v4
        .child_range("10.128.16.0/20".parse().expect("cidr"))
        .expect("a child range");
    assert_eq!(child.per_node_mask_size, 24);
    assert!(
        v4.child_range("10.128.16.0/21".parse().expect("cidr"))
            .is_none()
    );
    assert!(
        v4.child_range("10.200.0.0/20".parse().expect("cidr"))
            .is_none()
    );
}

#[test]
fn ipv6_only_pool_names_children_by_ipv6() {
    let mut s = spec();
    s.ipv4 = None;
    let pool = s.parse().expect("valid");
    assert_eq!(pool.naming_family(), Family::V6);
    assert_eq!(pool.blocks_per_range(), 16);
}

#[test]
fn no_family_is_required() {
    let mut s = spec();
    s.ipv4 = None;
    s.ipv6 = None;
    refused(&s, "spec", "at least one of spec.ipv4 or spec.ipv6");
}

#[test]
fn each_cidr_is_checked_and_named_by_index() {
    let cases: [(&[&str], &str, &str); 7] = [
        (&[], "spec.ipv4.cidrs", "at least one IPv4 CIDR"),
        (
            &["10.64.0.0/14", "banana"],
            "spec.ipv4.cidrs[1]",
            "must be a CIDR",
        ),
        (
            &["10.64.0.1/14"],
            "spec.ipv4.cidrs[0]",
            "did you mean 10.64.0.0/14",
        ),
        (
            &["fd00::/48"],
            "spec.ipv4.cidrs[0]",
            "put IPv6 CIDRs in spec.ipv6.cidrs",
        ),
        (&[""], "spec.ipv4.cidrs[0]", "Required value"),
        (
            &["10.64.0.0/14", "10.65.0.0/16"],
            "spec.ipv4.cidrs[1]",
            "overlaps spec.ipv4.cidrs[0] (10.64.0.0/14)",
        ),
        (
            &["10.64.0.0/14", "10.64.0.0/14"],
            "spec.ipv4.cidrs[1]",
            "must be disjoint",
        ),
    ];
    for (cidrs, path, needle) in cases {
        let mut s = spec();
        s.ipv4 = Some(family(cidrs, 20, 24));
        refused(&s, path, needle);
    }
    let mut s = spec();
    let many: Vec<String> = (0..17).map(|i| format!("10.{i}.0.0/16")).collect();
    s.ipv4 = Some(PoolFamilySpec {
        cidrs: many,
        range_mask_size: 20,
        per_node_mask_size: 24,
    });
    refused(&s, "spec.ipv4.cidrs", "must have at most 16 items");
}

#[test]
fn masks_are_checked() {
    let cases = [
        (
            20,
            20,
            "spec.ipv4.perNodeMaskSize",
            "more than spec.ipv4.rangeMaskSize (20)",
        ),
        (
            24,
            20,
            "spec.ipv4.perNodeMaskSize",
            "more than spec.ipv4.rangeMaskSize",
        ),
        (16, 31, "spec.ipv4.perNodeMaskSize", "at most 30 for IPv4"),
        (
            13,
            24,
            "spec.ipv4.rangeMaskSize",
            "prefix length of spec.ipv4.cidrs[0] (10.64.0.0/14)",
        ),
        (
            15,
            24,
            "spec.ipv4.rangeMaskSize",
            "spec.ipv4.cidrs[1] (10.128.0.0/16)",
        ),
    ];
    for (range, node, path, needle) in cases {
        let mut s = spec();
        s.ipv6 = None;
        s.ipv4 = Some(family(&["10.64.0.0/14", "10.128.0.0/16"], range, node));
        refused(&s, path, needle);
    }
    let mut s = spec();
    s.ipv4 = None;
    s.ipv6 = Some(family(&["fd00::/48"], 120, 127));
    refused(&s, "spec.ipv6.perNodeMaskSize", "at most 126 for IPv6");
    s.ipv6 = Some(family(&["fd00::/48"], 48, 65));
    refused(
        &s,
        "spec.ipv6.perNodeMaskSize",
        "at most 64 (spec.ipv6.rangeMaskSize plus 16)",
    );
}

#[test]
fn dual_stack_families_carve_in_lockstep() {
    let mut s = spec();
    s.ipv6 = Some(family(&["fd00:10:64::/48"], 56, 64));
    refused(
        &s,
        "spec.ipv6.perNodeMaskSize",
        "must be spec.ipv6.rangeMaskSize plus 4 (60)",
    );
}

#[test]
fn ranges_headroom_and_empty_for_are_checked() {
    let mut s = spec();
    s.ranges = PoolRanges { min: 5, max: 4 };
    refused(&s, "spec.ranges.min", "at most spec.ranges.max (4)");
    s.ranges = PoolRanges { min: 0, max: 257 };
    refused(&s, "spec.ranges.max", "between 1 and 256");
    s.ranges = PoolRanges { min: 0, max: 0 };
    refused(&s, "spec.ranges.max", "between 1 and 256");
    s.ranges = PoolRanges { min: 0, max: 256 };
    assert!(s.parse().is_ok());
    s.headroom.blocks = MAX_POOL_HEADROOM_BLOCKS + 1;
    refused(&s, "spec.headroom.blocks", "at most 16777216");
    s.headroom.blocks = 0;
    assert!(s.parse().is_ok());
    for bad in ["", "30", "-5m", "1d", " 30m", "30m ", "2562048h"] {
        s.scale_down.empty_for = bad.to_owned();
        refused(&s, "spec.scaleDown.emptyFor", "");
    }
    s.scale_down.empty_for = "x".repeat(33);
    refused(&s, "spec.scaleDown.emptyFor", "Too long");
    for good in ["0", "0s", "90s", "1h30m", "1.5h", "+5m", "2562047h"] {
        s.scale_down.empty_for = good.to_owned();
        assert!(s.parse().is_ok(), "{good}");
    }
}

#[test]
fn the_node_selector_is_checked() {
    let mut s = spec();
    s.node_selector = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "gpu".into(),
                operator: "In".into(),
                values: None,
            }]),
            match_fields: None,
        }],
    });
    refused(
        &s,
        "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values",
        "must be specified",
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let mut s = spec();
    s.ipv4 = Some(family(&["banana"], 20, 31));
    s.ranges.min = 99;
    let paths: Vec<String> = errors(&s).into_iter().map(|e| e.0).collect();
    assert_eq!(
        paths,
        [
            "spec.ipv4.cidrs[0]",
            "spec.ipv4.perNodeMaskSize",
            "spec.ipv6.perNodeMaskSize",
            "spec.ranges.min"
        ]
    );
}

#[test]
fn updates_may_append_cidrs_and_change_scaling_only() {
    let old = spec();
    let mut new = spec();
    if let Some(v4) = new.ipv4.as_mut() {
        v4.cidrs.push("10.200.0.0/16".into());
    }
    new.ranges = PoolRanges { min: 0, max: 64 };
    new.headroom.blocks = 100;
    new.scale_down.empty_for = "5m".into();
    assert_eq!(validate_pool_update(&old, &new), []);

    let paths = |new: &NodeIPAMPoolSpec| -> Vec<String> {
        validate_pool_update(&old, new)
            .into_iter()
            .map(|e| e.path)
            .collect()
    };
    let mut removed = spec();
    if let Some(v4) = removed.ipv4.as_mut() {
        v4.cidrs.remove(0);
    }
    assert_eq!(paths(&removed), ["spec.ipv4.cidrs"]);
    let mut masks = spec();
    if let Some(v6) = masks.ipv6.as_mut() {
        v6.range_mask_size = 52;
        v6.per_node_mask_size = 56;
    }
    assert_eq!(
        paths(&masks),
        ["spec.ipv6.rangeMaskSize", "spec.ipv6.perNodeMaskSize"]
    );
    let mut dropped = spec();
    dropped.ipv6 = None;
    assert_eq!(paths(&dropped), ["spec.ipv6"]);
    let mut selector = spec();
    selector.node_selector = Some(NodeSelector::default());
    assert_eq!(paths(&selector), ["spec.nodeSelector"]);
    let mut added = spec();
    added.ipv4 = None;
    assert_eq!(validate_pool_update(&added, &spec())[0].path, "spec.ipv4");
    // Reordering keeps every CIDR: allowed.
    let mut reordered = spec();
    if let Some(v4) = reordered.ipv4.as_mut() {
        v4.cidrs.reverse();
    }
    assert_eq!(paths(&reordered), Vec::<String>::new());
}

#[test]
fn a_pool_name_is_at_most_a_label_value_long() {
    assert_eq!(validate_pool_name(&"p".repeat(63)), None);
    for len in [64, 253] {
        let name = "p".repeat(len);
        let e = validate_pool_name(&name).expect("refused");
        assert_eq!(e.path, "metadata.name");
        assert_eq!(e.kind, FieldErrorKind::Invalid);
        assert!(
            e.detail.starts_with(&format!("{len} characters")),
            "{}",
            e.detail
        );
        assert!(e.detail.contains("at most 63"), "{}", e.detail);
        assert!(e.detail.contains("nodeipam.io/pool label"), "{}", e.detail);
    }
}
