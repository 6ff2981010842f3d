//! The Helm chart (`charts/nodeipam`): `helm lint`, `helm template` with default and other
//! values, its values schema, the rendered objects against the real API server (server-side
//! dry run, then a real `helm install`/`upgrade`/`uninstall` on the test control plane, and an
//! upgrade that brings a CRD field and a new kind), and the chart's equivalence with the
//! kustomize manifests it mirrors: with default values it renders the objects of
//! `config/default` (the Namespace aside: Helm installs into an existing namespace), with
//! `certMode=cert-manager` those of `config/certmanager`, with `ipMasqAgent.enabled` adds
//! exactly `config/ip-masq-agent`, and with `apiServer` set it renders what the
//! `config/components/api-server` overlay of the real-cluster suite does; each output's switch
//! renders what `config/default` with its component does, and `replicas=0` (no webhook
//! configuration, no PodDisruptionBudget) what `config/bootstrap` does. A change to `config/`
//! that the chart does not follow (or the reverse) fails here, naming the object and the field.
//!
//! Helm is built by `hack/helm.sh build` (hack/test.sh does) into `$NODEIPAM_HELM`; kubectl is
//! the pinned one of the control-plane binaries. Nothing is downloaded here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nodeipam_testenv::{ControlPlane, default_assets_dir, default_helm_path, workspace_root};
use serde_json::{Value, json};

const NAMESPACE: &str = "nodeipam-system";
const RELEASE: &str = "nodeipam";

// ----- tools -----

/// The Helm binary: `$NODEIPAM_HELM`, else where `hack/helm.sh` puts the version
/// `hack/helm/go.mod` pins.
fn helm_bin() -> PathBuf {
    let path = default_helm_path().unwrap_or_else(|e| panic!("step=locate-helm: {e}"));
    assert!(
        path.is_file(),
        "step=locate-helm: no helm binary at {}: run `hack/helm.sh build` (hack/test.sh does), \
         or set NODEIPAM_HELM",
        path.display()
    );
    path
}

fn kubectl_bin() -> PathBuf {
    let path = default_assets_dir().join("kubectl");
    assert!(
        path.is_file(),
        "step=locate-kubectl: no kubectl at {}: run `hack/control-plane.sh build` (hack/test.sh \
         does), or set NODEIPAM_ASSETS",
        path.display()
    );
    path
}

fn chart_dir() -> String {
    workspace_root()
        .join("charts/nodeipam")
        .display()
        .to_string()
}

fn config_dir(rel: &str) -> String {
    workspace_root()
        .join("config")
        .join(rel)
        .display()
        .to_string()
}

/// The local cluster's overlay (`hack/cluster.sh deploy`): config/default with the API server
/// component, its ConfigMap and the local image.
const CLUSTER_OVERLAY: &str = "../hack/cluster/overlay";

/// Helm with its cache, config and data folders in a temporary folder, so tests never read
/// or write the user's Helm state.
fn helm(home: &Path) -> Command {
    let mut cmd = Command::new(helm_bin());
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .stdin(Stdio::null());
    cmd
}

/// Runs `cmd`; returns (success, stdout, stderr).
fn run(step: &str, cmd: &mut Command) -> (bool, String, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("step={step}: cannot run {cmd:?}: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `cmd`, which must succeed; returns stdout.
fn run_ok(step: &str, cmd: &mut Command) -> String {
    let (ok, out, err) = run(step, cmd);
    assert!(ok, "step={step}: {cmd:?} failed:\n{err}\n{out}");
    out
}

/// `helm template` of the chart in [`NAMESPACE`] with `--set` values, CRDs included (they are
/// templates), the `helm test` pod left out (kustomize has none).
fn template(set: &[&str]) -> String {
    render(set, false)
}

/// `helm template`, with the `helm test` hooks when `tests`.
fn render(set: &[&str], tests: bool) -> String {
    run_ok("helm-template", &mut template_cmd(set, tests))
}

fn template_cmd(set: &[&str], tests: bool) -> Command {
    let home = tempfile::tempdir().expect("temp folder");
    let mut cmd = helm(home.path());
    cmd.args(["template", RELEASE, &chart_dir(), "--namespace", NAMESPACE]);
    if !tests {
        cmd.arg("--skip-tests");
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    cmd
}

/// `helm template` with `set`, which must fail; returns its error output.
fn template_error(set: &[&str]) -> String {
    let (ok, out, err) = run("helm-template", &mut template_cmd(set, false));
    assert!(!ok, "{set:?} rendered:\n{out}");
    err
}

fn kustomize(rel: &str) -> String {
    run_ok(
        "kubectl-kustomize",
        Command::new(kubectl_bin()).args(["kustomize", &config_dir(rel)]),
    )
}

/// The objects of a multi-document YAML stream.
fn yaml_docs(text: &str) -> Vec<Value> {
    nodeipam_testenv::yaml::documents(text).expect("YAML documents")
}

/// (kind, namespace, name) of an object.
type Key = (String, String, String);

fn key(obj: &Value) -> Key {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&obj["kind"]),
        s(&obj["metadata"]["namespace"]),
        s(&obj["metadata"]["name"]),
    )
}

/// Helm's own annotation on the chart's CRDs: kept on uninstall (checked on its own).
const KEEP: &str = "helm.sh/resource-policy";

/// The objects by key, with what legitimately differs between Helm and kustomize removed:
/// the labels on the objects (Helm's release labels; kustomize's part-of) and the CRDs' keep
/// policy. Everything else, specs, rules, arguments, annotations, must be equal.
fn by_key(docs: Vec<Value>) -> BTreeMap<Key, Value> {
    let mut out = BTreeMap::new();
    for mut obj in docs {
        if let Some(meta) = obj["metadata"].as_object_mut() {
            meta.remove("labels");
            let annotations = meta.get_mut("annotations").and_then(Value::as_object_mut);
            if let Some(annotations) = annotations {
                annotations.remove(KEEP);
                if annotations.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
        let k = key(&obj);
        assert!(out.insert(k.clone(), obj).is_none(), "{k:?} rendered twice");
    }
    out
}

/// The first difference between two JSON values, as a path and both sides.
fn first_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                first_difference(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                )
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(&format!("{path}[{i}]"), p, q)),
        // The generated CRD writes `128.0` where kustomize writes `128`: the same number.
        (Value::Number(x), Value::Number(y)) if x.as_f64() == y.as_f64() => None,
        _ if a == b => None,
        _ => Some(format!("{path}: chart {a} but kustomize {b}")),
    }
}

/// The chart's objects equal the kustomize ones, except `skip` (keys only one side has, with
/// the reason in the caller).
fn assert_equivalent(
    chart: &BTreeMap<Key, Value>,
    kustomize: &BTreeMap<Key, Value>,
    skip: &[Key],
    what: &str,
) {
    let ck: BTreeSet<&Key> = chart.keys().filter(|k| !skip.contains(k)).collect();
    let kk: BTreeSet<&Key> = kustomize.keys().filter(|k| !skip.contains(k)).collect();
    assert_eq!(
        ck,
        kk,
        "{what}: the chart and kustomize render different objects (only in the chart: {:?}; \
         only in kustomize: {:?})",
        ck.difference(&kk).collect::<Vec<_>>(),
        kk.difference(&ck).collect::<Vec<_>>()
    );
    let mut differences = Vec::new();
    for k in ck {
        if let Some(d) = first_difference("", &chart[k], &kustomize[k]) {
            differences.push(format!("{k:?} {d}"));
        }
    }
    assert!(
        differences.is_empty(),
        "{what}: the chart differs from kustomize; sync charts/nodeipam with config/:\n{}",
        differences.join("\n")
    );
}

