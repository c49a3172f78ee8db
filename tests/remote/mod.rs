//! Object storage (`src/remote/`): push, pull and streams against object_store's `InMemory` and a real S3-compatible server (moto).

mod frames;
mod memory;
mod s3;
mod staged;
mod stream;
mod stream_mix;
