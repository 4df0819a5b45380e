//! Prefill's tiles under the path's target features: the f32 tile, the bf16 tile, the integer
//! tiles (8-bit rows as lanes, 16-bit), and which formats each path takes.

use super::*;

pub(crate) fn tile(
    path: KernelPath,
    w: &[f32],
    nr: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma => {
            // SAFETY: the path was checked available (AVX2/FMA present).
            unsafe { x86_64::tile(w, nr, cols, x, n, out) }
        }
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX-512F on top of AVX2/FMA).
            unsafe { x86_64::tile512(w, nr, cols, x, n, out) }
        }
        #[cfg(target_arch = "aarch64")]
        KernelPath::Neon | KernelPath::NeonDotprod | KernelPath::NeonI8mm => {
            // SAFETY: NEON is baseline on every aarch64 target (and the
            // dotprod variant is only selected after run-time detection).
            unsafe { aarch64::tile(w, nr, cols, x, n, out) }
        }
        _ => scalar::tile(w, nr, cols, x, n, out),
    }
}

/// [`tile`] of the `nr` rows of `cols` that `row(i, dst)` writes: on [`KernelPath::Avx512`], whose
/// tile packs dequantized rows a block at a time, each row goes from a one-row buffer into the
/// packed block (no `nr × cols` tile written and read again); elsewhere into a tile that [`tile`]
/// then takes.
pub(crate) fn tile_rows(
    path: KernelPath,
    nr: usize,
    cols: usize,
    row: impl FnMut(usize, &mut [f32]),
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if path == KernelPath::Avx512 {
        // SAFETY: the path was checked available (AVX-512F on top of AVX2/FMA).
        unsafe { x86_64::tile512_rows(nr, cols, row, x, n, out) };
        return;
    }
    tile(path, &rows_tile(nr, cols, row), nr, cols, x, n, out);
}

/// The `nr × cols` tile of the rows that `row(i, dst)` writes.
fn rows_tile(nr: usize, cols: usize, mut row: impl FnMut(usize, &mut [f32])) -> Vec<f32> {
    let mut w = vec![0f32; nr * cols];
    for (i, dst) in w.chunks_exact_mut(cols).enumerate() {
        row(i, dst);
    }
    w
}

/// The products of the `nr` rows of `cols` that `row(i, dst)` writes (the weights dequantized) with
/// `n` tokens: with bf16 activations `xb` (`Int8`'s, where the path has a bf16 tile) on
/// [`tile_bf16`], else on [`tile_rows`] with the f32 activations `x`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile_dequant(
    path: KernelPath,
    nr: usize,
    cols: usize,
    row: impl FnMut(usize, &mut [f32]),
    xb: Option<&[u16]>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let Some(xb) = xb else {
        return tile_rows(path, nr, cols, row, x, n, out);
    };
    let w = rows_tile(nr, cols, row);
    if !tile_bf16(path, &w, nr, cols, xb, n, out) {
        tile(path, &w, nr, cols, x, n, out);
    }
}

/// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` of `x` on the f32 tile ([`tile_dequant`]:
/// with bf16 activations `xb` where given), each row dequantized; an F32 matrix's rows read in
/// place where its bytes are aligned for floats (no copy of every row: 9% of an F32 prompt's time,
/// SYNTHETIC 16x1024x2816 F32, AVX-512, 2026-12-06).
pub(crate) fn tile_f32(
    path: KernelPath,
    (w, r0, nr): (&QMatrix, usize, usize),
    xb: Option<&[u16]>,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let cols = w.cols();
    if let (None, Some(rows)) = (xb, f32_rows(w, r0, nr)) {
        return tile(path, rows, nr, cols, x, n, out);
    }
    let row = |i: usize, dst: &mut [f32]| {
        dequant_row(path, w.format(), w.row_data(r0 + i), dst);
    };
    tile_dequant(path, nr, cols, row, xb, x, n, out);
}

