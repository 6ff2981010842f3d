//! A NodeIPAMPool's scaling decision, pure: from the pool's budget, its child configs as the
//! allocation state sees them, every other occupied range and the nodes waiting, which ranges
//! to carve as new child configs, which empty children to retire, and the pool's status.
//! Everything else (selection, allocation, drain, publication) children get as ordinary
//! configs; this module only says "one more" or "this one goes".

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_core::ResourceExt;
use nodeipam_crd::range::{bounds, overlaps};
use nodeipam_crd::{CONDITION_EXHAUSTED, CONDITION_READY};

pub use nodeipam_crd::pool::{
    AWAITING_ENABLE, CONDITION_SCALING, NodeIPAMPoolStatus as PoolStatus, POOL_LABEL,
    PoolFamilyStatus, PoolRangeStatus, child_name,
};
use nodeipam_crd::pool::{
    NodeIPAMPool, RANGE_ACTIVE, RANGE_DRAINING, RANGE_ENABLING, RANGE_RETIRING,
};

/// Condition reasons of a pool.
pub const REASON_ACCEPTING: &str = "Accepting";
pub const REASON_PENDING: &str = "Pending";
pub const REASON_NO_RANGES: &str = "NoRanges";
pub const REASON_TERMINATING: &str = "Terminating";
pub const REASON_INVALID: &str = "Invalid";
pub const REASON_BUDGET_EXHAUSTED: &str = "BudgetExhausted";
pub const REASON_MAX_RANGES: &str = "MaxRanges";
pub const REASON_ROOM: &str = "Room";
pub const REASON_CARVING: &str = "Carving";
pub const REASON_RETIRING: &str = "Retiring";
pub const REASON_STABLE: &str = "Stable";

/// One family of a pool's budget: the CIDRs children are carved from, the size of each child
/// range and the per-node block size of the children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFamily {
    pub cidrs: Vec<IpNet>,
    pub range_mask: u8,
    pub per_node_mask: u8,
}

impl PoolFamily {
    /// Blocks in one child range of this family; 0 when the masks make no sense.
    pub fn blocks_per_range(&self) -> u64 {
        self.per_node_mask
            .checked_sub(self.range_mask)
            .and_then(|bits| 1u64.checked_shl(u32::from(bits)))
            .unwrap_or(0)
    }

    /// Blocks the budget could hold in at most `max` ranges of this family.
    pub fn budget_blocks(&self, max: u32) -> u64 {
        let ranges = self
            .cidrs
            .iter()
            .map(|c| {
                self.range_mask
                    .checked_sub(c.prefix_len())
                    .map_or(0, |bits| {
                        1u64.checked_shl(u32::from(bits)).unwrap_or(u64::MAX)
                    })
            })
            .fold(0u64, u64::saturating_add);
        ranges
            .min(u64::from(max))
            .saturating_mul(self.blocks_per_range())
    }
}

/// What the decision needs of a NodeIPAMPool object, mapped from the API object by the caller.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolInput {
    pub name: String,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub ipv4: Option<PoolFamily>,
    pub ipv6: Option<PoolFamily>,
    pub selector: Option<NodeSelector>,
    /// Ranges kept even when empty.
    pub min: u32,
    /// Ranges never exceeded.
    pub max: u32,
    /// Free blocks kept ready across the children.
    pub headroom: u64,
    /// How long a child stays empty before it is retired.
    pub empty_for: Duration,
    pub deleting: bool,
    /// Why the spec is unusable, when it is: nothing is carved or retired then.
    pub invalid: Option<String>,
    /// The status the object carries.
    pub status: Option<PoolStatus>,
}

impl PoolInput {
    pub fn families(&self) -> impl Iterator<Item = &PoolFamily> {
        self.ipv4.iter().chain(self.ipv6.iter())
    }

    /// Blocks one carved range adds: the scarcer family's, as a node needs one of each.
    pub fn blocks_per_range(&self) -> u64 {
        self.families()
            .map(PoolFamily::blocks_per_range)
            .min()
            .unwrap_or(0)
    }

    /// The budget CIDRs of every family.
    pub fn budget(&self) -> impl Iterator<Item = &IpNet> {
        self.families().flat_map(|f| f.cidrs.iter())
    }
}

