//! Tests of the allocation state: selection wiring, atomic dual-stack, adoption, release paths
//! and the no-overlap invariant under random operations.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn config(name: &str, created: i64, v4: Option<(&str, u8)>, v6: Option<(&str, u8)>) -> ConfigInput {
    ConfigInput {
        name: name.into(),
        created,
        ipv4: v4.map(|(c, m)| (net(c), m)),
        ipv6: v6.map(|(c, m)| (net(c), m)),
        selector: None,
        enabled: true,
        awaiting: false,
        deleting: false,
        invalid: None,
        gate: None,
        provisional: false,
        pool: None,
    }
}

fn no_labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// No two nodes (or leaks) hold overlapping CIDRs, except pairs adopted as they were.
fn assert_no_overlap(ipam: &Ipam, adopted_conflicts_allowed: bool) {
    let held: Vec<(IpNet, String)> = ipam
        .holders()
        .flat_map(|(c, hs)| {
            hs.iter().filter_map(move |h| match h {
                Holder::Node(n) | Holder::Leaked(n) => Some((*c, n.clone())),
                Holder::Service(_) => None,
            })
        })
        .collect();
    for (i, (a, na)) in held.iter().enumerate() {
        for (b, nb) in &held[i + 1..] {
            if nets_overlap(a, b) && na != nb {
                assert!(
                    adopted_conflicts_allowed,
                    "{na} holds {a} and {nb} holds {b}: overlap"
                );
            }
        }
    }
}

#[test]
fn dual_stack_gives_one_block_per_family_ipv4_first() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config(
        "ds",
        1,
        Some(("10.0.0.0/16", 24)),
        Some(("fd00::/48", 64)),
    ));
    let a = ipam
        .allocate("n1", Some("u1"), &no_labels())
        .expect("allocates");
    assert_eq!(a.config, "ds");
    assert_eq!(a.cidrs.len(), 2);
    assert!(matches!(a.cidrs[0], IpNet::V4(_)) && matches!(a.cidrs[1], IpNet::V6(_)));
    assert_eq!(a.cidrs[0].prefix_len(), 24);
    assert_eq!(a.cidrs[1].prefix_len(), 64);
    let b = ipam
        .allocate("n2", Some("u2"), &no_labels())
        .expect("allocates");
    assert_ne!(a.cidrs[0], b.cidrs[0]);
    assert_ne!(a.cidrs[1], b.cidrs[1]);
    assert_eq!(
        ipam.allocate("n1", None, &no_labels()),
        Err(AllocateError::AlreadyHolds)
    );
    // Chosen, not yet written: not served, so neither nodes nor allocated blocks yet.
    let facts = ipam.config_facts("ds").expect("facts");
    assert_eq!((facts.nodes, facts.writing), (0, 2));
    assert_eq!(facts.ipv4.map(|f| f.allocated), Some(0));
    assert!(facts.held(), "still held: the writes are on their way");
    assert!(ipam.confirm("n1", a.ticket, Some("u1")));
    assert!(ipam.confirm("n2", b.ticket, Some("u2")));
    let facts = ipam.config_facts("ds").expect("facts");
    assert_eq!((facts.nodes, facts.writing), (2, 0));
    assert_eq!(facts.ipv4.map(|f| f.allocated), Some(2));
    assert_eq!(
        facts.ipv6.map(|f| (f.allocated, f.capacity)),
        Some((2, 65536))
    );
}

#[test]
fn facts_count_each_node_once_and_sample_the_smallest_names() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config(
        "ds",
        1,
        Some(("10.0.0.0/16", 24)),
        Some(("fd00::/48", 64)),
    ));
    // Out of order, so the sample cannot just be the insertion order.
    let names = ["n7", "n2", "n9", "n0", "n5", "n3", "n8", "n1"];
    for (i, n) in names.iter().enumerate() {
        let a = ipam
            .allocate(n, Some(&format!("u{n}")), &no_labels())
            .expect("allocates");
        // Every other node's write has landed; the rest are still being written.
        if i % 2 == 0 {
            assert!(ipam.confirm(n, a.ticket, Some(&format!("u{n}"))));
        }
    }
    let facts = ipam.config_facts("ds").expect("facts");
    assert_eq!(
        facts.nodes, 4,
        "two blocks per node, counted once; only the landed ones"
    );
    assert_eq!(facts.writing, 4);
    // Those being written are named too: they hold the config as much.
    assert_eq!(facts.sample_nodes, vec!["n0", "n1", "n2", "n3", "n5"]);
    assert_eq!(facts.ipv4.map(|f| f.allocated), Some(4));
    assert_eq!(facts.ipv6.map(|f| f.allocated), Some(4));
}

