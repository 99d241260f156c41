//! How entries are named and framed in a shared store, whatever the backend: keys
//! namespaced by deployment namespace, model and compatibility key, and values in an
//! envelope carrying their retention and a checksum, so a torn or foreign value is a
//! miss and never returned. No I/O.

use crate::buf::Buf;
use crate::wire::{Key, Scope};
use infera_proto::retention::Retention;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes a key component keeps verbatim; every other byte is `%XX`, so components can
/// hold neither the `:` separator nor glob characters.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/')
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// `<namespace>:<model>:<compat_key>:<key hex>`.
pub fn remote_key(namespace: &str, scope: &Scope, key: &Key) -> String {
    format!(
        "{}:{}:{}:{}",
        escape(namespace),
        escape(&scope.model),
        escape(&scope.compat_key),
        hex(key)
    )
}

/// The entries a `clear` of `scope` covers (`""` fields match everything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    /// A glob over [`remote_key`] names (Redis `SCAN MATCH`).
    pub glob: String,
    /// The longest fixed prefix of every name it matches (object stores list by prefix).
    pub prefix: String,
}

/// The names a `clear` of `scope` removes.
pub fn clear_pattern(namespace: &str, scope: &Scope) -> Pattern {
    let part = |s: &str| {
        if s.is_empty() {
            "*".to_owned()
        } else {
            escape(s)
        }
    };
    let glob = format!(
        "{}:{}:{}:*",
        escape(namespace),
        part(&scope.model),
        part(&scope.compat_key)
    );
    let prefix = glob.split('*').next().unwrap_or_default().to_owned();
    Pattern { glob, prefix }
}

const MAGIC: &[u8; 4] = b"IKV1";
/// Envelope bytes before the payload: magic, retention, 3 reserved, checksum.
pub const ENVELOPE: usize = 16;

/// The stored form of a value.
pub fn seal(value: &[u8], retention: Retention) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENVELOPE + value.len());
    out.extend_from_slice(MAGIC);
    out.push(retention as u8);
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&xxh3_64(value).to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// Why a stored value was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unsealed {
    /// Not written by kvd (no magic, or too short).
    #[error("not a kvd value")]
    Foreign,
    /// The checksum does not match: torn or altered.
    #[error("checksum mismatch")]
    Corrupt,
}

/// The value and retention inside a stored form (a view: nothing is copied).
pub fn unseal(mut stored: Buf) -> Result<(Buf, Retention), Unsealed> {
    if stored.len() < ENVELOPE || &stored[..4] != MAGIC {
        return Err(Unsealed::Foreign);
    }
    let retention = *Retention::ALL
        .get(usize::from(stored[4]))
        .ok_or(Unsealed::Foreign)?;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&stored[8..16]);
    if xxh3_64(&stored[ENVELOPE..]) != u64::from_le_bytes(sum) {
        return Err(Unsealed::Corrupt);
    }
    stored.advance(ENVELOPE);
    Ok((stored, retention))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(model: &str, compat_key: &str) -> Scope {
        Scope {
            model: model.into(),
            compat_key: compat_key.into(),
        }
    }

    #[test]
    fn names_are_namespaced_and_unambiguous() {
        let key = [0xab, 0, 1, 2, 3, 4, 5, 0xff];
        assert_eq!(
            remote_key(
                "infera-kvd",
                &scope("meta-llama/Llama-3.1-8B", "bf16:tp8"),
                &key
            ),
            "infera-kvd:meta-llama/Llama-3.1-8B:bf16%3Atp8:ab000102030405ff"
        );
        assert_ne!(
            remote_key("n", &scope("a:b", "c"), &key),
            remote_key("n", &scope("a", "b:c"), &key)
        );
        assert_eq!(
            remote_key("n", &scope("", ""), &key),
            "n:::ab000102030405ff"
        );
        assert_eq!(
            remote_key("n", &scope("m*?[x]", "%"), &key),
            "n:m%2A%3F%5Bx%5D:%25:ab000102030405ff"
        );
    }

    #[test]
    fn clear_patterns_cover_their_scope() {
        let p = clear_pattern("ns", &scope("m", ""));
        assert_eq!(p.glob, "ns:m:*:*");
        assert_eq!(p.prefix, "ns:m:");
        let all = clear_pattern("ns", &scope("", ""));
        assert_eq!(
            (all.glob.as_str(), all.prefix.as_str()),
            ("ns:*:*:*", "ns:")
        );
        assert_eq!(clear_pattern("ns", &scope("", "fp8")).glob, "ns:*:fp8:*");
    }

    #[test]
    fn sealed_values_round_trip_and_damage_is_detected() {
        let sealed = seal(b"kv bytes", Retention::Long);
        assert_eq!(&sealed[..5], b"IKV1\x03");
        let (value, retention) = unseal(sealed.clone().into()).unwrap();
        assert_eq!((&value[..], retention), (&b"kv bytes"[..], Retention::Long));
        let mut torn = sealed.clone();
        torn.truncate(sealed.len() - 1);
        assert_eq!(unseal(torn.into()).unwrap_err(), Unsealed::Corrupt);
        let mut flipped = sealed;
        flipped[20] ^= 1;
        assert_eq!(unseal(flipped.into()).unwrap_err(), Unsealed::Corrupt);
        assert_eq!(
            unseal(b"plain".to_vec().into()).unwrap_err(),
            Unsealed::Foreign
        );
    }
}
