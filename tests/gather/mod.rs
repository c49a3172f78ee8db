//! Gathering plans into batches (`src/gather/`): every column source, data larger than memory, image observations.

mod columns;
mod images;
mod out_of_core;
