//! Export of a snapshot to Parquet, for tools that do not read Arrow IPC.

use std::fs::File;
use std::path::Path;

use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use crate::error::{IoContext, Result};
use crate::format::tmp_path;
use crate::store::Snapshot;

/// Writes every transition of `snap` (boundary columns included) to `out` as Parquet with zstd
/// compression, row groups of up to 1 Mi rows, and the Arrow schema embedded (so the tensor shape
/// metadata survives). Written to a temporary name and renamed, so `out` is never half-written.
/// Streams batch by batch: memory is bounded by one row group. Returns the rows written.
///
/// `out` inside a dataset directory (this one or any other) is refused with
/// [`crate::Error::InvalidArgument`] before anything is written.
pub fn export_parquet(snap: &Snapshot, out: &Path, on_rows: impl Fn(u64)) -> Result<u64> {
    crate::store::dataset::check_output_path("output", out)?;
    let tmp = tmp_path(out);
    let file = File::create(&tmp).at(&tmp)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
        .set_max_row_group_row_count(Some(1 << 20))
        .build();
    let result = (|| {
        let mut w = ArrowWriter::try_new(file, snap.schema().arrow_schema().clone(), Some(props))?;
        let mut rows = 0u64;
        for seg in snap.segments() {
            for batch in seg.batches()? {
                crate::store::ipc::will_need_batch(batch);
                w.write(batch)?;
                rows += batch.num_rows() as u64;
                on_rows(batch.num_rows() as u64);
            }
        }
        w.close()?;
        Ok(rows)
    })();
    match result {
        Ok(rows) => {
            std::fs::rename(&tmp, out).at(out)?;
            Ok(rows)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}
