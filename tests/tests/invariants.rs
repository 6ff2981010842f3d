//! End-to-end tests against a real kube-apiserver, one per hole a review found in the allocation
//! invariants (a Service range handed out after its second watch event, a half-failed publish
//! trusted, unmanaged podCIDRs never published, an overlapping config that never drains, a
//! starved writer, a rejected write retried forever, a /0 range, status edits, published
//! ConfigMaps never repaired, a stale pending gauge). Each test failed before its fix.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::{ServiceCIDR, ServiceCIDRSpec};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use nodeipam_controller::metrics::Kind;
use nodeipam_controller::reconcile::Options;
use support::*;

const NS: &str = "nodeipam-system";
const CM: &str = "nodeipam-pod-network";
const MASQ: &str = "kube-system/ip-masq-agent";

async fn configmap(client: &Client, ns: &str, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("get ConfigMap {ns}/{name}: {e}"))
}

fn data(cm: &ConfigMap, key: &str) -> String {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
        .unwrap_or_default()
}

/// Waits until the pod-network ConfigMap's `key` lists `cidr`.
async fn wait_published(client: &Client, key: &str, cidr: &str) -> ConfigMap {
    wait_for(&format!("{CM} {key} to list {cidr}"), || async {
        let cm = configmap(client, NS, CM).await?;
        data(&cm, key).split(',').any(|c| c == cidr).then_some(cm)
    })
    .await
}

fn counter(ctl: &Controller, kind: &str) -> u64 {
    ctl.metrics
        .reconcile_errors
        .get_or_create(&Kind { kind: kind.into() })
        .get()
}

/// A ValidatingAdmissionPolicy `name` denying what `rule` matches unless `validation` holds,
/// and its binding; the API server enforces it a moment after this returns.
async fn create_policy(
    client: &Client,
    name: &str,
    rule: NamedRuleWithOperations,
    validation: Validation,
) {
    let policy = ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                resource_rules: Some(vec![rule]),
                ..Default::default()
            }),
            validations: Some(vec![validation]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await
        .expect("create ValidatingAdmissionPolicy");
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: name.into(),
            validation_actions: vec!["Deny".into()],
            ..Default::default()
        },
    };
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create ValidatingAdmissionPolicyBinding");
}

/// A ValidatingAdmissionPolicy that refuses every update of a Node labelled
/// `test.nodeipam.io/reject`, the way a site's admission policy on Nodes would; returns once
/// the API server enforces it.
async fn reject_updates_of_labelled_nodes(client: &Client) {
    let rule = NamedRuleWithOperations {
        api_groups: Some(vec![String::new()]),
        api_versions: Some(vec!["v1".into()]),
        operations: Some(vec!["UPDATE".into()]),
        resources: Some(vec!["nodes".into()]),
        ..Default::default()
    };
    let validation = Validation {
        expression:
            "!has(object.metadata.labels) || !('test.nodeipam.io/reject' in object.metadata.labels)"
                .into(),
        message: Some("updates of this node are refused by site policy".into()),
        ..Default::default()
    };
    create_policy(client, "reject-labelled-nodes", rule, validation).await;
    // The policy takes effect once the API server's informers have it: probe until refused.
    create_node(client, "policy-probe", &[("test.nodeipam.io/reject", "1")]).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    wait_for("the admission policy to refuse node updates", || async {
        let patch = serde_json::json!({"metadata": {"annotations": {"probe": "1"}}});
        nodes
            .patch(
                "policy-probe",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .is_err()
            .then_some(())
    })
    .await;
    delete_node(client, "policy-probe").await;
}

async fn allow_node_updates(client: &Client) {
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .delete("reject-labelled-nodes", &DeleteParams::default())
        .await
        .expect("delete the policy binding");
}

// ----- 1. Service ranges keep their exclusion across updates -----

#[tokio::test]
async fn an_updated_service_cidr_stays_excluded() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_ready_config(&c, "pods", spec(family("10.200.0.0/22", 24), None, None)).await;
    let services: Api<ServiceCIDR> = Api::all(c.clone());
    let extra = ServiceCIDR {
        metadata: ObjectMeta {
            name: Some("extra".into()),
            ..Default::default()
        },
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(vec!["10.200.0.0/24".into()]),
        }),
        ..Default::default()
    };
    services
        .create(&PostParams::default(), &extra)
        .await
        .expect("create ServiceCIDR extra");
    // Any update of the object (here a label, in a real cluster kcm's finalizer and status)
    // arrives as a second watch event for the same source.
    for i in 0..3 {
        let patch = serde_json::json!({"metadata": {"labels": {"t": i.to_string()}}});
        services
            .patch("extra", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("label ServiceCIDR extra");
    }
    for i in 0..4 {
        create_node(&c, &format!("n{i}"), &[]).await;
    }
    // Three /24 blocks are free; the fourth node must wait instead of getting 10.200.0.0/24.
    let got = wait_for("three nodes allocated", || async {
        let mut got = Vec::new();
        for i in 0..4 {
            got.extend(pod_cidrs(&get_node(&c, &format!("n{i}")).await?));
        }
        (got.len() == 3).then_some(got)
    })
    .await;
    assert!(
        !got.contains(&"10.200.0.0/24".to_string()),
        "a block inside the Service range was handed out: {got:?}"
    );
    wait_condition(&c, "pods", "Exhausted", "True", None).await;
    assert_invariant(&c, &[]).await;
}

