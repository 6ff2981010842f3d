//! The allocation core stays pure: the crate depends on nothing that does I/O, spawns tasks or
//! reads a clock, so its code cannot name them (a crate can only use its dependencies), and no
//! source reads the time from the system.

use std::path::Path;

/// Crates that would let the core await, spawn, talk to the API server or serve.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "futures",
    "kube",
    "kube-client",
    "kube-runtime",
    "hyper",
    "reqwest",
    "tower",
    "axum",
    "async-trait",
];

fn dependencies(manifest: &str) -> Vec<String> {
    let doc: toml_lite::Doc = toml_lite::parse(manifest);
    doc.section("dependencies")
}

/// The core and the one workspace crate it builds on (the API types): with both free of them,
/// `cargo tree -p nodeipam-alloc` holds no runtime and no client at any depth.
#[test]
fn the_core_depends_on_no_runtime_and_no_client() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for manifest in [root.join("Cargo.toml"), root.join("../crd/Cargo.toml")] {
        let text = std::fs::read_to_string(&manifest).expect("a readable Cargo.toml");
        let deps = dependencies(&text);
        assert!(deps.contains(&"kube-core".to_string()), "parsed: {deps:?}");
        for dep in &deps {
            assert!(
                !FORBIDDEN.contains(&dep.as_str()),
                "{} depends on {dep}: the core must not await, spawn or reach the API server",
                manifest.display()
            );
        }
    }
}

#[test]
fn no_source_reads_the_clock() {
    let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            files += 1;
            for clock in [
                "Instant::now",
                "SystemTime",
                "Timestamp::now",
                "thread::sleep",
            ] {
                assert!(
                    !text.contains(clock),
                    "{} reads the clock ({clock}): the time is an input of the machine",
                    path.display()
                );
            }
        }
    }
    assert!(files > 10, "only {files} source files found");
}

/// Just enough TOML to list a section's keys, so the test needs no parser crate.
mod toml_lite {
    pub struct Doc(Vec<(String, String)>);

    pub fn parse(text: &str) -> Doc {
        let mut section = String::new();
        let mut keys = Vec::new();
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_string();
            } else if let Some((key, _)) = line.split_once(['=', '.'])
                && !line.starts_with('#')
                && !key.trim().is_empty()
            {
                keys.push((section.clone(), key.trim().to_string()));
            }
        }
        Doc(keys)
    }

    impl Doc {
        pub fn section(&self, name: &str) -> Vec<String> {
            self.0
                .iter()
                .filter(|(s, _)| s == name)
                .map(|(_, k)| k.clone())
                .collect()
        }
    }
}
