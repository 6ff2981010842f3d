//! End-to-end test of the NodeIPAMPool CRD's OpenAPI schema and CEL rules against the real
//! kube-apiserver (no webhook, no controller): every rule accepts a good value and refuses a
//! bad one with a 422 Invalid naming the field; the Rust twin (`NodeIPAMPoolSpec::parse` and
//! `validate_pool_update`) reaches the same verdict on every case; the defaults the API server
//! fills in are the Rust ones; `kubectl get nipp` shows the printer columns; and the sample
//! pool applies.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, Status};
use nodeipam_crd::{NodeIPAMPool, NodeIPAMPoolSpec, validate_pool_update};
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

/// The hint every immutability refusal of a pool carries.
const POOL_HINT: &str = "create a new NodeIPAMPool beside this one and delete this one";

/// A create (`old` is `None`) or an update from `old` to `new`; refused with every `wants`, or
/// accepted when `wants` is empty.
struct Case {
    name: &'static str,
    old: Option<Value>,
    new: Value,
    wants: Vec<Want>,
}

fn create(name: &'static str, new: Value, wants: Vec<Want>) -> Case {
    Case {
        name,
        old: None,
        new,
        wants,
    }
}

fn update(name: &'static str, old: Value, new: Value, wants: Vec<Want>) -> Case {
    Case {
        name,
        old: Some(old),
        new,
        wants,
    }
}

fn v4(cidrs: &[&str], range: i64, node: i64) -> Value {
    json!({"cidrs": cidrs, "rangeMaskSize": range, "perNodeMaskSize": node})
}

fn dual() -> Value {
    json!({
        "ipv4": v4(&["10.64.0.0/14", "10.128.0.0/16"], 20, 24),
        "ipv6": {"cidrs": ["fd00:10:64::/48"], "rangeMaskSize": 56, "perNodeMaskSize": 60},
    })
}

fn v4_only() -> Value {
    json!({"ipv4": v4(&["10.64.0.0/14"], 20, 24)})
}

/// `base` with `value` at the dotted `path` (objects created on the way).
fn with(mut base: Value, path: &str, value: Value) -> Value {
    let mut node = &mut base;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            node[*part] = value;
            break;
        }
        if node.get(*part).is_none() {
            node[*part] = json!({});
        }
        node = &mut node[*part];
    }
    base
}

fn without(mut base: Value, key: &str) -> Value {
    if let Some(map) = base.as_object_mut() {
        map.remove(key);
    }
    base
}

fn selector(key: &str, operator: &str, values: &[&str]) -> Value {
    let mut expression = json!({"key": key, "operator": operator});
    if !values.is_empty() {
        expression["values"] = json!(values);
    }
    json!({"nodeSelectorTerms": [{"matchExpressions": [expression]}]})
}

