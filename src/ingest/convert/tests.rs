//! Unit tests of the ingest conversion: every supported input shape (scalars, fixed-size lists,
//! nested fixed-size lists, variable-size and large lists, several columns combined), every element
//! type, flags, episode ids, user columns, and the errors, which name the column and the input row.

use super::*;

use std::path::{Path, PathBuf};

use arrow::array::{
    Float32Array, Float64Array, Int8Array, Int16Array, Int32Array, Int64Array, LargeListArray,
    ListArray, StringArray, UInt8Array, UInt16Array, UInt64Array,
};
use arrow::datatypes::SchemaRef;

/// A one-unit [`Source`] over a batch in memory.
struct MemSource {
    path: PathBuf,
    batch: RecordBatch,
}

impl Source for MemSource {
    fn path(&self) -> &Path {
        &self.path
    }
    fn schema(&self) -> SchemaRef {
        self.batch.schema()
    }
    fn units(&self, _batch_rows: usize) -> Vec<(usize, u64, u64)> {
        vec![(0, 0, self.batch.num_rows() as u64)]
    }
    fn parallel(&self) -> bool {
        false
    }
    fn read(
        &self,
        _unit: usize,
        projection: &[usize],
        _batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        Ok(vec![self.batch.project(projection)?])
    }
    fn first_row_lengths(&self, cols: &[&str]) -> Result<Vec<(String, usize)>> {
        row0_list_lengths(&self.batch, cols)
    }
}

/// The mapping an ingest of `batch` with `opts` uses.
fn mapping(batch: &RecordBatch, opts: &IngestOptions) -> Mapping {
    let source = MemSource {
        path: PathBuf::from("memory.parquet"),
        batch: batch.clone(),
    };
    Mapping::build(&source, opts).unwrap()
}

fn flag_opts() -> IngestOptions {
    IngestOptions::default()
        .with_terminated_col("terminated")
        .with_truncated_col("truncated")
}

fn arc(a: impl Array + 'static) -> ArrayRef {
    Arc::new(a)
}

fn fsl_of(item: DataType, nullable: bool, width: i32, values: ArrayRef) -> ArrayRef {
    arc(FixedSizeListArray::new(
        Arc::new(Field::new("element", item, nullable)),
        width,
        values,
        None,
    ))
}

fn f32s(v: &[f32]) -> ArrayRef {
    arc(Float32Array::from(v.to_vec()))
}

/// A `List<float32>` (or `LargeList`) of the given rows.
fn list(rows: &[Option<Vec<Option<f32>>>], large: bool) -> ArrayRef {
    if large {
        arc(LargeListArray::from_iter_primitive::<Float32Type, _, _>(
            rows.iter().cloned(),
        ))
    } else {
        arc(ListArray::from_iter_primitive::<Float32Type, _, _>(
            rows.iter().cloned(),
        ))
    }
}

fn row(v: &[f32]) -> Option<Vec<Option<f32>>> {
    Some(v.iter().map(|&x| Some(x)).collect())
}

/// The values of a primitive column or of a fixed-size list column, cast to `f64`.
fn as_f64(a: &ArrayRef) -> Vec<f64> {
    let flat = match a.data_type() {
        DataType::FixedSizeList(..) => a.as_fixed_size_list().values().clone(),
        _ => a.clone(),
    };
    let c = arrow::compute::cast(&flat, &DataType::Float64).unwrap();
    c.as_primitive::<Float64Type>().values().to_vec()
}

/// `batch` with column `name` replaced by `array` (nullability follows the new column).
fn with_column(batch: &RecordBatch, name: &str, array: ArrayRef) -> RecordBatch {
    let schema = batch.schema();
    RecordBatch::try_from_iter(schema.fields().iter().zip(batch.columns()).map(|(f, c)| {
        let c = if f.name() == name {
            array.clone()
        } else {
            c.clone()
        };
        (f.name().clone(), c)
    }))
    .unwrap()
}

