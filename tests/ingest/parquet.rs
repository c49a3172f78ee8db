//! Parquet ingest through the public API: both episode modes, column conversions, and every kind
//! of bad input (with the row it names), including that a failed ingest leaves nothing behind.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, Float32Array, Float64Array,
    Int32Array, Int64Array, ListArray, RecordBatch, StringArray, UInt64Array,
};
use arrow::datatypes::{DataType, Field, Float32Type, Int64Type, UInt64Type};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;
use trajstore::ingest::{IngestOptions, IngestReport, InputFormat, infer_schema, ingest};
use trajstore::{ActionKind, Dataset, Error, WriterOptions};

use crate::common::ends;

/// Ingests the Parquet input `input` into `dataset`.
fn ingest_parquet(
    input: &Path,
    dataset: &Path,
    opts: &IngestOptions,
    writer: WriterOptions,
) -> trajstore::Result<IngestReport> {
    ingest(input, InputFormat::Parquet, dataset, opts, writer)
}

/// The schema ingesting the Parquet input `input` would produce.
fn infer_parquet(
    input: &Path,
    opts: &IngestOptions,
) -> trajstore::Result<trajstore::TransitionSchema> {
    infer_schema(input, InputFormat::Parquet, opts)
}

/// Writes `batch` as Parquet with row groups of `group_rows` rows.
fn write_parquet(path: &Path, batch: &RecordBatch, group_rows: usize) {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .build();
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

fn fsl_f32(n: i32, values: Vec<f32>) -> ArrayRef {
    let item = Arc::new(Field::new("item", DataType::Float32, true));
    Arc::new(FixedSizeListArray::new(
        item,
        n,
        Arc::new(Float32Array::from(values)),
        None,
    ))
}

fn list_f32(rows: &[Vec<f32>]) -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(
        rows.iter()
            .map(|r| Some(r.iter().copied().map(Some).collect::<Vec<_>>())),
    ))
}

/// Small segments and batches, so episodes land in several segments and record batches.
fn small_writer() -> WriterOptions {
    WriterOptions::default()
        .with_segment_bytes(8 << 10)
        .with_batch_bytes(2 << 10)
}

fn fsl_values(batch: &RecordBatch, name: &str) -> Vec<f32> {
    let list = batch.column_by_name(name).unwrap().as_fixed_size_list();
    list.values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec()
}

fn rewards(batch: &RecordBatch) -> Vec<f32> {
    batch
        .column_by_name("reward")
        .unwrap()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec()
}

/// A D4RL-style file: observation [3], action [2], reward f64, `terminals`/`timeouts` flags.
/// Returns the batch and the expected (start, length, terminated, truncated) of each episode.
fn d4rl_batch() -> (RecordBatch, Vec<(usize, usize, bool, bool)>) {
    // Episodes: lengths and how they end; the last one has no flag (cut by the end of the data).
    let plan = [
        (37, true, false),
        (150, false, true),
        (203, true, false),
        (1, true, false),
        (99, false, true),
    ];
    let tail = 60;
    let n = plan.iter().map(|p| p.0).sum::<usize>() + tail;
    let mut terminals = vec![false; n];
    let mut timeouts = vec![false; n];
    let mut expected = vec![];
    let mut start = 0;
    for (len, term, trunc) in plan {
        terminals[start + len - 1] = term;
        timeouts[start + len - 1] = trunc;
        expected.push((start, len, term, trunc));
        start += len;
    }
    expected.push((start, tail, false, true));
    let obs: Vec<f32> = (0..n * 3).map(|i| i as f32 * 0.5).collect();
    let act: Vec<f32> = (0..n * 2).map(|i| -(i as f32)).collect();
    let reward: Vec<f64> = (0..n).map(|i| i as f64 * 0.25).collect();
    let batch = RecordBatch::try_from_iter([
        ("observations", fsl_f32(3, obs)),
        ("actions", fsl_f32(2, act)),
        ("rewards", Arc::new(Float64Array::from(reward)) as ArrayRef),
        (
            "terminals",
            Arc::new(BooleanArray::from(terminals)) as ArrayRef,
        ),
        (
            "timeouts",
            Arc::new(BooleanArray::from(timeouts)) as ArrayRef,
        ),
    ])
    .unwrap();
    (batch, expected)
}

fn d4rl_options() -> IngestOptions {
    IngestOptions::default()
        .with_observation_col("observations")
        .with_action_col("actions")
        .with_reward_col("rewards")
        .with_terminated_col("terminals")
        .with_truncated_col("timeouts")
        .with_batch_rows(64)
}

