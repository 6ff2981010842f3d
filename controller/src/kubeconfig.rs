//! The client configuration as kubectl builds it: which kubeconfig files (`--kubeconfig`, that
//! one file; else every file of `$KUBECONFIG` that exists, merged, the first to set a key
//! winning; else `~/.kube/config`), and kubectl's generic flags (`--context`, `--cluster`,
//! `--user`, `--server`, `--token`, `--as`, ...) laid over what they select, as client-go's
//! clientcmd does. One implementation for the controller, `nodeipam ranges` and the plugin.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, KubeconfigError, NamedAuthInfo,
    NamedCluster, NamedContext,
};

/// kubectl's generic connection flags; empty ones leave the kubeconfig's value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub cluster: Option<String>,
    pub user: Option<String>,
    pub server: Option<String>,
    pub token: Option<String>,
    pub certificate_authority: Option<PathBuf>,
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub insecure_skip_tls_verify: bool,
    /// `--as`: the user to impersonate.
    pub impersonate: Option<String>,
    /// `--as-group`, repeatable.
    pub impersonate_groups: Vec<String>,
    /// `--request-timeout`; `None` (or 0) waits as long as the server takes.
    pub request_timeout: Option<Duration>,
}

impl Overrides {
    /// Whether `--server` names the API server, so that no kubeconfig is needed.
    fn names_a_server(&self) -> bool {
        self.server.is_some()
    }
}

/// The kubeconfig files to read, decided from the flag and the environment alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Files {
    /// `--kubeconfig`: that file, which must exist.
    Flag(PathBuf),
    /// `$KUBECONFIG`: the files of the list that exist, merged.
    Env(Vec<PathBuf>),
    /// `~/.kube/config` when it exists (`None`: no home).
    Home(Option<PathBuf>),
}

/// `--kubeconfig` wins over a non-empty `$KUBECONFIG`, which wins over `~/.kube/config`.
pub fn files(flag: Option<&Path>, env: Option<&OsStr>, home: Option<&Path>) -> Files {
    if let Some(path) = flag {
        return Files::Flag(path.to_path_buf());
    }
    let listed: Vec<PathBuf> = env
        .map(|v| std::env::split_paths(v).filter(|p| !p.as_os_str().is_empty()))
        .into_iter()
        .flatten()
        .collect();
    if listed.is_empty() {
        Files::Home(home.map(|h| h.join(".kube").join("config")))
    } else {
        Files::Env(listed)
    }
}

/// The files from this process's flag and environment.
fn files_here(flag: Option<&Path>) -> Files {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    files(
        flag,
        std::env::var_os("KUBECONFIG").as_deref(),
        home.as_deref(),
    )
}

/// Reads and merges `files`; `None` when none of them exists (then kubectl goes in-cluster).
/// A file that exists but cannot be read or parsed is an error naming it.
pub fn load(files: &Files) -> anyhow::Result<Option<Kubeconfig>> {
    match files {
        Files::Flag(path) => Kubeconfig::read_from(path)
            .map(Some)
            .map_err(|e| file_error(&format!("--kubeconfig={}", path.display()), e)),
        Files::Env(paths) => {
            let mut merged: Option<Kubeconfig> = None;
            for path in paths {
                let Some(next) = read_if_there(path, "$KUBECONFIG file")? else {
                    continue;
                };
                merged = Some(match merged {
                    None => next,
                    Some(m) => m.merge(next).map_err(|e| {
                        file_error(&format!("$KUBECONFIG file {}", path.display()), e)
                    })?,
                });
            }
            Ok(merged)
        }
        Files::Home(Some(path)) => read_if_there(path, "kubeconfig"),
        Files::Home(None) => Ok(None),
    }
}

