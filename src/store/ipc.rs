//! The crash-safe Arrow IPC file layer: writing one file under a temporary name and renaming it
//! into place ([`IpcFileWriter`], with its size and CRC-32C), opening one zero-copy from a memory
//! map after checking its footer, schema and message bounds ([`open_ipc`]), the footer and block
//! readers that other IPC readers share, and read-ahead hints ([`will_need`]).
//!
//! Both segment files (`<id>.arrow`) and episode tables (`<id>.episodes.arrow`) go through here;
//! so do the Arrow IPC ingest source, the remote SQL scan, and the checksums of push and pull.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, AsArray, RecordBatch, RecordBatchOptions};
use arrow::buffer::Buffer;
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::reader::RecordBatchDecoder;
use arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use arrow::ipc::{Block, MetadataVersion};

use crate::error::{Error, IoContext, Result};
use crate::format::{self, meta, tmp_path};

const MAGIC: &[u8; 6] = b"ARROW1";
/// Smallest possible IPC file: magic + padding, footer length, magic.
const MIN_FILE_LEN: usize = 8 + 4 + 6;

/// Size and checksum of a finished file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileInfo {
    /// Bytes on disk.
    pub bytes: u64,
    /// CRC-32C (Castagnoli) of the whole file.
    pub crc32c: u32,
}

/// Formats a checksum as written in manifests (`crc32c:` + 8 lowercase hex digits).
pub fn checksum_string(crc: u32) -> String {
    format!("crc32c:{crc:08x}")
}

/// A `Write` that counts bytes and computes CRC-32C of everything that passes through.
struct HashingWriter<W> {
    inner: W,
    crc: u32,
    bytes: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes one IPC file under a temporary name; [`IpcFileWriter::finish`] syncs it and renames it
/// into place. Dropping it unfinished leaves only the temporary file, which no manifest names.
pub struct IpcFileWriter {
    writer: FileWriter<HashingWriter<BufWriter<File>>>,
    tmp: PathBuf,
    path: PathBuf,
    rows: u64,
}

impl IpcFileWriter {
    /// Creates `path` + `.tmp` with `schema`, 64-byte alignment, no compression, and footer
    /// metadata `trajstore:kind = kind` and `trajstore:segment_id = segment_id`.
    pub fn create(path: &Path, schema: &Schema, kind: &str, segment_id: u64) -> Result<Self> {
        let tmp = tmp_path(path);
        let file = File::create(&tmp).at(&tmp)?;
        let sink = HashingWriter {
            inner: BufWriter::with_capacity(1 << 20, file),
            crc: 0,
            bytes: 0,
        };
        let options = IpcWriteOptions::try_new(format::IPC_ALIGNMENT, false, MetadataVersion::V5)?;
        let mut writer = FileWriter::try_new_with_options(sink, schema, options)?;
        writer.write_metadata(meta::FORMAT_VERSION, format::FORMAT_VERSION.to_string());
        writer.write_metadata(meta::FILE_KIND, kind);
        writer.write_metadata(meta::SEGMENT_ID, format::segment_name(segment_id));
        Ok(Self {
            writer,
            tmp,
            path: path.to_path_buf(),
            rows: 0,
        })
    }

    /// Appends one record batch (one IPC message; it becomes one zero-copy batch when read).
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.writer.write(batch).map_err(|e| self.io_or_arrow(e))?;
        self.rows += batch.num_rows() as u64;
        Ok(())
    }

