//! The leader's allocation loop: one task owns the allocation state and turns watch events and
//! write outcomes into decisions, which it hands to the writers. Being the only owner of the
//! state is what makes it a single writer: no two decisions ever race.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::ListParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource, ResourceExt};
use nodeipam_crd::{
    Allocation as AllocationSwitch, FINALIZER, NodeIPAMConfig, NodeIPAMConfigStatus,
};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, error, info, warn};

use super::config_writer::{self, ConfigJob};
use super::events::{self, Note};
use super::node_writer::{self, WriteJob, WriteResult};
use super::publisher::{self, ConfigMapRef};
use super::{Context, Error};
use crate::ipam::{ConfigInput, Ipam, Phase};
use crate::metrics::{ConfigFamily, cidr_label};
use crate::node::IpamNode;
use crate::outcome::{Decision, WriteOutcome, decide};
use crate::podnetwork::{ConfigRanges, OutputContent, OutputKind, PodNetwork, covered};
use crate::status::desired_status;

const SERVICE_FLAG_SOURCE: &str = "--service-cidr";
/// The sync keys of the output watches, by index in `outputs`.
const OUTPUT_WATCHES: [&str; 2] = ["configmaps/pod-network", "configmaps/ip-masq-agent"];
const RESYNC: Duration = Duration::from_secs(30);

/// What the loop remembers of a config object besides the allocation state.
struct ConfigSeen {
    /// The allocation state's view, before gates.
    base: ConfigInput,
    uid: Option<String>,
    generation: Option<i64>,
    has_finalizer: bool,
    deleting: bool,
    status: Option<NodeIPAMConfigStatus>,
    finalizer_requested: bool,
}

/// A node waiting for a block.
struct PendingNode {
    uid: Option<String>,
    labels: BTreeMap<String, String>,
    warned: bool,
    /// Not before then: the API server refused every write of its last blocks.
    retry_at: Option<Instant>,
}

/// A consumer output of the pod network and what its watch last showed.
struct Output {
    target: ConfigMapRef,
    kind: OutputKind,
    /// `None` until the watch has listed it; an absent ConfigMap holds nothing.
    seen: Option<OutputContent>,
    /// Whether the current (re)list returned the object.
    listed: bool,
}

pub struct Session {
    ctx: Arc<Context>,
    ipam: Ipam,
    synced: bool,
    pending: BTreeMap<String, PendingNode>,
    configs: BTreeMap<String, ConfigSeen>,
    /// The status we last wrote per config: the previous conditions for the next one, even
    /// before the watch shows our write.
    written: HashMap<String, NodeIPAMConfigStatus>,
    dirty: BTreeSet<String>,
    unmanaged_dirty: bool,
    reported: HashSet<(String, IpNet)>,
    invalid_reported: HashSet<String>,
    /// Ordered add: each consumer output, as its watch shows it. A range is allocated from
    /// only once every one of them holds it.
    outputs: Vec<Output>,
    /// What the outputs were last asked to hold; sent again when an output drifts from it.
    network_sent: Option<Vec<OutputContent>>,
    network_dirty: bool,
    network_jobs: mpsc::UnboundedSender<PodNetwork>,
    writes: mpsc::UnboundedSender<WriteJob>,
    config_jobs: mpsc::UnboundedSender<ConfigJob>,
    notes: mpsc::UnboundedSender<Note>,
}

/// Which resource a watch event came from.
// Each event is moved once from the stream to its handler; boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
enum Watched {
    Node(Event<IpamNode>),
    Config(Event<NodeIPAMConfig>),
    Service(Event<ServiceCIDR>),
    /// A published ConfigMap, by its index in `outputs`.
    Output(usize, Event<ConfigMap>),
}

