//! aarch64 NEON kernels (NEON is baseline on aarch64, so these are safe
//! functions), plus the optional `dotprod` (`sdot`) integer path.
//!
//! Every raw-pointer load is preceded by a bounds-checked slice of exactly
//! the bytes it reads (`&row[a..b]` panics instead of reading out of
//! bounds; callers have validated lengths, so this never fires).

use std::arch::aarch64::*;
use std::arch::asm;

use half::{bf16, f16};

use crate::arch::Rows;
use crate::quant::{QActs, QActs16};
use crate::{QMatrix, WeightFormat};

const Q8_0: u8 = 0;
const Q4_0: u8 = 1;
const Q4_1: u8 = 2;

const fn block_bytes(f: u8) -> usize {
    match f {
        Q8_0 => 34,
        Q4_0 => 18,
        _ => 20,
    }
}

#[inline]
#[target_feature(enable = "neon")]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[inline]
#[target_feature(enable = "neon")]
fn load_u8x16(b: &[u8]) -> uint8x16_t {
    let b = &b[..16];
    // SAFETY: `b` has exactly 16 readable bytes (bounds-checked above);
    // NEON is baseline on aarch64; ld1 has no alignment requirement for u8.
    unsafe { vld1q_u8(b.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn load_f32x4(x: &[f32]) -> float32x4_t {
    let x = &x[..4];
    // SAFETY: `x` has exactly 4 readable f32 (bounds-checked above).
    unsafe { vld1q_f32(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn s8_to_f32(q: int8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_s8(vget_low_s8(q));
    let hi = vmovl_high_s8(q);
    [
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
        vcvtq_f32_s32(vmovl_high_s16(lo)),
        vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
        vcvtq_f32_s32(vmovl_high_s16(hi)),
    ]
}

#[inline]
#[target_feature(enable = "neon")]
fn u8_to_f32(q: uint8x16_t) -> [float32x4_t; 4] {
    let lo = vmovl_u8(vget_low_u8(q));
    let hi = vmovl_high_u8(q);
    [
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))),
        vcvtq_f32_u32(vmovl_high_u16(lo)),
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))),
        vcvtq_f32_u32(vmovl_high_u16(hi)),
    ]
}

/// Dequantizes one block (`blk` starts at the block) into 8 × f32x4.
#[inline]
#[target_feature(enable = "neon")]
fn dequant_block<const F: u8>(blk: &[u8]) -> [float32x4_t; 8] {
    let d = f16_at(blk, 0);
    let (a, b) = match F {
        Q8_0 => (
            s8_to_f32(vreinterpretq_s8_u8(load_u8x16(&blk[2..18]))),
            s8_to_f32(vreinterpretq_s8_u8(load_u8x16(&blk[18..34]))),
        ),
        Q4_0 => {
            let raw = load_u8x16(&blk[2..18]);
            let eight = vdupq_n_s8(8);
            (
                s8_to_f32(vsubq_s8(
                    vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))),
                    eight,
                )),
                s8_to_f32(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight)),
            )
        }
        _ => {
            let raw = load_u8x16(&blk[4..20]);
            (
                u8_to_f32(vandq_u8(raw, vdupq_n_u8(0x0F))),
                u8_to_f32(vshrq_n_u8::<4>(raw)),
            )
        }
    };
    let mut out = [vdupq_n_f32(0.0); 8];
    if F == Q4_1 {
        let m = vdupq_n_f32(f16_at(blk, 2));
        for (o, v) in out.iter_mut().zip(a.iter().chain(&b)) {
            *o = vfmaq_n_f32(m, *v, d);
        }
    } else {
        for (o, v) in out.iter_mut().zip(a.iter().chain(&b)) {
            *o = vmulq_n_f32(*v, d);
        }
    }
    out
}

#[target_feature(enable = "neon")]
fn dequant_q<const F: u8>(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src
        .chunks_exact(block_bytes(F))
        .zip(dst.chunks_exact_mut(32))
    {
        let w = dequant_block::<F>(blk);
        for (o, v) in out.chunks_exact_mut(4).zip(&w) {
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), *v) };
        }
    }
}

