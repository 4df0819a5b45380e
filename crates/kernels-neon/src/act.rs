//! The gated FFN's product `gate = act(gate) * up` for every [`Activation`], in one place:
//! [`act_mul_inplace`] dispatches to the SiLU kernel ([`crate::silu_mul_inplace`], SIMD), ReLU
//! ([`crate::relu_mul_inplace`]) or GELU's tanh form ([`gelu_mul_inplace`]); [`act_value`] is
//! the same activation of one value (the sparse kernels' per-neuron form).
//!
//! GELU is computed as ggml's CPU backend computes it (`ggml_vec_geglu_f32` with `GGML_GELU_FP16`),
//! so that Gemma's FFN gives llama.cpp's numbers: 0 at or below -10, the identity at or above 10,
//! and in between the input rounded to f16 and looked up in a table of `f16(gelu(x))` over every
//! f16 value, `gelu` being [`Activation::apply`]'s tanh form in f32.

use std::sync::OnceLock;

use half::f16;

use crate::Activation;

/// `f16(gelu(x))` as f32 for every f16 bit pattern `x` (256 KiB, built on first use).
fn gelu_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                f16::from_f32(Activation::GeluTanh.apply(x)).to_f32()
            })
            .collect()
    })
}

/// GELU (tanh form) of one value, as ggml's f16 table gives it (see the module docs).
#[inline]
pub fn gelu_value(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        gelu_table()[f16::from_f32(x).to_bits() as usize]
    }
}

/// `gate = gelu(gate) * up` with GELU's tanh form ([`gelu_value`]), over the common prefix.
pub fn gelu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let a = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            table[f16::from_f32(x).to_bits() as usize]
        };
        *g = a * u;
    }
}

/// `act(x)` of one value, as [`act_mul_inplace`] computes it.
#[inline]
pub fn act_value(act: Activation, x: f32) -> f32 {
    match act {
        Activation::GeluTanh => gelu_value(x),
        other => other.apply(x),
    }
}

/// `gate = act(gate) * up` over the common prefix, with the kernel of `act`.
pub fn act_mul_inplace(act: Activation, gate: &mut [f32], up: &[f32]) {
    match act {
        Activation::Silu => crate::silu_mul_inplace(gate, up),
        Activation::Relu => crate::relu_mul_inplace(gate, up),
        Activation::GeluTanh => gelu_mul_inplace(gate, up),
    }
}
