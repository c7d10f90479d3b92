//! The `clusterset-dns` binary: parses the command line and runs a command.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use clusterset_dns::cli::{Cli, Command};
use clusterset_dns::config::ServeConfig;
use tracing_subscriber::EnvFilter;

/// BSD sysexits: a bad command line or configuration.
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match cli.command {
        Command::Serve(args) => {
            let cfg = match ServeConfig::from_args(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: invalid configuration: {e}");
                    return ExitCode::from(EX_USAGE);
                }
            };
            let runtime =
                match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("error: cannot start the async runtime: {e}");
                        return ExitCode::FAILURE;
                    }
                };
            match runtime.block_on(clusterset_dns::serve::run(cfg)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check(args) => {
            let (report, ok) = clusterset_dns::check::run(&args);
            // The report is the command's output.
            let _ = std::io::stdout().write_all(report.as_bytes());
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
    }
}
