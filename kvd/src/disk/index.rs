//! Which key is in which slot of which device, the free slots of each device and their
//! LRU order; built by replaying journals, then kept in step with them. No I/O.

use super::record::Record;
use crate::wire::{Key, Scope};
use infera_proto::retention::Retention;
use std::collections::{BTreeSet, HashMap};

/// A slot of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Device (index into the device list).
    pub device: usize,
    /// Slot in its container file.
    pub slot: u32,
}

/// An entry on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskEntry {
    /// Where.
    pub loc: Loc,
    /// Value length.
    pub length: u64,
    /// xxh3 of the value.
    pub checksum: u64,
    /// Retention.
    pub retention: Retention,
    /// Expiry, Unix seconds.
    pub expires: Option<u64>,
    /// The record that put it.
    pub seq: u64,
    tick: u64,
}

impl DiskEntry {
    /// An entry from a `Put` record's fields.
    pub fn new(
        loc: Loc,
        length: u64,
        checksum: u64,
        retention: Retention,
        expires: Option<u64>,
        seq: u64,
    ) -> Self {
        Self {
            loc,
            length,
            checksum,
            retention,
            expires,
            seq,
            tick: 0,
        }
    }
}

#[derive(Debug, Default)]
struct DeviceSlots {
    count: u32,
    /// Slots below this were handed out at least once.
    made: u32,
    /// Free slots below `made` (a set: taking, giving back and removing one are cheap
    /// with hundreds of thousands of slots).
    freed: BTreeSet<u32>,
    owners: HashMap<u32, (Scope, Key)>,
    lru: BTreeSet<(u64, u32)>,
}

/// The index of the NVMe tier.
#[derive(Debug, Default)]
pub struct Index {
    entries: HashMap<(Scope, Key), DiskEntry>,
    devices: Vec<DeviceSlots>,
    tick: u64,
    bytes: u64,
}

/// Where a new value goes, and what it displaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// The slot, reserved until [`Index::insert`] or [`Index::release`].
    pub loc: Loc,
    /// The entry evicted to free it.
    pub evicted: Option<(Scope, Key)>,
}

impl Index {
    /// An empty index over devices of `slots[d]` slots each (0 until the slot size is
    /// known).
    pub fn new(slots: &[u32]) -> Self {
        Self {
            devices: slots
                .iter()
                .map(|&count| DeviceSlots {
                    count,
                    ..DeviceSlots::default()
                })
                .collect(),
            ..Self::default()
        }
    }