fn ns_key(kind: &str, name: &str) -> Key {
    (kind.into(), NAMESPACE.into(), name.into())
}

fn cluster_key(kind: &str, name: &str) -> Key {
    (kind.into(), String::new(), name.into())
}

fn container(docs: &BTreeMap<Key, Value>) -> &Value {
    &docs[&ns_key("Deployment", "nodeipam-controller")]["spec"]["template"]["spec"]["containers"][0]
}

fn env(docs: &BTreeMap<Key, Value>) -> Vec<Value> {
    container(docs)["env"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn args(docs: &BTreeMap<Key, Value>) -> Vec<String> {
    serde_json::from_value(container(docs)["args"].clone()).expect("args are strings")
}

// ----- lint and template -----

#[test]
fn helm_lint_passes_with_default_and_other_values() {
    let home = tempfile::tempdir().expect("temp folder");
    for set in [
        &[][..],
        &["certMode=cert-manager", "ipMasqAgent.enabled=true"][..],
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.readerBinding.enabled=true",
            "metrics.prometheusRule.enabled=true",
        ][..],
        &[
            "metrics.secure=false",
            "metrics.serviceMonitor.enabled=true",
        ][..],
    ] {
        let mut cmd = helm(home.path());
        cmd.args(["lint", "--strict", &chart_dir(), "--namespace", NAMESPACE]);
        for s in set {
            cmd.args(["--set", s]);
        }
        let out = run_ok("helm-lint", &mut cmd);
        assert!(out.contains("0 chart(s) failed"), "{set:?}: {out}");
    }
}

#[test]
fn the_default_chart_renders_config_default() {
    // Default values on both sides: config/manager pins the release's tag, the chart's
    // default tag is its appVersion (the image is compared with the rest).
    let chart = by_key(yaml_docs(&template(&[])));
    let kustomize = by_key(yaml_docs(&kustomize("default")));
    // The one exception: Helm installs into an existing namespace (or --create-namespace),
    // so the chart does not own the Namespace object.
    let namespace = cluster_key("Namespace", NAMESPACE);
    assert!(kustomize.contains_key(&namespace));
    assert!(!chart.contains_key(&namespace));
    assert_equivalent(&chart, &kustomize, &[namespace], "config/default");

    // Spot checks that would also catch both sides drifting together the wrong way.
    assert_eq!(
        args(&chart),
        [
            "run",
            "--metrics-bind-address=:8085",
            "--health-probe-bind-address=127.0.0.1:8086",
            "--webhook-addr=0.0.0.0:9445",
            "--log-format=json"
        ]
    );
    // The probes are plain HTTP on loopback, which the kubelet reaches on the host network.
    let c = container(&chart);
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["host"], "127.0.0.1", "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "probes", "{probe}");
    }
    // Secure metrics: the controller may ask for TokenReviews and SubjectAccessReviews, and
    // scrapers have a role to be bound to.
    let rules = &chart[&cluster_key("ClusterRole", "nodeipam-controller")]["rules"];
    for group in ["authentication.k8s.io", "authorization.k8s.io"] {
        assert!(
            rules.as_array().is_some_and(|rs| rs
                .iter()
                .any(|r| r["apiGroups"][0] == group && r["verbs"] == json!(["create"]))),
            "create in {group}: {rules}"
        );
    }
    assert!(chart.contains_key(&cluster_key("ClusterRole", "nodeipam-metrics-reader")));
    let default = by_key(yaml_docs(&template(&[])));
    assert_eq!(
        container(&default)["image"],
        format!("nodeipam:{}", chart_app_version())
    );
    let deploy = &chart[&ns_key("Deployment", "nodeipam-controller")];
    assert_eq!(deploy["spec"]["replicas"], 2);
    assert_eq!(deploy["spec"]["template"]["spec"]["hostNetwork"], true);
    for name in ["nodeipamconfigs.nodeipam.io", "nodeipampools.nodeipam.io"] {
        let crd = &chart[&cluster_key("CustomResourceDefinition", name)];
        assert_eq!(crd["spec"]["group"], "nodeipam.io", "{name}");
    }
    // The CRDs are templates that Helm keeps on uninstall (by_key leaves the policy out).
    let crds: Vec<Value> = yaml_docs(&template(&[]))
        .into_iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    assert_eq!(crds.len(), 2, "{crds:?}");
    for crd in &crds {
        assert_eq!(
            crd["metadata"]["annotations"][KEEP],
            "keep",
            "{}",
            key(crd).2
        );
    }
    // Replicas spread over zones where there are some, on every cluster alike otherwise; the
    // API server through the kubernetes Service, names through cluster DNS.
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([{
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {
                "app.kubernetes.io/name": "nodeipam",
                "app.kubernetes.io/component": "controller",
            }},
            "matchLabelKeys": ["pod-template-hash"],
        }])
    );
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert!(
        !c["env"].to_string().contains("KUBERNETES_SERVICE"),
        "{}",
        c["env"]
    );
}

