//! Carries out the NodeIPAMPools' decisions on the allocation loop's behalf: creates a child
//! NodeIPAMConfig (AlreadyExists is an answer, not an error: the name is deterministic, so a
//! retry or another leader's create finds it; created disabled and awaiting its enable),
//! enables a child at the version the decision saw it at, deletes an empty child with its UID
//! and the version read just before as preconditions, and writes pool statuses with a test of
//! the UID. Creates, enables and deletes are answered once (the allocation loop decides what to ask again); statuses coalesce per pool
//! and are retried.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Error as KubeError};
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_crd::pool::{NodeIPAMPool, NodeIPAMPoolStatus};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::node_writer::backoff;
use super::{Context, MANAGER};
use crate::alloc::effects::{
    ChildConfig, CreateOutcome, DeleteOutcome, EnableChild, EnableOutcome,
};
use crate::alloc::machine::Input;

/// One thing a pool asked for.
#[derive(Clone, Debug)]
pub enum PoolJob {
    Create(ChildConfig),
    Enable(EnableChild),
    Delete {
        name: String,
        uid: Option<String>,
        /// Only while the child, as read just before, still awaits its enable.
        only_awaiting: bool,
    },
    Status {
        name: String,
        uid: Option<String>,
        status: NodeIPAMPoolStatus,
    },
}

pub async fn run(
    ctx: Arc<Context>,
    mut jobs: mpsc::UnboundedReceiver<PoolJob>,
    answers: mpsc::UnboundedSender<Input>,
) {
    // Statuses not yet written, per pool, with how often they failed.
    let mut statuses: BTreeMap<String, (Option<String>, NodeIPAMPoolStatus, u32)> = BTreeMap::new();
    loop {
        let job = if statuses.is_empty() {
            match jobs.recv().await {
                Some(job) => Some(job),
                None => return,
            }
        } else {
            let failed = statuses.values().map(|(_, _, f)| *f).max().unwrap_or(0);
            if failed == 0 {
                jobs.try_recv().ok()
            } else {
                tokio::select! {
                    () = tokio::time::sleep(backoff(failed)) => None,
                    job = jobs.recv() => match job {
                        Some(job) => Some(job),
                        None => return,
                    },
                }
            }
        };
        // Everything queued: creates and deletes in order, only the newest status per pool.
        let mut batch: Vec<PoolJob> = job.into_iter().collect();
        while let Ok(job) = jobs.try_recv() {
            batch.push(job);
        }
        for job in batch {
            match job {
                PoolJob::Create(child) => {
                    let outcome = create(&ctx, &child).await;
                    let _ = answers.send(Input::ConfigCreated {
                        config: child,
                        outcome,
                    });
                }
                PoolJob::Enable(child) => {
                    let outcome = enable(&ctx, &child).await;
                    let _ = answers.send(Input::ConfigEnabled { child, outcome });
                }
                PoolJob::Delete {
                    name,
                    uid,
                    only_awaiting,
                } => {
                    let outcome = delete(&ctx, &name, uid.as_deref(), only_awaiting).await;
                    let _ = answers.send(Input::ConfigDeleted { name, uid, outcome });
                }
                PoolJob::Status { name, uid, status } => {
                    statuses.insert(name, (uid, status, 0));
                }
            }
        }
        for (name, (uid, status, failed)) in std::mem::take(&mut statuses) {
            match write_status(&ctx, &name, uid.as_deref(), &status).await {
                Ok(()) => {}
                Err(e) => {
                    ctx.metrics.reconcile_error("pool_status_write");
                    warn!(pool = %name, error = %e, attempt = failed, "writing a NodeIPAMPool status failed; will retry");
                    statuses.insert(name, (uid, status, failed + 1));
                }
            }
        }
    }
}

async fn create(ctx: &Context, child: &ChildConfig) -> CreateOutcome {
    let api: Api<NodeIPAMConfig> = Api::all(ctx.client.clone());
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    match ctx.write(api.create(&params, &child.object())).await {
        Ok(_) => {
            info!(pool = %child.pool, config = %child.name, "created a child NodeIPAMConfig");
            CreateOutcome::Created
        }
        Err(KubeError::Api(s)) if s.code == 409 && s.reason == "AlreadyExists" => {
            CreateOutcome::AlreadyExists
        }
        Err(e) => {
            ctx.metrics.reconcile_error("config_create");
            CreateOutcome::Failed(e.to_string())
        }
    }
}

