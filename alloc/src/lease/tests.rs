use super::*;

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Microseconds since the epoch of second `s` of a day in 2027.
fn at(s: i64) -> i64 {
    (1_800_000_000 + s) * 1_000_000
}

fn lease(holder: Option<&str>, renewed: Option<i64>, duration: Option<u64>) -> LeaseView {
    LeaseView {
        version: "7".into(),
        holder: holder.map(str::to_string),
        renewed: renewed.map(at),
        duration: duration.map(secs),
        ..LeaseView::default()
    }
}

fn marked(holder: Option<&str>, mark: Option<Mark>) -> LeaseView {
    LeaseView {
        mark,
        ..lease(holder, None, None)
    }
}

#[test]
fn ours_is_renewed_anothers_is_waited_for_until_seen_unchanged_a_free_one_is_taken() {
    assert_eq!(decide(None, "me", secs(0)), Step::Missing);
    let mine = lease(Some("me"), Some(95), Some(15));
    assert_eq!(decide(Some(&mine), "me", secs(0)), Step::Renew);
    assert_eq!(
        decide(Some(&lease(Some("me"), Some(10), Some(15))), "me", secs(99)),
        Step::Renew,
        "ours, expired: nobody took it since"
    );
    let theirs = lease(Some("b"), Some(95), Some(15));
    assert_eq!(decide(Some(&theirs), "me", secs(0)), Step::Wait(secs(15)));
    assert_eq!(decide(Some(&theirs), "me", secs(11)), Step::Wait(secs(4)));
    assert_eq!(
        decide(Some(&theirs), "me", secs(15)),
        Step::Take,
        "unchanged for a whole duration"
    );
    assert_eq!(
        decide(Some(&lease(Some("b"), None, Some(15))), "me", secs(0)),
        Step::Take,
        "a holder without times holds nothing"
    );
    assert_eq!(
        decide(Some(&lease(Some(""), Some(95), Some(15))), "me", secs(0)),
        Step::Take
    );
    assert_eq!(
        decide(Some(&lease(None, None, None)), "me", secs(0)),
        Step::Take
    );
    assert_eq!(
        decide(Some(&LeaseView::default()), "me", secs(0)),
        Step::Take
    );
}

#[test]
fn a_renewal_time_far_in_the_past_is_not_an_expiry() {
    // The holder's clock is an hour behind ours (or ours an hour ahead: an NTP step, a VM
    // resumed): its fresh renewal reads as long expired by any wall clock. Only how long we
    // have seen this version counts.
    let skewed = lease(Some("b"), Some(-3600), Some(15));
    assert_eq!(decide(Some(&skewed), "me", secs(1)), Step::Wait(secs(14)));
}

#[test]
fn a_take_of_a_lease_without_a_holder_takes_it_free() {
    assert_eq!(took(&lease(None, None, None)), Took::Free);
    assert_eq!(took(&lease(Some(""), None, None)), Took::Free);
    assert_eq!(took(&lease(Some("b"), Some(0), Some(15))), Took::Expired);
}

#[test]
fn a_version_counts_from_the_first_answer_that_showed_it() {
    let t0 = secs(1000);
    let mut u = Unchanged::default();
    let mut l = lease(Some("b"), Some(0), Some(15));
    assert_eq!(u.note(Some(&l), t0), secs(0));
    assert_eq!(u.note(Some(&l), t0 + secs(5)), secs(5));
    // A renewal (a new version) starts the count again.
    l.version = "8".into();
    assert_eq!(u.note(Some(&l), t0 + secs(6)), secs(0));
    assert_eq!(u.note(Some(&l), t0 + secs(9)), secs(3));
    // Gone and back in the same version: counted afresh.
    assert_eq!(u.note(None, t0 + secs(10)), secs(0));
    assert_eq!(u.note(Some(&l), t0 + secs(11)), secs(0));
    // An answer that reads earlier than the first (it cannot, on one clock) counts nothing.
    assert_eq!(u.note(Some(&l), t0), secs(0));
}

