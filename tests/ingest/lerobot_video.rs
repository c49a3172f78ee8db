//! LeRobot datasets with cameras (feature `video`), from `tests/data/lerobot_video/` (written by
//! `tests/python/make_lerobot_video_fixtures.py` with PyAV, as LeRobot's writer writes them):
//! v3 with AV1 (two cameras, several episodes per MP4, one camera's episodes over two files),
//! v3 with H.264, v2.1 (one MP4 per episode). The decoded planes equal PyAV's (libdav1d and
//! FFmpeg's H.264 decoder), the stored RGB frames equal PyAV's `to_ndarray(format="rgb24")`
//! exactly (tolerance 0), episode boundaries and lengths are meta/episodes', and a truncated MP4,
//! a timestamp with no frame and a frame count that does not match are errors naming the file,
//! the camera and the episode, with nothing committed.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{AsArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Float64Type, Int64Type};
use trajstore::ingest::{IngestOptions, InputFormat, infer_schema, ingest};
use trajstore::video::{ColourSpace, VideoFile, YuvToRgb};
use trajstore::{Dataset, Error, Snapshot};

use super::lerobot_images::stored_frames;
use crate::common::{copy_tree, fixture_path, small_segments};

const TOP: &str = "observation.images.top";
const WRIST: &str = "observation.images.wrist";
const H: usize = 24;
const W: usize = 32;

/// An array of `expected/` (PyAV's frames): its bytes and shape.
fn expected(name: &str) -> (Vec<u8>, Vec<usize>) {
    let dir = fixture_path("lerobot_video", "expected");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("index.json")).unwrap()).unwrap();
    let e = &index[name];
    let mut out = vec![];
    flate2::read::GzDecoder::new(
        std::fs::File::open(dir.join(e["file"].as_str().unwrap())).unwrap(),
    )
    .read_to_end(&mut out)
    .unwrap();
    let shape: Vec<usize> = e["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(out.len(), shape.iter().product::<usize>(), "{name}");
    (out, shape)
}

fn ingest_dir(input: &Path, out: &Path) -> trajstore::Result<trajstore::ingest::IngestReport> {
    ingest(
        input,
        InputFormat::detect(input).unwrap(),
        out,
        &IngestOptions::default(),
        small_segments(),
    )
}

fn lengths(snap: &Snapshot) -> Vec<u64> {
    snap.episodes().lengths().to_vec()
}

/// `yuv420p` planes (`[rows, H * 3 / 2, W]`) to RGB with trajstore's conversion.
fn rgb_of(yuv: &[u8]) -> Vec<u8> {
    let conv = YuvToRgb::new(ColourSpace {
        matrix: 2,
        full_range: false,
    })
    .unwrap();
    let n = H * W * 3 / 2;
    let mut out = vec![0u8; yuv.len() / n * H * W * 3];
    for (k, f) in yuv.chunks_exact(n).enumerate() {
        let (y, rest) = f.split_at(H * W);
        let (u, v) = rest.split_at(H * W / 4);
        conv.convert(
            (W, H),
            (y, W),
            (u, W / 2),
            (v, W / 2),
            &mut out[k * H * W * 3..(k + 1) * H * W * 3],
        );
    }
    out
}

