//! Tensors, quantization parameters, op parameters and op configurations of `QnnTypes.h`.
//!
//! [`Qnn_Tensor_t`] is a versioned union; this crate writes version 1 ([`Qnn_TensorV1_t`]) but sizes
//! the union with version 2 ([`Qnn_TensorV2_t`], a superset), as the headers do: arrays of tensors
//! (op inputs, graph inputs) are read by the library with the header's stride.

use std::ffi::{c_char, c_void};

use crate::types::*;

/// `Qnn_ScaleOffset_t`: `float_value = (quantized_value + offset) * scale`, so `offset` is the
/// negative of the usual zero point.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Qnn_ScaleOffset_t {
    /// Scale, strictly positive.
    pub scale: f32,
    /// Offset added to the quantized value before scaling.
    pub offset: i32,
}

/// `Qnn_AxisScaleOffset_t`: one [`Qnn_ScaleOffset_t`] per index of dimension `axis`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qnn_AxisScaleOffset_t {
    /// The quantized dimension (0 = rows of a `[out, in]` weight matrix).
    pub axis: i32,
    /// Length of `scaleOffset` (= the size of dimension `axis`).
    pub numScaleOffsets: u32,
    /// The scales and offsets.
    pub scaleOffset: *mut Qnn_ScaleOffset_t,
}

/// `Qnn_BwScaleOffset_t`: per-tensor encoding with an explicit bit width.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qnn_BwScaleOffset_t {
    /// True bit width of the values (≤ the data type's).
    pub bitwidth: u32,
    /// Scale.
    pub scale: f32,
    /// Offset.
    pub offset: i32,
}

/// `Qnn_BwAxisScaleOffset_t`: per-axis encoding with an explicit bit width (how 4-bit weights are
/// described).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qnn_BwAxisScaleOffset_t {
    /// True bit width of the values (≤ the data type's).
    pub bitwidth: u32,
    /// The quantized dimension.
    pub axis: i32,
    /// Length of `scales` and `offsets`.
    pub numElements: u32,
    /// Scales, strictly positive.
    pub scales: *mut f32,
    /// Offsets, or null for symmetric quantization (all offsets 0).
    pub offsets: *mut i32,
}

/// `Qnn_BlockEncoding_t`: per-block encoding.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qnn_BlockEncoding_t {
    /// Block size along each dimension (length = rank).
    pub blockSize: *mut u32,
    /// One scale-offset pair per block.
    pub scaleOffset: *mut Qnn_ScaleOffset_t,
}

/// The encoding union of [`Qnn_QuantizeParams_t`]; which member is live says
/// `quantizationEncoding`. The later pointer members (`blockwiseExpansion`, `vectorEncoding`) are
/// pointer-sized and change neither size nor alignment; they are not bound.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Qnn_QuantizeParamsEncoding {
    /// `QNN_QUANTIZATION_ENCODING_SCALE_OFFSET`.
    pub scaleOffsetEncoding: Qnn_ScaleOffset_t,
    /// `QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET`.
    pub axisScaleOffsetEncoding: Qnn_AxisScaleOffset_t,
    /// `QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET`.
    pub bwScaleOffsetEncoding: Qnn_BwScaleOffset_t,
    /// `QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET`.
    pub bwAxisScaleOffsetEncoding: Qnn_BwAxisScaleOffset_t,
    /// `QNN_QUANTIZATION_ENCODING_BLOCK`.
    pub blockEncoding: Qnn_BlockEncoding_t,
}

/// `Qnn_QuantizeParams_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Qnn_QuantizeParams_t {
    /// Whether the encoding below is given (`QNN_DEFINITION_DEFINED`) or left to the backend.
    pub encodingDefinition: Qnn_Definition_t,
    /// Which member of `encoding` is live.
    pub quantizationEncoding: Qnn_QuantizationEncoding_t,
    /// The encoding.
    pub encoding: Qnn_QuantizeParamsEncoding,
}