/// Dequantizes a row (`src` has exactly `format.row_bytes(dst.len())` bytes).
#[target_feature(enable = "neon")]
pub(crate) fn dequant_row(format: WeightFormat, src: &[u8], dst: &mut [f32]) {
    match format {
        WeightFormat::Q8_0 => dequant_q::<Q8_0>(src, dst),
        WeightFormat::Q4_0 => dequant_q::<Q4_0>(src, dst),
        WeightFormat::Q4_1 => dequant_q::<Q4_1>(src, dst),
        WeightFormat::BF16 => {
            let n8 = dst.len() / 8 * 8;
            for (c, o) in src[..n8 * 2].chunks_exact(16).zip(dst.chunks_exact_mut(8)) {
                let v = vreinterpretq_u16_u8(load_u8x16(c));
                let lo = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(v)));
                let hi = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(v));
                // SAFETY: `o` is exactly 8 writable f32.
                unsafe {
                    vst1q_f32(o.as_mut_ptr(), lo);
                    vst1q_f32(o.as_mut_ptr().add(4), hi);
                }
            }
            for (j, o) in dst.iter_mut().enumerate().skip(n8) {
                *o = bf16::from_le_bytes([src[2 * j], src[2 * j + 1]]).to_f32();
            }
        }
        WeightFormat::Q4_K | WeightFormat::Q6_K => {
            for (blk, out) in src
                .chunks_exact(format.block_bytes())
                .zip(dst.chunks_exact_mut(256))
            {
                dequant_superblock(format, blk, out);
            }
        }
        WeightFormat::I4Hybrid { outliers_per_row } => {
            dequant_hybrid(usize::from(outliers_per_row), src, dst)
        }
        WeightFormat::F32 | WeightFormat::F16 => crate::scalar::dequant_row(format, src, dst),
    }
}

/// The 32 INT4 weights `q - 8` of one nibble group (16 bytes, `Q4_0`
/// order) of an I4Hybrid row as 8 × f32x4 (unpacked as in `dequant_block`
/// for `Q4_0`, without the scale).
#[inline]
#[target_feature(enable = "neon")]
fn hybrid_group(g: &[u8]) -> [float32x4_t; 8] {
    let raw = load_u8x16(g);
    let eight = vdupq_n_s8(8);
    let lo = s8_to_f32(vsubq_s8(
        vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))),
        eight,
    ));
    let hi = s8_to_f32(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// Dequantizes an I4Hybrid row: `s * (q - 8)` (the scalar reference's
/// operations, bit-identical), then the outliers added by the scalar code.
#[target_feature(enable = "neon")]
fn dequant_hybrid(k: usize, src: &[u8], dst: &mut [f32]) {
    let h = crate::scalar::Hybrid::parse(k, dst.len(), src);
    for (g, out) in h.nib.chunks_exact(16).zip(dst.chunks_exact_mut(32)) {
        let w = hybrid_group(g);
        for (o, v) in out.chunks_exact_mut(4).zip(&w) {
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), vmulq_n_f32(*v, h.s)) };
        }
    }
    for (c, v) in h.outliers() {
        dst[c] += h.so * v;
    }
}

/// Exact dot of an I4Hybrid row with f32 `x`: `s * Σ (q - 8) x` with FMAs
/// (4 accumulators), plus the outliers `so * Σ o_j x[c_j]` (scalar).
#[target_feature(enable = "neon")]
fn dot_exact_hybrid(k: usize, row: &[u8], x: &[f32]) -> f32 {
    let h = crate::scalar::Hybrid::parse(k, x.len(), row);
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (g, xs) in h.nib.chunks_exact(16).zip(x.chunks_exact(32)) {
        let w = hybrid_group(g);
        for i in 0..8 {
            acc[i & 3] = vfmaq_f32(acc[i & 3], w[i], load_f32x4(&xs[4 * i..]));
        }
    }
    let sum = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    h.s * sum + h.outlier_dot(x)
}

/// `ys += c * W[c0 .. c0 + ys.len()]` for an I4Hybrid row of `cols`
/// elements (`c0` and `ys.len()` multiples of 32): the nibble groups of the
/// range FMA'd with `c * s` (as `axpy_q` for `Q4_0`), then the outliers in
/// the range added by the scalar code.
#[target_feature(enable = "neon")]
pub(crate) fn axpy_hybrid(k: usize, c: f32, row: &[u8], cols: usize, c0: usize, ys: &mut [f32]) {
    let h = crate::scalar::Hybrid::parse(k, cols, row);
    let cs = c * h.s;
    let nib = &h.nib[c0 / 2..(c0 + ys.len()) / 2];
    for (g, out) in nib.chunks_exact(16).zip(ys.chunks_exact_mut(32)) {
        let w = hybrid_group(g);
        for (o, v) in out.chunks_exact_mut(4).zip(&w) {
            let r = vfmaq_n_f32(load_f32x4(o), *v, cs);
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), r) };
        }
    }
    h.outlier_axpy(c, c0, ys);
}

