//! End-to-end on a real cluster (`hack/cluster.sh`): kubelets with containerd and the CNI
//! bridge, kube-proxy, kube-scheduler and kube-controller-manager, and nodeipam deployed
//! in-cluster from its own image with `config/default`. What nodeipam writes is consumed:
//! nodes stay NotReady until they have a podCIDR, containerd writes the CNI config from it and
//! pods get their IPs from it; the API server reaches the webhook through its Service.
//!
//! One test, in order, because every step builds on the cluster the previous one left. It needs
//! root, `hack/cluster.sh build` and `hack/image.sh`; `hack/test.sh` runs them, then this with
//! `--ignored`. A failure names its step; `NODEIPAM_CLUSTER_KEEP=1` leaves the cluster up for
//! a look (`hack/cluster.sh kubectl ...`, logs in ~/.cache/nodeipam/cluster/logs).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::api::{GroupVersionKind, PostParams};
use kube::{Client, ResourceExt};
use nodeipam_testenv::{default_helm_path, workspace_root};
use serde_json::json;

#[path = "cluster/flannel.rs"]
mod flannel;
#[path = "support/scrape.rs"]
mod scrape;

const NAMESPACE: &str = "nodeipam-system";
const LEASE: &str = "nodeipam-controller";
const POD_NETWORK: &str = "nodeipam-pod-network";
/// The image every probe pod runs: the sandbox image, already on every node (no registry).
const PROBE_IMAGE: &str = "localhost/pause:nodeipam";
/// How long any one step may take before the test gives up on it (a limit, not an assertion).
const STEP_LIMIT: Duration = Duration::from_secs(180);
/// The samples' default pool and the GPU pool a labelled node gets its blocks from.
const DEFAULT_POOL: (&str, &str, &str) = ("dual-stack", "10.112.0.0/14", "fd00:10:64::/48");
const GPU_POOL: (&str, &str, &str) = ("gpu-pool", "10.116.0.0/20", "fd00:10:65::/56");
/// The metrics port of config/manager (host network: the node's address; HTTPS, callers
/// authenticated and authorized by the API server).
const METRICS_PORT: u16 = 8085;

// ----- the cluster, driven through hack/cluster.sh -----

/// The running cluster; `hack/cluster.sh down` when dropped, unless `NODEIPAM_CLUSTER_KEEP=1`.
struct Cluster {
    down_done: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.down_done || std::env::var_os("NODEIPAM_CLUSTER_KEEP").is_some_and(|v| v == "1") {
            return;
        }
        if let Err(e) = try_script(&["down"]) {
            eprintln!("cluster: down after a failure: {e}");
        }
    }
}

fn script_path() -> PathBuf {
    workspace_root().join("hack/cluster.sh")
}

