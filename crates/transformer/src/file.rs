//! Model files: opening a GGUF file or HF directory, tensor naming per format, and the mapping from
//! file dtypes to kernel weight formats. A leaf below [`crate::model`] and [`crate::requant`].

use std::path::{Path, PathBuf};

use model_format::{GgufFile, HfDir, TensorView};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::family::ConfigKeys;

/// An opened model file: GGUF or an HF directory. Owns the memory maps the [`Model`](crate::model::Model) borrows from.
pub enum ModelFile {
    /// A GGUF file.
    Gguf(GgufFile),
    /// A Hugging Face directory (`config.json` + safetensors).
    Hf(Box<HfDir>),
}

impl ModelFile {
    /// Opens `path`: a directory is read as an HF model, a file as GGUF.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            Ok(ModelFile::Hf(Box::new(HfDir::open(path)?)))
        } else {
            Ok(ModelFile::Gguf(GgufFile::open(path)?))
        }
    }

    /// The file or directory path.
    pub fn path(&self) -> &Path {
        match self {
            ModelFile::Gguf(f) => f.path(),
            ModelFile::Hf(d) => d.dir(),
        }
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> Result<ModelConfig> {
        match self {
            ModelFile::Gguf(f) => ModelConfig::from_gguf(f),
            ModelFile::Hf(d) => ModelConfig::from_hf(d.config(), d.dir()),
        }
    }

    /// Bytes of the file before its tensor data (a GGUF header: metadata, vocabulary, tensor
    /// descriptions); 0 for an HF directory.
    pub fn header_bytes(&self) -> u64 {
        match self {
            ModelFile::Gguf(f) => f.data_offset(),
            ModelFile::Hf(_) => 0,
        }
    }

    /// Hands the header's pages back once the model and its tokenizer are built
    /// ([`GgufFile::release_header`]); nothing for an HF directory.
    pub fn release_header(&self) {
        if let ModelFile::Gguf(f) = self {
            f.release_header();
        }
    }

    /// The file holding tensor `name` and the absolute offset of its data there, when `data` (a
    /// matrix's bytes as loaded) are that tensor's bytes in the mapping, not a re-quantized copy:
    /// what reading the tensor from flash directly needs.
    pub(crate) fn tensor_source(&self, name: &str, data: &[u8]) -> Option<(PathBuf, u64)> {
        let view = self.tensor(name)?;
        if view.data.as_ptr() != data.as_ptr() || view.data.len() != data.len() {
            return None;
        }
        let (infos, path) = match self {
            ModelFile::Gguf(f) => (f.tensor_infos(), f.path()),
            ModelFile::Hf(d) => (d.tensor_infos(), d.tensor_file(name)?),
        };
        let info = infos.iter().find(|t| t.name == name)?;
        Some((path.to_path_buf(), info.offset))
    }

    /// The file's `{arch}.*` config keys, for the model's family ([`ConfigKeys`]).
    pub(crate) fn config_keys<'f>(&'f self, arch: &'f str) -> FileKeys<'f> {
        FileKeys { file: self, arch }
    }

    /// The tensor `name` (its logical name), if the file has it.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        match self {
            ModelFile::Gguf(f) => f.tensor(name),
            ModelFile::Hf(d) => d.tensor(name),
        }
    }
}

/// A model file's `{arch}.*` keys ([`ModelFile::config_keys`]): GGUF metadata; none in an HF
/// directory.
pub(crate) struct FileKeys<'f> {
    file: &'f ModelFile,
    arch: &'f str,
}

impl FileKeys<'_> {
    fn get(&self, key: &str) -> Option<&model_format::MetaValue> {
        match self.file {
            ModelFile::Gguf(f) => f.get(&format!("{}.{key}", self.arch)),
            ModelFile::Hf(_) => None,
        }
    }
}

impl ConfigKeys for FileKeys<'_> {
    fn uint(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(|v| v.as_u64())
    }

    fn float(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(|v| v.as_f64())
    }

    fn present(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

/// Tensor names of one format.
pub(crate) struct Names {
    pub(crate) embed: &'static str,
    pub(crate) output: &'static str,
    pub(crate) output_norm: &'static str,
    pub(crate) layer: fn(usize, &str) -> String,
}

/// The tensor naming of `file`.
pub(crate) fn names_of(file: &ModelFile) -> &'static Names {
    match file {
        ModelFile::Gguf(_) => &GGUF_NAMES,
        ModelFile::Hf(_) => &HF_NAMES,
    }
}

const GGUF_NAMES: Names = Names {
    embed: "token_embd.weight",
    output: "output.weight",
    output_norm: "output_norm.weight",
    layer: |i, t| {
        let t = match t {
            "attn_norm" => "attn_norm.weight",
            "q" => "attn_q.weight",
            "k" => "attn_k.weight",
            "v" => "attn_v.weight",
            "q_bias" => "attn_q.bias",
            "k_bias" => "attn_k.bias",
            "v_bias" => "attn_v.bias",
            "q_norm" => "attn_q_norm.weight",
            "k_norm" => "attn_k_norm.weight",
            "o" => "attn_output.weight",
            "post_attention_norm" => "post_attention_norm.weight",
            "ffn_norm" => "ffn_norm.weight",
            "post_ffw_norm" => "post_ffw_norm.weight",
            "gate" => "ffn_gate.weight",
            "up" => "ffn_up.weight",
            "down" => "ffn_down.weight",
            other => other,
        };
        format!("blk.{i}.{t}")
    },
};

const HF_NAMES: Names = Names {
    embed: "model.embed_tokens.weight",
    output: "lm_head.weight",
    output_norm: "model.norm.weight",
    layer: |i, t| {
        let t = match t {
            "attn_norm" => "input_layernorm.weight",
            "q" => "self_attn.q_proj.weight",
            "k" => "self_attn.k_proj.weight",
            "v" => "self_attn.v_proj.weight",
            "q_bias" => "self_attn.q_proj.bias",
            "k_bias" => "self_attn.k_proj.bias",
            "v_bias" => "self_attn.v_proj.bias",
            "q_norm" => "self_attn.q_norm.weight",
            "k_norm" => "self_attn.k_norm.weight",
            "o" => "self_attn.o_proj.weight",
            "ffn_norm" => "post_attention_layernorm.weight",
            "gate" => "mlp.gate_proj.weight",
            "up" => "mlp.up_proj.weight",
            "down" => "mlp.down_proj.weight",
            other => other,
        };
        format!("model.layers.{i}.{t}")
    },
};
