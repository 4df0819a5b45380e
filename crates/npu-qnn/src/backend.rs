//! Backend, device and context: the QNN objects a graph lives in, freed in reverse order of
//! creation (contexts, then devices, then the backend, then the library) because each holds an
//! `Arc` of its parent.

use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;

use crate::error::QnnError;
use crate::library::{check, func, Loaded, Qnn};

/// A QNN handle. QNN handles are process-wide values, not tied to the thread that made them.
pub(crate) struct Handle(pub *mut c_void);

// SAFETY: a QNN handle is an opaque process-wide value (QnnCommon.h); moving it between threads
// moves no memory. Calls through it are serialised by the wrappers (`&mut Graph`, `!Sync` publics).
unsafe impl Send for Handle {}
// SAFETY: shared only inside `Arc`s whose owners make calls through `&mut` or in `Drop`; the
// public types holding them are `!Sync`, so no two threads call QNN through the same handle.
unsafe impl Sync for Handle {}

/// Makes a public type `Send` but not `Sync`.
pub(crate) type NotSync = PhantomData<Cell<()>>;

pub(crate) struct BackendInner {
    pub handle: Handle,
    pub qnn: Arc<Loaded>,
}

impl Drop for BackendInner {
    fn drop(&mut self) {
        if let Some(free) = self.qnn.table.backendFree {
            // SAFETY: the handle came from this library's backendCreate and is freed once; every
            // context and device holds an Arc of this backend, so none is alive any more.
            unsafe { free(self.handle.0) };
        }
    }
}

/// A QNN backend (`backendCreate`), the root of every other object.
pub struct Backend {
    pub(crate) inner: Arc<BackendInner>,
    _not_sync: NotSync,
}

impl Backend {
    /// Creates the backend, without a logger and with the default configuration.
    pub fn new(qnn: &Qnn) -> Result<Backend, QnnError> {
        let create = func("backendCreate", qnn.inner.table.backendCreate)?;
        let mut handle = ptr::null_mut();
        // SAFETY: a null logger and a null config array are allowed (QnnBackend.h); `handle` is a
        // live out-pointer.
        check("backendCreate", unsafe {
            create(ptr::null_mut(), ptr::null(), &mut handle)
        })?;
        Ok(Backend {
            inner: Arc::new(BackendInner {
                handle: Handle(handle),
                qnn: qnn.inner.clone(),
            }),
            _not_sync: PhantomData,
        })
    }
}

pub(crate) struct DeviceInner {
    pub handle: Handle,
    // Kept so the backend is freed after this device.
    pub backend: Arc<BackendInner>,
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        if let Some(free) = self.backend.qnn.table.deviceFree {
            // SAFETY: from this library's deviceCreate, freed once; every context on this device
            // holds an Arc of it, so none is alive any more.
            unsafe { free(self.handle.0) };
        }
    }
}

/// A QNN device (`deviceCreate`), optional: a context made without one uses the backend's default.
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
    _not_sync: NotSync,
}

impl Device {
    /// Creates the default device of `backend`'s library.
    pub fn new(backend: &Backend) -> Result<Device, QnnError> {
        let create = func("deviceCreate", backend.inner.qnn.table.deviceCreate)?;
        let mut handle = ptr::null_mut();
        // SAFETY: null logger and config are allowed (QnnDevice.h); `handle` is a live out-pointer.
        check("deviceCreate", unsafe {
            create(ptr::null_mut(), ptr::null(), &mut handle)
        })?;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                handle: Handle(handle),
                backend: backend.inner.clone(),
            }),
            _not_sync: PhantomData,
        })
    }
}

pub(crate) struct ContextInner {
    pub handle: Handle,
    // Dropped after the context is freed (field order): device, then backend.
    _device: Option<Arc<DeviceInner>>,
    pub backend: Arc<BackendInner>,
}

impl ContextInner {
    pub fn table(&self) -> &npu_qnn_sys::QnnInterfaceImpl {
        &self.backend.qnn.table
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        if let Some(free) = self.table().contextFree {
            // SAFETY: from this library's contextCreate, freed once, after every graph of it (each
            // graph holds an Arc of this context). A null profile handle is allowed.
            unsafe { free(self.handle.0, ptr::null_mut()) };
        }
    }
}

/// A QNN context (`contextCreate`): the home of graphs, freed with them.
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
    _not_sync: NotSync,
}

impl Context {
    /// Creates a context on `backend`, on `device` if given.
    pub fn new(backend: &Backend, device: Option<&Device>) -> Result<Context, QnnError> {
        let create = func("contextCreate", backend.inner.qnn.table.contextCreate)?;
        let dev = device.map_or(ptr::null_mut(), |d| d.inner.handle.0);
        let mut handle = ptr::null_mut();
        // SAFETY: backend and device handles are live (their Arcs are held by the caller's
        // objects); a null config array is allowed; `handle` is a live out-pointer.
        check("contextCreate", unsafe {
            create(backend.inner.handle.0, dev, ptr::null(), &mut handle)
        })?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                handle: Handle(handle),
                _device: device.map(|d| d.inner.clone()),
                backend: backend.inner.clone(),
            }),
            _not_sync: PhantomData,
        })
    }
}
