//! The pristine inputs and dataset files of the mutation test: small valid inputs of each
//! ingest format (directories of `.npz` shards included), a dataset of tensors, a dataset of
//! frames (its zstd dictionary, a segment and an episode table of encoded frames), a DQN Replay
//! directory (its gzipped `.npy` files, damaged both as gzip streams and inside) and an RLDS
//! directory written by tfds (a TFRecord shard, its length and CRC fields, and the JSON files).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Field};
use trajstore::Dataset;
use trajstore::ingest::InputFormat;

use super::{Kind, Target};
use crate::common::{TestData, copy_tree, fixture_path};

/// A D4RL-style batch: observations [3], actions [2], rewards, terminals, timeouts.
fn d4rl_batch(rows: usize) -> RecordBatch {
    let fsl = |n: i32, v: Vec<f32>| -> ArrayRef {
        Arc::new(FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, false)),
            n,
            Arc::new(Float32Array::from(v)),
            None,
        ))
    };
    RecordBatch::try_from_iter([
        (
            "observations",
            fsl(3, (0..rows * 3).map(|i| i as f32).collect()),
        ),
        (
            "actions",
            fsl(2, (0..rows * 2).map(|i| -(i as f32)).collect()),
        ),
        (
            "rewards",
            Arc::new(Float32Array::from_iter_values(
                (0..rows).map(|i| i as f32 * 0.5),
            )) as ArrayRef,
        ),
        (
            "terminals",
            Arc::new(BooleanArray::from_iter(
                (0..rows).map(|i| Some(i % 37 == 36)),
            )) as ArrayRef,
        ),
        (
            "timeouts",
            Arc::new(BooleanArray::from_iter(
                (0..rows).map(|i| Some(i % 50 == 49)),
            )) as ArrayRef,
        ),
    ])
    .unwrap()
}

