//! Liveness: what makes `/healthz` fail. A replica is alive while none of its long-lived
//! tasks has ended and each part is still making progress: the leader's allocation loop steps,
//! the election loop turns, and the webhook server answers a request. The decision is pure;
//! the progress is recorded by the parts themselves and by [`webhook_self_check`]. The same
//! self-check says whether the webhook serves, for `nodeipam_webhook_serving`
//! ([`webhook_serving`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use nodeipam_webhook::CertResolver;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tracing::debug;

/// How long a leader's allocation loop may go without a step. The loop steps at least every
/// status interval (200 ms); an await that long is a hang.
pub const ALLOCATION_STALL: Duration = Duration::from_secs(120);
/// How long the webhook may go without answering its own replica's check (every
/// [`SELF_CHECK_EVERY`], each bounded by the same timeout).
pub const WEBHOOK_STALL: Duration = Duration::from_secs(30);
pub const SELF_CHECK_EVERY: Duration = Duration::from_secs(5);

/// How long the election loop may go without a turn. It turns at every read of the Lease: a
/// leader reads it just after each renewal is due (at most a lease duration apart), a standby
/// every retry period; twice the lease duration and some slack is a hang.
pub fn election_stall(lease_duration: Duration) -> Duration {
    lease_duration * 2 + Duration::from_secs(10)
}

/// Unix seconds now.
pub fn now() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// A progress mark shared between a part and the health server.
pub fn mark() -> Arc<AtomicI64> {
    Arc::new(AtomicI64::new(now()))
}

/// What liveness is decided from, all times in Unix seconds.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// A task that ended, and how.
    pub failure: Option<String>,
    pub leader: bool,
    pub allocation_step: i64,
    /// The election's last turn and its limit, when electing.
    pub election: Option<(i64, Duration)>,
    /// The webhook's last answer, when serving.
    pub webhook: Option<i64>,
}

/// Ok while alive; otherwise what has stopped.
pub fn liveness(i: &Inputs, now: i64) -> Result<(), String> {
    if let Some(why) = &i.failure {
        return Err(why.clone());
    }
    let secs = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let idle = now.saturating_sub(i.allocation_step);
    if i.leader && idle > secs(ALLOCATION_STALL) {
        return Err(format!(
            "the allocation loop has made no progress for {idle}s"
        ));
    }
    if let Some((turn, limit)) = i.election {
        let idle = now.saturating_sub(turn);
        if idle > secs(limit) {
            return Err(format!(
                "the leader election has made no progress for {idle}s (lease renewals stopped)"
            ));
        }
    }
    if let Some(answer) = i.webhook {
        let idle = now.saturating_sub(answer);
        if idle > secs(WEBHOOK_STALL) {
            return Err(format!("the webhook server has not answered for {idle}s"));
        }
    }
    Ok(())
}

