//! The checker: every change etcd commits, in revision order, replayed against the rule above
//! all. It watches etcd itself (from revision 1, through etcd's JSON gateway), not the API
//! server: one stream in the order of the resourceVersions, with no gap when the API server
//! restarts or a watch cache relists, so a violation that lasted one revision is seen. The API
//! server stores objects as JSON for this (`--storage-media-type=application/json`) and never
//! compacts (`--etcd-compaction-interval=0`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures::{AsyncBufReadExt, StreamExt};
use ipnet::IpNet;
use serde_json::Value;

const NODES: &str = "/registry/minions/";
const CONFIGS: &str = "/registry/nodeipam.io/nodeipamconfigs/";
const POD_NETWORK: &str = "/registry/configmaps/nodeipam-system/nodeipam-pod-network";
const SERVICE_CIDRS: &str = "/registry/servicecidrs/";

/// What the objects the rule speaks of looked like at one revision.
#[derive(Default)]
struct World {
    /// Node name → its podCIDRs.
    nodes: BTreeMap<String, Vec<IpNet>>,
    /// Config name → (its ranges, Drained=True).
    configs: BTreeMap<String, (Vec<IpNet>, bool)>,
    /// The published pod network, once it exists.
    pod_network: Option<Vec<IpNet>>,
    /// ServiceCIDR name → its ranges.
    services: BTreeMap<String, Vec<IpNet>>,
}

/// What the checker has seen so far.
#[derive(Default)]
pub struct Findings {
    /// The last revision replayed.
    pub revision: u64,
    /// Changes of the watched kinds replayed.
    pub changes: u64,
    /// Each violation with the revision it appeared at (the first 50).
    pub violations: Vec<String>,
    /// How many times the stream had to be opened again.
    pub reconnects: u64,
}