/// Stores 16 f32 (4 × f32x4) at the start of `o`.
#[inline]
#[target_feature(enable = "neon")]
fn store16(o: &mut [f32], v: [float32x4_t; 4]) {
    let o = &mut o[..16];
    for (c, x) in o.chunks_exact_mut(4).zip(v) {
        // SAFETY: `c` is exactly 4 writable f32.
        unsafe { vst1q_f32(c.as_mut_ptr(), x) };
    }
}

/// The signed 6-bit quants `q - 32` of Q6_K elements `128n + 32k + 16p ..
/// + 16` (half `n`, quarter `k`, part `p`) of super-block `blk`.
#[inline]
#[target_feature(enable = "neon")]
fn q6k_quants16(blk: &[u8], n: usize, k: usize, p: usize) -> int8x16_t {
    let src = load_u8x16(&blk[64 * n + 32 * (k & 1) + 16 * p..]);
    let qh = load_u8x16(&blk[128 + 32 * n + 16 * p..]);
    let m4 = vdupq_n_u8(0x0F);
    let lo = if k < 2 {
        vandq_u8(src, m4)
    } else {
        vshrq_n_u8::<4>(src)
    };
    let hb = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-2 * k as i8)), vdupq_n_u8(3));
    vsubq_s8(
        vreinterpretq_s8_u8(vorrq_u8(lo, vshlq_n_u8::<4>(hb))),
        vdupq_n_s8(32),
    )
}

/// Dequantizes one K-quant super-block (`blk`, a full block) into the
/// first 256 elements of `out`. Same f32 operations as the scalar reference
/// (`d*sc * q - dmin*m` for Q4_K, `(d*sc) * q` for Q6_K; no FMA), so the
/// results are bit-identical.
#[target_feature(enable = "neon")]
fn dequant_superblock(format: WeightFormat, blk: &[u8], out: &mut [f32]) {
    let out = &mut out[..256];
    if format == WeightFormat::Q4_K {
        let (dl, ml) = crate::scalar::q4k_scales(blk);
        let m4 = vdupq_n_u8(0x0F);
        for g in 0..4 {
            for part in 0..2 {
                let raw = load_u8x16(&blk[16 + 32 * g + 16 * part..]);
                for (h, q) in [vandq_u8(raw, m4), vshrq_n_u8::<4>(raw)]
                    .into_iter()
                    .enumerate()
                {
                    let j = 2 * g + h;
                    let m = vdupq_n_f32(ml[j]);
                    let v = u8_to_f32(q).map(|x| vsubq_f32(vmulq_n_f32(x, dl[j]), m));
                    store16(&mut out[32 * j + 16 * part..], v);
                }
            }
        }
    } else {
        let ds = crate::scalar::q6k_scales(blk);
        for n in 0..2 {
            for k in 0..4 {
                for p in 0..2 {
                    let q = q6k_quants16(blk, n, k, p);
                    let d = ds[8 * n + 2 * k + p];
                    let v = s8_to_f32(q).map(|x| vmulq_n_f32(x, d));
                    store16(&mut out[128 * n + 32 * k + 16 * p..], v);
                }
            }
        }
    }
}

/// Exact dot of a K-quant row with f32 `x`: each super-block is dequantized
/// into 256 f32 on the stack, then multiplied with NEON FMAs (4 accumulators).
#[target_feature(enable = "neon")]
fn dot_exact_k(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    let mut buf = [0f32; 256];
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (blk, xs) in row
        .chunks_exact(format.block_bytes())
        .zip(x.chunks_exact(256))
    {
        dequant_superblock(format, blk, &mut buf);
        for (i, (w, v)) in buf.chunks_exact(4).zip(xs.chunks_exact(4)).enumerate() {
            acc[i & 3] = vfmaq_f32(acc[i & 3], load_f32x4(w), load_f32x4(v));
        }
    }
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ))
}

#[target_feature(enable = "neon")]
fn dot_exact_q<const F: u8>(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (blk, xs) in row.chunks_exact(block_bytes(F)).zip(x.chunks_exact(32)) {
        let w = dequant_block::<F>(blk);
        for i in 0..8 {
            acc[i & 3] = vfmaq_f32(acc[i & 3], w[i], load_f32x4(&xs[4 * i..]));
        }
    }
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ))
}

