//! Nodes that write their own status as a kubelet does (pkg/kubelet/kubelet_node_status.go):
//! a status update once the Node is registered (Ready=False, the CNI not yet initialized;
//! addresses, capacity), a second when the node turns Ready, then a heartbeat of its
//! conditions every so often (the heartbeat of a kubelet without node Leases). Every one of
//! them moves the Node's resourceVersion, as a kubelet's do; none touches its spec or its
//! annotations. For the end-to-end tests and the burst benchmark (`--kubelets`).

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

/// When a node's second update (Ready) follows its first, and how often its heartbeat comes;
/// each node draws its own within the ranges.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub ready_after: (Duration, Duration),
    pub heartbeat: (Duration, Duration),
}

impl Timing {
    /// A kubelet's: Ready 0.5-2.5 s after registration (the CNI coming up), and the node
    /// status reported every 20-25 s (`nodeStatusUpdateFrequency` of 10 s stretched by the
    /// kubelet's jitter and the API's latency under load; without node Leases).
    pub fn kubelet() -> Timing {
        Timing {
            ready_after: (Duration::from_millis(500), Duration::from_millis(2500)),
            heartbeat: (Duration::from_secs(20), Duration::from_secs(25)),
        }
    }
}

/// How many status updates are sent at once.
const CONCURRENCY: usize = 32;

/// The kubelets of a set of Nodes; they stop when dropped.
pub struct Kubelets {
    task: JoinHandle<()>,
    updates: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
}

impl Drop for Kubelets {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelets {
    /// Runs the kubelets of the Nodes `names`, in that order: each registers (its first status
    /// update) as soon as its Node exists, so they may start before the Nodes are created.
    pub fn start(client: Client, names: Vec<String>, timing: Timing) -> Kubelets {
        let (updates, errors) = (Arc::default(), Arc::default());
        let task = tokio::spawn(run(
            client,
            names,
            timing,
            Arc::clone(&updates),
            Arc::clone(&errors),
        ));
        Kubelets {
            task,
            updates,
            errors,
        }
    }

    /// How many status updates they have made so far.
    pub fn updates(&self) -> u64 {
        self.updates.load(Ordering::SeqCst)
    }

    /// How many updates failed (and were sent again).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::SeqCst)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Update {
    Registered,
    Ready,
    Heartbeat,
}

async fn run(
    client: Client,
    names: Vec<String>,
    timing: Timing,
    updates: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
) {
    let api: Api<Node> = Api::all(client);
    let start = Instant::now();
    // Registration in the nodes' order, then each node's own schedule.
    let mut due: BinaryHeap<Reverse<(Instant, usize, Update)>> = (0..names.len())
        .map(|i| Reverse((start, i, Update::Registered)))
        .collect();
    while let Some(Reverse((at, _, _))) = due.peek().copied() {
        tokio::time::sleep_until(at).await;
        let mut batch = Vec::new();
        while let Some(Reverse((at, i, update))) = due.peek().copied() {
            if at > Instant::now() || batch.len() == CONCURRENCY * 4 {
                break;
            }
            due.pop();
            batch.push((i, update));
        }
        let sent = futures::stream::iter(batch)
            .map(|(i, update)| {
                let (api, name) = (&api, &names[i]);
                async move { (i, update, status(api, name, i, update).await) }
            })
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let now = Instant::now();
        for (i, update, sent) in sent {
            let next = match (update, sent) {
                // Not created yet: registration is tried again shortly.
                (Update::Registered, Sent::Absent) => {
                    due.push(Reverse((now + Duration::from_millis(50), i, update)));
                    continue;
                }
                (_, Sent::Absent) => continue,
                // An API server under load may time out: that update is sent again.
                (_, Sent::Failed) => {
                    errors.fetch_add(1, Ordering::SeqCst);
                    due.push(Reverse((now + Duration::from_secs(1), i, update)));
                    continue;
                }
                (Update::Registered, Sent::Done) => {
                    (now + spread(timing.ready_after, i), Update::Ready)
                }
                (_, Sent::Done) => (
                    now + spread(timing.heartbeat, i + due.len()),
                    Update::Heartbeat,
                ),
            };
            updates.fetch_add(1, Ordering::SeqCst);
            due.push(Reverse((next.0, i, next.1)));
        }
    }
}

/// A duration within `range`, spread over the nodes by `i`.
fn spread((low, high): (Duration, Duration), i: usize) -> Duration {
    let span = high.saturating_sub(low).as_millis().max(1) as u64;
    low + Duration::from_millis((i as u64).wrapping_mul(7919) % span)
}

enum Sent {
    Done,
    /// The Node does not exist (yet, or any more).
    Absent,
    Failed,
}

/// One status update of node `i`, as a kubelet sends it (a strategic merge patch of
/// `status`).
async fn status(api: &Api<Node>, name: &str, i: usize, update: Update) -> Sent {
    let second = k8s_openapi::jiff::Timestamp::now().as_second();
    let now = k8s_openapi::jiff::Timestamp::from_second(second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let patch = json!({ "status": {
        "conditions": conditions(update != Update::Registered, &now),
        "addresses": [
            { "type": "InternalIP", "address": format!("172.31.{}.{}", i / 250 % 256, i % 250 + 1) },
            { "type": "Hostname", "address": name },
        ],
        "capacity": { "cpu": "4", "memory": "16Gi", "pods": "110" },
        "allocatable": { "cpu": "4", "memory": "16Gi", "pods": "110" },
    }});
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Sent::Done,
        Err(kube::Error::Api(s)) if s.code == 404 => Sent::Absent,
        Err(_) => Sent::Failed,
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
