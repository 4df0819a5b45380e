//! The weights of one Mixture-of-Experts FFN layer, borrowed from the model file: the router, every
//! expert's gate, up and down matrices (each a row range of llama.cpp's 3-D `*_exps` tensors, so an
//! expert is one contiguous block of each: the unit a store of experts reads), and the optional
//! shared expert and its gate.

use std::path::Path;

use kernels_neon::QMatrix;
use model_format::TensorView;

use super::family::MoeConfig;
use crate::error::{kernel, ModelError, Result};

/// One expert's gated FFN: `gate` and `up` are `ff × d`, `down` is `d × ff`.
#[derive(Debug, Clone, Copy)]
pub struct ExpertFfn<'w> {
    /// Gate rows.
    pub gate: QMatrix<'w>,
    /// Up rows.
    pub up: QMatrix<'w>,
    /// Down rows.
    pub down: QMatrix<'w>,
}

/// The shared expert of a layer (qwen2moe) and its gate: every token's output gets
/// `sigmoid(gate_inp · x) * ffn(x)` (always 1 when `gate_inp` is `None`).
#[derive(Debug, Clone)]
pub struct SharedExpert<'w> {
    /// The shared expert's gated FFN.
    pub ffn: ExpertFfn<'w>,
    /// `ffn_gate_inp_shexp`, one weight per input feature.
    pub gate_inp: Option<Vec<f32>>,
}

/// The FFN weights of one MoE layer.
#[derive(Debug, Clone)]
pub struct MoeLayer<'w> {
    /// `n_experts × d`: one logit per expert.
    pub router: QMatrix<'w>,
    /// Every expert, in order.
    pub experts: Vec<ExpertFfn<'w>>,
    /// The shared expert, if the family has one.
    pub shared: Option<SharedExpert<'w>>,
}

