//! What one "retry every pending node" costs the allocation loop: at 5,000 pending nodes and
//! 200 configs that select other pools, every node is ranked against every config and none
//! gets a block. The loop pays this on each event that may free capacity (a config change, a
//! release, a publication), so it bounds how often those may come.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use nodeipam_controller::alloc::ipam::{ConfigInput, Ipam};

fn selecting(pool: &str) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "pool".into(),
                operator: "In".into(),
                values: Some(vec![pool.into()]),
            }]),
            match_fields: None,
        }],
    }
}

fn retry_all_pending(c: &mut Criterion) {
    const CONFIGS: u32 = 200;
    const PENDING: u32 = 5_000;
    let mut ipam = Ipam::new();
    for i in 0..CONFIGS {
        let range: IpNet = format!("10.{}.{}.0/24", i / 256, i % 256)
            .parse()
            .expect("range literal");
        ipam.upsert_config(ConfigInput {
            name: format!("pool-{i}"),
            created: i64::from(i),
            ipv4: Some((range, 26)),
            selector: Some(selecting(&format!("p{i}"))),
            enabled: true,
            ..ConfigInput::default()
        });
    }
    let labels: Vec<(String, BTreeMap<String, String>)> = (0..PENDING)
        .map(|n| {
            let labels = BTreeMap::from([("pool".to_string(), "elsewhere".to_string())]);
            (format!("node-{n}"), labels)
        })
        .collect();
    let mut group = c.benchmark_group("retry_pending");
    group.sample_size(10);
    group.bench_function("5000_nodes_200_configs", |b| {
        b.iter(|| {
            for (name, labels) in &labels {
                let _ = black_box(ipam.allocate(name, None, labels));
            }
        });
    });
    group.finish();
}

criterion_group!(benches, retry_all_pending);
criterion_main!(benches);
