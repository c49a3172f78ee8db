//! NumPy input: `.npz` archives (`np.savez`, `np.savez_compressed`; D4RL's `get_dataset()` dict
//! saved as is) and directories of `.npy` files. Every array is one column, named after its key
//! (the member or file name without `.npy`); its first dimension is the transition, the others
//! the shape of one row.
//!
//! Arrays are read with positioned reads (`pread`), not memory maps: an ingest reads each byte
//! once, so a map would only make the process's resident size grow with the input, and a file
//! truncated while being read would be a SIGBUS instead of an error. Stored (uncompressed)
//! members are read in parallel units; deflated members are inflated in one pass, in order, so
//! memory stays bounded whatever the size of the archive. The zip reader is this module's own
//! (stored and deflate members, zip64) and checks every member's CRC-32 and every bound against
//! the file: a truncated or corrupt archive is an error, never a panic.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::{
    ArrayData, ArrayRef, BooleanArray, FixedSizeListArray, RecordBatch, make_array,
};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use flate2::read::DeflateDecoder;

use super::{Source, UNIT_BATCHES};
use crate::error::{Error, Result};
use crate::schema::tensor_field;

/// An element type NumPy may store and Arrow can hold.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Dtype {
    pub(super) arrow: DataType,
    pub(super) size: usize,
}

/// Parses a NumPy `descr` such as `<f4`, `|b1` or `<i8`.
pub(super) fn parse_descr(descr: &str, what: &str) -> Result<Dtype> {
    let bad = |why: &str| {
        Error::SchemaMismatch(format!(
            "{what}: NumPy dtype '{descr}' {why}; supported: bool, int8-64, uint8-64, float16/32/64"
        ))
    };
    let mut chars = descr.chars();
    let order = chars.next().ok_or_else(|| bad("is empty"))?;
    let rest: String = chars.collect();
    let (kind, size) = rest.split_at(rest.len().min(1));
    let size: usize = size
        .parse()
        .map_err(|_| bad("is not a plain numeric dtype"))?;
    let arrow = match (kind, size) {
        ("b", 1) => DataType::Boolean,
        ("i", 1) => DataType::Int8,
        ("i", 2) => DataType::Int16,
        ("i", 4) => DataType::Int32,
        ("i", 8) => DataType::Int64,
        ("u", 1) => DataType::UInt8,
        ("u", 2) => DataType::UInt16,
        ("u", 4) => DataType::UInt32,
        ("u", 8) => DataType::UInt64,
        ("f", 2) => DataType::Float16,
        ("f", 4) => DataType::Float32,
        ("f", 8) => DataType::Float64,
        _ => return Err(bad("is not supported")),
    };
    let little = match order {
        '<' | '|' => true,
        '=' => cfg!(target_endian = "little"),
        '>' => size == 1,
        _ => return Err(bad("has no byte-order mark")),
    };
    if !little {
        return Err(Error::SchemaMismatch(format!(
            "{what}: big-endian dtype '{descr}'; convert it first (arr.astype(arr.dtype.newbyteorder('<')))"
        )));
    }
    Ok(Dtype { arrow, size })
}

/// The value of `'key':` in a NumPy header dict, as raw text up to the next top-level comma.
fn header_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header
        .find(&format!("'{key}'"))
        .or_else(|| header.find(&format!("\"{key}\"")))?;
    let rest = header[at + key.len() + 2..].trim_start();
    let rest = rest.strip_prefix(':')?.trim_start();
    let end = match rest.chars().next()? {
        '(' => rest.find(')')? + 1,
        '[' => rest.find(']')? + 1,
        q @ ('\'' | '"') => rest[1..].find(q)? + 2,
        _ => rest.find([',', '}']).unwrap_or(rest.len()),
    };
    Some(rest[..end].trim())
}

/// A parsed `.npy` header: dtype, shape and where the data starts.
#[derive(Debug, Clone)]
pub(super) struct Header {
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) data_offset: usize,
}

