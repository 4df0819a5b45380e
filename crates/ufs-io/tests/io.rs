//! End-to-end tests of `ufs-io` on real files: both read modes, coalescing (including a property test
//! against `std::fs`), queue depth, fault injection, alignment checks and statistics.
//!
//! Files live under `std::env::temp_dir()` (may be tmpfs, which may refuse `O_DIRECT`: then the buffered
//! fallback is what gets tested) and under Cargo's `CARGO_TARGET_TMPDIR` (normally a real disk).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use ufs_io::{
    Fault, FaultPlan, IoConfig, IoEngine, IoError, IoFile, OpenOptions, ReadRequest, ALIGN,
};

const PAGE: u64 = ALIGN as u64;

struct TempDir(PathBuf);

impl TempDir {
    fn new(base: &Path, name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("ufs-io-{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Byte `i` of a test file: differs between pages and within a page.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((i / ALIGN) as u32)
                .wrapping_mul(131)
                .wrapping_add((i % ALIGN) as u32 * 7) as u8
        })
        .collect()
}

fn write_file(dir: &TempDir, name: &str, len: usize) -> (PathBuf, Vec<u8>) {
    let path = dir.0.join(name);
    let data = pattern(len);
    std::fs::write(&path, &data).unwrap();
    (path, data)
}

fn bases() -> Vec<PathBuf> {
    vec![
        std::env::temp_dir(),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
    ]
}

#[test]
fn reads_back_a_known_pattern_direct_and_buffered() {
    for base in bases() {
        let dir = TempDir::new(&base, "modes");
        let (path, data) = write_file(&dir, "w.bin", 40 * ALIGN);
        for direct in [true, false] {
            let io = IoEngine::new(IoConfig {
                seq_chunk: 8 * ALIGN,
                ..Default::default()
            })
            .unwrap();
            let id = io
                .open(
                    &path,
                    OpenOptions {
                        direct,
                        drop_cache: true,
                    },
                )
                .unwrap();
            let f = io.file(id).unwrap();
            eprintln!(
                "{}: direct requested {direct}, got {}",
                path.display(),
                f.is_direct()
            );
            if !direct {
                assert!(!f.is_direct());
            }
            assert_eq!(f.len(), data.len() as u64);
            for page in [0u64, 1, 17, 39] {
                let b = io.read_at(id, page * PAGE, ALIGN).unwrap();
                assert_eq!(b.as_ptr() as usize % ALIGN, 0);
                assert_eq!(
                    &b[..],
                    &data[(page * PAGE) as usize..][..ALIGN],
                    "page {page}"
                );
            }
            // Several chunks, the last one partial.
            let all = io.read_sequential(id, PAGE, 37 * ALIGN).unwrap();
            assert_eq!(&all[..], &data[ALIGN..38 * ALIGN]);
            assert_eq!(
                io.stats().reads,
                4 + 5,
                "4 page reads + 5 chunks of 8 pages"
            );
            let mut reused = ufs_io::AlignedBuf::new(3 * ALIGN).unwrap();
            let ptr = reused.as_ptr();
            for page in [5u64, 20] {
                reused = io.read_sequential_into(id, page * PAGE, reused).unwrap();
                assert_eq!(reused.as_ptr(), ptr, "the same allocation comes back");
                assert_eq!(&reused[..], &data[(page * PAGE) as usize..][..3 * ALIGN]);
            }
            // Sequential reads take faults like any request: the second read after the plan fails
            // with EIO, the third comes back short, the fourth is whole again.
            io.set_fault_plan(
                FaultPlan::new()
                    .with(1, Fault::Eio)
                    .with(2, Fault::ShortRead),
            );
            let whole = io.read_sequential(id, PAGE, 9 * ALIGN).unwrap();
            assert!(matches!(
                io.read_sequential(id, PAGE, 9 * ALIGN),
                Err(IoError::Read { .. })
            ));
            assert!(matches!(
                io.read_sequential_into(id, PAGE, whole),
                Err(IoError::ShortRead { got, wanted, .. }) if got < wanted
            ));
            assert_eq!(
                &io.read_sequential(id, PAGE, 9 * ALIGN).unwrap()[..],
                &data[ALIGN..10 * ALIGN]
            );
            io.set_fault_plan(FaultPlan::new());
            // The synchronous path agrees.
            assert_eq!(
                &f.read_at(2 * PAGE, 2 * ALIGN).unwrap()[..],
                &data[2 * ALIGN..4 * ALIGN]
            );
        }
    }
}

