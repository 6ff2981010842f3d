//! The model API server: Nodes, NodeIPAMConfigs, ServiceCIDRs and the outputs (the published
//! ConfigMaps and Calico IPPools, one object per range), with UIDs, resourceVersions,
//! preconditions, podCIDRs immutable once set, finalizers and deletion, and the status
//! subresource. Every change becomes a watch event for each subscribed process.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_core::DynamicObject;
use nodeipam_alloc::effects::CreateOutcome;
use nodeipam_alloc::fence::Send;
use nodeipam_alloc::fixtures;
use nodeipam_alloc::machine::Input;
use nodeipam_alloc::machine::Watch;
use nodeipam_alloc::node::IpamNode;
use nodeipam_alloc::outcome::NodeNow;
use nodeipam_alloc::outputs::CalicoPools;
use nodeipam_alloc::podnetwork::{ConfigMapRef, OutputKind, OutputRef};
use nodeipam_alloc::pool::{PoolInput, PoolStatus, pool_input};
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMPool};

/// A watch stream of one process.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Stream {
    Nodes,
    Configs,
    Services,
    Pools,
    Output(usize),
}

#[derive(Clone, Debug)]
pub struct NodeObj {
    pub uid: String,
    pub labels: Vec<(String, String)>,
    pub cidrs: Vec<String>,
    /// podCIDRs written by a controller (not by the user who created the node).
    pub ours: bool,
}

impl NodeObj {
    pub fn as_ipam(&self, name: &str) -> IpamNode {
        let labels: Vec<(&str, &str)> = self
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let cidrs: Vec<&str> = self.cidrs.iter().map(String::as_str).collect();
        fixtures::node(name, &self.uid, &labels, &cidrs)
    }

    pub fn nets(&self) -> Vec<IpNet> {
        self.cidrs.iter().filter_map(|c| c.parse().ok()).collect()
    }
}

/// A change, as a watch delivers it.
#[derive(Clone, Debug)]
pub enum Change {
    Node(Watch<IpamNode>),
    Config(Watch<NodeIPAMConfig>),
    Service(Watch<ServiceCIDR>),
    Pool(Watch<PoolInput>),
    Output(usize, Watch<DynamicObject>),
}

impl Change {
    pub fn stream(&self) -> Stream {
        match self {
            Change::Node(_) => Stream::Nodes,
            Change::Config(_) => Stream::Configs,
            Change::Service(_) => Stream::Services,
            Change::Pool(_) => Stream::Pools,
            Change::Output(i, _) => Stream::Output(*i),
        }
    }

    pub fn into_input(self) -> Input {
        match self {
            Change::Node(w) => Input::Node(w),
            Change::Config(w) => Input::Config(w),
            Change::Service(w) => Input::Service(w),
            Change::Pool(w) => Input::Pool(w),
            Change::Output(i, w) => Input::Output(i, w),
        }
    }
}

/// What a podCIDR patch did.
pub enum Patched {
    Applied(Vec<IpNet>, String),
    Missing,
    /// 409 (UID precondition) or 422 (podCIDRs are immutable).
    Refused(String),
}

#[derive(Clone, Default)]
pub struct World {
    uids: u64,
    /// The last resourceVersion given out: output objects carry one, and move it at each write.
    versions: u64,
    pub nodes: BTreeMap<String, NodeObj>,
    pub configs: BTreeMap<String, NodeIPAMConfig>,
    /// Each config's ranges, parsed once: the invariants look them up after every step.
    pub config_ranges: BTreeMap<String, Vec<IpNet>>,
    pub services: BTreeMap<String, Vec<String>>,
    pub pools: BTreeMap<String, NodeIPAMPool>,
    /// Each output's objects, by name (a ConfigMap output has at most one).
    pub outputs: Vec<BTreeMap<String, DynamicObject>>,
    /// Changes since the last `drain_changes`.
    changes: Vec<Change>,
    /// An output edited by the user and not written by a controller since.
    pub output_tampered: Vec<bool>,
    /// A status edited by the user and not written by a controller since.
    pub status_tampered: BTreeMap<String, bool>,
    /// The config that went last (`User::CreateAgain` makes it anew).
    pub last_gone: Option<NodeIPAMConfig>,
}

impl World {
    pub fn new(outputs: usize) -> Self {
        World {
            outputs: vec![BTreeMap::new(); outputs],
            output_tampered: vec![false; outputs],
            ..World::default()
        }
    }

    pub fn uid(&mut self, kind: &str) -> String {
        self.uids += 1;
        format!("{kind}-{}", self.uids)
    }

