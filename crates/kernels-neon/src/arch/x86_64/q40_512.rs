//! Q5_0 × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)) on 512-bit registers,
//! for [`KernelPath::Avx512`](crate::KernelPath::Avx512) ([`takes_matrix`]; Q4_0 takes `q40_pairs`
//! on both paths since 2026-12-04): the one-token kernel ([`matvec`]) and its batch form ([`batch`]:
//! the same [`dots`] with up to 8 tokens a row, each pair of blocks unpacked once, so each token's
//! result bit for bit its `matvec`'s).
//!
//! Two blocks a register: the 16 quant bytes of blocks `b` and `b + 1` widened to 32 u16 lanes,
//! one mask and one shift give their low nibbles (elements 0..16 of each) and high nibbles
//! (16..32); the fifth bits come from the two blocks' `qh` words as two mask registers, and the
//! lanes without theirs take 16 off (the format's offset), so the weights are signed. Two
//! `vpdpwssd` dot them with the activations, reordered once per token to match ([`Q40Wide`]).
//! Lanes 0..8 of the i32 sums are block `b`'s, 8..16 block `b + 1`'s: per lane the sums of the
//! 256-bit kernel (`matvec_i16`), four products each. The eight f16 scales of eight blocks (read
//! one by one: 22-byte blocks) take one conversion and one multiply by the activations' scales;
//! each pair of blocks takes its two from them by a permutation. Each lane's sums are converted and
//! FMA'd into 16 f32 lanes (even blocks in lanes 0..8, odd in 8..16, in block order); a last odd
//! block goes into lanes 0..8 after the loop; then the two halves are added and summed
//! horizontally.
//!
//! Against the 256-bit one-block kernel: about 6 instructions a block instead of 16 (no per-block
//! f16 conversion or broadcast). [`scales8`] (Q4_0's eight scales from two loads) serves
//! `q40_512_i8`.

use std::arch::x86_64::*;

use super::matvec_i16::weights_i16;
use super::simd::{f16_at, hsum, prefetch_distance};
use crate::arch::tags::{block_bytes, Q5_0};
use crate::quant::QActs16;
use crate::QMatrix;

/// Whether format `F` takes this module's kernel (Q5_0): its one-token products and the batch
/// kernel's (`batch512`) keep even and odd blocks apart as this kernel does.
pub(crate) const fn takes(f: u8) -> bool {
    f == Q5_0
}

/// Whether a matrix of `format` takes this module's kernels on the AVX-512 path ([`matvec`],
/// [`batch`]): Q5_0. Q4_0 takes the AVX2 path's `q40_pairs` kernels at every row length, whose bits
/// the repacked `Q40x8` copies give, so the AVX-512 path's one-token decode takes those copies as the
/// AVX2 path's does (2026-12-04, `sparrow bench -p 0 -n 16 -r 2`, two rounds, SYNTHETIC files:
/// 7B-shaped Q4_0 one thread 3.5/3.5 -> 5.1/4.8 tok/s, two threads 6.2/5.8 -> 7.9/6.7; d 1024
/// Q4_0 one thread 114/108/106 -> 151/142/126, two threads 157/149/163 -> 219/229/249; OLMoE-shaped
/// 4 layers within noise). Without the copies `q40_pairs` alone measured 6.0 -> 6.4 tok/s on the
/// 7B file (two threads).
pub(crate) fn takes_matrix(format: crate::WeightFormat) -> bool {
    format == crate::WeightFormat::Q5_0
}

/// One token's 16-bit activations in the order of [`dots`].
pub(crate) struct Q40Wide {
    /// Per pair of blocks `(b, b + 1)`: `b`'s elements 0..16, `b + 1`'s 0..16, `b`'s 16..32,
    /// `b + 1`'s 16..32 (zeros for a missing last block).
    x: Vec<i16>,
    /// The activations' block scales, zero-padded to a multiple of 8.
    d: Vec<f32>,
    /// Blocks.
    blocks: usize,
}

