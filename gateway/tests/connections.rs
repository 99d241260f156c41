//! Connections as an attacker or a careless client holds them: idle, half-sent headers,
//! more than the limit; and HTTPS with a certificate renewed while serving.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use infera_gateway::TlsCertificates;
use infera_gateway::server::RunningGateway;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

async fn gateway(flags: &[&str]) -> RunningGateway {
    common::embedded(Vec::new(), flags).await
}

/// Reads until the server closes the connection; the time that took.
async fn time_to_close(mut conn: TcpStream, within: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(within, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("connection still open after {within:?}"),
        }
    }
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n";

/// A full answer to `HEALTH` on `conn` (headers and the short body), within `within`.
async fn health_answer(conn: &mut TcpStream, within: Duration) -> String {
    conn.write_all(HEALTH).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before answering");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no answer within {within:?}"));
    String::from_utf8_lossy(&got).into_owned()
}

/// A frame header: 24-bit length, type, flags, stream id.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = vec![len[1], len[2], len[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Sends `GET /health` over h2 (prior knowledge) and reads until its answer's
/// HEADERS frame has arrived.
async fn h2_health(conn: &mut TcpStream, within: Duration) {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[])); // SETTINGS
    // HPACK: :method GET, :scheme http, :path /health (literal, indexed name),
    // :authority gw.
    let mut fields = vec![0x82, 0x86, 0x44, 7];
    fields.extend_from_slice(b"/health");
    fields.extend([0x41, 2]);
    fields.extend_from_slice(b"gw");
    out.extend(h2_frame(1, 0x4 | 0x1, 1, &fields)); // HEADERS, END_HEADERS|END_STREAM
    conn.write_all(&out).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(within, async {
        // Frames until a HEADERS frame on stream 1.
        loop {
            let mut at = 0;
            while at + 9 <= got.len() {
                let len = usize::from(got[at]) << 16
                    | usize::from(got[at + 1]) << 8
                    | usize::from(got[at + 2]);
                if got[at + 3] == 1 && got[at + 8] == 1 {
                    return;
                }
                at += 9 + len;
            }
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before answering");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no h2 answer within {within:?}"));
}

#[tokio::test]
async fn idle_half_sent_kept_alive_and_idle_h2_connections_close_at_the_header_deadline() {
    let gw = gateway(&["--header-read-timeout-s", "1"]).await;
    let mut conns = Vec::new();
    for i in 0..60 {
        let mut c = TcpStream::connect(gw.addr).await.unwrap();
        match i % 4 {
            0 => {} // connected, never sends a byte
            // One h2 request answered, then no stream open.
            3 => h2_health(&mut c, Duration::from_secs(5)).await,
            1 => c
                .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n")
                .await
                .unwrap(),
            _ => {
                // One request answered, then idle on keep-alive.
                let answer = health_answer(&mut c, Duration::from_secs(5)).await;
                assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            }
        }
        conns.push(c);
    }
    let closes = futures::future::join_all(
        conns
            .into_iter()
            .map(|c| time_to_close(c, Duration::from_secs(6))),
    )
    .await;
    let slowest = closes.iter().max().unwrap();
    println!("60 idle, half-sent, kept-alive and idle h2 connections closed within {slowest:?}");
    // An h2 client is sent GOAWAY and a PING; this one never acknowledges (as a
    // hostile client would not), so its close takes a further deadline.
    assert!(*slowest < Duration::from_secs(4), "{closes:?}");
}

#[tokio::test]
async fn a_stream_longer_than_the_header_deadline_is_not_cut() {
    use futures::StreamExt;
    let sim = common::start_sim(infera_proto::worker::EngineKind::Vllm, 1.0).await;
    let gw = common::embedded(
        vec![common::record_for(
            sim.addr,
            infera_proto::worker::EngineKind::Vllm,
        )],
        &["--header-read-timeout-s", "1"],
    )
    .await;
    let started = Instant::now();
    let mut body = common::chat("a long answer", 600);
    body["stream"] = serde_json::json!(true);
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", gw.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(2),
        "the stream was too short to tell: {took:?}"
    );
    assert!(
        String::from_utf8_lossy(&text).ends_with("data: [DONE]\n\n"),
        "cut after {took:?}"
    );
}

