//! The API side of the controller: the shared `Context`, the error type, and `run`, which
//! allocates only while leadership is held and rebuilds its state each time it is gained.

pub mod config_writer;
pub mod driver;
pub mod events;
#[cfg(test)]
mod fake_api;
pub mod handover;
pub mod leader;
pub mod lease_lock;
pub mod node_writer;
pub mod pool_writer;
pub mod publisher;
pub mod seal;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use kube::Client;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use nodeipam_crd::{FINALIZER, NodeIPAMConfig};

use crate::metrics::Metrics;
use crate::ratelimit::RateLimiter;

/// Name under which the controller writes (server-side apply field manager, event reporter).
pub const MANAGER: &str = "nodeipam";
/// Annotation on a Node naming the NodeIPAMConfig its blocks came from, written together with
/// the podCIDRs. Informational: the controller itself derives the config from the CIDR.
pub const CONFIG_ANNOTATION: &str = "nodeipam.io/config";

/// Errors of the API side. None of them stop the process: a session ends and is rebuilt.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("watching {resource}: {source}")]
    Watch {
        resource: &'static str,
        #[source]
        source: kube::runtime::watcher::Error,
    },
    #[error("the {resource} watch ended")]
    WatchEnded { resource: &'static str },
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// A short label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Watch { .. } => "watch",
            Error::WatchEnded { .. } => "watch_ended",
            Error::Kube(_) => "kube",
        }
    }
}

/// Settings of the allocation loop.
#[derive(Clone, Debug)]
pub struct Options {
    /// Service CIDRs from the `--service-cidr` flag, for clusters without ServiceCIDR objects.
    pub service_cidrs: Vec<IpNet>,
    /// How many podCIDR writes run at once.
    pub write_concurrency: usize,
    /// How long one write may take before its outcome counts as ambiguous.
    pub write_timeout: Duration,
    /// How many times a write the API server refuses is sent before we give up on it.
    pub write_attempts: u32,
    /// How long a node whose write we gave up on waits before it is tried again from scratch.
    pub retry_rejected_after: Duration,
    /// How often coalesced status changes are written.
    pub status_interval: Duration,
    /// The reporting instance for events (the pod name).
    pub instance: Option<String>,
    /// Sustained writes per second (0 = unlimited) and the burst above it, for a context made
    /// by [`Context::new`]; [`Context::with_limiter`] (the binary) takes its budget instead.
    pub qps: f64,
    pub burst: u32,
    /// The published pod network for consumers, and the ordering gate that comes with it.
    pub publish: publisher::PublishOptions,
    /// How long a new leader waits before it lists, so a previous leader's last writes land
    /// first, unless the previous leader handed over settled. Zero without leader election.
    pub takeover_delay: Duration,
    /// The Lease this replica elects with, where hand-overs are marked. None without leader
    /// election.
    pub lease: Option<handover::LeaseRef>,
    /// A fault to inject, for the tests of supervision.
    pub fault: Option<Fault>,
}

/// A fault the end-to-end tests inject into a debug build, to prove that a task that dies
/// takes the process (and its lease) with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The allocation loop panics when it sees a Node of this name.
    PanicOnNode(String),
    /// The node writer panics when it writes a Node of this name.
    PanicInWriter(String),
    /// The leader election loop hangs once it holds the lease (liveness must notice).
    StallElection,
    /// The webhook's port stays bound but nothing accepts on it (liveness must notice).
    StallWebhook,
    /// This process's wall clock reads this many seconds off (an NTP step, a VM resumed):
    /// no leadership decision may depend on it.
    ClockOffset(i64),
}

