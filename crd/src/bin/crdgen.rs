//! Prints the NodeIPAMConfig CRD YAML, or with `--write` writes it to
//! `config/crd/bases/nodeipam.io_nodeipamconfigs.yaml` in the workspace.

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
            let path = manifest_dir
                .parent()
                .unwrap_or(manifest_dir)
                .join(nodeipam_crd::CRD_PATH);
            match std::fs::write(&path, yaml) {
                Ok(()) => {
                    eprintln!("wrote {}", path.display());
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("crdgen: cannot write {}: {err}", path.display());
                    ExitCode::FAILURE
                }
            }
        }
        _ => {
            eprintln!(
                "usage: crdgen [--write]\n  prints the NodeIPAMConfig CRD YAML, or writes it to {}",
                nodeipam_crd::CRD_PATH
            );
            ExitCode::from(2)
        }
    }
}
