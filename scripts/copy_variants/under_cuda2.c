/* variants5.cu's flat copy kernels launched by CUDA beside cuMemcpyDtoD, on cuMemAlloc memory,
 * interleaved: 6 rounds, each timing every kernel 10 times after 2 (CUDA events around the
 * copy, the GPU's clock; and the wall clock around launch + cuCtxSynchronize, as bench row 5).
 * Medians of all rounds; each result checked byte-exact once. Built and run by
 * under_cuda2.py; argv: the cubin, then kernels as name:threads:units[:grid] (a fixed grid
 * for looped kernels; else a block a chunk of threads x units). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_) { const char *s_; cuGetErrorName(r_, &s_); \
    fprintf(stderr, "%s: %s\n", #x, s_); exit(1); } } while (0)
#define ROUNDS 6
#define REPS 10
#define MAXK 32

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double median(double *v, int n) { qsort(v, n, sizeof v[0], cmp); return v[n / 2]; }

static unsigned blocks_of(unsigned long long count, int threads, int units, int grid) {
    return grid ? (unsigned)grid : (unsigned)((count + threads * units - 1) / (threads * units));
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mod;
    CUfunction fn[MAXK] = {0}; int threads[MAXK] = {0}, units[MAXK] = {0}, grids[MAXK] = {0};
    char *names[MAXK] = {"memcpy"};
    int k, nk = argc - 1;  /* kernel 0 is cuMemcpyDtoDAsync */
    static double wall[MAXK][ROUNDS * REPS], gpu[MAXK][ROUNDS * REPS];
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoad(&mod, argv[1]));
    for (k = 1; k < nk; k++) {
        char *spec = argv[k + 1];
        names[k] = strtok(spec, ":");
        threads[k] = atoi(strtok(NULL, ":"));
        units[k] = atoi(strtok(NULL, ":"));
        char *grid = strtok(NULL, ":");
        grids[k] = grid ? atoi(grid) : 0;
        CK(cuModuleGetFunction(&fn[k], mod, names[k]));
    }
    size_t sizes[] = {256u << 20, 1u << 30};
    CUevent e0, e1;
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT)); CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    printf("%-14s %5s %6s %9s %8s %9s %8s  %s\n", "kernel", "MiB", "blocks", "GPU GB/s",
           "GPU us", "wall GB/s", "vs memcpy", "byte-exact");
    for (int z = 0; z < 2; z++) {
        size_t N = sizes[z];
        unsigned long long count = N / 16;
        CUdeviceptr src, dst;
        unsigned char *want = malloc(N), *got = malloc(N);
        for (size_t i = 0; i < N; i++) want[i] = (unsigned char)rand();
        CK(cuMemAlloc(&src, N)); CK(cuMemAlloc(&dst, N));
        CK(cuMemcpyHtoD(src, want, N));
        void *args[] = {&dst, &src, &count};
        int ok[MAXK];
        for (k = 0; k < nk; k++) {  /* each checked once, on a cleared destination */
            CK(cuMemsetD8(dst, 0, N));
            if (k) CK(cuLaunchKernel(fn[k], blocks_of(count, threads[k], units[k], grids[k]),
                                     1, 1, threads[k], 1, 1, 0, 0, args, 0));
            else CK(cuMemcpyDtoDAsync(dst, src, N, 0));
            CK(cuCtxSynchronize());
            CK(cuMemcpyDtoH(got, dst, N));
            ok[k] = memcmp(want, got, N) == 0;
        }
        for (int r = 0; r < ROUNDS; r++)
            for (k = 0; k < nk; k++)
                for (int i = -2; i < REPS; i++) {
                    double t = now();
                    CK(cuEventRecord(e0, 0));
                    if (k) CK(cuLaunchKernel(fn[k], blocks_of(count, threads[k], units[k], grids[k]),
                                             1, 1, threads[k], 1, 1, 0, 0, args, 0));
                    else CK(cuMemcpyDtoDAsync(dst, src, N, 0));
                    CK(cuEventRecord(e1, 0));
                    CK(cuCtxSynchronize());
                    t = now() - t;
                    if (i >= 0) {
                        float ms;
                        CK(cuEventElapsedTime(&ms, e0, e1));
                        wall[k][r * REPS + i] = t;
                        gpu[k][r * REPS + i] = ms * 1e-3;
                    }
                }
        double base = 0;
        for (k = 0; k < nk; k++) {
            double g = median(gpu[k], ROUNDS * REPS), w = median(wall[k], ROUNDS * REPS);
            if (!k) base = g;
            printf("%-14s %5zu %6llu %9.0f %8.1f %9.0f %8.3fx  %s\n", names[k], N >> 20,
                   k ? (unsigned long long)blocks_of(count, threads[k], units[k], grids[k]) : 0ull,
                   N / g / 1e9, g * 1e6, N / w / 1e9, base / g, ok[k] ? "True" : "FALSE");
        }
        CK(cuMemFree(src)); CK(cuMemFree(dst)); free(want); free(got);
    }
    return 0;
}
