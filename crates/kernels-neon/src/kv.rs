//! Formats of a KV cache ([`KvFormat`]: f32, f16, or ggml's `q8_0` blocks), the conversion of f32
//! rows into them ([`kv_encode`]) and back ([`kv_decode`]), and the scalar reference of the two
//! per-row operations attention runs on a cache row (`dot` with an f32 query, `axpy` into an f32
//! output), which the SIMD paths in `arch/*/kv.rs` are checked against.

use half::f16;

use crate::{KernelError, Precision};

/// Elements per `q8_0` block (as ggml's `QK8_0`).
pub const KV_Q8_BLOCK: usize = 32;
/// Bytes per `q8_0` block: an f16 scale, then 32 signed bytes.
const Q8_BYTES: usize = 2 + KV_Q8_BLOCK;

/// How a KV cache stores its keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvFormat {
    /// 4 bytes per element, exact (what `--exact` uses).
    F32,
    /// IEEE half precision, 2 bytes per element (round to nearest even).
    F16,
    /// ggml's `block_q8_0`: per 32 elements an f16 scale `d = amax / 127` and 32 `i8` quants
    /// (`round(x / d)`), 34 bytes per 32 elements. Rows must be a multiple of 32 wide.
    Q8_0,
}

impl KvFormat {
    /// Every format, in the order of the CLI's list.
    pub const ALL: [KvFormat; 3] = [KvFormat::F32, KvFormat::F16, KvFormat::Q8_0];

    /// The CLI name: `f32`, `f16`, `q8_0`.
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F32 => "f32",
            KvFormat::F16 => "f16",
            KvFormat::Q8_0 => "q8_0",
        }
    }

    /// The cache of a precision when none is asked for: f32 in exact mode, f16 otherwise.
    pub fn default_for(precision: Precision) -> Self {
        match precision {
            Precision::Exact => KvFormat::F32,
            _ => KvFormat::F16,
        }
    }

    /// Bytes of a row of `n` elements, `None` if `n` does not fit the format (`q8_0` needs a
    /// multiple of 32) or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        match self {
            KvFormat::F32 => n.checked_mul(4),
            KvFormat::F16 => n.checked_mul(2),
            KvFormat::Q8_0 => {
                if n % KV_Q8_BLOCK != 0 {
                    None
                } else {
                    (n / KV_Q8_BLOCK).checked_mul(Q8_BYTES)
                }
            }
        }
    }

    /// Elements per block: a row's width, and a head's offset within it, must be multiples of it.
    pub fn block(self) -> usize {
        match self {
            KvFormat::Q8_0 => KV_Q8_BLOCK,
            _ => 1,
        }
    }
}

impl std::fmt::Display for KvFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        KvFormat::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("`{s}` is not a cache type (f32, f16 or q8_0)"))
    }
}

fn check_row(
    what: &'static str,
    format: KvFormat,
    n: usize,
    bytes: usize,
) -> Result<(), KernelError> {
    let expected = format.row_bytes(n).ok_or(KernelError::LengthMismatch {
        what,
        expected: n.next_multiple_of(format.block()),
        actual: n,
    })?;
    if bytes != expected {
        return Err(KernelError::LengthMismatch {
            what,
            expected,
            actual: bytes,
        });
    }
    Ok(())
}