/// Found by the simulator: a write being retried kept writing its blocks after a ServiceCIDR
/// was created over them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_whose_block_became_a_service_range_chooses_again() {
    let cp = control_plane().await;
    let c = cp.client();
    reject_updates_of_labelled_nodes(&c).await;
    let options = Options {
        write_attempts: 1000,
        ..Options::default()
    };
    let ctl = start_controller(c.clone(), options);
    create_ready_config(&c, "pods", spec(family("10.73.0.0/24", 26), None, None)).await;
    create_node(&c, "held", &[("test.nodeipam.io/reject", "1")]).await;
    // A fresh range hands out its first block first.
    let first = "10.73.0.0/26".to_string();
    wait_for("the first write to be refused and retried", || async {
        (counter(&ctl, "node_write") >= 1).then_some(())
    })
    .await;
    let services: Api<ServiceCIDR> = Api::all(c.clone());
    let late = ServiceCIDR {
        metadata: ObjectMeta {
            name: Some("late".into()),
            ..Default::default()
        },
        spec: Some(ServiceCIDRSpec {
            cidrs: Some(vec![first.clone()]),
        }),
        ..Default::default()
    };
    services
        .create(&PostParams::default(), &late)
        .await
        .expect("create ServiceCIDR late");
    // The retries go on with other blocks once the controller has seen the Service range.
    wait_for("a retry with other blocks", || async {
        events_for(&c, "held", "CIDRAssignmentFailed")
            .await
            .into_iter()
            .filter_map(|e| e.note)
            .find(|n| n.contains("keeps failing") && !n.contains(&first))
    })
    .await;
    allow_node_updates(&c).await;
    let got = wait_cidrs(&c, "held").await;
    assert_ne!(
        got,
        vec![first.clone()],
        "written into the Service range {first}"
    );
    assert_invariant(&c, &[]).await;
}

