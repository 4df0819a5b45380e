//! The xtask sources the tests check, included once, side by side as in the xtask binary (whose
//! `synth.rs` reaches `fixtures.rs` and `synth_arch.rs` through `super::`).
#![allow(dead_code)]

#[path = "../../src/bench_report.rs"]
pub mod bench_report;
#[path = "../../src/fixtures.rs"]
pub mod fixtures;
#[path = "../../src/synth.rs"]
pub mod synth;
#[path = "../../src/synth_arch.rs"]
pub mod synth_arch;
#[path = "../../src/synth_moe.rs"]
pub mod synth_moe;
#[path = "../../src/synth_reference.rs"]
pub mod synth_reference;
#[path = "../../src/synth_relu.rs"]
pub mod synth_relu;
#[path = "../../src/synth_routing.rs"]
pub mod synth_routing;

/// `synth_reference.rs` finds llama.cpp's programs through `super::llama::tool`; the tests never
/// run llama.cpp.
pub mod llama {
    pub fn tool(_: &std::path::Path, _: &str) -> anyhow::Result<std::path::PathBuf> {
        anyhow::bail!("the tests do not run llama.cpp")
    }
}
