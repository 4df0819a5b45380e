//! Op package and op type names of `QnnOpDef.h` (the built-in `qti.aisw` package), as C strings
//! ready for [`Qnn_OpConfigV1_t`](crate::Qnn_OpConfigV1_t).

use std::ffi::CStr;

/// `QNN_OP_PACKAGE_NAME_QTI_AISW`: the package of every built-in op.
pub const QNN_OP_PACKAGE_NAME_QTI_AISW: &CStr = c"qti.aisw";
/// `QNN_OP_FULLY_CONNECTED`: in\[0\] activations `[batch, in]` (or any rank, flattened to rows of `in`),
/// in\[1\] weights `[out, in]`, optional in\[2\] bias `[out]`; out\[0\] `[batch, out]`.
pub const QNN_OP_FULLY_CONNECTED: &CStr = c"FullyConnected";
/// `QNN_OP_FULLY_CONNECTED_PARAM_KEEP_DIMS` (bool scalar, default false).
pub const QNN_OP_FULLY_CONNECTED_PARAM_KEEP_DIMS: &CStr = c"keep_dims";
/// `QNN_OP_ELEMENT_WISE_MULTIPLY`.
pub const QNN_OP_ELEMENT_WISE_MULTIPLY: &CStr = c"ElementWiseMultiply";
/// `QNN_OP_ELEMENT_WISE_ADD`.
pub const QNN_OP_ELEMENT_WISE_ADD: &CStr = c"ElementWiseAdd";
/// `QNN_OP_SIGMOID`.
pub const QNN_OP_SIGMOID: &CStr = c"Sigmoid";
/// `QNN_OP_RELU`.
pub const QNN_OP_RELU: &CStr = c"Relu";
