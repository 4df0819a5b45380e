//! Shared helpers: random matrices and float64 references.
#![allow(dead_code)]

use half::{bf16, f16};
use kernels_neon::{dequantize_row_with, KernelPath, Precision, QMatrix, WeightFormat};

/// The quantized formats with integer kernels (every block format; no float or I4Hybrid).
pub const INT_FORMATS: [WeightFormat; 12] = [
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
    WeightFormat::IQ4_NL,
    WeightFormat::Q2_K,
    WeightFormat::Q3_K,
    WeightFormat::Q4_K,
    WeightFormat::Q5_K,
    WeightFormat::Q6_K,
    WeightFormat::IQ4_XS,
];

/// Whether `v` equals `want` up to f32 summation order (`abs`: the row's Σ|w·x|): 1e-5 · abs +
/// 1e-6. A NaN (a row not written) is not.
pub fn order_close(v: f32, want: f32, abs: f64) -> bool {
    f64::from((v - want).abs()) <= 1e-5 * abs + 1e-6
}

pub const FORMATS: [WeightFormat; 18] = [
    WeightFormat::F32,
    WeightFormat::F16,
    WeightFormat::BF16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q5_1,
    WeightFormat::Q2_K,
    WeightFormat::Q3_K,
    WeightFormat::Q4_K,
    WeightFormat::Q5_K,
    WeightFormat::Q6_K,
    WeightFormat::IQ4_NL,
    WeightFormat::IQ4_XS,
    // Per-channel INT4 without outliers, with a few, and with many (a
    // 32-wide row then has more outliers than INT4 weights).
    WeightFormat::I4Hybrid {
        outliers_per_row: 0,
    },
    WeightFormat::I4Hybrid {
        outliers_per_row: 3,
    },
    WeightFormat::I4Hybrid {
        outliers_per_row: 20,
    },
];

/// Tiny deterministic PRNG (splitmix64) so tests need no extra crates.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
}

/// Random bytes of a `rows × cols` matrix in `format` with realistic scales.
pub fn random_matrix(format: WeightFormat, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows * format.row_bytes(cols).unwrap());
    for _ in 0..rows {
        match format {
            WeightFormat::F32 => {
                (0..cols).for_each(|_| out.extend_from_slice(&rng.f().to_le_bytes()))
            }
            WeightFormat::F16 => {
                (0..cols).for_each(|_| out.extend_from_slice(&f16::from_f32(rng.f()).to_le_bytes()))
            }
            WeightFormat::BF16 => (0..cols)
                .for_each(|_| out.extend_from_slice(&bf16::from_f32(rng.f()).to_le_bytes())),
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                for _ in 0..cols / 32 {
                    out.extend_from_slice(&f16::from_f32(rng.f() * 0.05).to_le_bytes());
                    if format == WeightFormat::Q4_1 {
                        out.extend_from_slice(&f16::from_f32(rng.f() * 0.2).to_le_bytes());
                    }
                    let nq = if format == WeightFormat::Q8_0 { 32 } else { 16 };
                    (0..nq).for_each(|_| out.push(rng.byte()));
                }
            }
            WeightFormat::Q5_0 | WeightFormat::Q5_1 => {
                for _ in 0..cols / 32 {
                    out.extend_from_slice(&f16::from_f32(rng.f() * 0.05).to_le_bytes());
                    if format == WeightFormat::Q5_1 {
                        out.extend_from_slice(&f16::from_f32(rng.f() * 0.2).to_le_bytes());
                    }
                    // qh (fifth bits), then the 16 nibble bytes.
                    (0..4 + 16).for_each(|_| out.push(rng.byte()));
                }
            }
            WeightFormat::IQ4_NL | WeightFormat::IQ4_XS => {
                for _ in 0..cols / format.block_len() {
                    out.extend_from_slice(&f16::from_f32(rng.f() * 0.005).to_le_bytes());
                    // IQ4_XS: scales_h, scales_l, then the nibbles; IQ4_NL: the nibbles.
                    (0..format.block_bytes() - 2).for_each(|_| out.push(rng.byte()));
                }
            }
            WeightFormat::Q4_K | WeightFormat::Q5_K => {
                for _ in 0..cols / 256 {
                    out.extend_from_slice(&f16::from_f32(rng.f() * 0.01).to_le_bytes());
                    out.extend_from_slice(&f16::from_f32(rng.f() * 0.02).to_le_bytes());
                    // scales, then (Q5_K) the 32 qh bytes, then the 128 nibble bytes.
                    let n = format.block_bytes() - 4;
                    (0..n).for_each(|_| out.push(rng.byte()));
                }
            }
            WeightFormat::I4Hybrid { outliers_per_row } => {
                let k = usize::from(outliers_per_row);
                let start = out.len();
                out.extend_from_slice(&(rng.f() * 0.05).to_le_bytes());
                out.extend_from_slice(&(rng.f() * 0.01).to_le_bytes());
                (0..cols / 2).for_each(|_| out.push(rng.byte()));
                // k distinct columns in range (partial Fisher-Yates), in random order.
                let mut perm: Vec<u16> = (0..cols as u32).map(|c| c as u16).collect();
                for j in 0..k {
                    let t = j + (rng.next_u64() % (cols - j) as u64) as usize;
                    perm.swap(j, t);
                }
                perm[..k]
                    .iter()
                    .for_each(|c| out.extend_from_slice(&c.to_le_bytes()));
                (0..k).for_each(|_| out.push(rng.byte()));
                out.resize(start + format.row_bytes(cols).unwrap(), 0);
            }
            WeightFormat::Q2_K | WeightFormat::Q3_K => {
                for _ in 0..cols / 256 {
                    // Q2_K: scales, qs, then d and dmin; Q3_K: hmask, qs, scales, then d.
                    let n = format.block_bytes() - if format == WeightFormat::Q2_K { 4 } else { 2 };
                    (0..n).for_each(|_| out.push(rng.byte()));
                    out.extend_from_slice(&f16::from_f32(rng.f() * 0.01).to_le_bytes());
                    if format == WeightFormat::Q2_K {
                        out.extend_from_slice(&f16::from_f32(rng.f() * 0.02).to_le_bytes());
                    }
                }
            }
            WeightFormat::Q6_K => {
                for _ in 0..cols / 256 {
                    // ql, qh, scales (all i8 values, negative ones included), d
                    (0..128 + 64 + 16).for_each(|_| out.push(rng.byte()));
                    out.extend_from_slice(&f16::from_f32(rng.f() * 0.002).to_le_bytes());
                }
            }
        }
    }
    out
}

