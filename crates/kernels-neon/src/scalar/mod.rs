//! Plain scalar reference kernels.
//!
//! Every SIMD path is tested against these functions, and they are the
//! fallback on machines without a supported SIMD extension (or when
//! `SPARROW_KERNELS=scalar` is set). Callers (the dispatch in `lib.rs`) have
//! already validated all lengths; the functions here only rely on that for
//! correctness, never for memory safety (everything is bounds-checked Rust).

use half::{bf16, f16};

use crate::arch::Rows;
use crate::quant::{QActs, QActs16};
use crate::{KernelError, QMatrix, WeightFormat, HYBRID_HEADER};

mod unpack;

pub(crate) use unpack::*;

/// Reads a little-endian IEEE half at byte offset `i`.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Reads a little-endian f32 at byte offset `i`.
#[inline(always)]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The parts of one [`WeightFormat::I4Hybrid`] row (layout in the crate
/// docs): INT4 scale, outlier scale, nibbles, u16 column indices, i8 values.
pub(crate) struct Hybrid<'a> {
    /// Scale of the INT4 part.
    pub s: f32,
    /// Scale of the INT8 outliers.
    pub so: f32,
    /// `cols / 2` nibble bytes (Q4_0 order within each group of 32, `q + 8`).
    pub nib: &'a [u8],
    idx: &'a [u8],
    val: &'a [u8],
}

impl<'a> Hybrid<'a> {
    /// Splits `row` (at least `row_bytes(cols)` bytes) of a row with `k` outliers.
    #[inline(always)]
    pub(crate) fn parse(k: usize, cols: usize, row: &'a [u8]) -> Self {
        let n = HYBRID_HEADER + cols / 2;
        Hybrid {
            s: f32_at(row, 0),
            so: f32_at(row, 4),
            nib: &row[HYBRID_HEADER..n],
            idx: &row[n..n + 2 * k],
            val: &row[n + 2 * k..n + 3 * k],
        }
    }

    /// `(column, integer value)` of every outlier, in storage order.
    #[inline(always)]
    pub(crate) fn outliers(&self) -> impl Iterator<Item = (usize, f32)> + 'a {
        self.idx.chunks_exact(2).zip(self.val).map(|(c, &v)| {
            (
                usize::from(u16::from_le_bytes([c[0], c[1]])),
                f32::from(v as i8),
            )
        })
    }

    /// `so * Σ o_j x[c_j]` (columns must be in range: checked when the row
    /// entered the API).
    #[inline(always)]
    pub(crate) fn outlier_dot(&self, x: &[f32]) -> f32 {
        let mut acc = 0f32;
        for (c, v) in self.outliers() {
            acc += v * x[c];
        }
        self.so * acc
    }

    /// `ys[c_j - c0] += (c * so) * o_j` for every outlier whose column is
    /// in `c0 .. c0 + ys.len()`, in storage order (the outlier part of
    /// every path's `axpy`, so all of them add the same values).
    #[inline(always)]
    pub(crate) fn outlier_axpy(&self, c: f32, c0: usize, ys: &mut [f32]) {
        let co = c * self.so;
        for (col, v) in self.outliers() {
            if let Some(y) = col.checked_sub(c0).and_then(|i| ys.get_mut(i)) {
                *y += co * v;
            }
        }
    }
}

pub(crate) use tensor_types::hybrid::outliers_per_row as hybrid_k;

/// For [`WeightFormat::I4Hybrid`]: checks that every outlier column of
/// `row` (exactly `row_bytes(cols)` bytes) is `< cols`. Other formats: `Ok`.
pub(crate) fn hybrid_check(
    format: WeightFormat,
    cols: usize,
    row: &[u8],
) -> Result<(), KernelError> {
    Ok(tensor_types::hybrid::check_row(format, cols, row)?)
}

/// Dequantizes an I4Hybrid row: `s * (q - 8)` per nibble, then `so * o`
/// added at each outlier column.
fn dequant_hybrid(k: usize, src: &[u8], dst: &mut [f32]) {
    let h = Hybrid::parse(k, dst.len(), src);
    for (g, out) in h.nib.chunks_exact(16).zip(dst.chunks_exact_mut(32)) {
        let (lo, hi) = out.split_at_mut(16);
        for j in 0..16 {
            lo[j] = h.s * (f32::from(g[j] & 0xF) - 8.0);
            hi[j] = h.s * (f32::from(g[j] >> 4) - 8.0);
        }
    }
    for (c, v) in h.outliers() {
        dst[c] += h.so * v;
    }
}

