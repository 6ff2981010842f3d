//! The machine's handlers in the orders the simulator found wrong once, each kept as a case.

use super::*;

#[test]
fn a_node_object_re_created_with_the_same_pod_cidrs_takes_over_the_record() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-old", &[], &["10.0.0.0/30"]))),
    );
    // The old object's delete fell between two lists; the relist shows the new one.
    m.handle(at(2), Input::Node(Watch::ListStart));
    m.handle(
        at(2),
        Input::Node(Watch::Listed(node("a", "u-new", &[], &["10.0.0.0/30"]))),
    );
    m.handle(at(2), Input::Node(Watch::ListDone));
    m.handle(
        at(3),
        Input::Node(Watch::Deleted(node("a", "u-new", &[], &["10.0.0.0/30"]))),
    );
    assert_eq!(
        m.ipam().node_count(),
        0,
        "the new object's delete frees the block"
    );
}

#[test]
fn a_failed_re_read_is_asked_again_later() {
    let (mut m, _) = synced(options(false));
    m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &["192.168.0.0/24"]))),
    );
    m.handle(at(2), Input::Node(Watch::ListStart));
    m.handle(at(2), Input::Node(Watch::ListDone));
    let unknown = Input::Reread {
        node: "a".into(),
        uid: Some("u-a".into()),
        now: NodeNow::Unknown("timeout".into()),
    };
    m.handle(at(2), unknown);
    let rereads = |out: &[Effect]| {
        out.iter()
            .filter(|e| matches!(e, Effect::Reread { .. }))
            .count()
    };
    assert_eq!(rereads(&m.handle(at(3), Input::Tick)), 0, "not at once");
    assert_eq!(rereads(&m.handle(at(8), Input::Tick)), 1, "asked again");
}

#[test]
fn a_config_whose_finalizer_request_came_to_nothing_is_asked_again() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(false))));
    // Done, but on an object deleted and created again meanwhile.
    m.handle(
        at(1),
        Input::ConfigWritten(ConfigJob::AddFinalizer {
            name: "pool".into(),
        }),
    );
    let out = m.handle(at(2), Input::Tick);
    assert!(
        matches!(config_jobs(&out)[..], [ConfigJob::AddFinalizer { .. }, ..]),
        "{out:?}"
    );
}

#[test]
fn a_service_cidr_update_that_frees_blocks_serves_the_waiting_nodes() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let all = service_cidr("s", &["10.0.0.0/29"]);
    m.handle(at(1), Input::Service(Watch::Applied(all)));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(writes(&out).is_empty());
    let out = m.handle(
        at(2),
        Input::Service(Watch::Applied(service_cidr("s", &["10.0.0.0/30"]))),
    );
    assert_eq!(writes(&out)[0].cidrs, vec![net("10.0.0.4/30")]);
}

#[test]
fn a_landed_status_that_says_drained_holds_allocation_until_a_later_one_lands() {
    let (mut m, _) = synced(options(false));
    let mut disabled = pool(true);
    disabled.spec.allocation = AllocationSwitch::Disabled;
    m.handle(at(1), Input::Config(Watch::Applied(disabled)));
    let out = m.handle(at(1), Input::Tick);
    let drained = config_jobs(&out)
        .into_iter()
        .find(|j| matches!(j, ConfigJob::Status { .. }))
        .cloned()
        .expect("a Drained status");
    // Enabled again; the Drained status lands before the watch shows it.
    let mut enabled = pool(true);
    enabled.metadata.generation = Some(3);
    m.handle(at(2), Input::Config(Watch::Applied(enabled)));
    m.handle(at(2), Input::ConfigWritten(drained));
    let out = m.handle(
        at(2),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(
        writes(&out).is_empty(),
        "allocated under a status that says Drained"
    );
    let out = m.handle(at(3), Input::Tick);
    let undrained = config_jobs(&out)
        .into_iter()
        .find(|j| matches!(j, ConfigJob::Status { .. }))
        .cloned()
        .expect("a status that is no longer Drained");
    let out = m.handle(at(3), Input::ConfigWritten(undrained));
    assert_eq!(writes(&out).len(), 1, "{out:?}");
}

#[test]
fn a_publication_in_flight_that_lacks_a_range_keeps_its_gate_closed() {
    let (mut m, _) = synced(options(true));
    let out = m.handle(at(1), Input::Config(Watch::Applied(pool(true))));
    let with = out
        .iter()
        .find_map(|e| match e {
            Effect::Publish(n) => Some(n.clone()),
            _ => None,
        })
        .expect("published");
    // The config goes; a network without it is sent; a same-named config comes back before
    // that network landed, and the watch still shows the older one that had the range.
    let out = m.handle(at(2), Input::Config(Watch::Deleted(pool(true))));
    assert!(out.iter().any(|e| matches!(e, Effect::Publish(_))));
    m.handle(at(3), Input::Config(Watch::Applied(pool(true))));
    let stale = configmap(
        "nodeipam-system",
        "pod-network",
        with.configmap_data("then"),
    );
    m.handle(at(3), Input::Output(0, Watch::Applied(stale)));
    let out = m.handle(
        at(3),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(
        writes(&out).is_empty(),
        "allocated on a stale view of the pod network"
    );
}

#[test]
fn a_node_waiting_behind_a_gate_is_warned_only_after_the_grace() {
    let (mut m, _) = synced(options(false));
    m.handle(at(1), Input::Config(Watch::Applied(pool(false))));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(reasons(&out).is_empty(), "warned at once: {out:?}");
    let grace = GATE_GRACE.as_secs();
    let out = m.handle(at(grace), Input::Tick);
    assert!(reasons(&out).is_empty(), "warned before the grace: {out:?}");
    let out = m.handle(at(1 + grace), Input::Tick);
    assert_eq!(reasons(&out), vec![effects::CIDR_NOT_AVAILABLE]);
    let out = m.handle(at(2 + grace), Input::Tick);
    assert!(reasons(&out).is_empty(), "warned twice: {out:?}");
    // The gate opens after all: the node is served.
    let out = m.handle(at(3 + grace), Input::Config(Watch::Applied(pool(true))));
    assert_eq!(writes(&out).len(), 1);
}

#[test]
fn a_node_no_config_selects_is_warned_at_once() {
    let (mut m, _) = synced(options(false));
    // A config exists, for other nodes: a node none selects is misconfigured, not early.
    let other = config(
        "other",
        "c2",
        1,
        (Some(("10.8.0.0/16", 24)), None),
        Some(crate::fixtures::selecting("zone", "elsewhere")),
        true,
    );
    m.handle(at(0), Input::Config(Watch::Applied(other)));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert_eq!(reasons(&out), vec![effects::CIDR_NOT_AVAILABLE]);
}

#[test]
fn before_the_first_config_nodes_are_warned_only_after_the_grace() {
    let (mut m, _) = synced(options(false));
    let out = m.handle(
        at(1),
        Input::Node(Watch::Applied(node("a", "u-a", &[], &[]))),
    );
    assert!(reasons(&out).is_empty(), "warned at once: {out:?}");
    let grace = GATE_GRACE.as_secs();
    let out = m.handle(at(1 + grace), Input::Tick);
    assert_eq!(reasons(&out), vec![effects::CIDR_NOT_AVAILABLE]);
}