pub fn random_vec(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.f() * 2.0).collect()
}

/// The activations `matvec` multiplies weights of `format` by in `precision`, as f32: F16 weights
/// outside `Exact` take `x` rounded to f16 (unless a value leaves f16's range), every other case
/// `x` itself (integer activations are `check`'s bounds).
pub fn matvec_acts(format: WeightFormat, precision: Precision, x: &[f32]) -> Vec<f32> {
    let rounded: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    if format == WeightFormat::F16
        && precision != Precision::Exact
        && rounded.iter().all(|v| v.is_finite())
    {
        rounded
    } else {
        x.to_vec()
    }
}

/// Dequantized matrix (scalar path) as f64 rows.
pub fn dequant_f64(w: &QMatrix) -> Vec<Vec<f64>> {
    (0..w.rows())
        .map(|r| {
            let mut row = vec![0f32; w.cols()];
            dequantize_row_with(KernelPath::Scalar, w.format(), w.row_data(r), &mut row).unwrap();
            row.into_iter().map(f64::from).collect()
        })
        .collect()
}

/// (reference dot in f64, Σ|w·x|, Σ_j |w_j| · amax_block(j)). The last one
/// divided by 254 (Int8) or 65278 (Fast) bounds the activation rounding error.
pub fn reference(w_row: &[f64], x: &[f32]) -> (f64, f64, f64) {
    let mut dot = 0f64;
    let mut abs = 0f64;
    let mut qerr = 0f64;
    for (bw, bx) in w_row.chunks(32).zip(x.chunks(32)) {
        let amax = bx.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        for (&a, &b) in bw.iter().zip(bx) {
            dot += a * f64::from(b);
            abs += (a * f64::from(b)).abs();
            qerr += a.abs() * amax;
        }
    }
    (dot, abs, qerr)
}

/// Column count for a test case: K-quants get 256 or 512 (one or two
/// super-blocks), other quantized formats `units` blocks of 32, float
/// formats also a ragged tail of `odd` elements.
pub fn cols_for(format: WeightFormat, units: usize, odd: usize) -> usize {
    if format.is_k_quant() {
        256 * (1 + units % 2)
    } else if format.is_quantized() {
        units * 32
    } else {
        units * 32 + odd
    }
}

