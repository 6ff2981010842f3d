//! The `process_*` metrics as the Prometheus client libraries define them on Linux (CPU
//! seconds, resident and virtual memory, open and maximum file descriptors, start time), read
//! from `/proc/self` at each scrape. Parsing is pure; [`ProcessCollector`] does the reading.
//!
//! Written here because no maintained crate fits (checked for 0.1.0): `kubert-prometheus-process`
//! is a prometheus-client collector, but for prometheus-client 0.23, whose `Collector` trait is
//! not 0.24's; the `prometheus` crate's `process` feature and `metrics-process` feed other
//! metrics libraries (their own registry, the `metrics` facade), not a prometheus-client
//! registry. The parsing alone could come from `procfs-core`, but a file it cannot parse comes
//! back as "Internal error: bug at <its source path> (please report this procfs bug)", over
//! several lines and naming no field, and its `/proc/stat` parser wants every CPU line for
//! the one `btime` used here: the three short parsers below say which field is wrong.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The families the collector writes: base name (a counter without `_total`), help, type.
pub const FAMILIES: [(&str, &str, MetricType); 6] = [
    (
        "process_cpu_seconds",
        "Total user and system CPU time spent in seconds",
        MetricType::Counter,
    ),
    (
        "process_resident_memory_bytes",
        "Resident memory size in bytes",
        MetricType::Gauge,
    ),
    (
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes",
        MetricType::Gauge,
    ),
    (
        "process_open_fds",
        "Number of open file descriptors",
        MetricType::Gauge,
    ),
    (
        "process_max_fds",
        "Maximum number of open file descriptors (the soft limit)",
        MetricType::Gauge,
    ),
    (
        "process_start_time_seconds",
        "Start time of the process since the Unix epoch in seconds",
        MetricType::Gauge,
    ),
];

/// The fields of `/proc/<pid>/stat` the metrics need, in the kernel's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// User and system CPU time, in clock ticks.
    pub utime: u64,
    pub stime: u64,
    /// When the process started, in clock ticks after boot.
    pub starttime: u64,
    /// Virtual memory size, in bytes.
    pub vsize: u64,
    /// Resident set size, in pages.
    pub rss: u64,
}

impl Stat {
    /// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and parentheses,
    /// so fields are counted after its last `)`.
    pub fn parse(text: &str) -> Result<Stat, String> {
        let (_, rest) = text
            .rsplit_once(')')
            .ok_or("no ')' after the command name")?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Field 3 (the state) is index 0 after the name, so field n is index n - 3.
        let field = |n: usize| -> Result<u64, String> {
            let raw = fields
                .get(n - 3)
                .ok_or_else(|| format!("field {n} missing (only {} fields)", fields.len() + 2))?;
            raw.parse()
                .map_err(|e| format!("field {n} is {raw:?}, not a count: {e}"))
        };
        Ok(Stat {
            utime: field(14)?,
            stime: field(15)?,
            starttime: field(22)?,
            vsize: field(23)?,
            rss: field(24)?,
        })
    }

    /// User plus system CPU seconds, with `hz` clock ticks a second.
    pub fn cpu_seconds(&self, hz: u64) -> f64 {
        (self.utime + self.stime) as f64 / hz.max(1) as f64
    }

    /// Seconds since the epoch at which the process started, the system having booted at
    /// `boot_time` (seconds since the epoch).
    pub fn start_time(&self, boot_time: u64, hz: u64) -> f64 {
        boot_time as f64 + self.starttime as f64 / hz.max(1) as f64
    }
}

/// The boot time (`btime`, seconds since the epoch) of `/proc/stat`.
pub fn boot_time(proc_stat: &str) -> Result<u64, String> {
    let line = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .ok_or("no btime line")?;
    line.trim()
        .parse()
        .map_err(|e| format!("btime {line:?}: {e}"))
}

/// The soft limit on open files of `/proc/<pid>/limits`; `None` when unlimited.
pub fn max_open_files(limits: &str) -> Result<Option<u64>, String> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .ok_or("no 'Max open files' line")?;
    let soft = line.split_whitespace().next().ok_or("no soft limit")?;
    if soft == "unlimited" {
        return Ok(None);
    }
    soft.parse()
        .map(Some)
        .map_err(|e| format!("soft limit {soft:?}: {e}"))
}

/// One scrape's values, each absent when its file could not be read or parsed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time: Option<f64>,
}

