//! The engine: a loaded model, its tokenizer and a thread pool; generation and scoring.

use std::time::{Duration, Instant};

use kernels_neon::{KvFormat, Precision};
use model_tokenizer::{Tokenizer, VocabSpec};

use crate::continuation::{Accepted, Continuation};
use crate::error::{EngineError, Result};
use offload::sparse::SparseFfn;
use offload::AccelFfn;
use offload::HybridFfn;
use sampling::Sampler;
use sampling::{Flow, GenerateRequest, Generation, StopReason, Timings};
use transformer::ffn::FfnExecutor;
use transformer::forward::{
    forward_with, forward_with_into, FfnMode, FfnObserver, KvCache, Logits,
};
use transformer::model::{Model, ModelFile};
use transformer::requant::Overlay;

/// How to build an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Compute threads (0: one per core).
    pub threads: usize,
    /// `Exact` dequantizes weights and keeps activations in f32; `Fast` quantizes activations to 8 bits
    /// where the kernels are faster that way.
    pub precision: Precision,
    /// Maximum context (prompt + generated tokens); 0 uses the model's training context.
    pub context: usize,
    /// How the KV cache stores keys and values (`None`: [`KvFormat::default_for`] the precision,
    /// f32 for now). The cache grows with the positions held, up to
    /// `context`.
    pub cache_type: Option<KvFormat>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: 0,
            precision: Precision::Fast,
            context: 4096,
            cache_type: None,
        }
    }
}

/// A model ready to run.
pub struct Engine<'a> {
    model: Model<'a>,
    tokenizer: Tokenizer,
    pool: rayon::ThreadPool,
    opts: EngineOptions,
    threads: usize,
    sparse: Option<SparseFfn>,
    /// The experts of a resident MoE file, from its expert store.
    experts: Option<offload::ExpertOffload>,
    accel: Option<AccelFfn>,
    hybrid: Option<HybridFfn>,
    /// Whether `hybrid` runs the steps (else its sparse part alone).
    hybrid_on: bool,
    ffn_nanos: std::sync::atomic::AtomicU64,
    /// An empty cache of the engine's format and context, checked against the model once.
    empty_cache: KvCache,
}

/// Builds the tokenizer of a model file: from GGUF `tokenizer.ggml.*` metadata, or `tokenizer.json`.
pub fn load_tokenizer(file: &ModelFile) -> Result<Tokenizer> {
    match file {
        ModelFile::Gguf(f) => {
            let bad = |detail: &str| EngineError::BadModel {
                path: f.path().to_path_buf(),
                detail: detail.to_string(),
            };
            let s = |k: &str| f.get(k).and_then(|v| v.as_str()).map(str::to_string);
            // An id past u32 stays out of range (refused by the vocabulary check), not truncated.
            let u = |k: &str| {
                f.get(k)
                    .and_then(|v| v.as_u64())
                    .map(|v| u32::try_from(v).unwrap_or(u32::MAX))
            };
            let spec = VocabSpec {
                model: s("tokenizer.ggml.model")
                    .ok_or_else(|| bad("metadata key tokenizer.ggml.model is missing"))?,
                pre: s("tokenizer.ggml.pre"),
                // The vocabulary's arrays are read for the tokenizer and not kept with the file
                // (`get_uncached`: about 24 MB for a 151,936-token vocabulary).
                tokens: f
                    .get_uncached("tokenizer.ggml.tokens")
                    .and_then(|v| v.to_string_vec())
                    .ok_or_else(|| {
                        bad("metadata key tokenizer.ggml.tokens is missing or not a string array")
                    })?,
                token_types: match f.get_uncached("tokenizer.ggml.token_type") {
                    None => Vec::new(),
                    Some(v) => v
                        .to_i64_vec()
                        .ok_or_else(|| bad("tokenizer.ggml.token_type is not an integer array"))?
                        .into_iter()
                        .map(|t| t as i32)
                        .collect(),
                },
                merges: match f.get_uncached("tokenizer.ggml.merges") {
                    None => Vec::new(),
                    Some(v) => v
                        .to_string_vec()
                        .ok_or_else(|| bad("tokenizer.ggml.merges is not a string array"))?,
                },
                scores: match f.get_uncached("tokenizer.ggml.scores") {
                    None => Vec::new(),
                    Some(v) => v
                        .as_array()
                        .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect())
                        .ok_or_else(|| bad("tokenizer.ggml.scores is not a number array"))?,
                },
                add_space_prefix: f
                    .get("tokenizer.ggml.add_space_prefix")
                    .and_then(|v| v.as_bool()),
                bos_id: u("tokenizer.ggml.bos_token_id"),
                eos_id: u("tokenizer.ggml.eos_token_id"),
                unk_id: u("tokenizer.ggml.unknown_token_id"),
                pad_id: u("tokenizer.ggml.padding_token_id"),
                eot_id: u("tokenizer.ggml.eot_token_id"),
                add_bos: f
                    .get("tokenizer.ggml.add_bos_token")
                    .and_then(|v| v.as_bool())
                    .unwrap_or(false),
                chat_template: s("tokenizer.chat_template"),
            };
            // The tokenizer's errors (an id outside the vocabulary, a bad merge) name the file.
            Tokenizer::from_vocab(&spec).map_err(|e| EngineError::BadModel {
                path: f.path().to_path_buf(),
                detail: e.to_string(),
            })
        }
        ModelFile::Hf(d) => {
            let path = d.tokenizer_json().ok_or_else(|| EngineError::BadModel {
                path: d.dir().to_path_buf(),
                detail: "tokenizer.json is missing from the model directory".into(),
            })?;
            Ok(Tokenizer::from_tokenizer_json(&path)?)
        }
    }
}

