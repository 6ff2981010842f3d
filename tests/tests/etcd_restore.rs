//! End-to-end: etcd restored from a backup older than what the controller saw (issue 45,
//! item 6). The nodes that got blocks after the backup lose them in etcd while their hosts
//! still use them; a controller that went on allocating would hand those blocks out again.
//! It must find, at its next relist, that storage went back in time, stop allocating, and
//! say so (the metric, a Warning event, `kubectl nodeipam status`), as docs/runbooks.md
//! describes.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use nodeipam_controller::reconcile::Options;
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

#[tokio::test]
async fn a_restored_etcd_older_than_what_the_controller_saw_stops_allocation() {
    let mut cp = control_plane().await;
    let c = cp.client();
    let ctl = start_controller(c.clone(), Options::default());
    // Four blocks: a0 and a1 before the backup, b0 and b1 after it.
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

    cp.restore_etcd(&backup)
        .await
        .unwrap_or_else(|e| panic!("restore etcd from the backup: {e}"));
    assert!(
        get_node(&c, "b0").await.is_none() && get_node(&c, "b1").await.is_none(),
        "the restore brought back the nodes created after the backup"
    );

    // A restore makes the leader's Lease go back too; a leader that loses it and takes it
    // again relists everything. Wait a moment for a relist the watches make by themselves,
    // then make that new term, as a restore does sooner or later.
    let began = Instant::now();
    while ctl.metrics.storage_went_back.get() == 0 && began.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "storage_went_back after the restore, before a new term: {} ({:?})",
        ctl.metrics.storage_went_back.get(),
        began.elapsed()
    );
    ctl.leadership.send_replace(false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctl.leadership.send_replace(true);

    // b0's and b1's blocks are still in use on their hosts: the new nodes must get nothing.
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
    let status = support::process::plugin(&cp, &["status"]).await;
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
