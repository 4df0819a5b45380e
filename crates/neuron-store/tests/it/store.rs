//! Round trips, packing and corruption of neuron stores, read through a real `ufs-io` engine.

use std::path::PathBuf;

use neuron_store::{
    BundleLayout, Formats, LayerInput, NeuronStore, Packing, StoreError, StoreWriter, FULL_FILL,
    MAX_UNIT_PAGES, PAGE,
};
use proptest::prelude::*;
use tensor_types::WeightFormat;
use ufs_io::{IoConfig, IoEngine, OpenOptions};

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("neuron-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn perm(&mut self, n: usize) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            p.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
        p
    }
}

const Q8: Formats = Formats {
    gate: WeightFormat::Q8_0,
    up: WeightFormat::Q8_0,
    down: WeightFormat::Q8_0,
};

/// How a test asks for its units: at most `k` neurons per unit, or a [`Packing`].
#[derive(Clone, Copy, Debug)]
enum Units {
    AtMost(usize),
    Pack(Packing),
}

impl Units {
    fn layout(self, d: usize, formats: Formats) -> BundleLayout {
        match self {
            Units::AtMost(k) => BundleLayout::with_neurons(d, formats, k).unwrap(),
            Units::Pack(p) => BundleLayout::for_packing(d, formats, p).unwrap(),
        }
    }
    fn writer(self, path: &PathBuf, layers: usize, d: usize, ff: usize, f: Formats) -> StoreWriter {
        match self {
            Units::AtMost(k) => StoreWriter::create_with(path, layers, d, ff, f, k).unwrap(),
            Units::Pack(p) => StoreWriter::create_packed(path, layers, d, ff, f, p).unwrap(),
        }
    }
}

/// Layers of random bytes: (gate, up, down_t, order, norms) each.
type Layer = (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u32>, Vec<f32>);

fn write_store(
    path: &PathBuf,
    layers: usize,
    d: usize,
    ff: usize,
    formats: Formats,
    units: Units,
    seed: u64,
) -> Vec<Layer> {
    let mut rng = Rng(seed);
    let l = units.layout(d, formats);
    let mut w = units.writer(path, layers, d, ff, formats);
    assert_eq!(w.layout(), l);
    let mut out = Vec::new();
    for _ in 0..layers {
        let (g, u, dn) = (
            rng.bytes(ff * l.gate_row),
            rng.bytes(ff * l.up_row),
            rng.bytes(ff * l.down_row),
        );
        let order = rng.perm(ff);
        let norms: Vec<f32> = (0..ff).map(|i| i as f32 * 0.5).collect();
        w.add_layer(LayerInput {
            gate: &g,
            up: &u,
            down_t: &dn,
            order: order.clone(),
            hot_neurons: ff / 4,
            down_norms: norms.clone(),
        })
        .unwrap();
        out.push((g, u, dn, order, norms));
    }
    w.finish().unwrap();
    out
}

fn io() -> IoEngine {
    IoEngine::new(IoConfig {
        queue_depth: 8,
        ..Default::default()
    })
    .unwrap()
}

