//! The metrics and probe servers. `/metrics` is served over HTTPS to callers the API server
//! vouches for, as kube components and controller-runtime's secure metrics do: the bearer
//! token is checked with a TokenReview, then the caller must be allowed `get` on the
//! non-resource URL `/metrics` (a SubjectAccessReview; the `nodeipam-metrics-reader`
//! ClusterRole grants it). `/healthz` and `/readyz` are plain HTTP on their own address, for
//! the kubelet. With `--metrics-secure=false` metrics are plain HTTP too, unauthenticated.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use nodeipam_webhook::{CertResolver, FilesTls, TlsError};
use tracing::{debug, warn};

use crate::metrics::Metrics;

/// The path and verb a scraper must be allowed.
pub const METRICS_PATH: &str = "/metrics";
pub const METRICS_VERB: &str = "get";

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("--{flag}={addr}: cannot listen: {source}")]
    Bind {
        flag: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "--metrics-bind-address and --health-probe-bind-address are both {0}: with \
             --metrics-secure (HTTPS) the probes need their own plain-HTTP address"
    )]
    SameAddress(SocketAddr),
    #[error("the metrics serving certificate: {0}")]
    Tls(#[from] TlsError),
}

/// A caller as the API server authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub username: String,
    pub uid: Option<String>,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a scrape was refused, as an HTTP status and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No credentials, or the API server did not accept them.
    Unauthenticated(String),
    /// Authenticated, but not allowed `get` on /metrics.
    Forbidden(String),
    /// The API server could not be asked.
    Unavailable(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, msg) = match self {
            Refusal::Unauthenticated(m) => (StatusCode::UNAUTHORIZED, m),
            Refusal::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            Refusal::Unavailable(m) => (StatusCode::INTERNAL_SERVER_ERROR, m),
        };
        (status, [(header::CONTENT_TYPE, "text/plain")], msg + "\n").into_response()
    }
}

/// The bearer token of an `Authorization` header, if it carries one.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The caller a TokenReview's status names, or why not.
pub fn caller_of(review: &TokenReview) -> Result<Caller, Refusal> {
    let status = review.status.clone().unwrap_or_default();
    if status.authenticated != Some(true) {
        let why = status
            .error
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "the token was not accepted".into());
        return Err(Refusal::Unauthenticated(format!("Unauthorized: {why}")));
    }
    let user = status.user.unwrap_or_default();
    Ok(Caller {
        username: user.username.unwrap_or_default(),
        uid: user.uid,
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })
}

/// The SubjectAccessReview asking whether `caller` may `get` /metrics.
pub fn access_review(caller: &Caller) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.username.clone()),
            uid: caller.uid.clone(),
            groups: Some(caller.groups.clone()),
            extra: Some(caller.extra.clone()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(METRICS_PATH.into()),
                verb: Some(METRICS_VERB.into()),
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// The verdict of a SubjectAccessReview.
pub fn verdict(caller: &Caller, review: &SubjectAccessReview) -> Result<(), Refusal> {
    let status = review.status.clone().unwrap_or_default();
    if status.allowed && status.denied != Some(true) {
        return Ok(());
    }
    let reason = status
        .reason
        .filter(|r| !r.is_empty())
        .map_or_else(String::new, |r| format!(": {r}"));
    Err(Refusal::Forbidden(format!(
        "Forbidden: user \"{}\" may not get path \"{METRICS_PATH}\"{reason} (bind it to the \
         nodeipam-metrics-reader ClusterRole)",
        caller.username
    )))
}

/// How long a verdict is reused: a scraper asking every few seconds costs two API calls per
/// interval, not per scrape (kube-apiserver's delegated authentication caches for 10 s too).
/// Failures to ask are not kept.
pub fn verdict_ttl(verdict: &Result<Caller, Refusal>) -> Option<Duration> {
    match verdict {
        Ok(_) => Some(Duration::from_secs(10)),
        Err(Refusal::Unauthenticated(_) | Refusal::Forbidden(_)) => Some(Duration::from_secs(5)),
        Err(Refusal::Unavailable(_)) => None,
    }
}

/// Recent verdicts by token, bounded.
#[derive(Debug, Default)]
pub struct Verdicts {
    by_token: HashMap<String, (Instant, Result<Caller, Refusal>)>,
}

/// More distinct tokens than any set of scrapers uses; past it the cache starts over.
const MAX_VERDICTS: usize = 1024;

impl Verdicts {
    /// The verdict for `token` if it is still fresh at `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<Result<Caller, Refusal>> {
        self.by_token
            .get(token)
            .filter(|(until, _)| now < *until)
            .map(|(_, v)| v.clone())
    }

    pub fn put(&mut self, token: &str, verdict: &Result<Caller, Refusal>, now: Instant) {
        let Some(ttl) = verdict_ttl(verdict) else {
            return;
        };
        if self.by_token.len() >= MAX_VERDICTS {
            self.by_token.retain(|_, (until, _)| now < *until);
            if self.by_token.len() >= MAX_VERDICTS {
                self.by_token.clear();
            }
        }
        self.by_token
            .insert(token.to_string(), (now + ttl, verdict.clone()));
    }
}

