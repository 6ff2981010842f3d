//! Stamps the binary with the git commit, the build date and the compiler's version for
//! `nodeipam version` and the `nodeipam_build_info` metric.
//!
//! The commit comes from `NODEIPAM_GIT_COMMIT` when set (the container build has no `.git`
//! and passes it as a build argument), else from `git rev-parse`, else "unknown". The date
//! comes from `SOURCE_DATE_EPOCH` when set (reproducible builds), else the time of the build.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-env-changed=NODEIPAM_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = std::env::var("NODEIPAM_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    // Rebuild the stamp when HEAD moves (a commit, a checkout), not on every build.
    for what in ["HEAD", "logs/HEAD"] {
        if let Some(path) = git(&["rev-parse", "--git-path", what])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
        });
    println!("cargo:rustc-env=NODEIPAM_GIT_COMMIT={}", commit.trim());
    println!("cargo:rustc-env=NODEIPAM_BUILD_DATE={}", rfc3339(epoch));
    println!("cargo:rustc-env=NODEIPAM_RUSTC_VERSION={}", rustc_version());
}

/// The version number of the compiler cargo runs (`rustc 1.91.0 (f8297e351 2025-10-28)` gives
/// `1.91.0`), or "unknown".
fn rustc_version() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(1)
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// HEAD's commit. No "-dirty" mark: the script reruns only when HEAD moves, so such a mark
/// would go stale as files are edited.
fn git_commit() -> Option<String> {
    git(&["rev-parse", "HEAD"])
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch (the civil-from-days algorithm).
fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
