//! What the daemon does with each request (no socket I/O): the store under one lock,
//! replies shaped by whether the connection reads the arena in place.

use crate::lower::{Fetched, Lower};
use crate::metrics::{Metrics, PrefetchCounters};
use crate::queue::ByteQueue;
use crate::store::{Found, Store};
use crate::wire::{Key, PROTOCOL_VERSION, Reply, Request, Scope};
use infera_proto::retention::Retention;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One client connection's state.
#[derive(Debug, Clone, Copy, Default)]
pub struct Conn {
    /// Its id (leases belong to it).
    pub id: u64,
    /// It asked for the arena and got it: arena values are answered in place.
    pub shared: bool,
}

/// The daemon's state, shared by connections.
#[derive(Debug)]
pub struct Daemon {
    /// The RAM tier.
    pub store: Mutex<Store>,
    /// Metrics.
    pub metrics: Metrics,
    /// Name in `hello_ack`.
    pub server_id: String,
    /// Most value bytes in one inline reply.
    pub max_reply: usize,
    /// Users besides the daemon's own that may connect (`--allow-uid`).
    pub allowed_uids: Vec<u32>,
    /// The tiers below RAM.
    pub lower: Lower,
    prefetch: ByteQueue<Prefetch>,
    /// Prefetched keys by outcome: warmed, already in RAM, not found, too late, dropped,
    /// refused.
    pub prefetched: PrefetchCounters,
    /// `get`s that missed RAM and were found below it.
    found_below: AtomicU64,
    next_conn: AtomicU64,
}

/// Keys to warm into RAM before `deadline`.
#[derive(Debug)]
struct Prefetch {
    scope: Scope,
    keys: Vec<Key>,
    deadline: Instant,
}

/// Keys waiting to be prefetched, at most.
const PREFETCH_QUEUE_KEYS: u64 = 65_536;

fn op_name(r: &Request) -> &'static str {
    match r {
        Request::Hello { .. } => "hello",
        Request::Get { .. } => "get",
        Request::BatchGet { .. } => "batch_get",
        Request::Set { .. } => "set",
        Request::BatchSet { .. } => "batch_set",
        Request::SetReserve { .. } => "set_reserve",
        Request::SetCommit { .. } => "set_commit",
        Request::SetCancel { .. } => "set_cancel",
        Request::PrefetchHint { .. } => "prefetch_hint",
        Request::Exists { .. } => "exists",
        Request::BatchLookupTier { .. } => "batch_lookup_tier",
        Request::Clear { .. } => "clear",
        Request::Stats => "stats",
    }
}

impl Daemon {
    /// A daemon over `store`.
    pub fn new(store: Store, server_id: String, max_reply: usize) -> Self {
        Self {
            store: Mutex::new(store),
            metrics: Metrics::default(),
            server_id,
            max_reply,
            allowed_uids: Vec::new(),
            lower: Lower::default(),
            prefetch: ByteQueue::new(PREFETCH_QUEUE_KEYS),
            prefetched: PrefetchCounters::default(),
            found_below: AtomicU64::new(0),
            next_conn: AtomicU64::new(1),
        }
    }

    /// The same daemon with tiers below RAM.
    pub fn with_lower(mut self, lower: Lower) -> Self {
        self.lower = lower;
        self
    }

    /// The counters of `stats`: RAM's, with hits below RAM counted as hits, and
    /// `long_bytes` the NVMe tier's bytes when there is one.
    pub fn stats(&self) -> crate::wire::Stats {
        let mut st = self.store().stats();
        let below = self.found_below.load(Ordering::Relaxed);
        st.hits_total += below;
        st.misses_total = st.misses_total.saturating_sub(below);
        if let Some(d) = &self.lower.disk {
            st.long_bytes = d.report().bytes;
        }
        st
    }

    /// Looks a key up in RAM, then below (a value found below is promoted into RAM).
    fn get_one(&self, scope: &Scope, key: &Key, now: Instant) -> Option<Found> {
        let generation = {
            let mut store = self.store();
            if let Some(found) = store.get(scope, key, now) {
                return Some(found);
            }
            store.generation()
        };
        let fetched = self.lower.fetch(scope, key)?;
        self.found_below.fetch_add(1, Ordering::Relaxed);
        Some(self.promote(scope, key, fetched, generation, now).0)
    }

