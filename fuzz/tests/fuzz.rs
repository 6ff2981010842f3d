//! Each target over a bounded number of inputs from a fixed seed: no panic. A longer run is
//! `cargo run -p nodeipam-fuzz -- --iterations N`.

use nodeipam_fuzz::{fuzz, target};

const INPUTS: u64 = 3000;
const SEED: u64 = 1;

fn no_findings(name: &str) {
    let t = target(name).expect("a target of that name");
    let report = fuzz(t, INPUTS, SEED);
    assert_eq!(report.tried, INPUTS);
    let found: Vec<String> = report
        .findings
        .iter()
        .map(|f| format!("{}: {:?}", f.message, String::from_utf8_lossy(&f.input)))
        .collect();
    assert!(found.is_empty(), "{name} panicked: {found:#?}");
}

#[test]
fn admission_review() {
    no_findings("admission_review");
}

#[test]
fn node() {
    no_findings("node");
}

#[test]
fn consumer_objects() {
    no_findings("consumer_objects");
}

#[test]
fn node_list_protobuf() {
    no_findings("node_list_protobuf");
}

#[test]
fn ip_masq_agent() {
    no_findings("ip_masq_agent");
}

#[test]
fn pod_network() {
    no_findings("pod_network");
}

#[test]
fn flannel_net_conf() {
    no_findings("flannel_net_conf");
}

#[test]
fn config_spec() {
    no_findings("config_spec");
}

#[test]
fn pool_spec() {
    no_findings("pool_spec");
}

#[test]
fn node_selector() {
    no_findings("node_selector");
}

#[test]
fn kubeconfig() {
    no_findings("kubeconfig");
}

#[test]
fn migrate_input() {
    no_findings("migrate_input");
}

#[test]
fn every_target_has_seeds() {
    for t in nodeipam_fuzz::TARGETS {
        let seeds = nodeipam_fuzz::seeds(t);
        assert!(
            seeds.iter().any(|s| !s.is_empty()),
            "{} has no seeds in fuzz/corpus/{}",
            t.name,
            t.name
        );
    }
}

/// The seeds are valid inputs, so mutations start from what the parsers accept.
#[test]
fn the_seeds_parse() {
    let seeds = |name| nodeipam_fuzz::seeds(target(name).expect("a target"));
    for s in seeds("admission_review") {
        nodeipam_webhook::decode_review(&s).expect("a review");
    }
    for s in seeds("node") {
        let n: nodeipam_alloc::node::IpamNode = serde_json::from_slice(&s).expect("a Node");
        assert!(!n.cidrs().expect("podCIDRs").is_empty());
    }
    for s in seeds("node_list_protobuf").iter().take(2) {
        nodeipam_alloc::node::protobuf::node_list(s).expect("a NodeList");
    }
    for s in seeds("flannel_net_conf") {
        let text = String::from_utf8(s).expect("UTF-8");
        assert!(
            !nodeipam_controller::startup::flannel_networks(&text)
                .expect("a net-conf")
                .is_empty()
        );
    }
    for s in seeds("config_spec") {
        let spec: nodeipam_crd::NodeIPAMConfigSpec = serde_json::from_slice(&s).expect("a spec");
        assert!(nodeipam_crd::validate_spec(&spec).is_empty());
    }
    for s in seeds("pool_spec") {
        let spec: nodeipam_crd::NodeIPAMPoolSpec = serde_json::from_slice(&s).expect("a spec");
        spec.parse().expect("a valid pool spec");
    }
    for s in seeds("migrate_input") {
        let text = String::from_utf8(s).expect("UTF-8");
        assert!(
            !nodeipam_cli::migrate::parse_input(&text, "seed")
                .expect("ClusterCIDRs")
                .is_empty()
        );
    }
    for s in seeds("kubeconfig") {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("config");
        std::fs::write(&path, s).expect("written");
        use nodeipam_controller::kubeconfig::{Files, Overrides, load, select};
        let kc = load(&Files::Flag(path)).expect("a kubeconfig");
        select(kc, &Overrides::default()).expect("a context");
    }
}

/// The fuzzer finds a panic, keeps the input and its message, and counts one finding for many
/// inputs that panic the same way.
#[test]
fn a_panic_is_a_finding() {
    fn panics_on_a_quote(data: &[u8]) {
        assert!(!data.contains(&b'"'), "a quote");
    }
    let t = nodeipam_fuzz::Target {
        name: "self-test-has-no-corpus",
        run: panics_on_a_quote,
        generated: || vec![b"{}".to_vec()],
    };
    let report = fuzz(&t, 2000, SEED);
    assert_eq!(report.tried, 2000);
    assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
    assert!(report.findings[0].input.contains(&b'"'));
    assert!(report.findings[0].message.contains("a quote"));
    // Other panics still print and fail as usual.
    assert!(std::panic::catch_unwind(|| panics_on_a_quote(b"\"")).is_err());
}