#[test]
fn v3_av1_two_cameras_store_pyavs_frames_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let input = fixture_path("lerobot_video", "v3_av1");
    let out = dir.path().join("ds");
    let schema = infer_schema(&input, InputFormat::Parquet, &IngestOptions::default()).unwrap();
    let frames: Vec<&str> = schema.frame_columns().iter().map(|(n, _)| *n).collect();
    assert_eq!(frames, [TOP, WRIST]);
    let r = ingest_dir(&input, &out).unwrap();
    assert_eq!((r.rows, r.episodes), (24, 3));
    assert!(r.columns.contains(&(TOP.into(), format!("videos/{TOP}"))));
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(lengths(&snap), [8, 6, 10], "meta/episodes' lengths");
    // The observation is still `observation.state`; the cameras are frame columns.
    assert_eq!(snap.schema().observation_shape(), &[3]);
    for key in [TOP, WRIST] {
        let col = snap.frame_column(key).unwrap();
        assert_eq!(col.spec.shape, [H, W, 3]);
        let got = stored_frames(&snap, key);
        let (want, shape) = expected(&format!("v3_av1/{key}/rgb"));
        assert_eq!(shape, [24, H, W, 3]);
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap();
        assert_eq!(diff, 0, "{key}: max abs difference from PyAV's rgb24");
        // And trajstore's conversion of PyAV's own planes is PyAV's RGB.
        let (yuv, _) = expected(&format!("v3_av1/{key}/yuv"));
        assert!(rgb_of(&yuv) == want, "{key}: conversion of PyAV's planes");
    }
    // Episode ids and timestamps are kept; step t of episode e is data row t.
    let e1 = snap.episode(1).unwrap().unwrap();
    let src = arrow::compute::cast(
        e1.column_by_name("source_episode").unwrap(),
        &DataType::Int64,
    )
    .unwrap();
    assert!(
        src.as_primitive::<Int64Type>()
            .values()
            .iter()
            .all(|&v| v == 1)
    );
}

#[test]
fn decoded_planes_equal_pyavs_for_av1_and_h264() {
    // Every frame of each camera, file after file (episodes in order), in presentation order.
    let cases: [(&str, &str, Vec<PathBuf>); 4] = [
        (
            "v3_av1",
            TOP,
            vec![fixture_path(
                "lerobot_video",
                &format!("v3_av1/videos/{TOP}/chunk-000/file-000.mp4"),
            )],
        ),
        (
            "v3_av1",
            WRIST,
            (0..2)
                .map(|i| {
                    fixture_path(
                        "lerobot_video",
                        &format!("v3_av1/videos/{WRIST}/chunk-000/file-{i:03}.mp4"),
                    )
                })
                .collect(),
        ),
        (
            "v3_h264",
            TOP,
            vec![fixture_path(
                "lerobot_video",
                &format!("v3_h264/videos/{TOP}/chunk-000/file-000.mp4"),
            )],
        ),
        (
            "v21_av1",
            TOP,
            (0..2)
                .map(|i| {
                    fixture_path(
                        "lerobot_video",
                        &format!("v21_av1/videos/chunk-000/{TOP}/episode_{i:06}.mp4"),
                    )
                })
                .collect(),
        ),
    ];
    for (ds, key, files) in cases {
        let mut got = vec![];
        for f in &files {
            let mut v = VideoFile::open(f).unwrap();
            let t = v.track();
            assert_eq!((t.width, t.height), (W as u32, H as u32));
            assert_ne!(t.timescale, 10, "the stream's own time base, not 1/fps");
            let mut order: Vec<usize> = (0..t.samples.len()).collect();
            order.sort_by_key(|&i| t.samples[i].pts);
            for p in v.decode(&order).unwrap() {
                got.extend(p.planes());
            }
        }
        let (want, _) = expected(&format!("{ds}/{key}/yuv"));
        assert!(got == want, "{ds} {key}: decoded planes differ from PyAV's");
    }
}

#[test]
fn v3_h264_and_v21_ingest_frame_accurately() {
    for ds in ["v3_h264", "v21_av1"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ds");
        let r = ingest_dir(&fixture_path("lerobot_video", ds), &out).unwrap();
        let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
        let want_lengths: &[u64] = if ds == "v3_h264" { &[7, 9] } else { &[5, 7] };
        assert_eq!(lengths(&snap), want_lengths, "{ds}");
        assert_eq!(r.rows, want_lengths.iter().sum::<u64>());
        let (yuv, _) = expected(&format!("{ds}/{TOP}/yuv"));
        assert!(stored_frames(&snap, TOP) == rgb_of(&yuv), "{ds}: frames");
    }
}

/// A copy of the v3 AV1 fixture to damage.
fn damaged_copy(dir: &Path) -> PathBuf {
    let root = dir.join("lerobot_av1");
    copy_tree(&fixture_path("lerobot_video", "v3_av1"), &root);
    root
}

/// The error of ingesting `input`, which must leave no dataset behind.
fn ingest_error(input: &Path, dir: &Path) -> Error {
    let out = dir.join("out");
    let err = ingest_dir(input, &out).unwrap_err();
    assert!(!out.exists(), "a failed ingest leaves nothing: {err}");
    err
}

