//! Scalars, handles, versions and the enum codes of `QnnCommon.h` and `QnnTypes.h`.
//!
//! C enums are 32-bit integers here (`u32` aliases with one constant per enumerator), never Rust
//! enums: a library may hand back a value this crate does not know, which must not be undefined
//! behaviour.

use std::ffi::c_void;

/// `Qnn_ErrorHandle_t`: the result of every QNN call. 0 is success; the error code is in the low 16
/// bits ([`qnn_error_code`]), the higher bits are reserved for the backend's own tracking.
pub type Qnn_ErrorHandle_t = u64;
/// `Qnn_Handle_t`: the base of every opaque handle.
pub type Qnn_Handle_t = *mut c_void;
/// `Qnn_BackendHandle_t`.
pub type Qnn_BackendHandle_t = Qnn_Handle_t;
/// `Qnn_ContextHandle_t`.
pub type Qnn_ContextHandle_t = Qnn_Handle_t;
/// `Qnn_DeviceHandle_t`.
pub type Qnn_DeviceHandle_t = Qnn_Handle_t;
/// `Qnn_GraphHandle_t` (graphs are freed with their context, never alone).
pub type Qnn_GraphHandle_t = Qnn_Handle_t;
/// `Qnn_LogHandle_t`.
pub type Qnn_LogHandle_t = Qnn_Handle_t;
/// `Qnn_MemHandle_t`.
pub type Qnn_MemHandle_t = Qnn_Handle_t;
/// `Qnn_ProfileHandle_t`.
pub type Qnn_ProfileHandle_t = Qnn_Handle_t;
/// `Qnn_SignalHandle_t`.
pub type Qnn_SignalHandle_t = Qnn_Handle_t;

/// `QNN_SUCCESS`.
pub const QNN_SUCCESS: Qnn_ErrorHandle_t = 0;

/// `QNN_GET_ERROR_CODE`: the 16-bit error code of a result.
pub const fn qnn_error_code(result: Qnn_ErrorHandle_t) -> u64 {
    result & 0xFFFF
}

/// The core API major version this crate binds (`QNN_API_VERSION_MAJOR` of the headers it follows).
pub const QNN_API_VERSION_MAJOR: u32 = 2;
/// The oldest core API minor version whose `QNN_INTERFACE_VER_TYPE` has the field order bound here
/// (2.10: `backendSetConfig` and `graphCreateSubgraph` are in the table; 2.7 lacks both).
pub const QNN_API_VERSION_MINOR_MIN: u32 = 10;

/// `Qnn_Version_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Qnn_Version_t {
    /// Major version: incompatible changes.
    pub major: u32,
    /// Minor version: additions.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

/// `Qnn_ApiVersion_t`: the core API version and the backend-specific API version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Qnn_ApiVersion_t {
    /// Version of the QNN core API common to all backends.
    pub coreApiVersion: Qnn_Version_t,
    /// Version of the backend-specific API.
    pub backendApiVersion: Qnn_Version_t,
}

// Backend identifiers (`QnnCommon.h`, values defined by each `Qnn<backend>Common.h`).
/// `QNN_BACKEND_ID_NULL`.
pub const QNN_BACKEND_ID_NULL: u32 = 0;
/// `QNN_BACKEND_ID_REFERENCE`.
pub const QNN_BACKEND_ID_REFERENCE: u32 = 1;
/// `QNN_BACKEND_ID_SAVER`.
pub const QNN_BACKEND_ID_SAVER: u32 = 2;
/// `QNN_BACKEND_ID_CPU`.
pub const QNN_BACKEND_ID_CPU: u32 = 3;
/// `QNN_BACKEND_ID_GPU`.
pub const QNN_BACKEND_ID_GPU: u32 = 4;
/// `QNN_BACKEND_ID_DSP`.
pub const QNN_BACKEND_ID_DSP: u32 = 5;
/// `QNN_BACKEND_ID_HTP`.
pub const QNN_BACKEND_ID_HTP: u32 = 6;