#[test]
fn second_family_failure_returns_the_first_block_and_tries_the_next_config() {
    let mut ipam = Ipam::new();
    // "tight" has two IPv4 blocks but one IPv6 block; it is preferred (fewer free blocks).
    ipam.upsert_config(config(
        "tight",
        1,
        Some(("10.0.0.0/23", 24)),
        Some(("fd00::/64", 64)),
    ));
    ipam.upsert_config(config(
        "roomy",
        2,
        Some(("10.1.0.0/16", 24)),
        Some(("fd01::/48", 64)),
    ));
    let first = ipam.allocate("n1", None, &no_labels()).expect("allocates");
    assert_eq!(first.config, "tight");
    // tight's IPv6 is now exhausted, so its free count is 0 and it is skipped outright; force the
    // atomic path by checking the v4 count did not move on a failed take.
    assert_eq!(ipam.take_blocks("tight"), None);
    let facts = ipam.config_facts("tight").expect("facts");
    assert_eq!(
        facts.ipv4.map(|f| f.free),
        Some(1),
        "the IPv4 block taken before the IPv6 failure went back"
    );
    let second = ipam.allocate("n2", None, &no_labels()).expect("allocates");
    assert_eq!(second.config, "roomy");
}

/// A selector of the nodes that carry label `key`.
fn exists(key: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![k8s_openapi::api::core::v1::NodeSelectorTerm {
            match_expressions: Some(vec![k8s_openapi::api::core::v1::NodeSelectorRequirement {
                key: key.into(),
                operator: "Exists".into(),
                values: None,
            }]),
            match_fields: None,
        }],
    }
}

#[test]
fn exhausted_configs_report_no_capacity_and_unmatched_nodes_no_match() {
    let mut ipam = Ipam::new();
    let mut sel = config("gpu", 1, Some(("10.0.0.0/24", 24)), None);
    sel.selector = Some(exists("gpu"));
    ipam.upsert_config(sel);
    assert_eq!(
        ipam.allocate("plain", None, &no_labels()),
        Err(AllocateError::NoMatchingConfig)
    );
    let gpu: BTreeMap<String, String> = [("gpu".to_string(), "1".to_string())].into();
    ipam.allocate("g1", None, &gpu).expect("one block");
    match ipam.allocate("g2", None, &gpu) {
        Err(AllocateError::NoCapacity { considered }) => {
            assert!(considered.contains("gpu (exhausted)"), "{considered}")
        }
        other => panic!("expected NoCapacity, got {other:?}"),
    }
}

/// A config whose selector matches a node better than any open config holds the node while
/// only a gate (our finalizer, the publication) keeps it shut: the user's selector says where
/// the node belongs, so it does not fall through to a catch-all in the meantime. An exhausted
/// better config still lets it fall through, and an equal match never waits.
#[test]
fn a_gated_config_that_matches_better_holds_the_node_until_it_opens() {
    let mut ipam = Ipam::new();
    let mut gpu = config("gpu", 1, Some(("10.90.0.0/26", 26)), None);
    gpu.selector = Some(exists("gpu"));
    let open_gpu = gpu.clone();
    gpu.gate = Some("waiting for the nodeipam.io/finalizer finalizer".into());
    ipam.upsert_config(gpu);
    ipam.upsert_config(config("general", 1, Some(("10.80.0.0/16", 24)), None));
    let labels: BTreeMap<String, String> = [("gpu".to_string(), "1".to_string())].into();
    match ipam.allocate("g1", None, &labels) {
        Err(AllocateError::Waiting { waiting }) => {
            assert!(
                waiting.contains("gpu (waiting for the nodeipam.io/finalizer"),
                "{waiting}"
            )
        }
        other => panic!("g1 waits for gpu, got {other:?}"),
    }
    // A node gpu does not select is not held back by it.
    let plain = ipam.allocate("plain", None, &no_labels()).expect("general");
    assert_eq!(plain.config, "general");
    ipam.upsert_config(open_gpu);
    assert_eq!(
        ipam.allocate("g1", None, &labels).expect("opened").config,
        "gpu"
    );
    // gpu now holds its one block: g2 falls through to general.
    assert_eq!(
        ipam.allocate("g2", None, &labels)
            .expect("falls through")
            .config,
        "general"
    );
    // An equally good gated config does not hold the node: general2 is shut, general open.
    let mut shut = config("general2", 1, Some(("10.81.0.0/16", 24)), None);
    shut.gate = Some("waiting until the pod network includes it".into());
    ipam.upsert_config(shut);
    assert_eq!(
        ipam.allocate("plain2", None, &no_labels())
            .expect("general")
            .config,
        "general"
    );
}

