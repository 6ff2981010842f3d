//! The consumer outputs of the pod network: where each lives (a ConfigMap, a typed object of
//! Calico or Cilium, or a set of them), what each holds as its watch shows it, and the objects
//! we write to it. Pure: no client; the publisher applies what is rendered here.

use std::collections::BTreeMap;

use ipnet::IpNet;
use kube_core::{DynamicObject, ResourceExt};
use serde_json::{Value, json};

use crate::podnetwork::{ConfigMapRef, PodNetwork, ip_masq_agent_cidrs, join};

/// The label on every typed object we write. Objects of a kind we keep many of (Calico
/// IPPools) are watched, and removed, only with it: a pool without it is never ours.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "nodeipam");

/// How Calico carries pod traffic between nodes for the IPPools we keep (`ipipMode` and
/// `vxlanMode`). IP-in-IP is IPv4 only: an IPv6 pool gets VXLAN or nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encapsulation {
    #[default]
    None,
    IpIp,
    IpIpCrossSubnet,
    Vxlan,
    VxlanCrossSubnet,
}

impl Encapsulation {
    /// `(ipipMode, vxlanMode)` for a pool of `range`.
    fn modes(self, range: &IpNet) -> (&'static str, &'static str) {
        let v4 = matches!(range, IpNet::V4(_));
        match self {
            Encapsulation::IpIp if v4 => ("Always", "Never"),
            Encapsulation::IpIpCrossSubnet if v4 => ("CrossSubnet", "Never"),
            Encapsulation::Vxlan => ("Never", "Always"),
            Encapsulation::VxlanCrossSubnet => ("Never", "CrossSubnet"),
            _ => ("Never", "Never"),
        }
    }
}

impl std::str::FromStr for Encapsulation {
    type Err = String;
    /// The names Calico's operator uses for `Installation` encapsulation.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "None" => Ok(Encapsulation::None),
            "IPIP" => Ok(Encapsulation::IpIp),
            "IPIPCrossSubnet" => Ok(Encapsulation::IpIpCrossSubnet),
            "VXLAN" => Ok(Encapsulation::Vxlan),
            "VXLANCrossSubnet" => Ok(Encapsulation::VxlanCrossSubnet),
            _ => Err(format!(
                "{s:?} is not one of None, IPIP, IPIPCrossSubnet, VXLAN, VXLANCrossSubnet"
            )),
        }
    }
}

/// The settings of the Calico IPPools we keep, the same for every range.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CalicoPools {
    pub nat_outgoing: bool,
    pub encapsulation: Encapsulation,
    /// Calico IPAM assigns nothing from a disabled pool; with host-local IPAM it assigns
    /// nothing from any, and the pool still marks the range as pod traffic.
    pub disabled: bool,
}

/// A consumer output of the pod network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputKind {
    /// Our aggregate ConfigMap (`--pod-network-configmap`).
    PodNetwork,
    /// ip-masq-agent's ConfigMap, of which only `nonMasqueradeCIDRs` is ours.
    IpMasqAgent,
    /// One Calico `IPPool` per range, labelled [`MANAGED_BY`].
    CalicoIPPools(CalicoPools),
    /// A Calico `GlobalNetworkSet` whose `nets` are the whole pod network.
    CalicoNetworkSet,
    /// A `CiliumCIDRGroup` whose `externalCIDRs` are the whole pod network.
    CiliumCIDRGroup,
}

/// What an output holds: the CIDRs consumers learn from it, and the part of it we own, to
/// compare with what we would write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputContent {
    pub cidrs: Vec<IpNet>,
    pub ours: String,
}

