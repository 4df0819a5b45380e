//! Run-time dispatch to the architecture-specific kernels.
//!
//! Every function here takes a [`KernelPath`] that the public API has checked
//! with [`KernelPath::is_available`]; the SIMD paths are only entered when
//! their target features were detected. Paths that do not exist on the
//! compilation target fall back to scalar (unreachable in practice).
//!
//! `x86_64/` and `aarch64/` hold the same set of files, one per operation
//! family (`dequant`, `matvec_exact`, `matvec_int8`, `matvec_i16`, `axpy`,
//! `axpy_tiled`, `tile`, `vector`, `expf`, `quantize`, the format families
//! `kquant` and `hybrid`, and the register helpers `simd`); a family a path has no
//! SIMD kernel for says so by returning `false`. The row drivers both use
//! are written once in `drivers.rs`, the const-generic format tags in
//! `tags.rs`.

use crate::quant::{QActs, QActs16};
use crate::{scalar, KernelPath, QMatrix, WeightFormat};

pub(crate) use detect::*;
pub(crate) use tiles::*;

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod attend_block;
mod detect;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod drivers;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod expf_consts;
pub(crate) mod kv;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod tags;
mod tiles;
#[cfg(target_arch = "x86_64")]
mod x86_64;
#[cfg(target_arch = "aarch64")]
pub(crate) use aarch64::{
    q40x8_group_neon, q40x8_group_neon_tokens, q4kx8_group_neon, q4kx8_group_neon_tokens,
    q6kx8_group_neon, q6kx8_group_neon_tokens, q80x8_group, Perm8, Split16,
};
#[cfg(target_arch = "x86_64")]
pub(crate) use x86_64::{
    q40x8_group, q40x8_group_tokens, q40x8_group_tokens_vnni, q40x8_group_vnni, q40x8_pair_tokens,
    q4kx8_group, q4kx8_group_vnni, q6k_corr, q6kx8_group, q80x8_group,
};

/// Which weight rows a matvec work item computes: `y[i]` gets row
/// `sel.get(i)`. Dense `matvec` passes contiguous chunks, the sparse
/// `matvec_rows` passes chunks of the caller's row list; the per-row dot
/// kernels are the same, so the results are bit-identical.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows<'a> {
    /// Contiguous rows starting at this index.
    From(usize),
    /// Listed rows (validated `< rows()` by the public API; `row_data`
    /// would panic otherwise, never read out of bounds).
    List(&'a [u32]),
}

impl Rows<'_> {
    /// Index of the weight row for output `i`.
    #[inline(always)]
    pub(crate) fn get(self, i: usize) -> usize {
        match self {
            Rows::From(r0) => r0 + i,
            Rows::List(l) => l[i] as usize,
        }
    }

    /// Prefetch hint for the head (first `PREFETCH_HEAD` bytes) of the rows
    /// of outputs `i..i + n`, for listed rows only: they are not contiguous,
    /// so the hardware prefetcher does not find them, and the kernels' own
    /// in-row prefetch only covers what follows the head.
    #[inline(always)]
    pub(crate) fn prefetch(self, w: &QMatrix<'_>, i: usize, n: usize) {
        if let Rows::List(l) = self {
            for &r in l.iter().skip(i).take(n) {
                let d = w.row_data(r as usize);
                prefetch(&d[..d.len().min(PREFETCH_HEAD)]);
            }
        }
    }
}

/// Bytes at the start of each upcoming listed row that [`Rows::prefetch`]
/// requests.
const PREFETCH_HEAD: usize = 512;

/// Quantizes `x` to 8-bit activations with the path's SIMD quantizer;
/// `false` (nothing written) where the path has none: the caller then runs
/// the scalar reference, which computes the same f32 operations.
pub(crate) fn quantize_i8(path: KernelPath, x: &[f32], out: &mut QActs) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available, so AVX2/FMA/F16C are present.
            unsafe { x86_64::quantize(x, out) };
            true
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target.
            unsafe { aarch64::quantize(x, out) }
        }
        _ => {
            let _ = (x, out);
            false
        }
    }
}