#[test]
fn service_cidrs_are_never_handed_out() {
    let mut ipam = Ipam::new();
    ipam.set_service_cidrs("kubernetes", vec![net("10.0.1.0/24"), net("10.0.2.128/25")]);
    ipam.upsert_config(config("c", 1, Some(("10.0.0.0/22", 24)), None));
    let mut got = Vec::new();
    while let Ok(a) = ipam.allocate(&format!("n{}", got.len()), None, &no_labels()) {
        assert!(ipam.confirm(&format!("n{}", got.len()), a.ticket, None));
        got.extend(a.cidrs);
    }
    got.sort();
    assert_eq!(got, vec![net("10.0.0.0/24"), net("10.0.3.0/24")]);
    // Removing the Service range frees its blocks.
    ipam.set_service_cidrs("kubernetes", vec![]);
    let a = ipam
        .allocate("late", None, &no_labels())
        .expect("freed by the Service range going away");
    assert!(a.cidrs[0] == net("10.0.1.0/24") || a.cidrs[0] == net("10.0.2.0/24"));
    assert!(ipam.confirm("late", a.ticket, None));
    let facts = ipam.config_facts("c").expect("facts");
    assert_eq!(facts.ipv4.map(|f| f.allocated), Some(3));
}

#[test]
fn adoption_reports_unmanaged_and_conflicts_and_keeps_shared_bits() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("c", 1, Some(("10.0.0.0/22", 24)), None));
    let a = ipam.observe_node("a", Some("ua"), &[net("10.0.0.0/23")]);
    assert!(a.unmanaged.is_empty() && a.conflicts.is_empty());
    let b = ipam.observe_node("b", Some("ub"), &[net("10.0.1.0/24")]);
    assert_eq!(
        b.conflicts,
        vec![("a".to_string(), net("10.0.1.0/24"), net("10.0.0.0/23"))]
    );
    let out = ipam.observe_node("out", Some("uo"), &[net("192.168.7.0/24")]);
    assert_eq!(out.unmanaged, vec![net("192.168.7.0/24")]);
    assert_eq!(
        ipam.unmanaged(),
        vec![(net("192.168.7.0/24"), "out".to_string())]
    );
    // a covers two blocks, b one of them: two allocated.
    assert_eq!(
        ipam.config_facts("c")
            .and_then(|f| f.ipv4)
            .map(|f| f.allocated),
        Some(2)
    );
    // Releasing a must keep b's block occupied.
    assert_eq!(ipam.node_gone("a", Some("ua")), vec![net("10.0.0.0/23")]);
    let mut got = Vec::new();
    while let Ok(x) = ipam.allocate(&format!("n{}", got.len()), None, &no_labels()) {
        got.extend(x.cidrs);
    }
    assert!(
        !got.contains(&net("10.0.1.0/24")),
        "b's block was handed out: {got:?}"
    );
    assert_eq!(got.len(), 3);
    assert_no_overlap(&ipam, false);
}

#[test]
fn adopting_a_config_later_counts_existing_nodes() {
    let mut ipam = Ipam::new();
    ipam.observe_node("old", None, &[net("10.5.3.0/24")]);
    assert_eq!(ipam.unmanaged().len(), 1);
    ipam.upsert_config(config("c", 1, Some(("10.5.0.0/16", 24)), None));
    assert!(ipam.unmanaged().is_empty());
    let facts = ipam.config_facts("c").expect("facts");
    assert_eq!((facts.nodes, facts.ipv4.map(|f| f.allocated)), (1, Some(1)));
    for i in 0..255 {
        let a = ipam
            .allocate(&format!("n{i}"), None, &no_labels())
            .expect("room");
        assert_ne!(a.cidrs[0], net("10.5.3.0/24"));
    }
}

#[test]
fn write_outcomes() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("c", 1, Some(("10.0.0.0/23", 24)), None));
    // Definite failure frees the block.
    let a = ipam.allocate("a", Some("ua"), &no_labels()).expect("block");
    assert_eq!(
        ipam.abandon("a", a.ticket + 99),
        Vec::<IpNet>::new(),
        "stale ticket does nothing"
    );
    assert_eq!(ipam.abandon("a", a.ticket), a.cidrs);
    assert!(ipam.node("a").is_none());
    // Ambiguous failure with the node gone: the block stays occupied.
    let b = ipam.allocate("b", Some("ub"), &no_labels()).expect("block");
    assert_eq!(ipam.leak("b", b.ticket), b.cidrs);
    assert_eq!(
        ipam.config_facts("c")
            .and_then(|f| f.ipv4)
            .map(|f| (f.allocated, f.free)),
        Some((1, 1))
    );
    // Confirmed writes are held; deletion while writing releases on confirmation.
    let c = ipam.allocate("c", Some("uc"), &no_labels()).expect("block");
    assert!(
        ipam.node_gone("c", Some("uc")).is_empty(),
        "still writing: the outcome decides"
    );
    assert!(ipam.confirm("c", c.ticket, Some("uc")));
    assert!(
        ipam.node("c").is_none(),
        "landed on the deleted object, so released"
    );
    let d = ipam.allocate("d", Some("ud"), &no_labels()).expect("block");
    assert!(ipam.confirm("d", d.ticket, Some("ud")));
    assert_eq!(ipam.node("d").map(|r| r.phase), Some(Phase::Held));
    assert!(
        ipam.node_gone("d", Some("other-uid")).is_empty(),
        "a different object of the same name"
    );
    assert_eq!(ipam.node_gone("d", Some("ud")), d.cidrs);
}

