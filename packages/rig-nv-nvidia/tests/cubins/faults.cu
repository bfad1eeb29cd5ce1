// Kernels that fault or hang on purpose, for test_gpu_faults.py: the first three end their
// channel with an SM
// exception the RM reports (a trap, a misaligned access, a breakpoint). build.sh compiles it
// for sm_90 (the GPU machine's H200); the cubin is committed.

extern "C" __global__ void trap(int* out) {
    if (threadIdx.x == 0) out[0] = 1;
    __trap();
}

extern "C" __global__ void misaligned(int* out) {
    // A 4-byte store one byte past an aligned address: "Misaligned Address".
    *(volatile int*)((char*)out + 1) = 1;
}

extern "C" __global__ void breakpoint(int* out) {
    if (threadIdx.x == 0) out[0] = 1;
    asm volatile("brkpt;");
}

extern "C" __global__ void plain_store(int* out) {
    // Harmless as built; test_gpu_faults.py overwrites its first instruction with an
    // encoding no SM decodes, to raise an illegal instruction.
    out[threadIdx.x] = 1;
}

extern "C" __global__ void spin(volatile int* flag) {
    // Runs until the host writes a nonzero flag: the hang_ms test's kernel that never makes
    // progress on its own.
    while (*flag == 0) {
    }
}
