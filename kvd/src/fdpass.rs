//! Passing the arena's memfd between processes: one data byte carrying the descriptor
//! in an `SCM_RIGHTS` control message (the daemon sends it after `hello_ack`, clients
//! receive it).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A control-message buffer with room for one descriptor.
#[allow(unsafe_code)]
fn control_buffer() -> Vec<u8> {
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    vec![0u8; space]
}

/// Runs `f` with a message of one data byte and room for one descriptor; the buffers
/// it points to live until `f` returns.
#[allow(unsafe_code)]
fn with_message<R>(f: impl FnOnce(&mut libc::msghdr) -> R) -> R {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = control_buffer();
    // SAFETY: an all-zero msghdr is a valid empty header; the pointers set below point
    // to `iov` and `control`, which outlive `f`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_controllen = control.len() as _;
    msg.msg_control = control.as_mut_ptr().cast();
    f(&mut msg)
}

/// Sends `fd` with one data byte over the socket (`SCM_RIGHTS`).
#[allow(unsafe_code)]
pub fn send_fd(socket: RawFd, fd: RawFd) -> io::Result<()> {
    with_message(|msg| {
        // SAFETY: msg_control holds CMSG_SPACE(sizeof fd) bytes, so CMSG_FIRSTHDR is a valid
        // header inside it and CMSG_DATA has room for one fd.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&*msg);
            if cmsg.is_null() {
                return Err(io::Error::other("no room for the control message"));
            }
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
        // SAFETY: a valid socket and a fully initialized msghdr.
        let sent = unsafe { libc::sendmsg(socket, &*msg, libc::MSG_NOSIGNAL) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })
}

/// Receives a descriptor sent with [`send_fd`] (blocking socket).
#[allow(unsafe_code)]
pub fn recv_fd(socket: RawFd) -> io::Result<OwnedFd> {
    with_message(|msg| {
        // SAFETY: a valid blocking socket and msghdr.
        let n = unsafe { libc::recvmsg(socket, msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel filled `control` up to msg_controllen; CMSG_FIRSTHDR/CMSG_DATA
        // stay within it, and an SCM_RIGHTS message of our size holds one fd.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&*msg);
            if cmsg.is_null()
                || (*cmsg).cmsg_level != libc::SOL_SOCKET
                || (*cmsg).cmsg_type != libc::SCM_RIGHTS
            {
                return Err(io::Error::other(
                    "hello_ack announced an arena but no fd came",
                ));
            }
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
            Ok(OwnedFd::from_raw_fd(fd))
        }
    })
}
