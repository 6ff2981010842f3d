//! The burst: on a fresh control plane per run, N Nodes created as fast as the API server takes
//! them while one contender allocates; the observer times each node from its creation to its
//! podCIDRs.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::audit::Requests;
use crate::common::{self, CommonArgs, ServerCpu, dec};
use crate::contender::{self, Kind, Settings};
use crate::kwok::{self, Kwok};
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
    /// `kwok`: the kubelet-like fleet. Every node carries KWOK's annotation and a KWOK process
    /// (`--kwok`) plays its kubelet with the stages of `--kwok-stages`: a status update at
    /// registration (Ready=False, the CNI not initialized), Ready 0.5-2.5 s later, then a
    /// heartbeat every 20-25 s unless `--kwok-heartbeat=false`. Burst mode only; a run ends at
    /// `--time-limit` with the nodes served so far.
    #[arg(long, value_enum)]
    pub fleet: Option<Fleet>,
    /// The kwok binary (`hack/kwok.sh build`).
    #[arg(long)]
    pub kwok: Option<PathBuf>,
    /// Folder of the stage files (default: hack/kwok/stages of this checkout).
    #[arg(long)]
    pub kwok_stages: Option<PathBuf>,
    /// The heartbeat stage (a kubelet without node Leases); false: register and Ready only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub kwok_heartbeat: bool,
    /// With `--fleet`: seconds from the first create after which a run stops waiting and
    /// reports how many nodes were served.
    #[arg(long, default_value_t = 300)]
    pub time_limit: u64,
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

/// Who plays the nodes' kubelets in a `--fleet` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Fleet {
    Kwok,
}

