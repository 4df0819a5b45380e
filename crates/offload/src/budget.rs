//! Memory-budget arithmetic for flash offload: how many bytes of FFN units the neuron cache may hold,
//! given a budget for the whole process or a share of the FFN, and the size of a KV cache (computed
//! here and nowhere else).
//!
//! Under a process budget ([`MemoryBudget::Process`]) what stays resident whatever the cache holds is
//! counted first ([`Resident`]: the process before it touches weights, the resident file, the KV cache at
//! the engine's context, the predictors); the FFN cache gets the rest. A prompt step's working memory
//! ([`prompt_step_bytes`]) is lent by the neuron cache for the step's duration
//! ([`crate::Offload`]), so it needs no reservation of its own. A budget that leaves nothing is an
//! error naming both figures.
//!
//! The KV cache is reserved whole: the full `--ctx` at the engine's cache type (f32, f16 or `q8_0`),
//! although the cache itself only allocates the chunks the positions it holds need
//! ([`transformer::KvCache`]). So a conversation that grows to the full context never takes the process
//! past its budget.

use std::path::Path;

use kernels_neon::WeightFormat;

use crate::error::{OffloadError, Result};
use transformer::config::ModelConfig;
use transformer::model::{LayerFfn, Model};

/// Most tokens per forward step of a prompt over an offloaded model: a longer prompt runs in steps
/// of at most this many, so that its working memory ([`prompt_step_bytes`]), which the neuron cache
/// lends it, is bounded. Each step streams the layers' cold units once
/// ([`crate::Offload`]), so longer steps read less and batch more: on Qwen2.5-Coder-0.5B
/// at a 211 MiB budget, 512-token steps ran a 512-token prompt at 213 tok/s where 128-token steps
/// ran it at 167 (BENCHMARKS). Where the cache is small, steps are shorter
/// ([`offload_prompt_step`]).
pub const OFFLOAD_PROMPT_STEP: usize = 512;

/// Fewest tokens per offloaded prompt step that [`offload_prompt_step`] halves down to (the step
/// of earlier builds): each step streams the cold FFN again, so shorter ones cost more than the
/// memory they save. On Qwen2.5-Coder-0.5B at a 105 MiB budget (a 4.9 MiB neuron cache), 32-token
/// steps streamed 3.3 GiB for a 512-token prompt and ran it at 64 tok/s; 128-token steps, 144 tok/s
/// at a peak RSS 7% above the budget.
pub const OFFLOAD_PROMPT_STEP_MIN: usize = 128;

/// Tokens per step of a prompt over a store whose neuron cache holds `cache_bytes` of an FFN of
/// `ffn_bytes`: [`OFFLOAD_PROMPT_STEP`], halved (to no fewer than [`OFFLOAD_PROMPT_STEP_MIN`]) while
/// the step's working memory `step_bytes(tokens)` is more than half the cache, where the cache's
/// budget binds and so lends the step its memory. Half the cache stays to hold hot units.
pub fn offload_prompt_step(
    cache_bytes: u64,
    ffn_bytes: u64,
    step_bytes: impl Fn(usize) -> u64,
) -> usize {
    let mut step = OFFLOAD_PROMPT_STEP;
    if cache_bytes >= ffn_bytes {
        return step;
    }
    while step > OFFLOAD_PROMPT_STEP_MIN && step_bytes(step) > cache_bytes / 2 {
        step /= 2;
    }
    step
}

/// Bytes a prompt step of `tokens` tokens over a neuron store holds while it runs, besides the
/// caches: the activations of its tokens (the residual stream, normed input, queries, keys,
/// values, attention and FFN outputs, the FFN's per-chunk gate and up values and down sums), the
/// streamed layer's buffers (two chunks in flight and one gathered, of `prefill_neurons` bundles of
/// `bundle_bytes` each) and what the chunk's down product holds besides them
/// ([`kernels_neon::matmul_t_scratch_bytes`] of `prefill_neurons` rows in `down_format` on
/// `threads` threads in `precision`: its bands' outputs, the down sums once more, and the bands in
/// flight dequantized, or quantized again and repacked).
pub fn prompt_step_bytes(
    cfg: &ModelConfig,
    tokens: usize,
    prefill_neurons: usize,
    bundle_bytes: u64,
    down_format: WeightFormat,
    threads: usize,
    precision: kernels_neon::Precision,
) -> u64 {
    let (d, q, kv) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim());
    let per_token = 4 * (5 * d + 2 * q + 2 * kv + 2 * prefill_neurons) as u64;
    let chunk = prefill_neurons as u64 * bundle_bytes;
    let down = kernels_neon::matmul_t_scratch_bytes(
        down_format,
        prefill_neurons,
        d,
        tokens,
        threads,
        precision,
    );
    per_token * tokens as u64 + 3 * chunk + down
}

