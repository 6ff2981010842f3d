//! The leader's allocation loop on the API side: it turns watch events, write results, re-reads
//! and ticks into inputs of the allocation `Machine`, and carries out the effects it returns
//! (writes, config jobs, publication, events, metrics). It decides nothing.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_crd::pool::NodeIPAMPool;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{error, warn};

use super::pool_writer::{self, PoolJob};
use super::{Context, Error, Fault, config_writer, events, node_writer, publisher};
use crate::alloc::effects::{ConfigJob, Note, WriteJob};
use crate::alloc::machine::{self, Effect, Input, Machine, Metric, Now, Watch};
use crate::alloc::outputs::MANAGED_BY;
use crate::alloc::podnetwork::{OutputKind, OutputRef, PodNetwork};
use crate::alloc::pool::pool_input;
use crate::metrics::{ConfigFamily, Metrics, cidr_label};
use crate::node::IpamNode;

/// How often every pending node is tried again, whatever happened.
const RESYNC: Duration = Duration::from_secs(30);

/// Where the effects go: the writer tasks' channels, and re-reads in flight.
struct Effects {
    ctx: Arc<Context>,
    writes: mpsc::UnboundedSender<WriteJob>,
    config_jobs: mpsc::UnboundedSender<ConfigJob>,
    notes: mpsc::UnboundedSender<Note>,
    network: mpsc::UnboundedSender<PodNetwork>,
    pool_jobs: mpsc::UnboundedSender<PoolJob>,
    rereads: JoinSet<Input>,
}

/// Reads everything, rebuilds the state, then allocates until an error ends the loop (or the
/// caller drops it when leadership is lost; every writer task goes with it).
pub async fn run(ctx: Arc<Context>) -> Result<(), Error> {
    let mut tasks = JoinSet::new();
    let (write_tx, write_rx) = mpsc::unbounded_channel();
    let (result_tx, mut results) = mpsc::unbounded_channel();
    let (config_tx, config_rx) = mpsc::unbounded_channel();
    let (note_tx, note_rx) = mpsc::unbounded_channel();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let (network_tx, network_rx) = mpsc::unbounded_channel();
    let (published_tx, mut published) = mpsc::unbounded_channel();
    tasks.spawn(node_writer::run(ctx.clone(), write_rx, result_tx));
    tasks.spawn(config_writer::run(ctx.clone(), config_rx, done_tx));
    let (pool_tx, pool_rx) = mpsc::unbounded_channel();
    let (pool_answer_tx, mut pool_answers) = mpsc::unbounded_channel();
    tasks.spawn(pool_writer::run(ctx.clone(), pool_rx, pool_answer_tx));
    let (client, instance) = (ctx.client.clone(), ctx.options.instance.clone());
    tasks.spawn(events::run(client, ctx.limiter.clone(), instance, note_rx));
    let options = machine_options(
        &ctx,
        serves_service_cidrs(&ctx.client).await,
        serves_pools(&ctx.client).await,
    );
    if !options.outputs.is_empty() {
        let publish = ctx.options.publish.clone();
        tasks.spawn(publisher::run(
            ctx.clone(),
            publish,
            network_rx,
            published_tx,
        ));
    }
    let mut watches = watches(&ctx.client, &options);
    let mut term = Term::begin(ctx.clone(), options);
    let mut effects = Effects {
        ctx: ctx.clone(),
        writes: write_tx,
        config_jobs: config_tx,
        notes: note_tx,
        network: network_tx,
        pool_jobs: pool_tx,
        rereads: JoinSet::new(),
    };
    let clock = Clock::start();
    // A new state, rebuilt from the Nodes: no leak of an earlier session is ours to count (the
    // take-over sealed or waited out every write that could still land).
    ctx.metrics.leaked_blocks.set(0);
    ctx.metrics.allocation_stepped();
    let mut status_tick = tokio::time::interval(ctx.options.status_interval);
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        let input = tokio::select! {
            item = watches.next() => match item {
                None => return Err(Error::WatchEnded { resource: "all" }),
                Some((_, Ok(input))) => input,
                Some((resource, Err(source))) => {
                    // The watcher reconnects with backoff by itself; the state stays valid.
                    ctx.metrics.reconcile_error("watch");
                    warn!(resource, error = %source, "watch error; retrying");
                    continue;
                }
            },
            Some(ended) = tasks.join_next() => return Err(helper_ended(ended)),
            Some(result) = results.recv() => Input::Written(result),
            Some(reread) = effects.rereads.join_next() => match reread {
                Ok(input) => input,
                Err(e) => return Err(helper_ended(Err(e))),
            },
            Some(job) = done_rx.recv() => Input::ConfigWritten(job),
            Some(answer) = published.recv() => answer,
            Some(answer) = pool_answers.recv() => answer,
            _ = status_tick.tick() => Input::Tick,
            _ = resync.tick() => Input::Resync,
        };
        let started = Instant::now();
        let out = term.machine.handle(clock.now(), input);
        effects.carry_out(out);
        ctx.metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        ctx.metrics.allocation_stepped();
    }
}

