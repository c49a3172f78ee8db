//! The resident mode's fused gather (`resident_gather.cu`): one kernel per batch writes every
//! column and the six flag planes (on a GPU into one packed buffer, on the CPU into one buffer
//! each).
//!
//! - On the CPU, the build's C++ copy of the kernel (`resident_host.cc`) runs it, so the CPU
//!   tests check the kernel's arithmetic against the streaming loader.
//! - On a GPU, NVRTC compiles the same source at run time for the device's architecture, and the
//!   CUDA driver API launches it on the legacy default stream (where libtorch's own work of this
//!   thread runs). Both libraries are opened with `dlopen` only then, so CPU builds and CPU runs
//!   never touch CUDA. The compiled kernel is loaded once per device and process, and shared
//!   by every resident loader on that device. NVRTC is looked for by name (`LD_LIBRARY_PATH`), then where PyTorch's
//!   wheels put it beside libtorch (`nvidia/cu13/lib`, `nvidia/cuda_nvrtc/lib`), or at
//!   `TRAJSTORE_NVRTC`.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tch::Device;

use crate::error::{Error, Result};

/// The kernels' source, compiled by NVRTC on a GPU as one program (and by the build for the
/// CPU): the resident gather and the frame decoder (`frame_decode.cu`).
const SOURCE: &str = concat!(
    include_str!("resident_gather.cu"),
    "\n",
    include_str!("frame_decode.cu"),
    "\n",
    include_str!("expand.cu")
);
const NAME: &CStr = c"trajstore_resident_gather";
const EXPAND_NAME: &CStr = c"trajstore_expand_compact";
const DECODE_NAME: &CStr = c"trajstore_decode_frames";
const DECODE_WARP_NAME: &CStr = c"trajstore_decode_frames_warp";
/// Threads per block of the frame decoder: one frame per thread, or four warps of a frame each.
const DECODE_BLOCK: u32 = 64;
const DECODE_WARP_BLOCK: u32 = 128;
/// Threads per block on a GPU: the resident gather's block copies a slice's words side by side;
/// the expansion's eight warps take a row each.
const BLOCK: u32 = 256;
const ROWS_PER_BLOCK: u64 = BLOCK as u64 / 32;

unsafe extern "C" {
    fn trajstore_resident_gather_host(
        params: *const i64,
        cols: *const i64,
        ncols: c_int,
        b: c_int,
        l: c_int,
        out: *mut u8,
        flags_offset: i64,
        first_row: i64,
        end_row: i64,
        params_out: *mut i64,
    );
    fn trajstore_expand_compact_host(args: *const ExpandArgs, first: i64, end: i64);
}

/// Derived columns one expansion writes at most (`TRAJSTORE_EXPAND_TAILS`).
pub(crate) const EXPAND_TAILS: usize = 4;

/// One derived column of [`ExpandArgs`] (`TrajstoreExpandTail` in `expand.cu`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ExpandTail {
    /// `[B, rows, row]` observation.
    pub obs: u64,
    /// `[B, row]` tail rows.
    pub tail: u64,
    /// `[B, rows, row]` output.
    pub out: u64,
    pub rows: i64,
    /// Bytes of one row.
    pub row: i64,
    pub lead: i64,
}

/// The arguments of the compact batch's expansion (`TrajstoreExpand` in `expand.cu`), passed
/// by value; addresses on the kernel's side.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct ExpandArgs {
    /// `Int [B, 3]` spans.
    pub spans: u64,
    /// Six `[B, L]` bool planes.
    pub flags: u64,
    pub b: i64,
    pub l: i64,
    pub ntails: i64,
    pub tails: [ExpandTail; EXPAND_TAILS],
}

impl ExpandArgs {
    /// The expansion's work items: the `B * L` flag rows and every derived row.
    fn items(&self) -> u64 {
        let tails = &self.tails[..self.ntails as usize];
        (self.b * self.l + tails.iter().map(|t| self.b * t.rows).sum::<i64>()) as u64
    }
}

/// The device addresses of one launch of the frame decoder ([`CudaKernel::decode`]).
pub(crate) struct DecodeLaunch {
    pub comp: u64,
    pub table: u64,
    pub n: usize,
    pub codec: c_int,
    pub dict: u64,
    pub content: u64,
    pub out: u64,
    pub frame_len: usize,
    pub errors: u64,
    /// A warp a frame (`trajstore_decode_frames_warp`) rather than a thread.
    pub warp: bool,
}

/// Rows of a batch one CPU thread gathers at a time.
const HOST_CHUNK_ROWS: usize = 2048;

/// Where a batch's fused gather runs.
pub(crate) enum Kernel {
    /// The C++ copy, on this thread.
    Host,
    /// The NVRTC-compiled kernel on a CUDA device.
    Cuda(Arc<CudaKernel>),
}