// ----- 2. Ordered add waits for every consumer output -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_is_not_allocated_from_until_ip_masq_agent_has_it() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    namespace(&c, "kube-system").await;
    let masq: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    // A config we cannot extend: the ip-masq-agent write fails after the pod-network one.
    let broken = ConfigMap {
        metadata: ObjectMeta {
            name: Some("ip-masq-agent".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "config".to_string(),
            "nonMasqueradeCIDRs: [unclosed".to_string(),
        )])),
        ..Default::default()
    };
    masq.create(&PostParams::default(), &broken)
        .await
        .expect("create ip-masq-agent ConfigMap");
    let ctl = start_controller(c.clone(), publishing(Some(MASQ), &[]));
    create_config(&c, "pods", spec(family("10.61.0.0/16", 24), None, None)).await;
    wait_published(&c, "ipv4", "10.61.0.0/16").await;
    // The Ready message names the first gate still shut: the finalizer may come after the
    // pod-network write, so it can say that first; then it must name the output behind.
    let what = "Ready=False Pending, its message naming ip-masq-agent and the range";
    wait_condition_where(&c, "pods", what, "Ready", |ready| {
        ready.status == "False"
            && ready.reason == "Pending"
            && ready.message.contains(MASQ)
            && ready.message.contains("10.61.0.0/16")
    })
    .await;
    // A new leader reads what every output holds, not only the pod-network ConfigMap.
    stop_controller(ctl).await;
    let _ctl = start_controller(c.clone(), publishing(Some(MASQ), &[]));
    create_node(&c, "n0", &[]).await;
    wait_event(&c, "n0", "CIDRNotAvailable").await;
    wait_condition(&c, "pods", "Ready", "False", Some("Pending")).await;
    assert!(
        pod_cidrs(&get_node(&c, "n0").await.expect("node")).is_empty(),
        "allocated from a range ip-masq-agent does not know"
    );
    // The user repairs their config: the range reaches ip-masq-agent, then the node is served.
    let patch = serde_json::json!({"data": {"config": "masqLinkLocal: true\n"}});
    masq.patch(
        "ip-masq-agent",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("repair ip-masq-agent config");
    let cidrs = wait_cidrs(&c, "n0").await;
    assert!(cidrs[0].starts_with("10.61."), "{cidrs:?}");
    let cm = configmap(&c, "kube-system", "ip-masq-agent")
        .await
        .expect("ip-masq-agent");
    assert!(data(&cm, "config").contains("10.61.0.0/16"), "{cm:?}");
    assert_invariant(&c, &[]).await;
}

// ----- 3. podCIDRs outside every config that appear after start-up are published -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmanaged_pod_cidr_that_appears_later_is_published() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    let _ctl = start_controller(c.clone(), publishing(None, &[]));
    create_ready_config(&c, "pods", spec(family("10.62.0.0/16", 24), None, None)).await;
    wait_published(&c, "ipv4", "10.62.0.0/16").await;
    assert_status_matches(&c, "pods").await;
    // Let the controller's own status and ConfigMap writes come back through its watches, so
    // that the new node below is the only change left to publish.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    // A node that came with its own podCIDR (another IPAM, a migration), after start-up.
    create_node_obj(&c, node("foreign", &[], &["10.99.7.0/24"])).await;
    let cm = wait_published(&c, "unmanaged", "10.99.7.0/24").await;
    assert!(data(&cm, "ipv4").split(',').any(|x| x == "10.99.7.0/24"));
    assert_invariant(&c, &[]).await;
}

// ----- 4. The younger config of an overlapping pair drains -----

