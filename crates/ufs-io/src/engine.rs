//! [`IoEngine`]: one I/O thread, a bounded number of requests in flight, coalescing and stats.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::aio::{Aio, AioDone, AioRead};
use crate::file::sys;
use crate::{AlignedBuf, IoError, IoFile, OpenOptions, Result, Stats, ALIGN};

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

fn release(shared: &Shared, n: usize) {
    let mut f = shared.in_flight.lock();
    *f = f.saturating_sub(n);
    drop(f);
    shared.room.notify_all();
}

struct Worker {
    shared: Arc<Shared>,
    done: Sender<Completion>,
    config: IoConfig,
    /// Buffers of coalesced reads whose bytes were copied out to their requests, kept for the next
    /// ones ([`SPARE_BUFS`] at most, each of `max_merge` bytes): a new synchronous one is zeroed, and the I/O
    /// thread shares the cores with the compute threads (zeroing and copying were 10% of a 2-core
    /// offloaded decode's cycles).
    spare: Mutex<Vec<AlignedBuf>>,
}

/// Most buffers [`Worker::spare`] keeps.
const SPARE_BUFS: usize = 4;

/// A coalesced read: requests whose ranges touch, served by one read of `start..end` of their file.
struct Run {
    reqs: Vec<Pending>,
    start: u64,
    end: u64,
}

impl Run {
    /// The file all its requests read (runs are never empty).
    fn file(&self) -> &Arc<IoFile> {
        &self.reqs[0].path_file
    }
}