/// Where to reach a server bound to `addr` from this process.
pub fn local_target(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

/// Asks the webhook server for `/healthz` every [`SELF_CHECK_EVERY`] and marks `progress` when
/// it answers 200, until `stop`. While no certificate is loaded the server cannot answer TLS
/// at all; that is readiness's concern (the webhook is not ready), so the mark moves on.
pub async fn webhook_self_check(
    addr: SocketAddr,
    resolver: Arc<CertResolver>,
    progress: Arc<AtomicI64>,
    mut stop: watch::Receiver<bool>,
) {
    let target = local_target(addr);
    loop {
        let ok = match resolver.leaf_der() {
            None => true,
            Some(leaf) => {
                match tokio::time::timeout(SELF_CHECK_EVERY, get_healthz(target, leaf)).await {
                    Ok(Ok(())) => true,
                    Ok(Err(e)) => {
                        debug!(error = %e, %target, "webhook self-check failed");
                        false
                    }
                    Err(_) => {
                        debug!(%target, "webhook self-check timed out");
                        false
                    }
                }
            }
        };
        if ok {
            progress.store(now(), Ordering::Relaxed);
        }
        tokio::select! {
            () = tokio::time::sleep(SELF_CHECK_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Whether this replica's webhook serves: it is ready (the cluster listed once and a certificate loaded,
/// what `/readyz` checks and so what puts the pod behind the webhook Service) and it answered
/// its own check within [`WEBHOOK_STALL`].
pub fn webhook_serving(ready: bool, last_answer: i64, now: i64) -> bool {
    let stall = i64::try_from(WEBHOOK_STALL.as_secs()).unwrap_or(i64::MAX);
    ready && now.saturating_sub(last_answer) <= stall
}

/// Tells `report` whether the webhook serves ([`webhook_serving`]) now and every
/// [`SELF_CHECK_EVERY`], until `stop`.
pub async fn report_webhook_serving(
    ready: impl Fn() -> bool,
    progress: Arc<AtomicI64>,
    report: impl Fn(bool),
    mut stop: watch::Receiver<bool>,
) {
    loop {
        report(webhook_serving(
            ready(),
            progress.load(Ordering::Relaxed),
            now(),
        ));
        tokio::select! {
            () = tokio::time::sleep(SELF_CHECK_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// One HTTPS GET of /healthz, trusting exactly the certificate this replica serves.
async fn get_healthz(target: SocketAddr, leaf: Vec<u8>) -> std::io::Result<()> {
    let provider = nodeipam_webhook::tls::provider();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            leaf,
            algorithms: provider.signature_verification_algorithms,
        }))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(target).await?;
    let name = ServerName::IpAddress(target.ip().into());
    let mut tls = connector.connect(name, tcp).await?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut head = [0u8; 12];
    tls.read_exact(&mut head).await?;
    if head.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "answered {:?}",
            String::from_utf8_lossy(&head)
        )))
    }
}

/// Accepts exactly one certificate: the self-check is about the server answering, and the
/// certificate it must present is known (a rotation in between fails one check, no more).
#[derive(Debug)]
struct Pinned {
    leaf: Vec<u8>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.leaf.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "not the certificate this replica serves".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_webhook_serves_while_ready_and_answering() {
        let now = 1_000;
        assert!(webhook_serving(true, now - 5, now));
        assert!(webhook_serving(true, now - 30, now));
        assert!(!webhook_serving(true, now - 31, now), "no answer for 31 s");
        assert!(!webhook_serving(false, now, now), "not ready");
    }

    #[test]
    fn ended_tasks_and_a_stuck_leader() {
        let base = Inputs {
            leader: true,
            allocation_step: 1000,
            ..Inputs::default()
        };
        assert!(liveness(&base, 1010).is_ok());
        let standby = Inputs {
            leader: false,
            allocation_step: 0,
            ..Inputs::default()
        };
        assert!(
            liveness(&standby, 100_000).is_ok(),
            "a standby does not allocate"
        );
        let e = liveness(&base, 1000 + 121).expect_err("stuck");
        assert!(e.contains("121s"), "{e}");
        let ended = Inputs {
            failure: Some("the webhook task ended".into()),
            ..Inputs::default()
        };
        assert_eq!(liveness(&ended, 0), Err("the webhook task ended".into()));
    }

    #[test]
    fn a_stalled_election() {
        let limit = election_stall(Duration::from_secs(15));
        assert_eq!(limit, Duration::from_secs(40));
        let i = Inputs {
            election: Some((1000, limit)),
            ..Inputs::default()
        };
        assert!(liveness(&i, 1040).is_ok());
        let e = liveness(&i, 1041).expect_err("stalled");
        assert!(e.contains("leader election") && e.contains("41s"), "{e}");
    }

    #[test]
    fn a_webhook_that_does_not_answer() {
        let i = Inputs {
            webhook: Some(1000),
            ..Inputs::default()
        };
        assert!(liveness(&i, 1030).is_ok());
        let e = liveness(&i, 1031).expect_err("stalled");
        assert!(e.contains("webhook") && e.contains("31s"), "{e}");
    }

    #[test]
    fn unspecified_addresses_are_checked_on_loopback() {
        assert_eq!(
            local_target("0.0.0.0:9445".parse().expect("addr")),
            "127.0.0.1:9445".parse().expect("addr")
        );
        assert_eq!(
            local_target("[::]:9445".parse().expect("addr")),
            "[::1]:9445".parse().expect("addr")
        );
        assert_eq!(
            local_target("10.0.0.5:9445".parse().expect("addr")),
            "10.0.0.5:9445".parse().expect("addr")
        );
    }
}
