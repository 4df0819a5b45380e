//! Loading a QNN backend library at run time (`dlopen` through `libloading`) and reading its
//! interface providers. Nothing links against QNN at build time.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::interface::{
    QnnInterfaceGetProvidersFn, QnnInterface_t, QNN_INTERFACE_GET_PROVIDERS_SYMBOL,
};
use crate::types::{qnn_error_code, Qnn_ErrorHandle_t, QNN_SUCCESS};

/// The usual names of the QNN backend libraries, in the order [`QnnLibrary::open_default`] tries
/// them: the HTP (Hexagon NPU) backend, then the CPU reference backend.
pub const DEFAULT_LIBRARY_NAMES: &[&str] = &["libQnnHtp.so", "libQnnCpu.so"];

/// Why a library could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `dlopen` failed.
    Open {
        /// The path or name given.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library lacks a symbol.
    MissingSymbol {
        /// The library.
        path: PathBuf,
        /// The symbol.
        symbol: String,
    },
    /// `QnnInterface_getProviders` returned an error code.
    Providers {
        /// The library.
        path: PathBuf,
        /// The QNN error code (low 16 bits of the result).
        code: u64,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Open { path, reason } => {
                write!(f, "cannot load {}: {reason}", path.display())
            }
            LoadError::MissingSymbol { path, symbol } => {
                write!(f, "{} does not export {symbol}", path.display())
            }
            LoadError::Providers { path, code } => write!(
                f,
                "{QNN_INTERFACE_GET_PROVIDERS_SYMBOL} of {} failed with QNN error {code}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for LoadError {}

/// A loaded QNN backend library. Everything read from it (provider tables, function pointers) is
/// valid only while it is loaded: keep it alive longer than any of those.
pub struct QnnLibrary {
    lib: libloading::Library,
    path: PathBuf,
}

impl fmt::Debug for QnnLibrary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QnnLibrary")
            .field("path", &self.path)
            .finish()
    }
}

impl QnnLibrary {
    /// Loads the library at `path` (a path, or a bare name searched the usual `dlopen` way).
    ///
    /// # Safety
    /// Loading runs the library's initialisers and later calls run its code: `path` must name a QNN
    /// backend library (or another library whose initialisers are sound to run in this process).
    pub unsafe fn open(path: &Path) -> Result<Self, LoadError> {
        // SAFETY: the caller vouches for the library's initialisers (this function's contract).
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            lib,
            path: path.to_path_buf(),
        })
    }

    /// Loads the first of [`DEFAULT_LIBRARY_NAMES`] that loads; the error names all of them.
    ///
    /// # Safety
    /// As [`QnnLibrary::open`], for the libraries those names resolve to.
    pub unsafe fn open_default() -> Result<Self, LoadError> {
        let mut reasons = Vec::new();
        for name in DEFAULT_LIBRARY_NAMES {
            // SAFETY: forwarded contract: these names are the QNN backend libraries.
            match unsafe { Self::open(Path::new(name)) } {
                Ok(lib) => return Ok(lib),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        Err(LoadError::Open {
            path: PathBuf::from(DEFAULT_LIBRARY_NAMES.join(", ")),
            reason: reasons.join("; "),
        })
    }

    /// The path or name the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Looks up an exported symbol as a value of type `T` (a function pointer type).
    ///
    /// # Safety
    /// `T` must be the symbol's true type (for a function: its exact C signature, `extern "C"`).
    pub unsafe fn symbol<T: Copy>(&self, name: &str) -> Result<T, LoadError> {
        let missing = || LoadError::MissingSymbol {
            path: self.path.clone(),
            symbol: name.to_string(),
        };
        let mut cname = name.as_bytes().to_vec();
        cname.push(0);
        // SAFETY: the caller guarantees `T` is the symbol's type; the value is copied out while
        // `self` (the library) is alive, and using it later is bound to the library's lifetime by
        // the contract of this type.
        let sym = unsafe { self.lib.get::<T>(&cname) }.map_err(|_| missing())?;
        Ok(*sym)
    }

    /// Calls `QnnInterface_getProviders` and returns the providers, borrowed from the library.
    pub fn providers(&self) -> Result<&[&QnnInterface_t], LoadError> {
        // SAFETY: `QnnInterface_getProviders` has this signature in `QnnInterface.h`.
        let get: QnnInterfaceGetProvidersFn =
            unsafe { self.symbol(QNN_INTERFACE_GET_PROVIDERS_SYMBOL) }?;
        let mut list: *const *const QnnInterface_t = std::ptr::null();
        let mut n: u32 = 0;
        // SAFETY: both out-pointers point at live locals of the right types; the header allows the
        // call at any time after loading.
        let rc: Qnn_ErrorHandle_t = unsafe { get(&mut list, &mut n) };
        if rc != QNN_SUCCESS {
            return Err(LoadError::Providers {
                path: self.path.clone(),
                code: qnn_error_code(rc),
            });
        }
        if n == 0 || list.is_null() {
            return Ok(&[]);
        }
        // SAFETY: on success the library wrote an array of `n` provider pointers that lives as long
        // as the library (QnnInterface.h), and `&self` keeps the library loaded for the borrow.
        let ptrs = unsafe { std::slice::from_raw_parts(list, n as usize) };
        if ptrs.iter().any(|p| p.is_null()) {
            return Err(LoadError::Providers {
                path: self.path.clone(),
                code: crate::errors::QNN_INTERFACE_ERROR_INVALID_PARAMETER,
            });
        }
        // SAFETY: every pointer is non-null (checked) and points at a provider struct that lives as
        // long as the library; `&T` and non-null `*const T` have the same layout.
        Ok(unsafe { std::slice::from_raw_parts(list.cast::<&QnnInterface_t>(), n as usize) })
    }
}
