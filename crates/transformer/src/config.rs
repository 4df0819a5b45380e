//! Model hyper-parameters, read from GGUF metadata or an HF `config.json`.

use std::path::{Path, PathBuf};

use kernels_neon::RopeStyle;
use model_format::{GgufFile, HfConfig};

use crate::error::{ModelError, Result};

/// A model's family ([`crate::family`]).
pub use crate::family::Arch;

/// The FFN activation of a gated FFN (the workspace's one definition, from `tensor-types`).
pub use tensor_types::Activation;

/// Hyper-parameters of a decoder-only transformer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelConfig {
    /// Architecture family.
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Hidden size.
    pub d_model: usize,
    /// FFN inner size (neurons per layer).
    pub d_ff: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// Dimensions rotated by RoPE in each head.
    pub rope_dim: usize,
    /// Which pairs of dimensions RoPE rotates (depends on the file format's Q/K row order).
    #[serde(skip)]
    pub rope_style: RopeStyle,
    /// FFN activation.
    pub activation: Activation,
    /// Training context length.
    pub context_length: usize,
    /// Where the FFN weights are when this is a resident file written by `sparrow convert` (its FFN
    /// tensors live in a neuron store), `None` for an ordinary model file.
    pub ffn_store: Option<FfnStoreRef>,
    /// The Mixture-of-Experts hyper-parameters (`<arch>.expert_count` and the keys beside it), `None`
    /// for a dense model. `d_ff` stays `feed_forward_length` as the file says it.
    pub moe: Option<crate::moe::MoeConfig>,
}

/// The neuron store a resident file points to (GGUF keys `sparrow.ffn_store.file` and
/// `sparrow.ffn_store.fingerprint`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FfnStoreRef {
    /// The store's file name, relative to the resident file's directory.
    pub file: String,
    /// Fingerprint of the original model (profiles and predictors are checked against it).
    pub fingerprint: u64,
    /// The bundle's other parts, as plain file names in the same folder, when the resident file
    /// records them (`sparrow.bundle.*`, written by every convert since bundles change as one
    /// transaction; see `model_bundle::BundleParts`). `None` in an older resident file, whose
    /// parts have the fixed sidecar names.
    pub parts: Option<BundleNames>,
}

/// The names a resident file records for its bundle's parts (GGUF keys `sparrow.bundle.manifest`,
/// `sparrow.bundle.profile`, `sparrow.bundle.predictor`): every convert writes its parts under new
/// names and switches the bundle to them by renaming the resident file last.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BundleNames {
    /// The manifest.
    pub manifest: String,
    /// The activation profile.
    pub profile: String,
    /// The predictors, when the bundle has them.
    pub predictor: Option<String>,
}

impl FfnStoreRef {
    /// Whether `name` is a plain file name: not empty, no path separator, not `.` or `..`, no NUL.
    /// A resident file names its store this way, so it can only point into its own folder.
    pub fn is_plain_name(name: &str) -> bool {
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
    }

    /// The store's path next to the resident file `model` (in its folder). Refused, before anything
    /// opens it: a name that is not a plain file name, and a symbolic link that leads out of the
    /// folder.
    pub fn path_next_to(&self, model: &Path) -> Result<PathBuf> {
        file_next_to(model, &self.file, FFN_STORE_FILE_KEY, "the neuron store")
    }
}