/// Exact dot of an I4Hybrid row with f32 `x`: `s * Σ (q_i - 8) x_i` (8
/// f32 lanes) plus `so * Σ o_j x[c_j]`.
fn dot_hybrid(k: usize, row: &[u8], x: &[f32]) -> f32 {
    let h = Hybrid::parse(k, x.len(), row);
    let mut acc = [0f32; 8];
    for (g, xs) in h.nib.chunks_exact(16).zip(x.chunks_exact(32)) {
        for j in 0..16 {
            acc[j & 7] += (f32::from(g[j] & 0xF) - 8.0) * xs[j];
            acc[j & 7] += (f32::from(g[j] >> 4) - 8.0) * xs[j + 16];
        }
    }
    h.s * acc.iter().sum::<f32>() + h.outlier_dot(x)
}

/// `ys += c * W[c0 .. c0 + ys.len()]` for an I4Hybrid row of `cols`
/// elements (`c0` and `ys.len()` multiples of 32, or `ys` reaching `cols`).
pub(crate) fn axpy_hybrid(k: usize, c: f32, row: &[u8], cols: usize, c0: usize, ys: &mut [f32]) {
    let h = Hybrid::parse(k, cols, row);
    let cs = c * h.s;
    let nib = &h.nib[c0 / 2..(c0 + ys.len()) / 2];
    for (g, out) in nib.chunks_exact(16).zip(ys.chunks_exact_mut(32)) {
        let (lo, hi) = out.split_at_mut(16);
        for j in 0..16 {
            lo[j] += cs * (f32::from(g[j] & 0xF) - 8.0);
            hi[j] += cs * (f32::from(g[j] >> 4) - 8.0);
        }
    }
    h.outlier_axpy(c, c0, ys);
}