fn cases() -> Vec<Case> {
    let ok = Vec::new;
    let seventeen: Vec<String> = (0..17).map(|i| format!("10.{i}.0.0/16")).collect();
    let seventeen: Vec<&str> = seventeen.iter().map(String::as_str).collect();
    let sixteen = &seventeen[..16];
    let v4_cidrs = "spec.ipv4.cidrs";
    let v4_mask = "spec.ipv4.perNodeMaskSize";
    let v4_range = "spec.ipv4.rangeMaskSize";
    let empty_for = "spec.scaleDown.emptyFor";
    let bad_duration = "scaleDown.emptyFor must be a non-negative duration";
    let gpu = selector("gpu", "In", &["a100"]);
    vec![
        // Families.
        create("dual", dual(), ok()),
        create("v4-only", v4_only(), ok()),
        create(
            "v6-only",
            json!({"ipv6": {"cidrs": ["fd00:10:64::/48", "fd00:20::/40"], "rangeMaskSize": 56, "perNodeMaskSize": 64}}),
            ok(),
        ),
        create(
            "no-family",
            json!({}),
            vec![want(
                "spec",
                "at least one of spec.ipv4 or spec.ipv6 is required",
            )],
        ),
        // CIDRs.
        create("sixteen-cidrs", json!({"ipv4": v4(sixteen, 20, 24)}), ok()),
        create(
            "seventeen-cidrs",
            json!({"ipv4": v4(&seventeen, 20, 24)}),
            vec![want(v4_cidrs, "must have at most 16 items")],
        ),
        create(
            "no-cidrs",
            json!({"ipv4": v4(&[], 20, 24)}),
            vec![want(v4_cidrs, "should have at least 1 items")],
        ),
        create(
            "not-a-cidr",
            json!({"ipv4": v4(&["10.64.0.0/14", "banana"], 20, 24)}),
            vec![want(
                "spec.ipv4.cidrs[1]",
                "each of ipv4.cidrs must be a CIDR such as",
            )],
        ),
        create(
            "wrong-family",
            json!({"ipv4": v4(&["fd00::/48"], 56, 60)}),
            vec![want(
                "spec.ipv4.cidrs[0]",
                "each of ipv4.cidrs must be an IPv4 CIDR",
            )],
        ),
        create(
            "wrong-family6",
            json!({"ipv6": v4(&["10.0.0.0/8"], 16, 24)}),
            vec![want(
                "spec.ipv6.cidrs[0]",
                "each of ipv6.cidrs must be an IPv6 CIDR",
            )],
        ),
        create(
            "noncanonical",
            json!({"ipv4": v4(&["10.64.0.1/14"], 20, 24)}),
            vec![want(
                "spec.ipv4.cidrs[0]",
                "each of ipv4.cidrs must be canonical",
            )],
        ),
        create(
            "duplicate",
            json!({"ipv4": v4(&["10.64.0.0/14", "10.64.0.0/14"], 20, 24)}),
            vec![want("spec.ipv4.cidrs[1]", "Duplicate value")],
        ),
        create(
            "overlapping",
            json!({"ipv4": v4(&["10.64.0.0/14", "10.65.0.0/16"], 20, 24)}),
            vec![want(v4_cidrs, "ipv4.cidrs must not overlap each other")],
        ),
        // Masks.
        create(
            "range-equals-node",
            json!({"ipv4": v4(&["10.64.0.0/14"], 24, 24)}),
            vec![want(
                v4_mask,
                "ipv4.perNodeMaskSize must be more than ipv4.rangeMaskSize",
            )],
        ),
        create(
            "node-too-long",
            json!({"ipv4": v4(&["10.64.0.0/14"], 20, 31)}),
            vec![want(v4_mask, "ipv4.perNodeMaskSize must be at most 30")],
        ),
        create(
            "span-16",
            json!({"ipv4": v4(&["10.0.0.0/8"], 14, 30)}),
            ok(),
        ),
        create(
            "span-17",
            json!({"ipv4": v4(&["10.0.0.0/8"], 13, 30)}),
            vec![want(
                v4_mask,
                "ipv4.perNodeMaskSize must be at most 16 more than ipv4.rangeMaskSize",
            )],
        ),
        create(
            "range-wider-than-a-cidr",
            json!({"ipv4": v4(&["10.64.0.0/14", "10.128.0.0/22"], 20, 24)}),
            vec![want(
                v4_range,
                "ipv4.rangeMaskSize must be at least the prefix length of every CIDR",
            )],
        ),
        create(
            "range-equals-a-cidr",
            json!({"ipv4": v4(&["10.64.0.0/14", "10.128.0.0/20"], 20, 24)}),
            ok(),
        ),
        create(
            "negative-mask",
            json!({"ipv4": v4(&["10.64.0.0/14"], -1, 24)}),
            vec![want(v4_range, "should be greater than or equal to 0")],
        ),
        create(
            "lockstep-broken",
            with(dual(), "ipv6.perNodeMaskSize", json!(64)),
            vec![want(
                "spec.ipv6.perNodeMaskSize",
                "ipv6.perNodeMaskSize - ipv6.rangeMaskSize must equal",
            )],
        ),
        create(
            "lockstep-other-masks",
            with(
                with(dual(), "ipv6.rangeMaskSize", json!(60)),
                "ipv6.perNodeMaskSize",
                json!(64),
            ),
            ok(),
        ),
        // Ranges, headroom, emptyFor.
        create(
            "ranges-set",
            with(dual(), "ranges", json!({"min": 0, "max": 256})),
            ok(),
        ),
        create(
            "ranges-min-over-max",
            with(dual(), "ranges", json!({"min": 5, "max": 4})),
            vec![want(
                "spec.ranges.min",
                "ranges.min must be at most ranges.max",
            )],
        ),
        create(
            "ranges-min-over-default-max",
            with(dual(), "ranges", json!({"min": 33})),
            vec![want(
                "spec.ranges.min",
                "ranges.min must be at most ranges.max",
            )],
        ),
        create(
            "ranges-max-257",
            with(dual(), "ranges", json!({"min": 1, "max": 257})),
            vec![want(
                "spec.ranges.max",
                "should be less than or equal to 256",
            )],
        ),
        create(
            "ranges-max-0",
            with(dual(), "ranges", json!({"min": 0, "max": 0})),
            vec![want(
                "spec.ranges.max",
                "should be greater than or equal to 1",
            )],
        ),
        create(
            "ranges-min-negative",
            with(dual(), "ranges", json!({"min": -1})),
            vec![want(
                "spec.ranges.min",
                "should be greater than or equal to 0",
            )],
        ),
        create(
            "headroom-0",
            with(dual(), "headroom.blocks", json!(0)),
            ok(),
        ),
        create(
            "headroom-negative",
            with(dual(), "headroom.blocks", json!(-1)),
            vec![want(
                "spec.headroom.blocks",
                "should be greater than or equal to 0",
            )],
        ),
        create(
            "headroom-too-big",
            with(dual(), "headroom.blocks", json!(16_777_217)),
            vec![want(
                "spec.headroom.blocks",
                "should be less than or equal to 16777216",
            )],
        ),
        create(
            "empty-for-durations",
            with(dual(), "scaleDown.emptyFor", json!("1h30m")),
            ok(),
        ),
        create(
            "empty-for-zero",
            with(dual(), "scaleDown.emptyFor", json!("0")),
            ok(),
        ),
        create(
            "empty-for-fraction",
            with(dual(), "scaleDown.emptyFor", json!(".5h")),
            ok(),
        ),
        create(
            "empty-for-micro",
            with(dual(), "scaleDown.emptyFor", json!("1µs")),
            ok(),
        ),
        create(
            "empty-for-no-unit",
            with(dual(), "scaleDown.emptyFor", json!("30")),
            vec![want(empty_for, bad_duration)],
        ),
        create(
            "empty-for-negative",
            with(dual(), "scaleDown.emptyFor", json!("-5m")),
            vec![want(empty_for, bad_duration)],
        ),
        create(
            "empty-for-days",
            with(dual(), "scaleDown.emptyFor", json!("1d")),
            vec![want(empty_for, bad_duration)],
        ),
        create(
            "empty-for-space",
            with(dual(), "scaleDown.emptyFor", json!("30m ")),
            vec![want(empty_for, bad_duration)],
        ),
        create(
            "empty-for-empty",
            with(dual(), "scaleDown.emptyFor", json!("")),
            vec![want(empty_for, bad_duration)],
        ),
        create(
            "empty-for-too-long",
            with(dual(), "scaleDown.emptyFor", json!("1".repeat(33) + "s")),
            vec![want(empty_for, "Too long")],
        ),
        // Node selector: the same checks as a config's.
        create("selector", with(dual(), "nodeSelector", gpu.clone()), ok()),
        create(
            "selector-in-without-values",
            with(dual(), "nodeSelector", selector("gpu", "In", &[])),
            vec![want(
                "spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].values",
                "values must be specified when operator is In or NotIn",
            )],
        ),
        // Updates: what may change.
        update(
            "append-cidr",
            dual(),
            with(
                dual(),
                "ipv4.cidrs",
                json!(["10.64.0.0/14", "10.128.0.0/16", "10.200.0.0/16"]),
            ),
            ok(),
        ),
        update(
            "scale-settings",
            dual(),
            with(
                with(
                    with(dual(), "ranges", json!({"min": 0, "max": 100})),
                    "headroom.blocks",
                    json!(64),
                ),
                "scaleDown.emptyFor",
                json!("5m"),
            ),
            ok(),
        ),
        // Updates: what may not.
        update(
            "remove-cidr",
            dual(),
            with(dual(), "ipv4.cidrs", json!(["10.64.0.0/14"])),
            vec![
                want(v4_cidrs, "ipv4.cidrs may only be appended to"),
                want(v4_cidrs, POOL_HINT),
            ],
        ),
        update(
            "change-cidr",
            dual(),
            with(
                dual(),
                "ipv4.cidrs",
                json!(["10.64.0.0/14", "10.129.0.0/16"]),
            ),
            vec![want(v4_cidrs, "ipv4.cidrs may only be appended to")],
        ),
        update(
            "range-mask",
            dual(),
            with(
                with(dual(), "ipv4.rangeMaskSize", json!(19)),
                "ipv4.perNodeMaskSize",
                json!(23),
            ),
            vec![
                want(v4_range, "ipv4.rangeMaskSize is immutable"),
                want(v4_mask, "ipv4.perNodeMaskSize is immutable"),
                want(v4_range, POOL_HINT),
            ],
        ),
        update(
            "add-ipv6",
            v4_only(),
            dual(),
            vec![
                want(
                    "spec.ipv6",
                    "ipv6 cannot be added to or removed from an existing NodeIPAMPool",
                ),
                want("spec.ipv6", POOL_HINT),
            ],
        ),
        update(
            "remove-ipv6",
            dual(),
            without(dual(), "ipv6"),
            vec![want(
                "spec.ipv6",
                "ipv6 cannot be added to or removed from an existing NodeIPAMPool",
            )],
        ),
        update(
            "add-selector",
            dual(),
            with(dual(), "nodeSelector", gpu.clone()),
            vec![want(
                "spec.nodeSelector",
                "nodeSelector cannot be added or removed",
            )],
        ),
        update(
            "keep-selector",
            with(dual(), "nodeSelector", gpu.clone()),
            with(
                with(dual(), "nodeSelector", gpu.clone()),
                "headroom.blocks",
                json!(1),
            ),
            ok(),
        ),
        update(
            "change-selector",
            with(dual(), "nodeSelector", gpu),
            with(dual(), "nodeSelector", selector("gpu", "In", &["h100"])),
            vec![
                want("spec.nodeSelector", "nodeSelector is immutable"),
                want("spec.nodeSelector", POOL_HINT),
            ],
        ),
    ]
}

