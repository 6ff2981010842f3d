//! `hack/release.sh`, run into a temporary folder: every artifact of the version in Cargo.toml
//! is made and is what a user or a release job takes it for. The krew manifest passes the
//! checks krew makes of an index entry (its `validation` package and `validate-krew-manifest`,
//! re-implemented here from their rules) and names each tarball by its checksum; the checksums
//! file matches the files; each plugin tarball, installed as krew installs it, gives a
//! `kubectl nodeipam` that runs from PATH; the image archive carries the release tag, the one
//! the chart deploys by default; the chart package has the version.
//!
//! Needs buildah (the image, through `hack/image.sh`, whose stamp makes a second run cheap), a
//! release build of the controller and the plugin, and Helm (`hack/helm.sh`): hack/test.sh
//! runs it with `--ignored` after those. Nothing is downloaded.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use nodeipam_testenv::{default_assets_dir, workspace_root};
use serde_json::{Value, json};

/// Where the manifest says the tarballs are (`NODEIPAM_RELEASE_URL`); never fetched.
const RELEASE_URL: &str = "https://releases.example.invalid/nodeipam/v-test";

fn run(cmd: &mut Command, step: &str) -> Output {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("step={step}: cannot start {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "step={step}: {cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The workspace version, as Cargo.toml's `[workspace.package]` has it.
fn cargo_version() -> String {
    let text = std::fs::read_to_string(workspace_root().join("Cargo.toml")).expect("Cargo.toml");
    text.lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("step=version: Cargo.toml has a workspace version")
        .to_string()
}

fn sha256(path: &Path) -> String {
    let out = run(Command::new("sha256sum").arg(path), "sha256sum");
    stdout(&out)
        .split_whitespace()
        .next()
        .expect("sha256sum prints a sum")
        .to_string()
}

// ----- krew's rules for a plugin manifest -----

/// What krew refuses in a plugin manifest named `<file_stem>.yaml`, one line each; empty when
/// krew would accept it. The rules of krew's index validation: the apiVersion and kind, a
/// safe name (word characters and `-`, no Windows device name) equal to the file's name, a
/// short description, a `v`-prefixed semantic version, and per platform a uri, a sha256 of 64
/// lowercase hex digits, a bin, file operations and a selector of only `os`/`arch` that is
/// neither missing nor empty; and no two platforms for the same os/arch.
fn krew_problems(file_stem: &str, m: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    if text(m, "apiVersion") != "krew.googlecontainertools.github.com/v1alpha2" {
        problems.push(format!(
            "apiVersion {:?} is not v1alpha2",
            text(m, "apiVersion")
        ));
    }
    if text(m, "kind") != "Plugin" {
        problems.push(format!("kind {:?} is not Plugin", text(m, "kind")));
    }
    let name = m
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let safe = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-');
    let windows = [
        "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8",
        "COM9", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
    ];
    if !safe || windows.iter().any(|w| w.eq_ignore_ascii_case(name)) {
        problems.push(format!("metadata.name {name:?} is not a safe plugin name"));
    }
    if name != file_stem {
        problems.push(format!(
            "metadata.name {name:?} is not the file's name {file_stem:?}"
        ));
    }
    let spec = m.get("spec").cloned().unwrap_or(Value::Null);
    if text(&spec, "shortDescription").is_empty() {
        problems.push("spec.shortDescription is empty".into());
    }
    let version = text(&spec, "version");
    if !is_krew_semver(&version) {
        problems.push(format!(
            "spec.version {version:?} is not v<major>.<minor>.<patch>"
        ));
    }
    let platforms = spec
        .get("platforms")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if platforms.is_empty() {
        problems.push("spec.platforms is empty".into());
    }
    let mut matched: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (i, p) in platforms.iter().enumerate() {
        for problem in platform_problems(p) {
            problems.push(format!("spec.platforms[{i}]: {problem}"));
        }
        for os in ["linux", "darwin", "windows"] {
            for arch in ["amd64", "arm64", "arm", "386"] {
                if selector_matches(p.get("selector").unwrap_or(&Value::Null), os, arch)
                    && let Some(j) = matched.insert((os.into(), arch.into()), i)
                {
                    problems.push(format!(
                        "spec.platforms[{j}] and [{i}] both match os={os} arch={arch}"
                    ));
                }
            }
        }
    }
    problems
}

/// krew's version rule: a leading `v`, then a semantic version (pre-release and build allowed).
fn is_krew_semver(v: &str) -> bool {
    let Some(rest) = v.strip_prefix('v') else {
        return false;
    };
    let core = rest.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.chars().all(|c| c.is_ascii_digit())
                && (p.len() == 1 || !p.starts_with('0'))
        })
}

fn platform_problems(p: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let text = |key: &str| p.get(key).and_then(Value::as_str).unwrap_or("");
    if text("uri").is_empty() {
        problems.push("uri is not set".to_string());
    }
    let sum = text("sha256");
    if sum.len() != 64 || !sum.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')) {
        problems.push(format!("sha256 {sum:?} is not 64 lowercase hex digits"));
    }
    if text("bin").is_empty() {
        problems.push("bin is not set".into());
    }
    if p.get("files")
        .and_then(Value::as_array)
        .is_none_or(|f| f.is_empty())
    {
        problems.push("files has no operation".into());
    }
    match p.get("selector") {
        None | Some(Value::Null) => problems.push("selector is missing".into()),
        Some(sel) => {
            let labels = sel.get("matchLabels").and_then(Value::as_object);
            let exprs = sel.get("matchExpressions").and_then(Value::as_array);
            if labels.is_none_or(|l| l.is_empty()) && exprs.is_none_or(|e| e.is_empty()) {
                problems.push("selector is empty".into());
            }
            let keys = labels.into_iter().flat_map(|l| l.keys().cloned()).chain(
                exprs.into_iter().flatten().map(|e| {
                    e.get("key")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                }),
            );
            for key in keys {
                if key != "os" && key != "arch" {
                    problems.push(format!("selector key {key:?} is not os or arch"));
                }
            }
        }
    }
    problems
}