/// The memory budget, the one type that carries it from where it is given (`--memory-budget` or
/// `--ffn-resident`, a plan's neuron cache, the server's `POST /admin/memory-budget`) to the neuron
/// cache. [`MemoryBudget::cache_bytes`] turns it into the cache's size: the one place the memory that
/// stays resident besides the cache is subtracted, at load ([`ffn_cache_bytes`]) and live
/// ([`crate::CacheControl::set_budget`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum MemoryBudget {
    /// A budget in bytes for the whole process (`--memory-budget`): what stays resident is counted
    /// first, the FFN cache gets the rest.
    Process(u64),
    /// This share of the FFN's bytes (`--ffn-resident`, clamped to 0..=1).
    Share(f64),
    /// This many bytes of FFN cache (a plan's neuron cache, `planner::Plan::ffn_cache_bytes`).
    Bytes(u64),
    /// A process budget of `budget` bytes with the neuron cache a plan made for that budget (and
    /// the context it was made at) sized: `cache` bytes (`planner::Plan::ffn_cache_bytes`), which
    /// the engine takes as it is; only where what stays resident, measured at load, leaves less
    /// (the plan's account of it was short), the cache is what the budget leaves.
    Planned {
        /// The whole budget, as [`MemoryBudget::Process`].
        budget: u64,
        /// The plan's neuron cache.
        cache: u64,
    },
    /// The whole FFN may be cached.
    #[default]
    All,
}

impl MemoryBudget {
    /// Bytes of neuron cache this budget gives over an FFN of `ffn` bytes (uncapped: a cache larger
    /// than the FFN holds all of it), where `resident` bytes stay in memory besides the cache
    /// (asked only for a process budget). `None`: a process budget of `resident` bytes or less,
    /// which leaves the cache nothing.
    pub fn cache_bytes(self, ffn: u64, resident: impl FnOnce() -> u64) -> Option<u64> {
        match self {
            MemoryBudget::Process(b) => b.checked_sub(resident()).filter(|&c| c > 0),
            MemoryBudget::Planned { budget, cache } => budget
                .checked_sub(resident())
                .filter(|&c| c > 0)
                .map(|c| c.min(cache)),
            MemoryBudget::Share(f) => Some((f.clamp(0.0, 1.0) * ffn as f64) as u64),
            MemoryBudget::Bytes(b) => Some(b),
            MemoryBudget::All => Some(u64::MAX),
        }
    }

    /// The whole process's budget, for a process budget (planned or not).
    pub fn process(self) -> Option<u64> {
        match self {
            MemoryBudget::Process(b) | MemoryBudget::Planned { budget: b, .. } => Some(b),
            _ => None,
        }
    }
}

/// What stays in memory besides the FFN cache, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resident {
    /// What the process holds before any weight is touched (code, tokenizer, heap).
    pub process: u64,
    /// The resident model file (everything but the FFN).
    pub file: u64,
    /// The KV cache at the engine's whole context and cache type ([`ModelConfig::kv_cache_bytes`]).
    pub kv_cache: u64,
    /// The predictor file, when one is used.
    pub predictors: u64,
    /// Reads queued ahead of their decode step and their copies ([`read_ahead_bytes`]).
    pub read_ahead: u64,
}

impl Resident {
    /// Their sum.
    pub fn total(&self) -> u64 {
        self.process + self.file + self.kv_cache + self.predictors + self.read_ahead
    }
}

/// What read-ahead (`OffloadOptions::read_ahead`, without a predictor) holds besides the neuron
/// cache (`OffloadOptions::read_ahead_bytes` is half this): the planner's formula, which counts it
/// the same way.
pub use planner::read_ahead_bytes;

/// How a process budget splits between what stays resident and the FFN cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetSplit {
    /// The whole budget.
    pub budget: u64,
    /// What stays resident ([`Resident::total`]); less than `budget`.
    pub resident: u64,
    /// Bytes of the whole FFN (the neuron store).
    pub ffn: u64,
    /// The neuron cache of the plan made for this budget ([`MemoryBudget::Planned`]), if any.
    pub planned: Option<u64>,
}

impl BudgetSplit {
    /// Bytes left for the FFN cache.
    pub fn cache(&self) -> u64 {
        let asked = match self.planned {
            Some(cache) => MemoryBudget::Planned {
                budget: self.budget,
                cache,
            },
            None => MemoryBudget::Process(self.budget),
        };
        asked.cache_bytes(self.ffn, || self.resident).unwrap_or(0)
    }

    /// Percentage of the FFN the cache can hold (at most 100).
    pub fn cached_percent(&self) -> f64 {
        100.0 * self.cache().min(self.ffn) as f64 / self.ffn as f64
    }
}

