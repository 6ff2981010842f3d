//! The CEL rules (`x-kubernetes-validations`), list-size and string-length limits and list
//! semantics injected into the generated `NodeIPAMConfig` OpenAPI schema.
//!
//! The functions here are schemars `transform`s attached to fields in [`crate::types`], so
//! `NodeIPAMConfig::crd()` itself carries every rule. The limits bound CEL cost estimates (the
//! API server rejects a CRD whose rules could cost too much) and are mirrored by
//! [`crate::validation`]. Both take the limits from [`crate::limits`] and the family vocabulary
//! from [`crate::range`], never from each other.

use schemars::Schema;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::limits::{
    MAX_BLOCK_BITS, MAX_LABEL_KEY_LENGTH, MAX_LABEL_VALUE_LENGTH, MAX_NODE_NAME_LENGTH,
    MAX_NODE_SELECTOR_TERMS, MAX_REQUIREMENTS_PER_TERM, MAX_SELECTOR_VALUES,
};
use crate::range::Family;

mod pool;
pub use pool::*;

/// What to do instead of changing an immutable field.
const DRAIN_HINT: &str = "create a new NodeIPAMConfig and delete this one to drain it";

// Regexes use `[.]` rather than `\.` so no escaping is needed in CEL or Rust literals.
const DNS_LABEL_RE: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const LABEL_NAME_RE: &str = "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?";
const LABEL_VALUE_RE: &str = "^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$";

/// One `x-kubernetes-validations` entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CelRule {
    /// The CEL expression; `self` is the value of the schema node carrying the rule.
    pub rule: String,
    /// Shown when the rule fails. Static on purpose: a `messageExpression` that formats a
    /// CIDR or number has an unbounded estimated cost and the API server rejects the CRD.
    pub message: String,
    /// Path, relative to the node carrying the rule, of the field the error is reported on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
    /// `FieldValueInvalid` (the API server's default), `FieldValueRequired` or `FieldValueForbidden`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl CelRule {
    fn new(rule: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            rule: rule.into(),
            message: message.into(),
            field_path: None,
            reason: None,
        }
    }

    fn at(mut self, field_path: &str) -> Self {
        self.field_path = Some(field_path.to_owned());
        self
    }

    fn reason(mut self, reason: &str) -> Self {
        self.reason = Some(reason.to_owned());
        self
    }

    /// Whether the rule compares against the old object (evaluated only on update).
    pub fn is_transition(&self) -> bool {
        self.rule.contains("oldSelf")
    }
}

const REQUIRED: &str = "FieldValueRequired";
const FORBIDDEN: &str = "FieldValueForbidden";

/// Rules on `spec`: at least one family, and families/selector cannot be added or removed.
pub fn spec_level_rules() -> Vec<CelRule> {
    let mut rules = vec![
        CelRule::new(
            "has(self.ipv4) || has(self.ipv6)",
            "at least one of spec.ipv4 or spec.ipv6 is required",
        )
        .reason(REQUIRED),
    ];
    for family in Family::ALL {
        let f = family.field();
        rules.push(
            CelRule::new(
                format!("has(self.{f}) == has(oldSelf.{f})"),
                format!("{f} cannot be added to or removed from an existing NodeIPAMConfig: {DRAIN_HINT}"),
            )
            .at(&format!(".{f}"))
            .reason(FORBIDDEN),
        );
    }
    rules.push(
        CelRule::new(
            "has(self.nodeSelector) == has(oldSelf.nodeSelector)",
            format!("nodeSelector cannot be added or removed: {DRAIN_HINT}"),
        )
        .at(".nodeSelector")
        .reason(FORBIDDEN),
    );
    rules
}

