//! The `nodeipam` binary as a child process: finding it, running it as the controller's
//! ServiceAccount of `config/rbac` ([`Replica`]), reading its probes, metrics and log, and
//! signalling it; plus the kubectl, port and plain-HTTP helpers those tests share.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nodeipam_testenv::{ControlPlane, workspace_root};
use rustix::process::{Pid, Signal, kill_process};
use tokio::process::{Child, Command};

use super::{WAIT, scrape, wait_for};

/// Names fixed by the manifests and the binary's defaults; RBAC names them.
pub const NAMESPACE: &str = "nodeipam-system";
pub const SA_USER: &str = "system:serviceaccount:nodeipam-system:nodeipam-controller";
pub const SA_GROUPS: &[&str] = &[
    "system:serviceaccounts",
    "system:serviceaccounts:nodeipam-system",
    "system:authenticated",
];

/// The `nodeipam` binary: `$NODEIPAM_BIN`, else next to this test binary's folder
/// (`<target>/debug/deps/<test>-*` → `<target>/debug/nodeipam`).
pub fn nodeipam_bin() -> PathBuf {
    workspace_bin("nodeipam", "NODEIPAM_BIN", "nodeipam-controller")
}

/// The `kubectl-nodeipam` plugin: `$KUBECTL_NODEIPAM_BIN`, else beside `nodeipam`.
pub fn plugin_bin() -> PathBuf {
    workspace_bin("kubectl-nodeipam", "KUBECTL_NODEIPAM_BIN", "nodeipam-cli")
}

/// A binary of the workspace: `$<env>`, else in the folder above this test binary's.
fn workspace_bin(name: &str, env: &str, package: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "step=locate-{name}: {env}={} is not a file",
            path.display()
        );
        return path;
    }
    let exe = std::env::current_exe().expect("step=locate-binary: path of the test binary");
    let candidate = exe
        .parent()
        .and_then(Path::parent)
        .map(|debug| debug.join(name));
    match candidate {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "step=locate-{name}: no {name} binary at {:?} (next to {}): run `cargo build -p \
             {package} --bin {name}` first (hack/test.sh does), or set {env}",
            candidate,
            exe.display()
        ),
    }
}

/// What a run of the plugin gave: exit code, stdout, stderr.
pub struct Run {
    pub code: Option<i32>,
    pub out: String,
    pub err: String,
}

/// Runs `kubectl-nodeipam <args>` with the admin kubeconfig and nothing else of this
/// process's environment.
pub async fn plugin(cp: &ControlPlane, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(plugin_bin())
        .env_clear()
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| panic!("step=run-plugin: kubectl-nodeipam {args:?}: {e}"));
    Run {
        code: out.status.code(),
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs the plugin until `done` accepts what it printed; returns that run.
pub async fn plugin_until(
    cp: &ControlPlane,
    args: &[&str],
    what: &str,
    done: impl Fn(&Run) -> bool,
) -> Run {
    let mut last = None;
    let found = tokio::time::timeout(WAIT, async {
        loop {
            let run = plugin(cp, args).await;
            if done(&run) {
                return run;
            }
            last = Some(format!("exit {:?}\n{}{}", run.code, run.out, run.err));
            // A process per try: no need to spin.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        panic!(
            "timed out waiting for {what}; last run:\n{}",
            last.unwrap_or_default()
        )
    })
}

/// `setpriv` from PATH, when installed.
pub fn setpriv() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("setpriv"))
        .find(|p| p.is_file())
}

/// `config/<rel>` of this checkout, as a kubectl argument.
pub fn config_path(rel: &str) -> String {
    workspace_root()
        .join("config")
        .join(rel)
        .display()
        .to_string()
}

/// Runs kubectl (admin) and returns (success, stdout, stderr). Async so that a webhook served
/// on this runtime could answer the API server meanwhile.
pub async fn kubectl(cp: &ControlPlane, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::from(cp.kubectl());
    cmd.args(args).stdin(Stdio::null());
    let out = cmd
        .output()
        .await
        .unwrap_or_else(|e| panic!("step=kubectl: cannot run kubectl {args:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// kubectl that must succeed; returns stdout.
pub async fn kubectl_ok(cp: &ControlPlane, args: &[&str]) -> String {
    let (ok, out, err) = kubectl(cp, args).await;
    assert!(ok, "kubectl {args:?} failed:\n{err}\n{out}");
    out
}

/// Applies the namespace and `config/rbac` for real.
pub async fn install_rbac(cp: &ControlPlane) {
    kubectl_ok(cp, &["apply", "-f", &config_path("manager/namespace.yaml")]).await;
    kubectl_ok(cp, &["apply", "-k", &config_path("rbac")]).await;
}

/// Writes `dir/<file>.kubeconfig` for exactly the controller's ServiceAccount identity.
pub fn sa_kubeconfig(cp: &ControlPlane, dir: &Path, file: &str) -> PathBuf {
    let path = dir.join(format!("{file}.kubeconfig"));
    cp.write_kubeconfig_for(SA_USER, SA_GROUPS, &path)
        .unwrap_or_else(|e| panic!("step=write-kubeconfig: {e}"));
    path
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("step=pick-port: bind 127.0.0.1:0")
}

/// One plain HTTP/1.0 GET on loopback: (status, body).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    scrape::http_get(&format!("127.0.0.1:{port}"), path).await
}

/// The value of the series `name` whose labels include `labels`, from Prometheus text.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (n, set) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let all = labels.iter().all(|(k, v)| {
                let want = format!("{k}=\"{v}\"");
                set.split(',').any(|kv| kv == want)
            });
            (n == name && all).then(|| value.parse().ok()).flatten()
        })
}

