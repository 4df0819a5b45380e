//! Rows of the 32-element nibble formats (Q4_0, IQ4_NL, Q5_0, Q4_1, Q5_1: an f16 scale, a min for
//! the last two, 32 nibbles a block, the fifth bits of the Q5s beside), of Q4_K, Q5_K, Q6_K and of
//! Q8_0 repacked eight at a time, for the one-token product ([`crate::Precision::Fast`]) on the
//! AVX2 and AVX-512 paths and the aarch64 ones with `dotprod`, and for several tokens'
//! ([`Q40x8::matvec_batch`]): a group block holds the 8 rows' f16 scales together (and their
//! mins), then their quants interleaved so that one load feeds the same weights of several rows,
//! then (Q5_0, Q5_1) their fifth bits in the kernel's order (layout in `arch/x86_64/q40x8.rs`,
//! which `arch/aarch64/q40x8.rs` reads too; Q4_K's and Q5_K's group super-blocks in
//! `q40x8/q4k.rs`, which `arch/x86_64/q4kx8.rs` and `arch/aarch64/q4kx8.rs` read; Q6_K's in
//! `q40x8/q6k.rs`, which `arch/x86_64/q6kx8.rs` and `arch/aarch64/q6kx8.rs` read; Q8_0's quads of
//! rows in `arch/aarch64/q80x8.rs`, which `arch/x86_64/q80x8.rs` reads too). The same bytes as the
//! file's: a copy made once, whose [`Q40x8::bytes`] the caller counts against its memory budget.
//!
//! [`Q40x8::matvec_with`] gives, bit for bit, what [`crate::matvec_with`] gives for the original
//! matrix in [`crate::Precision::Fast`] on the paths [`Q40x8::exact_on`] names (the order of the
//! original's one-row kernel: `q40_pairs`, Q4_K's and Q5_K's `q4k_i16_rows` or Q6_K's
//! `q6k_i16_rows` on [`KernelPath::Avx2Fma`], and for Q4_0 and IQ4_NL [`KernelPath::Avx512`] too;
//! Q8_0's `dot_i16_rows` on both x86 paths; the split rows of `arch/aarch64/matvec_split.rs` for
//! Q8_0 and the nibble formats, of `arch/aarch64/kquant_split.rs` for Q4_K, Q5_K and Q6_K, on
//! [`KernelPath::NeonDotprod`] and [`KernelPath::NeonI8mm`]); other paths take a scalar loop over
//! the same layout (the scalar reference's per-block products, its tolerance).

use rayon::prelude::*;

use crate::arch::tags::{self, has_min};
use crate::out_rows::OutPtr;
use crate::path::matvec_chunk;
use crate::quant::QActs16;
use crate::{check_len, check_path, KernelError, KernelPath, QMatrix, WeightFormat};
use dots::group_dots;
use tokens::{group_dots_tokens, pair_dots_tokens};

mod dots;
pub(crate) mod q4k;
pub(crate) mod q6k;
mod tokens;

/// Rows of a group.
const GROUP: usize = 8;
/// Whether blocks of format tag `f` carry fifth bits (Q5_0, Q5_1): its group blocks hold the 8
/// rows' after the quants.
pub(crate) const fn has_fifth(f: u8) -> bool {
    matches!(f, tags::Q5_0 | tags::Q5_1)
}

/// Offset of the quants in a group block of format tag `f`: after the 8 f16 scales (and mins).
pub(crate) const fn quants_at(f: u8) -> usize {
    if has_min(f) {
        32
    } else {
        16
    }
}

/// Bytes of a group block of format tag `f`: 8 f16 scales (and 8 mins), the 8 rows' 16 quant
/// bytes (Q8_0: 32), and for Q5_0 and Q5_1 their 4 bytes of fifth bits (8 blocks of the format).
pub(crate) const fn group_block(f: u8) -> usize {
    let quants = if f == tags::Q8_0 { 256 } else { 128 };
    quants_at(f) + quants + if has_fifth(f) { 32 } else { 0 }
}