/// Float-format rows: convert 32 elements at a time to f32, then FMA.
#[target_feature(enable = "neon")]
fn dot_exact_float(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    let eb = format.block_bytes();
    let mut buf = [0f32; 32];
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut tail = 0f32;
    for (g, xs) in row.chunks(32 * eb).zip(x.chunks(32)) {
        let n = xs.len();
        if format == WeightFormat::BF16 {
            dequant_row(format, g, &mut buf[..n]);
        } else {
            crate::scalar::dequant_row(format, g, &mut buf[..n]);
        }
        let n4 = n / 4 * 4;
        for i in (0..n4).step_by(4) {
            let a = &mut acc[(i / 4) & 3];
            *a = vfmaq_f32(*a, load_f32x4(&buf[i..]), load_f32x4(&xs[i..]));
        }
        for i in n4..n {
            tail += buf[i] * xs[i];
        }
    }
    vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    )) + tail
}

#[target_feature(enable = "neon")]
pub(crate) fn matvec_exact(w: &QMatrix<'_>, sel: Rows<'_>, x: &[f32], y: &mut [f32]) {
    let format = w.format();
    for (i, yv) in y.iter_mut().enumerate() {
        sel.prefetch(w, i + 2, 1);
        let row = w.row_data(sel.get(i));
        *yv = match format {
            WeightFormat::Q8_0 => dot_exact_q::<Q8_0>(row, x),
            WeightFormat::Q4_0 => dot_exact_q::<Q4_0>(row, x),
            WeightFormat::Q4_1 => dot_exact_q::<Q4_1>(row, x),
            WeightFormat::Q4_K | WeightFormat::Q6_K => dot_exact_k(format, row, x),
            WeightFormat::I4Hybrid { outliers_per_row } => {
                dot_exact_hybrid(usize::from(outliers_per_row), row, x)
            }
            _ => dot_exact_float(format, row, x),
        };
    }
}

#[target_feature(enable = "neon")]
fn axpy_q<const F: u8>(c: f32, row: &[u8], y: &mut [f32]) {
    for (blk, ys) in row.chunks_exact(block_bytes(F)).zip(y.chunks_exact_mut(32)) {
        let w = dequant_block::<F>(blk);
        for (o, v) in ys.chunks_exact_mut(4).zip(&w) {
            let r = vfmaq_n_f32(load_f32x4(o), *v, c);
            // SAFETY: `o` is exactly 4 writable f32.
            unsafe { vst1q_f32(o.as_mut_ptr(), r) };
        }
    }
}

/// `y += c * dequant(row)` (`row` has exactly `format.row_bytes(y.len())`
/// bytes). Float formats: 32 elements at a time converted, then `axpy_f32`.
#[target_feature(enable = "neon")]
pub(crate) fn axpy_row(format: WeightFormat, c: f32, row: &[u8], y: &mut [f32]) {
    match format {
        WeightFormat::Q8_0 => axpy_q::<Q8_0>(c, row, y),
        WeightFormat::Q4_0 => axpy_q::<Q4_0>(c, row, y),
        WeightFormat::Q4_1 => axpy_q::<Q4_1>(c, row, y),
        WeightFormat::Q4_K | WeightFormat::Q6_K => {
            // Dequantize each 256-element super-block, then FMA it in.
            let mut buf = [0f32; 256];
            for (blk, ys) in row
                .chunks_exact(format.block_bytes())
                .zip(y.chunks_exact_mut(256))
            {
                dequant_superblock(format, blk, &mut buf);
                axpy_f32(c, &buf, ys);
            }
        }
        WeightFormat::I4Hybrid { outliers_per_row } => {
            axpy_hybrid(usize::from(outliers_per_row), c, row, y.len(), 0, y)
        }
        _ => {
            let eb = format.block_bytes();
            let mut buf = [0f32; 32];
            for (g, ys) in row.chunks(32 * eb).zip(y.chunks_mut(32)) {
                let n = ys.len();
                dequant_row(format, g, &mut buf[..n]);
                axpy_f32(c, &buf[..n], ys);
            }
        }
    }
}

/// The two 16-lane i8 halves of weight block `blk` (Q4_1: unsigned nibbles).
#[inline]
#[target_feature(enable = "neon")]
fn weights_i8<const F: u8>(blk: &[u8]) -> (int8x16_t, int8x16_t) {
    match F {
        Q8_0 => (
            vreinterpretq_s8_u8(load_u8x16(&blk[2..18])),
            vreinterpretq_s8_u8(load_u8x16(&blk[18..34])),
        ),
        Q4_0 => {
            let raw = load_u8x16(&blk[2..18]);
            let eight = vdupq_n_s8(8);
            (
                vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))), eight),
                vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)), eight),
            )
        }
        _ => {
            let raw = load_u8x16(&blk[4..20]);
            (
                vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0F))),
                vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw)),
            )
        }
    }
}