/// Where a replica serves /metrics and its probes.
#[derive(Clone, Copy, Debug)]
pub enum Listeners {
    /// The deprecated `--metrics-addr`: plain /metrics, /healthz and /readyz on one port, so
    /// a test reads the metrics without a token.
    Shared,
    /// `--metrics-bind-address` (HTTPS unless the test says `--metrics-secure=false`) and
    /// `--health-probe-bind-address` (plain HTTP), as deployed.
    Split,
}

impl Listeners {
    /// (metrics port, probe port, the flags that open them).
    fn open(self, extra: &[&str]) -> (u16, u16, Vec<String>) {
        let metrics = free_port();
        match self {
            Listeners::Shared => (
                metrics,
                metrics,
                vec![format!("--metrics-addr=127.0.0.1:{metrics}")],
            ),
            Listeners::Split => {
                let probes = free_port();
                let mut flags = Vec::new();
                // A test's own address wins (`0` turns metrics off); clap would refuse two.
                if !extra
                    .iter()
                    .any(|a| a.starts_with("--metrics-bind-address"))
                {
                    flags.push(format!("--metrics-bind-address=127.0.0.1:{metrics}"));
                }
                flags.push(format!("--health-probe-bind-address=127.0.0.1:{probes}"));
                (metrics, probes, flags)
            }
        }
    }
}

/// `nodeipam run` as a child process with its own ports and log file, killed on drop.
pub struct Replica {
    pub name: String,
    child: Child,
    /// /metrics; the probe port too with [`Listeners::Shared`].
    pub metrics_port: u16,
    /// /healthz and /readyz, plain HTTP.
    pub probe_port: u16,
    pub webhook_port: u16,
    /// Its stdout and stderr.
    pub log: PathBuf,
}

impl Replica {
    /// As the controller's ServiceAccount (a kubeconfig of its own), with HTTPS metrics and a
    /// probe port as deployed.
    pub async fn start(cp: &ControlPlane, dir: &Path, name: &str, extra: &[&str]) -> Replica {
        Self::start_with_env(cp, dir, name, extra, &[]).await
    }

    /// [`Replica::start`] with these environment variables (and no others).
    pub async fn start_with_env(
        cp: &ControlPlane,
        dir: &Path,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Replica {
        let kubeconfig = sa_kubeconfig(cp, dir, name);
        Self::launch(dir, name, &kubeconfig, Listeners::Split, extra, env).await
    }

    /// As `kubeconfig`'s identity, with plain /metrics next to the probes.
    pub async fn start_plain(dir: &Path, kubeconfig: &Path, name: &str, extra: &[&str]) -> Replica {
        Self::start_plain_with_env(dir, kubeconfig, name, extra, &[]).await
    }

    /// [`Replica::start_plain`] with these environment variables (and no others).
    pub async fn start_plain_with_env(
        dir: &Path,
        kubeconfig: &Path,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Replica {
        Self::launch(dir, name, kubeconfig, Listeners::Shared, extra, env).await
    }

    /// Starts `nodeipam run` with leader election and the webhook on (managed TLS, certificate
    /// for 127.0.0.1) unless `extra` turns them off, and waits until /healthz answers. `env`
    /// is the whole environment.
    async fn launch(
        dir: &Path,
        name: &str,
        kubeconfig: &Path,
        listeners: Listeners,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Replica {
        let (metrics_port, probe_port, listen) = listeners.open(extra);
        let webhook_port = free_port();
        let mut args = vec![
            "run".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--namespace={NAMESPACE}"),
            format!("--identity={name}"),
        ];
        args.extend(listen);
        args.push(format!("--webhook-addr=127.0.0.1:{webhook_port}"));
        args.push("--webhook-dns-names=127.0.0.1".to_string());
        args.extend(extra.iter().map(|a| a.to_string()));
        let log = dir.join(format!("{name}.log"));
        let child = spawn(&args, env, &log);
        let mut replica = Replica {
            name: name.to_string(),
            child,
            metrics_port,
            probe_port,
            webhook_port,
            log,
        };
        replica.wait_healthy().await;
        replica
    }

    async fn wait_healthy(&mut self) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "step=start-nodeipam: {} exited early ({status}):\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            if let Some((200, _)) = http_get(self.probe_port, "/healthz").await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "step=start-nodeipam: {} did not answer /healthz:\n{}",
                self.name,
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until /healthz answers 503 and returns why.
    pub async fn wait_unhealthy(&self) -> String {
        wait_for(&format!("/healthz of {} to fail", self.name), || async {
            match http_get(self.probe_port, "/healthz").await {
                Some((503, why)) => Some(why),
                _ => None,
            }
        })
        .await
    }

    /// The plain /metrics of a [`Listeners::Shared`] replica (or `--metrics-secure=false`).
    pub async fn metrics(&self) -> String {
        match http_get(self.metrics_port, "/metrics").await {
            Some((200, body)) => body,
            other => panic!("{}: /metrics answered {other:?}", self.name),
        }
    }

    pub async fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        metric(&self.metrics().await, name, labels)
    }

    /// Waits until `nodeipam_leader` is `want`.
    pub async fn wait_leader_metric(&self, want: f64) {
        wait_for(
            &format!("nodeipam_leader {want} on {}", self.name),
            || async { (self.gauge("nodeipam_leader", &[]).await == Some(want)).then_some(()) },
        )
        .await;
    }

    /// How the process ended, if it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<Pid> {
        self.child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
    }

    pub fn signal(&self, signal: Signal) {
        let pid = self
            .child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw)
            .unwrap_or_else(|| panic!("{} has already exited", self.name));
        kill_process(pid, signal).unwrap_or_else(|e| panic!("signal {}: {e}", self.name));
    }