    /// Bytes written so far (approximately the final file size).
    pub fn bytes_written(&self) -> u64 {
        self.writer.get_ref().bytes
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Writes the footer, fsyncs, and renames the file to its final name. The caller fsyncs the
    /// directory before publishing a manifest that names the file.
    pub fn finish(mut self) -> Result<FileInfo> {
        self.writer.finish().map_err(|e| self.io_or_arrow(e))?;
        let mut sink = self.writer.into_inner().map_err(Error::Arrow)?;
        sink.flush().at(&self.tmp)?;
        let info = FileInfo {
            bytes: sink.bytes,
            crc32c: sink.crc,
        };
        let file = sink
            .inner
            .into_inner()
            .map_err(|e| Error::io(&self.tmp, e.into_error()))?;
        file.sync_all().at(&self.tmp)?;
        drop(file);
        crate::fault::point("segment-before-rename");
        std::fs::rename(&self.tmp, &self.path).at(&self.path)?;
        Ok(info)
    }

    fn io_or_arrow(&self, e: arrow::error::ArrowError) -> Error {
        match e {
            arrow::error::ArrowError::IoError(_, source) => Error::io(&self.tmp, source),
            other => Error::Arrow(other),
        }
    }
}

/// An IPC file opened from a memory map. Its batches are zero-copy views of the map; the map
/// lives as long as any of them.
#[derive(Debug, Clone)]
pub struct MappedIpc {
    /// The record batches, in file order.
    pub batches: Vec<RecordBatch>,
    /// The footer's custom metadata.
    pub metadata: HashMap<String, String>,
    /// File size.
    pub bytes: u64,
    /// The whole mapped file.
    pub map: Buffer,
    /// The mapping itself (for `madvise`).
    pub mmap: Arc<memmap2::Mmap>,
    /// The file's path (for errors found after open).
    pub(crate) path: PathBuf,
    /// Columns whose offsets [`open_ipc_deferring`] left unchecked (see [`Self::deferred`]).
    deferred: Vec<usize>,
    /// The outcome of [`Self::check_deferred`], once it ran.
    checked: OnceLock<std::result::Result<(), String>>,
}

impl MappedIpc {
    /// Total rows over all batches.
    pub fn num_rows(&self) -> u64 {
        self.batches.iter().map(|b| b.num_rows() as u64).sum()
    }
    /// The columns (by index) whose offsets were not checked at open and have not been since:
    /// empty for a file opened by [`open_ipc`], or once [`Self::check_deferred`] succeeded.
    /// Their buffers' sizes and first and last offsets were checked; the offsets between them
    /// may be out of order or outside the values, so only code that checks each offset it reads
    /// ([`crate::frames::FrameRun`], [`check_offsets`]) may read these columns until then.
    pub(crate) fn deferred(&self) -> &[usize] {
        match self.checked.get() {
            Some(Ok(())) => &[],
            _ => &self.deferred,
        }
    }
    /// Checks every offset of the deferred columns of every batch, once (later calls return the
    /// first outcome): after it succeeds the batches are as valid as [`open_ipc`]'s. The offsets
    /// of a cold file are asked for whole first, so that they come in large reads. A bad offset
    /// is [`Error::Corrupt`] naming the file, the record batch and the column.
    pub(crate) fn check_deferred(&self) -> Result<()> {
        let outcome = self.checked.get_or_init(|| {
            for (i, b) in self.batches.iter().enumerate() {
                for &c in &self.deferred {
                    if let Some(a) = b.column(c).as_binary_opt::<i64>() {
                        will_need(a.offsets().inner().inner().as_slice());
                    }
                }
                for &c in &self.deferred {
                    let data = b.column(c).to_data();
                    data.validate_values().map_err(|e| {
                        let name = b.schema_ref().field(c).name().clone();
                        format!("record batch {i}, column `{name}`: {e}")
                    })?;
                }
            }
            Ok(())
        });
        outcome
            .clone()
            .map_err(|reason| Error::corrupt(&self.path, reason))
    }
}

/// Checks the offsets of rows `[row, row + len)` of a variable-size binary column with
/// unchecked offsets ([`MappedIpc::deferred`]): in order, and inside its values. O(len). After
/// it succeeds, the column sliced to those rows is a valid array. A bad offset is the reason
/// string of an [`Error::Corrupt`].
pub(crate) fn check_offsets(
    array: &arrow::array::LargeBinaryArray,
    row: usize,
    len: usize,
) -> std::result::Result<(), String> {
    let offsets = array.value_offsets();
    let Some(window) = offsets.get(row..row + len + 1) else {
        return Err(format!("rows {row}..+{len} outside {} rows", array.len()));
    };
    let values = array.value_data().len() as i64;
    let mut prev = 0;
    for (k, &o) in window.iter().enumerate() {
        if o < prev || o > values {
            return Err(format!(
                "offset {o} of row {} is out of order or outside the {values} bytes of values",
                row + k
            ));
        }
        prev = o;
    }
    Ok(())
}

/// Maps `path` read-only and decodes it without copying, after checking magic, footer, schema
/// (names, types and nullability must equal `expected`), message bounds and buffer alignment.
///
/// Cost: O(record batches). The footer and message headers are read (`pread`: a fault through
/// the map would make a page-table entry to tear down again), column data is not. A cold file's
/// ends, then its headers, are asked for (`MADV_WILLNEED`) before any is waited for, so that its
/// reads are in flight together. Every failed check is [`Error::Corrupt`] naming the path.
pub fn open_ipc(path: &Path, expected: &Schema) -> Result<MappedIpc> {
    open_ipc_cold(path, expected).map(|(f, _)| f)
}

/// [`open_ipc`], and whether the file was cold (its tail not in the page cache).
pub(crate) fn open_ipc_cold(path: &Path, expected: &Schema) -> Result<(MappedIpc, bool)> {
    open_mapped(path, expected, false)
}

/// [`open_ipc`], except that the offsets of top-level `LargeBinary` columns (frame columns: 8
/// bytes per frame, 1.7 GB at 209M frames) are not read: only their buffers' sizes and their
/// first and last offsets are checked, so that opening costs O(record batches) whatever the
/// number of frames. Those columns are listed by [`MappedIpc::deferred`] until
/// [`MappedIpc::check_deferred`] checks them; a sampler reads them through
/// [`crate::frames::FrameRun`], which checks each offset it reads.
pub(crate) fn open_ipc_deferring(path: &Path, expected: &Schema) -> Result<MappedIpc> {
    open_mapped(path, expected, true).map(|(f, _)| f)
}

fn open_mapped(path: &Path, expected: &Schema, defer: bool) -> Result<(MappedIpc, bool)> {
    let file = File::open(path).at(path)?;
    let len = file.metadata().at(path)?.len() as usize;
    let corrupt = |reason: String| Error::corrupt(path, reason);
    if len < MIN_FILE_LEN {
        return Err(corrupt(format!(
            "{len} bytes is too short for an Arrow IPC file"
        )));
    }
    // SAFETY: the map is read-only and committed trajstore files are immutable: they are written
    // under a temporary name and renamed into place, and never modified or truncated afterwards
    // (a file replaced under the same name keeps the old inode alive for this map). Modifying a
    // committed file from outside trajstore is outside the format's contract.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.at(path)?;
    // Random access is the default for the whole life of the map: validation touches only the
    // footer and one message header per record batch, and sampling touches a few pages per
    // slice. With the kernel's read-around (up to `read_ahead_kb`, 8 MiB on some devices) each
    // cold fault would read megabytes around the page it needs: opening 100M transitions read
    // ~1.7 s of column data, and random slices read the whole dataset in their first batches.
    // Sequential readers (SQL scans, export, verify, uploads) ask for their ranges explicitly
    // with [`Segment::for_each_chunk`] and [`will_need_batch`]; samplers through the gatherer.
    let _ = mmap.advise(memmap2::Advice::Random);
    let will_need = |off, n| drop(mmap.advise_range(memmap2::Advice::WillNeed, off, n));
    let read = |off: usize, n: usize| {
        let mut buf = vec![0; n];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf, off as u64).at(path)?;
        Ok::<_, Error>(buf)
    };
    let tail_start = len - TAIL.min(len);
    let (tail, cold) = match read_cached(&file, tail_start, len - tail_start) {
        Some(tail) => (tail, false),
        None => {
            will_need(0, TAIL.min(len));
            will_need(tail_start, len - tail_start);
            (read(tail_start, len - tail_start)?, true)
        }
    };
    let (start, end) = footer_span(path, &read(0, 8)?, &tail[tail.len() - 10..], len as u64)?;
    let (start, end) = (start as usize, end as usize);
    let far;
    let footer = match start.checked_sub(tail_start) {
        Some(s) => &tail[s..end - tail_start],
        None => {
            far = read(start, end - start)?;
            &far[..]
        }
    };
    let footer =
        arrow::ipc::root_as_footer(footer).map_err(|e| corrupt(format!("invalid footer: {e}")))?;
    if footer.version() != MetadataVersion::V5 {
        return Err(corrupt(format!(
            "metadata version {:?}, expected V5",
            footer.version()
        )));
    }
    let schema = footer_schema(path, &footer)?;
    let mut metadata = HashMap::new();
    for e in footer.custom_metadata().into_iter().flatten() {
        if let (Some(k), Some(v)) = (e.key(), e.value()) {
            metadata.insert(k.to_string(), v.to_string());
        }
    }
    check_schema(path, expected, &schema)?;
    if footer.dictionaries().is_some_and(|d| !d.is_empty()) {
        return Err(corrupt(
            "dictionary batches are not part of the format".into(),
        ));
    }
    let blocks = (footer.recordBatches().into_iter().flatten().enumerate())
        .map(|(i, b)| block_span(path, &format!("record batch {i}"), b, start as u64))
        .collect::<Result<Vec<_>>>()?;
    for &(off, meta_len, _) in blocks.iter().filter(|_| cold) {
        will_need(off, meta_len);
    }
    let schema: SchemaRef = Arc::new(schema);
    let mmap = Arc::new(mmap);
    let ptr = std::ptr::NonNull::new(mmap.as_ptr() as *mut u8).expect("a mapping is never null");
    // SAFETY: `ptr` and `len` describe the whole read-only mapping, which the `Arc<Mmap>` owner
    // passed along keeps alive for as long as any buffer sliced from it exists.
    let map = unsafe { Buffer::from_custom_allocation(ptr, len, mmap.clone()) };
    let mut batches = Vec::with_capacity(blocks.len());
    let deferred: Vec<usize> = (schema.fields().iter().enumerate())
        .filter(|(_, f)| defer && *f.data_type() == arrow::datatypes::DataType::LargeBinary)
        .map(|(i, _)| i)
        .collect();
    // Decoding validates every offset of the variable-size columns it does not defer. On a
    // cold file those offsets are asked for whole first, so that they arrive in large reads,
    // not one 4 KiB fault at a time through the random-access map (209M frames: 1.7 GB of
    // offsets read in 6.4 s that way).
    let offsets = cold.then(|| offsets_buffers(&schema, &deferred)).flatten();
    for (i, &(off, meta_len, body_len)) in blocks.iter().enumerate() {
        let body = map.slice_with_length(off + meta_len, body_len);
        batches.push(decode_block(
            path,
            i,
            &read(off, meta_len)?,
            &body,
            &schema,
            offsets.as_deref(),
            &deferred,
        )?);
    }
    let f = MappedIpc {
        batches,
        metadata,
        bytes: len as u64,
        map,
        mmap,
        path: path.to_path_buf(),
        deferred,
        checked: OnceLock::new(),
    };
    Ok((f, cold))
}

