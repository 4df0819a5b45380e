//! The weights of one transformer block, as a model family fills them ([`crate::family`]), and the
//! two seams the generic forward pass calls through: the attention step between the q/k/v
//! projections and RoPE ([`AttnStep`]), and the FFN block ([`LayerFfn`]). A leaf: it knows no
//! family and no forward pass (the MoE variant's weights are [`crate::moe`]'s).

use kernels_neon::QMatrix;

use crate::moe::MoeFfn;

/// Weights of one transformer block.
pub struct Layer<'a> {
    /// RMSNorm weight before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection, `q_dim × d_model`.
    pub wq: QMatrix<'a>,
    /// Key projection, `kv_dim × d_model`.
    pub wk: QMatrix<'a>,
    /// Value projection, `kv_dim × d_model`.
    pub wv: QMatrix<'a>,
    /// Output projection, `d_model × q_dim`.
    pub wo: QMatrix<'a>,
    /// What the family does to q, k and v between the projections and RoPE (biases, per-head
    /// norms, nothing).
    pub attn_step: Box<dyn AttnStep>,
    /// RMSNorm weight before the FFN.
    pub ffn_norm: Vec<f32>,
    /// The FFN block.
    pub ffn: LayerFfn<'a>,
    /// RMSNorms of the attention output and of the FFN output before each residual add (Gemma's
    /// `post_attention_norm`, `post_ffw_norm`); none in most families.
    pub post_norms: PostNorms,
    /// Which cached positions the layer's queries see, and its RoPE base.
    pub span: AttnSpan,
}

/// RMSNorm weights (`d_model`) applied to a block's output before it is added to the residual
/// stream; `None`: the output is added as it is.
#[derive(Debug, Clone, Default)]
pub struct PostNorms {
    /// After the attention output projection.
    pub attn: Option<Vec<f32>>,
    /// After the FFN.
    pub ffn: Option<Vec<f32>>,
}

/// A layer's attention reach and rotation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnSpan {
    /// Sliding window: a query at position `p` sees the positions `p0` with `p - p0 < window`
    /// (and `p0 <= p`); `None`: every position up to its own.
    pub window: Option<usize>,
    /// RoPE frequency base of the layer.
    pub rope_base: f32,
}

impl AttnSpan {
    /// The first position a query at `pos` sees.
    pub fn first_seen(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// The head layout of a model, as an [`AttnStep`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct HeadShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Dimension of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon of the model.
    pub rms_eps: f32,
}

impl HeadShape {
    /// Query width: `n_heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Key/value width: `n_kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// A family's attention variant: what happens to the projected q, k and v rows of a step's tokens
/// (`q`: `n × q_dim`, `k` and `v`: `n × kv_dim`) before RoPE rotates q and k and the keys and values
/// go to the cache. Runs on one thread; a decode step's rows are few.
pub trait AttnStep: Send + Sync {
    /// Transforms the rows in place.
    fn before_rope(&self, q: &mut [f32], k: &mut [f32], v: &mut [f32], heads: &HeadShape);
}

/// The FFN block of a layer. The generic forward pass hands it to
/// `crate::ffn::layer_step`, which dispatches on the variant: a gated block runs through the
/// step's [`crate::FfnExecutor`] (dense, sparse, offloaded, accelerated, hybrid).
///
/// The seam for other blocks: a family fills a variant from its module, and the variant has its
/// arm in `crate::ffn::layer_step`; the forward pass does not change. The Mixture-of-Experts
/// variant ([`LayerFfn::Moe`]: router `ffn_gate_inp`, 3-D expert tensors `ffn_{gate,up,down}_exps`,
/// optional shared expert) runs on the calling thread with the dense kernels, whatever the step's
/// executor. The paths built on neuron rows (profiles, predictors, neuron stores, accelerator
/// blocks, the planner) read [`LayerFfn::gated`], which is `None` for it: they refuse an MoE model.
pub enum LayerFfn<'a> {
    /// `down(act(gate · x) ⊙ (up · x))`.
    Gated(GatedFfn<'a>),
    /// A Mixture-of-Experts block ([`crate::moe`]).
    Moe(Box<MoeFfn<'a>>),
}

impl<'a> LayerFfn<'a> {
    /// The gated block's matrices; `None` for a Mixture-of-Experts block.
    pub fn gated(&self) -> Option<&GatedFfn<'a>> {
        match self {
            LayerFfn::Gated(g) => Some(g),
            LayerFfn::Moe(_) => None,
        }
    }

    /// The Mixture-of-Experts block; `None` for a gated one.
    pub fn moe(&self) -> Option<&MoeFfn<'a>> {
        match self {
            LayerFfn::Moe(m) => Some(m),
            LayerFfn::Gated(_) => None,
        }
    }
}

/// The matrices of a gated FFN (row `i` of gate and up, column `i` of down = neuron `i`). Empty
/// (0 × 0) in a resident file, whose FFN lives in a neuron store ([`crate::config::FfnStoreRef`]).
#[derive(Clone, Copy)]
pub struct GatedFfn<'a> {
    /// Gate projection, `d_ff × d_model`.
    pub gate: QMatrix<'a>,
    /// Up projection, `d_ff × d_model`.
    pub up: QMatrix<'a>,
    /// Down projection, `d_model × d_ff`.
    pub down: QMatrix<'a>,
}
