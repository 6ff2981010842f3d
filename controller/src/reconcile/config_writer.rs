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

#[derive(Clone, Debug, PartialEq)]
pub enum ConfigJob {
    Status {
        name: String,
        status: NodeIPAMConfigStatus,
    },
    AddFinalizer {
        name: String,
    },
    RemoveFinalizer {
        name: String,
    },
}

impl ConfigJob {
    fn key(&self) -> (String, u8) {
        match self {
            ConfigJob::Status { name, .. } => (name.clone(), 0),
            ConfigJob::AddFinalizer { name } | ConfigJob::RemoveFinalizer { name } => {
                (name.clone(), 1)
            }
        }
    }
}

/// Tells the allocation loop that a finalizer change is done, so it can lift its gate.
#[derive(Debug)]
pub enum ConfigWritten {
    FinalizerAdded(String),
    FinalizerRemoved(String),
}

pub async fn run(
    ctx: Arc<Context>,
    mut jobs: mpsc::UnboundedReceiver<ConfigJob>,
    done: mpsc::UnboundedSender<ConfigWritten>,
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
                Ok(Some(written)) => {
                    let _ = done.send(written);
                }
                Ok(None) => {}
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

async fn execute(ctx: &Context, job: &ConfigJob) -> Result<Option<ConfigWritten>, kube::Error> {
    let api: Api<NodeIPAMConfig> = Api::all(ctx.client.clone());
    ctx.limiter.acquire().await;
    let result = match job {
        ConfigJob::Status { name, status } => {
            let body = json!({
                "apiVersion": NodeIPAMConfig::api_version(&()),
                "kind": NodeIPAMConfig::kind(&()),
                "metadata": { "name": name },
                "status": status,
            });
            api.patch_status(
                name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await
            .map(|_| None)
        }
        ConfigJob::AddFinalizer { name } => {
            edit_finalizers(&api, name, true).await.map(|changed| {
                debug!(config = %name, changed, "finalizer present");
                Some(ConfigWritten::FinalizerAdded(name.clone()))
            })
        }
        ConfigJob::RemoveFinalizer { name } => {
            edit_finalizers(&api, name, false).await.map(|changed| {
                debug!(config = %name, changed, "finalizer removed");
                Some(ConfigWritten::FinalizerRemoved(name.clone()))
            })
        }
    };
    match result {
        // The config is gone: nothing left to write.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(match job {
            ConfigJob::RemoveFinalizer { name } => {
                Some(ConfigWritten::FinalizerRemoved(name.clone()))
            }
            _ => None,
        }),
        other => other,
    }
}

/// Adds or removes only our finalizer; other finalizers (a CNI's, a proxy's) are left alone.
/// The resourceVersion test makes a concurrent change fail instead of being overwritten.
async fn edit_finalizers(
    api: &Api<NodeIPAMConfig>,
    name: &str,
    add: bool,
) -> Result<bool, kube::Error> {
    let current = api.get(name).await?;
    let finalizers = current.finalizers();
    let index = finalizers.iter().position(|f| f == FINALIZER);
    let rv = current.resource_version().unwrap_or_default();
    let ops = match (add, index) {
        (true, Some(_)) | (false, None) => return Ok(false),
        // Adding to a deleting object is refused by the API server; nothing to hold anyway.
        (true, None) if current.meta().deletion_timestamp.is_some() => return Ok(false),
        (true, None) if finalizers.is_empty() => {
            json!([{ "op": "test", "path": "/metadata/resourceVersion", "value": rv },
                   { "op": "add", "path": "/metadata/finalizers", "value": [FINALIZER] }])
        }
        (true, None) => json!([{ "op": "test", "path": "/metadata/resourceVersion", "value": rv },
                               { "op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER }]),
        (false, Some(i)) => {
            json!([{ "op": "test", "path": "/metadata/resourceVersion", "value": rv },
                                   { "op": "remove", "path": format!("/metadata/finalizers/{i}") }])
        }
    };
    let patch: json_patch::Patch = serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await?;
    Ok(true)
}
