//! Writes chosen blocks into `node.spec.podCIDRs` and reports what the API server made of it.
//! It decides nothing: the allocation loop turns each outcome into a decision.

use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::{Semaphore, mpsc};
use tracing::debug;

use super::handover;
use super::{CONFIG_ANNOTATION, Context, MANAGER};
use crate::alloc::effects::{WriteJob, WriteResult};
use crate::alloc::outcome::{Answer, NodeNow, WriteOutcome, classify};
use crate::alloc::seal::Fence;
use crate::node::IpamNode;

/// Runs jobs with bounded concurrency until the job channel closes.
pub async fn run(
    ctx: Arc<Context>,
    mut jobs: mpsc::UnboundedReceiver<WriteJob>,
    results: mpsc::UnboundedSender<WriteResult>,
) {
    let permits = Arc::new(Semaphore::new(ctx.options.write_concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let job = tokio::select! {
            job = jobs.recv() => match job {
                Some(job) => job,
                None => return,
            },
            // A write that panicked takes the writer (and so the session) with it.
            Some(Err(e)) = tasks.join_next(), if !tasks.is_empty() => {
                if e.is_panic() {
                    std::panic::resume_unwind(e.into_panic());
                }
                continue;
            }
        };
        let (ctx, results) = (ctx.clone(), results.clone());
        if job.attempt > 0 {
            // A retry sleeps before it takes a slot: a few nodes whose writes keep failing
            // must not hold the slots every other node is waiting for.
            let permits = permits.clone();
            tasks.spawn(async move {
                tokio::time::sleep(backoff(job.attempt)).await;
                // The semaphore is fair: writes take slots in the order they became due.
                let Ok(permit) = permits.acquire_owned().await else {
                    return;
                };
                write_and_report(&ctx, job, &results).await;
                drop(permit);
            });
        } else {
            // A first attempt waits for its slot here, so a backlog of thousands of nodes
            // waits in the channel as jobs, not as thousands of tasks.
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            tasks.spawn(async move {
                write_and_report(&ctx, job, &results).await;
                drop(permit);
            });
        }
        // Reap finished tasks so the set does not grow with every job.
        while let Some(done) = tasks.try_join_next() {
            if let Err(e) = done
                && e.is_panic()
            {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }
    // Returning drops the JoinSet, which aborts writes still in flight: they were for a lost
    // session.
}

async fn write_and_report(
    ctx: &Context,
    job: WriteJob,
    results: &mpsc::UnboundedSender<WriteResult>,
) {
    let outcome = write(ctx, &job).await;
    let _ = results.send(WriteResult { job, outcome });
}

/// The wait before retry `attempt` (from 0) of every writer: 100 ms doubling up to 15 s, plus
/// up to as much again at random (backon's exponential backoff with jitter), so never more
/// than 30 s. The jitter spreads the writers of both replicas that an overloaded or
/// throttling API server failed at the same moment, instead of sending them back together.
/// It only times the shell's retries: what is retried, and when a retry is moot, is decided
/// by the pure core, whose own waits stay deterministic for the simulator.
pub fn backoff(attempt: u32) -> Duration {
    use backon::BackoffBuilder;
    // Past the cap every step is the same, so a long failure costs at most this many steps.
    const STEPS_TO_CAP: u32 = 8;
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(100))
        .with_factor(2.0)
        .with_max_delay(Duration::from_secs(15))
        .without_max_times()
        .with_jitter()
        .build()
        .nth(attempt.min(STEPS_TO_CAP) as usize)
        .unwrap_or(Duration::from_secs(30))
}

async fn write(ctx: &Context, job: &WriteJob) -> WriteOutcome {
    if ctx.options.fault == Some(super::Fault::PanicInWriter(job.node.clone())) {
        panic!("injected fault: panic writing node {}", job.node);
    }
    // The answer is read as an IpamNode: only uid and podCIDRs matter, not the whole object.
    let api: Api<IpamNode> = Api::all(ctx.client.clone());
    // Tested on the UID (never a node recreated under the name) and on the seal as read (a
    // successor's seal fails it however late it arrives), never on the whole Node's version,
    // which every kubelet heartbeat moves (docs/single-writer.md, step 2a).
    let patch: json_patch::Patch = match serde_json::from_value(job.patch(CONFIG_ANNOTATION)) {
        Ok(patch) => patch,
        // Cannot happen (the core builds only the operations JSON patch has); were it to, the
        // write is one the API server would refuse, and counts as such.
        Err(e) => return failed(ctx, job, Some(400), format!("not a JSON patch: {e}")).await,
    };
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    let sent = ctx
        .write(api.patch(&job.node, &params, &Patch::Json::<()>(patch)))
        .await;
    let node = match sent {
        Ok(node) => node,
        // Refused before it went: it cannot land, so it is retried, never leaked.
        Err(e) if super::NotSent::is(&e) => {
            return WriteOutcome::NotSent {
                reason: e.to_string(),
            };
        }
        Err(e) => {
            let reason = match &e {
                kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
                other => other.to_string(),
            };
            return failed(ctx, job, handover::answer::<()>(&Err(e)), reason).await;
        }
    };
    WriteOutcome::Applied {
        uid: node.metadata.uid.clone(),
        cidrs: node.cidrs().unwrap_or_default(),
    }
}

/// A write that did not come back with the Node: what its answer (`None`: none, within the
/// write timeout) means, by the one rule of [`classify`].
async fn failed(
    ctx: &Context,
    job: &WriteJob,
    answer: Option<u16>,
    reason: String,
) -> WriteOutcome {
    match classify(answer) {
        Answer::Missing => WriteOutcome::Missing,
        Answer::Throttled => WriteOutcome::Throttled,
        Answer::Conflict => {
            debug!(node = %job.node, %reason, "podCIDR write sent for an older version of the node");
            WriteOutcome::Conflict {
                reason,
                now: reread(ctx, &job.node).await,
            }
        }
        Answer::Rejected => {
            debug!(node = %job.node, %reason, "podCIDR write rejected");
            WriteOutcome::Rejected {
                reason,
                now: reread(ctx, &job.node).await,
            }
        }
        // A 2xx always carries the Node; one that did not parse is as good as no answer.
        Answer::Ambiguous | Answer::Applied => WriteOutcome::Ambiguous {
            reason,
            now: reread(ctx, &job.node).await,
        },
    }
}

/// A fresh GET, so that the decision never rests on a watch event that may lag.
pub async fn reread(ctx: &Context, name: &str) -> NodeNow {
    let api: Api<IpamNode> = Api::all(ctx.client.clone());
    match ctx.read(api.get_opt(name)).await {
        Ok(Some(node)) => match node.cidrs() {
            Ok(c) if c.is_empty() => NodeNow::Empty {
                fence: Fence::of(&node),
                uid: node.metadata.uid,
            },
            Ok(c) => NodeNow::Has {
                uid: node.metadata.uid,
                cidrs: c,
            },
            Err(e) => NodeNow::Unknown(e),
        },
        Ok(None) => NodeNow::Gone,
        Err(e) => NodeNow::Unknown(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each wait lies between its attempt's base and twice that, and the jitter varies it.
    #[test]
    fn backoff_doubles_with_jitter_and_is_capped() {
        let within = |attempt: u32, base: Duration| {
            let waits: Vec<Duration> = (0..50).map(|_| backoff(attempt)).collect();
            for w in &waits {
                assert!(
                    *w >= base && *w <= base * 2,
                    "attempt {attempt}: {w:?} not within {base:?} and twice that"
                );
            }
            assert!(
                waits.iter().any(|w| *w != waits[0]),
                "attempt {attempt}: no jitter in {waits:?}"
            );
        };
        within(0, Duration::from_millis(100));
        within(3, Duration::from_millis(800));
        within(7, Duration::from_millis(12_800));
        within(8, Duration::from_secs(15));
        within(50, Duration::from_secs(15));
        within(u32::MAX, Duration::from_secs(15));
    }
}
