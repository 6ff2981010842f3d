//! The documentation against the binaries (README.md and docs/*.md):
//!
//! - every command line the docs show in code (fenced blocks and `inline` spans) that runs
//!   `kubectl nodeipam <sub>` or `nodeipam <sub>` names a subcommand and flags that binary's
//!   `--help` lists; and the cluster-reading subcommands are the plugin's (`nodeipam` itself is
//!   only in the image): a bare `nodeipam ranges` is an error unless the text says "the
//!   image's";
//! - every ```` ```console ```` block is run: each `$ command` line (a `<<'EOF'` here-document
//!   runs to its end marker) runs with `bash` in a folder of its own with the repository's
//!   folders linked in (`config/`, ...), the built `nodeipam` and
//!   `kubectl-nodeipam` on PATH, against a real control plane with the CRDs, and its output
//!   (stdout and stderr together) must be the lines the block quotes after it; a `...` line
//!   stands for any number of lines. Quote only stable output: no error text, ages or
//!   versions;
//! - every `NODEIPAM_*` variable the docs and the chart's values name is one a binary reads
//!   (`[env: ...]` in its `--help`) or a script of `hack/` or the `Containerfile` uses.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nodeipam_testenv::{ControlPlane, workspace_root};
use support::process::{nodeipam_bin, plugin_bin};

/// docs/benchmarks-history.md records what earlier versions did, in their words.
const HISTORY: &str = "benchmarks-history.md";

/// The Markdown files checked, relative to the workspace root.
fn doc_files() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut files = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("step=read-docs: docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .filter(|p| p.file_name().is_some_and(|n| n != HISTORY))
        .map(|p| p.strip_prefix(&root).expect("under the root").to_path_buf())
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn read(rel: &Path) -> String {
    std::fs::read_to_string(workspace_root().join(rel))
        .unwrap_or_else(|e| panic!("step=read-doc: {}: {e}", rel.display()))
}

// ----- the binaries' help -----

/// `bin args --help`.
fn help(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("step=help: {} {args:?}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "step=help: {} {args:?} --help failed: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands a help text lists under `Commands:`.
fn subcommands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(|s| s.trim_end_matches(',').to_string())
        .collect()
}

/// The flags an options help lists (`-o`, `--output`), each with whether it takes a value.
fn flags(help: &str) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    let mut takes_value = false;
    for line in help.lines().map(str::trim_start) {
        // A visible alias, `[aliases: --format]`, takes what its flag takes.
        if let Some(aliases) = line.strip_prefix("[alias") {
            let aliases = aliases.split(']').next().unwrap_or_default();
            for word in aliases.split([' ', ',', ':']) {
                if word.starts_with('-') && word.len() > 1 {
                    out.insert(word.to_string(), takes_value);
                }
            }
        }
        if !line.starts_with('-') {
            continue;
        }
        takes_value = line.contains(" <");
        for word in line.split([' ', ',']).take_while(|w| !w.starts_with('<')) {
            if word.starts_with('-') && word.len() > 1 {
                out.insert(word.to_string(), takes_value);
            }
        }
    }
    out.insert("--help".into(), false);
    out.insert("-h".into(), false);
    out
}

/// One binary's command line: its subcommands, each (and each nested one) with its flags.
struct Cli {
    name: &'static str,
    /// "" for the top level, "migrate clustercidr" for a nested one.
    commands: BTreeMap<String, BTreeMap<String, bool>>,
}

impl Cli {
    fn load(name: &'static str, bin: PathBuf) -> Cli {
        let mut commands = BTreeMap::new();
        let mut todo = vec![String::new()];
        while let Some(path) = todo.pop() {
            let args: Vec<&str> = path.split_whitespace().collect();
            let text = help(&bin, &args);
            for sub in subcommands(&text) {
                if sub != "help" {
                    todo.push(format!("{path} {sub}").trim().to_string());
                }
            }
            commands.insert(path, flags(&text));
        }
        Cli { name, commands }
    }

    /// Checks the words after the binary's name; returns what is wrong.
    fn check(&self, words: &[&str]) -> Result<String, String> {
        let mut path = String::new();
        let mut i = 0;
        while i < words.len() {
            let w = words[i];
            let flags = &self.commands[&path];
            if w.starts_with('-') && w.len() > 1 && w != "--" {
                let name = w.split('=').next().unwrap_or(w);
                let Some(&takes_value) = flags.get(name) else {
                    return Err(format!(
                        "`{} {}` takes no flag {name} (see `{} {path} --help`)",
                        self.name, path, self.name
                    ));
                };
                i += if takes_value && !w.contains('=') {
                    2
                } else {
                    1
                };
                continue;
            }
            let next = format!("{path} {w}").trim().to_string();
            if self.commands.contains_key(&next) {
                path = next;
            } else if path.is_empty() {
                return Err(format!("{} has no subcommand {w:?}", self.name));
            }
            // Otherwise a positional argument (a shell name, a file).
            i += 1;
        }
        Ok(path)
    }
}

// ----- commands in the docs -----

/// A command the docs show: where, the text, and which binary.
struct Mention {
    at: String,
    text: String,
    plugin: bool,
    /// The text before it says it runs inside the image.
    in_image: bool,
}

/// The code of a Markdown file: fenced blocks' lines and inline spans, with line numbers and
/// the prose just before each span.
fn code_pieces(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push((n + 1, line.to_string(), String::new()));
            continue;
        }
        let mut rest = line;
        let mut before = String::new();
        while let Some(start) = rest.find('`') {
            before.push_str(&rest[..start]);
            let after = &rest[start + 1..];
            let Some(end) = after.find('`') else { break };
            out.push((n + 1, after[..end].to_string(), before.clone()));
            rest = &after[end + 1..];
        }
    }
    out
}

