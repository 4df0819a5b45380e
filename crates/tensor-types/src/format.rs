//! The weight format table: every ggml storage type the crates know, one row each.
//!
//! Adding a ggml format is one row in the `formats!` invocation below (its name, ggml type id, block
//! length and block bytes as in llama.cpp's `ggml.c` `type_traits`); the enum variant, [`WeightFormat::GGML`],
//! the id lookups and the size methods are generated from it. [`WeightFormat::I4Hybrid`] is the one format
//! outside the table: it has no ggml id and its rows carry more than whole blocks (see [`crate::hybrid`]).

use std::fmt;

use crate::hybrid;

/// Generates [`WeightFormat`] and its table methods from one row per ggml format:
/// `Name = (ggml type id, elements per block, bytes per block)`, the name spelled as ggml does.
macro_rules! formats {
    ($(
        $(#[$doc:meta])*
        $name:ident = ($id:literal, $block_len:literal, $block_bytes:literal),
    )*) => {
        /// Storage format of a weight matrix or tensor (row-major, llama.cpp block layouts).
        ///
        /// Every variant but [`I4Hybrid`](Self::I4Hybrid) is a ggml type with a fixed type id
        /// ([`ggml_id`](Self::ggml_id)): the formats of GGUF files. A row of `cols` elements is
        /// `cols / block_len()` blocks of `block_bytes()` bytes.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[allow(non_camel_case_types)] // llama.cpp / GGUF names
        pub enum WeightFormat {
            $( $(#[$doc])* $name, )*
            /// PowerInfer-2 (section 7.6) hybrid format: per-channel (per-row,
            /// no groups) symmetric INT4 weights plus exactly `outliers_per_row`
            /// INT8 outliers per row (layout in [`hybrid`](crate::hybrid)).
            /// `outliers_per_row: 0` is plain per-channel INT4. Rows must be a
            /// multiple of 32 wide and at most 65536 wide (u16 column indices), and
            /// `outliers_per_row <= cols`. Not a ggml type: [`ggml_id`](Self::ggml_id) is `None`.
            I4Hybrid {
                /// Outliers stored in every row (`k`; the quantizer picks the `k`
                /// weights of largest magnitude of the row).
                outliers_per_row: u16,
            },
        }

        impl WeightFormat {
            /// Every format of the table (all but [`I4Hybrid`](Self::I4Hybrid)), in declaration order.
            pub const GGML: [WeightFormat; [$($id),*].len()] = [$(WeightFormat::$name),*];

            /// The ggml type id, `None` for [`I4Hybrid`](Self::I4Hybrid).
            #[inline]
            pub fn ggml_id(self) -> Option<u32> {
                match self {
                    $(WeightFormat::$name => Some($id),)*
                    WeightFormat::I4Hybrid { .. } => None,
                }
            }

            /// The format of a ggml type id, or `None` if the table has no such row.
            #[inline]
            pub fn from_ggml_id(id: u32) -> Option<WeightFormat> {
                match id {
                    $($id => Some(WeightFormat::$name),)*
                    _ => None,
                }
            }

            /// The name as ggml and GGUF tools spell it (`"F32"`, `"Q4_K"`, ...); `"I4Hybrid"`.
            #[inline]
            pub fn name(self) -> &'static str {
                match self {
                    $(WeightFormat::$name => stringify!($name),)*
                    WeightFormat::I4Hybrid { .. } => "I4Hybrid",
                }
            }

            /// Number of elements per block (1 for float formats).
            #[inline]
            pub fn block_len(self) -> usize {
                match self {
                    $(WeightFormat::$name => $block_len,)*
                    WeightFormat::I4Hybrid { .. } => hybrid::GROUP,
                }
            }

            /// Bytes per block. For [`I4Hybrid`](Self::I4Hybrid) this is only the
            /// 16 nibble bytes of 32 elements: its rows also hold scales and
            /// outliers, use [`row_bytes`](Self::row_bytes).
            #[inline]
            pub fn block_bytes(self) -> usize {
                match self {
                    $(WeightFormat::$name => $block_bytes,)*
                    WeightFormat::I4Hybrid { .. } => hybrid::GROUP / 2,
                }
            }
        }
    };
}

formats! {
    /// Little-endian f32, 4 bytes per element.
    F32 = (0, 1, 4),
    /// Little-endian IEEE half, 2 bytes per element.
    F16 = (1, 1, 2),
    /// Little-endian bfloat16, 2 bytes per element.
    BF16 = (30, 1, 2),
    /// Blocks of 32: `{ d: f16, qs: [i8; 32] }` (34 bytes), `x = d * q`.
    Q8_0 = (8, 32, 34),
    /// Blocks of 32: `{ d: f16, qs: [u8; 16] }` (18 bytes); element `j < 16` is
    /// `d * ((qs[j] & 0xF) - 8)`, element `j + 16` is `d * ((qs[j] >> 4) - 8)`.
    Q4_0 = (2, 32, 18),
    /// Blocks of 32: `{ d: f16, m: f16, qs: [u8; 16] }` (20 bytes); element `j`
    /// is `d * (qs[j] & 0xF) + m`, element `j + 16` is `d * (qs[j] >> 4) + m`.
    Q4_1 = (3, 32, 20),
    /// Blocks of 32: `{ d: f16, qh: [u8; 4], qs: [u8; 16] }` (22 bytes), `qh` a
    /// little-endian u32 of fifth bits; element `j < 16` is
    /// `d * (((qs[j] & 0xF) | ((qh >> j) & 1) << 4) - 16)`, element `j + 16` is
    /// `d * (((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16)`.
    Q5_0 = (6, 32, 22),
    /// Blocks of 32: `{ d: f16, m: f16, qh: [u8; 4], qs: [u8; 16] }` (24 bytes);
    /// the unsigned 5-bit `q` as in [`Q5_0`](Self::Q5_0), element is `d * q + m`.
    Q5_1 = (7, 32, 24),
    /// llama.cpp K-quant super-blocks of 256: `{ scales: [u8; 16],
    /// qs: [u8; 64], d: f16, dmin: f16 }` (84 bytes, `d` and `dmin` last).
    /// Sixteen sub-blocks of 16, each with a 4-bit scale `sc` (low nibble of
    /// `scales[s]`) and 4-bit min `m` (high nibble); element `i` is
    /// `d*sc * q - dmin*m` with 2-bit `q`, bits `2k..2k+2` of
    /// `qs[32n + i % 32]` for `n = i / 128`, `k = i % 128 / 32`.
    Q2_K = (10, 256, 84),
    /// llama.cpp K-quant super-blocks of 256: `{ hmask: [u8; 32],
    /// qs: [u8; 64], scales: [u8; 12], d: f16 }` (110 bytes, `d` last).
    /// Sixteen sub-blocks of 16 with a 6-bit scale `ls` each (low 4 bits in
    /// nibble `s / 8` of `scales[s % 8]`, high 2 bits at bit `2(s / 4)` of
    /// `scales[8 + s % 4]`); element `i` is `d * (ls - 32) * q` with
    /// `q = lo - 4 * (1 - h)` in -4..=3: `lo` the 2 bits of `qs` as in
    /// [`Q2_K`](Self::Q2_K), `h` bit `i / 32` of `hmask[i % 32]`.
    Q3_K = (11, 256, 110),
    /// llama.cpp K-quant super-blocks of 256: `{ d: f16, dmin: f16,
    /// scales: [u8; 12], qs: [u8; 128] }` (144 bytes). Eight sub-blocks of 32,
    /// each with a 6-bit scale `sc` and 6-bit min `m` packed in `scales`
    /// (`get_scale_min_k4`); element `i` of sub-block `s` is
    /// `d*sc * q - dmin*m` with 4-bit `q` (low nibbles of a 32-byte group for
    /// the even sub-block, high nibbles for the odd one).
    Q4_K = (12, 256, 144),
    /// llama.cpp K-quant super-blocks of 256: `{ d: f16, dmin: f16,
    /// scales: [u8; 12], qh: [u8; 32], qs: [u8; 128] }` (176 bytes). Scales,
    /// mins and nibbles as in [`Q4_K`](Self::Q4_K); the fifth bit of element
    /// `i` is bit `i / 32` of `qh[i % 32]`, so element `i` of sub-block `s`
    /// is `d*sc * q - dmin*m` with 5-bit `q`.
    Q5_K = (13, 256, 176),
    /// llama.cpp K-quant super-blocks of 256: `{ ql: [u8; 128], qh: [u8; 64],
    /// scales: [i8; 16], d: f16 }` (210 bytes, `d` last). Sixteen sub-blocks
    /// of 16 with a signed 8-bit scale each; element is `d * sc * (q - 32)`
    /// with 6-bit `q` (4 low bits in `ql`, 2 high bits in `qh`).
    Q6_K = (14, 256, 210),
    /// Non-linear 4-bit blocks of 32: `{ d: f16, qs: [u8; 16] }` (18 bytes);
    /// element `j < 16` is `d * IQ4NL_VALUES[qs[j] & 0xF]`, element `j + 16`
    /// `d * IQ4NL_VALUES[qs[j] >> 4]` (llama.cpp `kvalues_iq4nl`).
    IQ4_NL = (20, 32, 18),
    /// Non-linear 4-bit super-blocks of 256: `{ d: f16, scales_h: u16,
    /// scales_l: [u8; 4], qs: [u8; 128] }` (136 bytes). Eight sub-blocks of 32,
    /// each with a 6-bit scale `ls` (low 4 bits in nibble `s % 2` of
    /// `scales_l[s / 2]`, high 2 bits at bit `2s` of `scales_h`); element is
    /// `d * (ls - 32) * IQ4NL_VALUES[q]`, the nibbles of `qs[16s..16s + 16]`
    /// in [`IQ4_NL`](Self::IQ4_NL) order.
    IQ4_XS = (23, 256, 136),
}

/// The 16 values of a 4-bit [`WeightFormat::IQ4_NL`] / [`WeightFormat::IQ4_XS`] quant
/// (llama.cpp `kvalues_iq4nl`).
pub const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

impl WeightFormat {
    /// Bytes of one row of `cols` elements, or `None` if `cols` is not a
    /// multiple of [`block_len`](Self::block_len) or the size overflows.
    /// [`I4Hybrid`](Self::I4Hybrid): `8 + cols/2 + 3k` rounded up to a
    /// multiple of 4, `None` also when `cols > 65536` or `k > cols`.
    #[inline]
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if cols % self.block_len() != 0 {
            return None;
        }
        if let WeightFormat::I4Hybrid {
            outliers_per_row: k,
        } = self
        {
            return hybrid::row_bytes(usize::from(k), cols);
        }
        (cols / self.block_len()).checked_mul(self.block_bytes())
    }

    /// Whether this is the [`I4Hybrid`](Self::I4Hybrid) format.
    #[inline]
    pub fn is_hybrid(self) -> bool {
        matches!(self, WeightFormat::I4Hybrid { .. })
    }

    /// The [`I4Hybrid`](Self::I4Hybrid) format with `k = ceil(frac * cols)`
    /// outliers per row (`frac` clamped to `0..=1`), e.g. `frac = 0.01` for
    /// 1% outliers. `None` when `k` does not fit in a `u16`.
    pub fn hybrid_for(frac: f32, cols: usize) -> Option<WeightFormat> {
        // The slack keeps f32 rounding of e.g. 0.07 (0.0700000003) from
        // adding an outlier: 0.07 * 100 gives 7, not 8.
        let x = f64::from(frac.clamp(0.0, 1.0)) * cols as f64;
        let k = (x - x * 1e-6).ceil() as usize;
        Some(WeightFormat::I4Hybrid {
            outliers_per_row: u16::try_from(k.min(cols)).ok()?,
        })
    }

    /// Whether this is a block-quantized format (block length > 1; the
    /// kernels' integer path in `Precision::Fast` and `Precision::Int8`).
    #[inline]
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }

    /// Whether this is a K-quant format: super-blocks of 256 elements (the
    /// `Q*_K` formats and [`IQ4_XS`](Self::IQ4_XS)).
    #[inline]
    pub fn is_k_quant(self) -> bool {
        self.block_len() == 256
    }
}

