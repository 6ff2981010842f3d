//! Status counts: allocated and nodes count the same blocks, as a recount from the nodes does.

use super::leaks::{deleting, removes_finalizer};
use super::*;

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