/// `Qnn_DataType_t`.
pub type Qnn_DataType_t = u32;
/// `QNN_DATATYPE_INT_8`.
pub const QNN_DATATYPE_INT_8: Qnn_DataType_t = 0x0008;
/// `QNN_DATATYPE_INT_16`.
pub const QNN_DATATYPE_INT_16: Qnn_DataType_t = 0x0016;
/// `QNN_DATATYPE_INT_32`.
pub const QNN_DATATYPE_INT_32: Qnn_DataType_t = 0x0032;
/// `QNN_DATATYPE_INT_64`.
pub const QNN_DATATYPE_INT_64: Qnn_DataType_t = 0x0064;
/// `QNN_DATATYPE_UINT_8`.
pub const QNN_DATATYPE_UINT_8: Qnn_DataType_t = 0x0108;
/// `QNN_DATATYPE_UINT_16`.
pub const QNN_DATATYPE_UINT_16: Qnn_DataType_t = 0x0116;
/// `QNN_DATATYPE_UINT_32`.
pub const QNN_DATATYPE_UINT_32: Qnn_DataType_t = 0x0132;
/// `QNN_DATATYPE_UINT_64`.
pub const QNN_DATATYPE_UINT_64: Qnn_DataType_t = 0x0164;
/// `QNN_DATATYPE_FLOAT_16`.
pub const QNN_DATATYPE_FLOAT_16: Qnn_DataType_t = 0x0216;
/// `QNN_DATATYPE_FLOAT_32`.
pub const QNN_DATATYPE_FLOAT_32: Qnn_DataType_t = 0x0232;
/// `QNN_DATATYPE_FLOAT_64`.
pub const QNN_DATATYPE_FLOAT_64: Qnn_DataType_t = 0x0264;
/// `QNN_DATATYPE_SFIXED_POINT_4`: two values a byte, the first in the low nibble.
pub const QNN_DATATYPE_SFIXED_POINT_4: Qnn_DataType_t = 0x0304;
/// `QNN_DATATYPE_SFIXED_POINT_8`.
pub const QNN_DATATYPE_SFIXED_POINT_8: Qnn_DataType_t = 0x0308;
/// `QNN_DATATYPE_SFIXED_POINT_16`.
pub const QNN_DATATYPE_SFIXED_POINT_16: Qnn_DataType_t = 0x0316;
/// `QNN_DATATYPE_SFIXED_POINT_32`.
pub const QNN_DATATYPE_SFIXED_POINT_32: Qnn_DataType_t = 0x0332;
/// `QNN_DATATYPE_UFIXED_POINT_4`: two values a byte, the first in the low nibble.
pub const QNN_DATATYPE_UFIXED_POINT_4: Qnn_DataType_t = 0x0404;
/// `QNN_DATATYPE_UFIXED_POINT_8`.
pub const QNN_DATATYPE_UFIXED_POINT_8: Qnn_DataType_t = 0x0408;
/// `QNN_DATATYPE_UFIXED_POINT_16`.
pub const QNN_DATATYPE_UFIXED_POINT_16: Qnn_DataType_t = 0x0416;
/// `QNN_DATATYPE_UFIXED_POINT_32`.
pub const QNN_DATATYPE_UFIXED_POINT_32: Qnn_DataType_t = 0x0432;
/// `QNN_DATATYPE_BOOL_8`.
pub const QNN_DATATYPE_BOOL_8: Qnn_DataType_t = 0x0508;
/// `QNN_DATATYPE_STRING`.
pub const QNN_DATATYPE_STRING: Qnn_DataType_t = 0x0608;
/// `QNN_DATATYPE_UNDEFINED`.
pub const QNN_DATATYPE_UNDEFINED: Qnn_DataType_t = 0x7FFF_FFFF;

/// `Qnn_TensorType_t`.
pub type Qnn_TensorType_t = u32;
/// `QNN_TENSOR_TYPE_APP_WRITE`: a graph input the client writes.
pub const QNN_TENSOR_TYPE_APP_WRITE: Qnn_TensorType_t = 0;
/// `QNN_TENSOR_TYPE_APP_READ`: a graph output the client reads.
pub const QNN_TENSOR_TYPE_APP_READ: Qnn_TensorType_t = 1;
/// `QNN_TENSOR_TYPE_APP_READWRITE`.
pub const QNN_TENSOR_TYPE_APP_READWRITE: Qnn_TensorType_t = 2;
/// `QNN_TENSOR_TYPE_NATIVE`: an intermediate the backend owns.
pub const QNN_TENSOR_TYPE_NATIVE: Qnn_TensorType_t = 3;
/// `QNN_TENSOR_TYPE_STATIC`: constant data (weights).
pub const QNN_TENSOR_TYPE_STATIC: Qnn_TensorType_t = 4;
/// `QNN_TENSOR_TYPE_NULL`: an omitted optional tensor.
pub const QNN_TENSOR_TYPE_NULL: Qnn_TensorType_t = 5;
/// `QNN_TENSOR_TYPE_UNDEFINED`.
pub const QNN_TENSOR_TYPE_UNDEFINED: Qnn_TensorType_t = 0x7FFF_FFFF;

/// `Qnn_TensorDataFormat_t` (a `uint32_t` with `#define`d values).
pub type Qnn_TensorDataFormat_t = u32;
/// `QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER` (= `QNN_TENSOR_DATA_FORMAT_DENSE`): row-major, last dimension
/// fastest.
pub const QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER: Qnn_TensorDataFormat_t = 0;

