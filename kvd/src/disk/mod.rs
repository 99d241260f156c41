//! L3, `long` entries on local disks: one or more directories (devices), entries
//! striped over them by key hash, each device a pre-allocated container of fixed slots
//! with its own journal and writer thread. A value is written and synced, then its
//! journal record is written and synced, then the index changes; on restart the
//! journals are replayed and torn records dropped, and every read is checked against
//! the value's checksum, so a crash at any point leaves each key either readable with
//! its bytes or missing. A full disk, the free-space floor or an I/O error cost the
//! write (counted), never the daemon.

pub mod device;
pub mod index;
pub mod record;

use crate::buf::{Buf, BufPool};
use crate::queue::ByteQueue;
use crate::tier::TierCounters;
use crate::wire::{Key, Scope};
use device::{ALIGN, Device, IoMode, Sizing};
use index::{DiskEntry, Index, Loc};
use infera_proto::retention::Retention;
use record::Record;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use xxhash_rust::xxh3::xxh3_64;

/// Settings of the NVMe tier.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// Directories, one per device.
    pub paths: Vec<PathBuf>,
    /// Container bytes over all devices, split evenly (`None`: keep existing containers,
    /// else half of each filesystem's free space).
    pub bytes: Option<u64>,
    /// Free bytes to leave on each filesystem.
    pub min_free: u64,
    /// Direct or buffered I/O.
    pub io: IoMode,
    /// Slot size (`None`: the first value's size, rounded up to 4 KiB).
    pub slot_bytes: Option<u64>,
    /// Most bytes waiting to be written, per device.
    pub queue_bytes: u64,
    /// A journal is compacted once it is this large and mostly dead records.
    pub compact_min_bytes: u64,
}

/// A value read from disk.
#[derive(Debug)]
pub struct DiskHit {
    /// Bytes.
    pub value: Buf,
    /// Retention.
    pub retention: Retention,
    /// Seconds it has left (`None`: no expiry).
    pub ttl_seconds: Option<i64>,
}

#[derive(Debug)]
struct Pending {
    scope: Scope,
    key: Key,
    value: Vec<u8>,
    retention: Retention,
    expires: Option<u64>,
    epoch: u64,
    kind: Kind,
}

/// What a queued item asks of the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A client's write.
    Write,
    /// A copy of a value read from the distributed tier: never replaces what a write
    /// queued or made, which may be newer.
    Fill,
    /// Drop the key (a write of it was dropped: its older value must not be answered).
    Forget,
}

/// Sizes and state, for metrics and `stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskReport {
    /// Entries held.
    pub entries: u64,
    /// Value bytes held.
    pub bytes: u64,
    /// Container bytes over all devices.
    pub capacity: u64,
    /// Devices.
    pub devices: u64,
    /// Devices using O_DIRECT.
    pub direct: u64,
    /// Journal bytes over all devices.
    pub journal_bytes: u64,
    /// Writes waiting.
    pub queued: u64,
    /// Slot size (0 until the first write).
    pub slot_size: u64,
}

/// Default of [`DiskOptions::compact_min_bytes`].
pub const COMPACT_MIN: u64 = 8 << 20;
/// Recent clears kept to tell which queued writes they cover.
const CLEARS_KEPT: usize = 256;
/// Writes taken per group commit.
const BATCH: usize = 32;

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn io_reason(e: &io::Error) -> &'static str {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == io::ErrorKind::StorageFull {
        "no_space"
    } else {
        "io"
    }
}

/// The NVMe tier.
#[derive(Debug)]
pub struct Disk {
    devices: Vec<Device>,
    index: Mutex<Index>,
    slot_size: Mutex<u64>,
    wanted_slot: Option<u64>,
    seq: AtomicU64,
    epoch: AtomicU64,
    /// Recent clears (epoch after the clear, scope), oldest first.
    clears: Mutex<VecDeque<(u64, Scope)>>,
    /// Held (shared) by writers from the clear check to the index update, and
    /// (exclusive) by `clear`: a clear never lands inside a batch.
    clear_gate: RwLock<()>,
    queues: Vec<ByteQueue<Pending>>,
    min_free: u64,
    compact_min: u64,
    warned_too_large: AtomicBool,
    pool: Arc<BufPool>,
    /// What it served, wrote and failed at.
    pub counters: TierCounters,
}