/// Length of the fixed preamble and of the header that follows: reads at most 12 bytes.
fn preamble(bytes: &[u8], what: &str) -> Result<(usize, usize)> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(Error::InvalidData(format!(
            "{what}: not a NumPy .npy array (no \\x93NUMPY magic, or truncated)"
        )));
    }
    match bytes[6] {
        1 => Ok((10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize)),
        2 | 3 if bytes.len() >= 12 => Ok((
            12,
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
        )),
        2 | 3 => Err(Error::InvalidData(format!("{what}: truncated .npy header"))),
        v => Err(Error::InvalidData(format!(
            "{what}: .npy format version {v} is not supported (1, 2 and 3 are)"
        ))),
    }
}

/// Parses the header text that follows the preamble.
fn parse_header(text: &[u8], data_offset: usize, what: &str) -> Result<Header> {
    let text = std::str::from_utf8(text)
        .map_err(|_| Error::InvalidData(format!("{what}: .npy header is not text")))?;
    let missing =
        |key: &str| Error::InvalidData(format!("{what}: .npy header has no '{key}': {text}"));
    let descr = header_value(text, "descr").ok_or_else(|| missing("descr"))?;
    if descr.starts_with('[') {
        return Err(Error::SchemaMismatch(format!(
            "{what}: structured (record) arrays are not supported; save each field as its own array"
        )));
    }
    let dtype = parse_descr(descr.trim_matches(['\'', '"']), what)?;
    let fortran = header_value(text, "fortran_order").ok_or_else(|| missing("fortran_order"))?;
    let shape_text = header_value(text, "shape").ok_or_else(|| missing("shape"))?;
    let shape = shape_text
        .trim_matches(['(', ')'])
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::InvalidData(format!("{what}: bad .npy shape {shape_text}")))?;
    if fortran == "True" && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(Error::SchemaMismatch(format!(
            "{what}: Fortran-ordered array of shape {shape:?}; save it C-ordered (np.ascontiguousarray)"
        )));
    }
    Ok(Header {
        dtype,
        shape,
        data_offset,
    })
}

/// An input file, shared by the arrays it holds.
#[derive(Debug)]
pub(super) struct Input {
    file: File,
    path: PathBuf,
    len: u64,
}

impl Input {
    pub(super) fn open(path: &Path) -> Result<Arc<Input>> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(Arc::new(Input {
            file,
            path: path.to_path_buf(),
            len,
        }))
    }

    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Fills `buf` from `offset`; running past the end is a "truncated" error.
    fn read_into(&self, offset: u64, buf: &mut [u8], what: &str) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Error::InvalidData(format!(
                    "{what}: {} is truncated (it ends before byte {})",
                    self.path.display(),
                    offset + buf.len() as u64
                ))
            } else {
                Error::io(&self.path, e)
            }
        })
    }

    fn read_at(&self, offset: u64, len: usize, what: &str) -> Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.read_into(offset, &mut buf, what)?;
        Ok(buf)
    }

    /// The `.npy` header that starts at `offset` (of a stored array; `avail` bytes from there).
    fn header_at(&self, offset: u64, avail: u64, what: &str) -> Result<Header> {
        let head = self.read_at(offset, avail.min(12) as usize, what)?;
        let (pre, len) = preamble(&head, what)?;
        if (pre + len) as u64 > avail {
            return Err(Error::InvalidData(format!("{what}: truncated .npy header")));
        }
        let text = self.read_at(offset + pre as u64, len, what)?;
        parse_header(&text, pre + len, what)
    }
}

/// Reads `offset..end` of an input in order (for the inflater).
struct Region {
    input: Arc<Input>,
    pos: u64,
    end: u64,
}

impl Read for Region {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.end - self.pos).min(buf.len() as u64) as usize;
        let got = self.input.file.read_at(&mut buf[..n], self.pos)?;
        self.pos += got as u64;
        Ok(got)
    }
}

fn inflater(input: &Arc<Input>, offset: u64, len: u64) -> DeflateDecoder<BufReader<Region>> {
    let region = Region {
        input: input.clone(),
        pos: offset,
        end: offset + len,
    };
    DeflateDecoder::new(BufReader::with_capacity(1 << 18, region))
}

