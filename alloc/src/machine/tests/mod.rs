//! The machine's handlers, one fact at a time: what each input makes it do.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeipam_crd::{Allocation as AllocationSwitch, FINALIZER, NodeIPAMConfigStatus};

use super::*;
use crate::effects::{
    self, ChildConfig, CreateOutcome, EnableChild, EnableOutcome, WriteJob, WriteResult,
};
use crate::fixtures::{config, configmap, node, service_cidr};
use crate::outcome::{NodeNow, WriteOutcome};
use crate::podnetwork::{ConfigMapRef, OutputKind, OutputRef};
use crate::pool::{self as scaling, PoolInput, PoolStatus};

mod counts;
mod found;
mod leaks;
mod pools;
mod went_back;

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn at(seconds: u64) -> Now {
    Now {
        mono: Duration::from_secs(seconds),
        wall_seconds: 1_800_000_000 + i64::try_from(seconds).unwrap_or(0),
    }
}

fn options(outputs: bool) -> Options {
    let target = |name: &str| ConfigMapRef {
        namespace: "nodeipam-system".into(),
        name: name.into(),
    };
    Options {
        write_attempts: 3,
        retry_rejected_after: Duration::from_secs(60),
        outputs: if outputs {
            vec![OutputRef::configmap(
                &target("pod-network"),
                OutputKind::PodNetwork,
            )]
        } else {
            Vec::new()
        },
        ..Options::default()
    }
}

/// A machine whose watches listed nothing yet, fed the empty lists of every watch.
fn synced(options: Options) -> (Machine, Vec<Effect>) {
    let outputs = options.outputs.len();
    let mut m = Machine::new(options);
    let mut out = Vec::new();
    out.extend(m.handle(at(0), Input::Node(Watch::ListDone)));
    out.extend(m.handle(at(0), Input::Config(Watch::ListDone)));
    for i in 0..outputs {
        out.extend(m.handle(at(0), Input::Output(i, Watch::ListDone)));
    }
    // The first publication goes out once everything is read; the publisher answers it.
    answer_publications(&mut m, &out);
    (m, out)
}

/// What the publisher does with each publication among `effects`: writes it and says so.
fn answer_publications(m: &mut Machine, effects: &[Effect]) {
    for e in effects {
        if let Effect::Publish(n) = e {
            m.handle(at(0), Input::Published(n.clone()));
        }
    }
}

fn writes(effects: &[Effect]) -> Vec<&WriteJob> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Write(job) => Some(job),
            _ => None,
        })
        .collect()
}

fn config_jobs(effects: &[Effect]) -> Vec<&ConfigJob> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Config(job) => Some(job),
            _ => None,
        })
        .collect()
}

fn metrics(effects: &[Effect]) -> Vec<Metric> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Metric(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn reasons(effects: &[Effect]) -> Vec<&'static str> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Note(n) => Some(n.reason),
            _ => None,
        })
        .collect()
}

fn pool(finalized: bool) -> NodeIPAMConfig {
    config(
        "pool",
        "c1",
        1,
        (Some(("10.0.0.0/29", 30)), None),
        None,
        finalized,
    )
}

fn applied(job: &WriteJob) -> Input {
    Input::Written(WriteResult {
        job: job.clone(),
        outcome: WriteOutcome::Applied {
            uid: job.uid.clone(),
            cidrs: job.cidrs.clone(),
        },
    })
}

#[test]
fn nothing_is_allocated_before_every_watch_has_listed() {
    let mut m = Machine::new(options(false));
    let mut out = m.handle(at(0), Input::Config(Watch::Listed(pool(true))));
    out.extend(m.handle(
        at(0),
        Input::Node(Watch::Listed(node("a", "u-a", &[], &[]))),
    ));
    out.extend(m.handle(at(0), Input::Node(Watch::ListDone)));
    assert!(
        writes(&out).is_empty(),
        "allocated before the configs were listed"
    );
    assert!(!m.synced());
    let out = m.handle(at(0), Input::Config(Watch::ListDone));
    assert!(m.synced());
    assert_eq!(writes(&out).len(), 1, "{out:?}");
    assert_eq!(writes(&out)[0].cidrs, vec![net("10.0.0.0/30")]);
    assert_eq!(writes(&out)[0].uid.as_deref(), Some("u-a"));
}

