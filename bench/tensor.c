/* bench/tensor.c - CPU performance of dt_tensor.h, each figure beside a peer measured in the
   same run on the same machine (DESIGN.md, Benchmarks):
     1. GEMM through dt (dt_matmul_fwd with DT_CBLAS) against cblas_sgemm called directly,
        same shapes, OpenBLAS's default thread count. Target: dt/cblas >= 0.95.
     2. The portable GEMM (dt_gemm_portable, one thread) against cblas_sgemm with its default
        threads and with openblas_set_num_threads(1). Aim: >= 0.3 of the one-thread figure.
     3. Memory-bound ops in GB/s against memcpy of the same 64 MiB buffers (well above the
        caches), one thread.
     4. bf16 linears (dt_linear_fwd / _bwd with a bf16 w: AMX, AVX512_BF16 or the f32
        fallback, as dt_cpu_bf16_gemm names) at GPT L4 C256 T256 B8's shapes against
        cblas_sgemm of the same f32 GEMM, one thread each.
   Every figure is the median of REPS timed runs after one warm-up run; CLOCK_MONOTONIC.

   build (what ./build.sh does):
       gcc -std=c99 -O2 -Wall -Wextra -Werror -DDT_CBLAS -I. bench/tensor.c -o build/bench/tensor \
           -lopenblas -lm
   run:  build/bench/tensor               everything (about 30 s on 2 idle cores)
         build/bench/tensor --portable    section 2 only
         build/bench/tensor --bf16        section 4 only
   The portable GEMM is plain C that the compiler vectorises, so its speed depends on the flags:
   -O2 alone targets SSE2. For the figure with the machine's full vector ISA build it again as
       gcc -std=c99 -O3 -march=native -Wall -Wextra -Werror -Wno-error=maybe-uninitialized \
           -DDT_CBLAS -I. bench/tensor.c -o build/bench/tensor-native -lopenblas -lm
   and run that with --portable. The program prints which vector ISA it was compiled for.
   (-Wno-error=maybe-uninitialized: gcc 12 at -O3 flags `nd` in dt_tensor_create, a false
   positive outside the GEMM.)

   clock_gettime / CLOCK_MONOTONIC are POSIX, hidden by strict -std=c99; the feature-test macro
   below asks for them, so the bench builds with the project's flags unchanged (no -std=gnu99). */
#define _POSIX_C_SOURCE 199309L

#define DT_IMPLEMENTATION
#include "../dt_tensor.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

/* OpenBLAS extensions; declared here too in case cblas.h is another vendor's. */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char *openblas_get_config(void);

enum { REPS = 7, MAXREPS = 16 };
#define BIG_FLOATS ((int64_t)16 * 1024 * 1024) /* 64 MiB of f32 per ops tensor */

