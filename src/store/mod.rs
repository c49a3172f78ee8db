//! The store: datasets on disk. Immutable Arrow IPC segments holding whole episodes, each with
//! an episode table; one JSON manifest per committed version; a single writer that appends
//! episodes and commits atomically; snapshots that map one version zero-copy and own its cached
//! indexes; checks and export.

pub mod dataset;
pub mod dictionary;
mod episode;
pub mod export;
pub mod info;
pub mod ipc;
pub mod manifest;
pub mod segment;
pub mod verify;
pub mod writer;

pub use dataset::{Catalog, Dataset, Snapshot};
pub use episode::EpisodeTable;
pub use manifest::{Manifest, SegmentEntry};
pub use segment::Segment;
pub use writer::{DatasetWriter, EpisodeEnd, Step, VacuumReport, Values, WriterOptions};