/// The [`name`](WeightFormat::name); `I4Hybrid(k=K)` for the hybrid format.
impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightFormat::I4Hybrid { outliers_per_row } => {
                write!(f, "I4Hybrid(k={outliers_per_row})")
            }
            other => f.write_str(other.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `ggml.c` `type_traits` (`type_name`, `blck_size`, `type_size`) and `ggml.h`
    /// `enum ggml_type` ids for the formats of the table, written out independently of it.
    const LLAMA_CPP: [(&str, u32, usize, usize); 15] = [
        ("F32", 0, 1, 4),
        ("F16", 1, 1, 2),
        ("Q4_0", 2, 32, 18),
        ("Q4_1", 3, 32, 20),
        ("Q5_0", 6, 32, 22),
        ("Q5_1", 7, 32, 24),
        ("Q8_0", 8, 32, 34),
        ("Q2_K", 10, 256, 84),
        ("Q3_K", 11, 256, 110),
        ("Q4_K", 12, 256, 144),
        ("Q5_K", 13, 256, 176),
        ("Q6_K", 14, 256, 210),
        ("IQ4_NL", 20, 32, 18),
        ("IQ4_XS", 23, 256, 136),
        ("BF16", 30, 1, 2),
    ];

    #[test]
    fn ids_round_trip() {
        for f in WeightFormat::GGML {
            let id = f.ggml_id().expect("a table format has an id");
            assert_eq!(WeightFormat::from_ggml_id(id), Some(f));
            assert_eq!(f.to_string(), f.name());
        }
        let hy = WeightFormat::I4Hybrid {
            outliers_per_row: 6,
        };
        assert_eq!(hy.ggml_id(), None);
        assert_eq!(hy.to_string(), "I4Hybrid(k=6)");
        for id in [4, 5, 9, 15, 16, 17, 29, 31, 1000, u32::MAX] {
            assert_eq!(WeightFormat::from_ggml_id(id), None, "id {id}");
        }
    }

    #[test]
    fn sizes_match_llama_cpp() {
        assert_eq!(WeightFormat::GGML.len(), LLAMA_CPP.len());
        for (name, id, len, bytes) in LLAMA_CPP {
            let f = WeightFormat::from_ggml_id(id).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(f.name(), name);
            assert_eq!(f.block_len(), len, "{name}");
            assert_eq!(f.block_bytes(), bytes, "{name}");
        }
    }

    #[test]
    fn row_bytes() {
        use WeightFormat::*;
        assert_eq!(Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(Q8_0.row_bytes(33), None);
        assert_eq!(Q5_0.row_bytes(896), Some(28 * 22));
        assert_eq!(Q5_1.row_bytes(896), Some(28 * 24));
        assert_eq!(Q6_K.row_bytes(512), Some(420));
        assert_eq!(Q2_K.row_bytes(512), Some(168));
        assert_eq!(Q3_K.row_bytes(768), Some(330));
        assert_eq!(Q4_K.row_bytes(576), None);
        assert_eq!(F32.row_bytes(usize::MAX), None);
        assert_eq!(F16.row_bytes(0), Some(0));
        let hy = |k| I4Hybrid {
            outliers_per_row: k,
        };
        // 8 + 288 + 18 = 314, rounded up to 316 (the crate docs' SmolLM2 figures).
        assert_eq!(hy(6).row_bytes(576), Some(316));
        assert_eq!(hy(16).row_bytes(1536), Some(824));
        assert_eq!(hy(0).row_bytes(48), None);
        assert_eq!(hy(33).row_bytes(32), None);
        assert_eq!(hy(0).row_bytes(1 << 17), None);
        assert!(Q4_K.is_quantized() && Q6_K.is_k_quant() && !Q8_0.is_k_quant());
        assert!(!F16.is_quantized() && hy(1).is_quantized() && hy(1).is_hybrid());
    }

    #[test]
    fn hybrid_for_rounds_up() {
        assert_eq!(
            WeightFormat::hybrid_for(0.01, 576),
            Some(WeightFormat::I4Hybrid {
                outliers_per_row: 6
            })
        );
        assert_eq!(
            WeightFormat::hybrid_for(0.07, 100),
            Some(WeightFormat::I4Hybrid {
                outliers_per_row: 7
            })
        );
        assert_eq!(WeightFormat::hybrid_for(1.0, 1 << 17), None);
    }
}
