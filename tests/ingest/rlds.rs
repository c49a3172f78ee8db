//! RLDS / TFDS datasets (`src/ingest/source/rlds/`), against directories written by
//! tensorflow-datasets' own writer (`scripts/fixtures/rlds_fixture.py`, committed under
//! `tests/data/rlds/` so that no test needs TensorFlow) and the arrays tfds's own reader decodes
//! from them (`<name>.expected.json`): every transition's values, images (PNG exactly, JPEG
//! within decoder rounding), episode ends and final frames; damaged shards and a
//! `features.json` that disagrees with the records are named errors that commit nothing.

use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{Float32Type, Int64Type, UInt8Type};
use serde_json::Value;
use trajstore::ingest::{RldsOptions, ingest_rlds, is_rlds};
use trajstore::{Dataset, Error, Snapshot};

use crate::common::{copy_tree, fixture_path, payload_names, run_cli, small_segments};

fn input(name: &str) -> PathBuf {
    fixture_path("rlds", name)
}

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(input(&format!("{name}.expected.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The standard base64 alphabet, decoded (the expected images).
fn base64(text: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = vec![];
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk.iter().take_while(|&&c| c != b'=').count();
        let mut v = 0u32;
        for (i, &c) in chunk[..n].iter().enumerate() {
            v |= u32::from(val(c)) << (18 - 6 * i);
        }
        out.extend(&v.to_be_bytes()[1..n]);
    }
    out
}

fn image(v: &Value) -> Vec<u8> {
    base64(v["uint8_base64"].as_str().unwrap())
}

fn floats(v: &Value) -> Vec<f32> {
    match v {
        Value::Array(a) => a.iter().map(|x| x.as_f64().unwrap() as f32).collect(),
        x => vec![x.as_f64().unwrap() as f32],
    }
}

/// Every episode of the expected file, in ingest order (splits in dataset_info's order).
fn episodes(want: &Value) -> Vec<&Vec<Value>> {
    want["splits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["episodes"].as_array().unwrap())
        .map(|e| e["steps"].as_array().unwrap())
        .collect()
}

/// The decoded frames of episode `id` (its transitions) and its final frame.
fn frames(snap: &Snapshot, id: u64) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    column_frames(snap, "observation", id)
}

/// The decoded frames of frame column `name` in episode `id`, and the episode's final frame.
fn column_frames(snap: &Snapshot, name: &str, id: u64) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let col = snap.frame_column(name).unwrap();
    let mut dec = col.decoder().unwrap();
    let mut buf = vec![0u8; dec.frame_len()];
    for seg in snap.segments() {
        let t = seg.episode_table();
        let Some(i) = t.ids().iter().position(|&x| x == id) else {
            continue;
        };
        let (start, len) = (t.row_starts()[i], t.lengths()[i] as usize);
        let run = seg.frames(name, start, len).unwrap();
        let rows = (0..run.len())
            .map(|r| {
                dec.decode_into(run.frame(r).unwrap(), &mut buf).unwrap();
                buf.clone()
            })
            .collect();
        // The episode table's final frame is the observation's only.
        let last = t.final_frame(i).filter(|_| name == "observation").map(|f| {
            dec.decode_into(f, &mut buf).unwrap();
            buf.clone()
        });
        return (rows, last);
    }
    panic!("no episode {id}");
}

fn u8_rows(batch: &RecordBatch, name: &str) -> Vec<Vec<u8>> {
    let a = batch.column_by_name(name).unwrap().as_fixed_size_list();
    (0..a.len())
        .map(|i| a.value(i).as_primitive::<UInt8Type>().values().to_vec())
        .collect()
}

fn f32_rows(batch: &RecordBatch, name: &str) -> Vec<Vec<f32>> {
    let a = batch.column_by_name(name).unwrap();
    match a.as_fixed_size_list_opt() {
        Some(l) => (0..l.len())
            .map(|i| l.value(i).as_primitive::<Float32Type>().values().to_vec())
            .collect(),
        None => a
            .as_primitive::<Float32Type>()
            .values()
            .iter()
            .map(|&x| vec![x])
            .collect(),
    }
}

fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

fn ingest(
    name: &str,
    out: &Path,
    opts: &RldsOptions,
) -> trajstore::Result<trajstore::ingest::RldsReport> {
    ingest_rlds(&input(name), out, opts, small_segments())
}

#[test]
fn robot_episodes_become_transitions_with_the_final_observation_kept() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("robot.trajstore");
    assert!(is_rlds(&input("rlds_robot")));
    let r = ingest("rlds_robot", &out, &RldsOptions::default()).unwrap();
    let want = expected("rlds_robot");
    let eps = episodes(&want);
    let steps: usize = eps.iter().map(|e| e.len()).sum();
    assert_eq!(r.episodes, eps.len() as u64);
    assert_eq!(
        r.rows,
        (steps - eps.len()) as u64,
        "one transition per step but the last"
    );
    assert_eq!(r.splits, ["train", "test"]);
    assert_eq!(r.shards, 4);
    assert_eq!(r.empty_episodes, 0);
    for (stored, from) in [
        ("observation", "steps/observation/image"),
        ("action", "steps/action"),
        ("reward", "steps/reward"),
        ("discount", "steps/discount"),
        ("observation/state", "steps/observation/state"),
        ("observation/wrist", "steps/observation/wrist"),
    ] {
        assert!(
            r.columns.contains(&(stored.into(), from.into())),
            "{stored}: {:?}",
            r.columns
        );
    }
    assert!(
        r.skipped
            .iter()
            .any(|s| s.starts_with("steps/language_instruction")),
        "{:?}",
        r.skipped
    );
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(
        payload_names(&snap),
        [
            "observation",
            "action",
            "reward",
            "discount",
            "observation/state",
            "observation/wrist"
        ]
    );
    let spec = &snap.frame_column("observation").unwrap().spec;
    assert_eq!(spec.shape, [16, 16, 3]);
    let ends = crate::common::ends(&snap);
    let (mut jpeg_diff, mut accurate_diff) = (0, 0);
    let accurate: Vec<&Value> = want["splits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["episodes"].as_array().unwrap())
        .map(|e| &e["jpeg_accurate"]["steps/observation/wrist"])
        .collect();
    for (id, steps) in eps.iter().enumerate() {
        let id = id as u64;
        let n = steps.len();
        let e = snap.episode(id).unwrap().unwrap();
        assert_eq!(e.num_rows(), n - 1, "episode {id}");
        // Flags: terminated where the last step is terminal, truncated otherwise.
        let last = &steps[n - 1];
        assert!(last["is_last"].as_bool().unwrap());
        let terminal = last["is_terminal"].as_bool().unwrap();
        assert_eq!(ends[id as usize], (terminal, !terminal), "episode {id}");
        // Values of the transitions: steps 0..n-1.
        let (actions, rewards, discounts, states) = (
            f32_rows(&e, "action"),
            f32_rows(&e, "reward"),
            f32_rows(&e, "discount"),
            f32_rows(&e, "observation/state"),
        );
        // The second camera is a frame column too (decoded here).
        let (wrists, _) = column_frames(&snap, "observation/wrist", id);
        let (rows, final_frame) = frames(&snap, id);
        for (s, step) in steps[..n - 1].iter().enumerate() {
            assert_eq!(actions[s], floats(&step["action"]), "episode {id} step {s}");
            assert_eq!(rewards[s], floats(&step["reward"]));
            assert_eq!(discounts[s], floats(&step["discount"]));
            assert_eq!(states[s], floats(&step["observation"]["state"]));
            assert_eq!(
                rows[s],
                image(&step["observation"]["image"]),
                "PNG frame, episode {id} step {s}"
            );
            // JPEG: libjpeg's accurate IDCT within a rounding of chroma upsampling.
            accurate_diff =
                accurate_diff.max(max_diff(&wrists[s], &image(&accurate[id as usize][s])));
            jpeg_diff = jpeg_diff.max(max_diff(&wrists[s], &image(&step["observation"]["wrist"])));
        }
        assert_eq!(
            final_frame.as_deref(),
            Some(image(&last["observation"]["image"]).as_slice()),
            "the is_last step's image is the final frame (episode {id})"
        );
        let ret: f32 = steps[..n - 1].iter().map(|s| floats(&s["reward"])[0]).sum();
        let table_return = snap.episode_column("episode_return").unwrap();
        let got = table_return
            .iter()
            .flat_map(|a| {
                a.as_primitive::<arrow::datatypes::Float64Type>()
                    .values()
                    .to_vec()
            })
            .nth(id as usize)
            .unwrap();
        assert!((got as f32 - ret).abs() < 1e-4, "return of episode {id}");
    }
    // The fast IDCT that tfds decodes with by default rounds differently (on these noisy 8x8
    // images, by up to about 13 levels).
    eprintln!("JPEG: max difference {accurate_diff} (accurate IDCT), {jpeg_diff} (tfds)");
    assert!(
        accurate_diff <= 3,
        "JPEG pixels differ from libjpeg's by {accurate_diff}"
    );
    assert!(
        jpeg_diff <= 24,
        "JPEG pixels differ from tfds's by {jpeg_diff}"
    );
    trajstore::store::verify::verify(&snap, |_| {}).unwrap();
}

#[test]
fn atari_episodes_have_discrete_actions_and_grayscale_frames() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("atari.trajstore");
    let r = ingest("rlds_atari", &out, &RldsOptions::default()).unwrap();
    assert!(
        r.columns
            .contains(&("observation".into(), "steps/observation".into()))
    );
    let want = expected("rlds_atari");
    let eps = episodes(&want);
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(
        snap.frame_column("observation").unwrap().spec.shape,
        [16, 16, 1]
    );
    assert_eq!(r.episodes, eps.len() as u64);
    for (id, steps) in eps.iter().enumerate() {
        let e = snap.episode(id as u64).unwrap().unwrap();
        let actions = e
            .column_by_name("action")
            .unwrap()
            .as_primitive::<Int64Type>();
        let (rows, last) = frames(&snap, id as u64);
        for (s, step) in steps[..steps.len() - 1].iter().enumerate() {
            assert_eq!(actions.value(s), step["action"].as_i64().unwrap());
            assert_eq!(rows[s], image(&step["observation"]));
        }
        assert_eq!(last.unwrap(), image(&steps[steps.len() - 1]["observation"]));
    }
}

