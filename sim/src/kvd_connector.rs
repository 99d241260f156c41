//! The simulated engine's kvd connector: what an engine's KV connector does with the
//! kvd beside it, over kvd's real wire and its shared arena. It runs a blocking client
//! on a thread of its own (`infera-sim-kvd-<worker>`), so the engine loop never waits
//! on kvd:
//!
//! - before a request is scheduled, the API handler asks where its prompt's full blocks
//!   are below HBM (`batch_lookup_tier`) and reads the leading run's payloads through
//!   the arena (`batch_get`), as a connector loads them; the engine then charges the
//!   modelled load time of the real KV bytes ([`crate::core`]);
//! - a finished request's blocks (what leaves HBM as its blocks are unpinned, and later
//!   evicted) are stored (`batch_set`) under the request's retention class;
//! - once a second a reconciler looks up what it stored and reports what kvd dropped.
//!
//! Each store and each loss reaches the router as a KV event on the worker's own stream,
//! with the block's `medium`: `CPU` (kvd's RAM), `DISK` (its NVMe tier) and `REMOTE` (the
//! shared tier) for `long` blocks when kvd has those tiers. A payload is
//! `--kvd-payload-bytes` derived from the block's key (checked on every read), standing
//! for the block's real KV bytes, whose size the time model charges.
//!
//! When kvd is unreachable, a lookup answers nothing (the prompt is computed), a miss is
//! counted, the blocks stored in its RAM and NVMe tiers are reported removed, and the
//! connector reconnects (a restarted kvd has a new arena) once a second.

use crate::core::Offload;
use crate::kv_cache::BlockKey;
use crate::kv_events::KvEventConverter;
use crate::profile::LatencyProfile;
use infera_kvd::client::{Client, ClientScope};
use infera_kvd::wire::Location;
use infera_proto::kv_events::KvEventBatch;
use infera_proto::kv_tiers::{DeclaredTiers, KvTier, TierCost};
use infera_proto::retention::Retention;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// How long a request waits for the connector's answer before it is computed instead.
const LOOKUP_DEADLINE: Duration = Duration::from_millis(250);

/// Every read and write on kvd's socket is bounded by this.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// How often stored blocks are looked up again, and a lost kvd reconnected.
const RECONCILE: Duration = Duration::from_secs(1);

/// The connector's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KvdConfig {
    /// kvd's socket.
    pub socket: PathBuf,
    /// The tiers the kvd has below HBM (host always), and what loading from each costs.
    pub tiers: Vec<(KvTier, TierCost)>,
    /// Bytes stored per block, standing for its real KV bytes.
    pub payload_bytes: usize,
    /// The model the blocks belong to.
    pub model: String,
    /// The KV layout the blocks are valid for.
    pub compat_key: String,
}

impl KvdConfig {
    /// A simulated worker's connector to the kvd on `socket`, whose `tiers` below HBM
    /// (host always) load at their measured costs, with the tiers its record declares at
    /// the same costs.
    pub fn measured(
        socket: PathBuf,
        tiers: &[KvTier],
        profile: &LatencyProfile,
        block_size: usize,
        model: &str,
    ) -> (Self, DeclaredTiers) {
        let mut costs: Vec<(KvTier, TierCost)> = std::iter::once(KvTier::Host)
            .chain(tiers.iter().copied())
            .filter_map(|t| TierCost::measured(t).map(|c| (t, c)))
            .collect();
        costs.sort_by_key(|(t, _)| *t);
        costs.dedup_by_key(|(t, _)| *t);
        let declared = DeclaredTiers {
            costs: costs.clone(),
            kv_bytes_per_token: profile.kv_bytes_per_token,
            prefill_ms_per_token: profile.prefill_c1_ms_per_token,
        };
        let config = Self {
            socket,
            tiers: costs,
            payload_bytes: 4096,
            model: model.to_owned(),
            compat_key: format!("{}/bs{block_size}", profile.name),
        };
        (config, declared)
    }
}

/// What the connector counts (read by the metrics endpoint).
#[derive(Debug, Default)]
pub struct KvdCounters {
    /// Lookups by outcome: found blocks, found none, kvd unavailable.
    pub lookups_hit: AtomicU64,
    /// Lookups that found no block.
    pub lookups_miss: AtomicU64,
    /// Lookups answered with nothing because kvd was unreachable or late.
    pub lookups_unavailable: AtomicU64,
    /// Blocks kvd accepted.
    pub stored_blocks: AtomicU64,
    /// Payload bytes read back through the arena.
    pub read_bytes: AtomicU64,
    /// Payloads that did not hold their block's bytes (a bug if ever non-zero).
    pub payload_mismatches: AtomicU64,
    /// Whether kvd answers.
    pub up: AtomicBool,
}

