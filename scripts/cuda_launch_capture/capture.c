/* Record the QMD and constant bank 0 that NVIDIA's libcuda writes for a plain, a cluster, a
 * cooperative and a programmatic-dependent launch on this GPU, by finding them in the
 * process's own host-visible memory after each launch. A probe of facts, not shipped code.
 * QMD V04 positions (open-gpu-doc clcbc0qmd.h): GRID_WIDTH dword 32, CTA_THREAD_DIMENSION0/1
 * dword 36; the QMD is 384 bytes (96 dwords). Each case's block width is its own, so a
 * candidate is the 384 bytes around a matching dword 36 whose dword 32 is the grid width
 * (or the width in clusters).
 * Each launch's kernel arguments (a u64 then a u32, distinctive per launch) find its
 * constant bank 0: the parameters sit at 0x210 in it on Hopper.
 * Output: one JSON object per line on stdout.  Usage: capture kernels.cubin */
#include <cuda.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static sigjmp_buf jb;
static void on_fault(int sig) { (void)sig; siglongjmp(jb, 1); }

#define CK(x) do { CUresult r_ = (x); if (r_) { const char *s_; cuGetErrorName(r_, &s_); \
    printf("{\"error\":\"%s\",\"call\":\"%s\"}\n", s_, #x); fflush(stdout); return 0; } } while (0)

static void hexdump(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) printf("%02x", p[i]);
}

static int read_page(const uint8_t *src, uint8_t *dst, size_t n) {
    if (sigsetjmp(jb, 1)) return 0;
    memcpy(dst, src, n);
    return 1;
}

/* Scan every readable mapping (device ones last, capped) for the QMD and the parameters. */
static int scan(const char *variant, unsigned gw, unsigned gh, unsigned bx, unsigned by,
                 unsigned cx, unsigned long long a, unsigned b, int devices) {
    (void)gh;
    FILE *m = fopen("/proc/self/maps", "r");
    char line[512];
    uint8_t *buf = malloc(1 << 16);
    struct timespec t0; clock_gettime(CLOCK_MONOTONIC, &t0);
    int hits = 0, qmds = 0;
    while (fgets(line, sizeof line, m)) {
        unsigned long lo, hi; char perm[8]; char path[256] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255s", &lo, &hi, perm, path) < 3) continue;
        if (perm[0] != 'r') continue;
        int dev = strncmp(path, "/dev/", 5) == 0;
        if (dev != devices) continue;
        if (strstr(path, "[vvar") || strstr(path, "[vsyscall")) continue;
        unsigned long cap = dev ? (64ul << 20) : (1ul << 30);
        if (hi - lo > cap) hi = lo + cap;
        for (unsigned long p = lo; p < hi; p += 1 << 16) {
            struct timespec t1; clock_gettime(CLOCK_MONOTONIC, &t1);
            if (t1.tv_sec - t0.tv_sec > 15) { printf("{\"variant\":\"%s\",\"note\":\"scan time limit\"}\n", variant); goto done; }
            size_t n = (hi - p) < (1ul << 16) ? (hi - p) : (1ul << 16);
            if (!read_page((const uint8_t *)p, buf, n)) continue;
            for (size_t o = 0; o + 8 <= n; o += 4) {
                uint32_t w = *(uint32_t *)(buf + o);
                /* The block's dimensions are unique per case; QMD V04 holds them at dword 36.
                 * Keep every candidate whose grid dword (32) is the grid or the grid in
                 * clusters, so a cluster launch's QMD is found whichever it holds. */
                if (w == (by << 16 | bx) && o >= 144 && o - 144 + 384 <= n) {
                    uint32_t *q = (uint32_t *)(buf + o - 144);
                    if (q[32] == gw || (cx && q[32] == gw / cx)) {
                        printf("{\"variant\":\"%s\",\"kind\":\"qmd\",\"map\":\"%s\",\"addr\":%lu,\"bytes\":\"",
                               variant, path, p + o - 144);
                        hexdump(buf + o - 144, 384); printf("\"}\n"); hits++; qmds++;
                    }
                }
                if (w == (uint32_t)a && *(uint32_t *)(buf + o + 4) == (uint32_t)(a >> 32)
                    && o + 12 <= n && *(uint32_t *)(buf + o + 8) == b && o >= 0x210 && (o % 16) == 0) {
                    printf("{\"variant\":\"%s\",\"kind\":\"cbuf0\",\"map\":\"%s\",\"addr\":%lu,\"bytes\":\"",
                           variant, path, p + o - 0x210);
                    hexdump(buf + o - 0x210, 0x210 + 24); printf("\"}\n"); hits++;
                }
            }
        }
    }
done:
    printf("{\"variant\":\"%s\",\"devices\":%d,\"hits\":%d}\n", variant, devices, hits);
    fflush(stdout);
    free(buf); fclose(m);
    return qmds;
}

