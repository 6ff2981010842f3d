//! `kubectl-nodeipam`: a thin entry point; everything it runs lives in the library.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use nodeipam_cli::args::Cli;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    nodeipam_cli::report::run(Cli::parse()).await
}
