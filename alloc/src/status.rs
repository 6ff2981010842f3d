//! A config's desired status (counts and the Ready, Exhausted and Drained conditions) from the
//! allocation facts. Pure: no client. A condition's `lastTransitionTime` moves only when its
//! status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use nodeipam_crd::{
    CONDITION_DRAINED, CONDITION_EXHAUSTED, CONDITION_READY, FamilyStatus, NodeIPAMConfigStatus,
    REASON_ACCEPTING, REASON_ACTIVE, REASON_BLOCKS_FREE, REASON_DISABLED, REASON_EXHAUSTED,
    REASON_INVALID, REASON_NO_NODES, REASON_NODES_REMAINING, REASON_OVERLAP, REASON_TERMINATING,
};

use crate::ipam::{ConfigFacts, FamilyFacts};

/// A condition that flipped between the previous and the desired status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub type_: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// The status the controller wants, and which conditions flipped to get there.
pub fn desired_status(
    facts: &ConfigFacts,
    generation: Option<i64>,
    previous: &[Condition],
    now: &Time,
) -> (NodeIPAMConfigStatus, Vec<Transition>) {
    let wanted = [ready(facts), exhausted(facts), drained(facts)];
    let mut conditions = Vec::with_capacity(wanted.len());
    let mut transitions = Vec::new();
    for (type_, status, reason, message) in wanted {
        let prev = previous.iter().find(|c| c.type_ == type_);
        let flipped = prev.is_none_or(|p| p.status != status);
        let last_transition_time = match prev {
            Some(p) if !flipped => p.last_transition_time.clone(),
            _ => now.clone(),
        };
        if flipped {
            transitions.push(Transition {
                type_,
                status,
                reason,
                message: message.clone(),
            });
        }
        conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time,
        });
    }
    let family = |f: Option<FamilyFacts>| {
        f.map(|f| FamilyStatus {
            capacity: f.capacity,
            allocated: f.allocated,
        })
    };
    let status = NodeIPAMConfigStatus {
        observed_generation: generation,
        ipv4: family(facts.ipv4),
        ipv6: family(facts.ipv6),
        nodes: Some(facts.nodes),
        conditions,
    };
    (status, transitions)
}

/// Whether `desired` differs from `written` in counts only: blocks allocated, nodes, and the
/// message of a condition that kept its status and reason (how many nodes still hold blocks,
/// what a gate waits for). Counts move at every step of a burst and may wait a moment; a
/// flipped condition, a new generation or a new capacity may not.
pub fn counts_only(written: &NodeIPAMConfigStatus, desired: &NodeIPAMConfigStatus) -> bool {
    let capacity = |s: &NodeIPAMConfigStatus| {
        (
            s.ipv4.map(|f| f.capacity),
            s.ipv6.map(|f| f.capacity),
            s.observed_generation,
        )
    };
    capacity(written) == capacity(desired) && flips(written) == flips(desired)
}

/// What of each condition only a flip, a new reason or a new generation changes.
fn flips(s: &NodeIPAMConfigStatus) -> Vec<(&str, &str, &str, Option<i64>, &Time)> {
    s.conditions
        .iter()
        .map(|c| {
            let Condition {
                type_,
                status,
                reason,
                observed_generation,
                last_transition_time,
                message: _,
            } = c;
            (
                type_.as_str(),
                status.as_str(),
                reason.as_str(),
                *observed_generation,
                last_transition_time,
            )
        })
        .collect()
}

/// `Ready=False` while a gate (our finalizer, the published pod network) is not yet in place.
pub const REASON_PENDING: &str = "Pending";

