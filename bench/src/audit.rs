//! Counting a contender's requests: the API server's audit log, one entry per request of the
//! contender's own identity (a client certificate for `CONTENDER_USER`), and of the kubelet-like
//! fleet's (`crate::kwok::USER`, present only in `--fleet kwok` runs), and nobody else's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The identity every contender runs as; the loader and the observer use the admin's.
pub const CONTENDER_USER: &str = "bench-contender";

/// Logs every request of the contender (and of KWOK's kubelets, when they run) at the Metadata
/// level and nothing else, so the audit backend costs the API server the same small amount for
/// every contender.
const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["bench-contender", "bench-kubelets"]
- level: None
"#;

/// Where the policy and the log go, and the kube-apiserver flags that turn it on.
pub struct AuditFiles {
    pub log: PathBuf,
    pub args: Vec<String>,
}

pub fn files(dir: &Path) -> anyhow::Result<AuditFiles> {
    std::fs::create_dir_all(dir)?;
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(&policy, POLICY).with_context(|| format!("writing {}", policy.display()))?;
    let log = dir.join("audit.log");
    let _ = std::fs::remove_file(&log);
    let args = vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-format=json".into(),
        "--audit-log-maxsize=0".into(),
    ];
    Ok(AuditFiles { log, args })
}

/// The contender's requests by `verb resource[/subresource]`, each counted once (a watch has
/// a ResponseStarted and a ResponseComplete entry with one audit ID).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requests {
    pub total: u64,
    pub by_kind: BTreeMap<String, u64>,
    /// Requests answered with something other than 2xx, by `code verb resource[/subresource]`
    /// (e.g. `409 patch nodes`: a conflict).
    #[serde(default)]
    pub failed: BTreeMap<String, u64>,
}

impl Requests {
    /// Writes of Node objects themselves (not their status): the podCIDR writes, answered or not.
    pub fn node_writes(&self) -> u64 {
        ["patch nodes", "update nodes"]
            .iter()
            .filter_map(|k| self.by_kind.get(*k))
            .sum()
    }

    /// Requests answered 409 Conflict.
    pub fn conflicts(&self) -> u64 {
        self.failed
            .iter()
            .filter(|(k, _)| k.starts_with("409 "))
            .map(|(_, v)| v)
            .sum()
    }

    /// Writes of Node objects answered with something other than 2xx (409s included).
    pub fn failed_node_writes(&self) -> u64 {
        self.failed
            .iter()
            .filter(|(k, _)| k.ends_with(" patch nodes") || k.ends_with(" update nodes"))
            .map(|(_, v)| v)
            .sum()
    }

    /// Status writes of Nodes (a kubelet's).
    pub fn node_status_writes(&self) -> u64 {
        ["patch nodes/status", "update nodes/status"]
            .iter()
            .filter_map(|k| self.by_kind.get(*k))
            .sum()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: Option<u16>,
}

#[derive(Deserialize)]
struct User {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: Option<String>,
    #[serde(default)]
    subresource: Option<String>,
}

/// Counts the contender's requests in the audit log's text.
#[cfg(test)]
pub fn count(text: &str) -> Requests {
    count_user(text, CONTENDER_USER)
}

/// Counts the requests of `user` in the audit log's text. A watch's first entry
/// (ResponseStarted) gives its code.
pub fn count_user(text: &str, user: &str) -> Requests {
    let mut seen = BTreeSet::new();
    let mut out = Requests::default();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Entry>(line) else {
            continue;
        };
        if e.user.username != user || !seen.insert(e.audit_id) {
            continue;
        }
        let what = match e.object_ref {
            Some(ObjectRef {
                resource: Some(r),
                subresource,
            }) => match subresource {
                Some(s) => format!("{} {r}/{s}", e.verb),
                None => format!("{} {r}", e.verb),
            },
            _ => format!("{} (non-resource)", e.verb),
        };
        if let Some(code) = e.response_status.and_then(|r| r.code)
            && !(200..300).contains(&code)
        {
            *out.failed.entry(format!("{code} {what}")).or_default() += 1;
        }
        *out.by_kind.entry(what).or_default() += 1;
        out.total += 1;
    }
    out
}

pub fn count_file(log: &Path) -> anyhow::Result<Requests> {
    count_file_user(log, CONTENDER_USER)
}

pub fn count_file_user(log: &Path, user: &str) -> anyhow::Result<Requests> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    Ok(count_user(&text, user))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_request_of_the_contender_once_by_verb_and_resource() {
        let line = |id: &str, user: &str, verb: &str, res: &str, sub: Option<&str>| {
            let mut o = serde_json::json!({
                "auditID": id, "verb": verb, "user": {"username": user},
                "objectRef": {"resource": res},
            });
            if let Some(s) = sub {
                o["objectRef"]["subresource"] = s.into();
            }
            o.to_string()
        };
        let text = [
            line("1", CONTENDER_USER, "patch", "nodes", None),
            line("2", CONTENDER_USER, "patch", "nodes", None),
            line("3", CONTENDER_USER, "watch", "nodes", None),
            line("3", CONTENDER_USER, "watch", "nodes", None),
            line(
                "4",
                CONTENDER_USER,
                "patch",
                "nodeipamconfigs",
                Some("status"),
            ),
            line("5", "admin", "create", "nodes", None),
            "not json".to_string(),
        ]
        .join("\n");
        let r = count(&text);
        assert_eq!(r.total, 4);
        assert_eq!(r.by_kind["patch nodes"], 2);
        assert_eq!(r.by_kind["watch nodes"], 1);
        assert_eq!(r.by_kind["patch nodeipamconfigs/status"], 1);
        assert!(!r.by_kind.contains_key("create nodes"));
    }

    #[test]
    fn failed_requests_are_counted_by_code_and_conflicts_and_writes_summed() {
        let line = |id: &str, user: &str, verb: &str, sub: Option<&str>, code: u16| {
            let mut o = serde_json::json!({
                "auditID": id, "verb": verb, "user": {"username": user},
                "objectRef": {"resource": "nodes"}, "responseStatus": {"code": code},
            });
            if let Some(s) = sub {
                o["objectRef"]["subresource"] = s.into();
            }
            o.to_string()
        };
        let text = [
            line("1", CONTENDER_USER, "patch", None, 200),
            line("2", CONTENDER_USER, "patch", None, 409),
            line("3", CONTENDER_USER, "update", None, 409),
            line("4", CONTENDER_USER, "patch", None, 422),
            line("5", CONTENDER_USER, "get", None, 404),
            line("6", "bench-kubelets", "patch", Some("status"), 200),
            line("7", "bench-kubelets", "patch", Some("status"), 200),
            line("8", "bench-kubelets", "patch", Some("status"), 409),
        ]
        .join("\n");
        let r = count(&text);
        assert_eq!(r.total, 5);
        assert_eq!(r.node_writes(), 4);
        assert_eq!(r.conflicts(), 2);
        assert_eq!(r.failed_node_writes(), 3);
        assert_eq!(r.failed["409 patch nodes"], 1);
        assert_eq!(r.failed["422 patch nodes"], 1);
        assert_eq!(r.failed["404 get nodes"], 1);
        assert_eq!(r.node_status_writes(), 0);
        let k = count_user(&text, "bench-kubelets");
        assert_eq!((k.total, k.node_status_writes(), k.conflicts()), (3, 3, 1));
        assert_eq!(k.node_writes(), 0);
    }
}