/// The kustomize side's env with each `configMapKeyRef` replaced by the value of the ConfigMap
/// it names (rendered beside it), so that it compares with the chart's literal values.
fn resolve_config_map_env(docs: &mut BTreeMap<Key, Value>) {
    let config_maps: BTreeMap<String, Value> = docs
        .iter()
        .filter(|(k, _)| k.0 == "ConfigMap")
        .map(|(k, v)| (k.2.clone(), v["data"].clone()))
        .collect();
    let deploy = docs
        .get_mut(&ns_key("Deployment", "nodeipam-controller"))
        .expect("the Deployment");
    let env = deploy["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array_mut()
        .expect("env");
    for var in env {
        let Some(r) = var["valueFrom"].get("configMapKeyRef").cloned() else {
            continue;
        };
        let cm = r["name"].as_str().expect("configMapKeyRef.name");
        let key = r["key"].as_str().expect("configMapKeyRef.key");
        let value = config_maps
            .get(cm)
            .and_then(|d| d.get(key))
            .unwrap_or_else(|| panic!("{var}: no key {key} in ConfigMap {cm}"))
            .clone();
        *var = json!({"name": var["name"], "value": value});
    }
}

/// `apiServer.host`/`.port` render what the api-server component does with its ConfigMap
/// (the overlay the real-cluster suite deploys): the address in the env, the node's
/// resolver. Both sides are compared whole.
#[test]
fn the_api_server_value_renders_the_api_server_component() {
    let chart = by_key(yaml_docs(&template(&[
        "apiServer.host=10.251.0.2",
        "apiServer.port=6443",
    ])));
    let mut overlay = by_key(yaml_docs(&kustomize(CLUSTER_OVERLAY)));
    resolve_config_map_env(&mut overlay);
    let config_map = overlay
        .keys()
        .find(|k| k.0 == "ConfigMap" && k.2.starts_with("nodeipam-api-server-"))
        .cloned()
        .expect("the overlay generates the nodeipam-api-server ConfigMap");
    let namespace = cluster_key("Namespace", NAMESPACE);
    assert_equivalent(
        &chart,
        &overlay,
        &[namespace, config_map],
        "config/components/api-server",
    );
    assert_eq!(
        env(&chart)[0..2],
        [
            json!({"name": "KUBERNETES_SERVICE_HOST", "value": "10.251.0.2"}),
            json!({"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}),
        ]
    );
    let deploy = &chart[&ns_key("Deployment", "nodeipam-controller")];
    assert_eq!(deploy["spec"]["template"]["spec"]["dnsPolicy"], "Default");

    // An IPv6 address as it is (clients add the brackets); the port given once.
    let chart = by_key(yaml_docs(&template(&[
        "apiServer.host=fd00::1",
        "apiServer.port=443",
    ])));
    assert_eq!(
        env(&chart)[0..2],
        [
            json!({"name": "KUBERNETES_SERVICE_HOST", "value": "fd00::1"}),
            json!({"name": "KUBERNETES_SERVICE_PORT", "value": "443"}),
        ]
    );
    let err = template_error(&[
        "apiServer.host=10.0.0.1",
        "extraEnv[0].name=KUBERNETES_SERVICE_HOST",
        "extraEnv[0].value=10.0.0.2",
    ]);
    assert!(
        err.contains("extraEnv sets KUBERNETES_SERVICE_HOST and so does apiServer.host"),
        "{err}"
    );
}

/// The chart's appVersion, its default image tag.
fn chart_app_version() -> String {
    let text = std::fs::read_to_string(workspace_root().join("charts/nodeipam/Chart.yaml"))
        .expect("read Chart.yaml");
    let chart: Value = serde_saphyr::from_str(&text).expect("Chart.yaml parses");
    chart["appVersion"]
        .as_str()
        .expect("appVersion is a string")
        .to_string()
}

#[test]
fn cert_manager_mode_renders_config_certmanager() {
    let chart = by_key(yaml_docs(&template(&["certMode=cert-manager"])));
    let kustomize = by_key(yaml_docs(&kustomize("certmanager")));
    let namespace = cluster_key("Namespace", NAMESPACE);
    assert_equivalent(&chart, &kustomize, &[namespace], "config/certmanager");
    let vwc = &chart[&cluster_key("ValidatingWebhookConfiguration", "nodeipam-webhook")];
    assert_eq!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "nodeipam-system/nodeipam-webhook-cert"
    );
    assert!(chart.contains_key(&ns_key("Issuer", "nodeipam-selfsigned")));

    // An issuer of one's own replaces the self-signed one.
    let chart = by_key(yaml_docs(&template(&[
        "certMode=cert-manager",
        "certManager.issuerRef.kind=ClusterIssuer",
        "certManager.issuerRef.name=corp-ca",
    ])));
    assert!(!chart.contains_key(&ns_key("Issuer", "nodeipam-selfsigned")));
    let cert = &chart[&ns_key("Certificate", "nodeipam-webhook-cert")];
    assert_eq!(
        cert["spec"]["issuerRef"],
        json!({"kind": "ClusterIssuer", "name": "corp-ca"})
    );
}

#[test]
fn ip_masq_agent_sync_adds_config_ip_masq_agent_and_its_flag() {
    let base = by_key(yaml_docs(&template(&[])));
    let chart = by_key(yaml_docs(&template(&["ipMasqAgent.enabled=true"])));
    let overlay = by_key(yaml_docs(&kustomize("ip-masq-agent")));
    let added: BTreeMap<Key, Value> = chart
        .iter()
        .filter(|(k, _)| !base.contains_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_equivalent(&added, &overlay, &[], "config/ip-masq-agent");
    let flag = "--ip-masq-agent-configmap=kube-system/ip-masq-agent";
    assert!(args(&chart).iter().any(|a| a == flag), "{:?}", args(&chart));
    assert!(!args(&base).iter().any(|a| a == flag));
}

/// The objects a values switch adds to the default rendering, compared with its overlay in
/// `config/`, and the flags it adds.
fn assert_switch_adds_overlay(values: &[&str], overlay: &str, flags: &[&str]) {
    let base = by_key(yaml_docs(&template(&[])));
    let chart = by_key(yaml_docs(&template(values)));
    let added: BTreeMap<Key, Value> = chart
        .iter()
        .filter(|(k, _)| !base.contains_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let want = by_key(yaml_docs(&kustomize(overlay)));
    assert_equivalent(&added, &want, &[], &format!("config/{overlay}"));
    for flag in flags {
        assert!(
            args(&chart).iter().any(|a| a == flag),
            "{flag}: {:?}",
            args(&chart)
        );
        assert!(!args(&base).iter().any(|a| a == flag), "{flag} by default");
    }
}

#[test]
fn calico_outputs_add_config_calico_and_their_flags() {
    assert_switch_adds_overlay(
        &[
            "calico.ipPools.enabled=true",
            "calico.networkSet.enabled=true",
        ],
        "calico",
        &[
            "--calico-ip-pools",
            "--calico-ip-pool-encapsulation=None",
            "--calico-network-set=nodeipam-pod-network",
            "--calico-api-version=projectcalico.org/v3",
        ],
    );
}

#[test]
fn cilium_cidr_group_adds_config_cilium_and_its_flag() {
    assert_switch_adds_overlay(
        &["cilium.cidrGroup.enabled=true"],
        "cilium",
        &[
            "--cilium-cidr-group=nodeipam-pod-network",
            "--cilium-api-version=cilium.io/v2",
        ],
    );
}

/// `kubectl kustomize` of an overlay of `config/default` with `config/components/<component>`,
/// written as a user would (the paths relative: kustomize refuses absolute ones).
fn default_with_component(component: &str) -> String {
    let dir = tempfile::tempdir().expect("temp folder");
    let up = "../".repeat(dir.path().components().count() - 1);
    let root = workspace_root();
    let root = root
        .strip_prefix("/")
        .expect("the workspace path is absolute");
    let root = format!("{up}{}", root.display());
    write(
        dir.path(),
        "kustomization.yaml",
        &format!(
            "resources: [{root}/config/default]\ncomponents: [{root}/config/components/{component}]\n"
        ),
    );
    run_ok(
        "kubectl-kustomize-component",
        Command::new(kubectl_bin()).args(["kustomize", &dir.path().display().to_string()]),
    )
}

/// Each output's kustomize component, on config/default, renders exactly what the chart does
/// with its switch: the RBAC and the controller's flags (docs/integrations.md).
#[test]
fn the_output_components_render_the_chart_switches() {
    let cases: [(&str, &[&str]); 3] = [
        ("ip-masq-agent", &["ipMasqAgent.enabled=true"]),
        (
            "calico",
            &[
                "calico.ipPools.enabled=true",
                "calico.networkSet.enabled=true",
            ],
        ),
        ("cilium", &["cilium.cidrGroup.enabled=true"]),
    ];
    let namespace = cluster_key("Namespace", NAMESPACE);
    let base = args(&by_key(yaml_docs(&template(&[]))));
    for (component, values) in cases {
        let chart = by_key(yaml_docs(&template(values)));
        let overlay = by_key(yaml_docs(&default_with_component(component)));
        assert_equivalent(
            &chart,
            &overlay,
            std::slice::from_ref(&namespace),
            &format!("config/default with config/components/{component}"),
        );
        assert!(
            args(&overlay).len() > base.len(),
            "{component}: adds no flag: {:?}",
            args(&overlay)
        );
    }
}

/// The kinds the chart renders with `set`.
fn kinds(set: &[&str]) -> BTreeSet<String> {
    yaml_docs(&template(set))
        .iter()
        .map(|o| o["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// No replica, no webhook configuration: nothing would answer it, and its failurePolicy Fail
/// would refuse every config (the ClusterCIDR cut-over installs the chart so). The
/// PodDisruptionBudget (minAvailable 1) only over more than one replica: over one it would
/// block every drain of that replica's node. config/manager has two replicas and the PDB.
#[test]
fn the_webhook_and_the_pdb_follow_the_replicas() {
    let vwc = "ValidatingWebhookConfiguration";
    let pdb = "PodDisruptionBudget";
    let none = kinds(&["replicas=0"]);
    assert!(!none.contains(vwc) && !none.contains(pdb), "{none:?}");
    for kind in ["CustomResourceDefinition", "ClusterRole", "Deployment"] {
        assert!(none.contains(kind), "replicas=0 without a {kind}: {none:?}");
    }
    // kustomize's counterpart renders the same objects.
    let chart = by_key(yaml_docs(&template(&["replicas=0"])));
    let bootstrap = by_key(yaml_docs(&kustomize("bootstrap")));
    assert_equivalent(
        &chart,
        &bootstrap,
        &[cluster_key("Namespace", NAMESPACE)],
        "config/bootstrap",
    );
    let one = kinds(&["replicas=1"]);
    assert!(one.contains(vwc) && !one.contains(pdb), "{one:?}");
    let two = kinds(&[]);
    assert!(two.contains(vwc) && two.contains(pdb), "{two:?}");
    let manager = yaml_docs(&kustomize("manager"));
    let deploy = manager
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("config/manager has the Deployment");
    assert_eq!(
        deploy["spec"]["replicas"], 2,
        "config/manager's PDB needs two"
    );
    assert!(manager.iter().any(|o| o["kind"] == pdb));
}

#[test]
fn values_reach_the_rendered_objects() {
    let chart = by_key(yaml_docs(&template(&[
        "image.repository=registry.example.com/nodeipam",
        "image.tag=v9.9.9",
        "replicas=3",
        "resources.limits.memory=1Gi",
        "extraArgs[0]=--log-level=debug",
        "extraEnv[0].name=RUST_BACKTRACE",
        "extraEnv[0].value=full",
        "topologySpreadConstraints[0].maxSkew=2",
        "topologySpreadConstraints[0].topologyKey=rack",
        "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
        "crds.install=false",
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "metrics.port=9100",
        "metrics.host=10.0.0.5",
        "probes.port=9101",
        "metrics.certSecret=metrics-tls",
        "podDisruptionBudget.enabled=false",
        "podNetworkSupernets[0]=10.112.0.0/12",
        "podNetworkSupernets[1]=fd00:112::/48",
    ])));
    let deploy = &chart[&ns_key("Deployment", "nodeipam-controller")];
    let pod = &deploy["spec"]["template"]["spec"];
    let c = container(&chart);
    assert_eq!(c["image"], "registry.example.com/nodeipam:v9.9.9");
    assert_eq!(deploy["spec"]["replicas"], 3);
    assert_eq!(c["resources"]["limits"]["memory"], "1Gi");
    assert_eq!(
        args(&chart).last().map(String::as_str),
        Some("--log-level=debug")
    );
    for arg in [
        "--metrics-bind-address=10.0.0.5:9100",
        "--health-probe-bind-address=127.0.0.1:9101",
        "--metrics-cert-dir=/var/run/nodeipam/metrics-certs",
        "--pod-network-supernet=10.112.0.0/12,fd00:112::/48",
    ] {
        assert!(
            args(&chart).iter().any(|a| a == arg),
            "{arg}: {:?}",
            args(&chart)
        );
    }
    assert_eq!(
        c["ports"][0],
        json!({"name": "metrics", "containerPort": 9100, "protocol": "TCP"})
    );
    assert_eq!(
        c["ports"][1],
        json!({"name": "probes", "containerPort": 9101, "protocol": "TCP"})
    );
    assert_eq!(
        c["volumeMounts"],
        json!([{"name": "metrics-certs", "mountPath": "/var/run/nodeipam/metrics-certs", "readOnly": true}])
    );
    assert_eq!(
        pod["volumes"],
        json!([{"name": "metrics-certs", "secret": {"secretName": "metrics-tls"}}])
    );
    assert_eq!(
        c["env"][2],
        json!({"name": "RUST_BACKTRACE", "value": "full"})
    );
    assert_eq!(
        pod["topologySpreadConstraints"],
        json!([{
            "maxSkew": 2,
            "topologyKey": "rack",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {
                "app.kubernetes.io/name": "nodeipam",
                "app.kubernetes.io/component": "controller",
            }},
        }])
    );
    assert!(!chart.keys().any(|k| k.0 == "CustomResourceDefinition"));
    assert_eq!(pod["nodeSelector"], json!({"pool": "system"}));
    assert_eq!(
        pod["tolerations"],
        json!([{"key": "dedicated", "operator": "Exists"}])
    );
    assert!(!chart.contains_key(&ns_key("PodDisruptionBudget", "nodeipam-controller")));

    let chart = by_key(yaml_docs(&template(&["image.digest=sha256:0123"])));
    assert_eq!(container(&chart)["image"], "nodeipam@sha256:0123");

    // Off the host network the probes listen on every interface and the kubelet probes the
    // pod's IP: no httpGet.host. An IPv6 address gets brackets.
    let chart = by_key(yaml_docs(&template(&[
        "hostNetwork=false",
        "probes.host=",
        "metrics.host=::",
    ])));
    let c = container(&chart);
    assert!(c["livenessProbe"]["httpGet"].get("host").is_none(), "{c}");
    assert!(c["readinessProbe"]["httpGet"].get("host").is_none(), "{c}");
    for arg in [
        "--metrics-bind-address=[::]:8085",
        "--health-probe-bind-address=:8086",
    ] {
        assert!(
            args(&chart).iter().any(|a| a == arg),
            "{arg}: {:?}",
            args(&chart)
        );
    }
    // Metrics off: no port, no metrics RBAC.
    let chart = by_key(yaml_docs(&template(&["metrics.enabled=false"])));
    assert!(args(&chart).iter().any(|a| a == "--metrics-bind-address=0"));
    assert!(
        !container(&chart)["ports"]
            .as_array()
            .is_some_and(|ps| ps.iter().any(|p| p["name"] == "metrics"))
    );
    assert!(!chart.contains_key(&cluster_key("ClusterRole", "nodeipam-metrics-reader")));

    // No spread at all.
    let chart = by_key(yaml_docs(&template(&["topologySpreadConstraints=null"])));
    let pod = &chart[&ns_key("Deployment", "nodeipam-controller")]["spec"]["template"]["spec"];
    assert!(pod.get("topologySpreadConstraints").is_none(), "{pod}");

    // Loopback probes off the host network (the kubelet could not reach them), and metrics
    // objects without metrics, are refused by name.
    let home = tempfile::tempdir().expect("temp folder");
    for (set, message) in [
        (
            &["hostNetwork=false"][..],
            "probes.host is loopback but hostNetwork is false",
        ),
        (
            &[
                "metrics.enabled=false",
                "metrics.serviceMonitor.enabled=true",
            ][..],
            "need metrics.enabled",
        ),
    ] {
        let mut cmd = helm(home.path());
        cmd.args(["template", RELEASE, &chart_dir()]);
        for s in set {
            cmd.args(["--set", s]);
        }
        let (ok, _, err) = run("helm-template", &mut cmd);
        assert!(!ok && err.contains(message), "{set:?}: {err}");
    }
}

/// values.schema.json describes every value: the defaults pass a schema that refuses unknown
/// keys at every level, and a misspelt key or a bad value, from `--set` or a values file, is
/// refused naming where it is.
#[test]
fn the_values_schema_refuses_typos_and_bad_values() {
    let defaults = yaml_docs(&template(&[]));
    assert!(!defaults.is_empty());
    for (set, message) in [
        (
            &["replica=3"][..],
            "at '': additional properties 'replica' not allowed",
        ),
        (
            &["metrics.serviceMonitor.enable=true"][..],
            "at '/metrics/serviceMonitor': additional properties 'enable' not allowed",
        ),
        (&["apiServer.port=0"][..], "at '/apiServer/port': minimum"),
        (
            &["apiServer.port=65536"][..],
            "at '/apiServer/port': maximum",
        ),
        (
            &["apiServer.host=10.0.0.1:6443"][..],
            "at '/apiServer/host'",
        ),
        (
            &["apiServer.host=https://10.0.0.1"][..],
            "at '/apiServer/host'",
        ),
        (&["apiServer.host=999.0.0.1"][..], "at '/apiServer/host'"),
        (
            &["certMode=acme"][..],
            "at '/certMode': value must be one of",
        ),
        (&["logFormat=yaml"][..], "at '/logFormat'"),
        (
            &["podNetworkSupernets[0]=10.112.0.0"][..],
            "at '/podNetworkSupernets/0'",
        ),
        // The API server would refuse a number where Kubernetes wants a string.
        (
            &["extraEnv[0].name=RUST_BACKTRACE", "extraEnv[0].value=1"][..],
            "at '/extraEnv/0/value': got number, want string",
        ),
        (
            &["topologySpreadConstraints[0].topologyKey=zone"][..],
            "at '/topologySpreadConstraints/0': missing properties",
        ),
    ] {
        let err = template_error(set);
        assert!(err.contains(message), "{set:?}: {err}");
    }
    // A port given as a string (as the env variables it becomes are) is refused too.
    let mut cmd = template_cmd(&[], false);
    cmd.args(["--set-string", "apiServer.port=6443"]);
    let (ok, _, err) = run("helm-template", &mut cmd);
    assert!(
        !ok && err.contains("at '/apiServer/port': got string, want integer"),
        "{err}"
    );
    // A values file with a misspelt key.
    let dir = tempfile::tempdir().expect("temp folder");
    let file = write(dir.path(), "values.yaml", "apiServer:\n  hots: 10.0.0.1\n");
    let mut cmd = template_cmd(&[], false);
    cmd.args(["--values", &file]);
    let (ok, _, err) = run("helm-template", &mut cmd);
    assert!(
        !ok && err.contains("at '/apiServer': additional properties 'hots' not allowed"),
        "{err}"
    );
}

#[test]
fn monitoring_objects_render_when_asked() {
    let base = by_key(yaml_docs(&template(&[])));
    assert!(
        !base
            .keys()
            .any(|k| k.0 == "ServiceMonitor" || k.0 == "PrometheusRule")
    );
    let chart = by_key(yaml_docs(&template(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.readerBinding.enabled=true",
        "metrics.prometheusRule.enabled=true",
    ])));
    let kustomize = by_key(yaml_docs(&kustomize("prometheus")));
    let added: BTreeMap<Key, Value> = chart
        .iter()
        .filter(|(k, _)| !base.contains_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // The same Service, ServiceMonitor, reader binding and alerts as config/prometheus.
    assert_equivalent(&added, &kustomize, &[], "config/prometheus");

    // Secure metrics are scraped over HTTPS with Prometheus's own token, without verifying
    // the self-signed certificate, from the port the controller serves them on.
    let endpoint = |docs: &BTreeMap<Key, Value>| {
        docs[&ns_key("ServiceMonitor", "nodeipam-controller")]["spec"]["endpoints"][0].clone()
    };
    let monitor = endpoint(&chart);
    assert_eq!(monitor["scheme"], "https");
    assert_eq!(
        monitor["bearerTokenFile"],
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
    assert_eq!(monitor["tlsConfig"], json!({"insecureSkipVerify": true}));
    let service = &chart[&ns_key("Service", "nodeipam-controller-metrics")]["spec"]["ports"][0];
    assert_eq!(
        service,
        &json!({"name": "metrics", "port": 8085, "targetPort": "metrics", "protocol": "TCP"})
    );
    assert_eq!(monitor["port"], service["name"]);
    assert!(
        args(&chart)
            .iter()
            .any(|a| a == "--metrics-bind-address=:8085"),
        "{:?}",
        args(&chart)
    );
    let binding = &chart[&cluster_key("ClusterRoleBinding", "nodeipam-metrics-reader")];
    assert_eq!(binding["roleRef"]["name"], "nodeipam-metrics-reader");
    assert!(chart.contains_key(&cluster_key("ClusterRole", "nodeipam-metrics-reader")));

    // The bound ServiceAccount, the TLS settings and the credentials are values.
    let chart = by_key(yaml_docs(&template(&[
        "metrics.serviceMonitor.enabled=true",
        "metrics.readerBinding.enabled=true",
        "metrics.readerBinding.serviceAccount.name=kps-prometheus",
        "metrics.readerBinding.serviceAccount.namespace=observability",
        "metrics.certSecret=metrics-tls",
        "metrics.serviceMonitor.tlsConfig.serverName=nodeipam-controller-metrics.nodeipam-system.svc",
        "metrics.serviceMonitor.tlsConfig.ca.secret.name=metrics-tls",
        "metrics.serviceMonitor.tlsConfig.ca.secret.key=ca.crt",
        "metrics.serviceMonitor.authorization.type=Bearer",
        "metrics.serviceMonitor.authorization.credentials.name=prometheus-token",
        "metrics.serviceMonitor.authorization.credentials.key=token",
    ])));
    assert_eq!(
        chart[&cluster_key("ClusterRoleBinding", "nodeipam-metrics-reader")]["subjects"],
        json!([{"kind": "ServiceAccount", "name": "kps-prometheus", "namespace": "observability"}])
    );
    let monitor = endpoint(&chart);
    assert_eq!(monitor["scheme"], "https");
    assert_eq!(
        monitor["tlsConfig"],
        json!({
            "ca": {"secret": {"name": "metrics-tls", "key": "ca.crt"}},
            "serverName": "nodeipam-controller-metrics.nodeipam-system.svc",
        })
    );
    assert_eq!(
        monitor["authorization"],
        json!({"type": "Bearer", "credentials": {"name": "prometheus-token", "key": "token"}})
    );
    assert!(monitor.get("bearerTokenFile").is_none(), "{monitor}");

    // Plain metrics: HTTP, no credentials, and neither the reader role nor the controller's
    // review rights.
    let chart = by_key(yaml_docs(&template(&[
        "metrics.secure=false",
        "metrics.serviceMonitor.enabled=true",
        "metrics.readerBinding.enabled=true",
    ])));
    let monitor = endpoint(&chart);
    assert_eq!(monitor["scheme"], "http");
    assert!(monitor.get("bearerTokenFile").is_none(), "{monitor}");
    assert!(monitor.get("tlsConfig").is_none(), "{monitor}");
    assert!(args(&chart).iter().any(|a| a == "--metrics-secure=false"));
    assert!(!chart.contains_key(&cluster_key("ClusterRole", "nodeipam-metrics-reader")));
    assert!(!chart.contains_key(&cluster_key(
        "ClusterRoleBinding",
        "nodeipam-metrics-reader"
    )));
    let rules = chart[&cluster_key("ClusterRole", "nodeipam-controller")]["rules"].to_string();
    assert!(!rules.contains("tokenreviews"), "{rules}");
}

// ----- against the API server -----

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path.display().to_string()
}

/// Stand-in CRDs (any fields accepted) for the optional objects: cert-manager's and
/// prometheus-operator's.
fn stand_in_crds(cp: &ControlPlane) {
    for (group, plural, kind) in [
        ("cert-manager.io", "certificates", "Certificate"),
        ("cert-manager.io", "issuers", "Issuer"),
        ("monitoring.coreos.com", "servicemonitors", "ServiceMonitor"),
        ("monitoring.coreos.com", "prometheusrules", "PrometheusRule"),
    ] {
        let crd = json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}],
            },
        });
        let path = write(cp.dir(), &format!("{plural}.json"), &crd.to_string());
        run_ok(
            "apply-stand-in-crd",
            cp.kubectl().args(["apply", "-f", &path]),
        );
        run_ok(
            "wait-stand-in-crd",
            cp.kubectl().args([
                "wait",
                "--for=condition=Established",
                &format!("crd/{plural}.{group}"),
                "--timeout=60s",
            ]),
        );
    }
}

/// Helm against the test control plane, in [`NAMESPACE`], with its state in `home`.
fn helm_cp(cp: &ControlPlane, home: &Path, args: &[&str]) -> Command {
    let mut cmd = helm(home);
    cmd.args(args).args([
        "--kubeconfig",
        &cp.kubeconfig_path().display().to_string(),
        "--namespace",
        NAMESPACE,
    ]);
    cmd
}

/// The chart installs for real with Helm (no scheduler runs here, so no pod starts; the
/// objects do), after refusing a namespace whose pod-security level forbids its pods; then
/// every variant of the rendered chart, `helm test` pod included, and config/default with each
/// output component pass the real API server's admission and schema (server-side dry run,
/// strict field validation); then an upgrade and an
/// uninstall, which keeps the CRDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_applies_to_the_real_api_server() {
    let cp = ControlPlane::builder()
        .install_crds(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("step=control-plane: the control plane did not start: {e}"));
    stand_in_crds(&cp);
    run_ok(
        "create-namespace",
        cp.kubectl().args(["create", "namespace", NAMESPACE]),
    );
    let home = tempfile::tempdir().expect("temp folder");

    // A namespace that enforces `restricted` would refuse every pod of the host network: the
    // Deployment would install and never run. The chart says so instead, naming the label.
    let label = |level: &str| {
        run_ok(
            "label-namespace",
            cp.kubectl().args([
                "label",
                "namespace",
                NAMESPACE,
                "--overwrite",
                &format!("pod-security.kubernetes.io/enforce={level}"),
            ]),
        );
    };
    label("restricted");
    let (ok, out, err) = run(
        "helm-install-restricted",
        &mut helm_cp(&cp, home.path(), &["install", RELEASE, &chart_dir()]),
    );
    assert!(
        !ok && err.contains(
            "namespace nodeipam-system enforces pod-security.kubernetes.io/enforce=restricted, \
             which refuses the host network"
        ),
        "{err}\n{out}"
    );
    label("privileged");
    let notes = run_ok(
        "helm-install",
        &mut helm_cp(&cp, home.path(), &["install", RELEASE, &chart_dir()]),
    );
    for line in [
        "kubectl nodeipam status",
        "copy the kubectl-nodeipam binary onto your PATH",
        "set apiServer.host",
        // docs/install.md's uninstall: the configs stay, the finalizer is released after.
        "keeps the CRDs and every NodeIPAMConfig",
        "Do not delete the configs",
    ] {
        assert!(notes.contains(line), "NOTES: no {line:?}:\n{notes}");
    }
    // The default image is nowhere to pull from: NOTES say how to get it.
    let image = format!(
        "The image nodeipam:{} is not published",
        chart_app_version()
    );
    assert!(notes.contains(&image), "NOTES: no {image:?}:\n{notes}");
    assert!(
        !notes.contains("Drained=True BEFORE"),
        "NOTES tell to drain every config (delete every Node) before uninstalling:\n{notes}"
    );
    let deployed = run_ok(
        "kubectl-get",
        cp.kubectl().args([
            "get",
            "deployment,service,serviceaccount,role,rolebinding,poddisruptionbudget",
            "-n",
            NAMESPACE,
            "-o",
            "name",
        ]),
    );
    for object in [
        "deployment.apps/nodeipam-controller",
        "service/nodeipam-webhook",
        "serviceaccount/nodeipam-controller",
        "role.rbac.authorization.k8s.io/nodeipam-controller",
        "rolebinding.rbac.authorization.k8s.io/nodeipam-controller",
        "poddisruptionbudget.policy/nodeipam-controller",
    ] {
        assert!(
            deployed.lines().any(|l| l == object),
            "{object} not installed:\n{deployed}"
        );
    }

    // Every variant, with the CRDs (installed above) and the `helm test` pod.
    let variants: [&[&str]; 6] = [
        &[],
        &["certMode=cert-manager"],
        &["ipMasqAgent.enabled=true"],
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.readerBinding.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "extraArgs[0]=--log-level=debug",
        ],
        &[
            "metrics.secure=false",
            "metrics.serviceMonitor.enabled=true",
            "hostNetwork=false",
            "probes.host=",
        ],
        &["apiServer.host=10.0.0.1", "apiServer.port=6443"],
    ];
    for (i, set) in variants.iter().enumerate() {
        let rendered = render(set, true);
        let docs = yaml_docs(&rendered);
        let test_pod = docs
            .iter()
            .find(|o| o["kind"] == "Pod")
            .unwrap_or_else(|| panic!("variant {set:?}: no helm test pod"));
        assert_eq!(test_pod["metadata"]["annotations"]["helm.sh/hook"], "test");
        let path = write(cp.dir(), &format!("rendered-{i}.yaml"), &rendered);
        let out = run_ok(
            "apply-dry-run-server",
            cp.kubectl().args([
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                &path,
            ]),
        );
        let accepted = out
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        assert_eq!(accepted, docs.len(), "variant {set:?}:\n{out}");
    }

    // Each output component on config/default, as a user applies it (the components' own
    // objects and the Deployment with its flags): admission and schema, nothing persisted.
    for component in ["ip-masq-agent", "calico", "cilium"] {
        let rendered = default_with_component(component);
        let docs = yaml_docs(&rendered);
        let path = write(cp.dir(), &format!("component-{component}.yaml"), &rendered);
        let out = run_ok(
            "apply-component-dry-run-server",
            cp.kubectl().args([
                "apply",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                &path,
            ]),
        );
        let accepted = out
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        assert_eq!(accepted, docs.len(), "component {component}:\n{out}");
    }

    // An upgrade that turns on ip-masq-agent sync, and an uninstall.
    run_ok(
        "helm-upgrade",
        &mut helm_cp(
            &cp,
            home.path(),
            &[
                "upgrade",
                RELEASE,
                &chart_dir(),
                "--set",
                "ipMasqAgent.enabled=true",
            ],
        ),
    );
    run_ok(
        "kubectl-get-ip-masq-agent-role",
        cp.kubectl()
            .args(["get", "role", "nodeipam-ip-masq-agent", "-n", "kube-system"]),
    );
    let status = run_ok(
        "helm-status",
        &mut helm_cp(&cp, home.path(), &["status", RELEASE]),
    );
    assert!(status.contains("REVISION: 2"), "{status}");
    run_ok(
        "helm-uninstall",
        &mut helm_cp(&cp, home.path(), &["uninstall", RELEASE]),
    );
    let (ok, _, err) = run(
        "kubectl-get-after-uninstall",
        cp.kubectl()
            .args(["get", "deployment", "nodeipam-controller", "-n", NAMESPACE]),
    );
    assert!(!ok && err.contains("NotFound"), "{err}");
    // The keep policy leaves the CRDs (and so every NodeIPAMConfig) in place on uninstall.
    run_ok(
        "kubectl-get-crd-after-uninstall",
        cp.kubectl().args([
            "get",
            "crd",
            "nodeipamconfigs.nodeipam.io",
            "nodeipampools.nodeipam.io",
        ]),
    );

    cp.stop().await;
}

