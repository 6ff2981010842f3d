//! Pure validation of `NodeIPAMPool` specs, the Rust twin of the pool CRD's CEL rules, shared
//! by the controller and the webhook: [`NodeIPAMPoolSpec::parse`] for a whole spec and
//! [`validate_pool_update`] for the transition rules.

use std::time::Duration;

use ipnet::IpNet;

use super::{FieldError, validate_node_selector};
use crate::duration;
use crate::limits::{
    MAX_CIDR_LENGTH, MAX_DURATION_LENGTH, MAX_POOL_BLOCK_BITS, MAX_POOL_CIDRS,
    MAX_POOL_HEADROOM_BLOCKS, MAX_POOL_NAME_LENGTH, MAX_POOL_RANGES,
};
use crate::pool::{NodeIPAMPoolSpec, PoolFamilySpec};
use crate::range::{Family, FamilyRange, RangeError, overlaps, parse_canonical};

/// One family of a valid pool: its canonical, disjoint CIDRs (in spec order) and masks, with
/// `range_mask_size` < `per_node_mask_size` <= the family's limit, at most
/// [`MAX_POOL_BLOCK_BITS`] apart, and every CIDR's prefix at most `range_mask_size`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolFamily {
    pub family: Family,
    pub cidrs: Vec<IpNet>,
    pub range_mask_size: u8,
    pub per_node_mask_size: u8,
}

impl PoolFamily {
    /// log2 of the blocks in one child's range (1 to [`MAX_POOL_BLOCK_BITS`]).
    pub fn block_bits(&self) -> u8 {
        self.per_node_mask_size.saturating_sub(self.range_mask_size)
    }

    /// Blocks in one child's range of this family.
    pub fn blocks_per_range(&self) -> u64 {
        1u64 << self.block_bits()
    }

    /// How many child ranges `cidr` splits into (`u64::MAX` when there are 2^64 or more).
    pub fn ranges_in(&self, cidr: &IpNet) -> u64 {
        let bits = self.range_mask_size.saturating_sub(cidr.prefix_len());
        1u64.checked_shl(u32::from(bits)).unwrap_or(u64::MAX)
    }

    /// How many child ranges the whole budget of this family splits into, saturating.
    pub fn budget_ranges(&self) -> u64 {
        self.cidrs
            .iter()
            .fold(0u64, |sum, c| sum.saturating_add(self.ranges_in(c)))
    }

    /// Whether `net` lies entirely inside one of the pool's CIDRs (a pool's CIDRs are
    /// disjoint, so a child range never spans two).
    pub fn contains(&self, net: &IpNet) -> bool {
        self.cidrs.iter().any(|c| c.contains(net))
    }

    /// Whether `net` shares any address with the pool's CIDRs.
    pub fn overlaps(&self, net: &IpNet) -> bool {
        self.cidrs.iter().any(|c| overlaps(c, net))
    }

    /// The child range at `cidr` as a config's range: `cidr` must have `range_mask_size`
    /// and lie inside the pool. `None` otherwise.
    pub fn child_range(&self, cidr: IpNet) -> Option<FamilyRange> {
        (cidr.prefix_len() == self.range_mask_size && self.contains(&cidr))
            .then(|| FamilyRange::new(cidr, self.per_node_mask_size).ok())
            .flatten()
    }
}

/// A valid `NodeIPAMPoolSpec`, parsed: at least one family; with two, both carve the same
/// number of blocks per range (lockstep: a child has one range per family, and they fill
/// together, one block of each per node).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParsedPool {
    pub ipv4: Option<PoolFamily>,
    pub ipv6: Option<PoolFamily>,
    /// `ranges.min`: children kept even when empty.
    pub min_ranges: u32,
    /// `ranges.max`: most children (1 to [`MAX_POOL_RANGES`]), at least `min_ranges`.
    pub max_ranges: u32,
    /// `headroom.blocks`.
    pub headroom_blocks: u32,
    /// `scaleDown.emptyFor`.
    pub empty_for: Duration,
}

impl ParsedPool {
    /// The pool's budget of one family, if it has one.
    pub fn get(&self, family: Family) -> Option<&PoolFamily> {
        match family {
            Family::V4 => self.ipv4.as_ref(),
            Family::V6 => self.ipv6.as_ref(),
        }
    }

    /// The pool's families, IPv4 first.
    pub fn iter(&self) -> impl Iterator<Item = &PoolFamily> {
        self.ipv4.iter().chain(self.ipv6.iter())
    }