/// Where a command can start in a piece of code: its start, or after a shell separator.
const COMMAND_STARTS: &[&str] = &["$ ", "| ", "; ", "&& ", "$(", "<(", "-- "];

/// The `nodeipam` and `kubectl nodeipam` command lines in `code`.
fn mentions_in(at: &str, code: &str, before: &str) -> Vec<Mention> {
    let mut out = Vec::new();
    let code = code.trim();
    for (i, _) in code.match_indices("nodeipam ") {
        let head = &code[..i];
        let plugin = head.ends_with("kubectl ");
        let lead = if plugin {
            &head[..head.len() - "kubectl ".len()]
        } else {
            head
        };
        let at_start = lead.trim().is_empty() || COMMAND_STARTS.iter().any(|s| lead.ends_with(s));
        if !at_start {
            continue;
        }
        let text: Vec<&str> = code[i + "nodeipam ".len()..]
            .split_whitespace()
            .take_while(|w| {
                !matches!(*w, "|" | ";" | "&&" | "||" | ">" | "2>&1" | "\\") && !w.starts_with('#')
            })
            .map(|w| w.trim_end_matches([')', '`']))
            .collect();
        out.push(Mention {
            at: at.to_string(),
            text: text.join(" "),
            plugin,
            in_image: before.trim_end().ends_with("image's"),
        });
    }
    out
}

fn mentions() -> Vec<Mention> {
    let mut out = Vec::new();
    for file in doc_files() {
        for (line, code, before) in code_pieces(&read(&file)) {
            let at = format!("{}:{line}", file.display());
            out.extend(mentions_in(&at, &code, &before));
        }
    }
    out
}

/// A word the docs use for "any": `<sub>`, `...`, `[-o ...]`, `CMD`.
fn is_placeholder(word: &str) -> bool {
    word.is_empty() || !word.chars().all(|c| c.is_ascii_lowercase() || c == '-')
}