#[tokio::test]
async fn deleting_the_younger_of_two_overlapping_configs_completes() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_ready_config(&c, "older", spec(family("10.30.0.0/16", 24), None, None)).await;
    for i in 0..3 {
        create_node(&c, &format!("n{i}"), &[]).await;
        wait_cidrs(&c, &format!("n{i}")).await;
    }
    // No webhook here: the overlap gets in, as it can in a race the webhook cannot see.
    create_config(&c, "younger", spec(family("10.30.0.0/17", 24), None, None)).await;
    wait_condition(&c, "younger", "Ready", "False", Some("Overlap")).await;
    // Its status counts by one rule: the blocks are the older config's, so neither its nodes
    // nor its allocated blocks count them (it showed allocated 3, nodes 0).
    wait_for(
        "the younger config to count none of the older one's blocks",
        || async {
            let st = get_config(&c, "younger").await?.status?;
            let allocated = st.ipv4.map(|f| f.allocated);
            (st.nodes == Some(0) && allocated == Some(0)).then_some(())
        },
    )
    .await;
    delete_config(&c, "younger").await;
    wait_for("the younger config to go away", || async {
        get_config(&c, "younger").await.is_none().then_some(())
    })
    .await;
    // The older one still counts its nodes and keeps its finalizer.
    assert_status_matches(&c, "older").await;
    delete_config(&c, "older").await;
    let cfg = wait_condition(&c, "older", "Drained", "False", Some("NodesRemaining")).await;
    assert_eq!(cfg.status.as_ref().and_then(|s| s.nodes), Some(3));
    for i in 0..3 {
        delete_node(&c, &format!("n{i}")).await;
    }
    wait_for("the older config to go away once drained", || async {
        get_config(&c, "older").await.is_none().then_some(())
    })
    .await;
    assert_invariant(&c, &[]).await;
}

// ----- 5. Backoff does not hold a write slot -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_node_in_backoff_does_not_starve_the_others() {
    let cp = control_plane().await;
    let c = cp.client();
    reject_updates_of_labelled_nodes(&c).await;
    // One write slot, and enough attempts that the rejected node sleeps for seconds.
    let ctl = start_controller(
        c.clone(),
        Options {
            write_concurrency: 1,
            write_attempts: 12,
            ..Options::default()
        },
    );
    create_ready_config(&c, "pods", spec(family("10.70.0.0/16", 24), None, None)).await;
    create_node(&c, "refused", &[("test.nodeipam.io/reject", "1")]).await;
    wait_for("the refused node to be retried a few times", || async {
        (counter(&ctl, "node_write") >= 5).then_some(())
    })
    .await;
    // Now it sleeps 3.2 s before its next attempt. A node created meanwhile is written at once:
    // before the refused node's next attempt is even counted.
    let before = counter(&ctl, "node_write");
    create_node(&c, "ok", &[]).await;
    wait_cidrs(&c, "ok").await;
    let after = counter(&ctl, "node_write");
    assert_eq!(
        before, after,
        "the good node waited until the refused node's backoff ended"
    );
    assert_invariant(&c, &[]).await;
}

// ----- 6. A permanently rejected write gives up, releases, and retries later -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanently_rejected_write_gives_up_and_the_config_still_drains() {
    let cp = control_plane().await;
    let c = cp.client();
    reject_updates_of_labelled_nodes(&c).await;
    let ctl = start_controller(
        c.clone(),
        Options {
            write_attempts: 3,
            retry_rejected_after: std::time::Duration::from_secs(2),
            ..Options::default()
        },
    );
    create_ready_config(&c, "first", spec(family("10.71.0.0/16", 24), None, None)).await;
    create_node(&c, "refused", &[("test.nodeipam.io/reject", "1")]).await;
    let ev = wait_for("a CIDRAssignmentFailed event that gives up", || async {
        events_for(&c, "refused", "CIDRAssignmentFailed")
            .await
            .into_iter()
            .find(|e| e.note.as_deref().is_some_and(|n| n.contains("gave up")))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    wait_for("the give-up to be counted", || async {
        (ctl.metrics.assignment_failures.get() >= 1).then_some(())
    })
    .await;
    // Deleting the config completes although the node is still refused: its blocks were
    // released when we gave up, and a Terminating config hands out nothing new.
    delete_config(&c, "first").await;
    wait_for("the config to drain and go away", || async {
        get_config(&c, "first").await.is_none().then_some(())
    })
    .await;
    // Later, from scratch: once the site lets the update through, the node is served.
    allow_node_updates(&c).await;
    create_config(&c, "second", spec(family("10.72.0.0/16", 24), None, None)).await;
    let cidrs = wait_cidrs(&c, "refused").await;
    assert!(cidrs[0].starts_with("10.72."), "{cidrs:?}");
    assert_status_matches(&c, "second").await;
    assert_invariant(&c, &[]).await;
}

// ----- 7. The widest ranges and masks work -----

#[tokio::test]
async fn the_whole_ipv6_space_as_one_block_does_not_crash_the_controller() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_config(&c, "everything", spec(None, family("::/0", 0), None)).await;
    // Two /1 blocks; the harness's Service range 10.96.0.0/16 lies in the lower one.
    create_config(
        &c,
        "v4",
        spec(
            family("0.0.0.0/0", 1),
            None,
            selector(&[("v4", "In", &["1"])]),
        ),
    )
    .await;
    create_node(&c, "one", &[]).await;
    assert_eq!(wait_cidrs(&c, "one").await, vec!["::/0".to_string()]);
    create_node(&c, "two", &[]).await;
    wait_event(&c, "two", "CIDRNotAvailable").await;
    wait_condition(&c, "everything", "Exhausted", "True", None).await;
    assert_status_matches(&c, "everything").await;
    create_node(&c, "three", &[("v4", "1")]).await;
    assert_eq!(
        wait_cidrs(&c, "three").await,
        vec!["128.0.0.0/1".to_string()]
    );
    assert_status_matches(&c, "v4").await;
    assert_invariant(&c, &[]).await;
}