fn check_round_trip(d: usize, ff: usize, formats: Formats, units: Units) {
    let path = tmp(&format!("rt-{d}-{ff}-{units:?}.neurons"));
    let layers = write_store(&path, 2, d, ff, formats, units, 7 + d as u64);
    let io = io();
    let store = NeuronStore::open(&io, &path, OpenOptions::default()).unwrap();
    let ix = store.index();
    let l = ix.layout;
    assert_eq!((ix.d_model, ix.d_ff, ix.formats), (d, ff, formats));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), ix.file_len);
    for (li, (g, u, dn, order, norms)) in layers.iter().enumerate() {
        assert_eq!(&ix.layers[li].order, order);
        assert_eq!(&ix.layers[li].down_norms, norms);
        assert_eq!(ix.layers[li].hot_units, (ff / 4).div_ceil(l.neurons));
        assert_eq!(ix.layers[li].offset % PAGE as u64, 0);
        for n in 0..ff {
            let (unit, slot) = ix.unit_of(li, n as u32);
            assert_eq!(ix.neurons_of(li, unit)[slot], n as u32);
            let b = store.read_unit(&io, li, unit).unwrap();
            let gate = &b[l.gate_range()][slot * l.gate_row..(slot + 1) * l.gate_row];
            let up = &b[l.up_range()][slot * l.up_row..(slot + 1) * l.up_row];
            let down = &b[l.down_range()][slot * l.down_row..(slot + 1) * l.down_row];
            assert_eq!(
                gate,
                &g[n * l.gate_row..(n + 1) * l.gate_row],
                "gate of neuron {n} layer {li}"
            );
            assert_eq!(up, &u[n * l.up_row..(n + 1) * l.up_row]);
            assert_eq!(down, &dn[n * l.down_row..(n + 1) * l.down_row]);
        }
        // Every unit also reads in two parts (first page, then the rest: two-phase loading), and
        // both checks pass on the parts; a part from another unit fails them.
        for unit in 0..ix.units_per_layer() {
            let h = store.head_request(li, unit, 0);
            let head = io.read_at(store.file(), h.offset, h.len).unwrap();
            store.verify_head(li, unit, &head).unwrap();
            let whole = store.read_unit(&io, li, unit).unwrap();
            assert_eq!(&head[..], &whole[..PAGE]);
            match store.rest_request(li, unit, 0) {
                None => assert_eq!(l.pages, 1),
                Some(r) => {
                    assert_eq!(
                        (r.offset, r.len),
                        (h.offset + PAGE as u64, l.unit_bytes() - PAGE)
                    );
                    let rest = io.read_at(store.file(), r.offset, r.len).unwrap();
                    store.verify_parts(li, unit, &head, &rest).unwrap();
                    assert!(store
                        .verify_parts(li, unit, &rest[..PAGE.min(rest.len())], &head)
                        .is_err());
                }
            }
            if ix.units_per_layer() > 1 {
                let other = (unit + 1) % ix.units_per_layer();
                assert!(
                    store.verify_head(li, other, &head).is_err(),
                    "layer {li} unit {unit}"
                );
            }
        }
        let hot = store
            .read_units(&io, li, 0..ix.layers[li].hot_units)
            .unwrap();
        assert_eq!(hot.len(), ix.layers[li].hot_units * l.unit_bytes());
        // Into a reused buffer: the same bytes as a fresh read; a buffer of the wrong size is refused.
        let all = 0..ix.units_per_layer();
        let fresh = store.read_units(&io, li, all.clone()).unwrap();
        let stale = ufs_io::AlignedBuf::new(fresh.len()).unwrap();
        let reused = store.read_units_into(&io, li, all.clone(), stale).unwrap();
        assert_eq!(&reused[..], &fresh[..]);
        let wrong = ufs_io::AlignedBuf::new(fresh.len() + PAGE).unwrap();
        assert!(store.read_units_into(&io, li, all, wrong).is_err());
    }
    store.verify_all(&io).unwrap();
}

#[test]
fn packed_store_round_trips() {
    // Q8_0 rows of 64: bundles of 204 bytes, 20 to a page; 100 neurons leave a ragged last unit.
    let l = BundleLayout::new(64, Q8).unwrap();
    assert_eq!((l.neurons, l.pages), (20, 1));
    check_round_trip(64, 100, Q8, Units::AtMost(usize::MAX));
}

#[test]
fn unpacked_store_round_trips() {
    check_round_trip(64, 37, Q8, Units::AtMost(1));
}

#[test]
fn smollm2_shape_packs_three_per_page() {
    let f = Formats {
        gate: WeightFormat::Q4_1,
        up: WeightFormat::Q4_1,
        down: WeightFormat::Q8_0,
    };
    let l = BundleLayout::new(576, f).unwrap();
    assert_eq!(
        (l.bundle_bytes(), l.neurons, l.pages),
        (360 + 360 + 612, 3, 1)
    );
}

