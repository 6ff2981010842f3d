//! Leader election that steps down on time.
//!
//! The lock ([`lease_lock`](super::lease_lock)) takes and renews the Lease with
//! compare-and-swap writes and says when it gained or lost it. It is driven with a short fixed
//! retry, and leadership is reported only while the lock claims the Lease, a Lease read back
//! from the API names us, and our own term (counted on our monotonic clock from the moment our
//! last renewal was sent) has more than a margin left: when renewals fail, the leader stops
//! allocating before any standby could count its lease as run out, and resumes (with a fresh
//! rebuild) once a renewal lands. Why that keeps one writer: docs/single-writer.md.
//!
//! A standby's lock sleeps until it could have seen the holder's Lease unchanged for a term, so
//! it would notice a Lease released by a leader that stopped cleanly (a rolling update) only up
//! to a lease duration later. A standby therefore reads the Lease every second (every read
//! also counts toward how long it has seen the Lease unchanged), and when it finds it released
//! (no holder) or missing, replaces its lock with a fresh one, whose first step is to read the
//! Lease and take it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::handover::{self, LeaseRef};
use super::lease_lock::{Lock, Took};
use super::node_writer;
use crate::alloc::lease;

/// How the current leader took its Lease, shared with the allocation loop's take-over.
pub type TookCell = Arc<std::sync::Mutex<Option<Took>>>;

/// Whether an allocation session runs: its take-over wait is over (so nothing of an earlier
/// leader can still land) and it has not ended. Set by the allocation loop
/// (`reconcile::run_until`), read by the election when it first finds the Lease being
/// deleted: only a replica that led on it up to then creates the next one marked settled
/// ([`lease::next_mark`]).
pub type SessionCell = Arc<SessionState>;

/// What the allocation loop tells the election of its session (see [`SessionCell`]).
#[derive(Debug, Default)]
pub struct SessionState {
    running: AtomicBool,
    /// A session began since leadership was last lost.
    led: AtomicBool,
    /// The last session ended with a write in flight or unanswered (`InFlight::in_doubt`).
    doubt: AtomicBool,
    /// When our term ends (leadership given up, on our monotonic clock) while the election
    /// reports leadership; `None` otherwise. Every write checks it just before it starts
    /// ([`super::Context::write`]), so no task sends after the term, whatever it believes.
    term_end: std::sync::Mutex<Option<Instant>>,
}

impl SessionState {
    /// A session begins, its take-over wait over.
    pub fn begin(&self) {
        self.doubt.store(false, Ordering::SeqCst);
        self.led.store(true, Ordering::SeqCst);
        self.running.store(true, Ordering::SeqCst);
    }

    /// Leadership was lost: what this replica does next it does on a new hold.
    pub fn lost(&self) {
        self.led.store(false, Ordering::SeqCst);
    }

    /// A session began since leadership was last lost: the release may say `stopped`.
    pub fn led(&self) -> bool {
        self.led.load(Ordering::SeqCst)
    }

    /// The session ended; `doubt`: a write of it may still land.
    pub fn end(&self, doubt: bool) {
        self.doubt.store(doubt, Ordering::SeqCst);
        self.running.store(false, Ordering::SeqCst);
    }

    pub fn running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    pub fn in_doubt(&self) -> bool {
        self.doubt.load(Ordering::SeqCst)
    }

    /// The election's count of our term: its end while leadership is reported, else `None`.
    pub fn set_term(&self, end: Option<Instant>) {
        *self.term() = end;
    }

    /// Whether `now` is within our term: a write that starts now was conditioned only on
    /// what was read before, so before any successor acted (docs/single-writer.md, step 1a).
    pub fn within_term(&self, now: Instant) -> bool {
        self.term().is_some_and(|end| now < end)
    }

    fn term(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // A plain value: consistent under a panic; go on with it.
        self.term_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How long one read of the Lease may take.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// How the election runs beyond the Lease itself.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// How long to wait before asking the lock again after it failed, and how often
    /// a standby reads the Lease to notice that it was released (`--leader-elect-retry-period`).
    pub retry: Duration,
    /// Set to the time (Unix seconds) of every turn of the election loop, for liveness: a loop
    /// that stops turning would keep reporting leadership past the Lease's expiry.
    pub progress: Option<Arc<AtomicI64>>,
    /// A fault for the end-to-end tests: the loop hangs once it has reported leadership.
    pub stall: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            retry: Duration::from_secs(1),
            progress: None,
            stall: false,
        }
    }
}

