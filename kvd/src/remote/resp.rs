//! RESP2, the Redis/Valkey wire format: commands out as arrays of bulk strings, replies
//! parsed from a buffer that may hold only part of one. No I/O.

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`.
    Error(String),
    /// `:1`.
    Int(i64),
    /// `$n` bytes, or `$-1` (nil).
    Bulk(Option<Vec<u8>>),
    /// `*n` replies, or `*-1` (nil).
    Array(Option<Vec<Value>>),
}

/// Bytes that are not RESP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a RESP reply: {0}")]
pub struct Malformed(pub String);

/// Appends a command (`SET key value ...`) to `out`.
pub fn encode_command(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Largest bulk string accepted in a reply (Redis's own limit is 512 MiB).
const MAX_BULK: i64 = 1 << 30;

fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

fn int(bytes: &[u8]) -> Result<i64, Malformed> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Malformed(format!("bad integer {:?}", String::from_utf8_lossy(bytes))))
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, Malformed> {
    if depth > 8 {
        return Err(Malformed("nested too deep".into()));
    }
    let Some((head, next)) = line(buf, at) else {
        return Ok(None);
    };
    let Some((&kind, body)) = head.split_first() else {
        return Err(Malformed("empty line".into()));
    };
    let text = || String::from_utf8_lossy(body).into_owned();
    Ok(Some(match kind {
        b'+' => (Value::Simple(text()), next),
        b'-' => (Value::Error(text()), next),
        b':' => (Value::Int(int(body)?), next),
        b'$' => {
            let n = int(body)?;
            if n < 0 {
                return Ok(Some((Value::Bulk(None), next)));
            }
            if n > MAX_BULK {
                return Err(Malformed(format!("bulk string of {n} bytes")));
            }
            let end = next + n as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(Malformed("bulk string not ended by CRLF".into()));
            }
            (Value::Bulk(Some(buf[next..end].to_vec())), end + 2)
        }
        b'*' => {
            let n = int(body)?;
            if n < 0 {
                return Ok(Some((Value::Array(None), next)));
            }
            let mut items = Vec::new();
            let mut at = next;
            for _ in 0..n {
                match parse_at(buf, at, depth + 1)? {
                    Some((v, after)) => {
                        items.push(v);
                        at = after;
                    }
                    None => return Ok(None),
                }
            }
            (Value::Array(Some(items)), at)
        }
        other => return Err(Malformed(format!("unknown type byte {other:#04x}"))),
    }))
}

/// Parses one reply from the start of `buf`: `None` when more bytes are needed, else
/// the reply and how many bytes it took.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, Malformed> {
    parse_at(buf, 0, 0)
}

/// Where a bulk-string reply starting at `buf` keeps its bytes, once its header is in:
/// `(start, end, total)` with the value at `buf[start..end]` and the reply `total` bytes
/// long (lets a reader size its reads, and take the value without copying it).
pub fn bulk_span(buf: &[u8]) -> Option<(usize, usize, usize)> {
    let (head, next) = line(buf, 0)?;
    let (&b'$', body) = head.split_first()? else {
        return None;
    };
    let n = usize::try_from(int(body).ok()?).ok()?;
    Some((next, next + n, next + n + 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        encode_command(&mut out, &[b"SET", b"k", b"v\r\n", b"PX", b"10"]);
        assert_eq!(
            out,
            b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n$2\r\nPX\r\n$2\r\n10\r\n"
        );
    }

    #[test]
    fn parses_every_reply_type_and_waits_for_partial_ones() {
        let cases: [(&[u8], Value); 7] = [
            (b"+OK\r\n", Value::Simple("OK".into())),
            (b"-ERR no\r\n", Value::Error("ERR no".into())),
            (b":-3\r\n", Value::Int(-3)),
            (b"$-1\r\n", Value::Bulk(None)),
            (b"$4\r\na\r\nb\r\n", Value::Bulk(Some(b"a\r\nb".to_vec()))),
            (b"*-1\r\n", Value::Array(None)),
            (
                b"*2\r\n$1\r\n0\r\n*1\r\n$2\r\nk1\r\n",
                Value::Array(Some(vec![
                    Value::Bulk(Some(b"0".to_vec())),
                    Value::Array(Some(vec![Value::Bulk(Some(b"k1".to_vec()))])),
                ])),
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(parse(bytes).unwrap(), Some((want, bytes.len())));
            for cut in 0..bytes.len() {
                assert_eq!(
                    parse(&bytes[..cut]).unwrap(),
                    None,
                    "{bytes:?} cut at {cut}"
                );
            }
        }
        let two = b":1\r\n:2\r\n";
        assert_eq!(parse(two).unwrap(), Some((Value::Int(1), 4)));
    }

    #[test]
    fn refuses_what_is_not_resp() {
        for bad in [&b"?x\r\n"[..], b":x\r\n", b"$2\r\nabcd\r\n", b"\r\n"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(bulk_span(b"$10\r\nab"), Some((5, 15, 17)));
        assert_eq!(bulk_span(b"$-1\r\n"), None);
        assert_eq!(bulk_span(b"+OK\r\n"), None);
    }
}
