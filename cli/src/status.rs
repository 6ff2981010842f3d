//! `kubectl nodeipam status`: the leader from its Lease, the configs and pools with the usage
//! their status reports, the nodes waiting for a podCIDR with the reason the controller's
//! allocation gives, and each published output against the pod network recounted from the
//! objects (`nodeipam_alloc::check`).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use nodeipam_alloc::check::{OutputState, Pending, outputs, pending, recount};
use nodeipam_alloc::podnetwork::table as columns;
use nodeipam_crd::{
    CONDITION_DRAINED, CONDITION_EXHAUSTED, CONDITION_READY, FamilyStatus, NodeIPAMConfig,
    NodeIPAMPool, PoolFamilyStatus,
};
use serde::Serialize;

use crate::read::Read;

/// Everything `status` prints, as `-o json|yaml` shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub leader: Leader,
    pub configs: Vec<ConfigRow>,
    pub pools: Vec<PoolRow>,
    pub pending: Vec<Pending>,
    pub outputs: Vec<OutputState>,
    /// A replica found that the API's storage went back in time and allocates nothing:
    /// what its `StorageWentBack` events say.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub storage_went_back: Vec<String>,
}

/// The Lease as written: by the holder's clock, so the age is only a hint.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    /// `namespace/name`.
    pub lease: String,
    pub found: bool,
    pub holder: Option<String>,
    /// How many times the Lease changed hands: the term.
    pub lease_transitions: Option<i32>,
    pub renew_time: Option<String>,
    pub acquire_time: Option<String>,
    pub lease_duration_seconds: Option<i32>,
    /// The hand-over mark a leader that stopped left (`nodeipam.io/handover`).
    pub handover: Option<String>,
    /// Seconds since `renew_time` by this machine's clock.
    #[serde(skip)]
    pub renewed_ago: Option<i64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigRow {
    pub name: String,
    pub ipv4: Option<String>,
    pub ipv6: Option<String>,
    pub allocation: String,
    pub nodes: Option<u64>,
    pub ipv4_usage: Option<FamilyStatus>,
    pub ipv6_usage: Option<FamilyStatus>,
    pub ready: Option<Cond>,
    pub exhausted: Option<Cond>,
    pub drained: Option<Cond>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    pub name: String,
    pub children: usize,
    pub ipv4: Option<PoolFamilyStatus>,
    pub ipv6: Option<PoolFamilyStatus>,
    pub ready: Option<Cond>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Cond {
    pub status: String,
    pub reason: String,
    pub message: String,
}

fn cond(conditions: &[Condition], type_: &str) -> Option<Cond> {
    conditions.iter().find(|c| c.type_ == type_).map(|c| Cond {
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
    })
}

/// The report from what was read; `now` is this machine's clock in seconds.
pub fn report(read: &Read, now: i64) -> Report {
    let cluster = read.cluster();
    let r = recount(&cluster);
    let network = r.ipam.network();
    let mut configs: Vec<ConfigRow> = read.configs.iter().map(config_row).collect();
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    let mut pools: Vec<PoolRow> = read.pools.iter().flatten().map(pool_row).collect();
    pools.sort_by(|a, b| a.name.cmp(&b.name));
    Report {
        leader: leader(read.lease.as_ref(), &read.lease_ref, now),
        configs,
        pools,
        pending: pending(&cluster, &r),
        outputs: outputs(&cluster, &network),
        storage_went_back: read.went_back.clone(),
    }
}

fn leader(lease: Option<&Lease>, name: &str, now: i64) -> Leader {
    let Some(lease) = lease else {
        return Leader {
            lease: name.to_string(),
            ..Leader::default()
        };
    };
    let spec = lease.spec.clone().unwrap_or_default();
    Leader {
        lease: name.to_string(),
        found: true,
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        lease_transitions: spec.lease_transitions,
        renew_time: spec.renew_time.as_ref().map(|t| t.0.to_string()),
        acquire_time: spec.acquire_time.as_ref().map(|t| t.0.to_string()),
        lease_duration_seconds: spec.lease_duration_seconds,
        handover: lease
            .annotations()
            .get(nodeipam_controller::reconcile::handover::HANDOVER_ANNOTATION)
            .cloned(),
        renewed_ago: spec.renew_time.map(|t| now - t.0.as_second()),
    }
}

fn config_row(c: &NodeIPAMConfig) -> ConfigRow {
    let status = c.status.clone().unwrap_or_default();
    let conditions = &status.conditions;
    ConfigRow {
        name: c.name_any(),
        ipv4: c.spec.ipv4.as_ref().map(|f| f.cidr.clone()),
        ipv6: c.spec.ipv6.as_ref().map(|f| f.cidr.clone()),
        allocation: format!("{:?}", c.spec.allocation),
        nodes: status.nodes,
        ipv4_usage: status.ipv4,
        ipv6_usage: status.ipv6,
        ready: cond(conditions, CONDITION_READY),
        exhausted: cond(conditions, CONDITION_EXHAUSTED),
        drained: cond(conditions, CONDITION_DRAINED),
    }
}

fn pool_row(p: &NodeIPAMPool) -> PoolRow {
    let status = p.status.clone().unwrap_or_default();
    PoolRow {
        name: p.name_any(),
        children: status.ranges.len(),
        ipv4: status.ipv4,
        ipv6: status.ipv6,
        ready: cond(&status.conditions, CONDITION_READY),
    }
}

/// The human report: one table per part, a blank line between them.
pub fn table(r: &Report, wide: bool) -> String {
    [
        went_back(&r.storage_went_back),
        leader_table(&r.leader, wide),
        config_table(&r.configs, wide),
        pool_table(&r.pools),
        pending_table(&r.pending),
        output_table(&r.outputs),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join("\n")
}

/// First of all, when a replica stopped allocating because storage went back in time.
fn went_back(messages: &[String]) -> Option<String> {
    let newest = messages.first()?;
    Some(format!(
        "ALLOCATION STOPPED: {newest}\nSee docs/runbooks.md#nodeipamstoragewentback before \
         restarting the controller.\n"
    ))
}

fn dash(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn leader_table(l: &Leader, wide: bool) -> Option<String> {
    if !l.found {
        return Some(format!(
            "No Lease {}: no replica has led (or the controller runs with --leader-elect=false).\n",
            l.lease
        ));
    }
    let ago = l.renewed_ago.map(|s| {
        let d = Duration::from_secs(s.max(0).unsigned_abs());
        format!("{} ago", nodeipam_crd::duration::format(d))
    });
    let mut row = vec![
        l.holder.clone().unwrap_or_else(|| "<none>".into()),
        l.lease.clone(),
        dash(l.lease_transitions),
        dash(ago),
    ];
    let mut head = vec!["LEADER", "LEASE", "TRANSITIONS", "RENEWED"];
    if wide {
        head.extend(["RENEW-TIME", "DURATION", "HANDOVER"]);
        row.extend([
            dash(l.renew_time.clone()),
            dash(l.lease_duration_seconds.map(|s| format!("{s}s"))),
            dash(l.handover.clone()),
        ]);
    }
    Some(columns_vec(&head, &[row]))
}

/// A table of run-time width, as kubectl prints it.
fn columns_vec(head: &[&str], rows: &[Vec<String>]) -> String {
    let head: Vec<String> = head.iter().map(|h| h.to_string()).collect();
    let rows: Vec<&[String]> = rows.iter().map(Vec::as_slice).collect();
    columns(&head, &rows)
}

fn usage(f: &[Option<FamilyStatus>]) -> String {
    let parts: Vec<String> = f
        .iter()
        .flatten()
        .map(|f| format!("{}/{}", f.allocated, f.capacity))
        .collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

fn config_table(rows: &[ConfigRow], wide: bool) -> Option<String> {
    if rows.is_empty() {
        return Some("No NodeIPAMConfigs.\n".into());
    }
    let status = |c: &Option<Cond>| dash(c.as_ref().map(|c| c.status.clone()));
    let mut head = vec![
        "CONFIG",
        "IPV4",
        "IPV6",
        "NODES",
        "ALLOCATED",
        "READY",
        "DRAINED",
    ];
    if wide {
        head.extend(["ALLOCATION", "EXHAUSTED", "READY-REASON"]);
    }
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|c| {
            let mut row = vec![
                c.name.clone(),
                dash(c.ipv4.clone()),
                dash(c.ipv6.clone()),
                dash(c.nodes),
                usage(&[c.ipv4_usage, c.ipv6_usage]),
                status(&c.ready),
                status(&c.drained),
            ];
            if wide {
                row.extend([
                    c.allocation.clone(),
                    status(&c.exhausted),
                    dash(
                        c.ready
                            .as_ref()
                            .map(|r| format!("{}: {}", r.reason, r.message)),
                    ),
                ]);
            }
            row
        })
        .collect();
    Some(columns_vec(&head, &lines))
}

fn pool_table(rows: &[PoolRow]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let family = |f: Option<PoolFamilyStatus>| {
        f.map(|f| {
            format!(
                "{}/{} (budget {})",
                f.allocated, f.capacity, f.budget_blocks
            )
        })
    };
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                p.children.to_string(),
                dash(family(p.ipv4)),
                dash(family(p.ipv6)),
                dash(p.ready.as_ref().map(|c| c.status.clone())),
            ]
        })
        .collect();
    Some(columns_vec(
        &["POOL", "RANGES", "IPV4", "IPV6", "READY"],
        &lines,
    ))
}

