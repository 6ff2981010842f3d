//! Tests for `CidrSet`: kcm's cidrset cases, edge masks, memory of wide ranges, and a model check.

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn set(range: &str, mask: u8) -> CidrSet {
    CidrSet::new(net(range), mask).unwrap()
}

fn allocate_all(set: &mut CidrSet) -> Vec<IpNet> {
    let mut blocks = Vec::new();
    while let Ok(block) = set.allocate() {
        blocks.push(block);
    }
    blocks
}

#[test]
fn fully_allocated() {
    for (range, mask, expected) in [
        ("127.123.234.0/30", 30, "127.123.234.0/30"),
        ("beef:1234::/30", 30, "beef:1234::/30"),
    ] {
        let mut s = set(range, mask);
        assert_eq!(s.capacity(), 1);
        let block = s.allocate().unwrap();
        assert_eq!(block.to_string(), expected);
        assert_eq!(
            s.allocate(),
            Err(CidrSetError::Exhausted { range: net(range) })
        );
        assert_eq!(s.release(block), Ok(1));
        assert_eq!(s.allocate().unwrap().to_string(), expected);
        assert!(s.allocate().is_err());
    }
}

#[test]
fn index_to_block() {
    let cases = [
        ("127.123.3.0/16", 24, 0, "127.123.0.0/24"),
        ("127.123.0.0/16", 24, 15, "127.123.15.0/24"),
        ("192.168.5.219/28", 32, 5, "192.168.5.213/32"),
        ("2001:0db8:1234:3::/48", 64, 0, "2001:db8:1234::/64"),
        ("2001:0db8:1234::/48", 64, 15, "2001:db8:1234:f::/64"),
        (
            "2001:0db8:85a3::8a2e:0370:7334/50",
            63,
            6425,
            "2001:db8:85a3:3232::/63",
        ),
        ("2001:0db8::/32", 48, 0, "2001:db8::/48"),
        ("2001:0db8::/32", 48, 15, "2001:db8:f::/48"),
        (
            "2001:0db8:85a3::8a2e:0370:7334/32",
            48,
            6425,
            "2001:db8:1919::/48",
        ),
        ("2001:0db8:1234:ff00::/56", 72, 0, "2001:db8:1234:ff00::/72"),
        (
            "2001:0db8:1234:ff00::/56",
            72,
            15,
            "2001:db8:1234:ff00:f00::/72",
        ),
        (
            "2001:0db8:1234:ff00::0370:7334/56",
            72,
            6425,
            "2001:db8:1234:ff19:1900::/72",
        ),
        (
            "2001:0db8:1234:0:1234::/80",
            96,
            0,
            "2001:db8:1234:0:1234::/96",
        ),
        (
            "2001:0db8:1234:0:1234::/80",
            96,
            15,
            "2001:db8:1234:0:1234:f::/96",
        ),
        (
            "2001:0db8:1234:ff00::0370:7334/80",
            96,
            6425,
            "2001:db8:1234:ff00:0:1919::/96",
        ),
    ];
    for (range, mask, index, expected) in cases {
        let s = set(range, mask);
        let block = s.block(index).unwrap();
        assert_eq!(block.to_string(), expected, "{range} /{mask} #{index}");
        assert_eq!(s.index_of(block), Some(index), "{range} /{mask} #{index}");
    }
}

#[test]
fn block_past_the_end_is_none() {
    let s = set("10.0.0.0/16", 24);
    assert!(s.block(255).is_some());
    assert_eq!(s.block(256), None);
    assert_eq!(s.block(u64::MAX), None);
}

#[test]
fn release_all_then_reallocate_in_the_same_order() {
    for range in ["127.123.234.0/16", "beef:1234::/16"] {
        let mut s = set(range, 24);
        let first = allocate_all(&mut s);
        assert_eq!(first.len(), 256);
        for block in &first {
            assert_eq!(s.release(*block), Ok(1));
        }
        assert_eq!(s.allocated(), 0);
        let second = allocate_all(&mut s);
        assert_eq!(first, second, "{range}");
    }
}

