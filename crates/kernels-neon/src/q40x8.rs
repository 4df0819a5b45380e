//! Q4_0 rows repacked eight at a time, for the one-token product ([`crate::Precision::Fast`]) on the
//! AVX2 and AVX-512 paths: a group block holds the 8 rows' f16 scales together, then their quants interleaved
//! so that one 32-byte load feeds the same weights of all 8 rows (layout in
//! `arch/x86_64/q40x8.rs`). The same 18 bytes a block as Q4_0: a copy made once, whose
//! [`Q40x8::bytes`] the caller counts against its memory budget.
//!
//! [`Q40x8::matvec_with`] gives, bit for bit, what [`crate::matvec_with`] gives on the
//! [`KernelPath::Avx2Fma`] and [`KernelPath::Avx512`] paths (the same `q40_pairs` kernel) for the
//! original matrix in [`crate::Precision::Fast`]; other paths take a scalar loop over the same layout (the scalar reference's per-block products, its tolerance).

use rayon::prelude::*;

use crate::path::matvec_chunk;
use crate::quant::QActs16;
use crate::{check_len, check_path, KernelError, KernelPath, QMatrix, WeightFormat};

/// Rows of a group.
const GROUP: usize = 8;
/// Bytes of a group block: 8 f16 scales and 8 blocks' 16 quant bytes.
const GROUP_BLOCK: usize = 144;
/// Bytes of a Q4_0 block.
const BB: usize = 18;

