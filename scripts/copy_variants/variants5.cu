// Flat copy kernels (one block a chunk, no loop, as rig's copy16) with cache hints, for the
// D2D target of issue 23 (>= 0.95x cuMemcpyDtoD). flat4 is rig's copy16; the others differ
// in one thing each: the L2 prefetch size of the loads, an evict-first policy on loads or
// stores, no L1 allocation, or the block's size. (dst, src, count of 16-byte units.) An
// experiment: under_cuda2.py times them beside cuMemcpyDtoD. PTX forms: the PTX ISA's ld, st
// and createpolicy.

enum Load { LDG, PF256, NOALLOC, EVICT_FIRST, PF256_EVICT_FIRST };
enum Store { ST, ST_EVICT_FIRST, ST_NOALLOC, ST_CS };

template <Load L>
__device__ __forceinline__ uint4 load(const uint4* p, unsigned long long pol) {
    uint4 v;
    if (L == LDG) {
        v = __ldg(p);
    } else if (L == PF256) {
        asm volatile("ld.global.nc.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if (L == NOALLOC) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    } else if (L == EVICT_FIRST) {
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    } else {
        asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    }
    return v;
}

template <Store S>
__device__ __forceinline__ void store(uint4* p, uint4 v, unsigned long long pol) {
    if (S == ST) {
        *p = v;
    } else if (S == ST_EVICT_FIRST) {
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;"
                     :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "l"(pol) : "memory");
    } else if (S == ST_NOALLOC) {
        asm volatile("st.global.L1::no_allocate.v4.u32 [%0], {%1,%2,%3,%4};"
                     :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
    } else {
        __stcs(p, v);
    }
}

template <int T, int U, Load L, Store S>
__device__ __forceinline__ void flat(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                     unsigned long long count) {
    unsigned long long pol = 0;
    if (L == EVICT_FIRST || L == PF256_EVICT_FIRST || S == ST_EVICT_FIRST)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    const unsigned long long base = (unsigned long long)blockIdx.x * (T * U);
    uint4 v[U];
#pragma unroll
    for (int k = 0; k < U; k++) {
        unsigned long long i = base + k * T + threadIdx.x;
        if (i < count) v[k] = load<L>(src + i, pol);
    }
#pragma unroll
    for (int k = 0; k < U; k++) {
        unsigned long long i = base + k * T + threadIdx.x;
        if (i < count) store<S>(dst + i, v[k], pol);
    }
}

#define FLAT(NAME, T, U, L, S) extern "C" __global__ void __launch_bounds__(T) NAME( \
    uint4* d, const uint4* s, unsigned long long n) { flat<T, U, L, S>(d, s, n); }

FLAT(flat4, 256, 4, LDG, ST)
FLAT(flat4_pf256, 256, 4, PF256, ST)
FLAT(flat4_noalloc, 256, 4, NOALLOC, ST)
FLAT(flat4_ldef, 256, 4, EVICT_FIRST, ST)
FLAT(flat4_pfef, 256, 4, PF256_EVICT_FIRST, ST)
FLAT(flat4_stef, 256, 4, LDG, ST_EVICT_FIRST)
FLAT(flat4_bothef, 256, 4, EVICT_FIRST, ST_EVICT_FIRST)
FLAT(flat4_stna, 256, 4, LDG, ST_NOALLOC)
FLAT(flat4_cs, 256, 4, LDG, ST_CS)
FLAT(flat8_pf256, 256, 8, PF256, ST)
FLAT(flat2_512, 512, 2, LDG, ST)
FLAT(flat4_512, 512, 4, LDG, ST)
FLAT(flat2_1024, 1024, 2, LDG, ST)
FLAT(flat1_1024, 1024, 1, LDG, ST)
FLAT(flat8_128, 128, 8, LDG, ST)
