//! Encoding KV-event batches exactly as each engine's msgspec classes do, so the
//! simulator publishes bytes a real engine's consumers (and ours) cannot tell apart.
//!
//! msgspec rules reproduced here (checked against msgspec 0.23): integers in their
//! smallest msgpack form, floats always float64; array-like structs write every field,
//! defaults included (`omit_defaults` does not shorten arrays); map structs drop fields
//! whose value equals their default, write fields without a default always (nil if
//! `None`), and tagged ones write `"type"` first, then fields in declaration order.
//! Round-trip tests re-encode the checked-in fixtures byte for byte.

use super::{BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventBatch};
use rmpv::Value;

/// Which engine version's classes to encode with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvEventFormat {
    /// SGLang: array batch `[ts, events]`, array events without `medium`.
    Sglang,
    /// vLLM 0.10.x: array batch with rank, array events with `medium`.
    VllmArray,
    /// vLLM 0.25.x and ATOM: array batch, tagged-map events.
    VllmTaggedMap,
    /// vLLM main: map batch, tagged-map events.
    VllmMapBatch,
}

/// Encodes `batch` in `format`. Fields a format does not have are not written.
pub fn encode_kv_event_batch(batch: &KvEventBatch, format: KvEventFormat) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(256));
    let rank = batch.data_parallel_rank;
    match format {
        KvEventFormat::Sglang => w.array(2),
        KvEventFormat::VllmArray | KvEventFormat::VllmTaggedMap => w.array(3),
        KvEventFormat::VllmMapBatch => {
            w.map(if rank.is_some() { 3 } else { 2 });
            w.str("ts");
        }
    }
    w.f64(batch.ts);
    if format == KvEventFormat::VllmMapBatch {
        w.str("events");
    }
    w.array(batch.events.len());
    for event in &batch.events {
        match format {
            KvEventFormat::Sglang | KvEventFormat::VllmArray => w.array_event(event, format),
            KvEventFormat::VllmTaggedMap | KvEventFormat::VllmMapBatch => w.map_event(event),
        }
    }
    match (format, rank) {
        (KvEventFormat::Sglang, _) | (KvEventFormat::VllmMapBatch, None) => {}
        (KvEventFormat::VllmMapBatch, Some(rank)) => {
            w.str("data_parallel_rank");
            w.uint(u64::from(rank));
        }
        (_, Some(rank)) => w.uint(u64::from(rank)),
        (_, None) => w.nil(),
    }
    w.0
}

struct Writer(Vec<u8>);

// Writing msgpack into a Vec cannot fail: the io::Write impl of Vec never errors, so the
// results below are dropped on purpose.
impl Writer {
    fn array(&mut self, len: usize) {
        let _ = rmp::encode::write_array_len(&mut self.0, len as u32);
    }
    fn map(&mut self, len: usize) {
        let _ = rmp::encode::write_map_len(&mut self.0, len as u32);
    }
    fn str(&mut self, s: &str) {
        let _ = rmp::encode::write_str(&mut self.0, s);
    }
    fn f64(&mut self, v: f64) {
        let _ = rmp::encode::write_f64(&mut self.0, v);
    }
    fn uint(&mut self, v: u64) {
        let _ = rmp::encode::write_uint(&mut self.0, v);
    }
    fn sint(&mut self, v: i64) {
        let _ = rmp::encode::write_sint(&mut self.0, v);
    }
    fn nil(&mut self) {
        let _ = rmp::encode::write_nil(&mut self.0);
    }
    fn value(&mut self, v: &Value) {
        let _ = rmpv::encode::write_value(&mut self.0, v);
    }

