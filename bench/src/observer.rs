//! The observer: a watch on the benchmark's Nodes that records, for each, when it was first seen
//! and when it was first seen with podCIDRs (like kubernetes' test/integration/ipamperf).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

/// When one node was seen.
#[derive(Clone, Debug)]
pub struct Seen {
    pub added: Instant,
    pub assigned: Option<Instant>,
    pub pod_cidrs: Vec<String>,
}

#[derive(Default)]
struct State {
    nodes: HashMap<String, Seen>,
    assigned: usize,
    watch_errors: u64,
}

pub struct Observer {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Observer {
    /// Starts watching the Nodes matching `label_selector` and returns once the initial list is
    /// done, so that no later create is missed.
    pub async fn start(client: &kube::Client, label_selector: &str) -> anyhow::Result<Observer> {
        let state = Arc::new(Mutex::new(State::default()));
        let changed = Arc::new(Notify::new());
        let api: Api<Node> = Api::all(client.clone());
        let config = watcher::Config::default().labels(label_selector);
        let (synced_tx, synced_rx) = oneshot::channel();
        let task = {
            let (state, changed) = (state.clone(), changed.clone());
            tokio::spawn(async move {
                let mut synced = Some(synced_tx);
                let mut events = watcher::watcher(api, config).default_backoff().boxed();
                while let Some(event) = events.next().await {
                    let now = Instant::now();
                    let node = match event {
                        Ok(Event::Apply(n) | Event::InitApply(n)) => n,
                        Ok(Event::InitDone) => {
                            if let Some(tx) = synced.take() {
                                let _ = tx.send(());
                            }
                            continue;
                        }
                        Ok(Event::Init | Event::Delete(_)) => continue,
                        Err(_) => {
                            lock(&state).watch_errors += 1;
                            continue;
                        }
                    };
                    let cidrs = node
                        .spec
                        .as_ref()
                        .and_then(|s| s.pod_cidrs.clone())
                        .unwrap_or_default();
                    let mut st = lock(&state);
                    let newly_assigned = {
                        let seen = st.nodes.entry(node.name_any()).or_insert(Seen {
                            added: now,
                            assigned: None,
                            pod_cidrs: Vec::new(),
                        });
                        if seen.assigned.is_none() && !cidrs.is_empty() {
                            seen.assigned = Some(now);
                            seen.pod_cidrs = cidrs;
                            true
                        } else {
                            false
                        }
                    };
                    if newly_assigned {
                        st.assigned += 1;
                        drop(st);
                        changed.notify_waiters();
                    }
                }
            })
        };
        tokio::time::timeout(Duration::from_secs(60), synced_rx)
            .await
            .context("the observer's initial list took over 60 s")?
            .context("the observer's watch ended before its initial list")?;
        Ok(Observer {
            state,
            changed,
            task,
        })
    }

    pub fn watch_errors(&self) -> u64 {
        lock(&self.state).watch_errors
    }

    /// Waits until `count` nodes hold podCIDRs. Every 200 ms `check` may end the wait with an
    /// error (e.g. the contender exited); after `timeout` it fails, saying how far it got.
    pub async fn wait_assigned(
        &self,
        count: usize,
        timeout: Duration,
        check: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        if self.wait_served(count, timeout, check).await? {
            return Ok(());
        }
        let (seen, assigned) = self.counts();
        bail!("only {assigned} of {count} nodes had podCIDRs after {timeout:?} ({seen} seen)")
    }

    /// Like `wait_assigned`, but a time limit is an answer, not an error: whether all `count`
    /// nodes hold podCIDRs by then.
    pub async fn wait_served(
        &self,
        count: usize,
        limit: Duration,
        mut check: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<bool> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            if self.counts().1 >= count {
                return Ok(true);
            }
            check()?;
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    /// Nodes seen, and of them those seen with podCIDRs.
    pub fn counts(&self) -> (usize, usize) {
        let st = lock(&self.state);
        (st.nodes.len(), st.assigned)
    }

    /// What was seen of each node.
    pub fn snapshot(&self) -> HashMap<String, Seen> {
        lock(&self.state).nodes.clone()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