#[test]
fn flag_mode_round_trips_across_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("d4rl.parquet");
    let (batch, expected) = d4rl_batch();
    write_parquet(&input, &batch, 100);
    let out = dir.path().join("ds");

    let opts = d4rl_options();
    let inferred = infer_parquet(&input, &opts).unwrap();
    let report = ingest_parquet(&input, &out, &opts, small_writer()).unwrap();
    assert_eq!(report.rows, batch.num_rows() as u64);
    assert_eq!(report.episodes, expected.len() as u64);
    assert_eq!(report.version, 2);

    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(snap.version(), 2);
    assert_eq!(snap.schema(), &inferred);
    assert!(
        snap.segments().len() > 1,
        "small segments: episodes spread over several"
    );
    assert_eq!(snap.schema().observation_shape(), &[3]);
    assert_eq!(
        snap.schema().action_kind(),
        &ActionKind::Continuous { dim: 2 }
    );
    let lengths: Vec<u64> = expected.iter().map(|e| e.1 as u64).collect();
    assert_eq!(snap.episodes().lengths(), lengths.as_slice());
    let want_ends: Vec<(bool, bool)> = expected.iter().map(|e| (e.2, e.3)).collect();
    assert_eq!(ends(&snap), want_ends);
    assert!(
        snap.manifest()
            .properties
            .get("source")
            .is_some_and(|s| s.ends_with("d4rl.parquet"))
    );

    let all_obs = batch
        .column(0)
        .as_fixed_size_list()
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec();
    let all_act = batch
        .column(1)
        .as_fixed_size_list()
        .values()
        .as_primitive::<Float32Type>()
        .values()
        .to_vec();
    for (id, &(start, len, _, _)) in expected.iter().enumerate() {
        let e = snap.episode(id as u64).unwrap().unwrap();
        assert_eq!(
            fsl_values(&e, "observation"),
            all_obs[start * 3..(start + len) * 3]
        );
        assert_eq!(
            fsl_values(&e, "action"),
            all_act[start * 2..(start + len) * 2]
        );
        let want: Vec<f32> = (start..start + len)
            .map(|i| (i as f64 * 0.25) as f32)
            .collect();
        assert_eq!(rewards(&e), want);
        // Flag columns are consumed, not stored.
        assert!(e.column_by_name("terminals").is_none() && e.column_by_name("timeouts").is_none());
    }
}

#[test]
fn episode_id_mode_converts_lists_and_keeps_user_columns() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("ids.parquet");
    // Ids not sorted, not dense; episode 42 spans several row groups.
    let runs: [(i64, usize); 5] = [(7, 30), (3, 1), (42, 250), (-5, 64), (9, 55)];
    let ids: Vec<i64> = runs
        .iter()
        .flat_map(|&(id, len)| std::iter::repeat_n(id, len))
        .collect();
    let n = ids.len();
    let obs_rows: Vec<Vec<f32>> = (0..n)
        .map(|i| (0..4).map(|j| (i * 4 + j) as f32).collect())
        .collect();
    let batch = RecordBatch::try_from_iter([
        (
            "episode",
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
        ),
        ("observation", list_f32(&obs_rows)),
        (
            "action",
            Arc::new(Int32Array::from_iter_values((0..n as i32).map(|i| i % 5))) as ArrayRef,
        ),
        (
            "reward",
            Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32))),
        ),
        (
            "cost",
            Arc::new(Float64Array::from_iter_values(
                (0..n).map(|i| i as f64 / 7.0),
            )),
        ),
    ])
    .unwrap();
    write_parquet(&input, &batch, 100);
    let out = dir.path().join("ds");
    let opts = IngestOptions::default()
        .with_episode_col("episode")
        .with_batch_rows(33);
    let report = ingest_parquet(&input, &out, &opts, small_writer()).unwrap();
    assert_eq!((report.rows, report.episodes), (n as u64, 5));

    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let schema = snap.schema();
    assert_eq!(schema.observation_shape(), &[4]);
    assert_eq!(schema.action_kind(), &ActionKind::Discrete);
    let payload = schema.payload_schema();
    assert_eq!(
        payload.field_with_name("observation").unwrap().data_type(),
        &DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 4)
    );
    assert_eq!(
        payload.field_with_name("action").unwrap().data_type(),
        &DataType::Int64
    );
    assert_eq!(
        payload
            .field_with_name("source_episode")
            .unwrap()
            .data_type(),
        &DataType::Int64
    );
    assert_eq!(
        payload.field_with_name("cost").unwrap().data_type(),
        &DataType::Float64
    );
    assert!(
        payload.column_with_name("episode").is_none(),
        "the id column is not stored as is"
    );
    let lengths: Vec<u64> = runs.iter().map(|r| r.1 as u64).collect();
    assert_eq!(snap.episodes().lengths(), lengths.as_slice());
    // No flags: every episode was cut.
    assert!(ends(&snap).iter().all(|&e| e == (false, true)));

    let mut start = 0;
    for (id, &(source, len)) in runs.iter().enumerate() {
        let e = snap.episode(id as u64).unwrap().unwrap();
        let want: Vec<f32> = obs_rows[start..start + len].concat();
        assert_eq!(fsl_values(&e, "observation"), want);
        let act = e
            .column_by_name("action")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert!(
            act.values()
                .iter()
                .enumerate()
                .all(|(i, &a)| a == ((start + i) % 5) as i64)
        );
        let src = e
            .column_by_name("source_episode")
            .unwrap()
            .as_primitive::<Int64Type>();
        assert!(src.values().iter().all(|&s| s == source));
        let cost = e
            .column_by_name("cost")
            .unwrap()
            .as_primitive::<arrow::datatypes::Float64Type>();
        assert_eq!(cost.value(0), start as f64 / 7.0);
        start += len;
    }
}

