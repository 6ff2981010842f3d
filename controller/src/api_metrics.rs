//! Metrics of the requests the controller sends to the API server: client-go's
//! `rest_client_requests_total` and `rest_client_request_duration_seconds` (same names, labels
//! and buckets, so kcm's dashboards carry over), `nodeipam_api_requests_total` by verb,
//! resource and code as the API server's `apiserver_request_total` labels them, and the tower
//! layer that records them for every request of a kube Client. Labels come from the method,
//! the URL path's resource segments (never names or namespaces) and the status code, so their
//! number stays bounded.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{Method, Request, Response, header};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// client-go's buckets for `rest_client_request_duration_seconds`.
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

/// The `code` of a request that got no response (a connection error, a timeout, or given up
/// by its caller), as client-go spells it.
pub const NO_RESPONSE: &str = "<error>";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestResult {
    pub code: String,
    pub method: String,
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLatency {
    pub verb: String,
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceRequest {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub code: String,
}

type Latency = Family<RequestLatency, Histogram, fn() -> Histogram>;

/// The three families; clones share their series.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    pub requests: Family<RequestResult, Counter>,
    pub duration: Latency,
    pub by_resource: Family<ResourceRequest, Counter>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        ApiMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new(LATENCY_BUCKETS.iter().copied())
            }),
            by_resource: Family::default(),
        }
    }
}

/// What a request's path addresses, as the API server's request info reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The resource's plural name (`nodes`, `leases`, `nodeipamconfigs`).
    pub resource: String,
    /// `status`, `binding` and the like; empty for the object itself.
    pub subresource: String,
    /// One object (by name) rather than a collection.
    pub named: bool,
    /// The legacy `/watch/` path prefix.
    pub watch_path: bool,
}

/// Namespace subresources: `/namespaces/<ns>/status` is the Namespace's status, not a
/// resource called `status` inside it.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// The resource a path under `/api/<version>` or `/apis/<group>/<version>` addresses;
/// `None` for anything else (discovery, `/version`, `/openapi`).
pub fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let rest = match parts.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => rest,
        _ => return None,
    };
    let (watch_path, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        rest => (false, rest),
    };
    let rest = match rest {
        ["namespaces", _ns, inner @ ..]
            if inner
                .first()
                .is_some_and(|r| !NAMESPACE_SUBRESOURCES.contains(r)) =>
        {
            inner
        }
        rest => rest,
    };
    let (resource, named, subresource) = match rest {
        [] => return None,
        [resource] => (resource, false, ""),
        [resource, _name] => (resource, true, ""),
        [resource, _name, sub, ..] => (resource, true, *sub),
    };
    Some(Target {
        resource: (*resource).to_string(),
        subresource: subresource.to_string(),
        named,
        watch_path,
    })
}

/// The verb as `apiserver_request_total` reports it: the method, but `LIST` for a read of a
/// collection, `WATCH` for a watch and `APPLY` for a server-side apply patch.
pub fn verb(method: &Method, query: &str, content_type: &str, target: Option<&Target>) -> String {
    let watching = query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1");
    let verb = match *method {
        Method::GET if watching || target.is_some_and(|t| t.watch_path) => "WATCH",
        Method::GET if target.is_some_and(|t| !t.named) => "LIST",
        Method::PATCH if content_type.starts_with("application/apply-patch") => "APPLY",
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    };
    verb.to_string()
}

/// Records every request through it into [`ApiMetrics`], labelled with `host` (the API
/// server's `host:port`, as client-go's `host` label).
#[derive(Clone, Debug)]
pub struct ApiMetricsLayer {
    metrics: ApiMetrics,
    host: Arc<str>,
}

impl ApiMetricsLayer {
    pub fn new(metrics: ApiMetrics, host: &str) -> Self {
        ApiMetricsLayer {
            metrics,
            host: host.into(),
        }
    }
}