impl Disk {
    /// Opens every device and replays their journals.
    pub fn open(options: &DiskOptions) -> anyhow::Result<Self> {
        if options.paths.is_empty() {
            anyhow::bail!("the NVMe tier needs at least one --long-path");
        }
        let n = options.paths.len() as u64;
        let sizing = Sizing {
            bytes: options.bytes.map(|b| b / n),
            min_free: options.min_free,
        };
        let mut devices = Vec::new();
        let mut replay = Vec::new();
        let mut slot_size = 0;
        for (d, path) in options.paths.iter().enumerate() {
            let opened = Device::open(path, sizing, options.io)
                .map_err(|e| anyhow::anyhow!("opening the NVMe tier at {}: {e}", path.display()))?;
            if opened.dropped_tail > 0 {
                tracing::warn!(
                    dir = %path.display(),
                    bytes = opened.dropped_tail,
                    "cut a torn or damaged tail off the journal (writes in flight at a crash); those entries are misses"
                );
            }
            if !opened.reserved {
                tracing::warn!(dir = %path.display(), "the filesystem cannot pre-allocate; the container is sparse and a full disk shows up as failed writes");
            }
            if opened.slot_size > 0 {
                if slot_size != 0 && slot_size != opened.slot_size {
                    anyhow::bail!(
                        "{} records slot size {} but another device records {slot_size}; the devices come from different runs",
                        path.display(),
                        opened.slot_size
                    );
                }
                slot_size = opened.slot_size;
            }
            replay.extend(opened.records.into_iter().map(|r| (d, r)));
            tracing::info!(
                dir = %path.display(),
                capacity = opened.device.capacity(),
                direct = opened.device.direct(),
                "NVMe tier device"
            );
            devices.push(opened.device);
        }
        if let Some(wanted) = options.slot_bytes
            && slot_size != 0
            && wanted != slot_size
        {
            tracing::warn!(
                wanted,
                recorded = slot_size,
                "--long-slot-bytes differs from the slot size these devices were written with; keeping {slot_size} (remove the kvd-l3.* files to start over)"
            );
        }
        let slots: Vec<u32> = devices
            .iter()
            .map(|dev| slots_of(dev.capacity(), slot_size))
            .collect();
        let mut index = Index::new(&slots);
        replay.sort_by_key(|(_, r)| r.seq());
        let last = replay.last().map_or(0, |(_, r)| r.seq());
        let records = replay.len();
        for (d, r) in replay {
            index.replay(d, r);
        }
        index.rebuild_free();
        tracing::info!(
            entries = index.len(),
            bytes = index.bytes(),
            records,
            slot_size,
            "NVMe tier recovered"
        );
        Ok(Self {
            queues: devices
                .iter()
                .map(|_| ByteQueue::new(options.queue_bytes))
                .collect(),
            devices,
            index: Mutex::new(index),
            slot_size: Mutex::new(slot_size),
            wanted_slot: options.slot_bytes,
            seq: AtomicU64::new(last + 1),
            epoch: AtomicU64::new(0),
            clears: Mutex::new(VecDeque::new()),
            clear_gate: RwLock::new(()),
            min_free: options.min_free,
            compact_min: options.compact_min_bytes,
            warned_too_large: AtomicBool::new(false),
            pool: Arc::new(BufPool::default()),
            counters: TierCounters::default(),
        })
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Devices.
    pub fn devices(&self) -> usize {
        self.devices.len()
    }

    fn device_for(&self, scope: &Scope, key: &Key) -> usize {
        let mut h = Vec::with_capacity(scope.model.len() + scope.compat_key.len() + 10);
        h.extend_from_slice(scope.model.as_bytes());
        h.push(0);
        h.extend_from_slice(scope.compat_key.as_bytes());
        h.push(0);
        h.extend_from_slice(key);
        (xxh3_64(&h) % self.devices.len() as u64) as usize
    }

    fn slot_size(&self) -> u64 {
        *self
            .slot_size
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads a key: its bytes and retention, or `None` (also when the bytes on disk do
    /// not match their checksum: the entry is then dropped).
    pub fn fetch(&self, scope: &Scope, key: &Key) -> Option<DiskHit> {
        let started = Instant::now();
        let now = now_unix();
        let Some(entry) = self.index().lookup(scope, key, now) else {
            self.counters.miss();
            return None;
        };
        let offset = u64::from(entry.loc.slot) * self.slot_size();
        let read = self
            .devices
            .get(entry.loc.device)
            .ok_or_else(|| io::Error::other("no such device"))
            .and_then(|d| {
                d.read_at(
                    offset,
                    usize::try_from(entry.length).unwrap_or(usize::MAX),
                    &self.pool,
                )
            });
        let value = match read {
            Ok(v) if xxh3_64(&v) == entry.checksum => v,
            Ok(_) => {
                // Either damaged, or the slot was reused while it was read (then the
                // entry is already gone and this is a plain miss).
                if self.index().remove(scope, key, Some(entry.seq)) {
                    self.counters.failed("read", "corrupt");
                    tracing::warn!(
                        slot = entry.loc.slot,
                        device = entry.loc.device,
                        "an NVMe entry failed its checksum; dropped"
                    );
                }
                self.counters.miss();
                return None;
            }
            Err(e) => {
                self.counters.failed("read", io_reason(&e));
                self.counters.miss();
                return None;
            }
        };
        self.counters.hit(value.len(), started.elapsed());
        Some(DiskHit {
            value,
            retention: entry.retention,
            ttl_seconds: entry
                .expires
                .map(|at| i64::try_from(at.saturating_sub(now).max(1)).unwrap_or(i64::MAX)),
        })
    }

    /// Whether a key is held (not a read: no I/O).
    pub fn contains(&self, scope: &Scope, key: &Key) -> bool {
        self.index().contains(scope, key, now_unix())
    }

    /// Which clear the tier is at: a value read elsewhere before a later clear is not
    /// written (see [`Disk::write_through_since`]).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Queues a write; the reply does not wait for it. A full queue drops it (counted),
    /// and the key's older value on disk with it.
    pub fn write_through(
        &self,
        scope: &Scope,
        key: Key,
        value: Vec<u8>,
        retention: Retention,
        ttl_seconds: Option<u64>,
    ) {
        let item = self.pending(Kind::Write, self.epoch(), scope, key, value, retention);
        self.enqueue(item, ttl_seconds);
    }

    /// Queues a copy of a value the distributed tier answered, read as of clear `epoch`:
    /// a clear of its scope since, or any write of the key, wins over it.
    pub fn fill(
        &self,
        epoch: u64,
        scope: &Scope,
        key: Key,
        value: Vec<u8>,
        retention: Retention,
        ttl_seconds: Option<u64>,
    ) {
        let item = self.pending(Kind::Fill, epoch, scope, key, value, retention);
        self.enqueue(item, ttl_seconds);
    }

    fn pending(
        &self,
        kind: Kind,
        epoch: u64,
        scope: &Scope,
        key: Key,
        value: Vec<u8>,
        retention: Retention,
    ) -> Pending {
        Pending {
            scope: scope.clone(),
            key,
            value,
            retention,
            expires: None,
            epoch,
            kind,
        }
    }

    fn enqueue(&self, mut item: Pending, ttl_seconds: Option<u64>) {
        let d = self.device_for(&item.scope, &item.key);
        let Some(queue) = self.queues.get(d) else {
            return;
        };
        item.expires = ttl_seconds.map(|t| now_unix().saturating_add(t));
        let bytes = item.value.len() as u64;
        let (kind, scope, key, epoch) = (item.kind, item.scope.clone(), item.key, item.epoch);
        if queue.push(item, bytes) {
            return;
        }
        self.counters.failed("write", "queue_full");
        if kind == Kind::Write {
            // The older value must not be answered: gone from the index now, and a
            // tombstone (no bytes, always taken) makes the writer journal that, after
            // any write of the key queued before.
            self.index().remove(&scope, &key, None);
            let tombstone = self.pending(
                Kind::Forget,
                epoch,
                &scope,
                key,
                Vec::new(),
                Retention::None,
            );
            queue.push_always(tombstone);
        }
    }

    /// Whether a clear since `epoch` covers `scope` (also when too many clears
    /// happened since to tell).
    fn cleared_since(&self, epoch: u64, scope: &Scope) -> bool {
        let clears = self.clears.lock().unwrap_or_else(PoisonError::into_inner);
        if clears.len() == CLEARS_KEPT && clears.front().is_some_and(|(e, _)| *e > epoch + 1) {
            return true;
        }
        clears
            .iter()
            .any(|(e, filter)| *e > epoch && filter.covers(scope))
    }

    /// Writes of these keys failed or were dropped: their older values on disk go too
    /// (else a later read would answer bytes older than the ones acknowledged), in one
    /// journal append.
    /// `journal` says the record is owed even if the index no longer holds the key (a
    /// tombstone: the index forgot it when the write was dropped).
    fn forget_all(&self, device: usize, keys: Vec<(Scope, Key, bool)>) {
        let records: Vec<Record> = {
            let mut ix = self.index();
            keys.into_iter()
                .filter(|(scope, key, journal)| ix.remove(scope, key, None) || *journal)
                .map(|(scope, key, _)| Record::Remove {
                    seq: self.seq.fetch_add(1, Ordering::AcqRel),
                    scope,
                    key,
                })
                .collect()
        };
        if records.is_empty() {
            return;
        }
        if let Some(d) = self.devices.get(device)
            && let Err(e) = d.append(&records)
        {
            self.counters.failed("write", io_reason(&e));
        }
    }

    /// Drops a scope's entries (`""` fields match all), writes queued before included;
    /// returns how many were held.
    pub fn clear(&self, scope: &Scope) -> u64 {
        let _gate = self
            .clear_gate
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        {
            let mut clears = self.clears.lock().unwrap_or_else(PoisonError::into_inner);
            if clears.len() == CLEARS_KEPT {
                clears.pop_front();
            }
            clears.push_back((epoch, scope.clone()));
        }
        let n = self.index().clear(scope);
        let seq = self.seq.fetch_add(1, Ordering::AcqRel);
        for d in &self.devices {
            let record = Record::Clear {
                seq,
                scope: scope.clone(),
            };
            if let Err(e) = d.append(&[record]) {
                self.counters.failed("clear", io_reason(&e));
                tracing::warn!(dir = %d.dir().display(), "recording a clear: {e}; the entries may come back after a restart");
            }
        }
        n
    }

    /// The slot size, fixed by the first value written (or `--long-slot-bytes`) and
    /// recorded on every device; `Err(reason)` when it cannot be fixed.
    fn fix_slot_size(&self, len: u64) -> Result<u64, &'static str> {
        let mut size = self
            .slot_size
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *size != 0 {
            return Ok(*size);
        }
        let smallest = self.devices.iter().map(Device::capacity).min().unwrap_or(0);
        let wanted = self
            .wanted_slot
            .unwrap_or(len)
            .max(1)
            .checked_next_multiple_of(ALIGN)
            .filter(|w| *w <= smallest)
            .ok_or("too_large")?;
        for d in &self.devices {
            if let Err(e) = d.write_slot_size(wanted) {
                tracing::warn!(dir = %d.dir().display(), "recording the slot size: {e}");
                return Err(io_reason(&e));
            }
        }
        let mut ix = self.index();
        for (i, d) in self.devices.iter().enumerate() {
            ix.set_slots(i, slots_of(d.capacity(), wanted));
        }
        *size = wanted;
        tracing::info!(slot_size = wanted, "NVMe tier slot size fixed");
        Ok(wanted)
    }

    /// Writes what is queued for `device` until [`Disk::close`]; run on its own thread.
    pub fn run_writer(&self, device: usize) {
        let Some(queue) = self.queues.get(device) else {
            return;
        };
        loop {
            let batch = queue.pop_batch(BATCH);
            if batch.is_empty() {
                return;
            }
            self.write_batch(device, batch);
            self.maybe_compact(device);
        }
    }

    /// Which of a batch to act on: none a clear since covers; per key, the last write or
    /// tombstone, else the last fill (a fill never wins over a write, which may be
    /// newer); no fill of a key the tier already holds.
    fn settle(&self, batch: Vec<Pending>) -> Vec<Pending> {
        let mut chosen: HashMap<(Scope, Key), Pending> = HashMap::new();
        let mut order = Vec::new();
        for p in batch {
            if self.cleared_since(p.epoch, &p.scope) {
                continue;
            }
            let id = (p.scope.clone(), p.key);
            match chosen.get(&id) {
                Some(held) if held.kind != Kind::Fill && p.kind == Kind::Fill => {}
                Some(_) => {
                    chosen.insert(id, p);
                }
                None => {
                    order.push(id.clone());
                    chosen.insert(id, p);
                }
            }
        }
        let ix = self.index();
        let now = now_unix();
        order
            .into_iter()
            .filter_map(|id| chosen.remove(&id))
            .filter(|p| p.kind != Kind::Fill || !ix.contains(&p.scope, &p.key, now))
            .collect()
    }

    fn write_batch(&self, device: usize, batch: Vec<Pending>) {
        let Some(dev) = self.devices.get(device) else {
            return;
        };
        let _gate = self
            .clear_gate
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let mut forget = Vec::new();
        let mut writes = Vec::new();
        for p in self.settle(batch) {
            match p.kind {
                Kind::Forget => forget.push((p.scope, p.key, true)),
                Kind::Write | Kind::Fill => writes.push(p),
            }
        }
        let mut fail = |p: Pending, reason: &'static str| {
            self.counters.failed("write", reason);
            forget.push((p.scope, p.key, false));
        };
        let slot_size = match writes
            .first()
            .map(|p| self.fix_slot_size(p.value.len() as u64))
        {
            Some(Ok(size)) => size,
            Some(Err(reason)) => {
                writes.drain(..).for_each(|p| fail(p, reason));
                0
            }
            None => 0,
        };
        if !writes.is_empty() {
            match device::free_bytes(dev.dir()) {
                Ok(free) if free < self.min_free => {
                    writes.drain(..).for_each(|p| fail(p, "below_floor"));
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(dir = %dev.dir().display(), "statvfs: {e}"),
            }
        }
        let mut written = Vec::new();
        for p in writes {
            if p.value.len() as u64 > slot_size {
                if !self.warned_too_large.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        len = p.value.len(),
                        slot_size,
                        "a long value is larger than the NVMe slot size fixed by the first one; it stays in RAM (set --long-slot-bytes to the largest value)"
                    );
                }
                fail(p, "too_large");
                continue;
            }
            let Some(alloc) = self.index().allocate(device) else {
                fail(p, "no_space");
                continue;
            };
            if alloc.evicted.is_some() {
                self.counters.evictions.fetch_add(1, Ordering::Relaxed);
            }
            match dev.write_at(u64::from(alloc.loc.slot) * slot_size, &p.value, &self.pool) {
                Ok(()) => written.push((p, alloc.loc)),
                Err(e) => {
                    self.index().release(alloc.loc);
                    fail(p, io_reason(&e));
                }
            }
        }
        if let Err((failed, reason)) = self.commit(dev, written) {
            failed.into_iter().for_each(|p| fail(p, reason));
        }
        self.forget_all(device, forget);
    }

