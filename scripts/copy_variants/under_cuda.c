/* rig's copy kernels launched by CUDA: separates "rig's kernel is slower than CUDA's memcpy"
 * from "rig's launch (QMD) or mapping makes the same kernel slower". Times cuMemcpyDtoD and
 * each kernel of copy.sm_90.cubin and variants.sm_90.cubin over 256 MiB and 1 GiB on cuMemAlloc
 * memory (median of 20 after 3, wall clock around launch + cuCtxSynchronize, as bench row 5,
 * and by CUDA events around the copy on the GPU's clock),
 * each result checked byte-exact once. Built and run by scripts/copy_variants/under_cuda.py. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_) { const char *s_; cuGetErrorName(r_, &s_); \
    fprintf(stderr, "%s: %s\n", #x, s_); exit(1); } } while (0)

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static CUdeviceptr src, dst;
static size_t N;
static int sms;

static void *load(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb"); if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END); *n = ftell(f); fseek(f, 0, SEEK_SET);
    void *b = malloc(*n); if (fread(b, 1, *n, f) != *n) exit(1); fclose(f); return b;
}

static double gpu_gbs;  /* the same copies timed by CUDA events (the GPU's clock), median */

static double timed(CUfunction fn, int per_sm) {
    double s[20], g[20];
    CUevent e0, e1;
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT)); CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    unsigned long long count = N / 16;
    void *args[] = {&dst, &src, &count};
    for (int i = 0; i < 23; i++) {
        double t = now();
        CK(cuEventRecord(e0, 0));
        if (fn) CK(cuLaunchKernel(fn, sms * per_sm, 1, 1, 256, 1, 1, 0, 0, args, 0));
        else CK(cuMemcpyDtoDAsync(dst, src, N, 0));
        CK(cuEventRecord(e1, 0));
        CK(cuCtxSynchronize());
        if (i >= 3) {
            float ms;
            s[i - 3] = now() - t;
            CK(cuEventElapsedTime(&ms, e0, e1));
            g[i - 3] = ms * 1e-3;
        }
    }
    qsort(s, 20, sizeof s[0], cmp);
    qsort(g, 20, sizeof g[0], cmp);
    gpu_gbs = N / g[10] / 1e9;
    CK(cuEventDestroy(e0)); CK(cuEventDestroy(e1));
    return N / s[10] / 1e9;
}

static int same(unsigned char *want, unsigned char *got) {
    CK(cuMemcpyDtoH(got, dst, N));
    return memcmp(want, got, N) == 0;
}

int main(int argc, char **argv) {
    CUdevice dev; CUcontext ctx; CUmodule mods[2]; size_t n;
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    for (int m = 0; m < 2; m++) { void *b = load(argv[1 + m], &n); CK(cuModuleLoadData(&mods[m], b)); free(b); }
    const char *names[] = {"memcpy", "copy16", "plain", "u4", "u4cs", "u8", "u8cs"};
    size_t sizes[] = {256u << 20, 1u << 30};
    printf("%-8s %7s %7s %9s %9s  ok\n", "kernel", "MiB", "blk/SM", "GB/s", "GPU GB/s");
    for (int z = 0; z < 2; z++) {
        N = sizes[z];
        unsigned char *want = malloc(N), *got = malloc(N);
        for (size_t i = 0; i < N; i++) want[i] = (unsigned char)rand();
        CK(cuMemAlloc(&src, N)); CK(cuMemAlloc(&dst, N));
        CK(cuMemcpyHtoD(src, want, N));
        for (int k = 0; k < 7; k++) {
            CUfunction fn = 0;
            if (k) CK(cuModuleGetFunction(&fn, mods[k == 1 ? 0 : 1], names[k]));
            int grids[] = {8, 16};
            for (int g = 0; g < (k ? 2 : 1); g++) {
                CK(cuMemsetD8(dst, 0, N));
                double gbs = timed(fn, grids[g]);
                printf("%-8s %7zu %7d %9.0f %9.0f  %s\n", names[k], N >> 20, k ? grids[g] : 0, gbs,
                       gpu_gbs, same(want, got) ? "yes" : "NO");
            }
        }
        CK(cuMemFree(src)); CK(cuMemFree(dst)); free(want); free(got);
    }
    return 0;
}
