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
    let (cert_s, key_s) = (cert.to_string_lossy(), key.to_string_lossy());
    let subject = format!("/CN={name}");
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ]
        .into_iter()
        .chain(["-nodes", "-days", "1", "-subj", &subject])
        .chain(["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
        .chain(["-addext", "basicConstraints=critical,CA:FALSE"])
        .chain(["-keyout", &key_s, "-out", &cert_s])
        .collect::<Vec<_>>(),
        "req -x509",
    )?;
    Ok((cert, key))
}

/// A test certificate authority and the leaves it signs (server and client use).
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate (PEM) clients and servers trust.
    pub ca: PathBuf,
    ca_key: PathBuf,
    dir: PathBuf,
}

fn openssl(args: &[&str], what: &str) -> Result<(), String> {
    let status = Command::new("openssl")
        .args(args)
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("running openssl (the TLS tests make certificates with it): {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("openssl {what} failed: {status}"))
    }
}

impl Pki {
    /// A new CA (`ca.crt`, `ca.key`) in `dir`.
    pub fn new(dir: &Path) -> Result<Self, String> {
        let (ca, ca_key) = (dir.join("ca.crt"), dir.join("ca.key"));
        let (ca_s, key_s) = (ca.to_string_lossy(), ca_key.to_string_lossy());
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
            ]
            .into_iter()
            .chain(["-nodes", "-days", "1", "-subj", "/CN=infera-test-ca"])
            .chain(["-addext", "basicConstraints=critical,CA:TRUE"])
            .chain(["-keyout", &key_s, "-out", &ca_s])
            .collect::<Vec<_>>(),
            "req (CA)",
        )?;
        Ok(Self {
            ca,
            ca_key,
            dir: dir.to_path_buf(),
        })
    }

    /// A certificate for `name` (its CN, which etcd takes as the user of a client
    /// certificate) valid for 127.0.0.1 and localhost, for servers and clients alike.
    pub fn issue(&self, name: &str) -> Result<(PathBuf, PathBuf), String> {
        let (cert, key, csr, ext) = (
            self.dir.join(format!("{name}.crt")),
            self.dir.join(format!("{name}.key")),
            self.dir.join(format!("{name}.csr")),
            self.dir.join(format!("{name}.ext")),
        );
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .map_err(|e| e.to_string())?;
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let subject = format!("/CN={name}");
        openssl(
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
            ]
            .into_iter()
            .chain(["-subj", &subject, "-keyout", &s(&key), "-out", &s(&csr)])
            .collect::<Vec<_>>(),
            "req (leaf)",
        )?;
        openssl(
            &[
                "x509",
                "-req",
                "-days",
                "1",
                "-in",
                &s(&csr),
                "-CA",
                &s(&self.ca),
            ]
            .into_iter()
            .chain([
                "-CAkey",
                &s(&self.ca_key),
                "-CAcreateserial",
                "-out",
                &s(&cert),
            ])
            .chain(["-extfile", &s(&ext)])
            .collect::<Vec<_>>(),
            "x509 (sign)",
        )?;
        Ok((cert, key))
    }
}
