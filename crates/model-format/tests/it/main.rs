//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p model-format --test it <name>::`.

mod common;
mod gguf_corrupt;
mod gguf_roundtrip;
mod hf_dir;
mod real_model;
