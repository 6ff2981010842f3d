//! The burst: on a fresh control plane per run, N Nodes created as fast as the API server takes
//! them while one contender allocates; the observer times each node from its creation to its
//! podCIDRs.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::audit::Requests;
use crate::common::{self, CommonArgs, ServerCpu, dec};
use crate::contender::{self, Kind, Settings};
use crate::nodes::{self, BENCH_LABEL, LoadReport};
use crate::observer::Observer;
use crate::procstat::{self, Sample};
use crate::stats::{self, Latency, Machine};
use nodeipam_controller::ratelimit::RateLimiter as Limiter;
use nodeipam_testenv::kubelet::{Kubelets, Timing};

#[derive(Debug, Clone, clap::Args)]
pub struct BurstArgs {
    /// Burst sizes.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    pub nodes: Vec<usize>,
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "nodeipam-default,kcm,floor"
    )]
    pub contenders: Vec<Kind>,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Node creates in flight at once.
    #[arg(long, default_value_t = 32)]
    pub load_concurrency: usize,
    /// The loader's client QPS (0: no limit) and burst.
    #[arg(long, default_value_t = 0.0)]
    pub load_qps: f64,
    #[arg(long, default_value_t = 1)]
    pub load_burst: u32,
    /// `burst`: nodes created while the contender runs; `backlog`: nodes created first, then
    /// the contender started (its pure write throughput, start-up included).
    #[arg(long, value_enum, default_value_t = Mode::Burst)]
    pub mode: Mode,
    /// Nodes that already hold podCIDRs (from the start of the range) before the contender
    /// starts: a burst onto a big cluster.
    #[arg(long, default_value_t = 0)]
    pub existing: usize,
    /// Every node behaves like a kubelet (`nodeipam_testenv::kubelet`): a status update once
    /// registered, another when Ready 0.5-2.5 s later, then a heartbeat every 20-25 s. Each
    /// moves the Node's resourceVersion while its podCIDRs wait in the contender's queue.
    /// Burst mode only.
    #[arg(long)]
    pub kubelets: bool,
    /// Runs of every (size, contender), interleaved.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Where the JSON goes.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    #[default]
    Burst,
    Backlog,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Burst => "burst",
            Mode::Backlog => "backlog",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BurstReport {
    pub benchmark: String,
    pub date: String,
    pub machine: Machine,
    pub settings: Settings,
    pub load_concurrency: usize,
    pub load_qps: f64,
    #[serde(default)]
    pub existing: usize,
    pub runs: Vec<BurstRun>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BurstRun {
    pub contender: Kind,
    #[serde(default)]
    pub mode: Mode,
    pub nodes: usize,
    pub round: usize,
    /// Burst: from the first create sent to the last node seen with podCIDRs. Backlog: from
    /// the contender's start to the last node seen with podCIDRs.
    pub total_s: f64,
    pub assigned_per_s: f64,
    /// Burst: per node, first seen with podCIDRs minus first seen (both by the observer's
    /// watch). Backlog: per node, first seen with podCIDRs minus the contender's start.
    pub latency: Latency,
    pub load: LoadReport,
    /// From the process start to its "synced" log line.
    pub synced_s: f64,
    /// The contender's CPU during the burst (from just before the first create to the end);
    /// in a backlog run, since its start.
    pub cpu_s: f64,
    pub rss_end_mib: f64,
    pub rss_peak_mib: f64,
    pub servers_cpu_s: ServerCpu,
    pub load1_before: f64,
    pub load1_after: f64,
    pub watch_errors: u64,
    /// Every request the contender made in the run (start-up included), from the audit log.
    #[serde(default)]
    pub requests: Requests,
    #[serde(default)]
    pub requests_per_node: f64,
    /// `nodeipam-pool`: for each range carved, seconds from the need (free blocks below the
    /// headroom, or a node waiting) to the range accepting allocations (published, finalized).
    #[serde(default)]
    pub carve_s: Vec<f64>,
    /// With `--kubelets`: the status updates the nodes' kubelets made during the run.
    #[serde(default)]
    pub kubelet_updates: Option<u64>,
}

/// The carve latencies nodeipam logs ("carved range accepts allocations ... seconds=S").
fn carve_seconds(log: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains("carved range accepts allocations"))
        .filter_map(|l| {
            let at = l.find("seconds=")? + "seconds=".len();
            let value: String = l[at..]
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            value.parse().ok()
        })
        .collect()
}