/// The addresses a launch reads and writes: device addresses for [`Kernel::Cuda`], host ones
/// for [`Kernel::Host`].
#[derive(Clone, Copy)]
pub(crate) struct Launch {
    /// `[P_ROWS, B]` int64 parameters: on a GPU device memory, or pinned host memory the device
    /// maps ([`Kernel::mapped_address`]).
    pub params: u64,
    /// Where the kernel copies the parameters on the device (0: nowhere), for parameters read
    /// from host memory: the batch's ids and start steps are views of that copy.
    pub params_out: u64,
    /// `[ncols, 4]` int64 column table (see `resident_gather.cu`).
    pub cols: u64,
    pub ncols: usize,
    pub b: usize,
    pub l: usize,
    /// The packed output buffer on a GPU; 0 on the CPU, where the table's output offsets and
    /// `flags_offset` are addresses.
    pub out: u64,
    /// Where the six flag planes start, from `out`.
    pub flags_offset: usize,
}

impl Kernel {
    /// The kernel for `device`: the host copy on the CPU; on CUDA the source compiled by NVRTC
    /// (an error says what could not be loaded or compiled); an error for any other device.
    pub(crate) fn for_device(device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Self::Host),
            Device::Cuda(n) => Ok(Self::Cuda(CudaKernel::cached(n)?)),
            other => Err(cuda_error(format!("there is none for {other:?}"))),
        }
    }

    /// Runs the gather of one batch.
    ///
    /// # Safety
    /// Every address in `launch` is valid for the kernel's reads and writes on this kernel's
    /// side (device or host): `params` `[11, b]` int64, `cols` `[ncols, 4]` int64 whose source
    /// addresses hold every row the parameters name, and `out` large enough for every column's
    /// `[b, l, row]` bytes at its offset and the six `[b, l]` planes at `flags_offset`. On CUDA
    /// the buffers must stay allocated until the launch is done on the default stream.
    pub(crate) unsafe fn run(&self, launch: &Launch) -> Result<()> {
        let int = |v: usize, what: &str| {
            c_int::try_from(v).map_err(|_| {
                Error::argument(
                    what,
                    format!("{v} is beyond what the resident gather indexes"),
                )
            })
        };
        let (ncols, b, l) = (
            int(launch.ncols, "columns")?,
            int(launch.b, "num_slices")?,
            int(launch.l, "slice_len")?,
        );
        match self {
            Self::Host => {
                // Row ranges on rayon's threads: each writes only its rows' bytes.
                use rayon::prelude::*;
                let rows = launch.b * launch.l;
                let chunk = |c: usize| {
                    let first = c * HOST_CHUNK_ROWS;
                    let end = (first + HOST_CHUNK_ROWS).min(rows);
                    // SAFETY: the caller's contract; the host copy reads the parameters,
                    // the table and the sources, and writes rows first..end of `out`,
                    // which no other chunk writes.
                    unsafe {
                        trajstore_resident_gather_host(
                            launch.params as *const i64,
                            launch.cols as *const i64,
                            ncols,
                            b,
                            l,
                            launch.out as *mut u8,
                            launch.flags_offset as i64,
                            first as i64,
                            end as i64,
                            launch.params_out as *mut i64,
                        )
                    }
                };
                match rows.div_ceil(HOST_CHUNK_ROWS) {
                    // One chunk on this thread: no hand-over to the pool for a small batch.
                    0 | 1 => chunk(0),
                    n => (0..n).into_par_iter().for_each(chunk),
                }
                Ok(())
            }
            // SAFETY: the caller's contract.
            Self::Cuda(k) => unsafe { k.launch(launch, ncols, b, l) },
        }
    }

    /// The address at which this kernel reads the host memory at `host`: the same address on
    /// the CPU; on a GPU the device's mapping of that pinned memory (`cuMemHostGetDevicePointer`:
    /// every block `cudaHostAlloc` pins, as libtorch's pinned allocator does, is mapped under
    /// unified addressing). An error names the driver's reason where the memory is not mapped.
    pub(crate) fn mapped_address(&self, host: u64) -> Result<u64> {
        match self {
            Self::Host => Ok(host),
            Self::Cuda(k) => k.mapped_address(host),
        }
    }

    /// Expands one compact batch (`expand.cu`).
    ///
    /// # Safety
    /// Every address in `args` is valid on this kernel's side: `spans` `[b, 3]` int32, `flags`
    /// `6 * b * l` bytes, and per derived column `obs` and `out` `b * rows * row` bytes, `tail`
    /// `b * row`. On CUDA they must stay allocated until the launch is done on `stream` (null:
    /// the legacy default stream) and be ordered on it after what writes them.
    pub(crate) unsafe fn expand(&self, args: &ExpandArgs, stream: *mut c_void) -> Result<()> {
        if args.ntails < 0 || args.ntails as usize > EXPAND_TAILS {
            return Err(Error::argument(
                "columns",
                format!("at most {EXPAND_TAILS} derived columns expand in one kernel"),
            ));
        }
        let items = args.items();
        match self {
            // SAFETY: the caller's contract; one thread does every item in order.
            Self::Host => unsafe {
                trajstore_expand_compact_host(args, 0, items as i64);
                Ok(())
            },
            // SAFETY: the caller's contract.
            Self::Cuda(k) => unsafe { k.launch_expand(args, items, stream) },
        }
    }
}