impl Q40Wide {
    /// `xq` reordered for [`dots`].
    pub(crate) fn new(xq: &QActs16) -> Q40Wide {
        let nb = xq.d.len();
        assert!(xq.qs.len() >= nb * 32);
        let pairs = nb.div_ceil(2);
        let mut x = vec![0i16; pairs * 64];
        for b in 0..nb {
            let (p, h) = (b / 2, b % 2);
            let q = &xq.qs[b * 32..b * 32 + 32];
            x[p * 64 + h * 16..p * 64 + h * 16 + 16].copy_from_slice(&q[..16]);
            x[p * 64 + 32 + h * 16..p * 64 + 32 + h * 16 + 16].copy_from_slice(&q[16..]);
        }
        let mut d = xq.d.clone();
        d.resize(nb.next_multiple_of(8), 0.0);
        Q40Wide { x, d, blocks: nb }
    }
}

/// The quants of blocks `b` (lanes 0..16) and `b + 1` (16..32) at `p`: elements 0..16 of each in
/// the first vector, 16..32 in the second, with the fifth bit and the offset: signed.
///
/// # Safety
/// AVX-512F/BW present; `F` Q5_0 ([`takes`]); two whole blocks readable at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn nibbles_pair<const F: u8>(p: *const u8) -> (__m512i, __m512i) {
    let bb = block_bytes(F);
    // Q5_0: `d`, then `qh` (4 bytes), then the 16 quant bytes.
    let q = 6;
    // SAFETY: bytes 2..22 of the two blocks at `p` are readable (contract).
    unsafe {
        let raw = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(p.add(q) as *const __m128i)),
            _mm_loadu_si128(p.add(bb + q) as *const __m128i),
        );
        let wide = _mm512_cvtepu8_epi16(raw);
        let lo = _mm512_and_si512(wide, _mm512_set1_epi16(0x0F));
        let hi = _mm512_srli_epi16::<4>(wide);
        // Bit e of a block's `qh` is element e's fifth bit: elements 0..16 of both blocks are
        // `lo`'s lanes, 16..32 `hi`'s. An element without it is its nibble - 16.
        let h0 = std::ptr::read_unaligned(p.add(2) as *const u32);
        let h1 = std::ptr::read_unaligned(p.add(bb + 2) as *const u32);
        let (mlo, mhi): (__mmask32, __mmask32) =
            ((h0 & 0xFFFF) | (h1 << 16), (h0 >> 16) | (h1 & 0xFFFF_0000));
        let sixteen = _mm512_set1_epi16(16);
        (
            _mm512_mask_sub_epi16(lo, !mlo, lo, sixteen),
            _mm512_mask_sub_epi16(hi, !mhi, hi, sixteen),
        )
    }
}

/// The eight weight scales of the eight blocks of format `F` at `p`, as f32, read one by one.
///
/// # Safety
/// As [`scales8`], for blocks of format `F`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn scales8_of<const F: u8>(p: *const u8) -> __m256 {
    // SAFETY: eight whole blocks at `p` (contract): each block's first two bytes.
    unsafe {
        let bb = block_bytes(F);
        let h = |k: usize| std::ptr::read_unaligned(p.add(k * bb) as *const i16);
        _mm256_cvtph_ps(_mm_setr_epi16(
            h(0),
            h(1),
            h(2),
            h(3),
            h(4),
            h(5),
            h(6),
            h(7),
        ))
    }
}

/// The eight weight scales of the eight Q4_0 blocks at `p`, as f32 (for `q40_512_i8`).
///
/// # Safety
/// AVX-512F/BW present; eight whole blocks readable at `p` (the loads read its first 128 bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
pub(super) unsafe fn scales8(p: *const u8) -> __m256 {
    // SAFETY: 8 blocks are 144 bytes; the two loads read the first 128 (contract).
    unsafe {
        let a = _mm512_loadu_si512(p as *const _);
        let b = _mm512_loadu_si512(p.add(64) as *const _);
        // Word k of the result: the f16 at byte 18k (words 0, 9, ..., 63 of the 128 bytes).
        let idx = _mm512_setr_epi32(
            9 << 16,
            (27 << 16) | 18,
            (45 << 16) | 36,
            (63 << 16) | 54,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        );
        let h = _mm512_permutex2var_epi16(a, idx, b);
        _mm256_cvtph_ps(_mm512_castsi512_si128(h))
    }
}

