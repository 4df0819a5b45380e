//! Reading an input file safely: [`read_bounded`], the one read every Sparrow reader of a whole file
//! goes through (profiles, predictors, plans, device profiles, manifests, corpora and texts, tokenizer
//! and config JSON), and [`require_regular`] for readers that map or stream a file.

use std::io::Read;
use std::path::Path;

use crate::error::{AtomicError, Result};

/// Opens `path` for reading without blocking (a FIFO opened for reading waits for a writer) and
/// refuses anything but a regular file, checked on the open file so it cannot be swapped in between.
pub fn require_regular(path: &Path) -> Result<std::fs::File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let f = opts.open(path).map_err(AtomicError::io("reading", path))?;
    let meta = f
        .metadata()
        .map_err(AtomicError::io("reading the size of", path))?;
    if !meta.is_file() {
        return Err(AtomicError::NotRegular {
            path: path.to_path_buf(),
        });
    }
    Ok(f)
}

/// The bytes of the regular file `path`, at most `limit` of them: anything but a regular file (a
/// FIFO, a device such as `/dev/zero`, a folder) is refused before it is read, and so is a file
/// larger than `limit` (checked on its size, and again while reading, should it grow). Errors name
/// the file.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let f = require_regular(path)?;
    let len = f
        .metadata()
        .map_err(AtomicError::io("reading the size of", path))?
        .len();
    let too_large = |len: u64| AtomicError::TooLarge {
        path: path.to_path_buf(),
        len,
        limit,
    };
    if len > limit {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(AtomicError::io("reading", path))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_bounded_text(path: &Path, limit: u64) -> Result<String> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|_| AtomicError::NotText {
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_within_the_limit_are_read_and_others_refused() {
        let dir = std::env::temp_dir().join(format!("atomic-out-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("f");
        std::fs::write(&f, b"hello").unwrap();
        assert_eq!(read_bounded(&f, 5).unwrap(), b"hello");
        let e = read_bounded(&f, 4).unwrap_err().to_string();
        assert!(
            e.contains("5 bytes") && e.contains(f.to_str().unwrap()),
            "{e}"
        );
        for p in [Path::new("/dev/zero"), dir.as_path()] {
            let e = read_bounded(p, 1 << 20).unwrap_err().to_string();
            assert!(
                e.contains("not a regular file") && e.contains(p.to_str().unwrap()),
                "{e}"
            );
        }
        std::fs::write(&f, [0xff, 0xfe]).unwrap();
        assert!(read_bounded_text(&f, 10)
            .unwrap_err()
            .to_string()
            .contains("not UTF-8"));
        #[cfg(unix)]
        {
            // A FIFO with no writer: refused at once, never waited on.
            let fifo = dir.join("fifo");
            assert!(crate::sys::mkfifo(&fifo));
            let e = read_bounded(&fifo, 10).unwrap_err().to_string();
            assert!(e.contains("not a regular file"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
