//! `kubectl-nodeipam`: a thin entry point; everything it runs lives in the library. Run under
//! the name `kubectl_complete-nodeipam` (a link to it), it answers kubectl's completion.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use nodeipam_cli::args::Cli;
use nodeipam_cli::complete::{COMPLETER, complete, render};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut argv = std::env::args();
    let called = argv.next().unwrap_or_default();
    if Path::new(&called).file_name().and_then(|n| n.to_str()) == Some(COMPLETER) {
        let words: Vec<String> = argv.collect();
        let (candidates, directive) = complete(&Cli::command(), &words);
        print!("{}", render(&candidates, directive));
        return ExitCode::SUCCESS;
    }
    nodeipam_cli::report::run(Cli::parse()).await
}
