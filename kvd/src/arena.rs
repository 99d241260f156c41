//! The shared arena: one memfd, mapped read-write here and by every engine that asked
//! for it, cut into fixed slots. A slot is a 16-byte header (u32 LE version, odd while a
//! write is in progress; u32 LE length; 8 reserved bytes) and the payload. Writers bump
//! the version to odd, write, set the length and bump it to even; readers in any process
//! read the version, the payload, the version again, and trust the bytes only when both
//! are the same even number (a seqlock). Versions only grow, so a reused slot never
//! looks like the value it held before.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering, fence};

/// Bytes of a slot header.
pub const HEADER: usize = 16;
/// Slots are multiples of this.
pub const ALIGN: usize = 64;

/// How to create the arena.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArenaOptions {
    /// Back it with huge pages (`MFD_HUGETLB`; the size must be a multiple of them).
    pub hugetlb: bool,
    /// Lock it in RAM (`mlock`), so offloaded KV is never swapped.
    pub mlock: bool,
}

/// A mapped memfd.
#[derive(Debug)]
pub struct Arena {
    fd: OwnedFd,
    base: *mut u8,
    size: usize,
    slot_size: usize,
}

// SAFETY: the mapping is owned by the Arena and unmapped only in Drop; every access goes
// through methods that bound offsets by `size`, and slot headers are accessed with
// atomics. The daemon serializes its own writers behind the store's lock.
#[allow(unsafe_code)]
unsafe impl Send for Arena {}
// SAFETY: see Send; shared references only read headers atomically or copy out of
// slots the store says are published.
#[allow(unsafe_code)]
unsafe impl Sync for Arena {}

/// The slot size for a payload of `payload` bytes (header included, rounded up to
/// [`ALIGN`]); `None` when that overflows.
pub fn slot_size_for(payload: usize) -> Option<usize> {
    Some(HEADER.checked_add(payload)?.div_ceil(ALIGN) * ALIGN)
}