impl Session {
    /// Reads everything, rebuilds the state, then allocates until an error ends the session
    /// (or the caller drops it when leadership is lost; every writer task goes with it).
    pub async fn run(ctx: Arc<Context>) -> Result<(), Error> {
        let mut tasks = JoinSet::new();
        let (write_tx, write_rx) = mpsc::unbounded_channel();
        let (result_tx, mut results) = mpsc::unbounded_channel::<WriteResult>();
        let (config_tx, config_rx) = mpsc::unbounded_channel();
        let (note_tx, note_rx) = mpsc::unbounded_channel();
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        let (network_tx, network_rx) = mpsc::unbounded_channel();
        tasks.spawn(node_writer::run(ctx.clone(), write_rx, result_tx));
        tasks.spawn(config_writer::run(ctx.clone(), config_rx, done_tx));
        tasks.spawn(events::run(
            ctx.client.clone(),
            ctx.options.instance.clone(),
            note_rx,
        ));
        let outputs = outputs(&ctx.options.publish);
        if !outputs.is_empty() {
            tasks.spawn(publisher::run(
                ctx.clone(),
                ctx.options.publish.clone(),
                network_rx,
            ));
        }

        let mut session = Session {
            ctx: ctx.clone(),
            ipam: Ipam::new(),
            synced: false,
            pending: BTreeMap::new(),
            configs: BTreeMap::new(),
            written: HashMap::new(),
            dirty: BTreeSet::new(),
            unmanaged_dirty: false,
            reported: HashSet::new(),
            invalid_reported: HashSet::new(),
            outputs,
            network_sent: None,
            network_dirty: true,
            network_jobs: network_tx,
            writes: write_tx,
            config_jobs: config_tx,
            notes: note_tx,
        };
        session
            .ipam
            .set_service_cidrs(SERVICE_FLAG_SOURCE, ctx.options.service_cidrs.clone());

        ctx.metrics.allocation_stepped();
        let mut watches = session.watches().await;
        let mut init_done: HashSet<&'static str> = HashSet::new();
        let mut relist: HashMap<&'static str, HashSet<String>> = HashMap::new();
        // Nodes, configs and every published output; Service CIDRs where the API has them.
        let needed = 2 + session.outputs.len() + usize::from(session.serves_service_cidrs().await);
        let mut status_tick = tokio::time::interval(ctx.options.status_interval);
        let mut resync = tokio::time::interval(RESYNC);
        loop {
            tokio::select! {
                item = watches.next() => {
                    let Some((resource, item)) = item else {
                        return Err(Error::WatchEnded { resource: "all" });
                    };
                    let event = match item {
                        Ok(event) => event,
                        Err(source) => {
                            // The watcher reconnects with backoff by itself; the state stays valid.
                            ctx.metrics.reconcile_error("watch");
                            warn!(resource, error = %source, "watch error; retrying");
                            continue;
                        }
                    };
                    let started = Instant::now();
                    session.on_event(resource, event, &mut init_done, &mut relist, needed).await;
                    ctx.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
                }
                Some(ended) = tasks.join_next() => return Err(helper_ended(ended)),
                Some(result) = results.recv() => session.on_write_result(result),
                Some(written) = done_rx.recv() => debug!(?written, "config write done"),
                _ = status_tick.tick() => {
                    session.wake_parked();
                    session.flush_status();
                    session.publish_network();
                }
                _ = resync.tick() => if session.synced { session.retry_pending() },
            }
            session.update_gauges();
            ctx.metrics.allocation_stepped();
        }
    }

    /// One merged stream of the node, config and Service CIDR watches.
    async fn watches(
        &self,
    ) -> impl Stream<Item = (&'static str, Result<Watched, watcher::Error>)> + Unpin + use<> {
        let client = self.ctx.client.clone();
        // Nodes are read slim: status and managedFields are most of a Node and none of our business.
        let nodes = watcher::watcher(
            Api::<IpamNode>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|e| ("nodes", e.map(Watched::Node)));
        let configs = watcher::watcher(
            Api::<NodeIPAMConfig>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .map(|e| ("nodeipamconfigs", e.map(Watched::Config)));
        let mut all: Vec<std::pin::Pin<Box<dyn Stream<Item = _> + Send>>> =
            vec![Box::pin(nodes), Box::pin(configs)];
        for (index, output) in self.outputs.iter().enumerate() {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &output.target.namespace);
            // By name: RBAC grants list and watch on these ConfigMaps only.
            let by_name =
                watcher::Config::default().fields(&format!("metadata.name={}", output.target.name));
            let stream = watcher::watcher(api, by_name)
                .default_backoff()
                .map(move |e| ("configmaps", e.map(|e| Watched::Output(index, e))));
            all.push(Box::pin(stream));
        }
        if self.serves_service_cidrs().await {
            let services =
                watcher::watcher(Api::<ServiceCIDR>::all(client), watcher::Config::default())
                    .default_backoff()
                    .map(|e| ("servicecidrs", e.map(Watched::Service)));
            all.push(Box::pin(services));
        }
        futures::stream::select_all(all)
    }

