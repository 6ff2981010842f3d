//! The real cluster with flannel as its CNI (`hack/cluster.sh up --cni flannel`): real pods
//! exchange real packets across nodes whose podCIDRs come from two discontiguous
//! NodeIPAMConfigs and a NodeIPAMPool, all inside flannel's one `Network` (docs/integrations.md,
//! flannel). The pods run `netprobe` (hack/cluster/netprobe), which answers each connection
//! with the address it came from, so every check also says whether the packet was NATed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::api::{WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use nodeipam_testenv::workspace_root;
use serde_json::json;

use super::{
    Cluster, admin_client, condition_status, config_api, dirs_cache, inside, is_ready, node_ip,
    pod_cidrs, pod_network, pool_api, pool_children, ready, script, script_path, try_script,
    wait_for,
};

/// flannel's `Network`: the supernet every config and pool below lies in. Apart from the
/// Service CIDR (10.96.0.0/16) and the nodes' 10.251.0.0/24, as the docs require.
const NETWORK: &str = "10.112.0.0/12";
/// Two NodeIPAMConfigs, never contiguous, each for the nodes labelled with its name.
const RANGE_A: (&str, &str) = ("flannel-a", "10.112.0.0/24");
const RANGE_B: (&str, &str) = ("flannel-b", "10.120.0.0/24");
/// The pool: ranges of two /26 blocks out of its budget, one block kept free.
const POOL: (&str, &str) = ("flannel-pool", "10.124.0.0/23");
const RANGE_LABEL: &str = "nodeipam.io/flannel-range";
const NETPROBE_IMAGE: &str = "localhost/netprobe:nodeipam";
const PROBE_PORT: u16 = 8080;
/// The host's end of the nodes' bridge: outside the pod network.
const HOST_IP: &str = "10.251.0.1";

/// A node of the test: its name, IP, podCIDR and its netprobe pod's IP.
#[derive(Clone, Debug)]
struct Member {
    node: String,
    node_ip: String,
    pod_cidr: String,
    pod: String,
    pod_ip: String,
}

fn probe_pod_name(node: &str) -> String {
    format!("netprobe-{node}")
}

/// `netprobe get ADDR PORT` inside pod FROM: what the receiver saw as the sender's address.
fn probe(from: &str, addr: &str, port: u16) -> Result<String, String> {
    let port = port.to_string();
    try_script(&[
        "kubectl",
        "exec",
        "-n",
        "default",
        from,
        "--",
        "/netprobe",
        "get",
        addr,
        &port,
    ])
    .map(|out| out.trim().to_string())
}

/// Waits until pod FROM reaches ADDR:PORT, and returns the address the receiver saw.
async fn reach(from: &str, addr: &str, port: u16) -> String {
    wait_for(&format!("{from} reaches {addr}:{port}"), || async {
        probe(from, addr, port)
    })
    .await
}

/// Creates the netprobe server pod on NODE (not waiting for it).
async fn create_probe_pod(client: &Client, node: &str) {
    let name = probe_pod_name(node);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "netprobe", "netprobe-node": node}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "netprobe",
                "image": NETPROBE_IMAGE,
                "imagePullPolicy": "Never",
                "args": ["serve", PROBE_PORT.to_string()],
            }],
        },
    }))
    .expect("netprobe pod manifest");
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("step=flannel-pods: create {name}: {e}"));
}

/// Waits for NODE's netprobe pod to run; its IP must lie in the node's podCIDR.
async fn probe_pod_ip(client: &Client, node: &Node) -> String {
    let name = probe_pod_name(&node.name_any());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let ip = wait_for(&format!("pod {name} Running"), || async {
        let pod = pods.get(&name).await.map_err(|e| e.to_string())?;
        let status = pod.status.unwrap_or_default();
        match (status.phase.as_deref(), status.pod_ip) {
            (Some("Running"), Some(ip)) => Ok(ip),
            (phase, _) => Err(format!("phase {phase:?}")),
        }
    })
    .await;
    let cidr = &pod_cidrs(node)[0];
    assert!(
        inside(&format!("{ip}/32"), cidr),
        "step=flannel-pods: pod {name} IP {ip} is not in its node's podCIDR {cidr}"
    );
    ip
}

