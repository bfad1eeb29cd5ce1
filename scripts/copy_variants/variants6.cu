// Looped copy kernels of copy16's shape, for the D2D target of issue 23: each block copies
// chunks of T x L 16-byte units (every load of a thread in flight before its stores),
// striding over the chunks by the grid, so that a grid of whole waves ends together where
// the flat grid of rig's copy16 (included here as it ships) ends with a partial wave. (dst,
// src, count of 16-byte units.) An experiment: under_cuda2.py times them beside
// cuMemcpyDtoD with a fixed grid (name:threads:units:grid).

#include "../../packages/rig-nv/src/rig_nv/kernels/copy.cu"

#define LOOP(name, T, L)                                                                     \
    extern "C" __global__ void __launch_bounds__(T)                                          \
    name(uint4* __restrict__ dst, const uint4* __restrict__ src, unsigned long long count) { \
        for (unsigned long long i = (unsigned long long)blockIdx.x * (T * L) + threadIdx.x;  \
             i < count; i += (unsigned long long)gridDim.x * (T * L)) {                      \
            uint4 v[L];                                                                      \
            _Pragma("unroll") for (int k = 0; k < L; k++)                                    \
                if (i + k * T < count) v[k] = __ldg(src + i + k * T);                        \
            _Pragma("unroll") for (int k = 0; k < L; k++)                                    \
                if (i + k * T < count) dst[i + k * T] = v[k];                                \
        }                                                                                    \
    }

LOOP(loop2_1024, 1024, 2)
LOOP(loop4_1024, 1024, 4)
LOOP(loop4_512, 512, 4)
LOOP(loop8_256, 256, 8)
