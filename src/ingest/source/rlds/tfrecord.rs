//! TFRecord files: a sequence of records, each
//!
//! ```text
//! length          u64, little-endian
//! length_crc      u32, little-endian: masked CRC-32C of the 8 length bytes
//! data            `length` bytes
//! data_crc        u32, little-endian: masked CRC-32C of the data
//! ```
//!
//! where the mask is TensorFlow's `((crc >> 15) | (crc << 17)) + 0xa282ead8` (wrapping). Files
//! are not compressed (TFDS writes plain shards). [`RecordReader`] reads one record at a time
//! into a buffer it reuses: memory is the largest record, and a length field is checked (its
//! CRC, and against the bytes left in the file) before anything is allocated for it. A damaged
//! or truncated record is an [`Error::InvalidData`] naming the file, the record's index and its
//! byte offset.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The constant TensorFlow adds to a rotated CRC-32C.
const MASK_DELTA: u32 = 0xa282_ead8;

/// Bytes before a record's data (length and its CRC) and after it (the data's CRC).
pub(crate) const HEADER: u64 = 12;
const FOOTER: u64 = 4;

/// TensorFlow's masked CRC-32C of `bytes`.
pub(crate) fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// One record's frame in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordPos {
    /// 0-based index of the record in its file.
    pub(crate) index: u64,
    /// Byte offset of the record's length field.
    pub(crate) offset: u64,
}

/// Reads the records of one TFRecord file in order.
pub(crate) struct RecordReader {
    path: PathBuf,
    reader: BufReader<File>,
    size: u64,
    /// Byte offset of the next record.
    offset: u64,
    /// Index of the next record.
    index: u64,
    buf: Vec<u8>,
}

impl RecordReader {
    /// Opens `path` (reads nothing yet).
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let size = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(RecordReader {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 20, file),
            size,
            offset: 0,
            index: 0,
            buf: Vec::new(),
        })
    }

    /// The file's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// An [`Error::InvalidData`] about the record at `pos` of this file.
    pub(crate) fn error_at(&self, pos: RecordPos, reason: impl std::fmt::Display) -> Error {
        record_error(&self.path, pos, reason)
    }

    fn fill(&mut self, len: usize, pos: RecordPos, what: &str) -> Result<()> {
        self.buf.clear();
        let got = (&mut self.reader)
            .take(len as u64)
            .read_to_end(&mut self.buf)
            .map_err(|e| Error::io(&self.path, e))?;
        if got != len {
            return Err(self.error_at(
                pos,
                format!(
                    "truncated: the file ends {got} bytes into the record's {what} of {len} bytes"
                ),
            ));
        }
        Ok(())
    }

    /// The next record's data and position, `None` at the end of the file. The slice is valid
    /// until the next call.
    pub(crate) fn next_record(&mut self) -> Result<Option<(RecordPos, &[u8])>> {
        let pos = RecordPos {
            index: self.index,
            offset: self.offset,
        };
        if self.offset == self.size {
            return Ok(None);
        }
        self.fill(HEADER as usize, pos, "header")?;
        let len = u64::from_le_bytes(self.buf[..8].try_into().expect("8 bytes"));
        let stored = u32::from_le_bytes(self.buf[8..12].try_into().expect("4 bytes"));
        let computed = masked_crc(&self.buf[..8]);
        if stored != computed {
            return Err(self.error_at(
                pos,
                format!(
                    "the CRC-32C of the length field does not match (stored {stored:#010x}, \
                     computed {computed:#010x}): not a TFRecord file, or a damaged one"
                ),
            ));
        }
        let left = self.size - self.offset - HEADER;
        if len.checked_add(FOOTER).is_none_or(|need| need > left) {
            return Err(self.error_at(
                pos,
                format!(
                    "truncated: the record holds {len} bytes of data, the file has {left} bytes \
                     left after its header"
                ),
            ));
        }
        let len = usize::try_from(len)
            .map_err(|_| self.error_at(pos, format!("a record of {len} bytes")))?;
        self.fill(len + FOOTER as usize, pos, "data")?;
        let stored = u32::from_le_bytes(self.buf[len..].try_into().expect("4 bytes"));
        let computed = masked_crc(&self.buf[..len]);
        if stored != computed {
            return Err(self.error_at(
                pos,
                format!(
                    "the CRC-32C of the record's {len} bytes of data does not match (stored \
                     {stored:#010x}, computed {computed:#010x})"
                ),
            ));
        }
        self.offset += HEADER + len as u64 + FOOTER;
        self.index += 1;
        Ok(Some((pos, &self.buf[..len])))
    }
}

