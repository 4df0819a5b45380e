//! The kernel of Q8_0 rows repacked eight at a time ([`crate::Q40x8`]), 16-bit activations
//! ([`Precision::Fast`](crate::Precision::Fast)), AVX2 (both x86 paths), one token.
//!
//! A group block (32 columns of 8 rows, 272 bytes) holds the rows' f16 scales, then per quad of
//! rows (rows `4q..4q + 4`) and chunk of four columns `k` the quad's 4 bytes each, row after row
//! (16 bytes; the layout `repack_q80` writes, which `arch/aarch64/q80x8.rs` reads too).
//!
//! Results: the one-row Q8_0 kernel's (`matvec_i16.rs`'s `dot_i16_rows`) bit for bit. That kernel
//! keeps per row one f32 lane `m` a block of `(d_w * d_x) * s_m` FMAs, `s_m` the exact sum of the
//! block's columns `2m, 2m + 1, 16 + 2m, 17 + 2m`, and sums the 8 lanes at the end (`hsum`'s
//! tree). Here accumulator `(q, k)` holds, in lane `2r + p`, row `4q + r`'s lane `m = 2k + p`: a
//! chunk's 16 bytes widened to i16 and `vpmaddwd` with its four activations give each row's two
//! pairs, chunks `k` and `k + 4` added give the lanes' exact sums, and the same FMA in the same
//! order follows; the last sums take `hsum`'s tree across the accumulators.

use std::arch::x86_64::*;

use super::kquant_rows::prefetch_block;
use crate::quant::QActs16;

/// Bytes of a group block: 8 f16 scales and 8 rows of 32 quants.
const GROUP_BLOCK: usize = 16 + 256;

/// The dots of the 8 rows of one Q8_0 group (`group`: its group blocks) with `xq`.
///
/// # Safety
/// AVX2/FMA/F16C present.
// The quad and chunk indices reach several arrays at once (loops over constants, unrolled).
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q80x8_group(group: &[u8], xq: &QActs16) -> [f32; 8] {
    let nb = xq.d.len();
    assert!(group.len() >= nb * GROUP_BLOCK && xq.qs.len() >= nb * 32);
    // Lane `2r + p` of accumulator `[q][k]`: row `4q + r`'s one-row lane `2k + p`.
    let mut acc = [[_mm256_setzero_ps(); 4]; 2];
    // Each row's scale twice, for quads 0 and 1.
    let dup = [
        _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
        _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7),
    ];
    for b in 0..nb {
        // SAFETY: b < nb: group block b (272 bytes at b * 272) and activation block b (qs[b*32..
        // b*32 + 32], d[b]) are in bounds (asserted above).
        unsafe {
            let gp = group.as_ptr().add(b * GROUP_BLOCK);
            let xp = xq.qs.as_ptr().add(b * 32);
            // The block's five lines a dense row's distance on (`STREAM_PREFETCH`).
            prefetch_block::<1>(gp, GROUP_BLOCK);
            let d = _mm256_mul_ps(
                _mm256_cvtph_ps(_mm_loadu_si128(gp as *const __m128i)),
                _mm256_set1_ps(*xq.d.get_unchecked(b)),
            );
            // The same f32 products as the one-row kernel's `dw * dx`.
            let scale = [
                _mm256_permutevar8x32_ps(d, dup[0]),
                _mm256_permutevar8x32_ps(d, dup[1]),
            ];
            for k in 0..4 {
                // Columns 4k..4k + 4 and 16 + 4k..16 + 4k + 4, each four broadcast to the rows.
                let x0 = _mm256_set1_epi64x(std::ptr::read_unaligned(xp.add(4 * k) as *const i64));
                let x1 =
                    _mm256_set1_epi64x(std::ptr::read_unaligned(xp.add(16 + 4 * k) as *const i64));
                for q in 0..2 {
                    let w = |c: usize| {
                        _mm256_cvtepi8_epi16(_mm_loadu_si128(
                            gp.add(16 + 128 * q + 16 * c) as *const __m128i
                        ))
                    };
                    // |q_w| <= 128, |q_x| <= 32767: each lane's four products at most 2^24 in size.
                    let s = _mm256_add_epi32(
                        _mm256_madd_epi16(w(k), x0),
                        _mm256_madd_epi16(w(k + 4), x1),
                    );
                    acc[q][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), scale[q], acc[q][k]);
                }
            }
        }
    }
    // `hsum`'s tree over the lanes m: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)); lanes m and
    // m + 4 are accumulators k and k + 2, the last pair each row's two lanes (`hadd`, whose rows
    // come out 0, 1, 4, 5, 2, 3, 6, 7). Then `+ 0.0` as the one-row kernel's (its zero term of the
    // formats with a min).
    // SAFETY: the features per contract; 8 f32 written to an 8-element array.
    unsafe {
        let w: [__m256; 2] = std::array::from_fn(|q| {
            let [a0, a1, a2, a3] = acc[q];
            _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3))
        });
        let rows = _mm256_permutevar8x32_ps(
            _mm256_hadd_ps(w[0], w[1]),
            _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7),
        );
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(rows, _mm256_setzero_ps()));
        out
    }
}
