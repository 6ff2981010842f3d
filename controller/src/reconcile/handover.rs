//! What a leader hands the next one, and how long the next one waits before it writes.
//!
//! The rule: a write may land after its sender gave up on it (a timeout, a dropped
//! connection, a 5xx whose handler still runs: [`nodeipam_alloc::outcome::may_still_land`]). A
//! new leader that lists before such a write lands sees its node as pending and could hand its
//! block to another node. So a new leader waits (`Options::takeover_delay`) unless the Lease
//! carries [`HANDOVER_ANNOTATION`] = [`SETTLED`], which a leader writes only after (1) its own
//! session began after such a wait or such a hand-over, so nothing of an earlier leader can
//! land, (2) it stopped sending and (3) every request it sent got an answer after which it
//! cannot land. The successor removes the mark before it writes anything, so a mark never
//! outlives the quiet it vouches for.
//!
//! The wait covers writes *sent*; it must also start only once the predecessor *sends*
//! nothing more ([`Takeover`]): a Lease taken after it was seen unchanged for a whole term, or
//! let go marked [`STOPPED`] by a holder that stopped, says so. A Lease that is missing, or
//! freed by hand, says nothing: its last holder may go on writing until its own term runs
//! out, so the successor waits a whole lease duration more ([`wait`]). Only when no
//! NodeIPAMConfig carries our finalizer (nothing was ever allocated from any range, as a first
//! install) is there nothing to wait for.
//!
//! A leader puts [`LEASE_FINALIZER`] on its Lease before its first write and takes it off
//! only with the mark, or once a deletion of the Lease stopped it and its writes had time to
//! land; then it creates the next Lease itself, marked settled if it led on the one let go
//! up to its deletion (`lease::next_mark`; unmarked after a hand edit, whose displaced
//! leader may still send). So a Lease deleted under a live leader stays (terminating, led by
//! nobody) until that leader is quiet. Deciding is pure and lives in the core
//! (`nodeipam_alloc::lease`: `takeover`, `wait`, `releasable`, `next_mark`, `unclaimable`,
//! run on the Lease as [`view`] reads it); `claim`, `mark`, `create` and `release` only read
//! and write it.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::Notify;
use tracing::debug;

use super::lease_lock::Took;
use crate::alloc::lease::{self, LeaseView, Mark};
use crate::alloc::outcome::may_still_land;

pub use crate::alloc::lease::{Takeover, wait};

/// The annotation on the Lease by which a leader that stopped cleanly vouches that none of
/// its writes (nor any earlier leader's) can still land.
pub const HANDOVER_ANNOTATION: &str = "nodeipam.io/handover";
/// Its value when nothing of the leader that wrote it (nor of any earlier one) can still land.
pub const SETTLED: &str = "settled";
/// Its value when the leader that wrote it sends nothing more, though what it sent may still
/// land: the successor waits only for that.
pub const STOPPED: &str = "stopped";
/// The finalizer that keeps a Lease whose leader may have writes in flight from vanishing.
pub const LEASE_FINALIZER: &str = "nodeipam.io/leader";
/// Field manager of the mark, apart from the lease manager's own.
const FIELD_MANAGER: &str = "nodeipam-handover";
/// How long one Lease request may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The Lease this replica elects with.
#[derive(Clone, Debug)]
pub struct LeaseRef {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How the election's lock took the Lease, set each time it claims it.
    pub took: super::leader::TookCell,
    /// Whether our allocation session runs, its take-over wait over (set by the allocation
    /// loop, read by the election).
    pub session: super::leader::SessionCell,
    /// The lease duration: how long a predecessor that did not say it stopped may go on.
    pub term: Duration,
}

/// Whether a request's outcome is final: it can no longer land later (the one rule,
/// [`nodeipam_alloc::outcome::may_still_land`], that the writers use too).
pub fn definite<T>(result: &Result<T, kube::Error>) -> bool {
    matches!(result, Err(e) if super::NotSent::is(e)) || !may_still_land(answer(result))
}

/// The HTTP status a request was answered with: `Some(200)` for success, `None` without an
/// answer (a timeout, a connection lost).
pub fn answer<T>(result: &Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => Some(200),
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(_) => None,
    }
}

/// `lease` as the lock's rules read it.
pub fn view(lease: &Lease) -> LeaseView {
    let spec = lease.spec.as_ref();
    LeaseView {
        version: version(lease),
        holder: holder(lease).map(str::to_string),
        renewed: spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.as_microsecond()),
        duration: spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs),
        mark: match lease
            .annotations()
            .get(HANDOVER_ANNOTATION)
            .map(String::as_str)
        {
            Some(SETTLED) => Some(Mark::Settled),
            Some(STOPPED) => Some(Mark::Stopped),
            _ => None,
        },
        terminating: lease.metadata.deletion_timestamp.is_some(),
        finalized: holds_finalizer(lease),
    }
}

