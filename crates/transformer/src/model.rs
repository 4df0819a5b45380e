//! Model weights, borrowed from a memory-mapped GGUF file or HF safetensors directory.

use std::path::{Path, PathBuf};

use kernels_neon::{Precision, QMatrix};
use model_format::TensorView;

use crate::config::ModelConfig;
use crate::error::{kernel, ModelError, Result};
use crate::family::{LayerShape, LayerTensors};
pub use crate::file::ModelFile;
use crate::file::{names_of, Names};
pub use crate::layer::{GatedFfn, Layer, LayerFfn};
use crate::requant::Overlay;

/// A loaded model: configuration plus weights borrowed from a [`ModelFile`].
pub struct Model<'a> {
    /// Hyper-parameters.
    pub config: ModelConfig,
    /// Token embedding, `vocab × d_model`.
    pub embed: QMatrix<'a>,
    /// Blocks.
    pub layers: Vec<Layer<'a>>,
    /// Final RMSNorm weight.
    pub output_norm: Vec<f32>,
    /// Output projection, `vocab × d_model` (the embedding when tied).
    pub output: QMatrix<'a>,
    /// Whether the output projection is the embedding.
    pub tied_embeddings: bool,
    /// The factor every embedding row is multiplied by ([`crate::family::Family::embedding_scale`]).
    pub embed_scale: Option<f32>,
    /// Bytes of weights the model reads per token (all matrices once).
    pub weight_bytes: usize,
    path: PathBuf,
    header_bytes: u64,
    streamed: bool,
    /// Where the output projection's bytes are in the model file (absent when they are a
    /// re-quantized copy): a streamed step reads them from there directly.
    output_source: Option<(PathBuf, u64)>,
    /// The output projection's file, opened for direct reads while streamed.
    output_file: Option<crate::stream_source::StreamSource>,
    /// The output projection's proxy (`sparrow convert` writes it into a resident file,
    /// [`crate::output_proxy`]) and where its bytes are in the file.
    output_proxy: Option<(QMatrix<'a>, Option<(PathBuf, u64)>)>,
    /// Whether a streamed one-token step may use the proxy ([`Model::set_output_proxy`]).
    proxy_on: bool,
    /// Repacked copies for one-token decode on the AVX2 and AVX-512 paths ([`Model::pack_q40x8`]).
    packed: Option<crate::packed::Packed>,
    /// Whether every matrix is a slice of a GGUF file's mapping (no overlay).
    mapped: bool,
}

struct Loader<'f> {
    file: &'f ModelFile,
    overlay: Option<&'f Overlay>,
    path: PathBuf,
}

impl<'f> Loader<'f> {
    fn view(&self, name: &str) -> Result<TensorView<'f>> {
        self.file
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })
    }

    fn shape_err(&self, t: &TensorView<'_>, expected: Vec<usize>) -> ModelError {
        ModelError::TensorShape {
            path: self.path.clone(),
            name: t.name.to_string(),
            found: t.shape.to_vec(),
            expected,
        }
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix<'f>> {
        if let Some(o) = self.overlay.and_then(|o| o.get(name)) {
            if o.rows != rows || o.cols != cols {
                return Err(ModelError::TensorShape {
                    path: self.path.clone(),
                    name: name.to_string(),
                    found: vec![o.rows, o.cols],
                    expected: vec![rows, cols],
                });
            }
            return QMatrix::new(o.format, rows, cols, &o.data).map_err(kernel(format!(
                "{}: re-quantized tensor `{name}`",
                self.path.display()
            )));
        }
        let t = self.view(name)?;
        if t.shape.len() != 2 || t.shape[0] != rows || t.shape[1] != cols {
            return Err(self.shape_err(&t, vec![rows, cols]));
        }
        QMatrix::new(t.dtype, rows, cols, t.data)
            .map_err(kernel(format!("{}: tensor `{name}`", self.path.display())))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let t = self.view(name)?;
        if t.n_elements() != len || t.shape.len() != 1 {
            return Err(self.shape_err(&t, vec![len]));
        }
        let mut out = vec![0.0f32; len];
        kernels_neon::dequantize_row(t.dtype, t.data, &mut out)
            .map_err(kernel(format!("{}: tensor `{name}`", self.path.display())))?;
        Ok(out)
    }

    fn optional_vector(&self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.file.tensor(name).is_some() {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// The tensors of one layer, by logical key, for the model's family.
struct LayerLoader<'l, 'f> {
    ld: &'l Loader<'f>,
    names: &'static Names,
    index: usize,
}

impl<'f> LayerTensors<'f> for LayerLoader<'_, 'f> {
    fn matrix(&self, key: &str, rows: usize, cols: usize) -> Result<QMatrix<'f>> {
        self.ld
            .matrix(&(self.names.layer)(self.index, key), rows, cols)
    }

    fn vector(&self, key: &str, len: usize) -> Result<Vec<f32>> {
        self.ld.vector(&(self.names.layer)(self.index, key), len)
    }

    fn optional_vector(&self, key: &str, len: usize) -> Result<Option<Vec<f32>>> {
        self.ld
            .optional_vector(&(self.names.layer)(self.index, key), len)
    }

    fn tensor(&self, name: &str) -> Option<TensorView<'f>> {
        self.ld.file.tensor(name)
    }

    fn index(&self) -> usize {
        self.index
    }

    fn path(&self) -> &Path {
        &self.ld.path
    }
}

