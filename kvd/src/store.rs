//! The RAM tier: entries in arena slots (or, when larger than a slot, in the daemon's
//! heap), a priority LRU over them (lowest retention first, then least recently used),
//! TTLs, write leases for zero-copy puts, and a byte budget never exceeded. No I/O: the
//! server calls it under one lock.

use crate::arena::Arena;
use crate::wire::{Key, Scope, Stats};
use infera_proto::retention::Retention;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// How long a write lease lives without a commit.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

type EntryId = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    Slot(usize),
    Heap(Vec<u8>),
}

#[derive(Debug)]
struct Entry {
    scope: Scope,
    key: Key,
    place: Place,
    length: usize,
    retention: Retention,
    expires: Option<Instant>,
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    slot: usize,
    conn: u64,
    deadline: Instant,
}

/// Where a value is, for a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// In the arena: payload offset, length, version.
    Shared {
        /// Payload offset in the memfd.
        offset: u64,
        /// Length.
        length: u64,
        /// Slot version.
        version: u32,
        /// Retention.
        retention: Retention,
    },
    /// A copy of the bytes.
    Inline {
        /// Bytes.
        value: Vec<u8>,
        /// Retention.
        retention: Retention,
    },
}

/// A granted write lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    /// Token for commit or cancel.
    pub token: u64,
    /// Slot.
    pub slot: usize,
    /// Where the client writes.
    pub payload_offset: usize,
    /// Most bytes it may write.
    pub payload_max: usize,
}

/// The RAM tier.
#[derive(Debug)]
pub struct Store {
    arena: Option<Arena>,
    max_bytes: u64,
    used_bytes: u64,
    heap_bytes: u64,
    long_bytes: u64,
    ids: HashMap<(Scope, Key), EntryId>,
    entries: HashMap<EntryId, Entry>,
    order: BTreeSet<(Retention, u64, EntryId)>,
    expiry: BTreeSet<(Instant, EntryId)>,
    free_slots: Vec<usize>,
    slots_made: usize,
    leases: HashMap<u64, Lease>,
    next_id: u64,
    next_token: u64,
    tick: u64,
    counters: Stats,
}

impl Store {
    /// A store of at most `max_bytes`, its values in `arena` when they fit a slot.
    pub fn new(max_bytes: u64, arena: Option<Arena>) -> Self {
        Self {
            arena,
            max_bytes,
            used_bytes: 0,
            heap_bytes: 0,
            long_bytes: 0,
            ids: HashMap::new(),
            entries: HashMap::new(),
            order: BTreeSet::new(),
            expiry: BTreeSet::new(),
            free_slots: Vec::new(),
            slots_made: 0,
            leases: HashMap::new(),
            next_id: 1,
            next_token: 1,
            tick: 0,
            counters: Stats::default(),
        }
    }

    /// The arena, if any.
    pub fn arena(&self) -> Option<&Arena> {
        self.arena.as_ref()
    }

    /// Slot size (0 until fixed, or without an arena).
    pub fn slot_size(&self) -> u64 {
        self.arena.as_ref().map_or(0, |a| a.slot_size() as u64)
    }

    /// Bytes held (slots, leased slots and heap values): never above `max_bytes`.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Counters and sizes.
    pub fn stats(&self) -> Stats {
        Stats {
            entries: self.entries.len() as u64,
            host_bytes: self.used_bytes,
            spillover_bytes: self.heap_bytes,
            long_bytes: self.long_bytes,
            ..self.counters
        }
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn cost(&self, place: &Place) -> u64 {
        match place {
            Place::Slot(_) => self.slot_size(),
            Place::Heap(v) => v.len() as u64,
        }
    }

    fn remove_id(&mut self, id: EntryId) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        self.ids.remove(&(e.scope.clone(), e.key));
        self.order.remove(&(e.retention, e.tick, id));
        if let Some(at) = e.expires {
            self.expiry.remove(&(at, id));
        }
        self.used_bytes -= self.cost(&e.place);
        if let Place::Heap(v) = &e.place {
            self.heap_bytes -= v.len() as u64;
        }
        if e.retention == Retention::Long {
            self.long_bytes -= e.length as u64;
        }
        if let Place::Slot(s) = e.place {
            self.free_slots.push(s);
        }
        Some(e)
    }

    fn drop_expired(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.expiry.first() {
            if at > now {
                break;
            }
            self.remove_id(id);
        }
    }

    fn lookup(&mut self, scope: &Scope, key: &Key, now: Instant) -> Option<EntryId> {
        let id = *self.ids.get(&(scope.clone(), *key))?;
        let expired = self
            .entries
            .get(&id)
            .is_some_and(|e| e.expires.is_some_and(|at| at <= now));
        if expired {
            self.remove_id(id);
            return None;
        }
        Some(id)
    }

    fn touch(&mut self, id: EntryId) {
        let tick = self.next_tick();
        if let Some(e) = self.entries.get_mut(&id) {
            self.order.remove(&(e.retention, e.tick, id));
            e.tick = tick;
            self.order.insert((e.retention, tick, id));
        }
    }

