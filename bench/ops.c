/* bench/ops.c - the CPU ops that are not GEMM (gelu, layernorm, softmax_xent, attention, bias)
   before and after their rewrite (issue 9), and what they cost in a GPT training step. One thread.
     1. Each op, forward and backward, at GPT-step shapes: "before" is the scalar loop as it was
        in dt_tensor.h up to commit a815b49 (copied below: libm tanhf / expf, row sums in
        double), "after" is dt's op (4-lane SSE2). Each is timed in turns with memcpy of the
        op's main tensor (same bytes, same run), and printed in GB/s, as a ratio to that memcpy,
        and as the speedup after/before. The outputs of both are compared (max relative diff).
     1b. attention fwd / bwd (GEMMs per batch and head from d3024d8) and bias_add_bwd (whole
        rows) against the loops they replaced (copied below), in ms, speedup and GFLOP/s (GB/s
        for the bias), with the max relative difference of their outputs.
     2. Time per op in one training step (forward + backward) of a GPT (B 8, T 256, C 256,
        4 heads, 4 layers, 4C MLP, vocab 256): the matmuls through dt_linear with DT_CBLAS
        (OpenBLAS at 1 thread, like everything else here), attention, bias, residual add, gelu,
        layernorm, softmax_xent; each op's ms and share of the step with the old loops and
        with the new ones ("before" is gelu, layernorm, softmax_xent up to a815b49 and attention,
        bias_add up to 3dbc65d).
   Every figure is the median of REPS timed runs after one warm-up run, in the thread's CPU time
   (CLOCK_THREAD_CPUTIME_ID): this project's machine is 2 cores shared with other jobs (load
   average 8-17 while this was written), and wall time would count their turns as the op's.
   --wall times with CLOCK_MONOTONIC instead.

   build (what ./build.sh does):
       gcc -std=c99 -O2 -Wall -Wextra -Werror -DDT_CBLAS -I. bench/ops.c -o build/bench/ops \
           -lopenblas -lm
   run:  build/bench/ops            all sections (about 60 s on an idle core)
         build/bench/ops --tsv      section 1 only, as tab-separated lines (bench/ops_torch.py
                                    reads them to print PyTorch's ratio to dt)
         build/bench/ops --wall     all sections in wall-clock time

   clock_gettime / CLOCK_MONOTONIC are POSIX, hidden by strict -std=c99; the feature-test macro
   below asks for them, so the bench builds with the project's flags unchanged. */
#define _POSIX_C_SOURCE 199309L

#define DT_IMPLEMENTATION
#include "../dt_tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

#ifdef DT_CBLAS
void openblas_set_num_threads(int num_threads); /* OpenBLAS's; declared in case cblas.h is another's */
#endif

enum { REPS = 9, MAXREPS = 16 };

#define CHECK(call) do { dt_status s_ = (call); if (s_) { \
    fprintf(stderr, "bench/ops: %s failed: %s\n", #call, dt_ctx_error(&g_ctx)); exit(1); } } while (0)

static dt_ctx g_ctx;
static int g_bad = 0; /* before and after disagreed: the run fails */

/* ---------------------------------------------------------------- the old loops (before)

   dt_tensor.h's bodies up to a815b49, argument checks left out, on raw arrays. */

#define OLD_GELU_S 0.7978845608028654f /* sqrt(2 / pi) */

static void old_gelu_fwd(float *out, const float *x, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(OLD_GELU_S * (v + 0.044715f * v * v * v)));
    }
}

static void old_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) {
        float v = x[i];
        float u = OLD_GELU_S * (v + 0.044715f * v * v * v);
        float th = tanhf(u), sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * v * sech2 * OLD_GELU_S * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] += g * dout[i];
    }
}

static void old_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                              const float *b, int64_t R, int64_t C, float eps) {
    int64_t r, c;
    for (r = 0; r < R; r++) {
        const float *xr = x + r * C;
        float *o = out + r * C;
        double m = 0, v = 0;
        float s;
        for (c = 0; c < C; c++) m += xr[c];
        m /= (double)(C ? C : 1);
        for (c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        v /= (double)(C ? C : 1);
        s = (float)(1.0 / sqrt(v + eps));
        for (c = 0; c < C; c++) o[c] = (float)(xr[c] - m) * s * w[c] + (b ? b[c] : 0.0f);
        mean[r] = (float)m;
        rstd[r] = s;
    }
}

static void old_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                              const float *mean, const float *rstd, int64_t R, int64_t C) {
    int64_t r, c;
    for (r = 0; r < R; r++) {
        const float *xr = x + r * C, *g = dout + r * C;
        float m = mean[r], s = rstd[r];
        double gm = 0, gnm = 0;
        for (c = 0; c < C; c++) {
            float nrm = (xr[c] - m) * s, gw = g[c] * w[c];
            gm += gw;
            gnm += gw * nrm;
        }
        gm /= (double)(C ? C : 1);
        gnm /= (double)(C ? C : 1);
        for (c = 0; c < C; c++) {
            float nrm = (xr[c] - m) * s, gw = g[c] * w[c];
            if (db) db[c] += g[c];
            if (dw) dw[c] += nrm * g[c];
            if (dx) dx[r * C + c] += (float)((gw - gm - nrm * gnm) * s);
        }
    }
}

static float old_softmax_xent_fwd(float *probs, const float *logits, const int32_t *targets, int64_t R, int64_t V) {
    int64_t r, v, n = 0;
    double total = 0;
    for (r = 0; r < R; r++) {
        const float *z = logits + r * V;
        float *p = probs + r * V, mx = -FLT_MAX;
        double sum = 0;
        int32_t t = targets[r];
        for (v = 0; v < V; v++) if (z[v] > mx) mx = z[v];
        for (v = 0; v < V; v++) { p[v] = expf(z[v] - mx); sum += p[v]; }
        for (v = 0; v < V; v++) p[v] = (float)(p[v] / sum);
        total += log(sum) + mx - z[t];
        n++;
    }
    return n ? (float)(total / (double)n) : 0.0f;
}

