//! The contenders as processes: `nodeipam run`, kube-controller-manager running only its
//! node-ipam-controller, and the floor patcher (this binary's `floor`). Their output goes to a
//! log file; the time of the first line and of the line that says "synced" are recorded.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rustix::process::{Pid, Signal, kill_process};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::procstat;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// nodeipam tuned for the benchmark: no webhook, no publishing, no leader election.
    Nodeipam,
    /// nodeipam as installed: webhook, publishing and leader election on, the config created
    /// without our finalizer.
    NodeipamDefault,
    /// nodeipam as installed after a rolling update: a previous replica of the same install
    /// led, then stopped cleanly (SIGTERM) and handed over; the timed one takes over from it.
    NodeipamUpdated,
    /// nodeipam as installed, with a NodeIPAMPool instead of one big config: it starts with
    /// one range of 256 blocks and carves more as nodes come.
    NodeipamPool,
    Kcm,
    Floor,
    /// The floor reading the existing nodes with a streaming list instead of pages of 500.
    FloorStreaming,
    /// The floor reading the existing nodes with one unpaged list.
    FloorUnpaged,
    /// The floor parsing only what it needs of each Node (nodeipam's `IpamNode`).
    FloorSlim,
    /// The same with a streaming list.
    FloorSlimStreaming,
    /// The floor writing nodeipam's patch (annotation and UID precondition too).
    FloorLikeNodeipam,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Nodeipam => "nodeipam",
            Kind::NodeipamDefault => "nodeipam-default",
            Kind::NodeipamUpdated => "nodeipam-updated",
            Kind::NodeipamPool => "nodeipam-pool",
            Kind::Kcm => "kcm",
            Kind::Floor => "floor",
            Kind::FloorStreaming => "floor-streaming",
            Kind::FloorUnpaged => "floor-unpaged",
            Kind::FloorSlim => "floor-slim",
            Kind::FloorSlimStreaming => "floor-slim-streaming",
            Kind::FloorLikeNodeipam => "floor-like-nodeipam",
        }
    }

    /// Log lines, in order, that together say the contender has read every Node and may
    /// allocate: nodeipam's rebuild message; kcm's cache sync after its range allocator
    /// starts; the floor's own line.
    fn synced_lines(self) -> &'static [&'static str] {
        match self {
            Kind::Nodeipam | Kind::NodeipamDefault | Kind::NodeipamUpdated | Kind::NodeipamPool => {
                &["allocation state rebuilt from the API"]
            }
            Kind::Kcm => &["Starting range CIDR allocator", "Caches are synced"],
            _ => &["floor: synced"],
        }
    }
}

/// The same for every contender.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Settings {
    pub qps: f64,
    pub burst: u32,
    /// nodeipam's `--write-concurrency` and the floor's `--concurrency` (kcm: 30 workers, fixed).
    pub write_concurrency: usize,
    pub cluster_cidr: String,
    pub mask: u8,
    pub service_range: String,
    #[serde(skip)]
    pub nodeipam_bin: PathBuf,
    #[serde(skip)]
    pub kcm_bin: PathBuf,
    /// Where `nodeipam-default` serves its webhook (registered by URL before it starts).
    #[serde(skip)]
    pub webhook_port: u16,
    /// A replica's name, for a run with leader election (failover): nodeipam's `--identity`;
    /// kcm then runs with `--leader-elect=true`.
    #[serde(skip)]
    pub replica: Option<String>,
}

#[derive(Default)]
struct Markers {
    first_line: Option<Instant>,
    synced: Option<Instant>,
    matched: usize,
}

pub struct Running {
    pub kind: Kind,
    pub pid: u32,
    pub started: Instant,
    pub log: PathBuf,
    child: Child,
    markers: Arc<Mutex<Markers>>,
}