/// Writes the f32 row `src` into `dst` in `format` (`dst.len()` must be `format.row_bytes(src.len())`).
/// The one encoder of every path, so a cache holds the same bytes whichever kernels run.
pub fn kv_encode(format: KvFormat, src: &[f32], dst: &mut [u8]) -> Result<(), KernelError> {
    check_row("kv_encode row", format, src.len(), dst.len())?;
    match format {
        KvFormat::F32 => {
            for (d, x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        KvFormat::F16 => {
            for (d, x) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
            }
        }
        KvFormat::Q8_0 => {
            for (d, x) in dst
                .chunks_exact_mut(Q8_BYTES)
                .zip(src.chunks_exact(KV_Q8_BLOCK))
            {
                // As ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d).
                let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = amax / 127.0;
                let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
                d[..2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
                for (q, v) in d[2..].iter_mut().zip(x) {
                    *q = ((v * inv).round().clamp(-127.0, 127.0) as i8) as u8;
                }
            }
        }
    }
    Ok(())
}

/// Reads the row `src` of `format` back into f32 (`dst.len()` elements).
pub fn kv_decode(format: KvFormat, src: &[u8], dst: &mut [f32]) -> Result<(), KernelError> {
    check_row("kv_decode row", format, dst.len(), src.len())?;
    match format {
        KvFormat::F32 => {
            for (x, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *x = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        KvFormat::F16 => {
            for (x, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *x = f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        KvFormat::Q8_0 => {
            for (x, b) in dst
                .chunks_exact_mut(KV_Q8_BLOCK)
                .zip(src.chunks_exact(Q8_BYTES))
            {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (o, &q) in x.iter_mut().zip(&b[2..]) {
                    *o = d * f32::from(q as i8);
                }
            }
        }
    }
    Ok(())
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Scalar reference: `q · row` for a cache row of `q.len()` elements (`row` holds exactly
/// `format.row_bytes(q.len())` bytes, checked by the caller). F32 sums in the order of
/// `scalar::dot_f32` (eight running sums), so an f32 cache gives the numbers an f32 slice did.
pub(crate) fn dot(format: KvFormat, q: &[f32], row: &[u8]) -> f32 {
    match format {
        KvFormat::F32 | KvFormat::F16 => {
            let at = |i: usize| match format {
                KvFormat::F32 => f32_at(row, i),
                _ => f16::from_le_bytes([row[2 * i], row[2 * i + 1]]).to_f32(),
            };
            let n8 = q.len() / 8 * 8;
            let mut acc = [0f32; 8];
            for j in (0..n8).step_by(8) {
                for (l, a) in acc.iter_mut().enumerate() {
                    *a += q[j + l] * at(j + l);
                }
            }
            let mut s: f32 = acc.iter().sum();
            for (i, x) in q.iter().enumerate().skip(n8) {
                s += x * at(i);
            }
            s
        }
        KvFormat::Q8_0 => q
            .chunks_exact(KV_Q8_BLOCK)
            .zip(row.chunks_exact(Q8_BYTES))
            .map(|(x, b)| {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let s: f32 = x
                    .iter()
                    .zip(&b[2..])
                    .map(|(x, &q)| x * f32::from(q as i8))
                    .sum();
                d * s
            })
            .sum(),
    }
}

/// Scalar reference: `out += alpha · row` for a cache row of `out.len()` elements.
pub(crate) fn axpy(format: KvFormat, alpha: f32, row: &[u8], out: &mut [f32]) {
    match format {
        KvFormat::F32 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o += alpha * f32_at(row, i);
            }
        }
        KvFormat::F16 => {
            for (o, s) in out.iter_mut().zip(row.chunks_exact(2)) {
                *o += alpha * f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        KvFormat::Q8_0 => {
            for (x, b) in out
                .chunks_exact_mut(KV_Q8_BLOCK)
                .zip(row.chunks_exact(Q8_BYTES))
            {
                let c = alpha * f16::from_le_bytes([b[0], b[1]]).to_f32();
                for (o, &q) in x.iter_mut().zip(&b[2..]) {
                    *o += c * f32::from(q as i8);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_sizes_follow_ggml() {
        for f in KvFormat::ALL {
            assert_eq!(f.name().parse::<KvFormat>().unwrap(), f);
        }
        assert!("q4_0".parse::<KvFormat>().unwrap_err().contains("q4_0"));
        assert_eq!(KvFormat::F32.row_bytes(192), Some(768));
        assert_eq!(KvFormat::F16.row_bytes(192), Some(384));
        assert_eq!(KvFormat::Q8_0.row_bytes(192), Some(6 * 34));
        assert_eq!(KvFormat::Q8_0.row_bytes(100), None);
        assert_eq!(KvFormat::default_for(Precision::Exact), KvFormat::F32);
        assert_eq!(KvFormat::default_for(Precision::Fast), KvFormat::F16);
        assert_eq!(KvFormat::default_for(Precision::Int8), KvFormat::F16);
    }

    #[test]
    fn q8_0_blocks_are_ggml_blocks() {
        // One block: amax 127 gives d = 1, so the quants are the rounded values.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = -3.4;
        x[2] = 2.5; // ties away from zero, as roundf
        let mut b = [0u8; 34];
        kv_encode(KvFormat::Q8_0, &x, &mut b).unwrap();
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 1.0);
        assert_eq!(&b[2..5], &[127u8, (-3i8) as u8, 3]);
        let mut back = [0.0f32; 32];
        kv_decode(KvFormat::Q8_0, &b, &mut back).unwrap();
        assert_eq!(&back[..3], &[127.0, -3.0, 3.0]);
        // An all-zero block has scale 0 and decodes to zeros.
        kv_encode(KvFormat::Q8_0, &[0.0; 32], &mut b).unwrap();
        assert!(b.iter().all(|&v| v == 0));
    }

    #[test]
    fn encode_decode_round_trips_within_the_format_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.37)
            .collect();
        for f in KvFormat::ALL {
            let mut b = vec![0u8; f.row_bytes(64).unwrap()];
            kv_encode(f, &x, &mut b).unwrap();
            let mut y = vec![0.0f32; 64];
            kv_decode(f, &b, &mut y).unwrap();
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let tol = match f {
                KvFormat::F32 => 0.0,
                KvFormat::F16 => amax / 1024.0,
                KvFormat::Q8_0 => amax / 127.0 * 0.5 + amax / 1024.0,
            };
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= tol, "{f}: {a} vs {b}");
            }
            // dot and axpy of the reference equal those of the decoded row.
            let q: Vec<f32> = (0..64).map(|i| (i as f32 * 0.1).sin()).collect();
            let want: f32 = q.iter().zip(&y).map(|(a, b)| a * b).sum();
            assert!((dot(f, &q, &b) - want).abs() < 1e-3, "{f}");
            let mut out = vec![1.0f32; 64];
            axpy(f, 2.0, &b, &mut out);
            for (o, v) in out.iter().zip(&y) {
                assert!((o - (1.0 + 2.0 * v)).abs() < 1e-4, "{f}");
            }
        }
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let mut b = [0u8; 10];
        assert!(kv_encode(KvFormat::F16, &[0.0; 4], &mut b).is_err());
        assert!(kv_encode(KvFormat::Q8_0, &[0.0; 5], &mut b).is_err());
        assert!(kv_decode(KvFormat::F32, &b, &mut [0.0; 3]).is_err());
    }
}
