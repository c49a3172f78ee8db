//! Unit tests of gather: every column source (stored values, stored bools, derived
//! `next_observation`), slices in several segments, padding of slices outside their episode,
//! out-of-range references, destination checks of `gather_into`, and the private helpers.

use super::*;

use std::path::Path;

use arrow::array::{
    FixedSizeListArray, Float32Array, Int16Array, Int64Array, RecordBatch, UInt8Array,
};
use arrow::datatypes::Field;
use arrow::datatypes::Float32Type;

use crate::schema::TransitionSchema;
use crate::store::Dataset;
use crate::store::writer::{EpisodeEnd, WriterOptions};

/// Observation of episode `i` at step `t` (also the final observation at `t = len`).
fn obs(i: u64, t: u64) -> [f32; 2] {
    let v = (1000 * i + t) as f32;
    [v, -v]
}

fn action(i: u64, t: u64) -> i64 {
    ((i + t) % 3) as i64
}

fn reward(i: u64, t: u64) -> f32 {
    i as f32 + t as f32 / 100.0
}

fn pixels(i: u64, t: u64) -> [u8; 4] {
    std::array::from_fn(|k| ((i * 7 + t * 3 + k as u64) % 256) as u8)
}

fn cost(i: u64, t: u64) -> i16 {
    (i * 100 + t) as i16
}

/// Episodes without a final observation (their derived `next_observation` ends in zeros).
const NO_FINAL: u64 = 2;

fn fsl_of(item: DataType, width: i32, values: ArrayRef) -> ArrayRef {
    Arc::new(FixedSizeListArray::new(
        Arc::new(Field::new("item", item, false)),
        width,
        values,
        None,
    ))
}

/// A dataset with a column of every gathered kind: a float32 tensor observation (derived
/// `next_observation`), int64 discrete actions, float32 rewards, a uint8 fixed-size-list user
/// column and an int16 scalar user column. Episode `i` has length `lens[i]`; even episodes end
/// terminated, odd ones truncated.
fn dataset(dir: &Path, lens: &[u64], segment_bytes: u64) -> Snapshot {
    let schema = TransitionSchema::builder(&[2], 3)
        .discrete_action()
        .column(Field::new(
            "pixels",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::UInt8, false)), 4),
            false,
        ))
        .column(Field::new("cost", DataType::Int16, false))
        .build()
        .unwrap();
    let ds = Dataset::create(dir.join("d"), &schema).unwrap();
    let mut w = ds
        .writer(
            WriterOptions::default()
                .with_segment_bytes(segment_bytes)
                .with_batch_bytes(segment_bytes / 2),
        )
        .unwrap();
    for (i, &n) in lens.iter().enumerate() {
        let i = i as u64;
        let steps = 0..n;
        let o: Vec<f32> = steps.clone().flat_map(|t| obs(i, t)).collect();
        let p: Vec<u8> = steps.clone().flat_map(|t| pixels(i, t)).collect();
        let batch = RecordBatch::try_from_iter([
            (
                col::OBSERVATION,
                fsl_of(DataType::Float32, 2, Arc::new(Float32Array::from(o))),
            ),
            (
                col::ACTION,
                Arc::new(Int64Array::from_iter_values(
                    steps.clone().map(|t| action(i, t)),
                )) as ArrayRef,
            ),
            (
                col::REWARD,
                Arc::new(Float32Array::from_iter_values(
                    steps.clone().map(|t| reward(i, t)),
                )),
            ),
            (
                "pixels",
                fsl_of(DataType::UInt8, 4, Arc::new(UInt8Array::from(p))),
            ),
            (
                "cost",
                Arc::new(Int16Array::from_iter_values(steps.map(|t| cost(i, t)))),
            ),
        ])
        .unwrap();
        let end = if i.is_multiple_of(2) {
            EpisodeEnd::terminated()
        } else {
            EpisodeEnd::truncated()
        };
        let end = if i == NO_FINAL {
            end
        } else {
            let fin = fsl_of(
                DataType::Float32,
                2,
                Arc::new(Float32Array::from(obs(i, n).to_vec())),
            );
            end.with_final_observation(fin)
        };
        assert_eq!(w.append_episode(&batch, end).unwrap(), i);
    }
    w.commit().unwrap();
    ds.snapshot().unwrap()
}

