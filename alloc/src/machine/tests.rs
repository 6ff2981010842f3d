//! The machine's handlers, one fact at a time: what each input makes it do.

use std::collections::BTreeMap;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nodeipam_crd::{Allocation as AllocationSwitch, FINALIZER, NodeIPAMConfigStatus};

use super::*;
use crate::effects::{self, ChildConfig, CreateOutcome, WriteJob, WriteResult};
use crate::fixtures::{config, configmap, node, service_cidr};
use crate::outcome::{NodeNow, WriteOutcome};
use crate::podnetwork::{ConfigMapRef, OutputKind};
use crate::pool::{self as scaling, PoolInput, PoolStatus};

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
            vec![(target("pod-network"), OutputKind::PodNetwork)]
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
                    version: None,
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

// ----- what the simulator found -----

#[test]
fn a_node_object_re_created_with_the_same_pod_cidrs_takes_over_the_record() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-old", &[], &["10.0.0.0/30"]))),
    );
    // The old object's delete fell between two lists; the relist shows the new one.
    m.handle(at(2), Input::Node(Watch::ListStart));
    m.handle(
        at(2),
        Input::Node(Watch::Listed(node("a", "u-new", &[], &["10.0.0.0/30"]))),
    );
    m.handle(at(2), Input::Node(Watch::ListDone));
    m.handle(
        at(3),
        Input::Node(Watch::Deleted(node("a", "u-new", &[], &["10.0.0.0/30"]))),
    );
    assert_eq!(
        m.ipam().node_count(),
        0,
        "the new object's delete frees the block"
    );
}

#[test]
fn a_failed_re_read_is_asked_again_later() {
    let (mut m, _) = synced(options(false));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &["192.168.0.0/24"]))),
    );
    m.handle(at(2), Input::Node(Watch::ListStart));
    m.handle(at(2), Input::Node(Watch::ListDone));
    let unknown = Input::Reread {
        node: "a".into(),
        uid: Some("u-a".into()),
        now: NodeNow::Unknown("timeout".into()),
    };
    m.handle(at(2), unknown);
    let rereads = |out: &[Effect]| {
        out.iter()
            .filter(|e| matches!(e, Effect::Reread { .. }))
            .count()
    };
    assert_eq!(rereads(&m.handle(at(3), Input::Tick)), 0, "not at once");
    assert_eq!(rereads(&m.handle(at(8), Input::Tick)), 1, "asked again");
}

#[test]
fn a_config_whose_finalizer_request_came_to_nothing_is_asked_again() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(false))));
    // Done, but on an object deleted and created again meanwhile.
    m.handle(
        at(1),
        Input::ConfigWritten(ConfigJob::AddFinalizer {
            name: "pool".into(),
        }),
    );
    let out = m.handle(at(2), Input::Tick);
    assert!(
        matches!(config_jobs(&out)[..], [ConfigJob::AddFinalizer { .. }, ..]),
        "{out:?}"
    );
}

#[test]
fn a_service_cidr_update_that_frees_blocks_serves_the_waiting_nodes() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let all = service_cidr("s", &["10.0.0.0/29"]);
    m.handle(at(1), Input::Service(Watch::Applied(all)));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(writes(&out).is_empty());
    let out = m.handle(
        at(2),
        Input::Service(Watch::Applied(service_cidr("s", &["10.0.0.0/30"]))),
    );
    assert_eq!(writes(&out)[0].cidrs, vec![net("10.0.0.4/30")]);
}