static void old_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int64_t R, int64_t V,
                                 float dloss) {
    int64_t r, v;
    float s = dloss / (float)R;
    for (r = 0; r < R; r++) {
        int32_t t = targets[r];
        const float *p = probs + r * V;
        float *g = dlogits + r * V;
        for (v = 0; v < V; v++) g[v] += s * (p[v] - (v == t ? 1.0f : 0.0f));
    }
}

/* attention and bias_add as they were up to 3dbc65d (scalar, expf per score; the bias
   gradient summed down each column in double) */
static void old_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int n_head) {
    int64_t hs = C / n_head, b, t, t2, i;
    int h;
    float scale = hs ? 1.0f / sqrtf((float)hs) : 0.0f;
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < n_head; h++) {
                const float *q = qkv + (b * T + t) * 3 * C + h * hs;
                float *a = att + ((b * n_head + h) * T + t) * T;
                float *o = out + (b * T + t) * C + h * hs;
                float mx = -FLT_MAX, sum = 0;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
                    float d = 0;
                    for (i = 0; i < hs; i++) d += q[i] * k[i];
                    a[t2] = d * scale;
                    if (a[t2] > mx) mx = a[t2];
                }
                for (t2 = 0; t2 <= t; t2++) { a[t2] = expf(a[t2] - mx); sum += a[t2]; }
                for (t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
                for (i = 0; i < hs; i++) o[i] = 0;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
}

static void old_attention_bwd(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                              int64_t B, int64_t T, int64_t C, int n_head) {
    int64_t hs = C / n_head, b, t, t2, i;
    int h;
    float scale = hs ? 1.0f / sqrtf((float)hs) : 0.0f;
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < n_head; h++) {
                const float *a = att + ((b * n_head + h) * T + t) * T;
                const float *g = dout + (b * T + t) * C + h * hs;
                const float *q = qkv + (b * T + t) * 3 * C + h * hs;
                float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
                float dot = 0;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
                    float *dv = dqkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
                    float d = 0;
                    for (i = 0; i < hs; i++) { d += v[i] * g[i]; dv[i] += a[t2] * g[i]; }
                    datt[t2] = d;
                    dot += a[t2] * d;
                }
                for (t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
                    float *dk = dqkv + (b * T + t2) * 3 * C + C + h * hs;
                    float dpre = a[t2] * (datt[t2] - dot) * scale;
                    for (i = 0; i < hs; i++) { dq[i] += dpre * k[i]; dk[i] += dpre * q[i]; }
                }
            }
}

static void old_bias_add_fwd(float *out, const float *bias, int64_t R, int64_t C) {
    int64_t r, c;
    for (r = 0; r < R; r++)
        for (c = 0; c < C; c++) out[r * C + c] += bias[c];
}

static void old_bias_add_bwd(float *dbias, const float *dout, int64_t R, int64_t C) {
    int64_t r, c;
    for (c = 0; c < C; c++) {
        double s = 0;
        for (r = 0; r < R; r++) s += dout[r * C + c];
        dbias[c] += (float)s;
    }
}

/* ---------------------------------------------------------------- timing */

typedef void (*job_fn)(void *arg);

static int g_wall = 0; /* --wall: CLOCK_MONOTONIC instead of the thread's CPU time */

static double clock_s(void) {
    struct timespec ts;
    if (g_wall) return now_s();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Median seconds of `reps` runs of each of n jobs, after one warm-up run of each; the jobs take
   turns within a rep (rotating order), so a slow spell of the machine falls on all of them. */
static void time_jobs(int n, job_fn *fn, void **arg, int reps, double *med) {
    double t[4][MAXREPS];
    int r, j;
    for (j = 0; j < n; j++) fn[j](arg[j]);
    for (r = 0; r < reps; r++)
        for (j = 0; j < n; j++) {
            int k = (j + r) % n;
            double t0 = clock_s();
            fn[k](arg[k]);
            t[k][r] = clock_s() - t0;
        }
    for (j = 0; j < n; j++) med[j] = median(t[j], reps);
}

static dt_tensor mk(int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2; d.shape[3] = d3;
    CHECK(dt_tensor_create(&g_ctx, &t, &d));
    return t;
}

static void randn(dt_tensor *t, const char *name, double std) {
    dt_init_desc d;
    memset(&d, 0, sizeof d);
    d.kind = DT_INIT_NORMAL; d.seed = 5; d.name = name; d.std = std;
    CHECK(dt_tensor_init(&g_ctx, t, &d));
}

#define F(t) ((float *)(t)->data)

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, int64_t n) {
    double d = 0, m = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]), r = fabs((double)b[i]);
        if (!(e <= d)) d = e;
        if (r > m) m = r;
    }
    return m > 0 ? d / m : d;
}

/* ---------------------------------------------------------------- 1. ops before and after */

/* Everything an op of section 1 reads and writes: x/logits [R, C], its output, dout, dx, w, b,
   dw, db, mean, rstd, targets; a second output for the old loop (compared with the new). */
typedef struct op_bufs {
    int64_t R, C;
    dt_tensor x, out, out_old, dout, dx, dx_old, w, b, dw, db, mean, rstd, mean_old, rstd_old, tg, src, dst;
    float loss, loss_old;
} op_bufs;

