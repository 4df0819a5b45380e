//! Which SIMD extensions this CPU has (detected once, cached), for the kernel paths and
//! [`crate::cpu_features`].

/// AVX2 + FMA + F16C present (detected once, cached by std).
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// x86_64 AVX-512F, BW, VL, VNNI and BF16 present, on top of [`has_avx2_fma`].
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            has_avx2_fma()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// aarch64 `dotprod` extension present.
pub(crate) fn has_dotprod() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_aarch64_feature_detected!("dotprod"))
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// aarch64 `fhm` extension present (FEAT_FHM: `fmlal`, f16 products added to f32 lanes).
pub(crate) fn has_fhm() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_aarch64_feature_detected!("fhm"))
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// aarch64 `i8mm` extension present (`smmla`).
pub(crate) fn has_i8mm() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_aarch64_feature_detected!("i8mm"))
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// The aarch64 SVE vector length in bits where SVE is present (no kernel uses SVE:
/// `aarch64/sve.rs` says why).
#[cfg(target_arch = "aarch64")]
pub(crate) fn sve_bits() -> Option<usize> {
    use std::sync::OnceLock;
    static BITS: OnceLock<Option<usize>> = OnceLock::new();
    *BITS.get_or_init(|| {
        std::arch::is_aarch64_feature_detected!("sve").then(|| {
            // SAFETY: SVE was detected just above.
            unsafe { super::aarch64::sve_bits() }
        })
    })
}

/// The SIMD extensions of this CPU that the kernels look for, in [`crate::cpu_features`]'s words.
pub(crate) fn cpu_features() -> Vec<String> {
    let mut f: Vec<String> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! x86 {
            ($($name:tt)*) => {
                $(if is_x86_feature_detected!($name) { f.push($name.into()); })*
            };
        }
        x86!("avx2" "fma" "f16c" "avx512f" "avx512bw" "avx512vnni" "avx512bf16");
    }
    #[cfg(target_arch = "aarch64")]
    {
        f.push("neon".into());
        if has_dotprod() {
            f.push("dotprod".into());
        }
        if has_i8mm() {
            f.push("i8mm".into());
        }
        if has_fhm() {
            f.push("fhm".into());
        }
        if let Some(bits) = sve_bits() {
            f.push(format!("sve({bits}-bit)"));
        }
        if std::arch::is_aarch64_feature_detected!("sve2") {
            f.push("sve2".into());
        }
    }
    f
}