fn bools(a: &BooleanArray) -> Vec<bool> {
    a.iter().map(|x| x.unwrap()).collect()
}

fn assert_invalid_data(e: Error, needles: &[&str]) {
    assert!(matches!(e, Error::InvalidData { .. }), "{e}");
    for n in needles {
        assert!(e.to_string().contains(n), "`{n}` not in: {e}");
    }
}

#[test]
fn cast_to_converts_or_names_the_column() {
    let a = arc(Int32Array::from(vec![1, -2, 3]));
    assert!(Arc::ptr_eq(
        &cast_to(&a, &DataType::Int32, "x").unwrap(),
        &a
    ));
    let f = cast_to(&a, &DataType::Float32, "x").unwrap();
    assert_eq!(as_f64(&f), [1.0, -2.0, 3.0]);
    // Unsafe casts are errors, never wrapped or nulled values.
    for (input, to) in [
        (arc(Int64Array::from(vec![0, -1])), DataType::UInt64),
        (arc(Int64Array::from(vec![300])), DataType::UInt8),
        (
            arc(StringArray::from(vec!["1.5", "abc"])),
            DataType::Float32,
        ),
        (arc(Float64Array::from(vec![1e300])), DataType::Int64),
    ] {
        let e = cast_to(&input, &to, "x").unwrap_err();
        assert_invalid_data(e, &["column `x`", "cannot convert"]);
    }
}

#[test]
fn nulls_are_named_by_their_input_row() {
    let a = arc(Float32Array::from(vec![Some(1.0), None, Some(3.0)]));
    let e = check_no_nulls(a.as_ref(), "reward", 100).unwrap_err();
    assert_invalid_data(e, &["row 101", "`reward`"]);
    check_no_nulls(f32s(&[1.0, 2.0]).as_ref(), "reward", 0).unwrap();
    // A sliced array past its null.
    check_no_nulls(a.slice(2, 1).as_ref(), "reward", 0).unwrap();
    let e = check_no_nulls(a.slice(1, 2).as_ref(), "reward", 10).unwrap_err();
    assert_invalid_data(e, &["row 10"]);
}

#[test]
fn flatten_reads_every_supported_shape() {
    let v: Vec<f32> = (0..12).map(|x| x as f32).collect();
    let want: Vec<f64> = v.iter().map(|&x| x as f64).collect();
    // Scalars: one value per row.
    let got = flatten(&f32s(&v), "x", 1, 0).unwrap();
    assert_eq!(as_f64(&got), want);
    // A fixed-size list.
    let fixed = fsl_of(DataType::Float32, false, 3, f32s(&v));
    assert_eq!(as_f64(&flatten(&fixed, "x", 3, 0).unwrap()), want);
    // A nested one ([2, 3] per row).
    let inner = fsl_of(DataType::Float32, false, 3, f32s(&v));
    let nested = arc(FixedSizeListArray::new(
        Arc::new(Field::new("item", inner.data_type().clone(), false)),
        2,
        inner,
        None,
    ));
    assert_eq!(as_f64(&flatten(&nested, "x", 6, 0).unwrap()), want);
    // Variable-size lists of constant length, small and large offsets.
    let rows: Vec<_> = v.chunks(4).map(row).collect();
    for large in [false, true] {
        let l = list(&rows, large);
        assert_eq!(as_f64(&flatten(&l, "x", 4, 0).unwrap()), want, "{large}");
        // A slice starts at its own first row's values.
        let got = flatten(&l.slice(1, 2), "x", 4, 0).unwrap();
        assert_eq!(as_f64(&got), want[4..], "{large}");
    }
}