impl<'a> Model<'a> {
    /// Loads (borrows) every weight of `file`, checking names and shapes against its configuration.
    pub fn load(file: &'a ModelFile) -> Result<Model<'a>> {
        Self::load_with(file, None)
    }

    /// [`load`](Self::load), taking each matrix the `overlay` holds (re-quantized at load time,
    /// see [`crate::requant`]) from it instead of the file.
    pub fn load_with(file: &'a ModelFile, overlay: Option<&'a Overlay>) -> Result<Model<'a>> {
        let config = file.config()?;
        let names = names_of(file);
        let ld = Loader {
            file,
            overlay,
            path: file.path().to_path_buf(),
        };
        let (d, v, ff, q, kv) = (
            config.d_model,
            config.vocab_size,
            config.d_ff,
            config.q_dim(),
            config.kv_dim(),
        );
        let embed = ld.matrix(names.embed, v, d)?;
        let (output, tied) = if file.tensor(names.output).is_some() {
            (ld.matrix(names.output, v, d)?, false)
        } else if matches!(file, ModelFile::Hf(h) if h.config().tie_word_embeddings == Some(false))
            || config.moe.is_some_and(|m| m.family.output_required())
        {
            // (llama.cpp requires `output.weight` of olmoe and qwen2moe files too.)
            // An HF model that says its output is not the embedding must ship it.
            return Err(ModelError::MissingTensor {
                path: file.path().to_path_buf(),
                name: names.output.to_string(),
            });
        } else {
            (embed, true)
        };
        let output_name = if tied { names.embed } else { names.output };
        let output_source = file.tensor_source(output_name, output.data());
        let output_norm = ld.vector(names.output_norm, d)?;
        let proxy_name = crate::output_proxy::OUTPUT_PROXY_TENSOR;
        let output_proxy = match file.tensor(proxy_name) {
            Some(_) => {
                let proxy = ld.matrix(proxy_name, v, crate::output_proxy::proxy_cols(d))?;
                Some((proxy, file.tensor_source(proxy_name, proxy.data())))
            }
            None => None,
        };
        // A resident file (`sparrow convert`) has no FFN tensors: they are read from its neuron store.
        let shape = LayerShape {
            d_model: d,
            q_dim: q,
            kv_dim: kv,
            head_dim: config.head_dim,
            d_ff: ff,
            offloaded: config.ffn_store.is_some(),
            moe: config.moe,
            activation: config.activation,
        };
        let family = config.arch.family();
        let keys = file.config_keys(config.arch.name());
        let bad_key = |detail: String| ModelError::BadModel {
            path: file.path().to_path_buf(),
            detail,
        };
        family.check_keys(&keys).map_err(bad_key)?;
        let mut layers = Vec::with_capacity(config.n_layers);
        for i in 0..config.n_layers {
            let tensors = LayerLoader {
                ld: &ld,
                names,
                index: i,
            };
            let span = family
                .attn_span(&keys, config.rope_base, i)
                .map_err(bad_key)?;
            layers.push(crate::family::load_layer(
                config.arch,
                &tensors,
                &shape,
                span,
            )?);
        }
        let embed_scale = family.embedding_scale(config.d_model);
        let bytes = |m: &QMatrix<'_>| m.format().row_bytes(m.cols()).unwrap_or(0) * m.rows();
        let weight_bytes = layers
            .iter()
            .map(|l| {
                let ffn = match &l.ffn {
                    LayerFfn::Gated(f) => [&f.gate, &f.up, &f.down].into_iter().map(bytes).sum(),
                    // A token reads the router, its experts and the shared expert.
                    LayerFfn::Moe(m) => m.bytes_per_token(),
                };
                ffn + [&l.wq, &l.wk, &l.wv, &l.wo]
                    .into_iter()
                    .map(bytes)
                    .sum::<usize>()
            })
            .sum::<usize>()
            + bytes(&output);
        Ok(Model {
            config,
            embed,
            layers,
            output_norm,
            output,
            tied_embeddings: tied,
            embed_scale,
            streamed: false,
            output_source,
            output_file: None,
            output_proxy,
            proxy_on: true,
            packed: None,
            mapped: overlay.is_none() && matches!(file, ModelFile::Gguf(_)),
            weight_bytes,
            path: ld.path,
            header_bytes: file.header_bytes(),
        })
    }

