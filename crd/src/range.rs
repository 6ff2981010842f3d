//! One vocabulary for a family's range, shared by the webhook, the controller and validation:
//! the address [`Family`], a range carved into per-node blocks ([`FamilyRange`]), the pair of a
//! config ([`Ranges`]), CIDR parsing, overlap, block counts and the 2^32-blocks limit.
//!
//! These rules used to be written three times (validation, the webhook's overlap checks, the
//! controller's allocator and pod network), so the admission decision and the allocator could
//! drift apart on what overlaps or how many blocks a range has. Everything here is pure and
//! depends only on [`crate::limits`], never on the API types, so `schema` and `validation` can
//! both use it without depending on each other.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use thiserror::Error;

use crate::limits::{MAX_BLOCK_BITS, MAX_CIDR_LENGTH, MAX_PER_NODE_MASK_V4, MAX_PER_NODE_MASK_V6};

/// An IP address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// Both families, IPv4 first.
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The spec field holding this family's range: `ipv4` or `ipv6`.
    pub fn field(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }

    /// Address width in bits.
    pub fn bits(self) -> u8 {
        match self {
            Self::V4 => 32,
            Self::V6 => 128,
        }
    }

    /// Longest allowed `perNodeMaskSize`: a block must leave room for more than one pod address.
    pub fn max_per_node_mask_size(self) -> u8 {
        match self {
            Self::V4 => MAX_PER_NODE_MASK_V4,
            Self::V6 => MAX_PER_NODE_MASK_V6,
        }
    }

    /// The family of an address.
    pub fn of(addr: &IpAddr) -> Self {
        match addr {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// The family of a CIDR.
    pub fn of_net(net: &IpNet) -> Self {
        match net {
            IpNet::V4(_) => Self::V4,
            IpNet::V6(_) => Self::V6,
        }
    }

    /// A range of this family to show in messages.
    pub fn example(self) -> &'static str {
        match self {
            Self::V4 => "10.64.0.0/14",
            Self::V6 => "fd00:10:64::/56",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        })
    }
}

/// Why a string is not a CIDR.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CidrError {
    #[error("no '/' before the prefix length")]
    NoPrefixLength,
    #[error("{0:?} is not an IP address")]
    BadAddress(String),
    #[error("IPv4-mapped IPv6 addresses are not allowed")]
    Ipv4MappedIpv6,
    #[error("bad prefix length {0:?}")]
    BadPrefixLength(String),
    #[error("prefix length {prefix} out of range for {family} (at most {})", family.bits())]
    PrefixOutOfRange { prefix: u8, family: Family },
}

/// Parses a CIDR exactly as the Kubernetes CEL `cidr()` function does (Go `netip.ParsePrefix`
/// without IPv4-mapped IPv6): no leading zeros in IPv4 octets or in the prefix length, no zone.
/// Host bits may be set; canonical form is a separate check.
pub fn parse_cidr(s: &str) -> Result<IpNet, CidrError> {
    let (addr, bits) = s.rsplit_once('/').ok_or(CidrError::NoPrefixLength)?;
    let addr = IpAddr::from_str(addr).map_err(|_| CidrError::BadAddress(addr.to_owned()))?;
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(CidrError::Ipv4MappedIpv6);
    }
    // Go rejects a sign and leading zeros, which `u8::from_str` would accept.
    let well_formed = !bits.is_empty()
        && bits.bytes().all(|b| b.is_ascii_digit())
        && (bits.len() == 1 || !bits.starts_with('0'));
    let prefix = bits
        .parse::<u8>()
        .ok()
        .filter(|_| well_formed)
        .ok_or_else(|| CidrError::BadPrefixLength(bits.to_owned()))?;
    IpNet::new(addr, prefix).map_err(|_| CidrError::PrefixOutOfRange {
        prefix,
        family: Family::of(&addr),
    })
}

