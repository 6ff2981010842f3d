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
pub struct Files {
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

    /// Says what a failed load means: before the first load nothing is served yet (the
    /// mount may appear later, so start-up goes on and /readyz stays false); after it the
    /// previous pair keeps serving.
    fn report(&self, e: &TlsError) {
        if self.last.is_none() {
            warn!(
                error = %e,
                "no serving certificate loaded yet: the webhook cannot serve until {} and {} \
                 can be read (checked every {}s)",
                self.opts.cert.display(),
                self.opts.key.display(),
                self.opts.poll_interval.as_secs()
            );
        } else {
            warn!(error = %e, "cannot load the mounted certificate; keeping the previous one");
        }
    }

    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.poll().await {
                self.report(&e);
            }
            tokio::select! {
                _ = tokio::time::sleep(self.opts.poll_interval) => {}
                _ = crate::stopped(&mut shutdown) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::material::{Plan, Policy, execute};

    fn pair() -> (String, String) {
        let policy = Policy {
            names: vec!["localhost".into()],
            validity: Duration::from_secs(3600),
            ca_validity: Duration::from_secs(7200),
            rotate_before: Duration::from_secs(60),
        };
        let now = time::OffsetDateTime::now_utc();
        let m = execute(&Plan::NewCa("test".into()), None, &policy, now).unwrap();
        (m.cert, m.key)
    }

    #[tokio::test]
    async fn loads_reloads_on_change_and_keeps_the_old_pair_on_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let resolver = Arc::new(CertResolver::new());
        let mut files = Files::new(FilesTls::new(&cert, &key), resolver.clone());

        // Nothing mounted yet.
        assert!(matches!(files.poll().await, Err(TlsError::Io { .. })));
        assert!(!resolver.is_loaded());

        let (c1, k1) = pair();
        std::fs::write(&cert, &c1).unwrap();
        std::fs::write(&key, &k1).unwrap();
        assert!(files.poll().await.unwrap());
        let first = resolver.leaf_der().unwrap();
        assert!(
            !files.poll().await.unwrap(),
            "unchanged files are not reloaded"
        );

        // Caught half-way through an update: the new cert with the old key is refused.
        let (c2, k2) = pair();
        std::fs::write(&cert, &c2).unwrap();
        assert!(files.poll().await.is_err());
        assert_eq!(resolver.leaf_der().unwrap(), first);

        std::fs::write(&key, &k2).unwrap();
        assert!(files.poll().await.unwrap());
        assert_ne!(resolver.leaf_der().unwrap(), first);

        std::fs::write(&key, "garbage").unwrap();
        assert!(matches!(files.poll().await, Err(TlsError::Parse(_))));
        assert!(resolver.is_loaded());
    }
}