/// Where an array's bytes are.
#[derive(Debug, Clone)]
pub(super) enum Data {
    /// Raw bytes of the data at `offset` in the input.
    Stored { input: Arc<Input>, offset: u64 },
    /// A deflate stream at `offset..offset + len` of the input that inflates to the whole `.npy`
    /// (header included), whose CRC-32 is `crc`.
    Deflated {
        input: Arc<Input>,
        offset: u64,
        len: u64,
        crc: u32,
    },
    /// A dataset of an HDF5 file.
    Hdf5(super::hdf5::H5Data),
}

/// One array: a column.
#[derive(Debug, Clone)]
pub(super) struct Array {
    pub(super) name: String,
    pub(super) header: Header,
    pub(super) data: Data,
}

impl Array {
    fn rows(&self) -> usize {
        self.header.shape.first().copied().unwrap_or(0)
    }
    /// Values per row.
    fn width(&self) -> usize {
        self.header.shape.iter().skip(1).product()
    }
    fn row_bytes(&self) -> usize {
        self.width() * self.header.dtype.size
    }
    fn field(&self) -> Result<Field> {
        column_field(&self.name, &self.header)
    }
}

/// An inflater positioned at `row` of a deflated array's data.
struct Inflater {
    row: u64,
    decoder: DeflateDecoder<BufReader<Region>>,
    /// CRC-32 of what was inflated so far, checked against the archive's when the last row is in.
    crc: crc32fast::Hasher,
}

/// A `.npz` archive or a directory of `.npy` files, as an ingest [`Source`].
pub(crate) struct NumpySource {
    path: PathBuf,
    schema: SchemaRef,
    /// One per schema field; `None` for arrays the caller dropped.
    arrays: Vec<Option<Array>>,
    rows: u64,
    /// Physical row of logical row 0 (non-zero for a ring buffer that wrapped).
    first: u64,
    /// Inflaters of deflated arrays, by field index.
    inflaters: Mutex<Vec<Option<Inflater>>>,
}

impl NumpySource {
    /// Opens `path`: a `.npz` archive or a directory of `.npy` files. Arrays named in `drop` are
    /// listed (so that `--drop-cols` can name them) but never read or checked.
    pub(crate) fn open(path: &Path, drop: &[String]) -> Result<NumpySource> {
        let arrays = if path.is_dir() {
            open_dir(path, drop)?
        } else {
            let input = Input::open(path)?;
            let magic =
                input.read_at(0, input.len().min(6) as usize, &path.display().to_string())?;
            if magic.starts_with(b"\x93NUMPY") {
                return Err(Error::InvalidArgument(format!(
                    "{} is a single .npy array, i.e. one column; save the dataset's arrays together \
                     (np.savez(\"data.npz\", observations=..., actions=..., rewards=..., terminals=..., \
                     timeouts=...)) or put the .npy files in one directory",
                    path.display()
                )));
            }
            open_zip(path, input, magic.starts_with(b"PK"), drop)?
        };
        if arrays.is_empty() {
            return Err(Error::InvalidData(format!(
                "{} holds no .npy arrays",
                path.display()
            )));
        }
        Self::from_arrays(path, arrays, None, 0)
    }