/// Runs `hack/cluster.sh ARGS`; Ok(stdout) or Err(what failed, with the output's tail).
fn try_script(args: &[&str]) -> Result<String, String> {
    let out = Command::new(script_path())
        .args(args)
        .output()
        .map_err(|e| format!("run {} {args:?}: {e}", script_path().display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprint!("{stderr}");
    if !out.status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "hack/cluster.sh {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            tail.join("\n")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `hack/cluster.sh ARGS`, panicking with `step=STEP` when it fails.
fn script(step: &str, args: &[&str]) -> String {
    let began = Instant::now();
    let out = try_script(args).unwrap_or_else(|e| panic!("step={step}: {e}"));
    eprintln!(
        "cluster: step {step} took {:.1}s",
        began.elapsed().as_secs_f64()
    );
    out
}

async fn admin_client() -> Client {
    let path = dirs_cache().join("cluster/admin.kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("step=client: read {}: {e}", path.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("step=client: kubeconfig {}: {e}", path.display()));
    Client::try_from(config).unwrap_or_else(|e| panic!("step=client: {e}"))
}

/// `$NODEIPAM_CACHE`, as hack/lib.sh computes it.
fn dirs_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("NODEIPAM_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("step=client: HOME is not set"))
                .join(".cache")
        });
    base.join("nodeipam")
}

/// Polls `check` every 250 ms until it returns Some, for at most [`STEP_LIMIT`].
async fn wait_for<T, F, Fut>(step: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let began = Instant::now();
    loop {
        match check().await {
            Ok(v) => {
                eprintln!(
                    "cluster: {step}: done after {:.1}s",
                    began.elapsed().as_secs_f64()
                );
                return v;
            }
            Err(why) if began.elapsed() > STEP_LIMIT => {
                panic!("step={step}: not done within {STEP_LIMIT:?}: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

// ----- reading nodes, pods and configs -----

fn pod_cidrs(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

/// The node's Ready condition: (status, reason, message).
fn ready(node: &Node) -> (String, String, String) {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
        .unwrap_or_else(|| ("Unknown".into(), String::new(), String::new()))
}

fn is_ready(node: &Node) -> bool {
    ready(node).0 == "True"
}

fn node_ip(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .map(|a| a.address.clone())
        .unwrap_or_else(|| panic!("node {} has no InternalIP", node.name_any()))
}

fn net(cidr: &str) -> IpNet {
    cidr.parse()
        .unwrap_or_else(|e| panic!("not a CIDR {cidr:?}: {e}"))
}

fn inside(inner: &str, outer: &str) -> bool {
    let (i, o) = (net(inner), net(outer));
    o.contains(&i.network()) && o.contains(&i.broadcast())
}

fn config_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nodeipam.io", "v1alpha1", "NodeIPAMConfig");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

fn condition_status(cfg: &DynamicObject, type_: &str) -> Option<String> {
    cfg.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .and_then(|c| c["status"].as_str())
        .map(str::to_string)
}

/// Waits until node NAME is Ready with one podCIDR per family inside POOL's ranges, and checks
/// that it never was Ready without podCIDRs on the way.
async fn wait_ready_with_cidrs(client: &Client, name: &str, pool: (&str, &str, &str)) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = wait_for(
        &format!("node {name} Ready with podCIDRs from {}", pool.0),
        || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get(name).await.map_err(|e| e.to_string())?;
                let cidrs = pod_cidrs(&node);
                assert!(
                    !(is_ready(&node) && cidrs.is_empty()),
                    "step=nodes-wait-for-podcidrs: node {name} is Ready without a podCIDR"
                );
                if !is_ready(&node) {
                    return Err(format!(
                        "not Ready yet: {:?}, podCIDRs {cidrs:?}",
                        ready(&node)
                    ));
                }
                Ok(node)
            }
        },
    )
    .await;
    let cidrs = pod_cidrs(&node);
    assert_eq!(
        cidrs.len(),
        2,
        "node {name}: one podCIDR per family, got {cidrs:?}"
    );
    assert!(
        inside(&cidrs[0], pool.1) && inside(&cidrs[1], pool.2),
        "node {name}: podCIDRs {cidrs:?} are not inside {}'s {} and {}",
        pool.0,
        pool.1,
        pool.2
    );
    node
}

/// Runs a probe pod on NODE (through the scheduler) and checks that it gets one IP per
/// family, each inside the node's podCIDR of that family.
async fn probe_pod_ips(client: &Client, node: &Node) -> Vec<String> {
    let name = format!("probe-{}", node.name_any());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "nodeipam-probe"}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name_any()},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "pause",
                "image": PROBE_IMAGE,
                "imagePullPolicy": "Never",
            }],
        },
    }))
    .expect("probe pod manifest");
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("step=probe-pod: create {name}: {e}"));
    let running = wait_for(&format!("pod {name} Running with IPs"), || {
        let pods = pods.clone();
        let name = name.clone();
        async move {
            let pod = pods.get(&name).await.map_err(|e| e.to_string())?;
            let status = pod.status.clone().unwrap_or_default();
            if status.phase.as_deref() != Some("Running") {
                return Err(format!("phase {:?}: {:?}", status.phase, status.conditions));
            }
            Ok(pod)
        }
    })
    .await;
    let ips: Vec<String> = running
        .status
        .and_then(|s| s.pod_ips)
        .unwrap_or_default()
        .into_iter()
        .map(|ip| ip.ip)
        .collect();
    let cidrs = pod_cidrs(node);
    assert_eq!(
        ips.len(),
        cidrs.len(),
        "step=probe-pod: pod {name} has IPs {ips:?}, node podCIDRs {cidrs:?}: one IP per family"
    );
    for cidr in &cidrs {
        let range = net(cidr);
        assert!(
            ips.iter()
                .any(|ip| ip.parse::<IpAddr>().is_ok_and(|a| range.contains(&a))),
            "step=probe-pod: pod {name} IPs {ips:?}: none inside the node's podCIDR {cidr}"
        );
    }
    eprintln!(
        "cluster: pod {name} on {} has {ips:?} (podCIDRs {cidrs:?})",
        node.name_any()
    );
    ips
}

