//! HTTPS validating admission for NodeIPAMConfig and NodeIPAMPool: the pure decisions
//! ([`review()`], [`review_pool`]), the cluster reads they decide on, the HTTPS server and its managed or
//! mounted TLS, and [`serve`] for the binary. One path serves both kinds; the request's kind
//! chooses the review.
//!
//! # What it checks
//!
//! On CREATE and on UPDATE that changes the spec of a NodeIPAMConfig, it denies anything the
//! shared validation (`nodeipam_crd::validation`) rejects, changes to immutable fields (with
//! what to do instead), ranges overlapping another NodeIPAMConfig's range or a Service range
//! (`networking.k8s.io/v1` ServiceCIDRs and `--service-cidr`), a range inside a NodeIPAMPool's
//! CIDRs unless the config is that pool's child (controller owner reference and the
//! `nodeipam.io/pool` label), and a child's range outside its pool. It admits, with warnings, a
//! family with fewer than 16 blocks or fewer blocks than there are nodes it can serve (those
//! its nodeSelector matches, or every node), and a range outside the declared pod-network
//! supernets of its family (`WebhookOptions::pod_network_supernets`).
//!
//! For a NodeIPAMPool it denies what the shared pool validation rejects, changes to its
//! immutable fields, and CIDRs overlapping another pool's, a Service range or a NodeIPAMConfig
//! that is not its child (on UPDATE only appended CIDRs are checked); it warns when the CIDRs
//! hold fewer ranges than `ranges.max`.
//!
//! DELETE, CONNECT, status writes and updates that leave the spec alone (finalizers, labels)
//! are always allowed, so a config can always be drained and deleted.
//!
//! # failurePolicy: `Fail`
//!
//! Register the webhook with `failurePolicy: Fail` for CREATE and UPDATE of
//! `nodeipam.io/v1alpha1` `nodeipamconfigs` and `nodeipampools`. Overlap is a cross-object
//! invariant the CRD's CEL rules cannot express, and a config admitted with an overlapping
//! range can hand the same addresses to two nodes; refusing a write while the webhook is
//! unreachable is the cheaper failure. When every replica is down:
//!
//! - creates and spec updates of NodeIPAMConfig and NodeIPAMPool are refused with "failed
//!   calling webhook" (so a pool cannot carve a child either); deletes are not intercepted,
//!   and metadata-only updates (finalizers) are allowed when the webhook is up, so draining is
//!   never blocked by the webhook's verdict;
//! - nodes keep getting allocations from existing configs: the controller does not go through
//!   this webhook;
//! - if a config gets in anyway (the webhook was unregistered, or `Ignore` was chosen), the
//!   reconciler's overlap check is the backstop: it marks the later config `Ready=False` with
//!   reason `Overlap` and allocates nothing from it.
//!
//! The webhook runs in every replica, leader or not, and all replicas serve the same
//! certificate (see [`TlsMode::Managed`]), so any of them can answer. If the NodeIPAMPool CRD
//! is not served when it starts (an image upgraded before its CRDs), it reviews configs
//! without pools and refuses pool requests until the API server serves them.
//!
//! # Permissions
//!
//! list `nodeipamconfigs`, `nodeipampools` and `servicecidrs` (read for each review that can
//! admit a spec, see `cluster`), get/list `nodes` (their
//! metadata, counted per review that warns about exhaustion; no Node cache); in managed TLS
//! mode also get/create/update the Secret in its namespace, and get/update/list/watch the
//! `validatingwebhookconfigurations` (to patch `caBundle`).

mod checks;
mod cluster;
mod nodes;
pub mod review;
mod server;
pub mod tls;

use std::fmt;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ipnet::IpNet;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::info;

pub use checks::{Problem, outside_supernets};
pub use review::{ClusterView, ServiceRange, review, review_pool};
pub use server::VALIDATE_PATH;

/// An AdmissionReview body decoded as the server decodes it and, when it is one, decided
/// against an empty cluster view (the fuzzer's entry point: `nodeipam-fuzz`). `Err`: the 400
/// reply's body.
#[doc(hidden)]
pub fn decode_review(body: &[u8]) -> Result<(), String> {
    server::decode_review(body)
}
pub use tls::files::FilesTls;
pub use tls::managed::{ManagedTls, Rotation};
pub use tls::{CertResolver, TlsError};

use crate::tls::material::Policy;

