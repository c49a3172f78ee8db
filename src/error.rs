//! The crate's error type. Variants are named by what the caller should do about them.

use std::path::{Path, PathBuf};

/// Result alias used throughout trajstore.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in trajstore. Bad input is always one of these, never a panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A dataset, version or file that should exist does not.
    #[error("not found: {}", path.display())]
    NotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// A file exists but its bytes are not what trajstore wrote (truncated, bit-flipped, foreign).
    #[error("corrupt file {}: {reason}", path.display())]
    Corrupt {
        /// The offending file.
        path: PathBuf,
        /// What check failed.
        reason: String,
    },
    /// The dataset was written by an incompatible format version.
    #[error("incompatible format: found {found}, this build supports {supported}")]
    IncompatibleFormat {
        /// What the file declares.
        found: String,
        /// What this build reads.
        supported: String,
    },
    /// Data does not match the dataset's schema (or an input lacks a column it needs).
    #[error("schema mismatch{}: {reason}", column.as_deref().map(|c| format!(" in column `{c}`")).unwrap_or_default())]
    SchemaMismatch {
        /// The column at fault, when one is.
        column: Option<String>,
        /// What was expected and what was found.
        reason: String,
    },
    /// Input data is inconsistent (a reappearing episode id, a null in a required column, ...).
    #[error("invalid data: {0}")]
    InvalidData(String),
    /// A caller passed an argument that cannot work.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Another writer holds the dataset's lock.
    #[error(
        "dataset {} is locked by another writer (lock file {}); only one writer may append at a time",
        dataset.display(),
        lock.display()
    )]
    Locked {
        /// The dataset directory.
        dataset: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// Two writers disagree: a push that would not extend the remote's history, or a version
    /// committed by someone else while this one was being written.
    #[error("conflict: {0}")]
    Conflict(String),
    /// An object store refused or failed a request (credentials, network, bucket, server error).
    #[error("{url}: {message}")]
    Remote {
        /// The object or dataset URL.
        url: String,
        /// What the store said.
        message: String,
    },
    /// An I/O error on a named path.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The path being accessed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An error from arrow-rs.
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// An error from the parquet crate.
    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// An error planning or running a SQL query (syntax, unknown column, type mismatch, ...).
    #[cfg(feature = "sql")]
    #[error("sql: {0}")]
    Sql(#[from] datafusion::error::DataFusionError),
    /// An error from libtorch (through tch): a failed allocation, device copy or tensor op.
    #[cfg(feature = "torch")]
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
}

impl Error {
    /// Wraps an I/O error with the path it happened on; `NotFound` becomes [`Error::NotFound`].
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        let path = path.as_ref().to_path_buf();
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound { path }
        } else {
            Error::Io { path, source }
        }
    }

    /// A [`Error::SchemaMismatch`] about column `column`.
    pub fn schema(column: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::SchemaMismatch {
            column: Some(column.into()),
            reason: reason.into(),
        }
    }

    /// A [`Error::SchemaMismatch`] about the schema as a whole.
    pub fn schema_mismatch(reason: impl Into<String>) -> Self {
        Error::SchemaMismatch {
            column: None,
            reason: reason.into(),
        }
    }

    /// A [`Error::Corrupt`] for `path`.
    pub fn corrupt(path: impl AsRef<Path>, reason: impl Into<String>) -> Self {
        Error::Corrupt {
            path: path.as_ref().to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// Attaches a path to I/O results.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| Error::io(path, e))
    }
}