#[test]
fn observing_other_cidrs_replaces_a_pending_choice() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("c", 1, Some(("10.0.0.0/16", 24)), None));
    let a = ipam.allocate("a", None, &no_labels()).expect("block");
    let seen = ipam.observe_node("a", None, &[net("10.0.200.0/24")]);
    assert_eq!(seen.released, a.cidrs);
    assert!(
        !ipam.confirm("a", a.ticket, None),
        "the old ticket is stale"
    );
    assert_eq!(
        ipam.node("a").map(|r| r.cidrs.clone()),
        Some(vec![net("10.0.200.0/24")])
    );
}

#[test]
fn overlapping_configs_younger_one_allocates_nothing() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("old", 1, Some(("10.0.0.0/24", 24)), None));
    ipam.upsert_config(config("new", 2, Some(("10.0.0.0/16", 24)), None));
    let facts = ipam.config_facts("new").expect("facts");
    assert!(
        facts
            .overlap
            .is_some_and(|m| m.contains("older NodeIPAMConfig old"))
    );
    assert!(!facts.accepting);
    ipam.allocate("a", None, &no_labels()).expect("from old");
    assert!(
        ipam.allocate("b", None, &no_labels()).is_err(),
        "new must not allocate while overlapping"
    );
    // Once old is gone, new allocates but never a's block.
    ipam.remove_config("old");
    let b = ipam.allocate("b", None, &no_labels()).expect("from new");
    assert_eq!(b.config, "new");
    assert_ne!(b.cidrs[0], net("10.0.0.0/24"));
    assert_eq!(ipam.owner_of(&net("10.0.0.0/24")), Some("new"));
}

#[test]
fn disabled_and_deleting_configs_stop_allocating_and_keep_counts() {
    let mut ipam = Ipam::new();
    let mut c = config("c", 1, Some(("10.0.0.0/16", 24)), None);
    ipam.upsert_config(c.clone());
    let a = ipam.allocate("a", None, &no_labels()).expect("block");
    c.enabled = false;
    ipam.upsert_config(c.clone());
    assert!(ipam.allocate("b", None, &no_labels()).is_err());
    let facts = ipam.config_facts("c").expect("facts");
    assert_eq!((facts.accepting, facts.nodes, facts.writing), (false, 0, 1));
    c.enabled = true;
    c.deleting = true;
    ipam.upsert_config(c);
    assert!(ipam.allocate("b", None, &no_labels()).is_err());
    assert!(ipam.confirm("a", a.ticket, None));
    ipam.node_gone("a", None);
    assert_eq!(ipam.config_facts("c").map(|f| f.nodes), Some(0));
}

#[test]
fn invalid_specs_are_reported_not_used() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("bad", 1, Some(("10.0.0.0/16", 8)), None));
    let facts = ipam.config_facts("bad").expect("facts");
    assert!(facts.invalid.is_some());
    assert!(!facts.accepting);
    assert_eq!(
        ipam.allocate("a", None, &no_labels()),
        Err(AllocateError::NoCapacity {
            considered: format!("bad (invalid: {})", facts.invalid.unwrap_or_default())
        })
    );
}

#[test]
fn blocks_covered_counts_each_block_once() {
    let r = net("10.0.0.0/16");
    assert_eq!(
        blocks_covered(
            r,
            24,
            &[net("10.0.0.0/24"), net("10.0.0.0/25"), net("10.0.0.128/26")]
        ),
        1
    );
    assert_eq!(blocks_covered(r, 24, &[net("10.0.0.0/22")]), 4);
    assert_eq!(
        blocks_covered(r, 24, &[net("10.0.0.0/8")]),
        256,
        "clipped to the range"
    );
    assert_eq!(
        blocks_covered(
            r,
            24,
            &[net("10.0.0.0/26"), net("10.0.0.192/26"), net("10.0.1.0/24")]
        ),
        2
    );
}

