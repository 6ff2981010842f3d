//! The kubelet-like fleet: a KWOK process (`hack/kwok.sh build`) that plays the kubelets of the
//! Nodes carrying its annotation, with the stages of `hack/kwok/stages/` (what each does, and
//! where it comes from in the kubelet, is written at the top of each file). It runs as its own
//! user, so that the API server's audit log counts its status updates apart from the
//! contender's requests.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::process::Child;

/// The annotation KWOK is told to manage Nodes by (`manageNodesWithAnnotationSelector`).
pub const ANNOTATION: &str = "kwok.x-k8s.io/node";
pub const ANNOTATION_VALUE: &str = "fake";
/// KWOK's identity (a client certificate); the audit log records its requests too.
pub const USER: &str = "bench-kubelets";
/// The stages, in the order a kubelet goes through them; the heartbeat is the optional last.
pub const STAGES: [&str; 2] = ["node-register.yaml", "node-ready.yaml"];
pub const HEARTBEAT_STAGE: &str = "node-heartbeat.yaml";
/// Nodes KWOK plays stages for at once (its default is 4): a kubelet per node does not wait
/// for the others, and the bench's own kubelets send 32 updates at once.
pub const PARALLELISM: u32 = 32;

/// The stage files of `dir` that a run uses.
pub fn stage_files(dir: &Path, heartbeat: bool) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = STAGES.iter().map(|s| dir.join(s)).collect();
    if heartbeat {
        files.push(dir.join(HEARTBEAT_STAGE));
    }
    files
}

/// KWOK's configuration: manage only the Nodes with our annotation, no node Leases (a kubelet
/// without them heartbeats through its status), no CRDs (the stages come from this file), then
/// the stages themselves as further YAML documents.
pub fn config(stages: &[String], parallelism: u32) -> String {
    let mut out = format!(
        "apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageAllNodes: false
  manageNodesWithAnnotationSelector: {ANNOTATION}={ANNOTATION_VALUE}
  nodeLeaseDurationSeconds: 0
  nodePlayStageParallelism: {parallelism}
  enableCRDs: []
"
    );
    for s in stages {
        out += "---\n";
        out += s.trim_end();
        out += "\n";
    }
    out
}

/// The names of the stages in a stage file's text (`metadata.name` of each Stage document).
pub fn stage_names(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_metadata = false;
    for line in text.lines() {
        if line.starts_with("metadata:") {
            in_metadata = true;
        } else if in_metadata && let Some(name) = line.strip_prefix("  name:") {
            names.push(name.trim().to_string());
            in_metadata = false;
        } else if !line.starts_with(' ') && !line.is_empty() {
            in_metadata = false;
        }
    }
    names
}

pub struct Kwok {
    pub pid: u32,
    pub log: PathBuf,
    child: Child,
}

impl Kwok {
    /// Writes the configuration into `dir` and starts `bin` against the API server of
    /// `kubeconfig`; its output goes to `log`.
    pub fn start(
        bin: &Path,
        kubeconfig: &Path,
        stages: &[PathBuf],
        dir: &Path,
        log: PathBuf,
    ) -> anyhow::Result<Kwok> {
        let texts = stages
            .iter()
            .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let config_path = dir.join("kwok.yaml");
        std::fs::write(&config_path, config(&texts, PARALLELISM))
            .with_context(|| format!("writing {}", config_path.display()))?;
        let argv = [
            bin.display().to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--config={}", config_path.display()),
            // Also in the configuration; on the command line they win over ~/.kwok/kwok.yaml.
            "--manage-all-nodes=false".into(),
            format!("--manage-nodes-with-annotation-selector={ANNOTATION}={ANNOTATION_VALUE}"),
            "--node-lease-duration-seconds=0".into(),
        ];
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = crate::contender::dies_with_us(&argv);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::from(file))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", argv.join(" ")))?;
        let pid = child.id().context("kwok has no pid")?;
        Ok(Kwok { pid, log, child })
    }

    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "kwok exited ({status}); log {}:\n{}",
                self.log.display(),
                crate::contender::tail(&self.log, 30)
            );
        }
        Ok(())
    }

    pub fn cpu_s(&self) -> anyhow::Result<f64> {
        Ok(crate::procstat::sample(self.pid)?.cpu_s)
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.check_alive()?;
        crate::contender::terminate(&mut self.child, self.pid).await;
        Ok(())
    }
}

/// The status of the Node's Ready condition ("True", "False"), if it has one.
pub fn ready(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.as_str())
}

/// Waits until KWOK has taken `name` through its stages to Ready=True: KWOK is up and playing.
pub async fn wait_ready(
    client: &kube::Client,
    name: &str,
    kwok: &mut Kwok,
    timeout: Duration,
) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(node) = api.get_opt(name).await?
            && ready(&node) == Some("True")
        {
            return Ok(());
        }
        kwok.check_alive()?;
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "kwok did not make {name} Ready within {timeout:?}; log {}:\n{}",
                kwok.log.display(),
                crate::contender::tail(&kwok.log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_manages_only_annotated_nodes_and_carries_the_stages() {
        let c = config(
            &[
                "kind: Stage\nmetadata:\n  name: a\n".into(),
                "kind: Stage\n".into(),
            ],
            8,
        );
        assert!(
            c.starts_with("apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\n")
        );
        assert!(c.contains("  manageAllNodes: false\n"));
        assert!(c.contains("  manageNodesWithAnnotationSelector: kwok.x-k8s.io/node=fake\n"));
        assert!(c.contains("  nodeLeaseDurationSeconds: 0\n"));
        assert!(c.contains("  nodePlayStageParallelism: 8\n"));
        assert_eq!(c.matches("\n---\n").count(), 2);
        assert!(c.ends_with("---\nkind: Stage\n"));
    }

    #[test]
    fn the_heartbeat_stage_is_optional() {
        let dir = Path::new("/s");
        assert_eq!(stage_files(dir, false).len(), 2);
        let with = stage_files(dir, true);
        assert_eq!(with.last(), Some(&dir.join("node-heartbeat.yaml")));
    }

    #[test]
    fn the_stage_files_in_the_tree_name_their_stages_and_never_touch_the_spec() {
        let dir = nodeipam_testenv::workspace_root().join("hack/kwok/stages");
        let mut names = Vec::new();
        for f in stage_files(&dir, true) {
            let text = std::fs::read_to_string(&f).expect("a stage file");
            let text: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .map(|l| format!("{l}\n"))
                .collect();
            assert!(text.contains("kind: Stage"), "{}", f.display());
            // Status templates only: the podCIDRs are the contender's to write.
            assert!(text.contains("statusTemplate:"), "{}", f.display());
            assert!(!text.contains("podCIDR"), "{}", f.display());
            assert!(!text.contains("patches:"), "{}", f.display());
            names.extend(stage_names(&text));
        }
        assert_eq!(names, ["node-register", "node-ready", "node-heartbeat"]);
    }
}
