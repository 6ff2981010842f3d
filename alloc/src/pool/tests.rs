use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn wall() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("time"))
}

/// A v4 pool over `budget` carving `/range` children of `/node` blocks.
fn pool(budget: &[&str], range: u8, node: u8) -> PoolInput {
    PoolInput {
        name: "pods".into(),
        uid: Some("pool-1".into()),
        generation: Some(1),
        ipv4: Some(PoolFamily {
            cidrs: budget.iter().map(|c| net(c)).collect(),
            range_mask: range,
            per_node_mask: node,
        }),
        ipv6: None,
        selector: None,
        min: 1,
        max: 32,
        headroom: 2,
        empty_for: Duration::from_secs(1800),
        deleting: false,
        invalid: None,
        status: None,
    }
}

fn child(range: &str, allocated: u64, free: u64) -> ChildView {
    let r = net(range);
    ChildView {
        name: child_name("pods", &r),
        uid: Some(format!("uid-{range}")),
        ipv4: Some(r),
        ipv6: None,
        enabled: true,
        awaiting: false,
        resource_version: Some(format!("rv-{range}")),
        deleting: false,
        usable: true,
        accepting: true,
        allocated,
        free,
        held: allocated > 0,
        empty_since: (allocated == 0).then_some(Duration::ZERO),
        retiring: false,
    }
}

/// A child created disabled and awaiting its enable: it serves nothing yet.
fn awaiting(range: &str, free: u64) -> ChildView {
    ChildView {
        enabled: false,
        awaiting: true,
        accepting: false,
        ..child(range, 0, free)
    }
}

fn decide_now(
    pool: &PoolInput,
    children: &[ChildView],
    occupied: &[IpNet],
    pending: u64,
    in_flight: &[Carve],
    now: Duration,
) -> Decision {
    let w = PoolWorld {
        pool,
        children,
        occupied,
        pending,
        in_flight,
        demand: 0,
        now,
    };
    decide(&w, &[], &wall())
}

fn carved(d: &Decision) -> Vec<String> {
    d.carves
        .iter()
        .map(|c| c.ipv4.or(c.ipv6).expect("a range").to_string())
        .collect()
}

fn condition<'a>(d: &'a Decision, type_: &str) -> &'a Condition {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .expect("condition")
}

#[test]
fn child_names_are_deterministic_dns_names() {
    assert_eq!(
        child_name("pods", &net("10.64.1.0/24")),
        "pods-10-64-1-0-24"
    );
    assert_eq!(child_name("pods", &net("fd00:1::/64")), "pods-fd00-1---64");
    let long = "p".repeat(300);
    let name = child_name(&long, &net("10.0.0.0/8"));
    assert!(name.len() <= 253, "{}", name.len());
    assert!(name.ends_with("-10-0-0-0-8"));
}

#[test]
fn lowest_free_skips_taken_ranges_and_stays_aligned() {
    let budget = [net("10.0.0.0/22")];
    assert_eq!(lowest_free(&budget, 24, &[]), Some(net("10.0.0.0/24")));
    // A small taken range blocks its whole aligned /24.
    let taken = [net("10.0.0.128/30"), net("10.0.1.0/24")];
    assert_eq!(lowest_free(&budget, 24, &taken), Some(net("10.0.2.0/24")));
    // A supernet of the budget takes all of it.
    assert_eq!(lowest_free(&budget, 24, &[net("10.0.0.0/16")]), None);
    // A range larger than the budget CIDR cannot be carved from it.
    assert_eq!(lowest_free(&budget, 21, &[]), None);
    // The lowest address first, whatever order the pool lists its CIDRs in.
    let two = [net("10.9.0.0/24"), net("10.1.0.0/24")];
    assert_eq!(lowest_free(&two, 26, &[]), Some(net("10.1.0.0/26")));
    let taken = [net("10.1.0.0/24")];
    assert_eq!(lowest_free(&two, 26, &taken), Some(net("10.9.0.0/26")));
    // A huge IPv6 budget is not walked one candidate at a time.
    let v6 = [net("fd00::/32")];
    let taken: Vec<IpNet> = (0..1000u32)
        .map(|i| net(&format!("fd00:0:0:{i:x}::/64")))
        .collect();
    assert_eq!(lowest_free(&v6, 64, &taken), Some(net("fd00:0:0:3e8::/64")));
    assert_eq!(
        lowest_free(&[net("::/0")], 0, &[]),
        None,
        "a /0 range is too large to carve"
    );
}

