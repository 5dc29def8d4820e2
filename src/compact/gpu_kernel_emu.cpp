// CPU emulation harness for gpu_kernel.cu, used by tests_kernel_emu.rs so the kernels'
// logic (alignment paths, funnel shifts, tiled scan) is tested on machines without a
// GPU. Blocks run one after another; the scan's 1024 threads are real std::threads
// with barriers standing in for __syncthreads and warp shuffles.
//
// stdin : u64 n, data_len, total, grid_y; u64 src_offsets[n], sizes[n]; u32 perm[n];
//         u8 data[data_len]
// stdout: u64 offsets[n + 1]; u8 dst[total]
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct Dim3 { unsigned x, y, z; };
static thread_local Dim3 threadIdx, blockIdx;
static Dim3 blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
#define __global__
#define __shared__ static
#define __launch_bounds__(n)

static inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}

static std::barrier<>* block_barrier;
struct Warp { std::barrier<>* bar; unsigned long long slot[32]; };
static Warp warps[32];

static void __syncthreads() { block_barrier->arrive_and_wait(); }

template <class T> static T __shfl_up_sync(unsigned, T v, unsigned d) {
    const unsigned lane = threadIdx.x & 31;
    Warp& w = warps[threadIdx.x >> 5];
    w.slot[lane] = (unsigned long long)v;
    w.bar->arrive_and_wait();
    const T r = lane >= d ? (T)w.slot[lane - d] : v;
    w.bar->arrive_and_wait();
    return r;
}

#include "gpu_kernel.cu"

static void read_exact(void* p, size_t n) {
    if (n && fread(p, 1, n, stdin) != n) { fprintf(stderr, "short input\n"); exit(2); }
}

static unsigned char* alloc256(size_t n, unsigned char fill) {
    unsigned char* p = (unsigned char*)aligned_alloc(256, (n + 255) / 256 * 256 + 256);
    memset(p, fill, (n + 255) / 256 * 256 + 256);
    return p;
}

int main() {
    u64 hdr[4];
    read_exact(hdr, sizeof hdr);
    const u64 n = hdr[0], data_len = hdr[1], total = hdr[2], grid_y = hdr[3];
    u64* src_offsets = (u64*)alloc256(n * 8, 0);
    u64* sizes = (u64*)alloc256(n * 8, 0);
    u32* perm = (u32*)alloc256(n * 4, 0);
    // 16 bytes of garbage padding on both sides, as on a GPU (SRC_PAD, HOST_PAD).
    unsigned char* src = alloc256(data_len + 48, 0xEE) + 16;
    u64* psizes = (u64*)alloc256(n * 8, 0);
    u64* offsets = (u64*)alloc256((n + 1) * 8, 0);
    unsigned char* dst = alloc256(total, 0xAB);
    read_exact(src_offsets, n * 8);
    read_exact(sizes, n * 8);
    read_exact(perm, n * 4);
    read_exact(src, data_len);

    blockDim = {256, 1, 1};
    gridDim = {(unsigned)((n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535), 1, 1};
    for (unsigned b = 0; b < gridDim.x; ++b)
        for (unsigned t = 0; t < blockDim.x; ++t) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            permute_sizes(sizes, perm, psizes, (u32)n);
        }

    blockDim = {SCAN_THREADS, 1, 1};
    gridDim = {1, 1, 1};
    std::barrier<> block(SCAN_THREADS);
    block_barrier = &block;
    std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
    for (auto& w : warps) {
        warp_bars.emplace_back(new std::barrier<>(32));
        w.bar = warp_bars.back().get();
    }
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < SCAN_THREADS; ++t)
        threads.emplace_back([=] {
            blockIdx = {0, 0, 0};
            threadIdx = {t, 0, 0};
            exclusive_scan(psizes, offsets, (u32)n);
        });
    for (auto& th : threads) th.join();

    blockDim = {256, 1, 1};
    gridDim = {(unsigned)n, (unsigned)grid_y, 1};
    for (unsigned bx = 0; bx < gridDim.x; ++bx)
        for (unsigned by = 0; by < gridDim.y; ++by)
            for (unsigned t = 0; t < blockDim.x; ++t) {
                blockIdx = {bx, by, 0};
                threadIdx = {t, 0, 0};
                gather_chunks(src, src_offsets, sizes, perm, offsets, dst, (u32)n);
            }

    fwrite(offsets, 8, n + 1, stdout);
    fwrite(dst, 1, total, stdout);
    return 0;
}
