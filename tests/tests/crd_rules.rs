//! End-to-end test of the NodeIPAMConfig CRD's OpenAPI schema and CEL rules against the real
//! kube-apiserver (no webhook, no controller): every case recorded in
//! `crd/tests/cases/specs.json` gets the recorded verdict, every refusal is a 422 Invalid
//! naming the field and the reason, `allocation` is the one mutable field, and
//! `kubectl explain` shows the field descriptions.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, Status};
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_testenv::ControlPlane;
use serde_json::{Value, json};

/// One error the API server must report: a status cause on `field` whose message contains
/// `says`.
#[derive(Clone, Copy, Debug)]
struct Want {
    field: &'static str,
    says: &'static str,
}

const fn want(field: &'static str, says: &'static str) -> Want {
    Want { field, says }
}

/// The hint every immutability refusal carries.
const DRAIN: &str = "create a new NodeIPAMConfig and delete this one to drain it";

const EXPR0_KEY: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].key";
const EXPR0_OP: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator";
const EXPR0_VALUES: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values";
const FIELD0_KEY: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchFields[0].key";
const FIELD0_OP: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchFields[0].operator";
const FIELD0_VALUES: &str = "spec.nodeSelector.nodeSelectorTerms[0].matchFields[0].values";

const V4_NOT_CIDR: Want = want("spec.ipv4.cidr", "ipv4.cidr must be a CIDR such as");
const V6_NOT_CIDR: Want = want("spec.ipv6.cidr", "ipv6.cidr must be a CIDR such as");
const BAD_KEY: Want = want(EXPR0_KEY, "key must be a label key");
const NOT_ONE_INTEGER: Want = want(
    EXPR0_VALUES,
    "values must be a single integer when operator is Gt or Lt",
);

