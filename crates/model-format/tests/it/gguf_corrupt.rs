//! Corrupt GGUF files: each problem gives the right error, naming the file.

use crate::common;

use common::{gguf_string, kv_u32, RawGguf, TempDir};
use model_format::{DType, FormatError, GgufFile, GgufWriter, MetaValue};
use proptest::prelude::*;

fn open_bytes(
    dir: &TempDir,
    name: &str,
    bytes: &[u8],
) -> (std::path::PathBuf, Result<GgufFile, FormatError>) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let r = GgufFile::open(&path);
    (path, r)
}

fn expect_err(dir: &TempDir, name: &str, bytes: &[u8]) -> FormatError {
    let (path, r) = open_bytes(dir, name, bytes);
    let e = r.expect_err("corrupt file opened");
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message lacks path: {msg}"
    );
    assert_eq!(e.path(), path.as_path());
    e
}

/// A valid file: some metadata and one tensor of each type.
fn valid_file() -> Vec<u8> {
    let dir = TempDir::new("valid");
    let path = dir.join("v.gguf");
    let mut w = GgufWriter::new();
    w.metadata("general.architecture", "llama".into())
        .metadata("tok", MetaValue::Array(vec!["a".into(), "bc".into()]))
        .metadata(
            "nested",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::I16(3)])]),
        );
    for d in DType::GGML {
        let cols = d.block_len();
        w.tensor(d.name(), d, &[2, cols], vec![7; 2 * d.block_bytes()])
            .unwrap();
    }
    w.write(&path).unwrap();
    std::fs::read(&path).unwrap()
}

fn one_tensor(ne: Vec<u64>, ty: u32, off: u64, data_len: usize) -> RawGguf {
    RawGguf {
        tensors: vec![("w".into(), ne, ty, off)],
        data: vec![0; data_len],
        ..RawGguf::default()
    }
}

#[test]
fn raw_builder_makes_valid_files() {
    let dir = TempDir::new("rawok");
    let raw = one_tensor(vec![32, 2], 8, 0, 68);
    let (_, r) = open_bytes(&dir, "ok.gguf", &raw.bytes());
    let f = r.unwrap();
    assert_eq!(f.tensor("w").unwrap().shape, &[2, 32]);
    // Version 2 is accepted too.
    let raw = RawGguf {
        version: 2,
        ..one_tensor(vec![4], 0, 0, 16)
    };
    let (_, r) = open_bytes(&dir, "v2.gguf", &raw.bytes());
    assert_eq!(r.unwrap().version(), 2);
}

#[test]
fn missing_file() {
    let dir = TempDir::new("missing");
    let path = dir.join("nope.gguf");
    let e = GgufFile::open(&path).unwrap_err();
    assert!(matches!(e, FormatError::MissingFile { .. }), "{e}");
    assert!(e.to_string().contains(&path.display().to_string()));
}

#[test]
fn directory_is_not_a_file() {
    let dir = TempDir::new("isdir");
    let e = GgufFile::open(dir.path()).unwrap_err();
    assert!(
        e.to_string().contains(&dir.path().display().to_string()),
        "{e}"
    );
}

#[test]
fn bad_magic() {
    let dir = TempDir::new("magic");
    let mut b = valid_file();
    b[..4].copy_from_slice(b"GGML");
    let e = expect_err(&dir, "m.gguf", &b);
    assert!(
        matches!(e, FormatError::BadMagic { found, .. } if &found == b"GGML"),
        "{e}"
    );
}

#[test]
fn unsupported_version() {
    let dir = TempDir::new("version");
    for v in [1u32, 4, 0x0300_0000] {
        let raw = RawGguf {
            version: v,
            ..RawGguf::default()
        };
        let e = expect_err(&dir, "v.gguf", &raw.bytes());
        assert!(
            matches!(e, FormatError::UnsupportedVersion { version, .. } if version == v),
            "{e}"
        );
    }
}

