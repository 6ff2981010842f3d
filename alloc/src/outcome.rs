//! What to do with a node's blocks once a podCIDR write has an outcome: confirm, adopt what the
//! node carries instead, release, retry, or leak. Pure: no client.
//!
//! podCIDRs are immutable once set and every write tests the Node's UID first, so a write can
//! only ever land on the object it was meant for. Blocks are released only when the
//! outcome proves they are not on that object; everything doubtful keeps them reserved.

use ipnet::IpNet;

use crate::seal::Fence;

/// What the API server said about the patch.
#[derive(Clone, Debug, PartialEq)]
pub enum WriteOutcome {
    /// The patch returned the Node; these are its podCIDRs now.
    Applied {
        uid: Option<String>,
        cidrs: Vec<IpNet>,
    },
    /// The Node does not exist (404 on the patch): nothing was written.
    Missing,
    /// The server refused the patch (a 4xx such as 400 or 422): nothing was written. A 422 is
    /// also how a JSON patch's failed test is answered: the Node is another object, or was
    /// sealed since ([`refused_the_blocks`] tells the two apart by the Node as read again).
    Rejected { reason: String, now: NodeNow },
    /// A conflict (409) the API server did not resolve by itself: nothing was written, and the
    /// next attempt is sent on the Node as read again.
    Conflict { reason: String, now: NodeNow },
    /// Not answered in a way that rules it out (timeout, any 5xx, connection lost: see
    /// [`may_still_land`]): the write may or may not have landed.
    Ambiguous { reason: String, now: NodeNow },
    /// The server throttled the request (429) before doing anything.
    Throttled,
    /// Refused before it was sent (the term ended or a hand-over began while it waited for
    /// its turn): it cannot land, whatever time it took.
    NotSent { reason: String },
}

/// Whether a mutating request answered with `status` (`None`: no answer at all, as a timeout
/// or a lost connection) may still change the object later. The one rule for "this write can
/// no longer land", shared by the writers and the leader's hand-over.
///
/// Any 5xx may: a 500 can carry an etcd timeout whose proposal still commits, and a 502, 503
/// or 504 can come from a proxy or the API server's own timeout filter while the handler
/// behind it runs on. A 2xx landed; a 4xx was refused before storage was touched (a 429 by
/// API Priority and Fairness before the request was handled at all).
pub fn may_still_land(status: Option<u16>) -> bool {
    match status {
        None => true,
        Some(code) => !(200..500).contains(&code),
    }
}

/// What a node write's answer means (`None`: none came).
pub fn classify(status: Option<u16>) -> Answer {
    match status {
        Some(code) if (200..300).contains(&code) => Answer::Applied,
        Some(404) => Answer::Missing,
        Some(409) => Answer::Conflict,
        Some(429) => Answer::Throttled,
        s if may_still_land(s) => Answer::Ambiguous,
        _ => Answer::Rejected,
    }
}

/// The kinds of answer a podCIDR write can get, by [`classify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Applied,
    Missing,
    Throttled,
    /// 409: the object changed under a precondition the write carried.
    Conflict,
    Rejected,
    Ambiguous,
}

/// A fresh GET of the Node after a failed patch.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeNow {
    Has {
        uid: Option<String>,
        cidrs: Vec<IpNet>,
    },
    Empty {
        uid: Option<String>,
        /// Its seal: the precondition of the next write.
        fence: Fence,
    },
    Gone,
    Unknown(String),
}

/// Whether a write's answer refused the blocks themselves (an admission policy, a 403, an
/// invalid value), as opposed to its preconditions: a 422 whose Node, read again, is another
/// object or carries another seal than the write tested was the fence doing its work, and
/// the next attempt goes on the Node as read. Only refusals count toward giving up.
pub fn refused_the_blocks(outcome: &WriteOutcome, uid: Option<&str>, fence: &Fence) -> bool {
    match outcome {
        WriteOutcome::Rejected {
            now:
                NodeNow::Empty {
                    uid: now_uid,
                    fence: now_fence,
                },
            ..
        } => now_fence == fence && (uid.is_none() || now_uid.as_deref() == uid),
        WriteOutcome::Rejected { .. } => true,
        _ => false,
    }
}

