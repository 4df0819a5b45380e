//! [`CpuAccelerator`]: the accelerator backend on the CPU cores, with the batched dense kernels
//! (gate and up rows in the model's own format when it has whole rows of blocks, down columns
//! re-quantized to `Q8_0`; 16-bit activations), so that scheduling work between an accelerator and
//! sparse CPU work is measurable here.
//!
//! The down columns are kept as a `d_model × neurons` matrix (`matvec_batch` reads it once for every
//! token of a step; a prefix of the block multiplies zeros past its end) and, for a block whose
//! steps may run a prefix ([`FfnBlock::prefixes`]: in memory, not over a neuron store), once more as
//! one row per neuron for one-token steps, where a prefix multiplies only its own rows (`axpy_rows`;
//! one token's step at a small prefix would otherwise read the whole block's down).

use kernels_neon::{Precision, QMatrix, WeightFormat};

use crate::{kernel, AccelError, Accelerator, Activation, FfnBlock, Result, StreamedRows};

/// One layer's block: gate and up (`neurons × d_model`) in `format`, down in `Q8_0`:
/// `d_model × padded` (the block's neurons zero-padded to a whole number of 32-element blocks) and,
/// where steps may run a prefix, transposed, `neurons × d_model` (row `j`: neuron `j`'s down
/// column; empty otherwise).
struct CpuBlock {
    format: WeightFormat,
    neurons: usize,
    padded: usize,
    d_model: usize,
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
    down_t: Vec<u8>,
    /// `0, 1, ..., neurons - 1`: the rows of a prefix, for `axpy_rows`.
    iota: Vec<u32>,
    activation: Activation,
}

/// The CPU backend: one `Q8_0` block per layer.
pub struct CpuAccelerator {
    blocks: Vec<CpuBlock>,
}

const FORMAT: WeightFormat = WeightFormat::Q8_0;

/// The format the block keeps gate and up rows in when the file's rows are in `f`.
fn kept_format(f: WeightFormat) -> WeightFormat {
    if f.is_quantized() && !f.is_hybrid() {
        f
    } else {
        FORMAT
    }
}

