//! The Lease lock: takes, renews and lets go of the Lease with compare-and-swap writes (a
//! replace of the version read, which the API server refuses with 409 once anything changed
//! it), so a replica acting on a stale read fails instead of overwriting the lock another
//! replica took in between. What to do with a Lease read is decided by a pure function
//! ([`lease::decide`], in the core, where the simulator runs it too) and the object to write
//! is built by pure functions; [`Lock`] only reads and writes.
//!
//! ## Time
//! No decision compares another replica's wall clock with ours. As client-go does, a standby
//! takes a Lease held by another replica only once it has *seen it unchanged* (the same
//! resourceVersion) for a whole lease duration on its own monotonic clock, counted from the
//! first answer that showed that version ([`lease::Unchanged`]); and a holder counts its own
//! term from the moment it *sent* the write that renewed it ([`Lock::valid_until`]). Every
//! renewal is sent before it commits, and a standby sees it only after it commits, so the
//! holder's term ends before any standby's count of the same version does, whatever the two
//! wall clocks say; only the rates of the two monotonic clocks must agree to within the
//! leader's margin. The `renewTime` written is for people and other tools.
//!
//! A lock without the precondition (a merge patch of the holder, as lease managers commonly
//! write) lets a replica whose read of an expired Lease is followed by a late write (a stall,
//! a slow API server) displace the replica that took the Lease meanwhile, and both lead until
//! one of them reads the Lease again.

use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tokio::sync::Mutex;
use tracing::debug;

use super::handover::{HANDOVER_ANNOTATION, holder, mark_value, timed, view};
use crate::alloc::lease::{self, Unchanged};

/// Reads and conflicting writes in one attempt before it gives up until the next.
const TRIES: usize = 3;

/// Seconds this process's wall clock is set off by a test's fault (`clock-offset`).
static CLOCK_OFFSET: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Sets the wall clock off by `secs`, for the tests: the times written on the Lease move, and
/// no decision may.
pub fn offset_wall_clock(secs: i64) {
    CLOCK_OFFSET.store(secs, std::sync::atomic::Ordering::Relaxed);
}

/// The wall clock as this process reads it: only ever written on the Lease, for people.
pub fn wall_now() -> SystemTime {
    let offset = CLOCK_OFFSET.load(std::sync::atomic::Ordering::Relaxed);
    let now = SystemTime::now();
    let by = Duration::from_secs(offset.unsigned_abs());
    if offset >= 0 {
        now + by
    } else {
        now.checked_sub(by).unwrap_or(now)
    }
}

/// The rules live in the pure core, over the Lease as this lock reads it
/// ([`handover::view`]).
pub use crate::alloc::lease::{Step, Took};

fn micro(at: SystemTime) -> Option<MicroTime> {
    k8s_openapi::jiff::Timestamp::try_from(at)
        .ok()
        .map(MicroTime)
}

/// `lease` as written back: same version (the precondition), metadata as read.
fn base(lease: &Lease) -> Lease {
    let mut out = lease.clone();
    out.metadata.managed_fields = None;
    out
}

/// `lease` renewed by its holder at `now`.
pub fn renewed(lease: &Lease, duration: u64, now: SystemTime) -> Lease {
    let mut out = base(lease);
    let spec = out.spec.get_or_insert_with(LeaseSpec::default);
    spec.renew_time = micro(now);
    spec.lease_duration_seconds = i32::try_from(duration).ok();
    out
}

/// `lease` taken by `identity` at `now`: one more transition.
pub fn taken(lease: &Lease, identity: &str, duration: u64, now: SystemTime) -> Lease {
    let mut out = base(lease);
    let spec = out.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(identity.to_string());
    spec.acquire_time = micro(now);
    spec.renew_time = micro(now);
    spec.lease_duration_seconds = i32::try_from(duration).ok();
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    out
}

