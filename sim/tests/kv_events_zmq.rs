//! KV events over real ZMQ sockets: every layout decodes with `infera-proto`, stored
//! blocks carry token ids that re-hash to the router's chain, evictions publish
//! `BlockRemoved`, and the replay socket returns buffered batches then the end marker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use bytes::Bytes;
use common::{chat_body, free_port, mk_config, start, url};
use infera_proto::block_hash::compute_block_hashes;
use infera_proto::kv_events::encode::KvEventFormat;
use infera_proto::kv_events::{
    EngineBlockHash, KvEvent, KvEventBatch, KvEventLayout, decode_kv_event_batch,
};
use infera_proto::kv_stream::{REPLAY_END_SEQUENCE, encode_sequence, parse_zmq_frames};
use infera_proto::worker::EngineKind;
use infera_sim::kv_events::KvEventsEndpoint;
use infera_sim::worker::{RunningWorker, WorkerConfig};
use std::time::Duration;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

fn with_events(mut cfg: WorkerConfig) -> (WorkerConfig, String, String) {
    let (p, r) = (free_port(), free_port());
    let endpoint = format!("tcp://127.0.0.1:{p}");
    let replay = format!("tcp://127.0.0.1:{r}");
    cfg.kv_events = Some(KvEventsEndpoint {
        endpoint: endpoint.clone(),
        replay_endpoint: Some(replay.clone()),
        topic: "kv-events".into(),
    });
    (cfg, endpoint, replay)
}

async fn replay_all(replay: &str) -> Vec<(i64, KvEventBatch)> {
    let mut dealer = DealerSocket::new();
    dealer.connect(replay).await.unwrap();
    let request = ZmqMessage::try_from(vec![
        Bytes::new(),
        Bytes::copy_from_slice(&encode_sequence(0)),
    ])
    .unwrap();
    dealer.send(request).await.unwrap();
    let mut out = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(5), dealer.recv())
            .await
            .unwrap()
            .unwrap();
        let frames = msg.into_vec();
        let parts: Vec<&[u8]> = frames.iter().map(|b| b.as_ref()).collect();
        // DEALER sees ["", seq, payload].
        let parsed = parse_zmq_frames(&parts).unwrap();
        if parsed.sequence == REPLAY_END_SEQUENCE {
            assert!(parsed.payload.is_empty());
            return out;
        }
        out.push((
            parsed.sequence,
            decode_kv_event_batch(parsed.payload).unwrap(),
        ));
    }
}