type Cond = (&'static str, &'static str, &'static str, String);

fn ready(f: &ConfigFacts) -> Cond {
    if f.accepting {
        return (
            CONDITION_READY,
            "True",
            REASON_ACCEPTING,
            "accepting allocations".into(),
        );
    }
    let (reason, message) = if f.deleting {
        (
            REASON_TERMINATING,
            "the config is being deleted: no new allocations".to_string(),
        )
    } else if let Some(why) = &f.invalid {
        (REASON_INVALID, why.clone())
    } else if f.awaiting && !f.enabled {
        (
            REASON_PENDING,
            "created Disabled by its NodeIPAMPool: enabled once the pool is within ranges.max"
                .to_string(),
        )
    } else if !f.enabled {
        (
            REASON_DISABLED,
            "spec.allocation is Disabled: no new allocations".to_string(),
        )
    } else if let Some(why) = &f.overlap {
        (
            REASON_OVERLAP,
            format!("{why}: no allocations from this config until the overlap is gone"),
        )
    } else if let Some(why) = &f.gate {
        (REASON_PENDING, format!("not accepting yet: {why}"))
    } else {
        (REASON_INVALID, "not accepting allocations".to_string())
    };
    (CONDITION_READY, "False", reason, message)
}

fn exhausted(f: &ConfigFacts) -> Cond {
    let full: Vec<&str> = [("IPv4", f.ipv4), ("IPv6", f.ipv6)]
        .into_iter()
        .filter_map(|(name, fam)| fam.filter(|x| x.free == 0).map(|_| name))
        .collect();
    if f.invalid.is_some() {
        return (
            CONDITION_EXHAUSTED,
            "Unknown",
            REASON_INVALID,
            "the spec is invalid".into(),
        );
    }
    if full.is_empty() {
        (
            CONDITION_EXHAUSTED,
            "False",
            REASON_BLOCKS_FREE,
            "every family has a free block".into(),
        )
    } else {
        (
            CONDITION_EXHAUSTED,
            "True",
            REASON_EXHAUSTED,
            format!("no free {} block", full.join(" or ")),
        )
    }
}

fn drained(f: &ConfigFacts) -> Cond {
    let stopped = f.stopped();
    if !stopped {
        return (
            CONDITION_DRAINED,
            "False",
            REASON_ACTIVE,
            "the config still accepts allocations".into(),
        );
    }
    if !f.held() {
        return (
            CONDITION_DRAINED,
            "True",
            REASON_NO_NODES,
            "no node holds a block from this config".into(),
        );
    }
    let names = |count: u64, sample: &[String]| {
        let more = count.saturating_sub(sample.len() as u64);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("{}{tail}", sample.join(", "))
    };
    let mut parts = Vec::new();
    // Those being written hold it as much: they are named in the sample too.
    let holding = f.nodes + f.writing;
    if holding > 0 || f.leaked == 0 {
        parts.push(format!(
            "{holding} node(s) still hold blocks: {}",
            names(holding, &f.sample_nodes)
        ));
    }
    if f.leaked > 0 {
        // Not on a node yet, but a write that may still land: it binds as a node does.
        parts.push(format!(
            "{} node(s) may still receive a podCIDR write whose outcome is unknown: {}",
            f.leaked,
            names(f.leaked, &f.sample_leaked)
        ));
    }
    (
        CONDITION_DRAINED,
        "False",
        REASON_NODES_REMAINING,
        parts.join("; "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        Time(s.parse().expect("test time"))
    }

    fn facts() -> ConfigFacts {
        ConfigFacts {
            ipv4: Some(FamilyFacts {
                capacity: 4,
                allocated: 1,
                occupied: 1,
                free: 3,
            }),
            ipv6: None,
            nodes: 1,
            sample_nodes: vec!["n1".into()],
            writing: 0,
            leaked: 0,
            sample_leaked: Vec::new(),
            accepting: true,
            enabled: true,
            awaiting: false,
            deleting: false,
            invalid: None,
            overlap: None,
            gate: None,
        }
    }

    fn cond<'a>(s: &'a NodeIPAMConfigStatus, type_: &str) -> &'a Condition {
        s.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition present")
    }

    #[test]
    fn active_config() {
        let (s, tr) = desired_status(&facts(), Some(3), &[], &t("2026-01-01T00:00:00Z"));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(
            s.ipv4,
            Some(FamilyStatus {
                capacity: 4,
                allocated: 1
            })
        );
        assert_eq!(s.nodes, Some(1));
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "Exhausted").status, "False");
        assert_eq!(
            (
                cond(&s, "Drained").status.as_str(),
                cond(&s, "Drained").reason.as_str()
            ),
            ("False", "Active")
        );
        assert_eq!(tr.len(), 3, "first status: every condition is new");
    }

    #[test]
    fn transition_time_moves_only_on_flip() {
        let t0 = t("2026-01-01T00:00:00Z");
        let t1 = t("2026-01-01T00:05:00Z");
        let (s0, _) = desired_status(&facts(), Some(1), &[], &t0);
        // Same statuses, different message (node count): times stay.
        let mut f = facts();
        f.nodes = 2;
        f.sample_nodes.push("n2".into());
        let (s1, tr) = desired_status(&f, Some(1), &s0.conditions, &t1);
        assert!(tr.is_empty());
        for c in &s1.conditions {
            assert_eq!(c.last_transition_time, t0, "{}", c.type_);
        }
        // Disable: Ready flips, Drained stays False (NodesRemaining): only Ready moves.
        f.enabled = false;
        f.accepting = false;
        let (s2, tr) = desired_status(&f, Some(2), &s1.conditions, &t1);
        assert_eq!(
            tr.iter().map(|x| x.type_).collect::<Vec<_>>(),
            vec!["Ready"]
        );
        assert_eq!(cond(&s2, "Ready").last_transition_time, t1);
        assert_eq!(cond(&s2, "Ready").reason, REASON_DISABLED);
        assert_eq!(cond(&s2, "Drained").last_transition_time, t0);
        assert_eq!(cond(&s2, "Drained").reason, REASON_NODES_REMAINING);
        assert!(
            cond(&s2, "Drained")
                .message
                .starts_with("2 node(s) still hold blocks: n1, n2")
        );
    }

    #[test]
    fn drained_when_stopped_and_empty() {
        let mut f = facts();
        f.deleting = true;
        f.accepting = false;
        f.nodes = 0;
        f.sample_nodes.clear();
        let (s, tr) = desired_status(&f, Some(1), &[], &t("2026-01-01T00:00:00Z"));
        assert_eq!(
            (
                cond(&s, "Drained").status.as_str(),
                cond(&s, "Drained").reason.as_str()
            ),
            ("True", REASON_NO_NODES)
        );
        assert_eq!(cond(&s, "Ready").reason, REASON_TERMINATING);
        assert!(
            tr.iter()
                .any(|x| x.type_ == "Drained" && x.status == "True")
        );
        // A write still in flight keeps it from draining.
        f.writing = 1;
        f.sample_nodes = vec!["n3".into()];
        let (s, _) = desired_status(&f, Some(1), &[], &t("2026-01-01T00:00:00Z"));
        assert_eq!(cond(&s, "Drained").status, "False");
        // Not served yet, so not in `nodes`, but named as a holder.
        assert_eq!(
            cond(&s, "Drained").message,
            "1 node(s) still hold blocks: n3"
        );
        f.sample_nodes = Vec::new();
        // So does a leaked write, which may still land; the message names its node.
        f.writing = 0;
        f.leaked = 1;
        f.sample_leaked = vec!["n9".into()];
        let (s, _) = desired_status(&f, Some(1), &[], &t("2026-01-01T00:00:00Z"));
        assert_eq!(cond(&s, "Drained").status, "False");
        assert_eq!(
            cond(&s, "Drained").message,
            "1 node(s) may still receive a podCIDR write whose outcome is unknown: n9"
        );
    }

    #[test]
    fn exhausted_names_the_family() {
        let mut f = facts();
        f.ipv6 = Some(FamilyFacts {
            capacity: 1,
            allocated: 1,
            occupied: 1,
            free: 0,
        });
        let (s, _) = desired_status(&f, None, &[], &t("2026-01-01T00:00:00Z"));
        assert_eq!(cond(&s, "Exhausted").status, "True");
        assert_eq!(cond(&s, "Exhausted").message, "no free IPv6 block");
    }

    #[test]
    fn ready_reasons() {
        let mut f = facts();
        f.accepting = false;
        f.overlap = Some("10.0.0.0/16 overlaps 10.0.0.0/8 of older NodeIPAMConfig a".into());
        let (s, _) = desired_status(&f, None, &[], &t("2026-01-01T00:00:00Z"));
        assert_eq!(cond(&s, "Ready").reason, REASON_OVERLAP);
        f.invalid = Some("bad".into());
        let (s, _) = desired_status(&f, None, &[], &t("2026-01-01T00:00:00Z"));
        assert_eq!(cond(&s, "Ready").reason, REASON_INVALID);
        assert_eq!(cond(&s, "Exhausted").status, "Unknown");
    }

    #[test]
    fn counts_and_messages_are_counts_only_flips_generations_and_capacity_are_not() {
        let now = t("2026-01-01T00:00:00Z");
        let mut f = facts();
        (f.enabled, f.accepting) = (false, false);
        let (written, _) = desired_status(&f, Some(1), &[], &now);
        let later = t("2026-01-01T00:00:05Z");
        let want = |f: &ConfigFacts, generation| {
            desired_status(f, generation, &written.conditions, &later).0
        };

        let mut more = f.clone();
        more.nodes = 7;
        more.ipv4 = Some(FamilyFacts {
            capacity: 4,
            allocated: 3,
            occupied: 3,
            free: 1,
        });
        let moved = want(&more, Some(1));
        assert_ne!(
            moved, written,
            "the counts and the NodesRemaining message moved"
        );
        assert!(counts_only(&written, &moved));
        assert!(counts_only(&written, &written));

        assert!(
            !counts_only(&written, &want(&f, Some(2))),
            "a new generation"
        );
        let mut full = more.clone();
        full.ipv4 = Some(FamilyFacts {
            capacity: 4,
            allocated: 4,
            occupied: 4,
            free: 0,
        });
        assert!(
            !counts_only(&written, &want(&full, Some(1))),
            "Exhausted flipped"
        );
        let mut gone = f.clone();
        gone.nodes = 0;
        assert!(
            !counts_only(&written, &want(&gone, Some(1))),
            "Drained flipped"
        );
        let mut resized = f.clone();
        resized.ipv4 = Some(FamilyFacts {
            capacity: 8,
            allocated: 1,
            occupied: 1,
            free: 7,
        });
        assert!(
            !counts_only(&written, &want(&resized, Some(1))),
            "a new capacity"
        );
        let mut v6 = f;
        v6.ipv6 = v6.ipv4;
        assert!(!counts_only(&written, &want(&v6, Some(1))), "a new family");
    }
}
