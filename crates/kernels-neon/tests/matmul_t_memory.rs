//! `matmul_t_scratch_bytes` against what `matmul_t` allocates, counted by this binary's allocator:
//! the most bytes live during a call, over those live before it, stay within the figure, and on one
//! thread (bands one after another) reach it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::SeqCst};

use kernels_neon::{matmul_t, matmul_t_scratch_bytes, Precision, QMatrix, WeightFormat};

struct Counting;

/// Bytes live and the most live, counted on the measured pool's threads only: the process's other
/// threads (the test harness, an earlier pool's threads winding down) allocate and free while a
/// call runs, which moved a process-wide count by several KiB either way in CI runs.
static LIVE: AtomicI64 = AtomicI64::new(0);
static PEAK: AtomicI64 = AtomicI64::new(0);
/// The measured pool: a thread counts when its [`POOL`] is this one.
static CURRENT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The pool this thread belongs to (0: none), set by the pool's start handler.
    static POOL: Cell<usize> = const { Cell::new(0) };
}

/// Whether this thread's allocations count.
fn counted() -> bool {
    POOL.try_with(|p| p.get()).unwrap_or(0) == CURRENT.load(SeqCst)
}

// SAFETY: every call is forwarded to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout contract is passed on.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() && counted() {
            let now = LIVE.fetch_add(l.size() as i64, SeqCst) + l.size() as i64;
            PEAK.fetch_max(now, SeqCst);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `alloc` with this layout.
        unsafe { System.dealloc(p, l) };
        if counted() {
            LIVE.fetch_sub(l.size() as i64, SeqCst);
        }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes the pool itself may allocate during a call (job latches), beyond what `matmul_t` holds.
const SLACK: usize = 4096;

/// Peak bytes `matmul_t` held over `n` tokens of a `rows × cols` matrix of `format` on `threads`
/// in `precision`.
fn peak(
    format: WeightFormat,
    rows: usize,
    cols: usize,
    n: usize,
    threads: usize,
    precision: Precision,
) -> usize {
    let data = vec![0u8; rows * format.row_bytes(cols).unwrap()];
    let w = QMatrix::new(format, rows, cols, &data).unwrap();
    let x = vec![0.5f32; n * rows];
    let mut y = vec![0f32; n * cols];
    let pool_id = CURRENT.fetch_add(1, SeqCst) + 1;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .start_handler(move |_| POOL.with(|p| p.set(pool_id)))
        .build()
        .unwrap();
    pool.install(|| {
        // Warm-up: lazy statics (kernel path detection) and the pool's first job.
        matmul_t(&w, &x, n, &mut y, precision).unwrap();
        let before = LIVE.load(SeqCst);
        PEAK.store(before, SeqCst);
        matmul_t(&w, &x, n, &mut y, precision).unwrap();
        (PEAK.load(SeqCst) - before) as usize
    })
}

#[test]
fn matmul_t_holds_what_its_scratch_figure_says() {
    let hybrid = WeightFormat::hybrid_for(0.02, 1024).unwrap();
    // 7 and 1 tokens take the f32 tile in every precision; 40 in `Fast` the 8-bit tile where the
    // path has it (rows padded to 64).
    let cases = [
        (40, 7, Precision::Fast),
        (16, 1, Precision::Fast),
        (40, 40, Precision::Fast),
        (40, 40, Precision::Exact),
    ];
    for format in [WeightFormat::Q8_0, WeightFormat::Q4_K, hybrid] {
        for (rows, n, precision) in cases {
            let cols = 1024;
            let one = matmul_t_scratch_bytes(format, rows, cols, n, 1, precision) as usize;
            let got = peak(format, rows, cols, n, 1, precision);
            assert!(
                got <= one + SLACK && got + SLACK >= one,
                "{format:?} {rows}x{cols}, {n} tokens, {precision:?}, one thread: held {got}, figure {one}"
            );
            for threads in [2, 3] {
                let fig =
                    matmul_t_scratch_bytes(format, rows, cols, n, threads, precision) as usize;
                let got = peak(format, rows, cols, n, threads, precision);
                assert!(
                    got <= fig + SLACK && fig >= one,
                    "{format:?} {rows}x{cols}, {n} tokens, {precision:?}, {threads} threads: held {got}, figure {fig}"
                );
            }
        }
    }
    assert_eq!(
        matmul_t_scratch_bytes(WeightFormat::Q8_0, 0, 64, 3, 2, Precision::Fast),
        0
    );
}
