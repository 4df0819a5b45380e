//! A model file and the files that travel with it ("sidecars"), and how sparse decode is set up from
//! them: the one place that knows their names, checks that they belong to the model, and splits a
//! memory budget between what stays resident and the FFN cache.
//!
//! Names, for a model at `dir/m.gguf` ([`ModelBundle`]):
//! - `dir/m.gguf.sparrow-profile`: its activation profile (`sparrow profile`);
//! - `dir/m.gguf.sparrow-predictor`: its neuron predictors (`sparrow train-predictor`), optional;
//! - `dir/m.resident.gguf`: the resident file `sparrow convert` writes by default. It names the other
//!   parts of its bundle, each written under a new name by every convert ([`BundleParts`]): its neuron
//!   store, manifest, and the profile and predictors copied into the bundle (a resident file carries
//!   the fingerprint of the model it came from, so they stay valid). An older resident file names only
//!   its store (`dir/m.resident.neurons`) and has the sidecar names above.
//!
//! Invariant: a profile or predictor set is used only if its model fingerprint
//! ([`crate::profile::model_fingerprint`]) and layer counts match the model's.

use std::path::{Path, PathBuf};

use crate::error::{EngineError, Result};
use crate::generate::Engine;
use model_bundle::manifest::ManifestStatus;
use offload::budget::{ffn_cache_bytes, BudgetSplit, MemoryBudget, Resident};
use offload::sparse::SparseFfn;
use offload::OffloadOptions;
use predictor::{PredictorSet, Profile};
use transformer::model::Model;

pub use model_bundle::bundle_parts::{
    sidecar, BundleParts, ModelBundle, PREDICTOR_SUFFIX, PROFILE_SUFFIX, RESIDENT_SUFFIX,
};
pub use model_bundle::manifest::seal_manifest;

/// The neuron store of a resident model (its FFN), `None` for an ordinary model: the file its
/// configuration names, relative to the model's directory.
pub fn ffn_store_path(model: &Model<'_>) -> Result<Option<PathBuf>> {
    match model.config.ffn_store.as_ref() {
        None => Ok(None),
        Some(r) => Ok(Some(r.path_next_to(model.path())?)),
    }
}

/// Loads the predictors at `path` and checks they were trained for `model` (fingerprint and layer
/// count).
pub fn load_predictors(path: &Path, model: &Model<'_>) -> Result<PredictorSet> {
    let set = PredictorSet::load(path)?;
    if set.model_fingerprint != crate::profile::model_fingerprint(model)
        || set.layers.len() != model.config.n_layers
    {
        return Err(EngineError::BadModel {
            path: path.to_path_buf(),
            detail:
                "these predictors were trained for another model (run `sparrow train-predictor`)"
                    .into(),
        });
    }
    Ok(set)
}

/// Which sidecars sparse decode reads (`--profile`, `--predictor`, `--no-predictor`); the defaults
/// are the model's own ([`ModelBundle`]).
#[derive(Debug, Clone, Default)]
pub struct SparseSidecars {
    /// The profile (default: the model's).
    pub profile: Option<PathBuf>,
    /// The predictors (default: the model's, if that file exists).
    pub predictor: Option<PathBuf>,
    /// Use no predictor at all.
    pub no_predictor: bool,
}

/// Everything sparse decode needs, found and loaded, before the FFN is built ([`SparsePlan::build`]):
/// the profile, the predictor file, and for a resident model the offload settings with the FFN cache's
/// budget worked out.
#[derive(Debug)]
pub struct SparsePlan {
    /// Where the profile came from.
    pub profile_path: PathBuf,
    /// The profile (thresholds, score).
    pub profile: Profile,
    /// The predictor file, when predictors are used.
    pub predictor: Option<PathBuf>,
    /// Offload settings (the defaults for an ordinary model, whose FFN is in memory).
    pub offload: OffloadOptions,
    /// How a process budget split, when one was given for a resident model.
    pub budget: Option<BudgetSplit>,
    /// For a resident model, what its manifest check found (sizes of every part; an error if one does
    /// not match, so only a match or a missing manifest get here).
    pub manifest: Option<ManifestStatus>,
    /// Whether the embedding and output projection stay on flash ([`transformer::stream`]): under a process
    /// budget that cannot hold the whole FFN beside them, unless a plan decided
    /// ([`OffloadOptions::stream_weights`]). Apply with [`Engine::set_streamed`].
    pub stream_weights: bool,
}

