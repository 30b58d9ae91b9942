// emu-modes: parallel (cuBLASLt runs on the host; the few kernels around it have k_*.cpp of their own)
// emu-tsan: skip
// tests/cuda_emu/k_lt.cpp - dt_linear's fused cuBLASLt GEMMs (kernels/dt_gemm.cu) on the emulator's
// cuBLASLt (tests/cuda_emu/include/cublasLt.h).
//
// 1. The launchers against sums in double: out = x w^T + bias, pre and gelu(pre) (the GELU_AUX_BIAS
//    epilogue), dw += dout^T x with dbias from the BGRADB epilogue; f32 and bf16 inputs; a view
//    that is 4-byte aligned only (the heuristic is told each pointer's alignment); Out % 8 != 0
//    with a GELU: no algorithm, nothing written (DT_K_NO_ALGO).
//    Bounds (u = 2^-24, gamma(k) = k u / (1 - k u)): a sum of k products, each exact in f32 on the
//    bf16 path and rounded once on the f32 path, is within gamma(k + 1) sum |terms| of the
//    double sum; GELU adds |gelu'(pre)| times pre's error plus its own rounding, 4 u |gelu| + 1e-7
//    (tanhf within 2 ulp, a few roundings around it). That is the emulator's GELU: cuBLASLt's header
//    does not say how its epilogue evaluates GELU, and a GPU's may use a fast tanh, so a GPU build
//    (bench/gpu, DT_EMU_STUBS) allows 2^-10 |gelu| + 1e-6 instead (an assumption until measured),
//    and takes a launcher's DT_K_NO_ALGO (the GPU's heuristic said no) as a skip.
// 2. The ops: dt_linear_fwd with a bias, dt_linear_gelu_fwd and dt_linear_bwd (dw + dbias) on
//    CUDA take the fused path (the emulator's count of each epilogue) and equal the CPU's separate
//    ops within 1e-5 (the CPU's GEMM and GELU round differently: see dt_gelu_fwd); the fallback
//    (O = 12) equally, and so does every fallback when the emulator's heuristic refuses every
//    epilogue (dt_emu_lt_refuse), a bias or pre view not on 16 bytes, dw or dbias alone, zero rows
//    and zero in-features; TF32 within its bound; a second call stays on the device; bad
//    arguments are named; the emulator reports nothing.
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <math.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_kernels.h"
#include "tests/dt_test.h"

static dt_ctx ctx;
static const double U = 1.0 / 16777216.0;
static double gam(double k) { return k * U / (1.0 - k * U); }
static double gelu_d(double v) { return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
static double gelu_grad_d(double v) {
    double t = tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
}

static std::vector<float> rnd(size_t n, uint64_t seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = 2.0f * dt_rng_uniform(31, seed, (uint64_t)i) - 1.0f;
    return v;
}
static uint16_t bf16_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float f32_of_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* The device copy of v as in_dtype (1 f32, 2 bf16), `pad` elements after the start of an
   allocation (a misaligned view); v becomes the values the device holds. */
static void *up(std::vector<float> &v, int in_dtype, size_t pad, void **base) {
    size_t es = in_dtype == 1 ? 4 : 2;
    char *p = NULL;
    cudaMalloc((void **)&p, (v.size() + pad) * es);
    *base = p;
    if (in_dtype == 1) cudaMemcpy(p + pad * es, v.data(), v.size() * 4, cudaMemcpyHostToDevice);
    else {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); i++) h[i] = bf16_of(v[i]), v[i] = f32_of_bf16(h[i]);
        cudaMemcpy(p + pad * es, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
    }
    return p + pad * es;
}
static std::vector<float> down(const void *d, size_t n) {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost);
    return h;
}
#ifdef DT_EMU_STUBS
static const double GELU_REL = 1.0 / 1024, GELU_ABS = 1e-6, OPS_RTOL = 2e-3; /* a GPU's GELU: assumed */
#else
static const double GELU_REL = 4 * U, GELU_ABS = 1e-7, OPS_RTOL = 1e-5;
#endif
/* A launcher's status: 0 goes on; DT_K_NO_ALGO on a GPU is its heuristic's answer (a skip). */
static int launched(const char *name, int st) {
#ifdef DT_EMU_STUBS
    if (st == DT_K_NO_ALGO) { dt_test_skip(name, "this GPU's cuBLASLt has no algorithm for it"); return 0; }
#endif
    if (st) { dt_test_fail(name, "status %d", st); return 0; }
    return 1;
}

