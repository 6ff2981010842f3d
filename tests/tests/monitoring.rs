//! The monitoring manifests and the metrics documentation against the metrics the controller
//! really registers (`Metrics::new()`): `config/prometheus` parses, every alert's PromQL names
//! only registered metrics, every alert has a runbook section in `docs/runbooks.md` and a
//! `runbook_url` pointing at it, the chart carries the same alerts, the ServiceMonitor scrapes
//! the manager's metrics port over HTTPS with a bearer token and Prometheus is bound to the
//! metrics reader role, and `docs/metrics.md`
//! documents every registered metric and no other. Those are file checks; the last tests run
//! the controller against a real API server and read the metrics the alerts are built on, and
//! those every Kubernetes component exposes (process, build, leader election, API requests).

mod support;

use std::collections::BTreeSet;

use nodeipam_controller::metrics::Metrics;
use nodeipam_controller::reconcile::Options;
use nodeipam_testenv::workspace_root;
use rustix::process::Signal;
use serde_json::Value;
use support::process::{Replica, install_rbac, metric, nodeipam_bin, sa_kubeconfig};
use support::*;

/// Where the runbooks are published: the repository's docs/runbooks.md.
const RUNBOOKS: &str = "https://github.com/nodeipam/nodeipam/blob/main/docs/runbooks.md";

fn read(rel: &str) -> String {
    let path = workspace_root().join(rel);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("step=read: cannot read {}: {e}", path.display()))
}

fn yaml_docs(text: &str) -> Vec<Value> {
    nodeipam_testenv::yaml::documents(text).expect("YAML documents")
}

fn rule_file() -> Value {
    let docs = yaml_docs(&read("config/prometheus/prometheus_rule.yaml"));
    assert_eq!(docs.len(), 1);
    let rule = docs.into_iter().next().expect("one document");
    assert_eq!(rule["kind"], "PrometheusRule");
    rule
}

fn alerts() -> Vec<Value> {
    let rule = rule_file();
    let groups = rule["spec"]["groups"].as_array().expect("groups");
    let alerts: Vec<Value> = groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| r.get("alert").is_some())
        .collect();
    alerts
}

/// PromQL words that are not metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
];

/// Aggregation operators, which may be followed by `by (...)` or `without (...)` before
/// their parenthesis.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric names a PromQL expression reads: identifiers outside string literals, label
/// matchers (`{...}`), range selectors (`[...]`) and grouping lists (`by (...)` and the like),
/// that are not keywords and not function calls.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Blank out strings, label matchers and ranges.
    let mut flat = String::new();
    let mut depth_brace = 0usize;
    let mut depth_bracket = 0usize;
    let mut quote: Option<char> = None;
    for c in expr.chars() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            }
            flat.push(' ');
            continue;
        }
        match c {
            '"' | '\'' | '`' => {
                quote = Some(c);
                flat.push(' ');
            }
            '{' => {
                depth_brace += 1;
                flat.push(' ');
            }
            '}' => {
                depth_brace = depth_brace.saturating_sub(1);
                flat.push(' ');
            }
            '[' => {
                depth_bracket += 1;
                flat.push(' ');
            }
            ']' => {
                depth_bracket = depth_bracket.saturating_sub(1);
                flat.push(' ');
            }
            _ if depth_brace > 0 || depth_bracket > 0 => flat.push(' '),
            _ => flat.push(c),
        }
    }
    // Tokens: identifiers and single punctuation.
    let mut tokens: Vec<String> = Vec::new();
    let mut word = String::new();
    for c in flat.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            if !word.is_empty() {
                tokens.push(std::mem::take(&mut word));
            }
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        let next = tokens.get(i + 1).map(String::as_str);
        let is_ident = t
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
        if [
            "by",
            "without",
            "on",
            "ignoring",
            "group_left",
            "group_right",
        ]
        .contains(&t.as_str())
            && next == Some("(")
        {
            // Skip the label list.
            while i < tokens.len() && tokens[i] != ")" {
                i += 1;
            }
        } else if AGGREGATIONS.contains(&t.as_str()) && matches!(next, Some("by" | "without" | "("))
        {
            // An aggregation, not a metric.
        } else if is_ident && next != Some("(") && !KEYWORDS.contains(&t.as_str()) {
            names.insert(t.clone());
        }
        i += 1;
    }
    names
}

