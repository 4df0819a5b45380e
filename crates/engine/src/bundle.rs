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

use crate::budget::{ffn_cache_bytes, BudgetSplit, FfnBudget, Resident};
use crate::error::{EngineError, Result};
use crate::generate::Engine;
use crate::manifest::{Manifest, ManifestStatus, PartRole};
use crate::model::Model;
use crate::offload::OffloadOptions;
use crate::sparse::SparseFfn;
use predictor::{PredictorSet, Profile};

/// Suffix of a model's activation profile (appended to the model's file name).
pub const PROFILE_SUFFIX: &str = ".sparrow-profile";
/// Suffix of a model's predictor file (appended to the model's file name).
pub const PREDICTOR_SUFFIX: &str = ".sparrow-predictor";
/// Suffix replacing a model's extension in the default name of its resident file.
pub const RESIDENT_SUFFIX: &str = ".resident.gguf";

/// `path` with `suffix` appended to its whole name: `m.gguf` + `.sparrow-profile` is
/// `m.gguf.sparrow-profile`.
pub fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// A model path and the names of its sidecars (see the module docs). Touches no file except where a
/// method says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelBundle {
    model: PathBuf,
    /// The profile and predictors a resident file records ([`BundleParts`]), which replace the
    /// fixed sidecar names.
    recorded: Option<(PathBuf, Option<PathBuf>)>,
    /// Whether the model is a resident file (its profile comes from a convert, not `sparrow profile`).
    resident: bool,
}

impl ModelBundle {
    /// The bundle of the model file (or HF directory) at `model`, with the fixed sidecar names.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        ModelBundle {
            model: model.into(),
            recorded: None,
            resident: false,
        }
    }

    /// The bundle of a loaded model: for a resident file that records its parts, its profile and
    /// predictors are those it names; otherwise as [`ModelBundle::new`].
    pub fn of_model(model: &Model<'_>) -> Result<Self> {
        let mut b = ModelBundle::new(model.path());
        if let Some(r) = &model.config.ffn_store {
            b.resident = true;
            let parts = BundleParts::of(model.path(), r)?;
            if parts.recorded {
                b.recorded = Some((parts.profile, parts.predictor));
            }
        }
        Ok(b)
    }

    /// The model's path.
    pub fn model(&self) -> &Path {
        &self.model
    }

    /// Its profile's default path: the one a resident file records, else `<model>.sparrow-profile`.
    pub fn profile(&self) -> PathBuf {
        match &self.recorded {
            Some((p, _)) => p.clone(),
            None => sidecar(&self.model, PROFILE_SUFFIX),
        }
    }

    /// Its predictors' default path: `<model>.sparrow-predictor`.
    pub fn predictor(&self) -> PathBuf {
        sidecar(&self.model, PREDICTOR_SUFFIX)
    }

    /// The default resident file of a conversion: `<model stem>.resident.gguf` next to the model
    /// (`model.resident.gguf` when the path has no stem).
    pub fn resident(&self) -> PathBuf {
        let stem = self
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        self.model
            .with_file_name(format!("{stem}{RESIDENT_SUFFIX}"))
    }

    /// `explicit`, or the default profile path.
    pub fn profile_or(&self, explicit: Option<&Path>) -> PathBuf {
        explicit.map_or_else(|| self.profile(), Path::to_path_buf)
    }

    /// [`Self::profile_or`], which must exist: otherwise an error starting with `needed_by` (what needs
    /// it, e.g. "--sparse needs a profile") that says how to make one.
    pub fn existing_profile(&self, explicit: Option<&Path>, needed_by: &str) -> Result<PathBuf> {
        let path = self.profile_or(explicit);
        if !path.exists() && self.resident {
            // `sparrow profile` cannot run on a resident file (its FFN is in the store): the
            // bundle's profile comes from the convert that wrote it.
            return Err(EngineError::Request(format!(
                "{needed_by}: {} does not exist: the resident file {}'s bundle is incomplete (convert the original model again with `sparrow convert -o {}`, which profiles it; or give --profile with the original model's profile)",
                path.display(),
                self.model.display(),
                self.model.display()
            )));
        }
        if !path.exists() {
            return Err(EngineError::Request(format!(
                "{needed_by}: {} does not exist (run `sparrow profile` first, or give --profile)",
                path.display()
            )));
        }
        Ok(path)
    }

    /// The predictor file to use: `explicit` if given (it must then exist when loaded), else the default
    /// path if that file exists, else none.
    pub fn predictor_or(&self, explicit: Option<&Path>) -> Option<PathBuf> {
        match (explicit, &self.recorded) {
            (Some(p), _) => Some(p.to_path_buf()),
            // A resident file that records its parts uses the predictors it names, or none.
            (None, Some((_, p))) => p.clone(),
            (None, None) => Some(self.predictor()).filter(|p| p.exists()),
        }
    }
}