pub async fn run(args: BurstArgs) -> anyhow::Result<BurstReport> {
    if args.kubelets && args.mode == Mode::Backlog {
        bail!(
            "--kubelets goes with --mode burst: in a backlog the nodes exist before anyone serves them"
        );
    }
    let settings = args.common.settings();
    std::fs::create_dir_all(&args.common.work)?;
    let mut report = BurstReport {
        benchmark: "burst".into(),
        date: k8s_openapi::jiff::Timestamp::now().to_string(),
        machine: stats::machine(),
        settings: settings.clone(),
        load_concurrency: args.load_concurrency,
        load_qps: args.load_qps,
        existing: args.existing,
        runs: Vec::new(),
    };
    for round in 1..=args.rounds {
        for &n in &args.nodes {
            for &kind in &args.contenders {
                eprintln!(
                    "burst: {} nodes, {}, round {round} (load {:.2})",
                    n,
                    kind.name(),
                    procstat::load1()?
                );
                let run = one(&args, &settings, kind, n, round)
                    .await
                    .with_context(|| format!("burst of {n} nodes with {}", kind.name()))?;
                eprintln!(
                    "burst:   total {:.2}s, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, cpu {:.2}s, peak rss {:.0} MiB",
                    run.total_s,
                    run.latency.p50_ms,
                    run.latency.p99_ms,
                    run.latency.max_ms,
                    run.cpu_s,
                    run.rss_peak_mib
                );
                report.runs.push(run);
                std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
            }
        }
    }
    Ok(report)
}