/// Waits until NODE is Ready with one IPv4 podCIDR inside RANGE, and flanneld has taken that
/// podCIDR as its lease (NetworkUnavailable=False, reason FlannelIsUp).
async fn wait_flannel_node(client: &Client, name: &str, range: &str) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = wait_for(&format!("node {name} Ready, flannel up"), || async {
        let node = nodes.get(name).await.map_err(|e| e.to_string())?;
        let flannel = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "NetworkUnavailable"))
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()));
        match flannel {
            Some((s, r)) if s == "False" && r == "FlannelIsUp" && is_ready(&node) => Ok(node),
            other => Err(format!(
                "Ready {:?}, NetworkUnavailable {other:?}, podCIDRs {:?}",
                ready(&node),
                pod_cidrs(&node)
            )),
        }
    })
    .await;
    let cidrs = pod_cidrs(&node);
    assert!(
        cidrs.len() == 1 && inside(&cidrs[0], range) && inside(&cidrs[0], NETWORK),
        "step=flannel-nodes: node {name}: podCIDRs {cidrs:?}, want one inside {range} and {NETWORK}"
    );
    node
}

async fn member(client: &Client, name: &str, range: &str) -> Member {
    let node = wait_flannel_node(client, name, range).await;
    let pod_ip = probe_pod_ip(client, &node).await;
    Member {
        node: name.to_string(),
        node_ip: node_ip(&node),
        pod_cidr: pod_cidrs(&node)[0].clone(),
        pod: probe_pod_name(name),
        pod_ip,
    }
}

/// Every pod reaches every other node's pod by pod IP, and the receiver sees the sender's pod
/// IP: no NAT between ranges of the supernet.
async fn check_mesh(members: &[Member]) {
    for from in members {
        for to in members.iter().filter(|m| m.node != from.node) {
            let seen = reach(&from.pod, &to.pod_ip, PROBE_PORT).await;
            assert_eq!(
                seen, from.pod_ip,
                "step=flannel-mesh: {} ({}) -> {} ({}): the receiver saw {seen}, not the sender's pod IP",
                from.pod, from.node, to.pod, to.node
            );
        }
    }
    eprintln!(
        "cluster: flannel: {} pods reach each other un-NATed",
        members.len()
    );
}

/// flannel's route on each node to every other node's podCIDR is its BACKEND's: over the
/// vxlan device, or with host-gw via the other node's IP on the shared segment, so that the
/// test shows which backend carried the traffic.
fn check_routes(backend: &str, members: &[Member]) {
    for from in members {
        for to in members.iter().filter(|m| m.node != from.node) {
            let ns = format!("nipam-{}", from.node);
            let out = Command::new("ip")
                .args(["netns", "exec", &ns, "ip", "route", "show", &to.pod_cidr])
                .output()
                .unwrap_or_else(|e| panic!("step=flannel-routes: ip netns exec {ns}: {e}"));
            let route = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let want = match backend {
                "host-gw" => format!("via {} dev eth0", to.node_ip),
                _ => "dev flannel.1".to_string(),
            };
            assert!(
                route.contains(&want),
                "step=flannel-routes: on {} the route to {}'s podCIDR {} is `{route}`, want `{want}` ({backend})",
                from.node,
                to.node,
                to.pod_cidr
            );
        }
    }
    eprintln!("cluster: flannel: every node routes to the others' podCIDRs by {backend}");
}

/// A listener on the host's side of the bridge (outside the pod network) answering each
/// connection with its source, as netprobe does; returns its port.
fn host_listener() -> u16 {
    let listener = TcpListener::bind((HOST_IP, 0))
        .unwrap_or_else(|e| panic!("step=flannel-masquerade: listen on {HOST_IP}: {e}"));
    let port = listener.local_addr().expect("listener address").port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            if let Ok(peer) = conn.peer_addr() {
                let _ = writeln!(conn, "{}", peer.ip());
            }
        }
    });
    port
}

/// A pod reaching an address outside the pod network leaves as its node's IP.
async fn check_masquerade(members: &[Member]) {
    let port = host_listener();
    for m in members {
        let seen = reach(&m.pod, HOST_IP, port).await;
        assert_eq!(
            seen, m.node_ip,
            "step=flannel-masquerade: {} -> {HOST_IP}: seen as {seen}, want its node {}'s IP",
            m.pod, m.node
        );
    }
    eprintln!("cluster: flannel: traffic leaving the pod network is masqueraded to the node's IP");
}

