//! End-to-end: etcd restored from a backup older than what the controller saw (issue 45,
//! item 6). The nodes that got blocks after the backup lose them in etcd while their hosts
//! still use them; a controller that went on allocating would hand those blocks out again.
//! It must find, at its next relist, that storage went back in time, stop allocating, and
//! say so (the metric, a Warning event, `kubectl nodeipam status`), as docs/runbooks.md
//! describes. Two restores: the data folder as it was (revisions go back, as a snapshot
//! restored without `--bump-revision`), and `etcdutl snapshot restore --bump-revision
//! --mark-compacted` (the revision moves on, every watch must relist, and each object keeps
//! the version it had in the backup).

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use nodeipam_controller::reconcile::Options;
use nodeipam_testenv::{ControlPlane, default_etcdutl_path};
use support::*;

/// How long the nodes created after the restore are watched for a podCIDR that must not come.
const NO_BLOCK_FOR: Duration = Duration::from_secs(15);

/// A label write on `name`: what a kubelet's status updates do to every Node all the time,
/// so that a surviving node has a version after the backup.
async fn touch(c: &Client, name: &str) {
    let patch = serde_json::json!({ "metadata": { "labels": { "touched": "after-backup" } } });
    Api::<Node>::all(c.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("label node {name}: {e}"));
}

/// The cluster up to the restore: a config of four blocks, a0 and a1 given theirs before the
/// backup (returned: its folder), b0 and b1 the other two after it (returned: their blocks),
/// a0 touched and the config's status written after it too.
async fn before_the_restore(cp: &mut ControlPlane) -> (Controller, PathBuf, BTreeSet<String>) {
    let c = cp.client();
    let ctl = start_controller(c.clone(), Options::default());
    create_ready_config(&c, "tight", spec(family("10.61.0.0/28", 30), None, None)).await;
    for name in ["a0", "a1"] {
        create_node(&c, name, &[]).await;
        wait_cidrs(&c, name).await;
    }

    let backup = cp.dir().join("etcd-backup");
    cp.backup_etcd(&backup)
        .await
        .unwrap_or_else(|e| panic!("back up etcd: {e}"));

    let mut lost = BTreeSet::new();
    for name in ["b0", "b1"] {
        create_node(&c, name, &[]).await;
        lost.extend(wait_cidrs(&c, name).await);
    }
    touch(&c, "a0").await;
    // The config's status counts four blocks now: our own write after the backup.
    wait_for("the status to count the four blocks", || async {
        get_config(&c, "tight")
            .await
            .and_then(|cfg| cfg.status?.ipv4)
            .filter(|f| f.allocated == 4)
    })
    .await;
    (ctl, backup, lost)
}

/// Waits up to `limit` for the controller to find that storage went back; how long it took.
async fn wait_found(ctl: &Controller, limit: Duration) -> Option<Duration> {
    let began = Instant::now();
    while began.elapsed() < limit {
        if ctl.metrics.storage_went_back.get() == 1 {
            return Some(began.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// After the restore: b0 and b1 are gone from the API, their blocks still in use on their
/// hosts. New nodes must get nothing, and the controller says why.
async fn after_the_restore(cp: &ControlPlane, ctl: &Controller, lost: &BTreeSet<String>) {
    let c = cp.client();
    for name in ["c0", "c1"] {
        create_node(&c, name, &[]).await;
    }
    let began = Instant::now();
    while began.elapsed() < NO_BLOCK_FOR {
        for name in ["c0", "c1"] {
            let cidrs = get_node(&c, name).await.map(|n| pod_cidrs(&n));
            let cidrs = cidrs.unwrap_or_default();
            let reused: Vec<&String> = cidrs.iter().filter(|b| lost.contains(*b)).collect();
            assert!(
                reused.is_empty(),
                "{name} got {reused:?}, blocks b0/b1 held before the restore ({lost:?})"
            );
            assert!(
                cidrs.is_empty(),
                "{name} got {cidrs:?} after storage went back in time"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        ctl.metrics.storage_went_back.get(),
        1,
        "nodeipam_storage_went_back says why nothing is allocated"
    );
    // About the first object found older: a0 (touched) or the config (its status).
    wait_for("a StorageWentBack event on a0 or tight", || async {
        let mut found = events_for(&c, "a0", "StorageWentBack").await;
        found.extend(events_for(&c, "tight", "StorageWentBack").await);
        found.into_iter().next()
    })
    .await;
    // `kubectl nodeipam status` says it first.
    let status = support::process::plugin(cp, &["status"]).await;
    assert!(
        status
            .out
            .starts_with("ALLOCATION STOPPED: the API's storage went back in time"),
        "kubectl nodeipam status:\n{}\n{}",
        status.out,
        status.err
    );
    assert_invariant(&c, &[]).await;
}

#[tokio::test]
async fn a_restored_etcd_older_than_what_the_controller_saw_stops_allocation() {
    let mut cp = control_plane().await;
    let (ctl, backup, lost) = before_the_restore(&mut cp).await;
    cp.restore_etcd(&backup)
        .await
        .unwrap_or_else(|e| panic!("restore etcd from the backup: {e}"));
    let c = cp.client();
    assert!(
        get_node(&c, "b0").await.is_none() && get_node(&c, "b1").await.is_none(),
        "the restore brought back the nodes created after the backup"
    );
    // The watches resume from the versions they had and are not made to relist (seen: none
    // within 10 s). A restore makes the leader's Lease go back too; a leader that loses it
    // and takes it again relists everything: make that new term.
    let found = wait_found(&ctl, Duration::from_secs(10)).await;
    eprintln!("found before a new term: {found:?}");
    ctl.leadership.send_replace(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctl.leadership.send_replace(true);
    after_the_restore(&cp, &ctl, &lost).await;
}

/// The restore the runbook asks for: the watches are told to relist (410 Gone), and the
/// relist shows a0 and the config at the versions they had in the backup. Found without a
/// new term.
#[tokio::test]
async fn a_snapshot_restored_with_bumped_revisions_is_found_at_the_forced_relist() {
    let etcdutl = default_etcdutl_path();
    assert!(
        etcdutl.is_file(),
        "step=locate-etcdutl: no etcdutl at {}: run `hack/etcdutl.sh build` (hack/test.sh \
         does), or set NODEIPAM_ETCDUTL",
        etcdutl.display()
    );
    let mut cp = control_plane().await;
    let (ctl, backup, lost) = before_the_restore(&mut cp).await;
    let c = cp.client();
    let version = |n: Option<Node>| -> u64 {
        let rv = n.and_then(|n| n.metadata.resource_version);
        rv.and_then(|v| v.parse().ok())
            .expect("a0's resourceVersion")
    };
    let seen = version(get_node(&c, "a0").await);
    cp.restore_etcd_with(
        &backup,
        &etcdutl,
        &["--bump-revision=1000000", "--mark-compacted"],
    )
    .await
    .unwrap_or_else(|e| panic!("etcdutl snapshot restore --bump-revision: {e}"));
    let restored = version(get_node(&c, "a0").await);
    assert!(
        restored < seen,
        "a0 is back at the version of the backup ({restored}), older than seen ({seen})"
    );
    assert!(get_node(&c, "b0").await.is_none(), "b0 is gone");
    let found = wait_found(&ctl, Duration::from_secs(30)).await;
    assert!(
        found.is_some(),
        "not found within 30 s of a restore with --mark-compacted"
    );
    after_the_restore(&cp, &ctl, &lost).await;
}
