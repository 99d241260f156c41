//! `infera`: see `infera --help`.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Infera: inference orchestration for Kubernetes on AMD GPUs.
#[derive(Debug, Parser)]
#[command(name = "infera", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write the InferaDeployment and PDTopology CRDs (generated from the operator's
    /// Rust types) to crds/ and charts/infera/crds/.
    Crds {
        /// Write into these directories instead (repeatable).
        #[arg(long = "dir")]
        dirs: Vec<PathBuf>,
        /// Only check that the files are current; exit 1 when one is not.
        #[arg(long)]
        check: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
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
