//! The function table of `QnnInterface.h` (`QNN_INTERFACE_VER_TYPE`), the provider struct
//! [`QnnInterface_t`] and the one exported symbol, `QnnInterface_getProviders`.
//!
//! Field order is the header's, core API 2.10 (48 functions, `propertyHasCapability` …
//! `signalFree`). Later minors append functions after `signalFree` (`errorGetMessage`, …); this crate
//! only reads the table through a pointer into the library, so the appended tail is never touched.
//! Slots whose signature involves types this crate does not bind are [`QnnFnUnbound`]: right size
//! and place, not callable through this crate.

use std::ffi::{c_char, c_void};

use crate::tensor::{Qnn_OpConfig_t, Qnn_Tensor_t};
use crate::types::*;

/// Opaque `QnnBackend_Config_t` (only null-terminated arrays of pointers to it are passed).
#[repr(C)]
pub struct QnnBackend_Config_t {
    _private: [u8; 0],
}
/// Opaque `QnnContext_Config_t`.
#[repr(C)]
pub struct QnnContext_Config_t {
    _private: [u8; 0],
}
/// Opaque `QnnGraph_Config_t`.
#[repr(C)]
pub struct QnnGraph_Config_t {
    _private: [u8; 0],
}
/// Opaque `QnnDevice_Config_t`.
#[repr(C)]
pub struct QnnDevice_Config_t {
    _private: [u8; 0],
}

/// `QnnLog_Callback_t`: `void (*)(const char* fmt, QnnLog_Level_t, uint64_t timestamp, va_list)`.
/// `va_list` has no stable Rust type, so this crate passes null (no callback: the backend logs
/// nowhere) and keeps the pointer opaque.
pub type QnnLog_Callback_t = *const c_void;

/// `Qnn_NotifyFn_t` of `graphExecuteAsync`: `void (*)(void* notifyParam, Qnn_NotifyStatus_t)`,
/// where `Qnn_NotifyStatus_t` is `{ Qnn_ErrorHandle_t error; }`.
pub type Qnn_NotifyFn_t = Option<unsafe extern "C" fn(notifyParam: *mut c_void, error: u64)>;

/// A table slot whose signature is not bound here.
pub type QnnFnUnbound = Option<unsafe extern "C" fn()>;

/// `QnnProperty_HasCapabilityFn_t`.
pub type QnnProperty_HasCapabilityFn_t =
    Option<unsafe extern "C" fn(key: QnnProperty_Key_t) -> Qnn_ErrorHandle_t>;