#[test]
fn a_landed_status_that_says_drained_holds_allocation_until_a_later_one_lands() {
    let (mut m, _) = synced(options(false));
    let mut disabled = pool(true);
    disabled.spec.allocation = AllocationSwitch::Disabled;
    m.handle(at(1), Input::Config(Watch::Applied(disabled)));
    let out = m.handle(at(1), Input::Tick);
    let drained = config_jobs(&out)
        .into_iter()
        .find(|j| matches!(j, ConfigJob::Status { .. }))
        .cloned()
        .expect("a Drained status");
    // Enabled again; the Drained status lands before the watch shows it.
    let mut enabled = pool(true);
    enabled.metadata.generation = Some(3);
    m.handle(at(2), Input::Config(Watch::Applied(enabled)));
    m.handle(at(2), Input::ConfigWritten(drained));
    let out = m.handle(
        at(2),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(
        writes(&out).is_empty(),
        "allocated under a status that says Drained"
    );
    let out = m.handle(at(3), Input::Tick);
    let undrained = config_jobs(&out)
        .into_iter()
        .find(|j| matches!(j, ConfigJob::Status { .. }))
        .cloned()
        .expect("a status that is no longer Drained");
    let out = m.handle(at(3), Input::ConfigWritten(undrained));
    assert_eq!(writes(&out).len(), 1, "{out:?}");
}

#[test]
fn a_publication_in_flight_that_lacks_a_range_keeps_its_gate_closed() {
    let (mut m, _) = synced(options(true));
    let out = m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let with = out
        .iter()
        .find_map(|e| match e {
            Effect::Publish(n) => Some(n.clone()),
            _ => None,
        })
        .expect("published");
    // The config goes; a network without it is sent; a same-named config comes back before
    // that network landed, and the watch still shows the older one that had the range.
    let out = m.handle(at(2), Input::Config(Watch::Deleted(pool(true))));
    assert!(out.iter().any(|e| matches!(e, Effect::Publish(_))));
    m.handle(at(3), Input::Config(Watch::Applied(pool(true))));
    let stale = configmap(
        "nodeipam-system",
        "pod-network",
        with.configmap_data("then"),
    );
    m.handle(at(3), Input::Output(0, Watch::Applied(stale)));
    let out = m.handle(
        at(3),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(
        writes(&out).is_empty(),
        "allocated on a stale view of the pod network"
    );
}

#[test]
fn a_node_waiting_behind_a_gate_is_warned_only_after_the_grace() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(false))));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(reasons(&out).is_empty(), "warned at once: {out:?}");
    let grace = GATE_GRACE.as_secs();
    let out = m.handle(at(grace), Input::Tick);
    assert!(reasons(&out).is_empty(), "warned before the grace: {out:?}");
    let out = m.handle(at(1 + grace), Input::Tick);
    assert_eq!(reasons(&out), vec![effects::CIDR_NOT_AVAILABLE]);
    let out = m.handle(at(2 + grace), Input::Tick);
    assert!(reasons(&out).is_empty(), "warned twice: {out:?}");
    // The gate opens after all: the node is served.
    let out = m.handle(at(3 + grace), Input::Config(Watch::Applied(pool(true))));
    assert_eq!(writes(&out).len(), 1);
}

#[test]
fn a_node_no_config_selects_is_warned_at_once() {
    let (mut m, _) = synced(options(false));
    // A config exists, for other nodes: a node none selects is misconfigured, not early.
    let other = config(
        "other",
        "c2",
        1,
        (Some(("10.8.0.0/16", 24)), None),
        Some(crate::fixtures::selecting("zone", "elsewhere")),
        true,
    );
    m.handle(at(0), Input::Config(Watch::Applied(other)));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert_eq!(reasons(&out), vec![effects::CIDR_NOT_AVAILABLE]);
}

#[test]
fn before_the_first_config_nodes_are_warned_only_after_the_grace() {
    let (mut m, _) = synced(options(false));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(reasons(&out).is_empty(), "warned at once: {out:?}");
    let grace = GATE_GRACE.as_secs();
    let out = m.handle(at(1 + grace), Input::Tick);
    assert_eq!(reasons(&out), vec![effects::CIDR_NOT_AVAILABLE]);
}

// ----- pools -----

fn pool_options() -> Options {
    Options {
        pools: true,
        ..options(false)
    }
}

/// A synced machine that watches pools and knows `pool`.
fn with_pool(pool: PoolInput) -> Machine {
    let mut m = Machine::new(pool_options());
    m.handle(at(0), Input::Node(Watch::ListDone));
    m.handle(at(0), Input::Config(Watch::ListDone));
    m.handle(at(0), Input::Pool(Watch::Listed(pool)));
    m.handle(at(0), Input::Pool(Watch::ListDone));
    assert!(m.synced());
    m
}

fn creates(effects: &[Effect]) -> Vec<&ChildConfig> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::CreateConfig(c) => Some(c),
            _ => None,
        })
        .collect()
}

fn deletes(effects: &[Effect]) -> Vec<(&str, Option<&str>)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::DeleteConfig { name, uid } => Some((name.as_str(), uid.as_deref())),
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

/// The child the API server made of a create, with our finalizer on it.
fn child_object(c: &ChildConfig, uid: &str) -> NodeIPAMConfig {
    let mut obj = c.object();
    obj.metadata.uid = Some(uid.into());
    obj.metadata.generation = Some(1);
    obj.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap_or_default(),
    ));
    obj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    obj
}

