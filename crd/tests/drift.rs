//! The committed CRD YAML must be exactly what `crd_yaml()` generates from the Rust types.

use std::path::PathBuf;

#[test]
fn committed_crd_matches_generated() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(nodeipam_crd::CRD_PATH);
    let committed = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) => panic!(
            "cannot read {}: {err}; run `cargo run -p nodeipam-crd --bin crdgen -- --write`",
            path.display()
        ),
    };
    let generated = nodeipam_crd::crd_yaml();
    if committed != generated {
        let first_diff = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()) + 1);
        panic!(
            "{} is out of date (first difference at line {first_diff}); \
             run `cargo run -p nodeipam-crd --bin crdgen -- --write` and commit the result",
            nodeipam_crd::CRD_PATH
        );
    }
}
