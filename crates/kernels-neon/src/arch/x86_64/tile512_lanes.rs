//! What the AVX-512 integer prompt tiles (`tile512_k8.rs`, `tile512_k16.rs`) share: rows repacked
//! in groups of [`LANES`], one row per 32-bit lane, so that a register block's sums need no
//! horizontal adds; the loop over register blocks of `G` groups × `T` tokens and its remainders;
//! the masked store of a block's sums.

use std::arch::x86_64::*;

/// Rows of a group: one per i32 lane of a 512-bit register.
pub(crate) const LANES: usize = 16;

/// Groups per register block (and the most the drive loop asks for).
const G_MAX: usize = 2;
/// Tokens per register block (and the most the drive loop asks for).
const T_MAX: usize = 4;

/// A tile over repacked groups of rows and a prompt's tokens.
pub(super) trait Lanes {
    /// Per group `g0 .. g0 + G` and token `t0 .. t0 + T`, each lane's (row's) dot product.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; the groups and tokens exist in the tile.
    unsafe fn sums<const G: usize, const T: usize>(&self, g0: usize, t0: usize)
        -> [[__m512; T]; G];
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
/// `out[t * nr + i]` (token-major).
///
/// # Safety
/// AVX-512F/BW/VNNI and AVX2/FMA/F16C present; `k` holds `nr` rows and `n` tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn drive<K: Lanes>(k: &K, nr: usize, n: usize, out: &mut [f32]) {
    assert!(out.len() >= n * nr);
    let groups = nr.div_ceil(LANES);
    let mut g0 = 0;
    while g0 < groups {
        let gn = (groups - g0).min(G_MAX);
        let mut t0 = 0;
        while t0 < n {
            let tn = (n - t0).min(T_MAX);
            // SAFETY: features present per this function's contract; groups `g0 .. g0 + gn` and
            // tokens `t0 .. t0 + tn` exist; group `g0 + gn - 1` starts below `nr`.
            unsafe {
                match (gn, tn) {
                    (2, 4) => store(&k.sums::<2, 4>(g0, t0), g0, t0, nr, out),
                    (2, 3) => store(&k.sums::<2, 3>(g0, t0), g0, t0, nr, out),
                    (2, 2) => store(&k.sums::<2, 2>(g0, t0), g0, t0, nr, out),
                    (2, _) => store(&k.sums::<2, 1>(g0, t0), g0, t0, nr, out),
                    (_, 4) => store(&k.sums::<1, 4>(g0, t0), g0, t0, nr, out),
                    (_, 3) => store(&k.sums::<1, 3>(g0, t0), g0, t0, nr, out),
                    (_, 2) => store(&k.sums::<1, 2>(g0, t0), g0, t0, nr, out),
                    _ => store(&k.sums::<1, 1>(g0, t0), g0, t0, nr, out),
                }
            }
            t0 += tn;
        }
        g0 += gn;
    }
}

/// Writes a register block's sums (`acc[g][t]`: group `g0 + g`'s lanes for token `t0 + t`) to
/// `out` (token-major, `nr` rows per token), lanes past `nr` left out.
///
/// # Safety
/// AVX-512F present; group `g0 + G - 1` starts below `nr`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn store<const G: usize, const T: usize>(
    acc: &[[__m512; T]; G],
    g0: usize,
    t0: usize,
    nr: usize,
    out: &mut [f32],
) {
    assert!(out.len() >= (t0 + T) * nr);
    for (g, row) in acc.iter().enumerate() {
        let first = (g0 + g) * LANES;
        let m: __mmask16 = ((1u32 << (nr - first).min(LANES)) - 1) as u16;
        for (t, v) in row.iter().enumerate() {
            // SAFETY: lanes `first .. first + popcount(m) <= nr` of token `t0 + t`'s row lie in
            // `out` (asserted above); masked-off lanes write nothing.
            unsafe { _mm512_mask_storeu_ps(out.as_mut_ptr().add((t0 + t) * nr + first), m, *v) };
        }
    }
}
