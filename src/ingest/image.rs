//! Encoded images, as RLDS/TFDS `Image` features and Hugging Face `Image` columns in Parquet
//! (LeRobot's `image` features) hold them: PNG (the `png` crate, exactly as TensorFlow decodes
//! them) or JPEG (`jpeg-decoder`: libjpeg's accurate integer IDCT and fancy chroma upsampling,
//! within 3 levels of libjpeg-turbo's pixels; TensorFlow's default fast IDCT, which `tfds`
//! decodes with, differs from both by more),
//! told apart by their first bytes as TensorFlow's `decode_image` does, decoded to `uint8`
//! `[H, W, C]` with the channel count `features.json` declares. A grayscale image is widened to
//! RGB(A) as TensorFlow's decoders do when asked for 3 or 4 channels; any other disagreement of
//! channels, a 16-bit image, or undecodable bytes is an error (a string, the caller names the
//! place). The decoders run under [`crate::guard::quietly`]: a panic inside one is an error too.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, UInt8Array};
use arrow::datatypes::{DataType, Field};
use rayon::prelude::*;

use crate::error::{Error, Result};

/// The largest image side read (a `features.json` that declares more is refused; an unknown
/// side is learnt from the first image, at most this).
pub(crate) const MAX_SIDE: usize = 1 << 14;

/// Decodes one image into `out` (resized to `H * W * channels`); returns `(H, W)`. `max_side`
/// bounds each side before any pixel is allocated (a damaged header cannot ask for gigabytes).
pub(crate) fn decode(
    bytes: &[u8],
    channels: usize,
    max_side: usize,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), String> {
    let run = || match bytes {
        [0x89, b'P', b'N', b'G', ..] => png(bytes, channels, max_side, out),
        [0xff, 0xd8, ..] => jpeg(bytes, channels, max_side, out),
        [] => Err("an empty image (no bytes)".into()),
        _ => Err(format!(
            "neither PNG nor JPEG (first bytes {:02x?})",
            &bytes[..bytes.len().min(4)]
        )),
    };
    crate::guard::quietly(run).unwrap_or_else(|_| Err("the image decoder panicked".into()))
}

/// The height, width and channel count of an encoded image, from its header alone.
pub(crate) fn probe(bytes: &[u8], max_side: usize) -> Result<(usize, usize, usize), String> {
    let run = || match bytes {
        [0x89, b'P', b'N', b'G', ..] => png_header(bytes, max_side).map(|(_, h, w, c)| (h, w, c)),
        [0xff, 0xd8, ..] => jpeg_header(bytes, max_side).map(|(_, h, w, c)| (h, w, c)),
        [] => Err("an empty image (no bytes)".into()),
        _ => Err(format!(
            "neither PNG nor JPEG (first bytes {:02x?})",
            &bytes[..bytes.len().min(4)]
        )),
    };
    crate::guard::quietly(run).unwrap_or_else(|_| Err("the image decoder panicked".into()))
}

/// Whether a column of type `dt` may hold encoded images: binary, or a struct with a binary
/// `bytes` field (Hugging Face `datasets`' `Image` feature, `{bytes, path}`, as LeRobot's
/// `image` features are stored in Parquet).
pub(crate) fn is_encoded_type(dt: &DataType) -> bool {
    match dt {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => true,
        DataType::Struct(fields) => fields.iter().any(|f| {
            f.name() == "bytes" && is_encoded_type(f.data_type()) && !f.data_type().is_nested()
        }),
        _ => false,
    }
}

/// The encoded bytes of row `i` of a column of [`is_encoded_type`] (`None`: null).
pub(crate) fn bytes_at(a: &dyn Array, i: usize) -> Option<&[u8]> {
    if a.is_null(i) {
        return None;
    }
    match a.data_type() {
        DataType::Binary => Some(a.as_binary::<i32>().value(i)),
        DataType::LargeBinary => Some(a.as_binary::<i64>().value(i)),
        DataType::BinaryView => Some(a.as_binary_view().value(i)),
        DataType::Struct(_) => bytes_at(a.as_struct().column_by_name("bytes")?.as_ref(), i),
        _ => None,
    }
}

/// The stored shape of images of `(h, w, c)`: `[H, W]` for one channel, else `[H, W, C]`.
pub(crate) fn shape_of(h: usize, w: usize, c: usize) -> Vec<usize> {
    if c == 1 { vec![h, w] } else { vec![h, w, c] }
}