/// Where the parts of a resident file's bundle are: the resident file, its neuron store, manifest,
/// profile and predictors, all in the resident file's folder.
///
/// Two layouts load. Since bundles change as one transaction, a resident file records the names of
/// all its parts (`sparrow.ffn_store.file` and `sparrow.bundle.*`), which carry a generation of their
/// own (`m.resident.<gen>.neurons`, `m.resident.gguf.<gen>.sparrow-profile`, ...): a convert writes
/// a whole new set beside the old one and switches by renaming the resident file. An older resident
/// file names only its store, and its other parts have the fixed sidecar names
/// (`<resident>.sparrow-profile`, `.sparrow-predictor`, `.sparrow-manifest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleParts {
    /// The resident file.
    pub resident: PathBuf,
    /// Its neuron store.
    pub store: PathBuf,
    /// Its manifest.
    pub manifest: PathBuf,
    /// Its profile.
    pub profile: PathBuf,
    /// Its predictors: the recorded ones, or (older layout) the sidecar when that file exists.
    pub predictor: Option<PathBuf>,
    /// Whether the resident file records its parts (the transactional layout).
    pub recorded: bool,
}

impl BundleParts {
    /// The parts of the resident file `resident` whose store reference is `r` (each name checked as
    /// the store's is: a plain name in the folder, no link out of it). Touches no file but to check
    /// for links and, in the older layout, whether the predictor sidecar exists.
    pub fn of(resident: &Path, r: &crate::config::FfnStoreRef) -> Result<Self> {
        let next = |name: &str, key: &str, what: &str| {
            crate::config::file_next_to(resident, name, key, what)
        };
        let store = r.path_next_to(resident)?;
        Ok(match &r.parts {
            Some(n) => BundleParts {
                resident: resident.to_path_buf(),
                store,
                manifest: next(
                    &n.manifest,
                    crate::config::BUNDLE_MANIFEST_KEY,
                    "the manifest",
                )?,
                profile: next(&n.profile, crate::config::BUNDLE_PROFILE_KEY, "the profile")?,
                predictor: match &n.predictor {
                    Some(p) => Some(next(
                        p,
                        crate::config::BUNDLE_PREDICTOR_KEY,
                        "the predictors",
                    )?),
                    None => None,
                },
                recorded: true,
            },
            None => {
                let b = ModelBundle::new(resident);
                BundleParts {
                    resident: resident.to_path_buf(),
                    store,
                    manifest: crate::manifest::manifest_path(resident),
                    profile: b.profile(),
                    predictor: Some(b.predictor()).filter(|p| p.exists()),
                    recorded: false,
                }
            }
        })
    }

    /// The parts of the file at `path` when it is a resident file (its header is read), `None` for
    /// an ordinary model, an HF directory, or a path that does not exist.
    pub fn read(path: &Path) -> Result<Option<Self>> {
        if path.is_dir() || !path.exists() {
            return Ok(None);
        }
        let file = crate::model::ModelFile::open(path)?;
        match file.config()?.ffn_store {
            None => Ok(None),
            Some(r) => BundleParts::of(path, &r).map(Some),
        }
    }

    /// Every part's path: resident file, store, manifest, profile, predictors.
    pub fn all(&self) -> Vec<PathBuf> {
        let mut v = vec![
            self.resident.clone(),
            self.store.clone(),
            self.manifest.clone(),
            self.profile.clone(),
        ];
        v.extend(self.predictor.clone());
        v
    }

    /// The path the bundle gives the part of role `role` (`None`: a bundle without predictors).
    pub fn of_role(&self, role: PartRole) -> Option<&Path> {
        match role {
            PartRole::Resident => Some(&self.resident),
            PartRole::Store => Some(&self.store),
            PartRole::Profile => Some(&self.profile),
            PartRole::Predictor => self.predictor.as_deref(),
        }
    }
}

