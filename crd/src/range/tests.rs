//! Edges of the range vocabulary (/0, a mask equal to the prefix, exactly 2^32 blocks, families
//! that never mix) and properties checked against a brute-force model on small ranges.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;
use crate::limits::MAX_BLOCK_BITS;

/// `Result<T, Vec<E>>` as `Result<T, &[E]>`, to match a list of errors with a slice pattern.
trait AsDerefErr<T, E> {
    fn as_deref_err(&self) -> Result<&T, &[E]>;
}

impl<T, E> AsDerefErr<T, E> for Result<T, Vec<E>> {
    fn as_deref_err(&self) -> Result<&T, &[E]> {
        self.as_ref().map_err(Vec::as_slice)
    }
}

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn range(cidr: &str, mask: u8) -> FamilyRange {
    FamilyRange::new(net(cidr), mask).expect("test range")
}

#[test]
fn slash_zero_ranges() {
    // A /0 carved into /32s is exactly 2^32 blocks: the largest range there is.
    let v4 = FamilyRange::parse("0.0.0.0/0", 30, Family::V4).expect("valid");
    assert_eq!(v4.blocks(), Some(1 << 30));
    let v6 = FamilyRange::parse("::/0", 32, Family::V6).expect("valid");
    assert_eq!(v6.blocks(), Some(1 << 32));
    assert_eq!(
        FamilyRange::parse("::/0", 33, Family::V6),
        Err(vec![RangeError::Split(SplitError::TooManyBlocks {
            mask: 33,
            prefix: 0,
            block_bits: 33
        })])
    );
    // Everything overlaps the /0 of its own family, nothing of the other one.
    assert!(overlaps(&net("0.0.0.0/0"), &net("255.255.255.255/32")));
    assert!(overlaps(&net("::/0"), &net("ffff::/128")));
    assert!(!overlaps(&net("0.0.0.0/0"), &net("::/0")));
    // A /0 block of a /0 range: 128 host bits must not overflow a shift.
    assert_eq!(blocks_covered(net("::/0"), 0, &[net("::1/128")]), 1);
    assert_eq!(blocks_covered(net("0.0.0.0/0"), 0, &[net("0.0.0.0/0")]), 1);
}

#[test]
fn mask_equal_to_prefix_is_one_block() {
    let r = FamilyRange::parse("10.0.0.0/24", 24, Family::V4).expect("valid");
    assert_eq!(r.block_bits(), 0);
    assert_eq!(r.blocks(), Some(1));
    assert_eq!(r.block_count(), 1);
    assert_eq!(r.blocks_covered(&[net("10.0.0.7/32")]), 1);
    assert_eq!(r.blocks_covered(&[net("10.0.1.0/24")]), 0);
}

#[test]
fn the_limit_is_2_to_the_32_blocks() {
    assert_eq!(block_bits(32, 64), Ok(MAX_BLOCK_BITS));
    assert_eq!(
        block_bits(31, 64),
        Err(SplitError::TooManyBlocks {
            mask: 64,
            prefix: 31,
            block_bits: 33
        })
    );
    assert_eq!(
        block_bits(24, 16),
        Err(SplitError::MaskShorterThanPrefix {
            mask: 16,
            prefix: 24
        })
    );
    let widest = range("fd00::/32", 64);
    assert_eq!(widest.blocks(), Some(1 << 32));
    assert_eq!(widest.block_count(), 1 << 32);
    assert!(FamilyRange::new(net("fd00::/31"), 64).is_err());
    assert_eq!(
        FamilyRange::new(net("10.0.0.0/8"), 33),
        Err(SplitError::MaskBeyondFamily { mask: 33 })
    );
}

#[test]
fn claimed_keeps_what_validation_refuses() {
    // Host bits set: validation refuses it, but the CIDR is still the one the spec names.
    let claimed = FamilyRange::claimed("10.0.0.1/16", 24).expect("parses");
    assert_eq!(claimed.cidr.to_string(), "10.0.0.1/16");
    assert_eq!(
        FamilyRange::parse("10.0.0.1/16", 24, Family::V4),
        Err(vec![RangeError::NotCanonical {
            canonical: net("10.0.0.0/16")
        }])
    );
    // Too many blocks to count in a u64: only a claimed range can be that large.
    let huge = FamilyRange::claimed("fd00::/8", 96).expect("parses");
    assert_eq!(huge.blocks(), None);
    assert_eq!(huge.block_count(), u64::MAX);
    // A mask shorter than the prefix splits nothing: one block.
    assert_eq!(
        FamilyRange::claimed("10.0.0.0/16", 8).and_then(|r| r.blocks()),
        Some(1)
    );
    assert_eq!(FamilyRange::claimed("not a cidr", 24), None);
}

#[test]
fn parse_reports_cidr_then_mask() {
    assert_eq!(
        FamilyRange::parse("fd00::/64", 31, Family::V4),
        Err(vec![
            RangeError::WrongFamily {
                expected: Family::V4,
                actual: Family::V6
            },
            RangeError::MaskTooLong {
                mask: 31,
                max: 30,
                family: Family::V4
            },
        ])
    );
    assert_eq!(
        FamilyRange::parse("", 24, Family::V4),
        Err(vec![RangeError::MissingCidr])
    );
    assert_eq!(
        FamilyRange::parse(&"1".repeat(65), 24, Family::V4),
        Err(vec![RangeError::CidrTooLong])
    );
    assert!(matches!(
        FamilyRange::parse("10.0.0.0/08", 24, Family::V4).as_deref_err(),
        Err([RangeError::Malformed(CidrError::BadPrefixLength(_))])
    ));
}

