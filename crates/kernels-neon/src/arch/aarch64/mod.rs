//! aarch64 NEON kernels (NEON is baseline on aarch64, so these are safe
//! functions), plus the optional `dotprod` (`sdot`) integer path; one file
//! per operation family.
//!
//! Every raw-pointer load is preceded by a bounds-checked slice of exactly
//! the bytes it reads (`&row[a..b]` panics instead of reading out of
//! bounds; callers have validated lengths, so this never fires).
//!
//! The same files exist for x86_64 (`arch/x86_64`); the row drivers both
//! use are in `arch/drivers.rs`, the format tags in `arch/tags.rs`.

mod axpy;
mod axpy_tiled;
mod dequant;
mod expf;
mod hybrid;
mod iq4xs_split;
mod kquant;
mod kquant_acts;
mod kquant_low_split;
mod kquant_split;
mod kv;
mod matvec_exact;
mod matvec_half;
mod matvec_i16;
mod matvec_i16_batch;
mod matvec_int8;
mod matvec_int8_rows;
mod matvec_split;
mod q40x8;
mod q4kx8;
mod q6kx8;
mod q80x8;
mod quantize;
mod row_blocks;
mod rows_acc;
mod simd;
mod sve;
mod tile;
mod tile_acts;
mod tile_dp;
mod tile_i16mm;
mod tile_i8mm;
mod tile_mm;
mod vector;

pub(crate) use axpy::axpy_row;
pub(crate) use axpy_tiled::axpy_rows_tiled;
pub(crate) use dequant::dequant_row;
pub(crate) use expf::{exp_sub, silu_mul};
pub(crate) use hybrid::axpy_hybrid;
pub(crate) use kv::{kv_accumulate, kv_scores};
pub(crate) use matvec_exact::matvec_exact;
pub(crate) use matvec_half::matvec_half;
pub(crate) use matvec_i16::{matvec_i16, takes_split};
pub(crate) use matvec_i16_batch::matvec_i16_batch;
pub(crate) use matvec_int8::{int8_sums16, matvec_int8};
pub(crate) use matvec_split::Split16;
pub(crate) use q40x8::{q40x8_group_neon, q40x8_group_neon_tokens, Perm8};
pub(crate) use q4kx8::{q4kx8_group_neon, q4kx8_group_neon_tokens};
pub(crate) use q6kx8::{q6kx8_group_neon, q6kx8_group_neon_tokens};
pub(crate) use q80x8::q80x8_group;
pub(crate) use quantize::{quantize, quantize16, quantize_halves, quantize_super};
pub(crate) use sve::sve_bits;
pub(crate) use tile::tile;
pub(crate) use tile_acts::{Acts16, Acts8};
pub(crate) use tile_dp::has_tile_i16dp;
pub(crate) use tile_i16mm::has_tile_i16mm;
pub(crate) use tile_i8mm::has_tile_i8mm;
pub(crate) use vector::{axpy_f32, dot_f32};