/// The errors each refused case of specs.json must produce, by case name. Every refused case
/// needs an entry and every entry a refused case, so the file and this table stay in step.
const RECORDED: &[(&str, &[Want])] = &[
    // Families.
    (
        "empty",
        &[want(
            "spec",
            "at least one of spec.ipv4 or spec.ipv6 is required",
        )],
    ),
    (
        "null-both",
        &[want(
            "spec",
            "at least one of spec.ipv4 or spec.ipv6 is required",
        )],
    ),
    // CIDR syntax.
    ("bad-cidr", &[V4_NOT_CIDR]),
    ("leading-zero", &[V4_NOT_CIDR]),
    ("prefix-leading-zero", &[V4_NOT_CIDR]),
    ("prefix-33", &[V4_NOT_CIDR]),
    ("prefix-plus", &[V4_NOT_CIDR]),
    ("zone", &[V6_NOT_CIDR]),
    ("mapped", &[V6_NOT_CIDR]),
    ("mapped-hex", &[V6_NOT_CIDR]),
    // Family and canonical form.
    (
        "wrong-family",
        &[want("spec.ipv4.cidr", "ipv4.cidr must be an IPv4 CIDR")],
    ),
    (
        "wrong-family6",
        &[want("spec.ipv6.cidr", "ipv6.cidr must be an IPv6 CIDR")],
    ),
    (
        "noncanonical",
        &[want(
            "spec.ipv4.cidr",
            "ipv4.cidr must be canonical (host bits zero)",
        )],
    ),
    // Per-node mask.
    (
        "mask-too-big4",
        &[want(
            "spec.ipv4.perNodeMaskSize",
            "ipv4.perNodeMaskSize must be at most 30",
        )],
    ),
    (
        "mask-lt-prefix",
        &[want(
            "spec.ipv4.perNodeMaskSize",
            "ipv4.perNodeMaskSize must be at least the prefix length of ipv4.cidr",
        )],
    ),
    (
        "v6-too-many",
        &[want(
            "spec.ipv6.perNodeMaskSize",
            "ipv6.perNodeMaskSize must be at most 32 more than the prefix length of ipv6.cidr",
        )],
    ),
    (
        "v6-mask-127",
        &[want(
            "spec.ipv6.perNodeMaskSize",
            "ipv6.perNodeMaskSize must be at most 126",
        )],
    ),
    (
        "v6-mask-129",
        &[want(
            "spec.ipv6.perNodeMaskSize",
            "should be less than or equal to 128",
        )],
    ),
    // Allocation.
    (
        "alloc-bad",
        &[want("spec.allocation", "Unsupported value: \"Paused\"")],
    ),
    // Node selector: terms.
    (
        "sel-empty-terms",
        &[want(
            "spec.nodeSelector.nodeSelectorTerms",
            "should have at least 1 items",
        )],
    ),
    (
        "sel-too-many-terms",
        &[want(
            "spec.nodeSelector.nodeSelectorTerms",
            "Too many: 9: must have at most 8 items",
        )],
    ),
    // Node selector: label requirements.
    (
        "sel-in-novalues",
        &[want(
            EXPR0_VALUES,
            "values must be specified when operator is In or NotIn",
        )],
    ),
    (
        "sel-exists-values",
        &[want(
            EXPR0_VALUES,
            "values may not be specified when operator is Exists or DoesNotExist",
        )],
    ),
    ("sel-gt-two", &[NOT_ONE_INTEGER]),
    ("sel-gt-nonint", &[NOT_ONE_INTEGER]),
    ("sel-gt-negative", &[NOT_ONE_INTEGER]),
    (
        "sel-bad-op",
        &[want(EXPR0_OP, "Unsupported value: \"Equals\"")],
    ),
    ("sel-bad-key", &[BAD_KEY]),
    ("sel-bad-prefix", &[BAD_KEY]),
    ("sel-two-slash", &[BAD_KEY]),
    ("sel-key-64", &[BAD_KEY]),
    ("sel-empty-key", &[BAD_KEY]),
    (
        "sel-bad-value",
        &[want(
            "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values[1]",
            "value must be a label value",
        )],
    ),
    (
        "sel-too-many-values",
        &[want(
            EXPR0_VALUES,
            "Too many: 65: must have at most 64 items",
        )],
    ),
    // Node selector: field requirements.
    (
        "sel-field-key",
        &[want(
            FIELD0_KEY,
            "Unsupported value: \"metadata.namespace\"",
        )],
    ),
    (
        "sel-field-op",
        &[want(FIELD0_OP, "Unsupported value: \"Exists\"")],
    ),
    (
        "sel-field-two",
        &[want(FIELD0_VALUES, "Too many: 2: must have at most 1 item")],
    ),
    (
        "sel-field-novalues",
        &[want(
            FIELD0_VALUES,
            "values must hold exactly one node name for a node field selector",
        )],
    ),
    (
        "sel-field-badname",
        &[want(
            "spec.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0]",
            "value must be a node name",
        )],
    ),
    // Updates: immutability, each with the way out.
    (
        "cidr",
        &[
            want("spec.ipv4", "ipv4 is immutable"),
            want("spec.ipv4", DRAIN),
        ],
    ),
    (
        "mask",
        &[
            want("spec.ipv4", "ipv4 is immutable"),
            want("spec.ipv4", DRAIN),
        ],
    ),
    (
        "add-ipv6",
        &[
            want(
                "spec.ipv6",
                "ipv6 cannot be added to or removed from an existing NodeIPAMConfig",
            ),
            want("spec.ipv6", DRAIN),
        ],
    ),
    (
        "swap-family",
        &[
            want(
                "spec.ipv4",
                "ipv4 cannot be added to or removed from an existing NodeIPAMConfig",
            ),
            want(
                "spec.ipv6",
                "ipv6 cannot be added to or removed from an existing NodeIPAMConfig",
            ),
        ],
    ),
    (
        "selector-change",
        &[
            want("spec.nodeSelector", "nodeSelector is immutable"),
            want("spec.nodeSelector", DRAIN),
        ],
    ),
    (
        "selector-remove",
        &[
            want(
                "spec.nodeSelector",
                "nodeSelector cannot be added or removed",
            ),
            want("spec.nodeSelector", DRAIN),
        ],
    ),
];

/// A refusal the API server must produce that specs.json does not record: a create when `old`
/// is `None`, else an update from `old` to `new`.
struct Extra {
    name: &'static str,
    old: Option<Value>,
    new: Value,
    wants: Vec<Want>,
}

fn v4(cidr: &str, mask: i64) -> Value {
    json!({"ipv4": {"cidr": cidr, "perNodeMaskSize": mask}})
}

fn v6(cidr: &str, mask: i64) -> Value {
    json!({"ipv6": {"cidr": cidr, "perNodeMaskSize": mask}})
}

fn dual() -> Value {
    json!({
        "ipv4": {"cidr": "10.64.0.0/14", "perNodeMaskSize": 24},
        "ipv6": {"cidr": "fd00:10:64::/56", "perNodeMaskSize": 64},
    })
}

