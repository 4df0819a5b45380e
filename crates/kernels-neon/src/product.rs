//! [`Product`]: one matrix product of a step with its activations prepared once, run by row chunks
//! from any work item: what [`crate::matvec`], [`crate::matvec_batch`] and [`crate::matmul()`] do
//! inside their own parallel region, taken apart so that one region can run the row chunks of
//! many products ([`crate::experts_ffn`]). Each row chunk gives what those entry points give for
//! it, bit for bit, when it is cut as they cut it ([`Product::chunk`]).

use crate::arch;
use crate::matmul::{int8_prompt, int8_prompt_acts, takes_tile_i16, INT_ITEM_BYTES};
use crate::quant::QActs16;
use crate::{
    matmul_chunk, matvec_chunk, Acts, KernelPath, Precision, QMatrix, WeightFormat,
    INT_TILE_MIN_TOKENS,
};

/// A product's activations, in the form its kernel takes.
pub(crate) enum Product {
    /// Each token by the decode kernel (`matvec` of one token; a batched decode step, whose
    /// `matvec_batch` gives each token `matvec`'s bits; `Ggml` prompts).
    PerToken(Vec<Acts>),
    /// The 8-bit prompt tile (`arch::tile_int8`).
    Int8(arch::TileActs8),
    /// The 16-bit prompt tile (`arch::tile_i16`).
    I16(arch::TileActs16),
    /// The f32 tile of dequantized rows (`arch::tile`), or the bf16 one with these activations.
    F32(Option<Vec<u16>>),
}

impl Product {
    /// The product of `w` with the `m` tokens of `x` (token-major rows of `w.cols()`), prepared as
    /// [`crate::matvec`] (one token), [`crate::matvec_batch`] (`decode`) or [`crate::matmul()`]
    /// (a prompt's tokens) prepares it. `w` must have at least one column.
    pub(crate) fn new(
        path: KernelPath,
        w: &QMatrix,
        x: &[f32],
        m: usize,
        precision: Precision,
        decode: bool,
    ) -> Product {
        let (format, cols) = (w.format(), w.cols());
        let tokens = || x.chunks_exact(cols).take(m);
        if Self::per_token(path, format, m, precision, decode) {
            return Product::PerToken(
                tokens()
                    .map(|xt| Acts::new(path, format, xt, precision))
                    .collect(),
            );
        }
        // `matmul_with`'s choice of tile, in its order.
        if let Some(halves) = int8_prompt(path, format, m, precision) {
            let quantize = |xt: &[f32]| int8_prompt_acts(path, format, halves, xt);
            return Product::Int8(arch::TileActs8::new(
                path,
                format,
                tokens().map(quantize).collect(),
            ));
        }
        if precision == Precision::Fast && takes_tile_i16(path, format, m) {
            let acts = tokens().map(|xt| QActs16::quantize(path, xt)).collect();
            return Product::I16(arch::TileActs16::new(path, format, acts));
        }
        Product::F32(match precision {
            Precision::Int8 => arch::bf16_acts(path, x, m, cols),
            _ => None,
        })
    }

    /// Whether the product of `m` tokens with weights of `format` is a [`Product::PerToken`] (the
    /// decode kernels): one token, a decode step, `Ggml`, or a `Fast` prompt's group of fewer than
    /// [`INT_TILE_MIN_TOKENS`] where [`crate::matmul()`] would take no integer tile (on aarch64
    /// with `dotprod` it takes the 16-bit one from [`crate::short_prompt_tokens`], 8: the SYNTHETIC
    /// OLMoE-shaped 4-layer Q4_0 file's prompt, 64 vs 32 tokens, about 8 tokens an expert, counted
    /// 79.82M -> 65.60M guest instructions a token under `qemu-aarch64 -cpu max`, 2026-12-07; and
    /// for Q4_0/Q4_1 the 8-bit one with a scale per 16 from [`crate::halves_min_tokens`], 8 there:
    /// 62.32M -> 56.99M, stop 90).
    pub(crate) fn per_token(
        path: KernelPath,
        format: WeightFormat,
        m: usize,
        precision: Precision,
        decode: bool,
    ) -> bool {
        let small = precision == Precision::Fast
            && m < INT_TILE_MIN_TOKENS
            && !takes_tile_i16(path, format, m)
            && int8_prompt(path, format, m, precision).is_none()
            && small_groups_batched();
        m == 1 || decode || precision == Precision::Ggml || small
    }