/// Writes the pristine inputs and dataset under `dir`; returns the targets.
pub(super) fn targets(dir: &Path) -> Vec<Target> {
    let pristine = dir.join("pristine");
    std::fs::create_dir_all(&pristine).unwrap();
    let batch = d4rl_batch(200);
    let halves = [batch.slice(0, 120), batch.slice(120, 80)];

    let parquet = pristine.join("d4rl.parquet");
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(120))
        .build();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        File::create(&parquet).unwrap(),
        batch.schema(),
        Some(props),
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let arrow_file = pristine.join("d4rl.arrow");
    let mut w = arrow::ipc::writer::FileWriter::try_new(
        File::create(&arrow_file).unwrap(),
        &batch.schema(),
    )
    .unwrap();
    for h in &halves {
        w.write(h).unwrap();
    }
    w.finish().unwrap();

    let stream = pristine.join("d4rl.arrows");
    let mut w =
        arrow::ipc::writer::StreamWriter::try_new(File::create(&stream).unwrap(), &batch.schema())
            .unwrap();
    for h in &halves {
        w.write(h).unwrap();
    }
    w.finish().unwrap();

    let copy = |from: PathBuf, name: &str| {
        let to = pristine.join(name);
        if from.is_dir() {
            copy_tree(&from, &to);
        } else {
            std::fs::copy(&from, &to).unwrap();
        }
        to
    };
    let npz = copy(fixture_path("numpy", "d4rl.npz"), "d4rl.npz");
    let npz_z = copy(
        fixture_path("numpy", "d4rl_compressed.npz"),
        "d4rl_compressed.npz",
    );
    let npy_dir = copy(fixture_path("numpy", "d4rl_dir"), "npy_dir");
    let dump = copy(fixture_path("torchrl", "dump"), "torchrl_dump");
    let h5 = copy(fixture_path("hdf5", "d4rl.hdf5"), "d4rl.hdf5");
    let minari = copy(fixture_path("minari", "pendulum"), "minari_pendulum");
    // Directories of .npz shards: OGBench's own (deflated), and stored ones of both conventions.
    let ogbench = copy(fixture_path("ogbench", "scene-sharded"), "ogbench_shards");
    let stored = pristine.join("npz_shards");
    let episodes = pristine.join("npz_episodes");
    {
        use crate::ingest::npz_dir::{episode_file, ogbench_arrays, write_npz};
        std::fs::create_dir_all(&stored).unwrap();
        std::fs::create_dir_all(&episodes).unwrap();
        write_npz(&stored.join("s-0.npz"), &ogbench_arrays(0, &[9, 7]));
        write_npz(&stored.join("s-1.npz"), &ogbench_arrays(16, &[8, 12]));
        for i in 0..3 {
            write_npz(
                &episodes.join(format!("ep_{i}.npz")),
                &episode_file(i, 6 + i),
            );
        }
    }

    let ds = pristine.join("dataset.trajstore");
    TestData::new()
        .obs_dim(3)
        .act_dim(2)
        .seed(19)
        .transitions(400)
        .mean_episode_len(25.0)
        .segment_bytes(8 << 10)
        .batch_bytes(2 << 10)
        .commit_every(6)
        .write(&ds);
    let versions = Dataset::open(&ds).unwrap().versions().unwrap();
    let latest = ds.join(format!("_versions/{:020}.json", versions.last().unwrap()));
    assert!(latest.is_file(), "{}", latest.display());
    let seg = ds.join("segments/00000000000000000000.arrow");
    let eps = ds.join("segments/00000000000000000000.episodes.arrow");
    assert!(seg.is_file() && eps.is_file());

    use InputFormat as F;
    let one = |name, path: &PathBuf, kind| Target::new(name, path.clone(), path.clone(), kind);
    vec![
        one("parquet", &parquet, Kind::Ingest(F::Parquet, "parquet")),
        one("arrow file", &arrow_file, Kind::Ingest(F::Arrow, "arrow")),
        one("arrow stream", &stream, Kind::Ingest(F::Arrow, "arrow")),
        one("npz", &npz, Kind::Ingest(F::Numpy, "numpy")),
        one("npz deflated", &npz_z, Kind::Ingest(F::Numpy, "numpy")),
        Target::new(
            "npy dir",
            npy_dir.clone(),
            npy_dir.join("observations.npy"),
            Kind::Ingest(F::Numpy, "numpy"),
        ),
        Target::new(
            "npy dir (flags)",
            npy_dir.clone(),
            npy_dir.join("terminals.npy"),
            Kind::Ingest(F::Numpy, "numpy"),
        ),
        Target::new(
            "torchrl meta",
            dump.clone(),
            dump.join("storage/meta.json"),
            Kind::Ingest(F::TorchRl, "torchrl"),
        ),
        Target::new(
            "torchrl nested meta",
            dump.clone(),
            dump.join("storage/next/meta.json"),
            Kind::Ingest(F::TorchRl, "torchrl"),
        ),
        Target::new(
            "torchrl storage metadata",
            dump.clone(),
            dump.join("storage/storage_metadata.json"),
            Kind::Ingest(F::TorchRl, "torchrl"),
        ),
        Target::new(
            "torchrl writer metadata",
            dump.clone(),
            dump.join("writer/metadata.json"),
            Kind::Ingest(F::TorchRl, "torchrl"),
        ),
        Target::new(
            "torchrl memmap",
            dump.clone(),
            dump.join("storage/next/reward.memmap"),
            Kind::Ingest(F::TorchRl, "torchrl"),
        ),
        Target::new(
            "npz shards (ogbench)",
            ogbench.clone(),
            ogbench.join("scene-play-v0-1.npz"),
            Kind::Ingest(F::Numpy, "numpy"),
        ),
        Target::new(
            "npz shards (stored)",
            stored.clone(),
            stored.join("s-1.npz"),
            Kind::Ingest(F::Numpy, "numpy"),
        ),
        Target::new(
            "npz episode files",
            episodes.clone(),
            episodes.join("ep_1.npz"),
            Kind::Ingest(F::Numpy, "numpy"),
        ),
        one("hdf5 d4rl", &h5, Kind::Ingest(F::Hdf5, "hdf5")),
        Target::new(
            "hdf5 minari",
            minari.clone(),
            minari.join("data/main_data.hdf5"),
            Kind::Ingest(F::Hdf5, "hdf5"),
        ),
        Target::new("segment", ds.clone(), seg, Kind::Dataset),
        Target::new("episode table", ds.clone(), eps, Kind::Dataset),
        Target::new("manifest", ds.clone(), latest, Kind::Dataset),
    ]
    .into_iter()
    .chain(frame_targets(&pristine))
    .chain(dqn_targets(&pristine))
    .chain(rlds_targets(&pristine))
    .chain(video_targets(&pristine))
    .chain(image_targets(&pristine))
    .collect()
}

