//! `nodeipam-bench`: nodeipam side by side with kube-controller-manager and with the floor (a
//! plain patcher) on a real local control plane; see BENCHMARKS.md and hack/bench/.

mod allocator;
mod audit;
mod burst;
mod capture;
mod common;
mod contender;
mod failover;
mod floor;
mod kwok;
mod nodes;
mod observer;
mod procstat;
mod startup;
mod stats;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Debug, Parser)]
#[command(
    name = "nodeipam-bench",
    about = "nodeipam benchmarks against kcm and the floor"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N nodes created at once; time until each has podCIDRs, per contender.
    Burst(burst::BurstArgs),
    /// A leader and a standby with N nodes that hold podCIDRs; the leader killed.
    Failover(failover::FailoverArgs),
    /// Start each contender with N nodes that hold podCIDRs already.
    Startup(startup::StartupArgs),
    /// The floor patcher (a contender; started by `burst` and `startup`).
    Floor(floor::FloorArgs),
    /// The allocator table from criterion's estimates and `go test -bench` output.
    Allocator(allocator::AllocatorArgs),
    /// Create nodes in a running cluster (e.g. to profile a contender by hand).
    Populate(PopulateArgs),
    /// A control plane filled with N Nodes, its Node list written page by page in protobuf.
    CaptureNodeLists(capture::CaptureArgs),
    /// Print the tables of result files written by `burst` or `startup`.
    Report { files: Vec<PathBuf> },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The floor gets the runtime every kube client gets; the orchestrator keeps the main
    // thread, which the harness ties its children's lifetime to.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match cli.command {
            Command::Burst(args) => {
                let out = args.out.clone();
                let report = burst::run(args).await?;
                println!("{}", burst::table(&report));
                eprintln!("results: {}", out.display());
            }
            Command::Startup(args) => {
                let out = args.out.clone();
                let report = startup::run(args).await?;
                println!("{}", startup::table(&report));
                eprintln!("results: {}", out.display());
            }
            Command::Failover(args) => {
                let out = args.out.clone();
                let report = failover::run(args).await?;
                println!("{}", failover::table(&report));
                eprintln!("results: {}", out.display());
            }
            Command::Allocator(args) => {
                let report = allocator::run(&args)?;
                println!("{}", allocator::table(&report));
            }
            Command::Floor(args) => floor::run(args).await?,
            Command::Populate(args) => populate(args).await?,
            Command::CaptureNodeLists(args) => capture::run(args).await?,
            Command::Report { files } => {
                for f in files {
                    println!("{}", report(&f)?);
                }
            }
        }
        Ok(())
    })
}

#[derive(Debug, clap::Args)]
struct PopulateArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    #[arg(long)]
    nodes: usize,
    /// Name prefix and the value of the bench.nodeipam.io/group label.
    #[arg(long, default_value = "existing")]
    group: String,
    /// Give each node a /24 of 10.0.0.0/8 (outside the Service range), as if allocated earlier.
    #[arg(long)]
    with_pod_cidrs: bool,
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Creates per second (0: as fast as the API server takes them).
    #[arg(long, default_value_t = 0.0)]
    qps: f64,
}

async fn populate(args: PopulateArgs) -> anyhow::Result<()> {
    let client = client(&args.kubeconfig).await?;
    let blocks = if args.with_pod_cidrs {
        nodes::blocks(
            common::CLUSTER_CIDR.parse()?,
            common::MASK,
            &[common::SERVICE_RANGE.parse()?],
            args.nodes,
        )?
    } else {
        Vec::new()
    };
    let batch = (0..args.nodes)
        .map(|i| {
            let name = format!("{}-{i:06}", args.group);
            nodes::node(&name, &args.group, i as u32, blocks.get(i))
        })
        .collect();
    let report = nodes::create_all(
        &client,
        batch,
        args.concurrency,
        std::sync::Arc::new(nodeipam_controller::ratelimit::RateLimiter::new(
            args.qps, 1,
        )),
    )
    .await?;
    eprintln!(
        "created {} nodes in {:.1}s ({:.0}/s)",
        report.created, report.seconds, report.per_second
    );
    Ok(())
}

fn report(path: &Path) -> anyhow::Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let value: serde_json::Value = serde_json::from_str(&text)?;
    match value["benchmark"].as_str() {
        Some("burst") => Ok(burst::table(&serde_json::from_value(value)?)),
        Some("allocator") => Ok(allocator::table(&serde_json::from_value(value)?)),
        Some("startup") => Ok(startup::table(&serde_json::from_value(value)?)),
        Some("failover") => Ok(failover::table(&serde_json::from_value(value)?)),
        other => anyhow::bail!("{}: unknown benchmark {other:?}", path.display()),
    }
}

/// A client from a kubeconfig file, with its own connection pool.
pub async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", kubeconfig.display()))?;
    kube::Client::try_from(config).context("building a client")
}