/// The machine of one leadership term. However the term ends (an error, or leadership lost
/// and the session dropped), the resourceVersions it saw go back to the process for the next
/// term's machine: a new term relists everything, and that relist must be compared with what
/// earlier terms saw, or a restore between two terms would go unseen.
struct Term {
    machine: Machine,
    ctx: Arc<Context>,
}

impl Term {
    fn begin(ctx: Arc<Context>, mut options: machine::Options) -> Self {
        options.revisions = std::mem::take(&mut *lock(&ctx.revisions));
        let machine = Machine::new(options);
        if let Some(found) = machine.went_back() {
            ctx.metrics.storage_went_back.set(1);
            error!(
                stream = found.stream,
                object = %found.name,
                seen = found.seen,
                listed = found.listed,
                "allocation stays stopped for this term too: {found}"
            );
        }
        Term { machine, ctx }
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        *lock(&self.ctx.revisions) = self.machine.take_revisions();
    }
}

/// A lock whose holder panicked still holds what it held: the versions are only ever replaced
/// whole.
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The machine's settings from the controller's.
fn machine_options(ctx: &Context, service_cidr_api: bool, pools: bool) -> machine::Options {
    let o = &ctx.options;
    let publish = &o.publish;
    // The others only beside ours: their flags without ours are refused at start.
    let outputs = match &publish.pod_network {
        None => Vec::new(),
        Some(pod_network) => {
            std::iter::once(OutputRef::configmap(pod_network, OutputKind::PodNetwork))
                .chain(
                    publish
                        .ip_masq_agent
                        .iter()
                        .map(|m| OutputRef::configmap(m, OutputKind::IpMasqAgent)),
                )
                .chain(publish.typed.iter().cloned())
                .collect()
        }
    };
    machine::Options {
        service_cidrs: o.service_cidrs.clone(),
        service_cidr_api,
        pools,
        write_attempts: o.write_attempts,
        retry_rejected_after: o.retry_rejected_after,
        outputs,
        extra_non_masquerade: publish.extra_non_masquerade.clone(),
        panic_on_node: match &o.fault {
            Some(Fault::PanicOnNode(name)) => Some(name.clone()),
            _ => None,
        },
        // Filled in by `Term::begin` from what earlier terms saw.
        revisions: machine::Revisions::default(),
    }
}

/// The machine's time: monotonic since the loop started, and the wall clock.
struct Clock(Instant);

impl Clock {
    fn start() -> Self {
        Clock(Instant::now())
    }

    fn now(&self) -> Now {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        Now {
            mono: self.0.elapsed(),
            wall_seconds: i64::try_from(wall.as_secs()).unwrap_or(i64::MAX),
        }
    }
}

impl Effects {
    fn carry_out(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            // A send fails only when its writer ended, which ends the loop on its next turn.
            match effect {
                Effect::Write(job) => drop(self.writes.send(job)),
                Effect::Config(job) => drop(self.config_jobs.send(job)),
                Effect::Publish(network) => drop(self.network.send(network)),
                Effect::Note(note) => drop(self.notes.send(note)),
                Effect::Reread { node, uid } => {
                    let ctx = self.ctx.clone();
                    self.rereads.spawn(async move {
                        let now = node_writer::reread(&ctx, &node).await;
                        Input::Reread { node, uid, now }
                    });
                }
                Effect::Metric(m) => record(&self.ctx.metrics, m),
                Effect::CreateConfig(child) => drop(self.pool_jobs.send(PoolJob::Create(child))),
                Effect::EnableConfig(child) => drop(self.pool_jobs.send(PoolJob::Enable(child))),
                Effect::DeleteConfig {
                    name,
                    uid,
                    only_awaiting,
                } => {
                    let job = PoolJob::Delete {
                        name,
                        uid,
                        only_awaiting,
                    };
                    drop(self.pool_jobs.send(job));
                }
                Effect::PoolStatus { name, uid, status } => {
                    drop(self.pool_jobs.send(PoolJob::Status { name, uid, status }));
                }
            }
        }
    }
}

