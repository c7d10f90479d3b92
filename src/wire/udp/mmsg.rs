//! Batched UDP I/O: `recvmmsg(2)` and `sendmmsg(2)`, one system call per
//! batch instead of one per datagram. Under load the kernel's per-call cost
//! dominates a DNS server's CPU (the answer itself is ~0.1 µs), so batching
//! is where per-query CPU is saved; Knot DNS and gdnsd do the same.
//!
//! The only `unsafe` code of the server is here (besides the allocator's
//! options symbol in `main.rs`): building the C message
//! headers that point into our buffers for the duration of one call.
#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::RawFd;

/// Datagrams per system call.
pub(crate) const BATCH: usize = 32;
/// Largest query read; a longer datagram is dropped (no real DNS query over
/// UDP is that long, and answering a truncated one would be a guess).
pub(crate) const MAX_QUERY: usize = 4096;

/// A peer address as the kernel wrote it.
#[derive(Clone, Copy)]
pub(crate) struct Peer {
    addr: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl Default for Peer {
    fn default() -> Self {
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid
        // (AF_UNSPEC) value.
        Self { addr: unsafe { zeroed() }, len: 0 }
    }
}

impl Peer {
    /// The peer's IP address (the answer policies' client), when it is an
    /// IPv4 or IPv6 address.
    pub(crate) fn ip(&self) -> Option<std::net::IpAddr> {
        match i32::from(self.addr.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in,
                // which is smaller than sockaddr_storage and less aligned.
                let a = unsafe { &*(&raw const self.addr).cast::<libc::sockaddr_in>() };
                Some(std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)).into())
            }
            libc::AF_INET6 => {
                // SAFETY: as above, for sockaddr_in6.
                let a = unsafe { &*(&raw const self.addr).cast::<libc::sockaddr_in6>() };
                Some(std::net::Ipv6Addr::from(a.sin6_addr.s6_addr).into())
            }
            _ => None,
        }
    }
}

/// Receives up to `bufs.len()` datagrams (at most [`BATCH`]), blocking for
/// the first one (the socket's receive timeout applies) and taking the rest
/// only if already queued. Fills `lens` (0 for an oversized datagram) and
/// `peers`; returns how many arrived.
pub(crate) fn recv(
    fd: RawFd,
    bufs: &mut [[u8; MAX_QUERY]],
    lens: &mut [usize],
    peers: &mut [Peer],
) -> io::Result<usize> {
    let n = bufs.len().min(lens.len()).min(peers.len()).min(BATCH);
    // SAFETY: iovec and mmsghdr are plain C structs; all-zero means null
    // pointers and zero lengths, which the loop below overwrites for the
    // first `n` entries (the only ones passed to the kernel).
    let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
    for i in 0..n {
        iovs[i] = libc::iovec { iov_base: bufs[i].as_mut_ptr().cast(), iov_len: MAX_QUERY };
        let h = &mut hdrs[i].msg_hdr;
        h.msg_iov = &mut iovs[i];
        h.msg_iovlen = 1;
        h.msg_name = (&mut peers[i].addr as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    }
    // SAFETY: each of the `n` headers points at a distinct buffer, iovec and
    // address slot that are exclusively borrowed for this call and outlive
    // it; the kernel writes at most `iov_len` / `msg_namelen` bytes there.
    let got = unsafe {
        libc::recvmmsg(
            fd,
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            // c_int on glibc, c_uint on musl (the static build).
            libc::MSG_WAITFORONE as _,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let got = got as usize;
    for i in 0..got {
        let h = &hdrs[i];
        lens[i] = if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 { 0 } else { h.msg_len as usize };
        peers[i].len = h.msg_hdr.msg_namelen;
    }
    Ok(got)
}

/// Sends `msgs[i]` to `peers[i]` for as many as the kernel takes in one call
/// (at most [`BATCH`]); returns how many were sent. An error concerns the
/// first datagram (its destination); the caller skips it and continues.
pub(crate) fn send(fd: RawFd, msgs: &[Vec<u8>], peers: &[Peer]) -> io::Result<usize> {
    let n = msgs.len().min(peers.len()).min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: as in `recv`: zeroed C structs, the first `n` filled below.
    let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
    let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
    for i in 0..n {
        iovs[i] = libc::iovec { iov_base: msgs[i].as_ptr().cast_mut().cast(), iov_len: msgs[i].len() };
        let h = &mut hdrs[i].msg_hdr;
        h.msg_iov = &mut iovs[i];
        h.msg_iovlen = 1;
        h.msg_name = (&peers[i].addr as *const libc::sockaddr_storage).cast_mut().cast();
        h.msg_namelen = peers[i].len;
    }
    // SAFETY: the headers point at `msgs` and `peers`, borrowed for this
    // call; sendmmsg only reads through `msg_iov` and `msg_name`.
    let sent = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sent as usize)
}