#[test]
fn options_pick_the_observation_split_and_tensor_storage() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("state.trajstore");
    let mut o = RldsOptions::default();
    o.observation = Some("steps/observation/state".into());
    o.splits = Some(vec!["test".into()]);
    o.drop = vec!["observation/wrist".into()];
    o.frame_level = Some(7);
    let r = ingest("rlds_robot", &out, &o).unwrap();
    assert_eq!(r.splits, ["test"]);
    let want = expected("rlds_robot");
    let test = &want["splits"][1]["episodes"];
    let steps = test[0]["steps"].as_array().unwrap();
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(
        payload_names(&snap),
        [
            "observation",
            "action",
            "reward",
            "discount",
            "observation/image"
        ]
    );
    let camera = snap.frame_column("observation/image").unwrap();
    assert_eq!(
        camera.spec.level, 7,
        "--frame-level reaches every frame column"
    );
    let e = snap.episode(0).unwrap().unwrap();
    assert_eq!(
        f32_rows(&e, "observation")[0],
        floats(&steps[0]["observation"]["state"])
    );
    // The final observation of a tensor column is in the episode table.
    let t = snap.segments()[0].episode_table();
    let fin = t.final_observation().unwrap().as_fixed_size_list();
    let fin = fin.value(0);
    assert_eq!(
        fin.as_primitive::<Float32Type>().values().to_vec(),
        floats(&steps[steps.len() - 1]["observation"]["state"])
    );
    // Images kept as tensors when asked: the observation is a uint8 [16, 16, 3] tensor.
    let out = dir.path().join("tensor.trajstore");
    let mut o = RldsOptions::default();
    o.frame_codec = None;
    ingest("rlds_robot", &out, &o).unwrap();
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert!(snap.frame_column("observation").is_none());
    assert_eq!(snap.schema().observation_shape(), [16, 16, 3]);
    let e = snap.episode(0).unwrap().unwrap();
    let first = &want["splits"][0]["episodes"][0]["steps"][0];
    assert_eq!(
        u8_rows(&e, "observation")[0],
        image(&first["observation"]["image"])
    );
    // A split that does not exist.
    let mut o = RldsOptions::default();
    o.splits = Some(vec!["validation".into()]);
    let e = ingest("rlds_robot", &dir.path().join("none"), &o).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
}

