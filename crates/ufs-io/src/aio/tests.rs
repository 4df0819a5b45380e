//! The safe wrapper: every buffer comes back with the file's bytes, and dropping or abandoning with reads
//! in the kernel is sound.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Aio, AioDone, AioRead};
use crate::{AlignedBuf, IoFile, OpenOptions, ALIGN};

const PAGES: usize = 64;

/// A file of `PAGES` pages of distinct bytes in a fresh directory, removed on drop.
struct Fixture {
    dir: PathBuf,
    data: Vec<u8>,
    file: Arc<IoFile>,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ufs-io-aio-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.bin");
        let data: Vec<u8> = (0..PAGES * ALIGN)
            .map(|i| (i / ALIGN * 31 + i % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let file = Arc::new(IoFile::open(&path, OpenOptions::default()).unwrap());
        Self { dir, data, file }
    }

    fn read(&self, page: usize, pages: usize, tag: u32) -> AioRead<u32> {
        AioRead {
            file: self.file.clone(),
            offset: (page * ALIGN) as u64,
            buf: AlignedBuf::new(pages * ALIGN).unwrap(),
            tag,
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A context, or `None` where the kernel refuses one (qemu-user, seccomp); x86_64 Linux (CI) must grant it.
fn context(capacity: usize) -> Option<Aio<u32>> {
    match Aio::new(capacity) {
        Ok(aio) => Some(aio),
        Err(e) => {
            if cfg!(all(target_os = "linux", target_arch = "x86_64")) {
                panic!("io_setup refused on x86_64 Linux: {e}");
            }
            eprintln!("skipped: no kernel AIO here ({e})");
            None
        }
    }
}

fn wait_all(aio: &mut Aio<u32>) -> Vec<AioDone<u32>> {
    let mut done = Vec::new();
    while aio.outstanding() > 0 {
        done.extend(aio.wait(1).unwrap());
    }
    done
}

#[test]
fn submit_takes_the_buffers_and_wait_gives_every_one_back_with_the_bytes() {
    let fx = Fixture::new("roundtrip");
    let Some(mut aio) = context(4) else { return };
    assert_eq!((aio.room(), aio.outstanding()), (4, 0));
    assert!(aio.wait(1).unwrap().is_empty(), "nothing outstanding");

    // (first page, pages, tag); the last read reaches one page past the end of the file.
    let plan = [
        (3, 1, 10),
        (0, 2, 11),
        (40, 4, 12),
        (9, 1, 13),
        (17, 3, 14),
        (PAGES - 1, 2, 15),
    ];
    let reads = plan.iter().map(|&(p, n, t)| fx.read(p, n, t)).collect();
    let rest = aio.submit(reads);
    // Room for four: the last two come back untouched, in order.
    assert_eq!(rest.iter().map(|r| r.tag).collect::<Vec<_>>(), [14, 15]);
    assert_eq!((aio.room(), aio.outstanding()), (0, 4));
    assert!(rest.iter().all(|r| r.buf.iter().all(|&b| b == 0)));

    let mut done = wait_all(&mut aio);
    assert_eq!(aio.room(), 4);
    assert!(aio.submit(rest).is_empty());
    done.extend(wait_all(&mut aio));

    done.sort_by_key(|d| d.read.tag);
    assert_eq!(done.len(), plan.len());
    for (d, &(page, pages, tag)) in done.iter().zip(&plan) {
        assert_eq!(d.read.tag, tag);
        assert_eq!(d.read.offset, (page * ALIGN) as u64);
        assert_eq!(d.read.buf.len(), pages * ALIGN);
        assert!(Arc::ptr_eq(&d.read.file, &fx.file));
        let lo = page * ALIGN;
        let hi = ((page + pages) * ALIGN).min(fx.data.len());
        assert_eq!(
            *d.result.as_ref().unwrap(),
            hi - lo,
            "tag {tag}: short only at the end"
        );
        assert_eq!(&d.read.buf[..hi - lo], &fx.data[lo..hi], "tag {tag}");
    }
    assert_eq!((aio.room(), aio.outstanding()), (4, 0));
}

#[test]
fn dropping_or_abandoning_with_reads_outstanding_is_sound() {
    let fx = Fixture::new("drop");
    for round in 0..8 {
        let Some(mut aio) = context(16) else { return };
        // Reads of every page, some merged, owned by the context alone once submitted.
        let reads = (0..16)
            .map(|i| fx.read(i * 4, 1 + i % 4, i as u32))
            .collect();
        assert!(aio.submit(reads).is_empty());
        if round % 2 == 1 {
            // Reap some, keep the rest in the kernel.
            let got = aio.wait(1).unwrap();
            assert!(!got.is_empty());
        }
        if round == 7 {
            // After a failed wait the engine abandons: the tags come back, buffers are leaked.
            let left = aio.outstanding();
            let tags = aio.abandon();
            assert_eq!(tags.len(), left);
        } else {
            drop(aio);
        }
    }
    // The file is still usable: nothing freed its descriptor under the kernel.
    assert_eq!(&fx.file.read_at(0, ALIGN).unwrap()[..], &fx.data[..ALIGN]);
}
