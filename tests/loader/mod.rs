//! Loaders (`src/loader/`): workers and queues, staged slots, exact resume, following new versions, mixes.

mod follow;
mod mix;
mod resume;
mod staged;
mod workers;
