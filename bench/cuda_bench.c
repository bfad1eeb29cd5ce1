/* The CUDA-from-C peer of rig's benchmark (bench/run.py builds and runs it): the driver API
 * only (cuda.h, -lcuda), on GPU 0, the rows of issue 7 with the same kernel from the same cubin;
 * row 9 (issue 10), copies between GPUs 0 and 1 where the machine has two; and rows 13 and 14
 * (issues 17 and 23): an upload beside kernels on two streams, and launches from 1, 2 and 4
 * threads (pthreads), each on a stream of its own.
 *
 *   cuda_bench CUBIN [--scale F]   every row; one JSON object on stdout
 *   cuda_bench --ctx-once          cuInit + cuCtxCreate + cuCtxDestroy once (run in a fresh
 *                                  process by the harness); one JSON object on stdout
 *
 * Every CUDA call's result is checked. A failing call or a failed verification ends only its
 * row: the row's error goes into "errors" and the next row runs. Samples are seconds per
 * operation; "bytes" is what one operation moved (the harness turns both into its units).
 *
 * Build: nvcc -O2 -o cuda_bench bench/cuda_bench.c -lcuda -lpthread
 *    or: cc -O2 -o cuda_bench bench/cuda_bench.c -I/usr/local/cuda/include -lcuda -lpthread
 */
#include <cuda.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ull * 1024ull)
#define COPY_BYTES (256ull * MIB)
#define MAX_ROWS 64

/* ---- errors: a row ends at its first failure, the program goes on ---------------------- */

static jmp_buf row_jmp;
static int in_row;
static char row_err[1024];

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(row_err, sizeof row_err, fmt, ap);
    va_end(ap);
    if (in_row) longjmp(row_jmp, 1);
    fprintf(stderr, "cuda_bench: %s\n", row_err);
    exit(1);
}

/* What a failed call says: its line, its text and CUDA's name for the result. */
static void cu_error_text(char *buf, size_t n, CUresult r, const char *call, int line) {
    const char *name = NULL, *text = NULL;
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
    if (cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
    snprintf(buf, n, "line %d: %s returned %d (%s: %s)", line, call, (int)r, name ? name : "?",
             text ? text : "?");
}

static void check(CUresult r, const char *call, int line) {
    if (r != CUDA_SUCCESS) {
        char msg[900];
        cu_error_text(msg, sizeof msg, r, call, line);
        fail("%s", msg);
    }
}

#define CK(call) check((call), #call, __LINE__)

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) fail("malloc(%zu) failed", n);
    return p;
}

/* ---- time, random data, results --------------------------------------------------------- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state;

static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static void fill_random(void *p, size_t n) {
    uint64_t *w = (uint64_t *)p;
    size_t i;
    for (i = 0; i < n / 8; i++) w[i] = rnd();
    for (i = n / 8 * 8; i < n; i++) ((unsigned char *)p)[i] = (unsigned char)rnd();
}

static float rnd_float(void) { /* uniform in [0, 1), 24 random bits: exact in float */
    return (float)(rnd() >> 40) / 16777216.0f;
}

struct row {
    const char *key;
    double *samples;
    int n;
    double bytes;
    const char *error;
};

static struct row rows[MAX_ROWS];
static int nrows;

/* --rows: comma-separated keys or prefixes ("1", "5_d2d", "10_h2d"); NULL runs every row.
 * The same rule as run.py's wanted(): an item names a key, or the keys that begin with it and
 * an underscore. */
static const char *row_sel;

static int wanted(const char *key) {
    const char *p = row_sel;
    if (!row_sel) return 1;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n && strncmp(key, p, n) == 0 && (key[n] == 0 || key[n] == '_')) return 1;
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

/* Whether an item of --rows names a key that begins with `group` and an underscore (a row
 * function that records several keys, or whose samples feed a derived row). */
static int group_wanted(const char *group) {
    const char *p = row_sel;
    size_t g = strlen(group);
    if (!row_sel) return 1;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n > g && strncmp(p, group, g) == 0 && p[g] == '_') return 1;
        p += n;
        if (*p == ',') p++;
    }
    return 0;
}

static void add_row(const char *key, double *samples, int n, double bytes) {
    if (nrows == MAX_ROWS) fail("too many rows");
    rows[nrows].key = key;
    rows[nrows].samples = samples;
    rows[nrows].n = n;
    rows[nrows].bytes = bytes;
    rows[nrows].error = NULL;
    nrows++;
}

