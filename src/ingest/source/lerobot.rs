//! LeRobot datasets' cameras (feature `video`): the features of `meta/info.json` with
//! `dtype: "video"`, read from their MP4 files and added to each episode as a frame column
//! named after the camera key (`observation.images.top`), one RGB frame `[H, W, 3]` per step.
//! The Parquet half (`data/`) is the ordinary Parquet source; this adds the columns episode by
//! episode, as the assembler hands episodes to the writer.
//!
//! Layouts: **v3** (`codebase_version` `v3.*`): many episodes per MP4
//! (`videos/<key>/chunk-NNN/file-NNN.mp4`); `meta/episodes/chunk-*/file-*.parquet` gives each
//! episode's `length` and, per camera, `videos/<key>/{chunk_index, file_index, from_timestamp,
//! to_timestamp}`. **v2.x**: one MP4 per episode and camera (`video_path` of `info.json`, e.g.
//! `videos/chunk-000/<key>/episode_000000.mp4`), lengths in `meta/episodes.jsonl`.
//!
//! The frame of data row `t` is the one LeRobot's decoders return: the frame whose presentation
//! time (`pts * time_base`, in the stream's own time base) is nearest `from_timestamp +
//! timestamp[t]`, which must be within LeRobot's tolerance ([`TOLERANCE_S`]). The video must hold
//! exactly `length` frames in `[from_timestamp, to_timestamp)` (the whole file in v2.x), and
//! the data exactly `length` rows. Anything else, and a damaged MP4, is an
//! [`Error::InvalidData`] that names the file, the camera (column) and the episode.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, RecordBatch, UInt8Array};
use arrow::datatypes::{DataType, Field, Float64Type, Int64Type, Schema};

use rayon::prelude::*;

use super::EpisodeColumns;
use crate::error::{Error, Result};
use crate::frames::{FrameCodec, FrameSpec};
use crate::schema::{TransitionSchema, frame_field, tensor_field};
use crate::video::VideoFile;

/// LeRobot's default `tolerance_s` (`LeRobotDataset(tolerance_s=1e-4)`): how far a frame's
/// presentation time may be from the timestamp it is looked up by.
pub const TOLERANCE_S: f64 = 1e-4;

/// The data column holding each row's time in its episode (seconds).
const TIMESTAMP: &str = "timestamp";

/// One camera: its key (the feature's name, and the stored column's) and frame shape.
#[derive(Debug, Clone)]
struct Camera {
    key: String,
    /// `[H, W, 3]`.
    shape: Vec<usize>,
}

/// Where one episode of one camera is: the file and its time range.
#[derive(Debug, Clone)]
struct Clip {
    path: PathBuf,
    from: f64,
    /// `None` in v2.x (one file per episode: the whole file).
    to: Option<f64>,
}

#[derive(Debug, Clone)]
struct EpisodeMeta {
    length: i64,
    /// One per camera.
    clips: Vec<Clip>,
}

/// The cameras of a LeRobot dataset and where each episode's frames are.
pub(crate) struct Cameras {
    cameras: Vec<Camera>,
    episodes: HashMap<i64, EpisodeMeta>,
    /// How the columns are stored (`None`: as `uint8` tensors).
    codec: Option<FrameCodec>,
    /// The last file opened, per camera (episodes of one file come one after the other).
    open: Vec<Option<VideoFile>>,
}

fn bad(path: &Path, why: impl Into<String>) -> Error {
    Error::invalid_data(why).in_input(path.display())
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| bad(path, format!("not JSON: {e}")))
}