/// `Qnn_TensorMemType_t`.
pub type Qnn_TensorMemType_t = u32;
/// `QNN_TENSORMEMTYPE_RAW`: data in `clientBuf`.
pub const QNN_TENSORMEMTYPE_RAW: Qnn_TensorMemType_t = 0;
/// `QNN_TENSORMEMTYPE_MEMHANDLE`: data behind a registered `memHandle`.
pub const QNN_TENSORMEMTYPE_MEMHANDLE: Qnn_TensorMemType_t = 1;
/// `QNN_TENSORMEMTYPE_UNDEFINED`.
pub const QNN_TENSORMEMTYPE_UNDEFINED: Qnn_TensorMemType_t = 0x7FFF_FFFF;

/// `Qnn_Definition_t`.
pub type Qnn_Definition_t = u32;
/// `QNN_DEFINITION_IMPL_GENERATED`: the backend decides.
pub const QNN_DEFINITION_IMPL_GENERATED: Qnn_Definition_t = 0;
/// `QNN_DEFINITION_DEFINED`: the given definition is used.
pub const QNN_DEFINITION_DEFINED: Qnn_Definition_t = 1;
/// `QNN_DEFINITION_UNDEFINED`.
pub const QNN_DEFINITION_UNDEFINED: Qnn_Definition_t = 0x7FFF_FFFF;

/// `Qnn_QuantizationEncoding_t`.
pub type Qnn_QuantizationEncoding_t = u32;
/// `QNN_QUANTIZATION_ENCODING_SCALE_OFFSET`: one scale and offset for the tensor.
pub const QNN_QUANTIZATION_ENCODING_SCALE_OFFSET: Qnn_QuantizationEncoding_t = 0;
/// `QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET`: one scale and offset per index of `axis`.
pub const QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET: Qnn_QuantizationEncoding_t = 1;
/// `QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET`: per tensor, with an explicit bit width.
pub const QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET: Qnn_QuantizationEncoding_t = 2;
/// `QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET`: per axis, with an explicit bit width (4-bit).
pub const QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET: Qnn_QuantizationEncoding_t = 3;
/// `QNN_QUANTIZATION_ENCODING_UNDEFINED`: not quantized.
pub const QNN_QUANTIZATION_ENCODING_UNDEFINED: Qnn_QuantizationEncoding_t = 0x7FFF_FFFF;

/// `Qnn_ParamType_t`.
pub type Qnn_ParamType_t = u32;
/// `QNN_PARAMTYPE_SCALAR`.
pub const QNN_PARAMTYPE_SCALAR: Qnn_ParamType_t = 0;
/// `QNN_PARAMTYPE_TENSOR`.
pub const QNN_PARAMTYPE_TENSOR: Qnn_ParamType_t = 1;

/// `Qnn_TensorVersion_t`.
pub type Qnn_TensorVersion_t = u32;
/// `QNN_TENSOR_VERSION_1`.
pub const QNN_TENSOR_VERSION_1: Qnn_TensorVersion_t = 1;
/// `QNN_TENSOR_VERSION_2`.
pub const QNN_TENSOR_VERSION_2: Qnn_TensorVersion_t = 2;

/// `Qnn_OpConfigVersion_t`.
pub type Qnn_OpConfigVersion_t = u32;
/// `QNN_OPCONFIG_VERSION_1`.
pub const QNN_OPCONFIG_VERSION_1: Qnn_OpConfigVersion_t = 1;

/// `QnnLog_Level_t`.
pub type QnnLog_Level_t = u32;
/// `QNN_LOG_LEVEL_ERROR`.
pub const QNN_LOG_LEVEL_ERROR: QnnLog_Level_t = 1;
/// `QNN_LOG_LEVEL_WARN`.
pub const QNN_LOG_LEVEL_WARN: QnnLog_Level_t = 2;
/// `QNN_LOG_LEVEL_INFO`.
pub const QNN_LOG_LEVEL_INFO: QnnLog_Level_t = 3;
/// `QNN_LOG_LEVEL_VERBOSE`.
pub const QNN_LOG_LEVEL_VERBOSE: QnnLog_Level_t = 4;
/// `QNN_LOG_LEVEL_DEBUG`.
pub const QNN_LOG_LEVEL_DEBUG: QnnLog_Level_t = 5;

/// `QnnProperty_Key_t`.
pub type QnnProperty_Key_t = u32;

/// `Qnn_ContextBinarySize_t`.
pub type Qnn_ContextBinarySize_t = u64;