static void add_error(const char *key, const char *error) {
    char *copy;
    if (nrows == MAX_ROWS) return;
    copy = strdup(error);
    rows[nrows].key = key;
    rows[nrows].samples = NULL;
    rows[nrows].n = 0;
    rows[nrows].bytes = 0;
    rows[nrows].error = copy ? copy : "out of memory";
    nrows++;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

/* ---- the state every row shares ------------------------------------------------------ */

static CUdevice dev;
static CUcontext ctx;
static CUmodule mod;
static CUfunction vadd;
static CUstream stream;
static double scale = 1.0;
/* vadd's operands: a, b, c of 1 float each (4 KiB allocations). */
static CUdeviceptr da, db, dc;
/* The accumulator: rows 2 and 3 run vadd(c, b, c, 1), c += b, once per kernel; the host
 * repeats every addition in float (IEEE single, round to nearest, as the GPU's FADD). */
static float acc_host, acc_b;
static long long acc_count;

static int reps(int n) {
    int r = (int)(n * scale);
    return r < 3 ? 3 : r;
}

static double *samples(int n) { return (double *)xmalloc(sizeof(double) * (size_t)n); }

static CUresult create_context(CUcontext *out) {
#if CUDA_VERSION >= 13000
    return cuCtxCreate(out, NULL, 0, dev);
#else
    return cuCtxCreate(out, 0, dev);
#endif
}

/* vadd(a, b, c, n): c[i] = a[i] + b[i] for i < n, in `grid` blocks of `block` threads. */
static CUresult vadd_on(CUstream s, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, int n,
                        unsigned grid, unsigned block) {
    void *args[4];
    args[0] = &a;
    args[1] = &b;
    args[2] = &c;
    args[3] = &n;
    return cuLaunchKernel(vadd, grid, 1, 1, block, 1, 1, 0, s, args, NULL);
}

static void launch_vadd(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c) {
    CK(vadd_on(stream, a, b, c, 1, 1, 1));
}

static void acc_start(void) {
    acc_host = rnd_float() * 4.0f;
    acc_b = rnd_float();
    acc_count = 0;
    CK(cuMemcpyHtoD(dc, &acc_host, sizeof(float)));
    CK(cuMemcpyHtoD(db, &acc_b, sizeof(float)));
    /* The legacy stream's copies may still be in flight; `stream` does not wait for them. */
    CK(cuCtxSynchronize());
}

static void acc_verify(const char *what) {
    float got;
    long long i;
    CK(cuStreamSynchronize(stream));
    CK(cuMemcpyDtoH(&got, dc, sizeof(float)));
    for (i = 0; i < acc_count; i++) acc_host = acc_host + acc_b;
    acc_count = 0;
    if (memcmp(&got, &acc_host, sizeof(float)) != 0)
        fail("%s: the accumulator holds %.9g, the host computed %.9g", what, (double)got,
             (double)acc_host);
}

static void check_bytes(const void *got, const void *want, size_t n, const char *what) {
    if (memcmp(got, want, n) != 0) fail("%s: the copied bytes differ", what);
}

/* ---- rows ---------------------------------------------------------------------------- */

/* 1: one kernel (1 thread adds one element), launch + cuStreamSynchronize. */
static void row_launch(void) {
    int i, n = reps(5000);
    double *s = samples(n), t;
    float a, b, c;
    a = rnd_float();
    b = rnd_float();
    CK(cuMemcpyHtoD(da, &a, sizeof a));
    CK(cuMemcpyHtoD(db, &b, sizeof b));
    CK(cuMemsetD8(dc, 0, sizeof c));
    CK(cuCtxSynchronize());
    for (i = 0; i < reps(500); i++) {
        launch_vadd(da, db, dc);
        CK(cuStreamSynchronize(stream));
    }
    for (i = 0; i < n; i++) {
        t = now();
        launch_vadd(da, db, dc);
        CK(cuStreamSynchronize(stream));
        s[i] = now() - t;
    }
    CK(cuMemcpyDtoH(&c, dc, sizeof c));
    {
        float want = a + b;
        if (memcmp(&c, &want, sizeof c) != 0)
            fail("vadd wrote %.9g, not %.9g + %.9g", (double)c, (double)a, (double)b);
    }
    add_row("1_launch", s, n, 0);
}

static CUgraphExec capture(int kernels) {
    CUgraph graph;
    CUgraphExec exec;
    int i;
    CK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (i = 0; i < kernels; i++) launch_vadd(dc, db, dc);
    CK(cuStreamEndCapture(stream, &graph));
    CK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    CK(cuGraphDestroy(graph));
    return exec;
}

static CUgraphExec g64, g1;

/* 2: a graph of 64 dependent kernels (captured: each waits for the one before), launch + sync;
 * and a graph of 1. The harness derives (t64 - t1) / 63. */
static void row_graphs(void) {
    int i, n = reps(1000), w = reps(100);
    double *s64 = samples(n), *s1 = samples(n), t;
    acc_start();
    g64 = capture(64);
    g1 = capture(1);
    for (i = 0; i < w; i++) {
        CK(cuGraphLaunch(g64, stream));
        CK(cuStreamSynchronize(stream));
        CK(cuGraphLaunch(g1, stream));
        CK(cuStreamSynchronize(stream));
    }
    acc_count += 65LL * w;
    for (i = 0; i < n; i++) {
        t = now();
        CK(cuGraphLaunch(g64, stream));
        CK(cuStreamSynchronize(stream));
        s64[i] = now() - t;
    }
    acc_count += 64LL * n;
    for (i = 0; i < n; i++) {
        t = now();
        CK(cuGraphLaunch(g1, stream));
        CK(cuStreamSynchronize(stream));
        s1[i] = now() - t;
    }
    acc_count += n;
    acc_verify("graphs");
    add_row("2_step64", s64, n, 0);
    add_row("2_step1", s1, n, 0);
}

/* 3: 10,000 one-kernel graphs launched, then one sync: seconds per graph. Also 10,000 plain
 * kernel launches then one sync (3_launch_flight). */
static void row_flight(void) {
    const int per = 10000;
    int r, i, n = reps(8);
    double *s = samples(n), *sl = samples(n), t;
    if (!g1) g1 = capture(1); /* row 2 not asked for: its graph of one, made here */
    acc_start();
    for (r = -1; r < n; r++) { /* r = -1: warm-up */
        t = now();
        for (i = 0; i < per; i++) CK(cuGraphLaunch(g1, stream));
        CK(cuStreamSynchronize(stream));
        if (r >= 0) s[r] = (now() - t) / per;
    }
    acc_count += (long long)(n + 1) * per;
    for (r = -1; r < n; r++) {
        t = now();
        for (i = 0; i < per; i++) launch_vadd(dc, db, dc);
        CK(cuStreamSynchronize(stream));
        if (r >= 0) sl[r] = (now() - t) / per;
    }
    acc_count += (long long)(n + 1) * per;
    acc_verify("kernels in flight");
    add_row("3_flight", s, n, 0);
    add_row("3_launch_flight", sl, n, 0);
}

static CUdeviceptr big, big2;

/* 4: 256 MiB host->GPU and GPU->host, cuMemcpy from `src` into `dst` buffers. A pageable
 * cuMemcpyHtoD may return before its last DMA is done: cuCtxSynchronize waits for it. */
static void copies(void *src, void *dst, const char *h2d_key, const char *d2h_key) {
    int i, n = reps(20);
    double *sh = samples(n), *sd = samples(n), t;
    fill_random(src, COPY_BYTES);
    memset(dst, 0, COPY_BYTES);
    for (i = 0; i < 2; i++) CK(cuMemcpyHtoD(big, src, COPY_BYTES));
    CK(cuCtxSynchronize());
    for (i = 0; i < n; i++) {
        t = now();
        CK(cuMemcpyHtoD(big, src, COPY_BYTES));
        CK(cuCtxSynchronize());
        sh[i] = now() - t;
    }
    for (i = 0; i < 2; i++) CK(cuMemcpyDtoH(dst, big, COPY_BYTES));
    check_bytes(dst, src, COPY_BYTES, h2d_key);
    memset(dst, 0, COPY_BYTES);
    for (i = 0; i < n; i++) {
        t = now();
        CK(cuMemcpyDtoH(dst, big, COPY_BYTES));
        sd[i] = now() - t;
    }
    check_bytes(dst, src, COPY_BYTES, d2h_key);
    add_row(h2d_key, sh, n, (double)COPY_BYTES);
    add_row(d2h_key, sd, n, (double)COPY_BYTES);
}

static void row_pinned(void) {
    void *src = NULL, *dst = NULL;
    CK(cuMemAllocHost(&src, COPY_BYTES));
    CK(cuMemAllocHost(&dst, COPY_BYTES));
    copies(src, dst, "4_h2d_pinned", "4_d2h_pinned");
    CK(cuMemFreeHost(src));
    CK(cuMemFreeHost(dst));
}

static void *page_src, *page_dst;

static void row_pageable(void) {
    page_src = xmalloc(COPY_BYTES);
    page_dst = xmalloc(COPY_BYTES);
    copies(page_src, page_dst, "4_h2d_pageable", "4_d2h_pageable");
}

/* 5: 256 MiB GPU->GPU within GPU 0 (cuMemcpyDtoD, then cuCtxSynchronize: a device-to-device
 * copy may return before it is done). */
static void row_d2d(void) {
    int i, n = reps(30);
    double *s = samples(n), t;
    if (!page_src) page_src = xmalloc(COPY_BYTES);
    if (!page_dst) page_dst = xmalloc(COPY_BYTES);
    fill_random(page_src, COPY_BYTES);
    CK(cuMemcpyHtoD(big, page_src, COPY_BYTES));
    CK(cuMemsetD8(big2, 0, COPY_BYTES));
    for (i = 0; i < 3; i++) CK(cuMemcpyDtoD(big2, big, COPY_BYTES));
    CK(cuCtxSynchronize());
    CK(cuMemsetD8(big2, 0, COPY_BYTES));
    CK(cuCtxSynchronize());
    for (i = 0; i < n; i++) {
        t = now();
        CK(cuMemcpyDtoD(big2, big, COPY_BYTES));
        CK(cuCtxSynchronize());
        s[i] = now() - t;
    }
    memset(page_dst, 0, COPY_BYTES);
    CK(cuMemcpyDtoH(page_dst, big2, COPY_BYTES));
    check_bytes(page_dst, page_src, COPY_BYTES, "5_d2d");
    add_row("5_d2d", s, n, (double)COPY_BYTES);
}

/* 6: cuMemAlloc + cuMemFree. */
static void alloc_free(size_t size, int count, const char *key) {
    int i, n = reps(count);
    double *s = samples(n), t;
    CUdeviceptr p;
    for (i = 0; i < reps(count / 10); i++) {
        CK(cuMemAlloc(&p, size));
        CK(cuMemFree(p));
    }
    for (i = 0; i < n; i++) {
        t = now();
        CK(cuMemAlloc(&p, size));
        CK(cuMemFree(p));
        s[i] = now() - t;
    }
    add_row(key, s, n, (double)size);
}

static void row_alloc_small(void) { alloc_free(64 * 1024, 2000, "6_alloc_64k"); }
static void row_alloc_large(void) { alloc_free(64 * MIB, 300, "6_alloc_64m"); }
static void row_alloc_huge(void) { alloc_free(1024 * MIB, 20, "6_alloc_1g"); }

/* 10: copy time by size, 4 KiB to 1 GiB, pinned H2D and D2H and D2D, each copy waited for.
 * Keys 10_{h2d,d2h,d2d}_{4k,64k,1m,16m,256m,1g}; run.py's SWEEP names the same sizes. */
static const size_t sweep_sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1u << 30};
static const char *sweep_names[] = {"4k", "64k", "1m", "16m", "256m", "1g"};
static char sweep_keys[3][6][24];