#[test]
fn flatten_errors_name_the_row() {
    let base = 1000;
    // A list of another length than the first row's.
    for large in [false, true] {
        let l = list(&[row(&[1.0, 2.0]), row(&[3.0, 4.0]), row(&[5.0])], large);
        let e = flatten(&l, "obs", 2, base).unwrap_err();
        assert_invalid_data(e, &["row 1002", "`obs`", "length 1", "expected 2"]);
        // A null item, and a null row.
        let l = list(&[row(&[1.0, 2.0]), Some(vec![Some(3.0), None])], large);
        let e = flatten(&l, "obs", 2, base).unwrap_err();
        assert_invalid_data(e, &["row 1001", "null list item"]);
        let l = list(&[row(&[1.0, 2.0]), None], large);
        let e = flatten(&l, "obs", 2, base).unwrap_err();
        assert_invalid_data(e, &["row 1001", "is null"]);
    }
    // A null item of a fixed-size list, nested too.
    let items = arc(Float32Array::from(vec![
        Some(0.0),
        Some(1.0),
        Some(2.0),
        Some(3.0),
        None,
        Some(5.0),
    ]));
    let fixed = fsl_of(DataType::Float32, true, 2, items.clone());
    let e = flatten(&fixed, "obs", 2, base).unwrap_err();
    assert_invalid_data(e, &["row 1002", "null list item"]);
    let inner = fsl_of(DataType::Float32, true, 1, items);
    let nested = arc(FixedSizeListArray::new(
        Arc::new(Field::new("item", inner.data_type().clone(), false)),
        3,
        inner,
        None,
    ));
    let e = flatten(&nested, "obs", 3, base).unwrap_err();
    assert_invalid_data(e, &["row 1001", "null list item"]);
    // Fewer values than the width needs.
    let e = flatten(&f32s(&[1.0, 2.0]), "obs", 2, base).unwrap_err();
    assert_invalid_data(e, &["`obs`", "2 values for 2 rows", "expected 2 per row"]);
}

#[test]
fn interleave_rows_handles_every_element_type() {
    // Row r of the output is row r of each part: widths 1 and 2.
    let a: ArrayRef = arc(Int64Array::from(vec![1, 2, 3]));
    let b: ArrayRef = arc(Int64Array::from(vec![10, 11, 20, 21, 30, 31]));
    let want = [1.0, 10.0, 11.0, 2.0, 20.0, 21.0, 3.0, 30.0, 31.0];
    for dt in [
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
    ] {
        let parts = [
            (arrow::compute::cast(&a, &dt).unwrap(), 1),
            (arrow::compute::cast(&b, &dt).unwrap(), 2),
        ];
        let got = interleave_rows(&parts, 3, &dt).unwrap();
        assert_eq!(got.data_type(), &dt);
        assert_eq!(as_f64(&got), want, "{dt}");
    }
    let flags: ArrayRef = arc(BooleanArray::from(vec![true, false]));
    let e = interleave_rows(&[(flags.clone(), 1), (flags, 1)], 2, &DataType::Boolean).unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
}

#[test]
fn convert_user_keeps_the_stored_type() {
    let stored = Field::new(
        "pose",
        DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), 2),
        false,
    );
    // Another child name and element type: cast and rebuilt with the stored child.
    let input = fsl_of(
        DataType::Float64,
        true,
        2,
        arc(Float64Array::from(vec![0.5, 1.5, 2.5, 3.5])),
    );
    let got = convert_user(&stored, &input, 0).unwrap();
    assert_eq!(got.data_type(), stored.data_type());
    assert_eq!(as_f64(&got), [0.5, 1.5, 2.5, 3.5]);
    // A null row of a non-nullable column, a null item of a valid row.
    let with_null_row = arc(FixedSizeListArray::new(
        Arc::new(Field::new("element", DataType::Float64, true)),
        2,
        arc(Float64Array::from(vec![Some(0.0), Some(1.0), None, None])),
        Some(vec![true, false].into()),
    ));
    let e = convert_user(&stored, &with_null_row, 40).unwrap_err();
    assert_invalid_data(e, &["row 41", "`pose`", "is null"]);
    // ... which a nullable column takes, items under the null row included.
    let nullable = stored.clone().with_nullable(true);
    let got = convert_user(&nullable, &with_null_row, 40).unwrap();
    assert_eq!((got.len(), got.null_count()), (2, 1));
    let null_item = fsl_of(
        DataType::Float64,
        true,
        2,
        arc(Float64Array::from(vec![
            Some(0.0),
            Some(1.0),
            Some(2.0),
            None,
        ])),
    );
    let e = convert_user(&nullable, &null_item, 40).unwrap_err();
    assert_invalid_data(e, &["row 41", "null list item"]);
    // Scalars are cast to the stored type.
    let cost = Field::new("cost", DataType::Int64, false);
    let got = convert_user(&cost, &arc(Int16Array::from(vec![-3, 4])), 0).unwrap();
    assert_eq!(got.data_type(), &DataType::Int64);
    assert_eq!(as_f64(&got), [-3.0, 4.0]);
    let e = convert_user(&cost, &arc(Int16Array::from(vec![Some(1), None])), 7).unwrap_err();
    assert_invalid_data(e, &["row 8", "`cost`"]);
}

