//! `Snapshot`: one version of a dataset (local or in object storage), memory-mapped.

use std::sync::Mutex;

use arrow::array::RecordBatch;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use trajstore::sql::{SnapshotSql, SqlSession};
use trajstore::store::info::{info_json, render_info};
use trajstore::{DatasetBuilder, Snapshot};

use crate::arrow_io::{ArrowBatch, ArrowStream};
use crate::dlpack::Buffer;
use crate::errors::{IntoPyResult, argument, size, to_py};

/// Opens the dataset at `uri` (a directory, `file://`, or `s3://bucket/prefix` mirrored into
/// `cache_dir`), at its newest version or at `version`.
#[pyfunction]
#[pyo3(signature = (uri, version=None, cache_dir=None))]
pub fn open(
    py: Python<'_>,
    uri: String,
    version: Option<u64>,
    cache_dir: Option<std::path::PathBuf>,
) -> PyResult<PySnapshot> {
    let snap = py
        .detach(|| {
            let mut b = DatasetBuilder::from_uri(&uri);
            if let Some(v) = version {
                b = b.with_version(v);
            }
            if let Some(c) = cache_dir {
                b = b.with_cache_dir(c);
            }
            b.load()
        })
        .py()?;
    Ok(PySnapshot {
        uri,
        snap: Mutex::new(snap),
    })
}

/// Sets the memory limit of SQL sessions created afterwards in this process: bytes, a size
/// string (`"8GiB"`), or None for the default (`TRAJSTORE_SQL_MEMORY`, else half the memory).
#[pyfunction]
#[pyo3(signature = (limit))]
pub fn set_sql_memory_limit(limit: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let bytes = match limit {
        None => None,
        Some(v) => Some(size(v).filter(|&n| n >= 1 << 20).ok_or_else(|| {
            argument(
                "limit",
                format!("{v}: a size of at least 1 MiB, in bytes or as a string like \"8GiB\""),
            )
        })?),
    };
    trajstore::sql::set_memory_limit(bytes);
    Ok(())
}

/// The memory limit of new SQL sessions in bytes, and where it comes from.
#[pyfunction]
pub fn sql_memory_limit() -> PyResult<(u64, String)> {
    let (n, from) = trajstore::sql::memory_limit().py()?;
    Ok((n, from.to_string()))
}

/// The columns a loader of a dataset of `schema` can gather: the stored ones, and
/// `next_observation` (derived from the episodes when not stored).
pub(crate) fn sample_columns(schema: &trajstore::TransitionSchema) -> Vec<String> {
    let mut names: Vec<String> = schema
        .payload_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    if !names.iter().any(|n| n == "next_observation") {
        names.push("next_observation".into());
    }
    names
}

/// One version of a dataset, memory-mapped (see `trajstore.Snapshot`).
#[pyclass(frozen, name = "Snapshot", module = "trajstore._native")]
pub struct PySnapshot {
    uri: String,
    snap: Mutex<Snapshot>,
}

impl PySnapshot {
    /// The current snapshot (cheap: reference-counted maps and indexes).
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.snap.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[pymethods]
impl PySnapshot {
    /// The URI it was opened from.
    #[getter]
    fn uri(&self) -> &str {
        &self.uri
    }

    /// The local directory that is mapped (the mirror, for a dataset in object storage).
    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.snapshot().path().to_path_buf()
    }

    #[getter]
    fn version(&self) -> u64 {
        self.snapshot().version()
    }

    #[getter]
    fn num_transitions(&self) -> u64 {
        self.snapshot().num_transitions()
    }

    #[getter]
    fn num_episodes(&self) -> u64 {
        self.snapshot().num_episodes()
    }

    /// Id of the first episode (ids are dense).
    #[getter]
    fn first_episode_id(&self) -> u64 {
        self.snapshot().episodes().first_id()
    }

    /// Committed versions of the local directory, oldest first.
    fn versions(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        let path = self.snapshot().path().to_path_buf();
        py.detach(|| trajstore::Dataset::open(&path)?.versions())
            .py()
    }

    /// Moves to the newest committed version; whether it changed.
    fn refresh(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| {
            let mut snap = self.snap.lock().unwrap_or_else(|e| e.into_inner());
            snap.refresh()
        })
        .py()
    }

    /// The transitions' Arrow schema (PyCapsule interface: `pyarrow.schema(ds)`).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema = self.snapshot().schema().arrow_schema().clone();
        ArrowStream::new(schema, vec![]).schema_capsule(py)
    }

    /// Names of the columns a loader can gather: the stored ones, and `next_observation` (derived
    /// from the episodes when not stored).
    fn sample_columns(&self) -> Vec<String> {
        sample_columns(self.snapshot().schema())
    }

    /// The episode table: one row per episode (id, start row, length, return, flags, ...).
    fn episodes(&self) -> PyResult<ArrowStream> {
        let snap = self.snapshot();
        let tables: Vec<RecordBatch> = snap
            .segments()
            .iter()
            .map(|s| s.episode_table().batch().clone())
            .collect();
        let schema = match tables.first() {
            Some(b) => b.schema(),
            None => snap.schema().episode_schema().clone(),
        };
        let batches = tables
            .into_iter()
            .map(|b| b.with_schema(schema.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| to_py(e.into()))?;
        Ok(ArrowStream::new(schema, batches))
    }

    /// The transitions of episode `id`, a zero-copy view of the memory map.
    fn episode(&self, id: u64) -> PyResult<Option<ArrowBatch>> {
        Ok(self.snapshot().episode(id).py()?.map(ArrowBatch::new))
    }

    /// Runs a SQL query (DataFusion) over the tables `transitions` and `episodes`; read-only
    /// unless `allow_writes`.
    #[pyo3(signature = (query, allow_writes=false))]
    fn sql(&self, py: Python<'_>, query: String, allow_writes: bool) -> PyResult<ArrowStream> {
        let snap = self.snapshot();
        let r = py
            .detach(|| {
                SqlSession::try_new(&snap)?
                    .allow_writes(allow_writes)
                    .query(&query)
            })
            .py()?;
        Ok(ArrowStream::new(r.schema, r.batches))
    }

    /// The sorted, distinct episode ids a query with an `episode_id` column returns.
    fn episodes_where(&self, py: Python<'_>, query: String) -> PyResult<Buffer> {
        let snap = self.snapshot();
        let ids = py.detach(|| snap.episodes_where(&query)).py()?;
        Ok(Buffer::from_u64s(ids))
    }

    /// What `trajstore info` prints (histograms of `bins` bins; 0 for none).
    #[pyo3(signature = (bins=0))]
    fn info(&self, bins: usize) -> PyResult<String> {
        if bins as u64 > trajstore::store::info::MAX_BINS {
            return Err(argument(
                "bins",
                format!("at most {} bins", trajstore::store::info::MAX_BINS),
            ));
        }
        Ok(render_info(&self.snapshot().catalog(), &self.uri, bins))
    }

    /// What `trajstore info --json` prints.
    fn info_json(&self) -> String {
        info_json(&self.snapshot().catalog(), &self.uri).to_string()
    }
}
