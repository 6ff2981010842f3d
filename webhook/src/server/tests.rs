//! Unit tests of the HTTP layer: parsing bodies into clean answers, and TLS hot reload.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::*;
use crate::tls::material::{self, Material, Plan, Policy};
use crate::tls::{CertResolver, certified_key, provider};

fn config_json(name: &str, cidr: &str, mask: u8) -> Value {
    json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": {"name": name},
        "spec": {"ipv4": {"cidr": cidr, "perNodeMaskSize": mask}}
    })
}

fn review_json(object: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            "kind": {"group": "nodeipam.io", "version": "v1alpha1", "kind": "NodeIPAMConfig"},
            "resource": {"group": "nodeipam.io", "version": "v1alpha1", "resource": "nodeipamconfigs"},
            "name": "c",
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": object,
            "dryRun": false
        }
    })
}

fn body(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

fn response_of(reply: &Reply) -> Value {
    let v: Value = serde_json::from_slice(&reply.body).expect("a JSON AdmissionReview");
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    v["response"].clone()
}

#[test]
fn a_valid_review_is_answered_with_its_uid() {
    let reply = handle(
        &body(&review_json(config_json("c", "10.0.0.0/16", 24))),
        Ok(ClusterView::default()),
    );
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.result, review::ALLOWED);
    let r = response_of(&reply);
    assert_eq!(r["allowed"], true);
    assert_eq!(r["uid"], "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4");
}

#[test]
fn a_denial_and_warnings_serialize_for_the_api_server() {
    let reply = handle(
        &body(&review_json(config_json("c", "10.0.0.1/16", 24))),
        Ok(ClusterView::default()),
    );
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.result, review::DENIED);
    let r = response_of(&reply);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 422);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.ipv4.cidr")
    );

    let reply = handle(
        &body(&review_json(config_json("c", "10.0.0.0/24", 26))),
        Ok(ClusterView::default()),
    );
    let r = response_of(&reply);
    assert_eq!(r["allowed"], true);
    assert!(r["warnings"][0].as_str().unwrap().contains("only 4 blocks"));
}

#[test]
fn garbage_is_a_bad_request() {
    for garbage in [
        &b""[..],
        b"not json",
        b"{",
        b"null",
        b"[]",
        b"{\"kind\":\"Pod\",\"apiVersion\":\"v1\"}",
        &[0xff, 0x00, 0x13][..],
    ] {
        let reply = handle(garbage, Ok(ClusterView::default()));
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{garbage:?}");
        assert_eq!(reply.result, review::INVALID);
    }
}

#[test]
fn a_review_without_request_or_of_another_version_is_a_bad_request() {
    let mut v = review_json(config_json("c", "10.0.0.0/16", 24));
    v.as_object_mut().unwrap().remove("request");
    assert_eq!(
        handle(&body(&v), Ok(ClusterView::default())).status,
        StatusCode::BAD_REQUEST
    );
    let mut v = review_json(config_json("c", "10.0.0.0/16", 24));
    v["apiVersion"] = json!("admission.k8s.io/v1beta1");
    assert_eq!(
        handle(&body(&v), Ok(ClusterView::default())).status,
        StatusCode::BAD_REQUEST
    );
}

#[test]
fn every_truncation_of_a_valid_body_is_refused() {
    let full = body(&review_json(config_json("c", "10.0.0.0/16", 24)));
    for cut in 0..full.len() {
        let reply = handle(&full[..cut], Ok(ClusterView::default()));
        assert_ne!(
            reply.result,
            review::ALLOWED,
            "prefix of {cut} bytes allowed"
        );
    }
}

