//! The protobuf Node-list reader nodeipam ships (`alloc/src/node/protobuf.rs`: prost with slim
//! message structs, only the fields it keeps) against the hand-written reader it replaced
//! (`nodelist/handwritten.rs`), on the pages a start-up reads: the Node list of a real API server
//! written by `nodeipam-bench capture-node-lists` (65,000 Nodes in pages of 2,000 by default).
//!
//! Both decoders produce the same `NodeListPage` of `IpamNode`s (checked page by page before
//! anything is timed). Two paths:
//! - `decode`: the body to a `NodeListPage`;
//! - `to-kube`: what the controller does with a page (controller/src/node_lists.rs): decode,
//!   write it as the JSON kube's list reader expects, and kube parse it to `ObjectList<IpamNode>`.
//!
//! Reported per decoder, rounds interleaved with the order swapped each round: the thread's CPU
//! time for the whole list (median of rounds, min..max; each ratio to the hand-written reader's
//! taken within a round),
//! and the bytes and allocations per list (exact, from a counting allocator).
//!
//! Read the CPU ratio with care: the hand-written reader is built here in the bench crate, not
//! in `alloc` where it lived, and that alone made it about 10% slower than it was (77 ms per
//! list there against 84-89 ms here, on the same pages); built in `alloc` it cost the same as
//! prost (prost 0.97-1.04x). The bytes and allocation counts do not depend on where.
//!
//! `NODELIST_PAGES=DIR cargo bench -p nodeipam-bench --bench nodelist [-- ROUNDS]`, or
//! `hack/bench/nodelist.sh`.

use std::alloc::System;
use std::path::PathBuf;

#[path = "nodelist/handwritten.rs"]
mod handwritten;

use bytes::Bytes;
use kube::api::ObjectList;
use nodeipam_alloc::node::IpamNode;
use nodeipam_alloc::node::protobuf::{self, NodeListPage};
use stats_alloc::{Region, StatsAlloc};

/// Counts every allocation and its bytes (the workspace forbids our own unsafe allocator).
#[global_allocator]
static GLOBAL: StatsAlloc<System> = StatsAlloc::system();

#[derive(Clone, Copy, Debug, PartialEq)]
enum Decoder {
    /// The reader nodeipam ships: prost with slim message structs.
    Prost,
    /// The hand-written reader it replaced.
    Handwritten,
}

fn decode(d: Decoder, body: &Bytes) -> NodeListPage {
    #[allow(clippy::expect_used)]
    match d {
        Decoder::Prost => protobuf::node_list(body).expect("prost reads the page"),
        Decoder::Handwritten => {
            handwritten::node_list(body).expect("the old reader reads the page")
        }
    }
}

/// The controller's path for one page: decoded, written as JSON, parsed by kube's reader.
fn to_kube(d: Decoder, body: &Bytes) -> usize {
    let page = decode(d, body);
    #[allow(clippy::expect_used)]
    let json = nodeipam_controller::node_lists::page_json(&page).expect("the page as JSON");
    drop(page);
    #[allow(clippy::expect_used)]
    let list: ObjectList<IpamNode> = serde_json::from_slice(&json).expect("kube reads the JSON");
    list.items.len()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Decode,
    ToKube,
}

#[derive(Default)]
struct Sample {
    cpu_ms: f64,
    mib: f64,
    allocs: f64,
}

fn thread_cpu() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// One whole list through `path` with `d`, each page dropped before the next (as a start-up).
fn sample(d: Decoder, path: Path, pages: &[Bytes]) -> Sample {
    let region = Region::new(&GLOBAL);
    let cpu = thread_cpu();
    let mut nodes = 0;
    for body in pages {
        nodes += match path {
            Path::Decode => std::hint::black_box(decode(d, body)).items.len(),
            Path::ToKube => std::hint::black_box(to_kube(d, body)),
        };
    }
    let cpu_ms = (thread_cpu() - cpu) * 1000.0;
    std::hint::black_box(nodes);
    let change = region.change();
    Sample {
        cpu_ms,
        mib: (change.bytes_allocated + change.bytes_reallocated.max(0) as usize) as f64
            / (1 << 20) as f64,
        allocs: (change.allocations + change.reallocations) as f64,
    }
}

fn read_pages() -> Vec<Bytes> {
    #[allow(clippy::expect_used)]
    let dir = PathBuf::from(std::env::var("NODELIST_PAGES").expect(
        "NODELIST_PAGES names a folder written by `nodeipam-bench capture-node-lists` \
         (hack/bench/nodelist.sh makes one)",
    ));
    #[allow(clippy::expect_used)]
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("reading NODELIST_PAGES")
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "pb"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no page-*.pb in {}", dir.display());
    #[allow(clippy::expect_used)]
    files
        .iter()
        .map(|f| Bytes::from(std::fs::read(f).expect("reading a page")))
        .collect()
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[(((sorted.len() - 1) as f64) * q).round() as usize]
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (quantile(&v, 0.5), v[0], v[v.len() - 1])
}

fn main() {
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let pages = read_pages();
    let mut nodes = 0;
    for (i, body) in pages.iter().enumerate() {
        let (old, new) = (
            decode(Decoder::Handwritten, body),
            decode(Decoder::Prost, body),
        );
        assert_eq!(old, new, "page {i}: the decoders disagree");
        assert!(
            old.items
                .iter()
                .all(|n| n.metadata.labels.as_ref().is_some_and(|l| !l.is_empty()))
        );
        nodes += old.items.len();
    }
    let bytes: usize = pages.iter().map(Bytes::len).sum();
    println!(
        "{nodes} nodes in {} pages ({:.1} MiB of protobuf); both decoders give the same pages; {rounds} rounds, order swapped each round; median of rounds (min..max)",
        pages.len(),
        bytes as f64 / (1 << 20) as f64
    );
    println!(
        "{:<8} {:<7} {:>26} {:>10} {:>12} {:>26}",
        "path",
        "decoder",
        "CPU ms per list",
        "MiB alloc",
        "allocations",
        "× hand-written (per round)"
    );
    for path in [Path::Decode, Path::ToKube] {
        let mut samples: [Vec<Sample>; 2] = Default::default();
        // A warm-up pass each, not counted: page faults of the first touch go to neither.
        sample(Decoder::Handwritten, path, &pages);
        sample(Decoder::Prost, path, &pages);
        for r in 0..rounds {
            let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let d = [Decoder::Handwritten, Decoder::Prost][i];
                samples[i].push(sample(d, path, &pages));
            }
        }
        for (i, d) in [Decoder::Handwritten, Decoder::Prost].iter().enumerate() {
            let (cpu, lo, hi) = median(samples[i].iter().map(|s| s.cpu_ms).collect());
            let ratios = samples[i]
                .iter()
                .zip(&samples[0])
                .map(|(s, o)| s.cpu_ms / o.cpu_ms)
                .collect();
            let (ratio, rlo, rhi) = median(ratios);
            let last = &samples[i][rounds - 1];
            println!(
                "{:<8} {:<7} {:>26} {:>10.1} {:>12.0} {:>26}",
                format!("{path:?}").to_lowercase(),
                format!("{d:?}").to_lowercase(),
                format!("{cpu:.1} ({lo:.1}..{hi:.1})"),
                last.mib,
                last.allocs,
                format!("{ratio:.2} ({rlo:.2}..{rhi:.2})"),
            );
        }
    }
}
