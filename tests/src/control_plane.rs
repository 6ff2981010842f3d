//! `ControlPlane`: etcd + kube-apiserver on loopback with fresh certificates, free ports and a
//! private folder, ready (RBAC bootstrapped) when `start` returns; stopped and cleaned up on drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::assets::{Binaries, default_assets_dir};
use crate::certs::{Pki, PkiFiles};
use crate::error::{HarnessError, Step};
use crate::ports::free_port;
use crate::process::{Process, TAIL_LINES, log_tail};
use crate::{crds, kubeconfig, webhook};

/// How often the whole start is tried when a picked port was taken by someone else meanwhile.
const START_ATTEMPTS: usize = 3;
/// How often `restart_apiserver` tries again while the old process's port is still taken.
const RESTART_ATTEMPTS: usize = 5;
const RESTART_RETRY_DELAY: Duration = Duration::from_secs(1);
/// How long kube-apiserver gets to exit after SIGTERM before it is killed.
const APISERVER_GRACE: Duration = Duration::from_secs(10);
/// The admin identity: in `system:masters`, so RBAC lets it do anything.
const ADMIN_USER: &str = "nodeipam-testenv-admin";
const ADMIN_GROUP: &str = "system:masters";

/// etcd's data folder inside the control plane's folder.
const ETCD_DATA: &str = "etcd-data";

/// The garbage collector's process name and log file (see `start_garbage_collector`), and how
/// long its resource monitors get to sync.
const GC_NAME: &str = "kube-controller-manager (garbage collector)";
const GC_LOG: &str = "kube-controller-manager.log";
const GC_SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// The folder of the `config/crd/bases` manifests, relative to the workspace root.
const CRD_BASES: &str = "config/crd/bases";