#[inline]
#[target_feature(enable = "neon")]
fn acts_i8(qs: &[i8]) -> (int8x16_t, int8x16_t) {
    let qs = &qs[..32];
    // SAFETY: `qs` has exactly 32 readable i8 (bounds-checked above).
    unsafe { (vld1q_s8(qs.as_ptr()), vld1q_s8(qs.as_ptr().add(16))) }
}

/// Integer dot of one row with widening multiplies (plain NEON).
#[target_feature(enable = "neon")]
fn dot_int8_row<const F: u8>(row: &[u8], xq: &QActs) -> f32 {
    let mut sumv = vdupq_n_f32(0.0);
    let mut extra = 0f32;
    for (b, blk) in row.chunks_exact(block_bytes(F)).enumerate() {
        let (w0, w1) = weights_i8::<F>(blk);
        let (x0, x1) = acts_i8(&xq.qs[b * 32..]);
        let mut s = vpaddlq_s16(vmull_s8(vget_low_s8(w0), vget_low_s8(x0)));
        s = vpadalq_s16(s, vmull_high_s8(w0, x0));
        s = vpadalq_s16(s, vmull_s8(vget_low_s8(w1), vget_low_s8(x1)));
        s = vpadalq_s16(s, vmull_high_s8(w1, x1));
        sumv = vfmaq_n_f32(sumv, vcvtq_f32_s32(s), f16_at(blk, 0) * xq.d[b]);
        if F == Q4_1 {
            extra += f16_at(blk, 2) * xq.s[b];
        }
    }
    vaddvq_f32(sumv) + extra
}

/// `acc += sdot(a, b)` (4 lanes, each the dot of 4 i8 pairs).
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `sdot` only reads/writes the named vector registers; the
    // caller guarantees the dotprod extension is present.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    acc
}

/// Integer dot of one row with `sdot`.
///
/// # Safety
/// The CPU must support the `dotprod` extension.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_int8_row_dp<const F: u8>(row: &[u8], xq: &QActs) -> f32 {
    let mut sumv = vdupq_n_f32(0.0);
    let mut extra = 0f32;
    for (b, blk) in row.chunks_exact(block_bytes(F)).enumerate() {
        let (w0, w1) = weights_i8::<F>(blk);
        let (x0, x1) = acts_i8(&xq.qs[b * 32..]);
        // SAFETY: dotprod present per this function's contract.
        let s = unsafe { sdot(sdot(vdupq_n_s32(0), w0, x0), w1, x1) };
        sumv = vfmaq_n_f32(sumv, vcvtq_f32_s32(s), f16_at(blk, 0) * xq.d[b]);
        if F == Q4_1 {
            extra += f16_at(blk, 2) * xq.s[b];
        }
    }
    vaddvq_f32(sumv) + extra
}

#[target_feature(enable = "neon")]
fn rows_int8<const F: u8>(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    y: &mut [f32],
    dotprod: bool,
) {
    for (i, yv) in y.iter_mut().enumerate() {
        sel.prefetch(w, i + 2, 1);
        let row = w.row_data(sel.get(i));
        *yv = if dotprod {
            // SAFETY: `dotprod` is only true for KernelPath::NeonDotprod,
            // which is only used after is_aarch64_feature_detected!("dotprod").
            unsafe { dot_int8_row_dp::<F>(row, xq) }
        } else {
            dot_int8_row::<F>(row, xq)
        };
    }
}

#[target_feature(enable = "neon")]
pub(crate) fn matvec_int8(
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    y: &mut [f32],
    dotprod: bool,
) {
    match w.format() {
        WeightFormat::Q8_0 => rows_int8::<Q8_0>(w, sel, xq, y, dotprod),
        WeightFormat::Q4_0 => rows_int8::<Q4_0>(w, sel, xq, y, dotprod),
        WeightFormat::Q4_1 => rows_int8::<Q4_1>(w, sel, xq, y, dotprod),
        WeightFormat::Q4_K | WeightFormat::Q6_K => {
            let f = w.format();
            for (i, yv) in y.iter_mut().enumerate() {
                *yv = dot_k_int(f, w.row_data(sel.get(i)), &xq.d, &xq.s, |e| {
                    load_i8x8_wide(&xq.qs[e..])
                });
            }
        }
        _ => crate::scalar::matvec_int8(w, sel, xq, y),
    }
}