/// Rows `r0 .. r0 + nr` of an F32 matrix `w` as the floats they hold, where its bytes are aligned
/// for them (GGUF aligns its tensors to 32 bytes); `None` for other formats, or unaligned bytes.
fn f32_rows<'a>(w: &QMatrix<'a>, r0: usize, nr: usize) -> Option<&'a [f32]> {
    if w.format() != WeightFormat::F32 || cfg!(target_endian = "big") {
        return None;
    }
    let bytes = &w.data()[r0 * w.row_bytes()..(r0 + nr) * w.row_bytes()];
    // SAFETY: every bit pattern is an f32, and `align_to` puts in the middle only whole,
    // aligned floats; the file's little-endian floats are the target's (big-endian excluded above).
    let (head, floats, tail) = unsafe { bytes.align_to::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(floats)
}

/// Activations `x` (`n` rows of `cols`) rounded for [`tile_bf16`], or `None` where the path has no
/// bf16 tile.
pub(crate) fn bf16_acts(path: KernelPath, x: &[f32], n: usize, cols: usize) -> Option<Vec<u16>> {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX-512F and BF16 present).
            Some(unsafe { x86_64::to_bf16(x, n, cols) })
        }
        _ => {
            let _ = (x, n, cols);
            None
        }
    }
}

/// The bf16 tile: `out[t*nr + i] ≈ dot(w[i], x[t])` with `xb` from [`bf16_acts`]; `false` (and
/// `out` untouched) where the path has none.
pub(crate) fn tile_bf16(
    path: KernelPath,
    w: &[f32],
    nr: usize,
    cols: usize,
    xb: &[u16],
    n: usize,
    out: &mut [f32],
) -> bool {
    match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => {
            // SAFETY: the path was checked available (AVX-512F and BF16 present).
            unsafe { x86_64::tile_bf16(w, nr, cols, xb, n, out) };
            true
        }
        _ => {
            let _ = (w, nr, cols, xb, n, out);
            false
        }
    }
}

/// Whether [`tile_int8`] takes weights of `format` on `path`: Q4_K, Q5_K and Q6_K on
/// [`KernelPath::Avx2Fma`] and [`KernelPath::Avx512`] (activations with one scale per 256,
/// `QActs::quantize_super`), Q2_K and Q3_K on both (one scale per 32, as their `matvec_int8`,
/// which both paths share; AVX2 `tile_k23`, AVX-512 `tile512_k23`), and on both also the formats
/// of 32-element blocks of integer quants, Q4_0, Q4_1, Q5_0, Q5_1, and on AVX-512 Q8_0 ([`tile_int8_blocks`]: one scale per 32,
/// `QActs::quantize` with its sums of 16; AVX-512 `tile512_i8`, AVX2 `tile_i8`); on
/// [`KernelPath::NeonDotprod`] and [`KernelPath::NeonI8mm`] Q4_K, Q5_K and Q6_K and the 32-block
/// formats with IQ4_NL (`sdot` by element, rows in the lanes, `aarch64::tile_i8dp`; with i8mm
/// `smmla`, `aarch64::tile_k8mm` and `aarch64::tile_i8mm`), and Q2_K and Q3_K (`sdot` on both;
/// one scale per 32, as on x86). `Int8` prompts and `Fast` ones from
/// `INT_TILE_MIN_TOKENS` tokens take it (the 32-block formats only from that many in either).
pub(crate) fn has_tile_int8(path: KernelPath, format: WeightFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    if matches!(path, KernelPath::Avx2Fma | KernelPath::Avx512) {
        return matches!(
            format,
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
        ) || tile_int8_blocks(path, format)
            || k23(format);
    }
    #[cfg(target_arch = "aarch64")]
    if matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm) {
        return matches!(
            format,
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
        ) || tile_int8_blocks(path, format)
            || k23(format);
    }
    let _ = (path, format);
    false
}

/// Whether [`tile_int8`] takes `format` on `path` with activations of one scale per 32-block
/// (`QActs::quantize`, with [`crate::quant::QActs::with_sums16`]): the formats of 32-element
/// blocks on [`KernelPath::Avx512`] (and IQ4_XS's sub-blocks of 32 there),
/// [`KernelPath::Avx2Fma`], [`KernelPath::NeonDotprod`] (`sdot`) and [`KernelPath::NeonI8mm`]
/// (`smmla`).
pub(crate) fn tile_int8_blocks(path: KernelPath, format: WeightFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    match path {
        KernelPath::Avx512 => return x86_64::has_tile512_i8(format),
        KernelPath::Avx2Fma => return x86_64::has_tile_i8(format),
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    if matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm) {
        return aarch64::has_tile_i8mm(format);
    }
    let _ = (path, format);
    false
}