/// Whether a platform's selector picks a machine with `os` and `arch` (matchLabels only: the
/// manifests made here use no expressions).
fn selector_matches(sel: &Value, os: &str, arch: &str) -> bool {
    let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) else {
        return false;
    };
    labels.iter().all(|(k, v)| match k.as_str() {
        "os" => v == os,
        "arch" => v == arch,
        _ => false,
    })
}

/// An edit that breaks a manifest.
type Breaks = Box<dyn Fn(&mut Value)>;

/// The validator can fail: each broken copy of a good manifest is refused, naming the rule.
fn validator_refuses_broken_copies(good: &Value) {
    let broken: [(&str, Breaks, &str); 8] = [
        ("kind", Box::new(|m| m["kind"] = json!("Plugins")), "kind"),
        (
            "name",
            Box::new(|m| m["metadata"]["name"] = json!("node ipam")),
            "safe plugin name",
        ),
        (
            "version",
            Box::new(|m| m["spec"]["version"] = json!("0.1.0")),
            "spec.version",
        ),
        (
            "sha256",
            Box::new(|m| m["spec"]["platforms"][0]["sha256"] = json!("ABC")),
            "sha256",
        ),
        (
            "selector key",
            Box::new(|m| {
                m["spec"]["platforms"][0]["selector"]["matchLabels"]["distro"] = json!("debian")
            }),
            "selector key",
        ),
        (
            "bin",
            Box::new(|m| m["spec"]["platforms"][0]["bin"] = json!("")),
            "bin",
        ),
        (
            "short description",
            Box::new(|m| m["spec"]["shortDescription"] = json!("")),
            "shortDescription",
        ),
        (
            "two platforms for one machine",
            Box::new(|m| {
                let first = m["spec"]["platforms"][0].clone();
                m["spec"]["platforms"].as_array_mut().unwrap().push(first);
            }),
            "both match",
        ),
    ];
    for (what, breaks, says) in broken {
        let mut m = good.clone();
        breaks(&mut m);
        let problems = krew_problems("nodeipam", &m);
        assert!(
            problems.iter().any(|p| p.contains(says)),
            "step=krew-validator: a manifest with a bad {what} was not refused for {says:?}: {problems:?}"
        );
    }
}

// ----- installing as krew does -----

