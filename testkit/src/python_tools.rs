//! Third-party tools that ship as Python wheels (e.g. the SGLang router, a Rust binary
//! in a wheel), installed once at a pinned version into a virtualenv in the test cache.

use crate::{TestEnvError, cache_root};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// The `python` of a virtualenv holding `requirement` (e.g. `sglang-router==0.3.2`),
/// created with `python3 -m venv` and `pip install` on first use.
pub fn python_with(requirement: &str) -> Result<PathBuf, TestEnvError> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let err = |message: String| TestEnvError::Prepare {
        name: "python tool",
        message,
    };
    let dir = cache_root().join(format!(
        "venv-{}",
        requirement.replace(['=', '<', '>', ' '], "_")
    ));
    let python = dir.join("bin/python");
    let marker = dir.join(".installed");
    if marker.exists() {
        return Ok(python);
    }
    let _guard = INSTALL.lock();
    if marker.exists() {
        return Ok(python);
    }
    let run = |cmd: &mut Command, what: &str| -> Result<(), TestEnvError> {
        let out = cmd.output().map_err(|e| err(format!("{what}: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(err(format!(
                "{what} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    };
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&dir),
        "python3 -m venv",
    )?;
    run(
        Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            requirement,
        ]),
        &format!("pip install {requirement}"),
    )?;
    std::fs::write(&marker, requirement).map_err(|e| err(e.to_string()))?;
    Ok(python)
}