    /// Syncs the written values, journals them, then puts them in the index; on failure
    /// their slots are given back and they are returned with the reason.
    fn commit(
        &self,
        dev: &Device,
        written: Vec<(Pending, Loc)>,
    ) -> Result<(), (Vec<Pending>, &'static str)> {
        if written.is_empty() {
            return Ok(());
        }
        let records: Vec<Record> = written
            .iter()
            .map(|(p, loc)| Record::Put {
                seq: self.seq.fetch_add(1, Ordering::AcqRel),
                scope: p.scope.clone(),
                key: p.key,
                slot: loc.slot,
                length: p.value.len() as u64,
                checksum: xxh3_64(&p.value),
                retention: p.retention,
                expires: p.expires,
            })
            .collect();
        if let Err(e) = dev.sync_data().and_then(|()| dev.append(&records)) {
            let mut ix = self.index();
            for (_, loc) in &written {
                ix.release(*loc);
            }
            return Err((written.into_iter().map(|(p, _)| p).collect(), io_reason(&e)));
        }
        let mut ix = self.index();
        for ((p, loc), r) in written.into_iter().zip(records) {
            let Record::Put { seq, checksum, .. } = r else {
                continue;
            };
            let length = p.value.len();
            let entry = DiskEntry::new(loc, length as u64, checksum, p.retention, p.expires, seq);
            ix.insert(p.scope, p.key, entry);
            self.counters.wrote(length);
        }
        Ok(())
    }