/// A ClusterIP Service backed by FROM's pod answers TO's pod.
async fn check_service(client: &Client, backend: &Member, client_pod: &Member) {
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "netprobe"},
        "spec": {
            "selector": {"netprobe-node": backend.node},
            "ports": [{"port": 80, "targetPort": PROBE_PORT}],
        },
    }))
    .expect("service manifest");
    let created = services
        .create(&PostParams::default(), &svc)
        .await
        .unwrap_or_else(|e| panic!("step=flannel-service: create: {e}"));
    let ip = created
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("step=flannel-service: no ClusterIP");
    let seen = reach(&client_pod.pod, &ip, 80).await;
    assert_eq!(
        seen, client_pod.pod_ip,
        "step=flannel-service: {} -> Service {ip} (backed by {} on {}): the backend saw {seen}",
        client_pod.pod, backend.pod, backend.node
    );
    eprintln!(
        "cluster: flannel: Service {ip} on {} answers {} on {}",
        backend.node, client_pod.pod, client_pod.node
    );
}

fn labelled_config(name: &str, cidr: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": {"name": name},
        "spec": {
            "ipv4": {"cidr": cidr, "perNodeMaskSize": 26},
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": RANGE_LABEL, "operator": "In", "values": [name]},
            ]}]},
        },
    }))
    .expect("config manifest")
}

fn pool() -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMPool",
        "metadata": {"name": POOL.0},
        "spec": {
            "ipv4": {"cidrs": [POOL.1], "rangeMaskSize": 25, "perNodeMaskSize": 26},
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "nodeipam.io/pool", "operator": "In", "values": [POOL.0]},
            ]}]},
            "ranges": {"min": 1, "max": 2},
            "headroom": {"blocks": 1},
        },
    }))
    .expect("pool manifest")
}

/// What one node's arrival cost: from `add-node` to its Node object (the node's processes
/// starting), from there to its podCIDR, and to its pod first answering a pod of another node.
struct Arrival {
    name: String,
    range: String,
    to_node: Duration,
    to_pod_cidr: Duration,
    to_answer: Duration,
}

/// Watches node NAME (from before it exists) and returns when its Node object arrived and when
/// it first had a podCIDR, both as the watch delivered them: the difference is nodeipam's part.
async fn watch_arrival(client: &Client, name: &str) -> tokio::task::JoinHandle<(Instant, Instant)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let by_name = format!("metadata.name={name}");
    let listed = nodes
        .list_metadata(&ListParams::default().fields(&by_name))
        .await
        .unwrap_or_else(|e| panic!("step=flannel-arrival: list nodes: {e}"));
    let version = listed.metadata.resource_version.unwrap_or_default();
    let events = nodes
        .watch(
            &WatchParams::default().fields(&by_name).timeout(290),
            &version,
        )
        .await
        .unwrap_or_else(|e| panic!("step=flannel-arrival: watch node {name}: {e}"));
    let name = name.to_string();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut added = None;
        while let Some(event) = events.next().await {
            let node = match event {
                Ok(WatchEvent::Added(n) | WatchEvent::Modified(n)) => n,
                other => panic!("step=flannel-arrival: watching {name}: {other:?}"),
            };
            let first = *added.get_or_insert_with(Instant::now);
            if !pod_cidrs(&node).is_empty() {
                return (first, Instant::now());
            }
        }
        panic!("step=flannel-arrival: the watch of {name} ended before it had a podCIDR")
    })
}

/// Adds a node labelled for the pool, creates its pod at once, and measures its arrival up to
/// its pod answering OLDER's pod.
async fn add_pool_node(client: &Client, older: &Member) -> (Member, Arrival) {
    let name = format!("node-{}", next_node_index());
    let watcher = watch_arrival(client, &name).await;
    let label = format!("nodeipam.io/pool={}", POOL.0);
    let started = Instant::now();
    let added = script("flannel-add-node", &["add-node", "--labels", &label]);
    assert_eq!(added.trim(), name, "step=flannel-add-node: the node's name");
    create_probe_pod(client, &name).await;
    let (first_seen, has_cidr) = watcher.await.expect("arrival watcher");
    let new = member(client, &name, POOL.1).await;
    reach(&older.pod, &new.pod_ip, PROBE_PORT).await;
    let answered = Instant::now();
    let range = pod_cidrs(
        &Api::<Node>::all(client.clone())
            .get(&name)
            .await
            .expect("node"),
    )[0]
    .clone();
    let arrival = Arrival {
        name,
        range,
        to_node: first_seen - started,
        to_pod_cidr: has_cidr - first_seen,
        to_answer: answered - first_seen,
    };
    eprintln!(
        "cluster: flannel: measured {}: add-node -> Node object {:.2}s; Node -> podCIDR {} {:.3}s (nodeipam); Node -> its pod answering {} across nodes {:.2}s",
        arrival.name,
        arrival.to_node.as_secs_f64(),
        arrival.range,
        arrival.to_pod_cidr.as_secs_f64(),
        older.pod,
        arrival.to_answer.as_secs_f64()
    );
    (new, arrival)
}