#define CHECK(call) do { dt_status s_ = (call); if (s_) { \
    fprintf(stderr, "bench/tensor: %s failed: %s\n", #call, dt_ctx_error(&g_ctx)); exit(1); } } while (0)

static dt_ctx g_ctx;

/* How busy other processes kept the CPUs between two snapshots (Linux /proc; -1 elsewhere):
   on a shared 2-core machine a build running beside the bench halves a 2-thread GEMM, and the
   table should say so rather than pass it off as the library's speed. */
typedef struct cpu_snap { double busy, total, self; int ok; } cpu_snap;

static cpu_snap cpu_now(void) {
    cpu_snap c = {0, 0, 0, 0};
    double v[8] = {0};
    unsigned long ut = 0, st = 0;
    char buf[1024], *p;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return c;
    if (fscanf(f, "cpu %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
               &v[7]) == 8) {
        c.total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
        c.busy = c.total - v[3] - v[4]; /* idle, iowait */
        c.ok = 1;
    }
    fclose(f);
    f = fopen("/proc/self/stat", "r");
    if (!f) { c.ok = 0; return c; }
    /* utime and stime are fields 14 and 15; the command name (field 2) may hold spaces */
    if (!fgets(buf, sizeof buf, f) || !(p = strrchr(buf, ')')) ||
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        c.ok = 0;
    fclose(f);
    c.self = (double)ut + (double)st;
    return c;
}

/* percent of all CPUs' time that other processes were busy between a and b */
static double others_busy(cpu_snap a, cpu_snap b) {
    double d = b.total - a.total, o;
    if (!a.ok || !b.ok || d <= 0) return -1;
    o = (b.busy - a.busy) - (b.self - a.self);
    return o < 0 ? 0 : 100 * o / d;
}

static void print_others(const char *what, cpu_snap a, cpu_snap b) {
    double o = others_busy(a, b);
    if (o < 0) printf("  (%s: cannot tell how busy other processes kept the CPUs)\n", what);
    else printf("  (%s: other processes kept the CPUs %.1f%% busy%s)\n", what, o,
                o > 5 ? " - figures disturbed, run again on an idle machine" : "");
}

typedef void (*job_fn)(void *arg);

/* Median seconds of `reps` runs of each of n jobs, after one warm-up run of each. The jobs
   take turns within a rep (in rotating order), so a slow spell of the machine - other
   processes, clock changes - falls on all of them instead of on whichever ran then. */
static void time_jobs(int n, job_fn *fn, void **arg, int reps, double *med) {
    double t[4][MAXREPS];
    int r, j;
    for (j = 0; j < n; j++) fn[j](arg[j]);
    for (r = 0; r < reps; r++)
        for (j = 0; j < n; j++) {
            int k = (j + r) % n;
            double t0 = now_s();
            fn[k](arg[k]);
            t[k][r] = now_s() - t0;
        }
    for (j = 0; j < n; j++) med[j] = median(t[j], reps);
}

/* ---------------------------------------------------------------- GEMM */

typedef struct gemm_case {
    const char *name;
    int M, N, K, ta, tb;
} gemm_case;

/* The square sizes, then one MLP layer of 1024 -> 256 on a batch of 4096 as dt_linear runs it:
   forward x @ w^T (NT), backward dx = dout @ w (NN) and dw = dout^T @ x (TN); then the TT
   and NT square variants dt_matmul_bwd issues for transposed operands. */
static const gemm_case g_cases[] = {
    {"square 512", 512, 512, 512, 0, 0},
    {"square 1024", 1024, 1024, 1024, 0, 0},
    {"square 2048", 2048, 2048, 2048, 0, 0},
    {"mlp fwd x.w^T", 4096, 256, 1024, 0, 1},
    {"mlp bwd dx=dout.w", 4096, 1024, 256, 0, 0},
    {"mlp bwd dw=dout^T.x", 256, 1024, 4096, 1, 0},
    {"square 1024", 1024, 1024, 1024, 1, 1},
    {"square 1024", 1024, 1024, 1024, 0, 1},
};
#define N_CASES ((int)(sizeof g_cases / sizeof g_cases[0]))

typedef struct gemm_job {
    const gemm_case *c;
    dt_tensor a, b, out;
} gemm_job;

static void run_dt_matmul(void *p) {
    gemm_job *j = (gemm_job *)p;
    CHECK(dt_matmul_fwd(&g_ctx, &j->out, &j->a, &j->b, j->c->ta, j->c->tb, 1.0f, 0.0f));
}

static void run_cblas(void *p) {
    gemm_job *j = (gemm_job *)p;
    const gemm_case *c = j->c;
    cblas_sgemm(CblasRowMajor, c->ta ? CblasTrans : CblasNoTrans, c->tb ? CblasTrans : CblasNoTrans,
                c->M, c->N, c->K, 1.0f, (const float *)j->a.data, c->ta ? c->M : c->K,
                (const float *)j->b.data, c->tb ? c->K : c->N, 0.0f, (float *)j->out.data, c->N);
}

/* one thread: the portable GEMM has no threads of its own */
static void run_cblas1(void *p) {
    int saved = openblas_get_num_threads();
    openblas_set_num_threads(1);
    run_cblas(p);
    openblas_set_num_threads(saved);
}

static void run_portable(void *p) {
    gemm_job *j = (gemm_job *)p;
    const gemm_case *c = j->c;
    CHECK(dt_gemm_portable(&g_ctx, c->ta, c->tb, c->M, c->N, c->K, 1.0f, (const float *)j->a.data,
                           c->ta ? c->M : c->K, (const float *)j->b.data, c->tb ? c->K : c->N, 0.0f,
                           (float *)j->out.data, c->N));
}

static void gemm_setup(gemm_job *j, const gemm_case *c) {
    dt_tensor_desc da = {.dtype = DT_F32, .device = DT_CPU}, db = {.dtype = DT_F32, .device = DT_CPU}, dc = {.dtype = DT_F32, .device = DT_CPU};
    dt_init_desc init = {.kind = DT_INIT_UNIFORM, .seed = 7, .name = "a", .low = -1.0, .high = 1.0};
    j->c = c;
    da.shape[0] = c->ta ? c->K : c->M; da.shape[1] = c->ta ? c->M : c->K;
    db.shape[0] = c->tb ? c->N : c->K; db.shape[1] = c->tb ? c->K : c->N;
    dc.shape[0] = c->M; dc.shape[1] = c->N;
    CHECK(dt_tensor_create(&g_ctx, &j->a, &da));
    CHECK(dt_tensor_create(&g_ctx, &j->b, &db));
    CHECK(dt_tensor_create(&g_ctx, &j->out, &dc));
    CHECK(dt_tensor_init(&g_ctx, &j->a, &init));
    init.name = "b";
    CHECK(dt_tensor_init(&g_ctx, &j->b, &init));
}

static void gemm_free(gemm_job *j) {
    dt_tensor_free(&g_ctx, &j->a);
    dt_tensor_free(&g_ctx, &j->b);
    dt_tensor_free(&g_ctx, &j->out);
}

/* max |x - ref| / max |ref|: the timed paths must also agree (inputs in [-1,1), so every
   entry is a sum of K terms of size < 1 and f32 rounding stays far below 1e-4 of the max) */
static double rel_diff(const float *x, const float *ref, int64_t n) {
    double d = 0, m = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = x[i] - ref[i], r = ref[i];
        if (e < 0) e = -e;
        if (r < 0) r = -r;
        if (e > d) d = e;
        if (r > m) m = r;
    }
    return m > 0 ? d / m : d;
}

static const char *op_name(const gemm_case *c) {
    static const char *names[4] = {"NN", "NT", "TN", "TT"};
    return names[c->ta * 2 + c->tb];
}

static double gflops(const gemm_case *c, double s) { return 2.0 * c->M * c->N * c->K / s / 1e9; }

typedef struct stats { double min, max, sum; int n; const char *min_at, *max_at; } stats;

static void stats_add(stats *s, double v, const char *at) {
    if (s->n == 0 || v < s->min) { s->min = v; s->min_at = at; }
    if (s->n == 0 || v > s->max) { s->max = v; s->max_at = at; }
    s->sum += v;
    s->n++;
}

static int g_bad = 0; /* a result disagreed: the run fails */

static void check_same(const char *what, const gemm_job *j, const float *ref) {
    double d = rel_diff((const float *)j->out.data, ref, j->out.numel);
    if (d > 1e-4) {
        printf("  !! %s result differs from cblas_sgemm: max rel diff %.2e\n", what, d);
        g_bad = 1;
    }
}

static void bench_dt_vs_cblas(stats *st) {
    int i;
    printf("\n== 1. GEMM through dt (dt_matmul_fwd, DT_CBLAS) vs cblas_sgemm, OpenBLAS default threads (%d)\n",
           openblas_get_num_threads());
    printf("%-22s %-2s %16s %9s %9s %10s %9s\n", "shape", "op", "M x N x K", "dt ms", "dt GF/s", "cblas ms",
           "dt/cblas");
    for (i = 0; i < N_CASES; i++) {
        const gemm_case *c = &g_cases[i];
        gemm_job jdt, jbl;
        job_fn fn[2] = {run_dt_matmul, run_cblas};
        void *arg[2];
        double med[2];
        char dims[32];
        gemm_setup(&jdt, c);
        jbl = jdt; /* same inputs; its own output */
        CHECK(dt_tensor_create(&g_ctx, &jbl.out, &(dt_tensor_desc){.dtype = DT_F32, .device = DT_CPU, .shape = {c->M, c->N}}));
        arg[0] = &jdt; arg[1] = &jbl;
        time_jobs(2, fn, arg, REPS, med);
        check_same("dt_matmul_fwd", &jdt, (const float *)jbl.out.data);
        snprintf(dims, sizeof dims, "%dx%dx%d", c->M, c->N, c->K);
        printf("%-22s %-2s %16s %9.2f %9.1f %10.2f %9.3f\n", c->name, op_name(c), dims, 1e3 * med[0],
               gflops(c, med[0]), 1e3 * med[1], med[1] / med[0]);
        stats_add(st, med[1] / med[0], c->name);
        dt_tensor_free(&g_ctx, &jbl.out);
        gemm_free(&jdt);
    }
}

static void bench_portable(stats *vs_all, stats *vs_one, double *gf_1024) {
    int i;
    printf("\n== 2. portable GEMM (dt_gemm_portable, 1 thread) vs cblas_sgemm with %d threads and with 1\n",
           openblas_get_num_threads());
    printf("%-22s %-2s %16s %9s %11s %9s %11s %9s\n", "shape", "op", "M x N x K", "port GF/s", "cblas GF/s",
           "ratio", "cblas1 GF/s", "ratio1");
    for (i = 0; i < N_CASES; i++) {
        const gemm_case *c = &g_cases[i];
        gemm_job jp, jb, jb1;
        job_fn fn[3] = {run_portable, run_cblas, run_cblas1};
        void *arg[3];
        double med[3];
        char dims[32];
        gemm_setup(&jp, c);
        jb = jp; jb1 = jp;
        CHECK(dt_tensor_create(&g_ctx, &jb.out, &(dt_tensor_desc){.dtype = DT_F32, .device = DT_CPU, .shape = {c->M, c->N}}));
        jb1.out = jb.out; /* both cblas runs write the same buffer */
        arg[0] = &jp; arg[1] = &jb; arg[2] = &jb1;
        time_jobs(3, fn, arg, REPS, med);
        check_same("dt_gemm_portable", &jp, (const float *)jb.out.data);
        snprintf(dims, sizeof dims, "%dx%dx%d", c->M, c->N, c->K);
        printf("%-22s %-2s %16s %9.1f %11.1f %9.3f %11.1f %9.3f\n", c->name, op_name(c), dims, gflops(c, med[0]),
               gflops(c, med[1]), med[1] / med[0], gflops(c, med[2]), med[2] / med[0]);
        stats_add(vs_all, med[1] / med[0], c->name);
        stats_add(vs_one, med[2] / med[0], c->name);
        if (c->M == 1024 && c->N == 1024 && !c->ta && !c->tb) *gf_1024 = gflops(c, med[0]);
        dt_tensor_free(&g_ctx, &jb.out);
        gemm_free(&jp);
    }
}

/* ---------------------------------------------------------------- memory-bound ops

   Byte model: every element an op must read from or write to its tensors counts once, as if
   each tensor streamed through memory exactly once (per-row or per-column vectors - mean,
   rstd, w, b, dw, db, targets - are counted once too). What the model leaves out:
   - write-allocate: a store to a line that is not in cache reads the line first, so an op
     writing a separate output (add, relu, gelu, layernorm, softmax) moves one more read per
     written element than it is credited with. memcpy most likely pays it too: glibc turns to
     non-temporal stores only above x86_non_temporal_threshold, 240 MiB on this machine
     (ld.so --list-tunables). In-place ops (scale, axpy) do not pay it, so their ratio to
     memcpy can exceed 1.
   - re-reads that hit cache: layernorm and softmax pass over a row 2-3 times; a row (4 KiB,
     200 KiB) stays in L1/L2, so only the first pass reaches memory and only it is counted. */

typedef struct ops_bufs {
    dt_tensor x, y, z, w;                  /* BIG_FLOATS each */
    dt_tensor lnw, lnb, lndw, lndb, mean, rstd, targets;
} ops_bufs;

enum { LN_C = 1024, LN_ROWS = (int)(BIG_FLOATS / LN_C), SM_V = 50257, SM_ROWS = (int)(BIG_FLOATS / SM_V) };

typedef struct op_job {
    ops_bufs *b;
    dt_tensor v1, v2, v3;                   /* reshaped views for layernorm / softmax */
} op_job;

static void run_memcpy(void *p) {
    op_job *j = (op_job *)p;
    memcpy(j->b->y.data, j->b->x.data, dt_tensor_bytes(&j->b->x));
}
static void run_add(void *p) { op_job *j = (op_job *)p; CHECK(dt_add(&g_ctx, &j->b->z, &j->b->x, &j->b->y)); }
static void run_axpy(void *p) { op_job *j = (op_job *)p; CHECK(dt_axpy(&g_ctx, &j->b->y, 1e-3f, &j->b->x)); }
static void run_scale(void *p) { op_job *j = (op_job *)p; CHECK(dt_scale(&g_ctx, &j->b->y, 0.999f)); }
static void run_relu(void *p) { op_job *j = (op_job *)p; CHECK(dt_relu_fwd(&g_ctx, &j->b->z, &j->b->x)); }
static void run_gelu(void *p) { op_job *j = (op_job *)p; CHECK(dt_gelu_fwd(&g_ctx, &j->b->z, &j->b->x)); }

static void run_ln_fwd(void *p) {
    op_job *j = (op_job *)p;
    CHECK(dt_layernorm_fwd(&g_ctx, &j->v2, &j->b->mean, &j->b->rstd, &j->v1, &j->b->lnw, &j->b->lnb, 1e-5f));
}

/* dout = v3 (the w buffer), x = v1, dx = v2 accumulates */
static void run_ln_bwd(void *p) {
    op_job *j = (op_job *)p;
    CHECK(dt_layernorm_bwd(&g_ctx, &j->v2, &j->b->lndw, &j->b->lndb, &j->v3, &j->v1, &j->b->lnw, &j->b->mean,
                           &j->b->rstd));
}

static void run_xent_fwd(void *p) {
    op_job *j = (op_job *)p;
    float loss;
    CHECK(dt_softmax_xent_fwd(&g_ctx, &loss, NULL, &j->v2, &j->v1, &j->b->targets, -1));
}

static void ops_setup(ops_bufs *b) {
    dt_tensor_desc big = {.dtype = DT_F32, .device = DT_CPU, .shape = {BIG_FLOATS}}, row = {.dtype = DT_F32, .device = DT_CPU, .shape = {LN_C}};
    dt_tensor_desc rows = {.dtype = DT_F32, .device = DT_CPU, .shape = {LN_ROWS}}, tg = {.dtype = DT_I32, .device = DT_CPU, .shape = {SM_ROWS}};
    dt_init_desc n = {.kind = DT_INIT_NORMAL, .seed = 11, .name = "x", .std = 1.0};
    int i;
    memset(b, 0, sizeof *b);
    CHECK(dt_tensor_create(&g_ctx, &b->x, &big));
    CHECK(dt_tensor_create(&g_ctx, &b->y, &big));
    CHECK(dt_tensor_create(&g_ctx, &b->z, &big));
    CHECK(dt_tensor_create(&g_ctx, &b->w, &big));
    CHECK(dt_tensor_init(&g_ctx, &b->x, &n));
    n.name = "y";
    CHECK(dt_tensor_init(&g_ctx, &b->y, &n));
    n.name = "w";
    CHECK(dt_tensor_init(&g_ctx, &b->w, &n));
    CHECK(dt_tensor_create(&g_ctx, &b->lnw, &row));
    CHECK(dt_tensor_create(&g_ctx, &b->lnb, &row));
    CHECK(dt_tensor_create(&g_ctx, &b->lndw, &row));
    CHECK(dt_tensor_create(&g_ctx, &b->lndb, &row));
    CHECK(dt_tensor_create(&g_ctx, &b->mean, &rows));
    CHECK(dt_tensor_create(&g_ctx, &b->rstd, &rows));
    CHECK(dt_tensor_create(&g_ctx, &b->targets, &tg));
    CHECK(dt_tensor_fill(&g_ctx, &b->lnw, 1.0));
    for (i = 0; i < SM_ROWS; i++) ((int32_t *)b->targets.data)[i] = (int32_t)((i * 7919) % SM_V);
}

static void ops_free(ops_bufs *b) {
    dt_tensor *t[] = {&b->x, &b->y, &b->z, &b->w, &b->lnw, &b->lnb, &b->lndw, &b->lndb, &b->mean, &b->rstd,
                      &b->targets};
    size_t i;
    for (i = 0; i < sizeof t / sizeof t[0]; i++) dt_tensor_free(&g_ctx, t[i]);
}

static void view2(dt_tensor *v, const dt_tensor *t, int64_t r, int64_t c) {
    int64_t shape[2];
    shape[0] = r; shape[1] = c;
    CHECK(dt_tensor_view(&g_ctx, v, t, 0, 2, shape));
}

typedef struct op_row {
    const char *name, *model;
    job_fn fn;
    double bytes;
} op_row;

/* Each op is timed in turns with memcpy of 64 MiB (x -> y), and its ratio is to that memcpy:
   the memory bandwidth a VM gets drifts by tens of percent from minute to minute, and the
   ratio should not. The memcpy column is that pairing's memcpy. */
static void bench_ops(double *memcpy_gbs, stats *ratio) {
    ops_bufs b;
    op_job j, jl, js;
    const double E = (double)BIG_FLOATS, LR = LN_ROWS, SR = SM_ROWS, SE = (double)SM_ROWS * SM_V;
    const op_row rows[] = {
        {"dt_add  out=a+b", "r8 w4", run_add, 12 * E},
        {"dt_axpy y+=a*x", "r8 w4", run_axpy, 12 * E},
        {"dt_scale x*=a", "r4 w4", run_scale, 8 * E},
        {"dt_relu_fwd", "r4 w4", run_relu, 8 * E},
        {"dt_gelu_fwd", "r4 w4", run_gelu, 8 * E},
        /* x, out; mean, rstd per row; w, b once */
        {"dt_layernorm_fwd", "r4 w4 +8/row", run_ln_fwd, 8 * E + 8 * LR + 8 * LN_C},
        /* dout, x, dx read; dx written; mean, rstd per row; w read, dw, db read+written once */
        {"dt_layernorm_bwd", "r12 w4 +8/row", run_ln_bwd, 16 * E + 8 * LR + 20 * LN_C},
        /* logits, probs; targets per row */
        {"dt_softmax_xent_fwd", "r4 w4 +4/row", run_xent_fwd, 8 * SE + 4 * SR},
    };
    const double memcpy_bytes = 8 * E; /* r4 w4 */
    double mc[16];
    int i, n = (int)(sizeof rows / sizeof rows[0]);
    ops_setup(&b);
    j.b = &b;
    jl = j; js = j;
    view2(&jl.v1, &b.x, LN_ROWS, LN_C); /* x */
    view2(&jl.v2, &b.z, LN_ROWS, LN_C); /* out / dx */
    view2(&jl.v3, &b.w, LN_ROWS, LN_C); /* dout */
    view2(&js.v1, &b.x, SM_ROWS, SM_V); /* logits */
    view2(&js.v2, &b.z, SM_ROWS, SM_V); /* probs */
    printf("\n== 3. memory-bound ops vs memcpy (r4 w4), 1 thread, 64 MiB per tensor; GB/s = bytes read + "
           "written\n");
    printf("%-22s %-15s %9s %9s %11s %9s   shape\n", "op", "bytes/elem", "ms", "GB/s", "memcpy GB/s",
           "/memcpy");
    for (i = 0; i < n; i++) {
        job_fn fn[2];
        void *arg[2];
        double med[2], gbs;
        const char *shape = "16M";
        fn[0] = run_memcpy; arg[0] = &j;
        fn[1] = rows[i].fn; arg[1] = &j;
        if (rows[i].fn == run_ln_fwd || rows[i].fn == run_ln_bwd) { arg[1] = &jl; shape = "16384 x 1024"; }
        if (rows[i].fn == run_xent_fwd) { arg[1] = &js; shape = "333 x 50257"; }
        time_jobs(2, fn, arg, REPS, med);
        mc[i] = memcpy_bytes / med[0] / 1e9;
        gbs = rows[i].bytes / med[1] / 1e9;
        printf("%-22s %-15s %9.2f %9.2f %11.2f %9.3f   %s\n", rows[i].name, rows[i].model, 1e3 * med[1], gbs,
               mc[i], gbs / mc[i], shape);
        stats_add(ratio, gbs / mc[i], rows[i].name);
    }
    *memcpy_gbs = median(mc, n);
    ops_free(&b);
}

/* ---------------------------------------------------------------- bf16 linears */

typedef struct bf_job {
    int which; /* 0 fwd out = x w^T, 1 dx += dout w, 2 dw += dout^T x */
    int64_t N, In, Out;
    dt_tensor x, w, w16, out, dout, dx, dw;
} bf_job;

static void run_bf(void *p) { /* one thread too where the fallback calls cblas_sgemm */
    bf_job *j = (bf_job *)p;
    int saved = openblas_get_num_threads();
    openblas_set_num_threads(1);
    if (j->which == 0) CHECK(dt_linear_fwd(&g_ctx, &j->out, &j->x, &j->w16, NULL));
    else CHECK(dt_linear_bwd(&g_ctx, j->which == 1 ? &j->dx : NULL, j->which == 2 ? &j->dw : NULL, NULL, &j->dout,
                             &j->x, &j->w16));
    openblas_set_num_threads(saved);
}

static void run_bf_sgemm(void *p) { /* the same GEMM in f32, OpenBLAS on one thread */
    bf_job *j = (bf_job *)p;
    int saved = openblas_get_num_threads();
    openblas_set_num_threads(1);
    if (j->which == 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->N, (int)j->Out, (int)j->In, 1.0f, j->x.data,
                    (int)j->In, j->w.data, (int)j->In, 0.0f, j->out.data, (int)j->Out);
    else if (j->which == 1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)j->N, (int)j->In, (int)j->Out, 1.0f, j->dout.data,
                    (int)j->Out, j->w.data, (int)j->In, 1.0f, j->dx.data, (int)j->In);
    else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)j->Out, (int)j->In, (int)j->N, 1.0f, j->dout.data,
                    (int)j->Out, j->x.data, (int)j->In, 1.0f, j->dw.data, (int)j->In);
    openblas_set_num_threads(saved);
}

