//! Nodes that write their own status as a kubelet does: a status update at registration
//! (Ready=False, the CNI not yet initialized; addresses, capacity), a second one when the node
//! turns Ready, then a heartbeat of its conditions every few seconds (the heartbeat of a kubelet
//! without node Leases, shortened so that a test sees many). Every one of them moves the Node's
//! resourceVersion, as a kubelet's do; none touches its spec or annotations.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How often each node's heartbeat comes, and when its second update (Ready) follows its first.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub ready_after: (Duration, Duration),
    pub heartbeat: (Duration, Duration),
}

/// The kubelets of a set of Nodes; they stop when dropped.
pub struct Kubelets {
    task: JoinHandle<()>,
    updates: Arc<AtomicU64>,
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelets {
    /// Creates `names` one after the other, each with its registration status, and keeps their
    /// status as a kubelet would until stopped.
    pub fn start(client: Client, names: Vec<String>, timing: Timing) -> Kubelets {
        let updates = Arc::new(AtomicU64::new(0));
        Kubelets {
            task: tokio::spawn(run(client, names, timing, updates.clone())),
            updates,
        }
    }

    /// How many status updates they have made so far.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::SeqCst)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Update {
    Ready,
    Heartbeat,
}

async fn run(client: Client, names: Vec<String>, timing: Timing, updates: Arc<AtomicU64>) {
    let api: Api<Node> = Api::all(client);
    let mut due: BinaryHeap<Reverse<(Instant, usize, Update)>> = BinaryHeap::new();
    for (i, name) in names.iter().enumerate() {
        let node = Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Node::default()
        };
        api.create(&Default::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("create node {name}: {e}"));
        status(&api, name, i, false).await;
        updates.fetch_add(1, Ordering::SeqCst);
        let after = spread(timing.ready_after, i);
        due.push(Reverse((Instant::now() + after, i, Update::Ready)));
    }
    loop {
        let Some(Reverse((at, _, _))) = due.peek().copied() else {
            return;
        };
        tokio::time::sleep_until(at).await;
        let mut batch = Vec::new();
        while let Some(Reverse((at, i, update))) = due.peek().copied() {
            if at > Instant::now() {
                break;
            }
            due.pop();
            batch.push((i, update));
            let next = spread(timing.heartbeat, i + batch.len());
            due.push(Reverse((Instant::now() + next, i, Update::Heartbeat)));
        }
        let done = batch.len() as u64;
        futures::stream::iter(batch)
            .map(|(i, update)| {
                let (api, name) = (&api, &names[i]);
                async move { status(api, name, i, update >= Update::Ready).await }
            })
            .buffer_unordered(8)
            .collect::<Vec<()>>()
            .await;
        updates.fetch_add(done, Ordering::SeqCst);
    }
}

/// A duration within `range`, spread over the nodes by their index.
fn spread((low, high): (Duration, Duration), i: usize) -> Duration {
    let span = high.saturating_sub(low).as_millis().max(1) as u64;
    low + Duration::from_millis((i as u64).wrapping_mul(7919) % span)
}

/// One status update of node `i`, as a kubelet sends it.
async fn status(api: &Api<Node>, name: &str, i: usize, ready: bool) {
    let second = k8s_openapi::jiff::Timestamp::now().as_second();
    let now = k8s_openapi::jiff::Timestamp::from_second(second)
        .expect("now is a valid time")
        .to_string();
    let patch = json!({ "status": {
        "conditions": conditions(ready, &now),
        "addresses": [
            { "type": "InternalIP", "address": format!("172.31.{}.{}", i / 250, i % 250 + 1) },
            { "type": "Hostname", "address": name },
        ],
        "capacity": { "cpu": "4", "memory": "16Gi", "pods": "110" },
        "allocatable": { "cpu": "4", "memory": "16Gi", "pods": "110" },
    }});
    // A node deleted by the test meanwhile is no failure of its kubelet.
    if let Err(e) = api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        && !matches!(&e, kube::Error::Api(s) if s.code == 404)
    {
        panic!("status update of node {name}: {e}");
    }
}

fn conditions(ready: bool, now: &str) -> Value {
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "False",
            "KubeletNotReady",
            "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized",
        )
    };
    let pressure = |t: &str, reason: &str| {
        json!({ "type": t, "status": "False", "reason": reason,
                "lastHeartbeatTime": now, "lastTransitionTime": now })
    };
    json!([
        pressure("MemoryPressure", "KubeletHasSufficientMemory"),
        pressure("DiskPressure", "KubeletHasNoDiskPressure"),
        pressure("PIDPressure", "KubeletHasSufficientPID"),
        { "type": "Ready", "status": status, "reason": reason, "message": message,
          "lastHeartbeatTime": now, "lastTransitionTime": now },
    ])
}