#[test]
fn large_bundles_span_pages_with_the_gate_first() {
    // Q8_0 rows of 2048: 2176-byte rows, a 6528-byte bundle over two pages, gate in the first.
    let l = BundleLayout::new(2048, Q8).unwrap();
    assert_eq!((l.neurons, l.pages), (1, 2));
    assert!(l.gate_in_first_page());
    check_round_trip(2048, 9, Q8, Units::AtMost(usize::MAX));
}

/// Qwen2.5-0.5B's shape: Q5_0 gate/up rows of 896 (616 bytes) and Q8_0 down columns (952): one
/// 2184-byte bundle per page leaves 47% of it empty; full packing puts 9 in 5 pages.
const QWEN: Formats = Formats {
    gate: WeightFormat::Q5_0,
    up: WeightFormat::Q5_0,
    down: WeightFormat::Q8_0,
};

#[test]
fn full_packing_fills_multi_page_units() {
    let page = BundleLayout::for_packing(896, QWEN, Packing::Page).unwrap();
    assert_eq!(
        (page.bundle_bytes(), page.neurons, page.pages),
        (2184, 1, 1)
    );
    assert!(page.fill() < 0.54);
    let full = BundleLayout::for_packing(896, QWEN, Packing::Full).unwrap();
    assert_eq!((full.neurons, full.pages), (9, 5));
    assert!(full.fill() >= FULL_FILL, "{}", full.fill());
    // Multi-page units of several neurons read back whole and in two parts.
    check_round_trip(896, 50, QWEN, Units::Pack(Packing::Full));
    let none = BundleLayout::for_packing(896, QWEN, Packing::None).unwrap();
    assert_eq!((none.neurons, none.pages), (1, 1));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Every packing gives a layout the index can name by its neuron count alone; full packing reaches
    /// FULL_FILL when some unit of at most MAX_UNIT_PAGES pages does, and otherwise takes the best fill.
    #[test]
    fn packings_are_consistent(blocks in 1usize..160, g in 0usize..4, dn in 0usize..4) {
        let fs = [WeightFormat::Q4_0, WeightFormat::Q5_0, WeightFormat::Q8_0, WeightFormat::F16];
        let (d, f) = (blocks * 32, Formats { gate: fs[g], up: fs[g], down: fs[dn] });
        for p in [Packing::None, Packing::Page, Packing::Full] {
            let l = BundleLayout::for_packing(d, f, p).unwrap();
            prop_assert_eq!(BundleLayout::with_unit(d, f, l.neurons).unwrap(), l);
            prop_assert!(l.neurons * l.bundle_bytes() <= l.unit_bytes());
            prop_assert!(l.unit_bytes() - l.neurons * l.bundle_bytes() < PAGE, "a whole empty page");
        }
        let full = BundleLayout::for_packing(d, f, Packing::Full).unwrap();
        let page = BundleLayout::for_packing(d, f, Packing::Page).unwrap();
        prop_assert!(full.fill() >= page.fill());
        let b = full.bundle_bytes();
        let best = (1..=MAX_UNIT_PAGES)
            .filter(|p| p * PAGE >= b)
            .map(|p| (p * PAGE / b * b) as f64 / (p * PAGE) as f64)
            .fold(0.0f64, f64::max);
        if best >= FULL_FILL {
            prop_assert!(full.fill() >= FULL_FILL);
        } else {
            prop_assert!(full.fill() >= best - 1e-12 || full == page);
        }
    }
}

