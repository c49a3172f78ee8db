//! A decoder of the protobuf messages `tf.train.Example` (the records of a TFDS shard), written
//! for exactly these messages (TensorFlow's `example.proto` and `feature.proto`):
//!
//! ```text
//! Example   { Features features = 1; }
//! Features  { map<string, Feature> feature = 1; }   // entries: key = 1, value = 2
//! Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//!                          Int64List int64_list = 3; } }
//! BytesList { repeated bytes value = 1; }
//! FloatList { repeated float value = 1 [packed = true]; }
//! Int64List { repeated int64 value = 1 [packed = true]; }
//! ```
//!
//! Protobuf's wire rules apply: unknown fields are skipped, repeated numbers are read packed or
//! not, a message field given twice is merged (lists concatenated, the last map entry of a key
//! wins, the last kind of a `oneof` wins). Bytes are borrowed from the record, numbers copied.
//! Malformed input (a varint past 10 bytes, a length past the end, a group, a wire type that
//! does not fit the field) is an error string, never a panic.

use std::collections::HashMap;

/// The values of one feature.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Feature<'a> {
    /// `bytes_list`.
    Bytes(Vec<&'a [u8]>),
    /// `float_list`.
    Floats(Vec<f32>),
    /// `int64_list`.
    Ints(Vec<i64>),
    /// A feature with no kind set.
    Empty,
}

impl Feature<'_> {
    /// The kind, as `features.json` and messages name it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Feature::Bytes(_) => "bytes_list",
            Feature::Floats(_) => "float_list",
            Feature::Ints(_) => "int64_list",
            Feature::Empty => "no list",
        }
    }

    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            Feature::Bytes(v) => v.len(),
            Feature::Floats(v) => v.len(),
            Feature::Ints(v) => v.len(),
            Feature::Empty => 0,
        }
    }
}

/// A decoded `tf.train.Example`: feature name → values.
pub(crate) type Example<'a> = HashMap<&'a str, Feature<'a>>;

/// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// A cursor over one message's bytes.
struct Wire<'a> {
    bytes: &'a [u8],
    at: usize,
}

type Res<T> = std::result::Result<T, String>;

impl<'a> Wire<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Wire { bytes, at: 0 }
    }

    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn varint(&mut self) -> Res<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err(format!("a varint runs past the end at byte {}", self.at));
            };
            self.at += 1;
            if i == 9 && b > 1 {
                return Err(format!(
                    "a varint overflows 64 bits at byte {}",
                    self.at - 1
                ));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("a varint longer than 10 bytes at byte {}", self.at))
    }

    /// The next field: (number, wire type).
    fn tag(&mut self) -> Res<(u64, u8)> {
        let at = self.at;
        let t = self.varint()?;
        let (field, wire) = (t >> 3, (t & 7) as u8);
        if field == 0 {
            return Err(format!("field number 0 at byte {at}"));
        }
        Ok((field, wire))
    }

    fn take(&mut self, n: u64) -> Res<&'a [u8]> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(format!(
                "a field of {n} bytes at byte {} runs past the end ({left} bytes left)",
                self.at
            ));
        }
        let s = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(s)
    }

    fn len_delimited(&mut self) -> Res<&'a [u8]> {
        let n = self.varint()?;
        self.take(n)
    }

    /// Skips a field of wire type `wire`.
    fn skip(&mut self, wire: u8) -> Res<()> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.len_delimited().map(drop),
            FIXED32 => self.take(4).map(drop),
            w => Err(format!(
                "wire type {w} (groups or invalid) at byte {}",
                self.at
            )),
        }
    }
}

