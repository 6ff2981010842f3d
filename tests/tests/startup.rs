//! End-to-end tests of what `nodeipam run` says as it starts: flags and their environment
//! variables combine as documented, a bad value is one line naming the flag, and the dangers
//! it can see at start-up (no Service range known, ranges outside the consumers' pod network)
//! are logged, recorded as Events and exported as metrics.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_testenv::fault_proxy::{Action, FaultProxy, Rule};
use support::process::{
    NAMESPACE, Replica, SA_GROUPS, SA_USER, install_rbac, nodeipam_bin, sa_kubeconfig,
};
use support::*;

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

/// A replica with `kubeconfig`, plain /metrics, no election and no webhook: only what
/// start-up says is under test.
async fn replica(kubeconfig: &Path, dir: &Path, name: &str, extra: &[&str]) -> Replica {
    let mut args = vec!["--leader-elect=false", "--disable-webhook"];
    args.extend(extra);
    Replica::start_plain(dir, kubeconfig, name, &args).await
}

/// Waits until the replica's log has a line containing every one of `words`; returns it.
async fn log_line(r: &Replica, words: &[&str]) -> String {
    wait_for(
        &format!("a log line of {} with {words:?}", r.name),
        || async {
            r.log_text()
                .lines()
                .find(|l| words.iter().all(|w| l.contains(w)))
                .map(str::to_string)
        },
    )
    .await
}

const NO_SERVICE_RANGE: &str = "no Service range is known";

/// On an API server without the ServiceCIDR API (Kubernetes 1.31/1.32; here a proxy answers
/// its list 404 as they do, since a 1.37 kube-apiserver does not get ready with the API
/// turned off by --runtime-config) and without --service-cidr, nothing keeps pod ranges off Service IPs:
/// start-up says so in the log, in a Warning event on the controller's Lease (in its
/// namespace) and in `nodeipam_service_ranges_known` 0. With --service-cidr it is 1 and
/// nothing is said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_service_range_known_is_warned() {
    let cp = control_plane().await;
    let client = cp.client();
    namespace(&client, NAMESPACE).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let proxy = FaultProxy::for_user(&cp, "nodeipam-under-test", &["system:masters"])
        .unwrap_or_else(|e| panic!("step=start-fault-proxy: {e}"));
    let not_served = Action::Answer {
        status: 404,
        then_land_after: None,
    };
    let rule = proxy.add(Rule::new(
        Some(http::Method::GET),
        "/apis/networking.k8s.io/v1/servicecidrs",
        not_served,
    ));
    let kubeconfig = dir.path().join("old-apiserver.kubeconfig");
    proxy
        .write_kubeconfig(&kubeconfig)
        .unwrap_or_else(|e| panic!("step=write-proxy-kubeconfig: {e}"));

    let bare = replica(&kubeconfig, dir.path(), "bare", &[]).await;
    let line = log_line(&bare, &[NO_SERVICE_RANGE]).await;
    assert!(
        line.contains("--service-cidr") && line.contains("does not serve ServiceCIDRs"),
        "{line}"
    );
    let event = wait_event(&client, "nodeipam-controller", "ServiceRangeUnknown").await;
    let regarding = event.regarding.expect("regarding");
    assert_eq!(regarding.kind.as_deref(), Some("Lease"));
    assert_eq!(regarding.namespace.as_deref(), Some(NAMESPACE));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event.note.unwrap_or_default().contains(NO_SERVICE_RANGE),
        "the event says what the log says"
    );
    assert_eq!(
        bare.gauge("nodeipam_service_ranges_known", &[]).await,
        Some(0.0)
    );
    drop(bare);

    let flagged = replica(
        &kubeconfig,
        dir.path(),
        "flagged",
        &["--service-cidr=10.96.0.0/16"],
    )
    .await;
    wait_for(
        "nodeipam_service_ranges_known 1 with --service-cidr",
        || async {
            (flagged.gauge("nodeipam_service_ranges_known", &[]).await == Some(1.0)).then_some(())
        },
    )
    .await;
    let log = flagged.log_text();
    assert!(!log.contains(NO_SERVICE_RANGE), "{log}");
    assert!(rule.matched() >= 2, "each replica asked for ServiceCIDRs");
    drop(flagged);
    cp.stop().await;
}