impl<'a> Engine<'a> {
    /// Loads the model and tokenizer of `file` and starts the thread pool.
    pub fn new(file: &'a ModelFile, opts: EngineOptions) -> Result<Self> {
        Self::new_with_overlay(file, None, opts)
    }

    /// [`new`](Self::new) with the layer matrices of `overlay` (re-quantized at load time, see
    /// [`transformer::requant`]) in place of the file's.
    pub fn new_with_overlay(
        file: &'a ModelFile,
        overlay: Option<&'a Overlay>,
        opts: EngineOptions,
    ) -> Result<Self> {
        let model = Model::load_with(file, overlay)?;
        let tokenizer = load_tokenizer(file)?;
        // Building the tokenizer from the file's vocabulary and merges leaves tens of MiB of freed
        // heap (the intermediate strings and maps) in the allocator's arenas; hand it back, so that
        // what a memory budget counts as the process is what it holds. The header's pages (the
        // vocabulary the tokenizer was built from) go back too.
        crate::sys::release_free_memory();
        file.release_header();
        let threads = if opts.threads == 0 {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        } else {
            opts.threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sparrow-compute-{i}"))
            .build()
            .map_err(|e| {
                EngineError::Request(format!("cannot start {threads} compute threads: {e}"))
            })?;
        let mut opts = opts;
        if opts.context == 0 || opts.context > model.config.context_length {
            opts.context = model.config.context_length;
        }
        let format = opts
            .cache_type
            .unwrap_or_else(|| KvFormat::default_for(opts.precision));
        opts.cache_type = Some(format);
        let empty_cache = KvCache::with_format(&model, opts.context, format)?;
        Ok(Engine {
            model,
            tokenizer,
            pool,
            opts,
            threads,
            sparse: None,
            experts: None,
            accel: None,
            hybrid: None,
            hybrid_on: true,
            ffn_nanos: Default::default(),
            empty_cache,
        })
    }

    /// The model.
    pub fn model(&self) -> &Model<'a> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Compute threads in use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The options in force (context resolved against the model, `cache_type` always `Some`).
    pub fn options(&self) -> &EngineOptions {
        &self.opts
    }

    /// Sets the context as [`EngineOptions::context`] does (0 or past the training context: the
    /// training context), for the caches made after (`new_cache`).
    pub fn set_context(&mut self, context: usize) -> Result<()> {
        let cfg = &self.model.config;
        let context = match context {
            0 => cfg.context_length,
            c => c.min(cfg.context_length),
        };
        self.empty_cache = KvCache::with_format(&self.model, context, self.cache_type())?;
        self.opts.context = context;
        Ok(())
    }

    /// An empty KV cache of the engine's format that can hold the engine's context (it allocates
    /// as positions are added).
    pub fn new_cache(&self) -> KvCache {
        self.empty_cache.clone()
    }

    /// How the engine's KV caches store keys and values.
    pub fn cache_type(&self) -> KvFormat {
        self.empty_cache.format()
    }

    /// Bytes the KV cache of the engine's whole context takes at its format (what a memory budget
    /// reserves for it: [`crate::ModelConfig::kv_cache_bytes`]).
    pub fn kv_cache_reserved_bytes(&self) -> u64 {
        self.model
            .config
            .kv_cache_bytes(self.opts.context, self.cache_type())
    }

    /// One forward step on the engine's thread pool (sparse FFN if one is set).
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.forward_into(cache, tokens, want, &mut logits)?;
        Ok(logits)
    }