/// A Q4_0 matrix repacked eight rows at a time (module docs).
pub struct Q40x8 {
    data: Vec<u8>,
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
    /// `w` repacked, or `None` where the layout does not apply: a format other than Q4_0, rows
    /// not a multiple of 8, or no columns.
    pub fn repack(w: &QMatrix<'_>) -> Option<Self> {
        if !Self::fits(w) {
            return None;
        }
        let (rows, cols) = (w.rows(), w.cols());
        let nb = cols / 32;
        let mut data = vec![0u8; rows / GROUP * nb * GROUP_BLOCK];
        // In parallel over groups (a model's matrices are repacked at load).
        let pack = |(g, out): (usize, &mut [u8])| {
            let src: Vec<&[u8]> = (0..GROUP).map(|r| w.row_data(GROUP * g + r)).collect();
            for (b, gb) in out.chunks_exact_mut(GROUP_BLOCK).enumerate() {
                for (r, row) in src.iter().enumerate() {
                    let blk = &row[b * BB..(b + 1) * BB];
                    gb[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                    // Weight e < 16 is the low nibble of quant byte e, e >= 16 the high one of
                    // byte e - 16: weights 8k + 2m + h (m < 4) are bytes 8(k % 2) + h + 2m.
                    let half = |i: usize| {
                        let at = 2 + 8 * i;
                        u64::from_le_bytes(blk[at..at + 8].try_into().expect("8 bytes"))
                    };
                    let halves = [half(0), half(1)];
                    for k in 0..4 {
                        for h in 0..2 {
                            let v = four_nibbles(halves[k % 2] >> (8 * h), k >= 2);
                            let at = 16 + 32 * k + 4 * r + 2 * h;
                            gb[at..at + 2].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                }
            }
        };
        data.par_chunks_exact_mut(nb * GROUP_BLOCK)
            .enumerate()
            .for_each(pack);
        Some(Q40x8 { data, rows, cols })
    }

    /// Whether `w` repacks ([`Q40x8::repack`]): Q4_0, rows a multiple of 8, at least one block a
    /// row.
    pub fn fits(w: &QMatrix<'_>) -> bool {
        w.format() == WeightFormat::Q4_0 && w.rows() % GROUP == 0 && w.cols() >= 32
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
    /// [`crate::matvec_with`] on [`KernelPath::Avx2Fma`] and [`KernelPath::Avx512`]).
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

    /// `ys` = rows `r0..r0 + ys.len()` of `W x` (`r0` and the length multiples of 8).
    pub(crate) fn run_rows(&self, path: KernelPath, acts: &Acts8, r0: usize, ys: &mut [f32]) {
        let gb = self.cols / 32 * GROUP_BLOCK;
        for (j, yg) in ys.chunks_exact_mut(GROUP).enumerate() {
            let g = r0 / GROUP + j;
            let group = &self.data[g * gb..(g + 1) * gb];
            yg.copy_from_slice(&group_dots(path, group, &acts.xq, &acts.corr));
        }
    }

    /// `out[t * nr + i]` = row `r0 + i` of `W x_t` for every token's `acts[t]` (`nr = out.len() /
    /// acts.len()`; `r0` and `nr` multiples of 8): each group's quants read and unpacked once for
    /// two tokens at a time (four were slower: registers spill), each token's results
    /// [`Q40x8::run_rows`]'s bits.
    pub(crate) fn run_rows_tokens(
        &self,
        path: KernelPath,
        acts: &[Acts8],
        r0: usize,
        out: &mut [f32],
    ) {
        let nr = out.len() / acts.len().max(1);
        let gb = self.cols / 32 * GROUP_BLOCK;
        for j in 0..nr / GROUP {
            let g = r0 / GROUP + j;
            let group = &self.data[g * gb..(g + 1) * gb];
            let mut put = |t: usize, y: &[f32; GROUP]| {
                out[t * nr + j * GROUP..t * nr + (j + 1) * GROUP].copy_from_slice(y);
            };
            let mut pairs = acts.chunks_exact(2);
            let mut t = 0;
            for a in &mut pairs {
                let ys =
                    group_dots_tokens(path, group, [&a[0].xq, &a[1].xq], [&a[0].corr, &a[1].corr]);
                ys.iter().enumerate().for_each(|(k, y)| put(t + k, y));
                t += 2;
            }
            if let [a] = pairs.remainder() {
                put(t, &group_dots(path, group, &a.xq, &a.corr));
            }
        }
    }
}

/// A vector's 16-bit activations and each block's `-8 * sum(q_x)`, made once per vector.
pub(crate) struct Acts8 {
    xq: QActs16,
    corr: Vec<i32>,
}

impl Acts8 {
    pub(crate) fn new(path: KernelPath, x: &[f32]) -> Self {
        let xq = QActs16::quantize(path, x);
        let corr: Vec<i32> = xq
            .qs
            .chunks_exact(32)
            .map(|q| -8 * q.iter().map(|&v| i32::from(v)).sum::<i32>())
            .collect();
        Acts8 { xq, corr }
    }
}

/// The 8 dots of one group on `path`.
fn group_dots(path: KernelPath, group: &[u8], xq: &QActs16, corr: &[i32]) -> [f32; GROUP] {
    #[cfg(target_arch = "x86_64")]
    if matches!(path, KernelPath::Avx2Fma | KernelPath::Avx512) {
        // SAFETY: the path was checked available: AVX2/FMA/F16C present.
        return unsafe { crate::arch::q40x8_group(group, xq, corr) };
    }
    let _ = path;
    group_dots_scalar(group, xq, corr)
}

/// [`group_dots`] of each of `T` tokens, the group read once for all on the x86 paths.
fn group_dots_tokens<const T: usize>(
    path: KernelPath,
    group: &[u8],
    xq: [&QActs16; T],
    corr: [&[i32]; T],
) -> [[f32; GROUP]; T] {
    #[cfg(target_arch = "x86_64")]
    if matches!(path, KernelPath::Avx2Fma | KernelPath::Avx512) {
        // SAFETY: the path was checked available: AVX2/FMA/F16C present.
        return unsafe { crate::arch::q40x8_group_tokens::<T>(group, xq, corr) };
    }
    std::array::from_fn(|t| group_dots(path, group, xq[t], corr[t]))
}

/// [`group_dots`] in scalar code: per row, the exact block sums times `d_w * d_x`, in block
/// order.
fn group_dots_scalar(group: &[u8], xq: &QActs16, corr: &[i32]) -> [f32; GROUP] {
    let mut y = [0f32; GROUP];
    for (b, gb) in group.chunks_exact(GROUP_BLOCK).enumerate() {
        let x = &xq.qs[b * 32..b * 32 + 32];
        for (r, yr) in y.iter_mut().enumerate() {
            let dw = half::f16::from_le_bytes([gb[2 * r], gb[2 * r + 1]]).to_f32();
            let mut isum = corr[b];
            for k in 0..4 {
                for h in 0..2 {
                    let at = 16 + 32 * k + 4 * r + 2 * h;
                    let v = u16::from_le_bytes([gb[at], gb[at + 1]]);
                    for m in 0..4 {
                        let q = i32::from((v >> (4 * m)) & 0x0F);
                        isum += q * i32::from(x[8 * k + 2 * m + h]);
                    }
                }
            }
            *yr += dw * xq.d[b] * isum as f32;
        }
    }
    y
}