/// The index hack/cluster.sh gives the next node (the first free node-N folder).
fn next_node_index() -> usize {
    let nodes = dirs_cache().join("cluster/nodes");
    (1..)
        .find(|i| !nodes.join(format!("node-{i}")).exists())
        .expect("a free index")
}

/// How many times each node's flanneld has exited so far (hack/cluster.sh logs each restart).
fn flanneld_exits(members: &[Member]) -> BTreeMap<String, usize> {
    members
        .iter()
        .map(|m| {
            let log = dirs_cache().join(format!("cluster/logs/flanneld-{}.log", m.node));
            let text = std::fs::read_to_string(&log)
                .unwrap_or_else(|e| panic!("step=flannel-restarts: read {}: {e}", log.display()));
            (m.node.clone(), text.matches("flanneld exited").count())
        })
        .collect()
}

/// Each node's kube-proxy process id, if it still runs (hack/cluster.sh does not restart it:
/// one that exited would be gone).
fn kube_proxies(members: &[Member]) -> BTreeMap<String, Option<String>> {
    members
        .iter()
        .map(|m| {
            let file = dirs_cache().join(format!("cluster/pids/kube-proxy-{}", m.node));
            let pid = std::fs::read_to_string(&file)
                .ok()
                .map(|p| p.trim().to_string())
                .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
            (m.node.clone(), pid)
        })
        .collect()
}

async fn controller_restarts(client: &Client) -> i32 {
    super::controller_pods(client)
        .await
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .map(|c| c.restart_count)
        .sum()
}

/// (3) The pool grows while the cluster runs: the next node takes the first range's last
/// block, the pool carves a second range, and a node on it talks with the older pods. No
/// flanneld restarts (flannel reads nodes' subnets at run time), nor kube-proxy, nor nodeipam.
async fn check_pool_growth(client: &Client, members: &mut Vec<Member>) -> Vec<Arrival> {
    let exits = flanneld_exits(members);
    let proxies = kube_proxies(members);
    assert!(
        proxies.values().all(Option::is_some),
        "step=flannel-pool-growth: every node runs a kube-proxy: {proxies:?}"
    );
    let restarts = controller_restarts(client).await;
    let older = members[0].clone();
    let mut arrivals = Vec::new();
    for _ in 0..2 {
        let (new, arrival) = add_pool_node(client, &older).await;
        members.push(new);
        arrivals.push(arrival);
    }
    let children = pool_children(client, POOL.0).await;
    assert_eq!(
        children.len(),
        2,
        "step=flannel-pool-growth: the pool carved a second range: {children:?}"
    );
    let newest = arrivals.last().expect("an arrival");
    assert!(
        inside(&newest.range, &children[1].1),
        "step=flannel-pool-growth: {} got {}, not from the carved range {:?}",
        newest.name,
        newest.range,
        children[1]
    );
    check_mesh(members).await;
    let old: Vec<Member> = members
        .iter()
        .filter(|m| exits.contains_key(&m.node))
        .cloned()
        .collect();
    assert_eq!(
        flanneld_exits(&old),
        exits,
        "step=flannel-pool-growth: an older node's flanneld restarted"
    );
    assert_eq!(
        controller_restarts(client).await,
        restarts,
        "step=flannel-pool-growth: nodeipam restarted"
    );
    assert_eq!(
        kube_proxies(&old),
        proxies,
        "step=flannel-pool-growth: an older node's kube-proxy is not the process it was"
    );
    arrivals
}

