//! The encoded images of TFDS `Image` features: PNG (the `png` crate, exactly as TensorFlow decodes
//! them) or JPEG (`jpeg-decoder`: libjpeg's accurate integer IDCT and fancy chroma upsampling,
//! within 3 levels of libjpeg-turbo's pixels; TensorFlow's default fast IDCT, which `tfds`
//! decodes with, differs from both by more),
//! told apart by their first bytes as TensorFlow's `decode_image` does, decoded to `uint8`
//! `[H, W, C]` with the channel count `features.json` declares. A grayscale image is widened to
//! RGB(A) as TensorFlow's decoders do when asked for 3 or 4 channels; any other disagreement of
//! channels, a 16-bit image, or undecodable bytes is an error (a string, the caller names the
//! place). The decoders run under [`crate::guard::quietly`]: a panic inside one is an error too.

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

fn png(
    bytes: &[u8],
    channels: usize,
    max_side: usize,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), String> {
    let bad = |e: png::DecodingError| format!("PNG: {e}");
    let mut dec = png::Decoder::new(std::io::Cursor::new(bytes));
    dec.set_transformations(png::Transformations::EXPAND);
    let mut reader = dec.read_info().map_err(bad)?;
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
    let c = color.samples();
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| "PNG: the image is too large".to_string())?;
    let mut raw = vec![0u8; size];
    let frame = reader.next_frame(&mut raw).map_err(bad)?;
    raw.truncate(frame.buffer_size());
    if raw.len() != h * w * c {
        return Err(format!("PNG: {} bytes decoded for {h}x{w}x{c}", raw.len()));
    }
    convert(&raw, c, channels, out)?;
    Ok((h, w))
}

fn jpeg(
    bytes: &[u8],
    channels: usize,
    max_side: usize,
    out: &mut Vec<u8>,
) -> Result<(usize, usize), String> {
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
