//! trajstore errors as Python exceptions: each variant maps to a class of `trajstore.errors`
//! (which also derives from the matching built-in: `ValueError` for bad arguments and data,
//! `FileNotFoundError` for a missing dataset, `OSError` for I/O), with the whole cause chain in
//! the message.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;
use trajstore::Error;

/// The `trajstore.errors` class of `e`.
fn class_of(e: &Error) -> &'static str {
    match e {
        Error::NotFound { .. } => "DatasetNotFoundError",
        Error::Corrupt { .. } => "CorruptDatasetError",
        Error::IncompatibleFormat { .. } => "IncompatibleFormatError",
        Error::SchemaMismatch { .. } => "SchemaError",
        Error::InvalidData { .. } => "InvalidDataError",
        Error::InvalidArgument { .. } => "InvalidArgumentError",
        Error::Locked { .. } => "LockedError",
        Error::Conflict { .. } => "ConflictError",
        Error::Remote { .. } => "RemoteError",
        Error::StreamBroken { .. } => "StreamBrokenError",
        Error::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            "PermissionDeniedError"
        }
        Error::Io { .. } => "TrajstoreIOError",
        Error::Sql(_) => "SqlError",
        _ => "TrajstoreError",
    }
}

/// `e` and its causes, each printed once.
pub(crate) fn message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        cause = c.source();
    }
    msg
}

/// The Python exception of a trajstore error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = message(&e);
    let class = class_of(&e);
    Python::attach(|py| {
        let ty = py
            .import("trajstore.errors")
            .and_then(|m| m.getattr(class))
            .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from));
        match ty {
            Ok(ty) => PyErr::from_type(ty, msg),
            Err(_) => PyRuntimeError::new_err(msg),
        }
    })
}

/// A size option's value: bytes, or a string such as `"8GiB"` (None if it is neither).
pub(crate) fn size(v: &Bound<'_, PyAny>) -> Option<u64> {
    match v.extract::<String>() {
        Ok(s) => trajstore::sql::limits::parse_size(&s),
        Err(_) => v.extract::<u64>().ok(),
    }
}

/// An `InvalidArgumentError` about `argument`.
pub(crate) fn argument(argument: &str, reason: impl Into<String>) -> PyErr {
    to_py(Error::argument(argument, reason.into()))
}

/// `?` for trajstore results in `PyResult` functions.
pub(crate) trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for trajstore::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
