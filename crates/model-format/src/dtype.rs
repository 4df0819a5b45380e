//! Tensor element types and their storage sizes.

use std::fmt;

/// The storage type of a tensor.
///
/// Block-quantized types store `block_len()` elements in `block_bytes()`
/// bytes; plain types have a block length of 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// bfloat16.
    BF16,
    /// ggml Q8_0: blocks of 32, an f16 scale and 32 `i8` (34 bytes).
    Q8_0,
    /// ggml Q4_0: blocks of 32, an f16 scale and 16 bytes of nibbles (18 bytes).
    Q4_0,
    /// ggml Q4_1: blocks of 32, f16 scale, f16 min and 16 bytes of nibbles (20 bytes).
    Q4_1,
    /// ggml Q4_K: super-blocks of 256 elements in 144 bytes.
    Q4_K,
    /// ggml Q6_K: super-blocks of 256 elements in 210 bytes.
    Q6_K,
}

impl DType {
    /// All supported types.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q4_K,
        DType::Q6_K,
    ];

    /// The type for a ggml type id, or `None` if this crate does not support it.
    pub fn from_ggml_id(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            8 => DType::Q8_0,
            12 => DType::Q4_K,
            14 => DType::Q6_K,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// The ggml type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q6_K => 14,
            DType::BF16 => 30,
        }
    }

    /// The type's name as ggml spells it: `"F32"`, `"Q4_1"`, ...
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q4_K => "Q4_K",
            DType::Q6_K => "Q6_K",
        }
    }

    /// Elements per block: 1 for plain floats, 32 for Q8_0/Q4_0/Q4_1, 256 for K-quants.
    pub fn block_len(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => 32,
            DType::Q4_K | DType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q4_K => 144,
            DType::Q6_K => 210,
        }
    }

    /// Bytes in one row of `cols` elements, or `None` if `cols` is not a
    /// multiple of [`block_len`](Self::block_len) or the size overflows.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if cols % self.block_len() != 0 {
            return None;
        }
        (cols / self.block_len()).checked_mul(self.block_bytes())
    }

    /// Whether this is a block-quantized type (block length > 1).
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_ggml_id(d.ggml_id()), Some(d));
            assert_eq!(d.to_string(), d.name());
        }
        for id in [4, 5, 6, 7, 9, 10, 11, 13, 15, 29, 31, 1000, u32::MAX] {
            assert_eq!(DType::from_ggml_id(id), None, "id {id}");
        }
    }

    #[test]
    fn sizes() {
        let expect = [
            (DType::F32, 1, 4),
            (DType::F16, 1, 2),
            (DType::BF16, 1, 2),
            (DType::Q8_0, 32, 34),
            (DType::Q4_0, 32, 18),
            (DType::Q4_1, 32, 20),
            (DType::Q4_K, 256, 144),
            (DType::Q6_K, 256, 210),
        ];
        for (d, len, bytes) in expect {
            assert_eq!(d.block_len(), len, "{d}");
            assert_eq!(d.block_bytes(), bytes, "{d}");
        }
        assert_eq!(DType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(DType::Q8_0.row_bytes(33), None);
        assert_eq!(DType::Q6_K.row_bytes(512), Some(420));
        assert_eq!(DType::F32.row_bytes(usize::MAX), None);
        assert_eq!(DType::F16.row_bytes(0), Some(0));
    }
}