/// `QnnBackend_CreateFn_t`.
pub type QnnBackend_CreateFn_t = Option<
    unsafe extern "C" fn(
        logger: Qnn_LogHandle_t,
        config: *const *const QnnBackend_Config_t,
        backend: *mut Qnn_BackendHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnBackend_SetConfigFn_t`.
pub type QnnBackend_SetConfigFn_t = Option<
    unsafe extern "C" fn(
        backend: Qnn_BackendHandle_t,
        config: *const *const QnnBackend_Config_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnBackend_GetApiVersionFn_t`.
pub type QnnBackend_GetApiVersionFn_t =
    Option<unsafe extern "C" fn(pVersion: *mut Qnn_ApiVersion_t) -> Qnn_ErrorHandle_t>;
/// `QnnBackend_GetBuildIdFn_t`.
pub type QnnBackend_GetBuildIdFn_t =
    Option<unsafe extern "C" fn(id: *mut *const c_char) -> Qnn_ErrorHandle_t>;
/// `QnnBackend_RegisterOpPackageFn_t`.
pub type QnnBackend_RegisterOpPackageFn_t = Option<
    unsafe extern "C" fn(
        backend: Qnn_BackendHandle_t,
        packagePath: *const c_char,
        interfaceProvider: *const c_char,
        target: *const c_char,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnBackend_GetSupportedOperationsFn_t` (`QnnBackend_OperationName_t` is `const char*`).
pub type QnnBackend_GetSupportedOperationsFn_t = Option<
    unsafe extern "C" fn(
        backend: Qnn_BackendHandle_t,
        numOperations: *mut u32,
        operations: *mut *const *const c_char,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnBackend_ValidateOpConfigFn_t`.
pub type QnnBackend_ValidateOpConfigFn_t = Option<
    unsafe extern "C" fn(
        backend: Qnn_BackendHandle_t,
        opConfig: Qnn_OpConfig_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnBackend_FreeFn_t`.
pub type QnnBackend_FreeFn_t =
    Option<unsafe extern "C" fn(backend: Qnn_BackendHandle_t) -> Qnn_ErrorHandle_t>;
/// `QnnContext_CreateFn_t`.
pub type QnnContext_CreateFn_t = Option<
    unsafe extern "C" fn(
        backend: Qnn_BackendHandle_t,
        device: Qnn_DeviceHandle_t,
        config: *const *const QnnContext_Config_t,
        context: *mut Qnn_ContextHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnContext_SetConfigFn_t`.
pub type QnnContext_SetConfigFn_t = Option<
    unsafe extern "C" fn(
        context: Qnn_ContextHandle_t,
        config: *const *const QnnContext_Config_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnContext_GetBinarySizeFn_t`.
pub type QnnContext_GetBinarySizeFn_t = Option<
    unsafe extern "C" fn(
        context: Qnn_ContextHandle_t,
        binaryBufferSize: *mut Qnn_ContextBinarySize_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnContext_GetBinaryFn_t`.
pub type QnnContext_GetBinaryFn_t = Option<
    unsafe extern "C" fn(
        context: Qnn_ContextHandle_t,
        binaryBuffer: *mut c_void,
        binaryBufferSize: Qnn_ContextBinarySize_t,
        writtenBufferSize: *mut Qnn_ContextBinarySize_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnContext_CreateFromBinaryFn_t`.
pub type QnnContext_CreateFromBinaryFn_t = Option<
    unsafe extern "C" fn(
        backend: Qnn_BackendHandle_t,
        device: Qnn_DeviceHandle_t,
        config: *const *const QnnContext_Config_t,
        binaryBuffer: *const c_void,
        binaryBufferSize: Qnn_ContextBinarySize_t,
        context: *mut Qnn_ContextHandle_t,
        profile: Qnn_ProfileHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnContext_FreeFn_t`.
pub type QnnContext_FreeFn_t = Option<
    unsafe extern "C" fn(
        context: Qnn_ContextHandle_t,
        profile: Qnn_ProfileHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_CreateFn_t`.
pub type QnnGraph_CreateFn_t = Option<
    unsafe extern "C" fn(
        contextHandle: Qnn_ContextHandle_t,
        graphName: *const c_char,
        config: *const *const QnnGraph_Config_t,
        graphHandle: *mut Qnn_GraphHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_CreateSubgraphFn_t`.
pub type QnnGraph_CreateSubgraphFn_t = Option<
    unsafe extern "C" fn(
        graphHandle: Qnn_GraphHandle_t,
        graphName: *const c_char,
        subgraphHandle: *mut Qnn_GraphHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_SetConfigFn_t`.
pub type QnnGraph_SetConfigFn_t = Option<
    unsafe extern "C" fn(
        graphHandle: Qnn_GraphHandle_t,
        config: *const *const QnnGraph_Config_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_AddNodeFn_t` (the op config is passed by value).
pub type QnnGraph_AddNodeFn_t = Option<
    unsafe extern "C" fn(
        graphHandle: Qnn_GraphHandle_t,
        opConfig: Qnn_OpConfig_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_FinalizeFn_t`.
pub type QnnGraph_FinalizeFn_t = Option<
    unsafe extern "C" fn(
        graphHandle: Qnn_GraphHandle_t,
        profileHandle: Qnn_ProfileHandle_t,
        signalHandle: Qnn_SignalHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_RetrieveFn_t`.
pub type QnnGraph_RetrieveFn_t = Option<
    unsafe extern "C" fn(
        contextHandle: Qnn_ContextHandle_t,
        graphName: *const c_char,
        graphHandle: *mut Qnn_GraphHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_ExecuteFn_t`.
pub type QnnGraph_ExecuteFn_t = Option<
    unsafe extern "C" fn(
        graphHandle: Qnn_GraphHandle_t,
        inputs: *const Qnn_Tensor_t,
        numInputs: u32,
        outputs: *mut Qnn_Tensor_t,
        numOutputs: u32,
        profileHandle: Qnn_ProfileHandle_t,
        signalHandle: Qnn_SignalHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnGraph_ExecuteAsyncFn_t`.
pub type QnnGraph_ExecuteAsyncFn_t = Option<
    unsafe extern "C" fn(
        graphHandle: Qnn_GraphHandle_t,
        inputs: *const Qnn_Tensor_t,
        numInputs: u32,
        outputs: *mut Qnn_Tensor_t,
        numOutputs: u32,
        profileHandle: Qnn_ProfileHandle_t,
        signalHandle: Qnn_SignalHandle_t,
        notifyFn: Qnn_NotifyFn_t,
        notifyParam: *mut c_void,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnTensor_CreateContextTensorFn_t`.
pub type QnnTensor_CreateContextTensorFn_t = Option<
    unsafe extern "C" fn(
        context: Qnn_ContextHandle_t,
        tensor: *mut Qnn_Tensor_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnTensor_CreateGraphTensorFn_t`: registers a tensor with a graph and writes its `id`.
pub type QnnTensor_CreateGraphTensorFn_t = Option<
    unsafe extern "C" fn(graph: Qnn_GraphHandle_t, tensor: *mut Qnn_Tensor_t) -> Qnn_ErrorHandle_t,
>;
/// `QnnLog_CreateFn_t`.
pub type QnnLog_CreateFn_t = Option<
    unsafe extern "C" fn(
        callback: QnnLog_Callback_t,
        maxLogLevel: QnnLog_Level_t,
        logger: *mut Qnn_LogHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnLog_SetLogLevelFn_t`.
pub type QnnLog_SetLogLevelFn_t = Option<
    unsafe extern "C" fn(logger: Qnn_LogHandle_t, maxLogLevel: QnnLog_Level_t) -> Qnn_ErrorHandle_t,
>;
/// `QnnLog_FreeFn_t`.
pub type QnnLog_FreeFn_t =
    Option<unsafe extern "C" fn(logger: Qnn_LogHandle_t) -> Qnn_ErrorHandle_t>;
/// `QnnDevice_CreateFn_t`.
pub type QnnDevice_CreateFn_t = Option<
    unsafe extern "C" fn(
        logger: Qnn_LogHandle_t,
        config: *const *const QnnDevice_Config_t,
        device: *mut Qnn_DeviceHandle_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnDevice_SetConfigFn_t`.
pub type QnnDevice_SetConfigFn_t = Option<
    unsafe extern "C" fn(
        device: Qnn_DeviceHandle_t,
        config: *const *const QnnDevice_Config_t,
    ) -> Qnn_ErrorHandle_t,
>;
/// `QnnDevice_FreeFn_t`.
pub type QnnDevice_FreeFn_t =
    Option<unsafe extern "C" fn(device: Qnn_DeviceHandle_t) -> Qnn_ErrorHandle_t>;

/// `QNN_INTERFACE_VER_TYPE` (`QnnInterface_ImplementationV2_10_t` in the 2.10 headers), in the header's
/// order. Any slot may be null (`None`): a function the backend does not provide.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnInterfaceImpl {
    /// `propertyHasCapability`.
    pub propertyHasCapability: QnnProperty_HasCapabilityFn_t,
    /// `backendCreate`.
    pub backendCreate: QnnBackend_CreateFn_t,
    /// `backendSetConfig`.
    pub backendSetConfig: QnnBackend_SetConfigFn_t,
    /// `backendGetApiVersion`.
    pub backendGetApiVersion: QnnBackend_GetApiVersionFn_t,
    /// `backendGetBuildId`.
    pub backendGetBuildId: QnnBackend_GetBuildIdFn_t,
    /// `backendRegisterOpPackage`.
    pub backendRegisterOpPackage: QnnBackend_RegisterOpPackageFn_t,
    /// `backendGetSupportedOperations`.
    pub backendGetSupportedOperations: QnnBackend_GetSupportedOperationsFn_t,
    /// `backendValidateOpConfig`.
    pub backendValidateOpConfig: QnnBackend_ValidateOpConfigFn_t,
    /// `backendFree`.
    pub backendFree: QnnBackend_FreeFn_t,
    /// `contextCreate`.
    pub contextCreate: QnnContext_CreateFn_t,
    /// `contextSetConfig`.
    pub contextSetConfig: QnnContext_SetConfigFn_t,
    /// `contextGetBinarySize`.
    pub contextGetBinarySize: QnnContext_GetBinarySizeFn_t,
    /// `contextGetBinary`.
    pub contextGetBinary: QnnContext_GetBinaryFn_t,
    /// `contextCreateFromBinary`.
    pub contextCreateFromBinary: QnnContext_CreateFromBinaryFn_t,
    /// `contextFree`.
    pub contextFree: QnnContext_FreeFn_t,
    /// `graphCreate`.
    pub graphCreate: QnnGraph_CreateFn_t,
    /// `graphCreateSubgraph`.
    pub graphCreateSubgraph: QnnGraph_CreateSubgraphFn_t,
    /// `graphSetConfig`.
    pub graphSetConfig: QnnGraph_SetConfigFn_t,
    /// `graphAddNode`.
    pub graphAddNode: QnnGraph_AddNodeFn_t,
    /// `graphFinalize`.
    pub graphFinalize: QnnGraph_FinalizeFn_t,
    /// `graphRetrieve`.
    pub graphRetrieve: QnnGraph_RetrieveFn_t,
    /// `graphExecute`.
    pub graphExecute: QnnGraph_ExecuteFn_t,
    /// `graphExecuteAsync`.
    pub graphExecuteAsync: QnnGraph_ExecuteAsyncFn_t,
    /// `tensorCreateContextTensor`.
    pub tensorCreateContextTensor: QnnTensor_CreateContextTensorFn_t,
    /// `tensorCreateGraphTensor`.
    pub tensorCreateGraphTensor: QnnTensor_CreateGraphTensorFn_t,
    /// `logCreate`.
    pub logCreate: QnnLog_CreateFn_t,
    /// `logSetLogLevel`.
    pub logSetLogLevel: QnnLog_SetLogLevelFn_t,
    /// `logFree`.
    pub logFree: QnnLog_FreeFn_t,
    /// `profileCreate` (not bound).
    pub profileCreate: QnnFnUnbound,
    /// `profileSetConfig` (not bound).
    pub profileSetConfig: QnnFnUnbound,
    /// `profileGetEvents` (not bound).
    pub profileGetEvents: QnnFnUnbound,
    /// `profileGetSubEvents` (not bound).
    pub profileGetSubEvents: QnnFnUnbound,
    /// `profileGetEventData` (not bound).
    pub profileGetEventData: QnnFnUnbound,
    /// `profileGetExtendedEventData` (not bound).
    pub profileGetExtendedEventData: QnnFnUnbound,
    /// `profileFree` (not bound).
    pub profileFree: QnnFnUnbound,
    /// `memRegister` (not bound).
    pub memRegister: QnnFnUnbound,
    /// `memDeRegister` (not bound).
    pub memDeRegister: QnnFnUnbound,
    /// `deviceGetPlatformInfo` (not bound).
    pub deviceGetPlatformInfo: QnnFnUnbound,
    /// `deviceFreePlatformInfo` (not bound).
    pub deviceFreePlatformInfo: QnnFnUnbound,
    /// `deviceGetInfrastructure` (not bound).
    pub deviceGetInfrastructure: QnnFnUnbound,
    /// `deviceCreate`.
    pub deviceCreate: QnnDevice_CreateFn_t,
    /// `deviceSetConfig`.
    pub deviceSetConfig: QnnDevice_SetConfigFn_t,
    /// `deviceGetInfo` (not bound).
    pub deviceGetInfo: QnnFnUnbound,
    /// `deviceFree`.
    pub deviceFree: QnnDevice_FreeFn_t,
    /// `signalCreate` (not bound).
    pub signalCreate: QnnFnUnbound,
    /// `signalSetConfig` (not bound).
    pub signalSetConfig: QnnFnUnbound,
    /// `signalTrigger` (not bound).
    pub signalTrigger: QnnFnUnbound,
    /// `signalFree` (not bound).
    pub signalFree: QnnFnUnbound,
}

impl QnnInterfaceImpl {
    /// `QNN_INTERFACE_VER_TYPE_INIT`: every slot null.
    pub const INIT: Self = Self {
        propertyHasCapability: None,
        backendCreate: None,
        backendSetConfig: None,
        backendGetApiVersion: None,
        backendGetBuildId: None,
        backendRegisterOpPackage: None,
        backendGetSupportedOperations: None,
        backendValidateOpConfig: None,
        backendFree: None,
        contextCreate: None,
        contextSetConfig: None,
        contextGetBinarySize: None,
        contextGetBinary: None,
        contextCreateFromBinary: None,
        contextFree: None,
        graphCreate: None,
        graphCreateSubgraph: None,
        graphSetConfig: None,
        graphAddNode: None,
        graphFinalize: None,
        graphRetrieve: None,
        graphExecute: None,
        graphExecuteAsync: None,
        tensorCreateContextTensor: None,
        tensorCreateGraphTensor: None,
        logCreate: None,
        logSetLogLevel: None,
        logFree: None,
        profileCreate: None,
        profileSetConfig: None,
        profileGetEvents: None,
        profileGetSubEvents: None,
        profileGetEventData: None,
        profileGetExtendedEventData: None,
        profileFree: None,
        memRegister: None,
        memDeRegister: None,
        deviceGetPlatformInfo: None,
        deviceFreePlatformInfo: None,
        deviceGetInfrastructure: None,
        deviceCreate: None,
        deviceSetConfig: None,
        deviceGetInfo: None,
        deviceFree: None,
        signalCreate: None,
        signalSetConfig: None,
        signalTrigger: None,
        signalFree: None,
    };
}

/// `QnnInterface_t`: one interface provider of a backend library.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QnnInterface_t {
    /// `QNN_BACKEND_ID_*`, or `QNN_BACKEND_ID_NULL` in a single-backend library.
    pub backendId: u32,
    /// Provider name; may be null.
    pub providerName: *const c_char,
    /// API version of this provider's table.
    pub apiVersion: Qnn_ApiVersion_t,
    /// The function table (in the header: a union with one member named after the version).
    pub table: QnnInterfaceImpl,
}

/// The symbol every QNN backend library exports.
pub const QNN_INTERFACE_GET_PROVIDERS_SYMBOL: &str = "QnnInterface_getProviders";

/// `QnnInterface_getProviders`: writes a pointer to an array of `numProviders` provider pointers,
/// valid as long as the library stays loaded.
pub type QnnInterfaceGetProvidersFn = unsafe extern "C" fn(
    providerList: *mut *const *const QnnInterface_t,
    numProviders: *mut u32,
) -> Qnn_ErrorHandle_t;