#[test]
fn observation_cols_are_combined_and_scalar_float_action_is_continuous() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cols.parquet");
    let n = 300;
    let col = |k: f32| {
        Arc::new(Float32Array::from_iter_values(
            (0..n).map(move |i| i as f32 + k),
        )) as ArrayRef
    };
    let done: Vec<u8> = (0..n).map(|i| u8::from(i % 100 == 99)).collect();
    let batch = RecordBatch::try_from_iter([
        ("x", col(0.1)),
        ("y", col(0.2)),
        ("z", col(0.3)),
        ("torque", col(-1.0)),
        ("r", col(0.0)),
        (
            "done",
            Arc::new(arrow::array::UInt8Array::from(done)) as ArrayRef,
        ),
    ])
    .unwrap();
    write_parquet(&input, &batch, 64);
    let out = dir.path().join("ds");
    let opts = IngestOptions::default()
        .with_observation_cols(["x", "y", "z"])
        .with_action_col("torque")
        .with_reward_col("r")
        .with_terminated_col("done");
    ingest_parquet(&input, &out, &opts, WriterOptions::default()).unwrap();
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(snap.schema().observation_shape(), &[3]);
    assert_eq!(
        snap.schema().action_kind(),
        &ActionKind::Continuous { dim: 1 }
    );
    assert_eq!(snap.episodes().lengths(), &[100, 100, 100]);
    assert_eq!(ends(&snap), vec![(true, false); 3]);
    let e = snap.episode(1).unwrap().unwrap();
    let obs = fsl_values(&e, "observation");
    assert_eq!(obs[..6], [100.1, 100.2, 100.3, 101.1, 101.2, 101.3]);
    assert_eq!(fsl_values(&e, "action")[..2], [99.0, 100.0]);
}

#[test]
fn peer_layout_with_episode_and_flag_columns() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("peer.parquet");
    // (length, terminated, truncated); the last episode has no flag on its last row.
    let eps = [
        (120, true, false),
        (75, false, true),
        (210, true, false),
        (33, false, false),
    ];
    let n: usize = eps.iter().map(|e| e.0).sum();
    let mut episode = vec![];
    let mut terminated = vec![];
    let mut truncated = vec![];
    for (id, &(len, t, tr)) in eps.iter().enumerate() {
        for step in 0..len {
            episode.push(id as i64);
            terminated.push(t && step + 1 == len);
            truncated.push(tr && step + 1 == len);
        }
    }
    let obs: Vec<f32> = (0..n * 17).map(|i| (i as f32).sin()).collect();
    let act: Vec<f32> = (0..n * 6).map(|i| (i as f32).cos()).collect();
    let batch = RecordBatch::try_from_iter([
        ("episode", Arc::new(Int64Array::from(episode)) as ArrayRef),
        ("observation", fsl_f32(17, obs.clone())),
        ("action", fsl_f32(6, act.clone())),
        (
            "reward",
            Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32))),
        ),
        ("terminated", Arc::new(BooleanArray::from(terminated))),
        ("truncated", Arc::new(BooleanArray::from(truncated))),
    ])
    .unwrap();
    write_parquet(&input, &batch, 100);
    let out = dir.path().join("ds");
    let opts = IngestOptions::default()
        .with_episode_col("episode")
        .with_terminated_col("terminated")
        .with_truncated_col("truncated");
    let report = ingest_parquet(&input, &out, &opts, small_writer()).unwrap();
    assert_eq!((report.rows, report.episodes), (n as u64, 4));
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let names: Vec<String> = snap
        .schema()
        .payload_schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, ["observation", "action", "reward", "source_episode"]);
    assert_eq!(snap.schema().observation_shape(), &[17]);
    assert_eq!(
        snap.schema().action_kind(),
        &ActionKind::Continuous { dim: 6 }
    );
    assert_eq!(snap.episodes().lengths(), &[120, 75, 210, 33]);
    assert_eq!(
        ends(&snap),
        vec![(true, false), (false, true), (true, false), (false, true)]
    );
    // Giving the episode column alone keeps the canonical `terminated`/`truncated` columns as
    // the flags (not user columns with reserved names), with the same episodes and ends.
    let only_ep = dir.path().join("ds_episode_only");
    let opts_ep = IngestOptions::default().with_episode_col("episode");
    let report = ingest_parquet(&input, &only_ep, &opts_ep, small_writer()).unwrap();
    assert_eq!((report.rows, report.episodes), (n as u64, 4));
    let snap_ep = Dataset::open(&only_ep).unwrap().snapshot().unwrap();
    assert_eq!(snap_ep.episodes().lengths(), &[120, 75, 210, 33]);
    assert_eq!(ends(&snap_ep), ends(&snap));
    // So does giving one flag: the other canonical one is still read.
    let only_term = dir.path().join("ds_terminated_only");
    let opts_term = IngestOptions::default()
        .with_episode_col("episode")
        .with_terminated_col("terminated");
    ingest_parquet(&input, &only_term, &opts_term, small_writer()).unwrap();
    let snap_term = Dataset::open(&only_term).unwrap().snapshot().unwrap();
    assert_eq!(ends(&snap_term), ends(&snap));
    let mut start = 0;
    for (id, &(len, ..)) in eps.iter().enumerate() {
        let e = snap.episode(id as u64).unwrap().unwrap();
        assert_eq!(
            fsl_values(&e, "observation"),
            obs[start * 17..(start + len) * 17]
        );
        assert_eq!(fsl_values(&e, "action"), act[start * 6..(start + len) * 6]);
        start += len;
    }
    // Flags in the middle of an episode never end it; a terminated one is an error.
    let mut bad_term = vec![false; n];
    bad_term[50] = true;
    let bad = batch_with(&batch, "terminated", Arc::new(BooleanArray::from(bad_term)));
    let bad_input = dir.path().join("bad_term.parquet");
    write_parquet(&bad_input, &bad, 100);
    let err = ingest_parquet(
        &bad_input,
        &dir.path().join("ds2"),
        &opts,
        WriterOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    assert!(err.to_string().contains("row 50"), "{err}");
    assert!(!dir.path().join("ds2").exists());
}

