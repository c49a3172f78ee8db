"""Exceptions raised by trajstore. Every one is a :class:`TrajstoreError`; most also derive from
the built-in exception a Python user would catch (``ValueError`` for bad arguments and data,
``FileNotFoundError`` for a missing dataset, ``OSError`` for I/O). The message is the Rust
library's, with every cause."""

from __future__ import annotations

__all__ = [
    "TrajstoreError",
    "DatasetNotFoundError",
    "CorruptDatasetError",
    "IncompatibleFormatError",
    "SchemaError",
    "InvalidDataError",
    "InvalidArgumentError",
    "LockedError",
    "ConflictError",
    "RemoteError",
    "StreamBrokenError",
    "TrajstoreIOError",
    "PermissionDeniedError",
    "SqlError",
]


class TrajstoreError(Exception):
    """Base class of every trajstore error."""


class DatasetNotFoundError(TrajstoreError, FileNotFoundError):
    """The dataset (or a file it needs) does not exist."""


class CorruptDatasetError(TrajstoreError):
    """A file of the dataset is damaged: truncated, a checksum mismatch, an unreadable manifest."""


class IncompatibleFormatError(TrajstoreError):
    """The dataset was written in a format version this trajstore cannot read."""


class SchemaError(TrajstoreError, ValueError):
    """Columns or types do not match the dataset's schema."""


class InvalidDataError(TrajstoreError, ValueError):
    """Input data is inconsistent (episode flags, lengths, values)."""


class InvalidArgumentError(TrajstoreError, ValueError):
    """An argument is out of range or unknown (a column, a slice length, a device, ...)."""


class LockedError(TrajstoreError):
    """Another writer holds the dataset's lock."""


class ConflictError(TrajstoreError):
    """A commit or push conflicts with what is already there."""


class RemoteError(TrajstoreError, OSError):
    """Object storage failed (network, credentials, missing objects)."""


class StreamBrokenError(TrajstoreError):
    """An ingest stream broke; the episodes committed before it are kept."""


class TrajstoreIOError(TrajstoreError, OSError):
    """A file system operation failed."""


class PermissionDeniedError(TrajstoreIOError, PermissionError):
    """The operating system refused access to a path (a directory the user may not enter or
    read); the message names the path."""


class SqlError(TrajstoreError, ValueError):
    """A SQL query failed to plan or run."""
