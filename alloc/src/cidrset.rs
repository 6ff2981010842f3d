//! One CIDR set per range: carves a range into equal per-node blocks and tracks which are taken,
//! handing them out next-fit round robin like kube-controller-manager's cidrset.

mod bitmap;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use nodeipam_crd::range::{FamilyRange, SplitError};

use bitmap::Bitmap;

/// The most blocks a set may hold, as a power of two: 2^32 blocks, e.g. a /32 carved into /64s.
/// The CRD refuses more with the same constant, so a valid config always fits a set.
pub use nodeipam_crd::limits::MAX_BLOCK_BITS;

/// Why a set could not be built, or an operation on it failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrSetError {
    #[error("per-node mask /{mask} is invalid for range {range}: {reason}")]
    InvalidMask {
        range: IpNet,
        mask: u8,
        reason: &'static str,
    },
    #[error(
        "range {range} carved into /{mask} blocks gives 2^{block_bits} blocks, more than the 2^{max} supported",
        max = MAX_BLOCK_BITS
    )]
    TooManyBlocks {
        range: IpNet,
        mask: u8,
        block_bits: u8,
    },
    #[error("range {range} has no free block left")]
    Exhausted { range: IpNet },
    #[error("{cidr} does not overlap range {range}")]
    NotInRange { cidr: IpNet, range: IpNet },
}

/// The blocks of one range and which of them are taken.
#[derive(Clone)]
pub struct CidrSet {
    /// The range, host bits cleared.
    range: IpNet,
    /// The range's network address as an integer (IPv4 in the low 32 bits).
    base: u128,
    per_node_mask_size: u8,
    /// Host bits of one block: how far an index shifts to become an address offset (0..=128).
    block_shift: u32,
    bitmap: Bitmap,
    /// Where the next allocation starts looking, so a just-released block is not reused at once.
    next_candidate: u64,
}

impl CidrSet {
    /// Carves `range` into `/per_node_mask_size` blocks. Host bits of `range` are ignored.
    pub fn new(range: IpNet, per_node_mask_size: u8) -> Result<Self, CidrSetError> {
        let mask = per_node_mask_size;
        let invalid = |reason| CidrSetError::InvalidMask {
            range: range.trunc(),
            mask,
            reason,
        };
        // The split rules (mask within the family and the range, at most 2^32 blocks) are the
        // ones validation applies, from one place.
        let carved = FamilyRange::new(range, mask).map_err(|e| match e {
            SplitError::MaskBeyondFamily { .. } => invalid("longer than the address family allows"),
            SplitError::MaskShorterThanPrefix { .. } => {
                invalid("shorter than the range's own prefix")
            }
            SplitError::TooManyBlocks { block_bits, .. } => CidrSetError::TooManyBlocks {
                range: range.trunc(),
                mask,
                block_bits,
            },
        })?;
        let range = carved.cidr;
        let block_bits = carved.block_bits();
        Ok(CidrSet {
            range,
            base: addr_bits(range.network()),
            per_node_mask_size: mask,
            block_shift: u32::from(range.max_prefix_len() - mask),
            bitmap: Bitmap::new(u32::from(block_bits)),
            next_candidate: 0,
        })
    }

    /// The range this set carves, host bits cleared.
    pub fn range(&self) -> IpNet {
        self.range
    }

    /// The prefix length of every block.
    pub fn per_node_mask_size(&self) -> u8 {
        self.per_node_mask_size
    }

    /// Number of blocks in the range (1 to 2^32).
    pub fn capacity(&self) -> u64 {
        self.bitmap.capacity()
    }

    /// Number of blocks taken.
    pub fn allocated(&self) -> u64 {
        self.bitmap.count()
    }

    /// Number of blocks still free.
    pub fn free(&self) -> u64 {
        self.capacity() - self.allocated()
    }

