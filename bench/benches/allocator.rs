//! The burst's own range on the allocator alone, measured exactly like
//! `controller/benches/cidrset.rs` measures kcm's `BenchmarkAllocateAll_*` sizes: per iteration,
//! allocate every block of the range plus one (which fails), then release the whole range.
//! `8_24` is 10.0.0.0/8 in /24s (65,536 blocks), the NodeIPAMConfig of hack/bench/burst.sh;
//! hack/bench/kcm/allocate_test.go runs the same case on kcm's cidrset.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use nodeipam_controller::alloc::cidrset::CidrSet;

fn allocate_all(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocate_all");
    let mut set =
        CidrSet::new("10.0.0.0/8".parse().expect("range literal"), 24).expect("mask literal");
    let capacity = set.capacity();
    group.throughput(Throughput::Elements(capacity));
    group.bench_function("8_24", |b| {
        b.iter(|| {
            for _ in 0..=capacity {
                let _ = black_box(set.allocate());
            }
            black_box(set.release(set.range()))
        })
    });
    group.finish();
}

criterion_group!(benches, allocate_all);
criterion_main!(benches);
