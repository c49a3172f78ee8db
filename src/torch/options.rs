//! Options of a [`super::TorchLoader`] and the user transform type.

use std::sync::Arc;

use tch::Device;

use super::{FloatCast, TensorBatch};
use crate::error::Result;
use crate::loader::LoaderOptions;

/// A user transform, run by the workers on each host batch before its transfer to the device.
/// It may change tensors in place or replace them ([`TensorBatch::insert`]); on CUDA, whatever it
/// returns is pinned again before the copy, so pinned transfers survive every transform.
pub type Transform = Arc<dyn Fn(&mut TensorBatch) -> Result<()> + Send + Sync>;

/// Options of a [`TorchLoader`](super::TorchLoader).
#[derive(Clone)]
#[non_exhaustive]
pub struct TorchLoaderOptions {
    /// Target device. Default CPU.
    pub device: Device,
    /// Workers, queue depth, first batch and number of batches.
    pub loader: LoaderOptions,
    /// Pinned staging slots per worker on CUDA (a slot is reused only after its copy finished).
    /// Default 4.
    pub staging_slots: usize,
    /// Floating-point cast applied on the device.
    pub cast: FloatCast,
    /// On a CPU target, hand out pinned host tensors (for training code that does its own
    /// transfers). Needs CUDA. Default off: a CPU run makes no CUDA call.
    pub pin_output: bool,
    /// GPU-resident mode: upload the gathered columns once if they fit this many bytes of device
    /// memory, and sample on the device. Default off (streaming).
    pub resident_budget: Option<u64>,
    /// In resident mode, gather each batch with one fused kernel (NVRTC-compiled on a GPU, its
    /// C++ copy on the CPU; see [`TorchLoader::resident_gather`](super::TorchLoader::resident_gather)).
    /// Default on; off gathers the same batch with libtorch operations (to compare, or where a
    /// GPU machine lacks NVRTC, which is then used anyway).
    pub resident_fused: bool,
    /// In resident mode with the output ring, the fused kernel reads each batch's per-slice
    /// parameters where the workers wrote them (pinned host memory, which the GPU maps) and
    /// keeps a copy on the device as it gathers, instead of a host-to-device copy of them before
    /// its launch: one call fewer on the training thread a batch, and at large batches no copy
    /// ahead of the kernel on the stream. Default off; the GPU check measures both.
    pub resident_mapped_params: bool,
    /// Transform run on each host batch before the transfer.
    pub transform: Option<Transform>,
    /// Ship the compact batch ([`crate::CompactInto`]: a derived `next_observation` as one row per
    /// slice, the flags as per-slice spans) and expand it on the device. None (the default): on
    /// for CUDA without a transform (a transform sees the full host batch), off on CPU, where
    /// the gather writes the full batch directly. Some(true) on CPU expands on the host (what the
    /// tests compare).
    pub compact: Option<bool>,
    /// Expand a compact batch with one fused kernel (`expand.cu`: NVRTC-compiled on a GPU, its
    /// C++ copy on the CPU) instead of ~40 libtorch operations and their allocations. Default
    /// on; where NVRTC cannot be loaded the operations run instead (see
    /// [`TorchLoader::compact_expand`](super::TorchLoader::compact_expand)).
    pub fused_expand: bool,
    /// Decode frame windows where the batch lands (issue 35): the workers ship each window's
    /// stored frames, tens of bytes each, with a table saying where each goes, and a kernel of
    /// one thread per frame decodes them there (NVRTC-compiled on a GPU; its C++ copy on the
    /// CPU, which the tests compare with the workers' decode). Needs a frame window
    /// ([`crate::FrameStack::with_window`]) and a local dataset; not with a transform or in
    /// resident mode. Default off (the workers decode).
    pub device_decode: bool,
    /// On CUDA, copy each batch into a ring of device buffers whose tensor views were made once,
    /// on the worker's own stream (see [`TorchLoader::device_ring`](super::TorchLoader::device_ring)):
    /// a held batch is never overwritten, the training thread only waits on an event. Default
    /// on; off (or with a transform, a widened column or the device decode) each batch
    /// gets a new device allocation and views on the default stream.
    pub device_ring: bool,
    /// Runs the device ring on the CPU, with host buffers standing for the device's (what tests
    /// without a GPU check). Default off.
    #[doc(hidden)]
    pub ring_on_cpu: bool,
    /// With `device_decode` on CUDA, a thread decodes each frame instead of a warp (32 lanes
    /// that write each copy's bytes together): to compare the two. Default off.
    pub device_decode_per_thread: bool,
}

