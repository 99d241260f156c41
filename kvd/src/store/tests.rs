use super::*;
use crate::arena::ArenaOptions;

fn scope() -> Scope {
    Scope {
        model: "m".into(),
        compat_key: String::new(),
    }
}

fn key(i: u8) -> Key {
    [i; 8]
}

/// A store of `slots` slots of 64 bytes (48-byte payloads), all of RAM in the arena.
fn store(slots: usize) -> Store {
    let bytes = slots * 64;
    Store::new(
        bytes as u64,
        Some(Arena::create(bytes, ArenaOptions::default()).unwrap()),
    )
}

fn value(i: u8) -> Vec<u8> {
    vec![i; 40]
}

fn has(s: &mut Store, i: u8, now: Instant) -> bool {
    s.exists(&scope(), &[key(i)], now)[0]
}

#[test]
fn eviction_takes_the_lowest_class_then_the_oldest() {
    let now = Instant::now();
    let mut s = store(3);
    s.set(&scope(), key(1), &value(1), Retention::Long, None, now)
        .unwrap();
    s.set(&scope(), key(2), &value(2), Retention::Short, None, now)
        .unwrap();
    s.set(&scope(), key(3), &value(3), Retention::Short, None, now)
        .unwrap();
    // Touch 2: 3 becomes the oldest short entry.
    assert!(s.get(&scope(), &key(2), now).is_some());
    s.set(&scope(), key(4), &value(4), Retention::Short, None, now)
        .unwrap();
    assert!(
        !has(&mut s, 3, now),
        "the least recently used short entry went"
    );
    assert!(has(&mut s, 1, now) && has(&mut s, 2, now) && has(&mut s, 4, now));
    s.set(&scope(), key(5), &value(5), Retention::Ephemeral, None, now)
        .unwrap_err();
    assert_eq!(s.stats().evictions_total, 1);
    // An ephemeral entry is evicted before short ones.
    let mut s = store(2);
    s.set(&scope(), key(1), &value(1), Retention::Short, None, now)
        .unwrap();
    s.set(&scope(), key(2), &value(2), Retention::Ephemeral, None, now)
        .unwrap();
    s.set(&scope(), key(3), &value(3), Retention::Short, None, now)
        .unwrap();
    assert!(!has(&mut s, 2, now) && has(&mut s, 1, now));
}

#[test]
fn writes_that_would_displace_higher_classes_or_downgrade_are_refused() {
    let now = Instant::now();
    let mut s = store(2);
    s.set(&scope(), key(1), &value(1), Retention::Long, None, now)
        .unwrap();
    s.set(&scope(), key(2), &value(2), Retention::Long, None, now)
        .unwrap();
    let e = s
        .set(&scope(), key(3), &value(3), Retention::Short, None, now)
        .unwrap_err();
    assert!(e.contains("displace long"), "{e}");
    let e = s
        .set(&scope(), key(1), &value(9), Retention::Short, None, now)
        .unwrap_err();
    assert!(e.contains("retention downgrade"), "{e}");
    let found = s.get(&scope(), &key(1), now).unwrap();
    assert_eq!(
        s.bytes_of(&found).unwrap(),
        value(1),
        "the refused write changed nothing"
    );
    s.set(&scope(), key(1), &value(7), Retention::Long, None, now)
        .unwrap();
    let e = s
        .set(&scope(), key(8), &value(8), Retention::Long, Some(0), now)
        .unwrap_err();
    assert!(e.contains("not stored"), "{e}");
}

#[test]
fn entries_expire_with_their_ttl() {
    let now = Instant::now();
    let mut s = store(4);
    s.set(&scope(), key(1), &value(1), Retention::Short, Some(10), now)
        .unwrap();
    assert!(
        s.get(&scope(), &key(1), now + Duration::from_secs(9))
            .is_some()
    );
    assert!(
        s.get(&scope(), &key(1), now + Duration::from_secs(10))
            .is_none()
    );
    assert_eq!(s.stats().entries, 0, "expired entries are dropped");
}

