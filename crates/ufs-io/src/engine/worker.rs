//! The I/O thread's side of [`IoEngine`](super::IoEngine): taking queued requests, coalescing
//! them into runs, reading them (one `pread` at a time or through the kernel's AIO), handing each
//! request its bytes, retrying a failed run request by request, and the stats.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{self, Receiver, Sender};
use parking_lot::Mutex;

use super::{release, Completion, Fault, IoConfig, Op, Pending, Reply, Shared};
use crate::aio::{Aio, AioDone, AioRead};
use crate::{AlignedBuf, IoError, IoFile, Result, Stats, ALIGN};

pub(super) struct Worker {
    pub(super) shared: Arc<Shared>,
    pub(super) done: Sender<Completion>,
    pub(super) config: IoConfig,
    /// Buffers of coalesced reads whose bytes were copied out to their requests, kept for the next
    /// ones ([`SPARE_BUFS`] at most, each of `max_merge` bytes): a new synchronous one is zeroed, and the I/O
    /// thread shares the cores with the compute threads (zeroing and copying were 10% of a 2-core
    /// offloaded decode's cycles).
    pub(super) spare: Mutex<Vec<AlignedBuf>>,
}

/// Most buffers [`Worker::spare`] keeps.
const SPARE_BUFS: usize = 4;

/// A coalesced read: requests whose ranges touch, served by one read of `start..end` of their file.
pub(super) struct Run {
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

impl Worker {
    pub(super) fn run(&self, rx: Receiver<Op>, aio: Option<Aio<Run>>) {
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

    /// The coalescing rule of [`IoEngine`](super::IoEngine): sort by (file, offset), merge touching
    /// ranges within `max_merge`; faulted requests stay alone.
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