impl OutputKind {
    /// The kind of object the output is made of.
    pub fn resource(self) -> &'static str {
        match self {
            OutputKind::PodNetwork | OutputKind::IpMasqAgent => "ConfigMap",
            OutputKind::CalicoIPPools(_) => "IPPool",
            OutputKind::CalicoNetworkSet => "GlobalNetworkSet",
            OutputKind::CiliumCIDRGroup => "CiliumCIDRGroup",
        }
    }

    /// The resource's plural, as its URL and RBAC name it.
    pub fn plural(self) -> &'static str {
        match self {
            OutputKind::PodNetwork | OutputKind::IpMasqAgent => "configmaps",
            OutputKind::CalicoIPPools(_) => "ippools",
            OutputKind::CalicoNetworkSet => "globalnetworksets",
            OutputKind::CiliumCIDRGroup => "ciliumcidrgroups",
        }
    }

    /// Reads a ConfigMap's data. Whatever does not parse counts as absent: a range is only
    /// known to consumers when they can read it. Typed outputs hold no data: nothing.
    pub fn read(self, data: &BTreeMap<String, String>) -> OutputContent {
        match self {
            OutputKind::PodNetwork => {
                let cidrs = ["ipv4", "ipv6"]
                    .iter()
                    .filter_map(|k| data.get(*k))
                    .flat_map(|v| v.split(',').filter_map(|c| c.trim().parse::<IpNet>().ok()))
                    .collect();
                let ours = data
                    .iter()
                    .filter(|(k, _)| k.as_str() != "observedAt")
                    .map(|(k, v)| format!("{k}={v}\n"))
                    .collect();
                OutputContent { cidrs, ours }
            }
            OutputKind::IpMasqAgent => {
                let cidrs: Vec<IpNet> = data
                    .get("config")
                    .and_then(|text| serde_saphyr::from_str::<Value>(text).ok())
                    .and_then(|doc| Some(cidr_list(doc.get("nonMasqueradeCIDRs")?)))
                    .unwrap_or_default();
                let ours = join(cidrs.iter().copied());
                OutputContent { cidrs, ours }
            }
            _ => OutputContent::default(),
        }
    }

    /// What the objects an output's watch shows hold, by name.
    pub fn read_objects(self, objects: &BTreeMap<String, DynamicObject>) -> OutputContent {
        match self {
            OutputKind::PodNetwork | OutputKind::IpMasqAgent => {
                let data = objects.values().next().map(configmap_data);
                self.read(&data.unwrap_or_default())
            }
            OutputKind::CalicoIPPools(_) => {
                let mut content = OutputContent::default();
                for (name, pool) in objects {
                    let spec = spec(pool);
                    let cidr = spec.get("cidr").and_then(Value::as_str).unwrap_or("");
                    content.cidrs.extend(cidr.trim().parse::<IpNet>().ok());
                    content.ours += &pool_line(name, spec);
                }
                content
            }
            OutputKind::CalicoNetworkSet | OutputKind::CiliumCIDRGroup => {
                let key = self.list_field();
                let list = objects.values().next().and_then(|o| spec(o).get(key));
                OutputContent {
                    cidrs: list.map(cidr_list).unwrap_or_default(),
                    ours: list.map(Value::to_string).unwrap_or_default(),
                }
            }
        }
    }

    /// The spec field of a single-object typed output that lists the pod network.
    fn list_field(self) -> &'static str {
        match self {
            OutputKind::CalicoNetworkSet => "nets",
            _ => "externalCIDRs",
        }
    }
}

/// A ConfigMap's data as a watch of ConfigMaps as dynamic objects shows it; a value that is
/// not a string holds nothing.
fn configmap_data(cm: &DynamicObject) -> BTreeMap<String, String> {
    cm.data
        .get("data")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

fn spec(o: &DynamicObject) -> &Value {
    o.data.get("spec").unwrap_or(&Value::Null)
}

fn cidr_list(list: &Value) -> Vec<IpNet> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str()?.trim().parse().ok())
        .collect()
}

/// The fields of a pool we set, as one line: a pool edited in any of them is written again.
fn pool_line(name: &str, spec: &Value) -> String {
    let text = |k: &str| {
        spec.get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let flag = |k: &str| spec.get(k).and_then(Value::as_bool).unwrap_or(false);
    format!(
        "{name} {} natOutgoing={} ipipMode={} vxlanMode={} disabled={}\n",
        text("cidr"),
        flag("natOutgoing"),
        text("ipipMode"),
        text("vxlanMode"),
        flag("disabled"),
    )
}

/// The name of our IPPool for `range`: its address and length, as a DNS subdomain.
pub fn pool_name(range: &IpNet) -> String {
    let text: String = range
        .to_string()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("nodeipam-{text}")
}

/// Where an output lives and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputRef {
    pub kind: OutputKind,
    /// `group/version`, or `v1` for ConfigMaps.
    pub api_version: String,
    /// ConfigMaps only; the typed outputs are cluster-scoped.
    pub namespace: Option<String>,
    /// The one object of the output; `None` for the IPPools, which are many.
    pub name: Option<String>,
}