/// Dequantizes `dst.len()` elements from `src` (exactly `format.row_bytes(dst.len())` bytes).
pub(crate) fn dequant_row(format: WeightFormat, src: &[u8], dst: &mut [f32]) {
    match format {
        WeightFormat::I4Hybrid { outliers_per_row } => {
            dequant_hybrid(usize::from(outliers_per_row), src, dst)
        }
        WeightFormat::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightFormat::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightFormat::Q8_0 => {
            for (blk, out) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                for (o, &q) in out.iter_mut().zip(&blk[2..34]) {
                    *o = d * f32::from(q as i8);
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (blk, out) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                let (lo, hi) = out.split_at_mut(16);
                for j in 0..16 {
                    let q = blk[2 + j];
                    lo[j] = d * ((q & 0xF) as i32 - 8) as f32;
                    hi[j] = d * ((q >> 4) as i32 - 8) as f32;
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (blk, out) in src.chunks_exact(20).zip(dst.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                let (lo, hi) = out.split_at_mut(16);
                for j in 0..16 {
                    let q = blk[4 + j];
                    lo[j] = d * f32::from(q & 0xF) + m;
                    hi[j] = d * f32::from(q >> 4) + m;
                }
            }
        }
        WeightFormat::Q5_0 => {
            for (blk, out) in src.chunks_exact(22).zip(dst.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                for (o, q) in out.iter_mut().zip(q5_quants(blk, 2)) {
                    *o = d * (i32::from(q) - 16) as f32;
                }
            }
        }
        WeightFormat::Q5_1 => {
            for (blk, out) in src.chunks_exact(24).zip(dst.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                for (o, q) in out.iter_mut().zip(q5_quants(blk, 4)) {
                    *o = d * f32::from(q) + m;
                }
            }
        }
        WeightFormat::IQ4_NL => {
            for (blk, out) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
                let d = f16_at(blk, 0);
                for (o, q) in out.iter_mut().zip(iq4_quants(&blk[2..18])) {
                    *o = d * f32::from(q);
                }
            }
        }
        WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::IQ4_XS
        | WeightFormat::Q6_K => dequant_super_row(format, src, dst),
    }
}

/// [`dequant_row`] of the formats with 256-element super-blocks.
fn dequant_super_row(format: WeightFormat, src: &[u8], dst: &mut [f32]) {
    match format {
        WeightFormat::Q2_K => {
            for (blk, out) in src.chunks_exact(84).zip(dst.chunks_exact_mut(256)) {
                let (dl, ml) = q2k_scales(blk);
                for (s, o) in out.chunks_exact_mut(16).enumerate() {
                    for (i, v) in o.iter_mut().enumerate() {
                        *v = dl[s] * f32::from(q2k_quant(blk, 16 * s + i)) - ml[s];
                    }
                }
            }
        }
        WeightFormat::Q3_K => {
            for (blk, out) in src.chunks_exact(110).zip(dst.chunks_exact_mut(256)) {
                let ds = q3k_scales(blk);
                for (s, o) in out.chunks_exact_mut(16).enumerate() {
                    for (i, v) in o.iter_mut().enumerate() {
                        *v = ds[s] * f32::from(q3k_quant(blk, 16 * s + i));
                    }
                }
            }
        }
        WeightFormat::Q4_K => {
            for (blk, out) in src.chunks_exact(144).zip(dst.chunks_exact_mut(256)) {
                let (dl, ml) = q4k_scales(blk);
                for (s, o) in out.chunks_exact_mut(32).enumerate() {
                    for (i, v) in o.iter_mut().enumerate() {
                        *v = dl[s] * f32::from(q4k_quant(blk, 32 * s + i)) - ml[s];
                    }
                }
            }
        }
        WeightFormat::Q5_K => {
            for (blk, out) in src.chunks_exact(176).zip(dst.chunks_exact_mut(256)) {
                let (dl, ml) = q4k_scales(blk);
                for (s, o) in out.chunks_exact_mut(32).enumerate() {
                    for (i, v) in o.iter_mut().enumerate() {
                        *v = dl[s] * f32::from(q5k_quant(blk, 32 * s + i)) - ml[s];
                    }
                }
            }
        }
        WeightFormat::IQ4_XS => {
            for (blk, out) in src.chunks_exact(136).zip(dst.chunks_exact_mut(256)) {
                let dl = iq4xs_scales(blk);
                for (s, o) in out.chunks_exact_mut(32).enumerate() {
                    let q = iq4_quants(&blk[8 + 16 * s..24 + 16 * s]);
                    for (v, q) in o.iter_mut().zip(q) {
                        *v = dl[s] * f32::from(q);
                    }
                }
            }
        }
        WeightFormat::Q6_K => {
            for (blk, out) in src.chunks_exact(210).zip(dst.chunks_exact_mut(256)) {
                let ds = q6k_scales(blk);
                for (s, o) in out.chunks_exact_mut(16).enumerate() {
                    for (i, v) in o.iter_mut().enumerate() {
                        *v = ds[s] * f32::from(q6k_quant(blk, 16 * s + i));
                    }
                }
            }
        }
        other => unreachable!("{other:?} has no 256-element super-blocks"),
    }
}

/// Q5_0 / Q5_1: the 32 unsigned 5-bit quants (0..=31) of one block, in element order.
/// `qh` is the little-endian u32 of fifth bits at byte `off` (2 for Q5_0, 4 for Q5_1),
/// followed by the 16 nibble bytes `qs`; element `j < 16` takes the low nibble of
/// `qs[j]` and bit `j` of `qh`, element `j + 16` the high nibble and bit `j + 16`
/// (llama.cpp `dequantize_row_q5_0`).
#[inline(always)]
pub(crate) fn q5_quants(blk: &[u8], off: usize) -> [u8; 32] {
    let qh = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
    let qs = &blk[off + 4..off + 20];
    let mut q = [0u8; 32];
    let (lo, hi) = q.split_at_mut(16);
    for j in 0..16 {
        lo[j] = (qs[j] & 0xF) | (((qh >> j) & 1) as u8) << 4;
        hi[j] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
    }
    q
}

/// Offset of the `qh` bytes in a Q5 block (after `d`, and `m` for Q5_1).
#[inline(always)]
pub(crate) fn q5_qh_offset(format: WeightFormat) -> usize {
    if format == WeightFormat::Q5_1 {
        4
    } else {
        2
    }
}

/// Exact dot product of one weight row with f32 activations: each group of
/// 32 weights (K-quants: 256) is dequantized to f32, products are accumulated in 8 f32 lanes.
pub(crate) fn dot_exact(format: WeightFormat, row: &[u8], x: &[f32]) -> f32 {
    if let WeightFormat::I4Hybrid { outliers_per_row } = format {
        return dot_hybrid(usize::from(outliers_per_row), row, x);
    }
    // K-quants: one super-block (256 elements) per group.
    let group = format.block_len().max(32);
    let per_group = group / format.block_len() * format.block_bytes();
    let mut buf = [0f32; 256];
    let mut acc = [0f32; 8];
    for (g, xs) in row.chunks(per_group).zip(x.chunks(group)) {
        let n = xs.len();
        dequant_row(format, g, &mut buf[..n]);
        for (j, (w, v)) in buf[..n].iter().zip(xs).enumerate() {
            acc[j & 7] += w * v;
        }
    }
    acc.iter().sum()
}

/// Integer dot product of one quantized weight row with 8-bit activations.
/// Only called for quantized formats.
pub(crate) fn dot_int8(format: WeightFormat, row: &[u8], xq: &QActs) -> f32 {
    let mut acc = 0f32;
    match format {
        WeightFormat::Q8_0 => {
            for (b, blk) in row.chunks_exact(34).enumerate() {
                let qx = &xq.qs[b * 32..b * 32 + 32];
                let isum: i32 = blk[2..34]
                    .iter()
                    .zip(qx)
                    .map(|(&w, &x)| i32::from(w as i8) * i32::from(x))
                    .sum();
                acc += f16_at(blk, 0) * xq.d[b] * isum as f32;
            }
        }
        WeightFormat::Q4_0 => {
            for (b, blk) in row.chunks_exact(18).enumerate() {
                let qx = &xq.qs[b * 32..b * 32 + 32];
                let mut isum = 0i32;
                for j in 0..16 {
                    let q = blk[2 + j];
                    isum += ((q & 0xF) as i32 - 8) * i32::from(qx[j]);
                    isum += ((q >> 4) as i32 - 8) * i32::from(qx[j + 16]);
                }
                acc += f16_at(blk, 0) * xq.d[b] * isum as f32;
            }
        }
        WeightFormat::Q4_1 => {
            for (b, blk) in row.chunks_exact(20).enumerate() {
                let qx = &xq.qs[b * 32..b * 32 + 32];
                let mut isum = 0i32;
                for j in 0..16 {
                    let q = blk[4 + j];
                    isum += i32::from(q & 0xF) * i32::from(qx[j]);
                    isum += i32::from(q >> 4) * i32::from(qx[j + 16]);
                }
                acc += f16_at(blk, 0) * xq.d[b] * isum as f32 + f16_at(blk, 2) * xq.s[b];
            }
        }
        WeightFormat::Q5_0 | WeightFormat::Q5_1 => {
            acc = dot_q5(format, row, &xq.qs, &xq.d, &xq.s);
        }
        WeightFormat::IQ4_NL => acc = dot_iq4nl(row, &xq.qs, &xq.d),
        WeightFormat::Q2_K
        | WeightFormat::Q3_K
        | WeightFormat::Q4_K
        | WeightFormat::Q5_K
        | WeightFormat::Q6_K
        | WeightFormat::IQ4_XS => {
            acc = dot_k(format, row, &xq.qs, &xq.d, &xq.s);
        }
        // Float and hybrid formats never take the integer path (see `matvec`).
        WeightFormat::F32
        | WeightFormat::F16
        | WeightFormat::BF16
        | WeightFormat::I4Hybrid { .. } => {}
    }
    acc
}

/// Integer dot of a Q5_0 / Q5_1 row with quantized activations (8- or 16-bit
/// quants `qs`, per-32 scales `d`, per-32 `s = d * sum(q)`): per block the exact
/// i32 sum of `q_w * q_x` (Q5_0: `q_w - 16`; |sum| <= 32·31·32767 < 2^25) scaled
/// by `d_w * d_x` in f32, plus `m * s` for Q5_1.
pub(crate) fn dot_q5<T: Copy + Into<i32>>(
    format: WeightFormat,
    row: &[u8],
    qs: &[T],
    d: &[f32],
    s: &[f32],
) -> f32 {
    let off = q5_qh_offset(format);
    let bias = if format == WeightFormat::Q5_0 { 16 } else { 0 };
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(format.block_bytes()).enumerate() {
        let qx = &qs[b * 32..b * 32 + 32];
        let mut isum = 0i32;
        for (&q, &x) in q5_quants(blk, off).iter().zip(qx) {
            isum += (i32::from(q) - bias) * x.into();
        }
        acc += f16_at(blk, 0) * d[b] * isum as f32;
        if format == WeightFormat::Q5_1 {
            acc += f16_at(blk, 2) * s[b];
        }
    }
    acc
}

/// Integer dot of an IQ4_NL row with quantized activations (8- or 16-bit
/// quants `qs`, per-32 scales `d`): per block the exact i32 sum of
/// `IQ4NL_VALUES[q_w] * q_x` (|sum| <= 32·127·32767 < 2^27) scaled by `d_w * d_x`.
pub(crate) fn dot_iq4nl<T: Copy + Into<i32>>(row: &[u8], qs: &[T], d: &[f32]) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(18).enumerate() {
        let qx = &qs[b * 32..b * 32 + 32];
        let mut isum = 0i32;
        for (&q, &x) in iq4_quants(&blk[2..18]).iter().zip(qx) {
            isum += i32::from(q) * x.into();
        }
        acc += f16_at(blk, 0) * d[b] * isum as f32;
    }
    acc
}

