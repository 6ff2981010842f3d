//! What becomes of a podCIDR write: its outcome confirmed, adopted, released or leaked, the
//! same blocks retried, chosen again or given up on (the node parked); and the re-reads of
//! nodes a relist lacks, asked again while they fail.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use ipnet::IpNet;
use tracing::{debug, error, info, warn};

use super::core::Core;
use super::nodes::{Around, Nodes};
use super::{Effect, Metric};
use crate::effects::{self, Note, WriteJob, WriteResult};
use crate::ipam::{NodeSeen, Phase};
use crate::outcome::{Decision, NodeNow, WriteOutcome, decide, refused_the_blocks};

/// How long a failed re-read of a node missing from a relist waits before it is tried again.
const REREAD_RETRY: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Default)]
pub(super) struct Writes {
    /// How many refused writes of the same blocks before we give up on them.
    write_attempts: u32,
    /// How long a node whose write we gave up on waits before it is tried again from scratch.
    retry_rejected_after: Duration,
    /// Nodes missing from a relist whose re-read failed: the UID asked about, and when to ask
    /// again.
    rereads_due: BTreeMap<String, (Option<String>, Duration)>,
}

impl Writes {
    pub(super) fn new(write_attempts: u32, retry_rejected_after: Duration) -> Self {
        Writes {
            write_attempts,
            retry_rejected_after,
            rereads_due: BTreeMap::new(),
        }
    }

    pub(super) fn on_write_result(
        &mut self,
        result: WriteResult,
        nodes: &mut Nodes,
        cx: &mut Around<'_>,
    ) {
        let WriteResult { job, outcome } = result;
        let current = matches!(
            cx.core.ipam().node(&job.node).map(|r| r.phase),
            Some(Phase::Writing { ticket, .. }) if ticket == job.ticket
        );
        if !current {
            debug!(node = %job.node, "stale write outcome ignored");
            return;
        }
        let decision = decide(&outcome, &job.cidrs, job.uid.as_deref(), job.was_ambiguous);
        debug!(node = %job.node, ?outcome, ?decision, "write outcome");
        match decision {
            Decision::Confirm { uid } => {
                cx.core
                    .ipam_mut()
                    .confirm(&job.node, job.ticket, uid.as_deref());
                if cx.core.ipam().node(&job.node).is_none() {
                    // It landed on an object deleted meanwhile.
                    nodes.freed(&job.cidrs, cx);
                }
                cx.touch(&job.cidrs);
            }
            Decision::Adopt { uid, cidrs } => {
                let adoption = cx
                    .core
                    .ipam_mut()
                    .observe_node(&job.node, uid.as_deref(), &cidrs);
                cx.touch(&cidrs);
                nodes.freed(&adoption.released, cx);
            }
            Decision::Release => {
                let freed = cx.core.ipam_mut().abandon(&job.node, job.ticket);
                nodes.freed(&freed, cx);
            }
            Decision::Leak => {
                let leaked = leak(&job, cx);
                error!(node = %job.node, ?leaked, "write outcome unknowable: blocks kept occupied, and their config held, until the write can no longer land");
            }
            Decision::Retry => return self.retry_write(job, &outcome, nodes, cx),
        }
        // The record is resolved; a newer object of the same name may be waiting.
        if nodes.is_pending(&job.node) {
            nodes.try_allocate(&job.node, cx);
        }
    }

    /// The same blocks again, unless the API server refused them too often.
    fn retry_write(
        &self,
        job: WriteJob,
        outcome: &WriteOutcome,
        nodes: &mut Nodes,
        cx: &mut Around<'_>,
    ) {
        let ambiguous = job.was_ambiguous || matches!(outcome, WriteOutcome::Ambiguous { .. });
        // A conflict, or a failed test of the UID or the seal, is the Node changing under us,
        // not a refusal of the blocks.
        let rejected = refused_the_blocks(outcome, job.uid.as_deref(), &job.fence);
        let rejections = job.rejections + u32::from(rejected);
        let why = match outcome {
            WriteOutcome::Rejected { reason, .. }
            | WriteOutcome::Conflict { reason, .. }
            | WriteOutcome::Ambiguous { reason, .. }
            | WriteOutcome::NotSent { reason } => reason.clone(),
            other => format!("{other:?}"),
        };
        if let Some((source, range)) = job
            .cidrs
            .iter()
            .find_map(|c| cx.core.ipam().service_range_over(c))
        {
            let why = format!("{range} is now a Service range ({source})");
            return choose_again(job, ambiguous, &why, nodes, cx);
        }
        if rejected && rejections >= self.write_attempts.max(1) {
            return self.give_up(job, rejections, ambiguous, &why, nodes, cx);
        }
        let attempt = job.attempt + 1;
        if attempt == 3 {
            let message = format!(
                "writing podCIDRs {:?} keeps failing: {why}; retrying",
                job.cidrs
            );
            let note = Note::node(
                &job.node,
                job.uid.as_deref(),
                true,
                effects::CIDR_ASSIGNMENT_FAILED,
                message,
            );
            cx.core.note(note);
        }
        warn!(node = %job.node, attempt, ?outcome, "podCIDR write did not land; retrying the same blocks");
        cx.core.metric(Metric::Error("node_write"));
        // The same blocks, on the seal of the Node as read since, if it was.
        let fence = match outcome {
            WriteOutcome::Rejected { now, .. }
            | WriteOutcome::Conflict { now, .. }
            | WriteOutcome::Ambiguous { now, .. } => match now {
                NodeNow::Empty { fence, .. } => fence.clone(),
                _ => job.fence.clone(),
            },
            _ => job.fence.clone(),
        };
        cx.core.push(Effect::Write(WriteJob {
            attempt,
            rejections,
            was_ambiguous: ambiguous,
            fence,
            ..job
        }));
    }

