//! Unit tests of the admission decision: one or more per rule.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use nodeipam_crd::{Allocation, FamilySpec, NodeIPAMConfig, NodeIPAMConfigSpec};
use serde_json::json;

use super::*;

fn family(cidr: &str, mask: u8) -> Option<FamilySpec> {
    Some(FamilySpec {
        cidr: cidr.into(),
        per_node_mask_size: mask,
    })
}

fn config(name: &str, ipv4: Option<FamilySpec>, ipv6: Option<FamilySpec>) -> NodeIPAMConfig {
    NodeIPAMConfig::new(
        name,
        NodeIPAMConfigSpec {
            ipv4,
            ipv6,
            node_selector: None,
            allocation: Allocation::Enabled,
        },
    )
}

fn request_for<K>(
    kind: (&str, &str, &str),
    resource: (&str, &str, &str),
    operation: &str,
    object: Option<&K>,
    old: Option<&K>,
) -> AdmissionRequest<K>
where
    K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned,
{
    let name = object
        .or(old)
        .and_then(|o| o.meta().name.clone())
        .unwrap_or_default();
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-123",
            "kind": {"group": kind.0, "version": kind.1, "kind": kind.2},
            "resource": {"group": resource.0, "version": resource.1, "resource": resource.2},
            "name": name,
            "operation": operation,
            "userInfo": {"username": "tester"},
            "object": object,
            "oldObject": old,
            "dryRun": false,
        }
    });
    let review: AdmissionReview<K> = serde_json::from_value(body).expect("test review parses");
    review.try_into().expect("test review has a request")
}

fn request(
    operation: &str,
    object: Option<&NodeIPAMConfig>,
    old: Option<&NodeIPAMConfig>,
) -> AdmissionRequest<NodeIPAMConfig> {
    request_for(
        (GROUP, VERSION, KIND),
        (GROUP, VERSION, RESOURCE),
        operation,
        object,
        old,
    )
}

fn view_with(configs: Vec<NodeIPAMConfig>) -> ClusterView {
    ClusterView {
        configs: configs.into_iter().map(Arc::new).collect(),
        ..ClusterView::default()
    }
}

fn message(r: &AdmissionResponse) -> &str {
    &r.result.message
}

#[track_caller]
fn assert_denied(r: &AdmissionResponse, fragments: &[&str]) {
    assert!(!r.allowed, "expected a denial, got {r:?}");
    assert_eq!(result_of(r), DENIED, "{r:?}");
    for f in fragments {
        assert!(
            message(r).contains(f),
            "message {:?} lacks {f:?}",
            message(r)
        );
    }
}

#[track_caller]
fn assert_invalid(r: &AdmissionResponse, fragment: &str) {
    assert!(!r.allowed, "{r:?}");
    assert_eq!(result_of(r), INVALID, "{r:?}");
    assert_eq!(r.uid, "uid-123", "the answer must carry the request's uid");
    assert!(message(r).contains(fragment), "{:?}", message(r));
}

#[test]
fn a_valid_config_is_allowed_without_warnings() {
    let c = config("a", family("10.64.0.0/14", 24), family("fd00:64::/48", 64));
    let r = review(&request("CREATE", Some(&c), None), &ClusterView::default());
    assert!(r.allowed, "{r:?}");
    assert_eq!(result_of(&r), ALLOWED);
    assert_eq!(r.uid, "uid-123");
    assert_eq!(r.warnings, None);
}