/// Lanes 0..8 take element `2j` of eight scales, 8..16 element `2j + 1`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
fn pick(j: i32) -> __m512i {
    let (a, b) = (2 * j, 2 * j + 1);
    _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
}

/// The dots of `R` rows of format `F` (Q5_0, [`takes`]) with `T` tokens' activations:
/// `out[i][t]` = row `i` · token `t`, the same operations for every `(i, t)` whatever `R` and
/// `T`; each row prefetched [`prefetch_distance`] bytes ahead.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; lengths as asserted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn dots<const F: u8, const R: usize, const T: usize>(
    rows: [&[u8]; R],
    xs: [&Q40Wide; T],
) -> [[f32; T]; R] {
    // SAFETY: this function's contract is `dots_ahead`'s.
    unsafe { dots_ahead::<F, R, T>(rows, xs, prefetch_distance::<R>()) }
}

/// [`dots`] prefetching each row `ahead` bytes past the pair it reads (a hint: any distance is
/// safe).
///
/// # Safety
/// As [`dots`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn dots_ahead<const F: u8, const R: usize, const T: usize>(
    rows: [&[u8]; R],
    xs: [&Q40Wide; T],
    ahead: usize,
) -> [[f32; T]; R] {
    let nb = xs[0].blocks;
    let bb = block_bytes(F);
    assert!(
        takes(F)
            && rows.iter().all(|r| r.len() >= nb * bb)
            && xs.iter().all(|x| x.blocks == nb
                && x.x.len() >= nb.div_ceil(2) * 64
                && x.d.len() >= nb.next_multiple_of(8))
    );
    let picks = [pick(0), pick(1), pick(2), pick(3)];
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let groups = nb / 8;
    // SAFETY: every block index read below is below `nb`, every pair below `nb / 2` (whole
    // pairs) and every scale group below `nb / 8`, inside the asserted lengths.
    unsafe {
        for g in 0..groups {
            let mut s = [[_mm256_setzero_ps(); T]; R];
            for i in 0..R {
                let dw = scales8_of::<F>(rows[i].as_ptr().add(g * 8 * bb));
                for t in 0..T {
                    s[i][t] = _mm256_mul_ps(dw, _mm256_loadu_ps(xs[t].d.as_ptr().add(g * 8)));
                }
            }
            for (j, pk) in picks.iter().enumerate() {
                let pair = g * 4 + j;
                for i in 0..R {
                    let p = rows[i].as_ptr().add(pair * 2 * bb);
                    // Prefetch hint (never faults; wrapping_add keeps it UB-free).
                    _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(ahead) as *const i8);
                    let (lo, hi) = nibbles_pair::<F>(p);
                    for t in 0..T {
                        let isum = pair_sum(xs[t], pair, lo, hi);
                        let scale = _mm512_permutexvar_ps(*pk, _mm512_castps256_ps512(s[i][t]));
                        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][t]);
                    }
                }
            }
        }
        for pair in groups * 4..nb / 2 {
            for i in 0..R {
                let p = rows[i].as_ptr().add(pair * 2 * bb);
                let (lo, hi) = nibbles_pair::<F>(p);
                let (d0, d1) = (f16_at(p), f16_at(p.add(bb)));
                for t in 0..T {
                    let dx = xs[t].d.as_ptr().add(2 * pair);
                    let s = _mm_setr_ps(d0 * *dx, d1 * *dx.add(1), 0.0, 0.0);
                    let scale = _mm512_permutexvar_ps(picks[0], _mm512_castps128_ps512(s));
                    let isum = pair_sum(xs[t], pair, lo, hi);
                    acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[i][t]);
                }
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for i in 0..R {
        for t in 0..T {
            let a = acc[i][t];
            let mut lo = _mm512_castps512_ps256(a);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a)));
            if nb % 2 == 1 {
                // SAFETY: block nb - 1 of row i and of token t is in bounds (asserted above).
                lo = unsafe { last_block::<F>(rows[i], xs[t], lo) };
            }
            out[i][t] = hsum(_mm256_add_ps(lo, hi));
        }
    }
    out
}