/// The Lease and this replica's part in it.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// Seconds a lease is valid without renewal.
    pub duration: u64,
    /// Seconds before expiry at which the holder renews; less than `duration`.
    pub grace: u64,
    /// How long a replica that stopped leading on a Lease being deleted waits before it takes
    /// its finalizer off (the take-over wait: its last writes land first).
    pub settle: Duration,
    /// Set to how the lock took the Lease each time it claims it.
    pub took: TookCell,
    /// Whether this replica's allocation session runs (set by the allocation loop).
    pub session: SessionCell,
}

/// A running election; its leadership signal feeds [`super::run`].
pub struct Election {
    leadership: watch::Receiver<bool>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Arc<Lock>>,
    session: SessionCell,
}

impl Election {
    /// Sets up the Lease (created if missing) and starts electing.
    pub async fn start(client: Client, opts: LeaseOptions) -> Result<Election, kube::Error> {
        Self::start_tuned(client, opts, Tuning::default()).await
    }

    /// [`Election::start`] with the retry period, progress reporting and faults of `tuning`.
    pub async fn start_tuned(
        client: Client,
        opts: LeaseOptions,
        tuning: Tuning,
    ) -> Result<Election, kube::Error> {
        let lock = build_lock(&client, &opts, tuning.retry).await?;
        let (tx, leadership) = watch::channel(false);
        let (stop, stopped) = oneshot::channel();
        let session = opts.session.clone();
        let task = tokio::spawn(elect(lock, client, opts, tuning, tx, stopped));
        Ok(Election {
            leadership,
            stop,
            task,
            session,
        })
    }

    /// True while this replica may allocate.
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.leadership.clone()
    }

    /// Whether the election still runs (it only ends when stopped, or by a panic).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stops electing and releases the Lease if we hold it, so another replica can take over.
    pub async fn release(self) -> Result<(), kube::Error> {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(lock) => lock.release(self.session.led()).await,
            Err(e) => {
                warn!(error = %e, "the leader election task failed; the lease is left to expire");
                Ok(())
            }
        }
    }
}

/// A lock for `opts`; creates the Lease if it is missing, unmarked: a Lease that does not
/// exist may have been deleted by hand under a live leader (see [`handover`]).
async fn build_lock(
    client: &Client,
    opts: &LeaseOptions,
    retry: Duration,
) -> Result<Lock, kube::Error> {
    ensure_lease(client, opts).await?;
    Ok(Lock::new(
        Api::namespaced(client.clone(), &opts.namespace),
        &opts.name,
        &opts.identity,
        field_manager(&opts.identity),
        (opts.duration, opts.grace),
        retry,
    ))
}

/// Creates the Lease if it is missing, asking again with backoff after any failure but a
/// malformed request (400, 422): a blip of the API server while a pod starts must not end the
/// process and crash-loop it. That includes a 403 (an API server that has just started
/// refuses until its RBAC cache is filled) and a 404 (the namespace applied a moment later).
/// Every failure is logged; one that lasts shows as a stalled election in /healthz.
async fn ensure_lease(client: &Client, opts: &LeaseOptions) -> Result<(), kube::Error> {
    let mut attempt = 0u32;
    loop {
        attempt = attempt.saturating_add(1);
        match handover::create(client, &opts.namespace, &opts.name, None).await {
            Ok(created) => {
                if created {
                    info!(lease = %opts.name, "created the lease");
                }
                return Ok(());
            }
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 422) => {
                return Err(kube::Error::Api(s));
            }
            Err(error) => {
                let forbidden = matches!(&error, kube::Error::Api(s) if s.code == 403);
                let hint = if forbidden {
                    " (a 403 that lasts: check the RBAC of config/rbac)"
                } else {
                    ""
                };
                warn!(lease = %opts.name, attempt, %error, "creating the lease failed; asking again{hint}");
                tokio::time::sleep(node_writer::backoff(attempt)).await;
            }
        }
    }
}

