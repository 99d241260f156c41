//! What the daemon does with each request (no socket I/O): the store under one lock,
//! replies shaped by whether the connection reads the arena in place.

use crate::metrics::Metrics;
use crate::store::{Found, Store};
use crate::wire::{PROTOCOL_VERSION, Reply, Request};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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
    next_conn: AtomicU64,
}

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
            next_conn: AtomicU64::new(1),
        }
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
            Request::Get { key, scope } => match store.get(&scope, &key, now) {
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
                    let retention = match &found {
                        Found::Shared { retention, .. } | Found::Inline { retention, .. } => {
                            *retention
                        }
                    };
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
            },
            Request::BatchGet { keys, scope } => {
                let found: Vec<Option<Found>> =
                    keys.iter().map(|k| store.get(&scope, k, now)).collect();
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
                    Reply::BatchGetSharedResponse {
                        offsets: r.0,
                        lengths: r.1,
                        versions: r.2,
                        retentions: r.3,
                        slot_size: store.slot_size(),
                    }
                } else {
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
                        return Some(Reply::Error {
                            code: "value_too_large".into(),
                            message: format!(
                                "batch_get of {} keys would answer {total} bytes inline, more than {}; ask for fewer keys or use the shared arena",
                                keys.len(),
                                self.max_reply
                            ),
                        });
                    }
                    let mut values = Vec::new();
                    let mut retentions = Vec::new();
                    for f in &found {
                        let v = f.as_ref().and_then(|f| store.bytes_of(f));
                        let r = f.as_ref().filter(|_| v.is_some()).map(|f| match f {
                            Found::Shared { retention, .. } | Found::Inline { retention, .. } => {
                                *retention
                            }
                        });
                        values.push(v);
                        retentions.push(r);
                    }
                    Reply::BatchGetResponse { values, retentions }
                }
            }
            Request::Set { item, scope } => {
                let (accepted, reason) = self.ack(store.set(
                    &scope,
                    item.key,
                    &item.value,
                    item.retention,
                    item.ttl_seconds,
                    now,
                ));
                Reply::SetAck { accepted, reason }
            }
            Request::BatchSet { items, scope } => {
                let (accepted, reasons) = items
                    .iter()
                    .map(|i| {
                        self.ack(store.set(
                            &scope,
                            i.key,
                            &i.value,
                            i.retention,
                            i.ttl_seconds,
                            now,
                        ))
                    })
                    .unzip();
                Reply::BatchSetAck { accepted, reasons }
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
            Request::SetCommit {
                lease_token,
                key,
                length,
                scope,
                retention,
                ttl_seconds,
            } => {
                let (accepted, reason) = self.ack(store.commit(
                    lease_token,
                    conn.id,
                    &scope,
                    key,
                    length,
                    retention,
                    ttl_seconds,
                    now,
                ));
                Reply::SetCommitResponse { accepted, reason }
            }
            Request::SetCancel { lease_token } => {
                store.cancel(lease_token, conn.id);
                Reply::SetCancelResponse
            }
            // RAM is the only tier: everything present is already warm.
            Request::PrefetchHint { .. } => return None,
            Request::Exists { keys, scope } => Reply::ExistsResponse {
                present: store.exists(&scope, &keys, now),
            },
            Request::Clear { scope } => Reply::ClearAck {
                cleared_entries: store.clear(&scope),
            },
            Request::Stats => Reply::StatsResponse(store.stats()),
        })
    }
}
