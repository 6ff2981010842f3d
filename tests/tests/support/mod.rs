//! Shared end-to-end helpers: a control plane with the controller running in-process, object
//! builders, polling, and the global invariant (no two nodes hold overlapping podCIDRs).
//! [`process`] runs the `nodeipam` binary as a child; [`scrape`] reads it as a scraper would.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, NodeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use nodeipam_controller::metrics::Metrics;
use nodeipam_controller::reconcile::{self, Context, Options};
use nodeipam_crd::{Allocation, FamilySpec, NodeIPAMConfig, NodeIPAMConfigSpec};
use nodeipam_testenv::ControlPlane;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub mod process;
pub mod record;
pub mod scrape;

/// Generous: a wait that fails means the behaviour is missing, not slow. Never a duration
/// assertion.
pub const WAIT: Duration = Duration::from_secs(60);

pub async fn control_plane() -> ControlPlane {
    match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => panic!("the control plane did not start: {e}"),
    }
}

/// The controller running in this process against `client`, stopped on drop.
pub struct Controller {
    handle: JoinHandle<()>,
    pub leadership: watch::Sender<bool>,
    pub metrics: Arc<Metrics>,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

pub fn start_controller(client: Client, options: Options) -> Controller {
    let metrics = Arc::new(Metrics::new());
    let ctx = Arc::new(Context::new(client, options, metrics.clone()));
    let (tx, rx) = reconcile::always_leader();
    let handle = tokio::spawn(reconcile::run(ctx, rx));
    Controller {
        handle,
        leadership: tx,
        metrics,
    }
}

pub async fn stop_controller(c: Controller) {
    c.handle.abort();
    let _ = (&mut { c }.handle).await;
}

pub fn family(cidr: &str, mask: u8) -> Option<FamilySpec> {
    Some(FamilySpec {
        cidr: cidr.into(),
        per_node_mask_size: mask,
    })
}

pub fn spec(
    ipv4: Option<FamilySpec>,
    ipv6: Option<FamilySpec>,
    selector: Option<NodeSelector>,
) -> NodeIPAMConfigSpec {
    NodeIPAMConfigSpec {
        ipv4,
        ipv6,
        node_selector: selector,
        allocation: Allocation::Enabled,
    }
}

/// A selector with one term of `key In values` requirements.
pub fn selector(reqs: &[(&str, &str, &[&str])]) -> Option<NodeSelector> {
    Some(NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(
                reqs.iter()
                    .map(|(k, op, vals)| NodeSelectorRequirement {
                        key: (*k).into(),
                        operator: (*op).into(),
                        values: (!vals.is_empty())
                            .then(|| vals.iter().map(|v| v.to_string()).collect()),
                    })
                    .collect(),
            ),
            match_fields: None,
        }],
    })
}

pub async fn create_config(
    client: &Client,
    name: &str,
    spec: NodeIPAMConfigSpec,
) -> NodeIPAMConfig {
    let api: Api<NodeIPAMConfig> = Api::all(client.clone());
    let obj = NodeIPAMConfig::new(name, spec);
    match api.create(&PostParams::default(), &obj).await {
        Ok(o) => o,
        Err(e) => panic!("create NodeIPAMConfig {name}: {e}"),
    }
}

/// Creates a config and waits until the controller accepts allocations from it, so nodes
/// created next cannot race ahead to a catch-all config.
pub async fn create_ready_config(
    client: &Client,
    name: &str,
    spec: NodeIPAMConfigSpec,
) -> NodeIPAMConfig {
    create_config(client, name, spec).await;
    wait_condition(client, name, "Ready", "True", None).await
}

pub async fn set_allocation(client: &Client, name: &str, allocation: Allocation) {
    let api: Api<NodeIPAMConfig> = Api::all(client.clone());
    let patch = serde_json::json!({ "spec": { "allocation": allocation } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("set allocation of {name}: {e}"));
}

pub async fn delete_config(client: &Client, name: &str) {
    let api: Api<NodeIPAMConfig> = Api::all(client.clone());
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete NodeIPAMConfig {name}: {e}"));
}

pub fn node(name: &str, labels: &[(&str, &str)], pod_cidrs: &[&str]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: (!pod_cidrs.is_empty()).then(|| NodeSpec {
            pod_cidr: pod_cidrs.first().map(|c| c.to_string()),
            pod_cidrs: Some(pod_cidrs.iter().map(|c| c.to_string()).collect()),
            ..NodeSpec::default()
        }),
        ..Node::default()
    }
}

pub async fn create_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Node {
    create_node_obj(client, node(name, labels, &[])).await
}

