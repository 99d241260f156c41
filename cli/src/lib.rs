//! The `infera` command line. Subcommands live in modules named after them.

pub mod bench;
pub mod cli;
pub mod convert;
pub mod crds;
pub mod docs;
pub mod up;
