//! Recording every version of watched objects with its resourceVersion, to prove the order in
//! which the API server saw things happen (a range published before its first block).

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

pub fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("numeric resourceVersion")
}

/// Stops a recorder when the test ends, so no watch outlives its control plane.
pub struct Recorder(tokio::task::JoinHandle<()>);

impl Drop for Recorder {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub type Log<K> = Arc<Mutex<Vec<(u64, bool, K)>>>;

/// Records every version of the watched objects with its resourceVersion, in arrival order.
pub fn record<K>(api: Api<K>) -> (Log<K>, Recorder)
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
{
    let log = Arc::new(Mutex::new(Vec::new()));
    let out = log.clone();
    // With backoff: a watch error must not turn into a busy retry loop.
    let task = tokio::spawn(async move {
        let mut stream = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(ev) = stream.next().await {
            let mut log = out.lock().expect("log lock");
            match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => log.push((rv(&o), false, o)),
                Ok(Event::Delete(o)) => log.push((rv(&o), true, o)),
                _ => {}
            }
        }
    });
    (log, Recorder(task))
}
