//! Image observations: a synthetic Atari-like dataset (84×84×4 `uint8` frame stacks) written
//! through the library and through `trajstore demo`, reopened, and gathered: schema, shape and
//! type, frames equal to what the spec generated, the derived `next_observation` (the next
//! step's frames inside an episode, the episode table's `final_observation` at its end), the
//! same bytes whatever the number of threads, and `bench` on an image dataset with its batch
//! memory limit.

use std::path::Path;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, UInt8Type};
use trajstore::format::col;
use trajstore::synth::{ObsDtype, SynthSpec};
use trajstore::{Batch, Dataset, Gatherer, SliceRef, Snapshot, WriterOptions};

use crate::common::run_cli_env as run;
const SHAPE: [usize; 3] = [84, 84, 4];
const D: usize = 84 * 84 * 4;

fn atari(transitions: u64, seed: u64) -> SynthSpec {
    SynthSpec {
        transitions,
        obs_shape: SHAPE.to_vec(),
        obs_dtype: ObsDtype::UInt8,
        act_dim: 4,
        discrete_actions: true,
        mean_episode_len: 150.0,
        seed,
    }
}

/// Writes `spec` into `dir` with small segments (so that episodes spread over several).
fn write(spec: &SynthSpec, dir: &Path) -> Snapshot {
    let ds = Dataset::create(dir, &spec.schema().unwrap()).unwrap();
    let mut w = ds
        .writer(WriterOptions::default().with_segment_bytes(8 << 20))
        .unwrap();
    spec.write(&mut w, None, |_| {}).unwrap();
    drop(w);
    Dataset::open(dir).unwrap().snapshot().unwrap()
}

/// The observations (`[len, D]`, flat) and final observation of episode `i` as generated.
fn generated(spec: &SynthSpec, i: usize) -> (Vec<u8>, Vec<u8>) {
    let len = spec.episode_lengths().unwrap()[i];
    let (batch, end) = spec.episode(i as u64, len);
    let obs = batch.column_by_name(col::OBSERVATION).unwrap();
    let values = |a: &dyn Array| {
        a.as_fixed_size_list()
            .values()
            .as_primitive::<UInt8Type>()
            .values()
            .to_vec()
    };
    (
        values(obs.as_ref()),
        values(end.final_observation.unwrap().as_ref()),
    )
}