#[derive(Clone, Debug)]
enum Op {
    Allocate(u8),
    Confirm(u8),
    Abandon(u8),
    Leak(u8),
    Gone(u8),
    Adopt(u8, u8, u8),
    /// Sets the Service ranges of one source (0..2) to one of a few lists; setting the same
    /// list again is what an update or a relist of a ServiceCIDR does.
    Service(u8, u8),
    Toggle(u8),
}

fn service_ranges(variant: u8) -> Vec<IpNet> {
    match variant {
        0 => vec![],
        1 => vec![net("10.0.1.0/24")],
        2 => vec![net("10.0.1.0/24"), net("fd00::1:0:0:0/64")],
        _ => vec![net("10.0.2.128/25"), net("10.0.3.0/24")],
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24).prop_map(Op::Allocate),
        2 => (0u8..24).prop_map(Op::Confirm),
        1 => (0u8..24).prop_map(Op::Abandon),
        1 => (0u8..24).prop_map(Op::Leak),
        2 => (0u8..24).prop_map(Op::Gone),
        1 => (24u8..32, 0u8..16, 22u8..27).prop_map(|(n, b, l)| Op::Adopt(n, b, l)),
        2 => (0u8..2, 0u8..4).prop_map(|(s, v)| Op::Service(s, v)),
        1 => (0u8..4).prop_map(Op::Toggle),
    ]
}

proptest! {
    /// Whatever happens, no block handed out by the allocator overlaps anything else held.
    #[test]
    fn allocations_never_overlap(ops in proptest::collection::vec(op(), 1..120)) {
        let mut ipam = Ipam::new();
        let mut configs = vec![
            config("a", 1, Some(("10.0.0.0/22", 24)), Some(("fd00::/62", 64))),
            config("b", 2, Some(("10.0.2.0/23", 25)), None),
            config("c", 3, None, Some(("fd00::/60", 64))),
        ];
        for c in &configs { ipam.upsert_config(c.clone()); }
        let mut tickets: HashMap<String, u64> = HashMap::new();
        let mut adopted_conflict = false;
        let mut services: BTreeMap<u8, Vec<IpNet>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Allocate(n) => {
                    if let Ok(a) = ipam.allocate(&format!("n{n}"), None, &no_labels()) {
                        // Fresh blocks never overlap anything already held by someone else.
                        for c in &a.cidrs {
                            for (h, hs) in ipam.holders() {
                                if nets_overlap(c, h) {
                                    prop_assert!(hs.iter().all(|x| *x == Holder::Node(format!("n{n}"))), "{c} overlaps {h} held by {hs:?}");
                                }
                            }
                        }
                        // Nor any Service range, however often its source was updated or
                        // relisted (the model, not the holders, says what the ranges are).
                        for c in &a.cidrs {
                            for svc in services.values().flatten() {
                                prop_assert!(!nets_overlap(c, svc), "{c} overlaps Service range {svc}");
                            }
                        }
                        tickets.insert(format!("n{n}"), a.ticket);
                    }
                }
                Op::Confirm(n) => { if let Some(t) = tickets.get(&format!("n{n}")) { ipam.confirm(&format!("n{n}"), *t, None); } }
                Op::Abandon(n) => { if let Some(t) = tickets.get(&format!("n{n}")) { ipam.abandon(&format!("n{n}"), *t); } }
                Op::Leak(n) => { if let Some(t) = tickets.get(&format!("n{n}")) { ipam.leak(&format!("n{n}"), *t); } }
                Op::Gone(n) => { ipam.node_gone(&format!("n{n}"), None); }
                Op::Adopt(n, b, l) => {
                    let base = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + (u32::from(b) << 8);
                    let c = IpNet::new(IpAddr::V4(base.into()), l).expect("valid").trunc();
                    if !ipam.observe_node(&format!("n{n}"), None, &[c]).conflicts.is_empty() { adopted_conflict = true; }
                }
                Op::Service(source, variant) => {
                    ipam.set_service_cidrs(&format!("svc-{source}"), service_ranges(variant));
                    services.insert(source, service_ranges(variant));
                }
                Op::Toggle(3) => {
                    // Remove or restore the oldest config, so the overlapping younger ones
                    // start (or stop) allocating around blocks it handed out.
                    if ipam.config_names().any(|n| n == "a") { ipam.remove_config("a"); } else { ipam.upsert_config(configs[0].clone()); }
                }
                Op::Toggle(i) => {
                    let c = &mut configs[usize::from(i)];
                    c.enabled = !c.enabled;
                    ipam.upsert_config(c.clone());
                }
            }
            assert_no_overlap(&ipam, adopted_conflict);
            // Each config's facts agree with a recount of the holders: the blocks held (by
            // nodes or leaks) in its range that no older config's range contains, and the nodes
            // holding them.
            // The running count of writes on their way is the count of their records.
            let writing = ipam.node_names()
                .filter(|n| matches!(ipam.node(n).map(|r| r.phase), Some(Phase::Writing { .. })))
                .count();
            prop_assert_eq!(ipam.writing(), writing);
            for c in &configs {
                let Some(facts) = ipam.config_facts(&c.name) else { continue };
                let older: Vec<IpNet> = configs.iter()
                    .filter(|o| o.created < c.created && ipam.config_names().any(|n| n == o.name))
                    .flat_map(|o| o.ipv4.iter().chain(o.ipv6.iter()).map(|(r, _)| *r))
                    .collect();
                for (fam, range) in [(facts.ipv4, c.ipv4), (facts.ipv6, c.ipv6)] {
                    if let (Some(f), Some((r, m))) = (fam, range) {
                        // Landed: a leak, or a node whose write was confirmed.
                        let landed = |x: &Holder| match x {
                            Holder::Leaked(_) => true,
                            Holder::Node(n) => !matches!(ipam.node(n).map(|r| r.phase), Some(Phase::Writing { .. })),
                            Holder::Service(_) => false,
                        };
                        let held: Vec<IpNet> = ipam.holders()
                            .filter(|(h, hs)| nets_overlap(h, &r) && hs.iter().any(landed))
                            .filter(|(h, _)| !older.iter().any(|o| o.contains(*h)))
                            .map(|(h, _)| *h).collect();
                        prop_assert_eq!(f.allocated, blocks_covered(r, m, &held));
                        prop_assert!(f.free + f.allocated <= f.capacity);
                    }
                }
                // Nodes, writers and the sample agree with a plain set of names: the nodes
                // holding a block of this config's that no older config's range contains.
                let ranges: Vec<IpNet> = c.ipv4.iter().chain(c.ipv6.iter()).map(|(r, _)| *r).collect();
                let names: BTreeSet<&str> = ipam.holders()
                    .filter(|(h, _)| ranges.iter().any(|r| nets_overlap(h, r)))
                    .filter(|(h, _)| !older.iter().any(|o| o.contains(*h)))
                    .flat_map(|(_, hs)| hs.iter())
                    .filter_map(|x| match x { Holder::Node(n) => Some(n.as_str()), _ => None })
                    .collect();
                let writing = names.iter()
                    .filter(|n| matches!(ipam.node(n).map(|r| r.phase), Some(Phase::Writing { .. })))
                    .count();
                prop_assert_eq!(facts.nodes, (names.len() - writing) as u64);
                prop_assert_eq!(facts.writing, writing as u64);
                let sample: Vec<String> = names.iter().take(5).map(|n| n.to_string()).collect();
                prop_assert_eq!(&facts.sample_nodes, &sample);
            }
        }
    }
}