const ALL: [&str; 9] = [
    col::OBSERVATION,
    col::ACTION,
    col::REWARD,
    "pixels",
    "cost",
    col::STEP,
    col::EPISODE_ID,
    col::IS_LAST,
    col::NEXT_OBSERVATION,
];

/// Checks every step of every slice of `batch` (gathered with [`ALL`]) against the formulas:
/// values at valid steps, zeros at padded ones, and the flags.
fn check(batch: &Batch, plan: &[SliceRef], lens: &[u64]) {
    let l = batch.slice_len;
    assert_eq!(batch.num_slices, plan.len());
    assert_eq!(l, plan.iter().map(|s| s.len as usize).max().unwrap_or(0));
    let c = |name: &str| batch.column(name).unwrap();
    let (o, a, r) = (
        c(col::OBSERVATION).values::<f32>(),
        c(col::ACTION).values::<i64>(),
        c(col::REWARD).values::<f32>(),
    );
    let (px, cs, st, id) = (
        c("pixels").values::<u8>(),
        c("cost").values::<i16>(),
        c(col::STEP).values::<u32>(),
        c(col::EPISODE_ID).values::<u64>(),
    );
    let (last, next) = (
        c(col::IS_LAST).data.as_slice(),
        c(col::NEXT_OBSERVATION).values::<f32>(),
    );
    for (k, s) in plan.iter().enumerate() {
        let i = s.episode as u64;
        let n = lens[s.episode as usize] as i64;
        assert_eq!((batch.episode_id[k], batch.start_step[k]), (i, s.start));
        let valid_end = (s.start + l as i64).min(n);
        for j in 0..l {
            let at = k * l + j;
            let t = s.start + j as i64;
            let ctx = format!("slice {k} {s:?} step {j}");
            let valid = (0..n).contains(&t);
            assert_eq!(batch.mask[at], valid as u8, "mask {ctx}");
            if !valid {
                assert_eq!(&o[2 * at..2 * at + 2], &[0.0, 0.0], "{ctx}");
                assert_eq!(&next[2 * at..2 * at + 2], &[0.0, 0.0], "{ctx}");
                assert_eq!(&px[4 * at..4 * at + 4], &[0; 4], "{ctx}");
                assert_eq!((a[at], r[at], cs[at], st[at], id[at]), (0, 0.0, 0, 0, 0));
                assert_eq!(last[at], 0, "{ctx}");
                for f in [
                    &batch.is_first,
                    &batch.is_last,
                    &batch.terminated,
                    &batch.truncated,
                    &batch.slice_end,
                ] {
                    assert_eq!(f[at], 0, "flag of a padded step: {ctx}");
                }
                continue;
            }
            let t = t as u64;
            assert_eq!(&o[2 * at..2 * at + 2], &obs(i, t), "observation {ctx}");
            assert_eq!(a[at], action(i, t), "action {ctx}");
            assert_eq!(r[at], reward(i, t), "reward {ctx}");
            assert_eq!(&px[4 * at..4 * at + 4], &pixels(i, t), "pixels {ctx}");
            assert_eq!(cs[at], cost(i, t), "cost {ctx}");
            assert_eq!((st[at] as u64, id[at]), (t, i), "{ctx}");
            let is_last = t as i64 == n - 1;
            let want_next = if is_last && i == NO_FINAL {
                [0.0, 0.0]
            } else {
                obs(i, t + 1)
            };
            assert_eq!(&next[2 * at..2 * at + 2], &want_next, "next {ctx}");
            assert_eq!(last[at], is_last as u8, "stored is_last {ctx}");
            assert_eq!(batch.is_last[at], is_last as u8, "{ctx}");
            assert_eq!(batch.is_first[at], (t == 0) as u8, "{ctx}");
            assert_eq!(batch.terminated[at], (is_last && i.is_multiple_of(2)) as u8);
            assert_eq!(batch.truncated[at], (is_last && i % 2 == 1) as u8);
            assert_eq!(
                batch.slice_end[at],
                (t as i64 == valid_end - 1) as u8,
                "{ctx}"
            );
        }
    }
}