#[test]
fn an_empty_pool_carves_min_and_the_headroom() {
    let mut p = pool(&["10.0.0.0/16"], 24, 26); // 4 blocks per range
    p.min = 1;
    p.headroom = 6;
    let d = decide_now(&p, &[], &[], 0, &[], Duration::ZERO);
    assert_eq!(carved(&d), ["10.0.0.0/24", "10.0.1.0/24"]);
    assert_eq!(d.carves[0].name, "pods-10-0-0-0-24");
    assert!(says(&d.status, CONDITION_SCALING));
    assert_eq!(condition(&d, CONDITION_READY).reason, REASON_PENDING);
}

#[test]
fn recent_demand_above_the_headroom_is_kept_free_instead() {
    let p = pool(&["10.0.0.0/16"], 24, 26); // 4 blocks per range, headroom 2
    let children = [child("10.0.0.0/24", 1, 3)];
    let quiet = |demand| PoolWorld {
        pool: &p,
        children: &children,
        occupied: &[],
        pending: 0,
        in_flight: &[],
        demand,
        now: Duration::ZERO,
    };
    assert!(decide(&quiet(0), &[], &wall()).carves.is_empty());
    assert!(decide(&quiet(2), &[], &wall()).carves.is_empty());
    // 10 blocks went in the last second: keep 10 free (3 + two new ranges of 4).
    let d = decide(&quiet(10), &[], &wall());
    assert_eq!(carved(&d), ["10.0.1.0/24", "10.0.2.0/24"]);
}

#[test]
fn pending_nodes_carve_as_many_ranges_as_they_need_up_to_max() {
    let mut p = pool(&["10.0.0.0/16"], 24, 26);
    p.headroom = 0;
    p.max = 3;
    let children = [child("10.0.0.0/24", 4, 0)];
    let d = decide_now(&p, &children, &[], 9, &[], Duration::ZERO);
    // 9 nodes need 3 ranges of 4, but max allows 2 more.
    assert_eq!(carved(&d), ["10.0.1.0/24", "10.0.2.0/24"]);
    assert!(!d.room);
    assert!(says(&d.status, CONDITION_EXHAUSTED));
    assert_eq!(condition(&d, CONDITION_EXHAUSTED).reason, REASON_MAX_RANGES);
}

#[test]
fn carves_in_flight_count_as_supply_and_are_not_carved_twice() {
    let mut p = pool(&["10.0.0.0/16"], 24, 26);
    p.headroom = 4;
    let first = decide_now(&p, &[], &[], 0, &[], Duration::ZERO);
    assert_eq!(carved(&first), ["10.0.0.0/24"]);
    let again = decide_now(&p, &[], &[], 0, &first.carves, Duration::from_secs(1));
    assert!(again.carves.is_empty(), "{:?}", again.carves);
    assert!(says(&again.status, CONDITION_SCALING));
}

#[test]
fn a_gated_child_counts_its_free_blocks() {
    let p = pool(&["10.0.0.0/16"], 24, 26);
    let mut c = child("10.0.0.0/24", 0, 4);
    c.accepting = false;
    let d = decide_now(&p, &[c], &[], 1, &[], Duration::ZERO);
    assert!(d.carves.is_empty(), "4 free >= 1 pending + 2 headroom");
    assert_eq!(condition(&d, CONDITION_READY).reason, REASON_PENDING);
}

#[test]
fn carves_avoid_occupied_ranges_and_other_children() {
    let mut p = pool(&["10.0.0.0/22"], 24, 26);
    p.headroom = 8;
    let occupied = [net("10.0.0.0/25"), net("10.0.2.7/32")];
    let children = [child("10.0.1.0/24", 4, 0)];
    let d = decide_now(&p, &children, &occupied, 0, &[], Duration::ZERO);
    assert_eq!(carved(&d), ["10.0.3.0/24"]);
    assert!(says(&d.status, CONDITION_EXHAUSTED));
    assert_eq!(
        condition(&d, CONDITION_EXHAUSTED).reason,
        REASON_BUDGET_EXHAUSTED
    );
}

