//! The Mixture-of-Experts FFN block (`engine::moe`) against a plain scalar f32 reference written
//! here: for every family's routing (softmax over all experts, top-k, renormalised or not, the
//! qwen2moe shared expert gated by a sigmoid) and every weight format the quantizer writes, the
//! weights stored as llama.cpp stores them (3-D `ffn_*_exps` tensors) in a GGUF file, read back
//! and sliced per expert. Also: a batch of decode tokens is computed bit for bit as one token at a
//! time, and bad metadata or shapes are refused with the file and key or tensor named.

use std::path::{Path, PathBuf};

use engine::moe::{MoeBlock, MoeConfig, MoeFamily, MoeLayer, MoeScratch};
use engine::{Precision, StepKind};
use kernels_neon::Activation;
use model_format::{DType, GgufFile, GgufWriter, MetaValue};

const D: usize = 256;
const FF: usize = 256;
const SHARED_FF: usize = 512;
const EXPERTS: usize = 8;
const USED: usize = 3;

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("sparrow-moe-{tag}-{}", std::process::id()));
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

/// Deterministic numbers in [-1, 1).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn quantize(fmt: DType, rows: usize, cols: usize, x: &[f32]) -> Vec<u8> {
    let rb = fmt.row_bytes(cols).unwrap();
    let mut out = vec![0u8; rows * rb];
    for (src, dst) in x.chunks(cols).zip(out.chunks_mut(rb)) {
        kernels_neon::quantize_row(fmt, src, dst).unwrap();
    }
    out
}

fn arch_keys(w: &mut GgufWriter, family: MoeFamily) {
    let a = family.gguf_arch();
    w.metadata("general.architecture", MetaValue::String(a.into()));
    w.metadata(&format!("{a}.expert_count"), MetaValue::U32(EXPERTS as u32));
    w.metadata(
        &format!("{a}.expert_used_count"),
        MetaValue::U32(USED as u32),
    );
    match family {
        MoeFamily::Mixtral | MoeFamily::Olmoe => {
            w.metadata(
                &format!("{a}.feed_forward_length"),
                MetaValue::U32(FF as u32),
            );
        }
        MoeFamily::Qwen3Moe | MoeFamily::Qwen2Moe => {
            w.metadata(&format!("{a}.feed_forward_length"), MetaValue::U32(9999));
            w.metadata(
                &format!("{a}.expert_feed_forward_length"),
                MetaValue::U32(FF as u32),
            );
            w.metadata(
                &format!("{a}.expert_shared_feed_forward_length"),
                MetaValue::U32(SHARED_FF as u32),
            );
        }
    }
}

/// Writes layer 0 of a `family` model's FFN in `fmt` (the router in F32, as llama.cpp keeps it).
fn write_layer(path: &Path, family: MoeFamily, fmt: DType, seed: u64) {
    let mut r = Rng(seed | 1);
    let mut w = GgufWriter::new();
    arch_keys(&mut w, family);
    let t = |w: &mut GgufWriter, name: &str, f: DType, shape: &[usize], x: &[f32]| {
        let cols = *shape.last().unwrap();
        let rows = x.len() / cols;
        w.tensor(name, f, shape, quantize(f, rows, cols, x))
            .unwrap();
    };
    t(
        &mut w,
        "blk.0.ffn_gate_inp.weight",
        DType::F32,
        &[EXPERTS, D],
        &r.vec(EXPERTS * D, 0.2),
    );
    let s = 1.0 / (D as f32).sqrt();
    for n in ["gate", "up"] {
        t(
            &mut w,
            &format!("blk.0.ffn_{n}_exps.weight"),
            fmt,
            &[EXPERTS, FF, D],
            &r.vec(EXPERTS * FF * D, 3.0 * s),
        );
    }
    t(
        &mut w,
        "blk.0.ffn_down_exps.weight",
        fmt,
        &[EXPERTS, D, FF],
        &r.vec(EXPERTS * D * FF, s),
    );
    if family.has_shared_expert() {
        for n in ["gate", "up"] {
            t(
                &mut w,
                &format!("blk.0.ffn_{n}_shexp.weight"),
                fmt,
                &[SHARED_FF, D],
                &r.vec(SHARED_FF * D, 3.0 * s),
            );
        }
        t(
            &mut w,
            "blk.0.ffn_down_shexp.weight",
            fmt,
            &[D, SHARED_FF],
            &r.vec(D * SHARED_FF, s),
        );
        t(
            &mut w,
            "blk.0.ffn_gate_inp_shexp.weight",
            DType::F32,
            &[D],
            &r.vec(D, 0.2),
        );
    }
    w.write(path).unwrap();
}

