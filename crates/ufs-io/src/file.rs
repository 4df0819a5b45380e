//! [`IoFile`]: a weight file opened for direct reads, with the buffered fallback.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{AlignedBuf, IoError, Result, ALIGN};

/// How to open an [`IoFile`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Ask for `O_DIRECT` (bypass the page cache). Refused by some filesystems (older tmpfs, overlayfs on
    /// some kernels); then the file is read buffered and [`IoFile::is_direct`] says so.
    pub direct: bool,
    /// In buffered mode, `posix_fadvise(DONTNEED)` each range after reading it, so that the page cache
    /// does not keep a second copy of weights that the neuron cache already holds.
    pub drop_cache: bool,
}

impl Default for OpenOptions {
    /// `direct: true, drop_cache: true`.
    fn default() -> Self {
        Self {
            direct: true,
            drop_cache: true,
        }
    }
}

/// A read-only file for [`crate::IoEngine`]: `O_DIRECT` where the filesystem allows it, buffered reads
/// otherwise. Reads are positional (`pread`), so one `IoFile` may be shared between threads.
#[derive(Debug)]
pub struct IoFile {
    file: File,
    path: PathBuf,
    len: u64,
    direct: bool,
    drop_cache: bool,
}

static FALLBACK_WARNED: AtomicBool = AtomicBool::new(false);

fn warn_fallback(path: &Path, why: &str) {
    if !FALLBACK_WARNED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "ufs-io: warning: O_DIRECT refused for {} ({why}); reading buffered (further files not reported)",
            path.display()
        );
    }
}

fn is_einval(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        e.raw_os_error() == Some(libc::EINVAL)
    }
    #[cfg(not(unix))]
    {
        e.kind() == io::ErrorKind::InvalidInput
    }
}

impl IoFile {
    /// Opens `path` for reading. With `opts.direct`, tries `O_DIRECT` and probes it with one aligned read;
    /// if the open or the probe fails with `EINVAL` (the filesystem refuses direct I/O), reopens the file
    /// buffered and prints a one-line warning on stderr (once per process). Other errors name the file.
    pub fn open(path: impl AsRef<Path>, opts: OpenOptions) -> Result<Self> {
        Self::open_inner(path.as_ref(), opts, false)
    }