/// A CUresult; 0 is success.
type CuResult = c_int;
type CuContext = *mut c_void;
type CuModule = *mut c_void;
type CuFunction = *mut c_void;

/// The driver functions the launch needs, resolved once from `libcuda.so.1`.
struct Driver {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    device_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, c_int) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut CuModule, *const c_void) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut CuFunction, CuModule, *const c_char) -> CuResult,
    #[allow(clippy::type_complexity)]
    mem_host_get_device_pointer: unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> CuResult,
    launch_kernel: unsafe extern "C" fn(
        CuFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

/// The NVRTC functions the compile needs.
struct Nvrtc {
    create: unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int,
    log: unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut *mut c_void) -> c_int,
}

fn cuda_error(what: impl std::fmt::Display) -> Error {
    Error::Torch(tch::TchError::Torch(format!(
        "trajstore CUDA kernels (resident gather, frame decoder): {what}"
    )))
}

/// Opens a shared library for the process's life (RTLD_GLOBAL, so that a library it opens by
/// name later, NVRTC's builtins, is found).
fn open(path: &str) -> Option<*mut c_void> {
    let c = CString::new(path).ok()?;
    // SAFETY: dlopen with a valid C string; the handle is never closed.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    (!h.is_null()).then_some(h)
}

/// Resolves `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the C signature of the symbol.
unsafe fn symbol<T: Copy>(lib: *mut c_void, name: &str) -> Result<T> {
    let c = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: `lib` is a live handle; dlsym with a valid C string.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    if p.is_null() {
        return Err(cuda_error(format!("the library has no `{name}`")));
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: the caller names the symbol's type; function pointers are pointer-sized.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Driver {
    fn load() -> Result<Self> {
        let lib = open("libcuda.so.1")
            .or_else(|| open("libcuda.so"))
            .ok_or_else(|| cuda_error("libcuda.so.1 (the CUDA driver) could not be opened"))?;
        // SAFETY: each type is the driver API's documented signature.
        unsafe {
            Ok(Self {
                init: symbol(lib, "cuInit")?,
                device_get: symbol(lib, "cuDeviceGet")?,
                device_attribute: symbol(lib, "cuDeviceGetAttribute")?,
                primary_ctx_retain: symbol(lib, "cuDevicePrimaryCtxRetain")?,
                ctx_set_current: symbol(lib, "cuCtxSetCurrent")?,
                module_load_data: symbol(lib, "cuModuleLoadData")?,
                module_get_function: symbol(lib, "cuModuleGetFunction")?,
                mem_host_get_device_pointer: symbol(lib, "cuMemHostGetDevicePointer_v2")?,
                launch_kernel: symbol(lib, "cuLaunchKernel")?,
                error_string: symbol(lib, "cuGetErrorString")?,
            })
        }
    }

    /// `r` as an error naming `what`, or Ok.
    fn check(&self, r: CuResult, what: &str) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
        let text = unsafe {
            (self.error_string)(r, &mut s);
            if s.is_null() {
                "unknown error".to_string()
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        Err(cuda_error(format!("{what} failed: {text} (CUresult {r})")))
    }
}

/// Candidate NVRTC libraries, in the order tried.
fn nvrtc_candidates() -> Vec<String> {
    let mut out: Vec<String> = std::env::var("TRAJSTORE_NVRTC").into_iter().collect();
    out.extend(["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"].map(String::from));
    if let Some(dir) = super::torch_lib_dir() {
        // PyTorch's wheels: torch/lib/../../nvidia/{cu13,cuda_nvrtc}/lib.
        let nvidia = dir.join("../../nvidia");
        for (sub, name) in [
            ("cu13/lib", "libnvrtc.so.13"),
            ("cuda_nvrtc/lib", "libnvrtc.so.12"),
        ] {
            out.push(nvidia.join(sub).join(name).to_string_lossy().into_owned());
        }
    }
    out
}

/// Opens NVRTC. Opened by a path, its builtins library in the same folder is opened first, so
/// that NVRTC finds it by name.
fn open_nvrtc() -> Result<*mut c_void> {
    let tried = nvrtc_candidates();
    for c in &tried {
        let path = Path::new(c);
        if path.is_absolute() {
            if !path.exists() {
                continue;
            }
            builtins_beside(path);
        }
        if let Some(h) = open(c) {
            return Ok(h);
        }
    }
    Err(cuda_error(format!(
        "NVRTC (libnvrtc, which PyTorch's CUDA wheels ship) could not be opened; tried {}; set \
         TRAJSTORE_NVRTC to its path",
        tried.join(", ")
    )))
}

fn builtins_beside(nvrtc: &Path) {
    let Some(dir) = nvrtc.parent() else { return };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt."))
        })
        .collect();
    found.sort();
    for p in found {
        open(&p.to_string_lossy());
    }
}