/// Enables the child created disabled, only the object and version the decision saw
/// (`fence::enable_patch`: a JSON patch testing the resourceVersion and UID, as the config
/// writer's finalizer edits do), so that a deposed leader's enable, however late, lands only
/// on a child its successor read as it was and counted toward the pool's max
/// (docs/single-writer.md, "Every write"). A 409 or 422 (a failed test) or a 404 means the
/// child moved: the allocation loop decides again from the watch.
async fn enable(ctx: &Context, child: &EnableChild) -> EnableOutcome {
    let api: Api<NodeIPAMConfig> = Api::all(ctx.client.clone());
    let Some(rv) = child.resource_version.as_deref() else {
        return EnableOutcome::Moved("no resourceVersion to enable it at".into());
    };
    let ops = crate::alloc::fence::enable_patch(child.uid.as_deref(), rv);
    let patch: json_patch::Patch = match serde_json::from_value(ops) {
        Ok(p) => p,
        Err(e) => return EnableOutcome::Failed(e.to_string()),
    };
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    match ctx
        .write(api.patch(&child.name, &params, &Patch::Json::<()>(patch)))
        .await
    {
        Ok(_) => {
            info!(pool = %child.pool, config = %child.name, "enabled a child NodeIPAMConfig");
            EnableOutcome::Enabled
        }
        Err(KubeError::Api(s)) if matches!(s.code, 404 | 409 | 422) => {
            EnableOutcome::Moved(format!("{} {}: {}", s.code, s.reason, s.message))
        }
        Err(e) => {
            ctx.metrics.reconcile_error("config_enable");
            EnableOutcome::Failed(e.to_string())
        }
    }
}

/// Deletes the child `name` (the object `uid`) at the version read just before: a delete a
/// deposed leader sent is refused once its successor wrote the child since (its first status
/// write for it, when it hands out a block of it), however late it arrives. `only_awaiting`
/// (a child retired because its pool is over max): only if, as read, it still awaits its
/// enable; one enabled since is decided again.
async fn delete(
    ctx: &Context,
    name: &str,
    uid: Option<&str>,
    only_awaiting: bool,
) -> DeleteOutcome {
    let api: Api<NodeIPAMConfig> = Api::all(ctx.client.clone());
    let read = match ctx.read(api.get_opt(name)).await {
        Ok(Some(child)) if uid.is_none_or(|uid| child.metadata.uid.as_deref() == Some(uid)) => {
            child
        }
        // Gone, or another object under the name.
        Ok(_) => return DeleteOutcome::Gone,
        Err(e) => return DeleteOutcome::Failed(format!("reading it: {e}")),
    };
    if only_awaiting && !crate::alloc::pool::awaits_enable(&read) {
        return DeleteOutcome::Failed("it was enabled since it was decided on".into());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: read.metadata.uid.clone(),
            resource_version: read.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match ctx.write(api.delete(name, &params)).await {
        Ok(_) => {
            info!(config = %name, "deleted an empty child NodeIPAMConfig");
            DeleteOutcome::Deleted
        }
        Err(KubeError::Api(s)) if s.code == 404 => DeleteOutcome::Gone,
        // Changed since it was read: the allocation loop decides again on what it sees now.
        Err(KubeError::Api(s)) if s.code == 409 => {
            DeleteOutcome::Failed(format!("it changed since it was read: {}", s.message))
        }
        Err(e) => {
            ctx.metrics.reconcile_error("config_delete");
            DeleteOutcome::Failed(e.to_string())
        }
    }
}

/// Writes the status of the pool object `uid` and of no other (a JSON patch with a test of the
/// UID; the API server refuses it with 422 on another object). A pool that is gone, or another
/// object under the name, needs nothing written.
async fn write_status(
    ctx: &Context,
    name: &str,
    uid: Option<&str>,
    status: &NodeIPAMPoolStatus,
) -> Result<(), KubeError> {
    let api: Api<NodeIPAMPool> = Api::all(ctx.client.clone());
    let mut ops = Vec::new();
    if let Some(uid) = uid {
        ops.push(json!({ "op": "test", "path": "/metadata/uid", "value": uid }));
    }
    ops.push(json!({ "op": "add", "path": "/status", "value": status }));
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).map_err(KubeError::SerdeError)?;
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    match ctx
        .write(api.patch_status(name, &params, &Patch::Json::<()>(patch)))
        .await
    {
        Ok(_) => Ok(()),
        Err(KubeError::Api(s)) if s.code == 404 => {
            debug!(pool = %name, "pool status not written: the pool is gone");
            Ok(())
        }
        // Only a failed test of the UID means "created again"; another 422 is a refusal.
        Err(KubeError::Api(s)) if s.code == 422 && uid.is_some() => {
            let uid = uid.unwrap_or_default();
            if super::another_object(ctx, &api, name, uid).await? {
                debug!(pool = %name, "pool status not written: the pool was created again");
                Ok(())
            } else {
                Err(KubeError::Api(s))
            }
        }
        Err(e) => Err(e),
    }
}

