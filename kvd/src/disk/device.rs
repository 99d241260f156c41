//! One L3 device: a directory holding a pre-allocated container file of fixed slots, the
//! journal, and a small metadata file. Data is written and synced before its journal
//! record; the journal is synced before the index changes. O_DIRECT is used where the
//! filesystem takes it.

use super::record::{self, Record};
use crate::buf::{Buf, BufPool};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Alignment of O_DIRECT offsets, lengths and buffers (covers 512- and 4096-byte
/// sectors).
pub const ALIGN: u64 = 4096;

const DATA: &str = "kvd-l3.data";
const JOURNAL: &str = "kvd-l3.journal";
const META: &str = "kvd-l3.meta";
const LOCK: &str = "kvd-l3.lock";

/// How the container file is read and written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT where the filesystem allows it, buffered (and a warning) where not.
    Auto,
    /// O_DIRECT or refuse to start.
    Direct,
    /// Through the page cache.
    Buffered,
}

impl std::str::FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "direct" | "odirect" | "o_direct" => Ok(Self::Direct),
            "buffered" => Ok(Self::Buffered),
            _ => Err(format!(
                "unknown I/O mode {s:?}: expected auto, direct or buffered"
            )),
        }
    }
}

/// Free bytes an unprivileged writer can use on the filesystem holding `dir` (`u64::MAX`
/// for a filesystem that keeps no count, such as ramfs).
#[allow(unsafe_code)]
pub fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    // SAFETY: statvfs is plain data; zeroed is a valid value for it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.f_blocks == 0 {
        return Ok(u64::MAX);
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Reserves `len` bytes for `file` on disk (not a sparse file); false when the
/// filesystem cannot (the file is then sized without reserving).
#[allow(unsafe_code)]
fn preallocate(file: &File, len: u64) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let len_off = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
    // SAFETY: a valid open fd; fallocate reads only its integer arguments.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len_off) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        file.set_len(len)?;
        return Ok(false);
    }
    Err(e)
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

#[derive(Debug)]
struct Journal {
    file: File,
    len: u64,
}

/// One directory of the NVMe tier.
#[derive(Debug)]
pub struct Device {
    dir: PathBuf,
    data: File,
    direct: bool,
    capacity: u64,
    journal: Mutex<Journal>,
    _lock: File,
}

/// What opening a device found.
#[derive(Debug)]
pub struct Opened {
    /// The device.
    pub device: Device,
    /// Its journal's records.
    pub records: Vec<Record>,
    /// Slot size recorded by an earlier run (0: none yet).
    pub slot_size: u64,
    /// Bytes of a torn or damaged journal tail that were cut off.
    pub dropped_tail: u64,
    /// Whether the container space is reserved on disk (false: sparse, the filesystem
    /// cannot pre-allocate).
    pub reserved: bool,
}

/// Sizes asked of a device.
#[derive(Debug, Clone, Copy)]
pub struct Sizing {
    /// Container bytes wanted (`None`: keep an existing container, else half the free
    /// space).
    pub bytes: Option<u64>,
    /// Free bytes to leave on the filesystem.
    pub min_free: u64,
}

/// Holds `dir` for this process (an advisory lock, released when the process ends):
/// two daemons on one directory would hand out the same slots.
#[allow(unsafe_code)]
fn lock_dir(dir: &Path) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(dir.join(LOCK))?;
    // SAFETY: flock on a descriptor this function owns; it reads only its arguments.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{} is in use by another kvd ({e}); give each daemon its own --long-path",
                dir.display()
            ),
        ));
    }
    Ok(f)
}

fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

fn read_meta(dir: &Path) -> io::Result<u64> {
    match std::fs::read_to_string(dir.join(META)) {
        Ok(text) => {
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{META}: {e}")))?;
            if v.get("format").and_then(serde_json::Value::as_u64) != Some(1) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{META}: unknown format (written by a newer kvd?)"),
                ));
            }
            Ok(v.get("slot_size")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

fn open_data(path: &Path, mode: IoMode) -> io::Result<(File, bool)> {
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(true).create(true).truncate(false);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    match mode {
        IoMode::Buffered => Ok((open(false)?, false)),
        IoMode::Direct => open(true).map(|f| (f, true)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("--io-mode direct: the filesystem of {} refuses O_DIRECT ({e}); use a disk-backed filesystem or --io-mode auto", path.display()),
            )
        }),
        IoMode::Auto => match open(true) {
            Ok(f) => Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    path = %path.display(),
                    "the filesystem refuses O_DIRECT (ramfs, older tmpfs and some overlay or FUSE mounts do); the NVMe tier uses buffered I/O through the page cache here"
                );
                Ok((open(false)?, false))
            }
            Err(e) => Err(e),
        },
    }
}

