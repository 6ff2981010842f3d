//! One child process (etcd or kube-apiserver) with its output in a log file: spawn, poll for an
//! early exit, stop gracefully (SIGTERM, then SIGKILL), kill on drop, read the log's tail.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::error::{HarnessError, Step};

/// How many log lines an error or a panic report shows.
pub(crate) const TAIL_LINES: usize = 40;

pub(crate) struct Process {
    name: &'static str,
    log: PathBuf,
    child: Option<Child>,
}

/// `setpriv` from util-linux, if present: it makes the kernel kill the child when the thread
/// that started it dies, so a test binary that is killed (timeout, Ctrl-C) leaks no servers.
fn setpriv() -> Option<&'static Path> {
    static SETPRIV: OnceLock<Option<PathBuf>> = OnceLock::new();
    SETPRIV
        .get_or_init(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|dir| dir.join("setpriv"))
                .find(|p| p.is_file())
        })
        .as_deref()
}

impl Process {
    /// Starts `binary args...` in `cwd` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &'static str,
        binary: &Path,
        args: &[String],
        log: &Path,
        cwd: &Path,
        step: Step,
    ) -> Result<Process, HarnessError> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| HarnessError::io(step, format!("open log {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| HarnessError::io(step, format!("open log {}", log.display()), e))?;
        let mut cmd = match setpriv() {
            Some(setpriv) => {
                let mut cmd = Command::new(setpriv);
                cmd.args(["--pdeathsig", "KILL", "--"]).arg(binary);
                cmd
            }
            None => Command::new(binary),
        };
        cmd.args(args)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().map_err(|source| HarnessError::Process {
            step,
            binary: name.to_string(),
            log: log.to_path_buf(),
            reason: format!("could not be started from {}: {source}", binary.display()),
            tail: String::new(),
        })?;
        Ok(Process {
            name,
            log: log.to_path_buf(),
            child: Some(child),
        })
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The exit status if the process has already exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// An error for `step` that carries this process's name, log path and log tail.
    pub fn error(&self, step: Step, reason: impl Into<String>) -> HarnessError {
        HarnessError::Process {
            step,
            binary: self.name.to_string(),
            log: self.log.clone(),
            reason: reason.into(),
            tail: log_tail(&self.log, TAIL_LINES),
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited after `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            if let Some(pid) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
                let _ = kill_process(pid, Signal::TERM);
            }
            let deadline = Instant::now() + grace;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// SIGKILL and reap; used on drop, where nothing can be awaited.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file (empty if it cannot be read).
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_only_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = log_tail(&path, 3);
        assert_eq!(tail, "line 98\nline 99\nline 100");
        assert_eq!(log_tail(&dir.path().join("missing"), 3), "");
    }

    #[tokio::test]
    async fn stop_terminates_a_running_process_and_logs_go_to_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sh.log");
        let mut p = Process::spawn(
            "sh",
            Path::new("/bin/sh"),
            &["-c".to_string(), "echo hello; exec sleep 30".to_string()],
            &log,
            dir.path(),
            Step::StartEtcd,
        )
        .unwrap();
        let start = Instant::now();
        // Wait for the echo to reach the log before stopping.
        while !log_tail(&log, 1).contains("hello") && start.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(p.exited().is_none());
        p.stop(Duration::from_secs(5)).await;
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(p.exited().is_none(), "child handle is gone after stop");
        assert_eq!(log_tail(&log, 1), "hello");
        let err = p.error(Step::StartEtcd, "exited");
        assert!(err.to_string().contains("hello"));
    }

    #[test]
    fn a_missing_binary_fails_to_start_or_exits_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let spawned = Process::spawn(
            "etcd",
            Path::new("/nonexistent/etcd"),
            &[],
            &dir.path().join("etcd.log"),
            dir.path(),
            Step::StartEtcd,
        );
        match spawned {
            Err(err) => assert!(err.to_string().contains("start etcd"), "{err}"),
            // Through setpriv the exec fails in the child: it exits non-zero right away.
            Ok(mut p) => {
                let start = Instant::now();
                let status = loop {
                    if let Some(status) = p.exited() {
                        break status;
                    }
                    assert!(start.elapsed() < Duration::from_secs(5), "still running");
                    std::thread::sleep(Duration::from_millis(20));
                };
                assert!(!status.success());
            }
        }
    }
}
