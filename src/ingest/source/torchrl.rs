//! TorchRL input: a replay buffer saved with `rb.dumps(DIR)` (`LazyMemmapStorage` or
//! `LazyTensorStorage` of a `TensorDict`), so that TorchRL users can move their buffers into
//! files every Arrow reader understands.
//!
//! Layout of a dump (TorchRL 0.x / tensordict memmap format): `DIR/storage/meta.json` lists each
//! entry of the stored TensorDict with its shape and dtype, nested TensorDicts (`next`) are
//! sub-directories with their own `meta.json`, and every tensor is a raw C-ordered file
//! `KEY.memmap` whose first dimension is the buffer's capacity. `storage_metadata.json` says how
//! many rows are valid (`len`), and `DIR/writer/metadata.json` where the writer's cursor is: when
//! the buffer has wrapped around, rows are read oldest first, from the cursor on.
//!
//! Nested keys become column names joined with `/` (`next/reward`); `[N, 1]` tensors (TorchRL's
//! rewards and flags) are one value per row; the buffer's own `index` entry is left out.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::array::{Array, ArraySource, Data, check_size};
use super::npy::{Dtype, Header, Input, Loc};
use crate::error::{Error, Result};

/// TorchRL's bookkeeping entry (the storage index of each row): not a column of the input.
const INDEX_KEY: &str = "index";

/// Whether `path` looks like a TorchRL dump (or a storage directory of one).
pub(crate) fn is_torchrl(path: &Path) -> bool {
    path.join("storage").join("meta.json").is_file() || path.join("meta.json").is_file()
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::invalid_data(format!("not valid JSON: {e}")).in_input(path.display()))
}

fn dtype(name: &str, what: &Loc) -> Result<Dtype> {
    use arrow::datatypes::DataType as T;
    let (arrow, size) = match name.trim_start_matches("torch.") {
        "bool" => (T::Boolean, 1),
        "uint8" => (T::UInt8, 1),
        "int8" => (T::Int8, 1),
        "int16" => (T::Int16, 2),
        "uint16" => (T::UInt16, 2),
        "int32" => (T::Int32, 4),
        "uint32" => (T::UInt32, 4),
        "int64" => (T::Int64, 8),
        "uint64" => (T::UInt64, 8),
        "float16" => (T::Float16, 2),
        "float32" => (T::Float32, 4),
        "float64" => (T::Float64, 8),
        "bfloat16" => {
            return Err(what.schema(
                "bfloat16 has no Arrow type; cast it to float32 before rb.dumps(), or pass \
                 --drop-cols",
            ));
        }
        other => {
            return Err(what.schema(format!(
                "dtype {other} is not supported; supported: bool, (u)int8-64, float16/32/64"
            )));
        }
    };
    Ok(Dtype { arrow, size })
}

/// The tensors of one TensorDict level (`dir/meta.json`), recursing into nested ones.
fn walk(
    root: &Path,
    dir: &Path,
    prefix: &str,
    drop: &[String],
    out: &mut Vec<(String, Option<Array>)>,
) -> Result<()> {
    let meta_path = dir.join("meta.json");
    let meta = read_json(&meta_path)?;
    let entries = meta.as_object().ok_or_else(|| {
        Error::invalid_data("expected a JSON object").in_input(meta_path.display())
    })?;
    for (key, value) in entries {
        let Some(entry) = value.as_object() else {
            continue; // "shape", "device", "_type": the TensorDict's own attributes
        };
        let name = format!("{prefix}{key}");
        let what = Loc::array(root, &name);
        if entry.get("type").and_then(Value::as_str) == Some("TensorDict") {
            walk(root, &dir.join(key), &format!("{name}/"), drop, out)?;
            continue;
        }
        if prefix.is_empty() && key == INDEX_KEY {
            continue;
        }
        if drop.contains(&name) {
            out.push((name, None));
            continue;
        }
        let Some(dt) = entry.get("dtype").and_then(Value::as_str) else {
            return Err(what.schema(format!(
                "entry `{name}` is not a tensor ({value}); pass --drop-cols {name}"
            )));
        };
        if entry.get("is_nested").and_then(Value::as_bool) == Some(true) {
            return Err(what.schema(format!(
                "entry `{name}` is a nested (ragged) tensor; pass --drop-cols {name}"
            )));
        }
        let shape = entry
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|s| s.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
            .ok_or_else(|| {
                Error::invalid_data(format!("entry `{name}` has no valid shape"))
                    .in_input(meta_path.display())
                    .in_column(&name)
            })?;
        let file = dir.join(format!("{key}.memmap"));
        let input = Input::open(&file)?;
        let available = input.len();
        let array = Array {
            name: name.clone(),
            header: Header {
                dtype: dtype(dt, &what)?,
                shape,
                data_offset: 0,
            },
            data: Data::Stored { input, offset: 0 },
        };
        check_size(&array, available, &Loc::array(&file, &name))?;
        out.push((name, Some(array)));
    }
    Ok(())
}

/// Opens a TorchRL dump directory (or its `storage/` directory) as a source, oldest row first.
pub(crate) fn open(path: &Path, drop: &[String]) -> Result<ArraySource> {
    let (storage, root): (PathBuf, Option<PathBuf>) = if path.join("storage/meta.json").is_file() {
        (path.join("storage"), Some(path.to_path_buf()))
    } else {
        (path.to_path_buf(), path.parent().map(Path::to_path_buf))
    };
    let sm_path = storage.join("storage_metadata.json");
    if !sm_path.is_file() {
        return Err(Error::argument(
            "input",
            format!(
                "{} has no storage_metadata.json, so the number of valid rows is unknown: save \
                 the replay buffer with rb.dumps(DIR) and ingest DIR (a LazyMemmapStorage scratch \
                 directory alone does not record it)",
                path.display()
            ),
        ));
    }
    let sm = read_json(&sm_path)?;
    if sm.get("is_pytree").and_then(Value::as_bool) == Some(true) {
        return Err(Error::schema_mismatch(format!(
            "{}: a pytree storage; only TensorDict storages are supported",
            path.display()
        )));
    }
    let len = sm
        .get("len")
        .and_then(Value::as_u64)
        .ok_or_else(|| Error::invalid_data("no integer `len`").in_input(sm_path.display()))?;
    let mut arrays = vec![];
    walk(path, &storage, "", drop, &mut arrays)?;
    if arrays.iter().all(|(_, a)| a.is_none()) {
        return Err(
            Error::invalid_data("the replay buffer holds no tensors").in_input(path.display())
        );
    }
    // Oldest row first: after the buffer wrapped (more writes than it holds), the writer's
    // cursor points at the oldest row.
    let mut first = 0;
    if let Some(root) = root {
        let wm = root.join("writer").join("metadata.json");
        if wm.is_file() {
            let w = read_json(&wm)?;
            let cursor = w.get("cursor").and_then(Value::as_u64).unwrap_or(0);
            let writes = w.get("write_count").and_then(Value::as_u64).unwrap_or(0);
            let capacity = arrays
                .iter()
                .find_map(|(_, a)| a.as_ref())
                .and_then(|a| a.header.shape.first().copied())
                .unwrap_or(0) as u64;
            if writes > len && len == capacity && capacity > 0 {
                first = cursor % capacity;
            }
        }
    }
    ArraySource::from_arrays(path, arrays, Some(len), first)
}