/// The chart with `replicas=0`, the ClusterCIDR cut-over's first step (docs/install.md):
/// CRDs and RBAC, no webhook configuration, so the real API server admits a NodeIPAMConfig
/// with no controller running (the configs `kubectl nodeipam migrate clustercidr --apply`
/// creates). With the webhook registered and no pod behind it, the create is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_without_replicas_admits_configs() {
    let cp = ControlPlane::builder()
        .install_crds(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("step=control-plane: the control plane did not start: {e}"));
    run_ok(
        "create-namespace",
        cp.kubectl().args(["create", "namespace", NAMESPACE]),
    );
    run_ok(
        "label-namespace",
        cp.kubectl().args([
            "label",
            "namespace",
            NAMESPACE,
            "pod-security.kubernetes.io/enforce=privileged",
        ]),
    );
    let home = tempfile::tempdir().expect("temp folder");
    run_ok(
        "helm-install-replicas-0",
        &mut helm_cp(
            &cp,
            home.path(),
            &["install", RELEASE, &chart_dir(), "--set", "replicas=0"],
        ),
    );
    run_ok(
        "wait-crd",
        cp.kubectl().args([
            "wait",
            "--for=condition=Established",
            "crd/nodeipamconfigs.nodeipam.io",
            "--timeout=60s",
        ]),
    );
    let sample = workspace_root().join("config/samples/nodeipam_v1alpha1_dual_stack.yaml");
    let out = run_ok(
        "create-config-without-controller",
        cp.kubectl()
            .args(["create", "-f", &sample.display().to_string()]),
    );
    assert!(
        out.contains("nodeipamconfig.nodeipam.io/dual-stack created"),
        "{out}"
    );
    let (ok, out, err) = run(
        "kubectl-get-webhook-configuration",
        cp.kubectl()
            .args(["get", "validatingwebhookconfiguration", "nodeipam-webhook"]),
    );
    assert!(!ok && err.contains("NotFound"), "{err}\n{out}");
    // The cut-over's step 5: the replicas back, and the webhook with them. An upgrade without
    // values would keep replicas=0 (Helm reuses the last values then): docs/install.md says
    // --reuse-values --set replicas=2.
    run_ok(
        "helm-upgrade-replicas-2",
        &mut helm_cp(
            &cp,
            home.path(),
            &[
                "upgrade",
                RELEASE,
                &chart_dir(),
                "--reuse-values",
                "--set",
                "replicas=2",
            ],
        ),
    );
    run_ok(
        "kubectl-get-webhook-configuration-after-upgrade",
        cp.kubectl()
            .args(["get", "validatingwebhookconfiguration", "nodeipam-webhook"]),
    );
    cp.stop().await;
}

