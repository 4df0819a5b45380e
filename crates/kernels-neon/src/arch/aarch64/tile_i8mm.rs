//! The 8-bit prompt tile of the 32-element block formats with `smmla` (the `i8mm` extension,
//! [`KernelPath::NeonI8mm`](crate::KernelPath::NeonI8mm)): one instruction multiplies a 2×8 block
//! of two weight rows by an 8×2 block of two tokens into four i32 sums, so two rows by two tokens
//! take four instructions per 32-element block where `sdot` takes eight. The rows' quants are
//! unpacked once per row pair, the tokens' interleaved once per tile; each block's four sums get
//! one convert and one FMA with the four `d_w * d_x` (and Q4_1/Q5_1's min term, `m_w * s_x`).

use std::arch::aarch64::*;
use std::arch::asm;

use super::dequant::weights_i8;
use super::simd::f16_at;
use crate::arch::tags::{block_bytes, has_min, IQ4_NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::quant::QActs;
use crate::{QMatrix, WeightFormat};

/// Whether [`tile_i8mm`] takes weights of `format`: the formats of 32-element blocks of integer
/// quants.
pub(crate) fn has_tile_i8mm(format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL)
}

/// `acc += a · bᵀ` for `a`, `b` two 2×8 i8 matrices (row-major in the 16 lanes): lanes
/// `[a0·b0, a0·b1, a1·b0, a1·b1]`.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[inline]
#[target_feature(enable = "neon,i8mm")]
pub(super) unsafe fn smmla(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `smmla` only reads/writes the named vector registers; the caller guarantees the
    // i8mm extension is present.
    unsafe {
        asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Two 32-element blocks (`p` and `q`, each as two halves of 16) as `smmla`'s operands: for each
/// 8 elements `8c..8c + 8`, `p`'s then `q`'s.
#[inline]
#[target_feature(enable = "neon")]
pub(super) fn interleave(p: (int8x16_t, int8x16_t), q: (int8x16_t, int8x16_t)) -> [int8x16_t; 4] {
    let z = |a: int8x16_t, b: int8x16_t| {
        let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
        (
            vreinterpretq_s8_s64(vzip1q_s64(a, b)),
            vreinterpretq_s8_s64(vzip2q_s64(a, b)),
        )
    };
    let (c0, c1) = z(p.0, q.0);
    let (c2, c3) = z(p.1, q.1);
    [c0, c1, c2, c3]
}

/// A token pair's activations interleaved for `smmla`, with the per-block scales `[d0, d1, d0, d1]`
/// and `[s0, s1, s0, s1]` (`s` = `d * sum(q)`, the min term's).
struct TokenPair {
    q: Vec<[int8x16_t; 4]>,
    d: Vec<float32x4_t>,
    s: Vec<float32x4_t>,
}

#[target_feature(enable = "neon")]
fn token_pair(a: &QActs, b: &QActs, nb: usize) -> TokenPair {
    let half = |x: &QActs, e: usize| {
        let q = &x.qs[e..e + 16];
        // SAFETY: `q` has exactly 16 readable i8 (bounds-checked above).
        unsafe { vld1q_s8(q.as_ptr()) }
    };
    let pair4 = |u: f32, v: f32| {
        let uv = vset_lane_f32::<1>(v, vdup_n_f32(u));
        vcombine_f32(uv, uv)
    };
    let mut t = TokenPair {
        q: Vec::with_capacity(nb),
        d: Vec::with_capacity(nb),
        s: Vec::with_capacity(nb),
    };
    for blk in 0..nb {
        let e = 32 * blk;
        let (pa, pb) = ((half(a, e), half(a, e + 16)), (half(b, e), half(b, e + 16)));
        t.q.push(interleave(pa, pb));
        t.d.push(pair4(a.d[blk], b.d[blk]));
        t.s.push(pair4(a.s[blk], b.s[blk]));
    }
    t
}

/// Rows `i` and `j` (`j` may equal `i`) of one format: quants interleaved, scales `[d_i, d_i,
/// d_j, d_j]` and, for Q4_1/Q5_1, mins likewise.
#[target_feature(enable = "neon")]
fn row_pair<const F: u8>(
    ri: &[u8],
    rj: &[u8],
) -> (Vec<[int8x16_t; 4]>, Vec<float32x4_t>, Vec<float32x4_t>) {
    let bb = block_bytes(F);
    let nb = ri.len() / bb;
    let (mut q, mut d, mut m) = (Vec::with_capacity(nb), Vec::with_capacity(nb), Vec::new());
    let both = |u: f32, v: f32| vcombine_f32(vdup_n_f32(u), vdup_n_f32(v));
    for (bi, bj) in ri.chunks_exact(bb).zip(rj.chunks_exact(bb)) {
        q.push(interleave(weights_i8::<F>(bi), weights_i8::<F>(bj)));
        d.push(both(f16_at(bi, 0), f16_at(bj, 0)));
        if has_min(F) {
            m.push(both(f16_at(bi, 2), f16_at(bj, 2)));
        }
    }
    (q, d, m)
}

/// [`tile_i8mm`] for one format.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
unsafe fn tile_f<const F: u8>(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &mut [f32],
) {
    let n = acts.len();
    let nb = w.cols() / 32;
    let pairs: Vec<TokenPair> = (0..n.div_ceil(2))
        .map(|p| token_pair(&acts[2 * p], &acts[(2 * p + 1).min(n - 1)], nb))
        .collect();
    for i in (0..nr).step_by(2) {
        let j = (i + 1).min(nr - 1);
        let (wq, wd, wm) = row_pair::<F>(w.row_data(r0 + i), w.row_data(r0 + j));
        for (p, x) in pairs.iter().enumerate() {
            let mut acc = vdupq_n_f32(0.0);
            for b in 0..nb {
                let (a, t) = (&wq[b], &x.q[b]);
                // SAFETY: i8mm present per this function's contract.
                let s = unsafe {
                    let s = smmla(vdupq_n_s32(0), a[0], t[0]);
                    let s = smmla(s, a[1], t[1]);
                    let s = smmla(s, a[2], t[2]);
                    smmla(s, a[3], t[3])
                };
                acc = vfmaq_f32(acc, vcvtq_f32_s32(s), vmulq_f32(wd[b], x.d[b]));
                if has_min(F) {
                    acc = vfmaq_f32(acc, wm[b], x.s[b]);
                }
            }
            let mut lanes = [0f32; 4];
            // SAFETY: `lanes` is 4 writable f32.
            unsafe { vst1q_f32(lanes.as_mut_ptr(), acc) };
            let (t0, t1) = (2 * p, 2 * p + 1);
            out[t0 * nr + i] = lanes[0];
            if t1 < n {
                out[t1 * nr + i] = lanes[1];
            }
            if j != i {
                out[t0 * nr + j] = lanes[2];
                if t1 < n {
                    out[t1 * nr + j] = lanes[3];
                }
            }
        }
    }
}

/// The 8-bit prompt tile with `smmla`: `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for
/// every token of `acts` (8-bit activations with one scale per 32, `QActs::quantize`): the
/// integer products of [`matvec_int8`](super::matvec_int8), summed in another f32 order. Formats
/// other than [`has_tile_i8mm`]'s are left to the caller.
///
/// # Safety
/// The CPU must support the `i8mm` extension.
#[target_feature(enable = "neon,i8mm")]
pub(crate) unsafe fn tile_i8mm(
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    acts: &[QActs],
    out: &mut [f32],
) {
    if acts.is_empty() || nr == 0 {
        return;
    }
    type Tile = unsafe fn(&QMatrix<'_>, usize, usize, &[QActs], &mut [f32]);
    let f: Tile = match w.format() {
        WeightFormat::Q4_0 => tile_f::<Q4_0>,
        WeightFormat::Q4_1 => tile_f::<Q4_1>,
        WeightFormat::Q5_0 => tile_f::<Q5_0>,
        WeightFormat::Q5_1 => tile_f::<Q5_1>,
        WeightFormat::Q8_0 => tile_f::<Q8_0>,
        WeightFormat::IQ4_NL => tile_f::<IQ4_NL>,
        _ => return,
    };
    // SAFETY: i8mm present per this function's contract.
    unsafe { f(w, r0, nr, acts, out) }
}