/// The decision's view of a pool object. An invalid spec becomes `invalid` with the
/// validation errors (nothing is carved or retired then), its CIDRs still claimed as far as
/// they parse, so other pools keep out of them.
pub fn pool_input(obj: &NodeIPAMPool) -> PoolInput {
    let spec = &obj.spec;
    let (ipv4, ipv6, invalid, (min, max, headroom, empty_for)) = match spec.parse() {
        Ok(p) => {
            let family = |f: Option<&nodeipam_crd::PoolFamily>| {
                f.map(|f| PoolFamily {
                    cidrs: f.cidrs.clone(),
                    range_mask: f.range_mask_size,
                    per_node_mask: f.per_node_mask_size,
                })
            };
            let bounds = (
                p.min_ranges,
                p.max_ranges,
                u64::from(p.headroom_blocks),
                p.empty_for,
            );
            (
                family(p.ipv4.as_ref()),
                family(p.ipv6.as_ref()),
                None,
                bounds,
            )
        }
        Err(errors) => {
            let family = |f: &Option<nodeipam_crd::PoolFamilySpec>| {
                f.as_ref().map(|f| PoolFamily {
                    cidrs: f.cidrs.iter().filter_map(|c| c.parse().ok()).collect(),
                    range_mask: f.range_mask_size,
                    per_node_mask: f.per_node_mask_size,
                })
            };
            let why = errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            (
                family(&spec.ipv4),
                family(&spec.ipv6),
                Some(why),
                (0, 0, 0, Duration::MAX),
            )
        }
    };
    // A name too long to be its children's label value carves nothing (every create would be
    // refused), said like a spec error.
    let invalid = match (nodeipam_crd::validate_pool_name(&obj.name_any()), invalid) {
        (None, invalid) => invalid,
        (Some(e), None) => Some(e.to_string()),
        (Some(e), Some(why)) => Some(format!("{e}; {why}")),
    };
    PoolInput {
        name: obj.name_any(),
        uid: obj.uid(),
        generation: obj.metadata.generation,
        ipv4,
        ipv6,
        selector: spec.node_selector.clone(),
        min,
        max,
        headroom,
        empty_for,
        deleting: obj.metadata.deletion_timestamp.is_some(),
        invalid,
        status: obj.status.clone(),
    }
}

/// Whether a child config object awaits its enable: [`AWAITING_ENABLE`] on it and its
/// allocation Disabled. The one test the machine, the pool writer and the simulator share.
pub fn awaits_enable(obj: &nodeipam_crd::NodeIPAMConfig) -> bool {
    obj.spec.allocation != nodeipam_crd::Allocation::Enabled
        && obj
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(AWAITING_ENABLE))
}

/// A child config of a pool, as the allocation state sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChildView {
    pub name: String,
    pub uid: Option<String>,
    pub ipv4: Option<IpNet>,
    pub ipv6: Option<IpNet>,
    /// `spec.allocation` is Enabled.
    pub enabled: bool,
    /// Created by us disabled and not enabled yet: it carries [`AWAITING_ENABLE`] and
    /// `spec.allocation` is Disabled. It serves nothing, but counts toward max, as a
    /// predecessor's enable of it may still land.
    pub awaiting: bool,
    /// The resourceVersion the watch shows it at: an enable is sent at it.
    pub resource_version: Option<String>,
    pub deleting: bool,
    /// Valid and overlapping nothing older: it can hand out blocks once its gates open.
    pub usable: bool,
    /// Handing out blocks now (every gate open).
    pub accepting: bool,
    pub allocated: u64,
    pub free: u64,
    /// A node holds, is being given or may still receive (a leak) one of its blocks:
    /// [`crate::ipam::ConfigFacts::held`].
    pub held: bool,
    /// When it last stopped being held (monotonic), if it is not held.
    pub empty_since: Option<Duration>,
    /// Our delete of it is on its way.
    pub retiring: bool,
}

impl ChildView {
    /// Counts as one of the pool's ranges: serving, or about to once its gates open.
    pub fn active(&self) -> bool {
        self.enabled && !self.deleting && !self.retiring
    }

    /// Counts toward the pool's max: active, or awaiting its enable (which may still come
    /// from a predecessor) and not on its way out.
    pub fn counts(&self) -> bool {
        (self.enabled || self.awaiting) && !self.deleting && !self.retiring
    }

    /// Awaiting its enable and not on its way out.
    fn waits(&self) -> bool {
        self.awaiting && !self.enabled && !self.deleting && !self.retiring
    }

    fn first_cidr(&self) -> Option<IpNet> {
        self.ipv4.or(self.ipv6)
    }

    fn ranges(&self) -> impl Iterator<Item = IpNet> {
        self.ipv4.into_iter().chain(self.ipv6)
    }
}

/// A range to carve as a new child config.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Carve {
    pub name: String,
    pub ipv4: Option<IpNet>,
    pub ipv6: Option<IpNet>,
}