/// Integer dot of a K-quant row with quantized activations (8- or 16-bit
/// quants `qs`, per-32 scales `d`, per-32 `s = d * sum(q)`).
///
/// Q4_K, Q5_K: per sub-block of 32 (= activation block `b`) the exact i32 sum of
/// `q_w * q_x`, scaled by `(d*sc) * d_x`, minus `(dmin*m) * s_x` (the min
/// term). Q6_K: per sub-block of 16 (half an activation block) the i32 sum
/// of `(q_w - 32) * q_x` scaled by `(d*sc) * d_x` (|sum| <= 16·32·32767 < 2^24).
/// IQ4_XS: per sub-block of 32 the i32 sum of `IQ4NL_VALUES[q_w] * q_x`
/// scaled by `d * (ls - 32) * d_x`. Q2_K: per sub-block of 16 the i32 sums
/// of `q_w * q_x` and of `q_x`, scaled by `(d*sc) * d_x` and `(dmin*m) * d_x`
/// (the min term needs the activations' sum over 16, not 32). Q3_K: per
/// sub-block of 16 the i32 sum of `q_w * q_x` (q_w in -4..=3) scaled by
/// `d * (ls - 32) * d_x`.
pub(crate) fn dot_k<T: Copy + Into<i32>>(
    format: WeightFormat,
    row: &[u8],
    qs: &[T],
    d: &[f32],
    s: &[f32],
) -> f32 {
    let mut acc = 0f32;
    match format {
        WeightFormat::Q4_K | WeightFormat::Q5_K => {
            let quant = if format == WeightFormat::Q4_K {
                q4k_quant
            } else {
                q5k_quant
            };
            for (sb, blk) in row.chunks_exact(format.block_bytes()).enumerate() {
                let (dl, ml) = q4k_scales(blk);
                for j in 0..8 {
                    let b = sb * 8 + j;
                    let qx = &qs[b * 32..b * 32 + 32];
                    let mut isum = 0i32;
                    for (i, &x) in qx.iter().enumerate() {
                        isum += i32::from(quant(blk, 32 * j + i)) * x.into();
                    }
                    acc += dl[j] * d[b] * isum as f32 - ml[j] * s[b];
                }
            }
        }
        WeightFormat::Q6_K => {
            for (sb, blk) in row.chunks_exact(210).enumerate() {
                let ds = q6k_scales(blk);
                for (j, &dsj) in ds.iter().enumerate() {
                    let b = sb * 8 + j / 2;
                    let e0 = 16 * (j % 2);
                    let qx = &qs[b * 32 + e0..b * 32 + e0 + 16];
                    let mut isum = 0i32;
                    for (i, &x) in qx.iter().enumerate() {
                        isum += i32::from(q6k_quant(blk, 16 * j + i)) * x.into();
                    }
                    acc += dsj * d[b] * isum as f32;
                }
            }
        }
        WeightFormat::Q2_K | WeightFormat::Q3_K => {
            for (sb, blk) in row.chunks_exact(format.block_bytes()).enumerate() {
                let (dl, ml) = if format == WeightFormat::Q2_K {
                    q2k_scales(blk)
                } else {
                    (q3k_scales(blk), [0f32; 16])
                };
                for j in 0..16 {
                    let b = sb * 8 + j / 2;
                    let e0 = b * 32 + 16 * (j % 2);
                    let (mut isum, mut xsum) = (0i32, 0i32);
                    for (i, &x) in qs[e0..e0 + 16].iter().enumerate() {
                        let q = if format == WeightFormat::Q2_K {
                            i32::from(q2k_quant(blk, 16 * j + i))
                        } else {
                            i32::from(q3k_quant(blk, 16 * j + i))
                        };
                        isum += q * x.into();
                        xsum += x.into();
                    }
                    acc += dl[j] * d[b] * isum as f32;
                    if format == WeightFormat::Q2_K {
                        acc -= ml[j] * d[b] * xsum as f32;
                    }
                }
            }
        }
        WeightFormat::IQ4_XS => {
            for (sb, blk) in row.chunks_exact(136).enumerate() {
                let dl = iq4xs_scales(blk);
                for (j, &dlj) in dl.iter().enumerate() {
                    let b = sb * 8 + j;
                    let qx = &qs[b * 32..b * 32 + 32];
                    let mut isum = 0i32;
                    for (&q, &x) in iq4_quants(&blk[8 + 16 * j..24 + 16 * j]).iter().zip(qx) {
                        isum += i32::from(q) * x.into();
                    }
                    acc += dlj * d[b] * isum as f32;
                }
            }
        }
        _ => {}
    }
    acc
}