/// A LeRobot v3 dataset's MP4s (AV1 and H.264), `meta/info.json` and `meta/episodes` Parquet
/// file, ingested with their cameras (feature `video`).
#[cfg(feature = "video")]
fn video_targets(pristine: &Path) -> Vec<Target> {
    let copy = |name: &str| {
        let to = pristine.join(format!("lerobot_{name}"));
        copy_tree(&fixture_path("lerobot_video", name), &to);
        to
    };
    let (av1, h264) = (copy("v3_av1"), copy("v3_h264"));
    let kind = Kind::Ingest(InputFormat::Parquet, "parquet");
    let top = "videos/observation.images.top/chunk-000/file-000.mp4";
    vec![
        Target::new("lerobot av1 mp4", av1.clone(), av1.join(top), kind),
        Target::new("lerobot h264 mp4", h264.clone(), h264.join(top), kind),
        Target::new(
            "lerobot info.json",
            av1.clone(),
            av1.join("meta/info.json"),
            kind,
        ),
        Target::new(
            "lerobot meta/episodes",
            av1.clone(),
            av1.join("meta/episodes/chunk-000/file-000.parquet"),
            kind,
        ),
    ]
}

/// A LeRobot v3 dataset whose cameras are `image` features: PNG bytes inside its data Parquet
/// file (and its `meta/info.json`), ingested without any feature.
fn image_targets(pristine: &Path) -> Vec<Target> {
    let root = pristine.join("lerobot_images");
    copy_tree(&fixture_path("lerobot_images", "v3"), &root);
    let kind = Kind::Ingest(InputFormat::Parquet, "parquet");
    vec![
        Target::new(
            "lerobot image parquet",
            root.clone(),
            root.join("data/chunk-000/file-000.parquet"),
            kind,
        ),
        Target::new(
            "lerobot image info.json",
            root.clone(),
            root.join("meta/info.json"),
            kind,
        ),
    ]
}

#[cfg(not(feature = "video"))]
fn video_targets(_: &Path) -> Vec<Target> {
    vec![]
}

/// Where the buffers of a frame column lie in a transition file: the first record batch's
/// `large_binary` offsets (`8 * (rows + 1)` bytes) and values, as file byte ranges.
fn frame_buffers(file: &Path) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let bytes = std::fs::read(file).unwrap();
    let mut r = arrow::ipc::reader::FileReader::try_new(File::open(file).unwrap(), None).unwrap();
    let batch = r.next().unwrap().unwrap();
    let col = batch.column_by_name("observation").unwrap();
    let a = col
        .as_any()
        .downcast_ref::<arrow::array::LargeBinaryArray>()
        .unwrap();
    let offsets: Vec<u8> = a
        .value_offsets()
        .iter()
        .flat_map(|o| o.to_le_bytes())
        .collect();
    let values = a.value_data();
    let find = |needle: &[u8]| {
        let at = super::find_all(&bytes, needle);
        assert_eq!(at.len(), 1, "one copy of the buffer in {}", file.display());
        at[0]
    };
    let o = find(&offsets);
    let v = find(&values[..values.len().min(256)]);
    (o..o + offsets.len(), v..v + values.len())
}

