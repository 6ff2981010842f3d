//! Reading the cluster for `status` and `check`: one list of each kind, the Lease and the
//! published ConfigMaps. Only reads, so it works whether or not a controller runs.

use anyhow::Context as _;
use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};
use std::collections::BTreeMap;

use nodeipam_alloc::check::{Cluster, Held, Output};
use nodeipam_alloc::node::IpamNode;
use nodeipam_alloc::outputs::{MANAGED_BY, OutputRef};
use nodeipam_alloc::podnetwork::{ConfigMapRef, OutputKind};
use nodeipam_controller::reconcile::publisher::typed_api;
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMPool};
use serde::de::DeserializeOwned;

use crate::args::Global;

/// What `status` and `check` look at.
#[derive(Debug)]
pub struct Read {
    pub configs: Vec<NodeIPAMConfig>,
    /// `None` when the NodeIPAMPool CRD is not installed.
    pub pools: Option<Vec<NodeIPAMPool>>,
    pub nodes: Vec<IpamNode>,
    /// Service ranges by ServiceCIDR name; empty where the API serves no ServiceCIDRs.
    pub services: Vec<(String, Vec<IpNet>)>,
    pub outputs: Vec<Output>,
    pub lease: Option<Lease>,
    /// `namespace/name` of the Lease.
    pub lease_ref: String,
    pub extra_non_masquerade: Vec<IpNet>,
    /// What the `StorageWentBack` Warning events say (a replica found that the API's storage
    /// went back in time and stopped allocating), newest first. Best effort: events expire
    /// (an hour by default) and RBAC may not let the reader list them.
    pub went_back: Vec<String>,
}

impl Read {
    /// The facts as the pure checks take them.
    pub fn cluster(&self) -> Cluster<'_> {
        Cluster {
            configs: &self.configs,
            nodes: &self.nodes,
            services: &self.services,
            outputs: &self.outputs,
            extra_non_masquerade: &self.extra_non_masquerade,
        }
    }
}

/// Lists every kind, failing on the first that cannot be read (naming it).
pub async fn read(client: &Client, global: &Global) -> anyhow::Result<Read> {
    // The Nodes before the configs: a config holding a block cannot go (its finalizer waits for
    // the block), so every config a listed podCIDR came from is in the later list. Read the
    // other way round, a config created, published and allocated between the two lists would
    // make its node's podCIDR look like damage (in no config), reported without a second look.
    // Read as protobuf, as the controller and `ranges` do: there may be many thousand.
    let nodes = list::<IpamNode>(
        &nodeipam_controller::node_lists::client(client.clone()),
        "Nodes",
    )
    .await?
    .unwrap_or_default();
    let configs = list::<NodeIPAMConfig>(client, "NodeIPAMConfigs")
        .await?
        .context("the NodeIPAMConfig CRD (nodeipamconfigs.nodeipam.io) is not installed in this cluster: apply config/crd first (kubectl apply -k config/crd)")?;
    let pools = list::<NodeIPAMPool>(client, "NodeIPAMPools").await?;
    let mut services: Vec<(String, Vec<IpNet>)> = list::<ServiceCIDR>(client, "ServiceCIDRs")
        .await?
        .unwrap_or_default()
        .iter()
        .map(|s| (s.name_any(), service_ranges(s)))
        .collect();
    if !global.service_cidrs.is_empty() {
        services.push((
            nodeipam_alloc::machine::SERVICE_FLAG_SOURCE.into(),
            global.service_cidrs.clone(),
        ));
    }
    let mut outputs = Vec::new();
    if !global.pod_network_configmap.is_empty() {
        let target = ConfigMapRef {
            namespace: global.namespace.clone(),
            name: global.pod_network_configmap.clone(),
        };
        outputs.push(output(client, target, OutputKind::PodNetwork).await?);
    }
    if let Some(target) = &global.ip_masq_agent_configmap {
        outputs.push(output(client, target.clone(), OutputKind::IpMasqAgent).await?);
    }
    for target in global.typed.typed_outputs()? {
        outputs.push(typed_output(client, target).await?);
    }
    let lease = Api::<Lease>::namespaced(client.clone(), &global.namespace)
        .get_opt(&global.lease_name)
        .await
        .with_context(|| format!("reading Lease {}/{}", global.namespace, global.lease_name))?;
    Ok(Read {
        configs,
        pools,
        nodes,
        services,
        outputs,
        lease,
        lease_ref: format!("{}/{}", global.namespace, global.lease_name),
        extra_non_masquerade: global.extra_non_masquerade_cidrs.clone(),
        went_back: went_back(client).await,
    })
}

/// The messages of the `StorageWentBack` events, newest first; none when they cannot be read.
async fn went_back(client: &Client) -> Vec<String> {
    use k8s_openapi::api::core::v1::Event;
    let reason = nodeipam_alloc::machine::STORAGE_WENT_BACK;
    let params = ListParams::default().fields(&format!("reason={reason}"));
    let Ok(list) = Api::<Event>::all(client.clone()).list(&params).await else {
        return Vec::new();
    };
    let mut events: Vec<Event> = list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect();
    events.sort_by_key(|e| std::cmp::Reverse(e.metadata.creation_timestamp.clone()));
    events.into_iter().filter_map(|e| e.message).collect()
}

/// Every object of a cluster-wide kind; `None` when the API does not serve the kind.
async fn list<K>(client: &Client, what: &str) -> anyhow::Result<Option<Vec<K>>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    match Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => Ok(Some(l.items)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context(format!("listing {what}"))),
    }
}

/// A ServiceCIDR's ranges; what does not parse protects nothing and is left out.
fn service_ranges(s: &ServiceCIDR) -> Vec<IpNet> {
    s.spec
        .as_ref()
        .and_then(|s| s.cidrs.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// A typed output's objects of ours: the one named, or every one with our label. `None` when
/// the named object is not there or the API does not serve the kind.
async fn typed_output(client: &Client, target: OutputRef) -> anyhow::Result<Output> {
    let api = typed_api(client, &target);
    let found = match &target.name {
        Some(name) => api
            .get_opt(name)
            .await
            .map(|o| o.map(|o| BTreeMap::from([(name.clone(), o)]))),
        None => {
            let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
            let params = ListParams::default().labels(&selector);
            api.list(&params).await.map(|l| {
                let by_name = l.items.into_iter().map(|o| (o.name_any(), o));
                Some(by_name.collect())
            })
        }
    };
    let objects = match found {
        Ok(objects) => objects,
        Err(kube::Error::Api(s)) if s.code == 404 => None,
        Err(e) => return Err(anyhow::Error::new(e).context(format!("reading {target}"))),
    };
    Ok(Output {
        target,
        held: objects.map(Held::Objects),
    })
}

async fn output(client: &Client, target: ConfigMapRef, kind: OutputKind) -> anyhow::Result<Output> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &target.namespace)
        .get_opt(&target.name)
        .await
        .with_context(|| format!("reading ConfigMap {target}"))?;
    let data = cm.map(|c| c.data.unwrap_or_default());
    Ok(Output::configmap(&target, kind, data))
}
