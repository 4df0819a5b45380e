//! GgufWriter -> GgufFile round trips.

use crate::common;

use atomic_out::testing::{child_writes, run_in_child};
use common::TempDir;
use model_format::{DType, FormatError, GgufFile, GgufWriter, MetaValue};

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn all_metadata() -> Vec<(&'static str, MetaValue)> {
    vec![
        ("general.architecture", MetaValue::String("llama".into())),
        ("t.u8", MetaValue::U8(200)),
        ("t.i8", MetaValue::I8(-100)),
        ("t.u16", MetaValue::U16(60000)),
        ("t.i16", MetaValue::I16(-30000)),
        ("t.u32", MetaValue::U32(4_000_000_000)),
        ("t.i32", MetaValue::I32(-2_000_000_000)),
        ("t.u64", MetaValue::U64(u64::MAX)),
        ("t.i64", MetaValue::I64(i64::MIN)),
        ("t.f32", MetaValue::F32(1e-5)),
        ("t.f64", MetaValue::F64(-2.5e300)),
        ("t.bool.t", MetaValue::Bool(true)),
        ("t.bool.f", MetaValue::Bool(false)),
        ("t.string", MetaValue::String("héllo ✓".into())),
        ("t.empty_string", MetaValue::String(String::new())),
        (
            "t.arr.str",
            MetaValue::Array(vec!["<s>".into(), "".into(), "▁the".into()]),
        ),
        (
            "t.arr.i32",
            MetaValue::Array(vec![MetaValue::I32(-1), MetaValue::I32(7)]),
        ),
        (
            "t.arr.f32",
            MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-0.25)]),
        ),
        (
            "t.arr.u8",
            MetaValue::Array((0..=255).map(MetaValue::U8).collect()),
        ),
        (
            "t.arr.bool",
            MetaValue::Array(vec![MetaValue::Bool(true), MetaValue::Bool(false)]),
        ),
        ("t.arr.empty", MetaValue::Array(vec![])),
        (
            "t.arr.nested",
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::U64(1), MetaValue::U64(2)]),
                MetaValue::Array(vec!["x".into()]),
                MetaValue::Array(vec![]),
            ]),
        ),
    ]
}

#[test]
fn metadata_of_every_type_round_trips() {
    let dir = TempDir::new("meta");
    let path = dir.join("m.gguf");
    let mut w = GgufWriter::new();
    for (k, v) in all_metadata() {
        w.metadata(k, v);
    }
    w.write(&path).unwrap();
    assert_eq!(dir.names(), ["m.gguf"], "no temporary left");

    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.path(), path.as_path());
    assert_eq!(f.file_bytes(), std::fs::metadata(&path).unwrap().len());
    assert!(f.tensor_infos().is_empty());
    let expected = all_metadata();
    assert_eq!(f.metadata().count(), expected.len());
    for ((k, v), (ek, ev)) in f.metadata().zip(&expected) {
        assert_eq!(k, *ek);
        assert_eq!(v, ev, "{k}");
        assert_eq!(f.get(k), Some(ev));
    }
    assert_eq!(f.get("missing"), None);
    assert_eq!(
        f.get("general.architecture").and_then(MetaValue::as_str),
        Some("llama")
    );
    assert_eq!(
        f.get("t.u32").and_then(MetaValue::as_u64),
        Some(4_000_000_000)
    );
    assert_eq!(f.get("t.i8").and_then(MetaValue::as_i64), Some(-100));
    assert_eq!(
        f.get("t.arr.str").and_then(MetaValue::to_string_vec),
        Some(vec!["<s>".to_owned(), "".to_owned(), "▁the".to_owned()])
    );
    assert_eq!(
        f.get("t.arr.i32").and_then(MetaValue::to_i64_vec),
        Some(vec![-1, 7])
    );
}