fn record(metrics: &Metrics, metric: Metric) {
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    match metric {
        Metric::Allocated(range) => {
            let label = cidr_label(&range);
            metrics.tries.get_or_create(&label).observe(1.0);
            metrics.allocations.get_or_create(&label).inc();
        }
        Metric::Released(range) => {
            metrics.releases.get_or_create(&cidr_label(&range)).inc();
        }
        Metric::Leaked(n) => {
            metrics
                .leaked_blocks
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        Metric::AssignmentFailure => {
            metrics.assignment_failures.inc();
        }
        Metric::Error(kind) => metrics.reconcile_error(kind),
        Metric::Usage { range, ratio } => {
            metrics.usage.get_or_create(&cidr_label(&range)).set(ratio);
        }
        Metric::Blocks {
            config,
            family,
            allocated,
            capacity,
        } => {
            let label = ConfigFamily {
                config,
                family: family.into(),
            };
            let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            metrics
                .blocks_allocated
                .get_or_create(&label)
                .set(gauge(allocated));
            metrics
                .blocks_capacity
                .get_or_create(&label)
                .set(gauge(capacity));
        }
        Metric::Pending(n) => {
            metrics.pending_nodes.set(count(n));
        }
        Metric::Unmanaged(n) => {
            metrics.unmanaged_pod_cidrs.set(count(n));
        }
        Metric::Capacity { range, blocks } => metrics.range_capacity(&range, blocks),
        Metric::Status { config, status } => metrics.observe_status(&config, &status),
        Metric::ConfigGone(config) => metrics.forget_config(&config),
        Metric::PoolRanges { pool, ranges } => metrics.pool_ranges(&pool, ranges),
        Metric::RangeCarved { pool } => metrics.pool_carved(&pool),
        Metric::RangeRetired { pool } => metrics.pool_retired(&pool),
        Metric::ScaleUpSeconds { pool, seconds } => metrics.pool_scaled_up(&pool, seconds),
        Metric::PoolGone(pool) => metrics.forget_pool(&pool),
        Metric::StorageWentBack(found) => {
            metrics.storage_went_back.set(1);
            error!(
                stream = found.stream,
                object = %found.name,
                uid = %found.uid,
                seen = found.seen,
                listed = found.listed,
                "{found}. What to do: scale the controller to 0 replicas first (a restarted process \
                 remembers nothing and would hand out the lost blocks), make sure etcd was restored \
                 with `etcdutl snapshot restore --bump-revision N --mark-compacted` (again, if \
                 it was not), make every \
                 Node's podCIDRs match what its host uses, run `kubectl nodeipam check`, then \
                 scale it up again"
            );
        }
    }
}

/// A watch event as the machine's input.
fn watch<T>(event: Event<T>) -> Watch<T> {
    match event {
        Event::Init => Watch::ListStart,
        Event::InitApply(x) => Watch::Listed(x),
        Event::InitDone => Watch::ListDone,
        Event::Apply(x) => Watch::Applied(x),
        Event::Delete(x) => Watch::Deleted(x),
    }
}

type Watches =
    std::pin::Pin<Box<dyn Stream<Item = (&'static str, Result<Input, watcher::Error>)> + Send>>;

// Every watch lists with kube-runtime's default semantic, `MostRecent` (a consistent read):
// a list served from a cache that may lag (`any_semantic`, `resourceVersion=0`) could return
// an object older than a watch already showed, and the machine would take that for storage
// that went back in time.

/// Nodes per page of the node list. Each page costs the API server a fixed overhead on top of
/// its Nodes, and a page is in memory while it is read. Measured with 65,000 Nodes, protobuf,
/// two starts each: pages of 500 took 3.5-4.1 s to the rebuild (API server 3.5-4.0 CPU s,
/// peak RSS 63 MB), 2,000 took 2.3 s (1.3 CPU s, 74 MB), 5,000 took 2.1-2.7 s (89 MB).
const NODE_LIST_PAGE: u32 = 2000;

/// One merged stream of the node, config, output and Service CIDR watches.
fn watches(client: &Client, options: &machine::Options) -> futures::stream::SelectAll<Watches> {
    // Nodes are read slim: status and managedFields are most of a Node and none of our business.
    // Lists come as protobuf, in pages of NODE_LIST_PAGE.
    let by_pages = watcher::Config::default().page_size(NODE_LIST_PAGE);
    let node_client = crate::node_lists::client(client.clone());
    let nodes = watcher::watcher(Api::<IpamNode>::all(node_client), by_pages)
        .default_backoff()
        .map(|e| ("nodes", e.map(|e| Input::Node(watch(e)))));
    let configs = watcher::watcher(
        Api::<NodeIPAMConfig>::all(client.clone()),
        Default::default(),
    )
    .default_backoff()
    .map(|e| ("nodeipamconfigs", e.map(|e| Input::Config(watch(e)))));
    let mut all: Vec<Watches> = vec![Box::pin(nodes), Box::pin(configs)];
    for (index, target) in options.outputs.iter().enumerate() {
        all.push(output_watch(client, index, target));
    }
    if options.pools {
        let pools = watcher::watcher(Api::<NodeIPAMPool>::all(client.clone()), Default::default())
            .default_backoff()
            .map(|e| ("nodeipampools", e.map(|e| Input::Pool(pool_watch(e)))));
        all.push(Box::pin(pools));
    }
    if options.service_cidr_api {
        let services =
            watcher::watcher(Api::<ServiceCIDR>::all(client.clone()), Default::default())
                .default_backoff()
                .map(|e| ("servicecidrs", e.map(|e| Input::Service(watch(e)))));
        all.push(Box::pin(services));
    }
    futures::stream::select_all(all)
}

/// The watch of one output: its object by name (RBAC may grant it alone), or every object of
/// ours (the IPPools). A watch that cannot list tells the machine why.
fn output_watch(client: &Client, index: usize, target: &OutputRef) -> Watches {
    let api: Api<DynamicObject> = match &target.namespace {
        Some(ns) => {
            let resource = ApiResource::erase::<ConfigMap>(&());
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        None => publisher::typed_api(client, target),
    };
    let config = match &target.name {
        Some(name) => watcher::Config::default().fields(&format!("metadata.name={name}")),
        None => watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)),
    };
    let plural = target.kind.plural();
    let target = target.clone();
    let stream = watcher::watcher(api, config)
        .default_backoff()
        .map(move |e| match e {
            Ok(e) => (plural, Ok(Input::Output(index, watch(e)))),
            Err(e) => {
                warn!(output = %target, error = %e, "watching a consumer output failed; retrying");
                (
                    plural,
                    Ok(Input::OutputFailed(index, cannot_list(&target, &e))),
                )
            }
        });
    Box::pin(stream)
}

/// Why an output's watch cannot list, in the words an operator acts on.
fn cannot_list(target: &OutputRef, e: &watcher::Error) -> String {
    let api = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => Some(s),
        watcher::Error::WatchError(s) => Some(s),
        _ => None,
    };
    let resource = format!("{}/{}", target.kind.plural(), target.api_version);
    match api {
        Some(s) if s.code == 404 => {
            format!("the API server does not serve {resource}: is its CRD installed?")
        }
        Some(s) if s.code == 403 => format!(
            "forbidden to list and watch {resource}: grant the controller get, list, watch, \
             create, patch and delete on it ({})",
            s.message
        ),
        _ => e.to_string(),
    }
}