#[test]
fn unfinished_writer_leaves_nothing() {
    let path = tmp("unfinished.neurons");
    let l = BundleLayout::new(64, Q8).unwrap();
    let m = vec![0u8; 40 * l.gate_row];
    {
        let mut w = StoreWriter::create(&path, 2, 64, 40, Q8).unwrap();
        w.add_layer(LayerInput {
            gate: &m,
            up: &m,
            down_t: &m,
            order: (0..40).collect(),
            hot_neurons: 0,
            down_norms: vec![0.0; 40],
        })
        .unwrap();
        let e = StoreWriter::finish(w).unwrap_err();
        assert!(e.to_string().contains("1 of 2 layers"), "{e}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("unfinished"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A store already at the destination survives, byte-identical and still valid, a writer that is
/// dropped half-way, one whose `finish` is refused and one whose write fails (the disk fills: EFBIG past
/// a file-size limit, in a child process); no temporary is left behind by any.
#[test]
fn failed_or_dropped_writer_leaves_the_old_store_intact() {
    let l = BundleLayout::new(64, Q8).unwrap();
    let m = vec![1u8; 40 * l.gate_row];
    let one_layer = |w: &mut StoreWriter| {
        w.add_layer(LayerInput {
            gate: &m,
            up: &m,
            down_t: &m,
            order: (0..40).collect(),
            hot_neurons: 0,
            down_norms: vec![0.0; 40],
        })
    };
    // 256 layers of 40 neurons are 512 units of 4 KiB (2 MiB, past the writer's 1 MiB buffer); the
    // parent's limit of 16 pages stops the writer in the middle of add_layer.
    child_writes(|p| {
        let mut w = StoreWriter::create(p, 256, 64, 40, Q8).map_err(|e| e.to_string())?;
        for _ in 0..256 {
            one_layer(&mut w).map_err(|e| e.to_string())?;
        }
        w.finish().map(|_| ()).map_err(|e| e.to_string())
    });

    let path = tmp("kept.neurons");
    let layers = write_store(&path, 2, 64, 40, Q8, Units::AtMost(usize::MAX), 7);
    let before = std::fs::read(&path).unwrap();
    {
        let mut w = StoreWriter::create(&path, 2, 64, 40, Q8).unwrap();
        one_layer(&mut w).unwrap();
        assert_eq!(atomic_out::temporaries(&path).unwrap().len(), 1);
    } // dropped
    let mut w = StoreWriter::create(&path, 2, 64, 40, Q8).unwrap();
    one_layer(&mut w).unwrap();
    assert!(w.finish().is_err());

    let r = run_in_child(
        "store::failed_or_dropped_writer_leaves_the_old_store_intact",
        &path,
        16 * PAGE as u64,
    );
    if let Some(r) = r {
        let e = r.expect_err("a store larger than the file-size limit cannot be written");
        assert!(e.contains("kept.neurons"), "{e}");
    }

    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(
        atomic_out::temporaries(&path).unwrap(),
        Vec::<PathBuf>::new()
    );
    let store = NeuronStore::open(&io(), &path, OpenOptions::default()).unwrap();
    assert_eq!(store.index().layers[1].order, layers[1].3);
}

use atomic_out::testing::{child_writes, run_in_child};

#[test]
fn bad_input_is_rejected() {
    let path = tmp("bad-input.neurons");
    let l = BundleLayout::new(64, Q8).unwrap();
    let m = vec![0u8; 10 * l.gate_row];
    let mut w = StoreWriter::create(&path, 1, 64, 10, Q8).unwrap();
    let mut order: Vec<u32> = (0..10).collect();
    order[3] = 4;
    let e = w
        .add_layer(LayerInput {
            gate: &m,
            up: &m,
            down_t: &m,
            order,
            hot_neurons: 0,
            down_norms: vec![0.0; 10],
        })
        .unwrap_err();
    assert!(e.to_string().contains("not a permutation"), "{e}");
    let e = w
        .add_layer(LayerInput {
            gate: &m[1..],
            up: &m,
            down_t: &m,
            order: (0..10).collect(),
            hot_neurons: 0,
            down_norms: vec![0.0; 10],
        })
        .unwrap_err();
    assert!(e.to_string().contains("gate is"), "{e}");
    assert!(
        StoreWriter::create(&path, 1, 63, 10, Q8).is_err(),
        "63 columns are not whole Q8_0 blocks"
    );
}

#[test]
fn not_a_store_is_named() {
    let path = tmp("not-a-store.neurons");
    std::fs::write(&path, vec![7u8; 2 * PAGE]).unwrap();
    let e = NeuronStore::open(&io(), &path, OpenOptions::default()).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("not-a-store.neurons") && s.contains("magic"),
        "{s}"
    );
}

fn base_store() -> (PathBuf, Vec<u8>) {
    static WRITTEN: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let path = tmp("base.neurons");
    WRITTEN.get_or_init(|| {
        write_store(&path, 2, 64, 60, Q8, Units::AtMost(usize::MAX), 3);
    });
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Any flipped byte is caught: in header or index when opening, in a unit when the unit is read.
    #[test]
    fn any_flipped_byte_is_an_error(at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let (_, good) = base_store();
        let mut bytes = good.clone();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let path = tmp(&format!("flip-{i}-{bit}.neurons"));
        std::fs::write(&path, &bytes).unwrap();
        let io = io();
        let outcome = NeuronStore::open(&io, &path, OpenOptions::default()).and_then(|s| s.verify_all(&io).map(|_| s));
        let index_end = NeuronStore::open(&io, tmp("base.neurons"), OpenOptions::default()).unwrap().index().layers[0].offset as usize;
        match outcome {
            Err(StoreError::Corrupt { .. }) => prop_assert!(i < index_end, "byte {i} is a unit byte but opening failed"),
            Err(StoreError::Checksum { offset, end, .. }) => prop_assert!((offset as usize..end as usize).contains(&i)),
            // Zero padding between the index and the first unit is not covered by a checksum.
            Ok(_) => prop_assert!(i >= neuron_store::HEADER_LEN && i < index_end && bytes[i] != 0 && good[i] == 0, "flip at {i} went unnoticed"),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// Truncation (or padding) anywhere is an error when opening.
    #[test]
    fn truncated_or_padded_files_are_errors(cut in any::<prop::sample::Index>(), pad in 0usize..2) {
        let (_, good) = base_store();
        let bytes = if pad == 1 { [good.clone(), vec![0u8; PAGE]].concat() } else { good[..cut.index(good.len())].to_vec() };
        let path = tmp(&format!("trunc-{}-{pad}.neurons", bytes.len()));
        std::fs::write(&path, &bytes).unwrap();
        prop_assert!(NeuronStore::open(&io(), &path, OpenOptions::default()).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}

/// Regression (fuzz round, issue 19): an index length near `u64::MAX` under a valid header checksum
/// wrapped the "header + index" size to a small number and slicing the index panicked.
#[test]
fn huge_index_length_is_an_error_not_a_panic() {
    let (_, good) = base_store();
    for index_len in [u64::MAX - 20, u64::MAX - 47, u64::MAX, 1 << 60] {
        let mut bytes = good.clone();
        bytes[16..24].copy_from_slice(&index_len.to_le_bytes());
        let crc = crc32fast::hash(&bytes[..40]);
        bytes[40..44].copy_from_slice(&crc.to_le_bytes());
        let path = tmp(&format!("huge-index-{index_len}.neurons"));
        std::fs::write(&path, &bytes).unwrap();
        let r = NeuronStore::open(&io(), &path, OpenOptions::default());
        assert!(
            matches!(r, Err(StoreError::Corrupt { .. })),
            "{index_len}: {r:?}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}

/// The header's reserved bytes (44..48, outside its CRC) are checked: a flip there is damage, named.
#[test]
fn reserved_header_bytes_must_be_zero() {
    let (_, good) = base_store();
    for i in 44..neuron_store::HEADER_LEN {
        let mut bytes = good.clone();
        bytes[i] ^= 1;
        let path = tmp(&format!("reserved-{i}.neurons"));
        std::fs::write(&path, &bytes).unwrap();
        let err = NeuronStore::open(&io(), &path, OpenOptions::default()).err();
        assert!(
            matches!(&err, Some(StoreError::Corrupt { what, .. }) if what.contains("reserved header bytes")),
            "byte {i}: {err:?}"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
