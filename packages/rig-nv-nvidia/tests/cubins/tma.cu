// A TMA load for test_gpu_tensormap.py: each block of 128 threads loads one 16 x 32 tile of
// a 2-D float32 tensor into shared memory with cp.async.bulk.tensor (the tensor map passed
// by value, as CUTLASS and Triton pass it), waits on an mbarrier, and writes tile * scale + 1
// to out, a grid of whole tiles (gridDim.y * 16 rows of gridDim.x * 32). Elements past the
// tensor's edge come back from the TMA unit as zeros, so they write 1. With swizzled != 0 the
// map must use the 128-byte swizzle: 16-byte chunk c of tile row r lies at chunk c ^ (r % 8).
// build_tma.sh compiles it for sm_90a (TMA needs sm_90); the cubin is committed.

#include <cuda.h>  // CUtensorMap: 128 bytes, 64-byte aligned

#define BW 32  // tile width: 32 floats, 128 bytes, one 128-byte swizzle span
#define BH 16

extern "C" __global__ void __launch_bounds__(128)
tma_tile(const __grid_constant__ CUtensorMap map, float* out, int swizzled, float scale) {
    // 1024-byte aligned: the 128-byte swizzle repeats every 8 rows of 128 bytes.
    __shared__ alignas(1024) float tile[BH * BW];
    __shared__ alignas(8) unsigned long long bar;
    unsigned t = threadIdx.x;
    unsigned tile_s = (unsigned)__cvta_generic_to_shared(tile);
    unsigned bar_s = (unsigned)__cvta_generic_to_shared(&bar);
    int x0 = blockIdx.x * BW, y0 = blockIdx.y * BH;
    if (t == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar_s) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (t == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(bar_s), "r"(BH * BW * 4) : "memory");
        asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                     ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                     :: "r"(tile_s), "l"(&map), "r"(x0), "r"(y0), "r"(bar_s) : "memory");
    }
    asm volatile("{\n .reg .pred p;\n WAIT_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n"
                 " @!p bra WAIT_%=;\n}" :: "r"(bar_s) : "memory");
    int width = gridDim.x * BW;
    for (unsigned k = t; k < BH * BW; k += blockDim.x) {
        unsigned i = k / BW, j = k % BW;
        unsigned o = (i * BW + j) * 4;  // the element's byte offset in the tile
        if (swizzled) o ^= ((o >> 7) & 7) << 4;
        out[(y0 + i) * width + x0 + j] = tile[o / 4] * scale + 1.0f;
    }
}