/// `spec` with a selector of one term holding `expression`.
fn selecting(mut spec: Value, expression: Value) -> Value {
    spec["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [expression]}]});
    spec
}

fn create_extra(name: &'static str, new: Value, wants: Vec<Want>) -> Extra {
    Extra {
        name,
        old: None,
        new,
        wants,
    }
}

fn update_extra(name: &'static str, old: Value, new: Value, wants: Vec<Want>) -> Extra {
    Extra {
        name,
        old: Some(old),
        new,
        wants,
    }
}

fn extras() -> Vec<Extra> {
    let base = v4("10.64.0.0/14", 24);
    let mut disabled_changed = v4("10.68.0.0/14", 24);
    disabled_changed["allocation"] = json!("Disabled");
    let mut nameless = v4("10.64.0.0/14", 24);
    nameless["ipv4"]
        .as_object_mut()
        .expect("ipv4 object")
        .remove("perNodeMaskSize");
    let mut lowercase = v4("10.64.0.0/14", 24);
    lowercase["allocation"] = json!("disabled");
    let mut paused = v4("10.64.0.0/14", 24);
    paused["allocation"] = json!("Paused");
    vec![
        create_extra(
            "v6-noncanonical",
            v6("fd00:10:64::1/56", 64),
            vec![want("spec.ipv6.cidr", "ipv6.cidr must be canonical")],
        ),
        create_extra(
            "v6-mask-lt-prefix",
            v6("fd00:10:64::/56", 48),
            vec![want(
                "spec.ipv6.perNodeMaskSize",
                "ipv6.perNodeMaskSize must be at least the prefix length of ipv6.cidr",
            )],
        ),
        create_extra(
            "mask-negative",
            v4("10.64.0.0/14", -1),
            vec![want(
                "spec.ipv4.perNodeMaskSize",
                "should be greater than or equal to 0",
            )],
        ),
        create_extra(
            "mask-missing",
            nameless,
            vec![want("spec.ipv4.perNodeMaskSize", "Required value")],
        ),
        create_extra(
            "cidr-empty",
            v4("", 24),
            vec![want("spec.ipv4.cidr", "should be at least 1 chars long")],
        ),
        create_extra(
            "alloc-lowercase",
            lowercase,
            vec![want("spec.allocation", "Unsupported value: \"disabled\"")],
        ),
        create_extra(
            "notin-novalues",
            selecting(base.clone(), json!({"key": "a", "operator": "NotIn"})),
            vec![want(
                EXPR0_VALUES,
                "values must be specified when operator is In or NotIn",
            )],
        ),
        create_extra(
            "notin-empty-values",
            selecting(
                base.clone(),
                json!({"key": "a", "operator": "NotIn", "values": []}),
            ),
            vec![want(
                EXPR0_VALUES,
                "values must be specified when operator is In or NotIn",
            )],
        ),
        create_extra(
            "doesnotexist-values",
            selecting(
                base.clone(),
                json!({"key": "a", "operator": "DoesNotExist", "values": ["x"]}),
            ),
            vec![want(
                EXPR0_VALUES,
                "values may not be specified when operator is Exists or DoesNotExist",
            )],
        ),
        create_extra(
            "gt-fraction",
            selecting(
                base.clone(),
                json!({"key": "a", "operator": "Gt", "values": ["1.5"]}),
            ),
            vec![NOT_ONE_INTEGER],
        ),
        create_extra(
            "lt-novalues",
            selecting(base.clone(), json!({"key": "a", "operator": "Lt"})),
            vec![NOT_ONE_INTEGER],
        ),
        create_extra(
            "operator-missing",
            selecting(base.clone(), json!({"key": "a"})),
            vec![want(EXPR0_OP, "Required value")],
        ),
        create_extra(
            "key-missing",
            selecting(base.clone(), json!({"operator": "Exists"})),
            vec![want(EXPR0_KEY, "Required value")],
        ),
        create_extra(
            "field-label-key",
            {
                let mut s = base.clone();
                s["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.labels", "operator": "In", "values": ["x"]}
                ]}]});
                s
            },
            vec![want(FIELD0_KEY, "Unsupported value: \"metadata.labels\"")],
        ),
        create_extra(
            "selector-without-terms",
            {
                let mut s = base.clone();
                s["nodeSelector"] = json!({});
                s
            },
            vec![want(
                "spec.nodeSelector.nodeSelectorTerms",
                "Required value",
            )],
        ),
        update_extra(
            "v6-cidr-change",
            v6("fd00:10:64::/56", 64),
            v6("fd00:10:65::/56", 64),
            vec![
                want("spec.ipv6", "ipv6 is immutable"),
                want("spec.ipv6", DRAIN),
            ],
        ),
        update_extra(
            "v6-mask-change",
            v6("fd00:10:64::/56", 64),
            v6("fd00:10:64::/56", 80),
            vec![want("spec.ipv6", "ipv6 is immutable")],
        ),
        update_extra(
            "remove-ipv4",
            dual(),
            v6("fd00:10:64::/56", 64),
            vec![
                want(
                    "spec.ipv4",
                    "ipv4 cannot be added to or removed from an existing NodeIPAMConfig",
                ),
                want("spec.ipv4", DRAIN),
            ],
        ),
        update_extra(
            "add-selector",
            base.clone(),
            selecting(base.clone(), json!({"key": "a", "operator": "Exists"})),
            vec![
                want(
                    "spec.nodeSelector",
                    "nodeSelector cannot be added or removed",
                ),
                want("spec.nodeSelector", DRAIN),
            ],
        ),
        update_extra(
            "selector-operator-change",
            selecting(base.clone(), json!({"key": "a", "operator": "Exists"})),
            selecting(
                base.clone(),
                json!({"key": "a", "operator": "DoesNotExist"}),
            ),
            vec![
                want("spec.nodeSelector", "nodeSelector is immutable"),
                want("spec.nodeSelector", DRAIN),
            ],
        ),
        // Changing `allocation` is allowed, but not as a way past the other rules.
        update_extra(
            "disable-and-move",
            base.clone(),
            disabled_changed,
            vec![want("spec.ipv4", "ipv4 is immutable")],
        ),
        update_extra(
            "allocation-bad-value",
            base.clone(),
            paused,
            vec![want("spec.allocation", "Unsupported value: \"Paused\"")],
        ),
        // A refused update that also breaks a create rule reports both.
        update_extra(
            "noncanonical-change",
            base,
            v4("10.64.0.1/14", 24),
            vec![
                want("spec.ipv4", "ipv4 is immutable"),
                want("spec.ipv4.cidr", "ipv4.cidr must be canonical"),
            ],
        ),
    ]
}

