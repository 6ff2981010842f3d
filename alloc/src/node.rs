//! A Node as node IPAM reads it: name, uid, resourceVersion, labels, the seal annotation and the
//! podCIDR fields. Everything else (status with its images and conditions, managedFields, the
//! other annotations) is
//! skipped while parsing instead of being built into objects. That is most of the work of
//! reading Nodes, which is what start-up with many nodes and every watch event cost.

use std::borrow::Cow;
use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_core::ClusterResourceScope;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub mod protobuf;

/// The parts of a `core/v1` Node that allocation looks at. Usable with `Api`, watchers and
/// reflectors like any resource; it is only ever read, never written back whole.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IpamNode {
    /// Only name, uid, resourceVersion, labels and annotations are filled in; of the
    /// annotations only the seal's is kept ([`keep_seal`]).
    pub metadata: ObjectMeta,
    /// `spec.podCIDR`, as written.
    pub pod_cidr: Option<String>,
    /// `spec.podCIDRs`, as written.
    pub pod_cidrs: Option<Vec<String>>,
}

impl IpamNode {
    /// The node's podCIDRs, canonical; `spec.podCIDR` counts when `podCIDRs` is empty. An
    /// unparsable entry is an error naming the field, never a panic: Nodes are user input.
    pub fn cidrs(&self) -> Result<Vec<IpNet>, String> {
        let list: Vec<&String> = match self.pod_cidrs.as_ref().filter(|l| !l.is_empty()) {
            Some(l) => l.iter().collect(),
            None => self.pod_cidr.iter().filter(|c| !c.is_empty()).collect(),
        };
        list.iter()
            .map(|c| {
                c.parse::<IpNet>()
                    .map(|n| n.trunc())
                    .map_err(|e| format!("spec.podCIDRs: {c:?} is not a CIDR: {e}"))
            })
            .collect()
    }
}

/// A Node's annotations as we keep them: none when it has none (the API server's JSON then has
/// no `annotations` at all, which the seal's fence must know: `seal::Fence`), otherwise only
/// the seal's, if it is there.
pub fn keep_seal(all: Option<BTreeMap<String, String>>) -> Option<BTreeMap<String, String>> {
    all.map(|mut all| {
        all.retain(|k, _| k == crate::seal::ANNOTATION);
        all
    })
}

#[derive(Deserialize)]
struct Raw {
    metadata: RawMeta,
    #[serde(default)]
    spec: Option<RawSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Default, Deserialize)]
struct RawSpec {
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for IpamNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Raw::deserialize(d)?;
        let spec = raw.spec.unwrap_or_default();
        Ok(IpamNode {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                uid: raw.metadata.uid,
                resource_version: raw.metadata.resource_version,
                labels: raw.metadata.labels,
                annotations: keep_seal(raw.metadata.annotations),
                ..ObjectMeta::default()
            },
            pod_cidr: spec.pod_cidr,
            pod_cidrs: spec.pod_cidrs,
        })
    }
}

/// The same slim shape back as JSON (for a list read as protobuf and handed to a JSON
/// reader); absent fields stay absent.
impl Serialize for IpamNode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            name: &'a Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            uid: &'a Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            resource_version: &'a Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            labels: &'a Option<BTreeMap<String, String>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            annotations: &'a Option<BTreeMap<String, String>>,
        }
        #[derive(Serialize)]
        struct Spec<'a> {
            #[serde(rename = "podCIDR", skip_serializing_if = "Option::is_none")]
            pod_cidr: &'a Option<String>,
            #[serde(rename = "podCIDRs", skip_serializing_if = "Option::is_none")]
            pod_cidrs: &'a Option<Vec<String>>,
        }
        #[derive(Serialize)]
        struct Out<'a> {
            metadata: Meta<'a>,
            spec: Spec<'a>,
        }
        let m = &self.metadata;
        Out {
            metadata: Meta {
                name: &m.name,
                uid: &m.uid,
                resource_version: &m.resource_version,
                labels: &m.labels,
                annotations: &m.annotations,
            },
            spec: Spec {
                pod_cidr: &self.pod_cidr,
                pod_cidrs: &self.pod_cidrs,
            },
        }
        .serialize(s)
    }
}