impl<S> tower::Layer<S> for ApiMetricsLayer {
    type Service = Recorded<S>;
    fn layer(&self, inner: S) -> Recorded<S> {
        Recorded {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`ApiMetricsLayer`].
#[derive(Clone, Debug)]
pub struct Recorded<S> {
    inner: S,
    layer: ApiMetricsLayer,
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, B, RB> tower::Service<Request<B>> for Recorded<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Answer<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let mut pending = Pending::new(&self.layer, &req);
        let answer = self.inner.call(req);
        Box::pin(async move {
            // Counted from its first poll, which is when it is sent: a rate limiter outside
            // this layer polls it only once its token came.
            pending.started = Some(Instant::now());
            let result = answer.await;
            pending.finish(result.as_ref().ok().map(|r| r.status().as_u16()));
            result
        })
    }
}

/// A request sent and not yet answered; dropped unanswered (its caller gave up), it counts
/// as [`NO_RESPONSE`]; dropped before it was sent, not at all.
struct Pending {
    layer: ApiMetricsLayer,
    method: String,
    verb: String,
    target: Option<Target>,
    /// When it was sent; `None` until then.
    started: Option<Instant>,
    done: bool,
}

impl Pending {
    fn new<B>(layer: &ApiMetricsLayer, req: &Request<B>) -> Self {
        let target = target(req.uri().path());
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        let query = req.uri().query().unwrap_or_default();
        Pending {
            layer: layer.clone(),
            method: req.method().as_str().to_string(),
            verb: verb(req.method(), query, content_type, target.as_ref()),
            target,
            started: None,
            done: false,
        }
    }