/// `y[i] = dot(W[sel.get(i)], x)`, exact.
pub(crate) fn matvec_exact(w: &QMatrix<'_>, sel: Rows<'_>, x: &[f32], y: &mut [f32]) {
    for (i, yv) in y.iter_mut().enumerate() {
        *yv = dot_exact(w.format(), w.row_data(sel.get(i)), x);
    }
}

/// `y[i] = dot(W[sel.get(i)], xq)`, 8-bit activation integer path.
pub(crate) fn matvec_int8(w: &QMatrix<'_>, sel: Rows<'_>, xq: &QActs, y: &mut [f32]) {
    for (i, yv) in y.iter_mut().enumerate() {
        *yv = dot_int8(w.format(), w.row_data(sel.get(i)), xq);
    }
}

/// Integer dot product of one quantized weight row with 16-bit activations:
/// per block an exact i32 sum of `q_w * q_x` (|q_w| <= 128, |q_x| <= 32767,
/// 32 terms: below 2^28), scaled by `d_w * d_x` in f32, plus `m * s` for Q4_1
/// (and Q5_1, see [`dot_q5`]).
/// Only called for quantized formats.
pub(crate) fn dot_i16(format: WeightFormat, row: &[u8], xq: &QActs16) -> f32 {
    if format.is_k_quant() {
        return dot_k(format, row, &xq.qs, &xq.d, &xq.s);
    }
    if matches!(format, WeightFormat::Q5_0 | WeightFormat::Q5_1) {
        return dot_q5(format, row, &xq.qs, &xq.d, &xq.s);
    }
    if format == WeightFormat::IQ4_NL {
        return dot_iq4nl(row, &xq.qs, &xq.d);
    }
    if format.is_hybrid() {
        // Never called: hybrid rows use f32 activations (see `matvec`).
        return 0.0;
    }
    let bb = format.block_bytes();
    let mut acc = 0f32;
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let qx = &xq.qs[b * 32..b * 32 + 32];
        let mut isum = 0i32;
        match format {
            WeightFormat::Q8_0 => {
                for (&w, &x) in blk[2..34].iter().zip(qx) {
                    isum += i32::from(w as i8) * i32::from(x);
                }
            }
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                let (qoff, off) = if format == WeightFormat::Q4_0 {
                    (2, 8)
                } else {
                    (4, 0)
                };
                for j in 0..16 {
                    let q = blk[qoff + j];
                    isum += (i32::from(q & 0xF) - off) * i32::from(qx[j]);
                    isum += (i32::from(q >> 4) - off) * i32::from(qx[j + 16]);
                }
            }
            // Float formats never take the integer path (see `matvec`);
            // K-quants returned above.
            _ => return 0.0,
        }
        acc += f16_at(blk, 0) * xq.d[b] * isum as f32;
        if format == WeightFormat::Q4_1 {
            acc += f16_at(blk, 2) * xq.s[b];
        }
    }
    acc
}

