//! A fault-injecting HTTP proxy between one API client (a `nodeipam` replica run as a child
//! process, or a test's own `kube::Client`) and the real kube-apiserver, for end-to-end tests
//! of the failures a healthy API server does not produce on demand: a write answered 500 that
//! commits in etcd anyway a moment later (as behind an etcd timeout), a slow API server, and
//! API Priority and Fairness throttling (429 with `Retry-After`).
//!
//! The client speaks plain HTTP/1.1 to `127.0.0.1` with no credentials
//! ([`FaultProxy::kubeconfig`]); the proxy sends each request on to the API server with a
//! `kube::Client` of its own, authenticated as the identity it was started for (so RBAC
//! applies as to that client), and streams the answer back, watches included. [`Rule`]s, added
//! and removed while it runs, pick the requests to answer, delay or throttle; every request
//! is logged with the status its client got ([`FaultProxy::log`]).
//!
//! ```no_run
//! # async fn demo(cp: &nodeipam_testenv::ControlPlane) -> Result<(), nodeipam_testenv::HarnessError> {
//! use std::time::Duration;
//! use nodeipam_testenv::fault_proxy::{Action, FaultProxy, Rule};
//!
//! let proxy = FaultProxy::for_user(cp, "alice", &["team-a"])?;
//! std::fs::write("alice.kubeconfig", proxy.kubeconfig()).unwrap(); // for `--kubeconfig`
//! // The next PATCH of node n1 gets a 500 at once, and reaches the API server 1 s later.
//! let answer = Action::Answer { status: 500, then_land_after: Some(Duration::from_secs(1)) };
//! let rule = proxy.add(Rule::new(Some(http::Method::PATCH), "/api/v1/nodes/n1", answer).times(1));
//! // ... run the client ...
//! assert_eq!(rule.matched(), 1);
//! # Ok(()) }
//! ```
//!
//! Limits: HTTP/1.1 only, no upgrades (exec, attach, port-forward); a request body is read
//! whole before anything else happens to the request; an injected Status is always JSON (an
//! API client that asks for protobuf also accepts JSON, as nodeipam's node lists do). A rule
//! matches a path by substring: `/api/v1/nodes/n1` matches `/api/v1/nodes/n10` too.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use kube::client::Body;
use tokio::task::JoinSet;

use crate::control_plane::ControlPlane;
use crate::error::{HarnessError, Step};
use crate::{kubeconfig, ports};

/// The user name in [`FaultProxy::kubeconfig`]; it carries no credentials.
const KUBECONFIG_USER: &str = "fault-proxy";
/// The message of every Status the proxy answers by itself.
pub const INJECTED_MESSAGE: &str = "injected by the fault proxy";
/// How many requests [`FaultProxy::log`] keeps (the oldest go first).
const LOG_CAPACITY: usize = 10_000;

/// What the proxy does with a request a [`Rule`] matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Pass it through (as with no rule); a rule of this action only counts requests.
    Forward,
    /// Answer the client at once with a `Failure` Status of this HTTP code (an invalid code
    /// becomes 500). With `then_land_after`, send the request (its body as read) to the API
    /// server that much later and drop the answer: a write its client was told failed, which
    /// commits later, as an etcd timeout behind a 500 can. Without, it never reaches the API
    /// server.
    Answer {
        status: u16,
        then_land_after: Option<Duration>,
    },
    /// Pass it through after this delay: a slow API server.
    Delay(Duration),
    /// Answer 429 `TooManyRequests` with `Retry-After: retry_after_secs`, as API Priority and
    /// Fairness does; never sent on.
    Throttle { retry_after_secs: u64 },
}

/// Which requests get an [`Action`]: an optional method, a path substring, optional query and
/// body substrings, and how many requests (the first that match; unlimited by default).
#[derive(Debug, Clone)]
pub struct Rule {
    method: Option<Method>,
    path: String,
    query: Option<String>,
    body: Option<String>,
    times: Option<u64>,
    action: Action,
}

