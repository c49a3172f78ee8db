//! Names, constants and the type grammar of format v1.
//!
//! This module mirrors the files under `schemas/` (the single source of truth for column names,
//! metadata keys and on-disk layout); a test checks that the two agree. Code elsewhere takes its
//! names from here, never from string literals.

use std::path::{Path, PathBuf};

use arrow::datatypes::{DataType, Field};

use crate::error::{Error, Result};

/// Value of `format` in every manifest.
pub const FORMAT_NAME: &str = "trajstore";
/// The on-disk format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Directory of immutable manifests, one per committed version.
pub const VERSIONS_DIR: &str = "_versions";
/// Directory of segment files and their episode tables.
pub const SEGMENTS_DIR: &str = "segments";
/// Lock file held (with an exclusive `flock`) by the single writer.
pub const LOCK_FILE: &str = "_lock";
/// Suffix of a segment's transition file.
pub const SEGMENT_SUFFIX: &str = ".arrow";
/// Suffix of a segment's episode table.
pub const EPISODES_SUFFIX: &str = ".episodes.arrow";
/// Suffix of a manifest.
pub const MANIFEST_SUFFIX: &str = ".json";
/// Suffix of files being written; never referenced by a manifest, removed by the next writer.
pub const TMP_SUFFIX: &str = ".tmp";

/// The temporary name a file is written under before its rename ([`TMP_SUFFIX`] appended).
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(TMP_SUFFIX);
    PathBuf::from(s)
}

/// Number of decimal digits of version numbers and segment ids in file names.
pub const ID_DIGITS: usize = 20;
/// Alignment of every buffer in every IPC file, in bytes.
pub const IPC_ALIGNMENT: usize = 64;
/// Default target size of a segment file in bytes.
pub const DEFAULT_SEGMENT_BYTES: u64 = 256 << 20;
/// Default target size of one record batch inside a segment, in bytes.
pub const DEFAULT_BATCH_BYTES: u64 = 32 << 20;

/// Names of the transition columns.
pub mod col {
    /// u64, dense id of the episode in write order.
    pub const EPISODE_ID: &str = "episode_id";
    /// u32, index of the transition inside its episode.
    pub const STEP: &str = "step";
    /// bool, `step == 0`.
    pub const IS_FIRST: &str = "is_first";
    /// bool, last transition of the episode.
    pub const IS_LAST: &str = "is_last";
    /// bool, the episode ended in a terminal state at this transition.
    pub const TERMINATED: &str = "terminated";
    /// bool, the episode was cut at this transition (time limit, end of data).
    pub const TRUNCATED: &str = "truncated";
    /// Fixed-size list, o_t.
    pub const OBSERVATION: &str = "observation";
    /// Fixed-size list of floats (continuous) or int64 (discrete), a_t.
    pub const ACTION: &str = "action";
    /// f32, r_{t+1}.
    pub const REWARD: &str = "reward";
    /// Optional, same type as observation, o_{t+1}.
    pub const NEXT_OBSERVATION: &str = "next_observation";
    /// The boundary columns, in their on-disk order (they come first in every segment).
    pub const BOUNDARY: [&str; 6] = [EPISODE_ID, STEP, IS_FIRST, IS_LAST, TERMINATED, TRUNCATED];
}

/// Names of the episode-table columns.
pub mod ep {
    /// u64, the episode's id.
    pub const EPISODE_ID: &str = "episode_id";
    /// u64, first row of the episode within its segment.
    pub const ROW_START: &str = "row_start";
    /// u64, number of transitions.
    pub const LENGTH: &str = "length";
    /// f64, sum of rewards.
    pub const EPISODE_RETURN: &str = "episode_return";
    /// bool, ended in a terminal state.
    pub const TERMINATED: &str = "terminated";
    /// bool, was cut (time limit or end of data).
    pub const TRUNCATED: &str = "truncated";
    /// Nullable, observation type: o_T after the last step (present when next_observation is not stored).
    pub const FINAL_OBSERVATION: &str = "final_observation";
}

/// Metadata keys.
pub mod meta {
    /// Arrow's extension-name key.
    pub const EXTENSION_NAME: &str = "ARROW:extension:name";
    /// Arrow's extension-metadata key.
    pub const EXTENSION_METADATA: &str = "ARROW:extension:metadata";
    /// The canonical fixed-shape tensor extension.
    pub const FIXED_SHAPE_TENSOR: &str = "arrow.fixed_shape_tensor";
    /// Footer metadata: format version.
    pub const FORMAT_VERSION: &str = "trajstore:format_version";
    /// Footer metadata: segment id.
    pub const SEGMENT_ID: &str = "trajstore:segment_id";
    /// Footer metadata: `transitions` or `episodes`.
    pub const FILE_KIND: &str = "trajstore:kind";
    /// Value of [`FILE_KIND`] for transition files.
    pub const KIND_TRANSITIONS: &str = "transitions";
    /// Value of [`FILE_KIND`] for episode tables.
    pub const KIND_EPISODES: &str = "episodes";
    /// Field metadata of a frame column (`LargeBinary`, one compressed image per row): the JSON
    /// of its `FrameSpec` (codec, shape, dtype, dictionary; module `frames`).
    pub const FRAME: &str = "trajstore:frame";
}

/// Directory of the zstd dictionaries of frame columns (content-addressed, immutable).
pub const DICTIONARIES_DIR: &str = "dictionaries";
/// Suffix of a dictionary file.
pub const DICTIONARY_SUFFIX: &str = ".zdict";

