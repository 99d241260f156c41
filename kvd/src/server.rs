//! The Unix-socket server: owner-only socket, a peer-credential check, one task per
//! client, frames in and out, the memfd passed over `SCM_RIGHTS` after `hello_ack`.
//! A bad frame gets an `error` reply and the connection goes on; an oversized one
//! closes the connection; nothing a client sends stops the daemon.

use crate::daemon::Daemon;
use crate::wire::{Reply, encode_frame, parse_request};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use tokio::io::Interest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// Limits of what clients may send.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest value stored.
    pub max_value: usize,
    /// Largest frame read (values plus their envelope).
    pub max_frame: usize,
}

/// Binds the socket: a stale socket file is replaced, a live one refused; the file is
/// made owner-only.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is served by another kvd", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

async fn send_fd(stream: &UnixStream, fd: RawFd) -> io::Result<()> {
    loop {
        stream.writable().await?;
        match stream.try_io(Interest::WRITABLE, || {
            crate::fdpass::send_fd(stream.as_raw_fd(), fd)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

#[allow(unsafe_code)]
fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

async fn write_reply(stream: &mut UnixStream, reply: Reply) -> io::Result<()> {
    stream.write_all(&encode_frame(&reply.into_value())).await
}

/// Serves one client until it leaves or breaks the framing.
pub async fn serve_connection(mut stream: UnixStream, daemon: Arc<Daemon>, limits: Limits) {
    // Only the daemon's own user, or one allowed with --allow-uid (SO_PEERCRED).
    let uid = own_uid();
    match stream.peer_cred() {
        Ok(cred) if daemon.peer_allowed(cred.uid(), uid) => {}
        Ok(cred) => {
            tracing::warn!(
                peer_uid = cred.uid(),
                "refused a connection from another user"
            );
            return;
        }
        Err(e) => {
            tracing::warn!("refused a connection without peer credentials: {e}");
            return;
        }
    }
    let mut conn = daemon.connect();
    loop {
        let mut len = [0u8; 4];
        if stream.read_exact(&mut len).await.is_err() {
            break;
        }
        let n = u32::from_be_bytes(len) as usize;
        if n > limits.max_frame {
            daemon.metrics.error("malformed_frame");
            let reply = Reply::Error {
                code: "malformed_frame".into(),
                message: format!(
                    "frame of {n} bytes exceeds the limit of {} bytes; closing",
                    limits.max_frame
                ),
            };
            let _ = write_reply(&mut stream, reply).await;
            break;
        }
        let mut body = vec![0u8; n];
        if stream.read_exact(&mut body).await.is_err() {
            break;
        }
        let reply = match parse_request(&body, limits.max_value) {
            Ok(request) if daemon.lower.is_empty() => daemon.handle(request, &mut conn),
            // A lookup may read a disk or a remote store: off the async workers.
            Ok(request) => tokio::task::block_in_place(|| daemon.handle(request, &mut conn)),
            Err(e) => {
                daemon.metrics.error(e.code);
                Some(e.reply())
            }
        };
        let Some(reply) = reply else { continue };
        let pass_fd = matches!(reply, Reply::HelloAck { arena: Some(_), .. });
        if write_reply(&mut stream, reply).await.is_err() {
            break;
        }
        if pass_fd {
            let fd = daemon
                .store
                .lock()
                .ok()
                .and_then(|s| s.arena().map(|a| a.fd()));
            if let Some(fd) = fd
                && let Err(e) = send_fd(&stream, fd).await
            {
                tracing::warn!(conn = conn.id, "passing the arena fd: {e}");
                break;
            }
        }
    }
    daemon.disconnect(&conn);
}

/// Accepts clients until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    daemon: Arc<Daemon>,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve_connection(stream, daemon.clone(), limits));
                }
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}