#[test]
fn allocation_around_occupied_blocks() {
    for range in ["127.123.234.0/16", "beef:1234::/16"] {
        let mut s = set(range, 24);
        let blocks = allocate_all(&mut s);
        assert_eq!(blocks.len(), 256);
        for block in &blocks {
            s.release(*block).unwrap();
        }
        for block in &blocks[128..] {
            assert_eq!(s.occupy(*block), Ok(1));
        }
        assert_eq!(s.occupy(blocks[128]), Ok(0), "occupying twice counts once");
        assert_eq!(s.allocated(), 128);

        let again = allocate_all(&mut s);
        assert_eq!(again, blocks[..128], "{range}");
        assert_eq!(s.allocated(), 256);
    }
}

#[test]
fn double_occupy_and_release_keep_exact_counts() {
    let mut s = set("10.42.0.0/16", 24);
    let steps = [
        ("10.42.5.0/24", true, 1, 1),
        ("10.42.9.0/24", true, 1, 2),
        // Four blocks, one of them already taken.
        ("10.42.8.0/22", true, 3, 5),
        ("10.42.9.0/24", true, 0, 5),
        ("10.42.9.0/24", false, 1, 4),
        ("10.42.9.0/24", false, 0, 4),
        // Four blocks, only 10.42.5.0/24 taken.
        ("10.42.4.0/22", false, 1, 3),
    ];
    for (cidr, occupy, flipped, allocated) in steps {
        let got = if occupy {
            s.occupy(net(cidr))
        } else {
            s.release(net(cidr))
        };
        assert_eq!(got, Ok(flipped), "{cidr} occupy={occupy}");
        assert_eq!(s.allocated(), allocated, "{cidr} occupy={occupy}");
    }
    let allocatable = allocate_all(&mut s).len();
    assert_eq!(allocatable, (1 << 8) - 3);
    assert_eq!(s.free(), 0);
}

#[test]
fn index_of_blocks() {
    let cases = [
        ("127.0.0.0/8", 16, "127.0.0.0/16", Some(0)),
        ("be00::/8", 16, "be00::/16", Some(0)),
        ("127.0.0.0/8", 16, "127.123.0.0/16", Some(123)),
        ("be00::/8", 16, "beef::/16", Some(0xef)),
        ("127.0.0.0/8", 16, "127.168.0.0/16", Some(168)),
        ("be00::/8", 16, "be68::/16", Some(0x68)),
        ("127.0.0.0/8", 16, "127.224.0.0/16", Some(224)),
        ("be00::/8", 16, "be24::/16", Some(0x24)),
        ("192.168.0.0/16", 24, "192.168.12.0/24", Some(12)),
        ("beef::/16", 24, "beef:1200::/24", Some(0x12)),
        ("192.168.0.0/16", 24, "192.168.151.0/24", Some(151)),
        ("beef::/16", 24, "beef:9700::/24", Some(0x97)),
        ("192.168.0.0/16", 24, "127.168.224.0/24", None),
        ("beef::/16", 24, "2001:db00::/24", None),
        // Host bits are ignored.
        ("192.168.0.0/16", 24, "192.168.12.7/24", Some(12)),
        // Not exactly one block.
        ("192.168.0.0/16", 24, "192.168.12.0/25", None),
        ("192.168.0.0/16", 24, "192.168.12.0/23", None),
        // Other family.
        ("192.168.0.0/16", 24, "::ffff:c0a8:c00/24", None),
    ];
    for (range, mask, cidr, expected) in cases {
        assert_eq!(
            set(range, mask).index_of(net(cidr)),
            expected,
            "{cidr} in {range}"
        );
    }
}

