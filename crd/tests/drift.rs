//! Every committed copy of the CRD YAML (`config/crd/bases` and the Helm chart's `crds/`) must
//! be exactly what `crd_yaml()` generates from the Rust types.

use std::path::PathBuf;

fn check(rel: &str) -> Result<(), String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    let committed = std::fs::read_to_string(&path).map_err(|err| {
        format!(
            "cannot read {}: {err}; run `cargo run -p nodeipam-crd --bin crdgen -- --write`",
            path.display()
        )
    })?;
    let generated = nodeipam_crd::crd_yaml();
    if committed != generated {
        let first_diff = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()) + 1);
        return Err(format!(
            "{rel} is out of date (first difference at line {first_diff}); \
             run `cargo run -p nodeipam-crd --bin crdgen -- --write` and commit the result"
        ));
    }
    Ok(())
}

#[test]
fn committed_crd_matches_generated() {
    check(nodeipam_crd::CRD_PATH).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn chart_crd_matches_generated() {
    check(nodeipam_crd::CHART_CRD_PATH).unwrap_or_else(|e| panic!("{e}"));
}

/// crdgen writes every path the drift tests check, and both are different files.
#[test]
fn every_copy_is_checked() {
    assert_eq!(
        nodeipam_crd::CRD_PATHS,
        [nodeipam_crd::CRD_PATH, nodeipam_crd::CHART_CRD_PATH]
    );
    assert_ne!(nodeipam_crd::CRD_PATH, nodeipam_crd::CHART_CRD_PATH);
}
