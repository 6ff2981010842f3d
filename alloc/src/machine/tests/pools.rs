//! The pools: carving, the children's lives and retiring, and what waits for a carve.

use super::*;

fn pool_options() -> Options {
    Options {
        pools: true,
        ..options(false)
    }
}

/// A synced machine that watches pools and knows `pool`.
pub(super) fn with_pool(pool: PoolInput) -> Machine {
    let mut m = Machine::new(pool_options());
    m.handle(at(0), Input::Node(Watch::ListDone));
    m.handle(at(0), Input::Config(Watch::ListDone));
    m.handle(at(0), Input::Pool(Watch::Listed(pool)));
    m.handle(at(0), Input::Pool(Watch::ListDone));
    assert!(m.synced());
    m
}

pub(super) fn creates(effects: &[Effect]) -> Vec<&ChildConfig> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::CreateConfig(c) => Some(c),
            _ => None,
        })
        .collect()
}

pub(super) fn deletes(effects: &[Effect]) -> Vec<(&str, Option<&str>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeleteConfig { name, uid, .. } => Some((name.as_str(), uid.as_deref())),
            _ => None,
        })
        .collect()
}

fn pool_status(effects: &[Effect]) -> Option<&PoolStatus> {
    effects.iter().rev().find_map(|e| match e {
        Effect::PoolStatus { status, .. } => Some(status),
        _ => None,
    })
}

/// The child the API server made of a create, with our finalizer on it, once our enable of it
/// landed (created Disabled and awaiting, then enabled: `awaiting_object` is the first).
pub(super) fn child_object(c: &ChildConfig, uid: &str) -> NodeIPAMConfig {
    let mut obj = awaiting_object(c, uid);
    obj.spec.allocation = nodeipam_crd::Allocation::Enabled;
    obj.metadata.annotations = None;
    obj.metadata.resource_version = Some(format!("{uid}-enabled"));
    obj
}

/// The child the API server made of a create: Disabled, awaiting its enable.
pub(super) fn awaiting_object(c: &ChildConfig, uid: &str) -> NodeIPAMConfig {
    let mut obj = c.object();
    obj.metadata.resource_version = Some(format!("{uid}-created"));
    obj.metadata.uid = Some(uid.into());
    obj.metadata.generation = Some(1);
    obj.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap_or_default(),
    ));
    obj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    obj
}

pub(super) fn small_pool(min: u32, max: u32, headroom: u64) -> PoolInput {
    // /29 children of /30 blocks: 2 blocks each, 4 children in the budget.
    crate::fixtures::pool(
        "pods",
        "pool-uid",
        (Some((&["10.0.0.0/27"], 29, 30)), None),
        (min, max, headroom),
        60,
        None,
    )
}

#[test]
fn a_pool_carves_its_first_range_once_and_the_child_serves_nodes() {
    let mut m = with_pool(small_pool(1, 4, 1));
    let out = m.handle(at(1), Input::Tick);
    let c = creates(&out);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].name, "pods-10-0-0-0-29");
    assert_eq!(c[0].ipv4, Some((net("10.0.0.0/29"), 30)));
    assert_eq!(c[0].pool_uid.as_deref(), Some("pool-uid"));
    assert!(reasons(&out).contains(&effects::RANGE_CARVED));
    let status = pool_status(&out).expect("status");
    assert!(scaling::says(status, scaling::CONDITION_SCALING));
    // In flight: the next decision does not carve it again.
    let again = m.handle(at(2), Input::Tick);
    assert!(creates(&again).is_empty());
    let child = c[0].clone();
    m.handle(
        at(2),
        Input::ConfigCreated {
            config: child.clone(),
            outcome: CreateOutcome::Created,
        },
    );
    m.handle(
        at(3),
        Input::Config(Watch::Applied(child_object(&child, "c-1"))),
    );
    assert_eq!(m.carves_in_flight(), 0);
    // The child serves a node, and the scale-up is measured when its gate opened.
    let out = m.handle(
        at(3),
        Input::Node(Watch::Applied(node("n1", "u1", &[], &[]))),
    );
    assert_eq!(writes(&out)[0].config, "pods-10-0-0-0-29");
    let out = m.handle(at(4), Input::Tick);
    let status = pool_status(&out).expect("status");
    assert!(!scaling::says(status, scaling::CONDITION_SCALING));
    assert!(scaling::says(status, nodeipam_crd::CONDITION_READY));
    assert_eq!(status.ranges.len(), 1);
}