static void bufs_setup(op_bufs *o, int64_t R, int64_t C) {
    int64_t r;
    memset(o, 0, sizeof *o);
    o->R = R; o->C = C;
    o->x = mk(R, C, 0, 0); o->out = mk(R, C, 0, 0); o->out_old = mk(R, C, 0, 0); o->dout = mk(R, C, 0, 0);
    o->dx = mk(R, C, 0, 0); o->dx_old = mk(R, C, 0, 0); o->src = mk(R, C, 0, 0); o->dst = mk(R, C, 0, 0);
    o->w = mk(C, 0, 0, 0); o->b = mk(C, 0, 0, 0); o->dw = mk(C, 0, 0, 0); o->db = mk(C, 0, 0, 0);
    o->mean = mk(R, 0, 0, 0); o->rstd = mk(R, 0, 0, 0); o->mean_old = mk(R, 0, 0, 0); o->rstd_old = mk(R, 0, 0, 0);
    o->tg = mk(R, 0, 0, 0);
    o->tg.dtype = DT_I32; /* same bytes as f32 */
    randn(&o->x, "x", 2.0); randn(&o->dout, "dout", 1.0); randn(&o->w, "w", 1.0); randn(&o->b, "b", 1.0);
    randn(&o->src, "src", 1.0);
    for (r = 0; r < R; r++) ((int32_t *)o->tg.data)[r] = (int32_t)((r * 7919) % C);
}

static void bufs_free(op_bufs *o) {
    dt_tensor *t[] = {&o->x, &o->out, &o->out_old, &o->dout, &o->dx, &o->dx_old, &o->w, &o->b, &o->dw, &o->db,
                      &o->mean, &o->rstd, &o->mean_old, &o->rstd_old, &o->tg, &o->src, &o->dst};
    size_t i;
    o->tg.dtype = DT_F32;
    for (i = 0; i < sizeof t / sizeof t[0]; i++) dt_tensor_free(&g_ctx, t[i]);
}

static void j_memcpy(void *p) { op_bufs *o = (op_bufs *)p; memcpy(o->dst.data, o->src.data, dt_tensor_bytes(&o->src)); }
static void j_gelu_fwd(void *p) { op_bufs *o = (op_bufs *)p; CHECK(dt_gelu_fwd(&g_ctx, &o->out, &o->x)); }
static void j_gelu_fwd_old(void *p) { op_bufs *o = (op_bufs *)p; old_gelu_fwd(F(&o->out_old), F(&o->x), o->x.numel); }
static void j_gelu_bwd(void *p) { op_bufs *o = (op_bufs *)p; CHECK(dt_gelu_bwd(&g_ctx, &o->dx, &o->dout, &o->x)); }
static void j_gelu_bwd_old(void *p) { op_bufs *o = (op_bufs *)p; old_gelu_bwd(F(&o->dx_old), F(&o->dout), F(&o->x), o->x.numel); }
static void j_ln_fwd(void *p) {
    op_bufs *o = (op_bufs *)p;
    CHECK(dt_layernorm_fwd(&g_ctx, &o->out, &o->mean, &o->rstd, &o->x, &o->w, &o->b, 1e-5f));
}
static void j_ln_fwd_old(void *p) {
    op_bufs *o = (op_bufs *)p;
    old_layernorm_fwd(F(&o->out_old), F(&o->mean_old), F(&o->rstd_old), F(&o->x), F(&o->w), F(&o->b), o->R, o->C, 1e-5f);
}
static void j_ln_bwd(void *p) {
    op_bufs *o = (op_bufs *)p;
    CHECK(dt_layernorm_bwd(&g_ctx, &o->dx, &o->dw, &o->db, &o->dout, &o->x, &o->w, &o->mean, &o->rstd));
}
static void j_ln_bwd_old(void *p) {
    op_bufs *o = (op_bufs *)p;
    old_layernorm_bwd(F(&o->dx_old), F(&o->dw), F(&o->db), F(&o->dout), F(&o->x), F(&o->w), F(&o->mean), F(&o->rstd),
                      o->R, o->C);
}
static void j_xent_fwd(void *p) {
    op_bufs *o = (op_bufs *)p;
    CHECK(dt_softmax_xent_fwd(&g_ctx, &o->loss, NULL, &o->out, &o->x, &o->tg, -1));
}
static void j_xent_fwd_old(void *p) {
    op_bufs *o = (op_bufs *)p;
    o->loss_old = old_softmax_xent_fwd(F(&o->out_old), F(&o->x), (const int32_t *)o->tg.data, o->R, o->C);
}
static void j_xent_bwd(void *p) { op_bufs *o = (op_bufs *)p; CHECK(dt_softmax_xent_bwd(&g_ctx, &o->dx, &o->out, &o->tg, -1, 1.0f)); }
static void j_xent_bwd_old(void *p) {
    op_bufs *o = (op_bufs *)p;
    old_softmax_xent_bwd(F(&o->dx_old), F(&o->out), (const int32_t *)o->tg.data, o->R, o->C, 1.0f);
}

typedef struct op_case {
    const char *op, *model;
    job_fn after, before;
    double bytes_per_elem; /* of the [R, C] tensors; per-row and per-column vectors left out */
    int is_bwd;            /* compares dx (accumulated: both start from 0 and run equally often) */
} op_case;

static const op_case g_ops[] = {
    {"gelu_fwd", "r4 w4", j_gelu_fwd, j_gelu_fwd_old, 8, 0},
    {"gelu_bwd", "r12 w4", j_gelu_bwd, j_gelu_bwd_old, 16, 1},
    {"layernorm_fwd", "r4 w4", j_ln_fwd, j_ln_fwd_old, 8, 0},
    {"layernorm_bwd", "r12 w4", j_ln_bwd, j_ln_bwd_old, 16, 1},
    {"softmax_xent_fwd", "r4 w4", j_xent_fwd, j_xent_fwd_old, 8, 0},
    {"softmax_xent_bwd", "r8 w4", j_xent_bwd, j_xent_bwd_old, 12, 1},
};