/// The i32 lane sums of pair `pair` of `x` with the signed quants `lo`, `hi` of its two blocks
/// from [`nibbles_pair`].
///
/// # Safety
/// AVX-512F/BW/VNNI present; `pair < x.blocks.div_ceil(2)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn pair_sum(x: &Q40Wide, pair: usize, lo: __m512i, hi: __m512i) -> __m512i {
    // SAFETY: pair `pair` of `x.x` (64 i16) is in bounds (contract).
    unsafe {
        let xp = x.x.as_ptr().add(pair * 64);
        let xlo = _mm512_loadu_si512(xp as *const _);
        let xhi = _mm512_loadu_si512(xp.add(32) as *const _);
        dpwssd(_mm512_madd_epi16(lo, xlo), hi, xhi)
    }
}

/// `vpdpwssd`: `acc` plus the sums of adjacent products of `a` and `b`'s i16 lanes, as written
/// (inline asm): LLVM turns a chained `_mm512_dpwssd_epi32` into `vpmaddwd` and `vpaddd`, one
/// more instruction, in loops bound by their count (the same exact i32 sums either way).
///
/// # Safety
/// AVX-512F and AVX-512VNNI present.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
pub(super) unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: `vpdpwssd` on registers only (no memory, stack or flags), present per contract.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// `lo` plus the last block (`x.blocks - 1`, odd count) of `row` (format `F`) · `x`, as lanes 0..8
/// of a pair: the block's signed weights from the 256-bit kernel's unpacking (`weights_i16`,
/// offset included), so the i32 sums equal those of a pair's lanes.
///
/// # Safety
/// AVX2/FMA/F16C present; the block in bounds of `row` and `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn last_block<const F: u8>(row: &[u8], x: &Q40Wide, lo: __m256) -> __m256 {
    let b = x.blocks - 1;
    // SAFETY: block b of the row and pair b / 2's first half of `x` are in bounds (contract).
    unsafe {
        let p = row.as_ptr().add(b * block_bytes(F));
        let (w0, w1) = weights_i16::<F>(p);
        let xp = x.x.as_ptr().add(b / 2 * 64);
        let xlo = _mm256_loadu_si256(xp as *const __m256i);
        let xhi = _mm256_loadu_si256(xp.add(32) as *const __m256i);
        let isum = _mm256_add_epi32(_mm256_madd_epi16(w0, xlo), _mm256_madd_epi16(w1, xhi));
        let s = f16_at(p) * *x.d.get_unchecked(b);
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(s), lo)
    }
}

/// Tokens per [`dots`] call in [`batch`]: each row's pairs of blocks are unpacked once for up to
/// this many tokens.
pub(crate) const GROUP: usize = 8;