/// `y[i] = dot(W[sel.get(i)], xq)`, 16-bit activation integer path.
pub(crate) fn matvec_i16(w: &QMatrix<'_>, sel: Rows<'_>, xq: &QActs16, y: &mut [f32]) {
    for (i, yv) in y.iter_mut().enumerate() {
        *yv = dot_i16(w.format(), w.row_data(sel.get(i)), xq);
    }
}

/// `out[t * nr + i] = dot(w[i], x[t])` for a dequantized tile `w` (nr × cols).
pub(crate) fn tile(w: &[f32], nr: usize, cols: usize, x: &[f32], n: usize, out: &mut [f32]) {
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        for i in 0..nr {
            out[t * nr + i] = dot_f32(&w[i * cols..(i + 1) * cols], xt);
        }
    }
}

/// `gate = silu(gate) · up` (libm's `exp`): the reference of the SIMD paths.
pub(crate) fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `x = exp(x - max)` (libm's `exp`): the reference of the SIMD paths.
pub(crate) fn exp_sub(x: &mut [f32], max: f32) {
    for v in x.iter_mut() {
        *v = (*v - max).exp();
    }
}

/// Dot product with 8 partial sums.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `acc += round(x · 2^32)` (ties to even; saturating at i64's range, NaN as 0), `x = 0`, over
/// the common prefix: the reference of [`crate::add_fixed`].
pub(crate) fn add_fixed(acc: &mut [i64], x: &mut [f32]) {
    for (a, v) in acc.iter_mut().zip(x.iter_mut()) {
        *a = a.wrapping_add((f64::from(*v) * crate::FIXED_SCALE).round_ties_even() as i64);
        *v = 0.0;
    }
}

/// [`add_fixed`] without SIMD intrinsics, in a loop compilers vectorize: where every |x| < 2^19,
/// `x · 2^32` is within ±2^51 and adding 1.5 · 2^52 in f64 rounds it to an integer (ties to even)
/// whose bits are the sum's minus the constant's; otherwise the reference.
pub(crate) fn add_fixed_portable(acc: &mut [i64], x: &mut [f32]) {
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    const LIMIT_BITS: u32 = 0x4900_0000; // 2^19
    let n = acc.len().min(x.len());
    let (acc, x) = (&mut acc[..n], &mut x[..n]);
    let big = x.iter().fold(0u32, |m, v| {
        m | u32::from((v.to_bits() & 0x7fff_ffff) >= LIMIT_BITS)
    });
    if big != 0 {
        return add_fixed(acc, x);
    }
    let magic = MAGIC.to_bits() as i64;
    for (a, v) in acc.iter_mut().zip(x.iter_mut()) {
        let y = f64::from(*v) * crate::FIXED_SCALE + MAGIC;
        *a = a.wrapping_add((y.to_bits() as i64).wrapping_sub(magic));
        *v = 0.0;
    }
}

/// y += alpha * x.
pub(crate) fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv += alpha * xv;
    }
}