#[test]
fn occupy_marks_exactly_the_blocks_touched() {
    let cases: [(&str, u8, &str, u64, u64); 14] = [
        ("127.0.0.0/8", 16, "127.0.0.0/8", 0, 255),
        ("2001:beef:1200::/40", 48, "2001:beef:1200::/40", 0, 255),
        ("127.0.0.0/8", 16, "127.0.0.0/2", 0, 255),
        ("2001:beef:1200::/40", 48, "2001:beef:1234::/34", 0, 255),
        ("127.0.0.0/8", 16, "127.0.0.0/16", 0, 0),
        ("2001:beef:1200::/40", 48, "2001:beef:1200::/48", 0, 0),
        ("127.0.0.0/8", 32, "127.0.0.0/16", 0, 65535),
        ("2001:beef:1200::/48", 64, "2001:beef:1200::/48", 0, 65535),
        ("127.0.0.0/7", 16, "127.0.0.0/15", 256, 257),
        ("2001:beef:7f00::/39", 48, "2001:beef:7f00::/47", 256, 257),
        ("127.0.0.0/7", 15, "127.0.0.0/15", 128, 128),
        ("2001:beef:7f00::/39", 47, "2001:beef:7f00::/47", 128, 128),
        ("127.0.0.0/7", 18, "127.0.0.0/15", 1024, 1031),
        ("2001:beef:7f00::/39", 50, "2001:beef:7f00::/47", 1024, 1031),
    ];
    for (range, mask, cidr, first, last) in cases {
        let mut s = set(range, mask);
        let what = format!("{cidr} in {range} /{mask}");
        assert_eq!(s.occupy(net(cidr)), Ok(last - first + 1), "{what}");
        assert_eq!(s.allocated(), last - first + 1, "{what}");
        // With the count matching, checking every block in the span pins the exact set.
        for index in first..=last {
            assert!(s.is_occupied(s.block(index).unwrap()), "{what} #{index}");
        }
        if first > 0 {
            assert!(!s.is_occupied(s.block(first - 1).unwrap()), "{what}");
        }
        if let Some(after) = s.block(last + 1) {
            assert!(!s.is_occupied(after), "{what}");
        }
        assert!(s.is_occupied(net(cidr)), "{what}");
    }
}

#[test]
fn first_allocations() {
    let cases = [
        ("127.0.0.0/8", 32, "127.0.0.0/32", "127.0.0.1/32"),
        // kcm refuses more than 16 bits of blocks; this set goes to 32.
        (
            "beef:1234::/32",
            49,
            "beef:1234::/49",
            "beef:1234:0:8000::/49",
        ),
        (
            "2001:beef:1234:369b::/60",
            64,
            "2001:beef:1234:3690::/64",
            "2001:beef:1234:3691::/64",
        ),
    ];
    for (range, mask, first, second) in cases {
        let mut s = set(range, mask);
        assert_eq!(s.allocate().unwrap().to_string(), first);
        assert_eq!(s.allocate().unwrap().to_string(), second);
    }
}

#[test]
fn invalid_masks_are_rejected() {
    let err = CidrSet::new(net("beef:1234::/32"), 65).unwrap_err();
    assert_eq!(
        err,
        CidrSetError::TooManyBlocks {
            range: net("beef:1234::/32"),
            mask: 65,
            block_bits: 33
        }
    );
    assert!(matches!(
        CidrSet::new(net("10.0.0.0/16"), 33),
        Err(CidrSetError::InvalidMask { mask: 33, .. })
    ));
    assert!(matches!(
        CidrSet::new(net("::/0"), 129),
        Err(CidrSetError::InvalidMask { mask: 129, .. })
    ));
    assert!(matches!(
        CidrSet::new(net("10.0.0.0/16"), 15),
        Err(CidrSetError::InvalidMask { mask: 15, .. })
    ));
    assert!(matches!(
        CidrSet::new(net("0.0.0.0/0"), 33),
        Err(CidrSetError::InvalidMask { .. })
    ));
}

#[test]
fn range_host_bits_are_cleared() {
    let s = set("127.123.234.5/16", 24);
    assert_eq!(s.range(), net("127.123.0.0/16"));
    assert_eq!(s.per_node_mask_size(), 24);
    assert_eq!(s.block(0), Some(net("127.123.0.0/24")));
}

#[test]
fn exhausted_small_range() {
    let mut s = set("10.0.0.0/28", 30);
    assert_eq!(s.capacity(), 4);
    let blocks = allocate_all(&mut s);
    let expected: Vec<IpNet> = ["10.0.0.0/30", "10.0.0.4/30", "10.0.0.8/30", "10.0.0.12/30"]
        .into_iter()
        .map(net)
        .collect();
    assert_eq!(blocks, expected);
    assert_eq!(
        s.allocate(),
        Err(CidrSetError::Exhausted {
            range: net("10.0.0.0/28")
        })
    );
    assert_eq!((s.allocated(), s.free()), (4, 0));
}

#[test]
fn next_fit_does_not_reuse_a_just_released_block() {
    let mut s = set("10.0.0.0/16", 24);
    let a = s.allocate().unwrap();
    let b = s.allocate().unwrap();
    assert_eq!(s.release(a), Ok(1));
    let c = s.allocate().unwrap();
    assert_ne!(c, a);
    assert_eq!(s.index_of(c), Some(s.index_of(b).unwrap() + 1));
    // Once the cursor wraps, the released block comes back.
    let rest = allocate_all(&mut s);
    assert_eq!(rest.last(), Some(&a));
    assert_eq!(s.free(), 0);
}

