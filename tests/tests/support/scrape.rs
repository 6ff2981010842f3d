//! Scraping the controller as a scraper would: plain HTTP for the probes, HTTPS with a bearer
//! token for `/metrics`, and a token of a ServiceAccount bound to the metrics reader role.
//! Part of `support`, and included by path (`#[path = "support/scrape.rs"] mod scrape;`) from
//! the tests that do not take the rest of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The ClusterRole of config/rbac that allows `get` on /metrics.
pub const METRICS_READER: &str = "nodeipam-metrics-reader";

/// (status, body) of one HTTP/1.0 response read to the end.
pub fn parse_response(text: &str) -> Option<(u16, String)> {
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// One plain HTTP/1.0 GET of `path` at `addr` (`host:port`).
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(req.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&raw).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .ok()?
        .ok()?;
    parse_response(&text)
}

/// Any server certificate: the metrics certificate is self-signed (scrapers of kubebuilder
/// projects set `insecure_skip_verify`); what is under test is who gets the metrics.
#[derive(Debug)]
struct AnyCertificate(rustls::crypto::WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// A TLS connection to `addr` (`host:port`) trusting any certificate, as [`https_get`] makes.
pub async fn tls_connect(
    addr: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(
            provider.signature_verification_algorithms,
        )))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    connector.connect(name, tcp).await
}

/// One HTTPS GET of `path` at `addr` (`host:port`), with `Authorization: Bearer <token>` when
/// given: (status, body), or why there was no HTTP answer.
pub async fn https_get(
    addr: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(
            provider.signature_verification_algorithms,
        )))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
        let mut tls = connector.connect(name, tcp).await?;
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let req = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n");
        tls.write_all(req.as_bytes()).await?;
        let mut raw = Vec::new();
        // A peer closing without close_notify has still sent the whole HTTP/1.0 response.
        let _ = tls.read_to_end(&mut raw).await;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&raw).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .map_err(|_| format!("GET https://{addr}{path}: timed out"))?
        .map_err(|e| format!("GET https://{addr}{path}: {e}"))?;
    parse_response(&text).ok_or_else(|| format!("GET https://{addr}{path}: not HTTP: {text:?}"))
}

/// Creates ServiceAccount `ns/name` bound (ClusterRoleBinding `name`) to [`METRICS_READER`],
/// as a Prometheus would be, and returns a token for it (TokenRequest). `ns` must exist.
pub async fn metrics_reader_token(client: &kube::Client, ns: &str, name: &str) -> String {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("step=scraper-sa: create {ns}/{name}: {e}"),
    }
    let crb = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: METRICS_READER.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(ns.into()),
            api_group: None,
        }]),
    };
    match Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &crb)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("step=scraper-binding: {name} -> {METRICS_READER}: {e}"),
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    sas.create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("step=scraper-token: {ns}/{name}: {e}"))
        .status
        .and_then(|s| s.token)
        .unwrap_or_else(|| panic!("step=scraper-token: {ns}/{name}: no token in the answer"))
}

/// The leaf certificate (DER) the HTTPS server at `addr` presents.
pub async fn served_leaf(addr: &str) -> Result<Vec<u8>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(
            provider.signature_verification_algorithms,
        )))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let tls = tokio::time::timeout(Duration::from_secs(10), connector.connect(name, tcp))
        .await
        .map_err(|_| format!("TLS to {addr}: timed out"))?
        .map_err(|e| format!("TLS to {addr}: {e}"))?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .ok_or_else(|| format!("{addr} presented no certificate"))
}
