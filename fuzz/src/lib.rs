//! Owns the fuzzing of every parser of outside input: one target per parser (each feeds bytes
//! to the product's own code and must never panic; an error is fine, a panic is a finding)
//! and a small mutational fuzzer, without coverage guidance, that runs on stable Rust.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;

/// The largest input tried.
pub const MAX_INPUT: usize = 64 * 1024;

/// One parser of outside input.
pub struct Target {
    /// Its name: the corpus folder under `fuzz/corpus/` and the findings' file prefix.
    pub name: &'static str,
    /// Feeds the bytes to the parser (and what the product does with what it parsed).
    pub run: fn(&[u8]),
    /// Seeds made in code, on top of the corpus files.
    pub generated: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "admission_review",
        run: admission_review,
        generated: none,
    },
    Target {
        name: "node",
        run: node,
        generated: none,
    },
    Target {
        name: "node_list_protobuf",
        run: node_list_protobuf,
        generated: protobuf_seeds,
    },
    Target {
        name: "ip_masq_agent",
        run: ip_masq_agent,
        generated: none,
    },
    Target {
        name: "pod_network",
        run: pod_network,
        generated: none,
    },
    Target {
        name: "consumer_objects",
        run: consumer_objects,
        generated: none,
    },
    Target {
        name: "flannel_net_conf",
        run: flannel_net_conf,
        generated: none,
    },
    Target {
        name: "config_spec",
        run: config_spec,
        generated: none,
    },
    Target {
        name: "pool_spec",
        run: pool_spec,
        generated: none,
    },
    Target {
        name: "node_selector",
        run: node_selector,
        generated: none,
    },
    Target {
        name: "kubeconfig",
        run: kubeconfig,
        generated: none,
    },
    Target {
        name: "migrate_input",
        run: migrate_input,
        generated: none,
    },
];

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

fn none() -> Vec<Vec<u8>> {
    Vec::new()
}

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// The webhook's AdmissionReview body, decoded and (when it decodes) decided.
pub fn admission_review(data: &[u8]) {
    let _ = nodeipam_webhook::decode_review(data);
}

/// A Node as JSON: the full `core/v1` type, the slim `IpamNode`, its podCIDRs and seal facts.
pub fn node(data: &[u8]) {
    let _ = serde_json::from_slice::<k8s_openapi::api::core::v1::Node>(data);
    if let Ok(n) = serde_json::from_slice::<nodeipam_alloc::node::IpamNode>(data) {
        let _ = n.cidrs();
        let empty = BTreeMap::new();
        let node = nodeipam_alloc::selection::NodeView {
            name: n.metadata.name.as_deref().unwrap_or(""),
            labels: n.metadata.labels.as_ref().unwrap_or(&empty),
        };
        let _ = nodeipam_alloc::selection::match_score(Some(&every_operator()), node);
        let _ = nodeipam_alloc::seal::Fence::of(&n);
        let _ = nodeipam_alloc::seal::targets(std::slice::from_ref(&n));
        let _ = serde_json::to_vec(&n);
    }
}

/// A protobuf Node list body (and a protobuf Status), as the node watch reads them; the page
/// written as JSON must read back as a NodeList.
pub fn node_list_protobuf(data: &[u8]) {
    use nodeipam_alloc::node::protobuf;
    if let Ok(page) = protobuf::node_list(data) {
        for n in &page.items {
            let _ = n.cidrs();
        }
        // What the transcoder writes, kube's list reader reads: a page it could not would
        // fail the listing.
        if let Ok(json) = nodeipam_controller::node_lists::page_json(&page) {
            type List = kube_core::ObjectList<nodeipam_alloc::node::IpamNode>;
            if let Err(e) = serde_json::from_slice::<List>(&json) {
                panic!("the page as JSON does not read back as a NodeList: {e}");
            }
        }
    }
    let _ = protobuf::status(data);
}

