//! The HTTPS side: parsing an AdmissionReview body into a typed request (or a clean 400 /
//! `invalid` answer), the axum routes, and the TLS accept loop with graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMPool};
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::cluster::ClusterReader;
use crate::nodes::NodeCounter;
use crate::review::{self, ClusterView, GROUP, KIND, POOL_KIND, VERSION, invalid_for};
use crate::{AdmissionObserver, Readiness};

/// The admission path, for NodeIPAMConfigs and NodeIPAMPools alike (the request's kind
/// chooses the review).
pub const VALIDATE_PATH: &str = "/validate-nodeipamconfig";

/// The largest review body read. A review of a NodeIPAMConfig or NodeIPAMPool (object and
/// oldObject) is a few KiB; this leaves room for metadata hundreds of times that, and keeps
/// what a flood can make us hold small. A larger body is answered 413 unread, and the API
/// server refuses the write (the webhook fails closed).
pub const BODY_LIMIT: usize = 1024 * 1024;
/// Reviews read and decided at once. Each holds its body (at most [`BODY_LIMIT`]) until it is
/// answered; the others wait before their body is read, at most [`QUEUE_TIMEOUT`].
pub const MAX_REVIEWS: usize = 8;
/// How long a review waits for its turn before it is answered 503.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);
/// A body not read in full by then is answered 408: a client that trickles its body holds a
/// review's turn no longer than this.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections open at once (TLS and HTTP buffers each); more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long in-flight requests get to finish at shutdown.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The answer to one POST, before it becomes HTTP.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// The observer label.
    pub result: &'static str,
}

impl Reply {
    fn bad_request(message: impl Into<String>) -> Reply {
        Reply {
            status: StatusCode::BAD_REQUEST,
            content_type: "text/plain; charset=utf-8",
            body: message.into().into_bytes(),
            result: review::INVALID,
        }
    }

    fn review(response: AdmissionResponse) -> Reply {
        let result = review::result_of(&response);
        match serde_json::to_vec(&response.into_review()) {
            Ok(body) => Reply {
                status: StatusCode::OK,
                content_type: "application/json",
                body,
                result,
            },
            // Never answer 200 with something the API server cannot read as a verdict.
            Err(e) => Reply {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                content_type: "text/plain; charset=utf-8",
                body: format!("cannot serialize the response: {e}").into_bytes(),
                result: review::INVALID,
            },
        }
    }
}

/// Parses `body` and decides it against `view` (an error: the cluster could not be read).
#[cfg(test)]
pub(crate) fn handle(body: &[u8], view: Result<ClusterView, String>) -> Reply {
    match decode(body) {
        Ok(request) => decide(&request, view),
        Err(reply) => *reply,
    }
}

/// Parses `body` as the server does and, when it is a review, decides it against an empty
/// cluster view; `Err` carries the reply's body for a body that is not a review.
pub(crate) fn decode_review(body: &[u8]) -> Result<(), String> {
    match decode(body) {
        Ok(request) => {
            decide(&request, Ok(ClusterView::default()));
            Ok(())
        }
        Err(reply) => Err(String::from_utf8_lossy(&reply.body).into_owned()),
    }
}

/// Whether deciding `request` reads the cluster: deletes, status writes and metadata-only
/// updates do not, so draining is never held up by an API server the webhook cannot read.
fn needs_view(request: &Typed) -> bool {
    match request {
        Typed::Config(r) => review::needs_view(r),
        Typed::Pool(r) => review::pool_needs_view(r),
    }
}

/// Decides `request` against `view` (an error: the cluster could not be read).
fn decide(request: &Typed, view: Result<ClusterView, String>) -> Reply {
    let needs_view = needs_view(request);
    let view = if needs_view {
        view
    } else {
        Ok(ClusterView::default())
    };
    let view = match view {
        Ok(view) => view,
        Err(e) => {
            let mut response = match request {
                Typed::Config(r) => AdmissionResponse::from(r),
                Typed::Pool(r) => AdmissionResponse::from(r),
            }
            .deny(format!(
                "the nodeipam webhook cannot read the cluster to review this ({e}); retry shortly"
            ));
            response.result.code = 503;
            return Reply::review(response);
        }
    };
    if let Typed::Pool(r) = request
        && needs_view
        && view.pools_unlisted
    {
        let mut response = AdmissionResponse::from(r).deny(
            "the API server does not serve NodeIPAMPools to the nodeipam webhook yet (the \
             NodeIPAMPool CRD was just installed?); retry shortly",
        );
        response.result.code = 503;
        return Reply::review(response);
    }
    Reply::review(match request {
        Typed::Config(r) => review::review(r, &view),
        Typed::Pool(r) => review::review_pool(r, &view),
    })
}

