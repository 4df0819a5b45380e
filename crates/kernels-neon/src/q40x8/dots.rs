//! The dots of one group of a [`Q40x8`](super::Q40x8) copy with one token's activations, per
//! path and format: the x86 kernels (`arch/x86_64/q40x8.rs`, `q4kx8.rs`, `q6kx8.rs`,
//! `q80x8.rs`), the aarch64 ones with `dotprod`, and the scalar loops over the same layouts for
//! the other paths.

use super::{corr_factor, fifth_bit_at, group_block, has_fifth, q4k, q6k, quants_at, tag, Acts8};
use super::{GROUP, IQ4NL_BIASED};
use crate::arch::tags::{self, has_min};
use crate::quant::QActs16;
use crate::{KernelPath, WeightFormat};

/// The 8 dots of one group of a `format` copy on `path` with `acts`.
pub(super) fn group_dots(
    path: KernelPath,
    format: WeightFormat,
    group: &[u8],
    acts: &Acts8,
) -> [f32; GROUP] {
    let xq = &acts.xq;
    let x86 = matches!(path, KernelPath::Avx2Fma | KernelPath::Avx512);
    #[cfg(target_arch = "aarch64")]
    if let Some(y) = group_dots_neon(path, format, group, acts) {
        return y;
    }
    if format == WeightFormat::Q8_0 {
        #[cfg(target_arch = "x86_64")]
        if x86 {
            // SAFETY: the path was checked available: AVX2/FMA/F16C present.
            return unsafe { crate::arch::q80x8_group(group, xq) };
        }
        return q80_group_scalar(group, xq);
    }
    if matches!(format, WeightFormat::Q4_K | WeightFormat::Q5_K) {
        let five = format == WeightFormat::Q5_K;
        #[cfg(target_arch = "x86_64")]
        if x86 {
            use crate::arch::{q4kx8_group as avx2, q4kx8_group_vnni as vnni};
            // SAFETY: the path was checked available: AVX2/FMA/F16C present, and on the AVX-512
            // path AVX-512 VNNI and VL.
            return unsafe {
                match (path == KernelPath::Avx512, five) {
                    (true, true) => vnni::<true>(group, xq),
                    (true, false) => vnni::<false>(group, xq),
                    (false, true) => avx2::<true>(group, xq),
                    (false, false) => avx2::<false>(group, xq),
                }
            };
        }
        return q4k::group_scalar(group, xq, five);
    }
    if format == WeightFormat::Q6_K {
        #[cfg(target_arch = "x86_64")]
        if x86 {
            // SAFETY: the path was checked available: AVX2/FMA/F16C present.
            return unsafe { crate::arch::q6kx8_group(group, xq, acts.q6k_corr()) };
        }
        return q6k::group_scalar(group, xq);
    }
    let corr = acts.corr();
    // (Only the x86 paths read `x86`.)
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x86;
    #[cfg(target_arch = "x86_64")]
    if x86 {
        use crate::arch::{q40x8_group as avx2, q40x8_group_vnni as vnni};
        macro_rules! by_format {
            ($k:ident) => {
                match tag(format) {
                    tags::IQ4_NL => $k::<{ tags::IQ4_NL }>(group, xq, corr),
                    tags::Q5_0 => $k::<{ tags::Q5_0 }>(group, xq, corr),
                    tags::Q4_1 => $k::<{ tags::Q4_1 }>(group, xq, corr),
                    tags::Q5_1 => $k::<{ tags::Q5_1 }>(group, xq, corr),
                    _ => $k::<{ tags::Q4_0 }>(group, xq, corr),
                }
            };
        }
        // SAFETY: the path was checked available: AVX2/FMA/F16C present, and on the AVX-512 path
        // AVX-512 VNNI and VL.
        return unsafe {
            if path == KernelPath::Avx512 {
                by_format!(vnni)
            } else {
                by_format!(avx2)
            }
        };
    }
    let _ = path;
    group_dots_scalar(tag(format), group, xq, corr)
}