fn configs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<NodeIPAMConfig>(&()))
}

fn object(name: &str, spec: &Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a NodeIPAMConfig object")
}

/// An object name for a case: a lowercase RFC 1123 subdomain.
fn object_name(prefix: &str, case: &str) -> String {
    let tail: String = case
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    format!("{prefix}-{tail}")
}

/// `spec` as the API server stores it: `allocation` defaults to `Enabled`.
fn stored_form(spec: &Value) -> Value {
    let mut spec = spec.clone();
    if spec.get("allocation").is_none() {
        spec["allocation"] = json!("Enabled");
    }
    spec
}

fn describe(status: &Status) -> String {
    let causes: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| &d.causes)
        .map(|c| format!("{} [{}]: {}", c.field, c.reason, c.message))
        .collect();
    format!(
        "{} {}: {}\n      causes: {causes:#?}",
        status.code, status.reason, status.message
    )
}

/// Failures (empty when fine) of an outcome that must be an accepted write storing `expected`.
fn check_accepted(
    label: &str,
    outcome: Result<DynamicObject, kube::Error>,
    expected: &Value,
) -> Vec<String> {
    match outcome {
        Ok(obj) if obj.data["spec"] == stored_form(expected) => Vec::new(),
        Ok(obj) => vec![format!(
            "{label}: accepted but stored {} instead of {}",
            obj.data["spec"],
            stored_form(expected)
        )],
        Err(kube::Error::Api(status)) => {
            vec![format!("{label}: refused: {}", describe(&status))]
        }
        Err(other) => vec![format!("{label}: {other}")],
    }
}

/// Failures (empty when fine) of an outcome that must be a 422 Invalid with every `wants`.
fn check_refused(
    label: &str,
    outcome: Result<DynamicObject, kube::Error>,
    wants: &[Want],
) -> Vec<String> {
    let status = match outcome {
        Ok(obj) => {
            return vec![format!(
                "{label}: accepted (stored {}) but must be refused",
                obj.data["spec"]
            )];
        }
        Err(kube::Error::Api(status)) => status,
        Err(other) => return vec![format!("{label}: {other}")],
    };
    let mut failures = Vec::new();
    if status.code != 422 || status.reason != "Invalid" {
        failures.push(format!("{label}: not a 422 Invalid: {}", describe(&status)));
    }
    assert!(!wants.is_empty(), "{label}: no expected error");
    let causes = status.details.iter().flat_map(|d| &d.causes);
    for w in wants {
        let named = causes
            .clone()
            .any(|c| c.field == w.field && c.message.contains(w.says));
        // The message kubectl prints holds the same, as `<field>: <reason>...`.
        let printed =
            status.message.contains(&format!("{}: ", w.field)) && status.message.contains(w.says);
        if !(named && printed) {
            failures.push(format!(
                "{label}: no error on {} saying {:?}: {}",
                w.field,
                w.says,
                describe(&status)
            ));
        }
    }
    failures
}

