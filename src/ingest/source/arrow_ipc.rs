//! Arrow IPC input. Files (`.arrow`, `.feather`, `.ipc`: pyarrow's `ipc.new_file` and
//! `feather.write_feather`, Polars' `write_ipc`, trajstore's own `sql --format arrow` output):
//! one unit per record batch, read in parallel. Streams (`.arrows`, or a collector's pipe) are
//! read in order by `ingest_stream`, which needs only their [`StreamHead`] to plan.
//!
//! The footer and each record batch's message header are read and checked at open (a few
//! hundred bytes per batch), so row counts are known without reading column data. A unit is then
//! one `pread` of its block, decoded by arrow's `FileDecoder` with the projection (after the
//! file's dictionaries, if any; LZ4/ZSTD-compressed buffers are decoded in builds with
//! DataFusion). The input is read, never memory-mapped: it is not a trajstore file, and another
//! program may change it while it is read.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use arrow::array::RecordBatch;
use arrow::buffer::Buffer;
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::{FileDecoder, StreamReader};
use arrow::ipc::{Block, MetadataVersion};

use super::Source;
use crate::error::{Error, Result};
use crate::guard::quietly;

/// Whether `head` (a file's first bytes) starts like an Arrow IPC stream rather than a file.
pub(crate) fn is_stream(head: &[u8]) -> bool {
    head.starts_with(&[0xff, 0xff, 0xff, 0xff])
}

/// Whether the file at `path` is in the IPC stream format (by its first bytes).
pub(crate) fn is_stream_file(path: &Path) -> Result<bool> {
    let mut head = [0u8; 4];
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let n = std::io::Read::read(&mut f, &mut head).map_err(|e| Error::io(path, e))?;
    Ok(is_stream(&head[..n]))
}

/// What planning an ingest of an IPC stream needs from it: its schema and first batch (for
/// the lengths of list columns). Its batches are read by `ingest_stream` itself, in order.
pub(crate) struct StreamHead {
    path: PathBuf,
    schema: SchemaRef,
    first: Option<RecordBatch>,
}

impl StreamHead {
    /// The stream's first record batch (`None` for a stream without batches).
    pub(crate) fn first(&self) -> Option<&RecordBatch> {
        self.first.as_ref()
    }
}

/// An IPC stream reader over `reader`.
pub(crate) type Batches<R> = StreamReader<BufReader<R>>;

/// Opens the IPC stream `reader` (named `name` in errors): its schema and first batch, read
/// for planning, and the reader positioned after that batch.
pub(crate) fn open_stream<R: Read>(reader: R, name: &Path) -> Result<(Batches<R>, StreamHead)> {
    let mut batches = quietly(|| StreamReader::try_new(BufReader::new(reader), None))
        .map_err(|_| Error::corrupt(name, "undecodable Arrow IPC stream schema"))?
        .map_err(|e| Error::corrupt(name, format!("not an Arrow IPC stream: {e}")))?;
    let first = next_batch(&mut batches, name, 0)?;
    let head = StreamHead {
        path: name.to_path_buf(),
        schema: batches.schema(),
        first,
    };
    Ok((batches, head))
}

/// The stream's next record batch (`None` at its end); `row` (rows read so far) locates errors.
pub(crate) fn next_batch<R: Read>(
    batches: &mut Batches<R>,
    name: &Path,
    row: u64,
) -> Result<Option<RecordBatch>> {
    match quietly(|| batches.next()) {
        Ok(None) => Ok(None),
        Ok(Some(Ok(b))) => Ok(Some(b)),
        Ok(Some(Err(e))) => Err(Error::corrupt(name, format!("after row {row}: {e}"))),
        Err(_) => Err(Error::corrupt(
            name,
            format!("after row {row}: undecodable record batch"),
        )),
    }
}

impl Source for StreamHead {
    super::path_and_schema_fields!();

    fn units(&self, _batch_rows: usize) -> Vec<(usize, u64, u64)> {
        vec![]
    }

    fn parallel(&self) -> bool {
        false
    }

    fn read(&self, _: usize, _: &[usize], _: usize) -> Result<Vec<RecordBatch>> {
        Err(Error::argument(
            "unit",
            "a stream has no units: it is read in order by ingest_stream",
        ))
    }

    fn first_row_lengths(&self, cols: &[&str]) -> Result<Vec<(String, usize)>> {
        match &self.first {
            _ if cols.is_empty() => Ok(vec![]),
            Some(b) if b.num_rows() > 0 => super::row0_list_lengths(b, cols),
            _ => Err(Error::invalid_data(
                "the stream's first record batch has no rows, so the length of this list column \
                 cannot be inferred",
            )
            .in_input(self.path.display())
            .in_column(cols[0])),
        }
    }
}

pub(crate) struct ArrowSource {
    path: PathBuf,
    file: File,
    schema: SchemaRef,
    version: MetadataVersion,
    dictionaries: Vec<Block>,
    /// Each record batch's block, in file order.
    blocks: Vec<Block>,
    /// Rows of each record batch.
    rows: Vec<u64>,
}

