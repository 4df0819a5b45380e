//! The constants of the `expf` that glibc and musl ship (ARM's optimized-routines: `exp2f_data.c`,
//! `expf.c`), which the SIMD `exp` of every architecture (`x86_64/expf.rs`, `aarch64/expf.rs`) computes
//! in f64 lanes: `k = round(x·32/ln 2)`, `r = x·32/ln 2 - k`, `exp(x) = 2^(k/32) · (1 + r·(C2 +
//! r·(C1 + r·C0)))` with `2^(k/32)` from a 32-entry table, rounded once to f32. Computed with the
//! fused multiply-adds glibc's `__expf_fma` (the one x86_64 machines with FMA run) is compiled to,
//! it is that function bit for bit: every finite f32 from -103.9 to 88.7 was checked.

/// `2^(i/32)`'s f64 bits less `i << 47` (so that adding `k << 47` for `k ≡ i` mod 32 gives
/// `2^(k/32)`).
pub(crate) const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// `32 / ln 2`.
pub(crate) const INV_LN2_N: f64 = f64::from_bits(0x3ff7_1547_652b_82fe) * 32.0;
/// `1.5 · 2^52`: added and taken away, it rounds to an integer (ties to even), whose bits are
/// then the added value's low bits.
pub(crate) const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The polynomial's coefficients, scaled for `r` in units of 1/32 (powers of two: exact).
pub(crate) const C0: f64 = f64::from_bits(0x3fac_6af8_4b91_2394) / 32.0 / 32.0 / 32.0;
/// See [`C0`].
pub(crate) const C1: f64 = f64::from_bits(0x3fce_bfce_50fa_c4f3) / 32.0 / 32.0;
/// See [`C0`].
pub(crate) const C2: f64 = f64::from_bits(0x3fe6_2e42_ff0c_52d6) / 32.0;
/// Above `ln(2^128)` (0x1.62e42ep6) the result is ∞.
pub(crate) const OVERFLOW: f32 = f32::from_bits(0x42b1_7217);
/// Below `ln(2^-150)` (-0x1.9fe368p6) the result is 0.
pub(crate) const UNDERFLOW: f32 = f32::from_bits(0xc2cf_f1b4);
/// Inputs are clamped to `[CLAMP_LO, CLAMP_HI]` before the main path (so that `k` stays in the
/// exponent's range); the limits above then choose 0 or ∞.
pub(crate) const CLAMP_LO: f32 = -104.0;
/// See [`CLAMP_LO`].
pub(crate) const CLAMP_HI: f32 = 89.0;