/// `lease` let go by a holder that sends nothing more: no holder and no times, so a standby
/// takes it at once, and marked stopped (unless it is marked settled already:
/// [`lease::release_mark`]), so the standby knows its predecessor is quiet. A Lease freed any
/// other way (by hand) says nothing of the sort.
pub fn released(lease: &Lease, led: bool) -> Lease {
    let mut out = base(lease);
    let spec = out.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.acquire_time = None;
    spec.renew_time = None;
    spec.lease_duration_seconds = None;
    match lease::release_mark(view(lease).mark, led) {
        Some(mark) => {
            out.annotations_mut()
                .insert(HANDOVER_ANNOTATION.into(), mark_value(mark).into());
        }
        None => {
            out.annotations_mut().remove(HANDOVER_ANNOTATION);
        }
    }
    out
}

/// A replica's lock on one Lease.
pub struct Lock {
    api: Api<Lease>,
    name: String,
    identity: String,
    field_manager: String,
    /// Seconds a Lease is valid without renewal.
    duration: u64,
    /// Seconds before expiry at which the holder renews.
    grace: u64,
    /// How soon to look again when the Lease is missing or keeps changing under us.
    retry: Duration,
    state: Mutex<State>,
    /// Every read of the Lease, ours and the election's: how long it has been unchanged.
    unchanged: std::sync::Mutex<Unchanged<Instant>>,
    /// Our hold on the Lease: when we sent the write that last made or kept us its holder,
    /// and how we came to hold it.
    held: std::sync::Mutex<Option<(Instant, Option<Took>)>>,
}

#[derive(Debug, Default)]
struct State {
    leader: bool,
    /// When to read the Lease next; `None`: now.
    next: Option<Instant>,
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// We hold the Lease as written or read.
    pub leader: bool,
    /// When to read it again.
    pub next: Instant,
}

impl Lock {
    pub fn new(
        api: Api<Lease>,
        name: &str,
        identity: &str,
        field_manager: String,
        (duration, grace): (u64, u64),
        retry: Duration,
    ) -> Lock {
        Lock {
            api,
            name: name.to_string(),
            identity: identity.to_string(),
            field_manager,
            duration,
            grace: grace.min(duration),
            retry,
            state: Mutex::new(State::default()),
            unchanged: std::sync::Mutex::default(),
            held: std::sync::Mutex::default(),
        }
    }

    /// Until when our last renewal holds the Lease, on our monotonic clock: the moment that
    /// write was sent plus the lease duration. `None` while we do not hold it.
    pub fn valid_until(&self) -> Option<Instant> {
        let held = *lock(&self.held);
        held.map(|(sent, _)| sent + Duration::from_secs(self.duration))
    }

    /// How we came to hold the Lease we hold: `None` when we do not, or when we found it
    /// naming us without having taken it in this process (written by hand).
    pub fn took(&self) -> Option<Took> {
        lock(&self.held).and_then(|(_, took)| took)
    }

    /// A read of the Lease whose answer just arrived (the election's reads count too).
    pub fn note(&self, lease: Option<&Lease>) -> Duration {
        lock(&self.unchanged).note(lease.map(view).as_ref(), Instant::now())
    }

    /// Waits until this replica gains or loses the Lease, taking and renewing it on the way;
    /// returns whether it holds it now. An error (the API server away) says nothing about
    /// leadership: call again, the next call reads the Lease at once.
    pub async fn changed(&self) -> Result<bool, kube::Error> {
        let mut state = self.state.lock().await;
        loop {
            if let Some(at) = state.next {
                tokio::time::sleep_until(at.into()).await;
            }
            state.next = None;
            let attempt = self.attempt().await?;
            state.next = Some(attempt.next);
            if attempt.leader != state.leader {
                state.leader = attempt.leader;
                return Ok(attempt.leader);
            }
        }
    }

    /// One read and, if it calls for one, one write; again on a conflict, up to [`TRIES`].
    pub async fn attempt(&self) -> Result<Attempt, kube::Error> {
        for _ in 0..TRIES {
            let read = timed(self.api.get_opt(&self.name)).await?;
            if let Some(done) = self.act(read.as_ref()).await? {
                return Ok(done);
            }
        }
        debug!(lease = %self.name, "the lease changed at every try: looking again soon");
        *lock(&self.held) = None;
        Ok(Attempt {
            leader: false,
            next: Instant::now() + self.retry,
        })
    }