#[test]
fn the_wrong_kind_is_an_invalid_answer_never_allowed() {
    // The request names a Pod.
    let mut v = review_json(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": []}
    }));
    v["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    v["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "pods"});
    let reply = handle(&body(&v), Ok(ClusterView::default()));
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.result, review::INVALID);
    let r = response_of(&reply);
    assert_eq!(r["allowed"], false);
    assert_eq!(r["uid"], "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4");
    assert_eq!(r["status"]["code"], 400);

    // The request claims NodeIPAMConfig but carries a Pod.
    let v = review_json(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"ipv4": {"cidr": "10.0.0.0/16", "perNodeMaskSize": 24}}
    }));
    let reply = handle(&body(&v), Ok(ClusterView::default()));
    assert_eq!(reply.result, review::INVALID);
    assert_eq!(response_of(&reply)["allowed"], false);

    // A spec of the wrong shape.
    let v = review_json(json!({
        "apiVersion": "nodeipam.io/v1alpha1", "kind": "NodeIPAMConfig",
        "metadata": {"name": "c"}, "spec": {"ipv4": "10.0.0.0/16"}
    }));
    let reply = handle(&body(&v), Ok(ClusterView::default()));
    assert_eq!(reply.result, review::INVALID);
    assert_eq!(response_of(&reply)["allowed"], false);
}

#[test]
fn a_cluster_it_cannot_read_still_allows_metadata_updates() {
    let mut v = review_json(config_json("c", "10.0.0.0/16", 24));
    v["request"]["operation"] = json!("UPDATE");
    let mut old = config_json("c", "10.0.0.0/16", 24);
    old["metadata"]["finalizers"] = json!(["nodeipam.io/finalizer"]);
    v["request"]["oldObject"] = old;
    let reply = handle(&body(&v), Err("the API server is away".into()));
    assert_eq!(reply.result, review::ALLOWED);

    // A spec change reads the cluster: refused when it cannot.
    v["request"]["oldObject"]["spec"]["allocation"] = json!("Disabled");
    let reply = handle(&body(&v), Err("the API server is away".into()));
    assert_eq!(reply.result, review::DENIED);
}

#[test]
fn a_cluster_it_cannot_read_refuses_spec_requests() {
    let reply = handle(
        &body(&review_json(config_json("c", "10.0.0.0/16", 24))),
        Err("cannot list NodeIPAMConfigs: connection refused".into()),
    );
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.result, review::DENIED);
    let r = response_of(&reply);
    assert_eq!(r["allowed"], false);
    assert!(r["status"]["message"].as_str().unwrap().contains(
        "cannot read the cluster to review this (cannot list NodeIPAMConfigs: connection refused)"
    ));
}

fn pool_review_json(cidr: &str) -> Value {
    let mut v = review_json(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMPool",
        "metadata": {"name": "p"},
        "spec": {"ipv4": {"cidrs": [cidr], "rangeMaskSize": 20, "perNodeMaskSize": 24}}
    }));
    v["request"]["kind"]["kind"] = json!("NodeIPAMPool");
    v["request"]["resource"]["resource"] = json!("nodeipampools");
    v["request"]["name"] = json!("p");
    v
}

#[test]
fn pool_requests_get_the_pool_review() {
    let reply = handle(
        &body(&pool_review_json("10.64.0.0/14")),
        Ok(ClusterView::default()),
    );
    assert_eq!(reply.result, review::ALLOWED, "{:?}", response_of(&reply));

    let reply = handle(
        &body(&pool_review_json("10.64.0.1/14")),
        Ok(ClusterView::default()),
    );
    assert_eq!(reply.result, review::DENIED);
    let r = response_of(&reply);
    assert_eq!(r["status"]["details"]["kind"], "NodeIPAMPool");
    assert_eq!(
        r["status"]["details"]["causes"][0]["field"],
        "spec.ipv4.cidrs[0]"
    );

    // A pool object under the config kind, or garbage in the pool's spec: invalid, no panic.
    let mut mixed = pool_review_json("10.64.0.0/14");
    mixed["request"]["kind"]["kind"] = json!("NodeIPAMConfig");
    let reply = handle(&body(&mixed), Ok(ClusterView::default()));
    assert_eq!(reply.result, review::INVALID);
    for garbage in [
        json!({"ipv4": {"cidrs": "10.0.0.0/8", "rangeMaskSize": 20, "perNodeMaskSize": 24}}),
        json!({"ipv4": {"cidrs": ["10.0.0.0/8"], "rangeMaskSize": -4, "perNodeMaskSize": 24}}),
        json!({"ranges": {"min": "lots"}}),
        json!("spec"),
    ] {
        let mut v = pool_review_json("10.64.0.0/14");
        v["request"]["object"]["spec"] = garbage.clone();
        let reply = handle(&body(&v), Ok(ClusterView::default()));
        assert_eq!(reply.result, review::INVALID, "{garbage}");
        let r = response_of(&reply);
        assert!(
            r["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("not a valid NodeIPAMPool")),
            "{r}"
        );
    }
}

#[test]
fn pool_requests_wait_for_the_pool_crd() {
    let view = ClusterView {
        pools_unlisted: true,
        ..ClusterView::default()
    };
    let reply = handle(&body(&pool_review_json("10.64.0.0/14")), Ok(view.clone()));
    assert_eq!(reply.result, review::DENIED);
    assert!(
        response_of(&reply)["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not serve NodeIPAMPools"))
    );
    // Configs are still reviewed.
    let reply = handle(
        &body(&review_json(config_json("c", "10.0.0.0/16", 24))),
        Ok(view),
    );
    assert_eq!(reply.result, review::ALLOWED);
}