static void bench_bf16(stats *st) {
    static const int64_t shapes[4][2] = {{256, 768}, {256, 256}, {256, 1024}, {1024, 256}};
    static const char *names[4] = {"256 -> 768 (qkv)", "256 -> 256 (proj)", "256 -> 1024 (fc)", "1024 -> 256 (mlp)"};
    static const char *what[3] = {"fwd", "dx", "dw"};
    int s, w;
    printf("\n== 4. bf16 linears (dt_linear, bf16 w; %s) vs cblas_sgemm in f32, one thread, 2048 rows\n",
           dt_cpu_bf16_gemm());
    printf("%-20s %-4s %9s %9s %11s %9s\n", "In -> Out", "GEMM", "bf16 ms", "bf16 GF/s", "sgemm GF/s", "bf16/f32");
    for (s = 0; s < 4; s++) {
        bf_job j;
        dt_init_desc init = {.kind = DT_INIT_UNIFORM, .seed = 7, .name = "x", .low = -1.0, .high = 1.0};
        dt_tensor_desc d = {.dtype = DT_F32, .device = DT_CPU, .ndim = 2};
        float *ref;
        double diff;
        memset(&j, 0, sizeof j);
        j.N = 2048; j.In = shapes[s][0]; j.Out = shapes[s][1];
#define MK(t, r, c) do { d.shape[0] = (r); d.shape[1] = (c); CHECK(dt_tensor_create(&g_ctx, &(t), &d)); } while (0)
        MK(j.x, j.N, j.In); MK(j.w, j.Out, j.In); MK(j.out, j.N, j.Out); MK(j.dout, j.N, j.Out);
        MK(j.dx, j.N, j.In); MK(j.dw, j.Out, j.In);
        d.dtype = DT_BF16;
        MK(j.w16, j.Out, j.In);
#undef MK
        CHECK(dt_tensor_init(&g_ctx, &j.x, &init));
        init.name = "w";
        CHECK(dt_tensor_init(&g_ctx, &j.w, &init));
        init.name = "dout";
        CHECK(dt_tensor_init(&g_ctx, &j.dout, &init));
        CHECK(dt_convert(&g_ctx, j.w16.data, DT_BF16, j.w.data, DT_F32, j.w.numel));
        for (w = 0; w < 3; w++) {
            job_fn fn[2] = {run_bf, run_bf_sgemm};
            void *arg[2] = {&j, &j};
            double med[2], flop = 2.0 * (double)j.N * (double)j.In * (double)j.Out;
            j.which = w;
            time_jobs(2, fn, arg, REPS, med);
            printf("%-20s %-4s %9.3f %9.1f %11.1f %9.2f\n", names[s], what[w], 1e3 * med[0], flop / med[0] / 1e9,
                   flop / med[1] / 1e9, med[1] / med[0]);
            stats_add(st, med[1] / med[0], names[s]);
        }
        /* the outputs agree within bf16's rounding of the inputs (2^-8 of each, relative) */
        ref = (float *)malloc((size_t)j.out.numel * sizeof(float));
        if (!ref) { fprintf(stderr, "bench/tensor: out of memory\n"); exit(1); }
        j.which = 0;
        run_bf_sgemm(&j);
        memcpy(ref, j.out.data, (size_t)j.out.numel * sizeof(float));
        run_bf(&j);
        diff = rel_diff((const float *)j.out.data, ref, j.out.numel);
        if (diff > 2e-2) {
            printf("  !! bf16 fwd differs from cblas_sgemm by %.2e of the largest output (bf16 bound 2e-2)\n", diff);
            g_bad = 1;
        }
        free(ref);
        dt_tensor_free(&g_ctx, &j.x); dt_tensor_free(&g_ctx, &j.w); dt_tensor_free(&g_ctx, &j.w16);
        dt_tensor_free(&g_ctx, &j.out); dt_tensor_free(&g_ctx, &j.dout); dt_tensor_free(&g_ctx, &j.dx);
        dt_tensor_free(&g_ctx, &j.dw);
    }
}

