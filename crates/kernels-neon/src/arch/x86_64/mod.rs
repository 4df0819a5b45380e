//! x86_64 AVX2 + FMA + F16C kernels, one file per operation family, and the AVX-512F ones that
//! path [`crate::KernelPath::Avx512`] takes instead where they exist (`tile512`, `tile512_k8`,
//! `tile512_k23` (for `tile_k23`), `tile512_k16` (for `tile_k16`), `tile_bf16`, `kquant512`, Q5_0's decode kernel `q40_512`, Q4_0's
//! 8-bit one `q40_512_i8` (16-bit Q4_0 takes `q40_pairs` on both paths), and the batch kernels
//! `batch512`, `kquant512_batch`, `q40_pairs512`).
//!
//! All functions are `unsafe fn` with `#[target_feature]`: callers must have
//! checked that AVX2, FMA and F16C are present (`arch::has_avx2_fma`). Slice
//! lengths are re-checked with `assert!` at entry of each row kernel (cheap,
//! once per row) so that every raw-pointer access below stays in bounds even
//! if a caller were wrong.
//!
//! The same files exist for aarch64 (`arch/aarch64`); the row drivers both
//! use are in `arch/drivers.rs`, the format tags in `arch/tags.rs`.

mod attend;
mod axpy;
mod axpy_tiled;
mod batch512;
mod dequant;
mod expf;
mod hybrid;
mod iq4xs_rows;
mod kquant;
mod kquant512;
mod kquant512_batch;
mod kquant_low;
mod kquant_rows;
mod kquant_rows_batch;
mod kquant_super;
mod kv;
mod matvec_exact;
mod matvec_i16;
mod matvec_i16_batch;
mod matvec_int8;
mod panel_k8;
mod q40_512;
mod q40_512_i8;
mod q40_pairs;
mod q40_pairs512;
mod q40x8;
mod q40x8_pair512;
mod q4kx8;
mod q6kx8;
mod q80x8;
mod quantize;
mod simd;
mod tile;
mod tile512;
mod tile512_i8;
mod tile512_k16;
mod tile512_k23;
mod tile512_k8;
mod tile512_lanes;
mod tile_bf16;
mod tile_i8;
mod tile_k16;
mod tile_k23;
mod tile_k8;
mod tile_k8_lanes;
mod tile_lanes;
mod vector;

pub(crate) use attend::{attend_block_avx2, attend_block_avx512};
pub(crate) use axpy::axpy_row;
pub(crate) use axpy_tiled::{axpy_rows_fixed, axpy_rows_fixed_dq, axpy_rows_tiled};
pub(crate) use dequant::dequant_row;
pub(crate) use expf::{exp_sub, silu_mul};
pub(crate) use hybrid::axpy_hybrid;
pub(crate) use kquant_rows::{q6k_corr, K16Prep};
pub(crate) use kv::{kv_accumulate, kv_scores};
pub(crate) use matvec_exact::matvec_exact;
pub(crate) use matvec_i16::matvec_i16;
pub(crate) use matvec_i16_batch::{matvec_i16_batch, Interleaved};
pub(crate) use matvec_int8::matvec_int8;
pub(crate) use q40_512::{takes_matrix as q40_takes_matrix, Q40Wide};
pub(crate) use q40_512_i8::{matvec_batch as q40_int8_batch, Q40Bytes};
pub(crate) use q40x8::{
    q40x8_group, q40x8_group_tokens, q40x8_group_tokens_vnni, q40x8_group_vnni,
};
pub(crate) use q40x8_pair512::q40x8_pair_tokens;
pub(crate) use q4kx8::{q4kx8_group, q4kx8_group_vnni};
pub(crate) use q6kx8::q6kx8_group;
pub(crate) use q80x8::q80x8_group;
pub(crate) use quantize::{quantize, quantize16, quantize_halves, quantize_super};
pub(crate) use tile::tile;
pub(crate) use tile512::{tile as tile512, tile_rows as tile512_rows};
pub(crate) use tile512_i8::{has_tile512_i8, tile512_i8, tile512_i8_t, tile512_i8_t_bytes};
pub(crate) use tile512_k16::{has_tile512_k16, tile512_k16};
pub(crate) use tile512_k23::tile512_k23;
pub(crate) use tile512_k8::tile512_k8;
pub(crate) use tile512_lanes::LANES as TILE512_LANES;
pub(crate) use tile_bf16::{tile_bf16, to_bf16};
pub(crate) use tile_i8::{has_tile_i8, tile_i8};
pub(crate) use tile_k16::{has_tile_k16, tile_k16, LANES as TILE_K16_LANES};
pub(crate) use tile_k23::tile_k23;
pub(crate) use tile_k8::tile_k8;
pub(crate) use tile_k8_lanes::tile_k8_lanes;
pub(crate) use vector::{add_fixed, add_fixed_avx2, axpy_f32, dot_f32};
