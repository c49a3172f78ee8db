//! Loaders (`src/loader/`): workers and queues, staged slots, exact resume, following new versions, mixes.

mod workers;
mod staged;
mod resume;
mod follow;
mod mix;