    fn maybe_compact(&self, device: usize) {
        let Some(dev) = self.devices.get(device) else {
            return;
        };
        let journal = dev.journal_bytes();
        let live = self.index().device_entries(device) as u64;
        if journal < self.compact_min || journal < live.saturating_add(1).saturating_mul(4 * 128) {
            return;
        }
        match dev.compact(|| self.index().snapshot(device)) {
            Ok(freed) => tracing::info!(dir = %dev.dir().display(), freed, "journal compacted"),
            Err(e) => {
                self.counters.failed("write", io_reason(&e));
                tracing::warn!(dir = %dev.dir().display(), "compacting the journal: {e}");
            }
        }
    }

    /// Stops taking writes; the writers finish what is queued, then return.
    pub fn close(&self) {
        for q in &self.queues {
            q.close();
        }
    }

    /// Sizes and state.
    pub fn report(&self) -> DiskReport {
        let (entries, bytes) = {
            let ix = self.index();
            (ix.len() as u64, ix.bytes())
        };
        DiskReport {
            entries,
            bytes,
            capacity: self.devices.iter().map(Device::capacity).sum(),
            devices: self.devices.len() as u64,
            direct: self.devices.iter().filter(|d| d.direct()).count() as u64,
            journal_bytes: self.devices.iter().map(Device::journal_bytes).sum(),
            queued: self.queues.iter().map(|q| q.len() as u64).sum(),
            slot_size: self.slot_size(),
        }
    }
}

fn slots_of(capacity: u64, slot_size: u64) -> u32 {
    u32::try_from(capacity.checked_div(slot_size).unwrap_or(0)).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