pub async fn create_node_obj(client: &Client, n: Node) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    let name = n.name_any();
    api.create(&PostParams::default(), &n)
        .await
        .unwrap_or_else(|e| panic!("create node {name}: {e}"))
}

pub async fn delete_node(client: &Client, name: &str) {
    let api: Api<Node> = Api::all(client.clone());
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete node {name}: {e}"));
}

pub async fn get_node(client: &Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get node {name}: {e}"))
}

pub async fn get_config(client: &Client, name: &str) -> Option<NodeIPAMConfig> {
    Api::<NodeIPAMConfig>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get config {name}: {e}"))
}

pub fn pod_cidrs(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
}

/// Polls `check` every 50 ms until it returns `Some`, or panics after [`WAIT`] saying `what`.
pub async fn wait_for<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_within(WAIT, what, check).await
}

/// [`wait_for`] for a behaviour that itself takes up to `limit` (a backoff schedule, a late
/// write): not a duration under test, only how long "missing" takes to say.
pub async fn wait_for_within<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        // A check stuck on an API call must not outlive the deadline either.
        if let Ok(Some(v)) = tokio::time::timeout_at(deadline, check()).await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the node has podCIDRs and returns them.
pub async fn wait_cidrs(client: &Client, name: &str) -> Vec<String> {
    wait_for(&format!("podCIDRs on node {name}"), || async {
        get_node(client, name)
            .await
            .map(|n| pod_cidrs(&n))
            .filter(|c| !c.is_empty())
    })
    .await
}