impl kube_core::Resource for IpamNode {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Node".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "nodes".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus};
    use kube_core::Resource;

    fn parse(json: &str) -> IpamNode {
        serde_json::from_str(json).expect("node json")
    }

    #[test]
    fn keeps_what_allocation_needs_from_a_full_node() {
        let full = Node {
            metadata: ObjectMeta {
                name: Some("n-1".into()),
                uid: Some("u-1".into()),
                resource_version: Some("42".into()),
                labels: Some(BTreeMap::from([("zone".into(), "a".into())])),
                annotations: Some(BTreeMap::from([("a".into(), "b".into())])),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                pod_cidr: Some("10.0.1.0/24".into()),
                pod_cidrs: Some(vec!["10.0.1.0/24".into(), "fd00::/64".into()]),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus::default()),
        };
        let slim: IpamNode =
            serde_json::from_value(serde_json::to_value(&full).expect("to json")).expect("slim");
        assert_eq!(slim.metadata.name.as_deref(), Some("n-1"));
        assert_eq!(slim.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(slim.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(slim.metadata.labels, full.metadata.labels);
        assert_eq!(
            slim.metadata.annotations,
            Some(BTreeMap::new()),
            "there are annotations, but only the seal's is kept"
        );
        assert_eq!(
            slim.cidrs().map(|c| c.len()),
            Ok(2),
            "podCIDRs wins over podCIDR"
        );
        assert_eq!(IpamNode::plural(&()), "nodes");
        assert_eq!(IpamNode::api_version(&()), "v1");
    }

    #[test]
    fn the_slim_json_reads_back_as_the_same_node() {
        let full = parse(
            r#"{"metadata":{"name":"a","uid":"u","resourceVersion":"9","labels":{"k":"v"},
                "annotations":{"x":"y"}},"spec":{"podCIDR":"10.0.0.0/24",
                "podCIDRs":["10.0.0.0/24","fd00::/64"]}}"#,
        );
        let empty = parse(r#"{"metadata":{}}"#);
        for node in [full, empty] {
            let json = serde_json::to_string(&node).expect("to json");
            assert_eq!(parse(&json), node, "{json}");
        }
    }

    #[test]
    fn skips_status_and_managed_fields_and_reads_legacy_pod_cidr() {
        let n = parse(
            r#"{"metadata":{"name":"a","managedFields":[{"fieldsV1":{"f:x":{}}}]},
                "spec":{"podCIDR":"10.0.0.7/24"},
                "status":{"images":[{"names":["x"],"sizeBytes":1}],"capacity":{"cpu":"1"}}}"#,
        );
        assert_eq!(n.cidrs(), Ok(vec!["10.0.0.0/24".parse().expect("cidr")]));
    }

    #[test]
    fn odd_nodes_parse_and_garbage_is_reported_not_panicked_on() {
        assert_eq!(parse(r#"{"metadata":{}}"#).cidrs(), Ok(vec![]));
        assert_eq!(
            parse(r#"{"metadata":{"name":"a"},"spec":null}"#).cidrs(),
            Ok(vec![])
        );
        assert_eq!(
            parse(r#"{"metadata":{"name":"a"},"spec":{"podCIDR":"","podCIDRs":[]}}"#).cidrs(),
            Ok(vec![])
        );
        let err = parse(r#"{"metadata":{"name":"a"},"spec":{"podCIDRs":["bogus"]}}"#)
            .cidrs()
            .expect_err("garbage");
        assert!(
            err.contains("spec.podCIDRs") && err.contains("bogus"),
            "{err}"
        );
        assert!(serde_json::from_str::<IpamNode>(r#"{"spec":{}}"#).is_err());
    }
}