/// Decodes every row of `a` (a column of [`is_encoded_type`] named `name`, whose first row is
/// input row `base`) into a `FixedSizeList<uint8>` of `shape` per row, in parallel. A null, an
/// undecodable image or one of another size is an [`Error::InvalidData`] naming the column and
/// the row.
pub(crate) fn decode_column(
    a: &ArrayRef,
    shape: &[usize],
    name: &str,
    base: u64,
) -> Result<ArrayRef> {
    let len: usize = shape.iter().product();
    let channels = shape.get(2).copied().unwrap_or(1);
    let mut values = vec![0u8; len * a.len()];
    values
        .par_chunks_mut(len.max(1))
        .enumerate()
        .try_for_each_init(Vec::new, |tmp, (i, out)| {
            let at = |why: String| {
                Error::invalid_data(format!("row {}: {why}", base + i as u64)).in_column(name)
            };
            let bytes = bytes_at(a.as_ref(), i).ok_or_else(|| at("a null image".into()))?;
            let (h, w) = decode(bytes, channels, MAX_SIDE, tmp).map_err(at)?;
            if (h, w) != (shape[0], shape[1]) || tmp.len() != len {
                return Err(at(format!(
                    "an image of {h}x{w}; the column's first is {}x{}",
                    shape[0], shape[1]
                )));
            }
            out.copy_from_slice(tmp);
            Ok(())
        })?;
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    Ok(Arc::new(FixedSizeListArray::try_new(
        item,
        len as i32,
        Arc::new(UInt8Array::from(values)),
        None,
    )?))
}

fn check_side(h: usize, w: usize, max_side: usize) -> Result<(), String> {
    if h == 0 || w == 0 || h > max_side || w > max_side {
        return Err(format!(
            "an image of {h}x{w} pixels (at most {max_side} per side)"
        ));
    }
    Ok(())
}

/// Widens `c`-channel pixels of `src` to `channels` (gray → gray+alpha, RGB, RGBA; an added
/// alpha is opaque), or fails.
fn convert(src: &[u8], c: usize, channels: usize, out: &mut Vec<u8>) -> Result<(), String> {
    if c == channels {
        out.clear();
        out.extend_from_slice(src);
        return Ok(());
    }
    out.clear();
    out.reserve(src.len() / c * channels);
    match (c, channels) {
        (1, 2) => src.iter().for_each(|&g| out.extend([g, 255])),
        (1, 3) => src.iter().for_each(|&g| out.extend([g, g, g])),
        (1, 4) => src.iter().for_each(|&g| out.extend([g, g, g, 255])),
        (2, 4) => src
            .chunks_exact(2)
            .for_each(|p| out.extend([p[0], p[0], p[0], p[1]])),
        (3, 4) => src
            .chunks_exact(3)
            .for_each(|p| out.extend([p[0], p[1], p[2], 255])),
        _ => {
            return Err(format!(
                "the image has {c} channels, features.json declares {channels}"
            ));
        }
    }
    Ok(())
}

/// A PNG's reader past its header, and its height, width and (8-bit) channel count.
type PngReader<'a> = png::Reader<std::io::Cursor<&'a [u8]>>;

fn png_header(
    bytes: &[u8],
    max_side: usize,
) -> Result<(PngReader<'_>, usize, usize, usize), String> {
    let mut dec = png::Decoder::new(std::io::Cursor::new(bytes));
    dec.set_transformations(png::Transformations::EXPAND);
    let reader = dec.read_info().map_err(|e| format!("PNG: {e}"))?;
    let (w, h) = {
        let info = reader.info();
        (info.width as usize, info.height as usize)
    };
    check_side(h, w, max_side)?;
    let (color, depth) = reader.output_color_type();
    if depth != png::BitDepth::Eight {
        return Err(format!(
            "a {}-bit PNG; only 8-bit images are read",
            depth as u8
        ));
    }
    Ok((reader, h, w, color.samples()))
}

fn png(
    bytes: &[u8],
    channels: usize,
    max_side: usize,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), String> {
    let (mut reader, h, w, c) = png_header(bytes, max_side)?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| "PNG: the image is too large".to_string())?;
    let mut raw = vec![0u8; size];
    let frame = reader
        .next_frame(&mut raw)
        .map_err(|e| format!("PNG: {e}"))?;
    raw.truncate(frame.buffer_size());
    if raw.len() != h * w * c {
        return Err(format!("PNG: {} bytes decoded for {h}x{w}x{c}", raw.len()));
    }
    convert(&raw, c, channels, out)?;
    Ok((h, w))
}

/// A JPEG's decoder past its header, and its height, width and channel count (gray or RGB).
type JpegHeader<'a> = (jpeg_decoder::Decoder<&'a [u8]>, usize, usize, usize);