/// The annotation value of `mark`.
pub fn mark_value(mark: Mark) -> &'static str {
    match mark {
        Mark::Settled => SETTLED,
        Mark::Stopped => STOPPED,
    }
}

/// What identifies one version of a Lease: its resourceVersion (or, without one, its spec).
fn version(lease: &Lease) -> String {
    match lease.resource_version() {
        Some(v) if !v.is_empty() => v,
        _ => format!("{:?}", lease.spec),
    }
}

/// Who the Lease names, if anyone.
pub(super) fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
}

fn holds_finalizer(lease: &Lease) -> bool {
    lease.finalizers().iter().any(|f| f == LEASE_FINALIZER)
}

/// Reads the Lease we hold, removes any mark (only on the version read, so nothing else
/// changed in between) and puts our finalizer on it. Clean only once that is done: a mark left
/// in place would vouch for our own writes, and a Lease without the finalizer could vanish
/// under them. An error means: ask again (a missing or terminating Lease is not ours to lead).
pub async fn claim(
    client: &Client,
    lease: &LeaseRef,
    took: Option<Took>,
) -> Result<Takeover, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &lease.namespace);
    let Some(current) = timed(api.get_opt(&lease.name)).await? else {
        return Err(kube::Error::Service("the lease is gone".into()));
    };
    let seen = view(&current);
    if let Some(why) = lease::unclaimable(&seen, &lease.identity) {
        return Err(kube::Error::Service(why.into()));
    }
    let found = lease::takeover(&seen, &lease.identity, took);
    if current.annotations().contains_key(HANDOVER_ANNOTATION) || !holds_finalizer(&current) {
        // Removed whatever we decided: a mark that did not vouch for us must not stay either.
        set_mark(&api, &current, None).await?;
    }
    Ok(found)
}

/// Marks the Lease as handed over settled and takes our finalizer off, if it still names us
/// (on the version read). Returns whether it did.
pub async fn mark(client: &Client, lease: &LeaseRef) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &lease.namespace);
    let Some(current) = timed(api.get_opt(&lease.name)).await? else {
        return Ok(false);
    };
    let holder = holder(&current);
    if holder != Some(lease.identity.as_str()) {
        debug!(
            ?holder,
            "the lease names another holder: nothing to hand over"
        );
        return Ok(false);
    }
    set_mark(&api, &current, Some(SETTLED)).await?;
    Ok(true)
}

/// Creates the Lease unless it exists, with `mark`: settled only by a replica that knows
/// nothing of any leader can still land (the one that just let the last Lease go, as
/// [`lease::next_mark`] says). Any other replica creates it unmarked (`None`): a missing Lease
/// may have been deleted by hand under a live leader. True if this call created it.
pub async fn create(
    client: &Client,
    namespace: &str,
    name: &str,
    mark: Option<Mark>,
) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let mut fresh = Lease::default();
    fresh.metadata.name = Some(name.to_string());
    if let Some(mark) = mark {
        fresh
            .annotations_mut()
            .insert(HANDOVER_ANNOTATION.into(), mark_value(mark).into());
    }
    fresh.spec = Some(Default::default());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match timed(api.create(&params, &fresh)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Takes our finalizer off a terminating Lease if it is [`lease::releasable`] by us (on the
/// version read), so that its deletion completes. The caller has waited out every write of
/// ours that could still land. Returns the Lease let go, as [`view`] read it, if it did.
pub async fn release(client: &Client, lease: &LeaseRef) -> Result<Option<LeaseView>, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &lease.namespace);
    let Some(current) = timed(api.get_opt(&lease.name)).await? else {
        return Ok(None);
    };
    let seen = view(&current);
    if !lease::releasable(&seen, &lease.identity) {
        return Ok(None);
    }
    patch_meta(&api, &current, None, false).await?;
    Ok(Some(seen))
}

/// Sets (or with `None` removes) the mark on the version of the Lease `current` is, and on no
/// later one: the API server refuses the patch (409) if anything changed in between. Our
/// finalizer goes with it: on while unmarked (a leader's writes may be in flight), off with
/// the mark.
async fn set_mark(
    api: &Api<Lease>,
    current: &Lease,
    mark: Option<&str>,
) -> Result<(), kube::Error> {
    patch_meta(api, current, Some(mark), mark.is_none()).await
}

