//! GPU loading through tch (feature `torch`): gathered batches as `tch::Tensor`s on a target
//! device, with pinned staging and non-blocking host-to-device copies on CUDA, zero extra copies
//! and no CUDA call at all on CPU, and a GPU-resident mode that uploads the columns once and
//! samples on the device.
//!
//! ```no_run
//! use trajstore::torch::{TorchLoader, TorchLoaderOptions, parse_device};
//! use trajstore::{BatchSource, LoaderSpec, SamplerSpec};
//!
//! # fn main() -> trajstore::Result<()> {
//! let snap = trajstore::open("demo.trajstore")?;
//! let spec = LoaderSpec::single(snap, SamplerSpec::uniform(64, 256), &["observation", "action", "reward"]);
//! let source = BatchSource::open(spec)?;
//! let opts = TorchLoaderOptions::new(parse_device("cuda")?);
//! let mut loader = TorchLoader::new(&source, opts)?;
//! let batch = loader.next_batch().expect("endless sampler")?;
//! let obs = batch.get("observation").unwrap(); // [256, 64, 17] f32 on cuda:0
//! # Ok(()) }
//! ```

mod compact;
mod device_ring;
mod events;
mod frame_decode;
mod handover;
mod kernel;
mod layout;
mod loader;
mod options;
mod resident;
mod resident_ring;
mod streaming;
mod times;

use arrow::datatypes::DataType;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

pub use device_ring::DeviceRingStats;
#[doc(hidden)]
pub use kernel::compile_for as compile_resident_kernel;
pub use loader::TorchLoader;
pub use options::{TorchLoaderOptions, Transform};
pub use resident::resident_bytes;
pub use times::WorkerTimesTotal;

/// Parses `cpu`, `cuda` (device 0) or `cuda:N`. A CUDA device is checked against libtorch
/// ([`cuda_available`], [`cuda_device_count`]); `cpu` makes no CUDA call at all.
pub fn parse_device(s: &str) -> Result<Device> {
    let t = s.trim().to_ascii_lowercase();
    let device = match t.as_str() {
        "cpu" => return Ok(Device::Cpu),
        "cuda" | "gpu" => Device::Cuda(0),
        _ => match t.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(n)) => Device::Cuda(n),
            _ => {
                return Err(Error::argument(
                    "device",
                    format!("`{s}`: use cpu, cuda or cuda:N"),
                ));
            }
        },
    };
    check_device(device)?;
    Ok(device)
}

/// Loads libtorch's CUDA half (`libtorch_cuda.so`) on first use, once per process, and says
/// whether it is loaded. The binaries do not link it at start: a CPU run then never loads the
/// CUDA libraries, and with them the driver (`libcublasLt` opens `libcuda` as it loads), which a
/// GPU check looks for. Looked up by name (the rpath the build records, `LD_LIBRARY_PATH`), then
/// beside the `libtorch_cpu.so` this process runs. Call it (or [`cuda_available`],
/// [`parse_device`]) before other libtorch work in a program that uses CUDA: libtorch decides
/// whether it has CUDA the first time something asks.
pub fn load_cuda() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        let open = |path: &str| {
            let Ok(c) = std::ffi::CString::new(path) else {
                return false;
            };
            // SAFETY: dlopen with a valid C string; the handle is kept for the process's life
            // (libtorch_cuda registers itself with libtorch as it loads and is never unloaded).
            !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null()
        };
        if open("libtorch_cuda.so") {
            return true;
        }
        torch_lib_dir().is_some_and(|dir| open(&dir.join("libtorch_cuda.so").to_string_lossy()))
    })
}

/// The folder of the `libtorch_cpu.so` this process runs (PyTorch's `torch/lib` when libtorch
/// comes from its wheel).
pub(crate) fn torch_lib_dir() -> Option<std::path::PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| std::path::Path::new(p).parent())
        .map(|d| d.to_path_buf())
}

/// Whether libtorch sees a CUDA device (loading its CUDA half first, [`load_cuda`]).
pub fn cuda_available() -> bool {
    load_cuda() && tch::Cuda::is_available()
}

