//! [`Chunk`]: the gate, up and down rows of some of a layer's units, gathered from the units' bytes
//! into three matrices (what a prompt step computes a chunk from, and what an accelerator's block
//! over the store is made of).

use neuron_store::StoreIndex;

/// The gate, up and down rows of one chunk's neurons, gathered from its units back to back (each
/// part a row-major matrix in its store format), and the neuron id of each row.
#[derive(Default)]
pub(super) struct Chunk {
    pub(super) ids: Vec<u32>,
    pub(super) gate: Vec<u8>,
    pub(super) up: Vec<u8>,
    pub(super) down: Vec<u8>,
}

impl Chunk {
    /// Gathers the neurons of `units` (each a unit's index and its bytes) of `layer`.
    pub(super) fn gather(&mut self, ix: &StoreIndex, layer: usize, units: &[(usize, &[u8])]) {
        let l = ix.layout;
        self.ids.clear();
        self.gate.clear();
        self.up.clear();
        self.down.clear();
        for &(u, bytes) in units {
            let ids = ix.neurons_of(layer, u);
            let k = ids.len();
            self.ids.extend_from_slice(ids);
            let (g, up, d) = (l.gate_range(), l.up_range(), l.down_range());
            self.gate
                .extend_from_slice(&bytes[g.start..g.start + k * l.gate_row]);
            self.up
                .extend_from_slice(&bytes[up.start..up.start + k * l.up_row]);
            self.down
                .extend_from_slice(&bytes[d.start..d.start + k * l.down_row]);
        }
    }
}