/// A copy of fixture `name` whose file `file` (relative to `<name>/1.0.0/`) is changed by `f`.
fn damaged(dir: &Path, name: &str, file: &str, f: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let root = dir.join(name);
    copy_tree(&input(name), &root);
    let path = root.join("1.0.0").join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    f(&mut bytes);
    std::fs::write(&path, bytes).unwrap();
    root
}

/// Ingests `root` and returns the error; checks nothing was left behind.
fn refused(root: &Path, dir: &Path) -> String {
    let out = dir.join("out.trajstore");
    let e = ingest_rlds(root, &out, &RldsOptions::default(), small_segments()).unwrap_err();
    assert!(!out.exists(), "a failed ingest leaves no dataset: {e}");
    e.to_string()
}

/// The step features of a `features.json` document.
fn step_features(doc: &mut Value) -> &mut serde_json::Map<String, Value> {
    doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]["features"]
        .as_object_mut()
        .unwrap()
}

/// `f` applied to JSON file `bytes`.
fn edit_json(bytes: &mut Vec<u8>, f: impl FnOnce(&mut Value)) {
    let mut doc: Value = serde_json::from_slice(bytes).unwrap();
    f(&mut doc);
    *bytes = serde_json::to_vec_pretty(&doc).unwrap();
}

#[test]
fn damaged_shards_are_named_errors_and_commit_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let shard = "rlds_robot-train.tfrecord-00001-of-00002";
    // A flipped bit in the second record's data: its CRC-32C no longer matches.
    let mut second = 0;
    let root = damaged(dir.path(), "rlds_robot", shard, |b| {
        let len = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        second = 16 + len;
        b[second + 12 + 100] ^= 0x10;
    });
    let m = refused(&root, dir.path());
    assert!(m.contains(shard), "{m}");
    assert!(m.contains(&format!("record 1 at byte {second}")), "{m}");
    assert!(m.contains("CRC-32C"), "{m}");

    // A shard cut short.
    let dir = tempfile::tempdir().unwrap();
    let root = damaged(dir.path(), "rlds_robot", shard, |b| {
        b.truncate(b.len() - 50)
    });
    let m = refused(&root, dir.path());
    assert!(m.contains(shard) && m.contains("truncated"), "{m}");

    // A shard missing.
    let dir = tempfile::tempdir().unwrap();
    let root = damaged(dir.path(), "rlds_robot", shard, |_| {});
    std::fs::remove_file(root.join("1.0.0").join(shard)).unwrap();
    let e = ingest_rlds(
        &root,
        &dir.path().join("o"),
        &RldsOptions::default(),
        small_segments(),
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::NotFound { ref path } if path.ends_with(shard)),
        "{e}"
    );
}