impl std::str::FromStr for Fault {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stall-election" => return Ok(Fault::StallElection),
            "stall-webhook" => return Ok(Fault::StallWebhook),
            _ => {}
        }
        match s.split_once(':') {
            Some(("clock-offset", secs)) => secs
                .parse()
                .map(Fault::ClockOffset)
                .map_err(|e| format!("clock-offset:{secs}: not a whole number of seconds: {e}")),
            Some(("panic-on-node", name)) if !name.is_empty() => {
                Ok(Fault::PanicOnNode(name.to_string()))
            }
            Some(("panic-in-writer", name)) if !name.is_empty() => {
                Ok(Fault::PanicInWriter(name.to_string()))
            }
            _ => Err(format!(
                "{s:?} is not a known fault (panic-on-node:NAME, panic-in-writer:NAME, \
                 stall-election, stall-webhook, clock-offset:SECONDS)"
            )),
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            service_cidrs: Vec::new(),
            write_concurrency: 16,
            write_timeout: Duration::from_secs(10),
            write_attempts: 8,
            retry_rejected_after: Duration::from_secs(60),
            status_interval: Duration::from_millis(200),
            instance: None,
            qps: 0.0,
            burst: 100,
            publish: publisher::PublishOptions::default(),
            takeover_delay: Duration::ZERO,
            lease: None,
            fault: None,
        }
    }
}

/// What every part of the API side shares.
pub struct Context {
    pub client: Client,
    pub options: Options,
    pub metrics: Arc<Metrics>,
    /// The budget every [`Context::write`] takes a token from before its timeout starts (a
    /// write still waiting for a token was never sent, so it cannot be in doubt). In the
    /// binary, `client`'s reads take theirs from it too, and its writes none of their own
    /// (`ratelimit::Charge::Reads`).
    pub limiter: Arc<RateLimiter>,
    /// The current session's writes, for a settled hand-over.
    pub in_flight: handover::InFlight,
    /// The resourceVersions earlier terms of this process saw, for the next term's machine
    /// to compare its lists with (storage that went back in time stops allocation).
    pub revisions: std::sync::Mutex<crate::alloc::machine::Revisions>,
}

impl Context {
    /// Writes limited to `options.qps` (reads only by whatever limits `client`).
    pub fn new(client: Client, options: Options, metrics: Arc<Metrics>) -> Self {
        let limiter = Arc::new(RateLimiter::new(options.qps, options.burst));
        Self::with_limiter(client, limiter, options, metrics)
    }

    /// Writes take their tokens from `limiter`, the one `client` charges its reads to.
    pub fn with_limiter(
        client: Client,
        limiter: Arc<RateLimiter>,
        options: Options,
        metrics: Arc<Metrics>,
    ) -> Self {
        Context {
            client,
            options,
            metrics,
            limiter,
            in_flight: handover::InFlight::default(),
            revisions: Default::default(),
        }
    }
}

impl Context {
    /// A mutating request: accounted for in the session's writes ([`handover::InFlight`]) and
    /// bounded by the write timeout; no answer in time is an error like any other, and one
    /// after which the write may still land.
    ///
    /// With leader election, a write starts only within this replica's term as its election
    /// last counted it, checked here, after everything the request is conditioned on was
    /// read: a task that woke late (a process frozen past its term, an election loop that
    /// hangs) cannot condition a write on what its successor wrote.
    ///
    /// The token comes first: the term is checked when the write is about to go, and its
    /// timeout counts from there. A write refused before it went is [`NotSent`].
    pub async fn write<T>(
        &self,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        self.limiter.acquire().await;
        if let Some(lease) = &self.options.lease
            && !lease.session.within_term(std::time::Instant::now())
        {
            return Err(NotSent::error("this replica's term is over"));
        }
        self.in_flight
            .send(bounded(self.options.write_timeout, request))
            .await
    }

    /// A read, bounded by the write timeout.
    pub async fn read<T>(
        &self,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        bounded(self.options.write_timeout, request).await
    }
}

/// A write refused before it was sent: it cannot land, so it is never in doubt.
#[derive(Debug)]
pub struct NotSent(pub &'static str);

impl std::fmt::Display for NotSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not sent: {}", self.0)
    }
}

impl std::error::Error for NotSent {}

impl NotSent {
    pub fn error(why: &'static str) -> kube::Error {
        kube::Error::Service(Box::new(NotSent(why)))
    }