    /// Takes the first free block at or after the cursor, wrapping around once, and moves the
    /// cursor just past it.
    pub fn allocate(&mut self) -> Result<IpNet, CidrSetError> {
        let exhausted = CidrSetError::Exhausted { range: self.range };
        if self.free() == 0 {
            return Err(exhausted);
        }
        let capacity = self.capacity();
        let start = self.next_candidate;
        let index = self
            .bitmap
            .first_clear(start, capacity)
            .or_else(|| self.bitmap.first_clear(0, start))
            .ok_or(exhausted.clone())?;
        // Build the block before marking it, so nothing changes if that were to fail.
        let block = self.block(index).ok_or(exhausted)?;
        self.bitmap.set_one(index);
        self.next_candidate = (index + 1) % capacity;
        Ok(block)
    }

    /// Marks every block `cidr` touches as taken; returns how many were newly taken.
    /// `cidr` may be a block, part of one, several, or a supernet of the whole range.
    pub fn occupy(&mut self, cidr: IpNet) -> Result<u64, CidrSetError> {
        let (start, end) = self.span(cidr).ok_or(CidrSetError::NotInRange {
            cidr,
            range: self.range,
        })?;
        Ok(self.bitmap.fill(start, end, true))
    }

    /// Frees every block `cidr` touches (same overlap rules as [`CidrSet::occupy`]); returns how
    /// many were taken before.
    pub fn release(&mut self, cidr: IpNet) -> Result<u64, CidrSetError> {
        let (start, end) = self.span(cidr).ok_or(CidrSetError::NotInRange {
            cidr,
            range: self.range,
        })?;
        Ok(self.bitmap.fill(start, end, false))
    }

    /// Whether every block `cidr` touches is taken; `false` if it touches none.
    pub fn is_occupied(&self, cidr: IpNet) -> bool {
        self.span(cidr)
            .is_some_and(|(start, end)| self.bitmap.all_set(start, end))
    }

    /// The block at `index`, or `None` past the end.
    pub fn block(&self, index: u64) -> Option<IpNet> {
        if index >= self.capacity() {
            return None;
        }
        // Blocks are aligned inside the range, so the offset only fills the range's host bits.
        let addr = self.base | shl(u128::from(index), self.block_shift);
        let addr = match self.range {
            IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(addr).ok()?)),
            IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(addr)),
        };
        IpNet::new(addr, self.per_node_mask_size).ok()
    }

    /// The index of block `cidr` (host bits ignored), or `None` if it is not exactly one block of
    /// this range.
    pub fn index_of(&self, cidr: IpNet) -> Option<u64> {
        if cidr.prefix_len() != self.per_node_mask_size || !self.range.contains(&cidr) {
            return None;
        }
        self.offset_index(cidr.network())
    }

    /// Approximate bytes this set holds, heap included, computed from allocated capacities.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.bitmap.heap_bytes()
    }

    /// The index of the block holding `addr`, which must lie in the range.
    fn offset_index(&self, addr: IpAddr) -> Option<u64> {
        let offset = addr_bits(addr).checked_sub(self.base)?;
        u64::try_from(shr(offset, self.block_shift)).ok()
    }

    /// The half-open index span of the blocks `cidr` overlaps, or `None` if it overlaps none.
    fn span(&self, cidr: IpNet) -> Option<(u64, u64)> {
        let cidr = cidr.trunc();
        if cidr.contains(&self.range) {
            return Some((0, self.capacity()));
        }
        if !self.range.contains(&cidr) {
            // Two prefixes overlap only if one contains the other; this covers family mismatch.
            return None;
        }
        let first = self.offset_index(cidr.network())?;
        let last = self.offset_index(cidr.broadcast())?;
        Some((first, last + 1))
    }
}

impl fmt::Debug for CidrSet {
    // The bitmap can be megabytes; show the counters instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CidrSet")
            .field("range", &self.range)
            .field("per_node_mask_size", &self.per_node_mask_size)
            .field("capacity", &self.capacity())
            .field("allocated", &self.allocated())
            .field("next_candidate", &self.next_candidate)
            .finish()
    }
}

fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// `value << shift`, zero once every bit is shifted out (a /0 block has shift 128).
fn shl(value: u128, shift: u32) -> u128 {
    value.checked_shl(shift).unwrap_or(0)
}

/// `value >> shift`, zero once every bit is shifted out.
fn shr(value: u128, shift: u32) -> u128 {
    value.checked_shr(shift).unwrap_or(0)
}

#[cfg(test)]
mod tests;