// ----- 10. The published ConfigMaps are repaired -----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_or_edited_published_configmaps_are_restored() {
    let cp = control_plane().await;
    let c = cp.client();
    namespace(&c, NS).await;
    namespace(&c, "kube-system").await;
    let _ctl = start_controller(c.clone(), publishing(Some(MASQ), &[]));
    create_ready_config(&c, "pods", spec(family("10.64.0.0/16", 24), None, None)).await;
    wait_published(&c, "ipv4", "10.64.0.0/16").await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), NS);
    cms.delete(CM, &DeleteParams::default())
        .await
        .expect("delete the pod-network ConfigMap");
    wait_published(&c, "ipv4", "10.64.0.0/16").await;
    let patch = serde_json::json!({"data": {"ipv4": "", "active": ""}});
    cms.patch(CM, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("edit the pod-network ConfigMap");
    wait_published(&c, "ipv4", "10.64.0.0/16").await;
    wait_published(&c, "active", "10.64.0.0/16").await;
    let masq: Api<ConfigMap> = Api::namespaced(c.clone(), "kube-system");
    wait_for("ip-masq-agent to list the range", || async {
        let cm = masq.get_opt("ip-masq-agent").await.ok()??;
        data(&cm, "config").contains("10.64.0.0/16").then_some(())
    })
    .await;
    let patch =
        serde_json::json!({"data": {"config": "nonMasqueradeCIDRs: []\nmasqLinkLocal: true\n"}});
    masq.patch(
        "ip-masq-agent",
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("edit ip-masq-agent");
    let cm = wait_for("ip-masq-agent to list the range again", || async {
        let cm = masq.get_opt("ip-masq-agent").await.ok()??;
        data(&cm, "config").contains("10.64.0.0/16").then_some(cm)
    })
    .await;
    assert!(
        data(&cm, "config").contains("masqLinkLocal: true"),
        "the user's setting is kept: {cm:?}"
    );
    create_node(&c, "n0", &[]).await;
    wait_cidrs(&c, "n0").await;
    assert_invariant(&c, &[]).await;
}

// ----- 11. Status edited by someone else is corrected -----

#[tokio::test]
async fn a_status_edited_by_someone_else_is_corrected() {
    let cp = control_plane().await;
    let c = cp.client();
    let _ctl = start_controller(c.clone(), Options::default());
    create_ready_config(&c, "pods", spec(family("10.65.0.0/16", 24), None, None)).await;
    create_node(&c, "n0", &[]).await;
    wait_cidrs(&c, "n0").await;
    assert_status_matches(&c, "pods").await;
    let api: Api<nodeipam_crd::NodeIPAMConfig> = Api::all(c.clone());
    let patch = serde_json::json!({"status": {"nodes": 42, "conditions": []}});
    api.patch_status("pods", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("edit status");
    assert_status_matches(&c, "pods").await;
    wait_condition(&c, "pods", "Ready", "True", Some("Accepting")).await;
}

// ----- 14. The pending gauge follows every change -----

#[tokio::test]
async fn the_pending_gauge_counts_every_waiting_node() {
    let cp = control_plane().await;
    let c = cp.client();
    let ctl = start_controller(c.clone(), Options::default());
    for name in ["a", "b"] {
        create_node(&c, name, &[]).await;
        wait_event(&c, name, "CIDRNotAvailable").await;
    }
    // Each event is sent after the decision that leaves the node pending.
    assert_eq!(ctl.metrics.pending_nodes.get(), 2);
    create_config(&c, "pods", spec(family("10.66.0.0/16", 24), None, None)).await;
    wait_cidrs(&c, "a").await;
    wait_cidrs(&c, "b").await;
    wait_for("the gauge to drop to 0", || async {
        (ctl.metrics.pending_nodes.get() == 0).then_some(())
    })
    .await;
    set_allocation(&c, "pods", nodeipam_crd::Allocation::Disabled).await;
    wait_condition(&c, "pods", "Ready", "False", Some("Disabled")).await;
    for name in ["c", "d"] {
        create_node(&c, name, &[]).await;
        wait_event(&c, name, "CIDRNotAvailable").await;
    }
    assert_eq!(ctl.metrics.pending_nodes.get(), 2);
    assert_invariant(&c, &[]).await;
}

/// The writers' context, as the allocation loop has it, for calling a writer directly.
fn writer_context(client: &kube::Client) -> nodeipam_controller::reconcile::Context {
    nodeipam_controller::reconcile::Context::new(
        client.clone(),
        nodeipam_controller::reconcile::Options::default(),
        std::sync::Arc::new(nodeipam_controller::metrics::Metrics::new()),
    )
}

/// A ValidatingAdmissionPolicy refusing every status write of NodeIPAMConfigs with a 422
/// (reason Invalid), as a site's policy or a schema would.
async fn refuse_config_status_writes(client: &Client) {
    let rule = NamedRuleWithOperations {
        api_groups: Some(vec!["nodeipam.io".into()]),
        api_versions: Some(vec!["*".into()]),
        operations: Some(vec!["UPDATE".into()]),
        resources: Some(vec!["nodeipamconfigs/status".into()]),
        ..Default::default()
    };
    let validation = Validation {
        expression: "false".into(),
        message: Some("status writes are refused by site policy".into()),
        reason: Some("Invalid".into()),
        ..Default::default()
    };
    create_policy(client, "refuse-config-status", rule, validation).await;
}

/// A 422 on a status write to the very object the status was computed for (a site policy, a
/// schema) is a refusal, not "the config was created again": it is an error, retried and
/// counted, never dropped as done (else the status stays wrong until something else changes).
#[tokio::test]
async fn a_status_refused_with_a_422_for_the_same_config_is_an_error() {
    let cp = control_plane().await;
    let c = cp.client();
    let api: Api<nodeipam_crd::NodeIPAMConfig> = Api::all(c.clone());
    let cfg =
        nodeipam_crd::NodeIPAMConfig::new("refused", spec(family("10.69.0.0/16", 24), None, None));
    api.create(&PostParams::default(), &cfg)
        .await
        .expect("create");
    let uid = get_config(&c, "refused")
        .await
        .and_then(|c| c.metadata.uid)
        .expect("uid");
    refuse_config_status_writes(&c).await;
    let ctx = writer_context(&c);
    let status = nodeipam_crd::NodeIPAMConfigStatus {
        nodes: Some(7),
        ..Default::default()
    };
    // Until the API server enforces the policy, the write lands.
    let refused = wait_for("the policy to refuse status writes", || async {
        let written = nodeipam_controller::reconcile::config_writer::write_status(
            &ctx,
            &api,
            "refused",
            Some(&uid),
            &status,
        )
        .await;
        (!matches!(written, Ok(true))).then_some(written)
    })
    .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422),
        "a refusal on the same object must be an error, not 'created again': {refused:?}"
    );
}