fn pools(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<NodeIPAMPool>(&()))
}

fn object(name: &str, spec: &Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMPool",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a NodeIPAMPool object")
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

/// The Rust twin's verdict: `Ok` when it accepts, else why not.
fn rust_verdict(case: &Case) -> Result<(), String> {
    let parse = |v: &Value| {
        serde_json::from_value::<NodeIPAMPoolSpec>(v.clone()).map_err(|e| e.to_string())
    };
    let new = parse(&case.new)?;
    let mut errors = match &case.old {
        Some(old) => validate_pool_update(&parse(old)?, &new),
        None => Vec::new(),
    };
    errors.extend(new.parse().err().unwrap_or_default());
    if errors.is_empty() {
        Ok(())
    } else {
        Err(nodeipam_crd::format_errors(&errors))
    }
}

/// Failures (empty when fine) of one case's outcome.
fn check(case: &Case, outcome: Result<DynamicObject, kube::Error>) -> Vec<String> {
    let label = case.name;
    let mut failures = Vec::new();
    let rust = rust_verdict(case);
    match (outcome, case.wants.is_empty()) {
        (Ok(obj), true) => {
            // What the API server stored, defaults included, is what serde makes of the
            // request with the Rust defaults.
            let stored = serde_json::from_value::<NodeIPAMPoolSpec>(obj.data["spec"].clone());
            let sent = serde_json::from_value::<NodeIPAMPoolSpec>(case.new.clone());
            match (stored, sent) {
                (Ok(stored), Ok(sent)) if stored == sent => {}
                (stored, sent) => failures.push(format!(
                    "{label}: stored {stored:?}, but the Rust defaults make {sent:?}"
                )),
            }
            if let Err(e) = rust {
                failures.push(format!(
                    "{label}: the API server accepts, the Rust twin refuses: {e}"
                ));
            }
        }
        (Ok(obj), false) => failures.push(format!(
            "{label}: accepted (stored {}) but must be refused",
            obj.data["spec"]
        )),
        (Err(kube::Error::Api(status)), true) => {
            failures.push(format!("{label}: refused: {}", describe(&status)));
        }
        (Err(kube::Error::Api(status)), false) => {
            if status.code != 422 || status.reason != "Invalid" {
                failures.push(format!("{label}: not a 422 Invalid: {}", describe(&status)));
            }
            for w in &case.wants {
                let named = status
                    .details
                    .iter()
                    .flat_map(|d| &d.causes)
                    .any(|c| c.field == w.field && c.message.contains(w.says));
                if !named {
                    failures.push(format!(
                        "{label}: no error on {} saying {:?}: {}",
                        w.field,
                        w.says,
                        describe(&status)
                    ));
                }
            }
            if rust.is_ok() {
                failures.push(format!(
                    "{label}: the API server refuses, the Rust twin accepts"
                ));
            }
        }
        (Err(other), _) => failures.push(format!("{label}: {other}")),
    }
    failures
}