/// How a `--fleet` run's kubelets behaved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetSettings {
    pub fleet: Fleet,
    /// The stages, in order (`metadata.name` of each).
    pub stages: Vec<String>,
    pub heartbeat: bool,
    pub time_limit_s: u64,
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
    #[serde(default)]
    pub fleet: Option<FleetSettings>,
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
    /// With `--kubelets`: the status updates the nodes' kubelets made during the run; with
    /// `--fleet kwok`: KWOK's status writes (from the audit log, the warm-up node's included).
    #[serde(default)]
    pub kubelet_updates: Option<u64>,
    #[serde(default)]
    pub fleet: Option<Fleet>,
    /// With `--fleet`: the nodes that held podCIDRs when the run ended (all of them, or those
    /// served within the time limit; then `total_s` is the time until it gave up).
    #[serde(default)]
    pub served: Option<usize>,
    /// The contender's writes of Node objects (patch or update of nodes: its podCIDR writes,
    /// answered or not), the warm-up node's included.
    #[serde(default)]
    pub node_writes: u64,
    /// The contender's requests answered 409 Conflict.
    #[serde(default)]
    pub conflicts: u64,
    /// The contender's Node writes answered with anything but 2xx (409s, 422s, 5xx).
    #[serde(default)]
    pub failed_node_writes: u64,
    /// With `--fleet kwok`: every request KWOK made, and its CPU during the burst.
    #[serde(default)]
    pub kubelet_requests: Option<Requests>,
    #[serde(default)]
    pub kwok_cpu_s: Option<f64>,
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
    let fleet = match args.fleet {
        None => None,
        Some(fleet) => {
            if args.mode == Mode::Backlog || args.kubelets || args.existing > 0 {
                bail!("--fleet goes with --mode burst, without --kubelets and --existing");
            }
            let bin = args
                .kwok
                .as_ref()
                .context("--fleet kwok needs --kwok (the binary)")?;
            if !bin.is_file() {
                bail!(
                    "--kwok {}: no such file (hack/kwok.sh build)",
                    bin.display()
                );
            }
            let mut stages = Vec::new();
            for f in kwok::stage_files(&stages_dir(&args), args.kwok_heartbeat) {
                let text = std::fs::read_to_string(&f)
                    .with_context(|| format!("reading the stage file {}", f.display()))?;
                stages.extend(kwok::stage_names(&text));
            }
            Some(FleetSettings {
                fleet,
                stages,
                heartbeat: args.kwok_heartbeat,
                time_limit_s: args.time_limit,
            })
        }
    };
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
        fleet,
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
                if let Some(served) = run.served {
                    eprintln!(
                        "burst:   served {served} of {n}; node writes {}, 409s {}, kubelet status updates {}",
                        run.node_writes,
                        run.conflicts,
                        run.kubelet_updates.unwrap_or_default()
                    );
                }
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
    let fleet = args.fleet.is_some();
    let batch: Vec<_> = (0..n)
        .map(|i| nodes::node(&format!("burst-{i:06}"), "burst", i as u32, None))
        .map(|node| if fleet { kwok_node(node) } else { node })
        .collect();
    let limiter = Arc::new(Limiter::new(args.load_qps, args.load_burst));
    let concurrency = args.load_concurrency;
    // Generous: a stuck contender fails the run instead of hanging it.
    let timeout = Duration::from_secs(120 + (n as u64) / 10);

    let mut kubelet_updates = None;
    let mut kwok_proc: Option<Kwok> = None;
    let mut kwok_cpu_before = 0.0;
    let mut gave_up: Option<Instant> = None;
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
        // KWOK as its own user, so that the audit log counts its requests apart.
        if let (Some(Fleet::Kwok), Some(bin)) = (args.fleet, &args.kwok) {
            let dir = contender
                .kubeconfig
                .parent()
                .context("the contender's kubeconfig has no folder")?;
            let kubeconfig = dir.join("kwok.kubeconfig");
            cp.write_kubeconfig_for(kwok::USER, &["system:masters"], &kubeconfig)
                .context("writing kwok's kubeconfig")?;
            let log = args
                .common
                .work
                .join(format!("kwok-{n}-{}-{round}.log", kind.name()));
            let stages = kwok::stage_files(&stages_dir(args), args.kwok_heartbeat);
            kwok_proc = Some(Kwok::start(bin, &kubeconfig, &stages, dir, log)?);
        }
        proc.wait_synced(Duration::from_secs(60)).await?;
        if matches!(kind, Kind::NodeipamDefault | Kind::NodeipamPool) {
            common::create_allocation_source(&admin, kind, settings.mask).await?;
        }
        // Warm-up: one node through the whole path, so every gate is open and every
        // connection up; in a fleet run it is KWOK's too, and ready once KWOK has played it.
        let warm = Observer::start(&admin, &format!("{BENCH_LABEL}=warmup")).await?;
        let warm_node = nodes::node("warmup-0", "warmup", 0, None);
        nodes::create_all(
            &admin,
            vec![if fleet {
                kwok_node(warm_node)
            } else {
                warm_node
            }],
            1,
            Arc::new(Limiter::new(0.0, 1)),
        )
        .await?;
        warm.wait_assigned(1, Duration::from_secs(60), || proc.check_alive())
            .await
            .context("the warm-up node")?;
        drop(warm);
        if let Some(k) = kwok_proc.as_mut() {
            kwok::wait_ready(&admin, "warmup-0", k, Duration::from_secs(60))
                .await
                .context("the warm-up node")?;
            kwok_cpu_before = k.cpu_s()?;
        }
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
        if let Some(k) = kwok_proc.as_mut() {
            let limit = Duration::from_secs(args.time_limit);
            let all = observer
                .wait_served(n, limit, || {
                    proc.check_alive()?;
                    k.check_alive()
                })
                .await?;
            if !all {
                gave_up = Some(Instant::now());
                let (seen, served) = observer.counts();
                eprintln!(
                    "burst:   time limit: {served} of {n} nodes served after {limit:?} ({seen} seen)"
                );
            }
        } else {
            observer
                .wait_assigned(n, timeout, || proc.check_alive())
                .await?;
        }
        kubelet_updates = kubelets.map(|k| k.updates());
        let load = loader.await.context("the loader task")??;
        (proc, observer, load, before, servers_before, load1_before)
    };
    proc.check_alive()?;
    let kwok_cpu_s = match kwok_proc.as_mut() {
        Some(k) => {
            k.check_alive()?;
            Some(dec(k.cpu_s()? - kwok_cpu_before, 2))
        }
        None => None,
    };
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
        let Some(assigned) = s.assigned else {
            if gave_up.is_some() {
                continue;
            }
            bail!("{name} has no podCIDRs");
        };
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
    // A run that gave up may stop before the observer has seen every create.
    if seen.len() != n && gave_up.is_none() {
        bail!("the observer saw {} nodes, {n} created", seen.len());
    }
    let served = latencies.len();
    let total_s = gave_up.unwrap_or(last).duration_since(start).as_secs_f64();
    let watch_errors = observer.watch_errors();
    drop(observer);
    let proc_log = proc.log.clone();
    proc.stop().await?;
    if let Some(k) = kwok_proc {
        k.stop().await?;
    }
    // Counted after the contender stopped: its watches have ended and been logged.
    let requests = contender.requests()?;
    let kubelet_requests = if fleet {
        let r = crate::audit::count_file_user(&contender.audit_log, kwok::USER)?;
        kubelet_updates = Some(r.node_status_writes());
        Some(r)
    } else {
        None
    };
    let carves = carve_seconds(&std::fs::read_to_string(&proc_log).unwrap_or_default());
    cp.stop().await;
    Ok(BurstRun {
        contender: kind,
        mode: args.mode,
        nodes: n,
        round,
        total_s: dec(total_s, 3),
        assigned_per_s: dec(served as f64 / total_s, 1),
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
        node_writes: requests.node_writes(),
        conflicts: requests.conflicts(),
        failed_node_writes: requests.failed_node_writes(),
        requests,
        kubelet_updates,
        fleet: args.fleet,
        served: fleet.then_some(served),
        kubelet_requests,
        kwok_cpu_s,
    })
}

