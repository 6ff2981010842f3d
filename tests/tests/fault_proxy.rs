//! End-to-end tests of the fault proxy (`nodeipam_testenv::fault_proxy`) against a real
//! control plane: a client through it lists and watches as a direct one does; an injected 500
//! whose write lands later; a delayed request; an injected 429 with `Retry-After` (and how
//! kube's client answers it); and a `nodeipam` replica given only the proxy's kubeconfig
//! elects itself leader, watches and allocates, so every call of a replica can go through it.

mod support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use http::Method;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use nodeipam_testenv::fault_proxy::{Action, Exchange, INJECTED_MESSAGE, Origin, Rule};
use nodeipam_testenv::{ControlPlane, FaultProxy};
use rustix::process::Signal;
use serde_json::json;
use support::process::{Replica, SA_GROUPS, SA_USER, install_rbac};
use support::*;

/// The identity of the test's own client through the proxy: RBAC lets it do anything.
const TESTER: &str = "fault-proxy-tester";
const MASTERS: &[&str] = &["system:masters"];

fn start_proxy(cp: &ControlPlane, user: &str, groups: &[&str]) -> FaultProxy {
    FaultProxy::for_user(cp, user, groups).unwrap_or_else(|e| panic!("step=start-fault-proxy: {e}"))
}

fn client_through(proxy: &FaultProxy) -> Client {
    proxy
        .client()
        .unwrap_or_else(|e| panic!("step=client-through-proxy: {e}"))
}

/// The statuses the proxy logged for `method` on `path` (exactly), with who answered.
fn answers(proxy: &FaultProxy, method: &Method, path: &str) -> Vec<(u16, Origin)> {
    proxy
        .log()
        .into_iter()
        .filter(|e| e.method == *method && e.path == path)
        .map(|e| (e.status, e.origin))
        .collect()
}

fn label(node: &Node, key: &str) -> Option<String> {
    node.labels().get(key).cloned()
}

