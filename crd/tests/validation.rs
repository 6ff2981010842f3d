//! Table tests for the pure validation: each case asserts the exact field paths and kinds of
//! the errors, so a check that stops firing (or fires on the wrong field) fails.

use FieldErrorKind::*;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use nodeipam_crd::validation::parse_cidr;
use nodeipam_crd::{
    Allocation, Family, FamilySpec, FieldError, FieldErrorKind, NodeIPAMConfigSpec, Ranges,
    find_overlaps, format_errors, overlaps, validate_node_selector, validate_spec, validate_update,
};
use serde_json::json;

fn fam(cidr: &str, mask: u8) -> Option<FamilySpec> {
    Some(FamilySpec {
        cidr: cidr.to_owned(),
        per_node_mask_size: mask,
    })
}

fn spec(ipv4: Option<FamilySpec>, ipv6: Option<FamilySpec>) -> NodeIPAMConfigSpec {
    NodeIPAMConfigSpec {
        ipv4,
        ipv6,
        node_selector: None,
        allocation: Allocation::Enabled,
    }
}

fn req(key: &str, op: &str, values: Option<&[&str]>) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_owned(),
        operator: op.to_owned(),
        values: values.map(|v| v.iter().map(|s| (*s).to_owned()).collect()),
    }
}

fn selector(
    exprs: Vec<NodeSelectorRequirement>,
    fields: Vec<NodeSelectorRequirement>,
) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: (!exprs.is_empty()).then_some(exprs),
            match_fields: (!fields.is_empty()).then_some(fields),
        }],
    }
}

fn with_selector(sel: NodeSelector) -> NodeIPAMConfigSpec {
    NodeIPAMConfigSpec {
        node_selector: Some(sel),
        ..spec(fam("10.64.0.0/14", 24), None)
    }
}

type Expected = Vec<(String, FieldErrorKind)>;

fn at(path: impl Into<String>, kind: FieldErrorKind) -> (String, FieldErrorKind) {
    (path.into(), kind)
}

fn found(errors: &[FieldError]) -> Vec<(String, FieldErrorKind)> {
    errors.iter().map(|e| (e.path.clone(), e.kind)).collect()
}

fn expect(name: &str, errors: &[FieldError], want: &[(&str, FieldErrorKind)]) {
    let want: Vec<(String, FieldErrorKind)> =
        want.iter().map(|(p, k)| ((*p).to_owned(), *k)).collect();
    assert_eq!(
        found(errors),
        want,
        "case {name}: {}",
        format_errors(errors)
    );
}

