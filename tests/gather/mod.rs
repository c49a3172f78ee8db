//! Gathering plans into batches (`src/gather/`): every column source, frame columns and their cache, data larger than memory, image observations.

mod columns;
mod compact;
mod frame_cache;
mod frames;
mod images;
mod out_of_core;