/// Unpacks `tarball` and applies the platform's file operations into `dir` as krew does
/// (each `from`, relative to the unpacked archive, copied into `to` under the install
/// folder), then returns the path of `bin`, which must stay inside `dir`.
fn krew_install(tarball: &Path, platform: &Value, dir: &Path) -> PathBuf {
    let mut unpacked = dir.as_os_str().to_owned();
    unpacked.push(".unpacked");
    let unpacked = PathBuf::from(unpacked);
    std::fs::create_dir_all(&unpacked).expect("unpack folder");
    std::fs::create_dir_all(dir).expect("install folder");
    run(
        Command::new("tar")
            .arg("-xzf")
            .arg(tarball)
            .arg("-C")
            .arg(&unpacked),
        "plugin-untar",
    );
    let inside = |rel: &str| {
        let p = Path::new(rel);
        assert!(
            !p.is_absolute()
                && p.components()
                    .all(|c| !matches!(c, std::path::Component::ParentDir)),
            "step=krew-install: {rel:?} leaves the install folder"
        );
        p.to_path_buf()
    };
    for op in platform["files"].as_array().expect("files") {
        let from = inside(op["from"].as_str().expect("files[].from"));
        let to = inside(op["to"].as_str().unwrap_or("."));
        let src = unpacked.join(&from);
        assert!(
            src.is_file(),
            "step=krew-install: files[].from {} is not in {}",
            from.display(),
            tarball.display()
        );
        let dest = dir.join(&to).join(from.file_name().expect("a file name"));
        std::fs::create_dir_all(dest.parent().unwrap()).expect("to folder");
        std::fs::copy(&src, &dest).expect("copy a file operation");
    }
    let bin = dir.join(inside(platform["bin"].as_str().expect("bin")));
    assert!(
        bin.is_file(),
        "step=krew-install: bin {} is not among the files installed from {}",
        bin.display(),
        tarball.display()
    );
    bin
}

/// The image tag a kubelet pulls for `reference`: Docker's normalisation of a short name.
fn normalized(reference: &str) -> String {
    let first = reference.split('/').next().unwrap_or("");
    let has_registry = reference.contains('/')
        && (first.contains('.') || first.contains(':') || first == "localhost");
    match (has_registry, reference.contains('/')) {
        (true, _) => reference.to_string(),
        (false, true) => format!("docker.io/{reference}"),
        (false, false) => format!("docker.io/library/{reference}"),
    }
}

/// The image the chart deploys with its default values: `image.repository` at the tag, or at
/// the chart's appVersion when the tag is empty.
fn chart_default_image() -> String {
    let chart_dir = workspace_root().join("charts/nodeipam");
    let read = |f: &str| -> Value {
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir.join(f)).expect(f)).expect(f)
    };
    let (chart, values) = (read("Chart.yaml"), read("values.yaml"));
    let repo = values["image"]["repository"]
        .as_str()
        .expect("image.repository");
    let tag = match values["image"]["tag"].as_str().unwrap_or("") {
        "" => chart["appVersion"].as_str().expect("appVersion"),
        tag => tag,
    };
    format!("{repo}:{tag}")
}

