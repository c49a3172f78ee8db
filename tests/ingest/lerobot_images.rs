//! LeRobot `image` features: PNG bytes inside the Parquet files (Hugging Face `datasets`'
//! `Image` storage, `{bytes, path}`), from `tests/data/lerobot_images/` (written by LeRobot's
//! own writer, `tests/python/make_lerobot_image_fixtures.py`). Each camera becomes a frame column
//! whose frames equal Pillow's decoding of the same bytes; a damaged image is an error naming the
//! file, the column and the row, with nothing committed. No feature needed (PNG and JPEG decoders
//! are in the default build).

use std::path::Path;

use arrow::array::{Array, ArrayRef, AsArray, BinaryArray, RecordBatch, StructArray};
use arrow::datatypes::{DataType, Field};
use trajstore::frames::FrameCodec;
use trajstore::ingest::{IngestOptions, InputFormat, ingest};
use trajstore::{Dataset, Error, Snapshot};

use crate::common::{copy_tree, fixture_path, small_segments};

const FRONT: &str = "observation.images.front";
const WRIST: &str = "observation.images.wrist";

fn ingest_with(input: &Path, out: &Path, opts: &IngestOptions) -> trajstore::Result<()> {
    ingest(
        input,
        InputFormat::detect(input).unwrap(),
        out,
        opts,
        small_segments(),
    )
    .map(|_| ())
}

#[test]
fn image_features_become_frame_columns_equal_to_pillows_decoding() {
    let input = fixture_path("lerobot_images", "v3");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    let report = ingest(
        &input,
        InputFormat::detect(&input).unwrap(),
        &out,
        &IngestOptions::default(),
        small_segments(),
    )
    .unwrap();
    assert_eq!((report.rows, report.episodes), (21, 3));
    // The report says which input became which column, and that the images were decoded.
    let front = report.columns.iter().find(|(k, _)| k == FRONT).unwrap();
    assert!(front.1.contains("encoded images"), "{front:?}");
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert_eq!(snap.episodes().lengths(), &[7, 5, 9]);
    for (name, file, shape) in [
        (FRONT, "front.u8", vec![24usize, 32, 3]),
        (WRIST, "wrist.u8", vec![12, 16, 3]),
    ] {
        let col = snap.frame_column(name).expect("a frame column");
        assert_eq!(col.spec.shape, shape, "{name}");
        let want = std::fs::read(fixture_path("lerobot_images", file)).unwrap();
        assert_eq!(stored_frames(&snap, name), want, "{name}");
    }
}

#[test]
fn without_a_frame_codec_images_are_uint8_tensors() {
    let input = fixture_path("lerobot_images", "v3");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ds");
    ingest_with(
        &input,
        &out,
        &IngestOptions::default().with_frame_codec(None),
    )
    .unwrap();
    let snap = Dataset::open(&out).unwrap().snapshot().unwrap();
    assert!(snap.frame_column(FRONT).is_none());
    let field = snap
        .schema()
        .arrow_schema()
        .field_with_name(FRONT)
        .unwrap()
        .clone();
    assert_eq!(
        field.data_type(),
        &DataType::FixedSizeList(
            Field::new("item", DataType::UInt8, false).into(),
            24 * 32 * 3
        )
    );
    let mut got = vec![];
    for seg in snap.segments() {
        for a in seg.column(FRONT).unwrap() {
            let a = a.as_fixed_size_list();
            got.extend_from_slice(
                a.values()
                    .as_primitive::<arrow::datatypes::UInt8Type>()
                    .values(),
            );
        }
    }
    let want = std::fs::read(fixture_path("lerobot_images", "front.u8")).unwrap();
    assert_eq!(got, want);
    // Explicitly asking for a codec stores frames again.
    let out2 = dir.path().join("ds2");
    ingest_with(
        &input,
        &out2,
        &IngestOptions::default().with_frame_codec(Some(FrameCodec::Zstd)),
    )
    .unwrap();
    let snap = Dataset::open(&out2).unwrap().snapshot().unwrap();
    assert_eq!(
        snap.frame_column(WRIST).unwrap().spec.codec,
        FrameCodec::Zstd
    );
}