    /// The file or directory the weights come from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `Ok` for a dense model; for a Mixture-of-Experts one, an error naming the file and saying
    /// that `mode` (a mode built on neuron rows: `--sparse`, `convert`, `profile`, ...) does not
    /// support MoE yet.
    pub fn refuse_moe(&self, mode: &str) -> Result<()> {
        match &self.config.moe {
            None => Ok(()),
            Some(_) => Err(crate::moe::unsupported(
                &self.path,
                self.config.arch.name(),
                mode,
            )),
        }
    }

    /// Layer `l`'s gated FFN matrices, for `mode`; a Mixture-of-Experts model is refused as
    /// [`Model::refuse_moe`] says.
    pub fn gated_ffn(&self, l: usize, mode: &str) -> Result<&GatedFfn<'a>> {
        self.layers
            .get(l)
            .and_then(|layer| layer.ffn.gated())
            .ok_or_else(|| crate::moe::unsupported(&self.path, self.config.arch.name(), mode))
    }

    /// Makes the repacked copies of [`crate::packed`] (the FFN's too where `ffn`: a dense FFN or experts in
    /// memory) when they apply to `precision` ([`crate::packed::applies`]); returns the matrices
    /// repacked and their bytes. Nothing where they do not apply or the model is streamed.
    pub fn pack_q40x8(&mut self, precision: Precision, ffn: bool) -> (usize, usize) {
        self.packed = None;
        if !crate::packed::applies(precision) || self.streamed {
            return (0, 0);
        }
        let p = crate::packed::Packed::new(&self.layers, &self.output, ffn, self.mapped);
        let done = (p.count(), p.bytes());
        self.packed = (done.0 > 0).then_some(p);
        done
    }

    /// At most the bytes [`Model::pack_q40x8`] would make now (0 where the copies do not apply).
    pub fn q40x8_planned_bytes(&self, precision: Precision, ffn: bool) -> usize {
        if !crate::packed::applies(precision) || self.streamed {
            return 0;
        }
        crate::packed::Packed::planned_bytes(&self.layers, &self.output, ffn)
    }

    /// The repacked copies a one-token step in `precision` takes, if any.
    pub fn packed(&self, precision: Precision) -> Option<&crate::packed::Packed> {
        self.packed
            .as_ref()
            .filter(|_| precision == Precision::Fast)
    }

    /// Bytes of the repacked copies held ([`Model::pack_q40x8`]).
    pub fn packed_bytes(&self) -> usize {
        self.packed.as_ref().map_or(0, crate::packed::Packed::bytes)
    }

    /// Bytes of the model file before its tensor data ([`ModelFile::header_bytes`]), whose pages
    /// the engine hands back once loaded: what a memory budget leaves out of the file's size.
    pub fn header_bytes(&self) -> u64 {
        self.header_bytes
    }

    /// Leaves the embedding and the output projection on flash (`on`: [`crate::stream`]) or pages
    /// them as any mapping (the default).
    pub fn set_streamed(&mut self, on: bool) {
        self.streamed = on;
        if let (true, Some(p)) = (on, self.packed.as_mut()) {
            // A streamed output projection is read from flash, not from a copy in memory.
            p.output = None;
        }
        // The output projection is read with direct I/O into the step's own buffers where the file
        // allows it (no page cache, no page faults); through the mapping otherwise.
        self.output_file = match (&self.output_source, on) {
            (Some((path, offset)), true) => crate::stream_source::StreamSource::open(path, *offset),
            _ => None,
        };
        // A token reads one row: no read-ahead around it while streamed.
        use model_format::{advise, Paging};
        advise(
            self.embed.data(),
            if on { Paging::Random } else { Paging::Normal },
        );
    }

    /// Streams as [`Model::set_streamed`] does, but reads the output projection (and its proxy's
    /// candidate rows) through the mapping, as where the filesystem refuses direct I/O: for tests of
    /// that path on filesystems that take direct I/O.
    #[doc(hidden)]
    pub fn set_streamed_mapped(&mut self) {
        self.set_streamed(true);
        self.output_file = None;
    }

    /// Whether the embedding and output projection stream from flash ([`Model::set_streamed`]).
    pub fn streamed(&self) -> bool {
        self.streamed
    }

    /// The output projection's file for direct reads, while streamed (else, or where the file
    /// cannot be opened so, `None`: the step pages the mapping).
    pub(crate) fn output_file(&self) -> Option<&crate::stream_source::StreamSource> {
        self.output_file.as_ref()
    }

    /// Whether a streamed step reads the output projection with direct I/O (else through the
    /// mapping: not streamed, a re-quantized output, or a filesystem without direct I/O).
    pub fn output_direct(&self) -> bool {
        self.output_file.is_some()
    }

    /// The output projection's proxy, when the file has one ([`crate::output_proxy`]).
    pub fn output_proxy(&self) -> Option<&QMatrix<'a>> {
        self.output_proxy.as_ref().map(|(p, _)| p)
    }

    /// Lets streamed one-token steps use the output proxy (`on`, the default where the file has
    /// one) or read the whole output projection (`sparrow ... --full-output`).
    pub fn set_output_proxy(&mut self, on: bool) {
        self.proxy_on = on;
    }

    /// Whether the file has a proxy and it is not turned off (what the planner counts a streamed
    /// output by).
    pub fn output_proxy_enabled(&self) -> bool {
        self.proxy_on && self.output_proxy.is_some()
    }

    /// Whether a one-token step computes its logits through the proxy: streamed, a proxy in the
    /// file, not turned off.
    pub fn output_proxy_used(&self) -> bool {
        self.streamed && self.output_proxy_enabled()
    }

    /// Where the proxy's bytes start in the file the output is read from directly (`None`: read
    /// through the mapping).
    pub(crate) fn proxy_offset(&self) -> Option<u64> {
        let (_, source) = self.output_proxy.as_ref()?;
        let (path, offset) = source.as_ref()?;
        let (out_path, _) = self.output_source.as_ref()?;
        (path == out_path).then_some(*offset)
    }

    /// Bytes [`Model::set_streamed`] takes out of memory: the embedding and the output projection
    /// (once when tied).
    pub fn streamed_bytes(&self) -> u64 {
        let e = self.embed.data().len() as u64;
        if self.tied_embeddings {
            e
        } else {
            e + self.output.data().len() as u64
        }
    }

    /// Writes the embedding of `token` into `out` (length `d_model`), times the family's
    /// embedding scale where it has one.
    pub fn embed_token(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let t = token as usize;
        if t >= self.config.vocab_size {
            return Err(ModelError::Request(format!(
                "token id {token} is outside the vocabulary ({})",
                self.config.vocab_size
            )));
        }
        kernels_neon::dequantize_row(self.embed.format(), self.embed.row_data(t), out)
            .map_err(kernel("embedding"))?;
        if let Some(s) = self.embed_scale {
            out.iter_mut().for_each(|x| *x *= s);
        }
        Ok(())
    }
}
