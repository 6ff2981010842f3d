//! Writes the pod network for consumers: the aggregate ConfigMap and, when asked, the
//! ip-masq-agent ConfigMap's `config` key. It tells the allocation loop which network was
//! written, so allocation from a new range waits until consumers can know it.

use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions,
};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::node_writer::backoff;
use super::{Context, MANAGER};
use crate::alloc::fence::{self, Send};
use crate::alloc::machine::Input;
use crate::alloc::outputs::{MANAGED_BY, OutputRef, holds_spec, is_ours, stale};
use crate::alloc::podnetwork::{PodNetwork, ip_masq_agent_config};

pub use crate::alloc::podnetwork::ConfigMapRef;

pub use crate::alloc::fence::PUBLISHED_BY;

/// Where and what to publish.
#[derive(Clone, Debug, Default)]
pub struct PublishOptions {
    /// The aggregate ConfigMap; `None` turns publishing (and its ordering gate) off.
    pub pod_network: Option<ConfigMapRef>,
    /// ip-masq-agent's ConfigMap, kept in sync when set.
    pub ip_masq_agent: Option<ConfigMapRef>,
    /// Added to ip-masq-agent's `nonMasqueradeCIDRs`.
    pub extra_non_masquerade: Vec<IpNet>,
    /// The typed outputs (Calico's IPPools and GlobalNetworkSet, Cilium's CIDR group).
    pub typed: Vec<OutputRef>,
}

/// Writes each network it is sent, the newest first, retrying with backoff. The allocation
/// loop learns what landed from its watches of the ConfigMaps, not from here: a write that
/// half failed, or a ConfigMap edited since, must not open the gate.
pub async fn run(
    ctx: Arc<Context>,
    options: PublishOptions,
    mut jobs: mpsc::UnboundedReceiver<PodNetwork>,
    // Each network once every output holds it (`Input::Published`), for the allocation loop's
    // gate, and why an attempt failed (`Input::PublishFailed`), for the waiting configs' messages.
    done: mpsc::UnboundedSender<Input>,
) {
    let Some(target) = options.pod_network.clone() else {
        return;
    };
    // This session's signature: no publish before it carried it.
    let by = super::seal::fresh_value(&ctx);
    while let Some(mut network) = jobs.recv().await {
        let mut attempt = 0;
        loop {
            // Only the newest network matters.
            while let Ok(newer) = jobs.try_recv() {
                network = newer;
            }
            match publish(&ctx, &options, &target, &network, &by).await {
                Ok(()) => {
                    info!(configmap = %target, cidrs = network.cidrs().len(), "pod network published");
                    let _ = done.send(Input::Published(network));
                    break;
                }
                Err(e) => {
                    attempt += 1;
                    ctx.metrics.reconcile_error("publish");
                    warn!(configmap = %target, error = %e, attempt, "publishing the pod network failed; retrying");
                    let _ = done.send(Input::PublishFailed(e));
                    // A newer network (or a repaired output) is tried at once.
                    tokio::select! {
                        () = tokio::time::sleep(backoff(attempt)) => {}
                        newer = jobs.recv() => match newer {
                            Some(newer) => network = newer,
                            None => return,
                        },
                    }
                }
            }
        }
    }
}

async fn publish(
    ctx: &Context,
    options: &PublishOptions,
    target: &ConfigMapRef,
    network: &PodNetwork,
    by: &str,
) -> Result<(), String> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let data = network.configmap_data(&now);
    // Before the write: a network too large to be written shows in the gauge too.
    let bytes = PodNetwork::configmap_bytes(&data);
    ctx.metrics
        .pod_network_bytes
        .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    // Always written: its data carries the time of the publish.
    let existing = read_configmap(ctx, target).await?;
    let send = fence::send(existing.as_ref().map(|c| &c.metadata), false, by);
    apply_data(ctx, target, json!(data), send, by).await?;
    if let Some(masq) = &options.ip_masq_agent {
        let existing = read_configmap(ctx, masq).await?;
        let current = existing
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get("config"))
            .map(String::as_str);
        let config = ip_masq_agent_config(current, network, &options.extra_non_masquerade)
            .map_err(|e| format!("{masq}: {e}"))?;
        let count = network.aggregated().len() + options.extra_non_masquerade.len();
        if count > 64 {
            warn!(configmap = %masq, count, "more nonMasqueradeCIDRs than ip-masq-agent's default cidrLimit of 64");
        }
        // Written when it differs, and once by every session even when it does not: the
        // new signature moves its version past any a predecessor's late write was sent on.
        let holds = current == Some(config.as_str());
        let send = fence::send(existing.as_ref().map(|c| &c.metadata), holds, by);
        // Only the `config` key is ours; server-side apply leaves the other keys alone.
        apply_data(ctx, masq, json!({ "config": config }), send, by).await?;
    }
    for output in &options.typed {
        write_objects(ctx, output, network, by)
            .await
            .map_err(|e| format!("{output}: {e}"))?;
    }
    Ok(())
}

