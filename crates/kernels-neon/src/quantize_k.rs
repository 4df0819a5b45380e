//! Quantizers of the two K-quant formats llama.cpp's Q4_K_M mix is made of, Q4_K and Q6_K, and of
//! Q2_K (the engine's small proxy of a streamed output projection, `engine::output_proxy`), in ggml's
//! block layouts (read back by `dequantize_row`, whose dequantization `tests/it/gguf_fixture.rs` checks
//! against the PyPI `gguf` package). They fit each sub-block's scale (and Q4_K's min) from its range and round
//! to nearest, without ggml's iterative search (`make_qkx2_quants`): the bytes are valid blocks of the
//! format and the error is within one quantization step (`tests/it/quantize.rs`), a little above what
//! llama.cpp's quantizer reaches.

use half::f16;

/// Elements per K-quant super-block.
const QK: usize = 256;

/// Nearest integer of `v` clamped to `lo..=hi`.
fn nearest(v: f32, lo: i32, hi: i32) -> i32 {
    (v.round() as i32).clamp(lo, hi)
}

/// An affine K-quant super-block's parameters (`x = d·sc_j·q − dmin·m_j` over `N` sub-blocks).
struct AffineFit<const N: usize> {
    d: f16,
    dmin: f16,
    sc: [u8; N],
    m: [u8; N],
}

/// Fits the affine K-quant super-block `x` (Q2_K, Q4_K) of `N` sub-blocks: each sub-block's
/// scale `(max - min) / levels` and min `-min` (the range always includes 0), both rounded to
/// `0..=scale_max` steps of the largest (`d`, `dmin`), and writes each element's quant
/// (`0..=levels`, nearest) into `q`.
fn fit_affine<const N: usize>(
    x: &[f32],
    q: &mut [u8; QK],
    levels: i32,
    scale_max: i32,
) -> AffineFit<N> {
    let len = QK / N;
    let mut scale = [0f32; N];
    let mut min = [0f32; N];
    for (j, s) in x.chunks_exact(len).enumerate() {
        let lo = s.iter().fold(0f32, |m, &v| m.min(v));
        let hi = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        scale[j] = (hi - lo) / levels as f32;
        min[j] = -lo;
    }
    let max_scale = scale.iter().fold(0f32, |m, &v| m.max(v));
    let max_min = min.iter().fold(0f32, |m, &v| m.max(v));
    let d = f16::from_f32(max_scale / scale_max as f32);
    let dmin = f16::from_f32(max_min / scale_max as f32);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    let step_of = |v: f32, unit: f32| {
        if unit > 0.0 {
            nearest(v / unit, 0, scale_max) as u8
        } else {
            0
        }
    };
    let sc = scale.map(|v| step_of(v, df));
    let m = min.map(|v| step_of(v, dminf));
    for (j, (qs, xs)) in q.chunks_exact_mut(len).zip(x.chunks_exact(len)).enumerate() {
        let step = df * f32::from(sc[j]);
        let off = dminf * f32::from(m[j]);
        for (qv, &v) in qs.iter_mut().zip(xs) {
            *qv = if step > 0.0 {
                nearest((v + off) / step, 0, levels) as u8
            } else {
                0
            };
        }
    }
    AffineFit { d, dmin, sc, m }
}

/// One Q4_K super-block (144 bytes): `d`, `dmin` (f16), 12 bytes of 6-bit scales and mins of the
/// eight 32-element sub-blocks, 128 bytes of 4-bit quants; `x = d·sc_j·q − dmin·m_j`.
pub(crate) fn q4_k_block(x: &[f32], out: &mut [u8]) {
    debug_assert!(x.len() == QK && out.len() == 144);
    let mut q = [0u8; QK];
    let AffineFit { d, dmin, sc, m } = fit_affine::<8>(x, &mut q, 15, 63);
    out[..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    // ggml's `get_scale_min_k4` layout.
    let s = &mut out[4..16];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
    }
    // Each 64 elements: 32 bytes, low nibbles the first 32, high nibbles the next 32.
    for (c, bytes) in out[16..].chunks_exact_mut(32).enumerate() {
        for (l, b) in bytes.iter_mut().enumerate() {
            *b = q[64 * c + l] | (q[64 * c + 32 + l] << 4);
        }
    }
}

