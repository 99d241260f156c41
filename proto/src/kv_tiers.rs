//! Where a block's KV lives beyond the engine's own memory, and what loading it back
//! costs: the tier names of KV events' `medium` and of worker records' `kv.tiers`, and
//! the load-time model a worker declares in its record and the router scores with.
//!
//! A worker record keeps the earlier launchers' `kv.tiers` (a list of names; they wrote
//! `["device"]`) and adds, as fields the earlier reader keeps verbatim:
//!
//! ```json
//! "kv": {"tiers": ["device", "host", "remote"],
//!        "tier_costs": {"host": {"rtt_ms": 0.1, "gbytes_per_s": 54.8},
//!                       "remote": {"rtt_ms": 0.37, "gbytes_per_s": 0.338}},
//!        "kv_bytes_per_token": 131072, "prefill_ms_per_token": 0.0261, ...}
//! ```
//!
//! Loading `n` tokens from a tier costs `rtt_ms + n × kv_bytes_per_token / rate`; the
//! engine recomputes them instead at about `n × prefill_ms_per_token`. A block run is
//! worth loading only when that is cheaper, so a short run on a slow tier (its round
//! trip dominates) is recomputed and a long one loaded. [`run_cost`] gives the cost of a
//! run in blocks' worth of recomputation, the unit of the router's cost.

use crate::worker::{KvInfo, WorkerRecord};
use serde_json::{Map, Value, json};

/// A place a block's KV can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KvTier {
    /// The engine's own memory (HBM).
    Device,
    /// Host RAM beside the engine (kvd's RAM).
    Host,
    /// Local NVMe beside the engine (kvd's L3).
    Disk,
    /// A store every worker of the model reaches (kvd's Redis/Valkey tier).
    Remote,
}

impl KvTier {
    /// The tiers below the device, fastest first.
    pub const LOWER: [KvTier; 3] = [KvTier::Host, KvTier::Disk, KvTier::Remote];

    /// The tier of a KV event's `medium`, as engines and their connectors write it
    /// (vLLM: `GPU`, `CPU`; newer secondary tiers `STORAGE`; SGLang writes none).
    /// `None` for a medium this version does not know (the event is not applied).
    pub fn from_medium(medium: Option<&str>) -> Option<Self> {
        let Some(m) = medium else {
            return Some(Self::Device);
        };
        Some(match m.to_ascii_uppercase().as_str() {
            "GPU" | "DEVICE" | "HBM" => Self::Device,
            "CPU" | "CPU_PINNED" | "CPU_TIER1" | "HOST" | "RAM" => Self::Host,
            "CPU_TIER2" | "DISK" | "NVME" | "STORAGE" | "FILE" => Self::Disk,
            "REMOTE" | "EXTERNAL" | "SHARED" | "NETWORK" => Self::Remote,
            _ => return None,
        })
    }

    /// The `medium` a KV event gives blocks on this tier.
    pub fn medium(self) -> &'static str {
        match self {
            Self::Device => "GPU",
            Self::Host => "CPU",
            Self::Disk => "DISK",
            Self::Remote => "REMOTE",
        }
    }

    /// The name in a record's `kv.tiers`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Device => "device",
            Self::Host => "host",
            Self::Disk => "disk",
            Self::Remote => "remote",
        }
    }

    /// The tier of a `kv.tiers` name; unknown names are `None` (and ignored).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "device" => Self::Device,
            "host" => Self::Host,
            "disk" => Self::Disk,
            "remote" => Self::Remote,
            _ => return None,
        })
    }

    /// A bit for tier sets.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A tier or a tier's cost as a command line states it, refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TierSpecError {
    /// Not one of the tiers below the device.
    #[error("{0:?}: expected host, disk or remote")]
    UnknownTier(String),
    /// Not `TIER=RTT_MS:GBYTES_PER_S` with a round trip of 0 or more and a positive rate.
    #[error("{0:?}: expected TIER=RTT_MS:GBYTES_PER_S, e.g. host=0.1:54.8")]
    BadCost(String),
}