/// The child's delete against a fake API server: at the version read, and a refusal of it
/// (a deposed leader's delete after its successor wrote the child) is no "gone".
#[cfg(test)]
mod tests {
    use http::{Method, StatusCode};

    use super::super::fake_api::{recording, status};
    use super::*;

    const CHILD: &str = r#"{"apiVersion":"nodeipam.io/v1alpha1","kind":"NodeIPAMConfig","metadata":{"name":"c","uid":"u1","resourceVersion":"9"},"spec":{"allocation":"Enabled"}}"#;

    #[tokio::test]
    async fn a_child_is_deleted_only_at_the_version_read() {
        let (ctx, seen) = recording(|method, _| match *method {
            Method::GET => (StatusCode::OK, CHILD.into()),
            _ => (StatusCode::OK, CHILD.into()),
        });
        assert_eq!(
            delete(&ctx, "c", Some("u1"), false).await,
            DeleteOutcome::Deleted
        );
        let seen = seen.lock().expect("lock").clone();
        let delete = seen
            .iter()
            .find(|(m, _, _)| *m == Method::DELETE)
            .expect("a delete");
        assert!(delete.2.contains(r#""uid":"u1""#), "{}", delete.2);
        assert!(
            delete.2.contains(r#""resourceVersion":"9""#),
            "{}",
            delete.2
        );
    }

    #[tokio::test]
    async fn an_over_max_retire_deletes_only_a_child_that_still_awaits_its_enable() {
        let (ctx, seen) = recording(|method, _| match *method {
            Method::GET => (StatusCode::OK, CHILD.into()),
            _ => (StatusCode::OK, CHILD.into()),
        });
        assert!(matches!(
            delete(&ctx, "c", Some("u1"), true).await,
            DeleteOutcome::Failed(why) if why.contains("enabled since")
        ));
        let seen = seen.lock().expect("lock").clone();
        assert!(
            seen.iter().all(|(m, _, _)| *m != Method::DELETE),
            "{seen:?}"
        );
    }

    #[tokio::test]
    async fn a_child_is_enabled_only_at_the_version_the_decision_saw() {
        let (ctx, seen) = recording(|method, _| match *method {
            Method::PATCH => (StatusCode::OK, CHILD.into()),
            _ => (StatusCode::NOT_FOUND, status(404, "NotFound")),
        });
        let child = EnableChild {
            pool: "p".into(),
            name: "c".into(),
            uid: Some("u1".into()),
            resource_version: Some("9".into()),
        };
        assert_eq!(enable(&ctx, &child).await, EnableOutcome::Enabled);
        let seen = seen.lock().expect("lock").clone();
        let patch = seen
            .iter()
            .find(|(m, _, _)| *m == Method::PATCH)
            .expect("a patch");
        for want in [
            r#""path":"/metadata/resourceVersion""#,
            r#""value":"9""#,
            r#""path":"/metadata/annotations/nodeipam.io~1awaiting-enable""#,
            r#""value":"Enabled""#,
        ] {
            assert!(patch.2.contains(want), "{want} in {}", patch.2);
        }
        // Refused by its test: someone moved it; decided again from the watch.
        let (ctx, _) = recording(|_, _| (StatusCode::UNPROCESSABLE_ENTITY, status(422, "Invalid")));
        assert!(matches!(
            enable(&ctx, &child).await,
            EnableOutcome::Moved(_)
        ));
    }

    #[tokio::test]
    async fn a_delete_refused_for_a_changed_child_is_decided_again() {
        let (ctx, _) = recording(|method, _| match *method {
            Method::GET => (StatusCode::OK, CHILD.into()),
            _ => (StatusCode::CONFLICT, status(409, "Conflict")),
        });
        assert!(matches!(
            delete(&ctx, "c", Some("u1"), false).await,
            DeleteOutcome::Failed(why) if why.contains("changed since it was read")
        ));
        // Another object under the name: nothing of ours to delete.
        assert_eq!(
            delete(&ctx, "c", Some("u2"), false).await,
            DeleteOutcome::Gone
        );
    }
}
