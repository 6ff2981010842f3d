//! The two-level occupancy bitmap behind a `CidrSet`: up to 2^32 block bits, split into leaves
//! that exist only while partly set, in a leaf table that only reaches as far as the highest
//! leaf in use, so memory follows the blocks in use, not the range size.

use bitvec::prelude::*;

/// Bits per leaf for wide sets: 2^16 bits = 8 KiB, so a 2^32-block set has 2^16 leaf slots.
const LEAF_SHIFT: u32 = 16;

/// One leaf. Uniform leaves carry no bitmap, so whole-range occupy/release stays cheap.
#[derive(Clone)]
enum Leaf {
    Empty,
    Full,
    Partial {
        bits: BitBox<u64, Lsb0>,
        /// Set bits in `bits`; always strictly between 0 and the leaf length.
        set: u32,
    },
}

impl Leaf {
    fn set_bits(&self, leaf_bits: u64) -> u64 {
        match self {
            Leaf::Empty => 0,
            Leaf::Full => leaf_bits,
            Leaf::Partial { set, .. } => u64::from(*set),
        }
    }

    /// Re-establishes the invariant that a `Partial` leaf is neither empty nor full.
    fn from_bits(bits: BitBox<u64, Lsb0>, set: u64, leaf_bits: u64) -> Leaf {
        if set == 0 {
            Leaf::Empty
        } else if set >= leaf_bits {
            Leaf::Full
        } else {
            // set < leaf_bits <= 2^16, so it fits.
            Leaf::Partial {
                bits,
                set: set as u32,
            }
        }
    }
}

/// Occupancy of `capacity` blocks, indexed `0..capacity`.
#[derive(Clone)]
pub(super) struct Bitmap {
    /// Leaves from index 0 up to the last non-empty one; leaves past the end are empty.
    leaves: Vec<Leaf>,
    leaf_shift: u32,
    capacity: u64,
    set: u64,
}

impl Bitmap {
    /// A bitmap of `2^log2_capacity` bits (`log2_capacity <= 32`), all clear.
    pub(super) fn new(log2_capacity: u32) -> Self {
        Self::with_leaf_shift(log2_capacity, LEAF_SHIFT)
    }

    /// Like `new`, with a chosen leaf size; small leaves let tests cross leaf boundaries.
    pub(super) fn with_leaf_shift(log2_capacity: u32, leaf_shift: u32) -> Self {
        let log2_capacity = log2_capacity.min(32);
        // A set smaller than a leaf gets one leaf of exactly its size.
        let leaf_shift = leaf_shift.min(log2_capacity);
        Bitmap {
            leaves: Vec::new(),
            leaf_shift,
            capacity: 1u64 << log2_capacity,
            set: 0,
        }
    }

    fn leaf_bits(&self) -> u64 {
        1u64 << self.leaf_shift
    }

    pub(super) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Number of set bits.
    pub(super) fn count(&self) -> u64 {
        self.set
    }

