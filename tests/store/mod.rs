//! The dataset on disk (`src/store/`): writing, opening, versions, the golden dataset, `schemas/` against the code, other readers of the files, readers during commits, a full disk.

mod dataset;
mod golden;
mod schemas;
mod interop;
mod concurrency;
mod disk_full;