impl Device {
    /// Opens (or creates) the device in `dir`: the container sized by `sizing` and kept
    /// clear of the free-space floor, the journal read and its torn tail cut off.
    pub fn open(dir: &Path, sizing: Sizing, mode: IoMode) -> io::Result<Opened> {
        std::fs::create_dir_all(dir)?;
        let lock = lock_dir(dir)?;
        let slot_size = read_meta(dir)?;
        let data_path = dir.join(DATA);
        let (data, direct) = open_data(&data_path, mode)?;
        let meta = data.metadata()?;
        let held = meta.blocks().saturating_mul(512).min(meta.len());
        let usable = free_bytes(dir)?
            .saturating_add(held)
            .saturating_sub(sizing.min_free);
        let wanted = match sizing.bytes {
            Some(b) => b,
            None if meta.len() > 0 => meta.len(),
            None if usable == u64::MAX => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: the filesystem reports no size; give --long-bytes",
                        dir.display()
                    ),
                ));
            }
            None => usable / 2,
        };
        let capacity = wanted.min(usable) / ALIGN * ALIGN;
        if capacity < wanted {
            tracing::warn!(
                dir = %dir.display(),
                wanted,
                capacity,
                min_free = sizing.min_free,
                "the NVMe tier's container is smaller than asked, to keep the free-space floor"
            );
        }
        if capacity == 0 {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "{}: no room for a container above the free-space floor of {} bytes",
                    dir.display(),
                    sizing.min_free
                ),
            ));
        }
        if meta.len() > capacity {
            data.set_len(capacity)?;
        }
        let reserved = preallocate(&data, capacity)?;
        data.sync_all()?;
        let journal_path = dir.join(JOURNAL);
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&journal_path)?;
        let bytes = std::fs::read(&journal_path)?;
        let (records, valid) = record::decode_all(&bytes);
        let dropped_tail = (bytes.len() - valid) as u64;
        if dropped_tail > 0 {
            file.set_len(valid as u64)?;
            file.sync_all()?;
        }
        file.flush()?;
        Ok(Opened {
            device: Device {
                dir: dir.to_owned(),
                data,
                direct,
                capacity,
                journal: Mutex::new(Journal {
                    file,
                    len: valid as u64,
                }),
                _lock: lock,
            },
            records,
            slot_size,
            dropped_tail,
            reserved,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether I/O bypasses the page cache.
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Container bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Journal bytes.
    pub fn journal_bytes(&self) -> u64 {
        self.journal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len
    }

    /// Records the slot size (before the first record that uses it).
    pub fn write_slot_size(&self, slot_size: u64) -> io::Result<()> {
        let meta = serde_json::json!({"format": 1, "slot_size": slot_size});
        write_atomically(&self.dir, META, meta.to_string().as_bytes())
    }

    /// Writes `value` at `offset` of the container (not yet durable).
    pub fn write_at(&self, offset: u64, value: &[u8], pool: &Arc<BufPool>) -> io::Result<()> {
        if !self.direct {
            return self.data.write_all_at(value, offset);
        }
        let mut buf = pool.take(round_up(value.len() as u64) as usize);
        let bytes = buf.bytes_mut();
        bytes[..value.len()].copy_from_slice(value);
        bytes[value.len()..].fill(0);
        self.data.write_all_at(&buf, offset)
    }

    /// Makes the container's writes durable.
    pub fn sync_data(&self) -> io::Result<()> {
        self.data.sync_data()
    }

    /// Reads `length` bytes at `offset` of the container into a pooled buffer.
    pub fn read_at(&self, offset: u64, length: usize, pool: &Arc<BufPool>) -> io::Result<Buf> {
        let mut buf = pool.take(if self.direct {
            round_up(length as u64) as usize
        } else {
            length
        });
        self.data.read_exact_at(buf.bytes_mut(), offset)?;
        buf.truncate(length);
        Ok(buf)
    }

    /// Appends records and syncs the journal. On failure the journal is cut back to
    /// where it was, so no torn record is left before later ones.
    pub fn append(&self, records: &[Record]) -> io::Result<()> {
        let mut bytes = Vec::new();
        for r in records {
            record::encode(r, &mut bytes);
        }
        let mut j = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        let result = j.file.write_all(&bytes).and_then(|()| j.file.sync_data());
        match result {
            Ok(()) => {
                j.len += bytes.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = j.file.set_len(j.len);
                Err(e)
            }
        }
    }

    /// Replaces the journal with `records` (a snapshot of the live entries), atomically.
    /// `snapshot` runs under the journal lock, so no record is appended between the
    /// snapshot and the swap.
    pub fn compact(&self, snapshot: impl FnOnce() -> Vec<Record>) -> io::Result<u64> {
        let mut j = self.journal.lock().unwrap_or_else(PoisonError::into_inner);
        let mut bytes = Vec::new();
        for r in snapshot() {
            record::encode(&r, &mut bytes);
        }
        write_atomically(&self.dir, JOURNAL, &bytes)?;
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(self.dir.join(JOURNAL))?;
        let before = j.len;
        j.file = file;
        j.len = bytes.len() as u64;
        Ok(before.saturating_sub(j.len))
    }
}
