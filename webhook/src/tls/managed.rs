//! Managed TLS: the CA and serving certificate live in a Secret shared by every replica,
//! created if absent, rotated before expiry, with the CA bundle patched into the
//! ValidatingWebhookConfiguration; the resolver always serves what the Secret holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use time::OffsetDateTime;
use tokio::sync::{Mutex, Notify, watch};
use tracing::{debug, info, warn};

use super::material::{self, Material, Plan, Policy};
use super::{CertResolver, TlsError, certified_key};

/// Lifetimes and timing of managed certificates.
#[derive(Debug, Clone)]
pub struct ManagedTls {
    /// Lifetime of a serving certificate (default 365 days).
    pub validity: Duration,
    /// Reissue when less than this is left (default 30 days); must be less than `validity`.
    pub rotate_before: Duration,
    /// Lifetime of the CA (default 10 years); it is replaced `rotate_before` ahead of expiry.
    pub ca_validity: Duration,
    /// How often the Secret is checked (default 5 minutes): this bounds how long another
    /// replica serves an old certificate after a rotation.
    pub check_interval: Duration,
}

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

impl Default for ManagedTls {
    fn default() -> Self {
        ManagedTls {
            validity: 365 * DAY,
            rotate_before: 30 * DAY,
            ca_validity: 3650 * DAY,
            check_interval: Duration::from_secs(5 * 60),
        }
    }
}

/// How soon a failed pass (API error, webhook configuration missing) is retried.
const RETRY: Duration = Duration::from_secs(5);

/// Asks the managed-TLS loop to issue a new serving certificate now, or just to look again.
#[derive(Debug, Default)]
pub struct Rotation {
    force: AtomicBool,
    wake: Notify,
}

impl Rotation {
    /// Issue a new serving certificate at once (from the same CA), write it to the Secret and
    /// serve it.
    pub fn rotate_now(&self) {
        self.force.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn recheck(&self) {
        self.wake.notify_one();
    }
}

/// Where managed material lives: the Secret and the webhook configuration to patch.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub namespace: String,
    pub secret_name: String,
    pub webhook_config_name: String,
}