/// The path of the file `name` next to the resident file `model` (in its folder), as `key` (the
/// metadata key or manifest field that holds the name) gives it; `what` names the file in errors.
/// Refused, before anything opens it: a name that is not a plain file name
/// ([`FfnStoreRef::is_plain_name`]), and a symbolic link that leads out of the folder.
pub fn file_next_to(model: &Path, name: &str, key: &str, what: &str) -> Result<PathBuf> {
    let bad = |detail: String| ModelError::BadModel {
        path: model.to_path_buf(),
        detail,
    };
    if !FfnStoreRef::is_plain_name(name) {
        return Err(bad(format!(
            "{key} `{}` is not a plain file name in the model's folder",
            name.escape_debug()
        )));
    }
    let dir = model.parent().unwrap_or(Path::new(""));
    let path = dir.join(name);
    let is_link = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
    if is_link {
        let folder = std::fs::canonicalize(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        });
        let target = std::fs::canonicalize(&path);
        let inside = match (&folder, &target) {
            (Ok(f), Ok(t)) => t.parent() == Some(f.as_path()),
            _ => false,
        };
        if !inside {
            return Err(bad(format!(
                "{what} {} is a symbolic link leading out of the model's folder",
                path.display()
            )));
        }
    }
    Ok(path)
}

/// GGUF key of a resident file naming its neuron store.
pub const FFN_STORE_FILE_KEY: &str = "sparrow.ffn_store.file";
/// GGUF key of a resident file holding the original model's fingerprint.
pub const FFN_STORE_FINGERPRINT_KEY: &str = "sparrow.ffn_store.fingerprint";
/// GGUF key of a resident file naming its bundle's manifest.
pub const BUNDLE_MANIFEST_KEY: &str = "sparrow.bundle.manifest";
/// GGUF key of a resident file naming its bundle's profile.
pub const BUNDLE_PROFILE_KEY: &str = "sparrow.bundle.profile";
/// GGUF key of a resident file naming its bundle's predictors.
pub const BUNDLE_PREDICTOR_KEY: &str = "sparrow.bundle.predictor";

/// The `sparrow.bundle.*` names of a resident file (`None` when it has none: an older layout),
/// each a plain file name.
fn bundle_names(file: &GgufFile) -> std::result::Result<Option<BundleNames>, String> {
    let get = |key: &str| -> std::result::Result<Option<String>, String> {
        match file.get(key) {
            None => Ok(None),
            Some(v) => match v.as_str() {
                Some(n) if FfnStoreRef::is_plain_name(n) => Ok(Some(n.to_string())),
                Some(n) => Err(format!(
                    "{key} `{}` is not a plain file name in the model's folder",
                    n.escape_debug()
                )),
                None => Err(format!("{key} is not a string")),
            },
        }
    };
    let (manifest, profile, predictor) = (
        get(BUNDLE_MANIFEST_KEY)?,
        get(BUNDLE_PROFILE_KEY)?,
        get(BUNDLE_PREDICTOR_KEY)?,
    );
    match (manifest, profile) {
        (Some(manifest), Some(profile)) => Ok(Some(BundleNames {
            manifest,
            profile,
            predictor,
        })),
        (None, None) if predictor.is_none() => Ok(None),
        _ => Err(format!(
            "{BUNDLE_MANIFEST_KEY} and {BUNDLE_PROFILE_KEY} must come together"
        )),
    }
}