#[tokio::test]
async fn past_the_connection_limit_a_client_waits_until_one_closes() {
    let gw = gateway(&["--max-connections", "2", "--header-read-timeout-s", "30"]).await;
    let mut first = TcpStream::connect(gw.addr).await.unwrap();
    let answer = health_answer(&mut first, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let _second = TcpStream::connect(gw.addr).await.unwrap();
    // Both accepted and counted before the third arrives.
    let deadline = Instant::now() + Duration::from_secs(5);
    while gw.gateway.open_connections() < 2 {
        assert!(
            Instant::now() < deadline,
            "the two connections were never counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The third connects (the kernel's backlog) but is not served while two are open.
    let mut third = TcpStream::connect(gw.addr).await.unwrap();
    third.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(500), third.read(&mut buf)).await;
    assert!(early.is_err(), "served past --max-connections: {early:?}");
    drop(first);
    let started = Instant::now();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
            let n = third.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the waiting client was never served after a connection closed");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    println!("served {:?} after a slot freed", started.elapsed());
}

fn self_signed(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    infera_testkit::certs::self_signed(dir, name).unwrap()
}

fn der(pem: &Path) -> Vec<u8> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_file(pem).unwrap().to_vec()
}

/// The certificate the server presents, trusting only `roots`.
async fn presented(addr: std::net::SocketAddr, roots: &[&Path]) -> Vec<u8> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(der(r).into()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    tls.write_all(HEALTH).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = tls.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn https_serves_the_mounted_certificate_and_a_renewed_one_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (old_cert, old_key) = self_signed(dir.path(), "old");
    let (new_cert, new_key) = self_signed(dir.path(), "new");
    // As a Secret volume: fixed names the renewal overwrites.
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(&old_cert, &crt).unwrap();
    std::fs::copy(&old_key, &key).unwrap();
    let gw = gateway(&[
        "--tls-cert-file",
        crt.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ])
    .await;
    assert_eq!(
        presented(gw.addr, &[&old_cert, &new_cert]).await,
        der(&old_cert)
    );
    // Plain HTTP on the HTTPS port gets no answer.
    let mut plain = TcpStream::connect(gw.addr).await.unwrap();
    plain.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), plain.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert!(!String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));

    // Renewal: the key first, then the certificate; a half-written pair keeps the old.
    let certs = gw.tls.clone().expect("the gateway's certificates");
    std::fs::copy(&new_key, &key).unwrap();
    let half = certs.reload_if_changed().unwrap_err();
    assert!(half.contains("does not belong to"), "{half}");
    assert_eq!(
        presented(gw.addr, &[&old_cert, &new_cert]).await,
        der(&old_cert)
    );
    std::fs::copy(&new_cert, &crt).unwrap();
    // What the gateway's 30 s check does, driven here.
    assert!(certs.reload_if_changed().unwrap());
    assert!(!certs.reload_if_changed().unwrap());
    assert_eq!(
        presented(gw.addr, &[&old_cert, &new_cert]).await,
        der(&new_cert)
    );
}

#[test]
fn a_key_of_another_certificate_is_refused_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a_cert, _) = self_signed(dir.path(), "a");
    let (_, b_key) = self_signed(dir.path(), "b");
    let err = TlsCertificates::load(&a_cert, &b_key).unwrap_err();
    assert!(
        err.contains("b.key") && err.contains("a.crt") && err.contains("does not belong"),
        "{err}"
    );
    let err = TlsCertificates::load(&dir.path().join("missing.crt"), &b_key).unwrap_err();
    assert!(
        err.starts_with("--tls-cert-file") && err.contains("missing.crt"),
        "{err}"
    );
}
