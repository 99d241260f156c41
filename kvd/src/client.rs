//! A blocking client for engines' connectors, tools and tests: the handshake with the
//! arena fd, requests as msgpack maps, and reads in place under the seqlock. And
//! [`send_prefetch_hint`], the one async call the gateway and the engine sidecar make:
//! a short-lived connection that says hello and leaves one `prefetch_hint`, as the
//! earlier server's `/v1/cache/prewarm` did.

use crate::arena::HEADER;
use crate::wire::{KEY_LEN, Key, Location, encode_frame};
use rmpv::Value;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering, fence};
use std::time::Duration;

/// The client's mapping of the daemon's arena.
#[derive(Debug)]
pub struct ClientArena {
    _fd: OwnedFd,
    base: *mut u8,
    size: usize,
}

impl Drop for ClientArena {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`, once.
        unsafe {
            libc::munmap(self.base.cast(), self.size);
        }
    }
}

impl ClientArena {
    #[allow(unsafe_code)]
    fn map(fd: OwnedFd, size: usize) -> io::Result<Self> {
        // SAFETY: mapping `size` bytes (the arena size the daemon announced) of the
        // memfd it passed; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                // No MAP_POPULATE: pages are charged to whoever touches them first.
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            _fd: fd,
            base: base.cast(),
            size,
        })
    }

    #[allow(unsafe_code)]
    fn word(&self, offset: usize) -> Option<&AtomicU32> {
        (offset.is_multiple_of(4) && offset + 4 <= self.size).then(|| {
            // SAFETY: in bounds and 4-byte aligned (checked), inside a mapping that
            // lives as long as `self`.
            unsafe { &*self.base.add(offset).cast::<AtomicU32>() }
        })
    }

    /// Reads `length` bytes at payload `offset` if the slot still holds `version`
    /// (seqlock); `None` when torn or replaced (fall back to an inline get).
    pub fn read(&self, offset: usize, length: usize, version: u32) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.read_into(offset, length, version, &mut out)
            .then_some(out)
    }

    /// Like [`Self::read`], into `buf` (resized to `length`); false when torn.
    #[allow(unsafe_code)]
    pub fn read_into(&self, offset: usize, length: usize, version: u32, buf: &mut Vec<u8>) -> bool {
        let Some(v) = offset.checked_sub(HEADER).and_then(|h| self.word(h)) else {
            return false;
        };
        if offset + length > self.size
            || v.load(Ordering::Acquire) != version
            || !version.is_multiple_of(2)
        {
            return false;
        }
        buf.resize(length, 0);
        // SAFETY: offset + length is inside the mapping (checked above); `buf` holds
        // `length` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset), buf.as_mut_ptr(), length) };
        fence(Ordering::Acquire);
        v.load(Ordering::Relaxed) == version
    }

    /// Writes into a leased slot's payload (zero-copy put).
    #[allow(unsafe_code)]
    pub fn write(&self, offset: usize, bytes: &[u8]) -> io::Result<()> {
        if offset + bytes.len() > self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "write past the arena",
            ));
        }
        // SAFETY: in bounds (checked); the slot is leased to this client, so nobody
        // publishes it while we write.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(offset), bytes.len())
        };
        Ok(())
    }
}

/// One `prefetch_hint`: warm these keys from the lower tiers into RAM, worth keeping for
/// `deadline_ms`. kvd does not answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefetchHint {
    /// The block keys.
    pub keys: Vec<Key>,
    /// The model they belong to ("" = none given).
    pub model: String,
    /// The engine compatibility key ("" = none given).
    pub compat_key: String,
    /// How long warmed entries are worth keeping, in milliseconds.
    pub deadline_ms: u64,
}

impl PrefetchHint {
    /// The frame's map, its fields in the earlier client's order (`keys` as bins).
    pub fn to_value(&self) -> Value {
        request_map(
            "prefetch_hint",
            vec![
                (
                    "keys",
                    Value::Array(
                        self.keys
                            .iter()
                            .map(|k| Value::Binary(k.to_vec()))
                            .collect(),
                    ),
                ),
                ("model", Value::from(self.model.as_str())),
                ("compat_key", Value::from(self.compat_key.as_str())),
                ("deadline_ms", Value::from(self.deadline_ms)),
            ],
        )
    }
}

/// Why a hint did not reach kvd.
#[derive(Debug, thiserror::Error)]
pub enum SendHintError {
    /// The socket could not be opened (no kvd there, or not this user's to open).
    #[error("could not connect to kvd at {path}: {}", errno_text(.source))]
    Connect {
        /// The socket.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// kvd did not complete the handshake (worded as the earlier client's).
    #[error("kvd handshake failed: {message}")]
    Handshake {
        /// The socket.
        path: std::path::PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The hint could not be written.
    #[error("sending to kvd at {path}: {}", errno_text(.source))]
    Send {
        /// The socket.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// kvd took longer than allowed.
    #[error("kvd at {path} did not answer within {timeout:?}")]
    Timeout {
        /// The socket.
        path: std::path::PathBuf,
        /// The bound.
        timeout: std::time::Duration,
    },
}

/// An OS error as Python words it (`[Errno 2] No such file or directory`), which the
/// earlier server's `kvd unreachable: ...` answers carried; other errors as they are.
pub fn errno_text(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(code) => {
            let text = io::Error::from_raw_os_error(code).to_string();
            let text = text
                .strip_suffix(&format!(" (os error {code})"))
                .unwrap_or(&text);
            format!("[Errno {code}] {text}")
        }
        None => e.to_string(),
    }
}

/// Says hello to kvd at `path` as `client_id` (no arena asked for), leaves `hint`, and
/// closes: the earlier server's prewarm, one short connection per hint. Bounded by
/// `timeout` as a whole.
pub async fn send_prefetch_hint(
    path: &Path,
    client_id: &str,
    hint: &PrefetchHint,
    timeout: std::time::Duration,
) -> Result<(), SendHintError> {
    let exchange = async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::UnixStream::connect(path)
            .await
            .map_err(|source| SendHintError::Connect {
                path: path.to_owned(),
                source,
            })?;
        let handshake = |message: String| SendHintError::Handshake {
            path: path.to_owned(),
            message,
        };
        let hello = request_map(
            "hello",
            vec![
                ("client_id", Value::from(client_id)),
                ("protocol_version", Value::from(1)),
                ("prefers_shared_arena", Value::from(false)),
            ],
        );
        stream
            .write_all(&encode_frame(&hello))
            .await
            .map_err(|e| handshake(errno_text(&e)))?;
        let mut len = [0u8; 4];
        stream
            .read_exact(&mut len)
            .await
            .map_err(|e| handshake(format!("no hello_ack: {}", errno_text(&e))))?;
        let n = u32::from_be_bytes(len) as usize;
        if n > 1 << 20 {
            return Err(handshake(format!("a hello_ack of {n} bytes")));
        }
        let mut body = vec![0u8; n];
        stream
            .read_exact(&mut body)
            .await
            .map_err(|e| handshake(format!("no hello_ack: {}", errno_text(&e))))?;
        let ack = rmpv::decode::read_value(&mut &body[..])
            .map_err(|e| handshake(format!("an undecodable reply: {e}")))?;
        match field(&ack, "op").and_then(Value::as_str) {
            Some("hello_ack") => {}
            _ => {
                let message = field(&ack, "message")
                    .and_then(Value::as_str)
                    .unwrap_or("not a hello_ack");
                return Err(handshake(message.to_owned()));
            }
        }
        let send = |source| SendHintError::Send {
            path: path.to_owned(),
            source,
        };
        stream
            .write_all(&encode_frame(&hint.to_value()))
            .await
            .map_err(send)?;
        stream.shutdown().await.map_err(send)?;
        Ok(())
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| SendHintError::Timeout {
            path: path.to_owned(),
            timeout,
        })?
}

/// A connection to kvd.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    arena: Option<ClientArena>,
}

/// The map of a request: `op` first, then `fields`.
pub fn request_map(op: &str, fields: Vec<(&str, Value)>) -> Value {
    let mut map = vec![(Value::from("op"), Value::from(op))];
    map.extend(fields.into_iter().map(|(k, v)| (Value::from(k), v)));
    Value::Map(map)
}

/// Field `name` of a reply map.
pub fn field<'a>(reply: &'a Value, name: &str) -> Option<&'a Value> {
    reply
        .as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// The scope of a request's keys: the model and the engine layout they belong to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientScope {
    /// The served model.
    pub model: String,
    /// The KV layout (dtype, block size, parallelism) the values are valid for.
    pub compat_key: String,
}

impl ClientScope {
    fn fields(&self) -> [(&'static str, Value); 2] {
        [
            ("model", Value::from(self.model.as_str())),
            ("compat_key", Value::from(self.compat_key.as_str())),
        ]
    }
}

fn keys_value(keys: &[[u8; KEY_LEN]]) -> Value {
    Value::Array(keys.iter().map(|k| Value::Binary(k.to_vec())).collect())
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn ints(reply: &Value, name: &str) -> Vec<i64> {
    field(reply, name)
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| v.as_i64().unwrap_or(-1)).collect())
        .unwrap_or_default()
}

impl Client {
    /// Connects and says hello; with `prefer_arena`, maps the arena the daemon passes.
    pub fn connect(path: &Path, client_id: &str, prefer_arena: bool) -> io::Result<Self> {
        Self::connect_within(path, client_id, prefer_arena, None)
    }

    /// Like [`Self::connect`], every later read and write bounded by `timeout`: an
    /// engine's connector must not hang on a daemon that stopped answering.
    pub fn connect_within(
        path: &Path,
        client_id: &str,
        prefer_arena: bool,
        timeout: Option<Duration>,
    ) -> io::Result<Self> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(timeout)?;
        stream.set_write_timeout(timeout)?;
        let mut client = Self {
            stream,
            arena: None,
        };
        let ack = client.request(&request_map(
            "hello",
            vec![
                ("client_id", Value::from(client_id)),
                ("protocol_version", Value::from(1)),
                ("prefers_shared_arena", Value::from(prefer_arena)),
            ],
        ))?;
        if let Some(Value::Array(a)) = field(&ack, "shared_arena") {
            let size = a.first().and_then(Value::as_u64).unwrap_or(0) as usize;
            let fd = crate::fdpass::recv_fd(client.stream.as_raw_fd())?;
            client.arena = Some(ClientArena::map(fd, size)?);
        }
        Ok(client)
    }

    /// The mapped arena, when the daemon passed one.
    pub fn arena(&self) -> Option<&ClientArena> {
        self.arena.as_ref()
    }

    /// Sends a frame without waiting for a reply (`prefetch_hint`).
    pub fn send(&mut self, map: &Value) -> io::Result<()> {
        self.stream.write_all(&encode_frame(map))
    }

    /// Sends a request and reads its reply.
    pub fn request(&mut self, map: &Value) -> io::Result<Value> {
        self.send(map)?;
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len)?;
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut body)?;
        rmpv::decode::read_value(&mut &body[..])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    }

    /// Stores a value; `Ok(Err(reason))` when refused.
    pub fn set(
        &mut self,
        key: [u8; KEY_LEN],
        value: &[u8],
        retention: &str,
        model: &str,
    ) -> io::Result<Result<(), String>> {
        let reply = self.request(&request_map(
            "set",
            vec![
                ("key", Value::Binary(key.to_vec())),
                ("value", Value::Binary(value.to_vec())),
                ("retention", Value::from(retention)),
                ("model", Value::from(model)),
            ],
        ))?;
        Ok(match field(&reply, "accepted").and_then(Value::as_bool) {
            Some(true) => Ok(()),
            _ => Err(field(&reply, "reason")
                .and_then(Value::as_str)
                .unwrap_or("refused")
                .to_owned()),
        })
    }

    /// Fetches a value: in place from the arena when the daemon answers with its slot
    /// (falling back to an inline copy over a second request if the read was torn).
    pub fn get(&mut self, key: [u8; KEY_LEN], model: &str) -> io::Result<Option<Vec<u8>>> {
        let map = request_map(
            "get",
            vec![
                ("key", Value::Binary(key.to_vec())),
                ("model", Value::from(model)),
            ],
        );
        let reply = self.request(&map)?;
        if field(&reply, "op").and_then(Value::as_str) == Some("get_shared_response") {
            let n = |name| field(&reply, name).and_then(Value::as_u64).unwrap_or(0);
            let (offset, length, version) = (
                n("slot_offset") as usize,
                n("length") as usize,
                n("version") as u32,
            );
            if let Some(bytes) = self
                .arena
                .as_ref()
                .and_then(|a| a.read(offset, length, version))
            {
                return Ok(Some(bytes));
            }
            return Ok(None);
        }
        Ok(field(&reply, "value")
            .and_then(|v| v.as_slice())
            .map(<[u8]>::to_vec))
    }

    /// Where each key is held (`batch_lookup_tier`): reads no value.
    pub fn batch_lookup_tier(
        &mut self,
        keys: &[[u8; KEY_LEN]],
        scope: &ClientScope,
    ) -> io::Result<Vec<Location>> {
        let mut fields = vec![("keys", keys_value(keys))];
        fields.extend(scope.fields());
        let reply = self.request(&request_map("batch_lookup_tier", fields))?;
        let tiers = field(&reply, "tiers")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(format!("batch_lookup_tier: unexpected reply {reply}")))?;
        tiers
            .iter()
            .map(|t| {
                t.as_str()
                    .and_then(Location::parse)
                    .ok_or_else(|| invalid(format!("batch_lookup_tier: unknown tier {t}")))
            })
            .collect()
    }

    /// Fetches several values in one round trip, in place from the arena when the
    /// daemon answers with slots; a value whose slot was replaced while it was read (a
    /// torn read) is fetched again inline.
    pub fn batch_get(
        &mut self,
        keys: &[[u8; KEY_LEN]],
        scope: &ClientScope,
    ) -> io::Result<Vec<Option<Vec<u8>>>> {
        let mut fields = vec![("keys", keys_value(keys))];
        fields.extend(scope.fields());
        let reply = self.request(&request_map("batch_get", fields))?;
        match field(&reply, "op").and_then(Value::as_str) {
            Some("batch_get_shared_response") => {
                let (offsets, lengths, versions) = (
                    ints(&reply, "offsets"),
                    ints(&reply, "lengths"),
                    ints(&reply, "versions"),
                );
                let mut out = Vec::with_capacity(keys.len());
                for (i, key) in keys.iter().enumerate() {
                    let at = |v: &Vec<i64>| v.get(i).copied().unwrap_or(-1);
                    let (offset, length, version) = (at(&offsets), at(&lengths), at(&versions));
                    if offset < 0 {
                        out.push(None);
                        continue;
                    }
                    let read = self
                        .arena
                        .as_ref()
                        .and_then(|a| a.read(offset as usize, length as usize, version as u32));
                    match read {
                        Some(bytes) => out.push(Some(bytes)),
                        None => out.push(self.get_inline(*key, scope)?),
                    }
                }
                Ok(out)
            }
            Some("batch_get_response") => Ok(field(&reply, "values")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|v| v.as_slice().map(<[u8]>::to_vec)).collect())
                .unwrap_or_else(|| vec![None; keys.len()])),
            _ => Err(invalid(format!("batch_get: unexpected reply {reply}"))),
        }
    }

    /// One value fetched again after a torn read: a connection with the arena is
    /// answered with its slot, read once more under the seqlock (a miss if torn again).
    fn get_inline(
        &mut self,
        key: [u8; KEY_LEN],
        scope: &ClientScope,
    ) -> io::Result<Option<Vec<u8>>> {
        let mut fields = vec![("key", Value::Binary(key.to_vec()))];
        fields.extend(scope.fields());
        let reply = self.request(&request_map("get", fields))?;
        if field(&reply, "op").and_then(Value::as_str) == Some("get_shared_response") {
            let n = |name| field(&reply, name).and_then(Value::as_u64).unwrap_or(0);
            return Ok(self.arena.as_ref().and_then(|a| {
                a.read(
                    n("slot_offset") as usize,
                    n("length") as usize,
                    n("version") as u32,
                )
            }));
        }
        Ok(field(&reply, "value")
            .and_then(|v| v.as_slice())
            .map(<[u8]>::to_vec))
    }

    /// Stores several values in one round trip, each with its retention class
    /// (`short`, `long`, ...); per value, whether it was accepted.
    pub fn batch_set(
        &mut self,
        items: &[([u8; KEY_LEN], Vec<u8>, &str)],
        scope: &ClientScope,
    ) -> io::Result<Vec<bool>> {
        let mut fields = vec![
            (
                "keys",
                Value::Array(
                    items
                        .iter()
                        .map(|(k, _, _)| Value::Binary(k.to_vec()))
                        .collect(),
                ),
            ),
            (
                "values",
                Value::Array(
                    items
                        .iter()
                        .map(|(_, v, _)| Value::Binary(v.clone()))
                        .collect(),
                ),
            ),
            (
                "retentions",
                Value::Array(items.iter().map(|(_, _, r)| Value::from(*r)).collect()),
            ),
        ];
        fields.extend(scope.fields());
        let reply = self.request(&request_map("batch_set", fields))?;
        field(&reply, "accepted")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_bool().unwrap_or(false)).collect())
            .ok_or_else(|| invalid(format!("batch_set: unexpected reply {reply}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefetch_hint_is_the_golden_frame() {
        // kvd/testdata/frames.json, "prefetch_hint": encoded by Python msgpack.
        let hint = PrefetchHint {
            keys: vec![[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]],
            model: "llama-3-8b".into(),
            compat_key: "fp16-tp1".into(),
            deadline_ms: 250,
        };
        assert_eq!(
            hex_of(&encode_frame(&hint.to_value())),
            "0000005f85a26f70ad70726566657463685f68696e74a46b65797392c4080001020304050607c40808090a0b0c0d0e0fa56d6f64656caa6c6c616d612d332d3862aa636f6d7061745f6b6579a8667031362d747031ab646561646c696e655f6d73ccfa"
        );
    }

    fn hex_of(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn os_errors_read_as_python_words_them() {
        let e = io::Error::from_raw_os_error(111);
        assert_eq!(errno_text(&e), "[Errno 111] Connection refused");
        let other = io::Error::other("fixture");
        assert_eq!(errno_text(&other), "fixture");
    }
}