/// flannel's Network (net-conf.json in the kube-flannel-cfg ConfigMap) is the pod network even
/// without --pod-network-supernet: a config outside it is named at start-up (log, Warning
/// event on the config, `nodeipam_ranges_outside_pod_network`), one inside is not, and one
/// created outside it later gets the webhook's warning in kubectl. The API server here serves
/// ServiceCIDRs and has its default one: no Service-range warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_outside_flannels_network_is_warned() {
    let cp = control_plane().await;
    let client = cp.client();
    namespace(&client, NAMESPACE).await;
    namespace(&client, "kube-flannel").await;
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("kube-flannel-cfg".into()),
            namespace: Some("kube-flannel".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "net-conf.json".to_string(),
            r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#.to_string(),
        )])),
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), "kube-flannel")
        .create(&PostParams::default(), &cm)
        .await
        .expect("step=create-flannel-configmap");
    create_config(
        &client,
        "inside",
        spec(family("10.244.16.0/20", 24), None, None),
    )
    .await;
    create_config(
        &client,
        "outside",
        spec(family("10.64.0.0/16", 24), None, None),
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");

    let r = Replica::start_plain(
        dir.path(),
        cp.kubeconfig_path(),
        "flannel",
        &["--leader-elect=false"],
    )
    .await;
    let line = log_line(&r, &["NodeIPAMConfig outside", "10.64.0.0/16"]).await;
    assert!(
        line.contains("10.244.0.0/16"),
        "names flannel's Network: {line}"
    );
    let event = wait_event(&client, "outside", "OutsidePodNetwork").await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(event.note.unwrap_or_default().contains("10.64.0.0/16"));
    assert_eq!(
        r.gauge("nodeipam_ranges_outside_pod_network", &[]).await,
        Some(1.0)
    );
    assert!(
        events_for(&client, "inside", "OutsidePodNetwork")
            .await
            .is_empty()
    );
    let log = r.log_text();
    assert!(!log.contains("NodeIPAMConfig inside"), "{log}");
    assert_eq!(
        r.gauge("nodeipam_service_ranges_known", &[]).await,
        Some(1.0),
        "the default ServiceCIDR is a known Service range"
    );
    assert!(!log.contains(NO_SERVICE_RANGE), "{log}");

    // The webhook of the same process knows flannel's Network too.
    support::process::register_webhook_by_url(&client, r.webhook_port).await;
    wait_webhook_answers(&client, "the API server to call the webhook").await;
    let manifest = dir.path().join("late.json");
    let late = NodeIPAMConfig::new("late", spec(family("10.72.0.0/16", 24), None, None));
    std::fs::write(&manifest, serde_json::to_string(&late).expect("json")).expect("manifest");
    let path = manifest.display().to_string();
    let (ok, _, err) = support::process::kubectl(&cp, &["create", "-f", &path]).await;
    assert!(ok, "a range outside is still admitted: {err}");
    assert!(
        err.contains(
            "spec.ipv4.cidr: 10.72.0.0/16 is outside the declared pod network (10.244.0.0/16"
        ),
        "kubectl shows the webhook's warning: {err}"
    );
    drop(r);
    cp.stop().await;
}