    /// `open`, with `simulate_refusal` pretending that the filesystem refused `O_DIRECT` (tests).
    pub(crate) fn open_inner(
        path: &Path,
        opts: OpenOptions,
        simulate_refusal: bool,
    ) -> Result<Self> {
        let err = |source| IoError::Open {
            path: path.to_path_buf(),
            source,
        };
        // Anything but a regular file is refused before it is opened: opening a FIFO blocks until a
        // writer comes, and devices or /proc files are no weight files.
        let meta = std::fs::metadata(path).map_err(err)?;
        if !meta.is_file() {
            return Err(err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        if opts.direct {
            match sys::open_direct(path) {
                Ok(file) => {
                    let probe = if simulate_refusal {
                        Err(io::Error::from(io::ErrorKind::InvalidInput))
                    } else {
                        probe(&file)
                    };
                    match probe {
                        Ok(()) => return Self::finish(file, path, true, opts),
                        Err(e) if is_einval(&e) || simulate_refusal => {
                            warn_fallback(path, "first read: EINVAL")
                        }
                        Err(e) => return Err(err(e)),
                    }
                }
                Err(e) if is_einval(&e) => warn_fallback(path, "open: EINVAL"),
                Err(e) if e.kind() == io::ErrorKind::Unsupported => {
                    warn_fallback(path, "not supported on this OS")
                }
                Err(e) => return Err(err(e)),
            }
        }
        let file = File::open(path).map_err(err)?;
        Self::finish(file, path, false, opts)
    }

    fn finish(file: File, path: &Path, direct: bool, opts: OpenOptions) -> Result<Self> {
        let len = file
            .metadata()
            .map_err(|source| IoError::Open {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        Ok(Self {
            file,
            path: path.to_path_buf(),
            len,
            direct,
            drop_cache: opts.drop_cache,
        })
    }

    /// The raw descriptor, for the engine's kernel asynchronous reads (-1 where there is none).
    pub(crate) fn raw_fd(&self) -> i32 {
        #[cfg(unix)]
        {
            use std::os::unix::io::AsRawFd;
            self.file.as_raw_fd()
        }
        #[cfg(not(unix))]
        {
            -1
        }
    }

    /// Whether reads bypass the page cache (`O_DIRECT` accepted).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File size in bytes, at open time.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file was empty at open time.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks that `len` is a non-zero multiple of 4096, `offset` a multiple of 4096 and that the range ends
    /// below 2^63. Every read through this crate must pass, whatever the mode, so that behaviour does not
    /// depend on the filesystem.
    pub fn check_aligned(&self, offset: u64, len: usize) -> Result<()> {
        if len == 0 || len % ALIGN != 0 || offset % ALIGN as u64 != 0 {
            return Err(IoError::Unaligned {
                path: self.path.clone(),
                offset,
                len,
            });
        }
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(IoError::OutOfRange {
                path: self.path.clone(),
                offset,
                len,
            });
        }
        Ok(())
    }

    /// Reads into `buf` from `offset` until `buf` is full or the file ends; returns the bytes read.
    /// Retries `EINTR`. Errors are the OS's (the caller adds the context).
    pub(crate) fn read_full(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match sys::pread(&self.file, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if !self.direct && self.drop_cache {
            sys::drop_cache(&self.file, offset, done);
        }
        Ok(done)
    }

    /// A synchronous read on the calling thread (no engine): `len` bytes at `offset`, both aligned.
    /// Fails with [`IoError::ShortRead`] when the file ends first.
    pub fn read_at(&self, offset: u64, len: usize) -> Result<AlignedBuf> {
        self.check_aligned(offset, len)?;
        let mut buf = AlignedBuf::new(len)?;
        let got = self
            .read_full(offset, &mut buf)
            .map_err(|source| IoError::Read {
                path: self.path.clone(),
                offset,
                len,
                source,
            })?;
        if got < len {
            return Err(IoError::ShortRead {
                path: self.path.clone(),
                offset,
                wanted: len,
                got,
            });
        }
        Ok(buf)
    }
}

impl IoFile {
    /// A synchronous read on the calling thread into `buf` (reused from call to call): `buf.len()`
    /// bytes at `offset` (both aligned, as [`IoFile::check_aligned`] says), or fewer where the file
    /// ends first. Returns the bytes read. `buf` must start at a [`crate::ALIGN`]-aligned address
    /// (an [`AlignedBuf`] or a prefix of one).
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.check_aligned(offset, buf.len())?;
        if buf.as_ptr() as usize % ALIGN != 0 {
            return Err(IoError::Unaligned {
                path: self.path.clone(),
                offset,
                len: buf.len(),
            });
        }
        let len = buf.len();
        self.read_full(offset, buf).map_err(|source| IoError::Read {
            path: self.path.clone(),
            offset,
            len,
            source,
        })
    }
}

fn probe(file: &File) -> io::Result<()> {
    let mut buf =
        AlignedBuf::new(ALIGN).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
    loop {
        match sys::pread(file, &mut buf, 0) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Platform calls: O_DIRECT, pread, fadvise, CPU affinity.
pub(crate) mod sys {
    use std::fs::File;
    use std::io;
    use std::path::Path;

    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub fn open_direct(path: &Path) -> io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub fn open_direct(_path: &Path) -> io::Result<File> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    #[cfg(unix)]
    pub fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(file, buf, offset)
    }

    #[cfg(windows)]
    pub fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(file, buf, offset)
    }

    #[cfg(not(any(unix, windows)))]
    pub fn pread(_file: &File, _buf: &mut [u8], _offset: u64) -> io::Result<usize> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub fn drop_cache(file: &File, offset: u64, len: usize) {
        use std::os::unix::io::AsRawFd;
        // SAFETY: posix_fadvise only reads its integer arguments; the fd is open for the call's duration.
        // Its result is advisory and ignored.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub fn drop_cache(_file: &File, _offset: u64, _len: usize) {}

    /// Pins the calling thread to `core`.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub fn pin_current_thread(core: usize) -> io::Result<()> {
        let bits = 8 * std::mem::size_of::<libc::cpu_set_t>();
        if core >= bits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("core {core} >= CPU_SETSIZE {bits}"),
            ));
        }
        // SAFETY: cpu_set_t is a plain bit array for which all-zero is the empty set; CPU_SET writes
        // inside it (core < CPU_SETSIZE checked above); sched_setaffinity reads `size_of` bytes of it.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(core, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub fn pin_current_thread(_core: usize) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    /// `len` bytes of fresh zeroed private memory, page-aligned (`mmap` of anonymous memory);
    /// null when the kernel refuses.
    #[cfg(unix)]
    pub fn map_anon(len: usize) -> *mut u8 {
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
        // existing memory; a failure is MAP_FAILED, turned into null here.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }

    /// Whether the page at `addr` (page-aligned) is mapped in this process (`mincore` refuses an
    /// unmapped one with ENOMEM).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[allow(dead_code)] // for tests
    pub fn is_mapped(addr: usize) -> bool {
        let mut v = [0u8; 1];
        // SAFETY: mincore only reads the page table for [addr, addr + 1 page) and writes one byte
        // into `v`, which holds one; an unmapped range is an error, not a fault.
        unsafe { libc::mincore(addr as *mut libc::c_void, 4096, v.as_mut_ptr().cast()) == 0 }
    }

    /// Gives back a mapping [`map_anon`] made.
    ///
    /// # Safety
    /// `ptr` and `len` are those of one mapping of [`map_anon`], unmapped once, no reference into
    /// it left.
    #[cfg(unix)]
    pub unsafe fn unmap(ptr: *mut u8, len: usize) {
        // SAFETY: the caller's contract: a whole mapping of ours, no longer used.
        unsafe { libc::munmap(ptr.cast(), len) };
    }
}