#[test]
fn a_failed_create_is_carved_again_under_the_same_name() {
    let mut m = with_pool(small_pool(1, 4, 1));
    let out = m.handle(at(1), Input::Tick);
    let child = creates(&out)[0].clone();
    m.handle(
        at(1),
        Input::ConfigCreated {
            config: child.clone(),
            outcome: CreateOutcome::Failed("timeout".into()),
        },
    );
    // Asked again as it was; failing again and again, less and less often, and the pool is
    // told once.
    let mut told = 0;
    let mut asked = Vec::new();
    for s in 2..120u64 {
        let out = m.handle(at(s), Input::Tick);
        for c in creates(&out) {
            assert_eq!(c, &child);
            asked.push(s);
            let out = m.handle(
                at(s),
                Input::ConfigCreated {
                    config: c.clone(),
                    outcome: CreateOutcome::Failed("denied".into()),
                },
            );
            told += reasons(&out)
                .iter()
                .filter(|r| **r == effects::RANGE_CARVE_FAILED)
                .count();
        }
    }
    assert_eq!(told, 1);
    assert_eq!(asked.first(), Some(&2));
    assert!(asked.len() < 10, "asked at {asked:?}");
}

#[test]
fn a_new_leader_that_lists_the_children_carves_nothing_more() {
    let mut m = with_pool(small_pool(1, 4, 1));
    let out = m.handle(at(1), Input::Tick);
    let child = creates(&out)[0].clone();
    // A fresh machine after a failover: the child is in its first list.
    let mut fresh = Machine::new(pool_options());
    fresh.handle(at(0), Input::Node(Watch::ListDone));
    fresh.handle(
        at(0),
        Input::Config(Watch::Listed(child_object(&child, "c-1"))),
    );
    fresh.handle(at(0), Input::Config(Watch::ListDone));
    fresh.handle(at(0), Input::Pool(Watch::Listed(small_pool(1, 4, 1))));
    fresh.handle(at(0), Input::Pool(Watch::ListDone));
    let out = fresh.handle(at(1), Input::Tick);
    assert!(creates(&out).is_empty(), "{:?}", creates(&out));
}

#[test]
fn nodes_waiting_for_a_carve_get_no_warning_until_the_budget_runs_out() {
    let mut m = with_pool(small_pool(0, 2, 0));
    let mut out = Vec::new();
    for i in 0..5 {
        let name = format!("n{i}");
        out.extend(m.handle(
            at(1),
            Input::Node(Watch::Applied(node(&name, &format!("u{i}"), &[], &[]))),
        ));
    }
    assert!(!reasons(&out).contains(&effects::CIDR_NOT_AVAILABLE));
    // Five nodes need three ranges of two; max allows two.
    let out = m.handle(at(2), Input::Tick);
    let children: Vec<ChildConfig> = creates(&out).into_iter().cloned().collect();
    assert_eq!(children.len(), 2);
    let status = pool_status(&out).expect("status");
    assert!(scaling::says(status, nodeipam_crd::CONDITION_EXHAUSTED));
    assert!(reasons(&out).contains(&effects::POOL_EXHAUSTED));
    // Carves are in flight: still no warning.
    assert!(!reasons(&out).contains(&effects::CIDR_NOT_AVAILABLE));
    let mut out = Vec::new();
    for (i, c) in children.iter().enumerate() {
        out.extend(m.handle(
            at(3),
            Input::Config(Watch::Applied(child_object(c, &format!("c-{i}")))),
        ));
    }
    assert_eq!(writes(&out).len(), 4);
    let out = m.handle(at(4), Input::Tick);
    // The budget can give no more and one node still waits: now it is told.
    assert_eq!(
        reasons(&out)
            .iter()
            .filter(|r| **r == effects::CIDR_NOT_AVAILABLE)
            .count(),
        1
    );
}