/// Whether `matmul` of more than one token in `Int8` takes an 8-bit integer tile on `path` for
/// the K-quant `format` (Q4_K/Q5_K/Q6_K on AVX2, AVX-512 and NEON with dotprod, activations of
/// one scale per 256; Q2_K/Q3_K there too, one scale per 32) rather than the f32 or bf16 one.
pub fn int8_tile(path: KernelPath, format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(
        path,
        KernelPath::Avx2Fma | KernelPath::Avx512 | KernelPath::NeonDotprod | KernelPath::NeonI8mm
    ) && matches!(format, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K)
}

/// Whether `matmul` of more than one token takes the 8-bit integer tile with activations of one
/// scale per 32 on `path` for `format` (AVX-512, the formats of 32-element integer blocks: Q4_0,
/// Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, and IQ4_XS's sub-blocks of 32; AVX2 Q4_0, Q4_1, Q5_0, Q5_1;
/// NEON with dotprod, `sdot`, and with i8mm, `smmla`: those, Q8_0 and IQ4_NL), from
/// `INT_TILE_MIN_TOKENS` tokens.
pub fn int8_block_tile(path: KernelPath, format: WeightFormat) -> bool {
    use WeightFormat::*;
    (path == KernelPath::Avx512
        && matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS))
        || (path == KernelPath::Avx2Fma && matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1))
        || (matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm)
            && matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL))
}

/// Whether `matmul` of more than one token takes the 16-bit integer tile on `path` for `format` in
/// `Fast` (AVX-512, AVX2 and NEON with dotprod or i8mm: the formats of 32-element blocks, and
/// IQ4_XS, whose `Fast` prompts do not take an 8-bit tile: those not in `fast_prompts_int8`, and
/// on AVX2 also Q8_0, IQ4_NL and IQ4_XS, which have no 8-bit tile there), from
/// `INT_TILE_MIN_TOKENS` tokens.
pub fn i16_tile(path: KernelPath, format: WeightFormat) -> bool {
    use WeightFormat::*;
    matches!(
        path,
        KernelPath::Avx512 | KernelPath::Avx2Fma | KernelPath::NeonDotprod | KernelPath::NeonI8mm
    ) && matches!(format, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS)
        && !(int8_block_tile(path, format) && kernels_neon::fast_prompts_int8(format))
        && !kernels_neon::fast_prompts_halves(path, format)
}

/// Whether a `Fast` prompt of `n` tokens takes the 8-bit tile on `path` for `format` with
/// activations of one scale per 16 (`fast_prompts_halves`: Q4_0 and Q4_1 on x86 and with dotprod
/// or i8mm, IQ4_NL and IQ4_XS on AVX-512), from `halves_min_tokens` (8 on aarch64, else
/// `INT_TILE_MIN_TOKENS`).
pub fn halves_tile(path: KernelPath, format: WeightFormat, precision: Precision, n: usize) -> bool {
    precision == Precision::Fast
        && n >= kernels_neon::halves_min_tokens(path)
        && kernels_neon::fast_prompts_halves(path, format)
}

/// Whether a `Fast` prompt of `n` tokens, fewer than `INT_TILE_MIN_TOKENS`, takes the 16-bit tile
/// on `path` for `format`: with dotprod or i8mm from `short_prompt_tokens` (8), the 32-block
/// formats but Q4_0 and Q4_1 (8 bits from there: [`halves_tile`]), IQ4_XS, Q2_K, Q3_K, Q4_K and
/// Q5_K (`fast_prompts_int8`'s take 8 bits only from `INT_TILE_MIN_TOKENS`).
pub fn short_i16_tile(path: KernelPath, format: WeightFormat, n: usize) -> bool {
    use WeightFormat::*;
    matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm)
        && n >= kernels_neon::short_prompt_tokens(path)
        && matches!(
            format,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL | IQ4_XS | Q2_K | Q3_K | Q4_K | Q5_K
        )
        && !halves_tile(path, format, Precision::Fast, n)
}