    fn promote(
        &self,
        scope: &Scope,
        key: &Key,
        fetched: Fetched,
        generation: u64,
        now: Instant,
    ) -> (Found, bool) {
        let Fetched {
            value,
            retention,
            tier,
            ttl_seconds,
        } = fetched;
        let promoted =
            self.store()
                .promote(scope, *key, &value, retention, ttl_seconds, generation, now);
        match promoted {
            Ok((found, inserted)) => {
                if inserted {
                    self.lower.promoted(tier);
                }
                (found, inserted)
            }
            Err(reason) => {
                tracing::debug!("not promoted into RAM: {reason}");
                let found = Found::Inline {
                    value: value.to_vec(),
                    retention,
                };
                (found, false)
            }
        }
    }

    /// Stores a value in RAM and writes it down when `long`. A key held on disk as
    /// `long` is not downgraded.
    fn set_one(
        &self,
        scope: &Scope,
        item: crate::wire::SetItem,
        now: Instant,
    ) -> Result<(), String> {
        if item.retention < Retention::Long && self.lower.on_disk(scope, &item.key) {
            return Err(format!(
                "retention downgrade: the key is stored as long, not {}",
                item.retention
            ));
        }
        self.store().set(
            scope,
            item.key,
            &item.value,
            item.retention,
            item.ttl_seconds,
            now,
        )?;
        self.lower.write(
            scope,
            item.key,
            item.value,
            item.retention,
            item.ttl_seconds,
        );
        Ok(())
    }