/// Why a family's `{cidr, perNodeMaskSize}` is not a usable range, in the order
/// [`FamilyRange::parse`] finds them (the CIDR first, then the mask).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RangeError {
    #[error("the CIDR is empty")]
    MissingCidr,
    #[error("the CIDR is longer than {max} bytes", max = MAX_CIDR_LENGTH)]
    CidrTooLong,
    #[error("not a CIDR: {0}")]
    Malformed(CidrError),
    #[error("an {actual} CIDR where an {expected} one belongs")]
    WrongFamily { expected: Family, actual: Family },
    #[error("host bits set: did you mean {canonical}?")]
    NotCanonical { canonical: IpNet },
    #[error("per-node mask /{mask} is longer than /{max}, the longest for {family}")]
    MaskTooLong { mask: u8, max: u8, family: Family },
    #[error(transparent)]
    Split(#[from] SplitError),
}

/// Why a range cannot be carved into blocks of a given prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum SplitError {
    #[error("per-node mask /{mask} is longer than the address family allows")]
    MaskBeyondFamily { mask: u8 },
    #[error("per-node mask /{mask} is shorter than the range's own prefix /{prefix}")]
    MaskShorterThanPrefix { mask: u8, prefix: u8 },
    #[error(
        "per-node mask /{mask} carves a /{prefix} into 2^{block_bits} blocks, more than 2^{max}",
        max = MAX_BLOCK_BITS
    )]
    TooManyBlocks {
        mask: u8,
        prefix: u8,
        block_bits: u8,
    },
}

/// log2 of the number of `/mask` blocks in a `/prefix` range, if that is at most
/// [`MAX_BLOCK_BITS`]: the 2^32-blocks limit, in one place.
pub fn block_bits(prefix: u8, mask: u8) -> Result<u8, SplitError> {
    let bits = mask
        .checked_sub(prefix)
        .ok_or(SplitError::MaskShorterThanPrefix { mask, prefix })?;
    if bits > MAX_BLOCK_BITS {
        return Err(SplitError::TooManyBlocks {
            mask,
            prefix,
            block_bits: bits,
        });
    }
    Ok(bits)
}

/// One family's range: a CIDR and the prefix length of each node's block.
///
/// From [`FamilyRange::parse`] or [`FamilyRange::new`] the CIDR is canonical and the range
/// splits into 1 to 2^32 blocks. [`FamilyRange::claimed`] keeps a spec's CIDR as written
/// instead, for a config that failed validation but still names addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FamilyRange {
    pub cidr: IpNet,
    pub per_node_mask_size: u8,
}

impl FamilyRange {
    /// A range carved into `/per_node_mask_size` blocks, host bits of `cidr` cleared. Checks
    /// only what carving needs (the mask fits the family and the range, at most 2^32 blocks),
    /// not the per-family pod limits of [`FamilyRange::parse`].
    pub fn new(cidr: IpNet, per_node_mask_size: u8) -> Result<Self, SplitError> {
        let mask = per_node_mask_size;
        if mask > cidr.max_prefix_len() {
            return Err(SplitError::MaskBeyondFamily { mask });
        }
        block_bits(cidr.prefix_len(), mask)?;
        Ok(Self {
            cidr: cidr.trunc(),
            per_node_mask_size: mask,
        })
    }

    /// Parses and checks one family's `cidr` and `perNodeMaskSize` as the CRD's CEL rules do,
    /// returning every problem in field order (the CIDR, then the mask). After a CIDR that does
    /// not parse as `family`, the mask is only checked against the family's limit.
    pub fn parse(
        cidr: &str,
        per_node_mask_size: u8,
        family: Family,
    ) -> Result<Self, Vec<RangeError>> {
        let mask = per_node_mask_size;
        let mut errors = Vec::new();
        let net = parse_family_cidr(cidr, family);
        let net = match net {
            Ok(net) => {
                if net.addr() != net.network() {
                    errors.push(RangeError::NotCanonical {
                        canonical: net.trunc(),
                    });
                }
                Some(net)
            }
            Err(e) => {
                errors.push(e);
                None
            }
        };
        let max = family.max_per_node_mask_size();
        if mask > max {
            errors.push(RangeError::MaskTooLong { mask, max, family });
        }
        if let Some(net) = net
            && let Err(e) = block_bits(net.prefix_len(), mask)
        {
            errors.push(e.into());
        }
        match net {
            Some(net) if errors.is_empty() => Ok(Self {
                cidr: net.trunc(),
                per_node_mask_size: mask,
            }),
            _ => Err(errors),
        }
    }