/// Called once per admission request with its result: `"allowed"`, `"denied"` or `"invalid"`.
pub type AdmissionObserver = Arc<dyn Fn(&'static str) + Send + Sync>;

/// Default Service name the certificate is issued for.
pub const DEFAULT_SERVICE_NAME: &str = "nodeipam-webhook";
/// Default namespace of the Service and the Secret.
pub const DEFAULT_NAMESPACE: &str = "nodeipam-system";
/// Default name of the managed TLS Secret.
pub const DEFAULT_SECRET_NAME: &str = "nodeipam-webhook-tls";
/// Default name of the ValidatingWebhookConfiguration whose `caBundle` is patched.
pub const DEFAULT_WEBHOOK_CONFIG_NAME: &str = "nodeipam-webhook";
/// Default listen port.
pub const DEFAULT_PORT: u16 = 9443;

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum TlsMode {
    /// Generated by the webhook and kept in a Secret shared by all replicas: created if
    /// absent, rotated before expiry, its CA patched into the webhook configuration.
    Managed(ManagedTls),
    /// Mounted files (e.g. from cert-manager), reloaded when they change.
    Files(FilesTls),
}

/// Everything [`serve`] needs besides a client.
#[derive(Clone)]
pub struct WebhookOptions {
    /// Listen address (default `0.0.0.0:9443`).
    pub addr: SocketAddr,
    /// The Service in front of the webhook; names the default DNS names.
    pub service_name: String,
    /// Namespace of the Service and of the managed Secret.
    pub namespace: String,
    /// The managed TLS Secret.
    pub secret_name: String,
    /// The ValidatingWebhookConfiguration whose `caBundle` managed TLS keeps current.
    pub webhook_config_name: String,
    /// Names the certificate covers; empty means `<service>.<namespace>.svc` and
    /// `<service>.<namespace>.svc.cluster.local`. An IP address becomes an IP SAN.
    pub dns_names: Vec<String>,
    pub tls_mode: TlsMode,
    /// Service ranges to keep pod ranges out of, besides the cluster's ServiceCIDR objects.
    pub service_cidrs: Vec<IpNet>,
    /// The pod network the consumers are configured for (flannel's `Network`, ...): a config or
    /// pool CIDR outside those of its family is admitted with a warning.
    pub pod_network_supernets: Vec<IpNet>,
    /// Counts admissions by result, e.g. for metrics.
    pub on_admission: Option<AdmissionObserver>,
}

impl fmt::Debug for WebhookOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookOptions")
            .field("addr", &self.addr)
            .field("service_name", &self.service_name)
            .field("namespace", &self.namespace)
            .field("secret_name", &self.secret_name)
            .field("webhook_config_name", &self.webhook_config_name)
            .field("dns_names", &self.dns_names)
            .field("tls_mode", &self.tls_mode)
            .field("service_cidrs", &self.service_cidrs)
            .field("pod_network_supernets", &self.pod_network_supernets)
            .field("on_admission", &self.on_admission.is_some())
            .finish()
    }
}

impl Default for WebhookOptions {
    fn default() -> Self {
        WebhookOptions {
            addr: SocketAddr::from((Ipv4Addr::UNSPECIFIED, DEFAULT_PORT)),
            service_name: DEFAULT_SERVICE_NAME.into(),
            namespace: DEFAULT_NAMESPACE.into(),
            secret_name: DEFAULT_SECRET_NAME.into(),
            webhook_config_name: DEFAULT_WEBHOOK_CONFIG_NAME.into(),
            dns_names: Vec::new(),
            tls_mode: TlsMode::Managed(ManagedTls::default()),
            service_cidrs: Vec::new(),
            pod_network_supernets: Vec::new(),
            on_admission: None,
        }
    }
}

impl WebhookOptions {
    /// The names the serving certificate covers.
    pub fn certificate_names(&self) -> Vec<String> {
        if !self.dns_names.is_empty() {
            return self.dns_names.clone();
        }
        let base = format!("{}.{}.svc", self.service_name, self.namespace);
        vec![base.clone(), format!("{base}.cluster.local")]
    }

    fn check(&self) -> Result<(), WebhookError> {
        let bad = |m: String| Err(WebhookError::Options(m));
        if let TlsMode::Managed(m) = &self.tls_mode {
            if m.rotate_before >= m.validity {
                return bad(format!(
                    "rotate_before ({:?}) must be shorter than validity ({:?}), or every check \
                     would rotate",
                    m.rotate_before, m.validity
                ));
            }
            if m.rotate_before >= m.ca_validity {
                return bad("rotate_before must be shorter than ca_validity".into());
            }
            if m.check_interval.is_zero() {
                return bad("check_interval must be positive".into());
            }
            for (what, v) in [
                ("namespace", &self.namespace),
                ("secret_name", &self.secret_name),
                ("webhook_config_name", &self.webhook_config_name),
            ] {
                if v.is_empty() {
                    return bad(format!("{what} must not be empty"));
                }
            }
            if self.certificate_names().iter().any(|n| n.is_empty()) {
                return bad("a certificate name is empty".into());
            }
        }
        if let TlsMode::Files(f) = &self.tls_mode
            && f.poll_interval.is_zero()
        {
            return bad("poll_interval must be positive".into());
        }
        Ok(())
    }
}

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("invalid webhook options: {0}")]
    Options(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// Whether this replica can answer admissions: the cluster listed once and a certificate
/// loaded.
#[derive(Clone)]
pub struct Readiness {
    listed: Arc<AtomicBool>,
    resolver: Arc<CertResolver>,
}

impl fmt::Debug for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Readiness")
            .field("listed", &self.listed())
            .field("certificate_loaded", &self.certificate_loaded())
            .finish()
    }
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.listed() && self.certificate_loaded()
    }

    /// The webhook has read the configs, pools and ServiceCIDRs once (it reads them again for
    /// every review that needs them).
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::SeqCst)
    }

    pub fn certificate_loaded(&self) -> bool {
        self.resolver.is_loaded()
    }
}