/// The ip-masq-agent ConfigMap's `config` as read back, and as rewritten keeping the user's
/// other settings.
pub fn ip_masq_agent(data: &[u8]) {
    use nodeipam_alloc::outputs::OutputKind;
    use nodeipam_alloc::podnetwork::{PodNetwork, ip_masq_agent_config};
    let config = text(data);
    let map = BTreeMap::from([("config".to_string(), config.clone())]);
    let _ = OutputKind::IpMasqAgent.read(&map);
    let _ = ip_masq_agent_config(Some(&config), &PodNetwork::new(&[], &[]), &[]);
}

/// The pod-network ConfigMap's data as read back: a JSON map of its keys, or the bytes as the
/// value of both family keys.
pub fn pod_network(data: &[u8]) {
    use nodeipam_alloc::outputs::OutputKind;
    if let Ok(map) = serde_json::from_slice::<BTreeMap<String, String>>(data) {
        let _ = OutputKind::PodNetwork.read(&map);
    }
    let value = text(data);
    let map = BTreeMap::from([
        ("ipv4".to_string(), value.clone()),
        ("ipv6".to_string(), value),
    ]);
    let _ = OutputKind::PodNetwork.read(&map);
}

/// The typed outputs' objects as their watch shows them (Calico IPPools, a GlobalNetworkSet,
/// a CiliumCIDRGroup): a JSON map of name to object, read back by each kind.
pub fn consumer_objects(data: &[u8]) {
    use nodeipam_alloc::outputs::{CalicoPools, OutputKind};
    type Objects = BTreeMap<String, kube_core::DynamicObject>;
    if let Ok(objects) = serde_json::from_slice::<Objects>(data) {
        for kind in [
            OutputKind::CalicoIPPools(CalicoPools::default()),
            OutputKind::CalicoNetworkSet,
            OutputKind::CiliumCIDRGroup,
            OutputKind::PodNetwork,
            OutputKind::IpMasqAgent,
        ] {
            let _ = kind.read_objects(&objects);
        }
    }
}

/// flannel's `net-conf.json`.
pub fn flannel_net_conf(data: &[u8]) {
    let _ = nodeipam_controller::startup::flannel_networks(&text(data));
}

/// A NodeIPAMConfig spec as JSON, validated and parsed into ranges.
pub fn config_spec(data: &[u8]) {
    if let Ok(spec) = serde_json::from_slice::<nodeipam_crd::NodeIPAMConfigSpec>(data) {
        let _ = nodeipam_crd::validate_spec(&spec);
        let _ = spec.ranges();
    }
}

/// A NodeIPAMPool spec as JSON, parsed.
pub fn pool_spec(data: &[u8]) {
    if let Ok(spec) = serde_json::from_slice::<nodeipam_crd::NodeIPAMPoolSpec>(data) {
        let _ = spec.parse();
    }
    let _ = nodeipam_crd::validate_pool_name(&text(data));
}

/// A nodeSelector as JSON, validated.
pub fn node_selector(data: &[u8]) {
    use k8s_openapi::api::core::v1::NodeSelector;
    use nodeipam_alloc::selection::{NodeView, match_score};
    if let Ok(selector) = serde_json::from_slice::<NodeSelector>(data) {
        let _ = nodeipam_crd::validate_node_selector(&selector, "spec.nodeSelector");
        for labels in sample_labels() {
            let node = NodeView {
                name: "n1",
                labels: &labels,
            };
            let _ = match_score(Some(&selector), node);
        }
    }
}

/// Labels of nodes selectors are matched against, with numbers at the edges for `Gt`/`Lt`.
fn sample_labels() -> Vec<BTreeMap<String, String>> {
    [
        "4",
        "-1",
        "",
        "99999999999999999999",
        "-9223372036854775808",
        "x",
    ]
    .iter()
    .map(|v| {
        BTreeMap::from([
            ("pool".to_string(), "a".to_string()),
            ("cpu".to_string(), (*v).to_string()),
            ("zone".to_string(), (*v).to_string()),
        ])
    })
    .collect()
}

