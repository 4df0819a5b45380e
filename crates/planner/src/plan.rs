//! The plan: the decisions the engine applies, what the planner predicts for them, and whom they are
//! for (model and device fingerprints). Versioned and checksummed (see `container`).

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::container;
use crate::device::DeviceProfile;
use crate::error::{PlannerError, Result};
use crate::experts::ExpertPlan;
use crate::hybrid::{hybrid_split, HybridSplit, HYBRID_BATCHES};
use crate::hybrid_store::{hybrid_split_over_store, StoreMemory};
use crate::model::{step_neurons, ModelSummary};
use crate::prompt::{prompt_cost, PromptCost};
use crate::solve::{Choice, Cost};
use crate::speculation::{self, SpecChoice};
use crate::tables::{Constraints, Tables};

/// Kind word of a plan file's header.
pub const PLAN_KIND: &str = "sparrow-plan";
/// Version of the plan payload this build reads and writes.
pub const PLAN_VERSION: u32 = 1;

/// What the planner predicts for one batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Predicted {
    /// Sequences decoded together.
    pub batch: u32,
    /// Batch size 1's sparse layers sparse at this batch size (else every layer dense); `false`
    /// too where no layer is sparse at batch size 1.
    pub sparse: bool,
    /// Compute threads at this batch size.
    pub threads: u32,
    /// `T_attn`, seconds.
    pub attn_s: f64,
    /// `T_pred`, seconds.
    pub pred_s: f64,
    /// `T_ffn`, seconds.
    pub ffn_s: f64,
    /// `T_io`, seconds.
    pub io_s: f64,
    /// One decode step, seconds.
    pub decode_s: f64,
    /// Tokens per second over the batch (`batch / decode_s`).
    pub tok_s: f64,
}

/// A plan for one model on one device under one memory budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The model's name.
    pub model: String,
    /// The model's fingerprint.
    pub model_fingerprint: u64,
    /// The device's name.
    pub device: String,
    /// The device's fingerprint.
    pub device_fingerprint: u64,
    /// The memory budget planned for (bytes; `None`: unlimited).
    pub memory_budget: Option<u64>,
    /// Context positions the KV cache is reserved for.
    pub context: u32,
    /// Which solver made it (`search`, `z3`).
    pub solver: String,
    /// Compute threads (batch size 1).
    pub threads: u32,
    /// Core of the I/O thread (offloaded models), the last core.
    pub io_core: Option<u32>,
    /// Reads in flight.
    pub queue_depth: u32,
    /// Weight rows per parallel work item (0: the engine's automatic choice).
    pub chunk_rows: u32,
    /// Sparse FFN at batch size 1, per layer.
    pub sparse: Vec<bool>,
    /// Hottest neurons kept in memory per layer, as the planner placed them. The engine takes
    /// their sum (`ffn_cache_bytes`) and holds the same share of every layer: these counts,
    /// applied over a store, measured slower (docs/BENCHMARKS.md, planner section).
    pub hot_neurons: Vec<u32>,
    /// Bytes of the neuron cache (sum over layers).
    pub ffn_cache_bytes: u64,
    /// Tensors outside the FFN and whether each stays in memory.
    pub resident: Vec<(String, bool)>,
    /// Memory the plan uses, bytes.
    pub memory: u64,
    /// Predictions per batch size (batch size 1 first).
    pub predicted: Vec<Predicted>,
    /// What a prompt costs with this plan's placement (`None`: the device profile or the model
    /// summary lacks the figures; plans of older builds).
    #[serde(default)]
    pub prompt: Option<PromptCost>,
    /// Hybrid decode's split for the accelerator the constraints named (`None`: none named; plans
    /// of older builds): in memory per batch size ([`crate::hybrid_split`]), over a neuron store
    /// one count per layer within the plan's cache ([`crate::hybrid_split_over_store`]).
    #[serde(default)]
    pub hybrid: Option<HybridSplit>,
    /// For an MoE model (its layers' units are experts): each layer's expert cache and the
    /// predicted hit rate and bytes read (`None`: neurons; plans of older builds). `hot_neurons`
    /// then counts experts and `ffn_cache_bytes` is the caches' sum.
    #[serde(default)]
    pub experts: Option<ExpertPlan>,
    /// Speculative decoding, chosen from the steps' costs ([`crate::speculation`]); the engine
    /// drafts so when no flag says otherwise (`None`: plans of older builds, no speculation).
    #[serde(default)]
    pub speculation: Option<SpecChoice>,
}