impl OutputRef {
    pub fn configmap(target: &ConfigMapRef, kind: OutputKind) -> Self {
        OutputRef {
            kind,
            api_version: "v1".into(),
            namespace: Some(target.namespace.clone()),
            name: Some(target.name.clone()),
        }
    }

    /// A typed output of `kind` at `api_version`: the IPPools are every pool labelled ours,
    /// the others the one object `name`.
    pub fn typed(kind: OutputKind, api_version: &str, name: Option<&str>) -> Self {
        OutputRef {
            kind,
            api_version: api_version.into(),
            namespace: None,
            name: name.map(String::from),
        }
    }

    pub fn is_configmap(&self) -> bool {
        matches!(self.kind, OutputKind::PodNetwork | OutputKind::IpMasqAgent)
    }

    /// What the output holds once `network` is written to it.
    pub fn desired(&self, network: &PodNetwork, extra: &[IpNet]) -> OutputContent {
        match self.kind {
            OutputKind::PodNetwork => self.kind.read(&network.configmap_data("")),
            OutputKind::IpMasqAgent => {
                let cidrs = ip_masq_agent_cidrs(network, extra);
                let ours = join(cidrs.iter().copied());
                OutputContent { cidrs, ours }
            }
            _ => {
                // Read back from what is rendered, so that the two cannot disagree.
                let objects = self
                    .objects(network)
                    .into_iter()
                    .filter_map(|(name, o)| Some((name, serde_json::from_value(o).ok()?)))
                    .collect();
                self.kind.read_objects(&objects)
            }
        }
    }

    /// The objects of a typed output holding `network`, by name, as applied; none for a
    /// ConfigMap. Whatever of ours is not among them is removed.
    pub fn objects(&self, network: &PodNetwork) -> Vec<(String, Value)> {
        let object = |name: &str, spec: Value| {
            json!({
                "apiVersion": self.api_version,
                "kind": self.kind.resource(),
                "metadata": { "name": name, "labels": { MANAGED_BY.0: MANAGED_BY.1 } },
                "spec": spec,
            })
        };
        let whole: Vec<String> = network
            .aggregated()
            .iter()
            .map(ToString::to_string)
            .collect();
        match (self.kind, self.name.as_deref()) {
            (OutputKind::CalicoIPPools(settings), _) => outermost(&network.cidrs())
                .into_iter()
                .map(|range| {
                    let name = pool_name(&range);
                    let (ipip, vxlan) = settings.encapsulation.modes(&range);
                    let spec = json!({
                        "cidr": range.to_string(),
                        "blockSize": block_size(&range),
                        "natOutgoing": settings.nat_outgoing,
                        "ipipMode": ipip,
                        "vxlanMode": vxlan,
                        "disabled": settings.disabled,
                    });
                    let pool = object(&name, spec);
                    (name, pool)
                })
                .collect(),
            (OutputKind::CalicoNetworkSet | OutputKind::CiliumCIDRGroup, Some(name)) => {
                let spec = json!({ self.kind.list_field(): whole });
                vec![(name.to_string(), object(name, spec))]
            }
            _ => Vec::new(),
        }
    }
}

/// The block size of our pool for `range`: Calico's default (/26 for IPv4, /122 for IPv6)
/// unless the range is smaller, since Calico refuses a pool that cannot fit one block. With
/// host-local IPAM Calico allocates no blocks; the size only has to be one it accepts. It is
/// fixed when a pool is created, which is when a range's pool is.
fn block_size(range: &IpNet) -> u8 {
    let default = match range {
        IpNet::V4(_) => 26,
        IpNet::V6(_) => 122,
    };
    range.prefix_len().max(default)
}

/// The ranges not inside another: Calico refuses two pools that overlap, and a nested range
/// (two configs overlapping, one of them refused) is pod traffic through the outer pool.
fn outermost(ranges: &std::collections::BTreeSet<IpNet>) -> Vec<IpNet> {
    ranges
        .iter()
        .filter(|r| !ranges.iter().any(|o| o != *r && o.contains(*r)))
        .copied()
        .collect()
}

/// Our objects of a many-object output that `network` no longer has, from the names the
/// publisher listed with our label.
pub fn stale(wanted: &[(String, Value)], listed: &[String]) -> Vec<String> {
    listed
        .iter()
        .filter(|n| !wanted.iter().any(|(w, _)| w == *n))
        .cloned()
        .collect()
}

/// Whether an object is ours to write over: it carries our label.
pub fn is_ours(o: &DynamicObject) -> bool {
    o.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)
}