fn assert_names(err: &Error, file: &str, camera: &str, episode: i64, what: &str) {
    let Error::InvalidData {
        input,
        column,
        episode: ep,
        reason,
    } = err
    else {
        panic!("not InvalidData: {err}");
    };
    assert!(input.as_deref().is_some_and(|i| i.ends_with(file)), "{err}");
    assert_eq!(column.as_deref(), Some(camera), "{err}");
    assert_eq!(*ep, Some(episode), "{err}");
    assert!(reason.contains(what), "{err}");
}

#[test]
fn a_truncated_mp4_is_an_error_naming_file_camera_and_episode() {
    let dir = tempfile::tempdir().unwrap();
    let root = damaged_copy(dir.path());
    let mp4 = root.join(format!("videos/{WRIST}/chunk-000/file-001.mp4"));
    let bytes = std::fs::read(&mp4).unwrap();
    std::fs::write(&mp4, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let err = ingest_error(&root, dir.path());
    // file-001 holds episode 2 of the wrist camera.
    assert_names(&err, "file-001.mp4", WRIST, 2, "truncated");
}

#[test]
fn a_timestamp_without_a_frame_is_an_error_naming_file_camera_and_episode() {
    let dir = tempfile::tempdir().unwrap();
    let root = damaged_copy(dir.path());
    let data = root.join("data/chunk-000/file-000.parquet");
    let batches: Vec<RecordBatch> =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            std::fs::File::open(&data).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let batch = arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap();
    // Row 10 is step 2 of episode 1: 0.2 s becomes 0.25 s, halfway between two frames.
    let i = batch.schema().index_of("timestamp").unwrap();
    let mut ts: Vec<f32> = batch
        .column(i)
        .as_primitive::<arrow::datatypes::Float32Type>()
        .values()
        .to_vec();
    assert!((ts[10] - 0.2).abs() < 1e-6);
    ts[10] = 0.25;
    let mut columns = batch.columns().to_vec();
    columns[i] = Arc::new(Float32Array::from(ts));
    let batch = RecordBatch::try_new(batch.schema(), columns).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&data).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let err = ingest_error(&root, dir.path());
    assert_names(&err, "file-000.mp4", TOP, 1, "no frame at");
}

#[test]
fn a_frame_count_that_disagrees_with_meta_episodes_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = damaged_copy(dir.path());
    let meta = root.join("meta/episodes/chunk-000/file-000.parquet");
    let batch = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
        std::fs::File::open(&meta).unwrap(),
    )
    .unwrap()
    .build()
    .unwrap()
    .next()
    .unwrap()
    .unwrap();
    // Episode 0 of the top camera ends one frame early.
    let name = format!("videos/{TOP}/to_timestamp");
    let i = batch.schema().index_of(&name).unwrap();
    let mut to: Vec<f64> = batch
        .column(i)
        .as_primitive::<Float64Type>()
        .values()
        .to_vec();
    to[0] -= 0.1;
    let mut columns = batch.columns().to_vec();
    columns[i] = Arc::new(arrow::array::Float64Array::from(to));
    let batch = RecordBatch::try_new(batch.schema(), columns).unwrap();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&meta).unwrap(),
        batch.schema(),
        None,
    )
    .unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let err = ingest_error(&root, dir.path());
    assert_names(&err, "file-000.mp4", TOP, 0, "7 frames");
}

#[test]
fn dropping_a_camera_keeps_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let input = fixture_path("lerobot_video", "v3_av1");
    let opts = IngestOptions::default().with_drop_cols([WRIST]);
    ingest(&input, InputFormat::Parquet, &out, &opts, small_segments()).unwrap();
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let names: HashMap<String, ()> = snap
        .schema()
        .payload_schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), ()))
        .collect();
    assert!(names.contains_key(TOP) && !names.contains_key(WRIST));
    // Appending the same input again adds its episodes.
    ingest(&input, InputFormat::Parquet, &out, &opts, small_segments()).unwrap();
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(lengths(&snap), [8, 6, 10, 8, 6, 10]);
    let (want, _) = expected(&format!("v3_av1/{TOP}/rgb"));
    assert!(stored_frames(&snap, TOP) == [want.clone(), want].concat());
}

