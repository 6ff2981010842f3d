//! Kubeconfig files with embedded certificates, and `kube::Client`s built from them, so a test's
//! client and a child process (kubectl, the controller) authenticate the same way.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kube::config::Kubeconfig;

use crate::certs::CertAndKey;
use crate::error::{HarnessError, Step};

const NAME: &str = "nodeipam-testenv";

/// Kubeconfig YAML for one identity: cluster `server` trusted via `ca_pem`, client certificate.
pub(crate) fn render(server: &str, ca_pem: &str, user: &str, identity: &CertAndKey) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": NAME,
            "cluster": {
                "server": server,
                "certificate-authority-data": STANDARD.encode(ca_pem),
            },
        }],
        "users": [{
            "name": user,
            "user": {
                "client-certificate-data": STANDARD.encode(&identity.cert_pem),
                "client-key-data": STANDARD.encode(&identity.key_pem),
            },
        }],
        "contexts": [{
            "name": NAME,
            "context": { "cluster": NAME, "user": user },
        }],
        "current-context": NAME,
    });
    // A JSON value always serializes to YAML; fall back to JSON (also valid YAML) regardless.
    serde_saphyr::to_string(&doc).unwrap_or_else(|_| doc.to_string())
}

/// Kubeconfig YAML for a plain-HTTP `server` (the fault proxy) with a user that has no
/// credentials: the server in between authenticates to the API server on the client's behalf.
pub(crate) fn render_without_credentials(server: &str, user: &str) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": NAME, "cluster": { "server": server } }],
        "users": [{ "name": user, "user": {} }],
        "contexts": [{
            "name": NAME,
            "context": { "cluster": NAME, "user": user },
        }],
        "current-context": NAME,
    });
    serde_saphyr::to_string(&doc).unwrap_or_else(|_| doc.to_string())
}

/// Parses kubeconfig YAML (one context, the current one) into a `kube::Config`. Only the given
/// text is read: `$KUBECONFIG` and `~/.kube/config` play no part.
pub(crate) fn config(yaml: &str) -> Result<kube::Config, HarnessError> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|source| HarnessError::Kubeconfig {
        step: Step::BuildClient,
        context: "parse generated kubeconfig".into(),
        source,
    })?;
    kube::Config::try_from(kubeconfig).map_err(|source| HarnessError::Kubeconfig {
        step: Step::BuildClient,
        context: "load generated kubeconfig".into(),
        source,
    })
}

/// A client for `config`; a Tokio runtime must be running (the client spawns a worker task).
pub(crate) fn client(config: kube::Config) -> Result<kube::Client, HarnessError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(HarnessError::other(
            Step::BuildClient,
            "a kube::Client needs a running Tokio runtime; call this from async code",
        ));
    }
    kube::Client::try_from(config)
        .map_err(|e| HarnessError::kube(Step::BuildClient, "build kube client", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_kubeconfig_loads_with_server_and_identity() {
        let identity = CertAndKey {
            cert_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            key_pem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into(),
        };
        let yaml = render(
            "https://127.0.0.1:6443",
            "ca",
            "system:serviceaccount:a:b",
            &identity,
        );
        let kc = Kubeconfig::from_yaml(&yaml).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some(NAME));
        assert_eq!(kc.auth_infos[0].name, "system:serviceaccount:a:b");
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority_data.as_deref(),
            Some(STANDARD.encode("ca").as_str())
        );
    }

    #[test]
    fn a_kubeconfig_without_credentials_loads_as_plain_http_and_no_identity() {
        let yaml = render_without_credentials("http://127.0.0.1:8001", "fault-proxy");
        let config = config(&yaml).unwrap();
        assert_eq!(config.cluster_url.scheme_str(), Some("http"));
        assert_eq!(
            config.cluster_url.authority().map(|a| a.as_str()),
            Some("127.0.0.1:8001")
        );
        assert!(config.root_cert.is_none());
        let auth = &config.auth_info;
        assert!(auth.client_certificate_data.is_none() && auth.client_key_data.is_none());
        assert!(auth.token.is_none() && auth.username.is_none() && auth.exec.is_none());
    }

    #[test]
    fn building_a_client_without_a_runtime_is_an_error_not_a_panic() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let err = client(config).err().unwrap();
        assert_eq!(err.step(), Step::BuildClient);
    }
}
