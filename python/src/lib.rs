//! `trajstore._native`: the Rust half of the Python package. The pure-Python package `trajstore`
//! (in `python/trajstore/`) wraps these classes into the documented API; nothing here is meant to
//! be imported directly.
//!
//! Every call that reads data, samples, gathers, runs SQL or writes releases the GIL. Tables
//! reach pyarrow through the Arrow PyCapsule interface and batches reach PyTorch or NumPy through
//! DLPack, both without copies and without linking pyarrow or libtorch.

use pyo3::prelude::*;

mod arrow_io;
mod dataset;
mod dlpack;
mod errors;
mod loader;
mod plan;
mod stream;
mod writer;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_BATCH_NUMBER", trajstore::loader::MAX_BATCH_NUMBER)?;
    m.add_class::<dataset::PySnapshot>()?;
    m.add_class::<arrow_io::ArrowStream>()?;
    m.add_class::<arrow_io::ArrowBatch>()?;
    m.add_class::<dlpack::Buffer>()?;
    m.add_class::<plan::Plan>()?;
    m.add_class::<loader::BatchLoader>()?;
    m.add_class::<loader::SlotLoader>()?;
    m.add_class::<writer::Writer>()?;
    m.add_class::<stream::PyStream>()?;
    m.add_function(wrap_pyfunction!(dataset::open, m)?)?;
    m.add_function(wrap_pyfunction!(stream::open_stream, m)?)?;
    m.add_function(wrap_pyfunction!(stream::push, m)?)?;
    m.add_function(wrap_pyfunction!(dataset::set_sql_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(dataset::sql_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(writer::create, m)?)?;
    m.add_function(wrap_pyfunction!(writer::ingest, m)?)?;
    m.add_function(wrap_pyfunction!(loader::max_batch_bytes, m)?)?;
    Ok(())
}
