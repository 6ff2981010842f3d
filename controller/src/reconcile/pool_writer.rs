//! Carries out the NodeIPAMPools' decisions on the allocation loop's behalf: creates a child
//! NodeIPAMConfig (AlreadyExists is an answer, not an error: the name is deterministic, so a
//! retry or another leader's create finds it), deletes an empty child with its UID as a
//! precondition, and writes pool statuses with a test of the UID. Creates and deletes are
//! answered once (the allocation loop decides what to ask again); statuses coalesce per pool
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
use crate::alloc::effects::{ChildConfig, CreateOutcome, DeleteOutcome};
use crate::alloc::machine::Input;

/// One thing a pool asked for.
#[derive(Clone, Debug)]
pub enum PoolJob {
    Create(ChildConfig),
    Delete {
        name: String,
        uid: Option<String>,
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
                PoolJob::Delete { name, uid } => {
                    let outcome = delete(&ctx, &name, uid.as_deref()).await;
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
    ctx.limiter.acquire().await;
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

async fn delete(ctx: &Context, name: &str, uid: Option<&str>) -> DeleteOutcome {
    let api: Api<NodeIPAMConfig> = Api::all(ctx.client.clone());
    ctx.limiter.acquire().await;
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match ctx.write(api.delete(name, &params)).await {
        Ok(_) => {
            info!(config = %name, "deleted an empty child NodeIPAMConfig");
            DeleteOutcome::Deleted
        }
        // Gone, or another object under the name (the UID precondition failed).
        Err(KubeError::Api(s)) if s.code == 404 || s.code == 409 => DeleteOutcome::Gone,
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
    ctx.limiter.acquire().await;
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