#[test]
fn the_extractor_finds_metric_names_and_nothing_else() {
    let names = metric_names(
        r#"max by (config, family) (a_metric{result=~"denied|x", other="y"} and on (instance) (b_total == 1)) > 0 or absent(c) or sum(rate(d_total[5m])) without (pod)"#,
    );
    assert_eq!(
        names,
        ["a_metric", "b_total", "c", "d_total"]
            .into_iter()
            .map(String::from)
            .collect()
    );
}

#[test]
fn every_alert_reads_only_registered_metrics() {
    let exposed: BTreeSet<String> = Metrics::new().exposed_names().into_iter().collect();
    assert!(exposed.contains("nodeipam_leader"), "{exposed:?}");
    let alerts = alerts();
    assert!(alerts.len() >= 6, "{alerts:?}");
    let mut unknown = Vec::new();
    for alert in &alerts {
        let name = alert["alert"].as_str().expect("alert name");
        let expr = alert["expr"].as_str().expect("expr");
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{name}: no metric found in {expr:?}");
        for metric in names {
            if !exposed.contains(&metric) {
                unknown.push(format!("{name}: {metric}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "alerts read metrics the controller does not register:\n{}\nregistered: {exposed:?}",
        unknown.join("\n")
    );
}

#[test]
fn the_alerts_the_operators_need_are_there() {
    let names: BTreeSet<String> = alerts()
        .iter()
        .filter_map(|a| a["alert"].as_str().map(String::from))
        .collect();
    for want in [
        "NodeIPAMConfigExhausted",
        "NodeIPAMNodesPending",
        "NodeIPAMLeakedBlocks",
        "NodeIPAMNoLeader",
        "NodeIPAMWebhookDenialsSpike",
        "NodeIPAMRangeDraining",
        "NodeIPAMPodNetworkNearConfigMapLimit",
        "NodeIPAMWebhookUnserved",
        "NodeIPAMStorageWentBack",
    ] {
        assert!(names.contains(want), "{want} missing: {names:?}");
    }
    let draining = alerts()
        .into_iter()
        .find(|a| a["alert"] == "NodeIPAMRangeDraining")
        .expect("draining alert");
    assert_eq!(
        draining["for"], "24h",
        "a range draining for more than a day"
    );
}

#[test]
fn every_alert_has_a_runbook_section_and_links_it() {
    let runbooks = read("docs/runbooks.md");
    let headings: BTreeSet<&str> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(str::trim)
        .collect();
    for alert in alerts() {
        let name = alert["alert"].as_str().expect("alert name");
        assert!(
            headings.contains(name),
            "docs/runbooks.md has no `## {name}` section: {headings:?}"
        );
        let url = alert["annotations"]["runbook_url"].as_str().unwrap_or("");
        assert_eq!(
            url,
            format!("{RUNBOOKS}#{}", name.to_lowercase()),
            "{name}: runbook_url"
        );
        for key in ["summary", "description"] {
            assert!(
                alert["annotations"][key]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: no {key}"
            );
        }
        assert!(
            alert["labels"]["severity"].as_str().is_some(),
            "{name}: no severity"
        );
    }
}

#[test]
fn the_chart_carries_the_same_alerts() {
    let chart: Value = serde_saphyr::from_str(&read("charts/nodeipam/files/prometheus_rules.yaml"))
        .expect("the chart's rules parse");
    assert_eq!(
        chart["groups"],
        rule_file()["spec"]["groups"],
        "charts/nodeipam/files/prometheus_rules.yaml differs from config/prometheus"
    );
}

#[test]
fn config_prometheus_parses_and_the_monitor_selects_the_metrics_service() {
    let service = yaml_docs(&read("config/prometheus/metrics_service.yaml"));
    let monitor = yaml_docs(&read("config/prometheus/monitor.yaml"));
    assert_eq!(service[0]["kind"], "Service");
    assert_eq!(monitor[0]["kind"], "ServiceMonitor");
    let labels = service[0]["metadata"]["labels"]
        .as_object()
        .expect("service labels");
    for (k, v) in monitor[0]["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(labels.get(k), Some(v), "the ServiceMonitor selects {k}={v}");
    }
    let port = &monitor[0]["spec"]["endpoints"][0]["port"];
    assert!(
        service[0]["spec"]["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| &p["name"] == port)),
        "the ServiceMonitor's port {port} is a port of the Service"
    );
    // The Service selects the controller's pods and targets a port their container declares
    // (config/manager): a renamed or moved metrics port must move here too.
    let deployment = yaml_docs(&read("config/manager/manager.yaml"))
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("config/manager has the Deployment");
    let pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .expect("pod labels");
    for (k, v) in service[0]["spec"]["selector"]
        .as_object()
        .expect("selector")
    {
        assert_eq!(
            pod_labels.get(k),
            Some(v),
            "the metrics Service selects {k}={v}"
        );
    }
    let target = &service[0]["spec"]["ports"][0]["targetPort"];
    let ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .expect("container ports");
    let declared = ports
        .iter()
        .find(|p| &p["name"] == target)
        .unwrap_or_else(|| {
            panic!(
                "the metrics Service targets port {target}, which the manager container does not declare: {ports:?}"
            )
        });
    // ... and that port is where the manager serves /metrics (--metrics-bind-address), on the
    // same number as the Service's.
    let args: Vec<String> = serde_json::from_value(
        deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone(),
    )
    .expect("manager args");
    let bind = args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-bind-address="))
        .unwrap_or_else(|| panic!("config/manager sets no --metrics-bind-address: {args:?}"));
    let bind_port: u64 = bind
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("--metrics-bind-address={bind} has no port"));
    assert_eq!(target, "metrics");
    assert_eq!(declared["containerPort"], bind_port, "{declared}");
    assert_eq!(service[0]["spec"]["ports"][0]["port"], bind_port);
    assert_eq!(bind_port, 8085);
    assert!(
        !args.iter().any(|a| a == "--metrics-secure=false"),
        "config/manager serves metrics securely: {args:?}"
    );

    // The metrics are HTTPS behind a TokenReview and a SubjectAccessReview: the monitor
    // scrapes with https, Prometheus's ServiceAccount token, and without verifying the
    // self-signed certificate.
    let endpoint = &monitor[0]["spec"]["endpoints"][0];
    assert_eq!(endpoint["scheme"], "https", "{endpoint}");
    assert_eq!(
        endpoint["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "{endpoint}"
    );
    assert_eq!(
        endpoint["tlsConfig"]["insecureSkipVerify"], true,
        "{endpoint}"
    );
}

/// Prometheus's ServiceAccount is bound to the ClusterRole that config/rbac ships for
/// scrapers, which grants `get` on /metrics and nothing else; config/prometheus applies the
/// binding.
#[test]
fn config_prometheus_binds_prometheus_to_the_metrics_reader_role() {
    let binding = yaml_docs(&read("config/prometheus/metrics_reader_binding.yaml"));
    assert_eq!(binding.len(), 1);
    let binding = &binding[0];
    assert_eq!(binding["kind"], "ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], "nodeipam-metrics-reader");
    let subjects = binding["subjects"].as_array().expect("subjects");
    assert!(
        subjects
            .iter()
            .all(|s| s["kind"] == "ServiceAccount" && s["namespace"].is_string()),
        "{subjects:?}"
    );
    let role = yaml_docs(&read("config/rbac/metrics_reader_role.yaml"));
    assert_eq!(role[0]["kind"], "ClusterRole");
    assert_eq!(role[0]["metadata"]["name"], "nodeipam-metrics-reader");
    assert_eq!(
        role[0]["rules"],
        serde_json::json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
    );
    let kustomization: Value =
        serde_saphyr::from_str(&read("config/prometheus/kustomization.yaml")).expect("parses");
    let resources = kustomization["resources"].as_array().expect("resources");
    for file in [
        "metrics_service.yaml",
        "monitor.yaml",
        "metrics_reader_binding.yaml",
        "prometheus_rule.yaml",
    ] {
        assert!(
            resources.iter().any(|r| r == file),
            "config/prometheus applies {file}: {resources:?}"
        );
    }
}

/// docs/metrics.md names every registered metric (as queried: counters with `_total`) in a
/// table row starting with it in backquotes, and names no metric that is not registered.
#[test]
fn every_metric_is_documented() {
    let doc = read("docs/metrics.md");
    let metrics = Metrics::new();
    let queried = |name: &str, kind: &str| {
        if kind == "counter" {
            format!("{name}_total")
        } else {
            name.to_string()
        }
    };
    let registered: BTreeSet<String> = metrics
        .families()
        .into_iter()
        .map(|(name, kind)| queried(&name, kind))
        .collect();
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(String::from)
        .collect();
    let missing: Vec<_> = registered.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&registered).collect();
    assert!(
        missing.is_empty(),
        "docs/metrics.md does not document {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "docs/metrics.md documents metrics the controller does not register: {stale:?}"
    );
    // Each row says the type as the exposition does.
    for (name, kind) in metrics.families() {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| `{}`", queried(&name, kind))))
            .expect("row");
        assert!(row.contains(&format!("| {kind} |")), "{name}: {row}");
    }
}

/// The value of the sample `series` (name and labels exactly as exposed), if present.
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|rest| rest.strip_prefix(' '))
        .map(|v| v.trim().to_string())
}

/// Through the real API server: kcm's max gauge, the condition gauges behind
/// `NodeIPAMConfigExhausted`, the draining gauge behind `NodeIPAMRangeDraining`, and the
/// series dropped once the config is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alert_metrics_follow_a_config_through_exhaustion_drain_and_removal() {
    let cp = control_plane().await;
    let client = cp.client();
    let ctl = start_controller(client.clone(), Options::default());
    // 10.30.0.0/24 in /26 blocks: 4 blocks, so 4 nodes exhaust it.
    create_ready_config(
        &client,
        "small",
        spec(family("10.30.0.0/24", 26), None, None),
    )
    .await;
    for i in 0..4 {
        create_node(&client, &format!("n{i}"), &[]).await;
    }
    for i in 0..4 {
        wait_cidrs(&client, &format!("n{i}")).await;
    }
    wait_condition(&client, "small", "Exhausted", "True", None).await;
    let m = &ctl.metrics;
    let text = wait_for("the exhausted config in the metrics", || async {
        let text = m.encode();
        (sample(
            &text,
            r#"nodeipam_config_condition{config="small",condition="Exhausted",status="True"}"#,
        )
        .as_deref()
            == Some("1"))
        .then_some(text)
    })
    .await;
    assert_eq!(
        sample(
            &text,
            r#"node_ipam_controller_cirdset_max_cidrs{clusterCIDR="10.30.0.0/24"}"#
        )
        .as_deref(),
        Some("4"),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"node_ipam_controller_cidrset_usage_cidrs{clusterCIDR="10.30.0.0/24"}"#
        )
        .as_deref(),
        Some("1.0"),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"nodeipam_config_draining{config="small"}"#).as_deref(),
        Some("0"),
        "an active config is not draining: {text}"
    );

    // Deleted while nodes hold its blocks: draining.
    delete_config(&client, "small").await;
    wait_condition(&client, "small", "Drained", "False", Some("NodesRemaining")).await;
    wait_for("draining=1", || async {
        (sample(&m.encode(), r#"nodeipam_config_draining{config="small"}"#).as_deref() == Some("1"))
            .then_some(())
    })
    .await;

    // The nodes go: drained, finalizer removed, config gone, and its series with it.
    for i in 0..4 {
        delete_node(&client, &format!("n{i}")).await;
    }
    wait_for("the config gone", || async {
        get_config(&client, "small").await.is_none().then_some(())
    })
    .await;
    let text = wait_for("the config's series gone", || async {
        let text = m.encode();
        (!text.contains(r#"config="small""#)).then_some(text)
    })
    .await;
    assert!(!text.contains("nodeipam_config_draining{"), "{text}");
    stop_controller(ctl).await;
    cp.stop().await;
}

/// The label value of `label` on the first series of `name` in Prometheus text.
fn label_of(text: &str, name: &str, label: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with(&format!("{name}{{")))?;
    let want = format!("{label}=\"");
    let (_, rest) = line.split_once(&want)?;
    rest.split_once('"').map(|(v, _)| v.to_string())
}

/// What `nodeipam version` prints as its commit.
async fn binary_commit() -> String {
    let out = tokio::process::Command::new(nodeipam_bin())
        .arg("version")
        .output()
        .await
        .unwrap_or_else(|e| panic!("step=nodeipam-version: {e}"));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("git commit: "))
        .unwrap_or_else(|| panic!("step=nodeipam-version: no commit line"))
        .to_string()
}

/// Two replicas of the binary, as the controller's ServiceAccount against the real API server:
/// each exposes the process metrics (sane values of its own process), the build info of the
/// binary, client-go's leader election gauge (1 on the leader, 0 on the standby) and its
/// request metrics (the reads and the podCIDR patch the leader sent, answered 200), and says
/// its webhook serves. When the leader stops, the standby's election gauge turns 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_exposes_the_metrics_every_kubernetes_component_has() {
    const LEASE: &str = "nodeipam-controller";
    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("step=tempdir");
    install_rbac(&cp).await;
    let kubeconfig = sa_kubeconfig(&cp, dir.path(), "nodeipam-controller");
    let a = Replica::start_plain(dir.path(), &kubeconfig, "replica-a", &[]).await;
    a.wait_leader_metric(1.0).await;
    let b = Replica::start_plain(dir.path(), &kubeconfig, "replica-b", &[]).await;
    create_ready_config(
        &admin,
        "pool",
        spec(family("10.150.0.0/16", 24), None, None),
    )
    .await;
    create_node(&admin, "n1", &[]).await;
    wait_cidrs(&admin, "n1").await;

    let lease = [("name", LEASE)];
    for (replica, held) in [(&a, 1.0), (&b, 0.0)] {
        wait_for(
            &format!("{}: master status {held}", replica.name),
            || async {
                (replica.gauge("leader_election_master_status", &lease).await == Some(held))
                    .then_some(())
            },
        )
        .await;
        wait_for(&format!("{}: webhook serving", replica.name), || async {
            (replica.gauge("nodeipam_webhook_serving", &[]).await == Some(1.0)).then_some(())
        })
        .await;
    }

    let host = cp
        .server_url()
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string();
    let commit = binary_commit().await;
    let now = k8s_openapi::jiff::Timestamp::now().as_second() as f64;
    for replica in [&a, &b] {
        let text = replica.metrics().await;
        let m = |name: &str, labels: &[(&str, &str)]| metric(&text, name, labels);
        let who = &replica.name;
        let started = m("process_start_time_seconds", &[]).expect("start time");
        // Within the last hour by the wall clock (boot time is kept in whole seconds).
        assert!(
            started > now - 3600.0 && started <= now + 5.0,
            "{who}: {started} vs {now}"
        );
        let rss = m("process_resident_memory_bytes", &[]).expect("rss");
        let vsize = m("process_virtual_memory_bytes", &[]).expect("vsize");
        assert!(
            rss > 0.0 && vsize >= rss,
            "{who}: rss {rss}, virtual {vsize}"
        );
        let fds = m("process_open_fds", &[]).expect("open fds");
        let max = m("process_max_fds", &[]).expect("max fds");
        assert!(fds > 0.0 && max >= fds, "{who}: {fds} of {max} fds");
        assert!(m("process_cpu_seconds_total", &[]).expect("cpu") >= 0.0);

        let version = [("version", nodeipam_controller::version::VERSION)];
        assert_eq!(
            m("nodeipam_build_info", &version),
            Some(1.0),
            "{who}: {text}"
        );
        assert_eq!(
            label_of(&text, "nodeipam_build_info", "commit").as_deref(),
            Some(commit.as_str()),
            "{who}"
        );
        assert!(
            label_of(&text, "nodeipam_build_info", "rustc")
                .is_some_and(|v| v.starts_with("1.") || v == "unknown"),
            "{who}: {text}"
        );

        // Every replica reads (the Lease, the webhook's caches) and is answered.
        let get = [("code", "200"), ("method", "GET"), ("host", host.as_str())];
        assert!(
            m("rest_client_requests_total", &get).unwrap_or(0.0) > 0.0,
            "{who}: {text}"
        );
        let latency = [("verb", "GET"), ("host", host.as_str())];
        assert!(
            m("rest_client_request_duration_seconds_count", &latency).unwrap_or(0.0) > 0.0,
            "{who}: {text}"
        );
        let lease_reads = [("verb", "GET"), ("resource", "leases"), ("code", "200")];
        assert!(
            m("nodeipam_api_requests_total", &lease_reads).unwrap_or(0.0) > 0.0,
            "{who}: {text}"
        );
        assert!(!text.contains("\"n1\""), "{who}: a name in a label: {text}");
    }
    // The leader wrote the node's podCIDRs: a merge patch of a node, answered 200.
    let text = a.metrics().await;
    let patch = [
        ("code", "200"),
        ("method", "PATCH"),
        ("host", host.as_str()),
    ];
    assert!(
        metric(&text, "rest_client_requests_total", &patch).unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    let node_patch = [
        ("verb", "PATCH"),
        ("resource", "nodes"),
        ("subresource", ""),
        ("code", "200"),
    ];
    assert!(
        metric(&text, "nodeipam_api_requests_total", &node_patch).unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    a.assert_never_forbidden();

    // The leader stops and hands the Lease over: the standby's gauge turns 1.
    let mut a = a;
    a.signal(Signal::TERM);
    assert!(a.wait_exit().await.success(), "{}", a.log_tail());
    wait_for("replica-b: master status 1 after the hand-over", || async {
        (b.gauge("leader_election_master_status", &lease).await == Some(1.0)).then_some(())
    })
    .await;
    b.assert_never_forbidden();
    drop(b);
    cp.stop().await;
}
