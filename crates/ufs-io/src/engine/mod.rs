//! [`IoEngine`]: one I/O thread, a bounded number of requests in flight, coalescing and stats.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::aio::Aio;
use crate::file::sys;
use crate::{AlignedBuf, IoError, IoFile, OpenOptions, Result, Stats, ALIGN};

mod worker;

use worker::Worker;

/// Default largest coalesced read and sequential chunk: 512 KiB.
pub const DEFAULT_CHUNK: usize = 512 * 1024;

/// Settings of an [`IoEngine`] (its queue depth, pinning, coalescing and AIO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoConfig {
    /// Most requests in flight (submitted, not yet completed). `submit` blocks and `try_submit` fails
    /// with [`IoError::QueueFull`] beyond it. At least 1.
    pub queue_depth: usize,
    /// Core to pin the I/O thread to (`sched_setaffinity`); failure is a warning on stderr.
    pub pin_core: Option<usize>,
    /// Largest read that coalescing may build, in bytes (multiple of 4096, at least 4096).
    pub max_merge: usize,
    /// Chunk size of [`IoEngine::read_sequential`] (multiple of 4096, at least 4096).
    pub seq_chunk: usize,
    /// Hand the reads of `O_DIRECT` files to the kernel with Linux AIO, so that the device sees up to
    /// `queue_depth` reads at once, still from the one I/O thread. Where the kernel refuses AIO
    /// (`io_setup` fails: another OS, a seccomp policy), or with `false`, the thread reads with one
    /// blocking `pread` at a time. Buffered files and fault-injected requests always use `pread`.
    pub async_io: bool,
}

impl Default for IoConfig {
    /// Depth 32, unpinned, 512 KiB merges and chunks, kernel asynchronous reads.
    fn default() -> Self {
        Self {
            queue_depth: 32,
            pin_core: None,
            max_merge: DEFAULT_CHUNK,
            seq_chunk: DEFAULT_CHUNK,
            async_io: true,
        }
    }
}

/// A file registered with an engine ([`IoEngine::add_file`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u32);

impl FileId {
    /// Index of the file in its engine, in registration order.
    pub fn index(self) -> u32 {
        self.0
    }
}

/// One read: `len` bytes at `offset` of `file`, both multiples of 4096. `tag` comes back in the
/// [`Completion`] and is the caller's to choose (e.g. a packed neuron id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// The file.
    pub file: FileId,
    /// First byte, a multiple of 4096.
    pub offset: u64,
    /// Bytes, a non-zero multiple of 4096.
    pub len: usize,
    /// Caller's identifier, returned in the completion.
    pub tag: u64,
}

/// The outcome of a submitted [`ReadRequest`].
#[derive(Debug)]
pub struct Completion {
    /// The request's tag.
    pub tag: u64,
    /// The request's file.
    pub file: FileId,
    /// The request's offset.
    pub offset: u64,
    /// The bytes (exactly the requested length), or an error naming the file and offset.
    pub result: Result<AlignedBuf>,
    /// Time from submission to completion.
    pub latency: Duration,
}

/// One injected fault (see [`FaultPlan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The request fails with `EIO` without reading.
    Eio,
    /// The request reads, then reports that only half its bytes (rounded down to 4096) arrived.
    ShortRead,
    /// The I/O thread sleeps this long before serving the request (tests of queueing and coalescing).
    Delay(Duration),
}

/// Faults to inject, by request number: request `n` is the `n`-th (0-based) request submitted after
/// [`IoEngine::set_fault_plan`], `read_sequential` calls included (a faulted sequential read fails as a
/// whole: `Eio` before reading, `ShortRead` after its first half). A faulted request is never coalesced
/// with others, so the fault hits exactly that request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    faults: HashMap<u64, Fault>,
}

impl FaultPlan {
    /// No faults.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds `fault` for request number `n`.
    pub fn with(mut self, n: u64, fault: Fault) -> Self {
        self.faults.insert(n, fault);
        self
    }
}

enum Reply {
    Shared,
    Private(Sender<Completion>),
}

struct Pending {
    req: ReadRequest,
    path_file: Arc<IoFile>,
    submitted: Instant,
    fault: Option<Fault>,
    reply: Reply,
}

enum Op {
    Read(Pending),
    Sequential {
        file: Arc<IoFile>,
        offset: u64,
        len: usize,
        buf: Option<AlignedBuf>,
        submitted: Instant,
        fault: Option<Fault>,
        reply: Sender<Result<AlignedBuf>>,
    },
}

struct FaultState {
    base: u64,
    plan: FaultPlan,
}

struct Shared {
    files: RwLock<Vec<Arc<IoFile>>>,
    in_flight: Mutex<usize>,
    room: Condvar,
    stats: Mutex<Stats>,
    faults: Mutex<FaultState>,
    submitted: AtomicU64,
}

