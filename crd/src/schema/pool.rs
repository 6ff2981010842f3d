//! The CEL rules and limits of the `NodeIPAMPool` schema, attached by schemars `transform`s to
//! the fields of [`crate::pool`]. Their Rust twin is `NodeIPAMPoolSpec::parse` and
//! `validate_pool_update` in [`crate::validation`]; both read the limits from
//! [`crate::limits`].

use schemars::Schema;
use serde_json::json;

use super::{CelRule, FORBIDDEN, REQUIRED, add_rules, node_at, node_selector_schema};
use crate::limits::{
    MAX_CIDR_LENGTH, MAX_DURATION_LENGTH, MAX_POOL_BLOCK_BITS, MAX_POOL_CIDRS,
    MAX_POOL_HEADROOM_BLOCKS, MAX_POOL_RANGES,
};
use crate::range::Family;

/// What to do instead of changing an immutable field of a pool.
const POOL_HINT: &str = "create a new NodeIPAMPool beside this one and delete this one: its children drain like deleted NodeIPAMConfigs";

/// A Go duration as `time.ParseDuration` reads it, without a sign of `-`: `0`, or one or more
/// decimal numbers each with a unit.
pub const DURATION_RE: &str = "^[+]?(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// Rules on a pool's `spec`: at least one family, lockstep dual stack, and families and the
/// selector cannot be added or removed.
pub fn pool_spec_level_rules() -> Vec<CelRule> {
    let mut rules = vec![
        CelRule::new(
            "has(self.ipv4) || has(self.ipv6)",
            "at least one of spec.ipv4 or spec.ipv6 is required",
        )
        .reason(REQUIRED),
        CelRule::new(
            "!has(self.ipv4) || !has(self.ipv6) || self.ipv4.perNodeMaskSize - self.ipv4.rangeMaskSize == self.ipv6.perNodeMaskSize - self.ipv6.rangeMaskSize",
            "ipv6.perNodeMaskSize - ipv6.rangeMaskSize must equal ipv4.perNodeMaskSize - ipv4.rangeMaskSize: both families of a pool must give the same number of blocks per range",
        )
        .at(".ipv6.perNodeMaskSize"),
    ];
    for family in Family::ALL {
        let f = family.field();
        rules.push(
            CelRule::new(
                format!("has(self.{f}) == has(oldSelf.{f})"),
                format!(
                    "{f} cannot be added to or removed from an existing NodeIPAMPool: {POOL_HINT}"
                ),
            )
            .at(&format!(".{f}"))
            .reason(FORBIDDEN),
        );
    }
    rules.push(
        CelRule::new(
            "has(self.nodeSelector) == has(oldSelf.nodeSelector)",
            format!("nodeSelector cannot be added or removed: {POOL_HINT}"),
        )
        .at(".nodeSelector")
        .reason(FORBIDDEN),
    );
    rules
}

/// `cidr(c)` is safe to call and `c` is of the family numbered `n`.
fn of_family(var: &str, n: u8) -> String {
    format!("isCIDR({var}) && cidr({var}).ip().family() == {n}")
}

/// Rules on `spec.ipv4` / `spec.ipv6` of a pool (`self` is `{cidrs, rangeMaskSize,
/// perNodeMaskSize}`).
pub fn pool_family_rules(family: Family) -> Vec<CelRule> {
    let f = family.field();
    let n = family_number(family);
    let max = family.max_per_node_mask_size();
    let bits = MAX_POOL_BLOCK_BITS;
    vec![
        CelRule::new(
            format!("self.perNodeMaskSize <= {max}"),
            format!("{f}.perNodeMaskSize must be at most {max}: a block must hold more than one pod address"),
        )
        .at(".perNodeMaskSize"),
        CelRule::new(
            "self.perNodeMaskSize > self.rangeMaskSize",
            format!("{f}.perNodeMaskSize must be more than {f}.rangeMaskSize: a range holds at least two blocks"),
        )
        .at(".perNodeMaskSize"),
        CelRule::new(
            format!("self.perNodeMaskSize <= self.rangeMaskSize || self.perNodeMaskSize - self.rangeMaskSize <= {bits}"),
            format!("{f}.perNodeMaskSize must be at most {bits} more than {f}.rangeMaskSize: a range of a pool holds at most 2^{bits} blocks"),
        )
        .at(".perNodeMaskSize"),
        CelRule::new(
            format!(
                "self.cidrs.all(c, !({}) || cidr(c).prefixLength() <= self.rangeMaskSize)",
                of_family("c", n)
            ),
            format!("{f}.rangeMaskSize must be at least the prefix length of every CIDR in {f}.cidrs: a range is carved out of one CIDR"),
        )
        .at(".rangeMaskSize"),
        CelRule::new(
            format!(
                "self.cidrs.all(a, self.cidrs.all(b, a == b || !({}) || !({}) || !(cidr(a).containsCIDR(cidr(b)) || cidr(b).containsCIDR(cidr(a)))))",
                of_family("a", n),
                of_family("b", n)
            ),
            format!("{f}.cidrs must not overlap each other"),
        )
        .at(".cidrs"),
        CelRule::new(
            "self.rangeMaskSize == oldSelf.rangeMaskSize",
            format!("{f}.rangeMaskSize is immutable: {POOL_HINT}"),
        )
        .at(".rangeMaskSize")
        .reason(FORBIDDEN),
        CelRule::new(
            "self.perNodeMaskSize == oldSelf.perNodeMaskSize",
            format!("{f}.perNodeMaskSize is immutable: {POOL_HINT}"),
        )
        .at(".perNodeMaskSize")
        .reason(FORBIDDEN),
        CelRule::new(
            "oldSelf.cidrs.all(c, c in self.cidrs)",
            format!("{f}.cidrs may only be appended to: a CIDR cannot be removed or changed, as its ranges may hold blocks; {POOL_HINT}"),
        )
        .at(".cidrs")
        .reason(FORBIDDEN),
    ]
}

