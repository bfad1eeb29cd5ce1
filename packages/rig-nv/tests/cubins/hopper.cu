#include <cooperative_groups.h>
namespace cg = cooperative_groups;

// Every block adds its sum into out[0] after a grid-wide barrier: needs a cooperative launch.
extern "C" __global__ void grid_sum(const float *x, float *partial, float *out, int n) {
    cg::grid_group grid = cg::this_grid();
    float s = 0;
    for (int i = grid.thread_rank(); i < n; i += grid.size()) s += x[i];
    atomicAdd(&partial[blockIdx.x], s);
    grid.sync();
    if (grid.thread_rank() == 0) {
        float t = 0;
        for (unsigned b = 0; b < gridDim.x; ++b) t += partial[b];
        out[0] = t;
    }
}

// Each CTA of a 2x1x1 cluster reads its neighbour's shared memory (distributed shared memory).
extern "C" __global__ void __cluster_dims__(2, 1, 1) cluster_swap(const int *in, int *out) {
    __shared__ int mine[128];
    cg::cluster_group cluster = cg::this_cluster();
    unsigned rank = cluster.block_rank();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    mine[threadIdx.x] = in[i];
    cluster.sync();
    int *theirs = cluster.map_shared_rank(mine, rank ^ 1);
    out[i] = theirs[threadIdx.x] + (int)cluster.num_blocks() * 1000 + (int)rank * 100000;
    cluster.sync();
}

// No cluster shape of its own, at most 8 CTAs a cluster (__launch_bounds__' third value).
extern "C" __global__ void __launch_bounds__(128, 1, 8) cluster_rank(int *out) {
    cg::cluster_group cluster = cg::this_cluster();
    out[blockIdx.x * blockDim.x + threadIdx.x] = (int)cluster.block_rank()
        + 16 * (int)cluster.dim_blocks().x;
}

// Writes every cluster value the hardware and the driver give a CTA: its SASS shows which
// words of constant bank 0 the driver must fill for a cluster launch (see rig_nv.cluster).
extern "C" __global__ void cluster_probe(unsigned *o) {
    cg::cluster_group c = cg::this_cluster();
    unsigned *p = o + 24 * (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    if (threadIdx.x != 0) return;
    p[0] = c.dim_blocks().x; p[1] = c.dim_blocks().y; p[2] = c.dim_blocks().z;
    p[3] = c.block_index().x; p[4] = c.block_index().y; p[5] = c.block_index().z;
    p[6] = c.num_blocks(); p[7] = c.block_rank(); p[8] = c.num_threads();
    p[9] = __clusterGridDimInClusters().x; p[10] = __clusterGridDimInClusters().y;
    p[11] = __clusterGridDimInClusters().z;
    p[12] = __clusterIdx().x; p[13] = __clusterIdx().y; p[14] = __clusterIdx().z;
    unsigned r;
    asm("{.reg .pred q; mov.pred q, %%is_explicit_cluster; selp.u32 %0, 1, 0, q;}" : "=r"(r));
    p[15] = r;
}
