//! The register-block driving shared by the AVX2 8-bit prompt tiles with the rows in the lanes
//! (`tile_i8.rs`: Q4_0/Q4_1/Q5_0/Q5_1, `tile_k8_lanes.rs`: Q4_K/Q5_K/Q6_K, `tile_k23.rs`:
//! Q2_K/Q3_K). Each packs a work item's rows into groups of [`LANES`] rows (one per i32 lane) and
//! gives a [`LaneTile`]: the sums of a few groups against a few tokens over a range of column
//! units (blocks of 32, super-blocks of 256). [`drive`] packs [`CHUNK_ROWS`] rows at a time and
//! runs them per [`G_MAX`] groups, column panel by column panel (a panel of the groups' quants
//! stays in L1 while every token passes over it), [`T_MAX`] tokens at a time, each token's sums of
//! a panel added to those of the panels before it, kept in `out`.

use std::arch::x86_64::*;
use std::ops::Range;

use crate::QMatrix;

/// Rows of a group: one per i32 lane of a 256-bit register.
pub(super) const LANES: usize = 8;
/// Groups per register block.
const G_MAX: usize = 2;
/// Tokens per register block: `G_MAX * T_MAX` i16 and as many i32 sums, `G_MAX` weight vectors
/// and one broadcast activation quad fill the 16 registers (the f32 sums, touched once a unit,
/// may live in memory).
const T_MAX: usize = 3;

/// Rows packed at a time: one register block's groups, whose packed quants (32 KiB of 16-bit
/// quants over 1024 columns) stay in L2 from packing to their last token, where packing a whole
/// work item first wrote it out to fresh pages and read it back (the 16-bit quants of Q4_0 rows
/// are 3.6 times their bytes). SYNTHETIC 16x1024x2816, AVX2 path, one thread, pp64, two
/// interleaved rounds (2026-12-06): IQ4_XS 234-240 -> 253 tok/s, Q2_K 297 -> 297-307, Q4_0 and
/// Q4_K_M within the noise.
const CHUNK_ROWS: usize = G_MAX * LANES;

/// A format's kernel over a work item's packed rows.
pub(super) trait LaneTile {
    /// One token's activations as the kernel reads them.
    type Tok: Copy;
    /// Column units of a panel.
    const PANEL: usize;
    /// Column units in a row.
    fn units(&self) -> usize;
    /// Groups `g0 .. g0 + G` against tokens `toks` over the units `units`: per group and token,
    /// each lane's (row's) dot added to `acc`.
    ///
    /// # Safety
    /// AVX2/FMA/F16C present; the groups exist in the packed rows; `units` within the row
    /// (`end <= self.units()`); each token's activations cover the row's columns.
    unsafe fn block<const G: usize, const T: usize>(
        &self,
        g0: usize,
        toks: [Self::Tok; T],
        units: Range<usize>,
        acc: [[__m256; T]; G],
    ) -> [[__m256; T]; G];
}

/// Group `g`'s first row and how many of its lanes are below `nr`.
fn lanes(g: usize, nr: usize) -> (usize, usize) {
    let first = g * LANES;
    (first, (nr - first).min(LANES))
}

/// Where a chunk's results go in `out`: token `t`'s row `i` of the chunk at `t * stride + row0 +
/// i`.
#[derive(Clone, Copy)]
struct Place {
    stride: usize,
    row0: usize,
}

/// `src` (up to [`LANES`] floats) in a register's first lanes, the others zero: a whole group
/// loaded directly, a short one through a buffer (a `memcpy` call of its length, which taken for
/// every group was 2% of a Q4_0 prompt: SYNTHETIC 16x1024x2816, AVX2 path, one thread, pp128,
/// three interleaved rounds, 2026-12-07: Q4_0 269-277 -> 284-286 tok/s, Q6_K 363-377 -> 378-386,
/// Q2_K 329-341 -> 337-353).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load(src: &[f32]) -> __m256 {
    if let Ok(whole) = <&[f32; LANES]>::try_from(src) {
        // SAFETY: `whole` holds 8 floats.
        return unsafe { _mm256_loadu_ps(whole.as_ptr()) };
    }
    let mut buf = [0f32; LANES];
    buf[..src.len()].copy_from_slice(src);
    // SAFETY: `buf` holds 8 floats.
    unsafe { _mm256_loadu_ps(buf.as_ptr()) }
}

/// The first `dst.len()` (up to [`LANES`]) lanes of `v` into `dst`, as [`load`] reads them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store(v: __m256, dst: &mut [f32]) {
    if let Ok(whole) = <&mut [f32; LANES]>::try_from(&mut *dst) {
        // SAFETY: `whole` holds 8 floats.
        return unsafe { _mm256_storeu_ps(whole.as_mut_ptr(), v) };
    }
    let mut buf = [0f32; LANES];
    // SAFETY: `buf` holds 8 floats.
    unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), v) };
    let n = dst.len();
    dst.copy_from_slice(&buf[..n]);
}

