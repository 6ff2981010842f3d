use serde_json::json;

use super::*;

fn read(v: Value) -> ClusterCidr {
    ClusterCidr::from_value(&v).expect("reads")
}

fn cc(name: &str, bits: i64, ipv4: &str, ipv6: &str) -> ClusterCidr {
    read(json!({
        "apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDR",
        "metadata": {"name": name},
        "spec": {"perNodeHostBits": bits, "ipv4": ipv4, "ipv6": ipv6},
    }))
}

fn refusals(items: &[ClusterCidr], view: &ClusterView) -> Vec<String> {
    plan(items, view)
        .expect_err("refused")
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_dual_stack_clustercidr_with_a_selector_becomes_one_config() {
    let item = read(json!({
        "apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDR",
        "metadata": {"name": "gpu", "finalizers": ["networking.x-k8s.io/cluster-cidr-finalizer"]},
        "spec": {
            "perNodeHostBits": 8, "ipv4": "10.90.0.0/16", "ipv6": "fd00:90::/104",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["gpu"]}]}]},
        },
    }));
    let plan = plan(std::slice::from_ref(&item), &ClusterView::default()).expect("converts");
    let [(config, Step::Create)] = &plan.configs[..] else {
        panic!("one config to create: {plan:?}");
    };
    assert!(plan.notes.is_empty(), "{:?}", plan.notes);
    let spec = &config.spec;
    assert_eq!(
        spec.ipv4,
        Some(FamilySpec {
            cidr: "10.90.0.0/16".into(),
            per_node_mask_size: 24
        })
    );
    assert_eq!(
        spec.ipv6,
        Some(FamilySpec {
            cidr: "fd00:90::/104".into(),
            per_node_mask_size: 120
        })
    );
    assert_eq!(spec.node_selector, item.node_selector);
    assert_eq!(spec.allocation, Allocation::Enabled);
    assert_eq!(config.metadata.name.as_deref(), Some("gpu"));
    // Nothing of node-ipam-controller's metadata (its finalizer) comes along.
    assert_eq!(config.metadata.finalizers, None);
    assert_eq!(
        config
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MIGRATED_FROM)),
        Some(&"networking.x-k8s.io/v1 gpu".to_owned())
    );
}

#[test]
fn what_changes_on_the_way_is_said() {
    let mut deleting = cc("old", 6, "10.1.0.7/20", "");
    deleting.deleting = true;
    let mut everyone = cc("all", 8, "", "fd00:2::/112");
    everyone.node_selector = Some(NodeSelector::default());
    let plan = plan(&[deleting, everyone], &ClusterView::default()).expect("converts");
    let names: Vec<_> = plan
        .configs
        .iter()
        .map(|(c, _)| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["all", "old"], "name order");
    let old = &plan.configs[1].0.spec;
    assert_eq!(
        old.ipv4.as_ref().unwrap().cidr,
        "10.1.0.0/20",
        "host bits cleared"
    );
    assert_eq!(old.ipv4.as_ref().unwrap().per_node_mask_size, 26);
    assert_eq!(
        old.allocation,
        Allocation::Disabled,
        "a deleted range drains"
    );
    assert_eq!(
        plan.configs[0].0.spec.node_selector, None,
        "no terms: every node"
    );
    let notes = plan.notes.join("\n");
    for said in [
        "ClusterCIDR \"old\": spec.ipv4 10.1.0.7/20 has host bits set: node-ipam-controller used 10.1.0.0/20",
        "ClusterCIDR \"old\": it is being deleted: the NodeIPAMConfig is Disabled",
        "ClusterCIDR \"all\": its nodeSelector has no terms",
    ] {
        assert!(notes.contains(said), "{said:?} not in:\n{notes}");
    }
}

#[test]
fn a_field_that_does_not_read_is_named() {
    let base = json!({
        "apiVersion": "networking.x-k8s.io/v1", "kind": "ClusterCIDR",
        "metadata": {"name": "a"}, "spec": {"perNodeHostBits": 8, "ipv4": "10.0.0.0/16"},
    });
    let with = |pointer: &str, value: Value| {
        let mut v = base.clone();
        *v.pointer_mut(pointer).expect("field") = value;
        ClusterCidr::from_value(&v).expect_err("refused")
    };
    assert!(with("/kind", json!("Node")).contains("kind \"Node\": not a ClusterCIDR"));
    let e = with("/apiVersion", json!("example.com/v1"));
    assert!(
        e.contains("apiVersion \"example.com/v1\"") && e.contains("networking.x-k8s.io/v1"),
        "{e}"
    );
    assert_eq!(
        with("/spec/perNodeHostBits", json!("8")),
        "spec.perNodeHostBits: must be an integer"
    );
    assert_eq!(with("/spec/ipv4", json!(10)), "spec.ipv4: must be a string");
    assert_eq!(with("/metadata/name", json!("")), "metadata.name: required");
    let e = with(
        "/spec",
        json!({"perNodeHostBits": 8, "nodeSelector": {"nodeSelectorTerms": "x"}}),
    );
    assert!(e.starts_with("spec.nodeSelector: "), "{e}");
    let mut no_bits = base.clone();
    no_bits["spec"]
        .as_object_mut()
        .unwrap()
        .remove("perNodeHostBits");
    assert_eq!(
        ClusterCidr::from_value(&no_bits).expect_err("refused"),
        "spec.perNodeHostBits: required"
    );
}