/// kustomize's cut-over start, `config/bootstrap`, on the real API server: no webhook
/// configuration, so a NodeIPAMConfig is admitted with no controller running; then
/// `config/default` registers the webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_bootstrap_admits_configs() {
    let cp = ControlPlane::builder()
        .install_crds(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("step=control-plane: the control plane did not start: {e}"));
    run_ok(
        "apply-config-bootstrap",
        cp.kubectl().args(["apply", "-k", &config_dir("bootstrap")]),
    );
    run_ok(
        "wait-crd",
        cp.kubectl().args([
            "wait",
            "--for=condition=Established",
            "crd/nodeipamconfigs.nodeipam.io",
            "--timeout=60s",
        ]),
    );
    let sample = workspace_root().join("config/samples/nodeipam_v1alpha1_dual_stack.yaml");
    let out = run_ok(
        "create-config-without-controller",
        cp.kubectl()
            .args(["create", "-f", &sample.display().to_string()]),
    );
    assert!(
        out.contains("nodeipamconfig.nodeipam.io/dual-stack created"),
        "{out}"
    );
    run_ok(
        "apply-config-default",
        cp.kubectl().args(["apply", "-k", &config_dir("default")]),
    );
    run_ok(
        "kubectl-get-webhook-configuration-after-default",
        cp.kubectl()
            .args(["get", "validatingwebhookconfiguration", "nodeipam-webhook"]),
    );
    cp.stop().await;
}

