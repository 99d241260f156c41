//! The Redis/Valkey backend: RESP2 over TCP, a small pool of connections, and every
//! call bounded by a deadline so a slow or dead server costs an engine at most the
//! timeout.

use super::naming::Pattern;
use super::resp::{self, Value};
use super::{Backend, RemoteError};
use crate::buf::Buf;
use std::io::{ErrorKind, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where the server is and how to log in, from `redis://[user[:password]@]host[:port][/db]`
/// (`valkey://` is the same). Its `Debug` masks the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Host name or address.
    pub host: String,
    /// Port (6379 when not given).
    pub port: u16,
    /// ACL user.
    pub username: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// Database number.
    pub db: u32,
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisUrl")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .finish()
    }
}

/// `url` with its credentials masked, for messages and logs.
pub fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://***@{host}"),
        _ => url.to_owned(),
    }
}

/// Parses a Redis URL; the error says what is wrong with it (credentials masked).
pub fn parse_url(url: &str) -> Result<RedisUrl, String> {
    parse(url).map_err(|e| format!("{:?}: {e}", redact(url)))
}

fn parse(url: &str) -> Result<RedisUrl, String> {
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("valkey://"))
        .ok_or("expected redis://host[:port][/db] or valkey://...")?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((a, r)) => (Some(a), r),
        None => (None, rest),
    };
    let (hostport, db) = match rest.split_once('/') {
        Some((h, "")) => (h, 0),
        Some((h, d)) => (
            h,
            d.parse()
                .map_err(|_| format!("database {d:?} is not a number"))?,
        ),
        None => (rest, 0),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => (
            h,
            p.parse()
                .map_err(|_| format!("port {p:?} is not a number"))?,
        ),
        _ => (hostport, 6379),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err("no host".into());
    }
    let (username, password) = match auth {
        None => (None, None),
        Some(a) => match a.split_once(':') {
            Some((u, p)) => ((!u.is_empty()).then(|| u.to_owned()), Some(p.to_owned())),
            None => (None, Some(a.to_owned())),
        },
    };
    Ok(RedisUrl {
        host: host.to_owned(),
        port,
        username,
        password,
        db,
    })
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    /// What was read of the replies so far.
    buf: Vec<u8>,
}

/// Connections kept open for reuse.
const POOL: usize = 16;

/// A Redis or Valkey server.
#[derive(Debug)]
pub struct Redis {
    url: RedisUrl,
    timeout: Duration,
    pool: Mutex<Vec<Conn>>,
}

fn io_error(e: &std::io::Error) -> RemoteError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => RemoteError::Timeout,
        _ => RemoteError::Unavailable(e.to_string()),
    }
}

fn remaining(deadline: Instant) -> Result<Duration, RemoteError> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or(RemoteError::Timeout)
}

impl Redis {
    /// A backend for `url`, each call bounded by `timeout`.
    pub fn new(url: RedisUrl, timeout: Duration) -> Self {
        Self {
            url,
            timeout,
            pool: Mutex::new(Vec::new()),
        }
    }

