//! End-to-end tests of how `kubectl nodeipam` (and `nodeipam ranges`) connect and fail, the
//! binaries run as processes against the real API server: the kubeconfig read as kubectl
//! reads it (`$KUBECONFIG` a list whose missing files are skipped), kubectl's generic flags
//! (`--server`, `--token`, `--certificate-authority`, `--as`, `--request-timeout`, ...) before
//! or after the subcommand, errors of one line naming the server or file, the exit-code
//! table both binaries share, the usage as `kubectl nodeipam`, and `migrate` refusing names
//! the API server would.

mod support;

use std::path::Path;
use std::process::Stdio;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, ObjectMeta, PostParams};
use nodeipam_testenv::ControlPlane;
use support::process::{nodeipam_bin, plugin_bin};
use support::*;

/// What a run gave: exit code, stdout, stderr.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

/// Runs `bin args` with only `env` of an environment (no $HOME, no $KUBECONFIG unless given);
/// a run that does not end within [`WAIT`] fails naming it.
async fn run(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let child = tokio::process::Command::new(bin)
        .env_clear()
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(WAIT, child)
        .await
        .unwrap_or_else(|_| panic!("step=run: {} {args:?} did not end", bin.display()))
        .unwrap_or_else(|e| panic!("step=run: {} {args:?}: {e}", bin.display()));
    Run {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The error a failed run printed: exactly one line, each `: `-separated part said once.
fn one_line(run: &Run, what: &str) -> String {
    assert_eq!(run.code, Some(2), "{what}: exit 2 (could not run): {run:?}");
    let lines: Vec<&str> = run.err.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: one line of error: {:?}", run.err);
    let line = lines[0].to_string();
    let parts: Vec<&str> = line.split(": ").collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(p),
            "{what}: {p:?} said twice in {line:?}"
        );
    }
    line
}

/// The admin kubeconfig with another server address.
fn kubeconfig_with_server(cp: &ControlPlane, server: &str, path: &Path) {
    let text = std::fs::read_to_string(cp.kubeconfig_path()).expect("read admin kubeconfig");
    assert!(
        text.contains(cp.server_url()),
        "the kubeconfig names the server"
    );
    std::fs::write(path, text.replace(cp.server_url(), server)).expect("write kubeconfig");
}

/// `$KUBECONFIG=missing:valid` reads the valid file, as kubectl does; a missing --kubeconfig
/// is one line naming it, exit 2, from the plugin and from `nodeipam ranges`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubeconfig_list_skips_a_missing_file_and_a_missing_flag_file_is_named() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing.kubeconfig");
    let list = format!("{}:{}", missing.display(), cp.kubeconfig_path().display());
    for bin in [plugin_bin(), nodeipam_bin()] {
        let r = run(&bin, &["ranges"], &[("KUBECONFIG", &list)]).await;
        assert_eq!(
            r.code,
            Some(0),
            "{}: KUBECONFIG={list}: {r:?}",
            bin.display()
        );
        assert!(r.out.starts_with("CIDR"), "the table: {r:?}");
        let flag = format!("--kubeconfig={}", missing.display());
        let r = run(&bin, &["ranges", &flag], &[]).await;
        let line = one_line(&r, &format!("{} {flag}", bin.display()));
        assert_eq!(
            line.matches(&missing.display().to_string()).count(),
            1,
            "names the file once: {line}"
        );
        assert!(line.contains("No such file"), "and the reason: {line}");
    }
}

/// A server that refuses the connection is named with the reason, in one line, exit 2, from
/// both binaries and whether the address comes from the kubeconfig or `--server`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_one_line_naming_the_server() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let refused = dir.path().join("refused.kubeconfig");
    kubeconfig_with_server(&cp, "https://127.0.0.1:1", &refused);
    let flag = format!("--kubeconfig={}", refused.display());
    let admin = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    for (bin, args) in [
        (nodeipam_bin(), vec!["ranges", flag.as_str()]),
        (plugin_bin(), vec!["ranges", flag.as_str()]),
        (plugin_bin(), vec![flag.as_str(), "status"]),
        (
            plugin_bin(),
            vec![admin.as_str(), "--server=https://127.0.0.1:1", "check"],
        ),
    ] {
        let r = run(&bin, &args, &[]).await;
        let line = one_line(&r, &format!("{} {args:?}", bin.display()));
        assert!(
            line.contains("127.0.0.1:1") && line.contains("refused"),
            "names the server and the reason: {line}"
        );
    }
}

/// `--server`, `--token` and `--certificate-authority` alone (no kubeconfig) reach the API
/// server as a ServiceAccount's token; `--as` (after the subcommand or before it) makes it
/// act as another user, whom RBAC then refuses by name; `--as-group` is sent with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectls_generic_flags_connect_authenticate_and_impersonate() {
    let cp = control_plane().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let token = admin_token(&cp, "plugin-reader").await;
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, cp.ca_pem()).expect("write CA");
    let server = format!("--server={}", cp.server_url());
    let token_flag = format!("--token={token}");
    let ca_flag = format!("--certificate-authority={}", ca.display());
    let base = [server.as_str(), token_flag.as_str(), ca_flag.as_str()];
    let r = run(&plugin_bin(), &[&base[..], &["ranges"]].concat(), &[]).await;
    assert_eq!(
        r.code,
        Some(0),
        "--server --token --certificate-authority: {r:?}"
    );
    // Skipping verification instead of a CA works too; -s is --server.
    let short = [
        "-s",
        cp.server_url(),
        &token_flag,
        "--insecure-skip-tls-verify",
        "check",
    ];
    let r = run(&plugin_bin(), &short, &[]).await;
    assert_ne!(r.code, Some(2), "-s --insecure-skip-tls-verify: {r:?}");
    for args in [
        [
            &base[..],
            &["ranges", "--as=nobody", "--as-group=outsiders"],
        ]
        .concat(),
        [&["--as", "nobody"][..], &base[..], &["ranges"]].concat(),
    ] {
        let r = run(&plugin_bin(), &args, &[]).await;
        let line = one_line(&r, &format!("{args:?}"));
        assert!(
            line.contains("\"nobody\"") && line.contains("forbidden"),
            "RBAC refuses the impersonated user by name: {line}"
        );
    }
    // The kubeconfig's user, --user and --cluster by name, and a name not in it.
    let admin = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    let r = run(&plugin_bin(), &[&admin, "ranges", "--user=nope"], &[]).await;
    let line = one_line(&r, "--user=nope");
    assert!(line.contains("--user=nope"), "{line}");
}