/// Whether an object already has every field of the spec we would apply: then nothing is
/// written (an apply that changes nothing still costs a request per object and publication).
pub fn holds_spec(o: &DynamicObject, body: &Value) -> bool {
    let Some(want) = body.get("spec").and_then(Value::as_object) else {
        return false;
    };
    let have = o.data.get("spec");
    want.iter()
        .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
}

impl OutputRef {
    /// Where its objects are, without the kind: `namespace/name`, `name`, or the label that
    /// marks ours among many.
    pub fn locator(&self) -> String {
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (None, Some(name)) => name.clone(),
            _ => format!("{}={}", MANAGED_BY.0, MANAGED_BY.1),
        }
    }
}

impl std::fmt::Display for OutputRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = self.kind.resource();
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => write!(f, "{kind} {ns}/{name}"),
            (None, Some(name)) => write!(f, "{kind} {name}"),
            _ => write!(f, "the {kind}s labelled {}={}", MANAGED_BY.0, MANAGED_BY.1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podnetwork::ConfigRanges;

    fn n(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn network(ranges: &[(&str, bool)]) -> PodNetwork {
        let configs: Vec<ConfigRanges> = ranges
            .iter()
            .enumerate()
            .map(|(i, (r, drained))| ConfigRanges {
                name: format!("c{i}"),
                families: vec![(n(r), 0, 4)],
                nodes: 0,
                deleting: *drained,
                enabled: true,
                drained: *drained,
            })
            .collect();
        PodNetwork::new(&configs, &[])
    }

    fn as_objects(rendered: Vec<(String, Value)>) -> BTreeMap<String, DynamicObject> {
        rendered
            .into_iter()
            .map(|(name, o)| (name, serde_json::from_value(o).expect("a dynamic object")))
            .collect()
    }

    fn pools(settings: CalicoPools) -> OutputRef {
        OutputRef::typed(
            OutputKind::CalicoIPPools(settings),
            "projectcalico.org/v3",
            None,
        )
    }

    #[test]
    fn one_pool_per_range_named_after_it_with_the_settings() {
        let net = network(&[
            ("10.0.0.0/16", false),
            ("10.9.0.0/16", true),
            ("fd00::/48", false),
        ]);
        let settings = CalicoPools {
            nat_outgoing: true,
            encapsulation: Encapsulation::IpIp,
            disabled: true,
        };
        let objects = pools(settings).objects(&net);
        let names: Vec<&str> = objects.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["nodeipam-10-0-0-0-16", "nodeipam-fd00---48"]);
        let v4 = &objects[0].1;
        assert_eq!(v4["apiVersion"], "projectcalico.org/v3");
        assert_eq!(v4["kind"], "IPPool");
        assert_eq!(v4["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
        assert_eq!(v4["spec"]["cidr"], "10.0.0.0/16");
        assert_eq!(v4["spec"]["natOutgoing"], true);
        assert_eq!(v4["spec"]["ipipMode"], "Always");
        assert_eq!(v4["spec"]["vxlanMode"], "Never");
        assert_eq!(v4["spec"]["disabled"], true);
        assert_eq!(v4["spec"]["blockSize"], 26);
        // No IP-in-IP for IPv6.
        assert_eq!(objects[1].1["spec"]["ipipMode"], "Never");
        assert_eq!(objects[1].1["spec"]["blockSize"], 122);
        assert_eq!(objects[1].1["spec"]["vxlanMode"], "Never");
    }

    #[test]
    fn a_range_smaller_than_a_block_gets_blocks_its_own_size() {
        let net = network(&[("10.0.0.0/28", false), ("fd00::/124", false)]);
        let objects = pools(CalicoPools::default()).objects(&net);
        assert_eq!(objects[0].1["spec"]["blockSize"], 28);
        assert_eq!(objects[1].1["spec"]["blockSize"], 124);
        let net = network(&[("10.0.0.0/26", false), ("fd00::/122", false)]);
        let objects = pools(CalicoPools::default()).objects(&net);
        assert_eq!(objects[0].1["spec"]["blockSize"], 26);
        assert_eq!(objects[1].1["spec"]["blockSize"], 122);
    }

    #[test]
    fn a_nested_range_gets_no_pool_of_its_own() {
        let net = network(&[("10.0.0.0/16", false), ("10.0.1.0/24", false)]);
        let objects = pools(CalicoPools::default()).objects(&net);
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].1["spec"]["cidr"], "10.0.0.0/16");
    }

    #[test]
    fn pools_read_back_what_is_rendered_and_an_edit_is_drift() {
        let net = network(&[("10.0.0.0/16", false), ("10.1.0.0/16", false)]);
        let output = pools(CalicoPools::default());
        let mut objects = as_objects(output.objects(&net));
        let read = output.kind.read_objects(&objects);
        assert_eq!(read, output.desired(&net, &[]));
        assert_eq!(read.cidrs, vec![n("10.0.0.0/16"), n("10.1.0.0/16")]);
        let pool = objects.get_mut("nodeipam-10-1-0-0-16").expect("pool");
        pool.data["spec"]["natOutgoing"] = json!(true);
        let edited = output.kind.read_objects(&objects);
        assert_eq!(edited.cidrs, read.cidrs, "still holds the ranges");
        assert_ne!(edited, read, "but is not what we write");
        objects.remove("nodeipam-10-0-0-0-16");
        assert_eq!(
            output.kind.read_objects(&objects).cidrs,
            vec![n("10.1.0.0/16")]
        );
    }

    #[test]
    fn single_object_outputs_list_the_whole_network() {
        let net = network(&[("10.0.0.0/17", false), ("10.0.128.0/17", false)]);
        for (kind, field) in [
            (OutputKind::CalicoNetworkSet, "nets"),
            (OutputKind::CiliumCIDRGroup, "externalCIDRs"),
        ] {
            let output = OutputRef::typed(kind, "example.io/v1", Some("pod-network"));
            let objects = output.objects(&net);
            assert_eq!(objects.len(), 1);
            assert_eq!(
                objects[0].1["spec"][field],
                json!(["10.0.0.0/16"]),
                "{kind:?}"
            );
            let read = kind.read_objects(&as_objects(objects));
            assert_eq!(read, output.desired(&net, &[]));
            assert_eq!(read.cidrs, vec![n("10.0.0.0/16")]);
        }
        let empty = OutputKind::CiliumCIDRGroup.read_objects(&BTreeMap::new());
        assert_eq!(empty, OutputContent::default());
    }

    #[test]
    fn only_labelled_pools_that_left_the_network_are_stale() {
        let net = network(&[("10.0.0.0/16", false)]);
        let wanted = pools(CalicoPools::default()).objects(&net);
        let listed = vec![
            "nodeipam-10-0-0-0-16".to_string(),
            "nodeipam-10-9-0-0-16".into(),
        ];
        assert_eq!(stale(&wanted, &listed), vec!["nodeipam-10-9-0-0-16"]);
        let theirs: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "projectcalico.org/v3", "kind": "IPPool",
            "metadata": { "name": "default-ipv4-ippool" }, "spec": {}
        }))
        .expect("object");
        assert!(!is_ours(&theirs));
        let ours: DynamicObject = serde_json::from_value(wanted[0].1.clone()).expect("object");
        assert!(is_ours(&ours));
        assert!(holds_spec(&ours, &wanted[0].1));
        let mut edited = ours.clone();
        edited.data["spec"]["disabled"] = json!(true);
        assert!(!holds_spec(&edited, &wanted[0].1));
    }

    #[test]
    fn encapsulation_names_are_calicos() {
        assert_eq!("IPIP".parse(), Ok(Encapsulation::IpIp));
        assert_eq!(
            "VXLANCrossSubnet".parse(),
            Ok(Encapsulation::VxlanCrossSubnet)
        );
        let err = "ipip".parse::<Encapsulation>().expect_err("case matters");
        assert!(err.contains("IPIPCrossSubnet"), "{err}");
    }

    #[test]
    fn outputs_say_where_they_are() {
        let cm = ConfigMapRef {
            namespace: "kube-system".into(),
            name: "ip-masq-agent".into(),
        };
        let masq = OutputRef::configmap(&cm, OutputKind::IpMasqAgent);
        assert_eq!(masq.to_string(), "ConfigMap kube-system/ip-masq-agent");
        let group = OutputRef::typed(OutputKind::CiliumCIDRGroup, "cilium.io/v2", Some("pods"));
        assert_eq!(group.to_string(), "CiliumCIDRGroup pods");
        assert_eq!(
            pools(CalicoPools::default()).to_string(),
            "the IPPools labelled app.kubernetes.io/managed-by=nodeipam"
        );
    }
}