    /// Sets a device's slot count once the slot size is known (only grows).
    pub fn set_slots(&mut self, device: usize, count: u32) {
        if let Some(d) = self.devices.get_mut(device) {
            d.count = d.count.max(count);
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Value bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn unlink(&mut self, id: &(Scope, Key)) -> Option<DiskEntry> {
        let e = self.entries.remove(id)?;
        self.bytes -= e.length;
        if let Some(d) = self.devices.get_mut(e.loc.device) {
            d.owners.remove(&e.loc.slot);
            d.lru.remove(&(e.tick, e.loc.slot));
            d.freed.insert(e.loc.slot);
        }
        Some(e)
    }

    /// Records that a durable `entry` holds `key` (replacing the key's old entry and
    /// whatever owned the slot before).
    pub fn insert(&mut self, scope: Scope, key: Key, mut entry: DiskEntry) {
        let id = (scope, key);
        self.unlink(&id);
        let Some(d) = self.devices.get(entry.loc.device) else {
            return;
        };
        if entry.loc.slot >= d.count {
            return;
        }
        if let Some(owner) = d.owners.get(&entry.loc.slot).cloned() {
            self.unlink(&owner);
        }
        self.tick += 1;
        entry.tick = self.tick;
        let Some(d) = self.devices.get_mut(entry.loc.device) else {
            return;
        };
        d.freed.remove(&entry.loc.slot);
        d.made = d.made.max(entry.loc.slot + 1);
        d.owners.insert(entry.loc.slot, id.clone());
        d.lru.insert((entry.tick, entry.loc.slot));
        self.bytes += entry.length;
        self.entries.insert(id, entry);
    }

    /// Applies a journal record during recovery (records in `seq` order).
    pub fn replay(&mut self, device: usize, record: Record) {
        match record {
            Record::Put {
                seq,
                scope,
                key,
                slot,
                length,
                checksum,
                retention,
                expires,
            } => {
                let loc = Loc { device, slot };
                self.insert(
                    scope,
                    key,
                    DiskEntry::new(loc, length, checksum, retention, expires, seq),
                );
            }
            Record::Remove { scope, key, .. } => {
                self.unlink(&(scope, key));
            }
            Record::Clear { scope, .. } => {
                self.clear(&scope);
            }
        }
    }

    /// The entry of a key (marked used), unless expired at `now` (Unix seconds), in which
    /// case it is dropped.
    pub fn lookup(&mut self, scope: &Scope, key: &Key, now: u64) -> Option<DiskEntry> {
        let id = (scope.clone(), *key);
        let e = self.entries.get(&id)?;
        if e.expires.is_some_and(|at| at <= now) {
            self.unlink(&id);
            return None;
        }
        self.tick += 1;
        let tick = self.tick;
        let e = self.entries.get_mut(&id)?;
        let d = self.devices.get_mut(e.loc.device)?;
        d.lru.remove(&(e.tick, e.loc.slot));
        d.lru.insert((tick, e.loc.slot));
        e.tick = tick;
        Some(e.clone())
    }

    /// Whether a key is held (not expired at `now`); does not mark it used.
    pub fn contains(&self, scope: &Scope, key: &Key, now: u64) -> bool {
        self.entries
            .get(&(scope.clone(), *key))
            .is_some_and(|e| e.expires.is_none_or(|at| at > now))
    }

    /// Drops a key's entry if it is still the one put by record `seq` (any when `None`).
    pub fn remove(&mut self, scope: &Scope, key: &Key, seq: Option<u64>) -> bool {
        let id = (scope.clone(), *key);
        if seq.is_some_and(|s| self.entries.get(&id).is_some_and(|e| e.seq != s)) {
            return false;
        }
        self.unlink(&id).is_some()
    }

    /// Drops the entries of a scope (`""` fields match all); returns how many.
    pub fn clear(&mut self, filter: &Scope) -> u64 {
        let ids: Vec<(Scope, Key)> = self
            .entries
            .keys()
            .filter(|(scope, _)| filter.covers(scope))
            .cloned()
            .collect();
        for id in &ids {
            self.unlink(id);
        }
        ids.len() as u64
    }

    /// A slot of `device` for a new value: a free one, else the least recently used
    /// entry's (evicted). `None` when the device has no slots.
    pub fn allocate(&mut self, device: usize) -> Option<Allocation> {
        let d = self.devices.get_mut(device)?;
        if let Some(slot) = d.freed.pop_first() {
            return Some(Allocation {
                loc: Loc { device, slot },
                evicted: None,
            });
        }
        if d.made < d.count {
            d.made += 1;
            return Some(Allocation {
                loc: Loc {
                    device,
                    slot: d.made - 1,
                },
                evicted: None,
            });
        }
        let &(_, slot) = d.lru.first()?;
        let owner = d.owners.get(&slot).cloned()?;
        self.unlink(&owner);
        let d = self.devices.get_mut(device)?;
        d.freed.remove(&slot);
        Some(Allocation {
            loc: Loc { device, slot },
            evicted: Some(owner),
        })
    }

    /// After replay: every slot below the highest one seen that no entry owns is free.
    pub fn rebuild_free(&mut self) {
        for d in &mut self.devices {
            d.made = d.made.min(d.count);
            d.freed = (0..d.made).filter(|s| !d.owners.contains_key(s)).collect();
        }
    }

    /// Gives back a slot from [`Index::allocate`] whose write failed.
    pub fn release(&mut self, loc: Loc) {
        if let Some(d) = self.devices.get_mut(loc.device)
            && !d.owners.contains_key(&loc.slot)
        {
            d.freed.insert(loc.slot);
        }
    }

    /// A device's live entries as `Put` records (a compacted journal).
    pub fn snapshot(&self, device: usize) -> Vec<Record> {
        let mut records: Vec<Record> = self
            .entries
            .iter()
            .filter(|(_, e)| e.loc.device == device)
            .map(|((scope, key), e)| Record::Put {
                seq: e.seq,
                scope: scope.clone(),
                key: *key,
                slot: e.loc.slot,
                length: e.length,
                checksum: e.checksum,
                retention: e.retention,
                expires: e.expires,
            })
            .collect();
        records.sort_by_key(Record::seq);
        records
    }

    /// Entries on a device.
    pub fn device_entries(&self, device: usize) -> usize {
        self.devices.get(device).map_or(0, |d| d.owners.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Scope {
        Scope {
            model: "m".into(),
            compat_key: String::new(),
        }
    }

    fn put(seq: u64, key: u8, slot: u32) -> Record {
        Record::Put {
            seq,
            scope: scope(),
            key: [key; 8],
            slot,
            length: 10,
            checksum: u64::from(key),
            retention: Retention::Long,
            expires: None,
        }
    }

    #[test]
    fn replay_gives_a_reused_slot_to_its_last_writer() {
        let mut ix = Index::new(&[4]);
        ix.replay(0, put(1, 1, 0));
        ix.replay(0, put(2, 2, 1));
        ix.replay(0, put(3, 3, 0));
        assert!(!ix.contains(&scope(), &[1; 8], 0), "slot 0 went to key 3");
        assert_eq!(ix.lookup(&scope(), &[3; 8], 0).unwrap().loc.slot, 0);
        ix.replay(0, put(4, 2, 2));
        assert_eq!(ix.lookup(&scope(), &[2; 8], 0).unwrap().loc.slot, 2);
        assert_eq!((ix.len(), ix.bytes()), (2, 20));
        ix.replay(
            0,
            Record::Clear {
                seq: 5,
                scope: Scope::default(),
            },
        );
        assert!(ix.is_empty());
        ix.replay(0, put(6, 9, 7));
        assert!(ix.is_empty(), "a slot past the device's count is dropped");
        ix.replay(0, put(7, 1, 2));
        ix.rebuild_free();
        let mut free: Vec<u32> = (0..4)
            .filter_map(|_| ix.allocate(0))
            .map(|a| a.loc.slot)
            .collect();
        free.sort_unstable();
        assert_eq!(
            free,
            vec![0, 1, 2, 3],
            "slots 0 and 1 free again, then 3 made, then 2 evicted"
        );
    }

    #[test]
    fn allocation_takes_free_slots_then_evicts_the_least_recently_used() {
        let mut ix = Index::new(&[2, 2]);
        let a = ix.allocate(0).unwrap();
        ix.insert(
            scope(),
            [1; 8],
            DiskEntry::new(a.loc, 10, 1, Retention::Long, None, 1),
        );
        let b = ix.allocate(0).unwrap();
        assert_ne!(a.loc, b.loc);
        ix.insert(
            scope(),
            [2; 8],
            DiskEntry::new(b.loc, 10, 2, Retention::Long, None, 2),
        );
        assert!(ix.lookup(&scope(), &[1; 8], 0).is_some(), "key 1 used last");
        let c = ix.allocate(0).unwrap();
        assert_eq!(c.loc, b.loc);
        assert_eq!(c.evicted, Some((scope(), [2; 8])));
        ix.release(c.loc);
        assert_eq!(
            ix.allocate(0).unwrap().loc,
            b.loc,
            "a released slot is free again"
        );
        assert_eq!(ix.allocate(1).unwrap().loc.device, 1);
        assert!(Index::new(&[0]).allocate(0).is_none());
    }

    #[test]
    fn expiry_removal_and_snapshots() {
        let mut ix = Index::new(&[8]);
        ix.replay(
            0,
            Record::Put {
                seq: 1,
                scope: scope(),
                key: [1; 8],
                slot: 0,
                length: 10,
                checksum: 1,
                retention: Retention::Long,
                expires: Some(100),
            },
        );
        ix.replay(0, put(2, 2, 1));
        assert!(ix.contains(&scope(), &[1; 8], 99));
        assert!(ix.lookup(&scope(), &[1; 8], 100).is_none());
        assert!(
            !ix.remove(&scope(), &[2; 8], Some(1)),
            "written again since"
        );
        assert_eq!(ix.snapshot(0), vec![put(2, 2, 1)]);
        assert!(ix.remove(&scope(), &[2; 8], Some(2)));
        assert!(ix.snapshot(0).is_empty());
    }
}