/// How much of the end of a file [`open_ipc`] reads for the footer (and asks for at both ends
/// of a cold file: the head holds the magic, the schema and usually the first batch's header).
const TAIL: usize = 4 << 10;

/// Whether the last byte of file `path` is in the page cache (`false` if it cannot be read).
pub(crate) fn tail_cached(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let len = file.metadata().map_or(0, |m| m.len() as usize);
    len > 0 && read_cached(&file, len - 1, 1).is_some()
}

/// `len` bytes of `file` at `off` if they are all in the page cache (`preadv2(RWF_NOWAIT)`):
/// `None` says the file is cold (or not Linux).
fn read_cached(file: &File, off: usize, len: usize) -> Option<Vec<u8>> {
    #[cfg(target_os = "linux")]
    {
        let mut buf = vec![0u8; len];
        let iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let fd = std::os::fd::AsRawFd::as_raw_fd(file);
        // SAFETY: `iov` describes `buf`, which outlives the call, and `fd` is open.
        let n = unsafe { libc::preadv2(fd, &iov, 1, off as i64, libc::RWF_NOWAIT) };
        (n == len as isize).then_some(buf)
    }
    #[cfg(not(target_os = "linux"))]
    (file, off, len, None).3
}

/// Where the footer of IPC file `path` lies, `(start, end)`, from the file's first 8 and last 10
/// bytes (magic, footer length, magic) and its length. A bad file is [`Error::Corrupt`].
pub(crate) fn footer_span(path: &Path, head: &[u8], tail: &[u8], len: u64) -> Result<(u64, u64)> {
    let corrupt = |reason: String| Error::corrupt(path, reason);
    if len < MIN_FILE_LEN as u64 {
        return Err(corrupt(format!(
            "{len} bytes is too short for an Arrow IPC file"
        )));
    }
    if &head[..6] != MAGIC || &tail[4..10] != MAGIC {
        return Err(corrupt(
            "missing ARROW1 magic (not an Arrow IPC file, or truncated)".into(),
        ));
    }
    let footer_len = i32::from_le_bytes(tail[..4].try_into().expect("4 bytes"));
    let footer_end = len - 10;
    if footer_len <= 0 || footer_len as u64 > footer_end - 8 {
        return Err(corrupt(format!("footer length {footer_len} out of bounds")));
    }
    Ok((footer_end - footer_len as u64, footer_end))
}

