//! `matmul_t_scratch_bytes` against what `matmul_t` allocates, counted by this binary's allocator:
//! the most bytes live during a call, over those live before it, stay within the figure, and on one
//! thread (bands one after another) reach it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

use kernels_neon::{matmul_t, matmul_t_scratch_bytes, QMatrix, WeightFormat};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed on.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), SeqCst) + l.size();
            PEAK.fetch_max(now, SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), SeqCst);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes the pool itself may allocate during a call (job latches), beyond what `matmul_t` holds.
const SLACK: usize = 4096;

/// Peak bytes `matmul_t` held over `n` tokens of a `rows × cols` matrix of `format` on `threads`.
fn peak(format: WeightFormat, rows: usize, cols: usize, n: usize, threads: usize) -> usize {
    let data = vec![0u8; rows * format.row_bytes(cols).unwrap()];
    let w = QMatrix::new(format, rows, cols, &data).unwrap();
    let x = vec![0.5f32; n * rows];
    let mut y = vec![0f32; n * cols];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        // Warm-up: lazy statics (kernel path detection) and the pool's first job.
        matmul_t(&w, &x, n, &mut y).unwrap();
        // The counters are the process's: a thread of an earlier pool that allocates while it
        // winds down lands in them too (one CI run saw 7 KB more, once). What `matmul_t` holds is
        // the same in every call, so the least of a few calls is its own.
        (0..3)
            .map(|_| {
                let before = LIVE.load(SeqCst);
                PEAK.store(before, SeqCst);
                matmul_t(&w, &x, n, &mut y).unwrap();
                PEAK.load(SeqCst).saturating_sub(before)
            })
            .min()
            .unwrap()
    })
}

#[test]
fn matmul_t_holds_what_its_scratch_figure_says() {
    let hybrid = WeightFormat::hybrid_for(0.02, 1024).unwrap();
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_K, hybrid] {
        for (rows, n) in [(40, 7), (16, 1)] {
            let cols = 1024;
            let one = matmul_t_scratch_bytes(format, rows, cols, n, 1) as usize;
            let got = peak(format, rows, cols, n, 1);
            assert!(
                got <= one + SLACK && got + SLACK >= one,
                "{format:?} {rows}x{cols}, {n} tokens, one thread: held {got}, figure {one}"
            );
            for threads in [2, 3] {
                let fig = matmul_t_scratch_bytes(format, rows, cols, n, threads) as usize;
                let got = peak(format, rows, cols, n, threads);
                assert!(
                    got <= fig + SLACK && fig >= one,
                    "{format:?} {rows}x{cols}, {n} tokens, {threads} threads: held {got}, figure {fig}"
                );
            }
        }
    }
    assert_eq!(matmul_t_scratch_bytes(WeightFormat::Q8_0, 0, 64, 3, 2), 0);
}