impl KvTier {
    /// A tier below the device as `--kv-tiers` and `--kvd-tiers` name it (`host`, `disk`,
    /// `remote`, or another of [`KvTier::from_name`]'s names).
    pub fn parse_lower(name: &str) -> Result<Self, TierSpecError> {
        Self::from_name(name.trim())
            .filter(|t| *t != Self::Device)
            .ok_or_else(|| TierSpecError::UnknownTier(name.to_owned()))
    }
}

/// What loading from one tier costs: a round trip, then the bytes at a rate (tier read
/// through to device memory).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierCost {
    /// Fixed time per load (ms).
    pub rtt_ms: f64,
    /// Bytes moved per second, in GB/s (10^9).
    pub gbytes_per_s: f64,
}

impl TierCost {
    /// Time to load `bytes` (ms).
    pub fn load_ms(&self, bytes: f64) -> f64 {
        self.rtt_ms + bytes / (self.gbytes_per_s.max(1e-9) * 1e6)
    }

    /// `TIER=RTT_MS:GBYTES_PER_S`, as `--kv-tier-cost` and `--kvd-tier-cost` state a
    /// tier's cost.
    pub fn parse_stated(item: &str) -> Result<(KvTier, Self), TierSpecError> {
        let bad = || TierSpecError::BadCost(item.to_owned());
        let (tier, cost) = item.trim().split_once('=').ok_or_else(bad)?;
        let tier = KvTier::parse_lower(tier).map_err(|_| bad())?;
        let (rtt, rate) = cost.split_once(':').ok_or_else(bad)?;
        let cost = Self {
            rtt_ms: rtt.parse().map_err(|_| bad())?,
            gbytes_per_s: rate.parse().map_err(|_| bad())?,
        };
        if !(cost.rtt_ms >= 0.0 && cost.gbytes_per_s > 0.0 && cost.gbytes_per_s.is_finite()) {
            return Err(bad());
        }
        Ok((tier, cost))
    }

    /// The last of `stated` for `tier`, else its measured default.
    pub fn stated_or_measured(stated: &[(KvTier, TierCost)], tier: KvTier) -> Option<Self> {
        stated
            .iter()
            .rev()
            .find(|(t, _)| *t == tier)
            .map(|(_, c)| *c)
            .or_else(|| Self::measured(tier))
    }

    /// The measured default of a lower tier (`bench/RESULTS.md`, S6, and `calib/`):
    /// - host: an engine DMAs kvd's arena to the device, so a load is kvd's arena GET
    ///   round trip (about 0.1 ms) and the pinned host-to-device copy (54.8 GB/s);
    /// - disk: the 4,096-token (512 MiB) reload from kvd's NVMe tier took 1,214 ms on
    ///   the reference VM's disk, plus 10 ms host-to-device: 0.439 GB/s; 1 ms a read;
    /// - remote: the same reload from Redis on the same host took 1,579 ms, plus 10 ms:
    ///   0.338 GB/s; a 1 MiB get's p50 round trip, 0.37 ms.
    pub fn measured(tier: KvTier) -> Option<Self> {
        match tier {
            KvTier::Device => None,
            KvTier::Host => Some(Self {
                rtt_ms: 0.1,
                gbytes_per_s: 54.8,
            }),
            KvTier::Disk => Some(Self {
                rtt_ms: 1.0,
                gbytes_per_s: 0.439,
            }),
            KvTier::Remote => Some(Self {
                rtt_ms: 0.37,
                gbytes_per_s: 0.338,
            }),
        }
    }
}

/// The 8B model's KV bytes per token (`sim/profiles/h200-llama-3.1-8b.json`), the
/// declared default when a worker states none.
pub const DEFAULT_KV_BYTES_PER_TOKEN: u64 = 131_072;