impl SparsePlan {
    /// Finds and loads the sidecars of `engine`'s model and, for a resident model, sets
    /// `offload.ffn_budget` from `budget` (the other fields of `offload` are kept). Under a process
    /// budget, what the process holds now counts as resident, the KV cache at the engine's context.
    pub fn new(
        engine: &Engine<'_>,
        sidecars: &SparseSidecars,
        budget: MemoryBudget,
        offload: OffloadOptions,
    ) -> Result<Self> {
        let mut plan = Self::sidecars(engine, sidecars)?;
        plan.set_budget(engine, budget, offload, engine.options().context)?;
        Ok(plan)
    }

    /// Finds and loads the sidecars of `engine`'s model (a resident model's manifest checked
    /// first), with the default offload settings and no budget yet ([`SparsePlan::set_budget`]).
    pub fn sidecars(engine: &Engine<'_>, sidecars: &SparseSidecars) -> Result<Self> {
        let model = engine.model();
        let bundle = ModelBundle::of_model(model)?;
        // A resident file's parts are checked against its manifest (sizes, and that each is the
        // bundle's own) before any is read.
        let manifest = match &model.config.ffn_store {
            None => None,
            Some(r) => Some(model_bundle::manifest::check_at_load(
                &BundleParts::of(model.path(), r)?,
                r.fingerprint,
            )?),
        };
        let profile_path =
            bundle.existing_profile(sidecars.profile.as_deref(), "--sparse needs a profile")?;
        let profile = Profile::load(&profile_path)?;
        let predictor = if sidecars.no_predictor {
            None
        } else {
            bundle.predictor_or(sidecars.predictor.as_deref())
        };
        Ok(SparsePlan {
            profile_path,
            profile,
            predictor,
            offload: OffloadOptions::default(),
            budget: None,
            manifest,
            stream_weights: false,
        })
    }

    /// For a resident model, sets the offload settings to `offload` with the FFN cache's budget
    /// worked out from `budget`, a KV cache of `context` positions counted as resident (nothing
    /// for an ordinary model, whose FFN is in memory). An error (a process budget that leaves
    /// nothing) changes nothing.
    pub fn set_budget(
        &mut self,
        engine: &Engine<'_>,
        budget: MemoryBudget,
        offload: OffloadOptions,
        context: usize,
    ) -> Result<()> {
        let model = engine.model();
        let predictor = self.predictor.as_deref();
        let Some(store) = ffn_store_path(model)? else {
            return Ok(());
        };
        let ffn = offload::budget::store_ffn_bytes(&store)?;
        let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        // What stays resident besides the FFN cache, measured now: counted first under a
        // process budget, at load or set live.
        let resident = Resident {
            // Besides the model file's touched pages, which `file` counts.
            process: crate::sys::rss_besides(model.path())
                .or_else(crate::sys::rss_bytes)
                .unwrap_or(0),
            // The tensor data: the header's pages were handed back after loading; the
            // output's proxy is read from flash or not at all.
            file: len(model.path())
                .saturating_sub(model.header_bytes())
                .saturating_sub(model.output_proxy().map_or(0, |p| p.data().len() as u64)),
            kv_cache: model
                .config
                .kv_cache_bytes(context.max(1), engine.cache_type()),
            predictors: predictor.map_or(0, len),
            read_ahead: 0,
        };
        // Without a predictor a step reads the next layer ahead: under a process budget,
        // what that holds is counted beside the cache.
        let reads_ahead = offload.read_ahead && predictor.is_none();
        let with_read_ahead = |r: Resident| match (budget.process(), reads_ahead) {
            (Some(b), true) => Resident {
                read_ahead: offload::budget::read_ahead_bytes(
                    ffn,
                    model.config.n_layers,
                    b.saturating_sub(r.total()),
                ),
                ..r
            },
            _ => r,
        };
        let mut resident = with_read_ahead(resident);
        // The FFN cache comes before the embedding and output (transformer::stream): when the
        // budget cannot hold the whole FFN beside them, they stay on flash.
        let whole = ffn_cache_bytes(budget, ffn, context, || resident);
        let short = offload.stream_weights.unwrap_or_else(|| {
            budget.process().is_some() && whole.as_ref().map_or(true, |(b, _)| (*b as u64) < ffn)
        });
        let (ffn_budget, split) = if short {
            let streamed = model.streamed_bytes();
            resident.file = resident
                .file
                .saturating_sub(streamed)
                .saturating_add(streamed.min(transformer::stream::STREAM_RESIDENT_BYTES));
            resident = with_read_ahead(Resident {
                read_ahead: 0,
                ..resident
            });
            ffn_cache_bytes(budget, ffn, context, || resident)?
        } else {
            whole?
        };
        self.stream_weights = short;
        self.offload = OffloadOptions {
            ffn_budget,
            outside_ffn_bytes: resident.total(),
            read_ahead_bytes: match (budget.process(), reads_ahead) {
                (Some(_), true) => (resident.read_ahead / 2) as usize,
                _ => offload.read_ahead_bytes,
            },
            ..offload
        };
        self.budget = split;
        Ok(())
    }

