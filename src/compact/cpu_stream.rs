//! Non-temporal ("streaming") copies for gathers larger than the caches.
//!
//! Owns one primitive: copy a chunk with 16-byte `movntdq` stores, which write whole
//! cache lines straight to memory instead of first reading each destination line
//! (write-allocate). For outputs that do not fit in cache that saves a third of the
//! memory traffic. x86-64 only (SSE2 is part of its baseline); elsewhere, and for
//! small chunks, it is a plain copy.

use std::mem::MaybeUninit;

/// Chunks shorter than this are copied normally: streaming a few partial lines gains
/// nothing and forces early write-combining flushes.
const STREAM_MIN_CHUNK: usize = 4096;

/// Copies `src` into `dst` (equal lengths), streaming the 16-byte-aligned middle.
/// Call [`fence`] before another thread reads what was written.
pub(crate) fn copy_streaming(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= STREAM_MIN_CHUNK && dst.len() == src.len() {
        x86::copy(dst, src);
        return;
    }
    dst.write_copy_of_slice(src);
}

/// Orders earlier streaming stores before any later store (a no-op off x86-64).
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 (and so `sfence`) is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    use std::mem::MaybeUninit;

    const STEP: usize = 64;

    pub(super) fn copy(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
        let len = src.len();
        let head = (dst.as_ptr().align_offset(16)).min(len);
        let body = (len - head) / STEP * STEP;
        let (d_head, rest) = dst.split_at_mut(head);
        let (d_body, d_tail) = rest.split_at_mut(body);
        d_head.write_copy_of_slice(&src[..head]);
        let s_body = &src[head..head + body];
        let (d, s) = (
            d_body.as_mut_ptr().cast::<__m128i>(),
            s_body.as_ptr().cast::<__m128i>(),
        );
        for k in 0..body / 16 / 4 {
            // SAFETY: SSE2 is baseline on x86-64. `d_body` and `s_body` are `body` bytes
            // long, a multiple of 64, so vectors 4k..4k+4 are in bounds. Loads are
            // unaligned (`loadu`); `d` is 16-byte aligned because `head` was chosen with
            // `align_offset(16)` and `d_body` starts right after it, as `movntdq` needs.
            unsafe {
                let i = 4 * k;
                let (a, b) = (_mm_loadu_si128(s.add(i)), _mm_loadu_si128(s.add(i + 1)));
                let (c, e) = (_mm_loadu_si128(s.add(i + 2)), _mm_loadu_si128(s.add(i + 3)));
                _mm_stream_si128(d.add(i), a);
                _mm_stream_si128(d.add(i + 1), b);
                _mm_stream_si128(d.add(i + 2), c);
                _mm_stream_si128(d.add(i + 3), e);
            }
        }
        d_tail.write_copy_of_slice(&src[head + body..]);
    }
}
