//! Growable, reused buffers for the GPU compactor: pinned host memory and device memory.
//!
//! Owns allocation and growth only (grow by at least 1.5×, in whole MiB, never
//! shrink); the copy schedule lives in `gpu.rs`. Every buffer is used on the
//! compactor's single stream, and `gpu.rs` synchronises that stream before a buffer is
//! reused or replaced.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, PinnedHostSlice};

/// Round a requested capacity up so that a slowly growing batch size does not
/// reallocate (and re-pin) on every call.
fn grown_capacity(current: usize, needed: usize) -> usize {
    const MIB: usize = 1 << 20;
    let target = needed.max(current + current / 2);
    target.div_ceil(MIB).saturating_mul(MIB).max(needed)
}

/// Page-locked host memory (`cuMemHostAlloc`, default flags: cached, so the CPU can
/// read the result buffer at full speed), reused across calls.
#[derive(Default)]
pub(crate) struct PinnedBuf {
    buf: Option<PinnedHostSlice<u8>>,
}

impl PinnedBuf {
    /// At least `len` bytes of pinned memory. Contents are unspecified after a grow.
    pub(crate) fn ensure(
        &mut self,
        ctx: &Arc<CudaContext>,
        len: usize,
    ) -> Result<&mut [u8], DriverError> {
        let buf = match self.buf.take() {
            Some(buf) if buf.len() >= len => buf,
            old => {
                let current = old.as_ref().map_or(0, |b| b.len());
                // Free the old buffer before pinning the new one: pinned memory is scarce.
                drop(old);
                let cap = grown_capacity(current, len.max(1));
                // SAFETY: `alloc_pinned_with_flags` hands back uninitialised memory; it
                // is zero-filled below before any `&[u8]` to it exists.
                let mut fresh = unsafe { ctx.alloc_pinned_with_flags::<u8>(cap, 0) }?;
                let ptr = fresh.as_mut_ptr()?;
                // SAFETY: `ptr` points to `cap` writable bytes owned by `fresh`, which is
                // alive for this call; nothing else references them yet.
                unsafe { std::ptr::write_bytes(ptr, 0, cap) };
                fresh
            }
        };
        Ok(&mut self.buf.insert(buf).as_mut_slice()?[..len])
    }
}

/// Device memory (`CudaSlice<u8>`), reused across calls.
#[derive(Default)]
pub(crate) struct DeviceBuf {
    buf: Option<CudaSlice<u8>>,
}

impl DeviceBuf {
    /// At least `len` bytes (at least 16, so a base pointer always exists) of device
    /// memory. Contents are unspecified.
    pub(crate) fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        len: usize,
    ) -> Result<&mut CudaSlice<u8>, DriverError> {
        let len = len.max(16);
        let buf = match self.buf.take() {
            Some(buf) if buf.len() >= len => buf,
            old => {
                let current = old.as_ref().map_or(0, |b| b.len());
                drop(old);
                let cap = grown_capacity(current, len);
                // SAFETY: uninitialised device memory is only read after our copies or
                // kernels wrote it, except the gather's padded over-read, whose bytes
                // are shifted out and never stored.
                unsafe { stream.alloc::<u8>(cap) }?
            }
        };
        Ok(self.buf.insert(buf))
    }
}