/// The root of the nodeipam workspace (`$NODEIPAM_ROOT` if set, else where this crate was built).
pub fn workspace_root() -> PathBuf {
    if let Some(root) = std::env::var_os("NODEIPAM_ROOT").filter(|v| !v.is_empty()) {
        return PathBuf::from(root);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// `config/crd/bases` of the workspace.
pub fn crd_dir() -> PathBuf {
    workspace_root().join(CRD_BASES)
}

/// How long each part of the start took.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartupTimings {
    /// etcd spawned until `/health` answered.
    pub etcd: Duration,
    /// kube-apiserver spawned until `/readyz` answered 200.
    pub apiserver: Duration,
    /// Everything in `start`, including certificates, retries and CRD installation.
    pub total: Duration,
    /// How many times the start was tried (more than 1 after a port clash).
    pub attempts: usize,
}

/// Options for [`ControlPlane`]; make one with [`ControlPlane::builder`].
#[derive(Debug, Clone)]
pub struct ControlPlaneBuilder {
    service_cluster_ip_range: String,
    install_crds: bool,
    crd_dir: Option<PathBuf>,
    apiserver_args: Vec<String>,
    assets_dir: Option<PathBuf>,
    dir: Option<PathBuf>,
    start_timeout: Duration,
}

impl Default for ControlPlaneBuilder {
    fn default() -> Self {
        ControlPlaneBuilder {
            service_cluster_ip_range: "10.96.0.0/16".to_string(),
            install_crds: true,
            crd_dir: None,
            apiserver_args: Vec::new(),
            assets_dir: None,
            dir: None,
            start_timeout: Duration::from_secs(60),
        }
    }
}

impl ControlPlaneBuilder {
    /// `--service-cluster-ip-range` (default `10.96.0.0/16`).
    pub fn service_cluster_ip_range(mut self, cidr: impl Into<String>) -> Self {
        self.service_cluster_ip_range = cidr.into();
        self
    }

    /// Whether `start` installs CRDs (default true): from [`crd_dir`](Self::crd_dir) if set, else
    /// from `config/crd/bases` when that folder exists.
    pub fn install_crds(mut self, install: bool) -> Self {
        self.install_crds = install;
        self
    }

    /// Installs CRDs from this folder instead of `config/crd/bases`; it must exist.
    pub fn crd_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.crd_dir = Some(dir.into());
        self
    }

    /// One more kube-apiserver flag, e.g. `--feature-gates=...`; it comes after the defaults,
    /// so it overrides a default flag of the same name.
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Where the binaries are (default: `$NODEIPAM_ASSETS` or the `hack/control-plane.sh build` folder).
    pub fn assets_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.assets_dir = Some(dir.into());
        self
    }

    /// Keep all files (certs, logs, etcd data, kubeconfig) in this folder and never remove it,
    /// instead of a temporary folder. A previous run's etcd data in it is wiped.
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// How long etcd and kube-apiserver each get to become healthy (default 60 s).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Starts etcd and kube-apiserver and waits until the API server is ready.
    pub async fn start(self) -> Result<ControlPlane, HarnessError> {
        let began = Instant::now();
        let assets = self.assets_dir.clone().unwrap_or_else(default_assets_dir);
        let binaries = Binaries::locate(&assets)?;
        let mut work = WorkDir::create(self.dir.as_deref())?;
        let result = self.start_in(&work, binaries, began).await;
        match result {
            Ok(mut plane) => {
                plane.work = Some(work);
                Ok(plane)
            }
            Err(err) => {
                // The error names log files in the folder: keep them for whoever reads it.
                work.keep();
                Err(err)
            }
        }
    }

    async fn start_in(
        &self,
        work: &WorkDir,
        binaries: Binaries,
        began: Instant,
    ) -> Result<ControlPlane, HarnessError> {
        let root = work.path().to_path_buf();
        let certs_dir = root.join("certs");
        let log_dir = root.join("logs");
        for dir in [&certs_dir, &log_dir, &root.join("apiserver")] {
            std::fs::create_dir_all(dir).map_err(|e| {
                HarnessError::io(Step::PrepareDir, format!("create {}", dir.display()), e)
            })?;
        }
        // A reused --dir starts with fresh logs; retries below append to them.
        for log in ["etcd.log", "kube-apiserver.log"] {
            let _ = std::fs::remove_file(log_dir.join(log));
        }
        let pki = Pki::generate()?;
        let files = pki.write(&certs_dir)?;
        let admin_identity = pki.client_cert(ADMIN_USER, &[ADMIN_GROUP])?;

        let mut attempt = 0;
        let running = loop {
            attempt += 1;
            match self
                .try_start(&root, &log_dir, &binaries, &files, &pki, &admin_identity)
                .await
            {
                Ok(running) => break running,
                Err(StartFailure::PortTaken(err)) if attempt < START_ATTEMPTS => {
                    let _ = err; // retried with new ports; the log keeps the clash
                }
                Err(StartFailure::PortTaken(err) | StartFailure::Fatal(err)) => return Err(err),
            }
        };

        let kubeconfig_path = root.join("admin.kubeconfig");
        std::fs::write(&kubeconfig_path, &running.admin_yaml).map_err(|e| {
            HarnessError::io(
                Step::WriteKubeconfig,
                format!("write {}", kubeconfig_path.display()),
                e,
            )
        })?;

        let mut plane = ControlPlane {
            work: None,
            binaries,
            pki,
            server_url: running.server_url,
            etcd_url: running.etcd_url,
            kubeconfig_path,
            log_dir,
            admin_config: running.admin_config,
            admin: running.admin,
            etcd: Some(running.etcd),
            etcd_command: running.etcd_command,
            apiserver: Some(running.apiserver),
            garbage_collector: None,
            apiserver_command: running.apiserver_command,
            timings: StartupTimings {
                etcd: running.etcd_time,
                apiserver: running.apiserver_time,
                total: Duration::ZERO,
                attempts: attempt,
            },
        };

        if self.install_crds {
            let dir = match &self.crd_dir {
                Some(dir) => Some(dir.clone()),
                // The project's CRDs are optional: nothing to install before they exist.
                None => Some(crd_dir()).filter(|d| d.is_dir()),
            };
            if let Some(dir) = dir {
                plane.install_crds(&dir).await?;
            }
        }
        plane.timings.total = began.elapsed();
        Ok(plane)
    }

    async fn try_start(
        &self,
        root: &Path,
        log_dir: &Path,
        binaries: &Binaries,
        files: &PkiFiles,
        pki: &Pki,
        admin_identity: &crate::certs::CertAndKey,
    ) -> Result<Running, StartFailure> {
        let port = |step| free_port().map_err(|e| HarnessError::io(step, "pick a free port", e));
        let etcd_port = port(Step::StartEtcd)?;
        let peer_port = port(Step::StartEtcd)?;
        let api_port = port(Step::StartApiserver)?;

        // A fresh data dir each try: a half-started member would remember the old peer URL.
        let data_dir = root.join(ETCD_DATA);
        if data_dir.exists() {
            std::fs::remove_dir_all(&data_dir).map_err(|e| {
                HarnessError::io(
                    Step::PrepareDir,
                    format!("remove {}", data_dir.display()),
                    e,
                )
            })?;
        }
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "--name=default".to_string(),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            "--initial-cluster-state=new".to_string(),
            "--unsafe-no-fsync=true".to_string(),
        ];
        let etcd_command = EtcdCommand {
            binary: binaries.etcd.clone(),
            args: etcd_args,
            port: etcd_port,
            log: log_dir.join("etcd.log"),
            cwd: root.to_path_buf(),
            data_dir,
            timeout: self.start_timeout,
        };
        let etcd_began = Instant::now();
        let etcd = etcd_command.start(Step::StartEtcd).await?;
        let etcd_time = etcd_began.elapsed();

        let server_url = format!("https://127.0.0.1:{api_port}");
        let args = apiserver_args(&ApiserverFlags {
            api_port,
            etcd_url: &etcd_url,
            server_url: &server_url,
            root,
            files,
            service_cluster_ip_range: &self.service_cluster_ip_range,
            extra: &self.apiserver_args,
        });
        let api_log = log_dir.join("kube-apiserver.log");

        let admin_yaml =
            kubeconfig::render(&server_url, &pki.serving_ca_pem, ADMIN_USER, admin_identity);
        let admin_config = kubeconfig::config(&admin_yaml)?;
        let apiserver = ApiserverCommand {
            binary: binaries.kube_apiserver.clone(),
            args,
            port: api_port,
            log: api_log,
            cwd: root.to_path_buf(),
            timeout: self.start_timeout,
        };
        let api_began = Instant::now();
        let process = apiserver.start(&admin_config, Step::StartApiserver).await?;
        let apiserver_time = api_began.elapsed();
        let admin = kubeconfig::client(admin_config.clone())?;

        Ok(Running {
            etcd,
            etcd_command,
            apiserver: process,
            apiserver_command: apiserver,
            etcd_url,
            server_url,
            admin_yaml,
            admin_config,
            admin,
            etcd_time,
            apiserver_time,
        })
    }
}

