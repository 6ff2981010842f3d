use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::*;
use crate::range::Family;
use crate::types::{FamilySpec, NodeIPAMConfigSpec};
use crate::{Allocation, validation::label_key_errors};

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            let end = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
            matches!((b.first(), b.last()), (Some(f), Some(l)) if end(f) && end(l))
                && b.iter().all(|c| end(c) || *c == b'-')
        })
}

#[test]
fn child_name_of_ipv4_and_ipv6() {
    assert_eq!(
        child_name("gpu", &net("10.64.16.0/20")),
        "gpu-10-64-16-0-20"
    );
    assert_eq!(
        child_name("gpu", &net("fd00:10:64:100::/56")),
        "gpu-fd00-10-64-100---56"
    );
    assert_eq!(child_name("p", &net("::/0")), "p----0");
    for name in [
        child_name("gpu", &net("10.64.16.0/20")),
        child_name("gpu.example.com", &net("fd00:10:64:100::/56")),
        child_name("p", &net("::/0")),
        child_name("a", &net("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120")),
    ] {
        assert!(is_dns_subdomain(&name), "{name}");
    }
}

#[test]
fn child_name_of_a_long_pool_keeps_the_cidr_and_stays_a_dns_subdomain() {
    let v6 = net("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120");
    // 253 characters, with dots at every cut point the suffix could force.
    for long in [
        "a".repeat(253),
        format!("{}.{}", "a".repeat(63), "b".repeat(189)),
        [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61),
        ]
        .join("."),
        format!("{}-{}", "a".repeat(208), "b".repeat(44)),
    ] {
        for cidr in [v6, net("255.255.255.0/24")] {
            let name = child_name(&long, &cidr);
            assert!(is_dns_subdomain(&name), "{name}");
            assert!(name.ends_with(&child_name("x", &cidr)[1..]), "{name}");
        }
    }
    // Distinct children of one long pool get distinct names.
    let long = "a".repeat(253);
    assert_ne!(
        child_name(&long, &net("10.0.0.0/24")),
        child_name(&long, &net("10.0.1.0/24"))
    );
}

fn pool(name: &str, uid: Option<&str>) -> NodeIPAMPool {
    let mut pool = NodeIPAMPool::new(
        name,
        NodeIPAMPoolSpec {
            ipv4: Some(PoolFamilySpec {
                cidrs: vec!["10.64.0.0/14".into()],
                range_mask_size: 20,
                per_node_mask_size: 24,
            }),
            ipv6: None,
            node_selector: None,
            ranges: PoolRanges::default(),
            headroom: PoolHeadroom::default(),
            scale_down: PoolScaleDown::default(),
        },
    );
    pool.metadata.uid = uid.map(str::to_owned);
    pool
}

fn config(labels: &[(&str, &str)], owner: Option<OwnerReference>) -> NodeIPAMConfig {
    let mut config = NodeIPAMConfig::new(
        "gpu-10-64-0-0-20",
        NodeIPAMConfigSpec {
            ipv4: Some(FamilySpec {
                cidr: "10.64.0.0/20".into(),
                per_node_mask_size: 24,
            }),
            ipv6: None,
            node_selector: None,
            allocation: Allocation::Enabled,
        },
    );
    config.metadata = ObjectMeta {
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        ),
        owner_references: owner.map(|o| vec![o]),
        ..config.metadata
    };
    config
}

fn owner(uid: &str, controller: bool) -> OwnerReference {
    OwnerReference {
        api_version: "nodeipam.io/v1alpha1".into(),
        kind: "NodeIPAMPool".into(),
        name: "gpu".into(),
        uid: uid.into(),
        controller: Some(controller),
        block_owner_deletion: Some(true),
    }
}

#[test]
fn a_child_needs_the_controller_owner_reference_and_the_label() {
    let gpu = pool("gpu", Some("u-1"));
    assert!(is_child_of(
        &config(&[(POOL_LABEL, "gpu")], Some(owner("u-1", true))),
        &gpu
    ));
    // Label alone, owner alone, wrong uid, not the controller, label of another pool.
    for c in [
        config(&[(POOL_LABEL, "gpu")], None),
        config(&[], Some(owner("u-1", true))),
        config(&[(POOL_LABEL, "gpu")], Some(owner("u-2", true))),
        config(&[(POOL_LABEL, "gpu")], Some(owner("u-1", false))),
        config(&[(POOL_LABEL, "cpu")], Some(owner("u-1", true))),
    ] {
        assert!(!is_child_of(&c, &gpu), "{:?}", c.metadata);
    }
    // A pool not yet stored has no uid and no children.
    assert!(!is_child_of(
        &config(&[(POOL_LABEL, "gpu")], Some(owner("", true))),
        &pool("gpu", None)
    ));
    let mut wrong_kind = owner("u-1", true);
    wrong_kind.kind = "NodeIPAMConfig".into();
    assert!(!is_child_of(
        &config(&[(POOL_LABEL, "gpu")], Some(wrong_kind)),
        &gpu
    ));
}

#[test]
fn the_pool_label_is_a_label_key() {
    assert!(label_key_errors(POOL_LABEL).is_empty());
}

mod properties {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use ipnet::{Ipv4Net, Ipv6Net};
    use proptest::prelude::*;

    use super::*;

    /// A valid DNS subdomain of 1 to 253 characters, labels of 1 to 63.
    fn pool_name() -> impl Strategy<Value = String> {
        prop::collection::vec("[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", 1..6)
            .prop_map(|labels| labels.join("."))
            .prop_filter("at most 253 characters", |n| n.len() <= 253)
    }

    fn cidr() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<u32>(), 0u8..=32).prop_map(|(a, p)| IpNet::V4(
                Ipv4Net::new(Ipv4Addr::from(a), p)
                    .expect("prefix in range")
                    .trunc()
            )),
            (any::<u128>(), 0u8..=128).prop_map(|(a, p)| IpNet::V6(
                Ipv6Net::new(Ipv6Addr::from(a), p)
                    .expect("prefix in range")
                    .trunc()
            )),
        ]
    }

    proptest! {
        #[test]
        fn child_names_are_dns_subdomains_that_keep_the_cidr(pool in pool_name(), first in cidr()) {
            let name = child_name(&pool, &first);
            prop_assert!(is_dns_subdomain(&name), "{}", name);
            let suffix: String = first
                .to_string()
                .chars()
                .map(|c| if matches!(c, '.' | ':' | '/') { '-' } else { c })
                .collect();
            let tail = format!("-{suffix}");
            prop_assert!(name.ends_with(&tail), "{}", name);
            let head = &name[..name.len() - tail.len()];
            prop_assert!(pool.starts_with(head), "{} is no prefix of {}", head, pool);
        }

        #[test]
        fn one_pool_names_distinct_cidrs_distinctly(pool in pool_name(), a in cidr(), b in cidr()) {
            prop_assume!(a != b && Family::of_net(&a) == Family::of_net(&b));
            prop_assert_ne!(child_name(&pool, &a), child_name(&pool, &b));
        }
    }
}