/// Quantizes `x` to 8-bit activations with one scale per 256 elements
/// (`QActs::quantize_super`), as [`quantize_i8`].
pub(crate) fn quantize_i8_super(path: KernelPath, x: &[f32], out: &mut QActs) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available, so AVX2/FMA/F16C are present.
            unsafe { x86_64::quantize_super(x, out) };
            true
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target.
            unsafe { aarch64::quantize_super(x, out) }
        }
        _ => {
            let _ = (x, out);
            false
        }
    }
}

/// Quantizes `x` to 8-bit activations with one scale per 16 elements
/// (`QActs::quantize_halves`), as [`quantize_i8`].
pub(crate) fn quantize_i8_halves(path: KernelPath, x: &[f32], out: &mut QActs) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available, so AVX2/FMA/F16C are present.
            unsafe { x86_64::quantize_halves(x, out) };
            true
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target.
            unsafe { aarch64::quantize_halves(x, out) }
        }
        _ => {
            let _ = (x, out);
            false
        }
    }
}

/// Quantizes `x` to 16-bit activations, as [`quantize_i8`].
pub(crate) fn quantize_i16(path: KernelPath, x: &[f32], out: &mut QActs16) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available, so AVX2/FMA/F16C are present.
            unsafe { x86_64::quantize16(x, out) };
            true
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target.
            unsafe { aarch64::quantize16(x, out) }
        }
        _ => {
            let _ = (x, out);
            false
        }
    }
}

pub(crate) fn dequant_row(path: KernelPath, format: WeightFormat, src: &[u8], dst: &mut [f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available, so AVX2/FMA/F16C are present;
            // lengths were validated by the caller (the kernel re-checks them).
            unsafe { x86_64::dequant_row(format, src, dst) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target (and the
            // dotprod variant is only selected after run-time detection).
            unsafe { aarch64::dequant_row(format, src, dst) }
        }
        _ => scalar::dequant_row(format, src, dst),
    }
}

pub(crate) fn matvec_exact(
    path: KernelPath,
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    x: &[f32],
    y: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present).
            unsafe { x86_64::matvec_exact(w, sel, x, y) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target (and the
            // dotprod variant is only selected after run-time detection).
            unsafe { aarch64::matvec_exact(w, sel, x, y) }
        }
        _ => scalar::matvec_exact(w, sel, x, y),
    }
}

/// F16 rows `sel` of `w` times activations rounded to f16 ([`crate::HalfActs`]): the aarch64
/// paths' `fmlal` kernel where the CPU has FEAT_FHM, else [`matvec_exact`] on the rounded f32
/// (the same bits on aarch64: `aarch64/matvec_half.rs`).
pub(crate) fn matvec_half(
    path: KernelPath,
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    h: &crate::HalfActs,
    y: &mut [f32],
) {
    #[cfg(target_arch = "aarch64")]
    if let Some(bits) = h.bits() {
        if matches!(
            path,
            KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm
        ) {
            // SAFETY: `bits` are only made where `has_fhm` detected FEAT_FHM.
            unsafe { aarch64::matvec_half(w, sel, bits, h.rounded(), y) };
            return;
        }
    }
    matvec_exact(path, w, sel, h.rounded(), y)
}

/// What a path derives from one token's 8-bit activations for its kernels, made at most once per
/// [`crate::Acts`] (on its first use) and shared by every work item and call that uses them: on
/// x86_64, the activations in the order of [`KernelPath::Avx512`]'s Q4_0 kernel; on aarch64, the
/// sum of each 16 quants for the `dotprod` K-quant rows (where the activations carry none).
#[derive(Default)]
pub(crate) struct Prep8 {
    #[cfg(target_arch = "x86_64")]
    q40: std::sync::OnceLock<x86_64::Q40Bytes>,
    #[cfg(target_arch = "aarch64")]
    sum16: std::sync::OnceLock<Vec<i32>>,
}

#[cfg(target_arch = "aarch64")]
impl Prep8 {
    /// The sum of each 16 quants of `xq` (which `self` belongs to): its own where it has them,
    /// else made once here.
    fn sums16<'a>(&'a self, xq: &'a QActs) -> &'a [i32] {
        if xq.sum16.len() * 16 >= xq.qs.len() {
            &xq.sum16
        } else {
            self.sum16.get_or_init(|| xq.sums16())
        }
    }
}

