//! The seal: the step of the single-writer argument that needs no timing. Every podCIDR write
//! carries the resourceVersion of the Node it was chosen for, so it lands only on that version.
//! Before its first podCIDR write, a leader that took over from a predecessor which may have
//! writes in flight writes once to every Node without podCIDRs (an annotation naming itself):
//! that moves each such Node past every version a predecessor can have read, and a write
//! sent before it fails with a conflict however late it arrives. A write that landed first is
//! in the seal's answer, and the list that follows sees it. (docs/single-writer.md, step 2.)
//!
//! Why every version a predecessor read is older than the seal: it read them before it sent,
//! it sent only within its term, and the new leader took the Lease, and then sealed, only
//! after that term (step 1). Nodes that were not there when the new leader listed for the
//! seal cannot have been read by a predecessor at all; a Node with podCIDRs cannot be
//! written again (podCIDRs are immutable), and a Node re-created under a name has another UID,
//! which every write also tests.

use std::time::Duration;

use crate::lease::Takeover;
use crate::node::IpamNode;
use crate::outcome::Answer;

/// The annotation a seal writes: the sealing leader and a token of this seal.
pub const ANNOTATION: &str = "nodeipam.io/sealed-by";

/// How often one Node's seal is tried before the new leader relies on the take-over wait for
/// it instead (the timing assumption of step 2).
pub const ATTEMPTS: u32 = 5;

/// When a new leader that took over as `took` seals, after its take-over began: at once when
/// its predecessor sends nothing more, after the predecessor's whole term (`term`) when nothing
/// says it stopped (a write it sends after our seal would land); never after a clean
/// hand-over or when nothing was ever allocated (`allocated_before` false: no write to fence).
pub fn after(took: Takeover, allocated_before: bool, term: Duration) -> Option<Duration> {
    match took {
        Takeover::Clean => None,
        _ if !allocated_before => None,
        Takeover::Unclean => Some(Duration::ZERO),
        Takeover::Unknown => Some(term),
    }
}

/// The Nodes of a list that a seal writes to: those without podCIDRs, the only ones a podCIDR
/// write can still fill. A Node whose podCIDRs do not parse is never written by us either.
pub fn targets(nodes: &[IpamNode]) -> Vec<(String, Option<String>)> {
    nodes
        .iter()
        .filter(|n| n.cidrs().is_ok_and(|c| c.is_empty()))
        .map(|n| {
            (
                n.metadata.name.clone().unwrap_or_default(),
                n.metadata.uid.clone(),
            )
        })
        .collect()
}

/// The annotation's value: never one the Node already carries, since a patch that changes
/// nothing leaves the resourceVersion where it was, and the seal would hold nothing back.
pub fn value(identity: &str, token: u64) -> String {
    format!("{identity}/{token:016x}")
}

/// Whether a seal's answer settles that Node: it landed (a 2xx: the Node's version moved, or
/// the write of a predecessor had landed first and the answer shows it), or the Node is gone
/// (a 404: no write of a predecessor can land on a Node re-created under its name). Anything
/// else is tried again; a seal that lands late is harmless.
pub fn sealed(answer: Answer) -> bool {
    matches!(answer, Answer::Applied | Answer::Missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::node;

    #[test]
    fn a_leader_seals_unless_nothing_can_be_in_flight() {
        let term = Duration::from_secs(15);
        assert_eq!(after(Takeover::Clean, true, term), None);
        assert_eq!(after(Takeover::Unclean, false, term), None);
        assert_eq!(after(Takeover::Unknown, false, term), None);
        assert_eq!(after(Takeover::Unclean, true, term), Some(Duration::ZERO));
        // A predecessor that may still send would get past a seal made before its term ends.
        assert_eq!(after(Takeover::Unknown, true, term), Some(term));
    }

    #[test]
    fn only_nodes_a_write_can_still_fill_are_sealed() {
        let nodes = vec![
            node("empty", "u1", &[], &[]),
            node("held", "u2", &[], &["10.0.0.0/24"]),
            node("garbage", "u3", &[], &["not-a-cidr"]),
        ];
        let names: Vec<String> = targets(&nodes).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["empty".to_string()]);
    }

    #[test]
    fn every_seal_writes_a_new_value() {
        assert_ne!(value("a_1", 1), value("a_1", 2));
        assert!(value("a_1", 1).starts_with("a_1/"));
    }

    #[test]
    fn a_seal_is_settled_only_by_an_answer_that_shows_it() {
        assert!(sealed(Answer::Applied));
        assert!(sealed(Answer::Missing));
        for a in [
            Answer::Ambiguous,
            Answer::Throttled,
            Answer::Conflict,
            Answer::Rejected,
        ] {
            assert!(!sealed(a), "{a:?}");
        }
    }
}