/* PASS iff every |got - want| <= bound; else the first outside, with both values. */
static void within(const char *name, const std::vector<float> &got, const std::vector<double> &want,
                   const std::vector<double> &bound) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (!(fabs(got[i] - want[i]) <= bound[i]) && bad++ == 0) first = i;
    if (!bad) { dt_test_pass(name); return; }
    dt_test_fail(name, "%zu of %zu outside (first [%zu]: got %.9g, want %.9g, bound %.3g)", bad, got.size(), first,
                 (double)got[first], want[first], bound[first]);
}

static void launchers(int in_dtype, int64_t N, int64_t O, int64_t I, size_t pad, void *lt) {
    char name[160], tag[64];
    snprintf(tag, sizeof tag, "%s_N%lld_O%lld_I%lld%s", in_dtype == 1 ? "f32" : "bf16", (long long)N, (long long)O,
             (long long)I, pad ? "_misaligned_x" : "");
    std::vector<float> x = rnd((size_t)(N * I), 1), w = rnd((size_t)(O * I), 2), b = rnd((size_t)O, 3);
    std::vector<float> g = rnd((size_t)(N * O), 4), dw0 = rnd((size_t)(O * I), 5);
    void *bx, *bw, *bb, *bo, *bp, *bg1, *bdw, *bdb;
    const void *dx_ = up(x, in_dtype, pad, &bx), *dw_ = up(w, in_dtype, 0, &bw);
    float *db_ = (float *)up(b, 1, 0, &bb);
    std::vector<float> zero((size_t)(N * O), 0.0f), dbz((size_t)O, 7.0f);
    float *dout = (float *)up(zero, 1, 0, &bo), *dpre = (float *)up(zero, 1, 0, &bp);
    const void *dg = up(g, in_dtype, 0, &bg1);
    float *ddw = (float *)up(dw0, 1, 0, &bdw), *ddb = (float *)up(dbz, 1, 0, &bdb);
    /* forward: out = gelu(pre), pre = x w^T + b */
    int st = dt_k_linear_lt_fwd(lt, dout, dpre, dx_, dw_, db_, in_dtype, 1, N, O, I, 0, NULL, 0, NULL);
    snprintf(name, sizeof name, "lt_gelu_aux_bias_fwd_equals_double_sums_%s", tag);
    if (launched(name, st)) {
        std::vector<double> pw((size_t)(N * O)), pb(pw.size()), gw(pw.size()), gb(pw.size());
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++) {
                double s = b[(size_t)o], mag = fabs(b[(size_t)o]);
                for (int64_t i = 0; i < I; i++) s += (double)x[(size_t)(n * I + i)] * w[(size_t)(o * I + i)],
                                                mag += fabs((double)x[(size_t)(n * I + i)] * w[(size_t)(o * I + i)]);
                size_t k = (size_t)(n * O + o);
                pw[k] = s, pb[k] = gam((double)I + 1) * mag;
                gw[k] = gelu_d(s), gb[k] = fabs(gelu_grad_d(s)) * pb[k] * 1.01 + GELU_REL * fabs(gw[k]) + GELU_ABS;
            }
        within(name, down(dpre, pw.size()), pw, pb);
        snprintf(name, sizeof name, "lt_gelu_aux_bias_fwd_gelu_within_bound_%s", tag);
        within(name, down(dout, gw.size()), gw, gb);
    }
    /* backward: dw += dout^T x, dbias = colsum(dout) */
    st = dt_k_linear_lt_dw(lt, ddw, ddb, dg, dx_, in_dtype, N, O, I, 0, NULL, 0, NULL);
    snprintf(name, sizeof name, "lt_bgradb_dw_and_dbias_equal_double_sums_%s", tag);
    if (launched(name, st)) {
        std::vector<double> ww((size_t)(O * I)), wb(ww.size()), bw_((size_t)O), bb_((size_t)O);
        for (int64_t o = 0; o < O; o++) {
            double s = 0, mag = 0;
            for (int64_t n = 0; n < N; n++) s += g[(size_t)(n * O + o)], mag += fabs(g[(size_t)(n * O + o)]);
            bw_[(size_t)o] = s, bb_[(size_t)o] = gam((double)N) * mag;
            for (int64_t i = 0; i < I; i++) {
                double t = dw0[(size_t)(o * I + i)], m = fabs(t);
                for (int64_t n = 0; n < N; n++)
                    t += (double)g[(size_t)(n * O + o)] * x[(size_t)(n * I + i)],
                        m += fabs((double)g[(size_t)(n * O + o)] * x[(size_t)(n * I + i)]);
                ww[(size_t)(o * I + i)] = t, wb[(size_t)(o * I + i)] = gam((double)N + 1) * m;
            }
        }
        within(name, down(ddw, ww.size()), ww, wb);
        snprintf(name, sizeof name, "lt_bgradb_dbias_is_written_not_added_%s", tag);
        within(name, down(ddb, bw_.size()), bw_, bb_);
    }
    void *bases[] = {bx, bw, bb, bo, bp, bg1, bdw, bdb};
    for (void *p : bases) cudaFree(p);
}

