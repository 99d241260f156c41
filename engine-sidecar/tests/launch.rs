//! The sidecar launching `infera-sim` exactly as it would launch a real engine, with
//! real etcd: the record it registers, a gateway routing to it with nothing but etcd's
//! address, re-registration after its lease is revoked, deregistration before the engine
//! stops on SIGTERM, and a lease that expires when the sidecar is killed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infera_proto::discovery::build_worker_key;
use infera_proto::worker::WorkerRecord;
use infera_testkit::process::{ServerProcess, free_port};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use common::{
    SIDECAR, args_of, engine_pid, gateway_on_etcd, launch, launch_with, sim_binary, unique_prefix,
    wait_key,
};

fn health_ok(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

#[tokio::test]
async fn registers_serves_reregisters_and_deregisters_before_stopping() {
    let prefix = unique_prefix("sidecar");
    let mut l = launch(&prefix, "3").await;
    let record = wait_key(&l.key, true, Duration::from_secs(60), &mut l.sidecar)
        .await
        .unwrap();
    assert_eq!(record.worker_id, format!("127.0.0.1:{}", l.port));
    assert_eq!(record.url, format!("http://127.0.0.1:{}", l.port));
    assert_eq!(record.model_name, "fixture-model");
    assert_eq!(record.engine.as_str(), "vllm");
    assert_eq!(
        record.kv_block_size,
        Some(16),
        "read from the engine's cache_config_info metric"
    );
    assert!(
        record
            .kv_events_endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("tcp://127.0.0.1:"))
    );

    // A gateway given nothing but etcd's address (and the prefix) routes to it.
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let gw = gateway_on_etcd(&etcd, &prefix, &[]).await;
    let body = serde_json::json!({"model": "fixture-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = reqwest::Client::new()
            .post(format!("http://{}/v1/chat/completions", gw.addr))
            .json(&body)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway never routed to the sidecar's engine"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The lease disappears (as when etcd loses its data): the sidecar registers again.
    let mut etcd_client = infera_testkit::etcd_client().await.unwrap();
    let lease = etcd_client.get(l.key.as_str(), None).await.unwrap().kvs()[0].lease();
    etcd_client.lease_revoke(lease).await.unwrap();
    wait_key(&l.key, false, Duration::from_secs(5), &mut l.sidecar).await;
    wait_key(&l.key, true, Duration::from_secs(15), &mut l.sidecar)
        .await
        .unwrap();

    // SIGTERM: the key goes first, while the engine still serves.
    l.sidecar.terminate();
    wait_key(&l.key, false, Duration::from_secs(10), &mut l.sidecar).await;
    assert!(
        health_ok(l.port),
        "the engine was still up when its key was removed"
    );
    let exit = l.sidecar.wait_exit(Duration::from_secs(20)).await;
    assert!(
        exit.is_some(),
        "the sidecar did not exit: {}",
        l.sidecar.log_tail(20)
    );
    assert!(exit.unwrap().success(), "{}", l.sidecar.log_tail(20));
    assert!(!health_ok(l.port), "the engine stopped after the drain");
}

#[tokio::test]
async fn a_killed_sidecar_lets_its_lease_expire() {
    let prefix = unique_prefix("sidecar-kill");
    let mut l = launch(&prefix, "2").await;
    wait_key(&l.key, true, Duration::from_secs(60), &mut l.sidecar)
        .await
        .unwrap();
    l.sidecar.kill();
    wait_key(&l.key, false, Duration::from_secs(10), &mut l.sidecar).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while health_ok(l.port) {
        assert!(
            Instant::now() < deadline,
            "the engine outlived its killed sidecar"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A launched engine that hangs (stopped with SIGSTOP: alive, accepting connections,
/// answering nothing) leaves routing within a few health checks, and the sidecar stops
/// it and exits 4 so the pod restarts it; before, only an exit was noticed.
#[tokio::test]
async fn a_hung_engine_is_deregistered_and_stopped() {
    let prefix = unique_prefix("sidecar-hung");
    let mut l = launch(&prefix, "30").await;
    wait_key(&l.key, true, Duration::from_secs(60), &mut l.sidecar)
        .await
        .unwrap();
    let engine = engine_pid(l.sidecar.pid()).expect("the sidecar's engine process");
    let stopped = Instant::now();
    nix_kill(engine, "-STOP");
    // Three checks of at most 5 s each, half a second apart: gone well inside the lease.
    wait_key(&l.key, false, Duration::from_secs(25), &mut l.sidecar).await;
    eprintln!("deregistered {:?} after the engine hung", stopped.elapsed());
    let exit = l.sidecar.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(
        exit.and_then(|e| e.code()),
        Some(4),
        "{}",
        l.sidecar.log_tail(20)
    );
    assert!(!health_ok(l.port), "the hung engine was left running");
}

/// An etcd serving TLS that requires client certificates and, with auth on, a user
/// (as the operator mounts them from Secrets): the sidecar registers with its
/// certificate and password, and revokes its lease on SIGTERM.
#[tokio::test]
async fn registers_in_an_etcd_with_tls_client_certificates_and_a_password() {
    use etcd_client::{Client, ConnectOptions};
    use infera_etcd_conn::EtcdSecurity;
    let dir = tempfile::tempdir().unwrap();
    let pki = infera_testkit::certs::Pki::new(dir.path()).unwrap();
    let etcd = infera_testkit::etcd::EtcdServer::start_tls(&pki)
        .await
        .unwrap();
    let (root_cert, root_key) = pki.issue("root").unwrap();
    let root = EtcdSecurity {
        ca_file: Some(pki.ca.clone()),
        cert_file: Some(root_cert),
        key_file: Some(root_key),
        ..Default::default()
    };
    let options = root.apply(ConnectOptions::new()).unwrap();
    let mut admin = Client::connect([etcd.endpoint()], Some(options))
        .await
        .unwrap();
    let prefix = unique_prefix("sidecar-tls");
    infera_testkit::etcd::enable_auth(
        &mut admin,
        &prefix,
        "infera-sidecar",
        "sidecar-password",
        true,
    )
    .await
    .unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "sidecar-password\n").unwrap();
    let (cert, key) = pki.issue("sidecar").unwrap();
    let path = |p: &Path| p.display().to_string();
    let flags: Vec<String> = vec![
        "--etcd-ca-file".into(),
        path(&pki.ca),
        "--etcd-cert-file".into(),
        path(&cert),
        "--etcd-key-file".into(),
        path(&key),
        "--etcd-user".into(),
        "infera-sidecar".into(),
        "--etcd-password-file".into(),
        path(&password),
    ];
    let mut l = launch_with(etcd.endpoint(), &prefix, "30", &flags).await;
    // Read back as root (its certificate names the user once auth is on).
    let present = |admin: &mut Client| {
        let mut admin = admin.clone();
        let key = l.key.clone();
        async move { !admin.get(key, None).await.unwrap().kvs().is_empty() }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !present(&mut admin).await {
        assert!(
            Instant::now() < deadline,
            "never registered: {}",
            l.sidecar.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    l.sidecar.terminate();
    let exit = l.sidecar.wait_exit(Duration::from_secs(20)).await;
    assert!(exit.is_some(), "{}", l.sidecar.log_tail(20));
    assert!(!present(&mut admin).await, "the lease was not revoked");
}

fn nix_kill(pid: u32, signal: &str) {
    infera_testkit::process::signal(pid, signal).unwrap();
}

#[test]
fn bad_command_lines_exit_2_with_a_reason() {
    let out = std::process::Command::new(SIDECAR)
        .args(["tgi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected vllm, sglang, atom or sim"));
    let out = std::process::Command::new(SIDECAR)
        .args([
            "sglang",
            "--model-path",
            "/m",
            "--disaggregation-mode",
            "prefill",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--advertise-host"),
        "the PD preflight refuses a loopback host"
    );
}

#[tokio::test]
async fn kv_events_reach_jetstream_byte_for_byte() {
    use async_nats::jetstream::consumer;
    use futures::StreamExt;
    use zeromq::{Socket, SocketRecv, SubSocket};
    let nats = infera_testkit::nats_url().await.unwrap();
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let prefix = unique_prefix("sidecar-relay");
    let port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = args_of(&[
        "sim",
        "--etcd-endpoint",
        &etcd,
        "--etcd-prefix",
        &prefix,
        "--advertise-host",
        "127.0.0.1",
        "--kv-event-transport",
        "nats",
        "--nats-server",
        &nats,
        "--sim-binary",
        sim_binary().to_str().unwrap(),
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
        "--speedup",
        "20",
    ]);
    let mut sidecar =
        ServerProcess::start(Path::new(SIDECAR), &args, &dir.path().join("sidecar.log")).unwrap();
    let key = build_worker_key(&prefix, &format!("127.0.0.1:{port}"));
    let record = wait_key(&key, true, Duration::from_secs(60), &mut sidecar)
        .await
        .unwrap();
    let endpoint = record.kv_events_endpoint.clone().unwrap();
    // Our own subscriber on the engine sees the batches the sidecar relays.
    let mut sub = SubSocket::new();
    sub.connect(&endpoint).await.unwrap();
    sub.subscribe("").await.unwrap();
    let http = reqwest::Client::new();
    let mut direct = None;
    for i in 0..50 {
        let body = serde_json::json!({"model": "fixture-model", "prompt": format!("prompt {i} long enough to fill a block"), "max_tokens": 1});
        http.post(format!("http://127.0.0.1:{port}/v1/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        if let Ok(Ok(msg)) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            direct = Some(msg.into_vec().last().unwrap().to_vec());
            break;
        }
    }
    let direct = direct.expect("no KV event from the engine");
    let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
    let stream = js
        .get_stream(infera_proto::kv_stream::NATS_STREAM)
        .await
        .unwrap();
    let subject = infera_proto::kv_stream::build_kv_event_subject(&record.worker_id, 0);
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            filter_subject: subject.clone(),
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut found = false;
    while !found {
        assert!(
            Instant::now() < deadline,
            "the batch never reached {subject}"
        );
        let mut batch = consumer
            .fetch()
            .max_messages(100)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap();
        while let Some(Ok(m)) = batch.next().await {
            found |= m.payload.as_ref() == direct.as_slice();
        }
    }
    sidecar.kill();
}

#[tokio::test]
async fn attach_mode_drain_endpoint_blocks_until_the_engine_is_idle() {
    use futures::StreamExt;
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let prefix = unique_prefix("sidecar-attach");
    let (port, status_port) = (free_port().unwrap(), free_port().unwrap());
    let dir = tempfile::tempdir().unwrap();
    // The engine runs on its own (its container), at real-time speed.
    let engine_args: Vec<String> = args_of(&[
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
    ]);
    let mut engine =
        ServerProcess::start(&sim_binary(), &engine_args, &dir.path().join("engine.log")).unwrap();
    let args: Vec<String> = args_of(&[
        "sim",
        "--attach",
        "--status-port",
        &status_port.to_string(),
        "--etcd-endpoint",
        &etcd,
        "--etcd-prefix",
        &prefix,
        "--advertise-host",
        "127.0.0.1",
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
    ]);
    // As the operator renders it: the kubelet's preStop (from the node, not the Pod's
    // loopback) presents this token.
    let token = "fixture-drain-token";
    let mut sidecar = ServerProcess::start_with_env(
        Path::new(SIDECAR),
        &args,
        &[("INFERA_DRAIN_TOKEN", token)],
        &dir.path().join("sidecar.log"),
    )
    .unwrap();
    let key = build_worker_key(&prefix, &format!("127.0.0.1:{port}"));
    wait_key(&key, true, Duration::from_secs(30), &mut sidecar)
        .await
        .unwrap();
    // From another address (this machine's own, not loopback): refused without the
    // token or with a wrong one, and the worker stays registered.
    let outside = outside_address();
    let drain_url = format!("http://{outside}:{status_port}/drain");
    for presented in [None, Some("fixture-drain-tokeN")] {
        let mut req = reqwest::Client::new().get(&drain_url);
        if let Some(t) = presented {
            req = req.header("x-infera-drain-token", t);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 403, "{presented:?}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
    }
    wait_key(&key, true, Duration::from_secs(1), &mut sidecar)
        .await
        .unwrap();
    // The sidecar's own status: registered, with the registration's age.
    let health: serde_json::Value = reqwest::get(format!("http://127.0.0.1:{status_port}/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["registered"], true, "{health}");
    assert!(health["registration_age_s"].is_number(), "{health}");
    let metrics = reqwest::get(format!("http://127.0.0.1:{status_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("infera_sidecar_registered 1")
            && metrics.contains("infera_sidecar_registration_age_seconds"),
        "{metrics}"
    );
    // A request in flight: 300 tokens at ~5 ms each.
    let body = serde_json::json!({"model": "fixture-model", "prompt": "hello", "max_tokens": 300, "stream": true});
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    let drain = tokio::spawn(async move {
        let r = reqwest::Client::new()
            .get(&drain_url)
            .header("x-infera-drain-token", token)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), Instant::now())
    });
    wait_key(&key, false, Duration::from_secs(5), &mut sidecar).await;
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.unwrap());
    }
    let stream_done = Instant::now();
    assert!(
        String::from_utf8_lossy(&rest).contains("[DONE]"),
        "the in-flight request finished"
    );
    let (status, drained_at) = drain.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        drained_at >= stream_done,
        "/drain answered before the engine was idle"
    );
    assert!(health_ok(port), "attach mode never stops the engine itself");
    sidecar.terminate();
    let exit = sidecar.wait_exit(Duration::from_secs(10)).await;
    assert!(
        exit.is_some(),
        "the sidecar did not exit: {}",
        sidecar.log_tail(20)
    );
    engine.kill();
}

/// An address of this machine other than loopback (its route to the outside), as the
/// node's address is to a Pod.
fn outside_address() -> std::net::IpAddr {
    let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    // No packet is sent: connecting a UDP socket only picks the route.
    probe.connect("192.0.2.1:9").unwrap();
    let ip = probe.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "no non-loopback address here");
    ip
}

/// A fake engine program on PATH that records its argv and RDMA environment, then runs
/// infera-sim (dropping the launcher words `serve` / `-m <module>`).
fn fake_engine(dir: &Path, program: &str, flavor: &str) {
    let script = format!(
        "#!/bin/sh\nprintf '%s\\n' \"$@\" > {dir}/argv\nenv | grep -E '^(MC_|NCCL_IB_|MORI_IB_|MOONCAKE_|VLLM_|ATOM_|INFERA_ATOM_)' | sort > {dir}/env\n\
         if [ \"$1\" = serve ]; then shift; fi\nif [ \"$1\" = -m ]; then shift 2; fi\n\
         for a; do shift; [ \"$a\" = --server-port ] && a=--port; set -- \"$@\" \"$a\"; done\n\
         exec {sim} --engine {flavor} --speedup 20 \"$@\"\n",
        dir = dir.display(),
        sim = sim_binary().display(),
    );
    let path = dir.join(program);
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn fake_sysfs(dir: &Path) {
    let port = dir.join("class/infiniband/ionic_0/ports/1");
    std::fs::create_dir_all(port.join("gid_attrs/types")).unwrap();
    std::fs::create_dir_all(port.join("gids")).unwrap();
    std::fs::write(port.join("gid_attrs/types/3"), "RoCE v2\n").unwrap();
    std::fs::write(
        port.join("gids/3"),
        "0000:0000:0000:0000:0000:ffff:0a00:0005\n",
    )
    .unwrap();
}

#[tokio::test]
async fn prepares_each_engines_argv_and_env_exactly() {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let cases = [
        (
            "vllm",
            "vllm",
            "vllm",
            vec!["/models/fixture", "--served-model-name", "fixture-model"],
        ),
        (
            "sglang",
            "python3",
            "sglang",
            vec![
                "--model-path",
                "/models/fixture",
                "--served-model-name",
                "fixture-model",
                "--page-size",
                "16",
            ],
        ),
        // ATOM answers to the model it loads and listens on --server-port.
        ("atom", "python3", "atom", vec!["--model", "fixture-model"]),
    ];
    for (engine, program, flavor, user_args) in cases {
        let dir = tempfile::tempdir().unwrap();
        fake_engine(dir.path(), program, flavor);
        let sysfs = dir.path().join("sys");
        fake_sysfs(&sysfs);
        let port = free_port().unwrap();
        let prefix = unique_prefix("sidecar-prep");
        let mut args: Vec<String> = args_of(&[
            engine,
            "--etcd-endpoint",
            &etcd,
            "--etcd-prefix",
            &prefix,
            "--sysfs-root",
            sysfs.to_str().unwrap(),
        ]);
        args.extend(user_args.iter().map(|s| s.to_string()));
        let port_flag = if engine == "atom" {
            "--server-port"
        } else {
            "--port"
        };
        args.extend([port_flag.to_owned(), port.to_string()]);
        let path = format!(
            "{}:{}",
            dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut sidecar = ServerProcess::start_with_env(
            Path::new(SIDECAR),
            &args,
            &[("PATH", &path)],
            &dir.path().join("sidecar.log"),
        )
        .unwrap();
        let key = build_worker_key(&prefix, &format!("127.0.0.1:{port}"));
        let record = wait_key(&key, true, Duration::from_secs(30), &mut sidecar)
            .await
            .unwrap();
        let kv_port = record
            .kv_events_endpoint
            .as_deref()
            .and_then(|e| e.rsplit(':').next())
            .unwrap()
            .to_owned();
        let argv = std::fs::read_to_string(dir.path().join("argv")).unwrap();
        let argv: Vec<String> = argv
            .lines()
            .map(|l| {
                l.replace(&port.to_string(), "<PORT>")
                    .replace(&kv_port, "<KV>")
            })
            .collect();
        let kv = r#"{"publisher":"zmq","endpoint":"tcp://*:<KV>","topic":"kv-events"}"#;
        let vllm_kv = r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:<KV>","topic":"kv-events"}"#;
        let mut expected: Vec<String> = match engine {
            "vllm" => vec!["serve".into()],
            "sglang" => vec!["-m".into(), "sglang.launch_server".into()],
            _ => vec!["-m".into(), "atom.entrypoints.openai_server".into()],
        };
        expected.extend(user_args.iter().map(|s| s.to_string()));
        expected.extend([port_flag.into(), "<PORT>".into()]);
        // vLLM publishes only when told to; ATOM has no KV-event flag (an environment
        // variable names the endpoint for images with the earlier launchers' hook).
        match engine {
            "vllm" => expected.extend(["--kv-events-config".into(), vllm_kv.into()]),
            "sglang" => expected.extend(["--kv-events-config".into(), kv.into()]),
            _ => {}
        }
        // SGLang names the FP8 format (its --kv-cache-dtype has no plain `fp8`).
        match engine {
            "vllm" => expected.extend(["--kv-cache-dtype".into(), "fp8".into()]),
            "sglang" => expected.extend(["--kv-cache-dtype".into(), "fp8_e4m3".into()]),
            _ => {}
        }
        if engine == "sglang" {
            expected.push("--enable-metrics".into());
        }
        assert_eq!(argv, expected, "{engine}");
        let env = std::fs::read_to_string(dir.path().join("env"))
            .unwrap()
            .replace(&kv_port, "<KV>");
        // The node's RDMA defaults as node-env writes them for a pod (the rail's
        // address 10.0.0.5 is not this machine's: no VLLM_HOST_IP).
        let node = "MC_ENABLE_DEST_DEVICE_AFFINITY=1\nMC_GID_INDEX=3\nMORI_IB_GID_INDEX=3\nNCCL_IB_GID_INDEX=3\n";
        let expected_env = match engine {
            "vllm" => {
                format!("{node}VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1\nVLLM_ROCM_USE_AITER=1\n")
            }
            "atom" => format!("INFERA_ATOM_KV_EVENTS_ENDPOINT=tcp://*:<KV>\n{node}"),
            _ => node.to_owned(),
        };
        assert_eq!(env, expected_env, "{engine}");
        assert_eq!(record.engine.as_str(), engine);
        sidecar.kill();
    }
}

#[tokio::test]
async fn sigterm_lets_in_flight_requests_finish_before_the_engine_stops() {
    use futures::StreamExt;
    let prefix = unique_prefix("sidecar-drain");
    let mut l = launch(&prefix, "3").await;
    wait_key(&l.key, true, Duration::from_secs(60), &mut l.sidecar)
        .await
        .unwrap();
    // ~1 s of decoding at 20x an H200.
    let body = serde_json::json!({"model": "fixture-model", "prompt": "hello", "max_tokens": 4000, "stream": true});
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/completions", l.port))
        .json(&body)
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    stream.next().await.unwrap().unwrap();
    l.sidecar.terminate();
    wait_key(&l.key, false, Duration::from_secs(5), &mut l.sidecar).await;
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.expect("the engine was stopped mid-request"));
    }
    assert!(
        String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"),
        "the request finished"
    );
    let exit = l.sidecar.wait_exit(Duration::from_secs(20)).await;
    assert!(
        exit.is_some(),
        "the sidecar did not exit: {}",
        l.sidecar.log_tail(20)
    );
    assert!(!health_ok(l.port), "the engine stopped after the drain");
}

#[tokio::test]
async fn prefill_and_decode_workers_register_their_role_and_connector_params() {
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let mooncake = r#"{"kv_connector":"MooncakeConnector","kv_role":"kv_consumer"}"#;
    for (flags, mode, protocol) in [
        (
            vec!["--engine", "sglang", "--disaggregation-mode", "prefill"],
            "prefill",
            "sglang-bootstrap",
        ),
        (
            vec!["--engine", "vllm", "--kv-transfer-config", mooncake],
            "decode",
            "vllm-mooncake",
        ),
    ] {
        let prefix = unique_prefix("sidecar-pd");
        let port = free_port().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut args: Vec<String> = args_of(&[
            "sim",
            "--etcd-endpoint",
            &etcd,
            "--etcd-prefix",
            &prefix,
            "--disaggregation-allow-tcp",
            "--sim-binary",
            sim_binary().to_str().unwrap(),
            "--served-model-name",
            "fixture-model",
            "--port",
            &port.to_string(),
            "--speedup",
            "20",
        ]);
        args.extend(flags.iter().map(|s| s.to_string()));
        let mut sidecar =
            ServerProcess::start(Path::new(SIDECAR), &args, &dir.path().join("sidecar.log"))
                .unwrap();
        let key = build_worker_key(&prefix, &format!("127.0.0.1:{port}"));
        let record = wait_key(&key, true, Duration::from_secs(30), &mut sidecar)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_str(&record.to_json()).unwrap();
        assert_eq!(json["disagg_mode"], mode, "{protocol}");
        assert_eq!(json["disagg_meta"]["protocol"], protocol);
        match protocol {
            "sglang-bootstrap" => assert_eq!(
                json["disagg_meta"]["params"]["bootstrap_addr"],
                "127.0.0.1:8998"
            ),
            _ => {
                // The sidecar pinned an engine_id into the engine's connector config, and
                // the engine (the sim) reports the same one.
                let pinned = format!("infera-127.0.0.1-{port}");
                assert_eq!(json["disagg_meta"]["params"]["engine_id"], pinned.as_str());
                let info: serde_json::Value =
                    reqwest::get(format!("http://127.0.0.1:{port}/get_server_info"))
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                assert_eq!(info["disagg_meta"]["params"]["engine_id"], pinned.as_str());
            }
        }
        sidecar.kill();
    }
}

#[tokio::test]
async fn registers_again_after_etcd_restarts_with_its_data_wiped() {
    use infera_testkit::etcd::EtcdServer;
    let mut etcd = EtcdServer::start().await.unwrap();
    let endpoint = etcd.endpoint().to_owned();
    let etcd_port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = args_of(&[
        "sim",
        "--etcd-endpoint",
        &endpoint,
        "--lease-ttl",
        "3",
        "--sim-binary",
        sim_binary().to_str().unwrap(),
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
        "--speedup",
        "20",
    ]);
    let mut sidecar =
        ServerProcess::start(Path::new(SIDECAR), &args, &dir.path().join("sidecar.log")).unwrap();
    let key = build_worker_key(
        infera_proto::discovery::DEFAULT_ETCD_PREFIX,
        &format!("127.0.0.1:{port}"),
    );
    let get = |endpoint: String, key: String| async move {
        let mut c = etcd_client::Client::connect([endpoint], None).await.ok()?;
        c.get(key, None)
            .await
            .ok()?
            .kvs()
            .first()
            .map(|kv| kv.value().to_vec())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(endpoint.clone(), key.clone()).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "never registered: {}",
            sidecar.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // etcd dies for long enough that retries back off to their longest wait, then comes
    // back empty on the same address.
    etcd.kill();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let mut fresh = EtcdServer::start_on(etcd_port).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    while get(endpoint.clone(), key.clone()).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "not registered again: {}",
            sidecar.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Wiped again at once: the registration that succeeded reset the backoff, so the
    // lease is found gone at the next keepalive (a third of the 3 s TTL) and the record
    // is back within about 2 s, not after the 10 s the failures had reached.
    fresh.kill();
    let _again = EtcdServer::start_on(etcd_port).await.unwrap();
    let restarted = Instant::now();
    while get(endpoint.clone(), key.clone()).await.is_none() {
        assert!(
            restarted.elapsed() < Duration::from_secs(5),
            "not registered again within 5 s of the second wipe: {}",
            sidecar.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "registered again {:?} after the second wipe",
        restarted.elapsed()
    );
    sidecar.kill();
}

#[tokio::test]
async fn the_record_carries_the_tokenizers_identity_and_the_sidecar_serves_it_to_gateways() {
    use infera_testkit::model_files::{FixtureModel, model_dir};
    let tokenizer = model_dir(FixtureModel::Qwen3).unwrap();
    let etcd = infera_testkit::etcd_endpoint().await.unwrap();
    let prefix = unique_prefix("sidecar-tok");
    let port = free_port().unwrap();
    let status_port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = args_of(&[
        "sim",
        "--etcd-endpoint",
        &etcd,
        "--etcd-prefix",
        &prefix,
        "--sim-binary",
        sim_binary().to_str().unwrap(),
        "--served-model-name",
        "fixture-model",
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--port",
        &port.to_string(),
        "--status-port",
        &status_port.to_string(),
        "--speedup",
        "20",
    ]);
    let mut sidecar =
        ServerProcess::start(Path::new(SIDECAR), &args, &dir.path().join("sidecar.log")).unwrap();
    let key = build_worker_key(&prefix, &format!("127.0.0.1:{port}"));
    let record = wait_key(&key, true, Duration::from_secs(60), &mut sidecar)
        .await
        .unwrap();
    let kv = record.kv.expect("a kv block with the tokenizer identity");
    // transformers' ids for the canary with this tokenizer (prompt/testdata/chat_fixtures.json).
    let fixtures: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../prompt/testdata/chat_fixtures.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let expected: Vec<u32> =
        serde_json::from_value(fixtures["models"]["qwen3"]["canary"]["ids"].clone()).unwrap();
    assert_eq!(kv.tokenizer_canary, expected);
    assert_eq!(kv.tokenizer_digest.as_deref().map(str::len), Some(16));
    assert_eq!(kv.engine_block_size, 16);

    // A gateway with no tokenizer folder fetches the worker's from its sidecar, checks it
    // against the record's digest, and tokenizes as the engine does.
    let from_workers = |sidecar_port: u16| {
        [
            "--router-policy",
            "kv-aware",
            "--router-tokenizer-from-workers",
        ]
        .map(str::to_owned)
        .into_iter()
        .chain([sidecar_port.to_string()])
        .collect::<Vec<_>>()
    };
    let state = |gw: &infera_gateway::Gateway| gw.tokenizer_state();
    let fetched = gateway_on_etcd(&etcd, &prefix, &from_workers(status_port)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&fetched.gateway)["state"] != "loaded" {
        assert!(
            Instant::now() < deadline,
            "never loaded: {}",
            state(&fetched.gateway)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let loaded = reqwest::get(format!("http://{}/infera/tokenizer", fetched.addr))
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert_eq!(loaded["digest"].as_str(), kv.tokenizer_digest.as_deref());
    assert_eq!(loaded["worker"], record.worker_id);
    let codec = fetched.gateway.router_codec().unwrap();
    assert_eq!(
        codec
            .encode(infera_proto::tokenizer::TOKENIZER_CANARY, false)
            .unwrap(),
        expected
    );
    assert!(codec.has_chat_template(), "tokenizer_config.json came too");

    // Pointed at a port where no sidecar listens: the state says so, and the gateway
    // serves all the same (routing by load).
    let nowhere = free_port().unwrap();
    let failing = gateway_on_etcd(&etcd, &prefix, &from_workers(nowhere)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&failing.gateway)["state"] != "failed" {
        assert!(Instant::now() < deadline, "{}", state(&failing.gateway));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = state(&failing.gateway);
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains(&format!("GET http://127.0.0.1:{nowhere}/tokenizer")),
        "{failed}"
    );
    let body = serde_json::json!({"model": "fixture-model", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]});
    let answer = reqwest::Client::new()
        .post(format!("http://{}/v1/chat/completions", failing.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    sidecar.kill();
}

#[tokio::test]
async fn kubernetes_discovery_puts_the_record_in_the_pod_annotation() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    let kube = infera_testkit::kube_client().await.unwrap();
    let kubeconfig = infera_testkit::kubeconfig().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(kube, "default");
    let pod_name = infera_testkit::unique_name("engine");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "labels": {"infera.amd.com/deployment": "fixture"}},
        "spec": {"containers": [{"name": "engine", "image": "fixture.invalid/engine:0"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let port = free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = args_of(&[
        "sim",
        "--discovery-backend",
        "kubernetes",
        "--advertise-host",
        "10.1.2.3",
        "--sim-binary",
        sim_binary().to_str().unwrap(),
        "--served-model-name",
        "fixture-model",
        "--port",
        &port.to_string(),
        "--speedup",
        "20",
    ]);
    let env = [
        ("KUBECONFIG", kubeconfig.to_str().unwrap()),
        ("POD_NAME", pod_name.as_str()),
        ("POD_NAMESPACE", "default"),
    ];
    let sidecar = ServerProcess::start_with_env(
        Path::new(SIDECAR),
        &args,
        &env,
        &dir.path().join("sidecar.log"),
    )
    .unwrap();
    let annotation = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("infera.amd.com/worker-info").cloned())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let record = loop {
        if let Some(json) = annotation(&pods.get(&pod_name).await.unwrap()) {
            break WorkerRecord::from_json(json.as_bytes()).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no annotation: {}",
            sidecar.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(record.worker_id, format!("10.1.2.3:{port}"));
    sidecar.terminate();
    let deadline = Instant::now() + Duration::from_secs(20);
    while annotation(&pods.get(&pod_name).await.unwrap()).is_some() {
        assert!(
            Instant::now() < deadline,
            "the annotation stayed: {}",
            sidecar.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pods.delete(&pod_name, &Default::default()).await.unwrap();
}
