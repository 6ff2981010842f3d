//! Free loopback ports for etcd and kube-apiserver. A port is found by binding port 0 and
//! closing the socket; the process remembers every port it handed out so that control planes
//! started in parallel in one test binary never get the same one. Another process can still
//! take the port in the gap before the server binds it: the caller retries on "address in use".
//! A server of this process (the fault proxy) keeps its listener bound instead: no gap.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, OnceLock};

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A loopback TCP port that was free a moment ago and was not handed out before by this process.
pub(crate) fn free_port() -> std::io::Result<u16> {
    for _ in 0..64 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        let mut seen = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "no unused loopback port after 64 tries",
    ))
}

/// A loopback listener on a port that this process never handed out, kept bound, for a server
/// of this process (the fault proxy): no gap for another process to take it, and no port that
/// [`free_port`] gave to an etcd or kube-apiserver not yet listening.
pub(crate) fn bind_unused() -> std::io::Result<TcpListener> {
    for _ in 0..64 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let mut seen = handed_out().lock().unwrap_or_else(|e| e.into_inner());
        if seen.insert(port) {
            return Ok(listener);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrNotAvailable,
        "no unused loopback port after 64 tries",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_not_repeated() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        assert!(ports.iter().all(|p| *p != 0));
    }

    #[test]
    fn a_bound_listener_takes_a_port_never_handed_out() {
        let handed = free_port().unwrap();
        let listener = bind_unused().unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_ne!(port, handed);
        assert!(handed_out().lock().unwrap().contains(&port));
    }
}