    /// A source over `arrays` (name, `None` when dropped), which must all have the same first
    /// dimension (the capacity). `rows` (default: the capacity) are read, starting at physical
    /// row `first` and wrapping around (a ring buffer's oldest row first).
    pub(super) fn from_arrays(
        path: &Path,
        mut arrays: Vec<(String, Option<Array>)>,
        rows: Option<u64>,
        first: u64,
    ) -> Result<NumpySource> {
        // `[N, 1]` (TorchRL rewards and flags, many dumps) is one value per row.
        for a in arrays.iter_mut().filter_map(|(_, a)| a.as_mut()) {
            if a.header.shape.len() == 2 && a.header.shape[1] == 1 {
                a.header.shape.pop();
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &arrays {
            if !seen.insert(name.as_str()) {
                return Err(Error::SchemaMismatch(format!(
                    "{} has two arrays named `{name}`",
                    path.display()
                )));
            }
        }
        // Every kept array has one row per transition.
        let kept: Vec<&Array> = arrays.iter().filter_map(|(_, a)| a.as_ref()).collect();
        for a in &kept {
            if a.header.shape.is_empty() {
                return Err(Error::SchemaMismatch(format!(
                    "array `{}` of {} is a scalar, not one value per transition; pass --drop-cols {}",
                    a.name,
                    path.display(),
                    a.name
                )));
            }
            if a.width() == 0 {
                return Err(Error::SchemaMismatch(format!(
                    "array `{}` of {} has shape {:?}: rows of zero values cannot be stored; pass --drop-cols {}",
                    a.name,
                    path.display(),
                    a.header.shape,
                    a.name
                )));
            }
        }
        let capacity = kept.first().map_or(0, |a| a.rows());
        if let Some(a) = kept.iter().find(|a| a.rows() != capacity) {
            return Err(Error::SchemaMismatch(format!(
                "{}: array `{}` has {} rows but `{}` has {rows}; every array must have one row per \
                 transition (pass --drop-cols {} to leave it out)",
                path.display(),
                a.name,
                a.rows(),
                kept[0].name,
                a.name,
                rows = capacity
            )));
        }
        let rows = rows.unwrap_or(capacity as u64);
        if rows > capacity as u64 || (first > 0 && first >= capacity as u64) {
            return Err(Error::InvalidData(format!(
                "{}: {rows} rows from row {first} do not fit arrays of {capacity} rows",
                path.display()
            )));
        }
        let mut fields = vec![];
        for (name, a) in &arrays {
            fields.push(match a {
                Some(a) => a.field()?,
                None => Field::new(name, DataType::Null, true),
            });
        }
        let n = arrays.len();
        Ok(NumpySource {
            path: path.to_path_buf(),
            schema: Arc::new(Schema::new(fields)),
            arrays: arrays.into_iter().map(|(_, a)| a).collect(),
            rows,
            first,
            inflaters: Mutex::new((0..n).map(|_| None).collect()),
        })
    }

    fn compressed(&self) -> bool {
        self.arrays
            .iter()
            .flatten()
            .any(|a| matches!(a.data, Data::Deflated { .. }))
    }

    /// Rows `start..start + n` of array `i` as an Arrow array.
    fn read_rows(&self, i: usize, start: u64, n: usize) -> Result<ArrayRef> {
        let a = self.arrays[i].as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!("array {} was dropped", self.schema.field(i).name()))
        })?;
        let what = || format!("{}: array `{}`", self.path.display(), a.name);
        let row_bytes = a.row_bytes();
        let len = n * row_bytes;
        let mut buf;
        match &a.data {
            Data::Hdf5(d) => {
                return fixed_rows(&a.header, d.read_rows(&a.header, start, n, &what())?);
            }
            Data::Stored { input, offset } => {
                buf = MutableBuffer::from_len_zeroed(len);
                // Logical rows start.. are physical rows (first + start).. modulo the capacity:
                // at most two runs.
                let capacity = a.rows();
                let mut done = 0;
                while done < n {
                    let p = ((self.first + start) as usize + done) % capacity;
                    let k = (n - done).min(capacity - p);
                    input.read_into(
                        offset + (p * row_bytes) as u64,
                        &mut buf.as_slice_mut()[done * row_bytes..(done + k) * row_bytes],
                        &what(),
                    )?;
                    done += k;
                }
            }
            Data::Deflated {
                input,
                offset,
                len: z,
                crc,
            } => {
                buf = MutableBuffer::from_len_zeroed(len);
                let mut inflaters = self.inflaters.lock().expect("inflater lock");
                let slot = &mut inflaters[i];
                if slot.as_ref().is_none_or(|f| f.row != start) {
                    if start != 0 {
                        return Err(Error::InvalidArgument(format!(
                            "{}: a compressed array is read in order only",
                            what()
                        )));
                    }
                    let mut decoder = inflater(input, *offset, *z);
                    // Skip the header (parsed when the archive was opened).
                    let mut skip = vec![0; a.header.data_offset];
                    decoder.read_exact(&mut skip).map_err(|e| {
                        Error::InvalidData(format!("{}: cannot inflate: {e}", what()))
                    })?;
                    let mut hasher = crc32fast::Hasher::new();
                    hasher.update(&skip);
                    *slot = Some(Inflater {
                        row: 0,
                        decoder,
                        crc: hasher,
                    });
                }
                let f = slot.as_mut().expect("inflater");
                f.decoder.read_exact(buf.as_slice_mut()).map_err(|e| {
                    Error::InvalidData(format!(
                        "{}: cannot inflate rows {start}..{}: {e} (truncated or corrupt archive)",
                        what(),
                        start + n as u64
                    ))
                })?;
                f.crc.update(buf.as_slice());
                f.row = start + n as u64;
                if f.row == a.rows() as u64 {
                    let mut rest = vec![];
                    f.decoder.read_to_end(&mut rest).map_err(|e| {
                        Error::InvalidData(format!("{}: cannot inflate: {e}", what()))
                    })?;
                    f.crc.update(&rest);
                    let got = std::mem::take(&mut f.crc).finalize();
                    if got != *crc {
                        return Err(Error::InvalidData(format!(
                            "{}: CRC-32 mismatch (archive says {crc:08x}, data gives {got:08x}): the \
                             archive is corrupt",
                            what()
                        )));
                    }
                }
            }
        }
        let width = a.width();
        let elem = &a.header.dtype.arrow;
        let values: ArrayRef = if elem == &DataType::Boolean {
            let bytes = buf.as_slice();
            Arc::new(BooleanArray::new(
                BooleanBuffer::collect_bool(n * width, |k| bytes[k] != 0),
                None,
            ))
        } else {
            let data = ArrayData::builder(elem.clone())
                .len(n * width)
                .add_buffer(Buffer::from(buf))
                .build()?;
            make_array(data)
        };
        fixed_rows(&a.header, values)
    }
}