/// Decodes one serialized `tf.train.Example`.
pub(crate) fn decode(bytes: &[u8]) -> Res<Example<'_>> {
    let mut out = Example::new();
    let mut w = Wire::new(bytes);
    while !w.done() {
        match w.tag()? {
            (1, LEN) => features(w.len_delimited()?, &mut out)
                .map_err(|e| format!("in Example.features: {e}"))?,
            (1, wire) => return Err(format!("Example.features has wire type {wire}")),
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(out)
}

fn features<'a>(bytes: &'a [u8], out: &mut Example<'a>) -> Res<()> {
    let mut w = Wire::new(bytes);
    while !w.done() {
        match w.tag()? {
            (1, LEN) => {
                let (key, value) = entry(w.len_delimited()?)?;
                out.insert(key, value);
            }
            (1, wire) => return Err(format!("a feature map entry has wire type {wire}")),
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(())
}

/// One map entry: (key, Feature).
fn entry(bytes: &[u8]) -> Res<(&str, Feature<'_>)> {
    let mut w = Wire::new(bytes);
    let (mut key, mut value) = ("", Feature::Empty);
    while !w.done() {
        match w.tag()? {
            (1, LEN) => {
                key = std::str::from_utf8(w.len_delimited()?)
                    .map_err(|_| "a feature name is not UTF-8".to_string())?;
            }
            (2, LEN) => {
                let at = w.at;
                feature(w.len_delimited()?, &mut value)
                    .map_err(|e| format!("in feature `{key}` (entry byte {at}): {e}"))?;
            }
            (f @ (1 | 2), wire) => {
                return Err(format!("map entry field {f} has wire type {wire}"));
            }
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok((key, value))
}

fn feature<'a>(bytes: &'a [u8], value: &mut Feature<'a>) -> Res<()> {
    let mut w = Wire::new(bytes);
    while !w.done() {
        match w.tag()? {
            (1, LEN) => {
                let list = w.len_delimited()?;
                match value {
                    Feature::Bytes(v) => bytes_list(list, v)?,
                    _ => {
                        let mut v = vec![];
                        bytes_list(list, &mut v)?;
                        *value = Feature::Bytes(v);
                    }
                }
            }
            (2, LEN) => {
                let list = w.len_delimited()?;
                match value {
                    Feature::Floats(v) => float_list(list, v)?,
                    _ => {
                        let mut v = vec![];
                        float_list(list, &mut v)?;
                        *value = Feature::Floats(v);
                    }
                }
            }
            (3, LEN) => {
                let list = w.len_delimited()?;
                match value {
                    Feature::Ints(v) => int64_list(list, v)?,
                    _ => {
                        let mut v = vec![];
                        int64_list(list, &mut v)?;
                        *value = Feature::Ints(v);
                    }
                }
            }
            (f @ 1..=3, wire) => return Err(format!("Feature field {f} has wire type {wire}")),
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(())
}

fn bytes_list<'a>(bytes: &'a [u8], out: &mut Vec<&'a [u8]>) -> Res<()> {
    let mut w = Wire::new(bytes);
    while !w.done() {
        match w.tag()? {
            (1, LEN) => out.push(w.len_delimited()?),
            (1, wire) => return Err(format!("BytesList.value has wire type {wire}")),
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(())
}

fn float_list(bytes: &[u8], out: &mut Vec<f32>) -> Res<()> {
    let mut w = Wire::new(bytes);
    let f32_at = |b: &[u8]| f32::from_le_bytes(b.try_into().expect("4 bytes"));
    while !w.done() {
        match w.tag()? {
            (1, LEN) => {
                let packed = w.len_delimited()?;
                if packed.len() % 4 != 0 {
                    return Err(format!(
                        "packed floats of {} bytes (not a multiple of 4)",
                        packed.len()
                    ));
                }
                out.extend(packed.chunks_exact(4).map(f32_at));
            }
            (1, FIXED32) => out.push(f32_at(w.take(4)?)),
            (1, wire) => return Err(format!("FloatList.value has wire type {wire}")),
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(())
}

fn int64_list(bytes: &[u8], out: &mut Vec<i64>) -> Res<()> {
    let mut w = Wire::new(bytes);
    while !w.done() {
        match w.tag()? {
            (1, LEN) => {
                let mut p = Wire::new(w.len_delimited()?);
                while !p.done() {
                    out.push(p.varint()? as i64);
                }
            }
            (1, VARINT) => out.push(w.varint()? as i64),
            (1, wire) => return Err(format!("Int64List.value has wire type {wire}")),
            (_, wire) => w.skip(wire)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn field(n: u64, body: &[u8]) -> Vec<u8> {
        let mut out = vec![];
        varint(n << 3 | u64::from(LEN), &mut out);
        varint(body.len() as u64, &mut out);
        out.extend(body);
        out
    }

    fn example(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut feats = vec![];
        for (k, f) in entries {
            let mut e = field(1, k.as_bytes());
            e.extend(field(2, f));
            feats.extend(field(1, &e));
        }
        field(1, &feats)
    }

    #[test]
    fn packed_and_unpacked_lists_decode() {
        let mut packed_ints = vec![];
        for v in [0i64, 1, -1, i64::MAX, i64::MIN, 300] {
            varint(v as u64, &mut packed_ints);
        }
        let ints = field(3, &field(1, &packed_ints));
        let mut unpacked_ints = vec![];
        for v in [5u64, (-2i64) as u64] {
            varint(1 << 3 | u64::from(VARINT), &mut unpacked_ints);
            varint(v, &mut unpacked_ints);
        }
        let floats: Vec<u8> = [1.5f32, -0.25]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let mut unpacked_floats = vec![1 << 3 | FIXED32];
        unpacked_floats.extend(3.0f32.to_le_bytes());
        let mut bytes = field(1, b"png1");
        bytes.extend(field(1, b""));
        let msg = example(&[
            ("steps/action", ints),
            ("u", field(3, &unpacked_ints)),
            ("steps/reward", field(2, &field(1, &floats))),
            ("f", field(2, &unpacked_floats)),
            ("steps/observation/image", field(1, &bytes)),
            ("empty", vec![]),
        ]);
        let ex = decode(&msg).unwrap();
        assert_eq!(
            ex["steps/action"],
            Feature::Ints(vec![0, 1, -1, i64::MAX, i64::MIN, 300])
        );
        assert_eq!(ex["u"], Feature::Ints(vec![5, -2]));
        assert_eq!(ex["steps/reward"], Feature::Floats(vec![1.5, -0.25]));
        assert_eq!(ex["f"], Feature::Floats(vec![3.0]));
        assert_eq!(
            ex["steps/observation/image"],
            Feature::Bytes(vec![b"png1".as_slice(), b""])
        );
        assert_eq!(ex["empty"], Feature::Empty);
        assert_eq!(ex.len(), 6);
    }

    #[test]
    fn unknown_fields_are_skipped_and_repeated_messages_merge() {
        let mut feat = field(2, &field(1, &1.0f32.to_le_bytes()));
        feat.extend(field(2, &field(1, &2.0f32.to_le_bytes())));
        // An unknown varint field and an unknown fixed64 field inside the Feature.
        feat.extend([9 << 3, 1]);
        feat.push(10 << 3 | FIXED64);
        feat.extend([0u8; 8]);
        let mut msg = example(&[("x", feat)]);
        msg.extend(example(&[("y", field(3, &field(1, &[4])))]));
        let ex = decode(&msg).unwrap();
        assert_eq!(ex["x"], Feature::Floats(vec![1.0, 2.0]));
        assert_eq!(ex["y"], Feature::Ints(vec![4]));
    }

    #[test]
    fn every_truncation_and_bad_wire_type_is_an_error() {
        let msg = example(&[
            ("steps/reward", field(2, &field(1, &[0u8; 8]))),
            ("k", field(1, &field(1, b"abc"))),
        ]);
        assert!(decode(&msg).is_ok());
        for cut in 1..msg.len() {
            // A cut may end on a field boundary only at the very end of the message.
            assert!(decode(&msg[..cut]).is_err(), "cut at {cut} decoded");
        }
        // A group (wire type 3) where Example.features should be.
        assert!(decode(&[1 << 3 | 3]).unwrap_err().contains("wire type"));
        // Packed floats not a multiple of 4.
        let bad = example(&[("r", field(2, &field(1, &[0u8; 5])))]);
        assert!(decode(&bad).unwrap_err().contains("multiple of 4"));
        // An 11-byte varint.
        assert!(decode(&[0x80; 11]).unwrap_err().contains("varint"));
        // Non-UTF-8 feature name.
        let bad = example(&[("\u{0}", vec![])]);
        let mut bad2 = bad.clone();
        let at = bad2.iter().position(|&b| b == 0).unwrap();
        bad2[at] = 0xff;
        assert!(decode(&bad).is_ok());
        assert!(decode(&bad2).unwrap_err().contains("UTF-8"));
    }
}