enum Command {
    Lookup {
        keys: Vec<BlockKey>,
        reply: oneshot::Sender<Vec<KvTier>>,
    },
    Store(Offload),
}

/// The way the API handler and the engine reach the connector.
#[derive(Debug, Clone)]
pub struct KvdHandle {
    tx: std::sync::mpsc::Sender<Command>,
    /// Shared counters.
    pub counters: Arc<KvdCounters>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Lookup { keys, .. } => write!(f, "Lookup({} keys)", keys.len()),
            Self::Store(o) => write!(f, "Store({} blocks)", o.keys.len()),
        }
    }
}

impl KvdHandle {
    /// Starts the connector thread of worker `index`; KV events of stores and losses go
    /// to `events` when the worker publishes them.
    pub fn spawn(
        cfg: KvdConfig,
        index: usize,
        events: Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel();
        let counters = Arc::new(KvdCounters::default());
        let shared = counters.clone();
        // The client (and its mapping of kvd's arena) lives on the thread alone.
        std::thread::Builder::new()
            .name(format!("infera-sim-kvd-{index}"))
            .spawn(move || {
                Connector {
                    cfg,
                    client: None,
                    next_connect: Instant::now(),
                    advertised: HashMap::new(),
                    events,
                    counters: shared,
                }
                .run(rx)
            })?;
        Ok(Self { tx, counters })
    }

    /// Where the leading run of `keys` is below HBM (empty when none, or when kvd does
    /// not answer in time); its payloads were read through the arena.
    pub async fn lookup(&self, keys: Vec<BlockKey>) -> Vec<KvTier> {
        if keys.is_empty() {
            return Vec::new();
        }
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::Lookup { keys, reply }).is_err() {
            return Vec::new();
        }
        match tokio::time::timeout(LOOKUP_DEADLINE, rx).await {
            Ok(Ok(tiers)) => tiers,
            _ => {
                self.counters
                    .lookups_unavailable
                    .fetch_add(1, Ordering::Relaxed);
                Vec::new()
            }
        }
    }

    /// Hands a finished request's blocks to be stored.
    pub fn store(&self, offload: Offload) {
        let _ = self.tx.send(Command::Store(offload));
    }
}

/// The payload standing for block `key`'s KV: its key's bytes, repeated.
pub fn payload(key: BlockKey, bytes: usize) -> Vec<u8> {
    key.to_le_bytes()
        .iter()
        .copied()
        .cycle()
        .take(bytes.max(8))
        .collect()
}

/// The tiers a stored block reaches: kvd's RAM, and for a `long` block its NVMe and
/// shared tiers (kvd writes only `long` entries below RAM).
fn reached(retention: Retention, has: &[(KvTier, TierCost)]) -> Vec<KvTier> {
    let mut out = vec![KvTier::Host];
    if retention == Retention::Long {
        out.extend(
            [KvTier::Disk, KvTier::Remote]
                .into_iter()
                .filter(|t| has.iter().any(|(h, _)| h == t)),
        );
    }
    out
}

/// The tiers still holding a block kvd says is held at `location` (its fastest tier):
/// what was advertised minus what lies above it.
fn still_held(advertised: &[KvTier], location: Location) -> Vec<KvTier> {
    let from = match location {
        Location::Ram => KvTier::Host,
        Location::File => KvTier::Disk,
        Location::Remote => KvTier::Remote,
        Location::Miss => return Vec::new(),
    };
    advertised.iter().copied().filter(|t| *t >= from).collect()
}

/// Looks up where `keys` are and reads the leading run's payloads through the arena,
/// as a connector loads them; the run stops at the first block not found or not holding
/// its bytes. Returns the run's tiers, the bytes read and the mismatched payloads.
fn load_run(
    client: &mut Client,
    keys: &[BlockKey],
    wire: &[[u8; 8]],
    scope: &ClientScope,
    bytes: usize,
) -> std::io::Result<(Vec<KvTier>, u64, u64)> {
    let run: Vec<KvTier> = client
        .batch_lookup_tier(wire, scope)?
        .iter()
        .map_while(|l| match l {
            Location::Ram => Some(KvTier::Host),
            Location::File => Some(KvTier::Disk),
            Location::Remote => Some(KvTier::Remote),
            Location::Miss => None,
        })
        .collect();
    if run.is_empty() {
        return Ok((run, 0, 0));
    }
    let values = client.batch_get(&wire[..run.len()], scope)?;
    let (mut read, mut mismatched) = (0, 0);
    let mut loaded = Vec::with_capacity(run.len());
    for ((tier, value), key) in run.into_iter().zip(values).zip(keys) {
        let Some(value) = value else { break };
        read += value.len() as u64;
        if value != payload(*key, bytes) {
            mismatched += 1;
            break;
        }
        loaded.push(tier);
    }
    Ok((loaded, read, mismatched))
}

