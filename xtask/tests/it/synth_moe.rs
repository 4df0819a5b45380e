//! `cargo xtask synth-model --arch ...` (xtask/src/synth_moe.rs) on tiny shapes: each architecture's
//! file has llama.cpp's keys and tensor shapes, the engine's MoE layer loads from every layer, and
//! bad options are refused (the routing statistics are `synth_routing.rs`'s).

use crate::src::synth_moe;

use std::path::PathBuf;

use engine::moe::{MoeConfig, MoeFamily, MoeLayer};
use model_format::{DType, GgufFile, MetaValue};
use synth_moe::{Arch, Options, Router};

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p =
            std::env::temp_dir().join(format!("sparrow-synth-moe-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tiny(arch: Arch) -> Options {
    Options {
        layers: 2,
        d: 128,
        expert_ff: 64,
        shared_ff: if arch == Arch::Qwen2Moe { 96 } else { 0 },
        heads: 4,
        kv_heads: if matches!(arch, Arch::Olmoe) { 4 } else { 2 },
        head_dim: 32,
        vocab: 300,
        experts: 8,
        used: 2,
        format: DType::Q8_0,
        ..Options::defaults(arch)
    }
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_arch_has_llama_cpp_names_and_loads_in_the_engine() {
    let dir = TempDir::new("arch");
    for arch in [Arch::Qwen3Moe, Arch::Mixtral, Arch::Olmoe, Arch::Qwen2Moe] {
        let o = tiny(arch);
        let path = dir.0.join(o.file_name());
        let mut layers_done = Vec::new();
        synth_moe::write_model(&o, &path, |l, _| layers_done.push(l)).unwrap();
        assert_eq!(layers_done, [0, 1]);
        let f = GgufFile::open(&path).unwrap();
        let a = f
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .unwrap();
        assert_eq!(a, arch.gguf());
        let key = |k: &str| f.get(&format!("{a}.{k}")).and_then(MetaValue::as_u64);
        assert_eq!(
            (key("expert_count"), key("expert_used_count")),
            (Some(8), Some(2))
        );
        let shape = |n: &str| f.tensor(n).map(|t| (t.dtype, t.shape.to_vec()));
        assert_eq!(
            shape("blk.1.ffn_gate_inp.weight"),
            Some((DType::F32, vec![8, 128]))
        );
        assert_eq!(
            shape("blk.1.ffn_gate_exps.weight"),
            Some((DType::Q8_0, vec![8, 64, 128]))
        );
        assert_eq!(
            shape("blk.1.ffn_up_exps.weight"),
            Some((DType::Q8_0, vec![8, 64, 128]))
        );
        assert_eq!(
            shape("blk.1.ffn_down_exps.weight"),
            Some((DType::Q8_0, vec![8, 128, 64]))
        );
        let q_norm = shape("blk.0.attn_q_norm.weight").map(|(_, s)| s);
        match arch {
            Arch::Qwen3Moe => assert_eq!(q_norm, Some(vec![32])),
            Arch::Olmoe => assert_eq!(q_norm, Some(vec![128])),
            _ => assert_eq!(q_norm, None),
        }
        let shared = shape("blk.0.ffn_down_shexp.weight").map(|(_, s)| s);
        let bias = shape("blk.0.attn_k.bias").map(|(_, s)| s);
        if arch == Arch::Qwen2Moe {
            assert_eq!(shared, Some(vec![128, 96]));
            assert_eq!(
                shape("blk.0.ffn_gate_inp_shexp.weight"),
                Some((DType::F32, vec![128]))
            );
            assert_eq!(bias, Some(vec![64]));
        } else {
            assert_eq!((shared, bias), (None, None));
        }
        let has_output = f.tensor("output.weight").is_some();
        assert!(
            has_output,
            "{arch:?}: the real models all have an output projection"
        );
        let cfg = MoeConfig::from_gguf(f.path(), |k| f.get(k))
            .unwrap()
            .unwrap();
        let family = match arch {
            Arch::Qwen3Moe => MoeFamily::Qwen3Moe,
            Arch::Mixtral => MoeFamily::Mixtral,
            Arch::Olmoe => MoeFamily::Olmoe,
            Arch::Qwen2Moe => MoeFamily::Qwen2Moe,
        };
        assert_eq!((cfg.family, cfg.expert_ff), (family, 64));
        for l in 0..2 {
            let layer = MoeLayer::load(&cfg, 128, l, f.path(), &|n| f.tensor(n)).unwrap();
            assert_eq!(layer.n_experts(), 8);
            assert_eq!(layer.shared.is_some(), arch == Arch::Qwen2Moe);
        }
        // The engine loads it as its family, every layer's FFN a Mixture-of-Experts block; the
        // modes built on neuron rows refuse it, naming the file and the mode.
        let file = engine::ModelFile::open(&path).unwrap();
        let model = engine::Model::load(&file).unwrap();
        assert_eq!(model.config.arch.name(), arch.gguf(), "{arch:?}");
        assert_eq!(model.config.moe.map(|m| m.family), Some(family));
        assert!(model
            .layers
            .iter()
            .all(|l| l.ffn.moe().is_some() && l.ffn.gated().is_none()));
        let refused = engine::SparseFfn::new(&model, vec![0.0; 2], engine::WeightFormat::Q8_0)
            .err()
            .expect("sparse refuses an MoE model")
            .to_string();
        assert!(
            refused.contains(&path.display().to_string())
                && refused.contains("--sparse")
                && refused.contains("does not support MoE"),
            "{arch:?}: {refused}"
        );
        assert_eq!(
            std::fs::metadata(&path).unwrap().len() - f.data_offset(),
            o.data_bytes(),
            "{arch:?}: data_bytes is the tensor data"
        );
    }
}

#[test]
fn options_parse_with_real_defaults_and_bad_ones_are_refused() {
    let o = Options::parse(&args(&["--arch", "qwen3moe"])).unwrap();
    assert_eq!(
        (
            o.layers,
            o.d,
            o.experts,
            o.used,
            o.expert_ff,
            o.heads,
            o.kv_heads,
            o.head_dim
        ),
        (48, 2048, 128, 8, 768, 32, 4, 128)
    );
    assert_eq!(o.router, Router::Measured);
    let m = Options::parse(&args(&[
        "--arch=mixtral",
        "--router",
        "uniform",
        "--experts-used=1",
    ]))
    .unwrap();
    assert_eq!(
        (m.layers, m.d, m.expert_ff, m.experts, m.used, m.router),
        (32, 4096, 14336, 8, 1, Router::Uniform)
    );
    let q2 = Options::parse(&args(&[
        "--arch",
        "qwen2moe",
        "--ff",
        "64",
        "--shared-ff",
        "96",
    ]))
    .unwrap();
    assert_eq!(
        (q2.experts, q2.used, q2.expert_ff, q2.shared_ff),
        (60, 4, 64, 96)
    );
    let ol = Options::parse(&args(&["--arch", "olmoe"])).unwrap();
    assert_eq!(
        (ol.layers, ol.experts, ol.used, ol.expert_ff),
        (16, 64, 8, 1024)
    );
    for (bad, says) in [
        (vec!["--arch", "gpt"], "--arch takes"),
        (
            vec!["--arch", "olmoe", "--kv-heads", "4"],
            "--kv-heads must equal --heads",
        ),
        (
            vec![
                "--arch",
                "qwen3moe",
                "--experts",
                "4",
                "--experts-used",
                "5",
            ],
            "--experts-used must be 1..=4",
        ),
        (
            vec!["--arch", "mixtral", "--router", "zipf"],
            "--router takes",
        ),
        (
            vec!["--arch", "mixtral", "--alpha", "1"],
            "unknown option `--alpha`",
        ),
        (vec!["--arch", "qwen2moe", "--d", "1024"], "must equal --d"),
        (
            vec!["--arch", "qwen3moe", "--format", "q4_k_m"],
            "--format takes",
        ),
    ] {
        let e = format!("{:#}", Options::parse(&args(&bad)).unwrap_err());
        assert!(e.contains(says), "{bad:?}: {e}");
    }
}

/// llama.cpp itself loads and runs every architecture's file (tiny shapes). Ignored: CI builds no
/// llama.cpp. By hand, with llama.cpp's programs in `target/llama.cpp/build/bin` (as
/// `cargo xtask capped-bench` builds them): `cargo test -p xtask --test it synth_moe:: -- --ignored`.
/// A missing program fails the test.
#[test]
#[ignore = "needs llama.cpp's llama-completion in target/llama.cpp/build/bin"]
fn every_arch_loads_and_runs_in_llama_cpp() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = root.join("target/llama.cpp/build/bin/llama-completion");
    assert!(
        bin.is_file(),
        "{} is missing: build llama.cpp first",
        bin.display()
    );
    let dir = TempDir::new("llama");
    for arch in [Arch::Qwen3Moe, Arch::Mixtral, Arch::Olmoe, Arch::Qwen2Moe] {
        let o = tiny(arch);
        let path = dir.0.join(o.file_name());
        synth_moe::write_model(&o, &path, |_, _| {}).unwrap();
        let out = std::process::Command::new(&bin)
            .args(["-m"])
            .arg(&path)
            .args([
                "-p", "hi", "-n", "4", "-t", "1", "--temp", "0", "-no-cnv", "-v",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{arch:?}: llama-completion failed:\n{log}"
        );
        let arch_line = format!("arch                  = {}", arch.gguf());
        assert!(
            log.contains(&arch_line),
            "{arch:?}: llama.cpp read another arch:\n{log}"
        );
        assert!(
            log.contains("n_expert              = 8"),
            "{arch:?}: no experts seen:\n{log}"
        );
    }
}