#[test]
fn held_only_while_claimed_ours_and_more_than_a_margin_before_our_term_ends() {
    let (end, margin) = (Some(secs(104)), secs(1));
    assert!(holds(true, true, end, margin, secs(100)));
    assert!(holds(true, true, end, margin, secs(102)));
    assert!(
        !holds(true, true, end, margin, secs(103)),
        "steps down a margin before our term ends"
    );
    assert!(!holds(true, true, end, margin, secs(200)));
    assert!(!holds(false, true, end, margin, secs(100)), "not claimed");
    assert!(!holds(true, false, end, margin, secs(100)), "not ours");
    assert!(!holds(true, true, None, margin, secs(100)), "no term");
    assert!(holds(true, true, end, Duration::ZERO, secs(103)));
    assert!(!holds(true, true, end, Duration::ZERO, secs(104)));
}

#[test]
fn ours_only_naming_us_with_a_term_and_not_being_deleted() {
    let mine = lease(Some("me"), Some(0), Some(4));
    assert!(ours(&mine, "me"));
    assert!(!ours(&mine, "other"));
    assert!(!ours(&lease(Some("me"), None, Some(4)), "me"), "untimed");
    assert!(!ours(&lease(Some("me"), Some(0), None), "me"), "untimed");
    let deleted = LeaseView {
        terminating: true,
        ..mine
    };
    assert!(!ours(&deleted, "me"));
}

#[test]
fn only_a_settled_mark_on_a_lease_we_hold_is_a_clean_takeover() {
    let expired = Some(Took::Expired);
    let free = Some(Took::Free);
    for took in [None, free, expired] {
        assert_eq!(
            takeover(&marked(Some("b"), Some(Mark::Settled)), "b", took),
            Takeover::Clean
        );
    }
    assert_eq!(
        takeover(&marked(Some("a"), Some(Mark::Settled)), "b", free),
        Takeover::Unknown,
        "a mark left for another replica vouches for nothing"
    );
    assert_eq!(
        takeover(&marked(None, Some(Mark::Settled)), "b", free),
        Takeover::Unknown
    );
    assert_eq!(
        takeover(&LeaseView::default(), "b", None),
        Takeover::Unknown
    );
}

#[test]
fn a_predecessor_stopped_only_if_its_term_ran_out_or_it_said_so() {
    assert_eq!(
        takeover(&marked(Some("b"), None), "b", Some(Took::Expired)),
        Takeover::Unclean
    );
    assert_eq!(
        takeover(
            &marked(Some("b"), Some(Mark::Stopped)),
            "b",
            Some(Took::Free)
        ),
        Takeover::Unclean
    );
    // Free without a word: created after a deletion, or freed by hand.
    assert_eq!(
        takeover(&marked(Some("b"), None), "b", Some(Took::Free)),
        Takeover::Unknown
    );
    // Found naming us without having taken it (written by hand).
    assert_eq!(
        takeover(&marked(Some("b"), None), "b", None),
        Takeover::Unknown
    );
}

#[test]
fn the_wait_covers_what_the_predecessor_may_still_do() {
    let (delay, term) = (secs(4), secs(15));
    assert_eq!(wait(Takeover::Clean, true, delay, term), Duration::ZERO);
    assert_eq!(wait(Takeover::Unclean, true, delay, term), delay);
    assert_eq!(wait(Takeover::Unknown, true, delay, term), term + delay);
    // Nothing was ever allocated from any range: nothing to wait for.
    for took in [Takeover::Clean, Takeover::Unclean, Takeover::Unknown] {
        assert_eq!(wait(took, false, delay, term), Duration::ZERO);
    }
}

#[test]
fn a_released_lease_says_stopped_unless_it_said_settled() {
    assert_eq!(release_mark(None, true), Some(Mark::Stopped));
    assert_eq!(release_mark(Some(Mark::Stopped), true), Some(Mark::Stopped));
    assert_eq!(release_mark(Some(Mark::Settled), true), Some(Mark::Settled));
}

