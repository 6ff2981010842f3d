//! What a review knows of the cluster: every NodeIPAMConfig, NodeIPAMPool and ServiceCIDR,
//! listed from the API server for each review that can admit a spec. Not a watch cache: a
//! watch can lag a write the API server has already acknowledged (the demo once admitted a
//! config inside one created a moment earlier, while the API server re-initialized its watch
//! storage), and an overlap the webhook misses can hand the same addresses to two nodes.
//! A list without a resourceVersion is a consistent read. Such reviews are rare (config and
//! pool creates and spec edits, one per carved range), so three lists each cost little.
//! Nodes are counted separately, and only when a warning needs them (see `crate::nodes`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams};
use kube::core::Resource;
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMPool};
use serde::de::DeserializeOwned;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::review::{ClusterView, ServiceRange};

/// Lists the view for a review; `listed` turns true once a first view was read (readiness).
#[derive(Clone)]
pub(crate) struct ClusterReader {
    client: kube::Client,
    static_service_cidrs: Vec<IpNet>,
    pod_network_supernets: Vec<IpNet>,
    listed: Arc<AtomicBool>,
}

/// Every object of `K`, or `None` when the API server does not serve the kind (404).
async fn list_all<K>(client: &kube::Client) -> Result<Option<Vec<K>>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(Some(list.items)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

impl ClusterReader {
    /// A reader; a task on `tasks` reads one view (retrying) to turn `listed` true.
    pub fn start(
        client: kube::Client,
        static_service_cidrs: Vec<IpNet>,
        pod_network_supernets: Vec<IpNet>,
        listed: Arc<AtomicBool>,
        tasks: &mut JoinSet<()>,
    ) -> ClusterReader {
        let reader = ClusterReader {
            client,
            static_service_cidrs,
            pod_network_supernets,
            listed,
        };
        let first = reader.clone();
        tasks.spawn(async move {
            let mut wait = Duration::from_millis(200);
            while let Err(e) = first.view().await {
                warn!(error = %e, "the webhook cannot list what it reviews against; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
            debug!("webhook listed the cluster once");
            first.listed.store(true, Ordering::SeqCst);
        });
        reader
    }

    /// The view for one review, read now. An error says which list failed.
    pub async fn view(&self) -> Result<ClusterView, String> {
        let failed = |what: &'static str| move |e: kube::Error| format!("cannot list {what}: {e}");
        let (configs, pools, services) = tokio::join!(
            list_all::<NodeIPAMConfig>(&self.client),
            list_all::<NodeIPAMPool>(&self.client),
            list_all::<ServiceCIDR>(&self.client),
        );
        let configs = configs.map_err(failed("NodeIPAMConfigs"))?;
        let pools = pools.map_err(failed("NodeIPAMPools"))?;
        let services = services.map_err(failed("ServiceCIDRs"))?;
        let mut service_cidrs: Vec<ServiceRange> = self
            .static_service_cidrs
            .iter()
            .map(|c| ServiceRange::flag(*c))
            .collect();
        for s in services.into_iter().flatten() {
            let name = s.metadata.name.clone().unwrap_or_default();
            let cidrs = s.spec.as_ref().and_then(|spec| spec.cidrs.as_ref());
            for c in cidrs.into_iter().flatten() {
                if let Ok(cidr) = c.parse::<IpNet>() {
                    service_cidrs.push(ServiceRange::of_service_cidr(&name, cidr));
                }
            }
        }
        Ok(ClusterView {
            // A 404 means the CRD is not served: there are no configs to protect then.
            configs: configs
                .unwrap_or_default()
                .into_iter()
                .map(Arc::new)
                .collect(),
            pools_unlisted: pools.is_none(),
            pools: pools
                .unwrap_or_default()
                .into_iter()
                .map(Arc::new)
                .collect(),
            service_cidrs,
            pod_network_supernets: self.pod_network_supernets.clone(),
            // Counted per request by the server, when the review needs it.
            matching_nodes: None,
        })
    }
}
