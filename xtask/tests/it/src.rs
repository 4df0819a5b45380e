//! The xtask sources the tests check, included once, side by side as in the xtask binary (whose
//! `synth.rs` reaches `fixtures.rs` through `super::`).
#![allow(dead_code)]

#[path = "../../src/bench_report.rs"]
pub mod bench_report;
#[path = "../../src/fixtures.rs"]
pub mod fixtures;
#[path = "../../src/synth.rs"]
pub mod synth;
#[path = "../../src/synth_moe.rs"]
pub mod synth_moe;