/// Quantized weights × 8-bit activations ([`Precision::Int8`](crate::Precision::Int8)); `prep`
/// belongs to `xq` (made for it, or new).
pub(crate) fn matvec_int8(
    path: KernelPath,
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs,
    prep: &Prep8,
    y: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            let wide = path == KernelPath::Avx512;
            let q40 = (wide && w.format() == WeightFormat::Q4_0 && !xq.per_super)
                .then(|| prep.q40.get_or_init(|| x86_64::Q40Bytes::new(xq)));
            // SAFETY: the path was checked available (AVX2/FMA/F16C present, and AVX-512F/BW/VNNI
            // on the Avx512 path); `q40` is made from `xq`.
            unsafe { x86_64::matvec_int8(w, sel, xq, y, wide, q40) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon => {
            // SAFETY: NEON is baseline on every aarch64 target.
            unsafe { aarch64::matvec_int8(w, sel, xq, y, false, None) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // The K-quant and Q4_0 rows with `dotprod` need each 16 quants' sum.
            let sum16 = aarch64::int8_sums16(w.format()).then(|| prep.sums16(xq));
            // SAFETY: NEON is baseline on every aarch64 target, and this
            // path is only selected after run-time detection of dotprod.
            unsafe { aarch64::matvec_int8(w, sel, xq, y, true, sum16) }
        }
        _ => {
            let _ = prep;
            scalar::matvec_int8(w, sel, xq, y)
        }
    }
}

/// Rows `r0 .. r0 + ys[t].len()` of `w` times each token's 8-bit activations `xqs[t]` (with its
/// [`Prep8`]) by a batch kernel that reads each row once for several tokens, each token's result
/// bit for bit [`matvec_int8`]'s: `false` (nothing done) where the path has none for `w`'s format
/// (it has one for Q4_0 on [`KernelPath::Avx512`]).
pub(crate) fn matvec_int8_batch(
    path: KernelPath,
    w: &QMatrix<'_>,
    r0: usize,
    xqs: &[(&QActs, &Prep8)],
    ys: &mut [&mut [f32]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if path == KernelPath::Avx512
        && w.format() == WeightFormat::Q4_0
        && xqs.iter().all(|(q, _)| !q.per_super)
    {
        let xs: Vec<&x86_64::Q40Bytes> = xqs
            .iter()
            .map(|(q, p)| p.q40.get_or_init(|| x86_64::Q40Bytes::new(q)))
            .collect();
        // SAFETY: the path was checked available (AVX2/FMA/F16C and AVX-512F/BW/VNNI present).
        unsafe { x86_64::q40_int8_batch(w, r0, &xs, ys) };
        return true;
    }
    let _ = (path, w, r0, xqs, ys);
    false
}

/// What a path derives from one token's 16-bit activations for its kernels, made at most once per
/// [`crate::Acts`] (on its first use) and shared by every work item and call that uses them: on
/// aarch64 with `dotprod`, the split of `aarch64::Split16` (else each work item of a `matvec`, and
/// each call of `matvec_rows_prepared` on a neuron store's small units, would split the whole
/// vector again). Empty elsewhere.
#[derive(Default)]
pub(crate) struct Prep16 {
    #[cfg(target_arch = "aarch64")]
    split: std::sync::OnceLock<aarch64::Split16>,
    /// The activations in the order of [`KernelPath::Avx512`]'s Q4_0 and Q5_0 kernel.
    #[cfg(target_arch = "x86_64")]
    q40: std::sync::OnceLock<x86_64::Q40Wide>,
    /// The AVX2 K-quant kernels' activation order (`even_odd`), the per-16 sums the Q2_K and Q3_K
    /// ones take (`sums16`) and Q6_K's offsets (`q6k_corr`).
    #[cfg(target_arch = "x86_64")]
    k16: x86_64::K16Prep,
}

/// Quantized weights × 16-bit activations ([`Precision::Fast`](crate::Precision::Fast)); `prep`
/// belongs to `xq` (made for it, or new).
pub(crate) fn matvec_i16(
    path: KernelPath,
    w: &QMatrix<'_>,
    sel: Rows<'_>,
    xq: &QActs16,
    prep: &Prep16,
    y: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            let wide = path == KernelPath::Avx512;
            let q40 = (wide && x86_64::q40_takes_matrix(w.format()))
                .then(|| prep.q40.get_or_init(|| x86_64::Q40Wide::new(xq)));
            // SAFETY: the path was checked available (AVX2/FMA/F16C present, and AVX-512F/BW/VNNI
            // on the Avx512 path); `q40` and `prep.k16` belong to `xq`.
            unsafe { x86_64::matvec_i16(w, sel, xq, y, wide, q40, &prep.k16) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            let split = (path != KernelPath::Neon && aarch64::takes_split(w.format())).then(|| {
                // SAFETY: NEON, all `Split16::new` needs, is baseline on aarch64.
                prep.split
                    .get_or_init(|| unsafe { aarch64::Split16::new(xq) })
            });
            // SAFETY: NEON is baseline on every aarch64 target; the NeonDotprod and NeonI8mm
            // paths are only used after run-time detection of `dotprod` (and `i8mm`).
            unsafe { aarch64::matvec_i16(w, sel, xq, y, path, split) }
        }
        _ => {
            let _ = prep;
            scalar::matvec_i16(w, sel, xq, y)
        }
    }
}

/// The 16-bit activations of a batch's tokens, as the path's batch kernel takes them: on
/// [`KernelPath::Avx512`] also in the orders of its batch kernels (`x86_64::Interleaved`), built
/// once per batched product for all its matrices.
pub(crate) struct Batch16<'a> {
    tokens: Vec<&'a QActs16>,
    #[cfg(target_arch = "x86_64")]
    wide: x86_64::Interleaved,
    /// Per token, the AVX2 K-quant kernels' orders, made on first use and shared by every work
    /// item of the product.
    #[cfg(target_arch = "x86_64")]
    k16: Vec<x86_64::K16Prep>,
}

