//! CUDA events for the staging ring, through the CUDA runtime that libtorch_cuda has already
//! loaded (tch has no event API): a worker about to refill a staging slot waits for the copies
//! out of that slot only, instead of synchronizing the whole device (every worker's copies and
//! the training loop's kernels). Where the runtime's symbols cannot be found, or a call fails,
//! the caller falls back to synchronizing the device, which is always correct.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

type RawEvent = *mut c_void;

type SetDevice = unsafe extern "C" fn(c_int) -> c_int;
type Create = unsafe extern "C" fn(*mut RawEvent, u32) -> c_int;
type Record = unsafe extern "C" fn(RawEvent, *mut c_void) -> c_int;
type OnEvent = unsafe extern "C" fn(RawEvent) -> c_int;

struct Runtime {
    set_device: SetDevice,
    create: Create,
    record: Record,
    synchronize: OnEvent,
    query: OnEvent,
    destroy: OnEvent,
    attributes: Option<Attributes>,
}

type Attributes = unsafe extern "C" fn(*mut PointerAttributes, *const c_void) -> c_int;

/// `cudaPointerAttributes` (CUDA 11 and later).
#[repr(C)]
struct PointerAttributes {
    kind: c_int,
    device: c_int,
    device_pointer: *mut c_void,
    host_pointer: *mut c_void,
}

/// `cudaMemoryTypeHost`: page-locked host memory.
const MEMORY_HOST: c_int = 1;

/// `cudaEventDisableTiming`: no timestamps, the cheapest event to record and wait on.
const DISABLE_TIMING: u32 = 0x02;

fn runtime() -> Option<&'static Runtime> {
    static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            for lib in [c"libcudart.so.13", c"libcudart.so.12", c"libcudart.so"] {
                // SAFETY: RTLD_NOLOAD only looks up a library already loaded (by libtorch_cuda);
                // the handle is never closed, so the symbols stay valid for the process.
                let handle =
                    unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
                if handle.is_null() {
                    continue;
                }
                let sym = |name: &CStr| {
                    // SAFETY: a symbol lookup in a valid handle.
                    let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
                    (!p.is_null()).then_some(p)
                };
                let (Some(s), Some(c), Some(r), Some(w), Some(q), Some(d)) = (
                    sym(c"cudaSetDevice"),
                    sym(c"cudaEventCreateWithFlags"),
                    sym(c"cudaEventRecord"),
                    sym(c"cudaEventSynchronize"),
                    sym(c"cudaEventQuery"),
                    sym(c"cudaEventDestroy"),
                ) else {
                    continue;
                };
                // SAFETY: the CUDA runtime's documented C signatures (cudaError_t is an int enum;
                // cudaEvent_t and cudaStream_t are pointers).
                return Some(unsafe {
                    Runtime {
                        set_device: std::mem::transmute::<*mut c_void, SetDevice>(s),
                        create: std::mem::transmute::<*mut c_void, Create>(c),
                        record: std::mem::transmute::<*mut c_void, Record>(r),
                        synchronize: std::mem::transmute::<*mut c_void, OnEvent>(w),
                        query: std::mem::transmute::<*mut c_void, OnEvent>(q),
                        destroy: std::mem::transmute::<*mut c_void, OnEvent>(d),
                        attributes: sym(c"cudaPointerGetAttributes")
                            .map(|a| std::mem::transmute::<*mut c_void, Attributes>(a)),
                    }
                });
            }
            None
        })
        .as_ref()
}

/// Marks the end of the copies out of one staging slot on one device.
pub(crate) struct CopyDone {
    event: RawEvent,
    device: c_int,
    rt: &'static Runtime,
}

// SAFETY: a CUDA event may be recorded and waited on from any thread; each is owned by one
// worker.
unsafe impl Send for CopyDone {}

impl CopyDone {
    /// An event on CUDA device `device`, or None where the runtime is not available.
    pub(crate) fn new(device: usize) -> Option<Self> {
        let rt = runtime()?;
        let device = c_int::try_from(device).ok()?;
        let mut event: RawEvent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device is the one the loader's copies go to.
        let ok =
            unsafe { (rt.set_device)(device) == 0 && (rt.create)(&mut event, DISABLE_TIMING) == 0 };
        (ok && !event.is_null()).then_some(Self { event, device, rt })
    }

    /// Records the event on the device's default stream, the stream libtorch issued this
    /// thread's copies on, after them. False if the runtime refused.
    pub(crate) fn record(&self) -> bool {
        // SAFETY: a live event of this device; the null stream is the legacy default stream.
        unsafe {
            (self.rt.set_device)(self.device) == 0
                && (self.rt.record)(self.event, std::ptr::null_mut()) == 0
        }
    }

    /// Blocks until the work recorded before the event finished. False if the runtime refused.
    pub(crate) fn wait(&self) -> bool {
        // SAFETY: a live event.
        unsafe { (self.rt.synchronize)(self.event) == 0 }
    }
}

impl CopyDone {
    /// Whether the work recorded before the event has finished, without blocking (false while
    /// it runs, or if the runtime answered an error).
    pub(crate) fn finished(&self) -> bool {
        // SAFETY: a live event; cudaEventQuery returns 0 (cudaSuccess) once it has completed.
        unsafe { (self.rt.query)(self.event) == 0 }
    }
}

impl Drop for CopyDone {
    fn drop(&mut self) {
        // SAFETY: a live event, destroyed once. Destroying an event whose work is pending is
        // allowed: the runtime releases it once that work completes.
        unsafe {
            (self.rt.destroy)(self.event);
        }
    }
}

/// Whether `ptr` is page-locked host memory, as the CUDA runtime that libtorch_cuda loaded says
/// (None where it is not loaded or does not answer).
pub(crate) fn is_pinned(ptr: *mut c_void) -> Option<bool> {
    let get = runtime()?.attributes?;
    let mut a = PointerAttributes {
        kind: 0,
        device: 0,
        device_pointer: std::ptr::null_mut(),
        host_pointer: std::ptr::null_mut(),
    };
    // SAFETY: a valid out-pointer of the runtime's struct; any pointer value may be asked about.
    (unsafe { get(&mut a, ptr) } == 0).then_some(a.kind == MEMORY_HOST)
}
