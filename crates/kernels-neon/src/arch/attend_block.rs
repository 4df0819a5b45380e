//! The math of [`crate::attend_cache_block_with`] once the head's keys and values are f32: scores
//! as a small matrix product of 4 query rows × 16 keys per register block (keys transposed, so each
//! step is one broadcast of a query element times 16 keys, no horizontal sums), a softmax per row,
//! and the weighted sum of the values as 4 rows × 16 dimensions per block. Written once, generic
//! and `#[inline(always)]`: each kernel path instantiates it under its target features
//! (`arch/mod.rs`), where the 16-lane loops become SIMD FMAs.

/// Query rows per register block.
const RB: usize = 4;
/// Keys (scores) or value dimensions (weighted sum) per register block.
pub(crate) const LANES: usize = 16;

/// The attention of `m` query rows of `hd` elements (`q`, row-major) over keys `kt` (transposed:
/// `kt[d * nkp + j]`, `nkp` a multiple of [`LANES`], zero past the keys) and values `v`
/// (`v[j * hd + d]`): row `i` sees keys `starts[i]..lens[i]` (at least one; `starts` empty: all
/// from 0). `s` is scratch (`m × nkp` scores, then weights); `out` gets `m × hd`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_block(
    q: &[f32],
    lens: &[usize],
    starts: &[usize],
    hd: usize,
    kt: &[f32],
    nkp: usize,
    v: &[f32],
    scale: f32,
    s: &mut Vec<f32>,
    out: &mut [f32],
) {
    let m = lens.len();
    assert!(
        starts.is_empty() || (starts.len() == m && starts.iter().zip(lens).all(|(a, l)| a < l))
    );
    assert!(
        q.len() >= m * hd
            && out.len() >= m * hd
            && nkp % LANES == 0
            && kt.len() >= hd * nkp
            && hd % LANES == 0
            && lens.iter().all(|&l| l <= nkp && v.len() >= l * hd)
    );
    s.clear();
    s.resize(m * nkp, 0.0);
    let mut r0 = 0;
    while r0 < m {
        let rr = RB.min(m - r0);
        let (l, st) = (&lens[r0..], starts.get(r0..).unwrap_or(&[]));
        match rr {
            4 => block::<4>(q, l, st, r0, hd, kt, nkp, v, scale, s, out),
            3 => block::<3>(q, l, st, r0, hd, kt, nkp, v, scale, s, out),
            2 => block::<2>(q, l, st, r0, hd, kt, nkp, v, scale, s, out),
            _ => block::<1>(q, l, st, r0, hd, kt, nkp, v, scale, s, out),
        }
        r0 += rr;
    }
}

/// Rows `r0..r0 + R` of [`attend_block`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn block<const R: usize>(
    q: &[f32],
    lens: &[usize],
    starts: &[usize],
    r0: usize,
    hd: usize,
    kt: &[f32],
    nkp: usize,
    v: &[f32],
    scale: f32,
    s: &mut [f32],
    out: &mut [f32],
) {
    let lens: [usize; R] = std::array::from_fn(|r| lens[r]);
    let len = lens.iter().copied().max().unwrap_or(0);
    // Each row's first key (0 without `starts`); keys before the block's first one are skipped.
    let starts: [usize; R] = std::array::from_fn(|r| starts.get(r).copied().unwrap_or(0));
    let first = starts.iter().copied().min().unwrap_or(0) / LANES * LANES;
    let qs: [&[f32]; R] = std::array::from_fn(|r| &q[(r0 + r) * hd..(r0 + r + 1) * hd]);
    // Scores of every key up to the block's longest row, 16 at a time.
    for j0 in (first..len).step_by(LANES) {
        let mut acc = [[0f32; LANES]; R];
        for d in 0..hd {
            let k: &[f32; LANES] = kt[d * nkp + j0..d * nkp + j0 + LANES].try_into().unwrap();
            for (a, qr) in acc.iter_mut().zip(&qs) {
                let x = qr[d];
                for (al, &kl) in a.iter_mut().zip(k) {
                    *al = x.mul_add(kl, *al);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let row = &mut s[(r0 + r) * nkp + j0..(r0 + r) * nkp + j0 + LANES];
            for (o, &al) in row.iter_mut().zip(a) {
                *o = al * scale;
            }
        }
    }
    // Each row's weights over its own keys; zero past them.
    for (r, (&l, &st)) in lens.iter().zip(&starts).enumerate() {
        let row = &mut s[(r0 + r) * nkp..(r0 + r + 1) * nkp];
        row[..st].fill(0.0);
        crate::softmax_inplace(&mut row[st..l]);
        row[l..].fill(0.0);
    }
    // Weighted sum of the values, 16 dimensions at a time.
    let ss: [&[f32]; R] = std::array::from_fn(|r| &s[(r0 + r) * nkp..(r0 + r + 1) * nkp]);
    for d0 in (0..hd).step_by(LANES) {
        let mut acc = [[0f32; LANES]; R];
        for j in first..len {
            let vj: &[f32; LANES] = v[j * hd + d0..j * hd + d0 + LANES].try_into().unwrap();
            for (a, sr) in acc.iter_mut().zip(&ss) {
                let p = sr[j];
                for (al, &vl) in a.iter_mut().zip(vj) {
                    *al = p.mul_add(vl, *al);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            out[(r0 + r) * hd + d0..(r0 + r) * hd + d0 + LANES].copy_from_slice(a);
        }
    }
}