impl Nvrtc {
    fn load() -> Result<Self> {
        let lib = open_nvrtc()?;
        // SAFETY: each type is NVRTC's documented signature.
        unsafe {
            Ok(Self {
                create: symbol(lib, "nvrtcCreateProgram")?,
                compile: symbol(lib, "nvrtcCompileProgram")?,
                log_size: symbol(lib, "nvrtcGetProgramLogSize")?,
                log: symbol(lib, "nvrtcGetProgramLog")?,
                ptx_size: symbol(lib, "nvrtcGetPTXSize")?,
                ptx: symbol(lib, "nvrtcGetPTX")?,
                destroy: symbol(lib, "nvrtcDestroyProgram")?,
            })
        }
    }

    /// The kernel's PTX for virtual architecture `arch` (e.g. `compute_90`), or the compiler's
    /// log as the error.
    fn compile(&self, arch: &str) -> Result<CString> {
        let src = CString::new(SOURCE).expect("the kernel source has no NUL");
        let mut prog: *mut c_void = std::ptr::null_mut();
        let nvrtc = |r: c_int, what: &str| {
            if r == 0 {
                Ok(())
            } else {
                Err(cuda_error(format!("NVRTC {what} failed (nvrtcResult {r})")))
            }
        };
        // SAFETY: NVRTC's API with valid C strings and out-pointers; `prog` is destroyed below.
        unsafe {
            nvrtc(
                (self.create)(
                    &mut prog,
                    src.as_ptr(),
                    c"resident_gather.cu".as_ptr(),
                    0,
                    std::ptr::null(),
                    std::ptr::null(),
                ),
                "nvrtcCreateProgram",
            )?;
            let opt = CString::new(format!("--gpu-architecture={arch}")).expect("no NUL");
            let opts = [opt.as_ptr()];
            let r = (self.compile)(prog, 1, opts.as_ptr());
            let result = if r != 0 {
                let mut n = 0usize;
                (self.log_size)(prog, &mut n);
                let mut log = vec![0u8; n.max(1)];
                (self.log)(prog, log.as_mut_ptr().cast());
                let log = String::from_utf8_lossy(&log[..n.saturating_sub(1)]).into_owned();
                Err(cuda_error(format!(
                    "NVRTC could not compile it for {arch} (nvrtcResult {r}): {}",
                    log.trim()
                )))
            } else {
                let mut n = 0usize;
                let mut ptx = Vec::new();
                nvrtc((self.ptx_size)(prog, &mut n), "nvrtcGetPTXSize")
                    .and_then(|()| {
                        ptx.resize(n.max(1), 0u8);
                        nvrtc((self.ptx)(prog, ptx.as_mut_ptr().cast()), "nvrtcGetPTX")
                    })
                    .map(|()| {
                        ptx.truncate(ptx.iter().position(|&c| c == 0).unwrap_or(ptx.len()));
                        CString::new(ptx).expect("truncated at the first NUL")
                    })
            };
            (self.destroy)(&mut prog);
            result
        }
    }
}

/// The kernel loaded into device `ordinal`'s primary context (the one libtorch uses).
pub(crate) struct CudaKernel {
    driver: Driver,
    ctx: CuContext,
    function: CuFunction,
    /// The frame decoder, a thread (`trajstore_decode_frames`) or a warp a frame.
    decode: CuFunction,
    decode_warp: CuFunction,
    /// The compact batch's expansion (`trajstore_expand_compact`).
    expand: CuFunction,
}

// SAFETY: a CUcontext and a CUfunction are handles the driver lets any thread use, at once
// too (cuLaunchKernel is thread-safe); every use makes the context current on the calling
// thread first, and nothing in the struct changes after it is made.
unsafe impl Send for CudaKernel {}
// SAFETY: as above.
unsafe impl Sync for CudaKernel {}

