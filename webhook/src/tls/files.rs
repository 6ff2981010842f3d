//! Mounted-certificate TLS (e.g. cert-manager): `tls.crt`/`tls.key` read from disk and
//! reloaded when their contents change, by polling. Whoever writes the files also owns the
//! webhook configuration's `caBundle` (e.g. cert-manager's CA injector).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use super::{CertResolver, TlsError, certified_key};

/// Where the mounted certificate is and how often to look at it.
#[derive(Debug, Clone)]
pub struct FilesTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// How often the files are re-read (default 10 s).
    pub poll_interval: Duration,
}

impl FilesTls {
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        FilesTls {
            cert: cert.into(),
            key: key.into(),
            poll_interval: Duration::from_secs(10),
        }
    }
}

async fn read(path: &PathBuf) -> Result<Vec<u8>, TlsError> {
    tokio::fs::read(path).await.map_err(|source| TlsError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Watches the files and installs every new, consistent pair into the resolver.
pub(crate) struct Files {
    pub opts: FilesTls,
    pub resolver: Arc<CertResolver>,
    last: Option<(Vec<u8>, Vec<u8>)>,
}

impl Files {
    pub fn new(opts: FilesTls, resolver: Arc<CertResolver>) -> Self {
        Files {
            opts,
            resolver,
            last: None,
        }
    }

    /// Reads both files and installs them if they changed since the last load. A pair that
    /// does not load (e.g. caught half-written, key not matching yet) keeps the old one.
    pub async fn poll(&mut self) -> Result<bool, TlsError> {
        let cert = read(&self.opts.cert).await?;
        let key = read(&self.opts.key).await?;
        if self
            .last
            .as_ref()
            .is_some_and(|(c, k)| *c == cert && *k == key)
        {
            return Ok(false);
        }
        let loaded = certified_key(&cert, &key)?;
        self.resolver.install(loaded);
        info!(cert = %self.opts.cert.display(), "serving certificate loaded from file");
        self.last = Some((cert, key));
        Ok(true)
    }

    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.poll().await {
                warn!(error = %e, "cannot load the mounted certificate; keeping the previous one");
            }
            tokio::select! {
                _ = tokio::time::sleep(self.opts.poll_interval) => {}
                _ = crate::stopped(&mut shutdown) => break,
            }
        }
    }
}
