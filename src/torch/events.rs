//! CUDA events for the staging ring, through the CUDA runtime that libtorch_cuda has already
//! loaded (tch has no event API): a worker about to refill a staging slot waits for the copies
//! out of that slot only, instead of synchronizing the whole device (every worker's copies and
//! the training loop's kernels). Where the runtime's symbols cannot be found, or a call fails,
//! the caller falls back to synchronizing the device, which is always correct.
//!
//! Also the copy streams of the device ring (`device_ring.rs`): a worker's own non-blocking
//! stream, its copies into device buffers, and the waits that order them with the default stream.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

type RawEvent = *mut c_void;

type SetDevice = unsafe extern "C" fn(c_int) -> c_int;
type Create = unsafe extern "C" fn(*mut RawEvent, u32) -> c_int;
type Record = unsafe extern "C" fn(RawEvent, *mut c_void) -> c_int;
type OnEvent = unsafe extern "C" fn(RawEvent) -> c_int;
type RawStream = *mut c_void;
type StreamCreate = unsafe extern "C" fn(*mut RawStream, u32) -> c_int;
type StreamWait = unsafe extern "C" fn(RawStream, RawEvent, u32) -> c_int;
type OnStream = unsafe extern "C" fn(RawStream) -> c_int;
type MemcpyAsync =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, RawStream) -> c_int;

/// The runtime's stream functions (the device ring's; None where any is missing).
struct Streams {
    create: StreamCreate,
    wait: StreamWait,
    synchronize: OnStream,
    destroy: OnStream,
    memcpy: MemcpyAsync,
}

/// `cudaStreamNonBlocking`: no implicit synchronization with the legacy default stream.
const NON_BLOCKING: u32 = 0x01;

/// `cudaMemcpyHostToDevice`.
const HOST_TO_DEVICE: c_int = 1;

struct Runtime {
    set_device: SetDevice,
    create: Create,
    record: Record,
    synchronize: OnEvent,
    query: OnEvent,
    destroy: OnEvent,
    attributes: Option<Attributes>,
    streams: Option<Streams>,
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
                        streams: match (
                            sym(c"cudaStreamCreateWithFlags"),
                            sym(c"cudaStreamWaitEvent"),
                            sym(c"cudaStreamSynchronize"),
                            sym(c"cudaStreamDestroy"),
                            sym(c"cudaMemcpyAsync"),
                        ) {
                            (Some(c), Some(w), Some(s), Some(d), Some(m)) => Some(Streams {
                                create: std::mem::transmute::<*mut c_void, StreamCreate>(c),
                                wait: std::mem::transmute::<*mut c_void, StreamWait>(w),
                                synchronize: std::mem::transmute::<*mut c_void, OnStream>(s),
                                destroy: std::mem::transmute::<*mut c_void, OnStream>(d),
                                memcpy: std::mem::transmute::<*mut c_void, MemcpyAsync>(m),
                            }),
                            _ => None,
                        },
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

    /// Records the event on `stream`, after what was issued on it. False if the runtime refused.
    pub(crate) fn record_on(&self, stream: &CopyStream) -> bool {
        // SAFETY: a live event and a live stream of this device.
        unsafe {
            (self.rt.set_device)(self.device) == 0 && (self.rt.record)(self.event, stream.raw) == 0
        }
    }

    /// Makes the device's default stream (the training loop's) wait for the work recorded
    /// before the event, without blocking this thread. False if the runtime refused.
    pub(crate) fn wait_on_default(&self) -> bool {
        let Some(s) = &self.rt.streams else {
            return false;
        };
        // SAFETY: a live event; the null stream is the legacy default stream.
        unsafe {
            (self.rt.set_device)(self.device) == 0
                && (s.wait)(std::ptr::null_mut(), self.event, 0) == 0
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

/// Issues a host-to-device copy of `bytes` bytes on device `device`'s default stream (the
/// training loop's, where it is ordered with libtorch's work). False where the runtime refused
/// or is not loaded (the caller then copies through libtorch).
///
/// # Safety
/// `src` is pinned host memory and `dst` device memory of that device, each valid for `bytes`
/// bytes until the copy completes (in stream order).
pub(crate) unsafe fn copy_on_default(
    device: usize,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> bool {
    let (Some(rt), Ok(device)) = (runtime(), c_int::try_from(device)) else {
        return false;
    };
    let Some(s) = &rt.streams else {
        return false;
    };
    // SAFETY: the caller's contract; the null stream is the legacy default stream.
    unsafe { copy_h2d(rt, s, device, (dst, src, bytes), std::ptr::null_mut()) }
}

/// `cudaMemcpyAsync` host to device on `stream` of `device`.
///
/// # Safety
/// As [`copy_on_default`], on `stream` (a live stream of `device`, or null).
unsafe fn copy_h2d(
    rt: &Runtime,
    s: &Streams,
    device: c_int,
    (dst, src, bytes): (*mut c_void, *const c_void, usize),
    stream: RawStream,
) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        (rt.set_device)(device) == 0 && (s.memcpy)(dst, src, bytes, HOST_TO_DEVICE, stream) == 0
    }
}

/// The device ring's own CUDA stream (non-blocking: it does not wait for the default stream's
/// work, nor the default stream for it), which the ring's copies and expansions go on.
pub(crate) struct CopyStream {
    raw: RawStream,
    device: c_int,
    rt: &'static Runtime,
    streams: &'static Streams,
}

// SAFETY: a CUDA stream may be used from any thread; each is owned by one ring.
unsafe impl Send for CopyStream {}

impl CopyStream {
    /// A new stream on CUDA device `device`, or None where the runtime is not available.
    pub(crate) fn new(device: usize) -> Option<Self> {
        let rt = runtime()?;
        let streams = rt.streams.as_ref()?;
        let device = c_int::try_from(device).ok()?;
        let mut raw: RawStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer, on the loader's device.
        let ok = unsafe {
            (rt.set_device)(device) == 0 && (streams.create)(&mut raw, NON_BLOCKING) == 0
        };
        (ok && !raw.is_null()).then_some(Self {
            raw,
            device,
            rt,
            streams,
        })
    }

    /// The stream, for a kernel launch on it.
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }

    /// Makes this stream wait for the work recorded before `event`. False if refused.
    pub(crate) fn wait(&self, event: &CopyDone) -> bool {
        // SAFETY: a live stream and event.
        unsafe { (self.streams.wait)(self.raw, event.event, 0) == 0 }
    }

    /// Issues a host-to-device copy of `bytes` bytes on this stream. False if refused.
    ///
    /// # Safety
    /// `src` is pinned host memory and `dst` device memory of this device, each valid for
    /// `bytes` bytes until the copy completes (an event recorded after it says when).
    pub(crate) unsafe fn copy_to_device(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
    ) -> bool {
        // SAFETY: the caller's contract, on this live stream of its device.
        unsafe {
            copy_h2d(
                self.rt,
                self.streams,
                self.device,
                (dst, src, bytes),
                self.raw,
            )
        }
    }

    /// Blocks until everything issued on this stream finished. False if refused.
    pub(crate) fn synchronize(&self) -> bool {
        // SAFETY: a live stream.
        unsafe { (self.streams.synchronize)(self.raw) == 0 }
    }
}

impl Drop for CopyStream {
    fn drop(&mut self) {
        // SAFETY: a live stream, destroyed once; work still pending on it completes first.
        unsafe {
            (self.streams.destroy)(self.raw);
        }
    }
}