/// A selector with every operator, matched against Nodes' labels (outside input).
fn every_operator() -> k8s_openapi::api::core::v1::NodeSelector {
    use nodeipam_crd::selector::{requirement, selector_of};
    selector_of(vec![
        (
            vec![
                requirement("cpu", "Gt", &["2"]),
                requirement("pool", "In", &["a", "b"]),
            ],
            vec![],
        ),
        (
            vec![
                requirement("cpu", "Lt", &["-3"]),
                requirement("zone", "NotIn", &["z"]),
                requirement("gpu", "Exists", &[]),
            ],
            vec![],
        ),
        (
            vec![requirement("gpu", "DoesNotExist", &[])],
            vec![requirement("metadata.name", "In", &["n1"])],
        ),
    ])
}

thread_local! {
    static KUBECONFIG: tempfile::NamedTempFile =
        tempfile::NamedTempFile::new().expect("a temporary file for kubeconfig inputs");
}

/// A kubeconfig file, loaded as `--kubeconfig` loads it, and its context selected.
pub fn kubeconfig(data: &[u8]) {
    use nodeipam_controller::kubeconfig::{Files, Overrides, load, select};
    let path = KUBECONFIG.with(|f| {
        let mut file = f.as_file();
        file.set_len(0).expect("truncating the kubeconfig input");
        std::io::Seek::rewind(&mut file).expect("rewinding the kubeconfig input");
        file.write_all(data).expect("writing the kubeconfig input");
        f.path().to_path_buf()
    });
    if let Ok(kc) = load(&Files::Flag(path)) {
        let _ = select(kc, &Overrides::default());
    }
}

/// A `kubectl nodeipam migrate` input file, parsed and planned against an empty cluster.
pub fn migrate_input(data: &[u8]) {
    use nodeipam_cli::clustercidr::{plan, view_of};
    if let Ok(items) = nodeipam_cli::migrate::parse_input(&text(data), "input") {
        let _ = plan(&items, &view_of(vec![], vec![], vec![]));
    }
}

/// Protobuf Node lists as the API server writes them: `k8s\0` + `runtime.Unknown`.
pub fn protobuf_seeds() -> Vec<Vec<u8>> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn bytes(out: &mut Vec<u8>, number: u32, b: &[u8]) {
        varint(out, (u64::from(number) << 3) | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }
    fn uint(out: &mut Vec<u8>, number: u32, v: u64) {
        varint(out, u64::from(number) << 3);
        varint(out, v);
    }
    fn node(name: &str, cidrs: &[&str]) -> Vec<u8> {
        let mut label = Vec::new();
        bytes(&mut label, 1, b"kubernetes.io/os");
        bytes(&mut label, 2, b"linux");
        let mut seal = Vec::new();
        bytes(&mut seal, 1, b"nodeipam.io/seal");
        bytes(&mut seal, 2, b"replica-1/7");
        let mut meta = Vec::new();
        bytes(&mut meta, 1, name.as_bytes());
        bytes(&mut meta, 5, b"6f1c0e55-2f0b-4c43-9a1e-2d1b7cb0b1a0");
        bytes(&mut meta, 6, b"4242");
        bytes(&mut meta, 11, &label);
        bytes(&mut meta, 12, &seal);
        let mut spec = Vec::new();
        if let Some(first) = cidrs.first() {
            bytes(&mut spec, 1, first.as_bytes());
        }
        for c in cidrs {
            bytes(&mut spec, 7, c.as_bytes());
        }
        let mut out = Vec::new();
        bytes(&mut out, 1, &meta);
        bytes(&mut out, 2, &spec);
        out
    }
    fn wrapped(kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut type_meta = Vec::new();
        bytes(&mut type_meta, 1, b"v1");
        bytes(&mut type_meta, 2, kind.as_bytes());
        let mut out = b"k8s\0".to_vec();
        bytes(&mut out, 1, &type_meta);
        bytes(&mut out, 2, raw);
        out
    }
    let mut list_meta = Vec::new();
    bytes(&mut list_meta, 2, b"4243");
    bytes(&mut list_meta, 3, b"eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ");
    uint(&mut list_meta, 4, 17);
    let mut list = Vec::new();
    bytes(&mut list, 1, &list_meta);
    bytes(
        &mut list,
        2,
        &node("node-a", &["10.244.1.0/24", "fd00:10:244:1::/64"]),
    );
    bytes(&mut list, 2, &node("node-b", &[]));
    bytes(&mut list, 2, &node("node-c", &["not-a-cidr"]));
    let mut status = Vec::new();
    bytes(&mut status, 2, b"Failure");
    bytes(&mut status, 3, b"nodes is forbidden");
    bytes(&mut status, 4, b"Forbidden");
    uint(&mut status, 6, 403);
    vec![
        wrapped("NodeList", &list),
        wrapped("NodeList", &[]),
        wrapped("Status", &status),
    ]
}