#[test]
fn coalesces_adjacent_pages_waiting_in_the_queue() {
    let dir = TempDir::new(&std::env::temp_dir(), "merge");
    let (path, data) = write_file(&dir, "m.bin", 64 * ALIGN);
    let io = IoEngine::new(IoConfig {
        queue_depth: 16,
        max_merge: 3 * ALIGN,
        ..Default::default()
    })
    .unwrap();
    let id = io.open(&path, OpenOptions::default()).unwrap();
    // Request 0 holds the thread up, so that the others are all waiting when it looks at the queue.
    io.set_fault_plan(FaultPlan::new().with(0, Fault::Delay(Duration::from_millis(400))));
    io.submit(ReadRequest {
        file: id,
        offset: 50 * PAGE,
        len: ALIGN,
        tag: 100,
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // Pages 4, 3, 2, 1, 0 (merged into runs of at most 3 pages: 0-2 and 3-4), 8 (alone), and page 2 twice.
    for (tag, page) in [
        (4u64, 4u64),
        (3, 3),
        (2, 2),
        (1, 1),
        (0, 0),
        (8, 8),
        (22, 2),
    ] {
        io.submit(ReadRequest {
            file: id,
            offset: page * PAGE,
            len: ALIGN,
            tag,
        })
        .unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..8 {
        let c = io
            .completions()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        let page = if c.tag == 22 {
            2
        } else if c.tag == 100 {
            50
        } else {
            c.tag as usize
        };
        assert_eq!(c.offset, page as u64 * PAGE);
        assert_eq!(
            &c.result.unwrap()[..],
            &data[page * ALIGN..][..ALIGN],
            "tag {}",
            c.tag
        );
        seen.push(c.tag);
    }
    seen.sort();
    assert_eq!(seen, [0, 1, 2, 3, 4, 8, 22, 100]);
    let s = io.stats();
    // Runs: {50}, {0,1,2,2'}, {3,4}, {8}: 4 reads for 8 requests.
    assert_eq!((s.requests, s.reads, s.merged_requests), (8, 4, 4), "{s:?}");
}

fn expected(data: &[u8], offset: u64, len: usize) -> Result<Vec<u8>, usize> {
    let o = offset as usize;
    if o + len <= data.len() {
        Ok(data[o..o + len].to_vec())
    } else {
        Err(data.len().saturating_sub(o).min(len))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random page sets (with duplicates, neighbours and reads past the end of a file whose last page is
    /// partial), submitted while the thread is held up so that they coalesce: every completion equals
    /// what `std::fs` reads, and reads past the end fail with the right byte count.
    #[test]
    fn coalesced_reads_equal_std_reads(
        reqs in proptest::collection::vec((0u64..70, 1usize..4), 1..40),
        max_merge_pages in 1usize..10,
    ) {
        let dir = TempDir::new(&std::env::temp_dir(), "prop");
        let (path, data) = write_file(&dir, "p.bin", 64 * ALIGN + 1000);
        let io = IoEngine::new(IoConfig {
            queue_depth: 64,
            max_merge: max_merge_pages * ALIGN,
            ..Default::default()
        }).unwrap();
        let id = io.open(&path, OpenOptions::default()).unwrap();
        io.set_fault_plan(FaultPlan::new().with(0, Fault::Delay(Duration::from_millis(20))));
        for (tag, &(page, n)) in reqs.iter().enumerate() {
            io.submit(ReadRequest { file: id, offset: page * PAGE, len: n * ALIGN, tag: tag as u64 }).unwrap();
        }
        let mut done = vec![false; reqs.len()];
        for _ in 0..reqs.len() {
            let c = io.completions().recv_timeout(Duration::from_secs(10)).unwrap();
            let (page, n) = reqs[c.tag as usize];
            done[c.tag as usize] = true;
            match (c.result, expected(&data, page * PAGE, n * ALIGN)) {
                (Ok(b), Ok(want)) => prop_assert_eq!(&b[..], &want[..]),
                (Err(IoError::ShortRead { offset, wanted, got, .. }), Err(want_got)) => {
                    prop_assert_eq!((offset, wanted, got), (page * PAGE, n * ALIGN, want_got));
                }
                (r, e) => {
                    let (r, e) = (r.map(|b| b.len()), e.map(|v| v.len()));
                    prop_assert!(false, "page {} x{}: got {:?}, expected {:?}", page, n, r, e);
                }
            }
        }
        prop_assert!(done.iter().all(|&d| d));
        let s = io.stats();
        prop_assert_eq!(s.requests, reqs.len() as u64);
        prop_assert_eq!(s.reads + s.merged_requests, s.requests);
    }
}

#[test]
fn queue_depth_is_respected() {
    let dir = TempDir::new(&std::env::temp_dir(), "depth");
    let (path, _) = write_file(&dir, "d.bin", 16 * ALIGN);
    let io = IoEngine::new(IoConfig {
        queue_depth: 4,
        ..Default::default()
    })
    .unwrap();
    let id = io.open(&path, OpenOptions::default()).unwrap();
    // Request 0 keeps the thread busy for a second, so no slot frees up during the next submissions.
    io.set_fault_plan(FaultPlan::new().with(0, Fault::Delay(Duration::from_millis(1000))));
    for tag in 0..4 {
        io.try_submit(ReadRequest {
            file: id,
            offset: tag * PAGE,
            len: ALIGN,
            tag,
        })
        .unwrap();
    }
    assert!(matches!(
        io.try_submit(ReadRequest {
            file: id,
            offset: 0,
            len: ALIGN,
            tag: 9
        }),
        Err(IoError::QueueFull { depth: 4 })
    ));
    for _ in 0..4 {
        io.completions()
            .recv_timeout(Duration::from_secs(10))
            .unwrap()
            .result
            .unwrap();
    }
    assert_eq!(io.stats().max_in_flight, 4);

    // Blocking submissions from several threads never exceed the depth.
    let io = IoEngine::new(IoConfig {
        queue_depth: 3,
        ..Default::default()
    })
    .unwrap();
    let id = io.open(&path, OpenOptions::default()).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let io = &io;
            s.spawn(move || {
                for i in 0..50u64 {
                    io.submit(ReadRequest {
                        file: id,
                        offset: (i % 16) * PAGE,
                        len: ALIGN,
                        tag: t * 100 + i,
                    })
                    .unwrap();
                }
            });
        }
        for _ in 0..200 {
            io.completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap()
                .result
                .unwrap();
        }
    });
    let s = io.stats();
    assert_eq!(s.requests, 200);
    assert!(s.max_in_flight <= 3 && s.max_in_flight >= 1, "{s:?}");
    assert_eq!(io.in_flight(), 0);
}

#[test]
fn injected_eio_and_short_reads_are_errors_and_the_engine_goes_on() {
    let dir = TempDir::new(&std::env::temp_dir(), "fault");
    let (path, data) = write_file(&dir, "faulty.bin", 8 * ALIGN);
    let io = IoEngine::new(IoConfig::default()).unwrap();
    let id = io.open(&path, OpenOptions::default()).unwrap();
    io.set_fault_plan(
        FaultPlan::new()
            .with(1, Fault::Eio)
            .with(2, Fault::ShortRead),
    );
    assert_eq!(&io.read_at(id, 0, ALIGN).unwrap()[..], &data[..ALIGN]);
    let e = io.read_at(id, PAGE, ALIGN).unwrap_err();
    match &e {
        IoError::Read {
            path: p,
            offset,
            source,
            ..
        } => {
            assert_eq!((p.as_path(), *offset), (path.as_path(), PAGE));
            assert_eq!(source.raw_os_error(), Some(libc_eio()));
        }
        other => panic!("expected a read error, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("faulty.bin") && msg.contains("offset 4096"),
        "{msg}"
    );
    let e = io.read_at(id, 2 * PAGE, 2 * ALIGN).unwrap_err();
    assert!(
        matches!(
            e,
            IoError::ShortRead {
                offset: 8192,
                wanted: 8192,
                got: 4096,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("faulty.bin"));
    // Later reads, including through the completion queue, succeed.
    assert_eq!(
        &io.read_at(id, 3 * PAGE, ALIGN).unwrap()[..],
        &data[3 * ALIGN..4 * ALIGN]
    );
    io.submit(ReadRequest {
        file: id,
        offset: 7 * PAGE,
        len: ALIGN,
        tag: 1,
    })
    .unwrap();
    let c = io
        .completions()
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    assert_eq!(&c.result.unwrap()[..], &data[7 * ALIGN..]);
    // A real short read: past the end of the file.
    let e = io.read_at(id, 7 * PAGE, 2 * ALIGN).unwrap_err();
    assert!(matches!(e, IoError::ShortRead { got: 4096, .. }), "{e:?}");
    let e = io.read_sequential(id, 4 * PAGE, 8 * ALIGN).unwrap_err();
    assert!(matches!(e, IoError::ShortRead { .. }), "{e:?}");
    let s = io.stats();
    assert_eq!((s.requests, s.errors), (7, 4), "{s:?}");
}

fn libc_eio() -> i32 {
    5 // EIO on Linux, Android and the BSDs
}

#[test]
fn unaligned_and_unknown_requests_are_rejected_at_submission() {
    let dir = TempDir::new(&std::env::temp_dir(), "align");
    let (path, _) = write_file(&dir, "a.bin", 4 * ALIGN);
    let io = IoEngine::new(IoConfig::default()).unwrap();
    let id = io.open(&path, OpenOptions::default()).unwrap();
    let huge = u64::MAX - PAGE + 1;
    let e = io.submit(ReadRequest {
        file: id,
        offset: huge,
        len: ALIGN,
        tag: 0,
    });
    assert!(matches!(e, Err(IoError::OutOfRange { .. })));
    assert!(matches!(
        io.read_sequential(id, huge - PAGE, 2 * ALIGN),
        Err(IoError::OutOfRange { .. })
    ));
    for (offset, len) in [(100, ALIGN), (0, 100), (0, 0), (PAGE, ALIGN + 1)] {
        let e = io
            .submit(ReadRequest {
                file: id,
                offset,
                len,
                tag: 0,
            })
            .unwrap_err();
        assert!(
            matches!(e, IoError::Unaligned { offset: o, len: l, .. } if o == offset && l == len),
            "{e:?}"
        );
        assert!(e.to_string().contains("a.bin"));
        assert!(io.read_sequential(id, offset, len).is_err());
    }
    let other = IoEngine::new(IoConfig::default()).unwrap();
    let id2 = other.open(&path, OpenOptions::default()).unwrap();
    let _ = other.open(&path, OpenOptions::default()).unwrap();
    let unknown = other.open(&path, OpenOptions::default()).unwrap();
    assert_eq!(id2.index(), 0);
    assert!(matches!(
        io.read_at(unknown, 0, ALIGN),
        Err(IoError::UnknownFile(2))
    ));
    assert_eq!(io.stats().requests, 0, "nothing reached the thread");
    assert_eq!(io.in_flight(), 0, "rejected requests hold no slot");
    assert!(matches!(
        IoEngine::new(IoConfig {
            queue_depth: 0,
            ..Default::default()
        }),
        Err(IoError::Config(_))
    ));
    assert!(matches!(
        IoEngine::new(IoConfig {
            max_merge: 1000,
            ..Default::default()
        }),
        Err(IoError::Config(_))
    ));
}

#[test]
fn missing_file_error_names_the_file() {
    let e = IoFile::open("/nonexistent/ufs-io/weights.bin", OpenOptions::default()).unwrap_err();
    assert!(matches!(e, IoError::Open { .. }));
    assert!(
        e.to_string().contains("/nonexistent/ufs-io/weights.bin"),
        "{e}"
    );
}

#[test]
fn stats_count_requests_bytes_and_latency() {
    let dir = TempDir::new(&std::env::temp_dir(), "stats");
    let (path, _) = write_file(&dir, "s.bin", 32 * ALIGN);
    let io = IoEngine::new(IoConfig {
        queue_depth: 1,
        ..Default::default()
    })
    .unwrap();
    let id = io.open(&path, OpenOptions::default()).unwrap();
    for page in 0..10u64 {
        io.read_at(id, page * 3 % 32 * PAGE, ALIGN).unwrap();
    }
    io.read_sequential(id, 0, 32 * ALIGN).unwrap();
    let s = io.stats();
    assert_eq!(s.requests, 11);
    assert_eq!(s.errors, 0);
    assert_eq!(s.bytes_read, (10 + 32) * PAGE);
    assert_eq!(s.reads, 11, "depth 1 never merges; 128 KiB is one chunk");
    assert_eq!(s.merged_requests, 0);
    assert_eq!(s.max_in_flight, 1);
    assert_eq!(s.latency.count(), 11);
    let (p50, p99) = (s.latency.p50_us().unwrap(), s.latency.p99_us().unwrap());
    assert!(p50 <= p99 && p50 >= 2, "{p50} {p99}");
}

#[test]
fn pinning_failure_is_not_an_error() {
    let dir = TempDir::new(&std::env::temp_dir(), "pin");
    let (path, data) = write_file(&dir, "pin.bin", 2 * ALIGN);
    let io = IoEngine::new(IoConfig {
        pin_core: Some(1 << 20),
        ..Default::default()
    })
    .unwrap();
    assert!(!io.is_pinned());
    let id = io.open(&path, OpenOptions::default()).unwrap();
    assert_eq!(&io.read_at(id, PAGE, ALIGN).unwrap()[..], &data[ALIGN..]);
    let io = IoEngine::new(IoConfig {
        pin_core: None,
        ..Default::default()
    })
    .unwrap();
    assert!(!io.is_pinned());
}

/// Pinning to a core the process may run on succeeds (Linux: the first core of our affinity mask).
#[cfg(target_os = "linux")]
#[test]
fn pins_to_an_allowed_core() {
    // SAFETY: cpu_set_t is plain data (all-zero is a valid empty set); sched_getaffinity writes at most
    // size_of::<cpu_set_t>() bytes into it, and CPU_ISSET reads inside it for i < CPU_SETSIZE.
    let core = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .find(|&i| libc::CPU_ISSET(i, &set))
            .expect("some allowed core")
    };
    let io = IoEngine::new(IoConfig {
        pin_core: Some(core),
        ..Default::default()
    })
    .unwrap();
    assert!(io.is_pinned(), "could not pin to allowed core {core}");
}

/// Scattered pages queued behind a delayed request, read with kernel AIO (`async_io`, the default) or
/// with one pread at a time; both return the file's bytes, and only AIO has more than one read in the
/// device at once. Runs on `CARGO_TARGET_TMPDIR` (the build disk), which must accept `O_DIRECT`.
/// On x86_64 Linux (the CI machine) the kernel must grant the AIO context; elsewhere (qemu-user, which
/// does not emulate the AIO system calls) an engine without one must read correctly with `pread`.
#[cfg(target_os = "linux")]
#[test]
fn async_io_puts_many_reads_in_the_device_and_returns_the_same_bytes() {
    let dir = TempDir::new(Path::new(env!("CARGO_TARGET_TMPDIR")), "aio");
    let (path, data) = write_file(&dir, "aio.bin", 256 * ALIGN);
    for async_io in [true, false] {
        let io = IoEngine::new(IoConfig {
            queue_depth: 32,
            async_io,
            ..Default::default()
        })
        .unwrap();
        let id = io.open(&path, OpenOptions::default()).unwrap();
        if cfg!(target_arch = "x86_64") {
            assert_eq!(io.is_async(), async_io, "io_setup refused on x86_64 Linux");
        }
        let async_io = io.is_async();
        assert!(
            io.file(id).unwrap().is_direct(),
            "{} refused O_DIRECT: this test needs a disk filesystem",
            path.display()
        );
        // Request 0 holds the I/O thread, so the 31 after it are taken as one batch.
        io.set_fault_plan(FaultPlan::new().with(0, Fault::Delay(Duration::from_millis(200))));
        // Every 7th page from page 3: no two touch, so none are coalesced.
        let pages: Vec<u64> = (0..31).map(|i| 3 + 7 * i).chain([0]).collect();
        let mut order = pages.clone();
        order.rotate_right(1); // the delayed page 0 first
        for &page in &order {
            io.submit(ReadRequest {
                file: id,
                offset: page * PAGE,
                len: ALIGN,
                tag: page,
            })
            .unwrap();
        }
        for _ in 0..pages.len() {
            let c = io
                .completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            let at = c.tag as usize * ALIGN;
            assert_eq!(
                &c.result.unwrap()[..],
                &data[at..at + ALIGN],
                "page {}",
                c.tag
            );
        }
        let s = io.stats();
        assert_eq!(
            (s.requests, s.errors, s.merged_requests),
            (32, 0, 0),
            "{s:?}"
        );
        if async_io {
            assert_eq!(s.async_reads, 31, "{s:?}");
            assert!(s.max_device_depth > 1, "{s:?}");
        } else {
            assert_eq!((s.async_reads, s.max_device_depth), (0, 1), "{s:?}");
        }
        // A read reaching past the end of the file fails alone; its neighbour is whole.
        for (tag, page) in [(1u64, 255u64), (2, 256)] {
            io.submit(ReadRequest {
                file: id,
                offset: page * PAGE,
                len: if page == 255 { ALIGN } else { 2 * ALIGN },
                tag,
            })
            .unwrap();
        }
        for _ in 0..2 {
            let c = io
                .completions()
                .recv_timeout(Duration::from_secs(10))
                .unwrap();
            match c.tag {
                1 => assert_eq!(&c.result.unwrap()[..], &data[255 * ALIGN..]),
                _ => assert!(
                    matches!(c.result, Err(IoError::ShortRead { got: 0, .. })),
                    "{:?}",
                    c.result
                ),
            }
        }
    }
}

#[test]
fn read_into_reuses_a_buffer_stops_at_the_end_and_refuses_misalignment() {
    for base in bases() {
        let dir = TempDir::new(&base, "into");
        // Ten pages and a half: the last aligned window runs past the end.
        let len = 10 * ALIGN + ALIGN / 2;
        let (path, data) = write_file(&dir, "w.bin", len);
        for direct in [true, false] {
            let f = IoFile::open(
                &path,
                OpenOptions {
                    direct,
                    drop_cache: true,
                },
            )
            .unwrap();
            let mut buf = ufs_io::AlignedBuf::new(4 * ALIGN).unwrap();
            for page in [0u64, 3, 6] {
                let got = f.read_into(page * PAGE, &mut buf).unwrap();
                assert_eq!(got, 4 * ALIGN);
                let at = (page * PAGE) as usize;
                assert!(
                    buf[..] == data[at..at + 4 * ALIGN],
                    "page {page}, direct {direct}"
                );
            }
            // From page 8: two and a half pages are left.
            let got = f.read_into(8 * PAGE, &mut buf).unwrap();
            assert_eq!(got, 2 * ALIGN + ALIGN / 2);
            assert!(buf[..got] == data[8 * ALIGN..]);
            assert!(matches!(
                f.read_into(100, &mut buf),
                Err(IoError::Unaligned { .. })
            ));
            assert!(matches!(
                f.read_into(0, &mut buf[..100]),
                Err(IoError::Unaligned { .. })
            ));
            assert!(matches!(
                f.read_into(0, &mut buf[ALIGN / 2..ALIGN / 2 + ALIGN]),
                Err(IoError::Unaligned { .. })
            ));
        }
    }
}
