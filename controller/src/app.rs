//! Wires `nodeipam run`: the client, logging, the metrics and health server, the webhook (every
//! replica), leader election, and the allocation loop (leader only); and a clean stop on
//! SIGTERM that releases the lease.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::Client;
use nodeipam_webhook::{FilesTls, ManagedTls, Readiness, TlsMode, Webhook, WebhookOptions};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::alloc::lease;
use crate::alloc::outputs::OutputRef;
use crate::cli::{CertMode, ClientArgs, RunArgs};
use crate::health::{self, Inputs};
use crate::metrics::Metrics;
use crate::metrics_server::{self, Gate, MetricsCert, ServeError};
use crate::ratelimit::{Charge, RateLimiter};
use crate::reconcile::handover::{self, LeaseRef};
use crate::reconcile::leader::{Election, LeaseOptions, Tuning};
use crate::reconcile::publisher::{ConfigMapRef, PublishOptions};
use crate::reconcile::{self, Context, Fault, Options};
use crate::startup;

/// How long start-up waits for flannel's ConfigMap before going on without it.
const STARTUP_READ: Duration = Duration::from_secs(5);

/// A rate-limited client from the flags (see [`crate::client`]).
pub async fn client(args: &ClientArgs) -> anyhow::Result<Client> {
    crate::client::client(args).await
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    for (old, new) in args.deprecated() {
        warn!("{old} is deprecated and will be removed: use {new}");
    }
    let timing = args.lease_timing()?;
    if args.inject_fault.is_some() && !cfg!(debug_assertions) {
        anyhow::bail!("--inject-fault is for tests and works only in debug builds");
    }
    let typed = args.typed_outputs()?;
    check_publish_flags(
        &args.pod_network_configmap,
        args.ip_masq_agent_configmap.as_ref(),
        &typed,
    )?;
    let (metrics_addr, probe_addr, secure) = args.listeners();
    check_listeners(metrics_addr, probe_addr, secure)?;
    // Each part gets its own client and so its own rate limiter, as client-go gives kcm's
    // leader election its own: a backlog of node writes must not delay a lease renewal, nor
    // the checks of a scrape.
    let config = crate::client::config(&args.client).await?;
    let writes = Some(write_timeout(timing.grace));
    let metrics = Arc::new(Metrics::new());
    let api = &metrics.api;
    // The allocation loop's budget: its client's reads and every write it sends, each write
    // charged before its timeout starts (reconcile::Context::write).
    let budget = crate::client::limiter(&args.client);
    let client = crate::client::build_with_deadline(
        config.clone(),
        (budget.clone(), Charge::Reads),
        writes,
        api,
    )?;
    let own = || (crate::client::limiter(&args.client), Charge::All);
    let election_client = crate::client::build_with_deadline(
        config.clone(),
        own(),
        Some(crate::reconcile::handover::REQUEST_TIMEOUT),
        api,
    )?;
    // Reviews read on a budget of their own: a flood of them never delays an allocation.
    let webhook_budget = Arc::new(RateLimiter::new(
        args.webhook_kube_api_qps,
        args.webhook_kube_api_burst,
    ));
    let webhook_client = crate::client::build_with_deadline(
        config.clone(),
        (webhook_budget, Charge::All),
        writes,
        api,
    )?;
    let server_url = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    // The start-up checks' reads and events (one per config outside the pod network): on a
    // budget of their own, as the allocation loop's client does not charge its writes.
    let check_client = crate::client::build_with_deadline(config.clone(), own(), writes, api)?;
    let auth_client = crate::client::build_with_deadline(config, own(), writes, api)?;
    tokio::time::timeout(STARTUP_READ, startup::probe_api_server(&client, &server_url))
        .await
        .unwrap_or_else(|_| {
            warn!("the Kubernetes API server at {server_url} did not answer within {STARTUP_READ:?}; retrying")
        });
    let identity = identity(args.identity.as_deref());
    // flannel's Network is the pod network too, declared or not: the webhook warns about a
    // range outside it at admission, and the start-up check about one already there.
    let flannel = tokio::time::timeout(STARTUP_READ, startup::read_flannel(&client))
        .await
        .unwrap_or_default();
    let supernets = startup::supernets(&args.pod_network_supernets, &flannel);
    let took = crate::reconcile::leader::TookCell::default();
    let session = crate::reconcile::leader::SessionCell::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Tasks::default();
    let failure = Arc::new(std::sync::Mutex::new(None));
    let fault = args.inject_fault.clone();
    if let Some(Fault::ClockOffset(secs)) = fault {
        warn!(secs, "fault injected: this process's wall clock reads off");
        crate::reconcile::lease_lock::offset_wall_clock(secs);
    }

    // The webhook serves in every replica, leader or not.
    let (readiness, webhook_progress) = if args.disable_webhook {
        (None, None)
    } else {
        let observer_metrics = metrics.clone();
        let opts = WebhookOptions {
            addr: args.webhook_addr,
            service_name: args.webhook_service.clone(),
            namespace: args.namespace.clone(),
            secret_name: args.webhook_secret.clone(),
            webhook_config_name: args.webhook_config.clone(),
            dns_names: args.webhook_dns_names.clone(),
            tls_mode: match args.cert_mode {
                CertMode::Managed => TlsMode::Managed(ManagedTls::default()),
                CertMode::Files => TlsMode::Files(FilesTls {
                    cert: args.cert_dir.join("tls.crt"),
                    key: args.cert_dir.join("tls.key"),
                    poll_interval: Duration::from_secs(10),
                }),
            },
            service_cidrs: args.service_cidrs.clone(),
            pod_network_supernets: supernets.clone(),
            on_admission: Some(Arc::new(move |result| observer_metrics.admission(result))),
        };
        let webhook = Webhook::bind(webhook_client, opts)
            .await
            .context("starting the webhook")?;
        let readiness = webhook.readiness();
        let resolver = webhook.resolver();
        let addr = webhook.local_addr().unwrap_or(args.webhook_addr);
        let mut stop = stop_rx.clone();
        if fault == Some(Fault::StallWebhook) {
            // The port stays bound with a certificate loaded, and nothing accepts on it.
            let (cert, key) = metrics_server::self_signed(&["localhost".into()])?;
            resolver.install(nodeipam_webhook::tls::certified_key(
                cert.as_bytes(),
                key.as_bytes(),
            )?);
            warn!("fault injected: the webhook server accepts nothing");
            tasks.spawn("webhook", async move {
                let _held = webhook;
                std::future::pending::<()>().await;
            });
        } else {
            tasks.spawn("webhook", async move {
                if let Err(e) = webhook
                    .run(async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
                {
                    error!(error = %e, "webhook stopped");
                }
            });
        }
        let progress = health::mark();
        let check = health::webhook_self_check(addr, resolver, progress.clone(), stop_rx.clone());
        let (ready, gauge) = (readiness.clone(), metrics.webhook_serving.clone());
        let serving = health::report_webhook_serving(
            move || ready.listed() && ready.certificate_loaded(),
            progress.clone(),
            move |serving| {
                gauge.set(i64::from(serving));
            },
            stop_rx.clone(),
        );
        tasks.spawn("webhook self-check", async move {
            tokio::join!(check, serving);
        });
        (Some(readiness), Some(progress))
    };

    // The probes and metrics serve before the election starts, so that a bad address or
    // certificate stops the process before it could take the lease.
    let election_progress = args.leader_elect().then(|| {
        (
            health::mark(),
            health::election_stall(Duration::from_secs(timing.duration)),
        )
    });
    let health = Health {
        metrics: metrics.clone(),
        readiness,
        failure: failure.clone(),
        election: election_progress.clone(),
        webhook: webhook_progress,
    };
    let gate = secure.then(|| Gate::new(auth_client));
    serve_http(
        &mut tasks,
        &stop_rx,
        (metrics_addr, probe_addr),
        health,
        gate,
        metrics_cert(&args, metrics_addr),
    )
    .await?;
    // Off the start-up path: the warnings are for the operator, not a gate.
    let subject = startup::Subject {
        namespace: args.namespace.clone(),
        lease: args.lease_name.clone(),
        instance: Some(identity.clone()),
    };
    let check_metrics = metrics.clone();
    let service_cidrs = args.service_cidrs.clone();
    tokio::spawn(async move {
        startup::check(
            &check_client,
            &service_cidrs,
            &supernets,
            &subject,
            &check_metrics,
        )
        .await;
    });

    let options = Options {
        service_cidrs: args.service_cidrs.clone(),
        write_concurrency: args.write_concurrency,
        instance: Some(identity.clone()),
        // A write must finish (or count as ambiguous) before a deposed leader's lease can
        // expire, so that no write of ours is still in flight when a new leader lists.
        write_timeout: write_timeout(timing.grace),
        takeover_delay: if args.leader_elect() {
            write_timeout(timing.grace)
        } else {
            Duration::ZERO
        },
        lease: args.leader_elect().then(|| LeaseRef {
            namespace: args.namespace.clone(),
            name: args.lease_name.clone(),
            identity: identity.clone(),
            took: took.clone(),
            session: session.clone(),
            term: Duration::from_secs(timing.duration),
        }),
        fault: fault.clone(),
        publish: PublishOptions {
            pod_network: (!args.pod_network_configmap.is_empty()).then(|| ConfigMapRef {
                namespace: args.namespace.clone(),
                name: args.pod_network_configmap.clone(),
            }),
            ip_masq_agent: args.ip_masq_agent_configmap.clone(),
            extra_non_masquerade: args.extra_non_masquerade_cidrs.clone(),
            typed,
        },
        ..Options::default()
    };
    let ctx = Arc::new(Context::with_limiter(
        client.clone(),
        budget,
        options,
        metrics.clone(),
    ));
    let (settled_tx, mut settled_rx) = watch::channel(None);

    let lease = if let Some((progress, _)) = election_progress {
        let election = Election::start_tuned(
            election_client,
            LeaseOptions {
                namespace: args.namespace.clone(),
                name: args.lease_name.clone(),
                identity: identity.clone(),
                duration: timing.duration,
                grace: timing.grace,
                // As long as the allocation loop waits for its last writes when it stops.
                settle: write_timeout(timing.grace) + Duration::from_secs(1),
                took: took.clone(),
                session: session.clone(),
            },
            Tuning {
                retry: timing.retry,
                progress: Some(progress),
                stall: fault == Some(Fault::StallElection),
            },
        )
        .await
        .context("setting up leader election")?;
        info!(lease = %args.lease_name, namespace = %args.namespace, %identity, "leader election started (the identity is the pod name, or the host name, with a random suffix: no two processes share one)");
        let (leadership, stop) = (election.leadership(), stop_rx.clone());
        tasks.spawn("allocation", async move {
            let settled = reconcile::run_until(ctx, leadership, stop).await;
            settled_tx.send_replace(Some(settled));
        });
        // The election's own task ends only by a panic; its signal closing tells us. Until
        // then the signal is client-go's leader_election_master_status: the lease held.
        let mut leadership = election.leadership();
        let (lease_metrics, lease_name) = (metrics.clone(), args.lease_name.clone());
        tasks.spawn("leader election", async move {
            loop {
                let held = *leadership.borrow_and_update();
                lease_metrics.set_lease_held(&lease_name, held);
                if leadership.changed().await.is_err() {
                    break;
                }
            }
        });
        Some(election)
    } else {
        warn!("leader election disabled: run exactly one replica");
        let (tx, rx) = reconcile::always_leader();
        tasks.spawn("allocation", reconcile::run(ctx, rx));
        tasks.spawn("leadership", async move {
            // Keep the sender alive for as long as the process runs.
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        None
    };

    // Every task lives as long as the process: the first one to end, however, ends it, so a
    // replica never holds the lease while doing nothing. Kubernetes restarts it.
    let failed = tokio::select! {
        () = shutdown_signal() => None,
        why = tasks.first_end() => Some(why),
    };
    if let Some(why) = &failed {
        error!("{why}; stopping");
        if let Ok(mut f) = failure.lock() {
            *f = Some(why.clone());
        }
    }
    info!("stopping");
    let _ = stop_tx.send(true);
    // The allocation loop sends nothing more and waits for what it sent (bounded by the write
    // timeout); then every task stops (joined, so the session is gone) before the lease is
    // released: the standby, which reads the Lease every second, takes it as soon as it is.
    let limit = write_timeout(timing.grace) + Duration::from_secs(2);
    let settled = lease.is_some()
        && tokio::time::timeout(limit, settled_rx.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|s| *s))
            .unwrap_or(false);
    tasks.stop().await;
    if let Some(election) = lease {
        hand_over(&client, &args, &identity, &took, settled).await;
        match election.release().await {
            Ok(()) => info!("lease released"),
            Err(e) => warn!(error = %e, "releasing the lease failed"),
        }
    }
    match failed {
        Some(why) => Err(anyhow::anyhow!(why)),
        None => Ok(()),
    }
}

/// This process's identity in the Lease: `name` (the pod name) or the host name, with a random
/// suffix, as kube-controller-manager makes its own ([`lease::identity`]). Two processes never
/// share one, even with the same pod name (a copied manifest, a pod restarted in place, no
/// `POD_NAME` at all): two replicas that each took the other's renewals for their own would
/// both lead.
pub fn identity(name: Option<&str>) -> String {
    let host = || {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
    };
    let name = name
        .map(str::to_string)
        .filter(|n| !n.is_empty())
        .or_else(host)
        .unwrap_or_else(|| "nodeipam".to_string());
    lease::identity(&name, &suffix())
}

/// The name part of an [`identity`]: the pod (or host) name, without the random suffix.
pub fn holder_name(identity: &str) -> &str {
    lease::holder_name(identity)
}

/// Eight random hex digits (from the kernel's generator; the time and the pid where it has
/// none, still distinct between processes).
fn suffix() -> String {
    use std::io::Read as _;
    let mut bytes = [0u8; 4];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if random.is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        bytes = (nanos ^ std::process::id().rotate_left(16)).to_be_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Tells the next leader, on the Lease, whether it need not wait out our writes.
async fn hand_over(
    client: &Client,
    args: &RunArgs,
    identity: &str,
    took: &crate::reconcile::leader::TookCell,
    settled: bool,
) {
    if !settled {
        info!(
            "not every write was answered (or none was sent as leader): the next leader waits them out"
        );
        return;
    }
    let lease = LeaseRef {
        namespace: args.namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity.to_string(),
        took: took.clone(),
        session: Default::default(),
        term: args.lease_duration(),
    };
    match handover::mark(client, &lease).await {
        Ok(true) => info!("every write answered: the lease tells the next leader it need not wait"),
        Ok(false) => info!("the lease names another holder: nothing to hand over"),
        Err(e) => {
            warn!(error = %e, "marking the hand-over on the lease failed; the next leader waits")
        }
    }
}

/// With HTTPS metrics the probes cannot share their address (the kubelet probes plain HTTP).
pub fn check_listeners(
    metrics: Option<SocketAddr>,
    probes: Option<SocketAddr>,
    secure: bool,
) -> Result<(), ServeError> {
    match (metrics, probes) {
        // Port 0 picks a free port for each: not the same address.
        (Some(m), Some(p)) if m == p && m.port() != 0 && secure => Err(ServeError::SameAddress(m)),
        _ => Ok(()),
    }
}

fn metrics_cert(args: &RunArgs, addr: Option<SocketAddr>) -> MetricsCert {
    match &args.metrics_cert_dir {
        Some(dir) => MetricsCert::Dir(dir.clone()),
        None => {
            let host = std::env::var("HOSTNAME").ok();
            MetricsCert::SelfSigned(metrics_server::certificate_names(
                addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))),
                host.as_deref(),
            ))
        }
    }
}

