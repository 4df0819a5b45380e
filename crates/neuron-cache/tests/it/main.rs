//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p neuron-cache --test it <name>::`.

mod concurrent;
mod experts;
mod model;
mod resize;
mod two_queue;
