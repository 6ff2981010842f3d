//! Counting a contender's requests: the API server's audit log, one entry per request of the
//! contender's own identity (a client certificate for `CONTENDER_USER`), and nobody else's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The identity every contender runs as; the loader and the observer use the admin's.
pub const CONTENDER_USER: &str = "bench-contender";

/// Logs every request of the contender at the Metadata level and nothing else, so the audit
/// backend costs the API server the same small amount for every contender.
const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["bench-contender"]
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
pub fn count(text: &str) -> Requests {
    let mut seen = BTreeSet::new();
    let mut out = Requests::default();
    for line in text.lines() {
        let Ok(e) = serde_json::from_str::<Entry>(line) else {
            continue;
        };
        if e.user.username != CONTENDER_USER || !seen.insert(e.audit_id) {
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
        *out.by_kind.entry(what).or_default() += 1;
        out.total += 1;
    }
    out
}

pub fn count_file(log: &Path) -> anyhow::Result<Requests> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    Ok(count(&text))
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
}
