//! The integration tests of `neuron-store`, one module per topic.

mod experts;
mod store;