fn predicted(t: &Tables, batch: u32, c: &Choice, cost: &Cost) -> Predicted {
    let s = |ns: u64| ns as f64 * 1e-9;
    Predicted {
        batch,
        sparse: c.sparse.iter().any(|&s| s),
        threads: t.threads[c.threads],
        attn_s: s(cost.attn_ns),
        pred_s: s(cost.pred_ns),
        ffn_s: s(cost.ffn_ns),
        io_s: s(cost.io_ns),
        decode_s: s(cost.decode_ns),
        tok_s: batch as f64 / s(cost.decode_ns).max(1e-12),
    }
}

/// Which solver [`make_plan`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Solver {
    /// [`crate::search`], always available.
    Search,
    /// The Z3 optimizer (feature `z3`).
    Z3,
}

fn solve(t: &Tables, budget: u64, solver: Solver) -> Result<(Choice, Cost)> {
    match solver {
        Solver::Search => crate::solve::search(t, budget),
        #[cfg(feature = "z3")]
        Solver::Z3 => crate::z3solve::solve_z3(t, budget),
        #[cfg(not(feature = "z3"))]
        Solver::Z3 => Err(PlannerError::Solver(
            "this build has no Z3 (build with --features z3)".into(),
        )),
    }
}

/// Plans `model` on `device` under `c`: the memory placement and batch-1 settings from the batch-1
/// tables, then per further batch size, with that placement and those threads, whether batch
/// size 1's sparse layers stay sparse or every layer runs dense.
pub fn make_plan(
    device: &DeviceProfile,
    model: &ModelSummary,
    c: &Constraints,
    solver: Solver,
) -> Result<Plan> {
    let budget = c.memory_budget.unwrap_or(u64::MAX);
    let t1 = Tables::build(device, model, c, 0)?;
    let (choice, cost) = solve(&t1, budget, solver)?;
    let mut preds = vec![predicted(&t1, 1, &choice, &cost)];
    preds.extend(further_batches(device, model, c, &choice)?);
    if let Some(min) = c.min_tok_s {
        if preds[0].tok_s < min {
            return Err(PlannerError::Infeasible(format!(
                "the best plan decodes {:.2} tok/s, below the {min:.2} asked",
                preds[0].tok_s
            )));
        }
    }
    let streamed = model
        .tensors
        .iter()
        .zip(&choice.resident)
        .any(|(x, &r)| x.offloadable && !r);
    let hot_neurons: Vec<u32> = model
        .layers
        .iter()
        .zip(&choice.steps)
        .map(|(l, &j)| step_neurons(l.neurons, model.grid, j))
        .collect();
    let ffn_cache_bytes = model
        .layers
        .iter()
        .zip(&hot_neurons)
        .map(|(l, &n)| n as u64 * l.neuron_bytes)
        .sum();
    let experts = ExpertPlan::of(model, &choice.steps);
    let speculation = plan_speculation(model, &preds, ffn_cache_bytes, experts.is_some(), c);
    Ok(Plan {
        model: model.name.clone(),
        model_fingerprint: model.fingerprint,
        device: device.name.clone(),
        device_fingerprint: device.fingerprint,
        memory_budget: c.memory_budget,
        context: c.context,
        solver: match solver {
            Solver::Search => "search".into(),
            Solver::Z3 => "z3".into(),
        },
        threads: t1.threads[choice.threads],
        io_core: model.offloaded.then_some(device.cores - 1),
        queue_depth: t1.queue_depths[choice.queue_depth],
        chunk_rows: 0,
        // Experts have no dense-or-sparse choice: reported dense, which the engine leaves be.
        sparse: match experts {
            Some(_) => vec![false; choice.sparse.len()],
            None => choice.sparse.clone(),
        },
        ffn_cache_bytes,
        hot_neurons,
        resident: model
            .tensors
            .iter()
            .zip(&choice.resident)
            .map(|(x, &r)| (x.name.clone(), r))
            .collect(),
        memory: cost.memory,
        predicted: preds,
        prompt: prompt_cost(
            device,
            model,
            ffn_cache_bytes,
            choice.sparse.iter().filter(|&&s| s).count() as f64 / choice.sparse.len().max(1) as f64,
            streamed,
        ),
        // A device profile without the accelerator's rate plans no split (the run then takes the
        // profile's), rather than no plan.
        hybrid: match experts {
            Some(_) => None,
            None => plan_hybrid(device, model, c, &t1, (&choice, &cost), ffn_cache_bytes)?,
        },
        experts,
        speculation: Some(speculation),
    })
}