async fn complete(worker: &RunningWorker, content: &str) {
    let r = reqwest::Client::new()
        .post(url(worker, "/v1/chat/completions"))
        .json(&chat_body(content, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

fn stored(batches: &[(i64, KvEventBatch)]) -> Vec<(Vec<EngineBlockHash>, Vec<u32>)> {
    batches
        .iter()
        .flat_map(|(_, b)| &b.events)
        .filter_map(|e| match e {
            KvEvent::BlockStored(s) => Some((s.block_hashes.clone(), s.token_ids.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn every_layout_decodes_and_token_ids_rehash_to_the_router_chain() {
    let cases = [
        (EngineKind::Sglang, None, KvEventLayout::Array),
        (
            EngineKind::Vllm,
            Some(KvEventFormat::VllmArray),
            KvEventLayout::Array,
        ),
        (EngineKind::Vllm, None, KvEventLayout::TaggedMap),
        (EngineKind::Atom, None, KvEventLayout::TaggedMap),
        (
            EngineKind::Vllm,
            Some(KvEventFormat::VllmMapBatch),
            KvEventLayout::MapBatch,
        ),
    ];
    for (engine, format, layout) in cases {
        let mut cfg = mk_config(engine);
        cfg.event_format = format;
        let (cfg, _, replay) = with_events(cfg);
        let worker = start(cfg).await;
        complete(&worker, &"tell me about caches ".repeat(4)).await;
        let batches = replay_all(&replay).await;
        assert!(!batches.is_empty(), "{engine:?}: no batch");
        assert!(
            batches.iter().all(|(_, b)| b.layout == layout),
            "{engine:?} {layout:?}"
        );
        let seqs: Vec<i64> = batches.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            seqs,
            (0..seqs.len() as i64).collect::<Vec<_>>(),
            "sequences start at 0, no gaps"
        );
        // Re-hash the stored tokens in the router's own chain: they must be the prompt's blocks.
        let tokens: Vec<u32> = stored(&batches).into_iter().flat_map(|(_, t)| t).collect();
        let prompt = infera_prompt::PromptCodec::bytes()
            .encode_chat(
                chat_body(&"tell me about caches ".repeat(4), 2)
                    .as_object()
                    .unwrap(),
            )
            .unwrap();
        let full = prompt.len() / 16;
        assert_eq!(
            compute_block_hashes(&tokens, 16)[..full],
            compute_block_hashes(&prompt, 16)[..],
            "{engine:?}"
        );
        let hashes = stored(&batches)
            .into_iter()
            .flat_map(|(h, _)| h)
            .collect::<Vec<_>>();
        match engine {
            EngineKind::Sglang => {
                assert!(hashes.iter().all(|h| matches!(h, EngineBlockHash::Int(_))))
            }
            _ => assert!(
                hashes
                    .iter()
                    .all(|h| matches!(h, EngineBlockHash::Bytes(b) if b.len() == 32))
            ),
        }
    }
}

#[tokio::test]
async fn a_live_subscriber_receives_batches() {
    let (cfg, endpoint, _) = with_events(mk_config(EngineKind::Vllm));
    let worker = start(cfg).await;
    let mut sub = SubSocket::new();
    sub.connect(&endpoint).await.unwrap();
    sub.subscribe("kv-events").await.unwrap();
    // A SUB only sees what is published after its subscription reaches the PUB; keep
    // making fresh blocks until one arrives (bounded).
    for attempt in 0..50 {
        complete(
            &worker,
            &format!("attempt {attempt} with enough text to fill a block or two"),
        )
        .await;
        if let Ok(msg) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            let frames = msg.unwrap().into_vec();
            let parts: Vec<&[u8]> = frames.iter().map(|b| b.as_ref()).collect();
            let parsed = parse_zmq_frames(&parts).unwrap();
            assert_eq!(parsed.topic, b"kv-events");
            let batch = decode_kv_event_batch(parsed.payload).unwrap();
            assert!(matches!(batch.events[0], KvEvent::BlockStored(_)));
            return;
        }
    }
    panic!("no KV event reached the subscriber");
}

#[tokio::test]
async fn evicted_blocks_are_published_as_removed() {
    let mut cfg = mk_config(EngineKind::Vllm);
    cfg.core.kv_blocks = 12;
    let (cfg, _, replay) = with_events(cfg);
    let worker = start(cfg).await;
    for i in 0..4 {
        complete(
            &worker,
            &format!("{i} distinct prompt that spans several blocks of tokens"),
        )
        .await;
    }
    let batches = replay_all(&replay).await;
    let stored_hashes: Vec<EngineBlockHash> =
        stored(&batches).into_iter().flat_map(|(h, _)| h).collect();
    let removed: Vec<EngineBlockHash> = batches
        .iter()
        .flat_map(|(_, b)| &b.events)
        .filter_map(|e| match e {
            KvEvent::BlockRemoved(r) => Some(r.block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(
        !removed.is_empty(),
        "12 blocks cannot hold four 4-block prompts"
    );
    assert!(
        removed.iter().all(|h| stored_hashes.contains(h)),
        "only stored blocks are removed"
    );
}

#[tokio::test]
async fn resetting_the_cache_publishes_all_blocks_cleared() {
    let (cfg, _, replay) = with_events(mk_config(EngineKind::Vllm));
    let worker = start(cfg).await;
    complete(&worker, "some prompt that is long enough to fill one block").await;
    let r = reqwest::Client::new()
        .post(url(&worker, "/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let batches = replay_all(&replay).await;
        if batches
            .iter()
            .any(|(_, b)| b.events.contains(&KvEvent::AllBlocksCleared))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no AllBlocksCleared published"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