impl Sample {
    /// This process's values, from `/proc/self`.
    pub fn read() -> Sample {
        let hz = rustix::param::clock_ticks_per_second();
        let page = rustix::param::page_size() as u64;
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let stat = read("/proc/self/stat").and_then(|t| Stat::parse(&t).ok());
        let boot = read("/proc/stat").and_then(|t| boot_time(&t).ok());
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64);
        Sample {
            cpu_seconds: stat.map(|s| s.cpu_seconds(hz)),
            resident_bytes: stat.map(|s| s.rss.saturating_mul(page)),
            virtual_bytes: stat.map(|s| s.vsize),
            open_fds,
            // Unlimited is reported as the largest count, as the Go client does.
            max_fds: read("/proc/self/limits")
                .and_then(|t| max_open_files(&t).ok())
                .map(|m| m.unwrap_or(u64::MAX)),
            start_time: stat.zip(boot).map(|(s, b)| s.start_time(b, hz)),
        }
    }

    /// The value of the family `name` of [`FAMILIES`], if known.
    fn value(&self, name: &str) -> Option<f64> {
        let count = |v: Option<u64>| v.map(|v| v as f64);
        match name {
            "process_cpu_seconds" => self.cpu_seconds,
            "process_resident_memory_bytes" => count(self.resident_bytes),
            "process_virtual_memory_bytes" => count(self.virtual_bytes),
            "process_open_fds" => count(self.open_fds),
            "process_max_fds" => count(self.max_fds),
            "process_start_time_seconds" => self.start_time,
            _ => None,
        }
    }
}

/// Writes [`FAMILIES`] from a fresh [`Sample`] at each scrape; a value it cannot read is left
/// out rather than reported as zero.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let sample = Sample::read();
        for (name, help, kind) in FAMILIES {
            let Some(value) = sample.value(name) else {
                continue;
            };
            let family = encoder.encode_descriptor(name, help, None, kind)?;
            if matches!(kind, MetricType::Counter) {
                ConstCounter::new(value).encode(family)?;
            } else {
                ConstGauge::new(value).encode(family)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real line of a process whose name holds a space and a parenthesis.
    const STAT: &str = "4242 (node ipam) x) S 1 4242 4242 0 -1 4194560 2410 0 0 0 250 150 0 0 \
                        20 0 9 0 123456 987654321 4096 18446744073709551615 1 1 0 0 0 0 0 0 0 \
                        0 0 0 17 1 0 0 0 0 0";

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let s = Stat::parse(STAT).expect("parses");
        assert_eq!(
            s,
            Stat {
                utime: 250,
                stime: 150,
                starttime: 123_456,
                vsize: 987_654_321,
                rss: 4096,
            }
        );
        assert_eq!(s.cpu_seconds(100), 4.0);
        let started = s.start_time(1_700_000_000, 100);
        assert!((started - 1_700_001_234.56).abs() < 1e-3, "{started}");
    }

    #[test]
    fn a_short_or_garbled_stat_is_an_error_naming_the_field() {
        let e = Stat::parse("1 (x) S 1 2 3").expect_err("short");
        assert!(e.contains("field 14"), "{e}");
        let e = Stat::parse(&STAT.replace(" 250 ", " lots ")).expect_err("garbled");
        assert!(e.contains("field 14") && e.contains("lots"), "{e}");
        assert!(Stat::parse("no name here").is_err());
    }

    #[test]
    fn boot_time_and_the_open_files_limit() {
        let stat = "cpu  1 2 3\nintr 5\nctxt 9\nbtime 1733212800\nprocesses 77\n";
        assert_eq!(boot_time(stat), Ok(1_733_212_800));
        assert!(boot_time("cpu 1\n").is_err());
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(max_open_files(limits), Ok(Some(1024)));
        let unlimited = limits.replace("1024 ", "unlimited ");
        assert_eq!(max_open_files(&unlimited), Ok(None));
        assert!(max_open_files("Max cpu time 1 1 seconds\n").is_err());
    }

    #[test]
    fn this_process_reads_sanely() {
        let s = Sample::read();
        let rss = s.resident_bytes.expect("rss");
        assert!(rss > 0 && s.virtual_bytes.expect("vsize") >= rss, "{s:?}");
        let open = s.open_fds.expect("fds");
        assert!(open > 0 && s.max_fds.expect("limit") >= open, "{s:?}");
        let now = k8s_openapi::jiff::Timestamp::now().as_second() as f64;
        let started = s.start_time.expect("start");
        assert!(started <= now + 1.0 && started > now - 86_400.0, "{s:?}");
    }
}
