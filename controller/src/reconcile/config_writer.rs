//! Writes to NodeIPAMConfig objects on the allocation loop's behalf: status by server-side
//! apply, and our finalizer added or removed by JSON patch guarded by the resourceVersion.
//! Jobs for the same config coalesce (the newest status wins) and failed ones are retried.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use nodeipam_crd::{FINALIZER, NodeIPAMConfig, NodeIPAMConfigStatus};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::node_writer::backoff;
use super::{Context, MANAGER};
use crate::alloc::effects::ConfigJob;

pub async fn run(
    ctx: Arc<Context>,
    mut jobs: mpsc::UnboundedReceiver<ConfigJob>,
    // Each job once it is done (or moot: its config is gone), for the allocation loop.
    done: mpsc::UnboundedSender<ConfigJob>,
) {
    let mut pending: BTreeMap<(String, u8), (ConfigJob, u32)> = BTreeMap::new();
    loop {
        if pending.is_empty() {
            match jobs.recv().await {
                Some(job) => {
                    pending.insert(job.key(), (job, 0));
                }
                None => return,
            }
        }
        // Coalesce everything already queued: only the newest job per config and kind runs.
        while let Ok(job) = jobs.try_recv() {
            pending.insert(job.key(), (job, 0));
        }
        let mut failed = 0u32;
        for (key, (job, attempt)) in std::mem::take(&mut pending) {
            match execute(&ctx, &job).await {
                Ok(()) => {
                    let _ = done.send(job);
                }
                Err(e) => {
                    ctx.metrics.reconcile_error("config_write");
                    warn!(config = %key.0, error = %e, attempt, "writing NodeIPAMConfig failed; will retry");
                    failed = failed.max(attempt + 1);
                    pending.insert(key, (job, attempt + 1));
                }
            }
        }
        if failed > 0 {
            tokio::select! {
                () = tokio::time::sleep(backoff(failed)) => {}
                job = jobs.recv() => match job {
                    Some(job) => { pending.insert(job.key(), (job, 0)); }
                    None => return,
                },
            }
        }
    }
}

async fn execute(ctx: &Context, job: &ConfigJob) -> Result<(), kube::Error> {
    let api: Api<NodeIPAMConfig> = Api::all(ctx.client.clone());
    let result = match job {
        ConfigJob::Status { name, uid, status } => {
            write_status(ctx, &api, name, uid.as_deref(), status)
                .await
                .map(|written| {
                    if !written {
                        debug!(config = %name, "status not written: the config was created again or edited since it was computed");
                    }
                })
        }
        ConfigJob::AddFinalizer { name } => edit_finalizers(ctx, &api, name, true, None)
            .await
            .map(|changed| debug!(config = %name, changed, "finalizer present")),
        ConfigJob::RemoveFinalizer { name, uid } => {
            edit_finalizers(ctx, &api, name, false, uid.as_deref())
                .await
                .map(|changed| debug!(config = %name, changed, "finalizer removed"))
        }
    };
    match result {
        // The config is gone: nothing left to write.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    }
}

/// Writes the status of the object `uid` (when given) and of no other: a status computed for
/// a config that was deleted and created again under the same name is not the new one's. And
/// only to the generation it was computed for (its `observedGeneration`): a status a deposed
/// leader computed for an older spec (Drained=True for a config disabled then) is refused
/// however late it arrives, once the config was edited (enabled again) since
/// (docs/single-writer.md, "Every write"). Returns whether it was written; a refusal of the
/// write itself is an error.
pub async fn write_status(
    ctx: &Context,
    api: &Api<NodeIPAMConfig>,
    name: &str,
    uid: Option<&str>,
    status: &NodeIPAMConfigStatus,
) -> Result<bool, kube::Error> {
    // A JSON patch (server-side apply ignores a UID in the applied body), its tests decided in
    // one place for the controller and the simulator.
    let ops = crate::alloc::fence::status_patch(uid, status);
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    let written = ctx
        .write(api.patch_status(name, &params, &Patch::Json::<()>(patch)))
        .await;
    match (written, uid) {
        (Ok(_), _) => Ok(true),
        // Only a failed test of the UID or the generation means "created again" or "edited
        // since": the allocation loop computes the status again for what it sees now. Any
        // other 422 (a schema, a policy) leaves the status wrong, so it is an error, retried
        // and counted.
        (Err(kube::Error::Api(s)), Some(uid)) if s.code == 422 => {
            let now = ctx.read(api.get_opt(name)).await?;
            let moved = now.is_none_or(|c| {
                let edited = status
                    .observed_generation
                    .is_some_and(|g| c.metadata.generation != Some(g));
                c.uid().as_deref() != Some(uid) || edited
            });
            if moved {
                Ok(false)
            } else {
                Err(kube::Error::Api(s))
            }
        }
        (Err(e), _) => Err(e),
    }
}

/// Removes our finalizer from the object `uid` only; the API server refuses the patch (422)
/// when `name` is now another object.
pub async fn remove_finalizer(
    ctx: &Context,
    api: &Api<NodeIPAMConfig>,
    name: &str,
    uid: &str,
) -> Result<bool, kube::Error> {
    edit_finalizers(ctx, api, name, false, Some(uid)).await
}

/// Adds or removes only our finalizer; other finalizers (a CNI's, a proxy's) are left alone.
/// The resourceVersion test makes a concurrent change fail instead of being overwritten, and
/// the UID test (when given) keeps a removal off a config re-created under the same name.
async fn edit_finalizers(
    ctx: &Context,
    api: &Api<NodeIPAMConfig>,
    name: &str,
    add: bool,
    uid: Option<&str>,
) -> Result<bool, kube::Error> {
    let current = ctx.read(api.get(name)).await?;
    if uid.is_some() && current.uid().as_deref() != uid {
        // Another object now has this name; the one we decided for is gone.
        return Ok(false);
    }
    let finalizers = current.finalizers();
    let index = finalizers.iter().position(|f| f == FINALIZER);
    let rv = current.resource_version().unwrap_or_default();
    let mut ops = crate::alloc::fence::at_version(uid, &rv);
    match (add, index) {
        (true, Some(_)) | (false, None) => return Ok(false),
        // Adding to a deleting object is refused by the API server; nothing to hold anyway.
        (true, None) if current.meta().deletion_timestamp.is_some() => return Ok(false),
        (true, None) if finalizers.is_empty() => {
            ops.push(json!({ "op": "add", "path": "/metadata/finalizers", "value": [FINALIZER] }))
        }
        (true, None) => {
            ops.push(json!({ "op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER }))
        }
        (false, Some(i)) => {
            ops.push(json!({ "op": "remove", "path": format!("/metadata/finalizers/{i}") }))
        }
    }
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).map_err(kube::Error::SerdeError)?;
    ctx.write(api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)))
        .await?;
    Ok(true)
}