#[test]
fn a_config_without_our_finalizer_gets_it_before_anything_is_allocated() {
    let (mut m, _) = synced(options(false));
    let out = m.handle(at(1), Input::Config(Watch::Applied(pool(false))));
    assert!(matches!(
        config_jobs(&out)[..],
        [ConfigJob::AddFinalizer { .. }]
    ));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(
        writes(&out).is_empty(),
        "allocated from a config without the finalizer"
    );
    // The controller's own status write echoes back without the finalizer: asked once only.
    let out = m.handle(at(1), Input::Config(Watch::Applied(pool(false))));
    assert!(config_jobs(&out).is_empty(), "{out:?}");
    let out = m.handle(at(2), Input::Config(Watch::Applied(pool(true))));
    assert_eq!(writes(&out).len(), 1);
}

#[test]
fn a_range_is_allocated_from_only_once_the_published_output_holds_it() {
    let (mut m, _) = synced(options(true));
    // Published with the step that saw the config, not at the next tick.
    let out = m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let network = out
        .iter()
        .find_map(|e| match e {
            Effect::Publish(n) => Some(n.clone()),
            _ => None,
        })
        .expect("the network is published");
    assert!(network.cidrs().contains(&net("10.0.0.0/29")));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(
        writes(&out).is_empty(),
        "allocated before consumers knew the range"
    );
    let data = network.configmap_data("now");
    let cm = configmap("nodeipam-system", "pod-network", data);
    // Written (the publisher's answer) and read back (the watch): only then.
    let out = m.handle(at(1), Input::Published(network));
    assert!(writes(&out).is_empty(), "{out:?}");
    let out = m.handle(at(1), Input::Output(0, Watch::Applied(cm)));
    assert_eq!(writes(&out).len(), 1, "{out:?}");
}

#[test]
fn a_confirmed_write_holds_its_block_and_a_deleted_node_frees_it() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    let job = writes(&out)[0].clone();
    m.handle(at(1), applied(&job));
    // The block is held: the next node gets the other one.
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("b", "u-b", &[], &[]))),
    );
    assert_eq!(writes(&out)[0].cidrs, vec![net("10.0.0.4/30")]);
    m.handle(at(1), applied(writes(&out)[0]));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("c", "u-c", &[], &[]))),
    );
    assert!(writes(&out).is_empty());
    assert_eq!(reasons(&out), vec![effects::CIDR_NOT_AVAILABLE]);
    assert_eq!(m.pending(), 1);
    let a = node("a", "u-a", &[], &["10.0.0.0/30"]);
    let out = m.handle(at(2), Input::Node(Watch::Deleted(a)));
    assert!(metrics(&out).contains(&Metric::Released(net("10.0.0.0/29"))));
    assert_eq!(
        writes(&out)[0].node,
        "c",
        "the freed block goes to the waiting node"
    );
    assert_eq!(writes(&out)[0].cidrs, vec![net("10.0.0.0/30")]);
}

#[test]
fn refused_writes_are_retried_then_given_up_and_the_node_parked() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    let mut job = writes(&out)[0].clone();
    let refused = |job: &WriteJob| {
        Input::Written(WriteResult {
            job: job.clone(),
            outcome: WriteOutcome::Rejected {
                reason: "403 Forbidden".into(),
                now: NodeNow::Empty {
                    uid: Some("u-a".into()),
                    fence: crate::seal::Fence::default(),
                },
            },
        })
    };
    for attempt in 1..3 {
        let out = m.handle(at(1), refused(&job));
        job = writes(&out)[0].clone();
        assert_eq!(job.attempt, attempt);
        assert_eq!(job.rejections, attempt);
    }
    let out = m.handle(at(1), refused(&job));
    assert!(writes(&out).is_empty(), "refused three times: given up");
    assert!(reasons(&out).contains(&effects::CIDR_ASSIGNMENT_FAILED));
    assert!(metrics(&out).contains(&Metric::AssignmentFailure));
    assert_eq!(m.pending(), 1, "the node waits, parked");
    assert!(
        writes(&m.handle(at(30), Input::Tick)).is_empty(),
        "too early"
    );
    let out = m.handle(at(61), Input::Tick);
    assert_eq!(writes(&out).len(), 1, "tried again from scratch");
    assert_eq!(writes(&out)[0].attempt, 0);
}

