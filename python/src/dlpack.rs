//! DLPack export: a [`Buffer`] is a typed, shaped view of memory that Rust owns (a gathered
//! batch, an id vector), which `torch.from_dlpack` and `numpy.from_dlpack` turn into a tensor or
//! array over the same bytes. The memory lives until the last tensor viewing it is freed; then
//! its owner is dropped (a batch goes back to its loader's pool).
//!
//! Only the legacy (unversioned) `dltensor` capsule is produced: every PyTorch from 1.10 and
//! NumPy from 1.22 consumes it, including when it passes `max_version` (booleans, `kDLBool`:
//! PyTorch from 2.1, NumPy from 1.25).

use std::any::Any;
use std::ffi::{CStr, c_void};
use std::sync::Arc;

use arrow::datatypes::DataType;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// `kDLCPU`.
const DEVICE_CPU: i32 = 1;
const CAPSULE: &CStr = c"dltensor";

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType`: type code, bits, lanes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DlType {
    code: u8,
    bits: u8,
    lanes: u16,
}

impl DlType {
    const fn new(code: u8, bits: u8) -> Self {
        Self {
            code,
            bits,
            lanes: 1,
        }
    }
    /// `bool`, one byte per value (kDLBool).
    pub(crate) const BOOL: Self = Self::new(6, 8);
    /// `int64`.
    pub(crate) const I64: Self = Self::new(0, 64);

    /// The DLPack type of an Arrow element type, as gathered (booleans one byte per value).
    pub(crate) fn of(dt: &DataType) -> Option<Self> {
        let (code, bits) = match dt {
            DataType::Boolean => return Some(Self::BOOL),
            DataType::Int8 => (0, 8),
            DataType::Int16 => (0, 16),
            DataType::Int32 => (0, 32),
            DataType::Int64 => (0, 64),
            DataType::UInt8 => (1, 8),
            DataType::UInt16 => (1, 16),
            DataType::UInt32 => (1, 32),
            DataType::UInt64 => (1, 64),
            DataType::Float16 => (2, 16),
            DataType::Float32 => (2, 32),
            DataType::Float64 => (2, 64),
            _ => return None,
        };
        Some(Self::new(code, bits))
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bits as usize / 8
    }

    pub(crate) fn name(&self) -> String {
        let kind = match self.code {
            0 => "int",
            1 => "uint",
            2 => "float",
            6 => return "bool".into(),
            _ => "?",
        };
        format!("{kind}{}", self.bits)
    }
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What one exported tensor owns: the DLPack struct first (the consumer sees a pointer to it),
/// its shape, and a reference to the memory's owner.
#[repr(C)]
struct Managed {
    tensor: DlManagedTensor,
    shape: Vec<i64>,
    /// Strides in elements; empty for a compact row-major view.
    strides: Vec<i64>,
    _owner: Arc<dyn Any + Send + Sync>,
}

/// Frees a [`Managed`]: called by the consumer when its tensor dies, or by the capsule's
/// destructor when no consumer took it. May run on any thread, with or without the GIL: it
/// touches no Python object.
unsafe extern "C" fn delete_managed(m: *mut DlManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` is the first field of a `Managed` boxed by `Buffer::export` (repr(C)), and
        // DLPack calls the deleter exactly once.
        drop(unsafe { Box::from_raw(m as *mut Managed) });
    }
}

/// The capsule's destructor: frees the tensor unless a consumer took it (consumers rename the
/// capsule to `used_dltensor` and call the deleter themselves).
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: `capsule` is the capsule being destroyed (a valid object); `PyCapsule_IsValid`
    // sets no exception when the name differs.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, CAPSULE.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(capsule, CAPSULE.as_ptr());
            delete_managed(m as *mut DlManagedTensor);
        }
    }
}

/// A shaped, typed view of memory owned by Rust, exported through DLPack (`__dlpack__`) to
/// `torch.from_dlpack` or `numpy.from_dlpack` without a copy. Writable: the memory belongs to the
/// tensors made from it until they are all freed.
#[pyclass(frozen, module = "trajstore._native")]
pub struct Buffer {
    owner: Arc<dyn Any + Send + Sync>,
    /// Address of the first element (kept as an integer: the owner keeps it valid).
    ptr: usize,
    shape: Vec<i64>,
    /// Strides in elements, where the view is not compact row-major (a frame window's stacks,
    /// which overlap); None for compact.
    strides: Option<Vec<i64>>,
    dtype: DlType,
}