/// `batch` with column `name` replaced.
fn batch_with(batch: &RecordBatch, name: &str, array: ArrayRef) -> RecordBatch {
    let i = batch.schema().index_of(name).unwrap();
    let mut cols = batch.columns().to_vec();
    cols[i] = array;
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields[i] = fields[i]
        .clone()
        .with_data_type(cols[i].data_type().clone())
        .with_nullable(true);
    RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), cols).unwrap()
}

/// A simple valid file in episode-id mode: 5 episodes of 80 rows, u64 ids.
fn simple_batch(ids: Vec<u64>) -> RecordBatch {
    let n = ids.len();
    RecordBatch::try_from_iter([
        ("ep", Arc::new(UInt64Array::from(ids)) as ArrayRef),
        (
            "observation",
            fsl_f32(2, (0..n * 2).map(|i| i as f32).collect()),
        ),
        ("action", fsl_f32(1, (0..n).map(|i| i as f32).collect())),
        (
            "reward",
            Arc::new(Float32Array::from_iter_values((0..n).map(|i| i as f32))) as ArrayRef,
        ),
    ])
    .unwrap()
}

fn simple_ids() -> Vec<u64> {
    (0..400u64).map(|i| i / 80).collect()
}

fn ep_opts() -> IngestOptions {
    IngestOptions::default().with_episode_col("ep")
}

#[test]
fn appends_to_an_existing_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.parquet");
    write_parquet(&input, &simple_batch(simple_ids()), 100);
    let out = dir.path().join("ds");
    assert_eq!(
        ingest_parquet(&input, &out, &ep_opts(), WriterOptions::default())
            .unwrap()
            .version,
        2
    );
    let r = ingest_parquet(&input, &out, &ep_opts(), WriterOptions::default()).unwrap();
    assert_eq!((r.version, r.episodes, r.rows), (3, 5, 400));
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!((snap.num_episodes(), snap.num_transitions()), (10, 800));
    let src = snap.episode(7).unwrap().unwrap();
    assert_eq!(
        src.column_by_name("source_episode")
            .unwrap()
            .as_primitive::<UInt64Type>()
            .value(0),
        2
    );

    // A file of another layout does not fit.
    let other = dir.path().join("b.parquet");
    let (d4rl, _) = d4rl_batch();
    write_parquet(&other, &d4rl, 100);
    let err = ingest_parquet(&other, &out, &d4rl_options(), WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
    assert_eq!(
        Dataset::open(&out).unwrap().snapshot().unwrap().version(),
        3
    );
}

#[test]
fn reappearing_episode_id_names_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.parquet");
    let mut ids = simple_ids();
    ids[333] = 1; // inside episode 4 (rows 320..400), after episode 1 ended at row 160
    write_parquet(&input, &simple_batch(ids), 100);
    let out = dir.path().join("ds");
    let err = ingest_parquet(&input, &out, &ep_opts(), WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    assert!(err.to_string().contains("row 333"), "{err}");
    assert!(
        !out.exists(),
        "a failed ingest into a new path leaves nothing behind"
    );
}

