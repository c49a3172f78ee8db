//! The `.npy` format: dtype and header parsing, and positioned reads of an input file (shared by
//! every array format).

use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::datatypes::DataType;
use flate2::read::DeflateDecoder;

use crate::error::{Error, Result};

/// Where in an input a problem is: the file (or archive, or directory) and, when known, the array
/// (the column it becomes). Errors built here carry both in their fields.
#[derive(Debug, Clone)]
pub(crate) struct Loc {
    /// The input, as displayed.
    pub(crate) input: String,
    /// The array (column) at fault, when one is.
    pub(crate) column: Option<String>,
}

impl Loc {
    /// The input `path` as a whole.
    pub(crate) fn file(path: &Path) -> Loc {
        Loc {
            input: path.display().to_string(),
            column: None,
        }
    }

    /// Array `name` of input `path`.
    pub(crate) fn array(path: &Path, name: &str) -> Loc {
        Loc {
            input: path.display().to_string(),
            column: Some(name.to_string()),
        }
    }

    /// An [`Error::InvalidData`] in this input (and column).
    pub(crate) fn data(&self, reason: impl Into<String>) -> Error {
        self.narrow(Error::invalid_data(reason).in_input(&self.input))
    }

    /// An [`Error::SchemaMismatch`] about this column (the input is named in the reason).
    pub(crate) fn schema(&self, reason: impl fmt::Display) -> Error {
        let reason = format!("{}: {reason}", self.input);
        match &self.column {
            Some(c) => Error::schema(c, reason),
            None => Error::schema_mismatch(reason),
        }
    }

    /// `e` narrowed to this location's column, when there is one.
    pub(crate) fn narrow(&self, e: Error) -> Error {
        match &self.column {
            Some(c) => e.in_column(c),
            None => e,
        }
    }
}

/// An element type NumPy may store and Arrow can hold.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Dtype {
    pub(super) arrow: DataType,
    pub(super) size: usize,
}

/// Parses a NumPy `descr` such as `<f4`, `|b1` or `<i8`.
pub(super) fn parse_descr(descr: &str, at: &Loc) -> Result<Dtype> {
    let bad = |why: &str| {
        at.schema(format!(
            "NumPy dtype '{descr}' {why}; supported: bool, int8-64, uint8-64, float16/32/64"
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
        return Err(at.schema(format!(
            "big-endian dtype '{descr}'; convert it first (arr.astype(arr.dtype.newbyteorder('<')))"
        )));
    }
    Ok(Dtype { arrow, size })
}

/// The value of `'key':` in a NumPy header dict, as raw text up to the next top-level comma.
pub(crate) fn header_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
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
pub(crate) fn preamble(bytes: &[u8], at: &Loc) -> Result<(usize, usize)> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(at.data("not a NumPy .npy array (no \\x93NUMPY magic, or truncated)"));
    }
    match bytes[6] {
        1 => Ok((10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize)),
        2 | 3 if bytes.len() >= 12 => Ok((
            12,
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
        )),
        2 | 3 => Err(at.data("truncated .npy header")),
        v => Err(at.data(format!(
            ".npy format version {v} is not supported (1, 2 and 3 are)"
        ))),
    }
}

/// Parses the header text that follows the preamble.
pub(crate) fn parse_header(text: &[u8], data_offset: usize, at: &Loc) -> Result<Header> {
    let text = std::str::from_utf8(text).map_err(|_| at.data(".npy header is not text"))?;
    let missing = |key: &str| at.data(format!(".npy header has no '{key}': {text}"));
    let descr = header_value(text, "descr").ok_or_else(|| missing("descr"))?;
    if descr.starts_with('[') {
        return Err(at.schema(
            "structured (record) arrays are not supported; save each field as its own array",
        ));
    }
    let dtype = parse_descr(descr.trim_matches(['\'', '"']), at)?;
    let fortran = header_value(text, "fortran_order").ok_or_else(|| missing("fortran_order"))?;
    let shape_text = header_value(text, "shape").ok_or_else(|| missing("shape"))?;
    let shape = shape_text
        .trim_matches(['(', ')'])
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| at.data(format!("bad .npy shape {shape_text}")))?;
    if fortran == "True" && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(at.schema(format!(
            "Fortran-ordered array of shape {shape:?}; save it C-ordered (np.ascontiguousarray)"
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

    /// Fills `buf` from `offset`; running past the end is a "truncated" error (in this file, and
    /// in the column of `at`).
    pub(crate) fn read_into(&self, offset: u64, buf: &mut [u8], at: &Loc) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                at.narrow(
                    Error::invalid_data(format!(
                        "the file is truncated (it ends before byte {})",
                        offset + buf.len() as u64
                    ))
                    .in_input(self.path.display()),
                )
            } else {
                Error::io(&self.path, e)
            }
        })
    }

    pub(crate) fn read_at(&self, offset: u64, len: usize, at: &Loc) -> Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.read_into(offset, &mut buf, at)?;
        Ok(buf)
    }

    /// The `.npy` header that starts at `offset` (of a stored array; `avail` bytes from there).
    pub(crate) fn header_at(&self, offset: u64, avail: u64, at: &Loc) -> Result<Header> {
        let head = self.read_at(offset, avail.min(12) as usize, at)?;
        let (pre, len) = preamble(&head, at)?;
        if (pre + len) as u64 > avail {
            return Err(at.data("truncated .npy header"));
        }
        let text = self.read_at(offset + pre as u64, len, at)?;
        parse_header(&text, pre + len, at)
    }
}

/// Reads `offset..end` of an input in order (for the inflater).
pub(crate) struct Region {
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

pub(crate) fn inflater(
    input: &Arc<Input>,
    offset: u64,
    len: u64,
) -> DeflateDecoder<BufReader<Region>> {
    let region = Region {
        input: input.clone(),
        pos: offset,
        end: offset + len,
    };
    DeflateDecoder::new(BufReader::with_capacity(1 << 18, region))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_of_every_version_and_dtype() {
        let t = Loc::array(Path::new("t.npz"), "x");
        let h = |s: &str| parse_header(s.as_bytes(), 128, &t);
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
        assert!(
            matches!(e, Error::SchemaMismatch { column: Some(ref c), .. } if c == "x"),
            "{e}"
        );
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
        let t = &Loc::file(Path::new("t.npy"));
        let e = preamble(b"hello world!", t).unwrap_err();
        assert!(
            matches!(e, Error::InvalidData { input: Some(ref i), column: None, .. } if i == "t.npy"),
            "{e}"
        );
        assert!(preamble(b"\x93NUMPY\x02\x00\x10", t).is_err());
        assert!(preamble(b"\x93NUMPY\x09\x00\x10\x00", t).is_err());
        assert_eq!(
            preamble(b"\x93NUMPY\x01\x00\x76\x00", t).unwrap(),
            (10, 0x76)
        );
    }
}
