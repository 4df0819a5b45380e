//! KV-cache row kernels (attention over an f32, f16 or `q8_0` cache): `q · row` and
//! `out += alpha · row`, with f16 converted by the AdvSIMD `fcvtl`/`fcvtl2` instructions (ARMv8.0,
//! no FP16 arithmetic extension needed) and `q8_0` quants widened to f32 and scaled once per
//! 32-element block. The f32 kernels sum in the order of `vector.rs`, so an f32 cache gives the
//! numbers the f32 attention did.

use std::arch::aarch64::*;

use super::simd::{f16_at, load_f32x4, load_u8x16, s8_to_f32};
use crate::KvFormat;

/// Bytes of a `q8_0` block.
const Q8: usize = 34;

/// The first 4 f32 stored as bytes at the start of `b`.
#[inline]
#[target_feature(enable = "neon")]
fn f32x4_bytes(b: &[u8]) -> float32x4_t {
    vreinterpretq_f32_u8(load_u8x16(b))
}

/// The first 8 f16 stored at the start of `b`, as two f32x4.
#[inline]
#[target_feature(enable = "neon")]
fn f16x8(b: &[u8]) -> [float32x4_t; 2] {
    let h = load_u8x16(b);
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: `fcvtl`/`fcvtl2` (half to single precision, lanes 0-3 and 4-7) are AdvSIMD
    // instructions of ARMv8.0, present on every aarch64 target; they only read and write
    // registers.
    unsafe {
        std::arch::asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    [lo, hi]
}

fn elem<const HALF: bool>(row: &[u8], j: usize) -> f32 {
    if HALF {
        half::f16::from_le_bytes([row[2 * j], row[2 * j + 1]]).to_f32()
    } else {
        f32::from_le_bytes([row[4 * j], row[4 * j + 1], row[4 * j + 2], row[4 * j + 3]])
    }
}

/// 16 elements of a float row at element `j`, as four f32x4.
#[inline]
#[target_feature(enable = "neon")]
fn load16<const HALF: bool>(row: &[u8], j: usize) -> [float32x4_t; 4] {
    if HALF {
        let [a, b] = f16x8(&row[2 * j..]);
        let [c, d] = f16x8(&row[2 * j + 16..]);
        [a, b, c, d]
    } else {
        let r = &row[4 * j..];
        [
            f32x4_bytes(r),
            f32x4_bytes(&r[16..]),
            f32x4_bytes(&r[32..]),
            f32x4_bytes(&r[48..]),
        ]
    }
}

/// `q · row` for a float row of `q.len()` elements (as `vector::dot_f32`).
#[inline]
#[target_feature(enable = "neon")]
fn dot_float<const HALF: bool>(q: &[f32], row: &[u8]) -> f32 {
    let n = q.len();
    let n16 = n / 16 * 16;
    let mut acc = [vdupq_n_f32(0.0); 4];
    for j in (0..n16).step_by(16) {
        let r = load16::<HALF>(row, j);
        for i in 0..4 {
            acc[i] = vfmaq_f32(acc[i], load_f32x4(&q[j + 4 * i..]), r[i]);
        }
    }
    let mut s = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    for (k, x) in q.iter().enumerate().skip(n16) {
        s += x * elem::<HALF>(row, k);
    }
    s
}

/// The 32 quants of the `q8_0` block at the start of `b`, as eight f32x4.
#[inline]
#[target_feature(enable = "neon")]
fn q8x32(b: &[u8]) -> [float32x4_t; 8] {
    let lo = s8_to_f32(vreinterpretq_s8_u8(load_u8x16(&b[2..])));
    let hi = s8_to_f32(vreinterpretq_s8_u8(load_u8x16(&b[18..])));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// `q · row` for a `q8_0` row of `q.len()` elements (a multiple of 32).
#[inline]
#[target_feature(enable = "neon")]
fn dot_q8(q: &[f32], row: &[u8]) -> f32 {
    let mut acc = vdupq_n_f32(0.0);
    for (x, b) in q.chunks_exact(32).zip(row.chunks_exact(Q8)) {
        let w = q8x32(b);
        let mut s = vmulq_f32(load_f32x4(x), w[0]);
        for i in 1..8 {
            s = vfmaq_f32(s, load_f32x4(&x[4 * i..]), w[i]);
        }
        acc = vfmaq_n_f32(acc, s, f16_at(b, 0));
    }
    vaddvq_f32(acc)
}

/// `out += alpha · row` for a float row (as `vector::axpy_f32`: f32 four at a time; f16 eight).
#[inline]
#[target_feature(enable = "neon")]
fn axpy_float<const HALF: bool>(alpha: f32, row: &[u8], out: &mut [f32]) {
    let n = out.len();
    let step = if HALF { 8 } else { 4 };
    let whole = n / step * step;
    for j in (0..whole).step_by(step) {
        let r = if HALF {
            f16x8(&row[2 * j..])
        } else {
            [f32x4_bytes(&row[4 * j..]), vdupq_n_f32(0.0)]
        };
        for (i, x) in r.into_iter().take(step / 4).enumerate() {
            let y = &mut out[j + 4 * i..j + 4 * i + 4];
            let v = vfmaq_n_f32(load_f32x4(y), x, alpha);
            // SAFETY: `y` is exactly 4 writable f32.
            unsafe { vst1q_f32(y.as_mut_ptr(), v) };
        }
    }
    for (k, o) in out.iter_mut().enumerate().skip(whole) {
        *o += alpha * elem::<HALF>(row, k);
    }
}

/// `out += alpha · row` for a `q8_0` row of `out.len()` elements (a multiple of 32).
#[inline]
#[target_feature(enable = "neon")]
fn axpy_q8(alpha: f32, row: &[u8], out: &mut [f32]) {
    for (o, b) in out.chunks_exact_mut(32).zip(row.chunks_exact(Q8)) {
        let c = alpha * f16_at(b, 0);
        for (y, w) in o.chunks_exact_mut(4).zip(q8x32(b)) {
            let v = vfmaq_n_f32(load_f32x4(y), w, c);
            // SAFETY: `y` is exactly 4 writable f32.
            unsafe { vst1q_f32(y.as_mut_ptr(), v) };
        }
    }
}

/// `scores[p] = scale * (q · row p)` (see `arch::kv::scores`).
#[target_feature(enable = "neon")]
pub(crate) fn kv_scores(
    format: KvFormat,
    q: &[f32],
    rows: &[u8],
    pos_bytes: usize,
    off: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let Some(hb) = format.row_bytes(q.len()) else {
        return;
    };
    for (p, s) in scores.iter_mut().enumerate() {
        let row = &rows[p * pos_bytes + off..][..hb];
        *s = scale
            * match format {
                KvFormat::F32 => dot_float::<false>(q, row),
                KvFormat::F16 => dot_float::<true>(q, row),
                KvFormat::Q8_0 => dot_q8(q, row),
            };
    }
}

/// `out += Σ_p weights[p] · row p` (see `arch::kv::accumulate`).
#[target_feature(enable = "neon")]
pub(crate) fn kv_accumulate(
    format: KvFormat,
    weights: &[f32],
    rows: &[u8],
    pos_bytes: usize,
    off: usize,
    out: &mut [f32],
) {
    let Some(hb) = format.row_bytes(out.len()) else {
        return;
    };
    for (p, &w) in weights.iter().enumerate() {
        let row = &rows[p * pos_bytes + off..][..hb];
        match format {
            KvFormat::F32 => axpy_float::<false>(w, row, out),
            KvFormat::F16 => axpy_float::<true>(w, row, out),
            KvFormat::Q8_0 => axpy_q8(w, row, out),
        }
    }
}