/// The seeds of `target`: its corpus files (`fuzz/corpus/<name>/`, sorted) and those made in
/// code.
pub fn seeds(target: &Target) -> Vec<Vec<u8>> {
    let dir = corpus_dir().join(target.name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    files.sort();
    let mut out: Vec<Vec<u8>> = files.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    out.extend((target.generated)());
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

/// `fuzz/corpus`.
pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// A splitmix64 generator: seeded, so a run can be repeated.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Tokens inserted whole: JSON and YAML structure, edge numbers, CIDRs at the edges.
pub const DICTIONARY: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "null",
    "true",
    "false",
    "-1",
    "0",
    "1e999",
    "-1e999",
    "18446744073709551616",
    "4294967296",
    "255",
    "256",
    "\"10.0.0.0/8\"",
    "\"::/0\"",
    "\"/33\"",
    "\"0.0.0.0/0\"",
    "\"10.0.0.0/33\"",
    "\"fd00::/129\"",
    "/0",
    "/32",
    "/64",
    "/128",
    "\\u0000",
    "\\ud800",
    "- ",
    "\n",
    "---\n",
    "&a ",
    "*a",
    "!!binary ",
    "'",
    "perNodeMaskSize",
    "cidr",
    "ipv4",
    "ipv6",
    "podCIDRs",
    "nodeSelectorTerms",
    "matchExpressions",
    "operator",
    "values",
    "Gt",
    "In",
    "\"\"",
    "k8s\0",
];

/// Bytes that break parsers more often than others.
const INTERESTING: &[u8] = &[
    0, 1, 0x7f, 0x80, 0xff, b'0', b'9', b'-', b'.', b'/', b':', b'"', b'\\', b'{', b'[', b'\n',
];

/// Values a JSON leaf is replaced with: edge numbers, CIDRs and masks at the edges, odd strings.
/// Of the same type as `like` (a string for a string, a number for a number) seven times in
/// eight, so most changed inputs still decode.
fn interesting_value(rng: &mut Rng, like: &serde_json::Value) -> serde_json::Value {
    use serde_json::{Value, json};
    const STRINGS: &[&str] = &[
        "",
        " ",
        "0.0.0.0/0",
        "::/0",
        "10.0.0.0/8",
        "10.0.0.0/32",
        "10.0.0.1/8",
        "255.255.255.255/32",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
        "fd00::/8",
        "fd00::/127",
        "::ffff:10.0.0.0/104",
        "10.0.0.0/33",
        "fd00::/129",
        "10.0.0.0/-1",
        "/24",
        "10.0.0.0",
        "10.0.0.0/24,fd00::/64",
        "0s",
        "-1s",
        "9999999999999999h",
        "1h30m",
        "In",
        "NotIn",
        "Exists",
        "DoesNotExist",
        "Gt",
        "Lt",
        "metadata.name",
        "a/b/c",
        "\u{0}",
        "é",
        "CREATE",
        "UPDATE",
        "DELETE",
        "CONNECT",
        "NodeIPAMPool",
        "NodeIPAMConfig",
        "nodeipam.io",
        "status",
    ];
    let kind = match like {
        _ if rng.below(8) == 0 => rng.below(4),
        Value::Number(_) => 0,
        Value::String(_) => 1 + rng.below(2),
        Value::Bool(b) => return Value::Bool(!b),
        _ => rng.below(4),
    };
    match kind {
        0 => {
            const NUMBERS: &[i128] = &[
                0,
                1,
                7,
                8,
                16,
                24,
                31,
                32,
                33,
                63,
                64,
                65,
                127,
                128,
                129,
                255,
                256,
                -1,
                4_294_967_295,
                4_294_967_296,
                u64::MAX as i128,
                i64::MIN as i128,
            ];
            let n = NUMBERS[rng.below(NUMBERS.len())];
            u64::try_from(n)
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(n as i64))
        }
        1 => Value::String(STRINGS[rng.below(STRINGS.len())].to_string()),
        2 => Value::String("a".repeat(1 + rng.below(300))),
        _ => [Value::Null, json!(true), json!([]), json!({}), json!(1.5)][rng.below(5)].clone(),
    }
}