/// GET https://ADDR/metrics as a scraper holding `token` and the value of the sample named
/// exactly LINE.
async fn metric(addr: &str, sample: &str, token: &str) -> Result<f64, String> {
    let (status, body) = scrape::https_get(addr, "/metrics", Some(token)).await?;
    if status != 200 {
        return Err(format!(
            "GET https://{addr}/metrics answered {status}: {body}"
        ));
    }
    Ok(body
        .lines()
        .find_map(|l| l.strip_prefix(sample))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0))
}

async fn controller_pods(client: &Client) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // The component too: a failed `helm test` pod stays, with the same name label.
    let selector = "app.kubernetes.io/name=nodeipam,app.kubernetes.io/component=controller";
    pods.list(&ListParams::default().labels(selector))
        .await
        .unwrap_or_else(|e| panic!("list nodeipam pods: {e}"))
        .items
}

async fn lease_holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .map(|h| nodeipam_controller::app::holder_name(&h).to_string())
}

async fn pod_network(client: &Client) -> BTreeMap<String, String> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    cms.get_opt(POD_NETWORK)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.data)
        .unwrap_or_default()
}

fn in_pod_network(data: &BTreeMap<String, String>, cidr: &str) -> bool {
    ["ipv4", "ipv6"]
        .iter()
        .filter_map(|k| data.get(*k))
        .any(|v| v.split(',').any(|c| c.trim() == cidr))
}

// ----- pod network autoscaling -----

/// The pool of step 9: its budget per family, and its label on the nodes it serves.
const AUTOSCALE_POOL: (&str, &str, &str) = ("autoscale", "10.80.0.0/24", "fd00:10:80::/60");

fn pool_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nodeipam.io", "v1alpha1", "NodeIPAMPool");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// The pool's children: name and IPv4 range, lowest first.
async fn pool_children(client: &Client, pool: &str) -> Vec<(String, String)> {
    let selector = format!("nodeipam.io/pool={pool}");
    let list = config_api(client)
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap_or_else(|e| panic!("step=autoscale: list the children of {pool}: {e}"));
    let mut children: Vec<(String, String)> = list
        .items
        .iter()
        .map(|c| {
            let v4 = c.data["spec"]["ipv4"]["cidr"].as_str().unwrap_or_default();
            (c.name_any(), v4.to_string())
        })
        .collect();
    children.sort_by_key(|(_, v4)| net(v4).network().to_string());
    children
}

async fn autoscaling_pool_grows_on_a_real_cluster(client: &Client) {
    let (name, v4, v6) = AUTOSCALE_POOL;
    let pool: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMPool",
        "metadata": {"name": name},
        "spec": {
            "ipv4": {"cidrs": [v4], "rangeMaskSize": 25, "perNodeMaskSize": 26},
            "ipv6": {"cidrs": [v6], "rangeMaskSize": 63, "perNodeMaskSize": 64},
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nodeipam.io/pool", "operator": "In", "values": [name]},
            ]}]},
            "ranges": {"min": 1, "max": 2},
            // One block kept free: the second range is carved when the second node takes the
            // first range's last block, before the third node registers. Without headroom
            // the third node would take its blocks from the samples' catch-all config, which
            // matches every node and has room: a pool grows for a node only when no other
            // config can serve it (docs/pools.md).
            "headroom": {"blocks": 1},
        },
    }))
    .expect("pool manifest");
    pool_api(client)
        .create(&PostParams::default(), &pool)
        .await
        .unwrap_or_else(|e| {
            panic!("step=autoscale: create pool {name} (through the webhook): {e}")
        });
    let first = wait_for("the pool's first range", || async {
        match pool_children(client, name).await.as_slice() {
            [only] => Ok(only.clone()),
            other => Err(format!("children {other:?}")),
        }
    })
    .await;
    let label = format!("nodeipam.io/pool={name}");
    let mut joined = Vec::new();
    for _ in 0..3 {
        let added = script("autoscale-add-node", &["add-node", "--labels", &label]);
        let added = added.trim().to_string();
        joined.push(wait_ready_with_cidrs(client, &added, AUTOSCALE_POOL).await);
    }
    let children = pool_children(client, name).await;
    assert_eq!(
        children.len(),
        2,
        "step=autoscale: three nodes in ranges of two blocks, one kept free, need a second range: {children:?}"
    );
    assert_eq!(children[0], first, "step=autoscale: the first range stays");
    let second = &children[1];
    let third = &joined[2];
    let cidrs = pod_cidrs(third);
    assert!(
        inside(&cidrs[0], &second.1),
        "step=autoscale: the third node's {cidrs:?} is not in the carved range {second:?} \
         (the first range {first:?} fills first)"
    );
    let published = pod_network(client).await;
    assert!(
        in_pod_network(&published, &second.1),
        "step=autoscale: the carved range {} is in the published pod network: {published:?}",
        second.1
    );
    probe_pod_ips(client, third).await;
    eprintln!(
        "cluster: pool {name} carved {} for {} ({cidrs:?})",
        second.0,
        third.name_any()
    );
}