/// The API of a typed output's objects.
pub fn typed_api(client: &kube::Client, output: &OutputRef) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &api_resource(output))
}

pub fn api_resource(output: &OutputRef) -> ApiResource {
    let (group, version) = output
        .api_version
        .split_once('/')
        .unwrap_or(("", &output.api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: output.api_version.clone(),
        kind: output.kind.resource().into(),
        plural: output.kind.plural().into(),
    }
}

/// Applies a typed output's objects as rendered, never over an object without our label, and
/// removes ours that the network no longer has (an IPPool of a drained range).
async fn write_objects(
    ctx: &Context,
    output: &OutputRef,
    network: &PodNetwork,
    by: &str,
) -> Result<(), String> {
    let api = typed_api(&ctx.client, output);
    let mut wanted = output.objects(network);
    for (_, body) in &mut wanted {
        body["metadata"]["annotations"][PUBLISHED_BY] = json!(by);
    }
    for (name, body) in &wanted {
        let existing = ctx
            .read(api.get_opt(name))
            .await
            .map_err(|e| format!("reading {name}: {e}"))?;
        if let Some(theirs) = existing.as_ref().filter(|o| !is_ours(o)) {
            let kind = output.kind.resource();
            return Err(format!(
                "{kind} {} exists without the label app.kubernetes.io/managed-by=nodeipam: \
                 nodeipam never writes over an object it does not own; rename or delete it",
                theirs.name_any()
            ));
        }
        // Left alone only when it holds what we want and this session signed it already: a
        // session's first write moves every object's version, so a predecessor's late update or
        // delete, sent on an older version, is refused (docs/single-writer.md, "Every write").
        let holds = existing.as_ref().is_some_and(|ours| holds_spec(ours, body));
        let send = fence::send(existing.as_ref().map(|o| &o.metadata), holds, by);
        match send {
            Send::Skip => continue,
            Send::Create => create(ctx, &api, name, body).await?,
            Send::At { resource_version } => ctx
                .write(api.patch(
                    name,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(with_version(body, resource_version)),
                ))
                .await
                .map(drop)
                .map_err(|e| format!("writing {name}: {e}"))?,
        }
    }
    if output.name.is_some() {
        return Ok(());
    }
    remove_stale(ctx, &api, output, &wanted).await
}

/// `body` applied only over the object read: an object replaced since (deleted, and created
/// again by someone else under the name) makes the apply fail rather than be taken over.
fn with_version(body: &serde_json::Value, version: Option<String>) -> serde_json::Value {
    let mut body = body.clone();
    body["metadata"]["resourceVersion"] = json!(version);
    body
}

/// Creates an object the read found absent: a create, not an apply, so that one created under
/// the name since the read is refused (409) rather than written over.
async fn create(
    ctx: &Context,
    api: &Api<DynamicObject>,
    name: &str,
    body: &serde_json::Value,
) -> Result<(), String> {
    let object: DynamicObject =
        serde_json::from_value(body.clone()).map_err(|e| format!("rendering {name}: {e}"))?;
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    match ctx.write(api.create(&params, &object)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(format!(
            "{name} was created by someone else since it was read; it is read again"
        )),
        Err(e) => Err(format!("creating {name}: {e}")),
    }
}

/// Removes our objects of a many-object output (the IPPools) that `wanted` no longer has.
async fn remove_stale(
    ctx: &Context,
    api: &Api<DynamicObject>,
    output: &OutputRef,
    wanted: &[(String, serde_json::Value)],
) -> Result<(), String> {
    let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
    let listed = ctx
        .read(api.list_metadata(&ListParams::default().labels(&selector)))
        .await
        .map_err(|e| format!("listing ours: {e}"))?;
    let names: Vec<String> = listed
        .items
        .iter()
        .filter_map(|o| o.metadata.name.clone())
        .collect();
    for name in stale(wanted, &names) {
        let Some(item) = listed
            .items
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(name.as_str()))
        else {
            continue;
        };
        // Only the object listed, at the version listed: one created again since under the
        // name is not removed, nor one a successor wrote since (a late delete of ours).
        let (uid, resource_version) = fence::delete_at(&item.metadata);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version,
            }),
            ..DeleteParams::default()
        };
        match ctx.write(api.delete(&name, &params)).await {
            Ok(_) => info!(output = %output, name, "removed: its range left the pod network"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(format!("removing {name}: {e}")),
        }
    }
    Ok(())
}