#[test]
fn a_holder_that_never_led_lets_the_lease_go_saying_nothing_new() {
    // Renamed to us by hand under a live leader: nothing says that leader stopped.
    assert_eq!(release_mark(None, false), None);
    assert_eq!(
        release_mark(Some(Mark::Stopped), false),
        Some(Mark::Stopped)
    );
    assert_eq!(
        release_mark(Some(Mark::Settled), false),
        Some(Mark::Settled)
    );
}

fn being_deleted(view: LeaseView, finalized: bool) -> LeaseView {
    LeaseView {
        terminating: true,
        finalized,
        ..view
    }
}

#[test]
fn only_the_holder_or_anyone_of_an_unheld_lease_releases_it_and_only_while_it_is_deleted() {
    assert!(releasable(
        &being_deleted(marked(Some("b"), None), true),
        "b"
    ));
    assert!(releasable(&being_deleted(marked(None, None), true), "b"));
    assert!(releasable(
        &being_deleted(marked(Some(""), None), true),
        "b"
    ));
    // A live holder's writes are its own to wait out.
    assert!(!releasable(
        &being_deleted(marked(Some("a"), None), true),
        "b"
    ));
    // Not being deleted: the finalizer stays for the next leader to see.
    let held = LeaseView {
        finalized: true,
        ..marked(Some("b"), None)
    };
    assert!(!releasable(&held, "b"));
    // Nothing of ours to take off.
    assert!(!releasable(
        &being_deleted(marked(Some("b"), None), false),
        "b"
    ));
}

#[test]
fn the_next_lease_is_settled_only_after_one_we_held_and_led_on_up_to_its_deletion() {
    let ours = being_deleted(marked(Some("b"), None), true);
    assert_eq!(next_mark(&ours, "b", true, true), Some(Mark::Settled));
    // We led, but a write of ours went without an answer that rules it out: it may land
    // after the settle.
    assert_eq!(next_mark(&ours, "b", true, false), None);
    // We took it and never led on it (our take-over wait was not over, or it was renamed to
    // us by hand): whoever it displaced may still send until its term ends.
    assert_eq!(next_mark(&ours, "b", false, true), None);
    // Freed by hand before it was deleted: the leader the edit displaced may still send.
    for holder in [None, Some("")] {
        let free = being_deleted(marked(holder, None), true);
        assert!(releasable(&free, "b"), "any replica lets it go");
        assert_eq!(next_mark(&free, "b", true, true), None, "{holder:?}");
        assert_eq!(next_mark(&free, "b", false, true), None, "{holder:?}");
    }
    // Renamed to another: not ours to vouch for (nor to let go).
    let theirs = being_deleted(marked(Some("a"), None), true);
    assert_eq!(next_mark(&theirs, "b", true, true), None);
    // A mark on the Lease let go vouches for nothing about the next one.
    let marked_free = being_deleted(marked(None, Some(Mark::Settled)), true);
    assert_eq!(next_mark(&marked_free, "b", true, true), None);
}

#[test]
fn a_lease_is_claimed_only_by_its_holder_and_not_while_it_is_deleted() {
    assert_eq!(unclaimable(&marked(Some("b"), None), "b"), None);
    assert_eq!(
        unclaimable(&marked(Some("b"), Some(Mark::Settled)), "b"),
        None
    );
    let taken = Some("the lease names another holder");
    assert_eq!(unclaimable(&marked(Some("a"), None), "b"), taken);
    assert_eq!(unclaimable(&marked(None, Some(Mark::Settled)), "b"), taken);
    assert_eq!(
        unclaimable(&being_deleted(marked(Some("b"), None), true), "b"),
        Some("the lease is being deleted")
    );
}

#[test]
fn two_processes_of_one_pod_name_have_two_identities() {
    let a = identity("nodeipam-0", "1a2b3c4d");
    let b = identity("nodeipam-0", "5e6f7a8b");
    assert_ne!(a, b);
    assert_eq!(holder_name(&a), "nodeipam-0");
    assert_eq!(holder_name("pod_name_1a2b3c4d"), "pod_name");
    assert_eq!(holder_name("plain"), "plain");
}
