//! [`PromptAccel`]: the accelerator of an offloaded model's prompt steps (PowerInfer-2's NPU-centric
//! prefill) and its first failure.

use accel::Failure;

use crate::accel::{Accelerator, StreamedRows};

/// The accelerator of an offloaded model's prompt steps: each chunk of a layer, as the reader thread
/// hands it over, runs densely there while the next chunk is read. A failing call records its
/// error, and that chunk and every later one run on the CPU.
pub(crate) struct PromptAccel {
    accel: Box<dyn Accelerator>,
    failure: Failure,
}

impl PromptAccel {
    pub(crate) fn new(accel: Box<dyn Accelerator>) -> PromptAccel {
        PromptAccel {
            accel,
            failure: Failure::default(),
        }
    }

    pub(crate) fn accel(&self) -> &dyn Accelerator {
        &*self.accel
    }

    /// The first failure, if any.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.first()
    }

    /// `out = block(x)` over `rows` on the accelerator: `true` when it ran, `false` when it has
    /// failed (now, recorded, or before), the CPU's to compute.
    pub(crate) fn run(
        &self,
        rows: &StreamedRows<'_>,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> bool {
        if self.failure.happened() {
            return false;
        }
        match self.accel.ffn_rows(rows, x, n, out) {
            Ok(()) => true,
            Err(e) => {
                self.failure.record(&e);
                false
            }
        }
    }
}