    /// The `(leaf index, start bit in leaf, end bit in leaf)` spans that `[start, end)`
    /// touches; `end` is clamped to the capacity.
    fn leaf_spans(&self, start: u64, end: u64) -> impl Iterator<Item = (usize, u64, u64)> + use<> {
        let end = end.min(self.capacity);
        let shift = self.leaf_shift;
        let leaf_bits = self.leaf_bits();
        let mut at = start;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let leaf = at >> shift;
            let leaf_start = leaf << shift;
            let span = (
                leaf as usize,
                at - leaf_start,
                (end - leaf_start).min(leaf_bits),
            );
            at = leaf_start + leaf_bits;
            // leaf < 2^(32 - shift): lossless wherever usize has 32 bits or more.
            Some(span)
        })
    }

    /// Sets (`value = true`) or clears every bit in `[start, end)`; returns how many flipped.
    pub(super) fn fill(&mut self, start: u64, end: u64, value: bool) -> u64 {
        let leaf_bits = self.leaf_bits();
        let end = end.min(self.capacity);
        if value && start < end {
            self.grow_to(((end - 1) >> self.leaf_shift) as usize);
        }
        let mut flipped = 0;
        for (index, lo, hi) in self.leaf_spans(start, end) {
            // Leaves past the table are empty: nothing to clear there.
            let Some(leaf) = self.leaves.get_mut(index) else {
                break;
            };
            flipped += fill_leaf(leaf, leaf_bits, lo, hi, value);
        }
        if value {
            self.set += flipped;
        } else {
            self.set -= flipped;
            self.trim();
        }
        flipped
    }

    /// Extends the leaf table so that leaf `index` exists.
    fn grow_to(&mut self, index: usize) {
        if index >= self.leaves.len() {
            self.leaves.resize(index + 1, Leaf::Empty);
        }
    }

    /// Drops trailing empty leaves, and returns table memory once it is mostly unused.
    fn trim(&mut self) {
        while matches!(self.leaves.last(), Some(Leaf::Empty)) {
            self.leaves.pop();
        }
        if self.leaves.capacity() > 2 * self.leaves.len() {
            self.leaves.shrink_to_fit();
        }
    }

    /// Sets one bit; returns whether it flipped. The allocation hot path.
    pub(super) fn set_one(&mut self, index: u64) -> bool {
        if index >= self.capacity {
            return false;
        }
        let leaf_bits = self.leaf_bits();
        let offset = (index & (leaf_bits - 1)) as usize;
        let leaf_index = (index >> self.leaf_shift) as usize;
        self.grow_to(leaf_index);
        let Some(leaf) = self.leaves.get_mut(leaf_index) else {
            return false;
        };
        let flipped = match leaf {
            Leaf::Full => false,
            Leaf::Partial { bits, set } => {
                if bits.get(offset).is_some_and(|b| *b) {
                    false
                } else {
                    bits.set(offset, true);
                    *set += 1;
                    if u64::from(*set) == leaf_bits {
                        *leaf = Leaf::Full;
                    }
                    true
                }
            }
            Leaf::Empty => {
                if leaf_bits == 1 {
                    *leaf = Leaf::Full;
                } else {
                    let mut bits = BitVec::<u64, Lsb0>::repeat(false, leaf_bits as usize);
                    bits.set(offset, true);
                    *leaf = Leaf::Partial {
                        bits: bits.into_boxed_bitslice(),
                        set: 1,
                    };
                }
                true
            }
        };
        if flipped {
            self.set += 1;
        }
        flipped
    }

    /// Whether every bit in `[start, end)` is set; `false` for an empty span.
    pub(super) fn all_set(&self, start: u64, end: u64) -> bool {
        if start >= end.min(self.capacity) {
            return false;
        }
        self.leaf_spans(start, end)
            .all(|(index, lo, hi)| match self.leaves.get(index) {
                Some(Leaf::Full) => true,
                Some(Leaf::Partial { bits, .. }) => bits
                    .get(lo as usize..hi as usize)
                    .is_some_and(|span| span.all()),
                Some(Leaf::Empty) | None => false,
            })
    }

    /// The first clear bit in `[start, end)`, skipping full leaves without reading them.
    pub(super) fn first_clear(&self, start: u64, end: u64) -> Option<u64> {
        self.leaf_spans(start, end).find_map(|(index, lo, hi)| {
            let leaf_start = (index as u64) << self.leaf_shift;
            match self.leaves.get(index) {
                Some(Leaf::Empty) | None => Some(leaf_start + lo),
                Some(Leaf::Partial { bits, .. }) => bits
                    .get(lo as usize..hi as usize)
                    .and_then(|span| span.first_zero())
                    .map(|zero| leaf_start + lo + zero as u64),
                Some(Leaf::Full) => None,
            }
        })
    }

    /// Heap bytes held: the leaf table plus every materialized leaf, from allocated capacities.
    pub(super) fn heap_bytes(&self) -> usize {
        let table = self.leaves.capacity() * std::mem::size_of::<Leaf>();
        let leaves: usize = self
            .leaves
            .iter()
            .map(|leaf| match leaf {
                Leaf::Partial { bits, .. } => std::mem::size_of_val(bits.as_raw_slice()),
                Leaf::Empty | Leaf::Full => 0,
            })
            .sum();
        table + leaves
    }

    #[cfg(test)]
    pub(super) fn materialized_leaves(&self) -> usize {
        self.leaves
            .iter()
            .filter(|leaf| matches!(leaf, Leaf::Partial { .. }))
            .count()
    }
}

