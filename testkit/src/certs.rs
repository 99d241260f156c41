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
    let extensions = [
        "subjectAltName=DNS:localhost,IP:127.0.0.1",
        "basicConstraints=critical,CA:FALSE",
    ];
    self_signed_x509(&format!("/CN={name}"), &extensions, &key, &cert)?;
    Ok((cert, key))
}

/// `openssl req -x509`: a new P-256 key at `key` and a certificate for it signed by
/// itself at `cert`, valid one day, with `extensions` (`-addext` each).
fn self_signed_x509(
    subject: &str,
    extensions: &[&str],
    key: &Path,
    cert: &Path,
) -> Result<(), String> {
    let (key, cert) = (key.to_string_lossy(), cert.to_string_lossy());
    let mut args = vec!["req", "-x509", "-newkey", "ec", "-pkeyopt"];
    args.extend(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]);
    args.extend(["-subj", subject, "-keyout", &key, "-out", &cert]);
    for extension in extensions {
        args.extend(["-addext", extension]);
    }
    openssl(&args, "req -x509")
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
        let extensions = ["basicConstraints=critical,CA:TRUE"];
        self_signed_x509("/CN=infera-test-ca", &extensions, &ca_key, &ca)?;
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
        let [cert_s, key_s, csr_s, ext_s, ca_s, ca_key_s] =
            [&cert, &key, &csr, &ext, &self.ca, &self.ca_key].map(|p| p.to_string_lossy());
        let subject = format!("/CN={name}");
        let mut request = vec![
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ];
        request.extend([
            "-nodes", "-subj", &subject, "-keyout", &key_s, "-out", &csr_s,
        ]);
        openssl(&request, "req (leaf)")?;
        let mut sign = vec!["x509", "-req", "-days", "1", "-in", &csr_s, "-CA", &ca_s];
        sign.extend([
            "-CAkey",
            &ca_key_s,
            "-CAcreateserial",
            "-out",
            &cert_s,
            "-extfile",
            &ext_s,
        ]);
        openssl(&sign, "x509 (sign)")?;
        Ok((cert, key))
    }
}