/// The 8B model's prefill cost per token on an H200 (`calib/`: c1 of the fitted
/// prefill model), the declared default when a worker states none.
pub const DEFAULT_PREFILL_MS_PER_TOKEN: f64 = 0.0261;

/// A worker's tiers below the device and what each costs, as its record declares them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeclaredTiers {
    /// Each declared lower tier and its cost.
    pub costs: Vec<(KvTier, TierCost)>,
    /// KV bytes of one token.
    pub kv_bytes_per_token: u64,
    /// Time to prefill one token (ms).
    pub prefill_ms_per_token: f64,
}

impl DeclaredTiers {
    /// What a record's `kv` declares: `tiers` as a list of names (or one name), each
    /// lower tier's cost from `tier_costs` or its measured default. A record without
    /// `kv` or `tiers`, or with only `device` (every earlier record), declares none.
    pub fn from_kv(kv: Option<&KvInfo>) -> Self {
        let Some(kv) = kv else {
            return Self::default();
        };
        let names: Vec<&str> = match &kv.tiers {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            Some(Value::String(s)) => vec![s.as_str()],
            _ => Vec::new(),
        };
        let given = kv.extra.get("tier_costs").and_then(Value::as_object);
        let costs = names
            .iter()
            .filter_map(|n| KvTier::from_name(n))
            .filter(|t| *t != KvTier::Device)
            .filter_map(|t| {
                let stated = given
                    .and_then(|g| g.get(t.name()))
                    .and_then(|c| {
                        Some(TierCost {
                            rtt_ms: c.get("rtt_ms")?.as_f64()?,
                            gbytes_per_s: c.get("gbytes_per_s")?.as_f64()?,
                        })
                    })
                    .filter(|c| c.rtt_ms >= 0.0 && c.gbytes_per_s > 0.0);
                stated.or(TierCost::measured(t)).map(|c| (t, c))
            })
            .collect();
        let kv_bytes_per_token = kv
            .extra
            .get("kv_bytes_per_token")
            .and_then(Value::as_u64)
            .filter(|b| *b > 0)
            .unwrap_or(DEFAULT_KV_BYTES_PER_TOKEN);
        let prefill_ms_per_token = kv
            .extra
            .get("prefill_ms_per_token")
            .and_then(Value::as_f64)
            .filter(|m| *m > 0.0)
            .unwrap_or(DEFAULT_PREFILL_MS_PER_TOKEN);
        Self {
            costs,
            kv_bytes_per_token,
            prefill_ms_per_token,
        }
    }

    /// The cost of a declared lower tier; `None` when not declared.
    pub fn cost(&self, tier: KvTier) -> Option<TierCost> {
        self.costs.iter().find(|(t, _)| *t == tier).map(|(_, c)| *c)
    }

    /// Whether any lower tier is declared.
    pub fn any(&self) -> bool {
        !self.costs.is_empty()
    }

    /// The `kv` fields declaring these tiers (`tiers` with `device` first, then
    /// `tier_costs`, `kv_bytes_per_token`, `prefill_ms_per_token`), to merge into a
    /// record's `kv` block.
    pub fn to_fields(&self) -> Map<String, Value> {
        let mut names = vec![json!("device")];
        let mut costs = Map::new();
        for (t, c) in &self.costs {
            names.push(json!(t.name()));
            costs.insert(
                t.name().to_owned(),
                json!({"rtt_ms": c.rtt_ms, "gbytes_per_s": c.gbytes_per_s}),
            );
        }
        let mut out = Map::new();
        out.insert("tiers".into(), Value::Array(names));
        out.insert("tier_costs".into(), Value::Object(costs));
        out.insert("kv_bytes_per_token".into(), json!(self.kv_bytes_per_token));
        out.insert(
            "prefill_ms_per_token".into(),
            json!(self.prefill_ms_per_token),
        );
        out
    }
}