/// A file of a list: skipped when missing, as kubectl skips it.
fn read_if_there(path: &Path, what: &str) -> anyhow::Result<Option<Kubeconfig>> {
    match Kubeconfig::read_from(path) {
        Ok(kc) => Ok(Some(kc)),
        Err(KubeconfigError::ReadConfig(e, _)) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(e) => Err(file_error(&format!("{what} {}", path.display()), e)),
    }
}

/// `<what>: <reason>`, the reason without kube's own repetition of the path.
fn file_error(what: &str, e: KubeconfigError) -> anyhow::Error {
    match e {
        KubeconfigError::ReadConfig(io, _) => anyhow::anyhow!("{what}: {io}"),
        other => anyhow::anyhow!("{what}: {other}"),
    }
}

/// The name of the one context [`select`] leaves.
const SELECTED: &str = "selected";

/// The kubeconfig reduced to the context, cluster and user the flags select, with the flags
/// laid over them. `kc` is `None` when no file was read: then only the flags can name a
/// server. Errors name the flag, or the kubeconfig entry, that is missing.
pub fn select(kc: Option<Kubeconfig>, o: &Overrides) -> anyhow::Result<Kubeconfig> {
    let kc = kc.unwrap_or_default();
    let (context_name, context) = pick_context(&kc, o)?;
    let cluster_name = o.cluster.clone().unwrap_or_else(|| context.cluster.clone());
    let mut cluster = named(&kc.clusters, &cluster_name, |c| (&c.name, &c.cluster));
    if cluster.is_none()
        && let Some(name) = &o.cluster
    {
        bail!("--cluster={name}: no such cluster in the kubeconfig");
    }
    let user_name = o.user.clone().or_else(|| context.user.clone());
    let user = named(&kc.auth_infos, user_name.as_deref().unwrap_or(""), |u| {
        (&u.name, &u.auth_info)
    });
    if user.is_none()
        && let Some(name) = &o.user
    {
        bail!("--user={name}: no such user in the kubeconfig");
    }
    let mut cluster = cluster.take().unwrap_or_default();
    override_cluster(&mut cluster, o);
    if cluster.server.is_none() {
        bail!("{}", no_server(context_name.as_deref(), &cluster_name));
    }
    let mut user = user.unwrap_or_default();
    override_user(&mut user, o);
    Ok(Kubeconfig {
        clusters: vec![NamedCluster {
            name: SELECTED.into(),
            cluster: Some(cluster),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: SELECTED.into(),
            auth_info: Some(user),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: SELECTED.into(),
            context: Some(Context {
                cluster: SELECTED.into(),
                user: Some(SELECTED.into()),
                ..context
            }),
            ..NamedContext::default()
        }],
        current_context: Some(SELECTED.into()),
        ..Kubeconfig::default()
    })
}

/// The context `--context` names, else the current-context (empty when there is none, or
/// when `--server` makes up for a current-context that is not there), and its name.
fn pick_context(kc: &Kubeconfig, o: &Overrides) -> anyhow::Result<(Option<String>, Context)> {
    let name = o.context.clone().or_else(|| kc.current_context.clone());
    let Some(wanted) = &name else {
        return Ok((None, Context::default()));
    };
    let context = match kc.contexts.iter().find(|c| &c.name == wanted) {
        Some(found) => found.context.clone().unwrap_or_default(),
        None if o.context.is_some() => {
            bail!("--context={wanted}: no such context in the kubeconfig")
        }
        None if o.names_a_server() => Context::default(),
        None => bail!("the kubeconfig's current-context {wanted:?} is not one of its contexts"),
    };
    Ok((name, context))
}

/// Why there is no server to talk to.
fn no_server(context: Option<&str>, cluster: &str) -> String {
    match context {
        None => "no kubeconfig with a current-context was found (--kubeconfig, $KUBECONFIG, \
                 ~/.kube/config) and no --server was given"
            .into(),
        Some(c) if cluster.is_empty() => format!("context {c:?} names no cluster"),
        Some(c) => format!("context {c:?}: cluster {cluster:?} has no server"),
    }
}