impl<'a> Batch16<'a> {
    /// The tokens' activations, in the orders the path's batch kernels take for the formats of
    /// the product's matrices (`formats`).
    pub(crate) fn new(
        path: KernelPath,
        tokens: Vec<&'a QActs16>,
        formats: &[WeightFormat],
    ) -> Self {
        #[cfg(target_arch = "x86_64")]
        let wide = if path == KernelPath::Avx512 {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present on Avx512).
            unsafe { x86_64::Interleaved::new(&tokens, formats) }
        } else {
            x86_64::Interleaved::default()
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (path, formats);
        Batch16 {
            #[cfg(target_arch = "x86_64")]
            k16: tokens.iter().map(|_| x86_64::K16Prep::default()).collect(),
            tokens,
            #[cfg(target_arch = "x86_64")]
            wide,
        }
    }
}

/// [`matvec_i16`] of rows `r0..r0 + ys[t].len()` for several tokens' activations (`xq.tokens[t]`
/// → `ys[t]`), each token's results bit-identical to its own [`matvec_i16`]: AVX2, AVX-512 and NEON
/// share each weight block's unpacking across tokens (32-element block formats), AVX-512 also each
/// `Q4_K`/`Q5_K`/`Q6_K` super-block's (on AVX2 too); the scalar path runs one call per token.
pub(crate) fn matvec_i16_batch(
    path: KernelPath,
    w: &QMatrix<'_>,
    r0: usize,
    xq: &Batch16<'_>,
    ys: &mut [&mut [f32]],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            let wide = path == KernelPath::Avx512;
            // SAFETY: the path was checked available (AVX2/FMA/F16C present, and AVX-512F/BW/VNNI
            // on the Avx512 path); `xq.wide` is built from `xq.tokens` (`Batch16::new`).
            unsafe { x86_64::matvec_i16_batch(w, r0, &xq.tokens, &xq.wide, &xq.k16, ys, wide) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target; the NeonDotprod and NeonI8mm
            // paths are only used after run-time detection of `dotprod`.
            unsafe { aarch64::matvec_i16_batch(w, r0, &xq.tokens, ys, path) }
        }
        _ => {
            for (q, y) in xq.tokens.iter().zip(ys.iter_mut()) {
                matvec_i16(path, w, Rows::From(r0), q, &Prep16::default(), y);
            }
        }
    }
}