static void row_sweep(void) {
    size_t top = sweep_sizes[5];
    void *hsrc = NULL, *hdst = NULL;
    CUdeviceptr g1, g2;
    int k, i, j;
    CK(cuMemAllocHost(&hsrc, top));
    CK(cuMemAllocHost(&hdst, top));
    CK(cuMemAlloc(&g1, top));
    CK(cuMemAlloc(&g2, top));
    fill_random(hsrc, top);
    /* g1 holds the source's bytes before any row, so D2H and D2D check out without H2D. */
    CK(cuMemcpyHtoD(g1, hsrc, top));
    for (j = 0; j < 6; j++) {
        size_t n_b = sweep_sizes[j];
        int n = reps(n_b >= (256u << 20) ? 10 : 200);
        for (k = 0; k < 3; k++) {
            double *s = samples(n), t;
            snprintf(sweep_keys[k][j], sizeof sweep_keys[k][j], "10_%s_%s",
                     k == 0 ? "h2d" : k == 1 ? "d2h" : "d2d", sweep_names[j]);
            if (!wanted(sweep_keys[k][j])) continue;
            for (i = -2; i < n; i++) {
                t = now();
                if (k == 0) CK(cuMemcpyHtoDAsync(g1, hsrc, n_b, stream));
                else if (k == 1) CK(cuMemcpyDtoHAsync(hdst, g1, n_b, stream));
                else CK(cuMemcpyDtoDAsync(g2, g1, n_b, stream));
                CK(cuStreamSynchronize(stream));
                if (i >= 0) s[i] = now() - t;
            }
            if (k == 1) check_bytes(hdst, hsrc, n_b, sweep_keys[k][j]);
            if (k == 2) {
                memset(hdst, 0, n_b);
                CK(cuMemcpyDtoH(hdst, g2, n_b));
                check_bytes(hdst, hsrc, n_b, sweep_keys[k][j]);
            }
            add_row(sweep_keys[k][j], s, n, (double)n_b);
        }
    }
    CK(cuMemFree(g1));
    CK(cuMemFree(g2));
    CK(cuMemFreeHost(hsrc));
    CK(cuMemFreeHost(hdst));
}