/// The I/O engine: one thread that performs every read, fed by a submission queue.
///
/// Requests are validated (file id, alignment) when submitted, so such errors come back at once; read
/// errors come back in the [`Completion`]. Completions of [`IoEngine::submit`] arrive on
/// [`IoEngine::completions`], in no promised order (match them by tag). `IoEngine` is `Sync`: several
/// threads may submit through a shared reference. Dropping it finishes the queued requests and joins the
/// thread.
///
/// **Coalescing rule.** The thread takes the first waiting request, then every other request already in
/// the queue (at most `queue_depth` in all), sorts them by (file, offset) and merges runs whose ranges
/// touch or overlap (`next.offset <= end of run`) while the merged read stays within `max_merge` bytes.
/// Each run is one read; its bytes are copied back out per request. If a merged read fails, its
/// requests are retried one by one, so one bad page does not fail its neighbours. A read that stops at
/// the end of the file fails only the requests that reach past it.
///
/// **Device queue.** With [`IoConfig::async_io`] the thread submits every run of a batch to the
/// kernel at once (Linux AIO on the `O_DIRECT` file), completes runs as the kernel reports them, and
/// takes newly queued requests between completions, so up to `queue_depth` reads are in the device
/// at once ([`Stats::max_device_depth`]); otherwise it issues one `pread` per run, in offset order.
pub struct IoEngine {
    shared: Arc<Shared>,
    tx: Option<Sender<Op>>,
    done_rx: Receiver<Completion>,
    thread: Option<JoinHandle<()>>,
    config: IoConfig,
    pinned: bool,
    is_async: bool,
}

