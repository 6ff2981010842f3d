//! Every numeric limit of a `NodeIPAMConfig`, in one leaf module.
//!
//! The CEL rules ([`crate::schema`]), the Rust validation ([`crate::validation`]), the range
//! vocabulary ([`crate::range`]) and the controller's allocator all read these: a limit that
//! lived in one of them made the others import it, which is how `schema` and `validation`
//! came to depend on each other. This module depends on nothing.

/// Longest accepted `cidr` string (the longest IPv6 CIDR text is 49 bytes).
pub const MAX_CIDR_LENGTH: usize = 64;

/// At most this many more bits in `perNodeMaskSize` than in the range's prefix: a range holds
/// at most 2^32 blocks. The allocator's bitmap is sized by it, and the CRD refuses more.
pub const MAX_BLOCK_BITS: u8 = 32;

/// Longest IPv4 `perNodeMaskSize`: a /31 or /32 block leaves no room for more than one pod.
pub const MAX_PER_NODE_MASK_V4: u8 = 30;

/// Longest IPv6 `perNodeMaskSize`, for the same reason as [`MAX_PER_NODE_MASK_V4`].
pub const MAX_PER_NODE_MASK_V6: u8 = 126;

/// Most `nodeSelectorTerms` in a node selector.
pub const MAX_NODE_SELECTOR_TERMS: usize = 8;

/// Most `matchExpressions` (and, separately, `matchFields`) in one node selector term.
pub const MAX_REQUIREMENTS_PER_TERM: usize = 16;

/// Most `values` in one node selector requirement.
pub const MAX_SELECTOR_VALUES: usize = 64;

/// Longest label key: a 253-byte DNS subdomain prefix, '/', and a 63-byte name.
pub const MAX_LABEL_KEY_LENGTH: usize = 317;

/// Longest label value (and label name).
pub const MAX_LABEL_VALUE_LENGTH: usize = 63;

/// Longest DNS subdomain (a label key's prefix, a node name).
pub const MAX_DNS_SUBDOMAIN_LENGTH: usize = 253;

/// Longest node name (a DNS subdomain).
pub const MAX_NODE_NAME_LENGTH: usize = MAX_DNS_SUBDOMAIN_LENGTH;

/// Longest `NodeIPAMPool` name: every child carries it as the value of its `nodeipam.io/pool`
/// label, and a label value is at most [`MAX_LABEL_VALUE_LENGTH`] characters.
pub const MAX_POOL_NAME_LENGTH: usize = MAX_LABEL_VALUE_LENGTH;

/// Most CIDRs in one family of a `NodeIPAMPool`.
pub const MAX_POOL_CIDRS: usize = 16;

/// At most this many more bits in a pool's `perNodeMaskSize` than in its `rangeMaskSize`: a
/// child carved from a pool holds at most 2^16 blocks. Below [`MAX_BLOCK_BITS`], so every
/// child is a valid `NodeIPAMConfig`; small, so a child fills and empties in reasonable time.
pub const MAX_POOL_BLOCK_BITS: u8 = 16;

/// Most children (`ranges.max`) a `NodeIPAMPool` may carve.
pub const MAX_POOL_RANGES: u32 = 256;

/// Largest `headroom.blocks`: the most blocks a pool can ever hold ([`MAX_POOL_RANGES`]
/// children of 2^[`MAX_POOL_BLOCK_BITS`] blocks). Also keeps the field an int32.
pub const MAX_POOL_HEADROOM_BLOCKS: u32 = MAX_POOL_RANGES << MAX_POOL_BLOCK_BITS;

/// Longest `scaleDown.emptyFor` string (bounds the CEL cost of parsing it).
pub const MAX_DURATION_LENGTH: usize = 32;
