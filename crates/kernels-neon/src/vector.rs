//! The small vector operations of a transformer block: dot, axpy, RMSNorm, softmax, exp and the
//! gated activations, each on the active path (or a given one, `*_with`).

use crate::{active_path, arch, check_path, scalar, KernelError, KernelPath};

/// Dot product of the common prefix of `a` and `b` (SIMD).
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    arch::dot_f32(active_path(), &a[..n], &b[..n])
}

/// The scale of [`add_fixed`]'s fixed point: 2^32 (a resolution of 2.3e-10).
pub const FIXED_SCALE: f64 = 4_294_967_296.0;

/// `acc += round(x · 2^32)` (to nearest, ties to even; saturating beyond i64's range, NaN as 0)
/// and `x = 0`, over the common prefix: f32 partial sums added in fixed point, exactly, so that a
/// sum of them does not depend on their order (offloaded decode adds each store unit's output so).
/// Every path gives the reference's integers (AVX-512DQ `vcvtps2qq`, else a vectorizable f64
/// rounding where every |x| < 2^19).
pub fn add_fixed(acc: &mut [i64], x: &mut [f32]) {
    arch::add_fixed(active_path(), acc, x);
}

/// [`add_fixed`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn add_fixed_with(path: KernelPath, acc: &mut [i64], x: &mut [f32]) -> Result<(), KernelError> {
    check_path(path)?;
    arch::add_fixed(path, acc, x);
    Ok(())
}

/// `y += alpha * x` over the common prefix (SIMD).
pub fn axpy_f32(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    arch::axpy_f32(active_path(), alpha, &x[..n], &mut y[..n]);
}

/// `out = x / sqrt(mean(x²) + eps) * weight` over the common prefix of the
/// three slices (the mean is over that prefix). Empty input leaves `out` as is.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len().min(weight.len()).min(out.len());
    if n == 0 {
        return;
    }
    let x = &x[..n];
    let ss = match active_path() {
        KernelPath::Scalar => scalar::sum_sq(x),
        p => arch::dot_f32(p, x, x),
    };
    let scale = 1.0 / (ss / n as f32 + eps).sqrt();
    for ((o, &v), &g) in out[..n].iter_mut().zip(x).zip(&weight[..n]) {
        *o = v * scale * g;
    }
}

/// [`rms_norm`] as ggml's CPU `rms_norm` computes it: the f32 squares summed in f64, the mean
/// rounded to f32, `scale = 1/sqrt(mean + eps)` in f32, `out = x · scale · w`.
pub fn rms_norm_ggml(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len().min(weight.len()).min(out.len());
    if n == 0 {
        return;
    }
    let sum: f64 = x[..n].iter().map(|&v| f64::from(v * v)).sum();
    let scale = 1.0 / ((sum / n as f64) as f32 + eps).sqrt();
    for ((o, &v), &g) in out[..n].iter_mut().zip(&x[..n]).zip(&weight[..n]) {
        *o = v * scale * g;
    }
}

/// Numerically stable softmax in place (max subtracted). Empty input is a no-op;
/// an all `-inf` input becomes uniform. `exp` as in [`silu_mul_inplace`].
pub fn softmax_inplace(x: &mut [f32]) {
    softmax(active_path(), x);
}

/// [`softmax_inplace`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn softmax_inplace_with(path: KernelPath, x: &mut [f32]) -> Result<(), KernelError> {
    check_path(path)?;
    softmax(path, x);
    Ok(())
}

/// `x = exp(x)` on an explicit path: the `exp` of [`softmax_inplace`] and [`silu_mul_inplace`]
/// (for tests).
#[doc(hidden)]
pub fn exp_inplace_with(path: KernelPath, x: &mut [f32]) -> Result<(), KernelError> {
    check_path(path)?;
    arch::exp_sub(path, x, 0.0);
    Ok(())
}

fn softmax(path: KernelPath, x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        let u = 1.0 / x.len() as f32;
        x.fill(u);
        return;
    }
    arch::exp_sub(path, x, max);
    // Summed in order, as every path did before its `exp` was vectorized: the same probabilities.
    let sum: f32 = x.iter().sum();
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `gate = silu(gate) * up` with `silu(x) = x / (1 + exp(-x))`, over the common prefix. The SIMD
/// paths compute `exp` as glibc's `expf` does, in f64 lanes (on x86_64 with glibc, libm's own value
/// bit for bit; the scalar path calls libm), the same for every element wherever a slice starts or
/// ends.
pub fn silu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    arch::silu_mul(active_path(), gate, up);
}

/// [`silu_mul_inplace`] on an explicit path (for tests and benchmarks).
#[doc(hidden)]
pub fn silu_mul_inplace_with(
    path: KernelPath,
    gate: &mut [f32],
    up: &[f32],
) -> Result<(), KernelError> {
    check_path(path)?;
    arch::silu_mul(path, gate, up);
    Ok(())
}

/// `gate = max(gate, 0) * up`, over the common prefix.
pub fn relu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = g.max(0.0) * u;
    }
}