    pub fn drain_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    /// Everything, as a list of one stream shows it.
    pub fn list(&self, stream: Stream) -> Vec<Change> {
        let mut out = Vec::new();
        match stream {
            Stream::Nodes => {
                out.push(Change::Node(Watch::ListStart));
                for (name, n) in &self.nodes {
                    out.push(Change::Node(Watch::Listed(n.as_ipam(name))));
                }
                out.push(Change::Node(Watch::ListDone));
            }
            Stream::Configs => {
                out.push(Change::Config(Watch::ListStart));
                for c in self.configs.values() {
                    out.push(Change::Config(Watch::Listed(c.clone())));
                }
                out.push(Change::Config(Watch::ListDone));
            }
            Stream::Services => {
                out.push(Change::Service(Watch::ListStart));
                for (name, cidrs) in &self.services {
                    out.push(Change::Service(Watch::Listed(service(name, cidrs))));
                }
                out.push(Change::Service(Watch::ListDone));
            }
            Stream::Pools => {
                out.push(Change::Pool(Watch::ListStart));
                for p in self.pools.values() {
                    out.push(Change::Pool(Watch::Listed(pool_input(p))));
                }
                out.push(Change::Pool(Watch::ListDone));
            }
            Stream::Output(i) => {
                out.push(Change::Output(i, Watch::ListStart));
                for o in self.outputs[i].values() {
                    out.push(Change::Output(i, Watch::Listed(o.clone())));
                }
                out.push(Change::Output(i, Watch::ListDone));
            }
        }
        out
    }

    // ----- nodes -----

    pub fn put_node(&mut self, name: &str, node: NodeObj) {
        self.changes
            .push(Change::Node(Watch::Applied(node.as_ipam(name))));
        self.nodes.insert(name.to_string(), node);
    }

    pub fn delete_node(&mut self, name: &str) {
        if let Some(n) = self.nodes.remove(name) {
            self.changes
                .push(Change::Node(Watch::Deleted(n.as_ipam(name))));
        }
    }

    /// The controller's merge patch of podCIDRs with the UID precondition.
    pub fn patch_node(&mut self, name: &str, uid: Option<&str>, cidrs: &[IpNet]) -> Patched {
        let Some(node) = self.nodes.get(name) else {
            return Patched::Missing;
        };
        if uid.is_some_and(|u| u != node.uid) {
            return Patched::Refused("409 Conflict: uid precondition failed".into());
        }
        let wanted: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        if !node.cidrs.is_empty() && node.cidrs != wanted {
            return Patched::Refused("422 Invalid: spec.podCIDRs may not change once set".into());
        }
        let uid = node.uid.clone();
        if node.cidrs.is_empty() {
            let mut node = node.clone();
            node.cidrs = wanted;
            node.ours = true;
            self.put_node(name, node);
        }
        Patched::Applied(cidrs.to_vec(), uid)
    }

    /// A fresh GET of a node.
    pub fn read_node(&self, name: &str) -> NodeNow {
        match self.nodes.get(name) {
            None => NodeNow::Gone,
            // Fences are the leadership simulator's (sim/leadership.rs): here a write
            // lands on its object whatever its seal.
            Some(n) if n.cidrs.is_empty() => NodeNow::Empty {
                uid: Some(n.uid.clone()),
                fence: nodeipam_alloc::seal::Fence::default(),
            },
            Some(n) => NodeNow::Has {
                uid: Some(n.uid.clone()),
                cidrs: n.nets(),
            },
        }
    }

    // ----- configs -----

    /// Every write moves the config's resourceVersion (as etcd's revision does): the finalizer
    /// patches test it.
    pub fn put_config(&mut self, mut config: NodeIPAMConfig) {
        self.versions += 1;
        config.metadata.resource_version = Some(self.versions.to_string());
        let name = config.metadata.name.clone().unwrap_or_default();
        self.changes
            .push(Change::Config(Watch::Applied(config.clone())));
        let ranges = [&config.spec.ipv4, &config.spec.ipv6]
            .into_iter()
            .flatten()
            .filter_map(|f| f.cidr.parse().ok())
            .collect();
        self.config_ranges.insert(name.clone(), ranges);
        self.configs.insert(name, config);
    }

    /// A delete: marked while finalizers remain, gone when none do.
    pub fn delete_config(&mut self, name: &str, now: i64) {
        let Some(mut c) = self.configs.get(name).cloned() else {
            return;
        };
        if c.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
        {
            if c.metadata.deletion_timestamp.is_none() {
                c.metadata.deletion_timestamp = Some(time(now));
                self.put_config(c);
            }
        } else {
            self.remove_config(c);
        }
    }

