//! End-to-end tests of the validating webhook against a real kube-apiserver: the webhook runs
//! in this process on 127.0.0.1 with managed TLS, registered by URL with failurePolicy Fail.
//! Covers admission of valid configs, a catalogue of bad ones denied through the API server,
//! warnings reaching kubectl, caBundle patching, certificate rotation while serving, a second
//! replica reusing the Secret, and garbage posted straight to the webhook; the node count of
//! the exhaustion warning, read on demand for each selector operator. NodeIPAMPools: pool
//! overlaps (with pools, Service ranges and hand-made configs), configs inside a pool's space
//! (only its children, and only inside it), updates, and garbage pool specs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMPool, POOL_LABEL};
use nodeipam_testenv::ControlPlane;
use nodeipam_webhook::{
    ManagedTls, Readiness, Rotation, TlsMode, VALIDATE_PATH, Webhook, WebhookError, WebhookOptions,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

/// Generous: a wait that runs out means the behaviour is missing, not slow.
const WAIT: Duration = Duration::from_secs(60);
/// The webhook (and its configuration) name; the API server wants three dot-separated parts.
const HOOK: &str = "validate.nodeipam.io";
const NAMESPACE: &str = "default";
const SECRET: &str = "nodeipam-webhook-tls";

async fn control_plane() -> ControlPlane {
    match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => panic!("the control plane did not start: {e}"),
    }
}

/// Polls `f` until it returns `Some`, or panics after [`WAIT`] with `what`.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A webhook running in this process.
struct Running {
    addr: SocketAddr,
    readiness: Readiness,
    rotation: Arc<Rotation>,
    resolver: Arc<nodeipam_webhook::CertResolver>,
    counts: Arc<Mutex<BTreeMap<&'static str, usize>>>,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<Result<(), WebhookError>>,
}

impl Running {
    fn count(&self, result: &str) -> usize {
        self.counts
            .lock()
            .unwrap()
            .get(result)
            .copied()
            .unwrap_or(0)
    }

    fn url(&self) -> String {
        format!("https://{}{VALIDATE_PATH}", self.addr)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(WAIT, &mut self.handle)
            .await
            .expect("the webhook stops on shutdown")
            .expect("the webhook task did not panic");
        assert!(result.is_ok(), "{result:?}");
    }
}

fn options(secret: &str, config: &str, tls: ManagedTls) -> WebhookOptions {
    WebhookOptions {
        addr: "127.0.0.1:0".parse().unwrap(),
        namespace: NAMESPACE.into(),
        secret_name: secret.into(),
        webhook_config_name: config.into(),
        dns_names: vec!["127.0.0.1".into(), "localhost".into()],
        tls_mode: TlsMode::Managed(tls),
        service_cidrs: vec!["10.200.0.0/16".parse().unwrap()],
        ..WebhookOptions::default()
    }
}

fn quick_checks() -> ManagedTls {
    ManagedTls {
        check_interval: Duration::from_secs(1),
        ..ManagedTls::default()
    }
}

async fn start_webhook(client: Client, mut opts: WebhookOptions) -> Running {
    let counts: Arc<Mutex<BTreeMap<&'static str, usize>>> = Arc::default();
    let c = counts.clone();
    opts.on_admission = Some(Arc::new(move |result| {
        *c.lock().unwrap().entry(result).or_default() += 1;
    }));
    let webhook = Webhook::bind(client, opts).await.expect("bind the webhook");
    let addr = webhook.local_addr().expect("bound address");
    let readiness = webhook.readiness();
    let rotation = webhook.rotation();
    let resolver = webhook.resolver();
    let (tx, rx) = oneshot::channel::<()>();
    let handle = tokio::spawn(webhook.run(async {
        let _ = rx.await;
    }));
    let r = readiness.clone();
    eventually("the webhook to become ready", || {
        let r = r.clone();
        async move { r.is_ready().then_some(()) }
    })
    .await;
    Running {
        addr,
        readiness,
        rotation,
        resolver,
        counts,
        stop: Some(tx),
        handle,
    }
}

fn rules() -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec!["nodeipam.io".into()]),
        api_versions: Some(vec!["v1alpha1".into()]),
        operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
        resources: Some(vec!["nodeipamconfigs".into(), "nodeipampools".into()]),
        scope: Some("Cluster".into()),
    }]
}

async fn secret_data(client: &Client, name: &str, key: &str) -> Option<Vec<u8>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let secret = api.get_opt(name).await.ok()??;
    secret.data?.get(key).map(|b| b.0.clone())
}

fn configs(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<NodeIPAMConfig>(&()))
}

fn object(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a NodeIPAMConfig object")
}

async fn create(client: &Client, name: &str, spec: Value, dry_run: bool) -> Result<(), String> {
    let pp = PostParams {
        dry_run,
        ..PostParams::default()
    };
    configs(client)
        .create(&pp, &object(name, spec))
        .await
        .map(|_| ())
        .map_err(|e| match e {
            kube::Error::Api(s) => s.message.clone(),
            other => other.to_string(),
        })
}

/// Registers the webhook (with `ca`) and waits until the API server consults it: a dry-run
/// create that only the webhook refuses (overlap with the Service range) is denied by it.
async fn register_and_wait(cp: &ControlPlane, running: &Running, ca: &[u8]) {
    cp.register_validating_webhook(HOOK, &running.url(), ca, rules(), "Fail")
        .await
        .expect("register the webhook");
    wait_effective(&cp.client()).await;
}

async fn wait_effective(client: &Client) {
    eventually("the API server to call the webhook", || async move {
        let spec = json!({"ipv4": {"cidr": "10.96.0.0/16", "perNodeMaskSize": 24}});
        match create(client, "probe", spec, true).await {
            Err(m) if m.contains("overlaps the Service range") => Some(()),
            _ => None,
        }
    })
    .await;
}