#[test]
#[ignore = "needs buildah, a release build and hack/helm.sh: hack/test.sh runs it with --ignored"]
fn release_makes_every_artifact_for_the_version() {
    let version = cargo_version();
    let tag = format!("v{version}");
    let tmp = tempfile::tempdir().expect("temporary folder");
    let out = tmp.path().join("out");

    // 1. One command.
    run(
        Command::new("bash")
            .arg(workspace_root().join("hack/release.sh"))
            .arg("--out")
            .arg(&out)
            .env("NODEIPAM_RELEASE_URL", RELEASE_URL)
            .env_remove("NODEIPAM_RELEASE_TARGETS")
            .env_remove("NODEIPAM_RELEASE_IMAGE"),
        "release",
    );
    let files: BTreeSet<String> = std::fs::read_dir(&out)
        .expect("the output folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();

    // 2. SHA256SUMS lists every other file, with its sum.
    let sums_text =
        std::fs::read_to_string(out.join("SHA256SUMS")).expect("step=checksums: SHA256SUMS");
    let mut sums = BTreeMap::new();
    for line in sums_text.lines() {
        let (sum, name) = line
            .split_once("  ")
            .unwrap_or_else(|| panic!("step=checksums: {line:?} is not `<sum>  <file>`"));
        sums.insert(name.to_string(), sum.to_string());
    }
    let listed: BTreeSet<String> = sums.keys().cloned().collect();
    let expected: BTreeSet<String> = files
        .iter()
        .filter(|f| *f != "SHA256SUMS")
        .cloned()
        .collect();
    assert_eq!(
        listed, expected,
        "step=checksums: SHA256SUMS does not list exactly the artifacts"
    );
    for (name, sum) in &sums {
        assert_eq!(&sha256(&out.join(name)), sum, "step=checksums: {name}");
    }

    // 3. The krew manifest: valid as krew validates it, one platform per plugin tarball.
    let manifest: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(out.join("nodeipam.yaml")).expect("step=krew: nodeipam.yaml"),
    )
    .expect("step=krew: nodeipam.yaml parses");
    let problems = krew_problems("nodeipam", &manifest);
    assert!(
        problems.is_empty(),
        "step=krew: krew would refuse nodeipam.yaml: {problems:#?}"
    );
    validator_refuses_broken_copies(&manifest);
    assert_eq!(
        manifest["spec"]["version"],
        json!(tag),
        "step=krew: spec.version"
    );
    for key in ["description", "homepage"] {
        assert!(
            manifest["spec"][key]
                .as_str()
                .is_some_and(|s| !s.trim().is_empty()),
            "step=krew: spec.{key} is empty"
        );
    }
    let tarballs: BTreeSet<&String> = files
        .iter()
        .filter(|f| f.starts_with("kubectl-nodeipam-") && f.ends_with(".tar.gz"))
        .collect();
    let platforms = manifest["spec"]["platforms"].as_array().expect("platforms");
    assert_eq!(
        platforms.len(),
        tarballs.len(),
        "step=krew: a platform per plugin tarball"
    );
    assert!(
        platforms
            .iter()
            .any(|p| selector_matches(&p["selector"], "linux", "amd64")),
        "step=krew: no linux/amd64 platform"
    );

    // 4. Each tarball: named by the uri, the sum, and installable; the host's runs as
    //    `kubectl nodeipam` from PATH.
    let kubectl = default_assets_dir().join("kubectl");
    assert!(
        kubectl.is_file(),
        "step=locate-kubectl: no kubectl at {}: run hack/control-plane.sh build",
        kubectl.display()
    );
    for p in platforms {
        let uri = p["uri"].as_str().expect("uri");
        let name = uri
            .strip_prefix(&format!("{RELEASE_URL}/"))
            .unwrap_or_else(|| panic!("step=krew: uri {uri} is not under NODEIPAM_RELEASE_URL"));
        assert!(
            tarballs.contains(&name.to_string()),
            "step=krew: uri {uri} names no artifact"
        );
        let tarball = out.join(name);
        assert_eq!(
            p["sha256"].as_str(),
            Some(sha256(&tarball).as_str()),
            "step=krew: sha256 of {name}"
        );
        let listing = stdout(&run(
            Command::new("tar").arg("-tzf").arg(&tarball),
            "plugin-list",
        ));
        let entries: BTreeSet<&str> = listing.lines().collect();
        assert_eq!(
            entries,
            BTreeSet::from(["kubectl-nodeipam", "LICENSE"]),
            "step=plugin-tarball: {name} holds exactly the plugin and LICENSE"
        );
        let dir = tmp
            .path()
            .join("krew")
            .join(name.trim_end_matches(".tar.gz"));
        let bin = krew_install(&tarball, p, &dir);
        if !selector_matches(&p["selector"], "linux", "amd64") || std::env::consts::ARCH != "x86_64"
        {
            continue;
        }
        let path = format!(
            "{}:{}",
            bin.parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let plugin = |args: &[&str]| {
            let mut cmd = Command::new(&kubectl);
            cmd.arg("nodeipam").args(args).env("PATH", &path);
            stdout(&run(&mut cmd, "kubectl-nodeipam-from-path"))
        };
        let printed = plugin(&["version"]);
        assert!(
            printed.contains(&version),
            "step=plugin-version: `kubectl nodeipam version` printed {printed:?}, not {version}"
        );
        let help = plugin(&["--help"]);
        assert!(
            help.to_lowercase().contains("usage"),
            "step=plugin-help: `kubectl nodeipam --help` printed {help:?}"
        );
    }

    // 5. The image archive carries the release tag, the image the chart deploys by default.
    let image = files
        .iter()
        .find(|f| f.starts_with(&format!("nodeipam-image-{tag}-")) && f.ends_with(".oci.tar"))
        .unwrap_or_else(|| {
            panic!("step=image: no nodeipam-image-{tag}-<os>-<arch>.oci.tar in {files:?}")
        });
    let index: Value = serde_json::from_str(&stdout(&run(
        Command::new("tar")
            .arg("-xOf")
            .arg(out.join(image))
            .arg("index.json"),
        "image-index",
    )))
    .expect("step=image: index.json parses");
    let names: Vec<&str> = index["manifests"]
        .as_array()
        .expect("step=image: index.json has manifests")
        .iter()
        .filter_map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str())
        .collect();
    let want = normalized(&chart_default_image());
    assert!(
        want.ends_with(&format!(":{tag}")),
        "step=image: the chart's default image {want} is not at {tag}"
    );
    assert_eq!(
        names,
        [want.as_str()],
        "step=image: the archive's tag is not the chart's default image"
    );

    // 6. The chart package has the version.
    let chart = out.join(format!("nodeipam-{version}.tgz"));
    let chart_yaml = stdout(&run(
        Command::new("tar")
            .arg("-xzOf")
            .arg(&chart)
            .arg("nodeipam/Chart.yaml"),
        "chart-package",
    ));
    let chart_meta: Value =
        serde_saphyr::from_str(&chart_yaml).expect("step=chart: Chart.yaml parses");
    assert_eq!(
        chart_meta["version"],
        json!(version),
        "step=chart: packaged version"
    );
    assert_eq!(
        chart_meta["appVersion"],
        json!(tag),
        "step=chart: packaged appVersion"
    );
}