impl<'w> MoeLayer<'w> {
    /// Loads layer `layer` (llama.cpp's names `blk.N.ffn_gate_inp`, `blk.N.ffn_{gate,up,down}_exps`,
    /// `blk.N.ffn_{gate,up,down}_shexp`, `blk.N.ffn_gate_inp_shexp`) through `get`, checking every
    /// shape against `cfg` and the hidden size `d`; errors name the file `path` and the tensor.
    pub fn load(
        cfg: &MoeConfig,
        d: usize,
        layer: usize,
        path: &Path,
        get: &dyn Fn(&str) -> Option<TensorView<'w>>,
    ) -> Result<MoeLayer<'w>> {
        Self::load_parts(cfg, d, layer, path, get, true)
    }

    /// Gate, up and down of every expert in order, then of the shared expert: the matrices whose
    /// copies [`crate::packed`] makes for the layer.
    pub fn expert_matrices(&self) -> impl Iterator<Item = &QMatrix<'w>> {
        let shared = self.shared.as_ref().map(|s| &s.ffn);
        let experts = self.experts.iter().chain(shared);
        experts.flat_map(|f| [&f.gate, &f.up, &f.down])
    }

    fn load_parts(
        cfg: &MoeConfig,
        d: usize,
        layer: usize,
        path: &Path,
        get: &dyn Fn(&str) -> Option<TensorView<'w>>,
        with_experts: bool,
    ) -> Result<MoeLayer<'w>> {
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        let view = |n: &str| {
            get(n).ok_or_else(|| ModelError::MissingTensor {
                path: path.to_path_buf(),
                name: n.to_string(),
            })
        };
        let router = matrix(path, view(&name("ffn_gate_inp"))?, &[cfg.n_experts, d])?;
        let experts = if with_experts {
            Self::experts(cfg, d, path, &|n| view(&name(n)))?
        } else {
            Vec::new()
        };
        let shared = match cfg.shared_ff {
            None => None,
            Some(sff) => {
                let ffn = ExpertFfn {
                    gate: matrix(path, view(&name("ffn_gate_shexp"))?, &[sff, d])?,
                    up: matrix(path, view(&name("ffn_up_shexp"))?, &[sff, d])?,
                    down: matrix(path, view(&name("ffn_down_shexp"))?, &[d, sff])?,
                };
                // Required, as llama.cpp requires it for qwen2moe.
                let gate_inp = Some(vector(path, view(&name("ffn_gate_inp_shexp"))?, d)?);
                Some(SharedExpert { ffn, gate_inp })
            }
        };
        Ok(MoeLayer {
            router,
            experts,
            shared,
        })
    }

    /// Every expert of a layer, as row ranges of its 3-D tensors (`view("ffn_gate_exps")`, ...).
    fn experts(
        cfg: &MoeConfig,
        d: usize,
        path: &Path,
        view: &dyn Fn(&str) -> Result<TensorView<'w>>,
    ) -> Result<Vec<ExpertFfn<'w>>> {
        let (e, ff) = (cfg.n_experts, cfg.expert_ff);
        let gate = view("ffn_gate_exps")?;
        let up = view("ffn_up_exps")?;
        let down = view("ffn_down_exps")?;
        check_shape(path, &gate, &[e, ff, d])?;
        check_shape(path, &up, &[e, ff, d])?;
        check_shape(path, &down, &[e, d, ff])?;
        (0..e)
            .map(|x| {
                let slice = |t: &TensorView<'w>, rows, cols| {
                    let s = t
                        .outer_slice(x)
                        .ok_or_else(|| shape_err(path, t, &[e, rows, cols]))?;
                    matrix(path, s, &[rows, cols])
                };
                Ok(ExpertFfn {
                    gate: slice(&gate, ff, d)?,
                    up: slice(&up, ff, d)?,
                    down: slice(&down, d, ff)?,
                })
            })
            .collect::<Result<Vec<_>>>()
    }

    /// Loads layer `layer` of a resident file (`sparrow convert` of an MoE model): the router and
    /// the shared expert as [`MoeLayer::load`] does, no experts (they are in the expert store).
    pub fn load_resident(
        cfg: &MoeConfig,
        d: usize,
        layer: usize,
        path: &Path,
        get: &dyn Fn(&str) -> Option<TensorView<'w>>,
    ) -> Result<MoeLayer<'w>> {
        Self::load_parts(cfg, d, layer, path, get, false)
    }

    /// Experts of the layer (the router's rows: a resident file's layer holds none in memory).
    pub fn n_experts(&self) -> usize {
        self.router.rows()
    }
}

fn shape_err(path: &Path, t: &TensorView<'_>, expected: &[usize]) -> ModelError {
    ModelError::TensorShape {
        path: path.to_path_buf(),
        name: t.name.to_string(),
        found: t.shape.to_vec(),
        expected: expected.to_vec(),
    }
}

fn check_shape(path: &Path, t: &TensorView<'_>, expected: &[usize]) -> Result<()> {
    if t.shape != expected {
        return Err(shape_err(path, t, expected));
    }
    Ok(())
}

/// `t` as a `rows × cols` matrix (`expected = [rows, cols]`).
fn matrix<'w>(path: &Path, t: TensorView<'w>, expected: &[usize; 2]) -> Result<QMatrix<'w>> {
    check_shape(path, &t, expected)?;
    QMatrix::new(t.dtype, expected[0], expected[1], t.data).map_err(kernel(format!(
        "{}: tensor `{}`",
        path.display(),
        t.name
    )))
}

/// The 1-D tensor `t` of `len` elements, dequantized.
fn vector(path: &Path, t: TensorView<'_>, len: usize) -> Result<Vec<f32>> {
    check_shape(path, &t, &[len])?;
    let mut out = vec![0.0f32; len];
    kernels_neon::dequantize_row(t.dtype, t.data, &mut out).map_err(kernel(format!(
        "{}: tensor `{}`",
        path.display(),
        t.name
    )))?;
    Ok(out)
}