/// CUDA devices libtorch sees (0 where it has no CUDA).
pub fn cuda_device_count() -> i64 {
    if load_cuda() {
        tch::Cuda::device_count()
    } else {
        0
    }
}

/// Errors unless `device` can be used: CUDA must be available and the index in range. Makes no
/// CUDA call for [`Device::Cpu`].
pub fn check_device(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(n) => {
            if !cuda_available() {
                return Err(Error::argument(
                    "device",
                    format!(
                        "cuda:{n} requested, but libtorch sees no CUDA device (no GPU or driver, \
                         or a libtorch without CUDA); use --device cpu"
                    ),
                ));
            }
            let count = cuda_device_count();
            if n as i64 >= count {
                return Err(Error::argument(
                    "device",
                    format!("cuda:{n} requested, but this machine has {count} CUDA device(s)"),
                ));
            }
            Ok(())
        }
        other => Err(Error::argument(
            "device",
            format!("{other:?} is not supported: use cpu or cuda"),
        )),
    }
}

/// The torch dtype a column of Arrow element type `dt` is handed out as: the same type (integer
/// actions stay integer; booleans are one byte per value), except that unsigned 16- and 32-bit
/// integers (which tch 0.24 has no kind for) are widened, exactly, to `int32` and `int64`, and
/// `uint64` (episode ids) is `int64` (exact below 2^63).
pub fn kind_of(dt: &DataType) -> Result<Kind> {
    Ok(match dt {
        DataType::UInt16 => Kind::Int,
        DataType::UInt32 | DataType::UInt64 => Kind::Int64,
        other => storage_kind(other)?,
    })
}

/// Widens a tensor gathered with [`storage_kind`] (same bytes) to [`kind_of`]: unsigned values
/// that a signed reading of their bits would make negative come out right.
pub(crate) fn widen(t: Tensor, dt: &DataType) -> Result<Tensor> {
    Ok(match dt {
        DataType::UInt16 => t.f_to_kind(Kind::Int)?.f_bitwise_and(0xFFFF)?,
        DataType::UInt32 => t.f_to_kind(Kind::Int64)?.f_bitwise_and(0xFFFF_FFFF_i64)?,
        _ => t,
    })
}

/// The kind of the same width a column is gathered into (its bytes as stored).
pub(crate) fn storage_kind(dt: &DataType) -> Result<Kind> {
    Ok(match dt {
        DataType::Float32 => Kind::Float,
        DataType::Float64 => Kind::Double,
        DataType::Float16 => Kind::Half,
        DataType::Int8 => Kind::Int8,
        DataType::Int16 => Kind::Int16,
        DataType::Int32 => Kind::Int,
        DataType::Int64 => Kind::Int64,
        DataType::UInt8 => Kind::Uint8,
        DataType::UInt16 => Kind::Int16,
        DataType::UInt32 => Kind::Int,
        DataType::UInt64 => Kind::Int64,
        DataType::Boolean => Kind::Bool,
        other => {
            return Err(Error::argument(
                "dt",
                format!("columns of type {other} have no torch dtype; leave the column out"),
            ));
        }
    })
}

/// A floating-point cast applied on the device (halves device memory and transfer-side compute
/// for bf16/f16 training; integer columns are never cast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FloatCast {
    /// Keep every column's stored dtype.
    #[default]
    None,
    /// Cast floating columns to bfloat16.
    BFloat16,
    /// Cast floating columns to float16.
    Half,
}

impl FloatCast {
    /// The kind a column of `kind` ends up as.
    pub fn apply(self, kind: Kind) -> Kind {
        let floating = matches!(
            kind,
            Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16
        );
        match self {
            FloatCast::BFloat16 if floating => Kind::BFloat16,
            FloatCast::Half if floating => Kind::Half,
            _ => kind,
        }
    }
}

impl std::fmt::Display for FloatCast {
    /// The form [`FloatCast::from_str`](std::str::FromStr) reads: `none`, `bf16`, `f16`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FloatCast::None => "none",
            FloatCast::BFloat16 => "bf16",
            FloatCast::Half => "f16",
        })
    }
}