    /// The range a spec names even when it fails validation: its CIDR as written (host bits
    /// kept) if it parses at all, with its mask. A config that bypassed or predates the CRD's
    /// rules still names addresses nodes may hold, so the controller keeps publishing and
    /// protecting them and the webhook still refuses overlaps with them.
    pub fn claimed(cidr: &str, per_node_mask_size: u8) -> Option<Self> {
        let cidr = claimed_cidr(cidr)?;
        Some(Self {
            cidr,
            per_node_mask_size,
        })
    }

    /// The family of the range.
    pub fn family(&self) -> Family {
        Family::of_net(&self.cidr)
    }

    /// log2 of the number of blocks; 0 when the mask is shorter than the prefix (only possible
    /// for a [`claimed`](FamilyRange::claimed) range), as nothing can be split then.
    pub fn block_bits(&self) -> u8 {
        self.per_node_mask_size
            .saturating_sub(self.cidr.prefix_len())
    }

    /// Number of blocks in the range: 1 to 2^32 for a checked range. `None` only for a
    /// [`claimed`](FamilyRange::claimed) range of 2^64 blocks or more.
    pub fn blocks(&self) -> Option<u64> {
        1u64.checked_shl(u32::from(self.block_bits()))
    }

    /// Number of blocks in the range (at most 2^32 once validated; `u64::MAX` for a claimed
    /// range too large to count).
    pub fn block_count(&self) -> u64 {
        self.blocks().unwrap_or(u64::MAX)
    }

    /// How many of this range's blocks the `held` CIDRs touch, each block counted once.
    pub fn blocks_covered(&self, held: &[IpNet]) -> u64 {
        blocks_covered(self.cidr, self.per_node_mask_size, held)
    }
}

/// The CIDR a spec names even when it fails validation: as written (host bits kept), if it
/// parses at all. `IpNet`'s own parser, more lenient than [`parse_cidr`], on purpose: what it
/// accepted before validation existed for an object is what the cluster may hold, so the
/// controller keeps protecting it and the webhook still refuses overlaps with it.
pub fn claimed_cidr(cidr: &str) -> Option<IpNet> {
    cidr.parse::<IpNet>().ok()
}

/// Parses one CIDR of `family` as the CRD's CEL rules check it: not empty, at most
/// [`MAX_CIDR_LENGTH`] bytes, of that family, canonical (host bits zero). For the CIDR lists of
/// a `NodeIPAMPool`, which have no per-node mask of their own.
pub fn parse_canonical(cidr: &str, family: Family) -> Result<IpNet, RangeError> {
    let net = parse_family_cidr(cidr, family)?;
    if net.addr() != net.network() {
        return Err(RangeError::NotCanonical {
            canonical: net.trunc(),
        });
    }
    Ok(net)
}

/// Parses `cidr` and checks its length and family; host bits are checked by the caller.
fn parse_family_cidr(cidr: &str, family: Family) -> Result<IpNet, RangeError> {
    if cidr.is_empty() {
        return Err(RangeError::MissingCidr);
    }
    if cidr.len() > MAX_CIDR_LENGTH {
        return Err(RangeError::CidrTooLong);
    }
    let net = parse_cidr(cidr).map_err(RangeError::Malformed)?;
    let actual = Family::of_net(&net);
    if actual != family {
        return Err(RangeError::WrongFamily {
            expected: family,
            actual,
        });
    }
    Ok(net)
}

/// The ranges of one `NodeIPAMConfig`, at most one per family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ranges {
    pub ipv4: Option<FamilyRange>,
    pub ipv6: Option<FamilyRange>,
}

impl Ranges {
    /// The range of one family, if the config declares it.
    pub fn get(&self, family: Family) -> Option<&FamilyRange> {
        match family {
            Family::V4 => self.ipv4.as_ref(),
            Family::V6 => self.ipv6.as_ref(),
        }
    }