impl Arena {
    /// Creates and maps a memfd of `size` bytes.
    #[allow(unsafe_code)]
    pub fn create(size: usize, options: ArenaOptions) -> io::Result<Self> {
        if size == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "arena size 0"));
        }
        let mut flags = libc::MFD_CLOEXEC;
        if options.hugetlb {
            flags |= libc::MFD_HUGETLB;
        }
        // SAFETY: the name is a NUL-terminated C string literal; memfd_create returns a
        // new descriptor or -1.
        let raw = unsafe { libc::memfd_create(c"infera-kvd-arena".as_ptr(), flags) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor this function owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = libc::off_t::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "arena size too large"))?;
        // SAFETY: ftruncate on an owned, valid descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: mapping `size` bytes of a descriptor just sized to `size`; the result
        // is checked against MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `base` maps `size` bytes (checked above).
        if options.mlock && unsafe { libc::mlock(base, size) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping the mapping made above, once.
            unsafe { libc::munmap(base, size) };
            return Err(e);
        }
        Ok(Self {
            fd,
            base: base.cast(),
            size,
            slot_size: 0,
        })
    }

    /// The memfd (sent to clients over `SCM_RIGHTS`).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Bytes mapped.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Slot size (0 until the first value fixes it).
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Fixes the slot size for payloads of `payload` bytes when it is not fixed yet (the
    /// first put decides; a payload that does not fit the arena fixes nothing); returns
    /// the slot size (0: not fixed).
    pub fn fix_slot_size(&mut self, payload: usize) -> usize {
        if self.slot_size == 0
            && let Some(size) = slot_size_for(payload).filter(|s| *s <= self.size)
        {
            self.slot_size = size;
        }
        self.slot_size
    }

    /// Slots a payload of `payload` bytes can use: fixes the slot size if needed; 0 when
    /// it does not fit a slot.
    pub fn slots_for(&mut self, payload: usize) -> usize {
        self.fix_slot_size(payload);
        if payload <= self.payload_max() {
            self.slots()
        } else {
            0
        }
    }

    /// Slots the arena holds.
    pub fn slots(&self) -> usize {
        self.size.checked_div(self.slot_size).unwrap_or(0)
    }

    /// Most payload bytes a slot holds.
    pub fn payload_max(&self) -> usize {
        self.slot_size.saturating_sub(HEADER)
    }

    /// Offset of slot `slot`'s payload in the memfd.
    pub fn payload_offset(&self, slot: usize) -> usize {
        slot * self.slot_size + HEADER
    }

    #[allow(unsafe_code)]
    fn header_word(&self, slot: usize, word: usize) -> &AtomicU32 {
        let offset = slot * self.slot_size + word * 4;
        assert!(
            offset + 4 <= self.size && self.slot_size >= HEADER,
            "slot {slot} out of the arena"
        );
        // SAFETY: offset is inside the mapping (asserted), 4-byte aligned (slots are
        // 64-byte aligned, the mapping page aligned) and lives as long as `self`;
        // AtomicU32 has the layout of u32.
        unsafe { &*self.base.add(offset).cast::<AtomicU32>() }
    }

    /// The slot's current version.
    pub fn version(&self, slot: usize) -> u32 {
        self.header_word(slot, 0).load(Ordering::Acquire)
    }

    /// Marks a slot as being written (version made odd); returns the odd version.
    pub fn begin_write(&self, slot: usize) -> u32 {
        let v = self.header_word(slot, 0);
        let now = v.load(Ordering::Relaxed);
        let odd = if now.is_multiple_of(2) {
            now.wrapping_add(1)
        } else {
            now
        };
        v.store(odd, Ordering::Relaxed);
        // Readers that see the payload change also see the odd version before it.
        fence(Ordering::Release);
        odd
    }

    /// Publishes a slot written in place (by this process or a client): sets the length
    /// and makes the version even; returns the new version.
    pub fn publish(&self, slot: usize, length: usize) -> u32 {
        self.header_word(slot, 1)
            .store(u32::try_from(length).unwrap_or(u32::MAX), Ordering::Relaxed);
        let v = self.header_word(slot, 0);
        let now = v.load(Ordering::Relaxed);
        let even = if now % 2 == 1 {
            now.wrapping_add(1)
        } else {
            now.wrapping_add(2)
        };
        v.store(even, Ordering::Release);
        even
    }

    /// Writes `data` into `slot` under the seqlock; returns the published version.
    #[allow(unsafe_code)]
    pub fn write(&self, slot: usize, data: &[u8]) -> u32 {
        assert!(
            data.len() <= self.payload_max(),
            "payload larger than a slot"
        );
        self.begin_write(slot);
        let offset = self.payload_offset(slot);
        // SAFETY: offset + len <= (slot + 1) * slot_size <= size (the slot index is
        // within `slots()`, asserted by header_word, and len <= payload_max); the
        // source is a separate Rust slice, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.add(offset), data.len());
        }
        self.publish(slot, data.len())
    }

    /// Copies a slot's payload out under the seqlock, `None` if a writer kept it busy
    /// (or it changed) through a few attempts.
    #[allow(unsafe_code)]
    pub fn read(&self, slot: usize) -> Option<Vec<u8>> {
        for _ in 0..8 {
            let before = self.version(slot);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let len = (self.header_word(slot, 1).load(Ordering::Relaxed) as usize)
                .min(self.payload_max());
            let mut out = vec![0u8; len];
            // SAFETY: the range is inside the slot (len <= payload_max), inside the
            // mapping; `out` is a fresh allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.add(self.payload_offset(slot)),
                    out.as_mut_ptr(),
                    len,
                );
            }
            fence(Ordering::Acquire);
            if self.version(slot) == before {
                return Some(out);
            }
        }
        None
    }
}

impl Drop for Arena {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `create`, once.
        unsafe {
            libc::munmap(self.base.cast(), self.size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn slots_are_aligned_and_round_trip() {
        let mut a = Arena::create(1 << 20, ArenaOptions::default()).unwrap();
        assert_eq!(a.slot_size(), 0);
        assert_eq!(a.fix_slot_size(4096), 4160);
        assert_eq!(a.fix_slot_size(10), 4160, "fixed by the first put");
        assert_eq!(a.slots(), (1 << 20) / 4160);
        assert_eq!(a.payload_offset(3), 3 * 4160 + 16);
        let v1 = a.write(3, b"hello");
        assert_eq!(v1 % 2, 0);
        assert_eq!(a.read(3).unwrap(), b"hello");
        let v2 = a.write(3, b"again");
        assert!(v2 > v1, "versions only grow");
        let odd = a.begin_write(5);
        assert_eq!(odd % 2, 1);
        assert_eq!(a.read(5), None, "a slot being written is never read");
        assert_eq!(a.publish(5, 0), odd + 1);
    }

    #[test]
    fn a_reader_racing_a_writer_never_sees_torn_bytes() {
        let mut a = Arena::create(1 << 16, ArenaOptions::default()).unwrap();
        a.fix_slot_size(4000);
        let a = Arc::new(a);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (a, stop) = (a.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n: u8 = 0;
                while !stop.load(Ordering::Relaxed) {
                    n = n.wrapping_add(1);
                    // Every write fills the payload with one byte value: a torn read
                    // would mix two.
                    a.write(0, &vec![n; 4000]);
                }
            })
        };
        let mut reads = 0;
        for _ in 0..200_000 {
            if let Some(bytes) = a.read(0) {
                assert!(bytes.iter().all(|b| *b == bytes[0]), "torn read");
                reads += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(reads > 0, "the reader got through at least once");
    }
}
