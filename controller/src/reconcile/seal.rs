//! Carries out a take-over's seal (`nodeipam_alloc::seal`): lists the Nodes, writes the seal
//! annotation to each one the core names, and retries the list and each write until its
//! answer settles it. It decides nothing: which Nodes, what value, which answers settle one
//! and when the seal is done are the core's.

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

/// Seals every Node without podCIDRs on behalf of this process, and returns how many it sealed.
/// It never gives up (`seal::done`): a failed list is listed again and the Nodes whose seal
/// was throttled, refused or not answered are written again, round after round with backoff,
/// for as long as it takes (each retry logged and counted in
/// `nodeipam_takeover_seal_retries_total`); the session allocates nothing meanwhile. It ends
/// early only with the session (a lost leadership drops it).
pub async fn run(ctx: &Context) -> usize {
    let value = fresh_value(ctx);
    let mut unsealed: Option<Vec<(String, Option<String>)>> = None;
    let (mut sealed, mut failures) = (0, 0);
    while !seal::done(unsealed.as_ref().map(Vec::len)) {
        let failed = match unsealed.take() {
            None => match targets(ctx).await {
                Ok(targets) => {
                    unsealed = Some(targets);
                    // The writes back off on their own count.
                    failures = 0;
                    false
                }
                Err(e) => {
                    ctx.metrics.seal_retried("list");
                    warn!(error = %e, "listing the nodes to seal failed: allocating nothing until they are sealed; listing again");
                    true
                }
            },
            Some(targets) => {
                let before = targets.len();
                let left = seal_round(ctx, targets, &value).await;
                sealed += before - left.len();
                let failed = !left.is_empty();
                unsealed = Some(left);
                failed
            }
        };
        // A list that succeeded goes straight on to the writes; what failed waits first.
        if failed {
            failures += 1;
            tokio::time::sleep(node_writer::backoff(failures)).await;
        }
    }
    ctx.metrics.sealed(sealed);
    info!(
        sealed,
        "nodes without podCIDRs sealed: no write of a previous leader can land on them"
    );
    sealed
}

/// One round: a seal written to each of `targets`, at most the write concurrency at once;
/// returns those no answer settled.
async fn seal_round(
    ctx: &Context,
    targets: Vec<(String, Option<String>)>,
    value: &str,
) -> Vec<(String, Option<String>)> {
    let concurrency = ctx.options.write_concurrency.max(1);
    futures::stream::iter(targets)
        .map(|target| async move {
            let settled = seal_one(ctx, &target.0, value).await;
            (!settled).then_some(target)
        })
        .buffer_unordered(concurrency)
        .filter_map(|left| async move { left })
        .collect()
        .await
}

/// The Nodes to seal, page by page of one consistent list of every Node, read slim (the
/// default `resourceVersion`, so never older than our take-over). Only the targets are kept:
/// holding a list of 50,000 Nodes beside the session's own list cost 42 MiB at peak.
async fn targets(ctx: &Context) -> Result<Vec<(String, Option<String>)>, kube::Error> {
    let api: Api<IpamNode> = Api::all(crate::node_lists::client(ctx.client.clone()));
    let mut targets = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = ctx.read(api.list(&params)).await?;
        targets.extend(seal::targets(&page.items));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(targets),
        }
    }
}

/// One Node's seal, written once: whether its answer settles that Node.
async fn seal_one(ctx: &Context, name: &str, value: &str) -> bool {
    let api: Api<IpamNode> = Api::all(ctx.client.clone());
    let patch = json!({ "metadata": { "annotations": { seal::ANNOTATION: value } } });
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    ctx.limiter.acquire().await;
    // Not one of the session's writes: a seal that lands late holds back as much.
    let sent = bounded(
        ctx.options.write_timeout,
        api.patch(name, &params, &Patch::Merge(&patch)),
    )
    .await;
    let answer = handover::answer(&sent);
    if seal::sealed(classify(answer)) {
        return true;
    }
    ctx.metrics.seal_retried("write");
    let error = sent.err().map(|e| e.to_string()).unwrap_or_default();
    warn!(node = %name, ?answer, %error, "sealing a node did not settle: allocating nothing until it is sealed; writing it again");
    false
}

/// A value no write of any process carried before: this process's identity (unique per
/// process: `app::identity`) and a token. Seals are made of it, and so is the signature of a
/// session's publishes (`publisher::PUBLISHED_BY`).
pub fn fresh_value(ctx: &Context) -> String {
    let identity = match (&ctx.options.lease, &ctx.options.instance) {
        (Some(lease), _) => lease.identity.as_str(),
        (None, Some(instance)) => instance.as_str(),
        (None, None) => MANAGER,
    };
    seal::value(identity, token())
}

/// A token per value of this process: with the identity, a value nothing carries yet.
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
