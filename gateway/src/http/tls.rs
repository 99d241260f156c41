//! The gateway's TLS certificate: a PEM chain and key read from files (a Kubernetes
//! `kubernetes.io/tls` Secret mounted as a volume, as cert-manager writes it) and read
//! again when they change, so a renewed certificate is served without a restart.

use arc_swap::ArcSwap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring::sign::any_supported_type;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// The certificate being served and where it comes from.
pub struct TlsCertificates {
    cert_file: PathBuf,
    key_file: PathBuf,
    served: Arc<ArcSwap<Loaded>>,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for TlsCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsCertificates")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Loaded {
    pem: (Vec<u8>, Vec<u8>),
    key: Arc<CertifiedKey>,
}

/// Hands rustls whatever certificate is served now.
#[derive(Debug)]
struct Resolver(Arc<ArcSwap<Loaded>>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load().key.clone())
    }
}

impl TlsCertificates {
    /// Reads and checks both files; the error names the file and what is wrong.
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<Self>, String> {
        let served = Arc::new(ArcSwap::from_pointee(read(cert_file, key_file)?));
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(served.clone())));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(Self {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            served,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        }))
    }

    /// The acceptor for new connections.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// Serves the files' certificate if they changed: `Ok(true)` when it did, an error
    /// (and the old certificate kept) when the new files do not make a certificate, as
    /// between a renewal's two writes.
    pub fn reload_if_changed(&self) -> Result<bool, String> {
        let cert_pem = std::fs::read(&self.cert_file)
            .map_err(|e| format!("--tls-cert-file {}: {e}", self.cert_file.display()))?;
        let key_pem = std::fs::read(&self.key_file)
            .map_err(|e| format!("--tls-key-file {}: {e}", self.key_file.display()))?;
        let current = self.served.load();
        if current.pem.0 == cert_pem && current.pem.1 == key_pem {
            return Ok(false);
        }
        let key = certified_key(&cert_pem, &key_pem, &self.cert_file, &self.key_file)?;
        self.served.store(Arc::new(Loaded {
            pem: (cert_pem, key_pem),
            key: Arc::new(key),
        }));
        Ok(true)
    }
}

fn read(cert_file: &Path, key_file: &Path) -> Result<Loaded, String> {
    let cert_pem = std::fs::read(cert_file)
        .map_err(|e| format!("--tls-cert-file {}: {e}", cert_file.display()))?;
    let key_pem = std::fs::read(key_file)
        .map_err(|e| format!("--tls-key-file {}: {e}", key_file.display()))?;
    let key = certified_key(&cert_pem, &key_pem, cert_file, key_file)?;
    Ok(Loaded {
        pem: (cert_pem, key_pem),
        key: Arc::new(key),
    })
}

fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_file: &Path,
    key_file: &Path,
) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--tls-cert-file {}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert-file {}: no PEM CERTIFICATE block",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("--tls-key-file {}: {e}", key_file.display()))?;
    let signing = any_supported_type(&key)
        .map_err(|e| format!("--tls-key-file {}: {e}", key_file.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        format!(
            "--tls-key-file {} does not belong to --tls-cert-file {}: {e}",
            key_file.display(),
            cert_file.display()
        )
    })?;
    Ok(certified)
}
