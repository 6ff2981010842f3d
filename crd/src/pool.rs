//! The `NodeIPAMPool` API (group `nodeipam.io`, version `v1alpha1`): a budget of address space
//! from which the controller carves ordinary child `NodeIPAMConfig`s on demand and retires the
//! empty ones; the label and condition names it adds; and the pure helpers that name a child
//! and tell whether a config is one.
//!
//! Validation of a pool's spec lives with the config's, in [`crate::validation`]
//! ([`NodeIPAMPoolSpec::parse`]).

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_core::{Resource, ResourceExt};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::limits::MAX_DNS_SUBDOMAIN_LENGTH;
use crate::schema;
use crate::types::NodeIPAMConfig;

/// Label on every child `NodeIPAMConfig`: the name of the pool that carved it.
pub const POOL_LABEL: &str = "nodeipam.io/pool";

/// Annotation on a child `NodeIPAMConfig` the controller created and has not enabled yet: every
/// child is created with `allocation: Disabled` and this marker, and the leader enables it
/// (sets `Enabled` and removes the marker, at the resourceVersion it read) only while the
/// pool's enabled and awaiting children together are within `ranges.max`. A create that lands
/// late therefore lands as a child that serves nothing (docs/single-writer.md, "Every write").
/// A disabled child without it was disabled by a user.
pub const AWAITING_ENABLE: &str = "nodeipam.io/awaiting-enable";

/// Condition type: the pool is carving or retiring a child (the number of ranges is changing).
/// `Ready` and `Exhausted` reuse [`crate::CONDITION_READY`] and [`crate::CONDITION_EXHAUSTED`].
pub const CONDITION_SCALING: &str = "Scaling";

/// `PoolRangeStatus::state`: the child hands out blocks.
pub const RANGE_ACTIVE: &str = "Active";
/// `PoolRangeStatus::state`: the child hands out no more blocks (deleted or disabled) and
/// nodes still hold some.
pub const RANGE_DRAINING: &str = "Draining";
/// `PoolRangeStatus::state`: the child is empty and being deleted.
pub const RANGE_RETIRING: &str = "Retiring";
/// `PoolRangeStatus::state`: the child was created disabled and awaits its enabling by the
/// controller ([`AWAITING_ENABLE`]).
pub const RANGE_ENABLING: &str = "Enabling";

/// NodeIPAMPool is a budget of pod address space. The nodeipam controller carves ordinary
/// NodeIPAMConfigs ("children", labelled `nodeipam.io/pool` and owned by the pool) out of it
/// as nodes need blocks, and retires children that stayed empty.
///
/// Every child has one range of `rangeMaskSize` per family, handed out in blocks of
/// `perNodeMaskSize`, and the pool's `nodeSelector`. A new child is carved when the free
/// blocks across the pool's children fall below `headroom.blocks` (or a matching node waits
/// for a block), up to `ranges.max` children; a child empty for `scaleDown.emptyFor` is
/// deleted, never below `ranges.min` children, and drains like any deleted NodeIPAMConfig.
// clippy reads the repeated `type_`/`priority` keys of separate printcolumns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "nodeipam.io",
    version = "v1alpha1",
    kind = "NodeIPAMPool",
    shortname = "nipp",
    category = "nodeipam",
    status = "NodeIPAMPoolStatus",
    derive = "PartialEq",
    doc = "NodeIPAMPool is a budget of pod address space from which the nodeipam controller carves NodeIPAMConfigs on demand.",
    printcolumn(
        name = "IPv4",
        type_ = "string",
        json_path = ".spec.ipv4.cidrs",
        description = "IPv4 CIDRs children are carved from"
    ),
    printcolumn(
        name = "IPv6",
        type_ = "string",
        json_path = ".spec.ipv6.cidrs",
        description = "IPv6 CIDRs children are carved from"
    ),
    printcolumn(
        name = "Ranges",
        type_ = "integer",
        json_path = ".status['ipv4','ipv6'].ranges",
        description = "Children (carved NodeIPAMConfigs) of the pool"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Valid and carving as needed"
    ),
    printcolumn(
        name = "Exhausted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Exhausted\")].status",
        description = "No free block and no room to carve another child"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Scaling",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Scaling\")].status",
        priority = 1,
        description = "Carving or retiring a child"
    ),
    printcolumn(
        name = "IPv4-Allocated",
        type_ = "integer",
        json_path = ".status.ipv4.allocated",
        priority = 1,
        description = "IPv4 blocks held by nodes across the children"
    ),
    printcolumn(
        name = "IPv4-Capacity",
        type_ = "integer",
        json_path = ".status.ipv4.capacity",
        priority = 1,
        description = "IPv4 blocks in the current children"
    ),
    printcolumn(
        name = "IPv6-Allocated",
        type_ = "integer",
        json_path = ".status.ipv6.allocated",
        priority = 1,
        description = "IPv6 blocks held by nodes across the children"
    ),
    printcolumn(
        name = "IPv6-Capacity",
        type_ = "integer",
        json_path = ".status.ipv6.capacity",
        priority = 1,
        description = "IPv6 blocks in the current children"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::pool_spec_rules, transform = schema::unwrap_descriptions)]