fn sref(episode: u32, start: i64, len: u32) -> SliceRef {
    SliceRef {
        episode,
        start,
        len,
    }
}

#[test]
fn every_column_kind_is_gathered_from_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5, 9, 3, 12];
    let snap = dataset(dir.path(), &lens, 1 << 20);
    assert_eq!(snap.segments().len(), 1);
    let g = Gatherer::try_new(&snap, &ALL).unwrap();
    let kinds: Vec<&str> = g
        .columns
        .iter()
        .map(|c| match c.source {
            ColumnSource::Stored(_) => "stored",
            ColumnSource::StoredBool(_) => "bool",
            ColumnSource::DerivedNext { .. } => "derived",
            ColumnSource::Frames(_) => "frames",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "stored", "stored", "stored", "stored", "stored", "stored", "stored", "bool", "derived"
        ]
    );
    let shapes: Vec<(&str, DataType, Vec<usize>)> = g
        .columns()
        .map(|(n, d, s)| (n, d.clone(), s.to_vec()))
        .collect();
    assert_eq!(shapes[0], (col::OBSERVATION, DataType::Float32, vec![2]));
    assert_eq!(shapes[3], ("pixels", DataType::UInt8, vec![4]));
    assert_eq!(shapes[4], ("cost", DataType::Int16, vec![]));
    assert_eq!(shapes[7], (col::IS_LAST, DataType::Boolean, vec![]));
    assert_eq!(
        shapes[8],
        (col::NEXT_OBSERVATION, DataType::Float32, vec![2])
    );
    assert_eq!(g.step_bytes(), vec![8, 8, 4, 4, 2, 4, 8, 1, 8]);
    assert_eq!(g.episode_flags(), &[1, 2, 1, 2]);
    let plan = [
        sref(1, 0, 9),  // a whole episode
        sref(0, -2, 9), // overhangs both ends
        sref(3, 8, 9),  // overhangs the end
        sref(2, 0, 9),  // ends without a final observation
        sref(3, 1, 9),  // inside
    ];
    let mut batch = Batch::default();
    g.gather(&plan, &mut batch).unwrap();
    check(&batch, &plan, &lens);
    // The buffers shrink to a smaller batch.
    let plan = [sref(0, 1, 2), sref(1, 7, 2)];
    g.gather(&plan, &mut batch).unwrap();
    assert_eq!(batch.mask.len(), 4);
    check(&batch, &plan, &lens);
}

#[test]
fn slices_in_many_segments_read_their_own_segment() {
    let dir = tempfile::tempdir().unwrap();
    let lens: Vec<u64> = (0..14).map(|i| 1 + i * 5 % 11).collect();
    let snap = dataset(dir.path(), &lens, 300);
    let segments = snap.segments().len();
    assert!(segments > 4, "{segments} segments");
    let g = Gatherer::try_new(&snap, &ALL).unwrap();
    // The first episode position of each segment, as the derived column needs it.
    let mut first = 0;
    for (s, &f) in snap.segments().iter().zip(&g.segment_first_episode) {
        assert_eq!(f, first);
        first += s.episode_table().len();
    }
    assert_eq!(first, lens.len());
    // One slice per episode, last episode first, each reaching its episode's end (where the
    // derived next_observation reads that segment's final observations).
    let plan: Vec<SliceRef> = (0..lens.len() as u32)
        .rev()
        .map(|e| sref(e, lens[e as usize] as i64 - 4, 6))
        .collect();
    let mut batch = Batch::default();
    g.gather(&plan, &mut batch).unwrap();
    check(&batch, &plan, &lens);
    // Large enough for the parallel path: the same bytes as slice by slice.
    let big: Vec<SliceRef> = (0..2000u32)
        .map(|k| {
            let e = k % lens.len() as u32;
            sref(e, (k % 7) as i64 - 3, 12)
        })
        .collect();
    g.gather(&big, &mut batch).unwrap();
    assert!(batch.data_bytes() >= 256 << 10, "parallel path");
    check(&batch, &big, &lens);
}