#[inline]
#[target_feature(enable = "neon")]
fn load_i16x8(q: &[i16]) -> int16x8_t {
    let q = &q[..8];
    // SAFETY: `q` has exactly 8 readable i16 (bounds-checked above).
    unsafe { vld1q_s16(q.as_ptr()) }
}

/// Integer dot of two rows with the 16-bit activations: weights widened to
/// i16 (`vmovl_s8`), `vmull_s16`/`vmlal_high_s16` into i32 lanes (|q_w| <=
/// 128, |q_x| <= 32767: each lane sums 8 products, below 2^26), then one
/// convert and one FMA with `d_w * d_x` per block. `r1` may equal `r0`.
#[target_feature(enable = "neon")]
fn dot_i16_rows2<const F: u8>(r0: &[u8], r1: &[u8], xq: &QActs16) -> (f32, f32) {
    let bb = block_bytes(F);
    let mut sumv = [vdupq_n_f32(0.0); 2];
    let mut extra = [0f32; 2];
    for (b, (b0, b1)) in r0.chunks_exact(bb).zip(r1.chunks_exact(bb)).enumerate() {
        let qx = &xq.qs[b * 32..b * 32 + 32];
        let x = [
            load_i16x8(&qx[0..]),
            load_i16x8(&qx[8..]),
            load_i16x8(&qx[16..]),
            load_i16x8(&qx[24..]),
        ];
        let (dx, sx) = (xq.d[b], xq.s[b]);
        for (k, blk) in [b0, b1].into_iter().enumerate() {
            let (w0, w1) = weights_i8::<F>(blk);
            let w = [
                vmovl_s8(vget_low_s8(w0)),
                vmovl_high_s8(w0),
                vmovl_s8(vget_low_s8(w1)),
                vmovl_high_s8(w1),
            ];
            let mut s = vmull_s16(vget_low_s16(w[0]), vget_low_s16(x[0]));
            let mut t = vmull_s16(vget_low_s16(w[1]), vget_low_s16(x[1]));
            s = vmlal_high_s16(s, w[0], x[0]);
            t = vmlal_high_s16(t, w[1], x[1]);
            s = vmlal_s16(s, vget_low_s16(w[2]), vget_low_s16(x[2]));
            t = vmlal_s16(t, vget_low_s16(w[3]), vget_low_s16(x[3]));
            s = vmlal_high_s16(s, w[2], x[2]);
            t = vmlal_high_s16(t, w[3], x[3]);
            let isum = vaddq_s32(s, t);
            sumv[k] = vfmaq_n_f32(sumv[k], vcvtq_f32_s32(isum), f16_at(blk, 0) * dx);
            if F == Q4_1 {
                extra[k] += f16_at(blk, 2) * sx;
            }
        }
    }
    (
        vaddvq_f32(sumv[0]) + extra[0],
        vaddvq_f32(sumv[1]) + extra[1],
    )
}

#[target_feature(enable = "neon")]
fn rows_i16<const F: u8>(w: &QMatrix<'_>, sel: Rows<'_>, xq: &QActs16, y: &mut [f32]) {
    let mut i = 0;
    while i + 2 <= y.len() {
        sel.prefetch(w, i + 2, 2);
        let (a, b) = dot_i16_rows2::<F>(w.row_data(sel.get(i)), w.row_data(sel.get(i + 1)), xq);
        y[i] = a;
        y[i + 1] = b;
        i += 2;
    }
    if i < y.len() {
        let r = w.row_data(sel.get(i));
        y[i] = dot_i16_rows2::<F>(r, r, xq).0;
    }
}

/// Quantized weights × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)).
#[target_feature(enable = "neon")]
pub(crate) fn matvec_i16(w: &QMatrix<'_>, sel: Rows<'_>, xq: &QActs16, y: &mut [f32]) {
    match w.format() {
        WeightFormat::Q8_0 => rows_i16::<Q8_0>(w, sel, xq, y),
        WeightFormat::Q4_0 => rows_i16::<Q4_0>(w, sel, xq, y),
        WeightFormat::Q4_1 => rows_i16::<Q4_1>(w, sel, xq, y),
        WeightFormat::Q4_K | WeightFormat::Q6_K => {
            let f = w.format();
            for (i, yv) in y.iter_mut().enumerate() {
                *yv = dot_k_int(f, w.row_data(sel.get(i)), &xq.d, &xq.s, |e| {
                    load_i16x8(&xq.qs[e..])
                });
            }
        }
        _ => crate::scalar::matvec_i16(w, sel, xq, y),
    }
}