/* A CPU tensor with values in [-1, 1) and its CUDA copy. */
struct pair_t { dt_tensor h, d; };
static pair_t make(int64_t a, int64_t b, uint64_t seed, int ndim = 0) {
    pair_t p;
    dt_tensor_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = DT_F32; desc.ndim = ndim ? ndim : b ? 2 : 1; desc.shape[0] = a; desc.shape[1] = b;
    desc.device = DT_CPU;
    dt_tensor_create(&ctx, &p.h, &desc);
    desc.device = DT_CUDA_DEVICE;
    dt_tensor_create(&ctx, &p.d, &desc);
    for (int64_t i = 0; i < p.h.numel; i++) ((float *)p.h.data)[i] = 2.0f * dt_rng_uniform(37, seed, (uint64_t)i) - 1.0f;
    dt_tensor_copy(&ctx, &p.d, &p.h);
    return p;
}
static void release(pair_t &p) { dt_tensor_free(&ctx, &p.h); dt_tensor_free(&ctx, &p.d); }
static void same(const char *name, pair_t &p, double rtol) {
    std::vector<float> got = down(p.d.data, (size_t)p.h.numel);
    dt_test_allclose(name, got.data(), (const float *)p.h.data, got.size(), rtol * 0.1, rtol);
}
static int ok2(const char *name, dt_status a, dt_status b) {
    if (a == DT_OK && b == DT_OK) return 1;
    return dt_test_fail(name, "cpu status %d, cuda status %d: %s", (int)a, (int)b, dt_ctx_error(&ctx));
}
/* PASS iff the op's second call makes no device allocation, free, copy down or host wait. */
template <typename F> static void on_device_only(const char *name, F op) {
    if (op()) { dt_test_fail(name, "warm-up call: %s", dt_ctx_error(&ctx)); return; }
    dt_ctx_counters_reset(&ctx);
    dt_status st = op();
    const dt_cuda_counters &c = ctx.counters;
    dt_test_check_all(name, !st && c.allocs == 0 && c.frees == 0 && c.syncs == 0 && c.d2h_calls == 0,
                      "status %d, allocs %lld frees %lld syncs %lld d2h %lld (want 0 each)", (int)st,
                      (long long)c.allocs, (long long)c.frees, (long long)c.syncs, (long long)c.d2h_calls);
}

/* Which epilogue ran: the emulator counts each; ctx->counters counts fused and separate calls,
   on a GPU too, where either is right (its heuristic decides) and the SKIP line says which. */
static int64_t g_fused0, g_sep0;
static void path_begin(void) { g_fused0 = ctx.counters.lt_fused, g_sep0 = ctx.counters.lt_separate; }
static void path(const char *name, int ok, int fused, const char *what) {
    long long f = (long long)(ctx.counters.lt_fused - g_fused0), sp = (long long)(ctx.counters.lt_separate - g_sep0);
#ifdef DT_EMU_STUBS
    (void)ok, (void)fused, (void)what;
    dt_test_skip(name, "on a GPU its heuristic decides: %lld fused, %lld separate since the last op", f, sp);
#else
    dt_test_check_all(name, ok && f == fused && f + sp == 1, "%s (ctx counters: %lld fused, %lld separate; want %d, %d)",
                      what, f, sp, fused, 1 - fused);
#endif
}

