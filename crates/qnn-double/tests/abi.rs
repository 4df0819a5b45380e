//! The double through the raw C ABI, as any QNN client sees it: an op type the double does not
//! know is refused at `graphAddNode` with `QNN_GRAPH_ERROR_INVALID_OP_CONFIG`, as is a foreign package.

use std::ptr;

use npu_qnn_sys::*;

#[test]
fn unknown_ops_are_refused_at_add_node() {
    let path = qnn_double::library_path().expect("the double is built");
    // SAFETY: the double is this crate's own library.
    let lib = unsafe { QnnLibrary::open(&path) }.unwrap();
    let p = lib.providers().unwrap()[0];
    assert_eq!(p.apiVersion.coreApiVersion.major, QNN_API_VERSION_MAJOR);
    let t = p.table;
    let (mut backend, mut ctx, mut graph) = (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
    // SAFETY: out-pointers are live locals; null logger/config/device are allowed by the headers.
    unsafe {
        assert_eq!(
            t.backendCreate.unwrap()(ptr::null_mut(), ptr::null(), &mut backend),
            0
        );
        assert_eq!(
            t.contextCreate.unwrap()(backend, ptr::null_mut(), ptr::null(), &mut ctx),
            0
        );
        assert_eq!(
            t.graphCreate.unwrap()(ctx, c"g".as_ptr(), ptr::null(), &mut graph),
            0
        );
    }
    let mut dims = [1u32, 4];
    let mut make = |name: &std::ffi::CStr, kind| {
        let mut raw = Qnn_Tensor_t::from_v1(Qnn_TensorV1_t {
            id: 0,
            name: name.as_ptr(),
            type_: kind,
            dataFormat: QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER,
            dataType: QNN_DATATYPE_FLOAT_32,
            quantizeParams: Qnn_QuantizeParams_t::INIT,
            rank: 2,
            dimensions: dims.as_mut_ptr(),
            memType: QNN_TENSORMEMTYPE_RAW,
            memory: Qnn_TensorMemory {
                clientBuf: Qnn_ClientBuffer_t {
                    data: ptr::null_mut(),
                    dataSize: 0,
                },
            },
        });
        // SAFETY: `raw` points at live name and dims for the call.
        let rc = unsafe { t.tensorCreateGraphTensor.unwrap()(graph, &mut raw) };
        assert_eq!(rc, 0);
        raw
    };
    let mut x = make(c"x", QNN_TENSOR_TYPE_APP_WRITE);
    let mut y = make(c"y", QNN_TENSOR_TYPE_APP_READ);
    assert_ne!(x.v1().unwrap().id, y.v1().unwrap().id);
    let mut add = |package: &std::ffi::CStr, op: &std::ffi::CStr| {
        let config = Qnn_OpConfig_t {
            version: QNN_OPCONFIG_VERSION_1,
            v1: Qnn_OpConfigV1_t {
                name: c"n".as_ptr(),
                packageName: package.as_ptr(),
                typeName: op.as_ptr(),
                numOfParams: 0,
                params: ptr::null_mut(),
                numOfInputs: 1,
                inputTensors: &mut x,
                numOfOutputs: 1,
                outputTensors: &mut y,
            },
        };
        // SAFETY: every pointer in `config` is live for the call.
        qnn_error_code(unsafe { t.graphAddNode.unwrap()(graph, config) })
    };
    assert_eq!(
        add(QNN_OP_PACKAGE_NAME_QTI_AISW, c"Conv2d"),
        QNN_GRAPH_ERROR_INVALID_OP_CONFIG
    );
    assert_eq!(
        add(c"other.pkg", QNN_OP_RELU),
        QNN_GRAPH_ERROR_INVALID_OP_CONFIG
    );
    assert_eq!(add(QNN_OP_PACKAGE_NAME_QTI_AISW, QNN_OP_RELU), QNN_SUCCESS);
    // SAFETY: handles from the calls above, freed once, children first.
    unsafe {
        assert_eq!(t.contextFree.unwrap()(ctx, ptr::null_mut()), 0);
        assert_eq!(t.backendFree.unwrap()(backend), 0);
    }
}