/// The processes and identity of one successful start attempt.
struct Running {
    etcd: Process,
    etcd_command: EtcdCommand,
    apiserver: Process,
    apiserver_command: ApiserverCommand,
    etcd_url: String,
    server_url: String,
    admin_yaml: String,
    admin_config: kube::Config,
    admin: kube::Client,
    etcd_time: Duration,
    apiserver_time: Duration,
}

/// What kube-apiserver's flags are made of.
struct ApiserverFlags<'a> {
    api_port: u16,
    etcd_url: &'a str,
    server_url: &'a str,
    root: &'a Path,
    files: &'a PkiFiles,
    service_cluster_ip_range: &'a str,
    extra: &'a [String],
}

/// kube-apiserver's flags: the defaults, then the builder's extra flags (which override them).
fn apiserver_args(f: &ApiserverFlags<'_>) -> Vec<String> {
    let mut args = vec![
        "--advertise-address=127.0.0.1".to_string(),
        "--bind-address=127.0.0.1".to_string(),
        format!("--secure-port={}", f.api_port),
        format!("--etcd-servers={}", f.etcd_url),
        format!("--cert-dir={}", f.root.join("apiserver").display()),
        format!("--tls-cert-file={}", f.files.serving_cert.display()),
        format!("--tls-private-key-file={}", f.files.serving_key.display()),
        format!("--client-ca-file={}", f.files.client_ca.display()),
        format!("--service-account-issuer={}", f.server_url),
        format!("--service-account-key-file={}", f.files.sa_public.display()),
        format!(
            "--service-account-signing-key-file={}",
            f.files.sa_private.display()
        ),
        format!("--service-cluster-ip-range={}", f.service_cluster_ip_range),
        // v1.37 refuses a loopback advertise address for the endpoints of the `kubernetes`
        // Service; nothing here needs those endpoints.
        "--endpoint-reconciler-type=none".to_string(),
        "--authorization-mode=RBAC".to_string(),
        "--allow-privileged=true".to_string(),
        // No controller-manager creates the default ServiceAccount; without this every
        // pod create would be refused.
        "--disable-admission-plugins=ServiceAccount".to_string(),
    ];
    args.extend(f.extra.iter().cloned());
    args
}

/// How etcd is started, kept so that it can start again on the same ports, data folder and
/// log (after its data folder was copied or replaced).
#[derive(Debug, Clone)]
struct EtcdCommand {
    binary: PathBuf,
    args: Vec<String>,
    port: u16,
    log: PathBuf,
    cwd: PathBuf,
    data_dir: PathBuf,
    timeout: Duration,
}

impl EtcdCommand {
    /// Spawns etcd (`step` names a failure to spawn) and waits until `/health` answers.
    async fn start(&self, step: Step) -> Result<Process, StartFailure> {
        let mut etcd =
            Process::spawn("etcd", &self.binary, &self.args, &self.log, &self.cwd, step)?;
        wait_etcd(&mut etcd, self.port, self.timeout).await?;
        Ok(etcd)
    }
}

