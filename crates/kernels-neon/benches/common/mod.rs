//! Shared bench helpers: deterministic random weight matrices and the bench thread pool.

use half::f16;
use kernels_neon::WeightFormat;

/// A tiny deterministic xorshift generator.
pub struct XorShift(pub u64);

impl XorShift {
    /// Next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random bytes in `format` with sane block scales (so sums stay finite); `seed` picks the stream.
pub fn random_matrix(format: WeightFormat, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = XorShift(0x1234_5678_9abc_def0u64 ^ seed.wrapping_mul(0x9E37_79B9));
    let rb = format.row_bytes(cols).unwrap();
    let mut out = vec![0u8; rows * rb];
    for c in out.chunks_mut(8) {
        c.copy_from_slice(&rng.next().to_le_bytes()[..c.len()]);
    }
    let scale = f16::from_f32(0.01).to_le_bytes();
    if let WeightFormat::I4Hybrid { outliers_per_row } = format {
        // Per row: f32 scales, random nibbles, k spread-out (valid) outlier
        // columns with random values, zero padding.
        let k = usize::from(outliers_per_row);
        let n = 8 + cols / 2;
        for (r, row) in out.chunks_exact_mut(rb).enumerate() {
            row[..4].copy_from_slice(&0.01f32.to_le_bytes());
            row[4..8].copy_from_slice(&0.05f32.to_le_bytes());
            for j in 0..k {
                let col = ((j * cols / k + r) % cols) as u16;
                row[n + 2 * j..n + 2 * j + 2].copy_from_slice(&col.to_le_bytes());
            }
            row[n + 3 * k..].fill(0);
        }
    } else if format.is_quantized() {
        for blk in out.chunks_exact_mut(format.block_bytes()) {
            match format {
                // Q6_K, Q3_K and Q2_K keep `d` (and Q2_K `dmin`) last.
                WeightFormat::Q6_K => blk[208..210].copy_from_slice(&scale),
                WeightFormat::Q3_K => blk[108..110].copy_from_slice(&scale),
                WeightFormat::Q2_K => {
                    blk[80..82].copy_from_slice(&scale);
                    blk[82..84].copy_from_slice(&scale);
                }
                _ => blk[..2].copy_from_slice(&scale),
            }
            match format {
                WeightFormat::Q4_1 => {
                    blk[2..4].copy_from_slice(&f16::from_f32(-0.05).to_le_bytes())
                }
                WeightFormat::Q4_K | WeightFormat::Q5_K => blk[2..4].copy_from_slice(&scale),
                _ => {}
            }
        }
    } else if format == WeightFormat::F16 {
        out.chunks_exact_mut(2)
            .for_each(|e| e.copy_from_slice(&scale));
    } else if format == WeightFormat::F32 {
        out.chunks_exact_mut(4)
            .for_each(|e| e.copy_from_slice(&0.01f32.to_le_bytes()));
    }
    out
}

/// A rayon pool of `BENCH_THREADS` threads (default 2).
pub fn pool() -> rayon::ThreadPool {
    let threads = std::env::var("BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}