/// The field manager of `identity`'s Lease writes: one per replica, so that the Lease's
/// managed fields say which replica wrote what. At most 128 characters, as the API server
/// allows.
pub fn field_manager(identity: &str) -> String {
    let mut name = format!("nodeipam-{identity}");
    if name.len() > 128 {
        let cut = (0..=128)
            .rev()
            .find(|i| name.is_char_boundary(*i))
            .unwrap_or(0);
        name.truncate(cut);
    }
    name
}

/// Drives the lock and reports leadership while the fence allows it, until `stop`.
async fn elect(
    lock: Lock,
    client: Client,
    opts: LeaseOptions,
    tuning: Tuning,
    leadership: watch::Sender<bool>,
    mut stop: oneshot::Receiver<()>,
) -> Arc<Lock> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &opts.namespace);
    let mut lock = Arc::new(lock);
    let mut fence = Fence::new(&opts);
    let mut standby = Standby::default();
    let mut release = Release::default();
    let mut release_at: Option<Instant> = None;
    let mut read: Option<LeaseRead> = None;
    let mut next_read = Instant::now();
    let mut failures = 0u32;
    {
        // `changed` is never cancelled while it may be inside a Lease update, only replaced
        // once it has finished; or, on a standby that found the Lease free, dropped together
        // with its lock (a fresh lock reads the Lease before it acts, so it sees
        // whatever the dropped one may have written).
        let changed = changed_after(lock.clone(), Duration::ZERO);
        tokio::pin!(changed);
        loop {
            fence.valid_until = lock.valid_until();
            let now = Instant::now();
            if let Some(progress) = &tuning.progress {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                progress.store(i64::try_from(secs).unwrap_or(i64::MAX), Ordering::Relaxed);
            }
            if tuning.stall && *leadership.borrow() {
                warn!("fault injected: the election loop hangs");
                std::future::pending::<()>().await;
            }
            let wake = [
                read.is_none().then_some(next_read),
                // Once passed, it has been acted on; waking for it again would spin.
                fence.step_down_at().filter(|at| *at > now),
                release_at,
            ]
            .into_iter()
            .flatten()
            .min();
            let timer = tokio::time::sleep_until(until(wake));
            tokio::select! {
                _ = &mut stop => break,
                result = &mut changed => {
                    let delay = match result {
                        Ok(claimed) => {
                            failures = 0;
                            info!(claimed, "lease lock: leadership changed");
                            fence.claim(claimed);
                            *opts.took.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                                claimed.then(|| lock.took()).flatten();
                            standby = Standby::default();
                            read = None;
                            next_read = Instant::now();
                            Duration::ZERO
                        }
                        Err(e) => {
                            failures += 1;
                            // Once a second while the API server is away: say it now and then.
                            if failures == 1 || failures.is_multiple_of(30) {
                                warn!(error = %e, failures, "leader election: the lease could not be read or renewed; retrying");
                            } else {
                                debug!(error = %e, failures, "leader election: retrying");
                            }
                            tuning.retry
                        }
                    };
                    changed.set(changed_after(lock.clone(), delay));
                }
                result = wait_read(&mut read) => {
                    read = None;
                    let now = Instant::now();
                    let poll = if fence.claimed { fence.poll } else { tuning.retry };
                    next_read = match result {
                        Ok(Ok(lease)) => {
                            // Every read counts toward how long the Lease has been unchanged.
                            lock.note(lease.as_ref());
                            // Whether we led up to this read, before it changes the fence.
                            let leading = fence.holds(now) && opts.session.running();
                            release_at = release.observe(lease.as_ref(), &opts, leading, now);
                            // Claimed, our Lease can only vanish after a deletion completed:
                            // take a fresh one, as a standby would.
                            let (next, retake) = if fence.claimed {
                                (fence.observe(lease.as_ref(), now), lease.is_none())
                            } else {
                                (now + poll, standby.take_now(lease.as_ref()))
                            };
                            if retake {
                                info!(lease = %opts.name, "the lease is free: taking it now");
                                match tokio::time::timeout(READ_TIMEOUT, build_lock(&client, &opts, tuning.retry)).await {
                                    Ok(Ok(fresh)) => {
                                        lock = Arc::new(fresh);
                                        changed.set(changed_after(lock.clone(), Duration::ZERO));
                                    }
                                    Ok(Err(e)) => {
                                        debug!(error = %e, "a fresh lease lock could not be set up");
                                        standby.retry();
                                    }
                                    Err(_) => {
                                        debug!("setting up a fresh lease lock timed out");
                                        standby.retry();
                                    }
                                }
                            }
                            next
                        }
                        Ok(Err(e)) => {
                            debug!(error = %e, "reading the lease failed");
                            now + poll
                        }
                        Err(_) => now + poll,
                    };
                }
                () = timer => {
                    let now = Instant::now();
                    if release_at.is_some_and(|at| at <= now) && !fence.holds(now) {
                        release_at = None;
                        finish_deletion(&client, &opts, release.led).await;
                    }
                    if read.is_none() && Instant::now() >= next_read {
                        let (leases, name) = (leases.clone(), opts.name.clone());
                        read = Some(Box::pin(async move {
                            tokio::time::timeout(READ_TIMEOUT, leases.get_opt(&name)).await
                        }));
                    }
                }
            }
            fence.valid_until = lock.valid_until();
            let held = fence.holds(Instant::now());
            // Before leadership is reported: no write starts outside the term counted here.
            opts.session
                .set_term(held.then(|| fence.step_down_at()).flatten());
            leadership.send_if_modified(|current| {
                if *current == held {
                    return false;
                }
                *current = held;
                if held {
                    info!(lease = %opts.name, identity = %opts.identity, "leadership confirmed by the lease");
                } else {
                    opts.session.lost();
                    warn!(lease = %opts.name, identity = %opts.identity, "leadership not confirmed before the lease expires: stepping down");
                }
                true
            });
        }
    }
    opts.session.set_term(None);
    let _ = leadership.send_replace(false);
    lock
}