fn material() -> Material {
    let policy = Policy {
        names: vec!["127.0.0.1".into()],
        validity: Duration::from_secs(3600),
        ca_validity: Duration::from_secs(7200),
        rotate_before: Duration::from_secs(60),
    };
    let now = time::OffsetDateTime::now_utc();
    let first = material::execute(&Plan::NewCa("test".into()), None, &policy, now).unwrap();
    let second =
        material::execute(&Plan::IssueCert("test".into()), Some(&first), &policy, now).unwrap();
    assert_ne!(first.cert, second.cert);
    second
}

/// GETs `/healthz` over TLS trusting `ca_pem`; returns the served leaf (DER) and the body.
async fn get_healthz(addr: SocketAddr, ca_pem: &str) -> Result<(Vec<u8>, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .ok_or("no peer certificate")?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    tls.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok((leaf, out))
}

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

#[tokio::test]
async fn a_new_certificate_is_served_without_restarting() {
    let resolver = Arc::new(CertResolver::new());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/healthz", get(|| async { "ok" }));
    let (stop, stop_rx) = watch::channel(false);
    let server = tokio::spawn(serve_tls(
        listener,
        acceptor(resolver.clone()).unwrap(),
        app,
        stop_rx,
    ));

    let first = material();
    // No certificate yet: the handshake is refused, nothing is served.
    assert!(get_healthz(addr, &first.ca_bundle).await.is_err());

    resolver.install(certified_key(first.cert.as_bytes(), first.key.as_bytes()).unwrap());
    let (leaf1, body) = get_healthz(addr, &first.ca_bundle).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.ends_with("ok"), "{body}");

    let second = material();
    resolver.install(certified_key(second.cert.as_bytes(), second.key.as_bytes()).unwrap());
    let (leaf2, body) = get_healthz(addr, &second.ca_bundle).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert_ne!(leaf1, leaf2, "the new certificate is served");
    assert_eq!(resolver.leaf_der(), Some(leaf2));
    // A client trusting only the first CA now refuses the server.
    assert!(get_healthz(addr, &first.ca_bundle).await.is_err());

    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("the server stops")
        .unwrap();
}

/// A body past the limit is 413 whether its length was declared or only found while reading;
/// one within it is read whole.
#[tokio::test]
async fn a_body_past_the_limit_is_too_large_declared_or_not() {
    let request = |len: usize, declared: bool| {
        let mut r = axum::extract::Request::new(axum::body::Body::from(vec![b' '; len]));
        if declared {
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, len.to_string().parse().unwrap());
        } else {
            r.headers_mut().remove(header::CONTENT_LENGTH);
        }
        r
    };
    for declared in [true, false] {
        let refused = read_body(request(BODY_LIMIT + 1, declared))
            .await
            .expect_err("past the limit");
        assert_eq!(
            refused.status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "declared: {declared}"
        );
        let body = read_body(request(BODY_LIMIT, declared))
            .await
            .unwrap_or_else(|r| panic!("within the limit: {:?}", r.status));
        assert_eq!(body.len(), BODY_LIMIT);
    }
}