impl Rule {
    /// Requests of `method` (any, if `None`) whose path contains `path`.
    pub fn new(method: Option<Method>, path: impl Into<String>, action: Action) -> Rule {
        Rule {
            method,
            path: path.into(),
            query: None,
            body: None,
            times: None,
            action,
        }
    }

    /// Only requests whose query string contains `contains` (e.g. `watch=true`).
    pub fn query(mut self, contains: impl Into<String>) -> Rule {
        self.query = Some(contains.into());
        self
    }

    /// Only requests whose body contains `contains` (e.g. `podCIDRs`: a podCIDR write, not
    /// another patch of the same Node).
    pub fn body(mut self, contains: impl Into<String>) -> Rule {
        self.body = Some(contains.into());
        self
    }

    /// Only the first `n` requests that match; later ones go on to the next rule.
    pub fn times(mut self, n: u64) -> Rule {
        self.times = Some(n);
        self
    }

    fn matches(&self, method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
            && path.contains(&self.path)
            && self
                .query
                .as_deref()
                .is_none_or(|want| query.is_some_and(|q| q.contains(want)))
            && self.body.as_deref().is_none_or(|want| {
                body.windows(want.len().max(1))
                    .any(|w| w == want.as_bytes())
            })
    }
}

/// A rule added to a [`FaultProxy`]: how many requests it matched, and its removal. Dropping
/// the handle leaves the rule in place.
#[derive(Debug)]
pub struct RuleHandle {
    id: u64,
    matched: Arc<AtomicU64>,
    shared: Weak<Shared>,
}

impl RuleHandle {
    /// How many requests the rule has matched (at most its `times`).
    pub fn matched(&self) -> u64 {
        self.matched.load(Ordering::SeqCst)
    }

    /// Removes the rule; requests that it matched already go on as it decided. False if it was
    /// removed before (or the proxy is gone).
    pub fn remove(&self) -> bool {
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        let mut rules = lock(&shared.rules);
        let before = rules.len();
        rules.retain(|r| r.id != self.id);
        rules.len() != before
    }
}

/// Who answered a request in [`FaultProxy::log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The API server; its client got that answer.
    ApiServer,
    /// The proxy, by a rule ([`Action::Answer`], [`Action::Throttle`]).
    Injected,
    /// The API server, later, for a request its client was answered for by the proxy
    /// ([`Action::Answer`] with `then_land_after`); nobody got this answer.
    Landed,
    /// The proxy, 502, because the API server could not be reached.
    ProxyError,
}

/// One request as the proxy saw it, and the status of its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub method: Method,
    pub path: String,
    pub query: Option<String>,
    pub status: u16,
    pub origin: Origin,
}

/// What the tasks share: the backend client, the rules, the log and the tasks themselves.
struct Shared {
    backend: kube::Client,
    rules: Mutex<Vec<ActiveRule>>,
    next_id: AtomicU64,
    log: Mutex<VecDeque<Exchange>>,
    tasks: Mutex<Tasks>,
}

struct ActiveRule {
    id: u64,
    rule: Rule,
    matched: Arc<AtomicU64>,
}

/// Every task of the proxy (the accept loop, connections, late landings), aborted together.
struct Tasks {
    set: JoinSet<()>,
    stopped: bool,
}

