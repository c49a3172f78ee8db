//! # trajstore
//!
//! An Apache Arrow columnar store for reinforcement-learning transitions.
//!
//! Transitions live in memory-mapped Arrow IPC *file* segments that hold whole episodes, with
//! precomputed trajectory boundary columns (`episode_id`, `step`, `is_first`, `is_last`,
//! `terminated`, `truncated`) and a per-segment episode table. Opening a dataset reads manifests
//! and episode tables only: O(episodes), never O(transitions). Reads are zero-copy views of the
//! maps. Every file is standard Arrow IPC that pyarrow, Polars, DuckDB and DataFusion read.
//!
//! Training code samples slices ([`SliceSampler`] and friends over a cached [`SliceIndex`]),
//! gathers them ([`Gatherer`]) and prefetches batches in the background ([`Loader`]); with the
//! `torch` feature, `trajstore::torch::TorchLoader` hands them over as `tch` tensors on a CPU or
//! CUDA device (pinned staging, non-blocking copies, or a GPU-resident mode). With the `sql`
//! feature (on by default), `trajstore::sql` runs DataFusion SQL over a snapshot. With the
//! `remote` feature (on by default), `trajstore::remote` pushes datasets to S3 (or any
//! S3-compatible server) and pulls them into local mirrors that are mapped like any dataset;
//! a [`Catalog`] (manifest and episode tables, no transitions) is all it fetches to describe one.
//! [`DatasetBuilder`] (or [`open()`]) opens a dataset whatever names it, a directory or a URL.
//!
//! ```
//! use std::sync::Arc;
//! use arrow::array::{FixedSizeListArray, Float32Array, RecordBatch};
//! use arrow::datatypes::{DataType, Field};
//! use trajstore::{Dataset, EpisodeEnd, TransitionSchema, WriterOptions};
//!
//! # fn main() -> trajstore::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let schema = TransitionSchema::builder(&[3], 2).build()?;
//! let ds = Dataset::create(dir.path().join("demo.trajstore"), &schema)?;
//!
//! // Append one episode of 4 transitions and commit.
//! let mut writer = ds.writer(WriterOptions::default())?;
//! let list = |n: i32, v: Vec<f32>| {
//!     let item = Arc::new(Field::new("item", DataType::Float32, false));
//!     Arc::new(FixedSizeListArray::new(item, n, Arc::new(Float32Array::from(v)), None))
//! };
//! let batch = RecordBatch::try_from_iter([
//!     ("observation", list(3, vec![0.0; 12]) as _),
//!     ("action", list(2, vec![1.0; 8]) as _),
//!     ("reward", Arc::new(Float32Array::from(vec![1.0, 0.0, 0.0, 1.0])) as _),
//! ])?;
//! writer.append_episode(&batch, EpisodeEnd::terminated())?;
//! let version = writer.commit()?;
//!
//! // Readers see whole committed versions.
//! let snap = ds.snapshot()?;
//! assert_eq!((snap.version(), snap.num_transitions(), snap.num_episodes()), (version, 4, 1));
//! let episode = snap.episode(0)?.expect("episode 0 was written");
//! assert_eq!(episode.num_rows(), 4);
//! # Ok(()) }
//! ```

// The pipeline, in dependency order: each module uses only those above it (see ARCHITECTURE.md
// and tests/layers.rs, which checks it).
pub mod error;
pub mod format;
pub mod frames;
pub mod gather;
pub mod index;
pub mod ingest;
pub mod iofloor;
pub mod loader;
pub mod open;
pub mod progress;
#[cfg(feature = "remote")]
pub mod remote;
pub mod sample;
pub mod schema;
#[cfg(feature = "sql")]
pub mod sql;
pub mod stats;
pub mod store;
pub mod synth;
#[cfg(feature = "torch")]
pub mod torch;
pub mod units;
#[cfg(feature = "video")]
pub mod video;

mod fault;
mod guard;

pub use error::{ConflictKind, Error, Result};
pub use gather::{
    Batch, BatchColumn, CompactInto, FrameCacheStats, FrameStack, GatherInto, Gatherer, ReadAhead,
    StackPad,
};
pub use index::{BoundaryPolicy, EpisodeIndex, EpisodeLocation, SliceIndex, SliceRef};
pub use loader::{
    BatchSource, Follow, FollowStats, Loader, LoaderOptions, LoaderSpec, LoaderState, PartSpec,
    Recycler, StagedBatch, StagedLoader, StagingSlot,
};
#[cfg(feature = "remote")]
pub use loader::{StreamFollow, StreamLoader, StreamStats};
pub use open::{DatasetBuilder, open};
pub use progress::{Progress, ProgressSink};
pub use sample::{
    BuiltSampler, EpisodeSampler, EpochSampler, MixSampler, PrioritizedSampler, Sampler,
    SamplerKind, SamplerSpec, SliceSampler, Weighting, mix_counts,
};
pub use schema::{ActionKind, TransitionSchema};
pub use store::{
    Catalog, Dataset, DatasetWriter, EpisodeEnd, EpisodeTable, Manifest, Segment, Snapshot, Step,
    Values, WriterOptions,
};
