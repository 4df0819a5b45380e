//! Round trips and corruption of expert stores, read through a real `ufs-io` engine.

use std::path::PathBuf;

use neuron_store::expert::{
    ExpertLayerInput, ExpertLayout, ExpertShape, ExpertStore, ExpertStoreWriter, EXPERT_HEADER_LEN,
};
use neuron_store::{Formats, StoreError, PAGE};
use proptest::prelude::*;
use tensor_types::WeightFormat;
use ufs_io::{IoConfig, IoEngine, OpenOptions};

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("expert-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn io() -> IoEngine {
    IoEngine::new(IoConfig::default()).unwrap()
}

fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

fn formats(gate: WeightFormat, down: WeightFormat) -> Formats {
    Formats {
        gate,
        up: gate,
        down,
    }
}

/// Layers of random expert tensors: (gate, up, down) bytes each, as llama.cpp's 3-D tensors hold them.
type Tensors = (Vec<u8>, Vec<u8>, Vec<u8>);

fn write(path: &PathBuf, d: usize, shapes: &[ExpertShape], seed: u64) -> Vec<Tensors> {
    let mut w = ExpertStoreWriter::create(path, d, shapes).unwrap();
    let mut out = Vec::new();
    for (li, s) in shapes.iter().enumerate() {
        let l = if s.n_experts == 0 {
            ExpertLayout::EMPTY
        } else {
            ExpertLayout::new(d, s).unwrap()
        };
        let seed = seed + 3 * li as u64;
        let t = (
            bytes(seed, s.n_experts * l.gate_bytes),
            bytes(seed + 1, s.n_experts * l.up_bytes),
            bytes(seed + 2, s.n_experts * l.down_bytes),
        );
        w.add_layer(ExpertLayerInput {
            gate: &t.0,
            up: &t.1,
            down: &t.2,
        })
        .unwrap();
        out.push(t);
    }
    let index = w.finish().unwrap();
    assert_eq!(index.layers.len(), shapes.len());
    out
}

fn check_round_trip(d: usize, shapes: &[ExpertShape], seed: u64) {
    let path = tmp(&format!("rt-{d}-{seed}.experts"));
    let tensors = write(&path, d, shapes, seed);
    let io = io();
    let store = ExpertStore::open(&io, &path, OpenOptions::default()).unwrap();
    let ix = store.index();
    assert_eq!(ix.d_model, d);
    for (li, (s, (g, u, dn))) in shapes.iter().zip(&tensors).enumerate() {
        assert_eq!(ix.experts(li), s.n_experts);
        assert_eq!(ix.layers[li].shape, *s);
        for e in 0..s.n_experts {
            let l = ix.layers[li].layout;
            let req = store.request(li, e, 7).unwrap();
            assert_eq!((req.offset % PAGE as u64, req.len % PAGE), (0, 0));
            assert_eq!(req.len, l.blob_bytes);
            let blob = store.read_expert(&io, li, e).unwrap();
            assert_eq!(
                &blob[l.gate_range()],
                &g[e * l.gate_bytes..(e + 1) * l.gate_bytes]
            );
            assert_eq!(
                &blob[l.up_range()],
                &u[e * l.up_bytes..(e + 1) * l.up_bytes]
            );
            assert_eq!(
                &blob[l.down_range()],
                &dn[e * l.down_bytes..(e + 1) * l.down_bytes]
            );
            assert!(blob[l.down_range().end..].iter().all(|&b| b == 0));
        }
        assert!(store.request(li, s.n_experts, 0).is_err());
    }
    store.verify_all(&io).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), ix.file_len);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn experts_round_trip_in_their_own_formats() {
    use WeightFormat::*;
    // Per-layer formats differ (Q4_K_M mixes keep some down matrices in Q6_K), a layer without experts.
    let shapes = [
        ExpertShape {
            n_experts: 4,
            ff: 96,
            formats: formats(Q4_0, Q8_0),
        },
        ExpertShape {
            n_experts: 0,
            ff: 0,
            formats: formats(F32, F32),
        },
        ExpertShape {
            n_experts: 3,
            ff: 256,
            formats: formats(Q4_K, Q6_K),
        },
    ];
    check_round_trip(256, &shapes, 11);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Any shape of layers round-trips, every blob one aligned read.
    #[test]
    fn any_shape_round_trips(
        layers in prop::collection::vec((0usize..5, 1usize..5), 1..4),
        d in 1usize..4,
        seed in 1u64..1000,
    ) {
        let shapes: Vec<ExpertShape> = layers.iter().map(|&(n, ff)| ExpertShape {
            n_experts: n,
            ff: ff * 32,
            formats: formats(WeightFormat::Q8_0, WeightFormat::F16),
        }).collect();
        check_round_trip(d * 32, &shapes, seed);
    }
}

