// rig's built-in copy kernels: copies inside one GPU run on the SMs, which move data several
// times faster than a copy engine can. build.sh compiles this file for each architecture rig
// launches on; the cubins ship in the package.

extern "C" __global__ void copy16(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                  unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride)
        dst[i] = src[i];
}

extern "C" __global__ void copy1(unsigned char* __restrict__ dst,
                                 const unsigned char* __restrict__ src,
                                 unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < count; i += stride)
        dst[i] = src[i];
}
