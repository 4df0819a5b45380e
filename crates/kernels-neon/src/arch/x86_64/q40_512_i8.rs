//! Q4_0 × 8-bit activations ([`Precision::Int8`](crate::Precision::Int8), and `Ggml`'s (one
//! scale per 32 for Q4_0 too); not `Fast`: `crate::fast_decode_int8`) on 512-bit
//! registers, for [`KernelPath::Avx512`](crate::KernelPath::Avx512): the one-token kernel
//! (`matvec`, dense and listed rows) and a batch kernel (`matvec_batch`: each row read once for
//! up to four tokens, each token's result `matvec`'s bits).
//!
//! Four blocks a register (two pairs): the 16 quant bytes of blocks `b .. b + 4` in the four
//! 128-bit lanes, one mask gives their low nibbles (elements 0..16 of each), one shift and mask
//! the high ones (16..32), and two `vpdpbusd` (unsigned nibbles × signed 8-bit activations, 64
//! products an instruction, twice `vpdpwssd`'s) dot them with the activations, reordered once
//! per token to match ([`Q40Bytes`]), starting from -8 times each lane's activations (Q4_0's
//! offset, in exact integers). Lanes `4h .. 4h + 4` of the i32 sums are block `b + h`'s, eight
//! products each. The eight scales of eight blocks come from `q40_512`'s two loads and one
//! permutation, times the activations' eight; each four blocks take theirs, one per four lanes,
//! by a permutation. Each lane's sum is converted and FMA'd into 16 f32 lanes, summed
//! horizontally at the end of the row. A last group of fewer than eight blocks goes four (or
//! fewer) at a time, its blocks copied to a zeroed register.

use std::arch::x86_64::*;

use super::q40_512::scales8;
use super::simd::{f16_at, hsum, prefetch_distance};
use crate::quant::QActs;
use crate::QMatrix;

/// Bytes of a Q4_0 block.
const BB: usize = 18;

/// One token's 8-bit activations in the order of [`dots_ahead`].
pub(crate) struct Q40Bytes {
    /// Per four blocks `b .. b + 4`: elements 0..16 of each of the four, then elements 16..32 of
    /// each (zeros for missing last blocks).
    x: Vec<i8>,
    /// Per four blocks: each i32 lane's -8 times the sum of the eight activations it multiplies.
    c: Vec<i32>,
    /// The activations' block scales, zero-padded to a multiple of 8.
    d: Vec<f32>,
    /// Blocks.
    blocks: usize,
}

impl Q40Bytes {
    /// `xq` (one scale per block) reordered for [`dots_ahead`].
    pub(crate) fn new(xq: &QActs) -> Q40Bytes {
        let nb = xq.d.len();
        assert!(xq.qs.len() >= nb * 32);
        let quads = nb.div_ceil(4);
        let mut x = vec![0i8; quads * 128];
        let mut c = vec![0i32; quads * 16];
        for b in 0..nb {
            let (g, h) = (b / 4, b % 4);
            let q = &xq.qs[b * 32..b * 32 + 32];
            x[g * 128 + h * 16..g * 128 + h * 16 + 16].copy_from_slice(&q[..16]);
            x[g * 128 + 64 + h * 16..g * 128 + 64 + h * 16 + 16].copy_from_slice(&q[16..]);
            for l in 0..4 {
                let sum: i32 = (4 * l..4 * l + 4)
                    .map(|e| i32::from(q[e]) + i32::from(q[16 + e]))
                    .sum();
                c[g * 16 + h * 4 + l] = -8 * sum;
            }
        }
        let mut d = xq.d.clone();
        d.resize(nb.next_multiple_of(8), 0.0);
        Q40Bytes {
            x,
            c,
            d,
            blocks: nb,
        }
    }
}

/// The low and high nibbles (u8 lanes) of the four blocks at `p`, block `h` in 128-bit lane `h`.
///
/// # Safety
/// AVX-512F/BW present; four whole blocks readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn nibbles_quad(p: *const u8) -> (__m512i, __m512i) {
    let v: __m512i;
    // SAFETY: bytes 2..18 of each of the four blocks at `p` are readable (contract); AVX-512F
    // present. Written out (inline asm): LLVM turns the intrinsics' loads and inserts into eight
    // 8-byte loads and their shuffles. The first block is broadcast to every lane (lanes 1-3 are
    // then overwritten): a `vmovdqu` into `{v:x}` did not assemble at opt-level 3 (`release`, the
    // operand printed as a byte register, `r9b`), so no operand modifier is used.
    unsafe {
        std::arch::asm!(
            "vbroadcasti32x4 {v}, xmmword ptr [{p} + 2]",
            "vinserti32x4 {v}, {v}, xmmword ptr [{p} + 20], 1",
            "vinserti32x4 {v}, {v}, xmmword ptr [{p} + 38], 2",
            "vinserti32x4 {v}, {v}, xmmword ptr [{p} + 56], 3",
            p = in(reg) p,
            v = out(zmm_reg) v,
            options(pure, readonly, nostack, preserves_flags),
        );
    }
    split(v)
}

