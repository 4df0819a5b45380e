//! The one error type of the wrapper: which step failed, and QNN's error code when QNN said no.

use std::fmt;
use std::path::PathBuf;

/// A QNN API version (`Qnn_Version_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiVersion {
    /// Major: incompatible changes.
    pub major: u32,
    /// Minor: additions.
    pub minor: u32,
    /// Patch.
    pub patch: u32,
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Everything that can go wrong between loading a QNN library and reading a graph's outputs.
#[derive(Debug, thiserror::Error)]
pub enum QnnError {
    /// The library could not be loaded.
    #[error("cannot load QNN library {}: {reason}", path.display())]
    Load {
        /// The path or name tried (several, comma-separated, for the default names).
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library lacks a symbol every QNN backend exports.
    #[error("{} is not a QNN backend library: no symbol {symbol}", path.display())]
    MissingSymbol {
        /// The library.
        path: PathBuf,
        /// The missing symbol.
        symbol: String,
    },
    /// The library offers no interface provider.
    #[error("the QNN library offers no interface provider")]
    NoProvider,
    /// No provider implements the core API version these bindings follow.
    #[error("QNN library implements core API {found}; these bindings need {}.x with x >= {}", want.major, want.minor)]
    Version {
        /// The version of the library's (first) provider.
        found: ApiVersion,
        /// The oldest version bound here (major must match exactly).
        want: ApiVersion,
    },
    /// A QNN call returned an error code.
    #[error("QNN {step} failed with error code {code}")]
    Call {
        /// The QNN function (e.g. `graphFinalize`).
        step: &'static str,
        /// The QNN error code (low 16 bits of the result).
        code: u64,
    },
    /// The library does not provide a function (a null slot in its table).
    #[error("the QNN library does not provide {function}")]
    Unsupported {
        /// The QNN function.
        function: &'static str,
    },
    /// Shapes that do not fit together, caught before QNN sees them.
    #[error("{what}: {detail}")]
    Shape {
        /// The node or tensor.
        what: String,
        /// What does not fit.
        detail: String,
    },
    /// A buffer of the wrong length, or the wrong number of buffers.
    #[error("{what}: expected {expected}, got {got}")]
    Length {
        /// Which buffer(s).
        what: String,
        /// Expected length (elements or count).
        expected: usize,
        /// Given length.
        got: usize,
    },
    /// A name QNN cannot take (an interior NUL).
    #[error("name {0:?} contains NUL")]
    Name(String),
    /// A call in the wrong state (a node added after finalize, execute before it).
    #[error("{0}")]
    State(&'static str),
}