/// A ServiceAccount bound to cluster-admin, and a token of it from the TokenRequest API.
async fn admin_token(cp: &ControlPlane, name: &str) -> String {
    let client = cp.client();
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let pp = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    accounts
        .create(&pp, &sa)
        .await
        .expect("step=create-serviceaccount");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}],
    }))
    .expect("a ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &binding)
        .await
        .expect("step=bind-cluster-admin");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec::default()),
        ..TokenRequest::default()
    };
    let answer: TokenRequest = accounts
        .create_subresource("token", name, &pp, &request)
        .await
        .expect("step=request-token");
    answer
        .status
        .and_then(|s| s.token)
        .expect("step=request-token: a token")
}

/// `--request-timeout` bounds a request to a server that accepts the connection and never
/// answers: the plugin gives up with one line naming the server (without the flag it would
/// wait for as long as the server keeps the connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_timeout_is_honoured() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("step=listen");
    let addr = listener.local_addr().expect("address");
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let server = format!("--server=http://{addr}");
    let r = run(
        &plugin_bin(),
        &["ranges", &server, "--token=x", "--request-timeout=1s"],
        &[],
    )
    .await;
    silent.abort();
    let line = one_line(&r, "--request-timeout=1s");
    assert!(
        line.contains(&addr.to_string()) && line.to_lowercase().contains("timed out"),
        "names the server and the timeout: {line}"
    );
    let r = run(&plugin_bin(), &["ranges", "--request-timeout=soon"], &[]).await;
    assert_eq!(r.code, Some(2), "a bad duration is a usage error: {r:?}");
    assert!(r.err.contains("--request-timeout"), "{r:?}");
}

/// The usage says `kubectl nodeipam`, the help the exit codes and that `migrate --apply`
/// writes; each generic flag of kubectl is accepted.
#[tokio::test]
async fn help_names_the_command_as_kubectl_runs_it() {
    let r = run(&plugin_bin(), &["--help"], &[]).await;
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.out.contains("Usage: kubectl nodeipam "), "{}", r.out);
    assert!(!r.out.contains("kubectl-nodeipam ["), "{}", r.out);
    assert!(
        r.out.contains("Exit status: 0") && r.out.contains("migrate --apply"),
        "{}",
        r.out
    );
    let r = run(&plugin_bin(), &["ranges", "--help"], &[]).await;
    assert!(
        r.out.contains("Usage: kubectl nodeipam ranges"),
        "{}",
        r.out
    );
    for flag in [
        "--as",
        "--as-group",
        "--server",
        "--token",
        "--user",
        "--cluster",
        "--context",
        "--kubeconfig",
        "--request-timeout",
        "--namespace",
        "--insecure-skip-tls-verify",
        "--certificate-authority",
        "--client-certificate",
        "--client-key",
    ] {
        assert!(
            r.out.contains(&format!("{flag} ")) || r.out.contains(&format!("{flag}[")),
            "ranges --help lists {flag}"
        );
    }
    // The image's `nodeipam ranges` follows the same table.
    let r = run(&nodeipam_bin(), &["ranges", "--help"], &[]).await;
    assert!(r.out.contains("Exit status: 0"), "{}", r.out);
}

/// A ClusterCIDR whose name no NodeIPAMConfig can have is refused, naming the field and the
/// reason, and nothing is printed (exit 1, as any ClusterCIDR that cannot be converted).
#[tokio::test]
async fn migrate_refuses_a_name_the_api_server_would() {
    let dir = tempfile::tempdir().expect("temp dir");
    let long = "a".repeat(254);
    for (name, reason) in [
        ("Upper", "lowercase RFC 1123"),
        ("under_score", "lowercase RFC 1123"),
        (long.as_str(), "no more than 253"),
    ] {
        let file = dir.path().join("ccidr.yaml");
        let manifest = serde_json::json!({
            "apiVersion": "networking.x-k8s.io/v1",
            "kind": "ClusterCIDR",
            "metadata": {"name": name},
            "spec": {"perNodeHostBits": 8, "ipv4": "10.120.0.0/16"},
        });
        std::fs::write(&file, manifest.to_string()).expect("write manifest");
        let f = file.display().to_string();
        let r = run(&plugin_bin(), &["migrate", "clustercidr", "-f", &f], &[]).await;
        assert_eq!(r.code, Some(1), "{name}: {r:?}");
        assert!(r.out.is_empty(), "nothing printed: {r:?}");
        let refusal = r
            .err
            .lines()
            .find(|l| l.contains("metadata.name"))
            .unwrap_or_else(|| panic!("{name}: no line names metadata.name: {}", r.err));
        assert!(refusal.contains(reason), "{refusal}");
    }
}