/// One conditional merge patch of the Lease's metadata: the mark (when `mark` is given) and
/// our finalizer, on the version `current` is.
async fn patch_meta(
    api: &Api<Lease>,
    current: &Lease,
    mark: Option<Option<&str>>,
    hold: bool,
) -> Result<(), kube::Error> {
    let mut finalizers: Vec<&str> = current
        .finalizers()
        .iter()
        .map(String::as_str)
        .filter(|f| *f != LEASE_FINALIZER)
        .collect();
    if hold {
        finalizers.push(LEASE_FINALIZER);
    }
    let mut meta = json!({
        "resourceVersion": current.resource_version(),
        "finalizers": finalizers,
    });
    if let Some(mark) = mark {
        meta["annotations"] = json!({ HANDOVER_ANNOTATION: mark });
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = json!({ "metadata": meta });
    timed(api.patch(&current.name_any(), &params, &Patch::Merge(&patch))).await?;
    Ok(())
}

/// A request to the Lease, bounded by [`REQUEST_TIMEOUT`].
pub(super) async fn timed<T>(
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    super::bounded(REQUEST_TIMEOUT, request).await
}

/// The mutating requests of the current session: how many are in flight, whether any ended
/// without a definite answer, and whether new ones may still start.
#[derive(Debug, Default)]
pub struct InFlight {
    state: Mutex<State>,
    idle: Notify,
}

#[derive(Debug, Default)]
struct State {
    closed: bool,
    count: usize,
    unanswered: bool,
}

impl InFlight {
    /// A session begins (after the take-over wait or a clean hand-over, which covers every
    /// earlier request): new requests may start, and only its own count from here.
    pub fn begin(&self) {
        let mut s = self.lock();
        s.closed = false;
        // A request of an aborted session still unwinding keeps the doubt.
        s.unanswered = s.count > 0;
    }

    /// Sends one mutating request, accounted for: refused once the session is handing over,
    /// and counted as unanswered if it is dropped or ends without a definite answer.
    pub async fn send<T>(
        &self,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let Some(ticket) = self.start() else {
            return Err(super::NotSent::error("the leader is handing over"));
        };
        let result = request.await;
        ticket.finish(definite(&result));
        result
    }

    /// Whether a request of the session may still land: one is in flight (a dropped session's
    /// still unwinding), or one ended without an answer that rules it out.
    pub fn in_doubt(&self) -> bool {
        let s = self.lock();
        s.count > 0 || s.unanswered
    }

    /// Starts no more requests and waits (up to `limit`) for those in flight. True when every
    /// request of the session got a definite answer.
    pub async fn settle(&self, limit: Duration) -> bool {
        self.lock().closed = true;
        let idle = async {
            loop {
                let notified = self.idle.notified();
                if self.lock().count == 0 {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(limit, idle).await.is_err() {
            return false;
        }
        !self.lock().unanswered
    }

    fn start(&self) -> Option<Ticket<'_>> {
        let mut s = self.lock();
        if s.closed {
            return None;
        }
        s.count += 1;
        Some(Ticket {
            owner: self,
            answered: false,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent under a panic (plain counters); go on with it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One request in flight; dropped unfinished, it counts as unanswered.
struct Ticket<'a> {
    owner: &'a InFlight,
    answered: bool,
}

impl Ticket<'_> {
    fn finish(mut self, definite: bool) {
        self.answered = definite;
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut s = self.owner.lock();
        s.count -= 1;
        s.unanswered |= !self.answered;
        drop(s);
        self.owner.idle.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::core::Status;

    fn lease(holder: Option<&str>, mark: Option<&str>) -> Lease {
        let mut l = Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        if let Some(m) = mark {
            l.annotations_mut()
                .insert(HANDOVER_ANNOTATION.into(), m.into());
        }
        l
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status::failure("refused", "Test").with_code(code)))
    }

    fn being_deleted(mut l: Lease, finalizer: bool) -> Lease {
        l.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        if finalizer {
            l.finalizers_mut().push(LEASE_FINALIZER.into());
        }
        l
    }

    #[test]
    fn a_lease_reads_as_its_holder_times_mark_deletion_and_finalizer() {
        let mut l = lease(Some("b"), Some(SETTLED));
        l.metadata.resource_version = Some("7".into());
        if let Some(spec) = l.spec.as_mut() {
            spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("a time"),
            ));
            spec.lease_duration_seconds = Some(15);
        }
        let v = view(&l);
        assert_eq!(v.version, "7");
        assert_eq!(v.holder.as_deref(), Some("b"));
        assert_eq!(v.renewed, Some(1_800_000_000_000_000));
        assert_eq!(v.duration, Some(Duration::from_secs(15)));
        assert_eq!(v.term(), Some(Duration::from_secs(15)));
        assert_eq!(v.mark, Some(Mark::Settled));
        assert!(!v.terminating && !v.finalized);
        let gone = view(&being_deleted(l, true));
        assert!(gone.terminating && gone.finalized);

        assert_eq!(view(&lease(None, Some(STOPPED))).mark, Some(Mark::Stopped));
        assert_eq!(
            view(&lease(None, Some("yes"))).mark,
            None,
            "a mark we do not know"
        );
        // A negative duration holds nothing; without a version, the spec tells versions apart.
        let mut odd = lease(Some("b"), None);
        if let Some(spec) = odd.spec.as_mut() {
            spec.lease_duration_seconds = Some(-1);
        }
        assert_eq!(view(&odd).duration, None);
        assert_ne!(view(&odd).version, view(&lease(Some("c"), None)).version);
        assert_eq!(mark_value(Mark::Settled), SETTLED);
        assert_eq!(mark_value(Mark::Stopped), STOPPED);
    }

    #[test]
    fn a_lease_taken_over_reads_as_the_core_decides() {
        let free = Some(Took::Free);
        let takeover = |l: &Lease, took| lease::takeover(&view(l), "b", took);
        assert_eq!(
            takeover(&lease(Some("b"), Some(SETTLED)), free),
            Takeover::Clean
        );
        assert_eq!(
            takeover(&lease(Some("b"), Some(STOPPED)), free),
            Takeover::Unclean
        );
        assert_eq!(
            takeover(&lease(Some("b"), Some("yes")), free),
            Takeover::Unknown
        );
        assert_eq!(takeover(&Lease::default(), None), Takeover::Unknown);
        assert!(lease::releasable(
            &view(&being_deleted(lease(None, None), true)),
            "b"
        ));
        assert!(!lease::releasable(
            &view(&being_deleted(lease(None, None), false)),
            "b"
        ));
    }

    #[test]
    fn only_answers_that_rule_it_out_are_definite() {
        assert!(definite(&Ok::<(), kube::Error>(())));
        for code in [404, 409, 422, 429] {
            assert!(definite(&Err::<(), _>(api_error(code))), "{code}");
        }
        // A 500 can carry an etcd timeout whose proposal still commits.
        for code in [500, 502, 503, 504] {
            assert!(!definite(&Err::<(), _>(api_error(code))), "{code}");
        }
        assert!(!definite(&Err::<(), _>(kube::Error::Service(
            "connection reset".into()
        ))));
    }

    #[tokio::test]
    async fn a_session_whose_requests_were_all_answered_settles() {
        let f = InFlight::default();
        f.begin();
        assert!(f.send(async { Ok::<_, kube::Error>(1) }).await.is_ok());
        assert!(
            f.send(async { Err::<(), _>(api_error(409)) })
                .await
                .is_err()
        );
        assert!(f.settle(Duration::from_secs(1)).await);
        // Closed: nothing more is sent.
        let sent = std::sync::atomic::AtomicBool::new(false);
        let r = f
            .send(async {
                sent.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok::<_, kube::Error>(())
            })
            .await;
        assert!(r.is_err());
        assert!(!sent.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_request_without_an_answer_or_dropped_unsettles_the_session() {
        let f = InFlight::default();
        f.begin();
        let _ = f.send(async { Err::<(), _>(api_error(504)) }).await;
        assert!(!f.settle(Duration::from_secs(1)).await);

        let f = InFlight::default();
        f.begin();
        // Dropped mid-flight (a client-side timeout drops the request future).
        let r = tokio::time::timeout(
            Duration::from_millis(10),
            f.send(std::future::pending::<Result<(), kube::Error>>()),
        )
        .await;
        assert!(r.is_err());
        assert!(!f.settle(Duration::from_secs(1)).await);
        // The next session (after a take-over wait) starts with a clean slate.
        f.begin();
        assert!(f.settle(Duration::from_secs(1)).await);
    }

    #[tokio::test]
    async fn settling_waits_for_requests_in_flight_and_gives_up_at_its_limit() {
        let f = std::sync::Arc::new(InFlight::default());
        f.begin();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let sender = {
            let f = f.clone();
            tokio::spawn(async move {
                f.send(async {
                    let _ = rx.await;
                    Ok::<_, kube::Error>(())
                })
                .await
            })
        };
        tokio::task::yield_now().await;
        // Still in flight at the limit: not settled.
        assert!(!f.settle(Duration::from_millis(20)).await);
        let _ = tx.send(());
        assert!(sender.await.expect("sender").is_ok());
        assert!(f.settle(Duration::from_secs(1)).await);
    }
}
