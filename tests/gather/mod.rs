//! Gathering plans into batches (`src/gather/`): every column source, frame columns, data larger than memory, image observations.

mod columns;
mod compact;
mod frames;
mod images;
mod out_of_core;