pub fn condition(cfg: &NodeIPAMConfig, type_: &str) -> Option<(String, String)> {
    cfg.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Waits until `type_` of config `name` is the condition `holds` wants (its status, reason and
/// message); returns that condition.
pub async fn wait_condition_where(
    client: &Client,
    name: &str,
    what: &str,
    type_: &str,
    holds: impl Fn(&Condition) -> bool,
) -> Condition {
    wait_for(what, || async {
        let cfg = get_config(client, name).await?;
        let mut conditions = cfg.status?.conditions.into_iter();
        conditions.find(|c| c.type_ == type_).filter(&holds)
    })
    .await
}

/// Waits until `type_` of config `name` has `status` (and `reason`, if given).
pub async fn wait_condition(
    client: &Client,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> NodeIPAMConfig {
    wait_for(&format!("{name} {type_}={status} {reason:?}"), || async {
        let cfg = get_config(client, name).await?;
        let (s, r) = condition(&cfg, type_)?;
        (s == status && reason.is_none_or(|want| want == r)).then_some(cfg)
    })
    .await
}

/// Warning events with `reason` about the object `name`.
pub async fn events_for(
    client: &Client,
    name: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client.clone());
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

pub async fn wait_event(
    client: &Client,
    name: &str,
    reason: &str,
) -> k8s_openapi::api::events::v1::Event {
    wait_for(&format!("a {reason} event on {name}"), || async {
        events_for(client, name, reason).await.into_iter().next()
    })
    .await
}

/// The global invariant after every test: no two nodes hold overlapping podCIDRs (pairs that
/// `allowed` names were created overlapping on purpose), no podCIDR overlaps a ServiceCIDR,
/// every podCIDR lies in every published output that exists, and every podCIDR the controller
/// wrote lies inside the config named by its annotation.
pub async fn assert_invariant(client: &Client, allowed: &[(&str, &str)]) {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items;
    let configs: BTreeMap<String, NodeIPAMConfig> = Api::<NodeIPAMConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list configs")
        .items
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    let held: Vec<(String, IpNet)> = nodes
        .iter()
        .flat_map(|n| {
            pod_cidrs(n)
                .into_iter()
                .map(move |c| (n.name_any(), c.parse::<IpNet>().expect("podCIDR parses")))
        })
        .collect();
    for (i, (na, a)) in held.iter().enumerate() {
        for (nb, b) in &held[i + 1..] {
            let overlap = na != nb && (a.contains(&b.network()) || b.contains(&a.network()));
            let ok = allowed
                .iter()
                .any(|(x, y)| (x == na && y == nb) || (x == nb && y == na));
            assert!(
                !overlap || ok,
                "INVARIANT BROKEN: node {na} holds {a} and node {nb} holds {b}"
            );
        }
    }
    assert_outside_service_ranges(client, &held).await;
    assert_published(client, &held).await;
    for n in &nodes {
        let Some(owner) = n.annotations().get("nodeipam.io/config") else {
            continue;
        };
        let Some(cfg) = configs.get(owner) else {
            continue;
        };
        for c in pod_cidrs(n) {
            let c: IpNet = c.parse().expect("podCIDR parses");
            let range = match c {
                IpNet::V4(_) => cfg.spec.ipv4.as_ref(),
                IpNet::V6(_) => cfg.spec.ipv6.as_ref(),
            };
            let range: IpNet = range
                .map(|f| f.cidr.parse().expect("range parses"))
                .unwrap_or_else(|| panic!("{owner} has no family for {c}"));
            assert!(
                range.contains(&c),
                "node {} holds {c} outside its config {owner} ({range})",
                n.name_any()
            );
        }
    }
}

/// Counts from the Nodes: (nodes overlapping the config, IPv4 blocks, IPv6 blocks).
pub async fn recount(client: &Client, cfg: &NodeIPAMConfig) -> (u64, u64, u64) {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes")
        .items;
    let ranges: Vec<(IpNet, u8)> = [&cfg.spec.ipv4, &cfg.spec.ipv6]
        .into_iter()
        .flatten()
        .map(|f| (f.cidr.parse().expect("range parses"), f.per_node_mask_size))
        .collect();
    let mut count = 0;
    let mut blocks = [
        std::collections::BTreeSet::new(),
        std::collections::BTreeSet::new(),
    ];
    for n in &nodes {
        let mut hit = false;
        for c in pod_cidrs(n) {
            let c: IpNet = c.parse().expect("podCIDR parses");
            for (i, (r, mask)) in ranges.iter().enumerate() {
                if !(r.contains(&c.network()) || c.contains(&r.network())) {
                    continue;
                }
                hit = true;
                let fam = usize::from(matches!(r, IpNet::V6(_)));
                let _ = i;
                // Each block of the range the podCIDR touches.
                let sub = if c.prefix_len() >= *mask {
                    vec![IpNet::new(c.network(), *mask).expect("mask").trunc()]
                } else {
                    c.subnets(*mask)
                        .expect("subnets")
                        .filter(|s| r.contains(s))
                        .collect()
                };
                blocks[fam].extend(sub);
            }
        }
        count += u64::from(hit);
    }
    (count, blocks[0].len() as u64, blocks[1].len() as u64)
}

/// Waits until the config's status counts equal a recount from the Nodes.
pub async fn assert_status_matches(client: &Client, name: &str) {
    wait_for(
        &format!("status of {name} to match a recount from the Nodes"),
        || async {
            let cfg = get_config(client, name).await?;
            let (nodes, v4, v6) = recount(client, &cfg).await;
            let st = cfg.status.as_ref()?;
            let ok = st.nodes == Some(nodes)
                && st.ipv4.map(|f| f.allocated) == cfg.spec.ipv4.as_ref().map(|_| v4)
                && st.ipv6.map(|f| f.allocated) == cfg.spec.ipv6.as_ref().map(|_| v6)
                && st.observed_generation == cfg.metadata.generation;
            ok.then_some(())
        },
    )
    .await
}

fn nets_overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// No podCIDR overlaps a range of a ServiceCIDR object.
async fn assert_outside_service_ranges(client: &Client, held: &[(String, IpNet)]) {
    let services = Api::<k8s_openapi::api::networking::v1::ServiceCIDR>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list ServiceCIDRs")
        .items;
    for s in &services {
        let ranges = s
            .spec
            .as_ref()
            .and_then(|s| s.cidrs.clone())
            .unwrap_or_default();
        for r in ranges {
            let r: IpNet = r.parse().expect("ServiceCIDR parses");
            for (node, c) in held {
                assert!(
                    !nets_overlap(&r, c),
                    "INVARIANT BROKEN: node {node} holds {c} inside Service range {r} of ServiceCIDR {}",
                    s.name_any()
                );
            }
        }
    }
}

/// Every podCIDR lies in the published pod network and in the ip-masq-agent config we manage,
/// where they exist.
async fn assert_published(client: &Client, held: &[(String, IpNet)]) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let get = |ns: &str, name: &str| {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let name = name.to_string();
        async move { api.get_opt(&name).await.expect("get ConfigMap") }
    };
    let mut outputs: Vec<(String, Vec<IpNet>)> = Vec::new();
    if let Some(cm) = get("nodeipam-system", "nodeipam-pod-network").await {
        let data = cm.data.unwrap_or_default();
        let cidrs = ["ipv4", "ipv6"]
            .iter()
            .filter_map(|k| data.get(*k))
            .flat_map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()))
            .collect();
        outputs.push(("nodeipam-system/nodeipam-pod-network".into(), cidrs));
    }
    if let Some(cm) = get("kube-system", "ip-masq-agent").await
        && cm
            .labels()
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("nodeipam")
    {
        let config = cm
            .data
            .unwrap_or_default()
            .remove("config")
            .unwrap_or_default();
        let doc: serde_json::Value = serde_saphyr::from_str(&config).expect("ip-masq-agent config");
        let cidrs = doc["nonMasqueradeCIDRs"]
            .as_array()
            .map(|s| s.iter().filter_map(|x| x.as_str()?.parse().ok()).collect())
            .unwrap_or_default();
        outputs.push(("kube-system/ip-masq-agent".into(), cidrs));
    }
    for (output, cidrs) in &outputs {
        for (node, c) in held {
            assert!(
                cidrs.iter().any(|p: &IpNet| p.contains(c)),
                "INVARIANT BROKEN: node {node} holds {c}, which {output} does not list ({cidrs:?})"
            );
        }
    }
}