/// The ConfigMap `target` as it is now (a GET, read as late as possible: its version is the
/// precondition of the write that follows).
async fn read_configmap(ctx: &Context, target: &ConfigMapRef) -> Result<Option<ConfigMap>, String> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &target.namespace);
    ctx.read(api.get_opt(&target.name))
        .await
        .map_err(|e| format!("reading {target}: {e}"))
}

/// Writes `data` (our keys only) into `target`, signed [`PUBLISHED_BY`] `by`, as `send`
/// decided from the read just before: at the version read (server-side apply with it, so a
/// write sent on an older version is refused with a 409, however late it arrives), or as a new
/// object when it was absent (a create: refused if one was made since).
async fn apply_data(
    ctx: &Context,
    target: &ConfigMapRef,
    data: serde_json::Value,
    send: Send,
    by: &str,
) -> Result<(), String> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &target.namespace);
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": target.name, "namespace": target.namespace,
                      "labels": { "app.kubernetes.io/managed-by": "nodeipam" },
                      "annotations": { PUBLISHED_BY: by } },
        "data": data,
    });
    let written = match send {
        Send::Skip => return Ok(()),
        Send::At { resource_version } => {
            ctx.write(api.patch(
                &target.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&with_version(&body, resource_version)),
            ))
            .await
        }
        Send::Create => {
            let cm: ConfigMap =
                serde_json::from_value(body).map_err(|e| format!("writing {target}: {e}"))?;
            ctx.write(api.create(&PostParams::default(), &cm)).await
        }
    };
    written
        .map(|_| ())
        .map_err(|e| format!("writing {target}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configmap_ref_parses() {
        assert_eq!(
            "kube-system/ip-masq-agent".parse::<ConfigMapRef>(),
            Ok(ConfigMapRef {
                namespace: "kube-system".into(),
                name: "ip-masq-agent".into()
            })
        );
        for bad in ["", "name", "/name", "ns/", "a/b/c"] {
            assert!(bad.parse::<ConfigMapRef>().is_err(), "{bad}");
        }
    }
}

/// The typed-output writer against a fake API server: what it sends when an object of ours is
/// absent, and when one appears under the name between its read and its write.
#[cfg(test)]
mod writer_tests {
    use http::{Method, StatusCode};

    use super::*;
    use crate::alloc::outputs::{CalicoPools, OutputKind};
    use crate::alloc::podnetwork::ConfigRanges;

    use super::super::fake_api::{recording, status};

    fn pools_of(range: &str) -> (OutputRef, PodNetwork) {
        let kind = OutputKind::CalicoIPPools(CalicoPools::default());
        let output = OutputRef::typed(kind, "projectcalico.org/v3", None);
        let config = ConfigRanges {
            name: "pods".into(),
            families: vec![(range.parse().expect("range"), 0, 4)],
            nodes: 0,
            deleting: false,
            enabled: true,
            drained: false,
        };
        (output, PodNetwork::new(&[config], &[]))
    }