/// What is wrong with one mention, if anything.
fn problem(m: &Mention, plugin: &Cli, controller: &Cli) -> Option<String> {
    let words: Vec<&str> = m.text.split_whitespace().collect();
    let first = words.iter().find(|w| !w.starts_with('-')).copied();
    if first.is_some_and(is_placeholder) {
        return None;
    }
    let words: Vec<&str> = words
        .into_iter()
        .take_while(|w| !w.starts_with('[') && !w.starts_with('<') && !w.contains("..."))
        .collect();
    let cli = if m.plugin { plugin } else { controller };
    let sub = match cli.check(&words) {
        Ok(sub) => sub,
        Err(e) => return Some(e),
    };
    let top = sub.split_whitespace().next().unwrap_or_default();
    let for_operators = top != "version" && top != "completion" && top != "help";
    if !m.plugin
        && !m.in_image
        && for_operators
        && plugin.commands.contains_key(top)
        && controller.commands.contains_key(top)
    {
        return Some(format!(
            "`nodeipam {top}` runs only inside the image: show `kubectl nodeipam {top}` (the \
             plugin prints the same), or say it is the image's"
        ));
    }
    None
}

fn clis() -> (Cli, Cli) {
    (
        Cli::load("kubectl nodeipam", plugin_bin()),
        Cli::load("nodeipam", nodeipam_bin()),
    )
}

/// Every `kubectl nodeipam ...` and `nodeipam ...` the docs show exists as written.
#[test]
fn every_command_in_the_docs_is_one_the_binaries_take() {
    let (plugin, controller) = clis();
    let all = mentions();
    // The check finds the commands it is about (a parser that finds none passes vacuously).
    for want in ["ranges", "status", "check", "migrate clustercidr", "run"] {
        assert!(
            all.iter().any(|m| m.text.starts_with(want)),
            "no mention of {want} found: the extraction is broken"
        );
    }
    let problems: Vec<String> = all
        .iter()
        .filter_map(|m| problem(m, &plugin, &controller).map(|p| format!("{}: {p}", m.at)))
        .collect();
    assert!(
        problems.is_empty(),
        "commands in the docs the binaries do not take:\n{}",
        problems.join("\n")
    );
}

/// The checks above on lines of the docs as they were: each must be reported.
#[test]
fn the_command_check_reports_what_the_old_docs_said() {
    let (plugin, controller) = clis();
    for (code, before) in [
        ("nodeipam ranges", ""),
        ("nodeipam ranges --format kube-proxy", ""),
        ("kubectl nodeipam ranges --format kube-proxy", ""),
        ("kubectl nodeipam rangez", ""),
        ("kubectl nodeipam migrate clustercidr --aply", ""),
    ] {
        let found = mentions_in("old", code, before);
        assert_eq!(found.len(), 1, "{code}");
        assert!(
            problem(&found[0], &plugin, &controller).is_some(),
            "{code:?} passes the check"
        );
    }
    for (code, before) in [
        ("kubectl nodeipam ranges -o kube-proxy", ""),
        ("nodeipam ranges", "runs the image's"),
        (
            "nodeipam run --leader-elect-lease-duration=4s --log-format=json",
            "",
        ),
        ("source <(kubectl nodeipam completion bash)", ""),
    ] {
        let found = mentions_in("new", code, before);
        assert_eq!(found.len(), 1, "{code}");
        assert_eq!(problem(&found[0], &plugin, &controller), None, "{code}");
    }
}

// ----- console blocks -----

/// One `$ command` of a console block and the output it quotes.
struct Example {
    at: String,
    command: String,
    output: Vec<String>,
}

/// The examples of ```` ```console ```` blocks.
fn examples(rel: &Path, text: &str) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let mut lines = text.lines().enumerate();
    let mut in_console = false;
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_console = !in_console && trimmed == "```console";
            continue;
        }
        if !in_console {
            continue;
        }
        let Some(command) = line.strip_prefix("$ ") else {
            if let Some(last) = out.last_mut() {
                last.output.push(line.trim_end().to_string());
            }
            continue;
        };
        let mut command = command.to_string();
        if let Some(marker) = heredoc_marker(&command) {
            for (_, body) in lines.by_ref() {
                command.push('\n');
                command.push_str(body);
                if body == marker {
                    break;
                }
            }
        }
        out.push(Example {
            at: format!("{}:{}", rel.display(), n + 1),
            command,
            output: Vec::new(),
        });
    }
    out
}