#[test]
fn an_ambiguous_write_whose_node_is_gone_without_a_uid_leaks() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let mut n = node("a", "", &[], &[]);
    n.metadata.uid = None;
    let out = m.handle(at(1), Input::Node(Watch::Applied(n)));
    let job = writes(&out)[0].clone();
    let out = m.handle(
        at(1),
        Input::Written(WriteResult {
            job,
            outcome: WriteOutcome::Ambiguous {
                reason: "timeout".into(),
                now: NodeNow::Gone,
            },
        }),
    );
    assert!(metrics(&out).contains(&Metric::Leaked(1)), "{out:?}");
    // The leaked block is never handed out again.
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("b", "u-b", &[], &[]))),
    );
    assert_eq!(writes(&out)[0].cidrs, vec![net("10.0.0.4/30")]);
}

#[test]
fn a_node_missing_from_a_relist_is_read_again_before_its_block_is_freed() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &["10.0.0.0/30"]))),
    );
    m.handle(at(2), Input::Node(Watch::ListStart));
    let out = m.handle(at(2), Input::Node(Watch::ListDone));
    let reread = out.iter().find_map(|e| match e {
        Effect::Reread { node, uid } => Some((node.clone(), uid.clone())),
        _ => None,
    });
    assert_eq!(reread, Some(("a".into(), Some("u-a".into()))));
    assert_eq!(m.ipam().node_count(), 1, "not freed on the relist alone");
    let still = NodeNow::Has {
        uid: Some("u-a".into()),
        cidrs: vec![net("10.0.0.0/30")],
    };
    let reread = |now| Input::Reread {
        node: "a".into(),
        uid: Some("u-a".into()),
        now,
    };
    m.handle(at(2), reread(still));
    assert_eq!(m.ipam().node_count(), 1);
    m.handle(at(2), reread(NodeNow::Gone));
    assert_eq!(m.ipam().node_count(), 0);
}

#[test]
fn a_late_reread_of_an_old_object_does_not_free_a_new_one() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-new", &[], &["10.0.0.0/30"]))),
    );
    m.handle(
        at(2),
        Input::Reread {
            node: "a".into(),
            uid: Some("u-old".into()),
            now: NodeNow::Gone,
        },
    );
    assert_eq!(m.ipam().node_count(), 1);
}

#[test]
fn a_deleted_config_loses_our_finalizer_only_once_drained() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &["10.0.0.0/30"]))),
    );
    let mut deleting = pool(true);
    deleting.metadata.deletion_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_002).unwrap_or_default(),
    ));
    m.handle(at(2), Input::Config(Watch::Applied(deleting)));
    let out = m.handle(at(2), Input::Tick);
    let removal = |out: &[Effect]| {
        config_jobs(out)
            .iter()
            .any(|j| matches!(j, ConfigJob::RemoveFinalizer { .. }))
    };
    assert!(!removal(&out), "a node still holds a block");
    m.handle(
        at(3),
        Input::Node(Watch::Deleted(node("a", "u-a", &[], &["10.0.0.0/30"]))),
    );
    let out = m.handle(at(3), Input::Tick);
    assert!(removal(&out), "{out:?}");
    let status = config_jobs(&out).into_iter().find_map(|j| match j {
        ConfigJob::Status { status, .. } => Some(status.clone()),
        _ => None,
    });
    let drained = status
        .expect("a status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == nodeipam_crd::CONDITION_DRAINED)
        .expect("Drained");
    assert_eq!(drained.status, "True");
    assert!(reasons(&out).contains(&effects::DRAINED));
}