#[test]
fn spec_table() {
    const E: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0]";
    const F: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchFields[0]";
    let cases: Vec<(&str, NodeIPAMConfigSpec, Expected)> = vec![
        ("ipv4 only", spec(fam("10.64.0.0/14", 24), None), vec![]),
        (
            "dual stack",
            spec(fam("10.64.0.0/14", 24), fam("fd00:10:64::/56", 64)),
            vec![],
        ),
        (
            "upper-case IPv6",
            spec(None, fam("FD00:10:64::/56", 64)),
            vec![],
        ),
        (
            "block as big as the range",
            spec(fam("10.64.0.0/24", 24), None),
            vec![],
        ),
        ("/30 blocks", spec(fam("10.64.0.0/14", 30), None), vec![]),
        ("2^32 IPv6 blocks", spec(None, fam("fd00::/32", 64)), vec![]),
        ("no family", spec(None, None), vec![at("spec", Required)]),
        (
            "empty cidr",
            spec(fam("", 24), None),
            vec![at("spec.ipv4.cidr", Required)],
        ),
        (
            "no prefix",
            spec(fam("10.64.0.0", 24), None),
            vec![at("spec.ipv4.cidr", Invalid)],
        ),
        (
            "leading zero octet",
            spec(fam("010.64.0.0/14", 24), None),
            vec![at("spec.ipv4.cidr", Invalid)],
        ),
        (
            "leading zero prefix",
            spec(fam("10.64.0.0/014", 24), None),
            vec![at("spec.ipv4.cidr", Invalid)],
        ),
        (
            "prefix too long",
            spec(fam("10.64.0.0/33", 24), None),
            vec![at("spec.ipv4.cidr", Invalid)],
        ),
        (
            "IPv6 zone",
            spec(None, fam("fe80::%eth0/64", 80)),
            vec![at("spec.ipv6.cidr", Invalid)],
        ),
        (
            "IPv4-mapped IPv6",
            spec(None, fam("::ffff:10.0.0.0/104", 120)),
            vec![at("spec.ipv6.cidr", Invalid)],
        ),
        (
            "too long",
            spec(fam(&format!("10.0.0.0/{}", "1".repeat(70)), 24), None),
            vec![at("spec.ipv4.cidr", TooLong)],
        ),
        (
            "IPv6 in ipv4",
            spec(fam("fd00::/56", 64), None),
            vec![
                at("spec.ipv4.cidr", Invalid),
                at("spec.ipv4.perNodeMaskSize", Invalid),
            ],
        ),
        (
            "IPv4 in ipv6",
            spec(None, fam("10.0.0.0/8", 24)),
            vec![at("spec.ipv6.cidr", Invalid)],
        ),
        (
            "host bits set",
            spec(fam("10.64.0.1/14", 24), None),
            vec![at("spec.ipv4.cidr", Invalid)],
        ),
        (
            "IPv4 mask 31",
            spec(fam("10.64.0.0/14", 31), None),
            vec![at("spec.ipv4.perNodeMaskSize", Invalid)],
        ),
        (
            "mask below prefix",
            spec(fam("10.64.0.0/14", 12), None),
            vec![at("spec.ipv4.perNodeMaskSize", Invalid)],
        ),
        (
            "more than 2^32 blocks",
            spec(None, fam("fd00::/8", 64)),
            vec![at("spec.ipv6.perNodeMaskSize", Invalid)],
        ),
        (
            "IPv6 mask 127",
            spec(None, fam("fd00::/120", 127)),
            vec![at("spec.ipv6.perNodeMaskSize", Invalid)],
        ),
        (
            "IPv6 mask 127 and too many blocks",
            spec(None, fam("fd00::/64", 127)),
            vec![
                at("spec.ipv6.perNodeMaskSize", Invalid),
                at("spec.ipv6.perNodeMaskSize", Invalid),
            ],
        ),
        (
            "host bits and mask 31",
            spec(fam("10.64.0.1/14", 31), None),
            vec![
                at("spec.ipv4.cidr", Invalid),
                at("spec.ipv4.perNodeMaskSize", Invalid),
            ],
        ),
        (
            "errors in both families",
            spec(fam("10.64.0.1/14", 24), fam("fd00::/56", 40)),
            vec![
                at("spec.ipv4.cidr", Invalid),
                at("spec.ipv6.perNodeMaskSize", Invalid),
            ],
        ),
        (
            "selector ok",
            with_selector(selector(
                vec![
                    req("topology.kubernetes.io/zone", "In", Some(&["a", "b"])),
                    req("gpu", "Exists", None),
                    req("rank", "Gt", Some(&["3"])),
                    req("pool", "In", Some(&[""])),
                ],
                vec![req("metadata.name", "NotIn", Some(&["node-1.example"]))],
            )),
            vec![],
        ),
        (
            "no terms",
            with_selector(NodeSelector {
                node_selector_terms: vec![],
            }),
            vec![at("spec.nodeSelector.nodeSelectorTerms", Required)],
        ),
        (
            "too many terms",
            with_selector(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm::default(); 9],
            }),
            vec![at("spec.nodeSelector.nodeSelectorTerms", TooMany)],
        ),
        (
            "In without values",
            with_selector(selector(vec![req("a", "In", None)], vec![])),
            vec![at(format!("{E}.values"), Required)],
        ),
        (
            "NotIn with empty values",
            with_selector(selector(vec![req("a", "NotIn", Some(&[]))], vec![])),
            vec![at(format!("{E}.values"), Required)],
        ),
        (
            "Exists with values",
            with_selector(selector(vec![req("a", "Exists", Some(&["x"]))], vec![])),
            vec![at(format!("{E}.values"), Forbidden)],
        ),
        (
            "Gt with two values",
            with_selector(selector(vec![req("a", "Gt", Some(&["1", "2"]))], vec![])),
            vec![at(format!("{E}.values"), Required)],
        ),
        (
            "Lt not an integer",
            with_selector(selector(vec![req("a", "Lt", Some(&["x"]))], vec![])),
            vec![at(format!("{E}.values[0]"), Invalid)],
        ),
        (
            "Gt negative is no label value",
            with_selector(selector(vec![req("a", "Gt", Some(&["-1"]))], vec![])),
            vec![at(format!("{E}.values[0]"), Invalid)],
        ),
        (
            "unknown operator",
            with_selector(selector(vec![req("a", "Equals", Some(&["x"]))], vec![])),
            vec![at(format!("{E}.operator"), NotSupported)],
        ),
        (
            "key starts with dash",
            with_selector(selector(vec![req("-a", "Exists", None)], vec![])),
            vec![at(format!("{E}.key"), Invalid)],
        ),
        (
            "upper-case key prefix",
            with_selector(selector(vec![req("Example.com/a", "Exists", None)], vec![])),
            vec![at(format!("{E}.key"), Invalid)],
        ),
        (
            "two slashes in key",
            with_selector(selector(vec![req("a/b/c", "Exists", None)], vec![])),
            vec![at(format!("{E}.key"), Invalid)],
        ),
        (
            "empty key",
            with_selector(selector(vec![req("", "Exists", None)], vec![])),
            vec![
                at(format!("{E}.key"), Invalid),
                at(format!("{E}.key"), Invalid),
            ],
        ),
        (
            "64-char key name",
            with_selector(selector(vec![req(&"k".repeat(64), "Exists", None)], vec![])),
            vec![at(format!("{E}.key"), Invalid)],
        ),
        (
            "bad label value",
            with_selector(selector(
                vec![req("a", "In", Some(&["ok", "no way"]))],
                vec![],
            )),
            vec![at(format!("{E}.values[1]"), Invalid)],
        ),
        (
            "too many values",
            with_selector(selector(vec![req("a", "In", Some(&["v"; 65]))], vec![])),
            vec![at(format!("{E}.values"), TooMany)],
        ),
        (
            "field key not metadata.name",
            with_selector(selector(
                vec![],
                vec![req("metadata.namespace", "In", Some(&["x"]))],
            )),
            vec![at(format!("{F}.key"), NotSupported)],
        ),
        (
            "field operator Exists",
            with_selector(selector(vec![], vec![req("metadata.name", "Exists", None)])),
            vec![at(format!("{F}.operator"), NotSupported)],
        ),
        (
            "field with two names",
            with_selector(selector(
                vec![],
                vec![req("metadata.name", "In", Some(&["a", "b"]))],
            )),
            vec![at(format!("{F}.values"), Required)],
        ),
        (
            "field bad node name",
            with_selector(selector(
                vec![],
                vec![req("metadata.name", "In", Some(&["Node_1"]))],
            )),
            vec![at(format!("{F}.values[0]"), Invalid)],
        ),
    ];
    for (name, s, want) in &cases {
        assert_eq!(
            &found(&validate_spec(s)),
            want,
            "case {name}: {}",
            format_errors(&validate_spec(s))
        );
    }
}