type LeaseRead = Pin<
    Box<
        dyn Future<Output = Result<Result<Option<Lease>, kube::Error>, tokio::time::error::Elapsed>>
            + Send,
    >,
>;

async fn changed_after(lock: Arc<Lock>, delay: Duration) -> Result<bool, kube::Error> {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    lock.changed().await
}

/// The outcome of the read in flight; never ready while there is none.
async fn wait_read(
    read: &mut Option<LeaseRead>,
) -> Result<Result<Option<Lease>, kube::Error>, tokio::time::error::Elapsed> {
    match read {
        Some(read) => read.await,
        None => std::future::pending().await,
    }
}

/// A timer deadline (far away for none).
fn until(at: Option<Instant>) -> tokio::time::Instant {
    match at {
        Some(at) => at.into(),
        None => tokio::time::Instant::now() + Duration::from_secs(3600),
    }
}

/// Decides leadership from the lock's claim, its term and the last Lease read: held only
/// while the lock claims the Lease, the last read shows it ours (naming us, not being
/// deleted), and our own term ([`Lock::valid_until`]: from the moment our last renewal was
/// sent, on our monotonic clock) lasts longer than `margin` ([`lease::holds`], the rule the
/// simulator runs too). A standby counts the same term
/// only from the moment it saw that renewal, which is later, so stepping down before it means
/// no two replicas ever allocate at once (a new leader also waits out our last writes; see
/// [`handover::wait`]).
#[derive(Debug)]
struct Fence {
    identity: String,
    /// How often the Lease is read while the lock claims it.
    poll: Duration,
    /// How long before the end of our term leadership is given up.
    margin: Duration,
    /// What the lock says.
    claimed: bool,
    /// The last read showed the Lease ours.
    ours: bool,
    /// Our term, as the lock counts it.
    valid_until: Option<Instant>,
}

