//! How the gateway and the engine sidecar connect to etcd, the same way in both: an
//! etcd serving `https://` endpoints is verified against `ca_file`, a client
//! certificate (`cert_file` and `key_file`) answers etcd's `--client-cert-auth`, and
//! `user` with the password in `password_file` authenticates when etcd has auth enabled.
//! The files are the keys of a mounted Secret (`ca.crt`, `tls.crt`, `tls.key`, as
//! cert-manager writes them); they are read on every (re)connect, so a renewed
//! certificate is used from the next one.

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use std::path::{Path, PathBuf};

/// What secures the connection; all unset: plain `http://` without auth.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    /// PEM CA bundle that signed etcd's serving certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// etcd user (with `password_file`).
    pub user: Option<String>,
    /// File holding the user's password (trailing newline ignored).
    pub password_file: Option<PathBuf>,
}

/// A setting that cannot work, naming the flag and what to do.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct EtcdSecurityError(pub String);

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, EtcdSecurityError> {
    std::fs::read(path).map_err(|e| EtcdSecurityError(format!("{flag} {}: {e}", path.display())))
}

impl EtcdSecurity {
    /// Checks settings that depend on each other and on the endpoints' scheme.
    pub fn validate(&self, endpoints: &[String]) -> Result<(), EtcdSecurityError> {
        let err = |m: &str| Err(EtcdSecurityError(m.to_owned()));
        if self.cert_file.is_some() != self.key_file.is_some() {
            return err(
                "--etcd-cert-file and --etcd-key-file go together (the client certificate and its key)",
            );
        }
        if self.user.is_some() != self.password_file.is_some() {
            return err("--etcd-user and --etcd-password-file go together");
        }
        let tls = self.ca_file.is_some() || self.cert_file.is_some();
        let https = endpoints
            .iter()
            .filter(|e| e.starts_with("https://"))
            .count();
        if tls && https != endpoints.len() {
            return err("--etcd-ca-file or --etcd-cert-file need https:// etcd endpoints");
        }
        if !tls && https > 0 {
            return err(
                "https:// etcd endpoints need --etcd-ca-file (the CA that signed etcd's certificate)",
            );
        }
        Ok(())
    }

    /// `options` with TLS and auth added, reading the files now.
    pub fn apply(&self, mut options: ConnectOptions) -> Result<ConnectOptions, EtcdSecurityError> {
        if self.ca_file.is_some() || self.cert_file.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &self.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read("--etcd-ca-file", ca)?));
            }
            if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
                tls = tls.identity(Identity::from_pem(
                    read("--etcd-cert-file", cert)?,
                    read("--etcd-key-file", key)?,
                ));
            }
            options = options.with_tls(tls);
        }
        if let (Some(user), Some(file)) = (&self.user, &self.password_file) {
            let password = read("--etcd-password-file", file)?;
            let password = String::from_utf8(password).map_err(|_| {
                EtcdSecurityError(format!(
                    "--etcd-password-file {}: not UTF-8",
                    file.display()
                ))
            })?;
            options = options.with_user(user.clone(), password.trim_end_matches(['\n', '\r']));
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(e: &[&str]) -> Vec<String> {
        e.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn settings_that_cannot_work_say_which_flag() {
        let plain = EtcdSecurity::default();
        assert_eq!(plain.validate(&endpoints(&["http://e:2379"])), Ok(()));
        let e = plain.validate(&endpoints(&["https://e:2379"])).unwrap_err();
        assert!(e.0.contains("--etcd-ca-file"), "{e}");
        let ca = EtcdSecurity {
            ca_file: Some("/ca".into()),
            ..Default::default()
        };
        assert_eq!(
            ca.validate(&endpoints(&["https://a:2379", "https://b:2379"])),
            Ok(())
        );
        let e = ca
            .validate(&endpoints(&["https://a:2379", "http://b:2379"]))
            .unwrap_err();
        assert!(e.0.contains("https://"), "{e}");
        let half = EtcdSecurity {
            cert_file: Some("/c".into()),
            ..ca.clone()
        };
        assert!(
            half.validate(&endpoints(&["https://a:2379"]))
                .unwrap_err()
                .0
                .contains("--etcd-key-file")
        );
        let user = EtcdSecurity {
            user: Some("gateway".into()),
            ..Default::default()
        };
        assert!(
            user.validate(&endpoints(&["http://a:2379"]))
                .unwrap_err()
                .0
                .contains("--etcd-password-file")
        );
        let missing = EtcdSecurity {
            ca_file: Some("/nonexistent/ca.crt".into()),
            ..Default::default()
        };
        let e = missing.apply(ConnectOptions::new()).unwrap_err();
        assert!(e.0.starts_with("--etcd-ca-file /nonexistent/ca.crt"), "{e}");
    }
}