pub struct NodeIPAMPoolSpec {
    /// IPv4 address space children are carved from. Cannot be added or removed after
    /// creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::pool_ipv4_rules)]
    pub ipv4: Option<PoolFamilySpec>,

    /// IPv6 address space children are carved from. Cannot be added or removed after
    /// creation. With both families, each child has one range of each, and both must give the
    /// same number of blocks per range (`perNodeMaskSize - rangeMaskSize` equal): a node takes
    /// one block of each family from the same child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::pool_ipv6_rules)]
    pub ipv6: Option<PoolFamilySpec>,

    /// Nodes this pool serves; when absent it serves every node. Same rules as a Pod's required
    /// node affinity. Copied to every child. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::pool_node_selector_rules)]
    pub node_selector: Option<NodeSelector>,

    /// How many children the pool keeps at least and may carve at most. Mutable.
    #[serde(default)]
    #[schemars(transform = schema::pool_ranges_schema)]
    pub ranges: PoolRanges,

    /// Free blocks to keep ready across the pool's children. Mutable.
    #[serde(default)]
    #[schemars(transform = schema::pool_headroom_schema)]
    pub headroom: PoolHeadroom,

    /// When an empty child is retired. Mutable.
    #[serde(default)]
    #[schemars(transform = schema::pool_scale_down_schema)]
    pub scale_down: PoolScaleDown,
}

/// One address family's budget: the CIDRs children are carved from, the size of each child's
/// range and the size of each node's block.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolFamilySpec {
    /// The address space children are carved from, lowest free range first: 1 to 16
    /// canonical CIDRs (host bits zero) of this family that do not overlap each other, another
    /// pool, a Service range or a NodeIPAMConfig that is not a child of this pool. CIDRs may
    /// be appended; existing ones cannot be changed or removed.
    pub cidrs: Vec<String>,

    /// Prefix length of each child's range: at least the prefix length of every CIDR in
    /// `cidrs`. Immutable.
    #[schemars(range(max = 128), extend("format" = "int32"))]
    pub range_mask_size: u8,

    /// Prefix length of the block each node receives: more than `rangeMaskSize` and at most 16
    /// more (a child holds 2 to 2^16 blocks), at most 30 (IPv4) or 126 (IPv6). Immutable.
    #[schemars(range(max = 128), extend("format" = "int32"))]
    pub per_node_mask_size: u8,
}

/// Bounds on the number of children.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolRanges {
    /// Children kept even when empty (default 1). At most `max`.
    #[serde(default = "default_min_ranges")]
    #[schemars(extend("format" = "int32"))]
    pub min: u32,

    /// Most children the pool carves (default 32), 1 to 256.
    #[serde(default = "default_max_ranges")]
    #[schemars(extend("format" = "int32"))]
    pub max: u32,
}

/// Default `ranges.min`.
pub const DEFAULT_MIN_RANGES: u32 = 1;
/// Default `ranges.max`.
pub const DEFAULT_MAX_RANGES: u32 = 32;
/// Default `headroom.blocks`.
pub const DEFAULT_HEADROOM_BLOCKS: u32 = 16;
/// Default `scaleDown.emptyFor`.
pub const DEFAULT_EMPTY_FOR: &str = "30m";

fn default_min_ranges() -> u32 {
    DEFAULT_MIN_RANGES
}

fn default_max_ranges() -> u32 {
    DEFAULT_MAX_RANGES
}

fn default_headroom_blocks() -> u32 {
    DEFAULT_HEADROOM_BLOCKS
}

fn default_empty_for() -> String {
    DEFAULT_EMPTY_FOR.to_owned()
}

impl Default for PoolRanges {
    fn default() -> Self {
        Self {
            min: DEFAULT_MIN_RANGES,
            max: DEFAULT_MAX_RANGES,
        }
    }
}

/// Free blocks to keep ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolHeadroom {
    /// A child is carved when fewer blocks than this are free across the pool's children
    /// (default 16); 0 carves only when a matching node waits for a block.
    #[serde(default = "default_headroom_blocks")]
    #[schemars(extend("format" = "int32"))]
    pub blocks: u32,
}