/// Binds the metrics and probe listeners (one plain listener when they share an address)
/// and serves them as tasks.
async fn serve_http(
    tasks: &mut Tasks,
    stop: &watch::Receiver<bool>,
    (metrics_addr, probe_addr): (Option<SocketAddr>, Option<SocketAddr>),
    health: Health,
    gate: Option<Gate>,
    cert: MetricsCert,
) -> anyhow::Result<()> {
    let metrics = health.metrics.clone();
    // Plain metrics may share the probes' listener (the deprecated --metrics-addr does);
    // HTTPS metrics never do (check_listeners refused that, save for two free ports).
    let shared = gate.is_none() && metrics_addr.is_some() && metrics_addr == probe_addr;
    if let Some(addr) = probe_addr {
        let listener = bind("health-probe-bind-address", addr).await?;
        let mut app = probe_router(health);
        if shared {
            app = app.merge(metrics_server::metrics_router(metrics.clone(), None));
        }
        tasks.spawn("probe server", serve_plain(listener, app, stop.clone()));
    }
    if let Some(addr) = metrics_addr.filter(|_| !shared) {
        let listener = bind("metrics-bind-address", addr).await?;
        let secure = gate.is_some();
        let app = metrics_server::metrics_router(metrics, gate);
        if secure {
            let (resolver, reload) = metrics_server::metrics_tls(&cert, stop.clone())
                .await
                .map_err(|e| match &cert {
                    MetricsCert::Dir(dir) => anyhow::anyhow!(
                        "--metrics-cert-dir={}: {e} (it must hold tls.crt and tls.key)",
                        dir.display()
                    ),
                    MetricsCert::SelfSigned(_) => ServeError::from(e).into(),
                })?;
            if let Some(reload) = reload {
                tasks.spawn("metrics certificate reload", async move {
                    let _ = reload.await;
                });
            }
            let stop = stop.clone();
            tasks.spawn("metrics server", async move {
                if let Err(e) = nodeipam_webhook::serve_https(listener, resolver, app, stop).await {
                    error!(error = %e, "metrics server stopped");
                }
            });
        } else {
            tasks.spawn("metrics server", serve_plain(listener, app, stop.clone()));
        }
    }
    Ok(())
}

