//! The `infera-sim` command.

fn main() {}