/// Relative path of the dictionary whose CRC-32C is `crc`: `dictionaries/<crc:08x>.zdict`.
pub fn dictionary_path(crc: u32) -> String {
    format!("{DICTIONARIES_DIR}/{crc:08x}{DICTIONARY_SUFFIX}")
}

/// The manifest type name of a frame column (`LargeBinary`).
pub const FRAME_TYPE: &str = "large_binary";

/// A size in binary units, as the messages and the CLI print it: `512 B`, `1.50 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

/// Whether `s` names a dataset in object storage (`scheme://...`, e.g. `s3://bucket/prefix`)
/// rather than a local directory.
pub fn is_url(s: &str) -> bool {
    s.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// File name of version `v`'s manifest.
pub fn manifest_name(v: u64) -> String {
    format!("{v:0width$}{MANIFEST_SUFFIX}", width = ID_DIGITS)
}

/// Parses a manifest file name back into its version.
pub fn parse_manifest_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(MANIFEST_SUFFIX)?;
    if digits.len() != ID_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Zero-padded text form of a segment id.
pub fn segment_name(id: u64) -> String {
    format!("{id:0width$}", width = ID_DIGITS)
}

/// Relative path of segment `id`'s transition file.
pub fn segment_path(id: u64) -> String {
    format!("{SEGMENTS_DIR}/{}{SEGMENT_SUFFIX}", segment_name(id))
}

/// Relative path of segment `id`'s episode table.
pub fn episodes_path(id: u64) -> String {
    format!("{SEGMENTS_DIR}/{}{EPISODES_SUFFIX}", segment_name(id))
}

/// Renders a fixed-width Arrow type in the grammar used by manifests and `schemas/`:
/// `bool`, `int8`..`int64`, `uint8`..`uint64`, `float16`/`float32`/`float64`,
/// and `fixed_size_list<T>[n]` over one of those. Returns `None` for other types.
pub fn type_name(dt: &DataType) -> Option<String> {
    Some(match dt {
        DataType::Boolean => "bool".into(),
        DataType::Int8 => "int8".into(),
        DataType::Int16 => "int16".into(),
        DataType::Int32 => "int32".into(),
        DataType::Int64 => "int64".into(),
        DataType::UInt8 => "uint8".into(),
        DataType::UInt16 => "uint16".into(),
        DataType::UInt32 => "uint32".into(),
        DataType::UInt64 => "uint64".into(),
        DataType::Float16 => "float16".into(),
        DataType::Float32 => "float32".into(),
        DataType::Float64 => "float64".into(),
        DataType::FixedSizeList(child, n) => {
            let inner = type_name(child.data_type())?;
            // Lists of bools are bit-packed, so a row is not a byte range: not part of the format.
            if matches!(
                child.data_type(),
                DataType::FixedSizeList(..) | DataType::Boolean
            ) || *n <= 0
            {
                return None;
            }
            format!("fixed_size_list<{inner}>[{n}]")
        }
        _ => return None,
    })
}

/// Parses the grammar of [`type_name`]. List children are named `item` and non-nullable.
pub fn parse_type(s: &str) -> Result<DataType> {
    let bad = || Error::argument("type", format!("unsupported column type `{s}`"));
    Ok(match s {
        "bool" => DataType::Boolean,
        "int8" => DataType::Int8,
        "int16" => DataType::Int16,
        "int32" => DataType::Int32,
        "int64" => DataType::Int64,
        "uint8" => DataType::UInt8,
        "uint16" => DataType::UInt16,
        "uint32" => DataType::UInt32,
        "uint64" => DataType::UInt64,
        "float16" => DataType::Float16,
        "float32" => DataType::Float32,
        "float64" => DataType::Float64,
        _ => {
            let rest = s.strip_prefix("fixed_size_list<").ok_or_else(bad)?;
            let (inner, tail) = rest.split_once(">[").ok_or_else(bad)?;
            let n: i32 = tail
                .strip_suffix(']')
                .and_then(|n| n.parse().ok())
                .ok_or_else(bad)?;
            let inner = parse_type(inner)?;
            if matches!(inner, DataType::FixedSizeList(..) | DataType::Boolean) || n <= 0 {
                return Err(bad());
            }
            DataType::FixedSizeList(Field::new("item", inner, false).into(), n)
        }
    })
}

/// The dataset property holding the random id a dataset gets when it is created (128 bits,
/// hex), which tells its versions from those of any other dataset (loader states check it).
pub const DATASET_ID_PROPERTY: &str = "trajstore.dataset_id";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_grammar_round_trips() {
        for s in [
            "bool",
            "uint8",
            "int64",
            "float16",
            "float64",
            "fixed_size_list<float32>[17]",
            "fixed_size_list<uint8>[12288]",
        ] {
            assert_eq!(type_name(&parse_type(s).unwrap()).unwrap(), s);
        }
        for bad in [
            "utf8",
            "fixed_size_list<float32>[0]",
            "fixed_size_list<float32>",
            "fixed_size_list<bool>[3]",
            "fixed_size_list<fixed_size_list<float32>[2]>[3]",
        ] {
            assert!(parse_type(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn manifest_names_sort_and_parse() {
        assert_eq!(manifest_name(42), "00000000000000000042.json");
        assert_eq!(parse_manifest_name(&manifest_name(42)), Some(42));
        assert_eq!(parse_manifest_name("42.json"), None);
        assert_eq!(parse_manifest_name("0000000000000000004x.json"), None);
        assert!(manifest_name(9) < manifest_name(10));
    }
}