/// Speaks HTTP/1.1 over TLS to the webhook, trusting only `ca_pem`. Returns the served leaf
/// certificate (DER), the status code and the body.
async fn https(
    addr: SocketAddr,
    ca_pem: &[u8],
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(Vec<u8>, u16, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let leaf = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .ok_or("no peer certificate")?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(body).await.map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    tls.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("no status line in {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((leaf, status, body))
}

fn v4(cidr: &str, mask: u8) -> Value {
    json!({"ipv4": {"cidr": cidr, "perNodeMaskSize": mask}})
}

fn v6(cidr: &str, mask: u8) -> Value {
    json!({"ipv6": {"cidr": cidr, "perNodeMaskSize": mask}})
}

fn with_selector(mut spec: Value, expressions: Value, fields: Value) -> Value {
    let mut term = serde_json::Map::new();
    if !expressions.is_null() {
        term.insert("matchExpressions".into(), expressions);
    }
    if !fields.is_null() {
        term.insert("matchFields".into(), fields);
    }
    spec["nodeSelector"] = json!({"nodeSelectorTerms": [Value::Object(term)]});
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_through_the_api_server() {
    let cp = control_plane().await;
    let client = cp.client();
    let running = start_webhook(client.clone(), options(SECRET, HOOK, quick_checks())).await;

    // Register with the wrong CA: the webhook must patch its own bundle in.
    let ca = secret_data(&client, SECRET, "ca.crt")
        .await
        .expect("the managed Secret holds ca.crt");
    register_and_wait(&cp, &running, cp.ca_pem().as_bytes()).await;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let vwc = vwcs.get(HOOK).await.expect("webhook configuration");
    let bundles: Vec<_> = vwc
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .map(|w| w.client_config.ca_bundle.map(|b| b.0))
        .collect();
    assert_eq!(
        bundles,
        vec![Some(ca.clone())],
        "caBundle patched to the Secret's CA"
    );

    // Valid configs are admitted.
    let base = json!({
        "ipv4": {"cidr": "10.64.0.0/14", "perNodeMaskSize": 24},
        "ipv6": {"cidr": "fd00:64::/48", "perNodeMaskSize": 64},
    });
    create(&client, "base", base, false)
        .await
        .expect("base admitted");
    create(&client, "second", v4("10.128.0.0/16", 24), false)
        .await
        .expect("second admitted");
    create(&client, "v6only", v6("fd00:99::/56", 64), false)
        .await
        .expect("v6only admitted");
    let selected = with_selector(
        v4("10.129.0.0/16", 26),
        json!([{"key": "zone", "operator": "In", "values": ["a"]}]),
        Value::Null,
    );
    create(&client, "selected", selected, false)
        .await
        .expect("a config with a selector is admitted");
    let allowed_before = running.count("allowed");
    assert!(allowed_before >= 4, "the observer saw the admissions");

    // The catalogue: (name, spec, expected message fragment).
    let catalogue: Vec<(&str, Value, &str)> = vec![
        (
            "same-range",
            v4("10.64.0.0/14", 24),
            "overlaps 10.64.0.0/14 of NodeIPAMConfig \"base\"",
        ),
        (
            "supernet",
            v4("10.0.0.0/8", 24),
            "10.0.0.0/8 contains 10.64.0.0/14",
        ),
        (
            "subnet",
            v4("10.65.0.0/16", 24),
            "10.65.0.0/16 is inside 10.64.0.0/14",
        ),
        (
            "other-config",
            v4("10.128.128.0/17", 24),
            "NodeIPAMConfig \"second\"",
        ),
        (
            "v6-overlap",
            v6("fd00:64:0:1::/64", 80),
            "fd00:64:0:1::/64 is inside fd00:64::/48",
        ),
        (
            "v6-supernet",
            v6("fd00::/16", 48),
            "fd00::/16 contains fd00:64::/48",
        ),
        (
            "service-cidr",
            v4("10.96.0.0/12", 24),
            "overlaps the Service range 10.96.0.0/16 of ServiceCIDR \"kubernetes\"",
        ),
        (
            "inside-service-cidr",
            v4("10.96.4.0/24", 28),
            "10.96.4.0/24 is inside 10.96.0.0/16",
        ),
        (
            "service-cidr-flag",
            v4("10.200.0.0/20", 24),
            "10.200.0.0/16 of --service-cidr",
        ),
        ("non-canonical", v4("10.1.0.1/16", 24), "must be canonical"),
        ("garbage-cidr", v4("not-a-cidr", 24), "spec.ipv4"),
        ("v6-in-ipv4", v4("fd00:1::/48", 64), "spec.ipv4"),
        ("v4-in-ipv6", v6("10.1.0.0/16", 24), "spec.ipv6"),
        ("mask-below-prefix", v4("10.1.0.0/16", 8), "perNodeMaskSize"),
        ("mask-above-30", v4("10.1.0.0/16", 31), "perNodeMaskSize"),
        ("mask-above-126", v6("fd00:2::/48", 127), "perNodeMaskSize"),
        (
            "mask-more-than-32-bits",
            v6("fd00:3::/48", 96),
            "perNodeMaskSize",
        ),
        ("no-family", json!({}), "spec"),
        (
            "bad-operator",
            with_selector(
                v4("10.2.0.0/16", 24),
                json!([{"key": "zone", "operator": "Near", "values": ["a"]}]),
                Value::Null,
            ),
            "Near",
        ),
        (
            "in-without-values",
            with_selector(
                v4("10.3.0.0/16", 24),
                json!([{"key": "zone", "operator": "In"}]),
                Value::Null,
            ),
            "values",
        ),
        (
            "exists-with-values",
            with_selector(
                v4("10.4.0.0/16", 24),
                json!([{"key": "zone", "operator": "Exists", "values": ["a"]}]),
                Value::Null,
            ),
            "values",
        ),
        (
            "bad-label-key",
            with_selector(
                v4("10.5.0.0/16", 24),
                json!([{"key": "bad key!", "operator": "Exists"}]),
                Value::Null,
            ),
            "key",
        ),
        (
            "bad-field-key",
            with_selector(
                v4("10.6.0.0/16", 24),
                Value::Null,
                json!([{"key": "spec.unschedulable", "operator": "In", "values": ["true"]}]),
            ),
            "metadata.name",
        ),
        (
            "bad-allocation",
            json!({"ipv4": {"cidr": "10.7.0.0/16", "perNodeMaskSize": 24}, "allocation": "Sometimes"}),
            "allocation",
        ),
    ];
    assert!(catalogue.len() >= 20);
    let mut failures = Vec::new();
    for (name, spec, fragment) in &catalogue {
        match create(&client, name, spec.clone(), false).await {
            Ok(()) => failures.push(format!("{name}: admitted")),
            Err(m) if !m.contains(fragment) => {
                failures.push(format!("{name}: message {m:?} lacks {fragment:?}"))
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        running.count("denied") >= 9,
        "the webhook itself denied the overlaps: {:?}",
        running.counts.lock().unwrap()
    );

    // The field path appears once: in the Status message with the path, and in each cause
    // as `field` + a message without it (kubectl prints `<field>: <message>` per cause).
    let err = configs(&client)
        .create(
            &PostParams::default(),
            &object("dup-path", v4("10.64.0.0/14", 24)),
        )
        .await
        .expect_err("an overlapping config is denied");
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}");
    };
    let body = "Invalid value: \"10.64.0.0/14\": overlaps 10.64.0.0/14 of NodeIPAMConfig \
                \"base\" (10.64.0.0/14 is the same range); ranges of NodeIPAMConfigs must not \
                overlap";
    assert_eq!(
        status.message,
        format!("admission webhook \"{HOOK}\" denied the request: spec.ipv4.cidr: {body}")
    );
    let causes = status
        .details
        .as_ref()
        .map(|d| d.causes.clone())
        .unwrap_or_default();
    assert_eq!(causes.len(), 1, "{status:?}");
    assert_eq!(causes[0].field, "spec.ipv4.cidr");
    assert_eq!(causes[0].message, body);
    let manifest = "apiVersion: nodeipam.io/v1alpha1\nkind: NodeIPAMConfig\nmetadata: {name: dup-path}\n\
                    spec: {ipv4: {cidr: 10.64.0.0/14, perNodeMaskSize: 24}}\n";
    let (ok, stderr) = kubectl_apply(&cp, manifest, false).await;
    assert!(!ok, "kubectl apply of an overlapping config failed");
    assert_eq!(
        stderr.trim_end(),
        format!("The NodeIPAMConfig \"dup-path\" is invalid: spec.ipv4.cidr: {body}"),
        "what kubectl shows names the field once"
    );

    // Immutable fields: a change is denied and says what to do instead.
    let patch = |spec: Value| Patch::Merge(json!({"spec": spec}));
    let api = configs(&client);
    let pp = PatchParams::default();
    let immutable: Vec<(&str, Value, &str)> = vec![
        (
            "base",
            json!({"ipv4": {"cidr": "10.32.0.0/14"}}),
            "immutable",
        ),
        (
            "base",
            json!({"ipv4": {"perNodeMaskSize": 25}}),
            "immutable",
        ),
        (
            "second",
            json!({"ipv6": {"cidr": "fd00:7::/48", "perNodeMaskSize": 64}}),
            "create a new",
        ),
        (
            "selected",
            json!({"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["b"]}]}]}}),
            "immutable",
        ),
    ];
    for (name, spec, fragment) in immutable {
        match api.patch(name, &pp, &patch(spec.clone())).await {
            Ok(_) => failures.push(format!("{name} {spec}: change admitted")),
            Err(kube::Error::Api(s)) if s.message.contains(fragment) => {}
            Err(e) => failures.push(format!("{name} {spec}: {e} lacks {fragment:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Mutable: allocation, and metadata.
    api.patch("base", &pp, &patch(json!({"allocation": "Disabled"})))
        .await
        .expect("allocation is mutable");
    api.patch(
        "base",
        &pp,
        &Patch::Merge(json!({"metadata": {"labels": {"team": "net"}}})),
    )
    .await
    .expect("labels are mutable");

    // Warnings reach kubectl: a tiny range, and one the current nodes would exhaust. Five
    // nodes, three of them labelled pool=edge for the selector-aware count below.
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..5 {
        let labels = if i < 3 {
            json!({"pool": "edge"})
        } else {
            json!({})
        };
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": format!("n{i}"), "labels": labels}}),
        )
        .expect("node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
    }
    let manifest = "apiVersion: nodeipam.io/v1alpha1\nkind: NodeIPAMConfig\nmetadata:\n  \
                    name: tiny\nspec:\n  ipv4:\n    cidr: 10.250.0.0/27\n    perNodeMaskSize: 28\n";
    // Nodes are counted when the review asks, not through a cache: the first try sees them.
    let (ok, stderr) = kubectl_apply(&cp, manifest, true).await;
    assert!(ok, "a warning does not block: {stderr}");
    assert!(stderr.contains("already has at least 5 nodes"), "{stderr}");
    assert!(stderr.contains("Warning:"), "{stderr}");
    let (ok, stderr) = kubectl_apply(&cp, manifest, false).await;
    assert!(ok, "a warning does not block: {stderr}");
    assert!(stderr.contains("Warning:"), "{stderr}");
    assert!(stderr.contains("only 2 blocks"), "{stderr}");
    assert!(stderr.contains("already has at least 5 nodes"), "{stderr}");

    // With a nodeSelector only the nodes it matches count: 3 edge nodes exhaust 2 blocks, the
    // single node n3 does not (the 5 in the cluster would have).
    let selected = |name: &str, cidr: &str, expression: &str| {
        format!(
            "apiVersion: nodeipam.io/v1alpha1\nkind: NodeIPAMConfig\nmetadata:\n  name: {name}\n\
             spec:\n  ipv4:\n    cidr: {cidr}\n    perNodeMaskSize: 28\n  nodeSelector:\n    \
             nodeSelectorTerms:\n    - {expression}\n"
        )
    };
    let edge = selected(
        "edge",
        "10.250.1.0/27",
        "matchExpressions: [{key: pool, operator: In, values: [edge]}]",
    );
    let (ok, stderr) = kubectl_apply(&cp, &edge, false).await;
    assert!(ok, "a warning does not block: {stderr}");
    assert!(stderr.contains("only 2 blocks"), "{stderr}");
    assert!(
        stderr.contains("has 2 blocks of /28 but at least 3 nodes match its nodeSelector"),
        "{stderr}"
    );
    assert!(!stderr.contains("already has"), "{stderr}");
    let solo = selected(
        "solo",
        "10.250.2.0/27",
        "matchFields: [{key: metadata.name, operator: In, values: [n3]}]",
    );
    let (ok, stderr) = kubectl_apply(&cp, &solo, false).await;
    assert!(ok, "{stderr}");
    assert!(stderr.contains("only 2 blocks"), "{stderr}");
    assert!(
        !stderr.contains("run out"),
        "one selected node cannot exhaust 2 blocks: {stderr}"
    );
    assert!(
        configs(&client)
            .get_opt("tiny")
            .await
            .expect("get")
            .is_some(),
        "the warned config was created"
    );

    assert!(running.readiness.is_ready());
    running.stop().await;
    cp.stop().await;
}

/// `kubectl apply -f -`; returns (success, stderr). Async: the webhook answering the API
/// server runs on this same runtime.
async fn kubectl_apply(cp: &ControlPlane, manifest: &str, dry_run: bool) -> (bool, String) {
    let mut cmd = tokio::process::Command::from(cp.kubectl());
    cmd.args(["apply", "-f", "-"]);
    if dry_run {
        cmd.arg("--dry-run=server");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(manifest.as_bytes())
        .await
        .expect("write manifest");
    drop(stdin);
    let out = child.wait_with_output().await.expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_replicas_and_garbage() {
    let cp = control_plane().await;
    let client = cp.client();
    let a = start_webhook(client.clone(), options(SECRET, HOOK, quick_checks())).await;
    let ca = secret_data(&client, SECRET, "ca.crt")
        .await
        .expect("ca.crt");
    register_and_wait(&cp, &a, &ca).await;

    // Health endpoints over the same TLS port.
    for path in ["/healthz", "/readyz"] {
        let (_, status, body) = https(a.addr, &ca, "GET", path, b"").await.expect(path);
        assert_eq!((status, body.as_str()), (200, "ok"), "{path}");
    }

    // A call before the rotation.
    create(&client, "before", v4("10.10.0.0/16", 24), false)
        .await
        .expect("admitted before the rotation");
    let (leaf_before, _, _) = https(a.addr, &ca, "GET", "/healthz", b"").await.unwrap();
    let secret_before = secret_data(&client, SECRET, "tls.crt").await.unwrap();

    a.rotation.rotate_now();
    let (addr, ca_ref, old) = (a.addr, &ca, &leaf_before);
    let leaf_after = eventually("a new certificate to be served", || async move {
        let (leaf, status, _) = https(addr, ca_ref, "GET", "/healthz", b"").await.ok()?;
        (status == 200 && leaf != *old).then_some(leaf)
    })
    .await;
    let secret_after = secret_data(&client, SECRET, "tls.crt").await.unwrap();
    assert_ne!(
        secret_after, secret_before,
        "the Secret holds the new certificate"
    );
    assert_eq!(
        secret_data(&client, SECRET, "ca.crt").await.unwrap(),
        ca,
        "same CA: the registered caBundle still holds"
    );
    assert_eq!(a.resolver.leaf_der(), Some(leaf_after.clone()));

    // Calls after the rotation: admitted, and denied, so the webhook is really consulted.
    create(&client, "after", v4("10.11.0.0/16", 24), false)
        .await
        .expect("admitted after the rotation");
    let denied = create(&client, "overlap-after", v4("10.10.0.0/20", 24), false).await;
    assert!(
        denied
            .as_ref()
            .is_err_and(|m| m.contains("NodeIPAMConfig \"before\"")),
        "{denied:?}"
    );

    // A second replica reuses the Secret instead of writing its own, and serves the same cert.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let version = secrets.get(SECRET).await.unwrap().metadata.resource_version;
    let b = start_webhook(client.clone(), options(SECRET, HOOK, quick_checks())).await;
    let (leaf_b, status, _) = https(b.addr, &ca, "GET", "/readyz", b"").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(leaf_b, leaf_after, "replicas serve the same certificate");
    assert_eq!(
        secrets.get(SECRET).await.unwrap().metadata.resource_version,
        version,
        "the second replica did not rewrite the Secret"
    );
    b.stop().await;

    // Garbage and the wrong kind, straight to the webhook: clean errors, never allowed.
    let invalid_before = a.count("invalid");
    let (_, status, body) = https(a.addr, &ca, "POST", VALIDATE_PATH, b"\x00garbage{")
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    let no_request = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let (_, status, _) = https(
        a.addr,
        &ca,
        "POST",
        VALIDATE_PATH,
        &serde_json::to_vec(&no_request).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(status, 400);
    let pod_review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3d1f5a2e-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "p", "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "mallory"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
            "dryRun": false
        }
    });
    let (_, status, body) = https(
        a.addr,
        &ca,
        "POST",
        VALIDATE_PATH,
        &serde_json::to_vec(&pod_review).unwrap(),
    )
    .await
    .unwrap();
    let answer: Value = serde_json::from_str(&body).expect("a JSON AdmissionReview");
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false, "{body}");
    assert_eq!(
        answer["response"]["uid"],
        "3d1f5a2e-0000-4000-8000-000000000001"
    );
    assert_eq!(a.count("invalid"), invalid_before + 3);

    // Rotation driven by expiry alone: a short-lived certificate is replaced by itself.
    let short = ManagedTls {
        validity: Duration::from_secs(120),
        rotate_before: Duration::from_secs(115),
        check_interval: Duration::from_secs(1),
        ..ManagedTls::default()
    };
    let c = start_webhook(
        client.clone(),
        options("short-lived-tls", "absent.nodeipam.io", short),
    )
    .await;
    let first = c.resolver.leaf_der().expect("a certificate");
    let resolver = c.resolver.clone();
    eventually("the short-lived certificate to be rotated", || {
        let r = resolver.clone();
        let first = first.clone();
        async move { r.leaf_der().filter(|l| *l != first).map(|_| ()) }
    })
    .await;
    c.stop().await;

    a.stop().await;
    cp.stop().await;
}

fn pools(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<NodeIPAMPool>(&()))
}

fn pool_object(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMPool",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a NodeIPAMPool object")
}

fn pool_v4(cidrs: &[&str]) -> Value {
    json!({"ipv4": {"cidrs": cidrs, "rangeMaskSize": 20, "perNodeMaskSize": 24}})
}

/// The error of a refused write: its message and the fields of its causes.
fn refusal(e: kube::Error) -> (String, Vec<String>) {
    match e {
        kube::Error::Api(s) => (
            s.message.clone(),
            s.details
                .iter()
                .flat_map(|d| &d.causes)
                .map(|c| c.field.clone())
                .collect(),
        ),
        other => (other.to_string(), Vec::new()),
    }
}

#[track_caller]
fn assert_refused(
    what: &str,
    outcome: Result<DynamicObject, kube::Error>,
    field: &str,
    says: &[&str],
) {
    let (message, fields) = match outcome {
        Ok(obj) => panic!(
            "{what}: admitted ({:?}) but must be refused",
            obj.data["spec"]
        ),
        Err(e) => refusal(e),
    };
    assert!(
        fields.iter().any(|f| f == field),
        "{what}: no cause on {field}: {fields:?}: {message}"
    );
    for s in says {
        assert!(message.contains(s), "{what}: {message:?} lacks {s:?}");
    }
}

/// A config labelled and owned (controller reference) as a child of `pool`.
fn child_object(name: &str, spec: Value, pool: &DynamicObject) -> DynamicObject {
    let mut obj = object(name, spec);
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    obj.metadata.labels = Some(BTreeMap::from([(POOL_LABEL.to_owned(), pool_name.clone())]));
    obj.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "nodeipam.io/v1alpha1".into(),
            kind: "NodeIPAMPool".into(),
            name: pool_name,
            uid: pool.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    obj
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_admission_through_the_api_server() {
    let cp = control_plane().await;
    let client = cp.client();
    let running = start_webhook(client.clone(), options(SECRET, HOOK, quick_checks())).await;
    register_and_wait(&cp, &running, cp.ca_pem().as_bytes()).await;
    let pp = PostParams::default();
    let pool_api = pools(&client);
    let config_api = configs(&client);

    // A hand-made config, then a valid dual-stack pool beside it.
    config_api
        .create(&pp, &object("hand-made", v4("10.100.0.0/16", 24)))
        .await
        .expect("a hand-made config outside every pool");
    let gpu_spec = json!({
        "ipv4": {"cidrs": ["10.64.0.0/14"], "rangeMaskSize": 20, "perNodeMaskSize": 24},
        "ipv6": {"cidrs": ["fd00:64::/48"], "rangeMaskSize": 56, "perNodeMaskSize": 60},
    });
    let gpu = pool_api
        .create(&pp, &pool_object("gpu", gpu_spec.clone()))
        .await
        .expect("the gpu pool is admitted");

    // Pool over pool, over Service ranges, over a hand-made config.
    assert_refused(
        "pool over pool",
        pool_api
            .create(
                &pp,
                &pool_object("cpu", pool_v4(&["10.0.0.0/16", "10.66.0.0/16"])),
            )
            .await,
        "spec.ipv4.cidrs[1]",
        &[
            "overlaps 10.64.0.0/14 (spec.ipv4.cidrs[0]) of NodeIPAMPool \"gpu\"",
            "10.66.0.0/16 is inside 10.64.0.0/14",
        ],
    );
    assert_refused(
        "pool over the API server's ServiceCIDR",
        pool_api
            .create(&pp, &pool_object("svc", pool_v4(&["10.96.0.0/12"])))
            .await,
        "spec.ipv4.cidrs[0]",
        &["overlaps the Service range 10.96.0.0/16 of ServiceCIDR \"kubernetes\""],
    );
    assert_refused(
        "pool over --service-cidr",
        pool_api
            .create(&pp, &pool_object("svc2", pool_v4(&["10.200.0.0/14"])))
            .await,
        "spec.ipv4.cidrs[0]",
        &["overlaps the Service range 10.200.0.0/16 of --service-cidr"],
    );
    assert_refused(
        "pool over a hand-made config",
        pool_api
            .create(&pp, &pool_object("over", pool_v4(&["10.100.0.0/14"])))
            .await,
        "spec.ipv4.cidrs[0]",
        &[
            "NodeIPAMConfig \"hand-made\"",
            "which is not a child of this pool",
        ],
    );

    // Configs in the pool's space: a user's is refused, a child inside is admitted, a child
    // outside is refused.
    assert_refused(
        "a user config inside a pool",
        config_api
            .create(&pp, &object("user", v4("10.64.16.0/20", 24)))
            .await,
        "spec.ipv4.cidr",
        &[
            "overlaps 10.64.0.0/14 (spec.ipv4.cidrs[0]) of NodeIPAMPool \"gpu\"",
            "not a child of that pool",
        ],
    );
    let child_spec = json!({
        "ipv4": {"cidr": "10.64.0.0/20", "perNodeMaskSize": 24},
        "ipv6": {"cidr": "fd00:64::/56", "perNodeMaskSize": 60},
    });
    config_api
        .create(&pp, &child_object("gpu-10-64-0-0-20", child_spec, &gpu))
        .await
        .expect("a child inside its pool is admitted");
    assert_refused(
        "a child outside its pool",
        config_api
            .create(
                &pp,
                &child_object("gpu-10-110-0-0-20", v4("10.110.0.0/20", 24), &gpu),
            )
            .await,
        "spec.ipv4.cidr",
        &["lies outside NodeIPAMPool \"gpu\" (its IPv4 CIDRs: [10.64.0.0/14])"],
    );
    // A label alone (no owner reference) does not make a child.
    let mut labelled = object("labelled", v4("10.64.32.0/20", 24));
    labelled.metadata.labels = Some(BTreeMap::from([(POOL_LABEL.to_owned(), "gpu".into())]));
    assert_refused(
        "a labelled config inside a pool",
        config_api.create(&pp, &labelled).await,
        "spec.ipv4.cidr",
        &["NodeIPAMPool \"gpu\""],
    );

    // Updates: a free CIDR may be appended, an overlapping one not; a mask may not change;
    // the scaling settings may, even with a child in place.
    let mut grown = pool_api.get("gpu").await.expect("get gpu");
    grown.data["spec"]["ipv4"]["cidrs"] = json!(["10.64.0.0/14", "10.80.0.0/16"]);
    grown.data["spec"]["headroom"] = json!({"blocks": 64});
    let grown = pool_api
        .replace("gpu", &pp, &grown)
        .await
        .expect("appending a free CIDR and changing headroom is admitted");
    let mut bad = grown.clone();
    bad.data["spec"]["ipv4"]["cidrs"] = json!(["10.64.0.0/14", "10.80.0.0/16", "10.100.0.0/20"]);
    assert_refused(
        "appending a CIDR over a config",
        pool_api.replace("gpu", &pp, &bad).await,
        "spec.ipv4.cidrs[2]",
        &["NodeIPAMConfig \"hand-made\""],
    );

    // Garbage in a pool's spec, straight to the webhook: a clean answer, never allowed.
    let ca = secret_data(&client, SECRET, "ca.crt")
        .await
        .expect("the managed Secret holds ca.crt");
    for spec in [
        json!({"ipv4": {"cidrs": 42, "rangeMaskSize": 20, "perNodeMaskSize": 24}}),
        json!({"ipv4": {"cidrs": ["x"], "rangeMaskSize": 999, "perNodeMaskSize": -1}}),
        json!({"scaleDown": {"emptyFor": ["30m"]}}),
        json!(null),
    ] {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "3d1f5a2e-0000-4000-8000-000000000002",
                "kind": {"group": "nodeipam.io", "version": "v1alpha1", "kind": "NodeIPAMPool"},
                "resource": {"group": "nodeipam.io", "version": "v1alpha1", "resource": "nodeipampools"},
                "name": "junk", "operation": "CREATE",
                "userInfo": {"username": "mallory"},
                "object": {"apiVersion": "nodeipam.io/v1alpha1", "kind": "NodeIPAMPool",
                           "metadata": {"name": "junk"}, "spec": spec},
                "dryRun": false
            }
        });
        let (_, status, body) = https(
            running.addr,
            &ca,
            "POST",
            VALIDATE_PATH,
            &serde_json::to_vec(&review).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).expect("a JSON AdmissionReview");
        assert_eq!(answer["response"]["allowed"], false, "{body}");
        assert!(
            answer["response"]["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("not a valid NodeIPAMPool")),
            "{body}"
        );
    }
    assert!(running.readiness.is_ready(), "the webhook still serves");
    running.stop().await;
    cp.stop().await;
}

/// A webhook started before the NodeIPAMPool CRD is served (an image upgraded before its
/// CRDs) still becomes ready and reviews configs; once the CRD is installed, its pool watch
/// lists (after its backoff) and pools are reviewed, until then refused with a 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_started_before_the_pool_crd_catches_up() {
    let configs_only = tempfile::tempdir().expect("temp folder");
    let root = nodeipam_testenv::workspace_root();
    std::fs::copy(
        root.join(nodeipam_crd::CRD_PATH),
        configs_only.path().join("configs.yaml"),
    )
    .expect("copy the NodeIPAMConfig CRD");
    let cp = match ControlPlane::builder()
        .crd_dir(configs_only.path())
        .start()
        .await
    {
        Ok(cp) => cp,
        Err(e) => panic!("the control plane did not start: {e}"),
    };
    let client = cp.client();
    // Ready without pools: `start_webhook` waits for readiness.
    let running = start_webhook(client.clone(), options(SECRET, HOOK, quick_checks())).await;
    register_and_wait(&cp, &running, cp.ca_pem().as_bytes()).await;
    create(&client, "plain", v4("10.64.0.0/16", 24), false)
        .await
        .expect("configs are reviewed without pools");

    let pools_only = tempfile::tempdir().expect("temp folder");
    std::fs::copy(
        root.join(nodeipam_crd::POOL_CRD_PATH),
        pools_only.path().join("pools.yaml"),
    )
    .expect("copy the NodeIPAMPool CRD");
    cp.install_crds(pools_only.path())
        .await
        .expect("install the NodeIPAMPool CRD");
    let pool_api = pools(&client);
    let refused_while_listing = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    eventually("the webhook to review pools", || {
        let pool_api = pool_api.clone();
        let refused = refused_while_listing.clone();
        async move {
            let pp = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            // Over the config created above: refused once the webhook reviews pools.
            match pool_api
                .create(&pp, &pool_object("late", pool_v4(&["10.64.0.0/14"])))
                .await
            {
                Err(kube::Error::Api(s)) if s.message.contains("NodeIPAMConfig \"plain\"") => {
                    Some(())
                }
                Err(kube::Error::Api(s)) if s.message.contains("does not serve NodeIPAMPools") => {
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    None
                }
                other => panic!("a pool neither reviewed nor waiting for the cache: {other:?}"),
            }
        }
    })
    .await;
    eprintln!(
        "pool requests refused while the pool watch caught up: {}",
        refused_while_listing.load(std::sync::atomic::Ordering::SeqCst)
    );
    running.stop().await;
    cp.stop().await;
}

/// The "would run out" warning counts nodes when the review asks (a paged metadata list, no
/// Node cache): against the real API server, for each selector operator the label or field
/// selector carries (In, NotIn, Exists, DoesNotExist, metadata.name), one it cannot (Gt, left
/// to the shared matcher), and ORed terms that select the same nodes twice (counted once). It
/// warns when the matching nodes reach the block count, and not when they are fewer, nor for
/// a range a pool carved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exhaustion_warning_counts_nodes_on_demand() {
    let cp = control_plane().await;
    let client = cp.client();
    let running = start_webhook(client.clone(), options(SECRET, HOOK, quick_checks())).await;
    let ca = secret_data(&client, SECRET, "ca.crt")
        .await
        .expect("the managed Secret holds ca.crt");
    register_and_wait(&cp, &running, &ca).await;

    // Seven nodes: a0..a2 in zone a (a1, a2 with a rack number), b0 and b1 in zone b, c0 and
    // c1 with no zone.
    let nodes: Api<Node> = Api::all(client.clone());
    let labelled: [(&str, Value); 7] = [
        ("a0", json!({"zone": "a"})),
        ("a1", json!({"zone": "a", "rack": "1"})),
        ("a2", json!({"zone": "a", "rack": "2"})),
        ("b0", json!({"zone": "b"})),
        ("b1", json!({"zone": "b"})),
        ("c0", json!({})),
        ("c1", json!({})),
    ];
    for (name, labels) in labelled {
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
    }

    // A dry-run create of a /28-per-node config with `blocks` blocks; the kubectl stderr.
    let mut n = 0;
    let mut dry_run = async |blocks: u32, terms: Value| -> String {
        n += 1;
        let prefix = 28 - blocks.trailing_zeros();
        let mut spec =
            json!({"ipv4": {"cidr": format!("10.251.{n}.0/{prefix}"), "perNodeMaskSize": 28}});
        if !terms.is_null() {
            spec["nodeSelector"] = json!({"nodeSelectorTerms": terms});
        }
        let manifest = json!({
            "apiVersion": "nodeipam.io/v1alpha1",
            "kind": "NodeIPAMConfig",
            "metadata": {"name": format!("count-{n}")},
            "spec": spec,
        });
        let (ok, stderr) = kubectl_apply(&cp, &manifest.to_string(), true).await;
        assert!(ok, "a warning never refuses: {stderr}");
        stderr
    };
    let expr = |key: &str, op: &str, values: &[&str]| {
        let mut e = json!({"key": key, "operator": op});
        if !values.is_empty() {
            e["values"] = json!(values);
        }
        e
    };
    let name =
        |op: &str, values: &[&str]| json!({"matchFields": [expr("metadata.name", op, values)]});
    let labels = |exprs: Vec<Value>| json!({"matchExpressions": exprs});

    // Without a selector every node counts: 7 nodes exhaust 4 blocks, not 8.
    let w = dry_run(4, Value::Null).await;
    assert!(w.contains("already has at least 7 nodes"), "{w}");
    let w = dry_run(8, Value::Null).await;
    assert!(!w.contains("run out"), "{w}");

    // The same 4 blocks as a range a pool carved (its label): the pool carves the next range
    // before this one runs out, so the webhook neither counts nor warns.
    let child = json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": {"name": "count-child", "labels": {"nodeipam.io/pool": "some-pool"}},
        "spec": {"ipv4": {"cidr": "10.251.200.0/26", "perNodeMaskSize": 28}},
    });
    let (ok, w) = kubectl_apply(&cp, &child.to_string(), true).await;
    assert!(ok, "{w}");
    assert!(!w.contains("run out"), "{w}");

    // (terms, matching nodes): warned with that many blocks, not with twice as many.
    let cases: Vec<(Value, u32)> = vec![
        (json!([labels(vec![expr("zone", "In", &["a"])])]), 3),
        (json!([labels(vec![expr("zone", "In", &["a", "b"])])]), 5),
        (json!([labels(vec![expr("zone", "NotIn", &["a"])])]), 4),
        (json!([labels(vec![expr("zone", "Exists", &[])])]), 5),
        (json!([labels(vec![expr("zone", "DoesNotExist", &[])])]), 2),
        // Gt: no label selector says it; listed and filtered by the shared matcher.
        (json!([labels(vec![expr("rack", "Gt", &["0"])])]), 2),
        (
            json!([labels(vec![
                expr("zone", "In", &["a"]),
                expr("rack", "Lt", &["2"])
            ])]),
            1,
        ),
        // By name (one value per field requirement, so one term per name), with a name that
        // is no node.
        (
            json!([
                name("In", &["a0"]),
                name("In", &["c1"]),
                name("In", &["nope"])
            ]),
            2,
        ),
        (
            json!([{"matchExpressions": [expr("zone", "In", &["a"])],
                    "matchFields": [expr("metadata.name", "NotIn", &["a0"])]}]),
            2,
        ),
        // ORed terms selecting the same nodes twice count each once: a1 and a2 are in both.
        (
            json!([
                labels(vec![expr("zone", "In", &["a"])]),
                labels(vec![expr("rack", "Exists", &[])]),
            ]),
            3,
        ),
        (
            json!([
                labels(vec![expr("zone", "In", &["b"])]),
                name("In", &["b0"]),
                name("In", &["c0"]),
                labels(vec![expr("rack", "Gt", &["1"])]),
            ]),
            4,
        ),
    ];
    for (terms, matching) in cases {
        let blocks = matching.next_power_of_two();
        let w = dry_run(blocks, terms.clone()).await;
        let want = format!("but at least {matching} nodes match its nodeSelector");
        if blocks == matching {
            assert!(w.contains(&want) && w.contains("run out"), "{terms}: {w}");
        } else {
            // Not a power of two: fewer nodes than blocks, then as many blocks as nodes or fewer.
            assert!(!w.contains("run out"), "{terms}: {w}");
            // The count may stop anywhere from blocks / 2 on (a read that reaches it is the
            // last), so only that it warns is certain.
            let w = dry_run(blocks / 2, terms.clone()).await;
            assert!(
                w.contains("nodes match its nodeSelector") && w.contains("run out"),
                "{terms}: {w}"
            );
        }
        let w = dry_run(blocks * 2, terms.clone()).await;
        assert!(
            !w.contains("run out"),
            "{matching} nodes, {} blocks: {w}",
            blocks * 2
        );
    }

    running.stop().await;
    cp.stop().await;
}

/// A review reads what the API server has acknowledged, not what a watch has delivered: with
/// the webhook's watches of NodeIPAMConfigs, NodeIPAMPools and ServiceCIDRs held back (after
/// their first list, so it is ready), a config created a moment earlier, a pool and a
/// ServiceCIDR each still refuse an overlapping config. Found in the demo: a config inside
/// another, created right after it while the API server was re-initializing its watch
/// storage, was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_reads_writes_its_watches_have_not_delivered() {
    use nodeipam_testenv::fault_proxy::{Action, FaultProxy, Rule};
    let cp = control_plane().await;
    let client = cp.client();
    let proxy = FaultProxy::for_user(&cp, "webhook-admin", &["system:masters"])
        .unwrap_or_else(|e| panic!("step=start-fault-proxy: {e}"));
    let held = Action::Delay(Duration::from_secs(600));
    let watches: Vec<_> = ["/nodeipamconfigs", "/nodeipampools", "/servicecidrs"]
        .into_iter()
        .map(|path| {
            proxy.add(Rule::new(Some(http::Method::GET), path, held.clone()).query("watch="))
        })
        .collect();
    let webhook_client = proxy.client().expect("a client through the fault proxy");
    let running = start_webhook(webhook_client, options(SECRET, HOOK, quick_checks())).await;
    register_and_wait(&cp, &running, cp.ca_pem().as_bytes()).await;
    let pp = PostParams::default();

    create(&client, "first", v4("10.64.0.0/14", 24), false)
        .await
        .expect("the first config is admitted");
    assert_refused(
        "a config inside one created a moment earlier",
        configs(&client)
            .create(&pp, &object("inside", v4("10.65.0.0/16", 24)))
            .await,
        "spec.ipv4.cidr",
        &["overlaps 10.64.0.0/14 of NodeIPAMConfig \"first\""],
    );

    pools(&client)
        .create(&pp, &pool_object("budget", pool_v4(&["10.80.0.0/14"])))
        .await
        .expect("the pool is admitted");
    let (message, _) = refusal(
        configs(&client)
            .create(&pp, &object("in-pool", v4("10.81.0.0/16", 24)))
            .await
            .expect_err("a hand-made config inside a pool created a moment earlier is refused"),
    );
    assert!(message.contains("NodeIPAMPool \"budget\""), "{message}");

    let service_cidrs: Api<k8s_openapi::api::networking::v1::ServiceCIDR> =
        Api::all(client.clone());
    let extra: k8s_openapi::api::networking::v1::ServiceCIDR = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": "extra"},
        "spec": {"cidrs": ["10.90.0.0/16"]},
    }))
    .expect("a ServiceCIDR");
    service_cidrs
        .create(&pp, &extra)
        .await
        .expect("create a ServiceCIDR");
    assert_refused(
        "a config over a ServiceCIDR created a moment earlier",
        configs(&client)
            .create(&pp, &object("over-services", v4("10.90.0.0/20", 24)))
            .await,
        "spec.ipv4.cidr",
        &["overlaps the Service range 10.90.0.0/16 of ServiceCIDR \"extra\""],
    );
    // The watches were really held: had one gone through, the test would prove nothing.
    for (rule, kind) in watches.iter().zip(["configs", "pools", "ServiceCIDRs"]) {
        eprintln!("{kind} watch requests held: {}", rule.matched());
    }
    running.stop().await;
    cp.stop().await;
}

