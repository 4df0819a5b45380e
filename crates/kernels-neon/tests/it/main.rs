//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p kernels-neon --test it <name>::`.

mod attention;
mod attention_block;
mod attention_cache;
mod common;
mod expf;
mod fixed;
mod gguf_fixture;
mod hybrid;
mod known;
mod matmul_int;
mod matmul_t_memory;
mod props;
mod quantize;
mod sparse;
