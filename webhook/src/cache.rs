//! The webhook's caches: reflectors of every NodeIPAMConfig, every NodeIPAMPool and every
//! ServiceCIDR, so a review reads memory instead of listing per request. Nodes are not cached:
//! only one warning reads them, and it counts them on demand (see `crate::nodes`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Stream, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMPool};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::review::{ClusterView, ServiceRange};

/// Read side of the caches.
#[derive(Clone)]
pub(crate) struct Caches {
    configs: Store<NodeIPAMConfig>,
    pools: Store<NodeIPAMPool>,
    /// The pool reflector has listed once.
    pools_synced: Arc<AtomicBool>,
    /// `None` when the API server does not serve ServiceCIDRs.
    service_cidrs: Option<Store<ServiceCIDR>>,
    static_service_cidrs: Vec<IpNet>,
    synced: Arc<AtomicBool>,
}

/// Drives `stream` forever, logging watch errors (the watcher backs off and retries itself).
async fn drive<T, E: std::fmt::Display>(
    what: &'static str,
    stream: impl Stream<Item = Result<T, E>>,
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            warn!(cache = what, error = %e, "watch error; retrying");
        }
    }
}

impl Caches {
    /// Starts the reflectors on `tasks`; `synced` turns true once all have listed.
    pub async fn start(
        client: kube::Client,
        static_service_cidrs: Vec<IpNet>,
        synced: Arc<AtomicBool>,
        tasks: &mut JoinSet<()>,
    ) -> Caches {
        let (configs, writer) = reflector::store();
        let api: Api<NodeIPAMConfig> = Api::all(client.clone());
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|c| c.metadata.managed_fields = None)
            .reflect(writer)
            .touched_objects();
        tasks.spawn(drive("nodeipamconfigs", stream));

        let (pools, writer) = reflector::store();
        let api: Api<NodeIPAMPool> = Api::all(client.clone());
        // A controller upgraded before its CRDs (kustomize users apply config/crd) finds no
        // NodeIPAMPools: there are none to protect then, so configs are still reviewed, and
        // the watcher keeps retrying until the CRD is served; pool requests wait for it.
        let pools_served = !matches!(
            api.list_metadata(&ListParams::default().limit(1)).await,
            Err(kube::Error::Api(s)) if s.code == 404
        );
        if !pools_served {
            warn!(
                "the API server serves no NodeIPAMPools (is the CRD installed?): reviewing configs \
                 without pools and refusing pool requests until it does"
            );
        }
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(|p| p.metadata.managed_fields = None)
            .reflect(writer)
            .touched_objects();
        tasks.spawn(drive("nodeipampools", stream));

        let api: Api<ServiceCIDR> = Api::all(client.clone());
        let service_cidrs = match api.list_metadata(&ListParams::default().limit(1)).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {
                info!("the API server serves no ServiceCIDRs; checking --service-cidr only");
                None
            }
            // Any other error is the watcher's to retry.
            _ => {
                let (store, writer) = reflector::store();
                let stream = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .reflect(writer)
                    .touched_objects();
                tasks.spawn(drive("servicecidrs", stream));
                Some(store)
            }
        };

        let caches = Caches {
            configs,
            pools,
            pools_synced: Arc::new(AtomicBool::new(false)),
            service_cidrs,
            static_service_cidrs,
            synced,
        };
        // A store wakes one waiter only (its readiness is a oneshot channel), so the pool
        // store has exactly one, which tells the others through `pools_listed`.
        let (listed_tx, mut pools_listed) = tokio::sync::watch::channel(false);
        let waiting = caches.clone();
        tasks.spawn(async move {
            if waiting.pools.wait_until_ready().await.is_ok() {
                debug!("webhook pool cache synced");
                waiting.pools_synced.store(true, Ordering::SeqCst);
                let _ = listed_tx.send(true);
            }
        });
        let waiting = caches.clone();
        tasks.spawn(async move {
            let service = async {
                match &waiting.service_cidrs {
                    Some(s) => s.wait_until_ready().await,
                    None => Ok(()),
                }
            };
            let pools = async {
                if pools_served {
                    pools_listed.wait_for(|listed| *listed).await.map(|_| ())
                } else {
                    Ok(())
                }
            };
            let (a, b, c) = tokio::join!(waiting.configs.wait_until_ready(), pools, service);
            if a.is_ok() && b.is_ok() && c.is_ok() {
                debug!("webhook caches synced");
                waiting.synced.store(true, Ordering::SeqCst);
            }
        });
        caches
    }

    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// A snapshot for one review.
    pub fn view(&self) -> ClusterView {
        let mut service_cidrs: Vec<ServiceRange> = self
            .static_service_cidrs
            .iter()
            .map(|c| ServiceRange::flag(*c))
            .collect();
        if let Some(store) = &self.service_cidrs {
            for s in store.state() {
                let name = s.metadata.name.clone().unwrap_or_default();
                let cidrs = s.spec.as_ref().and_then(|spec| spec.cidrs.as_ref());
                for c in cidrs.into_iter().flatten() {
                    if let Ok(cidr) = c.parse::<IpNet>() {
                        service_cidrs.push(ServiceRange::of_service_cidr(&name, cidr));
                    }
                }
            }
        }
        ClusterView {
            configs: self.configs.state(),
            pools: self.pools.state(),
            pools_unsynced: !self.pools_synced.load(Ordering::SeqCst),
            service_cidrs,
            // Counted per request by the server, when the review needs it.
            matching_nodes: None,
        }
    }
}
