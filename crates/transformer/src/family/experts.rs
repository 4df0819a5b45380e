//! The Mixture-of-Experts FFN block the MoE families share: the layer's router, experts and shared
//! expert ([`crate::moe::MoeLayer`], llama.cpp's tensor names) and the block of the config's family.

use super::{LayerShape, LayerTensors};
use crate::error::{ModelError, Result};
use crate::layer::LayerFfn;
use crate::moe::{MoeBlock, MoeFfn, MoeLayer};

/// The layer's MoE block (without its experts in a resident file); an error naming the file when the
/// config has no experts.
pub(crate) fn moe_ffn<'a>(t: &dyn LayerTensors<'a>, s: &LayerShape) -> Result<LayerFfn<'a>> {
    let bad = |detail: &str| ModelError::BadModel {
        path: t.path().to_path_buf(),
        detail: detail.to_string(),
    };
    let Some(cfg) = s.moe else {
        return Err(bad(
            "a Mixture-of-Experts architecture without expert_count metadata",
        ));
    };
    // A resident file (`sparrow convert`) keeps the router and shared expert; the experts are in
    // its expert store.
    let load = if s.offloaded {
        MoeLayer::load_resident
    } else {
        MoeLayer::load
    };
    let weights = load(&cfg, s.d_model, t.index(), t.path(), &|n| t.tensor(n))?;
    Ok(LayerFfn::Moe(Box::new(MoeFfn {
        weights,
        block: MoeBlock {
            activation: s.activation,
            ..MoeBlock::for_config(&cfg)
        },
    })))
}