#[test]
fn an_atari_like_dataset_round_trips_and_gathers_its_frames() {
    let dir = tempfile::tempdir().unwrap();
    let spec = atari(2_000, 7);
    let snap = write(&spec, &dir.path().join("atari"));

    // Schema: uint8 observations of shape [84, 84, 4], as a fixed-size list of 28224.
    let schema = snap.schema();
    assert_eq!(schema.observation_shape(), &SHAPE);
    assert_eq!(schema.observation_len(), D);
    let DataType::FixedSizeList(item, n) = schema.observation_field().data_type() else {
        panic!("{:?}", schema.observation_field())
    };
    assert_eq!((item.data_type(), *n as usize), (&DataType::UInt8, D));
    let obs_col = schema
        .to_columns()
        .into_iter()
        .find(|c| c.name == col::OBSERVATION)
        .unwrap();
    assert_eq!(obs_col.data_type, format!("fixed_size_list<uint8>[{D}]"));
    assert_eq!(obs_col.shape.as_deref(), Some(&SHAPE[..]));
    assert!(!schema.has_next_observation());
    assert!((schema.row_bytes() - (D as f64 + 8.0 + 4.0 + 4.0 + 8.0 + 4.0 * 0.125)).abs() < 1e-9);
    assert_eq!(snap.num_transitions(), 2_000);
    let lens = spec.episode_lengths().unwrap();
    assert_eq!(snap.episodes().lengths(), &lens[..]);
    assert!(
        snap.segments().len() > 2,
        "{} segments",
        snap.segments().len()
    );

    // Frames look like frames: consecutive steps differ in a few pixels, and the frame stack
    // shifts by one frame per step.
    let (obs0, _) = generated(&spec, 0);
    let changed = (0..D).filter(|&k| obs0[k] != obs0[D + k]).count();
    assert!(
        changed > 0 && changed < D / 20,
        "{changed} of {D} values changed"
    );
    for t in 0..lens[0] as usize - 1 {
        let (a, b) = (&obs0[t * D..(t + 1) * D], &obs0[(t + 1) * D..(t + 2) * D]);
        for p in 0..D / 4 {
            assert_eq!(
                &b[p * 4..p * 4 + 3],
                &a[p * 4 + 1..p * 4 + 4],
                "step {t} pixel {p}"
            );
        }
    }

    // Gather: 2-step slices, at an episode's start, inside, and at its last step.
    let g = Gatherer::try_new(&snap, &[col::OBSERVATION, col::NEXT_OBSERVATION]).unwrap();
    let mut plan = vec![];
    for i in [0usize, 1, lens.len() / 2, lens.len() - 1] {
        let l = lens[i] as i64;
        for start in [0, l / 2, l - 2] {
            plan.push(SliceRef {
                episode: i as u32,
                start: start.max(0),
                len: 2,
            });
        }
    }
    let mut batch = Batch::default();
    g.gather(&plan, &mut batch).unwrap();
    assert_eq!(batch.columns[0].shape, SHAPE);
    assert_eq!(batch.columns[1].shape, SHAPE);
    assert_eq!(batch.columns[0].data_type, DataType::UInt8);
    let (obs, next) = (
        batch.columns[0].values::<u8>(),
        batch.columns[1].values::<u8>(),
    );
    for (k, s) in plan.iter().enumerate() {
        let (frames, final_obs) = generated(&spec, s.episode as usize);
        let n = lens[s.episode as usize] as usize;
        for j in 0..2 {
            let t = s.start as usize + j;
            let at = (k * 2 + j) * D;
            assert_eq!(batch.mask[k * 2 + j], u8::from(t < n));
            if t >= n {
                continue;
            }
            assert!(
                obs[at..at + D] == frames[t * D..(t + 1) * D],
                "slice {k} step {j}"
            );
            let want_next = if t + 1 < n {
                &frames[(t + 1) * D..(t + 2) * D]
            } else {
                // The episode's end: the final observation, as generated and as stored.
                assert_eq!(batch.is_last[k * 2 + j], 1);
                &final_obs[..]
            };
            assert!(next[at..at + D] == *want_next, "next of slice {k} step {j}");
        }
    }

    // The episode tables' final_observation is the generated one, for every episode.
    let mut i = 0;
    for seg in snap.segments() {
        let finals = seg.episode_table().final_observation().unwrap();
        let finals = finals.as_fixed_size_list();
        assert_eq!(finals.value_length() as usize, D);
        for r in 0..finals.len() {
            let stored = finals.value(r);
            assert_eq!(
                stored.as_primitive::<UInt8Type>().values()[..],
                generated(&spec, i).1[..],
                "episode {i}"
            );
            i += 1;
        }
    }
    assert_eq!(i, lens.len());
}

#[test]
fn image_bytes_do_not_depend_on_the_number_of_threads() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        mean_episode_len: 40.0,
        ..atari(600, 3)
    };
    let files = |threads: usize, name: &str| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let path = dir.path().join(name);
        pool.install(|| write(&spec, &path));
        let mut out = vec![];
        for e in std::fs::read_dir(path.join("segments")).unwrap() {
            let p = e.unwrap().path();
            out.push((
                p.file_name().unwrap().to_owned(),
                std::fs::read(&p).unwrap(),
            ));
        }
        out.sort();
        out
    };
    let one = files(1, "one");
    assert!(one.len() >= 2);
    assert!(one == files(3, "three"));
}