#[test]
fn an_empty_child_beyond_min_retires_after_empty_for_and_hands_out_nothing_more() {
    let mut m = with_pool(small_pool(1, 4, 0));
    let first = creates(&m.handle(at(1), Input::Tick))[0].clone();
    m.handle(
        at(1),
        Input::Config(Watch::Applied(child_object(&first, "c-1"))),
    );
    // Three nodes: a second range is carved for the third.
    let mut jobs = Vec::new();
    for i in 0..3 {
        let out = m.handle(
            at(2),
            Input::Node(Watch::Applied(node(
                &format!("n{i}"),
                &format!("u{i}"),
                &[],
                &[],
            ))),
        );
        jobs.extend(writes(&out).into_iter().cloned());
    }
    // Decided once the burst is a second old: only the waiting node asks for a range.
    let carved = creates(&m.handle(at(4), Input::Tick))
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(carved.len(), 1, "{carved:?}");
    let second = carved[0].clone();
    assert_eq!(second.name, "pods-10-0-0-8-29");
    let out = m.handle(
        at(4),
        Input::Config(Watch::Applied(child_object(&second, "c-2"))),
    );
    jobs.extend(writes(&out).into_iter().cloned());
    assert_eq!(jobs.len(), 3);
    for j in &jobs {
        m.handle(at(4), applied(j));
    }
    // The third node goes: the second child is empty from the next decision on.
    let third = jobs
        .iter()
        .find(|j| j.config == second.name)
        .expect("in the second");
    let gone = node(&third.node, third.uid.as_deref().unwrap_or(""), &[], &[]);
    m.handle(at(5), Input::Node(Watch::Deleted(gone)));
    assert!(deletes(&m.handle(at(6), Input::Tick)).is_empty());
    assert!(deletes(&m.handle(at(65), Input::Tick)).is_empty());
    let out = m.handle(at(66), Input::Tick);
    assert_eq!(deletes(&out), [(second.name.as_str(), Some("c-2"))]);
    assert!(reasons(&out).contains(&effects::RANGE_RETIRED));
    // Held back at once: a new node does not land in it. The first child is full, so it waits.
    let out = m.handle(
        at(67),
        Input::Node(Watch::Applied(node("late", "ul", &[], &[]))),
    );
    assert!(writes(&out).is_empty());
    // The delete lands; the child drains and goes; min is kept.
    m.handle(
        at(67),
        Input::ConfigDeleted {
            name: second.name.clone(),
            uid: Some("c-2".into()),
            outcome: DeleteOutcome::Deleted,
        },
    );
    let out = m.handle(at(68), Input::Tick);
    assert!(deletes(&out).is_empty());
}

#[test]
fn a_created_child_missing_from_a_later_config_list_is_carved_again() {
    let mut m = with_pool(small_pool(1, 4, 1));
    let child = creates(&m.handle(at(1), Input::Tick))[0].clone();
    // A list that started before the answer proves nothing.
    m.handle(at(1), Input::Config(Watch::ListStart));
    m.handle(
        at(1),
        Input::ConfigCreated {
            config: child.clone(),
            outcome: CreateOutcome::Created,
        },
    );
    m.handle(at(1), Input::Config(Watch::ListDone));
    assert_eq!(m.carves_in_flight(), 1);
    // One that started after it and lacks the child: it is gone again.
    m.handle(at(2), Input::Config(Watch::ListStart));
    m.handle(at(2), Input::Config(Watch::ListDone));
    assert_eq!(m.carves_in_flight(), 0);
    assert_eq!(creates(&m.handle(at(3), Input::Tick)), [&child]);
}