/// A footer block's `(offset, metadata length, body length)`, checked to lie in the data
/// section (before `footer_start`). A bad block is [`Error::Corrupt`] naming `path` and the block
/// (`what`, e.g. `record batch 3`).
pub(crate) fn block_span(
    path: &Path,
    what: &str,
    block: &Block,
    footer_start: u64,
) -> Result<(usize, usize, usize)> {
    let (off, meta_len, body_len) = (block.offset(), block.metaDataLength(), block.bodyLength());
    if off < 8 || meta_len < 8 || body_len < 0 {
        return Err(Error::corrupt(
            path,
            format!("{what}: invalid block (offset {off}, metadata {meta_len}, body {body_len})"),
        ));
    }
    (off as u64)
        .checked_add(meta_len as u64)
        .and_then(|x| x.checked_add(body_len as u64))
        .filter(|&e| e <= footer_start)
        .ok_or_else(|| {
            Error::corrupt(
                path,
                format!("{what}: block at {off} runs past the data section"),
            )
        })?;
    Ok((off as usize, meta_len as usize, body_len as usize))
}

/// The schema in the footer of IPC file `path`; none, or an unreadable one, is [`Error::Corrupt`].
pub(crate) fn footer_schema(path: &Path, footer: &arrow::ipc::Footer) -> Result<Schema> {
    let fb_schema = footer
        .schema()
        .ok_or_else(|| Error::corrupt(path, "footer has no schema"))?;
    // `fb_to_schema` panics on some malformed schemas in arrow 59 (`try_fb_to_schema` is 60 only).
    crate::guard::quietly(|| arrow::ipc::convert::fb_to_schema(fb_schema))
        .map_err(|_| Error::corrupt(path, "unreadable schema in footer"))
}