#[test]
fn messages_read_like_kubernetes_and_say_what_to_do() {
    let errs = validate_spec(&spec(fam("10.0.0.1/16", 24), None));
    assert_eq!(
        errs[0].to_string(),
        r#"spec.ipv4.cidr: Invalid value: "10.0.0.1/16": must be canonical (host bits zero): did you mean 10.0.0.0/16?"#
    );
    let errs = validate_spec(&spec(fam("10.64.0.0/14", 12), None));
    assert!(
        errs[0].to_string().contains("(14)"),
        "names the prefix length: {}",
        errs[0]
    );
    let errs = validate_spec(&spec(fam("fd00::/56", 24), None));
    assert!(
        errs.iter().any(|e| e.detail.contains("spec.ipv6")),
        "points to the right field: {}",
        format_errors(&errs)
    );
    // Required/Forbidden do not print a value, as in Kubernetes.
    let errs = validate_spec(&spec(None, None));
    assert!(
        errs[0]
            .to_string()
            .starts_with("spec: Required value: at least one of spec.ipv4 or spec.ipv6")
    );
    let two = validate_spec(&spec(fam("10.64.0.1/14", 31), None));
    assert_eq!(two.len(), 2);
    let joined = format_errors(&two);
    assert!(
        joined.starts_with('[') && joined.ends_with(']') && joined.contains(", "),
        "{joined}"
    );
}

