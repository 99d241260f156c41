use super::*;
use std::sync::Arc;

fn scope(model: &str) -> Scope {
    Scope {
        model: model.into(),
        compat_key: String::new(),
    }
}

/// A 4 MiB tier of 8 KiB slots in `dir`.
fn options(dir: &std::path::Path) -> DiskOptions {
    DiskOptions {
        paths: vec![dir.to_owned()],
        bytes: Some(4 << 20),
        min_free: 0,
        io: IoMode::Auto,
        slot_bytes: Some(8192),
        queue_bytes: 64 << 20,
        compact_min_bytes: COMPACT_MIN,
    }
}

fn open(dir: &std::path::Path, compact_min_bytes: u64) -> Arc<Disk> {
    Arc::new(
        Disk::open(&DiskOptions {
            compact_min_bytes,
            ..options(dir)
        })
        .unwrap(),
    )
}

/// A value of `key`, `version`, as copied from the store as of `epoch`.
fn fill(disk: &Disk, epoch: u64, key: u8, version: u32) {
    disk.fill(
        epoch,
        &scope("m"),
        [key; 8],
        value(key, version),
        Retention::Long,
        None,
    );
}

fn value(key: u8, version: u32) -> Vec<u8> {
    let mut v = vec![key; 4096];
    v[..4].copy_from_slice(&version.to_le_bytes());
    v
}

/// Runs the writer until everything queued is written, then stops it.
fn drain(disk: &Arc<Disk>) {
    let writer = {
        let d = disk.clone();
        std::thread::spawn(move || d.run_writer(0))
    };
    disk.close();
    writer.join().unwrap();
}

/// The fetched value's (key byte, version), to compare without printing 4 KiB.
fn fetched(disk: &Disk, model: &str, key: u8) -> Option<(u8, u32)> {
    disk.fetch(&scope(model), &[key; 8]).map(|h| {
        let v = h.value.to_vec();
        assert_eq!(v.len(), 4096);
        (v[4], u32::from_le_bytes([v[0], v[1], v[2], v[3]]))
    })
}

fn version(key: u8, version: u32) -> Option<(u8, u32)> {
    Some((key, version))
}

#[test]
fn compaction_keeps_every_live_entry_and_shrinks_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let disk = open(dir.path(), 16 << 10);
    for version in 0..100u32 {
        for key in 0..20u8 {
            disk.write_through(
                &scope("m"),
                [key; 8],
                value(key, version),
                Retention::Long,
                None,
            );
        }
    }
    drain(&disk);
    // Writes of a key queued together are written once; well over 16 KiB of records
    // were appended either way.
    let writes = disk.counters.writes.load(Ordering::Relaxed);
    assert!(writes >= 500, "{writes}");
    let journal = disk.report().journal_bytes;
    assert!(
        journal < 64 << 10,
        "2,000 records, compacted: {journal} bytes"
    );
    drop(disk);
    let disk = open(dir.path(), 16 << 10);
    for key in 0..20u8 {
        assert_eq!(fetched(&disk, "m", key), version(key, 99), "key {key}");
    }
}

#[test]
fn a_write_that_fails_drops_the_older_value_too() {
    let dir = tempfile::tempdir().unwrap();
    let disk = open(dir.path(), COMPACT_MIN);
    disk.write_through(&scope("m"), [1; 8], value(1, 0), Retention::Long, None);
    disk.write_through(&scope("m"), [1; 8], vec![1; 9000], Retention::Long, None);
    drain(&disk);
    assert_eq!(disk.counters.failure_count("write", "too_large"), 1);
    assert_eq!(fetched(&disk, "m", 1), None, "not the older bytes");
    drop(disk);
    let disk = open(dir.path(), COMPACT_MIN);
    assert_eq!(fetched(&disk, "m", 1), None, "nor after a restart");
}

