//! Reading a client's `Qnn_Tensor_t`: its description, and static data dequantized to f32
//! (`float = (q + offset) * scale`, per tensor or per index of the quantized axis).

use std::ffi::CStr;

use npu_qnn_sys::*;

/// A tensor as the double keeps it.
pub(crate) struct TensorObj {
    pub name: String,
    pub kind: Qnn_TensorType_t,
    pub dims: Vec<u32>,
    /// STATIC tensors: the values, dequantized.
    pub values: Option<Vec<f32>>,
    /// Whether a node writes it (NATIVE and APP_READ tensors).
    pub produced: bool,
}

impl TensorObj {
    pub fn len(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
}

/// Reads a tensor description for `tensorCreateGraphTensor`; `Err` is a QNN error code.
///
/// # Safety
/// `t`'s pointers (name, dimensions, client buffer) must be valid as the QNN API requires of a
/// tensor passed to `tensorCreateGraphTensor`.
pub(crate) unsafe fn read_new(t: &Qnn_TensorV1_t) -> Result<TensorObj, u64> {
    if t.name.is_null() || (t.rank > 0 && t.dimensions.is_null()) {
        return Err(QNN_COMMON_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null (checked), NUL-terminated by the API's contract.
    let name = unsafe { CStr::from_ptr(t.name) }
        .to_string_lossy()
        .into_owned();
    let dims = if t.rank == 0 {
        Vec::new()
    } else {
        // SAFETY: `dimensions` holds `rank` values (API contract), non-null (checked).
        unsafe { std::slice::from_raw_parts(t.dimensions, t.rank as usize) }.to_vec()
    };
    if dims.contains(&0) || t.dataFormat != QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER {
        return Err(QNN_COMMON_ERROR_INVALID_ARGUMENT);
    }
    let mut obj = TensorObj {
        name,
        kind: t.type_,
        dims,
        values: None,
        produced: false,
    };
    match t.type_ {
        QNN_TENSOR_TYPE_APP_WRITE | QNN_TENSOR_TYPE_APP_READ | QNN_TENSOR_TYPE_NATIVE => {
            // The double computes in f32 only.
            if t.dataType != QNN_DATATYPE_FLOAT_32 {
                return Err(QNN_COMMON_ERROR_NOT_SUPPORTED);
            }
        }
        QNN_TENSOR_TYPE_STATIC => {
            if t.memType != QNN_TENSORMEMTYPE_RAW {
                return Err(QNN_COMMON_ERROR_NOT_SUPPORTED);
            }
            // SAFETY: RAW static tensors carry their data in `clientBuf` (memType checked).
            let buf = unsafe { t.memory.clientBuf };
            if buf.data.is_null() {
                return Err(QNN_COMMON_ERROR_INVALID_ARGUMENT);
            }
            // SAFETY: `data` points at `dataSize` readable bytes (API contract), non-null.
            let bytes =
                unsafe { std::slice::from_raw_parts(buf.data.cast::<u8>(), buf.dataSize as usize) };
            // SAFETY: the quantization arrays are valid (this function's contract).
            obj.values = Some(unsafe { dequantize(t, &obj.dims, bytes) }?);
        }
        _ => return Err(QNN_COMMON_ERROR_NOT_SUPPORTED),
    }
    Ok(obj)
}

/// Per-element scale and offset of a quantized tensor.
struct Encoding {
    axis: Option<usize>,
    scales: Vec<f32>,
    offsets: Vec<i32>,
}

/// # Safety
/// The encoding's arrays must hold the counts they state (API contract).
unsafe fn encoding(q: &Qnn_QuantizeParams_t, dims: &[u32]) -> Result<Encoding, u64> {
    let bad = Err(QNN_COMMON_ERROR_INVALID_ARGUMENT);
    if q.encodingDefinition != QNN_DEFINITION_DEFINED {
        return bad;
    }
    let per_axis = |axis: i32, n: u32| -> Result<usize, u64> {
        let a = usize::try_from(axis).map_err(|_| QNN_COMMON_ERROR_INVALID_ARGUMENT)?;
        if a >= dims.len() || dims[a] != n {
            return Err(QNN_COMMON_ERROR_INVALID_ARGUMENT);
        }
        Ok(a)
    };
    match q.quantizationEncoding {
        QNN_QUANTIZATION_ENCODING_SCALE_OFFSET => {
            // SAFETY: the live member for this encoding.
            let so = unsafe { q.encoding.scaleOffsetEncoding };
            Ok(Encoding {
                axis: None,
                scales: vec![so.scale],
                offsets: vec![so.offset],
            })
        }
        QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET => {
            // SAFETY: the live member for this encoding.
            let e = unsafe { q.encoding.axisScaleOffsetEncoding };
            let axis = per_axis(e.axis, e.numScaleOffsets)?;
            if e.scaleOffset.is_null() {
                return bad;
            }
            // SAFETY: `numScaleOffsets` pairs (API contract), non-null (checked).
            let so =
                unsafe { std::slice::from_raw_parts(e.scaleOffset, e.numScaleOffsets as usize) };
            Ok(Encoding {
                axis: Some(axis),
                scales: so.iter().map(|s| s.scale).collect(),
                offsets: so.iter().map(|s| s.offset).collect(),
            })
        }
        QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET => {
            // SAFETY: the live member for this encoding.
            let e = unsafe { q.encoding.bwAxisScaleOffsetEncoding };
            let axis = per_axis(e.axis, e.numElements)?;
            if e.scales.is_null() {
                return bad;
            }
            let n = e.numElements as usize;
            // SAFETY: `numElements` scales (API contract), non-null (checked).
            let scales = unsafe { std::slice::from_raw_parts(e.scales, n) }.to_vec();
            let offsets = if e.offsets.is_null() {
                vec![0; n]
            } else {
                // SAFETY: `numElements` offsets when non-null (API contract).
                unsafe { std::slice::from_raw_parts(e.offsets, n) }.to_vec()
            };
            Ok(Encoding {
                axis: Some(axis),
                scales,
                offsets,
            })
        }
        _ => Err(QNN_COMMON_ERROR_NOT_SUPPORTED),
    }
}

/// Static data → f32 values.
///
/// # Safety
/// As [`read_new`] (the quantization arrays are read).
unsafe fn dequantize(t: &Qnn_TensorV1_t, dims: &[u32], bytes: &[u8]) -> Result<Vec<f32>, u64> {
    let n: usize = dims.iter().map(|&d| d as usize).product();
    let size_err = Err(QNN_COMMON_ERROR_INVALID_ARGUMENT);
    // Quantized integers, before scaling.
    let ints: Vec<i32> = match t.dataType {
        QNN_DATATYPE_FLOAT_32 => {
            if bytes.len() != n * 4 {
                return size_err;
            }
            return Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect());
        }
        QNN_DATATYPE_SFIXED_POINT_8 | QNN_DATATYPE_UFIXED_POINT_8 => {
            if bytes.len() != n {
                return size_err;
            }
            let signed = t.dataType == QNN_DATATYPE_SFIXED_POINT_8;
            bytes
                .iter()
                .map(|&b| if signed { b as i8 as i32 } else { b as i32 })
                .collect()
        }
        QNN_DATATYPE_SFIXED_POINT_4 | QNN_DATATYPE_UFIXED_POINT_4 => {
            // Packed two a byte, the first value in the low nibble.
            if bytes.len() != n.div_ceil(2) {
                return size_err;
            }
            let signed = t.dataType == QNN_DATATYPE_SFIXED_POINT_4;
            (0..n)
                .map(|i| {
                    let nib = (bytes[i / 2] >> (4 * (i % 2))) & 0xF;
                    if signed {
                        ((nib << 4) as i8 >> 4) as i32
                    } else {
                        nib as i32
                    }
                })
                .collect()
        }
        _ => return Err(QNN_COMMON_ERROR_NOT_SUPPORTED),
    };
    // SAFETY: forwarded contract of this function.
    let enc = unsafe { encoding(&t.quantizeParams, dims) }?;
    let (stride, len) = match enc.axis {
        Some(a) => (
            dims[a + 1..].iter().map(|&d| d as usize).product::<usize>(),
            dims[a] as usize,
        ),
        None => (1, 1),
    };
    Ok(ints
        .iter()
        .enumerate()
        .map(|(i, &q)| {
            let k = if enc.axis.is_some() {
                (i / stride) % len
            } else {
                0
            };
            (q + enc.offsets[k]) as f32 * enc.scales[k]
        })
        .collect())
}