impl Fence {
    fn new(opts: &LeaseOptions) -> Self {
        let grace = Duration::from_secs(opts.grace);
        let quarter = (grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        Fence {
            identity: opts.identity.clone(),
            poll: quarter,
            margin: quarter,
            claimed: false,
            ours: false,
            valid_until: None,
        }
    }

    fn claim(&mut self, claimed: bool) {
        self.claimed = claimed;
        self.ours = false;
    }

    /// A Lease just read (`None`: it does not exist). Returns when to read it next: a poll
    /// later. Not only after the lock's next renewal: a Lease that comes to name another
    /// replica (written by hand, or by a lock that does not write on the version it read)
    /// lets that one allocate after its take-over wait, well before our renewal would fail.
    /// One read a poll (a second at most) is what that costs.
    fn observe(&mut self, lease: Option<&Lease>, now: Instant) -> Instant {
        self.ours = lease.is_some_and(|l| lease::ours(&handover::view(l), &self.identity));
        now + self.poll
    }

    fn holds(&self, now: Instant) -> bool {
        lease::holds(self.claimed, self.ours, self.valid_until, self.margin, now)
    }

    /// When leadership ends unless the lock renews before.
    fn step_down_at(&self) -> Option<Instant> {
        if !(self.claimed && self.ours) {
            return None;
        }
        self.valid_until.and_then(|e| e.checked_sub(self.margin))
    }
}

/// What a standby makes of the Lease it reads: whether its lock, possibly asleep until
/// the expiry it cached, must be replaced so that a free Lease is taken now.
#[derive(Debug, Default)]
struct Standby {
    /// The previous read: `None` before any, `Some(None)` held, `Some(Some(version))` free.
    last: Option<Option<String>>,
    /// The free version a fresh lock was set up for: it acts on that, so it is not
    /// replaced again until the Lease changes.
    acted_on: Option<String>,
}

impl Standby {
    /// A Lease just read while not claiming it (`None`: it does not exist). True when it is
    /// free (released: no holder; or missing) and either the previous read showed it held
    /// (the lock may be asleep on that) or showed this same free version (the lock had
    /// a whole poll to take it and did not); a free Lease seen first is left to a lock
    /// that may be taking it. An expired Lease that still names a holder is left to the
    /// lock too: it wakes at that expiry anyway.
    fn take_now(&mut self, lease: Option<&Lease>) -> bool {
        let seen = free_version(lease);
        let take = match &seen {
            None => {
                self.acted_on = None;
                false
            }
            Some(version) => {
                let was_held = matches!(self.last, Some(None));
                let still_free = self.last.as_ref() == Some(&seen);
                // A missing Lease is left for one poll: a replica whose deletion of the last
                // one just completed creates the next one marked settled.
                let missing = version.is_empty();
                self.acted_on.as_ref() != Some(version) && (was_held && !missing || still_free)
            }
        };
        if take {
            self.acted_on = seen.clone();
        }
        self.last = Some(seen);
        take
    }

