//! `Stream`: a dataset in object storage opened for streaming (`trajstore.open(url,
//! cache_limit=...)`): its catalog (manifest and episode tables) fetched into the mirror, and
//! nothing else. Loaders read its transition files through a bounded per-rank cache
//! (`trajstore::StreamLoader`, made from a `Plan.streamed`).

use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use trajstore::remote::{Stream, StreamOptions};
use trajstore::store::info::{info_json, render_info};

use crate::arrow_io::ArrowStream;
use crate::errors::{IntoPyResult, argument, size};

/// Opens `url` for streaming through caches of `cache_limit` bytes in all for the node's
/// `ranks_per_node` ranks, at its newest version or `version`; `reuse` is the uniform
/// sampler's draws per transition per round.
#[pyfunction]
#[pyo3(signature = (url, cache_limit, version=None, cache_dir=None, reuse=4.0, ranks_per_node=1))]
pub fn open_stream(
    py: Python<'_>,
    url: String,
    cache_limit: &Bound<'_, PyAny>,
    version: Option<u64>,
    cache_dir: Option<std::path::PathBuf>,
    reuse: f64,
    ranks_per_node: u64,
) -> PyResult<PyStream> {
    let limit = size(cache_limit).filter(|&n| n > 0).ok_or_else(|| {
        argument(
            "cache_limit",
            format!(
                "cache_limit={cache_limit}: a positive size, in bytes or as a string like \"50GiB\""
            ),
        )
    })?;
    let mut opts = StreamOptions::new(limit);
    opts.version = version;
    opts.cache_dir = cache_dir;
    opts.reuse = reuse;
    opts.ranks_per_node = ranks_per_node;
    let stream = py.detach(|| Stream::open(&url, opts)).py()?;
    Ok(PyStream { url, stream })
}

/// A dataset in object storage opened for streaming (see `trajstore.StreamedSnapshot`).
#[pyclass(frozen, name = "Stream", module = "trajstore._native")]
pub struct PyStream {
    url: String,
    pub(crate) stream: Stream,
}

#[pymethods]
impl PyStream {
    /// The URL it was opened from.
    #[getter]
    fn uri(&self) -> &str {
        &self.url
    }

    /// The local mirror holding the catalog (and, under `_stream/`, each rank's cache).
    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.stream.mirror().to_path_buf()
    }

    #[getter]
    fn version(&self) -> u64 {
        self.stream.catalog().version()
    }

    #[getter]
    fn num_transitions(&self) -> u64 {
        self.stream.catalog().num_transitions()
    }

    #[getter]
    fn num_episodes(&self) -> u64 {
        self.stream.catalog().num_episodes()
    }

    /// Bytes of the version's transition files (what a full mirror would download).
    #[getter]
    fn transition_bytes(&self) -> u64 {
        self.stream
            .catalog()
            .manifest()
            .segments
            .iter()
            .map(|s| s.bytes)
            .sum()
    }

    /// Uniform sampling's draws per transition per round (the batches depend on it).
    #[getter]
    fn reuse(&self) -> f64 {
        self.stream.options().reuse
    }

    /// The node's cache limit in bytes (all its ranks together).
    #[getter]
    fn cache_limit(&self) -> u64 {
        self.stream.options().cache_limit
    }

    /// Ranks of this node sharing the cache limit.
    #[getter]
    fn ranks_per_node(&self) -> u64 {
        self.stream.options().ranks_per_node
    }

    /// One rank's share of the cache limit, in bytes.
    #[getter]
    fn rank_cache_limit(&self) -> u64 {
        self.stream.rank_cache_limit()
    }

    /// The transitions' Arrow schema (PyCapsule interface: `pyarrow.schema(stream)`).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema = self.stream.catalog().schema().arrow_schema().clone();
        ArrowStream::new(schema, vec![]).schema_capsule(py)
    }

    /// The sorted, distinct episode ids a query with an `episode_id` column returns (from the
    /// catalog, and ranged reads of `transitions`).
    fn episodes_where(&self, py: Python<'_>, query: String) -> PyResult<crate::dlpack::Buffer> {
        use trajstore::sql::StreamSql;
        let ids = py.detach(|| self.stream.episodes_where(&query)).py()?;
        Ok(crate::dlpack::Buffer::from_u64s(ids))
    }

    /// The newest version in the store now (a listing of its manifests).
    fn newest_version(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.stream.newest_version()).py()
    }

    /// Names of the columns a loader can gather (as `Snapshot.sample_columns`).
    fn sample_columns(&self) -> Vec<String> {
        crate::dataset::sample_columns(self.stream.catalog().schema())
    }

    /// What `trajstore info URL` prints.
    fn info(&self, bins: usize) -> String {
        render_info(self.stream.catalog(), &self.url, bins)
    }

    /// What `trajstore info URL --json` prints.
    fn info_json(&self) -> String {
        info_json(self.stream.catalog(), &self.url).to_string()
    }
}

/// Pushes the newest version of the local dataset at `path` to `url` (`trajstore push`):
/// segment files first, then the manifest, so a reader never sees a version whose files are
/// missing; files already in the store are not uploaded again. Returns the report as JSON.
#[pyfunction]
#[pyo3(signature = (path, url, concurrency=8))]
pub fn push(
    py: Python<'_>,
    path: std::path::PathBuf,
    url: String,
    concurrency: usize,
) -> PyResult<String> {
    if concurrency == 0 {
        return Err(argument("concurrency", "concurrency must be at least 1"));
    }
    if !trajstore::format::is_url(&url) {
        return Err(argument(
            "url",
            format!("`{url}` is not a URL; push to s3://BUCKET/PREFIX (or file:///PATH)"),
        ));
    }
    let report = py
        .detach(|| {
            let ds = trajstore::Dataset::open(&path)?;
            let o = trajstore::remote::RemoteOptions {
                concurrency,
                ..Default::default()
            };
            trajstore::remote::Remote::open(&url, o)?.push(&ds)
        })
        .py()?;
    serde_json::to_string(&report)
        .map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))
}
