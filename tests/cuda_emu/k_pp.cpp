// tests/cuda_emu/k_pp.cpp - the pipeline runtime (dt_pp_run) on CUDA tensors, on the emulator: its
// buffer pool lives in the layout, so the first run makes it and every later run of the same
// schedule allocates and frees nothing on the device (dt's counters, and the emulator's own, which
// a launcher or the runtime cannot hide a cudaMalloc from), with the gradients of the first run
// bit for bit (a reused buffer holds the last step's values: nothing may read them); the same
// steps on CPU tensors give those gradients within the GEMMs' bound; dt_layout_free gives the
// pool back (its frees counted). The model: one stage (pp 1), the interleaved schedule with v = 2
// chunks (so a boundary activation and its gradient pass through the pool in memory), M = 4
// micro-batches of B rows; chunk c is y = x W_c^T (D x D), the loss 0.5 |y_1|^2 (dy = y_1).
#include <cuda_runtime.h>
#include <math.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "tests/dt_test.h"

enum { D = 8, B = 3, M = 4, STEPS = 3 };

#define check(name, ok, ...) ((ok) ? dt_test_pass(name) : dt_test_fail(name, __VA_ARGS__))

#ifdef DT_CUDA_EMU
typedef dt_emu_counters rt_counters;
static void rt_counts(rt_counters *c) { dt_emu_get_counters(c); }
#else
struct rt_counters { long long syncs, allocs, frees, h2d_bytes, h2d_calls, d2h_bytes, d2h_calls; };
static void rt_counts(rt_counters *c) { memset(c, 0, sizeof *c); }
#endif

struct net {
    dt_ctx *ctx;
    dt_tensor w[2], dw[2], x[M], y[M]; // y[i]: chunk 1's output, kept for its backward (dy = y)
    const dt_tensor *in1[M];           // chunk 1's input: the runtime's buffer, valid until its B
};

static dt_tensor mk(dt_ctx *ctx, int64_t a, int64_t b, dt_device dev) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32, d.ndim = 2, d.shape[0] = a, d.shape[1] = b, d.device = dev;
    if (dt_tensor_create(ctx, &t, &d)) {
        fprintf(stderr, "dt_tensor_create: %s\n", dt_ctx_error(ctx));
        exit(2);
    }
    return t;
}
static void upload(dt_ctx *ctx, dt_tensor *t, uint64_t seed) {
    std::vector<float> h((size_t)t->numel);
    for (size_t i = 0; i < h.size(); i++) h[i] = 2.0f * dt_rng_uniform(7, seed, (uint64_t)i) - 1.0f;
    dt_tensor hv = mk(ctx, t->shape[0], t->shape[1], DT_CPU);
    memcpy(hv.data, h.data(), h.size() * sizeof(float));
    dt_tensor_copy(ctx, t, &hv);
    dt_tensor_free(ctx, &hv);
}
static std::vector<float> values(dt_ctx *ctx, const dt_tensor *t) {
    dt_tensor hv = mk(ctx, t->shape[0], t->shape[1], DT_CPU);
    dt_tensor_copy(ctx, &hv, t);
    std::vector<float> v((const float *)hv.data, (const float *)hv.data + hv.numel);
    dt_tensor_free(ctx, &hv);
    return v;
}

static dt_status fwd(void *user, int c, int i, dt_tensor *out, const dt_tensor *in) {
    net *n = (net *)user;
    if (c == 0) return dt_linear_fwd(n->ctx, out, &n->x[i], &n->w[0], NULL);
    n->in1[i] = in;
    return dt_linear_fwd(n->ctx, &n->y[i], in, &n->w[1], NULL);
}
static dt_status bwd(void *user, int c, int i, dt_tensor *din, const dt_tensor *dout, dt_pp_part part) {
    net *n = (net *)user;
    (void)part;
    if (c == 1) return dt_linear_bwd(n->ctx, din, &n->dw[1], NULL, &n->y[i], n->in1[i], &n->w[1]);
    return dt_linear_bwd(n->ctx, NULL, &n->dw[0], NULL, dout, &n->x[i], &n->w[0]);
}