fn pending_table(rows: &[Pending]) -> Option<String> {
    if rows.is_empty() {
        return Some("No pending nodes.\n".into());
    }
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|p| vec![p.node.clone(), p.selected_by.join(","), p.reason.clone()])
        .collect();
    Some(columns_vec(
        &["PENDING-NODE", "SELECTED-BY", "REASON"],
        &lines,
    ))
}

fn output_table(rows: &[OutputState]) -> Option<String> {
    if rows.is_empty() {
        return Some("No published outputs (--pod-network-configmap is empty).\n".into());
    }
    let lines: Vec<Vec<String>> = rows
        .iter()
        .map(|o| {
            let (present, missing) = match &o.missing {
                None => ("no", "-".to_string()),
                Some(m) if m.is_empty() => ("yes", "-".to_string()),
                Some(m) => (
                    "yes",
                    m.iter()
                        .map(|(c, _)| c.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            };
            vec![
                o.kind.clone(),
                o.target.clone(),
                present.to_string(),
                if o.current { "yes" } else { "no" }.to_string(),
                missing,
            ]
        })
        .collect();
    Some(columns_vec(
        &["KIND", "OUTPUT", "PRESENT", "CURRENT", "MISSING"],
        &lines,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            leader: Leader {
                lease: "nodeipam-system/nodeipam-controller".into(),
                found: true,
                holder: Some("a_1".into()),
                lease_transitions: Some(3),
                renew_time: Some("2026-01-01T00:00:00Z".into()),
                lease_duration_seconds: Some(15),
                renewed_ago: Some(90),
                ..Leader::default()
            },
            configs: vec![ConfigRow {
                name: "dual".into(),
                ipv4: Some("10.0.0.0/16".into()),
                ipv6: Some("fd00::/48".into()),
                allocation: "Enabled".into(),
                nodes: Some(2),
                ipv4_usage: Some(FamilyStatus {
                    capacity: 256,
                    allocated: 2,
                }),
                ipv6_usage: Some(FamilyStatus {
                    capacity: 65536,
                    allocated: 2,
                }),
                ready: Some(Cond {
                    status: "True".into(),
                    reason: "Accepting".into(),
                    message: "accepting allocations".into(),
                }),
                exhausted: None,
                drained: None,
            }],
            pools: Vec::new(),
            pending: Vec::new(),
            outputs: vec![OutputState {
                kind: "ConfigMap".into(),
                target: "ns/cm".into(),
                missing: None,
                current: false,
            }],
            storage_went_back: Vec::new(),
        }
    }

    #[test]
    fn tables_say_what_is_there_and_what_is_not() {
        let t = table(&report(), false);
        let lines: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert!(lines.contains(&vec![
            "a_1",
            "nodeipam-system/nodeipam-controller",
            "3",
            "1m30s",
            "ago"
        ]));
        assert!(lines.contains(&vec![
            "dual",
            "10.0.0.0/16",
            "fd00::/48",
            "2",
            "2/256,2/65536",
            "True",
            "-"
        ]));
        assert!(t.contains("No pending nodes."), "{t}");
        assert!(
            lines.contains(&vec!["ConfigMap", "ns/cm", "no", "no", "-"]),
            "{t}"
        );
        assert!(!t.contains("POOL"), "no pools, no pool table: {t}");
        let wide = table(&report(), true);
        assert!(
            wide.contains("RENEW-TIME") && wide.contains("Accepting: accepting allocations"),
            "{wide}"
        );
        let mut pooled = report();
        pooled.pools.push(PoolRow {
            name: "burst".into(),
            children: 2,
            ipv4: Some(PoolFamilyStatus {
                ranges: 2,
                capacity: 32,
                allocated: 20,
                budget_blocks: 256,
            }),
            ipv6: None,
            ready: None,
        });
        let t = table(&pooled, false);
        let pools: Vec<Vec<&str>> = t.lines().map(|l| l.split_whitespace().collect()).collect();
        assert!(
            pools.contains(&vec!["POOL", "RANGES", "IPV4", "IPV6", "READY"]),
            "{t}"
        );
        assert!(
            pools.contains(&vec!["burst", "2", "20/32", "(budget", "256)", "-", "-"]),
            "{t}"
        );
        let mut none = report();
        none.leader.found = false;
        assert!(
            table(&none, false).starts_with("No Lease nodeipam-system/nodeipam-controller"),
            "{}",
            table(&none, false)
        );
    }

    #[test]
    fn storage_that_went_back_in_time_comes_first_and_only_when_found() {
        assert!(!table(&report(), false).contains("ALLOCATION STOPPED"));
        let json = serde_json::to_string(&report()).expect("json");
        assert!(!json.contains("storageWentBack"), "{json}");
        let mut stopped = report();
        stopped.storage_went_back = vec!["newest".into(), "older".into()];
        let t = table(&stopped, false);
        assert!(
            t.starts_with("ALLOCATION STOPPED: newest\n")
                && t.contains("nodeipamstoragewentback")
                && !t.contains("older"),
            "{t}"
        );
    }
}