async fn one(
    args: &BurstArgs,
    settings: &Settings,
    kind: Kind,
    n: usize,
    round: usize,
) -> anyhow::Result<BurstRun> {
    let (cp, contender, _) = args.common.control_plane().await?;
    let admin = cp.client();
    let backlog = args.mode == Mode::Backlog;
    let mut settings = settings.clone();
    // In a backlog run the tuned nodeipam starts as on a restart: its finalizer is on the
    // config. The default install always starts as a new user's does.
    common::prepare(&admin, kind, &mut settings, backlog).await?;
    let settings = &settings;
    let log_name = format!("{}-{n}-{}-{round}.log", args.mode.name(), kind.name());
    if kind == Kind::NodeipamUpdated {
        common::predecessor(&cp, settings, &args.common.work, &log_name, true).await?;
    }
    if args.existing > 0 {
        let load = nodes::fill(cp.kubeconfig_path(), settings.mask, args.existing, 64).await?;
        eprintln!(
            "burst:   {} existing nodes in {:.1}s",
            args.existing, load.seconds
        );
    }
    // Separate clients (and connection pools) for the observer and the loader.
    let observer_client = crate::client(cp.kubeconfig_path()).await?;
    let loader_client = crate::client(cp.kubeconfig_path()).await?;
    let batch: Vec<_> = (0..n)
        .map(|i| nodes::node(&format!("burst-{i:06}"), "burst", i as u32, None))
        .collect();
    let limiter = Arc::new(Limiter::new(args.load_qps, args.load_burst));
    let concurrency = args.load_concurrency;
    // Generous: a stuck contender fails the run instead of hanging it.
    let timeout = Duration::from_secs(120 + (n as u64) / 10);

    let mut kubelet_updates = None;
    let (mut proc, observer, load, before, servers_before, load1_before) = if backlog {
        let observer = Observer::start(&observer_client, &format!("{BENCH_LABEL}=burst")).await?;
        let load = nodes::create_all(&loader_client, batch, concurrency, limiter).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (load1_before, servers_before) = (procstat::load1()?, common::server_cpu()?);
        let mut proc = contender::spawn(
            kind,
            settings,
            &contender.kubeconfig,
            &args.common.work,
            &log_name,
        )?;
        if matches!(kind, Kind::NodeipamDefault | Kind::NodeipamPool) {
            common::create_allocation_source(&admin, kind, settings.mask).await?;
        }
        observer
            .wait_assigned(n, timeout, || proc.check_alive())
            .await?;
        (
            proc,
            observer,
            load,
            Sample::default(),
            servers_before,
            load1_before,
        )
    } else {
        let mut proc = contender::spawn(
            kind,
            settings,
            &contender.kubeconfig,
            &args.common.work,
            &log_name,
        )?;
        proc.wait_synced(Duration::from_secs(60)).await?;
        if matches!(kind, Kind::NodeipamDefault | Kind::NodeipamPool) {
            common::create_allocation_source(&admin, kind, settings.mask).await?;
        }
        // Warm-up: one node through the whole path, so every gate is open and every
        // connection up.
        let warm = Observer::start(&admin, &format!("{BENCH_LABEL}=warmup")).await?;
        nodes::create_all(
            &admin,
            vec![nodes::node("warmup-0", "warmup", 0, None)],
            1,
            Arc::new(Limiter::new(0.0, 1)),
        )
        .await?;
        warm.wait_assigned(1, Duration::from_secs(60), || proc.check_alive())
            .await
            .context("the warm-up node")?;
        drop(warm);
        let observer = Observer::start(&observer_client, &format!("{BENCH_LABEL}=burst")).await?;
        let load1_before = procstat::load1()?;
        let before: Sample = proc.sample()?;
        let servers_before = common::server_cpu()?;
        // Their own client: a kubelet is not the loader.
        let kubelets = if args.kubelets {
            let names = batch
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            let client = crate::client(cp.kubeconfig_path()).await?;
            Some(Kubelets::start(client, names, Timing::kubelet()))
        } else {
            None
        };
        let loader = tokio::spawn(async move {
            nodes::create_all(&loader_client, batch, concurrency, limiter).await
        });
        observer
            .wait_assigned(n, timeout, || proc.check_alive())
            .await?;
        kubelet_updates = kubelets.map(|k| k.updates());
        let load = loader.await.context("the loader task")??;
        (proc, observer, load, before, servers_before, load1_before)
    };
    proc.check_alive()?;
    let after = proc.sample()?;
    let servers_after = common::server_cpu()?;
    let load1_after = procstat::load1()?;
    let synced = proc.wait_synced(Duration::from_secs(1)).await?;

    // Burst: from the first create sent; backlog: from the contender's start.
    let start = if backlog {
        proc.started
    } else {
        load.first_sent.context("the loader sent nothing")?
    };
    let seen = observer.snapshot();
    let mut last = start;
    let mut latencies = Vec::with_capacity(n);
    let mut blocks = HashSet::with_capacity(n);
    let range: IpNet = common::CLUSTER_CIDR.parse()?;
    for (name, s) in &seen {
        let assigned = s
            .assigned
            .with_context(|| format!("{name} has no podCIDRs"))?;
        last = last.max(assigned);
        let since = if backlog { start } else { s.added };
        latencies.push(assigned.saturating_duration_since(since).as_secs_f64() * 1e3);
        for c in &s.pod_cidrs {
            let block: IpNet = c.parse().with_context(|| format!("{name}: podCIDR {c}"))?;
            if !range.contains(&block) || !blocks.insert(block) {
                bail!("{name}: podCIDR {c} is outside {range} or handed out twice");
            }
        }
    }
    if seen.len() != n {
        bail!("the observer saw {} nodes, {n} created", seen.len());
    }
    let total_s = last.duration_since(start).as_secs_f64();
    let watch_errors = observer.watch_errors();
    drop(observer);
    let proc_log = proc.log.clone();
    proc.stop().await?;
    // Counted after the contender stopped: its watches have ended and been logged.
    let requests = contender.requests()?;
    let carves = carve_seconds(&std::fs::read_to_string(&proc_log).unwrap_or_default());
    cp.stop().await;
    Ok(BurstRun {
        contender: kind,
        mode: args.mode,
        nodes: n,
        round,
        total_s: dec(total_s, 3),
        assigned_per_s: dec(n as f64 / total_s, 1),
        latency: rounded(stats::latency(latencies)),
        load,
        synced_s: dec(synced.as_secs_f64(), 3),
        cpu_s: dec(after.cpu_s - before.cpu_s, 2),
        rss_end_mib: dec(after.rss_mib, 1),
        rss_peak_mib: dec(after.hwm_mib, 1),
        servers_cpu_s: servers_after - servers_before,
        load1_before,
        load1_after,
        watch_errors,
        requests_per_node: dec(requests.total as f64 / n as f64, 3),
        carve_s: carves,
        requests,
        kubelet_updates,
    })
}