impl Qnn_QuantizeParams_t {
    /// `QNN_QUANTIZE_PARAMS_INIT`: no quantization.
    pub const INIT: Self = Self {
        encodingDefinition: QNN_DEFINITION_UNDEFINED,
        quantizationEncoding: QNN_QUANTIZATION_ENCODING_UNDEFINED,
        encoding: Qnn_QuantizeParamsEncoding {
            scaleOffsetEncoding: Qnn_ScaleOffset_t {
                scale: 0.0,
                offset: 0,
            },
        },
    };
}

/// `Qnn_ClientBuffer_t`: client memory of a tensor (`QNN_TENSORMEMTYPE_RAW`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qnn_ClientBuffer_t {
    /// The data.
    pub data: *mut c_void,
    /// Its size in bytes (32 bits: one tensor's data is under 4 GiB).
    pub dataSize: u32,
}

/// The memory union of a tensor; which member is live says `memType`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Qnn_TensorMemory {
    /// `QNN_TENSORMEMTYPE_RAW`.
    pub clientBuf: Qnn_ClientBuffer_t,
    /// `QNN_TENSORMEMTYPE_MEMHANDLE`.
    pub memHandle: Qnn_MemHandle_t,
}

/// `Qnn_TensorV1_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Qnn_TensorV1_t {
    /// Identifier, assigned by the backend when the tensor is created.
    pub id: u32,
    /// Name, unique in its graph.
    pub name: *const c_char,
    /// `QNN_TENSOR_TYPE_*`.
    pub type_: Qnn_TensorType_t,
    /// `QNN_TENSOR_DATA_FORMAT_*`.
    pub dataFormat: Qnn_TensorDataFormat_t,
    /// `QNN_DATATYPE_*`.
    pub dataType: Qnn_DataType_t,
    /// Quantization of fixed-point data.
    pub quantizeParams: Qnn_QuantizeParams_t,
    /// Number of dimensions.
    pub rank: u32,
    /// `rank` dimensions, outermost first; null when `rank` is 0.
    pub dimensions: *mut u32,
    /// Which member of `memory` is live.
    pub memType: Qnn_TensorMemType_t,
    /// The data.
    pub memory: Qnn_TensorMemory,
}

/// `Qnn_SparseParams_t` (type and the hybrid-COO layout, its only member).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Qnn_SparseParams_t {
    /// `Qnn_SparseLayoutType_t`.
    pub type_: u32,
    /// `hybridCoo.numSpecifiedElements`.
    pub numSpecifiedElements: u32,
    /// `hybridCoo.numSparseDimensions`.
    pub numSparseDimensions: u32,
}

/// `Qnn_TensorV2_t`: [`Qnn_TensorV1_t`]'s fields, then dynamic dimensions, sparsity and
/// `isProduced`. Bound for the size of [`Qnn_Tensor_t`]; this crate's users write version 1.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Qnn_TensorV2_t {
    /// The fields shared with version 1 (same offsets).
    pub v1: Qnn_TensorV1_t,
    /// Per dimension, whether it is dynamic; may be null.
    pub isDynamicDimensions: *mut u8,
    /// Sparse layout.
    pub sparseParams: Qnn_SparseParams_t,
    /// Set by execute for outputs it produced.
    pub isProduced: u8,
}

/// The version union of [`Qnn_Tensor_t`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union Qnn_TensorVersions {
    /// `QNN_TENSOR_VERSION_1`.
    pub v1: Qnn_TensorV1_t,
    /// `QNN_TENSOR_VERSION_2`.
    pub v2: Qnn_TensorV2_t,
}

/// `Qnn_Tensor_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Qnn_Tensor_t {
    /// `QNN_TENSOR_VERSION_*`.
    pub version: Qnn_TensorVersion_t,
    /// The tensor.
    pub v: Qnn_TensorVersions,
}

impl Qnn_Tensor_t {
    /// A version-1 tensor.
    pub fn from_v1(v1: Qnn_TensorV1_t) -> Self {
        // Written through the larger member, so the tail the library may read as version 2 is zeroed.
        let v2 = Qnn_TensorV2_t {
            v1,
            isDynamicDimensions: std::ptr::null_mut(),
            sparseParams: Qnn_SparseParams_t::default(),
            isProduced: 0,
        };
        Self {
            version: QNN_TENSOR_VERSION_1,
            v: Qnn_TensorVersions { v2 },
        }
    }

