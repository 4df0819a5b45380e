//! The engine's side of the accelerator plugins (the `accel` crate): the registry of the backends
//! this build has (`cpu` always; `qnn` from `accel-qnn` with the `qnn` cargo feature, which is on by
//! default), opening a backend by [`AccelKind`], and a model's layers made into [`FfnBlock`]s.
//!
//! [`crate::AccelFfn`] (`accel_ffn.rs`) hands whole layers to a backend; [`crate::HybridFfn`]
//! (`hybrid.rs`) hands it each layer's hot neurons and keeps the rest sparse on the CPU. A library
//! that is missing, of another API version, or failing at any step is an error naming the library
//! and the step, and the caller stays on the CPU.

use std::sync::{OnceLock, RwLock};

pub use accel::{
    batch_runs, AccelError, AccelKind, Accelerator, Backend, CpuAccelerator, FfnBlock, FileRows,
    Registry, StreamedRows, BATCH_SIZES,
};
#[cfg(feature = "qnn")]
pub use accel_qnn::{QnnAccelerator, QnnWeights};

use crate::error::{kernel, OffloadError, Result};
use transformer::config::Activation;
use transformer::model::{Layer, Model};

/// The process's backends: this build's, plus any [`register`]ed.
fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::new();
        #[cfg(feature = "qnn")]
        r.register(accel_qnn::backend());
        #[cfg(not(feature = "qnn"))]
        r.left_out(
            "qnn",
            "this build has no QNN backend (build the engine with its `qnn` feature)",
        );
        RwLock::new(r)
    })
}

/// Adds a backend to the ones [`open`] knows (replacing one of the same name): how a program
/// plugs in a backend of its own.
pub fn register(backend: Backend) {
    if let Ok(mut r) = registry().write() {
        r.register(backend);
    }
}

/// The names of the backends [`open`] knows.
pub fn backends() -> Vec<&'static str> {
    registry().read().map(|r| r.names()).unwrap_or_default()
}

/// Opens the backend `kind` over `blocks` (one per layer, taken one at a time so that only one
/// layer's f32 block exists at once). A block that cannot be made fails the opening with its own
/// error.
pub fn open(
    kind: &AccelKind,
    blocks: impl IntoIterator<Item = Result<FfnBlock>>,
) -> Result<Box<dyn Accelerator>> {
    let mut first: Option<OffloadError> = None;
    let opened = {
        let blocks = blocks.into_iter().map(|b| {
            b.map_err(|e| {
                let msg = e.to_string();
                first.get_or_insert(e);
                AccelError::Request(msg)
            })
        });
        let r = registry()
            .read()
            .map_err(|_| OffloadError::Request("the accelerator registry is poisoned".into()))?;
        r.open(kind, blocks)
    };
    match (opened, first) {
        (Ok(a), _) => Ok(a),
        (Err(_), Some(e)) => Err(e),
        (Err(e), None) => Err(e.into()),
    }
}