static void net_init(net *n, dt_ctx *ctx, dt_device dev) {
    n->ctx = ctx;
    for (int c = 0; c < 2; c++) {
        n->w[c] = mk(ctx, D, D, dev);
        n->dw[c] = mk(ctx, D, D, dev);
        upload(ctx, &n->w[c], 10 + (uint64_t)c);
    }
    for (int i = 0; i < M; i++) {
        n->x[i] = mk(ctx, B, D, dev);
        n->y[i] = mk(ctx, B, D, dev);
        upload(ctx, &n->x[i], 20 + (uint64_t)i);
    }
}
static void net_free(net *n) {
    for (int c = 0; c < 2; c++) dt_tensor_free(n->ctx, &n->w[c]), dt_tensor_free(n->ctx, &n->dw[c]);
    for (int i = 0; i < M; i++) dt_tensor_free(n->ctx, &n->x[i]), dt_tensor_free(n->ctx, &n->y[i]);
}

// One step: zeroed gradients (a device memset), one dt_pp_run; the gradients, dw0 then dw1.
static std::vector<float> step(dt_layout *l, net *n, const dt_pp_schedule *s) {
    dt_pp_model pm;
    memset(&pm, 0, sizeof pm);
    pm.user = n, pm.forward = fwd, pm.backward = bwd;
    pm.act.ndim = 2, pm.act.shape[0] = B, pm.act.shape[1] = D;
    std::vector<float> g;
    for (int c = 0; c < 2; c++)
        if (dt_tensor_fill(n->ctx, &n->dw[c], 0.0)) return g;
    if (dt_pp_run(l, NULL, s, &pm, NULL)) {
        dt_test_fail("pp_run_succeeds", "%s", dt_ctx_error(n->ctx));
        return g;
    }
    if (dt_ctx_sync(n->ctx)) return g;
    for (int c = 0; c < 2; c++) {
        std::vector<float> v = values(n->ctx, &n->dw[c]);
        g.insert(g.end(), v.begin(), v.end());
    }
    return g;
}