/// Rows that [`tile_int8`] and [`tile_i16`] on `path` take together (a work item of a multiple
/// of it wastes nothing): the AVX-512 tiles' two groups of 16 lanes, the AVX2 16-bit tile's two
/// groups of 8, the `smmla` tiles' row pairs, the `sdot` tiles' row quads, one row elsewhere.
pub(crate) fn tile_int_rows(path: KernelPath) -> usize {
    match path {
        #[cfg(target_arch = "aarch64")]
        KernelPath::NeonI8mm => 2,
        #[cfg(target_arch = "aarch64")]
        KernelPath::NeonDotprod => 4,
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => 2 * x86_64::TILE512_LANES,
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2Fma => 2 * x86_64::TILE_K16_LANES,
        _ => 1,
    }
}

/// The 8-bit prompt tile: `out[t * nr + i]` = row `r0 + i` of `w` · token `t` for every token of
/// `acts` (quantized as `matvec` quantizes them in `Int8` for `w`'s format: by
/// `QActs::quantize_super` for Q4_K/Q5_K/Q6_K, by `QActs::quantize` with sums of 16 for the
/// 32-block formats, Q2_K and Q3_K; [`tile_int8_acts`]): on AVX2 the K-quants' (`tile_k8_lanes`,
/// `tile_k23`: rows in the lanes) and the 32-block formats' (`tile_i8`), on AVX-512, with `sdot`
/// on [`KernelPath::NeonDotprod`] and with `smmla` on [`KernelPath::NeonI8mm`], the same integer
/// products as [`matvec_int8`] of that token summed in another f32 order; or, for `Fast` prompts
/// of `crate::fast_prompts_halves`' formats (Q4_0 and Q4_1 on every path with this tile, IQ4_NL
/// and IQ4_XS on AVX-512), activations of one scale per 16 (`QActs::quantize_halves`). Only where
/// [`has_tile_int8`] (else a no-op).
pub(crate) fn tile_int8(
    path: KernelPath,
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    acts: &TileActs8,
    out: &mut [f32],
) {
    if !has_tile_int8(path, w.format()) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let acts = acts.acts.as_slice();
    #[cfg(target_arch = "x86_64")]
    if tile_int8_blocks(path, w.format()) && path == KernelPath::Avx512 {
        // SAFETY: the path was checked available (AVX-512F/BW/VNNI and AVX2/FMA/F16C present),
        // and the format is one the tile takes.
        unsafe { x86_64::tile512_i8(w, r0, nr, acts, out) }
    } else if tile_int8_blocks(path, w.format()) {
        // SAFETY: the path was checked available (AVX2/FMA/F16C present: only it and AVX-512
        // have this tile), and the format is one the tile takes.
        unsafe { x86_64::tile_i8(w, r0, nr, acts, out) }
    } else if k23(w.format()) && path == KernelPath::Avx512 {
        // SAFETY: the path was checked available (AVX-512F/BW/VNNI and AVX2/FMA/F16C present),
        // and the format is one the tile takes.
        unsafe { x86_64::tile512_k23(w, r0, nr, acts, out) }
    } else if k23(w.format()) {
        // SAFETY: the path was checked available (AVX2/FMA/F16C present), and the format is one
        // the tile takes.
        unsafe { x86_64::tile_k23(w, r0, nr, acts, out) }
    } else if path == KernelPath::Avx512 {
        // SAFETY: the path was checked available (AVX-512F/BW/VNNI and AVX2/FMA/F16C present),
        // and the format is one the tile takes.
        unsafe { x86_64::tile512_k8(w, r0, nr, acts, out) }
    } else if matches!(
        w.format(),
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
    ) {
        // SAFETY: the path was checked available (AVX2/FMA/F16C present), and the format is one
        // the tile takes.
        unsafe { x86_64::tile_k8_lanes(w, r0, nr, acts, out) }
    } else {
        // SAFETY: the path was checked available (AVX2/FMA/F16C present), and the format is one
        // the tile takes.
        unsafe { x86_64::tile_k8(w, r0, nr, acts, out) }
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(a) = &acts.arm {
        a.tile(w, r0, nr, out);
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (r0, nr, acts, out);
}

/// Q2_K and Q3_K: the formats whose 8-bit tile (AVX2 `tile_k23`, AVX-512 `tile512_k23`, aarch64
/// `tile_i8dp`) takes activations of one scale per 32 with sums of 16, as their `matvec_int8`
/// does, from any token count (and whose prompts take the `dotprod` tiles on both aarch64 paths).
pub(crate) fn k23(format: WeightFormat) -> bool {
    matches!(format, WeightFormat::Q2_K | WeightFormat::Q3_K)
}

/// One token's activations `x` quantized for [`tile_int8`] on `path` over weights of `format`, as
/// `matvec` quantizes them in `Int8`: one scale per 32 with the sums of 16 for the 32-block
/// formats, Q2_K and Q3_K; one per 256 for Q4_K/Q5_K/Q6_K, with the sums of 16 for Q6_K's offset.
/// (Sums of 16 once per token, not once per work item.)
pub(crate) fn tile_int8_acts(path: KernelPath, format: WeightFormat, x: &[f32]) -> QActs {
    if tile_int8_blocks(path, format) || k23(format) {
        QActs::quantize(path, x).with_sums16()
    } else if format == WeightFormat::Q6_K {
        QActs::quantize_super(path, x).with_sums16()
    } else {
        QActs::quantize_super(path, x)
    }
}

/// Whether `path` has [`tile_int8_t`] (the AVX-512 path).
pub(crate) fn has_tile_int8_t(path: KernelPath) -> bool {
    #[cfg(target_arch = "x86_64")]
    if path == KernelPath::Avx512 {
        return true;
    }
    let _ = path;
    false
}

/// The 8-bit tile over the transpose of `nr` columns of a matrix `W` of `rows` rows (a multiple of
/// 32), which `fill(j0, panel)` writes 32 rows at a time into a row-major f32 panel of 32 rows of
/// `nr` rounded up to 16 (the columns past `nr` left at zero): each column's blocks of 32 rows quantized as 8-bit activations are
/// (`QActs::quantize`), `out[t * nr + i]` = column `i` · token `t` for every token of `acts`
/// (quantized the same way, with sums of 16). Only where [`has_tile_int8_t`] (else a no-op).
pub(crate) fn tile_int8_t(
    path: KernelPath,
    nr: usize,
    rows: usize,
    fill: impl FnMut(usize, &mut [f32]),
    acts: &[QActs],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if has_tile_int8_t(path) {
        // SAFETY: the path was checked available (AVX-512F/BW/VNNI and AVX2/FMA/F16C present).
        unsafe { x86_64::tile512_i8_t(nr, rows, fill, acts, out) };
        return;
    }
    let _ = (path, nr, rows, fill, acts, out);
}

/// Bytes [`tile_int8_t`] allocates on `path` for `nr` columns of `rows` rows and `n` tokens.
pub(crate) fn tile_int8_t_bytes(path: KernelPath, nr: usize, rows: usize, n: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    if has_tile_int8_t(path) {
        return x86_64::tile512_i8_t_bytes(nr, rows, n);
    }
    let _ = (path, nr, rows, n);
    0
}

/// Whether [`tile_i16`] takes weights of `format` on `path`: the AVX-512 path's formats of
/// 32-element blocks of integer quants whose [`Precision::Fast`](crate::Precision) prompts keep 16
/// bits, Q4_0, Q4_1 and Q5_1 (the formats of [`crate::fast_prompts_int8`] take [`tile_int8`]), and
/// IQ4_NL and IQ4_XS (`tile512_k16` on all five); on the AVX2
/// path every format of 32-element blocks of integer quants, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
/// IQ4_NL, and IQ4_XS, of which `matmul` gives it those whose `Fast` prompts keep 16 bits (Q5_0
/// takes [`tile_int8`] first); on [`KernelPath::NeonI8mm`] those and Q4_K/Q5_K (`tile_i16mm`: the
/// activations split into bytes for `smmla` and `usmmla`), on [`KernelPath::NeonDotprod`] the
/// same (`tile_i16dp`: split for `sdot` by element, the low bytes less 128), and on both Q2_K and
/// Q3_K (`tile_i16dp`), of which Q5_0, Q8_0 and the K-quants take [`tile_int8`] first from
/// `INT_TILE_MIN_TOKENS` tokens. The other formats' `Fast` prompts
/// take the f32 tile.
pub(crate) fn has_tile_i16(path: KernelPath, format: WeightFormat) -> bool {
    #[cfg(target_arch = "x86_64")]
    match path {
        KernelPath::Avx512 => return x86_64::has_tile512_k16(format),
        KernelPath::Avx2Fma => return x86_64::has_tile_k16(format),
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    match path {
        KernelPath::NeonI8mm => return aarch64::has_tile_i16mm(format) || k23(format),
        KernelPath::NeonDotprod => return aarch64::has_tile_i16dp(format),
        _ => {}
    }
    let _ = (path, format);
    false
}

/// The 16-bit prompt tile (AVX-512: `tile512_k16`, AVX2: `tile_k16`, NEON with i8mm:
/// `tile_i16mm`, with dotprod: `tile_i16dp`): `out[t * nr + i]` = row
/// `r0 + i` of `w` · token `t` for every token of `acts` (quantized as `matvec` quantizes them in
/// `Fast`): the integer products of [`matvec_i16`], summed in another f32 order. Only where [`has_tile_i16`] (else a no-op).
pub(crate) fn tile_i16(
    path: KernelPath,
    w: &QMatrix<'_>,
    r0: usize,
    nr: usize,
    acts: &TileActs16,
    out: &mut [f32],
) {
    if !has_tile_i16(path, w.format()) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    let acts = acts.acts.as_slice();
    #[cfg(target_arch = "x86_64")]
    if path == KernelPath::Avx512 && x86_64::has_tile512_k16(w.format()) {
        // SAFETY: the path was checked available (AVX-512F/BW/VNNI and AVX2/FMA/F16C present),
        // and the format is one the tile takes.
        unsafe { x86_64::tile512_k16(w, r0, nr, acts, out) }
    } else {
        // SAFETY: the path was checked available (AVX2/FMA/F16C present: `has_tile_i16` is false
        // on every path but the two x86 ones, and on AVX-512 every format it takes is
        // `tile512_k16`'s), and the format is one the tile takes.
        unsafe { x86_64::tile_k16(w, r0, nr, acts, out) }
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(a) = &acts.arm {
        a.tile(w, r0, nr, out);
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (r0, nr, acts, out);
}

/// A prompt's 8-bit activations ([`tile_int8_acts`]) as `path`'s [`tile_int8`] reads them,
/// prepared once per product rather than once per work item: on aarch64 the `smmla` tiles' token
/// pairs or the `sdot` tile's token quads, on x86 the activations themselves.
pub(crate) struct TileActs8 {
    #[cfg(not(target_arch = "aarch64"))]
    acts: Vec<QActs>,
    #[cfg(target_arch = "aarch64")]
    arm: Option<aarch64::Acts8>,
}

impl TileActs8 {
    /// `acts` (a prompt's tokens, quantized) for `path`'s tile over weights of `format`.
    pub(crate) fn new(path: KernelPath, format: WeightFormat, acts: Vec<QActs>) -> Self {
        #[cfg(target_arch = "aarch64")]
        return TileActs8 {
            arm: aarch64::Acts8::new(path, format, &acts),
        };
        #[cfg(not(target_arch = "aarch64"))]
        {
            let _ = (path, format);
            TileActs8 { acts }
        }
    }
}

/// A prompt's 16-bit activations (`QActs16::quantize`) as `path`'s [`tile_i16`] reads them, as
/// [`TileActs8`].
pub(crate) struct TileActs16 {
    #[cfg(not(target_arch = "aarch64"))]
    acts: Vec<QActs16>,
    #[cfg(target_arch = "aarch64")]
    arm: Option<aarch64::Acts16>,
}

impl TileActs16 {
    /// `acts` (a prompt's tokens, quantized) for `path`'s tile over weights of `format`.
    pub(crate) fn new(path: KernelPath, format: WeightFormat, acts: Vec<QActs16>) -> Self {
        #[cfg(target_arch = "aarch64")]
        return TileActs16 {
            arm: aarch64::Acts16::new(path, format, &acts),
        };
        #[cfg(not(target_arch = "aarch64"))]
        {
            let _ = (path, format);
            TileActs16 { acts }
        }
    }
}