#[test]
fn memory_never_exceeds_max_bytes() {
    let now = Instant::now();
    // 4 slots of 64 bytes in the arena, and 256 bytes outside it for larger values.
    let mut s = Store::new(
        512,
        Some(Arena::create(256, ArenaOptions::default()).unwrap()),
    );
    let mut stored = 0;
    for i in 0..200u8 {
        let v = if i % 3 == 1 {
            vec![i; 100]
        } else {
            vec![i; 40]
        };
        if s.set(&scope(), key(i), &v, Retention::Short, None, now)
            .is_ok()
        {
            stored += 1;
        }
        assert!(
            s.used_bytes() <= 512,
            "{} bytes held after {i}",
            s.used_bytes()
        );
    }
    assert_eq!(stored, 200, "lower-or-equal classes always make room");
    assert!(s.stats().evictions_total > 0);
    assert_eq!(
        s.stats().spillover_bytes,
        200,
        "two 100-byte values fit beside the arena"
    );
    assert_eq!(s.stats().entries, 4 + 2);
    let e = s
        .set(&scope(), key(250), &[0; 300], Retention::Long, None, now)
        .unwrap_err();
    assert!(e.contains("outside the arena"), "{e}");
    // The arena is the whole budget: nothing larger than a slot is kept.
    let mut all_arena = store(4);
    all_arena
        .set(&scope(), key(1), &[1; 40], Retention::Short, None, now)
        .unwrap();
    assert!(
        all_arena
            .set(&scope(), key(2), &[2; 100], Retention::Short, None, now)
            .is_err()
    );
}

#[test]
fn values_outside_the_arena_never_cost_a_slot() {
    let now = Instant::now();
    let mut s = Store::new(
        64 * 2 + 10_000,
        Some(Arena::create(128, ArenaOptions::default()).unwrap()),
    );
    s.set(&scope(), key(1), &[1; 40], Retention::Short, None, now)
        .unwrap();
    for i in 10..60u8 {
        s.set(&scope(), key(i), &[i; 100], Retention::Short, None, now)
            .unwrap();
    }
    s.set(&scope(), key(2), &[2; 40], Retention::Short, None, now)
        .unwrap();
    assert!(
        has(&mut s, 1, now) && has(&mut s, 2, now),
        "both slots were still free"
    );
    assert!(
        s.reserve(40, 1, now).is_ok(),
        "a slot is still there for a lease"
    );
}

#[test]
fn a_refused_write_changes_nothing() {
    let now = Instant::now();
    // Slots: one short, one long. A short write must evict the short one only if the
    // long one is not in the way: the lowest victim is short, so it goes...
    let mut s = store(2);
    s.set(&scope(), key(1), &value(1), Retention::Short, None, now)
        .unwrap();
    s.set(&scope(), key(2), &value(2), Retention::Long, None, now)
        .unwrap();
    // ...but an ephemeral write finds the short entry above it: refused, nothing evicted.
    assert!(
        s.set(&scope(), key(3), &value(3), Retention::Ephemeral, None, now)
            .is_err()
    );
    assert!(has(&mut s, 1, now) && has(&mut s, 2, now));
    assert_eq!(s.stats().evictions_total, 0);
    // Overwriting a key with a value that cannot be stored keeps the old value.
    let mut s = Store::new(
        64 * 2 + 100,
        Some(Arena::create(128, ArenaOptions::default()).unwrap()),
    );
    s.set(&scope(), key(1), &[1; 40], Retention::Short, None, now)
        .unwrap();
    assert!(
        s.set(&scope(), key(1), &[9; 500], Retention::Short, None, now)
            .is_err()
    );
    let found = s.get(&scope(), &key(1), now).unwrap();
    assert_eq!(s.bytes_of(&found).unwrap(), vec![1; 40]);
}

#[test]
fn client_numbers_never_panic_the_store() {
    let now = Instant::now();
    let mut s = store(2);
    s.set(
        &scope(),
        key(1),
        &value(1),
        Retention::Short,
        Some(i64::MAX),
        now,
    )
    .unwrap();
    assert!(
        has(&mut s, 1, now),
        "a TTL too far to represent means no expiry"
    );
    assert!(s.reserve(u64::MAX, 1, now).is_err());
    assert!(s.reserve(u64::MAX - 8, 1, now).is_err());
    let mut fresh = store(2);
    assert!(
        fresh.reserve(1 << 20, 1, now).is_err(),
        "larger than the arena"
    );
    assert_eq!(
        fresh.slot_size(),
        0,
        "an impossible first reserve fixes no slot size"
    );
    let g = fresh.reserve(40, 1, now).unwrap();
    assert!(
        fresh
            .commit(
                g.token,
                1,
                &scope(),
                key(1),
                u64::MAX,
                Retention::Short,
                0,
                now
            )
            .is_err()
    );
    assert_eq!(fresh.leases(), 0, "a refused commit gives the lease back");
}