fn jpeg_header(bytes: &[u8], max_side: usize) -> Result<JpegHeader<'_>, String> {
    let mut dec = jpeg_decoder::Decoder::new(bytes);
    dec.read_info().map_err(|e| format!("JPEG: {e}"))?;
    let info = dec
        .info()
        .ok_or_else(|| "JPEG: no image header".to_string())?;
    let (h, w) = (info.height as usize, info.width as usize);
    check_side(h, w, max_side)?;
    let c = match info.pixel_format {
        jpeg_decoder::PixelFormat::L8 => 1,
        jpeg_decoder::PixelFormat::RGB24 => 3,
        other => {
            return Err(format!(
                "JPEG: {other:?} pixels; only 8-bit gray and RGB are read"
            ));
        }
    };
    Ok((dec, h, w, c))
}

fn jpeg(
    bytes: &[u8],
    channels: usize,
    max_side: usize,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), String> {
    let (mut dec, h, w, c) = jpeg_header(bytes, max_side)?;
    // What libjpeg returns when TensorFlow asks a colour JPEG for one channel: its luma (Y),
    // with no colour transform.
    let luma = c == 3 && channels == 1;
    if luma {
        dec.set_color_transform(jpeg_decoder::ColorTransform::None);
    }
    let pixels = dec.decode().map_err(|e| format!("JPEG: {e}"))?;
    if pixels.len() != h * w * c {
        return Err(format!(
            "JPEG: {} bytes decoded for {h}x{w}x{c}",
            pixels.len()
        ));
    }
    if luma {
        out.clear();
        out.extend(pixels.chunks_exact(3).map(|p| p[0]));
    } else {
        convert(&pixels, c, channels, out)?;
    }
    Ok((h, w))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode_png(w: u32, h: u32, color: png::ColorType, data: &[u8]) -> Vec<u8> {
        let mut out = vec![];
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(color);
        e.set_depth(png::BitDepth::Eight);
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(data).unwrap();
        wr.finish().unwrap();
        out
    }

    #[test]
    fn png_round_trips_and_gray_widens() {
        let rgb: Vec<u8> = (0..4 * 3 * 3).map(|i| (i * 7) as u8).collect();
        let bytes = encode_png(4, 3, png::ColorType::Rgb, &rgb);
        let mut out = vec![];
        assert_eq!(decode(&bytes, 3, 64, &mut out).unwrap(), (3, 4));
        assert_eq!(out, rgb);
        let gray: Vec<u8> = (0..6).collect();
        let bytes = encode_png(3, 2, png::ColorType::Grayscale, &gray);
        assert_eq!(decode(&bytes, 1, 64, &mut out).unwrap(), (2, 3));
        assert_eq!(out, gray);
        decode(&bytes, 3, 64, &mut out).unwrap();
        assert_eq!(&out[..6], &[0, 0, 0, 1, 1, 1]);
        // RGB cannot become one channel without a colour model: refused.
        let rgb_bytes = encode_png(4, 3, png::ColorType::Rgb, &rgb);
        assert!(
            decode(&rgb_bytes, 1, 64, &mut out)
                .unwrap_err()
                .contains("channels")
        );
        // Larger than allowed.
        assert!(
            decode(&rgb_bytes, 3, 2, &mut out)
                .unwrap_err()
                .contains("at most")
        );
    }

    #[test]
    fn damaged_images_are_errors() {
        let rgb: Vec<u8> = (0..16 * 16 * 3).map(|i| (i % 251) as u8).collect();
        let bytes = encode_png(16, 16, png::ColorType::Rgb, &rgb);
        let mut out = vec![];
        for cut in [4, 20, 40, bytes.len() - 5] {
            assert!(decode(&bytes[..cut], 3, 64, &mut out).is_err(), "cut {cut}");
        }
        for at in 8..bytes.len() {
            let mut b = bytes.clone();
            b[at] ^= 0x21;
            // PNG chunks carry CRCs: a flipped byte fails (or, in an ancillary place, decodes);
            // never a panic.
            let _ = decode(&b, 3, 64, &mut out);
        }
        assert!(
            decode(b"GIF89a", 3, 64, &mut out)
                .unwrap_err()
                .contains("neither")
        );
        assert!(decode(b"", 3, 64, &mut out).is_err());
        let jpeg_head = [0xff, 0xd8, 0xff, 0xe0, 0, 16, b'J', b'F', b'I', b'F'];
        assert!(
            decode(&jpeg_head, 3, 64, &mut out)
                .unwrap_err()
                .contains("JPEG")
        );
    }
}