    /// Waits for the process to exit, which it must within [`WAIT`].
    pub async fn wait_exit(&mut self) -> ExitStatus {
        match tokio::time::timeout(WAIT, self.child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => panic!("waiting for {}: {e}", self.name),
            Err(_) => panic!("{} did not exit:\n{}", self.name, self.log_tail()),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// No API call of this replica was refused by RBAC.
    pub fn assert_never_forbidden(&self) {
        let log = self.log_text();
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
            .collect();
        assert!(
            refused.is_empty(),
            "{} was refused by RBAC:\n{}",
            self.name,
            refused.join("\n")
        );
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        // kill_on_drop ends the process; a failing test shows what it logged.
        if std::thread::panicking() {
            eprintln!("--- {} log tail ---\n{}", self.name, self.log_tail());
        }
    }
}

/// Spawns the `nodeipam` binary with `args` and exactly `env`, its output going to `log`.
fn spawn(args: &[String], env: &[(&str, &str)], log: &Path) -> Child {
    let (mut cmd, bin) = command();
    // A clean environment: no KUBECONFIG, POD_NAME or NODEIPAM_* of the caller leaks in.
    cmd.env_clear().envs(env.iter().copied()).args(args);
    log_to(&mut cmd, log);
    cmd.spawn()
        .unwrap_or_else(|e| panic!("step=spawn-nodeipam: {}: {e}", bin.display()))
}

/// A command that runs the `nodeipam` binary, and that binary's path.
fn command() -> (Command, PathBuf) {
    let bin = nodeipam_bin();
    // setpriv (util-linux), when present, makes the kernel kill the child if this test
    // process dies, so a killed test run leaks no controllers.
    let cmd = match setpriv() {
        Some(setpriv) => {
            let mut cmd = Command::new(setpriv);
            cmd.args(["--pdeathsig", "KILL", "--"]).arg(&bin);
            cmd
        }
        None => Command::new(&bin),
    };
    (cmd, bin)
}

/// Sends the child's stdout and stderr to `log`, gives it no stdin, and kills it on drop.
fn log_to(cmd: &mut Command, log: &Path) {
    let out = std::fs::File::create(log)
        .unwrap_or_else(|e| panic!("step=spawn-nodeipam: create {}: {e}", log.display()));
    let err = out
        .try_clone()
        .expect("step=spawn-nodeipam: clone log handle");
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
}

/// Creates the webhook configuration of `config/webhook`, reaching the replica by URL instead
/// of the in-cluster Service (rules, failure policy and the rest as in the manifest).
pub async fn register_webhook_by_url(client: &kube::Client, webhook_port: u16) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use kube::api::{Api, PostParams};
    let text = std::fs::read_to_string(config_path("webhook/manifests.yaml"))
        .expect("read config/webhook/manifests.yaml");
    let mut vwc: ValidatingWebhookConfiguration =
        serde_saphyr::from_str(&text).expect("config/webhook/manifests.yaml parses");
    for hook in vwc.webhooks.iter_mut().flatten() {
        let path = hook
            .client_config
            .service
            .take()
            .and_then(|s| s.path)
            .expect("the manifest names the webhook path");
        hook.client_config.url = Some(format!("https://127.0.0.1:{webhook_port}{path}"));
        assert!(
            hook.client_config.ca_bundle.is_none(),
            "caBundle is patched at runtime"
        );
    }
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .expect("create the webhook configuration");
}