/// Fills `[lo, hi)` of one leaf; returns how many bits flipped.
fn fill_leaf(leaf: &mut Leaf, leaf_bits: u64, lo: u64, hi: u64, value: bool) -> u64 {
    if lo >= hi {
        return 0;
    }
    let before = leaf.set_bits(leaf_bits);
    if lo == 0 && hi == leaf_bits {
        // The whole leaf: no bitmap needed either way.
        *leaf = if value { Leaf::Full } else { Leaf::Empty };
        return if value { leaf_bits - before } else { before };
    }
    let (mut bits, set) = match std::mem::replace(leaf, Leaf::Empty) {
        Leaf::Full if value => {
            *leaf = Leaf::Full;
            return 0;
        }
        Leaf::Empty if !value => return 0,
        Leaf::Empty => (
            BitVec::<u64, Lsb0>::repeat(false, leaf_bits as usize).into_boxed_bitslice(),
            0,
        ),
        Leaf::Full => (
            BitVec::<u64, Lsb0>::repeat(true, leaf_bits as usize).into_boxed_bitslice(),
            leaf_bits,
        ),
        Leaf::Partial { bits, set } => (bits, u64::from(set)),
    };
    let mut flipped = 0;
    if let Some(span) = bits.get_mut(lo as usize..hi as usize) {
        let ones = span.count_ones() as u64;
        flipped = if value { (hi - lo) - ones } else { ones };
        span.fill(value);
    }
    let set = if value { set + flipped } else { set - flipped };
    *leaf = Leaf::from_bits(bits, set, leaf_bits);
    flipped
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn small_set_is_one_exact_leaf() {
        let mut bitmap = Bitmap::new(2);
        assert_eq!(bitmap.capacity(), 4);
        assert_eq!(bitmap.first_clear(0, 4), Some(0));
        assert_eq!(bitmap.fill(1, 3, true), 2);
        assert_eq!(bitmap.first_clear(1, 4), Some(3));
        assert!(bitmap.all_set(1, 3));
        assert!(!bitmap.all_set(0, 3));
        assert_eq!(bitmap.fill(0, 4, true), 2);
        assert_eq!(
            bitmap.materialized_leaves(),
            0,
            "a full leaf drops its bits"
        );
        assert_eq!(bitmap.first_clear(0, 4), None);
    }

    #[test]
    fn whole_wide_set_fills_without_materializing_leaves() {
        let mut bitmap = Bitmap::new(32);
        assert_eq!(bitmap.fill(0, 1 << 32, true), 1 << 32);
        assert_eq!(bitmap.count(), 1 << 32);
        assert_eq!(bitmap.materialized_leaves(), 0);
        assert_eq!(bitmap.first_clear(0, 1 << 32), None);
        assert_eq!(bitmap.fill(5, 6, false), 1);
        assert_eq!(bitmap.materialized_leaves(), 1);
        assert_eq!(bitmap.first_clear(0, 1 << 32), Some(5));
        assert_eq!(bitmap.fill(0, 1 << 32, false), (1 << 32) - 1);
        assert_eq!(bitmap.count(), 0);
        assert_eq!(bitmap.materialized_leaves(), 0);
    }

    #[test]
    fn set_one_on_single_bit_set() {
        let mut bitmap = Bitmap::new(0);
        assert!(bitmap.set_one(0));
        assert!(!bitmap.set_one(0));
        assert!(!bitmap.set_one(1), "out of range is ignored");
        assert_eq!(bitmap.count(), 1);
        assert_eq!(
            bitmap.materialized_leaves(),
            0,
            "one bit set is a full leaf"
        );
        assert!(bitmap.heap_bytes() >= std::mem::size_of::<Leaf>());
        assert_eq!(bitmap.fill(0, 1, false), 1);
        assert_eq!(bitmap.heap_bytes(), 0);
    }

    #[test]
    fn leaf_table_reaches_only_the_last_leaf_in_use() {
        let mut bitmap = Bitmap::new(32);
        assert_eq!(bitmap.heap_bytes(), 0, "an empty wide set holds no table");
        let leaf_bits = 1u64 << LEAF_SHIFT;
        assert!(bitmap.set_one(3));
        let one_leaf = bitmap.heap_bytes();
        assert!(one_leaf < 2 * std::mem::size_of::<Leaf>() + (leaf_bits / 8) as usize * 2);
        assert_eq!(bitmap.first_clear(leaf_bits, 1 << 32), Some(leaf_bits));

        // A far block grows the table to reach it; clearing it trims the table back.
        let far = (1u64 << 32) - 1;
        assert!(bitmap.set_one(far));
        assert!(bitmap.heap_bytes() > one_leaf + 65_000 * std::mem::size_of::<Leaf>());
        assert_eq!(bitmap.first_clear(far, 1 << 32), None);
        assert_eq!(bitmap.fill(far, far + 1, false), 1);
        assert_eq!(bitmap.leaves.len(), 1);
        assert_eq!(bitmap.fill(0, 1 << 32, false), 1);
        assert_eq!(bitmap.heap_bytes(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Fill(u64, u64, bool),
        SetOne(u64),
    }

    proptest! {
        /// Against a plain set of indexes, with tiny leaves so spans cross leaf boundaries.
        #[test]
        fn matches_a_set_of_indexes(
            log2 in 0u32..=7,
            leaf_shift in 0u32..=4,
            ops in proptest::collection::vec(
                prop_oneof![
                    (0u64..140, 0u64..140, any::<bool>()).prop_map(|(a, b, v)| Op::Fill(a.min(b), a.max(b), v)),
                    (0u64..140).prop_map(Op::SetOne),
                ],
                0..60,
            ),
        ) {
            let mut bitmap = Bitmap::with_leaf_shift(log2, leaf_shift);
            let capacity = bitmap.capacity();
            let mut model = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Fill(start, end, value) => {
                        let mut expected = 0;
                        for i in start..end.min(capacity) {
                            expected += u64::from(if value { model.insert(i) } else { model.remove(&i) });
                        }
                        prop_assert_eq!(bitmap.fill(start, end, value), expected);
                        let all = start < end.min(capacity) && (start..end.min(capacity)).all(|i| model.contains(&i));
                        prop_assert_eq!(bitmap.all_set(start, end), all);
                    }
                    Op::SetOne(i) => {
                        let expected = i < capacity && model.insert(i);
                        prop_assert_eq!(bitmap.set_one(i), expected);
                    }
                }
                prop_assert_eq!(bitmap.count(), model.len() as u64);
                prop_assert!(!matches!(bitmap.leaves.last(), Some(Leaf::Empty)), "table not trimmed");
                for start in 0..capacity {
                    let expected = (start..capacity).find(|i| !model.contains(i));
                    prop_assert_eq!(bitmap.first_clear(start, capacity), expected);
                }
            }
        }
    }
}
