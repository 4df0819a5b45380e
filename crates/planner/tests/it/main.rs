//! All of this crate's integration tests in one binary (one compile and link instead of one per
//! file): each former `tests/<name>.rs` is the module `<name>` here; run one file's tests with
//! `cargo test -p planner --test it <name>::`.

mod common;
mod costs;
mod experts;
mod files;
mod hybrid;
mod hybrid_store;
mod solve;
mod speculation;
