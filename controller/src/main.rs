//! `nodeipam`: a thin entry point; everything it runs lives in the library.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use nodeipam_controller::app;
use nodeipam_controller::cli::{Cli, Command};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            print!("{}", nodeipam_controller::version::text());
            ExitCode::SUCCESS
        }
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "nodeipam",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
        Command::Crdgen => {
            print!("{}", nodeipam_crd::all_crds_yaml());
            ExitCode::SUCCESS
        }
        Command::Ranges(args) => nodeipam_controller::ranges::run(&args).await,
        Command::Run(args) => {
            if let Err(e) = nodeipam_controller::logging::init(&args.log) {
                eprintln!("nodeipam: {e}");
                return ExitCode::FAILURE;
            }
            match app::run(*args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("nodeipam: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