// ----- upgrades -----

/// Copies the folder `from` into `to` (which must not exist), files and folders only.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap_or_else(|e| panic!("mkdir {}: {e}", to.display()));
    let entries =
        std::fs::read_dir(from).unwrap_or_else(|e| panic!("read {}: {e}", from.display()));
    for entry in entries {
        let entry = entry.expect("directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target)
                .unwrap_or_else(|e| panic!("copy {}: {e}", entry.path().display()));
        }
    }
}

/// The NodeIPAMConfig CRD as an older release had it: without `spec.allocation`.
fn config_crd_without_allocation() -> String {
    let mut crd: Value = serde_saphyr::from_str(&nodeipam_crd::crd_yaml()).expect("the CRD parses");
    let spec = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let removed = spec["properties"]
        .as_object_mut()
        .and_then(|p| p.remove("allocation"));
    assert!(removed.is_some(), "the CRD has spec.allocation: {spec}");
    serde_saphyr::to_string(&crd).expect("the CRD serializes")
}

/// Two older charts made from this one, in `dir`, each with the older NodeIPAMConfig CRD and
/// no NodeIPAMPool: `crds-folder`, laid out as 0.1.0 was (Helm's `crds/`, installed once), and
/// `templated`, with the CRD as a template (as from this release on).
fn older_charts(dir: &Path) -> (String, String) {
    let crd = config_crd_without_allocation();
    let folder = dir.join("crds-folder");
    copy_dir(&workspace_root().join("charts/nodeipam"), &folder);
    std::fs::remove_dir_all(folder.join("templates/crds")).expect("remove templates/crds");
    std::fs::create_dir(folder.join("crds")).expect("mkdir crds");
    write(
        &folder.join("crds"),
        "nodeipam.io_nodeipamconfigs.yaml",
        &crd,
    );

    let templated = dir.join("templated");
    copy_dir(&workspace_root().join("charts/nodeipam"), &templated);
    let crds = templated.join("templates/crds");
    std::fs::remove_file(crds.join("nodeipam.io_nodeipampools.yaml")).expect("remove pool CRD");
    write(
        &crds,
        "nodeipam.io_nodeipamconfigs.yaml",
        &nodeipam_crd::chart_template(&crd),
    );
    (
        folder.display().to_string(),
        templated.display().to_string(),
    )
}

