//! Criterion benchmarks of `ufs-io` reads on a 256 MiB file under Cargo's target dir (a real disk, so
//! `O_DIRECT` keeps the page cache out of play; the bench prints the mode it got):
//!
//! * `rand4k_qd1`: one 4 KiB read at a random aligned offset, waited for (`read_at`);
//! * `rand4k_qd32`: 256 random 4 KiB reads kept 32 in flight through `submit`/`completions`, handed to
//!   the kernel with AIO (the default, [`IoConfig::async_io`]); `rand4k_qd32_pread`: the same with
//!   `async_io: false` (the I/O thread issues one `pread` at a time), in the same run;
//! * `seq512k`: 512 KiB reads at consecutive offsets (`read_at`), and `seq8m`: 8 MiB `read_sequential`
//!   calls (16 chunks of 512 KiB); `seq8m_reuse`: the same into one reused buffer (`read_sequential_into`).
//!
//! Throughput is in bytes (IOPS = bytes/s ÷ 4096). Compare with `fio` using `benches/fio.sh` (same
//! file, same shapes). Run: `cargo bench -p ufs-io --bench iobench -- --warm-up-time 1 --measurement-time 3`.

#![allow(missing_docs)]

use std::io::Write;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ufs_io::{FileId, IoConfig, IoEngine, OpenOptions, ReadRequest, ALIGN};

const FILE_LEN: u64 = 256 << 20;
const PAGES: u64 = FILE_LEN / ALIGN as u64;

fn bench_file() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ufs-io-bench-256m.bin");
    if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(FILE_LEN) {
        let mut f = std::fs::File::create(&path).expect("create bench file");
        let mut block = vec![0u8; 1 << 20];
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        for mb in 0..FILE_LEN >> 20 {
            for chunk in block.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&(x ^ mb).to_le_bytes());
            }
            f.write_all(&block).expect("write bench file");
        }
        f.sync_all().expect("sync bench file");
    }
    path
}

struct Rng(u64);
impl Rng {
    fn page(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % PAGES
    }
}

fn open(depth: usize, async_io: bool) -> (IoEngine, FileId) {
    let io = IoEngine::new(IoConfig {
        queue_depth: depth,
        async_io,
        ..Default::default()
    })
    .expect("engine");
    let id = io
        .open(bench_file(), OpenOptions::default())
        .expect("open bench file");
    (io, id)
}

fn benches(c: &mut Criterion) {
    let (io, id) = open(1, true);
    eprintln!(
        "ufs-io bench: O_DIRECT {}",
        if io.file(id).unwrap().is_direct() {
            "on"
        } else {
            "REFUSED (buffered)"
        }
    );
    let mut g = c.benchmark_group("ufs_io");

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    g.throughput(Throughput::Bytes(ALIGN as u64));
    g.bench_function("rand4k_qd1", |b| {
        b.iter(|| io.read_at(id, rng.page() * ALIGN as u64, ALIGN).unwrap())
    });
    let lat = io.stats().latency;
    eprintln!(
        "rand4k_qd1 latency p50 {:?} µs, p99 {:?} µs",
        lat.p50_us(),
        lat.p99_us()
    );

    const BATCH: u64 = 256;
    g.throughput(Throughput::Bytes(BATCH * ALIGN as u64));
    for (name, async_io) in [("rand4k_qd32", true), ("rand4k_qd32_pread", false)] {
        let (io32, id32) = open(32, async_io);
        g.bench_function(name, |b| {
            b.iter(|| {
                let (mut sent, mut done) = (0, 0);
                while done < BATCH {
                    while sent < BATCH && io32.in_flight() < 32 {
                        let req = ReadRequest {
                            file: id32,
                            offset: rng.page() * ALIGN as u64,
                            len: ALIGN,
                            tag: sent,
                        };
                        io32.submit(req).unwrap();
                        sent += 1;
                    }
                    io32.completions().recv().unwrap().result.unwrap();
                    done += 1;
                }
            })
        });
        let s = io32.stats();
        eprintln!(
            "{name}: {} requests, {} merged, max in flight {}, max in the device {}, {} async reads",
            s.requests, s.merged_requests, s.max_in_flight, s.max_device_depth, s.async_reads
        );
    }

    const SEQ: usize = 512 * 1024;
    let mut at = 0u64;
    g.throughput(Throughput::Bytes(SEQ as u64));
    g.bench_function("seq512k", |b| {
        b.iter(|| {
            let buf = io.read_at(id, at, SEQ).unwrap();
            at = (at + SEQ as u64) % FILE_LEN;
            buf
        })
    });

    const BIG: usize = 8 << 20;
    let mut at = 0u64;
    g.throughput(Throughput::Bytes(BIG as u64));
    g.bench_function("seq8m", |b| {
        b.iter(|| {
            let buf = io.read_sequential(id, at, BIG).unwrap();
            at = (at + BIG as u64) % FILE_LEN;
            buf
        })
    });
    let mut buf = Some(ufs_io::AlignedBuf::new(BIG).unwrap());
    g.bench_function("seq8m_reuse", |b| {
        b.iter(|| {
            buf = Some(
                io.read_sequential_into(id, at, buf.take().unwrap())
                    .unwrap(),
            );
            at = (at + BIG as u64) % FILE_LEN;
        })
    });
    g.finish();
}

criterion_group!(iobench, benches);
criterion_main!(iobench);