/* ---------------------------------------------------------------- main */

/* Half a second of 2-thread GEMM before the first timing: clocks ramp up and OpenBLAS's
   sleeping worker threads wake, which a per-row warm-up run is too short to cover for the
   first, smallest shape. */
static void warm_machine(void) {
    gemm_case c = {"warm", 1024, 1024, 1024, 0, 0};
    gemm_job j;
    double t0 = now_s();
    gemm_setup(&j, &c);
    while (now_s() - t0 < 0.5) run_cblas(&j);
    gemm_free(&j);
}

#if defined(__clang__)
#define COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define COMPILER "gcc " __VERSION__
#else
#define COMPILER "unknown compiler"
#endif
#ifdef __OPTIMIZE__
#define OPTIMISED "optimised"
#else
#define OPTIMISED "NOT optimised"
#endif
#if defined(__AVX512F__)
#define VECTOR_ISA "AVX-512"
#elif defined(__AVX2__)
#define VECTOR_ISA "AVX2"
#elif defined(__AVX__)
#define VECTOR_ISA "AVX"
#elif defined(__SSE2__)
#define VECTOR_ISA "SSE2"
#else
#define VECTOR_ISA "other"
#endif

static void print_machine(void) {
    char line[256], model[256] = "unknown";
    int cpus = 0;
    double load = -1;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (!strncmp(line, "processor", 9)) cpus++;
            if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
                snprintf(model, sizeof model, "%s", strchr(line, ':') + 2);
                model[strcspn(model, "\n")] = 0;
            }
        }
        fclose(f);
    }
    f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &load) != 1) load = -1;
        fclose(f);
    }
    printf("machine: %s, %d logical CPUs; load average at start %.2f\n", model, cpus, load);
    printf("OpenBLAS: %s; default threads %d\n", openblas_get_config(), openblas_get_num_threads());
    if (dt_blas_note()) printf("  note: %s\n", dt_blas_note());
    printf("compiled: %s, %s, vector ISA %s (bounds the portable GEMM)\n", COMPILER, OPTIMISED, VECTOR_ISA);
    printf("timing: median of %d runs after 1 warm-up, CLOCK_MONOTONIC\n", REPS);
}

