//! Loading a QNN backend library and choosing its provider.

use std::path::Path;
use std::sync::Arc;

use npu_qnn_sys::{
    LoadError, QnnInterfaceImpl, QnnLibrary, Qnn_Version_t, QNN_API_VERSION_MAJOR,
    QNN_API_VERSION_MINOR_MIN,
};

use crate::error::{ApiVersion, QnnError};

/// The oldest core API version these bindings work with (the major must match exactly).
pub const WANTED_API: ApiVersion = ApiVersion {
    major: QNN_API_VERSION_MAJOR,
    minor: QNN_API_VERSION_MINOR_MIN,
    patch: 0,
};

/// A library and the table of its chosen provider. Dropped last: every object made from it holds an
/// `Arc` of it, so the library stays loaded while any handle or function pointer can be used.
pub(crate) struct Loaded {
    pub table: QnnInterfaceImpl,
    pub version: ApiVersion,
    pub backend_id: u32,
    // Last field: dropped (unloaded) after everything above.
    _lib: QnnLibrary,
}

/// A loaded QNN backend library (`libQnnHtp.so`, `libQnnCpu.so`, or the test double). Cheap to
/// clone; the library is unloaded when the last clone and the last object made from it are gone.
#[derive(Clone)]
pub struct Qnn {
    pub(crate) inner: Arc<Loaded>,
}

fn version(v: Qnn_Version_t) -> ApiVersion {
    ApiVersion {
        major: v.major,
        minor: v.minor,
        patch: v.patch,
    }
}

fn from_load(e: LoadError) -> QnnError {
    match e {
        LoadError::Open { path, reason } => QnnError::Load { path, reason },
        LoadError::MissingSymbol { path, symbol } => QnnError::MissingSymbol { path, symbol },
        LoadError::Providers { code, .. } => QnnError::Call {
            step: "QnnInterface_getProviders",
            code,
        },
    }
}

impl Qnn {
    /// Loads the QNN backend library at `path`, or with `None` the first of `libQnnHtp.so`,
    /// `libQnnCpu.so` that the dynamic loader finds, and picks its first provider whose core API
    /// major version is the one bound here and whose minor is at least [`WANTED_API`]'s.
    ///
    /// Loading runs the library's code: pass only a QNN backend library (or the test double).
    pub fn load(path: Option<&Path>) -> Result<Qnn, QnnError> {
        // SAFETY: the caller names a QNN backend library (this function's documented contract,
        // the same trust any program linking QNN places in it).
        let lib = unsafe {
            match path {
                Some(p) => QnnLibrary::open(p),
                None => QnnLibrary::open_default(),
            }
        }
        .map_err(from_load)?;
        let providers = lib.providers().map_err(from_load)?;
        let first = providers.first().ok_or(QnnError::NoProvider)?;
        let chosen = providers
            .iter()
            .find(|p| {
                let v = p.apiVersion.coreApiVersion;
                v.major == WANTED_API.major && v.minor >= WANTED_API.minor
            })
            .ok_or(QnnError::Version {
                found: version(first.apiVersion.coreApiVersion),
                want: WANTED_API,
            })?;
        let (table, v, backend_id) = (
            chosen.table,
            version(chosen.apiVersion.coreApiVersion),
            chosen.backendId,
        );
        Ok(Qnn {
            inner: Arc::new(Loaded {
                table,
                version: v,
                backend_id,
                _lib: lib,
            }),
        })
    }

    /// The core API version of the chosen provider.
    pub fn api_version(&self) -> ApiVersion {
        self.inner.version
    }

    /// The backend id of the chosen provider (`QNN_BACKEND_ID_HTP` = 6, ...; 0 when the library
    /// holds one backend and does not say).
    pub fn backend_id(&self) -> u32 {
        self.inner.backend_id
    }
}

/// `Ok` for `QNN_SUCCESS`, else [`QnnError::Call`] naming `step`.
pub(crate) fn check(step: &'static str, rc: u64) -> Result<(), QnnError> {
    if rc == npu_qnn_sys::QNN_SUCCESS {
        Ok(())
    } else {
        Err(QnnError::Call {
            step,
            code: npu_qnn_sys::qnn_error_code(rc),
        })
    }
}

/// The function in a table slot, or [`QnnError::Unsupported`].
pub(crate) fn func<T>(function: &'static str, slot: Option<T>) -> Result<T, QnnError> {
    slot.ok_or(QnnError::Unsupported { function })
}