/// The block of `layer` over `neurons` (neuron indices, in the order the block keeps them), or
/// over every neuron when `None`, dequantized from the model's weights.
pub fn block_from_layer(
    layer: &Layer<'_>,
    neurons: Option<&[u32]>,
    activation: Activation,
) -> Result<FfnBlock> {
    let Some(layer) = layer.ffn.gated() else {
        return Err(OffloadError::Request(
            "an accelerator block needs a gated FFN: accelerators do not support \
             Mixture-of-Experts layers yet"
                .into(),
        ));
    };
    let (ff, d) = (layer.gate.rows(), layer.gate.cols());
    if ff == 0 {
        return Err(OffloadError::Request(
            "an accelerator block needs the FFN weights in memory (this is a resident file)".into(),
        ));
    }
    let all: Vec<u32>;
    let ids = match neurons {
        Some(ids) => ids,
        None => {
            all = (0..ff as u32).collect();
            &all
        }
    };
    if let Some(&bad) = ids.iter().find(|&&j| j as usize >= ff) {
        return Err(OffloadError::Request(format!(
            "accelerator block: neuron {bad} is past the layer's {ff}"
        )));
    }
    let rows = |m: &kernels_neon::QMatrix<'_>, what: &str| -> Result<Vec<f32>> {
        let mut out = vec![0f32; ids.len() * d];
        for (dst, &j) in out.chunks_exact_mut(d).zip(ids) {
            kernels_neon::dequantize_row(m.format(), m.row_data(j as usize), dst)
                .map_err(kernel(what))?;
        }
        Ok(out)
    };
    let raw = |m: &kernels_neon::QMatrix<'_>| -> Vec<u8> {
        ids.iter()
            .flat_map(|&j| m.row_data(j as usize).iter().copied())
            .collect()
    };
    let file_rows = FileRows {
        format: layer.gate.format(),
        gate: raw(&layer.gate),
        up: raw(&layer.up),
    };
    let gate = rows(&layer.gate, "accelerator block gate")?;
    let up = rows(&layer.up, "accelerator block up")?;
    let mut down = vec![0f32; d * ids.len()];
    let mut row = vec![0f32; ff];
    for (r, dst) in down.chunks_exact_mut(ids.len().max(1)).enumerate().take(d) {
        kernels_neon::dequantize_row(layer.down.format(), layer.down.row_data(r), &mut row)
            .map_err(kernel("accelerator block down"))?;
        for (o, &j) in dst.iter_mut().zip(ids) {
            *o = row[j as usize];
        }
    }
    Ok(FfnBlock {
        neurons: ids.len(),
        d_model: d,
        gate,
        up,
        down,
        activation,
        file_rows,
        prefixes: true,
    })
}

/// The block of every layer of `model`, each over `neurons[l]` (or every neuron), made as the
/// iterator is advanced.
pub fn blocks_for_model<'m>(
    model: &'m Model<'_>,
    neurons: Option<&'m [Vec<u32>]>,
) -> impl Iterator<Item = Result<FfnBlock>> + 'm {
    model.layers.iter().enumerate().map(move |(l, layer)| {
        model.refuse_moe("an accelerator (--accel, hybrid)")?;
        block_from_layer(
            layer,
            neurons.map(|n| n[l].as_slice()),
            model.config.activation,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `qnn` is a backend exactly when the `qnn` feature is on; without it, asking for it says so.
    #[test]
    fn qnn_is_a_backend_exactly_with_the_feature() {
        assert_eq!(backends().contains(&"qnn"), cfg!(feature = "qnn"));
        if !cfg!(feature = "qnn") {
            let kind: AccelKind = "qnn-f32:/x/libQnnHtp.so".parse().unwrap();
            let e = open(&kind, std::iter::empty()).err().unwrap().to_string();
            assert!(e.contains("this build has no QNN backend"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// A program's own backend, registered by name, is what `open` gives for that name; a block
    /// that cannot be made fails the opening with the engine's own error.
    #[test]
    fn a_registered_backend_is_opened_by_name() {
        fn open_stub(
            kind: &AccelKind,
            blocks: &mut dyn Iterator<Item = accel::Result<FfnBlock>>,
        ) -> accel::Result<Box<dyn Accelerator>> {
            assert_eq!(kind.variant(), Some("x"));
            Ok(Box::new(CpuAccelerator::new(blocks)?))
        }
        register(Backend {
            name: "stub",
            usage: "stub-x",
            open: open_stub,
        });
        assert!(backends().contains(&"stub"));
        let kind: AccelKind = "stub-x".parse().unwrap();
        assert_eq!(open(&kind, std::iter::empty()).unwrap().name(), "cpu");
        let bad = [Err(OffloadError::BadModel {
            path: "m.gguf".into(),
            detail: "no layers".into(),
        })];
        match open(&kind, bad) {
            Err(OffloadError::BadModel { detail, .. }) => assert_eq!(detail, "no layers"),
            other => panic!("not the block's error: {:?}", other.err()),
        }
    }
}