/// The managed-TLS state of one replica.
pub(crate) struct Managed {
    pub client: kube::Client,
    pub namespace: String,
    pub secret_name: String,
    pub webhook_config_name: String,
    pub policy: Policy,
    pub check_interval: Duration,
    pub resolver: Arc<CertResolver>,
    pub rotation: Arc<Rotation>,
    /// The serving certificate PEM installed last, so an unchanged Secret is not reloaded.
    served: Mutex<Option<String>>,
    /// The CA bundle of the Secret read last, for the webhook-configuration watch.
    bundle: std::sync::Mutex<Option<String>>,
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> TlsError {
    let what = what.into();
    move |source| TlsError::Kube { what, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

impl Managed {
    pub fn new(
        client: kube::Client,
        target: Target,
        policy: Policy,
        check_interval: Duration,
        resolver: Arc<CertResolver>,
        rotation: Arc<Rotation>,
    ) -> Self {
        Managed {
            client,
            namespace: target.namespace,
            secret_name: target.secret_name,
            webhook_config_name: target.webhook_config_name,
            policy,
            check_interval,
            resolver,
            rotation,
            served: Mutex::new(None),
            bundle: std::sync::Mutex::new(None),
        }
    }

    fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// One pass: read the Secret, create or rotate what needs it (losing gracefully to another
    /// replica that wrote first), patch the CA bundle, then serve the Secret's certificate.
    /// Returns whether the CA bundle reached the webhook configuration.
    pub async fn sync(&self, force: bool) -> Result<bool, TlsError> {
        let material = self.ensure_secret(force).await?;
        if let Ok(mut b) = self.bundle.lock() {
            *b = Some(material.ca_bundle.clone());
        }
        // Patch the bundle before serving: a certificate from a new CA must be trusted first.
        let patched = match self.patch_ca_bundle(&material.ca_bundle).await {
            Ok(found) => found,
            Err(e) => {
                warn!(error = %e, "cannot patch caBundle");
                false
            }
        };
        let mut served = self.served.lock().await;
        if served.as_deref() != Some(material.cert.as_str()) {
            let key = certified_key(material.cert.as_bytes(), material.key.as_bytes())?;
            self.resolver.install(key);
            let not_after = material::cert_not_after(&material.cert).unwrap_or_default();
            info!(secret = %self.secret_name, not_after, "serving certificate loaded");
            *served = Some(material.cert.clone());
        }
        Ok(patched)
    }

    async fn ensure_secret(&self, force: bool) -> Result<Material, TlsError> {
        let api = self.secrets();
        let what = format!("Secret {}/{}", self.namespace, self.secret_name);
        let existing = api
            .get_opt(&self.secret_name)
            .await
            .map_err(kube_err(format!("get {what}")))?;
        let found = existing_material(&existing);
        let now = OffsetDateTime::now_utc();
        let plan = material::plan(found.as_ref(), &self.policy, now, force);
        let reason = match (&plan, found.as_ref()) {
            (Plan::Keep, Some(m)) => return Ok(m.clone()),
            // plan() never keeps nothing; execute() reports it if it ever did.
            (Plan::Keep, None) => String::new(),
            (Plan::IssueCert(r) | Plan::NewCa(r), _) => r.clone(),
        };
        let new = material::execute(&plan, found.as_ref(), &self.policy, now)?;
        info!(%what, %reason, new_ca = matches!(plan, Plan::NewCa(_)), "writing certificate material");
        let data = Some(new.to_secret_data());
        let result = match existing {
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.secret_name.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some(
                            [(
                                "app.kubernetes.io/managed-by".to_string(),
                                "nodeipam-webhook".to_string(),
                            )]
                            .into(),
                        ),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".into()),
                    data,
                    ..Secret::default()
                };
                api.create(&PostParams::default(), &secret).await
            }
            Some(mut secret) => {
                // resourceVersion stays set: a concurrent writer makes this fail with 409.
                secret.data = data;
                secret.string_data = None;
                secret.metadata.managed_fields = None;
                api.replace(&self.secret_name, &PostParams::default(), &secret)
                    .await
            }
        };
        match result {
            Ok(_) => Ok(new),
            // Another replica created or rotated first: everyone serves what it wrote.
            Err(e) if is_status(&e, 409) => {
                debug!(%what, "lost the write to another replica; using its material");
                let theirs = api
                    .get(&self.secret_name)
                    .await
                    .map_err(kube_err(format!("get {what}")))?;
                existing_material(&Some(theirs))
                    .ok_or_else(|| TlsError::Parse(format!("{what} is incomplete")))
            }
            Err(e) => Err(kube_err(format!("write {what}"))(e)),
        }
    }

    /// Sets `caBundle` of every webhook of the configuration; `Ok(false)` when it is absent.
    async fn patch_ca_bundle(&self, bundle: &str) -> Result<bool, TlsError> {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let name = &self.webhook_config_name;
        let what = format!("ValidatingWebhookConfiguration {name}");
        let Some(mut config) = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("get {what}")))?
        else {
            debug!(%what, "not found; caBundle will be patched when it appears");
            return Ok(false);
        };
        let mut changed = false;
        for hook in config.webhooks.iter_mut().flatten() {
            if !bundle_matches(hook.client_config.ca_bundle.as_ref(), bundle) {
                hook.client_config.ca_bundle = Some(ByteString(bundle.as_bytes().to_vec()));
                changed = true;
            }
        }
        if changed {
            config.metadata.managed_fields = None;
            api.replace(name, &PostParams::default(), &config)
                .await
                .map_err(kube_err(format!("update {what}")))?;
            info!(%what, "caBundle updated");
        }
        Ok(true)
    }

    /// Runs until `shutdown` turns true: a pass every `check_interval`, on request, and when
    /// the webhook configuration appears or loses its bundle.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let watch_task = tokio::spawn(self.clone().watch_webhook_config());
        loop {
            let force = self.rotation.force.swap(false, Ordering::SeqCst);
            let delay = match self.sync(force).await {
                Ok(true) => self.check_interval,
                Ok(false) => self.check_interval.min(RETRY * 6),
                Err(e) => {
                    warn!(error = %e, "managed TLS pass failed; retrying");
                    if force {
                        self.rotation.force.store(true, Ordering::SeqCst);
                    }
                    self.check_interval.min(RETRY)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.rotation.wake.notified() => {}
                _ = crate::stopped(&mut shutdown) => break,
            }
        }
        watch_task.abort();
    }

    /// Wakes the loop when the webhook configuration's bundle differs from the Secret's, e.g.
    /// when it is created after this replica started or re-applied without a bundle.
    async fn watch_webhook_config(self: Arc<Self>) {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let config = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.webhook_config_name));
        let mut events = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(vwc) = event else { continue };
            let bundle = self.bundle.lock().ok().and_then(|b| b.clone());
            let Some(bundle) = bundle else { continue };
            let stale = vwc
                .webhooks
                .iter()
                .flatten()
                .any(|h| !bundle_matches(h.client_config.ca_bundle.as_ref(), &bundle));
            if stale {
                self.rotation.recheck();
            }
        }
    }
}

fn bundle_matches(have: Option<&ByteString>, want: &str) -> bool {
    have.is_some_and(|b| b.0 == want.as_bytes())
}

fn existing_material(secret: &Option<Secret>) -> Option<Material> {
    secret
        .as_ref()
        .and_then(|s| s.data.as_ref())
        .and_then(Material::from_secret_data)
}
