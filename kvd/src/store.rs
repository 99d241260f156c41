//! The RAM tier: entries in arena slots (or, when larger than a slot, in the daemon's
//! heap), a priority LRU over them (lowest retention first, then least recently used),
//! TTLs, write leases for zero-copy puts, and a byte budget never exceeded. No I/O: the
//! server calls it under one lock.

use crate::arena::Arena;
use crate::wire::{Key, Scope, Stats};
use infera_proto::retention::Retention;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

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
    /// The class it is evicted as: its retention, or `ephemeral` for a copy of an entry a
    /// slower tier holds (evicting it loses nothing).
    class: Retention,
    expires: Option<Instant>,
    tick: u64,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    slot: usize,
    conn: u64,
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

/// Seconds to live as a deadline (`None`: no expiry, also when too far to represent).
fn deadline(now: Instant, seconds: i64) -> Option<Instant> {
    u64::try_from(seconds)
        .ok()
        .and_then(|s| now.checked_add(Duration::from_secs(s)))
}

/// The RAM tier.
#[derive(Debug)]
pub struct Store {
    arena: Option<Arena>,
    /// RAM for values larger than a slot: `max_bytes` minus the arena.
    heap_budget: u64,
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
    clears: u64,
    counters: Stats,
}

impl Store {
    /// A store of at most `max_bytes`, its values in `arena` when they fit a slot.
    pub fn new(max_bytes: u64, arena: Option<Arena>) -> Self {
        let arena_bytes = arena.as_ref().map_or(0, |a| a.size() as u64);
        Self {
            arena,
            heap_budget: max_bytes.saturating_sub(arena_bytes),
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
            clears: 0,
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
        self.order.remove(&(e.class, e.tick, id));
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
            self.order.remove(&(e.class, e.tick, id));
            e.tick = tick;
            self.order.insert((e.class, tick, id));
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

    /// The entries to evict so a value of `cost` bytes (in a slot when `slot`) fits,
    /// taking only entries of retention `<= retention` (lowest class first, then least
    /// recently used) and counting `replacing` (the key's current entry) as free.
    /// Decides without changing anything, so a refused write loses nothing.
    fn plan_room(
        &self,
        cost: u64,
        slot: bool,
        retention: Retention,
        replacing: Option<EntryId>,
    ) -> Result<Vec<EntryId>, String> {
        let in_slot = |id: &EntryId| {
            self.entries
                .get(id)
                .is_some_and(|e| matches!(e.place, Place::Slot(_)))
        };
        let candidates = self
            .order
            .iter()
            .filter(|(_, _, id)| Some(*id) != replacing);
        if slot {
            if self.has_free_slot() || replacing.is_some_and(|r| in_slot(&r)) {
                return Ok(Vec::new());
            }
            return match candidates.clone().find(|(_, _, id)| in_slot(id)) {
                Some((class, _, _)) if *class > retention => Err(format!(
                    "storing it would displace {class} entries (higher than {retention})"
                )),
                Some((_, _, id)) => Ok(vec![*id]),
                None => Err("no room: every slot is leased by a writer".into()),
            };
        }
        if cost > self.heap_budget {
            return Err(format!(
                "{cost} bytes do not fit a slot and exceed the {} bytes of RAM outside the arena (--max-bytes minus --shared-arena-bytes)",
                self.heap_budget
            ));
        }
        let freed_by_replacing =
            replacing
                .and_then(|r| self.entries.get(&r))
                .map_or(0, |e| match &e.place {
                    Place::Heap(v) => v.len() as u64,
                    Place::Slot(_) => 0,
                });
        let mut excess =
            (self.heap_bytes - freed_by_replacing + cost).saturating_sub(self.heap_budget);
        let mut victims = Vec::new();
        for (class, _, id) in candidates {
            if excess == 0 {
                break;
            }
            let Some(Place::Heap(v)) = self.entries.get(id).map(|e| &e.place) else {
                continue;
            };
            if *class > retention {
                return Err(format!(
                    "storing it would displace {class} entries (higher than {retention})"
                ));
            }
            excess = excess.saturating_sub(v.len() as u64);
            victims.push(*id);
        }
        Ok(victims)
    }

    fn evict(&mut self, victims: Vec<EntryId>) {
        for id in victims {
            self.remove_id(id);
            self.counters.evictions_total += 1;
        }
    }

    /// The key's current entry, unless storing at `retention` would downgrade it.
    fn current(
        &mut self,
        scope: &Scope,
        key: &Key,
        retention: Retention,
        now: Instant,
    ) -> Result<Option<EntryId>, String> {
        let Some(id) = self.lookup(scope, key, now) else {
            return Ok(None);
        };
        let held = self
            .entries
            .get(&id)
            .map_or(Retention::None, |e| e.retention);
        if held > retention {
            return Err(format!(
                "retention downgrade: the key is stored as {held}, not {retention}"
            ));
        }
        Ok(Some(id))
    }

    fn insert(
        &mut self,
        (scope, key): (Scope, Key),
        place: Place,
        length: usize,
        (retention, class): (Retention, Retention),
        expires: Option<Instant>,
    ) {
        let id = self.next_id;
        self.next_id += 1;
        let tick = self.next_tick();
        self.used_bytes += self.cost(&place);
        if let Place::Heap(v) = &place {
            self.heap_bytes += v.len() as u64;
        }
        if retention == Retention::Long {
            self.long_bytes += length as u64;
        }
        self.ids.insert((scope.clone(), key), id);
        self.order.insert((class, tick, id));
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
                class,
                expires,
                tick,
            },
        );
    }

