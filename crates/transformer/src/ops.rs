//! Small helpers over the kernels shared by the forward pass and the FFN executors.

use kernels_neon::{Precision, QMatrix};

use crate::error::{kernel, Result};

/// How the tokens of a forward step relate to each other, which picks the product kernel for more
/// than one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepKind {
    /// Consecutive tokens of one sequence (a prompt): a matrix product, over an f32 tile in `Exact`
    /// (prompts scored exactly), over an integer tile in `Fast` and `Int8` where the kernel path has
    /// one (each token's integer products those of a decode step, in `Int8` for prompts of 32
    /// tokens or more over K-quants; in `Fast` below 32 tokens on x86, 8 elsewhere, the decode
    /// kernels themselves), else
    /// the f32 or bf16 tile ([`kernels_neon::matmul`]).
    #[default]
    Prompt,
    /// One decode token of each of several sequences (Best-of-N): each token as a decode step would
    /// compute it, the weights read once for the batch ([`kernels_neon::matvec_batch`]).
    Decode,
}

/// `y = w · x` for `n` tokens of a prompt: a matrix-vector product for one token, a matrix product
/// for more.
pub fn mm(
    w: &QMatrix<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    p: Precision,
    what: &str,
) -> Result<()> {
    mm_step(StepKind::Prompt, w, x, n, y, p, what)
}

/// `y = w · x` for `n` tokens of a step of `kind`.
pub fn mm_step(
    kind: StepKind,
    w: &QMatrix<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    p: Precision,
    what: &str,
) -> Result<()> {
    match (n, kind) {
        (1, _) => kernels_neon::matvec(w, x, y, p).map_err(kernel(what)),
        (_, StepKind::Prompt) => kernels_neon::matmul(w, x, n, y, p).map_err(kernel(what)),
        (_, StepKind::Decode) => kernels_neon::matvec_batch(w, x, n, y, p).map_err(kernel(what)),
    }
}