#[test]
fn exhausted_needs_both_a_used_up_budget_and_a_shortage() {
    let mut p = pool(&["10.0.0.0/24"], 24, 26);
    p.headroom = 1;
    let full_budget_but_enough = [child("10.0.0.0/24", 1, 3)];
    let d = decide_now(&p, &full_budget_but_enough, &[], 0, &[], Duration::ZERO);
    assert!(!d.room);
    assert!(!says(&d.status, CONDITION_EXHAUSTED));
    let d = decide_now(&p, &full_budget_but_enough, &[], 3, &[], Duration::ZERO);
    assert!(says(&d.status, CONDITION_EXHAUSTED));
    assert!(d.turned_true.iter().any(|(t, _)| *t == CONDITION_EXHAUSTED));
}

#[test]
fn dual_stack_carves_both_families_in_lockstep() {
    let mut p = pool(&["10.0.0.0/23"], 24, 26);
    p.ipv6 = Some(PoolFamily {
        cidrs: vec![net("fd00::/63")],
        range_mask: 64,
        per_node_mask: 66,
    });
    p.headroom = 12;
    let d = decide_now(&p, &[], &[net("fd00::/64")], 0, &[], Duration::ZERO);
    // Two v4 ranges but one v6 range are free: one carve, then the budget is used up.
    assert_eq!(d.carves.len(), 1);
    assert_eq!(d.carves[0].ipv4, Some(net("10.0.0.0/24")));
    assert_eq!(d.carves[0].ipv6, Some(net("fd00:0:0:1::/64")));
    assert_eq!(d.carves[0].name, "pods-10-0-0-0-24");
    assert!(!d.room);
    assert!(says(&d.status, CONDITION_EXHAUSTED));
}

#[test]
fn empty_children_retire_after_empty_for_youngest_first_down_to_min() {
    let mut p = pool(&["10.0.0.0/16"], 24, 26);
    p.min = 1;
    p.headroom = 2;
    p.empty_for = Duration::from_secs(60);
    let children = [
        child("10.0.0.0/24", 0, 4),
        child("10.0.1.0/24", 0, 4),
        child("10.0.2.0/24", 0, 4),
    ];
    let early = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(59));
    assert!(early.retires.is_empty());
    let d = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(60));
    let names: Vec<&str> = d.retires.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["pods-10-0-2-0-24", "pods-10-0-1-0-24"]);
    assert_eq!(d.retires[0].uid.as_deref(), Some("uid-10.0.2.0/24"));
    assert!(says(&d.status, CONDITION_SCALING));
    let states: Vec<&str> = d.status.ranges.iter().map(|r| r.state.as_str()).collect();
    assert_eq!(states, [RANGE_ACTIVE, RANGE_RETIRING, RANGE_RETIRING]);
}

#[test]
fn a_lower_child_that_emptied_first_waits_for_the_higher_ones() {
    let mut p = pool(&["10.0.0.0/16"], 24, 26);
    p.min = 1;
    p.headroom = 0;
    p.empty_for = Duration::from_secs(60);
    let mut children = [
        child("10.0.0.0/24", 0, 4),
        child("10.0.1.0/24", 0, 4),
        child("10.0.2.0/24", 0, 4),
    ];
    children[1].empty_since = Some(Duration::from_secs(50));
    children[2].empty_since = Some(Duration::from_secs(50));
    let d = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(100));
    assert!(d.retires.is_empty(), "{:?}", d.retires);
    let d = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(110));
    let names: Vec<&str> = d.retires.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["pods-10-0-2-0-24", "pods-10-0-1-0-24"]);
    // A higher child that holds nodes does not keep the lower ones.
    children[2].held = true;
    children[2].empty_since = None;
    let d = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(110));
    let names: Vec<&str> = d.retires.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["pods-10-0-1-0-24", "pods-10-0-0-0-24"]);
}

#[test]
fn nothing_retires_while_a_node_waits_or_below_the_headroom() {
    let mut p = pool(&["10.0.0.0/16"], 24, 26);
    p.min = 0;
    p.headroom = 4;
    p.empty_for = Duration::ZERO;
    let children = [child("10.0.0.0/24", 4, 0), child("10.0.1.0/24", 0, 4)];
    let d = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(1));
    assert!(d.retires.is_empty(), "its 4 free blocks are the headroom");
    p.headroom = 0;
    let d = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(1));
    assert_eq!(d.retires.len(), 1);
    let children = [child("10.0.0.0/24", 0, 4), child("10.0.1.0/24", 0, 4)];
    let d = decide_now(&p, &children, &[], 1, &[], Duration::from_secs(1));
    assert!(d.retires.is_empty(), "a node waits");
}