impl Carve {
    pub fn ranges(&self) -> impl Iterator<Item = IpNet> {
        self.ipv4.into_iter().chain(self.ipv6)
    }
}

/// A child config to delete (only the object `uid`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retire {
    pub name: String,
    pub uid: Option<String>,
    /// A child awaiting its enable, retired because the pool has more than max children
    /// that count (a create landed late), not because it stayed empty.
    pub over_max: bool,
}

/// A child created disabled, to enable now: only the object `uid` at `resource_version`,
/// the version the decision saw it at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enable {
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// How far back a pool's demand is counted: about the time a carve takes to be published,
/// with room to spare.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(1);

/// Everything the decision looks at.
#[derive(Clone, Debug)]
pub struct PoolWorld<'a> {
    pub pool: &'a PoolInput,
    pub children: &'a [ChildView],
    /// Every range the pool must not carve over: other configs, other pools' budgets, Service
    /// ranges, unmanaged podCIDRs.
    pub occupied: &'a [IpNet],
    /// Nodes the pool selects that wait for a block no other config can give them.
    pub pending: u64,
    /// Carves asked for and not yet seen as child configs.
    pub in_flight: &'a [Carve],
    /// Blocks the pool's children handed out in the last [`DEMAND_WINDOW`]: while nodes come
    /// faster than the headroom lasts, the pool keeps that many free instead, so that a new
    /// range is published before the free blocks run out.
    pub demand: u64,
    /// Monotonic now.
    pub now: Duration,
}

/// Whether the status has the condition `type_` True.
pub fn says(status: &PoolStatus, type_: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// What to do about one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub carves: Vec<Carve>,
    pub retires: Vec<Retire>,
    /// Children awaiting their enable, to enable now: only ever while the children that
    /// count toward max (enabled or awaiting, and the carves in flight) are within max.
    pub enables: Vec<Enable>,
    pub status: PoolStatus,
    /// Conditions that turned True with this status: `(type, message)`.
    pub turned_true: Vec<(&'static str, String)>,
    /// One more range could be carved now (count and budget allow it).
    pub room: bool,
}

/// The lowest range of `/mask` inside one of `budget` (lowest address first, whatever order
/// the pool lists its CIDRs in, as children are filled and retired by address too) that
/// overlaps none of `taken`. Skips past each taken range, so it costs one step per taken range, not one
/// per candidate (a /32 of IPv6 holds 2^32 /64s).
pub fn lowest_free(budget: &[IpNet], mask: u8, taken: &[IpNet]) -> Option<IpNet> {
    let mut budget: Vec<IpNet> = budget.iter().map(IpNet::trunc).collect();
    budget.sort_by_key(|b| (bounds(b), b.prefix_len()));
    for b in &budget {
        let bits = b.max_prefix_len();
        if b.prefix_len() > mask || mask > bits {
            continue;
        }
        let Some(size) = 1u128.checked_shl(u32::from(bits - mask)) else {
            continue;
        };
        let (start, end) = bounds(b);
        let mut spans: Vec<(u128, u128)> = taken
            .iter()
            .filter(|t| overlaps(t, b))
            .map(bounds)
            .collect();
        spans.sort_unstable();
        let mut cursor = start;
        loop {
            // Aligned up to the range size: the budget's start is aligned, so this stays inside.
            let offset = cursor - start;
            let Some(aligned) = offset.div_ceil(size).checked_mul(size) else {
                break;
            };
            let Some(candidate) = start.checked_add(aligned) else {
                break;
            };
            let last = candidate + (size - 1);
            if candidate > end || last > end {
                break;
            }
            let blocker = spans
                .iter()
                .filter(|(a, z)| *a <= last && *z >= candidate)
                .map(|(_, z)| *z)
                .max();
            match blocker {
                None => return net_at(b, candidate, mask),
                Some(z) => match z.checked_add(1) {
                    Some(next) => cursor = next,
                    None => break,
                },
            }
        }
    }
    None
}

fn net_at(family_of: &IpNet, addr: u128, prefix: u8) -> Option<IpNet> {
    let ip = match family_of {
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(addr).ok()?)),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(addr)),
    };
    IpNet::new(ip, prefix).ok()
}

