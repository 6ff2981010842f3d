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
    let client = client(&args.client).await?;
    let metrics = Arc::new(Metrics::new());
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("nodeipam-{}", std::process::id()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();

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
        tasks.spawn(async move {
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
    let app = health_router(metrics.clone(), readiness);
    let mut stop = stop_rx.clone();
    tasks.spawn(async move {
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
        tasks.spawn(reconcile::run(ctx, rx));
        tasks.spawn(async move {
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
        tasks.spawn(reconcile::run(ctx, election.leadership()));
        Some(election)
    };

    shutdown_signal().await;
    info!("stopping");
    let _ = stop_tx.send(true);
    // Allocation stops with the tasks (joined, so the session is gone) before the lease is
    // released: the standby, which reads the Lease every second, takes it as soon as it is.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    if let Some(election) = lease {
        match election.release().await {
            Ok(()) => info!("lease released"),
            Err(e) => warn!(error = %e, "releasing the lease failed"),
        }
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
}

fn health_router(metrics: Arc<Metrics>, readiness: Option<Readiness>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(h): State<Health>| async move { h.metrics.encode() }),
        )
        .route("/healthz", get(|| async { "ok" }))
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
        .with_state(Health { metrics, readiness })
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
    fn writes_time_out_within_the_grace_period() {
        assert_eq!(write_timeout(5), Duration::from_millis(4500));
        assert_eq!(write_timeout(2), Duration::from_millis(1500));
        assert_eq!(write_timeout(60), Duration::from_secs(10));
        assert_eq!(write_timeout(0), Duration::from_millis(500));
    }
}