/// Rules on `spec.ipv4` / `spec.ipv6` (`self` is the family's `{cidr, perNodeMaskSize}`).
///
/// Each rule after the first is guarded so that a malformed or wrong-family CIDR yields one
/// error, not one per rule.
pub fn family_rules(family: Family) -> Vec<CelRule> {
    let f = family.field();
    let n = match family {
        Family::V4 => 4,
        Family::V6 => 6,
    };
    let max = family.max_per_node_mask_size();
    let example = family.example();
    let parsed = "isCIDR(self.cidr)";
    let right_family = format!("{parsed} && cidr(self.cidr).ip().family() == {n}");
    let mut rules = vec![
        CelRule::new(
            parsed,
            format!("{f}.cidr must be a CIDR such as {example}"),
        )
        .at(".cidr"),
        CelRule::new(
            format!("!{parsed} || cidr(self.cidr).ip().family() == {n}"),
            format!("{f}.cidr must be an {family} CIDR such as {example}"),
        )
        .at(".cidr"),
        CelRule::new(
            format!("!({right_family}) || cidr(self.cidr) == cidr(self.cidr).masked()"),
            format!("{f}.cidr must be canonical (host bits zero)"),
        )
        .at(".cidr"),
        CelRule::new(
            format!("self.perNodeMaskSize <= {max}"),
            format!("{f}.perNodeMaskSize must be at most {max}: a block must hold more than one pod address"),
        )
        .at(".perNodeMaskSize"),
        CelRule::new(
            format!("!({right_family}) || self.perNodeMaskSize >= cidr(self.cidr).prefixLength()"),
            format!("{f}.perNodeMaskSize must be at least the prefix length of {f}.cidr"),
        )
        .at(".perNodeMaskSize"),
    ];
    // An IPv4 block is at most /30, so an IPv4 range never splits into more than 2^30 blocks.
    if max > MAX_BLOCK_BITS {
        rules.push(
            CelRule::new(
                format!(
                    "!({right_family}) || self.perNodeMaskSize - cidr(self.cidr).prefixLength() <= {MAX_BLOCK_BITS}"
                ),
                format!(
                    "{f}.perNodeMaskSize must be at most {MAX_BLOCK_BITS} more than the prefix length of {f}.cidr: a range holds at most 2^{MAX_BLOCK_BITS} blocks"
                ),
            )
            .at(".perNodeMaskSize"),
        );
    }
    rules.push(
        CelRule::new(
            "self == oldSelf",
            format!("{f} is immutable ({f}.cidr and {f}.perNodeMaskSize): {DRAIN_HINT}"),
        )
        .reason(FORBIDDEN),
    );
    rules
}

/// Rules on `spec.nodeSelector` itself.
pub fn node_selector_level_rules() -> Vec<CelRule> {
    vec![
        CelRule::new(
            "self == oldSelf",
            format!("nodeSelector is immutable: {DRAIN_HINT}"),
        )
        .reason(FORBIDDEN),
    ]
}

/// Rules on each `matchExpressions` item (a label requirement).
pub fn label_requirement_rules() -> Vec<CelRule> {
    vec![
        CelRule::new(
            "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
            "values must be specified when operator is In or NotIn",
        )
        .at(".values")
        .reason(REQUIRED),
        CelRule::new(
            "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
            "values may not be specified when operator is Exists or DoesNotExist",
        )
        .at(".values")
        .reason(FORBIDDEN),
        CelRule::new(
            "!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 && self.values[0].matches('^[0-9]+$'))",
            "values must be a single integer when operator is Gt or Lt",
        )
        .at(".values"),
    ]
}

/// Rule on a label key (`self` is the key string).
pub fn label_key_rules() -> Vec<CelRule> {
    vec![CelRule::new(
        format!(
            "self.matches('^({DNS_LABEL_RE}([.]{DNS_LABEL_RE})*/)?{LABEL_NAME_RE}$') && self.indexOf('/') <= 253"
        ),
        "key must be a label key: an optional DNS subdomain prefix (at most 253 characters) and '/', then a name of at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
    )]
}

/// Rule on a label value (`self` is the value string).
pub fn label_value_rules() -> Vec<CelRule> {
    vec![CelRule::new(
        format!("self.matches('{LABEL_VALUE_RE}')"),
        "value must be a label value: empty, or at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
    )]
}

/// Rules on each `matchFields` item (a node field requirement).
pub fn field_requirement_rules() -> Vec<CelRule> {
    vec![
        CelRule::new(
            "has(self.values) && size(self.values) == 1",
            "values must hold exactly one node name for a node field selector",
        )
        .at(".values")
        .reason(REQUIRED),
    ]
}

/// Rule on a node name in `matchFields` values.
pub fn node_name_rules() -> Vec<CelRule> {
    vec![CelRule::new(
        format!("self.matches('^{DNS_LABEL_RE}([.]{DNS_LABEL_RE})*$')"),
        "value must be a node name: a lowercase RFC 1123 subdomain of alphanumerics, '-' or '.', starting and ending with an alphanumeric",
    )]
}

fn add_rules(node: &mut Map<String, Value>, rules: Vec<CelRule>) {
    let entry = node
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = entry {
        list.extend(
            rules
                .into_iter()
                .filter_map(|r| serde_json::to_value(r).ok()),
        );
    }
}

/// Descends through `properties`/`items` keys; `None` if the schema has another shape.
fn node_at<'a>(
    root: &'a mut Map<String, Value>,
    path: &[&str],
) -> Option<&'a mut Map<String, Value>> {
    let mut node = root;
    for key in path {
        node = node.get_mut(*key)?.as_object_mut()?;
    }
    Some(node)
}

/// `transform` for `NodeIPAMConfigSpec`.
pub fn spec_rules(schema: &mut Schema) {
    if let Some(node) = schema.as_object_mut() {
        add_rules(node, spec_level_rules());
    }
}

