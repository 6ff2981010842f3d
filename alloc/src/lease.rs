//! The leadership rules, pure: what a replica does about a Lease it read ([`decide`], with how
//! long it has seen it [`Unchanged`]), whether it leads ([`holds`]), how it took over
//! ([`takeover`]) and how long it waits before its first write ([`wait`]). They work on
//! [`LeaseView`], a Lease as the lock reads it, and on any monotonic clock ([`Monotonic`]), so
//! that the controller runs them on its Lease objects and `Instant`s and the simulator on its
//! own clocks. Why they keep one writer: docs/single-writer.md.
//!
//! No rule is given a wall clock: a Lease's `renewTime` is another replica's wall clock, and
//! comparing it with ours would let a skewed clock decide who leads.

use std::time::Duration;

/// What a leader that stopped left on the Lease for the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Nothing of it (nor of any earlier leader) can still land.
    Settled,
    /// It sends nothing more, though what it sent may still land.
    Stopped,
}

/// A Lease as the lock reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// What changes with every write: the resourceVersion.
    pub version: String,
    /// `holderIdentity` as written (`None` or empty: nobody holds it).
    pub holder: Option<String>,
    /// `renewTime`, microseconds since the Unix epoch by its writer's wall clock. For people:
    /// only whether it is there counts.
    pub renewed: Option<i64>,
    /// `leaseDurationSeconds`.
    pub duration: Option<Duration>,
    /// The hand-over mark (a value we do not know is none).
    pub mark: Option<Mark>,
    /// Being deleted.
    pub terminating: bool,
    /// It carries our finalizer.
    pub finalized: bool,
}

impl LeaseView {
    /// How long a holder's renewal holds it: its duration, if it was ever renewed (a holder
    /// without times holds nothing).
    pub fn term(&self) -> Option<Duration> {
        self.renewed?;
        self.duration
    }

    fn names(&self, identity: &str) -> bool {
        self.holder.as_deref() == Some(identity)
    }
}

/// A reading of a monotonic clock: `std::time::Instant` in the controller, a simulated
/// process's clock in the tests.
pub trait Monotonic: Copy + Ord {
    /// How long after `earlier` this reading is (zero if it is not after).
    fn since(self, earlier: Self) -> Duration;
}

impl Monotonic for Duration {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_sub(earlier)
    }
}

/// Only compared here; the controller reads the clock.
impl Monotonic for std::time::Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// What to do about a Lease just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// It names us: renew it (even if it expired; nobody took it since).
    Renew,
    /// Nobody holds it, or we have seen its holder leave it unchanged for a whole lease
    /// duration: take it.
    Take,
    /// Another replica holds it: look again once it could have been unchanged long enough.
    Wait(Duration),
    /// There is no Lease (it is created elsewhere, for a first leader).
    Missing,
}

/// What to do about `view` as `identity`, when this replica has seen it unchanged for
/// `unchanged` (see [`Unchanged`]). Never the holder's `renewTime` against our clock.
pub fn decide(view: Option<&LeaseView>, identity: &str, unchanged: Duration) -> Step {
    let Some(view) = view else {
        return Step::Missing;
    };
    match view.holder.as_deref() {
        Some(holder) if holder == identity => Step::Renew,
        Some(holder) if !holder.is_empty() => match view.term() {
            Some(term) if unchanged < term => Step::Wait(term - unchanged),
            _ => Step::Take,
        },
        _ => Step::Take,
    }
}

/// How a replica came to hold the Lease, which says what its predecessor may still do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Took {
    /// It had no holder: released by its holder (marked so), freed by hand, or just created.
    Free,
    /// We saw it unchanged for a whole lease duration: its holder's term ran out.
    Expired,
}

/// How a [`Step::Take`] of `view` takes it.
pub fn took(view: &LeaseView) -> Took {
    if view.holder.as_deref().is_none_or(str::is_empty) {
        Took::Free
    } else {
        Took::Expired
    }
}

/// The Lease version this replica last read and when it first read it, on its monotonic
/// clock: how long it has seen the Lease unchanged.
#[derive(Debug)]
pub struct Unchanged<T> {
    seen: Option<(String, T)>,
}

impl<T> Default for Unchanged<T> {
    fn default() -> Self {
        Unchanged { seen: None }
    }
}

impl<T: Monotonic> Unchanged<T> {
    /// A Lease read whose answer arrived at `at` (`None`: missing). Returns how long this
    /// version has been seen unchanged. Counting from the answer, never from when the read was
    /// sent, only ever shortens the count.
    pub fn note(&mut self, view: Option<&LeaseView>, at: T) -> Duration {
        let version = view.map(|v| v.version.as_str()).unwrap_or_default();
        match &self.seen {
            Some((v, since)) if v == version => at.since(*since),
            _ => {
                self.seen = Some((version.to_string(), at));
                Duration::ZERO
            }
        }
    }
}

/// Whether a replica leads now: its lock claims the Lease, its last read showed it [`ours`],
/// and its own term (`valid_until`: from the moment its last renewal was sent, on its own
/// monotonic clock) has more than `margin` left. A standby counts the same term only from the
/// moment it saw that renewal, which is later.
pub fn holds<T: Monotonic>(
    claimed: bool,
    ours: bool,
    valid_until: Option<T>,
    margin: Duration,
    now: T,
) -> bool {
    claimed && ours && valid_until.is_some_and(|end| now < end && end.since(now) > margin)
}

