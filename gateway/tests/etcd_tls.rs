//! Discovery from an etcd that serves TLS, requires client certificates and then user
//! auth (a real etcd with `--client-cert-auth`, certificates from a test CA): the
//! gateway routes to what is registered there with its certificate or its user, and a
//! client without them is refused by etcd itself.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{chat, record_for, start_gw_args, start_sim, unique_prefix, wait_workers};
use etcd_client::{Client, ConnectOptions, PutOptions};
use infera_etcd_conn::EtcdSecurity;
use infera_proto::discovery::build_worker_key;
use infera_proto::worker::EngineKind;
use infera_testkit::certs::Pki;
use infera_testkit::etcd::EtcdServer;
use std::path::Path;

async fn connect(endpoint: &str, security: &EtcdSecurity) -> Result<Client, String> {
    let options = security.apply(ConnectOptions::new()).map_err(|e| e.0)?;
    let mut client = Client::connect([endpoint], Some(options))
        .await
        .map_err(|e| e.to_string())?;
    // etcd-client connects lazily: a call proves the handshake and the identity.
    client
        .get("/", None)
        .await
        .map(|_| client.clone())
        .map_err(|e| e.to_string())
}

fn with_cert(pki: &Pki, name: &str) -> EtcdSecurity {
    let (cert, key) = pki.issue(name).unwrap();
    EtcdSecurity {
        ca_file: Some(pki.ca.clone()),
        cert_file: Some(cert),
        key_file: Some(key),
        ..Default::default()
    }
}

fn flags(security: &EtcdSecurity) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |flag: &str, value: Option<&Path>| {
        if let Some(v) = value {
            out.extend([flag.to_owned(), v.display().to_string()]);
        }
    };
    push("--etcd-ca-file", security.ca_file.as_deref());
    push("--etcd-cert-file", security.cert_file.as_deref());
    push("--etcd-key-file", security.key_file.as_deref());
    push("--etcd-password-file", security.password_file.as_deref());
    if let Some(user) = &security.user {
        out.extend(["--etcd-user".to_owned(), user.clone()]);
    }
    out
}

async fn gateway_routes(etcd: &str, prefix: &str, security: &EtcdSecurity) {
    let mut args: Vec<String> = ["--etcd-endpoint", etcd, "--etcd-prefix", prefix]
        .map(String::from)
        .to_vec();
    args.extend(flags(security));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let gw = start_gw_args(&refs).await;
    wait_workers(&gw, 1).await;
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .json(&chat("over TLS etcd", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn discovery_over_tls_with_client_certificates_then_user_auth() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path()).unwrap();
    let etcd = EtcdServer::start_tls(&pki).await.unwrap();
    let endpoint = etcd.endpoint().to_owned();
    assert!(endpoint.starts_with("https://"));

    // Registered as a sidecar would, with its own certificate.
    let sim = start_sim(EngineKind::Vllm, 50.0).await;
    let prefix = unique_prefix();
    let record = record_for(sim.addr, EngineKind::Vllm);
    let mut admin = connect(&endpoint, &with_cert(&pki, "root")).await.unwrap();
    admin
        .put(
            build_worker_key(&prefix, &record.worker_id),
            record.to_json(),
            Some(PutOptions::new()),
        )
        .await
        .unwrap();

    // Certificates: the gateway's is accepted; without one, or with one from another
    // CA, etcd refuses the handshake.
    gateway_routes(&endpoint, &prefix, &with_cert(&pki, "gateway")).await;
    let ca_only = EtcdSecurity {
        ca_file: Some(pki.ca.clone()),
        ..Default::default()
    };
    assert!(connect(&endpoint, &ca_only).await.is_err());
    let other_dir = tempfile::tempdir().unwrap();
    let other = Pki::new(other_dir.path()).unwrap();
    let (cert, key) = other.issue("intruder").unwrap();
    let intruder = EtcdSecurity {
        cert_file: Some(cert),
        key_file: Some(key),
        ..ca_only.clone()
    };
    assert!(connect(&endpoint, &intruder).await.is_err());

    // User auth on: a reader of the prefix by password; a certificate whose name is no
    // user gets nothing.
    infera_testkit::etcd::enable_auth(
        &mut admin,
        &prefix,
        "infera-gateway",
        "reader-password",
        false,
    )
    .await
    .unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "reader-password\n").unwrap();
    let reader = EtcdSecurity {
        user: Some("infera-gateway".into()),
        password_file: Some(password_file),
        ..with_cert(&pki, "gateway-2")
    };
    gateway_routes(&endpoint, &prefix, &reader).await;
    // A valid certificate whose name is no user: the handshake passes, the read fails.
    let nobody = connect(&endpoint, &with_cert(&pki, "nobody")).await;
    let refused = nobody.err().unwrap_or_default();
    assert!(
        refused.contains("user name not found") || refused.contains("permission denied"),
        "{refused}"
    );
}