/// The dequantized matrix of tensor `name` (all rows of all experts).
fn deq(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap();
    let cols = t.cols();
    let rb = t.dtype.row_bytes(cols).unwrap();
    let mut out = vec![0.0f32; t.rows() * cols];
    for (src, dst) in t.data.chunks(rb).zip(out.chunks_mut(cols)) {
        kernels_neon::dequantize_row(t.dtype, src, dst).unwrap();
    }
    out
}

fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// One expert's gated FFN of `x`; `gate`/`up` hold `ff × D` rows from row `first`, `down` `D × ff`.
fn ffn(gate: &[f32], up: &[f32], down: &[f32], x: &[f32]) -> Vec<f32> {
    let g = matvec(gate, x);
    let u = matvec(up, x);
    let h: Vec<f32> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
    matvec(down, &h)
}

/// The scalar reference of the family's MoE FFN for one token.
fn reference(f: &GgufFile, family: MoeFamily, x: &[f32]) -> Vec<f32> {
    let logits = matvec(&deq(f, "blk.0.ffn_gate_inp.weight"), x);
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = logits.iter().map(|l| (l - m).exp()).sum();
    let p: Vec<f32> = logits.iter().map(|l| (l - m).exp() / z).collect();
    let mut order: Vec<usize> = (0..EXPERTS).collect();
    order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
    let top = &order[..USED];
    let sum: f32 = top.iter().map(|&e| p[e]).sum();
    let (gate, up, down) = (
        deq(f, "blk.0.ffn_gate_exps.weight"),
        deq(f, "blk.0.ffn_up_exps.weight"),
        deq(f, "blk.0.ffn_down_exps.weight"),
    );
    let mut out = vec![0.0f32; D];
    for &e in top {
        // llama.cpp's `norm_w` per family (src/models/*.cpp), written out here, not taken
        // from the code under test.
        let wt = match family {
            MoeFamily::Qwen3Moe | MoeFamily::Mixtral => p[e] / sum,
            MoeFamily::Olmoe | MoeFamily::Qwen2Moe => p[e],
        };
        let span = |v: &[f32]| v[e * FF * D..(e + 1) * FF * D].to_vec();
        let y = ffn(&span(&gate), &span(&up), &span(&down), x);
        out.iter_mut().zip(y).for_each(|(o, y)| *o += wt * y);
    }
    if family == MoeFamily::Qwen2Moe {
        let y = ffn(
            &deq(f, "blk.0.ffn_gate_shexp.weight"),
            &deq(f, "blk.0.ffn_up_shexp.weight"),
            &deq(f, "blk.0.ffn_down_shexp.weight"),
            x,
        );
        let gi = deq(f, "blk.0.ffn_gate_inp_shexp.weight");
        let s = 1.0 / (1.0 + (-matvec(&gi, x)[0]).exp());
        out.iter_mut().zip(y).for_each(|(o, y)| *o += s * y);
    }
    out
}

fn load<'f>(f: &'f GgufFile) -> (MoeConfig, MoeLayer<'f>) {
    let cfg = MoeConfig::from_gguf(f.path(), |k| f.get(k))
        .unwrap()
        .unwrap();
    let layer = MoeLayer::load(&cfg, D, 0, f.path(), &|n| f.tensor(n)).unwrap();
    (cfg, layer)
}