typedef struct shape_case {
    const char *name;
    int64_t R, C;           /* gelu's [R, C] */
    int64_t lnR, lnC;       /* layernorm's */
    int64_t smR, smV;       /* softmax_xent's */
} shape_case;

static const shape_case g_shapes[] = {
    /* B 8, T 256: 2048 tokens; C 256, MLP 4C = 1024, V 256 */
    {"gpt B8 T256 C256 V256", 2048, 1024, 2048, 256, 2048, 256},
    /* GPT-2 124M widths on 1024 tokens; the logits of 128 of them over GPT-2's vocab (26 MB) */
    {"gpt2 T1024 C768 V50257", 1024, 3072, 1024, 768, 128, 50257},
};

static void bench_ops(int tsv) {
    int s, k;
    if (!tsv) {
        printf("\n== 1. ops before (the scalar loops up to a815b49) and after (dt_tensor.h now), 1 thread;\n"
               "   GB/s = bytes of the [rows, cols] tensors read + written / time; memcpy of the op's input in the same run\n");
        printf("%-24s %-17s %-13s %7s %9s %9s %7s %9s %7s %8s %9s\n", "shape", "op", "rows x cols", "bytes", "memcpy",
               "before", "/memcpy", "after", "/memcpy", "speedup", "max rel");
        printf("%-24s %-17s %-13s %7s %9s %9s %7s %9s %7s %8s %9s\n", "", "", "", "/elem", "GB/s", "GB/s", "", "GB/s",
               "", "", "diff");
    }
    for (s = 0; s < (int)(sizeof g_shapes / sizeof g_shapes[0]); s++) {
        const shape_case *sc = &g_shapes[s];
        for (k = 0; k < (int)(sizeof g_ops / sizeof g_ops[0]); k++) {
            const op_case *oc = &g_ops[k];
            op_bufs o;
            job_fn fn[3];
            void *arg[3];
            double med[3], bytes, mc, before, after, diff;
            int64_t R = sc->R, C = sc->C;
            char shape[32];
            if (!strncmp(oc->op, "layernorm", 9)) { R = sc->lnR; C = sc->lnC; }
            if (!strncmp(oc->op, "softmax", 7)) { R = sc->smR; C = sc->smV; }
            bufs_setup(&o, R, C);
            if (oc->after == j_ln_bwd) j_ln_fwd(&o); /* mean, rstd for the backward */
            if (oc->after == j_xent_bwd) j_xent_fwd(&o); /* probs */
            fn[0] = j_memcpy; fn[1] = oc->before; fn[2] = oc->after;
            arg[0] = arg[1] = arg[2] = &o;
            time_jobs(3, fn, arg, REPS, med);
            bytes = oc->bytes_per_elem * (double)(R * C);
            mc = 8.0 * (double)(R * C) / med[0] / 1e9;
            before = bytes / med[1] / 1e9;
            after = bytes / med[2] / 1e9;
            /* the outputs agree: fwd out (and loss), or the accumulated dx (each ran 1 + REPS times) */
            diff = oc->is_bwd ? rel_diff(F(&o.dx), F(&o.dx_old), o.x.numel) : rel_diff(F(&o.out), F(&o.out_old), o.x.numel);
            if (oc->after == j_xent_fwd && fabs((double)o.loss - o.loss_old) > 1e-5 * fabs((double)o.loss_old)) diff = 1;
            if (diff > 1e-5) g_bad = 1;
            snprintf(shape, sizeof shape, "%lld x %lld", (long long)R, (long long)C);
            if (tsv)
                printf("%s\t%lld\t%lld\t%.6f\t%.6f\t%.6f\n", oc->op, (long long)R, (long long)C, 1e3 * med[2], 1e3 * med[1],
                       1e3 * med[0]);
            else
                printf("%-24s %-17s %-13s %7s %9.2f %9.2f %7.3f %9.2f %7.3f %7.1fx %9.1e%s\n", k ? "" : sc->name, oc->op,
                       shape, oc->model, mc, before, before / mc, after, after / mc, med[1] / med[2], diff,
                       diff > 1e-5 ? " !!" : "");
            bufs_free(&o);
        }
    }
}

/* ---------------------------------------------------------------- 1b. attention and bias_add_bwd

   attention fwd / bwd (dt: GEMMs per batch and head, the lower triangle in 64-row blocks) and
   bias_add_bwd (dt: whole rows into double accumulators) against the old loops. GFLOP/s counts
   the causal products only: fwd 2 * B*H*T(T+1)/2 * hs * 2, bwd twice that. */

typedef struct att_bufs {
    int64_t B, T, C;
    int H;
    dt_tensor qkv, out, out_old, att, att_old, dout, dqkv, dqkv_old, datt_row;
} att_bufs;

static void j_att_fwd(void *p) { att_bufs *a = (att_bufs *)p; CHECK(dt_attention_fwd(&g_ctx, &a->out, &a->att, &a->qkv, a->H)); }
static void j_att_fwd_old(void *p) {
    att_bufs *a = (att_bufs *)p;
    old_attention_fwd(F(&a->out_old), F(&a->att_old), F(&a->qkv), a->B, a->T, a->C, a->H);
}
static void j_att_bwd(void *p) {
    att_bufs *a = (att_bufs *)p;
    CHECK(dt_attention_bwd(&g_ctx, &a->dqkv, &a->dout, &a->qkv, &a->att, a->H));
}
static void j_att_bwd_old(void *p) {
    att_bufs *a = (att_bufs *)p;
    old_attention_bwd(F(&a->dqkv_old), F(&a->datt_row), F(&a->dout), F(&a->qkv), F(&a->att), a->B, a->T, a->C, a->H);
}
static void j_bias_bwd(void *p) { op_bufs *o = (op_bufs *)p; CHECK(dt_bias_add_bwd(&g_ctx, &o->db, &o->dout)); }
static void j_bias_bwd_old(void *p) { op_bufs *o = (op_bufs *)p; old_bias_add_bwd(F(&o->dw), F(&o->dout), o->R, o->C); }

