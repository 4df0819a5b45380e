//! Which implementation runs the kernels ([`KernelPath`]: detected once, or forced by
//! `SPARROW_KERNELS`), and the rows a parallel work item takes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::arch;

/// Which implementation runs the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelPath {
    /// Portable scalar reference.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2Fma,
    /// x86_64 AVX2 + FMA + F16C kernels, with AVX-512F/BW/VL/VNNI/BF16 ones where they exist
    /// (prefill's f32 and bf16 tiles, the `Q4_K`, `Q5_K` and `Q6_K` integer dots).
    Avx512,
    /// aarch64 NEON (integer path via widening multiplies).
    Neon,
    /// aarch64 NEON with the `dotprod` extension (`sdot`).
    NeonDotprod,
    /// aarch64 NEON with `dotprod` and `i8mm`: [`KernelPath::NeonDotprod`]'s kernels, and `smmla`
    /// (two rows by two tokens per instruction) in the 8-bit prompt tile of the 32-element block
    /// formats.
    NeonI8mm,
}

impl KernelPath {
    /// Whether this machine can run the path.
    pub fn is_available(self) -> bool {
        match self {
            KernelPath::Scalar => true,
            KernelPath::Avx2Fma => arch::has_avx2_fma(),
            KernelPath::Avx512 => arch::has_avx512(),
            KernelPath::Neon => cfg!(target_arch = "aarch64"),
            KernelPath::NeonDotprod => arch::has_dotprod(),
            KernelPath::NeonI8mm => arch::has_dotprod() && arch::has_i8mm(),
        }
    }

    /// Short name ("scalar", "avx2+fma", "avx512", "neon", "neon+dotprod", "neon+i8mm").
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Scalar => "scalar",
            KernelPath::Avx2Fma => "avx2+fma",
            KernelPath::Avx512 => "avx512",
            KernelPath::Neon => "neon",
            KernelPath::NeonDotprod => "neon+dotprod",
            KernelPath::NeonI8mm => "neon+i8mm",
        }
    }
}

/// All paths this machine can run, scalar first.
pub fn available_paths() -> Vec<KernelPath> {
    [
        KernelPath::Scalar,
        KernelPath::Avx2Fma,
        KernelPath::Avx512,
        KernelPath::Neon,
        KernelPath::NeonDotprod,
        KernelPath::NeonI8mm,
    ]
    .into_iter()
    .filter(|p| p.is_available())
    .collect()
}

/// Whether environment variable `var` is set to `value` (any case).
pub(crate) fn env_says(var: &str, value: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.eq_ignore_ascii_case(value))
}

pub(crate) fn detect_path() -> KernelPath {
    if env_says("SPARROW_KERNELS", "scalar") {
        return KernelPath::Scalar;
    }
    // `neon` and `neon-dotprod` force the lower aarch64 paths (to measure what a newer
    // extension's kernels gain on the same CPU).
    let neon_only = env_says("SPARROW_KERNELS", "neon");
    let no_i8mm = neon_only || env_says("SPARROW_KERNELS", "neon-dotprod");
    if KernelPath::NeonI8mm.is_available() && !no_i8mm {
        KernelPath::NeonI8mm
    } else if KernelPath::NeonDotprod.is_available() && !neon_only {
        KernelPath::NeonDotprod
    } else if KernelPath::Neon.is_available() {
        KernelPath::Neon
    } else if KernelPath::Avx512.is_available() && !env_says("SPARROW_KERNELS", "avx2") {
        KernelPath::Avx512
    } else if KernelPath::Avx2Fma.is_available() {
        KernelPath::Avx2Fma
    } else {
        KernelPath::Scalar
    }
}

/// The path used by the dispatching functions (detected once, cached).
pub fn active_path() -> KernelPath {
    static PATH: OnceLock<KernelPath> = OnceLock::new();
    *PATH.get_or_init(detect_path)
}

/// Name of the path in use: "avx512", "avx2+fma", "neon", "neon+dotprod", "neon+i8mm" or
/// "scalar".
pub fn arch_name() -> &'static str {
    active_path().name()
}

/// The SIMD extensions this CPU has among those the kernels look for, space-separated: on aarch64
/// `neon`, `dotprod`, `i8mm`, `sve(N-bit)` (with its vector length) and `sve2`; on x86_64 `avx2`,
/// `fma`, `f16c` and the AVX-512 ones. SVE is reported, not used: no kernel gains from it on the
/// 128-bit SVE of phones' cores (see the crate docs). Detected whatever `SPARROW_KERNELS` forces.
pub fn cpu_features() -> String {
    arch::cpu_features().join(" ")
}

static CHUNK_ROWS: AtomicUsize = AtomicUsize::new(0);

/// Sets the number of weight rows per parallel work item of [`matvec`](crate::matvec) and
/// [`matmul`](crate::matmul()). `0` restores the default (automatic: about four work items
/// per rayon thread, never fewer than 16 rows each for `matvec`).
pub fn set_chunk_rows(rows: usize) {
    CHUNK_ROWS.store(rows, Ordering::Relaxed);
}

/// The [`set_chunk_rows`] setting (0 = automatic).
pub(crate) fn chunk_rows_setting() -> usize {
    CHUNK_ROWS.load(Ordering::Relaxed)
}

/// Minimum rows per `matvec` work item in automatic mode.
const MIN_MATVEC_CHUNK: usize = 16;
/// Default rows per `matmul` work item (dequantized tile height).
const MATMUL_CHUNK: usize = 32;

pub(crate) fn matvec_chunk(rows: usize) -> usize {
    let set = chunk_rows_setting();
    if set > 0 {
        return set;
    }
    let threads = rayon::current_num_threads().max(1);
    let per = rows.div_ceil(threads * 4);
    per.max(MIN_MATVEC_CHUNK).next_multiple_of(4)
}

pub(crate) fn matmul_chunk() -> usize {
    match CHUNK_ROWS.load(Ordering::Relaxed) {
        0 => MATMUL_CHUNK,
        n => n,
    }
}