/// [`nibbles_quad`] of the `k < 4` blocks at `p` (zeros for the others).
///
/// # Safety
/// AVX-512F/BW present; `k` whole blocks readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn nibbles_part(p: *const u8, k: usize) -> (__m512i, __m512i) {
    let mut buf = [0u8; 64];
    for h in 0..k {
        // SAFETY: block h < k at `p` is readable (contract); `buf` holds 64 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(p.add(h * BB + 2), buf.as_mut_ptr().add(h * 16), 16)
        };
    }
    // SAFETY: `buf` is 64 readable bytes.
    split(unsafe { _mm512_loadu_si512(buf.as_ptr() as *const _) })
}

/// The low and high nibbles of the 64 bytes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
fn split(v: __m512i) -> (__m512i, __m512i) {
    let m = _mm512_set1_epi8(0x0F);
    (
        _mm512_and_si512(v, m),
        _mm512_and_si512(_mm512_srli_epi16::<4>(v), m),
    )
}

/// Lane `l` takes element `4j + l / 4` of eight scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
fn pick(j: i32) -> __m512i {
    let (a, b, c, d) = (4 * j, 4 * j + 1, 4 * j + 2, 4 * j + 3);
    _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)
}

/// The i32 lane sums of the four blocks `4 * quad ..` of `x` with their nibbles `lo`, `hi`.
///
/// # Safety
/// AVX-512F/BW/VNNI present; `quad < x.blocks.div_ceil(4)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn quad_sum(x: &Q40Bytes, quad: usize, lo: __m512i, hi: __m512i) -> __m512i {
    // SAFETY: four blocks `quad` of `x.x` (128 i8) and `x.c` (16 i32) are in bounds (contract).
    unsafe {
        let xp = x.x.as_ptr().add(quad * 128);
        let c = _mm512_loadu_si512(x.c.as_ptr().add(quad * 16) as *const _);
        let xlo = _mm512_loadu_si512(xp as *const _);
        let xhi = _mm512_loadu_si512(xp.add(64) as *const _);
        dpbusd(dpbusd(c, lo, xlo), hi, xhi)
    }
}

/// `vpdpbusd`: `acc` plus the sums of four adjacent products of `a`'s u8 and `b`'s i8 lanes, as
/// written (inline asm, as `q40_512::dpwssd`).
///
/// # Safety
/// AVX-512F and AVX-512VNNI present.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpbusd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: `vpdpbusd` on registers only (no memory, stack or flags), present per contract.
    unsafe {
        std::arch::asm!(
            "vpdpbusd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// The dots of `R` rows with `T` tokens' activations: `out[i][t]` = row `i` · token `t`, the same
/// operations for every `(i, t)` whatever `R` and `T`; each row prefetched `ahead` bytes past the
/// four blocks it reads (a hint: any distance is safe).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn dots_ahead<const R: usize, const T: usize>(
    rows: [&[u8]; R],
    xs: [&Q40Bytes; T],
    ahead: usize,
) -> [[f32; T]; R] {
    let nb = xs[0].blocks;
    assert!(
        rows.iter().all(|r| r.len() >= nb * BB)
            && xs.iter().all(|x| x.blocks == nb
                && x.x.len() >= nb.div_ceil(4) * 128
                && x.c.len() >= nb.div_ceil(4) * 16
                && x.d.len() >= nb.next_multiple_of(8))
    );
    let picks = [pick(0), pick(1)];
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let groups = nb / 8;
    // SAFETY: every block read below is below `nb`, every four blocks' activations below
    // `nb.div_ceil(4)` and every scale group below `nb / 8`, inside the asserted lengths.
    unsafe {
        for g in 0..groups {
            let mut s = [[_mm256_setzero_ps(); T]; R];
            for i in 0..R {
                let dw = scales8(rows[i].as_ptr().add(g * 8 * BB));
                for t in 0..T {
                    s[i][t] = _mm256_mul_ps(dw, _mm256_loadu_ps(xs[t].d.as_ptr().add(g * 8)));
                }
            }
            for (j, pk) in picks.iter().enumerate() {
                let quad = g * 2 + j;
                for i in 0..R {
                    let p = rows[i].as_ptr().add(quad * 4 * BB);
                    // Prefetch hint (never faults; wrapping_add keeps it UB-free).
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead) as *const i8);
                    let (lo, hi) = nibbles_quad(p);
                    for t in 0..T {
                        let isum = quad_sum(xs[t], quad, lo, hi);
                        let scale = _mm512_permutexvar_ps(*pk, _mm512_castps256_ps512(s[i][t]));
                        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][t]);
                    }
                }
            }
        }
        let mut b = groups * 8;
        while b < nb {
            let k = (nb - b).min(4);
            for i in 0..R {
                let p = rows[i].as_ptr().add(b * BB);
                let (lo, hi) = if k == 4 {
                    nibbles_quad(p)
                } else {
                    nibbles_part(p, k)
                };
                for t in 0..T {
                    let mut sc = [0f32; 16];
                    for h in 0..k {
                        let d = f16_at(p.add(h * BB)) * *xs[t].d.get_unchecked(b + h);
                        sc[4 * h..4 * h + 4].fill(d);
                    }
                    let isum = quad_sum(xs[t], b / 4, lo, hi);
                    let scale = _mm512_loadu_ps(sc.as_ptr());
                    acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][t]);
                }
            }
            b += k;
        }
    }
    std::array::from_fn(|i| {
        std::array::from_fn(|t| {
            let a = acc[i][t];
            let lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            hsum(_mm256_add_ps(lo, hi))
        })
    })
}

