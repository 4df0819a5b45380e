//! [`Q40x8`](super::Q40x8)'s kernels over several tokens at once, which
//! [`Q40x8::run_rows_tokens`](super::Q40x8) calls: one group against two to four tokens
//! (`q40x8_group_tokens` on x86, `q40x8_group_neon_tokens` on aarch64 with `dotprod`), and on
//! AVX-512 two groups at once (`q40x8_pair_tokens`).

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::tag;
use super::{group_dots, Acts8, GROUP};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::arch::tags;
#[cfg(target_arch = "x86_64")]
use crate::quant::QActs16;
use crate::{KernelPath, WeightFormat};

/// The first `T` tokens' activations of `a` (at least `T`).
#[cfg(target_arch = "x86_64")]
fn xqs<const T: usize>(a: &[Acts8]) -> [&QActs16; T] {
    std::array::from_fn(|k| &a[k].xq)
}

/// The first `T` tokens' block corrections of `a` (at least `T`).
#[cfg(target_arch = "x86_64")]
fn corrs<const T: usize>(a: &[Acts8]) -> [&[i32]; T] {
    std::array::from_fn(|k| a[k].corr())
}

/// [`group_dots`] of each of the first `T` tokens of `a`, the group read once for all on the x86
/// paths (the nibble formats) and the aarch64 ones with `dotprod` (those and the K-quants).
pub(super) fn group_dots_tokens<const T: usize>(
    path: KernelPath,
    format: WeightFormat,
    group: &[u8],
    a: &[Acts8],
) -> [[f32; GROUP]; T] {
    #[cfg(target_arch = "x86_64")]
    if matches!(path, KernelPath::Avx2Fma | KernelPath::Avx512)
        && !super::one_token_on(path, format)
    {
        use crate::arch::{q40x8_group_tokens as avx2, q40x8_group_tokens_vnni as vnni};
        let (xq, corr) = (xqs::<T>(a), corrs::<T>(a));
        macro_rules! by_format {
            ($k:ident) => {
                match tag(format) {
                    tags::IQ4_NL => $k::<{ tags::IQ4_NL }, T>(group, xq, corr),
                    tags::Q5_0 => $k::<{ tags::Q5_0 }, T>(group, xq, corr),
                    tags::Q4_1 => $k::<{ tags::Q4_1 }, T>(group, xq, corr),
                    tags::Q5_1 => $k::<{ tags::Q5_1 }, T>(group, xq, corr),
                    _ => $k::<{ tags::Q4_0 }, T>(group, xq, corr),
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
    #[cfg(target_arch = "aarch64")]
    if matches!(path, KernelPath::NeonDotprod | KernelPath::NeonI8mm)
        && !super::one_token_on(path, format)
    {
        use crate::arch::q6kx8_group_neon_tokens as k6;
        use crate::arch::{q40x8_group_neon_tokens as k, q4kx8_group_neon_tokens as k45};
        // (`perm` is made from `split`, so taking both costs nothing more.)
        let s = std::array::from_fn(|t| a[t].split());
        let p = std::array::from_fn(|t| a[t].perm());
        let xq = std::array::from_fn(|t| &a[t].xq);
        // SAFETY: the path was checked available: dotprod present.
        return unsafe {
            match format {
                WeightFormat::Q4_K => k45::<false, T>(group, p, xq),
                WeightFormat::Q5_K => k45::<true, T>(group, p, xq),
                WeightFormat::Q6_K => k6::<T>(group, s, p, xq),
                _ => match tag(format) {
                    tags::IQ4_NL => k::<{ tags::IQ4_NL }, T>(group, s, p, xq),
                    tags::Q5_0 => k::<{ tags::Q5_0 }, T>(group, s, p, xq),
                    tags::Q4_1 => k::<{ tags::Q4_1 }, T>(group, s, p, xq),
                    tags::Q5_1 => k::<{ tags::Q5_1 }, T>(group, s, p, xq),
                    _ => k::<{ tags::Q4_0 }, T>(group, s, p, xq),
                },
            }
        };
    }
    std::array::from_fn(|t| group_dots(path, format, group, &a[t]))
}

/// [`group_dots_tokens`] of two groups at once on the AVX-512 path for a copy that batches (only
/// there: the caller checks): per token, the first group's 8 rows then the second's, each row's
/// bits.
pub(super) fn pair_dots_tokens<const T: usize>(
    format: WeightFormat,
    groups: [&[u8]; 2],
    a: &[Acts8],
) -> [[f32; 2 * GROUP]; T] {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::arch::q40x8_pair_tokens as k;
        let (xq, corr) = (xqs::<T>(a), corrs::<T>(a));
        // SAFETY: the caller runs this on the AVX-512 path only, checked available (AVX2/FMA/F16C
        // and AVX-512F/VNNI/VL present), for a copy that batches (`Q40x8::batches`): a nibble
        // format.
        unsafe {
            match tag(format) {
                tags::IQ4_NL => k::<{ tags::IQ4_NL }, T>(groups, xq, corr),
                tags::Q5_0 => k::<{ tags::Q5_0 }, T>(groups, xq, corr),
                tags::Q4_1 => k::<{ tags::Q4_1 }, T>(groups, xq, corr),
                tags::Q5_1 => k::<{ tags::Q5_1 }, T>(groups, xq, corr),
                _ => k::<{ tags::Q4_0 }, T>(groups, xq, corr),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!(
        "pair_dots_tokens: {format:?} {:?} {}",
        groups.len(),
        a.len()
    )
}