#[test]
fn overlap_with_another_config_names_it_and_both_ranges() {
    let other = config("other", family("10.64.0.0/14", 24), None);
    let c = config("new", family("10.0.0.0/8", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &view_with(vec![other]));
    assert_denied(
        &r,
        &[
            "spec.ipv4.cidr",
            "\"10.0.0.0/8\"",
            "10.64.0.0/14",
            "NodeIPAMConfig \"other\"",
            "10.0.0.0/8 contains 10.64.0.0/14",
        ],
    );
    assert_eq!(r.result.code, 422);
    let details = r.result.details.as_ref().expect("details");
    assert_eq!(details.name, "new");
    assert_eq!(details.causes[0].field, "spec.ipv4.cidr");
}

#[test]
fn a_subnet_and_an_equal_range_are_overlaps_too() {
    let other = config("wide", family("10.0.0.0/8", 24), None);
    let inner = config("inner", family("10.1.0.0/16", 24), None);
    let r = review(
        &request("CREATE", Some(&inner), None),
        &view_with(vec![other.clone()]),
    );
    assert_denied(&r, &["10.1.0.0/16 is inside 10.0.0.0/8", "\"wide\""]);

    let same = config("same", family("10.0.0.0/8", 20), None);
    let r = review(
        &request("CREATE", Some(&same), None),
        &view_with(vec![other]),
    );
    assert_denied(&r, &["10.0.0.0/8 is the same range", "\"wide\""]);
}

#[test]
fn ipv6_overlaps_are_checked_and_families_do_not_mix() {
    let other = config("v6", None, family("fd00::/48", 64));
    let c = config("c", None, family("fd00:0:0:1::/64", 80));
    let r = review(
        &request("CREATE", Some(&c), None),
        &view_with(vec![other.clone()]),
    );
    assert_denied(&r, &["spec.ipv6.cidr", "fd00::/48", "\"v6\""]);

    // An IPv4 range never overlaps an IPv6 one.
    let v4 = config("v4", family("10.0.0.0/16", 24), None);
    let r = review(&request("CREATE", Some(&v4), None), &view_with(vec![other]));
    assert!(r.allowed, "{r:?}");
}

#[test]
fn disjoint_configs_are_allowed() {
    let others = vec![
        config("a", family("10.0.0.0/16", 24), None),
        config("b", family("10.2.0.0/16", 24), None),
    ];
    let c = config("c", family("10.1.0.0/16", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &view_with(others));
    assert!(r.allowed, "{r:?}");
}

#[test]
fn every_overlapping_config_is_reported() {
    let others = vec![
        config("b", family("10.2.0.0/16", 24), None),
        config("a", family("10.1.0.0/16", 24), None),
    ];
    let c = config("c", family("10.0.0.0/8", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &view_with(others));
    assert_denied(&r, &["\"a\"", "\"b\""]);
    let causes = &r.result.details.as_ref().expect("details").causes;
    assert_eq!(causes.len(), 2);
    // Sorted by name, so messages are stable.
    assert!(causes[0].message.contains("\"a\""));
}

#[test]
fn update_ignores_the_object_itself() {
    let old = config("self", family("10.0.0.0/16", 24), None);
    let mut new = old.clone();
    new.spec.allocation = Allocation::Disabled;
    let r = review(
        &request("UPDATE", Some(&new), Some(&old)),
        &view_with(vec![old.clone()]),
    );
    assert!(r.allowed, "{r:?}");
}

#[test]
fn service_range_overlaps_are_denied_with_their_source() {
    let view = ClusterView {
        service_cidrs: vec![
            ServiceRange {
                cidr: "10.96.0.0/16".parse().unwrap(),
                source: "ServiceCIDR \"kubernetes\"".into(),
            },
            ServiceRange {
                cidr: "fd96::/112".parse().unwrap(),
                source: "--service-cidr".into(),
            },
        ],
        ..ClusterView::default()
    };
    let c = config("c", family("10.96.0.0/12", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &view);
    assert_denied(
        &r,
        &[
            "spec.ipv4.cidr",
            "Service range 10.96.0.0/16",
            "ServiceCIDR \"kubernetes\"",
            "10.96.0.0/12 contains 10.96.0.0/16",
        ],
    );
    let c = config("c6", None, family("fd96::/64", 112));
    let r = review(&request("CREATE", Some(&c), None), &view);
    assert_denied(&r, &["spec.ipv6.cidr", "fd96::/112", "--service-cidr"]);
}

#[test]
fn an_immutable_change_is_denied_and_says_what_to_do() {
    let old = config("c", family("10.0.0.0/16", 24), None);
    let new = config("c", family("10.1.0.0/16", 24), None);
    let r = review(
        &request("UPDATE", Some(&new), Some(&old)),
        &view_with(vec![old.clone()]),
    );
    assert_denied(
        &r,
        &["spec.ipv4.cidr", "immutable", "create a new NodeIPAMConfig"],
    );

    let mut new = old.clone();
    new.spec.ipv4 = family("10.0.0.0/16", 25);
    let r = review(
        &request("UPDATE", Some(&new), Some(&old)),
        &ClusterView::default(),
    );
    assert_denied(&r, &["spec.ipv4.perNodeMaskSize", "immutable"]);

    let mut new = old.clone();
    new.spec.ipv6 = family("fd00::/48", 64);
    let r = review(
        &request("UPDATE", Some(&new), Some(&old)),
        &ClusterView::default(),
    );
    assert_denied(&r, &["spec.ipv6", "create a new NodeIPAMConfig"]);
}

#[test]
fn a_metadata_only_update_is_allowed_even_with_an_old_overlap() {
    // Admitted while the webhook was down; the controller must still add/remove finalizers.
    let old = config("late", family("10.0.0.0/8", 24), None);
    let mut new = old.clone();
    new.metadata.finalizers = Some(vec!["nodeipam.io/finalizer".into()]);
    let view = view_with(vec![config("early", family("10.1.0.0/16", 24), None)]);
    let r = review(&request("UPDATE", Some(&new), Some(&old)), &view);
    assert!(r.allowed, "{r:?}");

    // Disabling it to drain it is also allowed: its range did not change.
    let mut disabled = old.clone();
    disabled.spec.allocation = Allocation::Disabled;
    let r = review(&request("UPDATE", Some(&disabled), Some(&old)), &view);
    assert!(r.allowed, "{r:?}");
}

#[test]
fn an_update_does_not_fail_on_what_was_already_wrong() {
    // A spec that fails today's rules (e.g. created before them) can still be disabled.
    let old = config("old", family("10.0.0.1/16", 24), None);
    let mut new = old.clone();
    new.spec.allocation = Allocation::Disabled;
    let r = review(
        &request("UPDATE", Some(&new), Some(&old)),
        &ClusterView::default(),
    );
    assert!(r.allowed, "{r:?}");
}

#[test]
fn shared_validation_errors_are_denied_with_field_paths() {
    let cases: Vec<(NodeIPAMConfigSpec, &str)> = vec![
        (
            NodeIPAMConfigSpec {
                ipv4: family("10.0.0.1/16", 24),
                ..config("x", None, None).spec
            },
            "spec.ipv4.cidr",
        ),
        (
            NodeIPAMConfigSpec {
                ipv4: family("fd00::/48", 64),
                ..config("x", None, None).spec
            },
            "spec.ipv4",
        ),
        (
            NodeIPAMConfigSpec {
                ipv4: family("10.0.0.0/16", 31),
                ..config("x", None, None).spec
            },
            "spec.ipv4.perNodeMaskSize",
        ),
        (
            NodeIPAMConfigSpec {
                ipv6: family("fd00::/48", 96),
                ..config("x", None, None).spec
            },
            "spec.ipv6.perNodeMaskSize",
        ),
        (config("x", None, None).spec, "spec"),
    ];
    for (spec, path) in cases {
        let c = NodeIPAMConfig::new("bad", spec.clone());
        let r = review(&request("CREATE", Some(&c), None), &ClusterView::default());
        assert_denied(&r, &[path]);
        assert!(
            r.result
                .details
                .as_ref()
                .is_some_and(|d| d.causes.iter().any(|c| c.field.starts_with(path))),
            "{spec:?}: {r:?}"
        );
        assert_eq!(r.warnings, None, "a denial carries no warnings");
    }
}

#[test]
fn a_bad_selector_operator_is_denied() {
    let mut c = config("sel", family("10.0.0.0/16", 24), None);
    c.spec.node_selector = Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "zone".into(),
                operator: "Near".into(),
                values: Some(vec!["a".into()]),
            }]),
            match_fields: None,
        }],
    });
    let r = review(&request("CREATE", Some(&c), None), &ClusterView::default());
    assert_denied(&r, &["spec.nodeSelector", "Near"]);
}