fn block(cfg: &MoeConfig) -> MoeBlock {
    let b = MoeBlock::for_config(cfg);
    assert_eq!((b.n_used, b.activation), (cfg.n_used, Activation::Silu));
    b
}

const FORMATS: [DType; 11] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q2_K,
    DType::Q4_K,
    DType::Q6_K,
];

#[test]
fn every_family_and_format_matches_the_scalar_reference() {
    let dir = TempDir::new("ref");
    let n = 6;
    for (fi, family) in MoeFamily::ALL.into_iter().enumerate() {
        for (k, fmt) in FORMATS.into_iter().enumerate() {
            let path = dir
                .0
                .join(format!("{}-{}.gguf", family.gguf_arch(), fmt.name()));
            write_layer(&path, family, fmt, 0x9E37 + (fi * 31 + k) as u64);
            let f = GgufFile::open(&path).unwrap();
            let (cfg, layer) = load(&f);
            assert_eq!(cfg.family, family);
            assert_eq!(
                (cfg.n_experts, cfg.n_used, cfg.expert_ff),
                (EXPERTS, USED, FF)
            );
            assert_eq!(
                cfg.shared_ff,
                family.has_shared_expert().then_some(SHARED_FF)
            );
            let x = Rng(7 + k as u64).vec(n * D, 1.0);
            let mut out = vec![f32::NAN; n * D];
            let mut s = MoeScratch::default();
            block(&cfg)
                .forward(
                    &layer,
                    &x,
                    n,
                    &mut out,
                    Precision::Exact,
                    StepKind::Prompt,
                    &mut s,
                )
                .unwrap();
            assert_eq!(s.routes().len(), n * USED);
            for t in 0..n {
                let want = reference(&f, family, &x[t * D..(t + 1) * D]);
                let got = &out[t * D..(t + 1) * D];
                let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
                assert!(
                    scale > 1e-3,
                    "{family:?} {fmt}: an output of zeros proves nothing"
                );
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 2e-3 * scale,
                        "{family:?} {fmt} token {t}: {g} vs reference {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_decode_batch_is_each_token_alone_bit_for_bit_and_a_prompt_is_close() {
    let dir = TempDir::new("batch");
    let path = dir.0.join("q.gguf");
    write_layer(&path, MoeFamily::Qwen2Moe, DType::Q4_0, 0xB47C);
    let f = GgufFile::open(&path).unwrap();
    let (cfg, layer) = load(&f);
    let b = block(&cfg);
    let n = 16;
    let x = Rng(99).vec(n * D, 1.0);
    let mut s = MoeScratch::default();
    let mut batch = vec![0.0f32; n * D];
    b.forward(
        &layer,
        &x,
        n,
        &mut batch,
        Precision::Fast,
        StepKind::Decode,
        &mut s,
    )
    .unwrap();
    let routes = s.routes().to_vec();
    // Several tokens share an expert (16 tokens x 3 of 8 experts), so the grouping is exercised.
    assert!((0..EXPERTS).any(|e| s.groups().load(e) >= 2));
    // No tokens: nothing computed, nothing routed, nothing written.
    let mut none = [7.0f32; 4];
    b.forward(
        &layer,
        &[],
        0,
        &mut none,
        Precision::Fast,
        StepKind::Prompt,
        &mut s,
    )
    .unwrap();
    assert_eq!((none, s.routes().len()), ([7.0; 4], 0));
    // Too few inputs for the token count: an error, not a panic.
    let short = b.forward(
        &layer,
        &x[..D],
        2,
        &mut none,
        Precision::Fast,
        StepKind::Prompt,
        &mut s,
    );
    assert!(short
        .unwrap_err()
        .to_string()
        .contains("moe block: 2 tokens of 256"));
    let mut prompt = vec![0.0f32; n * D];
    b.forward(
        &layer,
        &x,
        n,
        &mut prompt,
        Precision::Fast,
        StepKind::Prompt,
        &mut s,
    )
    .unwrap();
    for t in 0..n {
        let mut one = vec![0.0f32; D];
        b.forward(
            &layer,
            &x[t * D..(t + 1) * D],
            1,
            &mut one,
            Precision::Fast,
            StepKind::Decode,
            &mut s,
        )
        .unwrap();
        assert_eq!(s.routes(), &routes[t * USED..(t + 1) * USED], "token {t}");
        assert_eq!(one, batch[t * D..(t + 1) * D], "token {t}");
        let scale = one.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        for (p, o) in prompt[t * D..(t + 1) * D].iter().zip(&one) {
            assert!(
                (p - o).abs() <= 1e-2 * scale,
                "token {t}: prompt {p} vs decode {o}"
            );
        }
    }
}

fn config_of(keys: &[(&str, MetaValue)]) -> Result<Option<MoeConfig>, engine::ModelError> {
    let map: Vec<(String, MetaValue)> = keys
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    MoeConfig::from_gguf(Path::new("m.gguf"), |k| {
        map.iter().find(|(n, _)| n == k).map(|(_, v)| v)
    })
}

#[test]
fn metadata_is_read_per_family_and_bad_counts_are_refused() {
    let s = |v: &str| MetaValue::String(v.into());
    let u = MetaValue::U32;
    // A dense llama (no expert_count) and an unknown architecture are no MoE.
    assert!(config_of(&[
        ("general.architecture", s("llama")),
        ("llama.feed_forward_length", u(64))
    ])
    .unwrap()
    .is_none());
    assert!(config_of(&[("general.architecture", s("qwen2"))])
        .unwrap()
        .is_none());
    let mixtral = config_of(&[
        ("general.architecture", s("llama")),
        ("llama.expert_count", u(8)),
        ("llama.expert_used_count", u(2)),
        ("llama.feed_forward_length", u(14336)),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(
        (mixtral.family, mixtral.expert_ff, mixtral.shared_ff),
        (MoeFamily::Mixtral, 14336, None)
    );
    // qwen3moe without expert_feed_forward_length: llama.cpp's n_ff / n_expert_used.
    let q3 = config_of(&[
        ("general.architecture", s("qwen3moe")),
        ("qwen3moe.expert_count", u(128)),
        ("qwen3moe.expert_used_count", u(8)),
        ("qwen3moe.feed_forward_length", u(6144)),
    ])
    .unwrap()
    .unwrap();
    assert_eq!(q3.expert_ff, 768);
    // qwen2moe's shared width falls back to feed_forward_length.
    let q2 = config_of(&[
        ("general.architecture", s("qwen2moe")),
        ("qwen2moe.expert_count", u(60)),
        ("qwen2moe.expert_used_count", u(4)),
        ("qwen2moe.feed_forward_length", u(5632)),
        ("qwen2moe.expert_feed_forward_length", u(1408)),
    ])
    .unwrap()
    .unwrap();
    assert_eq!((q2.expert_ff, q2.shared_ff), (1408, Some(5632)));
    for (keys, says) in [
        (
            vec![
                ("general.architecture", s("olmoe")),
                ("olmoe.feed_forward_length", u(64)),
            ],
            "olmoe.expert_count is 0",
        ),
        (
            vec![
                ("general.architecture", s("olmoe")),
                ("olmoe.expert_count", u(8)),
                ("olmoe.expert_used_count", u(9)),
                ("olmoe.feed_forward_length", u(64)),
            ],
            "olmoe.expert_used_count is 9",
        ),
        (
            vec![
                ("general.architecture", s("olmoe")),
                ("olmoe.expert_count", u(1 << 20)),
                ("olmoe.expert_used_count", u(1)),
            ],
            "olmoe.expert_count is 1048576",
        ),
        (
            vec![
                ("general.architecture", s("olmoe")),
                ("olmoe.expert_count", s("8")),
            ],
            "olmoe.expert_count is not a non-negative integer",
        ),
        (
            vec![
                ("general.architecture", s("olmoe")),
                ("olmoe.expert_count", u(8)),
                ("olmoe.expert_used_count", u(2)),
            ],
            "no expert width",
        ),
    ] {
        let e = config_of(&keys).unwrap_err().to_string();
        assert!(e.starts_with("m.gguf: ") && e.contains(says), "{e}");
    }
}

#[test]
fn missing_or_misshapen_tensors_are_named() {
    let dir = TempDir::new("bad");
    let path = dir.0.join("m.gguf");
    write_layer(&path, MoeFamily::Olmoe, DType::Q8_0, 5);
    let f = GgufFile::open(&path).unwrap();
    let cfg = MoeConfig::from_gguf(f.path(), |k| f.get(k))
        .unwrap()
        .unwrap();
    // The file's experts are FF wide; a config that says otherwise is refused, naming the tensor.
    let wide = MoeConfig {
        expert_ff: 2 * FF,
        ..cfg
    };
    let e = MoeLayer::load(&wide, D, 0, f.path(), &|n| f.tensor(n))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m.gguf") && e.contains("blk.0.ffn_gate_exps.weight"),
        "{e}"
    );
    let e = MoeLayer::load(&cfg, D, 1, f.path(), &|n| f.tensor(n))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing tensor `blk.1.ffn_gate_inp.weight`"),
        "{e}"
    );
    let q2 = MoeConfig {
        shared_ff: Some(SHARED_FF),
        ..cfg
    };
    let e = MoeLayer::load(&q2, D, 0, f.path(), &|n| f.tensor(n))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing tensor `blk.0.ffn_gate_shexp.weight`"),
        "{e}"
    );
}

/// One token over the layer's repacked experts (`MoeBlock::forward_packed`, what a one-token decode
/// step takes when the model's Q4_0 experts were repacked at load) routes as `forward` does and
/// gives its outputs bit for bit where the copies are exact (`Q40x8::exact_on`: the AVX2 and
/// AVX-512 paths, aarch64's with `dotprod`; scalar elsewhere: close), with the qwen2moe shared
/// expert and its gate.
#[test]
fn one_token_over_repacked_experts_is_the_originals_bit_for_bit() {
    use engine::moe::PackedExperts;
    use kernels_neon::{active_path, Q40x8};
    let dir = TempDir::new("packed");
    let path = dir.0.join("q.gguf");
    write_layer(&path, MoeFamily::Qwen2Moe, DType::Q4_0, 0x5EED);
    let f = GgufFile::open(&path).unwrap();
    let (cfg, layer) = load(&f);
    let b = block(&cfg);
    let packed = PackedExperts::new(&layer, &Q40x8::fits, &|m| Q40x8::repack(m))
        .expect("every expert repacks");
    assert_eq!(packed.count(), 3 * (EXPERTS + 1));
    assert_eq!(packed.bytes(), 3 * D * (EXPERTS * FF + SHARED_FF) / 32 * 18);
    let exact = Q40x8::exact_on(active_path(), kernels_neon::WeightFormat::Q4_0);
    let mut s = MoeScratch::default();
    for t in 0..8 {
        let x = Rng(200 + t).vec(D, 1.0);
        let mut want = vec![0.0f32; D];
        b.forward(
            &layer,
            &x,
            1,
            &mut want,
            Precision::Fast,
            StepKind::Decode,
            &mut s,
        )
        .unwrap();
        let routes = s.routes().to_vec();
        let mut got = vec![f32::NAN; D];
        b.forward_packed(&layer, &packed, &x, &mut got, &mut s)
            .unwrap();
        assert_eq!(s.routes(), &routes[..], "token {t}");
        if exact {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "token {t}");
        } else {
            let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-2 * scale, "token {t}: {g} vs {w}");
            }
        }
    }
    // A layer whose experts are not all of a format the copies take (F16) has none.
    let q8 = dir.0.join("f16.gguf");
    write_layer(&q8, MoeFamily::Qwen2Moe, DType::F16, 0x5EED);
    let f8 = GgufFile::open(&q8).unwrap();
    let (_, layer8) = load(&f8);
    assert!(PackedExperts::new(&layer8, &Q40x8::fits, &|m| Q40x8::repack(m)).is_none());
}