#[test]
fn convert_flags_reads_bools_and_numbers() {
    let batch = RecordBatch::try_from_iter([
        ("b", arc(BooleanArray::from(vec![false, true, false, true]))),
        ("i", arc(Int8Array::from(vec![0, 1, 2, -1]))),
        ("f", arc(Float32Array::from(vec![0.0, 0.5, 0.0, -2.0]))),
        ("u", arc(UInt64Array::from(vec![0, 0, 7, 0]))),
        (
            "n",
            arc(Int32Array::from(vec![Some(0), Some(0), None, Some(1)])),
        ),
    ])
    .unwrap();
    assert!(convert_flags(&batch, &None, 0).unwrap().is_none());
    let got = |name: &str| {
        bools(
            &convert_flags(&batch, &Some(name.into()), 0)
                .unwrap()
                .unwrap(),
        )
    };
    assert_eq!(got("b"), [false, true, false, true]);
    assert_eq!(got("i"), [false, true, true, true]);
    assert_eq!(got("f"), [false, true, false, true]);
    assert_eq!(got("u"), [false, false, true, false]);
    let e = convert_flags(&batch, &Some("n".into()), 20).unwrap_err();
    assert_invalid_data(e, &["row 22", "`n`"]);
    let e = convert_flags(&batch, &Some("missing".into()), 0).unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
}