/// The end marker of a `<<'EOF'` (or `<<EOF`) here-document.
fn heredoc_marker(command: &str) -> Option<String> {
    let (_, rest) = command.split_once("<<")?;
    let word = rest.split_whitespace().next()?;
    Some(word.trim_matches(['\'', '"']).to_string())
}

/// Whether `got` is `want` with each `...` line standing for any number of lines.
fn matches(want: &[String], got: &[&str]) -> bool {
    match want.split_first() {
        None => got.is_empty(),
        Some((w, rest)) if w.trim() == "..." => (0..=got.len()).any(|k| matches(rest, &got[k..])),
        Some((w, rest)) => got
            .split_first()
            .is_some_and(|(g, more)| g.trim_end() == w.as_str() && matches(rest, more)),
    }
}

/// A folder with the binaries a reader would have on PATH: the plugin, the controller and
/// kubectl.
fn path_dir(cp: &ControlPlane) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp folder");
    let kubectl = PathBuf::from(cp.kubectl().get_program());
    for (name, target) in [
        ("kubectl-nodeipam", plugin_bin()),
        ("nodeipam", nodeipam_bin()),
        ("kubectl", kubectl),
    ] {
        std::os::unix::fs::symlink(&target, dir.path().join(name))
            .unwrap_or_else(|e| panic!("step=link-{name}: {e}"));
    }
    dir
}

/// Where the examples run: a folder of its own (an example may write files) with the
/// repository's folders linked in, as in a checkout (`kubectl apply -k config/default`).
fn work_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp folder");
    for name in ["config", "charts", "hack", "docs"] {
        std::os::unix::fs::symlink(workspace_root().join(name), dir.path().join(name))
            .unwrap_or_else(|e| panic!("step=link-{name}: {e}"));
    }
    dir
}

/// Every console example's command gives the output the docs quote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_examples_print_what_the_docs_quote() {
    let all: Vec<Example> = doc_files()
        .iter()
        .flat_map(|f| examples(f, &read(f)))
        .collect();
    assert!(
        !all.is_empty(),
        "no ```console example found in the docs: the extraction is broken"
    );
    let cp = ControlPlane::builder()
        .start()
        .await
        .unwrap_or_else(|e| panic!("step=control-plane: the control plane did not start: {e}"));
    let bins = path_dir(&cp);
    let home = tempfile::tempdir().expect("temp folder");
    let work = work_dir();
    let mut failures = Vec::new();
    for ex in &all {
        let out = Command::new("bash")
            .args(["-c", &format!("exec 2>&1\n{}", ex.command)])
            .current_dir(work.path())
            .env_clear()
            .env("PATH", format!("{}:/usr/bin:/bin", bins.path().display()))
            .env("HOME", home.path())
            .env("KUBECONFIG", cp.kubeconfig_path())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("step=run-example: {}: {e}", ex.at));
        let text = String::from_utf8_lossy(&out.stdout);
        let got: Vec<&str> = text.lines().collect();
        if !out.status.success() || !matches(&ex.output, &got) {
            failures.push(format!(
                "{}: `{}` ({}) printed:\n{text}\nthe docs quote:\n{}",
                ex.at,
                ex.command,
                out.status,
                ex.output.join("\n")
            ));
        }
    }
    cp.stop().await;
    assert!(
        failures.is_empty(),
        "console examples that do not print what the docs quote:\n\n{}",
        failures.join("\n\n")
    );
}

/// The `...` elision and the extraction of examples.
#[test]
fn console_examples_are_parsed_as_written() {
    let text = "```console\n$ a <<'EOF'\nx\nEOF\none\n...\nthree\n$ b\n```\n```sh\n$ c\n```\n";
    let ex = examples(Path::new("t.md"), text);
    assert_eq!(ex.len(), 2);
    assert_eq!(ex[0].command, "a <<'EOF'\nx\nEOF");
    assert_eq!(ex[0].output, ["one", "...", "three"]);
    assert!(matches(&ex[0].output, &["one", "two", "2b", "three"]));
    assert!(matches(&ex[0].output, &["one", "three"]));
    assert!(!matches(&ex[0].output, &["one", "two"]));
    assert!(!matches(&ex[0].output, &["one", "three", "four"]));
    assert_eq!(ex[1].command, "b");
}

