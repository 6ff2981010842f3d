//! Failover: N Nodes that hold podCIDRs, a leader and a standby of one contender, then the
//! leader killed (SIGKILL, as a crashed node or an OOM kill); times from its death to the
//! podCIDRs of a node created right after it, i.e. the lease expiry, the standby's take-over
//! and its first allocation.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process};
use serde::{Deserialize, Serialize};

use crate::common::{self, CommonArgs, dec};
use crate::contender::{self, Kind, Settings};
use crate::nodes::{self, BENCH_LABEL, LoadReport};
use crate::observer::Observer;
use crate::procstat;
use crate::stats::{self, Machine};

#[derive(Debug, Clone, clap::Args)]
pub struct FailoverArgs {
    /// Numbers of existing nodes.
    #[arg(long, value_delimiter = ',', default_value = "50000")]
    pub nodes: Vec<usize>,
    /// Contenders with leader election: nodeipam-default and kcm.
    #[arg(long, value_delimiter = ',', default_value = "nodeipam-default,kcm")]
    pub contenders: Vec<Kind>,
    #[command(flatten)]
    pub common: CommonArgs,
    #[arg(long, default_value_t = 64)]
    pub populate_concurrency: usize,
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FailoverReport {
    pub benchmark: String,
    pub date: String,
    pub machine: Machine,
    pub settings: Settings,
    pub populations: Vec<(usize, LoadReport)>,
    pub runs: Vec<FailoverRun>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FailoverRun {
    pub contender: Kind,
    pub nodes: usize,
    pub round: usize,
    /// From the leader's death to the new node's podCIDRs.
    pub failover_s: f64,
    /// The standby's memory while it waited, and at the first allocation.
    pub standby_rss_mib: f64,
    pub rss_peak_mib: f64,
    pub load1: f64,
}

pub async fn run(args: FailoverArgs) -> anyhow::Result<FailoverReport> {
    let settings = args.common.settings();
    std::fs::create_dir_all(&args.common.work)?;
    if let Some(k) = args
        .contenders
        .iter()
        .find(|k| !matches!(k, Kind::NodeipamDefault | Kind::Kcm))
    {
        bail!("{} has no leader election", k.name());
    }
    let mut report = FailoverReport {
        benchmark: "failover".into(),
        date: k8s_openapi::jiff::Timestamp::now().to_string(),
        machine: stats::machine(),
        settings: settings.clone(),
        populations: Vec::new(),
        runs: Vec::new(),
    };
    for &n in &args.nodes {
        let (cp, contender, _) = args.common.control_plane().await?;
        let admin = cp.client();
        let load = nodes::fill(
            cp.kubeconfig_path(),
            settings.mask,
            n,
            args.populate_concurrency,
        )
        .await?;
        eprintln!("failover: {n} nodes in {:.1}s", load.seconds);
        report.populations.push((n, load));
        common::create_config(&admin, true, settings.mask).await?;
        // kcm's lease lives in kube-system, nodeipam's in its own namespace.
        common::namespace(&admin, "kube-system").await?;
        let mut settings = settings.clone();
        common::install_default(&admin, &mut settings).await?;
        for round in 1..=args.rounds {
            for &kind in &args.contenders {
                let run = one(&args, &settings, &cp, &contender, kind, n, round)
                    .await
                    .with_context(|| format!("failover of {} with {n} nodes", kind.name()))?;
                eprintln!(
                    "failover:   {}: {:.2}s, standby rss {:.0} MiB, peak {:.0} MiB",
                    kind.name(),
                    run.failover_s,
                    run.standby_rss_mib,
                    run.rss_peak_mib
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
    args: &FailoverArgs,
    settings: &Settings,
    cp: &nodeipam_testenv::ControlPlane,
    contender: &common::Contender,
    kind: Kind,
    n: usize,
    round: usize,
) -> anyhow::Result<FailoverRun> {
    let admin = cp.client();
    let replica = |name: &str, port: u16| {
        let mut s = settings.clone();
        s.replica = Some(format!("{}-{name}-{round}", kind.name()));
        s.webhook_port = port;
        s
    };
    let log = |name: &str| format!("failover-{n}-{}-{round}-{name}.log", kind.name());
    let work = &args.common.work;
    let leader_settings = replica("a", settings.webhook_port);
    let mut leader = contender::spawn(
        kind,
        &leader_settings,
        &contender.kubeconfig,
        work,
        &log("a"),
    )?;
    leader.wait_synced(Duration::from_secs(300)).await?;
    let standby_settings = replica("b", common::free_port()?);
    let mut standby = contender::spawn(
        kind,
        &standby_settings,
        &contender.kubeconfig,
        work,
        &log("b"),
    )?;
    // Long enough for the standby to have found the lease held and to be waiting.
    tokio::time::sleep(Duration::from_secs(5)).await;
    standby.check_alive()?;
    leader.check_alive()?;
    let standby_rss_mib = standby.sample()?.rss_mib;
    let group = format!("probe-{}-{round}", kind.name());
    let observer = Observer::start(&admin, &format!("{BENCH_LABEL}={group}")).await?;
    let load1 = procstat::load1()?;
    let pid = Pid::from_raw(leader.pid as i32).context("the leader's pid")?;
    kill_process(pid, Signal::KILL).context("killing the leader")?;
    let died = Instant::now();
    nodes::create_probe(&admin, &group).await?;
    observer
        .wait_assigned(1, Duration::from_secs(300), || standby.check_alive())
        .await?;
    let assigned = observer
        .snapshot()
        .get(&group)
        .and_then(|s| s.assigned)
        .context("the probe node has no podCIDRs")?;
    let peak = standby.sample()?.hwm_mib;
    standby.stop().await?;
    drop(leader);
    Ok(FailoverRun {
        contender: kind,
        nodes: n,
        round,
        failover_s: dec(assigned.duration_since(died).as_secs_f64(), 3),
        standby_rss_mib: dec(standby_rss_mib, 1),
        rss_peak_mib: dec(peak, 1),
        load1,
    })
}

pub fn table(report: &FailoverReport) -> String {
    let mut out = String::new();
    for (n, load) in &report.populations {
        out += &format!(
            "\n{n} existing nodes (created in {:.1}s); the leader killed, then one node created\n\n| contender | round | death to first allocation s | standby RSS MiB | peak RSS MiB | load |\n|---|---|---|---|---|---|\n",
            load.seconds
        );
        for r in report.runs.iter().filter(|r| r.nodes == *n) {
            out += &format!(
                "| {} | {} | {:.2} | {:.0} | {:.0} | {:.2} |\n",
                r.contender.name(),
                r.round,
                r.failover_s,
                r.standby_rss_mib,
                r.rss_peak_mib,
                r.load1
            );
        }
    }
    out
}