int main(void) {
    dt_ctx ctx, cpu;
    dt_ctx_desc cd;
    dt_comm *world = NULL, *cworld = NULL;
    dt_layout *l = NULL, *cl = NULL;
    dt_pp_schedule *s = NULL, *cs = NULL;
    dt_pp_desc sd;
    net n, cn;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &cd) || dt_comm_create_world(&ctx, &world, NULL) || dt_layout_create(world, &l, NULL) ||
        dt_ctx_init(&cpu, NULL) || dt_comm_create_world(&cpu, &cworld, NULL) || dt_layout_create(cworld, &cl, NULL)) {
        dt_test_fail("setup_ctx_and_layout", "%s / %s", dt_ctx_error(&ctx), dt_ctx_error(&cpu));
        return dt_test_finish();
    }
    memset(&sd, 0, sizeof sd);
    sd.kind = DT_PP_INTERLEAVED, sd.stages = 1, sd.micro = M, sd.chunks = 2;
    if (dt_pp_schedule_create(&ctx, &s, &sd) || dt_pp_schedule_create(&cpu, &cs, &sd)) {
        dt_test_fail("setup_schedule", "%s", dt_ctx_error(&ctx));
        return dt_test_finish();
    }
    net_init(&n, &ctx, DT_CUDA_DEVICE);
    net_init(&cn, &cpu, DT_CPU);
    dt_ctx_sync(&ctx);

    std::vector<float> first;
    long long pool_allocs = 0;
    for (int k = 0; k < STEPS; k++) {
        rt_counters e0, e1;
        dt_ctx_counters_reset(&ctx);
        rt_counts(&e0);
        std::vector<float> g = step(l, &n, s);
        rt_counts(&e1);
        dt_cuda_counters c = ctx.counters;
        if (g.empty()) {
            dt_test_fail("pp_step_runs", "step %d: %s", k + 1, dt_ctx_error(&ctx));
            break;
        }
        if (k == 0) {
            first = g;
            pool_allocs = c.allocs; // the pool (and the GEMMs' first scratch) is made here
            DT_TEST_CHECK("pp_first_run_makes_its_pool", c.allocs > 0);
            continue;
        }
        char name[96];
        snprintf(name, sizeof name, "pp_run_%d_allocates_and_frees_nothing_on_the_device", k + 1);
        check(name, c.allocs == 0 && c.frees == 0 && e1.allocs - e0.allocs == 0 && e1.frees - e0.frees == 0,
                      "ctx: allocs %lld frees %lld; the runtime saw allocs %lld frees %lld", (long long)c.allocs,
                      (long long)c.frees, e1.allocs - e0.allocs, e1.frees - e0.frees);
        snprintf(name, sizeof name, "pp_run_%d_gradients_equal_the_first_runs_bitwise", k + 1);
        dt_test_equal_bytes(name, g.data(), first.data(), first.size() * sizeof(float));
    }

    // The same steps on CPU tensors. A gradient element is a sum over the M B = 12 rows of
    // products of factors that are themselves sums of D = 8 products (y_1 = x W_0^T W_1^T, dy = y_1,
    // dx_1 = dy W_1): a chain of at most 3 D + M B = 36 roundings on either path, so each is within
    // gamma(36) S of the exact value, S the same formulas on |x| and |W| (computed below on the CPU),
    // and |cuda - cpu| <= 2 gamma(36) S.
    {
        std::vector<float> want = step(cl, &cn, cs);
        for (int c = 0; c < 2; c++) {
            float *w = (float *)cn.w[c].data;
            for (int64_t e = 0; e < cn.w[c].numel; e++) w[e] = fabsf(w[e]);
        }
        for (int i = 0; i < M; i++) {
            float *x = (float *)cn.x[i].data;
            for (int64_t e = 0; e < cn.x[i].numel; e++) x[e] = fabsf(x[e]);
        }
        std::vector<float> S = step(cl, &cn, cs);
        const double u = 1.0 / 16777216.0, g36 = 36 * u / (1 - 36 * u);
        size_t bad = 0, at = 0;
        for (size_t e = 0; e < want.size() && e < first.size(); e++)
            if (!(fabs((double)first[e] - want[e]) <= 2 * g36 * S[e] + 1e-30) && bad++ == 0) at = e;
        check("pp_cuda_gradients_equal_cpu_within_the_gemm_bound",
                      want.size() == first.size() && !want.empty() && bad == 0,
                      "%zu of %zu outside; first [%zu]: cuda %.9g, cpu %.9g, bound %.3g", bad, want.size(), at,
                      at < first.size() ? (double)first[at] : 0.0, at < want.size() ? (double)want[at] : 0.0,
                      at < S.size() ? 2 * g36 * S[at] : 0.0);
    }

    // The pool goes with the layout: its device buffers are freed there (counted).
    {
        int64_t before = ctx.counters.frees;
        dt_ctx_counters_reset(&ctx);
        dt_layout_free(l);
        l = NULL;
        check("pp_layout_free_frees_the_pool", ctx.counters.frees > 0 && ctx.counters.frees <= pool_allocs,
                      "frees %lld (the first run made %lld allocations; %lld before)", (long long)ctx.counters.frees,
                      pool_allocs, (long long)before);
    }
    net_free(&n);
    net_free(&cn);
    dt_pp_schedule_free(s);
    dt_pp_schedule_free(cs);
    dt_layout_free(cl);
    dt_comm_free(world);
    dt_comm_free(cworld);
    dt_ctx_shutdown(&ctx);
    dt_ctx_shutdown(&cpu);
    return dt_test_finish();
}