async fn label_patch(client: &Client, node: &str, key: &str) -> Result<Node, kube::Error> {
    let patch = json!({ "metadata": { "labels": { key: "yes" } } });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

fn api_code(result: Result<Node, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_through_the_proxy_lists_and_watches_nodes_as_a_direct_one() {
    let cp = control_plane().await;
    let admin = cp.client();
    let proxy = start_proxy(&cp, TESTER, MASTERS);
    let through = Api::<Node>::all(client_through(&proxy));
    create_node(&admin, "a", &[]).await;
    create_node(&admin, "b", &[]).await;

    let direct = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list nodes directly");
    let proxied = through
        .list(&ListParams::default())
        .await
        .expect("list nodes through the proxy");
    let uids = |l: &kube::core::ObjectList<Node>| -> Vec<(String, Option<String>)> {
        l.items.iter().map(|n| (n.name_any(), n.uid())).collect()
    };
    assert_eq!(uids(&proxied), uids(&direct));
    assert_eq!(uids(&proxied).len(), 2);

    // A watch from the list's version: a node created after it started arrives through the
    // proxy's streamed (chunked) answer.
    let version = proxied
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    let mut events = through
        .watch(&WatchParams::default(), &version)
        .await
        .expect("watch nodes through the proxy")
        .boxed();
    create_node(&admin, "c", &[]).await;
    let added = tokio::time::timeout(WAIT, async {
        while let Some(event) = events.try_next().await.expect("watch event") {
            if let WatchEvent::Added(n) = event {
                return n;
            }
        }
        panic!("the watch through the proxy ended before node c was added");
    })
    .await
    .expect("node c's ADDED event through the proxy");
    assert_eq!(added.name_any(), "c");

    let watches: Vec<Exchange> = proxy
        .log()
        .into_iter()
        .filter(|e| e.query.as_deref().is_some_and(|q| q.contains("watch=true")))
        .collect();
    assert_eq!(watches.len(), 1, "{watches:?}");
    assert_eq!(
        (watches[0].status, watches[0].origin),
        (200, Origin::ApiServer)
    );
    drop(events);
    cp.stop().await;
}

/// A PATCH answered 500 by the proxy, sent on 1 s later: its client got an error, yet the
/// write commits. Without `then_land_after` it never reaches the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answered_write_lands_later_or_never() {
    let cp = control_plane().await;
    let admin = cp.client();
    let proxy = start_proxy(&cp, TESTER, MASTERS);
    let through = client_through(&proxy);
    create_node(&admin, "n1", &[]).await;

    let late = proxy.add(
        Rule::new(
            Some(Method::PATCH),
            "/api/v1/nodes/n1",
            Action::Answer {
                status: 500,
                then_land_after: Some(Duration::from_secs(1)),
            },
        )
        .times(1),
    );
    let (code, message) = api_code(label_patch(&through, "n1", "late").await);
    assert_eq!((code, message.as_str()), (500, INJECTED_MESSAGE));
    let now = get_node(&admin, "n1").await.expect("node n1");
    assert_eq!(
        label(&now, "late"),
        None,
        "the answered patch landed at once"
    );
    wait_for("the answered patch to land", || async {
        let n = get_node(&admin, "n1").await?;
        label(&n, "late").map(|_| ())
    })
    .await;
    assert_eq!(late.matched(), 1);
    wait_for("the late landing in the log", || async {
        (answers(&proxy, &Method::PATCH, "/api/v1/nodes/n1")
            == [(500, Origin::Injected), (200, Origin::Landed)])
        .then_some(())
    })
    .await;

    let never = proxy.add(
        Rule::new(
            Some(Method::PATCH),
            "/api/v1/nodes/n1",
            Action::Answer {
                status: 500,
                then_land_after: None,
            },
        )
        .times(1),
    );
    assert_eq!(api_code(label_patch(&through, "n1", "never").await).0, 500);
    // Both rules are used up: this one passes through, and lands after the refused one would
    // have been sent.
    let after = label_patch(&through, "n1", "after")
        .await
        .expect("a patch with no rule left passes through");
    assert_eq!(label(&after, "after").as_deref(), Some("yes"));
    assert_eq!(label(&after, "never"), None);
    assert_eq!((never.matched(), late.matched()), (1, 1));
    assert!(never.remove() && late.remove());
    assert!(!never.remove());
    cp.stop().await;
}

/// A delayed request is sent on only after its delay: a GET that reached the proxy before a
/// write reads that write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_request_is_sent_on_after_its_delay() {
    let cp = control_plane().await;
    let admin = cp.client();
    let proxy = start_proxy(&cp, TESTER, MASTERS);
    create_node(&admin, "n1", &[]).await;
    let slow = proxy.add(
        Rule::new(
            Some(Method::GET),
            "/api/v1/nodes/n1",
            Action::Delay(Duration::from_secs(2)),
        )
        .times(1),
    );
    let through = Api::<Node>::all(client_through(&proxy));
    let read = tokio::spawn(async move { through.get("n1").await });
    wait_for("the GET to reach the proxy", || async {
        (slow.matched() == 1).then_some(())
    })
    .await;
    label_patch(&admin, "n1", "written")
        .await
        .expect("patch n1 directly");
    let node = read.await.expect("the read task").expect("the delayed GET");
    assert_eq!(label(&node, "written").as_deref(), Some("yes"));
    assert_eq!(
        answers(&proxy, &Method::GET, "/api/v1/nodes/n1"),
        [(200, Origin::ApiServer)]
    );
    cp.stop().await;
}

