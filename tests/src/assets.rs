//! Where the control-plane binaries live: `NODEIPAM_ASSETS`, or the folder that
//! `hack/control-plane.sh build` fills (kept in step with hack/lib.sh).

use std::path::{Path, PathBuf};

use crate::error::{HarnessError, Step};

/// The Kubernetes version the binaries are built at (hack/lib.sh `K8S_VERSION`).
pub const K8S_VERSION: &str = "v1.37.2";
/// The etcd version the binaries are built at (hack/lib.sh `ETCD_VERSION`).
pub const ETCD_VERSION: &str = "v3.6.16";

/// The folder the binaries are looked up in when no folder is given explicitly:
/// `$NODEIPAM_ASSETS`, else `${NODEIPAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeipam}/bin/k8s-<v>-etcd-<v>`.
pub fn default_assets_dir() -> PathBuf {
    if let Some(dir) = non_empty_env("NODEIPAM_ASSETS") {
        return PathBuf::from(dir);
    }
    cache_dir()
        .join("bin")
        .join(format!("k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}"))
}

/// `${NODEIPAM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeipam}`, as hack/lib.sh computes it.
fn cache_dir() -> PathBuf {
    match non_empty_env("NODEIPAM_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let base = non_empty_env("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| non_empty_env("HOME").map(|h| Path::new(&h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"));
            base.join("nodeipam")
        }
    }
}

/// Where `hack/helm.sh build` puts Helm: `$NODEIPAM_HELM`, else
/// `<cache>/bin/helm-<version>/helm` with the version `hack/helm/go.mod` requires. Whether the
/// file exists is the caller's check. Err names what could not be read.
pub fn default_helm_path() -> Result<PathBuf, String> {
    if let Some(path) = non_empty_env("NODEIPAM_HELM") {
        return Ok(PathBuf::from(path));
    }
    let go_mod = crate::workspace_root().join("hack/helm/go.mod");
    let text = std::fs::read_to_string(&go_mod)
        .map_err(|e| format!("cannot read {}: {e}", go_mod.display()))?;
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("require helm.sh/helm/v3 "))
        .map(str::trim)
        .ok_or_else(|| format!("no `require helm.sh/helm/v3` line in {}", go_mod.display()))?;
    Ok(cache_dir()
        .join("bin")
        .join(format!("helm-{version}"))
        .join("helm"))
}

/// Where `hack/etcdutl.sh build` puts etcdutl: `$NODEIPAM_ETCDUTL`, else
/// `<cache>/bin/etcdutl-<ETCD_VERSION>/etcdutl`. Whether the file exists is the caller's check.
pub fn default_etcdutl_path() -> PathBuf {
    if let Some(path) = non_empty_env("NODEIPAM_ETCDUTL") {
        return PathBuf::from(path);
    }
    cache_dir()
        .join("bin")
        .join(format!("etcdutl-{ETCD_VERSION}"))
        .join("etcdutl")
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Absolute paths of the binaries the harness runs.
#[derive(Debug, Clone)]
pub(crate) struct Binaries {
    pub dir: PathBuf,
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kubectl: PathBuf,
}

impl Binaries {
    /// Finds etcd, kube-apiserver and kubectl in `dir`; a missing one is an error that says how
    /// to build it.
    pub fn locate(dir: &Path) -> Result<Binaries, HarnessError> {
        let find = |name: &str| -> Result<PathBuf, HarnessError> {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(HarnessError::MissingBinary {
                    step: Step::LocateBinaries,
                    binary: name.to_string(),
                    dir: dir.to_path_buf(),
                })
            }
        };
        Ok(Binaries {
            dir: dir.to_path_buf(),
            etcd: find("etcd")?,
            kube_apiserver: find("kube-apiserver")?,
            kubectl: find("kubectl")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_dir_names_step_binary_dir_and_fix() {
        let dir = Path::new("/nonexistent/nodeipam-assets");
        let err = Binaries::locate(dir).unwrap_err();
        let text = err.to_string();
        assert_eq!(err.step(), Step::LocateBinaries);
        assert_eq!(err.binary(), Some("etcd"));
        assert!(text.contains("locate binaries"), "{text}");
        assert!(text.contains("etcd"), "{text}");
        assert!(text.contains("/nonexistent/nodeipam-assets"), "{text}");
        assert!(text.contains("hack/control-plane.sh build"), "{text}");
    }

    #[test]
    fn default_dir_follows_env_or_pinned_versions() {
        let dir = default_assets_dir();
        match std::env::var_os("NODEIPAM_ASSETS").filter(|v| !v.is_empty()) {
            Some(set) => assert_eq!(dir, PathBuf::from(set)),
            None => assert!(
                dir.ends_with("bin/k8s-v1.37.2-etcd-v3.6.16"),
                "{}",
                dir.display()
            ),
        }
    }
}