/* 11: CPU seconds per second of waiting: eight 256 MiB D2D copies queued, then the process's
 * CPU time and the wall time across cuStreamSynchronize alone. The context's scheduling is
 * CUDA's default (CU_CTX_SCHED_AUTO), as a program gets it. */
static void row_wait_cpu(void) {
    int r, i, n = reps(10);
    double *s = samples(n);
    for (r = 0; r < n; r++) {
        struct timespec c0, c1;
        double t;
        for (i = 0; i < 8; i++) CK(cuMemcpyDtoDAsync(big2, big, COPY_BYTES, stream));
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        t = now();
        CK(cuStreamSynchronize(stream));
        t = now() - t;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        s[r] = ((double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec)) / t;
    }
    add_row("11_wait_cpu", s, n, 0);
}

/* ---- 13 and 14 (issue 17): two streams side by side; launches from several threads ------- */

/* The sizes of bench/worker_queues.py (UPLOAD, WORK, VADDS, THREADS), which rig and torch
 * run. */
#define UPLOAD_BYTES (1024ull * MIB)
#define WORK (64 << 20) /* floats each of row 13's vadds adds: 768 MiB of traffic */
#define VADDS 48  /* the same count for every peer: ~0.4 ms each, ~the upload's time */
#define CHECK_CHUNK (64ull * MIB)
#define MAX_THREADS 4

/* worker_queues.py's OVERLAP_KEYS and THREAD_KEYS. */
static const char *const overlap_keys[] = {"13_overlap", "13_overlap_upload",
                                           "13_overlap_kernels", "13_overlap_both"};
static const char *const thread_keys[] = {"14_threads_1", "14_threads_2", "14_threads_4"};

/* Given back after a row, whatever it left: each call made, the first failure kept. */
static char release_err[900];

static void released(CUresult r, const char *call, int line) {
    if (r != CUDA_SUCCESS && !release_err[0])
        cu_error_text(release_err, sizeof release_err, r, call, line);
}

#define RL(call) released((call), #call, __LINE__)

/* Row 13's streams and buffers: the upload's pinned source and GPU destination; the kernels'
 * operands a, b, c (WORK floats each) and their host copies; a buffer for reading back. */
static CUstream ov_copier, ov_worker;
static void *ov_pinned;
static CUdeviceptr ov_dst, ov_a, ov_b, ov_c;
static float *ov_ha, *ov_hb;
static unsigned char *ov_back;
static int ov_count;

static void ov_upload(void) {
    CK(cuMemcpyHtoDAsync(ov_dst, ov_pinned, UPLOAD_BYTES, ov_copier));
}

/* VADDS vadds on the worker stream, each waiting for the one before (one stream). */
static void ov_kernels(void) {
    int i;
    for (i = 0; i < ov_count; i++)
        CK(vadd_on(ov_worker, ov_a, ov_b, ov_c, WORK, (WORK + 255) / 256, 256));
}

/* The last round's both, read back whole: the upload byte for byte against its random source,
 * c against a + b computed here in float (IEEE single, round to nearest, as the GPU's FADD). */
static void ov_check(void) {
    size_t off, i, per = CHECK_CHUNK / sizeof(float);
    for (off = 0; off < UPLOAD_BYTES; off += CHECK_CHUNK) {
        memset(ov_back, 0, CHECK_CHUNK);
        CK(cuMemcpyDtoH(ov_back, ov_dst + off, CHECK_CHUNK));
        check_bytes(ov_back, (unsigned char *)ov_pinned + off, CHECK_CHUNK, "13 the upload");
    }
    for (off = 0; off < (size_t)WORK; off += per) {
        const float *got = (const float *)ov_back;
        memset(ov_back, 0, CHECK_CHUNK);
        CK(cuMemcpyDtoH(ov_back, ov_c + off * sizeof(float), per * sizeof(float)));
        for (i = 0; i < per; i++) {
            float want = ov_ha[off + i] + ov_hb[off + i];
            if (memcmp(&got[i], &want, sizeof want) != 0)
                fail("13 the kernels: c[%zu] holds %.9g, not %.9g + %.9g", off + i,
                     (double)got[i], (double)ov_ha[off + i], (double)ov_hb[off + i]);
        }
    }
}

/* 13: a 1 GiB upload from pinned memory (cuMemcpyHtoDAsync) on one non-blocking stream while
 * VADDS dependent vadds run on another. Each round (the first warms up): the upload alone,
 * the kernels alone, then both started together (the upload first) and both synchronized; a
 * sample of 13_overlap is both over the longer alone, in the same round. Every peer runs VADDS of them. */
