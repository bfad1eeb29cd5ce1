// Looped copy kernels of copy16's shape, for the D2D target of issue 23: each block copies
// chunks of THREADS x LOADS 16-byte units (every load of a thread in flight before its
// stores), striding over the chunks by the grid, so that a grid of whole waves ends together
// where a flat grid (rig's copy16, flat2_1024 here) ends with a partial wave. (dst, src,
// count of 16-byte units.) An experiment: under_cuda2.py times them beside cuMemcpyDtoD with
// a fixed grid (name:threads:units:grid).

template <int THREADS, int LOADS>
__device__ __forceinline__ void chunk(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                      unsigned long long count, unsigned long long base) {
    uint4 v[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; k++) {
        unsigned long long i = base + k * THREADS + threadIdx.x;
        if (i < count) v[k] = __ldg(src + i);
    }
#pragma unroll
    for (int k = 0; k < LOADS; k++) {
        unsigned long long i = base + k * THREADS + threadIdx.x;
        if (i < count) dst[i] = v[k];
    }
}

#define FLAT(name, T, L)                                                                   \
    extern "C" __global__ void __launch_bounds__(T)                                        \
    name(uint4* __restrict__ dst, const uint4* __restrict__ src, unsigned long long count) { \
        chunk<T, L>(dst, src, count, (unsigned long long)blockIdx.x * (T * L));            \
    }

#define LOOP(name, T, L)                                                                   \
    extern "C" __global__ void __launch_bounds__(T)                                        \
    name(uint4* __restrict__ dst, const uint4* __restrict__ src, unsigned long long count) { \
        for (unsigned long long c = blockIdx.x; c * (T * L) < count; c += gridDim.x)       \
            chunk<T, L>(dst, src, count, c * (T * L));                                     \
    }

FLAT(flat2_1024, 1024, 2)
LOOP(loop2_1024, 1024, 2)
LOOP(loop4_1024, 1024, 4)
LOOP(loop4_512, 512, 4)
LOOP(loop8_256, 256, 8)