/// Python's `str.format` for LeRobot's path templates: `{name}` and `{name:0Nd}`.
fn format_template(template: &str, values: &[(&str, &str, i64)]) -> Option<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let close = rest[open..].find('}')? + open;
        let field = &rest[open + 1..close];
        let (name, spec) = field.split_once(':').unwrap_or((field, ""));
        let &(_, text, number) = values.iter().find(|v| v.0 == name)?;
        if spec.is_empty() {
            out.push_str(text);
        } else {
            let width: usize = spec.strip_prefix('0')?.strip_suffix('d')?.parse().ok()?;
            out.push_str(&format!("{number:0width$}"));
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// The keys of every video feature of the LeRobot dataset at `root` (none for any other input).
pub(crate) fn video_keys(root: &Path) -> Result<Vec<String>> {
    let info_path = root.join("meta").join("info.json");
    if !root.is_dir() || !info_path.is_file() {
        return Ok(vec![]);
    }
    let info = read_json(&info_path)?;
    Ok(info
        .get("features")
        .and_then(|f| f.as_object())
        .map(|f| {
            f.iter()
                .filter(|(_, v)| v.get("dtype").and_then(|d| d.as_str()) == Some("video"))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default())
}

impl Cameras {
    /// The cameras of the LeRobot dataset at `root` (a directory with `meta/info.json`), or
    /// `None` when it has no video feature or is not a LeRobot dataset. Cameras named in
    /// `drop` are left out.
    pub(crate) fn detect(
        root: &Path,
        drop: &[String],
        codec: Option<FrameCodec>,
    ) -> Result<Option<Cameras>> {
        let info_path = root.join("meta").join("info.json");
        if !root.is_dir() || !info_path.is_file() {
            return Ok(None);
        }
        let info = read_json(&info_path)?;
        let mut cameras = vec![];
        if let Some(features) = info.get("features").and_then(|f| f.as_object()) {
            for (key, f) in features {
                if f.get("dtype").and_then(|d| d.as_str()) != Some("video") || drop.contains(key) {
                    continue;
                }
                cameras.push(Camera {
                    key: key.clone(),
                    shape: camera_shape(&info_path, key, f)?,
                });
            }
        }
        if cameras.is_empty() {
            return Ok(None);
        }
        let version = info
            .get("codebase_version")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        let video_path = info
            .get("video_path")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad(&info_path, "video features but no `video_path`"))?;
        let episodes = if version.starts_with("v3") {
            episodes_v3(root, &cameras, video_path)?
        } else if version.starts_with("v2") {
            let chunks = info
                .get("chunks_size")
                .and_then(|v| v.as_i64())
                .filter(|&n| n > 0)
                .unwrap_or(1000);
            episodes_v2(root, &cameras, video_path, chunks)?
        } else {
            return Err(bad(
                &info_path,
                format!(
                    "codebase_version `{version}`: trajstore reads the videos of LeRobot v2.x and v3 datasets"
                ),
            ));
        };
        let open = (0..cameras.len()).map(|_| None).collect();
        Ok(Some(Cameras {
            cameras,
            episodes,
            codec,
            open,
        }))
    }

    /// `base` (the schema of the Parquet half) with the cameras appended as frame columns
    /// (tensor columns without a frame codec).
    pub(crate) fn schema(&self, base: &TransitionSchema) -> Result<TransitionSchema> {
        let mut fields: Vec<Field> = base
            .arrow_schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        for c in &self.cameras {
            if fields.iter().any(|f| f.name() == &c.key) {
                return Err(Error::schema(
                    &c.key,
                    "a camera of meta/info.json has the name of a data column",
                ));
            }
            fields.push(match self.codec {
                Some(codec) => frame_field(&c.key, &FrameSpec::new(codec, &c.shape)?, false)?,
                None => tensor_field(&c.key, DataType::UInt8, &c.shape, false)?,
            });
        }
        TransitionSchema::try_from_arrow(&Schema::new(fields))
    }

    /// `schema` without the camera columns (what the Parquet half maps to), to compare with an
    /// existing dataset's.
    pub(crate) fn without(&self, schema: &TransitionSchema) -> Result<TransitionSchema> {
        let fields: Vec<Field> = schema
            .arrow_schema()
            .fields()
            .iter()
            .filter(|f| !self.cameras.iter().any(|c| &c.key == f.name()))
            .map(|f| f.as_ref().clone())
            .collect();
        TransitionSchema::try_from_arrow(&Schema::new(fields))
    }

    /// The camera keys, in column order.
    pub(crate) fn keys(&self) -> Vec<String> {
        self.cameras.iter().map(|c| c.key.clone()).collect()
    }
}

/// The RGB frames `[len(times), H, W, 3]` of one camera's clip at `times` (seconds in the
/// episode), through `open` (the camera's last file, reopened when the clip is in another).
fn camera_frames(
    camera: &Camera,
    open: &mut Option<VideoFile>,
    clip: &Clip,
    times: &[f64],
) -> Result<Vec<u8>> {
    let shape = &camera.shape;
    if open.as_ref().is_none_or(|v| v.track().path != clip.path) {
        *open = Some(VideoFile::open(&clip.path)?);
    }
    let video = open.as_mut().expect("opened above");
    let t = video.track();
    let (tw, th) = (t.width as usize, t.height as usize);
    if (th, tw) != (shape[0], shape[1]) {
        return Err(bad(
            &clip.path,
            format!("frames of {tw}x{th}; meta/info.json gives the camera the shape {shape:?}"),
        ));
    }
    let want = times.len();
    let to = clip.to.unwrap_or(f64::INFINITY);
    let have = video.frames_between(clip.from, to, TOLERANCE_S);
    if have != want {
        return Err(bad(
            &clip.path,
            match clip.to {
                Some(to) => format!(
                    "{have} frames from {:.6}s to {to:.6}s (from_timestamp .. to_timestamp of \
                     meta/episodes), the episode has {want}",
                    clip.from
                ),
                None => format!("{have} frames, the episode has {want}"),
            },
        ));
    }
    let wanted = times
        .iter()
        .map(|&ts| video.sample_at(clip.from + ts, TOLERANCE_S))
        .collect::<Result<Vec<_>>>()?;
    let pictures = video.decode(&wanted)?;
    let len: usize = shape.iter().product();
    let mut out = vec![0u8; len * want];
    for (k, p) in pictures.iter().enumerate() {
        if (p.height, p.width) != (shape[0], shape[1]) {
            return Err(bad(
                &clip.path,
                format!("a decoded frame of {}x{}", p.width, p.height),
            ));
        }
        p.to_rgb(&mut out[k * len..(k + 1) * len])
            .map_err(|e| e.in_input(clip.path.display()))?;
    }
    Ok(out)
}

impl EpisodeColumns for Cameras {
    fn attach(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        let n = batch.num_rows();
        let column = |name: &str, dt: &DataType| -> Result<ArrayRef> {
            let a = batch.column_by_name(name).ok_or_else(|| {
                Error::schema(
                    name,
                    "LeRobot's cameras are read by `episode_index` and `timestamp`: keep both",
                )
            })?;
            Ok(arrow::compute::cast(a, dt)?)
        };
        let ids = column(crate::ingest::SOURCE_EPISODE, &DataType::Int64)?;
        let id = ids.as_primitive::<Int64Type>().value(0);
        let ts = column(TIMESTAMP, &DataType::Float64)?;
        let ts = ts.as_primitive::<Float64Type>();
        // LeRobot's timestamps are float32: as Python's `float(ts)` widens them.
        let times: Vec<f64> = ts.values().to_vec();
        let ep = self.episodes.get(&id).cloned().ok_or_else(|| {
            Error::invalid_data("the episode is not in meta/episodes").in_episode(id)
        })?;
        if ep.length != n as i64 {
            return Err(Error::invalid_data(format!(
                "meta/episodes gives the episode {} frames, data/ has {n} rows",
                ep.length
            ))
            .in_episode(id));
        }
        let (schema, mut columns) = (batch.schema(), batch.columns().to_vec());
        let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
        // The cameras decode in parallel (each has its own file and decoder).
        let decoded: Vec<Result<Vec<u8>>> = self
            .cameras
            .par_iter()
            .zip(self.open.par_iter_mut())
            .zip(ep.clips.par_iter())
            .map(|((camera, open), clip)| {
                camera_frames(camera, open, clip, &times)
                    .map_err(|e| e.in_column(&camera.key).in_episode(id))
            })
            .collect();
        for (camera, raw) in self.cameras.iter().zip(decoded) {
            let raw = raw?;
            let field = tensor_field(&camera.key, DataType::UInt8, &camera.shape, false)?;
            let DataType::FixedSizeList(item, size) = field.data_type().clone() else {
                unreachable!("a tensor field is a fixed-size list")
            };
            columns.push(Arc::new(FixedSizeListArray::try_new(
                item,
                size,
                Arc::new(UInt8Array::from(raw)),
                None,
            )?));
            fields.push(field);
        }
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns,
        )?)
    }
}