impl DeclaredTiers {
    /// Declares these tiers on `record`: into its `kv` block, or a `kv` block of its own
    /// that states nothing else (no tokenizer, an empty canary) when it has none.
    pub fn declare_on(&self, record: &mut WorkerRecord) {
        let mut kv = match record.kv.take() {
            Some(kv) => kv,
            None => {
                let block = record.kv_block_size.unwrap_or(16);
                let minimal = json!({"engine_block_size": block, "index_block_size": 64,
                                     "tokenizer": null, "tokenizer_digest": null,
                                     "tokenizer_canary": []});
                match serde_json::from_value::<KvInfo>(minimal) {
                    Ok(kv) => kv,
                    Err(_) => return,
                }
            }
        };
        for (key, value) in self.to_fields() {
            if key == "tiers" {
                kv.tiers = Some(value);
            } else {
                kv.extra.insert(key, value);
            }
        }
        record.kv = Some(kv);
    }
}

/// The cost of making `blocks` blocks of `block_tokens` tokens ready from `tier` at
/// `cost`, in blocks' worth of recomputation: the load time over the time to recompute
/// one block, but never more than recomputing them (`blocks`): the engine recomputes a
/// run that loads slower.
pub fn run_cost(
    cost: TierCost,
    blocks: usize,
    block_tokens: usize,
    kv_bytes_per_token: u64,
    prefill_ms_per_token: f64,
) -> f64 {
    if blocks == 0 {
        return 0.0;
    }
    let tokens = (blocks * block_tokens) as f64;
    let load = cost.load_ms(tokens * kv_bytes_per_token as f64);
    let per_block = block_tokens as f64 * prefill_ms_per_token.max(1e-9);
    (load / per_block).min(blocks as f64)
}