    /// Setting up the fresh lock failed: try again on the next read that finds it free.
    fn retry(&mut self) {
        self.acted_on = None;
        self.last = Some(None);
    }
}

/// When a replica may take its finalizer off a Lease being deleted: `settle` after it first
/// read it so, while it may (see [`lease::releasable`]). It is not leading by then (a
/// terminating Lease is held by nobody), so its last writes had the take-over wait to land.
#[derive(Debug, Default)]
struct Release {
    since: Option<Instant>,
    /// This replica was leading, its session begun, up to the read that set `since`.
    led: bool,
}

impl Release {
    /// A Lease just read, and whether we were leading with our session begun up to this read;
    /// returns when to release it, if this replica may.
    fn observe(
        &mut self,
        lease: Option<&Lease>,
        opts: &LeaseOptions,
        leading: bool,
        now: Instant,
    ) -> Option<Instant> {
        if !lease.is_some_and(|l| lease::releasable(&handover::view(l), &opts.identity)) {
            self.since = None;
            return None;
        }
        let since = *self.since.get_or_insert_with(|| {
            self.led = leading;
            now
        });
        Some(since + opts.settle)
    }
}

/// Takes our finalizer off the Lease being deleted, so that the deletion completes, and
/// creates the next Lease, marked as [`lease::next_mark`] says: settled only when the Lease
/// let go named us and we led on it (`led`) up to the read that found it being deleted, so
/// that neither our writes nor an earlier leader's can still land, and no other replica led
/// on it since. Otherwise (it was freed or renamed by hand before it was deleted, or we took
/// it and never led on it) the leader that a hand edit displaced may still send until its
/// term ends: the next Lease is unmarked and whoever takes it waits that out. (A standby that
/// finds the Lease missing first creates it unmarked too: safe, only slower.)
async fn finish_deletion(client: &Client, opts: &LeaseOptions, led: bool) {
    let lease = LeaseRef {
        namespace: opts.namespace.clone(),
        name: opts.name.clone(),
        identity: opts.identity.clone(),
        took: opts.took.clone(),
        session: opts.session.clone(),
        term: Duration::from_secs(opts.duration),
    };
    match handover::release(client, &lease).await {
        Ok(Some(deleted)) => {
            info!(lease = %opts.name, "the lease is being deleted and our writes are over: let it go");
            // A session still running, or whose writes are not all answered, vouches for
            // nothing: the settle before this was only the write timeout.
            let answered = !opts.session.running() && !opts.session.in_doubt();
            let mark = lease::next_mark(&deleted, &opts.identity, led, answered);
            match handover::create(client, &opts.namespace, &opts.name, mark).await {
                Ok(true) if mark.is_some() => {
                    info!(lease = %opts.name, "created the next lease, marked settled")
                }
                Ok(true) => info!(
                    lease = %opts.name,
                    holder = ?deleted.holder,
                    led,
                    "created the next lease unmarked: we did not lead on the one let go up to its deletion (freed or renamed by hand before?), so its next leader waits out a whole term"
                ),
                Ok(false) => debug!("the next lease exists already"),
                Err(e) => debug!(error = %e, "creating the next lease failed; a standby will"),
            }
        }
        Ok(None) => debug!("the lease is no longer ours to let go"),
        // The next read that finds it so schedules another try.
        Err(e) => {
            warn!(error = %e, "taking the finalizer off the lease being deleted failed; retrying")
        }
    }
}

/// The version of `lease` when nobody holds it (empty for a missing Lease).
fn free_version(lease: Option<&Lease>) -> Option<String> {
    let Some(lease) = lease else {
        return Some(String::new());
    };
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref());
    if holder.is_some_and(|h| !h.is_empty()) {
        return None;
    }
    Some(lease.metadata.resource_version.clone().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    #[test]
    fn a_write_may_start_only_within_the_term_the_election_last_counted() {
        let s = SessionState::default();
        let t0 = Instant::now();
        assert!(
            !s.within_term(t0),
            "no term before the election reports one"
        );
        s.set_term(Some(t0 + Duration::from_secs(4)));
        assert!(s.within_term(t0 + Duration::from_secs(3)));
        assert!(
            !s.within_term(t0 + Duration::from_secs(4)),
            "the end is outside"
        );
        assert!(
            !s.within_term(t0 + Duration::from_secs(60)),
            "a wake-up after a freeze"
        );
        s.set_term(None);
        assert!(!s.within_term(t0), "leadership given up");
    }

    fn opts() -> LeaseOptions {
        LeaseOptions {
            namespace: "ns".into(),
            name: "lease".into(),
            identity: "me".into(),
            duration: 4,
            grace: 2,
            settle: Duration::from_secs(3),
            took: TookCell::default(),
            session: SessionCell::default(),
        }
    }

    fn deleted(mut l: Lease) -> Lease {
        l.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        l.metadata.finalizers = Some(vec![handover::LEASE_FINALIZER.into()]);
        l
    }

    #[test]
    fn every_replica_writes_the_lease_as_its_own_field_manager() {
        assert_eq!(field_manager("pod-a"), "nodeipam-pod-a");
        assert_ne!(field_manager("pod-a"), field_manager("pod-b"));
        let long = "é".repeat(100);
        let name = field_manager(&long);
        assert!(
            name.len() <= 128 && name.starts_with("nodeipam-é"),
            "{name}"
        );
    }

    /// A fence claimed, with our term running 4 s from `t0`, and a read showing `lease`.
    fn fence(t0: Instant, lease: &Lease) -> Fence {
        let mut f = Fence::new(&opts());
        f.claim(true);
        f.valid_until = Some(t0 + secs(4.0));
        f.observe(Some(lease), t0);
        f
    }

    #[test]
    fn nobody_leads_on_a_lease_being_deleted() {
        let t0 = Instant::now();
        let mut f = fence(t0, &lease("me", 4));
        assert!(f.holds(t0));
        // Renewed and ours, but being deleted: step down now, and read again soon.
        let next = f.observe(Some(&deleted(lease("me", 4))), t0);
        assert!(!f.holds(t0));
        assert_eq!(next, t0 + f.poll);
    }

    #[test]
    fn a_lease_being_deleted_is_let_go_a_settle_after_it_was_first_seen_so() {
        let t0 = Instant::now();
        let o = opts();
        let mut r = Release::default();
        assert_eq!(r.observe(Some(&lease("me", 4)), &o, true, t0), None);
        let ours = deleted(lease("me", 4));
        assert_eq!(r.observe(Some(&ours), &o, true, t0), Some(t0 + secs(3.0)));
        assert!(r.led, "we led up to the read that found it being deleted");
        // Later reads do not push it back, nor change whether we led up to the first.
        assert_eq!(
            r.observe(Some(&ours), &o, false, t0 + secs(2.0)),
            Some(t0 + secs(3.0))
        );
        assert!(r.led);
        // Another live holder's to let go; gone: nothing to do; seen again: a fresh wait.
        assert_eq!(
            r.observe(Some(&deleted(lease("other", 4))), &o, true, t0 + secs(2.5)),
            None
        );
        assert_eq!(r.observe(None, &o, true, t0 + secs(2.6)), None);
        assert_eq!(
            r.observe(Some(&ours), &o, false, t0 + secs(4.0)),
            Some(t0 + secs(7.0))
        );
        assert!(!r.led, "not leading when it was seen being deleted again");
    }

    /// A Lease naming `holder`, renewed (by its own clock) an hour before ours says now.
    fn lease(holder: &str, duration: i32) -> Lease {
        let renewed = std::time::SystemTime::now() - Duration::from_secs(3600);
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::try_from(renewed).expect("timestamp"),
                )),
                lease_duration_seconds: Some(duration),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn held_only_while_claimed_ours_and_within_our_own_term() {
        let t0 = Instant::now();
        let mut f = Fence::new(&opts());
        assert_eq!((f.poll, f.margin), (secs(0.5), secs(0.5)));
        f.valid_until = Some(t0 + secs(4.0));
        // The lock has not claimed anything: a valid lease of ours is not enough.
        f.observe(Some(&lease("me", 4)), t0);
        assert!(!f.holds(t0));
        // Claimed, but nothing read since: not yet.
        f.claim(true);
        assert!(!f.holds(t0));
        // Its renewTime is an hour old by our wall clock: that says nothing; our term does.
        let next = f.observe(Some(&lease("me", 4)), t0);
        assert!(f.holds(t0));
        assert!(f.holds(t0 + secs(3.4)));
        assert!(
            !f.holds(t0 + secs(3.5)),
            "steps down a margin before our term ends"
        );
        assert_eq!(f.step_down_at(), Some(t0 + secs(3.5)));
        // The next read comes a poll later, not only after the renewal.
        assert_eq!(next, t0 + f.poll);
        // Losing the claim ends it at once.
        f.claim(false);
        assert!(!f.holds(t0));
        assert_eq!(f.step_down_at(), None);
    }

