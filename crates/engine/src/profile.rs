//! Activation profiling over a corpus: samples for threshold calibration, per-neuron statistics and
//! predictor training pairs. The corpus is scored in windows like perplexity, so batched prefill does
//! the work.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use predictor::{
    Dataset, LayerReport, PredictorSet, Profile, ProfileAccumulator, ScoreKind, TrainConfig,
};
use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::generate::Engine;
use offload::neurons::Score;
use offload::sparse::SparseFfn;
use offload::OffloadOptions;
pub use transformer::fingerprint::model_fingerprint;
use transformer::forward::{FfnSample, Logits};
use transformer::transpose::DEFAULT_DOWN_FORMAT;

/// Runs `windows` windows of `window` tokens of `tokens` through the engine (dense unless a sparse FFN
/// is set), calling `observe` with every layer's FFN activations. Stops early, returning how many
/// windows ran, when `stop` becomes true; `progress(done, total)` follows each window.
pub fn observe_corpus(
    engine: &Engine<'_>,
    tokens: &[u32],
    window: usize,
    windows: usize,
    stop: &AtomicBool,
    mut observe: impl FnMut(FfnSample<'_>) + Send,
    mut progress: impl FnMut(usize, usize),
) -> Result<usize> {
    if window == 0 || tokens.len() < window * windows {
        return Err(EngineError::Request(format!(
            "the corpus has {} tokens, fewer than {windows} windows of {window}",
            tokens.len()
        )));
    }
    for w in 0..windows {
        if stop.load(Ordering::Relaxed) {
            return Ok(w);
        }
        let mut cache = engine.new_cache();
        engine.forward_observed(
            &mut cache,
            &tokens[w * window..(w + 1) * window],
            Logits::Last,
            &mut observe,
        )?;
        progress(w + 1, windows);
    }
    Ok(windows)
}

/// Per-layer samples of the sparsity score (`score.of(act(gate), up, ‖down_j‖)`, every `stride`-th
/// value), for [`offload::sparse::thresholds_for_sparsity`] (`Score::Gate` gives CATS's `|act(gate)|`).
pub fn sample_scores(
    engine: &Engine<'_>,
    sparse: &SparseFfn,
    tokens: &[u32],
    window: usize,
    windows: usize,
    stride: usize,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<Vec<f32>>> {
    let never = AtomicBool::new(false);
    sample_scores_until(
        engine, sparse, tokens, window, windows, stride, &never, progress,
    )
}

/// [`sample_scores`], stopped between two windows when `stop` becomes true: then an error
/// ("interrupted"), nothing half-sampled.
#[allow(clippy::too_many_arguments)]
pub fn sample_scores_until(
    engine: &Engine<'_>,
    sparse: &SparseFfn,
    tokens: &[u32],
    window: usize,
    windows: usize,
    stride: usize,
    stop: &AtomicBool,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<Vec<f32>>> {
    let n_layers = engine.model().config.n_layers;
    let stride = stride.max(1);
    let mut samples = vec![Vec::new(); n_layers];
    let mut scores = Vec::new();
    let ran = observe_corpus(
        engine,
        tokens,
        window,
        windows,
        stop,
        |s| {
            sparse.scores_into(s.layer, s.act_gate, s.up, &mut scores);
            samples[s.layer].extend(scores.iter().step_by(stride));
        },
        progress,
    )?;
    if ran < windows {
        return Err(EngineError::Request("interrupted".into()));
    }
    Ok(samples)
}

/// Settings of [`profile_corpus`].
#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// Tokens per window.
    pub window: usize,
    /// Windows profiled.
    pub windows: usize,
    /// Batch sizes of the activation frequencies (a neuron counts as active in a batch when any token of
    /// the batch activates it).
    pub batch_sizes: Vec<u32>,
    /// Name of the corpus, recorded in the profile.
    pub corpus: String,
}

/// Runs the corpus through the engine with `sparse`'s thresholds and records every layer's neuron
/// statistics. Tokens of a batch-size group come from consecutive positions of one window. Stops
/// cleanly (returning what was seen, or an error if nothing was) when `stop` becomes true.
pub fn profile_corpus(
    engine: &Engine<'_>,
    sparse: &SparseFfn,
    tokens: &[u32],
    opts: &ProfileOptions,
    stop: &AtomicBool,
    progress: impl FnMut(usize, usize),
) -> Result<Profile> {
    let model = engine.model();
    let cfg = &model.config;
    let ff = cfg.d_ff;
    let mut accs = (0..cfg.n_layers)
        .map(|l| ProfileAccumulator::new(ff, &opts.batch_sizes, sparse.thresholds()[l], 0.0, 0.0))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut first_err = None;
    let mut scores = Vec::new();
    let done = observe_corpus(
        engine,
        tokens,
        opts.window,
        opts.windows,
        stop,
        |s| {
            sparse.scores_into(s.layer, s.act_gate, s.up, &mut scores);
            let acc = &mut accs[s.layer];
            if let Err(e) = acc.observe_scored(&scores, s.act_gate, s.up, s.n) {
                first_err.get_or_insert(e);
            }
            acc.end_sequence();
        },
        progress,
    )?;
    if let Some(e) = first_err {
        return Err(e.into());
    }
    if done == 0 {
        return Err(EngineError::Request(
            "profiling stopped before the first window finished".into(),
        ));
    }
    let layers = accs.iter().map(ProfileAccumulator::finish).collect();
    Ok(Profile {
        model: model
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        model_fingerprint: model_fingerprint(model),
        corpus: opts.corpus.clone(),
        tokens: (done * opts.window) as u64,
        activation: cfg.activation,
        score: match sparse.score {
            Score::Gate => ScoreKind::Gate,
            Score::GateNorm => ScoreKind::GateNorm,
            Score::OutputNorm => ScoreKind::OutputNorm,
        },
        batch_sizes: opts.batch_sizes.clone(),
        layers,
    })
}

/// The engine's score for a profile's score kind.
pub fn score_of(kind: ScoreKind) -> Score {
    match kind {
        ScoreKind::Gate => Score::Gate,
        ScoreKind::GateNorm => Score::GateNorm,
        ScoreKind::OutputNorm => Score::OutputNorm,
    }
}

/// Builds the sparse FFN a profile describes (its thresholds and score), checking it belongs to the model.
pub fn sparse_from_profile(
    engine: &Engine<'_>,
    profile: &Profile,
    profile_path: &Path,
) -> Result<SparseFfn> {
    sparse_from_profile_with(engine, profile, profile_path, OffloadOptions::default())
}

/// [`sparse_from_profile`] with the settings used when the model is a resident file (its FFN in a
/// neuron store, see the `offload` crate); ignored for an ordinary model.
pub fn sparse_from_profile_with(
    engine: &Engine<'_>,
    profile: &Profile,
    profile_path: &Path,
    offload: OffloadOptions,
) -> Result<SparseFfn> {
    let model = engine.model();
    let bad = |detail: String| EngineError::BadModel {
        path: profile_path.to_path_buf(),
        detail,
    };
    if profile.model_fingerprint != model_fingerprint(model) {
        return Err(bad(format!(
            "this profile was made for another model ({}); run `sparrow profile` for {}",
            profile.model,
            model.path().display()
        )));
    }
    if profile.layers.len() != model.config.n_layers
        || profile
            .layers
            .iter()
            .any(|l| l.n_neurons as usize != model.config.d_ff)
    {
        return Err(bad("layer or neuron counts do not match the model".into()));
    }
    let thresholds = profile.layers.iter().map(|l| l.threshold).collect();
    let mut sp = match &model.config.ffn_store {
        Some(r) => {
            let store = r.path_next_to(model.path())?;
            SparseFfn::from_store(&model.config, &store, thresholds, offload)?
        }
        None => engine.install(|| SparseFfn::new(model, thresholds, DEFAULT_DOWN_FORMAT))?,
    };
    sp.score = score_of(profile.score);
    Ok(sp)
}

/// Collects predictor training data: for every token of the windows, each layer's FFN input and the
/// neurons whose score passes the layer's threshold. Returns one dataset per layer.
pub fn collect_datasets(
    engine: &Engine<'_>,
    sparse: &SparseFfn,
    tokens: &[u32],
    window: usize,
    windows: usize,
    stop: &AtomicBool,
    progress: impl FnMut(usize, usize),
) -> Result<Vec<Dataset>> {
    let cfg = &engine.model().config;
    let (d, ff) = (cfg.d_model, cfg.d_ff);
    let mut sets: Vec<Dataset> = (0..cfg.n_layers).map(|_| Dataset::new(d, ff)).collect();
    let mut first_err = None;
    let mut scores = Vec::new();
    observe_corpus(
        engine,
        tokens,
        window,
        windows,
        stop,
        |s| {
            sparse.scores_into(s.layer, s.act_gate, s.up, &mut scores);
            let t = sparse.thresholds()[s.layer];
            for (tk, st) in scores.chunks(ff).enumerate() {
                if let Err(e) =
                    sets[s.layer].push_mask(&s.input[tk * d..(tk + 1) * d], |j| st[j] > t)
                {
                    first_err.get_or_insert(e);
                }
            }
        },
        progress,
    )?;
    if let Some(e) = first_err {
        return Err(e.into());
    }
    Ok(sets)
}

/// Trains one predictor per layer (in parallel over layers on the engine's pool). `progress(layer,
/// report)` follows each layer.
pub fn train_predictors(
    engine: &Engine<'_>,
    datasets: &[Dataset],
    cfg: &TrainConfig,
    progress: impl Fn(usize, &LayerReport) + Sync,
) -> Result<(PredictorSet, Vec<LayerReport>)> {
    let trained = engine.install(|| {
        datasets
            .par_iter()
            .enumerate()
            .map(|(l, data)| {
                let (p, r) = predictor::train(data, cfg, &mut |_| {})?;
                progress(l, &r);
                Ok((p, r))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let (layers, reports) = trained.into_iter().unzip();
    Ok((
        PredictorSet {
            model_fingerprint: model_fingerprint(engine.model()),
            layers,
        },
        reports,
    ))
}
