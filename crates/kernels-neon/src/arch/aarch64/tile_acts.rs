//! A prompt's activations as the aarch64 integer tiles read them, built once per product (every
//! work item of a matrix, and every matrix of a product, reads the same): the `i8mm` tiles'
//! token pairs, the `dotprod` tiles' token quads (on either path for Q2_K and Q3_K).

use super::tile_dp::{quads16, quads8, tile_i16dp, tile_i8dp, Dp16, Dp8, TokenQuads};
use super::tile_i16mm::{pairs16, tile_i16mm, Tok16};
use super::tile_i8mm::{pairs8, tile_i8mm, tile_k8mm, Tok8};
use super::tile_mm::TokenPairs;
use crate::arch::k23;
use crate::quant::{QActs, QActs16};
use crate::{KernelPath, QMatrix, WeightFormat};

/// 16-bit activations for `tile_i16mm` (pairs, built only on [`KernelPath::NeonI8mm`]) or
/// `tile_i16dp` (quads, built only on [`KernelPath::NeonDotprod`] and `NeonI8mm`).
pub(crate) enum Acts16 {
    Pairs(TokenPairs<Tok16>),
    Quads(TokenQuads<Dp16>),
}

impl Acts16 {
    /// `acts` for `path`'s 16-bit tile over weights of `format`; `None` where it has none. Q2_K
    /// and Q3_K (scales per 16, Q2_K's mins too) take the quads on either path (an `i8mm` CPU has
    /// `dotprod`).
    pub(crate) fn new(path: KernelPath, format: WeightFormat, acts: &[QActs16]) -> Option<Self> {
        match path {
            KernelPath::NeonI8mm if k23(format) => {
                // SAFETY: NEON is baseline on every aarch64 target.
                Some(Acts16::Quads(unsafe { quads16(acts, format) }))
            }
            // SAFETY: NEON is baseline on every aarch64 target.
            KernelPath::NeonI8mm => Some(Acts16::Pairs(unsafe { pairs16(acts) })),
            // SAFETY: as above.
            KernelPath::NeonDotprod => Some(Acts16::Quads(unsafe { quads16(acts, format) })),
            _ => None,
        }
    }

    /// The tile for these activations: `out[t * nr + i]` = row `r0 + i` of `w` · token `t`
    /// (formats the tile does not take are left to the caller).
    pub(crate) fn tile(&self, w: &QMatrix<'_>, r0: usize, nr: usize, out: &mut [f32]) {
        match self {
            // SAFETY: pairs are built only on the NeonI8mm path, which is only available after
            // run-time detection of i8mm.
            Acts16::Pairs(p) => unsafe { tile_i16mm(w, r0, nr, p, out) },
            // SAFETY: quads are built only on the NeonDotprod and NeonI8mm paths, which are only
            // available after run-time detection of dotprod.
            Acts16::Quads(q) => unsafe { tile_i16dp(w, r0, nr, q, out) },
        }
    }
}

/// 8-bit activations for `tile_i8mm`/`tile_k8mm` (pairs, built only on
/// [`KernelPath::NeonI8mm`]) or `tile_i8dp` (quads, built only on [`KernelPath::NeonDotprod`] and
/// `NeonI8mm`).
pub(crate) enum Acts8 {
    Pairs(TokenPairs<Tok8>),
    Quads(TokenQuads<Dp8>),
}

impl Acts8 {
    /// `acts` for `path`'s 8-bit tile over weights of `format`, as [`Acts16::new`].
    pub(crate) fn new(path: KernelPath, format: WeightFormat, acts: &[QActs]) -> Option<Self> {
        match path {
            KernelPath::NeonI8mm if k23(format) => {
                // SAFETY: NEON is baseline on every aarch64 target.
                Some(Acts8::Quads(unsafe { quads8(acts, format) }))
            }
            // SAFETY: NEON is baseline on every aarch64 target.
            KernelPath::NeonI8mm => Some(Acts8::Pairs(unsafe { pairs8(acts) })),
            // SAFETY: as above.
            KernelPath::NeonDotprod => Some(Acts8::Quads(unsafe { quads8(acts, format) })),
            _ => None,
        }
    }

    /// The tile for these activations, as [`Acts16::tile`].
    pub(crate) fn tile(&self, w: &QMatrix<'_>, r0: usize, nr: usize, out: &mut [f32]) {
        let k = matches!(
            w.format(),
            WeightFormat::Q4_K | WeightFormat::Q5_K | WeightFormat::Q6_K
        );
        match self {
            // SAFETY: pairs are built only on the NeonI8mm path, which is only available after
            // run-time detection of i8mm.
            Acts8::Pairs(p) if k => unsafe { tile_k8mm(w, r0, nr, p, out) },
            // SAFETY: as above.
            Acts8::Pairs(p) => unsafe { tile_i8mm(w, r0, nr, p, out) },
            // SAFETY: quads are built only on the NeonDotprod and NeonI8mm paths, which are only
            // available after run-time detection of dotprod.
            Acts8::Quads(q) => unsafe { tile_i8dp(w, r0, nr, q, out) },
        }
    }
}