/// One Q6_K super-block (210 bytes): 128 bytes of low 4 bits, 64 of high 2 bits, 16 signed 8-bit
/// scales of the 16-element sub-blocks, `d` (f16); `x = d·sc_j·(q − 32)`.
pub(crate) fn q6_k_block(x: &[f32], out: &mut [u8]) {
    debug_assert!(x.len() == QK && out.len() == 210);
    let mut scale = [0f32; 16];
    for (j, s) in x.chunks_exact(16).enumerate() {
        // Signed, so that the largest magnitude gets -32 (the wider side), as ggml does.
        let amax = s
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        scale[j] = amax / -32.0;
    }
    let max_abs = scale
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = f16::from_f32(max_abs.abs() / 127.0);
    let df = d.to_f32();
    let mut sc = [0i8; 16];
    for (s, &v) in sc.iter_mut().zip(&scale) {
        *s = if df > 0.0 {
            nearest(v / df, -128, 127) as i8
        } else {
            0
        };
    }
    let mut q = [0u8; QK];
    for (j, (qs, xs)) in q.chunks_exact_mut(16).zip(x.chunks_exact(16)).enumerate() {
        let step = df * f32::from(sc[j]);
        for (qv, &v) in qs.iter_mut().zip(xs) {
            *qv = if step != 0.0 {
                (nearest(v / step, -32, 31) + 32) as u8
            } else {
                32
            };
        }
    }
    let (ql, rest) = out.split_at_mut(128);
    let (qh, rest) = rest.split_at_mut(64);
    let (scales, dbytes) = rest.split_at_mut(16);
    // ggml's `dequantize_row_q6_K` layout: two halves of 128 elements.
    for n in 0..2 {
        let (ql, qh, q) = (&mut ql[64 * n..], &mut qh[32 * n..], &q[128 * n..]);
        for l in 0..32 {
            let (q1, q2, q3, q4) = (q[l], q[l + 32], q[l + 64], q[l + 96]);
            ql[l] = (q1 & 15) | ((q3 & 15) << 4);
            ql[l + 32] = (q2 & 15) | ((q4 & 15) << 4);
            qh[l] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    for (b, &s) in scales.iter_mut().zip(&sc) {
        *b = s as u8;
    }
    dbytes.copy_from_slice(&d.to_le_bytes());
}

/// One Q2_K super-block (84 bytes): 16 bytes of 4-bit scales (low nibble) and mins (high nibble) of
/// the sixteen 16-element sub-blocks, 64 bytes of 2-bit quants, `d`, `dmin` (f16);
/// `x = d·sc_j·q − dmin·m_j`.
pub(crate) fn q2_k_block(x: &[f32], out: &mut [u8]) {
    debug_assert!(x.len() == QK && out.len() == 84);
    let mut q = [0u8; QK];
    let AffineFit { d, dmin, sc, m } = fit_affine::<16>(x, &mut q, 3, 15);
    for (o, (&s, &m)) in out.iter_mut().zip(sc.iter().zip(&m)) {
        *o = s | (m << 4);
    }
    // Each 128 elements: 32 bytes, element `128n + 32k + l` in bits `2k..2k + 2` of byte `32n + l`.
    let qs = &mut out[16..80];
    qs.fill(0);
    for (i, &v) in q.iter().enumerate() {
        qs[32 * (i / 128) + i % 32] |= v << (2 * (i % 128 / 32));
    }
    out[80..82].copy_from_slice(&d.to_le_bytes());
    out[82..84].copy_from_slice(&dmin.to_le_bytes());
}