    /// Queues a `prefetch_hint`.
    fn hint(&self, scope: Scope, keys: Vec<Key>, deadline_ms: u64, now: Instant) {
        if self.lower.is_empty() {
            // RAM is the only tier: whatever is present is already warm.
            return;
        }
        let n = keys.len() as u64;
        let job = Prefetch {
            scope,
            keys,
            deadline: now + Duration::from_millis(deadline_ms),
        };
        if !self.prefetch.push(job, n) {
            self.prefetched.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Warms hinted keys into RAM until [`Daemon::close`]; run on its own thread.
    pub fn run_prefetcher(&self) {
        loop {
            let jobs = self.prefetch.pop_batch(16);
            if jobs.is_empty() {
                return;
            }
            for job in jobs {
                for key in &job.keys {
                    let now = Instant::now();
                    let (present, generation) = {
                        let mut store = self.store();
                        let present = store.exists(&job.scope, &[*key], now);
                        (
                            present.first().copied().unwrap_or(false),
                            store.generation(),
                        )
                    };
                    let counter = if now > job.deadline {
                        &self.prefetched.late
                    } else if present {
                        &self.prefetched.present
                    } else {
                        match self.lower.fetch(&job.scope, key) {
                            Some(f) => {
                                if self.promote(&job.scope, key, f, generation, now).1 {
                                    &self.prefetched.warmed
                                } else {
                                    // Not kept: RAM had no room, or it was cleared or
                                    // written meanwhile.
                                    &self.prefetched.refused
                                }
                            }
                            None => &self.prefetched.missing,
                        }
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Stops the background work: prefetching ends, queued writes are finished.
    pub fn close(&self) {
        self.prefetch.close();
        self.lower.close();
    }

    /// The store, locked. A panic while it was held (a bug) leaves it poisoned; the
    /// store's invariants hold between its methods, so serving goes on.
    pub fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a peer of `uid` may connect: the daemon's own user, or one allowed.
    pub fn peer_allowed(&self, uid: u32, own: u32) -> bool {
        uid == own || self.allowed_uids.contains(&uid)
    }

    /// A new connection.
    pub fn connect(&self) -> Conn {
        Conn {
            id: self.next_conn.fetch_add(1, Ordering::Relaxed),
            shared: false,
        }
    }

    /// A connection went away: its leases are released.
    pub fn disconnect(&self, conn: &Conn) {
        {
            let mut s = self.store();
            let n = s.release_connection(conn.id);
            if n > 0 {
                tracing::info!(
                    conn = conn.id,
                    leases = n,
                    "released the leases of a closed connection"
                );
            }
        }
    }

    fn ack(&self, result: Result<(), String>) -> (bool, Option<String>) {
        match result {
            Ok(()) => (true, None),
            Err(reason) => {
                self.metrics.rejected(&reason);
                (false, Some(reason))
            }
        }
    }

    /// Serves one request; `None` for ops without a reply (`prefetch_hint`).
    pub fn handle(&self, request: Request, conn: &mut Conn) -> Option<Reply> {
        let started = Instant::now();
        let op = op_name(&request);
        let reply = self.serve(request, conn, started);
        self.metrics.observe(op, started.elapsed());
        reply
    }

    fn serve(&self, request: Request, conn: &mut Conn, now: Instant) -> Option<Reply> {
        let request = match request {
            Request::Get { key, scope } => {
                let found = self.get_one(&scope, &key, now);
                return Some(self.get_reply(found, conn));
            }
            Request::BatchGet { keys, scope } => {
                let found: Vec<Option<Found>> =
                    keys.iter().map(|k| self.get_one(&scope, k, now)).collect();
                return Some(self.batch_get_reply(found, conn));
            }
            Request::Set { item, scope } => {
                let (accepted, reason) = self.ack(self.set_one(&scope, item, now));
                return Some(Reply::SetAck { accepted, reason });
            }
            Request::BatchSet { items, scope } => {
                let (accepted, reasons) = items
                    .into_iter()
                    .map(|i| self.ack(self.set_one(&scope, i, now)))
                    .unzip();
                return Some(Reply::BatchSetAck { accepted, reasons });
            }
            Request::SetCommit {
                lease_token,
                key,
                length,
                scope,
                retention,
                ttl_seconds,
            } => {
                let committed = if retention < Retention::Long && self.lower.on_disk(&scope, &key) {
                    self.store().cancel(lease_token, conn.id);
                    Err(format!(
                        "retention downgrade: the key is stored as long, not {retention}"
                    ))
                } else {
                    self.store().commit(
                        lease_token,
                        conn.id,
                        &scope,
                        key,
                        length,
                        retention,
                        ttl_seconds,
                        now,
                    )
                };
                if committed.is_ok() && retention == Retention::Long && !self.lower.is_empty() {
                    let value = self.store().peek(&scope, &key, now);
                    if let Some(value) = value {
                        self.lower
                            .write(&scope, key, value, retention, Some(ttl_seconds));
                    }
                }
                let (accepted, reason) = self.ack(committed);
                return Some(Reply::SetCommitResponse { accepted, reason });
            }
            Request::PrefetchHint {
                keys,
                scope,
                deadline_ms,
            } => {
                self.hint(scope, keys, deadline_ms, now);
                return None;
            }
            Request::Exists { keys, scope } => {
                let mut present = self.store().exists(&scope, &keys, now);
                self.lower.exists(&scope, &keys, &mut present);
                return Some(Reply::ExistsResponse { present });
            }
            Request::BatchLookupTier { keys, scope } => {
                let ram = self.store().exists(&scope, &keys, now);
                let tiers = self.lower.tiers(&scope, &keys, &ram);
                return Some(Reply::BatchLookupTierResponse { tiers });
            }
            Request::Clear { scope } => {
                // Slower tiers first: a get that read them before their clear holds an
                // older generation than RAM's clear below, so its promotion is refused.
                let below = self.lower.clear(&scope);
                let ram = self.store().clear(&scope);
                return Some(Reply::ClearAck {
                    cleared_entries: ram + below,
                });
            }
            Request::Stats => return Some(Reply::StatsResponse(self.stats())),
            other => other,
        };
        let mut store = self.store();
        Some(match request {
            Request::Hello {
                protocol_version,
                prefers_shared_arena,
                client_id,
            } => {
                if protocol_version != PROTOCOL_VERSION {
                    self.metrics.error("protocol_version");
                    return Some(Reply::Error {
                        code: "protocol_version".into(),
                        message: format!(
                            "protocol_version {protocol_version}: this daemon speaks {PROTOCOL_VERSION}"
                        ),
                    });
                }
                let arena = store
                    .arena()
                    .filter(|_| prefers_shared_arena)
                    .map(|a| (a.size() as u64, a.slot_size() as u64, std::process::id()));
                conn.shared = arena.is_some();
                tracing::debug!(conn = conn.id, client_id, shared = conn.shared, "hello");
                Reply::HelloAck {
                    server_id: self.server_id.clone(),
                    arena,
                }
            }
            Request::SetReserve { size } => match store.reserve(size, conn.id, now) {
                Ok(g) => Reply::SetReserveResponse {
                    lease_token: g.token,
                    slot_id: i64::try_from(g.slot).unwrap_or(-1),
                    payload_offset: i64::try_from(g.payload_offset).unwrap_or(-1),
                    payload_max_size: g.payload_max as u64,
                    reason: String::new(),
                },
                Err(reason) => {
                    self.metrics.rejected(&reason);
                    Reply::SetReserveResponse {
                        lease_token: 0,
                        slot_id: -1,
                        payload_offset: -1,
                        payload_max_size: 0,
                        reason,
                    }
                }
            },
            Request::SetCancel { lease_token } => {
                store.cancel(lease_token, conn.id);
                Reply::SetCancelResponse
            }
            Request::Get { .. }
            | Request::BatchGet { .. }
            | Request::Set { .. }
            | Request::BatchSet { .. }
            | Request::SetCommit { .. }
            | Request::PrefetchHint { .. }
            | Request::Exists { .. }
            | Request::BatchLookupTier { .. }
            | Request::Clear { .. }
            | Request::Stats => return None,
        })
    }

    fn get_reply(&self, found: Option<Found>, conn: &Conn) -> Reply {
        let store = self.store();
        match found {
            Some(Found::Shared {
                offset,
                length,
                version,
                retention,
            }) if conn.shared => Reply::GetSharedResponse {
                slot_offset: offset,
                length,
                version,
                retention,
                slot_size: store.slot_size(),
            },
            Some(found) => {
                let retention = retention_of(&found);
                let value = store.bytes_of(&found);
                Reply::GetResponse {
                    retention: value.as_ref().map(|_| retention),
                    value,
                }
            }
            None => Reply::GetResponse {
                value: None,
                retention: None,
            },
        }
    }

    fn batch_get_reply(&self, found: Vec<Option<Found>>, conn: &Conn) -> Reply {
        let store = self.store();
        let all_shared = found
            .iter()
            .flatten()
            .all(|f| matches!(f, Found::Shared { .. }));
        if conn.shared && all_shared {
            let mut r = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for f in &found {
                match f {
                    Some(Found::Shared {
                        offset,
                        length,
                        version,
                        retention,
                    }) => {
                        r.0.push(i64::try_from(*offset).unwrap_or(-1));
                        r.1.push(*length);
                        r.2.push(*version);
                        r.3.push(Some(*retention));
                    }
                    _ => {
                        r.0.push(-1);
                        r.1.push(0);
                        r.2.push(0);
                        r.3.push(None);
                    }
                }
            }
            return Reply::BatchGetSharedResponse {
                offsets: r.0,
                lengths: r.1,
                versions: r.2,
                retentions: r.3,
                slot_size: store.slot_size(),
            };
        }
        let total: u64 = found
            .iter()
            .flatten()
            .map(|f| match f {
                Found::Shared { length, .. } => *length,
                Found::Inline { value, .. } => value.len() as u64,
            })
            .sum();
        if total > self.max_reply as u64 {
            self.metrics.error("value_too_large");
            return Reply::Error {
                code: "value_too_large".into(),
                message: format!(
                    "batch_get of {} keys would answer {total} bytes inline, more than {}; ask for fewer keys or use the shared arena",
                    found.len(),
                    self.max_reply
                ),
            };
        }
        let mut values = Vec::new();
        let mut retentions = Vec::new();
        for f in &found {
            let v = f.as_ref().and_then(|f| store.bytes_of(f));
            let r = f.as_ref().filter(|_| v.is_some()).map(retention_of);
            values.push(v);
            retentions.push(r);
        }
        Reply::BatchGetResponse { values, retentions }
    }
}

fn retention_of(found: &Found) -> Retention {
    match found {
        Found::Shared { retention, .. } | Found::Inline { retention, .. } => *retention,
    }
}
