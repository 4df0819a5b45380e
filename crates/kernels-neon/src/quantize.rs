//! Weight quantizers: f32 rows into the block formats (the inverse of
//! [`dequantize_row`](crate::dequantize_row)).
//!
//! These run at load or conversion time (re-quantizing, transposing the
//! down projection for [`axpy_rows`](crate::axpy_rows)), not per token, so
//! they are plain scalar code. They follow ggml's reference quantizers:
//!
//! * `Q8_0`: `d = max|x| / 127`, `q = round(x / d)`;
//! * `Q4_0`: `d = x_m / -8` where `x_m` is the element of largest magnitude
//!   (sign kept), `q = clamp(trunc(x / d + 8.5), 0, 15)`;
//! * `Q4_1`: `d = (max - min) / 15`, `m = min`, `q = clamp(trunc((x - m) / d + 0.5), 0, 15)`;
//! * `Q5_0`, `Q5_1`: as `Q4_0` with `d = x_m / -16` and `q = clamp(trunc(x / d + 16.5), 0, 31)`, and as
//!   `Q4_1` with `d = (max - min) / 31`, the fifth bits packed into a 32-bit word;
//! * `F32`, `F16`, `BF16`: plain conversion.
//!
//! * `I4Hybrid { outliers_per_row: k }` (PowerInfer-2 section 7.6): the `k`
//!   elements of largest magnitude of the row (ties: lower column first)
//!   become INT8 outliers, `s_o = max|outlier| / 127`,
//!   `o = round(x / s_o)`; their INT4 quants are 0. The INT4 scale is
//!   searched over 16 clipping ratios `r = 1.00, 0.98, ..., 0.70`:
//!   `s = r * max|rest| / 7`, `q = clamp(round(x / s), -8, 7)`, keeping the
//!   `s` with the least squared error over the non-outlier elements
//!   (ties: the larger `r`). Outliers are stored sorted by column.
//!
//! * `Q2_K`, `Q4_K`, `Q6_K`: each sub-block's scale (and min) from its range, rounded to nearest
//!   (`quantize_k`), without ggml's scale search.
//!
//! The other K-quants are not produced here (files carry them already quantized).

use half::{bf16, f16};

use crate::{KernelError, LayoutError, WeightFormat};