int main(int argc, char **argv) {
    stats dtb = {0}, p_all = {0}, p_one = {0}, ops = {0}, bf = {0};
    double memcpy_gbs = 0, gf_1024 = 0, t0 = now_s();
    cpu_snap c0, c1, c2;
    int portable_only = argc > 1 && !strcmp(argv[1], "--portable");
    int bf16_only = argc > 1 && !strcmp(argv[1], "--bf16");
    if (argc > 1 && !portable_only && !bf16_only) {
        fprintf(stderr, "usage: %s [--portable | --bf16]\n", argv[0]);
        return 2;
    }
    CHECK(dt_ctx_init(&g_ctx, NULL));
    printf("bench/tensor: dt_tensor.h on the CPU\n");
    print_machine();
    warm_machine();
    c0 = c1 = cpu_now();
    if (!portable_only && !bf16_only) {
        bench_dt_vs_cblas(&dtb);
        print_others("section 1", c1, c2 = cpu_now());
        c1 = c2;
    }
    if (!bf16_only) {
        bench_portable(&p_all, &p_one, &gf_1024);
        print_others("section 2", c1, c2 = cpu_now());
        c1 = c2;
    }
    if (!portable_only && !bf16_only) {
        bench_ops(&memcpy_gbs, &ops);
        print_others("section 3", c1, c2 = cpu_now());
        c1 = c2;
    }
    if (!portable_only) {
        bench_bf16(&bf);
        print_others("section 4", c1, c2 = cpu_now());
    }

    printf("\nsummary\n");
    if (dtb.n)
        printf("  GEMM dt/cblas (OpenBLAS %d threads): mean %.3f, min %.3f (%s); target >= 0.95: %s\n",
               openblas_get_num_threads(), dtb.sum / dtb.n, dtb.min, dtb.min_at, dtb.min >= 0.95 ? "met" : "NOT met");
    if (p_one.n) {
        printf("  portable GEMM 1024^3 NN: %.1f GFLOP/s\n", gf_1024);
        printf("  portable/cblas 1 thread:  mean %.3f, min %.3f (%s); aim >= 0.3: %s\n", p_one.sum / p_one.n,
               p_one.min, p_one.min_at, p_one.min >= 0.3 ? "met" : "NOT met");
        printf("  portable/cblas %d threads: mean %.3f, min %.3f (%s)\n", openblas_get_num_threads(),
               p_all.sum / p_all.n, p_all.min, p_all.min_at);
    }
    if (bf.n)
        printf("  bf16 linears / sgemm (1 thread, %s): from %.2f (%s) to %.2f (%s)\n", dt_cpu_bf16_gemm(), bf.min,
               bf.min_at, bf.max, bf.max_at);
    if (ops.n)
        printf("  memcpy %.2f GB/s (median of its pairings); ops/memcpy from %.3f (%s) to %.3f (%s)\n", memcpy_gbs,
               ops.min, ops.min_at, ops.max, ops.max_at);
    printf("  results agree with cblas_sgemm: %s\n", g_bad ? "NO" : "yes");
    printf("  total time %.1f s\n", now_s() - t0);
    print_others("whole run", c0, cpu_now());
    dt_ctx_shutdown(&g_ctx);
    return g_bad;
}