/// Checks a request's credentials with the API server.
#[derive(Clone)]
pub struct Gate {
    client: Client,
    verdicts: Arc<Mutex<Verdicts>>,
}

impl Gate {
    pub fn new(client: Client) -> Self {
        Gate {
            client,
            verdicts: Arc::default(),
        }
    }

    pub async fn check(&self, headers: &HeaderMap) -> Result<Caller, Refusal> {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let token = bearer_token(authorization).ok_or_else(|| {
            Refusal::Unauthenticated("Unauthorized: a bearer token is required".into())
        })?;
        if let Some(verdict) = self
            .verdicts
            .lock()
            .ok()
            .and_then(|v| v.get(token, Instant::now()))
        {
            return verdict;
        }
        let verdict = self.ask(token).await;
        if let Ok(mut v) = self.verdicts.lock() {
            v.put(token, &verdict, Instant::now());
        }
        verdict
    }

    /// A TokenReview, then a SubjectAccessReview for the caller it names.
    async fn ask(&self, token: &str) -> Result<Caller, Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                warn!(error = %e, "TokenReview failed");
                Refusal::Unavailable(format!("cannot authenticate: TokenReview failed: {e}"))
            })?;
        let caller = caller_of(&reviewed)?;
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access_review(&caller))
            .await
            .map_err(|e| {
                warn!(error = %e, "SubjectAccessReview failed");
                Refusal::Unavailable(format!("cannot authorize: SubjectAccessReview failed: {e}"))
            })?;
        verdict(&caller, &reviewed)?;
        Ok(caller)
    }
}

#[derive(Clone)]
struct MetricsState {
    metrics: Arc<Metrics>,
    gate: Option<Gate>,
}

async fn serve_metrics(State(s): State<MetricsState>, headers: HeaderMap) -> Response {
    if let Some(gate) = &s.gate {
        match gate.check(&headers).await {
            Ok(caller) => debug!(user = %caller.username, "metrics scrape authorized"),
            Err(refusal) => return refusal.into_response(),
        }
    }
    s.metrics.encode().into_response()
}

/// `/metrics`, behind `gate` when given.
pub fn metrics_router(metrics: Arc<Metrics>, gate: Option<Gate>) -> Router {
    Router::new()
        .route(METRICS_PATH, get(serve_metrics))
        .with_state(MetricsState { metrics, gate })
}

/// Where the metrics certificate comes from.
#[derive(Debug, Clone)]
pub enum MetricsCert {
    /// Generated at start, for these names (DNS names or IPs).
    SelfSigned(Vec<String>),
    /// tls.crt and tls.key in this folder, reloaded when they change.
    Dir(PathBuf),
}

/// A self-signed serving certificate and its key, PEM.
pub fn self_signed(names: &[String]) -> Result<(String, String), TlsError> {
    let certified = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| TlsError::Generate(e.to_string()))?;
    Ok((certified.cert.pem(), certified.signing_key.serialize_pem()))
}

/// The names a generated certificate is issued for: loopback, the bind address if it names
/// one, and the host's name.
pub fn certificate_names(addr: SocketAddr, hostname: Option<&str>) -> Vec<String> {
    let mut names = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !addr.ip().is_unspecified() && !addr.ip().is_loopback() {
        names.push(addr.ip().to_string());
    }
    if let Some(h) = hostname.map(str::trim).filter(|h| !h.is_empty()) {
        names.push(h.to_string());
    }
    names
}