impl IoEngine {
    /// Starts the I/O thread (pinned to `config.pin_core` if given and possible).
    pub fn new(config: IoConfig) -> Result<Self> {
        if config.queue_depth == 0 {
            return Err(IoError::Config("queue_depth must be at least 1".into()));
        }
        for (name, v) in [
            ("max_merge", config.max_merge),
            ("seq_chunk", config.seq_chunk),
        ] {
            if v < ALIGN || v % ALIGN != 0 {
                return Err(IoError::Config(format!(
                    "{name} = {v} must be a positive multiple of 4096"
                )));
            }
        }
        let shared = Arc::new(Shared {
            files: RwLock::new(Vec::new()),
            in_flight: Mutex::new(0),
            room: Condvar::new(),
            stats: Mutex::new(Stats::default()),
            faults: Mutex::new(FaultState {
                base: 0,
                plan: FaultPlan::default(),
            }),
            submitted: AtomicU64::new(0),
        });
        let (tx, rx) = channel::unbounded::<Op>();
        let (done_tx, done_rx) = channel::unbounded();
        let (pin_tx, pin_rx) = channel::bounded(1);
        let worker = Worker {
            shared: shared.clone(),
            done: done_tx,
            config: config.clone(),
            spare: Mutex::new(Vec::new()),
        };
        let pin_core = config.pin_core;
        let (async_io, depth) = (config.async_io, config.queue_depth);
        let thread = std::thread::Builder::new()
            .name("ufs-io".into())
            .spawn(move || {
                let pinned = match pin_core {
                    None => false,
                    Some(core) => match sys::pin_current_thread(core) {
                        Ok(()) => true,
                        Err(e) => {
                            eprintln!("ufs-io: warning: could not pin the I/O thread to core {core}: {e}");
                            false
                        }
                    },
                };
                let aio = if async_io {
                    match Aio::new(depth) {
                        Ok(aio) => Some(aio),
                        Err(e) => {
                            if !NO_AIO_WARNED.swap(true, Ordering::Relaxed) {
                                eprintln!(
                                    "ufs-io: warning: kernel asynchronous I/O unavailable ({e}); reading with one pread at a time"
                                );
                            }
                            None
                        }
                    }
                } else {
                    None
                };
                let _ = pin_tx.send((pinned, aio.is_some()));
                worker.run(rx, aio);
            })
            .map_err(IoError::Spawn)?;
        let (pinned, is_async) = pin_rx.recv().unwrap_or((false, false));
        Ok(Self {
            shared,
            tx: Some(tx),
            done_rx,
            thread: Some(thread),
            config,
            pinned,
            is_async,
        })
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &IoConfig {
        &self.config
    }

    /// Whether the I/O thread hands reads to the kernel asynchronously: [`IoConfig::async_io`] was
    /// asked for and the kernel accepted an AIO context. Otherwise it reads with one `pread` at a time.
    pub fn is_async(&self) -> bool {
        self.is_async
    }

    /// Whether the I/O thread is pinned to `pin_core`.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// Registers an open file; requests name it by the returned id.
    pub fn add_file(&self, file: IoFile) -> FileId {
        let mut files = self.shared.files.write();
        files.push(Arc::new(file));
        FileId(files.len() as u32 - 1)
    }

    /// Opens and registers `path`.
    pub fn open(&self, path: impl AsRef<Path>, opts: OpenOptions) -> Result<FileId> {
        Ok(self.add_file(IoFile::open(path, opts)?))
    }

    /// A registered file.
    pub fn file(&self, id: FileId) -> Result<Arc<IoFile>> {
        self.shared
            .files
            .read()
            .get(id.0 as usize)
            .cloned()
            .ok_or(IoError::UnknownFile(id.0))
    }

    /// Installs a fault plan; request numbers count from the next submission. Replaces any earlier plan.
    pub fn set_fault_plan(&self, plan: FaultPlan) {
        let mut f = self.shared.faults.lock();
        f.base = self.shared.submitted.load(Ordering::SeqCst);
        f.plan = plan;
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats.lock().clone()
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        *self.shared.in_flight.lock()
    }

    /// Completions of [`IoEngine::submit`] / [`IoEngine::try_submit`].
    pub fn completions(&self) -> &Receiver<Completion> {
        &self.done_rx
    }

    /// Queues a read, waiting while `queue_depth` requests are in flight.
    pub fn submit(&self, req: ReadRequest) -> Result<()> {
        self.submit_inner(req, Reply::Shared, true)
    }

    /// Queues a read, or fails with [`IoError::QueueFull`] if `queue_depth` requests are in flight.
    pub fn try_submit(&self, req: ReadRequest) -> Result<()> {
        self.submit_inner(req, Reply::Shared, false)
    }

    /// Reads `len` bytes at `offset` through the I/O thread and waits for them (blocking convenience; the
    /// completion does not appear on [`IoEngine::completions`]).
    pub fn read_at(&self, file: FileId, offset: u64, len: usize) -> Result<AlignedBuf> {
        let (tx, rx) = channel::bounded(1);
        self.submit_inner(
            ReadRequest {
                file,
                offset,
                len,
                tag: 0,
            },
            Reply::Private(tx),
            true,
        )?;
        rx.recv().map_err(|_| IoError::Stopped)?.result
    }

    /// Reads a large aligned range (e.g. a layer's hot region) into one new buffer, in `seq_chunk` pieces,
    /// as one request (it takes one queue slot and is not coalesced). Waits for the result.
    pub fn read_sequential(&self, file: FileId, offset: u64, len: usize) -> Result<AlignedBuf> {
        self.sequential(file, offset, len, None)
    }

    /// [`IoEngine::read_sequential`] of `buf.len()` bytes into `buf` (moved to the I/O thread and back),
    /// so that repeated prefetches reuse one allocation. On error the buffer is dropped.
    pub fn read_sequential_into(
        &self,
        file: FileId,
        offset: u64,
        buf: AlignedBuf,
    ) -> Result<AlignedBuf> {
        self.sequential(file, offset, buf.len(), Some(buf))
    }

    fn sequential(
        &self,
        file: FileId,
        offset: u64,
        len: usize,
        buf: Option<AlignedBuf>,
    ) -> Result<AlignedBuf> {
        let f = self.file(file)?;
        f.check_aligned(offset, len)?;
        self.acquire_slot(true)?;
        let fault = self.next_fault();
        let (tx, rx) = channel::bounded(1);
        let op = Op::Sequential {
            file: f,
            offset,
            len,
            buf,
            submitted: Instant::now(),
            fault,
            reply: tx,
        };
        self.send(op)?;
        rx.recv().map_err(|_| IoError::Stopped)?
    }

    fn acquire_slot(&self, block: bool) -> Result<()> {
        let mut n = self.shared.in_flight.lock();
        while *n >= self.config.queue_depth {
            if !block {
                return Err(IoError::QueueFull {
                    depth: self.config.queue_depth,
                });
            }
            self.shared.room.wait(&mut n);
        }
        *n += 1;
        let now = *n;
        drop(n);
        let mut s = self.shared.stats.lock();
        s.max_in_flight = s.max_in_flight.max(now);
        Ok(())
    }

    fn send(&self, op: Op) -> Result<()> {
        let sent = self
            .tx
            .as_ref()
            .map(|tx| tx.send(op).is_ok())
            .unwrap_or(false);
        if !sent {
            release(&self.shared, 1);
            return Err(IoError::Stopped);
        }
        Ok(())
    }

    /// Numbers the next request and returns the fault the plan has for it.
    fn next_fault(&self) -> Option<Fault> {
        let f = self.shared.faults.lock();
        let seq = self.shared.submitted.fetch_add(1, Ordering::SeqCst);
        seq.checked_sub(f.base)
            .and_then(|n| f.plan.faults.get(&n).copied())
    }

    fn submit_inner(&self, req: ReadRequest, reply: Reply, block: bool) -> Result<()> {
        let file = self.file(req.file)?;
        file.check_aligned(req.offset, req.len)?;
        self.acquire_slot(block)?;
        let fault = self.next_fault();
        self.send(Op::Read(Pending {
            req,
            path_file: file,
            submitted: Instant::now(),
            fault,
            reply,
        }))
    }
}

impl Drop for IoEngine {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

static NO_AIO_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn release(shared: &Shared, n: usize) {
    let mut f = shared.in_flight.lock();
    *f = f.saturating_sub(n);
    drop(f);
    shared.room.notify_all();
}