/// [`group_dots`] on the aarch64 paths with `dotprod` for the formats they take (Q8_0, the nibble
/// formats, Q4_K, Q5_K and Q6_K; `arch/aarch64/q80x8.rs`, `q40x8.rs`, `q4kx8.rs`, `q6kx8.rs`);
/// `None` elsewhere.
#[cfg(target_arch = "aarch64")]
fn group_dots_neon(
    path: KernelPath,
    format: WeightFormat,
    group: &[u8],
    acts: &Acts8,
) -> Option<[f32; GROUP]> {
    use crate::arch::{q40x8_group_neon, q4kx8_group_neon, q6kx8_group_neon, q80x8_group};
    if !matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm) {
        return None;
    }
    let xq = &acts.xq;
    let split = acts.split();
    let perm = || acts.perm();
    // SAFETY: the path was checked available: dotprod present.
    unsafe {
        let nibbles = |f: u8| match f {
            tags::Q4_0 => q40x8_group_neon::<{ tags::Q4_0 }>(group, split, perm(), xq),
            tags::Q4_1 => q40x8_group_neon::<{ tags::Q4_1 }>(group, split, perm(), xq),
            tags::Q5_0 => q40x8_group_neon::<{ tags::Q5_0 }>(group, split, perm(), xq),
            tags::Q5_1 => q40x8_group_neon::<{ tags::Q5_1 }>(group, split, perm(), xq),
            _ => q40x8_group_neon::<{ tags::IQ4_NL }>(group, split, perm(), xq),
        };
        Some(match format {
            WeightFormat::Q8_0 => q80x8_group(group, split, xq),
            WeightFormat::Q4_K => q4kx8_group_neon::<false>(group, perm(), xq),
            WeightFormat::Q5_K => q4kx8_group_neon::<true>(group, perm(), xq),
            WeightFormat::Q6_K => q6kx8_group_neon(group, split, perm(), xq),
            WeightFormat::Q4_0
            | WeightFormat::Q4_1
            | WeightFormat::Q5_0
            | WeightFormat::Q5_1
            | WeightFormat::IQ4_NL => nibbles(tag(format)),
            _ => return None,
        })
    }
}

/// [`group_dots`] in scalar code (format tag `f`): per row, the exact block sums times
/// `d_w * d_x` (and the min times the activations' sum), in block order.
fn group_dots_scalar(f: u8, group: &[u8], xq: &QActs16, corr: &[i32]) -> [f32; GROUP] {
    let mut y = [0f32; GROUP];
    let quants = quants_at(f);
    let f16_at = |gb: &[u8], at: usize| half::f16::from_le_bytes([gb[at], gb[at + 1]]).to_f32();
    for (b, gb) in group.chunks_exact(group_block(f)).enumerate() {
        let x = &xq.qs[b * 32..b * 32 + 32];
        for (r, yr) in y.iter_mut().enumerate() {
            let dw = f16_at(gb, 2 * r);
            let at = quants + 128 + 4 * r;
            let fifth = if has_fifth(f) {
                u32::from_le_bytes(gb[at..at + 4].try_into().expect("4 bytes"))
            } else {
                0
            };
            let mut isum = corr[b] * corr_factor(f);
            for k in 0..4 {
                for h in 0..2 {
                    let at = quants + 32 * k + 4 * r + 2 * h;
                    let v = u16::from_le_bytes([gb[at], gb[at + 1]]);
                    for m in 0..4 {
                        let e = 8 * k + 2 * m + h;
                        let n = usize::from((v >> (4 * m)) & 0x0F);
                        let q = match f {
                            tags::IQ4_NL => i32::from(IQ4NL_BIASED[n]),
                            _ => (n | (((fifth >> fifth_bit_at(e)) & 1) << 4) as usize) as i32,
                        };
                        isum += q * i32::from(x[e]);
                    }
                }
            }
            *yr += dw * xq.d[b] * isum as f32;
            if has_min(f) {
                *yr += f16_at(gb, 16 + 2 * r) * xq.s[b];
            }
        }
    }
    y
}

/// A Q8_0 group's 8 dots in scalar code: per row, the exact block sums times `d_w * d_x`, in block
/// order (register `k` of quad `q` holds weights `4k..4k + 4` of row `4q + r` at `4r`).
fn q80_group_scalar(group: &[u8], xq: &QActs16) -> [f32; GROUP] {
    let mut y = [0f32; GROUP];
    for (b, gb) in group.chunks_exact(group_block(tags::Q8_0)).enumerate() {
        let x = &xq.qs[b * 32..b * 32 + 32];
        for (r, yr) in y.iter_mut().enumerate() {
            let dw = half::f16::from_le_bytes([gb[2 * r], gb[2 * r + 1]]).to_f32();
            let isum: i32 = (0..32)
                .map(|e| {
                    let at = 16 + 128 * (r / 4) + 16 * (e / 4) + 4 * (r % 4) + e % 4;
                    i32::from(gb[at] as i8) * i32::from(x[e])
                })
                .sum();
            *yr += dw * xq.d[b] * isum as f32;
        }
    }
    y
}