#[test]
fn occupy_does_not_move_the_cursor() {
    let mut s = set("10.0.0.0/16", 24);
    assert_eq!(s.occupy(net("10.0.0.0/17")), Ok(128));
    assert_eq!(s.allocate(), Ok(net("10.0.128.0/24")));
    assert_eq!(s.release(net("10.0.0.0/16")), Ok(129));
    assert_eq!(s.occupy(net("10.0.0.0/16")), Ok(256));
    assert_eq!(s.allocated(), 256);
}

#[test]
fn cidrs_smaller_than_a_block_touch_their_block() {
    let mut s = set("10.0.0.0/16", 24);
    assert_eq!(s.occupy(net("10.0.5.128/25")), Ok(1));
    assert!(s.is_occupied(net("10.0.5.0/24")));
    assert!(s.is_occupied(net("10.0.5.7/32")));
    assert!(!s.is_occupied(net("10.0.4.0/23")), "10.0.4.0/24 is free");
    assert_eq!(s.release(net("10.0.5.0/26")), Ok(1));
    assert_eq!(s.allocated(), 0);
}

#[test]
fn cidrs_outside_the_range_are_refused() {
    let mut s = set("10.0.0.0/16", 24);
    for cidr in ["10.1.0.0/24", "11.0.0.0/8", "::/0", "::ffff:a00:0/120"] {
        let expected = Err(CidrSetError::NotInRange {
            cidr: net(cidr),
            range: net("10.0.0.0/16"),
        });
        assert_eq!(s.occupy(net(cidr)), expected, "{cidr}");
        assert_eq!(s.release(net(cidr)), expected, "{cidr}");
        assert!(!s.is_occupied(net(cidr)), "{cidr}");
    }
    assert_eq!(s.allocated(), 0);
    // A supernet of the range overlaps it.
    assert_eq!(s.occupy(net("0.0.0.0/0")), Ok(256));
}

#[test]
fn zero_and_full_length_masks() {
    for (range, mask, only) in [
        ("0.0.0.0/0", 0, "0.0.0.0/0"),
        ("::/0", 0, "::/0"),
        ("10.1.2.3/32", 32, "10.1.2.3/32"),
        ("::1/128", 128, "::1/128"),
        (
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
            128,
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
        ),
    ] {
        let mut s = set(range, mask);
        assert_eq!(s.capacity(), 1, "{range}");
        assert_eq!(s.block(0), Some(net(only)), "{range}");
        assert_eq!(s.block(1), None, "{range}");
        assert_eq!(s.index_of(net(only)), Some(0), "{range}");
        assert_eq!(s.allocate(), Ok(net(only)), "{range}");
        assert!(s.allocate().is_err(), "{range}");
        assert!(s.is_occupied(net(only)), "{range}");
        assert_eq!(s.release(net(only)), Ok(1), "{range}");
        assert_eq!(s.allocate(), Ok(net(only)), "{range}");
    }
}

#[test]
fn widest_sets_at_the_ends_of_the_address_space() {
    for (range, mask, last) in [
        ("0.0.0.0/0", 32, "255.255.255.255/32"),
        ("::/0", 32, "ffff:ffff::/32"),
        (
            "ffff:ffff:ffff:ffff:ffff:ffff::/96",
            128,
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
        ),
    ] {
        let mut s = set(range, mask);
        assert_eq!(s.capacity(), 1 << 32, "{range}");
        let last_index = (1u64 << 32) - 1;
        assert_eq!(s.block(last_index), Some(net(last)), "{range}");
        assert_eq!(s.index_of(net(last)), Some(last_index), "{range}");
        assert_eq!(s.occupy(net(last)), Ok(1), "{range}");
        assert_eq!(s.occupy(net(range)), Ok(last_index), "{range}");
        assert_eq!(s.free(), 0, "{range}");
        assert_eq!(s.release(s.block(7).unwrap()), Ok(1), "{range}");
        assert_eq!(s.allocate(), Ok(s.block(7).unwrap()), "{range}");
        assert_eq!(s.release(net(range)), Ok(1 << 32), "{range}");
    }
}

const MIB: usize = 1 << 20;