#[test]
fn slices_outside_their_episode_are_padding() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [5, 9, 3];
    let snap = dataset(dir.path(), &lens, 1 << 20);
    let g = Gatherer::try_new(&snap, &ALL).unwrap();
    let plan = [
        sref(0, 5, 4),            // starts at the end
        sref(1, 100, 4),          // far after it
        sref(2, -4, 4),           // ends right before the start
        sref(1, -1_000_000, 4),   // far before it
        sref(0, i64::MIN / 4, 4), // very far before it
        sref(2, -3, 4),           // one step of the episode
    ];
    let mut batch = Batch::default();
    g.gather(&plan, &mut batch).unwrap();
    check(&batch, &plan, &lens);
    assert_eq!(batch.valid_steps(), 1);
    // Zero-length slices: an empty batch of that many slices.
    g.gather(&[sref(0, 0, 0), sref(1, 3, 0)], &mut batch)
        .unwrap();
    assert_eq!((batch.num_slices, batch.slice_len), (2, 0));
    assert!(batch.mask.is_empty() && batch.data_bytes() == 0);
    assert_eq!(batch.episode_id, vec![0, 1]);
}

#[test]
fn an_empty_plan_is_an_empty_batch() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), &[4, 4], 1 << 20);
    let g = Gatherer::try_new(&snap, &ALL).unwrap();
    let mut batch = Batch::default();
    g.gather(&[sref(0, 0, 4)], &mut batch).unwrap();
    g.gather(&[], &mut batch).unwrap();
    assert_eq!((batch.num_slices, batch.slice_len), (0, 0));
    assert_eq!(batch.data_bytes(), 0);
    assert!(batch.episode_id.is_empty() && batch.mask.is_empty());
    let rb = batch.to_record_batch().unwrap();
    assert_eq!(rb.num_rows(), 0);
}

/// An episode position past the snapshot's episodes (a plan made for another snapshot) is an
/// error that names the plan, before anything is written; `gather` reports it too.
#[test]
fn an_episode_position_out_of_range_is_an_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), &[4, 6], 1 << 20);
    let g = Gatherer::try_new(&snap, &[col::REWARD]).unwrap();
    for plan in [
        vec![sref(2, 0, 3)],
        vec![sref(0, 0, 3), sref(u32::MAX, 0, 3)],
    ] {
        let b = plan.len();
        let mut col_buf = vec![0xAAu8; b * 3 * 4];
        let mut flags = vec![vec![7u8; b * 3]; 6];
        let (mut ids, mut starts) = (vec![9u64; b], vec![9i64; b]);
        let mut f = flags.iter_mut();
        let e = g
            .gather_into(
                &plan,
                3,
                GatherInto {
                    columns: vec![col_buf.as_mut_slice()],
                    flags: std::array::from_fn(|_| f.next().unwrap().as_mut_slice()),
                    episode_id: &mut ids,
                    start_step: &mut starts,
                },
            )
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "plan"),
            "{plan:?}: {e}"
        );
        assert!(col_buf.iter().all(|&x| x == 0xAA), "nothing written");
        assert!(flags.iter().flatten().all(|&x| x == 7));
        assert!(ids.iter().all(|&x| x == 9) && starts.iter().all(|&x| x == 9));
        let mut batch = Batch::default();
        let e = g.gather(&plan, &mut batch).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    }
}

/// A slice shorter than the batch's slice length covers only its own steps: the rest of its
/// row is padding (mask 0, zeros), even where its episode goes on.
#[test]
fn a_short_slice_is_padded_not_extended() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), &[10, 6], 1 << 20);
    let g = Gatherer::try_new(&snap, &[col::REWARD]).unwrap();
    let mut batch = Batch::default();
    // Slice 0: 2 steps from step 3 of a 10-step episode; slice 1: 5 steps (the batch's length).
    g.gather(&[sref(0, 3, 2), sref(1, 0, 5)], &mut batch)
        .unwrap();
    assert_eq!((batch.num_slices, batch.slice_len), (2, 5));
    assert_eq!(&batch.mask[..5], &[1, 1, 0, 0, 0]);
    assert_eq!(&batch.mask[5..], &[1, 1, 1, 1, 1]);
    // The slice ends at its own last step, which is not its episode's last.
    assert_eq!(&batch.slice_end[..5], &[0, 1, 0, 0, 0]);
    assert_eq!(&batch.is_last[..5], &[0, 0, 0, 0, 0]);
    let reward = batch.columns[0].data.as_slice();
    let whole = {
        let mut full = Batch::default();
        g.gather(&[sref(0, 3, 5)], &mut full).unwrap();
        full.columns[0].data.as_slice().to_vec()
    };
    assert_eq!(&reward[..8], &whole[..8], "the two steps it covers");
    assert!(reward[8..20].iter().all(|&x| x == 0), "padding is zeros");
}