/// The decision for the allocation state.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// The blocks are on the node.
    Confirm { uid: Option<String> },
    /// The node carries other podCIDRs: adopt them; ours never landed and are freed.
    Adopt {
        uid: Option<String>,
        cidrs: Vec<IpNet>,
    },
    /// The blocks are definitely not on the node: free them.
    Release,
    /// Write the same blocks again later.
    Retry,
    /// It cannot be known whether the blocks landed: keep them occupied.
    Leak,
}

/// Decides for a write of `ours` to the node with `uid` (when known). `was_ambiguous` is true
/// when an earlier attempt for the same blocks had an ambiguous outcome.
pub fn decide(
    outcome: &WriteOutcome,
    ours: &[IpNet],
    uid: Option<&str>,
    was_ambiguous: bool,
) -> Decision {
    match outcome {
        WriteOutcome::Applied { uid, cidrs } => from_node(ours, uid.clone(), cidrs),
        // Without the UID precondition an earlier doubtful write could still land on a
        // recreated node of the same name; with it, nothing can land anywhere any more.
        WriteOutcome::Missing if uid.is_none() && was_ambiguous => Decision::Leak,
        WriteOutcome::Missing => Decision::Release,
        WriteOutcome::Throttled | WriteOutcome::NotSent { .. } => Decision::Retry,
        WriteOutcome::Rejected { now, .. }
        | WriteOutcome::Conflict { now, .. }
        | WriteOutcome::Ambiguous { now, .. } => {
            let ambiguous = was_ambiguous || matches!(outcome, WriteOutcome::Ambiguous { .. });
            match now {
                NodeNow::Has { uid, cidrs } => from_node(ours, uid.clone(), cidrs),
                // Same object, still empty: the write did not land (yet); writing the same
                // blocks again is idempotent.
                NodeNow::Empty { uid: now_uid, .. }
                    if uid.is_none() || now_uid.as_deref() == uid =>
                {
                    Decision::Retry
                }
                // A new object of the same name: the UID precondition keeps our write off it.
                NodeNow::Empty { .. } => Decision::Release,
                NodeNow::Gone if uid.is_none() && ambiguous => Decision::Leak,
                NodeNow::Gone => Decision::Release,
                NodeNow::Unknown(_) => Decision::Retry,
            }
        }
    }
}