    /// Whether `e` is a write refused before it was sent.
    pub fn is(e: &kube::Error) -> bool {
        matches!(e, kube::Error::Service(inner) if inner.is::<NotSent>())
    }
}

/// `request`, or an error once `limit` passed without an answer.
pub async fn bounded<T>(
    limit: Duration,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {limit:?}").into(),
        )),
    }
}

/// After a 422 on a patch that tested the object's UID: whether `name` is now another object
/// (or none), which is what a failed test means. A 422 on the same object is a refusal (a
/// schema, a policy) and stays an error, to be retried.
pub async fn another_object<K>(
    ctx: &Context,
    api: &kube::Api<K>,
    name: &str,
    uid: &str,
) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let now = ctx.read(api.get_opt(name)).await?;
    Ok(now.is_none_or(|o| o.meta().uid.as_deref() != Some(uid)))
}

/// Allocates while `leadership` says true; stops at once when it turns false, and starts over
/// from a fresh read of the API when it turns true again. Returns when `leadership` closes.
pub async fn run(ctx: Arc<Context>, leadership: watch::Receiver<bool>) {
    let (_never, stop) = watch::channel(false);
    run_until(ctx, leadership, stop).await;
}

/// [`run`] until `stop` turns true: then no new write starts, those in flight are waited for,
/// and the answer is whether the session stopped settled (see [`handover`]): every write it
/// sent answered, so that the Lease may tell the next leader it need not wait.
pub async fn run_until(
    ctx: Arc<Context>,
    mut leadership: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) -> bool {
    loop {
        tokio::select! {
            held = turns(&mut leadership, true) => if !held { return false },
            // A standby, or a leader still waiting: it sent nothing to vouch for.
            true = turns(&mut stop, true) => return false,
        }
        tokio::select! {
            () = take_over(&ctx) => {}
            _ = turns(&mut leadership, false) => continue,
            true = turns(&mut stop, true) => return false,
        };
        info!("leadership held: rebuilding allocation state from the API");
        let running = Running::begin(ctx.options.lease.as_ref(), &ctx.in_flight);
        ctx.in_flight.begin();
        ctx.metrics.allocation_stepped();
        ctx.metrics.set_leader(true);
        let session = driver::run(ctx.clone());
        tokio::pin!(session);
        let ended = tokio::select! {
            result = &mut session => result,
            _ = turns(&mut leadership, false) => {
                info!("leadership lost: allocation stopped");
                Ok(())
            }
            true = turns(&mut stop, true) => {
                // The session is kept (not polled) while its writers finish what they sent.
                let limit = ctx.options.write_timeout + Duration::from_secs(1);
                let settled = ctx.in_flight.settle(limit).await;
                ctx.metrics.set_leader(false);
                return settled;
            }
        };
        drop(running);
        ctx.metrics.set_leader(false);
        if let Err(e) = ended {
            ctx.metrics.reconcile_error(e.kind());
            warn!(error = %e, "allocation session ended; rebuilding");
            // Back off a little so an API server that is down is not hammered.
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                true = turns(&mut stop, true) => return false,
            }
        }
    }
}

/// Says, from the moment a session begins (its take-over wait over) until it is dropped, that
/// an allocation session runs ([`leader::SessionCell`]): the election reads it when it finds
/// the Lease being deleted.
/// When it ends it says whether a write of the session may still land.
struct Running<'a>(Option<&'a leader::SessionCell>, &'a handover::InFlight);

impl<'a> Running<'a> {
    fn begin(lease: Option<&'a handover::LeaseRef>, in_flight: &'a handover::InFlight) -> Self {
        let cell = lease.map(|l| &l.session);
        if let Some(cell) = cell {
            cell.begin();
        }
        Running(cell, in_flight)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Some(cell) = self.0 {
            cell.end(self.1.in_doubt());
        }
    }
}

/// Until `signal` says `value`; false if its sender is gone first. (The guard of `wait_for`
/// is not held across the awaits that follow, so the loop stays `Send`.)
async fn turns(signal: &mut watch::Receiver<bool>, value: bool) -> bool {
    signal.wait_for(|v| *v == value).await.is_ok()
}

