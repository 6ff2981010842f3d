//! Carries out a take-over's seal (`nodeipam_alloc::seal`): lists the Nodes, writes the seal
//! annotation to each one the core names, and retries each until its answer settles it. It
//! decides nothing: which Nodes, what value and which answers settle one are the core's.

use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use super::{Context, MANAGER, bounded, handover, node_writer};
use crate::alloc::outcome::classify;
use crate::alloc::seal;
use crate::node::IpamNode;

/// A page of the seal's Node list, as the session's own list.
const PAGE: u32 = 2000;

/// What a seal did: Nodes sealed (or found gone), and Nodes it could not seal, for which the
/// take-over wait is all that holds a predecessor's writes back.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Sealed {
    pub sealed: usize,
    pub unsealed: usize,
}

/// Seals every Node without podCIDRs on behalf of `identity`. A list that fails leaves all of
/// them to the take-over wait, says so, and counts as one unsealed.
pub async fn run(ctx: &Context, identity: &str) -> Sealed {
    let targets = match targets(ctx).await {
        Ok(targets) => targets,
        Err(e) => {
            warn!(error = %e, "listing the nodes to seal failed: the take-over wait alone holds back a predecessor's writes");
            return Sealed {
                sealed: 0,
                unsealed: 1,
            };
        }
    };
    let value = seal::value(identity, token());
    let concurrency = ctx.options.write_concurrency.max(1);
    let results: Vec<bool> = futures::stream::iter(targets)
        .map(|(name, _)| {
            let value = value.clone();
            async move { seal_one(ctx, &name, &value).await }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let sealed = results.iter().filter(|ok| **ok).count();
    let done = Sealed {
        sealed,
        unsealed: results.len() - sealed,
    };
    if done.unsealed > 0 {
        warn!(
            sealed = done.sealed,
            unsealed = done.unsealed,
            "some nodes could not be sealed: for them, the take-over wait alone holds back a predecessor's writes"
        );
    } else {
        info!(
            sealed = done.sealed,
            "nodes without podCIDRs sealed: no write of a previous leader can land on them"
        );
    }
    done
}

/// The Nodes to seal, page by page of one consistent list of every Node, read slim (the
/// default `resourceVersion`, so never older than our take-over). Only the targets are kept:
/// holding a list of 50,000 Nodes beside the session's own list cost 42 MiB at peak.
async fn targets(ctx: &Context) -> Result<Vec<(String, Option<String>)>, kube::Error> {
    let api: Api<IpamNode> = Api::all(crate::node_lists::client(ctx.client.clone()));
    let mut targets = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        ctx.limiter.acquire().await;
        let page = ctx.read(api.list(&params)).await?;
        targets.extend(seal::targets(&page.items));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(targets),
        }
    }
}

/// One Node's seal, tried until an answer settles it or the attempts run out.
async fn seal_one(ctx: &Context, name: &str, value: &str) -> bool {
    let api: Api<IpamNode> = Api::all(ctx.client.clone());
    let patch = json!({ "metadata": { "annotations": { seal::ANNOTATION: value } } });
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    for attempt in 0..seal::ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(node_writer::backoff(attempt)).await;
        }
        ctx.limiter.acquire().await;
        // Not one of the session's writes: a seal that lands late holds back as much.
        let sent = bounded(
            ctx.options.write_timeout,
            api.patch(name, &params, &Patch::Merge(&patch)),
        )
        .await;
        if seal::sealed(classify(handover::answer(&sent))) {
            return true;
        }
    }
    false
}

/// A token per seal of this process: with the identity, a value no Node carries yet.
fn token() -> u64 {
    static SEALS: AtomicU64 = AtomicU64::new(0);
    SEALS.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_seal_of_a_process_has_its_own_token() {
        assert_ne!(super::token(), super::token());
    }
}