#[test]
fn wide_range_memory_follows_blocks_in_use() {
    let mut s = set("2001:db8::/32", 64);
    assert_eq!(s.capacity(), 1 << 32);
    let empty = s.memory_bytes();
    assert!(empty < 1024, "{empty} bytes for an empty 2^32-block set");
    let mut blocks = Vec::new();
    for _ in 0..10_000 {
        blocks.push(s.allocate().unwrap());
    }
    assert_eq!(s.allocated(), 10_000);
    assert_eq!(s.index_of(blocks[9_999]), Some(9_999));
    let used = s.memory_bytes();
    assert!(used < 10 * MIB, "{used} bytes for 10,000 of 2^32 blocks");
    // In fact one 8 KiB leaf and a one-entry table.
    assert!(used < 64 * 1024, "{used} bytes for 10,000 of 2^32 blocks");
    assert!(used > empty + 8 * 1024, "the first leaf is counted");

    // Occupying everything costs the leaf table but no per-leaf bitmaps.
    assert_eq!(s.occupy(net("2001:db8::/32")), Ok((1 << 32) - 10_000));
    let full = s.memory_bytes();
    assert!(full < 2 * MIB, "{full} bytes when full");

    // Releasing frees leaves again.
    for block in &blocks {
        assert_eq!(s.release(*block), Ok(1));
    }
    assert_eq!(s.release(net("2001:db8::/32")), Ok((1 << 32) - 10_000));
    assert_eq!(s.allocated(), 0);
    assert_eq!(s.memory_bytes(), empty);
}

#[test]
fn small_range_stays_small() {
    let mut s = set("10.0.0.0/16", 24);
    allocate_all(&mut s);
    s.release(net("10.0.3.0/24")).unwrap();
    assert!(s.memory_bytes() < 1024, "{} bytes", s.memory_bytes());
}

#[test]
fn scattered_blocks_over_a_wide_range() {
    // One block in each of many leaves: each leaf costs its bitmap, and releasing frees it.
    let mut s = set("2001:db8::/32", 64);
    let empty = s.memory_bytes();
    let stride = 1u64 << 24;
    for index in (0..s.capacity()).step_by(stride as usize) {
        assert_eq!(s.occupy(s.block(index).unwrap()), Ok(1));
    }
    assert_eq!(s.allocated(), 1 << 8);
    assert!(s.memory_bytes() > empty);
    for index in (0..s.capacity()).step_by(stride as usize) {
        assert!(s.is_occupied(s.block(index).unwrap()));
        assert!(!s.is_occupied(s.block(index + 1).unwrap()));
        assert_eq!(s.release(s.block(index).unwrap()), Ok(1));
    }
    assert_eq!(s.memory_bytes(), empty);
}

mod model {
    //! Model-based checks against a plain set of block indexes.

    use super::super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// A range and block size to test.
    #[derive(Debug, Clone)]
    struct Case {
        range: IpNet,
        mask: u8,
    }

    impl Case {
        fn bits(&self) -> u8 {
            self.range.max_prefix_len()
        }
        fn capacity(&self) -> u64 {
            1u64 << (self.mask - self.range.prefix_len())
        }
        fn base(&self) -> u128 {
            to_bits(self.range.network())
        }
        /// The test's own block arithmetic: base plus index times block size.
        fn block(&self, index: u64) -> IpNet {
            let size = 1u128
                .checked_shl(u32::from(self.bits() - self.mask))
                .unwrap_or(0);
            let addr = self.base() + u128::from(index) * size;
            IpNet::new(from_bits(self.range, addr), self.mask).unwrap()
        }
        /// The blocks `cidr` overlaps, by brute force over a window that must hold them all.
        fn touched(&self, cidr: IpNet) -> Vec<u64> {
            let overlaps = |i: u64| {
                let block = self.block(i);
                block.contains(&cidr) || cidr.contains(&block)
            };
            let capacity = self.capacity();
            if capacity <= 1024 {
                return (0..capacity).filter(|i| overlaps(*i)).collect();
            }
            // Wide sets only see probes of at most 2^8 blocks.
            let near = to_bits(cidr.network())
                .checked_sub(self.base())
                .map(|offset| offset >> (self.bits() - self.mask))
                .and_then(|index| u64::try_from(index).ok())
                .unwrap_or(0)
                .min(capacity);
            let lo = near.saturating_sub(2);
            let hi = (near + 260).min(capacity);
            (lo..hi).filter(|i| overlaps(*i)).collect()
        }
    }

