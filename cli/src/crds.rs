//! `infera crds`: writes the CustomResourceDefinitions generated from the operator's Rust
//! types into `crds/` and the Helm chart's `crds/`, or checks that they are current.

use anyhow::{Context, Result, bail};
use infera_operator::api::crd::{crds, render_yaml};
use std::path::{Path, PathBuf};

/// The files `infera crds` manages: (path, content).
pub fn rendered(dirs: &[PathBuf]) -> Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for (file, crd) in crds() {
        let yaml = render_yaml(&crd).with_context(|| format!("rendering {file}"))?;
        for dir in dirs {
            out.push((dir.join(file), yaml.clone()));
        }
    }
    Ok(out)
}

/// Files among `rendered` whose content on disk differs (or that are missing).
pub fn stale(rendered: &[(PathBuf, String)]) -> Vec<PathBuf> {
    rendered
        .iter()
        .filter(|(path, want)| std::fs::read_to_string(path).ok().as_deref() != Some(want.as_str()))
        .map(|(path, _)| path.clone())
        .collect()
}

/// Writes (or with `check`, verifies) the CRDs under `dirs`.
pub fn run(dirs: &[PathBuf], check: bool) -> Result<()> {
    let files = rendered(dirs)?;
    let stale = stale(&files);
    if check {
        if stale.is_empty() {
            println!("CRDs are current ({} files)", files.len());
            return Ok(());
        }
        bail!(
            "out of date: {} (run `infera crds` from the repository root)",
            stale
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for (path, yaml) in &files {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        if stale.contains(path) {
            std::fs::write(path, yaml).with_context(|| format!("writing {}", path.display()))?;
            println!("wrote {}", path.display());
        } else {
            println!("unchanged {}", path.display());
        }
    }
    Ok(())
}

/// The default output directories, relative to `root`.
pub fn default_dirs(root: &Path) -> Vec<PathBuf> {
    vec![root.join("crds"), root.join("charts/infera/crds")]
}