/// The column of an array with this header: one value per row, or a fixed-shape tensor.
pub(super) fn column_field(name: &str, header: &Header) -> Result<Field> {
    let elem = header.dtype.arrow.clone();
    if header.shape.len() <= 1 {
        Ok(Field::new(name, elem, false))
    } else {
        tensor_field(name, elem, &header.shape[1..], false)
    }
}

/// `values` (rows × width, flat) as the column of `a`: itself for one value per row, else a
/// fixed-size list of `width`.
pub(super) fn fixed_rows(header: &Header, values: ArrayRef) -> Result<ArrayRef> {
    if header.shape.len() <= 1 {
        return Ok(values);
    }
    let item = Arc::new(Field::new("item", header.dtype.arrow.clone(), false));
    let width: usize = header.shape[1..].iter().product();
    Ok(Arc::new(FixedSizeListArray::try_new(
        item,
        width as i32,
        values,
        None,
    )?))
}

impl Source for NumpySource {
    fn path(&self) -> &Path {
        &self.path
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn units(&self, batch_rows: usize) -> Vec<(usize, u64, u64)> {
        let per = (batch_rows * UNIT_BATCHES) as u64;
        (0..self.rows.div_ceil(per))
            .map(|u| {
                let start = u * per;
                (u as usize, start, per.min(self.rows - start))
            })
            .collect()
    }

    fn parallel(&self) -> bool {
        !self.compressed()
    }

    fn read(
        &self,
        unit: usize,
        projection: &[usize],
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let per = (batch_rows * UNIT_BATCHES) as u64;
        let start = unit as u64 * per;
        let end = (start + per).min(self.rows);
        let schema = Arc::new(self.schema.project(projection)?);
        let mut out = vec![];
        let mut row = start;
        while row < end {
            let n = (end - row).min(batch_rows as u64) as usize;
            let columns = projection
                .iter()
                .map(|&i| self.read_rows(i, row, n))
                .collect::<Result<Vec<_>>>()?;
            out.push(RecordBatch::try_new(schema.clone(), columns)?);
            row += n as u64;
        }
        Ok(out)
    }
}

/// The `.npy` files of a directory, sorted by name.
fn open_dir(dir: &Path, drop: &[String]) -> Result<Vec<(String, Option<Array>)>> {
    let mut paths = vec![];
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        if path.extension().is_some_and(|e| e == "npy") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            if drop.contains(&name) {
                return Ok((name, None));
            }
            let what = path.display().to_string();
            let input = Input::open(&path)?;
            let header = input.header_at(0, input.len(), &what)?;
            let available = input.len() - header.data_offset as u64;
            let array = Array {
                name: name.clone(),
                data: Data::Stored {
                    input,
                    offset: header.data_offset as u64,
                },
                header,
            };
            check_size(&array, available, &what)?;
            Ok((name, Some(array)))
        })
        .collect()
}