/// How many times a block's `-8 * sum(q_x)` the kernels add for format tag `f`, whose weights they
/// take unsigned: Q4_0's offset 8, Q5_0's 16, IQ4_NL's 128 ([`IQ4NL_BIASED`]); none for the
/// formats with a min (their term apart).
pub(crate) const fn corr_factor(f: u8) -> i32 {
    match f {
        tags::Q4_0 => 1,
        tags::Q5_0 => 2,
        tags::IQ4_NL => 16,
        _ => 0,
    }
}

/// IQ4_NL's values plus 128: unsigned bytes (1..=241) the kernels multiply, the offset taken back
/// with the activations' sums.
pub(crate) const IQ4NL_BIASED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (tensor_types::IQ4NL_VALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// The format tag of a format this layout takes.
fn tag(f: WeightFormat) -> u8 {
    match f {
        WeightFormat::IQ4_NL => tags::IQ4_NL,
        WeightFormat::Q5_0 => tags::Q5_0,
        WeightFormat::Q4_1 => tags::Q4_1,
        WeightFormat::Q5_1 => tags::Q5_1,
        WeightFormat::Q8_0 => tags::Q8_0,
        _ => tags::Q4_0,
    }
}

/// Whether the copies of `format` take a step's tokens one at a time on `path` (Q8_0, and off
/// the aarch64 paths with `dotprod` Q4_K, Q5_K and Q6_K: [`Q40x8::batches`]).
fn one_token_on(path: KernelPath, format: WeightFormat) -> bool {
    let neon = matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm);
    match format {
        WeightFormat::Q8_0 => true,
        WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K => !neon,
        _ => false,
    }
}

/// Where in a Q5_0 (Q5_1) group block's u32 of a row the fifth bit of weight `e` goes:
/// `16h + 4s + k` for `e = 8k + 2m + h`, `s` = 1, 2, 3, 0 for `m` = 0..4 (`arch/x86_64/q40x8.rs`).
const fn fifth_bit_at(e: usize) -> usize {
    let (k, m, h) = (e / 8, (e % 8) / 2, e % 2);
    16 * h + 4 * ((m + 1) % 4) + k
}

/// A row's u32 of fifth bits in the layout of [`fifth_bit_at`], from `bit(e)` (0 or 1) of each
/// weight `e < 32` (no branch on the bits: a branch a bit mispredicted on random weights and
/// made the repacking of a Q5_K model a third of a short run's time).
fn fifth_bits(bit: impl Fn(usize) -> u32) -> u32 {
    (0..32).fold(0u32, |h, e| h | bit(e) << fifth_bit_at(e))
}

/// Memory a copy's bytes live in: a `Vec<u8>` for [`Q40x8::repack`], or what the caller's
/// allocator gives [`Q40x8::repack_in`] (pages of its own mapping, say, that the kernel backs with
/// huge pages).
pub trait CopyBytes: std::ops::DerefMut<Target = [u8]> + Send + Sync {}

impl<T: std::ops::DerefMut<Target = [u8]> + Send + Sync> CopyBytes for T {}

/// An allocator of [`CopyBytes`]: `len` zeroed bytes.
pub type ZeroedBytes<'a> = &'a (dyn Fn(usize) -> Box<dyn CopyBytes> + Sync);

/// What [`Q40x8::repack_in`] tells of each run of the original's rows once they are copied (their
/// bytes), from the threads that copy them: a caller may let their pages go.
pub type CopiedRows<'a> = &'a (dyn Fn(&[u8]) + Sync);

/// Bytes of the original a run of groups covers, at most, where the matrix has enough groups for
/// eight runs or more ([`Q40x8::repack_in`] tells of each once copied).
const RUN_BYTES: usize = 1 << 20;