/// (name, dtype, shape) for one tensor of every type, plus some odd shapes.
fn tensor_specs() -> Vec<(String, DType, Vec<usize>)> {
    let mut v = Vec::new();
    for d in DType::GGML {
        let cols = d.block_len() * 2;
        v.push((format!("t.{}", d.name()), d, vec![3, cols]));
    }
    v.push(("vec".into(), DType::F32, vec![5]));
    v.push(("cube".into(), DType::F16, vec![2, 3, 4]));
    v.push(("four".into(), DType::Q8_0, vec![2, 1, 3, 64]));
    v.push(("empty".into(), DType::F32, vec![0, 4]));
    v
}

fn write_tensors(path: &std::path::Path, alignment: Option<u64>) -> Vec<Vec<u8>> {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.alignment(a);
    }
    w.metadata("general.name", "tensors".into());
    let mut datas = Vec::new();
    for (i, (name, dtype, shape)) in tensor_specs().into_iter().enumerate() {
        let n = shape.iter().product::<usize>() / dtype.block_len() * dtype.block_bytes();
        let data = pattern(n, i as u8);
        datas.push(data.clone());
        w.tensor(&name, dtype, &shape, data).unwrap();
    }
    w.write(path).unwrap();
    datas
}

fn check_tensors(alignment: Option<u64>) {
    let dir = TempDir::new("tensors");
    let path = dir.join("t.gguf");
    let datas = write_tensors(&path, alignment);
    let f = GgufFile::open(&path).unwrap();
    let a = alignment.unwrap_or(32);
    assert_eq!(f.alignment(), a);
    assert_eq!(
        f.get("general.alignment").and_then(MetaValue::as_u64),
        alignment.filter(|&a| a != 32)
    );
    let specs = tensor_specs();
    assert_eq!(f.tensor_infos().len(), specs.len());
    let raw = std::fs::read(&path).unwrap();
    let mut prev_end = 0;
    for ((info, (name, dtype, shape)), data) in f.tensor_infos().iter().zip(&specs).zip(&datas) {
        assert_eq!(&info.name, name);
        assert_eq!(info.dtype, *dtype);
        assert_eq!(&info.shape, shape);
        assert_eq!(info.n_bytes, data.len() as u64);
        assert_eq!(
            info.offset % a,
            0,
            "{name} offset {} not aligned",
            info.offset
        );
        assert!(info.offset >= prev_end);
        prev_end = info.offset + info.n_bytes;
        // The absolute offset really points at the data in the file.
        let off = info.offset as usize;
        assert_eq!(&raw[off..off + data.len()], &data[..]);

        let t = f.tensor(name).unwrap();
        assert_eq!(t.name, name);
        assert_eq!(t.dtype, *dtype);
        assert_eq!(t.shape, &shape[..]);
        assert_eq!(t.data, &data[..]);
        assert_eq!(t.cols(), *shape.last().unwrap());
        assert_eq!(t.rows() * t.cols(), t.n_elements());
        assert_eq!(t.data.len(), t.rows() * dtype.row_bytes(t.cols()).unwrap());
        // Zero-copy: the view points into the map, at the recorded offset.
        assert_eq!(
            t.data.as_ptr() as usize % a as usize,
            0,
            "mmap is page aligned, so data is aligned"
        );
    }
    let names: Vec<&str> = f.tensors().map(|t| t.name).collect();
    let expect: Vec<&str> = specs.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(names, expect);
    assert!(f.tensor("nope").is_none());
}

#[test]
fn tensors_of_every_dtype_alignment_32() {
    check_tensors(None);
}

#[test]
fn tensors_of_every_dtype_alignment_64() {
    check_tensors(Some(64));
}

#[test]
fn tensors_alignment_explicit_32_and_1() {
    check_tensors(Some(32));
    check_tensors(Some(1));
}