/// The JSON pointers of every value below `v`.
fn pointers(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, &p, out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, &p, out);
            }
        }
        _ => {}
    }
}

/// A value anywhere in `v` (each equally likely) replaced, or, for an array or object, one of
/// its members repeated or dropped.
fn replace_leaf(rng: &mut Rng, v: &mut serde_json::Value) {
    use serde_json::Value;
    let mut all = Vec::new();
    pointers(v, "", &mut all);
    let at = if all.is_empty() {
        Some(v)
    } else {
        v.pointer_mut(&all[rng.below(all.len())])
    };
    let Some(at) = at else { return };
    match at {
        Value::Array(a) if !a.is_empty() && rng.below(3) == 0 => {
            let i = rng.below(a.len());
            if rng.below(2) == 0 {
                let copy = a[i].clone();
                a.push(copy);
            } else {
                a.remove(i);
            }
        }
        Value::Object(m) if !m.is_empty() && rng.below(3) == 0 => {
            let i = rng.below(m.len());
            if let Some(key) = m.keys().nth(i).cloned() {
                m.remove(&key);
            }
        }
        Value::Array(_) | Value::Object(_) if rng.below(4) != 0 => {}
        other => *other = interesting_value(rng, other),
    }
}

/// `input`, when it is a JSON (or one YAML document's) object or array, with `times` of its values changed (not its
/// bytes, so parsing gets through to validation); false when it is not JSON.
pub fn mutate_values(rng: &mut Rng, input: &mut Vec<u8>, times: usize) -> bool {
    // YAML (one document) is changed as its JSON, which YAML readers read too.
    let parsed = serde_json::from_slice::<serde_json::Value>(input).or_else(|_| {
        std::str::from_utf8(input)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_saphyr::from_str::<serde_json::Value>(t).map_err(|e| e.to_string()))
    });
    let Ok(mut v) = parsed else {
        return false;
    };
    if !(v.is_object() || v.is_array()) {
        return false;
    }
    for _ in 0..times {
        replace_leaf(rng, &mut v);
    }
    match serde_json::to_vec(&v) {
        Ok(bytes) => {
            *input = bytes;
            input.truncate(MAX_INPUT);
            true
        }
        Err(_) => false,
    }
}