/// A Q4_0, IQ4_NL, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K or Q8_0 matrix repacked eight rows at a
/// time (module docs).
pub struct Q40x8 {
    data: Box<dyn CopyBytes>,
    format: WeightFormat,
    rows: usize,
    cols: usize,
}

/// The four 4-bit quants of the bytes 0, 2, 4 and 6 of `x` (little-endian), their low nibbles or
/// (`high`) their high ones, packed into one u16 (byte 0's quant in bits 0-3, byte 6's in 12-15).
fn four_nibbles(x: u64, high: bool) -> u16 {
    let y = x & 0x00FF_00FF_00FF_00FF;
    let y = if high { y >> 4 } else { y } & 0x000F_000F_000F_000F;
    // Quants at bits 0, 16, 32, 48 -> 0-7 and 32-39 -> 0-15.
    let z = y | (y >> 12);
    ((z & 0xFF) | ((z >> 24) & 0xFF00)) as u16
}

impl Q40x8 {
    /// `w` repacked, or `None` where the layout does not apply ([`Q40x8::fits`]).
    pub fn repack(w: &QMatrix<'_>) -> Option<Self> {
        Self::repack_in(w, &|len| Box::new(vec![0u8; len]), &|_| {})
    }

    /// [`Q40x8::repack`] into memory from `zeroed` (called once, for the copy's bytes), telling
    /// `copied` of each run of the original's rows (about `RUN_BYTES`, whole groups) once it is
    /// copied: a caller that lets their pages go holds at most a few runs of the original beside
    /// the copy, not the whole matrix.
    pub fn repack_in(
        w: &QMatrix<'_>,
        zeroed: ZeroedBytes<'_>,
        copied: CopiedRows<'_>,
    ) -> Option<Self> {
        if !Self::fits(w) {
            return None;
        }
        let mem = (zeroed, copied);
        if matches!(w.format(), WeightFormat::Q4_K | WeightFormat::Q5_K) {
            return Some(q4k::repack(w, mem));
        }
        if w.format() == WeightFormat::Q8_0 {
            return Some(Self::repack_q80(w, mem));
        }
        if w.format() == WeightFormat::Q6_K {
            return Some(q6k::repack(w, mem));
        }
        let f = tag(w.format());
        // The file's blocks: the scale, the min, the fifth bits, then the nibbles.
        let fifth = tags::quants_offset(f);
        let nib = fifth + if has_fifth(f) { 4 } else { 0 };
        let quants = quants_at(f);
        Some(Self::pack_groups(w, group_block(f), mem, |r, blk, gb| {
            gb[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
            if has_min(f) {
                gb[16 + 2 * r..18 + 2 * r].copy_from_slice(&blk[2..4]);
            }
            // Weight e < 16 is the low nibble of quant byte e, e >= 16 the high one of byte
            // e - 16: weights 8k + 2m + h (m < 4) are bytes 8(k % 2) + h + 2m.
            let half = |i: usize| {
                let at = nib + 8 * i;
                u64::from_le_bytes(blk[at..at + 8].try_into().expect("8 bytes"))
            };
            let halves = [half(0), half(1)];
            for k in 0..4 {
                for h in 0..2 {
                    let v = four_nibbles(halves[k % 2] >> (8 * h), k >= 2);
                    let at = quants + 32 * k + 4 * r + 2 * h;
                    gb[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
            if has_fifth(f) {
                let qh = &blk[fifth..fifth + 4];
                let qh = u32::from_le_bytes(qh.try_into().expect("4 bytes"));
                let bits = fifth_bits(|e| qh >> e & 1);
                let at = quants + 128 + 4 * r;
                gb[at..at + 4].copy_from_slice(&bits.to_le_bytes());
            }
        }))
    }

    /// `w` repacked a group of 8 rows at a time, in parallel over groups (a model's matrices are
    /// repacked at load): each block of the file (Q4_K: each super-block) becomes `out` bytes of
    /// its group's, into which `put(r, block, group_block)` writes row `r`'s block.
    fn pack_groups(
        w: &QMatrix<'_>,
        out: usize,
        (zeroed, copied): (ZeroedBytes<'_>, CopiedRows<'_>),
        put: impl Fn(usize, &[u8], &mut [u8]) + Sync,
    ) -> Self {
        let (rows, cols, format) = (w.rows(), w.cols(), w.format());
        let (nb, bb) = (cols / format.block_len(), format.block_bytes());
        let mut data = zeroed(rows / GROUP * nb * out);
        // Groups a run: about `RUN_BYTES` of the original, and eight runs at least.
        let group_src = GROUP * w.row_bytes();
        let run = (RUN_BYTES / group_src).clamp(1, (rows / GROUP).div_ceil(8).max(1));
        data.par_chunks_mut(nb * out * run)
            .enumerate()
            .for_each(|(c, groups)| {
                let g0 = c * run;
                for (i, group) in groups.chunks_exact_mut(nb * out).enumerate() {
                    let g = g0 + i;
                    let src: Vec<&[u8]> = (0..GROUP).map(|r| w.row_data(GROUP * g + r)).collect();
                    for (b, gb) in group.chunks_exact_mut(out).enumerate() {
                        for (r, row) in src.iter().enumerate() {
                            put(r, &row[b * bb..(b + 1) * bb], gb);
                        }
                    }
                }
                let n = groups.len() / (nb * out);
                copied(&w.data()[g0 * group_src..(g0 + n) * group_src]);
            });
        Q40x8 {
            data,
            format,
            rows,
            cols,
        }
    }

    /// [`Q40x8::repack`] of a Q8_0 matrix: per group block the rows' `d`, then two quads of rows,
    /// each 8 registers of 16 bytes, register `k` of quad `q` holding weights `4k..4k + 4` of row
    /// `4q + r` at byte `4r` (`arch/aarch64/q80x8.rs`).
    fn repack_q80(w: &QMatrix<'_>, mem: (ZeroedBytes<'_>, CopiedRows<'_>)) -> Self {
        Self::pack_groups(w, group_block(tags::Q8_0), mem, |r, blk, gb| {
            gb[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
            for k in 0..8 {
                let at = 16 + 128 * (r / 4) + 16 * k + 4 * (r % 4);
                gb[at..at + 4].copy_from_slice(&blk[2 + 4 * k..6 + 4 * k]);
            }
        })
    }

    /// Whether `w` repacks ([`Q40x8::repack`]): Q4_0, IQ4_NL, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K, Q6_K or
    /// Q8_0, rows a multiple of 8, at least one block a row.
    pub fn fits(w: &QMatrix<'_>) -> bool {
        matches!(
            w.format(),
            WeightFormat::Q4_0
                | WeightFormat::IQ4_NL
                | WeightFormat::Q5_0
                | WeightFormat::Q4_1
                | WeightFormat::Q5_1
                | WeightFormat::Q4_K
                | WeightFormat::Q5_K
                | WeightFormat::Q6_K
                | WeightFormat::Q8_0
        ) && w.rows() % GROUP == 0
            && w.cols() >= 32
    }

    /// Whether a copy of a `format` matrix gives on `path` bit for bit what [`crate::matvec_with`]
    /// gives for the original in [`crate::Precision::Fast`] (both take `q40_pairs`'s order, Q4_K
    /// and Q5_K `q4k_i16_rows`', Q6_K `q6k_i16_rows`', Q8_0 `dot_i16_rows`'): Q4_0, IQ4_NL and
    /// Q8_0 on [`KernelPath::Avx2Fma`] and [`KernelPath::Avx512`];
    /// Q5_0, Q4_1, Q5_1, Q4_K, Q5_K and Q6_K on the first (the second's kernels of these are
    /// `q40_512`'s, `matvec_i16`'s and `kquant512`'s, of other orders); all of them also on
    /// [`KernelPath::NeonDotprod`] and [`KernelPath::NeonI8mm`] (the split rows' order).
    /// Elsewhere a copy's results are within the `Fast` tolerance only, so a forward pass that must
    /// agree with the batched kernels (speculation's verification) takes copies where this holds.
    pub fn exact_on(path: KernelPath, format: WeightFormat) -> bool {
        match format {
            WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::IQ4_NL => matches!(
                path,
                KernelPath::Avx2Fma
                    | KernelPath::Avx512
                    | KernelPath::NeonDotprod
                    | KernelPath::NeonI8mm
            ),
            WeightFormat::Q5_0 | WeightFormat::Q4_1 | WeightFormat::Q5_1 => matches!(
                path,
                KernelPath::Avx2Fma | KernelPath::NeonDotprod | KernelPath::NeonI8mm
            ),
            WeightFormat::Q4_K | WeightFormat::Q5_K => matches!(
                path,
                KernelPath::Avx2Fma | KernelPath::NeonDotprod | KernelPath::NeonI8mm
            ),
            WeightFormat::Q6_K => matches!(
                path,
                KernelPath::Avx2Fma | KernelPath::NeonDotprod | KernelPath::NeonI8mm
            ),
            _ => false,
        }
    }

    /// The original's format.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Bytes of one group of 8 rows.
    fn group_bytes(&self) -> usize {
        if matches!(self.format, WeightFormat::Q4_K | WeightFormat::Q5_K) {
            self.cols / 256 * q4k::group_sb(self.format == WeightFormat::Q5_K)
        } else if self.format == WeightFormat::Q6_K {
            self.cols / 256 * q6k::GROUP_SB
        } else {
            self.cols / 32 * group_block(tag(self.format))
        }
    }

    /// Bytes held (the copy's size, for the memory budget).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Rows of the matrix.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the matrix.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `y = W x` in [`crate::Precision::Fast`] on the active path.
    pub fn matvec(&self, x: &[f32], y: &mut [f32]) -> Result<(), KernelError> {
        self.matvec_with(crate::active_path(), x, y)
    }

    /// [`Q40x8::matvec`] on an explicit path (module docs: bit for bit the original's
    /// [`crate::matvec_with`] where [`Q40x8::exact_on`] says so).
    pub fn matvec_with(
        &self,
        path: KernelPath,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), KernelError> {
        check_path(path)?;
        check_len("q40x8 matvec x", self.cols, x.len())?;
        check_len("q40x8 matvec y", self.rows, y.len())?;
        let acts = Acts8::new(path, x);
        let chunk = matvec_chunk(self.rows).next_multiple_of(GROUP);
        if self.rows <= chunk {
            self.run_rows(path, &acts, 0, y);
        } else {
            y.par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, ys)| self.run_rows(path, &acts, i * chunk, ys));
        }
        Ok(())
    }

    /// Whether products of several tokens ([`Q40x8::matvec_batch`]) read each group block once for
    /// two to four tokens on the active path (the x86 paths and the aarch64 ones with `dotprod`):
    /// every format but Q8_0, and on x86 Q4_K, Q5_K and Q6_K, whose copies take one token at a
    /// time (each group's tokens in turn, the group in cache).
    pub fn batches(&self) -> bool {
        self.batches_on(crate::active_path())
    }

    /// [`Q40x8::batches`] on an explicit path.
    pub fn batches_on(&self, path: KernelPath) -> bool {
        !one_token_on(path, self.format)
    }

    /// Whether a step of several tokens that runs the decode kernels (a batched decode step,
    /// speculation's verification, an MoE step's expert groups) had better read this copy
    /// ([`Q40x8::matvec_batch`]) than the original on the active path: where the copy batches
    /// ([`Q40x8::batches`]), and on the aarch64 paths with `dotprod` wherever the copy is exact
    /// there ([`Q40x8::exact_on`]), because the original's batch runs one product a token too
    /// (its split rows), which the copy gives bit for bit in fewer instructions.
    pub fn serves_steps(&self) -> bool {
        self.serves_steps_on(crate::active_path())
    }

    /// [`Q40x8::serves_steps`] on an explicit path.
    pub fn serves_steps_on(&self, path: KernelPath) -> bool {
        self.batches_on(path)
            || (matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm)
                && Self::exact_on(path, self.format))
    }

    /// Whether a [`crate::Precision::Fast`] prompt of `n` tokens had better read this copy
    /// ([`Q40x8::matvec_batch`]) than the original's prompt tile ([`crate::matmul()`]): where the
    /// copy serves steps of several tokens ([`Q40x8::serves_steps`]), below
    /// [`crate::short_prompt_tokens`] (such prompts run decode's products),
    /// and on the AVX-512 path up to 64 tokens for Q4_0, whose prompts take the 16-bit
    /// tile there: the same products in another order, where the tile repacks its rows every call
    /// (2 threads, `examples/batch_rate.rs`, 2026-12-05: 2048 x 2048 at 64 tokens 2.22-2.28 ms
    /// against the tile's 3.08-3.19, at 128 4.22-4.38 against 4.04-4.14). (Q4_1 measured alike,
    /// 4864 x 896 at 64 tokens 2.13 against 2.45, but the engine copies it on AVX2 only, where the
    /// copy is exact.) On the AVX2 path up to 64 tokens for Q4_0 and Q4_1 too (SYNTHETIC 16-layer
    /// d 1024 files, `SPARROW_KERNELS=avx2 sparrow bench -p 64 -n 0 -r 3`, 2026-12-06, Intel Xeon,
    /// alternating: Q4_0 215.6-218.9 -> 239.2-239.7 tok/s with one thread, 394.3-398.1 ->
    /// 418.2-425.6 with two; Q4_1 210.0-210.8 -> 226.5-227.4 and 374.8-375.4 -> 406.0-408.4); not
    /// for Q5_1 (-20%) or IQ4_NL (-5%, stop 80's probe).
    pub fn takes_prompt(&self, n: usize) -> bool {
        self.takes_prompt_on(crate::active_path(), n)
    }

    /// [`Q40x8::takes_prompt`] on an explicit path.
    pub fn takes_prompt_on(&self, path: KernelPath, n: usize) -> bool {
        let wide = n <= 64
            && match path {
                KernelPath::Avx512 => self.format == WeightFormat::Q4_0,
                KernelPath::Avx2Fma => {
                    matches!(self.format, WeightFormat::Q4_0 | WeightFormat::Q4_1)
                }
                _ => false,
            };
        self.serves_steps_on(path) && (n < crate::short_prompt_tokens(path) || wide)
    }

    /// `y[t] = W x[t]` for the `n` tokens of `x` (`n × cols`; `y`: `n × rows`, token-major) in
    /// [`crate::Precision::Fast`] on the active path: each token's results [`Q40x8::matvec`]'s
    /// bits.
    pub fn matvec_batch(&self, x: &[f32], n: usize, y: &mut [f32]) -> Result<(), KernelError> {
        self.matvec_batch_with(crate::active_path(), x, n, y)
    }

    /// [`Q40x8::matvec_batch`] on an explicit path.
    pub fn matvec_batch_with(
        &self,
        path: KernelPath,
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) -> Result<(), KernelError> {
        check_path(path)?;
        check_len("q40x8 matvec_batch x", n * self.cols, x.len())?;
        check_len("q40x8 matvec_batch y", n * self.rows, y.len())?;
        if n == 0 {
            return Ok(());
        }
        let acts: Vec<Acts8> = x
            .chunks_exact(self.cols)
            .map(|t| Acts8::new(path, t))
            .collect();
        let chunk = matvec_chunk(self.rows).next_multiple_of(GROUP);
        // Per row chunk, every token's rows (token-major within the chunk), put in place by the
        // work item (its buffer made and freed on one thread).
        let y_ptr = OutPtr(y.as_mut_ptr());
        (0..self.rows.div_ceil(chunk))
            .into_par_iter()
            .for_each(|c| {
                let r0 = c * chunk;
                let nr = chunk.min(self.rows - r0);
                let mut out = vec![0f32; n * nr];
                self.run_rows_tokens(path, &acts, r0, &mut out);
                // SAFETY: `y` holds `n * rows` elements (checked) and stays mutably borrowed
                // until the items are done; this item alone writes rows `r0 .. r0 + nr`.
                unsafe { y_ptr.write_rows(&out, n, self.rows, r0, nr) };
            });
        Ok(())
    }

    /// `ys` = rows `r0..r0 + ys.len()` of `W x` (`r0` and the length multiples of 8).
    pub(crate) fn run_rows(&self, path: KernelPath, acts: &Acts8, r0: usize, ys: &mut [f32]) {
        let gb = self.group_bytes();
        for (j, yg) in ys.chunks_exact_mut(GROUP).enumerate() {
            let g = r0 / GROUP + j;
            let group = &self.data[g * gb..(g + 1) * gb];
            yg.copy_from_slice(&group_dots(path, self.format, group, acts));
        }
    }

    /// `out[t * nr + i]` = row `r0 + i` of `W x_t` for every token's `acts[t]` (`nr = out.len() /
    /// acts.len()`; `r0` and `nr` multiples of 8): each group's quants read and unpacked once for
    /// two tokens at a time, or three where that many are left (an odd count: the last pair and
    /// the odd token; four at once were slower, their accumulators spilled), each token's results
    /// [`Q40x8::run_rows`]'s bits. On the AVX-512 path, whose 32 registers hold four tokens'
    /// accumulators, four at a time (an OLMoE-shaped prompt layer over the copies: 1.17x pairs),
    /// and two groups at once in 512-bit registers for two tokens or more (`q40x8_pair_tokens`:
    /// pp64 of the SYNTHETIC OLMoE-shaped 4-layer Q4_0 file 1.07-1.11x one group at a time, 2
    /// threads, 2026-12-06).
    pub(crate) fn run_rows_tokens(
        &self,
        path: KernelPath,
        acts: &[Acts8],
        r0: usize,
        out: &mut [f32],
    ) {
        let nr = out.len() / acts.len().max(1);
        let gb = self.group_bytes();
        let f = self.format;
        let groups = nr / GROUP;
        // On AVX-512 two groups at once for two or more tokens (`q40x8_pair_tokens`).
        let pairs = path == KernelPath::Avx512 && self.batches_on(path);
        let mut j = 0;
        while j < groups {
            let two = pairs && j + 1 < groups;
            let g = r0 / GROUP + j;
            let group = |k: usize| &self.data[(g + k) * gb..(g + k + 1) * gb];
            let mut put = |t: usize, k: usize, y: &[f32]| {
                let at = t * nr + (j + k) * GROUP;
                out[at..at + GROUP].copy_from_slice(&y[..GROUP]);
            };
            // Pairs (fours on AVX-512), and an odd token's group read with the last pair (three at
            // once), not again.
            let mut t = 0;
            while t < acts.len() {
                let a = &acts[t..];
                let take = match a.len() {
                    3 => 3,
                    n if path == KernelPath::Avx512 => n.min(4),
                    n => n.min(2),
                };
                if two && take > 1 {
                    let gs = [group(0), group(1)];
                    let mut put2 = |ys: &[[f32; 2 * GROUP]]| {
                        for (k, y) in ys.iter().enumerate() {
                            put(t + k, 0, &y[..GROUP]);
                            put(t + k, 1, &y[GROUP..]);
                        }
                    };
                    match take {
                        2 => put2(&pair_dots_tokens::<2>(f, gs, a)),
                        3 => put2(&pair_dots_tokens::<3>(f, gs, a)),
                        _ => put2(&pair_dots_tokens::<4>(f, gs, a)),
                    }
                    t += take;
                    continue;
                }
                for k in 0..1 + usize::from(two) {
                    let gk = group(k);
                    match take {
                        1 => put(t, k, &group_dots(path, f, gk, &a[0])),
                        2 => {
                            let ys = group_dots_tokens::<2>(path, f, gk, a);
                            ys.iter().enumerate().for_each(|(i, y)| put(t + i, k, y));
                        }
                        4 => {
                            let ys = group_dots_tokens::<4>(path, f, gk, a);
                            ys.iter().enumerate().for_each(|(i, y)| put(t + i, k, y));
                        }
                        _ => {
                            let ys = group_dots_tokens::<3>(path, f, gk, a);
                            ys.iter().enumerate().for_each(|(i, y)| put(t + i, k, y));
                        }
                    }
                }
                t += take;
            }
            j += 1 + usize::from(two);
        }
    }
}

/// A vector's 16-bit activations and each block's `-8 * sum(q_x)`, made once per vector; on
/// aarch64 their split (and its reordering) for the kernels there, made on first use.
pub(crate) struct Acts8 {
    xq: QActs16,
    /// Per block of 32, `-8` times the sum of its quants (made on first use: the nibble formats'
    /// x86 kernels and the scalar ones read it, the aarch64 `dotprod` kernels and Q8_0's and the
    /// K-quants' do not).
    corr: std::sync::OnceLock<Vec<i32>>,
    /// Q6_K's offset terms in its x86 kernels' order (`q6k_corr`, made on first use).
    #[cfg(target_arch = "x86_64")]
    c6: std::sync::OnceLock<Vec<i32>>,
    #[cfg(target_arch = "aarch64")]
    split: std::sync::OnceLock<crate::arch::Split16>,
    /// The split in the order of the nibble formats' aarch64 kernel.
    #[cfg(target_arch = "aarch64")]
    perm: std::sync::OnceLock<crate::arch::Perm8>,
}

impl Acts8 {
    pub(crate) fn new(path: KernelPath, x: &[f32]) -> Self {
        Acts8 {
            xq: QActs16::quantize(path, x),
            corr: std::sync::OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            c6: std::sync::OnceLock::new(),
            #[cfg(target_arch = "aarch64")]
            split: std::sync::OnceLock::new(),
            #[cfg(target_arch = "aarch64")]
            perm: std::sync::OnceLock::new(),
        }
    }

    /// Per block of 32, `-8` times the sum of its quants (computed on first use).
    pub(super) fn corr(&self) -> &[i32] {
        self.corr.get_or_init(|| {
            let qs = self.xq.qs.chunks_exact(32);
            qs.map(|q| -8 * q.iter().map(|&v| i32::from(v)).sum::<i32>())
                .collect()
        })
    }

    /// Q6_K's offset terms for the x86 kernels (computed on first use).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn q6k_corr(&self) -> &[i32] {
        self.c6.get_or_init(|| crate::arch::q6k_corr(&self.xq.qs))
    }

    /// The split activations (made on first use).
    #[cfg(target_arch = "aarch64")]
    pub(crate) fn split(&self) -> &crate::arch::Split16 {
        // SAFETY: NEON, all `Split16::new` needs, is baseline on aarch64.
        self.split
            .get_or_init(|| unsafe { crate::arch::Split16::new(&self.xq) })
    }

    /// The split in the nibble formats' aarch64 order (made on first use).
    #[cfg(target_arch = "aarch64")]
    pub(crate) fn perm(&self) -> &crate::arch::Perm8 {
        self.perm
            .get_or_init(|| crate::arch::Perm8::new(self.split()))
    }
}