#[test]
fn other_shapes_and_types() {
    let dir = tempfile::tempdir().unwrap();
    // float32 frames (pixel / 255), one channel, and uint8 vectors (a quantized random walk).
    for (k, (shape, dtype)) in [
        (vec![10, 12], ObsDtype::Float32),
        (vec![6, 5, 3, 2], ObsDtype::UInt8),
        (vec![7], ObsDtype::UInt8),
    ]
    .into_iter()
    .enumerate()
    {
        let spec = SynthSpec {
            transitions: 300,
            obs_shape: shape.clone(),
            obs_dtype: dtype,
            act_dim: 2,
            discrete_actions: false,
            mean_episode_len: 30.0,
            seed: k as u64,
        };
        let snap = write(&spec, &dir.path().join(k.to_string()));
        assert_eq!(snap.schema().observation_shape(), &shape[..]);
        let g = Gatherer::try_new(&snap, &[col::OBSERVATION, col::NEXT_OBSERVATION]).unwrap();
        assert_eq!(g.columns().next().unwrap().1, &dtype.data_type());
        let mut batch = Batch::default();
        g.gather(
            &[SliceRef {
                episode: 0,
                start: 0,
                len: 3,
            }],
            &mut batch,
        )
        .unwrap();
        let d = spec.obs_len() * dtype.size();
        let (obs, next) = (
            batch.columns[0].data.as_slice(),
            batch.columns[1].data.as_slice(),
        );
        assert_eq!(obs.len(), 3 * d);
        assert_eq!(&next[..2 * d], &obs[d..]);
        if dtype == ObsDtype::Float32 {
            let v = batch.columns[0].values::<f32>();
            assert!(v.iter().all(|&x| (0.0..=1.0).contains(&x)));
            assert!(v.iter().any(|&x| x > 0.9), "the ball is white");
        }
    }
    // Shapes with a zero dimension, or none, are refused.
    for shape in [vec![], vec![84, 0, 4]] {
        let spec = SynthSpec {
            obs_shape: shape,
            ..atari(10, 0)
        };
        assert!(spec.schema().is_err());
    }
    assert_eq!("uint8".parse::<ObsDtype>().unwrap(), ObsDtype::UInt8);
    assert_eq!("F32".parse::<ObsDtype>().unwrap(), ObsDtype::Float32);
    assert!("float16".parse::<ObsDtype>().is_err());
}

#[test]
fn cli_demo_writes_images_and_bench_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("atari.trajstore");
    let d = d.to_str().unwrap();
    let (code, out, err) = run(
        &[
            "demo",
            d,
            "--transitions",
            "2000",
            "--obs-shape",
            "84,84,4",
            "--obs-dtype",
            "uint8",
            "--discrete",
            "--act-dim",
            "4",
            "--mean-episode-len",
            "200",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let row = v["transition_bytes"].as_f64().unwrap();
    assert!((row - (D as f64 + 24.5)).abs() < 1e-9, "{row}");
    assert!(v["write_bytes_per_second"].as_f64().unwrap() > 0.0);
    assert!(v["bytes_per_transition"].as_f64().unwrap() >= D as f64);

    let (code, out, err) = run(&["info", d, "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["transitions"].as_u64(), Some(2000));
    let obs = v["schema"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "observation")
        .unwrap();
    assert_eq!(obs["type"], format!("fixed_size_list<uint8>[{D}]"));
    assert_eq!(obs["shape"], serde_json::json!([84, 84, 4]));

    // Text: the bytes of a transition, and the bench to run on images.
    let t = dir.path().join("text.trajstore");
    let (code, out, err) = run(
        &[
            "demo",
            t.to_str().unwrap(),
            "--transitions",
            "300",
            "--obs-shape",
            "84,84,4",
            "--obs-dtype",
            "uint8",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("wrote 300 transitions (27.60 KiB each)"),
        "{out}"
    );
    assert!(out.contains("--num-slices 32 --slice-len 16"), "{out}");

    // --obs-dim and --obs-shape conflict; shapes must be positive.
    let (code, _, err) = run(&["demo", d, "--obs-dim", "3", "--obs-shape", "3"], &[]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["demo", d, "--obs-shape", "84,0"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("positive"), "{err}");

    // bench on the images, and a batch over the memory limit: a one-line error, no crash.
    let (code, out, err) = run(
        &[
            "bench",
            d,
            "--num-slices",
            "32",
            "--slice-len",
            "16",
            "--iters",
            "3",
            "--json",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap();
    for args in [
        &["sample", d, "--num-slices", "32", "--slice-len", "16"][..],
        &["bench", d, "--num-slices", "32", "--slice-len", "16"][..],
    ] {
        let (code, _, err) = run(args, &[("TRAJSTORE_MAX_BATCH_BYTES", "1000000")]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.lines().count() == 1
                && err.contains("--slice-len")
                && err.contains("more than the limit")
                && !err.contains("panick"),
            "{err}"
        );
    }
    let (code, _, err) = run(
        &[
            "bench",
            d,
            "--num-slices",
            "100000000",
            "--slice-len",
            "1000",
        ],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(!err.contains("panick"), "{err}");
}