/// The FFN cache budget in bytes for `budget` over an FFN of `ffn` bytes, and, for a process budget,
/// how it splits. `resident` is asked only for a process budget; `context` (positions) names the KV
/// cache in the error a budget too small gives.
pub fn ffn_cache_bytes(
    budget: MemoryBudget,
    ffn: u64,
    context: usize,
    resident: impl FnOnce() -> Resident,
) -> Result<(usize, Option<BudgetSplit>)> {
    let mut fixed = 0;
    let cache = budget.cache_bytes(ffn, || {
        fixed = resident().total();
        fixed
    });
    let usize_of = |c: u64| usize::try_from(c).unwrap_or(usize::MAX);
    let planned = match budget {
        MemoryBudget::Planned { cache, .. } => Some(cache),
        _ => None,
    };
    match (budget.process(), cache) {
        (Some(b), None) => Err(OffloadError::Request(format!(
            "--memory-budget {:.1} MiB leaves nothing for the FFN: the process, the resident file, the KV cache at --ctx {} (its --cache-type) and the predictors take {:.1} MiB",
            mib(b),
            context,
            mib(fixed)
        ))),
        (Some(b), Some(c)) => Ok((
            usize_of(c),
            Some(BudgetSplit {
                budget: b,
                resident: fixed,
                ffn,
                planned,
            }),
        )),
        (_, c) => Ok((usize_of(c.unwrap_or(0)), None)),
    }
}

