//! Start-up: N Nodes that already hold podCIDRs, then each contender started in turn on the same
//! control plane; times from the process start to its first log line, to its "synced" line,
//! and to the podCIDRs of a node created just before it started; and its memory then.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::common::{self, CommonArgs, ServerCpu, dec};
use crate::contender::{self, Kind, Settings};
use crate::nodes::{self, BENCH_LABEL, LoadReport};
use crate::observer::Observer;
use crate::procstat;
use crate::stats::{self, Machine};

#[derive(Debug, Clone, clap::Args)]
pub struct StartupArgs {
    /// Numbers of existing nodes.
    #[arg(long, value_delimiter = ',', default_value = "5000,50000")]
    pub nodes: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "nodeipam,kcm,floor")]
    pub contenders: Vec<Kind>,
    #[command(flatten)]
    pub common: CommonArgs,
    /// Creates in flight while filling the cluster.
    #[arg(long, default_value_t = 64)]
    pub populate_concurrency: usize,
    /// Starts of every contender per size, interleaved.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartupReport {
    pub benchmark: String,
    pub date: String,
    pub machine: Machine,
    pub settings: Settings,
    pub populations: Vec<Population>,
    pub runs: Vec<StartupRun>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Population {
    pub nodes: usize,
    pub load: LoadReport,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartupRun {
    pub contender: Kind,
    pub nodes: usize,
    pub round: usize,
    pub first_line_s: f64,
    /// The "synced" log line: every node read, allocation may start.
    pub synced_s: f64,
    /// The new node's podCIDRs seen by the observer.
    pub first_allocation_s: f64,
    pub cpu_s: f64,
    pub rss_mib: f64,
    pub rss_peak_mib: f64,
    /// What the start cost the API server and etcd (from spawn to the first allocation).
    pub servers_cpu_s: ServerCpu,
    pub load1: f64,
}

pub async fn run(args: StartupArgs) -> anyhow::Result<StartupReport> {
    let settings = args.common.settings();
    std::fs::create_dir_all(&args.common.work)?;
    let mut report = StartupReport {
        benchmark: "startup".into(),
        date: k8s_openapi::jiff::Timestamp::now().to_string(),
        machine: stats::machine(),
        settings: settings.clone(),
        populations: Vec::new(),
        runs: Vec::new(),
    };
    for &n in &args.nodes {
        let (cp, contender, _) = args.common.control_plane().await?;
        let admin = cp.client();
        let mut settings = settings.clone();
        eprintln!(
            "startup: creating {n} nodes with podCIDRs (load {:.2})",
            procstat::load1()?
        );
        let load = nodes::fill(
            cp.kubeconfig_path(),
            settings.mask,
            n,
            args.populate_concurrency,
        )
        .await?;
        eprintln!(
            "startup:   {n} nodes in {:.1}s ({:.0}/s)",
            load.seconds, load.per_second
        );
        report.populations.push(Population { nodes: n, load });
        // As a restarted nodeipam finds it: with its finalizer.
        common::create_config(&admin, true, settings.mask).await?;
        // After the config: the webhook refuses every config until a nodeipam answers.
        if args
            .contenders
            .iter()
            .any(|k| matches!(k, Kind::NodeipamDefault | Kind::NodeipamUpdated))
        {
            common::install_default(&admin, &mut settings).await?;
        }
        for round in 1..=args.rounds {
            for &kind in &args.contenders {
                let run = one(&args, &settings, &cp, &contender, kind, n, round)
                    .await
                    .with_context(|| format!("start-up of {} with {n} nodes", kind.name()))?;
                eprintln!(
                    "startup:   {}: first line {:.3}s, synced {:.3}s, first allocation {:.3}s, rss {:.0} MiB, cpu {:.2}s",
                    kind.name(),
                    run.first_line_s,
                    run.synced_s,
                    run.first_allocation_s,
                    run.rss_mib,
                    run.cpu_s
                );
                report.runs.push(run);
                std::fs::write(&args.out, serde_json::to_string_pretty(&report)?)?;
            }
        }
        cp.stop().await;
    }
    Ok(report)
}

async fn one(
    args: &StartupArgs,
    settings: &Settings,
    cp: &nodeipam_testenv::ControlPlane,
    contender: &common::Contender,
    kind: Kind,
    n: usize,
    round: usize,
) -> anyhow::Result<StartupRun> {
    let admin = cp.client();
    let log_name = format!("startup-{n}-{}-{round}.log", kind.name());
    match kind {
        // As on a first install over allocated nodes: no Lease and a config nodeipam never
        // finalized, so no previous leader to wait for (see `common::unfinalize_config`).
        Kind::NodeipamDefault => {
            common::delete_lease(&admin).await?;
            common::unfinalize_config(&admin).await?;
        }
        Kind::NodeipamUpdated => {
            common::predecessor(cp, settings, &args.common.work, &log_name, false).await?;
        }
        _ => {}
    }
    let group = format!("probe-{}-{round}", kind.name());
    let observer = Observer::start(&admin, &format!("{BENCH_LABEL}={group}")).await?;
    nodes::create_probe(&admin, &group).await?;
    // Let the API server settle after the create before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let load1 = procstat::load1()?;
    let servers_before = common::server_cpu()?;
    let mut proc = contender::spawn(
        kind,
        settings,
        &contender.kubeconfig,
        &args.common.work,
        &log_name,
    )?;
    observer
        .wait_assigned(1, Duration::from_secs(300), || proc.check_alive())
        .await?;
    let sample = proc.sample()?;
    let servers_after = common::server_cpu()?;
    let assigned = observer
        .snapshot()
        .get(&group)
        .and_then(|s| s.assigned)
        .context("the probe node has no podCIDRs")?;
    let synced = proc.wait_synced(Duration::from_secs(10)).await?;
    let first_line = proc.first_line().context("no output")?;
    let first_allocation = assigned.duration_since(proc.started);
    proc.stop().await?;
    Ok(StartupRun {
        contender: kind,
        nodes: n,
        round,
        first_line_s: dec(first_line.as_secs_f64(), 3),
        synced_s: dec(synced.as_secs_f64(), 3),
        first_allocation_s: dec(first_allocation.as_secs_f64(), 3),
        cpu_s: dec(sample.cpu_s, 2),
        rss_mib: dec(sample.rss_mib, 1),
        rss_peak_mib: dec(sample.hwm_mib, 1),
        servers_cpu_s: servers_after - servers_before,
        load1,
    })
}

pub fn table(report: &StartupReport) -> String {
    let mut out = String::new();
    for p in &report.populations {
        out += &format!(
            "\n{} existing nodes (created in {:.1}s, {:.0}/s)\n\n| contender | round | first log line s | synced s | first new allocation s | CPU s | RSS MiB | peak RSS MiB | apiserver CPU s | load |\n|---|---|---|---|---|---|---|---|---|---|\n",
            p.nodes, p.load.seconds, p.load.per_second
        );
        for r in report.runs.iter().filter(|r| r.nodes == p.nodes) {
            out += &format!(
                "| {} | {} | {:.3} | {:.3} | {:.3} | {:.2} | {:.0} | {:.0} | {:.1} | {:.2} |\n",
                r.contender.name(),
                r.round,
                r.first_line_s,
                r.synced_s,
                r.first_allocation_s,
                r.cpu_s,
                r.rss_mib,
                r.rss_peak_mib,
                r.servers_cpu_s.apiserver_s,
                r.load1
            );
        }
    }
    out
}