static NO_AIO_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Worker {
    fn run(&self, rx: Receiver<Op>, aio: Option<Aio<Run>>) {
        match aio {
            Some(aio) => self.run_async(rx, aio),
            None => self.run_sync(&rx),
        }
    }

    /// The I/O thread without AIO: one `pread` per run, in offset order.
    fn run_sync(&self, rx: &Receiver<Op>) {
        while let Ok(first) = rx.recv() {
            let (reads, seqs) = self.take(rx, first);
            for run in self.plan_runs(reads) {
                self.serve_run(run);
            }
            for s in seqs {
                self.serve_sequential(s);
            }
        }
    }

    /// `first` and whatever else is queued (at most `queue_depth` operations), split into reads and
    /// sequential reads.
    fn take(&self, rx: &Receiver<Op>, first: Op) -> (Vec<Pending>, Vec<Op>) {
        let mut reads = Vec::new();
        let mut seqs = Vec::new();
        let mut push = |op| match op {
            Op::Read(p) => reads.push(p),
            s @ Op::Sequential { .. } => seqs.push(s),
        };
        push(first);
        let mut taken = 1;
        while taken < self.config.queue_depth {
            match rx.try_recv() {
                Ok(op) => push(op),
                Err(_) => break,
            }
            taken += 1;
        }
        (reads, seqs)
    }

    /// The coalescing rule of [`IoEngine`]: sort by (file, offset), merge touching ranges within
    /// `max_merge`; faulted requests stay alone.
    fn plan_runs(&self, mut reads: Vec<Pending>) -> Vec<Run> {
        reads.sort_by_key(|p| (p.req.file, p.req.offset));
        let mut runs: Vec<Run> = Vec::new();
        for p in reads {
            let p_end = p.req.offset + p.req.len as u64;
            if let Some(run) = runs.last_mut() {
                let last = run.reqs.last().expect("runs are non-empty");
                let joins = last.fault.is_none()
                    && p.fault.is_none()
                    && last.req.file == p.req.file
                    && p.req.offset <= run.end
                    && (p_end.max(run.end) - run.start) as usize <= self.config.max_merge;
                if joins {
                    run.end = run.end.max(p_end);
                    run.reqs.push(p);
                    continue;
                }
            }
            runs.push(Run {
                start: p.req.offset,
                end: p_end,
                reqs: vec![p],
            });
        }
        runs
    }

    /// The I/O thread with a kernel AIO context: submit the runs of each batch at once, complete them as
    /// the kernel reports them, take new requests in between. `aio` owns each submitted run and its
    /// buffer until the kernel is done with it.
    fn run_async(&self, rx: Receiver<Op>, mut aio: Aio<Run>) {
        let mut open = true;
        loop {
            let first = if aio.outstanding() == 0 {
                match rx.recv() {
                    Ok(op) => Some(op),
                    Err(_) => break,
                }
            } else if open {
                match rx.try_recv() {
                    Ok(op) => Some(op),
                    Err(channel::TryRecvError::Empty) => None,
                    Err(channel::TryRecvError::Disconnected) => {
                        open = false;
                        None
                    }
                }
            } else {
                None
            };
            if let Some(first) = first {
                let (reads, seqs) = self.take(&rx, first);
                let mut sync_runs = Vec::new();
                let mut async_reads = Vec::new();
                for run in self.plan_runs(reads) {
                    let file = run.file().clone();
                    let eligible = file.is_direct() && run.reqs.iter().all(|p| p.fault.is_none());
                    let buf = if eligible {
                        self.run_buf(&run, true)
                    } else {
                        None
                    };
                    let Some(buf) = buf else {
                        sync_runs.push(run);
                        continue;
                    };
                    async_reads.push(AioRead {
                        file,
                        offset: run.start,
                        buf,
                        tag: run,
                    });
                }
                sync_runs.extend(self.submit_async(&mut aio, async_reads));
                for run in sync_runs {
                    self.serve_run(run);
                }
                for s in seqs {
                    self.serve_sequential(s);
                }
            }
            if aio.outstanding() > 0 {
                match aio.wait(1) {
                    Ok(done) => {
                        for d in done {
                            self.finish_async(d);
                        }
                    }
                    Err(e) => {
                        // Cannot happen with a valid context; if it does, the kernel may still write
                        // into the in-flight buffers, so `abandon` leaks them, never frees them, and
                        // their requests are read again with pread, as is everything after.
                        eprintln!("ufs-io: warning: io_getevents failed ({e}); reading with pread from now on");
                        for run in aio.abandon() {
                            self.serve_run(run);
                        }
                        return self.run_sync(&rx);
                    }
                }
            } else if !open {
                break;
            }
        }
    }

    /// Hands the reads to the kernel and returns the runs of those it did not take.
    fn submit_async(&self, aio: &mut Aio<Run>, reads: Vec<AioRead<Run>>) -> Vec<Run> {
        if reads.is_empty() {
            return Vec::new();
        }
        let n = reads.len();
        let rest = aio.submit(reads);
        if rest.len() < n {
            let mut s = self.shared.stats.lock();
            s.max_device_depth = s.max_device_depth.max(aio.outstanding());
        }
        rest.into_iter().map(|r| r.tag).collect()
    }

    /// Completes a run whose kernel read has finished with `result` (bytes read, or the OS error).
    fn finish_async(&self, done: AioDone<Run>) {
        let AioDone {
            read:
                AioRead {
                    file,
                    mut buf,
                    tag: run,
                    ..
                },
            result,
        } = done;
        let result = result.and_then(|got| {
            // A short kernel read (the end of the file, or a partial transfer) is finished with pread,
            // which stops at the end of the file. What the kernel did not write is zeroed first
            // (the buffer may not have been).
            if got < buf.len() {
                buf.zero_from(got);
                let more = file.read_full(run.start + got as u64, &mut buf[got..])?;
                Ok(got + more)
            } else {
                Ok(got)
            }
        });
        match result {
            Ok(got) => {
                self.account(run.reqs.len() as u64 - 1, true);
                self.distribute(run, buf, got);
            }
            Err(source) if run.reqs.len() == 1 => {
                self.account(0, true);
                let p = run.reqs.into_iter().next().expect("one request");
                let err = IoError::Read {
                    path: file.path().to_path_buf(),
                    offset: p.req.offset,
                    len: p.req.len,
                    source,
                };
                self.complete(p, Err(err));
            }
            // As in the pread path, a failed merged read is not counted; its requests are, one by one.
            Err(_) => self.retry_each(run.reqs),
        }
    }

    /// Hands out the bytes of a run read into `buf` (`got` of them valid): the buffer itself to a lone
    /// request, a copy of its range to each of several; a request reaching past `got` gets a short read.
    fn distribute(&self, run: Run, buf: AlignedBuf, got: usize) {
        let file = run.file().clone();
        let short = |p: &Pending, lo: usize| IoError::ShortRead {
            path: file.path().to_path_buf(),
            offset: p.req.offset,
            wanted: p.req.len,
            got: got.saturating_sub(lo).min(p.req.len),
        };
        if run.reqs.len() == 1 {
            let p = run.reqs.into_iter().next().expect("one request");
            let result = if got >= p.req.len {
                Ok(buf)
            } else {
                Err(short(&p, 0))
            };
            return self.complete(p, result);
        }
        for p in run.reqs {
            let lo = (p.req.offset - run.start) as usize;
            let hi = lo + p.req.len;
            let result = if hi <= got {
                AlignedBuf::copy_from(&buf[lo..hi])
            } else {
                Err(short(&p, lo))
            };
            self.complete(p, result);
        }
        let mut spare = self.spare.lock();
        if buf.capacity() == self.config.max_merge && spare.len() < SPARE_BUFS {
            spare.push(buf);
        }
    }

    /// A buffer for the read of `run`: for a run of several requests (whose bytes `distribute`
    /// copies out), a spare set to the span where one is kept; else a new one, of the span where
    /// one request takes it whole or `by_kernel` (an asynchronous read fills it, so it is not
    /// zeroed first), of `max_merge` bytes for a synchronous merged read. (A new buffer for the
    /// kernel's merged reads was of `max_merge` bytes, zeroed past the span so that it was whole
    /// as a spare: on the 7B-shaped synthetic bundle that `memset` took 30% of the I/O thread,
    /// more than allocating per read.)
    fn run_buf(&self, run: &Run, by_kernel: bool) -> Option<AlignedBuf> {
        let span = (run.end - run.start) as usize;
        let merged = run.reqs.len() > 1 && span <= self.config.max_merge;
        let spare = if merged {
            self.spare.lock().pop()
        } else {
            None
        };
        let mut buf = match spare {
            Some(b) => b,
            None if by_kernel => {
                // SAFETY: the kernel's read fills it; `finish_async` zeroes whatever the read did
                // not write before any byte is read, and a read not submitted or failed drops it
                // unread. It is whole after that, so `distribute` may keep it as a spare (when its
                // span was `max_merge`).
                return unsafe { AlignedBuf::uninit(span) }.ok();
            }
            None if merged => AlignedBuf::new(self.config.max_merge).ok()?,
            None => return AlignedBuf::new(span).ok(),
        };
        buf.set_len(span).ok()?;
        Some(buf)
    }

    fn serve_run(&self, run: Run) {
        if run.reqs.len() == 1 {
            let p = run.reqs.into_iter().next().expect("one request");
            let result = self.read_one(&p);
            self.account(0, false);
            self.complete(p, result);
            return;
        }
        let file = run.file().clone();
        let mut buf = match self.run_buf(&run, false) {
            Some(b) => b,
            None => return self.retry_each(run.reqs),
        };
        match file.read_full(run.start, &mut buf) {
            Ok(got) => {
                self.account(run.reqs.len() as u64 - 1, false);
                self.distribute(run, buf, got);
            }
            Err(_) => self.retry_each(run.reqs),
        }
    }

    fn retry_each(&self, run: Vec<Pending>) {
        for p in run {
            let result = self.read_one(&p);
            self.account(0, false);
            self.complete(p, result);
        }
    }

    fn read_one(&self, p: &Pending) -> Result<AlignedBuf> {
        let f = &p.path_file;
        let (offset, len) = (p.req.offset, p.req.len);
        let read_err = |source| IoError::Read {
            path: f.path().to_path_buf(),
            offset,
            len,
            source,
        };
        match p.fault {
            Some(Fault::Eio) => return Err(read_err(eio())),
            Some(Fault::Delay(d)) => std::thread::sleep(d),
            _ => {}
        }
        let mut buf = AlignedBuf::new(len)?;
        let mut got = f.read_full(offset, &mut buf).map_err(read_err)?;
        if p.fault == Some(Fault::ShortRead) {
            got = (got / 2) / ALIGN * ALIGN;
        }
        if got < len {
            return Err(IoError::ShortRead {
                path: f.path().to_path_buf(),
                offset,
                wanted: len,
                got,
            });
        }
        Ok(buf)
    }

    fn serve_sequential(&self, op: Op) {
        let Op::Sequential {
            file,
            offset,
            len,
            buf,
            submitted,
            fault,
            reply,
        } = op
        else {
            return;
        };
        let mut chunks = 0;
        let result = (|| {
            match fault {
                Some(Fault::Eio) => {
                    return Err(IoError::Read {
                        path: file.path().to_path_buf(),
                        offset,
                        len,
                        source: eio(),
                    })
                }
                Some(Fault::Delay(d)) => std::thread::sleep(d),
                _ => {}
            }
            let mut buf = match buf {
                Some(b) => b,
                None => AlignedBuf::new(len)?,
            };
            let mut done = 0;
            while done < len {
                let n = self.config.seq_chunk.min(len - done);
                let at = offset + done as u64;
                chunks += 1;
                let got = file
                    .read_full(at, &mut buf[done..done + n])
                    .map_err(|source| IoError::Read {
                        path: file.path().to_path_buf(),
                        offset: at,
                        len: n,
                        source,
                    })?;
                if got < n {
                    return Err(IoError::ShortRead {
                        path: file.path().to_path_buf(),
                        offset: at,
                        wanted: n,
                        got,
                    });
                }
                done += n;
            }
            if fault == Some(Fault::ShortRead) {
                return Err(IoError::ShortRead {
                    path: file.path().to_path_buf(),
                    offset,
                    wanted: len,
                    got: (len / 2) / ALIGN * ALIGN,
                });
            }
            Ok(buf)
        })();
        {
            let mut s = self.shared.stats.lock();
            s.reads += chunks;
            record(&mut s, &result, submitted.elapsed());
        }
        // The slot is free before the caller hears of it, so `in_flight` never counts a delivered read.
        release(&self.shared, 1);
        let _ = reply.send(result);
    }

    /// Counts one read that served `merged + 1` requests; `is_async` if the kernel did it with AIO (else a
    /// `pread`, which has the device to itself).
    fn account(&self, merged: u64, is_async: bool) {
        let mut s = self.shared.stats.lock();
        s.reads += 1;
        s.merged_requests += merged;
        if is_async {
            s.async_reads += 1;
        } else {
            s.max_device_depth = s.max_device_depth.max(1);
        }
    }

    fn complete(&self, p: Pending, result: Result<AlignedBuf>) {
        let latency = p.submitted.elapsed();
        record(&mut self.shared.stats.lock(), &result, latency);
        let c = Completion {
            tag: p.req.tag,
            file: p.req.file,
            offset: p.req.offset,
            result,
            latency,
        };
        // Released first: a caller that has its completion never sees the read in flight.
        release(&self.shared, 1);
        match p.reply {
            Reply::Shared => {
                let _ = self.done.send(c);
            }
            Reply::Private(tx) => {
                let _ = tx.send(c);
            }
        }
    }
}

fn record(s: &mut Stats, result: &Result<AlignedBuf>, latency: Duration) {
    s.requests += 1;
    match result {
        Ok(b) => s.bytes_read += b.len() as u64,
        Err(_) => s.errors += 1,
    }
    s.latency.record(latency);
}

fn eio() -> io::Error {
    #[cfg(unix)]
    {
        io::Error::from_raw_os_error(libc::EIO)
    }
    #[cfg(not(unix))]
    {
        io::Error::other("injected EIO")
    }
}
