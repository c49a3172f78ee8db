//! What a TFDS dataset directory says about itself: `features.json` (the `FeaturesDict` proto
//! serialized as JSON) and `dataset_info.json` (name, file format, splits and their shards).
//!
//! `features.json` nests `featuresDict.features` maps whose values are one of `tensor`
//! (`{shape: {dimensions: ["4"]}, dtype, encoding}`), `image` (`{shape, dtype,
//! encodingFormat}`), `text`, `classLabel` (an `int64` scalar), `featuresDict`, or `sequence`
//! (`tfds.features.Dataset` and `Sequence`: `{feature, length}`). An RLDS dataset has one
//! sequence at the top, `steps`; its leaves are flattened with `/` (`observation/image`), as
//! TFDS names them in each `tf.train.Example` (`steps/observation/image`, one value per step,
//! tensors flattened). Dimensions are strings (`"-1"` when unknown), as protobuf's JSON writes
//! 64-bit integers; numbers are accepted too.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// A tensor's element type, as `features.json` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtype {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
    Str,
}

impl Dtype {
    fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "bool" => Dtype::Bool,
            "int8" => Dtype::I8,
            "int16" => Dtype::I16,
            "int32" => Dtype::I32,
            "int64" => Dtype::I64,
            "uint8" => Dtype::U8,
            "uint16" => Dtype::U16,
            "uint32" => Dtype::U32,
            "uint64" => Dtype::U64,
            "float16" | "bfloat16" => Dtype::F16,
            "float32" => Dtype::F32,
            "float64" => Dtype::F64,
            "string" => Dtype::Str,
            _ => return None,
        })
    }

    /// Whether TFDS serializes it as a `float_list` (else an `int64_list`, or bytes).
    pub(crate) fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::F32 | Dtype::F64)
    }

    /// Bytes per element of the `bytes` tensor encoding (the array's raw little-endian bytes).
    pub(crate) fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::I8 | Dtype::U8 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::I64 | Dtype::U64 | Dtype::F64 => 8,
            Dtype::Str => 0,
        }
    }
}

/// How a tensor is serialized (`tfds.features.Encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    /// A numeric list of the flattened values.
    None,
    /// One `bytes` value per tensor: its raw little-endian bytes.
    Bytes,
    /// The same, zlib-compressed.
    Zlib,
}

/// What one leaf feature is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    /// A tensor (or scalar, `shape` empty).
    Tensor { dtype: Dtype, encoding: Encoding },
    /// An encoded `uint8` image of shape `[H, W, C]` (`None`: unknown until decoded).
    Image,
    /// Text, or anything else trajstore does not store (the reason).
    Skipped(String),
}

/// One leaf of the features tree.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Leaf {
    /// Its path below the sequence (or the top), joined with `/`: `observation/image`.
    pub(crate) path: String,
    /// Dimensions, `None` where unknown (`-1`).
    pub(crate) shape: Vec<Option<usize>>,
    pub(crate) kind: Kind,
}

/// The features of an RLDS dataset.
#[derive(Debug, Clone)]
pub(crate) struct Features {
    /// The name of the sequence of steps (`steps`).
    pub(crate) steps: String,
    /// The leaves of a step.
    pub(crate) step: Vec<Leaf>,
    /// The episode-level leaves (metadata), which are not stored.
    pub(crate) episode: Vec<Leaf>,
}

/// A split and the files of its shards.
#[derive(Debug, Clone)]
pub(crate) struct Split {
    pub(crate) name: String,
    /// (file, number of episodes `dataset_info.json` says it holds).
    pub(crate) shards: Vec<(PathBuf, u64)>,
}

/// `dataset_info.json`.
#[derive(Debug, Clone)]
pub(crate) struct Info {
    pub(crate) name: String,
    pub(crate) splits: Vec<Split>,
}

/// Where the JSON files of a TFDS directory are.
pub(crate) const DATASET_INFO: &str = "dataset_info.json";
pub(crate) const FEATURES: &str = "features.json";