/// The plan's speculation: prompt lookup always a candidate, a self-draft over a neuron store of
/// neurons (not experts) with some of it cached; acceptance rates measured ones where `c` has them,
/// else the defaults.
fn plan_speculation(
    model: &ModelSummary,
    preds: &[Predicted],
    ffn_cache_bytes: u64,
    experts: bool,
    c: &Constraints,
) -> SpecChoice {
    let measured = c.spec_acceptance;
    let mut candidates = vec![speculation::lookup(measured.lookup)];
    let ffn_bytes: u64 = model
        .layers
        .iter()
        .map(|l| l.neurons as u64 * l.neuron_bytes)
        .sum();
    if model.offloaded && !experts && ffn_cache_bytes > 0 && ffn_bytes > ffn_cache_bytes {
        let share = ffn_cache_bytes as f64 / ffn_bytes as f64;
        candidates.push(speculation::self_draft(
            &preds[0],
            share,
            measured.self_draft,
        ));
    }
    speculation::choose(preds, &candidates)
}

/// Per batch size after the first, with batch size 1's placement and threads: its predicted figures
/// with batch size 1's sparse layers or with every layer dense, whichever decodes faster.
fn further_batches(
    device: &DeviceProfile,
    model: &ModelSummary,
    c: &Constraints,
    choice: &Choice,
) -> Result<Vec<Predicted>> {
    let mut out = Vec::new();
    for (bi, &b) in model.batch_sizes.iter().enumerate().skip(1) {
        let tb = Tables::build(device, model, c, bi)?;
        let mut best: Option<(Choice, Cost)> = None;
        // Batch size 1's layers sparse, or every layer dense (the engine's dense batched step; a
        // layer dense at batch size 1 keeps neither predictor nor transposed down rows). The
        // engine's threads are batch size 1's (one thread pool serves every step).
        for sparse in [choice.sparse.clone(), vec![false; model.layers.len()]] {
            let cand = Choice {
                sparse,
                ..choice.clone()
            };
            if !tb.admits(&cand) {
                continue;
            }
            let k = tb.cost(&cand);
            if best
                .as_ref()
                .is_none_or(|(_, bk)| k.decode_ns < bk.decode_ns)
            {
                best = Some((cand, k));
            }
        }
        if let Some((bc, bk)) = best {
            out.push(predicted(&tb, b, &bc, &bk));
        }
    }
    Ok(out)
}

