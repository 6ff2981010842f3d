//! A fake API server for the writers' unit tests: it answers as a test says and records every
//! request (method, path, body), so a test can check the preconditions a write carried.

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response, StatusCode};
use kube::client::Body;

use super::Context;

/// Every request the fake was sent: method, path and body, in order.
pub type Bodies = Arc<Mutex<Vec<(Method, String, String)>>>;

/// A context whose client talks to `answer` (a status and a JSON body for each method and
/// path), and every request it was sent.
pub fn recording(answer: fn(&Method, &str) -> (StatusCode, String)) -> (Context, Bodies) {
    let seen: Bodies = Arc::default();
    let log = seen.clone();
    let svc = tower::service_fn(move |req: Request<Body>| {
        let log = log.clone();
        async move {
            let (method, path) = (req.method().clone(), req.uri().path().to_string());
            let body = req.into_body().collect_bytes().await.unwrap_or_default();
            let (status, answer) = answer(&method, &path);
            let body = String::from_utf8_lossy(&body).to_string();
            log.lock().expect("lock").push((method, path, body));
            let res = Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(answer.into_bytes()))
                .expect("response");
            Ok::<_, std::convert::Infallible>(res)
        }
    });
    let client = kube::Client::new(svc, "default");
    let metrics = Arc::new(crate::metrics::Metrics::new());
    (Context::new(client, Default::default(), metrics), seen)
}

/// A `Status` body of a failed request.
pub fn status(code: u16, reason: &str) -> String {
    format!(
        r#"{{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"{reason}","code":{code},"message":"{reason}"}}"#
    )
}
