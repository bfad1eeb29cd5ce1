// rig's built-in copy kernels: copies inside one GPU run on the SMs, which move data several
// times faster than a copy engine can. build.sh compiles this file for each architecture rig
// launches on; the cubins ship in the package. Each takes (dst, src, count): 16-byte units for
// copy16, bytes for copy1.
//
// copy16: one block of COPY16_THREADS threads a chunk of COPY16_LOADS x COPY16_THREADS units,
// every load of a thread in flight before its stores, and no loop: rig launches one block a
// chunk (rig_nv.copies.copy16_launches), several launches where a grid would pass 2^31-1
// blocks. Of the shapes measured beside cuMemcpyDtoD in one process on an H200, 1024 threads
// of 2 loads ("flat2_1024") came closest: 0.987x its GPU time at 256 MiB and at 1 GiB, against
// 0.964x for 256 threads of 4 loads, the shape it replaced; cache hints and prefetches were
// slower (scripts/copy_variants/under_cuda2.py, docs/results/copy-variants-2026-12-03.txt).

#define COPY16_THREADS 1024
#define COPY16_LOADS 2

extern "C" __global__ void __launch_bounds__(COPY16_THREADS)
copy16(uint4* __restrict__ dst, const uint4* __restrict__ src, unsigned long long count) {
    const unsigned long long base =
        (unsigned long long)blockIdx.x * (COPY16_THREADS * COPY16_LOADS);
    uint4 v[COPY16_LOADS];
#pragma unroll
    for (int k = 0; k < COPY16_LOADS; k++) {
        unsigned long long i = base + k * COPY16_THREADS + threadIdx.x;
        if (i < count) v[k] = __ldg(src + i);
    }
#pragma unroll
    for (int k = 0; k < COPY16_LOADS; k++) {
        unsigned long long i = base + k * COPY16_THREADS + threadIdx.x;
        if (i < count) dst[i] = v[k];
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