/// Register-blocked microkernel: `R` rows × `T` tokens of f32x4 accumulators.
#[inline]
#[target_feature(enable = "neon")]
fn micro<const R: usize, const T: usize>(
    w: &[f32],
    x: &[f32],
    cols: usize,
    i0: usize,
    t0: usize,
    nr: usize,
    out: &mut [f32],
) {
    let wr: [&[f32]; R] = std::array::from_fn(|r| &w[(i0 + r) * cols..(i0 + r + 1) * cols]);
    let xt: [&[f32]; T] = std::array::from_fn(|t| &x[(t0 + t) * cols..(t0 + t + 1) * cols]);
    let mut acc = [[vdupq_n_f32(0.0); T]; R];
    let k4 = cols / 4 * 4;
    let mut k = 0;
    while k < k4 {
        let mut xv = [vdupq_n_f32(0.0); T];
        for (v, s) in xv.iter_mut().zip(&xt) {
            // SAFETY: k + 4 <= cols == s.len().
            *v = unsafe { vld1q_f32(s.as_ptr().add(k)) };
        }
        for (ar, s) in acc.iter_mut().zip(&wr) {
            // SAFETY: k + 4 <= cols == s.len().
            let wv = unsafe { vld1q_f32(s.as_ptr().add(k)) };
            for (a, v) in ar.iter_mut().zip(&xv) {
                *a = vfmaq_f32(*a, wv, *v);
            }
        }
        k += 4;
    }
    for (r, ar) in acc.iter().enumerate() {
        for (t, a) in ar.iter().enumerate() {
            let mut s = vaddvq_f32(*a);
            for kk in k4..cols {
                s += wr[r][kk] * xt[t][kk];
            }
            out[(t0 + t) * nr + i0 + r] = s;
        }
    }
}

/// `out[t*nr + i] = dot(w[i], x[t])` for an f32 tile `w` (nr × cols).
#[target_feature(enable = "neon")]
pub(crate) fn tile(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, out: &mut [f32]) {
    let mut t0 = 0;
    while t0 < n {
        let tt = 4.min(n - t0);
        let mut i0 = 0;
        while i0 < nr {
            let rr = 4.min(nr - i0);
            match (rr, tt) {
                (4, 4) => micro::<4, 4>(w, x, cols, i0, t0, nr, out),
                (4, 3) => micro::<4, 3>(w, x, cols, i0, t0, nr, out),
                (4, 2) => micro::<4, 2>(w, x, cols, i0, t0, nr, out),
                (4, _) => micro::<4, 1>(w, x, cols, i0, t0, nr, out),
                (3, 4) => micro::<3, 4>(w, x, cols, i0, t0, nr, out),
                (3, 3) => micro::<3, 3>(w, x, cols, i0, t0, nr, out),
                (3, 2) => micro::<3, 2>(w, x, cols, i0, t0, nr, out),
                (3, _) => micro::<3, 1>(w, x, cols, i0, t0, nr, out),
                (2, 4) => micro::<2, 4>(w, x, cols, i0, t0, nr, out),
                (2, 3) => micro::<2, 3>(w, x, cols, i0, t0, nr, out),
                (2, 2) => micro::<2, 2>(w, x, cols, i0, t0, nr, out),
                (2, _) => micro::<2, 1>(w, x, cols, i0, t0, nr, out),
                (_, 4) => micro::<1, 4>(w, x, cols, i0, t0, nr, out),
                (_, 3) => micro::<1, 3>(w, x, cols, i0, t0, nr, out),
                (_, 2) => micro::<1, 2>(w, x, cols, i0, t0, nr, out),
                (_, _) => micro::<1, 1>(w, x, cols, i0, t0, nr, out),
            }
            i0 += rr;
        }
        t0 += tt;
    }
}

#[target_feature(enable = "neon")]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let n16 = n / 16 * 16;
    let mut acc = [vdupq_n_f32(0.0); 4];
    for (ca, cb) in a[..n16].chunks_exact(16).zip(b[..n16].chunks_exact(16)) {
        for i in 0..4 {
            acc[i] = vfmaq_f32(acc[i], load_f32x4(&ca[4 * i..]), load_f32x4(&cb[4 * i..]));
        }
    }
    let mut s = vaddvq_f32(vaddq_f32(
        vaddq_f32(acc[0], acc[1]),
        vaddq_f32(acc[2], acc[3]),
    ));
    for k in n16..n {
        s += a[k] * b[k];
    }
    s
}

