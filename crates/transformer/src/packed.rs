//! Copies of a model's Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q4_K, Q5_K, Q6_K and Q8_0 matrices
//! (attention, output, a dense FFN, a Mixture-of-Experts layer's experts: [`PackedExperts`])
//! repacked eight rows at a time ([`Q40x8`]), made once at load for decode (`Precision::Fast`)
//! where they give its results bit for bit ([`Q40x8::exact_on`]: the nibble formats, Q4_K, Q5_K
//! and Q6_K on the AVX2 path, Q4_0, IQ4_NL and Q8_0 on both x86 paths; Q8_0, the nibble formats,
//! Q4_K, Q5_K and Q6_K on the aarch64 paths with `dotprod`). The forward pass takes a copy where
//! one exists for a step of one token in `Fast`, for a decode step of several tokens where the copy
//! serves it ([`Q40x8::serves_steps`]), and for a prompt where the copy's batch beats the
//! original's prompt tile ([`Q40x8::takes_prompt`]: below 32 tokens, whose products are decode's,
//! and up to 64 Q4_0 on AVX-512, Q4_0 and Q4_1 on AVX2): `step_reads`; an MoE layer's experts'
//! copies for every product of a step that runs the decode kernels (a batched decode step, a
//! prompt's small expert groups); longer prompts and every other path keep reading the file's
//! layout. The copies' bytes are [`Packed::bytes`], for whoever counts the process's memory.

use kernels_neon::{CopyBytes, KernelPath, Precision, Q40x8, QMatrix, ZeroedBytes};
use model_format::{advise, AnonArena, AnonPages, Paging};

use crate::layer::{Layer, LayerFfn};
use crate::moe::{MoeLayer, PackedExperts};
use crate::ops::StepKind;

/// Whether a `Fast` step of `n` tokens of `kind` reads copy `p` (each token's results then its
/// one-token step's bits where the copy is exact, [`Q40x8::exact_on`]): one token; a decode step's
/// tokens where the copy serves such steps ([`Q40x8::serves_steps`]: it batches them, or on aarch64
/// with `dotprod` the original's batch runs a product a token too); a prompt's where
/// [`Q40x8::takes_prompt`] (the copies'
/// kernels read each group once for two to four tokens: prompts of 8 to 31 tokens over Q4_0,
/// AVX-512, 1.2-1.5x the file layout's batch).
pub(crate) fn step_reads(p: &Q40x8, kind: StepKind, n: usize) -> bool {
    n == 1
        || match kind {
            StepKind::Decode => p.serves_steps(),
            StepKind::Prompt => p.takes_prompt(n),
        }
}

/// A layer's repacked matrices (`None`: that matrix keeps the file's layout).
#[derive(Default)]
pub struct PackedLayer {
    /// The q, k and v projections, taken together only when all three are repacked.
    pub qkv: Option<[Q40x8; 3]>,
    /// The attention output projection.
    pub wo: Option<Q40x8>,
    /// A gated FFN's gate and up, taken together only when both are repacked.
    pub gate_up: Option<[Q40x8; 2]>,
    /// A gated FFN's down projection.
    pub down: Option<Q40x8>,
    /// A Mixture-of-Experts FFN's experts.
    pub experts: Option<PackedExperts>,
}

/// Every layer's repacked matrices and the output projection's.
pub struct Packed {
    /// Per layer, in order.
    pub layers: Vec<PackedLayer>,
    /// The output projection (not taken while it is streamed).
    pub output: Option<Q40x8>,
}