/// Whether the API server's OpenAPI document for nodeipam.io/v1alpha1 has
/// NodeIPAMConfig's `spec.allocation`.
fn allocation_served(cp: &ControlPlane) -> bool {
    let (ok, out, _) = run(
        "kubectl-get-openapi",
        cp.kubectl()
            .args(["get", "--raw", "/openapi/v3/apis/nodeipam.io/v1alpha1"]),
    );
    let doc: Value = if ok {
        serde_json::from_str(&out).expect("OpenAPI is JSON")
    } else {
        Value::Null
    };
    doc["components"]["schemas"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, _)| name.ends_with(".NodeIPAMConfig"))
        .any(|(_, s)| {
            s["properties"]["spec"]["properties"]
                .get("allocation")
                .is_some()
        })
}

/// Polls `check` every 200 ms for at most a minute (a limit, not an assertion about time).
fn eventually(step: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "step={step}: not so after a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `helm upgrade` upgrades the CRDs. From a 0.1.0-style chart (CRDs in `crds/`, which Helm
/// installed without owning them) once with `--take-ownership`; from then on a plain upgrade
/// brings a new field and a new kind, which the real API server then serves; `helm uninstall`
/// keeps both CRDs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_upgrades_the_crds() {
    let cp = ControlPlane::builder()
        .install_crds(false)
        .start()
        .await
        .unwrap_or_else(|e| panic!("step=control-plane: the control plane did not start: {e}"));
    run_ok(
        "create-namespace",
        cp.kubectl().args(["create", "namespace", NAMESPACE]),
    );
    let home = tempfile::tempdir().expect("temp folder");
    let charts = tempfile::tempdir().expect("temp folder");
    let (crds_folder, templated) = older_charts(charts.path());
    let helm_ok = |step: &str, args: &[&str]| run_ok(step, &mut helm_cp(&cp, home.path(), args));

    helm_ok(
        "helm-install-crds-folder",
        &["install", RELEASE, &crds_folder],
    );
    run_ok(
        "crd-established",
        cp.kubectl().args([
            "wait",
            "--for=condition=Established",
            "crd/nodeipamconfigs.nodeipam.io",
            "--timeout=60s",
        ]),
    );
    assert!(!allocation_served(&cp), "the older CRD has no allocation");

    // Helm did not record the CRDs of crds/ as the release's: taking them over is refused
    // unless asked for, naming why.
    let (ok, _, err) = run(
        "helm-upgrade-without-take-ownership",
        &mut helm_cp(&cp, home.path(), &["upgrade", RELEASE, &templated]),
    );
    assert!(
        !ok && err.contains("invalid ownership metadata"),
        "the CRD of crds/ was taken over unasked: {err}"
    );
    helm_ok(
        "helm-upgrade-take-ownership",
        &["upgrade", RELEASE, &templated, "--take-ownership"],
    );
    let owner = run_ok(
        "crd-owner",
        cp.kubectl().args([
            "get",
            "crd",
            "nodeipamconfigs.nodeipam.io",
            "-o",
            "jsonpath={.metadata.annotations.meta\\.helm\\.sh/release-name}",
        ]),
    );
    assert_eq!(owner, RELEASE);
    let (ok, _, _) = run(
        "no-pool-crd-yet",
        cp.kubectl()
            .args(["get", "crd", "nodeipampools.nodeipam.io"]),
    );
    assert!(!ok, "the older charts have no NodeIPAMPool CRD");

    // The current chart: a plain upgrade adds spec.allocation and the NodeIPAMPool kind.
    helm_ok("helm-upgrade", &["upgrade", RELEASE, &chart_dir()]);
    eventually("allocation-served", || allocation_served(&cp));
    run_ok(
        "pool-crd-established",
        cp.kubectl().args([
            "wait",
            "--for=condition=Established",
            "crd/nodeipampools.nodeipam.io",
            "--timeout=60s",
        ]),
    );
    eventually("pools-served", || {
        run(
            "list-pools",
            cp.kubectl()
                .args(["get", "--raw", "/apis/nodeipam.io/v1alpha1/nodeipampools"]),
        )
        .0
    });

    helm_ok("helm-uninstall", &["uninstall", RELEASE]);
    run_ok(
        "crds-kept",
        cp.kubectl().args([
            "get",
            "crd",
            "nodeipamconfigs.nodeipam.io",
            "nodeipampools.nodeipam.io",
        ]),
    );
    cp.stop().await;
}