/// How many nodes the config `request` asks for can serve, when its review warns about it: a
/// CREATE or spec UPDATE of a valid spec. Counted only as far as the warning needs.
async fn count_nodes(
    request: &AdmissionRequest<NodeIPAMConfig>,
    nodes: &NodeCounter,
) -> Option<usize> {
    if !review::needs_view(request) {
        return None;
    }
    let config = request.object.as_ref()?;
    let enough = review::nodes_worth_counting(config)?;
    nodes
        .count(config.spec.node_selector.as_ref(), enough)
        .await
}

/// A decoded request, by the kind it is about.
pub(crate) enum Typed {
    Config(AdmissionRequest<NodeIPAMConfig>),
    Pool(AdmissionRequest<NodeIPAMPool>),
}

/// The object `o` (the `object` or `oldObject` named `which`) as a `K` of `kind`. Taken, not
/// copied: a review holds one copy of a (possibly large) object at a time.
fn convert<K: DeserializeOwned + kube::Resource>(
    o: Option<DynamicObject>,
    which: &str,
    kind: &str,
) -> Result<Option<K>, String> {
    let Some(o) = o else { return Ok(None) };
    if let Some(t) = &o.types
        && (t.api_version != format!("{GROUP}/{VERSION}") || t.kind != kind)
    {
        return Err(format!(
            "{which} is a {} {}, not a {GROUP}/{VERSION} {kind}",
            t.api_version, t.kind
        ));
    }
    o.try_parse::<K>()
        .map(Some)
        .map_err(|e| format!("{which} is not a valid {kind}: {e}"))
}

/// `dynamic` with its objects as `K`s, or the `invalid` reply that says why they are not.
fn typed<K: DeserializeOwned + kube::Resource>(
    mut dynamic: AdmissionRequest<DynamicObject>,
    kind: &str,
) -> Result<AdmissionRequest<K>, Box<Reply>> {
    let (object, old_object) = (dynamic.object.take(), dynamic.old_object.take());
    let invalid = |m: String| Box::new(Reply::review(invalid_for(&dynamic, m)));
    let object = convert(object, "object", kind).map_err(&invalid)?;
    let old_object = convert(old_object, "oldObject", kind).map_err(&invalid)?;
    Ok(AdmissionRequest {
        types: dynamic.types,
        uid: dynamic.uid,
        kind: dynamic.kind,
        resource: dynamic.resource,
        sub_resource: dynamic.sub_resource,
        request_kind: dynamic.request_kind,
        request_resource: dynamic.request_resource,
        request_sub_resource: dynamic.request_sub_resource,
        name: dynamic.name,
        namespace: dynamic.namespace,
        operation: dynamic.operation,
        user_info: dynamic.user_info,
        object,
        old_object,
        dry_run: dynamic.dry_run,
        options: dynamic.options,
    })
}

/// The typed request in `body`, or the reply for a body that is not one. A request about a
/// NodeIPAMPool is decoded as one; anything else as a NodeIPAMConfig request (whose review
/// refuses a kind it does not know).
pub(crate) fn decode(body: &[u8]) -> Result<Typed, Box<Reply>> {
    let bad = |m: String| Box::new(Reply::bad_request(m));
    let parsed: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
        .map_err(|e| bad(format!("the body is not an AdmissionReview: {e}")))?;
    if parsed.types.kind != "AdmissionReview" || parsed.types.api_version != "admission.k8s.io/v1" {
        return Err(bad(format!(
            "expected an admission.k8s.io/v1 AdmissionReview, got {:?} {:?}",
            parsed.types.api_version, parsed.types.kind
        )));
    }
    let dynamic: AdmissionRequest<DynamicObject> = parsed
        .try_into()
        .map_err(|_| bad("the AdmissionReview has no request".into()))?;
    if dynamic.kind.group == GROUP && dynamic.kind.kind == POOL_KIND {
        typed(dynamic, POOL_KIND).map(Typed::Pool)
    } else {
        typed(dynamic, KIND).map(Typed::Config)
    }
}

/// What the routes share.
#[derive(Clone)]
pub(crate) struct AppState {
    pub cluster: ClusterReader,
    pub nodes: NodeCounter,
    pub readiness: Readiness,
    pub on_admission: Option<AdmissionObserver>,
    /// Turns to read and decide a review ([`MAX_REVIEWS`]).
    pub turns: Arc<Semaphore>,
    /// One body parsed at a time: parsing is quick, and what a hostile body costs while it is
    /// parsed (many times its size) is paid once, not once per review.
    pub parse: Arc<Semaphore>,
}