/// The data of a stored array must hold all its rows.
pub(super) fn check_size(a: &Array, available: u64, what: &str) -> Result<()> {
    let need = a.rows().checked_mul(a.row_bytes()).ok_or_else(|| {
        Error::InvalidData(format!("{what}: shape {:?} overflows", a.header.shape))
    })? as u64;
    if available < need {
        return Err(Error::InvalidData(format!(
            "{what}: shape {:?} needs {need} bytes of data, the file has {available} (truncated?)",
            a.header.shape
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Zip (the container of .npz): central directory, zip64, stored and deflate members.
// ---------------------------------------------------------------------------------------------

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// One member of the central directory.
struct Member {
    name: String,
    crc: u32,
    method: u16,
    flags: u16,
    compressed: u64,
    uncompressed: u64,
    local_offset: u64,
}

fn corrupt(path: &Path, why: &str) -> Error {
    Error::InvalidData(format!(
        "{}: not a readable .npz (zip) archive: {why}",
        path.display()
    ))
}

/// The central directory's members.
fn zip_members(path: &Path, input: &Input) -> Result<Vec<Member>> {
    const EOCD: u32 = 0x0605_4b50;
    const EOCD64_LOCATOR: u32 = 0x0706_4b50;
    const EOCD64: u32 = 0x0606_4b50;
    const CENTRAL: u32 = 0x0201_4b50;
    let what = path.display().to_string();
    if input.len() < 22 {
        return Err(corrupt(path, "too short"));
    }
    // The end-of-central-directory record is within the last 64 KiB + 22 bytes (comment).
    let tail_start = input.len().saturating_sub(22 + 0xffff);
    let tail = input.read_at(tail_start, (input.len() - tail_start) as usize, &what)?;
    let eocd = (0..=tail.len() - 22)
        .rev()
        .find(|&i| u32_at(&tail, i) == Some(EOCD))
        .ok_or_else(|| corrupt(path, "no end-of-central-directory record (truncated?)"))?;
    let short = |at| u16_at(&tail, eocd + at).ok_or_else(|| corrupt(path, "truncated"));
    let long = |at| u32_at(&tail, eocd + at).ok_or_else(|| corrupt(path, "truncated"));
    let mut entries = short(10)? as u64;
    let mut cd_size = long(12)? as u64;
    let mut cd_offset = long(16)? as u64;
    if entries == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff {
        let loc = (tail_start + eocd as u64)
            .checked_sub(20)
            .ok_or_else(|| corrupt(path, "zip64 locator missing"))?;
        let loc = input.read_at(loc, 20, &what)?;
        if u32_at(&loc, 0) != Some(EOCD64_LOCATOR) {
            return Err(corrupt(path, "zip64 locator missing"));
        }
        let rec_at = u64_at(&loc, 8).ok_or_else(|| corrupt(path, "truncated"))?;
        if rec_at.checked_add(56).is_none_or(|e| e > input.len()) {
            return Err(corrupt(path, "zip64 record lies past the end of the file"));
        }
        let rec = input.read_at(rec_at, 56, &what)?;
        if u32_at(&rec, 0) != Some(EOCD64) {
            return Err(corrupt(path, "bad zip64 end-of-central-directory record"));
        }
        let get = |at| u64_at(&rec, at).ok_or_else(|| corrupt(path, "truncated"));
        entries = get(32)?;
        cd_size = get(40)?;
        cd_offset = get(48)?;
    }
    if cd_offset
        .checked_add(cd_size)
        .is_none_or(|e| e > input.len())
    {
        return Err(corrupt(
            path,
            "central directory lies past the end of the file",
        ));
    }
    let b = input.read_at(cd_offset, cd_size as usize, &what)?;
    let mut at = 0usize;
    let mut out = vec![];
    for _ in 0..entries {
        if at + 46 > b.len() || u32_at(&b, at) != Some(CENTRAL) {
            return Err(corrupt(path, "bad central directory entry"));
        }
        let h = |o| u16_at(&b, at + o).expect("bounds checked");
        let w = |o| u32_at(&b, at + o).expect("bounds checked");
        let (flags, method, crc) = (h(8), h(10), w(16));
        let (mut compressed, mut uncompressed) = (w(20) as u64, w(24) as u64);
        let (name_len, extra_len, comment_len) = (h(28) as usize, h(30) as usize, h(32) as usize);
        let mut local_offset = w(42) as u64;
        let name_at = at + 46;
        let extra_at = name_at + name_len;
        let next = extra_at + extra_len + comment_len;
        if next > b.len() {
            return Err(corrupt(path, "central directory entry runs past its end"));
        }
        let name = String::from_utf8_lossy(&b[name_at..extra_at]).into_owned();
        // Zip64 extended information: the fields that overflowed, in this order.
        let mut e = extra_at;
        while e + 4 <= extra_at + extra_len {
            let (id, size) = (
                u16_at(&b, e).expect("bounds"),
                u16_at(&b, e + 2).expect("bounds") as usize,
            );
            if id == 0x0001 {
                let mut f = e + 4;
                let mut next64 = |v: &mut u64| -> Result<()> {
                    if *v == 0xffff_ffff {
                        *v = u64_at(&b, f)
                            .filter(|_| f + 8 <= e + 4 + size)
                            .ok_or_else(|| corrupt(path, "short zip64 field"))?;
                        f += 8;
                    }
                    Ok(())
                };
                next64(&mut uncompressed)?;
                next64(&mut compressed)?;
                next64(&mut local_offset)?;
            }
            e += 4 + size;
        }
        out.push(Member {
            name,
            crc,
            method,
            flags,
            compressed,
            uncompressed,
            local_offset,
        });
        at = next;
    }
    Ok(out)
}

/// CRC-32 of `offset..offset + len` of an input, read in 8 MiB pieces.
fn crc_of(input: &Input, offset: u64, len: u64, what: &str) -> Result<u32> {
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; (8 << 20).min(len as usize)];
    let mut done = 0u64;
    while done < len {
        let k = (len - done).min(buf.len() as u64) as usize;
        input.read_into(offset + done, &mut buf[..k], what)?;
        hasher.update(&buf[..k]);
        done += k as u64;
    }
    Ok(hasher.finalize())
}

/// The arrays of a `.npz` archive, in the archive's order.
fn open_zip(
    path: &Path,
    input: Arc<Input>,
    is_zip: bool,
    drop: &[String],
) -> Result<Vec<(String, Option<Array>)>> {
    const LOCAL: u32 = 0x0403_4b50;
    if !is_zip {
        return Err(Error::InvalidArgument(format!(
            "{} is neither a .npz archive nor a directory of .npy files",
            path.display()
        )));
    }
    let mut out = vec![];
    for m in zip_members(path, &input)? {
        if m.name.ends_with('/') {
            continue; // a directory entry
        }
        let Some(name) = m.name.strip_suffix(".npy") else {
            return Err(Error::InvalidData(format!(
                "{}: member `{}` is not a .npy array",
                path.display(),
                m.name
            )));
        };
        let name = name.to_string();
        if drop.contains(&name) {
            out.push((name, None));
            continue;
        }
        let what = format!("{}: array `{name}`", path.display());
        if m.flags & 1 != 0 {
            return Err(Error::InvalidData(format!("{what} is encrypted")));
        }
        if m.local_offset
            .checked_add(30)
            .is_none_or(|e| e > input.len())
        {
            return Err(corrupt(path, &format!("no local header for `{}`", m.name)));
        }
        let local = input.read_at(m.local_offset, 30, &what)?;
        if u32_at(&local, 0) != Some(LOCAL) {
            return Err(corrupt(path, &format!("no local header for `{}`", m.name)));
        }
        let (n, e) = (
            u16_at(&local, 26).unwrap_or(0) as u64,
            u16_at(&local, 28).unwrap_or(0) as u64,
        );
        let start = m.local_offset + 30 + n + e;
        if start
            .checked_add(m.compressed)
            .is_none_or(|end| end > input.len())
        {
            return Err(corrupt(path, &format!("member `{}` is truncated", m.name)));
        }
        let array = match m.method {
            0 => {
                let got = crc_of(&input, start, m.compressed, &what)?;
                if got != m.crc {
                    return Err(Error::InvalidData(format!(
                        "{what}: CRC-32 mismatch (archive says {:08x}, data gives {got:08x}): the \
                         archive is corrupt",
                        m.crc
                    )));
                }
                let header = input.header_at(start, m.compressed, &what)?;
                let available = m.compressed - header.data_offset as u64;
                let a = Array {
                    name: name.clone(),
                    data: Data::Stored {
                        input: input.clone(),
                        offset: start + header.data_offset as u64,
                    },
                    header,
                };
                check_size(&a, available, &what)?;
                a
            }
            8 => {
                // Inflate just the header now; the data is inflated while ingesting.
                let mut decoder = inflater(&input, start, m.compressed);
                let mut head = [0u8; 12];
                decoder
                    .read_exact(&mut head)
                    .map_err(|e| Error::InvalidData(format!("{what}: cannot inflate: {e}")))?;
                let (pre, len) = preamble(&head, &what)?;
                let mut text = vec![0u8; pre + len];
                let copied = text.len().min(12);
                text[..copied].copy_from_slice(&head[..copied]);
                if text.len() > 12 {
                    decoder
                        .read_exact(&mut text[12..])
                        .map_err(|e| Error::InvalidData(format!("{what}: cannot inflate: {e}")))?;
                }
                let header = parse_header(&text[pre..], pre + len, &what)?;
                let have = m.uncompressed.saturating_sub(header.data_offset as u64);
                let a = Array {
                    name: name.clone(),
                    data: Data::Deflated {
                        input: input.clone(),
                        offset: start,
                        len: m.compressed,
                        crc: m.crc,
                    },
                    header,
                };
                check_size(&a, have, &what)?;
                a
            }
            other => {
                return Err(Error::InvalidData(format!(
                    "{what} uses zip compression method {other}; only stored (np.savez) and \
                     deflate (np.savez_compressed) are supported"
                )));
            }
        };
        out.push((name, Some(array)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_of_every_version_and_dtype() {
        let h = |s: &str| parse_header(s.as_bytes(), 128, "t");
        let x = h("{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 17), }").unwrap();
        assert_eq!(x.dtype.arrow, DataType::Float32);
        assert_eq!(x.shape, vec![1000, 17]);
        let x = h("{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }").unwrap();
        assert_eq!((x.dtype.arrow, x.shape), (DataType::Boolean, vec![5]));
        let x = h("{'descr': '<i8', 'fortran_order': True, 'shape': (7,), }").unwrap();
        assert_eq!(x.dtype.arrow, DataType::Int64);
        let x = h("{'descr': '<u2', 'fortran_order': False, 'shape': (), }").unwrap();
        assert!(x.shape.is_empty());
        // Errors that say what to do.
        let e = h("{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }").unwrap_err();
        assert!(e.to_string().contains("big-endian"), "{e}");
        let e = h("{'descr': '<U7', 'fortran_order': False, 'shape': (3,), }").unwrap_err();
        assert!(e.to_string().contains("not supported"), "{e}");
        let e =
            h("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }").unwrap_err();
        assert!(e.to_string().contains("structured"), "{e}");
        let e = h("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2), }").unwrap_err();
        assert!(e.to_string().contains("Fortran"), "{e}");
        assert!(h("{'descr': '<f4', 'shape': (3,), }").is_err());
    }

    #[test]
    fn preamble_rejects_garbage_and_truncation() {
        assert!(preamble(b"hello world!", "t").is_err());
        assert!(preamble(b"\x93NUMPY\x02\x00\x10", "t").is_err());
        assert!(preamble(b"\x93NUMPY\x09\x00\x10\x00", "t").is_err());
        assert_eq!(
            preamble(b"\x93NUMPY\x01\x00\x76\x00", "t").unwrap(),
            (10, 0x76)
        );
    }
}