/// Copies the folder `from` (files and folders only, as etcd's data folder has) to `to`.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// How kube-apiserver is started, kept so that a restart uses the same binary, flags (port,
/// certificates, etcd) and log file.
#[derive(Debug, Clone)]
struct ApiserverCommand {
    binary: PathBuf,
    args: Vec<String>,
    port: u16,
    log: PathBuf,
    cwd: PathBuf,
    timeout: Duration,
}

impl ApiserverCommand {
    /// Spawns kube-apiserver (`step` names a failure to spawn) and waits until `/readyz`
    /// answers `ok` to the admin identity.
    async fn start(&self, admin: &kube::Config, step: Step) -> Result<Process, StartFailure> {
        let mut probe_config = admin.clone();
        // /readyz answers 500 until ready; kube's retry policy must not hide that.
        probe_config.default_retry = false;
        probe_config.connect_timeout = Some(Duration::from_secs(2));
        let probe = kubeconfig::client(probe_config)?;
        let mut process = Process::spawn(
            "kube-apiserver",
            &self.binary,
            &self.args,
            &self.log,
            &self.cwd,
            step,
        )?;
        wait_readyz(&mut process, &probe, self.timeout).await?;
        Ok(process)
    }
}

enum StartFailure {
    /// The server could not bind its port: another process took it after we picked it.
    PortTaken(HarnessError),
    Fatal(HarnessError),
}

impl From<HarnessError> for StartFailure {
    fn from(err: HarnessError) -> Self {
        StartFailure::Fatal(err)
    }
}

/// The early-exit error of `process`, classified as a port clash if its log says so.
fn exited_early(process: &Process, step: Step, status: std::process::ExitStatus) -> StartFailure {
    let err = process.error(step, format!("exited early ({status})"));
    if log_tail(process.log(), TAIL_LINES).contains("address already in use") {
        StartFailure::PortTaken(err)
    } else {
        StartFailure::Fatal(err)
    }
}

/// The error after the last restart attempt failed because the port was still in use.
fn port_still_taken(err: HarnessError, port: u16, attempts: usize) -> HarnessError {
    match err {
        HarnessError::Process {
            binary,
            log,
            reason,
            tail,
            ..
        } => HarnessError::Process {
            step: Step::RestartApiserver,
            binary,
            log,
            reason: format!("could not bind port {port} again after {attempts} tries: {reason}"),
            tail,
        },
        other => other,
    }
}

/// Appends a line to a log file, so a reader can tell one start from the next; best effort.
fn mark_log(log: &Path, line: &str) {
    use std::io::Write as _;
    if let Ok(mut file) = std::fs::File::options().create(true).append(true).open(log) {
        let _ = writeln!(file, "--- {line} ---");
    }
}

