// Fixture kernels for rig_nv.cubin's tests. build.sh compiles this file with nvcc -cubin for
// each architecture and records what ptxas -v said beside each cubin; test_cubin.py parses the
// cubins and checks every figure against those reports. Keep the kernels small: the cubins are
// committed.

struct Block64 {  // 64 bytes, passed by value
    float m[12];
    int n;
    int stride;
    unsigned long long tag;
};

__constant__ float taps[8];  // cbank 3 (.nv.constant3)
__device__ unsigned int visits;  // .nv.global (NOBITS), reached through cbank 4 and a relocation

extern "C" __global__ void vadd(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// Static shared memory just under 48 KiB (47 KiB) plus dynamic shared memory.
#define STATIC_FLOATS (47 * 1024 / 4)
extern "C" __global__ void __launch_bounds__(256) reduce(const float* in, float* out, int n) {
    __shared__ float stage[STATIC_FLOATS];
    extern __shared__ float extra[];
    unsigned t = threadIdx.x;
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) s += in[i];
    stage[t] = s;
    extra[t] = s * 0.5f;
    if (t == 0) stage[STATIC_FLOATS - 1] = 1.0f;  // the far end of the static array is used too
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (t < w) stage[t] += stage[t + w] + extra[t + w];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = stage[0] + stage[STATIC_FLOATS - 1];
}

// A run-time-indexed local array cannot live in registers: it forces a stack frame.
extern "C" __global__ void local_array(const float* in, const int* idx, float* out, int n) {
    float buf[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
#pragma unroll 1
    for (int k = 0; k < 32; ++k) buf[k] = in[k] * (float)i;
    buf[idx[i] & 31] += 1.0f;
    out[i] = buf[idx[i + n] & 31];
}

// A 3-D grid: every index and dimension is read. Also touches __constant__ and __device__ data.
extern "C" __global__ void grid3d(float* out, int nx, int ny, int nz) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x < nx && y < ny && z < nz) {
        out[(z * ny + y) * nx + x] = taps[(x + y + z) & 7] * (float)(x + y + z);
        atomicAdd(&visits, 1u);
    }
}

// A 64-byte struct by value, between two scalars.
extern "C" __global__ void by_value(Block64 b, float* out, char flag) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < b.n) out[i * b.stride] = b.m[i % 12] + (float)(b.tag & 0xff) + (float)flag;
}
