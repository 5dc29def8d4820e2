//! The three kernels' launches on the stream (permute the sizes, scan them into offsets,
//! gather the chunks), their grids and the device addresses they are given. Not the
//! transfers around them (`transfer`) nor the kernels' source (`gpu_kernel.cu`).

use cudarc::driver::{CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use super::layout::{Layout, SRC_PAD};
use super::{GpuState, at};
use crate::compact::{CompactError, StagedBatch};

/// The gather splits a chunk's body over several blocks once it exceeds this, so a
/// few huge chunks still spread over the SMs.
const GATHER_SPLIT_BYTES: u64 = 256 << 10;

const GATHER_THREADS: u32 = 256;
const PERMUTE_THREADS: u32 = 256;
/// Must match SCAN_THREADS in gpu_kernel.cu.
const SCAN_THREADS: u32 = 1024;

/// A device pointer `offset` bytes into `buf`, as a kernel argument.
fn dev_addr(buf: &cudarc::driver::CudaSlice<u8>, stream: &CudaStream, offset: usize) -> u64 {
    let (base, _no_tracking) = buf.device_ptr(stream);
    base + offset as u64
}

/// Grid for the gather: one block row per chunk (x), the largest chunk's body split
/// over y blocks, bounded so the grid stays a few million blocks.
pub(crate) fn gather_grid(n: usize, sizes: &[u64]) -> LaunchConfig {
    let x = n.min(1 << 30) as u32;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let want_y = largest.div_ceil(GATHER_SPLIT_BYTES).clamp(1, 1024) as u32;
    let y = want_y.min(((1u32 << 22) / x).max(1));
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (GATHER_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The device addresses the three kernels are given (see `gpu_kernel.cu`).
struct KernelAddrs {
    /// In `d_scan`: the sizes in packed order, and the scanned offsets (n + 1).
    psizes: u64,
    offsets: u64,
    /// In `d_meta`: the batch's source offsets, sizes and permutation.
    src_offsets: u64,
    sizes: u64,
    perm: u64,
    /// Where the gather reads the batch's data and writes the packed result.
    src: u64,
    dst: u64,
}

impl GpuState {
    /// Pass 1–3 on the stream, after the upload. The gather reads `src` and writes
    /// `dst` (mapped host memory) where given, else the device buffers.
    pub(super) fn launch(
        &mut self,
        batch: &StagedBatch<'_>,
        layout: &Layout,
        src: Option<u64>,
        dst: Option<u64>,
    ) -> Result<(), CompactError> {
        let n = layout.n;
        let n32 = n as u32; // `plan` checked n <= u32::MAX
        let KernelAddrs {
            psizes,
            offsets,
            src_offsets,
            sizes,
            perm,
            src,
            dst,
        } = self.kernel_addrs(layout, src, dst)?;
        let stream = &self.stream;

        let permute_cfg = LaunchConfig {
            grid_dim: (n32.div_ceil(PERMUTE_THREADS).min(65_535), 1, 1),
            block_dim: (PERMUTE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: argument types and order match `permute_sizes` in gpu_kernel.cu; the
        // three pointers address n u64 / n u32 / n u64 elements of live buffers on this
        // stream (sized by `Layout`), and `perm` is a permutation of 0..n, so every
        // write lands inside `psizes`.
        unsafe {
            stream
                .launch_builder(&self.kernels.permute)
                .arg(&sizes)
                .arg(&perm)
                .arg(&psizes)
                .arg(&n32)
                .launch(permute_cfg)
        }
        .map_err(at("permute_sizes"))?;

        let scan_cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (SCAN_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches `exclusive_scan(psizes, offsets, n)`; `psizes` holds n u64 and
        // `offsets` n + 1 u64 in `d_scan`; launched with exactly SCAN_THREADS threads as
        // the kernel requires.
        unsafe {
            stream
                .launch_builder(&self.kernels.scan)
                .arg(&psizes)
                .arg(&offsets)
                .arg(&n32)
                .launch(scan_cfg)
        }
        .map_err(at("exclusive_scan"))?;

        // SAFETY: matches `gather_chunks(src, src_offsets, sizes, perm, offsets, dst, n)`.
        // `plan` checked every src range lies in `data`, which `src` addresses: the
        // device copy (SRC_PAD bytes either side for the kernel's aligned over-read) or
        // a mapped HostBuffer (HOST_PAD bytes either side), and the scanned offsets place
        // chunk i at offsets[perm[i]] .. + sizes[i] <= total bytes of `dst`, the device
        // buffer or a mapped HostBuffer grown to at least `total` usable bytes.
        unsafe {
            stream
                .launch_builder(&self.kernels.gather)
                .arg(&src)
                .arg(&src_offsets)
                .arg(&sizes)
                .arg(&perm)
                .arg(&offsets)
                .arg(&dst)
                .arg(&n32)
                .launch(gather_grid(n, batch.sizes))
        }
        .map_err(at("gather_chunks"))?;
        Ok(())
    }

    /// The device buffers the kernels use, grown to `layout`, and their addresses; `src`
    /// and `dst` (mapped host memory) where given, else the device buffers.
    fn kernel_addrs(
        &mut self,
        layout: &Layout,
        src: Option<u64>,
        dst: Option<u64>,
    ) -> Result<KernelAddrs, CompactError> {
        let n = layout.n;
        let stream = &self.stream;
        let d_scan = self
            .d_scan
            .ensure(stream, layout.offsets_at + (n + 1) * 8)
            .map_err(at("device alloc"))?;
        let psizes = dev_addr(d_scan, stream, 0);
        let offsets = dev_addr(d_scan, stream, layout.offsets_at);
        let d_meta = self
            .d_meta
            .ensure(stream, layout.meta_len)
            .map_err(at("device alloc"))?;
        let src_offsets = dev_addr(d_meta, stream, 0);
        let sizes = dev_addr(d_meta, stream, layout.sizes_at);
        let perm = dev_addr(d_meta, stream, layout.perm_at);
        let src = match src {
            Some(src) => src,
            None => self
                .d_src
                .ensure(stream, layout.src_len())
                .map(|b| dev_addr(b, stream, SRC_PAD))
                .map_err(at("device alloc"))?,
        };
        let dst = match dst {
            Some(dst) => dst,
            None => self
                .d_dst
                .ensure(stream, layout.total)
                .map(|b| dev_addr(b, stream, 0))
                .map_err(at("device alloc"))?,
        };
        Ok(KernelAddrs {
            psizes,
            offsets,
            src_offsets,
            sizes,
            perm,
            src,
            dst,
        })
    }
}