#[test]
fn a_deleting_or_invalid_pool_carves_and_retires_nothing() {
    let mut p = pool(&["10.0.0.0/16"], 24, 26);
    p.deleting = true;
    let d = decide_now(&p, &[], &[], 5, &[], Duration::ZERO);
    assert!(d.carves.is_empty());
    assert_eq!(condition(&d, CONDITION_READY).reason, REASON_TERMINATING);
    let mut p = pool(&["10.0.0.0/16"], 24, 26);
    p.invalid = Some("bad".into());
    let d = decide_now(&p, &[], &[], 5, &[], Duration::ZERO);
    assert!(d.carves.is_empty());
    assert_eq!(condition(&d, CONDITION_READY).reason, REASON_INVALID);
}

#[test]
fn status_counts_per_family() {
    let p = pool(&["10.0.0.0/22"], 24, 26);
    let mut gone = child("10.0.2.0/24", 1, 3);
    gone.deleting = true;
    let children = [child("10.0.0.0/24", 3, 1), child("10.0.1.0/24", 2, 2), gone];
    let d = decide_now(&p, &children, &[], 0, &[], Duration::ZERO);
    assert_eq!(
        d.status.ipv4,
        Some(PoolFamilyStatus {
            ranges: 2,
            capacity: 8,
            allocated: 5,
            budget_blocks: 16,
        })
    );
    let states: Vec<&str> = d.status.ranges.iter().map(|r| r.state.as_str()).collect();
    assert_eq!(states, [RANGE_ACTIVE, RANGE_ACTIVE, RANGE_DRAINING]);
    assert!(says(&d.status, CONDITION_READY));
}

#[test]
fn transition_times_move_only_on_flips() {
    let p = pool(&["10.0.0.0/16"], 24, 26);
    let children = [child("10.0.0.0/24", 1, 3)];
    let w = PoolWorld {
        pool: &p,
        children: &children,
        occupied: &[],
        pending: 0,
        in_flight: &[],
        demand: 0,
        now: Duration::ZERO,
    };
    let first = decide(&w, &[], &wall());
    let later = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_999).expect("time"));
    let second = decide(&w, &first.status.conditions, &later);
    assert_eq!(first.status, second.status);
    assert!(second.turned_true.is_empty());
}

proptest! {
    /// Whatever is occupied and however many nodes wait: carves overlap nothing occupied,
    /// no child and no other carve, lie inside the budget, and never take the pool past max.
    #[test]
    fn carves_are_disjoint_inside_the_budget_and_bounded(
        budget in proptest::collection::vec((0u32..64, 20u8..=24), 1..3),
        range_mask in 22u8..=26,
        occupied in proptest::collection::vec((0u32..(1 << 14), 20u8..=30), 0..8),
        existing in proptest::collection::vec(0u32..64, 0..4),
        pending in 0u64..200,
        headroom in 0u64..64,
        max in 0u32..12,
        min in 0u32..4,
    ) {
        let to_net = |addr: u32, len: u8| {
            IpNet::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | addr)), len).expect("net").trunc()
        };
        let budget: Vec<IpNet> = budget.iter().map(|(a, l)| to_net(a << 10, *l)).collect();
        let occupied: Vec<IpNet> = occupied.iter().map(|(a, l)| to_net(a << 6, *l)).collect();
        let mut p = pool(&[], range_mask, 28);
        if let Some(f) = p.ipv4.as_mut() {
            f.cidrs = budget.clone();
        }
        p.headroom = headroom;
        p.max = max;
        p.min = min;
        // Existing children: free ranges of the budget, as a previous decision carved them.
        let mut children = Vec::new();
        let mut taken = occupied.clone();
        for _ in &existing {
            if let Some(r) = lowest_free(&budget, range_mask, &taken) {
                taken.push(r);
                children.push(child(&r.to_string(), 1, 3));
            }
        }
        let d = decide_now(&p, &children, &occupied, pending, &[], Duration::ZERO);
        let carved: Vec<IpNet> = d.carves.iter().flat_map(Carve::ranges).collect();
        for (i, c) in carved.iter().enumerate() {
            prop_assert_eq!(c.prefix_len(), range_mask);
            prop_assert!(budget.iter().any(|b| b.contains(c)), "{} outside {:?}", c, budget);
            for o in &occupied {
                prop_assert!(!overlaps(c, o), "{} overlaps occupied {}", c, o);
            }
            for ch in &children {
                prop_assert!(!ch.ranges().any(|r| overlaps(c, &r)), "{} overlaps a child", c);
            }
            for other in &carved[i + 1..] {
                prop_assert!(!overlaps(c, other), "{} carved twice", c);
            }
        }
        let total = children.len() + d.carves.len();
        prop_assert!(d.carves.is_empty() || total <= max as usize, "{} > max {}", total, max);
        let names: std::collections::BTreeSet<&str> =
            d.carves.iter().map(|c| c.name.as_str()).collect();
        prop_assert_eq!(names.len(), d.carves.len());
    }
}