/// Writes the manifest of the bundle of the resident file `resident` (converted from a model with
/// fingerprint `source_fingerprint`) at the path its layout gives ([`BundleParts`]): the resident
/// file, its store, and its profile and predictors when they exist. `sparrow convert` seals the
/// bundles it writes itself; this re-seals one whose parts were replaced by hand (an older layout's
/// profile), and is what tests use.
pub fn seal_manifest(resident: &Path, source_fingerprint: u64) -> Result<Manifest> {
    let parts = BundleParts::read(resident)?.ok_or_else(|| EngineError::BadModel {
        path: resident.to_path_buf(),
        detail: "not a resident file (sparrow convert writes one)".into(),
    })?;
    let mut list = vec![
        (PartRole::Resident, resident.to_path_buf()),
        (PartRole::Store, parts.store.clone()),
    ];
    if parts.profile.exists() {
        list.push((PartRole::Profile, parts.profile.clone()));
    }
    if let Some(p) = &parts.predictor {
        list.push((PartRole::Predictor, p.clone()));
    }
    let m = Manifest::of_files(resident, source_fingerprint, &list)?;
    Ok(atomic_out::write_atomic(&parts.manifest, m.to_text().as_bytes()).map(|()| m)?)
}

/// The neuron store of a resident model (its FFN), `None` for an ordinary model: the file its
/// configuration names, relative to the model's directory.
pub fn ffn_store_path(model: &Model<'_>) -> Result<Option<PathBuf>> {
    match model.config.ffn_store.as_ref() {
        None => Ok(None),
        Some(r) => r.path_next_to(model.path()).map(Some),
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
    /// Whether the embedding and output projection stay on flash ([`crate::stream`]): under a process
    /// budget that cannot hold the whole FFN beside them, unless a plan decided
    /// ([`OffloadOptions::stream_weights`]). Apply with [`Engine::set_streamed`].
    pub stream_weights: bool,
}

impl SparsePlan {
    /// Finds and loads the sidecars of `engine`'s model and, for a resident model, sets
    /// `offload.ffn_budget` from `budget` (the other fields of `offload` are kept). Under a process
    /// budget, what the process holds now counts as resident.
    pub fn new(
        engine: &Engine<'_>,
        sidecars: &SparseSidecars,
        budget: FfnBudget,
        offload: OffloadOptions,
    ) -> Result<Self> {
        let model = engine.model();
        let bundle = ModelBundle::of_model(model)?;
        // A resident file's parts are checked against its manifest (sizes, and that each is the
        // bundle's own) before any is read.
        let manifest = match &model.config.ffn_store {
            None => None,
            Some(r) => Some(crate::manifest::check_at_load(
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
        let mut stream_weights = false;
        let (offload, budget) = match ffn_store_path(model)? {
            None => (OffloadOptions::default(), None),
            Some(store) => {
                let ffn = crate::offload::store_ffn_bytes(&store)?;
                let context = engine.options().context;
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
                    predictors: predictor.as_deref().map_or(0, len),
                    read_ahead: 0,
                };
                // Without a predictor a step reads the next layer ahead: under a process budget,
                // what that holds is counted beside the cache.
                let reads_ahead = offload.read_ahead && predictor.is_none();
                let with_read_ahead = |r: Resident| match (budget, reads_ahead) {
                    (FfnBudget::Process(b), true) => Resident {
                        read_ahead: crate::budget::read_ahead_bytes(
                            ffn,
                            model.config.n_layers,
                            b.saturating_sub(r.total()),
                        ),
                        ..r
                    },
                    _ => r,
                };
                let mut resident = with_read_ahead(resident);
                // The FFN cache comes before the embedding and output (crate::stream): when the
                // budget cannot hold the whole FFN beside them, they stay on flash.
                let whole = ffn_cache_bytes(budget, ffn, context, || resident);
                let short = offload.stream_weights.unwrap_or_else(|| {
                    matches!(budget, FfnBudget::Process(_))
                        && whole.as_ref().map_or(true, |(b, _)| (*b as u64) < ffn)
                });
                let (ffn_budget, split) = if short {
                    let streamed = model.streamed_bytes();
                    resident.file = resident
                        .file
                        .saturating_sub(streamed)
                        .saturating_add(streamed.min(crate::stream::STREAM_RESIDENT_BYTES));
                    resident = with_read_ahead(Resident {
                        read_ahead: 0,
                        ..resident
                    });
                    stream_weights = true;
                    ffn_cache_bytes(budget, ffn, context, || resident)?
                } else {
                    whole?
                };
                (
                    OffloadOptions {
                        ffn_budget,
                        outside_ffn_bytes: resident.total(),
                        read_ahead_bytes: match (budget, reads_ahead) {
                            (FfnBudget::Process(_), true) => (resident.read_ahead / 2) as usize,
                            _ => offload.read_ahead_bytes,
                        },
                        ..offload
                    },
                    split,
                )
            }
        };
        Ok(SparsePlan {
            profile_path,
            profile,
            predictor,
            offload,
            budget,
            manifest,
            stream_weights,
        })
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
            crate::offload::store_path_for(&r),
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
