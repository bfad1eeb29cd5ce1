// rig's built-in copy kernels: copies inside one GPU run on the SMs, which move data several
// times faster than a copy engine can. build.sh compiles this file for each architecture rig
// launches on; the cubins ship in the package. Each takes (dst, src, count): 16-byte units for
// copy16, bytes for copy1.
//
// copy16: each block of COPY16_THREADS threads copies a contiguous chunk of COPY16_LOADS x 256
// units per turn, all COPY16_LOADS 16-byte loads of a thread in flight before its stores, and
// walks the grid over the buffer (rig launches 16 blocks per SM, rig_nv.copies). That shape
// ("ch8 16/SM") ran at 1978 GB/s on an H200's clock against the previous grid-stride copy16's
// 1914 and cuMemcpyDtoD's 2045 (scripts/copy_variants/run2.py, 256 MiB,
// docs/results/d2d-wait-2026-11-30.txt): measured by that probe, not yet by the bench.

#define COPY16_THREADS 256
#define COPY16_LOADS 8

extern "C" __global__ void __launch_bounds__(COPY16_THREADS)
copy16(uint4* __restrict__ dst, const uint4* __restrict__ src, unsigned long long count) {
    const unsigned long long chunk = (unsigned long long)COPY16_THREADS * COPY16_LOADS;
    for (unsigned long long base = (unsigned long long)blockIdx.x * chunk; base < count;
         base += (unsigned long long)gridDim.x * chunk) {
        uint4 v[COPY16_LOADS];
#pragma unroll
        for (int k = 0; k < COPY16_LOADS; k++) {
            unsigned long long i = base + k * COPY16_THREADS + threadIdx.x;
            if (i < count) v[k] = src[i];
        }
#pragma unroll
        for (int k = 0; k < COPY16_LOADS; k++) {
            unsigned long long i = base + k * COPY16_THREADS + threadIdx.x;
            if (i < count) dst[i] = v[k];
        }
    }
}

extern "C" __global__ void copy1(unsigned char* __restrict__ dst,
                                 const unsigned char* __restrict__ src,
                                 unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride)
        dst[i] = src[i];
}