async fn wait_etcd(etcd: &mut Process, port: u16, timeout: Duration) -> Result<(), StartFailure> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = etcd.exited() {
            return Err(exited_early(etcd, Step::WaitEtcdHealthy, status));
        }
        if etcd_healthy(port).await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(StartFailure::Fatal(etcd.error(
                Step::WaitEtcdHealthy,
                format!("not healthy within {}s", timeout.as_secs()),
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One plain HTTP/1.0 `GET /health` against etcd's client URL.
async fn etcd_healthy(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&response).into_owned())
    };
    match tokio::time::timeout(Duration::from_secs(2), attempt).await {
        Ok(Ok(text)) => text.starts_with("HTTP/1.") && text.contains(r#""health":"true""#),
        _ => false,
    }
}

async fn wait_readyz(
    apiserver: &mut Process,
    probe: &kube::Client,
    timeout: Duration,
) -> Result<(), StartFailure> {
    let deadline = Instant::now() + timeout;
    let mut last = String::from("no answer yet");
    loop {
        if let Some(status) = apiserver.exited() {
            return Err(exited_early(apiserver, Step::WaitReadyz, status));
        }
        let request = http::Request::get("/readyz").body(Vec::new());
        if let Ok(request) = request {
            match tokio::time::timeout(Duration::from_secs(5), probe.request_text(request)).await {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => last = body,
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "timed out".to_string(),
            }
        }
        if Instant::now() >= deadline {
            return Err(StartFailure::Fatal(apiserver.error(
                Step::WaitReadyz,
                format!(
                    "not ready within {}s (last /readyz answer: {last})",
                    timeout.as_secs()
                ),
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The folder a control plane keeps its files in.
enum WorkDir {
    Temp(Option<tempfile::TempDir>, PathBuf),
    Fixed(PathBuf),
}

impl WorkDir {
    fn create(fixed: Option<&Path>) -> Result<WorkDir, HarnessError> {
        match fixed {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    HarnessError::io(Step::PrepareDir, format!("create {}", dir.display()), e)
                })?;
                let dir = std::fs::canonicalize(dir).map_err(|e| {
                    HarnessError::io(Step::PrepareDir, format!("resolve {}", dir.display()), e)
                })?;
                Ok(WorkDir::Fixed(dir))
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("nodeipam-testenv-")
                    .tempdir()
                    .map_err(|e| HarnessError::io(Step::PrepareDir, "create a temp dir", e))?;
                let path = temp.path().to_path_buf();
                Ok(WorkDir::Temp(Some(temp), path))
            }
        }
    }

    fn path(&self) -> &Path {
        match self {
            WorkDir::Temp(_, path) | WorkDir::Fixed(path) => path,
        }
    }

    /// Do not remove the folder when this is dropped. The etcd data (over 100 MB, mostly
    /// preallocated WAL) goes: a kept folder is for reading logs, and failing tests add up.
    /// Call only once the processes are gone.
    fn keep(&mut self) {
        if let WorkDir::Temp(temp, path) = self
            && let Some(temp) = temp.take()
        {
            let _ = temp.keep();
            let _ = std::fs::remove_dir_all(path.join(ETCD_DATA));
        }
    }
}

/// A running etcd + kube-apiserver. Drop kills both and removes the temp folder (kept, with the
/// log tails printed, if the thread is panicking, i.e. a test failed).
pub struct ControlPlane {
    work: Option<WorkDir>,
    binaries: Binaries,
    pki: Pki,
    server_url: String,
    etcd_url: String,
    kubeconfig_path: PathBuf,
    log_dir: PathBuf,
    admin_config: kube::Config,
    admin: kube::Client,
    etcd: Option<Process>,
    apiserver: Option<Process>,
    /// kube-controller-manager running only its garbage collector, once started.
    garbage_collector: Option<Process>,
    /// How kube-apiserver was started, so that `restart_apiserver` starts it the same way.
    apiserver_command: ApiserverCommand,
    /// How etcd was started, so that `backup_etcd` and `restore_etcd` start it the same way.
    etcd_command: EtcdCommand,
    timings: StartupTimings,
}

impl ControlPlane {
    pub fn builder() -> ControlPlaneBuilder {
        ControlPlaneBuilder::default()
    }

    /// Starts with the default options: `ControlPlane::builder().start()`.
    pub async fn start() -> Result<ControlPlane, HarnessError> {
        Self::builder().start().await
    }

    /// A client with the admin identity (`system:masters`).
    pub fn client(&self) -> kube::Client {
        self.admin.clone()
    }

    /// A client authenticated by a fresh client certificate for `user` in `groups`, so RBAC
    /// applies to it exactly as to a real user.
    pub async fn client_for(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<kube::Client, HarnessError> {
        let yaml = self.kubeconfig_for(user, groups)?;
        kubeconfig::client(kubeconfig::config(&yaml)?)
    }

    /// The admin client impersonating `user` in `groups` (`Impersonate-User`/`-Group` headers).
    pub fn impersonating(&self, user: &str, groups: &[&str]) -> Result<kube::Client, HarnessError> {
        let mut config = self.admin_config.clone();
        config.auth_info.impersonate = Some(user.to_string());
        config.auth_info.impersonate_groups = if groups.is_empty() {
            None
        } else {
            Some(groups.iter().map(|g| g.to_string()).collect())
        };
        kubeconfig::client(config)
    }

    /// Kubeconfig YAML for `user` in `groups`, with a fresh client certificate embedded.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<String, HarnessError> {
        let identity = self.pki.client_cert(user, groups)?;
        Ok(kubeconfig::render(
            &self.server_url,
            &self.pki.serving_ca_pem,
            user,
            &identity,
        ))
    }

    /// Writes a kubeconfig for `user` in `groups` to `path`, so a child process (kubectl, the
    /// controller binary) can run as that identity.
    pub fn write_kubeconfig_for(
        &self,
        user: &str,
        groups: &[&str],
        path: &Path,
    ) -> Result<(), HarnessError> {
        let yaml = self.kubeconfig_for(user, groups)?;
        std::fs::write(path, yaml).map_err(|e| {
            HarnessError::io(
                Step::WriteKubeconfig,
                format!("write {}", path.display()),
                e,
            )
        })
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// `http://127.0.0.1:<port>` of etcd.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The serving CA (PEM) that signed the API server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.pki.serving_ca_pem
    }

    /// The folder of the binaries.
    pub fn assets_dir(&self) -> &Path {
        &self.binaries.dir
    }

    /// The folder with all of this control plane's files.
    pub fn dir(&self) -> &Path {
        self.work.as_ref().map_or(Path::new(""), WorkDir::path)
    }

    /// The folder with `etcd.log` and `kube-apiserver.log`.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// How long the start took.
    pub fn startup_timings(&self) -> StartupTimings {
        self.timings
    }

    /// `kubectl --kubeconfig=<admin kubeconfig>`; add arguments and run it.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(&self.binaries.kubectl);
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig_path.display()));
        cmd
    }

    /// Applies every CRD in the YAML files under `dir` and waits until discovery serves them.
    /// Returns the names of the CRDs.
    pub async fn install_crds(&self, dir: &Path) -> Result<Vec<String>, HarnessError> {
        crds::install(&self.admin, dir, Duration::from_secs(30)).await
    }

    /// Registers (or updates) a ValidatingWebhookConfiguration `name` with one webhook, also
    /// called `name` (it needs at least three dot-separated segments), that calls `url`, trusting
    /// `ca_bundle_pem`. `failure_policy` is `"Fail"` or `"Ignore"`.
    pub async fn register_validating_webhook(
        &self,
        name: &str,
        url: &str,
        ca_bundle_pem: &[u8],
        rules: Vec<RuleWithOperations>,
        failure_policy: &str,
    ) -> Result<(), HarnessError> {
        let config = webhook::configuration(name, url, ca_bundle_pem, rules, failure_policy)?;
        webhook::register(&self.admin, config).await
    }

    /// An error if etcd or kube-apiserver has exited on its own.
    pub fn check_running(&mut self) -> Result<(), HarnessError> {
        for (process, step) in [
            (&mut self.etcd, Step::StartEtcd),
            (&mut self.apiserver, Step::StartApiserver),
            (&mut self.garbage_collector, Step::StartGarbageCollector),
        ] {
            if let Some(p) = process.as_mut()
                && let Some(status) = p.exited()
            {
                return Err(p.error(step, format!("exited ({status})")));
            }
        }
        Ok(())
    }

    /// Stops kube-apiserver alone (SIGTERM, then SIGKILL after a grace period) and leaves etcd
    /// running, so that [`restart_apiserver`](Self::restart_apiserver) serves the same data.
    /// Meanwhile every client gets connection errors. Does nothing if it is already stopped.
    pub async fn stop_apiserver(&mut self) {
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop(APISERVER_GRACE).await;
        }
    }

    /// Starts kube-apiserver again with the same flags, port, certificates and etcd (stopping
    /// it first if it runs), and waits until `/readyz` answers, like the first start. Clients
    /// made before ([`client`](Self::client), kubeconfigs) keep working: the URL and the CA
    /// are the same. The output is appended to the same `kube-apiserver.log`.
    pub async fn restart_apiserver(&mut self) -> Result<(), HarnessError> {
        self.stop_apiserver().await;
        match self.etcd.as_mut() {
            Some(etcd) => {
                if let Some(status) = etcd.exited() {
                    return Err(etcd.error(
                        Step::RestartApiserver,
                        format!("exited ({status}), so kube-apiserver would have no data"),
                    ));
                }
            }
            None => {
                return Err(HarnessError::other(
                    Step::RestartApiserver,
                    "etcd is not running",
                ));
            }
        }
        let command = &self.apiserver_command;
        let mut attempt = 0;
        loop {
            attempt += 1;
            mark_log(
                &command.log,
                &format!("nodeipam-testenv: restarting kube-apiserver (attempt {attempt})"),
            );
            match command
                .start(&self.admin_config, Step::RestartApiserver)
                .await
            {
                Ok(process) => {
                    self.apiserver = Some(process);
                    return Ok(());
                }
                // The old process's listening socket can outlive it for a moment; the port is
                // ours (it is in the flags, the kubeconfigs and the certificates), so wait.
                Err(StartFailure::PortTaken(_)) if attempt < RESTART_ATTEMPTS => {
                    tokio::time::sleep(RESTART_RETRY_DELAY).await;
                }
                Err(StartFailure::PortTaken(err)) => {
                    return Err(port_still_taken(err, command.port, attempt));
                }
                Err(StartFailure::Fatal(err)) => return Err(err),
            }
        }
    }

    /// Takes a backup of etcd: stops kube-apiserver and etcd, copies etcd's data folder to
    /// `to` (which must not exist), and starts both again on the same ports. A cold copy of
    /// the data folder holds exactly what a snapshot taken at that moment holds.
    pub async fn backup_etcd(&mut self, to: &Path) -> Result<(), HarnessError> {
        let step = Step::BackupEtcd;
        self.stop_etcd(step).await?;
        copy_dir(&self.etcd_command.data_dir, to).map_err(|e| {
            HarnessError::io(
                step,
                format!(
                    "copy {} to {}",
                    self.etcd_command.data_dir.display(),
                    to.display()
                ),
                e,
            )
        })?;
        self.start_etcd_and_apiserver(step).await
    }

    /// Restores etcd from a backup taken by [`backup_etcd`](Self::backup_etcd): stops
    /// kube-apiserver and etcd, replaces etcd's data folder with the copy in `from`, and
    /// starts both again on the same ports. The revisions go back to the backup's, as with
    /// `etcdutl snapshot restore` without `--bump-revision`: whatever was written after the
    /// backup is gone, and resourceVersions clients saw since are in the future.
    pub async fn restore_etcd(&mut self, from: &Path) -> Result<(), HarnessError> {
        let step = Step::RestoreEtcd;
        self.stop_etcd(step).await?;
        let data = self.etcd_command.data_dir.clone();
        std::fs::remove_dir_all(&data)
            .map_err(|e| HarnessError::io(step, format!("remove {}", data.display()), e))?;
        copy_dir(from, &data).map_err(|e| {
            HarnessError::io(
                step,
                format!("copy {} to {}", from.display(), data.display()),
                e,
            )
        })?;
        self.start_etcd_and_apiserver(step).await
    }

    /// Restores etcd from a backup taken by [`backup_etcd`](Self::backup_etcd) the way an
    /// operator restores a snapshot: `etcdutl snapshot restore` of the backup's database
    /// into a fresh data folder, with `extra` arguments (e.g. `--bump-revision 1000000
    /// --mark-compacted`), then starts etcd and kube-apiserver on the same ports. `etcdutl`
    /// is the binary to run.
    pub async fn restore_etcd_with(
        &mut self,
        from: &Path,
        etcdutl: &Path,
        extra: &[&str],
    ) -> Result<(), HarnessError> {
        let step = Step::RestoreEtcd;
        self.stop_etcd(step).await?;
        let data = self.etcd_command.data_dir.clone();
        std::fs::remove_dir_all(&data)
            .map_err(|e| HarnessError::io(step, format!("remove {}", data.display()), e))?;
        let peer = self
            .etcd_command
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--initial-advertise-peer-urls="))
            .unwrap_or_default()
            .to_string();
        let out = Command::new(etcdutl)
            .arg("snapshot")
            .arg("restore")
            .arg(from.join("member/snap/db"))
            .arg("--skip-hash-check")
            .arg(format!("--data-dir={}", data.display()))
            .arg("--name=default")
            .arg(format!("--initial-cluster=default={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .args(extra)
            .output()
            .map_err(|e| HarnessError::io(step, format!("run {}", etcdutl.display()), e))?;
        if !out.status.success() {
            return Err(HarnessError::other(
                step,
                format!(
                    "etcdutl snapshot restore failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ),
            ));
        }
        self.start_etcd_and_apiserver(step).await
    }

    /// Stops kube-apiserver, then etcd (SIGTERM, so that its data folder is consistent).
    async fn stop_etcd(&mut self, step: Step) -> Result<(), HarnessError> {
        self.stop_apiserver().await;
        match self.etcd.take() {
            Some(mut etcd) => {
                etcd.stop(Duration::from_secs(10)).await;
                Ok(())
            }
            None => Err(HarnessError::other(step, "etcd is not running")),
        }
    }

    /// Starts etcd as before, then kube-apiserver ([`restart_apiserver`](Self::restart_apiserver)).
    async fn start_etcd_and_apiserver(&mut self, step: Step) -> Result<(), HarnessError> {
        let command = self.etcd_command.clone();
        mark_log(
            &command.log,
            &format!("nodeipam-testenv: {}", step.as_str()),
        );
        let mut attempt = 0;
        let etcd = loop {
            attempt += 1;
            match command.start(step).await {
                Ok(etcd) => break etcd,
                // As for kube-apiserver: the old process's sockets can outlive it a moment.
                Err(StartFailure::PortTaken(_)) if attempt < RESTART_ATTEMPTS => {
                    tokio::time::sleep(RESTART_RETRY_DELAY).await;
                }
                Err(StartFailure::PortTaken(err) | StartFailure::Fatal(err)) => return Err(err),
            }
        };
        self.etcd = Some(etcd);
        self.restart_apiserver().await
    }

    /// Starts kube-controller-manager with only its garbage collector (as a cluster has it:
    /// deleting an owner deletes what it owns), as the admin, and waits until the collector
    /// says its resource monitors synced. Stopped with the control plane.
    pub async fn start_garbage_collector(&mut self) -> Result<(), HarnessError> {
        let step = Step::StartGarbageCollector;
        let binary = self.binaries.dir.join("kube-controller-manager");
        if !binary.is_file() {
            return Err(HarnessError::MissingBinary {
                step,
                binary: "kube-controller-manager".into(),
                dir: self.binaries.dir.clone(),
            });
        }
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig_path.display()),
            "--controllers=garbagecollector".into(),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
        ];
        let log = self.log_dir.join(GC_LOG);
        let mut process = Process::spawn(GC_NAME, &binary, &args, &log, &self.log_dir, step)?;
        let deadline = Instant::now() + GC_SYNC_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text
                .to_ascii_lowercase()
                .contains("proceeding to collect garbage")
            {
                self.garbage_collector = Some(process);
                return Ok(());
            }
            if let Some(status) = process.exited() {
                return Err(process.error(step, format!("exited ({status})")));
            }
            if Instant::now() > deadline {
                let err = process.error(
                    step,
                    format!("its resource monitors did not sync within {GC_SYNC_TIMEOUT:?}"),
                );
                process.stop(Duration::from_secs(2)).await;
                return Err(err);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops kube-apiserver, then etcd, each with SIGTERM and a grace period, then removes the
    /// temp folder.
    pub async fn stop(mut self) {
        if let Some(mut gc) = self.garbage_collector.take() {
            gc.stop(Duration::from_secs(5)).await;
        }
        self.stop_apiserver().await;
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop(Duration::from_secs(5)).await;
        }
        // Drop removes the folder.
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let processes: Vec<Process> = [
            self.garbage_collector.take(),
            self.apiserver.take(),
            self.etcd.take(),
        ]
        .into_iter()
        .flatten()
        .collect();
        for mut process in processes {
            process.kill();
        }
        if std::thread::panicking() {
            if let Some(work) = self.work.as_mut() {
                work.keep();
            }
            eprintln!(
                "nodeipam-testenv: control plane at {} stopped; its files (no etcd data) kept in {}",
                self.server_url,
                self.dir().display()
            );
            for (name, log) in [
                ("etcd", self.log_dir.join("etcd.log")),
                ("kube-apiserver", self.log_dir.join("kube-apiserver.log")),
                (GC_NAME, self.log_dir.join(GC_LOG)),
            ] {
                if !log.exists() {
                    continue;
                }
                eprintln!(
                    "--- {name} log {} (last {TAIL_LINES} lines) ---\n{}",
                    log.display(),
                    log_tail(&log, TAIL_LINES)
                );
            }
        }
        // Dropping the WorkDir removes a temp folder (unless kept above).
        self.work = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_flags_come_after_the_defaults() {
        let files = PkiFiles {
            serving_ca: PathBuf::from("/c/serving-ca.crt"),
            serving_cert: PathBuf::from("/c/serving.crt"),
            serving_key: PathBuf::from("/c/serving.key"),
            client_ca: PathBuf::from("/c/client-ca.crt"),
            sa_public: PathBuf::from("/c/sa.pub"),
            sa_private: PathBuf::from("/c/sa.key"),
        };
        let extra = vec!["--secure-port=1".to_string()];
        let args = apiserver_args(&ApiserverFlags {
            api_port: 6443,
            etcd_url: "http://127.0.0.1:2379",
            server_url: "https://127.0.0.1:6443",
            root: Path::new("/r"),
            files: &files,
            service_cluster_ip_range: "10.96.0.0/16",
            extra: &extra,
        });
        assert!(args.contains(&"--secure-port=6443".to_string()));
        assert!(args.contains(&"--etcd-servers=http://127.0.0.1:2379".to_string()));
        assert_eq!(args.last().map(String::as_str), Some("--secure-port=1"));
    }

    #[test]
    fn a_port_still_taken_after_restarts_names_the_step_port_and_log() {
        let err = HarnessError::Process {
            step: Step::WaitReadyz,
            binary: "kube-apiserver".into(),
            log: PathBuf::from("/tmp/x/logs/kube-apiserver.log"),
            reason: "exited early (exit status: 1)".into(),
            tail: "bind: address already in use".into(),
        };
        let err = port_still_taken(err, 34567, 5);
        assert_eq!(err.step(), Step::RestartApiserver);
        let text = err.to_string();
        assert!(text.contains("restart kube-apiserver"), "{text}");
        assert!(
            text.contains("port 34567") && text.contains("5 tries"),
            "{text}"
        );
        assert!(text.contains("/tmp/x/logs/kube-apiserver.log"), "{text}");
        assert!(text.contains("address already in use"), "{text}");
    }
}