/* refuse: the emulator's heuristic has no algorithm for any epilogue (every fallback runs). */
static void ops(int64_t N, int64_t O, int64_t I, int refuse) {
    char name[200], tag[48];
    int gelu_fused = !refuse && O % 8 == 0;
    pair_t x = make(N, I, 1), w = make(O, I, 2), b = make(O, 0, 3), out = make(N, O, 4), pre = make(N, O, 5);
    pair_t g = make(N, O, 6), dx = make(N, I, 7), dw = make(O, I, 8), db = make(O, 0, 9);
    long c0[7], c1[7];
    snprintf(tag, sizeof tag, "N%lld_O%lld_I%lld%s", (long long)N, (long long)O, (long long)I, refuse ? "_refused" : "");
    dt_emu_lt_refuse(refuse ? 0x1fu : 0u);
    for (int i = 0; i < 7; i++) c0[i] = dt_emu_lt_count(i);
    path_begin();
    snprintf(name, sizeof name, "linear_fwd_bias_cuda_equals_cpu_%s", tag);
    if (ok2(name, dt_linear_fwd(&ctx, &out.h, &x.h, &w.h, &b.h), dt_linear_fwd(&ctx, &out.d, &x.d, &w.d, &b.d))) {
        same(name, out, 1e-5);
        snprintf(name, sizeof name, "linear_fwd_bias_cuda_%s_%s", refuse ? "fell_back" : "ran_the_bias_epilogue", tag);
        path(name, dt_emu_lt_count(1) == c0[1] + !refuse, !refuse, "BIAS epilogue runs not as expected");
    }
    path_begin();
    snprintf(name, sizeof name, "linear_gelu_fwd_cuda_equals_cpu_linear_then_gelu_%s", tag);
    if (ok2(name, dt_linear_gelu_fwd(&ctx, &out.h, &pre.h, &x.h, &w.h, &b.h),
            dt_linear_gelu_fwd(&ctx, &out.d, &pre.d, &x.d, &w.d, &b.d))) {
        same(name, out, OPS_RTOL);
        snprintf(name, sizeof name, "linear_gelu_fwd_cuda_pre_equals_cpu_%s", tag);
        same(name, pre, 1e-5);
        for (int i = 0; i < 7; i++) c1[i] = dt_emu_lt_count(i);
        snprintf(name, sizeof name, "linear_gelu_fwd_cuda_%s_%s",
                 gelu_fused ? "ran_gelu_aux_bias_epilogue" : "fell_back_to_separate_ops", tag);
        char what[128];
        snprintf(what, sizeof what, "GELU_AUX_BIAS runs %ld -> %ld, GELU_AUX %ld -> %ld", c0[2], c1[2], c0[3], c1[3]);
        path(name, gelu_fused ? c1[2] == c0[2] + 1 : c1[2] == c0[2] && c1[3] == c0[3], gelu_fused, what);
    }
    /* the CPU op is dt_linear_fwd then dt_gelu_fwd, bit for bit */
    {
        pair_t p2 = make(N, O, 10), o2 = make(N, O, 11);
        snprintf(name, sizeof name, "linear_gelu_fwd_cpu_is_linear_then_gelu_bitwise_%s", tag);
        dt_status s1 = dt_linear_fwd(&ctx, &p2.h, &x.h, &w.h, &b.h);
        if (ok2(name, s1, dt_gelu_fwd(&ctx, &o2.h, &p2.h)))
            dt_test_equal_bytes(name, o2.h.data, out.h.data, (size_t)out.h.numel * 4);
        release(p2); release(o2);
    }
    snprintf(name, sizeof name, "linear_gelu_fwd_no_bias_cuda_equals_cpu_%s", tag);
    if (ok2(name, dt_linear_gelu_fwd(&ctx, &out.h, &pre.h, &x.h, &w.h, NULL),
            dt_linear_gelu_fwd(&ctx, &out.d, &pre.d, &x.d, &w.d, NULL)))
        same(name, out, OPS_RTOL);
    for (int i = 0; i < 7; i++) c0[i] = dt_emu_lt_count(i);
    path_begin();
    snprintf(name, sizeof name, "linear_bwd_cuda_dbias_accumulates_as_cpu_%s", tag);
    if (ok2(name, dt_linear_bwd(&ctx, &dx.h, &dw.h, &db.h, &g.h, &x.h, &w.h),
            dt_linear_bwd(&ctx, &dx.d, &dw.d, &db.d, &g.d, &x.d, &w.d))) {
        same(name, db, 1e-5);
        snprintf(name, sizeof name, "linear_bwd_cuda_dw_equals_cpu_%s", tag);
        same(name, dw, 1e-5);
        snprintf(name, sizeof name, "linear_bwd_cuda_dx_equals_cpu_%s", tag);
        same(name, dx, 1e-5);
        snprintf(name, sizeof name, "linear_bwd_cuda_%s_%s", refuse ? "fell_back" : "ran_the_bgradb_epilogue", tag);
        path(name, dt_emu_lt_count(4) == c0[4] + !refuse, !refuse, "BGRADB epilogue runs not as expected");
    }
    /* dbias alone (the kernels' column sums) and dw alone (the plain GEMM) */
    snprintf(name, sizeof name, "linear_bwd_cuda_dbias_alone_equals_cpu_%s", tag);
    if (ok2(name, dt_linear_bwd(&ctx, NULL, NULL, &db.h, &g.h, &x.h, &w.h), dt_linear_bwd(&ctx, NULL, NULL, &db.d, &g.d, &x.d, &w.d)))
        same(name, db, 1e-5);
    snprintf(name, sizeof name, "linear_bwd_cuda_dw_alone_equals_cpu_%s", tag);
    if (ok2(name, dt_linear_bwd(&ctx, NULL, &dw.h, NULL, &g.h, &x.h, &w.h), dt_linear_bwd(&ctx, NULL, &dw.d, NULL, &g.d, &x.d, &w.d)))
        same(name, dw, 1e-5);
    snprintf(name, sizeof name, "linear_gelu_fwd_cuda_stays_on_the_device_%s", tag);
    on_device_only(name, [&] { return dt_linear_gelu_fwd(&ctx, &out.d, &pre.d, &x.d, &w.d, &b.d); });
    snprintf(name, sizeof name, "linear_bwd_cuda_stays_on_the_device_%s", tag);
    on_device_only(name, [&] { return dt_linear_bwd(&ctx, &dx.d, &dw.d, &db.d, &g.d, &x.d, &w.d); });
    dt_emu_lt_refuse(0);
    pair_t *all[] = {&x, &w, &b, &out, &pre, &g, &dx, &dw, &db};
    for (pair_t *p : all) release(*p);
}

