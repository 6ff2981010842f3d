//! Prints the CRD YAML (NodeIPAMConfig and NodeIPAMPool, as one stream), or with `--write`
//! writes each CRD to `config/crd/bases/` and, as a template, to the Helm chart's
//! `charts/nodeipam/templates/crds/`, in the workspace.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            print!("{}", nodeipam_crd::all_crds_yaml());
            ExitCode::SUCCESS
        }
        [flag] if flag == "--write" => {
            // The crate lives one level below the workspace root.
            let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            let root = manifest_dir.parent().unwrap_or(manifest_dir);
            for rel in nodeipam_crd::CRD_PATHS {
                let Some(yaml) = nodeipam_crd::generated_file(rel) else {
                    eprintln!("crdgen: nothing generates {rel}");
                    return ExitCode::FAILURE;
                };
                let path = root.join(rel);
                if let Err(err) = std::fs::write(&path, &yaml) {
                    eprintln!("crdgen: cannot write {}: {err}", path.display());
                    return ExitCode::FAILURE;
                }
                eprintln!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "usage: crdgen [--write]\n  prints the CRD YAML, or writes it to {}",
                nodeipam_crd::CRD_PATHS.join(", ")
            );
            ExitCode::from(2)
        }
    }
}