    #[test]
    fn failed_renewals_do_not_extend_leadership_and_a_renewal_restores_it() {
        let t0 = Instant::now();
        let mut f = fence(t0, &lease("me", 4));
        // The API server is away: reads still show the Lease ours, but time alone ends
        // leadership, while the lock still claims it.
        f.observe(Some(&lease("me", 4)), t0 + secs(3.0));
        assert!(!f.holds(t0 + secs(10.0)));
        // The lock renews once it is back: a new term from that write.
        let back = t0 + secs(12.0);
        f.valid_until = Some(back + secs(4.0));
        let next = f.observe(Some(&lease("me", 4)), back);
        assert!(f.holds(back + secs(1.0)));
        assert_eq!(next, back + f.poll);
    }

    #[test]
    fn someone_elses_or_no_lease_or_one_without_times_is_not_ours() {
        let t0 = Instant::now();
        let mut f = fence(t0, &lease("other", 4));
        assert!(!f.holds(t0));
        f.observe(None, t0);
        assert!(!f.holds(t0));
        let mut untimed = lease("me", 4);
        if let Some(spec) = untimed.spec.as_mut() {
            spec.renew_time = None;
        }
        // Any other replica takes a Lease without times at once.
        f.observe(Some(&untimed), t0);
        assert!(!f.holds(t0));
        f.observe(Some(&lease("me", 4)), t0);
        assert!(f.holds(t0));
    }