// ----- environment variables -----

/// The `NODEIPAM_*` names in `text`, with the line each is on. `NODEIPAM_<FLAG>` and other
/// patterns (a name ending in `_`) are the naming rule, not a variable.
fn variables_in(text: &str) -> Vec<(usize, String)> {
    const PREFIX: &str = "NODEIPAM_";
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find(PREFIX) {
            let after = &rest[at + PREFIX.len()..];
            let len = after
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(after.len());
            let name = &after[..len];
            if !name.is_empty() && !name.ends_with('_') {
                out.push((n + 1, format!("{PREFIX}{name}")));
            }
            rest = &after[len..];
        }
    }
    out
}

/// The variables a help text lists (`[env: NODEIPAM_V=]`).
fn env_vars(help: &str) -> BTreeSet<String> {
    help.split("[env: ")
        .skip(1)
        .filter_map(|s| s.split(['=', ']']).next())
        .map(str::to_string)
        .collect()
}

/// Every variable the binaries read (every subcommand's help) and the scripts use.
fn known_variables() -> BTreeSet<String> {
    let mut known = BTreeSet::new();
    for (bin, commands) in [
        (nodeipam_bin(), vec![vec!["run"], vec!["ranges"]]),
        (
            plugin_bin(),
            vec![vec![], vec!["ranges"], vec!["status"], vec!["check"]],
        ),
    ] {
        for args in commands {
            known.extend(env_vars(&help(&bin, &args)));
        }
    }
    let root = workspace_root();
    let mut scripts: Vec<PathBuf> = std::fs::read_dir(root.join("hack"))
        .expect("step=read-hack: hack/")
        .map(|e| e.expect("hack/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    scripts.push(root.join("Containerfile"));
    for script in scripts {
        let text = std::fs::read_to_string(&script)
            .unwrap_or_else(|e| panic!("step=read-script: {}: {e}", script.display()));
        known.extend(variables_in(&text).into_iter().map(|(_, v)| v));
    }
    known
}

/// Every `NODEIPAM_*` variable named in the docs and the chart's values is read by something.
#[test]
fn every_variable_in_the_docs_is_one_the_binaries_or_scripts_read() {
    let known = known_variables();
    // The extraction finds what it is about (a parser that finds none passes vacuously).
    for want in ["NODEIPAM_V", "NODEIPAM_LOG_LEVEL", "NODEIPAM_SERVICE_CIDRS"] {
        assert!(known.contains(want), "{want} not in any --help: {known:?}");
    }
    let mut files = doc_files();
    files.push(PathBuf::from("charts/nodeipam/values.yaml"));
    let mut named = 0;
    let mut problems = Vec::new();
    for rel in files {
        for (line, var) in variables_in(&read(&rel)) {
            named += 1;
            if !known.contains(&var) {
                problems.push(format!("{}:{line}: {var}", rel.display()));
            }
        }
    }
    assert!(
        named > 0,
        "no NODEIPAM_ variable found in the docs: the extraction is broken"
    );
    assert!(
        problems.is_empty(),
        "variables in the docs that no binary (`[env: ...]` in --help) or script reads:\n{}",
        problems.join("\n")
    );
}

/// The extraction on lines the docs could hold: a singular list variable is caught, the naming
/// rule is not a variable.
#[test]
fn variables_are_extracted_as_written() {
    let text = "`NODEIPAM_<FLAG>` and `NODEIPAM_SERVICE_CIDR=10.96.0.0/12`\nNODEIPAM_V, NODEIPAM_";
    let found: Vec<String> = variables_in(text).into_iter().map(|(_, v)| v).collect();
    assert_eq!(found, ["NODEIPAM_SERVICE_CIDR", "NODEIPAM_V"]);
    let help = "  -v, --v <N>\n          [env: NODEIPAM_V=]\n  [env: POD_NAME=]";
    assert_eq!(
        env_vars(help),
        BTreeSet::from(["NODEIPAM_V".to_string(), "POD_NAME".to_string()])
    );
}