pub(crate) use attend_block::LANES;

/// [`attend_block::attend_block`] under the path's target features.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_block(
    path: KernelPath,
    q: &[f32],
    lens: &[usize],
    starts: &[usize],
    hd: usize,
    kt: &[f32],
    nkp: usize,
    v: &[f32],
    scale: f32,
    s: &mut Vec<f32>,
    out: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma => {
            // SAFETY: the path was checked available (AVX2/FMA present).
            unsafe { x86_64::attend_block_avx2(q, lens, starts, hd, kt, nkp, v, scale, s, out) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX-512F on top of AVX2/FMA).
            unsafe { x86_64::attend_block_avx512(q, lens, starts, hd, kt, nkp, v, scale, s, out) }
        }
        // NEON and FMA are baseline on aarch64: the generic code vectorizes as it is.
        _ => attend_block::attend_block(q, lens, starts, hd, kt, nkp, v, scale, s, out),
    }
}

pub(crate) fn dot_f32(path: KernelPath, a: &[f32], b: &[f32]) -> f32 {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA present).
            unsafe { x86_64::dot_f32(a, b) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target (and the
            // dotprod variant is only selected after run-time detection).
            unsafe { aarch64::dot_f32(a, b) }
        }
        _ => scalar::dot_f32(a, b),
    }
}

/// Whether AVX-512DQ is present too (`vcvtps2qq`, for `add_fixed`).
#[cfg(target_arch = "x86_64")]
fn has_avx512dq() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| has_avx512() && is_x86_feature_detected!("avx512dq"))
}

pub(crate) fn add_fixed(path: KernelPath, acc: &mut [i64], x: &mut [f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 if has_avx512dq() => {
            // SAFETY: the path was checked available (AVX-512F and AVX2) and DQ just above.
            unsafe { x86_64::add_fixed(acc, x) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2 on both).
            unsafe { x86_64::add_fixed_avx2(acc, x) }
        }
        KernelPath::Scalar => scalar::add_fixed(acc, x),
        _ => scalar::add_fixed_portable(acc, x),
    }
}

/// `gate = silu(gate) · up` over the common prefix.
pub(crate) fn silu_mul(path: KernelPath, gate: &mut [f32], up: &[f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present).
            unsafe { x86_64::silu_mul(gate, up) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target.
            unsafe { aarch64::silu_mul(gate, up) }
        }
        _ => scalar::silu_mul(gate, up),
    }
}

/// `x = exp(x - max)`.
pub(crate) fn exp_sub(path: KernelPath, x: &mut [f32], max: f32) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present).
            unsafe { x86_64::exp_sub(x, max) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target.
            unsafe { aarch64::exp_sub(x, max) }
        }
        _ => scalar::exp_sub(x, max),
    }
}

pub(crate) fn axpy_f32(path: KernelPath, alpha: f32, x: &[f32], y: &mut [f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA present).
            unsafe { x86_64::axpy_f32(alpha, x, y) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target (and the
            // dotprod variant is only selected after run-time detection).
            unsafe { aarch64::axpy_f32(alpha, x, y) }
        }
        _ => scalar::axpy_f32(alpha, x, y),
    }
}

/// `y += c * dequant(src)`: `src` holds exactly `format.row_bytes(y.len())`
/// bytes (for quantized formats `y.len()` is a multiple of 32).
pub(crate) fn axpy_row(path: KernelPath, format: WeightFormat, c: f32, src: &[u8], y: &mut [f32]) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present);
            // the kernel asserts the lengths.
            unsafe { x86_64::axpy_row(format, c, src, y) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target (and the
            // dotprod variant is only selected after run-time detection).
            unsafe { aarch64::axpy_row(format, c, src, y) }
        }
        _ => scalar::axpy_row(format, c, src, y),
    }
}

