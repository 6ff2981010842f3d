//! The crate's modules form layers, not cycles: `limits` depends on nothing, `range` only on
//! `limits`, and `schema` (the CEL rules) and `validation` (their Rust twin) share both without
//! depending on each other. Rust accepts module cycles, so nothing else would notice one coming
//! back; this reads the `crate::` paths of each module's code (comments left out), its
//! submodule files (`validation/pool.rs`, `schema/pool.rs`) included.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The `.rs` files of module `stem`: `src/<stem>.rs` and its submodules under `src/<stem>/`
/// (e.g. `validation/pool.rs`), test files left out.
fn module_files(src: &Path, stem: &str) -> Vec<PathBuf> {
    let mut files = vec![src.join(format!("{stem}.rs"))];
    let mut pending = vec![src.join(stem)];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs")
                && path.file_stem().and_then(|s| s.to_str()) != Some("tests")
            {
                files.push(path);
            }
        }
    }
    files
}

/// Module name -> the sibling modules its code (submodules included) names.
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("crd/src is readable") {
        let path = entry.expect("directory entry").path();
        let (Some(stem), Some("rs")) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        if stem == "lib" {
            continue;
        }
        let mut deps = BTreeSet::new();
        for file in module_files(&src, stem) {
            let text = std::fs::read_to_string(&file).expect("module is readable");
            for line in text.lines() {
                let code = line.split("//").next().unwrap_or_default();
                for (i, _) in code.match_indices("crate::") {
                    let name: String = code[i + "crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != stem {
                        deps.insert(name);
                    }
                }
            }
        }
        graph.insert(stem.to_owned(), deps);
    }
    graph
}

#[test]
fn limits_and_range_are_the_bottom_layers() {
    let graph = dependencies();
    assert_eq!(
        graph["limits"],
        BTreeSet::new(),
        "limits must depend on nothing"
    );
    assert_eq!(
        graph["range"],
        BTreeSet::from(["limits".to_owned()]),
        "range must depend on limits only"
    );
    assert!(!graph["schema"].contains("validation"), "{graph:?}");
    assert!(!graph["validation"].contains("schema"), "{graph:?}");
}

#[test]
fn modules_have_no_cycle() {
    let graph = dependencies();
    // Kahn's algorithm: a module with no remaining dependency is removed until none is left.
    let mut left = graph.clone();
    while let Some(leaf) = left
        .iter()
        .find(|(_, deps)| deps.iter().all(|d| !left.contains_key(d)))
        .map(|(name, _)| name.clone())
    {
        left.remove(&leaf);
    }
    assert!(left.is_empty(), "modules in a cycle: {left:?}");
}

/// The pool API sits on the types and the CEL rules; its validation (`validation/pool.rs`,
/// `validation/space.rs`) sits on it, never the other way round, and the pool's CEL rules
/// (`schema/pool.rs`) know no API type.
#[test]
fn the_pool_api_sits_below_its_validation() {
    let graph = dependencies();
    assert!(graph["validation"].contains("pool"), "{graph:?}");
    assert!(!graph["pool"].contains("validation"), "{graph:?}");
    for module in ["pool", "types", "validation"] {
        assert!(!graph["schema"].contains(module), "{graph:?}");
    }
}