proptest! {
    /// Every (prefix, mask) pair the API accepts works, including /0 ranges, /0 and /128
    /// blocks, a mask equal to the prefix and 2^32 blocks: nothing panics or wraps.
    #[test]
    fn every_valid_prefix_and_mask_works(
        v6 in any::<bool>(),
        // The edges drawn often: a /0 range, a full-length prefix, mask == prefix, 2^32 blocks.
        prefix in prop_oneof![Just(0u8), Just(128u8), 0u8..=128],
        split in prop_oneof![Just(0u8), Just(32u8), 0u8..=32],
        addr in any::<u128>(),
    ) {
        let max = if v6 { 128 } else { 32 };
        let prefix = prefix % (max + 1);
        let mask = prefix.saturating_add(split).min(max);
        let range = if v6 {
            IpNet::new(IpAddr::V6(addr.into()), prefix)
        } else {
            IpNet::new(IpAddr::V4((addr as u32).into()), prefix)
        }.expect("valid prefix").trunc();
        let mut ipam = Ipam::new();
        let mut input = config("edge", 1, None, None);
        if v6 { input.ipv6 = Some((range, mask)); } else { input.ipv4 = Some((range, mask)); }
        ipam.upsert_config(input);
        let capacity = 1u64 << (mask - prefix);
        let facts = ipam.config_facts("edge").expect("facts");
        let fam = if v6 { facts.ipv6 } else { facts.ipv4 }.expect("family facts");
        prop_assert_eq!(fam.capacity, capacity);
        let mut got = Vec::new();
        for i in 0..3u64.min(capacity) {
            let a = ipam.allocate(&format!("n{i}"), None, &no_labels()).expect("a free block");
            prop_assert!(a.cidrs.iter().all(|c| range.contains(c) && c.prefix_len() == mask));
            ipam.confirm(&format!("n{i}"), a.ticket, None);
            got.push(a.cidrs[0]);
        }
        let facts = ipam.config_facts("edge").expect("facts");
        let fam = if v6 { facts.ipv6 } else { facts.ipv4 }.expect("family facts");
        prop_assert_eq!(fam.allocated, got.len() as u64);
        prop_assert_eq!(facts.nodes, got.len() as u64);
        if capacity <= 3 {
            prop_assert!(ipam.allocate("more", None, &no_labels()).is_err());
        }
        for (i, c) in got.iter().enumerate() {
            prop_assert_eq!(ipam.node_gone(&format!("n{i}"), None), vec![*c]);
        }
        prop_assert_eq!(ipam.config_facts("edge").expect("facts").nodes, 0);
    }
}