/// Keeps asking, from each pod of PAIR to the other, until told to stop; counts failures.
fn keep_talking(
    pair: (Member, Member),
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, Vec<String>)> {
    std::thread::spawn(move || {
        let (mut ok, mut failed) = (0, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            for (from, to) in [(&pair.0, &pair.1), (&pair.1, &pair.0)] {
                match probe(&from.pod, &to.pod_ip, PROBE_PORT) {
                    Ok(seen) if seen == from.pod_ip => ok += 1,
                    other => failed.push(format!("{} -> {}: {other:?}", from.pod, to.pod)),
                }
            }
        }
        (ok, failed)
    })
}

/// One connection from FROM's pod to TO's echo port, held (a line every 100 ms) until the
/// returned child's stdin is closed; returns once the connection is up.
fn hold_connection(from: &Member, to: &Member) -> Child {
    let port = (PROBE_PORT + 1).to_string();
    let mut child = Command::new(super::script_path())
        .args(["kubectl", "exec", "-i", "-n", "default", &from.pod, "--"])
        .args(["/netprobe", "hold", &to.pod_ip, &port])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("step=flannel-hold: run kubectl exec: {e}"));
    let mut first = String::new();
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let _ = BufReader::new(stdout).read_line(&mut first);
    assert_eq!(
        first.trim(),
        "connected",
        "step=flannel-hold: {} -> {}:{port} did not connect",
        from.pod,
        to.pod_ip
    );
    child
}

