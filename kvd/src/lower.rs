//! The tiers below RAM, looked at together: reads fall from L3 (NVMe) to L4 (the
//! distributed store), `long` writes go to both, an L4 hit of a `long` entry is kept
//! on L3 too.

use crate::buf::Buf;
use crate::disk::Disk;
use crate::remote::Remote;
use crate::tier::Tier;
use crate::wire::{Key, Location, Scope};
use infera_proto::retention::Retention;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A value found below RAM.
#[derive(Debug)]
pub struct Fetched {
    /// Bytes.
    pub value: Buf,
    /// Retention.
    pub retention: Retention,
    /// Where it was.
    pub tier: Tier,
    /// Seconds it has left to live (`None`: no expiry).
    pub ttl_seconds: Option<i64>,
}

/// L3 and L4, each optional.
#[derive(Debug, Default, Clone)]
pub struct Lower {
    /// L3.
    pub disk: Option<Arc<Disk>>,
    /// L4.
    pub remote: Option<Arc<Remote>>,
}

impl Lower {
    /// Whether there is any tier below RAM.
    pub fn is_empty(&self) -> bool {
        self.disk.is_none() && self.remote.is_none()
    }

    /// Reads a key from L3, then L4.
    pub fn fetch(&self, scope: &Scope, key: &Key) -> Option<Fetched> {
        if let Some(f) = self.disk.as_ref().and_then(|d| d.fetch(scope, key)) {
            return Some(Fetched {
                value: f.value,
                retention: f.retention,
                tier: Tier::Nvme,
                ttl_seconds: f.ttl_seconds,
            });
        }
        // A clear while the store is asked must not be undone by keeping its answer.
        let epoch = self.disk.as_ref().map(|d| d.epoch());
        let (value, retention, ttl) = self.remote.as_ref()?.fetch(scope, key)?;
        // Whole seconds, at least one (0 would mean "not stored").
        let ttl_seconds = ttl.map(|t| t.as_secs().max(1));
        if retention == Retention::Long
            && let (Some(d), Some(epoch)) = (&self.disk, epoch)
        {
            d.fill(epoch, scope, *key, value.to_vec(), retention, ttl_seconds);
        }
        Some(Fetched {
            value,
            retention,
            tier: Tier::Remote,
            ttl_seconds: ttl_seconds.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
        })
    }

    /// Whether L3 holds the key (no I/O).
    pub fn on_disk(&self, scope: &Scope, key: &Key) -> bool {
        self.disk.as_ref().is_some_and(|d| d.contains(scope, key))
    }

    /// Writes a `long` value through to L3 and behind to L4 (other classes stay in RAM).
    pub fn write(
        &self,
        scope: &Scope,
        key: Key,
        value: Vec<u8>,
        retention: Retention,
        ttl_seconds: Option<i64>,
    ) {
        if retention != Retention::Long {
            return;
        }
        let ttl = ttl_seconds
            .and_then(|t| u64::try_from(t).ok())
            .filter(|t| *t > 0);
        if let Some(r) = &self.remote {
            r.write_behind(scope, &key, &value, retention, ttl.map(Duration::from_secs));
        }
        if let Some(d) = &self.disk {
            d.write_through(scope, key, value, retention, ttl);
        }
    }

    /// Fills in `present` for keys RAM does not hold: L3's index, then L4.
    pub fn exists(&self, scope: &Scope, keys: &[Key], present: &mut [bool]) {
        for (k, p) in keys.iter().zip(present.iter_mut()) {
            *p = *p || self.on_disk(scope, k);
        }
        let Some(r) = &self.remote else { return };
        let missing: Vec<usize> = (0..keys.len()).filter(|i| !present[*i]).collect();
        if missing.is_empty() {
            return;
        }
        let asked: Vec<Key> = missing.iter().map(|i| keys[*i]).collect();
        for (i, there) in missing.into_iter().zip(r.exists(scope, &asked)) {
            present[i] = there;
        }
    }

    /// The fastest tier holding each key, `in_ram` saying which RAM holds: RAM, then
    /// L3's index, then L4 (one pipelined query for the rest, within its deadline; an
    /// L4 that does not answer counts as a miss).
    pub fn tiers(&self, scope: &Scope, keys: &[Key], in_ram: &[bool]) -> Vec<Location> {
        let mut tiers: Vec<Location> = keys
            .iter()
            .zip(in_ram)
            .map(|(k, ram)| match (*ram, self.on_disk(scope, k)) {
                (true, _) => Location::Ram,
                (false, true) => Location::File,
                (false, false) => Location::Miss,
            })
            .collect();
        let Some(r) = &self.remote else { return tiers };
        let missing: Vec<usize> = (0..keys.len())
            .filter(|i| tiers[*i] == Location::Miss)
            .collect();
        if missing.is_empty() {
            return tiers;
        }
        let asked: Vec<Key> = missing.iter().map(|i| keys[*i]).collect();
        for (i, there) in missing.into_iter().zip(r.exists(scope, &asked)) {
            if there {
                tiers[i] = Location::Remote;
            }
        }
        tiers
    }

    /// Clears a scope on both tiers; returns the L3 entries removed (L4 is cleared in
    /// the background).
    pub fn clear(&self, scope: &Scope) -> u64 {
        if let Some(r) = &self.remote {
            r.clear(scope);
        }
        self.disk.as_ref().map_or(0, |d| d.clear(scope))
    }

    /// Counts a promotion into RAM from `tier`.
    pub fn promoted(&self, tier: Tier) {
        let counters = match tier {
            Tier::Nvme => self.disk.as_ref().map(|d| &d.counters),
            Tier::Remote => self.remote.as_ref().map(|r| &r.counters),
            Tier::Ram => None,
        };
        if let Some(c) = counters {
            c.promotions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stops taking writes; the writers drain their queues.
    pub fn close(&self) {
        if let Some(d) = &self.disk {
            d.close();
        }
        if let Some(r) = &self.remote {
            r.close();
        }
    }
}