static void row_overlap(void) {
    int r, i, n = reps(10);
    double *s = samples(n), *su = samples(n), *sk = samples(n), *sb = samples(n);
    double t, up, ker, both;
    CK(cuStreamCreate(&ov_copier, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&ov_worker, CU_STREAM_NON_BLOCKING));
    CK(cuMemAllocHost(&ov_pinned, UPLOAD_BYTES));
    CK(cuMemAlloc(&ov_dst, UPLOAD_BYTES));
    CK(cuMemAlloc(&ov_a, WORK * sizeof(float)));
    CK(cuMemAlloc(&ov_b, WORK * sizeof(float)));
    CK(cuMemAlloc(&ov_c, WORK * sizeof(float)));
    ov_ha = (float *)xmalloc(WORK * sizeof(float));
    ov_hb = (float *)xmalloc(WORK * sizeof(float));
    ov_back = (unsigned char *)xmalloc(CHECK_CHUNK);
    fill_random(ov_pinned, UPLOAD_BYTES);
    for (i = 0; i < WORK; i++) {
        ov_ha[i] = rnd_float();
        ov_hb[i] = rnd_float();
    }
    CK(cuMemcpyHtoD(ov_a, ov_ha, WORK * sizeof(float)));
    CK(cuMemcpyHtoD(ov_b, ov_hb, WORK * sizeof(float)));
    CK(cuCtxSynchronize());
    CK(vadd_on(ov_worker, ov_a, ov_b, ov_c, WORK, (WORK + 255) / 256, 256)); /* warms up */
    CK(cuStreamSynchronize(ov_worker));
    ov_count = VADDS;
    for (r = 0; r <= n; r++) {
        t = now();
        ov_upload();
        CK(cuStreamSynchronize(ov_copier));
        up = now() - t;
        t = now();
        ov_kernels();
        CK(cuStreamSynchronize(ov_worker));
        ker = now() - t;
        /* Zero what both write, so that the check sees the last round's both. */
        CK(cuMemsetD8Async(ov_dst, 0, UPLOAD_BYTES, ov_copier));
        CK(cuMemsetD8Async(ov_c, 0, WORK * sizeof(float), ov_worker));
        CK(cuStreamSynchronize(ov_copier));
        CK(cuStreamSynchronize(ov_worker));
        t = now();
        ov_upload();
        ov_kernels();
        CK(cuStreamSynchronize(ov_copier));
        CK(cuStreamSynchronize(ov_worker));
        both = now() - t;
        if (r) {
            su[r - 1] = up;
            sk[r - 1] = ker;
            sb[r - 1] = both;
            s[r - 1] = both / (up > ker ? up : ker);
        }
    }
    ov_check();
    add_row(overlap_keys[0], s, n, 0);
    add_row(overlap_keys[1], su, n, (double)UPLOAD_BYTES);
    add_row(overlap_keys[2], sk, n, 0);
    add_row(overlap_keys[3], sb, n, 0);
}

static void ov_release(void) {
    RL(cuCtxSynchronize());
    if (ov_dst) RL(cuMemFree(ov_dst));
    if (ov_a) RL(cuMemFree(ov_a));
    if (ov_b) RL(cuMemFree(ov_b));
    if (ov_c) RL(cuMemFree(ov_c));
    if (ov_pinned) RL(cuMemFreeHost(ov_pinned));
    if (ov_copier) RL(cuStreamDestroy(ov_copier));
    if (ov_worker) RL(cuStreamDestroy(ov_worker));
    free(ov_ha);
    free(ov_hb);
    free(ov_back);
    ov_dst = ov_a = ov_b = ov_c = 0;
    ov_pinned = NULL;
    ov_copier = ov_worker = NULL;
    ov_ha = ov_hb = NULL;
    ov_back = NULL;
}

/* Row 14's threads: each its own stream and its own a, b, c (one float each). A thread's
 * failure goes into its err; the main thread turns it into the row's error after the join. */
struct launcher {
    pthread_t thread;
    CUstream stream;
    CUdeviceptr a, b, c;
    float ha, hb;
    int count;
    char err[900];
};

static struct launcher launchers[MAX_THREADS];
static atomic_int th_ready, th_go; /* th_go: 0 wait, 1 go, 2 give up (a thread not made) */

