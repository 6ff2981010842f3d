//! `tests/cases/specs.json` records, for each spec, whether kube-apiserver v1.37 (the CRD's
//! OpenAPI schema and CEL rules) accepts it. The pure validation must reach the same verdict,
//! so the webhook and controller never disagree with the API server. The end-to-end tests can
//! replay the same file against a real API server.

use nodeipam_crd::{NodeIPAMConfigSpec, format_errors, validate_spec, validate_update};
use serde_json::Value;

fn cases() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cases/specs.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

/// The spec, or why it does not even deserialize (e.g. an unknown enum value, which
/// the API server rejects by its schema).
fn parse_spec(spec: &Value) -> Result<NodeIPAMConfigSpec, String> {
    serde_json::from_value::<NodeIPAMConfigSpec>(spec.clone()).map_err(|e| e.to_string())
}

#[test]
fn create_verdicts_match_the_api_server() {
    let all = cases();
    let list = all["create"].as_array().expect("create cases");
    assert!(list.len() > 40, "the case file lost its cases");
    let (mut valid, mut invalid) = (0, 0);
    for case in list {
        let name = case["name"].as_str().unwrap_or("?");
        let want_valid = case["valid"].as_bool().expect("valid flag");
        let verdict = match parse_spec(&case["spec"]) {
            Ok(spec) => {
                let errs = validate_spec(&spec);
                (errs.is_empty(), format_errors(&errs))
            }
            Err(e) => (false, e),
        };
        assert_eq!(
            verdict.0, want_valid,
            "case {name}: validation says {:?}",
            verdict.1
        );
        if want_valid { valid += 1 } else { invalid += 1 }
    }
    assert!(
        valid >= 5 && invalid >= 20,
        "cases cover both verdicts ({valid} valid, {invalid} invalid)"
    );
}

#[test]
fn update_verdicts_match_the_api_server() {
    let all = cases();
    let list = all["update"].as_array().expect("update cases");
    assert!(list.len() >= 6, "the case file lost its update cases");
    for case in list {
        let name = case["name"].as_str().unwrap_or("?");
        let want_valid = case["valid"].as_bool().expect("valid flag");
        let old = parse_spec(&case["old"]).unwrap_or_else(|e| panic!("case {name}: old spec: {e}"));
        let new = parse_spec(&case["new"]).unwrap_or_else(|e| panic!("case {name}: new spec: {e}"));
        assert!(
            validate_spec(&old).is_empty(),
            "case {name}: old spec must be valid"
        );
        let mut errs = validate_update(&old, &new);
        errs.extend(validate_spec(&new));
        assert_eq!(
            errs.is_empty(),
            want_valid,
            "case {name}: {}",
            format_errors(&errs)
        );
    }
}
