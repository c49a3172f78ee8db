//! `yuv420p` → RGB, bit-exact with what FFmpeg's swscale gives on x86-64 for the same
//! conversion (PyAV's `frame.to_ndarray(format="rgb24")`, LeRobot's decoders): the 16-bit fixed
//! point of its SIMD `yuv2rgb` (coefficients rounded to Q13, `pmulhw` products, chroma of each
//! 2x2 block used for its four pixels, no interpolation), with swscale's coefficient table
//! chosen by the stream's matrix coefficients and range (an unspecified matrix is BT.601, an
//! unspecified range is limited). Checked against PyAV 18 (libswscale 9.5) on random planes of
//! several sizes and every matrix and range below: no difference.

use crate::error::{Error, Result};

/// The colour description of decoded frames: ISO/IEC 23091-4 matrix coefficients (as AV1,
/// H.264 and FFmpeg number them) and range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColourSpace {
    /// Matrix coefficients (1 BT.709, 2 unspecified, 4 FCC, 5/6 BT.601, 7 SMPTE 240M,
    /// 9/10 BT.2020).
    pub matrix: u8,
    /// Full (JPEG) range rather than limited (MPEG) range.
    pub full_range: bool,
}

impl Default for ColourSpace {
    /// What a stream that says nothing is: matrix unspecified (BT.601), limited range.
    fn default() -> Self {
        ColourSpace {
            matrix: 2,
            full_range: false,
        }
    }
}

/// swscale's `ff_yuv2rgb_coeffs` (crv, cbu, cgu, cgv; 16.16) for a matrix.
fn coefficients(matrix: u8) -> Result<[i64; 4]> {
    Ok(match matrix {
        1 => [117489, 138438, 13975, 34925],
        2..=6 if matrix != 4 => [104597, 132201, 25675, 53279],
        4 => [104448, 132798, 24759, 53109],
        7 => [117579, 136230, 16907, 35559],
        9 | 10 => [110013, 140363, 12277, 42626],
        // swscale falls back to BT.601 for the values it has no entry for.
        11..=255 => [104597, 132201, 25675, 53279],
        m => {
            return Err(Error::invalid_data(format!(
                "colour matrix {m} ({}) is not a YUV matrix trajstore converts to RGB",
                if m == 0 { "identity/GBR" } else { "YCgCo" }
            )));
        }
    })
}

/// swscale's `roundToInt16`.
fn round16(x: i64) -> i32 {
    ((x + (1 << 15)) >> 16).clamp(-0x8000, 0x7fff) as i32
}

/// The fixed-point coefficients of one colour space.
#[derive(Debug, Clone, Copy)]
pub struct YuvToRgb {
    y_coeff: i32,
    y_offset: i32,
    v2r: i32,
    u2g: i32,
    v2g: i32,
    u2b: i32,
}

impl YuvToRgb {
    /// The conversion of `colour`.
    pub fn new(colour: ColourSpace) -> Result<Self> {
        let [crv, cbu, cgu, cgv] = coefficients(colour.matrix)?;
        let (mut crv, mut cbu, mut cgu, mut cgv) = (crv, cbu, -cgu, -cgv);
        let (cy, oy) = if colour.full_range {
            // C's integer division truncates towards zero.
            crv = crv * 224 / 255;
            cbu = cbu * 224 / 255;
            cgu = cgu * 224 / 255;
            cgv = cgv * 224 / 255;
            (1i64 << 16, 0i64)
        } else {
            ((1i64 << 16) * 255 / 219, 16i64 << 16)
        };
        Ok(YuvToRgb {
            y_coeff: round16(cy * (1 << 13)),
            y_offset: round16(oy * (1 << 3)),
            v2r: round16(crv * (1 << 13)),
            u2g: round16(cgu * (1 << 13)),
            v2g: round16(cgv * (1 << 13)),
            u2b: round16(cbu * (1 << 13)),
        })
    }

    /// Converts one `yuv420p` picture (planes with their strides; chroma of `ceil(w/2)` by
    /// `ceil(h/2)`) into `out`, `h * w * 3` bytes of RGB, row-major.
    ///
    /// # Panics
    /// When a plane is shorter than its stride and the picture's size say (callers check).
    pub fn convert(
        &self,
        (w, h): (usize, usize),
        y: (&[u8], usize),
        u: (&[u8], usize),
        v: (&[u8], usize),
        out: &mut [u8],
    ) {
        let ((yp, ys), (up, us), (vp, vs)) = (y, u, v);
        for row in 0..h {
            let yr = &yp[row * ys..row * ys + w];
            let ur = &up[(row / 2) * us..];
            let vr = &vp[(row / 2) * vs..];
            let o = &mut out[row * w * 3..(row + 1) * w * 3];
            for col in 0..w {
                let luma = ((((yr[col] as i32) << 3) - self.y_offset) * self.y_coeff) >> 16;
                let cu = ((ur[col / 2] as i32) << 3) - 1024;
                let cv = ((vr[col / 2] as i32) << 3) - 1024;
                let r = luma + ((cv * self.v2r) >> 16);
                let g = luma + ((cu * self.u2g) >> 16) + ((cv * self.v2g) >> 16);
                let b = luma + ((cu * self.u2b) >> 16);
                o[col * 3] = r.clamp(0, 255) as u8;
                o[col * 3 + 1] = g.clamp(0, 255) as u8;
                o[col * 3 + 2] = b.clamp(0, 255) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grey_maps_like_swscale() {
        // PyAV 18: limited-range BT.601, neutral chroma: Y 16 -> 0, 22 -> 6, 23 -> 8,
        // 234 -> 253, 235 -> 255.
        let c = YuvToRgb::new(ColourSpace::default()).unwrap();
        let mut out = [0u8; 3];
        for (y, want) in [
            (16u8, 0u8),
            (22, 6),
            (23, 8),
            (234, 253),
            (235, 255),
            (0, 0),
        ] {
            c.convert((1, 1), (&[y], 1), (&[128], 1), (&[128], 1), &mut out);
            assert_eq!(out, [want; 3], "Y {y}");
        }
    }

    #[test]
    fn identity_and_ycgco_are_refused() {
        for m in [0u8, 8] {
            let e = YuvToRgb::new(ColourSpace {
                matrix: m,
                full_range: false,
            })
            .unwrap_err();
            assert!(e.to_string().contains("colour matrix"), "{e}");
        }
    }
}
