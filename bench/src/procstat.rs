//! CPU time and memory of a process from `/proc`: utime+stime of `/proc/PID/stat`, VmRSS and
//! VmHWM (peak RSS) of `/proc/PID/status`; and the system's load average.

use std::path::Path;

use anyhow::{Context, bail};
use nodeipam_controller::process_metrics::Stat;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// User plus system CPU seconds since the process started.
    pub cpu_s: f64,
    pub rss_mib: f64,
    /// Peak resident set size so far.
    pub hwm_mib: f64,
}

pub fn sample(pid: u32) -> anyhow::Result<Sample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    Ok(Sample {
        cpu_s: cpu_seconds(&stat)?,
        rss_mib: status_kib(&status, "VmRSS:")? / 1024.0,
        hwm_mib: status_kib(&status, "VmHWM:")? / 1024.0,
    })
}

/// utime + stime in seconds, parsed as the controller's `process_cpu_seconds_total` is.
fn cpu_seconds(stat: &str) -> anyhow::Result<f64> {
    let stat = Stat::parse(stat).map_err(|e| anyhow::anyhow!("/proc/PID/stat: {e}"))?;
    Ok(stat.cpu_seconds(rustix::param::clock_ticks_per_second()))
}

fn status_kib(status: &str, key: &str) -> anyhow::Result<f64> {
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .with_context(|| format!("no {key} in /proc/PID/status"))?;
    let kib: f64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("bad {line:?}"))?;
    Ok(kib)
}

/// The pid of this process's child whose command name is `comm` (e.g. the harness's
/// `kube-apiserver`), if there is one.
pub fn child_named(comm: &str) -> Option<u32> {
    let me = std::process::id();
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) =
            std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat"))
        else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if name == comm && ppid == Some(me) {
            return Some(pid);
        }
    }
    None
}

/// The 1-minute load average.
pub fn load1() -> anyhow::Result<f64> {
    let text = std::fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    let Some(first) = text.split_whitespace().next() else {
        bail!("empty /proc/loadavg");
    };
    Ok(first.parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_own_process() {
        let s = sample(std::process::id()).expect("own /proc entry");
        assert!(s.rss_mib > 0.0 && s.hwm_mib >= s.rss_mib, "{s:?}");
        assert!(s.cpu_s >= 0.0);
    }

    #[test]
    fn name_with_parentheses() {
        let stat = "42 (a) b) S 1 1 1 0 -1 0 0 0 0 0 250 150 0 0 20 0 1 0 7 4096 3";
        let hz = rustix::param::clock_ticks_per_second() as f64;
        assert_eq!(cpu_seconds(stat).expect("parses"), 400.0 / hz);
    }
}
