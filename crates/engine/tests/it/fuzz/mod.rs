//! A stable-Rust fuzzer for the parsers of untrusted files (issue 19, "Fuzzing that runs"): a seeded
//! byte mutator ([`mutator`]), a runner that catches panics and times cases ([`runner`]) and the
//! targets with their seeds ([`targets`]).

pub mod mutator;
pub mod runner;
pub mod targets;
