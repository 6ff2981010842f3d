//! Cheap API objects for the machine's tests, the simulator and the benches: a Node, a
//! NodeIPAMConfig, a ServiceCIDR and a ConfigMap with only the fields allocation reads.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::networking::v1::{ServiceCIDR, ServiceCIDRSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube_core::DynamicObject;
use nodeipam_crd::{Allocation, FINALIZER, FamilySpec, NodeIPAMConfig, NodeIPAMConfigSpec};

use crate::node::IpamNode;

/// A Node with these labels and podCIDRs (none: it waits for a block).
pub fn node(name: &str, uid: &str, labels: &[(&str, &str)], cidrs: &[&str]) -> IpamNode {
    IpamNode {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(uid.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        pod_cidr: cidrs.first().map(|c| c.to_string()),
        pod_cidrs: (!cidrs.is_empty()).then(|| cidrs.iter().map(|c| c.to_string()).collect()),
    }
}

/// One family of a config: `(cidr, perNodeMaskSize)`.
pub type Family<'a> = Option<(&'a str, u8)>;

/// A NodeIPAMConfig created at `created` (seconds), with our finalizer when `finalized`.
pub fn config(
    name: &str,
    uid: &str,
    created: i64,
    (ipv4, ipv6): (Family<'_>, Family<'_>),
    selector: Option<NodeSelector>,
    finalized: bool,
) -> NodeIPAMConfig {
    let family = |f: Family<'_>| {
        f.map(|(cidr, mask)| FamilySpec {
            cidr: cidr.into(),
            per_node_mask_size: mask,
        })
    };
    let spec = NodeIPAMConfigSpec {
        ipv4: family(ipv4),
        ipv6: family(ipv6),
        node_selector: selector,
        allocation: Allocation::Enabled,
    };
    let mut obj = NodeIPAMConfig::new(name, spec);
    obj.metadata.uid = Some(uid.into());
    obj.metadata.generation = Some(1);
    obj.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(created).unwrap_or_default(),
    ));
    if finalized {
        obj.metadata.finalizers = Some(vec![FINALIZER.into()]);
    }
    obj
}

/// A selector of the nodes labelled `key=value`.
pub fn selecting(key: &str, value: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: "In".into(),
                values: Some(vec![value.into()]),
            }]),
            match_fields: None,
        }],
    }
}

/// A ServiceCIDR object.
pub fn service_cidr(name: &str, cidrs: &[&str]) -> ServiceCIDR {
    ServiceCIDR {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
        }),
        status: None,
    }
}

/// A ConfigMap holding `data`.
/// A ConfigMap as an output's watch shows it: a dynamic object.
pub fn configmap(namespace: &str, name: &str, data: BTreeMap<String, String>) -> DynamicObject {
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": namespace },
        "data": data,
    });
    serde_json::from_value(cm).expect("a ConfigMap is a dynamic object")
}

/// One family of a pool: `(budget CIDRs, range mask, per-node mask)`.
pub type PoolFamily<'a> = Option<(&'a [&'a str], u8, u8)>;

/// A NodeIPAMPool as the machine takes it: `(min, max, headroom blocks)`, empty for
/// `empty_for` seconds before a child retires.
pub fn pool(
    name: &str,
    uid: &str,
    (ipv4, ipv6): (PoolFamily<'_>, PoolFamily<'_>),
    (min, max, headroom): (u32, u32, u64),
    empty_for: u64,
    selector: Option<NodeSelector>,
) -> crate::pool::PoolInput {
    let family = |f: PoolFamily<'_>| {
        f.map(
            |(cidrs, range_mask, per_node_mask)| crate::pool::PoolFamily {
                cidrs: cidrs.iter().filter_map(|c| c.parse().ok()).collect(),
                range_mask,
                per_node_mask,
            },
        )
    };
    crate::pool::PoolInput {
        name: name.into(),
        uid: Some(uid.into()),
        generation: Some(1),
        ipv4: family(ipv4),
        ipv6: family(ipv6),
        selector,
        min,
        max,
        headroom,
        empty_for: std::time::Duration::from_secs(empty_for),
        deleting: false,
        invalid: None,
        status: None,
    }
}
