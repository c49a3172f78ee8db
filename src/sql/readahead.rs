//! Read-ahead for scans of mapped segments. Segments are mapped for random access (a fault reads
//! only its page), so a scan asks the kernel for each record batch's buffers in large requests
//! one batch before it hands the batch on: the disk reads the next batch while the current one is
//! computed on.

use arrow::array::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::store::ipc::will_need_batch;

/// `inner` with every batch's buffers read ahead (`madvise(WILLNEED)`) one batch early. Same
/// batches, same order, same errors.
pub(crate) fn read_ahead(inner: SendableRecordBatchStream) -> SendableRecordBatchStream {
    let schema = inner.schema();
    let stream = futures::stream::unfold(
        (inner, None::<RecordBatch>, false),
        |(mut inner, mut held, mut done)| async move {
            while !done {
                match inner.next().await {
                    Some(Ok(b)) => {
                        will_need_batch(&b);
                        if let Some(prev) = held.replace(b) {
                            return Some((Ok(prev), (inner, held, done)));
                        }
                    }
                    Some(Err(e)) => return Some((Err(e), (inner, held, done))),
                    None => done = true,
                }
            }
            held.take().map(|h| (Ok(h), (inner, None, true)))
        },
    );
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::error::DataFusionError;
    use futures::TryStreamExt;

    use super::*;

    fn batch(schema: &Arc<Schema>, v: i64) -> RecordBatch {
        RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(vec![v; 3]))]).unwrap()
    }

    #[tokio::test]
    async fn same_batches_in_the_same_order() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        for n in [0, 1, 2, 5] {
            let items: Vec<_> = (0..n).map(|i| Ok(batch(&schema, i))).collect();
            let inner = Box::pin(RecordBatchStreamAdapter::new(
                schema.clone(),
                futures::stream::iter(items),
            ));
            let out: Vec<RecordBatch> = read_ahead(inner).try_collect().await.unwrap();
            let got: Vec<i64> = out
                .iter()
                .map(|b| {
                    b.column(0)
                        .as_any()
                        .downcast_ref::<Int64Array>()
                        .unwrap()
                        .value(0)
                })
                .collect();
            assert_eq!(got, (0..n).collect::<Vec<_>>());
        }
        let items = vec![
            Ok(batch(&schema, 0)),
            Err(DataFusionError::Internal("boom".into())),
        ];
        let inner = Box::pin(RecordBatchStreamAdapter::new(
            schema.clone(),
            futures::stream::iter(items),
        ));
        let e = read_ahead(inner).try_collect::<Vec<_>>().await.unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
    }
}
