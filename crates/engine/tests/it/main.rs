//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p engine --test it <name>::`.

// The accelerator tests run QNN through the test double: they need the `qnn` feature (default).
#[cfg(feature = "qnn")]
mod accel;
mod bench;
mod best_of;
mod builder;
mod bundle;
mod common;
mod convert_faults;
mod formats;
mod fuzz;
mod fuzz_round;
mod gguf_python;
mod hostile_config;
mod kv_cache;
mod manifest;
mod module_cycles;
mod moe_block;
mod offload;
mod offload_real;
mod q40x8;
mod reference;
mod reference_gemma;
mod reference_qwen;
mod requant;
mod sparse;
mod speculate;
mod speculate_exec;
mod stream;
mod tiny_models;
mod tokenize_bpe;
mod tokenize_gemma;