/// One register block (groups `g0 .. g0 + G`, tokens `t0 .. t0 + T`) over the units `units`: its
/// sums so far read from `out` (zero for the first panel), the panel's added, written back.
///
/// # Safety
/// AVX2/FMA/F16C present; the groups exist in `k`'s rows and start below `nr`; `units` within the
/// row; the tokens exist in `toks` and cover the row's columns; `out` holds `(t0 + T) *
/// at.stride` floats and `at.row0 + nr <= at.stride`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panel_step<K: LaneTile, const G: usize, const T: usize>(
    k: &K,
    toks: &[K::Tok],
    (g0, t0): (usize, usize),
    units: Range<usize>,
    (nr, at): (usize, Place),
    out: &mut [f32],
) {
    assert!(at.row0 + nr <= at.stride);
    assert!(out.len() >= (t0 + T) * at.stride && toks.len() >= t0 + T);
    let Place { stride, row0 } = at;
    let mut acc = [[_mm256_setzero_ps(); T]; G];
    if units.start > 0 {
        for (g, row) in acc.iter_mut().enumerate() {
            let (first, m) = lanes(g0 + g, nr);
            for (t, v) in row.iter_mut().enumerate() {
                let at = (t0 + t) * stride + row0 + first;
                *v = load(&out[at..at + m]);
            }
        }
    }
    let tk: [K::Tok; T] = std::array::from_fn(|t| toks[t0 + t]);
    // SAFETY: per this function's contract.
    let acc = unsafe { k.block::<G, T>(g0, tk, units, acc) };
    for (g, row) in acc.iter().enumerate() {
        let (first, m) = lanes(g0 + g, nr);
        for (t, v) in row.iter().enumerate() {
            let at = (t0 + t) * stride + row0 + first;
            store(*v, &mut out[at..at + m]);
        }
    }
}

/// `out[t * nr + i]` = the dot of row `r0 + i` of `w` (`i < nr`) with token `t` of `toks`, for
/// every token: [`CHUNK_ROWS`] rows at a time packed by `pack(first, count)` (rows `r0 + first ..`
/// of `w`), each chunk run by [`run`] while the next chunk's rows are fetched into L2
/// ([`prefetch_rows`]): packing read them from memory, a stall each time, where the prompt's
/// compute in between leaves the memory idle. SYNTHETIC 16x1024x2816, AVX2 path, one thread,
/// pp128, three interleaved rounds (2026-12-07): Q4_0 250-258 -> 267-279 tok/s, Q8_0 255-264 ->
/// 265-272, IQ4_XS 282-292 -> 290-294, Q6_K, Q3_K_M and Q4_K_M within the noise.
///
/// # Safety
/// AVX2/FMA/F16C present; `pack(first, count)` holds `count.div_ceil(LANES)` groups, rows `r0 +
/// first .. r0 + first + count` of `w`; every token covers the row's columns; `out` holds
/// `toks.len() * nr` floats (asserted per register block).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn drive<K: LaneTile>(
    (w, r0): (&QMatrix, usize),
    nr: usize,
    toks: &[K::Tok],
    out: &mut [f32],
    mut pack: impl FnMut(usize, usize) -> K,
) {
    assert!(r0 + nr <= w.rows());
    for row0 in (0..nr).step_by(CHUNK_ROWS) {
        let count = CHUNK_ROWS.min(nr - row0);
        let k = pack(row0, count);
        let next = row0 + CHUNK_ROWS;
        prefetch_rows(w, r0 + next..r0 + nr.min(next + CHUNK_ROWS));
        // SAFETY: per this function's contract; the chunk's rows lie within the `nr` of `out`.
        unsafe { run(&k, (count, Place { stride: nr, row0 }), toks, out) };
    }
}

/// Asks for every cache line of rows `rows` of `w` to be brought into L2.
fn prefetch_rows(w: &QMatrix, rows: Range<usize>) {
    for r in rows {
        crate::arch::prefetch_l2(w.row_data(r));
    }
}

/// Packed rows `at.row0 .. at.row0 + nr` of `out` (`out[t * at.stride + at.row0 + i]`) against
/// every token: per [`G_MAX`] groups, column panel by column panel ([`LaneTile::PANEL`] units),
/// every token's sums of a panel added to those of the panels before it.
///
/// # Safety
/// AVX2/FMA/F16C present; `k` holds `nr.div_ceil(LANES)` groups; every token covers the row's
/// columns; `out` holds `toks.len() * at.stride` floats (asserted per register block).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<K: LaneTile>(k: &K, (nr, at): (usize, Place), toks: &[K::Tok], out: &mut [f32]) {
    let (n, nu) = (toks.len(), k.units());
    let groups = nr.div_ceil(LANES);
    let mut g0 = 0;
    while g0 < groups {
        let gn = (groups - g0).min(G_MAX);
        for lo in (0..nu).step_by(K::PANEL) {
            let u = lo..(lo + K::PANEL).min(nu);
            let mut t0 = 0;
            while t0 < n {
                let tn = (n - t0).min(T_MAX);
                let gt = (g0, t0);
                let rows = (nr, at);
                // SAFETY: AVX2/FMA/F16C present per this function's contract; groups
                // `g0 .. g0 + gn` exist and start below `nr`; tokens `t0 .. t0 + tn` exist and
                // cover the columns; units `u` lie within the row; `out` is checked per step.
                unsafe {
                    match (gn, tn) {
                        (2, 3) => panel_step::<K, 2, 3>(k, toks, gt, u.clone(), rows, out),
                        (2, 2) => panel_step::<K, 2, 2>(k, toks, gt, u.clone(), rows, out),
                        (2, _) => panel_step::<K, 2, 1>(k, toks, gt, u.clone(), rows, out),
                        (_, 3) => panel_step::<K, 1, 3>(k, toks, gt, u.clone(), rows, out),
                        (_, 2) => panel_step::<K, 1, 2>(k, toks, gt, u.clone(), rows, out),
                        _ => panel_step::<K, 1, 1>(k, toks, gt, u.clone(), rows, out),
                    }
                }
                t0 += tn;
            }
        }
        g0 += gn;
    }
}