#[test]
fn ggml_ne_order_is_reversed_on_disk() {
    // A [1536, 576] tensor must be stored with ne = [576, 1536].
    let dir = TempDir::new("ne");
    let path = dir.join("ne.gguf");
    let mut w = GgufWriter::new();
    w.tensor("w", DType::Q4_1, &[3, 64], vec![0; 3 * 2 * 20])
        .unwrap();
    w.write(&path).unwrap();
    let raw = std::fs::read(&path).unwrap();
    // header: magic 4, version 4, counts 16, name (8 + 1), n_dims 4, then ne.
    let at = 24 + 9 + 4;
    assert_eq!(u32::from_le_bytes(raw[at - 4..at].try_into().unwrap()), 2);
    assert_eq!(u64::from_le_bytes(raw[at..at + 8].try_into().unwrap()), 64);
    assert_eq!(
        u64::from_le_bytes(raw[at + 8..at + 16].try_into().unwrap()),
        3
    );
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor("w").unwrap().shape, &[3, 64]);
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    let e = w.tensor("a", DType::F32, &[2, 2], vec![0; 15]).unwrap_err();
    assert!(
        matches!(e, FormatError::ShapeMismatch { ref tensor, .. } if tensor == "a"),
        "{e}"
    );
    let e = w
        .tensor("b", DType::Q4_0, &[2, 33], vec![0; 100])
        .unwrap_err();
    assert!(matches!(e, FormatError::ShapeMismatch { .. }), "{e}");
    let e = w.tensor("c", DType::F32, &[], vec![0; 4]).unwrap_err();
    assert!(matches!(e, FormatError::ShapeMismatch { .. }), "{e}");
    let e = w
        .tensor("d", DType::F32, &[1, 1, 1, 1, 1], vec![0; 4])
        .unwrap_err();
    assert!(matches!(e, FormatError::ShapeMismatch { .. }), "{e}");
    w.tensor("ok", DType::F32, &[1], vec![0; 4]).unwrap();
    let e = w.tensor("ok", DType::F32, &[1], vec![0; 4]).unwrap_err();
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
    // Sparrow's hybrid format has no ggml type id: GGUF cannot hold it.
    let hybrid = DType::I4Hybrid {
        outliers_per_row: 1,
    };
    let e = w.tensor("h", hybrid, &[1, 32], vec![0; 28]).unwrap_err();
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("no ggml type id"), "{e}");
}

#[test]
fn writer_rejects_bad_alignment_and_mixed_arrays() {
    let dir = TempDir::new("wbad");
    let path = dir.join("x.gguf");
    let e = GgufWriter::new().alignment(48).write(&path).unwrap_err();
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    let e = GgufWriter::new()
        .metadata(
            "mixed",
            MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)]),
        )
        .write(&path)
        .unwrap_err();
    assert!(matches!(e, FormatError::Invalid { .. }), "{e}");
    assert!(e.to_string().contains("mixed"), "{e}");
    assert!(!path.exists());
    assert!(dir.names().is_empty(), "no file, no temporary");
}

#[test]
fn writer_metadata_replaces_and_alignment_key_syncs() {
    let dir = TempDir::new("wmeta");
    let path = dir.join("x.gguf");
    let mut w = GgufWriter::new();
    w.metadata("a", MetaValue::U32(1))
        .metadata("b", MetaValue::U32(2))
        .metadata("a", MetaValue::U32(3))
        .metadata("general.alignment", MetaValue::U32(128));
    w.tensor("t", DType::F32, &[3], vec![1; 12]).unwrap();
    w.tensor("u", DType::F32, &[3], vec![2; 12]).unwrap();
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let keys: Vec<&str> = f.metadata().map(|(k, _)| k).collect();
    assert_eq!(keys, ["a", "b", "general.alignment"]);
    assert_eq!(f.get("a"), Some(&MetaValue::U32(3)));
    assert_eq!(f.alignment(), 128);
    assert_eq!(f.tensor_infos()[1].offset % 128, 0);
    assert_eq!(f.tensor("u").unwrap().data, &[2; 12]);

    // Setting alignment back to 32 drops the key.
    let mut w2 = w.clone();
    w2.alignment(32);
    w2.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.get("general.alignment"), None);
    assert_eq!(f.alignment(), 32);
}