    /// The read finds no pool; someone creates one under the name before the write. A create
    /// is refused then, where an apply would take their pool over.
    #[tokio::test]
    async fn a_pool_that_appears_after_the_read_is_not_taken_over() {
        let (ctx, seen) = recording(|method, path| match *method {
            Method::GET if path.ends_with("/ippools") => (StatusCode::OK, EMPTY_LIST.into()),
            Method::GET => (StatusCode::NOT_FOUND, status(404, "NotFound")),
            Method::POST => (StatusCode::CONFLICT, status(409, "AlreadyExists")),
            _ => (StatusCode::OK, "{}".into()),
        });
        let (output, network) = pools_of("10.0.0.0/16");
        let err = write_objects(&ctx, &output, &network, "a/1")
            .await
            .expect_err("refused");
        assert!(err.contains("nodeipam-10-0-0-0-16"), "{err}");
        let seen = seen.lock().expect("lock").clone();
        let methods: Vec<&Method> = seen.iter().map(|(m, _, _)| m).collect();
        assert_eq!(methods, [&Method::GET, &Method::POST], "{seen:?}");
        assert_eq!(seen[1].1, "/apis/projectcalico.org/v3/ippools");
    }

    /// A pool of ours, as the API server returns it.
    fn our_pool(name: &str, version: &str, spec: &str, signed: Option<&str>) -> String {
        let annotations = signed.map_or(String::new(), |by| {
            format!(r#","annotations":{{"{PUBLISHED_BY}":"{by}"}}"#)
        });
        format!(
            r#"{{"apiVersion":"projectcalico.org/v3","kind":"IPPool","metadata":{{"name":"{name}","uid":"uid-{name}","resourceVersion":"{version}","labels":{{"{}":"{}"}}{annotations}}},"spec":{spec}}}"#,
            MANAGED_BY.0, MANAGED_BY.1
        )
    }

    /// A session's first publish signs a pool it agrees with (so its version moves past any a
    /// predecessor read), and a stale pool is deleted only at the version listed: a deposed
    /// leader's late delete meets a 409 once a successor wrote the pool (issue 45, the fourth
    /// sequence).
    #[tokio::test]
    async fn a_new_session_signs_every_pool_and_deletes_only_at_the_version_listed() {
        let (output, network) = pools_of("10.0.0.0/16");
        let wanted = output.objects(&network);
        let spec = serde_json::to_string(&wanted[0].1["spec"]).expect("spec");
        // The wanted pool exists with the wanted spec, signed by a predecessor; a stale one
        // of ours is listed at version 7.
        let pool = our_pool(&wanted[0].0, "5", &spec, Some("old/1"));
        let list = format!(
            r#"{{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{{}},"items":[{{"metadata":{{"name":"{}","uid":"uid-a","resourceVersion":"5"}}}},{{"metadata":{{"name":"nodeipam-10-9-0-0-16","uid":"uid-stale","resourceVersion":"7"}}}}]}}"#,
            wanted[0].0
        );
        static ANSWERS: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
        let _ = ANSWERS.set((pool, list));
        let (ctx, seen) = recording(|method, path| {
            let (pool, list) = ANSWERS.get().expect("answers");
            match *method {
                Method::GET if path.ends_with("/ippools") => (StatusCode::OK, list.clone()),
                Method::GET | Method::PATCH => (StatusCode::OK, pool.clone()),
                _ => (StatusCode::OK, status(200, "Success")),
            }
        });
        write_objects(&ctx, &output, &network, "new/2")
            .await
            .expect("written");
        let seen = seen.lock().expect("lock").clone();
        let patch = seen
            .iter()
            .find(|(m, _, _)| *m == Method::PATCH)
            .expect("the pool it agrees with is written once, signed");
        assert!(patch.2.contains("new/2"), "{}", patch.2);
        assert!(patch.2.contains(r#""resourceVersion":"5""#), "{}", patch.2);
        let delete = seen
            .iter()
            .find(|(m, _, _)| *m == Method::DELETE)
            .expect("the stale pool is deleted");
        assert!(delete.1.ends_with("/nodeipam-10-9-0-0-16"), "{delete:?}");
        assert!(delete.2.contains(r#""uid":"uid-stale""#), "{}", delete.2);
        assert!(
            delete.2.contains(r#""resourceVersion":"7""#),
            "{}",
            delete.2
        );
    }

    const EMPTY_LIST: &str = r#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{},"items":[]}"#;
}