#[test]
fn a_service_cidr_keeps_its_range_out_even_after_an_update() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    m.handle(
        at(1),
        Input::Service(Watch::Applied(service_cidr("s", &["10.0.0.0/30"]))),
    );
    m.handle(
        at(1),
        Input::Service(Watch::Applied(service_cidr(
            "s",
            &["10.0.0.0/30", "fd00::/120"],
        ))),
    );
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert_eq!(writes(&out)[0].cidrs, vec![net("10.0.0.4/30")]);
}

#[test]
fn an_output_edited_by_someone_else_is_published_again() {
    let (mut m, _) = synced(options(true));
    let out = m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    assert!(out.iter().any(|e| matches!(e, Effect::Publish(_))));
    let out = m.handle(at(1), Input::Tick);
    assert!(
        !out.iter().any(|e| matches!(e, Effect::Publish(_))),
        "unchanged: not again"
    );
    let edited = configmap("nodeipam-system", "pod-network", BTreeMap::new());
    let out = m.handle(at(2), Input::Output(0, Watch::Applied(edited)));
    assert!(
        out.iter().any(|e| matches!(e, Effect::Publish(_))),
        "{out:?}"
    );
}

#[test]
fn a_status_edited_by_someone_else_is_written_back() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let out = m.handle(at(1), Input::Tick);
    let Some(ConfigJob::Status { status, .. }) = config_jobs(&out).first().copied().cloned() else {
        panic!("a status write expected: {out:?}");
    };
    let mut echo = pool(true);
    echo.status = Some(status.clone());
    m.handle(at(2), Input::Config(Watch::Applied(echo.clone())));
    assert!(
        config_jobs(&m.handle(at(2), Input::Tick)).is_empty(),
        "our own echo"
    );
    let mut edited = echo;
    edited.status = Some(NodeIPAMConfigStatus {
        nodes: Some(42),
        ..status
    });
    m.handle(at(3), Input::Config(Watch::Applied(edited)));
    let out = m.handle(at(3), Input::Tick);
    assert!(
        matches!(config_jobs(&out)[..], [ConfigJob::Status { status, .. }] if status.nodes == Some(0)),
        "{out:?}"
    );
}

fn at_ms(ms: u64) -> Now {
    Now {
        mono: Duration::from_millis(ms),
        wall_seconds: 1_800_000_000 + i64::try_from(ms / 1000).unwrap_or(0),
    }
}

fn statuses(effects: &[Effect]) -> Vec<&NodeIPAMConfigStatus> {
    config_jobs(effects)
        .into_iter()
        .filter_map(|j| match j {
            ConfigJob::Status { status, .. } => Some(status),
            _ => None,
        })
        .collect()
}

/// A node every 200 ms (a tick each), all served: the counts go out once a second, not at
/// every tick, and the last of them is not lost; the tick at which the range runs out writes
/// at once.
#[test]
fn counts_are_written_once_a_second_and_a_flipped_condition_at_once() {
    let (mut m, _) = synced(options(false));
    // 8 blocks of /30 in a /27.
    let small = config(
        "small",
        "c1",
        1,
        (Some(("10.0.0.0/27", 30)), None),
        None,
        true,
    );
    m.handle(at_ms(1000), Input::Config(Watch::Applied(small)));
    let first = m.handle(at_ms(1000), Input::Tick);
    assert_eq!(statuses(&first).len(), 1, "{first:?}");
    let mut written = Vec::new();
    for i in 0..8u64 {
        let t = at_ms(1200 + 200 * i);
        let out = m.handle(
            t,
            Input::Node(Watch::Applied(node(
                &format!("n{i}"),
                &format!("u{i}"),
                &[],
                &[],
            ))),
        );
        let job = writes(&out)[0].clone();
        m.handle(t, applied(&job));
        let out = m.handle(t, Input::Tick);
        written.extend(
            statuses(&out)
                .into_iter()
                .map(|s| (1200 + 200 * i, s.clone())),
        );
    }
    let nodes: Vec<(u64, Option<u64>)> = written.iter().map(|(t, s)| (*t, s.nodes)).collect();
    // At 2.0 s (a second after the first write) with 5 nodes; at 2.6 s the eighth node took
    // the last block: Exhausted flipped, written at once.
    assert_eq!(nodes, vec![(2000, Some(5)), (2600, Some(8))], "{written:?}");
    let exhausted = |s: &NodeIPAMConfigStatus| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Exhausted" && c.status == "True")
    };
    assert!(!exhausted(&written[0].1) && exhausted(&written[1].1));

    // A node leaves: the flip back goes out at once too; then counts wait again.
    let gone = node("n0", "u0", &[], &["10.0.0.0/30"]);
    m.handle(at_ms(2800), Input::Node(Watch::Deleted(gone)));
    let out = m.handle(at_ms(2800), Input::Tick);
    assert!(
        matches!(statuses(&out)[..], [s] if s.nodes == Some(7) && !exhausted(s)),
        "{out:?}"
    );
    let gone = node("n1", "u1", &[], &["10.0.0.4/30"]);
    m.handle(at_ms(3000), Input::Node(Watch::Deleted(gone)));
    assert!(statuses(&m.handle(at_ms(3000), Input::Tick)).is_empty());
    assert!(statuses(&m.handle(at_ms(3600), Input::Tick)).is_empty());
    let out = m.handle(at_ms(3800), Input::Tick);
    assert!(
        matches!(statuses(&out)[..], [s] if s.nodes == Some(6)),
        "the last count: {out:?}"
    );
    assert!(
        statuses(&m.handle(at_ms(4800), Input::Tick)).is_empty(),
        "nothing moved"
    );
}