    /// The API server refused every write of these blocks (an admission policy on Nodes, a
    /// 403): stop, free the blocks so a Terminating config can drain, and try the node again
    /// from scratch later. Refused writes changed nothing; only if an earlier attempt was
    /// ambiguous might the blocks be on the node, and then they stay occupied.
    fn give_up(
        &self,
        job: WriteJob,
        rejections: u32,
        ambiguous: bool,
        why: &str,
        nodes: &mut Nodes,
        cx: &mut Around<'_>,
    ) {
        let after = self.retry_rejected_after;
        stop(&job, ambiguous, cx);
        cx.core.metric(Metric::AssignmentFailure);
        cx.core.metric(Metric::Error("node_write"));
        warn!(node = %job.node, rejections, reason = %why, "podCIDR write refused every time: gave up; the node is tried again later");
        let message = format!(
            "gave up writing podCIDRs {:?} after {rejections} refused attempts: {why}; {} and the node is tried again in {}s",
            job.cidrs,
            if ambiguous {
                "the blocks stay reserved (an earlier attempt may have landed)"
            } else {
                "the blocks are released"
            },
            after.as_secs()
        );
        let note = Note::node(
            &job.node,
            job.uid.as_deref(),
            true,
            effects::CIDR_ASSIGNMENT_FAILED,
            message,
        );
        cx.core.note(note);
        nodes.repend(job, Some(cx.core.mono() + after));
        if cx.core.synced() {
            nodes.retry_pending(cx);
        }
    }

    /// After a node (re)list, what we know but the list lacks may be gone: confirmed with a
    /// fresh GET before their blocks are released (a watch may lag, a GET does not).
    pub(super) fn relisted(&self, seen: &HashSet<String>, nodes: &Nodes, core: &mut Core) {
        let missing: Vec<(String, Option<String>)> = core
            .ipam()
            .node_names()
            .chain(nodes.waiting().map(|n| n.name))
            .filter(|n| !seen.contains(*n))
            .map(|n| {
                let uid = match core.ipam().node(n) {
                    Some(r) => r.uid.clone(),
                    None => nodes.uid(n).cloned(),
                };
                (n.to_string(), uid)
            })
            .collect();
        // A leaked write's node deleted while the watch was down: only a GET tells.
        let leaked: Vec<(String, Option<String>)> = core
            .ipam()
            .leaked_nodes()
            .filter(|(n, _)| !seen.contains(*n))
            .filter(|(n, _)| !missing.iter().any(|(m, _)| m == n))
            .map(|(n, uid)| (n.to_string(), uid.map(str::to_string)))
            .collect();
        // In name order: the allocation state keeps nodes in a hash map, and the same inputs
        // must give the same effects in the same order (the simulator replays a seed by it).
        let mut rereads: Vec<(String, Option<String>)> =
            missing.into_iter().chain(leaked).collect();
        rereads.sort();
        for (node, uid) in rereads {
            core.push(Effect::Reread { node, uid });
        }
    }

