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
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::cluster::ClusterReader;
use crate::nodes::NodeCounter;
use crate::review::{self, ClusterView, GROUP, KIND, POOL_KIND, VERSION, invalid_for};
use crate::{AdmissionObserver, Readiness};

/// The admission path, for NodeIPAMConfigs and NodeIPAMPools alike (the request's kind
/// chooses the review).
pub const VALIDATE_PATH: &str = "/validate-nodeipamconfig";

/// An AdmissionReview may carry two objects of up to ~1.5 MiB each.
const BODY_LIMIT: usize = 8 * 1024 * 1024;
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

/// The object of `dynamic` (the `object` or `oldObject` named `which`) as a `K` of `kind`.
fn convert<K: DeserializeOwned + kube::Resource>(
    o: &Option<DynamicObject>,
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
    o.clone()
        .try_parse::<K>()
        .map(Some)
        .map_err(|e| format!("{which} is not a valid {kind}: {e}"))
}

/// `dynamic` with its objects as `K`s, or the `invalid` reply that says why they are not.
fn typed<K: DeserializeOwned + kube::Resource>(
    dynamic: &AdmissionRequest<DynamicObject>,
    kind: &str,
) -> Result<AdmissionRequest<K>, Box<Reply>> {
    let invalid = |m: String| Box::new(Reply::review(invalid_for(dynamic, m)));
    let object = convert(&dynamic.object, "object", kind).map_err(&invalid)?;
    let old_object = convert(&dynamic.old_object, "oldObject", kind).map_err(&invalid)?;
    Ok(AdmissionRequest {
        types: dynamic.types.clone(),
        uid: dynamic.uid.clone(),
        kind: dynamic.kind.clone(),
        resource: dynamic.resource.clone(),
        sub_resource: dynamic.sub_resource.clone(),
        request_kind: dynamic.request_kind.clone(),
        request_resource: dynamic.request_resource.clone(),
        request_sub_resource: dynamic.request_sub_resource.clone(),
        name: dynamic.name.clone(),
        namespace: dynamic.namespace.clone(),
        operation: dynamic.operation.clone(),
        user_info: dynamic.user_info.clone(),
        object,
        old_object,
        dry_run: dynamic.dry_run,
        options: dynamic.options.clone(),
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
        typed(&dynamic, POOL_KIND).map(Typed::Pool)
    } else {
        typed(&dynamic, KIND).map(Typed::Config)
    }
}

/// What the routes share.
#[derive(Clone)]
pub(crate) struct AppState {
    pub cluster: ClusterReader,
    pub nodes: NodeCounter,
    pub readiness: Readiness,
    pub on_admission: Option<AdmissionObserver>,
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route(VALIDATE_PATH, post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

async fn validate(State(state): State<AppState>, body: Bytes) -> Response {
    let reply = match decode(&body) {
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
    info!(?addr, "HTTPS listening");
    loop {
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