/// An injected 429 carries `Retry-After` and the Status APF answers with; kube's client (retries
/// on by default) sends the request again on its own, after `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_request_gets_429_with_retry_after() {
    let cp = control_plane().await;
    let admin = cp.client();
    let proxy = start_proxy(&cp, TESTER, MASTERS);
    create_node(&admin, "n1", &[]).await;
    let throttle = Action::Throttle {
        retry_after_secs: 1,
    };

    // Retries off: the client sees the proxy's answer itself.
    let mut config = proxy.config().expect("the proxy's client config");
    config.default_retry = false;
    let raw = Client::try_from(config).expect("a client without retries");
    let once =
        proxy.add(Rule::new(Some(Method::GET), "/api/v1/nodes/n1", throttle.clone()).times(1));
    let request = http::Request::get("/api/v1/nodes/n1")
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = raw.send(request).await.expect("an answer");
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(
        resp.headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body = resp.into_body().collect_bytes().await.expect("body");
    let status: serde_json::Value = serde_json::from_slice(&body).expect("a JSON Status");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 429);
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(status["details"]["retryAfterSeconds"], 1);
    assert_eq!(once.matched(), 1);
    // Used up: the next request passes.
    let node = Api::<Node>::all(raw).get("n1").await.expect("get n1");
    assert_eq!(node.name_any(), "n1");

    // kube's default client: one `get` is three requests, two of them throttled.
    proxy.clear_log();
    let twice = proxy.add(Rule::new(Some(Method::GET), "/api/v1/nodes/n1", throttle).times(2));
    let node = Api::<Node>::all(client_through(&proxy))
        .get("n1")
        .await
        .expect("kube's client retries a 429 on its own");
    assert_eq!(node.name_any(), "n1");
    assert_eq!(twice.matched(), 2);
    assert_eq!(
        answers(&proxy, &Method::GET, "/api/v1/nodes/n1"),
        [
            (429, Origin::Injected),
            (429, Origin::Injected),
            (200, Origin::ApiServer)
        ]
    );
    cp.stop().await;
}

/// The `nodeipam` binary, given only the proxy's kubeconfig (the proxy speaks as the
/// controller's ServiceAccount of `config/rbac`), leads, watches and allocates a podCIDR: a
/// replica can run through the proxy for the fault tests of deploy.rs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_through_the_proxy_leads_and_allocates() {
    let cp = control_plane().await;
    let admin = cp.client();
    let dir = tempfile::tempdir().expect("temp dir");
    install_rbac(&cp).await;
    let proxy = start_proxy(&cp, SA_USER, SA_GROUPS);
    let kubeconfig = dir.path().join("through-proxy.kubeconfig");
    proxy
        .write_kubeconfig(&kubeconfig)
        .unwrap_or_else(|e| panic!("step=write-kubeconfig: {e}"));
    let mut a = Replica::start_plain(dir.path(), &kubeconfig, "replica-a", &[]).await;
    a.wait_leader_metric(1.0).await;
    create_ready_config(&admin, "pool", spec(family("10.80.0.0/16", 24), None, None)).await;
    create_node(&admin, "w1", &[]).await;
    let cidrs = wait_cidrs(&admin, "w1").await;
    assert_eq!(cidrs.len(), 1, "{cidrs:?}");
    assert!(cidrs[0].starts_with("10.80."), "{cidrs:?}");

    let log = proxy.log();
    let seen = |what: &str, f: &dyn Fn(&Exchange) -> bool| {
        assert!(
            log.iter().any(f),
            "no {what} through the proxy in its log:\n{log:#?}"
        );
    };
    seen("Lease write", &|e| {
        (e.method == Method::PUT || e.method == Method::POST)
            && e.path
                .contains("/apis/coordination.k8s.io/v1/namespaces/nodeipam-system/leases")
            && (200..300).contains(&e.status)
    });
    seen("Node watch", &|e| {
        e.path == "/api/v1/nodes"
            && e.query.as_deref().is_some_and(|q| q.contains("watch=true"))
            && e.status == 200
    });
    seen("PATCH of node w1", &|e| {
        e.method == Method::PATCH && e.path == "/api/v1/nodes/w1" && e.status == 200
    });
    assert!(
        log.iter().all(|e| e.origin == Origin::ApiServer),
        "{log:#?}"
    );
    assert_invariant(&admin, &[]).await;
    a.assert_never_forbidden();
    a.signal(Signal::TERM);
    assert!(a.wait_exit().await.success(), "{}", a.log_tail());
    cp.stop().await;
}