#[test]
fn overwrite_existing_file() {
    let dir = TempDir::new("over");
    let path = dir.join("x.gguf");
    std::fs::write(&path, b"old junk").unwrap();
    GgufWriter::new()
        .metadata("k", MetaValue::Bool(true))
        .write(&path)
        .unwrap();
    assert_eq!(
        GgufFile::open(&path).unwrap().get("k"),
        Some(&MetaValue::Bool(true))
    );
}

#[test]
fn reader_is_shareable_across_threads() {
    let dir = TempDir::new("threads");
    let path = dir.join("t.gguf");
    let datas = write_tensors(&path, None);
    let f = std::sync::Arc::new(GgufFile::open(&path).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || f.tensors().map(|t| t.data.len()).sum::<usize>())
        })
        .collect();
    let total: usize = datas.iter().map(Vec::len).sum();
    for h in handles {
        assert_eq!(h.join().unwrap(), total);
    }
}

/// The writer of `write_tensors`, with every other tensor declared (no data)
/// instead, and the data of all of them.
fn half_declared(alignment: Option<u64>) -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    if let Some(a) = alignment {
        w.alignment(a);
    }
    w.metadata("general.name", "tensors".into());
    let mut datas = Vec::new();
    for (i, (name, dtype, shape)) in tensor_specs().into_iter().enumerate() {
        let n = shape.iter().product::<usize>() / dtype.block_len() * dtype.block_bytes();
        let data = pattern(n, i as u8);
        if i % 2 == 0 {
            w.declare_tensor(&name, dtype, &shape).unwrap();
        } else {
            w.tensor(&name, dtype, &shape, data.clone()).unwrap();
        }
        datas.push(data);
    }
    (w, datas)
}

#[test]
fn streamed_file_is_byte_identical_to_written_file() {
    for alignment in [None, Some(64), Some(1)] {
        let dir = TempDir::new("stream");
        let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
        write_tensors(&a, alignment);
        let (w, datas) = half_declared(alignment);
        let mut s = w.stream(&b).unwrap();
        assert!(!b.exists(), "the final name appears only on finish");
        for (i, (name, _, _)) in tensor_specs().into_iter().enumerate() {
            if i % 2 == 1 || datas[i].is_empty() {
                continue; // written by the stream itself
            }
            assert_eq!(s.next_tensor(), Some(name.as_str()));
            for chunk in datas[i].chunks(7) {
                s.write_data(chunk).unwrap();
            }
        }
        assert_eq!(s.next_tensor(), None);
        s.finish().unwrap();
        assert_eq!(dir.names(), ["a.gguf", "b.gguf"], "no temporary left");
        assert!(
            std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
            "alignment {alignment:?}"
        );
        let f = GgufFile::open(&b).unwrap();
        for (t, d) in f.tensors().zip(&datas) {
            assert_eq!(t.data, d.as_slice(), "{}", t.name);
        }
    }
}