fn stages_dir(args: &BurstArgs) -> PathBuf {
    args.kwok_stages
        .clone()
        .unwrap_or_else(|| nodeipam_testenv::workspace_root().join("hack/kwok/stages"))
}

/// Marks a node as one of KWOK's.
fn kwok_node(mut node: k8s_openapi::api::core::v1::Node) -> k8s_openapi::api::core::v1::Node {
    node.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(kwok::ANNOTATION.into(), kwok::ANNOTATION_VALUE.into());
    node
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
            Mode::Burst if runs.iter().any(|r| r.fleet.is_some()) => {
                "created while the contender runs, each played by KWOK as a kubelet (the stages of hack/kwok/stages); latency from creation"
            }
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
        if runs.iter().any(|r| r.fleet.is_some()) {
            out += &fleet_table(&runs, n, report.fleet.as_ref());
        }
    }
    out
}

/// The kubelet-like fleet's numbers: per run, the nodes served and the contender's Node writes
/// and conflicts per node (the warm-up node counted: N + 1 nodes), KWOK's status updates per
/// node; then per contender over its rounds the median total, its spread, and the median and
/// spread of the per-round ratios to kcm.
pub fn fleet_table(runs: &[&BurstRun], n: usize, settings: Option<&FleetSettings>) -> String {
    let per_node = |x: u64| x as f64 / (n + 1) as f64;
    let mut out = String::from("\n");
    if let Some(s) = settings {
        out += &format!(
            "kubelet-like fleet: {:?} with stages {} (heartbeat {}), time limit {} s; per node = over {} nodes (the warm-up node's included)\n",
            s.fleet,
            s.stages.join(" → "),
            if s.heartbeat { "on" } else { "off" },
            s.time_limit_s,
            n + 1
        );
    }
    out += "\n| contender | round | served | total s | p50 ms | p99 ms | node writes/node | 409s/node | failed node writes/node | kubelet status updates/node | kwok CPU s |\n|---|---|---|---|---|---|---|---|---|---|---|\n";
    for r in runs {
        out += &format!(
            "| {} | {} | {}/{} | {:.2} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {} | {} |\n",
            r.contender.name(),
            r.round,
            r.served.unwrap_or(r.latency.count),
            r.nodes,
            r.total_s,
            r.latency.p50_ms,
            r.latency.p99_ms,
            per_node(r.node_writes),
            per_node(r.conflicts),
            per_node(r.failed_node_writes),
            r.kubelet_updates
                .map_or("–".into(), |u| format!("{:.2}", per_node(u))),
            r.kwok_cpu_s.map_or("–".into(), |c| format!("{c:.2}")),
        );
    }
    let mut kinds: Vec<Kind> = runs.iter().map(|r| r.contender).collect();
    kinds.sort_by_key(|k| k.name());
    kinds.dedup();
    let kcm_of = |round: usize| {
        runs.iter()
            .find(|r| r.contender == Kind::Kcm && r.round == round)
            .map(|r| r.total_s)
    };
    out += "\n| contender | rounds | served (fewest) | median total s | spread s | median × kcm | spread × kcm | node writes/node | 409s/node |\n|---|---|---|---|---|---|---|---|---|\n";
    for kind in kinds {
        let mine: Vec<&&BurstRun> = runs.iter().filter(|r| r.contender == kind).collect();
        let totals: Vec<f64> = mine.iter().map(|r| r.total_s).collect();
        let ratios: Vec<f64> = mine
            .iter()
            .filter_map(|r| kcm_of(r.round).map(|k| r.total_s / k))
            .collect();
        let served = mine
            .iter()
            .map(|r| r.served.unwrap_or(r.latency.count))
            .min()
            .unwrap_or(0);
        out += &format!(
            "| {} | {} | {served}/{n} | {:.2} | {} | {} | {} | {} | {} |\n",
            kind.name(),
            mine.len(),
            median_of(totals.clone()).unwrap_or(f64::NAN),
            spread(&totals),
            median_of(ratios.clone()).map_or("–".into(), |r| format!("{r:.3}")),
            if ratios.is_empty() {
                "–".into()
            } else {
                spread(&ratios)
            },
            median_of(mine.iter().map(|r| per_node(r.node_writes)).collect())
                .map_or("–".into(), |w| format!("{w:.3}")),
            median_of(mine.iter().map(|r| per_node(r.conflicts)).collect())
                .map_or("–".into(), |c| format!("{c:.3}")),
        );
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
    use super::*;

    fn fleet_run(
        kind: &str,
        round: usize,
        total: f64,
        served: usize,
        writes: u64,
        conflicts: u64,
    ) -> BurstRun {
        serde_json::from_value(serde_json::json!({
            "contender": kind, "mode": "burst", "nodes": 200, "round": round,
            "total_s": total, "assigned_per_s": 0.0,
            "latency": {"count": served, "p50_ms": 1000.0, "p90_ms": 0.0, "p99_ms": 2000.0, "max_ms": 0.0, "mean_ms": 0.0},
            "load": {"created": 200, "seconds": 1.0, "per_second": 200.0, "retries": 0},
            "synced_s": 0.1, "cpu_s": 1.0, "rss_end_mib": 1.0, "rss_peak_mib": 1.0,
            "servers_cpu_s": {"apiserver_s": 1.0, "etcd_s": 1.0},
            "load1_before": 0.0, "load1_after": 0.0, "watch_errors": 0,
            "fleet": "kwok", "served": served, "node_writes": writes, "conflicts": conflicts,
            "failed_node_writes": conflicts,
            "kubelet_updates": 402, "kwok_cpu_s": 0.5,
        }))
        .expect("a run")
    }

    #[test]
    fn the_fleet_table_gives_served_writes_and_conflicts_per_node_and_ratios_to_kcm() {
        let runs = [
            fleet_run("nodeipam-default", 1, 4.4, 200, 201, 0),
            fleet_run("kcm", 1, 4.0, 200, 205, 2),
            fleet_run("nodeipam-default", 2, 300.5, 150, 151, 0),
            fleet_run("kcm", 2, 5.0, 200, 201, 0),
        ];
        let refs: Vec<&BurstRun> = runs.iter().collect();
        let settings = FleetSettings {
            fleet: Fleet::Kwok,
            stages: vec!["node-register".into(), "node-ready".into()],
            heartbeat: false,
            time_limit_s: 300,
        };
        let t = fleet_table(&refs, 200, Some(&settings));
        assert!(
            t.contains("node-register → node-ready (heartbeat off), time limit 300 s"),
            "{t}"
        );
        // 201 writes over 200 nodes and the warm-up node; 402 status updates: 2 per node.
        assert!(t.contains("| nodeipam-default | 1 | 200/200 | 4.40 | 1000 | 2000 | 1.000 | 0.000 | 0.000 | 2.00 | 0.50 |"), "{t}");
        assert!(
            t.contains(
                "| kcm | 1 | 200/200 | 4.00 | 1000 | 2000 | 1.020 | 0.010 | 0.010 | 2.00 | 0.50 |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| nodeipam-default | 2 | 150/200 | 300.50 |"),
            "{t}"
        );
        // Per-round ratios 1.1 and 60.1; the fewest served.
        assert!(
            t.contains(
                "| nodeipam-default | 2 | 150/200 | 152.45 | 4.40–300.50 | 30.600 | 1.10–60.10 |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| kcm | 2 | 200/200 | 4.50 | 4.00–5.00 | 1.000 | 1.00–1.00 |"),
            "{t}"
        );
    }

    #[test]
    fn carve_latencies_are_read_from_the_log() {
        let log = "2026-12-01T07:00:00Z  INFO carved range accepts allocations pool=bench config=bench-10-1-0-0-16 seconds=0.734\n\
                   2026-12-01T07:00:01Z  INFO something else seconds=9\n\
                   2026-12-01T07:00:02Z  INFO carved range accepts allocations pool=bench config=x seconds=1.5";
        assert_eq!(carve_seconds(log), vec![0.734, 1.5]);
    }
}
