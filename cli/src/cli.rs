//! The `infera` command line itself: its subcommands, each implemented in the module
//! named after it.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Infera: inference orchestration for Kubernetes on AMD GPUs.
#[derive(Debug, Parser)]
#[command(name = "infera", version, about, long_about = None)]
pub struct Cli {
    // The subcommand (its own doc comments are the help).
    #[allow(missing_docs)]
    #[command(subcommand)]
    pub command: Command,
}

// The subcommands; each variant's doc comment is its help.
#[allow(missing_docs)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a deployment on this machine: simulated engines and the gateway in one
    /// process, the OpenAI API on localhost. Without a manifest, two simulated vLLM
    /// workers behind a kv-aware gateway on port 8000.
    Up(crate::up::UpArgs),
    /// Run a benchmark scenario of BENCHMARKS.md against a simulated fleet: a table
    /// with progress while it runs, JSON and an SVG plot in --out.
    Bench(Box<crate::bench::BenchArgs>),
    /// Convert manifests of the earlier Go operator's InferaDeployment (backendFramework,
    /// services, ...) into this project's InferaDeployment and PDTopology. Other
    /// documents pass through; what has no equivalent is reported on stderr.
    Convert(crate::convert::ConvertArgs),
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
    /// Write the docs book's generated reference pages (CRD fields, every binary's flags
    /// and environment variables, metric names, wire contracts) to docs/src/reference/.
    Docs {
        /// Only check that the pages are current; exit 1 when one is not.
        #[arg(long)]
        check: bool,
    },
}