// ----- versions -----

/// The chart follows the workspace's version (docs/versioning.md): `version` is the Cargo
/// version and `appVersion` the image tag `v<version>`; CHANGELOG.md has a section for it.
#[test]
fn the_chart_and_the_workspace_share_one_version() {
    let text = std::fs::read_to_string(workspace_root().join("charts/nodeipam/Chart.yaml"))
        .expect("read Chart.yaml");
    let chart: Value = serde_saphyr::from_str(&text).expect("Chart.yaml parses");
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(chart["version"], version, "Chart.yaml version");
    assert_eq!(
        chart["appVersion"],
        format!("v{version}"),
        "Chart.yaml appVersion"
    );
    // kustomize deploys the same image tag (config/manager's `images:`).
    let text = std::fs::read_to_string(workspace_root().join("config/manager/kustomization.yaml"))
        .expect("read config/manager/kustomization.yaml");
    let kustomization: Value = serde_saphyr::from_str(&text).expect("kustomization parses");
    let image = kustomization["images"]
        .as_array()
        .and_then(|images| images.iter().find(|i| i["name"] == "nodeipam"))
        .expect("config/manager sets the nodeipam image");
    assert_eq!(
        image["newTag"],
        format!("v{version}"),
        "config/manager/kustomization.yaml newTag"
    );
    let changelog =
        std::fs::read_to_string(workspace_root().join("CHANGELOG.md")).expect("read CHANGELOG.md");
    assert!(
        changelog
            .lines()
            .any(|l| l.starts_with(&format!("## [{version}]"))),
        "CHANGELOG.md has no section for {version}"
    );
    assert!(changelog.contains("## [Unreleased]"));
}
