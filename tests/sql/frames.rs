//! SQL on a frame column (`src/sql/functions.rs`): a frame is a `LargeBinary` value, and
//! `octet_length(observation)` (and of the episode table's `final_observation`) is its stored
//! size, computed from the column's offsets (nothing decoded), equal to the sizes read straight
//! from the segments; `octet_length` of strings is DataFusion's as before.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::{DataType, Int32Type, Int64Type};
use trajstore::frames::FrameCodec;
use trajstore::sql::SqlSession;
use trajstore::{Dataset, Snapshot};

use crate::common::run_cli as run;
use crate::store::frames::{frame_schema, write_episodes};

const SHAPE: [usize; 2] = [84, 84];

/// A zstd-dict frame dataset of 10 episodes in two commits (two segments).
fn frames(dir: &std::path::Path) -> Snapshot {
    let ds = Dataset::create(
        dir.join("f.trajstore"),
        &frame_schema(FrameCodec::ZstdDict, &SHAPE),
    )
    .unwrap();
    write_episodes(&ds, &SHAPE, 6, 30);
    write_episodes(&ds, &SHAPE, 4, 17);
    ds.snapshot().unwrap()
}

/// (episode id, stored bytes of each frame, stored bytes of the final frame), from the
/// segments themselves.
fn stored_sizes(snap: &Snapshot) -> Vec<(u64, Vec<i64>, Option<i64>)> {
    let mut out = vec![];
    for seg in snap.segments() {
        let t = seg.episode_table();
        for i in 0..t.len() {
            let (start, len) = (t.row_starts()[i], t.lengths()[i] as usize);
            let run = seg.frames("observation", start, len).unwrap();
            let sizes = (0..run.len())
                .map(|r| run.frame(r).unwrap().len() as i64)
                .collect();
            let id = seg.entry().first_episode_id + i as u64;
            out.push((id, sizes, t.final_frame(i).map(|f| f.len() as i64)));
        }
    }
    out
}

fn one(batches: &[RecordBatch]) -> RecordBatch {
    concat_batches(&batches[0].schema(), batches).unwrap()
}

#[test]
fn octet_length_of_a_frame_is_its_stored_size() {
    let dir = tempfile::tempdir().unwrap();
    let snap = frames(dir.path());
    assert_eq!(snap.segments().len(), 2);
    let want = stored_sizes(&snap);
    let s = SqlSession::try_new(&snap).unwrap();

    let r = s
        .query(
            "SELECT episode_id, step, octet_length(observation) AS n FROM transitions \
             ORDER BY episode_id, step",
        )
        .unwrap();
    let b = one(&r.batches);
    assert_eq!(
        b.column(2).data_type(),
        &DataType::Int64,
        "LargeBinary: Int64"
    );
    let ids = b.column(0).as_primitive::<arrow::datatypes::UInt64Type>();
    let n = b.column(2).as_primitive::<Int64Type>();
    let mut k = 0;
    for (id, sizes, _) in &want {
        for &size in sizes {
            assert_eq!((ids.value(k), n.value(k)), (*id, size), "row {k}");
            k += 1;
        }
    }
    assert_eq!(k, b.num_rows());

    // Aggregates over it, and the episode table's final frames.
    let total: i64 = want.iter().flat_map(|w| &w.1).sum();
    let r = s
        .query(
            "SELECT sum(octet_length(observation)), avg(octet_length(observation)) \
             FROM transitions",
        )
        .unwrap();
    let b = one(&r.batches);
    assert_eq!(b.column(0).as_primitive::<Int64Type>().value(0), total);
    let r = s
        .query(
            "SELECT episode_id, octet_length(final_observation) FROM episodes ORDER BY episode_id",
        )
        .unwrap();
    let b = one(&r.batches);
    let finals = b.column(1).as_primitive::<Int64Type>();
    for (i, (_, _, f)) in want.iter().enumerate() {
        assert_eq!(
            finals.is_valid(i).then(|| finals.value(i)),
            *f,
            "episode {i}"
        );
    }
    // A frame column is scanned, never decoded: the raw frame would be 7,056 bytes.
    assert!(want.iter().flat_map(|w| &w.1).all(|&n| n < 7_056));

    // Strings keep DataFusion's octet_length; other binary types and NULL work too.
    let r = s
        .query(
            "SELECT octet_length('héllo'), octet_length(X'00FF10'), \
             octet_length(arrow_cast(X'0102', 'BinaryView')), \
             octet_length(arrow_cast(NULL, 'LargeBinary'))",
        )
        .unwrap();
    let b = one(&r.batches);
    assert_eq!(b.column(0).as_primitive::<Int32Type>().value(0), 6);
    assert_eq!(b.column(1).as_primitive::<Int32Type>().value(0), 3);
    assert_eq!(b.column(2).as_primitive::<Int32Type>().value(0), 2);
    assert!(b.column(3).is_null(0));

    // The CLI, as the README shows it.
    let path = snap.path().to_str().unwrap();
    let (code, out, err) = run(&[
        "sql",
        path,
        "SELECT sum(octet_length(observation)) AS bytes FROM transitions",
        "--format",
        "csv",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.lines().nth(1),
        Some(total.to_string().as_str()),
        "{out}"
    );
}
