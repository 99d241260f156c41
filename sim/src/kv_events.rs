//! Turning the cache's stored/removed blocks into an engine's KV-event batches, and
//! publishing them on ZMQ: a PUB socket sending `(topic, 8-byte big-endian sequence,
//! payload)` and, when configured, a ROUTER replay socket that answers a starting
//! sequence with every buffered `(sequence, payload)` from there, then `(-1, "")`.
//!
//! Engine hashes deliberately differ from the router's chain (vLLM: 32-byte digests;
//! SGLang: ints), as a real engine's do: the router must re-hash `token_ids`.

use crate::kv_cache::{BlockKey, PoolEvent};
use bytes::Bytes;
use infera_proto::kv_events::encode::{KvEventFormat, encode_kv_event_batch};
use infera_proto::kv_events::{
    BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventBatch, KvEventLayout,
};
use infera_proto::kv_stream::{REPLAY_END_SEQUENCE, encode_sequence};
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use xxhash_rust::xxh3::xxh3_64_with_seed;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Batches kept for replay.
pub const REPLAY_BUFFER: usize = 10_000;

/// Builds event batches the way one engine flavor would.
#[derive(Debug, Clone)]
pub struct KvEventConverter {
    /// Encoding (which engine version's classes).
    pub format: KvEventFormat,
    /// Engine hashes are ints rather than byte digests.
    pub int_hashes: bool,
    /// Tokens per block.
    pub block_size: u32,
    /// Data-parallel rank stamped on batches (vLLM layouts).
    pub dp_rank: Option<u32>,
}

impl KvEventConverter {
    /// The engine's hash of the block with router key `key`.
    pub fn engine_hash(&self, key: BlockKey) -> EngineBlockHash {
        if self.int_hashes {
            EngineBlockHash::Int(i128::from(xxh3_64_with_seed(&key.to_le_bytes(), 1) as i64))
        } else {
            let mut h = Sha256::new();
            h.update(key.to_le_bytes());
            h.update(b"infera-sim");
            EngineBlockHash::Bytes(h.finalize().to_vec())
        }
    }

    /// A batch for cache events; consecutive stored blocks of one chain share an event.
    pub fn convert(&self, events: &[PoolEvent]) -> KvEventBatch {
        let mut out: Vec<KvEvent> = Vec::new();
        let mut last_key: Option<BlockKey> = None;
        for event in events {
            match event {
                PoolEvent::Stored {
                    key,
                    parent,
                    tokens,
                } => {
                    if let (Some(KvEvent::BlockStored(s)), true) =
                        (out.last_mut(), last_key.is_some() && *parent == last_key)
                    {
                        s.block_hashes.push(self.engine_hash(*key));
                        s.token_ids.extend_from_slice(tokens);
                    } else {
                        out.push(KvEvent::BlockStored(self.stored(*key, *parent, tokens)));
                    }
                    last_key = Some(*key);
                }
                PoolEvent::Removed { key } => {
                    last_key = None;
                    if let Some(KvEvent::BlockRemoved(r)) = out.last_mut() {
                        r.block_hashes.push(self.engine_hash(*key));
                    } else {
                        out.push(KvEvent::BlockRemoved(BlockRemoved {
                            block_hashes: vec![self.engine_hash(*key)],
                            medium: self.vllm().then(|| "GPU".to_owned()),
                            group_idx: self.tagged().then_some(0),
                        }));
                    }
                }
            }
        }
        self.batch(out)
    }

    /// A batch storing a run of blocks, block 0 first (its first block has no parent),
    /// on `medium`: how a connector reports the blocks it wrote below HBM.
    pub fn stored_run(&self, keys: &[BlockKey], tokens: &[Vec<u32>], medium: &str) -> KvEventBatch {
        let mut event = self.stored(keys[0], None, &tokens[0]);
        for (key, t) in keys.iter().zip(tokens).skip(1) {
            event.block_hashes.push(self.engine_hash(*key));
            event.token_ids.extend_from_slice(t);
        }
        event.medium = Some(medium.to_owned());
        self.batch(vec![KvEvent::BlockStored(event)])
    }

    /// A batch removing blocks from `medium`.
    pub fn removed_run(&self, keys: &[BlockKey], medium: &str) -> KvEventBatch {
        self.batch(vec![KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: keys.iter().map(|k| self.engine_hash(*k)).collect(),
            medium: Some(medium.to_owned()),
            group_idx: self.tagged().then_some(0),
        })])
    }

    /// A batch holding one `AllBlocksCleared`.
    pub fn cleared(&self) -> KvEventBatch {
        self.batch(vec![KvEvent::AllBlocksCleared])
    }

    fn vllm(&self) -> bool {
        self.format != KvEventFormat::Sglang
    }

    fn tagged(&self) -> bool {
        matches!(
            self.format,
            KvEventFormat::VllmTaggedMap | KvEventFormat::VllmMapBatch
        )
    }

    fn stored(&self, key: BlockKey, parent: Option<BlockKey>, tokens: &[u32]) -> BlockStored {
        BlockStored {
            block_hashes: vec![self.engine_hash(key)],
            parent_block_hash: parent.map(|p| self.engine_hash(p)),
            token_ids: tokens.to_vec(),
            block_size: self.block_size,
            medium: self.vllm().then(|| "GPU".to_owned()),
            group_idx: self.tagged().then_some(0),
            kv_cache_spec_kind: self.tagged().then(|| "full_attention".to_owned()),
            ..Default::default()
        }
    }

    fn batch(&self, events: Vec<KvEvent>) -> KvEventBatch {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        KvEventBatch {
            ts,
            events,
            data_parallel_rank: if self.vllm() { self.dp_rank } else { None },
            layout: KvEventLayout::Array,
        }
    }
}