/// `input`'s bytes changed once.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>]) {
    let len = input.len();
    match rng.below(9) {
        // Flip a bit.
        0 if len > 0 => {
            let i = rng.below(len);
            input[i] ^= 1 << rng.below(8);
        }
        // Set a byte to an interesting value.
        1 if len > 0 => {
            let i = rng.below(len);
            input[i] = INTERESTING[rng.below(INTERESTING.len())];
        }
        // Set a byte to anything.
        2 if len > 0 => {
            let i = rng.below(len);
            input[i] = rng.next_u64() as u8;
        }
        // Delete a slice.
        3 if len > 0 => {
            let start = rng.below(len);
            let n = 1 + rng.below((len - start).min(32));
            input.drain(start..start + n);
        }
        // Duplicate a slice.
        4 if len > 0 => {
            let start = rng.below(len);
            let n = 1 + rng.below((len - start).min(64));
            let copy = input[start..start + n].to_vec();
            let at = rng.below(len + 1);
            for _ in 0..1 + rng.below(4) {
                input.splice(at..at, copy.iter().copied());
            }
        }
        // Splice in a slice of another corpus entry.
        5 if !corpus.is_empty() => {
            let other = &corpus[rng.below(corpus.len())];
            if !other.is_empty() {
                let start = rng.below(other.len());
                let n = 1 + rng.below(other.len() - start);
                let at = rng.below(len + 1);
                let end = at + rng.below(len - at + 1);
                input.splice(at..end, other[start..start + n].iter().copied());
            }
        }
        // Insert random bytes.
        6 => {
            let at = rng.below(len + 1);
            let n = 1 + rng.below(8);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            input.splice(at..at, bytes);
        }
        // Replace a run of digits with an edge number, or insert a token.
        _ => {
            let token = DICTIONARY[rng.below(DICTIONARY.len())].as_bytes();
            let at = rng.below(len + 1);
            if rng.below(2) == 0 && at < len {
                let end = (at + token.len()).min(len);
                input.splice(at..end, token.iter().copied());
            } else {
                input.splice(at..at, token.iter().copied());
            }
        }
    }
    input.truncate(MAX_INPUT);
}

/// An input that panicked, with the panic's message.
#[derive(Clone, Debug)]
pub struct Finding {
    pub input: Vec<u8>,
    pub message: String,
}

/// What a run tried and found.
#[derive(Debug, Default)]
pub struct Report {
    /// Inputs run.
    pub tried: u64,
    /// Panicking inputs, one per distinct panic message (the first, shortest seen).
    pub findings: Vec<Finding>,
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Panics inside a run are caught and reported, not printed; others print as before.
fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

fn message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

/// Runs `target` on `input`: the panic's message if it panicked.
pub fn run_one(target: &Target, input: &[u8]) -> Option<String> {
    quiet_panics();
    QUIET.with(|q| q.set(true));
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
    QUIET.with(|q| q.set(false));
    outcome.err().map(|p| message(p.as_ref()))
}

/// Runs `target` on its seeds and then on `iterations` mutated inputs in all (seeds included),
/// from `seed`.
pub fn fuzz(target: &Target, iterations: u64, seed: u64) -> Report {
    let corpus = seeds(target);
    let mut rng = Rng::new(seed ^ fnv(target.name));
    let mut report = Report::default();
    let mut found: BTreeMap<String, usize> = BTreeMap::new();
    let mut record = |input: &[u8], report: &mut Report| {
        report.tried += 1;
        if let Some(message) = run_one(target, input) {
            match found.get(&message) {
                Some(&i) if report.findings[i].input.len() <= input.len() => {}
                Some(&i) => report.findings[i].input = input.to_vec(),
                None => {
                    found.insert(message.clone(), report.findings.len());
                    report.findings.push(Finding {
                        input: input.to_vec(),
                        message,
                    });
                }
            }
        }
    };
    for s in &corpus {
        if report.tried >= iterations {
            return report;
        }
        record(s, &mut report);
    }
    while report.tried < iterations {
        let mut input = corpus[rng.below(corpus.len())].clone();
        let times = 1 + rng.below(6);
        // Half the JSON inputs get changed values (one to three), the rest changed bytes.
        if rng.below(2) == 1 || !mutate_values(&mut rng, &mut input, 1 + times / 2) {
            for _ in 0..times {
                mutate(&mut rng, &mut input, &corpus);
            }
        }
        record(&input, &mut report);
    }
    report
}

/// A name's hash, so each target draws its own inputs from the same seed.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