/// Before a session writes anything: after a clean hand-over it starts at once; otherwise it
/// waits as [`handover::wait`] says (writes of a previous leader, or of an earlier session of
/// ours, still landing; and a predecessor that may still be sending), then claims again:
/// another replica may have displaced us meanwhile, and our last read of the Lease would not
/// say so before the next one. Its seal, when it makes one, never gives up: nothing is
/// allocated until every Node a predecessor may have read is sealed.
async fn take_over(ctx: &Context) {
    let delay = ctx.options.takeover_delay;
    let Some(lease) = &ctx.options.lease else {
        tokio::time::sleep(delay).await;
        return;
    };
    let took = claim(ctx, lease).await;
    let allocated_before = took != handover::Takeover::Clean && allocated_before(ctx).await;
    let wait = handover::wait(took, allocated_before, delay, lease.term);
    // Counted by what it waited for: nothing is a clean take-over.
    let label = if wait.is_zero() {
        handover::Takeover::Clean.label()
    } else {
        took.label()
    };
    ctx.metrics.took_over(label);
    match (took, allocated_before) {
        (handover::Takeover::Clean, _) => info!(
            "leadership gained: the previous leader handed over with every write answered; allocating at once"
        ),
        (_, false) => info!(
            ?took,
            "leadership gained: no NodeIPAMConfig carries our finalizer, so nothing was ever allocated; allocating at once"
        ),
        // Writes a deposed leader sent just before it lost the lease may still be landing;
        // let them settle so the list that follows sees them as held blocks.
        (handover::Takeover::Unclean, true) => info!(
            ?wait,
            "leadership gained: letting writes of a previous leader settle"
        ),
        (handover::Takeover::Unknown, true) => warn!(
            ?wait,
            "leadership gained on a lease that was missing or freed by hand: a previous leader may still be writing until its term ends; waiting it out and letting its writes settle"
        ),
    }
    // The seal runs within the wait: it ends the timing assumption for podCIDR writes, and
    // the wait still covers the other writes (docs/single-writer.md, step 2). It may take
    // longer than the wait (a throttled API server): the session waits for it.
    let seal = async {
        let Some(after) = crate::alloc::seal::after(took, allocated_before, lease.term) else {
            return;
        };
        tokio::time::sleep(after).await;
        seal::run(ctx).await;
    };
    tokio::join!(tokio::time::sleep(wait), seal);
    if !wait.is_zero() {
        claim(ctx, lease).await;
    }
}

/// Whether any NodeIPAMConfig carries our finalizer: a block was (or may be being) handed out
/// from it. Asked a few times (an API server starting answers 429 for a moment); no answer
/// counts as yes.
async fn allocated_before(ctx: &Context) -> bool {
    let api: kube::Api<NodeIPAMConfig> = kube::Api::all(ctx.client.clone());
    let params = kube::api::ListParams::default();
    for attempt in 0..5u32 {
        match ctx.read(api.list_metadata(&params)).await {
            Ok(list) => {
                return list.items.iter().any(|c| {
                    c.metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == FINALIZER)
                });
            }
            Err(e) => {
                debug!(error = %e, attempt, "listing NodeIPAMConfigs failed; asking again");
                tokio::time::sleep(node_writer::backoff(attempt + 1)).await;
            }
        }
    }
    warn!("listing NodeIPAMConfigs failed every time: waiting as if a leader had allocated");
    true
}

/// [`handover::claim`] until it succeeds: the mark must be gone and the Lease still ours
/// before we write. Only a change of leadership ends the asking.
async fn claim(ctx: &Context, lease: &handover::LeaseRef) -> handover::Takeover {
    loop {
        let took = *lease
            .took
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match handover::claim(&ctx.client, lease, took).await {
            Ok(took) => return took,
            Err(e) => {
                warn!(error = %e, "claiming the lease failed; asking again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// A leadership signal that is always held, for a single replica and for tests.
pub fn always_leader() -> (watch::Sender<bool>, watch::Receiver<bool>) {
    watch::channel(true)
}