    fn hash(&mut self, h: &EngineBlockHash) {
        match h {
            EngineBlockHash::Bytes(b) => {
                let _ = rmp::encode::write_bin(&mut self.0, b);
            }
            EngineBlockHash::Int(i) => match (u64::try_from(*i), i64::try_from(*i)) {
                (Ok(u), _) => self.uint(u),
                (_, Ok(s)) => self.sint(s),
                // Out of msgpack's integer range: engines never send such hashes.
                _ => self.nil(),
            },
        }
    }
    fn hashes(&mut self, hashes: &[EngineBlockHash]) {
        self.array(hashes.len());
        hashes.iter().for_each(|h| self.hash(h));
    }
    fn opt_hash(&mut self, h: Option<&EngineBlockHash>) {
        match h {
            Some(h) => self.hash(h),
            None => self.nil(),
        }
    }
    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }
    fn opt_sint(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.sint(v),
            None => self.nil(),
        }
    }
    fn tokens(&mut self, tokens: &[u32]) {
        self.array(tokens.len());
        tokens.iter().for_each(|t| self.uint(u64::from(*t)));
    }

    fn array_event(&mut self, event: &KvEvent, format: KvEventFormat) {
        let vllm = format == KvEventFormat::VllmArray;
        match event {
            KvEvent::BlockStored(s) => {
                self.array(if vllm { 7 } else { 6 });
                self.str("BlockStored");
                self.stored_core(s);
                if vllm {
                    self.opt_str(s.medium.as_deref());
                }
            }
            KvEvent::BlockRemoved(r) => {
                self.array(if vllm { 3 } else { 2 });
                self.str("BlockRemoved");
                self.hashes(&r.block_hashes);
                if vllm {
                    self.opt_str(r.medium.as_deref());
                }
            }
            KvEvent::AllBlocksCleared => {
                self.array(1);
                self.str("AllBlocksCleared");
            }
        }
    }

    /// block_hashes, parent_block_hash, token_ids, block_size, lora_id.
    fn stored_core(&mut self, s: &BlockStored) {
        self.hashes(&s.block_hashes);
        self.opt_hash(s.parent_block_hash.as_ref());
        self.tokens(&s.token_ids);
        self.uint(u64::from(s.block_size));
        self.opt_sint(s.lora_id);
    }

    fn map_event(&mut self, event: &KvEvent) {
        match event {
            KvEvent::BlockStored(s) => self.stored_map(s),
            KvEvent::BlockRemoved(r) => self.removed_map(r),
            KvEvent::AllBlocksCleared => {
                self.map(1);
                self.str("type");
                self.str("AllBlocksCleared");
            }
        }
    }

    fn stored_map(&mut self, s: &BlockStored) {
        let optional = [
            s.extra_keys.is_some(),
            s.group_idx.is_some(),
            s.kv_cache_spec_kind.is_some(),
            s.kv_cache_spec_sliding_window.is_some(),
        ];
        // type + 7 fields without defaults + the defaulted ones that are set.
        self.map(8 + optional.iter().filter(|o| **o).count());
        self.str("type");
        self.str("BlockStored");
        self.str("block_hashes");
        self.hashes(&s.block_hashes);
        self.str("parent_block_hash");
        self.opt_hash(s.parent_block_hash.as_ref());
        self.str("token_ids");
        self.tokens(&s.token_ids);
        self.str("block_size");
        self.uint(u64::from(s.block_size));
        self.str("lora_id");
        self.opt_sint(s.lora_id);
        self.str("medium");
        self.opt_str(s.medium.as_deref());
        self.str("lora_name");
        self.opt_str(s.lora_name.as_deref());
        if let Some(keys) = &s.extra_keys {
            self.str("extra_keys");
            self.value(keys);
        }
        if let Some(g) = s.group_idx {
            self.str("group_idx");
            self.uint(u64::from(g));
        }
        if let Some(kind) = &s.kv_cache_spec_kind {
            self.str("kv_cache_spec_kind");
            self.str(kind);
        }
        if let Some(window) = s.kv_cache_spec_sliding_window {
            self.str("kv_cache_spec_sliding_window");
            self.uint(u64::from(window));
        }
    }

    fn removed_map(&mut self, r: &BlockRemoved) {
        self.map(if r.group_idx.is_some() { 4 } else { 3 });
        self.str("type");
        self.str("BlockRemoved");
        self.str("block_hashes");
        self.hashes(&r.block_hashes);
        self.str("medium");
        self.opt_str(r.medium.as_deref());
        if let Some(g) = r.group_idx {
            self.str("group_idx");
            self.uint(u64::from(g));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::decode_kv_event_batch;

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/testdata/kv_events/{name}.msgpack",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    #[test]
    fn re_encodes_every_fixture_byte_for_byte() {
        for (name, format) in [
            ("sglang", KvEventFormat::Sglang),
            ("vllm-array", KvEventFormat::VllmArray),
            ("vllm-tagged-map", KvEventFormat::VllmTaggedMap),
            ("vllm-map-batch", KvEventFormat::VllmMapBatch),
        ] {
            let bytes = fixture(name);
            let batch = decode_kv_event_batch(&bytes).unwrap();
            assert_eq!(encode_kv_event_batch(&batch, format), bytes, "{name}");
        }
    }

    #[test]
    fn encoded_batches_decode_back() {
        let batch = KvEventBatch {
            ts: 12.5,
            events: vec![
                KvEvent::BlockStored(BlockStored {
                    block_hashes: vec![EngineBlockHash::Int(300), EngineBlockHash::Int(-40_000)],
                    token_ids: vec![1, 70_000, 3, 4],
                    block_size: 2,
                    ..Default::default()
                }),
                KvEvent::AllBlocksCleared,
            ],
            data_parallel_rank: Some(2),
            layout: crate::kv_events::KvEventLayout::MapBatch,
        };
        for format in [
            KvEventFormat::VllmArray,
            KvEventFormat::VllmTaggedMap,
            KvEventFormat::VllmMapBatch,
        ] {
            let mut back = decode_kv_event_batch(&encode_kv_event_batch(&batch, format)).unwrap();
            back.layout = batch.layout;
            assert_eq!(back, batch, "{format:?}");
        }
        let sglang = decode_kv_event_batch(&encode_kv_event_batch(&batch, KvEventFormat::Sglang));
        assert_eq!(
            sglang.unwrap().data_parallel_rank,
            None,
            "SGLang batches carry no rank"
        );
    }
}