#[test]
fn gather_into_checks_every_destination_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), &[4, 6], 1 << 20);
    let g = Gatherer::try_new(&snap, &[col::OBSERVATION, col::IS_LAST]).unwrap();
    let plan = [sref(0, 0, 4), sref(1, 2, 4)];
    let (b, l) = (2, 4);
    let steps = g.step_bytes();
    assert_eq!(steps, vec![8, 1]);
    type Bufs = (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<u64>, Vec<i64>);
    let fresh = || -> Bufs {
        (
            steps.iter().map(|s| vec![0xAB; b * l * s]).collect(),
            vec![vec![7u8; b * l]; 6],
            vec![9; b],
            vec![9; b],
        )
    };
    fn run(
        g: &Gatherer,
        plan: &[SliceRef],
        l: usize,
        bufs: &mut Bufs,
        skip_column: bool,
    ) -> Result<()> {
        let (cols, flags, ids, starts) = bufs;
        let mut f = flags.iter_mut();
        let mut columns: Vec<&mut [u8]> = cols.iter_mut().map(|c| c.as_mut_slice()).collect();
        if skip_column {
            columns.pop();
        }
        g.gather_into(
            plan,
            l,
            GatherInto {
                columns,
                flags: std::array::from_fn(|_| f.next().unwrap().as_mut_slice()),
                episode_id: ids,
                start_step: starts,
            },
        )
    }
    let untouched = |bufs: &Bufs, what: &str| {
        let (cols, flags, ids, starts) = bufs;
        assert!(
            cols.iter().all(|c| c.iter().all(|&x| x == 0xAB))
                && flags.iter().all(|f| f.iter().all(|&x| x == 7))
                && ids.iter().all(|&x| x == 9)
                && starts.iter().all(|&x| x == 9),
            "{what}: a destination was written"
        );
    };
    let invalid = |r: Result<()>, what: &str| {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{what}: {e}");
    };
    // One destination per gathered column.
    let mut bufs = fresh();
    invalid(run(&g, &plan, l, &mut bufs, true), "a column missing");
    untouched(&bufs, "a column missing");
    // A column too small.
    let mut bufs = fresh();
    bufs.0[0].pop();
    invalid(run(&g, &plan, l, &mut bufs, false), "short column");
    untouched(&bufs, "short column");
    // A flag plane too small.
    let mut bufs = fresh();
    bufs.1[5].pop();
    invalid(run(&g, &plan, l, &mut bufs, false), "short flags");
    untouched(&bufs, "short flags");
    // Per-slice vectors too small.
    let mut bufs = fresh();
    bufs.2.pop();
    invalid(run(&g, &plan, l, &mut bufs, false), "short ids");
    untouched(&bufs, "short ids");
    let mut bufs = fresh();
    bufs.3.pop();
    invalid(run(&g, &plan, l, &mut bufs, false), "short starts");
    untouched(&bufs, "short starts");
    // A slice longer than the destination's slice length.
    let mut bufs = fresh();
    invalid(run(&g, &plan, l - 1, &mut bufs, false), "long slice");
    untouched(&bufs, "long slice");
    // Larger destinations are fine: the batch fills their front.
    let mut bufs = fresh();
    bufs.0[0].extend([0xAB; 16]);
    run(&g, &plan, l, &mut bufs, false).unwrap();
    let mut want = Batch::default();
    g.gather(&plan, &mut want).unwrap();
    assert_eq!(&bufs.0[0][..b * l * 8], want.columns[0].data.as_slice());
    assert_eq!(&bufs.0[0][b * l * 8..], &[0xAB; 16]);
    assert_eq!(bufs.1[2], want.is_last);
}