/// The checker's task; it stops when dropped.
pub struct Checker {
    pub findings: Arc<Mutex<Findings>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Checker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Checker {
    /// Replays etcd at `etcd_url` from revision 1, and keeps following it.
    pub fn start(etcd_url: &str) -> Checker {
        let client = etcd_client(etcd_url);
        let findings = Arc::new(Mutex::new(Findings::default()));
        let task = tokio::spawn(follow(client, findings.clone()));
        Checker { findings, task }
    }

    pub fn revision(&self) -> u64 {
        self.findings.lock().expect("findings").revision
    }

    pub fn violations(&self) -> Vec<String> {
        self.findings.lock().expect("findings").violations.clone()
    }
}

fn etcd_client(url: &str) -> kube::Client {
    let uri = url.parse().expect("etcd URL");
    let mut config = kube::Config::new(uri);
    // The stream is long: only a silent one is dead (a Lease renews every few seconds).
    config.read_timeout = Some(Duration::from_secs(60));
    kube::Client::try_from(config).expect("step=chaos-checker: a client for etcd")
}

/// Follows etcd's watch, opening it again after the last revision replayed when it breaks.
async fn follow(client: kube::Client, findings: Arc<Mutex<Findings>>) {
    let mut world = World::default();
    loop {
        let from = findings.lock().expect("findings").revision + 1;
        if let Err(e) = watch_from(&client, from, &mut world, &findings).await {
            eprintln!("chaos checker: etcd watch from revision {from} ended: {e}");
        }
        findings.lock().expect("findings").reconnects += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn watch_from(
    client: &kube::Client,
    from: u64,
    world: &mut World,
    findings: &Mutex<Findings>,
) -> Result<(), String> {
    let body = serde_json::json!({ "create_request": {
        "key": B64.encode("/registry/"),
        "range_end": B64.encode("/registry0"),
        "start_revision": from.to_string(),
    }});
    let request = http::Request::post("/v3/watch")
        .body(serde_json::to_vec(&body).expect("json"))
        .expect("request");
    let stream = client
        .request_stream(request)
        .await
        .map_err(|e| e.to_string())?;
    let mut lines = stream.lines();
    while let Some(line) = lines.next().await {
        let line = line.map_err(|e| e.to_string())?;
        let message: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
        if message["result"]["compact_revision"].as_str().is_some() {
            return Err(format!("etcd compacted past {from}: {line}"));
        }
        let events = message["result"]["events"].as_array().cloned();
        for event in events.unwrap_or_default() {
            replay(world, &event, findings);
        }
    }
    Err("the stream ended".into())
}

/// Applies one etcd event and checks the rule if it touched what the rule speaks of.
fn replay(world: &mut World, event: &Value, findings: &Mutex<Findings>) {
    let kv = &event["kv"];
    let revision: u64 = kv["mod_revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let key = kv["key"]
        .as_str()
        .and_then(|k| B64.decode(k).ok())
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .unwrap_or_default();
    let deleted = event["type"].as_str() == Some("DELETE");
    let object: Option<Value> = (!deleted)
        .then(|| kv["value"].as_str().and_then(|v| B64.decode(v).ok()))
        .flatten()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    let touched = apply(world, &key, object.as_ref());
    let mut f = findings.lock().expect("findings");
    f.revision = f.revision.max(revision);
    if touched {
        f.changes += 1;
        for v in check(world) {
            if f.violations.len() < 50 {
                f.violations
                    .push(format!("revision {revision} ({key}): {v}"));
            }
        }
    }
}

/// Puts one object (or its deletion) into the world; whether it is one the rule speaks of.
fn apply(world: &mut World, key: &str, object: Option<&Value>) -> bool {
    if let Some(name) = key.strip_prefix(NODES) {
        set(
            &mut world.nodes,
            name,
            object.map(|o| cidrs(&o["spec"]["podCIDRs"])),
        );
    } else if let Some(name) = key.strip_prefix(CONFIGS) {
        set(&mut world.configs, name, object.map(config));
    } else if let Some(name) = key.strip_prefix(SERVICE_CIDRS) {
        set(
            &mut world.services,
            name,
            object.map(|o| cidrs(&o["spec"]["cidrs"])),
        );
    } else if key == POD_NETWORK {
        world.pod_network = object.map(|o| {
            let data = &o["data"];
            let listed = |k: &str| data[k].as_str().unwrap_or("").to_string();
            let all = format!("{},{}", listed("ipv4"), listed("ipv6"));
            all.split(',')
                .filter_map(|c| c.trim().parse().ok())
                .collect()
        });
    } else {
        return false;
    }
    true
}

fn set<V>(map: &mut BTreeMap<String, V>, name: &str, value: Option<V>) {
    match value {
        Some(v) => map.insert(name.to_string(), v),
        None => map.remove(name),
    };
}

fn cidrs(list: &Value) -> Vec<IpNet> {
    list.as_array()
        .map(|l| l.iter().filter_map(|c| c.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// A config's ranges, and whether its status says Drained=True.
fn config(o: &Value) -> (Vec<IpNet>, bool) {
    let ranges = ["ipv4", "ipv6"]
        .iter()
        .filter_map(|f| o["spec"][f]["cidr"].as_str()?.parse().ok())
        .collect();
    let drained = o["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == nodeipam_crd::CONDITION_DRAINED && c["status"] == "True")
    });
    (ranges, drained)
}

fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Every way the world breaks the rule above all.
fn check(world: &World) -> Vec<String> {
    let held: Vec<(&String, &IpNet)> = world
        .nodes
        .iter()
        .flat_map(|(n, cs)| cs.iter().map(move |c| (n, c)))
        .collect();
    let mut found = Vec::new();
    for (i, (na, a)) in held.iter().enumerate() {
        for (nb, b) in &held[i + 1..] {
            if na != nb && overlap(a, b) {
                found.push(format!("node {na} holds {a} and node {nb} holds {b}"));
            }
        }
        for (s, ranges) in &world.services {
            if let Some(r) = ranges.iter().find(|r| overlap(r, a)) {
                found.push(format!(
                    "node {na} holds {a} inside Service range {r} ({s})"
                ));
            }
        }
        let published = world.pod_network.as_deref().unwrap_or(&[]);
        if !published.iter().any(|p| p.contains(*a)) {
            found.push(format!(
                "node {na} holds {a}, which the published pod network does not list ({published:?})"
            ));
        }
        for (c, (ranges, drained)) in &world.configs {
            if *drained && ranges.iter().any(|r| overlap(r, a)) {
                found.push(format!(
                    "config {c} says Drained=True while node {na} holds {a}"
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> World {
        let mut w = World::default();
        w.configs
            .insert("a".into(), (vec!["10.0.0.0/24".parse().unwrap()], false));
        w.pod_network = Some(vec!["10.0.0.0/24".parse().unwrap()]);
        w.nodes
            .insert("n1".into(), vec!["10.0.0.0/28".parse().unwrap()]);
        w
    }

    #[test]
    fn each_way_of_breaking_the_rule_is_named() {
        let ok = world();
        assert!(check(&ok).is_empty(), "{:?}", check(&ok));
        let mut dup = world();
        dup.nodes
            .insert("n2".into(), vec!["10.0.0.0/28".parse().unwrap()]);
        assert!(check(&dup)[0].contains("node n1 holds 10.0.0.0/28 and node n2"));
        let mut unlisted = world();
        unlisted.pod_network = Some(vec![]);
        assert!(check(&unlisted)[0].contains("does not list"));
        let mut drained = world();
        drained.configs.get_mut("a").unwrap().1 = true;
        assert!(check(&drained)[0].contains("Drained=True"));
        let mut service = world();
        service
            .services
            .insert("kubernetes".into(), vec!["10.0.0.0/16".parse().unwrap()]);
        assert!(check(&service)[0].contains("inside Service range"));
    }
}