#[test]
fn a_clear_drops_queued_writes_of_its_scope_only() {
    let dir = tempfile::tempdir().unwrap();
    let disk = open(dir.path(), COMPACT_MIN);
    for key in 0..4u8 {
        disk.write_through(&scope("a"), [key; 8], value(key, 0), Retention::Long, None);
        disk.write_through(&scope("b"), [key; 8], value(key, 0), Retention::Long, None);
    }
    assert_eq!(disk.clear(&scope("a")), 0, "nothing written yet");
    let epoch_before = disk.epoch() - 1;
    disk.fill(
        epoch_before,
        &scope("a"),
        [9; 8],
        value(9, 0),
        Retention::Long,
        None,
    );
    disk.write_through(&scope("a"), [8; 8], value(8, 0), Retention::Long, None);
    drain(&disk);
    for key in 0..4u8 {
        assert_eq!(fetched(&disk, "a", key), None, "cleared while queued");
        assert_eq!(fetched(&disk, "b", key), version(key, 0), "another model's");
    }
    assert_eq!(fetched(&disk, "a", 9), None, "read before the clear");
    assert_eq!(fetched(&disk, "a", 8), version(8, 0), "written after it");
}

#[test]
fn a_directory_serves_one_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path(), COMPACT_MIN);
    let second = Disk::open(&options(dir.path()));
    let err = second.unwrap_err().to_string();
    assert!(err.contains("in use by another kvd"), "{err}");
}

#[test]
fn expiry_survives_a_restart_and_is_handed_to_ram() {
    let dir = tempfile::tempdir().unwrap();
    let disk = open(dir.path(), COMPACT_MIN);
    disk.write_through(
        &scope("m"),
        [1; 8],
        value(1, 0),
        Retention::Long,
        Some(3600),
    );
    drain(&disk);
    drop(disk);
    let disk = open(dir.path(), COMPACT_MIN);
    let hit = disk.fetch(&scope("m"), &[1; 8]).unwrap();
    let ttl = hit.ttl_seconds.unwrap();
    assert!((3590..=3600).contains(&ttl), "{ttl}");
}

/// Writes what is queued now, as the writer thread would, without stopping the queue.
fn step(disk: &Disk) {
    if !disk.queues[0].is_empty() {
        let batch = disk.queues[0].pop_batch(BATCH);
        disk.write_batch(0, batch);
    }
}

#[test]
fn a_copy_from_the_store_never_replaces_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let disk = open(dir.path(), COMPACT_MIN);
    let epoch = disk.epoch();
    disk.write_through(&scope("m"), [1; 8], value(1, 2), Retention::Long, None);
    fill(&disk, epoch, 1, 1);
    step(&disk);
    assert_eq!(
        fetched(&disk, "m", 1),
        version(1, 2),
        "the write, queued first"
    );
    fill(&disk, epoch, 1, 1);
    step(&disk);
    assert_eq!(
        fetched(&disk, "m", 1),
        version(1, 2),
        "a held key is not filled"
    );
    fill(&disk, epoch, 2, 1);
    step(&disk);
    assert_eq!(fetched(&disk, "m", 2), version(2, 1), "a missing key is");
}

#[test]
fn a_write_dropped_for_a_full_queue_takes_the_older_values_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(
        Disk::open(&DiskOptions {
            queue_bytes: 4096,
            ..options(dir.path())
        })
        .unwrap(),
    );
    disk.write_through(&scope("m"), [1; 8], value(1, 1), Retention::Long, None);
    step(&disk);
    assert_eq!(fetched(&disk, "m", 1), version(1, 1));
    disk.write_through(&scope("m"), [1; 8], value(1, 2), Retention::Long, None);
    disk.write_through(&scope("m"), [1; 8], value(1, 3), Retention::Long, None);
    assert_eq!(disk.counters.failure_count("write", "queue_full"), 1);
    assert_eq!(fetched(&disk, "m", 1), None, "gone at once");
    step(&disk);
    assert_eq!(fetched(&disk, "m", 1), None, "not version 2, queued before");
    drop(disk);
    let disk = open(dir.path(), COMPACT_MIN);
    assert_eq!(
        fetched(&disk, "m", 1),
        None,
        "nor version 1 after a restart"
    );
}