#[test]
fn the_pending_gauge_follows_every_step() {
    let (mut m, _) = synced(options(false));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert_eq!(metrics(&out).last(), Some(&Metric::Pending(1)));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Deleted(node("a", "u-a", &[], &[]))),
    );
    assert_eq!(metrics(&out).last(), Some(&Metric::Pending(0)));
}

/// A node whose podCIDR write has not been seen to land still waits for its podCIDRs: it is
/// pending until the write's outcome confirms it, however long the write is retried.
#[test]
fn a_node_whose_write_has_not_landed_is_still_pending() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    let job = writes(&out)[0].clone();
    assert_eq!(
        metrics(&out).last(),
        Some(&Metric::Pending(1)),
        "written, not landed"
    );
    let conflict = Input::Written(WriteResult {
        job: job.clone(),
        outcome: WriteOutcome::Conflict {
            reason: "409".into(),
            now: NodeNow::Empty {
                uid: Some("u-a".into()),
                fence: crate::seal::Fence::default(),
            },
        },
    });
    let out = m.handle(at(2), conflict);
    let retry = writes(&out)[0].clone();
    assert_eq!(metrics(&out).last(), Some(&Metric::Pending(1)), "retried");
    let out = m.handle(at(3), applied(&retry));
    assert_eq!(metrics(&out).last(), Some(&Metric::Pending(0)), "landed");
}

#[test]
#[should_panic(expected = "injected fault")]
fn the_injected_fault_panics_on_its_node() {
    let (mut m, _) = synced(Options {
        panic_on_node: Some("boom".into()),
        ..options(false)
    });
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("boom", "u", &[], &[]))),
    );
}

/// The metrics behind the alerts: kcm's max gauge and the status of each config as computed,
/// and a config that is gone says so, so that its series are dropped.
#[test]
fn a_flush_reports_capacity_and_status_and_a_gone_config_is_reported() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let out = m.handle(at(1), Input::Tick);
    let all = metrics(&out);
    assert!(
        all.iter().any(|x| matches!(x, Metric::Capacity { range, blocks } if *range == net("10.0.0.0/29") && *blocks > 0)),
        "{all:?}"
    );
    let status = all
        .iter()
        .find_map(|x| match x {
            Metric::Status { config, status } if config == "pool" => Some(status.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no status metric: {all:?}"));
    assert!(
        status.conditions.iter().any(|c| c.type_ == "Exhausted"),
        "{status:?}"
    );

    let out = m.handle(at(2), Input::Config(Watch::Deleted(pool(true))));
    assert!(
        metrics(&out).contains(&Metric::ConfigGone("pool".into())),
        "{out:?}"
    );
}