/// The message of an IPC block, from the block's metadata bytes (an optional continuation
/// marker, the flatbuffer's length, the flatbuffer), checked to lie inside them. A bad message is
/// [`Error::Corrupt`] naming `path` and the block (`what`, e.g. `record batch 3`).
pub(crate) fn block_message<'a>(
    path: &Path,
    what: &str,
    header: &'a [u8],
) -> Result<arrow::ipc::Message<'a>> {
    let corrupt = |reason: String| Error::corrupt(path, format!("{what}: {reason}"));
    if header.len() < 8 {
        return Err(corrupt(format!("{} bytes of block metadata", header.len())));
    }
    let (prefix, len) = if header[..4] == [0xff; 4] {
        (8, &header[4..8])
    } else {
        (4, &header[..4])
    };
    let len = i32::from_le_bytes(len.try_into().expect("4 bytes"));
    if len < 0 || prefix + len as usize > header.len() {
        return Err(corrupt(format!(
            "message length {len} exceeds the block's metadata length {}",
            header.len()
        )));
    }
    arrow::ipc::root_as_message(&header[prefix..prefix + len as usize])
        .map_err(|e| corrupt(format!("invalid message: {e}")))
}

/// The schema of file `path` must be `expected` (names, types, nullability): the file, not the
/// caller, is at fault when it is not, so a difference is [`Error::Corrupt`].
fn check_schema(path: &Path, expected: &Schema, found: &Schema) -> Result<()> {
    let mismatch = |reason: String| Error::corrupt(path, format!("schema mismatch: {reason}"));
    if expected.fields().len() != found.fields().len() {
        return Err(mismatch(format!(
            "{} columns, expected {}",
            found.fields().len(),
            expected.fields().len()
        )));
    }
    let nullable = |nullable: bool| if nullable { " (nullable)" } else { "" };
    for (e, f) in expected.fields().iter().zip(found.fields()) {
        if e.name() != f.name()
            || e.data_type() != f.data_type()
            || e.is_nullable() != f.is_nullable()
        {
            return Err(mismatch(format!(
                "column `{}: {}`{} where `{}: {}`{} was expected",
                f.name(),
                f.data_type(),
                nullable(f.is_nullable()),
                e.name(),
                e.data_type(),
                nullable(e.is_nullable())
            )));
        }
    }
    Ok(())
}

/// The record-batch header of `message`, checked to be a V5 record batch whose body has the
/// footer's length `body_len`, uncompressed; `corrupt` makes the error of a bad one.
pub(crate) fn record_batch_header<'a>(
    message: &arrow::ipc::Message<'a>,
    body_len: u64,
    corrupt: impl Fn(String) -> Error,
) -> Result<arrow::ipc::RecordBatch<'a>> {
    if message.bodyLength() != body_len as i64 {
        return Err(corrupt(format!(
            "message body length {} differs from the footer's {body_len}",
            message.bodyLength()
        )));
    }
    if message.version() != MetadataVersion::V5 {
        return Err(corrupt(format!("message version {:?}", message.version())));
    }
    let rb = message
        .header_as_record_batch()
        .ok_or_else(|| corrupt("message is not a record batch".into()))?;
    if rb.compression().is_some() {
        return Err(corrupt(
            "compressed buffers are not part of the format".into(),
        ));
    }
    Ok(rb)
}