#[test]
fn failed_append_leaves_the_version_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.parquet");
    write_parquet(&good, &simple_batch(simple_ids()), 100);
    let out = dir.path().join("ds");
    ingest_parquet(&good, &out, &ep_opts(), WriterOptions::default()).unwrap();
    let before = Dataset::open(&out).unwrap().snapshot().unwrap();

    // Several episodes are appended before the bad row is reached.
    let bad = dir.path().join("bad.parquet");
    let mut ids = simple_ids();
    ids[390] = 0;
    write_parquet(&bad, &simple_batch(ids), 100);
    let err = ingest_parquet(&bad, &out, &ep_opts(), small_writer()).unwrap_err();
    assert!(err.to_string().contains("row 390"), "{err}");
    let after = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(after.version(), before.version());
    assert_eq!(after.num_transitions(), before.num_transitions());
    // The next writer cleans up and appends normally.
    let r = ingest_parquet(&good, &out, &ep_opts(), WriterOptions::default()).unwrap();
    assert_eq!(r.version, before.version() + 1);
    assert_eq!(
        Dataset::open(&out)
            .unwrap()
            .snapshot()
            .unwrap()
            .num_transitions(),
        800
    );
}

#[test]
fn list_of_wrong_length_names_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.parquet");
    let n = 400;
    let rows: Vec<Vec<f32>> = (0..n)
        .map(|i| vec![i as f32; if i == 257 { 3 } else { 4 }])
        .collect();
    let batch = batch_with(&simple_batch(simple_ids()), "observation", list_f32(&rows));
    write_parquet(&input, &batch, 100);
    let out = dir.path().join("ds");
    let err = ingest_parquet(&input, &out, &ep_opts(), WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("row 257") && msg.contains("length 3") && msg.contains("expected 4"),
        "{msg}"
    );
    assert!(!out.exists());
}

#[test]
fn null_reward_names_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.parquet");
    let reward: Float32Array = (0..400).map(|i| (i != 123).then_some(i as f32)).collect();
    let batch = batch_with(&simple_batch(simple_ids()), "reward", Arc::new(reward));
    write_parquet(&input, &batch, 100);
    let out = dir.path().join("ds");
    let err = ingest_parquet(&input, &out, &ep_opts(), WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::InvalidData { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("row 123") && msg.contains("reward"), "{msg}");
    assert!(!out.exists());
}

#[test]
fn string_column_suggests_drop_cols() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.parquet");
    let base = simple_batch(simple_ids());
    let schema = base.schema();
    let mut cols: Vec<(String, ArrayRef)> = schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .zip(base.columns().iter().cloned())
        .collect();
    cols.push((
        "note".to_string(),
        Arc::new(StringArray::from_iter_values(
            (0..400).map(|i| format!("n{i}")),
        )),
    ));
    let batch = RecordBatch::try_from_iter(cols).unwrap();
    write_parquet(&input, &batch, 100);
    let out = dir.path().join("ds");
    let err = ingest_parquet(&input, &out, &ep_opts(), WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
    assert!(err.to_string().contains("--drop-cols note"), "{err}");
    assert!(!out.exists());
    // Dropping it works.
    let r = ingest_parquet(
        &input,
        &out,
        &ep_opts().with_drop_cols(["note"]),
        WriterOptions::default(),
    )
    .unwrap();
    assert_eq!(r.rows, 400);
}

#[test]
fn needs_a_way_to_find_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("a.parquet");
    write_parquet(&input, &simple_batch(simple_ids()), 100);
    let err = infer_parquet(&input, &IngestOptions::default().with_drop_cols(["ep"])).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(
        err.to_string().contains("--episode-col") && err.to_string().contains("--terminated-col")
    );
    let missing = infer_parquet(&dir.path().join("nope.parquet"), &ep_opts()).unwrap_err();
    assert!(matches!(missing, Error::NotFound { .. }), "{missing}");
}