#[target_feature(enable = "neon")]
pub(crate) fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let n4 = n / 4 * 4;
    for (cx, cy) in x[..n4].chunks_exact(4).zip(y[..n4].chunks_exact_mut(4)) {
        let v = vfmaq_n_f32(load_f32x4(cy), load_f32x4(cx), alpha);
        // SAFETY: `cy` is exactly 4 writable f32.
        unsafe { vst1q_f32(cy.as_mut_ptr(), v) };
    }
    for k in n4..n {
        y[k] += alpha * x[k];
    }
}

/// 8 i8 activation quants widened to i16x8.
#[inline]
#[target_feature(enable = "neon")]
fn load_i8x8_wide(q: &[i8]) -> int16x8_t {
    let q = &q[..8];
    // SAFETY: `q` has exactly 8 readable i8 (bounds-checked above).
    vmovl_s8(unsafe { vld1_s8(q.as_ptr()) })
}

/// Sum of 16 products of i8 weights `w` (widened to i16) with 16 i16
/// activations `x`, in 4 i32 lanes (`smull`/`smlal`).
#[inline]
#[target_feature(enable = "neon")]
fn dot16(w: int8x16_t, x: [int16x8_t; 2]) -> int32x4_t {
    let w0 = vmovl_s8(vget_low_s8(w));
    let w1 = vmovl_high_s8(w);
    let s = vmull_s16(vget_low_s16(w0), vget_low_s16(x[0]));
    let s = vmlal_high_s16(s, w0, x[0]);
    let s = vmlal_s16(s, vget_low_s16(w1), vget_low_s16(x[1]));
    vmlal_high_s16(s, w1, x[1])
}

/// Integer dot of a K-quant row (`Q4_K` or `Q6_K`) with quantized
/// activations: `xs(e)` returns the 8 activation quants at element `e`
/// widened to i16 (8- or 16-bit activations), `d`/`s` are the per-32
/// scales and `d*sum(q)`. Per sub-block an i32 sum (`smull`/`smlal`,
/// |q_w| <= 63, |q_x| <= 32767: each lane sums at most 8 products, below
/// 2^24), one convert and one FMA with `(d*sc) * d_x`; the Q4_K min term
/// `(dmin*m) * s_x` is accumulated separately (see the crate docs).
#[target_feature(enable = "neon")]
fn dot_k_int(
    format: WeightFormat,
    row: &[u8],
    d: &[f32],
    s: &[f32],
    xs: impl Fn(usize) -> int16x8_t,
) -> f32 {
    let x16 = |e: usize| [xs(e), xs(e + 8)];
    let mut acc = vdupq_n_f32(0.0);
    let mut extra = 0f32;
    let m4 = vdupq_n_u8(0x0F);
    for (sb, blk) in row
        .chunks_exact(format.block_bytes())
        .enumerate()
        .take(d.len() / 8)
    {
        if format == WeightFormat::Q4_K {
            let (dl, ml) = crate::scalar::q4k_scales(blk);
            for g in 0..4 {
                let raw = [
                    load_u8x16(&blk[16 + 32 * g..]),
                    load_u8x16(&blk[32 + 32 * g..]),
                ];
                for h in 0..2 {
                    let j = 2 * g + h;
                    let b = sb * 8 + j;
                    let q = |r: uint8x16_t| {
                        vreinterpretq_s8_u8(if h == 0 {
                            vandq_u8(r, m4)
                        } else {
                            vshrq_n_u8::<4>(r)
                        })
                    };
                    let isum = vaddq_s32(
                        dot16(q(raw[0]), x16(32 * b)),
                        dot16(q(raw[1]), x16(32 * b + 16)),
                    );
                    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), dl[j] * d[b]);
                    extra -= ml[j] * s[b];
                }
            }
        } else {
            let ds = crate::scalar::q6k_scales(blk);
            for n in 0..2 {
                for p in 0..2 {
                    for k in 0..4 {
                        let q = q6k_quants16(blk, n, k, p);
                        let b = sb * 8 + 4 * n + k;
                        let isum = dot16(q, x16(32 * b + 16 * p));
                        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(isum), ds[8 * n + 2 * k + p] * d[b]);
                    }
                }
            }
        }
    }
    vaddvq_f32(acc) + extra
}
