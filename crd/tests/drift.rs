//! Every committed copy of each CRD's YAML (`config/crd/bases` and the Helm chart's templates
//! in `templates/crds`), NodeIPAMConfig and NodeIPAMPool, must be exactly what crdgen
//! generates from the Rust types.

use std::path::PathBuf;

fn check(rel: &str) -> Result<(), String> {
    let generated = nodeipam_crd::generated_file(rel)
        .ok_or_else(|| format!("crdgen generates nothing for {rel}"))?;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    let committed = std::fs::read_to_string(&path).map_err(|err| {
        format!(
            "cannot read {}: {err}; run `cargo run -p nodeipam-crd --bin crdgen -- --write`",
            path.display()
        )
    })?;
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

#[test]
fn committed_pool_crd_matches_generated() {
    check(nodeipam_crd::POOL_CRD_PATH).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn chart_pool_crd_matches_generated() {
    check(nodeipam_crd::CHART_POOL_CRD_PATH).unwrap_or_else(|e| panic!("{e}"));
}

/// crdgen writes every path the drift tests check, all different files, and every CRD file
/// committed under `config/crd/bases` and the chart's `templates/crds` is one of them (a CRD
/// added without a drift check, or left behind after a rename, fails here). The chart has no
/// `crds/` folder: Helm would install those CRDs once, and then refuse the templated ones.
#[test]
fn every_copy_is_checked() {
    let paths = nodeipam_crd::CRD_PATHS;
    assert_eq!(
        paths,
        [
            nodeipam_crd::CRD_PATH,
            nodeipam_crd::CHART_CRD_PATH,
            nodeipam_crd::POOL_CRD_PATH,
            nodeipam_crd::CHART_POOL_CRD_PATH
        ]
    );
    for (i, a) in paths.iter().enumerate() {
        assert!(nodeipam_crd::generated_file(a).is_some(), "{a}");
        for b in &paths[i + 1..] {
            assert_ne!(a, b);
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    assert!(
        !root.join("charts/nodeipam/crds").exists(),
        "charts/nodeipam/crds/ exists: the chart's CRDs are templates (templates/crds)"
    );
    for dir in ["config/crd/bases", "charts/nodeipam/templates/crds"] {
        for entry in std::fs::read_dir(root.join(dir)).expect("CRD folder is readable") {
            let name = entry.expect("directory entry").file_name();
            let rel = format!("{dir}/{}", name.to_string_lossy());
            assert!(
                paths.contains(&rel.as_str()),
                "{rel} is no file crdgen writes, so no drift test checks it"
            );
        }
    }
}

/// The chart's template of a CRD renders to the CRD as generated, with the keep policy and the
/// chart's labels, and only when `crds.install` is true; a `{{` in a CRD would be escaped.
#[test]
fn the_chart_template_wraps_the_generated_crd() {
    let crd = nodeipam_crd::crd_yaml();
    let template = nodeipam_crd::chart_template(&crd);
    assert!(
        template.starts_with("{{- if .Values.crds.install }}\n"),
        "{template}"
    );
    assert!(template.ends_with("{{- end }}\n"), "{template}");
    assert!(
        template.contains(
            "metadata:\n  annotations:\n    helm.sh/resource-policy: keep\n  labels:\n    \
             {{- include \"nodeipam.labels\" . | nindent 4 }}\n  name: nodeipamconfigs.nodeipam.io\n"
        ),
        "{template}"
    );
    let spec = crd.find("\nspec:\n").expect("the CRD has a spec");
    assert!(
        template.contains(&crd[spec..]),
        "the spec is the generated one"
    );
    let escaped =
        nodeipam_crd::chart_template("kind: X\nmetadata:\n  name: a\ndescription: '{{x}}'\n");
    assert!(
        escaped.contains("description: '{{ \"{{\" }}x}}'"),
        "{escaped}"
    );
}