/// Quantizes one row of `src.len()` elements into `dst`, which must hold
/// exactly `format.row_bytes(src.len())` bytes.
///
/// Supported formats: `F32`, `F16`, `BF16`, `Q8_0`, `Q4_0`, `Q4_1`, `Q5_0`,
/// `Q5_1`, `Q2_K`, `Q4_K`, `Q6_K`, `I4Hybrid`; `Q3_K`, `Q5_K` and the IQ4 formats give [`KernelError::Unsupported`]. Non-finite inputs give
/// [`KernelError::NonFinite`] (a quantized block cannot represent them).
pub fn quantize_row(format: WeightFormat, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_row(format, src, dst)?;
    match format {
        WeightFormat::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        WeightFormat::F16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        WeightFormat::BF16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        WeightFormat::Q8_0 => {
            for (blk, x) in dst.chunks_exact_mut(34).zip(src.chunks_exact(32)) {
                let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for (q, v) in blk[2..].iter_mut().zip(x) {
                    *q = ((v * id).round() as i8) as u8;
                }
            }
        }
        WeightFormat::Q4_0 => {
            for (blk, x) in dst.chunks_exact_mut(18).zip(src.chunks_exact(32)) {
                let xm = signed_absmax(x);
                let d = xm / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let lo = ((x[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                    let hi = ((x[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
                    blk[2 + j] = lo | (hi << 4);
                }
            }
        }
        WeightFormat::Q4_1 => {
            for (blk, x) in dst.chunks_exact_mut(20).zip(src.chunks_exact(32)) {
                let (min, max) = min_max(x);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                blk[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
                for j in 0..16 {
                    let lo = (((x[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    let hi = (((x[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    blk[4 + j] = lo | (hi << 4);
                }
            }
        }
        WeightFormat::Q5_0 => {
            // ggml's reference: the signed value of largest magnitude maps to -16, the 5-bit codes
            // are split into low nibbles and a 32-bit word of high bits.
            for (blk, x) in dst.chunks_exact_mut(22).zip(src.chunks_exact(32)) {
                let xm = signed_absmax(x);
                let d = xm / -16.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                let q = |v: f32| ((v * id + 16.5) as i32).clamp(0, 31) as u32;
                pack_q5(x, q, &mut blk[2..]);
            }
        }
        WeightFormat::Q5_1 => {
            for (blk, x) in dst.chunks_exact_mut(24).zip(src.chunks_exact(32)) {
                let (min, max) = min_max(x);
                let d = (max - min) / 31.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                blk[2..4].copy_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 31) as u32;
                pack_q5(x, q, &mut blk[4..]);
            }
        }
        WeightFormat::Q4_K => {
            for (blk, x) in dst.chunks_exact_mut(144).zip(src.chunks_exact(256)) {
                crate::quantize_k::q4_k_block(x, blk);
            }
        }
        WeightFormat::Q6_K => {
            for (blk, x) in dst.chunks_exact_mut(210).zip(src.chunks_exact(256)) {
                crate::quantize_k::q6_k_block(x, blk);
            }
        }
        WeightFormat::Q2_K => {
            for (blk, x) in dst.chunks_exact_mut(84).zip(src.chunks_exact(256)) {
                crate::quantize_k::q2_k_block(x, blk);
            }
        }
        WeightFormat::Q3_K | WeightFormat::Q5_K | WeightFormat::IQ4_NL | WeightFormat::IQ4_XS => {
            return Err(KernelError::Unsupported {
                what: "quantize_row",
                format,
            });
        }
        WeightFormat::I4Hybrid { outliers_per_row } => {
            quantize_hybrid(usize::from(outliers_per_row), src, dst)
        }
    }
    Ok(())
}

/// `dst` holds exactly `format.row_bytes(src.len())` bytes and `src` is finite.
fn check_row(format: WeightFormat, src: &[f32], dst: &[u8]) -> Result<(), KernelError> {
    let expected =
        format
            .row_bytes(src.len())
            .ok_or(KernelError::Layout(LayoutError::RaggedCols {
                format,
                cols: src.len(),
                block_len: format.block_len(),
            }))?;
    if dst.len() != expected {
        return Err(KernelError::Layout(LayoutError::DataLength {
            what: "quantize_row dst",
            expected,
            actual: dst.len(),
        }));
    }
    if let Some(i) = src.iter().position(|v| !v.is_finite()) {
        return Err(KernelError::NonFinite {
            what: "quantize_row src",
            index: i,
        });
    }
    Ok(())
}

/// Clipping ratios tried for the INT4 scale of `I4Hybrid`.
const HYBRID_CLIP_STEPS: usize = 16;

/// `I4Hybrid` row quantizer (see the module docs); `dst` is zeroed first
/// (padding stays 0).
fn quantize_hybrid(k: usize, src: &[f32], dst: &mut [u8]) {
    let cols = src.len();
    dst.fill(0);
    // Top-k columns by magnitude (ties: lower column), then sorted by column.
    let mut order: Vec<u32> = (0..cols as u32).collect();
    let key = |&a: &u32, &b: &u32| {
        src[b as usize]
            .abs()
            .total_cmp(&src[a as usize].abs())
            .then(a.cmp(&b))
    };
    if k > 0 && k < cols {
        order.select_nth_unstable_by(k - 1, key);
    }
    let mut out_cols: Vec<u32> = order[..k].to_vec();
    out_cols.sort_unstable();
    let mut is_outlier = vec![false; cols];
    for &c in &out_cols {
        is_outlier[c as usize] = true;
    }
    // The non-outlier weights (outliers count as 0 there).
    let rest: Vec<f32> = src
        .iter()
        .zip(&is_outlier)
        .map(|(&v, &o)| if o { 0.0 } else { v })
        .collect();
    // INT4 scale: MSE search over clipping ratios of max|rest| / 7.
    let amax = rest.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    // round(clamp(v * id, -8, 7)), half away from zero like `f32::round`,
    // without the libm call `round` is on baseline x86_64 (no SSE4.1): the
    // search below runs it 16 times per weight at load time.
    let q4 = |v: f32, id: f32| {
        let t = (v * id).clamp(-8.0, 7.0);
        let r = t as i32 as f32; // toward zero; `t - r` is exact
        if (t - r).abs() >= 0.5 {
            r + 1f32.copysign(t)
        } else {
            r
        }
    };
    let mut best = (f64::INFINITY, 0.0f32);
    if amax > 0.0 {
        for i in 0..HYBRID_CLIP_STEPS {
            let r = 1.0 - 0.02 * i as f32;
            let s = r * amax / 7.0;
            let id = 1.0 / s;
            // Zeros (outlier slots) contribute no error.
            let err: f64 = rest
                .iter()
                .map(|&v| {
                    let e = f64::from(v - s * q4(v, id));
                    e * e
                })
                .sum();
            if err < best.0 {
                best = (err, s);
            }
        }
    }
    let s = best.1;
    let id = if s != 0.0 { 1.0 / s } else { 0.0 };
    // Outlier scale.
    let omax = out_cols
        .iter()
        .fold(0.0f32, |m, &c| m.max(src[c as usize].abs()));
    let so = omax / 127.0;
    let ido = if so != 0.0 { 1.0 / so } else { 0.0 };
    dst[0..4].copy_from_slice(&s.to_le_bytes());
    dst[4..8].copy_from_slice(&so.to_le_bytes());
    let nib = &mut dst[8..8 + cols / 2];
    for (g, (x, o)) in nib
        .chunks_exact_mut(16)
        .zip(src.chunks_exact(32).zip(is_outlier.chunks_exact(32)))
    {
        let q = |j: usize| {
            if o[j] {
                8u8
            } else {
                (q4(x[j], id) as i32 + 8) as u8
            }
        };
        for (j, b) in g.iter_mut().enumerate() {
            *b = q(j) | (q(j + 16) << 4);
        }
    }
    let n = 8 + cols / 2;
    for (j, &c) in out_cols.iter().enumerate() {
        dst[n + 2 * j..n + 2 * j + 2].copy_from_slice(&(c as u16).to_le_bytes());
        let v = (src[c as usize] * ido).round().clamp(-127.0, 127.0) as i8;
        dst[n + 2 * k + j] = v as u8;
    }
}

/// The element of largest magnitude, sign kept (the first such; 0 for an all-zero block): the scale
/// source of Q4_0 and Q5_0.
fn signed_absmax(x: &[f32]) -> f32 {
    x.iter()
        .fold(0.0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// Smallest and largest element: the range of Q4_1 and Q5_1.
fn min_max(x: &[f32]) -> (f32, f32) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    (min, max)
}

/// The 5-bit codes `q(x[j])` of one 32-block as Q5_0/Q5_1 store them: a little-endian word whose bit
/// `j` is bit 4 of code `j`, then 16 bytes of low nibbles (code `j` low, code `j + 16` high).
fn pack_q5(x: &[f32], q: impl Fn(f32) -> u32, out: &mut [u8]) {
    let mut qh = 0u32;
    for j in 0..16 {
        let (lo, hi) = (q(x[j]), q(x[j + 16]));
        out[4 + j] = ((lo & 0x0f) | ((hi & 0x0f) << 4)) as u8;
        qh |= ((lo >> 4) & 1) << j;
        qh |= ((hi >> 4) & 1) << (j + 16);
    }
    out[..4].copy_from_slice(&qh.to_le_bytes());
}

/// Quantizes a row-major `rows × cols` f32 matrix into `format`, row by row
/// (`rows * format.row_bytes(cols)` bytes).
pub fn quantize_matrix(
    format: WeightFormat,
    src: &[f32],
    rows: usize,
    cols: usize,
) -> Result<Vec<u8>, KernelError> {
    if src.len() != rows * cols {
        return Err(KernelError::LengthMismatch {
            what: "quantize_matrix src",
            expected: rows * cols,
            actual: src.len(),
        });
    }
    let rb = format
        .row_bytes(cols)
        .ok_or(KernelError::Layout(LayoutError::RaggedCols {
            format,
            cols,
            block_len: format.block_len(),
        }))?;
    let mut out = vec![0u8; rows * rb];
    if cols == 0 {
        return Ok(out);
    }
    for (d, s) in out.chunks_exact_mut(rb).zip(src.chunks_exact(cols)) {
        quantize_row(format, s, d)?;
    }
    Ok(out)
}