async fn bind(flag: &'static str, addr: SocketAddr) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { flag, addr, source })
}

async fn serve_plain(
    listener: tokio::net::TcpListener,
    app: Router,
    mut stop: watch::Receiver<bool>,
) {
    let served = axum::serve(listener, app).with_graceful_shutdown(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    if let Err(e) = served.await {
        error!(error = %e, "HTTP server stopped");
    }
}

/// The process's long-lived tasks, by name.
#[derive(Default)]
struct Tasks {
    set: tokio::task::JoinSet<()>,
    names: std::collections::HashMap<tokio::task::Id, &'static str>,
}

impl Tasks {
    fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// Waits until a task ends, and says which and how.
    async fn first_end(&mut self) -> String {
        let ended = self.set.join_next_with_id().await;
        let name = |id: &tokio::task::Id| self.names.get(id).copied().unwrap_or("unnamed");
        match ended {
            Some(Ok((id, ()))) => format!("the {} task ended", name(&id)),
            Some(Err(e)) if e.is_panic() => {
                let id = e.id();
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<&str>()
                    .map(ToString::to_string)
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                format!("the {} task panicked: {message}", name(&id))
            }
            Some(Err(e)) => format!("the {} task was cancelled", name(&e.id())),
            None => std::future::pending().await,
        }
    }

    async fn stop(mut self) {
        self.set.abort_all();
        while self.set.join_next().await.is_some() {}
    }
}

/// ip-masq-agent and the typed outputs are kept in step with the published pod network, so
/// they cannot go without it.
pub fn check_publish_flags(
    pod_network: &str,
    ip_masq_agent: Option<&ConfigMapRef>,
    typed: &[OutputRef],
) -> anyhow::Result<()> {
    if !pod_network.is_empty() {
        return Ok(());
    }
    if let Some(masq) = ip_masq_agent {
        anyhow::bail!(
            "--ip-masq-agent-configmap={masq} needs --pod-network-configmap: the ip-masq-agent \
             config is kept in step with the published pod network, which \
             --pod-network-configmap=\"\" turns off"
        );
    }
    if let Some(output) = typed.first() {
        anyhow::bail!(
            "{output} needs --pod-network-configmap: it is kept in step with the published pod \
             network, which --pod-network-configmap=\"\" turns off"
        );
    }
    Ok(())
}

/// Shorter than the renewal grace period, at most 10 s.
pub fn write_timeout(grace_secs: u64) -> Duration {
    Duration::from_millis((grace_secs * 1000).saturating_sub(500).clamp(500, 10_000))
}

#[derive(Clone)]
struct Health {
    metrics: Arc<Metrics>,
    readiness: Option<Readiness>,
    failure: Arc<std::sync::Mutex<Option<String>>>,
    /// The election loop's last turn, and how long it may pause.
    election: Option<(Arc<AtomicI64>, Duration)>,
    /// The webhook server's last answer to this replica's check.
    webhook: Option<Arc<AtomicI64>>,
}

impl Health {
    fn inputs(&self) -> Inputs {
        Inputs {
            failure: self.failure.lock().ok().and_then(|f| f.clone()),
            leader: self.metrics.leader.get() == 1,
            allocation_step: self.metrics.allocation_step.get(),
            election: self
                .election
                .as_ref()
                .map(|(turn, limit)| (turn.load(Ordering::Relaxed), *limit)),
            webhook: self.webhook.as_ref().map(|w| w.load(Ordering::Relaxed)),
        }
    }
}

/// `/healthz` (liveness, see [`crate::health`]) and `/readyz` (webhook listed the cluster once and a
/// certificate loaded).
fn probe_router(health: Health) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|State(h): State<Health>| async move {
                match health::liveness(&h.inputs(), health::now()) {
                    Ok(()) => (StatusCode::OK, "ok".to_string()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(h): State<Health>| async move {
                match &h.readiness {
                    Some(r) if !r.listed() => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "webhook has not listed the cluster yet",
                    ),
                    Some(r) if !r.certificate_loaded() => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "webhook certificate not loaded",
                    ),
                    _ => (StatusCode::OK, "ok"),
                }
            }),
        )
        .with_state(health)
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<Infallible>().await;
            }
        }
    };
    tokio::select! {
        () = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_metrics_need_their_own_address() {
        let a: SocketAddr = "127.0.0.1:8085".parse().expect("addr");
        let b: SocketAddr = "127.0.0.1:8086".parse().expect("addr");
        let e = check_listeners(Some(a), Some(a), true)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("--metrics-bind-address") && e.contains("--health-probe-bind-address"),
            "{e}"
        );
        assert!(check_listeners(Some(a), Some(a), false).is_ok());
        assert!(check_listeners(Some(a), Some(b), true).is_ok());
        assert!(check_listeners(None, Some(a), true).is_ok());
        let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        assert!(
            check_listeners(Some(any), Some(any), true).is_ok(),
            "two free ports"
        );
    }

    #[test]
    fn ip_masq_agent_needs_the_pod_network_configmap() {
        let masq: ConfigMapRef = "kube-system/ip-masq-agent".parse().expect("ref");
        let e = check_publish_flags("", Some(&masq), &[]).expect_err("refused");
        let e = e.to_string();
        assert!(
            e.contains("--ip-masq-agent-configmap") && e.contains("--pod-network-configmap"),
            "{e}"
        );
        assert!(check_publish_flags("nodeipam-pod-network", Some(&masq), &[]).is_ok());
        assert!(check_publish_flags("", None, &[]).is_ok());
        use crate::alloc::outputs::OutputKind;
        let group = OutputRef::typed(OutputKind::CiliumCIDRGroup, "cilium.io/v2", Some("pods"));
        let e = check_publish_flags("", None, std::slice::from_ref(&group)).expect_err("refused");
        assert!(
            e.to_string()
                .contains("CiliumCIDRGroup pods needs --pod-network-configmap"),
            "{e}"
        );
        assert!(check_publish_flags("nodeipam-pod-network", None, &[group]).is_ok());
    }

    #[test]
    fn writes_time_out_within_the_grace_period() {
        assert_eq!(write_timeout(5), Duration::from_millis(4500));
        assert_eq!(write_timeout(2), Duration::from_millis(1500));
        assert_eq!(write_timeout(60), Duration::from_secs(10));
        assert_eq!(write_timeout(0), Duration::from_millis(500));
    }
}
