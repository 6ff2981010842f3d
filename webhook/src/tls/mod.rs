//! TLS for the webhook server: the hot-swappable certificate resolver the listener serves
//! from, the rustls server config, and the two sources of certificates (a managed Secret, or
//! mounted files) that feed the resolver.

pub mod files;
pub mod managed;
pub mod material;

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// What can go wrong getting or loading a certificate.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot parse certificate material: {0}")]
    Parse(String),
    #[error("cannot generate certificate material: {0}")]
    Generate(String),
    #[error("cannot load certificate into rustls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The ring provider, like kube's client: never aws-lc-rs.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain (leaf first) and its private key, from PEM, checked to belong together.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Parse(format!("certificate PEM: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::Parse("no certificate in PEM".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::Parse(format!("private key PEM: {e}")))?;
    Ok(CertifiedKey::from_der(chain, key, &provider())?)
}

/// Serves whatever certificate was installed last; swapping is lock-free, so a new
/// certificate is used from the next handshake on without restarting the listener.
#[derive(Default)]
pub struct CertResolver {
    current: ArcSwapOption<CertifiedKey>,
}

impl CertResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `key` from the next handshake on.
    pub fn install(&self, key: CertifiedKey) {
        self.current.store(Some(Arc::new(key)));
    }

    /// Whether a certificate has been installed.
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The leaf certificate being served (DER), if any.
    pub fn leaf_der(&self) -> Option<Vec<u8>> {
        self.current
            .load()
            .as_ref()
            .and_then(|k| k.cert.first().map(|c| c.as_ref().to_vec()))
    }
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver")
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // No certificate yet: abort the handshake rather than serve something unverifiable.
        self.current.load_full()
    }
}

/// The rustls server config: ring, TLS 1.2+, no client auth, HTTP/1.1 only, certificates from
/// `resolver`.
pub fn server_config(resolver: Arc<CertResolver>) -> Result<ServerConfig, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
