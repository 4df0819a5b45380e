//! GGUF metadata values.

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 12.
    F64(f64),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8 (UTF-8).
    String(String),
    /// GGUF type 9. In a file, all elements of an array have the same type.
    Array(Vec<MetaValue>),
}

/// GGUF value type ids.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

impl MetaValue {
    /// The GGUF value type id of this value.
    pub fn gguf_type_id(&self) -> u32 {
        match self {
            MetaValue::U8(_) => type_id::U8,
            MetaValue::I8(_) => type_id::I8,
            MetaValue::U16(_) => type_id::U16,
            MetaValue::I16(_) => type_id::I16,
            MetaValue::U32(_) => type_id::U32,
            MetaValue::I32(_) => type_id::I32,
            MetaValue::U64(_) => type_id::U64,
            MetaValue::I64(_) => type_id::I64,
            MetaValue::F32(_) => type_id::F32,
            MetaValue::F64(_) => type_id::F64,
            MetaValue::Bool(_) => type_id::BOOL,
            MetaValue::String(_) => type_id::STRING,
            MetaValue::Array(_) => type_id::ARRAY,
        }
    }

    /// Any integer value that is `>= 0`, as `u64`. Not floats, not bools.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer value that fits in `i64`. Not floats, not bools.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Floats and integers, as `f64` (large 64-bit integers are rounded).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v.into()),
            MetaValue::F64(v) => Some(v),
            MetaValue::U64(v) => Some(v as f64),
            MetaValue::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value's elements.
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// An array whose elements are all strings.
    pub fn to_string_vec(&self) -> Option<Vec<String>> {
        self.as_array()?
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect()
    }

    /// An array whose elements are all integers that fit in `i64`.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        self.as_array()?.iter().map(MetaValue::as_i64).collect()
    }
}

impl From<&str> for MetaValue {
    fn from(s: &str) -> Self {
        MetaValue::String(s.to_owned())
    }
}

impl From<String> for MetaValue {
    fn from(s: String) -> Self {
        MetaValue::String(s)
    }
}

impl From<u32> for MetaValue {
    fn from(v: u32) -> Self {
        MetaValue::U32(v)
    }
}

impl From<f32> for MetaValue {
    fn from(v: f32) -> Self {
        MetaValue::F32(v)
    }
}

impl From<bool> for MetaValue {
    fn from(v: bool) -> Self {
        MetaValue::Bool(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors() {
        assert_eq!(MetaValue::I8(-1).as_u64(), None);
        assert_eq!(MetaValue::I8(5).as_u64(), Some(5));
        assert_eq!(MetaValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(MetaValue::U64(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(MetaValue::Bool(true).as_u64(), None);
        assert_eq!(MetaValue::F32(1.5).as_u64(), None);
        assert_eq!(MetaValue::F32(1.5).as_f64(), Some(1.5));
        assert_eq!(MetaValue::U16(7).as_f64(), Some(7.0));
        assert_eq!(MetaValue::I64(-7).as_f64(), Some(-7.0));
        assert_eq!(MetaValue::Bool(false).as_bool(), Some(false));
        assert_eq!(MetaValue::U8(0).as_bool(), None);
        assert_eq!(MetaValue::from("x").as_str(), Some("x"));
        let a = MetaValue::Array(vec!["a".into(), "b".into()]);
        assert_eq!(
            a.to_string_vec(),
            Some(vec!["a".to_owned(), "b".to_owned()])
        );
        assert_eq!(a.to_i64_vec(), None);
        let b = MetaValue::Array(vec![MetaValue::I32(-3), MetaValue::U8(4)]);
        assert_eq!(b.to_i64_vec(), Some(vec![-3, 4]));
        assert_eq!(b.to_string_vec(), None);
        assert_eq!(b.as_array().map(<[_]>::len), Some(2));
        assert_eq!(MetaValue::U8(1).as_array(), None);
        assert_eq!(MetaValue::Array(vec![]).to_i64_vec(), Some(vec![]));
    }
}