/// A LeRobot v2.1 dataset directory (`tests/python/make_lerobot_fixture.py`): one Parquet file per
/// episode under `data/`, list columns, `episode_index`, no options; `meta/` is not read.
#[test]
fn a_lerobot_dataset_directory_ingests_without_options() {
    use crate::common::{check_fixture_values, fixture_episodes, fixture_path, payload_names};
    use trajstore::ingest::{InputFormat, ingest};
    let dir = tempfile::tempdir().unwrap();
    let input = fixture_path("lerobot", "");
    let out = dir.path().join("ds");
    let format = InputFormat::detect(&input).unwrap();
    assert_eq!(format, InputFormat::Parquet);
    let r = ingest(
        &input,
        format,
        &out,
        &IngestOptions::default(),
        small_writer(),
    )
    .unwrap();
    assert_eq!(r.boundaries, "episode ids in `episode_index`");
    assert!(
        r.columns
            .contains(&("observation".into(), "observation.state".into()))
    );
    assert!(r.columns.contains(&("reward".into(), "next.reward".into())));
    let want = fixture_episodes(0, 700);
    assert_eq!((r.rows, r.episodes), (700, want.len() as u64));
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(snap.schema().observation_shape(), &[3]);
    assert_eq!(
        payload_names(&snap),
        [
            "observation",
            "action",
            "reward",
            "source_episode",
            "frame_index",
            "timestamp",
            "next.done",
            "index",
            "task_index"
        ]
    );
    let lengths: Vec<u64> = want.iter().map(|e| e.1 as u64).collect();
    assert_eq!(snap.episodes().lengths(), lengths.as_slice());
    for (id, &(start, len, _, _)) in want.iter().enumerate() {
        let e = snap.episode(id as u64).unwrap().unwrap();
        check_fixture_values(&e, start, len);
        let frame = e.column_by_name("frame_index").unwrap();
        let steps = e.column_by_name("step").unwrap();
        let as_u64 = |a: &ArrayRef| {
            arrow::compute::cast(a, &DataType::UInt64)
                .unwrap()
                .as_primitive::<UInt64Type>()
                .values()
                .to_vec()
        };
        assert_eq!(as_u64(frame), as_u64(steps), "frame_index is the step");
    }
}

