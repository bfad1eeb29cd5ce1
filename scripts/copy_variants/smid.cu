// Which SM each block of a grid ran on (%smid), for subcontext.py.
extern "C" __global__ void smid(unsigned* out) {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