    /// A node missing from a relist, read again. `uid` is the object we asked about: a newer
    /// object of the same name keeps its blocks.
    pub(super) fn on_reread(
        &mut self,
        node: &str,
        uid: Option<&str>,
        now: NodeNow,
        nodes: &mut Nodes,
        cx: &mut Around<'_>,
    ) {
        match now {
            NodeNow::Gone => {
                nodes.on_node_gone(node, uid, cx);
                nodes.settle_leaks(node, NodeSeen::Absent, cx);
            }
            // Not known either way: ask again later, or its blocks stay held for good.
            NodeNow::Unknown(why) => {
                debug!(node, %why, "re-reading a node missing from the relist failed; retrying");
                let at = cx.core.mono() + REREAD_RETRY;
                self.rereads_due
                    .insert(node.to_string(), (uid.map(str::to_string), at));
            }
            NodeNow::Has { uid, cidrs } => {
                debug!(node, ?cidrs, "missing from the relist but still there");
                let seen = NodeSeen::Object {
                    uid: uid.as_deref(),
                    cidrs: &cidrs,
                };
                nodes.settle_leaks(node, seen, cx);
            }
            NodeNow::Empty { uid, .. } => {
                debug!(node, "missing from the relist but still there");
                let seen = NodeSeen::Object {
                    uid: uid.as_deref(),
                    cidrs: &[],
                };
                nodes.settle_leaks(node, seen, cx);
            }
        }
    }

    /// Re-reads that failed are asked again once their time comes.
    pub(super) fn reread_due(&mut self, core: &mut Core) {
        let now = core.mono();
        let due: Vec<String> = self
            .rereads_due
            .iter()
            .filter(|(_, (_, at))| *at <= now)
            .map(|(n, _)| n.clone())
            .collect();
        for node in due {
            if let Some((uid, _)) = self.rereads_due.remove(&node) {
                core.push(Effect::Reread { node, uid });
            }
        }
    }
}

/// The blocks were chosen before something made them wrong (a Service range created over
/// them): rather than write them again, let them go and choose again. Only if an earlier
/// attempt was ambiguous may they be on the node already; then they stay occupied, and a
/// new choice that finds them there adopts them.
fn choose_again(job: WriteJob, ambiguous: bool, why: &str, nodes: &mut Nodes, cx: &mut Around<'_>) {
    info!(node = %job.node, cidrs = ?job.cidrs, reason = why, "not writing these blocks again; choosing new ones");
    stop(&job, ambiguous, cx);
    let name = job.node.clone();
    nodes.repend(job, None);
    if cx.core.synced() {
        nodes.try_allocate(&name, cx);
    }
}

/// A write is not sent again: its blocks are let go, or leaked if an earlier attempt was
/// ambiguous (it may have landed).
fn stop(job: &WriteJob, ambiguous: bool, cx: &mut Around<'_>) {
    if ambiguous {
        leak(job, cx);
    } else {
        let freed = cx.core.ipam_mut().abandon(&job.node, job.ticket);
        cx.touch(&freed);
        cx.statuses.unmanaged_moved();
    }
}

/// Keeps a write's blocks occupied, and their config held, until the write can no longer
/// land, rather than risk a duplicate.
fn leak(job: &WriteJob, cx: &mut Around<'_>) -> Vec<IpNet> {
    let leaked = cx.core.ipam_mut().leak(&job.node, job.ticket);
    cx.core
        .metric(Metric::Leaked(cx.core.ipam().leaked_blocks()));
    cx.touch(&leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::node;
    use crate::machine::Now;
    use crate::machine::nodes::World;

    fn at(seconds: u64) -> Now {
        Now {
            mono: Duration::from_secs(seconds),
            wall_seconds: 0,
        }
    }

    fn rereads(core: &mut Core) -> Vec<(String, Option<String>)> {
        core.take()
            .into_iter()
            .filter_map(|e| match e {
                Effect::Reread { node, uid } => Some((node, uid)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_node_a_relist_lacks_is_read_again_and_a_failed_read_later_again() {
        let mut world = World::synced();
        let mut nodes = Nodes::default();
        let mut writes = Writes::new(3, Duration::from_secs(60));
        nodes.on_node(node("a", "u-a", &[], &[]), &mut world.around());
        world.core.take();
        writes.relisted(&HashSet::from(["b".to_string()]), &nodes, &mut world.core);
        let asked = vec![("a".to_string(), Some("u-a".to_string()))];
        assert_eq!(rereads(&mut world.core), asked);
        let unknown = NodeNow::Unknown("timeout".into());
        writes.on_reread("a", Some("u-a"), unknown, &mut nodes, &mut world.around());
        writes.reread_due(&mut world.core);
        assert!(rereads(&mut world.core).is_empty(), "not at once");
        world.core.begin(at(5));
        writes.reread_due(&mut world.core);
        assert_eq!(rereads(&mut world.core), asked);
        writes.reread_due(&mut world.core);
        assert!(rereads(&mut world.core).is_empty(), "asked once");
        writes.on_reread(
            "a",
            Some("u-a"),
            NodeNow::Gone,
            &mut nodes,
            &mut world.around(),
        );
        assert_eq!(nodes.len(), 0, "gone: it waits no more");
    }
}