/// The resolver serving the metrics certificate, and the task keeping mounted files current.
pub async fn metrics_tls(
    cert: &MetricsCert,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(Arc<CertResolver>, Option<tokio::task::JoinHandle<()>>), TlsError> {
    let resolver = Arc::new(CertResolver::new());
    match cert {
        MetricsCert::SelfSigned(names) => {
            let (cert, key) = self_signed(names)?;
            resolver.install(nodeipam_webhook::tls::certified_key(
                cert.as_bytes(),
                key.as_bytes(),
            )?);
            Ok((resolver, None))
        }
        MetricsCert::Dir(dir) => {
            let mut files = nodeipam_webhook::tls::files::Files::new(
                FilesTls::new(dir.join("tls.crt"), dir.join("tls.key")),
                resolver.clone(),
            );
            // The first load must work: a server without a certificate answers nothing.
            files.poll().await?;
            Ok((resolver, Some(tokio::spawn(files.run(stop)))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};
    use k8s_openapi::api::authorization::v1::SubjectAccessReviewStatus;

    #[test]
    fn bearer_tokens() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(None), None);
    }

    fn caller() -> Caller {
        Caller {
            username: "system:serviceaccount:monitoring:prometheus".into(),
            uid: Some("u1".into()),
            groups: vec!["system:serviceaccounts".into()],
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn token_reviews() {
        let mut review = TokenReview::default();
        assert!(matches!(
            caller_of(&review),
            Err(Refusal::Unauthenticated(_))
        ));
        review.status = Some(TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo {
                username: Some(caller().username),
                uid: Some("u1".into()),
                groups: Some(caller().groups),
                extra: None,
            }),
            ..TokenReviewStatus::default()
        });
        assert_eq!(caller_of(&review), Ok(caller()));
    }

    #[test]
    fn access_reviews_ask_for_get_on_the_metrics_path() {
        let sar = access_review(&caller());
        let attrs = sar
            .spec
            .non_resource_attributes
            .clone()
            .expect("non-resource");
        assert_eq!(attrs.path.as_deref(), Some("/metrics"));
        assert_eq!(attrs.verb.as_deref(), Some("get"));
        assert!(sar.spec.resource_attributes.is_none());
        assert_eq!(sar.spec.user.as_deref(), Some(caller().username.as_str()));
        let mut reviewed = sar.clone();
        reviewed.status = Some(SubjectAccessReviewStatus {
            allowed: false,
            ..SubjectAccessReviewStatus::default()
        });
        match verdict(&caller(), &reviewed) {
            Err(Refusal::Forbidden(m)) => {
                assert!(
                    m.contains("nodeipam-metrics-reader") && m.contains("prometheus"),
                    "{m}"
                )
            }
            other => panic!("forbidden expected, got {other:?}"),
        }
        reviewed.status = Some(SubjectAccessReviewStatus {
            allowed: true,
            ..SubjectAccessReviewStatus::default()
        });
        assert_eq!(verdict(&caller(), &reviewed), Ok(()));
    }

    #[test]
    fn verdicts_are_reused_for_a_while_and_failures_to_ask_never() {
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        v.put("good", &Ok(caller()), t0);
        v.put("bad", &Err(Refusal::Forbidden("no".into())), t0);
        v.put("down", &Err(Refusal::Unavailable("api".into())), t0);
        assert_eq!(
            v.get("good", t0 + Duration::from_secs(9)),
            Some(Ok(caller()))
        );
        assert_eq!(v.get("good", t0 + Duration::from_secs(10)), None);
        assert!(v.get("bad", t0 + Duration::from_secs(4)).is_some());
        assert_eq!(v.get("bad", t0 + Duration::from_secs(5)), None);
        assert_eq!(v.get("down", t0), None, "an API error is asked again");
        for i in 0..MAX_VERDICTS + 10 {
            v.put(&format!("t{i}"), &Ok(caller()), t0);
        }
        assert!(v.by_token.len() <= MAX_VERDICTS);
    }

    #[test]
    fn generated_certificates_load() {
        let names = certificate_names("0.0.0.0:8085".parse().expect("addr"), Some("node-1"));
        assert!(names.contains(&"node-1".to_string()));
        let (cert, key) = self_signed(&names).expect("generated");
        nodeipam_webhook::tls::certified_key(cert.as_bytes(), key.as_bytes()).expect("loads");
    }
}