/// The fixture's data file with row `row`'s front image replaced by `bytes` (`None`: a null).
fn with_image(dir: &Path, row: usize, bytes: Option<&[u8]>) -> std::path::PathBuf {
    let root = dir.join("v3");
    copy_tree(&fixture_path("lerobot_images", "v3"), &root);
    let path = root.join("data/chunk-000/file-000.parquet");
    let file = std::fs::File::open(&path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    let schema = batches[0].schema();
    let mut w = parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(&path).unwrap(),
        schema.clone(),
        None,
    )
    .unwrap();
    let mut seen = 0;
    for b in batches {
        let mut cols = b.columns().to_vec();
        let i = schema.index_of(FRONT).unwrap();
        if (seen..seen + b.num_rows()).contains(&row) {
            let s = cols[i].as_struct();
            let old = s.column_by_name("bytes").unwrap().as_binary::<i32>();
            let values: Vec<Option<&[u8]>> = (0..old.len())
                .map(|k| {
                    if seen + k == row {
                        bytes
                    } else {
                        Some(old.value(k))
                    }
                })
                .collect();
            let new = StructArray::new(
                s.fields().clone(),
                vec![
                    std::sync::Arc::new(BinaryArray::from(values)) as ArrayRef,
                    s.column_by_name("path").unwrap().clone(),
                ],
                s.nulls().cloned(),
            );
            cols[i] = std::sync::Arc::new(new);
        }
        seen += b.num_rows();
        w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
            .unwrap();
    }
    w.close().unwrap();
    root
}

#[test]
fn a_damaged_image_is_an_error_naming_file_column_and_row() {
    let png = {
        let file = std::fs::File::open(fixture_path(
            "lerobot_images",
            "v3/data/chunk-000/file-000.parquet",
        ))
        .unwrap();
        let mut r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        let b = r.next().unwrap().unwrap();
        let s = b.column_by_name(FRONT).unwrap().as_struct().clone();
        s.column_by_name("bytes")
            .unwrap()
            .as_binary::<i32>()
            .value(0)
            .to_vec()
    };
    let truncated = &png[..png.len() / 2];
    let mut other_size = png.clone();
    // The IHDR width (bytes 16..20): 32 → 31 pixels, with a bad CRC, or a short image.
    other_size[19] = 31;
    for (row, bytes, why) in [
        (12, Some(truncated), "PNG"),
        (15, None, "null"),
        (3, Some(&b"GIF89a"[..]), "neither PNG nor JPEG"),
        (20, Some(&other_size[..]), "PNG"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let input = with_image(dir.path(), row, bytes);
        let out = dir.path().join("ds");
        let err = ingest_with(&input, &out, &IngestOptions::default()).unwrap_err();
        let Error::InvalidData {
            column,
            input: file,
            ..
        } = &err
        else {
            panic!("{err}")
        };
        assert_eq!(column.as_deref(), Some(FRONT), "{err}");
        assert!(
            file.as_deref()
                .is_some_and(|f| f.ends_with("file-000.parquet")),
            "{err}"
        );
        let text = err.to_string();
        assert!(text.contains(&format!("row {row}")), "{text}");
        assert!(text.contains(why), "{text}");
        assert!(!out.exists(), "nothing is left behind: {text}");
    }
}

/// Every stored frame of frame column `name`, decoded, in row order.
pub(crate) fn stored_frames(snap: &Snapshot, name: &str) -> Vec<u8> {
    let col = snap.frame_column(name).unwrap();
    let mut dec = col.decoder().unwrap();
    let mut out = vec![];
    let mut buf = vec![0u8; dec.frame_len()];
    for seg in snap.segments() {
        let t = seg.episode_table();
        for i in 0..t.len() {
            let run = seg
                .frames(name, t.row_starts()[i], t.lengths()[i] as usize)
                .unwrap();
            for r in 0..run.len() {
                dec.decode_into(run.frame(r).unwrap(), &mut buf).unwrap();
                out.extend_from_slice(&buf);
            }
        }
    }
    out
}