    /// What [`lease::decide`] says about `read` (whose answer just arrived), done; `None` when the
    /// write met a newer version.
    pub async fn act(&self, read: Option<&Lease>) -> Result<Option<Attempt>, kube::Error> {
        let unchanged = self.note(read);
        let sent = Instant::now();
        let now = wall_now();
        let wait = |next| {
            *lock(&self.held) = None;
            Ok(Some(Attempt {
                leader: false,
                next,
            }))
        };
        let seen = read.map(view);
        let (write, took) = match (
            lease::decide(seen.as_ref(), &self.identity, unchanged),
            read,
        ) {
            (Step::Wait(left), _) => return wait(sent + left),
            (Step::Missing, _) | (_, None) => return wait(sent + self.retry),
            (Step::Renew, Some(read)) => (renewed(read, self.duration, now), None),
            (Step::Take, Some(read)) => {
                let took = seen.as_ref().map(lease::took);
                (taken(read, &self.identity, self.duration, now), took)
            }
        };
        if !self.replace(&write).await? {
            return Ok(None);
        }
        {
            let mut held = lock(&self.held);
            // A renewal keeps how we came to hold it.
            let how = took.or_else(|| held.and_then(|(_, t)| t));
            *held = Some((sent, how));
        }
        let renew_in = Duration::from_secs(self.duration - self.grace);
        Ok(Some(Attempt {
            leader: true,
            next: sent + renew_in,
        }))
    }

    /// Lets the Lease go if it names us, on the version read, marked as
    /// [`lease::release_mark`] says (`led`: a session of ours ran on it and was not lost): the
    /// caller sends nothing more as leader.
    pub async fn release(&self, led: bool) -> Result<(), kube::Error> {
        for _ in 0..TRIES {
            let Some(read) = timed(self.api.get_opt(&self.name)).await? else {
                return Ok(());
            };
            if holder(&read) != Some(self.identity.as_str()) {
                return Ok(());
            }
            if self.replace(&released(&read, led)).await? {
                self.state.lock().await.leader = false;
                *lock(&self.held) = None;
                return Ok(());
            }
        }
        Err(kube::Error::Service(
            "the lease changed at every try to let it go".into(),
        ))
    }

    /// Writes `lease` on the version it carries: false when that is no longer the Lease's.
    async fn replace(&self, lease: &Lease) -> Result<bool, kube::Error> {
        let params = PostParams {
            field_manager: Some(self.field_manager.clone()),
            ..PostParams::default()
        };
        match timed(self.api.replace(&self.name, &params, lease)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                debug!(lease = %self.name, code = s.code, "the lease changed since it was read");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// A std mutex's guard; plain values stay consistent under a panic, so go on with them.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::handover::{SETTLED, STOPPED};

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn lease(holder: Option<&str>, renewed: Option<u64>, duration: Option<i32>) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some("nodeipam".into());
        l.metadata.resource_version = Some("7".into());
        l.spec = Some(LeaseSpec {
            holder_identity: holder.map(str::to_string),
            renew_time: renewed.and_then(|s| micro(at(s))),
            lease_duration_seconds: duration,
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        });
        l
    }

    #[test]
    fn writes_keep_the_version_read_and_the_metadata() {
        let mut read = lease(Some("b"), Some(10), Some(15));
        read.metadata.annotations = Some([("k".to_string(), "v".to_string())].into());
        read.metadata.finalizers = Some(vec!["f".into()]);
        read.metadata.managed_fields = Some(vec![Default::default()]);

        let t = taken(&read, "me", 15, at(100));
        assert_eq!(t.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(t.metadata.annotations, read.metadata.annotations);
        assert_eq!(t.metadata.finalizers, read.metadata.finalizers);
        assert_eq!(t.metadata.managed_fields, None);
        let spec = t.spec.clone().expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.acquire_time, micro(at(100)));
        assert_eq!(spec.renew_time, micro(at(100)));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(4));

        let r = renewed(&t, 15, at(110));
        let spec = r.spec.expect("spec");
        assert_eq!(spec.renew_time, micro(at(110)));
        assert_eq!(spec.acquire_time, micro(at(100)), "acquired once");
        assert_eq!(spec.lease_transitions, Some(4));

        let gone = released(&t, true);
        let spec = gone.spec.clone().expect("spec");
        assert_eq!(
            (spec.holder_identity, spec.renew_time, spec.acquire_time),
            (None, None, None)
        );
        assert_eq!(gone.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            gone.annotations()
                .get(HANDOVER_ANNOTATION)
                .map(String::as_str),
            Some(STOPPED),
            "let go by a holder that sends nothing more"
        );
        assert_eq!(gone.annotations().get("k").map(String::as_str), Some("v"));
        assert_eq!(
            lease::decide(Some(&view(&gone)), "b", secs(0)),
            Step::Take,
            "a released Lease is free at once"
        );
        let mut settled = t.clone();
        settled
            .annotations_mut()
            .insert(HANDOVER_ANNOTATION.into(), SETTLED.into());
        assert_eq!(
            released(&settled, true)
                .annotations()
                .get(HANDOVER_ANNOTATION)
                .map(String::as_str),
            Some(SETTLED),
            "a settled mark says more than stopped and stays"
        );
        // A holder that never led (renamed to it by hand?) says nothing new.
        assert_eq!(
            released(&t, false).annotations().get(HANDOVER_ANNOTATION),
            None
        );
    }