impl Buffer {
    /// A view of `shape` elements of `dtype` at `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to at least `product(shape) * dtype size` bytes that stay valid, and that
    /// nothing else reads or writes, for as long as `owner` lives.
    pub(crate) unsafe fn new(
        owner: Arc<dyn Any + Send + Sync>,
        ptr: *mut u8,
        shape: Vec<i64>,
        dtype: DlType,
    ) -> Self {
        Self {
            owner,
            ptr: ptr as usize,
            shape,
            strides: None,
            dtype,
        }
    }

    /// The view with `strides` (in elements, one per axis) instead of compact row-major ones.
    ///
    /// # Safety
    /// Every element the shape and strides address must lie in the memory [`Buffer::new`] was
    /// given.
    pub(crate) unsafe fn with_strides(mut self, strides: Vec<i64>) -> Self {
        debug_assert_eq!(strides.len(), self.shape.len());
        self.strides = Some(strides);
        self
    }

    /// A `[n]` `int64` buffer owning `values` (ids below 2^63 read the same as `uint64`).
    pub(crate) fn from_u64s(values: Vec<u64>) -> Self {
        let mut values = values;
        let (ptr, n) = (values.as_mut_ptr() as *mut u8, values.len() as i64);
        let owner: Arc<dyn Any + Send + Sync> = Arc::new(values);
        // SAFETY: the vector's heap buffer holds `n` u64 (8 bytes each) and is owned, unchanged,
        // by `owner` (moving a Vec does not move its buffer).
        unsafe { Self::new(owner, ptr, vec![n], DlType::I64) }
    }

    fn export<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let mut managed = Box::new(Managed {
            tensor: DlManagedTensor {
                dl_tensor: DlTensor {
                    data: self.ptr as *mut c_void,
                    device: DlDevice {
                        device_type: DEVICE_CPU,
                        device_id: 0,
                    },
                    ndim: self.shape.len() as i32,
                    dtype: self.dtype,
                    shape: std::ptr::null_mut(),
                    // Compact row-major unless set below.
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_managed),
            },
            shape: self.shape.clone(),
            strides: self.strides.clone().unwrap_or_default(),
            _owner: self.owner.clone(),
        });
        managed.tensor.dl_tensor.shape = managed.shape.as_mut_ptr();
        if self.strides.is_some() {
            managed.tensor.dl_tensor.strides = managed.strides.as_mut_ptr();
        }
        let raw = Box::into_raw(managed);
        // SAFETY: `raw` is a valid `Managed` whose first field is the `DLManagedTensor` the
        // capsule points to; `capsule_destructor` frees it unless a consumer took ownership.
        let capsule = unsafe {
            pyo3::ffi::PyCapsule_New(
                raw as *mut c_void,
                CAPSULE.as_ptr(),
                Some(capsule_destructor),
            )
        };
        if capsule.is_null() {
            // SAFETY: no capsule took `raw`; nothing else refers to it.
            unsafe { delete_managed(raw as *mut DlManagedTensor) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `PyCapsule_New` returned a new, non-null reference to a capsule.
        Ok(unsafe { Bound::from_owned_ptr(py, capsule).cast_into_unchecked() })
    }
}

#[pymethods]
impl Buffer {
    /// A DLPack capsule over this buffer (the DLPack protocol; CPU memory, so `stream` is
    /// ignored).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = (stream, max_version);
        if let Some((t, _)) = dl_device
            && t != DEVICE_CPU
        {
            return Err(PyBufferError::new_err(
                "trajstore buffers are in host memory (dl_device must be CPU)",
            ));
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "trajstore buffers are exported without copies (copy=True is not supported)",
            ));
        }
        self.export(py)
    }

    /// `(kDLCPU, 0)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DEVICE_CPU, 0)
    }

    /// The shape, in elements.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// Strides in elements, or None for a compact row-major view.
    #[getter]
    fn strides(&self) -> Option<Vec<i64>> {
        self.strides.clone()
    }

    /// Bytes viewed (of a frame window's overlapping stacks, as if written out).
    #[getter]
    fn nbytes(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product::<usize>() * self.dtype.bytes()
    }

    fn __repr__(&self) -> String {
        format!("Buffer({}, shape={:?})", self.dtype.name(), self.shape)
    }
}