#[test]
fn leases_end_with_their_connection_and_only_their_owner_cancels_them() {
    let now = Instant::now();
    let mut s = store(2);
    let a = s.reserve(40, 7, now).unwrap();
    let b = s.reserve(40, 7, now).unwrap();
    assert_ne!(a.slot, b.slot);
    assert_eq!(
        s.arena().unwrap().version(a.slot) % 2,
        1,
        "a leased slot reads as being written"
    );
    assert!(s.reserve(40, 8, now).is_err(), "every slot is leased");
    assert!(!s.cancel(a.token, 8), "another connection cannot cancel it");
    assert_eq!(s.release_connection(7), 2);
    let c = s.reserve(40, 8, now).unwrap();
    s.commit(c.token, 8, &scope(), key(2), 10, Retention::Short, 0, now)
        .unwrap();
    assert!(s.get(&scope(), &key(2), now).is_some());
    assert!(
        s.commit(c.token, 8, &scope(), key(3), 10, Retention::Short, 0, now)
            .is_err(),
        "a lease commits once"
    );
    let d = s.reserve(40, 8, now).unwrap();
    assert!(
        s.commit(d.token, 8, &scope(), key(4), 10, Retention::Short, -1, now)
            .is_err(),
        "ttl < 0: not stored"
    );
}

#[test]
fn a_commit_publishes_the_bytes_written_in_place() {
    let now = Instant::now();
    let mut s = store(2);
    let g = s.reserve(32, 1, now).unwrap();
    assert_eq!(g.payload_offset, g.slot * 64 + 16);
    assert!(
        s.commit(g.token, 2, &scope(), key(1), 5, Retention::Short, 0, now)
            .is_err(),
        "another connection's lease"
    );
    s.commit(g.token, 1, &scope(), key(1), 5, Retention::Long, 0, now)
        .unwrap();
    match s.get(&scope(), &key(1), now).unwrap() {
        Found::Shared {
            offset,
            length,
            version,
            retention,
        } => {
            assert_eq!(
                (offset, length, retention),
                (g.payload_offset as u64, 5, Retention::Long)
            );
            assert_eq!(version % 2, 0);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.stats().long_bytes, 5);
    assert_eq!(
        s.clear(&Scope {
            model: "m".into(),
            compat_key: String::new()
        }),
        1
    );
    assert_eq!(s.clear(&Scope::default()), 0);
}

#[test]
fn a_promotion_keeps_newer_data_yields_after_a_clear_and_gives_way_to_any_write() {
    let now = Instant::now();
    let mut s = store(2);
    let generation = s.generation();
    s.set(&scope(), key(1), &value(9), Retention::Long, None, now)
        .unwrap();
    let (found, inserted) = s
        .promote(
            &scope(),
            key(1),
            &value(1),
            Retention::Long,
            None,
            generation,
            now,
        )
        .unwrap();
    assert_eq!(s.bytes_of(&found), Some(value(9)), "set while it was read");
    assert!(!inserted);

    let generation = s.generation();
    s.clear(&scope());
    assert!(
        s.promote(
            &scope(),
            key(2),
            &value(2),
            Retention::Long,
            None,
            generation,
            now
        )
        .is_err()
    );
    assert!(!has(&mut s, 2, now), "cleared while it was read");

    let generation = s.generation();
    s.promote(
        &scope(),
        key(2),
        &value(2),
        Retention::Long,
        Some(60),
        generation,
        now,
    )
    .unwrap();
    s.set(&scope(), key(3), &value(3), Retention::Long, None, now)
        .unwrap();
    s.set(&scope(), key(4), &value(4), Retention::Ephemeral, None, now)
        .unwrap();
    assert!(
        !has(&mut s, 2, now),
        "the copy gave way to an ephemeral write"
    );
    assert!(has(&mut s, 3, now) && has(&mut s, 4, now));
    assert_eq!(s.stats().sets_total, 3, "promotions are not sets");
}

#[test]
fn a_found_slot_rewritten_since_reads_as_nothing() {
    let now = Instant::now();
    let mut s = store(1);
    s.set(&scope(), key(1), &value(1), Retention::Short, None, now)
        .unwrap();
    let found = s.get(&scope(), &key(1), now).unwrap();
    s.set(&scope(), key(2), &value(2), Retention::Short, None, now)
        .unwrap();
    assert_eq!(s.bytes_of(&found), None, "not key 2's bytes");
}
