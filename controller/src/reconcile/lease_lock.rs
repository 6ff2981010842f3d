//! The Lease lock: takes, renews and lets go of the Lease with compare-and-swap writes (a
//! replace of the version read, which the API server refuses with 409 once anything changed
//! it), so a replica acting on a stale read fails instead of overwriting the lock another
//! replica took in between. What to do with a Lease read is [`decide`]d by a pure function
//! and the object to write is built by pure functions; [`Lock`] only reads and writes.
//!
//! A lock without the precondition (a merge patch of the holder, as lease managers commonly
//! write) lets a replica whose read of an expired Lease is followed by a late write (a stall,
//! a slow API server) displace the replica that took the Lease meanwhile, and both lead until
//! one of them reads the Lease again.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::Mutex;
use tracing::debug;

use super::handover::{holder, timed};

/// Reads and conflicting writes in one attempt before it gives up until the next.
const TRIES: usize = 3;

/// What to do about a Lease just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// It names us: renew it (even if it expired; nobody took it since).
    Renew,
    /// Nobody holds it, or its holder let it expire: take it.
    Take,
    /// Another replica holds it until then.
    Wait(SystemTime),
    /// There is no Lease (it is created elsewhere, marked for a first leader).
    Missing,
}

/// What to do about `lease` as `identity` at `now`.
pub fn decide(lease: Option<&Lease>, identity: &str, now: SystemTime) -> Step {
    let Some(lease) = lease else {
        return Step::Missing;
    };
    match holder(lease) {
        Some(holder) if holder == identity => Step::Renew,
        Some(holder) if !holder.is_empty() => match lease.spec.as_ref().and_then(expiry) {
            Some(at) if at > now => Step::Wait(at),
            _ => Step::Take,
        },
        _ => Step::Take,
    }
}

/// When a Lease's holder stops holding it, if its times say.
pub(super) fn expiry(spec: &LeaseSpec) -> Option<SystemTime> {
    let renewed = SystemTime::from(spec.renew_time.as_ref()?.0);
    let seconds = u64::try_from(spec.lease_duration_seconds?).ok()?;
    renewed.checked_add(Duration::from_secs(seconds))
}

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

/// `lease` let go: no holder and no times, so a standby takes it at once.
pub fn released(lease: &Lease) -> Lease {
    let mut out = base(lease);
    let spec = out.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = None;
    spec.acquire_time = None;
    spec.renew_time = None;
    spec.lease_duration_seconds = None;
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
}

#[derive(Debug, Default)]
struct State {
    leader: bool,
    /// When to read the Lease next; `None`: now.
    next: Option<SystemTime>,
}