fn rounded(l: Latency) -> Latency {
    Latency {
        count: l.count,
        p50_ms: dec(l.p50_ms, 1),
        p90_ms: dec(l.p90_ms, 1),
        p99_ms: dec(l.p99_ms, 1),
        max_ms: dec(l.max_ms, 1),
        mean_ms: dec(l.mean_ms, 1),
    }
}

/// A Markdown table per mode and size, with each contender's total against the floor's, and
/// the ratios of the medians over rounds.
pub fn table(report: &BurstReport) -> String {
    let mut out = String::new();
    let mut groups: Vec<(Mode, usize)> = report.runs.iter().map(|r| (r.mode, r.nodes)).collect();
    groups.sort_by_key(|(m, n)| (m.name(), *n));
    groups.dedup();
    for (mode, n) in groups {
        let runs: Vec<&BurstRun> = report
            .runs
            .iter()
            .filter(|r| r.nodes == n && r.mode == mode)
            .collect();
        let median = |k: Kind| {
            let mut t: Vec<f64> = runs
                .iter()
                .filter(|r| r.contender == k)
                .map(|r| r.total_s)
                .collect();
            t.sort_by(f64::total_cmp);
            (!t.is_empty()).then(|| t[(t.len() - 1) / 2])
        };
        let floor = median(Kind::Floor);
        let what = match mode {
            Mode::Burst if runs.iter().any(|r| r.kubelet_updates.is_some()) => {
                "created while the contender runs, each updating its status as a kubelet does; latency from creation"
            }
            Mode::Burst => "created while the contender runs; latency from creation",
            Mode::Backlog => "created before the contender starts; times from its start",
        };
        out += &format!(
            "\n{n} nodes, {} ({what}; loader {} in flight, {}{})\n\n| contender | round | total s | nodes/s | p50 ms | p99 ms | max ms | synced s | CPU s | peak RSS MiB | apiserver CPU s | etcd CPU s | × floor | load before→after |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            mode.name(),
            report.load_concurrency,
            if report.load_qps > 0.0 {
                format!("{}/s", report.load_qps)
            } else {
                "no rate limit".into()
            },
            if report.existing > 0 {
                format!("; {} nodes with podCIDRs before", report.existing)
            } else {
                String::new()
            }
        );
        for r in &runs {
            let vs_floor = floor.map_or("–".into(), |f| format!("{:.2}", r.total_s / f));
            out += &format!(
                "| {} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.0} | {:.1} | {:.1} | {} | {:.2}→{:.2} |\n",
                r.contender.name(),
                r.round,
                r.total_s,
                r.assigned_per_s,
                r.latency.p50_ms,
                r.latency.p99_ms,
                r.latency.max_ms,
                r.synced_s,
                r.cpu_s,
                r.rss_peak_mib,
                r.servers_cpu_s.apiserver_s,
                r.servers_cpu_s.etcd_s,
                vs_floor,
                r.load1_before,
                r.load1_after,
            );
        }
        out += &summary(&runs, n);
    }
    out
}

