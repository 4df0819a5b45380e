//! Finding the built double and driving its fault injection from Rust tests.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};

use npu_qnn_sys::{LoadError, QnnLibrary};

/// File name of the double's shared library on this target (`libqnn_double.so` on Linux/Android).
pub fn library_file_name() -> String {
    format!(
        "{}qnn_double{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// The double's shared library next to the running test binary: cargo builds a dependency's cdylib
/// into `target/<triple>/<profile>/deps/` (where test binaries live) and, for a workspace member,
/// also into `target/<triple>/<profile>/`. `None` if neither holds it.
pub fn library_path() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let name = library_file_name();
    let found = [Some(deps), deps.parent()]
        .into_iter()
        .flatten()
        .map(|d| d.join(&name))
        .find(|p| p.is_file());
    found
}

/// The control functions of a loaded double (its exported `qnn_double_*` symbols). Settings are per
/// thread: they apply to QNN calls made on the thread that set them.
pub struct Control {
    // Keeps the double loaded while the function pointers below are used.
    _lib: QnnLibrary,
    set_fail: unsafe extern "C" fn(*const c_char),
    set_api_major: extern "C" fn(u32),
    live_objects: extern "C" fn() -> u64,
    order_errors: extern "C" fn() -> u64,
}

impl Control {
    /// Opens the double at `path` through `npu-qnn-sys`'s loader (the same loaded instance any other load of that path in the
    /// process gets) and resolves its control functions.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        // SAFETY: callers pass the double's own library, whose initialisers are Rust's (none that
        // matter).
        let lib = unsafe { QnnLibrary::open(path) }?;
        // SAFETY: the types are the exact signatures of the `#[no_mangle]` functions in
        // `exports.rs` of this crate.
        unsafe {
            Ok(Self {
                set_fail: lib.symbol("qnn_double_set_fail")?,
                set_api_major: lib.symbol("qnn_double_set_api_major")?,
                live_objects: lib.symbol("qnn_double_live_objects")?,
                order_errors: lib.symbol("qnn_double_order_errors")?,
                _lib: lib,
            })
        }
    }

    /// Makes QNN function `step` fail on this thread (`None`: nothing fails).
    pub fn set_fail(&self, step: Option<&str>) {
        let c = step.map(|s| CString::new(s).expect("step names have no NUL"));
        // SAFETY: null or a C string that outlives the call.
        unsafe { (self.set_fail)(c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())) }
    }

    /// Makes the provider report core API major version `major` on this thread (`None`: the real
    /// one).
    pub fn set_api_major(&self, major: Option<u32>) {
        (self.set_api_major)(major.unwrap_or(0))
    }

    /// QNN objects created on this thread and not freed yet.
    pub fn live_objects(&self) -> u64 {
        (self.live_objects)()
    }

    /// Frees refused on this thread because a dependent object was still alive (wrong drop order).
    pub fn order_errors(&self) -> u64 {
        (self.order_errors)()
    }
}