/// [`dots_ahead`] of one token as the kernel of the shared row drivers, rows prefetched
/// [`prefetch_distance`] ahead.
struct Q40ByteDots<'a>(&'a Q40Bytes);

impl crate::arch::drivers::RowDots for Q40ByteDots<'_> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX-512F/BW/VNNI present per this method's contract (the kernel is used on the
        // Avx512 path only); `dots_ahead` asserts the lengths.
        let d = unsafe { dots_ahead::<N, 1>(rows, [self.0], prefetch_distance::<N>()) };
        std::array::from_fn(|i| d[i][0])
    }
}

/// `y[i] = dot(W[sel.get(i)], x)`: listed rows four a step, sharing the activations' loads; a
/// dense matrix's rows one a step; each row's result does not depend on the step.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn matvec(
    w: &QMatrix<'_>,
    sel: crate::arch::Rows<'_>,
    x: &Q40Bytes,
    y: &mut [f32],
) {
    use crate::arch::drivers::rows_blocked;
    let k = Q40ByteDots(x);
    // SAFETY: features present per contract, all the kernel needs.
    unsafe {
        if matches!(sel, crate::arch::Rows::From(_)) {
            rows_blocked::<1, _>(&k, w, sel, y)
        } else {
            rows_blocked::<4, _>(&k, w, sel, y)
        }
    }
}

/// Tokens a step of [`matvec_batch`].
const TOKENS: usize = 4;

/// `ys[t][i] = dot(W[r0 + i], xs[t])` for `i < ys[t].len()` (the same for every `t`): each row
/// once for up to [`TOKENS`] tokens at a time, each token's result bit for bit [`matvec`]'s.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
#[allow(clippy::needless_range_loop)] // `r` indexes each token's output, row by row
pub(crate) unsafe fn matvec_batch(
    w: &QMatrix<'_>,
    r0: usize,
    xs: &[&Q40Bytes],
    ys: &mut [&mut [f32]],
) {
    assert_eq!(xs.len(), ys.len());
    let nr = ys.first().map_or(0, |y| y.len());
    assert!(ys.iter().all(|y| y.len() == nr));
    let ahead = prefetch_distance::<1>();
    for r in 0..nr {
        let row = [w.row_data(r0 + r)];
        let mut t = 0;
        // SAFETY: features present per contract; `dots_ahead` asserts the lengths.
        unsafe {
            while t + TOKENS <= xs.len() {
                let x: [&Q40Bytes; TOKENS] = std::array::from_fn(|k| xs[t + k]);
                let d = dots_ahead::<1, TOKENS>(row, x, ahead);
                for k in 0..TOKENS {
                    ys[t + k][r] = d[0][k];
                }
                t += TOKENS;
            }
            if t + 2 <= xs.len() {
                let d = dots_ahead::<1, 2>(row, [xs[t], xs[t + 1]], ahead);
                (ys[t][r], ys[t + 1][r]) = (d[0][0], d[0][1]);
                t += 2;
            }
            if t < xs.len() {
                ys[t][r] = dots_ahead::<1, 1>(row, [xs[t]], ahead)[0][0];
            }
        }
    }
}