impl AppState {
    pub fn new(
        cluster: ClusterReader,
        nodes: NodeCounter,
        readiness: Readiness,
        on_admission: Option<AdmissionObserver>,
    ) -> Self {
        AppState {
            cluster,
            nodes,
            readiness,
            on_admission,
            turns: Arc::new(Semaphore::new(MAX_REVIEWS)),
            parse: Arc::new(Semaphore::new(1)),
        }
    }
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route(VALIDATE_PATH, post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        // The review reads its body itself, within its limit, once it has its turn.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// A plain-text answer for a review that was not read.
fn refusal(status: StatusCode, message: String) -> Reply {
    Reply {
        status,
        ..Reply::bad_request(message)
    }
}

/// The body of `request`, read once this review has its turn: within [`BODY_LIMIT`] and
/// [`BODY_READ_TIMEOUT`], or the answer that says why not.
async fn read_body(request: axum::extract::Request) -> Result<Bytes, Box<Reply>> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let too_large = || {
        refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("an AdmissionReview body may have at most {BODY_LIMIT} bytes"),
        )
    };
    if declared.is_some_and(|n| n > BODY_LIMIT) {
        return Err(Box::new(too_large()));
    }
    let read = axum::body::to_bytes(request.into_body(), BODY_LIMIT);
    match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => {
            let e = e.into_inner();
            if is_length_limit(e.as_ref()) {
                Err(Box::new(too_large()))
            } else {
                Err(Box::new(Reply::bad_request(format!(
                    "the body could not be read: {e}"
                ))))
            }
        }
        Err(_) => Err(Box::new(refusal(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body was not sent within {BODY_READ_TIMEOUT:?}"),
        ))),
    }
}

/// Whether a body read failed because the body passed its limit (anywhere in the cause chain).
fn is_length_limit(e: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(e), |e| e.source())
        .any(|e| e.is::<http_body_util::LengthLimitError>())
}

async fn validate(State(state): State<AppState>, request: axum::extract::Request) -> Response {
    let turn = tokio::time::timeout(QUEUE_TIMEOUT, state.turns.clone().acquire_owned()).await;
    let reply = match turn {
        Ok(Ok(_turn)) => review_body(&state, request).await,
        _ => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{MAX_REVIEWS} reviews are in progress; retry shortly"),
        ),
    };
    debug!(status = %reply.status, result = reply.result, "admission review");
    if let Some(observe) = &state.on_admission {
        observe(reply.result);
    }
    (
        reply.status,
        [(header::CONTENT_TYPE, reply.content_type)],
        reply.body,
    )
        .into_response()
}

/// Reads, parses and decides one review.
async fn review_body(state: &AppState, request: axum::extract::Request) -> Reply {
    let body = match read_body(request).await {
        Ok(body) => body,
        Err(reply) => return *reply,
    };
    let decoded = {
        let _parsing = state.parse.acquire().await;
        decode(&body)
    };
    drop(body);
    match decoded {
        Ok(request) => {
            let mut view = if needs_view(&request) {
                state.cluster.view().await
            } else {
                Ok(ClusterView::default())
            };
            // The node count is read per request, not cached; only the warning reads it.
            if let (Ok(view), Typed::Config(r)) = (view.as_mut(), &request) {
                view.matching_nodes = count_nodes(r, &state.nodes).await;
            }
            decide(&request, view)
        }
        Err(reply) => *reply,
    }
}

async fn readyz(State(state): State<AppState>) -> Response {
    let r = &state.readiness;
    if r.is_ready() {
        (StatusCode::OK, "ok").into_response()
    } else {
        let body = format!(
            "not ready: cluster listed={}, certificate loaded={}",
            r.listed(),
            r.certificate_loaded()
        );
        (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    }
}

/// Accepts TLS connections on `listener` until `shutdown` turns true, then lets in-flight
/// requests finish (bounded).
pub(crate) async fn serve_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let graceful = GracefulShutdown::new();
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    info!(?addr, "HTTPS listening");
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            _ = crate::stopped(&mut shutdown) => break,
        };
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(v) => v,
                    Err(e) => {
                        // e.g. out of file descriptors: back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(app.clone());
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let _slot = slot;
                    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HANDSHAKE_TIMEOUT)
                        .serve_connection(TokioIo::new(tls), service);
                    if let Err(e) = watcher.watch(conn).await {
                        debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            _ = crate::stopped(&mut shutdown) => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        warn!("in-flight admission requests did not finish in time");
    }
}

/// The rustls acceptor serving from `resolver`.
pub(crate) fn acceptor(
    resolver: Arc<crate::tls::CertResolver>,
) -> Result<TlsAcceptor, crate::tls::TlsError> {
    Ok(TlsAcceptor::from(Arc::new(crate::tls::server_config(
        resolver,
    )?)))
}

#[cfg(test)]
mod tests;
