//! [`AnonPages`]: zeroed anonymous memory that the kernel may back with huge pages; [`AnonArena`]:
//! one such mapping handed out in pieces.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A zeroed buffer of anonymous pages of its own mapping, which on Linux asks the kernel for
/// transparent huge pages (`MADV_HUGEPAGE`): where the system allows them, a large buffer read
/// from start to end (a repacked weight matrix, streamed once a token) then takes a TLB entry per
/// 2 MiB instead of per 4 KiB. Elsewhere, or where the kernel declines, ordinary pages.
pub struct AnonPages {
    map: memmap2::MmapMut,
    len: usize,
}

impl AnonPages {
    /// `len` zeroed bytes (a mapping of at least one page).
    pub fn zeroed(len: usize) -> std::io::Result<AnonPages> {
        Ok(AnonPages {
            map: huge_map(len)?,
            len,
        })
    }
}

/// A zeroed anonymous mapping of `len` bytes (at least one page) that asks for huge pages.
fn huge_map(len: usize) -> std::io::Result<memmap2::MmapMut> {
    let map = memmap2::MmapMut::map_anon(len.max(1))?;
    // Only a hint: a kernel without transparent huge pages keeps ordinary ones.
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    Ok(map)
}

/// Pieces start at multiples of this many bytes (a cache line).
const PIECE_ALIGN: usize = 64;

/// One [`AnonPages`]-like mapping handed out in disjoint pieces ([`AnonArena::take`]), for many
/// buffers below a huge page each that are read together (a Mixture-of-Experts layer's experts):
/// in one mapping they share huge pages, where each in a mapping of its own could not have any.
/// The mapping lives until the arena and every piece are dropped.
pub struct AnonArena {
    shared: Arc<Shared>,
    next: AtomicUsize,
}

/// The arena's mapping and its start, taken once at creation.
struct Shared {
    /// Kept only to unmap when the last piece goes; never accessed after creation.
    _map: memmap2::MmapMut,
    base: *mut u8,
    len: usize,
}

// SAFETY: `Shared` owns its mapping; `base` is only turned into slices by the pieces, each over a
// range no other piece covers (`AnonArena::take`), so no two threads ever reach the same byte
// through it.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`: a shared `Shared` gives out nothing but the pointer its pieces use for
// their disjoint ranges.
unsafe impl Sync for Shared {}

impl AnonArena {
    /// An arena of `len` zeroed bytes.
    pub fn zeroed(len: usize) -> std::io::Result<AnonArena> {
        let mut map = huge_map(len)?;
        let base = map.as_mut_ptr();
        Ok(AnonArena {
            shared: Arc::new(Shared {
                _map: map,
                base,
                len,
            }),
            next: AtomicUsize::new(0),
        })
    }

    /// The next `len` bytes (zeroed, starting at a multiple of 64 into the mapping), or `None`
    /// when fewer are left.
    pub fn take(&self, len: usize) -> Option<AnonPiece> {
        let size = len.next_multiple_of(PIECE_ALIGN);
        let at = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |at| {
                (at + len <= self.shared.len).then_some(at + size)
            })
            .ok()?;
        Some(AnonPiece {
            shared: Arc::clone(&self.shared),
            at,
            len,
        })
    }

    /// Bytes an arena needs for pieces of `lens` bytes, taken in that order.
    pub fn bytes_for(lens: impl IntoIterator<Item = usize>) -> usize {
        lens.into_iter()
            .map(|l| l.next_multiple_of(PIECE_ALIGN))
            .sum()
    }
}

/// A piece of an [`AnonArena`]: bytes `at..at + len` of its mapping, no other piece's.
pub struct AnonPiece {
    shared: Arc<Shared>,
    at: usize,
    len: usize,
}

impl Deref for AnonPiece {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `at + len <= shared.len` (checked by `take`), inside the mapping, which lives
        // while `shared` does; no other piece covers these bytes, and this one gives out `&mut`
        // only through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.shared.base.add(self.at), self.len) }
    }
}

impl DerefMut for AnonPiece {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference to the range.
        unsafe { std::slice::from_raw_parts_mut(self.shared.base.add(self.at), self.len) }
    }
}

impl Deref for AnonPages {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}

impl DerefMut for AnonPages {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_arena_gives_disjoint_zeroed_pieces_until_it_is_full() {
        let lens = [100, 64, 1, 5000];
        let arena = AnonArena::zeroed(AnonArena::bytes_for(lens)).unwrap();
        let mut pieces: Vec<AnonPiece> = lens.iter().map(|&l| arena.take(l).unwrap()).collect();
        assert!(arena.take(1).is_none());
        for (i, p) in pieces.iter_mut().enumerate() {
            assert!(p.iter().all(|&b| b == 0));
            p.fill(i as u8 + 1);
        }
        drop(arena);
        for (i, p) in pieces.iter().enumerate() {
            assert_eq!(p.len(), lens[i]);
            assert!(p.iter().all(|&b| b == i as u8 + 1), "piece {i} overwritten");
        }
    }

    #[test]
    fn zeroed_pages_are_zero_and_writable() {
        for len in [0, 1, 4096, 3 << 20] {
            let mut p = AnonPages::zeroed(len).unwrap();
            assert_eq!(p.len(), len);
            assert!(p.iter().all(|&b| b == 0));
            if len > 0 {
                p[len - 1] = 7;
                assert_eq!(p[len - 1], 7);
            }
        }
    }
}
