//! Criterion benchmarks for `CidrSet`: whole-range allocation (mirroring kcm's
//! `BenchmarkAllocateAll_*` so ns/alloc compare side by side), wide IPv6 sets, and bulk occupy.
//!
//! Each benchmark's throughput is its number of blocks, so criterion's elements/s gives
//! ns per block directly; each prints the set's `memory_bytes()` when full once.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ipnet::IpNet;
use nodeipam_controller::alloc::cidrset::CidrSet;

fn new_set(range: &str, mask: u8) -> CidrSet {
    let range: IpNet = range.parse().expect("benchmark range literal");
    CidrSet::new(range, mask).expect("benchmark mask literal")
}

/// Like kcm's benchmark: allocate every block plus one (which fails), then release the range.
fn allocate_all(c: &mut Criterion) {
    let cases = [
        ("16_24", "10.0.0.0/16", 24),
        ("48_52", "2001:db8::/48", 52),
        ("48_56", "2001:db8::/48", 56),
        ("48_60", "2001:db8::/48", 60),
        ("48_64", "2001:db8::/48", 64),
        ("64_68", "2001:db8::/64", 68),
        ("64_72", "2001:db8::/64", 72),
        ("64_76", "2001:db8::/64", 76),
        ("64_80", "2001:db8::/64", 80),
    ];
    let mut group = c.benchmark_group("allocate_all");
    for (name, range, mask) in cases {
        let mut set = new_set(range, mask);
        let capacity = set.capacity();
        report_memory(&format!("allocate_all/{name}"), &mut set, capacity);
        group.throughput(Throughput::Elements(capacity));
        group.bench_function(name, |b| {
            b.iter(|| {
                for _ in 0..=capacity {
                    let _ = black_box(set.allocate());
                }
                black_box(set.release(set.range()))
            })
        });
    }
    group.finish();
}

/// 100,000 blocks of a /32 carved into /64s (2^32 blocks), then release the range.
fn allocate_wide(c: &mut Criterion) {
    const BLOCKS: u64 = 100_000;
    let mut set = new_set("2001:db8::/32", 64);
    report_memory("allocate_wide/32_64_100k", &mut set, BLOCKS);
    let mut group = c.benchmark_group("allocate_wide");
    group.throughput(Throughput::Elements(BLOCKS));
    group.bench_function("32_64_100k", |b| {
        b.iter(|| {
            for _ in 0..BLOCKS {
                let _ = black_box(set.allocate());
            }
            black_box(set.release(set.range()))
        })
    });
    group.finish();
}

/// Occupy 50,000 pre-existing /64 blocks of a /32, given in a scrambled order as a restart
/// would find them on Nodes, then release the range.
fn occupy_existing(c: &mut Criterion) {
    const BLOCKS: u64 = 50_000;
    let mut set = new_set("2001:db8::/32", 64);
    // A fixed multiplicative permutation of 0..BLOCKS: 7919 is prime, so coprime with BLOCKS.
    let existing: Vec<IpNet> = (0..BLOCKS)
        .filter_map(|i| set.block(i * 7919 % BLOCKS))
        .collect();
    for cidr in &existing {
        let _ = set.occupy(*cidr);
    }
    println!(
        "memory_bytes occupy/50k_of_32_64: {} bytes with {} blocks taken",
        set.memory_bytes(),
        set.allocated()
    );
    let _ = set.release(set.range());

    let mut group = c.benchmark_group("occupy");
    group.throughput(Throughput::Elements(BLOCKS));
    group.bench_function("50k_of_32_64", |b| {
        b.iter(|| {
            for cidr in &existing {
                let _ = black_box(set.occupy(*cidr));
            }
            black_box(set.release(set.range()))
        })
    });
    group.finish();
}

/// Prints the memory of `set` after taking `blocks` blocks, then empties it again. A full leaf
/// keeps no bitmap, so a completely full set also reports its size one block short of full.
fn report_memory(name: &str, set: &mut CidrSet, blocks: u64) {
    let empty = set.memory_bytes();
    for _ in 0..blocks {
        let _ = set.allocate();
    }
    let taken = set.memory_bytes();
    let mut line = format!(
        "memory_bytes {name}: {empty} empty, {taken} with {} of {} blocks taken",
        set.allocated(),
        set.capacity()
    );
    if set.free() == 0
        && let Some(first) = set.block(0)
    {
        let _ = set.release(first);
        line += &format!(", {} one short of full", set.memory_bytes());
    }
    println!("{line}");
    let _ = set.release(set.range());
}

criterion_group!(benches, allocate_all, allocate_wide, occupy_existing);
criterion_main!(benches);