#[test]
fn stream_rejects_wrong_amounts_of_data_and_leaves_no_file() {
    let dir = TempDir::new("streambad");
    let path = dir.join("x.gguf");
    let tmps = || atomic_out::temporaries(&path).unwrap().len();
    let mut w = GgufWriter::new();
    w.declare_tensor("a", DType::F32, &[2]).unwrap();
    w.declare_tensor("b", DType::Q8_0, &[1, 32]).unwrap();

    // write() needs every tensor's data.
    let e = w.write(&path).unwrap_err();
    assert!(e.to_string().contains("'a'"), "{e}");
    assert!(!path.exists() && tmps() == 0);

    // A chunk that runs past its tensor.
    let mut s = w.stream(&path).unwrap();
    assert_eq!(tmps(), 1);
    let e = s.write_data(&[0; 9]).unwrap_err();
    assert!(
        matches!(e, FormatError::Invalid { .. }) && e.to_string().contains("'a'"),
        "{e}"
    );
    assert!(tmps() == 0, "an error removes the temporary file");
    let e = s.write_data(&[0; 4]).unwrap_err();
    assert!(e.to_string().contains("closed"), "{e}");
    drop(s);

    // Finishing with a tensor incomplete.
    let mut s = w.stream(&path).unwrap();
    s.write_data(&[1; 8]).unwrap();
    assert_eq!(s.next_tensor(), Some("b"));
    s.write_data(&[2; 30]).unwrap();
    let e = s.finish().unwrap_err();
    assert!(
        e.to_string().contains("'b'") && e.to_string().contains("30 of 34"),
        "{e}"
    );
    assert!(!path.exists() && tmps() == 0);

    // Data after the last tensor.
    let mut s = w.stream(&path).unwrap();
    s.write_data(&[1; 8]).unwrap();
    s.write_data(&[2; 34]).unwrap();
    let e = s.write_data(&[3]).unwrap_err();
    assert!(e.to_string().contains("after the last tensor"), "{e}");
    assert!(!path.exists() && tmps() == 0);

    // A dropped stream leaves nothing behind.
    let mut s = w.stream(&path).unwrap();
    s.write_data(&[1; 8]).unwrap();
    drop(s);
    assert!(!path.exists() && tmps() == 0);

    // And a complete one reads back.
    let mut s = w.stream(&path).unwrap();
    s.write_data(&[1; 8]).unwrap();
    s.write_data(&[2; 34]).unwrap();
    s.finish().unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor("a").unwrap().data, &[1; 8]);
    assert_eq!(f.tensor("b").unwrap().data, &[2; 34]);
    assert!(tmps() == 0);
}

/// A GGUF already at the destination survives, byte-identical, every write that does not complete: a
/// dropped stream, a stream closed by bad data, a refused finish, a refused write, and one whose disk
/// fills (EFBIG past a file-size limit, in a child process). No temporary is left behind by any.
#[test]
fn failed_or_dropped_writes_leave_the_old_file_intact() {
    // 2 MiB of tensor data, past the stream's 1 MiB buffer: the write fails in the middle.
    child_writes(|p| {
        let mut w = GgufWriter::new();
        w.metadata("general.name", "big".into());
        w.tensor("big", DType::F32, &[128, 4096], vec![7; 4 * 128 * 4096])
            .map_err(|e| e.to_string())?;
        w.write(p).map_err(|e| e.to_string())
    });

    let dir = TempDir::new("keep");
    let path = dir.join("m.gguf");
    write_tensors(&path, None);
    let before = std::fs::read(&path).unwrap();
    let mut w = GgufWriter::new();
    w.declare_tensor("a", DType::F32, &[2]).unwrap();

    let mut s = w.stream(&path).unwrap();
    s.write_data(&[1; 4]).unwrap();
    assert_eq!(atomic_out::temporaries(&path).unwrap().len(), 1);
    drop(s);
    let mut s = w.stream(&path).unwrap();
    assert!(s.write_data(&[1; 9]).is_err());
    drop(s);
    let mut s = w.stream(&path).unwrap();
    s.write_data(&[1; 4]).unwrap();
    assert!(s.finish().is_err());
    assert!(w.write(&path).is_err(), "declared tensors need stream()");
    assert!(GgufWriter::new().alignment(3).write(&path).is_err());

    let r = run_in_child(
        "gguf_roundtrip::failed_or_dropped_writes_leave_the_old_file_intact",
        &path,
        before.len() as u64 / 2,
    );
    if let Some(r) = r {
        let e = r.expect_err("a file larger than the file-size limit cannot be written");
        assert!(e.contains("m.gguf"), "{e}");
    }

    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(dir.names(), ["m.gguf"], "no temporary left");
    GgufFile::open(&path).unwrap();
}