/* A bias and a pre that are views 4 bytes past 16-byte alignment: the separate ops, the same results. */
static void misaligned_vectors(void) {
    const int64_t N = 5, O = 16, I = 8;
    pair_t x = make(N, I, 41), w = make(O, I, 42), bb = make(O + 1, 0, 43), out = make(N, O, 44), pp = make(N * O + 1, 0, 45);
    pair_t g = make(N, O, 46), dw = make(O, I, 47), dd = make(O + 1, 0, 48);
    dt_tensor bh, bd, ph, pd, dh, ddv;
    int64_t sb[1] = {O}, sp[2] = {N, O};
    dt_tensor_view(&ctx, &bh, &bb.h, 1, 1, sb); dt_tensor_view(&ctx, &bd, &bb.d, 1, 1, sb);
    dt_tensor_view(&ctx, &ph, &pp.h, 1, 2, sp); dt_tensor_view(&ctx, &pd, &pp.d, 1, 2, sp);
    dt_tensor_view(&ctx, &dh, &dd.h, 1, 1, sb); dt_tensor_view(&ctx, &ddv, &dd.d, 1, 1, sb);
    long c2 = dt_emu_lt_count(2), c4;
    const char *name = "linear_gelu_fwd_cuda_misaligned_bias_and_pre_equal_cpu";
    path_begin();
    if (ok2(name, dt_linear_gelu_fwd(&ctx, &out.h, &ph, &x.h, &w.h, &bh), dt_linear_gelu_fwd(&ctx, &out.d, &pd, &x.d, &w.d, &bd))) {
        same(name, out, OPS_RTOL);
        path("linear_gelu_fwd_cuda_misaligned_bias_and_pre_take_the_separate_ops", dt_emu_lt_count(2) == c2, 0,
             "a GELU_AUX_BIAS epilogue ran on vectors not on 16 bytes");
    }
    name = "linear_bwd_cuda_misaligned_dbias_equals_cpu";
    c4 = dt_emu_lt_count(4);
    path_begin();
    if (ok2(name, dt_linear_bwd(&ctx, NULL, &dw.h, &dh, &g.h, &x.h, &w.h), dt_linear_bwd(&ctx, NULL, &dw.d, &ddv, &g.d, &x.d, &w.d))) {
        same(name, dd, 1e-5);
        path("linear_bwd_cuda_misaligned_dbias_still_fused_into_scratch", dt_emu_lt_count(4) == c4 + 1, 1,
             "the dbias epilogue writes 256-byte-aligned scratch, whatever dbias's alignment");
    }
    pair_t *all[] = {&x, &w, &bb, &out, &pp, &g, &dw, &dd};
    for (pair_t *p : all) release(*p);
}

