//! What the AVX-512 integer prompt tiles (`tile512_k8.rs`, `tile512_k23.rs`, `tile512_k16.rs`)
//! share: rows repacked in groups of [`LANES`], one row per 32-bit lane, so that a register
//! block's sums need no horizontal adds; the loop over register blocks of `G` groups × `T`
//! tokens and its remainders, column panel by column panel (a panel's quants stay in L1 while
//! every token passes over them; without panels the 16-bit tile ran Q6_K rows of 4864 columns over
//! 512 tokens at about 100 GFLOP/s against 178 with them, one run of `examples/tile_n.rs` on a
//! shared machine); the masked loads and stores of a block's sums.

use std::arch::x86_64::*;
use std::ops::Range;

/// Rows of a group: one per i32 lane of a 512-bit register.
pub(crate) const LANES: usize = 16;

/// Groups per register block (and the most the drive loop asks for).
const G_MAX: usize = 2;
/// Tokens per register block (and the most the drive loop asks for).
const T_MAX: usize = 4;

/// A tile over repacked groups of rows and a prompt's tokens.
pub(super) trait Lanes {
    /// Units of a row (the kernel's scale blocks) and units of a column panel, whose repacked
    /// quants of [`G_MAX`] groups stay in L1 while every token passes over them.
    fn units(&self) -> (usize, usize);

    /// Per group `g0 .. g0 + G` and token `t0 .. t0 + T`, each lane's (row's) dot over the row's
    /// units `units`, added to `acc`.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; the groups and tokens exist in the tile, the
    /// units in its rows.
    unsafe fn sums<const G: usize, const T: usize>(
        &self,
        g0: usize,
        t0: usize,
        units: Range<usize>,
        acc: [[__m512; T]; G],
    ) -> [[__m512; T]; G];
}

/// One step of a register block's integer sums: `isum[g][t] = op(isum[g][t], w_g, x_t)`, `w_g` the
/// 64 bytes of repacked quants at `w[g]`, `x_t` the four bytes at `x[t]` broadcast to every lane.
///
/// # Safety
/// AVX-512F present; 64 bytes readable at each `w[g]` and 4 at each `x[t]`.
#[inline(always)]
pub(super) unsafe fn step<const G: usize, const T: usize>(
    isum: &mut [[__m512i; T]; G],
    w: [*const u8; G],
    x: [*const u8; T],
    op: impl Fn(__m512i, __m512i, __m512i) -> __m512i,
) {
    // SAFETY: AVX-512F present, 64 bytes readable at each `w[g]` and 4 at each `x[t]`, per the
    // contract.
    unsafe {
        let mut wv = [_mm512_setzero_si512(); G];
        for (v, &p) in wv.iter_mut().zip(&w) {
            *v = _mm512_loadu_si512(p.cast());
        }
        for (t, &p) in x.iter().enumerate() {
            let xv = _mm512_set1_epi32(std::ptr::read_unaligned(p.cast::<i32>()));
            for (row, &wg) in isum.iter_mut().zip(&wv) {
                row[t] = op(row[t], wg, xv);
            }
        }
    }
}

/// Runs `k` over its `nr` rows (in groups of [`LANES`]) and `n` tokens, writing
/// `out[t * nr + i]` (token-major): per [`G_MAX`] groups, column panel by column panel, every
/// token's sums of a panel added to those of the panels before it, kept in `out`.
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; `k` holds `nr` rows and `n` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn drive<K: Lanes>(k: &K, nr: usize, n: usize, out: &mut [f32]) {
    assert!(out.len() >= n * nr);
    let groups = nr.div_ceil(LANES);
    let (units, panel) = k.units();
    let mut g0 = 0;
    while g0 < groups {
        let gn = (groups - g0).min(G_MAX);
        for lo in (0..units).step_by(panel.max(1)) {
            let u = lo..(lo + panel).min(units);
            let mut t0 = 0;
            while t0 < n {
                let tn = (n - t0).min(T_MAX);
                // SAFETY: features present per this function's contract; groups `g0 .. g0 + gn`,
                // tokens `t0 .. t0 + tn` and units `u` exist; group `g0 + gn - 1` starts below
                // `nr`; the first panel starts from zero, the others from what it stored.
                unsafe {
                    match (gn, tn) {
                        (2, 4) => panel_step::<K, 2, 4>(k, g0, t0, u.clone(), nr, out),
                        (2, 3) => panel_step::<K, 2, 3>(k, g0, t0, u.clone(), nr, out),
                        (2, 2) => panel_step::<K, 2, 2>(k, g0, t0, u.clone(), nr, out),
                        (2, _) => panel_step::<K, 2, 1>(k, g0, t0, u.clone(), nr, out),
                        (_, 4) => panel_step::<K, 1, 4>(k, g0, t0, u.clone(), nr, out),
                        (_, 3) => panel_step::<K, 1, 3>(k, g0, t0, u.clone(), nr, out),
                        (_, 2) => panel_step::<K, 1, 2>(k, g0, t0, u.clone(), nr, out),
                        _ => panel_step::<K, 1, 1>(k, g0, t0, u.clone(), nr, out),
                    }
                }
                t0 += tn;
            }
        }
        g0 += gn;
    }
}

/// One register block over one panel: its sums so far read from `out` (zero for the first
/// panel), the panel's added, written back.
///
/// # Safety
/// As [`Lanes::sums`]; `out` holds `(t0 + T) * nr` floats; group `g0 + G - 1` starts below `nr`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn panel_step<K: Lanes, const G: usize, const T: usize>(
    k: &K,
    g0: usize,
    t0: usize,
    units: Range<usize>,
    nr: usize,
    out: &mut [f32],
) {
    assert!(out.len() >= (t0 + T) * nr);
    let mut acc = [[_mm512_setzero_ps(); T]; G];
    if units.start > 0 {
        for (g, row) in acc.iter_mut().enumerate() {
            let (first, m) = lanes(g0 + g, nr);
            for (t, v) in row.iter_mut().enumerate() {
                // SAFETY: lanes `first ..` of token `t0 + t`'s row that `m` enables lie in `out`
                // (asserted above); masked-off lanes read nothing.
                *v = unsafe { _mm512_maskz_loadu_ps(m, out.as_ptr().add((t0 + t) * nr + first)) };
            }
        }
    }
    // SAFETY: per this function's contract.
    let acc = unsafe { k.sums::<G, T>(g0, t0, units, acc) };
    for (g, row) in acc.iter().enumerate() {
        let (first, m) = lanes(g0 + g, nr);
        for (t, v) in row.iter().enumerate() {
            // SAFETY: as for the loads above.
            unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add((t0 + t) * nr + first), m, *v) };
        }
    }
}

/// Group `g`'s first row and the mask of its lanes below `nr`.
fn lanes(g: usize, nr: usize) -> (usize, __mmask16) {
    let first = g * LANES;
    (first, ((1u32 << (nr - first).min(LANES)) - 1) as u16)
}
