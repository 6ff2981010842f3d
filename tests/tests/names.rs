//! End-to-end test of the names we derive from users' objects (issue 47): every object the
//! API server and the webhook admit is one the controller serves, whatever the length of its
//! name, and one it cannot serve is refused at admission naming the field and the limit.
//!
//! The derived fields: a pool's children carry its name as their `nodeipam.io/pool` label
//! value (at most 63 characters) and a name of their own made from it (`child_name`); every
//! Event about a Node, config or pool is named after the object (`<name>.<time>`), which the
//! API server refuses past 253 characters. Names of 63, 64 and 253 characters of each kind.

mod support;

use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use nodeipam_controller::reconcile::Options;
use nodeipam_crd::pool::{
    NodeIPAMPoolSpec, PoolFamilySpec, PoolHeadroom, PoolRanges, PoolScaleDown,
};
use nodeipam_crd::{NodeIPAMPool, POOL_LABEL, is_child_of};
use support::*;

/// A DNS subdomain of exactly `len` characters starting with `prefix`.
fn name_of(prefix: &str, len: usize) -> String {
    format!("{prefix}-{}", "x".repeat(len - prefix.len() - 1))
}

fn pool_spec(cidr: &str, label: &str) -> NodeIPAMPoolSpec {
    NodeIPAMPoolSpec {
        ipv4: Some(PoolFamilySpec {
            cidrs: vec![cidr.into()],
            range_mask_size: 20,
            per_node_mask_size: 24,
        }),
        ipv6: None,
        node_selector: selector(&[("names", "In", &[label])]),
        ranges: PoolRanges::default(),
        headroom: PoolHeadroom::default(),
        scale_down: PoolScaleDown::default(),
    }
}

async fn create_pool(
    client: &Client,
    name: &str,
    spec: NodeIPAMPoolSpec,
) -> Result<NodeIPAMPool, kube::Error> {
    Api::<NodeIPAMPool>::all(client.clone())
        .create(&PostParams::default(), &NodeIPAMPool::new(name, spec))
        .await
}

/// Ready of the pool `name`: (status, reason, message).
async fn pool_ready(client: &Client, name: &str) -> Option<(String, String, String)> {
    let pool = Api::<NodeIPAMPool>::all(client.clone())
        .get(name)
        .await
        .ok()?;
    let c = pool
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status, c.reason, c.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admitted_name_is_served_and_a_pool_name_past_a_label_value_is_refused() {
    let cp = control_plane().await;
    let client = cp.client();

    // A pool named past a label value, stored as one from before the webhook's check (or
    // created while no webhook ran): the controller says why it serves nothing.
    let stale = name_of("stale", 64);
    create_pool(&client, &stale, pool_spec("10.120.0.0/16", "stale"))
        .await
        .expect("the API server itself admits a 64-character pool name");
    create_node(&client, &name_of("waits", 253), &[("names", "stale")]).await;

    let _controller = start_controller(client.clone(), Options::default());
    let _hook = with_webhook(&cp).await;

    // Pools through the webhook: 63 characters admitted and served, 64 and 253 refused.
    let fits = name_of("fits", 63);
    create_pool(&client, &fits, pool_spec("10.121.0.0/16", "fits"))
        .await
        .expect("a 63-character pool name is admitted");
    for (len, cidr) in [(64, "10.122.0.0/16"), (253, "10.123.0.0/16")] {
        let name = name_of("long", len);
        match create_pool(&client, &name, pool_spec(cidr, "long")).await {
            Ok(_) => {
                panic!("a {len}-character pool name was admitted: its children cannot carry it")
            }
            Err(kube::Error::Api(s)) => {
                let fields: Vec<_> = s
                    .details
                    .iter()
                    .flat_map(|d| &d.causes)
                    .map(|c| c.field.as_str())
                    .collect();
                assert!(
                    fields.contains(&"metadata.name"),
                    "{len}: {fields:?}: {}",
                    s.message
                );
                assert!(
                    s.message.contains(&format!("{len} characters")),
                    "{}",
                    s.message
                );
                assert!(s.message.contains("at most 63"), "{}", s.message);
            }
            Err(e) => panic!("{len}: {e}"),
        }
    }
    let pooled = name_of("pooled", 253);
    create_node(&client, &pooled, &[("names", "fits")]).await;
    let cidrs = wait_cidrs(&client, &pooled).await;
    assert!(cidrs[0].starts_with("10.121."), "{cidrs:?}");
    let pool = Api::<NodeIPAMPool>::all(client.clone())
        .get(&fits)
        .await
        .expect("get the pool");
    let configs = Api::<nodeipam_crd::NodeIPAMConfig>::all(client.clone());
    let children: Vec<_> = configs
        .list(&ListParams::default())
        .await
        .expect("list configs")
        .items
        .into_iter()
        .filter(|c| is_child_of(c, &pool))
        .collect();
    assert!(!children.is_empty(), "the 63-character pool carved");
    for child in &children {
        assert_eq!(child.labels().get(POOL_LABEL), Some(&fits));
    }

    let (status, _, message) = wait_for("the 64-character pool Invalid", || async {
        pool_ready(&client, &stale)
            .await
            .filter(|(_, r, _)| r == "Invalid")
    })
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains("metadata.name") && message.contains("at most 63"),
        "{message}"
    );
    let labelled = configs
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={stale}")))
        .await;
    assert!(
        labelled.map(|l| l.items.is_empty()).unwrap_or(true),
        "nothing was carved for the 64-character pool"
    );

    // Configs of 63, 64 and 253 characters, one block each, and two nodes of 253 characters
    // for each: the first served, the second told there is no block (an Event on a
    // 253-character Node), the config Exhausted (an Event on the config).
    for (i, len) in [63, 64, 253].into_iter().enumerate() {
        let config = name_of("config", len);
        let label = format!("config-{len}");
        create_config(
            &client,
            &config,
            spec(
                family(&format!("10.112.{i}.0/24"), 24),
                None,
                selector(&[("names", "In", &[&label])]),
            ),
        )
        .await;
        let served = name_of(&format!("served{i}"), 253);
        create_node(&client, &served, &[("names", &label)]).await;
        let cidrs = wait_cidrs(&client, &served).await;
        assert_eq!(cidrs, [format!("10.112.{i}.0/24")], "{len}");
        let waiting = name_of(&format!("waiting{i}"), 253);
        create_node(&client, &waiting, &[("names", &label)]).await;
        let event = wait_event(&client, &waiting, "CIDRNotAvailable").await;
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        let event = wait_event(&client, &config, "Exhausted").await;
        assert!(event.metadata.name.unwrap_or_default().len() <= 253);
    }
    assert_invariant(&client, &[]).await;
    cp.stop().await;
}