/* Zero rows, zero in-features: CUDA as the CPU (dbias = dout's column sums even with no dw). */
static void zero_sizes(void) {
    const int64_t shapes[2][3] = {{0, 16, 8}, {6, 16, 0}};
    for (int k = 0; k < 2; k++) {
        int64_t N = shapes[k][0], O = shapes[k][1], I = shapes[k][2];
        char name[128];
        pair_t x = make(N, I, 51, 2), w = make(O, I, 52, 2), b = make(O, 0, 53), out = make(N, O, 54), pre = make(N, O, 55);
        pair_t g = make(N, O, 56, 2), dx = make(N, I, 57, 2), dw = make(O, I, 58, 2), db = make(O, 0, 59);
        snprintf(name, sizeof name, "linear_gelu_fwd_cuda_equals_cpu_N%lld_I%lld", (long long)N, (long long)I);
        if (ok2(name, dt_linear_gelu_fwd(&ctx, &out.h, &pre.h, &x.h, &w.h, &b.h),
                dt_linear_gelu_fwd(&ctx, &out.d, &pre.d, &x.d, &w.d, &b.d)))
            same(name, out, OPS_RTOL);
        snprintf(name, sizeof name, "linear_bwd_cuda_dbias_equals_cpu_N%lld_I%lld", (long long)N, (long long)I);
        if (ok2(name, dt_linear_bwd(&ctx, &dx.h, &dw.h, &db.h, &g.h, &x.h, &w.h),
                dt_linear_bwd(&ctx, &dx.d, &dw.d, &db.d, &g.d, &x.d, &w.d)))
            same(name, db, 1e-5);
        pair_t *all[] = {&x, &w, &b, &out, &pre, &g, &dx, &dw, &db};
        for (pair_t *p : all) release(*p);
    }
}

/* ctx.tf32 = 1: out within 2^-10 sum |x w| (each operand rounded to 11 bits) of the CPU's f32 op,
   dbias within 2^-11 sum |dout| (the emulator's BGRADB sums the TF32 dout it read). */
static void tf32(void) {
    const int64_t N = 16, O = 16, I = 24;
    pair_t x = make(N, I, 61), w = make(O, I, 62), b = make(O, 0, 63), out = make(N, O, 64), pre = make(N, O, 65);
    pair_t g = make(N, O, 66), dw = make(O, I, 67), db = make(O, 0, 68);
    const float *X = (const float *)x.h.data, *W = (const float *)w.h.data, *G = (const float *)g.h.data;
    std::vector<float> db0((const float *)db.h.data, (const float *)db.h.data + O);
    ctx.tf32 = 1;
    const char *name = "linear_gelu_fwd_cuda_tf32_pre_within_its_bound";
    if (ok2(name, dt_linear_gelu_fwd(&ctx, &out.h, &pre.h, &x.h, &w.h, &b.h),
            dt_linear_gelu_fwd(&ctx, &out.d, &pre.d, &x.d, &w.d, &b.d))) {
        std::vector<double> want((size_t)(N * O)), bound(want.size());
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++) {
                double m = 0;
                for (int64_t i = 0; i < I; i++) m += fabs((double)X[n * I + i] * W[o * I + i]);
                want[(size_t)(n * O + o)] = ((const float *)pre.h.data)[n * O + o];
                bound[(size_t)(n * O + o)] = m / 1024.0 + 2 * gam((double)I + 1) * (m + 1);
            }
        within(name, down(pre.d.data, want.size()), want, bound);
    }
    name = "linear_bwd_cuda_tf32_dbias_within_its_bound";
    if (ok2(name, dt_linear_bwd(&ctx, NULL, &dw.h, &db.h, &g.h, &x.h, &w.h), dt_linear_bwd(&ctx, NULL, &dw.d, &db.d, &g.d, &x.d, &w.d))) {
        std::vector<double> want((size_t)O), bound((size_t)O);
        for (int64_t o = 0; o < O; o++) {
            double m = 0;
            for (int64_t n = 0; n < N; n++) m += fabs(G[n * O + o]);
            want[(size_t)o] = ((const float *)db.h.data)[o];
            bound[(size_t)o] = m / 2048.0 + 2 * gam((double)N + 1) * (m + fabs(db0[(size_t)o]));
        }
        within(name, down(db.d.data, (size_t)O), want, bound);
    }
    ctx.tf32 = 0;
    pair_t *all[] = {&x, &w, &b, &out, &pre, &g, &dw, &db};
    for (pair_t *p : all) release(*p);
}