/// A directory of Parquet shards is read in path order as one input; shards must agree on their
/// columns.
#[test]
fn a_directory_of_shards_is_one_input() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    std::fs::create_dir_all(shards.join("b")).unwrap();
    let (batch, expected) = d4rl_batch();
    // Three shards in path order: a.parquet, b/c.parquet, d.parquet (cut mid-episode).
    let n = batch.num_rows();
    let cuts = [0, n / 3, 2 * n / 3 + 7, n];
    for (k, name) in ["a.parquet", "b/c.parquet", "d.parquet"].iter().enumerate() {
        let part = batch.slice(cuts[k], cuts[k + 1] - cuts[k]);
        write_parquet(&shards.join(name), &part, 50);
    }
    let out = dir.path().join("ds");
    let r = trajstore::ingest::ingest(
        &shards,
        trajstore::ingest::InputFormat::detect(&shards).unwrap(),
        &out,
        &d4rl_options(),
        small_writer(),
    )
    .unwrap();
    assert_eq!(r.rows, n as u64);
    assert_eq!(r.episodes, expected.len() as u64);
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    let lengths: Vec<u64> = expected.iter().map(|e| e.1 as u64).collect();
    assert_eq!(snap.episodes().lengths(), lengths.as_slice());
    assert_eq!(
        ends(&snap),
        expected.iter().map(|e| (e.2, e.3)).collect::<Vec<_>>()
    );

    // A shard with other columns is named.
    let other = batch_with(
        &batch.slice(0, 10),
        "rewards",
        Arc::new(Int64Array::from(vec![1i64; 10])),
    );
    write_parquet(&shards.join("e.parquet"), &other, 50);
    let err = trajstore::ingest::ingest(
        &shards,
        trajstore::ingest::InputFormat::Parquet,
        &dir.path().join("bad"),
        &d4rl_options(),
        small_writer(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
    assert!(err.to_string().contains("e.parquet"), "{err}");
    assert!(!dir.path().join("bad").exists());
}

/// Demonstrations without rewards: the error says how to ingest them, and `no_reward` stores 0.0.
#[test]
fn data_without_rewards_needs_no_reward() {
    use crate::common::fixture_path;
    use trajstore::ingest::{InputFormat, ingest};
    let dir = tempfile::tempdir().unwrap();
    let input = fixture_path("lerobot", "");
    let opts = IngestOptions::default().with_drop_cols(["next.reward"]);
    let err = ingest(
        &input,
        InputFormat::Parquet,
        &dir.path().join("a"),
        &opts,
        small_writer(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("--no-reward"), "{err}");
    assert!(!dir.path().join("a").exists());

    let out = dir.path().join("b");
    let r = ingest(
        &input,
        InputFormat::Parquet,
        &out,
        &opts.with_no_reward(),
        small_writer(),
    )
    .unwrap();
    assert!(r.columns.contains(&("reward".into(), "none (0.0)".into())));
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(snap.num_transitions(), 700);
    for id in 0..snap.num_episodes() {
        assert!(
            rewards(&snap.episode(id).unwrap().unwrap())
                .iter()
                .all(|&x| x == 0.0)
        );
    }
}

/// Writes `batch` as an Arrow IPC file in record batches of `rows` rows.
fn write_arrow(
    path: &Path,
    batch: &RecordBatch,
    rows: usize,
    compression: Option<arrow::ipc::CompressionType>,
) {
    use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
    let opts = IpcWriteOptions::default()
        .try_with_compression(compression)
        .unwrap();
    let mut w =
        FileWriter::try_new_with_options(File::create(path).unwrap(), &batch.schema(), opts)
            .unwrap();
    for off in (0..batch.num_rows()).step_by(rows) {
        w.write(&batch.slice(off, rows.min(batch.num_rows() - off)))
            .unwrap();
    }
    w.finish().unwrap();
}

/// The same table as Parquet and as Arrow IPC files (plain, LZ4 as pyarrow's Feather default,
/// ZSTD; variable-size list observations) ingests to the same dataset, byte for byte.
#[test]
fn arrow_ipc_files_ingest_like_parquet() {
    use trajstore::ingest::{InputFormat, ingest};
    let dir = tempfile::tempdir().unwrap();
    let (batch, expected) = d4rl_batch();
    let n = batch.num_rows();
    let lists: Vec<Vec<f32>> = (0..n)
        .map(|i| (0..3).map(|j| (i * 3 + j) as f32 * 0.5).collect())
        .collect();
    let batch = batch_with(&batch, "observations", list_f32(&lists));
    let pq = dir.path().join("d4rl.parquet");
    write_parquet(&pq, &batch, 100);
    let want = dir.path().join("from-parquet");
    ingest_parquet(&pq, &want, &d4rl_options(), small_writer()).unwrap();
    let want = Dataset::open(&want).unwrap().snapshot().unwrap();
    let compressions = [
        ("plain.arrow", None),
        ("lz4.feather", Some(arrow::ipc::CompressionType::LZ4_FRAME)),
        ("zstd", Some(arrow::ipc::CompressionType::ZSTD)),
    ];
    for (name, compression) in compressions {
        let input = dir.path().join(name);
        write_arrow(&input, &batch, 77, compression);
        // `zstd` has no extension: the magic bytes say what it is.
        assert!(matches!(
            InputFormat::detect(&input).unwrap(),
            InputFormat::Arrow
        ));
        let out = dir.path().join(format!("ds-{name}"));
        let r = ingest(
            &input,
            InputFormat::Arrow,
            &out,
            &d4rl_options(),
            small_writer(),
        )
        .unwrap();
        assert_eq!(
            (r.rows, r.episodes),
            (n as u64, expected.len() as u64),
            "{name}"
        );
        let got = Dataset::open(&out).unwrap().snapshot().unwrap();
        assert_eq!(got.schema(), want.schema(), "{name}");
        assert_eq!(ends(&got), ends(&want), "{name}");
        for id in 0..want.num_episodes() {
            assert_eq!(
                got.episode(id).unwrap(),
                want.episode(id).unwrap(),
                "{name}: episode {id}"
            );
        }
    }

    // A dictionary-encoded column (a task name) that is dropped: the file's dictionaries are
    // read, the column is not.
    let tasks: arrow::array::DictionaryArray<arrow::datatypes::Int32Type> =
        (0..n).map(|i| ["walk", "run"][i % 2]).collect();
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("task", tasks.data_type().clone(), false));
    let mut cols = batch.columns().to_vec();
    cols.push(Arc::new(tasks));
    let with_dict =
        RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), cols).unwrap();
    let input = dir.path().join("dict.arrow");
    write_arrow(&input, &with_dict, 500, None);
    let out = dir.path().join("ds-dict");
    ingest(
        &input,
        InputFormat::Arrow,
        &out,
        &d4rl_options().with_drop_cols(["task"]),
        small_writer(),
    )
    .unwrap();
    let got = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(got.schema(), want.schema());
    assert_eq!(got.episode(3).unwrap(), want.episode(3).unwrap());

    // A truncated file is a corrupt-file error naming it, and nothing is created.
    let good = std::fs::read(dir.path().join("plain.arrow")).unwrap();
    let cut = dir.path().join("cut.arrow");
    std::fs::write(&cut, &good[..good.len() - 40]).unwrap();
    let err = ingest(
        &cut,
        InputFormat::Arrow,
        &dir.path().join("x"),
        &d4rl_options(),
        small_writer(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("cut.arrow"), "{err}");
    assert!(!dir.path().join("x").exists());
    // What `trajstore sql --format arrow` writes ingests back without options.
    let t = dir.path().join("t.arrow");
    let bin = env!("CARGO_BIN_EXE_trajstore");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let want_path = want.path().to_str().unwrap();
    run(&[
        "sql",
        want_path,
        "SELECT * FROM transitions ORDER BY episode_id, step",
        "--format",
        "arrow",
        "--output",
        t.to_str().unwrap(),
    ]);
    let back = dir.path().join("back");
    run(&[
        "ingest",
        t.to_str().unwrap(),
        back.to_str().unwrap(),
        "--json",
    ]);
    let back = Dataset::open(&back).unwrap().snapshot().unwrap();
    assert_eq!(ends(&back), ends(&want));
    for id in 0..want.num_episodes() {
        let (a, b) = (
            back.episode(id).unwrap().unwrap(),
            want.episode(id).unwrap().unwrap(),
        );
        assert_eq!(fsl_values(&a, "observation"), fsl_values(&b, "observation"));
        assert_eq!(rewards(&a), rewards(&b), "episode {id}");
    }

    // A file in the stream format is read in order, to the same dataset.
    let stream = dir.path().join("s.arrows");
    {
        let mut w = arrow::ipc::writer::StreamWriter::try_new(
            File::create(&stream).unwrap(),
            &batch.schema(),
        )
        .unwrap();
        for off in (0..n).step_by(64) {
            w.write(&batch.slice(off, 64.min(n - off))).unwrap();
        }
        w.finish().unwrap();
    }
    let inferred =
        trajstore::ingest::infer_schema(&stream, InputFormat::Arrow, &d4rl_options()).unwrap();
    assert_eq!(&inferred, want.schema(), "a stream's schema from its head");
    let out = dir.path().join("ds-stream");
    let r = ingest(
        &stream,
        InputFormat::detect(&stream).unwrap(),
        &out,
        &d4rl_options(),
        small_writer(),
    )
    .unwrap();
    assert_eq!((r.rows, r.episodes), (n as u64, expected.len() as u64));
    let got = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(ends(&got), ends(&want));
    for id in 0..want.num_episodes() {
        assert_eq!(
            got.episode(id).unwrap(),
            want.episode(id).unwrap(),
            "stream: episode {id}"
        );
    }
}