    fn to_bits(addr: IpAddr) -> u128 {
        match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        }
    }

    fn from_bits(like: IpNet, bits: u128) -> IpAddr {
        match like {
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(bits as u32)),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(bits)),
        }
    }

    fn case(v6: bool, prefix: u8, block_bits: u8, addr: u128) -> Case {
        let max = if v6 { 128 } else { 32 };
        let prefix = prefix.min(max);
        let mask = (prefix + block_bits).min(max);
        let range = if v6 {
            IpNet::new(IpAddr::V6(Ipv6Addr::from(addr)), prefix)
        } else {
            IpNet::new(IpAddr::V4(Ipv4Addr::from(addr as u32)), prefix)
        };
        Case {
            range: range.unwrap().trunc(),
            mask,
        }
    }

    /// Small ranges of both families, up to 2^8 blocks, including /0 and /32, /128 edges.
    fn small_case() -> impl Strategy<Value = Case> {
        (any::<bool>(), 0u8..=128, 0u8..=8, any::<u128>()).prop_map(|(v6, p, k, a)| {
            let p = if v6 { p } else { p % 33 };
            case(v6, p, k, a)
        })
    }

    /// Wide IPv6 ranges of 2^24 to 2^32 blocks.
    fn wide_case() -> impl Strategy<Value = Case> {
        (0u8..=96, 24u8..=32, any::<u128>()).prop_map(|(p, k, a)| case(true, p, k, a))
    }

    /// A CIDR to occupy, release or test: near a block in size, usually inside the range.
    #[derive(Debug, Clone)]
    struct Probe {
        prefix_delta: i8,
        offset: u128,
        outside: bool,
    }

    impl Probe {
        fn cidr(&self, case: &Case) -> IpNet {
            let prefix = (i16::from(case.mask) + i16::from(self.prefix_delta))
                .clamp(0, i16::from(case.bits())) as u8;
            let host = u128::MAX
                .checked_shr(u32::from(case.range.prefix_len()) + 128 - u32::from(case.bits()))
                .unwrap_or(0);
            let addr = if self.outside {
                self.offset
            } else {
                case.base() | (self.offset & host)
            };
            IpNet::new(from_bits(case.range, addr), prefix)
                .unwrap()
                .trunc()
        }
    }

    fn probe() -> impl Strategy<Value = Probe> {
        (-8i8..=4, any::<u128>(), prop::bool::weighted(0.1)).prop_map(
            |(prefix_delta, offset, outside)| Probe {
                prefix_delta,
                offset,
                outside,
            },
        )
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate,
        Occupy(Probe),
        Release(Probe),
        ReleaseHeld(prop::sample::Index),
        IsOccupied(Probe),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Allocate),
            2 => probe().prop_map(Op::Occupy),
            2 => probe().prop_map(Op::Release),
            2 => any::<prop::sample::Index>().prop_map(Op::ReleaseHeld),
            1 => probe().prop_map(Op::IsOccupied),
        ]
    }

    /// The reference: held indexes and kcm's next-fit cursor.
    struct Model {
        held: BTreeSet<u64>,
        cursor: u64,
        capacity: u64,
    }

    impl Model {
        fn next_free(&self) -> Option<u64> {
            if self.held.len() as u64 == self.capacity {
                return None;
            }
            let mut i = self.cursor;
            while self.held.contains(&i) {
                i = (i + 1) % self.capacity;
            }
            Some(i)
        }
    }

    fn run(case: Case, ops: Vec<Op>) -> Result<(), TestCaseError> {
        let mut s = CidrSet::new(case.range, case.mask).unwrap();
        prop_assert_eq!(s.capacity(), case.capacity());
        let mut m = Model {
            held: BTreeSet::new(),
            cursor: 0,
            capacity: case.capacity(),
        };
        for op in ops {
            match &op {
                Op::Allocate => match m.next_free() {
                    None => prop_assert_eq!(
                        s.allocate(),
                        Err(CidrSetError::Exhausted { range: case.range })
                    ),
                    Some(index) => {
                        let block = s.allocate().unwrap();
                        prop_assert_eq!(block, case.block(index));
                        prop_assert_eq!(block.prefix_len(), case.mask);
                        prop_assert!(case.range.contains(&block));
                        prop_assert_eq!(s.index_of(block), Some(index));
                        // Never handed out twice while held.
                        prop_assert!(m.held.insert(index));
                        m.cursor = (index + 1) % m.capacity;
                    }
                },
                Op::Occupy(probe) | Op::Release(probe) | Op::IsOccupied(probe) => {
                    let cidr = probe.cidr(&case);
                    let touched = case.touched(cidr);
                    let not_in_range = Err(CidrSetError::NotInRange {
                        cidr,
                        range: case.range,
                    });
                    match op {
                        Op::Occupy(_) if touched.is_empty() => {
                            prop_assert_eq!(s.occupy(cidr), not_in_range)
                        }
                        Op::Release(_) if touched.is_empty() => {
                            prop_assert_eq!(s.release(cidr), not_in_range)
                        }
                        Op::Occupy(_) => {
                            let new = touched.iter().filter(|i| m.held.insert(**i)).count();
                            prop_assert_eq!(s.occupy(cidr), Ok(new as u64));
                        }
                        Op::Release(_) => {
                            let old = touched.iter().filter(|i| m.held.remove(*i)).count();
                            prop_assert_eq!(s.release(cidr), Ok(old as u64));
                        }
                        _ => {
                            let all =
                                !touched.is_empty() && touched.iter().all(|i| m.held.contains(i));
                            prop_assert_eq!(s.is_occupied(cidr), all);
                        }
                    }
                }
                Op::ReleaseHeld(pick) => {
                    if m.held.is_empty() {
                        continue;
                    }
                    let index = *m.held.iter().nth(pick.index(m.held.len())).unwrap();
                    prop_assert_eq!(s.release(case.block(index)), Ok(1));
                    m.held.remove(&index);
                }
            }
            prop_assert_eq!(s.allocated(), m.held.len() as u64);
            prop_assert_eq!(s.free(), m.capacity - m.held.len() as u64);
        }
        // The bitmap agrees block by block (every block on small sets, held ones and their
        // neighbours on wide ones).
        if m.capacity <= 1024 {
            for i in 0..m.capacity {
                prop_assert_eq!(s.is_occupied(case.block(i)), m.held.contains(&i));
            }
        } else {
            for &i in &m.held {
                for j in [i.saturating_sub(1), i, (i + 1).min(m.capacity - 1)] {
                    prop_assert_eq!(s.is_occupied(case.block(j)), m.held.contains(&j));
                }
            }
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn small_sets_match_the_model(
            case in small_case(),
            ops in prop::collection::vec(op(), 0..80),
        ) {
            run(case, ops)?;
        }

        #[test]
        fn wide_sets_match_the_model(
            case in wide_case(),
            ops in prop::collection::vec(op(), 0..80),
        ) {
            run(case, ops)?;
        }

        /// Exhaustion yields exactly the free blocks, all distinct; a release is then reused.
        #[test]
        fn exhaustion_yields_exactly_the_free_blocks(
            case in small_case(),
            taken in prop::collection::vec(probe(), 0..4),
            pick in any::<prop::sample::Index>(),
        ) {
            let mut s = CidrSet::new(case.range, case.mask).unwrap();
            let mut pre = BTreeSet::new();
            for probe in taken {
                let cidr = probe.cidr(&case);
                let touched = case.touched(cidr);
                prop_assert_eq!(s.occupy(cidr).is_ok(), !touched.is_empty());
                pre.extend(touched);
            }
            let free = s.free();
            prop_assert_eq!(free, case.capacity() - pre.len() as u64);

            let mut got = BTreeSet::new();
            loop {
                match s.allocate() {
                    Ok(block) => {
                        let index = s.index_of(block).unwrap();
                        prop_assert_eq!(block, case.block(index));
                        prop_assert!(!pre.contains(&index));
                        prop_assert!(got.insert(index), "handed out twice");
                    }
                    Err(err) => {
                        prop_assert_eq!(err, CidrSetError::Exhausted { range: case.range });
                        break;
                    }
                }
            }
            prop_assert_eq!(got.len() as u64, free);
            prop_assert_eq!(s.free(), 0);

            // The only free block after one release is that block.
            let index = pick.index(case.capacity() as usize) as u64;
            prop_assert_eq!(s.release(case.block(index)), Ok(1));
            prop_assert_eq!(s.allocate(), Ok(case.block(index)));

            // Releasing the range frees everything; a fresh pass yields every block once.
            prop_assert_eq!(s.release(case.range), Ok(case.capacity()));
            let again: BTreeSet<IpNet> = std::iter::from_fn(|| s.allocate().ok()).collect();
            prop_assert_eq!(again.len() as u64, case.capacity());
        }
    }
}
