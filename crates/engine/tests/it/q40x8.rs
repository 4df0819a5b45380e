//! The repacked copies of one-token decode ([`Engine::pack_q40x8`]: Q4_0 and Q8_0 on the AVX2 and
//! AVX-512 paths and on the aarch64 ones with `dotprod`, in `Fast`): a prompt (fewer than 32
//! tokens: on x86 over the copies too, as its MoE expert groups of a few tokens) and then decode
//! steps give bit for bit the logits of an engine without them. Repacks only where the active
//! path is one of those (on an AVX-512 machine both x86 paths, as under `SPARROW_KERNELS=avx2
//! cargo test -p engine --test it -- q40x8`; on aarch64 under qemu as `cargo test --target
//! aarch64-unknown-linux-gnu -p engine --test it -- q40x8`); elsewhere it checks that nothing is
//! repacked.

use engine::{Engine, EngineOptions, Logits, ModelFile, Precision};
use kernels_neon::{active_path, KernelPath};

/// The bits of the logits of a 3-token prompt and then 5 decode steps.
fn logit_bits(eng: &Engine<'_>) -> Vec<u32> {
    let mut cache = eng.new_cache();
    let mut out = eng.forward(&mut cache, &[1, 2, 3], Logits::Last).unwrap();
    for t in [4, 5, 6, 7, 8] {
        out.extend(eng.forward(&mut cache, &[t], Logits::Last).unwrap());
    }
    out.iter().map(|v| v.to_bits()).collect()
}

/// Decodes `path` with and without the copies: the logits must be bit for bit the same, and where
/// the copies apply, `x86(model)` matrices repacked on the x86 paths and `arm(model)` on aarch64's
/// with `dotprod` (their bytes counted by the model).
fn repacked_gives_the_same_logits(
    path: &std::path::Path,
    x86: impl Fn(&engine::Model) -> usize,
    arm: impl Fn(&engine::Model) -> usize,
) {
    let file = ModelFile::open(path).unwrap();
    let opts = EngineOptions {
        threads: 2,
        precision: Precision::Fast,
        context: 16,
        ..Default::default()
    };
    let plain = Engine::new(&file, opts.clone()).unwrap();
    let want = logit_bits(&plain);
    let mut packed = Engine::new(&file, opts).unwrap();
    let (n, bytes) = packed.pack_q40x8(true);
    assert_eq!(bytes, packed.model().packed_bytes());
    let expected = match active_path() {
        KernelPath::Avx2Fma | KernelPath::Avx512 => x86(packed.model()),
        KernelPath::NeonDotprod | KernelPath::NeonI8mm => arm(packed.model()),
        _ => 0,
    };
    if expected > 0 && std::env::var("SPARROW_Q40X8").is_err() {
        assert_eq!(n, expected, "matrices repacked");
        assert!(bytes > 0 && bytes <= packed.q40x8_planned_bytes(true));
    } else {
        assert_eq!((n, bytes), (0, 0));
    }
    assert!(
        logit_bits(&packed) == want,
        "repacked decode changed the logits"
    );
}

#[test]
fn q40x8_repacked_decode_gives_the_same_logits() {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-llama-silu-q4_0.gguf");
    // q, k, v, o, gate, up and down of every layer (the fixture's output projection has a
    // vocabulary of rows not a multiple of 8), on both.
    let every = |m: &engine::Model| 7 * m.config.n_layers;
    repacked_gives_the_same_logits(&path, every, every);
}

/// The tiny qwen3moe fixture with its experts (`ffn_*_exps`) re-quantized to Q4_0, written to
/// `out`; every other tensor as it is (Q8_0: copied too).
fn moe_with_q4_0_experts(out: &std::path::Path) {
    use kernels_neon::{dequantize_row, quantize_row};
    use model_format::{DType, GgufFile, GgufWriter};
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny-qwen3moe-q8_0.gguf");
    let gguf = GgufFile::open(&src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in gguf.metadata() {
        if k != "general.alignment" {
            w.metadata(k, v.clone());
        }
    }
    w.alignment(gguf.alignment());
    for t in gguf.tensors() {
        if !t.name.ends_with("_exps.weight") {
            w.tensor(t.name, t.dtype, t.shape, t.data.to_vec()).unwrap();
            continue;
        }
        let cols = *t.shape.last().unwrap();
        let (src_rb, dst_rb) = (
            t.dtype.row_bytes(cols).unwrap(),
            DType::Q4_0.row_bytes(cols).unwrap(),
        );
        let mut row = vec![0f32; cols];
        let mut q = Vec::new();
        for r in t.data.chunks_exact(src_rb) {
            dequantize_row(t.dtype, r, &mut row).unwrap();
            let mut dst = vec![0u8; dst_rb];
            quantize_row(DType::Q4_0, &row, &mut dst).unwrap();
            q.extend(dst);
        }
        w.tensor(t.name, DType::Q4_0, t.shape, q).unwrap();
    }
    w.write(out).unwrap();
}

#[test]
fn moe_experts_repacked_decode_gives_the_same_logits() {
    let dir = std::env::temp_dir().join(format!("sparrow-q40x8-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("moe-q4_0.gguf");
    moe_with_q4_0_experts(&path);
    // Gate, up and down of every expert of every layer, and the Q8_0 q, k, v and o of every layer
    // (the router is F32; the output's 258 rows are no multiple of 8).
    let copies = |m: &engine::Model| {
        let n = m.config.moe.as_ref().expect("an MoE model").n_experts;
        3 * n * m.config.n_layers + 4 * m.config.n_layers
    };
    let run = std::panic::catch_unwind(|| repacked_gives_the_same_logits(&path, copies, copies));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = run {
        std::panic::resume_unwind(e);
    }
}