/* A bf16 weight: the bias gradient comes from the bf16-rounded dout the dw GEMM reads, so it is
   within 2^-9 sum_n |dout| (+ the f32 sums) of the CPU's f32 column sums, and past the f32 bound. */
static void bf16_dbias(void) {
    const int64_t N = 32, O = 16, I = 24;
    pair_t x = make(N, I, 21), w = make(O, I, 22), g = make(N, O, 23), db = make(O, 0, 24), dw = make(O, I, 25);
    dt_tensor w16;
    dt_tensor_create_like(&ctx, &w16, &w.d, DT_BF16, DT_CUDA_DEVICE);
    dt_tensor_cast(&ctx, &w16, &w.d);
    std::vector<float> db0((const float *)db.h.data, (const float *)db.h.data + O);
    const char *name = "linear_bwd_bf16_w_cuda_dbias_within_bf16_rounding_of_dout";
    if (ok2(name, dt_linear_bwd(&ctx, NULL, NULL, &db.h, &g.h, &x.h, &w.h),
            dt_linear_bwd(&ctx, NULL, &dw.d, &db.d, &g.d, &x.d, &w16))) {
        std::vector<float> got = down(db.d.data, (size_t)O);
        size_t bad = 0, past = 0, first = 0;
        for (int64_t o = 0; o < O; o++) {
            double mag = 0;
            for (int64_t n = 0; n < N; n++) mag += fabs(((const float *)g.h.data)[n * O + o]);
            double want = ((const float *)db.h.data)[o], d = fabs(got[(size_t)o] - want);
            double f32b = 2 * gam((double)N + 1) * (mag + fabs(db0[(size_t)o]));
            if (!(d <= mag / 512.0 + f32b) && bad++ == 0) first = (size_t)o;
            past += d > f32b;
        }
#ifdef DT_EMU_STUBS
        past = 1; /* a GPU that falls back sums dout in f32: within the bound, not past the f32 one */
#endif
        dt_test_check_all(name, !bad && past > 0, "%zu of %lld outside (first [%zu]: cuda %.9g, cpu %.9g); %zu past "
                          "the f32 bound (want > 0: the bf16 path)", bad, (long long)O, first, (double)got[first],
                          (double)((const float *)db.h.data)[first], past);
    }
    dt_tensor_free(&ctx, &w16);
    pair_t *all[] = {&x, &w, &g, &db, &dw};
    for (pair_t *p : all) release(*p);
}

static void bad_args(void) {
    pair_t x = make(4, 5, 1), w = make(8, 5, 2), out = make(4, 8, 3), pre = make(4, 8, 4), small = make(4, 7, 5);
    for (int dev = 0; dev < 2; dev++) {
        char name[128];
        dt_tensor *X = dev ? &x.d : &x.h, *W = dev ? &w.d : &w.h, *O = dev ? &out.d : &out.h, *P = dev ? &pre.d : &pre.h;
        dt_tensor *S = dev ? &small.d : &small.h;
        const char *d = dev ? "cuda" : "cpu";
        snprintf(name, sizeof name, "linear_gelu_fwd_pre_null_is_named_%s", d);
        dt_test_error(name, dt_linear_gelu_fwd(&ctx, O, NULL, X, W, NULL), dt_ctx_error(&ctx), "pre is NULL");
        snprintf(name, sizeof name, "linear_gelu_fwd_out_is_pre_is_named_%s", d);
        dt_test_error(name, dt_linear_gelu_fwd(&ctx, P, P, X, W, NULL), dt_ctx_error(&ctx), "pre");
        snprintf(name, sizeof name, "linear_gelu_fwd_pre_of_wrong_shape_is_named_%s", d);
        dt_test_error(name, dt_linear_gelu_fwd(&ctx, O, S, X, W, NULL), dt_ctx_error(&ctx), "pre");
        snprintf(name, sizeof name, "linear_gelu_fwd_out_of_wrong_shape_is_named_%s", d);
        dt_test_error(name, dt_linear_gelu_fwd(&ctx, S, P, X, W, NULL), dt_ctx_error(&ctx), "out");
        snprintf(name, sizeof name, "linear_gelu_fwd_out_overlapping_x_is_named_%s", d);
        dt_test_error(name, dt_linear_gelu_fwd(&ctx, X, P, X, W, NULL), dt_ctx_error(&ctx), "x");
    }
    pair_t *all[] = {&x, &w, &out, &pre, &small};
    for (pair_t *p : all) release(*p);
}