    /// The family a child's name is taken from ([`crate::pool::child_name`]): IPv4 when the
    /// pool has it, else IPv6.
    pub fn naming_family(&self) -> Family {
        if self.ipv4.is_some() {
            Family::V4
        } else {
            Family::V6
        }
    }

    /// Blocks in one child (per family; the families agree).
    pub fn blocks_per_range(&self) -> u64 {
        self.iter()
            .map(PoolFamily::blocks_per_range)
            .min()
            .unwrap_or(0)
    }

    /// How many children the budget allows: the family with the fewest ranges bounds it
    /// (every child has a range of each family), and so does `ranges.max`.
    pub fn budget_ranges(&self) -> u64 {
        self.iter()
            .map(PoolFamily::budget_ranges)
            .min()
            .unwrap_or(0)
            .min(u64::from(self.max_ranges))
    }

    /// Blocks (per family) the whole budget could hold: `budget_ranges` children.
    pub fn budget_blocks(&self) -> u64 {
        self.budget_ranges().saturating_mul(self.blocks_per_range())
    }
}

/// Why a pool may not be called `name`, if it may not: each child carries the name as its
/// `nodeipam.io/pool` label value, so a longer name is admitted by the API server (object names
/// go to 253 characters) but every carve of it is refused. The webhook refuses it at CREATE
/// and the controller reports a stored one `Invalid` rather than carving. Not a CEL rule: a
/// rule on `self.metadata.name` runs on every update too, and would refuse the status write
/// that tells the owner of a pool stored before the rule why it serves nothing.
pub fn validate_pool_name(name: &str) -> Option<FieldError> {
    (name.len() > MAX_POOL_NAME_LENGTH).then(|| {
        FieldError::invalid(
            "metadata.name",
            name,
            format!(
                "{} characters: a NodeIPAMPool's name may have at most {MAX_POOL_NAME_LENGTH}, as it is the value of its children's nodeipam.io/pool label",
                name.len()
            ),
        )
    })
}

const POOL_HINT: &str = "create a new NodeIPAMPool beside this one and delete this one: its children drain like deleted NodeIPAMConfigs";

impl NodeIPAMPoolSpec {
    /// The parsed pool, or every error in the spec (node selector included), each naming its
    /// field path, in field order.
    pub fn parse(&self) -> Result<ParsedPool, Vec<FieldError>> {
        let mut errors = Vec::new();
        if self.ipv4.is_none() && self.ipv6.is_none() {
            errors.push(FieldError::required(
                "spec",
                format!(
                    "at least one of spec.ipv4 or spec.ipv6 is required, e.g. ipv4: {{cidrs: [{}], rangeMaskSize: 18, perNodeMaskSize: 24}}",
                    Family::V4.example()
                ),
            ));
        }
        let ipv4 = self
            .ipv4
            .as_ref()
            .and_then(|f| parse_pool_family(f, Family::V4, &mut errors));
        let ipv6 = self
            .ipv6
            .as_ref()
            .and_then(|f| parse_pool_family(f, Family::V6, &mut errors));
        if let (Some(v4), Some(v6)) = (&self.ipv4, &self.ipv6) {
            let bits4 = i16::from(v4.per_node_mask_size) - i16::from(v4.range_mask_size);
            let bits6 = i16::from(v6.per_node_mask_size) - i16::from(v6.range_mask_size);
            if bits4 != bits6 {
                errors.push(FieldError::invalid(
                    "spec.ipv6.perNodeMaskSize",
                    v6.per_node_mask_size,
                    format!(
                        "must be spec.ipv6.rangeMaskSize plus {bits4} ({}), as IPv4 carves {bits4} bits (spec.ipv4.perNodeMaskSize - spec.ipv4.rangeMaskSize): both families of a pool must give the same number of blocks per range",
                        i16::from(v6.range_mask_size) + bits4
                    ),
                ));
            }
        }
        if let Some(selector) = &self.node_selector {
            errors.extend(validate_node_selector(selector, "spec.nodeSelector"));
        }
        let ranges = &self.ranges;
        if ranges.max < 1 || ranges.max > MAX_POOL_RANGES {
            errors.push(FieldError::invalid(
                "spec.ranges.max",
                ranges.max,
                format!("must be between 1 and {MAX_POOL_RANGES}"),
            ));
        }
        if ranges.min > ranges.max {
            errors.push(FieldError::invalid(
                "spec.ranges.min",
                ranges.min,
                format!("must be at most spec.ranges.max ({})", ranges.max),
            ));
        }
        let headroom = self.headroom.blocks;
        if headroom > MAX_POOL_HEADROOM_BLOCKS {
            errors.push(FieldError::invalid(
                "spec.headroom.blocks",
                headroom,
                format!(
                    "must be at most {MAX_POOL_HEADROOM_BLOCKS} ({MAX_POOL_RANGES} ranges of 2^{MAX_POOL_BLOCK_BITS} blocks)"
                ),
            ));
        }
        let empty_for = parse_empty_for(&self.scale_down.empty_for, &mut errors);
        match (errors.is_empty(), empty_for) {
            (true, Some(empty_for)) => Ok(ParsedPool {
                ipv4,
                ipv6,
                min_ranges: ranges.min,
                max_ranges: ranges.max,
                headroom_blocks: headroom,
                empty_for,
            }),
            _ => Err(errors),
        }
    }
}

