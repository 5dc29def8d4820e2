// Aggregate-by-shard kernels for shardfs::compact::gpu, compiled at run time by NVRTC.
//
// Pass 1 permute_sizes:  psizes[perm[i]] = sizes[i]          (perm = P, from the host)
// Pass 2 exclusive_scan: offsets[0..=n] = exclusive scan of psizes, offsets[n] = total
// Pass 3 gather_chunks:  dst[offsets[perm[i]] ..][..sizes[i]] = src[src_offsets[i] ..]
//
// No headers: NVRTC provides uint4 and the __funnelshift_r / __shfl_up_sync intrinsics.

typedef unsigned long long u64;
typedef unsigned int u32;

extern "C" __global__ void permute_sizes(const u64* __restrict__ sizes,
                                         const u32* __restrict__ perm,
                                         u64* __restrict__ psizes,
                                         u32 n)
{
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        psizes[perm[i]] = sizes[i];
    }
}

// Single-block scan; launch with exactly SCAN_THREADS threads and one block. Walks the
// input in tiles of SCAN_THREADS * SCAN_ITEMS, carrying the running total.
#define SCAN_THREADS 1024
#define SCAN_ITEMS 4

extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
exclusive_scan(const u64* __restrict__ psizes, u64* __restrict__ offsets, u32 n)
{
    __shared__ u64 warp_sums[SCAN_THREADS / 32];
    const u32 tid = threadIdx.x;
    const u32 lane = tid & 31;
    const u32 warp = tid >> 5;
    u64 carry = 0;
    for (u64 base = 0; base < n; base += SCAN_THREADS * SCAN_ITEMS) {
        u64 v[SCAN_ITEMS];
        u64 local = 0;
        for (u32 k = 0; k < SCAN_ITEMS; ++k) {
            const u64 idx = base + (u64)tid * SCAN_ITEMS + k;
            v[k] = idx < n ? psizes[idx] : 0;
            local += v[k];
        }
        // Inclusive scan of the per-thread sums within each warp.
        u64 incl = local;
        for (u32 d = 1; d < 32; d <<= 1) {
            const u64 up = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += up;
        }
        if (lane == 31) warp_sums[warp] = incl;
        __syncthreads();
        if (warp == 0) {
            u64 w = warp_sums[lane];
            for (u32 d = 1; d < 32; d <<= 1) {
                const u64 up = __shfl_up_sync(0xffffffffu, w, d);
                if (lane >= d) w += up;
            }
            warp_sums[lane] = w;
        }
        __syncthreads();
        u64 run = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + incl - local;
        for (u32 k = 0; k < SCAN_ITEMS; ++k) {
            const u64 idx = base + (u64)tid * SCAN_ITEMS + k;
            if (idx < n) offsets[idx] = run;
            run += v[k];
        }
        carry += warp_sums[SCAN_THREADS / 32 - 1];
        __syncthreads(); // warp_sums is rewritten by the next tile
    }
    if (tid == 0) offsets[n] = carry;
}

// One block row per chunk (blockIdx.x, grid-stride), the chunk's 16-byte body split
// over gridDim.y blocks. Destination vectors are 16-byte aligned after a byte-wise head;
// the source is read with uint4 loads when it is then 16-byte aligned too, otherwise
// with five aligned u32 loads per vector and funnel shifts. Those aligned loads may
// touch up to 3 bytes before a chunk and 4 after it; the host pads `src` by 16 bytes
// on both sides.
extern "C" __global__ void gather_chunks(const unsigned char* __restrict__ src,
                                         const u64* __restrict__ src_offsets,
                                         const u64* __restrict__ sizes,
                                         const u32* __restrict__ perm,
                                         const u64* __restrict__ offsets,
                                         unsigned char* __restrict__ dst,
                                         u32 n)
{
    const u32 tid = threadIdx.x;
    const u32 nthreads = blockDim.x;
    for (u64 i = blockIdx.x; i < n; i += gridDim.x) {
        const u64 len = sizes[i];
        if (len == 0) continue;
        const unsigned char* s = src + src_offsets[i];
        unsigned char* d = dst + offsets[perm[i]];

        u64 head = (16 - ((u64)d & 15)) & 15;
        if (head > len) head = len;
        const u64 nvec = (len - head) >> 4;
        const u64 body_end = head + (nvec << 4);

        if (blockIdx.y == 0) {
            for (u64 b = tid; b < head; b += nthreads) d[b] = s[b];
            for (u64 b = body_end + tid; b < len; b += nthreads) d[b] = s[b];
        }

        const u64 per = (nvec + gridDim.y - 1) / gridDim.y;
        const u64 v0 = per * blockIdx.y;
        const u64 v1 = v0 + per < nvec ? v0 + per : nvec;
        const unsigned char* sb = s + head;
        uint4* db = (uint4*)(d + head);

        if (((u64)sb & 15) == 0) {
            const uint4* s4 = (const uint4*)sb;
            for (u64 v = v0 + tid; v < v1; v += nthreads) db[v] = s4[v];
        } else {
            const u32 r = (u32)((u64)sb & 3);
            const u32 shift = r * 8;
            const u32* w = (const u32*)(sb - r);
            for (u64 v = v0 + tid; v < v1; v += nthreads) {
                const u32* p = w + 4 * v;
                const u32 a0 = p[0], a1 = p[1], a2 = p[2], a3 = p[3], a4 = p[4];
                uint4 o;
                o.x = __funnelshift_r(a0, a1, shift);
                o.y = __funnelshift_r(a1, a2, shift);
                o.z = __funnelshift_r(a2, a3, shift);
                o.w = __funnelshift_r(a3, a4, shift);
                db[v] = o;
            }
        }
    }
}