impl ArrowSource {
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let corrupt = |r: String| Error::corrupt(path, r);
        let read_at = |off: u64, n: usize| -> Result<Vec<u8>> {
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, off)
                .map_err(|e| Error::io(path, e))?;
            Ok(buf)
        };
        let head = read_at(0, 8.min(len as usize))?;
        if is_stream(&head) {
            return Err(Error::argument(
                "input",
                format!(
                    "{} is an Arrow IPC stream, not a file: its batches are read in order \
                     (`ingest` does so)",
                    path.display()
                ),
            ));
        }
        let tail = read_at(len.saturating_sub(10), 10.min(len as usize))?;
        let (footer_start, footer_end) = crate::store::ipc::footer_span(path, &head, &tail, len)?;
        let footer_bytes = read_at(footer_start, (footer_end - footer_start) as usize)?;
        let footer = arrow::ipc::root_as_footer(&footer_bytes)
            .map_err(|e| corrupt(format!("invalid footer: {e}")))?;
        let check_block = |b: &Block, what: &str| {
            crate::store::ipc::block_span(path, what, b, footer_start).map(|_| ())
        };
        let dictionaries: Vec<Block> = footer
            .dictionaries()
            .into_iter()
            .flatten()
            .copied()
            .collect();
        for (i, block) in dictionaries.iter().enumerate() {
            check_block(block, &format!("dictionary {i}"))?;
        }
        let (mut rows, mut blocks) = (vec![], vec![]);
        for (i, block) in footer.recordBatches().into_iter().flatten().enumerate() {
            let what = format!("record batch {i}");
            let bad = |m: String| corrupt(format!("{what}: {m}"));
            check_block(block, &what)?;
            let (off, meta_len) = (block.offset(), block.metaDataLength());
            let header = read_at(off as u64, meta_len as usize)?;
            let message = crate::store::ipc::block_message(path, &what, &header)?;
            let batch = message
                .header_as_record_batch()
                .ok_or_else(|| bad("message is not a record batch".into()))?;
            if batch.length() < 0 {
                return Err(bad(format!("{} rows", batch.length())));
            }
            rows.push(batch.length() as u64);
            blocks.push(*block);
        }
        let schema = crate::store::ipc::footer_schema(path, &footer)?;
        let version = footer.version();
        Ok(ArrowSource {
            path: path.to_path_buf(),
            file,
            schema: std::sync::Arc::new(schema),
            version,
            dictionaries,
            blocks,
            rows,
        })
    }
}

/// Runs an arrow reader call, turning its errors and panics (on malformed input) into
/// [`Error::Corrupt`] naming `path`.
fn guarded<T>(
    path: &Path,
    f: impl FnOnce() -> std::result::Result<T, Box<dyn std::error::Error>>,
) -> Result<T> {
    match quietly(f) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::corrupt(path, e.to_string())),
        Err(_) => Err(Error::corrupt(path, "undecodable Arrow IPC data")),
    }
}

impl Source for ArrowSource {
    super::path_and_schema_fields!();

    fn units(&self, _batch_rows: usize) -> Vec<(usize, u64, u64)> {
        super::parquet::units_of(
            self.rows
                .iter()
                .copied()
                .enumerate()
                .filter(|&(_, n)| n > 0),
        )
    }

    fn parallel(&self) -> bool {
        true
    }

    fn read(
        &self,
        unit: usize,
        projection: &[usize],
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let block_bytes = |b: &Block| -> Result<Buffer> {
            let len = b.metaDataLength() as usize + b.bodyLength() as usize;
            let mut buf = vec![0u8; len];
            self.file
                .read_exact_at(&mut buf, b.offset() as u64)
                .map_err(|e| Error::io(&self.path, e))?;
            Ok(Buffer::from_vec(buf))
        };
        let dictionaries = self
            .dictionaries
            .iter()
            .map(|b| Ok((*b, block_bytes(b)?)))
            .collect::<Result<Vec<_>>>()?;
        let block = self.blocks[unit];
        let data = block_bytes(&block)?;
        let batch = guarded(&self.path, || {
            let mut decoder = FileDecoder::new(self.schema.clone(), self.version)
                .with_projection(projection.to_vec());
            for (b, buf) in &dictionaries {
                decoder.read_dictionary(b, buf)?;
            }
            match decoder.read_record_batch(&block, &data)? {
                Some(b) => Ok(b),
                None => Err("the message is not a record batch".into()),
            }
        })
        .map_err(|e| match e {
            Error::Corrupt { path, reason } => Error::Corrupt {
                path,
                reason: format!("record batch {unit}: {reason}"),
            },
            e => e,
        })?;
        if batch.num_rows() as u64 != self.rows[unit] {
            return Err(Error::corrupt(
                &self.path,
                format!(
                    "record batch {unit} has {} rows, its header says {}",
                    batch.num_rows(),
                    self.rows[unit]
                ),
            ));
        }
        let step = batch_rows.max(1);
        Ok((0..batch.num_rows())
            .step_by(step)
            .map(|off| batch.slice(off, step.min(batch.num_rows() - off)))
            .collect())
    }

    fn first_row_lengths(&self, cols: &[&str]) -> Result<Vec<(String, usize)>> {
        if cols.is_empty() {
            return Ok(vec![]);
        }
        let Some(&(unit, _, _)) = self.units(1).first() else {
            return Err(Error::invalid_data(
                "the input has no rows, so the length of this list column cannot be inferred",
            )
            .in_input(self.path.display())
            .in_column(cols[0]));
        };
        let idx: Vec<usize> = cols
            .iter()
            .filter_map(|c| self.schema.index_of(c).ok())
            .collect();
        let batch = self.read(unit, &idx, usize::MAX)?.swap_remove(0);
        super::row0_list_lengths(&batch, cols)
    }
}
