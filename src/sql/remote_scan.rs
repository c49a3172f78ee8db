//! The `transitions` table of a dataset in object storage, scanned with ranged reads of its
//! segment objects: per segment, the footer (one GET of the file's tail, whose reply also
//! confirms the object's size against the manifest) and the message headers of its record
//! batches, then only the buffers of the projected columns in the batches the scan keeps
//! (ranges closer than 64 KiB are read with one GET; up to 8 GETs per segment and 8 segments at
//! once). The buffers are copied to their file offsets in an anonymous map of the file's length
//! (untouched pages cost no memory) that the decoded arrays point into.
//!
//! Planning needs only the [`Catalog`] (schema, row counts, episode tables): an empty
//! projection (`COUNT(*)`) reads nothing, segments and record batches are pruned by their
//! `episode_id`/`step` ranges (from the manifest and the episode tables) before anything is
//! fetched, and a limit without filters fetches only the batches it needs. Footers and headers
//! are cached for the life of the table.
//!
//! What is checked: the object's size (the manifest's), the footer, every message header (V5,
//! uncompressed, buffers inside the body) and the row counts (the manifest's). The CRC-32C of a
//! whole file needs all of its bytes, so damage inside column data is not detected here (a pull
//! checks it).

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{RecordBatch, RecordBatchOptions};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, SchemaRef};
use arrow::ipc::MetadataVersion;
use arrow::ipc::reader::RecordBatchDecoder;
use async_trait::async_trait;
use bytes::Bytes;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::Statistics;
use datafusion::common::stats::Precision;
use datafusion::datasource::memory::{DataSourceExec, MemorySourceConfig};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};

use super::SCAN_BATCH_ROWS;
use super::episode_agg::SegmentScan;
use super::table::{Part, may_match, pushdown};
use crate::error::{Error, Result};
use crate::remote::Remote;
use crate::store::Catalog;
use crate::store::ipc::{
    block_message, block_span, footer_schema, footer_span, record_batch_header,
};

/// How much of a segment's end the first GET reads (the footer is usually all in it).
const TAIL: u64 = 4 << 10;
/// Segments, and GETs per segment, in flight at once.
const CONCURRENCY: usize = 8;
/// Ranges of one object closer than this are read with one GET.
const GAP: u64 = 64 << 10;