/// Longest Go duration: `time.Duration` is an int64 of nanoseconds.
const MAX_GO_DURATION_NANOS: u128 = i64::MAX as u128;

/// `scaleDown.emptyFor` as Go's `time.ParseDuration` (and so CEL's `duration()`) reads it,
/// but not negative.
fn parse_empty_for(value: &str, errors: &mut Vec<FieldError>) -> Option<Duration> {
    let path = "spec.scaleDown.emptyFor";
    if value.len() > MAX_DURATION_LENGTH {
        errors.push(FieldError::too_long(path, MAX_DURATION_LENGTH));
        return None;
    }
    // Our parser trims spaces; Go's does not.
    let parsed = if value.trim() != value {
        Err("spaces are not allowed".to_owned())
    } else {
        duration::parse(value).map_err(|e| e.to_string())
    };
    match parsed {
        Ok(d) if d.as_nanos() <= MAX_GO_DURATION_NANOS => Some(d),
        Ok(_) => {
            errors.push(FieldError::invalid(
                path,
                value,
                "must be a duration of at most 2562047h",
            ));
            None
        }
        Err(reason) => {
            errors.push(FieldError::invalid(
                path,
                value,
                format!("must be a non-negative duration such as 30m or 1h30m: {reason}"),
            ));
            None
        }
    }
}

/// One family's budget, appending its errors to `errors`.
fn parse_pool_family(
    spec: &PoolFamilySpec,
    family: Family,
    errors: &mut Vec<FieldError>,
) -> Option<PoolFamily> {
    let base = format!("spec.{}", family.field());
    let before = errors.len();
    let example = family.example();
    if spec.cidrs.is_empty() {
        errors.push(FieldError::required(
            format!("{base}.cidrs"),
            format!("must list at least one {family} CIDR such as {example}"),
        ));
    }
    if spec.cidrs.len() > MAX_POOL_CIDRS {
        errors.push(FieldError::too_many(
            format!("{base}.cidrs"),
            spec.cidrs.len(),
            MAX_POOL_CIDRS,
        ));
    }
    let mut cidrs: Vec<(usize, IpNet)> = Vec::new();
    for (i, cidr) in spec.cidrs.iter().enumerate() {
        let path = format!("{base}.cidrs[{i}]");
        match parse_canonical(cidr, family) {
            Ok(net) => {
                if let Some((j, other)) = cidrs.iter().find(|(_, o)| overlaps(o, &net)) {
                    errors.push(FieldError::invalid(
                        path,
                        cidr,
                        format!(
                            "overlaps {base}.cidrs[{j}] ({other}): the CIDRs of a pool must be disjoint"
                        ),
                    ));
                } else {
                    cidrs.push((i, net));
                }
            }
            Err(e) => errors.push(cidr_error(&e, path, cidr, family)),
        }
    }
    let range_mask = spec.range_mask_size;
    let mask = spec.per_node_mask_size;
    let max = family.max_per_node_mask_size();
    let mask_path = format!("{base}.perNodeMaskSize");
    if mask > max {
        errors.push(FieldError::invalid(
            &mask_path,
            mask,
            format!(
                "must be at most {max} for {family}: a block must hold more than one pod address"
            ),
        ));
    }
    if mask <= range_mask {
        errors.push(FieldError::invalid(
            &mask_path,
            mask,
            format!(
                "must be more than {base}.rangeMaskSize ({range_mask}): a range holds at least two blocks"
            ),
        ));
    } else if mask - range_mask > MAX_POOL_BLOCK_BITS {
        errors.push(FieldError::invalid(
            &mask_path,
            mask,
            format!(
                "must be at most {} ({base}.rangeMaskSize plus {MAX_POOL_BLOCK_BITS}): a range of a pool holds at most 2^{MAX_POOL_BLOCK_BITS} blocks",
                u16::from(range_mask) + u16::from(MAX_POOL_BLOCK_BITS)
            ),
        ));
    }
    if let Some((i, widest)) = cidrs.iter().find(|(_, c)| c.prefix_len() > range_mask) {
        errors.push(FieldError::invalid(
            format!("{base}.rangeMaskSize"),
            range_mask,
            format!(
                "must be at least the prefix length of {base}.cidrs[{i}] ({widest}): a range is carved out of one CIDR"
            ),
        ));
    }
    (errors.len() == before).then(|| PoolFamily {
        family,
        cidrs: cidrs.into_iter().map(|(_, c)| c).collect(),
        range_mask_size: range_mask,
        per_node_mask_size: mask,
    })
}

