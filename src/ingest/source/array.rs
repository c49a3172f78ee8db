//! Array inputs (NumPy `.npz`/`.npy`, TorchRL memmaps, HDF5 datasets) as one ingest source:
//! [`ArraySource`] reads named arrays whose first dimension is the transition.
//!
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

use std::fmt;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arrow::array::{
    ArrayData, ArrayRef, BooleanArray, FixedSizeListArray, RecordBatch, make_array,
};
use arrow::buffer::{BooleanBuffer, Buffer, MutableBuffer};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use flate2::read::DeflateDecoder;

use super::npy::{Header, Input, Loc, Region, inflater, parse_header, preamble};
use super::zip::{corrupt, crc_of, u16_at, u32_at, zip_members};
use super::{Source, UNIT_BATCHES};
use crate::error::{Error, Result};
use crate::schema::tensor_field;

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
    /// Read by the input format's own reader (a dataset of an HDF5 file).
    Rows(Arc<dyn ReadRows>),
}

/// An array whose rows a format's own reader decodes (HDF5 datasets): [`Data::Rows`].
pub(super) trait ReadRows: fmt::Debug + Send + Sync {
    /// Rows `start..start + n` of an array with this `header`, flat (rows × width values); errors
    /// name `at`.
    fn read_rows(&self, header: &Header, start: u64, n: usize, at: &Loc) -> Result<ArrayRef>;
}

/// One array: a column.
#[derive(Debug, Clone)]
pub(super) struct Array {
    pub(super) name: String,
    pub(super) header: Header,
    pub(super) data: Data,
}

impl Array {
    pub(super) fn rows(&self) -> usize {
        self.header.shape.first().copied().unwrap_or(0)
    }
    /// Values per row (saturated: a shape whose product overflows is refused by
    /// [`Array::checked_row_bytes`] before any read).
    fn width(&self) -> usize {
        self.header
            .shape
            .iter()
            .skip(1)
            .fold(1usize, |a, &d| a.saturating_mul(d))
    }
    fn row_bytes(&self) -> usize {
        self.width().saturating_mul(self.header.dtype.size)
    }
    /// Bytes of one row, if neither it nor the whole array's size overflows (a shape read from a
    /// damaged header may be anything).
    fn checked_row_bytes(&self) -> Option<usize> {
        let row = self
            .header
            .shape
            .iter()
            .skip(1)
            .try_fold(self.header.dtype.size, |a, &d| a.checked_mul(d))?;
        self.rows().checked_mul(row)?;
        // A fixed-size list holds at most i32::MAX values per row.
        (self.width() <= i32::MAX as usize).then_some(row)
    }
    fn field(&self) -> Result<Field> {
        column_field(&self.name, &self.header)
    }
}

/// An inflater positioned at `row` of a deflated array's data.
pub(crate) struct Inflater {
    row: u64,
    decoder: DeflateDecoder<BufReader<Region>>,
    /// CRC-32 of what was inflated so far, checked against the archive's when the last row is in.
    crc: crc32fast::Hasher,
}

/// A `.npz` archive or a directory of `.npy` files, as an ingest [`Source`].
pub(crate) struct ArraySource {
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

impl ArraySource {
    /// Opens `path`: a `.npz` archive or a directory of `.npy` files. Arrays named in `drop` are
    /// listed (so that `--drop-cols` can name them) but never read or checked.
    pub(crate) fn open(path: &Path, drop: &[String]) -> Result<ArraySource> {
        let arrays = if path.is_dir() {
            open_dir(path, drop)?
        } else {
            let input = Input::open(path)?;
            let magic = input.read_at(0, input.len().min(6) as usize, &Loc::file(path))?;
            if magic.starts_with(b"\x93NUMPY") {
                return Err(Error::argument(
                    "input",
                    format!(
                        "{} is a single .npy array, i.e. one column; save the dataset's arrays \
                         together (np.savez(\"data.npz\", observations=..., actions=..., \
                         rewards=..., terminals=..., timeouts=...)) or put the .npy files in one \
                         directory",
                        path.display()
                    ),
                ));
            }
            open_zip(path, input, magic.starts_with(b"PK"), drop, true)?
        };
        if arrays.is_empty() {
            return Err(
                Error::invalid_data("the input holds no .npy arrays").in_input(path.display())
            );
        }
        Self::from_arrays(path, arrays, None, 0)
    }

    /// A source over `arrays` (name, `None` when dropped), which must all have the same first
    /// dimension (the capacity). `rows` (default: the capacity) are read, starting at physical
    /// row `first` and wrapping around (a ring buffer's oldest row first).
    pub(super) fn from_arrays(
        path: &Path,
        arrays: Vec<(String, Option<Array>)>,
        rows: Option<u64>,
        first: u64,
    ) -> Result<ArraySource> {
        Self::with_states(path, arrays, rows, first, &[])
    }