/// With `--pod-network-supernet` declared (the pod network the consumers are configured for,
/// e.g. flannel's Network), a config or pool CIDR outside it is admitted with a warning that
/// reaches kubectl, naming the field and the supernet; one inside gets none, and a family with
/// no supernet declared is not checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_outside_the_declared_pod_network_is_warned_about() {
    let cp = control_plane().await;
    let mut opts = options(SECRET, HOOK, quick_checks());
    opts.pod_network_supernets = vec!["10.240.0.0/12".parse().unwrap()];
    let running = start_webhook(cp.client(), opts).await;
    register_and_wait(&cp, &running, cp.ca_pem().as_bytes()).await;
    let manifest = |kind: &str, name: &str, spec: Value| {
        serde_json::to_string(&json!({
            "apiVersion": "nodeipam.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        }))
        .unwrap()
    };
    const OUTSIDE: &str =
        "is outside the declared pod network (10.240.0.0/12, --pod-network-supernet)";

    let (ok, stderr) = kubectl_apply(
        &cp,
        &manifest("NodeIPAMConfig", "inside", v4("10.241.0.0/16", 24)),
        false,
    )
    .await;
    assert!(ok, "{stderr}");
    assert!(!stderr.contains(OUTSIDE), "a range inside warned: {stderr}");

    let (ok, stderr) = kubectl_apply(
        &cp,
        &manifest("NodeIPAMConfig", "outside", v4("10.64.0.0/16", 24)),
        false,
    )
    .await;
    assert!(ok, "a range outside is still admitted: {stderr}");
    assert!(
        stderr.contains(&format!("spec.ipv4.cidr: 10.64.0.0/16 {OUTSIDE}")),
        "{stderr}"
    );

    // No IPv6 supernet: an IPv6 range is not checked.
    let (ok, stderr) = kubectl_apply(
        &cp,
        &manifest("NodeIPAMConfig", "v6", v6("fd00:64::/48", 64)),
        false,
    )
    .await;
    assert!(ok, "{stderr}");
    assert!(
        !stderr.contains("outside the declared pod network"),
        "{stderr}"
    );

    let pool = pool_v4(&["10.248.0.0/16", "10.80.0.0/16"]);
    let (ok, stderr) = kubectl_apply(&cp, &manifest("NodeIPAMPool", "budget", pool), false).await;
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains(&format!("spec.ipv4.cidrs[1]: 10.80.0.0/16 {OUTSIDE}")),
        "{stderr}"
    );
    assert!(
        !stderr.contains("cidrs[0]: 10.248.0.0/16 is outside"),
        "{stderr}"
    );
    running.stop().await;
    cp.stop().await;
}