typedef struct { const char *name, *fn; unsigned gx, gy, bx, by, cx, cy, shared; int coop, pdl, nonportable; } Case;

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    struct sigaction sa = {0}; sa.sa_handler = on_fault; sa.sa_flags = SA_NODEFER;
    sigaction(SIGSEGV, &sa, 0); sigaction(SIGBUS, &sa, 0);
    CUdevice dev; CUcontext ctx; CUmodule mod; CUstream st;
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx)); CK(cuModuleLoad(&mod, argv[1]));
    CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    int drv; cuDriverGetVersion(&drv);
    printf("{\"driver\":%d}\n", drv);
    Case cases[] = {
        {"plain", "plain", 77770, 3, 33, 3, 0, 0, 0, 0, 0, 0},
        {"plain_shared", "clus", 77774, 1, 34, 3, 0, 0, 48 << 10, 0, 0, 0},
        {"cluster2", "clus", 77772, 3, 35, 3, 2, 1, 1024, 0, 0, 0},
        {"cluster2x2", "clus", 77772, 4, 36, 3, 2, 2, 1024, 0, 0, 0},
        {"cluster4_shared100k", "clus", 77776, 1, 37, 3, 4, 1, 100 << 10, 0, 0, 0},
        {"cluster8", "clus", 77776, 2, 38, 3, 8, 1, 4096, 0, 0, 0},
        {"cluster16_nonportable", "clus", 77792, 1, 39, 3, 16, 1, 4096, 0, 0, 1},
        {"fixed2_declared", "fixed2", 77778, 3, 40, 3, 0, 0, 0, 0, 0, 0},
        {"cooperative", "coop", 66, 2, 41, 3, 0, 0, 0, 1, 0, 0},
        {"pdl", "pdl", 77780, 3, 42, 3, 0, 0, 0, 0, 1, 0},
    };
    for (unsigned i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Case *c = &cases[i];
        CUfunction f; CK(cuModuleGetFunction(&f, mod, c->fn));
        if (c->shared > 48 << 10) CK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, c->shared));
        if (c->nonportable) CK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
        unsigned long long a = 0x1122334455660000ull + i; unsigned b = 0xA5A50000u + i; void *out = 0;
        void *args[] = {&a, &b, &out};
        CUlaunchAttribute at[2]; unsigned na = 0;
        if (c->cx) { at[na].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; at[na].value.clusterDim.x = c->cx;
                     at[na].value.clusterDim.y = c->cy; at[na].value.clusterDim.z = 1; na++; }
        if (c->coop) { at[na].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE; at[na].value.cooperative = 1; na++; }
        if (c->pdl) { at[na].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                      at[na].value.programmaticStreamSerializationAllowed = 1; na++; }
        CUlaunchConfig cfg = {0};
        cfg.gridDimX = c->gx; cfg.gridDimY = c->gy; cfg.gridDimZ = 1;
        cfg.blockDimX = c->bx; cfg.blockDimY = c->by; cfg.blockDimZ = 1;
        cfg.sharedMemBytes = c->shared; cfg.hStream = st; cfg.attrs = at; cfg.numAttrs = na;
        if (c->pdl) { CUfunction p; CK(cuModuleGetFunction(&p, mod, "plain"));
                      void *pa[] = {&a, &b, &out};
                      CK(cuLaunchKernel(p, 1000, 1, 1, 64, 1, 1, 0, st, pa, 0)); }
        CUresult r = cuLaunchKernelEx(&cfg, f, args, 0);
        const char *rs; cuGetErrorName(r, &rs);
        printf("{\"variant\":\"%s\",\"launch\":\"%s\",\"grid\":[%u,%u,1],\"block\":[%u,%u,1],\"cluster\":[%u,%u,1],"
               "\"shared\":%u,\"a\":%llu,\"b\":%u}\n", c->name, rs, c->gx, c->gy, c->bx, c->by, c->cx, c->cy, c->shared, a, b);
        fflush(stdout);
        CK(cuStreamSynchronize(st));
        /* fixed2 declares its cluster in the cubin (__cluster_dims__), not at the launch. */
        unsigned cm = c->cx ? c->cx : (strcmp(c->fn, "fixed2") == 0 ? 2 : 0);
        scan(c->name, c->gx, c->gy, c->bx, c->by, cm, a, b, 0);
        scan(c->name, c->gx, c->gy, c->bx, c->by, cm, a, b, 1);
    }
    return 0;
}