    /// [`ArraySource::from_arrays`], where the arrays named in `states` have one row more than
    /// the others (one per state of an episode: `T + 1` observations for `T` steps); their
    /// extra row is read with [`ArraySource::read_column`] only.
    pub(super) fn with_states(
        path: &Path,
        mut arrays: Vec<(String, Option<Array>)>,
        rows: Option<u64>,
        first: u64,
        states: &[String],
    ) -> Result<ArraySource> {
        squeeze(&mut arrays);
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &arrays {
            if !seen.insert(name.as_str()) {
                return Err(Loc::array(path, name).schema(format!("two arrays are named `{name}`")));
            }
        }
        // Every kept array has one row per transition.
        let kept: Vec<&Array> = arrays.iter().filter_map(|(_, a)| a.as_ref()).collect();
        for a in &kept {
            if a.checked_row_bytes().is_none() {
                return Err(Loc::array(path, &a.name).data(format!(
                    "array `{}` has shape {:?}, whose size overflows (a damaged header?)",
                    a.name, a.header.shape
                )));
            }
            if a.header.shape.is_empty() {
                return Err(Loc::array(path, &a.name).schema(format!(
                    "array `{}` is a scalar, not one value per transition; pass --drop-cols {}",
                    a.name, a.name
                )));
            }
            if a.width() == 0 {
                return Err(Loc::array(path, &a.name).schema(format!(
                    "array `{}` has shape {:?}: rows of zero values cannot be stored; pass \
                     --drop-cols {}",
                    a.name, a.header.shape, a.name
                )));
            }
        }
        let is_state = |a: &Array| states.contains(&a.name);
        // One row per step; per-state arrays have one more.
        let capacity = match kept.iter().find(|a| !is_state(a)) {
            Some(a) => a.rows(),
            None => kept.first().map_or(0, |a| a.rows().saturating_sub(1)),
        };
        if let Some(a) = kept
            .iter()
            .find(|a| a.rows() != capacity + usize::from(is_state(a)))
        {
            let (what, want) = match is_state(a) {
                true => ("state", capacity + 1),
                false => ("transition", capacity),
            };
            return Err(Loc::array(path, &a.name).schema(format!(
                "array `{}` has {} rows but {want} were expected (`{}` has {capacity}); every \
                 array must have one row per {what} (pass --drop-cols {} to leave it out)",
                a.name,
                a.rows(),
                kept.iter().find(|a| !is_state(a)).unwrap_or(&kept[0]).name,
                a.name,
            )));
        }
        let rows = rows.unwrap_or(capacity as u64);
        if rows > capacity as u64 || (first > 0 && first >= capacity as u64) {
            return Err(Loc::file(path).data(format!(
                "{rows} rows from row {first} do not fit arrays of {capacity} rows"
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
        Ok(ArraySource {
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

    /// Rows (transitions) the source reads.
    pub(super) fn rows(&self) -> u64 {
        self.rows
    }

    /// Rows `start..start + n` of column `i` (of [`Source::schema`]) as an Arrow array: a
    /// deflated array is read in order, from row 0.
    pub(super) fn read_column(&self, i: usize, start: u64, n: usize) -> Result<ArrayRef> {
        self.read_rows(i, start, n)
    }

    /// Rows `start..start + n` of array `i` as an Arrow array.
    fn read_rows(&self, i: usize, start: u64, n: usize) -> Result<ArrayRef> {
        let a = self.arrays[i].as_ref().ok_or_else(|| {
            Error::argument(
                "projection",
                format!("array `{}` was dropped", self.schema.field(i).name()),
            )
        })?;
        let at = Loc::array(&self.path, &a.name);
        let row_bytes = a.row_bytes();
        let len = n * row_bytes;
        let mut buf;
        match &a.data {
            Data::Rows(d) => {
                return fixed_rows(&a.header, d.read_rows(&a.header, start, n, &at)?);
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
                        &at,
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
                        return Err(Error::argument(
                            "start",
                            format!(
                                "array `{}` of {} is compressed, so it is read in order only \
                                 (rows from {start} asked for)",
                                a.name,
                                self.path.display()
                            ),
                        ));
                    }
                    let mut decoder = inflater(input, *offset, *z);
                    // Skip the header (parsed when the archive was opened).
                    let mut skip = vec![0; a.header.data_offset];
                    decoder
                        .read_exact(&mut skip)
                        .map_err(|e| at.data(format!("cannot inflate: {e}")))?;
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
                    at.data(format!(
                        "cannot inflate rows {start}..{}: {e} (truncated or corrupt archive)",
                        start + n as u64
                    ))
                })?;
                f.crc.update(buf.as_slice());
                f.row = start + n as u64;
                if f.row == a.rows() as u64 {
                    let mut rest = vec![];
                    f.decoder
                        .read_to_end(&mut rest)
                        .map_err(|e| at.data(format!("cannot inflate: {e}")))?;
                    f.crc.update(&rest);
                    let got = std::mem::take(&mut f.crc).finalize();
                    if got != *crc {
                        return Err(at.data(format!(
                            "CRC-32 mismatch (archive says {crc:08x}, data gives {got:08x}): the \
                             archive is corrupt"
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

/// `[N, 1]` arrays (TorchRL rewards and flags, many dumps) as one value per row.
pub(super) fn squeeze(arrays: &mut [(String, Option<Array>)]) {
    for a in arrays.iter_mut().filter_map(|(_, a)| a.as_mut()) {
        if a.header.shape.len() == 2 && a.header.shape[1] == 1 {
            a.header.shape.pop();
        }
    }
}

/// The arrays of the `.npz` archive `path`, in the archive's order (`None` for those named in
/// `drop`). `verify`: check the CRC-32 of stored members now (a full read); deflated members
/// are checked as they are inflated.
pub(super) fn open_npz(
    path: &Path,
    drop: &[String],
    verify: bool,
) -> Result<Vec<(String, Option<Array>)>> {
    let input = Input::open(path)?;
    let magic = input.read_at(0, input.len().min(4) as usize, &Loc::file(path))?;
    open_zip(path, input, magic.starts_with(b"PK"), drop, verify)
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

impl Source for ArraySource {
    super::path_and_schema_fields!();

    fn units(&self, batch_rows: usize) -> Vec<(usize, u64, u64)> {
        let per = unit_rows(batch_rows);
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
        let per = unit_rows(batch_rows);
        let start = (unit as u64).saturating_mul(per);
        let end = start.saturating_add(per).min(self.rows);
        let batch_rows = batch_rows.max(1);
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

/// Rows of one unit of a source that chooses its units: [`UNIT_BATCHES`] batches of
/// `batch_rows` (at least 1; saturated, so that no option overflows it).
pub(super) fn unit_rows(batch_rows: usize) -> u64 {
    (batch_rows.max(1) as u64).saturating_mul(UNIT_BATCHES as u64)
}

/// The data of a stored array must hold all its rows.
pub(super) fn check_size(a: &Array, available: u64, at: &Loc) -> Result<()> {
    let need = a
        .checked_row_bytes()
        .and_then(|row| a.rows().checked_mul(row))
        .ok_or_else(|| at.data(format!("shape {:?} overflows", a.header.shape)))?
        as u64;
    if available < need {
        return Err(at.data(format!(
            "shape {:?} needs {need} bytes of data, the file has {available} (truncated?)",
            a.header.shape
        )));
    }
    Ok(())
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
            let at = Loc::array(&path, &name);
            let input = Input::open(&path)?;
            let header = input.header_at(0, input.len(), &at)?;
            let available = input.len() - header.data_offset as u64;
            let array = Array {
                name: name.clone(),
                data: Data::Stored {
                    input,
                    offset: header.data_offset as u64,
                },
                header,
            };
            check_size(&array, available, &at)?;
            Ok((name, Some(array)))
        })
        .collect()
}

/// The longest `.npy` header read from a deflated member (NumPy's own reader refuses headers
/// over 10 000 bytes unless told otherwise).
const MAX_NPY_HEADER: u64 = 1 << 20;

/// The arrays of a `.npz` archive, in the archive's order.
fn open_zip(
    path: &Path,
    input: Arc<Input>,
    is_zip: bool,
    drop: &[String],
    verify: bool,
) -> Result<Vec<(String, Option<Array>)>> {
    const LOCAL: u32 = 0x0403_4b50;
    if !is_zip {
        return Err(Error::argument(
            "input",
            format!(
                "{} is neither a .npz archive nor a directory of .npy files",
                path.display()
            ),
        ));
    }
    let mut out = vec![];
    for m in zip_members(path, &input)? {
        if m.name.ends_with('/') {
            continue; // a directory entry
        }
        let Some(name) = m.name.strip_suffix(".npy") else {
            return Err(
                Error::invalid_data(format!("member `{}` is not a .npy array", m.name))
                    .in_input(path.display()),
            );
        };
        let name = name.to_string();
        if drop.contains(&name) {
            out.push((name, None));
            continue;
        }
        let what = Loc::array(path, &name);
        if m.flags & 1 != 0 {
            return Err(what.data("the array is encrypted"));
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
                let got = match verify {
                    true => crc_of(&input, start, m.compressed, &what)?,
                    false => m.crc,
                };
                if got != m.crc {
                    return Err(what.data(format!(
                        "CRC-32 mismatch (archive says {:08x}, data gives {got:08x}): the \
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
                    .map_err(|e| what.data(format!("cannot inflate: {e}")))?;
                let (pre, len) = preamble(&head, &what)?;
                // NumPy's headers are a few hundred bytes; a length field that says more than
                // the member holds (or than any header needs) is damage, not a header to inflate.
                if (pre + len) as u64 > m.uncompressed.min(MAX_NPY_HEADER) {
                    return Err(what.data(format!(
                        "a .npy header of {} bytes in a member of {} bytes (damaged header)",
                        pre + len,
                        m.uncompressed
                    )));
                }
                let mut text = vec![0u8; pre + len];
                let copied = text.len().min(12);
                text[..copied].copy_from_slice(&head[..copied]);
                if text.len() > 12 {
                    decoder
                        .read_exact(&mut text[12..])
                        .map_err(|e| what.data(format!("cannot inflate: {e}")))?;
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
                return Err(what.data(format!(
                    "the array uses zip compression method {other}; only stored (np.savez) and \
                     deflate (np.savez_compressed) are supported"
                )));
            }
        };
        out.push((name, Some(array)));
    }
    Ok(out)
}