/// Decodes record batch `i` of file `path` from its message `header` (the block's metadata
/// bytes) and `body`, after checking that the message is a V5 record batch of the body's length,
/// uncompressed, whose buffers lie inside the body (so that decoding never indexes out of
/// bounds); buffers must be aligned. A bad one is [`Error::Corrupt`].
/// `read_ahead`: indices of buffers (of the message's list) to ask the kernel for before
/// decoding ([`offsets_buffers`]). `deferred`: top-level variable-size binary columns whose
/// offsets are not checked beyond their first and last ([`open_ipc_deferring`]).
fn decode_block(
    path: &Path,
    i: usize,
    header: &[u8],
    body: &Buffer,
    schema: &SchemaRef,
    read_ahead: Option<&[usize]>,
    deferred: &[usize],
) -> Result<RecordBatch> {
    let what = format!("record batch {i}");
    let corrupt = |reason: String| Error::corrupt(path, format!("{what}: {reason}"));
    let body_len = body.len();
    let message = block_message(path, &what, header)?;
    let rb = record_batch_header(&message, body_len as u64, corrupt)?;
    for (j, b) in rb.buffers().into_iter().flatten().enumerate() {
        let (bo, bl) = (b.offset(), b.length());
        if bo < 0 || bl < 0 || (bo as u64).saturating_add(bl as u64) > body_len as u64 {
            return Err(corrupt(format!(
                "buffer {j} ({bo}+{bl}) lies outside the message body ({body_len})"
            )));
        }
        if read_ahead.is_some_and(|r| r.contains(&j)) {
            will_need(&body.as_slice()[bo as usize..(bo + bl) as usize]);
        }
    }
    let none = HashMap::new();
    crate::guard::quietly(|| {
        let decoder =
            RecordBatchDecoder::try_new(body, rb, schema.clone(), &none, &MetadataVersion::V5)?
                .with_require_alignment(true);
        if deferred.is_empty() {
            return decoder.read_record_batch();
        }
        let mut skip = arrow_data::UnsafeFlag::new();
        // SAFETY: nothing of the unchecked batch escapes this block: it is checked below as the
        // decoder would have checked it (the batch's columns against its schema and row count,
        // every column's buffers, nulls and values), except the values of the `deferred`
        // columns, whose buffer sizes and first and last offsets are checked. Those columns are
        // then only read through code that checks each offset it reads, until
        // `MappedIpc::check_deferred` has checked them all (see `MappedIpc::deferred`).
        unsafe { skip.set(true) };
        let unchecked = decoder.with_skip_validation(skip).read_record_batch()?;
        let options = RecordBatchOptions::new().with_row_count(Some(unchecked.num_rows()));
        let batch = RecordBatch::try_new_with_options(
            unchecked.schema(),
            unchecked.columns().to_vec(),
            &options,
        )?;
        for (c, column) in batch.columns().iter().enumerate() {
            let data = column.to_data();
            if deferred.contains(&c) {
                data.validate()?;
                data.validate_nulls()?;
            } else {
                data.validate_full()?;
            }
        }
        Ok(batch)
    })
    .map_err(|_| corrupt("undecodable message".into()))?
    .map_err(|e| corrupt(e.to_string()))
}

/// Indices, in a record batch message's list of buffers, of the offsets of `schema`'s
/// variable-size binary and string columns: the buffers that decoding reads end to end to
/// validate them. `None` where the schema holds a type this does not lay out (a union, a
/// dictionary, ...): then nothing is read ahead. Only a hint: a wrong index reads the wrong range.
/// The offsets of the top-level columns `skip` are left out.
fn offsets_buffers(schema: &Schema, skip: &[usize]) -> Option<Vec<usize>> {
    use arrow::datatypes::DataType;
    // IPC lists a field's buffers depth first: its validity bitmap, then its own buffers, then
    // its children's.
    fn walk(t: &DataType, at: &mut usize, out: &mut Vec<usize>) -> Option<()> {
        *at += 1;
        match t {
            DataType::Binary | DataType::LargeBinary | DataType::Utf8 | DataType::LargeUtf8 => {
                out.push(*at);
                *at += 2;
            }
            DataType::FixedSizeList(f, _) => walk(f.data_type(), at, out)?,
            DataType::List(f) | DataType::LargeList(f) => {
                *at += 1;
                walk(f.data_type(), at, out)?;
            }
            DataType::Struct(fields) => {
                for f in fields {
                    walk(f.data_type(), at, out)?;
                }
            }
            DataType::Boolean | DataType::FixedSizeBinary(_) => *at += 1,
            t if t.is_primitive() => *at += 1,
            _ => return None,
        }
        Some(())
    }
    let (mut at, mut out) = (0, vec![]);
    for (c, f) in schema.fields().iter().enumerate() {
        let before = out.len();
        walk(f.data_type(), &mut at, &mut out)?;
        if skip.contains(&c) {
            out.truncate(before);
        }
    }
    Some(out)
}