static void bench_attention(void) {
    static const struct { const char *name; int64_t B, T, C; int H; } shapes[] = {
        {"gpt B8 T256 C256 H4", 8, 256, 256, 4},
        {"gpt2 B1 T1024 C768 H12", 1, 1024, 768, 12},
    };
    static const int64_t bias_shapes[][2] = {{2048, 768}, {2048, 1024}, {1024, 2304}};
    int s, k;
    printf("\n== 1b. attention and bias_add_bwd before (the loops up to 3dbc65d) and after, 1 thread\n");
    printf("%-24s %-14s %10s %10s %8s %9s %9s\n", "shape", "op", "before ms", "after ms", "speedup", "GFLOP/s", "max rel");
    printf("%-24s %-14s %10s %10s %8s %9s %9s\n", "", "", "", "", "", "after", "diff");
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        att_bufs a;
        int64_t hs;
        memset(&a, 0, sizeof a);
        a.B = shapes[s].B; a.T = shapes[s].T; a.C = shapes[s].C; a.H = shapes[s].H;
        hs = a.C / a.H;
        a.qkv = mk(a.B, a.T, 3 * a.C, 0); a.out = mk(a.B, a.T, a.C, 0); a.out_old = mk(a.B, a.T, a.C, 0);
        a.att = mk(a.B, a.H, a.T, a.T); a.att_old = mk(a.B, a.H, a.T, a.T); a.dout = mk(a.B, a.T, a.C, 0);
        a.dqkv = mk(a.B, a.T, 3 * a.C, 0); a.dqkv_old = mk(a.B, a.T, 3 * a.C, 0); a.datt_row = mk(a.T, 0, 0, 0);
        randn(&a.qkv, "qkv", 1.0); randn(&a.dout, "dout", 1.0);
        for (k = 0; k < 2; k++) {
            job_fn fn[2];
            void *arg[2] = {&a, &a};
            double med[2], flop = 2.0 * (double)(a.B * a.H) * (double)(a.T * (a.T + 1) / 2) * (double)hs * 2.0, diff;
            fn[0] = k ? j_att_bwd_old : j_att_fwd_old; fn[1] = k ? j_att_bwd : j_att_fwd;
            time_jobs(2, fn, arg, REPS, med);
            if (k) flop *= 2;
            /* fwd: out and att; bwd: the accumulated dqkv (both ran 1 + REPS times from the same att) */
            diff = k ? rel_diff(F(&a.dqkv), F(&a.dqkv_old), a.dqkv.numel) : rel_diff(F(&a.out), F(&a.out_old), a.out.numel);
            if (!k && rel_diff(F(&a.att), F(&a.att_old), a.att.numel) > diff) diff = rel_diff(F(&a.att), F(&a.att_old), a.att.numel);
            if (diff > 1e-5) g_bad = 1;
            printf("%-24s %-14s %10.2f %10.2f %7.1fx %9.2f %9.1e%s\n", k ? "" : shapes[s].name,
                   k ? "attention_bwd" : "attention_fwd", 1e3 * med[0], 1e3 * med[1], med[0] / med[1], flop / med[1] / 1e9,
                   diff, diff > 1e-5 ? " !!" : "");
        }
        dt_tensor_free(&g_ctx, &a.qkv); dt_tensor_free(&g_ctx, &a.out); dt_tensor_free(&g_ctx, &a.out_old);
        dt_tensor_free(&g_ctx, &a.att); dt_tensor_free(&g_ctx, &a.att_old); dt_tensor_free(&g_ctx, &a.dout);
        dt_tensor_free(&g_ctx, &a.dqkv); dt_tensor_free(&g_ctx, &a.dqkv_old); dt_tensor_free(&g_ctx, &a.datt_row);
    }
    printf("%-24s %-14s %10s %10s %8s %9s %9s\n", "", "", "", "", "", "GB/s", "");
    for (s = 0; s < (int)(sizeof bias_shapes / sizeof bias_shapes[0]); s++) {
        op_bufs o;
        job_fn fn[2] = {j_bias_bwd_old, j_bias_bwd};
        void *arg[2];
        double med[2], diff;
        char name[48];
        bufs_setup(&o, bias_shapes[s][0], bias_shapes[s][1]);
        arg[0] = arg[1] = &o;
        time_jobs(2, fn, arg, REPS, med);
        diff = rel_diff(F(&o.db), F(&o.dw), o.C); /* the same sums, run equally often: same bits */
        if (diff != 0) g_bad = 1;
        snprintf(name, sizeof name, "dout %lld x %lld", (long long)o.R, (long long)o.C);
        printf("%-24s %-14s %10.3f %10.3f %7.1fx %9.2f %9.1e%s\n", name, "bias_add_bwd", 1e3 * med[0], 1e3 * med[1],
               med[0] / med[1], 4.0 * (double)(o.R * o.C) / med[1] / 1e9, diff, diff != 0 ? " !!" : "");
        bufs_free(&o);
    }
}

/* ---------------------------------------------------------------- 2. one GPT step */

enum { GB = 8, GT = 256, GC = 256, GH = 4, GL = 4, GV = 256, GN = GB * GT };

/* The tensors of one layer (the layers of a step are alike: each op is timed once, counted L
   times) and of the head. */