#[test]
fn ranges_parse_valid_specs_and_report_only_range_errors() {
    let s = spec(fam("10.64.0.0/14", 24), fam("fd00:10:64::/56", 64));
    let r = s.ranges().expect("valid");
    let v4 = r.ipv4.expect("ipv4");
    assert_eq!(v4.cidr, "10.64.0.0/14".parse::<IpNet>().expect("literal"));
    assert_eq!(v4.family(), Family::V4);
    assert_eq!(v4.block_count(), 1 << 10);
    assert_eq!(r.get(Family::V6).map(|f| f.block_count()), Some(256));
    assert!(r.is_dual_stack());
    let fams: Vec<Family> = r.iter().map(|(f, _)| f).collect();
    assert_eq!(fams, [Family::V4, Family::V6]);

    let v6_only = spec(None, fam("fd00::/32", 64)).ranges().expect("valid");
    assert_eq!(v6_only.iter().count(), 1);
    assert_eq!(v6_only.ipv6.map(|f| f.block_count()), Some(1 << 32));

    // A bad selector does not hide valid ranges; a bad range is an error.
    let bad_sel = with_selector(NodeSelector {
        node_selector_terms: vec![],
    });
    assert!(bad_sel.ranges().is_ok());
    assert!(!validate_spec(&bad_sel).is_empty());
    let errs = spec(fam("10.64.0.1/14", 24), None)
        .ranges()
        .expect_err("host bits");
    assert_eq!(found(&errs), [("spec.ipv4.cidr".to_owned(), Invalid)]);
}

#[test]
fn parse_cidr_matches_the_cel_cidr_library() {
    for ok in [
        "0.0.0.0/0",
        "10.0.0.0/8",
        "10.0.0.1/8",
        "::/0",
        "fd00::/8",
        "1:2:3:4:5:6:1.2.3.4/128",
    ] {
        assert!(parse_cidr(ok).is_ok(), "{ok} should parse");
    }
    for bad in [
        "10.0.0.0",
        "10.0.0.0/",
        "10.0.0.0/33",
        "10.0.0.0/08",
        "10.0.0.0/+8",
        "10.0.0.0/-1",
        "10.0.0.0/ 8",
        "010.0.0.0/8",
        "10.0.0/8",
        "fd00::/129",
        "fe80::1%eth0/64",
        "::ffff:1.2.3.0/120",
        "::ffff:102:300/120",
        "not-an-ip/8",
        "/8",
    ] {
        assert!(parse_cidr(bad).is_err(), "{bad} should not parse");
    }
}

#[test]
fn updates_may_only_change_allocation() {
    let base = NodeIPAMConfigSpec {
        node_selector: Some(selector(vec![req("a", "Exists", None)], vec![])),
        ..spec(fam("10.64.0.0/14", 24), None)
    };
    let change = |f: &dyn Fn(&mut NodeIPAMConfigSpec)| {
        let mut n = base.clone();
        f(&mut n);
        validate_update(&base, &n)
    };
    expect("unchanged", &change(&|_| {}), &[]);
    expect(
        "disable",
        &change(&|n| n.allocation = Allocation::Disabled),
        &[],
    );
    expect(
        "cidr",
        &change(&|n| n.ipv4 = fam("10.68.0.0/14", 24)),
        &[("spec.ipv4.cidr", Invalid)],
    );
    expect(
        "mask",
        &change(&|n| n.ipv4 = fam("10.64.0.0/14", 25)),
        &[("spec.ipv4.perNodeMaskSize", Invalid)],
    );
    expect(
        "add ipv6",
        &change(&|n| n.ipv6 = fam("fd00::/56", 64)),
        &[("spec.ipv6", Forbidden)],
    );
    expect(
        "swap family",
        &change(&|n| {
            n.ipv4 = None;
            n.ipv6 = fam("fd00::/56", 64);
        }),
        &[("spec.ipv4", Forbidden), ("spec.ipv6", Forbidden)],
    );
    expect(
        "selector changed",
        &change(&|n| n.node_selector = Some(selector(vec![req("b", "Exists", None)], vec![]))),
        &[("spec.nodeSelector", Forbidden)],
    );
    expect(
        "selector removed",
        &change(&|n| n.node_selector = None),
        &[("spec.nodeSelector", Forbidden)],
    );

    let errs = change(&|n| n.ipv4 = fam("10.68.0.0/14", 24));
    assert!(errs[0].detail.contains("was 10.64.0.0/14"), "{}", errs[0]);
    assert!(
        errs[0].detail.contains("create a new NodeIPAMConfig"),
        "says what to do: {}",
        errs[0]
    );

    // Ratcheting: an old config that fails today's rules can still be disabled.
    let old_invalid = spec(fam("10.64.0.1/14", 24), None);
    let mut disabled = old_invalid.clone();
    disabled.allocation = Allocation::Disabled;
    assert!(validate_update(&old_invalid, &disabled).is_empty());
}