#[test]
fn families_never_mix() {
    let v4 = net("0.0.0.0/0");
    let v6 = net("::/0");
    assert!(!overlaps(&v4, &v6));
    assert_eq!(nesting(&v4, &v6), None);
    assert!(!covered(&v4, &[v6]));
    assert!(!covered(&v6, &[v4]));
    // ::a00:0/104 has the same integer bounds as 10.0.0.0/8, and still covers none of it.
    assert!(!covered(&net("10.0.0.0/8"), &[net("::a00:0/104")]));
    assert_eq!(
        blocks_covered(net("10.0.0.0/8"), 16, &[net("::a00:0/104")]),
        0
    );
}

#[test]
fn covered_by_a_union() {
    let halves = [net("10.0.128.0/17"), net("10.0.0.0/17")];
    assert!(covered(&net("10.0.0.0/16"), &halves));
    assert!(!covered(&net("10.0.0.0/16"), &halves[..1]));
    // A gap of one address is not covered.
    let gap = [
        net("10.0.0.0/25"),
        net("10.0.0.129/32"),
        net("10.0.0.130/31"),
    ];
    assert!(!covered(&net("10.0.0.0/24"), &gap));
    assert!(covered(&net("::/0"), &[net("8000::/1"), net("::/1")]));
    assert!(covered(&net("255.255.255.255/32"), &[net("0.0.0.0/0")]));
}

#[test]
fn nesting_kinds() {
    let (a, b) = (net("10.0.0.0/8"), net("10.64.0.0/14"));
    assert_eq!(nesting(&a, &b), Some(Nesting::Contains));
    assert_eq!(nesting(&b, &a), Some(Nesting::Inside));
    assert_eq!(nesting(&a, &net("10.1.2.3/8")), Some(Nesting::Same));
    assert_eq!(nesting(&net("10.0.0.0/16"), &net("10.1.0.0/16")), None);
}

/// A CIDR inside `10.0.0.0/16` or `fd00::/112`, both 65536 addresses wide, so a brute-force
/// model can enumerate them.
fn small_net() -> impl Strategy<Value = IpNet> {
    (any::<bool>(), 0u8..=16, any::<u16>()).prop_map(|(v6, len, bits)| {
        let addr = if v6 {
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, bits))
        } else {
            let [hi, lo] = bits.to_be_bytes();
            IpAddr::V4(Ipv4Addr::new(10, 0, hi, lo))
        };
        let prefix = if v6 { 112 + len } else { 16 + len };
        IpNet::new(addr, prefix).expect("prefix fits").trunc()
    })
}

/// The offsets (within the 16-bit space of its family) `net` holds.
fn offsets(net: &IpNet) -> std::ops::RangeInclusive<u32> {
    let (a, b) = bounds(net);
    (a as u32 & 0xffff)..=(b as u32 & 0xffff)
}

proptest! {
    #[test]
    fn overlaps_means_a_shared_address(a in small_net(), b in small_net()) {
        let same_family = Family::of_net(&a) == Family::of_net(&b);
        let (ra, rb) = (offsets(&a), offsets(&b));
        let shared = same_family && ra.start() <= rb.end() && rb.start() <= ra.end();
        prop_assert_eq!(overlaps(&a, &b), shared);
        prop_assert_eq!(overlaps(&b, &a), shared);
        prop_assert_eq!(nesting(&a, &b).is_some(), shared);
    }

    #[test]
    fn covered_means_every_address_is_in_the_union(
        range in small_net(),
        cidrs in prop::collection::vec(small_net(), 0..6),
    ) {
        let mut seen = std::collections::HashSet::new();
        for c in cidrs.iter().filter(|c| Family::of_net(c) == Family::of_net(&range)) {
            seen.extend(offsets(c));
        }
        let all = offsets(&range).all(|o| seen.contains(&o));
        prop_assert_eq!(covered(&range, &cidrs), all);
    }

    #[test]
    fn blocks_covered_counts_touched_blocks(
        range in small_net(),
        extra in 0u8..=8,
        held in prop::collection::vec(small_net(), 0..6),
    ) {
        let mask = (range.prefix_len() + extra).min(range.max_prefix_len());
        let r = FamilyRange::new(range, mask).expect("small split");
        let host_bits = u32::from(range.max_prefix_len() - mask);
        let start = *offsets(&range).start();
        let mut touched = std::collections::HashSet::new();
        for h in held.iter().filter(|h| Family::of_net(h) == Family::of_net(&range)) {
            for o in offsets(h).filter(|o| offsets(&range).contains(o)) {
                touched.insert((o - start) >> host_bits);
            }
        }
        prop_assert_eq!(r.blocks_covered(&held), touched.len() as u64);
        prop_assert!(r.blocks_covered(&held) <= r.block_count());
    }

    #[test]
    fn block_count_is_two_to_the_split(prefix in 0u8..=128, extra in 0u8..=40) {
        let mask = prefix.saturating_add(extra);
        let cidr = IpNet::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), prefix).expect("v6 prefix");
        match FamilyRange::new(cidr, mask) {
            Ok(r) => {
                prop_assert!(extra <= MAX_BLOCK_BITS && mask <= 128);
                prop_assert_eq!(r.blocks(), Some(1u64 << extra));
            }
            Err(SplitError::MaskBeyondFamily { .. }) => prop_assert!(mask > 128),
            Err(SplitError::TooManyBlocks { block_bits, .. }) => {
                prop_assert!(block_bits > MAX_BLOCK_BITS);
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}
