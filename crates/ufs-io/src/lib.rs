//! `ufs-io`: reads of weight files from flash, the way PowerInfer-2 does them on phones.
//!
//! UFS storage has a single command queue and small random reads are slow unless the page cache is out
//! of the way, so every read of a weight file goes through `O_DIRECT` into 4 KiB-aligned buffers
//! ([`AlignedBuf`]), issued by **one** dedicated I/O thread ([`IoEngine`]) that can be pinned to a chosen
//! core. Requests carry a caller tag and complete on a channel; neighbouring page requests waiting in the
//! queue are coalesced into one larger read (up to 512 KiB by default) and split back per request.
//!
//! # Example
//!
//! ```no_run
//! use ufs_io::{IoConfig, IoEngine, OpenOptions, ReadRequest};
//!
//! let io = IoEngine::new(IoConfig { queue_depth: 32, pin_core: Some(0), ..Default::default() })?;
//! let weights = io.open("model.neurons", OpenOptions::default())?;
//! for (tag, page) in [(7u64, 3u64), (8, 4), (9, 100)] {
//!     io.submit(ReadRequest { file: weights, offset: page * 4096, len: 4096, tag })?;
//! }
//! for _ in 0..3 {
//!     let c = io.completions().recv().expect("engine alive");
//!     let bytes = c.result?; // errors name the file and offset
//!     println!("tag {} -> {} bytes in {:?}", c.tag, bytes.len(), c.latency);
//! }
//! let hot = io.read_sequential(weights, 0, 8 << 20)?; // 8 MiB in 512 KiB chunks
//! println!("p99 {:?} µs, {} requests merged", io.stats().latency.p99_us(), io.stats().merged_requests);
//! # drop(hot);
//! # Ok::<(), ufs_io::IoError>(())
//! ```
//!
//! # Invariants
//!
//! * **Only this crate (and `model-format`'s memory maps) reads weight files.** Everything above works on
//!   byte buffers.
//! * **Alignment is checked, never assumed.** Offsets and lengths are multiples of [`ALIGN`] (4096) in
//!   every mode (direct or not); anything else is rejected at submission with [`IoError::Unaligned`]
//!   (requests are not silently widened).
//! * **Direct I/O degrades, it does not fail.** If the filesystem refuses `O_DIRECT` (`EINVAL` at open or
//!   on a probe read, e.g. tmpfs), the file is read buffered, optionally with `posix_fadvise(DONTNEED)`,
//!   with a one-line warning on stderr once per process; [`IoFile::is_direct`] reports the mode.
//! * **No panics on I/O.** `EIO`, short reads and reads past the end come back as [`IoError`]s naming the
//!   file and offset, and the engine keeps serving later requests. [`FaultPlan`] injects such faults.
//! * **At most `queue_depth` requests are in flight**; one thread performs all reads, in batches sorted by
//!   file and offset (the coalescing rule is documented on [`IoEngine`]). With
//!   [`IoConfig::async_io`] (the default) that thread hands the reads of direct files to the kernel
//!   with Linux AIO, so the device sees up to `queue_depth` reads at once, still from one thread; without
//!   it, or where the kernel refuses AIO, the device sees one `pread` at a time. Only that thread calls
//!   `io_submit`, and a buffer given to the kernel is not touched or freed until its completion is reaped:
//!   the private `aio` module's safe wrapper takes each buffer (and its file) by value at submission and
//!   gives it back only with its completion; the raw system calls are alone in `aio/sys.rs`.
//! * Pinning failure (`sched_setaffinity`, Linux/Android only) is a warning, not an error.

mod aio;
mod buf;
mod engine;
mod error;
mod file;
mod stats;

pub use buf::AlignedBuf;
pub use engine::{
    Completion, Fault, FaultPlan, FileId, IoConfig, IoEngine, ReadRequest, DEFAULT_CHUNK,
};
pub use error::{IoError, Result};
pub use file::{IoFile, OpenOptions};
pub use stats::{LatencyHistogram, Stats, BUCKETS};

/// Alignment of offsets, lengths and buffers for direct I/O: 4096 bytes.
pub const ALIGN: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_o_direct_refusal_falls_back_to_buffered() {
        let dir = std::env::temp_dir().join(format!("ufs-io-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fallback.bin");
        let data: Vec<u8> = (0..3 * ALIGN).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = IoFile::open_inner(
            &path,
            OpenOptions {
                direct: true,
                drop_cache: true,
            },
            true,
        )
        .unwrap();
        assert!(!f.is_direct());
        assert_eq!(&f.read_at(4096, 8192).unwrap()[..], &data[4096..]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
