//! The seal: the step of the single-writer argument that needs no timing. Every podCIDR write
//! is a JSON patch that first tests the Node's seal annotation against the value its sender
//! read (the [`Fence`]), so it lands only while that value stands. Before its first podCIDR
//! write, a leader that took over from a predecessor which may have writes in flight writes
//! once to every Node without podCIDRs (the annotation, naming itself and this seal): that
//! changes the value every write of a predecessor tests, and such a write fails (422, the
//! test failed) however late it arrives. A write that landed first is in the seal's answer,
//! and the list that follows sees it. (docs/single-writer.md, step 2.)
//!
//! Why the fence is the seal and not the Node's resourceVersion: a kubelet moves the version
//! with every status update (registration, Ready, each heartbeat), and so do cloud
//! controllers, labellers and CNIs; a write tested on it meets a 409 whenever it waited in the
//! queue longer than a heartbeat, and a 5,000-node bring-up stalls. Only a seal changes the
//! seal's annotation, so only a successor's seal fails our writes.
//!
//! Why every value a predecessor read is older than the seal: it read it before it sent, it
//! sent only within its term, and the new leader took the Lease, and then sealed, only
//! after that term (step 1); the seal's value names a process and a token never used before.
//! Nodes that were not there when the new leader listed for the seal cannot have been read by
//! a predecessor at all; a Node with podCIDRs cannot be written again (podCIDRs are
//! immutable), and a Node re-created under a name has another UID, which every write also
//! tests.

use std::time::Duration;

use crate::lease::Takeover;
use crate::node::IpamNode;
use crate::outcome::Answer;

/// The annotation a seal writes: the sealing leader and a token of this seal.
pub const ANNOTATION: &str = "nodeipam.io/sealed-by";

/// What a podCIDR write tests on its Node besides the UID: the seal annotation as the write's
/// sender read it. Nothing but a seal changes it, so a kubelet's or another controller's write
/// to the Node never fails ours, and a successor's seal fails every write sent before it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Fence {
    /// The Node had no annotations at all. A JSON patch can test a key only inside a map that
    /// exists, so the write tests that there are still none: a first annotation from anyone
    /// fails it once, and the write is sent again on the Node as read then.
    #[default]
    Bare,
    /// The seal's value as read; `None` where the annotations had no seal.
    Seal(Option<String>),
}

impl Fence {
    /// The fence of a Node as read (its annotations as `node::keep_seal` keeps them).
    pub fn of(node: &IpamNode) -> Fence {
        match &node.metadata.annotations {
            None => Fence::Bare,
            Some(a) => Fence::Seal(a.get(ANNOTATION).cloned()),
        }
    }

    /// The JSON patch operations that test the fence, then set the annotation `key` to
    /// `value` (where the Node has no annotations, by adding the whole map the test found
    /// absent).
    pub fn test_then_annotate(&self, key: &str, value: &str) -> Vec<serde_json::Value> {
        use serde_json::json;
        match self {
            Fence::Bare => vec![
                json!({ "op": "test", "path": "/metadata/annotations", "value": null }),
                json!({ "op": "add", "path": "/metadata/annotations", "value": { key: value } }),
            ],
            Fence::Seal(seal) => vec![
                json!({ "op": "test", "path": annotation_path(ANNOTATION), "value": seal }),
                json!({ "op": "add", "path": annotation_path(key), "value": value }),
            ],
        }
    }
}

/// The JSON pointer of an annotation (RFC 6901: `~` and `/` escaped).
fn annotation_path(key: &str) -> String {
    format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    )
}

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

/// The annotation's value: never one the Node already carries or a predecessor read, since a
/// seal that changes nothing would hold nothing back.
pub fn value(identity: &str, token: u64) -> String {
    format!("{identity}/{token:016x}")
}

/// Whether a seal is done, and the new leader may write its first podCIDRs: its list of the
/// Nodes succeeded (`unsealed` is how many of them no answer has settled yet; `None` while
/// the list has not) and every one of them is settled. Never "done enough": a Node left
/// unsealed is one a predecessor's late write can still land on, at any later time, so a
/// seal that is throttled or refused is tried again for as long as it takes, and the leader
/// allocates nothing meanwhile.
pub fn done(unsealed: Option<usize>) -> bool {
    unsealed == Some(0)
}

/// Whether a seal's answer settles that Node: it landed (a 2xx: the Node carries the new seal, or
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
    fn the_fence_is_the_seal_as_read_and_knows_a_node_without_annotations() {
        use std::collections::BTreeMap;
        let mut n = node("n", "u", &[], &[]);
        n.metadata.annotations = None;
        assert_eq!(Fence::of(&n), Fence::Bare);
        n.metadata.annotations = Some(BTreeMap::new());
        assert_eq!(Fence::of(&n), Fence::Seal(None));
        n.metadata.annotations = Some(BTreeMap::from([(ANNOTATION.into(), "a/1".into())]));
        assert_eq!(Fence::of(&n), Fence::Seal(Some("a/1".into())));
    }

    #[test]
    fn a_write_tests_the_fence_before_it_annotates() {
        let ops = Fence::Seal(Some("a/1".into())).test_then_annotate("nodeipam.io/config", "c");
        assert_eq!(
            ops,
            vec![
                serde_json::json!({"op": "test", "path": "/metadata/annotations/nodeipam.io~1sealed-by", "value": "a/1"}),
                serde_json::json!({"op": "add", "path": "/metadata/annotations/nodeipam.io~1config", "value": "c"}),
            ]
        );
        // An absent seal is tested as null, which a missing key passes and any value fails.
        let ops = Fence::Seal(None).test_then_annotate("k", "v");
        assert_eq!(ops[0]["value"], serde_json::Value::Null);
        let ops = Fence::Bare.test_then_annotate("k", "v");
        assert_eq!(ops[0]["path"], "/metadata/annotations");
        assert_eq!(ops[1]["value"], serde_json::json!({"k": "v"}));
    }

    #[test]
    fn every_seal_writes_a_new_value() {
        assert_ne!(value("a_1", 1), value("a_1", 2));
        assert!(value("a_1", 1).starts_with("a_1/"));
    }

    #[test]
    fn a_seal_is_done_only_once_listed_and_every_node_settled() {
        assert!(
            !done(None),
            "the list failed: nothing is known to be sealed"
        );
        assert!(!done(Some(1)));
        assert!(done(Some(0)));
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
