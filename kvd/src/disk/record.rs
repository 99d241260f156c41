//! The NVMe tier's journal records and their framing. Every record is
//! `u32 LE body length | u64 LE xxh3 of the body | body`, so a record cut short by a crash
//! or altered on disk is recognised; reading stops at the first such record and what
//! follows is dropped (appends are sequential, so it can only be the torn tail or
//! damage). No I/O.

use crate::wire::{KEY_LEN, Key, Scope};
use infera_proto::retention::Retention;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes before a record's body.
pub const FRAME: usize = 12;
/// Largest body accepted (scope strings are bounded by the wire's frame limit; this
/// bounds what a damaged length can make a reader allocate).
const MAX_BODY: usize = 1 << 20;

/// A journal record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// `key` is in `slot` of this device: `length` bytes whose xxh3 is `checksum`.
    Put {
        /// Order across all devices; a later record wins.
        seq: u64,
        /// Scope.
        scope: Scope,
        /// Key.
        key: Key,
        /// Slot in the container file.
        slot: u32,
        /// Value length.
        length: u64,
        /// xxh3 of the value.
        checksum: u64,
        /// Retention.
        retention: Retention,
        /// Expiry, Unix seconds (`None`: none).
        expires: Option<u64>,
    },
    /// `key` is gone.
    Remove {
        /// Order.
        seq: u64,
        /// Scope.
        scope: Scope,
        /// Key.
        key: Key,
    },
    /// Every entry of `scope` (`""` fields match all) written before is gone.
    Clear {
        /// Order.
        seq: u64,
        /// Scope.
        scope: Scope,
    },
}

impl Record {
    /// Its order.
    pub fn seq(&self) -> u64 {
        match self {
            Self::Put { seq, .. } | Self::Remove { seq, .. } | Self::Clear { seq, .. } => *seq,
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_scope(out: &mut Vec<u8>, scope: &Scope) {
    put_str(out, &scope.model);
    put_str(out, &scope.compat_key);
}

/// Appends the framed record to `out`.
pub fn encode(record: &Record, out: &mut Vec<u8>) {
    let mut body = Vec::with_capacity(96);
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
            body.push(1);
            body.extend_from_slice(&seq.to_le_bytes());
            put_scope(&mut body, scope);
            body.extend_from_slice(key);
            body.extend_from_slice(&slot.to_le_bytes());
            body.extend_from_slice(&length.to_le_bytes());
            body.extend_from_slice(&checksum.to_le_bytes());
            body.push(*retention as u8);
            body.extend_from_slice(&expires.unwrap_or(0).to_le_bytes());
        }
        Record::Remove { seq, scope, key } => {
            body.push(2);
            body.extend_from_slice(&seq.to_le_bytes());
            put_scope(&mut body, scope);
            body.extend_from_slice(key);
        }
        Record::Clear { seq, scope } => {
            body.push(3);
            body.extend_from_slice(&seq.to_le_bytes());
            put_scope(&mut body, scope);
        }
    }
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&xxh3_64(&body).to_le_bytes());
    out.extend_from_slice(&body);
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }
    fn str(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn scope(&mut self) -> Option<Scope> {
        Some(Scope {
            model: self.str()?,
            compat_key: self.str()?,
        })
    }
    fn key(&mut self) -> Option<Key> {
        self.take(KEY_LEN)?.try_into().ok()
    }
}

fn decode_body(body: &[u8]) -> Option<Record> {
    let mut r = Reader { bytes: body, at: 0 };
    let kind = r.u8()?;
    let seq = r.u64()?;
    let scope = r.scope()?;
    let record = match kind {
        1 => Record::Put {
            seq,
            scope,
            key: r.key()?,
            slot: r.u32()?,
            length: r.u64()?,
            checksum: r.u64()?,
            retention: *Retention::ALL.get(usize::from(r.u8()?))?,
            expires: Some(r.u64()?).filter(|e| *e != 0),
        },
        2 => Record::Remove {
            seq,
            scope,
            key: r.key()?,
        },
        3 => Record::Clear { seq, scope },
        _ => return None,
    };
    (r.at == body.len()).then_some(record)
}

/// The records of a journal, in order, and how many leading bytes hold them: anything
/// after is a torn or damaged tail to be cut off.
pub fn decode_all(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some(head) = bytes.get(at..at + FRAME) {
        let mut len = [0u8; 4];
        len.copy_from_slice(&head[..4]);
        let len = u32::from_le_bytes(len) as usize;
        let mut sum = [0u8; 8];
        sum.copy_from_slice(&head[4..12]);
        if len > MAX_BODY {
            break;
        }
        let Some(body) = bytes.get(at + FRAME..at + FRAME + len) else {
            break;
        };
        if xxh3_64(body) != u64::from_le_bytes(sum) {
            break;
        }
        let Some(record) = decode_body(body) else {
            break;
        };
        records.push(record);
        at += FRAME + len;
    }
    (records, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(m: &str) -> Scope {
        Scope {
            model: m.into(),
            compat_key: "bf16".into(),
        }
    }

    fn sample() -> Vec<Record> {
        vec![
            Record::Put {
                seq: 7,
                scope: scope("llama"),
                key: *b"abcdefgh",
                slot: 3,
                length: 4096,
                checksum: 0xdead_beef,
                retention: Retention::Long,
                expires: Some(1_900_000_000),
            },
            Record::Remove {
                seq: 8,
                scope: scope("llama"),
                key: *b"abcdefgh",
            },
            Record::Clear {
                seq: 9,
                scope: scope(""),
            },
        ]
    }

    #[test]
    fn records_round_trip_in_a_fixed_layout() {
        let mut bytes = Vec::new();
        for r in sample() {
            encode(&r, &mut bytes);
        }
        let (records, valid) = decode_all(&bytes);
        assert_eq!(records, sample());
        assert_eq!(valid, bytes.len());
        let mut clear = Vec::new();
        encode(
            &Record::Clear {
                seq: 1,
                scope: Scope::default(),
            },
            &mut clear,
        );
        let body = [3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(&clear[..4], &(body.len() as u32).to_le_bytes());
        assert_eq!(&clear[4..12], &xxh3_64(&body).to_le_bytes());
        assert_eq!(&clear[12..], &body);
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_journal() {
        let mut bytes = Vec::new();
        for r in sample() {
            encode(&r, &mut bytes);
        }
        for cut in 0..bytes.len() {
            let (records, valid) = decode_all(&bytes[..cut]);
            assert!(records.len() < 3, "cut at {cut}");
            assert_eq!(records[..], sample()[..records.len()]);
            assert!(valid <= cut);
        }
        let mut ends = Vec::new();
        let mut acc = Vec::new();
        for r in sample() {
            encode(&r, &mut acc);
            ends.push(acc.len());
        }
        for flip in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[flip] ^= 0x40;
            let (records, valid) = decode_all(&damaged);
            let intact = ends.iter().filter(|end| **end <= flip).count();
            assert_eq!(records, sample()[..intact], "flip at {flip}");
            assert_eq!(valid, if intact == 0 { 0 } else { ends[intact - 1] });
        }
    }
}