/// Flag mode: fixed-size list observation, a float64 continuous action (kept float64), a float64
/// reward (stored float32), an int8 truncated flag, and user columns of several types.
#[test]
fn convert_in_flag_mode() {
    let obs: Vec<f32> = (0..12).map(|x| x as f32 / 4.0).collect();
    let act: Vec<f64> = (0..8).map(|x| -(x as f64)).collect();
    let batch = RecordBatch::try_from_iter([
        (
            "observation",
            fsl_of(DataType::Float32, true, 3, f32s(&obs)),
        ),
        (
            "action",
            fsl_of(
                DataType::Float64,
                false,
                2,
                arc(Float64Array::from(act.clone())),
            ),
        ),
        ("reward", arc(Float64Array::from(vec![0.5, 1.5, 2.5, 3.5]))),
        (
            "terminated",
            arc(BooleanArray::from(vec![false, false, true, false])),
        ),
        ("truncated", arc(Int8Array::from(vec![0, 0, 0, 1]))),
        ("cost", arc(Int16Array::from(vec![1, 2, 3, 4]))),
        (
            "half",
            arrow::compute::cast(&f32s(&[0.25; 4]), &DataType::Float16).unwrap(),
        ),
        (
            "pixels",
            fsl_of(DataType::UInt8, false, 2, arc(UInt8Array::from(vec![9; 8]))),
        ),
    ])
    .unwrap();
    let m = mapping(&batch, &flag_opts());
    assert!(matches!(m.action, ActionSpec::Continuous(_)));
    let chunk = convert(&m, &batch, 64).unwrap();
    assert_eq!(chunk.base, 64);
    assert!(chunk.ids.is_none());
    assert_eq!(chunk.payload.schema(), *m.schema.payload_schema());
    let p = |name: &str| chunk.payload.column_by_name(name).unwrap().clone();
    let want_obs: Vec<f64> = obs.iter().map(|&x| x as f64).collect();
    assert_eq!(as_f64(&p(col::OBSERVATION)), want_obs);
    assert_eq!(as_f64(&p(col::ACTION)), act);
    assert_eq!(
        p(col::ACTION).as_fixed_size_list().value_type(),
        DataType::Float64
    );
    assert_eq!(p(col::REWARD).data_type(), &DataType::Float32);
    assert_eq!(as_f64(&p(col::REWARD)), [0.5, 1.5, 2.5, 3.5]);
    assert_eq!(as_f64(&p("cost")), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(as_f64(&p("half")), [0.25; 4]);
    assert_eq!(as_f64(&p("pixels")), [9.0; 8]);
    assert_eq!(
        bools(chunk.terminated.as_ref().unwrap()),
        [false, false, true, false]
    );
    assert_eq!(
        bools(chunk.truncated.as_ref().unwrap()),
        [false, false, false, true]
    );
    // Later batches convert the same way, naming their own rows in errors.
    let bad = with_column(
        &batch,
        "reward",
        arc(Float64Array::from(vec![
            Some(0.0),
            None,
            Some(1.0),
            Some(2.0),
        ])),
    );
    let e = convert(&m, &bad, 500).err().unwrap();
    assert_invalid_data(e, &["row 501", "`reward`"]);
    // A batch without a mapped column.
    let short = batch.project(&[0, 1, 2, 3, 4, 5, 6]).unwrap();
    let e = convert(&m, &short, 0).err().unwrap();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
    assert!(e.to_string().contains("pixels"), "{e}");
}

/// Episode id mode: signed ids keep their bit patterns and are stored as `source_episode`
/// (int64); unsigned ones as uint64. Integer actions are discrete (int64).
#[test]
fn convert_in_episode_id_mode() {
    for signed in [true, false] {
        let ids: ArrayRef = if signed {
            arc(Int32Array::from(vec![-5, -5, 3, 3, 3]))
        } else {
            arc(UInt16Array::from(vec![7, 7, 7, 2, 2]))
        };
        let batch = RecordBatch::try_from_iter([
            ("ep", ids.clone()),
            ("observation", f32s(&[0.0, 1.0, 2.0, 3.0, 4.0])),
            ("action", arc(Int32Array::from(vec![0, 1, 2, 1, 0]))),
            ("reward", arc(Int64Array::from(vec![1, 0, 0, 0, 1]))),
        ])
        .unwrap();
        let m = mapping(&batch, &IngestOptions::default().with_episode_col("ep"));
        assert!(matches!(m.action, ActionSpec::Discrete(_)));
        let chunk = convert(&m, &batch, 0).unwrap();
        let source = chunk.payload.column_by_name(SOURCE_EPISODE).unwrap();
        let want_bits: Vec<u64> = if signed {
            [-5i64, -5, 3, 3, 3].iter().map(|&v| v as u64).collect()
        } else {
            vec![7, 7, 7, 2, 2]
        };
        assert_eq!(chunk.ids.as_deref(), Some(&want_bits[..]));
        let want_type = if signed {
            DataType::Int64
        } else {
            DataType::UInt64
        };
        assert_eq!(source.data_type(), &want_type);
        assert_eq!(
            arrow::compute::cast(source, &DataType::Int64)
                .unwrap()
                .as_ref(),
            arrow::compute::cast(&ids, &DataType::Int64)
                .unwrap()
                .as_ref()
        );
        let action = chunk.payload.column_by_name(col::ACTION).unwrap();
        assert_eq!(action.data_type(), &DataType::Int64);
        assert_eq!(as_f64(action), [0.0, 1.0, 2.0, 1.0, 0.0]);
        // Scalar observations are vectors of one.
        let obs = chunk.payload.column_by_name(col::OBSERVATION).unwrap();
        assert_eq!(obs.as_fixed_size_list().value_length(), 1);
        // A null id names its row.
        let null_id = arrow::compute::cast(
            &arc(Int64Array::from(vec![
                Some(1),
                Some(1),
                None,
                Some(2),
                Some(2),
            ])),
            ids.data_type(),
        )
        .unwrap();
        let bad = with_column(&batch, "ep", null_id);
        let e = convert(&m, &bad, 10).err().unwrap();
        assert_invalid_data(e, &["row 12", "`ep`"]);
    }
}

/// Observations combined from several columns (a scalar and a fixed-size list of another element
/// type: float32), or read from variable-size lists; no reward (zeros).
#[test]
fn convert_combined_and_list_observations() {
    let batch = RecordBatch::try_from_iter([
        ("x", arc(Float32Array::from(vec![1.0, 2.0, 3.0]))),
        (
            "y",
            fsl_of(
                DataType::Float64,
                false,
                2,
                arc(Float64Array::from(vec![10.0, 11.0, 20.0, 21.0, 30.0, 31.0])),
            ),
        ),
        (
            "z",
            list(
                &[
                    row(&[0.0, 0.1, 0.2, 0.3]),
                    row(&[1.0, 1.1, 1.2, 1.3]),
                    row(&[2.0, 2.1, 2.2, 2.3]),
                ],
                false,
            ),
        ),
        ("a", arc(Float32Array::from(vec![0.5, 0.25, 0.0]))),
        ("done", arc(BooleanArray::from(vec![false, false, true]))),
    ])
    .unwrap();
    let opts = IngestOptions::default()
        .with_observation_cols(["x", "y"])
        .with_action_col("a")
        .with_no_reward()
        .with_terminated_col("done")
        .with_drop_cols(["z"]);
    let m = mapping(&batch, &opts);
    assert_eq!(
        m.observation.elem,
        DataType::Float32,
        "mixed types: float32"
    );
    assert_eq!(m.observation.width(), 3);
    let chunk = convert(&m, &batch, 0).unwrap();
    let p = |name: &str| chunk.payload.column_by_name(name).unwrap().clone();
    assert_eq!(
        as_f64(&p(col::OBSERVATION)),
        [1.0, 10.0, 11.0, 2.0, 20.0, 21.0, 3.0, 30.0, 31.0]
    );
    assert_eq!(p(col::ACTION).as_fixed_size_list().value_length(), 1);
    assert_eq!(as_f64(&p(col::ACTION)), [0.5, 0.25, 0.0]);
    assert_eq!(as_f64(&p(col::REWARD)), [0.0; 3]);
    assert!(chunk.truncated.is_none());
    // Variable-size lists: the width is the first row's length.
    let opts = IngestOptions::default()
        .with_observation_col("z")
        .with_action_cols(["x", "a"])
        .with_no_reward()
        .with_terminated_col("done")
        .with_drop_cols(["y"]);
    let m = mapping(&batch, &opts);
    assert_eq!(m.observation.width(), 4);
    let chunk = convert(&m, &batch, 0).unwrap();
    let obs = chunk.payload.column_by_name(col::OBSERVATION).unwrap();
    assert_eq!(obs.as_fixed_size_list().value_length(), 4);
    let want: Vec<f64> = [
        0.0f32, 0.1, 0.2, 0.3, 1.0, 1.1, 1.2, 1.3, 2.0, 2.1, 2.2, 2.3,
    ]
    .iter()
    .map(|&x| x as f64)
    .collect();
    assert_eq!(as_f64(obs), want);
    let act = chunk.payload.column_by_name(col::ACTION).unwrap();
    assert_eq!(as_f64(act), [1.0, 0.5, 2.0, 0.25, 3.0, 0.0]);
    // A later batch whose list rows have another length names the row.
    let short_row = list(&[row(&[0.0; 4]), row(&[0.0; 4]), row(&[0.0; 3])], false);
    let bad = with_column(&batch, "z", short_row);
    let e = convert(&m, &bad, 90).err().unwrap();
    assert_invalid_data(e, &["row 92", "`z`", "length 3", "expected 4"]);
}