    /// The version-1 view, valid for both versions (version 2 starts with version 1's fields), or
    /// `None` for an unknown version.
    pub fn v1(&self) -> Option<&Qnn_TensorV1_t> {
        match self.version {
            // SAFETY: both union members start with a `Qnn_TensorV1_t` at offset 0 and every bit
            // pattern of its fields is a valid value (integers, raw pointers, unions of those).
            QNN_TENSOR_VERSION_1 | QNN_TENSOR_VERSION_2 => Some(unsafe { &self.v.v1 }),
            _ => None,
        }
    }

    /// The mutable version-1 view (see [`Qnn_Tensor_t::v1`]).
    pub fn v1_mut(&mut self) -> Option<&mut Qnn_TensorV1_t> {
        match self.version {
            // SAFETY: as in `v1`: the prefix is a `Qnn_TensorV1_t` in both versions, any bits valid.
            QNN_TENSOR_VERSION_1 | QNN_TENSOR_VERSION_2 => Some(unsafe { &mut self.v.v1 }),
            _ => None,
        }
    }
}

/// The value union of [`Qnn_Scalar_t`] (the members this crate uses; all others are at most 8 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub union Qnn_ScalarValue {
    /// `floatValue`.
    pub floatValue: f32,
    /// `doubleValue`.
    pub doubleValue: f64,
    /// `uint64Value`.
    pub uint64Value: u64,
    /// `int64Value`.
    pub int64Value: i64,
    /// `uint32Value`.
    pub uint32Value: u32,
    /// `int32Value`.
    pub int32Value: i32,
    /// `bool8Value`.
    pub bool8Value: u8,
    /// `stringValue`.
    pub stringValue: *const c_char,
}

/// `Qnn_Scalar_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Qnn_Scalar_t {
    /// `QNN_DATATYPE_*` of the value.
    pub dataType: Qnn_DataType_t,
    /// The value.
    pub value: Qnn_ScalarValue,
}

/// The union of [`Qnn_Param_t`].
#[repr(C)]
#[derive(Clone, Copy)]
pub union Qnn_ParamValue {
    /// `QNN_PARAMTYPE_SCALAR`.
    pub scalarParam: Qnn_Scalar_t,
    /// `QNN_PARAMTYPE_TENSOR` (a STATIC tensor).
    pub tensorParam: Qnn_Tensor_t,
}

/// `Qnn_Param_t`: a named scalar or tensor parameter of a node.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Qnn_Param_t {
    /// `QNN_PARAMTYPE_*`.
    pub paramType: Qnn_ParamType_t,
    /// Parameter name (e.g. `keep_dims`).
    pub name: *const c_char,
    /// The value.
    pub value: Qnn_ParamValue,
}

/// `Qnn_OpConfigV1_t`: one node.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qnn_OpConfigV1_t {
    /// Node name.
    pub name: *const c_char,
    /// Op package (`qti.aisw` for built-in ops).
    pub packageName: *const c_char,
    /// Op type (e.g. `FullyConnected`).
    pub typeName: *const c_char,
    /// Length of `params`.
    pub numOfParams: u32,
    /// Parameters.
    pub params: *mut Qnn_Param_t,
    /// Length of `inputTensors`.
    pub numOfInputs: u32,
    /// Inputs (only their ids are read by `graphAddNode`).
    pub inputTensors: *mut Qnn_Tensor_t,
    /// Length of `outputTensors`.
    pub numOfOutputs: u32,
    /// Outputs.
    pub outputTensors: *mut Qnn_Tensor_t,
}

/// `Qnn_OpConfig_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Qnn_OpConfig_t {
    /// `QNN_OPCONFIG_VERSION_1`.
    pub version: Qnn_OpConfigVersion_t,
    /// The node.
    pub v1: Qnn_OpConfigV1_t,
}