#[test]
fn few_blocks_warn_but_admit() {
    let c = config("tiny", family("10.0.0.0/24", 26), None);
    let r = review(&request("CREATE", Some(&c), None), &ClusterView::default());
    assert!(r.allowed, "{r:?}");
    let w = r.warnings.expect("warnings");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("spec.ipv4") && w[0].contains("only 4 blocks"),
        "{w:?}"
    );

    // Exactly 16 blocks is enough.
    let c = config("ok", family("10.0.0.0/20", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &ClusterView::default());
    assert_eq!(r.warnings, None);
}

/// A view in which the config under review was counted to serve `count` nodes.
fn view_with_nodes(count: usize) -> ClusterView {
    ClusterView {
        matching_nodes: Some(count),
        ..ClusterView::default()
    }
}

fn edge_selector() -> Option<NodeSelector> {
    Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "pool".into(),
                operator: "In".into(),
                values: Some(vec!["edge".into()]),
            }]),
            match_fields: None,
        }],
    })
}

#[test]
fn a_range_the_current_nodes_would_exhaust_warns() {
    let view = view_with_nodes(40);
    let c = config("small", family("10.0.0.0/19", 24), None); // 32 blocks
    let r = review(&request("CREATE", Some(&c), None), &view);
    assert!(r.allowed, "{r:?}");
    let w = r.warnings.expect("warnings");
    assert!(
        w.iter().any(|w| w.contains("32 blocks")
            && w.contains("the cluster already has at least 40 nodes")
            && w.contains("would run out")),
        "no selector counts every node: {w:?}"
    );

    // Plenty of room: no warning.
    let c = config("big", family("10.0.0.0/16", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &view);
    assert_eq!(r.warnings, None);
}

#[test]
fn the_exhaustion_warning_counts_only_the_nodes_the_selector_matches() {
    let mut c = config("edge", family("10.0.0.0/22", 24), None); // 4 blocks
    c.spec.node_selector = edge_selector();
    let run_out = |w: &[String]| w.iter().any(|w| w.contains("run out"));

    // 3 nodes match: 4 blocks are enough for them, whatever the other nodes do.
    let r = review(&request("CREATE", Some(&c), None), &view_with_nodes(3));
    assert!(r.allowed, "{r:?}");
    let w = r.warnings.expect("the few-blocks warning");
    assert!(!run_out(&w), "{w:?}");
    assert!(w.iter().any(|w| w.contains("only 4 blocks")), "{w:?}");

    // 5 match: more than 4 blocks, and the message gives the matching count (at least: the
    // count stops once it reaches the block count).
    let r = review(&request("CREATE", Some(&c), None), &view_with_nodes(5));
    assert!(r.allowed, "{r:?}");
    let w = r.warnings.expect("warnings");
    assert!(
        w.iter().any(|w| w.contains("4 blocks of /24")
            && w.contains("but at least 5 nodes match its nodeSelector")
            && w.contains("run out")),
        "{w:?}"
    );
    assert!(!w.iter().any(|w| w.contains("40")), "{w:?}");

    // Without the selector the count is of every node.
    c.spec.node_selector = None;
    let r = review(&request("CREATE", Some(&c), None), &view_with_nodes(40));
    let w = r.warnings.expect("warnings");
    assert!(
        w.iter()
            .any(|w| w.contains("the cluster already has at least 40 nodes")
                && w.contains("run out")),
        "{w:?}"
    );
}

#[test]
fn the_count_is_exact_below_what_the_warning_needs() {
    // Dual stack: 2 IPv4 blocks, a huge IPv6 range. The count goes up to the larger block
    // count, so 3 nodes is exact and the IPv4 warning says so.
    let mut c = config("dual", family("10.0.0.0/23", 24), family("fd00::/48", 64));
    c.spec.node_selector = edge_selector();
    assert_eq!(nodes_worth_counting(&c), Some(65536));
    let r = review(&request("CREATE", Some(&c), None), &view_with_nodes(3));
    let w = r.warnings.expect("warnings");
    assert!(
        w.iter().any(|w| w.starts_with("spec.ipv4")
            && w.contains("but 3 nodes match its nodeSelector")),
        "{w:?}"
    );
    assert!(!w.iter().any(|w| w.starts_with("spec.ipv6")), "{w:?}");

    // Single stack: a count of 2 reached the 2 blocks and may have stopped there.
    let c = config("v4", family("10.0.0.0/23", 24), None);
    assert_eq!(nodes_worth_counting(&c), Some(2));
    let r = review(&request("CREATE", Some(&c), None), &view_with_nodes(2));
    let w = r.warnings.expect("warnings");
    assert!(
        w.iter()
            .any(|w| w.contains("the cluster already has at least 2 nodes")),
        "{w:?}"
    );
}

#[test]
fn no_count_no_exhaustion_warning() {
    // A count that could not finish (deadline, API error) skips only that warning.
    let c = config("tiny", family("10.0.0.0/23", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &ClusterView::default());
    assert!(r.allowed, "{r:?}");
    let w = r.warnings.expect("the few-blocks warning");
    assert!(w.iter().any(|w| w.contains("only 2 blocks")), "{w:?}");
    assert!(!w.iter().any(|w| w.contains("run out")), "{w:?}");
}

#[test]
fn delete_and_connect_are_allowed() {
    let c = config("c", family("10.0.0.1/16", 24), None);
    for op in ["DELETE", "CONNECT"] {
        let r = review(&request(op, None, Some(&c)), &ClusterView::default());
        assert!(r.allowed, "{op}: {r:?}");
    }
}

#[test]
fn the_wrong_kind_or_resource_is_invalid_never_allowed() {
    let c = config("c", family("10.0.0.0/16", 24), None);
    let r = review(
        &request_for(
            ("", "v1", "Pod"),
            ("", "v1", "pods"),
            "CREATE",
            Some(&c),
            None,
        ),
        &ClusterView::default(),
    );
    assert_invalid(&r, "Pod");

    let r = review(
        &request_for(
            (GROUP, VERSION, KIND),
            (GROUP, VERSION, "widgets"),
            "CREATE",
            Some(&c),
            None,
        ),
        &ClusterView::default(),
    );
    assert_invalid(&r, "widgets");

    let r = review(
        &request_for(
            (GROUP, "v1", KIND),
            (GROUP, "v1", RESOURCE),
            "CREATE",
            Some(&c),
            None,
        ),
        &ClusterView::default(),
    );
    assert_invalid(&r, "v1");
}

#[test]
fn a_missing_object_is_invalid() {
    let r = review(&request("CREATE", None, None), &ClusterView::default());
    assert_invalid(&r, "no object");
    let c = config("c", family("10.0.0.0/16", 24), None);
    let r = review(&request("UPDATE", Some(&c), None), &ClusterView::default());
    assert_invalid(&r, "oldObject");
}

#[test]
fn status_writes_are_allowed_and_other_subresources_invalid() {
    let c = config("c", family("10.0.0.0/16", 24), None);
    let mut req = request("UPDATE", Some(&c), Some(&c));
    req.sub_resource = Some("status".into());
    assert!(review(&req, &view_with(vec![c.clone()])).allowed);
    req.sub_resource = Some("scale".into());
    assert_invalid(&review(&req, &ClusterView::default()), "scale");
}

#[test]
fn result_labels() {
    let c = config("c", family("10.0.0.0/16", 24), None);
    let req = request("CREATE", Some(&c), None);
    assert_eq!(result_of(&AdmissionResponse::from(&req)), ALLOWED);
    assert_eq!(result_of(&AdmissionResponse::from(&req).deny("no")), DENIED);
    assert_eq!(result_of(&invalid_for(&req, "bad")), INVALID);
}

/// A cause carries its field in `field` and only the rest in `message`, as the API server's
/// own `field.Error`s do: kubectl prints `<field>: <message>` for each cause, so a message
/// that repeats the path reads `spec.ipv4.cidr: spec.ipv4.cidr: Invalid value: ...`.
#[test]
fn a_cause_does_not_repeat_its_field_path() {
    let other = config("other", family("10.64.0.0/14", 24), None);
    let c = config("new", family("10.64.0.0/14", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &view_with(vec![other]));
    assert!(!r.allowed, "{r:?}");
    let body = "Invalid value: \"10.64.0.0/14\": overlaps 10.64.0.0/14 of NodeIPAMConfig \
                \"other\" (10.64.0.0/14 is the same range); ranges of NodeIPAMConfigs must \
                not overlap";
    // The Status message keeps the path once, like the API server's own "is invalid" errors.
    assert_eq!(r.result.message, format!("spec.ipv4.cidr: {body}"));
    let causes = &r.result.details.as_ref().expect("details").causes;
    assert_eq!(causes.len(), 1);
    assert_eq!(causes[0].field, "spec.ipv4.cidr");
    assert_eq!(causes[0].message, body);
    assert_eq!(causes[0].reason, "FieldValueInvalid");
}

/// The same for the shared validation's errors and for immutability errors, whose cause
/// type is Kubernetes' own for the kind of error.
#[test]
fn validation_and_immutability_causes_do_not_repeat_the_path() {
    let c = config("bad", family("10.1.0.1/16", 24), None);
    let r = review(&request("CREATE", Some(&c), None), &view_with(vec![]));
    let causes = &r.result.details.as_ref().expect("details").causes;
    assert!(!causes.is_empty(), "{r:?}");
    for cause in causes {
        assert!(
            !cause.message.starts_with(&cause.field),
            "cause message repeats its field: {cause:?}"
        );
        assert!(
            r.result
                .message
                .contains(&format!("{}: {}", cause.field, cause.message)),
            "the Status message names each cause once with its path: {:?}",
            r.result.message
        );
    }

    let old = config("a", family("10.0.0.0/16", 24), None);
    let new = config("a", family("10.1.0.0/16", 24), None);
    let r = review(
        &request("UPDATE", Some(&new), Some(&old)),
        &view_with(vec![]),
    );
    let causes = &r.result.details.as_ref().expect("details").causes;
    let cidr = causes
        .iter()
        .find(|c| c.field == "spec.ipv4.cidr")
        .unwrap_or_else(|| panic!("a cause for spec.ipv4.cidr: {causes:?}"));
    assert!(
        cidr.message.starts_with("Invalid value: ") || cidr.message.starts_with("Forbidden"),
        "{cidr:?}"
    );
    assert!(
        cidr.message.contains("create a new NodeIPAMConfig"),
        "{cidr:?}"
    );
    assert_ne!(cidr.reason, "", "{cidr:?}");
}

// ----- NodeIPAMPool -----

mod pools {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use nodeipam_crd::{
        NodeIPAMPool, NodeIPAMPoolSpec, POOL_LABEL, PoolFamilySpec, PoolHeadroom, PoolRanges,
        PoolScaleDown,
    };

    use super::*;

    fn pool(name: &str, v4: &[&str]) -> NodeIPAMPool {
        let mut p = NodeIPAMPool::new(
            name,
            NodeIPAMPoolSpec {
                ipv4: Some(PoolFamilySpec {
                    cidrs: v4.iter().map(|c| (*c).to_owned()).collect(),
                    range_mask_size: 20,
                    per_node_mask_size: 24,
                }),
                ipv6: None,
                node_selector: None,
                ranges: PoolRanges::default(),
                headroom: PoolHeadroom::default(),
                scale_down: PoolScaleDown::default(),
            },
        );
        p.metadata.uid = Some(format!("uid-{name}"));
        p
    }

    fn pool_request(
        operation: &str,
        object: Option<&NodeIPAMPool>,
        old: Option<&NodeIPAMPool>,
    ) -> AdmissionRequest<NodeIPAMPool> {
        request_for(
            (GROUP, VERSION, POOL_KIND),
            (GROUP, VERSION, POOL_RESOURCE),
            operation,
            object,
            old,
        )
    }

    fn view(pools: Vec<NodeIPAMPool>, configs: Vec<NodeIPAMConfig>) -> ClusterView {
        ClusterView {
            pools: pools.into_iter().map(Arc::new).collect(),
            configs: configs.into_iter().map(Arc::new).collect(),
            ..ClusterView::default()
        }
    }

    fn child(mut c: NodeIPAMConfig, pool: &NodeIPAMPool) -> NodeIPAMConfig {
        let name = pool.metadata.name.clone().unwrap_or_default();
        c.metadata.labels = Some(BTreeMap::from([(POOL_LABEL.to_owned(), name.clone())]));
        c.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "nodeipam.io/v1alpha1".into(),
            kind: POOL_KIND.into(),
            name,
            uid: pool.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]);
        c
    }

    #[test]
    fn a_valid_pool_is_allowed() {
        let p = pool("gpu", &["10.64.0.0/14"]);
        let r = review_pool(
            &pool_request("CREATE", Some(&p), None),
            &ClusterView::default(),
        );
        assert!(r.allowed, "{r:?}");
        assert_eq!(r.warnings, None);
    }

    #[test]
    fn an_invalid_pool_is_denied_with_every_field() {
        let mut p = pool("gpu", &["10.64.0.1/14", "banana"]);
        p.spec.ranges.min = 40;
        let r = review_pool(
            &pool_request("CREATE", Some(&p), None),
            &ClusterView::default(),
        );
        assert_denied(
            &r,
            &[
                "spec.ipv4.cidrs[0]: Invalid value: \"10.64.0.1/14\": must be canonical",
                "spec.ipv4.cidrs[1]",
                "spec.ranges.min",
            ],
        );
        assert_eq!(r.result.code, 422);
        let details = r.result.details.as_ref().expect("details");
        assert_eq!(details.kind, POOL_KIND);
        assert_eq!(details.causes.len(), 3, "{details:?}");
    }

    /// A name its children's label cannot carry is refused at CREATE; an UPDATE of a pool
    /// stored with one (before this check) is reviewed on its spec only, as the name cannot
    /// change.
    #[test]
    fn a_pool_name_longer_than_a_label_value_is_denied_at_create() {
        let fits = pool(&"p".repeat(63), &["10.64.0.0/14"]);
        let r = review_pool(
            &pool_request("CREATE", Some(&fits), None),
            &ClusterView::default(),
        );
        assert!(r.allowed, "{r:?}");
        let long = pool(&"p".repeat(64), &["10.64.0.0/14"]);
        let r = review_pool(
            &pool_request("CREATE", Some(&long), None),
            &ClusterView::default(),
        );
        assert_denied(
            &r,
            &[
                "metadata.name: Invalid value",
                "64 characters",
                "at most 63",
            ],
        );
        let causes = &r.result.details.as_ref().expect("details").causes;
        assert_eq!(causes[0].field, "metadata.name");
        let mut scaled = long.clone();
        scaled.spec.ranges.max = 4;
        let r = review_pool(
            &pool_request("UPDATE", Some(&scaled), Some(&long)),
            &ClusterView::default(),
        );
        assert!(r.allowed, "{r:?}");
    }

    #[test]
    fn overlapping_pools_services_and_hand_made_configs_are_denied() {
        let p = pool("gpu", &["10.64.0.0/14"]);
        let other = pool("cpu", &["10.66.0.0/16"]);
        let hand_made = config("hand-made", family("10.65.0.0/16", 24), None);
        let mut v = view(vec![other], vec![hand_made]);
        v.service_cidrs.push(ServiceRange {
            cidr: "10.67.0.0/16".parse().expect("cidr"),
            source: "ServiceCIDR \"kubernetes\"".into(),
        });
        let r = review_pool(&pool_request("CREATE", Some(&p), None), &v);
        assert_denied(
            &r,
            &[
                "NodeIPAMPool \"cpu\"",
                "NodeIPAMConfig \"hand-made\"",
                "ServiceCIDR \"kubernetes\"",
            ],
        );
    }

    #[test]
    fn updates_check_only_appended_cidrs_and_immutable_fields() {
        let old = pool("gpu", &["10.64.0.0/14"]);
        // An overlap admitted earlier does not block a change of the scaling settings.
        let squatter = config("squatter", family("10.64.0.0/16", 24), None);
        let mut scaled = old.clone();
        scaled.spec.headroom.blocks = 64;
        let v = view(vec![], vec![squatter]);
        let r = review_pool(&pool_request("UPDATE", Some(&scaled), Some(&old)), &v);
        assert!(r.allowed, "{r:?}");
        // An appended CIDR is checked.
        let mut grown = old.clone();
        if let Some(f) = grown.spec.ipv4.as_mut() {
            f.cidrs.push("10.200.0.0/16".into());
        }
        let v = view(vec![pool("other", &["10.200.0.0/17"])], vec![]);
        let r = review_pool(&pool_request("UPDATE", Some(&grown), Some(&old)), &v);
        assert_denied(&r, &["spec.ipv4.cidrs[1]", "NodeIPAMPool \"other\""]);
        // Masks are immutable.
        let mut remasked = old.clone();
        if let Some(f) = remasked.spec.ipv4.as_mut() {
            f.per_node_mask_size = 25;
        }
        let r = review_pool(
            &pool_request("UPDATE", Some(&remasked), Some(&old)),
            &ClusterView::default(),
        );
        assert_denied(&r, &["spec.ipv4.perNodeMaskSize", "is immutable"]);
        // Metadata-only updates and deletes are always allowed.
        let r = review_pool(&pool_request("UPDATE", Some(&old), Some(&old)), &v);
        assert!(r.allowed);
        let r = review_pool(&pool_request("DELETE", None, Some(&old)), &v);
        assert!(r.allowed);
    }

    #[test]
    fn a_pool_too_small_for_its_bounds_is_admitted_with_a_warning() {
        let p = pool("gpu", &["10.64.0.0/18"]);
        let r = review_pool(
            &pool_request("CREATE", Some(&p), None),
            &ClusterView::default(),
        );
        assert!(r.allowed, "{r:?}");
        let warnings = r.warnings.unwrap_or_default();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0]
                .contains("the CIDRs have room for 4 /20 ranges, fewer than spec.ranges.max (32)"),
            "{warnings:?}"
        );
        let mut tiny = pool("tiny", &["10.64.0.0/20"]);
        tiny.spec.ranges.min = 2;
        let r = review_pool(
            &pool_request("CREATE", Some(&tiny), None),
            &ClusterView::default(),
        );
        assert_eq!(
            r.warnings,
            Some(vec![
                "spec.ipv4: the CIDRs have room for 1 /20 ranges, fewer than spec.ranges.min (2): the pool stops at 1"
                    .to_owned()
            ])
        );
    }

    #[test]
    fn configs_in_a_pool_must_be_its_children_and_children_stay_inside() {
        let gpu = pool("gpu", &["10.64.0.0/14"]);
        let v = view(vec![gpu.clone()], vec![]);
        let user = config("user", family("10.64.16.0/20", 24), None);
        let r = review(&request("CREATE", Some(&user), None), &v);
        assert_denied(
            &r,
            &[
                "spec.ipv4.cidr",
                "NodeIPAMPool \"gpu\"",
                "not a child of that pool",
            ],
        );
        let ok = child(
            config("gpu-10-64-16-0-20", family("10.64.16.0/20", 24), None),
            &gpu,
        );
        let r = review(&request("CREATE", Some(&ok), None), &v);
        assert!(r.allowed, "{r:?}");
        let stray = child(config("gpu-stray", family("10.99.0.0/20", 24), None), &gpu);
        let r = review(&request("CREATE", Some(&stray), None), &v);
        assert_denied(&r, &["spec.ipv4.cidr", "lies outside NodeIPAMPool \"gpu\""]);
    }

    /// A pool's child is created `Disabled` and marked awaiting its enable; the controller then
    /// enables it (allocation `Enabled`, the marker removed). Both are admitted.
    #[test]
    fn a_child_created_disabled_and_awaiting_and_its_enable_are_allowed() {
        let gpu = pool("gpu", &["10.64.0.0/14"]);
        let v = view(vec![gpu.clone()], vec![]);
        let mut awaiting = child(
            config("gpu-10-64-16-0-20", family("10.64.16.0/20", 24), None),
            &gpu,
        );
        awaiting.spec.allocation = nodeipam_crd::Allocation::Disabled;
        awaiting.metadata.annotations = Some(BTreeMap::from([(
            nodeipam_crd::AWAITING_ENABLE.to_owned(),
            "true".to_owned(),
        )]));
        let r = review(&request("CREATE", Some(&awaiting), None), &v);
        assert!(r.allowed, "{r:?}");
        let mut enabled = awaiting.clone();
        enabled.spec.allocation = nodeipam_crd::Allocation::Enabled;
        enabled.metadata.annotations = Some(BTreeMap::new());
        let v = view(vec![gpu], vec![awaiting.clone()]);
        let r = review(&request("UPDATE", Some(&enabled), Some(&awaiting)), &v);
        assert!(r.allowed, "{r:?}");
    }

    #[test]
    fn the_wrong_kind_for_a_pool_is_invalid() {
        let p = pool("gpu", &["10.64.0.0/14"]);
        let r = review_pool(
            &request_for(
                (GROUP, VERSION, POOL_KIND),
                (GROUP, VERSION, RESOURCE),
                "CREATE",
                Some(&p),
                None,
            ),
            &ClusterView::default(),
        );
        assert_invalid(&r, "nodeipamconfigs");
    }
}

#[test]
fn a_range_a_pool_carved_gets_no_exhaustion_warning_and_no_count() {
    // A child of a pool: its pool carves the next range before this one runs out, so the
    // nodes are not counted and "this range alone would run out" is not said.
    let mut c = config("pool-10-0-0-0-24", family("10.0.0.0/23", 24), None);
    c.metadata.labels = Some(std::collections::BTreeMap::from([(
        nodeipam_crd::POOL_LABEL.to_owned(),
        "pool".to_owned(),
    )]));
    assert_eq!(nodes_worth_counting(&c), None);
    let r = review(&request("CREATE", Some(&c), None), &view_with_nodes(40));
    assert!(r.allowed, "{r:?}");
    assert!(
        !r.warnings.iter().flatten().any(|w| w.contains("run out")),
        "{:?}",
        r.warnings
    );

    // The same range made by hand is warned about.
    c.metadata.labels = None;
    let r = review(&request("CREATE", Some(&c), None), &view_with_nodes(40));
    assert!(
        r.warnings.iter().flatten().any(|w| w.contains("run out")),
        "{:?}",
        r.warnings
    );
}
