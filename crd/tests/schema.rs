//! The generated CRD carries the API shape the cluster relies on: names and scope, printer
//! columns, the CEL rules and the limits that keep their cost estimates within budget.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion;
use kube_core::CustomResourceExt;
use nodeipam_crd::NodeIPAMConfig;
use serde_json::Value;

fn version() -> CustomResourceDefinitionVersion {
    let crd = NodeIPAMConfig::crd();
    assert_eq!(crd.spec.versions.len(), 1, "exactly one version");
    crd.spec.versions[0].clone()
}

fn root_schema() -> Value {
    let schema = version().schema.and_then(|s| s.open_api_v3_schema);
    serde_json::to_value(schema.expect("the CRD has a schema")).expect("schema is JSON")
}

/// The schema node at a path of property names (`[]` steps into array items).
fn node<'a>(root: &'a Value, path: &[&str]) -> &'a Value {
    let mut n = root;
    for step in path {
        n = if *step == "[]" {
            &n["items"]
        } else {
            &n["properties"][*step]
        };
        assert!(
            !n.is_null(),
            "schema has no node at {path:?} (stuck at {step})"
        );
    }
    n
}

fn rules(n: &Value) -> Vec<(String, String)> {
    n["x-kubernetes-validations"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap_or_default().to_owned(),
                        r["message"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn has_rule(n: &Value, rule_part: &str, message_part: &str) -> bool {
    rules(n)
        .iter()
        .any(|(r, m)| r.contains(rule_part) && m.contains(message_part))
}

/// Every node carrying `x-kubernetes-validations`, with its path.
fn all_rule_nodes(n: &Value, path: String, out: &mut Vec<(String, Value)>) {
    if n.get("x-kubernetes-validations").is_some() {
        out.push((path.clone(), n.clone()));
    }
    if let Some(props) = n["properties"].as_object() {
        for (k, v) in props {
            all_rule_nodes(v, format!("{path}.{k}"), out);
        }
    }
    if n.get("items").is_some() {
        all_rule_nodes(&n["items"], format!("{path}[]"), out);
    }
}

#[test]
fn names_scope_and_subresources() {
    let crd = NodeIPAMConfig::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("nodeipamconfigs.nodeipam.io")
    );
    assert_eq!(crd.spec.group, "nodeipam.io");
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.kind, "NodeIPAMConfig");
    assert_eq!(crd.spec.names.plural, "nodeipamconfigs");
    assert_eq!(crd.spec.names.short_names, Some(vec!["nipc".to_owned()]));
    let v = version();
    assert_eq!(v.name, "v1alpha1");
    assert!(v.served && v.storage);
    assert!(
        v.subresources.and_then(|s| s.status).is_some(),
        "status must be a subresource so the controller can write it without touching spec"
    );
}

#[test]
fn printer_columns() {
    let cols = version().additional_printer_columns.unwrap_or_default();
    let find = |name: &str| {
        cols.iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
            .unwrap_or_else(|| panic!("no printer column {name}"))
    };
    let default_view = [
        ("IPv4", ".spec.ipv4.cidr"),
        ("IPv6", ".spec.ipv6.cidr"),
        ("Nodes", ".status.nodes"),
        ("Ready", r#".status.conditions[?(@.type=="Ready")].status"#),
        (
            "Drained",
            r#".status.conditions[?(@.type=="Drained")].status"#,
        ),
        ("Age", ".metadata.creationTimestamp"),
    ];
    for (name, path) in default_view {
        let c = find(name);
        assert_eq!(c.json_path, path, "column {name}");
        assert_eq!(c.priority.unwrap_or(0), 0, "column {name} shows by default");
    }
    let wide_view = [
        ("IPv4-Mask", ".spec.ipv4.perNodeMaskSize"),
        ("IPv6-Mask", ".spec.ipv6.perNodeMaskSize"),
        ("IPv4-Allocated", ".status.ipv4.allocated"),
        ("IPv4-Capacity", ".status.ipv4.capacity"),
        ("IPv6-Allocated", ".status.ipv6.allocated"),
        ("IPv6-Capacity", ".status.ipv6.capacity"),
    ];
    for (name, path) in wide_view {
        let c = find(name);
        assert_eq!(c.json_path, path, "column {name}");
        assert_eq!(c.priority, Some(1), "column {name} shows with -o wide");
    }
    // The default view lists columns in this order after NAME.
    let order: Vec<&str> = cols
        .iter()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(order, ["IPv4", "IPv6", "Nodes", "Ready", "Drained", "Age"]);
}

#[test]
fn spec_rules_require_a_family_and_forbid_adding_or_removing() {
    let root = root_schema();
    let spec = node(&root, &["spec"]);
    assert!(has_rule(
        spec,
        "has(self.ipv4) || has(self.ipv6)",
        "at least one"
    ));
    for f in ["ipv4", "ipv6", "nodeSelector"] {
        assert!(
            has_rule(
                spec,
                &format!("has(self.{f}) == has(oldSelf.{f})"),
                "create a new NodeIPAMConfig"
            ),
            "spec must forbid adding or removing {f}"
        );
    }
}

#[test]
fn family_rules_check_cidr_family_canonical_form_and_masks() {
    let root = root_schema();
    for (f, n, max) in [("ipv4", 4, 30), ("ipv6", 6, 126)] {
        let fam = node(&root, &["spec", f]);
        assert!(has_rule(
            fam,
            "isCIDR(self.cidr)",
            &format!("{f}.cidr must be a CIDR")
        ));
        assert!(has_rule(
            fam,
            &format!("cidr(self.cidr).ip().family() == {n}"),
            &format!("{f}.cidr")
        ));
        assert!(has_rule(
            fam,
            "cidr(self.cidr) == cidr(self.cidr).masked()",
            "canonical"
        ));
        assert!(has_rule(
            fam,
            &format!("self.perNodeMaskSize <= {max}"),
            &format!("at most {max}")
        ));
        assert!(has_rule(
            fam,
            "self.perNodeMaskSize >= cidr(self.cidr).prefixLength()",
            "at least"
        ));
        assert!(has_rule(
            fam,
            "self == oldSelf",
            &format!("{f} is immutable")
        ));
        let cidr = node(&root, &["spec", f, "cidr"]);
        assert!(
            cidr["maxLength"]
                .as_u64()
                .is_some_and(|l| (49..=128).contains(&l))
        );
    }
    let v6 = node(&root, &["spec", "ipv6"]);
    assert!(has_rule(
        v6,
        "self.perNodeMaskSize - cidr(self.cidr).prefixLength() <= 32",
        "2^32"
    ));
}

#[test]
fn every_cidr_call_is_guarded_by_is_cidr() {
    // An unguarded cidr() on a bad string is a CEL runtime error, which the API server reports
    // as an opaque evaluation error instead of the rule's message.
    let mut nodes = Vec::new();
    all_rule_nodes(&root_schema(), "".into(), &mut nodes);
    for (path, n) in nodes {
        for (rule, _) in rules(&n) {
            if rule.contains("cidr(self.cidr)") {
                assert!(
                    rule.starts_with("!isCIDR(self.cidr) ||")
                        || rule.starts_with("!(isCIDR(self.cidr) &&"),
                    "{path}: unguarded cidr() in {rule}"
                );
            }
        }
    }
}

#[test]
fn every_rule_has_a_message_and_valid_field_path() {
    let mut nodes = Vec::new();
    all_rule_nodes(&root_schema(), "".into(), &mut nodes);
    assert!(
        nodes.len() >= 8,
        "rules expected on many nodes, found {}",
        nodes.len()
    );
    for (path, n) in nodes {
        for r in n["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let message = r["message"].as_str().unwrap_or_default();
            assert!(
                !message.is_empty(),
                "{path}: rule {} has no message",
                r["rule"]
            );
            assert!(
                r.get("messageExpression").is_none(),
                "{path}: messageExpression costs blow the CEL budget"
            );
            if let Some(fp) = r["fieldPath"].as_str() {
                let field = fp.strip_prefix('.').expect("fieldPath starts with '.'");
                assert!(
                    !n["properties"][field].is_null(),
                    "{path}: fieldPath {fp} names no property"
                );
            }
        }
    }
}

#[test]
fn node_selector_is_bounded_and_checked_like_core() {
    let root = root_schema();
    let sel = node(&root, &["spec", "nodeSelector"]);
    assert!(has_rule(
        sel,
        "self == oldSelf",
        "nodeSelector is immutable"
    ));
    let terms = node(&root, &["spec", "nodeSelector", "nodeSelectorTerms"]);
    assert_eq!(terms["minItems"], 1);
    assert!(terms["maxItems"].is_u64());

    let expr = node(
        &root,
        &[
            "spec",
            "nodeSelector",
            "nodeSelectorTerms",
            "[]",
            "matchExpressions",
        ],
    );
    assert!(expr["maxItems"].is_u64());
    let item = &expr["items"];
    assert!(has_rule(
        item,
        "['In', 'NotIn']",
        "values must be specified"
    ));
    assert!(has_rule(
        item,
        "['Exists', 'DoesNotExist']",
        "may not be specified"
    ));
    assert!(has_rule(item, "['Gt', 'Lt']", "single integer"));
    let ops: Vec<&str> = item["properties"]["operator"]["enum"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(ops, ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]);
    assert!(has_rule(
        &item["properties"]["key"],
        "self.matches(",
        "label key"
    ));
    let value = &item["properties"]["values"]["items"];
    assert_eq!(value["maxLength"], 63);
    assert!(has_rule(value, "self.matches(", "label value"));

    let fields = node(
        &root,
        &[
            "spec",
            "nodeSelector",
            "nodeSelectorTerms",
            "[]",
            "matchFields",
            "[]",
        ],
    );
    assert_eq!(
        fields["properties"]["key"]["enum"],
        serde_json::json!(["metadata.name"])
    );
    assert_eq!(
        fields["properties"]["operator"]["enum"],
        serde_json::json!(["In", "NotIn"])
    );
    assert!(has_rule(fields, "size(self.values) == 1", "exactly one"));
}

#[test]
fn allocation_is_an_enum_defaulting_to_enabled() {
    let root = root_schema();
    let alloc = node(&root, &["spec", "allocation"]);
    assert_eq!(alloc["enum"], serde_json::json!(["Enabled", "Disabled"]));
    assert_eq!(alloc["default"], "Enabled");
    assert!(
        rules(alloc).is_empty(),
        "allocation is the one mutable field"
    );
}

#[test]
fn conditions_are_a_map_keyed_by_type() {
    let root = root_schema();
    let conds = node(&root, &["status", "conditions"]);
    assert_eq!(conds["x-kubernetes-list-type"], "map");
    assert_eq!(
        conds["x-kubernetes-list-map-keys"],
        serde_json::json!(["type"])
    );
    let required: Vec<&str> = conds["items"]["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        required.contains(&"type"),
        "a list-map key must be required"
    );
}

#[test]
fn integer_formats_are_ones_kubernetes_knows() {
    // uint8/uint64 make the API server warn on every apply.
    fn walk(n: &Value, path: &str) {
        if let Some(f) = n["format"].as_str() {
            assert!(
                ["int32", "int64", "date-time"].contains(&f),
                "{path}: format {f} is unknown to Kubernetes"
            );
        }
        if let Some(props) = n["properties"].as_object() {
            for (k, v) in props {
                walk(v, &format!("{path}.{k}"));
            }
        }
        if n.get("items").is_some() {
            walk(&n["items"], &format!("{path}[]"));
        }
    }
    walk(&root_schema(), "");
}

#[test]
fn descriptions_explain_the_fields() {
    let root = root_schema();
    for path in [
        &["spec", "ipv4"][..],
        &["spec", "ipv4", "cidr"],
        &["spec", "ipv4", "perNodeMaskSize"],
        &["spec", "nodeSelector"],
        &["spec", "allocation"],
        &["status", "nodes"],
        &["status", "conditions"],
    ] {
        let d = node(&root, path)["description"]
            .as_str()
            .unwrap_or_default();
        assert!(
            d.len() > 20,
            "{path:?} needs a description for kubectl explain"
        );
    }
    let conds = node(&root, &["status", "conditions"])["description"]
        .as_str()
        .unwrap_or_default();
    for word in ["Ready", "Exhausted", "Drained", "NodesRemaining", "NoNodes"] {
        assert!(
            conds.contains(word),
            "conditions description must explain {word}"
        );
    }
}

#[test]
fn descriptions_are_not_hard_wrapped() {
    // kubectl explain wraps text itself; a newline inside a paragraph breaks sentences apart.
    fn walk(n: &Value, path: &str) {
        if let Some(d) = n["description"].as_str() {
            let lone_newline = d.split("\n\n").any(|p| p.contains('\n'));
            assert!(
                !lone_newline,
                "{path}: description has a line break inside a paragraph: {d:?}"
            );
        }
        if let Some(props) = n["properties"].as_object() {
            for (k, v) in props {
                walk(v, &format!("{path}.{k}"));
            }
        }
        if n.get("items").is_some() {
            walk(&n["items"], &format!("{path}[]"));
        }
    }
    walk(&root_schema(), "");
}