#[test]
fn what_cannot_map_is_refused_all_at_once_with_every_reason() {
    let items = [
        cc("a-wide", 8, "10.0.0.0/16", ""),
        // Overlaps a-wide: node-ipam-controller allows it, nodeipam does not.
        cc("b-inner", 8, "10.0.128.0/17", ""),
        // Host bits node-ipam-controller refuses (below 4) and more than the range has.
        cc("c-tiny", 2, "10.9.0.0/24", ""),
        cc("d-short", 12, "10.8.0.0/24", ""),
        // Valid for node-ipam-controller, but 2^72 blocks.
        cc("e-v6", 8, "", "fd00::/48"),
        cc("f-bad", 8, "10.0.0.0/33", "10.7.0.0/16"),
        cc("g-empty", 8, "", ""),
        cc("h-fine", 8, "10.20.0.0/16", ""),
    ];
    let text = refusals(&items, &ClusterView::default()).join("\n");
    for said in [
        "ClusterCIDR \"b-inner\": IPv4 range 10.0.128.0/17 overlaps 10.0.0.0/16 of ClusterCIDR \"a-wide\": node-ipam-controller lets ClusterCIDRs overlap, NodeIPAMConfigs may not",
        "ClusterCIDR \"c-tiny\": spec.perNodeHostBits: 2 is outside 4 to 8",
        "ClusterCIDR \"d-short\": spec.perNodeHostBits: 12 is outside 4 to 8",
        "ClusterCIDR \"e-v6\": spec.ipv6.perNodeMaskSize: Invalid value: \"120\": must be at most 80",
        "(from perNodeHostBits 8)",
        "ClusterCIDR \"f-bad\": spec.ipv4: \"10.0.0.0/33\" is not a CIDR",
        "ClusterCIDR \"f-bad\": spec.ipv6: \"10.7.0.0/16\" is not an IPv6 CIDR",
        "ClusterCIDR \"g-empty\": spec: neither ipv4 nor ipv6 is set",
    ] {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }
    for fine in ["a-wide", "h-fine"] {
        let refused = format!("ClusterCIDR {fine:?}:");
        assert!(!text.lines().any(|l| l.starts_with(&refused)), "{text}");
    }
}

#[test]
fn the_cluster_is_checked_as_the_webhook_checks_a_create() {
    let existing = NodeIPAMConfig::new(
        "taken",
        NodeIPAMConfigSpec {
            ipv4: Some(FamilySpec {
                cidr: "10.50.0.0/16".into(),
                per_node_mask_size: 24,
            }),
            ipv6: None,
            node_selector: None,
            allocation: Allocation::Disabled,
        },
    );
    let services = vec![nodeipam_webhook::ServiceRange {
        cidr: "10.96.0.0/12".parse().unwrap(),
        source: "ServiceCIDR \"kubernetes\"".into(),
    }];
    let view = view_of(vec![existing], vec![], services);
    let text = refusals(
        &[
            cc("svc", 8, "10.96.0.0/16", ""),
            cc("near", 8, "10.50.0.0/20", ""),
            cc("taken", 8, "10.51.0.0/16", ""),
        ],
        &view,
    )
    .join("\n");
    for said in [
        "ClusterCIDR \"svc\": spec.ipv4.cidr: Invalid value: \"10.96.0.0/16\": overlaps the Service range 10.96.0.0/12 of ServiceCIDR \"kubernetes\"",
        "ClusterCIDR \"near\": spec.ipv4.cidr: Invalid value: \"10.50.0.0/20\": overlaps 10.50.0.0/16 of NodeIPAMConfig \"taken\"",
        "ClusterCIDR \"taken\": a NodeIPAMConfig of that name exists with other ranges",
    ] {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }
    // Migrated before: the same ranges are left alone, a Disabled allocation too.
    let again = plan(&[cc("taken", 8, "10.50.0.0/16", "")], &view).expect("converts");
    assert_eq!(again.configs[0].1, Step::Unchanged);
}

#[test]
fn a_name_read_from_two_apis_is_refused() {
    let mut old = cc("a", 8, "10.0.0.0/16", "");
    old.api_version = "networking.k8s.io/v1alpha1".into();
    let text = refusals(
        &[old, cc("a", 8, "10.0.0.0/16", "")],
        &ClusterView::default(),
    )
    .join("\n");
    assert!(
        text.contains("ClusterCIDR \"a\": read twice, as networking.k8s.io/v1alpha1 and as networking.x-k8s.io/v1"),
        "{text}"
    );
}

#[test]
fn a_name_no_nodeipamconfig_can_have_is_refused() {
    for (name, reason) in [
        ("Upper", "lowercase RFC 1123"),
        ("a_b", "lowercase RFC 1123"),
        (&*"a".repeat(254), "no more than 253"),
    ] {
        let reasons = convert(&cc(name, 8, "10.120.0.0/16", "")).expect_err(name);
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with("metadata.name: ") && r.contains(reason)),
            "{name}: {reasons:?}"
        );
    }
    assert!(convert(&cc("a.b-c", 8, "10.120.0.0/16", "")).is_ok());
}
