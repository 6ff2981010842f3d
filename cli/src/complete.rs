//! Completion of `kubectl nodeipam <TAB>`: kubectl runs `kubectl_complete-nodeipam` (this
//! binary under that name, a link) with the words after `nodeipam`, the last one being
//! completed, and reads back one candidate a line (`name<TAB>description`) and `:<directive>`,
//! cobra's protocol. The candidates come from the clap definition, so they cannot drift from
//! the flags.

use clap::{Arg, Command};

/// What the shell does besides the candidates (cobra's `ShellCompDirective`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Directive {
    /// Complete file names too (a kubeconfig path).
    Files = 0,
    /// Only the candidates.
    NoFiles = 4,
}

/// The name under which kubectl runs the completer.
pub const COMPLETER: &str = "kubectl_complete-nodeipam";

/// The candidates for the last of `words` (the words after `nodeipam`).
pub fn complete(root: &Command, words: &[String]) -> (Vec<String>, Directive) {
    let mut root = root.clone();
    // Global flags reach the subcommands only once the command is built.
    root.build();
    let (partial, done) = match words.split_last() {
        Some((last, rest)) => (last.as_str(), rest),
        None => ("", &[][..]),
    };
    let mut current = &root;
    let mut value_of: Option<&Arg> = None;
    for w in done {
        if value_of.take().is_some() {
            continue;
        }
        if let Some(flag) = w.strip_prefix('-') {
            value_of = flag_wanting_value(current, flag);
        } else if let Some(sub) = current.find_subcommand(w) {
            current = sub;
        }
    }
    if let Some(arg) = value_of {
        return values(arg, "", partial);
    }
    if let Some((flag, value)) = partial.strip_prefix("--").and_then(|p| p.split_once('=')) {
        return match long(current, flag) {
            Some(arg) => values(arg, &format!("--{flag}="), value),
            None => (Vec::new(), Directive::NoFiles),
        };
    }
    if partial.starts_with('-') {
        let flags = current
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| Some((format!("--{}", a.get_long()?), a)))
            .filter(|(name, _)| name.starts_with(partial))
            .map(|(name, a)| described(&name, a.get_help()))
            .collect();
        return (flags, Directive::NoFiles);
    }
    let subcommands = current
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name().starts_with(partial))
        .map(|s| described(s.get_name(), s.get_about()));
    let positional = current
        .get_positionals()
        .flat_map(|a| a.get_possible_values())
        .filter(|v| !v.is_hide_set() && v.get_name().starts_with(partial))
        .map(|v| v.get_name().to_string());
    (subcommands.chain(positional).collect(), Directive::NoFiles)
}

/// The flag `flag` (without its first `-`) when the next word is its value.
fn flag_wanting_value<'a>(cmd: &'a Command, flag: &str) -> Option<&'a Arg> {
    let arg = match flag.strip_prefix('-') {
        Some(name) if !name.contains('=') => long(cmd, name)?,
        Some(_) => return None,
        // `-o` alone; `-ojson` carries its value.
        None => {
            let mut chars = flag.chars();
            let (Some(short), None) = (chars.next(), chars.next()) else {
                return None;
            };
            cmd.get_arguments().find(|a| a.get_short() == Some(short))?
        }
    };
    arg.get_action().takes_values().then_some(arg)
}

fn long<'a>(cmd: &'a Command, name: &str) -> Option<&'a Arg> {
    cmd.get_arguments().find(|a| {
        a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|v| v.contains(&name))
    })
}

/// A flag's values that start with `partial`, each after `prefix`; none known: file names.
fn values(arg: &Arg, prefix: &str, partial: &str) -> (Vec<String>, Directive) {
    let known = arg.get_possible_values();
    if known.is_empty() {
        return (Vec::new(), Directive::Files);
    }
    let list = known
        .iter()
        .filter(|v| !v.is_hide_set() && v.get_name().starts_with(partial))
        .map(|v| described(&format!("{prefix}{}", v.get_name()), v.get_help()))
        .collect();
    (list, Directive::NoFiles)
}

/// `name<TAB>the first line of its help`, as cobra shows descriptions.
fn described(name: &str, help: Option<&clap::builder::StyledStr>) -> String {
    let first = help
        .map(|h| h.to_string())
        .and_then(|h| h.lines().next().map(str::to_string))
        .unwrap_or_default();
    if first.is_empty() {
        name.to_string()
    } else {
        format!("{name}\t{first}")
    }
}

/// The answer as kubectl reads it.
pub fn render(candidates: &[String], directive: Directive) -> String {
    let mut out: String = candidates.iter().map(|c| format!("{c}\n")).collect();
    out.push_str(&format!(":{}\n", directive as u8));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn names(words: &[&str]) -> (Vec<String>, Directive) {
        let words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        let (list, d) = complete(&crate::args::Cli::command(), &words);
        let list = list
            .into_iter()
            .map(|c| c.split('\t').next().unwrap_or_default().to_string())
            .collect();
        (list, d)
    }

    #[test]
    fn subcommands_flags_and_their_values() {
        assert_eq!(
            names(&[""]).0,
            [
                "ranges",
                "status",
                "check",
                "migrate",
                "completion",
                "version",
                "help"
            ]
        );
        assert_eq!(names(&["ch"]), (vec!["check".into()], Directive::NoFiles));
        assert_eq!(
            names(&["check", "-o", ""]).0,
            ["table", "wide", "json", "yaml"]
        );
        assert_eq!(names(&["status", "--output", "j"]).0, ["json"]);
        assert_eq!(names(&["status", "--output=y"]).0, ["--output=yaml"]);
        assert!(
            names(&["ranges", "-o", ""])
                .0
                .contains(&"ip-masq-agent".into())
        );
        assert_eq!(names(&["completion", "f"]).0, ["fish"]);
        // Global flags after the subcommand, and their values skipped.
        let flags = names(&["--context", "prod", "check", "--k"]).0;
        assert_eq!(flags, ["--kubeconfig"]);
        assert_eq!(
            names(&["check", "--kubeconfig", ""]),
            (Vec::new(), Directive::Files),
            "a path: the shell completes files"
        );
        assert_eq!(names(&["check", "-ojson", ""]).0, Vec::<String>::new());
    }

    #[test]
    fn the_answer_ends_with_the_directive() {
        assert_eq!(
            render(&["check\tCheck".into()], Directive::NoFiles),
            "check\tCheck\n:4\n"
        );
        let (list, d) = complete(&crate::args::Cli::command(), &["st".into()]);
        assert!(list[0].starts_with("status\tPrint the leader"), "{list:?}");
        assert_eq!(render(&[], d), ":4\n");
    }
}