fn small_pool(min: u32, max: u32, headroom: u64) -> PoolInput {
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

fn published(effects: &[Effect]) -> Option<PodNetwork> {
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
    let mut seen = object.clone();
    seen.metadata.uid = Some("c-1".into());
    seen.metadata.generation = Some(1);
    let out = m.handle(at(1), Input::Config(Watch::Applied(seen)));
    assert!(config_jobs(&out).is_empty(), "{out:?}");
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
    assert_eq!(writes(&out).len(), 1, "{out:?}");
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

// ----- leaks: a write whose outcome is unknown holds its config -----

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
            version: None,
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

fn deleting(mut c: NodeIPAMConfig, seconds: i64) -> NodeIPAMConfig {
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

fn removes_finalizer(effects: &[Effect]) -> bool {
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

// ----- status counts: allocated and nodes count the same blocks -----

/// What a config's status should count, recounted from the nodes: the nodes holding a block
/// of it, and those blocks, a block being the oldest config's whose range contains it.
fn recount(nodes: &[(String, IpNet)], configs: &[(&str, i64, &str)], name: &str) -> (u64, u64) {
    let owner = |block: &IpNet| {
        configs
            .iter()
            .filter(|(_, _, range)| net(range).contains(block))
            .min_by_key(|(n, created, _)| (*created, *n))
            .map(|(n, _, _)| *n)
    };
    let ours: Vec<&(String, IpNet)> = nodes
        .iter()
        .filter(|(_, b)| owner(b) == Some(name))
        .collect();
    (ours.len() as u64, ours.len() as u64)
}

/// The last status among `effects` for `name`: `(nodes, allocated)`.
fn counts(effects: &[Effect], name: &str) -> Option<(u64, u64)> {
    config_jobs(effects)
        .into_iter()
        .rev()
        .find_map(|j| match j {
            ConfigJob::Status {
                name: n, status, ..
            } if n == name => Some((
                status.nodes.unwrap_or(0),
                status.ipv4.map_or(0, |f| f.allocated),
            )),
            _ => None,
        })
}

/// Serves `count` new nodes (`prefix0`…) and confirms their writes: who holds what.
fn serve(m: &mut Machine, now: Now, prefix: &str, count: usize) -> Vec<(String, IpNet)> {
    let mut held = Vec::new();
    for i in 0..count {
        let name = format!("{prefix}{i}");
        let out = m.handle(
            now,
            Input::Node(Watch::Applied(node(&name, &format!("u-{name}"), &[], &[]))),
        );
        let job = writes(&out)[0].clone();
        m.handle(now, applied(&job));
        held.push((name, job.cidrs[0]));
    }
    held
}

#[test]
fn the_losing_config_of_an_overlapping_pair_counts_none_of_the_older_ones_blocks() {
    let (mut m, _) = synced(options(false));
    let range = "10.0.0.0/28";
    let configs = [("older", 1, range), ("younger", 2, range)];
    let older = config("older", "c-o", 1, (Some((range, 30)), None), None, true);
    m.handle(at(1), Input::Config(Watch::Applied(older)));
    let held = serve(&mut m, at(1), "n", 4);
    // Past the webhook (it was down, or a race): the same range, younger.
    let younger = config("younger", "c-y", 2, (Some((range, 30)), None), None, true);
    m.handle(at(2), Input::Config(Watch::Applied(younger)));
    let out = m.handle(at(3), Input::Tick);
    assert_eq!(
        counts(&out, "older"),
        Some(recount(&held, &configs, "older"))
    );
    assert_eq!(
        counts(&out, "younger"),
        Some(recount(&held, &configs, "younger")),
        "nodes and allocated count the same blocks: {out:?}"
    );
    // The range's usage is one gauge: both configs set it to the blocks in use by anyone.
    let usage: Vec<Metric> = metrics(&out)
        .into_iter()
        .filter(|m| matches!(m, Metric::Usage { .. }))
        .collect();
    let full = Metric::Usage {
        range: net(range),
        ratio: 1.0,
    };
    assert_eq!(usage, vec![full.clone(), full], "{out:?}");
    // The older one is gone (its finalizer taken off by hand): its blocks are the younger
    // one's now, and its status says so without any node moving.
    let older = config("older", "c-o", 1, (Some((range, 30)), None), None, true);
    m.handle(at(4), Input::Config(Watch::Deleted(older)));
    let out = m.handle(at(5), Input::Tick);
    let configs = [("younger", 2, range)];
    assert_eq!(
        counts(&out, "younger"),
        Some(recount(&held, &configs, "younger")),
        "{out:?}"
    );
}

#[test]
fn a_config_ready_once_an_older_one_with_its_range_drained_away_counts_its_nodes() {
    let (mut m, _) = synced(options(false));
    let range = "10.0.0.0/28";
    let older = config("older", "c-o", 1, (Some((range, 30)), None), None, true);
    let younger = config("younger", "c-y", 2, (Some((range, 30)), None), None, true);
    m.handle(at(1), Input::Config(Watch::Applied(older.clone())));
    // A node of the older one's, gone again before the older one is deleted.
    let first = serve(&mut m, at(1), "early", 1);
    m.handle(at(1), Input::Config(Watch::Applied(younger)));
    let (name, cidr) = &first[0];
    let gone = node(name, &format!("u-{name}"), &[], &[&cidr.to_string()]);
    m.handle(at(2), Input::Node(Watch::Deleted(gone)));
    m.handle(
        at(2),
        Input::Config(Watch::Applied(deleting(older.clone(), 2))),
    );
    let out = m.handle(at(3), Input::Tick);
    assert!(removes_finalizer(&out), "the older one drained: {out:?}");
    m.handle(at(3), Input::Config(Watch::Deleted(deleting(older, 2))));
    // The younger one is Ready now and serves three nodes.
    let held = serve(&mut m, at(4), "n", 3);
    let out = m.handle(at(5), Input::Tick);
    let configs = [("younger", 2, range)];
    assert_eq!(
        counts(&out, "younger"),
        Some(recount(&held, &configs, "younger")),
        "{out:?}"
    );
}
