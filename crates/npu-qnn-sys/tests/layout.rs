//! Sizes and field offsets against the QNN headers (core API 2.10 layout, `Qnn_TensorV2_t` included),
//! computed by hand from the C declarations for LP64 targets (x86_64, aarch64 Linux and Android).
#![cfg(target_pointer_width = "64")]

use std::mem::{offset_of, size_of};

use npu_qnn_sys::*;

#[test]
fn versions_and_quantization() {
    assert_eq!(size_of::<Qnn_Version_t>(), 12);
    assert_eq!(size_of::<Qnn_ApiVersion_t>(), 24);
    assert_eq!(offset_of!(Qnn_ApiVersion_t, backendApiVersion), 12);
    assert_eq!(size_of::<Qnn_ScaleOffset_t>(), 8);
    assert_eq!(size_of::<Qnn_AxisScaleOffset_t>(), 16);
    assert_eq!(offset_of!(Qnn_AxisScaleOffset_t, scaleOffset), 8);
    assert_eq!(size_of::<Qnn_BwScaleOffset_t>(), 12);
    assert_eq!(size_of::<Qnn_BwAxisScaleOffset_t>(), 32);
    assert_eq!(offset_of!(Qnn_BwAxisScaleOffset_t, scales), 16);
    assert_eq!(offset_of!(Qnn_BwAxisScaleOffset_t, offsets), 24);
    assert_eq!(size_of::<Qnn_QuantizeParams_t>(), 40);
    assert_eq!(offset_of!(Qnn_QuantizeParams_t, encoding), 8);
}

#[test]
fn tensors() {
    assert_eq!(size_of::<Qnn_ClientBuffer_t>(), 16);
    assert_eq!(offset_of!(Qnn_TensorV1_t, id), 0);
    assert_eq!(offset_of!(Qnn_TensorV1_t, name), 8);
    assert_eq!(offset_of!(Qnn_TensorV1_t, type_), 16);
    assert_eq!(offset_of!(Qnn_TensorV1_t, dataFormat), 20);
    assert_eq!(offset_of!(Qnn_TensorV1_t, dataType), 24);
    assert_eq!(offset_of!(Qnn_TensorV1_t, quantizeParams), 32);
    assert_eq!(offset_of!(Qnn_TensorV1_t, rank), 72);
    assert_eq!(offset_of!(Qnn_TensorV1_t, dimensions), 80);
    assert_eq!(offset_of!(Qnn_TensorV1_t, memType), 88);
    assert_eq!(offset_of!(Qnn_TensorV1_t, memory), 96);
    assert_eq!(size_of::<Qnn_TensorV1_t>(), 112);
    assert_eq!(offset_of!(Qnn_TensorV2_t, isDynamicDimensions), 112);
    assert_eq!(offset_of!(Qnn_TensorV2_t, sparseParams), 120);
    assert_eq!(offset_of!(Qnn_TensorV2_t, isProduced), 132);
    assert_eq!(size_of::<Qnn_TensorV2_t>(), 136);
    assert_eq!(offset_of!(Qnn_Tensor_t, v), 8);
    assert_eq!(size_of::<Qnn_Tensor_t>(), 144);
}

#[test]
fn params_and_op_config() {
    assert_eq!(size_of::<Qnn_Scalar_t>(), 16);
    assert_eq!(offset_of!(Qnn_Scalar_t, value), 8);
    assert_eq!(offset_of!(Qnn_Param_t, name), 8);
    assert_eq!(offset_of!(Qnn_Param_t, value), 16);
    assert_eq!(size_of::<Qnn_Param_t>(), 160);
    assert_eq!(offset_of!(Qnn_OpConfigV1_t, numOfParams), 24);
    assert_eq!(offset_of!(Qnn_OpConfigV1_t, params), 32);
    assert_eq!(offset_of!(Qnn_OpConfigV1_t, numOfInputs), 40);
    assert_eq!(offset_of!(Qnn_OpConfigV1_t, inputTensors), 48);
    assert_eq!(offset_of!(Qnn_OpConfigV1_t, numOfOutputs), 56);
    assert_eq!(offset_of!(Qnn_OpConfigV1_t, outputTensors), 64);
    assert_eq!(size_of::<Qnn_OpConfigV1_t>(), 72);
    assert_eq!(offset_of!(Qnn_OpConfig_t, v1), 8);
    assert_eq!(size_of::<Qnn_OpConfig_t>(), 80);
}

#[test]
fn interface_table_in_header_order() {
    // 48 function pointers, propertyHasCapability .. signalFree.
    assert_eq!(size_of::<QnnInterfaceImpl>(), 48 * 8);
    let slot = |off: usize| off / 8;
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, propertyHasCapability)), 0);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, backendCreate)), 1);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, backendSetConfig)), 2);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, backendFree)), 8);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, contextCreate)), 9);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, contextFree)), 14);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, graphCreate)), 15);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, graphCreateSubgraph)), 16);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, graphAddNode)), 18);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, graphFinalize)), 19);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, graphExecute)), 21);
    assert_eq!(
        slot(offset_of!(QnnInterfaceImpl, tensorCreateGraphTensor)),
        24
    );
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, logCreate)), 25);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, logFree)), 27);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, profileCreate)), 28);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, memRegister)), 35);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, deviceCreate)), 40);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, deviceFree)), 43);
    assert_eq!(slot(offset_of!(QnnInterfaceImpl, signalFree)), 47);
    // The provider struct: id, name, versions, then the table at 0x28.
    assert_eq!(offset_of!(QnnInterface_t, providerName), 8);
    assert_eq!(offset_of!(QnnInterface_t, apiVersion), 16);
    assert_eq!(offset_of!(QnnInterface_t, table), 40);
}

#[test]
fn codes() {
    assert_eq!(QNN_DATATYPE_FLOAT_32, 0x0232);
    assert_eq!(QNN_DATATYPE_SFIXED_POINT_8, 0x0308);
    assert_eq!(QNN_DATATYPE_UFIXED_POINT_8, 0x0408);
    assert_eq!(QNN_DATATYPE_SFIXED_POINT_4, 0x0304);
    assert_eq!(qnn_error_code(0xABCD_0000_0000_1772), 0x1772);
    assert_eq!(QNN_TENSOR_TYPE_STATIC, 4);
}
