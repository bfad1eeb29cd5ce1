// Prints the 64-bit L2 cache-policy descriptors createpolicy makes (PTX ISA, "createpolicy"),
// to compare with the memory descriptor a launch leaves in constant bank 0.
#include <cstdio>
__global__ void policies(unsigned long long* out) {
    unsigned long long a, b, c;
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(a));
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(b));
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(c));
    out[0] = a; out[1] = b; out[2] = c;
}
int main() {
    unsigned long long* d; unsigned long long h[3];
    cudaMalloc(&d, 24);
    policies<<<1, 1>>>(d);
    cudaMemcpy(h, d, 24, cudaMemcpyDeviceToHost);
    printf("%llx %llx %llx\n", h[0], h[1], h[2]);
    return 0;
}
