//! Leaks: a write whose outcome is unknown holds its config until it ends.

use super::pools::{child_object, creates, deletes, published, small_pool, with_pool};
use super::*;

/// The publisher writes each publication among `effects` and its watch reads it back: the
/// gate on the published pod network opens.
fn land_publications(m: &mut Machine, now: Now, effects: &[Effect]) {
    for e in effects {
        if let Effect::Publish(n) = e {
            let cm = configmap("nodeipam-system", "pod-network", n.configmap_data("now"));
            m.handle(now, Input::Published(n.clone()));
            m.handle(now, Input::Output(0, Watch::Applied(cm)));
        }
    }
}

/// The outcome of `job`: ambiguous first (the node still empty, so the same blocks go again),
/// then refused every time until the machine gives up. An earlier attempt may have landed, so
/// the blocks are leaked, not released.
fn leak_after_refusals(m: &mut Machine, now: Now, job: &WriteJob) -> Vec<Effect> {
    let uid = job.uid.clone();
    let outcome = |ambiguous: bool| {
        let now = NodeNow::Empty {
            uid: uid.clone(),
            fence: crate::seal::Fence::default(),
        };
        if ambiguous {
            WriteOutcome::Ambiguous {
                reason: "no answer within 10s".into(),
                now,
            }
        } else {
            WriteOutcome::Rejected {
                reason: "403 Forbidden".into(),
                now,
            }
        }
    };
    let mut job = job.clone();
    let mut out = m.handle(
        now,
        Input::Written(WriteResult {
            job: job.clone(),
            outcome: outcome(true),
        }),
    );
    while let Some(next) = writes(&out).first().map(|j| (*j).clone()) {
        job = next;
        out = m.handle(
            now,
            Input::Written(WriteResult {
                job: job.clone(),
                outcome: outcome(false),
            }),
        );
    }
    assert!(
        metrics(&out).contains(&Metric::Leaked(1)),
        "given up after an ambiguous attempt: leaked: {out:?}"
    );
    out
}

pub(super) fn deleting(mut c: NodeIPAMConfig, seconds: i64) -> NodeIPAMConfig {
    c.metadata.deletion_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + seconds).unwrap_or_default(),
    ));
    c
}

fn drained(status: &NodeIPAMConfigStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == nodeipam_crd::CONDITION_DRAINED && c.status == "True")
}

pub(super) fn removes_finalizer(effects: &[Effect]) -> bool {
    config_jobs(effects)
        .iter()
        .any(|j| matches!(j, ConfigJob::RemoveFinalizer { .. }))
}

/// A machine with `pool` published and a block of it leaked for node `a` (u-a), which waits
/// again, parked.
fn with_a_leak() -> Machine {
    let (mut m, _) = synced(options(true));
    let out = m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    land_publications(&mut m, at(1), &out);
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    let job = writes(&out)[0].clone();
    assert_eq!(job.cidrs, vec![net("10.0.0.0/30")]);
    let out = leak_after_refusals(&mut m, at(1), &job);
    land_publications(&mut m, at(1), &out);
    m
}

#[test]
fn a_config_deleted_while_a_block_is_leaked_keeps_its_finalizer_and_stays_published() {
    let mut m = with_a_leak();
    let out = m.handle(
        at(2),
        Input::Config(Watch::Applied(deleting(pool(true), 2))),
    );
    land_publications(&mut m, at(2), &out);
    let out = m.handle(at(3), Input::Tick);
    land_publications(&mut m, at(3), &out);
    assert!(
        !removes_finalizer(&out),
        "the leaked write may still land on a: {out:?}"
    );
    assert!(
        statuses(&out).iter().all(|s| !drained(s)),
        "Drained while a leaked write may still land: {out:?}"
    );
    assert!(
        m.network().cidrs().contains(&net("10.0.0.0/29")),
        "the range left the pod network: {:?}",
        m.network().cidrs()
    );
    if let Some(network) = published(&out) {
        assert!(network.cidrs().contains(&net("10.0.0.0/29")));
    }
}

