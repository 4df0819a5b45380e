//! [`Activation`]: the activation function of a gated FFN.

/// The FFN activation of a gated FFN: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Activation {
    /// `x / (1 + exp(-x))` (`x * sigmoid(x)`); no exact zeros, sparsity comes from calibrated thresholds.
    Silu,
    /// `max(x, 0)`; exact zeros.
    Relu,
    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/π) x (1 + 0.044715 x²)))` (Gemma's
    /// GeGLU; HF `gelu_pytorch_tanh`); no exact zeros.
    GeluTanh,
}

/// `sqrt(2 / π)`, as ggml writes it (`SQRT_2_OVER_PI`).
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The cubic term's coefficient of the tanh approximation (ggml's `GELU_COEF_A`).
const GELU_COEF_A: f32 = 0.044_715;

impl Activation {
    /// Applies the activation to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Silu => x / (1.0 + (-x).exp()),
            Activation::Relu => x.max(0.0),
            Activation::GeluTanh => {
                0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
            }
        }
    }

    /// The activation a model config names (`hidden_act` and the like), case-insensitive:
    /// `silu`/`swish`/`swiglu`, `relu`/`reglu`, or `gelu_pytorch_tanh`/`gelu_tanh`/`geglu`
    /// (`gelu` alone, the exact erf form, is not this one); `None` for anything else.
    pub fn from_name(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "silu" | "swish" | "swiglu" => Some(Self::Silu),
            "relu" | "reglu" => Some(Self::Relu),
            "gelu_pytorch_tanh" | "gelu_tanh" | "geglu" => Some(Self::GeluTanh),
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
        assert_eq!(
            Activation::from_name("gelu_pytorch_tanh"),
            Some(Activation::GeluTanh)
        );
    }

    /// GELU's tanh form against the formula in f64 over [-12, 12], and its two tails.
    #[test]
    fn gelu_tanh_matches_the_formula_in_f64() {
        for i in -1200..=1200 {
            let x = i as f32 / 100.0;
            let xd = x as f64;
            let inner = (2.0 / std::f64::consts::PI).sqrt() * xd * (1.0 + 0.044715 * xd * xd);
            let want = 0.5 * xd * (1.0 + inner.tanh());
            let got = Activation::GeluTanh.apply(x) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "gelu({x}) = {got}, want {want}"
            );
        }
        assert_eq!(Activation::GeluTanh.apply(0.0), 0.0);
        assert!(Activation::GeluTanh.apply(-20.0).abs() < 1e-6);
        assert!((Activation::GeluTanh.apply(20.0) - 20.0).abs() < 1e-5);
    }
}
