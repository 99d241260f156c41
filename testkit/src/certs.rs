//! Certificates for TLS tests, made by the `openssl` command (CI installs it).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A self-signed leaf certificate and its P-256 key for `localhost` and 127.0.0.1,
/// written as `<name>.crt` and `<name>.key` in `dir`; clients trust the certificate
/// itself.
pub fn self_signed(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), String> {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", &format!("/CN={name}")])
        .args(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("running openssl (the TLS tests make certificates with it): {e}"))?;
    if !status.success() {
        return Err(format!("openssl req -x509 failed: {status}"));
    }
    Ok((cert, key))
}