/// Ends a held connection: Ok(lines answered) if it never broke.
fn release_connection(mut child: Child) -> Result<u64, String> {
    drop(child.stdin.take());
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wait for kubectl exec: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.trim().parse() {
        Ok(lines) if out.status.success() => Ok(lines),
        _ => Err(format!(
            "{}: {stdout} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )),
    }
}

/// (4) Range B drains: allocation disabled, its node drained and removed; Drained=True, and
/// only then does the range leave the published pod network. Two remaining pods keep talking
/// throughout: one connection held open across the whole drain, and new ones made meanwhile.
async fn check_drain(client: &Client, members: &mut Vec<Member>) {
    let (gone, rest): (Vec<Member>, Vec<Member>) =
        members.iter().cloned().partition(|m| m.node == "node-2");
    let gone = gone.into_iter().next().expect("node-2 is range B's node");
    let (first, last) = (rest[0].clone(), rest[rest.len() - 1].clone());
    let held = hold_connection(&first, &last);
    let stop = Arc::new(AtomicBool::new(false));
    let talker = keep_talking((first.clone(), last.clone()), stop.clone());

    config_api(client)
        .patch(
            RANGE_B.0,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allocation": "Disabled"}})),
        )
        .await
        .unwrap_or_else(|e| panic!("step=flannel-drain: disable {}: {e}", RANGE_B.0));
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &gone.node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap_or_else(|e| panic!("step=flannel-drain: cordon {}: {e}", gone.node));
    let all_pods: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={}", gone.node));
    for pod in all_pods.list(&on_node).await.expect("list pods").items {
        let ns = pod.namespace().unwrap_or_default();
        Api::<Pod>::namespaced(client.clone(), &ns)
            .delete(&pod.name_any(), &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("step=flannel-drain: delete {ns}/{}: {e}", pod.name_any()));
    }
    wait_for(&format!("pods gone from {}", gone.node), || async {
        let left = all_pods.list(&on_node).await.map_err(|e| e.to_string())?;
        match left.items.len() {
            0 => Ok(()),
            n => Err(format!("{n} left")),
        }
    })
    .await;
    script("flannel-remove-node", &["remove-node", &gone.node]);
    nodes
        .delete(&gone.node, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("step=flannel-drain: delete node {}: {e}", gone.node));
    // Read the published network first, then the condition: a range gone from the network
    // while its config is not yet Drained would be caught in that window.
    let polls = AtomicUsize::new(0);
    wait_for(&format!("{} Drained, then unpublished", RANGE_B.0), || async {
        polls.fetch_add(1, Ordering::Relaxed);
        let published = pod_network(client).await;
        let cfg = config_api(client)
            .get(RANGE_B.0)
            .await
            .map_err(|e| e.to_string())?;
        let drained = condition_status(&cfg, "Drained");
        let listed = super::in_pod_network(&published, RANGE_B.1);
        assert!(
            listed || drained.as_deref() == Some("True"),
            "step=flannel-drain: {} left the published network {published:?} while Drained={drained:?}",
            RANGE_B.1
        );
        if listed {
            Err(format!("still published; Drained={drained:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let lines = release_connection(held).unwrap_or_else(|e| {
        panic!(
            "step=flannel-drain: the connection {} -> {} broke during the drain: {e}",
            first.pod, last.pod
        )
    });
    let (ok, failed) = talker.join().expect("talker thread");
    assert!(
        failed.is_empty() && ok > 0,
        "step=flannel-drain: remaining pods {} and {} stopped talking during the drain: {ok} answers, failures {failed:?}",
        first.pod,
        last.pod
    );
    eprintln!(
        "cluster: flannel: {} drained and unpublished after {} polls; meanwhile {ok} new connections and one held open ({lines} lines echoed) between remaining pods",
        RANGE_B.0,
        polls.load(Ordering::Relaxed)
    );
    *members = rest;
    check_mesh(members).await;
}

/// Brings the cluster up with flannel's BACKEND and deploys nodeipam as users do, without
/// `--pod-network-supernet`: it learns flannel's Network from the kube-flannel-cfg ConfigMap
/// that `up --cni flannel` publishes. Checks the webhook's warning outside it and that the
/// samples get none; node-1 and node-2 are labelled for configs A and B, which are created.
async fn start(backend: &str) -> Client {
    script(
        "flannel-cluster-up",
        &[
            "up",
            "--nodes",
            "2",
            "--cni",
            "flannel",
            "--flannel-network",
            NETWORK,
            "--flannel-backend",
            backend,
        ],
    );
    let client = admin_client().await;
    script("flannel-deploy-nodeipam", &["deploy"]);
    check_supernet_warning();
    check_samples_inside();
    for (node, range) in [("node-1", RANGE_A.0), ("node-2", RANGE_B.0)] {
        script(
            "flannel-label",
            &[
                "kubectl",
                "label",
                "node",
                node,
                &format!("{RANGE_LABEL}={range}"),
            ],
        );
    }
    let configs = config_api(&client);
    for (name, cidr) in [RANGE_A, RANGE_B] {
        configs
            .create(&PostParams::default(), &labelled_config(name, cidr))
            .await
            .unwrap_or_else(|e| panic!("step=flannel-configs: create {name}: {e}"));
    }
    client
}

/// A netprobe pod on node-1 (config A) and node-2 (config B), once each runs.
async fn first_members(client: &Client) -> Vec<Member> {
    for node in ["node-1", "node-2"] {
        create_probe_pod(client, node).await;
    }
    vec![
        member(client, "node-1", RANGE_A.1).await,
        member(client, "node-2", RANGE_B.1).await,
    ]
}

/// `kubectl ARGS --dry-run=server` in the cluster: whether it was admitted, and what kubectl
/// printed on stderr (where the webhook's warnings go).
fn dry_run_args(args: &[&str]) -> (bool, String) {
    let out = Command::new(script_path())
        .arg("kubectl")
        .args(args)
        .args(["--dry-run=server", "-o", "name"])
        .output()
        .unwrap_or_else(|e| panic!("step=flannel-samples: run kubectl {args:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The samples (config/samples, and its pool applied on its own) lie in flannel's Network of
/// the local cluster: admitted with no warning, before configs A and B exist (the samples'
/// default pool holds A's range).
fn check_samples_inside() {
    let samples = workspace_root().join("config/samples");
    let pool = samples.join("nodeipam_v1alpha1_pool.yaml");
    for args in [
        ["create", "-k", &samples.to_string_lossy()],
        ["create", "-f", &pool.to_string_lossy()],
    ] {
        let (ok, stderr) = dry_run_args(&args);
        assert!(
            ok && !stderr.contains("Warning"),
            "step=flannel-samples: kubectl {args:?} in flannel's Network {NETWORK}: admitted {ok}, {stderr}"
        );
    }
    eprintln!("cluster: flannel: the samples are admitted inside flannel's Network, no warning");
}

/// `kubectl create --dry-run=server` of OBJECT in the cluster: whether it was admitted, and
/// what kubectl printed on stderr (where the webhook's warnings go).
fn dry_run(object: &DynamicObject) -> (bool, String) {
    let mut child = Command::new(script_path())
        .args([
            "kubectl",
            "create",
            "--dry-run=server",
            "-o",
            "name",
            "-f",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("step=flannel-supernet: run kubectl: {e}"));
    let manifest = serde_json::to_string(object).expect("a manifest");
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(manifest.as_bytes())
            .unwrap_or_else(|e| panic!("step=flannel-supernet: write to kubectl: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("step=flannel-supernet: kubectl: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), stderr)
}

/// The in-cluster webhook, deployed without `--pod-network-supernet`, warns of a config
/// outside flannel's Network (flanneld exits on a podCIDR outside it) and still admits it; a
/// config inside gets no warning. The Network was learnt from flannel's ConfigMap.
fn check_supernet_warning() {
    const WARNING: &str = "is outside the declared pod network";
    let outside = "10.200.0.0/24";
    let (ok, stderr) = dry_run(&labelled_config("flannel-outside", outside));
    assert!(ok, "step=flannel-supernet: {outside} was refused: {stderr}");
    let want = format!("spec.ipv4.cidr: {outside} {WARNING} ({NETWORK}, --pod-network-supernet)");
    assert!(
        stderr.contains(&want),
        "step=flannel-supernet: no warning `{want}` for a config outside flannel's Network: {stderr}"
    );
    let (ok, stderr) = dry_run(&labelled_config("flannel-inside", "10.127.0.0/24"));
    assert!(
        ok && !stderr.contains(WARNING),
        "step=flannel-supernet: a config inside flannel's Network: admitted {ok}, {stderr}"
    );
    eprintln!("cluster: flannel: the webhook warns of a config outside flannel's Network");
}

pub async fn flannel_carries_pod_traffic() {
    let began = Instant::now();
    let mut cluster = Cluster { down_done: false };
    let client = start("vxlan").await;
    pool_api(&client)
        .create(&PostParams::default(), &pool())
        .await
        .unwrap_or_else(|e| panic!("step=flannel-configs: create pool {}: {e}", POOL.0));
    wait_for("the pool's first range", || async {
        match pool_children(&client, POOL.0).await.len() {
            1 => Ok(()),
            n => Err(format!("{n} children")),
        }
    })
    .await;
    let mut members = first_members(&client).await;
    let (third, first_arrival) = add_pool_node(&client, &members[0]).await;
    members.push(third);

    // (1) pod to pod across the three sources, un-NATed; (2) out of the pod network, NATed;
    // (5) a Service on one node answering a pod on another.
    check_mesh(&members).await;
    check_routes("vxlan", &members);
    check_masquerade(&members).await;
    check_service(&client, &members[0], &members[2]).await;
    // (3) the pool grows; (4) range B drains.
    let mut arrivals = vec![first_arrival];
    arrivals.extend(check_pool_growth(&client, &mut members).await);
    check_drain(&client, &mut members).await;

    for a in &arrivals {
        eprintln!(
            "cluster: flannel: arrival {} ({}): add-node -> Node {:.2}s, Node -> podCIDR {:.3}s, Node -> first answer across nodes {:.2}s",
            a.name,
            a.range,
            a.to_node.as_secs_f64(),
            a.to_pod_cidr.as_secs_f64(),
            a.to_answer.as_secs_f64()
        );
    }
    down(&mut cluster, "flannel", began);
}

/// Takes the cluster down (a second `down` if the first left something) and says how long
/// the test WHAT took.
fn down(cluster: &mut Cluster, what: &str, began: Instant) {
    if let Err(e) = try_script(&["down"]) {
        eprintln!("cluster: first down failed, running it again: {e}");
    }
    script("flannel-cluster-down", &["down"]);
    cluster.down_done = true;
    eprintln!("cluster: {what} test {:.1}s", began.elapsed().as_secs_f64());
}

/// flannel's host-gw backend (routes to each node's podCIDR via the node, no encapsulation)
/// carries the same traffic between two discontiguous configs: pod to pod un-NATed, out of the
/// pod network NATed, and a Service on one node answering a pod on the other.
pub async fn flannel_host_gw_carries_pod_traffic() {
    let began = Instant::now();
    let mut cluster = Cluster { down_done: false };
    let client = start("host-gw").await;
    let members = first_members(&client).await;
    check_mesh(&members).await;
    check_routes("host-gw", &members);
    check_masquerade(&members).await;
    check_service(&client, &members[1], &members[0]).await;
    down(&mut cluster, "flannel host-gw", began);
}