/// The precision of `matvec` whose integer products `matmul` of `n > 1` tokens in `precision`
/// gives each token on `path` for `format`, or `None` where it takes the f32 or bf16 tile: the
/// 8-bit tiles' `Int8` products, for the K-quants ([`int8_tile`]) in `Int8` prompts and in `Fast`
/// ones from `INT_TILE_MIN_TOKENS` tokens, for the 32-block formats ([`int8_block_tile`]) from
/// that many tokens in `Int8`, and in `Fast` where `fast_prompts_int8`; the 16-bit tile's `Fast`
/// products for the other 32-block formats' `Fast` prompts from that many tokens, and on AVX2 for
/// every 32-block format's ([`i16_tile`]), and with i8mm below that many ([`short_i16_tile`]);
/// `Int8` for those of [`halves_tile`] (not its products: its activations take a scale per 16,
/// but within `Int8`'s error bound).
pub fn tile_products(
    path: KernelPath,
    format: WeightFormat,
    precision: Precision,
    n: usize,
) -> Option<Precision> {
    let long = n >= kernels_neon::INT_TILE_MIN_TOKENS;
    match precision {
        Precision::Exact => None,
        _ if int8_tile(path, format) && (long || precision == Precision::Int8) => {
            Some(Precision::Int8)
        }
        // A scale per 16 errs at most as one per 32 does: `Int8`'s bound (`check`) holds.
        Precision::Fast if halves_tile(path, format, precision, n) => Some(Precision::Int8),
        Precision::Fast if !long && short_i16_tile(path, format, n) => Some(Precision::Fast),
        _ if !long => None,
        Precision::Fast if i16_tile(path, format) => Some(Precision::Fast),
        Precision::Fast if !kernels_neon::fast_prompts_int8(format) => None,
        _ if int8_block_tile(path, format) => Some(Precision::Int8),
        _ => None,
    }
}

/// Whether `matmul` of `n > 1` tokens in `precision` takes an integer tile on `path` for `format`
/// ([`tile_products`]).
pub fn int_tile(path: KernelPath, format: WeightFormat, precision: Precision, n: usize) -> bool {
    tile_products(path, format, precision, n).is_some()
}

/// Every precision.
pub const PRECISIONS: [Precision; 3] = [Precision::Exact, Precision::Fast, Precision::Int8];

/// `precision` is the effective one: pass `Exact` when the call takes the
/// f32 path (float weights, matmul with n > 1).
pub fn check(
    y: f32,
    (dot, abs, wamax): (f64, f64, f64),
    precision: Precision,
) -> Result<(), String> {
    let mut tol = 1e-5 * abs + 1e-6;
    match precision {
        Precision::Exact => {}
        Precision::Fast => tol += wamax / 65278.0 * 1.02,
        Precision::Int8 => tol += wamax / 254.0 * 1.001,
        // Int8's rounding, and the scale rounded to f16 (ggml's `block_q8_0`): at |q| <= 127 off
        // by at most 2^-11 of it, 127 · 2^-11 quantization steps.
        Precision::Ggml => tol += wamax * (1.0 / 254.0 + 2f64.powi(-11)) * 1.001,
    }
    let err = (f64::from(y) - dot).abs();
    if err <= tol {
        Ok(())
    } else {
        Err(format!("y={y} ref={dot} err={err} tol={tol}"))
    }
}

/// [`check`] for the bf16 tile: both operands rounded to 8 significant bits (bound in `props.rs`).
pub fn check_bf16(y: f32, (dot, abs, _): (f64, f64, f64)) -> Result<(), String> {
    let tol = abs * (2f64.powi(-7) * 1.001 + 1e-5) + 1e-6;
    let err = (f64::from(y) - dot).abs();
    if err <= tol {
        Ok(())
    } else {
        Err(format!("y={y} ref={dot} err={err} tol={tol} (bf16)"))
    }
}

/// 256 cases unless `PROPTEST_CASES` says otherwise (reduce it under qemu).
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// `rows` (positions × stride f32) encoded as a KV cache of `format` in chunks of `chunk` positions.
pub fn encode_kv(
    format: kernels_neon::KvFormat,
    rows: &[f32],
    stride: usize,
    chunk: usize,
) -> Vec<Vec<u8>> {
    let rb = format.row_bytes(stride).unwrap();
    rows.chunks(stride * chunk)
        .map(|c| {
            let mut bytes = vec![0u8; c.len() / stride * rb];
            for (src, dst) in c.chunks(stride).zip(bytes.chunks_mut(rb)) {
                kernels_neon::kv_encode(format, src, dst).unwrap();
            }
            bytes
        })
        .collect()
}

/// The formats `Q40x8` copies block by block (Q4_K, by super-block, apart).
pub const Q40X8_FORMATS: [WeightFormat; 5] = [
    WeightFormat::Q4_0,
    WeightFormat::IQ4_NL,
    WeightFormat::Q5_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_1,
];

/// Activations at the extremes of their 16-bit quants: all +1, all -1, alternating.
pub fn extreme_vecs(n: usize) -> [Vec<f32>; 3] {
    [
        vec![1.0f32; n],
        vec![-1.0f32; n],
        (0..n)
            .map(|i| if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect(),
    ]
}
