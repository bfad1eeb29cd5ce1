// c[i] = a[i] + b[i] on n floats. examples/build.sh builds one cubin per architecture.
extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