    /// The config goes (no finalizer holds it).
    fn remove_config(&mut self, c: NodeIPAMConfig) {
        let name = c.metadata.name.clone().unwrap_or_default();
        self.configs.remove(&name);
        self.config_ranges.remove(&name);
        self.changes.push(Change::Config(Watch::Deleted(c.clone())));
        self.last_gone = Some(c);
    }

    /// A controller's JSON patch of a config's finalizers (`config_writer.rs edit_finalizers`),
    /// applied to the object as the API server would: its tests (the resourceVersion read just
    /// before, the UID) decide whether it lands. A new finalizer on an object being deleted is
    /// refused; the last one taken off it takes the object. `Ok(Some)`: the object went.
    pub fn patch_finalizers(
        &mut self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Option<NodeIPAMConfig>, String> {
        let c = self
            .configs
            .get(name)
            .ok_or(format!("404 NotFound: {name}"))?;
        let mut doc = serde_json::to_value(c).expect("a config serializes");
        let ops: json_patch::Patch = serde_json::from_value(patch.clone()).expect("our own patch");
        json_patch::patch(&mut doc, &ops).map_err(|e| format!("422 Invalid: {name}: {e}"))?;
        let patched: NodeIPAMConfig = serde_json::from_value(doc).expect("a patched config");
        let before = c.metadata.finalizers.clone().unwrap_or_default();
        let after = patched.metadata.finalizers.clone().unwrap_or_default();
        let deleting = c.metadata.deletion_timestamp.is_some();
        if deleting && after.iter().any(|f| !before.contains(f)) {
            return Err(format!(
                "403 Forbidden: {name} is being deleted: no new finalizers"
            ));
        }
        if after == before {
            return Ok(None);
        }
        if after.is_empty() && deleting {
            self.remove_config(patched.clone());
            return Ok(Some(patched));
        }
        self.put_config(patched);
        Ok(None)
    }

    /// The status subresource, written by the controller's JSON patch (`fence::status_patch`):
    /// applied to the object as the API server would, so its tests decide whether it lands.
    /// Returns whether it did.
    pub fn patch_status(&mut self, name: &str, patch: &serde_json::Value) -> bool {
        let Some(mut c) = self.configs.get(name).cloned() else {
            return false;
        };
        let mut doc = serde_json::to_value(&c).expect("a config serializes");
        let ops: json_patch::Patch = serde_json::from_value(patch.clone()).expect("our own patch");
        if json_patch::patch(&mut doc, &ops).is_err() {
            return false;
        }
        let patched: NodeIPAMConfig = serde_json::from_value(doc).expect("a patched config");
        let Some(status) = patched.status else {
            return false;
        };
        self.status_tampered.remove(name);
        if c.status.as_ref() == Some(&status) {
            return true;
        }
        c.status = Some(status);
        self.put_config(c);
        true
    }

    /// A controller's create: AlreadyExists when the name is taken, refused (as the webhook
    /// does) when it overlaps a config. A child whose owner is gone is collected at once, as
    /// the garbage collector would soon.
    pub fn create_config(&mut self, mut config: NodeIPAMConfig, now: i64) -> CreateOutcome {
        let name = config.metadata.name.clone().unwrap_or_default();
        if self.configs.contains_key(&name) {
            return CreateOutcome::AlreadyExists;
        }
        let ranges = |c: &NodeIPAMConfig| -> Vec<IpNet> {
            [&c.spec.ipv4, &c.spec.ipv6]
                .into_iter()
                .flatten()
                .filter_map(|f| f.cidr.parse().ok())
                .collect()
        };
        let ours = ranges(&config);
        if let Some(other) = self.configs.values().find(|c| {
            ranges(c).iter().any(|r| {
                ours.iter()
                    .any(|o| nodeipam_alloc::ipam::nets_overlap(o, r))
            })
        }) {
            return CreateOutcome::Failed(format!(
                "admission webhook denied the request: overlaps NodeIPAMConfig {}",
                other.metadata.name.as_deref().unwrap_or("")
            ));
        }
        config.metadata.uid = Some(self.uid("config"));
        config.metadata.generation = Some(1);
        config.metadata.creation_timestamp = Some(time(now));
        let owner = config
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        self.put_config(config);
        if owner.is_some_and(|uid| {
            !self
                .pools
                .values()
                .any(|p| p.metadata.uid == Some(uid.clone()))
        }) {
            self.delete_config(&name, now);
        }
        CreateOutcome::Created
    }

    /// A controller's JSON patch of a config (a pool child's enable, `fence::enable_patch`),
    /// applied to the object as the API server would: its tests decide whether it lands (a
    /// failed one is a 422). A spec change moves the generation.
    pub fn patch_config(&mut self, name: &str, patch: &serde_json::Value) -> Result<(), String> {
        let c = self
            .configs
            .get(name)
            .ok_or(format!("404 NotFound: {name}"))?;
        let mut doc = serde_json::to_value(c).expect("a config serializes");
        let ops: json_patch::Patch = serde_json::from_value(patch.clone()).expect("our own patch");
        json_patch::patch(&mut doc, &ops).map_err(|e| format!("422 Invalid: {name}: {e}"))?;
        let mut patched: NodeIPAMConfig = serde_json::from_value(doc).expect("a patched config");
        if patched.spec != c.spec {
            patched.metadata.generation = Some(c.metadata.generation.unwrap_or(1) + 1);
        }
        if patched != *c {
            self.put_config(patched);
        }
        Ok(())
    }

    /// A controller's delete with the UID and resourceVersion preconditions
    /// (`pool_writer.rs delete`, at the version it read just before).
    pub fn delete_config_at(
        &mut self,
        name: &str,
        (uid, version): (Option<String>, Option<String>),
        now: i64,
    ) -> Result<(), String> {
        let c = self
            .configs
            .get(name)
            .ok_or(format!("404 NotFound: {name}"))?;
        let moved = |want: &Option<String>, have: &Option<String>| want.is_some() && want != have;
        if moved(&uid, &c.metadata.uid) || moved(&version, &c.metadata.resource_version) {
            return Err(format!("409 Conflict: {name}: precondition failed"));
        }
        self.delete_config(name, now);
        Ok(())
    }

    // ----- pools -----

    pub fn put_pool(&mut self, pool: NodeIPAMPool) {
        let name = pool.metadata.name.clone().unwrap_or_default();
        self.changes
            .push(Change::Pool(Watch::Applied(pool_input(&pool))));
        self.pools.insert(name, pool);
    }

    /// Pools carry no finalizer: gone at once, and the garbage collector deletes the
    /// children it controls (which then drain behind our finalizer).
    pub fn delete_pool(&mut self, name: &str, now: i64) {
        let Some(p) = self.pools.remove(name) else {
            return;
        };
        self.changes
            .push(Change::Pool(Watch::Deleted(pool_input(&p))));
        let children: Vec<String> = self
            .configs
            .iter()
            .filter(|(_, c)| controller_uid(c) == p.metadata.uid)
            .map(|(n, _)| n.clone())
            .collect();
        for c in children {
            self.delete_config(&c, now);
        }
    }

    /// The pool status subresource, with the UID precondition. `Err`: the API server's refusal.
    pub fn write_pool_status(
        &mut self,
        name: &str,
        uid: Option<&str>,
        status: PoolStatus,
    ) -> Result<(), String> {
        let mut p = self
            .pools
            .get(name)
            .cloned()
            .ok_or(format!("404 NotFound: {name}"))?;
        if uid.is_some() && p.metadata.uid.as_deref() != uid {
            return Err(format!("422 Invalid: {name}: the UID test failed"));
        }
        if p.status.as_ref() != Some(&status) {
            p.status = Some(status);
            self.put_pool(p);
        }
        Ok(())
    }

    // ----- services and outputs -----

    pub fn put_service(&mut self, name: &str, cidrs: Vec<String>) {
        self.changes
            .push(Change::Service(Watch::Applied(service(name, &cidrs))));
        self.services.insert(name.to_string(), cidrs);
    }

    pub fn delete_service(&mut self, name: &str) {
        if let Some(cidrs) = self.services.remove(name) {
            self.changes
                .push(Change::Service(Watch::Deleted(service(name, &cidrs))));
        }
    }

    /// Writes (`Some`) or deletes an object of an output. A write that changes it moves its
    /// resourceVersion; the UID stays the object's.
    pub fn put_object(&mut self, index: usize, name: &str, object: Option<DynamicObject>) {
        let old = self.outputs[index].get(name).map(|o| o.metadata.clone());
        let object = object.map(|mut o| {
            o.metadata.resource_version = old.as_ref().and_then(|m| m.resource_version.clone());
            o.metadata.uid = old.as_ref().and_then(|m| m.uid.clone());
            o
        });
        let old = self.outputs[index].get(name);
        if old == object.as_ref() {
            return;
        }
        let fresh = old.is_none();
        let object = object.map(|mut o| {
            self.versions += 1;
            o.metadata.resource_version = Some(self.versions.to_string());
            if fresh {
                self.uids += 1;
                o.metadata.uid = Some(format!("object-{}", self.uids));
            }
            o
        });
        let old = self.outputs[index].get(name);
        let event = match (&object, old) {
            (Some(o), _) => Watch::Applied(o.clone()),
            (None, Some(old)) => Watch::Deleted(old.clone()),
            (None, None) => return,
        };
        self.changes.push(Change::Output(index, event));
        match object {
            Some(o) => self.outputs[index].insert(name.to_string(), o),
            None => self.outputs[index].remove(name),
        };
    }

    /// A controller's write of an object of an output, with the precondition `send` carries
    /// (`fence::send`, decided from its read): a create is refused when the object exists, an
    /// update once its version moved. `Err`: the API server's refusal.
    pub fn send_object(
        &mut self,
        index: usize,
        name: &str,
        object: DynamicObject,
        send: &Send,
    ) -> Result<(), String> {
        let current = self.outputs[index].get(name);
        let version = current.map(|o| o.metadata.resource_version.clone());
        match (send, version) {
            (Send::Skip, _) => return Ok(()),
            (Send::Create, Some(_)) => return Err(format!("409 AlreadyExists: {name}")),
            (
                Send::At {
                    resource_version: Some(_),
                },
                None,
            ) => {
                return Err(format!("404 NotFound: {name}"));
            }
            (
                Send::At {
                    resource_version: Some(v),
                },
                Some(have),
            ) if have.as_ref() != Some(v) => {
                return Err(format!(
                    "409 Conflict: {name} was modified since version {v}"
                ));
            }
            _ => {}
        }
        self.put_object(index, name, Some(object));
        Ok(())
    }

    /// A controller's delete of an object of an output, with the UID and resourceVersion
    /// preconditions `fence::delete_at` gives.
    pub fn delete_object_at(
        &mut self,
        index: usize,
        name: &str,
        (uid, version): (Option<String>, Option<String>),
    ) -> Result<(), String> {
        let Some(o) = self.outputs[index].get(name) else {
            return Err(format!("404 NotFound: {name}"));
        };
        let moved = |want: &Option<String>, have: &Option<String>| want.is_some() && want != have;
        if moved(&uid, &o.metadata.uid) || moved(&version, &o.metadata.resource_version) {
            return Err(format!("409 Conflict: {name}: precondition failed"));
        }
        self.put_object(index, name, None);
        Ok(())
    }

    /// Writes (`Some`) or deletes the ConfigMap of output `index`.
    pub fn put_configmap(&mut self, index: usize, data: Option<BTreeMap<String, String>>) {
        let object = data.map(|d| configmap(index, d));
        self.put_object(index, CONFIGMAPS[index], object);
    }

    /// The data of the ConfigMap of output `index`, when it exists.
    pub fn configmap_data(&self, index: usize) -> Option<BTreeMap<String, String>> {
        let cm = self.outputs[index].get(CONFIGMAPS[index])?;
        serde_json::from_value(cm.data.get("data")?.clone()).ok()
    }
}

/// The ConfigMap of output `index` with `data`.
pub fn configmap(index: usize, data: BTreeMap<String, String>) -> DynamicObject {
    fixtures::configmap("kube-system", CONFIGMAPS[index], data)
}

/// The uid of a config's controller owner.
pub fn controller_uid(c: &NodeIPAMConfig) -> Option<String> {
    c.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
}

pub fn time(seconds: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap_or_default())
}

fn service(name: &str, cidrs: &[String]) -> ServiceCIDR {
    let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
    fixtures::service_cidr(name, &cidrs)
}

/// The ConfigMaps of outputs 0 (ours) and 1 (ip-masq-agent's).
const CONFIGMAPS: [&str; 2] = ["nodeipam-pod-network", "ip-masq-agent"];

/// Output `index` of a setup: our ConfigMap, ip-masq-agent's, then Calico IPPools (every
/// pool labelled ours, one per outermost range), in the order the publisher writes them.
pub fn output(index: usize) -> OutputRef {
    match index {
        0 | 1 => {
            let target = ConfigMapRef {
                namespace: "kube-system".into(),
                name: CONFIGMAPS[index].into(),
            };
            let kind = [OutputKind::PodNetwork, OutputKind::IpMasqAgent][index];
            OutputRef::configmap(&target, kind)
        }
        _ => OutputRef::typed(
            OutputKind::CalicoIPPools(CalicoPools::default()),
            "crd.projectcalico.org/v1",
            None,
        ),
    }
}