/// The entry of `list` called `name`, its value cloned.
fn named<T, V: Clone>(
    list: &[T],
    name: &str,
    parts: impl Fn(&T) -> (&String, &Option<V>),
) -> Option<V> {
    list.iter()
        .map(&parts)
        .find(|(n, _)| n.as_str() == name)
        .and_then(|(_, v)| v.clone())
}

fn override_cluster(cluster: &mut Cluster, o: &Overrides) {
    if let Some(server) = &o.server {
        cluster.server = Some(server.clone());
    }
    if let Some(ca) = &o.certificate_authority {
        cluster.certificate_authority = Some(ca.display().to_string());
        cluster.certificate_authority_data = None;
    }
    // As clientcmd: skipping verification drops the CA, which would otherwise be checked.
    if o.insecure_skip_tls_verify {
        cluster.insecure_skip_tls_verify = Some(true);
        cluster.certificate_authority = None;
        cluster.certificate_authority_data = None;
    }
}

fn override_user(user: &mut AuthInfo, o: &Overrides) {
    if let Some(token) = &o.token {
        user.token = Some(token.clone().into());
        user.token_file = None;
    }
    if let Some(cert) = &o.client_certificate {
        user.client_certificate = Some(cert.display().to_string());
        user.client_certificate_data = None;
    }
    if let Some(key) = &o.client_key {
        user.client_key = Some(key.display().to_string());
        user.client_key_data = None;
    }
    if let Some(who) = &o.impersonate {
        user.impersonate = Some(who.clone());
    }
    if !o.impersonate_groups.is_empty() {
        user.impersonate_groups = Some(o.impersonate_groups.clone());
    }
}

/// kubectl's `--request-timeout`: a Go duration (`30s`, `1m30s`, `500ms`) or whole seconds;
/// 0 waits as long as the server takes.
pub fn parse_request_timeout(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    match s.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => crate::duration::parse(s).map_err(|e| e.to_string()),
    }
}

/// The configuration the files and flags name; in-cluster when no file exists and no flag
/// names a server.
pub async fn config(o: &Overrides) -> anyhow::Result<kube::Config> {
    let files = files_here(o.kubeconfig.as_deref());
    let kc = load(&files)?;
    let mut config = if kc.is_none() && !o.names_a_server() && o.context.is_none() {
        let mut config = kube::Config::incluster().map_err(|e| {
            anyhow::anyhow!(
                "no kubeconfig found ({}) and not in a cluster ({e})",
                describe(&files)
            )
        })?;
        // No kubeconfig to lay the flags over: impersonation still applies.
        override_user(&mut config.auth_info, o);
        config
    } else {
        let selected = select(kc, o)?;
        kube::Config::from_custom_kubeconfig(selected, &KubeConfigOptions::default())
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}", context_of(o)))?
    };
    if let Some(t) = o.request_timeout.filter(|t| !t.is_zero()) {
        config.connect_timeout = Some(t);
        config.read_timeout = Some(t);
        config.write_timeout = Some(t);
    }
    Ok(config)
}

/// Which kubeconfig and context an error was about.
fn context_of(o: &Overrides) -> String {
    let file = o
        .kubeconfig
        .as_ref()
        .map(|p| format!("--kubeconfig={}", p.display()))
        .unwrap_or_else(|| "the kubeconfig".into());
    match &o.context {
        Some(c) => format!("{file} (context {c:?})"),
        None => file,
    }
}

/// The files looked at, for a message.
fn describe(files: &Files) -> String {
    match files {
        Files::Flag(p) => format!("--kubeconfig={}", p.display()),
        Files::Env(ps) => format!(
            "$KUBECONFIG={}",
            ps.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        ),
        Files::Home(Some(p)) => p.display().to_string(),
        Files::Home(None) => "no $HOME".into(),
    }
}

#[cfg(test)]
mod tests;
