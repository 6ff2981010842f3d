//! End-to-end tests of what `nodeipam run` says as it starts: flags and their environment
//! variables combine as documented, a bad value is one line naming the flag, and the dangers
//! it can see at start-up (no Service range known, ranges outside the consumers' pod network)
//! are logged, recorded as Events and exported as metrics.

mod support;

use std::process::Stdio;

use support::process::nodeipam_bin;

/// `nodeipam <args>` with exactly `env`: (success, stdout, stderr).
async fn nodeipam(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let out = tokio::process::Command::new(nodeipam_bin())
        .env_clear()
        .envs(env.iter().copied())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("step=run-nodeipam: {args:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A run that ends right after logging starts: its kubeconfig does not exist.
const MISSING: &str = "--kubeconfig=/nonexistent/kubeconfig";

/// The chart's `extraEnv` (NODEIPAM_LOG_LEVEL) and `extraArgs` (-v) together start the
/// process, and `--log-level` wins: `off` silences the error log that `-v 5` alone writes.
#[tokio::test]
async fn log_level_and_verbosity_combine_and_log_level_wins() {
    let (ok, out, err) = nodeipam(&["run", MISSING, "-v", "5"], &[]).await;
    assert!(!ok && err.contains("/nonexistent/kubeconfig"), "{err}");
    assert!(
        out.contains("/nonexistent/kubeconfig"),
        "-v 5 alone logs the error: {out}"
    );
    let (ok, out, err) = nodeipam(
        &["run", MISSING, "-v", "5"],
        &[("NODEIPAM_LOG_LEVEL", "off")],
    )
    .await;
    assert!(
        !ok && err.contains("/nonexistent/kubeconfig"),
        "the run got past its flags: {err}"
    );
    assert!(
        out.is_empty(),
        "NODEIPAM_LOG_LEVEL=off wins over -v 5: {out}"
    );
    let (_, out, err) = nodeipam(&["run", MISSING, "-v", "5", "--log-level=off"], &[]).await;
    assert!(
        out.is_empty() && err.contains("/nonexistent/kubeconfig"),
        "both as flags: {err}{out}"
    );
}

/// A flag's environment variable takes effect: NODEIPAM_KUBECONFIG names the kubeconfig.
#[tokio::test]
async fn a_flag_is_set_by_its_environment_variable() {
    let (ok, _, err) = nodeipam(
        &["run"],
        &[("NODEIPAM_KUBECONFIG", "/nonexistent/from-env.kubeconfig")],
    )
    .await;
    assert!(
        !ok && err.contains("/nonexistent/from-env.kubeconfig"),
        "{err}"
    );
}

/// A bad CIDR is refused on one line naming the flag, the value and the reason, the
/// reason being the one the webhook and the CRD rules give.
#[tokio::test]
async fn a_bad_service_cidr_names_the_flag_the_value_and_the_reason() {
    let reason = nodeipam_crd::range::parse_cidr("10.96.0.0/33")
        .expect_err("/33 is not a CIDR")
        .to_string();
    for (args, env) in [
        (vec!["run", "--service-cidr=10.96.0.0/33"], vec![]),
        (
            vec!["run"],
            vec![("NODEIPAM_SERVICE_CIDRS", "10.96.0.0/12,10.96.0.0/33")],
        ),
    ] {
        let (ok, _, err) = nodeipam(&args, &env).await;
        let first = err.lines().next().unwrap_or_default();
        assert!(
            !ok && first.contains("--service-cidr")
                && first.contains("10.96.0.0/33")
                && first.contains(&reason),
            "{args:?} {env:?}: {err}"
        );
        assert!(!err.contains("invalid IP address syntax"), "{err}");
    }
}