/// A bound, not yet running webhook: the listener is open (so [`local_addr`](Self::local_addr)
/// is known, e.g. for port 0) and readiness and rotation handles can be taken before
/// [`run`](Self::run).
pub struct Webhook {
    client: kube::Client,
    opts: WebhookOptions,
    listener: TcpListener,
    resolver: Arc<CertResolver>,
    listed: Arc<AtomicBool>,
    rotation: Arc<Rotation>,
}

impl fmt::Debug for Webhook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Webhook")
            .field("opts", &self.opts)
            .field("local_addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl Webhook {
    /// Checks the options and binds the listen address.
    pub async fn bind(client: kube::Client, opts: WebhookOptions) -> Result<Webhook, WebhookError> {
        opts.check()?;
        let listener = TcpListener::bind(opts.addr)
            .await
            .map_err(|source| WebhookError::Bind {
                addr: opts.addr,
                source,
            })?;
        Ok(Webhook {
            client,
            opts,
            listener,
            resolver: Arc::new(CertResolver::new()),
            listed: Arc::new(AtomicBool::new(false)),
            rotation: Arc::new(Rotation::default()),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// A handle for the binary's readiness probe.
    pub fn readiness(&self) -> Readiness {
        Readiness {
            listed: self.listed.clone(),
            resolver: self.resolver.clone(),
        }
    }

    /// A handle to force a certificate rotation (managed TLS only; no effect with files).
    pub fn rotation(&self) -> Arc<Rotation> {
        self.rotation.clone()
    }

    /// The resolver the listener serves from (to inspect the served certificate).
    pub fn resolver(&self) -> Arc<CertResolver> {
        self.resolver.clone()
    }

    /// Serves until `shutdown` completes, then drains in-flight requests and stops every task.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), WebhookError> {
        let Webhook {
            client,
            opts,
            listener,
            resolver,
            listed,
            rotation,
        } = self;
        let acceptor = server::acceptor(resolver.clone())?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();

        match &opts.tls_mode {
            TlsMode::Managed(m) => {
                let policy = Policy {
                    names: opts.certificate_names(),
                    validity: m.validity,
                    ca_validity: m.ca_validity,
                    rotate_before: m.rotate_before,
                };
                let managed = Arc::new(tls::managed::Managed::new(
                    client.clone(),
                    tls::managed::Target {
                        namespace: opts.namespace.clone(),
                        secret_name: opts.secret_name.clone(),
                        webhook_config_name: opts.webhook_config_name.clone(),
                    },
                    policy,
                    m.check_interval,
                    resolver.clone(),
                    rotation,
                ));
                tasks.spawn(managed.run(stop_rx.clone()));
            }
            TlsMode::Files(f) => {
                let files = tls::files::Files::new(f.clone(), resolver.clone());
                tasks.spawn(files.run(stop_rx.clone()));
            }
        }

        let nodes = nodes::NodeCounter::new(client.clone());
        let cluster = cluster::ClusterReader::start(
            client,
            opts.service_cidrs.clone(),
            opts.pod_network_supernets.clone(),
            listed.clone(),
            &mut tasks,
        );
        let state = server::AppState::new(
            cluster,
            nodes,
            Readiness { listed, resolver },
            opts.on_admission.clone(),
        );
        let app = server::router(state);
        let server = tokio::spawn(server::serve_tls(listener, acceptor, app, stop_rx));

        shutdown.await;
        info!("webhook shutting down");
        let _ = stop_tx.send(true);
        let _ = server.await;
        tasks.shutdown().await;
        Ok(())
    }
}

/// Completes when `stop` turns true (or its sender is gone). Returns `()` so `select!` holds
/// no watch guard, which is not `Send`.
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Binds and serves until `shutdown` completes. Use [`Webhook::bind`] to get readiness and
/// rotation handles first.
pub async fn serve(
    client: kube::Client,
    opts: WebhookOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WebhookError> {
    Webhook::bind(client, opts).await?.run(shutdown).await
}

/// Serves `app` over HTTPS on `listener` with the certificate `resolver` holds, until `stop`
/// turns true; the same accept loop as the webhook's, for the controller's secure metrics.
pub async fn serve_https(
    listener: TcpListener,
    resolver: Arc<CertResolver>,
    app: axum::Router,
    stop: watch::Receiver<bool>,
) -> Result<(), TlsError> {
    let acceptor = server::acceptor(resolver)?;
    server::serve_tls(listener, acceptor, app, stop).await;
    Ok(())
}
