//! Tables in and out through the Arrow PyCapsule interface: `pyarrow.table(stream)`,
//! `pyarrow.record_batch(batch)` and `pyarrow.schema(x)` take these objects without a copy (the
//! memory-mapped buffers are shared), and [`import_batch`] takes any object with
//! `__arrow_c_array__` (a pyarrow `RecordBatch`, a Polars frame's batch, ...).

use std::ffi::CStr;

use arrow::array::{Array, RecordBatch, RecordBatchIterator, StructArray};
use arrow::datatypes::SchemaRef;
use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use arrow::ffi_stream::FFI_ArrowArrayStream;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};

use crate::errors::{argument, to_py};

const SCHEMA: &CStr = c"arrow_schema";
const ARRAY: &CStr = c"arrow_array";
const STREAM: &CStr = c"arrow_array_stream";

fn schema_capsule<'py>(py: Python<'py>, schema: &SchemaRef) -> PyResult<Bound<'py, PyCapsule>> {
    let ffi = FFI_ArrowSchema::try_from(schema.as_ref()).map_err(|e| to_py(e.into()))?;
    PyCapsule::new_with_value(py, ffi, SCHEMA)
}

/// Record batches sharing one schema (a query result, an episode table), readable any number of
/// times as an Arrow C stream (`__arrow_c_stream__`): `pyarrow.table(s)`,
/// `pyarrow.RecordBatchReader.from_stream(s)`, `polars.from_arrow(...)`, DuckDB.
#[pyclass(frozen, module = "trajstore._native")]
pub struct ArrowStream {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

impl ArrowStream {
    pub(crate) fn new(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        Self { schema, batches }
    }

    pub(crate) fn schema_capsule<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &self.schema)
    }
}

#[pymethods]
impl ArrowStream {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        // A requested schema is a hint that producers may ignore; the consumer casts.
        let _ = requested_schema;
        let reader = RecordBatchIterator::new(
            self.batches.clone().into_iter().map(Ok),
            self.schema.clone(),
        );
        PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(Box::new(reader)), STREAM)
    }

    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        self.schema_capsule(py)
    }

    /// Total rows.
    fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }
}

/// One record batch as an Arrow C array (`__arrow_c_array__`): `pyarrow.record_batch(b)`.
#[pyclass(frozen, module = "trajstore._native")]
pub struct ArrowBatch {
    batch: RecordBatch,
}

impl ArrowBatch {
    pub(crate) fn new(batch: RecordBatch) -> Self {
        Self { batch }
    }
}

#[pymethods]
impl ArrowBatch {
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        let schema = schema_capsule(py, &self.batch.schema())?;
        let data = StructArray::from(self.batch.clone()).into_data();
        let array = FFI_ArrowArray::new(&data);
        let array = PyCapsule::new_with_value(py, array, ARRAY)?;
        PyTuple::new(py, [schema.into_any(), array.into_any()])
    }

    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        schema_capsule(py, &self.batch.schema())
    }

    /// Rows.
    fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }
}

/// A record batch from any object with `__arrow_c_array__` (pyarrow `RecordBatch`, ...).
pub(crate) fn import_batch(obj: &Bound<'_, PyAny>) -> PyResult<RecordBatch> {
    if !obj.hasattr("__arrow_c_array__")? {
        return Err(argument(
            "batch",
            format!(
                "expected an Arrow record batch (an object with __arrow_c_array__), got {}",
                obj.get_type().name()?
            ),
        ));
    }
    let pair = obj.call_method0("__arrow_c_array__")?;
    let (schema, array): (Bound<'_, PyCapsule>, Bound<'_, PyCapsule>) = pair.extract()?;
    let schema_ptr = schema
        .pointer_checked(Some(SCHEMA))?
        .cast::<FFI_ArrowSchema>();
    let array_ptr = array.pointer_checked(Some(ARRAY))?.cast::<FFI_ArrowArray>();
    // SAFETY: the capsules are named per the Arrow PyCapsule interface, so they hold a valid
    // `ArrowSchema` and `ArrowArray`. The array is moved out (its release callback now belongs to
    // us; the capsule's destructor sees a released array); the schema is only borrowed while
    // its capsule is alive.
    let data = unsafe {
        let array = FFI_ArrowArray::from_raw(array_ptr.as_ptr());
        arrow::ffi::from_ffi(array, schema_ptr.as_ref())
    }
    .map_err(|e| to_py(e.into()))?;
    let array = arrow::array::make_array(data);
    let Some(s) = array.as_any().downcast_ref::<StructArray>() else {
        return Err(argument(
            "batch",
            format!(
                "expected a record batch (a struct array), got an array of {}",
                array.data_type()
            ),
        ));
    };
    if s.null_count() > 0 {
        return Err(argument(
            "batch",
            "a record batch has no null rows (got a struct array with nulls)",
        ));
    }
    Ok(RecordBatch::from(s.clone()))
}
