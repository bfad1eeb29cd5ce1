// Kernels whose launches capture.c records as CUDA writes them (not shipped: a probe).
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

extern "C" __global__ void plain(unsigned long long a, unsigned b, unsigned *out) {
    if (out) out[blockIdx.x] = (unsigned)a + b;
}

extern "C" __global__ void coop(unsigned long long a, unsigned b, unsigned *out) {
    cg::grid_group g = cg::this_grid();
    if (out && threadIdx.x == 0) out[blockIdx.x] = 1;
    g.sync();
    if (out && blockIdx.x == 0 && threadIdx.x == 0) out[0] = (unsigned)a + b;
}

extern "C" __global__ void clus(unsigned long long a, unsigned b, unsigned *out) {
    extern __shared__ unsigned s[];
    cg::cluster_group c = cg::this_cluster();
    s[threadIdx.x] = threadIdx.x + (unsigned)a;
    c.sync();
    unsigned *peer = c.map_shared_rank(s, (c.block_rank() + 1) % c.num_blocks());
    unsigned v = peer[threadIdx.x];
    c.sync();
    if (out) out[blockIdx.x * blockDim.x + threadIdx.x] = v + b;
}

extern "C" __global__ void __cluster_dims__(2, 1, 1) fixed2(unsigned long long a, unsigned b, unsigned *out) {
    if (out) out[blockIdx.x] = (unsigned)a + b;
}

extern "C" __global__ void pdl(unsigned long long a, unsigned b, unsigned *out) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (out) out[blockIdx.x] = (unsigned)a + b;
    asm volatile("griddepcontrol.launch_dependents;");
}