/// A pool watch event as the machine's input: the pool as the decision sees it.
fn pool_watch(event: Event<NodeIPAMPool>) -> Watch<crate::alloc::pool::PoolInput> {
    match watch(event) {
        Watch::ListStart => Watch::ListStart,
        Watch::Listed(p) => Watch::Listed(pool_input(&p)),
        Watch::ListDone => Watch::ListDone,
        Watch::Applied(p) => Watch::Applied(pool_input(&p)),
        Watch::Deleted(p) => Watch::Deleted(pool_input(&p)),
    }
}

/// Whether the NodeIPAMPool CRD is installed: a cluster upgraded without it allocates as
/// before, and no pool list is awaited.
async fn serves_pools(client: &Client) -> bool {
    let api: Api<NodeIPAMPool> = Api::all(client.clone());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 => {
            warn!("the NodeIPAMPool CRD is not installed: pools are not watched");
            false
        }
        // Roles from before pools: a watch that can never list would hold back every
        // allocation (nothing is allocated before every watch has listed).
        Err(kube::Error::Api(s)) if s.code == 403 => {
            warn!(message = %s.message, "not allowed to list NodeIPAMPools: pools are not watched; grant the controller's ClusterRole nodeipampools get/list/watch");
            false
        }
        Err(_) => true,
    }
}

/// Older clusters have no ServiceCIDR API; the `--service-cidr` flag covers them.
async fn serves_service_cidrs(client: &Client) -> bool {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(s)) if s.code == 404 => false,
        // Unknown (API briefly away): watch it; the watcher retries.
        Err(_) => true,
    }
}

/// A helper task of the loop (a writer, the publisher, events) ended: its panic goes on up, so
/// that the process supervisor ends the replica instead of a leader that writes nothing.
fn helper_ended(ended: Result<(), tokio::task::JoinError>) -> Error {
    match ended {
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        _ => Error::WatchEnded {
            resource: "a writer task",
        },
    }
}