/// The spec of a v4 pool over 10.64.0.0/16 carving /20 ranges of /24 blocks, with the
/// defaults elsewhere.
fn v4_pool_spec() -> nodeipam_crd::pool::NodeIPAMPoolSpec {
    use nodeipam_crd::pool::{
        NodeIPAMPoolSpec, PoolFamilySpec, PoolHeadroom, PoolRanges, PoolScaleDown,
    };
    NodeIPAMPoolSpec {
        ipv4: Some(PoolFamilySpec {
            cidrs: vec!["10.64.0.0/16".into()],
            range_mask_size: 20,
            per_node_mask_size: 24,
        }),
        ipv6: None,
        node_selector: None,
        ranges: PoolRanges::default(),
        headroom: PoolHeadroom::default(),
        scale_down: PoolScaleDown::default(),
    }
}

#[test]
fn the_api_object_maps_to_the_decisions_input() {
    use nodeipam_crd::pool::{PoolHeadroom, PoolRanges, PoolScaleDown};
    let spec = nodeipam_crd::pool::NodeIPAMPoolSpec {
        ranges: PoolRanges { min: 2, max: 8 },
        headroom: PoolHeadroom { blocks: 4 },
        scale_down: PoolScaleDown {
            empty_for: "1m30s".into(),
        },
        ..v4_pool_spec()
    };
    let mut obj = NodeIPAMPool::new("pods", spec);
    obj.metadata.uid = Some("u".into());
    let p = pool_input(&obj);
    assert_eq!(p.invalid, None);
    assert_eq!((p.min, p.max, p.headroom), (2, 8, 4));
    assert_eq!(p.empty_for, Duration::from_secs(90));
    assert_eq!(p.blocks_per_range(), 16);
    assert_eq!(p.uid.as_deref(), Some("u"));
    obj.spec.ranges.min = 9;
    let p = pool_input(&obj);
    assert!(p.invalid.is_some());
    assert_eq!(
        p.budget().copied().collect::<Vec<_>>(),
        [net("10.64.0.0/16")],
        "an invalid pool still claims its budget"
    );
    let d = decide_now(&p, &[], &[], 3, &[], Duration::ZERO);
    assert!(d.carves.is_empty());
}

/// A pool whose name cannot be its children's label value carves nothing, however many nodes
/// wait, and says why in Ready, naming metadata.name: every create of a child would be refused.
#[test]
fn a_pool_named_longer_than_a_label_value_is_invalid_and_carves_nothing() {
    let spec = v4_pool_spec();
    let fits = pool_input(&NodeIPAMPool::new(&"p".repeat(63), spec.clone()));
    assert_eq!(fits.invalid, None);
    assert!(
        !decide_now(&fits, &[], &[], 3, &[], Duration::ZERO)
            .carves
            .is_empty()
    );
    let long = pool_input(&NodeIPAMPool::new(&"p".repeat(64), spec));
    let why = long.invalid.clone().expect("invalid");
    assert!(why.starts_with("metadata.name: Invalid value"), "{why}");
    let d = decide_now(&long, &[], &[], 3, &[], Duration::ZERO);
    assert!(d.carves.is_empty());
    let ready = condition(&d, CONDITION_READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", REASON_INVALID)
    );
    assert!(ready.message.contains("at most 63"), "{}", ready.message);
}

