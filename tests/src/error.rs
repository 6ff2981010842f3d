//! The harness error: every failure names the step it happened in, and, where a process is
//! involved, the binary and its log file (with the log's tail, so a CI failure is readable).

use std::fmt;
use std::path::{Path, PathBuf};

/// The step of bringing up or using the control plane that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    LocateBinaries,
    PrepareDir,
    GenerateCerts,
    StartEtcd,
    WaitEtcdHealthy,
    StartApiserver,
    WaitReadyz,
    /// Starting kube-apiserver again after `stop_apiserver` (same flags, port and etcd).
    RestartApiserver,
    BuildClient,
    WriteKubeconfig,
    InstallCrds,
    RegisterWebhook,
    /// Starting kube-controller-manager with only its garbage collector.
    StartGarbageCollector,
    /// Starting the fault-injecting proxy in front of kube-apiserver.
    StartFaultProxy,
    /// Copying etcd's data folder while etcd is stopped (`backup_etcd`).
    BackupEtcd,
    /// Putting a copy back into etcd's data folder and starting it again (`restore_etcd`).
    RestoreEtcd,
}

impl Step {
    /// The name used in error messages, e.g. `wait /readyz`.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::LocateBinaries => "locate binaries",
            Step::PrepareDir => "prepare dir",
            Step::GenerateCerts => "generate certs",
            Step::StartEtcd => "start etcd",
            Step::WaitEtcdHealthy => "wait etcd healthy",
            Step::StartApiserver => "start kube-apiserver",
            Step::WaitReadyz => "wait /readyz",
            Step::RestartApiserver => "restart kube-apiserver",
            Step::BuildClient => "build client",
            Step::WriteKubeconfig => "write kubeconfig",
            Step::InstallCrds => "install CRDs",
            Step::RegisterWebhook => "register webhook",
            Step::StartGarbageCollector => "start the garbage collector",
            Step::StartFaultProxy => "start the fault proxy",
            Step::BackupEtcd => "back up etcd's data",
            Step::RestoreEtcd => "restore etcd's data",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong in the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(
        "step `{step}`: binary `{binary}` not found in {}: run hack/control-plane.sh build \
         (or point NODEIPAM_ASSETS at a folder that has it)",
        dir.display()
    )]
    MissingBinary {
        step: Step,
        binary: String,
        dir: PathBuf,
    },

    /// A child process failed to start, exited early, or never became healthy.
    #[error(
        "step `{step}`: {binary} {reason}; log: {}\n--- last lines of {} ---\n{tail}",
        log.display(),
        log.display()
    )]
    Process {
        step: Step,
        binary: String,
        log: PathBuf,
        reason: String,
        tail: String,
    },

    #[error("step `{step}`: {context}: {source}")]
    Io {
        step: Step,
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error("step `{step}`: {context}: {source}")]
    Cert {
        step: Step,
        context: String,
        #[source]
        source: rcgen::Error,
    },

    #[error("step `{step}`: {context}: {source}")]
    Kube {
        step: Step,
        context: String,
        #[source]
        source: kube::Error,
    },

    #[error("step `{step}`: {context}: {source}")]
    Kubeconfig {
        step: Step,
        context: String,
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// Anything else: bad input, a malformed manifest, a timeout not tied to a process.
    #[error("step `{step}`: {message}")]
    Other { step: Step, message: String },
}

impl HarnessError {
    /// The step that failed.
    pub fn step(&self) -> Step {
        match self {
            HarnessError::MissingBinary { step, .. }
            | HarnessError::Process { step, .. }
            | HarnessError::Io { step, .. }
            | HarnessError::Cert { step, .. }
            | HarnessError::Kube { step, .. }
            | HarnessError::Kubeconfig { step, .. }
            | HarnessError::Other { step, .. } => *step,
        }
    }

    /// The binary involved, if any.
    pub fn binary(&self) -> Option<&str> {
        match self {
            HarnessError::MissingBinary { binary, .. } | HarnessError::Process { binary, .. } => {
                Some(binary)
            }
            _ => None,
        }
    }

    /// The log file of the process involved, if any.
    pub fn log_path(&self) -> Option<&Path> {
        match self {
            HarnessError::Process { log, .. } => Some(log),
            _ => None,
        }
    }

    pub(crate) fn io(step: Step, context: impl Into<String>, source: std::io::Error) -> Self {
        HarnessError::Io {
            step,
            context: context.into(),
            source,
        }
    }

    pub(crate) fn kube(step: Step, context: impl Into<String>, source: kube::Error) -> Self {
        HarnessError::Kube {
            step,
            context: context.into(),
            source,
        }
    }

    pub(crate) fn other(step: Step, message: impl Into<String>) -> Self {
        HarnessError::Other {
            step,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_error_names_step_binary_and_log() {
        let err = HarnessError::Process {
            step: Step::WaitReadyz,
            binary: "kube-apiserver".into(),
            log: PathBuf::from("/tmp/x/logs/kube-apiserver.log"),
            reason: "did not become ready within 60s".into(),
            tail: "E0101 boom".into(),
        };
        let text = err.to_string();
        assert!(text.contains("wait /readyz"), "{text}");
        assert!(text.contains("kube-apiserver"), "{text}");
        assert!(text.contains("/tmp/x/logs/kube-apiserver.log"), "{text}");
        assert!(text.contains("E0101 boom"), "{text}");
        assert_eq!(err.step(), Step::WaitReadyz);
        assert_eq!(err.binary(), Some("kube-apiserver"));
    }
}