    fn finish(&mut self, status: Option<u16>) {
        self.done = true;
        let m = &self.layer.metrics;
        let host = self.layer.host.to_string();
        let code = status.map_or_else(|| NO_RESPONSE.to_string(), |s| s.to_string());
        m.requests
            .get_or_create(&RequestResult {
                code: code.clone(),
                method: self.method.clone(),
                host: host.clone(),
            })
            .inc();
        m.duration
            .get_or_create(&RequestLatency {
                verb: self.method.clone(),
                host,
            })
            .observe(self.started.map_or(0.0, |t| t.elapsed().as_secs_f64()));
        let (resource, subresource) = self
            .target
            .as_ref()
            .map(|t| (t.resource.clone(), t.subresource.clone()))
            .unwrap_or_default();
        m.by_resource
            .get_or_create(&ResourceRequest {
                verb: self.verb.clone(),
                resource,
                subresource,
                code,
            })
            .inc();
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done && self.started.is_some() {
            self.finish(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(resource: &str, subresource: &str, named: bool) -> Option<Target> {
        Some(Target {
            resource: resource.into(),
            subresource: subresource.into(),
            named,
            watch_path: false,
        })
    }

    #[test]
    fn the_resource_comes_from_the_path_and_never_a_name() {
        assert_eq!(target("/api/v1/nodes"), t("nodes", "", false));
        assert_eq!(target("/api/v1/nodes/node-1"), t("nodes", "", true));
        assert_eq!(
            target("/apis/nodeipam.io/v1alpha1/nodeipamconfigs/a/status"),
            t("nodeipamconfigs", "status", true)
        );
        assert_eq!(
            target("/apis/coordination.k8s.io/v1/namespaces/nodeipam-system/leases/nodeipam"),
            t("leases", "", true)
        );
        assert_eq!(
            target("/api/v1/namespaces/kube-system/configmaps"),
            t("configmaps", "", false)
        );
        // A namespace itself, its status, and the collection of namespaces.
        assert_eq!(target("/api/v1/namespaces/a"), t("namespaces", "", true));
        assert_eq!(
            target("/api/v1/namespaces/a/status"),
            t("namespaces", "status", true)
        );
        assert_eq!(target("/api/v1/namespaces"), t("namespaces", "", false));
        // Deeper paths keep only the subresource's first segment.
        assert_eq!(
            target("/api/v1/namespaces/a/pods/p/proxy/x/y"),
            t("pods", "proxy", true)
        );
        assert_eq!(
            target("/api/v1/watch/nodes"),
            Some(Target {
                watch_path: true,
                ..t("nodes", "", false).expect("target")
            })
        );
        for other in [
            "/version",
            "/api",
            "/api/v1",
            "/apis/nodeipam.io/v1alpha1",
            "/",
            "",
        ] {
            assert_eq!(target(other), None, "{other}");
        }
    }

    #[test]
    fn verbs_as_the_api_server_reports_them() {
        let v = |m: Method, q: &str, ct: &str, path: &str| verb(&m, q, ct, target(path).as_ref());
        assert_eq!(v(Method::GET, "", "", "/api/v1/nodes"), "LIST");
        assert_eq!(v(Method::GET, "", "", "/api/v1/nodes/n"), "GET");
        assert_eq!(
            v(
                Method::GET,
                "watch=true&resourceVersion=5",
                "",
                "/api/v1/nodes"
            ),
            "WATCH"
        );
        assert_eq!(v(Method::GET, "", "", "/api/v1/watch/nodes"), "WATCH");
        assert_eq!(v(Method::GET, "", "", "/version"), "GET");
        let apply = "application/apply-patch+yaml";
        assert_eq!(v(Method::PATCH, "", apply, "/api/v1/nodes/n"), "APPLY");
        let merge = "application/merge-patch+json";
        assert_eq!(v(Method::PATCH, "", merge, "/api/v1/nodes/n"), "PATCH");
        assert_eq!(v(Method::POST, "", "", "/api/v1/nodes"), "POST");
        assert_eq!(v(Method::PUT, "", "", "/api/v1/nodes/n"), "PUT");
        assert_eq!(v(Method::DELETE, "", "", "/api/v1/nodes/n"), "DELETE");
        let odd = Method::from_bytes(b"PURGE").expect("method");
        assert_eq!(v(odd, "", "", "/api/v1/nodes"), "OTHER");
    }

    fn count(m: &ApiMetrics, code: &str, method: &str) -> u64 {
        m.requests
            .get_or_create(&RequestResult {
                code: code.into(),
                method: method.into(),
                host: "api:6443".into(),
            })
            .get()
    }

    #[tokio::test]
    async fn the_layer_counts_answers_failures_and_requests_given_up() {
        use tower::{Layer as _, ServiceExt as _};
        let metrics = ApiMetrics::default();
        let layer = ApiMetricsLayer::new(metrics.clone(), "api:6443");
        let svc = layer.layer(tower::service_fn(|req: Request<()>| async move {
            match req.uri().path() {
                "/api/v1/nodes/gone" => Ok(Response::builder().status(404).body(()).expect("r")),
                "/api/v1/nodes/slow" => std::future::pending().await,
                "/api/v1/nodes/broken" => Err("connection reset"),
                _ => Ok(Response::new(())),
            }
        }));
        let get = |path: &str| Request::get(path).body(()).expect("request");
        svc.clone().oneshot(get("/api/v1/nodes")).await.expect("ok");
        svc.clone()
            .oneshot(get("/api/v1/nodes/gone"))
            .await
            .expect("404");
        assert!(
            svc.clone()
                .oneshot(get("/api/v1/nodes/broken"))
                .await
                .is_err()
        );
        let slow = svc.clone().oneshot(get("/api/v1/nodes/slow"));
        let given_up = tokio::time::timeout(std::time::Duration::from_millis(10), slow).await;
        assert!(given_up.is_err());
        assert_eq!(count(&metrics, "200", "GET"), 1);
        assert_eq!(count(&metrics, "404", "GET"), 1);
        assert_eq!(
            count(&metrics, NO_RESPONSE, "GET"),
            2,
            "an error and a request given up"
        );
        let list = metrics
            .by_resource
            .get_or_create(&ResourceRequest {
                verb: "LIST".into(),
                resource: "nodes".into(),
                subresource: String::new(),
                code: "200".into(),
            })
            .get();
        assert_eq!(list, 1);
    }
}
