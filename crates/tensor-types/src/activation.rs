//! [`Activation`]: the activation function of a gated FFN.

/// The FFN activation of a gated FFN: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Activation {
    /// `x / (1 + exp(-x))` (`x * sigmoid(x)`); no exact zeros, sparsity comes from calibrated thresholds.
    Silu,
    /// `max(x, 0)`; exact zeros.
    Relu,
}

impl Activation {
    /// Applies the activation to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::Relu => x.max(0.0),
        }
    }

    /// The activation a model config names (`hidden_act` and the like), case-insensitive:
    /// `silu`/`swish`/`swiglu` or `relu`/`reglu`; `None` for anything else.
    pub fn from_name(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "silu" | "swish" | "swiglu" => Some(Self::Silu),
            "relu" | "reglu" => Some(Self::Relu),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values() {
        assert_eq!(Activation::from_name("SwiGLU"), Some(Activation::Silu));
        assert_eq!(Activation::from_name("relu"), Some(Activation::Relu));
        assert_eq!(Activation::from_name("gelu"), None);
        assert_eq!(Activation::Relu.apply(-2.0), 0.0);
        assert_eq!(Activation::Silu.apply(0.0), 0.0);
        assert!((Activation::Silu.apply(1.0) - 0.731_058_6).abs() < 1e-6);
    }
}