fn family_number(family: Family) -> u8 {
    match family {
        Family::V4 => 4,
        Family::V6 => 6,
    }
}

/// Rules on each item of a pool family's `cidrs` (`self` is the CIDR string). Each rule after
/// the first is guarded so that a malformed CIDR yields one error.
pub fn pool_cidr_rules(family: Family) -> Vec<CelRule> {
    let f = family.field();
    let n = family_number(family);
    let example = family.example();
    vec![
        CelRule::new(
            "isCIDR(self)",
            format!("each of {f}.cidrs must be a CIDR such as {example}"),
        ),
        CelRule::new(
            format!("!isCIDR(self) || cidr(self).ip().family() == {n}"),
            format!("each of {f}.cidrs must be an {family} CIDR such as {example}"),
        ),
        CelRule::new(
            format!(
                "!({}) || cidr(self) == cidr(self).masked()",
                of_family("self", n)
            ),
            format!("each of {f}.cidrs must be canonical (host bits zero)"),
        ),
    ]
}

/// Rules on `spec.ranges`.
pub fn pool_ranges_rules() -> Vec<CelRule> {
    vec![
        CelRule::new(
            "self.min <= self.max",
            "ranges.min must be at most ranges.max",
        )
        .at(".min"),
    ]
}

/// Rules on `spec.scaleDown.emptyFor` (`self` is the string). The first keeps `duration()`
/// from a runtime error on a malformed string.
pub fn empty_for_rules() -> Vec<CelRule> {
    vec![
        CelRule::new(
            format!("self.matches('{DURATION_RE}')"),
            "scaleDown.emptyFor must be a non-negative duration such as 30m or 1h30m (units ns, us, ms, s, m, h)",
        ),
        CelRule::new(
            format!("!self.matches('{DURATION_RE}') || duration(self) >= duration('0s')"),
            "scaleDown.emptyFor must be a duration of at most 2562047h",
        ),
    ]
}

fn family_transform(schema: &mut Schema, family: Family) {
    let Some(node) = schema.as_object_mut() else {
        return;
    };
    add_rules(node, pool_family_rules(family));
    if let Some(cidrs) = node_at(node, &["properties", "cidrs"]) {
        cidrs.insert("minItems".into(), json!(1));
        cidrs.insert("maxItems".into(), json!(MAX_POOL_CIDRS));
        cidrs.insert("x-kubernetes-list-type".into(), json!("set"));
        if let Some(item) = node_at(cidrs, &["items"]) {
            item.insert("minLength".into(), json!(1));
            item.insert("maxLength".into(), json!(MAX_CIDR_LENGTH));
            add_rules(item, pool_cidr_rules(family));
        }
    }
}

/// `transform` for `NodeIPAMPoolSpec`.
pub fn pool_spec_rules(schema: &mut Schema) {
    if let Some(node) = schema.as_object_mut() {
        add_rules(node, pool_spec_level_rules());
    }
}

/// `transform` for a pool's `spec.ipv4`.
pub fn pool_ipv4_rules(schema: &mut Schema) {
    family_transform(schema, Family::V4);
}

/// `transform` for a pool's `spec.ipv6`.
pub fn pool_ipv6_rules(schema: &mut Schema) {
    family_transform(schema, Family::V6);
}

/// `transform` for a pool's `spec.nodeSelector`: the same checks as a config's, with the
/// pool's way out of immutability.
pub fn pool_node_selector_rules(schema: &mut Schema) {
    node_selector_schema(
        schema,
        vec![
            CelRule::new(
                "self == oldSelf",
                format!("nodeSelector is immutable: {POOL_HINT}"),
            )
            .reason(FORBIDDEN),
        ],
    );
}

/// `transform` for `spec.ranges`.
pub fn pool_ranges_schema(schema: &mut Schema) {
    let Some(node) = schema.as_object_mut() else {
        return;
    };
    add_rules(node, pool_ranges_rules());
    if let Some(max) = node_at(node, &["properties", "max"]) {
        max.insert("minimum".into(), json!(1));
        max.insert("maximum".into(), json!(MAX_POOL_RANGES));
    }
    if let Some(min) = node_at(node, &["properties", "min"]) {
        min.insert("minimum".into(), json!(0));
        min.insert("maximum".into(), json!(MAX_POOL_RANGES));
    }
}

/// `transform` for `spec.headroom`.
pub fn pool_headroom_schema(schema: &mut Schema) {
    if let Some(blocks) = schema
        .as_object_mut()
        .and_then(|node| node_at(node, &["properties", "blocks"]))
    {
        blocks.insert("minimum".into(), json!(0));
        blocks.insert("maximum".into(), json!(MAX_POOL_HEADROOM_BLOCKS));
    }
}

/// `transform` for `spec.scaleDown`.
pub fn pool_scale_down_schema(schema: &mut Schema) {
    if let Some(empty_for) = schema
        .as_object_mut()
        .and_then(|node| node_at(node, &["properties", "emptyFor"]))
    {
        empty_for.insert("maxLength".into(), json!(MAX_DURATION_LENGTH));
        add_rules(empty_for, empty_for_rules());
    }
}