/// `[H, W, 3]` from a video feature's `shape` (and `names`, which say whether it is channels
/// first).
fn camera_shape(info: &Path, key: &str, f: &serde_json::Value) -> Result<Vec<usize>> {
    let shape: Vec<usize> = f
        .get("shape")
        .and_then(|s| s.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|d| d.as_u64().map(|d| d as usize))
                .collect()
        })
        .unwrap_or_default();
    let names: Vec<&str> = f
        .get("names")
        .and_then(|s| s.as_array())
        .map(|a| a.iter().filter_map(|d| d.as_str()).collect())
        .unwrap_or_default();
    let hwc = match (shape.as_slice(), names.first().copied()) {
        ([c, h, w], Some("channels" | "channel")) => vec![*h, *w, *c],
        ([h, w, c], _) => vec![*h, *w, *c],
        _ => {
            return Err(bad(info, format!("camera `{key}` has shape {shape:?}")).in_column(key));
        }
    };
    if hwc[2] != 3 || hwc[0] == 0 || hwc[1] == 0 {
        return Err(bad(
            info,
            format!("camera `{key}` has shape {shape:?}: trajstore reads RGB videos ([H, W, 3])"),
        )
        .in_column(key));
    }
    Ok(hwc)
}

/// The `.parquet` files under `dir`, sorted.
fn parquet_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let p = e.map_err(|e| Error::io(&d, e))?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn episodes_v3(
    root: &Path,
    cameras: &[Camera],
    video_path: &str,
) -> Result<HashMap<i64, EpisodeMeta>> {
    let dir = root.join("meta").join("episodes");
    let files = if dir.is_dir() {
        parquet_under(&dir)?
    } else {
        vec![]
    };
    if files.is_empty() {
        return Err(bad(
            &dir,
            "a LeRobot v3 dataset without meta/episodes/*.parquet",
        ));
    }
    let mut out = HashMap::new();
    for path in files {
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.build())
            .map_err(|e| bad(&path, format!("not a readable Parquet file: {e}")))?;
        for batch in reader {
            let batch = batch.map_err(|e| bad(&path, format!("does not decode: {e}")))?;
            let col = |name: &str, dt: &DataType| -> Result<ArrayRef> {
                let a = batch
                    .column_by_name(name)
                    .ok_or_else(|| bad(&path, "no such column").in_column(name))?;
                if a.null_count() > 0 {
                    return Err(bad(&path, "has nulls").in_column(name));
                }
                arrow::compute::cast(a, dt).map_err(|e| bad(&path, e.to_string()).in_column(name))
            };
            let ids = col("episode_index", &DataType::Int64)?;
            let lengths = col("length", &DataType::Int64)?;
            let mut per_camera = vec![];
            for c in cameras {
                let k = |what: &str| format!("videos/{}/{what}", c.key);
                per_camera.push((
                    col(&k("chunk_index"), &DataType::Int64)?,
                    col(&k("file_index"), &DataType::Int64)?,
                    col(&k("from_timestamp"), &DataType::Float64)?,
                    col(&k("to_timestamp"), &DataType::Float64)?,
                ));
            }
            for row in 0..batch.num_rows() {
                let id = ids.as_primitive::<Int64Type>().value(row);
                let mut clips = vec![];
                for (c, (chunk, file, from, to)) in cameras.iter().zip(&per_camera) {
                    let chunk = chunk.as_primitive::<Int64Type>().value(row);
                    let fi = file.as_primitive::<Int64Type>().value(row);
                    let rel = format_template(
                        video_path,
                        &[
                            ("video_key", c.key.as_str(), 0),
                            ("chunk_index", "", chunk),
                            ("file_index", "", fi),
                        ],
                    )
                    .ok_or_else(|| {
                        bad(
                            &root.join("meta").join("info.json"),
                            format!("video_path `{video_path}` is not a template trajstore fills"),
                        )
                    })?;
                    clips.push(Clip {
                        path: root.join(rel),
                        from: from.as_primitive::<Float64Type>().value(row),
                        to: Some(to.as_primitive::<Float64Type>().value(row)),
                    });
                }
                let length = lengths.as_primitive::<Int64Type>().value(row);
                if out.insert(id, EpisodeMeta { length, clips }).is_some() {
                    return Err(bad(&path, "the episode appears twice").in_episode(id));
                }
            }
        }
    }
    Ok(out)
}

