//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p sparrow --test it <name>::`.

mod accel;
mod anywhere;
mod bundle_misuse;
mod cli;
mod cli_docs;
mod live_budget;
mod misuse;
mod moe;
mod openai_client;
mod plan;
mod serve;
mod serve_abuse;
mod support;