typedef struct gpt_bufs {
    dt_tensor x, ln, mean, rstd, lnw, lnb, dln, dlnw, dlnb;           /* [N, C], [N], [C] */
    dt_tensor wqkv, bqkv, qkv, dqkv, dwqkv, dbqkv;                     /* [3C, C], [N, 3C] */
    dt_tensor att, atty, datty, datt_row;                              /* [B, H, T, T], [B, T, C], [T] */
    dt_tensor wproj, bproj, proj, dproj, dwproj, dbproj;               /* [C, C], [N, C] */
    dt_tensor wfc, bfc, fc, dfc, dwfc, dbfc, act, dact;                /* [4C, C], [N, 4C] */
    dt_tensor wfc2, bfc2, fc2, dfc2, dwfc2, dbfc2;                     /* [C, 4C], [N, C] */
    dt_tensor res, dres;                                               /* [N, C] */
    dt_tensor wlm, logits, probs, dlogits, dwlm, tg;                   /* [V, C], [N, V] */
    float loss;
} gpt_bufs;

static gpt_bufs g;

static void gpt_setup(void) {
    dt_tensor *all[64];
    int n = 0, i;
    int64_t r;
#define T2(t, a, b) (g.t = mk(a, b, 0, 0), all[n++] = &g.t)
#define T1(t, a) (g.t = mk(a, 0, 0, 0), all[n++] = &g.t)
    T2(x, GN, GC); T2(ln, GN, GC); T1(mean, GN); T1(rstd, GN); T1(lnw, GC); T1(lnb, GC); T2(dln, GN, GC);
    T1(dlnw, GC); T1(dlnb, GC);
    T2(wqkv, 3 * GC, GC); T1(bqkv, 3 * GC); T2(dwqkv, 3 * GC, GC); T1(dbqkv, 3 * GC);
    g.qkv = mk(GB, GT, 3 * GC, 0); all[n++] = &g.qkv; g.dqkv = mk(GB, GT, 3 * GC, 0); all[n++] = &g.dqkv;
    g.att = mk(GB, GH, GT, GT); all[n++] = &g.att;
    T1(datt_row, GT);
    g.atty = mk(GB, GT, GC, 0); all[n++] = &g.atty; g.datty = mk(GB, GT, GC, 0); all[n++] = &g.datty;
    T2(wproj, GC, GC); T1(bproj, GC); T2(proj, GN, GC); T2(dproj, GN, GC); T2(dwproj, GC, GC); T1(dbproj, GC);
    T2(wfc, 4 * GC, GC); T1(bfc, 4 * GC); T2(fc, GN, 4 * GC); T2(dfc, GN, 4 * GC); T2(dwfc, 4 * GC, GC);
    T1(dbfc, 4 * GC); T2(act, GN, 4 * GC); T2(dact, GN, 4 * GC);
    T2(wfc2, GC, 4 * GC); T1(bfc2, GC); T2(fc2, GN, GC); T2(dfc2, GN, GC); T2(dwfc2, GC, 4 * GC); T1(dbfc2, GC);
    T2(res, GN, GC); T2(dres, GN, GC);
    T2(wlm, GV, GC); T2(logits, GN, GV); T2(probs, GN, GV); T2(dlogits, GN, GV); T2(dwlm, GV, GC);
    g.tg = mk(GN, 0, 0, 0);
    g.tg.dtype = DT_I32;
#undef T1
#undef T2
    for (i = 0; i < n; i++) randn(all[i], "p", 0.02);
    randn(&g.x, "x", 1.0); randn(&g.lnw, "lnw", 1.0); randn(&g.fc, "fc", 1.0); randn(&g.logits, "logits", 1.0);
    randn(&g.dres, "dres", 0.01); randn(&g.qkv, "qkv", 1.0);
    for (r = 0; r < GN; r++) ((int32_t *)g.tg.data)[r] = (int32_t)((r * 131) % GV);
}

static void gpt_free(void) {
    dt_tensor *t = (dt_tensor *)&g;
    size_t i;
    g.tg.dtype = DT_F32;
    for (i = 0; i < offsetof(gpt_bufs, loss) / sizeof(dt_tensor); i++) dt_tensor_free(&g_ctx, &t[i]);
}