/// Rows `r0..r0 + ys[t].len()` of a matrix of format `F` ([`takes`]) for every token `t` of `xs`
/// (`ys[t]` from `xs[t]`, all of one length): a row at a time, its blocks unpacked once for up to
/// [`GROUP`] tokens ([`dots`] with `T` tokens), so each token's result is its one-token
/// [`matvec`]'s bit for bit, whatever the number of tokens (odd ones included).
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present; rows `r0..r0 + ys[0].len()` in `w`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn batch<const F: u8>(
    w: &QMatrix<'_>,
    r0: usize,
    xs: &[Q40Wide],
    ys: &mut [&mut [f32]],
) {
    assert!(xs.len() == ys.len() && !ys.is_empty());
    let n = ys[0].len();
    assert!(ys.iter().all(|y| y.len() == n) && r0 + n <= w.rows());
    for r in 0..n {
        let row = w.row_data(r0 + r);
        for (k, x) in xs.chunks(GROUP).enumerate() {
            let out = &mut ys[k * GROUP..k * GROUP + x.len()];
            macro_rules! group {
                ($t:literal) => {{
                    // SAFETY: features present per contract; `dots` asserts the lengths.
                    let [d] = unsafe { dots::<F, 1, $t>([row], std::array::from_fn(|j| &x[j])) };
                    for (y, v) in out.iter_mut().zip(d) {
                        y[r] = v;
                    }
                }};
            }
            match x.len() {
                1 => group!(1),
                2 => group!(2),
                3 => group!(3),
                4 => group!(4),
                5 => group!(5),
                6 => group!(6),
                7 => group!(7),
                _ => group!(8),
            }
        }
    }
}

/// [`dots`] of one token over rows of format `F` as the kernel of the shared row drivers.
pub(super) struct Q40WideDots<'a, const F: u8>(pub(super) &'a Q40Wide);

impl<const F: u8> crate::arch::drivers::RowDots for Q40WideDots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        // SAFETY: AVX-512F/BW/VNNI present per this method's contract (the kernel is used on the
        // Avx512 path only); `dots` asserts the lengths.
        let d = unsafe { dots::<F, N, 1>(rows, [self.0]) };
        std::array::from_fn(|i| d[i][0])
    }
}

/// [`dots`] of one token over the rows of a dense matrix, `R` adjacent rows a step, each row
/// prefetched at the same place `R` rows on (the next step's row), not [`prefetch_distance`]
/// ahead: with four rows a step that would fall inside the four rows being read.
struct Q40DenseDots<'a, const F: u8>(&'a Q40Wide);

impl<const F: u8> crate::arch::drivers::RowDots for Q40DenseDots<'_, F> {
    #[inline(always)]
    unsafe fn dots<const N: usize>(&self, rows: [&[u8]; N]) -> [f32; N] {
        let ahead = N * self.0.blocks * block_bytes(F);
        // SAFETY: as `Q40WideDots::dots`.
        let d = unsafe { dots_ahead::<F, N, 1>(rows, [self.0], ahead) };
        std::array::from_fn(|i| d[i][0])
    }
}

/// Blocks a row needs for a dense matrix to take four adjacent rows a step ([`Q40DenseDots`]):
/// on shorter rows one row a step streams faster. Measured 2026-12-03 (2 threads, quiet):
/// OLMoE-shaped 4-layer synthetic decode (2048 columns: experts, attention, output) 77.6/81.7
/// tok/s one row a step against 62.5/67.1 four; the 7B-shaped one (4096 columns) 29.4/28.7
/// against 33.0/39.0.
pub(crate) const FOUR_ROW_BLOCKS: usize = 128;

/// `y[i] = dot(W[sel.get(i)], x)` for a matrix of format `F` ([`takes`]): listed rows four a step,
/// sharing the activations' loads; a dense matrix's rows four adjacent rows a step
/// ([`Q40DenseDots`]) when they have at least [`FOUR_ROW_BLOCKS`] blocks, else one a step; each
/// row's result does not depend on the step.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512F/BW/VNNI present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn matvec<const F: u8>(
    w: &QMatrix<'_>,
    sel: crate::arch::Rows<'_>,
    x: &Q40Wide,
    y: &mut [f32],
) {
    use crate::arch::drivers::rows_blocked;
    // SAFETY: features present per contract, all the kernel needs.
    unsafe {
        if !matches!(sel, crate::arch::Rows::From(_)) {
            rows_blocked::<4, _>(&Q40WideDots::<F>(x), w, sel, y)
        } else if x.blocks >= FOUR_ROW_BLOCKS {
            rows_blocked::<4, _>(&Q40DenseDots::<F>(x), w, sel, y)
        } else {
            rows_blocked::<1, _>(&Q40WideDots::<F>(x), w, sel, y)
        }
    }
}