    /// The batch kernel's view of a [`Product::PerToken`] of several tokens' 16-bit activations
    /// (as [`crate::matvec_batch`] builds it: each token's products bit for bit `matvec`'s, the
    /// weights unpacked once for all), for matrices of `formats`.
    pub(crate) fn batch(
        &self,
        path: KernelPath,
        formats: &[WeightFormat],
    ) -> Option<arch::Batch16<'_>> {
        let Product::PerToken(acts) = self else {
            return None;
        };
        if acts.len() < 2 {
            return None;
        }
        let qs: Option<Vec<&QActs16>> = acts
            .iter()
            .map(|a| match a {
                Acts::I16(q, _) => Some(q),
                _ => None,
            })
            .collect();
        qs.map(|qs| arch::Batch16::new(path, qs, formats))
    }

    /// Rows per work item: those of the entry point that would run this product alone, so each
    /// row chunk (and so each output) is cut as it cuts them.
    pub(crate) fn chunk(&self, path: KernelPath, w: &QMatrix) -> usize {
        let rows = w.rows().max(1);
        match self {
            Product::PerToken(_) => matvec_chunk(rows),
            Product::F32(_) => matmul_chunk(),
            Product::Int8(_) | Product::I16(_) => {
                let row_bytes = w.row_data(0).len().max(1);
                let threads = rayon::current_num_threads().max(1);
                match crate::chunk_rows_setting() {
                    0 => (INT_ITEM_BYTES / row_bytes)
                        .min(rows.div_ceil(threads * 4))
                        .max(1),
                    n => n,
                }
                .next_multiple_of(arch::tile_int_rows(path))
            }
        }
    }

    /// `out[t * nr + i]` = row `r0 + i` of `w` · token `t` of `x` (the tokens this product was
    /// prepared for), for `nr = out.len() / m` rows; `batch` is [`Product::batch`]'s view.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run(
        &self,
        path: KernelPath,
        w: &QMatrix,
        x: &[f32],
        m: usize,
        r0: usize,
        out: &mut [f32],
        batch: Option<&arch::Batch16<'_>>,
    ) {
        let (cols, nr) = (w.cols(), out.len() / m.max(1));
        match self {
            Product::PerToken(_) if batch.is_some() => {
                let mut outs: Vec<&mut [f32]> = out.chunks_mut(nr).collect();
                if let Some(b) = batch {
                    arch::matvec_i16_batch(path, w, r0, b, &mut outs);
                }
            }
            Product::PerToken(acts) => {
                let mut outs: Vec<&mut [f32]> = out.chunks_mut(nr).collect();
                Acts::run_tokens(acts, path, w, r0, x, &mut outs);
            }
            Product::Int8(acts) => {
                out.fill(0.0);
                arch::tile_int8(path, w, r0, nr, acts, out)
            }
            Product::I16(acts) => {
                out.fill(0.0);
                arch::tile_i16(path, w, r0, nr, acts, out)
            }
            Product::F32(xb) => {
                out.fill(0.0);
                arch::tile_f32(path, (w, r0, nr), xb.as_deref(), &x[..m * cols], m, out);
            }
        }
    }
}

/// Whether a prompt's groups of fewer than [`INT_TILE_MIN_TOKENS`] tokens in [`Precision::Fast`]
/// (where `matmul` takes no 16-bit tile for them: [`Product::per_token`]) take the decode kernels
/// (`Fast` decode's activations, [`crate::matvec_batch`]'s kernel) rather than [`crate::matmul()`]'s
/// f32 tile: unless `SPARROW_MOE_GROUPS=tile` (read once). That bound is 32 on every path, where a
/// dense prompt's is 8 off x86 ([`crate::short_prompt_tokens`]): on aarch64 an
/// expert group's decode kernels executed fewer instructions than the tile up to about 16 tokens
/// a group (a prompt's guest instructions beyond one token's under `qemu-aarch64 -cpu max`, one
/// thread, the SYNTHETIC OLMoE-shaped one-layer Q4_0 file, 64 experts, top 8; prompts of 16, 32,
/// 64, 128 tokens, about 2, 4, 8, 16 tokens an expert: 574M against 773M, 1175M against 1457M,
/// 2303M against 2544M, 4534M against 4536M; 2026-12-06).
fn small_groups_batched() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !crate::path::env_says("SPARROW_MOE_GROUPS", "tile"))
}