int main(void) {
    dt_ctx_desc cd;
    void *lt = NULL;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &cd)) { dt_test_fail("ctx_init_cuda", "%s", dt_ctx_error(&ctx)); return dt_test_finish(); }
    if (!DT_TEST_CHECK("lt_create", dt_k_lt_create(&lt) == 0)) return dt_test_finish();
    for (int dt = 1; dt <= 2; dt++) {
        launchers(dt, 5, 16, 7, 0, lt);
        launchers(dt, 33, 24, 40, 0, lt);
        launchers(dt, 1, 8, 1, 0, lt);
    }
    launchers(1, 6, 16, 9, 1, lt); /* x 4-byte aligned only */
    { /* Out % 8 != 0 with a GELU: no algorithm, nothing written */
        std::vector<float> x = rnd(12, 1), w = rnd(12 * 4, 2), sentinel(3 * 12, 5.0f);
        void *bx, *bw, *bo, *bp;
        const void *dx_ = up(x, 1, 0, &bx), *dw_ = up(w, 1, 0, &bw);
        float *o = (float *)up(sentinel, 1, 0, &bo), *p = (float *)up(sentinel, 1, 0, &bp);
        int st = dt_k_linear_lt_fwd(lt, o, p, dx_, dw_, NULL, 1, 1, 3, 12, 4, 0, NULL, 0, NULL);
        std::vector<float> go = down(o, 36), gp = down(p, 36);
        int untouched = 1;
        for (int i = 0; i < 36; i++) untouched &= go[(size_t)i] == 5.0f && gp[(size_t)i] == 5.0f;
        dt_test_check_all("lt_gelu_with_out_not_a_multiple_of_8_has_no_algorithm_and_writes_nothing",
                          st == DT_K_NO_ALGO && untouched, "status %d (want %d), out and pre untouched %d", st,
                          DT_K_NO_ALGO, untouched);
        void *bases[] = {bx, bw, bo, bp};
        for (void *q : bases) cudaFree(q);
    }
#ifndef DT_EMU_STUBS
    { /* the emulator's heuristic, as cuBLASLt documents it: a GELU input ld not a multiple of 8 has
         no algorithm (dt_gemm.cu does not ask; a caller that did would fall back) */
        cublasLtMatmulDesc_t d;
        cublasLtMatrixLayout_t l;
        cublasLtMatmulPreference_t pref;
        cublasLtMatmulHeuristicResult_t res;
        uint32_t e = CUBLASLT_EPILOGUE_GELU_AUX;
        int n = -1;
        long before = dt_emu_lt_count(6);
        cublasStatus_t hs[2];
        cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
        cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
        cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 12, 12, 12);
        cublasLtMatmulPreferenceCreate(&pref);
        for (int k = 0; k < 2; k++) {
            int64_t ld = k ? 16 : 12;
            cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld);
            hs[k] = cublasLtMatmulAlgoGetHeuristic((cublasLtHandle_t)lt, d, l, l, l, l, pref, 1, &res, &n);
        }
        dt_test_check_all("emu_lt_heuristic_has_no_algorithm_for_a_gelu_aux_ld_not_a_multiple_of_8",
                          hs[0] == CUBLAS_STATUS_NOT_SUPPORTED && hs[1] == CUBLAS_STATUS_SUCCESS && n == 1 &&
                              dt_emu_lt_count(6) == before + 1,
                          "ld 12: status %d, ld 16: status %d with %d results", (int)hs[0], (int)hs[1], n);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(l);
        cublasLtMatmulDescDestroy(d);
    }
#endif
    dt_k_lt_destroy(lt);
    int reports = dt_emu_report_count();
    ops(6, 16, 5, 0);
    ops(7, 12, 9, 0); /* the GELU falls back: O % 8 != 0 */
    ops(6, 16, 5, 1); /* every epilogue refused: every fallback */
    misaligned_vectors();
    zero_sizes();
    tf32();
    bf16_dbias();
#ifndef DT_EMU_STUBS
    dt_test_check_all("emu_reported_nothing_about_the_ops_calls", dt_emu_report_count() == reports,
                      "%d reports (the last: %s)", dt_emu_report_count() - reports, dt_emu_last_report());
#endif
    (void)reports;
    bad_args();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
