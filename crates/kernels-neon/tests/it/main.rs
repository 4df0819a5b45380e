//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p kernels-neon --test it <name>::`. `matmul_t_memory` stays a binary of its own: its
//! counting global allocator must see no other test's allocations.

mod attention;
mod attention_block;
mod attention_cache;
mod attention_span;
mod common;
mod experts;
mod experts_packed;
mod expf;
mod fast_decode;
mod fixed;
mod format_paths;
mod gelu;
mod ggml;
mod gguf_fixture;
mod half_acts;
mod hybrid;
mod known;
mod known_ops;
mod matmul_int;
mod props;
mod props_q40x8;
mod q40_512;
mod quantize;
mod sparse;