    /// A free slot, made from unused arena space when none was freed yet.
    fn take_free_slot(&mut self) -> Option<usize> {
        if let Some(s) = self.free_slots.pop() {
            return Some(s);
        }
        let total = self.arena.as_ref().map_or(0, Arena::slots);
        (self.slots_made < total).then(|| {
            self.slots_made += 1;
            self.slots_made - 1
        })
    }

    fn has_free_slot(&self) -> bool {
        !self.free_slots.is_empty() || self.slots_made < self.arena.as_ref().map_or(0, Arena::slots)
    }

    fn reclaim_expired_leases(&mut self, now: Instant) {
        let dead: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for token in dead {
            self.cancel(token);
        }
    }

    /// Evicts until `cost` more bytes (and a slot, when `slot`) fit, taking entries of
    /// retention `<= retention` only: lowest class first, then least recently used.
    fn make_room(
        &mut self,
        cost: u64,
        slot: bool,
        retention: Retention,
        now: Instant,
    ) -> Result<(), String> {
        if cost > self.max_bytes {
            return Err(format!(
                "{cost} bytes exceed --max-bytes {}",
                self.max_bytes
            ));
        }
        self.drop_expired(now);
        if slot && !self.has_free_slot() {
            self.reclaim_expired_leases(now);
        }
        loop {
            let need_slot = slot && !self.has_free_slot();
            let need_bytes = self.used_bytes + cost > self.max_bytes;
            if !need_slot && !need_bytes {
                return Ok(());
            }
            let victim = self
                .order
                .iter()
                .find(|(_, _, id)| {
                    !need_slot
                        || self
                            .entries
                            .get(id)
                            .is_some_and(|e| matches!(e.place, Place::Slot(_)))
                })
                .copied();
            match victim {
                Some((class, _, _)) if class > retention => {
                    return Err(format!(
                        "storing it would displace {class} entries (higher than {retention})"
                    ));
                }
                Some((_, _, id)) => {
                    self.remove_id(id);
                    self.counters.evictions_total += 1;
                }
                None => {
                    return Err("no room: every slot is leased by a writer".into());
                }
            }
        }
    }

    fn check_existing(
        &mut self,
        scope: &Scope,
        key: &Key,
        retention: Retention,
        now: Instant,
    ) -> Result<(), String> {
        if let Some(id) = self.lookup(scope, key, now) {
            let held = self
                .entries
                .get(&id)
                .map(|e| e.retention)
                .unwrap_or(Retention::None);
            if held > retention {
                return Err(format!(
                    "retention downgrade: the key is stored as {held}, not {retention}"
                ));
            }
            self.remove_id(id);
        }
        Ok(())
    }

    fn insert(
        &mut self,
        (scope, key): (Scope, Key),
        place: Place,
        length: usize,
        retention: Retention,
        ttl: Option<Duration>,
        now: Instant,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        let tick = self.next_tick();
        let expires = ttl.map(|t| now + t);
        self.used_bytes += self.cost(&place);
        if let Place::Heap(v) = &place {
            self.heap_bytes += v.len() as u64;
        }
        if retention == Retention::Long {
            self.long_bytes += length as u64;
        }
        self.ids.insert((scope.clone(), key), id);
        self.order.insert((retention, tick, id));
        if let Some(at) = expires {
            self.expiry.insert((at, id));
        }
        self.entries.insert(
            id,
            Entry {
                scope,
                key,
                place,
                length,
                retention,
                expires,
                tick,
            },
        );
    }

    /// Stores a value; `Err` says why it was not stored (`accepted=false`).
    pub fn set(
        &mut self,
        scope: &Scope,
        key: Key,
        value: &[u8],
        retention: Retention,
        ttl_seconds: Option<i64>,
        now: Instant,
    ) -> Result<(), String> {
        self.counters.sets_total += 1;
        let ttl = match ttl_seconds {
            Some(t) if t <= 0 => return Err(format!("ttl_seconds {t} <= 0: not stored")),
            Some(t) => Some(Duration::from_secs(t.unsigned_abs())),
            None => None,
        };
        self.check_existing(scope, &key, retention, now)?;
        let in_slot = match self.arena.as_mut() {
            Some(a) => {
                a.fix_slot_size(value.len()) > 0 && value.len() <= a.payload_max() && a.slots() > 0
            }
            None => false,
        };
        let cost = if in_slot {
            self.slot_size()
        } else {
            value.len() as u64
        };
        self.make_room(cost, in_slot, retention, now)?;
        let place = match (in_slot, self.take_free_slot()) {
            (true, Some(slot)) => {
                if let Some(a) = &self.arena {
                    a.write(slot, value);
                }
                Place::Slot(slot)
            }
            _ => Place::Heap(value.to_vec()),
        };
        self.insert(
            (scope.clone(), key),
            place,
            value.len(),
            retention,
            ttl,
            now,
        );
        Ok(())
    }

