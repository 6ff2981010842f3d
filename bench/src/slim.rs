//! A Node as an IPAM controller needs it: name, uid, resourceVersion, labels and podCIDRs.
//! Everything else (status, managedFields, annotations) is skipped while parsing instead of
//! being built into objects, which is most of the work of reading a list of Nodes.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::{Deserialize, Deserializer};

#[derive(Clone, Debug)]
pub struct SlimNode {
    pub metadata: ObjectMeta,
    pub pod_cidrs: Vec<String>,
}

#[derive(Deserialize)]
struct Raw {
    metadata: RawMeta,
    #[serde(default)]
    spec: RawSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    labels: Option<BTreeMap<String, String>>,
}

#[derive(Default, Deserialize)]
struct RawSpec {
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
}

impl<'de> Deserialize<'de> for SlimNode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Raw::deserialize(d)?;
        let pod_cidrs = match raw.spec.pod_cidrs.filter(|l| !l.is_empty()) {
            Some(l) => l,
            None => raw
                .spec
                .pod_cidr
                .into_iter()
                .filter(|c| !c.is_empty())
                .collect(),
        };
        Ok(SlimNode {
            metadata: ObjectMeta {
                name: raw.metadata.name,
                uid: raw.metadata.uid,
                resource_version: raw.metadata.resource_version,
                labels: raw.metadata.labels,
                ..ObjectMeta::default()
            },
            pod_cidrs,
        })
    }
}

impl kube::Resource for SlimNode {
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

    #[test]
    fn keeps_what_ipam_needs() {
        let full = serde_json::to_value(crate::nodes::node(
            "n-1",
            "g",
            1,
            Some(&"10.0.1.0/24".parse().expect("cidr")),
        ))
        .expect("node to json");
        let slim: SlimNode = serde_json::from_value(full).expect("slim");
        assert_eq!(slim.metadata.name.as_deref(), Some("n-1"));
        assert_eq!(slim.pod_cidrs, vec!["10.0.1.0/24".to_string()]);
        assert_eq!(slim.metadata.labels.map(|l| l.len()), Some(5));
        let legacy: SlimNode = serde_json::from_str(
            r#"{"metadata":{"name":"a","managedFields":[{"fieldsV1":{"f:x":{}}}]},"spec":{"podCIDR":"10.0.0.0/24"},"status":{"capacity":{"cpu":"1"}}}"#,
        )
        .expect("slim");
        assert_eq!(legacy.pod_cidrs, vec!["10.0.0.0/24".to_string()]);
    }
}