/// What a [`RemoteTransitions`] has downloaded so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FetchStats {
    /// Ranged GET requests.
    pub requests: u64,
    /// Bytes received.
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl Counters {
    fn add(&self, requests: usize, bytes: usize) {
        self.requests.fetch_add(requests as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// One segment object, as the manifest and episode table describe it.
struct SegmentObject {
    location: ObjectPath,
    url: String,
    bytes: u64,
    rows: u64,
    /// Episode ids `first..end`.
    episodes: (u64, u64),
    max_len: u64,
    /// Per episode: id, first row in the segment, length.
    ids: Vec<u64>,
    row_starts: Vec<u64>,
}

impl SegmentObject {
    /// The ids of the episodes that rows `rows` of this segment belong to, inclusive, as f64.
    fn episode_range(&self, rows: Range<u64>) -> (f64, f64) {
        let at = |r: u64| {
            let i = self
                .row_starts
                .partition_point(|&s| s <= r)
                .saturating_sub(1);
            self.ids.get(i).copied().unwrap_or(self.episodes.0) as f64
        };
        if rows.is_empty() {
            return (f64::INFINITY, f64::NEG_INFINITY);
        }
        (at(rows.start), at(rows.end - 1))
    }

    fn steps(&self) -> (f64, f64) {
        (0.0, self.max_len.saturating_sub(1) as f64)
    }

    fn corrupt(&self, reason: impl Into<String>) -> Error {
        Error::corrupt(&self.url, reason)
    }
}

/// Where one record batch of a segment lies.
struct BatchLayout {
    rows: u64,
    /// The batch's first row in the segment.
    first_row: u64,
    /// File offset and length of the body.
    body: (u64, usize),
    /// Per top-level column, the file ranges of its non-empty buffers; `None` when the column's
    /// type is one whose buffers this does not count (the whole body is read then).
    columns: Option<Vec<Vec<Range<u64>>>>,
}

/// A segment's record batches, from its footer and message headers (fetched once).
struct Layout {
    batches: Vec<BatchLayout>,
    /// The message headers, by batch.
    headers: Vec<Bytes>,
}

/// The `transitions` table of a remote dataset version, read with ranged GETs (see the module
/// docs). Built from the version's [`Catalog`] and the [`Remote`] it came from; the table keeps
/// the store, not the `Remote`.
pub struct RemoteTransitions {
    schema: SchemaRef,
    rows: usize,
    store: Arc<dyn ObjectStore>,
    segments: Vec<SegmentObject>,
    layouts: Mutex<HashMap<usize, Arc<Layout>>>,
    counters: Counters,
}

impl fmt::Debug for RemoteTransitions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteTransitions")
            .field("segments", &self.segments.len())
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl RemoteTransitions {
    /// The table of `catalog`'s version of `remote` (the catalog's manifest names the segment
    /// objects, relative to the remote's URL). Reads nothing.
    pub fn new(remote: &Remote, catalog: &Catalog) -> Result<Self> {
        let m = catalog.manifest();
        let tables = catalog.episode_tables();
        if tables.len() != m.segments.len() {
            return Err(Error::invalid_data(format!(
                "the catalog has {} episode tables for {} segments",
                tables.len(),
                m.segments.len()
            )));
        }
        let segments = m
            .segments
            .iter()
            .zip(tables)
            .map(|(s, t)| {
                let (location, url) = remote.object(&s.path);
                SegmentObject {
                    location,
                    url,
                    bytes: s.bytes,
                    rows: s.rows,
                    episodes: (s.first_episode_id, s.first_episode_id + s.episodes),
                    max_len: t.lengths().iter().copied().max().unwrap_or(0),
                    ids: t.ids().to_vec(),
                    row_starts: t.row_starts().to_vec(),
                }
            })
            .collect();
        Ok(Self {
            schema: catalog.schema().arrow_schema().clone(),
            rows: catalog.num_transitions() as usize,
            store: remote.store().clone(),
            segments,
            layouts: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        })
    }

    /// What this table's scans have downloaded so far.
    pub fn fetched(&self) -> FetchStats {
        FetchStats {
            requests: self.counters.requests.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
        }
    }

    /// A ranged GET of segment `seg` that also checks the object's size.
    async fn get_range(&self, seg: &SegmentObject, range: Range<u64>) -> Result<Bytes> {
        let want = (range.end - range.start) as usize;
        let opts = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            ..Default::default()
        };
        let r = self
            .store
            .get_opts(&seg.location, opts)
            .await
            .map_err(|e| crate::remote::remote_err(&seg.url, e))?;
        if r.meta.size != seg.bytes {
            return Err(seg.corrupt(format!(
                "the object has {} bytes but the manifest says {}",
                r.meta.size, seg.bytes
            )));
        }
        let bytes = r
            .bytes()
            .await
            .map_err(|e| crate::remote::remote_err(&seg.url, e))?;
        self.counters.add(1, bytes.len());
        if bytes.len() != want {
            return Err(seg.corrupt(format!(
                "{} bytes came back for the {want} bytes at {}",
                bytes.len(),
                range.start
            )));
        }
        Ok(bytes)
    }

    /// The bytes of `ranges` of segment `seg`, in their order: ranges closer than [`GAP`] are
    /// read with one GET (the gap is downloaded too, and counted), [`CONCURRENCY`] GETs at once.
    async fn get_ranges(&self, seg: &SegmentObject, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let mut sorted = ranges.to_vec();
        sorted.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = vec![];
        for r in sorted {
            match merged.last_mut() {
                Some(m) if r.start <= m.end.saturating_add(GAP) => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let got: Vec<Bytes> = futures::stream::iter(merged.iter().cloned())
            .map(|r| self.get_range(seg, r))
            .buffered(CONCURRENCY)
            .try_collect()
            .await?;
        Ok(ranges
            .iter()
            .map(|r| {
                // The merged ranges are disjoint and sorted; the one holding `r` starts at or
                // before it.
                let m = merged.partition_point(|m| m.start <= r.start) - 1;
                let base = merged[m].start;
                got[m].slice((r.start - base) as usize..(r.end - base) as usize)
            })
            .collect())
    }

    /// Segment `i`'s layout: cached, else its footer and message headers are fetched.
    async fn layout(&self, i: usize) -> Result<Arc<Layout>> {
        if let Some(l) = self.lock().get(&i) {
            return Ok(l.clone());
        }
        let seg = &self.segments[i];
        let len = seg.bytes;
        let path = std::path::Path::new(&seg.url);
        if len < 18 {
            return Err(seg.corrupt(format!("{len} bytes is too short for an Arrow IPC file")));
        }
        let tail_start = len.saturating_sub(TAIL);
        let tail = self.get_range(seg, tail_start..len).await?;
        let head = if tail_start == 0 {
            tail.slice(0..8)
        } else {
            self.get_range(seg, 0..8).await?
        };
        let (start, end) = footer_span(path, &head, &tail[tail.len() - 10..], len)?;
        let footer_bytes = if start >= tail_start {
            tail.slice((start - tail_start) as usize..(end - tail_start) as usize)
        } else {
            self.get_range(seg, start..end).await?
        };
        let footer = arrow::ipc::root_as_footer(&footer_bytes)
            .map_err(|e| seg.corrupt(format!("invalid footer: {e}")))?;
        if footer.version() != MetadataVersion::V5 {
            return Err(seg.corrupt(format!(
                "metadata version {:?}, expected V5",
                footer.version()
            )));
        }
        let found = footer_schema(path, &footer)?;
        let shape = |f: &Field| (f.name().clone(), f.data_type().clone(), f.is_nullable());
        if !found.fields().iter().map(|f| shape(f)).eq(self
            .schema
            .fields()
            .iter()
            .map(|f| shape(f)))
        {
            return Err(seg.corrupt(format!(
                "schema mismatch: the file's columns are {:?}, the catalog's {:?}",
                found.fields().iter().map(|f| f.name()).collect::<Vec<_>>(),
                self.schema
                    .fields()
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
            )));
        }
        if footer.dictionaries().is_some_and(|d| !d.is_empty()) {
            return Err(seg.corrupt("dictionary batches are not part of the format"));
        }
        let blocks = (footer.recordBatches().into_iter().flatten().enumerate())
            .map(|(i, b)| block_span(path, &format!("record batch {i}"), b, start))
            .collect::<Result<Vec<_>>>()?;
        let metas: Vec<Range<u64>> = blocks
            .iter()
            .map(|&(off, meta, _)| off as u64..(off + meta) as u64)
            .collect();
        let headers = self.get_ranges(seg, &metas).await?;
        let mut batches = Vec::with_capacity(blocks.len());
        let mut first_row = 0;
        for (b, (&(off, meta_len, body_len), header)) in blocks.iter().zip(&headers).enumerate() {
            let what = format!("record batch {b}");
            let corrupt = |reason: String| seg.corrupt(format!("{what}: {reason}"));
            let message = block_message(path, &what, header)?;
            let rb = record_batch_header(&message, body_len as u64, corrupt)?;
            let body_off = (off + meta_len) as u64;
            let mut buffers = Vec::new();
            for (j, buf) in rb.buffers().into_iter().flatten().enumerate() {
                let (bo, bl) = (buf.offset(), buf.length());
                if bo < 0 || bl < 0 || (bo as u64).saturating_add(bl as u64) > body_len as u64 {
                    return Err(corrupt(format!(
                        "buffer {j} ({bo}+{bl}) lies outside the message body ({body_len})"
                    )));
                }
                buffers.push(body_off + bo as u64..body_off + (bo + bl) as u64);
            }
            let rows =
                u64::try_from(rb.length()).map_err(|_| corrupt(format!("{} rows", rb.length())))?;
            batches.push(BatchLayout {
                rows,
                first_row,
                body: (body_off, body_len),
                columns: column_buffers(self.schema.fields(), &buffers),
            });
            first_row += rows;
        }
        if first_row != seg.rows {
            return Err(seg.corrupt(format!("{first_row} rows, the manifest says {}", seg.rows)));
        }
        let layout = Arc::new(Layout { batches, headers });
        self.lock().insert(i, layout.clone());
        Ok(layout)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Arc<Layout>>> {
        self.layouts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Batches `keep` of segment `i`, only columns `projection`, cut into slices of at most
    /// [`SCAN_BATCH_ROWS`] rows.
    async fn read(
        &self,
        i: usize,
        layout: &Layout,
        keep: &[usize],
        projection: &[usize],
    ) -> Result<Vec<RecordBatch>> {
        let seg = &self.segments[i];
        let mut ranges: Vec<Range<u64>> = vec![];
        for &b in keep {
            let bl = &layout.batches[b];
            match &bl.columns {
                Some(cols) => {
                    for &c in projection {
                        ranges.extend(cols[c].iter().cloned());
                    }
                }
                None => ranges.push(bl.body.0..bl.body.0 + bl.body.1 as u64),
            }
        }
        let data = self.get_ranges(seg, &ranges).await?;
        let mut map =
            memmap2::MmapMut::map_anon(seg.bytes as usize).map_err(|e| Error::io(&seg.url, e))?;
        for (r, b) in ranges.iter().zip(&data) {
            map[r.start as usize..r.end as usize].copy_from_slice(b);
        }
        drop(data);
        let map = Arc::new(map.make_read_only().map_err(|e| Error::io(&seg.url, e))?);
        let ptr = std::ptr::NonNull::new(map.as_ptr() as *mut u8).expect("a mapping is never null");
        // SAFETY: `ptr` and the length describe the whole (now read-only) anonymous mapping,
        // which the `Arc<Mmap>` owner passed along keeps alive while any buffer sliced from it
        // exists.
        let whole = unsafe { Buffer::from_custom_allocation(ptr, map.len(), map.clone()) };
        let mut out = vec![];
        for &b in keep {
            let bl = &layout.batches[b];
            let what = format!("record batch {b}");
            let message = block_message(std::path::Path::new(&seg.url), &what, &layout.headers[b])?;
            let rb = message
                .header_as_record_batch()
                .ok_or_else(|| seg.corrupt(format!("{what}: message is not a record batch")))?;
            let body = whole.slice_with_length(bl.body.0 as usize, bl.body.1);
            let none = HashMap::new();
            let batch = crate::guard::quietly(|| {
                RecordBatchDecoder::try_new(
                    &body,
                    rb,
                    self.schema.clone(),
                    &none,
                    &MetadataVersion::V5,
                )?
                .with_projection(Some(projection))
                .with_require_alignment(true)
                .read_record_batch()
            })
            .map_err(|_| seg.corrupt(format!("{what}: undecodable message")))?
            .map_err(|e| seg.corrupt(format!("{what}: {e}")))?;
            let mut off = 0;
            while off < batch.num_rows() {
                let len = SCAN_BATCH_ROWS.min(batch.num_rows() - off);
                out.push(batch.slice(off, len));
                off += len;
            }
        }
        Ok(out)
    }

    /// The batches of segment `i` the scan keeps: those whose rows may match `filters`, at most
    /// `budget` rows' worth (then lowered).
    fn keep(
        &self,
        i: usize,
        layout: &Layout,
        filters: &[Expr],
        budget: &mut Option<usize>,
    ) -> Vec<usize> {
        let seg = &self.segments[i];
        let mut keep = vec![];
        for (b, bl) in layout.batches.iter().enumerate() {
            if *budget == Some(0) {
                break;
            }
            let rows = bl.first_row..bl.first_row + bl.rows;
            let part = Part::probe(seg.episode_range(rows), seg.steps(), &self.schema);
            if filters.iter().all(|f| may_match(f, &part).unwrap_or(true)) {
                if let Some(n) = budget {
                    *n = n.saturating_sub(bl.rows as usize);
                }
                keep.push(b);
            }
        }
        keep
    }

    /// All of segment `segment`'s rows (at most `limit`, rounded up to whole record batches), only
    /// columns `projection`, with the ranged reads of a scan: what a Ballista executor runs for
    /// one partition of the cluster's scan. An empty projection reads nothing.
    pub async fn segment(
        &self,
        segment: usize,
        projection: &[usize],
        limit: Option<usize>,
    ) -> Result<Vec<RecordBatch>> {
        let seg = self.segments.get(segment).ok_or_else(|| {
            Error::invalid_argument(format!(
                "segment {segment} of a version of {} segments",
                self.segments.len()
            ))
        })?;
        if projection.is_empty() {
            let schema = Arc::new(self.schema.project(projection)?);
            let rows = limit.map_or(seg.rows as usize, |n| n.min(seg.rows as usize));
            return row_counts(&schema, rows);
        }
        let layout = self.layout(segment).await?;
        let mut budget = limit;
        let keep = self.keep(segment, &layout, &[], &mut budget);
        self.read(segment, &layout, &keep, projection).await
    }

    async fn scan_parts(
        &self,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let all: Vec<usize> = (0..self.schema.fields().len()).collect();
        let projection = projection.unwrap_or(&all);
        let schema = Arc::new(self.schema.project(projection)?);
        // Segments that may match, and (without filters) only as many as the limit needs.
        let mut budget = limit.filter(|_| filters.is_empty());
        let mut chosen = vec![];
        for (i, seg) in self.segments.iter().enumerate() {
            if budget == Some(0) {
                break;
            }
            let part = Part::probe(
                (seg.episodes.0 as f64, seg.episodes.1 as f64 - 1.0),
                seg.steps(),
                &self.schema,
            );
            if seg.rows > 0 && filters.iter().all(|f| may_match(f, &part).unwrap_or(true)) {
                if let Some(n) = &mut budget {
                    *n = n.saturating_sub(seg.rows as usize);
                }
                chosen.push(i);
            }
        }
        let mut partitions: Vec<Vec<RecordBatch>> = vec![];
        let mut episodes = vec![];
        if projection.is_empty() {
            // Row counts only: nothing to read.
            for &i in &chosen {
                let seg = &self.segments[i];
                partitions.push(row_counts(&schema, seg.rows as usize)?);
                episodes.push(seg.episodes);
            }
        } else {
            let layouts: Vec<(usize, Arc<Layout>)> = futures::stream::iter(chosen)
                .map(|i| async move { Ok::<_, Error>((i, self.layout(i).await?)) })
                .buffered(CONCURRENCY)
                .try_collect()
                .await?;
            let mut budget = limit.filter(|_| filters.is_empty());
            let mut work = vec![];
            for (i, layout) in layouts {
                let keep = self.keep(i, &layout, filters, &mut budget);
                if !keep.is_empty() {
                    work.push((i, layout, keep));
                }
            }
            let read: Vec<(usize, Vec<RecordBatch>)> = futures::stream::iter(work)
                .map(|(i, layout, keep)| async move {
                    Ok::<_, Error>((i, self.read(i, &layout, &keep, projection).await?))
                })
                .buffered(CONCURRENCY)
                .try_collect()
                .await?;
            for (i, batches) in read {
                partitions.push(batches);
                episodes.push(self.segments[i].episodes);
            }
        }
        if partitions.is_empty() {
            partitions.push(vec![]);
            episodes.push((0, 0));
        }
        let source = MemorySourceConfig::try_new(&partitions, schema, None)?.with_limit(limit);
        Ok(DataSourceExec::from_data_source(SegmentScan::new(
            source, episodes,
        )))
    }
}

#[async_trait]
impl TableProvider for RemoteTransitions {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.scan_parts(projection, filters, limit)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        Ok(filters.iter().map(|f| pushdown(f, &self.schema)).collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(Statistics::new_unknown(&self.schema).with_num_rows(Precision::Exact(self.rows)))
    }
}

/// Per top-level field, the non-empty ranges among `buffers` (the message's buffers, in order)
/// that belong to it; `None` when a type's buffer count is not known here or the counts do not
/// add up.
/// Batches of no columns and `rows` rows in all (an empty projection: `COUNT(*)`).
fn row_counts(schema: &SchemaRef, mut rows: usize) -> Result<Vec<RecordBatch>> {
    let mut part = vec![];
    while rows > 0 {
        let n = rows.min(SCAN_BATCH_ROWS);
        part.push(RecordBatch::try_new_with_options(
            schema.clone(),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(n)),
        )?);
        rows -= n;
    }
    Ok(part)
}

fn column_buffers(
    fields: &arrow::datatypes::Fields,
    buffers: &[Range<u64>],
) -> Option<Vec<Vec<Range<u64>>>> {
    let mut at = 0;
    let mut out = Vec::with_capacity(fields.len());
    for f in fields {
        let n = buffer_count(f)?;
        let mine = buffers.get(at..at + n)?;
        out.push(mine.iter().filter(|r| !r.is_empty()).cloned().collect());
        at += n;
    }
    (at == buffers.len()).then_some(out)
}

/// How many IPC buffers a field of this type has (as arrow-ipc's reader counts them, V5).
fn buffer_count(f: &Field) -> Option<usize> {
    use DataType::*;
    Some(match f.data_type() {
        Null => 0,
        Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 | Float16
        | Float32 | Float64 | Timestamp(..) | Date32 | Date64 | Time32(_) | Time64(_)
        | Duration(_) | Interval(_) | Decimal32(..) | Decimal64(..) | Decimal128(..)
        | Decimal256(..) | FixedSizeBinary(_) => 2,
        Utf8 | Binary | LargeUtf8 | LargeBinary => 3,
        List(c) | LargeList(c) => 2 + buffer_count(c)?,
        FixedSizeList(c, _) => 1 + buffer_count(c)?,
        Struct(cs) => {
            let mut n = 1;
            for c in cs {
                n += buffer_count(c)?;
            }
            n
        }
        _ => return None,
    })
}