#[test]
fn a_service_cidr_updated_with_the_same_ranges_stays_excluded() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("pods", 1, Some(("10.200.0.0/22", 24)), None));
    for _ in 0..3 {
        ipam.set_service_cidrs("servicecidr/extra", vec![net("10.200.0.0/24")]);
    }
    for i in 0..3 {
        let a = ipam
            .allocate(&format!("n{i}"), None, &no_labels())
            .expect("a block");
        assert_ne!(a.cidrs, vec![net("10.200.0.0/24")]);
    }
    assert!(
        ipam.allocate("n3", None, &no_labels()).is_err(),
        "the Service range is not free"
    );
    ipam.set_service_cidrs("servicecidr/extra", vec![]);
    assert_eq!(
        ipam.allocate("n3", None, &no_labels())
            .expect("freed")
            .cidrs,
        vec![net("10.200.0.0/24")]
    );
}

#[test]
fn the_younger_of_two_overlapping_configs_counts_none_of_the_older_ones_nodes() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("older", 1, Some(("10.30.0.0/16", 24)), None));
    for i in 0..3 {
        let a = ipam
            .allocate(&format!("n{i}"), None, &no_labels())
            .expect("a block");
        ipam.confirm(&format!("n{i}"), a.ticket, None);
    }
    ipam.upsert_config(config("younger", 2, Some(("10.30.0.0/17", 24)), None));
    // A block in the younger range only (adopted): the younger one's.
    ipam.observe_node("wide", None, &[net("10.31.0.0/24")]);
    ipam.upsert_config(config("wider", 3, Some(("10.30.0.0/15", 24)), None));
    let counts = |ipam: &Ipam, name: &str| {
        let f = ipam.config_facts(name).expect("facts");
        (f.nodes, f.ipv4.map_or(0, |f| f.allocated))
    };
    assert_eq!(counts(&ipam, "older"), (3, 3));
    assert_eq!(counts(&ipam, "younger"), (0, 0), "both fields, one rule");
    let wider = ipam.config_facts("wider").expect("facts");
    assert_eq!(
        (wider.nodes, wider.sample_nodes.clone()),
        (1, vec!["wide".to_string()])
    );
    assert_eq!(counts(&ipam, "wider"), (1, 1));
    // Without the older config, its nodes are the next oldest one's.
    ipam.remove_config("older");
    assert_eq!(counts(&ipam, "younger"), (3, 3));
}

#[test]
fn a_node_recreated_with_the_same_pod_cidrs_takes_the_new_uid() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("pods", 1, Some(("10.0.0.0/16", 24)), None));
    ipam.observe_node("n", Some("uid-1"), &[net("10.0.1.0/24")]);
    // The delete of uid-1 was missed; the new object carries the same podCIDRs.
    ipam.observe_node("n", Some("uid-2"), &[net("10.0.1.0/24")]);
    assert!(
        ipam.node_gone("n", Some("uid-1")).is_empty(),
        "not the object we track"
    );
    assert_eq!(ipam.node_gone("n", Some("uid-2")), vec![net("10.0.1.0/24")]);
}

/// Compiles only if both arguments are the same item: every function has its own type.
fn same_item<T>(_: T, _: T) {}

/// The allocator decides overlap, coverage and block counts with the functions the webhook and
/// validation use (`nodeipam_crd::range`), not with copies that could drift from them.
#[test]
fn range_rules_are_the_shared_ones() {
    same_item(nets_overlap, nodeipam_crd::range::overlaps);
    same_item(blocks_covered, nodeipam_crd::range::blocks_covered);
    same_item(crate::podnetwork::covered, nodeipam_crd::range::covered);
    assert_eq!(
        crate::cidrset::MAX_BLOCK_BITS,
        nodeipam_crd::limits::MAX_BLOCK_BITS
    );
}

