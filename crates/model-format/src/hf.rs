//! Hugging Face model directories: `config.json` plus safetensors weights.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use serde::Deserialize;

use crate::{DType, FormatError, TensorInfo, TensorView};

/// The fields of a Hugging Face `config.json` this crate knows about
/// (unknown fields are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HfConfig {
    /// Model class names, e.g. `["LlamaForCausalLM"]` (empty if absent).
    #[serde(default)]
    pub architectures: Vec<String>,
    /// e.g. `"llama"`.
    pub model_type: Option<String>,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the feed-forward hidden layer.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (GQA); `None` means equal to the query heads.
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; `None` means `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: Option<f64>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Whether the output projection shares the embedding matrix.
    pub tie_word_embeddings: Option<bool>,
    /// Activation, e.g. `"silu"`.
    pub hidden_act: Option<String>,
    /// Context length the model was trained for.
    pub max_position_embeddings: Option<usize>,
    /// Beginning-of-sequence token id(s): a number, a list, or null.
    pub bos_token_id: Option<serde_json::Value>,
    /// End-of-sequence token id(s): a number, a list, or null.
    pub eos_token_id: Option<serde_json::Value>,
    /// Whether the attention projections have biases.
    pub attention_bias: Option<bool>,
    /// The dtype the weights were saved in, e.g. `"bfloat16"`.
    pub torch_dtype: Option<String>,
}

/// Pseudo type ids used in [`FormatError::UnsupportedType`] for safetensors
/// dtypes start here (so they never collide with ggml ids).
pub const SAFETENSORS_TYPE_ID_BASE: u32 = 0x5afe_0000;

/// Names of safetensors dtypes, indexed by `type_id - SAFETENSORS_TYPE_ID_BASE`.
pub const SAFETENSORS_DTYPE_NAMES: [&str; 19] = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16",
    "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
];

/// Describes a type id for error messages.
pub(crate) fn describe_type_id(id: u32) -> String {
    match id
        .checked_sub(SAFETENSORS_TYPE_ID_BASE)
        .and_then(|i| SAFETENSORS_DTYPE_NAMES.get(i as usize))
    {
        Some(name) => format!("safetensors dtype {name}"),
        None if id == SAFETENSORS_TYPE_ID_BASE + SAFETENSORS_DTYPE_NAMES.len() as u32 => {
            "safetensors dtype (other)".to_owned()
        }
        None => format!("ggml type id {id}"),
    }
}

fn safetensors_type_id(d: Dtype) -> u32 {
    let name = format!("{d:?}");
    let idx = SAFETENSORS_DTYPE_NAMES
        .iter()
        .position(|n| *n == name)
        .unwrap_or(SAFETENSORS_DTYPE_NAMES.len());
    SAFETENSORS_TYPE_ID_BASE + idx as u32
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// A Hugging Face model directory: `config.json` and either
/// `model.safetensors` or `model.safetensors.index.json` with its shards,
/// each memory-mapped.
///
/// Only F32, F16 and BF16 tensors are accepted.
pub struct HfDir {
    dir: PathBuf,
    config: HfConfig,
    shards: Vec<Shard>,
    tensors: Vec<TensorInfo>,
    /// Shard index of each entry of `tensors`.
    tensor_shard: Vec<usize>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for HfDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfDir")
            .field("dir", &self.dir)
            .field("config", &self.config)
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

/// The largest JSON file of an HF directory read (`config.json`, the safetensors index).
const MAX_JSON_BYTES: u64 = 64 << 20;

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, FormatError> {
    let text = crate::read_input(path, MAX_JSON_BYTES)?;
    serde_json::from_slice(&text).map_err(|source| FormatError::Json {
        path: path.to_path_buf(),
        source,
    })
}

impl HfDir {
    /// Reads `config.json`, then `model.safetensors` or, if that is absent,
    /// `model.safetensors.index.json` and the shard files its `weight_map`
    /// names.
    pub fn open(dir: impl AsRef<Path>) -> Result<HfDir, FormatError> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(FormatError::MissingFile { path: config_path });
        }
        let config: HfConfig = read_json(&config_path)?;

        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        // Shard file names, and for a sharded model the index path and its weight map.
        type Index = Option<(PathBuf, BTreeMap<String, String>)>;
        let (shard_names, weight_map): (Vec<String>, Index) = if single.is_file() {
            (vec!["model.safetensors".to_owned()], None)
        } else if index_path.is_file() {
            let index: IndexJson = read_json(&index_path)?;
            let mut names: Vec<String> = index.weight_map.values().cloned().collect();
            names.sort();
            names.dedup();
            for n in &names {
                let p = Path::new(n);
                let plain = p.components().count() == 1
                    && matches!(p.components().next(), Some(std::path::Component::Normal(_)));
                if !plain {
                    return Err(FormatError::Invalid {
                        path: index_path,
                        detail: format!(
                            "weight_map names shard '{n}', which is not a plain file name"
                        ),
                    });
                }
            }
            (names, Some((index_path, index.weight_map)))
        } else {
            return Err(FormatError::MissingFile { path: single });
        };

        let mut shards = Vec::with_capacity(shard_names.len());
        let mut tensors = Vec::new();
        let mut tensor_shard = Vec::new();
        let mut tensor_index = HashMap::new();
        for (si, shard_name) in shard_names.iter().enumerate() {
            let path = dir.join(shard_name);
            let mmap = crate::map_file(&path)?;
            let mut infos = read_shard(&path, &mmap)?;
            infos.sort_by_key(|t| t.offset);
            crate::tensor::check_no_overlap(&path, &infos)?;
            for info in infos {
                if tensor_index
                    .insert(info.name.clone(), tensors.len())
                    .is_some()
                {
                    return Err(FormatError::Invalid {
                        path: path.clone(),
                        detail: format!("tensor '{}' also appears in an earlier shard", info.name),
                    });
                }
                tensors.push(info);
                tensor_shard.push(si);
            }
            shards.push(Shard { path, mmap });
        }

        if let Some((index_path, weight_map)) = weight_map {
            for (name, shard) in &weight_map {
                let found = tensor_index
                    .get(name)
                    .map(|&i| &shards[tensor_shard[i]].path);
                if found != Some(&dir.join(shard)) {
                    return Err(FormatError::Invalid {
                        path: index_path,
                        detail: format!("weight_map puts tensor '{name}' in '{shard}', but that shard does not contain it"),
                    });
                }
            }
        }

        Ok(HfDir {
            dir,
            config,
            shards,
            tensors,
            tensor_shard,
            tensor_index,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The parsed `config.json`.
    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// Descriptions of all tensors: shard by shard (shard files in name
    /// order), by offset within each. `offset` is absolute within its shard.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The shard file holding the tensor called `name`.
    pub fn tensor_file(&self, name: &str) -> Option<&Path> {
        let &i = self.tensor_index.get(name)?;
        Some(&self.shards[self.tensor_shard[i]].path)
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let &i = self.tensor_index.get(name)?;
        self.view(i)
    }

    /// All tensors, in [`tensor_infos`](Self::tensor_infos) order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        (0..self.tensors.len()).filter_map(|i| self.view(i))
    }

    /// `dir/tokenizer.json`, if it exists.
    pub fn tokenizer_json(&self) -> Option<PathBuf> {
        Some(self.dir.join("tokenizer.json")).filter(|p| p.is_file())
    }

    /// `dir/tokenizer_config.json`, if it exists.
    pub fn tokenizer_config_json(&self) -> Option<PathBuf> {
        Some(self.dir.join("tokenizer_config.json")).filter(|p| p.is_file())
    }

    fn view(&self, i: usize) -> Option<TensorView<'_>> {
        let t = self.tensors.get(i)?;
        let shard = self.shards.get(*self.tensor_shard.get(i)?)?;
        let start = usize::try_from(t.offset).ok()?;
        let end = start.checked_add(usize::try_from(t.n_bytes).ok()?)?;
        Some(TensorView {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            data: shard.mmap.get(start..end)?,
        })
    }
}

/// Parses one safetensors file's header into tensor infos with absolute offsets.
fn read_shard(path: &Path, bytes: &[u8]) -> Result<Vec<TensorInfo>, FormatError> {
    let (header_len, metadata) = SafeTensors::read_metadata(bytes).map_err(|e| match e {
        SafeTensorError::HeaderTooSmall
        | SafeTensorError::InvalidHeaderLength
        | SafeTensorError::MetadataIncompleteBuffer => FormatError::Truncated {
            path: path.to_path_buf(),
            what: format!("safetensors file of {} bytes: {e}", bytes.len()),
        },
        other => FormatError::Invalid {
            path: path.to_path_buf(),
            detail: format!("bad safetensors header: {other}"),
        },
    })?;
    let data_start = 8u64 + header_len as u64;
    let mut infos = Vec::new();
    for (name, info) in metadata.tensors() {
        let dtype = match info.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => {
                return Err(FormatError::UnsupportedType {
                    path: path.to_path_buf(),
                    tensor: name,
                    type_id: safetensors_type_id(other),
                })
            }
        };
        let (start, end) = info.data_offsets;
        let expected = crate::tensor::tensor_bytes(dtype, &info.shape).map_err(|detail| {
            FormatError::ShapeMismatch {
                path: path.to_path_buf(),
                tensor: name.clone(),
                detail,
            }
        })?;
        let offset = data_start + start as u64;
        if end.checked_sub(start) != Some(expected) || offset + expected as u64 > bytes.len() as u64
        {
            return Err(FormatError::ShapeMismatch {
                path: path.to_path_buf(),
                tensor: name,
                detail: format!(
                    "data_offsets {start}..{end} do not hold {expected} bytes of {dtype} {:?}",
                    info.shape
                ),
            });
        }
        infos.push(TensorInfo {
            name,
            dtype,
            shape: info.shape.clone(),
            offset,
            n_bytes: expected as u64,
        });
    }
    Ok(infos)
}