/// Options that publish the pod network to `nodeipam-system/nodeipam-pod-network`, and to
/// ip-masq-agent's ConfigMap (`namespace/name`) when given, with `extra` non-masquerade CIDRs.
pub fn publishing(ip_masq: Option<&str>, extra: &[&str]) -> Options {
    use nodeipam_controller::reconcile::publisher::{ConfigMapRef, PublishOptions};
    Options {
        publish: PublishOptions {
            pod_network: Some(ConfigMapRef {
                namespace: "nodeipam-system".into(),
                name: "nodeipam-pod-network".into(),
            }),
            ip_masq_agent: ip_masq.map(|s| s.parse().expect("ns/name")),
            extra_non_masquerade: extra.iter().map(|c| c.parse().expect("cidr")).collect(),
            typed: Vec::new(),
        },
        ..Options::default()
    }
}

/// Creates a namespace, or finds it there.
pub async fn namespace(client: &Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// The admission webhook, in this process, registered by URL for configs and pools (fail
/// closed), and effective: a dry-run config over the API server's Service range is refused.
pub async fn with_webhook(cp: &nodeipam_testenv::ControlPlane) -> tokio::task::JoinHandle<()> {
    use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
    use nodeipam_webhook::{ManagedTls, TlsMode, VALIDATE_PATH, Webhook, WebhookOptions};
    const HOOK: &str = "validate.nodeipam.io";
    let options = WebhookOptions {
        addr: "127.0.0.1:0".parse().expect("address"),
        namespace: "default".into(),
        secret_name: "nodeipam-webhook-tls".into(),
        webhook_config_name: HOOK.into(),
        dns_names: vec!["127.0.0.1".into(), "localhost".into()],
        tls_mode: TlsMode::Managed(ManagedTls {
            check_interval: std::time::Duration::from_secs(1),
            ..ManagedTls::default()
        }),
        ..WebhookOptions::default()
    };
    let webhook = Webhook::bind(cp.client(), options)
        .await
        .expect("bind the webhook");
    let addr = webhook.local_addr().expect("bound address");
    let readiness = webhook.readiness();
    let handle = tokio::spawn(async move {
        let _ = webhook.run(std::future::pending::<()>()).await;
    });
    wait_for("the webhook to become ready", || {
        let r = readiness.clone();
        async move { r.is_ready().then_some(()) }
    })
    .await;
    let rules = vec![RuleWithOperations {
        api_groups: Some(vec!["nodeipam.io".into()]),
        api_versions: Some(vec!["v1alpha1".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(vec!["nodeipamconfigs".into(), "nodeipampools".into()]),
        scope: Some("Cluster".into()),
    }];
    let url = format!("https://{addr}{VALIDATE_PATH}");
    cp.register_validating_webhook(HOOK, &url, cp.ca_pem().as_bytes(), rules, "Fail")
        .await
        .expect("register the webhook");
    wait_webhook_answers(&cp.client(), "the API server to call the webhook").await;
    handle
}

/// Waits until the API server calls our webhook: a dry-run config over its default Service
/// range (10.96.0.0/16) is refused by the webhook.
pub async fn wait_webhook_answers(client: &Client, what: &str) {
    wait_for(what, || async {
        let api: Api<NodeIPAMConfig> = Api::all(client.clone());
        let probe = NodeIPAMConfig::new("probe", spec(family("10.96.0.0/16", 24), None, None));
        let dry = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match api.create(&dry, &probe).await {
            Err(kube::Error::Api(s)) if s.message.contains("overlaps the Service range") => {
                Some(())
            }
            _ => None,
        }
    })
    .await;
}