impl std::fmt::Debug for TorchLoaderOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchLoaderOptions")
            .field("device", &self.device)
            .field("loader", &self.loader)
            .field("staging_slots", &self.staging_slots)
            .field("cast", &self.cast)
            .field("pin_output", &self.pin_output)
            .field("device_ring", &self.device_ring)
            .field("resident_budget", &self.resident_budget)
            .field("resident_fused", &self.resident_fused)
            .field("resident_mapped_params", &self.resident_mapped_params)
            .field("transform", &self.transform.is_some())
            .field("compact", &self.compact)
            .field("fused_expand", &self.fused_expand)
            .field("device_decode", &self.device_decode)
            .field("device_decode_per_thread", &self.device_decode_per_thread)
            .finish()
    }
}

impl TorchLoaderOptions {
    /// Streaming to `device` with default loader options.
    pub fn new(device: Device) -> Self {
        Self {
            device,
            loader: LoaderOptions::default(),
            staging_slots: 4,
            cast: FloatCast::None,
            pin_output: false,
            resident_budget: None,
            resident_fused: true,
            resident_mapped_params: false,
            transform: None,
            compact: None,
            fused_expand: true,
            device_decode: false,
            device_decode_per_thread: false,
            device_ring: true,
            ring_on_cpu: false,
        }
    }

    /// A thread per frame for the device decode instead of a warp
    /// ([`TorchLoaderOptions::device_decode_per_thread`]).
    pub fn with_device_decode_per_thread(mut self, on: bool) -> Self {
        self.device_decode_per_thread = on;
        self
    }

    /// Frame windows decoded where the batch lands ([`TorchLoaderOptions::device_decode`]).
    pub fn with_device_decode(mut self, on: bool) -> Self {
        self.device_decode = on;
        self
    }
    /// Whether CUDA batches go through the device ring ([`TorchLoaderOptions::device_ring`]).
    pub fn with_device_ring(mut self, on: bool) -> Self {
        self.device_ring = on;
        self
    }

    /// The device ring on the CPU ([`TorchLoaderOptions::ring_on_cpu`]), for tests.
    #[doc(hidden)]
    pub fn with_ring_on_cpu(mut self, on: bool) -> Self {
        self.ring_on_cpu = on;
        self
    }

    /// Sets workers, queue depth, first batch and batch count.
    pub fn with_loader(mut self, loader: LoaderOptions) -> Self {
        self.loader = loader;
        self
    }
    /// Sets the pinned staging slots per worker (at least 2).
    pub fn with_staging_slots(mut self, n: usize) -> Self {
        self.staging_slots = n.max(2);
        self
    }
    /// Casts floating columns on the device.
    pub fn with_cast(mut self, cast: FloatCast) -> Self {
        self.cast = cast;
        self
    }
    /// Pinned host tensors on a CPU target.
    pub fn with_pinned_output(mut self, on: bool) -> Self {
        self.pin_output = on;
        self
    }
    /// GPU-resident mode within `budget` bytes of device memory.
    pub fn with_resident(mut self, budget: u64) -> Self {
        self.resident_budget = Some(budget);
        self
    }
    /// Whether resident mode gathers with the fused kernel (see
    /// [`TorchLoaderOptions::resident_fused`]).
    pub fn with_resident_fused(mut self, on: bool) -> Self {
        self.resident_fused = on;
        self
    }
    /// Whether the resident kernel reads the parameters in place (see
    /// [`TorchLoaderOptions::resident_mapped_params`]).
    pub fn with_resident_mapped_params(mut self, on: bool) -> Self {
        self.resident_mapped_params = on;
        self
    }
    /// Whether the compact batch is shipped and expanded on the device (see
    /// [`TorchLoaderOptions::compact`]; a transform turns it off).
    pub fn with_compact(mut self, on: bool) -> Self {
        self.compact = Some(on);
        self
    }
    /// Whether a compact batch is expanded by one fused kernel (see
    /// [`TorchLoaderOptions::fused_expand`]).
    pub fn with_fused_expand(mut self, on: bool) -> Self {
        self.fused_expand = on;
        self
    }
    /// A transform run on each host batch before its transfer.
    pub fn with_transform(
        mut self,
        f: impl Fn(&mut TensorBatch) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        self.transform = Some(Arc::new(f));
        self
    }
}