    /// Looks a key up (and marks it used).
    pub fn get(&mut self, scope: &Scope, key: &Key, now: Instant) -> Option<Found> {
        self.counters.gets_total += 1;
        let Some(id) = self.lookup(scope, key, now) else {
            self.counters.misses_total += 1;
            return None;
        };
        self.touch(id);
        let e = self.entries.get(&id)?;
        let found = match (&e.place, &self.arena) {
            (Place::Slot(s), Some(a)) => Found::Shared {
                offset: a.payload_offset(*s) as u64,
                length: e.length as u64,
                version: a.version(*s),
                retention: e.retention,
            },
            (Place::Heap(v), _) => Found::Inline {
                value: v.clone(),
                retention: e.retention,
            },
            (Place::Slot(_), None) => return None,
        };
        self.counters.hits_total += 1;
        Some(found)
    }

    /// The bytes of a found value (copied out of the arena when shared).
    pub fn bytes_of(&self, found: &Found) -> Option<Vec<u8>> {
        match found {
            Found::Inline { value, .. } => Some(value.clone()),
            Found::Shared { offset, .. } => {
                let a = self.arena.as_ref()?;
                let slot = (*offset as usize - crate::arena::HEADER) / a.slot_size();
                a.read(slot)
            }
        }
    }

    /// Whether each key is present (not counted as gets).
    pub fn exists(&mut self, scope: &Scope, keys: &[Key], now: Instant) -> Vec<bool> {
        keys.iter()
            .map(|k| self.lookup(scope, k, now).is_some())
            .collect()
    }

    /// Drops the entries of a scope (`""` fields match everything); returns how many.
    pub fn clear(&mut self, scope: &Scope) -> u64 {
        let ids: Vec<EntryId> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                (scope.model.is_empty() || e.scope.model == scope.model)
                    && (scope.compat_key.is_empty() || e.scope.compat_key == scope.compat_key)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.remove_id(*id);
        }
        ids.len() as u64
    }

    /// Leases a slot of at least `size` payload bytes to connection `conn`.
    pub fn reserve(&mut self, size: u64, conn: u64, now: Instant) -> Result<Granted, String> {
        let Some(arena) = self.arena.as_mut() else {
            return Err("this daemon has no shared arena (--shared-arena-bytes 0)".into());
        };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        arena.fix_slot_size(size);
        if size > arena.payload_max() {
            return Err(format!(
                "size {size} exceeds the slot payload size {}",
                arena.payload_max()
            ));
        }
        let cost = self.slot_size();
        self.make_room(cost, true, Retention::Short, now)?;
        let slot = self.take_free_slot().ok_or("no free slot")?;
        let token = self.next_token;
        self.next_token += 1;
        self.used_bytes += cost;
        self.leases.insert(
            token,
            Lease {
                slot,
                conn,
                deadline: now + LEASE_TTL,
            },
        );
        let arena = self.arena.as_ref().ok_or("no arena")?;
        arena.begin_write(slot);
        Ok(Granted {
            token,
            slot,
            payload_offset: arena.payload_offset(slot),
            payload_max: arena.payload_max(),
        })
    }

    /// Gives a lease back; false if it was unknown.
    pub fn cancel(&mut self, token: u64) -> bool {
        let Some(lease) = self.leases.remove(&token) else {
            return false;
        };
        if let Some(a) = &self.arena {
            a.publish(lease.slot, 0);
        }
        self.used_bytes -= self.slot_size();
        self.free_slots.push(lease.slot);
        true
    }

    /// Publishes a leased slot under `key`.
    #[allow(clippy::too_many_arguments)]
    pub fn commit(
        &mut self,
        token: u64,
        conn: u64,
        scope: &Scope,
        key: Key,
        length: u64,
        retention: Retention,
        ttl_seconds: i64,
        now: Instant,
    ) -> Result<(), String> {
        self.counters.sets_total += 1;
        let lease = match self.leases.get(&token) {
            Some(l) if l.conn == conn => *l,
            Some(_) => return Err(format!("lease {token} belongs to another connection")),
            None => return Err(format!("lease {token} is unknown, expired or cancelled")),
        };
        let max = self.arena.as_ref().map_or(0, Arena::payload_max) as u64;
        if length > max {
            self.cancel(token);
            return Err(format!(
                "length {length} exceeds the slot payload size {max}"
            ));
        }
        if let Err(e) = self.check_existing(scope, &key, retention, now) {
            self.cancel(token);
            return Err(e);
        }
        self.leases.remove(&token);
        self.used_bytes -= self.slot_size();
        if let Some(a) = &self.arena {
            a.publish(lease.slot, length as usize);
        }
        let ttl = (ttl_seconds > 0).then(|| Duration::from_secs(ttl_seconds.unsigned_abs()));
        self.insert(
            (scope.clone(), key),
            Place::Slot(lease.slot),
            length as usize,
            retention,
            ttl,
            now,
        );
        Ok(())
    }

    /// Releases every lease of a connection that went away.
    pub fn release_connection(&mut self, conn: u64) -> usize {
        let tokens: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.conn == conn)
            .map(|(t, _)| *t)
            .collect();
        for t in &tokens {
            self.cancel(*t);
        }
        tokens.len()
    }

    /// Leases held.
    pub fn leases(&self) -> usize {
        self.leases.len()
    }
}

#[cfg(test)]
mod tests;
