//! Third-party tools that ship as Python wheels (e.g. the SGLang router, a Rust binary
//! in a wheel), installed once at a pinned version into a virtualenv in the test cache.

use crate::{TestEnvError, cache_root};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

fn prepare_error(message: String) -> TestEnvError {
    TestEnvError::Prepare {
        name: "python tool",
        message,
    }
}

fn run(cmd: &mut Command, what: &str) -> Result<(), TestEnvError> {
    let out = cmd
        .output()
        .map_err(|e| prepare_error(format!("{what}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(prepare_error(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

/// The `python` of the virtualenv `dir`, made with `python3 -m venv` and `pip install
/// <pip_args>` unless a previous run finished it (it leaves `marker_text` in
/// `.installed`).
fn venv(
    dir: &Path,
    pip_args: &[&std::ffi::OsStr],
    marker_text: &[u8],
) -> Result<PathBuf, TestEnvError> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let python = dir.join("bin/python");
    let marker = dir.join(".installed");
    if marker.exists() {
        return Ok(python);
    }
    let _guard = INSTALL.lock();
    if marker.exists() {
        return Ok(python);
    }
    let started = std::time::Instant::now();
    eprintln!(
        "infera-testkit: installing {} (first time only)",
        dir.display()
    );
    // A half-made environment from an interrupted run is made again.
    let _ = std::fs::remove_dir_all(dir);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(dir),
        "python3 -m venv",
    )?;
    let what = format!("pip install {pip_args:?}");
    run(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(pip_args),
        &what,
    )?;
    std::fs::write(&marker, marker_text).map_err(|e| prepare_error(e.to_string()))?;
    eprintln!(
        "infera-testkit: {} ready in {:.0} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(python)
}

/// The `python` of a virtualenv holding `requirement` (e.g. `sglang-router==0.3.2`),
/// created with `python3 -m venv` and `pip install` on first use.
pub fn python_with(requirement: &str) -> Result<PathBuf, TestEnvError> {
    let dir = cache_root().join(format!(
        "venv-{}",
        requirement.replace(['=', '<', '>', ' '], "_")
    ));
    venv(&dir, &[requirement.as_ref()], requirement.as_bytes())
}

/// The `python` of a virtualenv holding exactly the pinned packages of `requirements`
/// (a pip requirements file), installed with `--no-deps` on first use into a folder keyed
/// by the file's digest, so an edited file gets a fresh environment. For packages whose
/// full dependency trees are too heavy to install (an engine's CUDA wheels) but whose
/// parts under test need only the listed ones.
pub fn python_with_requirements(requirements: &Path) -> Result<PathBuf, TestEnvError> {
    use sha2::Digest;
    let text = std::fs::read(requirements)
        .map_err(|e| prepare_error(format!("{}: {e}", requirements.display())))?;
    let stem = requirements
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("requirements");
    let digest = hex::encode(&sha2::Sha256::digest(&text)[..8]);
    let dir = cache_root().join(format!("venv-{stem}-{digest}"));
    venv(
        &dir,
        &[
            "--no-deps".as_ref(),
            "-r".as_ref(),
            requirements.as_os_str(),
        ],
        &text,
    )
}