// ----- Suspected: the finalizer removal is guarded by the UID -----

/// The finalizer is removed with a JSON patch that tests the UID the decision was made for:
/// the API server refuses it on a config re-created under the same name.
#[tokio::test]
async fn a_finalizer_removal_for_a_recreated_config_is_refused() {
    let cp = control_plane().await;
    let c = cp.client();
    let mut cfg = nodeipam_crd::NodeIPAMConfig::new(
        "same-name",
        spec(family("10.67.0.0/16", 24), None, None),
    );
    cfg.metadata.finalizers = Some(vec![nodeipam_crd::FINALIZER.into()]);
    let api: Api<nodeipam_crd::NodeIPAMConfig> = Api::all(c.clone());
    api.create(&PostParams::default(), &cfg)
        .await
        .expect("create");
    let ctx = writer_context(&c);
    let removed = nodeipam_controller::reconcile::config_writer::remove_finalizer(
        &ctx,
        &api,
        "same-name",
        "00000000-0000-0000-0000-000000000000",
    )
    .await;
    assert!(
        !matches!(removed, Ok(true)),
        "a removal for another object's UID must not happen: {removed:?}"
    );
    let now = get_config(&c, "same-name").await.expect("config");
    assert_eq!(
        now.metadata.finalizers,
        Some(vec![nodeipam_crd::FINALIZER.to_string()]),
        "the finalizer of the new object must stay"
    );
}

