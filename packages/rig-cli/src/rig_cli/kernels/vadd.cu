// The built-in kernel of `rig check`: c[i] = a[i] + b[i] on 32-bit unsigned integers (wrapping
// modulo 2^32, so the host's sum is exact and the comparison byte-exact). build.sh in
// packages/rig-cli compiles it with nvcc -cubin for each architecture rig knows; the cubins
// are committed and ship in the wheel as package data.

extern "C" __global__ void vadd(const unsigned int* a, const unsigned int* b, unsigned int* c,
                                int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