/// The command line of `kind`.
pub fn command(kind: Kind, s: &Settings, kubeconfig: &Path) -> anyhow::Result<Vec<String>> {
    let kc = kubeconfig.display().to_string();
    let mut argv = match kind {
        Kind::Nodeipam => vec![
            s.nodeipam_bin.display().to_string(),
            "run".into(),
            format!("--kubeconfig={kc}"),
            "--disable-webhook".into(),
            "--disable-leader-election".into(),
            "--pod-network-configmap=".into(),
            format!("--kube-api-qps={}", s.qps),
            format!("--kube-api-burst={}", s.burst),
            format!("--write-concurrency={}", s.write_concurrency),
            // Any free port: several benchmarks or tests may run on one machine.
            "--metrics-addr=127.0.0.1:0".into(),
        ],
        Kind::NodeipamDefault | Kind::NodeipamUpdated | Kind::NodeipamPool => vec![
            s.nodeipam_bin.display().to_string(),
            "run".into(),
            format!("--kubeconfig={kc}"),
            format!("--kube-api-qps={}", s.qps),
            format!("--kube-api-burst={}", s.burst),
            format!("--write-concurrency={}", s.write_concurrency),
            format!("--identity={}", s.replica.as_deref().unwrap_or("bench")),
            // Loopback instead of a Service: the API server reaches the webhook by URL.
            format!("--webhook-addr=127.0.0.1:{}", s.webhook_port),
            "--webhook-dns-names=127.0.0.1".into(),
            "--metrics-bind-address=127.0.0.1:0".into(),
            "--health-probe-bind-address=127.0.0.1:0".into(),
        ],
        Kind::Kcm => vec![
            s.kcm_bin.display().to_string(),
            format!("--kubeconfig={kc}"),
            "--controllers=node-ipam-controller".into(),
            "--allocate-node-cidrs=true".into(),
            format!("--cluster-cidr={}", s.cluster_cidr),
            format!("--node-cidr-mask-size={}", s.mask),
            format!("--service-cluster-ip-range={}", s.service_range),
            format!("--kube-api-qps={}", s.qps),
            format!("--kube-api-burst={}", s.burst),
            format!("--leader-elect={}", s.replica.is_some()),
            "--secure-port=0".into(),
        ],
        _ => vec![
            std::env::current_exe()
                .context("locating this binary")?
                .display()
                .to_string(),
            "floor".into(),
            format!("--kubeconfig={kc}"),
            format!("--cidr={}", s.cluster_cidr),
            format!("--mask={}", s.mask),
            format!("--exclude={}", s.service_range),
            format!("--concurrency={}", s.write_concurrency),
            format!("--qps={}", s.qps),
            format!("--burst={}", s.burst),
            format!(
                "--initial-list={}",
                match kind {
                    Kind::FloorStreaming | Kind::FloorSlimStreaming => "streaming",
                    Kind::FloorUnpaged => "unpaged",
                    _ => "paged",
                }
            ),
        ],
    };
    if matches!(kind, Kind::FloorSlim | Kind::FloorSlimStreaming) {
        argv.push("--slim".into());
    }
    if kind == Kind::FloorLikeNodeipam {
        argv.push("--like-nodeipam".into());
    }
    Ok(argv)
}

/// Starts `kind`; its output goes to `log_dir/<kind>.log`.
pub fn spawn(
    kind: Kind,
    settings: &Settings,
    kubeconfig: &Path,
    log_dir: &Path,
    log_name: &str,
) -> anyhow::Result<Running> {
    let argv = command(kind, settings, kubeconfig)?;
    let log = log_dir.join(log_name);
    let file = Arc::new(Mutex::new(
        File::create(&log).with_context(|| format!("creating {}", log.display()))?,
    ));
    let mut cmd = dies_with_us(&argv);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", argv.join(" ")))?;
    let pid = child.id().context("the contender has no pid")?;
    let markers = Arc::new(Mutex::new(Markers::default()));
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    tokio::spawn(follow(stdout, kind, file.clone(), markers.clone()));
    tokio::spawn(follow(stderr, kind, file, markers.clone()));
    Ok(Running {
        kind,
        pid,
        started,
        log,
        child,
        markers,
    })
}

async fn follow(
    pipe: impl AsyncRead + Unpin,
    kind: Kind,
    file: Arc<Mutex<File>>,
    markers: Arc<Mutex<Markers>>,
) {
    let mut lines = BufReader::new(pipe).lines();
    let wanted = kind.synced_lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let now = Instant::now();
        {
            let mut m = markers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            m.first_line.get_or_insert(now);
            if m.synced.is_none() && line.contains(wanted[m.matched]) {
                m.matched += 1;
                if m.matched == wanted.len() {
                    m.synced = Some(now);
                }
            }
        }
        let mut f = file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let _ = writeln!(f, "{line}");
    }
}

impl Running {
    /// An error, with the log's tail, if the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); log {}:\n{}",
                self.kind.name(),
                self.log.display(),
                tail(&self.log, 30)
            );
        }
        Ok(())
    }

    /// Since start: the first output line and the "synced" line.
    pub fn first_line(&self) -> Option<Duration> {
        let m = self
            .markers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.first_line.map(|t| t.duration_since(self.started))
    }

    pub fn synced(&self) -> Option<Duration> {
        let m = self
            .markers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.synced.map(|t| t.duration_since(self.started))
    }

    /// Waits for the "synced" line; fails if the process exits or `timeout` passes.
    pub async fn wait_synced(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(d) = self.synced() {
                return Ok(d);
            }
            self.check_alive()?;
            if Instant::now() >= deadline {
                bail!(
                    "{} did not say it synced within {timeout:?}; log {}:\n{}",
                    self.kind.name(),
                    self.log.display(),
                    tail(&self.log, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub fn sample(&self) -> anyhow::Result<procstat::Sample> {
        procstat::sample(self.pid)
    }

    /// SIGTERM, then SIGKILL after 10 s. An exit before this is an error (the run is invalid).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.check_alive()?;
        terminate(&mut self.child, self.pid).await;
        Ok(())
    }
}

/// The command `argv`, run so that the kernel kills it if this process dies (setpriv execs,
/// so the pid stays), where setpriv is installed.
pub fn dies_with_us(argv: &[String]) -> Command {
    if Path::new("/usr/bin/setpriv").is_file() {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--pdeathsig", "KILL", "--"]).args(argv);
        c
    } else {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    }
}

/// SIGTERM to the process `pid` (`child`), then SIGKILL if it has not exited after 10 s.
pub async fn terminate(child: &mut Child, pid: u32) {
    if let Some(pid) = Pid::from_raw(pid as i32) {
        let _ = kill_process(pid, Signal::TERM);
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// The last `n` lines of a file.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
