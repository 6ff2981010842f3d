//! The `NodeIPAMConfig` API (group `nodeipam.io`, version `v1alpha1`): spec, status, condition
//! vocabulary and the finalizer name. Doc comments here become the CRD `description`s.

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schema;

/// Finalizer the controller puts on every `NodeIPAMConfig` so that a deleted config stays
/// visible (with `Drained=False`) until no node holds a block from it.
pub const FINALIZER: &str = "nodeipam.io/finalizer";

/// Condition type: the config is valid and accepting allocations.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: some family of the config has no free block left.
pub const CONDITION_EXHAUSTED: &str = "Exhausted";
/// Condition type: the config accepts no new allocations and no node holds a block from it.
pub const CONDITION_DRAINED: &str = "Drained";

/// `Ready=True`: valid and handing out blocks.
pub const REASON_ACCEPTING: &str = "Accepting";
/// `Ready=False` / `Drained`: `spec.allocation` is `Disabled`.
pub const REASON_DISABLED: &str = "Disabled";
/// `Ready=False` / `Drained`: the config is being deleted.
pub const REASON_TERMINATING: &str = "Terminating";
/// `Ready=False`: a range overlaps a range of another `NodeIPAMConfig`.
pub const REASON_OVERLAP: &str = "Overlap";
/// `Ready=False`: the spec failed validation (e.g. CEL was bypassed or rules changed).
pub const REASON_INVALID: &str = "Invalid";
/// `Drained=False`: the config still accepts allocations.
pub const REASON_ACTIVE: &str = "Active";
/// `Drained=False`: allocation stopped but some nodes still hold blocks from the config.
pub const REASON_NODES_REMAINING: &str = "NodesRemaining";
/// `Drained=True`: allocation stopped and no node holds a block from the config.
pub const REASON_NO_NODES: &str = "NoNodes";
/// `Exhausted=False`: every family has at least one free block.
pub const REASON_BLOCKS_FREE: &str = "BlocksFree";
/// `Exhausted=True`: some family has no free block.
pub const REASON_EXHAUSTED: &str = "Exhausted";

/// NodeIPAMConfig declares pod CIDR ranges that the nodeipam controller hands out to Nodes,
/// one block of `perNodeMaskSize` per family per node.
///
/// Ranges are immutable: to change a range, create a new NodeIPAMConfig and delete (or
/// disable) the old one; nodes keep their blocks until they are deleted, so the old range
/// drains. Consumers (kube-proxy, ip-masq-agent, CNIs) keep a range in the pod network until
/// its `Drained` condition is `True`. The pod network is the union of the CIDRs of every
/// NodeIPAMConfig whose `Drained` condition is not `True`, plus the unmanaged podCIDRs that
/// nodes already hold.
// clippy reads the repeated `type_`/`priority` keys of separate printcolumns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "nodeipam.io",
    version = "v1alpha1",
    kind = "NodeIPAMConfig",
    shortname = "nipc",
    category = "nodeipam",
    status = "NodeIPAMConfigStatus",
    derive = "PartialEq",
    doc = "NodeIPAMConfig declares pod CIDR ranges that the nodeipam controller hands out to Nodes.",
    printcolumn(
        name = "IPv4",
        type_ = "string",
        json_path = ".spec.ipv4.cidr",
        description = "IPv4 range handed out in blocks"
    ),
    printcolumn(
        name = "IPv6",
        type_ = "string",
        json_path = ".spec.ipv6.cidr",
        description = "IPv6 range handed out in blocks"
    ),
    printcolumn(
        name = "Nodes",
        type_ = "integer",
        json_path = ".status.nodes",
        description = "Nodes holding a block from this config"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Valid and accepting allocations"
    ),
    printcolumn(
        name = "Drained",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Drained\")].status",
        description = "Accepting no allocations and no node holds a block: safe to drop from the pod network"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "IPv4-Mask",
        type_ = "integer",
        json_path = ".spec.ipv4.perNodeMaskSize",
        priority = 1,
        description = "Prefix length of each IPv4 block"
    ),
    printcolumn(
        name = "IPv6-Mask",
        type_ = "integer",
        json_path = ".spec.ipv6.perNodeMaskSize",
        priority = 1,
        description = "Prefix length of each IPv6 block"
    ),
    printcolumn(
        name = "IPv4-Allocated",
        type_ = "integer",
        json_path = ".status.ipv4.allocated",
        priority = 1,
        description = "IPv4 blocks held by nodes"
    ),
    printcolumn(
        name = "IPv4-Capacity",
        type_ = "integer",
        json_path = ".status.ipv4.capacity",
        priority = 1,
        description = "IPv4 blocks in the range"
    ),
    printcolumn(
        name = "IPv6-Allocated",
        type_ = "integer",
        json_path = ".status.ipv6.allocated",
        priority = 1,
        description = "IPv6 blocks held by nodes"
    ),
    printcolumn(
        name = "IPv6-Capacity",
        type_ = "integer",
        json_path = ".status.ipv6.capacity",
        priority = 1,
        description = "IPv6 blocks in the range"
    ),
    printcolumn(
        name = "Allocation",
        type_ = "string",
        json_path = ".spec.allocation",
        priority = 1,
        description = "Enabled or Disabled"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::spec_rules, transform = schema::unwrap_descriptions)]