/// Found by the simulator: a status computed for a config that was then deleted (its
/// finalizer released) and created again under the same name landed on the new object,
/// which then said Drained while a node held a block from it. A status is written to the
/// object it was computed for, or not at all.
#[tokio::test]
async fn a_status_for_a_recreated_config_is_not_written() {
    let cp = control_plane().await;
    let c = cp.client();
    let api: Api<nodeipam_crd::NodeIPAMConfig> = Api::all(c.clone());
    let cfg = nodeipam_crd::NodeIPAMConfig::new(
        "same-name",
        spec(family("10.68.0.0/16", 24), None, None),
    );
    api.create(&PostParams::default(), &cfg)
        .await
        .expect("create");
    let status = nodeipam_crd::NodeIPAMConfigStatus {
        nodes: Some(7),
        ..Default::default()
    };
    let ctx = writer_context(&c);
    let written = nodeipam_controller::reconcile::config_writer::write_status(
        &ctx,
        &api,
        "same-name",
        Some("00000000-0000-0000-0000-000000000000"),
        &status,
    )
    .await;
    assert!(
        matches!(written, Ok(false)),
        "a status for another object's UID must not be written: {written:?}"
    );
    let now = get_config(&c, "same-name").await.expect("config");
    assert_eq!(
        now.status.and_then(|s| s.nodes),
        None,
        "the new object's status stays"
    );
    let uid = get_config(&c, "same-name")
        .await
        .and_then(|c| c.metadata.uid);
    let written = nodeipam_controller::reconcile::config_writer::write_status(
        &ctx,
        &api,
        "same-name",
        uid.as_deref(),
        &status,
    )
    .await;
    assert!(matches!(written, Ok(true)), "{written:?}");
    let now = get_config(&c, "same-name").await.expect("config");
    assert_eq!(now.status.and_then(|s| s.nodes), Some(7));
}
