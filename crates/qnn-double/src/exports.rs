//! The C ABI of the double: `QnnInterface_getProviders`, the provider table's functions, and the
//! `qnn_double_*` control functions of fault injection and leak checks.
//!
//! Every function checks its fault ([`crate::faults`]) first, then its handles against the registry.
//! Freeing a parent while a child lives (a backend with a context, a device or log in use) is
//! refused with `QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED` and counted (`qnn_double_order_errors`):
//! the double is stricter than the headers require, so that a wrong drop order shows in tests.

use std::collections::HashMap;
use std::ffi::{c_char, CStr};

use npu_qnn_sys::*;

use crate::faults;
use crate::graph::{GraphObj, Op};
use crate::registry::{handle, key, lock, Object};
use crate::tensors;

/// The core API version the double reports (and implements: the 2.10 table).
pub(crate) const API_VERSION: Qnn_Version_t = Qnn_Version_t {
    major: QNN_API_VERSION_MAJOR,
    minor: QNN_API_VERSION_MINOR_MIN,
    patch: 0,
};

macro_rules! fault {
    ($step:literal) => {
        if faults::fails($step) {
            return QNN_COMMON_ERROR_GENERAL;
        }
    };
}

/// # Safety
/// `logger` must be writable (QnnLog.h contract).
unsafe extern "C" fn log_create(
    _callback: QnnLog_Callback_t,
    _level: QnnLog_Level_t,
    logger: *mut Qnn_LogHandle_t,
) -> Qnn_ErrorHandle_t {
    fault!("logCreate");
    if logger.is_null() {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    let k = lock().insert(Object::Log);
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { *logger = handle(k) };
    QNN_SUCCESS
}

unsafe extern "C" fn log_set_level(logger: Qnn_LogHandle_t, _level: QnnLog_Level_t) -> u64 {
    fault!("logSetLogLevel");
    match lock().entries.get(&key(logger)) {
        Some(e) if matches!(e.object, Object::Log) => QNN_SUCCESS,
        _ => QNN_COMMON_ERROR_INVALID_ARGUMENT,
    }
}

unsafe extern "C" fn log_free(logger: Qnn_LogHandle_t) -> Qnn_ErrorHandle_t {
    fault!("logFree");
    let k = key(logger);
    let mut reg = lock();
    if !matches!(reg.entries.get(&k).map(|e| &e.object), Some(Object::Log)) {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    if reg.any(|o| matches!(o, Object::Backend { log } if *log == k)) {
        reg.order_error();
        return QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED;
    }
    reg.entries.remove(&k);
    QNN_SUCCESS
}

/// # Safety
/// `backend` must be writable (QnnBackend.h contract).
unsafe extern "C" fn backend_create(
    logger: Qnn_LogHandle_t,
    _config: *const *const QnnBackend_Config_t,
    backend: *mut Qnn_BackendHandle_t,
) -> Qnn_ErrorHandle_t {
    fault!("backendCreate");
    if backend.is_null() {
        return QNN_BACKEND_ERROR_INVALID_ARGUMENT;
    }
    let mut reg = lock();
    let log = key(logger);
    if log != 0 && !matches!(reg.entries.get(&log).map(|e| &e.object), Some(Object::Log)) {
        return QNN_BACKEND_ERROR_INVALID_HANDLE;
    }
    let k = reg.insert(Object::Backend { log });
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { *backend = handle(k) };
    QNN_SUCCESS
}

/// # Safety
/// `version` must be writable.
unsafe extern "C" fn backend_get_api_version(version: *mut Qnn_ApiVersion_t) -> u64 {
    fault!("backendGetApiVersion");
    if version.is_null() {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { *version = provider_version() };
    QNN_SUCCESS
}

/// # Safety
/// `id` must be writable.
unsafe extern "C" fn backend_get_build_id(id: *mut *const c_char) -> Qnn_ErrorHandle_t {
    fault!("backendGetBuildId");
    if id.is_null() {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, writable; the string is static.
    unsafe { *id = c"sparrow-qnn-double".as_ptr() };
    QNN_SUCCESS
}

unsafe extern "C" fn backend_free(backend: Qnn_BackendHandle_t) -> Qnn_ErrorHandle_t {
    fault!("backendFree");
    let k = key(backend);
    let mut reg = lock();
    if !matches!(
        reg.entries.get(&k).map(|e| &e.object),
        Some(Object::Backend { .. })
    ) {
        return QNN_BACKEND_ERROR_INVALID_HANDLE;
    }
    if reg.any(|o| matches!(o, Object::Context { backend, .. } if *backend == k)) {
        reg.order_error();
        return QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED;
    }
    reg.entries.remove(&k);
    QNN_SUCCESS
}

/// # Safety
/// `device` must be writable (QnnDevice.h contract).
unsafe extern "C" fn device_create(
    _logger: Qnn_LogHandle_t,
    _config: *const *const QnnDevice_Config_t,
    device: *mut Qnn_DeviceHandle_t,
) -> Qnn_ErrorHandle_t {
    fault!("deviceCreate");
    if device.is_null() {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    let k = lock().insert(Object::Device);
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { *device = handle(k) };
    QNN_SUCCESS
}

unsafe extern "C" fn device_free(device: Qnn_DeviceHandle_t) -> Qnn_ErrorHandle_t {
    fault!("deviceFree");
    let k = key(device);
    let mut reg = lock();
    if !matches!(reg.entries.get(&k).map(|e| &e.object), Some(Object::Device)) {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    if reg.any(|o| matches!(o, Object::Context { device, .. } if *device == k)) {
        reg.order_error();
        return QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED;
    }
    reg.entries.remove(&k);
    QNN_SUCCESS
}

/// # Safety
/// `context` must be writable (QnnContext.h contract).
unsafe extern "C" fn context_create(
    backend: Qnn_BackendHandle_t,
    device: Qnn_DeviceHandle_t,
    _config: *const *const QnnContext_Config_t,
    context: *mut Qnn_ContextHandle_t,
) -> Qnn_ErrorHandle_t {
    fault!("contextCreate");
    if context.is_null() {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    let mut reg = lock();
    let (b, d) = (key(backend), key(device));
    let kind = |k: usize| reg.entries.get(&k).map(|e| &e.object);
    if !matches!(kind(b), Some(Object::Backend { .. })) {
        return QNN_BACKEND_ERROR_INVALID_HANDLE;
    }
    if d != 0 && !matches!(kind(d), Some(Object::Device)) {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    let k = reg.insert(Object::Context {
        backend: b,
        device: d,
    });
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { *context = handle(k) };
    QNN_SUCCESS
}

unsafe extern "C" fn context_free(
    context: Qnn_ContextHandle_t,
    _profile: Qnn_ProfileHandle_t,
) -> Qnn_ErrorHandle_t {
    fault!("contextFree");
    let k = key(context);
    let mut reg = lock();
    if !matches!(
        reg.entries.get(&k).map(|e| &e.object),
        Some(Object::Context { .. })
    ) {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    // Graphs go with their context.
    reg.entries
        .retain(|_, e| !matches!(&e.object, Object::Graph(g) if g.context == k));
    reg.entries.remove(&k);
    QNN_SUCCESS
}

/// # Safety
/// `name` must be a C string or null, `graph` writable (QnnGraph.h contract).
unsafe extern "C" fn graph_create(
    context: Qnn_ContextHandle_t,
    name: *const c_char,
    _config: *const *const QnnGraph_Config_t,
    graph: *mut Qnn_GraphHandle_t,
) -> Qnn_ErrorHandle_t {
    fault!("graphCreate");
    if graph.is_null() {
        return QNN_GRAPH_ERROR_INVALID_ARGUMENT;
    }
    if name.is_null() {
        return QNN_GRAPH_ERROR_INVALID_NAME;
    }
    // SAFETY: non-null C string by the caller's contract.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    let c = key(context);
    let mut reg = lock();
    if !matches!(
        reg.entries.get(&c).map(|e| &e.object),
        Some(Object::Context { .. })
    ) {
        return QNN_GRAPH_ERROR_INVALID_HANDLE;
    }
    if reg.any(|o| matches!(o, Object::Graph(g) if g.context == c && g.name == name)) {
        return QNN_GRAPH_ERROR_INVALID_NAME;
    }
    let k = reg.insert(Object::Graph(Box::new(GraphObj::new(c, name))));
    // SAFETY: non-null, writable by the caller's contract.
    unsafe { *graph = handle(k) };
    QNN_SUCCESS
}

/// Runs `f` on the graph behind `graph`, or returns `QNN_GRAPH_ERROR_INVALID_HANDLE`.
fn with_graph(graph: Qnn_GraphHandle_t, f: impl FnOnce(&mut GraphObj) -> u64) -> u64 {
    match lock().entries.get_mut(&key(graph)).map(|e| &mut e.object) {
        Some(Object::Graph(g)) => f(g),
        _ => QNN_GRAPH_ERROR_INVALID_HANDLE,
    }
}

/// # Safety
/// `tensor` must point at a tensor whose pointers are valid (QnnTensor.h contract).
unsafe extern "C" fn tensor_create_graph_tensor(
    graph: Qnn_GraphHandle_t,
    tensor: *mut Qnn_Tensor_t,
) -> Qnn_ErrorHandle_t {
    fault!("tensorCreateGraphTensor");
    if tensor.is_null() {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and exclusively ours for the call (caller's contract).
    let Some(t) = (unsafe { &mut *tensor }).v1_mut() else {
        return QNN_COMMON_ERROR_INVALID_ARGUMENT;
    };
    // SAFETY: the tensor's pointers are valid (caller's contract).
    let obj = match unsafe { tensors::read_new(t) } {
        Ok(o) => o,
        Err(code) => return code,
    };
    with_graph(graph, |g| match g.add_tensor(obj) {
        Ok(id) => {
            t.id = id;
            QNN_SUCCESS
        }
        Err(code) => code,
    })
}

/// Ids of `n` tensors at `p`.
///
/// # Safety
/// `p` must hold `n` tensors when `n > 0`.
unsafe fn ids(p: *const Qnn_Tensor_t, n: u32) -> Option<Vec<u32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: `n` tensors (caller's contract), non-null.
    let ts = unsafe { std::slice::from_raw_parts(p, n as usize) };
    ts.iter().map(|t| t.v1().map(|v| v.id)).collect()
}

/// # Safety
/// The op config's pointers must be valid (QnnGraph.h contract).
unsafe extern "C" fn graph_add_node(
    graph: Qnn_GraphHandle_t,
    config: Qnn_OpConfig_t,
) -> Qnn_ErrorHandle_t {
    fault!("graphAddNode");
    let c = config.v1;
    if config.version != QNN_OPCONFIG_VERSION_1 || c.packageName.is_null() || c.typeName.is_null() {
        return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
    }
    // SAFETY: non-null C strings (caller's contract).
    let (package, type_name) =
        unsafe { (CStr::from_ptr(c.packageName), CStr::from_ptr(c.typeName)) };
    if package != QNN_OP_PACKAGE_NAME_QTI_AISW {
        return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
    }
    let Some(op) = Op::from_name(type_name.to_bytes()) else {
        return QNN_GRAPH_ERROR_INVALID_OP_CONFIG;
    };
    // SAFETY: the arrays hold the stated counts (caller's contract).
    let (Some(inputs), Some(outputs)) = (unsafe { ids(c.inputTensors, c.numOfInputs) }, unsafe {
        ids(c.outputTensors, c.numOfOutputs)
    }) else {
        return QNN_GRAPH_ERROR_INVALID_TENSOR;
    };
    with_graph(graph, |g| {
        match g.add_node(op, &inputs, &outputs, c.numOfParams) {
            Ok(()) => QNN_SUCCESS,
            Err(code) => code,
        }
    })
}

unsafe extern "C" fn graph_finalize(
    graph: Qnn_GraphHandle_t,
    _profile: Qnn_ProfileHandle_t,
    _signal: Qnn_SignalHandle_t,
) -> Qnn_ErrorHandle_t {
    fault!("graphFinalize");
    with_graph(graph, |g| match g.finalize() {
        Ok(()) => QNN_SUCCESS,
        Err(code) => code,
    })
}

/// # Safety
/// `inputs`/`outputs` must hold the stated counts of tensors whose client buffers are valid
/// (QnnGraph.h contract); output buffers writable.
unsafe extern "C" fn graph_execute(
    graph: Qnn_GraphHandle_t,
    inputs: *const Qnn_Tensor_t,
    num_inputs: u32,
    outputs: *mut Qnn_Tensor_t,
    num_outputs: u32,
    _profile: Qnn_ProfileHandle_t,
    _signal: Qnn_SignalHandle_t,
) -> Qnn_ErrorHandle_t {
    // The thread that created the graph's context sets the faults of threads that have none.
    let owner = {
        let reg = lock();
        match reg.entries.get(&key(graph)).map(|e| &e.object) {
            Some(Object::Graph(g)) => reg.entries.get(&g.context).map(|e| e.owner),
            _ => None,
        }
    };
    if faults::fails_for("graphExecute", owner) {
        return QNN_COMMON_ERROR_GENERAL;
    }
    if (num_inputs > 0 && inputs.is_null()) || (num_outputs > 0 && outputs.is_null()) {
        return QNN_GRAPH_ERROR_INVALID_ARGUMENT;
    }
    let ins: &[Qnn_Tensor_t] = if num_inputs == 0 {
        &[]
    } else {
        // SAFETY: `num_inputs` tensors (caller's contract), non-null.
        unsafe { std::slice::from_raw_parts(inputs, num_inputs as usize) }
    };
    let outs: &mut [Qnn_Tensor_t] = if num_outputs == 0 {
        &mut []
    } else {
        // SAFETY: `num_outputs` tensors, exclusively ours for the call, non-null.
        unsafe { std::slice::from_raw_parts_mut(outputs, num_outputs as usize) }
    };
    with_graph(graph, |g| {
        if !g.finalized {
            return QNN_GRAPH_ERROR_GRAPH_NOT_FINALIZED;
        }
        // Every APP_WRITE tensor given once, every APP_READ tensor asked for once.
        let mut given = HashMap::new();
        for t in ins {
            let Some(v1) = t.v1() else {
                return QNN_GRAPH_ERROR_INVALID_TENSOR;
            };
            let Some(obj) = g.tensor_of_kind(v1.id, QNN_TENSOR_TYPE_APP_WRITE) else {
                return QNN_GRAPH_ERROR_INVALID_TENSOR;
            };
            // SAFETY: valid client buffer of the stated size (caller's contract).
            let Some(vals) = (unsafe { read_f32(v1, obj.len()) }) else {
                return QNN_GRAPH_ERROR_INVALID_ARGUMENT;
            };
            if given.insert(v1.id, vals).is_some() {
                return QNN_GRAPH_ERROR_INVALID_ARGUMENT;
            }
        }
        let mut wanted: Vec<u32> = outs.iter().filter_map(|t| t.v1().map(|v| v.id)).collect();
        wanted.sort_unstable();
        wanted.dedup();
        if given.len() != g.ids_of_kind(QNN_TENSOR_TYPE_APP_WRITE).len()
            || wanted != g.ids_of_kind(QNN_TENSOR_TYPE_APP_READ)
            || wanted.len() != outs.len()
        {
            return QNN_GRAPH_ERROR_INVALID_ARGUMENT;
        }
        let vals = g.run(given);
        for t in outs.iter_mut() {
            let Some(v1) = t.v1_mut() else {
                return QNN_GRAPH_ERROR_INVALID_TENSOR;
            };
            let y = &vals[&v1.id];
            // SAFETY: valid, writable client buffer of the stated size (caller's contract).
            if !unsafe { write_f32(v1, y) } {
                return QNN_GRAPH_ERROR_INVALID_ARGUMENT;
            }
        }
        QNN_SUCCESS
    })
}

/// The f32 values of a RAW tensor of `n` elements, or `None` if its buffer has another size.
///
/// # Safety
/// The client buffer must be valid for `dataSize` bytes.
unsafe fn read_f32(t: &Qnn_TensorV1_t, n: usize) -> Option<Vec<f32>> {
    if t.memType != QNN_TENSORMEMTYPE_RAW {
        return None;
    }
    // SAFETY: RAW tensors use `clientBuf` (checked).
    let buf = unsafe { t.memory.clientBuf };
    if buf.data.is_null() || buf.dataSize as usize != n * 4 {
        return None;
    }
    // SAFETY: `dataSize` readable bytes (caller's contract); f32 read unaligned-safe bytewise.
    let bytes = unsafe { std::slice::from_raw_parts(buf.data.cast::<u8>(), n * 4) };
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

/// Writes `y` into a RAW tensor's buffer; false if the sizes differ.
///
/// # Safety
/// The client buffer must be writable for `dataSize` bytes.
unsafe fn write_f32(t: &mut Qnn_TensorV1_t, y: &[f32]) -> bool {
    if t.memType != QNN_TENSORMEMTYPE_RAW {
        return false;
    }
    // SAFETY: RAW tensors use `clientBuf` (checked).
    let buf = unsafe { t.memory.clientBuf };
    if buf.data.is_null() || buf.dataSize as usize != y.len() * 4 {
        return false;
    }
    // SAFETY: `dataSize` writable bytes (caller's contract); bytes copied, no alignment needed.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.data.cast::<u8>(), y.len() * 4) };
    for (c, v) in out.chunks_exact_mut(4).zip(y) {
        c.copy_from_slice(&v.to_ne_bytes());
    }
    true
}

/// The version the provider reports (after any override).
fn provider_version() -> Qnn_ApiVersion_t {
    let mut core = API_VERSION;
    if let Some(m) = faults::api_major() {
        core.major = m;
    }
    Qnn_ApiVersion_t {
        coreApiVersion: core,
        backendApiVersion: Qnn_Version_t {
            major: 1,
            minor: 0,
            patch: 0,
        },
    }
}

/// The function table: the calls the double implements; every other slot is null, as the header
/// allows for functions a backend does not provide.
fn table() -> QnnInterfaceImpl {
    QnnInterfaceImpl {
        backendCreate: Some(backend_create),
        backendGetApiVersion: Some(backend_get_api_version),
        backendGetBuildId: Some(backend_get_build_id),
        backendFree: Some(backend_free),
        contextCreate: Some(context_create),
        contextFree: Some(context_free),
        graphCreate: Some(graph_create),
        graphAddNode: Some(graph_add_node),
        graphFinalize: Some(graph_finalize),
        graphExecute: Some(graph_execute),
        tensorCreateGraphTensor: Some(tensor_create_graph_tensor),
        logCreate: Some(log_create),
        logSetLogLevel: Some(log_set_level),
        logFree: Some(log_free),
        deviceCreate: Some(device_create),
        deviceFree: Some(device_free),
        ..QnnInterfaceImpl::INIT
    }
}

/// A provider struct and its one-element list, leaked once per reported version (so that the
/// pointers handed out stay valid for the life of the process, as the header promises for the
/// library's life).
struct ProviderList(*const *const QnnInterface_t);

// SAFETY: the pointed-to list and provider are leaked, never written after creation, so sharing
// the pointer between threads only shares immutable data.
unsafe impl Send for ProviderList {}

fn provider_list(version: Qnn_ApiVersion_t) -> *const *const QnnInterface_t {
    static LISTS: std::sync::Mutex<Vec<(u32, ProviderList)>> = std::sync::Mutex::new(Vec::new());
    let mut lists = LISTS.lock().unwrap_or_else(|e| e.into_inner());
    let major = version.coreApiVersion.major;
    if let Some((_, l)) = lists.iter().find(|(m, _)| *m == major) {
        return l.0;
    }
    let provider: &'static QnnInterface_t = Box::leak(Box::new(QnnInterface_t {
        backendId: QNN_BACKEND_ID_NULL,
        providerName: c"sparrow-qnn-double".as_ptr(),
        apiVersion: version,
        table: table(),
    }));
    let list: &'static [*const QnnInterface_t; 1] =
        Box::leak(Box::new([provider as *const QnnInterface_t]));
    let ptr = list.as_ptr();
    lists.push((major, ProviderList(ptr)));
    ptr
}

/// `QnnInterface_getProviders`, as a QNN backend library exports it.
///
/// # Safety
/// Both pointers must be writable (QnnInterface.h contract).
#[no_mangle]
pub unsafe extern "C" fn QnnInterface_getProviders(
    provider_list: *mut *const *const QnnInterface_t,
    num_providers: *mut u32,
) -> Qnn_ErrorHandle_t {
    if provider_list.is_null() || num_providers.is_null() {
        return QNN_INTERFACE_ERROR_INVALID_PARAMETER;
    }
    let list = provider_list_for_now();
    // SAFETY: both non-null and writable by the caller's contract.
    unsafe {
        *provider_list = list;
        *num_providers = 1;
    }
    QNN_SUCCESS
}

fn provider_list_for_now() -> *const *const QnnInterface_t {
    provider_list(provider_version())
}

/// Makes QNN function `step` (e.g. `graphFinalize`; several comma-separated) fail on the calling
/// thread; null clears. Overrides `QNN_DOUBLE_FAIL` for this thread.
///
/// # Safety
/// `step` must be null or a C string.
#[no_mangle]
pub unsafe extern "C" fn qnn_double_set_fail(step: *const c_char) {
    let s = if step.is_null() {
        None
    } else {
        // SAFETY: a C string by the caller's contract.
        Some(
            unsafe { CStr::from_ptr(step) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    faults::set_fail(s);
}

/// Makes the provider report core API major version `major` on the calling thread; 0 clears.
#[no_mangle]
pub extern "C" fn qnn_double_set_api_major(major: u32) {
    faults::set_api_major((major != 0).then_some(major));
}

/// Objects (logs, devices, backends, contexts, graphs) created by the calling thread and not freed.
#[no_mangle]
pub extern "C" fn qnn_double_live_objects() -> u64 {
    let me = std::thread::current().id();
    lock().entries.values().filter(|e| e.owner == me).count() as u64
}

/// Frees the double refused on the calling thread because a dependent object was alive.
#[no_mangle]
pub extern "C" fn qnn_double_order_errors() -> u64 {
    let me = std::thread::current().id();
    lock().order_errors.get(&me).copied().unwrap_or(0)
}
