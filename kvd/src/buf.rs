//! Byte buffers for large values read from slower tiers: a view into a buffer (so a
//! value is not copied to drop an envelope or a frame header), and a pool that hands
//! the same buffers out again (so a 32 MiB read does not page-fault a fresh mapping in
//! each time), aligned for O_DIRECT.

use std::sync::{Arc, Mutex, PoisonError};

/// Alignment of pooled buffers' usable part (O_DIRECT needs the logical block size).
pub const ALIGN: usize = 4096;

/// Buffers kept for reuse, by the pool, at most.
const KEEP: usize = 8;

/// A pool of zero-initialised buffers.
#[derive(Debug, Default)]
pub struct BufPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufPool {
    /// A buffer whose usable part, `len` bytes starting on an [`ALIGN`] boundary, is
    /// `buf[..]` (its contents are whatever the last user left).
    pub fn take(self: &Arc<Self>, len: usize) -> Buf {
        let need = len + ALIGN;
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            free.iter()
                .position(|b| b.len() >= need)
                .map(|i| free.swap_remove(i))
        };
        let data = reused.unwrap_or_else(|| vec![0u8; need]);
        let start = data.as_ptr().align_offset(ALIGN);
        Buf {
            data,
            start,
            end: start + len,
            home: Some(self.clone()),
        }
    }

    fn give_back(&self, data: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < KEEP {
            free.push(data);
        } else if let Some(smallest) = free.iter_mut().min_by_key(|b| b.len())
            && smallest.len() < data.len()
        {
            *smallest = data;
        }
    }
}

/// Bytes `data[start..end]`, returned to their pool (if any) when dropped.
#[derive(Debug)]
pub struct Buf {
    data: Vec<u8>,
    start: usize,
    end: usize,
    home: Option<Arc<BufPool>>,
}

impl Buf {
    /// A view of `data[start..end]` (clamped to `data`).
    pub fn view(data: Vec<u8>, start: usize, end: usize) -> Self {
        let end = end.min(data.len());
        Self {
            start: start.min(end),
            end,
            data,
            home: None,
        }
    }

    /// Drops the first `n` bytes of the view.
    pub fn advance(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
    }

    /// Keeps the first `n` bytes of the view.
    pub fn truncate(&mut self, n: usize) {
        self.end = self.end.min(self.start + n);
    }

    /// The bytes, mutable (to read into).
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.start..self.end]
    }
}

impl From<Vec<u8>> for Buf {
    fn from(data: Vec<u8>) -> Self {
        let end = data.len();
        Self::view(data, 0, end)
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.give_back(std::mem::take(&mut self.data));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooled_buffers_are_aligned_and_reused() {
        let pool = Arc::new(BufPool::default());
        let mut a = pool.take(10_000);
        assert_eq!(a.len(), 10_000);
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        a.bytes_mut()[0] = 9;
        let ptr = a.as_ptr();
        drop(a);
        let b = pool.take(5_000);
        assert_eq!(b.as_ptr(), ptr, "the same buffer again");
        assert_eq!(b[0], 9, "not zeroed again");
    }

    #[test]
    fn views_advance_and_truncate() {
        let mut v = Buf::view(b"$3\r\nabc\r\n".to_vec(), 4, 7);
        assert_eq!(&v[..], b"abc");
        v.advance(1);
        assert_eq!(&v[..], b"bc");
        v.truncate(1);
        assert_eq!(&v[..], b"b");
        assert_eq!(&Buf::from(vec![1, 2])[..], &[1, 2]);
    }
}