/// The shortest run of blocks worth loading from a tier rather than recomputing: the
/// crossover, `None` when loading never pays (the tier moves bytes slower than the
/// engine recomputes them).
pub fn crossover_blocks(
    cost: TierCost,
    block_tokens: usize,
    kv_bytes_per_token: u64,
    prefill_ms_per_token: f64,
) -> Option<usize> {
    let per_block_load =
        block_tokens as f64 * kv_bytes_per_token as f64 / (cost.gbytes_per_s.max(1e-9) * 1e6);
    let per_block_recompute = block_tokens as f64 * prefill_ms_per_token;
    if per_block_load >= per_block_recompute {
        return None;
    }
    Some(
        (cost.rtt_ms / (per_block_recompute - per_block_load))
            .ceil()
            .max(1.0) as usize,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: Value) -> KvInfo {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn stated_tiers_and_costs_parse_or_say_what_is_expected() {
        assert_eq!(KvTier::parse_lower("host"), Ok(KvTier::Host));
        assert_eq!(KvTier::parse_lower(" disk"), Ok(KvTier::Disk));
        assert_eq!(
            KvTier::parse_lower("gpu"),
            Err(TierSpecError::UnknownTier("gpu".into()))
        );
        assert_eq!(
            TierCost::parse_stated("remote=0.37:20"),
            Ok((
                KvTier::Remote,
                TierCost {
                    rtt_ms: 0.37,
                    gbytes_per_s: 20.0
                }
            ))
        );
        for bad in [
            "remote",
            "remote=1",
            "device=1:1",
            "host=-1:1",
            "host=1:0",
            "host=1:inf",
        ] {
            assert_eq!(
                TierCost::parse_stated(bad),
                Err(TierSpecError::BadCost(bad.into())),
                "{bad}"
            );
        }
        let stated = [(
            KvTier::Disk,
            TierCost {
                rtt_ms: 1.0,
                gbytes_per_s: 7.0,
            },
        )];
        assert_eq!(
            TierCost::stated_or_measured(&stated, KvTier::Disk),
            Some(stated[0].1)
        );
        assert_eq!(
            TierCost::stated_or_measured(&stated, KvTier::Host),
            TierCost::measured(KvTier::Host)
        );
        assert_eq!(TierCost::stated_or_measured(&stated, KvTier::Device), None);
    }

    fn base() -> Value {
        json!({"engine_block_size": 16, "index_block_size": 64, "tokenizer": null,
               "tokenizer_digest": null, "tokenizer_canary": []})
    }

    #[test]
    fn media_map_to_tiers_as_engines_and_connectors_name_them() {
        for (medium, tier) in [
            (None, Some(KvTier::Device)),
            (Some("GPU"), Some(KvTier::Device)),
            (Some("cpu"), Some(KvTier::Host)),
            (Some("CPU_TIER2"), Some(KvTier::Disk)),
            (Some("STORAGE"), Some(KvTier::Disk)),
            (Some("REMOTE"), Some(KvTier::Remote)),
            (Some("TAPE"), None),
        ] {
            assert_eq!(KvTier::from_medium(medium), tier, "{medium:?}");
        }
        for t in [KvTier::Device, KvTier::Host, KvTier::Disk, KvTier::Remote] {
            assert_eq!(KvTier::from_medium(Some(t.medium())), Some(t));
            assert_eq!(KvTier::from_name(t.name()), Some(t));
        }
    }

    #[test]
    fn earlier_records_declare_no_lower_tier_and_ours_round_trip() {
        let mut v = base();
        v["tiers"] = json!(["device"]);
        assert!(!DeclaredTiers::from_kv(Some(&kv(v))).any());
        assert!(!DeclaredTiers::from_kv(None).any());
        let mut v = base();
        v["tiers"] = json!("device");
        assert!(!DeclaredTiers::from_kv(Some(&kv(v))).any());
        // Declared with defaults, then written and read back.
        let mut v = base();
        v["tiers"] = json!(["device", "host", "remote", "tape"]);
        let declared = DeclaredTiers::from_kv(Some(&kv(v)));
        assert_eq!(
            declared.costs.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            [KvTier::Host, KvTier::Remote]
        );
        assert_eq!(
            declared.cost(KvTier::Host),
            TierCost::measured(KvTier::Host)
        );
        let mut v = base();
        for (k, val) in declared.to_fields() {
            v[k] = val;
        }
        assert_eq!(DeclaredTiers::from_kv(Some(&kv(v))), declared);
    }

    #[test]
    fn short_runs_on_a_slow_round_trip_are_recomputed_and_long_ones_loaded() {
        let (bs, bytes, ms) = (16, DEFAULT_KV_BYTES_PER_TOKEN, DEFAULT_PREFILL_MS_PER_TOKEN);
        let host = TierCost::measured(KvTier::Host).unwrap();
        // Host RAM through DMA: a 2 MiB block loads in 0.04 ms against 0.42 ms to
        // recompute; the 0.1 ms round trip is paid back from the first block.
        assert_eq!(crossover_blocks(host, bs, bytes, ms), Some(1));
        let c = run_cost(host, 256, bs, bytes, ms);
        assert!(c < 256.0 * 0.15, "{c}");
        // A tier with a long round trip and a fast rate: short runs recompute.
        let far = TierCost {
            rtt_ms: 5.0,
            gbytes_per_s: 54.8,
        };
        let n = crossover_blocks(far, bs, bytes, ms).unwrap();
        assert!(n > 1);
        assert_eq!(run_cost(far, n - 1, bs, bytes, ms), (n - 1) as f64);
        assert!(run_cost(far, 4 * n, bs, bytes, ms) < (4 * n) as f64);
        // This VM's NVMe and Redis move bytes slower than an H200 recomputes them.
        for t in [KvTier::Disk, KvTier::Remote] {
            let c = TierCost::measured(t).unwrap();
            assert_eq!(crossover_blocks(c, bs, bytes, ms), None, "{t:?}");
            assert_eq!(run_cost(c, 64, bs, bytes, ms), 64.0);
        }
    }
}