/// Whether a read shows the Lease held by `identity` as every replica reads it: naming it with
/// a term (one without times is free to any other replica), and not being deleted.
pub fn ours(view: &LeaseView, identity: &str) -> bool {
    !view.terminating && view.names(identity) && view.term().is_some()
}

/// How a leader took over: what its predecessor may still do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Takeover {
    /// Its predecessor vouched that nothing of it can still land: allocate at once.
    Clean,
    /// Its predecessor sends nothing more (its term ran out, or it let go marked stopped):
    /// wait out the longest write.
    Unclean,
    /// Nothing says its predecessor stopped (the Lease was missing, or freed by hand): wait
    /// out its term and then the longest write.
    Unknown,
}

impl Takeover {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Takeover::Clean => "clean",
            Takeover::Unclean => "unclean",
            Takeover::Unknown => "unknown",
        }
    }
}

/// How a leader took over, from the Lease it holds and how its lock took it: clean only when
/// the Lease names `identity` as its holder (the mark was left for whoever took it next: us)
/// and carries the settled mark.
pub fn takeover(view: &LeaseView, identity: &str, took: Option<Took>) -> Takeover {
    match (view.mark, took) {
        (Some(Mark::Settled), _) if view.names(identity) => Takeover::Clean,
        (Some(Mark::Stopped), _) | (_, Some(Took::Expired)) => Takeover::Unclean,
        _ => Takeover::Unknown,
    }
}

/// How long a leader that took over as `took` waits before its first write: nothing after a
/// clean hand-over or when nothing was ever allocated (no config carries our finalizer:
/// `allocated_before` false), the longest write (`delay`) after a predecessor that stopped,
/// and its whole term (`term`) more when nothing says it stopped.
pub fn wait(took: Takeover, allocated_before: bool, delay: Duration, term: Duration) -> Duration {
    match took {
        Takeover::Clean => Duration::ZERO,
        _ if !allocated_before => Duration::ZERO,
        Takeover::Unclean => delay,
        Takeover::Unknown => term + delay,
    }
}

/// The mark a holder that sends nothing more lets the Lease go with: a settled mark says more
/// than stopped and stays; `stopped` only from a holder that `led` on it (a session of its
/// own began, its take-over wait over, and was not lost since). A holder that never led says
/// nothing new: the Lease may have been renamed to it by hand under a live leader, which may
/// still send until its own term ends, so the mark stays as it was (none, or a predecessor's
/// `stopped`, since no session claimed it). Found by the leadership simulator, seed 159730.
pub fn release_mark(mark: Option<Mark>, led: bool) -> Option<Mark> {
    match (mark, led) {
        (Some(Mark::Settled), _) => Some(Mark::Settled),
        (_, true) => Some(Mark::Stopped),
        (mark, false) => mark,
    }
}

/// Whether `identity` may take our finalizer off a terminating Lease (once its own session
/// stopped and the take-over wait passed): it holds it, or nobody does.
pub fn releasable(view: &LeaseView, identity: &str) -> bool {
    let holder = view.holder.as_deref().filter(|h| !h.is_empty());
    view.terminating && view.finalized && holder.is_none_or(|h| h == identity)
}

/// The mark of the Lease that `identity` creates once it let `deleted` go (a terminating
/// Lease it took our finalizer off, [`releasable`] by it, its own writes over): settled only
/// when `deleted` names `identity` and `led`, none otherwise, so that whoever takes the next
/// Lease waits out a whole term first ([`Takeover::Unknown`]).
///
/// `led`: this replica was leading with its session begun (its take-over wait over, so that
/// nothing of an earlier leader could still land) right up to the read that first found
/// `deleted` [`releasable`]. Our own writes being over is not enough: a Lease freed or renamed
/// by hand before it was deleted names nobody, or a replica that took it meanwhile and never
/// led on it, and the leader the hand edit displaced may still send until its own term ends.
///
/// `answered`: every write of that session got an answer that rules it out
/// ([`crate::outcome::may_still_land`] false), as for a settled hand-over. The settle before
/// the Lease is let go is only the write timeout; a write without such an answer may land
/// after it (found by the beyond-the-bound search, seed 106).
pub fn next_mark(deleted: &LeaseView, identity: &str, led: bool, answered: bool) -> Option<Mark> {
    (led && answered && deleted.names(identity)).then_some(Mark::Settled)
}

/// Why `identity` may not lead on `view`, if it may not: it is being deleted, or another
/// replica took it since our last read (two replicas can both lock a free Lease), whatever
/// that read said.
pub fn unclaimable(view: &LeaseView, identity: &str) -> Option<&'static str> {
    if view.terminating {
        Some("the lease is being deleted")
    } else if !view.names(identity) {
        Some("the lease names another holder")
    } else {
        None
    }
}

/// A process's identity in the Lease: its pod (or host) name and a suffix drawn at random when
/// it starts. Two processes never share one, even with the same pod name (a copied manifest,
/// a pod restarted in place): two replicas that each took the other's renewals for their own
/// would both lead.
pub fn identity(name: &str, suffix: &str) -> String {
    format!("{name}_{suffix}")
}

/// The name part of an [`identity`]: the pod (or host) name, without the random suffix.
pub fn holder_name(identity: &str) -> &str {
    identity.rsplit_once('_').map_or(identity, |(name, _)| name)
}

#[cfg(test)]
mod tests;