/// The cameras sample like any frame column: a batch of slices gathers each camera's frames of
/// the sampled steps (decoded by the gather).
#[test]
fn sampled_slices_carry_the_cameras_frames() {
    use trajstore::{Batch, Gatherer, Sampler, SamplerSpec, SliceSampler};
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    ingest_dir(&fixture_path("lerobot_video", "v3_av1"), &out).unwrap();
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let spec = SamplerSpec::uniform(4, 16).with_seed(7);
    let index = snap.slice_index(4, spec.policy).unwrap();
    let sampler = SliceSampler::try_new(index, snap.episodes(), &spec).unwrap();
    let gatherer = Gatherer::try_new(&snap, &[TOP, WRIST, "observation"]).unwrap();
    let (mut plan, mut batch) = (vec![], Batch::default());
    sampler.plan(0, &mut plan);
    gatherer.gather(&plan, &mut batch).unwrap();
    let starts = [0usize, 8, 14];
    let frame = H * W * 3;
    for key in [TOP, WRIST] {
        let (want, _) = expected(&format!("v3_av1/{key}/rgb"));
        let col = batch.column(key).unwrap();
        assert_eq!(col.shape, [H, W, 3]);
        let got = col.values::<u8>();
        for i in 0..batch.num_slices {
            let (ep, start) = (batch.episode_id[i] as usize, batch.start_step[i]);
            assert!(start >= 0);
            for t in 0..batch.slice_len {
                let row = starts[ep] + start as usize + t;
                let k = i * batch.slice_len + t;
                assert!(
                    got[k * frame..(k + 1) * frame] == want[row * frame..(row + 1) * frame],
                    "{key}: slice {i} step {t}"
                );
            }
        }
    }
}

/// The README's command: `trajstore ingest DIR DS` keeps the cameras.
#[test]
fn the_cli_ingests_a_lerobot_dataset_with_its_cameras() {
    let dir = tempfile::tempdir().unwrap();
    let input = fixture_path("lerobot_video", "v3_av1");
    let out = dir.path().join("ds");
    let (code, stdout, stderr) = crate::common::run_cli(&[
        "ingest",
        input.to_str().unwrap(),
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["rows"], 24);
    assert_eq!(report["columns"][TOP], format!("videos/{TOP}"));
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert!(snap.frame_column(WRIST).is_some());
}

/// Timing probe, run by hand (BENCHMARKS.md): libdav1d through `VideoFile::decode` on an MP4 of
/// `scripts/bench_lerobot_video.py --keep DIR` (`LEROBOT_BENCH_MP4=DIR/v3/videos/<key>/chunk-000/
/// file-000.mp4 cargo test --features video --test integration -- --ignored dav1d_timing
/// --nocapture`): sequential decoding, 256 random one-frame decodes (a decoder each, from the
/// key frame before), and the YUV -> RGB conversion.
#[test]
#[ignore]
fn dav1d_timing() {
    let Some(f) = std::env::var_os("LEROBOT_BENCH_MP4") else {
        return;
    };
    let mut v = VideoFile::open(Path::new(&f)).unwrap();
    let n = v.track().samples.len();
    let t0 = std::time::Instant::now();
    let all = v.decode(&(0..n).collect::<Vec<_>>()).unwrap();
    let seq = t0.elapsed().as_secs_f64();
    let mut x = 12345u64;
    let t0 = std::time::Instant::now();
    for _ in 0..256 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.decode(&[(x >> 33) as usize % n]).unwrap();
    }
    let rnd = t0.elapsed().as_secs_f64();
    let mut rgb = vec![0u8; all[0].width * all[0].height * 3];
    let t0 = std::time::Instant::now();
    for p in &all {
        p.to_rgb(&mut rgb).unwrap();
    }
    let conv = t0.elapsed().as_secs_f64() / n as f64;
    eprintln!(
        "{n} frames: sequential {:.0} frames/s; 256 random one-frame slices {:.3} s ({:.0} frames/s); \
         YUV -> RGB {:.2} ms per frame",
        n as f64 / seq,
        rnd,
        256.0 / rnd,
        conv * 1e3
    );
}