#[test]
fn metadata_that_disagrees_with_the_records_is_a_named_error() {
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &str); 5] = [
        // The image's height.
        (
            "features.json",
            |d| {
                let obs = &mut step_features(d)["observation"]["featuresDict"]["features"];
                obs["image"]["image"]["shape"]["dimensions"][0] = "12".into();
            },
            "an image of 16x16",
        ),
        // The action's dtype: the records hold floats.
        (
            "features.json",
            |d| step_features(d)["action"]["tensor"]["dtype"] = "int64".into(),
            "float_list",
        ),
        // The state's size: the records hold 4 values per step.
        (
            "features.json",
            |d| {
                let obs = &mut step_features(d)["observation"]["featuresDict"]["features"];
                obs["state"]["tensor"]["shape"]["dimensions"][0] = "3".into();
            },
            "steps/observation/state",
        ),
        // A step feature the records do not have.
        (
            "features.json",
            |d| {
                let steps = step_features(d);
                let r = steps.remove("reward").unwrap();
                steps.insert("rewardz".into(), r);
            },
            "no feature `steps/rewardz`",
        ),
        // Episodes per shard.
        (
            "dataset_info.json",
            |d| d["splits"][0]["shardLengths"][1] = "4".into(),
            "dataset_info.json says 4",
        ),
    ];
    for (file, edit, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let root = damaged(dir.path(), "rlds_robot", file, |b| edit_json(b, edit));
        let m = refused(&root, dir.path());
        assert!(m.contains(says), "{file} ({says}): {m}");
        assert!(
            m.contains("rlds_robot-train.tfrecord-0000"),
            "names the shard: {m}"
        );
    }
}

#[test]
fn the_cli_recognises_a_tfds_directory_and_reports_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cli.trajstore");
    // The data dir holding <name>/<version>/, without --format.
    let (code, stdout, stderr) = run_cli(&[
        "ingest",
        input("rlds_atari").to_str().unwrap(),
        out.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["columns"]["observation"], "steps/observation");
    assert_eq!(v["columns"]["action"], "steps/action");
    assert_eq!(v["columns"]["discount"], "steps/discount");
    assert!(
        v["boundaries"]
            .as_str()
            .unwrap()
            .contains("steps/is_terminal")
    );
    let want = expected("rlds_atari");
    let eps = episodes(&want);
    assert_eq!(v["episodes"], eps.len() as u64);
    assert_eq!(
        v["rows"],
        eps.iter().map(|e| e.len() as u64 - 1).sum::<u64>()
    );
    // Options of other formats are refused, not ignored.
    let (code, _, stderr) = run_cli(&[
        "ingest",
        input("rlds_atari").to_str().unwrap(),
        dir.path().join("x").to_str().unwrap(),
        "--episode-col",
        "e",
    ]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--episode-col"), "{stderr}");
}