fn from_node(ours: &[IpNet], uid: Option<String>, cidrs: &[IpNet]) -> Decision {
    if cidrs == ours {
        Decision::Confirm { uid }
    } else if cidrs.is_empty() {
        Decision::Retry
    } else {
        Decision::Adopt {
            uid,
            cidrs: cidrs.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_that_rules_it_out_ends_a_write() {
        for code in [500, 502, 503, 504, 599] {
            assert!(may_still_land(Some(code)), "{code}");
            assert_eq!(classify(Some(code)), Answer::Ambiguous, "{code}");
        }
        assert!(may_still_land(None), "no answer");
        assert_eq!(classify(None), Answer::Ambiguous);
        for code in [200, 201, 400, 403, 404, 409, 422, 429] {
            assert!(!may_still_land(Some(code)), "{code}");
        }
        assert_eq!(classify(Some(200)), Answer::Applied);
        assert_eq!(classify(Some(404)), Answer::Missing);
        assert_eq!(classify(Some(429)), Answer::Throttled);
        assert_eq!(classify(Some(409)), Answer::Conflict);
        for code in [400, 403, 422] {
            assert_eq!(classify(Some(code)), Answer::Rejected, "{code}");
        }
    }

    fn n(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn decision_table() {
        let ours = vec![n("10.0.0.0/24")];
        let theirs = vec![n("10.9.0.0/24")];
        let u = Some("u1");
        let has = |c: &Vec<IpNet>| NodeNow::Has {
            uid: Some("u1".into()),
            cidrs: c.clone(),
        };
        let amb = |now| WriteOutcome::Ambiguous {
            reason: "timeout".into(),
            now,
        };
        let rej = |now| WriteOutcome::Rejected {
            reason: "422".into(),
            now,
        };
        let cases = vec![
            (
                WriteOutcome::Applied {
                    uid: Some("u1".into()),
                    cidrs: ours.clone(),
                },
                u,
                false,
                Decision::Confirm {
                    uid: Some("u1".into()),
                },
            ),
            (
                WriteOutcome::Applied {
                    uid: None,
                    cidrs: theirs.clone(),
                },
                u,
                false,
                Decision::Adopt {
                    uid: None,
                    cidrs: theirs.clone(),
                },
            ),
            (WriteOutcome::Missing, u, true, Decision::Release),
            (WriteOutcome::Missing, None, true, Decision::Leak),
            (WriteOutcome::Missing, None, false, Decision::Release),
            (WriteOutcome::Throttled, u, false, Decision::Retry),
            (
                WriteOutcome::NotSent {
                    reason: "not sent: this replica's term is over".into(),
                },
                u,
                true,
                Decision::Retry,
            ),
            (
                rej(has(&theirs)),
                u,
                false,
                Decision::Adopt {
                    uid: Some("u1".into()),
                    cidrs: theirs.clone(),
                },
            ),
            (
                amb(has(&ours)),
                u,
                false,
                Decision::Confirm {
                    uid: Some("u1".into()),
                },
            ),
            (
                amb(NodeNow::Empty {
                    uid: Some("u1".into()),
                    fence: Fence::default(),
                }),
                u,
                false,
                Decision::Retry,
            ),
            (
                amb(NodeNow::Empty {
                    uid: Some("u2".into()),
                    fence: Fence::default(),
                }),
                u,
                false,
                Decision::Release,
            ),
            (
                WriteOutcome::Conflict {
                    reason: "409".into(),
                    now: NodeNow::Empty {
                        uid: Some("u1".into()),
                        fence: Fence::Seal(Some("b/1".into())),
                    },
                },
                u,
                false,
                Decision::Retry,
            ),
            (
                WriteOutcome::Conflict {
                    reason: "409".into(),
                    now: has(&theirs),
                },
                u,
                true,
                Decision::Adopt {
                    uid: Some("u1".into()),
                    cidrs: theirs.clone(),
                },
            ),
            (amb(NodeNow::Gone), u, false, Decision::Release),
            (amb(NodeNow::Gone), None, false, Decision::Leak),
            (rej(NodeNow::Gone), None, false, Decision::Release),
            (rej(NodeNow::Gone), None, true, Decision::Leak),
            (
                amb(NodeNow::Unknown("eof".into())),
                u,
                false,
                Decision::Retry,
            ),
        ];
        for (i, (outcome, uid, was, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                decide(&outcome, &ours, uid, was),
                want,
                "case {i}: {outcome:?}"
            );
        }
    }

    #[test]
    fn a_failed_test_of_the_fence_is_no_refusal_of_the_blocks() {
        let sealed = Fence::Seal(Some("b/1".into()));
        let rejected = |uid: &str, fence: Fence| WriteOutcome::Rejected {
            reason: "422".into(),
            now: NodeNow::Empty {
                uid: Some(uid.into()),
                fence,
            },
        };
        // Read again: the seal is still what the write tested, so the 422 was about the blocks.
        assert!(refused_the_blocks(
            &rejected("u1", sealed.clone()),
            Some("u1"),
            &sealed
        ));
        // Sealed since, or another object: the tests failed, not the blocks.
        assert!(!refused_the_blocks(
            &rejected("u1", Fence::Seal(Some("c/2".into()))),
            Some("u1"),
            &sealed
        ));
        assert!(!refused_the_blocks(
            &rejected("u2", sealed.clone()),
            Some("u1"),
            &sealed
        ));
        assert!(!refused_the_blocks(
            &rejected("u1", Fence::Bare),
            Some("u1"),
            &Fence::Seal(None)
        ));
        // Not read again: counted as a refusal, as before.
        let unknown = WriteOutcome::Rejected {
            reason: "403".into(),
            now: NodeNow::Unknown("timeout".into()),
        };
        assert!(refused_the_blocks(&unknown, Some("u1"), &sealed));
        assert!(!refused_the_blocks(
            &WriteOutcome::Throttled,
            Some("u1"),
            &sealed
        ));
    }
}