#[test]
fn unknown_columns_are_invalid_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dataset(dir.path(), &[4], 1 << 20);
    let e = Gatherer::try_new(&snap, &[col::REWARD, "nope"]).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { argument: Some(ref a), .. } if a == "columns"),
        "{e}"
    );
    assert!(
        e.to_string().contains("nope") && e.to_string().contains("pixels"),
        "{e}"
    );
}

#[test]
fn reused_batches_follow_the_gatherer_columns() {
    let dir = tempfile::tempdir().unwrap();
    let lens = [6, 7];
    let snap = dataset(dir.path(), &lens, 1 << 20);
    let plan = [sref(1, 1, 5)];
    let mut batch = Batch::default();
    Gatherer::try_new(&snap, &[col::REWARD, "cost"])
        .unwrap()
        .gather(&plan, &mut batch)
        .unwrap();
    assert_eq!(batch.columns.len(), 2);
    let g = Gatherer::try_new(&snap, &ALL).unwrap();
    g.gather(&plan, &mut batch).unwrap();
    let names: Vec<&str> = batch.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ALL);
    check(&batch, &plan, &lens);
}

#[test]
fn values_from_row0_honours_array_offsets() {
    let flat = Float32Array::from((0..12).map(|x| x as f32).collect::<Vec<_>>());
    let list = fsl_of(DataType::Float32, 3, Arc::new(flat.clone()));
    let (buf, dt, width) = values_from_row0(&list.slice(2, 2));
    assert_eq!((dt, width), (DataType::Float32, 3));
    assert_eq!(
        &buf.typed_data::<f32>()[..6],
        &[6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    );
    let scalar: ArrayRef = Arc::new(flat);
    let (buf, dt, width) = values_from_row0(&scalar.slice(5, 3));
    assert_eq!((dt, width), (DataType::Float32, 1));
    assert_eq!(&buf.typed_data::<f32>()[..3], &[5.0, 6.0, 7.0]);
    // A list whose values array is itself sliced.
    let values: ArrayRef =
        Arc::new(Float32Array::from((0..20).map(|x| x as f32).collect::<Vec<_>>()).slice(4, 12));
    let list = fsl_of(DataType::Float32, 4, values);
    let (buf, _, _) = values_from_row0(&list.slice(1, 2));
    let got = &buf.typed_data::<f32>()[..8];
    assert_eq!(got, &(8..16).map(|x| x as f32).collect::<Vec<_>>()[..]);
    let reference = list.as_fixed_size_list().value(1);
    assert_eq!(
        &got[..4],
        reference.as_primitive::<Float32Type>().values().as_ref()
    );
}

#[test]
fn element_sizes() {
    for (dt, n) in [
        (DataType::Boolean, 1),
        (DataType::UInt8, 1),
        (DataType::Int16, 2),
        (DataType::Float16, 2),
        (DataType::UInt32, 4),
        (DataType::Float32, 4),
        (DataType::Int64, 8),
        (DataType::Float64, 8),
    ] {
        assert_eq!(elem_size(&dt), n, "{dt}");
    }
}

/// The streamed copy of cached frames equals a plain copy, whatever the destination's alignment
/// and length (the aligned middle in 64-byte steps, a head and a tail copied plainly).
#[test]
fn a_streamed_copy_equals_a_plain_copy() {
    let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    let mut buf = vec![0u8; 10_100];
    for off in [0, 1, 7, 15, 16, 33] {
        for len in [0, 1, 15, 16, 63, 64, 65, 7056, 9_999] {
            buf.fill(0xee);
            simd::copy_streaming(&mut buf[off..off + len], &src[..len]);
            assert_eq!(
                &buf[off..off + len],
                &src[..len],
                "offset {off}, {len} bytes"
            );
            assert!(
                buf[..off].iter().all(|&b| b == 0xee),
                "before, offset {off}"
            );
            assert!(
                buf[off + len..].iter().all(|&b| b == 0xee),
                "after, {len} bytes"
            );
        }
    }
}
