// Copy-kernel variants timed by scripts/copy_variants/run.py against rig's shipped copy16:
// unrolled loads (more bytes in flight per thread, for HBM and for a peer's memory over
// NVLink) and streaming (evict-first) loads and stores.

extern "C" __global__ void plain(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                 unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride)
        dst[i] = src[i];
}

template <int U, bool STREAM>
__device__ void unrolled(uint4* __restrict__ dst, const uint4* __restrict__ src,
                         unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < count; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) v[k] = STREAM ? __ldcs(src + i + k * stride) : src[i + k * stride];
#pragma unroll
        for (int k = 0; k < U; k++) {
            if (STREAM) __stcs(dst + i + k * stride, v[k]); else dst[i + k * stride] = v[k];
        }
    }
    for (; i < count; i += stride) dst[i] = src[i];
}

extern "C" __global__ void u4(uint4* __restrict__ d, const uint4* __restrict__ s, unsigned long long n) { unrolled<4, false>(d, s, n); }
extern "C" __global__ void u4cs(uint4* __restrict__ d, const uint4* __restrict__ s, unsigned long long n) { unrolled<4, true>(d, s, n); }
extern "C" __global__ void u8(uint4* __restrict__ d, const uint4* __restrict__ s, unsigned long long n) { unrolled<8, false>(d, s, n); }
extern "C" __global__ void u8cs(uint4* __restrict__ d, const uint4* __restrict__ s, unsigned long long n) { unrolled<8, true>(d, s, n); }
