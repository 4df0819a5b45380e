//! SVE: detected and reported ([`crate::cpu_features`]), used by no kernel. The SVE of the phone
//! cores that have it (Arm's Cortex-A510/A710/X2 and later) is 128 bits wide, NEON's width, and
//! its integer dot products (`sdot`/`udot`, `smmla` with `i8mm`) are the same operations the NEON
//! kernels already issue; Rust has no stable SVE intrinsics, and qemu's `-cpu max` runs SVE wider
//! than any phone, so an instruction count there would not rank a phone's kernels.

use std::arch::asm;

/// The SVE vector length in bits (`rdvl`).
///
/// # Safety
/// The CPU must support SVE.
pub(crate) unsafe fn sve_bits() -> usize {
    let bytes: u64;
    // SAFETY: `rdvl x0, #1` (encoded by hand: `0x04bf5020`, so that the assembler needs no SVE
    // support) only writes x0; the caller guarantees SVE is present.
    unsafe {
        asm!(
            ".inst 0x04bf5020",
            out("x0") bytes,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    8 * bytes as usize
}