/// Where and how to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsEndpoint {
    /// PUB endpoint, e.g. `tcp://127.0.0.1:5557` (`*` binds every interface).
    pub endpoint: String,
    /// ROUTER replay endpoint.
    pub replay_endpoint: Option<String>,
    /// Topic frame.
    pub topic: String,
}

/// Binds the sockets and returns the task that publishes batches from `rx`.
pub async fn start_publisher(
    cfg: &KvEventsEndpoint,
    format: KvEventFormat,
    mut rx: mpsc::UnboundedReceiver<KvEventBatch>,
) -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    let mut publisher = PubSocket::new();
    publisher
        .bind(&bind_form(&cfg.endpoint))
        .await
        .map_err(|e| anyhow::anyhow!("binding KV event endpoint {}: {e}", cfg.endpoint))?;
    let mut replay = match &cfg.replay_endpoint {
        Some(endpoint) => {
            let mut router = RouterSocket::new();
            router
                .bind(&bind_form(endpoint))
                .await
                .map_err(|e| anyhow::anyhow!("binding KV replay endpoint {endpoint}: {e}"))?;
            Some(router)
        }
        None => None,
    };
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    Ok(async move {
        let mut buffer: VecDeque<(i64, Bytes)> = VecDeque::new();
        let mut seq: i64 = 0;
        loop {
            tokio::select! {
                // Batches first: a replay request must see every batch the engine emitted
                // before the request was made.
                biased;
                batch = rx.recv() => {
                    let Some(batch) = batch else { return };
                    let payload = Bytes::from(encode_kv_event_batch(&batch, format));
                    let frames = vec![
                        topic.clone(),
                        Bytes::copy_from_slice(&encode_sequence(seq)),
                        payload.clone(),
                    ];
                    if let Ok(msg) = ZmqMessage::try_from(frames) {
                        let _ = publisher.send(msg).await;
                    }
                    buffer.push_back((seq, payload));
                    if buffer.len() > REPLAY_BUFFER {
                        buffer.pop_front();
                    }
                    seq += 1;
                }
                request = recv_replay(&mut replay) => {
                    if let (Some(router), Ok(request)) = (replay.as_mut(), request) {
                        serve_replay(router, request, &buffer).await;
                    }
                }
            }
        }
    })
}

/// ZMQ's `tcp://*:P` is `tcp://0.0.0.0:P` for this library.
fn bind_form(endpoint: &str) -> String {
    endpoint.replace("://*:", "://0.0.0.0:")
}

async fn recv_replay(replay: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match replay {
        Some(router) => router.recv().await,
        None => std::future::pending().await,
    }
}

/// `[identity, "", start]` from a REQ/DEALER client (or `[identity, start]`).
async fn serve_replay(
    router: &mut RouterSocket,
    request: ZmqMessage,
    buffer: &VecDeque<(i64, Bytes)>,
) {
    let frames = request.into_vec();
    let (Some(identity), Some(start)) = (frames.first(), frames.last()) else {
        return;
    };
    let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(i64::from_be_bytes) else {
        return;
    };
    let reply = |seq: i64, payload: Bytes| {
        ZmqMessage::try_from(vec![
            identity.clone(),
            Bytes::new(),
            Bytes::copy_from_slice(&encode_sequence(seq)),
            payload,
        ])
    };
    for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
        if let Ok(msg) = reply(*seq, payload.clone()) {
            let _ = router.send(msg).await;
        }
    }
    if let Ok(msg) = reply(REPLAY_END_SEQUENCE, Bytes::new()) {
        let _ = router.send(msg).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn converter(format: KvEventFormat, int_hashes: bool) -> KvEventConverter {
        KvEventConverter {
            format,
            int_hashes,
            block_size: 2,
            dp_rank: None,
        }
    }

    #[test]
    fn groups_a_chain_into_one_stored_event() {
        let c = converter(KvEventFormat::VllmTaggedMap, false);
        let batch = c.convert(&[
            PoolEvent::Stored {
                key: 1,
                parent: None,
                tokens: vec![1, 2],
            },
            PoolEvent::Stored {
                key: 2,
                parent: Some(1),
                tokens: vec![3, 4],
            },
            PoolEvent::Stored {
                key: 9,
                parent: None,
                tokens: vec![7, 7],
            },
            PoolEvent::Removed { key: 5 },
            PoolEvent::Removed { key: 6 },
        ]);
        assert_eq!(batch.events.len(), 3);
        let KvEvent::BlockStored(s) = &batch.events[0] else {
            panic!()
        };
        assert_eq!(s.block_hashes.len(), 2);
        assert_eq!(s.token_ids, vec![1, 2, 3, 4]);
        assert!(matches!(&s.block_hashes[0], EngineBlockHash::Bytes(b) if b.len() == 32));
        assert_eq!(s.kv_cache_spec_kind.as_deref(), Some("full_attention"));
        let KvEvent::BlockRemoved(r) = &batch.events[2] else {
            panic!()
        };
        assert_eq!(r.block_hashes.len(), 2);
    }

    #[test]
    fn sglang_uses_int_hashes_and_no_vllm_fields() {
        let c = converter(KvEventFormat::Sglang, true);
        let batch = c.convert(&[PoolEvent::Stored {
            key: 1,
            parent: Some(0),
            tokens: vec![1, 2],
        }]);
        let KvEvent::BlockStored(s) = &batch.events[0] else {
            panic!()
        };
        assert!(matches!(s.block_hashes[0], EngineBlockHash::Int(_)));
        assert_eq!(s.medium, None);
        assert_eq!(s.parent_block_hash, Some(c.engine_hash(0)));
    }
}