    fn connect(&self, deadline: Instant) -> Result<Conn, RemoteError> {
        let addrs = (self.url.host.as_str(), self.url.port)
            .to_socket_addrs()
            .map_err(|e| RemoteError::Unavailable(format!("resolving {}: {e}", self.url.host)))?;
        let mut last = RemoteError::Unavailable(format!("{} has no address", self.url.host));
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, remaining(deadline)?) {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let mut conn = Conn {
                        stream,
                        buf: Vec::new(),
                    };
                    self.log_in(&mut conn, deadline)?;
                    return Ok(conn);
                }
                Err(e) => last = io_error(&e),
            }
        }
        Err(last)
    }

    fn log_in(&self, conn: &mut Conn, deadline: Instant) -> Result<(), RemoteError> {
        let mut cmds: Vec<Vec<Vec<u8>>> = Vec::new();
        if let Some(p) = &self.url.password {
            let mut auth = vec![b"AUTH".to_vec()];
            if let Some(u) = &self.url.username {
                auth.push(u.as_bytes().to_vec());
            }
            auth.push(p.as_bytes().to_vec());
            cmds.push(auth);
        }
        if self.url.db != 0 {
            cmds.push(vec![
                b"SELECT".to_vec(),
                self.url.db.to_string().into_bytes(),
            ]);
        }
        if cmds.is_empty() {
            return Ok(());
        }
        let refs: Vec<Vec<&[u8]>> = cmds
            .iter()
            .map(|c| c.iter().map(Vec::as_slice).collect())
            .collect();
        for reply in roundtrip(conn, &refs, deadline)? {
            if let Value::Error(e) = reply {
                return Err(RemoteError::Unavailable(format!("logging in: {e}")));
            }
        }
        Ok(())
    }

    fn checkin(&self, mut conn: Conn) {
        conn.buf.clear();
        if conn.buf.capacity() > KEEP_BUF {
            conn.buf = Vec::new();
        }
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < POOL {
            pool.push(conn);
        }
    }

    /// Runs `f` on a pooled connection, or a new one, within `budget`. A pooled
    /// connection that fails before any reply byte (the server closed it while idle) is
    /// replaced once; every command kvd sends can be sent again.
    fn with_conn<T>(
        &self,
        budget: Duration,
        f: impl Fn(&mut Conn, Instant) -> Result<T, RemoteError>,
    ) -> Result<T, RemoteError> {
        let deadline = Instant::now() + budget;
        let pooled = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        if let Some(mut conn) = pooled {
            match f(&mut conn, deadline) {
                Ok(v) => {
                    self.checkin(conn);
                    return Ok(v);
                }
                Err(RemoteError::Unavailable(_)) if conn.buf.is_empty() => {}
                Err(e) => return Err(e),
            }
        }
        let mut conn = self.connect(deadline)?;
        let v = f(&mut conn, deadline)?;
        self.checkin(conn);
        Ok(v)
    }

    /// Sends `cmds` pipelined and returns their replies, within `budget`.
    fn call(&self, cmds: &[Vec<&[u8]>], budget: Duration) -> Result<Vec<Value>, RemoteError> {
        self.with_conn(budget, |conn, deadline| roundtrip(conn, cmds, deadline))
    }
}

/// A connection's read buffer is dropped rather than kept when larger than this.
const KEEP_BUF: usize = 1 << 20;
/// Arguments at least this large are written from where they are, not copied.
const COPY_LIMIT: usize = 64 << 10;
/// Bytes read ahead when a reply's length is not known yet.
const READ_AHEAD: usize = 16 << 10;

/// Writes `bytes`; every system call waits at most what is left of the deadline.
fn write_by(stream: &mut TcpStream, bytes: &[u8], deadline: Instant) -> Result<(), RemoteError> {
    let mut at = 0;
    while at < bytes.len() {
        stream
            .set_write_timeout(Some(remaining(deadline)?))
            .map_err(|e| io_error(&e))?;
        match stream.write(&bytes[at..]) {
            Ok(0) => {
                return Err(RemoteError::Unavailable(
                    "the server stopped reading".into(),
                ));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error(&e)),
        }
    }
    Ok(())
}

fn send(conn: &mut Conn, cmds: &[Vec<&[u8]>], deadline: Instant) -> Result<(), RemoteError> {
    conn.buf.clear();
    let mut out = Vec::new();
    for c in cmds {
        out.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
        for a in c {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            if a.len() >= COPY_LIMIT {
                write_by(&mut conn.stream, &out, deadline)?;
                out.clear();
                write_by(&mut conn.stream, a, deadline)?;
            } else {
                out.extend_from_slice(a);
            }
            out.extend_from_slice(b"\r\n");
        }
    }
    write_by(&mut conn.stream, &out, deadline)
}

/// One read(2) of at most `max` bytes appended to `buf`, into its spare capacity (a
/// 32 MiB value is neither zero-filled first nor copied after).
#[allow(unsafe_code)]
fn read_appending(stream: &TcpStream, buf: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let n = max.min(spare.len());
    // SAFETY: `spare` is memory owned by `buf`, writable for at least `n` bytes; read(2)
    // writes at most `n` bytes there and reports how many.
    let got = unsafe { libc::read(stream.as_raw_fd(), spare.as_mut_ptr().cast(), n) };
    let got = usize::try_from(got).map_err(|_| std::io::Error::last_os_error())?;
    // SAFETY: read(2) initialised the first `got` (<= n) bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + got) };
    Ok(got)
}