/// The pool's decision now. `previous` are the conditions of the status last written (or the
/// object's), for transition times; `wall` stamps the conditions that flip.
pub fn decide(w: &PoolWorld<'_>, previous: &[Condition], wall: &Time) -> Decision {
    let pool = w.pool;
    let mut children: Vec<&ChildView> = w.children.iter().collect();
    children.sort_by_key(|c| {
        (
            c.first_cidr().map(|n| (bounds(&n), n.prefix_len())),
            &c.name,
        )
    });
    let per_range = pool.blocks_per_range();
    let workable = pool.invalid.is_none() && !pool.deleting && per_range > 0;

    let active: Vec<&ChildView> = children.iter().copied().filter(|c| c.active()).collect();
    // Every child that is or may become enabled counts toward max: the enabled ones, those
    // awaiting their enable (a predecessor's enable of one may still land), and the carves
    // in flight (each lands awaiting).
    let counted: Vec<&ChildView> = children.iter().copied().filter(|c| c.counts()).collect();
    let mut count = counted.len() as u64 + w.in_flight.len() as u64;
    let (min, max) = (u64::from(pool.min), u64::from(pool.max));
    // Over max (a create that landed late): retire awaiting children beyond it, highest
    // range first, never an enabled one; enable nothing while over.
    let mut retires = Vec::new();
    let mut over_max = Vec::new();
    if workable && count > max {
        // As for any retire, never one that is held or unusable (overlapped by an older
        // config, whose blocks in its range are not its own to judge).
        for c in counted
            .iter()
            .rev()
            .filter(|c| c.waits() && !c.held && c.usable)
        {
            if count <= max {
                break;
            }
            over_max.push(c.name.clone());
            retires.push(Retire {
                name: c.name.clone(),
                uid: c.uid.clone(),
                over_max: true,
            });
            count -= 1;
        }
    }
    // An awaiting child's blocks are supply that will come, like a carve in flight's.
    let mut supply: u64 = counted
        .iter()
        .filter(|c| c.usable && !over_max.contains(&c.name))
        .map(|c| c.free)
        .sum::<u64>()
        + w.in_flight.len() as u64 * per_range;
    let want = w.pending.saturating_add(pool.headroom.max(w.demand));

    // Carve: the lowest free range of each family, in lockstep.
    let mut taken: Vec<IpNet> = w.occupied.to_vec();
    taken.extend(children.iter().flat_map(|c| c.ranges()));
    taken.extend(w.in_flight.iter().flat_map(Carve::ranges));
    let mut carves = Vec::new();
    let next = |taken: &[IpNet]| -> Option<Carve> {
        let mut carve = Carve {
            name: String::new(),
            ipv4: None,
            ipv6: None,
        };
        if let Some(f) = &pool.ipv4 {
            carve.ipv4 = Some(lowest_free(&f.cidrs, f.range_mask, taken)?);
        }
        if let Some(f) = &pool.ipv6 {
            carve.ipv6 = Some(lowest_free(&f.cidrs, f.range_mask, taken)?);
        }
        let first = carve.ipv4.or(carve.ipv6)?;
        carve.name = child_name(&pool.name, &first);
        Some(carve)
    };
    if workable && over_max.is_empty() {
        while count < max && (count < min || supply < want) {
            let Some(carve) = next(&taken) else {
                break;
            };
            taken.extend(carve.ranges());
            carves.push(carve);
            count += 1;
            supply += per_range;
        }
    }
    let room = workable && count < max && next(&taken).is_some();

    // Enable: only while every child that counts is within max (so no enable, however late
    // it lands, makes more than max enabled).
    let enables: Vec<Enable> = if workable && count <= max && over_max.is_empty() {
        counted
            .iter()
            .filter(|c| c.waits())
            .map(|c| Enable {
                name: c.name.clone(),
                uid: c.uid.clone(),
                resource_version: c.resource_version.clone(),
            })
            .collect()
    } else {
        Vec::new()
    };

    // Retire: empty long enough, youngest (highest) first, never below min, never while a
    // node waits or a carve is under way (a child awaiting its enable is one), never below
    // the headroom.
    if workable
        && over_max.is_empty()
        && enables.is_empty()
        && w.pending == 0
        && w.in_flight.is_empty()
        && carves.is_empty()
    {
        for c in active.iter().rev() {
            let empty_long = c
                .empty_since
                .is_some_and(|t| w.now.saturating_sub(t) >= pool.empty_for);
            if c.held || !c.usable {
                continue;
            }
            // A higher child that is empty but not yet for long goes first: a lower one that
            // emptied earlier (it filled first, and its nodes were the oldest) waits for it,
            // so the pool shrinks back to its lowest ranges.
            if !empty_long || count <= min {
                break;
            }
            let free = c.free;
            if supply.saturating_sub(free) < want {
                continue;
            }
            retires.push(Retire {
                name: c.name.clone(),
                uid: c.uid.clone(),
                over_max: false,
            });
            count -= 1;
            supply -= free;
        }
    }

    // Status.
    let state = |c: &ChildView| {
        if c.retiring || retires.iter().any(|r| r.name == c.name) {
            RANGE_RETIRING
        } else if c.active() {
            RANGE_ACTIVE
        } else if c.waits() {
            RANGE_ENABLING
        } else if c.deleting && !c.held {
            RANGE_RETIRING
        } else {
            RANGE_DRAINING
        }
    };
    let ranges: Vec<PoolRangeStatus> = children
        .iter()
        .map(|c| PoolRangeStatus {
            name: c.name.clone(),
            ipv4: c.ipv4.map(|n| n.to_string()),
            ipv6: c.ipv6.map(|n| n.to_string()),
            state: state(c).into(),
        })
        .collect();
    let family = |f: &Option<PoolFamily>, of: fn(&ChildView) -> Option<IpNet>| {
        f.as_ref().map(|f| {
            let mut s = PoolFamilyStatus {
                budget_blocks: f.budget_blocks(pool.max),
                ..PoolFamilyStatus::default()
            };
            for c in children.iter().filter(|c| !c.deleting) {
                if let Some(range) = of(c) {
                    s.ranges += 1;
                    s.capacity += f
                        .per_node_mask
                        .checked_sub(range.prefix_len())
                        .and_then(|bits| 1u64.checked_shl(u32::from(bits)))
                        .unwrap_or(0);
                    s.allocated += c.allocated;
                }
            }
            s
        })
    };
    let accepting = active.iter().any(|c| c.accepting);
    let ready = if pool.deleting {
        (
            "False",
            REASON_TERMINATING,
            "the pool is being deleted: its ranges drain".to_string(),
        )
    } else if let Some(why) = &pool.invalid {
        ("False", REASON_INVALID, why.clone())
    } else if accepting {
        (
            "True",
            REASON_ACCEPTING,
            "a range accepts allocations".into(),
        )
    } else if !carves.is_empty()
        || !w.in_flight.is_empty()
        || !active.is_empty()
        || !enables.is_empty()
    {
        (
            "False",
            REASON_PENDING,
            "waiting until a carved range is published and accepts allocations".into(),
        )
    } else {
        ("False", REASON_NO_RANGES, "the pool has no range".into())
    };
    let short = w.pending > 0 || supply < pool.headroom;
    let exhausted = if !workable {
        ("False", REASON_ROOM, "the pool does not scale".to_string())
    } else if short && !room {
        let (reason, why) = if count >= max {
            (
                REASON_MAX_RANGES,
                format!("the pool has its maximum of {max} ranges"),
            )
        } else {
            (
                REASON_BUDGET_EXHAUSTED,
                "no free range of the budget is left to carve".to_string(),
            )
        };
        (
            "True",
            reason,
            format!(
                "{why}; {} node(s) wait and {supply} block(s) are free of {} wanted as headroom",
                w.pending, pool.headroom
            ),
        )
    } else {
        ("False", REASON_ROOM, "the budget has room".to_string())
    };
    let retiring = children.iter().any(|c| c.retiring) || !retires.is_empty();
    let awaiting = counted
        .iter()
        .filter(|c| c.waits() && !over_max.contains(&c.name))
        .count();
    let scaling = if !carves.is_empty() || !w.in_flight.is_empty() || awaiting > 0 {
        (
            "True",
            REASON_CARVING,
            format!(
                "carving {} range(s)",
                carves.len() + w.in_flight.len() + awaiting
            ),
        )
    } else if retiring {
        ("True", REASON_RETIRING, "retiring empty ranges".to_string())
    } else {
        (
            "False",
            REASON_STABLE,
            "no range is carved or retired".to_string(),
        )
    };
    let mut turned_true = Vec::new();
    let mut conditions = Vec::new();
    for (type_, (status, reason, message)) in [
        (CONDITION_READY, ready),
        (CONDITION_EXHAUSTED, exhausted),
        (CONDITION_SCALING, scaling),
    ] {
        let prev = previous.iter().find(|c| c.type_ == type_);
        let flipped = prev.is_none_or(|p| p.status != status);
        if flipped && status == "True" {
            turned_true.push((type_, message.clone()));
        }
        conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: pool.generation,
            last_transition_time: match prev {
                Some(p) if !flipped => p.last_transition_time.clone(),
                _ => wall.clone(),
            },
        });
    }
    let status = PoolStatus {
        observed_generation: pool.generation,
        ranges,
        ipv4: family(&pool.ipv4, |c| c.ipv4),
        ipv6: family(&pool.ipv6, |c| c.ipv6),
        conditions,
    };
    Decision {
        carves,
        retires,
        enables,
        status,
        turned_true,
        room,
    }
}

#[cfg(test)]
mod tests;
