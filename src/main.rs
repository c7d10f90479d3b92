//! The `clusterset-dns` binary: parses the command line and runs a command.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use clusterset_dns::cli::{Cli, Command, LogFormat};
use clusterset_dns::config::{AgentConfig, DoctorConfig, RunConfig, ServeConfig, SetupDnsConfig, SyncConfig};
use clusterset_dns::ops::traces::Traces;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// See Cargo.toml and docs/benchmarks-history.md ("jemalloc, headless SRV per
/// query, and model trims") for why this allocator.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options: see `ALLOCATOR_OPTIONS`.
// SAFETY: jemalloc reads this symbol as a `const char *` to a NUL-terminated
// string; a reference to a byte array is that pointer, and it is immutable.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; clusterset_dns::ops::memory::ALLOCATOR_OPTIONS.len()] =
    clusterset_dns::ops::memory::ALLOCATOR_OPTIONS;

/// BSD sysexits: a bad command line or configuration.
const EX_USAGE: u8 = 64;

fn main() -> ExitCode {
    // clap would exit 2 on a bad command line; every command's bad input
    // exits 64 instead (docs/exit-codes.md), so 2 keeps the meaning each
    // command gives it (doctor: incomplete; setup-dns: nothing changed).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(EX_USAGE) } else { ExitCode::SUCCESS };
        }
    };
    let format = cli.log_format;
    // The controller's spans go to a collector when asked (sync, run, agent).
    let otlp = match &cli.command {
        Command::Sync(args) => args.options.otlp_endpoint.as_ref(),
        Command::Run(args) => args.sync.otlp_endpoint.as_ref(),
        Command::Agent(args) => args.options.otlp_endpoint.as_ref(),
        _ => None,
    };
    let traces = match otlp.map(Traces::new).transpose() {
        Ok(traces) => traces,
        Err(e) => {
            init_logs(format, None);
            failed(format, None, &e);
            return ExitCode::FAILURE;
        }
    };
    init_logs(format, traces.as_ref());
    // Panics are caught and counted where they happen; the hook only logs
    // them, rate limited (a repeated query of death must not flood logs).
    clusterset_dns::supervise::install_panic_hook();
    run(cli.command, format)
}

/// Runs `command`; its exit code ([`EX_USAGE`] for a configuration its
/// checks refuse).
fn run(command: Command, format: LogFormat) -> ExitCode {
    match command {
        Command::Serve(args) => match ServeConfig::from_args(&args) {
            Ok(cfg) => block_on(format, clusterset_dns::cmd::serve::run(cfg)),
            Err(e) => usage(format, &e),
        },
        Command::Sync(args) => match SyncConfig::from_args(&args) {
            Ok(cfg) => block_on(format, clusterset_dns::cmd::sync::run(cfg)),
            Err(e) => usage(format, &e),
        },
        Command::Agent(args) => match AgentConfig::from_args(&args) {
            Ok(cfg) => block_on(format, clusterset_dns::cmd::agent::run(cfg)),
            Err(e) => usage(format, &e),
        },
        Command::Hub(args) => match block_on_value(clusterset_dns::cmd::hub::run(&args)) {
            Ok(report) => {
                let _ = std::io::stdout().write_all(report.as_bytes());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("clusterset-dns hub: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Run(args) => match RunConfig::from_args(&args) {
            Ok(cfg) => block_on(format, clusterset_dns::cmd::run::run(cfg)),
            Err(e) => usage(format, &e),
        },
        Command::Explain(args) => match clusterset_dns::cmd::explain::run(&args) {
            Ok(report) => {
                // The report is the command's output.
                let _ = std::io::stdout().write_all(report.as_bytes());
                ExitCode::SUCCESS
            }
            Err(e) => {
                failed(format, None, &e);
                ExitCode::FAILURE
            }
        },
        Command::Doctor(args) => match DoctorConfig::from_args(&args) {
            Ok(cfg) => doctor(format, cfg),
            Err(e) => usage(format, &e),
        },
        Command::SetupDns(args) => match SetupDnsConfig::from_args(&args) {
            Ok(cfg) => setup_dns(format, cfg),
            Err(e) => usage(format, &e),
        },
        Command::Check(args) => {
            let (report, ok) = clusterset_dns::cmd::check::run(&args);
            // The report is the command's output.
            let _ = std::io::stdout().write_all(report.as_bytes());
            if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), as `format`
/// says; with `traces`, our spans at info and above to its collector too
/// (whatever `RUST_LOG` says of the log).
fn init_logs(format: LogFormat, traces: Option<&Traces>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).with_filter(filter).boxed(),
        // A pipeline parses the lines: no colour codes, whatever stderr is.
        LogFormat::Json => logs.json().with_ansi(false).with_filter(filter).boxed(),
    };
    let ours = tracing_subscriber::filter::Targets::new().with_target("clusterset_dns", tracing::Level::INFO);
    let spans = traces.map(|t| t.layer().with_filter(ours));
    tracing_subscriber::registry().with(logs).with(spans).init();
}

/// Says why the command failed, on stderr: `error: [CONTEXT: ]ERROR` for
/// people, or (`--log-format json`) one log event with the error as its
/// `error` field, so that every line a log pipeline reads is JSON.
fn failed(format: LogFormat, context: Option<&str>, e: &dyn std::fmt::Display) {
    match (format, context) {
        (LogFormat::Text, Some(context)) => eprintln!("error: {context}: {e}"),
        (LogFormat::Text, None) => eprintln!("error: {e}"),
        (LogFormat::Json, context) => {
            tracing::error!(error = %e, "{}", context.unwrap_or("the command failed"))
        }
    }
}

fn usage(format: LogFormat, e: &dyn std::fmt::Display) -> ExitCode {
    failed(format, Some("invalid configuration"), e);
    ExitCode::from(EX_USAGE)
}

/// `doctor`: the report on stdout; exit 0 healthy, 1 problems, 2 when a
/// member could not be read (the report says which) or not even connected.
fn doctor(format: LogFormat, cfg: DoctorConfig) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            failed(format, Some("cannot start the async runtime"), &e);
            return ExitCode::from(clusterset_dns::diagnose::report::INCOMPLETE);
        }
    };
    match runtime.block_on(clusterset_dns::cmd::doctor::run(cfg)) {
        Ok((report, status)) => {
            // The report is the command's output.
            let _ = std::io::stdout().write_all(report.as_bytes());
            ExitCode::from(status)
        }
        Err(e) => {
            failed(format, None, &e);
            ExitCode::from(clusterset_dns::diagnose::report::INCOMPLETE)
        }
    }
}

/// `setup-dns`: the report on stdout, the exit status it chose.
fn setup_dns(format: LogFormat, cfg: SetupDnsConfig) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            failed(format, Some("cannot start the async runtime"), &e);
            return ExitCode::from(clusterset_dns::cmd::setup_dns::UNCHANGED);
        }
    };
    let (report, status) = runtime.block_on(clusterset_dns::cmd::setup_dns::run(cfg));
    // The report is the command's output.
    let _ = std::io::stdout().write_all(report.as_bytes());
    ExitCode::from(status)
}

/// Runs a command on a two-thread runtime (the answering threads are our
/// own; the runtime only drives sources, TCP and HTTP).
fn block_on<E: std::fmt::Display>(
    format: LogFormat,
    command: impl std::future::Future<Output = Result<(), E>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            failed(format, Some("cannot start the async runtime"), &e);
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `#`: an anyhow error with its causes, `outer: inner`.
            failed(format, None, &format_args!("{e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Runs a one-shot command's future to its value on a current-thread runtime.
fn block_on_value<T>(command: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(command)
}