/// Bytes of the FFN units in the store at `path` (from the file length; validated on open).
pub fn store_ffn_bytes(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| OffloadError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Bytes of the FFN matrices (gate, up and down) of all of `model`'s layers, as loaded (zero for a
/// resident file, whose FFN is in its neuron store).
pub fn ffn_weight_bytes(model: &Model<'_>) -> usize {
    model
        .layers
        .iter()
        .map(|l| match &l.ffn {
            LayerFfn::Gated(f) => [&f.gate, &f.up, &f.down]
                .iter()
                .map(|m| m.data().len())
                .sum::<usize>(),
            // The router, every expert and the shared expert.
            LayerFfn::Moe(m) => m.bytes(),
        })
        .sum()
}

/// The largest predictor of one layer, in bytes: `max_share` of an FFN of `ffn_bytes` spread evenly
/// over `n_layers` layers (`sparrow train-predictor --max-share`).
pub fn predictor_max_bytes(ffn_bytes: usize, n_layers: usize, max_share: f64) -> usize {
    (max_share * ffn_bytes as f64 / n_layers.max(1) as f64) as usize
}

/// Parses a size as `--memory-budget` takes it: `123` (bytes), `64K`, `80M`, `1.5G`, `1T` (powers of
/// 1024), at most 1 PiB. The error is one line naming the text.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    const MAX: f64 = (1u64 << 50) as f64;
    let t = s.trim();
    let (num, mul) = match t
        .char_indices()
        .last()
        .map(|(i, c)| (i, c.to_ascii_uppercase()))
    {
        Some((i, 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'M')) => (&t[..i], 1 << 20),
        Some((i, 'G')) => (&t[..i], 1 << 30),
        Some((i, 'T')) => (&t[..i], 1 << 40),
        _ => (t, 1),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 80M, 1.5G)"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{s}` is not a size (e.g. 80M, 1.5G)"));
    }
    let bytes = v * mul as f64;
    if bytes > MAX {
        return Err(format!("`{s}` is more than 1 PiB"));
    }
    Ok(bytes as u64)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_prompt_steps_shrink_to_half_the_cache_that_lends_them() {
        // A step needs 1 KiB a token besides 64 KiB.
        let bytes = |n: usize| 64 * 1024 + 1024 * n as u64;
        // A cache that holds the whole FFN lends nothing: the longest step.
        assert_eq!(
            offload_prompt_step(1 << 20, 1 << 20, bytes),
            OFFLOAD_PROMPT_STEP
        );
        // Half of 1.5 MiB holds 512 tokens (576 KiB).
        assert_eq!(offload_prompt_step(3 << 19, 1 << 30, bytes), 512);
        // Half of 1 MiB (512 KiB) holds 256 tokens (320 KiB) but not 512 (576 KiB).
        assert_eq!(offload_prompt_step(1 << 20, 1 << 30, bytes), 256);
        // No fewer than the least step, however small the cache.
        assert_eq!(
            offload_prompt_step(0, 1 << 30, bytes),
            OFFLOAD_PROMPT_STEP_MIN
        );
    }

    #[test]
    fn process_budget_counts_what_stays_resident_first() {
        let r = Resident {
            process: 10 << 20,
            file: 20 << 20,
            kv_cache: 5 << 20,
            predictors: 1 << 20,
            read_ahead: 0,
        };
        assert_eq!(r.total(), 36 << 20);
        // Read-ahead: twice a layer's uncached part, at the cache it leaves.
        assert_eq!(read_ahead_bytes(24 << 20, 24, 24 << 20), 0);
        assert_eq!(read_ahead_bytes(24 << 20, 24, 13 << 20), 1 << 20);
        let ra = read_ahead_bytes(24 << 20, 24, 13 << 20);
        assert_eq!(
            2 * ((24 << 20) - ((13 << 20) - ra)) / 24,
            ra,
            "a fixed point"
        );
        assert_eq!(read_ahead_bytes(24 << 20, 24, 8 << 20), 2 * (16 << 20) / 22);
        assert_eq!(
            read_ahead_bytes(24 << 20, 24, 2 << 20),
            1 << 20,
            "half the room"
        );
        assert_eq!(
            read_ahead_bytes(24 << 20, 2, 1 << 30),
            24 << 20,
            "at most two layers"
        );
        let (bytes, split) =
            ffn_cache_bytes(MemoryBudget::Process(100 << 20), 128 << 20, 4096, || r).unwrap();
        let split = split.unwrap();
        assert_eq!(bytes, 64 << 20);
        assert_eq!(split.cache(), 64 << 20);
        assert_eq!(split.resident, 36 << 20);
        assert_eq!(split.cached_percent(), 50.0);
        // A cache larger than the FFN holds all of it.
        let (_, split) =
            ffn_cache_bytes(MemoryBudget::Process(1 << 30), 128 << 20, 4096, || r).unwrap();
        assert_eq!(split.unwrap().cached_percent(), 100.0);
    }

    #[test]
    fn a_planned_budget_takes_the_plans_cache_within_what_the_budget_leaves() {
        let r = Resident {
            process: 10 << 20,
            file: 20 << 20,
            ..Default::default()
        };
        let planned = |cache| MemoryBudget::Planned {
            budget: 100 << 20,
            cache,
        };
        // The plan's cache as it is, though the budget would leave 70 MiB.
        let (bytes, split) = ffn_cache_bytes(planned(40 << 20), 128 << 20, 4096, || r).unwrap();
        let split = split.unwrap();
        assert_eq!((bytes, split.cache()), (40 << 20, 40 << 20));
        assert_eq!((split.budget, split.planned), (100 << 20, Some(40 << 20)));
        assert_eq!(planned(40 << 20).process(), Some(100 << 20));
        // A plan whose account of what stays resident was short: what the budget leaves.
        let (bytes, _) = ffn_cache_bytes(planned(90 << 20), 128 << 20, 4096, || r).unwrap();
        assert_eq!(bytes, 70 << 20);
        // A budget that leaves nothing is the process budget's error.
        let r = Resident {
            process: 100 << 20,
            ..r
        };
        assert!(ffn_cache_bytes(planned(40 << 20), 128 << 20, 512, || r).is_err());
        assert_eq!(MemoryBudget::Bytes(5).process(), None);
    }

    #[test]
    fn process_budget_that_leaves_nothing_is_an_error_naming_the_figures() {
        let r = Resident {
            process: 30 << 20,
            file: 10 << 20,
            ..Default::default()
        };
        for b in [0, 1 << 20, 40 << 20] {
            let e = ffn_cache_bytes(MemoryBudget::Process(b), 1 << 30, 512, || r)
                .unwrap_err()
                .to_string();
            assert!(e.contains("leaves nothing for the FFN"), "{e}");
            assert!(
                e.contains("--ctx 512") && e.contains("take 40.0 MiB"),
                "{e}"
            );
        }
    }

    #[test]
    fn predictor_share_is_per_layer() {
        assert_eq!(predictor_max_bytes(3000, 3, 0.1), 100);
        assert_eq!(predictor_max_bytes(3000, 0, 0.1), 300);
    }

    #[test]
    fn share_and_all_ignore_what_stays_resident() {
        let never = || -> Resident { panic!("not asked without a process budget") };
        assert_eq!(
            ffn_cache_bytes(MemoryBudget::Share(0.5), 1000, 0, never).unwrap(),
            (500, None)
        );
        assert_eq!(
            ffn_cache_bytes(MemoryBudget::Share(2.0), 1000, 0, never).unwrap(),
            (1000, None)
        );
        assert_eq!(
            ffn_cache_bytes(MemoryBudget::Share(-1.0), 1000, 0, never).unwrap(),
            (0, None)
        );
        assert_eq!(
            ffn_cache_bytes(MemoryBudget::All, 1000, 0, never).unwrap(),
            (usize::MAX, None)
        );
    }
}
