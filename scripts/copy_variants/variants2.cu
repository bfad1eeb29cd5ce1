// More copy-kernel variants (after variants.cu's unrolling and streaming hints changed
// nothing): each block copying a contiguous chunk per turn (DRAM page locality), and on
// sm_90 the Tensor Memory Accelerator's bulk copies (cp.async.bulk, PTX ISA 8.0) through
// shared memory, global -> shared completing on an mbarrier, shared -> global in bulk groups.
// All take (dst, src, count of 16-byte units), count a multiple of the chunk for bulk.

// 256 threads, each block takes CHUNK16 units at a time, U loads in flight per thread.
template <int U>
__device__ void chunked(uint4* __restrict__ dst, const uint4* __restrict__ src,
                        unsigned long long count) {
    const unsigned long long chunk = 256ull * U;
    for (unsigned long long base = (unsigned long long)blockIdx.x * chunk; base < count;
         base += (unsigned long long)gridDim.x * chunk) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            unsigned long long i = base + k * 256 + threadIdx.x;
            if (i < count) v[k] = src[i];
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            unsigned long long i = base + k * 256 + threadIdx.x;
            if (i < count) dst[i] = v[k];
        }
    }
}
extern "C" __global__ void __launch_bounds__(256) ch4(uint4* d, const uint4* s, unsigned long long n) { chunked<4>(d, s, n); }
extern "C" __global__ void __launch_bounds__(256) ch8(uint4* d, const uint4* s, unsigned long long n) { chunked<8>(d, s, n); }

#if __CUDA_ARCH__ >= 900
// One thread per block drives STAGES buffers of BYTES each: load chunk i into stage i % STAGES
// once the store that last read that stage is done, then store it.
template <int STAGES, int BYTES>
__device__ void bulk_copy(char* dst, const char* src, unsigned long long count16) {
    extern __shared__ __align__(128) char buf[];
    __shared__ __align__(8) unsigned long long bar[STAGES];
    if (threadIdx.x != 0) return;
    unsigned long long total = count16 * 16, chunks = total / BYTES;
    unsigned bar0 = (unsigned)__cvta_generic_to_shared(bar), buf0 = (unsigned)__cvta_generic_to_shared(buf);
    for (int s = 0; s < STAGES; s++)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar0 + 8 * s));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    unsigned phase = 0;  // bit s: the parity stage s waits for next
    unsigned long long first = blockIdx.x, step = gridDim.x;
    int issued = 0;
    // Prime: start up to STAGES loads.
    for (unsigned long long c = first; c < chunks && issued < STAGES; c += step, issued++) {
        unsigned b = bar0 + 8 * issued, d = buf0 + issued * BYTES;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(BYTES) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(d), "l"(src + c * BYTES), "r"(BYTES), "r"(b) : "memory");
    }
    int k = 0;
    for (unsigned long long c = first; c < chunks; c += step, k++) {
        int s = k % STAGES;
        unsigned b = bar0 + 8 * s, d = buf0 + s * BYTES;
        unsigned parity = (phase >> s) & 1;
        asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}"
                     :: "r"(b), "r"(parity) : "memory");
        phase ^= 1u << s;
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     :: "l"(dst + c * BYTES), "r"(d), "r"(BYTES) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        unsigned long long next = c + (unsigned long long)STAGES * step;
        if (next < chunks) {
            // the stage's buffer is read by the store just issued: wait until all but the
            // newest STAGES-1 groups have read their shared memory... simplest: this one.
            asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(b), "r"(BYTES) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         :: "r"(d), "l"(src + next * BYTES), "r"(BYTES), "r"(b) : "memory");
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
#endif

extern "C" __global__ void bulk4x16k(char* d, const char* s, unsigned long long n) {
#if __CUDA_ARCH__ >= 900
    bulk_copy<4, 16384>(d, s, n);
#endif
}
extern "C" __global__ void bulk8x8k(char* d, const char* s, unsigned long long n) {
#if __CUDA_ARCH__ >= 900
    bulk_copy<8, 8192>(d, s, n);
#endif
}
