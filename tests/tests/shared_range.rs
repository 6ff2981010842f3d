//! The webhook and the controller agree on what overlaps and on how many blocks a range has,
//! because both call `nodeipam_crd::range`. Checked here without a cluster: for every pair of a
//! set of ranges (nested, adjacent, disjoint, both families, /1s), the webhook's admission
//! decision and the allocator's overlap marking are computed from the same two configs and
//! compared with each other and with `range::overlaps`.

use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use nodeipam_controller::alloc::ipam::Ipam;
use nodeipam_controller::alloc::machine::config_input;
use nodeipam_crd::range::{self, FamilyRange};
use nodeipam_crd::{Allocation, FamilySpec, NodeIPAMConfig, NodeIPAMConfigSpec};
use nodeipam_webhook::review::{ClusterView, FEW_BLOCKS, review};
use serde_json::json;

/// Ranges with a per-node mask each: nested, equal, adjacent and disjoint pairs in both
/// families, including /1s whose blocks span half the address space.
const RANGES: &[(&str, u8)] = &[
    ("0.0.0.0/1", 24),
    ("128.0.0.0/1", 24),
    ("10.0.0.0/8", 24),
    ("10.0.0.0/16", 24),
    ("10.1.0.0/16", 20),
    ("10.0.128.0/17", 26),
    ("10.0.0.0/24", 26),
    ("10.0.1.0/24", 28),
    ("11.0.0.0/8", 16),
    ("fd00::/48", 64),
    ("fd00::/64", 66),
    ("fd00:0:0:1::/64", 64),
    ("fd00::/32", 64),
    ("fd01::/48", 52),
];

fn config(name: &str, created: i64, (cidr, mask): (&str, u8)) -> NodeIPAMConfig {
    let family = Some(FamilySpec {
        cidr: cidr.into(),
        per_node_mask_size: mask,
    });
    let v6 = cidr.contains(':');
    let mut config = NodeIPAMConfig::new(
        name,
        NodeIPAMConfigSpec {
            ipv4: if v6 { None } else { family.clone() },
            ipv6: if v6 { family } else { None },
            node_selector: None,
            allocation: Allocation::Enabled,
        },
    );
    config.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(created).expect("test time"),
    ));
    config
}

fn create(object: &NodeIPAMConfig) -> AdmissionRequest<NodeIPAMConfig> {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "nodeipam.io", "version": "v1alpha1", "kind": "NodeIPAMConfig"},
            "resource": {"group": "nodeipam.io", "version": "v1alpha1", "resource": "nodeipamconfigs"},
            "name": object.metadata.name,
            "operation": "CREATE",
            "userInfo": {"username": "tester"},
            "object": object,
            "dryRun": false,
        }
    });
    let review: AdmissionReview<NodeIPAMConfig> =
        serde_json::from_value(body).expect("test review parses");
    review.try_into().expect("test review has a request")
}

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

#[test]
fn webhook_and_allocator_agree_on_overlap() {
    for &older in RANGES {
        for &newer in RANGES {
            if older == newer {
                continue;
            }
            let (a, b) = (config("older", 1, older), config("newer", 2, newer));
            let want = range::overlaps(&net(older.0), &net(newer.0));

            let view = ClusterView {
                configs: vec![Arc::new(a.clone())],
                ..ClusterView::default()
            };
            let response = review(&create(&b), &view);
            let denied = !response.allowed && response.result.message.contains("overlaps");

            let mut ipam = Ipam::new();
            ipam.upsert_config(config_input(&a));
            ipam.upsert_config(config_input(&b));
            let marked = ipam
                .config_facts("newer")
                .expect("config known")
                .overlap
                .is_some();

            assert_eq!(
                (denied, marked),
                (want, want),
                "{newer:?} after {older:?}: webhook denied={denied}, allocator marked={marked}, \
                 range::overlaps={want} ({})",
                response.result.message
            );
        }
    }
}

#[test]
fn webhook_and_allocator_agree_on_block_counts() {
    for &(cidr, mask) in RANGES {
        let blocks = FamilyRange::new(net(cidr), mask)
            .expect("test range")
            .block_count();

        let mut ipam = Ipam::new();
        ipam.upsert_config(config_input(&config("c", 1, (cidr, mask))));
        let facts = ipam.config_facts("c").expect("config known");
        let capacity = facts.ipv4.or(facts.ipv6).expect("one family").capacity;
        assert_eq!(capacity, blocks, "{cidr} in /{mask}: allocator capacity");

        // The webhook names the count when it is small enough to warn about.
        let object = config("c", 1, (cidr, mask));
        let response = review(&create(&object), &ClusterView::default());
        let warnings = response.warnings.unwrap_or_default();
        let warned = warnings
            .iter()
            .any(|w| w.contains(&format!("leaves only {blocks} blocks")));
        assert_eq!(
            warned,
            u128::from(blocks) < FEW_BLOCKS,
            "{cidr} in /{mask}: {warnings:?}"
        );
    }
}