/// The accelerator's split of the FFN, as planned for the chosen configuration (`None` without an
/// accelerator, or when the device profile lacks its rate).
fn plan_hybrid(
    device: &DeviceProfile,
    model: &ModelSummary,
    c: &Constraints,
    t1: &Tables,
    (choice, cost): (&Choice, &Cost),
    ffn_cache_bytes: u64,
) -> Result<Option<HybridSplit>> {
    let threads = t1.threads[choice.threads];
    // A device profile without the accelerator's rate plans no split (the run then takes the
    // profile's), rather than no plan.
    let Some(a) = c.accelerator.as_ref().filter(|a| {
        model
            .layers
            .iter()
            .all(|l| device.accel_rate(a, &l.format, threads).is_some())
    }) else {
        return Ok(None);
    };
    let mut h = if model.offloaded {
        // The engine gives every layer an equal share of the plan's cache; the block takes its
        // memory from there.
        let layers = model.layers.len().max(1) as u64;
        let mem = StoreMemory {
            cache_bytes: vec![ffn_cache_bytes / layers; model.layers.len()],
            block_neuron_bytes: c.accel_neuron_bytes,
            queue_depth: t1.queue_depths[choice.queue_depth],
        };
        hybrid_split_over_store(device, model, a, threads, &mem)?
    } else {
        hybrid_split(device, model, a, threads)?
    };
    // Attention as planned, the predictors (hybrid decode is sparse), this FFN (over a store with
    // its reads).
    h.decode_ns = cost.attn_ns + t1.all_pred_ns(choice.threads) + h.ffn_ns[0];
    Ok(Some(h))
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

impl Plan {
    /// Saves the plan (whole or not at all).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        container::save(path.as_ref(), PLAN_KIND, PLAN_VERSION, self)
    }

    /// Loads a plan and checks its shape.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let p: Plan = container::load(path, PLAN_KIND, PLAN_VERSION)?;
        let n = p.sparse.len();
        let bad = p.hot_neurons.len() != n
            || p.experts
                .as_ref()
                .is_some_and(|x| x.cache_bytes.len() != n || x.cached.len() != n)
            || p.threads == 0
            || p.queue_depth == 0
            || p.predicted.is_empty()
            || p.predicted
                .iter()
                .any(|x| !(x.decode_s.is_finite() && x.decode_s > 0.0));
        if bad {
            return Err(PlannerError::Corrupt {
                path: path.to_path_buf(),
                what: "inconsistent plan (layer counts, threads or predictions)".into(),
            });
        }
        Ok(p)
    }

    /// Checks the plan was made for this model and device; `path` names the plan in errors.
    pub fn check_for(
        &self,
        path: &Path,
        model_fingerprint: u64,
        layers: usize,
        device_fingerprint: Option<u64>,
    ) -> Result<()> {
        let mismatch = |what: String| PlannerError::Mismatch {
            path: path.to_path_buf(),
            what,
        };
        if self.model_fingerprint != model_fingerprint || self.sparse.len() != layers {
            return Err(mismatch(format!(
                "plan is for another model ({}, fingerprint {:016x})",
                self.model, self.model_fingerprint
            )));
        }
        if let Some(d) = device_fingerprint {
            if d != self.device_fingerprint {
                return Err(mismatch(format!(
                    "plan is for another device ({}, fingerprint {:016x})",
                    self.device, self.device_fingerprint
                )));
            }
        }
        Ok(())
    }

    /// The plan in words, one decision a line.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        let p = &self.predicted[0];
        let _ = writeln!(
            s,
            "plan for {} on {} ({} solver)",
            self.model, self.device, self.solver
        );
        match self.memory_budget {
            Some(b) => {
                let _ = writeln!(
                    s,
                    "  memory: {:.1} MiB of a {:.1} MiB budget",
                    mib(self.memory),
                    mib(b)
                );
            }
            None => {
                let _ = writeln!(s, "  memory: {:.1} MiB (no budget)", mib(self.memory));
            }
        }
        let sparse = self.sparse.iter().filter(|&&x| x).count();
        let ffn = match (&self.experts, sparse) {
            (Some(_), _) => format!("routed experts in {} layers", self.sparse.len()),
            (None, 0) => format!("dense (0 of {} layers sparse)", self.sparse.len()),
            (None, n) => format!("sparse ({n} of {} layers sparse)", self.sparse.len()),
        };
        let _ = writeln!(s, "  FFN: {ffn}");
        let _ = writeln!(
            s,
            "  compute threads: {}{}",
            self.threads,
            match self.io_core {
                Some(c) => format!(
                    ", I/O thread on core {c}, {} reads in flight",
                    self.queue_depth
                ),
                None => String::new(),
            }
        );
        let total: u64 = self.hot_neurons.iter().map(|&n| n as u64).sum();
        if let Some(x) = &self.experts {
            let _ = writeln!(s, "  {}", x.describe());
        } else {
            let _ = writeln!(
                s,
                "  neuron cache: {:.1} MiB, {} hottest neurons (per layer {}..{})",
                mib(self.ffn_cache_bytes),
                total,
                self.hot_neurons.iter().min().unwrap_or(&0),
                self.hot_neurons.iter().max().unwrap_or(&0)
            );
        }
        let flash: Vec<&str> = self
            .resident
            .iter()
            .filter(|(_, r)| !r)
            .map(|(n, _)| n.as_str())
            .collect();
        if !flash.is_empty() {
            let _ = writeln!(s, "  left on flash: {}", flash.join(", "));
        }
        let _ = writeln!(
            s,
            "  predicted decode: {:.2} tok/s (attention {:.1} ms, predictors {:.1} ms, FFN {:.1} ms, I/O {:.1} ms)",
            p.tok_s,
            p.attn_s * 1e3,
            p.pred_s * 1e3,
            p.ffn_s * 1e3,
            p.io_s * 1e3
        );
        if let Some(c) = &self.prompt {
            let _ = writeln!(
                s,
                "  predicted prompt: 512 tokens to the first token in {:.2} s ({:.0} tok/s)",
                c.seconds(512),
                c.tok_s(512)
            );
        }
        if let Some(h) = &self.hybrid {
            let total = |k: usize| h.counts.iter().map(|c| c[k] as u64).sum::<u64>();
            let shares: Vec<String> = HYBRID_BATCHES
                .iter()
                .enumerate()
                .map(|(k, b)| format!("{} at batch {b}", total(k)))
                .collect();
            let _ = writeln!(
                s,
                "  hybrid decode on the {} accelerator: hottest neurons there {} (FFN {:.2} ms a step at batch 1, {:.2} ms all sparse; {:.2} tok/s)",
                h.accelerator,
                shares.join(", "),
                h.ffn_ns[0] as f64 * 1e-6,
                h.sparse_ns[0] as f64 * 1e-6,
                h.tok_s().unwrap_or(0.0)
            );
        }
        if let Some(c) = &self.speculation {
            let _ = writeln!(s, "  {}", c.describe());
        }
        for q in &self.predicted[1..] {
            let _ = writeln!(
                s,
                "  batch {}: {} on {} threads, {:.2} tok/s in all",
                q.batch,
                match (q.sparse, self.sparse.iter().all(|&x| x)) {
                    _ if self.experts.is_some() => "experts",
                    (false, _) => "dense",
                    (true, true) => "sparse",
                    (true, false) => "as batch size 1",
                },
                q.threads,
                q.tok_s
            );
        }
        s
    }
}
