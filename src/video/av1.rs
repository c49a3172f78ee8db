//! AV1 through libdav1d (`dav1d-sys`, the system library found by pkg-config; Debian's
//! `libdav1d-dev`). dav1d is a conformant decoder: its output is the one AV1 defines, the same
//! planes FFmpeg's `libdav1d` wrapper (PyAV's default AV1 decoder) gives.

use std::ptr::{NonNull, null_mut};

use dav1d_sys::*;

use super::Picture;
use super::yuv::ColourSpace;
use crate::error::{Error, Result};

/// A dav1d decoder context.
pub(super) struct Av1Decoder {
    ctx: NonNull<Dav1dContext>,
}

fn failed(what: &str, code: i32) -> Error {
    Error::invalid_data(format!("AV1 {what} failed (dav1d error {code})"))
}

impl Av1Decoder {
    pub(super) fn new() -> Result<Self> {
        // SAFETY: `dav1d_default_settings` fills the whole struct it is given; a zeroed
        // `Dav1dSettings` (plain integers and nullable function pointers) is a valid place to
        // fill.
        let mut settings: Dav1dSettings = unsafe { std::mem::zeroed() };
        // SAFETY: `settings` is a valid, writable `Dav1dSettings`.
        unsafe { dav1d_default_settings(&mut settings) };
        // One frame in flight: pictures come back in the order samples go in.
        settings.max_frame_delay = 1;
        let mut ctx = null_mut();
        // SAFETY: `ctx` is a valid out-pointer and `settings` was initialised by dav1d.
        let r = unsafe { dav1d_open(&mut ctx, &settings) };
        match NonNull::new(ctx) {
            Some(ctx) if r == 0 => Ok(Av1Decoder { ctx }),
            _ => Err(failed("decoder setup", r)),
        }
    }

    /// Decodes one sample (a temporal unit); pictures that come out are pushed to `out` with
    /// the tag of the sample they were decoded from.
    pub(super) fn decode(&mut self, sample: &[u8], tag: i64, out: &mut Vec<Picture>) -> Result<()> {
        // SAFETY: a zeroed `Dav1dData` is the empty value dav1d documents; `dav1d_data_create`
        // allocates `sample.len()` bytes it owns and returns them (or null on failure).
        let mut data: Dav1dData = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let buf = unsafe { dav1d_data_create(&mut data, sample.len()) };
        if buf.is_null() {
            return Err(failed("allocation", 0));
        }
        // SAFETY: `buf` points to `sample.len()` writable bytes owned by `data`.
        unsafe { std::ptr::copy_nonoverlapping(sample.as_ptr(), buf, sample.len()) };
        data.m.timestamp = tag;
        let result = loop {
            // SAFETY: the context is open and `data` holds a reference dav1d created.
            let r = unsafe { dav1d_send_data(self.ctx.as_ptr(), &mut data) };
            if r < 0 && r != DAV1D_ERR_AGAIN {
                break Err(failed("decoding", r));
            }
            match self.picture() {
                Ok(Some(p)) => out.push(p),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
            if data.sz == 0 {
                break Ok(());
            }
        };
        if data.sz > 0 {
            // SAFETY: `data` still holds dav1d's reference (an error left it unconsumed).
            unsafe { dav1d_data_unref(&mut data) };
        }
        result
    }

    /// Drains the pictures still in the decoder.
    pub(super) fn flush(&mut self, out: &mut Vec<Picture>) -> Result<()> {
        while let Some(p) = self.picture()? {
            out.push(p);
        }
        Ok(())
    }

    /// The next picture, copied out, or `None` when dav1d needs more data.
    fn picture(&mut self) -> Result<Option<Picture>> {
        // SAFETY: a zeroed `Dav1dPicture` is the empty picture dav1d expects to fill.
        let mut pic: Dav1dPicture = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `pic` is a valid out-parameter.
        let r = unsafe { dav1d_get_picture(self.ctx.as_ptr(), &mut pic) };
        if r == DAV1D_ERR_AGAIN {
            return Ok(None);
        }
        if r < 0 {
            return Err(failed("decoding", r));
        }
        let copied = copy_picture(&pic);
        // SAFETY: `pic` holds the references `dav1d_get_picture` gave us; released once.
        unsafe { dav1d_picture_unref(&mut pic) };
        copied.map(Some)
    }
}

/// Copies the planes of an 8-bit 4:2:0 picture.
fn copy_picture(pic: &Dav1dPicture) -> Result<Picture> {
    let (w, h) = (pic.p.w as usize, pic.p.h as usize);
    if pic.p.layout != DAV1D_PIXEL_LAYOUT_I420 || pic.p.bpc != 8 {
        return Err(Error::invalid_data(format!(
            "AV1 pictures of layout {} and {} bits per component (trajstore reads 8-bit 4:2:0, \
             LeRobot's yuv420p)",
            pic.p.layout, pic.p.bpc
        )));
    }
    if pic.seq_hdr.is_null() || pic.data.iter().any(|p| p.is_null()) {
        return Err(Error::invalid_data(
            "dav1d returned a picture without planes",
        ));
    }
    // SAFETY: a picture from `dav1d_get_picture` has a valid sequence header until unref'd.
    let seq = unsafe { &*pic.seq_hdr };
    let colour = ColourSpace {
        matrix: seq.mtrx as u8,
        full_range: seq.color_range != 0,
    };
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    let plane = |i: usize, pw: usize, ph: usize, stride: isize| -> Vec<u8> {
        let mut v = Vec::with_capacity(pw * ph);
        for row in 0..ph {
            // SAFETY: dav1d's plane `i` holds `ph` rows of at least `pw` bytes, `stride`
            // bytes apart (8-bit samples), valid until the picture is unref'd.
            let src = unsafe {
                std::slice::from_raw_parts(
                    (pic.data[i] as *const u8).offset(row as isize * stride),
                    pw,
                )
            };
            v.extend_from_slice(src);
        }
        v
    };
    Ok(Picture {
        width: w,
        height: h,
        y: plane(0, w, h, pic.stride[0]),
        u: plane(1, cw, ch, pic.stride[1]),
        v: plane(2, cw, ch, pic.stride[1]),
        colour,
        tag: pic.m.timestamp,
    })
}

impl Drop for Av1Decoder {
    fn drop(&mut self) {
        let mut ctx = self.ctx.as_ptr();
        // SAFETY: the context was opened by `dav1d_open` and is closed once.
        unsafe { dav1d_close(&mut ctx) };
    }
}