/// Within max (the enabled and the awaiting children, and the carves in flight, together),
/// every awaiting child is enabled, at the version the decision saw it at; its blocks count as
/// supply that will come, so nothing more is carved for them.
#[test]
fn within_max_every_awaiting_child_is_enabled_at_the_version_seen() {
    let mut p = pool(&["10.0.0.0/22"], 24, 26);
    p.max = 3;
    let children = [
        child("10.0.0.0/24", 4, 0),
        awaiting("10.0.1.0/24", 4),
        awaiting("10.0.2.0/24", 4),
    ];
    let d = decide_now(&p, &children, &[], 0, &[], Duration::ZERO);
    let enabled: Vec<(&str, Option<&str>)> = d
        .enables
        .iter()
        .map(|e| (e.name.as_str(), e.resource_version.as_deref()))
        .collect();
    assert_eq!(
        enabled,
        vec![
            ("pods-10-0-1-0-24", Some("rv-10.0.1.0/24")),
            ("pods-10-0-2-0-24", Some("rv-10.0.2.0/24")),
        ]
    );
    assert!(d.retires.is_empty());
    assert!(d.carves.is_empty(), "the awaiting blocks are supply: {d:?}");
    let states: Vec<&str> = d.status.ranges.iter().map(|r| r.state.as_str()).collect();
    assert_eq!(states, vec!["Active", "Enabling", "Enabling"]);
    assert!(says(&d.status, CONDITION_SCALING));
}

/// Over max (a create landed late): awaiting children beyond max are retired, highest range
/// first, never an enabled one, and nothing is enabled or carved while over.
#[test]
fn over_max_the_highest_awaiting_children_retire_and_none_is_enabled() {
    let mut p = pool(&["10.0.0.0/21"], 24, 26);
    p.max = 3;
    p.headroom = 100;
    let children = [
        awaiting("10.0.0.0/24", 4),
        child("10.0.1.0/24", 0, 4),
        awaiting("10.0.2.0/24", 4),
        child("10.0.3.0/24", 0, 4),
        awaiting("10.0.4.0/24", 4),
    ];
    let d = decide_now(&p, &children, &[], 3, &[], Duration::from_secs(7200));
    let retired: Vec<(&str, bool)> = d
        .retires
        .iter()
        .map(|r| (r.name.as_str(), r.over_max))
        .collect();
    assert_eq!(
        retired,
        vec![("pods-10-0-4-0-24", true), ("pods-10-0-2-0-24", true)]
    );
    assert!(d.enables.is_empty(), "nothing enabled while over max");
    assert!(d.carves.is_empty());
    // Never an enabled child, even when the awaiting ones do not bring it down to max.
    let children = [
        child("10.0.0.0/24", 1, 3),
        child("10.0.1.0/24", 0, 4),
        child("10.0.2.0/24", 0, 4),
        awaiting("10.0.3.0/24", 4),
        child("10.0.4.0/24", 0, 4),
    ];
    let d = decide_now(&p, &children, &[], 0, &[], Duration::from_secs(7200));
    let retired: Vec<&str> = d.retires.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(retired, vec!["pods-10-0-3-0-24"]);
    assert!(d.enables.is_empty());
}

/// A carve in flight lands awaiting: it counts, so an awaiting child is not enabled when it
/// and the carve together pass max.
#[test]
fn a_carve_in_flight_counts_before_an_awaiting_child_is_enabled() {
    let mut p = pool(&["10.0.0.0/22"], 24, 26);
    p.max = 2;
    let children = [child("10.0.0.0/24", 4, 0), awaiting("10.0.1.0/24", 4)];
    let in_flight = [Carve {
        name: "pods-10-0-2-0-24".into(),
        ipv4: Some(net("10.0.2.0/24")),
        ipv6: None,
    }];
    let d = decide_now(&p, &children, &[], 0, &in_flight, Duration::ZERO);
    assert!(d.enables.is_empty(), "{d:?}");
    assert_eq!(d.retires.len(), 1);
    assert!(d.retires[0].over_max);
    // A user-disabled child (no marker) is neither counted nor enabled.
    let mut user_disabled = child("10.0.1.0/24", 0, 4);
    user_disabled.enabled = false;
    let children = [child("10.0.0.0/24", 4, 0), user_disabled];
    let d = decide_now(&p, &children, &[], 0, &[], Duration::ZERO);
    assert!(d.enables.is_empty());
    assert!(d.retires.is_empty());
    assert_eq!(carved(&d), vec!["10.0.2.0/24"]);
}