/// How one attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// We hold the Lease as written or read.
    pub leader: bool,
    /// When to read it again.
    pub next: SystemTime,
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
        }
    }

    /// Waits until this replica gains or loses the Lease, taking and renewing it on the way;
    /// returns whether it holds it now. An error (the API server away) says nothing about
    /// leadership: call again, the next call reads the Lease at once.
    pub async fn changed(&self) -> Result<bool, kube::Error> {
        let mut state = self.state.lock().await;
        loop {
            if let Some(at) = state.next {
                let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
                tokio::time::sleep(wait).await;
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
        Ok(Attempt {
            leader: false,
            next: SystemTime::now() + self.retry,
        })
    }

    /// What [`decide`] says about `read`, done; `None` when the write met a newer version.
    pub async fn act(&self, read: Option<&Lease>) -> Result<Option<Attempt>, kube::Error> {
        let now = SystemTime::now();
        let wait = |next| {
            Ok(Some(Attempt {
                leader: false,
                next,
            }))
        };
        let write = match (decide(read, &self.identity, now), read) {
            (Step::Wait(until), _) => return wait(until),
            (Step::Missing, _) | (_, None) => return wait(now + self.retry),
            (Step::Renew, Some(read)) => renewed(read, self.duration, now),
            (Step::Take, Some(read)) => taken(read, &self.identity, self.duration, now),
        };
        if !self.replace(&write).await? {
            return Ok(None);
        }
        let renew_in = Duration::from_secs(self.duration - self.grace);
        Ok(Some(Attempt {
            leader: true,
            next: now + renew_in,
        }))
    }

    /// Lets the Lease go if it names us, on the version read.
    pub async fn release(&self) -> Result<(), kube::Error> {
        for _ in 0..TRIES {
            let Some(read) = timed(self.api.get_opt(&self.name)).await? else {
                return Ok(());
            };
            if decide(Some(&read), &self.identity, SystemTime::now()) != Step::Renew {
                return Ok(());
            }
            if self.replace(&released(&read)).await? {
                self.state.lock().await.leader = false;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s)
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
    fn ours_is_renewed_anothers_is_waited_for_until_it_expires_a_free_one_is_taken() {
        let now = at(100);
        assert_eq!(decide(None, "me", now), Step::Missing);
        assert_eq!(
            decide(Some(&lease(Some("me"), Some(95), Some(15))), "me", now),
            Step::Renew
        );
        assert_eq!(
            decide(Some(&lease(Some("me"), Some(10), Some(15))), "me", now),
            Step::Renew,
            "ours, expired: nobody took it since"
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), Some(95), Some(15))), "me", now),
            Step::Wait(at(110))
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), Some(85), Some(15))), "me", now),
            Step::Take,
            "expired at this very moment"
        );
        assert_eq!(
            decide(Some(&lease(Some("b"), None, Some(15))), "me", now),
            Step::Take,
            "a holder without times holds nothing"
        );
        assert_eq!(
            decide(Some(&lease(Some(""), Some(95), Some(15))), "me", now),
            Step::Take
        );
        assert_eq!(
            decide(Some(&lease(None, None, None)), "me", now),
            Step::Take
        );
        assert_eq!(decide(Some(&Lease::default()), "me", now), Step::Take);
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

        let gone = released(&t);
        let spec = gone.spec.expect("spec");
        assert_eq!(
            (spec.holder_identity, spec.renew_time, spec.acquire_time),
            (None, None, None)
        );
        assert_eq!(gone.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            decide(Some(&released(&t)), "b", at(100)),
            Step::Take,
            "a released Lease is free at once"
        );
    }

    /// Three replicas read and write one Lease in any order, with reads that go stale before
    /// their write and time that passes in between, against a store that refuses a write on
    /// a version that is gone (the API server's replace). At no moment do two replicas hold
    /// it: a holder counts from its write until its renewal plus the duration.
    mod protocol {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Read(usize),
            Write(usize),
            Wait(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0..3usize).prop_map(Op::Read),
                (0..3usize).prop_map(Op::Write),
                (0..20u64).prop_map(Op::Wait),
            ]
        }

        proptest! {
            #[test]
            fn no_two_replicas_ever_hold_the_lease(ops in proptest::collection::vec(op(), 1..80)) {
                const DURATION: u64 = 15;
                let ids = ["a", "b", "c"];
                let mut store = lease(None, None, None);
                store.metadata.resource_version = Some("1".into());
                let mut reads: [Option<Lease>; 3] = Default::default();
                let mut holds_until: [Option<SystemTime>; 3] = [None; 3];
                let mut now = at(0);
                for op in ops {
                    match op {
                        Op::Read(r) => reads[r] = Some(store.clone()),
                        Op::Wait(s) => now += Duration::from_secs(s),
                        Op::Write(r) => {
                            let Some(read) = reads[r].take() else { continue };
                            let write = match decide(Some(&read), ids[r], now) {
                                Step::Renew => renewed(&read, DURATION, now),
                                Step::Take => taken(&read, ids[r], DURATION, now),
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
                            holds_until[r] = Some(now + Duration::from_secs(DURATION));
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