impl CudaKernel {
    /// The kernel on device `ordinal`, compiled and loaded by the first resident loader there
    /// and kept for the process (a module per loader would be compiled again and never
    /// unloaded). A failure is not kept: the next loader tries again.
    pub(crate) fn cached(ordinal: usize) -> Result<Arc<Self>> {
        static LOADED: Mutex<Vec<(usize, Arc<CudaKernel>)>> = Mutex::new(Vec::new());
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, k)) = loaded.iter().find(|(n, _)| *n == ordinal) {
            return Ok(k.clone());
        }
        let k = Arc::new(Self::new(ordinal)?);
        loaded.push((ordinal, k.clone()));
        Ok(k)
    }

    fn new(ordinal: usize) -> Result<Self> {
        let driver = Driver::load()?;
        let nvrtc = Nvrtc::load()?;
        let ordinal = c_int::try_from(ordinal).map_err(|_| cuda_error("device ordinal"))?;
        let (mut dev, mut major, mut minor, mut ctx) = (0, 0, 0, std::ptr::null_mut());
        // SAFETY: the driver API with valid out-pointers; attributes 75 and 76 are the compute
        // capability's major and minor numbers.
        unsafe {
            driver.check((driver.init)(0), "cuInit")?;
            driver.check((driver.device_get)(&mut dev, ordinal), "cuDeviceGet")?;
            driver.check(
                (driver.device_attribute)(&mut major, 75, dev),
                "cuDeviceGetAttribute",
            )?;
            driver.check(
                (driver.device_attribute)(&mut minor, 76, dev),
                "cuDeviceGetAttribute",
            )?;
            driver.check(
                (driver.primary_ctx_retain)(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
        }
        // The device's own architecture; an NVRTC older than the device may not know it, and
        // then PTX for the oldest architecture CUDA 12 and 13 both compile for, which the
        // driver compiles on for the device.
        let ptx = nvrtc
            .compile(&format!("compute_{major}{minor}"))
            .or_else(|_| nvrtc.compile("compute_75"))?;
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        let (mut decode, mut decode_warp) = (std::ptr::null_mut(), std::ptr::null_mut());
        let mut expand = std::ptr::null_mut();
        // SAFETY: a current context, a NUL-terminated PTX image, and valid out-pointers.
        unsafe {
            driver.check((driver.ctx_set_current)(ctx), "cuCtxSetCurrent")?;
            driver.check(
                (driver.module_load_data)(&mut module, ptx.as_ptr().cast()),
                "cuModuleLoadData",
            )?;
            driver.check(
                (driver.module_get_function)(&mut function, module, NAME.as_ptr()),
                "cuModuleGetFunction",
            )?;
            driver.check(
                (driver.module_get_function)(&mut decode, module, DECODE_NAME.as_ptr()),
                "cuModuleGetFunction",
            )?;
            driver.check(
                (driver.module_get_function)(&mut decode_warp, module, DECODE_WARP_NAME.as_ptr()),
                "cuModuleGetFunction",
            )?;
            driver.check(
                (driver.module_get_function)(&mut expand, module, EXPAND_NAME.as_ptr()),
                "cuModuleGetFunction",
            )?;
        }
        Ok(Self {
            driver,
            ctx,
            function,
            decode,
            decode_warp,
            expand,
        })
    }

    /// Launches the frame decoder on the legacy default stream over `n` table rows.
    ///
    /// # Safety
    /// Device addresses: `comp` holds every stored frame the table names, `table` `[n, 3]`
    /// int64 (see `frame_decode.cu`), `dict` a prepared dictionary (or 0) and `content` its
    /// content, `out` every destination frame, `errors` one int; all stay allocated until the
    /// launch is done.
    pub(crate) unsafe fn decode(&self, l: &DecodeLaunch) -> Result<()> {
        if l.n == 0 {
            return Ok(());
        }
        let (function, block, per_block) = match l.warp {
            true => (self.decode_warp, DECODE_WARP_BLOCK, DECODE_WARP_BLOCK / 32),
            false => (self.decode, DECODE_BLOCK, DECODE_BLOCK),
        };
        let grid = (l.n as u64).div_ceil(per_block as u64).clamp(1, 1 << 20) as c_uint;
        let (mut comp, mut table, mut n) = (l.comp, l.table, l.n as i64);
        let (mut codec, mut dict, mut content) = (l.codec, l.dict, l.content);
        let (mut out, mut frame_len, mut errors) = (l.out, l.frame_len as i64, l.errors);
        let mut args: [*mut c_void; 9] = [
            (&mut comp as *mut u64).cast(),
            (&mut table as *mut u64).cast(),
            (&mut n as *mut i64).cast(),
            (&mut codec as *mut c_int).cast(),
            (&mut dict as *mut u64).cast(),
            (&mut content as *mut u64).cast(),
            (&mut out as *mut u64).cast(),
            (&mut frame_len as *mut i64).cast(),
            (&mut errors as *mut u64).cast(),
        ];
        // SAFETY: the kernel's arguments in its parameter order and types (pointers as 64-bit
        // addresses), on the legacy default stream.
        unsafe {
            self.launch_grid(
                function,
                ((grid, 1), block),
                &mut args,
                std::ptr::null_mut(),
                "cuLaunchKernel (frame decoder)",
            )
        }
    }

    /// Launches the expansion of `items` work items (a warp each) on `stream`.
    ///
    /// # Safety
    /// As [`Kernel::expand`].
    unsafe fn launch_expand(
        &self,
        args: &ExpandArgs,
        items: u64,
        stream: *mut c_void,
    ) -> Result<()> {
        let grid = items.div_ceil(ROWS_PER_BLOCK).clamp(1, 1 << 20) as c_uint;
        let (mut a, mut first, mut end) = (*args, 0i64, items as i64);
        let mut params: [*mut c_void; 3] = [
            (&mut a as *mut ExpandArgs).cast(),
            (&mut first as *mut i64).cast(),
            (&mut end as *mut i64).cast(),
        ];
        // SAFETY: the kernel's arguments in its order and types (the struct by value, laid out
        // as `expand.cu`'s), on the caller's stream.
        unsafe {
            self.launch_grid(
                self.expand,
                ((grid, 1), BLOCK),
                &mut params,
                stream,
                "cuLaunchKernel (expand)",
            )
        }
    }

    /// Launches `function` on a grid of `grid.0` blocks (x, y) of `grid.1` threads on `stream` (null: the legacy default stream, where libtorch's work of this thread runs),
    /// after making the device's primary context current.
    ///
    /// # Safety
    /// `args` are pointers to the kernel's arguments, in its parameter order and of its types;
    /// every address they hold is valid for what the kernel reads and writes.
    unsafe fn launch_grid(
        &self,
        function: CuFunction,
        (grid, block): ((c_uint, c_uint), u32),
        args: &mut [*mut c_void],
        stream: *mut c_void,
        what: &str,
    ) -> Result<()> {
        // SAFETY: the caller's contract (a stream of this device, or null).
        unsafe {
            self.driver
                .check((self.driver.ctx_set_current)(self.ctx), "cuCtxSetCurrent")?;
            self.driver.check(
                (self.driver.launch_kernel)(
                    function,
                    grid.0,
                    grid.1,
                    1,
                    block,
                    1,
                    1,
                    0,
                    stream,
                    args.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
                what,
            )
        }
    }

    /// The device's address of the pinned host memory at `host` ([`Kernel::mapped_address`]).
    fn mapped_address(&self, host: u64) -> Result<u64> {
        let mut device = 0u64;
        // SAFETY: the driver API with this kernel's context and an out-pointer; the driver only
        // looks the address up.
        unsafe {
            self.driver
                .check((self.driver.ctx_set_current)(self.ctx), "cuCtxSetCurrent")?;
            self.driver.check(
                (self.driver.mem_host_get_device_pointer)(&mut device, host as *mut c_void, 0),
                "cuMemHostGetDevicePointer (the parameters' pinned buffer, read in place)",
            )?;
        }
        Ok(device)
    }

    /// # Safety
    /// As [`Kernel::run`].
    unsafe fn launch(&self, l: &Launch, ncols: c_int, b: c_int, len: c_int) -> Result<()> {
        let rows = (l.b as u64) * (l.l as u64);
        // A block a slice (x) and column, the flag planes last (y).
        // (The kernel strides over both, so a grid smaller than the batch is still whole.)
        let grid = (
            (l.b as u64).clamp(1, 1 << 20) as c_uint,
            (ncols as c_uint + 1).min(65_535),
        );
        let (mut params, mut cols, mut out) = (l.params, l.cols, l.out);
        let mut params_out = l.params_out;
        let (mut ncols, mut b, mut len) = (ncols, b, len);
        let mut flags = l.flags_offset as i64;
        let (mut first, mut end) = (0i64, rows as i64);
        let mut args: [*mut c_void; 10] = [
            (&mut params as *mut u64).cast(),
            (&mut cols as *mut u64).cast(),
            (&mut ncols as *mut c_int).cast(),
            (&mut b as *mut c_int).cast(),
            (&mut len as *mut c_int).cast(),
            (&mut out as *mut u64).cast(),
            (&mut flags as *mut i64).cast(),
            (&mut first as *mut i64).cast(),
            (&mut end as *mut i64).cast(),
            (&mut params_out as *mut u64).cast(),
        ];
        // SAFETY: the kernel's arguments in its parameter order and types (pointers as 64-bit
        // addresses); the null stream is the legacy default stream libtorch's work is on.
        unsafe {
            self.launch_grid(
                self.function,
                (grid, BLOCK),
                &mut args,
                std::ptr::null_mut(),
                "cuLaunchKernel",
            )
        }
    }
}

/// Compiles the kernels for `arch` with NVRTC alone (no device needed) and returns their PTX:
/// what the CPU tests use to check that the CUDA half of the source compiles; Ok(None) where
/// NVRTC is not installed.
#[doc(hidden)]
pub fn compile_for(arch: &str) -> Result<Option<String>> {
    let nvrtc = match Nvrtc::load() {
        Ok(n) => n,
        Err(_) => return Ok(None),
    };
    Ok(Some(nvrtc.compile(arch)?.to_string_lossy().into_owned()))
}

#[cfg(test)]
mod tests {
    //! The resident gather kernel (resident_gather.cu, as compiled for the CPU) against a reference
    //! written position by position: every column width (4-byte words and bytes), the derived next
    //! observation with the episode's last step before, inside and after the valid positions, empty
    //! and reversed valid ranges, and calls that cover part of a slice (the CPU's row ranges). The
    //! same kernel also runs with a GPU's launch geometry (grid_sim.cc: blocks per slice and column,
    //! threads striding a run, grids smaller than the work), so that the CUDA half's indexing is
    //! checked without a GPU.

    use super::trajstore_resident_gather_host;

    unsafe extern "C" {
        /// grid_sim.cc: the kernel with a GPU's launch geometry, every block and thread in turn.
        fn trajstore_resident_gather_grid(
            grid_x: u32,
            grid_y: u32,
            block: u32,
            params: *const i64,
            cols: *const i64,
            ncols: i32,
            b: i32,
            l: i32,
            out: *mut u8,
            flags_offset: i64,
            params_out: *mut i64,
        );
    }

    /// How a test runs the kernel: the CPU's row ranges (ending anywhere, inside a slice or at its
    /// end), or a grid of (x, y) blocks of so many threads.
    #[derive(Clone, Copy, Debug)]
    enum Run {
        Ranges,
        Grid(u32, u32, u32),
    }

    /// The kernel's parameter rows (resident.rs's `P_*`): row0, lo, hi, first, last step, final
    /// row, terminated, truncated, id, start step, slice end.
    const P: usize = 11;

    struct Column {
        /// Source rows, row 0 zeros; `skew` bytes in front so that the base may be unaligned.
        src: Vec<u8>,
        skew: usize,
        w: usize,
        derived: bool,
    }

    fn next(state: &mut u64) -> u64 {
        // splitmix64
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn between(state: &mut u64, lo: i64, hi: i64) -> i64 {
        lo + (next(state) % (hi - lo + 1) as u64) as i64
    }

    /// What the kernel must write, position by position.
    fn reference(params: &[i64], cols: &[Column], b: usize, l: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
        let p = |r: usize, s: usize| params[r * b + s];
        let outs = cols
            .iter()
            .map(|c| {
                let mut out = vec![0u8; b * l * c.w];
                for s in 0..b {
                    for j in 0..l as i64 {
                        let valid = j >= p(1, s) && j < p(2, s);
                        let row = match (valid, c.derived) {
                            (false, _) => 0,
                            (true, false) => p(0, s) + j,
                            (true, true) if j < p(4, s) => p(0, s) + j + 1,
                            (true, true) => p(5, s),
                        } as usize;
                        let at = (s * l + j as usize) * c.w;
                        let from = c.skew + row * c.w;
                        out[at..at + c.w].copy_from_slice(&c.src[from..from + c.w]);
                    }
                }
                out
            })
            .collect();
        let n = b * l;
        let mut flags = vec![0u8; 6 * n];
        for s in 0..b {
            for j in 0..l as i64 {
                let i = s * l + j as usize;
                let last = j == p(4, s);
                flags[i] = (j >= p(1, s) && j < p(2, s)) as u8;
                flags[n + i] = (j == p(3, s)) as u8;
                flags[2 * n + i] = last as u8;
                flags[3 * n + i] = (last && p(6, s) != 0) as u8;
                flags[4 * n + i] = (last && p(7, s) != 0) as u8;
                flags[5 * n + i] = (j == p(10, s)) as u8;
            }
        }
        (outs, flags)
    }

    #[test]
    fn the_kernel_writes_what_a_position_by_position_reference_writes() {
        let mut rng = 7u64;
        let rows = 400usize;
        for round in 0..60 {
            let b = between(&mut rng, 1, 9) as usize;
            let l = between(&mut rng, 1, 20) as usize;
            // Widths: words (20, 8, 4), bytes (3, 1), a word width whose base is unaligned.
            let cols: Vec<Column> = [(20, 0, false), (8, 0, true), (20, 0, true), (3, 0, false)]
                .into_iter()
                .chain([(3, 0, true), (4, 1, true), (1, 0, false), (4, 0, false)])
                .map(|(w, skew, derived)| {
                    let mut src = vec![0u8; skew + rows * w];
                    for v in &mut src[skew + w..] {
                        *v = 1 + (next(&mut rng) % 255) as u8;
                    }
                    Column {
                        src,
                        skew,
                        w,
                        derived,
                    }
                })
                .collect();
            let mut params = vec![0i64; P * b];
            for s in 0..b {
                let li = l as i64;
                let row0 = between(&mut rng, 1, rows as i64 - li - 2);
                let (lo, hi) = (between(&mut rng, 0, li), between(&mut rng, 0, li));
                // Mostly a valid run, sometimes none or reversed.
                let (lo, hi) = if round % 5 == 0 {
                    (hi, lo)
                } else {
                    (lo.min(hi), lo.max(hi))
                };
                let values = [
                    row0,
                    lo,
                    hi,
                    between(&mut rng, -2, li + 1),
                    between(&mut rng, -2, li + 2),
                    between(&mut rng, 1, rows as i64 - 1),
                    between(&mut rng, 0, 1),
                    between(&mut rng, 0, 1),
                    between(&mut rng, 0, 1000),
                    between(&mut rng, 0, 1000),
                    between(&mut rng, -1, li),
                ];
                for (r, v) in values.into_iter().enumerate() {
                    params[r * b + s] = v;
                }
            }
            let (want, want_flags) = reference(&params, &cols, b, l);
            let n = b * l;
            let nc = cols.len() as u32;
            // Ranges as the CPU runs them; the launch NVRTC's kernel gets (a block a slice and
            // column, the flags last: kernel.rs); fewer blocks and threads than the work, which the
            // grid-stride loops must cover; a block wider than a run.
            let grids = [
                Run::Ranges,
                Run::Grid(b as u32, nc + 1, 256),
                Run::Grid(1, 1, 1),
                Run::Grid(2, 3, 5),
                Run::Grid(b as u32, nc + 1, 3),
            ];
            for how in grids {
                let mut outs: Vec<Vec<u8>> = cols.iter().map(|c| vec![0xAAu8; n * c.w]).collect();
                let mut flags = vec![0xAAu8; 6 * n];
                let mut params_out = vec![-1i64; P * b];
                let table: Vec<i64> = cols
                    .iter()
                    .zip(&mut outs)
                    .flat_map(|(c, o)| {
                        let src = c.src[c.skew..].as_ptr() as i64;
                        [src, c.w as i64, c.derived as i64, o.as_mut_ptr() as i64]
                    })
                    .collect();
                // Both calls: `params` is [11, b], `table` names `cols.len()` columns whose sources
                // hold every row the parameters name and whose outputs hold [b, l] rows; `flags`
                // holds the six planes; `params_out` is [11, b]. All outlive the calls.
                match how {
                    Run::Ranges => {
                        let mut first = 0usize;
                        while first < n {
                            let end = (first + between(&mut rng, 1, 2 * l as i64) as usize).min(n);
                            // SAFETY: as above, rows first..end.
                            unsafe {
                                trajstore_resident_gather_host(
                                    params.as_ptr(),
                                    table.as_ptr(),
                                    cols.len() as _,
                                    b as _,
                                    l as _,
                                    std::ptr::null_mut(),
                                    flags.as_mut_ptr() as i64,
                                    first as i64,
                                    end as i64,
                                    params_out.as_mut_ptr(),
                                )
                            };
                            first = end;
                        }
                    }
                    // SAFETY: as above, every row.
                    Run::Grid(x, y, threads) => unsafe {
                        trajstore_resident_gather_grid(
                            x,
                            y,
                            threads,
                            params.as_ptr(),
                            table.as_ptr(),
                            cols.len() as _,
                            b as _,
                            l as _,
                            std::ptr::null_mut(),
                            flags.as_mut_ptr() as i64,
                            params_out.as_mut_ptr(),
                        )
                    },
                }
                for (c, (got, want)) in cols.iter().zip(outs.iter().zip(&want)) {
                    assert!(
                        got == want,
                        "round {round}, {how:?}: column of {} B (derived {}, skew {}), b {b} l {l}, \
                     params {params:?}",
                        c.w,
                        c.derived,
                        c.skew
                    );
                }
                assert_eq!(flags, want_flags, "round {round}, {how:?}: flags");
                // The parameters' copy, written by the call that gathers each slice's step 0.
                assert_eq!(
                    params_out, params,
                    "round {round}, {how:?}: the parameters' copy"
                );
            }
        }
    }
}