pub struct NodeIPAMConfigSpec {
    /// IPv4 range to hand out. Immutable, and cannot be added or removed after creation:
    /// create a new NodeIPAMConfig and delete this one to drain it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::ipv4_rules)]
    pub ipv4: Option<FamilySpec>,

    /// IPv6 range to hand out. Immutable, and cannot be added or removed after creation:
    /// create a new NodeIPAMConfig and delete this one to drain it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::ipv6_rules)]
    pub ipv6: Option<FamilySpec>,

    /// Nodes this config serves; when absent it serves every node. Same rules as a Pod's
    /// required node affinity. Immutable: create a new NodeIPAMConfig and delete this one to
    /// drain it.
    ///
    /// A node that several configs match gets its blocks from the first that can allocate, in
    /// this order: more matching requirements (a config without a selector comes after every
    /// selector match); fewer free blocks; larger `perNodeMaskSize` (smaller blocks); lexically
    /// smaller selector; numerically lower CIDR; name. Configs that are `Disabled`, being
    /// deleted, exhausted, overlapping an older config, or invalid are skipped. A config that
    /// matches more requirements than every open one but is not open yet (our finalizer, or its
    /// range not yet in the published pod network) makes the node wait for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = schema::node_selector_rules)]
    pub node_selector: Option<NodeSelector>,

    /// `Enabled` (default) hands out blocks to new nodes. `Disabled` stops handing out blocks
    /// without touching nodes that already hold one: the config then drains as those nodes
    /// are deleted. The only mutable field of the spec.
    #[serde(default)]
    pub allocation: Allocation,
}

/// Whether a NodeIPAMConfig hands out blocks to new nodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Allocation {
    /// Hand out blocks to new nodes.
    #[default]
    Enabled,
    /// Hand out no new blocks; nodes keep the blocks they hold.
    Disabled,
}

/// One address family's range and the size of each node's block.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FamilySpec {
    /// The range in canonical CIDR notation (host bits zero), e.g. `10.64.0.0/14` or
    /// `fd00:10:64::/56`. Must not overlap the range of the same family of another
    /// NodeIPAMConfig.
    #[schemars(length(min = 1, max = 64))]
    pub cidr: String,

    /// Prefix length of the block each node receives, e.g. 24 for a /24 per node. At least
    /// the prefix length of `cidr`, at most 30 (IPv4) or 126 (IPv6), and at most 32 more than
    /// the prefix length of `cidr` (at most 2^32 blocks per range).
    // Kubernetes knows int32/int64, not uint8; the range keeps the unsigned bounds.
    #[schemars(range(max = 128), extend("format" = "int32"))]
    pub per_node_mask_size: u8,
}

/// Observed state of a NodeIPAMConfig, written by the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = schema::unwrap_descriptions)]
pub struct NodeIPAMConfigStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Usage of the IPv4 range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilyStatus>,

    /// Usage of the IPv6 range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilyStatus>,

    /// Number of nodes holding (or being given) a block of this config. A block belongs to the
    /// oldest config whose range contains it: one inside an older, overlapping config's range
    /// is that config's and counts there only, here and in `allocated` alike.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub nodes: Option<u64>,

    /// Conditions, keyed by type.
    ///
    /// `Ready`: `True` when the config is valid and accepting allocations; `False` with reason
    /// `Disabled`, `Terminating`, `Overlap` or `Invalid` otherwise, or `Pending` while a
    /// gate is not yet in place: the config's finalizer, or a consumer output (the pod-network
    /// ConfigMap, ip-masq-agent's, a typed output) that does not hold its ranges yet (the
    /// message names which).
    ///
    /// `Exhausted`: `True` when some family has no free block (reason `Exhausted`), otherwise
    /// `False` (reason `BlocksFree`).
    ///
    /// `Drained`: `True` (reason `NoNodes`) exactly when the config accepts no new allocations
    /// (it is being deleted or `allocation` is `Disabled`) and no node holds, is being given or
    /// may still receive a block from it (a podCIDR write whose outcome is unknown counts until
    /// it can no longer land); otherwise `False` with reason `Active` (still allocating) or
    /// `NodesRemaining` (the message gives the count and a few node names). Consumers (kube-proxy, ip-masq-agent,
    /// CNIs) keep the ranges in the pod network until `Drained` is `True`.
    #[serde(default)]
    #[schemars(transform = schema::conditions_list_map)]
    pub conditions: Vec<Condition>,
}

/// Usage of one family's range, counted in blocks of `perNodeMaskSize`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FamilyStatus {
    /// Blocks in the range: 2^(perNodeMaskSize - prefix length).
    #[schemars(extend("format" = "int64"))]
    pub capacity: u64,
    /// Blocks of this config held by nodes (or kept for a podCIDR write whose outcome is
    /// unknown), by the same rule as `nodes`: a block inside an older, overlapping config's
    /// range is that config's.
    #[schemars(extend("format" = "int64"))]
    pub allocated: u64,
}
