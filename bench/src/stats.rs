//! Percentiles of latencies, and a description of the machine the numbers came from.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub mean_ms: f64,
}

/// Nearest-rank percentiles of `ms` (unsorted).
pub fn latency(mut ms: Vec<f64>) -> Latency {
    if ms.is_empty() {
        return Latency::default();
    }
    ms.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let i = ((p / 100.0) * ms.len() as f64).ceil() as usize;
        ms[i.clamp(1, ms.len()) - 1]
    };
    Latency {
        count: ms.len(),
        p50_ms: rank(50.0),
        p90_ms: rank(90.0),
        p99_ms: rank(99.0),
        max_ms: ms[ms.len() - 1],
        mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub load1_at_start: f64,
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or_else(|| "unknown".into(), |(_, v)| v.trim().to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    Machine {
        cpu_model,
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        memory_gib: (memory_gib * 10.0).round() / 10.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        load1_at_start: crate::procstat::load1().unwrap_or(f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let l = latency((1..=100).map(f64::from).collect());
        assert_eq!(
            (l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms),
            (50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(l.mean_ms, 50.5);
        assert_eq!(latency(vec![7.0]).p99_ms, 7.0);
        assert_eq!(latency(vec![]).count, 0);
    }
}