/// hack/version.sh refuses a tag that is not the version, naming the tag: the release
/// workflow's check, the same script as hack/release.sh's.
#[test]
fn version_check_refuses_a_tag_that_is_not_the_version() {
    let version = cargo_version();
    let script = workspace_root().join("hack/version.sh");
    let printed = stdout(&run(Command::new("bash").arg(&script), "version"));
    assert_eq!(
        printed.trim(),
        version,
        "step=version: hack/version.sh prints Cargo.toml's version"
    );
    let out = Command::new("bash")
        .arg(&script)
        .args(["--tag", "v999.0.0"])
        .stdin(Stdio::null())
        .output()
        .expect("step=version-tag: hack/version.sh starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "step=version-tag: a wrong tag was accepted"
    );
    assert!(
        err.contains("v999.0.0") && err.contains(&version),
        "step=version-tag: the error names neither the tag nor the version: {err}"
    );
}

/// hack/version.sh refuses a chart that does not follow Cargo.toml, naming the file and the
/// field: run on a copy of the checkout's version files with the chart's appVersion changed.
#[test]
fn version_check_refuses_a_chart_that_does_not_follow_cargo_toml() {
    let root = workspace_root();
    let tmp = tempfile::tempdir().expect("temporary folder");
    for f in [
        "hack/lib.sh",
        "hack/version.sh",
        "Cargo.toml",
        "charts/nodeipam/Chart.yaml",
    ] {
        let dest = tmp.path().join(f);
        std::fs::create_dir_all(dest.parent().unwrap()).expect("folder");
        std::fs::copy(root.join(f), &dest).unwrap_or_else(|e| panic!("step=copy: {f}: {e}"));
    }
    let chart = tmp.path().join("charts/nodeipam/Chart.yaml");
    let text = std::fs::read_to_string(&chart).expect("Chart.yaml");
    let version = cargo_version();
    let changed = text.replace(
        &format!("appVersion: \"v{version}\""),
        "appVersion: \"v9.9.9\"",
    );
    assert_ne!(
        changed, text,
        "step=edit-chart: Chart.yaml has no appVersion \"v{version}\""
    );
    std::fs::write(&chart, changed).expect("write Chart.yaml");
    let out = Command::new("bash")
        .arg(tmp.path().join("hack/version.sh"))
        .env_remove("NODEIPAM_ROOT")
        .stdin(Stdio::null())
        .output()
        .expect("step=version: hack/version.sh starts");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "step=version: a chart at v9.9.9 was accepted"
    );
    assert!(
        err.contains("Chart.yaml") && err.contains("appVersion") && err.contains("v9.9.9"),
        "step=version: the error does not name the file, the field and the value: {err}"
    );
}