/// A live collector pipes an Arrow IPC stream into `trajstore ingest -`: with `--commit-every`,
/// readers see its episodes while the pipe is still open; the end of the stream commits the
/// rest; a broken stream keeps what was committed before it.
#[test]
fn a_live_arrow_stream_on_stdin_commits_as_it_goes() {
    use std::io::Write;
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let (batch, expected) = d4rl_batch();
    let n = batch.num_rows();
    // The first three episodes end at row 390.
    assert_eq!(expected[3].0, 390);
    let want = dir.path().join("from-parquet");
    let pq = dir.path().join("d4rl.parquet");
    write_parquet(&pq, &batch, 100);
    ingest_parquet(&pq, &want, &d4rl_options(), small_writer()).unwrap();
    let want = Dataset::open(&want).unwrap().snapshot().unwrap();
    let collector = |out: &Path, commit_every: &str| {
        crate::common::bin()
            .args([
                "ingest",
                "-",
                out.to_str().unwrap(),
                "--observation-col",
                "observations",
                "--action-col",
                "actions",
                "--reward-col",
                "rewards",
                "--terminated-col",
                "terminals",
                "--truncated-col",
                "timeouts",
                "--commit-every",
                commit_every,
                "--json",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Waits (up to a deadline, not a speed claim) until `out` has `episodes` committed.
    let committed = |out: &Path, episodes: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(snap) = Dataset::open(out).and_then(|d| d.snapshot())
                && snap.num_episodes() >= episodes
            {
                return snap;
            }
            assert!(
                Instant::now() < deadline,
                "no commit of {episodes} episodes"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    let out = dir.path().join("live");
    let mut child = collector(&out, "2");
    let mut w =
        arrow::ipc::writer::StreamWriter::try_new(child.stdin.take().unwrap(), &batch.schema())
            .unwrap();
    w.write(&batch.slice(0, 390)).unwrap();
    w.flush().unwrap();
    let live = committed(&out, 3);
    assert_eq!(live.num_episodes(), 3, "whole episodes only");
    for id in 0..3 {
        assert_eq!(live.episode(id).unwrap(), want.episode(id).unwrap());
    }
    w.write(&batch.slice(390, n - 390)).unwrap();
    w.finish().unwrap();
    drop(w);
    let done = child.wait_with_output().unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(report["rows"], n as u64, "{report}");
    let got = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(ends(&got), ends(&want));
    for id in 0..want.num_episodes() {
        assert_eq!(
            got.episode(id).unwrap(),
            want.episode(id).unwrap(),
            "episode {id}"
        );
    }

    // Garbage after a commit: the ingest fails, says what it kept, and keeps it.
    let out = dir.path().join("broken");
    let mut child = collector(&out, "1");
    // The stream's bytes so far (schema, then the batch), without its end-of-stream marker.
    let mut w = arrow::ipc::writer::StreamWriter::try_new(Vec::new(), &batch.schema()).unwrap();
    w.write(&batch.slice(0, 390)).unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(w.get_ref()).unwrap();
    stdin.flush().unwrap();
    committed(&out, 3);
    stdin
        .write_all(b"\xff\xff\xff\xff\x20\x00\x00\x00not a flatbuffer message at all..")
        .unwrap();
    drop(stdin);
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(!done.status.success());
    assert!(
        err.contains("stdin") && err.contains("with 3 of its episodes (kept)"),
        "{err}"
    );
    let kept = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(kept.num_episodes(), 3);
    trajstore::store::verify::verify(&kept, |_| {}).unwrap();
}
