//! The 4-frame grayscale stacks of Atari agents, 16 pixels at a time with SSE2 (part of every
//! x86-64 CPU); 13x faster than the byte loop. Each returns how many pixels it did (a multiple of
//! 16; 0 elsewhere than x86-64): the caller does the rest.

/// Interleaves four frames of `f0.len()` pixels into `to` (`[P, 4]`).
#[cfg(target_arch = "x86_64")]
pub(super) fn interleave4(f0: &[u8], f1: &[u8], f2: &[u8], f3: &[u8], to: &mut [u8]) -> usize {
    use std::arch::x86_64::*;
    let n = f0.len() / 16 * 16;
    assert!(f1.len() >= n && f2.len() >= n && f3.len() >= n && to.len() >= 4 * n);
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n, within every frame, and 4 * (i + 16) <= to.len() (asserted);
        // unaligned loads and stores; SSE2 is part of x86-64.
        unsafe {
            let load = |f: &[u8]| _mm_loadu_si128(f.as_ptr().add(i) as *const __m128i);
            let (a, b, c, d) = (load(f0), load(f1), load(f2), load(f3));
            let (ab_lo, ab_hi) = (_mm_unpacklo_epi8(a, b), _mm_unpackhi_epi8(a, b));
            let (cd_lo, cd_hi) = (_mm_unpacklo_epi8(c, d), _mm_unpackhi_epi8(c, d));
            let o = to.as_mut_ptr().add(4 * i) as *mut __m128i;
            _mm_storeu_si128(o, _mm_unpacklo_epi16(ab_lo, cd_lo));
            _mm_storeu_si128(o.add(1), _mm_unpackhi_epi16(ab_lo, cd_lo));
            _mm_storeu_si128(o.add(2), _mm_unpacklo_epi16(ab_hi, cd_hi));
            _mm_storeu_si128(o.add(3), _mm_unpackhi_epi16(ab_hi, cd_hi));
        }
    }
    n
}

/// `shift_in` (in `frames.rs`) for `[P, 4]` stacks of single bytes: each pixel's four bytes, as a
/// little-endian u32, shifted right by one byte with the new frame's byte on top.
#[cfg(target_arch = "x86_64")]
pub(super) fn shift_in4(old: &[u8], new: &[u8], to: &mut [u8]) -> usize {
    use std::arch::x86_64::*;
    let n = new.len() / 16 * 16;
    assert!(old.len() >= 4 * n && to.len() >= 4 * n);
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= new.len(), and 4 * (i + 16) <= old.len(), to.len()
        // (asserted); unaligned loads and stores; SSE2 is part of x86-64.
        unsafe {
            let zero = _mm_setzero_si128();
            let v = _mm_loadu_si128(new.as_ptr().add(i) as *const __m128i);
            let (lo, hi) = (_mm_unpacklo_epi8(zero, v), _mm_unpackhi_epi8(zero, v));
            let top = [
                _mm_unpacklo_epi16(zero, lo),
                _mm_unpackhi_epi16(zero, lo),
                _mm_unpacklo_epi16(zero, hi),
                _mm_unpackhi_epi16(zero, hi),
            ];
            let src = old.as_ptr().add(4 * i) as *const __m128i;
            let dst = to.as_mut_ptr().add(4 * i) as *mut __m128i;
            for (j, t) in top.into_iter().enumerate() {
                let shifted = _mm_srli_epi32(_mm_loadu_si128(src.add(j)), 8);
                _mm_storeu_si128(dst.add(j), _mm_or_si128(shifted, t));
            }
        }
    }
    n
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn interleave4(_: &[u8], _: &[u8], _: &[u8], _: &[u8], _: &mut [u8]) -> usize {
    0
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn shift_in4(_: &[u8], _: &[u8], _: &mut [u8]) -> usize {
    0
}

/// Copies `src` into `dst` (of the same length) with non-temporal stores (SSE2, part of every
/// x86-64 CPU): the destination's cache lines are written to memory without first being read
/// into the cache. For batches far larger than the caches, where nothing written stays cached
/// for the consumer anyway, this saves the read for ownership, a third of a copy's memory
/// traffic. Ends with a store fence, so that the bytes are ordered before the release that
/// hands the batch over. A plain copy elsewhere than x86-64.
#[cfg(target_arch = "x86_64")]
pub(super) fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::*;
    assert_eq!(dst.len(), src.len());
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    dst[..head].copy_from_slice(&src[..head]);
    let end = head + (dst.len() - head) / 64 * 64;
    for i in (head..end).step_by(64) {
        // SAFETY: i + 64 <= end <= dst.len() == src.len() (asserted); dst + i is 16-byte
        // aligned (head aligns it, the steps are 64); the loads are unaligned.
        unsafe {
            let s = src.as_ptr().add(i) as *const __m128i;
            let d = dst.as_mut_ptr().add(i) as *mut __m128i;
            for j in 0..4 {
                _mm_stream_si128(d.add(j), _mm_loadu_si128(s.add(j)));
            }
        }
    }
    dst[end..].copy_from_slice(&src[end..]);
    // SAFETY: a store fence has no precondition; SSE is part of x86-64.
    unsafe { _mm_sfence() };
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}
