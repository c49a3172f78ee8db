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
    #[error(
        "schema mismatch{}: {reason}{}",
        column.as_deref().map(|c| format!(" in column `{c}`")).unwrap_or_default(),
        expected_found(expected.as_deref(), found.as_deref())
    )]
    SchemaMismatch {
        /// The column at fault, when one is.
        column: Option<String>,
        /// What the dataset (or the option given) expects, e.g. a data type, when one thing is.
        expected: Option<String>,
        /// What the input has instead.
        found: Option<String>,
        /// What is wrong, in words.
        reason: String,
    },
    /// Input data is inconsistent (a reappearing episode id, a null in a required column, a
    /// truncated array file, ...).
    #[error(
        "invalid data{}: {reason}",
        where_in(input.as_deref(), column.as_deref(), *episode)
    )]
    InvalidData {
        /// The input at fault (a file, or a member of an archive), when known.
        input: Option<String>,
        /// The column at fault, when one is.
        column: Option<String>,
        /// The episode at fault (its id in the input), when one is.
        episode: Option<i64>,
        /// What is wrong, in words.
        reason: String,
    },
    /// A caller passed an argument that cannot work.
    #[error(
        "invalid argument{}: {reason}",
        argument.as_deref().map(|a| format!(" `{a}`")).unwrap_or_default()
    )]
    InvalidArgument {
        /// The argument (option, parameter) at fault, as the API names it, when one is.
        argument: Option<String>,
        /// Why it cannot work.
        reason: String,
    },
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
    /// Two writers disagree: a push that would not extend the remote's history, a version
    /// committed by someone else while this one was being written, an object already there with
    /// other bytes.
    #[error("conflict on {dataset}: {reason}")]
    Conflict {
        /// The dataset (path or URL) the conflict is on.
        dataset: String,
        /// Which conflict, with what the caller needs to resolve it.
        kind: ConflictKind,
        /// What happened and what to do, in words.
        reason: String,
    },
    /// An object store refused or failed a request (credentials, network, bucket, server error).
    #[error("{url}: {message}")]
    Remote {
        /// The object or dataset URL.
        url: String,
        /// What the store said (for S3, the server's code and message, with a hint).
        message: String,
        /// The underlying error (object_store's, or a failed background task's), when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// A streamed ingest failed after some of its episodes were committed: those stay, in
    /// `kept_version`; the rest of the stream was not written. Resume from episode
    /// `episodes_kept` of the stream.
    #[error(
        "the stream broke after version {kept_version} was committed with {episodes_kept} of its episodes (kept)"
    )]
    StreamBroken {
        /// The last version committed from this stream; it stays.
        kept_version: u64,
        /// How many of the stream's episodes that version holds.
        episodes_kept: u64,
        /// Why the stream broke.
        #[source]
        source: Box<Error>,
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
            expected: None,
            found: None,
            reason: reason.into(),
        }
    }

    /// A [`Error::SchemaMismatch`] about column `column`, which should be `expected` and is `found`
    /// (data types, shapes, ...).
    pub fn schema_types(
        column: impl Into<String>,
        expected: impl std::fmt::Display,
        found: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        Error::SchemaMismatch {
            column: Some(column.into()),
            expected: Some(expected.to_string()),
            found: Some(found.to_string()),
            reason: reason.into(),
        }
    }

    /// A [`Error::SchemaMismatch`] about the schema as a whole.
    pub fn schema_mismatch(reason: impl Into<String>) -> Self {
        Error::SchemaMismatch {
            column: None,
            expected: None,
            found: None,
            reason: reason.into(),
        }
    }

    /// An [`Error::InvalidData`]; narrow it with [`Error::in_input`], [`Error::in_column`] and
    /// [`Error::in_episode`].
    pub fn invalid_data(reason: impl Into<String>) -> Self {
        Error::InvalidData {
            input: None,
            column: None,
            episode: None,
            reason: reason.into(),
        }
    }

    /// Names the input an [`Error::InvalidData`] is about (other errors are returned unchanged).
    pub fn in_input(mut self, name: impl std::fmt::Display) -> Self {
        if let Error::InvalidData { input, .. } = &mut self {
            *input = Some(name.to_string());
        }
        self
    }

    /// Names the column an [`Error::InvalidData`] or [`Error::SchemaMismatch`] is about.
    pub fn in_column(mut self, name: impl Into<String>) -> Self {
        if let Error::InvalidData { column, .. } | Error::SchemaMismatch { column, .. } = &mut self
        {
            *column = Some(name.into());
        }
        self
    }

    /// Names the episode (its id in the input) an [`Error::InvalidData`] is about.
    pub fn in_episode(mut self, id: i64) -> Self {
        if let Error::InvalidData { episode, .. } = &mut self {
            *episode = Some(id);
        }
        self
    }

    /// An [`Error::InvalidArgument`] about argument `argument` (as the API names it).
    pub fn argument(argument: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument: Some(argument.into()),
            reason: reason.into(),
        }
    }

    /// An [`Error::InvalidArgument`] about a combination of arguments, or none in particular.
    pub fn invalid_argument(reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            argument: None,
            reason: reason.into(),
        }
    }

    /// An [`Error::Remote`] with no underlying error value.
    pub fn remote(url: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Remote {
            url: url.into(),
            message: message.into(),
            source: None,
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

/// Which kind of [`Error::Conflict`], with what resolving it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConflictKind {
    /// Another writer committed `version` first; this commit or push was not applied. Pull (or
    /// reopen) and try again on top of it.
    VersionTaken {
        /// The version the other writer committed.
        version: u64,
    },
    /// The remote's history is not a prefix of the local one: remote version `remote` is not an
    /// ancestor of local version `local`.
    Diverged {
        /// The remote's latest version.
        remote: u64,
        /// The local version being pushed.
        local: u64,
    },
    /// An object of the same name already exists with other content.
    ObjectDiffers {
        /// The object's URL.
        object: String,
    },
}

fn expected_found(expected: Option<&str>, found: Option<&str>) -> String {
    match (expected, found) {
        (Some(e), Some(f)) => format!(" (expected {e}, found {f})"),
        (Some(e), None) => format!(" (expected {e})"),
        (None, Some(f)) => format!(" (found {f})"),
        (None, None) => String::new(),
    }
}

fn where_in(input: Option<&str>, column: Option<&str>, episode: Option<i64>) -> String {
    let mut parts = Vec::new();
    if let Some(i) = input {
        parts.push(i.to_string());
    }
    if let Some(c) = column {
        parts.push(format!("column `{c}`"));
    }
    if let Some(e) = episode {
        parts.push(format!("episode {e}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" in {}", parts.join(", "))
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