    /// Older clusters have no ServiceCIDR API; the `--service-cidr` flag covers them.
    async fn serves_service_cidrs(&self) -> bool {
        let api: Api<ServiceCIDR> = Api::all(self.ctx.client.clone());
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 404 => false,
            // Unknown (API briefly away): watch it; the watcher retries.
            Err(_) => true,
        }
    }

    async fn on_event(
        &mut self,
        resource: &'static str,
        event: Watched,
        init_done: &mut HashSet<&'static str>,
        relist: &mut HashMap<&'static str, HashSet<String>>,
        needed: usize,
    ) {
        match event {
            Watched::Node(Event::Init)
            | Watched::Config(Event::Init)
            | Watched::Service(Event::Init) => {
                relist.insert(resource, HashSet::new());
            }
            Watched::Node(Event::Apply(n)) => self.on_node(n),
            Watched::Node(Event::InitApply(n)) => {
                relist.entry(resource).or_default().insert(n.name_any());
                self.on_node(n);
            }
            Watched::Node(Event::Delete(n)) => self.on_node_gone(&n.name_any(), n.uid().as_deref()),
            Watched::Config(Event::Apply(c)) => self.on_config(c),
            Watched::Config(Event::InitApply(c)) => {
                relist.entry(resource).or_default().insert(c.name_any());
                self.on_config(c);
            }
            Watched::Config(Event::Delete(c)) => self.on_config_gone(&c.name_any()),
            Watched::Service(Event::Apply(s)) => self.on_service(s),
            Watched::Service(Event::InitApply(s)) => {
                relist.entry(resource).or_default().insert(s.name_any());
                self.on_service(s);
            }
            Watched::Service(Event::Delete(s)) => self.on_service_gone(&s.name_any()),
            Watched::Output(i, Event::Init) => {
                if let Some(o) = self.outputs.get_mut(i) {
                    o.listed = false;
                }
            }
            Watched::Output(i, Event::Apply(cm) | Event::InitApply(cm)) => {
                self.on_output(i, Some(&cm.data.unwrap_or_default()));
            }
            Watched::Output(i, Event::Delete(_)) => self.on_output(i, None),
            Watched::Output(i, Event::InitDone) => {
                if self.outputs.get(i).is_some_and(|o| !o.listed) {
                    self.on_output(i, None);
                }
                init_done.insert(OUTPUT_WATCHES[i.min(1)]);
                if !self.synced && init_done.len() >= needed {
                    self.on_synced();
                }
            }
            Watched::Node(Event::InitDone)
            | Watched::Config(Event::InitDone)
            | Watched::Service(Event::InitDone) => {
                let seen = relist.remove(resource).unwrap_or_default();
                self.on_relisted(resource, &seen).await;
                init_done.insert(resource);
                if !self.synced && init_done.len() >= needed {
                    self.on_synced();
                }
            }
        }
    }

    /// Everything is read: only now may anything be allocated.
    fn on_synced(&mut self) {
        self.synced = true;
        info!(
            nodes = self.ipam.node_count(),
            configs = self.configs.len(),
            pending = self.pending.len(),
            "allocation state rebuilt from the API"
        );
        self.unmanaged_dirty = true;
        self.dirty.extend(self.configs.keys().cloned());
        self.retry_pending();
        self.flush_status();
    }

    /// After a (re)list, what we know but the list lacks may be gone: nodes are confirmed
    /// with a fresh GET before their blocks are released.
    async fn on_relisted(&mut self, resource: &str, seen: &HashSet<String>) {
        match resource {
            "nodes" => {
                let missing: Vec<String> = self
                    .ipam
                    .node_names()
                    .chain(self.pending.keys().map(String::as_str))
                    .filter(|n| !seen.contains(*n))
                    .map(str::to_string)
                    .collect();
                for name in missing {
                    match node_writer::reread(&self.ctx, &name).await {
                        crate::outcome::NodeNow::Gone => {
                            let uid = self.ipam.node(&name).and_then(|r| r.uid.clone());
                            self.on_node_gone(&name, uid.as_deref());
                        }
                        other => {
                            debug!(node = %name, ?other, "missing from the relist but still there")
                        }
                    }
                }
            }
            "nodeipamconfigs" => {
                let gone: Vec<String> = self
                    .configs
                    .keys()
                    .filter(|n| !seen.contains(*n))
                    .cloned()
                    .collect();
                for name in gone {
                    self.on_config_gone(&name);
                }
            }
            "servicecidrs" => {
                let gone: Vec<String> = self
                    .ipam
                    .service_sources()
                    .filter_map(|s| s.strip_prefix("servicecidr/"))
                    .filter(|n| !seen.contains(*n))
                    .map(str::to_string)
                    .collect();
                for name in gone {
                    self.on_service_gone(&name);
                }
            }
            _ => {}
        }
    }

    // ----- nodes -----

    fn on_node(&mut self, node: IpamNode) {
        let name = node.name_any();
        if self.ctx.options.fault == Some(super::Fault::PanicOnNode(name.clone())) {
            // A bug in the loop itself.
            panic!("injected fault: panic on node {name}");
        }
        let uid = node.uid();
        let cidrs = match node.cidrs() {
            Ok(c) => c,
            Err(message) => {
                // Immutable garbage: nothing we may change; say so once.
                self.pending.remove(&name);
                if self.invalid_reported.insert(name.clone()) {
                    warn!(node = %name, %message, "node has an invalid podCIDR");
                    self.note(Note::node(
                        &name,
                        uid.as_deref(),
                        true,
                        events::INVALID_POD_CIDR,
                        message,
                    ));
                }
                return;
            }
        };
        if !cidrs.is_empty() {
            self.pending.remove(&name);
            let unchanged = self
                .ipam
                .node(&name)
                .is_some_and(|r| r.cidrs == cidrs && r.phase == Phase::Held);
            if unchanged {
                return;
            }
            let adoption = self.ipam.observe_node(&name, uid.as_deref(), &cidrs);
            for (other, ours, theirs) in &adoption.conflicts {
                let message = format!(
                    "podCIDR {ours} of node {name} overlaps podCIDR {theirs} of node {other}; both stay occupied"
                );
                warn!(node = %name, %other, %ours, %theirs, "overlapping podCIDRs");
                self.note(Note::node(
                    &name,
                    uid.as_deref(),
                    true,
                    events::OVERLAPPING_POD_CIDR,
                    message.clone(),
                ));
                self.note(Note::node(
                    other,
                    None,
                    true,
                    events::OVERLAPPING_POD_CIDR,
                    message,
                ));
            }
            if !adoption.unmanaged.is_empty() {
                self.unmanaged_dirty = true;
            }
            self.touch(&cidrs);
            if !adoption.released.is_empty() {
                self.touch(&adoption.released);
                self.retry_pending();
            }
            return;
        }
        let record = self.ipam.node(&name).map(|r| (r.uid.clone(), r.phase));
        match record {
            // Our write is in flight or landed and the watch lags: nothing to do.
            Some((old, _)) if uid.is_none() || old.is_none() || old == uid => return,
            // A new object under an old name: the old one is gone.
            Some((old, _)) => {
                let freed = self.ipam.node_gone(&name, old.as_deref());
                self.freed(&freed);
            }
            None => {}
        }
        let (warned, retry_at) = self
            .pending
            .get(&name)
            .map_or((false, None), |p| (p.warned, p.retry_at));
        self.pending.insert(
            name.clone(),
            PendingNode {
                uid,
                labels: node.labels().clone(),
                warned,
                retry_at,
            },
        );
        if self.synced {
            self.try_allocate(&name);
        }
    }

    fn on_node_gone(&mut self, name: &str, uid: Option<&str>) {
        self.pending.remove(name);
        self.reported.retain(|(n, _)| n != name);
        self.invalid_reported.remove(name);
        let freed = self.ipam.node_gone(name, uid);
        if !freed.is_empty() {
            debug!(node = %name, ?freed, "node gone: blocks released");
            self.freed(&freed);
        }
    }

    fn freed(&mut self, cidrs: &[IpNet]) {
        for c in cidrs {
            if let Some(range) = self.ipam.owner_of(c).and_then(|o| self.range_of(o, c)) {
                self.ctx
                    .metrics
                    .releases
                    .get_or_create(&cidr_label(&range))
                    .inc();
            }
        }
        self.touch(cidrs);
        self.unmanaged_dirty = true;
        if self.synced {
            self.retry_pending();
        }
    }

    fn range_of(&self, config: &str, cidr: &IpNet) -> Option<IpNet> {
        self.ipam.config_range(config, cidr)
    }

    /// Marks the configs whose ranges `cidrs` touch for a status update.
    fn touch(&mut self, cidrs: &[IpNet]) {
        for c in cidrs {
            self.dirty.extend(self.ipam.configs_touching(c));
        }
    }

    fn try_allocate(&mut self, name: &str) {
        let Some(p) = self.pending.get(name) else {
            return;
        };
        if p.retry_at.is_some_and(|at| at > Instant::now()) {
            return;
        }
        let (uid, labels) = (p.uid.clone(), p.labels.clone());
        match self.ipam.allocate(name, uid.as_deref(), &labels) {
            Ok(a) => {
                self.pending.remove(name);
                debug!(node = %name, config = %a.config, cidrs = ?a.cidrs, "allocated");
                for c in &a.cidrs {
                    if let Some(range) = self.range_of(&a.config, c) {
                        let label = cidr_label(&range);
                        self.ctx.metrics.tries.get_or_create(&label).observe(1.0);
                        self.ctx.metrics.allocations.get_or_create(&label).inc();
                    }
                }
                self.touch(&a.cidrs);
                let _ = self.writes.send(WriteJob {
                    node: name.to_string(),
                    uid,
                    labels,
                    config: a.config,
                    cidrs: a.cidrs,
                    ticket: a.ticket,
                    attempt: 0,
                    rejections: 0,
                    was_ambiguous: false,
                });
            }
            Err(crate::ipam::AllocateError::AlreadyHolds) => {
                // The previous record resolves first (its write outcome); then we come back.
            }
            Err(e) => {
                if let Some(p) = self.pending.get_mut(name)
                    && !p.warned
                {
                    p.warned = true;
                    info!(node = %name, reason = %e, "no block available; node stays pending");
                    self.note(Note::node(
                        name,
                        uid.as_deref(),
                        true,
                        events::CIDR_NOT_AVAILABLE,
                        format!("Node {name} has no podCIDR yet: {e}"),
                    ));
                }
            }
        }
    }

    /// Tries every pending node again: capacity may have appeared.
    fn retry_pending(&mut self) {
        let names: Vec<String> = self.pending.keys().cloned().collect();
        for name in names {
            self.try_allocate(&name);
        }
    }

    /// Nodes whose writes we gave up on are tried again, from scratch, once their time comes.
    fn wake_parked(&mut self) {
        if !self.synced {
            return;
        }
        let now = Instant::now();
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.retry_at.is_some_and(|at| at <= now))
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            if let Some(p) = self.pending.get_mut(&name) {
                p.retry_at = None;
            }
            self.try_allocate(&name);
        }
    }

    /// Gauges that follow the state, set after every step so they are never stale.
    fn update_gauges(&self) {
        self.ctx
            .metrics
            .pending_nodes
            .set(i64::try_from(self.pending.len()).unwrap_or(i64::MAX));
    }

    fn on_write_result(&mut self, result: WriteResult) {
        let WriteResult { job, outcome } = result;
        let current = matches!(
            self.ipam.node(&job.node).map(|r| r.phase),
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
                self.ipam.confirm(&job.node, job.ticket, uid.as_deref());
                if self.ipam.node(&job.node).is_none() {
                    // It landed on an object deleted meanwhile.
                    self.freed(&job.cidrs);
                }
                self.touch(&job.cidrs);
            }
            Decision::Adopt { uid, cidrs } => {
                let adoption = self.ipam.observe_node(&job.node, uid.as_deref(), &cidrs);
                self.touch(&cidrs);
                self.freed(&adoption.released);
            }
            Decision::Release => {
                let freed = self.ipam.abandon(&job.node, job.ticket);
                self.freed(&freed);
            }
            Decision::Leak => {
                let leaked = self.leak(&job);
                error!(node = %job.node, ?leaked, "write outcome unknowable: blocks kept occupied until restart");
            }
            Decision::Retry => {
                let ambiguous =
                    job.was_ambiguous || matches!(outcome, WriteOutcome::Ambiguous { .. });
                let rejected = matches!(outcome, WriteOutcome::Rejected { .. });
                let rejections = job.rejections + u32::from(rejected);
                let why = match &outcome {
                    WriteOutcome::Rejected { reason, .. }
                    | WriteOutcome::Ambiguous { reason, .. } => reason.clone(),
                    other => format!("{other:?}"),
                };
                if rejected && rejections >= self.ctx.options.write_attempts.max(1) {
                    self.give_up(job, rejections, ambiguous, &why);
                    return;
                }
                let attempt = job.attempt + 1;
                if attempt == 3 {
                    self.note(Note::node(
                        &job.node,
                        job.uid.as_deref(),
                        true,
                        events::CIDR_ASSIGNMENT_FAILED,
                        format!(
                            "writing podCIDRs {:?} keeps failing: {why}; retrying",
                            job.cidrs
                        ),
                    ));
                }
                warn!(node = %job.node, attempt, ?outcome, "podCIDR write did not land; retrying the same blocks");
                self.ctx.metrics.reconcile_error("node_write");
                let _ = self.writes.send(WriteJob {
                    attempt,
                    rejections,
                    was_ambiguous: ambiguous,
                    ..job
                });
                return;
            }
        }
        // The record is resolved; a newer object of the same name may be waiting.
        if self.pending.contains_key(&job.node) {
            self.try_allocate(&job.node);
        }
    }

    /// The API server refused every write of these blocks (an admission policy on Nodes, a
    /// 403): stop, free the blocks so a Terminating config can drain, and try the node again
    /// from scratch later. Refused writes changed nothing; only if an earlier attempt was
    /// ambiguous might the blocks be on the node, and then they stay occupied.
    fn give_up(&mut self, job: WriteJob, rejections: u32, ambiguous: bool, why: &str) {
        let after = self.ctx.options.retry_rejected_after;
        if ambiguous {
            self.leak(&job);
        } else {
            let freed = self.ipam.abandon(&job.node, job.ticket);
            self.touch(&freed);
            self.unmanaged_dirty = true;
        }
        self.ctx.metrics.assignment_failures.inc();
        self.ctx.metrics.reconcile_error("node_write");
        warn!(node = %job.node, rejections, reason = %why, "podCIDR write refused every time: gave up; the node is tried again later");
        self.note(Note::node(
            &job.node,
            job.uid.as_deref(),
            true,
            events::CIDR_ASSIGNMENT_FAILED,
            format!(
                "gave up writing podCIDRs {:?} after {rejections} refused attempts: {why}; {} and the node is tried again in {}s",
                job.cidrs,
                if ambiguous { "the blocks stay reserved (an earlier attempt may have landed)" } else { "the blocks are released" },
                after.as_secs()
            ),
        ));
        let retry_at = Instant::now() + after;
        self.pending.insert(
            job.node.clone(),
            PendingNode {
                uid: job.uid,
                labels: job.labels,
                warned: true,
                retry_at: Some(retry_at),
            },
        );
        if self.synced {
            self.retry_pending();
        }
    }

    /// Keeps a write's blocks occupied (until the next rebuild) rather than risk a duplicate.
    fn leak(&mut self, job: &WriteJob) -> Vec<IpNet> {
        let leaked = self.ipam.leak(&job.node, job.ticket);
        self.ctx
            .metrics
            .leaked_blocks
            .inc_by(i64::try_from(leaked.len()).unwrap_or(0));
        self.touch(&leaked);
        leaked
    }

    // ----- configs -----

    fn on_config(&mut self, obj: NodeIPAMConfig) {
        let name = obj.name_any();
        let has_finalizer = obj.finalizers().iter().any(|f| f == FINALIZER);
        let deleting = obj.meta().deletion_timestamp.is_some();
        let base = config_input(&obj);
        let previous = self.configs.remove(&name);
        let finalizer_requested = previous
            .as_ref()
            .is_some_and(|p| p.finalizer_requested && !has_finalizer);
        let mut seen = ConfigSeen {
            base,
            uid: obj.uid(),
            generation: obj.meta().generation,
            has_finalizer,
            deleting,
            status: obj.status.clone(),
            finalizer_requested,
        };
        if !has_finalizer && !deleting && !seen.finalizer_requested {
            seen.finalizer_requested = true;
            let _ = self
                .config_jobs
                .send(ConfigJob::AddFinalizer { name: name.clone() });
        }
        // A status that is not the one we wrote was edited by someone else (or predates us):
        // the object, not our memory of the write, is what the next flush compares with.
        if self
            .written
            .get(&name)
            .is_some_and(|w| Some(w) != seen.status.as_ref())
        {
            self.written.remove(&name);
        }
        let before = previous.map(|p| (p.base, p.has_finalizer));
        let unchanged = before.as_ref() == Some(&(seen.base.clone(), seen.has_finalizer));
        self.configs.insert(name.clone(), seen);
        self.dirty.insert(name.clone());
        if unchanged {
            // Only status or metadata moved (our own status write, most often): nothing that
            // allocation or other configs depend on.
            return;
        }
        let input = self.gated(&name);
        self.ipam.upsert_config(input);
        // Overlaps, and so every config's Ready, may change with any config.
        self.dirty.extend(self.configs.keys().cloned());
        self.unmanaged_dirty = true;
        self.network_dirty = true;
        if self.synced {
            self.retry_pending();
        }
    }

    fn on_config_gone(&mut self, name: &str) {
        info!(config = %name, "NodeIPAMConfig gone");
        self.ctx.metrics.forget_config(name);
        self.configs.remove(name);
        self.written.remove(name);
        self.ipam.remove_config(name);
        self.network_dirty = true;
        self.dirty.extend(self.configs.keys().cloned());
        self.unmanaged_dirty = true;
        if self.synced {
            self.retry_pending();
        }
    }

    // ----- Service CIDRs -----

    fn on_service(&mut self, obj: ServiceCIDR) {
        let name = obj.name_any();
        let cidrs: Vec<IpNet> = obj
            .spec
            .as_ref()
            .and_then(|s| s.cidrs.clone())
            .unwrap_or_default()
            .iter()
            .filter_map(|c| c.parse::<IpNet>().ok())
            .collect();
        self.ipam
            .set_service_cidrs(&format!("servicecidr/{name}"), cidrs.clone());
        self.touch(&cidrs);
    }

    fn on_service_gone(&mut self, name: &str) {
        self.ipam
            .set_service_cidrs(&format!("servicecidr/{name}"), Vec::new());
        self.dirty.extend(self.configs.keys().cloned());
        if self.synced {
            self.retry_pending();
        }
    }

    // ----- status -----

    fn flush_status(&mut self) {
        if !self.synced {
            return;
        }
        // Before the flag is cleared below: unmanaged podCIDRs are part of the pod network.
        if !self.dirty.is_empty() || self.unmanaged_dirty {
            self.network_dirty = true;
        }
        if self.unmanaged_dirty {
            self.unmanaged_dirty = false;
            let unmanaged = self.ipam.unmanaged();
            self.ctx
                .metrics
                .unmanaged_pod_cidrs
                .set(i64::try_from(unmanaged.len()).unwrap_or(i64::MAX));
            for (cidr, node) in unmanaged {
                if self.reported.insert((node.clone(), cidr)) {
                    warn!(node = %node, %cidr, "podCIDR lies in no NodeIPAMConfig: unmanaged, left as it is");
                    let uid = self.ipam.node(&node).and_then(|r| r.uid.clone());
                    self.note(Note::node(&node, uid.as_deref(), true, events::UNMANAGED_POD_CIDR, format!("podCIDR {cidr} lies in no NodeIPAMConfig; it is kept and counted as unmanaged")));
                }
            }
        }
        // Whole seconds, as the API serializes a Time: the status we remember must equal the
        // one the watch shows back, or every echo would look like someone else's edit.
        let now = k8s_openapi::jiff::Timestamp::now();
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now));
        for name in std::mem::take(&mut self.dirty) {
            let (Some(seen), Some(facts)) =
                (self.configs.get(&name), self.ipam.config_facts(&name))
            else {
                continue;
            };
            let ranges = [seen.base.ipv4, seen.base.ipv6];
            for ((family, f), range) in [("ipv4", facts.ipv4), ("ipv6", facts.ipv6)]
                .into_iter()
                .zip(ranges)
            {
                if let (Some(f), Some((range, _))) = (f, range)
                    && f.capacity > 0
                {
                    // kcm's usage gauge: the fraction of the range's blocks in use.
                    self.ctx
                        .metrics
                        .usage
                        .get_or_create(&cidr_label(&range))
                        .set(f.allocated as f64 / f.capacity as f64);
                    self.ctx.metrics.range_capacity(&range, f.capacity);
                }
                if let Some(f) = f {
                    let label = ConfigFamily {
                        config: name.clone(),
                        family: family.into(),
                    };
                    self.ctx
                        .metrics
                        .blocks_allocated
                        .get_or_create(&label)
                        .set(i64::try_from(f.allocated).unwrap_or(i64::MAX));
                    self.ctx
                        .metrics
                        .blocks_capacity
                        .get_or_create(&label)
                        .set(i64::try_from(f.capacity).unwrap_or(i64::MAX));
                }
            }
            let previous: &[Condition] = self
                .written
                .get(&name)
                .or(seen.status.as_ref())
                .map_or(&[], |s| s.conditions.as_slice());
            let (status, transitions) = desired_status(&facts, seen.generation, previous, &now);
            self.ctx.metrics.observe_status(&name, &status);
            let unchanged = self.written.get(&name).or(seen.status.as_ref()) == Some(&status);
            let (uid, deleting, has_finalizer) =
                (seen.uid.clone(), seen.deleting, seen.has_finalizer);
            for t in transitions.iter().filter(|t| t.status == "True") {
                match t.type_ {
                    nodeipam_crd::CONDITION_DRAINED => {
                        info!(config = %name, "drained");
                        self.note(Note::config(
                            &name,
                            uid.as_deref(),
                            false,
                            events::DRAINED,
                            t.message.clone(),
                        ));
                    }
                    nodeipam_crd::CONDITION_EXHAUSTED => {
                        self.note(Note::config(
                            &name,
                            uid.as_deref(),
                            true,
                            events::EXHAUSTED,
                            t.message.clone(),
                        ));
                    }
                    _ => {}
                }
            }
            if !unchanged {
                let _ = self.config_jobs.send(ConfigJob::Status {
                    name: name.clone(),
                    status: status.clone(),
                });
                self.written.insert(name.clone(), status);
            }
            // The finalizer goes only when nothing holds or is being given a block.
            if deleting && has_finalizer && facts.nodes == 0 && facts.writing == 0 {
                let _ = self.config_jobs.send(ConfigJob::RemoveFinalizer {
                    name: name.clone(),
                    uid: uid.clone(),
                });
            }
        }
    }

    /// Sends the pod network to the publisher when it changed. Drained configs leave it here,
    /// and only here, so a range leaves consumers' view only after its last node is gone.
    fn publish_network(&mut self) {
        if !self.synced || self.outputs.is_empty() || !std::mem::take(&mut self.network_dirty) {
            return;
        }
        let configs: Vec<ConfigRanges> = self
            .configs
            .iter()
            .filter_map(|(name, seen)| {
                let facts = self.ipam.config_facts(name)?;
                let families = [(seen.base.ipv4, facts.ipv4), (seen.base.ipv6, facts.ipv6)]
                    .into_iter()
                    .filter_map(|(range, f)| {
                        range.map(|(r, _)| {
                            (r, f.map_or(0, |f| f.allocated), f.map_or(0, |f| f.capacity))
                        })
                    })
                    .collect();
                let stopped = facts.deleting || !facts.enabled;
                Some(ConfigRanges {
                    name: name.clone(),
                    families,
                    nodes: facts.nodes,
                    deleting: facts.deleting,
                    enabled: facts.enabled,
                    drained: stopped && facts.nodes == 0 && facts.writing == 0,
                })
            })
            .collect();
        let network = PodNetwork::new(&configs, &self.ipam.unmanaged());
        // What consumers read, not the counts beside it: a new node changes no output.
        let extra = &self.ctx.options.publish.extra_non_masquerade;
        let desired: Vec<OutputContent> = self
            .outputs
            .iter()
            .map(|o| o.kind.desired(&network, extra))
            .collect();
        if self.network_sent.as_ref() != Some(&desired) {
            let _ = self.network_jobs.send(network);
            self.network_sent = Some(desired);
        }
    }

    /// An output's ConfigMap changed (our write, a user's edit, a delete): gate allocation on
    /// what it holds now, and write it again when it is not what we last asked for.
    fn on_output(&mut self, index: usize, data: Option<&BTreeMap<String, String>>) {
        let Some(output) = self.outputs.get_mut(index) else {
            return;
        };
        output.listed |= data.is_some();
        let content = data.map(|d| output.kind.read(d)).unwrap_or_default();
        let drifted = self
            .network_sent
            .as_ref()
            .and_then(|sent| sent.get(index))
            .is_some_and(|sent| *sent != content);
        if drifted {
            info!(configmap = %output.target, "published pod network differs from what was written; writing it again");
            self.network_sent = None;
            self.network_dirty = true;
        }
        if output.seen.as_ref() == Some(&content) {
            return;
        }
        output.seen = Some(content);
        self.regate();
    }

    /// Every config's gate again, after what consumers know changed.
    fn regate(&mut self) {
        let names: Vec<String> = self.configs.keys().cloned().collect();
        for name in names {
            let input = self.gated(&name);
            self.ipam.upsert_config(input);
            self.dirty.insert(name);
        }
        if self.synced {
            self.retry_pending();
        }
    }

    /// The config's input with the gates that hold back allocation: our finalizer must be on
    /// it (so it cannot vanish while nodes hold blocks), and consumers must know its ranges.
    fn gated(&self, name: &str) -> ConfigInput {
        let Some(seen) = self.configs.get(name) else {
            return ConfigInput {
                name: name.to_string(),
                ..ConfigInput::default()
            };
        };
        let mut input = seen.base.clone();
        if !seen.has_finalizer {
            input.gate = Some(format!("waiting for the {FINALIZER} finalizer"));
            return input;
        }
        let ranges: Vec<IpNet> = [input.ipv4, input.ipv6]
            .into_iter()
            .flatten()
            .map(|(r, _)| r)
            .collect();
        let behind: Vec<String> = self
            .outputs
            .iter()
            .filter_map(|o| {
                let cidrs = o.seen.as_ref().map_or(&[][..], |c| c.cidrs.as_slice());
                let missing: Vec<String> = ranges
                    .iter()
                    .filter(|r| !covered(r, cidrs))
                    .map(ToString::to_string)
                    .collect();
                (!missing.is_empty())
                    .then(|| format!("ConfigMap {} includes {}", o.target, missing.join(", ")))
            })
            .collect();
        if !behind.is_empty() {
            input.gate = Some(format!("waiting until {}", behind.join(" and ")));
        }
        input
    }

    fn note(&self, note: Note) {
        let _ = self.notes.send(note);
    }
}