impl Default for PoolHeadroom {
    fn default() -> Self {
        Self {
            blocks: DEFAULT_HEADROOM_BLOCKS,
        }
    }
}

/// When an empty child is retired.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolScaleDown {
    /// How long a child must hold no block before it is deleted, as a Go duration (default
    /// `30m`; `1h30m`, `0s` for at once). Never below `ranges.min` children.
    #[serde(default = "default_empty_for")]
    pub empty_for: String,
}

impl Default for PoolScaleDown {
    fn default() -> Self {
        Self {
            empty_for: default_empty_for(),
        }
    }
}

/// Observed state of a NodeIPAMPool, written by the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::unwrap_descriptions)]
pub struct NodeIPAMPoolStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The pool's children, lowest range first (the order in which they fill).
    #[serde(default)]
    pub ranges: Vec<PoolRangeStatus>,

    /// Usage of the IPv4 budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<PoolFamilyStatus>,

    /// Usage of the IPv6 budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<PoolFamilyStatus>,

    /// Conditions, keyed by type: `Ready`, `Exhausted` and `Scaling`.
    #[serde(default)]
    #[schemars(transform = schema::conditions_list_map)]
    pub conditions: Vec<Condition>,
}

/// One child of the pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolRangeStatus {
    /// Name of the child NodeIPAMConfig.
    pub name: String,
    /// The child's IPv4 range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<String>,
    /// The child's IPv6 range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
    /// `Active`, `Enabling` (carved, not yet enabled), `Draining` or `Retiring`.
    pub state: String,
}

/// Usage of one family's budget, in blocks of `perNodeMaskSize`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolFamilyStatus {
    /// Children with a range of this family.
    #[schemars(extend("format" = "int32"))]
    pub ranges: u32,
    /// Blocks in the current children's ranges.
    #[schemars(extend("format" = "int64"))]
    pub capacity: u64,
    /// Blocks held by nodes, across the current children.
    #[schemars(extend("format" = "int64"))]
    pub allocated: u64,
    /// Blocks the whole budget could hold if every range were carved (at most `ranges.max`
    /// ranges).
    #[schemars(extend("format" = "int64"))]
    pub budget_blocks: u64,
}

/// The name of the child carved at `first`: the pool's name, `-`, and the CIDR with `.`, `:`
/// and `/` turned into `-` (`10.64.0.0/20` becomes `10-64-0-0-20`). `first` is the child's
/// IPv4 range when the pool has IPv4, else its IPv6 range.
///
/// Deterministic, so a controller that restarts mid-carve finds the child it was creating. The
/// result is a valid DNS subdomain of at most 253 characters: the CIDR part is always kept
/// whole (it tells children of one pool apart) and the pool's name is cut short if needed.
pub fn child_name(pool: &str, first: &IpNet) -> String {
    let suffix: String = first
        .to_string()
        .chars()
        .map(|c| match c {
            '.' | ':' | '/' => '-',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    // The longest suffix (an IPv6 CIDR) is 43 characters, far below the limit.
    let room = MAX_DNS_SUBDOMAIN_LENGTH.saturating_sub(suffix.len() + 1);
    let mut prefix: String = pool.chars().take(room).collect();
    // A cut can end the prefix on `.` or `-`; `.-` would start a DNS label with `-`.
    while prefix.ends_with(['.', '-']) {
        prefix.pop();
    }
    if prefix.is_empty() {
        // Only for an empty (invalid) pool name: the suffix can start with `-` (`::/0`).
        return format!("pool-{suffix}");
    }
    format!("{prefix}-{suffix}")
}

/// Whether `config` is a child of `pool`: the pool is its controller owner (by uid) and the
/// config carries [`POOL_LABEL`] with the pool's name. A pool without a uid (not yet stored)
/// has no children.
pub fn is_child_of(config: &NodeIPAMConfig, pool: &NodeIPAMPool) -> bool {
    let Some(uid) = pool.metadata.uid.as_deref() else {
        return false;
    };
    let labelled = config.labels().get(POOL_LABEL).map(String::as_str) == Some(&*pool.name_any());
    labelled
        && config.owner_references().iter().any(|r| {
            r.controller == Some(true)
                && r.uid == uid
                && r.kind == NodeIPAMPool::kind(&())
                && r.api_version == NodeIPAMPool::api_version(&())
        })
}

/// The pool name a config's [`POOL_LABEL`] claims, if any (claimed, not proven: see
/// [`is_child_of`]).
pub fn pool_label(labels: &BTreeMap<String, String>) -> Option<&str> {
    labels.get(POOL_LABEL).map(String::as_str)
}

#[cfg(test)]
mod tests;
