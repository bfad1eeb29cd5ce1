// y[i] = a * x[i] + y[i] on n floats. examples/build.sh builds one cubin per architecture.
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
