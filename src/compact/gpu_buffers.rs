//! Growable, reused buffers for the GPU compactor: pinned host memory, pinned host
//! memory mapped into the device's address space ([`HostBuffer`]), and device memory.
//!
//! Owns allocation and growth only (grow by at least 1.5×, in whole MiB, never
//! shrink); the copy schedule lives in `gpu.rs`. Every buffer is used on the
//! compactor's single stream, and `gpu.rs` synchronises that stream before a buffer is
//! reused or replaced.

use std::ffi::c_void;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, PinnedHostSlice, sys};

/// Bytes of slack on both sides of a [`HostBuffer`]'s usable bytes: the gather's
/// aligned loads reach up to 3 bytes before a chunk and 4 after it, and a read past a
/// mapped allocation would fault on the device.
pub(crate) const HOST_PAD: usize = 16;

/// Page-locked host memory that the device reads and writes in place (allocated with
/// `CU_MEMHOSTALLOC_DEVICEMAP`): a batch staged here is packed without a host copy, and
/// the packed result lands here, ready to be written to a file. Made by
/// [`super::GpuCompactor::host_buffer`]; derefs to its bytes (zeroed when made).
pub struct HostBuffer {
    buf: PinnedHostSlice<u8>,
    /// Start of the whole allocation (usable bytes begin `HOST_PAD` later).
    ptr: *mut u8,
    /// The allocation's address in the device's address space.
    dptr: u64,
    len: usize,
}

// SAFETY: `ptr` points into the allocation owned by `buf`, which lives as long as this
// value; `HostBuffer` hands out `&[u8]` / `&mut [u8]` to it only through `&self` /
// `&mut self`, so Rust's aliasing rules hold across threads as for a `Vec<u8>`.
unsafe impl Send for HostBuffer {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// `len` usable bytes, zeroed, mapped into `ctx`'s device.
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, DriverError> {
        // Absurd sizes (a saturated `--write-buffer`) are an allocation failure, never
        // a wrapped length or a cudarc assertion.
        let total = len
            .checked_add(2 * HOST_PAD)
            .filter(|&t| t < isize::MAX as usize)
            .ok_or(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY))?;
        // SAFETY: the memory is uninitialised; it is zero-filled below before any
        // reference to it exists.
        let mut buf = unsafe {
            ctx.alloc_pinned_with_flags::<u8>(
                total,
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }?;
        let ptr = buf.as_mut_ptr()?;
        // SAFETY: `ptr` points to `total` writable bytes owned by `buf`.
        unsafe { std::ptr::write_bytes(ptr, 0, total) };
        let mut dptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is the start of a live allocation made with DEVICEMAP in the
        // current context (bound by `alloc_pinned_with_flags`); `dptr` is a valid
        // out-pointer; flags must be 0.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, ptr.cast::<c_void>(), 0) }
            .result()?;
        Ok(Self {
            buf,
            ptr,
            dptr,
            len,
        })
    }

    /// Usable bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of usable byte 0.
    pub(crate) fn device_addr(&self) -> u64 {
        self.dptr + HOST_PAD as u64
    }

    /// Where `part` starts in this buffer's usable bytes, if it lies wholly inside them.
    pub(crate) fn offset_of(&self, part: &[u8]) -> Option<usize> {
        let start = self.as_ptr() as usize;
        let at = (part.as_ptr() as usize).checked_sub(start)?;
        (at.checked_add(part.len())? <= self.len).then_some(at)
    }

    /// At least `len` usable bytes: a bigger buffer (contents not kept) when this one
    /// is too small.
    pub(crate) fn grow(&mut self, len: usize) -> Result<(), DriverError> {
        if len > self.len {
            let ctx = self.buf.context().clone();
            *self = Self::alloc(&ctx, grown_capacity(self.len, len))?;
        }
        Ok(())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // The device may still read or write this memory if a call was cut short (a
        // panic unwinding past a launch): wait for the context before it is freed.
        // Errors mean the context is gone, and with it any work on this memory.
        let _ = self.buf.context().synchronize();
    }
}

impl Deref for HostBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr + HOST_PAD` starts `len` initialised bytes (zeroed at
        // allocation) inside `buf`'s allocation, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(HOST_PAD), self.len) }
    }
}

impl DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(HOST_PAD), self.len) }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .finish()
    }
}

/// A [`HostBuffer`] made on first use and grown as needed.
#[derive(Default)]
pub(crate) struct MappedBuf {
    buf: Option<HostBuffer>,
}

impl MappedBuf {
    /// At least `len` usable bytes. Contents are unspecified after a grow.
    pub(crate) fn ensure(
        &mut self,
        ctx: &Arc<CudaContext>,
        len: usize,
    ) -> Result<&mut HostBuffer, DriverError> {
        let current = match self.buf.take() {
            Some(buf) if buf.len() >= len => return Ok(self.buf.insert(buf)),
            // Give the old pinned memory back before pinning more: it is scarce.
            old => old.map_or(0, |b| b.len()),
        };
        let buf = HostBuffer::alloc(ctx, grown_capacity(current, len))?;
        Ok(self.buf.insert(buf))
    }

    /// The buffer, if one was made.
    pub(crate) fn get_mut(&mut self) -> Option<&mut HostBuffer> {
        self.buf.as_mut()
    }
}

/// Round a requested capacity up so that a slowly growing batch size does not
/// reallocate (and re-pin) on every call.
fn grown_capacity(current: usize, needed: usize) -> usize {
    const MIB: usize = 1 << 20;
    let target = needed.max(current.saturating_add(current / 2));
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

#[cfg(test)]
mod tests {
    use super::grown_capacity;

    #[test]
    fn capacities_grow_in_whole_mib_and_never_overflow() {
        assert_eq!(grown_capacity(0, 1), 1 << 20);
        assert_eq!(grown_capacity(4 << 20, 5 << 20), 6 << 20);
        assert_eq!(grown_capacity(0, 0), 0);
        // A saturated request (a huge `--write-buffer`) saturates, never wraps or panics;
        // `HostBuffer::alloc` then refuses it as out of memory.
        assert_eq!(grown_capacity(usize::MAX / 2 + 7, usize::MAX), usize::MAX);
        assert!(grown_capacity(usize::MAX - 3, 5) >= usize::MAX - 3);
    }
}
