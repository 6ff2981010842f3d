//! Wires `nodeipam run`: the client, logging, the metrics and health server, the webhook (every
//! replica), leader election, and the allocation loop (leader only); and a clean stop on
//! SIGTERM that releases the lease.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use nodeipam_webhook::{FilesTls, ManagedTls, Readiness, TlsMode, Webhook, WebhookOptions};
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::cli::{CertMode, ClientArgs, LogFormat, RunArgs};
use crate::metrics::Metrics;
use crate::reconcile::leader::{Election, LeaseOptions};
use crate::reconcile::publisher::{ConfigMapRef, PublishOptions};
use crate::reconcile::{self, Context, Options};

pub fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|e| {
        eprintln!("invalid --log-level {level:?} ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// A client from `--kubeconfig`, or the in-cluster config.
pub async fn client(args: &ClientArgs) -> anyhow::Result<Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig and no in-cluster config")?,
    };
    Client::try_from(config).context("building the Kubernetes client")
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    check_lease_flags(args.lease_duration, args.lease_grace)?;
    if args.inject_fault.is_some() && !cfg!(debug_assertions) {
        anyhow::bail!("--inject-fault is for tests and works only in debug builds");
    }
    check_publish_flags(
        &args.pod_network_configmap,
        args.ip_masq_agent_configmap.as_ref(),
    )?;
    let client = client(&args.client).await?;
    let metrics = Arc::new(Metrics::new());
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("nodeipam-{}", std::process::id()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Tasks::default();
    let failure = Arc::new(std::sync::Mutex::new(None));

    // The webhook serves in every replica, leader or not.
    let readiness = if args.disable_webhook {
        None
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
            on_admission: Some(Arc::new(move |result| observer_metrics.admission(result))),
        };
        let webhook = Webhook::bind(client.clone(), opts)
            .await
            .context("starting the webhook")?;
        let readiness = webhook.readiness();
        let mut stop = stop_rx.clone();
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
        Some(readiness)
    };

    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .with_context(|| format!("binding --metrics-addr {}", args.metrics_addr))?;
    let app = health_router(metrics.clone(), readiness, failure.clone());
    let mut stop = stop_rx.clone();
    tasks.spawn("metrics server", async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        });
        if let Err(e) = served.await {
            error!(error = %e, "metrics server stopped");
        }
    });

    let options = Options {
        service_cidrs: args.service_cidrs.clone(),
        write_concurrency: args.write_concurrency,
        instance: Some(identity.clone()),
        // A write must finish (or count as ambiguous) before a deposed leader's lease can
        // expire, so that no write of ours is still in flight when a new leader lists.
        write_timeout: write_timeout(args.lease_grace),
        takeover_delay: if args.disable_leader_election {
            Duration::ZERO
        } else {
            write_timeout(args.lease_grace)
        },
        qps: args.client.kube_api_qps,
        burst: args.client.kube_api_burst,
        fault: args.inject_fault.clone(),
        publish: PublishOptions {
            pod_network: (!args.pod_network_configmap.is_empty()).then(|| ConfigMapRef {
                namespace: args.namespace.clone(),
                name: args.pod_network_configmap.clone(),
            }),
            ip_masq_agent: args.ip_masq_agent_configmap.clone(),
            extra_non_masquerade: args.extra_non_masquerade_cidrs.clone(),
        },
        ..Options::default()
    };
    let ctx = Arc::new(Context::new(client.clone(), options, metrics.clone()));

    let lease = if args.disable_leader_election {
        warn!("leader election disabled: run exactly one replica");
        let (tx, rx) = reconcile::always_leader();
        tasks.spawn("allocation", reconcile::run(ctx, rx));
        tasks.spawn("leadership", async move {
            // Keep the sender alive for as long as the process runs.
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        None
    } else {
        let election = Election::start(
            client.clone(),
            LeaseOptions {
                namespace: args.namespace.clone(),
                name: args.lease_name.clone(),
                identity: identity.clone(),
                duration: args.lease_duration,
                grace: args.lease_grace,
            },
        )
        .await
        .context("setting up leader election")?;
        info!(lease = %args.lease_name, namespace = %args.namespace, %identity, "leader election started");
        tasks.spawn("allocation", reconcile::run(ctx, election.leadership()));
        // The election's own task ends only by a panic; its signal closing tells us.
        let mut leadership = election.leadership();
        tasks.spawn("leader election", async move {
            while leadership.changed().await.is_ok() {}
        });
        Some(election)
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
    // Allocation stops with the tasks (joined, so the session is gone) before the lease is
    // released: the standby, which reads the Lease every second, takes it as soon as it is.
    tasks.stop().await;
    if let Some(election) = lease {
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

/// ip-masq-agent is kept in step with the published pod network, so it cannot go without it.
pub fn check_publish_flags(
    pod_network: &str,
    ip_masq_agent: Option<&ConfigMapRef>,
) -> anyhow::Result<()> {
    if pod_network.is_empty()
        && let Some(masq) = ip_masq_agent
    {
        anyhow::bail!(
            "--ip-masq-agent-configmap={masq} needs --pod-network-configmap: the ip-masq-agent \
             config is kept in step with the published pod network, which \
             --pod-network-configmap=\"\" turns off"
        );
    }
    Ok(())
}

/// The lease manager panics on these, so they are refused here with a clear message.
pub fn check_lease_flags(duration: u64, grace: u64) -> anyhow::Result<()> {
    if duration == 0 || grace == 0 {
        anyhow::bail!(
            "--lease-duration ({duration}) and --lease-grace ({grace}) must be greater than zero"
        );
    }
    if grace >= duration {
        anyhow::bail!("--lease-grace ({grace}s) must be less than --lease-duration ({duration}s)");
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
}

/// How long a leader's allocation loop may go without a step before liveness fails. The loop
/// steps at least every status interval (200 ms); an await that long is a hang.
pub const STALL: Duration = Duration::from_secs(120);

/// Liveness: fails once a task has ended, or while the leader's allocation loop is stuck.
pub fn liveness(
    failure: Option<&str>,
    leader: bool,
    last_step: i64,
    now: i64,
) -> Result<(), String> {
    if let Some(why) = failure {
        return Err(why.to_string());
    }
    let idle = now.saturating_sub(last_step);
    if leader && idle > i64::try_from(STALL.as_secs()).unwrap_or(i64::MAX) {
        return Err(format!(
            "the allocation loop has made no progress for {idle}s"
        ));
    }
    Ok(())
}

fn health_router(
    metrics: Arc<Metrics>,
    readiness: Option<Readiness>,
    failure: Arc<std::sync::Mutex<Option<String>>>,
) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(h): State<Health>| async move { h.metrics.encode() }),
        )
        .route(
            "/healthz",
            get(|State(h): State<Health>| async move {
                let failure = h.failure.lock().ok().and_then(|f| f.clone());
                let now = k8s_openapi::jiff::Timestamp::now().as_second();
                match liveness(
                    failure.as_deref(),
                    h.metrics.leader.get() == 1,
                    h.metrics.allocation_step.get(),
                    now,
                ) {
                    Ok(()) => (StatusCode::OK, "ok".to_string()),
                    Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                }
            }),
        )
        .route(
            "/readyz",
            get(|State(h): State<Health>| async move {
                match &h.readiness {
                    Some(r) if !r.caches_synced() => {
                        (StatusCode::SERVICE_UNAVAILABLE, "webhook caches not synced")
                    }
                    Some(r) if !r.certificate_loaded() => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "webhook certificate not loaded",
                    ),
                    _ => (StatusCode::OK, "ok"),
                }
            }),
        )
        .with_state(Health {
            metrics,
            readiness,
            failure,
        })
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
    fn lease_flags_are_checked_not_panicked_on() {
        assert!(check_lease_flags(15, 5).is_ok());
        let e = check_lease_flags(5, 5)
            .expect_err("grace must be below duration")
            .to_string();
        assert!(
            e.contains("--lease-grace") && e.contains("--lease-duration"),
            "{e}"
        );
        assert!(check_lease_flags(0, 1).is_err());
        assert!(check_lease_flags(10, 0).is_err());
    }

    #[test]
    fn liveness_fails_on_an_ended_task_or_a_stuck_leader() {
        assert!(liveness(None, true, 1000, 1010).is_ok());
        assert!(
            liveness(None, false, 0, 100_000).is_ok(),
            "a standby does not allocate"
        );
        let e = liveness(None, true, 1000, 1000 + 121).expect_err("stuck");
        assert!(e.contains("121s"), "{e}");
        let e = liveness(Some("the webhook task ended"), false, 0, 0).expect_err("ended");
        assert_eq!(e, "the webhook task ended");
    }

    #[test]
    fn ip_masq_agent_needs_the_pod_network_configmap() {
        let masq: ConfigMapRef = "kube-system/ip-masq-agent".parse().expect("ref");
        let e = check_publish_flags("", Some(&masq)).expect_err("refused");
        let e = e.to_string();
        assert!(
            e.contains("--ip-masq-agent-configmap") && e.contains("--pod-network-configmap"),
            "{e}"
        );
        assert!(check_publish_flags("nodeipam-pod-network", Some(&masq)).is_ok());
        assert!(check_publish_flags("", None).is_ok());
    }

    #[test]
    fn writes_time_out_within_the_grace_period() {
        assert_eq!(write_timeout(5), Duration::from_millis(4500));
        assert_eq!(write_timeout(2), Duration::from_millis(1500));
        assert_eq!(write_timeout(60), Duration::from_secs(10));
        assert_eq!(write_timeout(0), Duration::from_millis(500));
    }
}