impl ModelConfig {
    /// Reads the configuration from GGUF metadata (`{arch}.*` keys, as llama.cpp writes them).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let path = file.path();
        let bad = |detail: String| ModelError::BadModel {
            path: path.to_path_buf(),
            detail,
        };
        let arch_name = file
            .get("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("metadata key general.architecture is missing".into()))?
            .to_string();
        let arch = Arch::from_gguf(&arch_name).ok_or_else(|| {
            bad(format!(
                "architecture `{arch_name}` is not supported (supported: {})",
                Arch::supported_gguf()
            ))
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req_u = |k: &str| -> Result<usize> {
            let full = key(k);
            file.get(&full)
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("metadata key {full} is missing or not an integer")))
        };
        let opt_u = |k: &str| {
            file.get(&key(k))
                .and_then(|v| v.as_u64())
                .map(|v| v as usize)
        };
        let opt_f = |k: &str| file.get(&key(k)).and_then(|v| v.as_f64());
        let d_model = req_u("embedding_length")?;
        let n_heads = req_u("attention.head_count")?;
        let head_dim =
            opt_u("attention.key_length").unwrap_or(d_model.checked_div(n_heads).unwrap_or(0));
        let vocab_size = match opt_u("vocab_size") {
            Some(v) => v,
            None => file
                .array_len("tokenizer.ggml.tokens")
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    bad("neither {arch}.vocab_size nor tokenizer.ggml.tokens is present".into())
                })?,
        };
        let activation = match file.get("sparrow.ffn_activation").and_then(|v| v.as_str()) {
            Some(s) => Activation::from_name(s).ok_or_else(|| {
                bad(format!(
                    "sparrow.ffn_activation `{s}` is not silu, relu or gelu_pytorch_tanh"
                ))
            })?,
            None => arch.family().activation(),
        };
        let cfg = ModelConfig {
            arch,
            n_layers: req_u("block_count")?,
            d_model,
            d_ff: req_u("feed_forward_length")?,
            n_heads,
            n_kv_heads: opt_u("attention.head_count_kv").unwrap_or(n_heads),
            head_dim,
            vocab_size,
            rms_eps: opt_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5) as f32,
            rope_base: opt_f("rope.freq_base").unwrap_or(10_000.0) as f32,
            rope_dim: opt_u("rope.dimension_count").unwrap_or(head_dim),
            rope_style: arch.family().gguf_rope(),
            activation,
            context_length: opt_u("context_length").unwrap_or(2048),
            ffn_store: match (
                file.get(FFN_STORE_FILE_KEY).and_then(|v| v.as_str()),
                file.get(FFN_STORE_FINGERPRINT_KEY).and_then(|v| v.as_u64()),
            ) {
                (Some(f), Some(_)) if !FfnStoreRef::is_plain_name(f) => {
                    return Err(bad(format!(
                        "{FFN_STORE_FILE_KEY} `{}` is not a plain file name in the model's folder",
                        f.escape_debug()
                    )))
                }
                (Some(f), Some(fp)) => Some(FfnStoreRef {
                    file: f.to_string(),
                    fingerprint: fp,
                    parts: bundle_names(file).map_err(bad)?,
                }),
                (None, None) => None,
                _ => {
                    return Err(bad(format!(
                        "{FFN_STORE_FILE_KEY} and {FFN_STORE_FINGERPRINT_KEY} must come together"
                    )))
                }
            },
            moe: crate::moe::MoeConfig::from_gguf(path, |k| file.get(k))?,
        };
        cfg.validate(path)?;
        cfg.check_layers_present(
            file.tensor_infos().iter().map(|t| t.name.as_str()),
            "blk.",
            path,
        )?;
        Ok(cfg)
    }

    /// The layers a file holds (`{prefix}N.` tensor names) must lie in `0..n_layers`: a count that
    /// declares fewer layers than the file holds would silently drop some (more fail at load with the
    /// missing tensor named).
    fn check_layers_present<'n>(
        &self,
        names: impl Iterator<Item = &'n str>,
        prefix: &str,
        path: &Path,
    ) -> Result<()> {
        for name in names {
            let Some(rest) = name.strip_prefix(prefix) else {
                continue;
            };
            let Some(i) = rest.split('.').next().and_then(|n| n.parse::<usize>().ok()) else {
                continue;
            };
            if i >= self.n_layers {
                return Err(ModelError::BadModel {
                    path: path.to_path_buf(),
                    detail: format!(
                        "tensor {name} belongs to layer {i}, but the model declares {} layers",
                        self.n_layers
                    ),
                });
            }
        }
        Ok(())
    }

    /// Reads the configuration from an HF `config.json`.
    pub fn from_hf(cfg: &HfConfig, path: &Path) -> Result<Self> {
        let bad = |detail: String| ModelError::BadModel {
            path: path.to_path_buf(),
            detail,
        };
        let arch_str = cfg
            .architectures
            .first()
            .cloned()
            .or_else(|| cfg.model_type.clone())
            .unwrap_or_default();
        let arch = Arch::from_hf(&arch_str).ok_or_else(|| {
            bad(format!(
                "architecture `{arch_str}` is not supported (supported: {})",
                Arch::supported_hf()
            ))
        })?;
        let activation = match cfg.hidden_act.as_deref() {
            None => Activation::Silu,
            Some(s) => Activation::from_name(s).ok_or_else(|| {
                bad(format!(
                    "hidden_act `{s}` is not supported (silu, relu or gelu_pytorch_tanh)"
                ))
            })?,
        };
        let head_dim = cfg.head_dim.unwrap_or(
            cfg.hidden_size
                .checked_div(cfg.num_attention_heads)
                .unwrap_or(0),
        );
        let out = ModelConfig {
            arch,
            n_layers: cfg.num_hidden_layers,
            d_model: cfg.hidden_size,
            d_ff: cfg.intermediate_size,
            n_heads: cfg.num_attention_heads,
            n_kv_heads: cfg.num_key_value_heads.unwrap_or(cfg.num_attention_heads),
            head_dim,
            vocab_size: cfg.vocab_size,
            rms_eps: cfg.rms_norm_eps as f32,
            rope_base: cfg.rope_theta.unwrap_or(10_000.0) as f32,
            rope_dim: head_dim,
            rope_style: RopeStyle::Half,
            activation,
            context_length: cfg.max_position_embeddings.unwrap_or(2048),
            ffn_store: None,
            moe: None,
        };
        out.validate(path)?;
        Ok(out)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        let bad = |detail: String| {
            Err(ModelError::BadModel {
                path: path.to_path_buf(),
                detail,
            })
        };
        // Far above any real model, low enough that sizes computed from them cannot overflow and
        // nothing is allocated from an absurd count before the tensors are checked.
        const MAX_LAYERS: usize = 1 << 12;
        const MAX_WIDTH: usize = 1 << 20;
        const MAX_VOCAB: usize = 1 << 24;
        const MAX_CONTEXT: usize = 1 << 24;
        for (what, v, max) in [
            ("block count", self.n_layers, MAX_LAYERS),
            ("embedding length", self.d_model, MAX_WIDTH),
            ("feed-forward length", self.d_ff, MAX_WIDTH),
            ("head count", self.n_heads, MAX_WIDTH),
            ("key/value head count", self.n_kv_heads, MAX_WIDTH),
            ("head dimension", self.head_dim, MAX_WIDTH),
            ("vocabulary size", self.vocab_size, MAX_VOCAB),
            ("context length", self.context_length, MAX_CONTEXT),
        ] {
            if v > max {
                return bad(format!("{what} {v} is out of range (at most {max})"));
            }
        }
        if self.q_dim() > MAX_WIDTH || self.kv_dim() > MAX_WIDTH {
            return bad(format!(
                "{} heads of {} are wider than {MAX_WIDTH}",
                self.n_heads, self.head_dim
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return bad(format!(
                "rms epsilon {} is not a finite number above 0",
                self.rms_eps
            ));
        }
        if self.n_layers == 0
            || self.d_model == 0
            || self.d_ff == 0
            || self.n_heads == 0
            || self.vocab_size == 0
            || self.context_length == 0
        {
            return bad(format!("a model dimension is zero: {self:?}"));
        }
        if self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return bad(format!(
                "{} query heads are not a multiple of {} key/value heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.head_dim == 0
            || self.head_dim % 2 != 0
            || self.rope_dim > self.head_dim
            || self.rope_dim % 2 != 0
        {
            return bad(format!(
                "head_dim {} / rope_dim {} are not valid",
                self.head_dim, self.rope_dim
            ));
        }
        if !(self.rms_eps.is_finite() && self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad("rms epsilon or rope base is not a finite positive number".into());
        }
        Ok(())
    }

    /// Query width: `n_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Key/value width: `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}