#[test]
fn a_failed_retire_hands_the_child_back_and_a_gone_pool_forgets_its_carves() {
    let mut m = with_pool(small_pool(1, 4, 0));
    let first = creates(&m.handle(at(1), Input::Tick))[0].clone();
    m.handle(
        at(1),
        Input::Config(Watch::Applied(child_object(&first, "c-1"))),
    );
    // min 0 from now on: the empty child retires after emptyFor.
    let mut pool = small_pool(0, 4, 0);
    pool.uid = Some("pool-uid".into());
    m.handle(at(1), Input::Pool(Watch::Applied(pool)));
    m.handle(at(2), Input::Tick);
    let out = m.handle(at(70), Input::Tick);
    assert_eq!(deletes(&out), [(first.name.as_str(), Some("c-1"))]);
    // Held back while the delete is on its way.
    let out = m.handle(
        at(70),
        Input::Node(Watch::Applied(node("n1", "u1", &[], &[]))),
    );
    assert!(writes(&out).is_empty());
    // The delete failed: the child serves again.
    let out = m.handle(
        at(71),
        Input::ConfigDeleted {
            name: first.name.clone(),
            uid: Some("c-1".into()),
            outcome: DeleteOutcome::Failed("503".into()),
        },
    );
    assert_eq!(writes(&out).len(), 1, "{out:?}");
    // The pool goes: its carves in flight with it, and its series.
    let out = m.handle(at(72), Input::Pool(Watch::Deleted(small_pool(0, 4, 0))));
    assert!(metrics(&out).contains(&Metric::PoolGone("pods".into())));
    assert_eq!(m.carves_in_flight(), 0);
    assert!(creates(&m.handle(at(73), Input::Tick)).is_empty());
}

#[test]
fn a_hand_made_config_named_like_a_child_makes_the_pool_carve_elsewhere() {
    let mut m = with_pool(small_pool(1, 4, 1));
    // Named like the child of 10.0.0.0/29, but elsewhere and no child of the pool.
    let squatter = config(
        "pods-10-0-0-0-29",
        "s-1",
        1,
        (Some(("10.9.0.0/29", 30)), None),
        crate::fixtures::selecting("x", "y").into(),
        true,
    );
    m.handle(at(1), Input::Config(Watch::Applied(squatter)));
    let out = m.handle(at(2), Input::Tick);
    let names: Vec<&str> = creates(&out).iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["pods-10-0-0-8-29"]);
}