/// The proxy, listening on `127.0.0.1`; it stops (every connection cut, no late landing sent)
/// when dropped.
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl FaultProxy {
    /// A proxy whose requests reach the API server as `user` in `groups` (a fresh client
    /// certificate, so RBAC applies as to that identity). A Tokio runtime must be running.
    pub fn for_user(
        cp: &ControlPlane,
        user: &str,
        groups: &[&str],
    ) -> Result<FaultProxy, HarnessError> {
        let yaml = cp.kubeconfig_for(user, groups)?;
        FaultProxy::start(kubeconfig::config(&yaml)?)
    }

    /// A proxy that sends requests on with a client of `backend`. The client does not retry
    /// (`default_retry` is turned off): what the API server answers, its client gets. A Tokio
    /// runtime must be running.
    pub fn start(mut backend: kube::Config) -> Result<FaultProxy, HarnessError> {
        let step = Step::StartFaultProxy;
        backend.default_retry = false;
        let backend = kubeconfig::client(backend)?;
        let listener = ports::bind_unused()
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(|e| HarnessError::io(step, "listen on 127.0.0.1", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| HarnessError::io(step, "address of the listener", e))?
            .port();
        let shared = Arc::new(Shared {
            backend,
            rules: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            log: Mutex::new(VecDeque::new()),
            tasks: Mutex::new(Tasks {
                set: JoinSet::new(),
                stopped: false,
            }),
        });
        spawn(&shared, accept(listener, Arc::downgrade(&shared)));
        Ok(FaultProxy { port, shared })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Kubeconfig YAML of [`url`](Self::url) and a user without credentials, for a client's
    /// `--kubeconfig`.
    pub fn kubeconfig(&self) -> String {
        kubeconfig::render_without_credentials(&self.url(), KUBECONFIG_USER)
    }

    /// Writes [`kubeconfig`](Self::kubeconfig) to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), HarnessError> {
        std::fs::write(path, self.kubeconfig()).map_err(|e| {
            HarnessError::io(
                Step::WriteKubeconfig,
                format!("write {}", path.display()),
                e,
            )
        })
    }

    /// The client configuration of [`kubeconfig`](Self::kubeconfig), as kube reads it (with
    /// kube's default retries of 429, 503 and 504 on).
    pub fn config(&self) -> Result<kube::Config, HarnessError> {
        kubeconfig::config(&self.kubeconfig())
    }

    /// A client through the proxy, from [`config`](Self::config).
    pub fn client(&self) -> Result<kube::Client, HarnessError> {
        kubeconfig::client(self.config()?)
    }

    /// Adds a rule after the others: a request gets the action of the first rule that matches
    /// it and has requests left.
    pub fn add(&self, rule: Rule) -> RuleHandle {
        let id = self.shared.next_id.fetch_add(1, Ordering::SeqCst);
        let matched = Arc::new(AtomicU64::new(0));
        lock(&self.shared.rules).push(ActiveRule {
            id,
            rule,
            matched: matched.clone(),
        });
        RuleHandle {
            id,
            matched,
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Removes every rule: from now on everything passes through.
    pub fn clear_rules(&self) {
        lock(&self.shared.rules).clear();
    }

    /// The requests seen so far (the last 10,000), oldest first, each logged when its answer's
    /// head was known (a watch as soon as it started).
    pub fn log(&self) -> Vec<Exchange> {
        lock(&self.shared.log).iter().cloned().collect()
    }

    pub fn clear_log(&self) {
        lock(&self.shared.log).clear();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let mut tasks = lock(&self.shared.tasks);
        tasks.stopped = true;
        tasks.set.abort_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `task` as one of the proxy's, unless the proxy has stopped.
fn spawn(shared: &Shared, task: impl Future<Output = ()> + Send + 'static) {
    let mut tasks = lock(&shared.tasks);
    if tasks.stopped {
        return;
    }
    while tasks.set.try_join_next().is_some() {}
    tasks.set.spawn(task);
}

async fn accept(listener: tokio::net::TcpListener, shared: Weak<Shared>) {
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            // e.g. out of file descriptors: back off instead of spinning.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let conn = shared.clone();
        spawn(&shared, async move {
            let service = hyper::service::service_fn(move |req| {
                let shared = conn.clone();
                async move { Ok::<_, Infallible>(handle(shared, req).await) }
            });
            // No header timeout: an idle keep-alive connection stays open, as the API
            // server's does, and the client's pool never races its closing.
            let _ = hyper::server::conn::http1::Builder::new()
                .header_read_timeout(None)
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// A request as it is sent on: its body read whole.
#[derive(Clone)]
struct Outgoing {
    method: Method,
    path_and_query: PathAndQuery,
    headers: HeaderMap,
    body: Bytes,
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().map(str::to_string);
    let log = |status: u16, origin: Origin| {
        let mut log = lock(&shared.log);
        if log.len() == LOG_CAPACITY {
            log.pop_front();
        }
        log.push_back(Exchange {
            method: parts.method.clone(),
            path: path.clone(),
            query: query.clone(),
            status,
            origin,
        });
    };
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(e) => {
            log(400, Origin::ProxyError);
            return status_response(400, &format!("fault proxy: reading the request body: {e}"));
        }
    };
    let outgoing = Outgoing {
        method: parts.method.clone(),
        path_and_query: parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/")),
        headers: end_to_end(&parts.headers),
        body,
    };
    match pick(
        &shared,
        &parts.method,
        &path,
        query.as_deref(),
        &outgoing.body,
    ) {
        Action::Forward => {}
        Action::Delay(delay) => tokio::time::sleep(delay).await,
        Action::Throttle { retry_after_secs } => {
            log(429, Origin::Injected);
            return throttled(retry_after_secs);
        }
        Action::Answer {
            status,
            then_land_after,
        } => {
            let code = StatusCode::from_u16(status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                .as_u16();
            log(code, Origin::Injected);
            if let Some(after) = then_land_after {
                let late = shared.clone();
                let entry = (parts.method.clone(), path.clone(), query.clone());
                spawn(&shared, async move {
                    tokio::time::sleep(after).await;
                    let status = match forward(&late.backend, outgoing).await {
                        // Read the answer out, so the write is known to have been handled.
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let _ = resp.into_body().collect_bytes().await;
                            status
                        }
                        Err(_) => 502,
                    };
                    let mut log = lock(&late.log);
                    if log.len() == LOG_CAPACITY {
                        log.pop_front();
                    }
                    log.push_back(Exchange {
                        method: entry.0,
                        path: entry.1,
                        query: entry.2,
                        status,
                        origin: Origin::Landed,
                    });
                });
            }
            return status_response(code, INJECTED_MESSAGE);
        }
    }
    match forward(&shared.backend, outgoing).await {
        Ok(resp) => {
            log(resp.status().as_u16(), Origin::ApiServer);
            let (mut head, body) = resp.into_parts();
            head.headers = end_to_end(&head.headers);
            Response::from_parts(head, body)
        }
        Err(e) => {
            log(502, Origin::ProxyError);
            status_response(502, &format!("fault proxy: the API server: {e}"))
        }
    }
}

/// The action of the first rule that matches and has requests left, counting the request.
fn pick(shared: &Shared, method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> Action {
    let rules = lock(&shared.rules);
    for active in rules.iter() {
        let matched = active.matched.load(Ordering::SeqCst);
        if active.rule.times.is_some_and(|n| matched >= n)
            || !active.rule.matches(method, path, query, body)
        {
            continue;
        }
        // Under the lock: two requests never both take a rule's last count.
        active.matched.store(matched + 1, Ordering::SeqCst);
        return active.rule.action.clone();
    }
    Action::Forward
}

async fn read_body(mut body: Incoming) -> Result<Bytes, hyper::Error> {
    use hyper::body::Body as _;
    let mut buf = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        if let Ok(data) = frame?.into_data() {
            buf.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(buf))
}

/// Sends the request on; the response body streams from the API server as it comes.
async fn forward(backend: &kube::Client, req: Outgoing) -> Result<Response<Body>, kube::Error> {
    let mut request = Request::new(Body::from(req.body));
    *request.method_mut() = req.method;
    // The client's base URI layer puts the API server's scheme and address in front.
    *request.uri_mut() = Uri::from(req.path_and_query);
    *request.headers_mut() = req.headers;
    backend.send(request).await
}

/// The headers without the hop-by-hop ones (RFC 9110 7.6.1) and `Host`: each side of the
/// proxy has its own connection.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let hop = [
            header::CONNECTION,
            header::HOST,
            header::PROXY_AUTHENTICATE,
            header::PROXY_AUTHORIZATION,
            header::TE,
            header::TRAILER,
            header::TRANSFER_ENCODING,
            header::UPGRADE,
        ]
        .contains(name)
            || name.as_str() == "keep-alive"
            || name.as_str() == "proxy-connection"
            || named.contains(name);
        if !hop {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// The `reason` the API server gives a Status of this code.
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "",
    }
}

/// A `Failure` Status of `code` as the API server writes one.
fn status_json(code: u16, message: &str, retry_after_secs: Option<u64>) -> serde_json::Value {
    let mut status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "code": code,
    });
    let reason = reason(code);
    if !reason.is_empty() {
        status["reason"] = reason.into();
    }
    if let Some(secs) = retry_after_secs {
        status["details"] = serde_json::json!({ "retryAfterSeconds": secs });
    }
    status
}

fn status_response(code: u16, message: &str) -> Response<Body> {
    json_response(code, &status_json(code, message, None))
}

fn throttled(retry_after_secs: u64) -> Response<Body> {
    let mut resp = json_response(
        429,
        &status_json(429, INJECTED_MESSAGE, Some(retry_after_secs)),
    );
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
    resp
}

fn json_response(code: u16, body: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(Body::from(body.to_string().into_bytes()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_matches_method_path_and_query() {
        let rule = Rule::new(Some(Method::GET), "/api/v1/nodes", Action::Forward).query("watch=");
        assert!(rule.matches(&Method::GET, "/api/v1/nodes", Some("watch=true&rv=1"), b""));
        assert!(!rule.matches(&Method::GET, "/api/v1/nodes", Some("limit=500"), b""));
        assert!(!rule.matches(&Method::GET, "/api/v1/nodes", None, b""));
        assert!(!rule.matches(&Method::PATCH, "/api/v1/nodes", Some("watch=true"), b""));
        let any = Rule::new(None, "/nodes/n1", Action::Forward);
        assert!(any.matches(&Method::DELETE, "/api/v1/nodes/n1", None, b""));
        assert!(!any.matches(&Method::DELETE, "/api/v1/nodes/n2", None, b""));
    }

    #[test]
    fn a_rule_with_a_body_matches_only_bodies_that_contain_it() {
        let rule =
            Rule::new(Some(Method::PATCH), "/api/v1/nodes/", Action::Forward).body("podCIDRs");
        let write = br#"[{"op":"add","path":"/spec/podCIDRs","value":["10.0.0.0/24"]}]"#;
        let seal = br#"[{"op":"add","path":"/metadata/annotations/x","value":"y"}]"#;
        assert!(rule.matches(&Method::PATCH, "/api/v1/nodes/n1", None, write));
        assert!(!rule.matches(&Method::PATCH, "/api/v1/nodes/n1", None, seal));
        assert!(!rule.matches(&Method::PATCH, "/api/v1/nodes/n1", None, b""));
        let any = Rule::new(Some(Method::PATCH), "/api/v1/nodes/", Action::Forward);
        assert!(any.matches(&Method::PATCH, "/api/v1/nodes/n1", None, seal));
    }

    #[test]
    fn an_injected_status_reads_as_the_api_servers() {
        let v = status_json(500, INJECTED_MESSAGE, None);
        let status: kube::core::Status = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(status.code, 500);
        assert_eq!(status.reason, "InternalError");
        assert_eq!(status.message, INJECTED_MESSAGE);
        assert!(status.is_failure());
        assert_eq!(v["kind"], "Status");
        let v = status_json(429, INJECTED_MESSAGE, Some(3));
        assert_eq!(v["reason"], "TooManyRequests");
        assert_eq!(v["details"]["retryAfterSeconds"], 3);
        assert!(status_json(418, "x", None).get("reason").is_none());
    }

    #[test]
    fn hop_by_hop_headers_stay_on_their_side() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:1"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-hop"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        h.insert("impersonate-user", HeaderValue::from_static("bob"));
        let out = end_to_end(&h);
        let names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["accept", "impersonate-user"]);
    }
}
