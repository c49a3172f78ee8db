use arrow::array::{FixedSizeListArray, Float32Array, RecordBatch};
use arrow::datatypes::{DataType, Field};
use std::sync::Arc;
use trajstore::{Dataset, EpisodeEnd, TransitionSchema, WriterOptions};

#[test]
fn explore() {
    let dir = std::path::PathBuf::from("/tmp/explore_ds");
    let _ = std::fs::remove_dir_all(&dir);
    let schema = TransitionSchema::builder(&[3], 2).build().unwrap();
    let ds = Dataset::create(&dir, &schema).unwrap();
    let mut writer = ds.writer(WriterOptions::default()).unwrap();
    let list = |n: i32, v: Vec<f32>| {
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        Arc::new(FixedSizeListArray::new(
            item,
            n,
            Arc::new(Float32Array::from(v)),
            None,
        ))
    };
    let batch = RecordBatch::try_from_iter([
        ("observation", list(3, vec![0.5; 12]) as _),
        ("action", list(2, vec![1.0; 8]) as _),
        (
            "reward",
            Arc::new(Float32Array::from(vec![1.0, 0.0, 0.0, 1.0])) as _,
        ),
    ])
    .unwrap();
    writer
        .append_episode(&batch, EpisodeEnd::terminated())
        .unwrap();
    writer
        .append_episode(
            &batch.slice(0, 2),
            EpisodeEnd::truncated().with_final_observation(list(3, vec![9.0; 3])),
        )
        .unwrap();
    writer.commit().unwrap();
    let snap = ds.snapshot().unwrap();
    println!("{:#?}", snap.segments()[0].batches()[0].schema());
    println!("{:#?}", snap.segments()[0].episode_table());
}
