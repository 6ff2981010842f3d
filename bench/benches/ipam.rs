//! What nodeipam's allocation loop recomputes on every status tick (200 ms) while any config
//! is dirty, e.g. during a burst: `Ipam::config_facts` and `Ipam::unmanaged`, for a cluster of
//! 5,000 and 50,000 nodes in one NodeIPAMConfig (10.0.0.0/8, a /24 each). Evidence for
//! docs/benchmarks-history.md ("Profiled and improved"); one call each per iteration.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ipnet::IpNet;
use nodeipam_controller::alloc::cidrset::CidrSet;
use nodeipam_controller::alloc::ipam::{ConfigInput, Ipam};

fn cluster(nodes: u64) -> Ipam {
    let range: IpNet = "10.0.0.0/8".parse().expect("range literal");
    let mut ipam = Ipam::new();
    ipam.upsert_config(ConfigInput {
        name: "bench".into(),
        created: 0,
        ipv4: Some((range, 24)),
        enabled: true,
        ..ConfigInput::default()
    });
    let blocks = CidrSet::new(range, 24).expect("mask literal");
    for i in 0..nodes {
        let block = blocks.block(i).expect("within the range");
        let name = format!("node-{i:06}");
        let uid = format!("uid-{i}");
        let _ = ipam.observe_node(&name, Some(&uid), &[block]);
    }
    ipam
}

fn recount(c: &mut Criterion) {
    let mut group = c.benchmark_group("status_tick");
    group.sample_size(20);
    for nodes in [5_000u64, 50_000] {
        let ipam = cluster(nodes);
        assert_eq!(ipam.node_count() as u64, nodes);
        group.bench_function(format!("config_facts/{nodes}"), |b| {
            b.iter(|| black_box(ipam.config_facts("bench")))
        });
        group.bench_function(format!("unmanaged/{nodes}"), |b| {
            b.iter(|| black_box(ipam.unmanaged()))
        });
    }
    group.finish();
}

criterion_group!(benches, recount);
criterion_main!(benches);