struct Stored {
    tiers: Vec<KvTier>,
    retention: Retention,
}

struct Connector {
    cfg: KvdConfig,
    client: Option<Client>,
    next_connect: Instant,
    /// Blocks stored, with the tiers advertised for them.
    advertised: HashMap<BlockKey, Stored>,
    events: Option<(KvEventConverter, mpsc::UnboundedSender<KvEventBatch>)>,
    counters: Arc<KvdCounters>,
}

impl Connector {
    fn scope(&self) -> ClientScope {
        ClientScope {
            model: self.cfg.model.clone(),
            compat_key: self.cfg.compat_key.clone(),
        }
    }

    fn run(mut self, rx: std::sync::mpsc::Receiver<Command>) {
        let mut next_reconcile = Instant::now() + RECONCILE;
        loop {
            let wait = next_reconcile.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Command::Lookup { keys, reply }) => {
                    let tiers = self.lookup(&keys);
                    let _ = reply.send(tiers);
                }
                Ok(Command::Store(offload)) => self.store(offload),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    self.reconcile();
                    next_reconcile = Instant::now() + RECONCILE;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn connected(&mut self) -> Option<&mut Client> {
        if self.client.is_none() && Instant::now() >= self.next_connect {
            self.next_connect = Instant::now() + RECONCILE;
            match Client::connect_within(&self.cfg.socket, "infera-sim", true, Some(IO_TIMEOUT)) {
                Ok(c) => {
                    tracing::info!("kvd connector: connected to {}", self.cfg.socket.display());
                    self.counters.up.store(true, Ordering::Relaxed);
                    self.client = Some(c);
                }
                Err(e) => {
                    tracing::debug!("kvd connector: {}: {e}", self.cfg.socket.display());
                }
            }
        }
        self.client.as_mut()
    }

    /// kvd stopped answering: what its RAM and NVMe held is gone for this worker.
    fn lost(&mut self, e: &std::io::Error) {
        tracing::warn!(
            "kvd connector: {} stopped answering ({e}); prompts are computed until it is back",
            self.cfg.socket.display()
        );
        self.client = None;
        self.counters.up.store(false, Ordering::Relaxed);
        let mut gone: HashMap<KvTier, Vec<BlockKey>> = HashMap::new();
        for (key, stored) in self.advertised.drain() {
            for t in stored.tiers {
                // The shared tier outlives this kvd: other workers still reach it.
                if t != KvTier::Remote {
                    gone.entry(t).or_default().push(key);
                }
            }
        }
        for (tier, keys) in gone {
            self.publish_removed(&keys, tier);
        }
    }

    fn lookup(&mut self, keys: &[BlockKey]) -> Vec<KvTier> {
        let scope = self.scope();
        let bytes = self.cfg.payload_bytes;
        let wire: Vec<[u8; 8]> = keys.iter().map(|k| k.to_le_bytes()).collect();
        let Some(client) = self.connected() else {
            self.counters
                .lookups_unavailable
                .fetch_add(1, Ordering::Relaxed);
            return Vec::new();
        };
        let found = load_run(client, keys, &wire, &scope, bytes);
        match found {
            Ok((tiers, read, mismatched)) => {
                self.counters.read_bytes.fetch_add(read, Ordering::Relaxed);
                self.counters
                    .payload_mismatches
                    .fetch_add(mismatched, Ordering::Relaxed);
                let counter = if tiers.is_empty() {
                    &self.counters.lookups_miss
                } else {
                    &self.counters.lookups_hit
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tiers
            }
            Err(e) => {
                self.counters
                    .lookups_unavailable
                    .fetch_add(1, Ordering::Relaxed);
                self.lost(&e);
                Vec::new()
            }
        }
    }

    fn store(&mut self, offload: Offload) {
        let retention = offload.retention;
        // Blocks already stored at this class or above are not written again.
        let fresh: Vec<usize> = (0..offload.keys.len())
            .filter(|i| {
                self.advertised
                    .get(&offload.keys[*i])
                    .is_none_or(|s| s.retention < retention)
            })
            .collect();
        if fresh.is_empty() || retention == Retention::None {
            return;
        }
        let class = retention.as_str();
        let items: Vec<([u8; 8], Vec<u8>, &str)> = fresh
            .iter()
            .map(|i| {
                let key = offload.keys[*i];
                (
                    key.to_le_bytes(),
                    payload(key, self.cfg.payload_bytes),
                    class,
                )
            })
            .collect();
        let scope = self.scope();
        let Some(client) = self.connected() else {
            return;
        };
        let accepted = match client.batch_set(&items, &scope) {
            Ok(a) => a,
            Err(e) => {
                self.lost(&e);
                return;
            }
        };
        let tiers = reached(retention, &self.cfg.tiers);
        let mut any = false;
        for (i, ok) in fresh.iter().zip(accepted) {
            if ok {
                any = true;
                self.counters.stored_blocks.fetch_add(1, Ordering::Relaxed);
                self.advertised.insert(
                    offload.keys[*i],
                    Stored {
                        tiers: tiers.clone(),
                        retention,
                    },
                );
            }
        }
        if any {
            // The whole chain, block 0 first: the router hashes it from the start.
            let held = offload
                .keys
                .iter()
                .take_while(|k| self.advertised.contains_key(k))
                .count();
            for tier in tiers {
                let keys: Vec<BlockKey> = offload.keys[..held]
                    .iter()
                    .copied()
                    .filter(|k| {
                        self.advertised
                            .get(k)
                            .is_some_and(|s| s.tiers.contains(&tier))
                    })
                    .collect();
                if keys.len() == held {
                    self.publish_stored(&keys, &offload.tokens[..held], tier);
                }
            }
        }
    }

    fn reconcile(&mut self) {
        if self.advertised.is_empty() {
            // Keeps the connection warm, and finds a kvd that came back.
            let _ = self.connected();
            return;
        }
        let keys: Vec<BlockKey> = self.advertised.keys().copied().collect();
        let wire: Vec<[u8; 8]> = keys.iter().map(|k| k.to_le_bytes()).collect();
        let scope = self.scope();
        let Some(client) = self.connected() else {
            return;
        };
        let locations = match client.batch_lookup_tier(&wire, &scope) {
            Ok(l) => l,
            Err(e) => {
                self.lost(&e);
                return;
            }
        };
        let mut gone: HashMap<KvTier, Vec<BlockKey>> = HashMap::new();
        for (key, location) in keys.into_iter().zip(locations) {
            let Some(stored) = self.advertised.get_mut(&key) else {
                continue;
            };
            let now = still_held(&stored.tiers, location);
            for t in stored.tiers.iter().filter(|t| !now.contains(t)) {
                gone.entry(*t).or_default().push(key);
            }
            stored.tiers = now;
            if stored.tiers.is_empty() {
                self.advertised.remove(&key);
            }
        }
        for (tier, keys) in gone {
            self.publish_removed(&keys, tier);
        }
    }

    fn publish_stored(&self, keys: &[BlockKey], tokens: &[Vec<u32>], tier: KvTier) {
        if let Some((converter, tx)) = &self.events {
            let _ = tx.send(converter.stored_run(keys, tokens, tier.medium()));
        }
    }

    fn publish_removed(&self, keys: &[BlockKey], tier: KvTier) {
        if let Some((converter, tx)) = &self.events
            && !keys.is_empty()
        {
            let _ = tx.send(converter.removed_run(keys, tier.medium()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_blocks_reach_the_lower_tiers_kvd_has_and_leave_them_from_the_top() {
        let host = TierCost::measured(KvTier::Host).unwrap();
        let remote = TierCost::measured(KvTier::Remote).unwrap();
        let has = [(KvTier::Host, host), (KvTier::Remote, remote)];
        assert_eq!(reached(Retention::Short, &has), [KvTier::Host]);
        assert_eq!(
            reached(Retention::Long, &has),
            [KvTier::Host, KvTier::Remote]
        );
        let all = [KvTier::Host, KvTier::Disk, KvTier::Remote];
        assert_eq!(still_held(&all, Location::Ram), all);
        assert_eq!(
            still_held(&all, Location::File),
            [KvTier::Disk, KvTier::Remote]
        );
        assert_eq!(still_held(&all, Location::Remote), [KvTier::Remote]);
        assert!(still_held(&all, Location::Miss).is_empty());
    }

    #[test]
    fn a_payload_is_its_keys_bytes_at_the_stated_size() {
        let p = payload(0x0102_0304_0506_0708, 20);
        assert_eq!(p.len(), 20);
        assert_eq!(&p[..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&p[8..16], &p[..8]);
        assert_ne!(payload(1, 64), payload(2, 64));
    }
}