    /// The sparse FFN of the plan for `engine` (the one it was made for): the profile's thresholds and
    /// score (checked against the model), over the neuron store for a resident model, with the
    /// predictors (checked too) when the plan has them.
    pub fn build(&self, engine: &Engine<'_>) -> Result<SparseFfn> {
        let mut sp = crate::profile::sparse_from_profile_with(
            engine,
            &self.profile,
            &self.profile_path,
            self.offload.clone(),
        )?;
        if let Some(p) = &self.predictor {
            sp = sp.with_predictor(Box::new(load_predictors(p, engine.model())?));
        }
        Ok(sp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecars_append_to_the_whole_name() {
        let b = ModelBundle::new("dir/m.gguf");
        assert_eq!(b.model(), Path::new("dir/m.gguf"));
        assert_eq!(b.profile(), PathBuf::from("dir/m.gguf.sparrow-profile"));
        assert_eq!(b.predictor(), PathBuf::from("dir/m.gguf.sparrow-predictor"));
        // An HF directory gets them next to it.
        let hf = ModelBundle::new("models/smol");
        assert_eq!(hf.profile(), PathBuf::from("models/smol.sparrow-profile"));
    }

    #[test]
    fn resident_file_replaces_the_extension_and_names_its_store_and_sidecars() {
        let b = ModelBundle::new("dir/m.gguf");
        let r = b.resident();
        assert_eq!(r, PathBuf::from("dir/m.resident.gguf"));
        assert_eq!(
            model_bundle::store_path_for(&r),
            PathBuf::from("dir/m.resident.neurons")
        );
        let rb = ModelBundle::new(&r);
        assert_eq!(
            rb.profile(),
            PathBuf::from("dir/m.resident.gguf.sparrow-profile")
        );
        assert_eq!(
            rb.predictor(),
            PathBuf::from("dir/m.resident.gguf.sparrow-predictor")
        );
        assert_eq!(
            ModelBundle::new("/").resident(),
            PathBuf::from("/model.resident.gguf")
        );
    }

    #[test]
    fn explicit_sidecars_win_and_default_predictors_only_if_present() {
        let dir = std::env::temp_dir().join(format!("sparrow-bundle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let b = ModelBundle::new(dir.join("m.gguf"));
        let other = dir.join("other");
        assert_eq!(b.profile_or(Some(&other)), other);
        assert_eq!(b.profile_or(None), b.profile());
        // An explicit predictor is used even if absent (loading it then fails, naming it).
        assert_eq!(b.predictor_or(Some(&other)), Some(other.clone()));
        assert_eq!(b.predictor_or(None), None);
        let e = b
            .existing_profile(None, "--sparse needs a profile")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--sparse needs a profile: ")
                && e.contains("m.gguf.sparrow-profile does not exist"),
            "{e}"
        );
        std::fs::write(b.predictor(), b"x").unwrap();
        std::fs::write(b.profile(), b"x").unwrap();
        assert_eq!(b.predictor_or(None), Some(b.predictor()));
        assert_eq!(b.existing_profile(None, "x").unwrap(), b.profile());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