/// An [`Error::InvalidData`] about the record at `pos` of `path`.
pub(crate) fn record_error(path: &Path, pos: RecordPos, reason: impl std::fmt::Display) -> Error {
    Error::invalid_data(format!(
        "record {} at byte {}: {reason}",
        pos.index, pos.offset
    ))
    .in_input(path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record framed as TensorFlow writes it.
    pub(crate) fn frame(data: &[u8]) -> Vec<u8> {
        let len = (data.len() as u64).to_le_bytes();
        let mut out = len.to_vec();
        out.extend(masked_crc(&len).to_le_bytes());
        out.extend(data);
        out.extend(masked_crc(data).to_le_bytes());
        out
    }

    fn read_all(bytes: &[u8]) -> Result<Vec<(RecordPos, Vec<u8>)>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.tfrecord-00000-of-00001");
        std::fs::write(&path, bytes).unwrap();
        let mut r = RecordReader::open(&path)?;
        let mut out = vec![];
        while let Some((pos, data)) = r.next_record()? {
            out.push((pos, data.to_vec()));
        }
        Ok(out)
    }

    #[test]
    fn the_mask_is_tensorflows() {
        // crc32c("") = 0 and crc32c("a") = 0xc1d04330; TensorFlow's `Mask` of the latter,
        // `((crc >> 15) | (crc << 17)) + 0xa282ead8`, worked by hand. (The fixtures written by
        // TensorFlow check the same on every record.)
        assert_eq!(masked_crc(b""), MASK_DELTA);
        assert_eq!(crc32c::crc32c(b"a"), 0xc1d0_4330);
        assert_eq!(masked_crc(b"a"), 0x28e4_6e78);
    }

    #[test]
    fn records_read_back_in_order_with_their_offsets() {
        let mut bytes = frame(b"first");
        bytes.extend(frame(b""));
        bytes.extend(frame(&[7u8; 300]));
        let got = read_all(&bytes).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].1, b"first");
        assert_eq!(
            got[1].0,
            RecordPos {
                index: 1,
                offset: 21
            }
        );
        assert!(got[1].1.is_empty());
        assert_eq!(
            got[2].0,
            RecordPos {
                index: 2,
                offset: 37
            }
        );
        assert_eq!(got[2].1, vec![7u8; 300]);
        assert!(read_all(b"").unwrap().is_empty());
    }

    fn message(bytes: &[u8]) -> String {
        read_all(bytes).unwrap_err().to_string()
    }

    #[test]
    fn damage_is_named_with_the_record_and_its_offset() {
        let mut bytes = frame(b"first");
        bytes.extend(frame(b"second"));
        // The second record's data.
        let mut bad = bytes.clone();
        bad[21 + 12] ^= 1;
        let m = message(&bad);
        assert!(
            m.contains("record 1 at byte 21") && m.contains("data"),
            "{m}"
        );
        assert!(m.contains("x.tfrecord-00000-of-00001"), "{m}");
        // Its length.
        let mut bad = bytes.clone();
        bad[21] ^= 0x40;
        let m = message(&bad);
        assert!(
            m.contains("record 1 at byte 21") && m.contains("length"),
            "{m}"
        );
        // A length that claims more than the file holds, with a valid CRC: no allocation.
        let mut bad = bytes.clone();
        let huge = u64::MAX.to_le_bytes();
        bad[21..29].copy_from_slice(&huge);
        bad[29..33].copy_from_slice(&masked_crc(&huge).to_le_bytes());
        let m = message(&bad);
        assert!(m.contains("truncated"), "{m}");
        // Cut in every place.
        for cut in [22, 21 + 11, 21 + 12 + 3, bytes.len() - 1] {
            let m = message(&bytes[..cut]);
            assert!(
                m.contains("record 1 at byte 21") && m.contains("truncated"),
                "{cut}: {m}"
            );
        }
    }
}