    /// Three replicas, each with its own wall clock (any skew) and its own monotonic clock
    /// (rates equal), read and write one Lease in any order, with reads that go stale before
    /// their write, answers that arrive late and time that passes in between, against a store
    /// that refuses a write on a version that is gone (the API server's replace). At no moment
    /// do two replicas hold it: a holder holds from its write's commit until the moment that
    /// write was sent plus the duration (its own count, [`Lock::valid_until`]).
    mod protocol {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            /// A replica reads; the answer is noted `delay` seconds later.
            Read(usize, u64),
            Write(usize),
            Wait(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                ((0..3usize), (0..3u64)).prop_map(|(r, d)| Op::Read(r, d)),
                (0..3usize).prop_map(Op::Write),
                (0..20u64).prop_map(Op::Wait),
            ]
        }

        proptest! {
            #[test]
            fn no_two_replicas_ever_hold_the_lease(
                ops in proptest::collection::vec(op(), 1..80),
                skew in proptest::collection::vec(0..7200u64, 3),
            ) {
                const DURATION: u64 = 15;
                let ids = ["a", "b", "c"];
                let mut store = lease(None, None, None);
                store.metadata.resource_version = Some("1".into());
                // One true time, in seconds; each replica's wall clock is off by its skew.
                let mut now = 0u64;
                let base = Instant::now();
                let mono = |t: u64| base + secs(t);
                let mut seen: [Unchanged<Instant>; 3] = Default::default();
                let mut reads: [Option<(Lease, Duration)>; 3] = Default::default();
                let mut holds_until: [Option<u64>; 3] = [None; 3];
                for op in ops {
                    match op {
                        Op::Read(r, delay) => {
                            let read = store.clone();
                            now += delay;
                            let unchanged = seen[r].note(Some(&view(&read)), mono(now));
                            reads[r] = Some((read, unchanged));
                        }
                        Op::Wait(s) => now += s,
                        Op::Write(r) => {
                            let Some((read, unchanged)) = reads[r].take() else { continue };
                            let wall = at(skew[r]) + secs(now);
                            let write = match lease::decide(Some(&view(&read)), ids[r], unchanged) {
                                Step::Renew => renewed(&read, DURATION, wall),
                                Step::Take => taken(&read, ids[r], DURATION, wall),
                                Step::Wait(_) | Step::Missing => continue,
                            };
                            if write.metadata.resource_version != store.metadata.resource_version {
                                holds_until[r] = None;
                                continue;
                            }
                            let version: u64 = store.metadata.resource_version.as_deref()
                                .and_then(|v| v.parse().ok()).unwrap_or(0);
                            store = write;
                            store.metadata.resource_version = Some((version + 1).to_string());
                            holds_until[r] = Some(now + DURATION);
                        }
                    }
                    let holding: Vec<&str> = (0..3)
                        .filter(|r| holds_until[*r].is_some_and(|u| u > now))
                        .map(|r| ids[r])
                        .collect();
                    prop_assert!(holding.len() <= 1, "{holding:?} hold the Lease at once");
                }
            }
        }
    }
}