fn cidr_error(e: &RangeError, path: String, cidr: &str, family: Family) -> FieldError {
    let example = family.example();
    match e {
        RangeError::MissingCidr => {
            FieldError::required(path, format!("must be a CIDR such as {example}"))
        }
        RangeError::CidrTooLong => FieldError::too_long(path, MAX_CIDR_LENGTH),
        RangeError::Malformed(reason) => FieldError::invalid(
            path,
            cidr,
            format!("must be a CIDR such as {example}: {reason}"),
        ),
        RangeError::WrongFamily { actual, .. } => FieldError::invalid(
            path,
            cidr,
            format!(
                "must be an {family} CIDR such as {example}; put {actual} CIDRs in spec.{}.cidrs",
                actual.field()
            ),
        ),
        RangeError::NotCanonical { canonical } => FieldError::invalid(
            path,
            cidr,
            format!("must be canonical (host bits zero): did you mean {canonical}?"),
        ),
        // `parse_canonical` checks no mask.
        other => FieldError::invalid(path, cidr, other.to_string()),
    }
}

/// Errors in the transition from `old` to `new`, the Rust twin of the pool CRD's transition
/// rules: families cannot be added or removed, masks and `nodeSelector` are immutable, and
/// CIDRs may only be appended. `ranges`, `headroom` and `scaleDown` may change.
///
/// Like [`super::validate_update`], only transition errors: call
/// [`NodeIPAMPoolSpec::parse`] for the new spec.
pub fn validate_pool_update(old: &NodeIPAMPoolSpec, new: &NodeIPAMPoolSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for family in Family::ALL {
        let (old_family, new_family) = match family {
            Family::V4 => (&old.ipv4, &new.ipv4),
            Family::V6 => (&old.ipv6, &new.ipv6),
        };
        let base = format!("spec.{}", family.field());
        match (old_family, new_family) {
            (None, Some(_)) => errors.push(FieldError::forbidden(
                &base,
                format!("{family} cannot be added to an existing NodeIPAMPool: {POOL_HINT}"),
            )),
            (Some(_), None) => errors.push(FieldError::forbidden(
                &base,
                format!("{family} cannot be removed from an existing NodeIPAMPool: {POOL_HINT}"),
            )),
            (Some(o), Some(n)) => {
                for (name, was, is) in [
                    ("rangeMaskSize", o.range_mask_size, n.range_mask_size),
                    (
                        "perNodeMaskSize",
                        o.per_node_mask_size,
                        n.per_node_mask_size,
                    ),
                ] {
                    if was != is {
                        errors.push(FieldError::invalid(
                            format!("{base}.{name}"),
                            is,
                            format!("is immutable (was {was}): {POOL_HINT}"),
                        ));
                    }
                }
                if let Some(gone) = o.cidrs.iter().find(|c| !n.cidrs.contains(c)) {
                    errors.push(FieldError::forbidden(
                        format!("{base}.cidrs"),
                        format!(
                            "CIDRs may only be appended: {gone} cannot be removed or changed (its ranges may hold blocks); {POOL_HINT}"
                        ),
                    ));
                }
            }
            (None, None) => {}
        }
    }
    if old.node_selector != new.node_selector {
        errors.push(FieldError::forbidden(
            "spec.nodeSelector",
            format!("is immutable: {POOL_HINT}"),
        ));
    }
    errors
}

#[cfg(test)]
mod tests;
