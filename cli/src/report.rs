//! Running a command: connect, read, print in the `-o` asked for, and the exit status (0 done
//! or clean, 1 `check` found something, 2 the command could not run).

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::CommandFactory;
use nodeipam_alloc::check::{Finding, check, confirmed, split};
use serde::Serialize;

use crate::args::{Cli, Command, Global, Migrate, View};
use crate::read::read;
use crate::status;

/// Exit statuses, the same as `nodeipam ranges`'s (see its `--help`).
use nodeipam_controller::ranges::{EXIT_FAILED as FAILED, EXIT_FOUND as FOUND};

pub async fn run(cli: Cli) -> ExitCode {
    let command = match cli.command {
        Command::Migrate {
            from: Migrate::ClusterCidr(args),
        } => return crate::migrate::run(&cli.global, &args).await,
        Command::Version => return done(nodeipam_controller::version::text()),
        Command::Completion { shell } => {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "kubectl-nodeipam", &mut buf);
            return done(String::from_utf8_lossy(&buf).into_owned());
        }
        other => other,
    };
    let (client, server) = match connect(&cli.global).await {
        Ok(connected) => connected,
        Err(e) => return fail("kubectl nodeipam", &e, None),
    };
    let out = match command {
        Command::Ranges { output } => ranges(&client, output).await.map(|s| (s, true)),
        Command::Status { output } => status(&client, &cli.global, output)
            .await
            .map(|s| (s, true)),
        Command::Check { output, settle } => checked(&client, &cli.global, output, settle.0).await,
        Command::Migrate { .. } | Command::Version | Command::Completion { .. } => {
            unreachable!("run above")
        }
    };
    match out {
        Ok((text, clean)) => {
            print!("{text}");
            if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(FOUND)
            }
        }
        Err(e) => fail("kubectl nodeipam", &e, Some(&server)),
    }
}

fn done(text: String) -> ExitCode {
    print!("{text}");
    ExitCode::SUCCESS
}

/// Prints `e` as one line naming `server` when the request did not reach it; exit 2.
pub fn fail(command: &str, e: &anyhow::Error, server: Option<&http::Uri>) -> ExitCode {
    eprintln!(
        "{command}: {}",
        nodeipam_controller::client::one_line(e, server)
    );
    ExitCode::from(FAILED)
}

/// A client from kubectl's flags, and the API server it talks to.
pub async fn connect(global: &Global) -> anyhow::Result<(kube::Client, http::Uri)> {
    let config = nodeipam_controller::kubeconfig::config(&global.overrides()).await?;
    let server = config.cluster_url.clone();
    let client = nodeipam_controller::client::build(config, &global.client())?;
    Ok((client, server))
}

async fn ranges(
    client: &kube::Client,
    format: nodeipam_controller::ranges::Format,
) -> anyhow::Result<String> {
    let network = nodeipam_controller::ranges::read(client).await?;
    Ok(nodeipam_controller::ranges::render(&network, format)?)
}

async fn status(client: &kube::Client, global: &Global, view: View) -> anyhow::Result<String> {
    let read = read(client, global).await?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let report = status::report(&read, now);
    match view {
        View::Table => Ok(status::table(&report, false)),
        View::Wide => Ok(status::table(&report, true)),
        View::Json | View::Yaml => structured(&report, view),
    }
}

/// The findings, and whether there were none. Damage is reported from the first look (a table
/// prints it before waiting); what the controller's lag can cause is read again `settle` later
/// and reported only where it persisted (`nodeipam_alloc::check::confirmed`).
async fn checked(
    client: &kube::Client,
    global: &Global,
    view: View,
    settle: Duration,
) -> anyhow::Result<(String, bool)> {
    let first = read(client, global).await?;
    let (damage, lag) = split(check(&first.cluster()));
    if lag.is_empty() || settle.is_zero() {
        let findings = [damage, lag].concat();
        return Ok((render(&findings, &first, view)?, findings.is_empty()));
    }
    let table = matches!(view, View::Table | View::Wide);
    if table && !damage.is_empty() {
        print!("{}", lines(&damage, &first));
        std::io::stdout().flush()?;
    }
    eprintln!(
        "kubectl nodeipam: {} finding(s) the controller's normal lag can cause; looking again in {}",
        lag.len(),
        nodeipam_crd::duration::format(settle)
    );
    tokio::time::sleep(settle).await;
    let second = read(client, global).await?;
    let kept = confirmed(&lag, &check(&second.cluster()));
    let clean = damage.is_empty() && kept.is_empty();
    let text = match (table, damage.is_empty()) {
        // The damage is printed already.
        (true, false) => kept.iter().map(|f| format!("{f}\n")).collect(),
        _ => render(&[damage, kept].concat(), &second, view)?,
    };
    Ok((text, clean))
}

fn render(findings: &[Finding], read: &crate::read::Read, view: View) -> anyhow::Result<String> {
    match view {
        View::Table | View::Wide => Ok(lines(findings, read)),
        View::Json | View::Yaml => structured(&findings, view),
    }
}

/// One line per finding; a clean check says what it looked at.
fn lines(findings: &[Finding], read: &crate::read::Read) -> String {
    if findings.is_empty() {
        return format!(
            "No inconsistencies: {} node(s), {} NodeIPAMConfig(s), {} Service range(s), {} published output(s) checked.\n",
            read.nodes.len(),
            read.configs.len(),
            read.services.iter().map(|(_, c)| c.len()).sum::<usize>(),
            read.outputs.len()
        );
    }
    findings.iter().map(|f| format!("{f}\n")).collect()
}

fn structured<T: Serialize>(value: &T, view: View) -> anyhow::Result<String> {
    Ok(match view {
        View::Yaml => serde_saphyr::to_string(value)?,
        _ => serde_json::to_string_pretty(value)? + "\n",
    })
}