#[test]
fn the_answer_for_a_publication_does_not_account_for_a_later_one_with_the_same_content() {
    let (mut m, _) = synced(options(true));
    let published = |out: &[Effect]| {
        out.iter()
            .find_map(|e| match e {
                Effect::Publish(n) => Some(n.clone()),
                _ => None,
            })
            .expect("published")
    };
    let first = published(&m.handle(at(1), Input::Config(Watch::Applied(pool(true)))));
    // The config goes (a network without its range is sent) and comes back (the first
    // content is sent again) before anything landed.
    let without = published(&m.handle(at(2), Input::Config(Watch::Deleted(pool(true)))));
    let again = published(&m.handle(at(3), Input::Config(Watch::Applied(pool(true)))));
    assert_eq!(first.cidrs(), again.cidrs());
    assert!(first.seq < without.seq && without.seq < again.seq);
    // Only the first is written so far: the one without the range may still land.
    m.handle(at(4), Input::Published(first.clone()));
    let cm = configmap(
        "nodeipam-system",
        "pod-network",
        first.configmap_data("now"),
    );
    m.handle(at(4), Input::Output(0, Watch::Applied(cm)));
    let out = m.handle(
        at(4),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(
        writes(&out).is_empty(),
        "allocated while a network without the range was still being written"
    );
    // The last one is written (the publisher skipped the middle one): the gate opens.
    let out = m.handle(at(5), Input::Published(again));
    assert_eq!(writes(&out).len(), 1, "{out:?}");
}

pub(super) fn published(effects: &[Effect]) -> Option<PodNetwork> {
    effects.iter().find_map(|e| match e {
        Effect::Publish(n) => Some(n.clone()),
        _ => None,
    })
}

#[test]
fn a_carved_child_is_created_held_and_published_with_the_step_that_sees_it() {
    let mut m = Machine::new(Options {
        pools: true,
        ..options(true)
    });
    m.handle(at(0), Input::Node(Watch::ListDone));
    m.handle(at(0), Input::Config(Watch::ListDone));
    m.handle(at(0), Input::Output(0, Watch::ListDone));
    m.handle(at(0), Input::Pool(Watch::Listed(small_pool(1, 4, 1))));
    let out = m.handle(at(0), Input::Pool(Watch::ListDone));
    answer_publications(&mut m, &out);
    let out = m.handle(at(1), Input::Tick);
    let child = creates(&out)[0].clone();
    // Created with our finalizer: no finalizer write comes between the carve and its use.
    let object = child.object();
    assert_eq!(
        object.metadata.finalizers,
        Some(vec![FINALIZER.to_string()])
    );
    // Created Disabled and awaiting its enable: a create that lands late serves nothing.
    assert_eq!(object.spec.allocation, nodeipam_crd::Allocation::Disabled);
    assert!(
        object
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(scaling::AWAITING_ENABLE))
    );
    let seen = awaiting_object(&child, "c-1");
    let out = m.handle(at(1), Input::Config(Watch::Applied(seen.clone())));
    assert!(config_jobs(&out).is_empty(), "{out:?}");
    // Its range is published ahead, as a carve's: awaiting is not stopped.
    let network = published(&out).expect("published without waiting for a tick");
    assert!(network.cidrs().contains(&net("10.0.0.0/29")));
    // Nothing is handed out from it before that publication is read back.
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("n1", "u1", &[], &[]))),
    );
    assert!(writes(&out).is_empty(), "{out:?}");
    let cm = configmap(
        "nodeipam-system",
        "pod-network",
        network.configmap_data("now"),
    );
    m.handle(at(1), Input::Published(network));
    let out = m.handle(at(1), Input::Output(0, Watch::Applied(cm)));
    assert!(writes(&out).is_empty(), "not enabled yet: {out:?}");
    // The pool, within its max, enables it at the version it saw, once.
    let out = m.handle(at(2), Input::Tick);
    let enable = enables(&out);
    assert_eq!(enable.len(), 1, "{out:?}");
    assert_eq!(enable[0].name, child.name);
    assert_eq!(enable[0].uid.as_deref(), Some("c-1"));
    assert_eq!(enable[0].resource_version.as_deref(), Some("c-1-created"));
    let status = pool_status(&out).expect("status");
    assert_eq!(status.ranges[0].state, "Enabling");
    assert!(
        enables(&m.handle(at(3), Input::Tick)).is_empty(),
        "asked once"
    );
    // Refused (someone moved it): decided again, at the version the watch shows then.
    let refused = enable[0].clone();
    m.handle(
        at(3),
        Input::ConfigEnabled {
            child: refused,
            outcome: EnableOutcome::Moved("422 a test failed".into()),
        },
    );
    assert_eq!(enables(&m.handle(at(4), Input::Tick)).len(), 1);
    let out = m.handle(
        at(4),
        Input::Config(Watch::Applied(child_object(&child, "c-1"))),
    );
    assert_eq!(writes(&out).len(), 1, "{out:?}");
}

pub(super) fn enables(effects: &[Effect]) -> Vec<&EnableChild> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::EnableConfig(c) => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn a_pool_handing_out_blocks_fast_carves_before_its_headroom_runs_out() {
    // Ranges of 8 /30 blocks, headroom 1.
    let pool = crate::fixtures::pool(
        "pods",
        "pool-uid",
        (Some((&["10.0.0.0/24"], 27, 30)), None),
        (1, 8, 1),
        60,
        None,
    );
    let mut m = with_pool(pool);
    let child = creates(&m.handle(at(1), Input::Tick))[0].clone();
    m.handle(
        at(1),
        Input::Config(Watch::Applied(child_object(&child, "c-1"))),
    );
    for i in 0..5 {
        let name = format!("n{i}");
        let out = m.handle(
            at(2),
            Input::Node(Watch::Applied(node(&name, &name, &[], &[]))),
        );
        assert_eq!(writes(&out).len(), 1, "{out:?}");
    }
    // 3 blocks free, more than the headroom of 1; but 5 went within the last second, so
    // the pool carves now rather than when the next nodes find it full.
    let out = m.handle(at(2), Input::Tick);
    assert_eq!(creates(&out).len(), 1, "{out:?}");
    // A quiet pool keeps only its headroom: nothing more once the demand has passed.
    let out = m.handle(at(5), Input::Tick);
    assert!(creates(&out).is_empty(), "{out:?}");
}