impl std::str::FromStr for FloatCast {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "none" | "" => Ok(FloatCast::None),
            "bf16" | "bfloat16" => Ok(FloatCast::BFloat16),
            "f16" | "fp16" | "half" | "float16" => Ok(FloatCast::Half),
            other => Err(Error::argument(
                "cast",
                format!("`{other}`: use none, bf16 or f16"),
            )),
        }
    }
}

/// Names of the six per-step flag planes, in [`crate::GatherInto::flags`] order.
pub const FLAG_NAMES: [&str; 6] = [
    "mask",
    "is_first",
    "is_last",
    "terminated",
    "truncated",
    "slice_end",
];

/// One batch as tensors: every requested column `[B, L, ...]` in its stored dtype (or the
/// requested float cast), the per-step flags as `Bool [B, L]` and per-slice `Int64 [B]`
/// metadata, all on the loader's device.
#[derive(Debug)]
pub struct TensorBatch {
    /// Where the batch lies in a worker's device ring: the event recorded after its copy (and
    /// expansion) on the worker's stream. [`TorchLoader::next_batch`] makes the default stream
    /// wait on it. Declared first so that it is dropped first: its last holder waits for the
    /// copy before the tensors' memory can go back to the allocator.
    pub(crate) ready: Option<std::sync::Arc<device_ring::Ready>>,
    /// The gathered columns in request order.
    pub columns: Vec<(String, Tensor)>,
    /// `Bool [B, L]`: true where the step holds data, false where it is padding.
    pub mask: Tensor,
    /// `Bool [B, L]`: step 0 of an episode.
    pub is_first: Tensor,
    /// `Bool [B, L]`: last step of an episode.
    pub is_last: Tensor,
    /// `Bool [B, L]`: last step of an episode that ended in a terminal state.
    pub terminated: Tensor,
    /// `Bool [B, L]`: last step of an episode that was cut.
    pub truncated: Tensor,
    /// `Bool [B, L]`: last valid step of each slice.
    pub slice_end: Tensor,
    /// `Int64 [B]`: episode id of each slice.
    pub episode_id: Tensor,
    /// `Int64 [B]`: first step of each slice (negative where a span overhangs the start).
    pub start_step: Tensor,
    /// The `[6, B, L]` tensor the flags are views of, and the `[2, B]` one of the metadata, when
    /// the batch was gathered into a reusable host slot.
    pub(crate) flag_base: Option<Tensor>,
    pub(crate) meta_base: Option<Tensor>,
    /// The slot's column tensors (what the columns are, or were before a widening or a
    /// transform).
    pub(crate) base_columns: Vec<Tensor>,
}

impl TensorBatch {
    /// A batch of `columns`, the six flag planes `plane(0..6)` in [`FLAG_NAMES`] order, and the
    /// per-slice ids and start steps, holding no host slot.
    pub(crate) fn of_planes(
        columns: Vec<(String, Tensor)>,
        plane: impl Fn(i64) -> Result<Tensor>,
        episode_id: Tensor,
        start_step: Tensor,
    ) -> Result<Self> {
        Ok(Self {
            ready: None,
            columns,
            mask: plane(0)?,
            is_first: plane(1)?,
            is_last: plane(2)?,
            terminated: plane(3)?,
            truncated: plane(4)?,
            slice_end: plane(5)?,
            episode_id,
            start_step,
            flag_base: None,
            meta_base: None,
            base_columns: Vec::new(),
        })
    }