static void s_mm_qkv_f(void *p) { (void)p; CHECK(dt_linear_fwd(&g_ctx, &g.qkv, &g.ln, &g.wqkv, NULL)); }
static void s_mm_qkv_b(void *p) { (void)p; CHECK(dt_linear_bwd(&g_ctx, &g.dln, &g.dwqkv, NULL, &g.dqkv, &g.ln, &g.wqkv)); }
static void s_mm_proj_f(void *p) { (void)p; CHECK(dt_linear_fwd(&g_ctx, &g.proj, &g.atty, &g.wproj, NULL)); }
static void s_mm_proj_b(void *p) { (void)p; CHECK(dt_linear_bwd(&g_ctx, &g.datty, &g.dwproj, NULL, &g.dproj, &g.atty, &g.wproj)); }
static void s_mm_fc_f(void *p) { (void)p; CHECK(dt_linear_fwd(&g_ctx, &g.fc, &g.ln, &g.wfc, NULL)); }
static void s_mm_fc_b(void *p) { (void)p; CHECK(dt_linear_bwd(&g_ctx, &g.dln, &g.dwfc, NULL, &g.dfc, &g.ln, &g.wfc)); }
static void s_mm_fc2_f(void *p) { (void)p; CHECK(dt_linear_fwd(&g_ctx, &g.fc2, &g.act, &g.wfc2, NULL)); }
static void s_mm_fc2_b(void *p) { (void)p; CHECK(dt_linear_bwd(&g_ctx, &g.dact, &g.dwfc2, NULL, &g.dfc2, &g.act, &g.wfc2)); }
static void s_mm_lm_f(void *p) { (void)p; CHECK(dt_linear_fwd(&g_ctx, &g.logits, &g.ln, &g.wlm, NULL)); }
static void s_mm_lm_b(void *p) { (void)p; CHECK(dt_linear_bwd(&g_ctx, &g.dln, &g.dwlm, NULL, &g.dlogits, &g.ln, &g.wlm)); }
static void s_att_f(void *p) { (void)p; CHECK(dt_attention_fwd(&g_ctx, &g.atty, &g.att, &g.qkv, GH)); }
static void s_att_b(void *p) { (void)p; CHECK(dt_attention_bwd(&g_ctx, &g.dqkv, &g.datty, &g.qkv, &g.att, GH)); }
static void s_att_f_old(void *p) { (void)p; old_attention_fwd(F(&g.atty), F(&g.att), F(&g.qkv), GB, GT, GC, GH); }
static void s_att_b_old(void *p) {
    (void)p;
    old_attention_bwd(F(&g.dqkv), F(&g.datt_row), F(&g.datty), F(&g.qkv), F(&g.att), GB, GT, GC, GH);
}
static void s_bias_qkv_f_old(void *p) { (void)p; old_bias_add_fwd(F(&g.qkv), F(&g.bqkv), GN, 3 * GC); }
static void s_bias_c_f_old(void *p) { (void)p; old_bias_add_fwd(F(&g.proj), F(&g.bproj), GN, GC); }
static void s_bias_fc_f_old(void *p) { (void)p; old_bias_add_fwd(F(&g.fc), F(&g.bfc), GN, 4 * GC); }
static void s_bias_qkv_b_old(void *p) { (void)p; old_bias_add_bwd(F(&g.dbqkv), F(&g.dqkv), GN, 3 * GC); }
static void s_bias_c_b_old(void *p) { (void)p; old_bias_add_bwd(F(&g.dbproj), F(&g.dproj), GN, GC); }
static void s_bias_fc_b_old(void *p) { (void)p; old_bias_add_bwd(F(&g.dbfc), F(&g.dfc), GN, 4 * GC); }
static void s_bias_qkv_f(void *p) { (void)p; CHECK(dt_bias_add_fwd(&g_ctx, &g.qkv, &g.bqkv)); }
static void s_bias_qkv_b(void *p) { (void)p; CHECK(dt_bias_add_bwd(&g_ctx, &g.dbqkv, &g.dqkv)); }
static void s_bias_c_f(void *p) { (void)p; CHECK(dt_bias_add_fwd(&g_ctx, &g.proj, &g.bproj)); }
static void s_bias_c_b(void *p) { (void)p; CHECK(dt_bias_add_bwd(&g_ctx, &g.dbproj, &g.dproj)); }
static void s_bias_fc_f(void *p) { (void)p; CHECK(dt_bias_add_fwd(&g_ctx, &g.fc, &g.bfc)); }
static void s_bias_fc_b(void *p) { (void)p; CHECK(dt_bias_add_bwd(&g_ctx, &g.dbfc, &g.dfc)); }
static void s_add_f(void *p) { (void)p; CHECK(dt_add(&g_ctx, &g.res, &g.x, &g.proj)); }
static void s_add_b(void *p) { (void)p; CHECK(dt_axpy(&g_ctx, &g.dproj, 1.0f, &g.dres)); }
static void s_gelu_f(void *p) { (void)p; CHECK(dt_gelu_fwd(&g_ctx, &g.act, &g.fc)); }
static void s_gelu_f_old(void *p) { (void)p; old_gelu_fwd(F(&g.act), F(&g.fc), g.fc.numel); }
static void s_gelu_b(void *p) { (void)p; CHECK(dt_gelu_bwd(&g_ctx, &g.dfc, &g.dact, &g.fc)); }
static void s_gelu_b_old(void *p) { (void)p; old_gelu_bwd(F(&g.dfc), F(&g.dact), F(&g.fc), g.fc.numel); }
static void s_ln_f(void *p) { (void)p; CHECK(dt_layernorm_fwd(&g_ctx, &g.ln, &g.mean, &g.rstd, &g.x, &g.lnw, &g.lnb, 1e-5f)); }
static void s_ln_f_old(void *p) {
    (void)p;
    old_layernorm_fwd(F(&g.ln), F(&g.mean), F(&g.rstd), F(&g.x), F(&g.lnw), F(&g.lnb), GN, GC, 1e-5f);
}
static void s_ln_b(void *p) { (void)p; CHECK(dt_layernorm_bwd(&g_ctx, &g.dres, &g.dlnw, &g.dlnb, &g.dln, &g.x, &g.lnw, &g.mean, &g.rstd)); }
static void s_ln_b_old(void *p) {
    (void)p;
    old_layernorm_bwd(F(&g.dres), F(&g.dlnw), F(&g.dlnb), F(&g.dln), F(&g.x), F(&g.lnw), F(&g.mean), F(&g.rstd), GN, GC);
}
static void s_xent_f(void *p) { (void)p; CHECK(dt_softmax_xent_fwd(&g_ctx, &g.loss, NULL, &g.probs, &g.logits, &g.tg, -1)); }
static void s_xent_f_old(void *p) { (void)p; g.loss = old_softmax_xent_fwd(F(&g.probs), F(&g.logits), (const int32_t *)g.tg.data, GN, GV); }
static void s_xent_b(void *p) { (void)p; CHECK(dt_softmax_xent_bwd(&g_ctx, &g.dlogits, &g.probs, &g.tg, -1, 1.0f)); }
static void s_xent_b_old(void *p) { (void)p; old_softmax_xent_bwd(F(&g.dlogits), F(&g.probs), (const int32_t *)g.tg.data, GN, GV, 1.0f); }

typedef struct step_call {
    const char *group;
    int calls;            /* per step */
    job_fn after, before; /* before NULL: the same op before and after */
} step_call;

