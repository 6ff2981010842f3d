//! The Kubernetes client: which kubeconfig and context (as kubectl picks them), the
//! client-side rate limit every request goes through, as client-go's `--kube-api-qps` and
//! `--kube-api-burst` in kube-controller-manager, and the controller's request metrics.

use std::sync::Arc;

use anyhow::Context as _;
use kube::Client;
use kube::client::ClientBuilder;

use std::time::Duration;

use http::{Method, Request};
use kube::client::Body;
use tower::util::MapRequestLayer;

use crate::api_metrics::{ApiMetrics, ApiMetricsLayer};
use crate::cli::ClientArgs;
use crate::ratelimit::{Charge, RateLimitLayer, RateLimiter};

/// kubectl's flags as the controller's own commands take them: a kubeconfig and a context.
pub fn overrides(args: &ClientArgs) -> crate::kubeconfig::Overrides {
    crate::kubeconfig::Overrides {
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
        ..Default::default()
    }
}

/// The client configuration the flags name, read as kubectl reads it
/// ([`crate::kubeconfig`]).
pub async fn config(args: &ClientArgs) -> anyhow::Result<kube::Config> {
    crate::kubeconfig::config(&overrides(args)).await
}

/// An error as one line for a person: each message of its chain said once, without the parts
/// a message repeats of its cause, kube's variant names, or a newline; a request that never
/// reached the API server names it (`server`, when known), as kubectl does; an answer of the
/// API server is its status's reason and message.
pub fn one_line(e: &anyhow::Error, server: Option<&http::Uri>) -> String {
    let chain: Vec<&(dyn std::error::Error + 'static)> = e.chain().collect();
    let mut parts: Vec<String> = Vec::new();
    for (i, cause) in chain.iter().enumerate() {
        let part = match cause.downcast_ref::<kube::Error>() {
            Some(kube::Error::Api(status)) => {
                let reason = match status.reason.as_str() {
                    "" => String::new(),
                    r => format!(" ({r})"),
                };
                parts.push(format!(
                    "the API server answered {}{reason}: {}",
                    status.code, status.message
                ));
                break;
            }
            Some(kube::Error::HyperError(_) | kube::Error::Service(_)) => match server {
                Some(url) => format!("cannot reach the Kubernetes API server {}", host_label(url)),
                None => "cannot reach the Kubernetes API server".into(),
            },
            _ => own_part(&cause.to_string(), chain.get(i + 1).map(|c| c.to_string())),
        };
        let part = part.split_whitespace().collect::<Vec<_>>().join(" ");
        if !part.is_empty() && !parts.iter().any(|p| p.contains(&part)) {
            parts.push(part);
        }
    }
    parts.join(": ")
}

/// What `message` says beyond its cause's message, which it may end with.
fn own_part(message: &str, cause: Option<String>) -> String {
    let own = match cause {
        Some(cause) if !cause.is_empty() => message.strip_suffix(&cause).unwrap_or(message),
        _ => message,
    };
    own.trim_end_matches([':', ' ']).to_string()
}

/// A client whose every request waits for the rate limiter (`--kube-api-qps` 0: unlimited).
/// Each call builds a client with its own limiter, as client-go gives each client its own.
///
/// The controller's clients ([`build_with_deadline`]) go without kube's own retries: they retry 429, 503 and 504 up to 15 times with a backoff of
/// up to minutes (honouring any Retry-After), inside one call, so under API Priority and
/// Fairness throttling a single write would block its writer for minutes with nothing said,
/// and a write retried inside the client would be sent again behind the back of the code
/// that accounts for what may land. Every caller bounds its requests and retries with its own
/// backoff, logged and counted.
/// A one-shot command (`nodeipam ranges`) keeps kube's own retries of 429/503/504: it sends a
/// few reads, and an API server that is starting answers 429 for a moment.
pub fn build(config: kube::Config, args: &ClientArgs) -> anyhow::Result<Client> {
    let builder = ClientBuilder::try_from(config).context("building the Kubernetes client")?;
    let limit = RateLimitLayer::new(limiter(args), Charge::All);
    Ok(builder.with_layer(&limit).build())
}

/// A budget of `--kube-api-qps` and `--kube-api-burst`.
pub fn limiter(args: &ClientArgs) -> Arc<RateLimiter> {
    Arc::new(RateLimiter::new(args.kube_api_qps, args.kube_api_burst))
}

/// The controller's client: [`build`] without kube's retries (see above), and every mutating
/// request asks the API server to give up on it after `deadline` (its `timeout` parameter), so
/// that the server stops working on a write about when we stop waiting for it (see
/// docs/single-writer.md). Every request is recorded in `api` once the rate limiter let it
/// go, so its latency is the API server's and the network's, as client-go measures it.
/// The requests `charge` names take a token from `limiter`; the others are charged by their
/// sender.
pub fn build_with_deadline(
    mut config: kube::Config,
    (limiter, charge): (Arc<RateLimiter>, Charge),
    deadline: Option<Duration>,
    api: &ApiMetrics,
) -> anyhow::Result<Client> {
    config.default_retry = false;
    let host = host_label(&config.cluster_url);
    let builder = ClientBuilder::try_from(config).context("building the Kubernetes client")?;
    let builder = builder
        .with_layer(&ApiMetricsLayer::new(api.clone(), &host))
        .with_layer(&RateLimitLayer::new(limiter, charge));
    Ok(builder
        .with_layer(&MapRequestLayer::new(move |req| {
            with_deadline(req, deadline)
        }))
        .build())
}

/// client-go's `host` label: the API server URL's `host:port` as the kubeconfig gives it.
fn host_label(url: &http::Uri) -> String {
    url.authority()
        .map(|a| {
            a.as_str()
                .rsplit('@')
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .unwrap_or_default()
}

/// `req` with `timeout=` added when it is a mutating request without one.
fn with_deadline(mut req: Request<Body>, deadline: Option<Duration>) -> Request<Body> {
    let Some(deadline) = deadline else {
        return req;
    };
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return req;
    }
    let uri = req.uri();
    let query = uri.query().unwrap_or_default();
    if query.split('&').any(|p| p.starts_with("timeout=")) {
        return req;
    }
    let param = format!("timeout={}ms", deadline.as_millis());
    let path = uri.path();
    let with = if query.is_empty() {
        format!("{path}?{param}")
    } else {
        format!("{path}?{query}&{param}")
    };
    let mut parts = uri.clone().into_parts();
    if let Ok(pq) = with.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(new) = http::Uri::from_parts(parts) {
            *req.uri_mut() = new;
        }
    }
    req
}

/// The client the flags name, rate limited.
pub async fn client(args: &ClientArgs) -> anyhow::Result<Client> {
    build(config(args).await?, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutating_request_asks_the_api_server_to_give_up_when_we_do() {
        let req = |method: Method, uri: &str| {
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .expect("request")
        };
        let limit = Some(Duration::from_millis(4500));
        let patch = with_deadline(req(Method::PATCH, "/api/v1/nodes/n1"), limit);
        assert_eq!(patch.uri(), "/api/v1/nodes/n1?timeout=4500ms");
        let apply = with_deadline(req(Method::PATCH, "/api/v1/x?fieldManager=m"), limit);
        assert_eq!(apply.uri(), "/api/v1/x?fieldManager=m&timeout=4500ms");
        let get = with_deadline(req(Method::GET, "/api/v1/nodes"), limit);
        assert_eq!(get.uri(), "/api/v1/nodes");
        let asked = with_deadline(req(Method::PUT, "/api/v1/x?timeout=1s"), limit);
        assert_eq!(asked.uri(), "/api/v1/x?timeout=1s");
        let none = with_deadline(req(Method::PATCH, "/api/v1/nodes/n1"), None);
        assert_eq!(none.uri(), "/api/v1/nodes/n1");
    }

    #[test]
    fn the_host_label_is_the_servers_host_and_port() {
        let host = |u: &str| host_label(&u.parse().expect("uri"));
        assert_eq!(host("https://10.0.0.1:6443"), "10.0.0.1:6443");
        assert_eq!(
            host("https://kubernetes.default.svc"),
            "kubernetes.default.svc"
        );
        assert_eq!(host("https://user:secret@[::1]:443/prefix"), "[::1]:443");
    }

    /// A link of an error chain, as hyper's: a message and its cause.
    #[derive(Debug)]
    struct Link(
        &'static str,
        Option<Box<dyn std::error::Error + Send + Sync>>,
    );
    impl std::fmt::Display for Link {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Link {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_is_one_line_naming_the_server_each_cause_once() {
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let tcp = Link("tcp connect error", Some(Box::new(refused)));
        let hyper = Link("client error (Connect)", Some(Box::new(tcp)));
        let e = anyhow::Error::new(kube::Error::Service(Box::new(hyper)))
            .context("listing NodeIPAMConfigs");
        let server: http::Uri = "https://127.0.0.1:1".parse().expect("uri");
        assert_eq!(
            one_line(&e, Some(&server)),
            "listing NodeIPAMConfigs: cannot reach the Kubernetes API server 127.0.0.1:1: \
             client error (Connect): tcp connect error: Connection refused"
        );
        // A message that ends with its cause's says only its own part; a newline is folded.
        let inner = std::io::Error::other("No such file or directory");
        let outer = Link(
            "reading /x: No such file or directory",
            Some(Box::new(inner)),
        );
        let e = anyhow::Error::new(outer).context("loading\nthe kubeconfig");
        assert_eq!(
            one_line(&e, None),
            "loading the kubeconfig: reading /x: No such file or directory"
        );
    }
}