#[test]
fn empty_and_tiny_files_are_truncated() {
    let dir = TempDir::new("tiny");
    for len in [0usize, 3, 4, 7, 8, 15, 23] {
        let b = valid_file();
        let e = expect_err(&dir, "t.gguf", &b[..len]);
        assert!(matches!(e, FormatError::Truncated { .. }), "len {len}: {e}");
    }
}

#[test]
fn truncated_header() {
    let dir = TempDir::new("trhdr");
    let b = valid_file();
    // Cut in the middle of the metadata and of the tensor infos.
    for len in [30, 60, 100, 200] {
        let e = expect_err(&dir, "t.gguf", &b[..len]);
        assert!(matches!(e, FormatError::Truncated { .. }), "len {len}: {e}");
    }
}

#[test]
fn truncated_tensor_data() {
    let dir = TempDir::new("trdata");
    let b = valid_file();
    let (_, r) = open_bytes(&dir, "full.gguf", &b);
    let last = r.unwrap().tensor_infos().last().cloned().unwrap();
    let end = (last.offset + last.n_bytes) as usize;
    let e = expect_err(&dir, "t.gguf", &b[..end - 1]);
    match e {
        // The last tensor (named after the last format of the table) is cut.
        FormatError::Truncated { ref what, .. } => assert!(what.contains(&last.name), "{e}"),
        _ => panic!("wrong error {e}"),
    }
    // Data missing entirely.
    let raw = one_tensor(vec![32, 2], 0, 0, 255);
    let e = expect_err(&dir, "u.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
}

/// Q5_0 (ggml id 6) and Q5_1 (id 7) tensors written byte by byte, as llama.cpp lays them out
/// (Qwen2.5-0.5B's `token_embd.weight` is Q5_0 with rows of 896): read with their format and sizes.
#[test]
fn q5_tensors_are_read() {
    let dir = TempDir::new("q5");
    let (q5_0, q5_1) = (2 * 896 / 32 * 22, 3 * 64 / 32 * 24);
    let off1 = (q5_0 as u64).div_ceil(32) * 32;
    let mut data: Vec<u8> = (0..off1 as usize + q5_1)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    data[q5_0..off1 as usize].fill(0);
    let raw = RawGguf {
        tensors: vec![
            ("token_embd.weight".into(), vec![896, 2], 6, 0),
            ("q51".into(), vec![64, 3], 7, off1),
        ],
        data: data.clone(),
        ..RawGguf::default()
    };
    let (_, r) = open_bytes(&dir, "q5.gguf", &raw.bytes());
    let f = r.unwrap();
    let t = f.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (t.dtype, t.shape, t.data.len()),
        (DType::Q5_0, &[2usize, 896][..], q5_0)
    );
    assert_eq!(t.data, &data[..q5_0]);
    assert_eq!(t.data.len(), 2 * DType::Q5_0.row_bytes(896).unwrap());
    let t = f.tensor("q51").unwrap();
    assert_eq!(
        (t.dtype, t.shape, t.data.len()),
        (DType::Q5_1, &[3usize, 64][..], q5_1)
    );
    assert_eq!(t.data, &data[off1 as usize..]);
    // Truncated Q5 data is named as such.
    let short = RawGguf {
        data: data[..data.len() - 1].to_vec(),
        ..raw
    };
    let e = expect_err(&dir, "short.gguf", &short.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
}

#[test]
fn unsupported_type_names_the_tensor() {
    let dir = TempDir::new("type");
    for ty in [4u32, 5, 16, 17, 31, 999, u32::MAX] {
        let raw = one_tensor(vec![256], ty, 0, 1024);
        let e = expect_err(&dir, "t.gguf", &raw.bytes());
        assert!(
            matches!(e, FormatError::UnsupportedType { ref tensor, type_id, .. } if tensor == "w" && type_id == ty),
            "{e}"
        );
        assert!(e.to_string().contains("'w'"), "{e}");
    }
}

#[test]
fn ne0_not_multiple_of_block() {
    let dir = TempDir::new("block");
    for (ty, ne0) in [
        (2u32, 31u64),
        (3, 48),
        (6, 48),
        (7, 16),
        (8, 1),
        (12, 128),
        (14, 257),
    ] {
        let raw = one_tensor(vec![ne0, 1], ty, 0, 4096);
        let e = expect_err(&dir, "b.gguf", &raw.bytes());
        assert!(
            matches!(e, FormatError::ShapeMismatch { ref tensor, .. } if tensor == "w"),
            "{e}"
        );
    }
}

#[test]
fn huge_counts_are_errors_not_allocations() {
    let dir = TempDir::new("huge");
    let raw = RawGguf {
        tensor_count: Some(1 << 60),
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "a.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
    let raw = RawGguf {
        kv_count: Some(1 << 60),
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "b.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
    let raw = RawGguf {
        kv_count: Some(u64::MAX),
        tensor_count: Some(u64::MAX),
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "c.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");

    // A huge array count.
    let mut kv = Vec::new();
    gguf_string(&mut kv, b"arr");
    kv.extend_from_slice(&9u32.to_le_bytes());
    kv.extend_from_slice(&8u32.to_le_bytes()); // of strings
    kv.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let raw = RawGguf {
        kvs: vec![kv],
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "d.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");

    // Many one-byte elements, all present in the file: each would take a 32-byte MetaValue, so the
    // metadata's elements are capped (named error, nothing allocated from the count).
    let n = model_format::GGUF_MAX_META_ELEMENTS + 1;
    let mut kv = Vec::new();
    gguf_string(&mut kv, b"bytes");
    kv.extend_from_slice(&9u32.to_le_bytes());
    kv.extend_from_slice(&0u32.to_le_bytes()); // of u8
    kv.extend_from_slice(&n.to_le_bytes());
    kv.resize(kv.len() + n as usize, 7);
    let raw = RawGguf {
        kvs: vec![kv],
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "amp.gguf", &raw.bytes());
    assert!(
        matches!(e, FormatError::Invalid { ref detail, .. } if detail.contains("array elements in all")),
        "{e}"
    );
    // The cap is over all arrays together: two halves plus one are refused too.
    let half = |key: &[u8], n: u64| {
        let mut kv = Vec::new();
        gguf_string(&mut kv, key);
        kv.extend_from_slice(&9u32.to_le_bytes());
        kv.extend_from_slice(&0u32.to_le_bytes());
        kv.extend_from_slice(&n.to_le_bytes());
        kv.resize(kv.len() + n as usize, 1);
        kv
    };
    let m = model_format::GGUF_MAX_META_ELEMENTS / 2;
    let raw = RawGguf {
        kvs: vec![half(b"a", m), half(b"b", m + 1)],
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "amp2.gguf", &raw.bytes());
    assert!(
        e.to_string().contains("'b'"),
        "the second array is named: {e}"
    );

    // A huge string length.
    let mut kv = Vec::new();
    gguf_string(&mut kv, b"s");
    kv.extend_from_slice(&8u32.to_le_bytes());
    kv.extend_from_slice(&u64::MAX.to_le_bytes());
    let raw = RawGguf {
        kvs: vec![kv],
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "e.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");

    // Huge dimensions whose byte size overflows.
    let raw = one_tensor(vec![1 << 40, 1 << 40], 0, 0, 64);
    let e = expect_err(&dir, "f.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::ShapeMismatch { .. }), "{e}");
    let raw = one_tensor(vec![1 << 20, 1 << 20], 0, 0, 64);
    let e = expect_err(&dir, "g.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
    // Huge offset.
    let raw = one_tensor(vec![8], 0, u64::MAX - 31, 64);
    let e = expect_err(&dir, "h.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
}

#[test]
fn misaligned_offset() {
    let dir = TempDir::new("misal");
    let raw = one_tensor(vec![8], 0, 4, 64);
    let e = expect_err(&dir, "m.gguf", &raw.bytes());
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
}

/// Tensors named t0, t1, ... of `n_f32[i]` f32 values at relative offsets `offs[i]`.
fn f32_tensors(n_f32: &[u64], offs: &[u64], data_len: usize) -> RawGguf {
    RawGguf {
        tensors: n_f32
            .iter()
            .zip(offs)
            .enumerate()
            .map(|(i, (&n, &o))| (format!("t{i}"), vec![n], 0, o))
            .collect(),
        data: vec![0; data_len],
        ..RawGguf::default()
    }
}

#[test]
fn overlapping_tensors_are_refused_by_name() {
    let dir = TempDir::new("overlap");
    // t1 starts inside t0; t1 nested inside a larger t0; same offset; t2 inside t0 past t1.
    for (n, offs, pair) in [
        (vec![16, 8], vec![0, 32], ("t0", "t1")),
        (vec![32, 8], vec![0, 32], ("t0", "t1")),
        (vec![8, 8], vec![64, 64], ("t0", "t1")),
        (vec![16, 8, 8], vec![0, 64, 32], ("t0", "t2")),
        (vec![8, 64], vec![64, 0], ("t1", "t0")),
    ] {
        let raw = f32_tensors(&n, &offs, 512);
        let e = expect_err(&dir, "o.gguf", &raw.bytes());
        match &e {
            FormatError::TensorOverlap { first, second, .. } => {
                assert_eq!((first.as_str(), second.as_str()), pair, "{e}")
            }
            _ => panic!("{n:?} at {offs:?}: expected an overlap, got {e}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("overlap") && msg.contains(pair.0) && msg.contains(pair.1),
            "{msg}"
        );
    }
    // Adjacent tensors, and an empty one at another's offset, are fine.
    let raw = f32_tensors(&[8, 8, 0], &[0, 32, 32], 64);
    let (_, r) = open_bytes(&dir, "ok.gguf", &raw.bytes());
    assert_eq!(r.unwrap().tensor_infos().len(), 3);
}

#[test]
fn bad_alignment_value() {
    let dir = TempDir::new("align");
    for a in [0u32, 3, 48] {
        let raw = RawGguf {
            kvs: vec![kv_u32("general.alignment", a)],
            ..RawGguf::default()
        };
        let e = expect_err(&dir, "a.gguf", &raw.bytes());
        assert!(matches!(e, FormatError::Invalid { .. }), "{a}: {e}");
    }
}

#[test]
fn duplicates() {
    let dir = TempDir::new("dup");
    let mut raw = one_tensor(vec![8], 0, 0, 64);
    raw.tensors.push(("w".into(), vec![8], 0, 32));
    let e = expect_err(&dir, "t.gguf", &raw.bytes());
    assert!(
        matches!(e, FormatError::Invalid { ref detail, .. } if detail.contains("duplicate")),
        "{e}"
    );
    let raw = RawGguf {
        kvs: vec![kv_u32("k", 1), kv_u32("k", 2)],
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "k.gguf", &raw.bytes());
    assert!(
        matches!(e, FormatError::Invalid { ref detail, .. } if detail.contains("duplicate")),
        "{e}"
    );
}

#[test]
fn bad_utf8_and_bad_value_types() {
    let dir = TempDir::new("utf8");
    let mut kv = Vec::new();
    gguf_string(&mut kv, b"\xff\xfe");
    kv.extend_from_slice(&4u32.to_le_bytes());
    kv.extend_from_slice(&1u32.to_le_bytes());
    let raw = RawGguf {
        kvs: vec![kv],
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "a.gguf", &raw.bytes());
    assert!(
        matches!(e, FormatError::Invalid { ref detail, .. } if detail.contains("UTF-8")),
        "{e}"
    );

    let raw = RawGguf {
        tensors: vec![("\u{0}\u{7f}".into(), vec![4], 0, 0)],
        data: vec![0; 16],
        ..RawGguf::default()
    };
    assert!(open_bytes(&dir, "ok.gguf", &raw.bytes()).1.is_ok());
    let mut b = raw.bytes();
    b[32] = 0xc0; // first byte of the tensor name
    let e = expect_err(&dir, "b.gguf", &b);
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");

    // Unknown value type 13, unknown array element type, bool byte 2.
    for (ty, payload) in [
        (13u32, vec![0u8; 8]),
        (9, [99u32.to_le_bytes().to_vec(), vec![0; 8]].concat()),
        (7, vec![2]),
    ] {
        let mut kv = Vec::new();
        gguf_string(&mut kv, b"k");
        kv.extend_from_slice(&ty.to_le_bytes());
        kv.extend_from_slice(&payload);
        let raw = RawGguf {
            kvs: vec![kv],
            ..RawGguf::default()
        };
        let e = expect_err(&dir, "c.gguf", &raw.bytes());
        assert!(matches!(e, FormatError::Invalid { .. }), "type {ty}: {e}");
    }
}

#[test]
fn bad_dimension_counts() {
    let dir = TempDir::new("dims");
    for ne in [vec![], vec![1, 1, 1, 1, 8]] {
        let raw = one_tensor(ne, 0, 0, 64);
        let e = expect_err(&dir, "d.gguf", &raw.bytes());
        assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
    }
}

#[test]
fn deeply_nested_arrays_do_not_overflow_the_stack() {
    let dir = TempDir::new("nest");
    let mut kv = Vec::new();
    gguf_string(&mut kv, b"deep");
    kv.extend_from_slice(&9u32.to_le_bytes());
    for _ in 0..100_000 {
        kv.extend_from_slice(&9u32.to_le_bytes());
        kv.extend_from_slice(&1u64.to_le_bytes());
    }
    let raw = RawGguf {
        kvs: vec![kv],
        ..RawGguf::default()
    };
    let e = expect_err(&dir, "n.gguf", &raw.bytes());
    assert!(
        matches!(
            e,
            FormatError::Invalid { .. } | FormatError::Truncated { .. }
        ),
        "{e}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random layouts of up to six f32 tensors: the file opens exactly when no two non-empty data
    /// ranges share a byte (checked pairwise here), and an overlap is always the named error.
    #[test]
    fn overlap_is_refused_exactly_when_ranges_intersect(
        layout in proptest::collection::vec((0u64..5, 0u64..8), 1..7)
    ) {
        let dir = TempDir::new("prop-overlap");
        let n: Vec<u64> = layout.iter().map(|&(k, _)| 8 * k).collect();
        let offs: Vec<u64> = layout.iter().map(|&(_, o)| 32 * o).collect();
        let raw = f32_tensors(&n, &offs, 32 * 12);
        let ranges: Vec<(u64, u64)> = n.iter().zip(&offs).map(|(&n, &o)| (o, o + 4 * n)).collect();
        let intersect = (0..ranges.len()).any(|i| {
            (0..i).any(|j| {
                let (a, b) = (ranges[i], ranges[j]);
                a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
            })
        });
        let (_, r) = open_bytes(&dir, "p.gguf", &raw.bytes());
        match r {
            Ok(f) => prop_assert!(!intersect, "overlapping layout {ranges:?} opened: {f:?}"),
            Err(e) => {
                prop_assert!(intersect, "{ranges:?}: {e}");
                prop_assert!(matches!(e, FormatError::TensorOverlap { .. }), "{e}");
            }
        }
    }

    #[test]
    fn random_truncation_never_panics(cut in 0usize..2000) {
        let dir = TempDir::new("prop-trunc");
        let b = valid_file();
        let cut = cut.min(b.len());
        let (_, r) = open_bytes(&dir, "t.gguf", &b[..cut]);
        if cut == b.len() {
            prop_assert!(r.is_ok());
        } else if let Err(e) = r {
            prop_assert!(e.to_string().contains("t.gguf"));
        }
    }

    #[test]
    fn random_byte_corruption_never_panics(pos in 0usize..2000, val: u8, extra in proptest::collection::vec(any::<u8>(), 0..3)) {
        let dir = TempDir::new("prop-flip");
        let mut b = valid_file();
        let pos = pos % b.len();
        b[pos] = val;
        for (i, x) in extra.into_iter().enumerate() {
            let p = (pos + 1 + i) % b.len();
            b[p] = x;
        }
        let (_, r) = open_bytes(&dir, "t.gguf", &b);
        if let Ok(f) = r {
            // Whatever opened must be internally consistent.
            for t in f.tensors() {
                prop_assert_eq!(t.data.len(), t.rows() * t.dtype.row_bytes(t.cols()).unwrap());
            }
        }
    }
}
