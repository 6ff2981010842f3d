//! `control-plane --dir DIR`: a standalone control plane for people (used by
//! `hack/control-plane.sh up`). Its files live in DIR; `DIR/kubeconfig` appears last, once the
//! API server is ready and the CRDs are installed; SIGTERM or SIGINT stops it cleanly.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use nodeipam_testenv::{ControlPlane, crd_dir};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
#[command(about = "Run etcd + kube-apiserver on loopback until SIGTERM/SIGINT")]
struct Args {
    /// Folder for the kubeconfig, logs, certificates and etcd data (kept after exit).
    #[arg(long)]
    dir: PathBuf,
    /// Folder of the CRD manifests to install (default: config/crd/bases, if present).
    #[arg(long)]
    crds: Option<PathBuf>,
    /// `--service-cluster-ip-range` of the API server.
    #[arg(long, default_value = "10.96.0.0/16")]
    service_cluster_ip_range: String,
    /// Extra kube-apiserver flags, e.g. `--apiserver-arg=--v=2`.
    #[arg(long = "apiserver-arg")]
    apiserver_args: Vec<String>,
}

// One thread: the kernel ties the children's lifetime (parent-death signal) to the thread that
// started them, and the main thread lives as long as the program.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("control-plane: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let kubeconfig = args.dir.join("kubeconfig");
    // A stale file would make `hack/control-plane.sh up` think we are already up.
    let _ = std::fs::remove_file(&kubeconfig);

    let mut builder = ControlPlane::builder()
        .dir(&args.dir)
        .service_cluster_ip_range(&args.service_cluster_ip_range);
    for arg in &args.apiserver_args {
        builder = builder.apiserver_arg(arg);
    }
    match args
        .crds
        .clone()
        .or_else(|| Some(crd_dir()).filter(|d| d.is_dir()))
    {
        Some(dir) => {
            eprintln!("control-plane: installing CRDs from {}", dir.display());
            builder = builder.crd_dir(dir);
        }
        None => {
            eprintln!("control-plane: no CRDs to install");
            builder = builder.install_crds(false);
        }
    }
    let mut cp = builder.start().await.map_err(|e| e.to_string())?;
    let t = cp.startup_timings();
    eprintln!(
        "control-plane: {} ready in {:.1}s (etcd {:.1}s, kube-apiserver {:.1}s); logs in {}",
        cp.server_url(),
        t.total.as_secs_f64(),
        t.etcd.as_secs_f64(),
        t.apiserver.as_secs_f64(),
        cp.log_dir().display()
    );

    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;

    publish_kubeconfig(cp.kubeconfig_path(), &kubeconfig)?;
    eprintln!("control-plane: export KUBECONFIG={}", kubeconfig.display());

    let mut watchdog = tokio::time::interval(Duration::from_secs(1));
    let outcome = loop {
        tokio::select! {
            _ = term.recv() => break Ok("SIGTERM"),
            _ = int.recv() => break Ok("SIGINT"),
            _ = watchdog.tick() => {
                if let Err(e) = cp.check_running() {
                    break Err(e.to_string());
                }
            }
        }
    };
    let _ = std::fs::remove_file(&kubeconfig);
    if let Ok(signal) = &outcome {
        eprintln!("control-plane: {signal}: stopping");
    }
    cp.stop().await;
    eprintln!("control-plane: stopped");
    outcome.map(|_| ())
}

/// Copies the admin kubeconfig to `target` through a rename, so a reader never sees half a file.
fn publish_kubeconfig(source: &Path, target: &Path) -> Result<(), String> {
    let partial = target.with_extension("partial");
    std::fs::copy(source, &partial)
        .and_then(|_| std::fs::rename(&partial, target))
        .map_err(|e| format!("write {}: {e}", target.display()))
}