/// `y += c * dequant(row)` (row has exactly `format.row_bytes(y.len())`
/// bytes): 32 elements at a time dequantized to f32, then multiply-add.
pub(crate) fn axpy_row(format: WeightFormat, c: f32, row: &[u8], y: &mut [f32]) {
    if let WeightFormat::I4Hybrid { outliers_per_row } = format {
        return axpy_hybrid(usize::from(outliers_per_row), c, row, y.len(), 0, y);
    }
    if format.is_k_quant() {
        // K-quant rows dequantize a whole 256-element super-block at a time.
        let mut buf = [0f32; 256];
        for (blk, ys) in row
            .chunks_exact(format.block_bytes())
            .zip(y.chunks_mut(256))
        {
            dequant_row(format, blk, &mut buf);
            for (yv, w) in ys.iter_mut().zip(&buf) {
                *yv += c * w;
            }
        }
        return;
    }
    let per_group = 32 / format.block_len() * format.block_bytes();
    let mut buf = [0f32; 32];
    for (g, ys) in row.chunks(per_group).zip(y.chunks_mut(32)) {
        let n = ys.len();
        dequant_row(format, g, &mut buf[..n]);
        for (yv, w) in ys.iter_mut().zip(&buf[..n]) {
            *yv += c * w;
        }
    }
}

/// Sum of squares accumulated in f64.
pub(crate) fn sum_sq(x: &[f32]) -> f32 {
    x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() as f32
}