/// The directory holding `dataset_info.json` and `features.json`: `input` itself, or the only
/// such directory one or two levels down (`<name>/<version>/`, as `tfds` lays out a data dir).
pub(crate) fn find_root(input: &Path) -> Option<PathBuf> {
    let is_root = |d: &Path| d.join(DATASET_INFO).is_file() && d.join(FEATURES).is_file();
    if is_root(input) {
        return Some(input.to_path_buf());
    }
    let subdirs = |d: &Path| -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(d) else {
            return vec![];
        };
        let mut v: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        v.sort();
        v
    };
    let mut found = vec![];
    for a in subdirs(input) {
        if is_root(&a) {
            found.push(a);
            continue;
        }
        found.extend(subdirs(&a).into_iter().filter(|b| is_root(b)));
    }
    match found.as_slice() {
        [one] => Some(one.clone()),
        _ => None,
    }
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::invalid_data(format!("not valid JSON: {e}")).in_input(path.display()))
}

/// A 64-bit integer of protobuf's JSON form: a string or a number.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

/// Reads `features.json` (at `path`).
pub(crate) fn parse_features(path: &Path) -> Result<Features> {
    let json = read_json(path)?;
    let bad = |reason: String| Error::invalid_data(reason).in_input(path.display());
    if json.get("type").is_some() && json.get("content").is_some() {
        return Err(Error::IncompatibleFormat {
            found: format!(
                "{}: the features.json of TFDS before 4.0 (`type`/`content`)",
                path.display()
            ),
            supported: "the FeaturesDict proto as JSON (`featuresDict`), TFDS 4.0 and later \
                        (re-save with a current tensorflow-datasets)"
                .into(),
        });
    }
    let top = json
        .get("featuresDict")
        .and_then(|d| d.get("features"))
        .and_then(Value::as_object)
        .ok_or_else(|| bad("no top-level `featuresDict.features`".into()))?;
    let sequences: Vec<&String> = top
        .iter()
        .filter(|(_, v)| v.get("sequence").is_some())
        .map(|(k, _)| k)
        .collect();
    let steps = match sequences.as_slice() {
        [] => {
            return Err(bad(
                "no sequence feature (`steps`): not an RLDS dataset".into()
            ));
        }
        [one] => (*one).clone(),
        many => match many.iter().find(|k| k.as_str() == "steps") {
            Some(k) => (*k).clone(),
            None => {
                return Err(bad(format!(
                    "several sequence features ({}) and none is `steps`",
                    many.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        },
    };
    let mut episode = vec![];
    for (k, v) in top {
        if *k != steps {
            leaves(k, v, &mut episode, &bad)?;
        }
    }
    let seq = &top[&steps]["sequence"];
    let inner = seq
        .get("feature")
        .ok_or_else(|| bad(format!("`{steps}.sequence` has no `feature`")))?;
    let mut step = vec![];
    match inner.get("featuresDict").and_then(|d| d.get("features")) {
        Some(Value::Object(m)) => {
            for (k, v) in m {
                leaves(k, v, &mut step, &bad)?;
            }
        }
        _ => leaves("", inner, &mut step, &bad)?,
    }
    if step.is_empty() {
        return Err(bad(format!("`{steps}` has no features")));
    }
    // In name order whatever the JSON map's order (an action dict is concatenated in it).
    step.sort_by(|a, b| a.path.cmp(&b.path));
    episode.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(Features {
        steps,
        step,
        episode,
    })
}

fn shape(v: &Value) -> std::result::Result<Vec<Option<usize>>, String> {
    let dims = match v.get("shape").and_then(|s| s.get("dimensions")) {
        None => return Ok(vec![]),
        Some(Value::Array(d)) => d,
        Some(other) => return Err(format!("`shape.dimensions` is {other}")),
    };
    dims.iter()
        .map(|d| match int(d) {
            Some(-1) => Ok(None),
            Some(n) if n >= 0 && n <= u32::MAX as i64 => Ok(Some(n as usize)),
            _ => Err(format!("a dimension {d}")),
        })
        .collect()
}

/// Flattens feature `v` named `path` into `out`.
fn leaves(path: &str, v: &Value, out: &mut Vec<Leaf>, bad: &dyn Fn(String) -> Error) -> Result<()> {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}/{k}")
        }
    };
    let leaf = |kind: Kind, shape: Vec<Option<usize>>| Leaf {
        path: path.to_string(),
        shape,
        kind,
    };
    let bad_shape = |e: String| bad(format!("feature `{path}`: {e}"));
    if let Some(d) = v.get("featuresDict") {
        let m = d
            .get("features")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(format!("feature `{path}`: a featuresDict without features")))?;
        for (k, x) in m {
            leaves(&join(k), x, out, bad)?;
        }
    } else if let Some(t) = v.get("tensor") {
        let dtype = t.get("dtype").and_then(Value::as_str).unwrap_or("");
        let shape = shape(t).map_err(bad_shape)?;
        let encoding = match t.get("encoding").and_then(Value::as_str) {
            None | Some("none") | Some("") => Some(Encoding::None),
            Some("bytes") => Some(Encoding::Bytes),
            Some("zlib") => Some(Encoding::Zlib),
            Some(_) => None,
        };
        out.push(match (Dtype::parse(dtype), encoding) {
            (Some(Dtype::Str), _) => leaf(Kind::Skipped("strings are not stored".into()), shape),
            (Some(dtype), Some(encoding)) => leaf(Kind::Tensor { dtype, encoding }, shape),
            (None, _) => leaf(Kind::Skipped(format!("dtype `{dtype}`")), shape),
            (_, None) => leaf(
                Kind::Skipped(format!("tensor encoding {}", t["encoding"])),
                shape,
            ),
        });
    } else if let Some(i) = v.get("image") {
        let shape = shape(i).map_err(bad_shape)?;
        let dtype = i.get("dtype").and_then(Value::as_str).unwrap_or("uint8");
        out.push(if dtype != "uint8" {
            leaf(Kind::Skipped(format!("a {dtype} image")), shape)
        } else if shape.len() != 3 || !matches!(shape[2], Some(1..=4)) {
            leaf(
                Kind::Skipped(format!(
                    "an image of shape {shape:?} (expected [H, W, C], C of 1 to 4)"
                )),
                shape,
            )
        } else {
            leaf(Kind::Image, shape)
        });
    } else if v.get("classLabel").is_some() {
        out.push(leaf(
            Kind::Tensor {
                dtype: Dtype::I64,
                encoding: Encoding::None,
            },
            vec![],
        ));
    } else if v.get("text").is_some() {
        out.push(leaf(Kind::Skipped("text is not stored".into()), vec![]));
    } else if v.get("sequence").is_some() {
        out.push(leaf(
            Kind::Skipped("a nested sequence is not stored".into()),
            vec![],
        ));
    } else {
        let what = v
            .get("pythonClassName")
            .and_then(Value::as_str)
            .unwrap_or("an unknown feature");
        out.push(leaf(Kind::Skipped(format!("{what} is not read")), vec![]));
    }
    Ok(())
}