/// Creates `old`, then replaces its spec with `new`; returns the update's outcome.
async fn create_then_update(
    api: &Api<DynamicObject>,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<Result<DynamicObject, kube::Error>, String> {
    let created = api
        .create(&PostParams::default(), &object(name, old))
        .await
        .map_err(|e| format!("creating the old object failed: {e}"))?;
    let mut next = created;
    next.data["spec"] = new.clone();
    Ok(api.replace(name, &PostParams::default(), &next).await)
}

/// After a refused update the stored object must still be the old one.
async fn check_unchanged(
    api: &Api<DynamicObject>,
    label: &str,
    name: &str,
    old: &Value,
) -> Vec<String> {
    match api.get(name).await {
        Ok(obj) if obj.data["spec"] == stored_form(old) => Vec::new(),
        Ok(obj) => vec![format!(
            "{label}: refused update left {} instead of {}",
            obj.data["spec"],
            stored_form(old)
        )],
        Err(e) => vec![format!("{label}: reading back: {e}")],
    }
}

fn recorded_cases() -> Value {
    let path = nodeipam_testenv::workspace_root().join("crd/tests/cases/specs.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn wants_for(name: &str) -> Option<&'static [Want]> {
    RECORDED
        .iter()
        .find(|(case, _)| *case == name)
        .map(|(_, wants)| *wants)
}

/// Replays specs.json. Returns the failures and how many cases ran, accepted and refused.
async fn replay_recorded(api: &Api<DynamicObject>) -> (Vec<String>, usize, usize) {
    let all = recorded_cases();
    let creates = all["create"].as_array().expect("create cases");
    let updates = all["update"].as_array().expect("update cases");
    let mut failures = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    let mut refused_names = Vec::new();

    for case in creates {
        let name = case["name"].as_str().expect("case name");
        let valid = case["valid"].as_bool().expect("valid flag");
        let label = format!("create {name}");
        let outcome = api
            .create(
                &PostParams::default(),
                &object(&object_name("c", name), &case["spec"]),
            )
            .await;
        if valid {
            accepted += 1;
            failures.extend(check_accepted(&label, outcome, &case["spec"]));
        } else {
            refused += 1;
            refused_names.push(name);
            match wants_for(name) {
                Some(wants) => failures.extend(check_refused(&label, outcome, wants)),
                None => failures.push(format!("{label}: no expected errors in RECORDED")),
            }
        }
    }

    for case in updates {
        let name = case["name"].as_str().expect("case name");
        let valid = case["valid"].as_bool().expect("valid flag");
        let label = format!("update {name}");
        let target = object_name("u", name);
        let outcome = match create_then_update(api, &target, &case["old"], &case["new"]).await {
            Ok(outcome) => outcome,
            Err(e) => {
                failures.push(format!("{label}: {e}"));
                continue;
            }
        };
        if valid {
            accepted += 1;
            failures.extend(check_accepted(&label, outcome, &case["new"]));
        } else {
            refused += 1;
            refused_names.push(name);
            match wants_for(name) {
                Some(wants) => failures.extend(check_refused(&label, outcome, wants)),
                None => failures.push(format!("{label}: no expected errors in RECORDED")),
            }
            failures.extend(check_unchanged(api, &label, &target, &case["old"]).await);
        }
    }

    for (name, _) in RECORDED {
        if !refused_names.contains(name) {
            failures.push(format!(
                "RECORDED has {name}, which is no refused case of specs.json"
            ));
        }
    }
    (failures, accepted, refused)
}

async fn replay_extras(api: &Api<DynamicObject>, extras: &[Extra]) -> Vec<String> {
    let mut failures = Vec::new();
    for extra in extras {
        let target = object_name("x", extra.name);
        match &extra.old {
            None => {
                let label = format!("catalogue create {}", extra.name);
                let outcome = api
                    .create(&PostParams::default(), &object(&target, &extra.new))
                    .await;
                failures.extend(check_refused(&label, outcome, &extra.wants));
            }
            Some(old) => {
                let label = format!("catalogue update {}", extra.name);
                match create_then_update(api, &target, old, &extra.new).await {
                    Ok(outcome) => {
                        failures.extend(check_refused(&label, outcome, &extra.wants));
                        failures.extend(check_unchanged(api, &label, &target, old).await);
                    }
                    Err(e) => failures.push(format!("{label}: {e}")),
                }
            }
        }
    }
    failures
}

/// `allocation` can be flipped both ways, by update and by patch, and is stored as written.
async fn allocation_is_mutable(api: &Api<DynamicObject>) -> Vec<String> {
    let mut failures = Vec::new();
    let name = "allocation-flips";
    let spec = selecting(
        dual(),
        json!({"key": "pool", "operator": "In", "values": ["a"]}),
    );
    let created = match api
        .create(&PostParams::default(), &object(name, &spec))
        .await
    {
        Ok(obj) => obj,
        Err(e) => return vec![format!("allocation: create: {e}")],
    };
    if created.data["spec"]["allocation"] != "Enabled" {
        failures.push(format!(
            "allocation: defaulted to {} instead of Enabled",
            created.data["spec"]["allocation"]
        ));
    }

    let mut disabled = spec.clone();
    disabled["allocation"] = json!("Disabled");
    let mut next = created;
    next.data["spec"] = disabled.clone();
    let outcome = api.replace(name, &PostParams::default(), &next).await;
    let after = outcome.as_ref().ok().cloned();
    failures.extend(check_accepted(
        "allocation: update to Disabled",
        outcome,
        &disabled,
    ));

    if let Some(mut next) = after {
        let mut enabled = spec.clone();
        enabled["allocation"] = json!("Enabled");
        next.data["spec"] = enabled.clone();
        let outcome = api.replace(name, &PostParams::default(), &next).await;
        failures.extend(check_accepted(
            "allocation: update back to Enabled",
            outcome,
            &enabled,
        ));
    }

    let patch = json!({"spec": {"allocation": "Disabled"}});
    let outcome = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    failures.extend(check_accepted(
        "allocation: merge patch to Disabled",
        outcome,
        &disabled,
    ));
    failures
}

/// `kubectl explain` reads the descriptions from the served OpenAPI schema.
fn explain_shows_descriptions(cp: &ControlPlane) -> Vec<String> {
    let out = match cp
        .kubectl()
        .args(["explain", "nodeipamconfig.spec.ipv4"])
        .output()
    {
        Ok(out) => out,
        Err(e) => return vec![format!("kubectl explain: cannot run: {e}")],
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return vec![format!(
            "kubectl explain failed ({}): {}{stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )];
    }
    // kubectl wraps descriptions to the terminal width: compare with whitespace collapsed.
    let flat = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    [
        // The field itself.
        "FIELD: ipv4 <Object>",
        "IPv4 range to hand out. Immutable, and cannot be added or removed after creation",
        // Its fields, with their descriptions.
        "cidr <string> -required-",
        "The range in canonical CIDR notation (host bits zero)",
        "perNodeMaskSize <integer> -required-",
        "Prefix length of the block each node receives",
        "at most 30 (IPv4) or 126 (IPv6), and at most 32 more than the prefix length of `cidr`",
    ]
    .iter()
    .filter(|s| !flat.contains(*s))
    .map(|s| format!("kubectl explain nodeipamconfig.spec.ipv4 does not mention {s:?}:\n{stdout}"))
    .collect()
}

#[tokio::test]
async fn crd_rules_through_the_api_server() {
    let cp = match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => panic!("the control plane did not start: {e}"),
    };
    let api = configs(&cp.client());

    let (mut failures, accepted, refused) = replay_recorded(&api).await;
    let extras = extras();
    failures.extend(replay_extras(&api, &extras).await);
    failures.extend(allocation_is_mutable(&api).await);
    failures.extend(explain_shows_descriptions(&cp));

    assert!(
        failures.is_empty(),
        "{} failure(s):\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    // specs.json holds 52 creates and 8 updates; a shrunken file must not pass quietly.
    assert!(
        accepted + refused >= 60 && accepted >= 10 && refused >= 40,
        "replayed {accepted} accepted and {refused} refused cases"
    );
    assert!(
        RECORDED.len() >= 45 && extras.len() >= 20,
        "the catalogue lost entries"
    );
    eprintln!(
        "replayed {accepted} accepted and {refused} refused recorded cases, {} catalogue refusals",
        extras.len()
    );
    cp.stop().await;
}
