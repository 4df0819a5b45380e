//! The double's arithmetic: plain f32 loops, the reference an accelerator is compared with.

/// `y[r][o] = sum_i x[r][i] * w[o][i] + bias[o]` for `rows` rows; `w` is `[out, inp]` row-major.
pub(crate) fn fully_connected(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    rows: usize,
    inp: usize,
    out: usize,
) -> Vec<f32> {
    let mut y = vec![0.0f32; rows * out];
    for r in 0..rows {
        let xr = &x[r * inp..(r + 1) * inp];
        for o in 0..out {
            let wr = &w[o * inp..(o + 1) * inp];
            let dot: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
            y[r * out + o] = dot + bias.map_or(0.0, |b| b[o]);
        }
    }
    y
}

/// Element-wise `a * b` (same shapes).
pub(crate) fn multiply(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x * y).collect()
}

/// Element-wise `a + b` (same shapes).
pub(crate) fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// `1 / (1 + e^-x)`.
pub(crate) fn sigmoid(a: &[f32]) -> Vec<f32> {
    a.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect()
}

/// `max(x, 0)`.
pub(crate) fn relu(a: &[f32]) -> Vec<f32> {
    a.iter().map(|x| x.max(0.0)).collect()
}