fn episodes_v2(
    root: &Path,
    cameras: &[Camera],
    video_path: &str,
    chunks_size: i64,
) -> Result<HashMap<i64, EpisodeMeta>> {
    let path = root.join("meta").join("episodes.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let mut out = HashMap::new();
    for (k, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| bad(&path, format!("line {}: not JSON: {e}", k + 1)))?;
        let (Some(id), Some(length)) = (
            v.get("episode_index").and_then(|x| x.as_i64()),
            v.get("length").and_then(|x| x.as_i64()),
        ) else {
            return Err(bad(
                &path,
                format!("line {}: no integer `episode_index` and `length`", k + 1),
            ));
        };
        let clips = cameras
            .iter()
            .map(|c| {
                let rel = format_template(
                    video_path,
                    &[
                        ("video_key", c.key.as_str(), 0),
                        ("episode_chunk", "", id / chunks_size),
                        ("episode_index", "", id),
                    ],
                )
                .ok_or_else(|| {
                    bad(
                        &root.join("meta").join("info.json"),
                        format!("video_path `{video_path}` is not a template trajstore fills"),
                    )
                })?;
                Ok(Clip {
                    path: root.join(rel),
                    from: 0.0,
                    to: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out.insert(id, EpisodeMeta { length, clips });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::format_template;

    #[test]
    fn templates_fill_like_python() {
        let t = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4";
        let v = [
            ("video_key", "cam", 0),
            ("chunk_index", "", 2),
            ("file_index", "", 17),
        ];
        assert_eq!(
            format_template(t, &v).unwrap(),
            "videos/cam/chunk-002/file-017.mp4"
        );
        assert_eq!(format_template("{nope}", &v), None);
    }
}