#[test]
fn a_pool_fills_its_oldest_child_and_its_youngest_empties_out() {
    let mut ipam = Ipam::new();
    for (i, range) in ["10.0.0.0/29", "10.0.0.8/29", "10.0.0.16/29"]
        .iter()
        .enumerate()
    {
        let mut c = config(&format!("pods-{i}"), i as i64, Some((range, 30)), None);
        c.pool = Some("pods".into());
        ipam.upsert_config(c);
    }
    // A node in the youngest child: it has the fewest free blocks, and still comes last.
    ipam.observe_node("y1", Some("u"), &[net("10.0.0.16/30")]);
    let mut got = Vec::new();
    for n in ["a", "b", "c", "d", "e"] {
        let a = ipam.allocate(n, Some("u"), &no_labels()).expect("room");
        got.push(a.config);
    }
    assert_eq!(got, ["pods-0", "pods-0", "pods-1", "pods-1", "pods-2"]);
    // Once its nodes go, the youngest is empty and can be retired.
    ipam.node_gone("y1", Some("u"));
    ipam.abandon("e", 5);
    let facts = ipam.config_facts("pods-2").expect("known");
    assert_eq!(facts.nodes, 0);
}

#[test]
fn a_leak_ends_only_when_its_write_can_no_longer_land() {
    let mut ipam = Ipam::new();
    ipam.upsert_config(config("c", 1, Some(("10.0.0.0/22", 24)), None));
    let leak = |ipam: &mut Ipam, name: &str, uid: Option<&str>| {
        let a = ipam.allocate(name, uid, &no_labels()).expect("a block");
        assert_eq!(ipam.leak(name, a.ticket), a.cidrs);
        a.cidrs
    };
    let held = |ipam: &Ipam| ipam.config_facts("c").expect("facts");

    // The same object, still empty: the write may be on its way.
    let a = leak(&mut ipam, "a", Some("ua"));
    let empty = NodeSeen::Object {
        uid: Some("ua"),
        cidrs: &[],
    };
    assert!(ipam.settle_leaks("a", empty).is_empty());
    assert_eq!(
        (held(&ipam).leaked, held(&ipam).sample_leaked.clone()),
        (1, vec!["a".to_string()])
    );
    assert!(held(&ipam).held(), "a leak holds its config");
    // Another object's delete, or another object's (UID) podCIDRs... another object of the
    // name means ours is gone.
    let other = NodeSeen::Deleted {
        uid: Some("ua-old"),
    };
    assert!(ipam.settle_leaks("a", other).is_empty());
    let replaced = NodeSeen::Object {
        uid: Some("ua-2"),
        cidrs: &[],
    };
    assert_eq!(ipam.settle_leaks("a", replaced), a);
    assert!(!ipam.is_held(&a[0]));
    assert!(!held(&ipam).held());

    // Landed: the node holds the blocks, which stay occupied.
    let b = leak(&mut ipam, "b", Some("ub"));
    ipam.observe_node("b", Some("ub"), &b);
    let landed = NodeSeen::Object {
        uid: Some("ub"),
        cidrs: &b,
    };
    assert_eq!(ipam.settle_leaks("b", landed), b);
    assert!(ipam.is_held(&b[0]));
    assert_eq!((held(&ipam).leaked, held(&ipam).nodes), (0, 1));

    // The same object with other podCIDRs (immutable), its delete, a 404.
    let c = leak(&mut ipam, "c", Some("uc"));
    let other_cidrs = [net("10.0.3.0/24")];
    let elsewhere = NodeSeen::Object {
        uid: Some("uc"),
        cidrs: &other_cidrs,
    };
    assert_eq!(ipam.settle_leaks("c", elsewhere), c);
    let d = leak(&mut ipam, "d", Some("ud"));
    assert_eq!(
        ipam.settle_leaks("d", NodeSeen::Deleted { uid: Some("ud") }),
        d
    );
    let e = leak(&mut ipam, "e", Some("ue"));
    assert_eq!(ipam.settle_leaks("e", NodeSeen::Absent), e);

    // Without a UID precondition the write may land on any object of the name: only seeing it
    // land ends it.
    let f = leak(&mut ipam, "f", None);
    assert!(ipam.settle_leaks("f", NodeSeen::Absent).is_empty());
    assert!(
        ipam.settle_leaks("f", NodeSeen::Deleted { uid: None })
            .is_empty()
    );
    let other_object = NodeSeen::Object {
        uid: Some("uf-2"),
        cidrs: &other_cidrs,
    };
    assert!(ipam.settle_leaks("f", other_object).is_empty());
    assert_eq!(held(&ipam).leaked, 1);
    let landed = NodeSeen::Object {
        uid: Some("uf-3"),
        cidrs: &f,
    };
    assert_eq!(ipam.settle_leaks("f", landed), f);
    assert_eq!(held(&ipam).leaked, 0);
}