    /// [`Engine::forward`] into `logits` (resized to what the step returns): a decode loop reuses
    /// one buffer instead of allocating (and faulting in) the vocabulary's logits every token. Over
    /// a neuron store a prompt runs in steps of at most [`offload::budget::OFFLOAD_PROMPT_STEP`]
    /// tokens ([`offload::budget::offload_prompt_step`]), each streaming the store once, with their
    /// working memory lent by the neuron cache.
    pub fn forward_into(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        want: Logits,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let mode = FfnMode {
            exec: self.executor(),
            observer: None,
            ffn_nanos: Some(&self.ffn_nanos),
        };
        let precision = self.opts.precision;
        let off = self.sparse().and_then(|s| s.offload());
        let Some(off) = off.filter(|_| tokens.len() > 1) else {
            return self.pool.install(|| {
                Ok(forward_with_into(
                    &self.model,
                    cache,
                    tokens,
                    precision,
                    want,
                    mode,
                    logits,
                )?)
            });
        };
        // Over a store, a prompt runs in steps of at most OFFLOAD_PROMPT_STEP tokens, with their
        // working memory lent by the neuron cache; a failed step leaves the KV cache as it was
        // before the first.
        let ix = off.store().index();
        let step_bytes = |step: usize| {
            offload::budget::prompt_step_bytes(
                &self.model.config,
                tokens.len().min(step),
                off.options().prefill_neurons,
                ix.layout.bundle_bytes() as u64,
                ix.formats.down,
                self.threads,
                precision,
            ) + off.prompt_accel().map_or(0, |a| {
                // A chunk is whole units: up to one unit's neurons more than asked.
                let chunk = off.options().prefill_neurons + ix.layout.neurons;
                a.streamed_bytes(chunk, ix.d_model)
            })
        };
        let step = offload::budget::offload_prompt_step(
            off.cache_budget() as u64,
            ix.ffn_bytes() as u64,
            step_bytes,
        );
        off.lend_cache(step_bytes(step) as usize, || {
            self.prompt_steps(cache, tokens, step, want, mode, logits)
        })
    }

    /// [`Engine::forward_into`] of a prompt over a store, in steps of at most `step` tokens.
    fn prompt_steps(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        step: usize,
        want: Logits,
        mode: FfnMode<'_, '_>,
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let precision = self.opts.precision;
        let start = cache.len();
        let parts = tokens.chunks(step).count();
        let mut all = Vec::new();
        let out = self.pool.install(|| {
            for (i, part) in tokens.chunks(step).enumerate() {
                let w = match want {
                    Logits::All => Logits::All,
                    w if i + 1 == parts => w,
                    _ => Logits::None,
                };
                let mode = FfnMode {
                    exec: mode.exec,
                    observer: None,
                    ffn_nanos: mode.ffn_nanos,
                };
                forward_with_into(&self.model, cache, part, precision, w, mode, logits)?;
                if want == Logits::All {
                    all.extend_from_slice(logits);
                }
            }
            Ok(())
        });
        if out.is_err() {
            cache.truncate(start);
        } else if want == Logits::All {
            *logits = all;
        }
        out
    }