#[test]
fn node_selector_paths_use_the_given_prefix() {
    let sel = selector(vec![req("a", "In", None)], vec![]);
    let errs = validate_node_selector(&sel, "spec.template.nodeSelector");
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].path,
        "spec.template.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values"
    );
}

fn net(s: &str) -> IpNet {
    s.parse().expect("test literal")
}

#[test]
fn overlap_of_two_ranges() {
    let cases = [
        ("10.0.0.0/16", "10.0.0.0/16", true, "equal"),
        ("10.0.0.0/16", "10.0.128.0/17", true, "subnet"),
        ("10.0.128.0/17", "10.0.0.0/8", true, "supernet"),
        ("10.0.0.0/16", "10.2.0.0/16", false, "disjoint"),
        ("10.0.0.0/16", "10.1.0.0/16", false, "adjacent"),
        ("0.0.0.0/0", "192.168.1.0/24", true, "everything"),
        ("fd00::/64", "fd00::/48", true, "v6 supernet"),
        ("fd00::/64", "fd00:0:0:1::/64", false, "v6 adjacent"),
        ("0.0.0.0/0", "::/0", false, "v4 vs v6"),
        (
            "10.0.0.0/8",
            "::ffff:10.0.0.0/104",
            false,
            "v4 vs mapped v6",
        ),
    ];
    for (a, b, want, name) in cases {
        assert_eq!(overlaps(&net(a), &net(b)), want, "{name}: {a} vs {b}");
        assert_eq!(
            overlaps(&net(b), &net(a)),
            want,
            "{name} (swapped): {b} vs {a}"
        );
    }
}

#[test]
fn find_overlaps_reports_each_family_and_config() {
    let ranges = |v4: Option<&str>, v6: Option<&str>| -> Ranges {
        spec(v4.and_then(|c| fam(c, 24)), v6.and_then(|c| fam(c, 64)))
            .ranges()
            .expect("valid test ranges")
    };
    let ours = ranges(Some("10.0.0.0/16"), Some("fd00::/48"));
    let a = ranges(Some("10.0.128.0/17"), None);
    let b = ranges(Some("10.1.0.0/16"), Some("fd00::/56"));
    let c = ranges(None, Some("fd01::/48"));
    let found = find_overlaps(&ours, [("a", &a), ("b", &b), ("c", &c)]);
    let got: Vec<(Family, &str, String)> = found
        .iter()
        .map(|o| (o.family, o.other.as_str(), o.theirs.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (Family::V4, "a", "10.0.128.0/17".to_owned()),
            (Family::V6, "b", "fd00::/56".to_owned())
        ]
    );
    assert_eq!(found[0].ours, net("10.0.0.0/16"));
    assert_eq!(
        found[0].to_string(),
        r#"IPv4 range 10.0.0.0/16 overlaps 10.0.128.0/17 of NodeIPAMConfig "a""#
    );
    assert!(find_overlaps(&ours, []).is_empty());
}

#[test]
fn spec_round_trips_through_json_with_defaults() {
    let s: NodeIPAMConfigSpec = serde_json::from_value(json!({
        "ipv4": {"cidr": "10.64.0.0/14", "perNodeMaskSize": 24}
    }))
    .expect("minimal spec parses");
    assert_eq!(
        s.allocation,
        Allocation::Enabled,
        "allocation defaults to Enabled"
    );
    let back = serde_json::to_value(&s).expect("serializes");
    assert_eq!(
        back,
        json!({"ipv4": {"cidr": "10.64.0.0/14", "perNodeMaskSize": 24}, "allocation": "Enabled"}),
        "absent optional fields are omitted, not sent as null"
    );
    assert!(serde_json::from_value::<NodeIPAMConfigSpec>(json!({"allocation": "Paused"})).is_err());
}