/// Arrays longer than `GGUF_DEFERRED_ARRAY_MIN` (a vocabulary) are parsed when asked for: `get`
/// and `get_uncached` give what was written, `array_len` its count, and `metadata()` lists them
/// in file order among the others; a bad element deep inside one is still refused at open.
#[test]
fn large_arrays_are_parsed_on_demand_with_the_same_values() {
    use model_format::GGUF_DEFERRED_ARRAY_MIN;
    let n = GGUF_DEFERRED_ARRAY_MIN as usize + 5;
    let tokens = MetaValue::Array((0..n).map(|i| format!("tok{i}").into()).collect());
    let types = MetaValue::Array((0..n).map(|i| MetaValue::I32(i as i32 % 7)).collect());
    let small = MetaValue::Array(vec!["a".into()]);
    let dir = TempDir::new("deferred");
    let path = dir.join("d.gguf");
    let mut w = GgufWriter::new();
    w.metadata("tokens", tokens.clone())
        .metadata("small", small.clone())
        .metadata("types", types.clone());
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.array_len("tokens"), Some(n as u64));
    assert_eq!(f.array_len("small"), Some(1));
    assert_eq!(f.array_len("missing"), None);
    assert_eq!(f.get_uncached("tokens").as_deref(), Some(&tokens));
    assert_eq!(f.get_uncached("small").as_deref(), Some(&small));
    assert_eq!(f.get("types"), Some(&types));
    // Once `get` has parsed it, `get_uncached` lends the kept value.
    assert!(matches!(
        f.get_uncached("types"),
        Some(std::borrow::Cow::Borrowed(v)) if *v == types
    ));
    let all: Vec<(&str, &MetaValue)> = f.metadata().collect();
    assert_eq!(
        all,
        [("tokens", &tokens), ("small", &small), ("types", &types)]
    );

    // Element n - 1's bytes made invalid UTF-8: open names the element.
    let mut bytes = std::fs::read(&path).unwrap();
    let last = format!("tok{}", n - 1);
    let at = bytes
        .windows(last.len())
        .position(|w| w == last.as_bytes())
        .unwrap();
    bytes[at] = 0xFF;
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, &bytes).unwrap();
    let e = GgufFile::open(&bad).unwrap_err().to_string();
    assert!(
        e.contains(&format!("tokens'[{}]", n - 1)) && e.contains("UTF-8"),
        "{e}"
    );
}

/// A Mixture-of-Experts tensor (`[experts, rows, cols]`, as llama.cpp writes
/// `blk.N.ffn_{gate,up,down}_exps.weight`) of every format reads back with each expert's matrix a
/// contiguous row range: `outer_slice(e)` holds exactly the bytes written for expert `e`.
#[test]
fn expert_tensors_of_every_format_slice_into_row_ranges() {
    let dir = TempDir::new("experts");
    let path = dir.join("moe.gguf");
    let (experts, rows) = (5, 3);
    let mut w = GgufWriter::new();
    let mut written = Vec::new();
    for (i, d) in DType::GGML.into_iter().enumerate() {
        let cols = d.block_len() * 2;
        let per_expert = rows * d.row_bytes(cols).unwrap();
        let bytes = pattern(experts * per_expert, i as u8);
        let name = format!("blk.0.ffn_up_exps.{}", d.name());
        w.tensor(&name, d, &[experts, rows, cols], bytes.clone())
            .unwrap();
        written.push((name, d, cols, per_expert, bytes));
    }
    w.write(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    for (name, d, cols, per_expert, bytes) in written {
        let t = f.tensor(&name).unwrap();
        assert_eq!(t.shape, &[experts, rows, cols], "{name}");
        assert_eq!(t.dtype, d);
        for e in 0..experts {
            let s = t.outer_slice(e).unwrap();
            assert_eq!((s.rows(), s.cols()), (rows, cols), "{name} expert {e}");
            assert_eq!(
                s.data,
                &bytes[e * per_expert..(e + 1) * per_expert],
                "{name} expert {e}"
            );
        }
        assert!(t.outer_slice(experts).is_none(), "{name}");
    }
}
