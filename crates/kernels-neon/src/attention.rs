//! Attention of one query head over a KV cache: scores `scale · q·k_j`, softmax, and the weighted sum
//! of the values, with the dot products and the value accumulation on the SIMD path (each checked
//! against the scalar reference, `tests/attention.rs`).

use crate::{arch, check_len, check_path, KernelError, KernelPath, LayoutError};

/// Where one head's rows sit in a KV cache of f32 rows: the row of position `j` is
/// `cache[j * stride + offset..j * stride + offset + head_dim]` (for a cache of `kv_heads × head_dim`
/// per position, `stride = kv_heads * head_dim` and `offset = kv_head * head_dim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Elements from one position's row to the next.
    pub stride: usize,
    /// The head's first element within a position's row.
    pub offset: usize,
    /// Elements per head.
    pub head_dim: usize,
}

/// `out = Σ_{j < ctx} softmax(scale · q·k_j)_j · v_j` over the first `ctx` positions of the key and
/// value caches `k` and `v` (same layout). `scores` is scratch (left holding the attention weights).
/// `ctx == 0` gives `out = 0`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    layout: KvLayout,
    ctx: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    attend_with(
        crate::active_path(),
        q,
        k,
        v,
        layout,
        ctx,
        scale,
        scores,
        out,
    )
}

/// [`attend`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn attend_with(
    path: KernelPath,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    layout: KvLayout,
    ctx: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_path(path)?;
    let KvLayout {
        stride,
        offset,
        head_dim: hd,
    } = layout;
    check_len("attend q", hd, q.len())?;
    check_len("attend out", hd, out.len())?;
    if offset.checked_add(hd).is_none_or(|e| e > stride) {
        return Err(KernelError::LengthMismatch {
            what: "attend layout: offset + head_dim within stride",
            expected: stride,
            actual: offset.saturating_add(hd),
        });
    }
    let need = ctx
        .checked_mul(stride)
        .ok_or(KernelError::Layout(LayoutError::Overflow {
            rows: ctx,
            cols: stride,
        }))?;
    for (what, cache) in [("attend k cache", k), ("attend v cache", v)] {
        if cache.len() < need {
            return Err(KernelError::LengthMismatch {
                what,
                expected: need,
                actual: cache.len(),
            });
        }
    }
    // Position j's row of the head: in bounds, since (j + 1) * stride <= ctx * stride <= len.
    let row = |j: usize| j * stride + offset..j * stride + offset + hd;
    scores.clear();
    scores.extend((0..ctx).map(|j| scale * arch::dot_f32(path, q, &k[row(j)])));
    crate::softmax_inplace(scores);
    out.fill(0.0);
    for (j, &s) in scores.iter().enumerate() {
        arch::axpy_f32(path, s, &v[row(j)], out);
    }
    Ok(())
}