fn shape(n: usize) -> ExpertShape {
    ExpertShape {
        n_experts: n,
        ff: 64,
        formats: formats(WeightFormat::Q8_0, WeightFormat::Q8_0),
    }
}

fn base_store() -> (PathBuf, Vec<u8>) {
    static WRITTEN: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let path = tmp("base.experts");
    WRITTEN.get_or_init(|| {
        write(&path, 96, &[shape(3), shape(2)], 5);
    });
    (path.clone(), std::fs::read(&path).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any flipped byte is caught: in header or index when opening, in a blob when it is read.
    #[test]
    fn any_flipped_byte_is_an_error(at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let (base, good) = base_store();
        let mut bytes = good.clone();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let path = tmp(&format!("flip-{i}-{bit}.experts"));
        std::fs::write(&path, &bytes).unwrap();
        let io = io();
        let data = ExpertStore::open(&io, &base, OpenOptions::default()).unwrap().index().layers[0].offsets[0] as usize;
        let outcome = ExpertStore::open(&io, &path, OpenOptions::default()).and_then(|s| s.verify_all(&io).map(|_| s));
        match outcome {
            Err(StoreError::Corrupt { .. }) => prop_assert!(i < data, "byte {i} is a blob byte but opening failed"),
            Err(StoreError::ExpertChecksum { offset, end, .. }) => prop_assert!((offset as usize..end as usize).contains(&i)),
            // Zero padding between the index and the first blob is not covered by a checksum.
            Ok(_) => prop_assert!(i >= EXPERT_HEADER_LEN && i < data && good[i] == 0, "flip at {i} went unnoticed"),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// Truncation (or padding) anywhere is an error when opening.
    #[test]
    fn truncated_or_padded_files_are_errors(cut in any::<prop::sample::Index>(), pad in 0usize..2) {
        let (_, good) = base_store();
        let bytes = if pad == 1 { [good.clone(), vec![0u8; PAGE]].concat() } else { good[..cut.index(good.len())].to_vec() };
        let path = tmp(&format!("trunc-{}-{pad}.experts", bytes.len()));
        std::fs::write(&path, &bytes).unwrap();
        prop_assert!(ExpertStore::open(&io(), &path, OpenOptions::default()).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}

/// A hostile index length under a valid header checksum is an error, not a panic.
#[test]
fn huge_index_length_is_an_error_not_a_panic() {
    let (_, good) = base_store();
    for index_len in [u64::MAX - 20, u64::MAX - 47, u64::MAX, 1 << 60] {
        let mut bytes = good.clone();
        bytes[16..24].copy_from_slice(&index_len.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..40]);
        bytes[40..44].copy_from_slice(&crc.to_le_bytes());
        let path = tmp(&format!("huge-index-{index_len}.experts"));
        std::fs::write(&path, &bytes).unwrap();
        let r = ExpertStore::open(&io(), &path, OpenOptions::default());
        assert!(
            matches!(r, Err(StoreError::Corrupt { .. })),
            "{index_len}: {r:?}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_neuron_store_is_not_an_expert_store() {
    let path = tmp("not-experts.experts");
    let mut bytes = vec![0u8; 2 * PAGE];
    bytes[..8].copy_from_slice(neuron_store::MAGIC);
    std::fs::write(&path, &bytes).unwrap();
    let e = ExpertStore::open(&io(), &path, OpenOptions::default()).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("not-experts.experts") && s.contains("not a sparrow expert store"),
        "{s}"
    );
}

#[test]
fn wrong_inputs_are_refused_and_leave_no_file() {
    let path = tmp("refused.experts");
    let mut w = ExpertStoreWriter::create(&path, 96, &[shape(2)]).unwrap();
    let l = ExpertLayout::new(96, &shape(2)).unwrap();
    let short = vec![0u8; 2 * l.gate_bytes - 1];
    let ok = vec![0u8; 2 * l.gate_bytes];
    let down = vec![0u8; 2 * l.down_bytes];
    let e = w
        .add_layer(ExpertLayerInput {
            gate: &short,
            up: &ok,
            down: &down,
        })
        .unwrap_err();
    assert!(e.to_string().contains("gate experts"), "{e}");
    drop(w);
    assert!(!path.exists());
    let f = formats(WeightFormat::Q8_0, WeightFormat::Q8_0);
    let odd = ExpertShape {
        n_experts: 2,
        ff: 50,
        formats: f,
    };
    assert!(
        ExpertStoreWriter::create(&path, 96, &[odd]).is_err(),
        "50 columns are not Q8_0 blocks"
    );
    // A writer finished early is refused, and the earlier store at the path survives.
    write(&path, 96, &[shape(1)], 9);
    let before = std::fs::read(&path).unwrap();
    let w = ExpertStoreWriter::create(&path, 96, &[shape(1), shape(1)]).unwrap();
    assert!(w.finish().is_err());
    assert_eq!(std::fs::read(&path).unwrap(), before);
}