    /// The column `name`, or one of the flags (`mask`, `is_first`, ...) or `episode_id` /
    /// `start_step` when no gathered column has that name.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        if let Some((_, t)) = self.columns.iter().find(|(n, _)| n == name) {
            return Some(t);
        }
        Some(match name {
            "mask" => &self.mask,
            "is_first" => &self.is_first,
            "is_last" => &self.is_last,
            "terminated" => &self.terminated,
            "truncated" => &self.truncated,
            "slice_end" => &self.slice_end,
            "episode_id" => &self.episode_id,
            "start_step" => &self.start_step,
            _ => return None,
        })
    }

    /// Replaces the column `name` (or adds it): what a transform does to normalise an
    /// observation or add a derived column.
    pub fn insert(&mut self, name: &str, tensor: Tensor) {
        match self.columns.iter_mut().find(|(n, _)| n == name) {
            Some((_, t)) => *t = tensor,
            None => self.columns.push((name.to_string(), tensor)),
        }
    }

    /// Batch size B and slice length L.
    pub fn shape(&self) -> (i64, i64) {
        let s = self.mask.size();
        (s[0], s[1])
    }

    /// The device the tensors live on.
    pub fn device(&self) -> Device {
        self.mask.device()
    }

    /// Every tensor of the batch, named: columns, then flags, then per-slice metadata.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.columns
            .iter()
            .map(|(n, t)| (n.as_str(), t))
            .chain(FLAG_NAMES.iter().copied().zip([
                &self.mask,
                &self.is_first,
                &self.is_last,
                &self.terminated,
                &self.truncated,
                &self.slice_end,
            ]))
            .chain([
                ("episode_id", &self.episode_id),
                ("start_step", &self.start_step),
            ])
    }

    /// Applies `f` to every tensor (columns, flags, metadata): a cast, a pinning copy, a device
    /// transfer. A result on the CPU keeps the host slot tensors it came from, so that it can still
    /// be recycled.
    pub(crate) fn try_map(&self, mut f: impl FnMut(&Tensor) -> Result<Tensor>) -> Result<Self> {
        let mut out = TensorBatch {
            ready: self.ready.clone(),
            columns: self
                .columns
                .iter()
                .map(|(n, t)| Ok((n.clone(), f(t)?)))
                .collect::<Result<_>>()?,
            mask: f(&self.mask)?,
            is_first: f(&self.is_first)?,
            is_last: f(&self.is_last)?,
            terminated: f(&self.terminated)?,
            truncated: f(&self.truncated)?,
            slice_end: f(&self.slice_end)?,
            episode_id: f(&self.episode_id)?,
            start_step: f(&self.start_step)?,
            flag_base: None,
            meta_base: None,
            base_columns: Vec::new(),
        };
        if out.device() == Device::Cpu {
            out.flag_base = self.flag_base.as_ref().map(Tensor::shallow_clone);
            out.meta_base = self.meta_base.as_ref().map(Tensor::shallow_clone);
            out.base_columns = self
                .base_columns
                .iter()
                .map(Tensor::shallow_clone)
                .collect();
        }
        Ok(out)
    }
}

/// Measures the baseline a loader's transfer is compared with: copies of one pinned host tensor of
/// `bytes` to `device`, each waited for, and returns the bandwidth in bytes per second (median of
/// `iters`). Needs CUDA.
pub fn pinned_copy_bandwidth(bytes: usize, device: Device, iters: usize) -> Result<f64> {
    let Device::Cuda(n) = device else {
        return Err(Error::argument(
            "device",
            "the pinned copy baseline needs a CUDA device",
        ));
    };
    check_device(device)?;
    let host = pin(
        &Tensor::f_zeros([bytes as i64], (Kind::Uint8, Device::Cpu))?,
        device,
    )?;
    let mut times = Vec::with_capacity(iters);
    for i in 0..iters.max(1) + 3 {
        tch::Cuda::synchronize(n as i64);
        let t = std::time::Instant::now();
        let d = host.f_to_device_(device, Kind::Uint8, true, false)?;
        tch::Cuda::synchronize(n as i64);
        let s = t.elapsed().as_secs_f64();
        drop(d);
        if i >= 3 {
            times.push(s);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(bytes as f64 / times[times.len() / 2])
}

/// A pinned copy of host tensor `t` for copies to `device`. Through `_pin_memory`: tch passes a
/// device to `pin_memory`, which PyTorch 2.11 deprecates with a warning on stderr at every call
/// (and again from the `is_pinned` it calls), two lines a batch where a loader pins per batch.
pub(crate) fn pin(t: &Tensor, device: Device) -> Result<Tensor> {
    Ok(t.f_internal_pin_memory(device)?)
}

/// Whether host tensor `t` lies in pinned memory: asked of the CUDA runtime (no warning), or of
/// libtorch where the runtime's symbols cannot be found.
pub(crate) fn is_pinned(t: &Tensor, device: Device) -> bool {
    events::is_pinned(t.data_ptr()).unwrap_or_else(|| t.is_pinned(device))
}