/// Reads more of the reply starting at `conn.buf[start..]` with one system call that
/// waits at most what is left of the deadline (the rest of a bulk string once its
/// length is known).
fn fill(conn: &mut Conn, start: usize, deadline: Instant) -> Result<(), RemoteError> {
    let have = conn.buf.len() - start;
    let want = match resp::bulk_span(&conn.buf[start..]) {
        Some((_, _, total)) if total > have => total - have,
        _ => READ_AHEAD,
    };
    conn.stream
        .set_read_timeout(Some(remaining(deadline)?))
        .map_err(|e| io_error(&e))?;
    match read_appending(&conn.stream, &mut conn.buf, want) {
        Ok(0) => Err(RemoteError::Unavailable(
            "the server closed the connection".into(),
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::Interrupted => Ok(()),
        Err(e) => Err(io_error(&e)),
    }
}

fn roundtrip(
    conn: &mut Conn,
    cmds: &[Vec<&[u8]>],
    deadline: Instant,
) -> Result<Vec<Value>, RemoteError> {
    send(conn, cmds, deadline)?;
    let mut replies = Vec::with_capacity(cmds.len());
    let mut start = 0;
    while replies.len() < cmds.len() {
        if let Some((v, used)) =
            resp::parse(&conn.buf[start..]).map_err(|e| RemoteError::Protocol(e.to_string()))?
        {
            replies.push(v);
            start += used;
            continue;
        }
        fill(conn, start, deadline)?;
    }
    Ok(replies)
}

fn refused(v: &Value) -> Option<RemoteError> {
    match v {
        Value::Error(e) => Some(RemoteError::Protocol(e.clone())),
        _ => None,
    }
}

/// Least budget of a write behind (no engine waits for it; a multi-MiB value needs
/// more than a lookup's timeout).
const WRITE_BUDGET: Duration = Duration::from_secs(5);

/// SCAN's budget for one `clear`.
const CLEAR_BUDGET: Duration = Duration::from_secs(30);

impl Backend for Redis {
    fn describe(&self) -> String {
        format!(
            "redis://{}:{}/{}",
            self.url.host, self.url.port, self.url.db
        )
    }

    fn get(&self, name: &str) -> Result<Option<(Buf, Option<Duration>)>, RemoteError> {
        self.with_conn(self.timeout, |conn, deadline| {
            let cmds = [
                vec![b"GET".as_slice(), name.as_bytes()],
                vec![b"PTTL".as_slice(), name.as_bytes()],
            ];
            send(conn, &cmds, deadline)?;
            let protocol = |e: resp::Malformed| RemoteError::Protocol(e.to_string());
            loop {
                let read = &conn.buf[..];
                // The value: a bulk string (taken in place once whole) or nil.
                let (span, after) = match resp::bulk_span(read) {
                    Some((start, end, total)) if total <= read.len() => (Some((start, end)), total),
                    Some(_) => {
                        fill(conn, 0, deadline)?;
                        continue;
                    }
                    None => match resp::parse(read).map_err(protocol)? {
                        Some((Value::Bulk(None), used)) => (None, used),
                        Some((other, _)) => {
                            return Err(refused(&other).unwrap_or_else(|| {
                                RemoteError::Protocol(format!("GET answered {other:?}"))
                            }));
                        }
                        None => {
                            fill(conn, 0, deadline)?;
                            continue;
                        }
                    },
                };
                // Its time to live in ms (-1: none, -2: no key).
                let ttl = match resp::parse(&read[after..]).map_err(protocol)? {
                    Some((Value::Int(ms), _)) => u64::try_from(ms).ok().map(Duration::from_millis),
                    Some((other, _)) => {
                        return Err(RemoteError::Protocol(format!("PTTL answered {other:?}")));
                    }
                    None => {
                        fill(conn, after, deadline)?;
                        continue;
                    }
                };
                return Ok(span.map(|(start, end)| {
                    // The value is taken where it was read: no copy.
                    let data = std::mem::take(&mut conn.buf);
                    (Buf::view(data, start, end), ttl)
                }));
            }
        })
    }

    fn put(&self, name: &str, value: &[u8], ttl: Option<Duration>) -> Result<(), RemoteError> {
        let ms = ttl.map(|t| t.as_millis().max(1).to_string());
        let mut cmd: Vec<&[u8]> = vec![b"SET", name.as_bytes(), value];
        if let Some(ms) = &ms {
            cmd.extend([b"PX".as_slice(), ms.as_bytes()]);
        }
        let replies = self.call(&[cmd], self.timeout.max(WRITE_BUDGET))?;
        match replies.first() {
            Some(Value::Simple(_)) => Ok(()),
            Some(other) => Err(refused(other)
                .unwrap_or_else(|| RemoteError::Protocol(format!("SET answered {other:?}")))),
            None => Err(RemoteError::Protocol("no reply".into())),
        }
    }

    fn exists(&self, names: &[String]) -> Result<Vec<bool>, RemoteError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let cmds: Vec<Vec<&[u8]>> = names
            .iter()
            .map(|n| vec![b"EXISTS".as_slice(), n.as_bytes()])
            .collect();
        self.call(&cmds, self.timeout)?
            .into_iter()
            .map(|v| match v {
                Value::Int(n) => Ok(n > 0),
                other => Err(refused(&other).unwrap_or_else(|| {
                    RemoteError::Protocol(format!("EXISTS answered {other:?}"))
                })),
            })
            .collect()
    }

    fn clear(&self, pattern: &Pattern) -> Result<u64, RemoteError> {
        let deadline = Instant::now() + CLEAR_BUDGET;
        let mut cursor = b"0".to_vec();
        let mut removed = 0;
        loop {
            let scan = self.call(
                &[vec![
                    b"SCAN",
                    &cursor,
                    b"MATCH",
                    pattern.glob.as_bytes(),
                    b"COUNT",
                    b"1000",
                ]],
                remaining(deadline)?,
            )?;
            let Some(Value::Array(Some(parts))) = scan.into_iter().next() else {
                return Err(RemoteError::Protocol("SCAN answered no array".into()));
            };
            let mut parts = parts.into_iter();
            let (Some(Value::Bulk(Some(next))), Some(Value::Array(Some(keys)))) =
                (parts.next(), parts.next())
            else {
                return Err(RemoteError::Protocol("SCAN answered an odd array".into()));
            };
            let keys: Vec<Vec<u8>> = keys
                .into_iter()
                .filter_map(|k| match k {
                    Value::Bulk(Some(k)) => Some(k),
                    _ => None,
                })
                .collect();
            if !keys.is_empty() {
                let mut cmd: Vec<&[u8]> = vec![b"UNLINK"];
                cmd.extend(keys.iter().map(Vec::as_slice));
                if let Some(Value::Int(n)) = self.call(&[cmd], remaining(deadline)?)?.first() {
                    removed += u64::try_from(*n).unwrap_or(0);
                }
            }
            if next == b"0" {
                return Ok(removed);
            }
            cursor = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("redis://10.0.0.5:6380/2").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.db), ("10.0.0.5", 6380, 2));
        assert_eq!((u.username, u.password), (None, None));
        let u = parse_url("valkey://kvd:s3cr:et@cache.infera.svc").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.db),
            ("cache.infera.svc", 6379, 0)
        );
        assert_eq!(u.username.as_deref(), Some("kvd"));
        assert_eq!(u.password.as_deref(), Some("s3cr:et"));
        let u = parse_url("redis://:pw@[::1]:7000/").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 7000));
        assert_eq!((u.username, u.password.as_deref()), (None, Some("pw")));
        for bad in ["http://x", "redis://", "redis://h:port", "redis://h/x"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
        let err = parse_url("redis://kvd:hunter2@h:port").unwrap_err();
        assert!(
            !err.contains("hunter2") && err.contains("***@h:port"),
            "{err}"
        );
    }

    #[test]
    fn a_server_that_never_answers_costs_the_timeout() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = silent.local_addr().unwrap().port();
        let r = Redis::new(
            parse_url(&format!("redis://127.0.0.1:{port}")).unwrap(),
            Duration::from_millis(100),
        );
        let started = Instant::now();
        assert_eq!(r.get("k").unwrap_err(), RemoteError::Timeout);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(100), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        drop(silent);
    }
}
