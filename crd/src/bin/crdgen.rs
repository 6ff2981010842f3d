//! Prints the NodeIPAMConfig CRD YAML, or with `--write` writes it to
//! `config/crd/bases/nodeipam.io_nodeipamconfigs.yaml` and to the Helm chart's copy,
//! `charts/nodeipam/crds/nodeipam.io_nodeipamconfigs.yaml`, in the workspace.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let yaml = nodeipam_crd::crd_yaml();
    match args.as_slice() {
        [] => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        [flag] if flag == "--write" => {
            // The crate lives one level below the workspace root.
            let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            let root = manifest_dir.parent().unwrap_or(manifest_dir);
            for rel in nodeipam_crd::CRD_PATHS {
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
                "usage: crdgen [--write]\n  prints the NodeIPAMConfig CRD YAML, or writes it to {}",
                nodeipam_crd::CRD_PATHS.join(" and ")
            );
            ExitCode::from(2)
        }
    }
}