/// Reads `dataset_info.json` in `root` and lists the shard files of its splits (checked to
/// exist), in the order the file lists the splits.
pub(crate) fn parse_info(root: &Path) -> Result<Info> {
    let path = root.join(DATASET_INFO);
    let json = read_json(&path)?;
    let bad = |reason: String| Error::invalid_data(reason).in_input(path.display());
    let name = json
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("no `name`".into()))?
        .to_string();
    match json.get("fileFormat").and_then(Value::as_str) {
        None | Some("tfrecord") => {}
        Some(other) => {
            return Err(Error::IncompatibleFormat {
                found: format!("{}: file format `{other}`", path.display()),
                supported: "tfrecord".into(),
            });
        }
    }
    let splits = json
        .get("splits")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no `splits`".into()))?;
    let mut out = vec![];
    for s in splits {
        let split = s
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("a split without a `name`".into()))?;
        let lengths: Vec<u64> = match s.get("shardLengths") {
            None => vec![],
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| int(x).and_then(|n| u64::try_from(n).ok()))
                .collect::<Option<_>>()
                .ok_or_else(|| bad(format!("split `{split}`: a shard length is not a count")))?,
            Some(_) => {
                return Err(bad(format!(
                    "split `{split}`: `shardLengths` is not a list"
                )));
            }
        };
        let template = s
            .get("filepathTemplate")
            .and_then(Value::as_str)
            .unwrap_or("{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}");
        let n = lengths.len();
        let shards = lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let file = template
                    .replace("{DATASET}", &name)
                    .replace("{SPLIT}", split)
                    .replace("{FILEFORMAT}", "tfrecord")
                    .replace("{SHARD_X_OF_Y}", &format!("{i:05}-of-{n:05}"))
                    .replace("{SHARD_INDEX}", &format!("{i:05}"))
                    .replace("{NUM_SHARDS}", &format!("{n:05}"));
                if file.contains('{') || file.contains("..") || Path::new(&file).is_absolute() {
                    return Err(bad(format!(
                        "split `{split}`: cannot name shard files from `filepathTemplate` {template}"
                    )));
                }
                let p = root.join(file);
                if !p.is_file() {
                    return Err(Error::NotFound { path: p });
                }
                Ok((p, len))
            })
            .collect::<Result<Vec<_>>>()?;
        out.push(Split {
            name: split.to_string(),
            shards,
        });
    }
    Ok(Info { name, splits: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_flatten_with_slashes_and_keep_their_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FEATURES);
        let tensor = |dt: &str, dims: &[&str]| {
            serde_json::json!({"tensor": {"dtype": dt, "encoding": "none",
                "shape": {"dimensions": dims}}})
        };
        let doc = serde_json::json!({"featuresDict": {"features": {
            "episode_id": tensor("int64", &[]),
            "steps": {"sequence": {"length": "-1", "feature": {"featuresDict": {"features": {
                "observation": {"featuresDict": {"features": {
                    "image": {"image": {"dtype": "uint8", "encodingFormat": "png",
                        "shape": {"dimensions": ["-1", "16", "3"]}}},
                    "state": tensor("float32", &["4"]),
                }}},
                "action": tensor("int64", &[]),
                "label": {"classLabel": {"numClasses": "3"}},
                "instruction": {"text": {}},
                "is_last": tensor("bool", &[]),
            }}}}},
        }}});
        std::fs::write(&p, doc.to_string()).unwrap();
        let f = parse_features(&p).unwrap();
        assert_eq!(f.steps, "steps");
        let paths: Vec<&str> = f.step.iter().map(|l| l.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "action",
                "instruction",
                "is_last",
                "label",
                "observation/image",
                "observation/state"
            ]
        );
        assert_eq!(f.step[4].kind, Kind::Image);
        assert_eq!(f.step[4].shape, vec![None, Some(16), Some(3)]);
        assert!(matches!(f.step[1].kind, Kind::Skipped(_)));
        assert_eq!(f.episode.len(), 1);
        // Not RLDS, and the pre-4.0 layout.
        std::fs::write(&p, r#"{"featuresDict": {"features": {"x": {"text": {}}}}}"#).unwrap();
        assert!(
            parse_features(&p)
                .unwrap_err()
                .to_string()
                .contains("not an RLDS")
        );
        std::fs::write(&p, r#"{"type": "FeaturesDict", "content": {}}"#).unwrap();
        assert!(matches!(
            parse_features(&p).unwrap_err(),
            Error::IncompatibleFormat { .. }
        ));
    }
}