/// A zstd-dict frame dataset (84x84 Atari-like frames, final frames kept): its dictionary,
/// its segment (flips landing in the frame offsets and values, offsets set to extremes) and
/// its episode table (the final frames).
fn frame_targets(pristine: &Path) -> Vec<Target> {
    use trajstore::frames::FrameCodec;
    let shape = [84, 84];
    let root = pristine.join("frames.trajstore");
    let schema = crate::store::frames::frame_schema(FrameCodec::ZstdDict, &shape);
    let ds = Dataset::create(&root, &schema).unwrap();
    crate::store::frames::write_episodes(&ds, &shape, 10, 30);
    let snap = ds.snapshot().unwrap();
    let spec = &snap.frame_column("observation").unwrap().spec;
    let dict = root.join(&spec.dictionary.as_ref().expect("a dictionary").path);
    let e = &snap.manifest().segments[0];
    let (seg, eps) = (root.join(&e.path), root.join(&e.episodes_path));
    let mut segment = Target::new("frame segment", root.clone(), seg.clone(), Kind::Dataset);
    let (offsets, values) = frame_buffers(&seg);
    segment.fields = offsets
        .clone()
        .step_by(8)
        .enumerate()
        .filter(|(i, _)| i % 7 < 2)
        .map(|(_, at)| (at, 8))
        .collect();
    segment.structure = vec![offsets, values];
    vec![
        Target::new("frame dictionary", root.clone(), dict, Kind::Dataset),
        segment,
        Target::new("frame episode table", root, eps, Kind::Dataset),
    ]
}

/// A DQN Replay directory (`scripts/dqn_replay_fixture.py`, three checkpoints): the observation
/// and action files damaged as gzip streams, and the observation, terminal and add-count arrays
/// damaged inside (shapes, lengths, values). None without a Python with NumPy.
fn dqn_targets(pristine: &Path) -> Vec<Target> {
    let root = pristine.join("dqn");
    std::fs::create_dir_all(&root).unwrap();
    let args = ["--capacity", "240", "--shape", "16", "12"];
    if crate::ingest::dqn::fixture(&root, &args).is_none() {
        return vec![];
    }
    let mut cks: Vec<u64> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().to_string();
            let n = name.strip_prefix("$store$_observation_ckpt.")?;
            n.strip_suffix(".gz")?.parse().ok()
        })
        .collect();
    cks.sort();
    let file = |name: &str, ck: u64| root.join(format!("{name}_ckpt.{ck}.gz"));
    let (first, last) = (cks[0], *cks.last().unwrap());
    let obs = file("$store$_observation", first);
    vec![
        Target::new("dqn observation gz", root.clone(), obs.clone(), Kind::Dqn),
        Target::new(
            "dqn action gz",
            root.clone(),
            file("$store$_action", last),
            Kind::Dqn,
        ),
        Target::gzip_inner("dqn observation npy", root.clone(), obs, Kind::Dqn),
        Target::gzip_inner(
            "dqn terminal npy",
            root.clone(),
            file("$store$_terminal", last),
            Kind::Dqn,
        ),
        Target::gzip_inner(
            "dqn add_count npy",
            root.clone(),
            file("add_count", first),
            Kind::Dqn,
        ),
    ]
}

/// The RLDS fixture written by tfds (`tests/data/rlds/rlds_robot`: PNG and JPEG images): a
/// TFRecord shard (flips half the time in its record headers; its length and CRC fields set to
/// extremes) and the numbers of `features.json` and `dataset_info.json`.
fn rlds_targets(pristine: &Path) -> Vec<Target> {
    let root = pristine.join("rlds_robot");
    copy_tree(&fixture_path("rlds", "rlds_robot"), &root);
    let dir = root.join("1.0.0");
    let shard = dir.join("rlds_robot-train.tfrecord-00000-of-00002");
    let bytes = std::fs::read(&shard).unwrap();
    let mut shard_target = Target::new("rlds tfrecord shard", root.clone(), shard, Kind::Rlds);
    let mut at = 0;
    while at + 12 <= bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        shard_target
            .fields
            .extend([(at, 8), (at + 8, 4), (at + 12 + len, 4)]);
        shard_target.structure.push(at..at + 12);
        at += 16 + len;
    }
    assert_eq!(at, bytes.len(), "the shard is whole records");
    vec![
        shard_target,
        Target::new(
            "rlds features.json",
            root.clone(),
            dir.join("features.json"),
            Kind::Rlds,
        ),
        Target::new(
            "rlds dataset_info.json",
            root.clone(),
            dir.join("dataset_info.json"),
            Kind::Rlds,
        ),
    ]
}