    /// One decode step of several sequences on the engine's thread pool: token `i` continues the
    /// sequence of `caches[i]` ([`crate::forward_seqs`]); `tokens.len() × vocab` logits.
    pub fn forward_batch(&self, caches: &mut [&mut KvCache], tokens: &[u32]) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.forward_batch_into(caches, tokens, &mut logits)?;
        Ok(logits)
    }

    /// [`Engine::forward_batch`] into `logits` (resized to `tokens.len() × vocab`).
    pub fn forward_batch_into(
        &self,
        caches: &mut [&mut KvCache],
        tokens: &[u32],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let mode = FfnMode {
            exec: self.executor(),
            observer: None,
            ffn_nanos: Some(&self.ffn_nanos),
        };
        let precision = self.opts.precision;
        self.pool.install(|| {
            Ok(transformer::forward::forward_seqs_into(
                &self.model,
                caches,
                tokens,
                precision,
                mode,
                logits,
            )?)
        })
    }

    /// [`Engine::forward`] with an observer that sees every layer's FFN activations.
    pub fn forward_observed(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        want: Logits,
        observer: FfnObserver<'_>,
    ) -> Result<Vec<f32>> {
        let mode = FfnMode {
            exec: self.executor(),
            observer: Some(observer),
            ffn_nanos: None,
        };
        self.pool.install(|| {
            Ok(forward_with(
                &self.model,
                cache,
                tokens,
                self.opts.precision,
                want,
                mode,
            )?)
        })
    }

    /// Runs a closure on the engine's thread pool (for work that belongs with the engine's threads,
    /// such as building a [`SparseFfn`]).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// The FFN executor of a speculative verification step, and whether each token must go
    /// through the executor's one-token `decode` for the step to compute every token as its own
    /// decode step does. The batch paths of the dense FFN, the MoE block, the expert offload and
    /// the sparse FFN (in memory, or over a store with each unit read once for the step) do so;
    /// a hybrid FFN's accelerator takes more hot neurons for larger batches, an accelerator's
    /// arithmetic depends on the batch size, and a sparse FFN whose plan runs some batch sizes
    /// dense computes those dense: they run token by token.
    pub(crate) fn verify_executor(&self) -> (Option<&dyn FfnExecutor>, bool) {
        let dense_batches = |s: &SparseFfn| (2..=64).any(|n| s.dense_batch(n));
        let per_token = if self.experts.is_some() {
            false
        } else if let Some(h) = &self.hybrid {
            self.hybrid_on || dense_batches(h.sparse())
        } else if let Some(s) = &self.sparse {
            dense_batches(s)
        } else {
            self.accel.is_some()
        };
        (self.executor(), per_token)
    }

    /// The FFN executor of the engine's steps: the sparse FFN, else the accelerator's, else none
    /// (dense).
    pub(crate) fn executor(&self) -> Option<&dyn FfnExecutor> {
        if let Some(x) = &self.experts {
            return Some(x);
        }
        if let Some(h) = &self.hybrid {
            return Some(if self.hybrid_on { h } else { h.sparse() });
        }
        match (&self.sparse, &self.accel) {
            (Some(s), _) => Some(s),
            (None, Some(a)) => Some(a),
            (None, None) => None,
        }
    }

    /// Runs hybrid decode (`Some`: hot neurons on an accelerator, the rest sparse) from the next step
    /// on; it goes before any other FFN executor.
    pub fn set_hybrid(&mut self, hybrid: Option<HybridFfn>) {
        self.hybrid = hybrid;
        self.hybrid_on = true;
    }

    /// The hybrid FFN, if any.
    pub fn hybrid(&self) -> Option<&HybridFfn> {
        self.hybrid.as_ref()
    }

    /// With a hybrid FFN, whether it runs the steps (`true`) or its sparse part alone (`false`: the
    /// same neurons selected and computed on the CPU, for comparisons in one run).
    pub fn set_hybrid_on(&mut self, on: bool) {
        self.hybrid_on = on;
    }

    /// Runs every layer's FFN on an accelerator (`Some`) or not (`None`) from the next step on (a
    /// sparse FFN, when set, goes first).
    pub fn set_accel(&mut self, accel: Option<AccelFfn>) {
        self.accel = accel;
    }

    /// At most the bytes [`Engine::pack_q40x8`] would make ([`Model::q40x8_planned_bytes`]).
    pub fn q40x8_planned_bytes(&self, ffn: bool) -> usize {
        self.model.q40x8_planned_bytes(self.opts.precision, ffn)
    }

    /// Repacks the model's Q4_0 matrices for decode and short prompts where the AVX2 or AVX-512
    /// path and the engine's precision take them ([`Model::pack_q40x8`]; the FFN's too where `ffn`:
    /// a dense FFN or experts in memory), on the engine's threads; returns the matrices repacked and
    /// the copies' bytes.
    pub fn pack_q40x8(&mut self, ffn: bool) -> (usize, usize) {
        let precision = self.opts.precision;
        let model = &mut self.model;
        self.pool.install(|| model.pack_q40x8(precision, ffn))
    }

    /// The accelerator FFN in use, if any.
    pub fn accel(&self) -> Option<&AccelFfn> {
        self.accel.as_ref()
    }

    /// Leaves the embedding and output projection on flash from the next step on (`on`), as
    /// [`Model::set_streamed`] says, or keeps them as any mapped weight.
    pub fn set_streamed(&mut self, on: bool) {
        self.model.set_streamed(on);
    }

    /// [`Model::set_streamed_mapped`]: streamed, the output read through the mapping (tests).
    #[doc(hidden)]
    pub fn set_streamed_mapped(&mut self) {
        self.model.set_streamed_mapped();
    }

    /// Lets one-token steps that stream the output projection use its proxy (`on`, the default) or
    /// read it whole, as [`Model::set_output_proxy`] says.
    pub fn set_output_proxy(&mut self, on: bool) {
        self.model.set_output_proxy(on);
    }

    /// Makes the FFN sparse (`Some`) or dense (`None`) from the next step on.
    pub fn set_sparse(&mut self, sparse: Option<SparseFfn>) {
        self.sparse = sparse;
    }

    /// Runs the MoE layers with their experts from an expert store (`Some`) from the next step on.
    pub fn set_experts(&mut self, experts: Option<offload::ExpertOffload>) {
        self.experts = experts;
    }

    /// The expert offload in use, if any.
    pub fn experts(&self) -> Option<&offload::ExpertOffload> {
        self.experts.as_ref()
    }

    /// Removes the sparse FFN (the engine is dense from the next step on) and returns it.
    pub fn take_sparse(&mut self) -> Option<SparseFfn> {
        self.sparse.take()
    }

    /// Seconds spent in FFN blocks by [`Engine::forward`] since the last call (the counter restarts).
    pub fn take_ffn_seconds(&self) -> f64 {
        self.ffn_nanos.swap(0, std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }

    /// The sparse FFN in use, if any (a hybrid FFN's sparse part).
    pub fn sparse(&self) -> Option<&SparseFfn> {
        self.sparse
            .as_ref()
            .or_else(|| self.hybrid.as_ref().map(HybridFfn::sparse))
    }

    /// Generates a continuation of `prompt_ids`, calling `on_text` with each new piece of text as soon as
    /// it is final (stop strings are held back until they can be ruled out).
    pub fn generate(
        &self,
        prompt_ids: &[u32],
        req: &GenerateRequest,
        mut on_text: impl FnMut(&str) -> Flow,
    ) -> Result<Generation> {
        if prompt_ids.is_empty() {
            return Err(EngineError::Request(
                "the prompt is empty: give at least one token".into(),
            ));
        }
        let mut cache = self.new_cache();
        let mut sampler = Sampler::new(req.sampler.clone());
        let mut seq = Continuation::new(&self.tokenizer, prompt_ids, req);
        let mut timings = Timings {
            prefill_tokens: prompt_ids.len(),
            ..Default::default()
        };

        let t0 = Instant::now();
        let mut logits = self.forward(&mut cache, prompt_ids, Logits::Last)?;
        timings.prefill_s = t0.elapsed().as_secs_f64();
        let mut decode_time = Duration::ZERO;

        let stop_reason = loop {
            if seq.generated.len() >= req.max_tokens {
                break StopReason::Length;
            }
            let next = sampler.sample(&mut logits, &seq.history);
            match seq.accept(next)? {
                Accepted::Ended(reason) => break reason,
                Accepted::Going { from, to } => {
                    if to > from && on_text(&seq.text[from..to]) == Flow::Stop {
                        break StopReason::Cancelled;
                    }
                }
            }
            let t = Instant::now();
            self.forward_into(&mut cache, &[next], Logits::Last, &mut logits)?;
            decode_time += t.elapsed();
            timings.decode_tokens += 1;
        };
        if stop_reason != StopReason::Cancelled {
            let rest = seq.finish(stop_reason);
            if !rest.is_empty() {
                on_text(rest);
            }
        }
        timings.decode_s = decode_time.as_secs_f64();
        Ok(Generation {
            prompt_ids: prompt_ids.to_vec(),
            generated_ids: seq.generated,
            text: seq.text,
            stop_reason,
            timings,
        })
    }
}