#[test]
fn a_leak_is_counted_while_it_lasts() {
    let mut m = with_a_leak();
    // The leaked write landed after all: the node shows its block, and the leak is over.
    let landed = node("a", "u-a", &[], &["10.0.0.0/30"]);
    let out = m.handle(at(2), Input::Node(Watch::Applied(landed)));
    assert!(
        metrics(&out).contains(&Metric::Leaked(0)),
        "the gauge comes down when the leak ends: {out:?}"
    );
}

#[test]
fn a_config_whose_leaked_node_is_deleted_drains() {
    let mut m = with_a_leak();
    m.handle(
        at(2),
        Input::Config(Watch::Applied(deleting(pool(true), 2))),
    );
    let out = m.handle(at(3), Input::Tick);
    assert!(!removes_finalizer(&out), "still leaked: {out:?}");
    // The write carried u-a as its precondition: it can land on no object now.
    let gone = node("a", "u-a", &[], &[]);
    m.handle(at(4), Input::Node(Watch::Deleted(gone)));
    let out = m.handle(at(5), Input::Tick);
    assert!(removes_finalizer(&out), "{out:?}");
    assert!(statuses(&out).iter().any(|s| drained(s)), "{out:?}");
    assert!(!m.network().cidrs().contains(&net("10.0.0.0/29")));
}

#[test]
fn a_pool_child_with_a_leaked_block_is_not_retired() {
    let mut m = with_pool(small_pool(1, 4, 0));
    let first = creates(&m.handle(at(1), Input::Tick))[0].clone();
    m.handle(
        at(1),
        Input::Config(Watch::Applied(child_object(&first, "c-1"))),
    );
    // Two nodes fill the first child; a third, without a UID, gets a second child's block.
    let mut jobs = Vec::new();
    for i in 0..2 {
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
    for j in &jobs {
        m.handle(at(2), applied(j));
    }
    let mut third = node("n2", "", &[], &[]);
    third.metadata.uid = None;
    m.handle(at(2), Input::Node(Watch::Applied(third)));
    let second = creates(&m.handle(at(4), Input::Tick))[0].clone();
    let out = m.handle(
        at(4),
        Input::Config(Watch::Applied(child_object(&second, "c-2"))),
    );
    let job = writes(&out)[0].clone();
    assert_eq!(job.config, second.name);
    // Without a UID precondition, an ambiguous write to a node gone since may still land on
    // a node created under the same name: leaked.
    let out = m.handle(
        at(5),
        Input::Written(WriteResult {
            job,
            outcome: WriteOutcome::Ambiguous {
                reason: "timeout".into(),
                now: NodeNow::Gone,
            },
        }),
    );
    assert!(metrics(&out).contains(&Metric::Leaked(1)), "{out:?}");
    // Far beyond emptyFor (60 s): the child is not empty, and stays.
    for t in [6, 66, 130, 200] {
        let out = m.handle(at(t), Input::Tick);
        assert!(deletes(&out).is_empty(), "at {t} s: {out:?}");
    }
}

#[test]
fn a_leaked_node_missing_from_a_relist_is_read_again_and_a_404_ends_the_leak() {
    let mut m = with_a_leak();
    m.handle(
        at(2),
        Input::Config(Watch::Applied(deleting(pool(true), 2))),
    );
    // Deleted while the watch was down: the relist lacks it.
    m.handle(at(3), Input::Node(Watch::ListStart));
    let out = m.handle(at(3), Input::Node(Watch::ListDone));
    let rereads: Vec<(String, Option<String>)> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Reread { node, uid } => Some((node.clone(), uid.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(rereads, vec![("a".to_string(), Some("u-a".to_string()))]);
    let out = m.handle(at(3), Input::Tick);
    assert!(!removes_finalizer(&out), "not before the GET says so");
    m.handle(
        at(4),
        Input::Reread {
            node: "a".into(),
            uid: Some("u-a".into()),
            now: NodeNow::Gone,
        },
    );
    let out = m.handle(at(5), Input::Tick);
    assert!(removes_finalizer(&out), "{out:?}");
}