#define TRY(l, call)                                                                         \
    do {                                                                                     \
        CUresult r_ = (call);                                                                \
        if (r_ != CUDA_SUCCESS) {                                                            \
            cu_error_text((l)->err, sizeof (l)->err, r_, #call, __LINE__);                   \
            return NULL;                                                                     \
        }                                                                                    \
    } while (0)

static void *launch_thread(void *arg) {
    struct launcher *l = (struct launcher *)arg;
    CUresult r = cuCtxSetCurrent(ctx);
    int i;
    if (r != CUDA_SUCCESS)
        cu_error_text(l->err, sizeof l->err, r, "cuCtxSetCurrent(ctx)", __LINE__);
    atomic_fetch_add(&th_ready, 1);
    if (r != CUDA_SUCCESS) return NULL;
    /* Spin: every thread starts at once, as worker_queues.py's barrier starts them. */
    while (atomic_load(&th_go) == 0) {
    }
    if (atomic_load(&th_go) != 1) return NULL;
    for (i = 0; i < l->count; i++) TRY(l, vadd_on(l->stream, l->a, l->b, l->c, 1, 1, 1));
    TRY(l, cuStreamSynchronize(l->stream));
    return NULL;
}

/* n threads each launching `count` times on its own stream, then synchronizing it: the wall
 * time from their start to the last join. */
static double launch_round(int n, int count) {
    int i, made, e = 0;
    double t;
    atomic_store(&th_ready, 0);
    atomic_store(&th_go, 0);
    for (i = 0; i < n; i++) {
        launchers[i].count = count;
        launchers[i].err[0] = 0;
    }
    for (made = 0; made < n; made++) {
        e = pthread_create(&launchers[made].thread, NULL, launch_thread, &launchers[made]);
        if (e) break;
    }
    while (atomic_load(&th_ready) < made) {
    }
    t = now();
    atomic_store(&th_go, e ? 2 : 1);
    for (i = 0; i < made; i++)
        if (pthread_join(launchers[i].thread, NULL) != 0 && !launchers[i].err[0])
            snprintf(launchers[i].err, sizeof launchers[i].err, "pthread_join failed");
    t = now() - t;
    if (e) fail("pthread_create: %s", strerror(e));
    for (i = 0; i < n; i++)
        if (launchers[i].err[0]) fail("thread %d: %s", i, launchers[i].err);
    return t;
}

/* 14: launches per second from 1, 2 and 4 threads, each with the context current in it and a
 * non-blocking stream of its own, launching vadd (n = 1) 20,000 times, then synchronizing its
 * stream. Each round (the first warms up) zeroes every thread's c first and checks c = a + b
 * after; a sample is the round's wall time over all its launches. */
static void row_threads(void) {
    static const int counts[3] = {1, 2, 4};
    int k, r, i, count = reps(20000), rounds = reps(5);
    for (i = 0; i < MAX_THREADS; i++) {
        struct launcher *l = &launchers[i];
        CK(cuStreamCreate(&l->stream, CU_STREAM_NON_BLOCKING));
        CK(cuMemAlloc(&l->a, 4096));
        CK(cuMemAlloc(&l->b, 4096));
        CK(cuMemAlloc(&l->c, 4096));
        l->ha = rnd_float();
        l->hb = rnd_float();
        CK(cuMemcpyHtoD(l->a, &l->ha, sizeof l->ha));
        CK(cuMemcpyHtoD(l->b, &l->hb, sizeof l->hb));
    }
    for (k = 0; k < 3; k++) {
        double *s, t;
        if (!wanted(thread_keys[k])) continue;
        s = samples(rounds);
        for (r = 0; r <= rounds; r++) {
            for (i = 0; i < counts[k]; i++) CK(cuMemsetD8(launchers[i].c, 0, sizeof(float)));
            CK(cuCtxSynchronize());
            t = launch_round(counts[k], count);
            for (i = 0; i < counts[k]; i++) {
                float got, want = launchers[i].ha + launchers[i].hb;
                CK(cuMemcpyDtoH(&got, launchers[i].c, sizeof got));
                if (memcmp(&got, &want, sizeof got) != 0)
                    fail("%s: thread %d's vadd wrote %.9g, not %.9g + %.9g", thread_keys[k], i,
                         (double)got, (double)launchers[i].ha, (double)launchers[i].hb);
            }
            if (r) s[r - 1] = t / ((double)counts[k] * count);
        }
        add_row(thread_keys[k], s, rounds, 0);
    }
}

static void threads_release(void) {
    int i;
    RL(cuCtxSynchronize());
    for (i = 0; i < MAX_THREADS; i++) {
        struct launcher *l = &launchers[i];
        if (l->a) RL(cuMemFree(l->a));
        if (l->b) RL(cuMemFree(l->b));
        if (l->c) RL(cuMemFree(l->c));
        if (l->stream) RL(cuStreamDestroy(l->stream));
        l->a = l->b = l->c = 0;
        l->stream = NULL;
    }
}

/* Give back what a row holds; a failure there is the error of `key` (no table row: the JSON
 * and stderr tell it). */
static void release(void (*fn)(void), const char *key) {
    release_err[0] = 0;
    fn();
    if (release_err[0]) {
        fprintf(stderr, "cuda_bench: %s: %s\n", key, release_err);
        add_error(key, release_err);
    }
}

/* 7 (in-process part): with cuInit done and the benchmark's context destroyed, create and
 * destroy a context again and again. The harness times the fresh-process part (--ctx-once). */
static void row_ctx(void) {
    int i, n = reps(8);
    double *s = samples(n), t;
    CUcontext c;
    for (i = 0; i < n; i++) {
        t = now();
        CK(create_context(&c));
        CK(cuCtxDestroy(c));
        s[i] = now() - t;
    }
    add_row("7_open_stop_inproc", s, n, 0);
}

/* 9: 256 MiB GPU 0 -> GPU 1 and GPU 1 -> GPU 0 (issue 10), between the two GPUs' primary
 * contexts with peer access enabled both ways: cuMemcpyPeerAsync on a stream of the source's
 * context, then cuStreamSynchronize. Runs after the benchmark's own context is gone; with
 * fewer than two GPUs both rows are errors ("one GPU here"), shown as n/a. */
static int gpu_count = -1, peer_access_01 = -1, peer_access_10 = -1, peer_ready;
static CUdevice pdev[2];
static CUcontext pctx[2];
static int pctx_held[2];
static CUstream pstream[2];
static CUdeviceptr pbuf[2];
static void *peer_src, *peer_dst;

static void row_peer_setup(void) {
    int i;
    CUresult r;
    CK(cuDeviceGetCount(&gpu_count));
    if (gpu_count == 1) fail("one GPU here");
    if (gpu_count < 2) fail("%d GPUs here, the peer rows need two", gpu_count);
    CK(cuDeviceGet(&pdev[0], 0));
    CK(cuDeviceGet(&pdev[1], 1));
    CK(cuDeviceCanAccessPeer(&peer_access_01, pdev[0], pdev[1]));
    CK(cuDeviceCanAccessPeer(&peer_access_10, pdev[1], pdev[0]));
    if (!peer_access_01 || !peer_access_10)
        fail("no peer access: cuDeviceCanAccessPeer says GPU 0 -> 1 %d, GPU 1 -> 0 %d",
             peer_access_01, peer_access_10);
    for (i = 0; i < 2; i++) {
        CK(cuDevicePrimaryCtxRetain(&pctx[i], pdev[i]));
        pctx_held[i] = 1;
    }
    for (i = 0; i < 2; i++) {
        CK(cuCtxSetCurrent(pctx[i]));
        r = cuCtxEnablePeerAccess(pctx[1 - i], 0);
        if (r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
            check(r, "cuCtxEnablePeerAccess(pctx[1 - i], 0)", __LINE__);
        CK(cuStreamCreate(&pstream[i], CU_STREAM_NON_BLOCKING));
        CK(cuMemAlloc(&pbuf[i], COPY_BYTES));
    }
    peer_src = xmalloc(COPY_BYTES);
    peer_dst = xmalloc(COPY_BYTES);
    peer_ready = 1;
}

static void peer_copy(int from, int to) {
    CK(cuMemcpyPeerAsync(pbuf[to], pctx[to], pbuf[from], pctx[from], COPY_BYTES, pstream[from]));
    CK(cuStreamSynchronize(pstream[from]));
}

/* Zero GPU `to`'s buffer and wait (the legacy stream's memset; the copies' stream does not
 * wait for it by itself). */
static void peer_clear(int to) {
    CK(cuCtxSetCurrent(pctx[to]));
    CK(cuMemsetD8(pbuf[to], 0, COPY_BYTES));
    CK(cuCtxSynchronize());
}

static void peer_fetch(int to) {
    memset(peer_dst, 0, COPY_BYTES);
    CK(cuCtxSetCurrent(pctx[to]));
    CK(cuMemcpyDtoH(peer_dst, pbuf[to], COPY_BYTES));
}

static void peer_row(int from, int to, const char *key) {
    int i, n = reps(30);
    double *s = samples(n), t;
    if (!peer_ready) fail("no peer buffers (the setup failed)");
    fill_random(peer_src, COPY_BYTES);
    CK(cuCtxSetCurrent(pctx[from]));
    CK(cuMemcpyHtoD(pbuf[from], peer_src, COPY_BYTES));
    CK(cuCtxSynchronize());
    peer_clear(to);
    CK(cuCtxSetCurrent(pctx[from]));
    peer_copy(from, to);
    peer_fetch(to);
    check_bytes(peer_dst, peer_src, COPY_BYTES, key);
    peer_clear(to);
    CK(cuCtxSetCurrent(pctx[from]));
    for (i = 0; i < 2; i++) peer_copy(from, to);
    for (i = 0; i < n; i++) {
        t = now();
        peer_copy(from, to);
        s[i] = now() - t;
    }
    peer_fetch(to);
    check_bytes(peer_dst, peer_src, COPY_BYTES, key);
    add_row(key, s, n, (double)COPY_BYTES);
}

static void row_peer_01(void) { peer_row(0, 1, "9_peer_01"); }
static void row_peer_10(void) { peer_row(1, 0, "9_peer_10"); }

/* Give back the peer rows' buffers, streams and primary contexts (released, so destroyed:
 * row 7 then times contexts with none other alive), whatever the rows left. */
static void peer_cleanup(void) {
    int i;
    free(peer_src);
    free(peer_dst);
    peer_src = peer_dst = NULL;
    peer_ready = 0;
    for (i = 0; i < 2; i++) {
        if (!pctx_held[i]) continue;
        CK(cuCtxSetCurrent(pctx[i]));
        CK(cuCtxSynchronize());
        if (pbuf[i]) CK(cuMemFree(pbuf[i]));
        pbuf[i] = 0;
        if (pstream[i]) CK(cuStreamDestroy(pstream[i]));
        pstream[i] = NULL;
    }
    CK(cuCtxSetCurrent(NULL));
    for (i = 0; i < 2; i++) {
        if (!pctx_held[i]) continue;
        pctx_held[i] = 0;
        CK(cuDevicePrimaryCtxRelease(pdev[i]));
    }
}

static int has_row(const char *key) {
    int i;
    for (i = 0; i < nrows; i++)
        if (strcmp(rows[i].key, key) == 0) return 1;
    return 0;
}

/* Run a row unless --rows leaves out all its keys; a failure becomes the error of each of its
 * keys it did not record. */
static void run_keys(void (*fn)(void), const char *const *keys, int n) {
    int i, any = group_wanted(keys[0]);
    for (i = 0; i < n; i++) any = any || wanted(keys[i]);
    if (!any) return;
    in_row = 1;
    if (setjmp(row_jmp) == 0) fn();
    else {
        fprintf(stderr, "cuda_bench: %s: %s\n", keys[0], row_err);
        for (i = 0; i < n; i++)
            if (!has_row(keys[i])) add_error(keys[i], row_err);
    }
    in_row = 0;
}

/* Run a giving-back step whatever --rows says; a failure is the error of `key`. */
static void run_anyway(void (*fn)(void), const char *key) {
    in_row = 1;
    if (setjmp(row_jmp) == 0) fn();
    else {
        fprintf(stderr, "cuda_bench: %s: %s\n", key, row_err);
        add_error(key, row_err);
    }
    in_row = 0;
}

static void run_row(void (*fn)(void), const char *key1, const char *key2) {
    const char *keys[2];
    keys[0] = key1;
    keys[1] = key2;
    run_keys(fn, keys, key2 ? 2 : 1);
}

static void cleanup(void) {
    CK(cuCtxSynchronize());
    if (g64) CK(cuGraphExecDestroy(g64));
    if (g1) CK(cuGraphExecDestroy(g1));
    if (mod) CK(cuModuleUnload(mod));
    CK(cuMemFree(da));
    CK(cuMemFree(db));
    CK(cuMemFree(dc));
    CK(cuMemFree(big));
    CK(cuMemFree(big2));
    CK(cuStreamDestroy(stream));
    CK(cuCtxDestroy(ctx));
}

static int ctx_once(void) {
    CUcontext c;
    double t0, t1, t2, t3;
    t0 = now();
    CK(cuInit(0));
    t1 = now();
    CK(cuDeviceGet(&dev, 0));
    CK(create_context(&c));
    t2 = now();
    CK(cuCtxDestroy(c));
    t3 = now();
    printf("{\"init_s\": %.9g, \"create_s\": %.9g, \"destroy_s\": %.9g, \"total_s\": %.9g}\n",
           t1 - t0, t2 - t1, t3 - t2, t3 - t0);
    return 0;
}

static unsigned char *read_file(const char *path, size_t *size);

/* 7, what a user pays in a fresh process: cuInit, a context, the module, a first launch of
 * vadd (n = 1) waited for, a first 4 KiB copy each way, and the context destroyed. */
static int first_use(const char *cubin_path) {
    CUcontext c;
    CUmodule m;
    CUfunction f;
    CUdeviceptr p;
    unsigned char host[4096], back[4096];
    size_t size;
    unsigned char *cubin;
    double t0, t1;
    int one = 1;
    void *args[4];
    t0 = now();
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(create_context(&c));
    cubin = read_file(cubin_path, &size);
    CK(cuModuleLoadData(&m, cubin));
    CK(cuModuleGetFunction(&f, m, "vadd"));
    CK(cuMemAlloc(&p, sizeof host));
    args[0] = &p;
    args[1] = &p;
    args[2] = &p;
    args[3] = &one;
    CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    CK(cuCtxSynchronize());
    fill_random(host, sizeof host);
    CK(cuMemcpyHtoD(p, host, sizeof host));
    CK(cuMemcpyDtoH(back, p, sizeof back));
    if (memcmp(host, back, sizeof host) != 0) fail("first use: the copy came back changed");
    CK(cuCtxDestroy(c));
    t1 = now();
    free(cubin);
    printf("{\"total_s\": %.9g}\n", t1 - t0);
    return 0;
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *data;
    long n;
    if (!f) fail("cannot open %s", path);
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        fail("cannot read the size of %s", path);
    }
    data = (unsigned char *)xmalloc((size_t)n);
    if (fread(data, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        fail("cannot read %s", path);
    }
    fclose(f);
    *size = (size_t)n;
    return data;
}

int main(int argc, char **argv) {
    const char *cubin_path = NULL;
    unsigned char *cubin;
    size_t cubin_size;
    char name[256];
    int driver = 0, major = 0, minor = 0, i, j;
    double t0, t_init, t_ctx;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--ctx-once") == 0) return ctx_once();
        if (strcmp(argv[i], "--first-use") == 0 && i + 1 < argc) return first_use(argv[i + 1]);
        if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
            row_sel = argv[++i];
            continue;
        }
        if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc) {
            scale = atof(argv[++i]);
            if (!(scale > 0)) scale = 1.0;
        } else if (argv[i][0] != '-' && !cubin_path) cubin_path = argv[i];
        else {
            fprintf(stderr, "usage: %s CUBIN [--scale F] [--rows LIST] | --ctx-once | --first-use CUBIN\n", argv[0]);
            return 2;
        }
    }
    if (!cubin_path) {
        fprintf(stderr, "usage: %s CUBIN [--scale F] [--rows LIST] | --ctx-once | --first-use CUBIN\n", argv[0]);
        return 2;
    }
    rng_state = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^ 0x9E3779B97F4A7C15ull;
    if (!rng_state) rng_state = 1;

    t0 = now();
    CK(cuInit(0));
    t_init = now() - t0;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetName(name, sizeof name, dev));
    CK(cuDriverGetVersion(&driver));
    CK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    t0 = now();
    CK(create_context(&ctx));
    t_ctx = now() - t0;
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc(&da, 4096));
    CK(cuMemAlloc(&db, 4096));
    CK(cuMemAlloc(&dc, 4096));
    CK(cuMemAlloc(&big, COPY_BYTES));
    CK(cuMemAlloc(&big2, COPY_BYTES));

    in_row = 1;
    if (setjmp(row_jmp) == 0) {
        cubin = read_file(cubin_path, &cubin_size);
        CK(cuModuleLoadData(&mod, cubin));
        CK(cuModuleGetFunction(&vadd, mod, "vadd"));
        free(cubin);
    } else {
        fprintf(stderr, "cuda_bench: the cubin: %s\n", row_err);
        add_error("1_launch", row_err);
        add_error("2_step64", row_err);
        add_error("2_step1", row_err);
        add_error("3_flight", row_err);
        add_error("3_launch_flight", row_err);
        for (i = 0; i < 4; i++) add_error(overlap_keys[i], row_err);
        for (i = 0; i < 3; i++) add_error(thread_keys[i], row_err);
        vadd = NULL;
        mod = NULL;
    }
    in_row = 0;
    if (vadd) {
        run_row(row_launch, "1_launch", NULL);
        run_row(row_graphs, "2_step64", "2_step1");
        run_row(row_flight, "3_flight", "3_launch_flight");
    }
    run_row(row_pinned, "4_h2d_pinned", "4_d2h_pinned");
    run_row(row_pageable, "4_h2d_pageable", "4_d2h_pageable");
    run_row(row_d2d, "5_d2d", NULL);
    run_row(row_alloc_small, "6_alloc_64k", NULL);
    run_row(row_alloc_large, "6_alloc_64m", NULL);
    run_row(row_alloc_huge, "6_alloc_1g", NULL);
    run_row(row_sweep, "10", NULL);
    run_row(row_wait_cpu, "11_wait_cpu", NULL);
    if (vadd) {
        run_keys(row_overlap, overlap_keys, 4);
        release(ov_release, "13_overlap_release");
        run_keys(row_threads, thread_keys, 3);
        release(threads_release, "14_threads_release");
    }

    /* Give everything back, then time contexts with cuInit done. */
    run_anyway(cleanup, "cleanup");
    free(page_src);
    free(page_dst);
    run_row(row_peer_setup, "9_peer_01", "9_peer_10");
    if (peer_ready) {
        run_row(row_peer_01, "9_peer_01", NULL);
        run_row(row_peer_10, "9_peer_10", NULL);
    }
    run_anyway(peer_cleanup, "9_peer_cleanup");
    run_row(row_ctx, "7_open_stop_inproc", NULL);

    printf("{\"meta\": {\"device\": ");
    json_string(name);
    printf(", \"driver_api_version\": %d, \"cuda_h_version\": %d, \"compute_capability\": "
           "\"%d.%d\", \"cubin\": ",
           driver, CUDA_VERSION, major, minor);
    json_string(cubin_path);
    printf(", \"scale\": %g, \"first_init_s\": %.9g, \"first_ctx_create_s\": %.9g, "
           "\"gpu_count\": %d, \"peer_access\": [%d, %d], \"overlap_vadds\": %d},\n",
           scale, t_init, t_ctx, gpu_count, peer_access_01, peer_access_10, ov_count);
    printf(" \"rows\": {");
    for (i = 0; i < nrows; i++) {
        struct row *r = &rows[i];
        printf("%s\n  ", i ? "," : "");
        json_string(r->key);
        if (r->error) {
            printf(": {\"error\": ");
            json_string(r->error);
            printf("}");
            continue;
        }
        printf(": {\"bytes\": %.0f, \"samples_s\": [", r->bytes);
        for (j = 0; j < r->n; j++) printf("%s%.9g", j ? ", " : "", r->samples[j]);
        qsort(r->samples, (size_t)r->n, sizeof(double), cmp_double);
        printf("], \"median_s\": %.9g, \"min_s\": %.9g, \"max_s\": %.9g}",
               r->n % 2 ? r->samples[r->n / 2]
                        : 0.5 * (r->samples[r->n / 2 - 1] + r->samples[r->n / 2]),
               r->samples[0], r->samples[r->n - 1]);
    }
    printf("\n }}\n");
    return 0;
}