static const step_call g_step[] = {
    {"matmul", GL, s_mm_qkv_f, NULL}, {"matmul", GL, s_mm_qkv_b, NULL}, {"matmul", GL, s_mm_proj_f, NULL},
    {"matmul", GL, s_mm_proj_b, NULL}, {"matmul", GL, s_mm_fc_f, NULL}, {"matmul", GL, s_mm_fc_b, NULL},
    {"matmul", GL, s_mm_fc2_f, NULL}, {"matmul", GL, s_mm_fc2_b, NULL}, {"matmul", 1, s_mm_lm_f, NULL},
    {"matmul", 1, s_mm_lm_b, NULL},
    {"attention", GL, s_att_f, s_att_f_old}, {"attention", GL, s_att_b, s_att_b_old},
    {"bias", GL, s_bias_qkv_f, s_bias_qkv_f_old}, {"bias", GL, s_bias_qkv_b, s_bias_qkv_b_old},
    {"bias", 2 * GL, s_bias_c_f, s_bias_c_f_old}, {"bias", 2 * GL, s_bias_c_b, s_bias_c_b_old},
    {"bias", GL, s_bias_fc_f, s_bias_fc_f_old}, {"bias", GL, s_bias_fc_b, s_bias_fc_b_old},
    {"add", 2 * GL, s_add_f, NULL}, {"add", 2 * GL, s_add_b, NULL},
    {"gelu", GL, s_gelu_f, s_gelu_f_old}, {"gelu", GL, s_gelu_b, s_gelu_b_old},
    {"layernorm", 2 * GL + 1, s_ln_f, s_ln_f_old}, {"layernorm", 2 * GL + 1, s_ln_b, s_ln_b_old},
    {"softmax_xent", 1, s_xent_f, s_xent_f_old}, {"softmax_xent", 1, s_xent_b, s_xent_b_old},
};
#define N_STEP ((int)(sizeof g_step / sizeof g_step[0]))

static void bench_step(void) {
    static const char *groups[] = {"matmul", "attention", "bias", "add", "gelu", "layernorm", "softmax_xent"};
    double before[8] = {0}, after[8] = {0}, tb = 0, ta = 0, med[2];
    int i, k, ng = (int)(sizeof groups / sizeof groups[0]);
    gpt_setup(); /* qkv and the attention output are [B, T, *]: dt_linear takes them as [B * T, *] rows */
    for (i = 0; i < N_STEP; i++) {
        const step_call *c = &g_step[i];
        job_fn fn[2];
        void *arg[2] = {NULL, NULL};
        fn[0] = c->after; fn[1] = c->before ? c->before : c->after;
        time_jobs(c->before ? 2 : 1, fn, arg, REPS, med);
        if (!c->before) med[1] = med[0];
        for (k = 0; k < ng; k++)
            if (!strcmp(groups[k], c->group)) { after[k] += c->calls * med[0]; before[k] += c->calls * med[1]; }
    }
    for (k = 0; k < ng; k++) { tb += before[k]; ta += after[k]; }
    printf("\n== 2. time per op in one GPT training step (fwd + bwd): B %d, T %d, C %d, %d heads, %d layers, MLP 4C,\n"
           "   vocab %d; 1 thread (OpenBLAS too); each op timed alone (median of %d), times its calls per step\n",
           GB, GT, GC, GH, GL, GV, REPS);
    printf("%-14s %10s %7s %10s %7s\n", "op", "before ms", "share", "after ms", "share");
    for (k = 0; k < ng; k++)
        printf("%-14s %10.2f %6.1f%% %10.2f %6.1f%%\n", groups[k], 1e3 * before[k], 100 * before[k] / tb, 1e3 * after[k],
               100 * after[k] / ta);
    printf("%-14s %10.2f %7s %10.2f %7s   (step %.2fx faster)\n", "step", 1e3 * tb, "", 1e3 * ta, "", tb / ta);
    printf("share of the step: attention + bias %.1f%% -> %.1f%%, gelu + layernorm + softmax_xent %.1f%% -> %.1f%%\n",
           100 * (before[1] + before[2]) / tb, 100 * (after[1] + after[2]) / ta,
           100 * (before[4] + before[5] + before[6]) / tb, 100 * (after[4] + after[5] + after[6]) / ta);
    gpt_free();
}

int main(int argc, char **argv) {
    int tsv = argc > 1 && !strcmp(argv[1], "--tsv");
    double t0 = now_s();
    g_wall = argc > 1 && !strcmp(argv[1], "--wall");
    if (argc > 1 && !tsv && !g_wall) {
        fprintf(stderr, "usage: %s [--tsv | --wall]\n", argv[0]);
        return 2;
    }
#ifdef DT_CBLAS
    openblas_set_num_threads(1);
#endif
    CHECK(dt_ctx_init(&g_ctx, NULL));
    if (!tsv) {
        printf("bench/ops: gelu, layernorm, softmax_xent, attention, bias before and after; their share of a GPT step\n");
        printf("timing: median of %d, %s\n", REPS, g_wall ? "wall clock (CLOCK_MONOTONIC)" : "thread CPU time (CLOCK_THREAD_CPUTIME_ID)");
        printf("ops path: %s; GEMM: %s\n",
#ifdef DT__TENSOR_SSE2
               "SSE2 (4 lanes)",
#else
               "plain C (DT_TENSOR_NO_SIMD or no SSE2)",
#endif
#ifdef DT_CBLAS
               "OpenBLAS (DT_CBLAS), 1 thread"
#else
               "dt's portable GEMM"
#endif
        );
    }
    bench_ops(tsv);
    if (!tsv) {
        bench_attention();
        bench_step();
        printf("\nbefore and after agree (max rel diff <= 1e-5): %s; total time %.1f s\n", g_bad ? "NO" : "yes", now_s() - t0);
    }
    dt_ctx_shutdown(&g_ctx);
    return g_bad;
}