    fn versioned(mut lease: Lease, version: &str) -> Lease {
        lease.metadata.resource_version = Some(version.into());
        lease
    }

    /// What the lock's `release()` leaves: no holder, no times.
    fn released(version: &str) -> Lease {
        versioned(
            Lease {
                spec: Some(LeaseSpec::default()),
                ..Lease::default()
            },
            version,
        )
    }

    #[test]
    fn a_released_or_missing_lease_is_free_a_held_one_is_not() {
        assert_eq!(free_version(Some(&released("7"))), Some("7".into()));
        assert_eq!(free_version(None), Some(String::new()));
        let no_spec = versioned(Lease::default(), "8");
        assert_eq!(free_version(Some(&no_spec)), Some("8".into()));
        let empty_holder = versioned(lease("", 15), "9");
        assert_eq!(free_version(Some(&empty_holder)), Some("9".into()));
        // Held, even long expired: expiry is the lock's business.
        assert_eq!(free_version(Some(&versioned(lease("a", 15), "3"))), None);
        assert_eq!(free_version(Some(&versioned(lease("a", 1), "3"))), None);
    }

    #[test]
    fn a_standby_takes_a_lease_released_under_its_eyes_at_once() {
        let mut s = Standby::default();
        assert!(!s.take_now(Some(&versioned(lease("a", 15), "1"))));
        assert!(!s.take_now(Some(&versioned(lease("a", 15), "2"))));
        // The leader stopped cleanly and released it.
        assert!(s.take_now(Some(&released("3"))));
        // The fresh lock is acting on it: not replaced again for the same version.
        assert!(!s.take_now(Some(&released("3"))));
        assert!(!s.take_now(Some(&released("3"))));
        // Someone else took it and released it again.
        assert!(!s.take_now(Some(&versioned(lease("c", 15), "4"))));
        assert!(s.take_now(Some(&released("5"))));
    }

    #[test]
    fn a_free_lease_seen_first_is_left_to_the_manager_for_one_poll() {
        // At start, or after losing the claim, the lock may be taking it right now.
        let mut s = Standby::default();
        assert!(!s.take_now(Some(&released("3"))));
        // A poll later it is still free in the same version: the lock is asleep.
        assert!(s.take_now(Some(&released("3"))));
        assert!(!s.take_now(Some(&released("3"))));
        // A new free version seen first: one poll again.
        let mut s = Standby::default();
        assert!(!s.take_now(Some(&released("3"))));
        assert!(!s.take_now(Some(&released("4"))));
        assert!(s.take_now(Some(&released("4"))));
    }

    #[test]
    fn a_missing_lease_is_recreated_each_time_it_goes_a_poll_after_it_went() {
        let mut s = Standby::default();
        assert!(!s.take_now(Some(&versioned(lease("a", 15), "1"))));
        assert!(
            !s.take_now(None),
            "left a poll to the replica that let it go"
        );
        assert!(s.take_now(None));
        assert!(!s.take_now(None));
        assert!(!s.take_now(Some(&versioned(lease("a", 15), "2"))));
        assert!(!s.take_now(None));
        assert!(s.take_now(None));
    }

    #[test]
    fn a_failed_replacement_is_tried_again_on_the_next_read() {
        let mut s = Standby::default();
        assert!(!s.take_now(Some(&versioned(lease("a", 15), "1"))));
        assert!(s.take_now(Some(&released("2"))));
        s.retry();
        assert!(s.take_now(Some(&released("2"))));
    }

    #[test]
    fn poll_and_margin_scale_with_the_grace_period() {
        let f = |grace| {
            let f = Fence::new(&LeaseOptions {
                grace,
                duration: grace + 10,
                ..opts()
            });
            (f.poll, f.margin)
        };
        assert_eq!(f(1), (secs(0.25), secs(0.25)));
        assert_eq!(f(5), (secs(1.0), secs(1.0)));
        assert_eq!(f(60), (secs(1.0), secs(1.0)));
    }
}