/// As the ServiceAccount of `config/rbac`, start-up reads flannel's ConfigMap; without the
/// ClusterRole's rule for it (an install from before it) the refusal is one warning naming the
/// ConfigMap and why, not silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_read_of_flannels_network_is_warned() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let cp = control_plane().await;
    let client = cp.client();
    install_rbac(&cp).await;
    namespace(&client, "kube-flannel").await;
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kube-flannel-cfg", "namespace": "kube-flannel"},
        "data": {"net-conf.json": r#"{"Network": "10.244.0.0/16"}"#},
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), "kube-flannel")
        .create(&PostParams::default(), &cm)
        .await
        .expect("step=create-flannel-configmap");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");

    let granted = replica(&kubeconfig, dir.path(), "granted", &[]).await;
    log_line(&granted, &["flannel's pod network read", "10.244.0.0/16"]).await;
    drop(granted);

    // The ClusterRole as shipped, less the rule for flannel's ConfigMap.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let mut role = roles
        .get("nodeipam-controller")
        .await
        .expect("step=get-clusterrole");
    let rules = role.rules.as_mut().expect("rules");
    let before = rules.len();
    rules.retain(|r| {
        !r.resource_names
            .iter()
            .flatten()
            .any(|n| n == "kube-flannel-cfg")
    });
    assert_eq!(rules.len(), before - 1, "config/rbac has one rule for it");
    roles
        .replace("nodeipam-controller", &PostParams::default(), &role)
        .await
        .expect("step=replace-clusterrole");
    let sa = cp
        .client_for(SA_USER, SA_GROUPS)
        .await
        .expect("client for the ServiceAccount");
    let sa_flannel = Api::<ConfigMap>::namespaced(sa, "kube-flannel");
    wait_for("the read refused to the ServiceAccount", || async {
        match sa_flannel.get("kube-flannel-cfg").await {
            Err(kube::Error::Api(s)) if s.code == 403 => Some(()),
            _ => None,
        }
    })
    .await;

    let refused = replica(&kubeconfig, dir.path(), "refused", &[]).await;
    let line = log_line(&refused, &["cannot learn flannel's pod network"]).await;
    assert!(
        line.contains("WARN") && line.contains("kube-flannel-cfg") && line.contains("forbidden"),
        "one warning naming the ConfigMap and why: {line}"
    );
    let log = refused.log_text();
    assert_eq!(
        log.matches("cannot learn flannel's pod network").count(),
        1,
        "{log}"
    );
    assert!(!log.contains("flannel's pod network read"), "{log}");
    drop(refused);
    cp.stop().await;
}

/// --cert-mode=files before its certificate is mounted: the log names the missing file and
/// says the webhook cannot serve until it appears, not that it keeps a previous one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_mode_without_a_certificate_names_the_missing_file() {
    let cp = control_plane().await;
    namespace(&cp.client(), NAMESPACE).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).expect("cert dir");
    let cert_dir = format!("--cert-dir={}", certs.display());
    let r = Replica::start_plain(
        dir.path(),
        cp.kubeconfig_path(),
        "files",
        &["--leader-elect=false", "--cert-mode=files", &cert_dir],
    )
    .await;
    let crt = certs.join("tls.crt").display().to_string();
    let line = log_line(&r, &["cannot serve until", &crt]).await;
    assert!(
        line.contains("cannot read"),
        "names what is missing: {line}"
    );
    let log = r.log_text();
    assert!(!log.contains("keeping the previous one"), "{log}");
    drop(r);
    cp.stop().await;
}

/// An API server that cannot be reached at start-up is named once, by its URL, with each
/// cause said once; kube's own per-request error lines are not repeated on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_is_named_once_with_its_cause() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A port nothing listens on: bound, then let go.
    let port = support::process::free_port();
    let url = format!("https://127.0.0.1:{port}");
    let kubeconfig = dir.path().join("nowhere.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{url}\"}}}}]\n\
             users: [{{name: u, user: {{token: x}}}}]\n\
             contexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .expect("write kubeconfig");
    let r = replica(&kubeconfig, dir.path(), "nowhere", &[]).await;
    let said = format!("cannot reach the Kubernetes API server at {url}:");
    let line = log_line(&r, &[&said]).await;
    assert!(line.contains("Connection refused"), "the cause: {line}");
    let causes: Vec<&str> = line.split(": ").collect();
    let mut seen = std::collections::HashSet::new();
    assert!(
        causes.iter().all(|c| seen.insert(*c)),
        "a cause said twice: {line}"
    );
    let log = r.log_text();
    assert_eq!(log.matches(&said).count(), 1, "{log}");
    assert!(!log.contains("failed with error"), "{log}");
}