/// A helper task of the session (a writer, the publisher, events) ended: its panic goes on up,
/// so that the process supervisor ends the replica instead of a leader that writes nothing.
fn helper_ended(ended: Result<(), tokio::task::JoinError>) -> Error {
    match ended {
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        _ => Error::WatchEnded {
            resource: "a writer task",
        },
    }
}

/// The consumer outputs publishing is configured with: ip-masq-agent's only beside ours.
fn outputs(options: &publisher::PublishOptions) -> Vec<Output> {
    let Some(pod_network) = &options.pod_network else {
        return Vec::new();
    };
    let mut outputs = vec![Output {
        target: pod_network.clone(),
        kind: OutputKind::PodNetwork,
        seen: None,
        listed: false,
    }];
    if let Some(masq) = &options.ip_masq_agent {
        outputs.push(Output {
            target: masq.clone(),
            kind: OutputKind::IpMasqAgent,
            seen: None,
            listed: false,
        });
    }
    outputs
}

/// The allocation state's view of a config object. An unparsable spec becomes `invalid` with
/// the validation errors, never a panic.
pub fn config_input(obj: &NodeIPAMConfig) -> ConfigInput {
    let spec = &obj.spec;
    let errors = nodeipam_crd::validation::validate_spec(spec);
    let invalid = (!errors.is_empty()).then(|| {
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    });
    let family = |f: &Option<nodeipam_crd::FamilySpec>| {
        f.as_ref().and_then(|f| {
            f.cidr
                .parse::<IpNet>()
                .ok()
                .map(|c| (c, f.per_node_mask_size))
        })
    };
    ConfigInput {
        name: obj.name_any(),
        created: obj
            .meta()
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        ipv4: family(&spec.ipv4),
        ipv6: family(&spec.ipv6),
        selector: spec.node_selector.clone(),
        enabled: spec.allocation == AllocationSwitch::Enabled,
        deleting: obj.meta().deletion_timestamp.is_some(),
        invalid,
        gate: None,
    }
}
