//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p xtask --test it <name>::`.

/// The xtask sources under test (`src.rs`).
mod src;

mod bench_report;
mod doc_links;
mod fixtures;
mod layering;
mod moe_offload;
mod moe_reference;
mod qwen3_reference;
mod qwen3_synth;
mod relu_experts;
mod synth;
mod synth_moe;
mod synth_relu;
mod synth_routing;
mod tidy;