/// `ys += c * W[c0 .. c0 + ys.len()]` for an I4Hybrid row (`row` the whole
/// row of `cols` elements, `c0` and `ys.len()` multiples of 32): the column
/// range of one `axpy_rows` work item. Hybrid rows keep their outliers after
/// the nibbles, so the kernels get the whole row, not a byte range.
#[allow(clippy::too_many_arguments)]
pub(crate) fn axpy_hybrid(
    path: KernelPath,
    k: usize,
    c: f32,
    row: &[u8],
    cols: usize,
    c0: usize,
    ys: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present);
            // the kernel slices and asserts the lengths it relies on.
            unsafe { x86_64::axpy_hybrid(k, c, row, cols, c0, ys) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target (and the
            // dotprod variant is only selected after run-time detection).
            unsafe { aarch64::axpy_hybrid(k, c, row, cols, c0, ys) }
        }
        _ => scalar::axpy_hybrid(k, c, row, cols, c0, ys),
    }
}

/// `acc += fixed(Σ coeffs[k] · row(rows[k]))` over whole rows, where the path has a fused
/// kernel for the format and row count (the same integers as `axpy_rows` into a zeroed vector
/// followed by `add_fixed`). Returns `false` when it has none.
pub(crate) fn axpy_rows_fixed(
    path: KernelPath,
    w: &QMatrix<'_>,
    rows: &[u32],
    coeffs: &[f32],
    acc: &mut [i64],
) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 if has_avx512dq() => {
            let (f, d, rb, c) = (w.format(), w.data(), w.row_bytes(), w.cols());
            // SAFETY: the path was checked available (AVX-512F and AVX2) and DQ just above;
            // the kernel asserts every bound it relies on.
            unsafe { x86_64::axpy_rows_fixed_dq(f, d, rb, c, rows, coeffs, acc) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            let (f, d, rb, c) = (w.format(), w.data(), w.row_bytes(), w.cols());
            // SAFETY: the path was checked available (AVX2/FMA/F16C present);
            // the kernel asserts every bound it relies on.
            unsafe { x86_64::axpy_rows_fixed(f, d, rb, c, rows, coeffs, acc) }
        }
        _ => {
            let _ = (w, rows, coeffs, acc);
            false
        }
    }
}

/// The whole of one `axpy_rows` column range in one call, where the path has
/// a tiled kernel for the format (`b0`: byte offset of the range in each row).
/// Returns `false` when it has none: the caller then goes row by row.
pub(crate) fn axpy_rows_tiled(
    path: KernelPath,
    w: &QMatrix<'_>,
    b0: usize,
    rows: &[u32],
    coeffs: &[f32],
    y: &mut [f32],
) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma | KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX2/FMA/F16C present);
            // the kernel asserts every bound it relies on.
            unsafe {
                x86_64::axpy_rows_tiled(w.format(), w.data(), w.row_bytes(), b0, rows, coeffs, y)
            }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            aarch64::axpy_rows_tiled(w.format(), w.data(), w.row_bytes(), b0, rows, coeffs, y)
        }
        _ => {
            let _ = (w, b0, rows, coeffs, y);
            false
        }
    }
}

/// Software prefetch hint for every cache line of `bytes` (used to fetch the
/// next listed rows of a sparse kernel while the current one is computed:
/// listed rows are not contiguous, so the hardware prefetcher misses them).
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_x86::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes);
    #[cfg(target_arch = "aarch64")]
    for off in (0..bytes.len()).step_by(64) {
        // SAFETY: `off < bytes.len()`, so the address is inside the slice;
        // `prfm` is only a hint: it never faults and writes no register or
        // memory.
        unsafe {
            std::arch::asm!(
                "prfm pldl1keep, [{p}]",
                p = in(reg) bytes.as_ptr().add(off),
                options(nostack, readonly, preserves_flags)
            );
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = bytes;
}

/// [`prefetch`] into L2 only (x86's T1 hint): for data wanted after the work in hand, whose
/// cache lines in L1 a fetch to every level would push out.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn prefetch_l2(bytes: &[u8]) {
    prefetch_x86::<{ std::arch::x86_64::_MM_HINT_T1 }>(bytes);
}

/// Every cache line of `bytes` asked for with `_mm_prefetch`'s hint `HINT`.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_x86<const HINT: i32>(bytes: &[u8]) {
    for off in (0..bytes.len()).step_by(64) {
        // SAFETY: `off < bytes.len()`, so the address is inside the slice;
        // a prefetch is only a hint (never faults, no architectural read)
        // and SSE is baseline on x86_64.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(bytes.as_ptr().add(off) as *const i8) };
    }
}
