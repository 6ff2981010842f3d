//! Storage that went back in time: a relist that shows an object older than it was seen
//! stops allocation, for this term and the next.

use super::*;

/// A node at a resourceVersion.
fn at_rv(name: &str, uid: &str, rv: &str, cidrs: &[&str]) -> IpamNode {
    let mut n = node(name, uid, &[], cidrs);
    n.metadata.resource_version = Some(rv.into());
    n
}

/// A synced machine with the pool config, where `a` got its block (seen written at rv 20).
fn with_a() -> Machine {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(at_rv("a", "u-a", "10", &[]))),
    );
    let job = writes(&out)[0].clone();
    m.handle(at(1), applied(&job));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(at_rv("a", "u-a", "20", &["10.0.0.0/30"]))),
    );
    m
}

/// A relist of the nodes: `a` at `rv` (with or without its block), and a new node `b`.
fn relist(m: &mut Machine, a_rv: &str, a_cidrs: &[&str]) -> Vec<Effect> {
    let mut out = m.handle(at(2), Input::Node(Watch::ListStart));
    out.extend(m.handle(
        at(2),
        Input::Node(Watch::Listed(at_rv("a", "u-a", a_rv, a_cidrs))),
    ));
    out.extend(m.handle(
        at(2),
        Input::Node(Watch::Listed(at_rv("b", "u-b", "30", &[]))),
    ));
    out.extend(m.handle(at(2), Input::Node(Watch::ListDone)));
    out
}

fn went_back(effects: &[Effect]) -> Option<WentBack> {
    metrics(effects).into_iter().find_map(|m| match m {
        Metric::StorageWentBack(w) => Some(w),
        _ => None,
    })
}

#[test]
fn a_relist_older_than_what_was_seen_stops_allocation() {
    let mut m = with_a();
    // Restored from a backup taken before a's block was written: a is back at rv 10.
    let out = relist(&mut m, "10", &[]);
    assert!(
        writes(&out).is_empty(),
        "allocated after a restore: {out:?}"
    );
    let found = went_back(&out).expect("the metric says why");
    assert_eq!(
        (found.stream, found.name.as_str(), found.seen, found.listed),
        ("nodes", "a", 20, 10)
    );
    assert_eq!(reasons(&out), vec![STORAGE_WENT_BACK]);
    assert_eq!(m.went_back(), Some(&found));
    // And from then on nothing at all: new nodes, ticks, resyncs.
    let mut out = m.handle(
        at(3),
        Input::Node(Watch::Applied(at_rv("c", "u-c", "40", &[]))),
    );
    out.extend(m.handle(at(4), Input::Tick));
    out.extend(m.handle(at(5), Input::Resync));
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn an_equal_or_newer_relist_allocates_as_before() {
    for rv in ["20", "25"] {
        let mut m = with_a();
        let out = relist(&mut m, rv, &["10.0.0.0/30"]);
        assert_eq!(went_back(&out), None);
        assert_eq!(m.went_back(), None);
        assert_eq!(writes(&out).len(), 1, "b gets a block: {out:?}");
        assert_eq!(writes(&out)[0].node, "b");
    }
}

#[test]
fn an_unparsable_version_is_no_evidence() {
    let mut m = with_a();
    let out = relist(&mut m, "not-a-revision", &["10.0.0.0/30"]);
    assert_eq!(went_back(&out), None);
    assert_eq!(writes(&out).len(), 1, "b gets a block: {out:?}");
}

#[test]
fn the_next_term_compares_its_first_list_with_what_earlier_terms_saw() {
    let mut m = with_a();
    let revisions = m.take_revisions();
    let mut next = Machine::new(Options {
        revisions,
        ..options(false)
    });
    next.handle(at(0), Input::Config(Watch::ListStart));
    next.handle(at(0), Input::Config(Watch::Listed(pool(true))));
    next.handle(at(0), Input::Config(Watch::ListDone));
    let out = relist(&mut next, "10", &[]);
    assert!(writes(&out).is_empty(), "{out:?}");
    assert!(went_back(&out).is_some());
    // And a term after a finding starts stopped.
    let mut after = Machine::new(Options {
        revisions: next.take_revisions(),
        ..options(false)
    });
    assert!(after.went_back().is_some());
    let out = after.handle(at(0), Input::Node(Watch::ListDone));
    assert!(out.is_empty(), "{out:?}");
}
