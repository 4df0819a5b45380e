//! The names of a model's sidecars and of a resident file's bundle parts ([`ModelBundle`],
//! [`BundleParts`]), path logic only, apart from how sparse decode is
//! set up from those files (the engine's `bundle`, which re-exports all of this), so that conversion
//! ([`crate::convert()`]) can name parts without depending on the engine.

use std::path::{Path, PathBuf};

use crate::error::{BundleError, Result};
use transformer::model::Model;

/// Suffix of a resident file's manifest in the older layout (appended to its file name).
pub const MANIFEST_SUFFIX: &str = ".sparrow-manifest";

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
            return Err(BundleError::Request(format!(
                "{needed_by}: {} does not exist: the resident file {}'s bundle is incomplete (convert the original model again with `sparrow convert -o {}`, which profiles it; or give --profile with the original model's profile)",
                path.display(),
                self.model.display(),
                self.model.display()
            )));
        }
        if !path.exists() {
            return Err(BundleError::Request(format!(
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
    pub fn of(resident: &Path, r: &transformer::config::FfnStoreRef) -> Result<Self> {
        let next = |name: &str, key: &str, what: &str| {
            transformer::config::file_next_to(resident, name, key, what)
        };
        let store = r.path_next_to(resident)?;
        Ok(match &r.parts {
            Some(n) => BundleParts {
                resident: resident.to_path_buf(),
                store,
                manifest: next(
                    &n.manifest,
                    transformer::config::BUNDLE_MANIFEST_KEY,
                    "the manifest",
                )?,
                profile: next(
                    &n.profile,
                    transformer::config::BUNDLE_PROFILE_KEY,
                    "the profile",
                )?,
                predictor: match &n.predictor {
                    Some(p) => Some(next(
                        p,
                        transformer::config::BUNDLE_PREDICTOR_KEY,
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
                    manifest: manifest_path(resident),
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
        let file = transformer::model::ModelFile::open(path)?;
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
}

/// The manifest path of a resident file in the older layout, which records no names for its parts:
/// `<resident>.sparrow-manifest` (see [`BundleParts`] for where a bundle's manifest is).
pub fn manifest_path(resident: &Path) -> PathBuf {
    sidecar(resident, MANIFEST_SUFFIX)
}
