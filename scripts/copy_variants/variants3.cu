// Copy kernels for the D2D target of issue 23 (>= 0.95x cuMemcpyDtoD): U 16-byte loads in
// flight per thread, all loads of a turn before its stores, each block a contiguous chunk of
// 256 x U units per turn. loopU walks the grid over the buffer (blocks per SM chosen by the
// launcher); flatU launches one block per chunk, so no thread loops. (dst, src, count of
// 16-byte units.) An experiment: run3.py times them.

template <int U>
__device__ __forceinline__ void turn(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                     unsigned long long base, unsigned long long count) {
    uint4 v[U];
#pragma unroll
    for (int k = 0; k < U; k++) {
        unsigned long long i = base + k * 256 + threadIdx.x;
        if (i < count) v[k] = __ldg(src + i);
    }
#pragma unroll
    for (int k = 0; k < U; k++) {
        unsigned long long i = base + k * 256 + threadIdx.x;
        if (i < count) dst[i] = v[k];
    }
}

template <int U>
__device__ void looped(uint4* __restrict__ dst, const uint4* __restrict__ src,
                       unsigned long long count) {
    const unsigned long long chunk = 256ull * U;
    for (unsigned long long base = (unsigned long long)blockIdx.x * chunk; base < count;
         base += (unsigned long long)gridDim.x * chunk)
        turn<U>(dst, src, base, count);
}

#define LOOP(U) extern "C" __global__ void __launch_bounds__(256) loop##U( \
    uint4* d, const uint4* s, unsigned long long n) { looped<U>(d, s, n); }
#define FLAT(U) extern "C" __global__ void __launch_bounds__(256) flat##U( \
    uint4* d, const uint4* s, unsigned long long n) { \
    turn<U>(d, s, (unsigned long long)blockIdx.x * 256ull * U, n); }

LOOP(4) LOOP(8) LOOP(16)
FLAT(4) FLAT(8) FLAT(16)
