//! `nodeipam-fuzz [--iterations N] [--seed S] [target...]`: fuzzes each target (all by
//! default), prints one line per target, writes each finding to
//! `fuzz/findings/<target>-<n>.bin` and exits 1 if there is any.

use std::process::ExitCode;

use nodeipam_fuzz::{TARGETS, Target, fuzz, target};

const USAGE: &str = "usage: nodeipam-fuzz [--iterations N] [--seed S] [target...]";

fn main() -> ExitCode {
    let mut iterations: u64 = 20_000;
    let mut seed: u64 = 1;
    let mut chosen: Vec<&'static Target> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let number = |v: Option<String>, flag: &str| -> Result<u64, String> {
            v.as_deref()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{flag} takes a number"))
        };
        let parsed = match arg.as_str() {
            "--iterations" => number(args.next(), "--iterations").map(|n| iterations = n),
            "--seed" => number(args.next(), "--seed").map(|n| seed = n),
            "-h" | "--help" => {
                println!("{USAGE}\ntargets:");
                for t in TARGETS {
                    println!("  {}", t.name);
                }
                return ExitCode::SUCCESS;
            }
            name => target(name)
                .map(|t| chosen.push(t))
                .ok_or_else(|| format!("no target {name:?} (--help lists them)")),
        };
        if let Err(e) = parsed {
            eprintln!("error: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    if chosen.is_empty() {
        chosen = TARGETS.iter().collect();
    }
    let findings_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("findings");
    let mut any = false;
    for t in chosen {
        let report = fuzz(t, iterations, seed);
        println!(
            "{}: {} inputs, {} findings",
            t.name,
            report.tried,
            report.findings.len()
        );
        for (n, f) in report.findings.iter().enumerate() {
            any = true;
            let path = findings_dir.join(format!("{}-{}.bin", t.name, n + 1));
            let written = std::fs::create_dir_all(&findings_dir)
                .and_then(|()| std::fs::write(&path, &f.input));
            match written {
                Ok(()) => println!("  {}: {}", path.display(), f.message),
                Err(e) => eprintln!("  cannot write {}: {e} ({})", path.display(), f.message),
            }
        }
    }
    if any {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