/// `transform` for `spec.ipv4`.
pub fn ipv4_rules(schema: &mut Schema) {
    if let Some(node) = schema.as_object_mut() {
        add_rules(node, family_rules(Family::V4));
    }
}

/// `transform` for `spec.ipv6`.
pub fn ipv6_rules(schema: &mut Schema) {
    if let Some(node) = schema.as_object_mut() {
        add_rules(node, family_rules(Family::V6));
    }
}

/// `transform` for `spec.nodeSelector`: the embedded core/v1 NodeSelector schema gets size
/// limits, operator enums and per-requirement rules so the API server checks what core does.
pub fn node_selector_rules(schema: &mut Schema) {
    node_selector_schema(schema, node_selector_level_rules());
}

/// The NodeSelector limits and rules, with `level` (immutability) on the selector itself.
fn node_selector_schema(schema: &mut Schema, level: Vec<CelRule>) {
    let Some(root) = schema.as_object_mut() else {
        return;
    };
    add_rules(root, level);

    let terms_path = ["properties", "nodeSelectorTerms"];
    if let Some(terms) = node_at(root, &terms_path) {
        terms.insert("minItems".into(), json!(1));
        terms.insert("maxItems".into(), json!(MAX_NODE_SELECTOR_TERMS));
    }

    let expressions = [
        "properties",
        "nodeSelectorTerms",
        "items",
        "properties",
        "matchExpressions",
    ];
    if let Some(list) = node_at(root, &expressions) {
        list.insert("maxItems".into(), json!(MAX_REQUIREMENTS_PER_TERM));
        if let Some(item) = node_at(list, &["items"]) {
            add_rules(item, label_requirement_rules());
            if let Some(key) = node_at(item, &["properties", "key"]) {
                key.insert("maxLength".into(), json!(MAX_LABEL_KEY_LENGTH));
                add_rules(key, label_key_rules());
            }
            if let Some(op) = node_at(item, &["properties", "operator"]) {
                op.insert(
                    "enum".into(),
                    json!(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]),
                );
            }
            if let Some(values) = node_at(item, &["properties", "values"]) {
                values.insert("maxItems".into(), json!(MAX_SELECTOR_VALUES));
                if let Some(value) = node_at(values, &["items"]) {
                    value.insert("maxLength".into(), json!(MAX_LABEL_VALUE_LENGTH));
                    add_rules(value, label_value_rules());
                }
            }
        }
    }

    let fields = [
        "properties",
        "nodeSelectorTerms",
        "items",
        "properties",
        "matchFields",
    ];
    if let Some(list) = node_at(root, &fields) {
        list.insert("maxItems".into(), json!(MAX_REQUIREMENTS_PER_TERM));
        if let Some(item) = node_at(list, &["items"]) {
            add_rules(item, field_requirement_rules());
            if let Some(key) = node_at(item, &["properties", "key"]) {
                key.insert("enum".into(), json!(["metadata.name"]));
            }
            if let Some(op) = node_at(item, &["properties", "operator"]) {
                op.insert("enum".into(), json!(["In", "NotIn"]));
            }
            if let Some(values) = node_at(item, &["properties", "values"]) {
                // Core allows exactly one node name here; the bound also keeps the name
                // regex within the CEL cost budget.
                values.insert("maxItems".into(), json!(1));
                if let Some(value) = node_at(values, &["items"]) {
                    value.insert("maxLength".into(), json!(MAX_NODE_NAME_LENGTH));
                    add_rules(value, node_name_rules());
                }
            }
        }
    }
}

/// `transform` for the spec and status structs: doc comments are hard-wrapped, but
/// `kubectl explain` re-wraps descriptions itself, so lines within a paragraph are joined.
pub fn unwrap_descriptions(schema: &mut Schema) {
    fn walk(map: &mut Map<String, Value>) {
        if let Some(Value::String(d)) = map.get_mut("description") {
            *d = d
                .split("\n\n")
                .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join("\n\n");
        }
        for value in map.values_mut() {
            match value {
                Value::Object(child) => walk(child),
                Value::Array(items) => items
                    .iter_mut()
                    .filter_map(Value::as_object_mut)
                    .for_each(walk),
                _ => {}
            }
        }
    }
    if let Some(map) = schema.as_object_mut() {
        walk(map);
    }
}

/// `transform` for `status.conditions`: a map keyed by `type`, as metav1 conditions are, so
/// server-side apply merges conditions by type.
pub fn conditions_list_map(schema: &mut Schema) {
    if let Some(node) = schema.as_object_mut() {
        node.insert("x-kubernetes-list-type".into(), json!("map"));
        node.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
    }
}