    /// Stores a value; `Err` says why it was not stored (`accepted=false`), and then
    /// nothing changed.
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
        self.store_value(scope, key, value, (retention, retention), ttl_seconds, now)
    }

    fn store_value(
        &mut self,
        scope: &Scope,
        key: Key,
        value: &[u8],
        classes: (Retention, Retention),
        ttl_seconds: Option<i64>,
        now: Instant,
    ) -> Result<(), String> {
        let retention = classes.0;
        if let Some(t) = ttl_seconds.filter(|t| *t <= 0) {
            return Err(format!("ttl_seconds {t} <= 0: not stored"));
        }
        self.drop_expired(now);
        let replacing = self.current(scope, &key, retention, now)?;
        let in_slot = match self.arena.as_mut() {
            Some(a) => a.slots_for(value.len()) > 0,
            None => false,
        };
        let cost = if in_slot {
            self.slot_size()
        } else {
            value.len() as u64
        };
        // A value displaces its own retention class and below (a promoted copy too: it
        // was just asked for, and `long` entries have a slower tier behind them).
        let victims = self.plan_room(cost, in_slot, retention, replacing)?;
        if let Some(id) = replacing {
            self.remove_id(id);
        }
        self.evict(victims);
        let place = match in_slot.then(|| self.take_free_slot()).flatten() {
            Some(slot) => {
                if let Some(a) = &self.arena {
                    a.write(slot, value);
                }
                Place::Slot(slot)
            }
            None => Place::Heap(value.to_vec()),
        };
        let expires = ttl_seconds.and_then(|t| deadline(now, t));
        self.insert((scope.clone(), key), place, value.len(), classes, expires);
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
        let found = self.found(id)?;
        self.counters.hits_total += 1;
        Some(found)
    }

    fn found(&self, id: EntryId) -> Option<Found> {
        let e = self.entries.get(&id)?;
        Some(match (&e.place, &self.arena) {
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
        })
    }

    /// Which `clear` the store is at; a promotion decided before a later clear is dropped.
    pub fn generation(&self) -> u64 {
        self.clears
    }

    /// Brings a value found in a slower tier into RAM (not counted as a set), evictable
    /// as `ephemeral` since the slower tier keeps it, and returns how to answer with it.
    /// A key written meanwhile keeps its newer value (which is answered instead, with
    /// `false`: nothing was inserted); after a `clear` since `generation`, nothing is
    /// stored. `Err` when RAM does not take it.
    #[allow(clippy::too_many_arguments)]
    pub fn promote(
        &mut self,
        scope: &Scope,
        key: Key,
        value: &[u8],
        retention: Retention,
        ttl_seconds: Option<i64>,
        generation: u64,
        now: Instant,
    ) -> Result<(Found, bool), String> {
        if self.clears != generation {
            return Err("cleared while it was read".into());
        }
        if let Some(id) = self.lookup(scope, &key, now) {
            return self
                .found(id)
                .map(|f| (f, false))
                .ok_or_else(|| "entry vanished".into());
        }
        let class = retention.min(Retention::Ephemeral);
        self.store_value(scope, key, value, (retention, class), ttl_seconds, now)?;
        self.lookup(scope, &key, now)
            .and_then(|id| self.found(id))
            .map(|f| (f, true))
            .ok_or_else(|| "promoted entry vanished".into())
    }

    /// A copy of a key's bytes (not counted as a get).
    pub fn peek(&mut self, scope: &Scope, key: &Key, now: Instant) -> Option<Vec<u8>> {
        let id = self.lookup(scope, key, now)?;
        let found = self.found(id)?;
        self.bytes_of(&found)
    }

    /// The bytes of a found value (copied out of the arena when shared).
    pub fn bytes_of(&self, found: &Found) -> Option<Vec<u8>> {
        match found {
            Found::Inline { value, .. } => Some(value.clone()),
            Found::Shared {
                offset, version, ..
            } => {
                let a = self.arena.as_ref()?;
                let slot = (*offset as usize - crate::arena::HEADER) / a.slot_size();
                // Rewritten since it was found (the lock was let go in between): a miss,
                // not another key's bytes.
                (a.version(slot) == *version)
                    .then(|| a.read(slot))
                    .flatten()
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
        self.clears += 1;
        let ids: Vec<EntryId> = self
            .entries
            .iter()
            .filter(|(_, e)| scope.covers(&e.scope))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            self.remove_id(*id);
        }
        ids.len() as u64
    }

    /// Leases a slot of at least `size` payload bytes to connection `conn`. The lease
    /// lives until its connection commits it, cancels it or goes away.
    pub fn reserve(&mut self, size: u64, conn: u64, now: Instant) -> Result<Granted, String> {
        let Some(arena) = self.arena.as_mut() else {
            return Err("this daemon has no shared arena (--shared-arena-bytes 0)".into());
        };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        if arena.slots_for(size) == 0 {
            return Err(format!(
                "size {size} does not fit a slot (payload size {}, arena {} bytes)",
                arena.payload_max(),
                arena.size()
            ));
        }
        self.drop_expired(now);
        let victims = self.plan_room(self.slot_size(), true, Retention::Short, None)?;
        self.evict(victims);
        let slot = self.take_free_slot().ok_or("no free slot")?;
        let token = self.next_token;
        self.next_token += 1;
        self.used_bytes += self.slot_size();
        self.leases.insert(token, Lease { slot, conn });
        let arena = self.arena.as_ref().ok_or("no arena")?;
        arena.begin_write(slot);
        Ok(Granted {
            token,
            slot,
            payload_offset: arena.payload_offset(slot),
            payload_max: arena.payload_max(),
        })
    }

    /// Gives a lease of connection `conn` back; false if it is not one of its leases.
    pub fn cancel(&mut self, token: u64, conn: u64) -> bool {
        match self.leases.get(&token) {
            Some(l) if l.conn == conn => {}
            _ => return false,
        }
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

    /// Publishes a leased slot under `key` (`ttl_seconds` 0: no expiry; below 0: not
    /// stored). A refused commit gives the lease back.
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
            None => return Err(format!("lease {token} is unknown or was cancelled")),
        };
        let max = self.arena.as_ref().map_or(0, Arena::payload_max) as u64;
        let refused = if length > max {
            Some(format!(
                "length {length} exceeds the slot payload size {max}"
            ))
        } else if ttl_seconds < 0 {
            Some(format!("ttl_seconds {ttl_seconds} < 0: not stored"))
        } else {
            None
        };
        let replacing = match refused {
            Some(reason) => Err(reason),
            None => self.current(scope, &key, retention, now),
        };
        let replacing = match replacing {
            Ok(r) => r,
            Err(reason) => {
                self.cancel(token, conn);
                return Err(reason);
            }
        };
        if let Some(id) = replacing {
            self.remove_id(id);
        }
        self.leases.remove(&token);
        self.used_bytes -= self.slot_size();
        if let Some(a) = &self.arena {
            a.publish(lease.slot, length as usize);
        }
        let expires = (ttl_seconds > 0)
            .then(|| deadline(now, ttl_seconds))
            .flatten();
        self.insert(
            (scope.clone(), key),
            Place::Slot(lease.slot),
            length as usize,
            (retention, retention),
            expires,
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
            self.cancel(*t, conn);
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