    /// The declared ranges, IPv4 first.
    pub fn iter(&self) -> impl Iterator<Item = (Family, &FamilyRange)> {
        Family::ALL
            .into_iter()
            .filter_map(|family| self.get(family).map(|range| (family, range)))
    }

    /// Whether the config declares both families.
    pub fn is_dual_stack(&self) -> bool {
        self.ipv4.is_some() && self.ipv6.is_some()
    }
}

/// Whether two ranges share any address. Ranges of different families never overlap.
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    // Two prefixes overlap exactly when one contains the other's network address; `contains`
    // is false across families.
    a.contains(&b.network()) || b.contains(&a.network())
}

/// How two overlapping ranges relate: CIDR ranges either nest or are disjoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nesting {
    /// The same addresses.
    Same,
    /// The first contains the second.
    Contains,
    /// The first is inside the second.
    Inside,
}

/// How `a` overlaps `b`, if it does ([`overlaps`] is `nesting(..).is_some()`). Host bits are
/// ignored.
pub fn nesting(a: &IpNet, b: &IpNet) -> Option<Nesting> {
    let (a, b) = (a.trunc(), b.trunc());
    if a == b {
        Some(Nesting::Same)
    } else if a.contains(&b) {
        Some(Nesting::Contains)
    } else if b.contains(&a) {
        Some(Nesting::Inside)
    } else {
        None
    }
}

/// `10.0.0.0/8 contains 10.64.0.0/14`: how `a` relates to `b`, for messages.
pub fn describe(a: &IpNet, b: &IpNet, how: Nesting) -> String {
    match how {
        Nesting::Same => format!("{a} is the same range"),
        Nesting::Contains => format!("{a} contains {b}"),
        Nesting::Inside => format!("{a} is inside {b}"),
    }
}

/// The first and last address of `net` as integers (IPv4 in the low 32 bits). Only compare
/// bounds of one family.
pub fn bounds(net: &IpNet) -> (u128, u128) {
    match net {
        IpNet::V4(n) => (
            u32::from(n.network()).into(),
            u32::from(n.broadcast()).into(),
        ),
        IpNet::V6(n) => (n.network().into(), n.broadcast().into()),
    }
}

/// Whether the union of `cidrs` covers every address of `range`. CIDRs of the other family
/// cover nothing.
pub fn covered(range: &IpNet, cidrs: &[IpNet]) -> bool {
    let mut spans: Vec<(u128, u128)> = cidrs
        .iter()
        .filter(|c| Family::of_net(c) == Family::of_net(range))
        .map(bounds)
        .collect();
    spans.sort_unstable();
    let (start, end) = bounds(range);
    // The first address not yet covered, walking the spans in order.
    let mut next = start;
    for (a, b) in spans {
        if a > next {
            break;
        }
        if b >= end {
            return true;
        }
        next = next.max(b + 1);
    }
    false
}

/// How many `/mask` blocks of `range` the `held` CIDRs touch, each block counted once. CIDRs of
/// the other family touch none.
pub fn blocks_covered(range: IpNet, mask: u8, held: &[IpNet]) -> u64 {
    let host_bits = u32::from(range.max_prefix_len().saturating_sub(mask));
    let (start, end) = bounds(&range);
    let mut spans: Vec<(u128, u128)> = held
        .iter()
        .filter(|c| Family::of_net(c) == Family::of_net(&range))
        .map(bounds)
        .map(|(a, b)| (a.max(start), b.min(end)))
        .filter(|(a, b)| a <= b)
        // A /0 block of a /0 range has 128 host bits: the shift must not overflow.
        .map(|(a, b)| {
            (
                (a - start).checked_shr(host_bits).unwrap_or(0),
                (b - start).checked_shr(host_bits).unwrap_or(0),
            )
        })
        .collect();
    spans.sort_unstable();
    let mut count: u128 = 0;
    let mut last: Option<u128> = None;
    for (a, b) in spans {
        let a = match last {
            Some(l) if a <= l => l + 1,
            _ => a,
        };
        if a <= b {
            count += b - a + 1;
            last = Some(b);
        }
    }
    u64::try_from(count).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