fn median_of(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        k if k % 2 == 1 => Some(v[k / 2]),
        k => Some((v[k / 2 - 1] + v[k / 2]) / 2.0),
    }
}

fn spread(v: &[f64]) -> String {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.2}–{hi:.2}")
}

/// Per contender over its rounds: the median total and its spread, the median of the per-round
/// ratios to the floor (rounds are interleaved, so each ratio compares runs made minutes
/// apart), requests per node and the API server's and etcd's CPU per node.
fn summary(runs: &[&BurstRun], n: usize) -> String {
    let mut kinds: Vec<Kind> = runs.iter().map(|r| r.contender).collect();
    kinds.dedup();
    kinds.sort_by_key(|k| k.name());
    kinds.dedup();
    let floor_of = |round: usize| {
        runs.iter()
            .find(|r| r.contender == Kind::Floor && r.round == round)
            .map(|r| r.total_s)
    };
    let mut out = String::from(
        "\n| contender | rounds | median total s | spread s | median × floor | spread × floor | requests/node | apiserver+etcd CPU ms/node |\n|---|---|---|---|---|---|---|---|\n",
    );
    for kind in kinds {
        let mine: Vec<&&BurstRun> = runs.iter().filter(|r| r.contender == kind).collect();
        let totals: Vec<f64> = mine.iter().map(|r| r.total_s).collect();
        let ratios: Vec<f64> = mine
            .iter()
            .filter_map(|r| floor_of(r.round).map(|f| r.total_s / f))
            .collect();
        let per_node = median_of(mine.iter().map(|r| r.requests_per_node).collect());
        let cpu = median_of(
            mine.iter()
                .map(|r| (r.servers_cpu_s.apiserver_s + r.servers_cpu_s.etcd_s) * 1e3 / n as f64)
                .collect(),
        );
        out += &format!(
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} |\n",
            kind.name(),
            mine.len(),
            median_of(totals.clone()).unwrap_or(f64::NAN),
            spread(&totals),
            median_of(ratios.clone()).map_or("–".into(), |r| format!("{r:.2}")),
            if ratios.is_empty() {
                "–".into()
            } else {
                spread(&ratios)
            },
            per_node.map_or("–".into(), |r| format!("{r:.2}")),
            cpu.map_or("–".into(), |c| format!("{c:.2}")),
        );
    }
    let carves: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.carve_s.iter().copied())
        .collect();
    if let Some(m) = median_of(carves.clone()) {
        out += &format!(
            "\nnodeipam-pool: {} ranges carved over its rounds; need to range accepting: median {m:.2}s, spread {}s\n",
            carves.len(),
            spread(&carves)
        );
    }
    let requests: Vec<String> = runs
        .iter()
        .filter(|r| r.round == 1)
        .map(|r| {
            let kinds: Vec<String> = r
                .requests
                .by_kind
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            format!("- {}: {}", r.contender.name(), kinds.join(", "))
        })
        .collect();
    if !requests.is_empty() {
        out += "\nrequests in round 1, by verb and resource (start-up included):\n";
        out += &requests.join("\n");
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::carve_seconds;

    #[test]
    fn carve_latencies_are_read_from_the_log() {
        let log = "2026-12-01T07:00:00Z  INFO carved range accepts allocations pool=bench config=bench-10-1-0-0-16 seconds=0.734\n\
                   2026-12-01T07:00:01Z  INFO something else seconds=9\n\
                   2026-12-01T07:00:02Z  INFO carved range accepts allocations pool=bench config=x seconds=1.5";
        assert_eq!(carve_seconds(log), vec![0.734, 1.5]);
    }
}
