//! [`AnonPages`]: zeroed anonymous memory that the kernel may back with huge pages.

use std::ops::{Deref, DerefMut};

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
        let map = memmap2::MmapMut::map_anon(len.max(1))?;
        // Only a hint: a kernel without transparent huge pages keeps ordinary ones.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        Ok(AnonPages { map, len })
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
