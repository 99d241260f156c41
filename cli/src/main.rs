//! `infera`: see `infera --help`.

use clap::Parser;
use infera::cli::{Cli, Command};
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up(args) => return run_async(args),
        Command::Bench(args) => return run_bench(*args),
        Command::Convert(args) => {
            return match infera::convert::run(&args) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("infera convert: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Docs { check } => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("infera docs: {e}");
                    return ExitCode::from(2);
                }
            };
            runtime.block_on(infera::docs::run(&PathBuf::from("."), check))
        }
        Command::Crds { dirs, check } => {
            let dirs = if dirs.is_empty() {
                infera::crds::default_dirs(&PathBuf::from("."))
            } else {
                dirs
            };
            infera::crds::run(&dirs, check)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("infera: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_async(args: infera::up::UpArgs) -> ExitCode {
    let _telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera",
        default_filter: "warn,infera=info,infera_gateway::access=debug,infera_gateway::pick=debug"
            .into(),
        terse: true,
        ..Default::default()
    });
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("infera: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(infera::up::run(args)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("infera: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run_bench(args: infera::bench::BenchArgs) -> ExitCode {
    let telemetry = infera_telemetry::init(infera_telemetry::LogOptions {
        service: "infera",
        default_filter: "error".into(),
        ..Default::default()
    });
    if let Err(e) = &telemetry {
        eprintln!("infera: {e}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("infera-drv")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("infera: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(infera::bench::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("infera bench: {e:#}");
            ExitCode::from(2)
        }
    }
}