impl Packed {
    /// The repacked copies of `layers` and `output`: every matrix whose format and shape the layout
    /// takes ([`Q40x8::repack`]) where the copy is exact on the active path ([`takes`]); the FFN's
    /// too where `ffn` (a gated FFN's matrices, a Mixture-of-Experts layer's experts when all of
    /// them repack: [`PackedExperts`]). Where `mapped` (every matrix a
    /// slice of the file's mapping), each original's pages leave the process's memory once copied
    /// ([`Paging::Drop`]: they stay in the page cache, and a prompt step that reads them faults
    /// them back in), so that the copies do not double what the process holds.
    pub fn new(layers: &[Layer<'_>], output: &QMatrix<'_>, ffn: bool, mapped: bool) -> Packed {
        // Each run of an original's rows leaves as soon as it is copied (so that a large matrix,
        // an output projection, is never held twice whole), and the whole original once copied.
        let drop_rows = |rows: &[u8]| {
            if mapped {
                advise(rows, Paging::Drop);
            }
        };
        let repack_in = |m: &QMatrix<'_>, zeroed: ZeroedBytes<'_>| {
            let p = takes(m)
                .then(|| Q40x8::repack_in(m, zeroed, &drop_rows))
                .flatten();
            if mapped && p.is_some() {
                advise(m.data(), Paging::Drop);
            }
            p
        };
        let repack = |m: &QMatrix<'_>| repack_in(m, &copy_bytes);
        // Matrices taken together (q, k, v; gate, up) are copied only when all of them are.
        let layers = layers
            .iter()
            .map(|l| {
                let qkv = if takes_all(&[&l.wq, &l.wk, &l.wv]) {
                    [&l.wq, &l.wk, &l.wv].map(repack)
                } else {
                    [None, None, None]
                };
                let (gate_up, down) = match (&l.ffn, ffn) {
                    (LayerFfn::Gated(f), true) => {
                        let [g, u] = if takes_all(&[&f.gate, &f.up]) {
                            [&f.gate, &f.up].map(repack)
                        } else {
                            [None, None]
                        };
                        (g.zip(u).map(|(g, u)| [g, u]), repack(&f.down))
                    }
                    _ => (None, None),
                };
                let experts = match (&l.ffn, ffn) {
                    (LayerFfn::Moe(m), true) => {
                        // The layer's experts share one mapping (each is below a huge page, all
                        // together are not); a copy the arena has no room for gets its own.
                        let arena = experts_arena(&m.weights);
                        let zeroed = |len: usize| -> Box<dyn CopyBytes> {
                            match arena.as_ref().and_then(|a| a.take(len)) {
                                Some(p) => Box::new(p),
                                None => copy_bytes(len),
                            }
                        };
                        let repack = |m: &QMatrix<'_>| repack_in(m, &zeroed);
                        PackedExperts::new(&m.weights, &takes, &repack)
                    }
                    _ => None,
                };
                PackedLayer {
                    qkv: match qkv {
                        [Some(q), Some(k), Some(v)] => Some([q, k, v]),
                        _ => None,
                    },
                    wo: repack(&l.wo),
                    gate_up,
                    down,
                    experts,
                }
            })
            .collect();
        Packed {
            layers,
            output: repack(output),
        }
    }

    /// At most the bytes [`Packed::new`] would make for these arguments (a copy is as large as its
    /// original: every matrix that repacks counted, before any is made).
    pub fn planned_bytes(layers: &[Layer<'_>], output: &QMatrix<'_>, ffn: bool) -> usize {
        let fits = |ms: &[&QMatrix<'_>]| -> usize {
            ms.iter().filter(|m| takes(m)).map(|m| m.data().len()).sum()
        };
        // q, k and v (gate and up) only together, as [`Packed::new`] takes them.
        let together = |ms: &[&QMatrix<'_>]| if takes_all(ms) { fits(ms) } else { 0 };
        let ffn_bytes = |l: &Layer<'_>| match (&l.ffn, ffn) {
            (LayerFfn::Gated(f), true) => together(&[&f.gate, &f.up]) + fits(&[&f.down]),
            // All of a layer's experts or none, as [`PackedExperts::new`] takes them.
            (LayerFfn::Moe(m), true) => together(&m.weights.expert_matrices().collect::<Vec<_>>()),
            _ => 0,
        };
        let layer =
            |l: &Layer<'_>| together(&[&l.wq, &l.wk, &l.wv]) + fits(&[&l.wo]) + ffn_bytes(l);
        layers.iter().map(layer).sum::<usize>() + fits(&[output])
    }

    /// Bytes of every copy.
    pub fn bytes(&self) -> usize {
        let opt = |m: &Option<Q40x8>| m.as_ref().map_or(0, Q40x8::bytes);
        self.layers
            .iter()
            .map(|l| {
                let sum = |ms: &[Q40x8]| ms.iter().map(Q40x8::bytes).sum::<usize>();
                l.qkv.as_ref().map_or(0, |m| sum(m))
                    + l.gate_up.as_ref().map_or(0, |m| sum(m))
                    + opt(&l.wo)
                    + opt(&l.down)
                    + l.experts.as_ref().map_or(0, PackedExperts::bytes)
            })
            .sum::<usize>()
            + opt(&self.output)
    }

    /// Matrices repacked.
    pub fn count(&self) -> usize {
        self.layers
            .iter()
            .map(|l| {
                3 * usize::from(l.qkv.is_some())
                    + 2 * usize::from(l.gate_up.is_some())
                    + usize::from(l.wo.is_some())
                    + usize::from(l.down.is_some())
                    + l.experts.as_ref().map_or(0, PackedExperts::count)
            })
            .sum::<usize>()
            + usize::from(self.output.is_some())
    }
}

/// From this size on a copy lives in pages of its own mapping that ask for huge pages
/// ([`AnonPages`]; below, in the heap): one huge page.
const HUGE_PAGE: usize = 2 << 20;

/// The memory of a copy of `len` bytes (zeroed): [`AnonPages`] from [`HUGE_PAGE`] on, where a
/// matrix streamed once a token then needs a TLB entry per 2 MiB instead of per 4 KiB. Measured
/// 2026-12-06 (2 threads, `sparrow bench -p 0 -n 32 -r 2`, two rounds, Intel Xeon): Gemma 3 270M
/// Q4_K_M, whose Q8_0 output projection (the tied embeddings, 170 MiB) is copied, 67.1-71.2 tok/s
/// with the copy in ordinary pages and 79.3-81.0 in these with AVX2 forced, 68.7-70.3 and 82.1-82.7
/// on the AVX-512 path (67.9-69.7 with no copy); Qwen2.5-Coder-0.5B Q4_K_M (its Q8_0 output
/// projection, 138 MiB) 41.8-42.6 and 46.9-47.0 on the AVX-512 path, where the copy in ordinary
/// pages was slower than no copy (44.2-44.4).
fn copy_bytes(len: usize) -> Box<dyn CopyBytes> {
    if len >= HUGE_PAGE {
        if let Ok(p) = AnonPages::zeroed(len) {
            return Box::new(p);
        }
    }
    Box::new(vec![0u8; len])
}

/// One mapping for the copies of `w`'s experts (and its shared expert) where they repack and come
/// to [`HUGE_PAGE`] or more: each expert's matrices are below a huge page (Qwen3-30B-A3B's 0.9
/// MiB, OLMoE's 1.2 MiB as Q4_0) and could have none in mappings of their own.
fn experts_arena(w: &MoeLayer<'_>) -> Option<AnonArena> {
    let lens = w
        .expert_matrices()
        .filter(|m| takes(m))
        .map(|m| m.data().len());
    let bytes = AnonArena::bytes_for(lens);
    (bytes >= HUGE_PAGE)
        .then(|| AnonArena::zeroed(bytes).ok())
        .flatten()
}

/// Whether `m` is copied: its format and shape repack ([`Q40x8::fits`]) and the copy gives on the
/// active path the bits of the original's products ([`Q40x8::exact_on`]), which the batched steps
/// (speculation's verification, a prompt's groups) that read the original must agree with.
pub fn takes(m: &QMatrix<'_>) -> bool {
    Q40x8::fits(m) && Q40x8::exact_on(kernels_neon::active_path(), m.format())
}

/// Whether every one of `ms` is copied ([`takes`]): matrices taken together are copied only then.
fn takes_all(ms: &[&QMatrix<'_>]) -> bool {
    ms.iter().all(|m| takes(m))
}

/// Whether repacked copies would be taken: the AVX2 or AVX-512 path, or an aarch64 one with
/// `dotprod`, `precision` `Fast`, and not turned off (`SPARROW_Q40X8=off`, for comparisons).
pub fn applies(precision: Precision) -> bool {
    precision == Precision::Fast
        && matches!(
            kernels_neon::active_path(),
            KernelPath::Avx2Fma
                | KernelPath::Avx512
                | KernelPath::NeonDotprod
                | KernelPath::NeonI8mm
        )
        && std::env::var("SPARROW_Q40X8").map_or(true, |v| v != "off")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rows x cols` Q8_0 blocks: an f16 scale of 1/64, then 32 quants from a running pattern
    /// started at `seed`.
    fn q8_0_data(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut data = Vec::with_capacity(rows * cols / 32 * 34);
        let mut v = seed;
        for _ in 0..rows * cols / 32 {
            data.extend_from_slice(&0x2400u16.to_le_bytes());
            for _ in 0..32 {
                v = v.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                data.push((v >> 16) as u8);
            }
        }
        data
    }

    /// `W x` through `p` against `q`: bit for bit, and not all zero.
    fn same_products(p: &Q40x8, q: &Q40x8) {
        let x: Vec<f32> = (0..p.cols())
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let (mut a, mut b) = (vec![0f32; p.rows()], vec![1f32; p.rows()]);
        p.matvec(&x, &mut a).unwrap();
        q.matvec(&x, &mut b).unwrap();
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
        assert!(a.iter().any(|&y| y != 0.0));
    }

    /// Many copies below a huge page in one [`AnonArena`] (as an MoE layer's experts): each gives
    /// the bits of its copy in the heap.
    #[test]
    fn small_copies_in_one_arena_give_the_heap_copies_bits() {
        let (rows, cols) = (64, 1024);
        let datas: Vec<Vec<u8>> = (0..40).map(|i| q8_0_data(rows, cols, i + 1)).collect();
        let ms: Vec<QMatrix<'_>> = datas
            .iter()
            .map(|d| QMatrix::new(kernels_neon::WeightFormat::Q8_0, rows, cols, d).unwrap())
            .collect();
        let bytes = AnonArena::bytes_for(datas.iter().map(Vec::len));
        assert!(bytes >= HUGE_PAGE);
        let arena = AnonArena::zeroed(bytes).unwrap();
        let zeroed = |len: usize| -> Box<dyn CopyBytes> { Box::new(arena.take(len).unwrap()) };
        let own: Vec<Q40x8> = ms
            .iter()
            .map(|m| Q40x8::repack_in(m, &zeroed, &|_| {}).unwrap())
            .collect();
        assert!(arena.take(1).is_none(), "the arena is used up");
        drop(arena);
        for (m, o) in ms.iter().zip(&own) {
            same_products(o, &Q40x8::repack(m).unwrap());
        }
    }

    /// A copy of [`HUGE_PAGE`] bytes and more lives in [`AnonPages`] and gives the bits of one in
    /// the heap.
    #[test]
    fn a_large_copy_in_its_own_pages_gives_the_heap_copys_bits() {
        let (rows, cols) = (2048, 1024);
        let data = q8_0_data(rows, cols, 1);
        let m = QMatrix::new(kernels_neon::WeightFormat::Q8_0, rows, cols, &data).unwrap();
        assert!(data.len() >= HUGE_PAGE);
        let heap = Q40x8::repack(&m).unwrap();
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let count = |rows: &[u8]| {
            runs.fetch_add(rows.len(), std::sync::atomic::Ordering::Relaxed);
        };
        let own = Q40x8::repack_in(&m, &copy_bytes, &count).unwrap();
        // Every row told of once.
        assert_eq!(runs.into_inner(), data.len());
        assert_eq!(own.bytes(), heap.bytes());
        same_products(&own, &heap);
    }
}