// ----- the Helm chart -----

/// The image the chart and config/default deploy unchanged: the release's, which
/// `hack/image.sh` builds as `hack/release.sh` ships it and imports into every node (no registry).
fn release_image() -> String {
    format!("nodeipam:v{}", env!("CARGO_PKG_VERSION"))
}
/// The API server's address from the nodes (hack/cluster/overlay gives config/default the same
/// with config/components/api-server): the nodes' kube-proxy programs no Service before its
/// Node has a podCIDR, so through the `kubernetes` Service nodeipam would wait for itself.
const API_SERVER: (&str, &str) = ("10.251.0.2", "6443");

/// Runs Helm against the cluster (`--kubeconfig` of the admin), with its state in `home`;
/// panics with `step=STEP` on failure. Returns stdout.
fn helm(step: &str, home: &std::path::Path, args: &[&str]) -> String {
    let bin = default_helm_path().unwrap_or_else(|e| panic!("step={step}: {e}"));
    assert!(
        bin.is_file(),
        "step={step}: no helm at {}: run `hack/helm.sh build` (hack/test.sh does)",
        bin.display()
    );
    let kubeconfig = dirs_cache().join("cluster/admin.kubeconfig");
    let began = Instant::now();
    let out = Command::new(&bin)
        .args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .unwrap_or_else(|e| panic!("step={step}: run {}: {e}", bin.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "step={step}: helm {args:?} failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    eprintln!(
        "cluster: step {step} took {:.1}s",
        began.elapsed().as_secs_f64()
    );
    stdout
}

/// Installs charts/nodeipam as release `nodeipam` in [`NAMESPACE`] with the local image and
/// the API server's address, and waits until the Deployment is available. What a user of the
/// chart runs, with this cluster's two values.
fn helm_install_chart(home: &std::path::Path, extra: &[&str]) -> String {
    let chart = workspace_root().join("charts/nodeipam");
    let chart = chart.to_string_lossy();
    let mut args = vec![
        "upgrade".to_string(),
        "--install".into(),
        "nodeipam".into(),
        chart.to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
        "--create-namespace".into(),
        "--set".into(),
        format!("apiServer.host={}", API_SERVER.0),
        "--set".into(),
        format!("apiServer.port={}", API_SERVER.1),
        "--wait".into(),
        "--timeout".into(),
        format!("{}s", STEP_LIMIT.as_secs()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm("helm-install", home, &args)
}

/// The chart installed for real: replicas on two nodes from the local image, nodes Ready with
/// podCIDRs from a config created afterwards, the webhook reached through its Service, then a
/// drain and `helm uninstall`. Not run in the session that wrote it (the real cluster is one
/// machine-wide resource); `hack/test.sh` runs it with the other `--ignored` cluster test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, hack/cluster.sh build, hack/image.sh and hack/helm.sh: hack/test.sh runs it with --ignored"]
async fn the_helm_chart_installs_on_a_real_cluster() {
    let mut cluster = Cluster { down_done: false };
    script("cluster-up", &["up", "--nodes", "2"]);
    let client = admin_client().await;
    let home = tempfile::tempdir().expect("step=helm-home: temp folder");

    helm_install_chart(home.path(), &[]);
    let replicas = controller_pods(&client).await;
    let on: BTreeMap<String, String> = replicas
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone())?;
            Some((node, p.name_any()))
        })
        .collect();
    assert_eq!(
        on.len(),
        2,
        "step=helm-install: two replicas on two nodes: {on:?}"
    );
    for pod in &replicas {
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone());
        assert_eq!(
            image.as_deref(),
            Some(release_image().as_str()),
            "step=helm-install: the chart's default image, the release's"
        );
    }

    // The webhook answers through its Service once a replica is ready and the caBundle is
    // patched in: until then (fail-closed) every config is refused, as `cluster.sh deploy`
    // waits for too.
    let configs = config_api(&client);
    wait_for("helm-webhook reachable through its Service", || {
        let configs = configs.clone();
        async move {
            let check = serde_json::from_value(json!({
                "apiVersion": "nodeipam.io/v1alpha1",
                "kind": "NodeIPAMConfig",
                "metadata": {"name": "nodeipam-helm-check"},
                "spec": {"ipv4": {"cidr": "198.51.100.0/24", "perNodeMaskSize": 28}},
            }))
            .map_err(|e| e.to_string())?;
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            configs
                .create(&dry_run, &check)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await;
    // A config through the webhook (its Service, the chart's ValidatingWebhookConfiguration),
    // then every node Ready with podCIDRs from it.
    script(
        "apply-samples",
        &[
            "kubectl",
            "apply",
            "-k",
            &workspace_root().join("config/samples").to_string_lossy(),
        ],
    );
    for name in ["node-1", "node-2"] {
        wait_ready_with_cidrs(&client, name, DEFAULT_POOL).await;
    }
    // `helm test`: its pod, on a node as the controller's are, reads the ranges through the
    // API server's address (it exits 0 only if it could).
    helm(
        "helm-test",
        home.path(),
        &[
            "test",
            "nodeipam",
            "--namespace",
            NAMESPACE,
            "--timeout",
            &format!("{}s", STEP_LIMIT.as_secs()),
        ],
    );
    let refused = config_api(&client)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "nodeipam.io/v1alpha1",
                "kind": "NodeIPAMConfig",
                "metadata": {"name": "overlaps-the-default-pool"},
                "spec": {"ipv4": {"cidr": "10.113.128.0/20", "perNodeMaskSize": 24}},
            }))
            .expect("config manifest"),
        )
        .await;
    match refused {
        Err(kube::Error::Api(s)) => assert!(
            s.message.contains("overlaps"),
            "step=helm-webhook: refused for another reason: {}",
            s.message
        ),
        other => panic!("step=helm-webhook: an overlapping config was not refused: {other:?}"),
    }

    // An upgrade with ip-masq-agent sync on. The ConfigMap must exist (RBAC cannot limit
    // `create` to one name, so the controller may only patch it): made empty first, as an
    // operator would, it then holds the pod network.
    let ip_masq: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    if ip_masq
        .get_opt("ip-masq-agent")
        .await
        .unwrap_or_else(|e| panic!("step=helm-ip-masq-agent: reading the ConfigMap: {e}"))
        .is_none()
    {
        let mut empty = ConfigMap::default();
        empty.metadata.name = Some("ip-masq-agent".into());
        ip_masq
            .create(&PostParams::default(), &empty)
            .await
            .unwrap_or_else(|e| panic!("step=helm-ip-masq-agent: creating the ConfigMap: {e}"));
    }
    helm_install_chart(home.path(), &["--set", "ipMasqAgent.enabled=true"]);
    wait_for("ip-masq-agent's ConfigMap holds the default pool", || {
        let ip_masq = ip_masq.clone();
        async move {
            let cm = ip_masq
                .get_opt("ip-masq-agent")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no ConfigMap yet")?;
            let config = cm
                .data
                .as_ref()
                .and_then(|d| d.get("config"))
                .cloned()
                .unwrap_or_default();
            if config.contains(DEFAULT_POOL.1) {
                Ok(())
            } else {
                Err(format!("config is {config:?}"))
            }
        }
    })
    .await;

    // Uninstall with configs still draining (their nodes hold blocks): the configs outlive the
    // controller, Terminating with our finalizer (docs/install.md), until it is released with
    // the command the docs give, which leaves any other finalizer alone.
    script(
        "delete-samples",
        &[
            "kubectl",
            "delete",
            "-k",
            &workspace_root().join("config/samples").to_string_lossy(),
            "--wait=false",
        ],
    );
    helm(
        "helm-uninstall",
        home.path(),
        &["uninstall", "nodeipam", "--namespace", NAMESPACE, "--wait"],
    );
    let left = script(
        "after-uninstall",
        &[
            "kubectl",
            "-n",
            NAMESPACE,
            "get",
            "deployment,service,role",
            "-o",
            "name",
        ],
    );
    assert!(
        left.trim().is_empty(),
        "step=helm-uninstall: left behind: {left}"
    );
    let stuck = config_api(&client)
        .get(DEFAULT_POOL.0)
        .await
        .unwrap_or_else(|e| panic!("step=finalizer-after-uninstall: {e}"));
    assert!(
        stuck.metadata.deletion_timestamp.is_some()
            && stuck
                .finalizers()
                .iter()
                .any(|f| f == "nodeipam.io/finalizer"),
        "step=finalizer-after-uninstall: {stuck:?}"
    );
    let index = stuck
        .finalizers()
        .iter()
        .position(|f| f == "nodeipam.io/finalizer")
        .expect("index");
    let patch = format!(
        r#"[{{"op":"test","path":"/metadata/finalizers/{index}","value":"nodeipam.io/finalizer"}},{{"op":"remove","path":"/metadata/finalizers/{index}"}}]"#
    );
    script(
        "release-finalizer",
        &[
            "kubectl",
            "patch",
            "nodeipamconfig",
            DEFAULT_POOL.0,
            "--type=json",
            "-p",
            &patch,
        ],
    );
    wait_for("the released config is gone", || {
        let configs = config_api(&client);
        async move {
            match configs.get_opt(DEFAULT_POOL.0).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    if let Err(e) = try_script(&["down"]) {
        eprintln!("cluster: first down failed, running it again: {e}");
    }
    script("cluster-down", &["down"]);
    cluster.down_done = true;
}

// ----- the test -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, hack/cluster.sh build and hack/image.sh: hack/test.sh runs it with --ignored"]
async fn a_real_cluster_consumes_what_nodeipam_allocates() {
    let began = Instant::now();
    let mut cluster = Cluster { down_done: false };

    // 1. Nodes come up NotReady: no podCIDR, so no CNI config, so no pod network.
    script("cluster-up", &["up", "--nodes", "2"]);
    let client = admin_client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes
        .list(&ListParams::default())
        .await
        .expect("list nodes");
    assert_eq!(
        listed.items.len(),
        2,
        "step=cluster-up: two nodes registered"
    );
    for node in &listed.items {
        assert!(
            pod_cidrs(node).is_empty() && !is_ready(node),
            "step=cluster-up: node {} should be NotReady with no podCIDR, is {:?} with {:?}",
            node.name_any(),
            ready(node),
            pod_cidrs(node)
        );
    }

    // 2. nodeipam deployed with config/default (its own image), in-cluster, two replicas on
    // two nodes. With no NodeIPAMConfig yet, the nodes stay NotReady.
    script("deploy-nodeipam", &["deploy"]);
    let replicas = controller_pods(&client).await;
    let on: Vec<String> = replicas
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    assert_eq!(on.len(), 2, "step=deploy-nodeipam: two replicas scheduled");
    assert_ne!(
        on[0], on[1],
        "step=deploy-nodeipam: anti-affinity: replicas on {on:?}"
    );
    // Booted through config/components/api-server: the API server's address from its
    // ConfigMap, the node's resolver.
    for pod in &replicas {
        let spec = pod.spec.as_ref().expect("pod spec");
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let from_config_map = |name: &str| {
            env.iter().any(|v| {
                v.name == name
                    && v.value_from
                        .as_ref()
                        .and_then(|f| f.config_map_key_ref.as_ref())
                        .is_some_and(|r| r.name.starts_with("nodeipam-api-server-"))
            })
        };
        assert!(
            from_config_map("KUBERNETES_SERVICE_HOST")
                && from_config_map("KUBERNETES_SERVICE_PORT"),
            "step=deploy-nodeipam: {} has no API server address from the component: {env:?}",
            pod.name_any()
        );
        assert_eq!(spec.dns_policy.as_deref(), Some("Default"));
    }
    for node in nodes
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
    {
        let (status, reason, message) = ready(&node);
        assert!(
            status != "True" && pod_cidrs(&node).is_empty(),
            "step=deploy-nodeipam: without a config node {} must stay NotReady, is {status} {reason} {message}",
            node.name_any()
        );
        eprintln!(
            "cluster: {} before any config: Ready={status} ({reason}: {message})",
            node.name_any()
        );
    }

    // 3. The samples (through the webhook): every node gets a dual-stack podCIDR pair from the
    // default pool, containerd writes the CNI config, and the node turns Ready.
    script(
        "apply-samples",
        &[
            "kubectl",
            "apply",
            "-k",
            &workspace_root().join("config/samples").to_string_lossy(),
        ],
    );
    let mut ready_nodes = Vec::new();
    for name in ["node-1", "node-2"] {
        ready_nodes.push(wait_ready_with_cidrs(&client, name, DEFAULT_POOL).await);
    }

    // 4. Pods on each node get one IP per family, inside that node's podCIDRs.
    for node in &ready_nodes {
        probe_pod_ips(&client, node).await;
    }

    // 5. The webhook, reached by the API server through its Service (kube-proxy's ClusterIP
    // rules; the API server has no aggregator routing), refuses an overlapping config.
    let configs = config_api(&client);
    let overlapping: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": {"name": "overlaps-the-default-pool"},
        "spec": {"ipv4": {"cidr": "10.113.128.0/20", "perNodeMaskSize": 24}},
    }))
    .expect("config manifest");
    let refused = configs
        .create(&PostParams::default(), &overlapping)
        .await
        .expect_err("step=webhook: an overlapping config was admitted");
    let refused = refused.to_string();
    assert!(
        refused.contains("overlaps") && refused.contains("dual-stack"),
        "step=webhook: expected the webhook's refusal naming dual-stack, got: {refused}"
    );
    eprintln!("cluster: overlapping config refused: {refused}");
    // Scraped as Prometheus would be: HTTPS, with the token of a ServiceAccount bound to the
    // metrics reader role; without a token the scrape is refused.
    let token = scrape::metrics_reader_token(&client, NAMESPACE, "nodeipam-e2e-scraper").await;
    let mut denied = 0.0;
    for node in &ready_nodes {
        let addr = format!("{}:{METRICS_PORT}", node_ip(node));
        let anonymous = scrape::https_get(&addr, "/metrics", None)
            .await
            .unwrap_or_else(|e| panic!("step=metrics-auth: {e}"));
        assert_eq!(
            anonymous.0, 401,
            "step=metrics-auth: a scrape without a token got {anonymous:?}"
        );
        denied += wait_for("webhook-metrics", || {
            let (addr, token) = (addr.clone(), token.clone());
            async move {
                metric(
                    &addr,
                    "nodeipam_webhook_admissions_total{result=\"denied\"}",
                    &token,
                )
                .await
            }
        })
        .await;
    }
    assert!(
        denied >= 1.0,
        "step=webhook-metrics: no denied admission counted"
    );

    // 6. Deleting the leader's pod hands the Lease to the other replica.
    let leader = wait_for("a leader holds the lease", || {
        let client = client.clone();
        async move { lease_holder(&client).await.ok_or("no holder".to_string()) }
    })
    .await;
    let standby: Vec<String> = controller_pods(&client)
        .await
        .iter()
        .map(|p| p.name_any())
        .filter(|n| *n != leader)
        .collect();
    assert_eq!(
        standby.len(),
        1,
        "step=failover: one standby besides {leader}"
    );
    // Its node is cordoned first, as in a drain: otherwise the replacement pod can start there
    // within a second and race the standby for the released Lease.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let leader_node = pods
        .get(&leader)
        .await
        .ok()
        .and_then(|p| p.spec)
        .and_then(|s| s.node_name)
        .unwrap_or_else(|| panic!("step=failover: the node of leader pod {leader}"));
    let cordon = |unschedulable: bool| {
        let nodes = nodes.clone();
        let node = leader_node.clone();
        async move {
            nodes
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
                )
                .await
                .unwrap_or_else(|e| panic!("step=failover: cordon={unschedulable} {node}: {e}"));
        }
    };
    cordon(true).await;
    pods.delete(&leader, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("step=failover: delete leader pod {leader}: {e}"));
    let new_leader = wait_for("the standby takes the lease", || {
        let client = client.clone();
        let leader = leader.clone();
        async move {
            match lease_holder(&client).await {
                Some(h) if h != leader => Ok(h),
                h => Err(format!("holder {h:?}")),
            }
        }
    })
    .await;
    assert_eq!(
        new_leader, standby[0],
        "step=failover: the standby is the new leader"
    );
    cordon(false).await;

    // 7. A node added to the running cluster, under the new leader: a GPU node, so its blocks
    // come from the GPU pool; it turns Ready and runs a pod from its podCIDRs.
    let added = script(
        "add-node",
        &["add-node", "--labels", "nodeipam.io/pool=gpu"],
    );
    let added = added.trim().to_string();
    let gpu_node = wait_ready_with_cidrs(&client, &added, GPU_POOL).await;
    probe_pod_ips(&client, &gpu_node).await;
    let published = pod_network(&client).await;
    assert!(
        in_pod_network(&published, GPU_POOL.1) && in_pod_network(&published, GPU_POOL.2),
        "step=add-node: the GPU pool is in the published pod network: {published:?}"
    );

    // 8. Draining a range: cordon the GPU pool, remove its node's pods and the node; the pool
    // reports Drained=True and leaves the published pod network.
    configs
        .patch(
            GPU_POOL.0,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allocation": "Disabled"}})),
        )
        .await
        .unwrap_or_else(|e| panic!("step=drain: disable {}: {e}", GPU_POOL.0));
    // The node drained as an operator would: cordoned, every pod on it deleted.
    nodes
        .patch(
            &added,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap_or_else(|e| panic!("step=drain: cordon {added}: {e}"));
    let all_pods: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={added}"));
    for pod in all_pods.list(&on_node).await.expect("list pods").items {
        let ns = pod.namespace().unwrap_or_default();
        Api::<Pod>::namespaced(client.clone(), &ns)
            .delete(&pod.name_any(), &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("step=drain: delete pod {ns}/{}: {e}", pod.name_any()));
    }
    wait_for(&format!("pods gone from {added}"), || {
        let all_pods = all_pods.clone();
        let on_node = on_node.clone();
        async move {
            let left = all_pods.list(&on_node).await.map_err(|e| e.to_string())?;
            if left.items.is_empty() {
                Ok(())
            } else {
                Err(format!("{} pod(s) left", left.items.len()))
            }
        }
    })
    .await;
    script("remove-node", &["remove-node", &added]);
    nodes
        .delete(&added, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("step=drain: delete node {added}: {e}"));
    wait_for(&format!("{} Drained=True", GPU_POOL.0), || {
        let configs = configs.clone();
        async move {
            let cfg = configs.get(GPU_POOL.0).await.map_err(|e| e.to_string())?;
            match condition_status(&cfg, "Drained").as_deref() {
                Some("True") => Ok(()),
                other => Err(format!("Drained={other:?}")),
            }
        }
    })
    .await;
    let published = wait_for("the GPU pool leaves the pod network", || {
        let client = client.clone();
        async move {
            let data = pod_network(&client).await;
            if in_pod_network(&data, GPU_POOL.1) || in_pod_network(&data, GPU_POOL.2) {
                Err(format!("still published: {data:?}"))
            } else {
                Ok(data)
            }
        }
    })
    .await;
    assert!(
        in_pod_network(&published, DEFAULT_POOL.1) && in_pod_network(&published, DEFAULT_POOL.2),
        "step=drain: the default pool stays published: {published:?}"
    );

    // 9. Pod network autoscaling: a NodeIPAMPool of ranges of two blocks per family. Three
    // labelled nodes join; the second uses up the first range, the controller carves a second
    // one with no manual step and publishes it, and the third node's pods get IPs from it.
    autoscaling_pool_grows_on_a_real_cluster(&client).await;

    // 10. Down, checked: nothing of the cluster is left on the host. A first `down` has twice
    // exited 1 without a word in many runs (its ERR trap now names the command); a second one
    // then finished the job, and its own check of what is left is what this step asserts.
    if let Err(e) = try_script(&["down"]) {
        eprintln!("cluster: first down failed, running it again: {e}");
    }
    script("cluster-down", &["down"]);
    cluster.down_done = true;
    eprintln!("cluster: whole test {:.1}s", began.elapsed().as_secs_f64());
}

/// flannel as the cluster's CNI, on nodes from two discontiguous configs and a pool inside its
/// one Network: pods talk across nodes un-NATed, leave the pod network NATed, reach a Service
/// on another node, and keep talking while the pool grows and a range drains
/// (tests/tests/cluster/flannel.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, hack/cluster.sh build and hack/image.sh: hack/test.sh runs it with --ignored"]
async fn flannel_carries_pod_traffic_across_discontiguous_ranges() {
    flannel::flannel_carries_pod_traffic().await;
}

/// flannel's host-gw backend beside vxlan: the same traffic between two discontiguous configs
/// (tests/tests/cluster/flannel.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root, hack/cluster.sh build and hack/image.sh: hack/test.sh runs it with --ignored"]
async fn flannel_host_gw_carries_pod_traffic_across_discontiguous_ranges() {
    flannel::flannel_host_gw_carries_pod_traffic().await;
}
