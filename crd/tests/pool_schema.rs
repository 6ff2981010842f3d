//! The generated NodeIPAMPool CRD: names and scope, the status subresource, the printer
//! columns, and the shape of its CEL rules (every `cidr()` and `duration()` guarded, every
//! rule with a static message and a field path that exists). The rules' verdicts are checked
//! against the real API server in `tests/tests/pool_rules.rs`.

use kube_core::CustomResourceExt;
use nodeipam_crd::NodeIPAMPool;
use serde_json::Value;

fn root_schema() -> Value {
    let crd = NodeIPAMPool::crd();
    let schema = crd.spec.versions[0]
        .schema
        .clone()
        .and_then(|s| s.open_api_v3_schema);
    serde_json::to_value(schema.expect("the CRD has a schema")).expect("schema is JSON")
}

/// Every node carrying `x-kubernetes-validations`, with its path.
fn rule_nodes(n: &Value, path: String, out: &mut Vec<(String, Value)>) {
    if n.get("x-kubernetes-validations").is_some() {
        out.push((path.clone(), n.clone()));
    }
    if let Some(props) = n["properties"].as_object() {
        for (k, v) in props {
            rule_nodes(v, format!("{path}.{k}"), out);
        }
    }
    if n.get("items").is_some() {
        rule_nodes(&n["items"], format!("{path}[]"), out);
    }
}

#[test]
fn names_scope_and_subresources() {
    let crd = NodeIPAMPool::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("nodeipampools.nodeipam.io")
    );
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.kind, "NodeIPAMPool");
    assert_eq!(crd.spec.names.short_names, Some(vec!["nipp".to_owned()]));
    assert_eq!(crd.spec.names.categories, Some(vec!["nodeipam".to_owned()]));
    assert_eq!(crd.spec.versions.len(), 1);
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(
        v.subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let default_view: Vec<&str> = v
        .additional_printer_columns
        .iter()
        .flatten()
        .filter(|c| c.priority.unwrap_or(0) == 0)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        default_view,
        ["IPv4", "IPv6", "Ranges", "Ready", "Exhausted", "Age"]
    );
}

#[test]
fn rules_are_guarded_and_name_existing_fields() {
    let root = root_schema();
    let mut nodes = Vec::new();
    rule_nodes(&root, String::new(), &mut nodes);
    assert!(nodes.len() >= 8, "rules on {} nodes only", nodes.len());
    for (path, n) in nodes {
        for r in n["x-kubernetes-validations"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let rule = r["rule"].as_str().unwrap_or_default();
            assert!(
                !r["message"].as_str().unwrap_or_default().is_empty(),
                "{path}: {rule}"
            );
            assert!(r.get("messageExpression").is_none(), "{path}: {rule}");
            // Every cidr(x) follows an isCIDR(x) guard in the same rule.
            for var in ["self", "c", "a", "b"] {
                if rule.contains(&format!("cidr({var})")) {
                    assert!(rule.contains(&format!("isCIDR({var})")), "{path}: {rule}");
                }
            }
            if rule.contains("duration(self)") {
                assert!(rule.starts_with("!self.matches("), "{path}: {rule}");
            }
            if let Some(fp) = r["fieldPath"].as_str() {
                let mut at = &n;
                for step in fp.trim_start_matches('.').split('.') {
                    at = &at["properties"][step];
                    assert!(!at.is_null(), "{path}: fieldPath {fp} names no property");
                }
            }
        }
    }
}

#[test]
fn defaults_are_the_rust_defaults() {
    let root = root_schema();
    let spec = &root["properties"]["spec"]["properties"];
    assert_eq!(
        spec["ranges"]["default"],
        serde_json::json!({"min": 1, "max": 32})
    );
    assert_eq!(
        spec["headroom"]["default"],
        serde_json::json!({"blocks": 16})
    );
    assert_eq!(
        spec["scaleDown"]["default"],
        serde_json::json!({"emptyFor": "30m"})
    );
    let conditions = &root["properties"]["status"]["properties"]["conditions"];
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
}