impl CpuAccelerator {
    /// Re-quantizes `blocks` (one per layer, in order) for the CPU kernels.
    pub fn new(blocks: impl IntoIterator<Item = Result<FfnBlock>>) -> Result<CpuAccelerator> {
        let blocks = blocks
            .into_iter()
            .map(|b| {
                let b = b?;
                let (h, d) = (b.neurons, b.d_model);
                if d % 32 != 0 {
                    return Err(AccelError::Request(format!(
                        "cpu accelerator: the model width {d} is not a multiple of 32"
                    )));
                }
                let padded = h.next_multiple_of(32);
                let mut down = vec![0f32; d * padded];
                if h > 0 {
                    for (dst, src) in down.chunks_exact_mut(padded).zip(b.down.chunks_exact(h)) {
                        dst[..h].copy_from_slice(src);
                    }
                }
                let q = |v: &[f32], rows, cols| {
                    kernels_neon::quantize_matrix(FORMAT, v, rows, cols)
                        .map_err(kernel("cpu accelerator block"))
                };
                // The file's rows as they are (same bytes as the CPU engine reads), except the
                // formats the integer kernels do not take.
                let f = b.file_rows.format;
                let (format, gate, up) = if kept_format(f) == f {
                    (f, b.file_rows.gate, b.file_rows.up)
                } else {
                    (FORMAT, q(&b.gate, h, d)?, q(&b.up, h, d)?)
                };
                Ok(CpuBlock {
                    format,
                    neurons: h,
                    padded,
                    d_model: d,
                    gate,
                    up,
                    down: q(&down, d, padded)?,
                    down_t: if b.prefixes {
                        q(&crate::transpose_f32(&b.down, d, h), h, d)?
                    } else {
                        Vec::new()
                    },
                    iota: (0..h as u32).collect(),
                    activation: b.activation,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CpuAccelerator { blocks })
    }
}

fn matrix(format: WeightFormat, data: &[u8], rows: usize, cols: usize) -> Result<QMatrix<'_>> {
    QMatrix::new(format, rows, cols, data).map_err(kernel("cpu accelerator block"))
}

fn product(w: &QMatrix<'_>, x: &[f32], n: usize, y: &mut [f32]) -> Result<()> {
    kernels_neon::matvec_batch(w, x, n, y, Precision::Fast).map_err(kernel("cpu accelerator"))
}

impl Accelerator for CpuAccelerator {
    fn name(&self) -> &str {
        "cpu"
    }

    fn ffn(
        &self,
        layer: usize,
        neurons: usize,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let b = self.blocks.get(layer).ok_or_else(|| {
            AccelError::Request(format!("cpu accelerator: no block for layer {layer}"))
        })?;
        let d = b.d_model;
        crate::check_prefix("cpu", layer, neurons, b.neurons)?;
        // The block's first `h` gate and up rows (whole rows of the format); for one token its
        // first `h` down rows, for several every down column (the hidden values past `h` zero).
        let h = neurons;
        if h == 0 {
            out.fill(0.0);
            return Ok(());
        }
        let row_bytes = b.gate.len() / b.neurons;
        let mut g = vec![0f32; n * h];
        let mut u = vec![0f32; n * h];
        // Gate and up in one parallel region, each token's activations quantized once.
        let (gw, uw) = (
            matrix(b.format, &b.gate[..h * row_bytes], h, d)?,
            matrix(b.format, &b.up[..h * row_bytes], h, d)?,
        );
        kernels_neon::matvec_batch_many(&[&gw, &uw], x, n, &mut [&mut g, &mut u], Precision::Fast)
            .map_err(kernel("cpu accelerator"))?;
        kernels_neon::act_mul_inplace(b.activation, &mut g, &u);
        if n == 1 && !b.down_t.is_empty() {
            let down_t = matrix(FORMAT, &b.down_t[..h * b.down_t.len() / b.neurons], h, d)?;
            out.fill(0.0);
            return kernels_neon::axpy_rows(&down_t, &b.iota[..h], &g, out)
                .map_err(kernel("cpu accelerator"));
        }
        let hidden = if b.padded == h {
            g
        } else {
            let mut p = vec![0f32; n * b.padded];
            for (dst, src) in p.chunks_exact_mut(b.padded).zip(g.chunks_exact(h)) {
                dst[..h].copy_from_slice(src);
            }
            p
        };
        product(&matrix(FORMAT, &b.down, d, b.padded)?, &hidden, n, out)
    }

    fn block_neurons(&self, layer: usize) -> usize {
        self.blocks.get(layer).map_or(0, |b| b.neurons)
    }

    /// Gate and up rows, the padded down matrix, and the prefix rows' indices (a whole block keeps
    /// no down rows).
    fn block_bytes(&self, neurons: usize, d_model: usize, format: WeightFormat) -> u64 {
        let rows =
            |f: WeightFormat, n: usize, cols: usize| (n * f.row_bytes(cols).unwrap_or(0)) as u64;
        2 * rows(kept_format(format), neurons, d_model)
            + rows(FORMAT, d_model, neurons.next_multiple_of(32))
            + 4 * neurons as u64
    }

    /// The prompt kernels over the rows as the store keeps them (what a prompt step over the store
    /// computes on the CPU, every neuron of the chunk).
    fn ffn_rows(
        &self,
        rows: &StreamedRows<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let (k, _) = rows.shape("cpu", x, n, out)?;
        let mut g = vec![0f32; n * k];
        let mut u = vec![0f32; n * k];
        let err = || kernel("cpu accelerator streamed rows");
        kernels_neon::matmul(&rows.gate, x, n, &mut g, Precision::Fast).map_err(err())?;
        kernels_neon::matmul(&rows.up, x, n, &mut u, Precision::Fast).map_err(err())?;
        kernels_neon::act_mul_inplace(rows.activation, &mut g, &u);
        kernels_neon::matmul_t(&rows.down, &g, n, out, Precision::Fast).map_err(err())
    }

    /// Nothing more: the same buffers and kernels as the CPU's streamed prompt step.
    fn streamed_bytes(&self, _neurons: usize, _d_model: usize) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileRows;

    /// A block of `h` neurons of width 64 with its file rows in `format`.
    fn block(h: usize, format: WeightFormat, prefixes: bool) -> FfnBlock {
        let d = 64;
        let v = |salt: usize, len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 31 + salt) % 17) as f32 / 17.0 - 0.5)
                .collect()
        };
        let (gate, up) = (v(1, h * d), v(2, h * d));
        let q = |x: &[f32]| kernels_neon::quantize_matrix(format, x, h, d).unwrap();
        FfnBlock {
            neurons: h,
            d_model: d,
            file_rows: FileRows {
                format,
                gate: q(&gate),
                up: q(&up),
            },
            gate,
            up,
            down: v(3, d * h),
            activation: Activation::Silu,
            prefixes,
        }
    }

    /// What a neuron store's budget leaves for a block (run whole) is what it holds.
    #[test]
    fn block_bytes_are_what_a_block_holds() {
        for format in [WeightFormat::Q4_0, WeightFormat::Q8_0, WeightFormat::F16] {
            for h in [1, 32, 45] {
                let a = CpuAccelerator::new([Ok(block(h, format, false))]).unwrap();
                let b = &a.blocks[0];
                assert!(b.down_t.is_empty());
                let held = b.gate.len() + b.up.len() + b.down.len() + b.down_t.len() + 4 * h;
                assert_eq!(
                    a.block_bytes(h, 64, format),
                    held as u64,
                    "{format:?} × {h}"
                );
            }
        }
    }

    /// A block kept whole (no down rows) gives one token what a block kept for prefixes gives for
    /// the whole block, and the latter's prefixes are its first neurons alone.
    #[test]
    fn a_whole_block_without_down_rows_computes_the_same_ffn() {
        let (h, d) = (45, 64);
        let x: Vec<f32> = (0..d).map(|i| (i as f32 * 0.37).sin()).collect();
        let whole = CpuAccelerator::new([Ok(block(h, WeightFormat::Q4_0, false))]).unwrap();
        let pre = CpuAccelerator::new([Ok(block(h, WeightFormat::Q4_0, true))]).unwrap();
        assert!(!pre.blocks[0].down_t.is_empty());
        let run = |a: &CpuAccelerator, k: usize| {
            let mut out = vec![0f32; d];
            a.ffn(0, k, &x, 1, &mut out).unwrap();
            out
        };
        let (a, b) = (run(&whole, h), run(&pre, h));
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0);
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 0.02 * scale, "{p} vs {q}");
        }
        // A prefix of 10 neurons on both forms: the same within the same tolerance.
        let (a, b) = (run(&whole, 10), run(&pre, 10));
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 0.02 * scale, "{p} vs {q}");
        }
    }
}
