//! The dataset on disk (`src/store/`): writing, opening, versions, the golden dataset, `schemas/` against the code, other readers of the files, readers during commits, a full disk, pixel frame columns.

mod concurrency;
mod dataset;
mod disk_full;
pub(crate) mod frames;
mod golden;
mod interop;
mod schemas;
mod schemas_frames;