async fn run_case(api: &Api<DynamicObject>, case: &Case) -> Vec<String> {
    let name = format!("case-{}", case.name);
    let outcome = match &case.old {
        None => {
            api.create(&PostParams::default(), &object(&name, &case.new))
                .await
        }
        Some(old) => {
            let created = match api
                .create(&PostParams::default(), &object(&name, old))
                .await
            {
                Ok(created) => created,
                Err(e) => return vec![format!("{}: creating the old pool: {e}", case.name)],
            };
            let mut next = created;
            next.data["spec"] = case.new.clone();
            api.replace(&name, &PostParams::default(), &next).await
        }
    };
    check(case, outcome)
}

/// `kubectl get nipp` (and `-o wide`) shows the CIDRs, the number of children, the
/// conditions and the block counts written to the status.
async fn printer_columns(cp: &ControlPlane, api: &Api<DynamicObject>) -> Vec<String> {
    let mut failures = Vec::new();
    let statuses = [
        (
            "print-dual",
            dual(),
            json!({
                "ranges": [
                    {"name": "print-dual-10-64-0-0-20", "ipv4": "10.64.0.0/20", "ipv6": "fd00:10:64::/56", "state": "Active"},
                    {"name": "print-dual-10-64-16-0-20", "ipv4": "10.64.16.0/20", "ipv6": "fd00:10:64:100::/56", "state": "Draining"},
                ],
                "ipv4": {"ranges": 2, "capacity": 32, "allocated": 17, "budgetBlocks": 512},
                "ipv6": {"ranges": 2, "capacity": 32, "allocated": 17, "budgetBlocks": 512},
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "Accepting", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Exhausted", "status": "False", "reason": "BlocksFree", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "Scaling", "status": "True", "reason": "Carving", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                ],
            }),
        ),
        (
            "print-v6",
            json!({"ipv6": {"cidrs": ["fd00:20::/40"], "rangeMaskSize": 56, "perNodeMaskSize": 64}}),
            json!({"ipv6": {"ranges": 5, "capacity": 1280, "allocated": 3, "budgetBlocks": 8192}}),
        ),
    ];
    for (name, spec, status) in &statuses {
        if let Err(e) = api
            .create(&PostParams::default(), &object(name, spec))
            .await
        {
            failures.push(format!("{name}: create: {e}"));
            continue;
        }
        let patch = json!({"status": status});
        if let Err(e) = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            failures.push(format!("{name}: status: {e}"));
        }
    }
    let get = |wide: bool| {
        let mut cmd = cp.kubectl();
        cmd.args(["get", "nipp", "print-dual", "print-v6"]);
        if wide {
            cmd.args(["-o", "wide"]);
        }
        cmd.output()
    };
    for wide in [false, true] {
        let out = match get(wide) {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
            Ok(out) => {
                failures.push(format!(
                    "kubectl get nipp: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                continue;
            }
            Err(e) => {
                failures.push(format!("kubectl get nipp: cannot run: {e}"));
                continue;
            }
        };
        eprintln!(
            "kubectl get nipp{}:\n{out}",
            if wide { " -o wide" } else { "" }
        );
        // Cells can be empty, so columns are cut at the header's offsets.
        let lines: Vec<&str> = out.lines().collect();
        let header_line = lines.first().copied().unwrap_or_default();
        let header: Vec<&str> = header_line.split_whitespace().collect();
        let starts: Vec<usize> = header
            .iter()
            .scan(0, |from, h| {
                let at = header_line[*from..].find(h).map(|i| i + *from)?;
                *from = at + h.len();
                Some(at)
            })
            .collect();
        let mut expected_header = vec![
            "NAME",
            "IPV4",
            "IPV6",
            "RANGES",
            "READY",
            "EXHAUSTED",
            "AGE",
        ];
        if wide {
            expected_header.extend([
                "SCALING",
                "IPV4-ALLOCATED",
                "IPV4-CAPACITY",
                "IPV6-ALLOCATED",
                "IPV6-CAPACITY",
            ]);
        }
        if header != expected_header {
            failures.push(format!(
                "header {header:?}, want {expected_header:?}:\n{out}"
            ));
            continue;
        }
        let cell = |row: &str, column: &str| -> Option<String> {
            let i = header.iter().position(|h| *h == column)?;
            let line = lines
                .iter()
                .find(|l| l.split_whitespace().next() == Some(row))?;
            let start = starts[i].min(line.len());
            let end = starts
                .get(i + 1)
                .map_or(line.len(), |e| (*e).min(line.len()));
            Some(line[start..end].trim().to_owned())
        };
        let mut expected = vec![
            ("print-dual", "IPV4", "[\"10.64.0.0/14\",\"10.128.0.0/16\"]"),
            ("print-dual", "IPV6", "[\"fd00:10:64::/48\"]"),
            ("print-dual", "RANGES", "2"),
            ("print-dual", "READY", "True"),
            ("print-dual", "EXHAUSTED", "False"),
            ("print-v6", "IPV4", ""),
            ("print-v6", "RANGES", "5"),
        ];
        if wide {
            expected.extend([
                ("print-dual", "SCALING", "True"),
                ("print-dual", "IPV4-ALLOCATED", "17"),
                ("print-dual", "IPV4-CAPACITY", "32"),
                ("print-v6", "IPV6-ALLOCATED", "3"),
                ("print-v6", "IPV6-CAPACITY", "1280"),
            ]);
        }
        for (row, column, value) in expected {
            let got = cell(row, column);
            if got.as_deref() != Some(value) {
                failures.push(format!("{row} {column}: {got:?}, want {value:?}:\n{out}"));
            }
        }
    }
    failures
}

/// `kubectl explain` shows the field descriptions of the pool.
fn explain(cp: &ControlPlane) -> Vec<String> {
    let out = match cp.kubectl().args(["explain", "nipp.spec.ipv4"]).output() {
        Ok(out) => out,
        Err(e) => return vec![format!("kubectl explain: cannot run: {e}")],
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    [
        "cidrs <[]string> -required-",
        "rangeMaskSize <integer> -required-",
        "perNodeMaskSize <integer> -required-",
        "Prefix length of each child's range",
    ]
    .iter()
    .filter(|s| !flat.contains(*s))
    .map(|s| format!("kubectl explain nipp.spec.ipv4 does not mention {s:?}:\n{text}"))
    .collect()
}

/// The sample pool passes the schema and the CEL rules, and the Rust twin finds it valid with
/// room for its `ranges.max`.
async fn sample_applies(cp: &ControlPlane, api: &Api<DynamicObject>) -> Vec<String> {
    let path =
        nodeipam_testenv::workspace_root().join("config/samples/nodeipam_v1alpha1_pool.yaml");
    let out = match cp
        .kubectl()
        .args(["apply", "-f", &path.display().to_string()])
        .output()
    {
        Ok(out) => out,
        Err(e) => return vec![format!("kubectl apply sample: cannot run: {e}")],
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains("nodeipampool.nodeipam.io/batch created") {
        return vec![format!(
            "the sample pool was not created: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )];
    }
    let stored = match api.get("batch").await {
        Ok(obj) => obj,
        Err(e) => return vec![format!("sample: get: {e}")],
    };
    match serde_json::from_value::<NodeIPAMPoolSpec>(stored.data["spec"].clone())
        .map_err(|e| e.to_string())
        .and_then(|spec| spec.parse().map_err(|e| nodeipam_crd::format_errors(&e)))
    {
        Ok(pool) if pool.budget_ranges() == u64::from(pool.max_ranges) => Vec::new(),
        Ok(pool) => vec![format!(
            "sample: its CIDRs hold {} ranges, fewer than ranges.max {}",
            pool.budget_ranges(),
            pool.max_ranges
        )],
        Err(e) => vec![format!("sample: the Rust twin refuses it: {e}")],
    }
}

#[tokio::test]
async fn pool_rules_through_the_api_server() {
    let cp = match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => panic!("the control plane did not start: {e}"),
    };
    let api = pools(&cp.client());
    let cases = cases();
    let mut failures = Vec::new();
    for case in &cases {
        failures.extend(run_case(&api, case).await);
    }
    failures.extend(printer_columns(&cp, &api).await);
    failures.extend(explain(&cp));
    failures.extend(sample_applies(&cp, &api).await);
    assert!(
        failures.is_empty(),
        "{} failure(s):\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    let refused = cases.iter().filter(|c| !c.wants.is_empty()).count();
    assert!(
        cases.len() >= 50 && refused >= 30,
        "the catalogue lost cases ({} cases, {refused} refusals)",
        cases.len()
    );
    cp.stop().await;
}