/// `madvise(WILLNEED)` of the pages holding `bytes`, which must lie in one mapping. A hint:
/// errors are ignored. For file mappings the kernel starts reading the range and returns.
pub fn will_need(bytes: &[u8]) {
    #[cfg(unix)]
    if !bytes.is_empty() {
        let ps = crate::iofloor::page_size();
        let start = (bytes.as_ptr() as usize) & !(ps - 1);
        let end = bytes.as_ptr() as usize + bytes.len();
        // SAFETY: MADV_WILLNEED changes no memory contents and no mapping; a range that is not
        // mapped is an error (ENOMEM), not UB.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_WILLNEED) };
    }
}

/// [`will_need`] of every buffer of `batch`'s columns, child arrays included: for scans of a
/// record batch (or of a slice or projection of one) of a mapped segment, about to be read in
/// order. Buffers that are not mapped files (heap memory) are unaffected.
pub fn will_need_batch(batch: &RecordBatch) {
    fn walk(d: &arrow::array::ArrayData) {
        for b in d.buffers() {
            will_need(b.as_slice());
        }
        for c in d.child_data() {
            walk(c);
        }
    }
    for c in batch.columns() {
        walk(&c.to_data());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float32Array, UInt64Array};
    use arrow::datatypes::{DataType, Field};

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("a", DataType::UInt64, false),
            Field::new("b", DataType::Float32, false),
        ])
    }

    fn write_file(path: &Path, rows: usize) -> FileInfo {
        let s = Arc::new(schema());
        let batch = RecordBatch::try_new(
            s.clone(),
            vec![
                Arc::new(UInt64Array::from_iter_values(0..rows as u64)),
                Arc::new(Float32Array::from_iter_values(
                    (0..rows).map(|i| i as f32 * 0.5),
                )),
            ],
        )
        .unwrap();
        let mut w = IpcFileWriter::create(path, &s, meta::KIND_TRANSITIONS, 7).unwrap();
        w.write(&batch).unwrap();
        w.write(&batch.slice(0, 3)).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn offsets_buffers_are_the_offsets_of_variable_size_columns_in_the_ipc_message() {
        use arrow::array::{
            BooleanArray, FixedSizeListArray, LargeBinaryArray, StringArray, UInt32Array,
        };
        use arrow::ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext};
        let rows = 5;
        let item = Arc::new(Field::new("item", DataType::Float32, false));
        let s = Arc::new(Schema::new(vec![
            Field::new("id", DataType::UInt64, false),
            Field::new("flag", DataType::Boolean, false),
            Field::new("frames", DataType::LargeBinary, false),
            Field::new("obs", DataType::FixedSizeList(item.clone(), 3), false),
            Field::new("name", DataType::Utf8, true),
            Field::new("step", DataType::UInt32, false),
        ]));
        let bytes: Vec<Vec<u8>> = (0..rows).map(|i| vec![i as u8; i + 1]).collect();
        let batch = RecordBatch::try_new(
            s.clone(),
            vec![
                Arc::new(UInt64Array::from_iter_values(0..rows as u64)),
                Arc::new(BooleanArray::from(vec![true; rows])),
                Arc::new(LargeBinaryArray::from_iter_values(bytes.iter())),
                Arc::new(FixedSizeListArray::new(
                    item,
                    3,
                    Arc::new(Float32Array::from_iter_values(
                        (0..rows * 3).map(|i| i as f32),
                    )),
                    None,
                )),
                Arc::new(StringArray::from(vec![Some("ab"); rows])),
                Arc::new(UInt32Array::from_iter_values(0..rows as u32)),
            ],
        )
        .unwrap();
        let (_, encoded) = IpcDataGenerator::default()
            .encode(
                &batch,
                &mut DictionaryTracker::new(false),
                &IpcWriteOptions::default(),
                &mut IpcWriteContext::default(),
            )
            .unwrap();
        let message = arrow::ipc::root_as_message(&encoded.ipc_message).unwrap();
        let buffers: Vec<_> = message
            .header_as_record_batch()
            .unwrap()
            .buffers()
            .unwrap()
            .iter()
            .map(|b| b.length() as usize)
            .collect();
        let got = offsets_buffers(&s, &[]).unwrap();
        // validity + values (id), validity + values (flag), validity + offsets + values (frames),
        // validity (list) + validity + values (item), validity + offsets + values (name), step.
        assert_eq!(got, vec![5, 11]);
        assert_eq!(buffers.len(), 15);
        // IPC pads buffers to 8 bytes: the offsets are (rows + 1) 8-byte and 4-byte integers.
        assert_eq!(buffers[5], (rows + 1) * 8);
        assert_eq!(buffers[11], ((rows + 1) * 4).next_multiple_of(8));
        // A deferred column's offsets are not read ahead: column 2 holds the frames.
        assert_eq!(offsets_buffers(&s, &[2]).unwrap(), vec![11]);
        // A type it does not lay out: no hint at all, rather than wrong indices.
        let null = Schema::new(vec![Field::new("x", DataType::Null, true)]);
        assert_eq!(offsets_buffers(&null, &[]), None);
    }

    #[test]
    fn write_then_map_is_zero_copy() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.arrow");
        let info = write_file(&p, 1000);
        assert!(!tmp_path(&p).exists());
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(info.bytes, bytes.len() as u64);
        assert_eq!(info.crc32c, crc32c::crc32c(&bytes));
        let f = open_ipc(&p, &schema()).unwrap();
        assert_eq!(f.batches.len(), 2);
        assert_eq!(f.num_rows(), 1003);
        assert_eq!(f.metadata[meta::FILE_KIND], meta::KIND_TRANSITIONS);
        assert_eq!(f.metadata[meta::SEGMENT_ID], format::segment_name(7));
        let map = f.map.as_slice().as_ptr_range();
        for batch in &f.batches {
            for c in batch.columns() {
                let ptr = c.to_data().buffers()[0].as_ptr();
                assert!(map.contains(&ptr), "column data must point into the mmap");
                assert_eq!(ptr as usize % 64, 0, "buffers are 64-byte aligned");
            }
        }
        let b = f.batches[0]
            .column(1)
            .as_any()
            .downcast_ref::<Float32Array>()
            .unwrap();
        assert_eq!(b.value(999), 499.5);
    }

    #[test]
    fn every_truncation_and_many_bit_flips_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.arrow");
        write_file(&p, 100);
        let good = std::fs::read(&p).unwrap();
        let q = dir.path().join("bad.arrow");
        for cut in 0..good.len() {
            std::fs::write(&q, &good[..cut]).unwrap();
            let err = open_ipc(&q, &schema()).unwrap_err();
            assert!(matches!(err, Error::Corrupt { .. }), "cut {cut}: {err}");
        }
        // Flip every bit outside the column data: headers, metadata and footer. Each flip must
        // be detected or harmless (a flipped value byte is only found by `verify`'s checksum).
        let mut detected = 0;
        let mut misaligned = 0;
        for i in 0..good.len() {
            for bit in [0u8, 3, 7] {
                let mut bad = good.clone();
                bad[i] ^= 1 << bit;
                std::fs::write(&q, &bad).unwrap();
                if let Err(e) = open_ipc(&q, &schema()) {
                    assert!(
                        matches!(e, Error::Corrupt { .. }),
                        "byte {i} bit {bit}: {e}"
                    );
                    detected += 1;
                    misaligned += e.to_string().contains("Misaligned") as usize;
                }
            }
        }
        assert!(detected > 100, "only {detected} flips detected");
        // Flipping the low bit of a buffer offset misaligns it: rejected, never silently copied.
        assert!(misaligned > 0);
    }

    #[test]
    fn wrong_schema_and_foreign_files_are_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.arrow");
        write_file(&p, 10);
        let other = Schema::new(vec![Field::new("a", DataType::UInt64, false)]);
        let err = open_ipc(&p, &other).unwrap_err().to_string();
        assert!(
            err.contains("schema mismatch") && err.contains("x.arrow"),
            "{err}"
        );
        let q = dir.path().join("foreign.arrow");
        std::fs::write(&q, b"PAR1 this is not arrow at all, just some bytes PAR1").unwrap();
        assert!(matches!(
            open_ipc(&q, &schema()),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            open_ipc(&dir.path().join("missing.arrow"), &schema()),
            Err(Error::NotFound { .. })
        ));
    }
}
