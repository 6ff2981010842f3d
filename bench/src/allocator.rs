//! The allocator table: our criterion `allocate_all/*` estimates next to kcm's cidrset
//! `BenchmarkAllocateAll_*` results (`go test -bench` output). Both time one iteration as
//! "allocate every block of the range plus one that fails, then release the whole range", so
//! ns per allocation is ns per iteration divided by the number of blocks, on both sides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::common::dec;
use crate::stats::{self, Machine};

#[derive(Debug, Clone, clap::Args)]
pub struct AllocatorArgs {
    /// Criterion's folder (`$CARGO_TARGET_DIR/criterion`).
    #[arg(long)]
    pub criterion: PathBuf,
    /// The output of `go test -bench 'BenchmarkAllocateAll' ...`.
    #[arg(long)]
    pub go: PathBuf,
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AllocatorReport {
    pub benchmark: String,
    pub date: String,
    pub machine: Machine,
    pub rows: Vec<Row>,
    pub go_output: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// `<range prefix>_<block prefix>`, e.g. `48_64`: a /48 in /64s.
    pub case: String,
    pub blocks: u64,
    pub ours_ns_per_iter: Option<f64>,
    pub ours_ns_per_alloc: Option<f64>,
    pub kcm_ns_per_iter: Option<f64>,
    pub kcm_ns_per_alloc: Option<f64>,
    /// kcm / ours, per allocation.
    pub ratio: Option<f64>,
}

pub fn run(args: &AllocatorArgs) -> anyhow::Result<AllocatorReport> {
    let ours = criterion_means(&args.criterion.join("allocate_all"))?;
    let go_output = std::fs::read_to_string(&args.go)
        .with_context(|| format!("reading {}", args.go.display()))?;
    let kcm = go_means(&go_output);
    if ours.is_empty() || kcm.is_empty() {
        bail!(
            "no results: {} criterion cases, {} go cases",
            ours.len(),
            kcm.len()
        );
    }
    let mut cases: Vec<&String> = ours.keys().chain(kcm.keys()).collect();
    cases.sort_by_key(|c| (blocks(c).unwrap_or(0), c.to_string()));
    cases.dedup();
    let mut rows = Vec::new();
    for case in cases {
        let blocks = blocks(case).with_context(|| format!("case name {case}"))?;
        let per = |ns: Option<f64>| ns.map(|ns| dec(ns / blocks as f64, 2));
        let (o, k) = (ours.get(case).copied(), kcm.get(case).copied());
        rows.push(Row {
            case: case.clone(),
            blocks,
            ours_ns_per_iter: o.map(|v| dec(v, 0)),
            ours_ns_per_alloc: per(o),
            kcm_ns_per_iter: k.map(|v| dec(v, 0)),
            kcm_ns_per_alloc: per(k),
            ratio: o.zip(k).map(|(o, k)| dec(k / o, 1)),
        });
    }
    let report = AllocatorReport {
        benchmark: "allocator".into(),
        date: k8s_openapi::jiff::Timestamp::now().to_string(),
        machine: stats::machine(),
        rows,
        go_output,
    };
    std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
    Ok(report)
}

/// `48_64` → 2^(64-48).
fn blocks(case: &str) -> Option<u64> {
    let (range, block) = case.split_once('_')?;
    let bits = block
        .parse::<u32>()
        .ok()?
        .checked_sub(range.parse().ok()?)?;
    1u64.checked_shl(bits)
}

/// Mean ns per iteration of each `<dir>/<case>/new/estimates.json`.
fn criterion_means(dir: &Path) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let file = entry.path().join("new/estimates.json");
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let mean = v["mean"]["point_estimate"]
            .as_f64()
            .with_context(|| format!("no mean in {}", file.display()))?;
        out.insert(entry.file_name().to_string_lossy().into_owned(), mean);
    }
    Ok(out)
}

/// `BenchmarkAllocateAll_48_52-2   1000   12345 ns/op ...` → ("48_52", 12345.0).
fn go_means(output: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in output.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some(name) = fields
            .first()
            .and_then(|f| f.strip_prefix("BenchmarkAllocateAll_"))
        else {
            continue;
        };
        let name = name.rsplit_once('-').map_or(name, |(n, _)| n);
        if let Some(i) = fields.iter().position(|f| *f == "ns/op")
            && let Some(ns) = i.checked_sub(1).and_then(|j| fields[j].parse::<f64>().ok())
        {
            out.insert(name.to_string(), ns);
        }
    }
    out
}

pub fn table(report: &AllocatorReport) -> String {
    let mut out = String::from(
        "\n| case | blocks | ours ns/iter | kcm ns/iter | ours ns/alloc | kcm ns/alloc | kcm/ours |\n|---|---|---|---|---|---|---|\n",
    );
    let f = |v: Option<f64>, d: usize| v.map_or("–".to_string(), |v| format!("{v:.d$}"));
    for r in &report.rows {
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.case,
            r.blocks,
            f(r.ours_ns_per_iter, 0),
            f(r.kcm_ns_per_iter, 0),
            f(r.ours_ns_per_alloc, 2),
            f(r.kcm_ns_per_alloc, 2),
            r.ratio.map_or("–".into(), |x| format!("{x:.1}×")),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_output() {
        let text = "goos: linux\nBenchmarkAllocateAll_48_52-2   \t  3130\t    349636 ns/op\t 120 B/op\nBenchmarkAllocateAll_8_24    1 97803185 ns/op\nok  x 0.3s\n";
        let m = go_means(text);
        assert_eq!(m.get("48_52"), Some(&349636.0));
        assert_eq!(m.get("8_24"), Some(&97803185.0));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn block_counts() {
        assert_eq!(blocks("48_64"), Some(65536));
        assert_eq!(blocks("16_24"), Some(256));
        assert_eq!(blocks("24_16"), None);
    }
}
