// tests/cuda_emu/k_bf16_acts.cpp - dt_tensor.h's bf16 activations on CUDA tensors (the emulator)
// against the same ops on CPU tensors: a layernorm that writes bf16, GELU reading and writing bf16,
// and dt_linear with a bf16 w reading a bf16 x and writing a bf16 out (and pre), through
// cuBLASLt's epilogues with a bf16 D and through the separate ops when the heuristic refuses.
//
// Tolerances (u = 2^-24, gamma(k) = k u / (1 - k u); ulp(v) = the bf16 spacing at |v|, 2^(e - 7)
// for |v| in [2^e, 2^(e+1))). A value rounded once to bf16 from f32 values a and b that differ by
// d is within d + ulp of the other rounding (each rounding moves it at most ulp / 2), so:
//   - layernorm: the CUDA and CPU f32 values differ by a few f32 ulps (the two sum orders of mean
//     and variance, 1e-5 relative at most, as k_ops), far below ulp / 2: every bf16 element within
//     1 ulp; mean and rstd within 1e-5 relative. Where the sums are the same (the same kernel, or
//     the same CPU op writing f32) the bf16 out is the RNE rounding of the f32 out, bit for bit.
//   - GELU: the CPU's (on dt's exp) and the kernel's (on expf, the same sigmoid form) agree within
//     1e-6 relative + 1e-7 (k_elementwise.cpp): an f32 out within that, a bf16 out within 1 ulp.
//     The backward: dx within |dout| (1e-5 |gelu'(x)| + 2^-20) + 2u |dx| + 1e-7 of the CPU's
//     (1e-5: the two exps' relative difference, k_elementwise; 2^-20: the sum s + 2 v s (1 - s) u'
//     where its terms cancel, near gelu' = 0 at x = -0.75). A bf16
//     x or out is read or written around the f32 formula: the f32 op's bits on the widened x,
//     rounded once.
//   - linear: the products of bf16 x and w are exact in f32, so each side's f32 value is within
//     e = gamma(I + 2) (sum_i |x w| + |b|) of the exact sum v (any order of I + 1 terms, one more
//     for the double reference), the bias being b = bf16(bias) (cuBLASLt reads it beside a bf16
//     D). Each bf16 out must be the rounding of some f32 in [v - e, v + e] ("rounds_from"), on
//     the CPU and on CUDA; and CUDA within ulp + 2e of the CPU. GELU's out: gelu(v) in double,
//     widened by max|gelu'| e = 1.13 e and by the GELU's own error 1e-6 |gelu| + 1e-7 (on a GPU
//     2^-10 |gelu| + 1e-6: cuBLASLt does not say how its epilogue evaluates GELU; k_lt's assumption).
//   - linear bwd: dx and dw sum exact products of bf16 operands (dout rounded to bf16 on both
//     sides) into the initial value: CUDA within 2 gamma(K + 1) (sum |terms| + |initial|) of the
//     CPU (K = O for dx, N for dw); dbias from the BGRADB epilogue sums the bf16 dout it read:
//     plus 2^-9 sum |dout| (k_ops.cpp). On a GPU (DT_EMU_STUBS) the f32 sum bounds are doubled
//     (the tensor cores' accumulation order is not known), as k_ops allows.
// Which path ran: ctx->counters.lt_fused / lt_separate and the emulator's count of each epilogue
// (dt_emu_lt_count); dt_emu_lt_refuse makes the heuristic refuse every epilogue, so the separate
// ops run (on a GPU both are SKIP: its heuristic decides, and the value checks hold either way).
// Bad inputs: a bf16 x or out with an f32 w, a bf16 out with an f32 pre (DT_ERR_DTYPE naming
// the argument); a bf16 out sharing x's memory (an error, not a crash).
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
#ifdef DT_EMU_STUBS
static const double SUM_X = 2.0, GELU_REL = 1.0 / 1024, GELU_ABS = 1e-6; /* a GPU: assumed */
#else
static const double SUM_X = 1.0, GELU_REL = 1e-6, GELU_ABS = 1e-7;
#endif
/* DT_K_SMALL=1 (the ThreadSanitizer run): fewer rows. */
static int64_t rows(int64_t normal, int64_t small) {
    const char *e = getenv("DT_K_SMALL");
    return e && e[0] == '1' ? small : normal;
}

static double gelu_d(double v) { return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
static double gelu_grad_d(double v) {
    double t = tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
    return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
}
static float bf16_round(float f) { return dt_bf16_to_f32(dt_f32_to_bf16(f)); }
/* The bf16 spacing at |v| (bf16 has f32's exponent range and 8 significant bits). */
static double ulp_bf16(double v) {
    int e;
    frexp(fabs(v), &e); /* |v| in [2^(e-1), 2^e) */
    if (v == 0 || e < -125) e = -125;
    return ldexp(1.0, e - 8);
}
static unsigned bits(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

/* A CPU tensor [a] or [a, b] of dtype dt with values uniform in [lo, hi) (bf16: rounded), and its CUDA copy. */
struct pair_t { dt_tensor h, d; };
static pair_t make(dt_dtype dt, int64_t a, int64_t b, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    pair_t p;
    dt_tensor_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = dt;
    desc.ndim = b ? 2 : 1;
    desc.shape[0] = a;
    desc.shape[1] = b;
    desc.device = DT_CPU;
    if (dt_tensor_create(&ctx, &p.h, &desc)) { fprintf(stderr, "%s\n", dt_ctx_error(&ctx)); exit(2); }
    desc.device = DT_CUDA_DEVICE;
    if (dt_tensor_create(&ctx, &p.d, &desc)) { fprintf(stderr, "%s\n", dt_ctx_error(&ctx)); exit(2); }
    for (int64_t i = 0; i < p.h.numel; i++) {
        float v = lo + (hi - lo) * dt_rng_uniform(41, seed, (uint64_t)i);
        if (dt == DT_BF16) ((uint16_t *)p.h.data)[i] = dt_f32_to_bf16(v);
        else ((float *)p.h.data)[i] = v;
    }
    dt_tensor_copy(&ctx, &p.d, &p.h);
    return p;
}
static void release(pair_t &p) { dt_tensor_free(&ctx, &p.h); dt_tensor_free(&ctx, &p.d); }
/* t's values as floats (f32 or bf16, on either device). */
static std::vector<float> values(const dt_tensor &t) {
    dt_tensor h;
    std::vector<float> v((size_t)t.numel);
    dt_tensor_create_like(&ctx, &h, &t, DT_DTYPE_DEFAULT, DT_CPU);
    dt_tensor_copy(&ctx, &h, &t);
    for (size_t i = 0; i < v.size(); i++)
        v[i] = t.dtype == DT_BF16 ? dt_bf16_to_f32(((const uint16_t *)h.data)[i]) : ((const float *)h.data)[i];
    dt_tensor_free(&ctx, &h);
    return v;
}

/* An f32 pair holding t's values (a bf16 t widened). */
static pair_t widened(const dt_tensor &t, uint64_t seed) {
    pair_t p = make(DT_F32, t.shape[0], t.ndim > 1 ? t.shape[1] : 0, seed);
    std::vector<float> v = values(t);
    memcpy(p.h.data, v.data(), v.size() * 4);
    dt_tensor_copy(&ctx, &p.d, &p.h);
    return p;
}

static int ok2(const char *name, dt_status a, dt_status b) {
    if (a == DT_OK && b == DT_OK) return 1;
    return dt_test_fail(name, "cpu status %d, cuda status %d: %s", (int)a, (int)b, dt_ctx_error(&ctx));
}
/* PASS iff |got - want| <= bound everywhere; else how many not, and the first with both values. */
static void within(const char *name, const std::vector<float> &got, const std::vector<double> &want,
                   const std::vector<double> &bound) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (!(fabs(got[i] - want[i]) <= bound[i]) && bad++ == 0) first = i;
    if (!bad) { dt_test_pass(name); return; }
    dt_test_fail(name, "%zu of %zu outside (first [%zu]: got %.9g, want %.9g, |diff| %.3g > bound %.3g)", bad,
                 got.size(), first, (double)got[first], want[first], fabs(got[first] - want[first]), bound[first]);
}
/* CUDA's bf16 values within ulp(larger) + extra[i] of the CPU's (extra: the f32 values' own difference). */
static void within_ulp(const char *name, const std::vector<float> &cu, const std::vector<float> &cpu,
                       const std::vector<double> *extra) {
    std::vector<double> want(cpu.begin(), cpu.end()), bound(cpu.size());
    for (size_t i = 0; i < cpu.size(); i++)
        bound[i] = ulp_bf16(fmax(fabs(cu[i]), fabs(cpu[i]))) + (extra ? (*extra)[i] : 0.0);
    within(name, cu, want, bound);
}
/* PASS iff got and want hold the same bits. */
static void same_bits(const char *name, const std::vector<float> &got, const std::vector<float> &want) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (bits(got[i]) != bits(want[i]) && bad++ == 0) first = i;
    if (!bad) { dt_test_pass(name); return; }
    dt_test_fail(name, "%zu of %zu differ (first [%zu]: got %.9g (0x%08x), want %.9g (0x%08x))", bad, got.size(), first,
                 (double)got[first], bits(got[first]), (double)want[first], bits(want[first]));
}
/* PASS iff each got[i] is the bf16 rounding of some f32 in [v[i] - e[i], v[i] + e[i]]: rounding is
   monotone, so got lies between the roundings of the ends (each end one f32 step outward, for the
   float conversion of the double). Where the interval holds no rounding midpoint there is one answer. */
static void rounds_from(const char *name, const std::vector<float> &got, const std::vector<double> &v,
                        const std::vector<double> &e) {
    size_t bad = 0, first = 0;
    float lo0 = 0, hi0 = 0;
    for (size_t i = 0; i < got.size(); i++) {
        float lo = bf16_round(nextafterf((float)(v[i] - e[i]), -INFINITY));
        float hi = bf16_round(nextafterf((float)(v[i] + e[i]), INFINITY));
        if (!(got[i] >= lo && got[i] <= hi) && bad++ == 0) first = i, lo0 = lo, hi0 = hi;
    }
    if (!bad) { dt_test_pass(name); return; }
    dt_test_fail(name, "%zu of %zu not a rounding of [v - e, v + e] (first [%zu]: got %.9g; v %.9g, e %.3g: "
                 "bf16 %.9g .. %.9g)", bad, got.size(), first, (double)got[first], v[first], e[first], (double)lo0,
                 (double)hi0);
}

/* Which path dt_linear took: ctx->counters since path_begin, and the emulator's own count. */
static int64_t g_fused0, g_sep0;
static void path_begin(void) { g_fused0 = ctx.counters.lt_fused, g_sep0 = ctx.counters.lt_separate; }
static void path(const char *name, int emu_ok, int fused, const char *what) {
    long long f = (long long)(ctx.counters.lt_fused - g_fused0), sp = (long long)(ctx.counters.lt_separate - g_sep0);
#ifdef DT_EMU_STUBS
    (void)emu_ok, (void)fused, (void)what;
    dt_test_skip(name, "on a GPU its heuristic decides: %lld fused, %lld separate", f, sp);
#else
    dt_test_check_all(name, emu_ok && f == fused && f + sp == 1, "%s (ctx counters: %lld fused, %lld separate; want %d, %d)",
                      what, f, sp, fused, 1 - fused);
#endif
}

/* ---------------------------------------------------------------- layernorm */

static void layernorm(int64_t R, int64_t C) {
    char name[160], tag[48];
    snprintf(tag, sizeof tag, "rows%lld_C%lld", (long long)R, (long long)C);
    pair_t x = make(DT_F32, R, C, 1, -1.5f, 2.5f), w = make(DT_F32, C, 0, 2, 0.5f, 1.5f), b = make(DT_F32, C, 0, 3);
    pair_t o16 = make(DT_BF16, R, C, 4), o32 = make(DT_F32, R, C, 5), mean = make(DT_F32, R, 0, 6);
    pair_t rstd = make(DT_F32, R, 0, 7), m32 = make(DT_F32, R, 0, 8), r32 = make(DT_F32, R, 0, 9);
    snprintf(name, sizeof name, "layernorm_fwd_bf16_out_cuda_within_1_ulp_of_cpu_%s", tag);
    if (ok2(name, dt_layernorm_fwd(&ctx, &o16.h, &mean.h, &rstd.h, &x.h, &w.h, &b.h, 1e-5f),
            dt_layernorm_fwd(&ctx, &o16.d, &mean.d, &rstd.d, &x.d, &w.d, &b.d, 1e-5f))) {
        std::vector<float> cu = values(o16.d), cpu = values(o16.h);
        within_ulp(name, cu, cpu, NULL);
        snprintf(name, sizeof name, "layernorm_fwd_bf16_out_cuda_mean_within_1e-5_of_cpu_%s", tag);
        std::vector<float> mc = values(mean.d), rc = values(rstd.d);
        dt_test_allclose(name, mc.data(), (const float *)mean.h.data, mc.size(), 1e-6, 1e-5);
        snprintf(name, sizeof name, "layernorm_fwd_bf16_out_cuda_rstd_within_1e-5_of_cpu_%s", tag);
        dt_test_allclose(name, rc.data(), (const float *)rstd.h.data, rc.size(), 1e-6, 1e-5);
        /* the same op writing f32: the bf16 out is its rounding, on each device */
        snprintf(name, sizeof name, "layernorm_fwd_bf16_out_is_the_f32_out_rounded_once_%s", tag);
        if (ok2(name, dt_layernorm_fwd(&ctx, &o32.h, &m32.h, &r32.h, &x.h, &w.h, &b.h, 1e-5f),
                dt_layernorm_fwd(&ctx, &o32.d, &m32.d, &r32.d, &x.d, &w.d, &b.d, 1e-5f))) {
            std::vector<float> f = values(o32.h), g = values(o32.d);
            for (size_t i = 0; i < f.size(); i++) f[i] = bf16_round(f[i]), g[i] = bf16_round(g[i]);
            snprintf(name, sizeof name, "layernorm_fwd_cpu_bf16_out_is_its_f32_out_rounded_once_%s", tag);
            same_bits(name, cpu, f);
            snprintf(name, sizeof name, "layernorm_fwd_cuda_bf16_out_is_its_f32_out_rounded_once_%s", tag);
            same_bits(name, cu, g);
        }
        /* outs 2 (bf16) and 4 (f32) bytes past alignment: the scalar path (its own sum order, the
           same in both), whose bf16 out is its f32 out rounded once */
        pair_t b16 = make(DT_BF16, R * C + 1, 0, 10), b32 = make(DT_F32, R * C + 1, 0, 11);
        dt_tensor v16, v32;
        int64_t shape[2] = {R, C};
        snprintf(name, sizeof name, "layernorm_fwd_bf16_out_view_at_offset_1_is_the_scalar_f32_out_rounded_once_%s", tag);
        dt_status sv = dt_tensor_view(&ctx, &v16, &b16.d, 1, 2, shape);
        if (!sv) sv = dt_tensor_view(&ctx, &v32, &b32.d, 1, 2, shape);
        if (!sv) sv = dt_layernorm_fwd(&ctx, &v32, NULL, NULL, &x.d, &w.d, &b.d, 1e-5f);
        if (!sv) sv = dt_layernorm_fwd(&ctx, &v16, NULL, NULL, &x.d, &w.d, &b.d, 1e-5f);
        if (ok2(name, DT_OK, sv)) {
            std::vector<float> f = values(v32);
            for (float &t : f) t = bf16_round(t);
            same_bits(name, values(v16), f);
        }
        release(b16); release(b32);
    }
    pair_t *all[] = {&x, &w, &b, &o16, &o32, &mean, &rstd, &m32, &r32};
    for (pair_t *p : all) release(*p);
}

/* ---------------------------------------------------------------- GELU */

static void gelu(int64_t n) {
    char name[160], tag[32];
    snprintf(tag, sizeof tag, "n%lld", (long long)n);
    pair_t x16 = make(DT_BF16, n, 0, 20, -4.0f, 4.0f), x32 = widened(x16.h, 21), xf = make(DT_F32, n, 0, 22, -4.0f, 4.0f);
    pair_t o16 = make(DT_BF16, n, 0, 23), o32 = make(DT_F32, n, 0, 24), r32 = make(DT_F32, n, 0, 25);
    /* the f32 op on the widened x, on each device: what each bf16 form must round */
    pair_t *all[] = {&x16, &x32, &xf, &o16, &o32, &r32};
    if (!ok2("gelu_fwd_f32_reference", dt_gelu_fwd(&ctx, &r32.h, &x32.h), dt_gelu_fwd(&ctx, &r32.d, &x32.d))) {
        for (pair_t *p : all) release(*p);
        return;
    }
    std::vector<float> ref_h = values(r32.h), ref_d = values(r32.d), rnd_h(ref_h), rnd_d(ref_d);
    for (size_t i = 0; i < rnd_h.size(); i++) rnd_h[i] = bf16_round(ref_h[i]), rnd_d[i] = bf16_round(ref_d[i]);
    snprintf(name, sizeof name, "gelu_fwd_bf16_to_bf16_cuda_within_1_ulp_of_cpu_%s", tag);
    if (ok2(name, dt_gelu_fwd(&ctx, &o16.h, &x16.h), dt_gelu_fwd(&ctx, &o16.d, &x16.d))) {
        std::vector<float> cu = values(o16.d), cpu = values(o16.h);
        within_ulp(name, cu, cpu, NULL);
        snprintf(name, sizeof name, "gelu_fwd_bf16_to_bf16_cpu_is_f32_gelu_rounded_once_%s", tag);
        same_bits(name, cpu, rnd_h);
        snprintf(name, sizeof name, "gelu_fwd_bf16_to_bf16_cuda_is_f32_gelu_rounded_once_%s", tag);
        same_bits(name, cu, rnd_d);
        /* views 2 bytes past 8-byte alignment: the scalar loop, the same bits */
        pair_t bx = make(DT_BF16, n + 1, 0, 26), bo = make(DT_BF16, n + 1, 0, 27);
        dt_tensor vx, vo;
        int64_t shape[1] = {n};
        memcpy((uint16_t *)bx.h.data + 1, x16.h.data, (size_t)n * 2);
        dt_tensor_copy(&ctx, &bx.d, &bx.h);
        dt_tensor_view(&ctx, &vx, &bx.d, 1, 1, shape);
        dt_tensor_view(&ctx, &vo, &bo.d, 1, 1, shape);
        snprintf(name, sizeof name, "gelu_fwd_bf16_views_at_offset_1_cuda_same_bits_%s", tag);
        if (ok2(name, DT_OK, dt_gelu_fwd(&ctx, &vo, &vx))) same_bits(name, values(vo), cu);
        release(bx); release(bo);
    }
    snprintf(name, sizeof name, "gelu_fwd_f32_to_bf16_cuda_within_1_ulp_of_cpu_%s", tag);
    if (ok2(name, dt_gelu_fwd(&ctx, &o16.h, &xf.h), dt_gelu_fwd(&ctx, &o16.d, &xf.d))) {
        std::vector<float> cu = values(o16.d), cpu = values(o16.h);
        within_ulp(name, cu, cpu, NULL);
        if (ok2("gelu_fwd_f32_reference", dt_gelu_fwd(&ctx, &r32.h, &xf.h), dt_gelu_fwd(&ctx, &r32.d, &xf.d))) {
            std::vector<float> fh = values(r32.h), fd = values(r32.d);
            for (size_t i = 0; i < fh.size(); i++) fh[i] = bf16_round(fh[i]), fd[i] = bf16_round(fd[i]);
            snprintf(name, sizeof name, "gelu_fwd_f32_to_bf16_cpu_is_f32_gelu_rounded_once_%s", tag);
            same_bits(name, cpu, fh);
            snprintf(name, sizeof name, "gelu_fwd_f32_to_bf16_cuda_is_f32_gelu_rounded_once_%s", tag);
            same_bits(name, cu, fd);
        }
    }
    snprintf(name, sizeof name, "gelu_fwd_bf16_to_f32_cuda_within_1e-6_of_cpu_%s", tag);
    if (ok2(name, dt_gelu_fwd(&ctx, &o32.h, &x16.h), dt_gelu_fwd(&ctx, &o32.d, &x16.d))) {
        std::vector<float> cu = values(o32.d), cpu = values(o32.h);
        dt_test_allclose(name, cu.data(), cpu.data(), cu.size(), GELU_ABS, GELU_REL);
        snprintf(name, sizeof name, "gelu_fwd_bf16_to_f32_cpu_is_f32_gelu_of_widened_x_%s", tag);
        same_bits(name, cpu, ref_h);
        snprintf(name, sizeof name, "gelu_fwd_bf16_to_f32_cuda_is_f32_gelu_of_widened_x_%s", tag);
        same_bits(name, cu, ref_d);
    }
    { /* backward with a bf16 x: dx (nonzero at the start) += dout gelu'(x) */
        pair_t g = make(DT_F32, n, 0, 28), dx = make(DT_F32, n, 0, 29), dxr = make(DT_F32, n, 0, 29);
        std::vector<float> X = values(x16.h), G = values(g.h);
        snprintf(name, sizeof name, "gelu_bwd_bf16_x_cuda_accumulates_as_cpu_%s", tag);
        if (ok2(name, dt_gelu_bwd(&ctx, &dx.h, &g.h, &x16.h), dt_gelu_bwd(&ctx, &dx.d, &g.d, &x16.d))) {
            std::vector<float> cu = values(dx.d), cpu = values(dx.h);
            std::vector<double> want(cpu.begin(), cpu.end()), bound(cpu.size());
            for (size_t i = 0; i < cpu.size(); i++)
                bound[i] = fabs(G[i]) * (1e-5 * fabs(gelu_grad_d(X[i])) + ldexp(1.0, -20)) + 2 * U * fabs(cpu[i]) + 1e-7;
            within(name, cu, want, bound);
            /* the f32 op on the widened x from the same dx: the same bits on each device */
            snprintf(name, sizeof name, "gelu_bwd_bf16_x_is_the_f32_op_on_widened_x_%s", tag);
            if (ok2(name, dt_gelu_bwd(&ctx, &dxr.h, &g.h, &x32.h), dt_gelu_bwd(&ctx, &dxr.d, &g.d, &x32.d))) {
                snprintf(name, sizeof name, "gelu_bwd_bf16_x_cpu_is_the_f32_op_on_widened_x_%s", tag);
                same_bits(name, cpu, values(dxr.h));
                snprintf(name, sizeof name, "gelu_bwd_bf16_x_cuda_is_the_f32_op_on_widened_x_%s", tag);
                same_bits(name, cu, values(dxr.d));
            }
        }
        release(g); release(dx); release(dxr);
    }
    for (pair_t *p : all) release(*p);
}

/* ---------------------------------------------------------------- linear */

/* v = x w^T + bf16(bias) in double (exact products of bf16 values) and e, each side's bound
   gamma(I + 2) (sum |x w| + |b|). */
static void linear_ref(const std::vector<float> &X, const std::vector<float> &W, const std::vector<float> &B, int64_t N,
                       int64_t O, int64_t I, std::vector<double> &v, std::vector<double> &e) {
    v.assign((size_t)(N * O), 0.0);
    e.assign(v.size(), 0.0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double s = 0, m = 0, b = B.empty() ? 0.0 : (double)bf16_round(B[(size_t)o]);
            for (int64_t i = 0; i < I; i++) {
                double t = (double)X[(size_t)(n * I + i)] * W[(size_t)(o * I + i)];
                s += t, m += fabs(t);
            }
            v[(size_t)(n * O + o)] = s + b;
            e[(size_t)(n * O + o)] = SUM_X * gam((double)I + 2) * (m + fabs(b));
        }
}

/* dt_linear_fwd and dt_linear_gelu_fwd with a bf16 w, x, out (and pre), a bias; refuse: the
   emulator's heuristic refuses every epilogue. */
static void linear_fwd(int64_t N, int64_t O, int64_t I, int refuse) {
    char name[200], tag[48], what[128];
    snprintf(tag, sizeof tag, "N%lld_O%lld_I%lld%s", (long long)N, (long long)O, (long long)I, refuse ? "_refused" : "");
    pair_t x = make(DT_BF16, N, I, 30), w = make(DT_BF16, O, I, 31), b = make(DT_F32, O, 0, 32);
    pair_t out = make(DT_BF16, N, O, 33), pre = make(DT_BF16, N, O, 34);
    std::vector<float> X = values(x.h), W = values(w.h), B = values(b.h);
    std::vector<double> v, e, v0, e0;
    linear_ref(X, W, B, N, O, I, v, e);
    linear_ref(X, W, std::vector<float>(), N, O, I, v0, e0);
    dt_emu_lt_refuse(refuse ? 0x1fu : 0u);
    long c0 = dt_emu_lt_count(1);
    path_begin();
    snprintf(name, sizeof name, "linear_fwd_bf16_out_cuda_within_1_ulp_of_cpu_%s", tag);
    if (ok2(name, dt_linear_fwd(&ctx, &out.h, &x.h, &w.h, &b.h), dt_linear_fwd(&ctx, &out.d, &x.d, &w.d, &b.d))) {
        std::vector<float> cu = values(out.d), cpu = values(out.h);
        std::vector<double> two_e(e);
        for (double &t : two_e) t *= 2;
        within_ulp(name, cu, cpu, &two_e);
        snprintf(name, sizeof name, "linear_fwd_bf16_out_cpu_rounds_x_w_plus_bf16_bias_%s", tag);
        rounds_from(name, cpu, v, e);
        snprintf(name, sizeof name, "linear_fwd_bf16_out_cuda_rounds_x_w_plus_bf16_bias_%s", tag);
        rounds_from(name, cu, v, e);
        snprintf(name, sizeof name, "linear_fwd_bf16_out_cuda_%s_%s", refuse ? "fell_back" : "ran_the_bias_epilogue", tag);
        snprintf(what, sizeof what, "BIAS epilogue runs %ld -> %ld", c0, dt_emu_lt_count(1));
        path(name, dt_emu_lt_count(1) == c0 + !refuse, !refuse, what);
    }
    /* without a bias: cuBLASLt's DEFAULT epilogue writes the bf16 D (or the GEMM, then a cast) */
    snprintf(name, sizeof name, "linear_fwd_bf16_out_no_bias_cuda_rounds_x_w_%s", tag);
    if (ok2(name, dt_linear_fwd(&ctx, &out.h, &x.h, &w.h, NULL), dt_linear_fwd(&ctx, &out.d, &x.d, &w.d, NULL))) {
        rounds_from(name, values(out.d), v0, e0);
        snprintf(name, sizeof name, "linear_fwd_bf16_out_no_bias_cpu_rounds_x_w_%s", tag);
        rounds_from(name, values(out.h), v0, e0);
    }
    int gelu_fused = !refuse && O % 8 == 0;
    c0 = dt_emu_lt_count(2);
    long c3 = dt_emu_lt_count(3);
    path_begin();
    snprintf(name, sizeof name, "linear_gelu_fwd_bf16_pre_cuda_within_1_ulp_of_cpu_%s", tag);
    if (ok2(name, dt_linear_gelu_fwd(&ctx, &out.h, &pre.h, &x.h, &w.h, &b.h),
            dt_linear_gelu_fwd(&ctx, &out.d, &pre.d, &x.d, &w.d, &b.d))) {
        std::vector<float> pc = values(pre.d), ph = values(pre.h), oc = values(out.d), oh = values(out.h);
        std::vector<double> two_e(e), g(v.size()), eg(v.size()), og(v.size());
        for (size_t i = 0; i < v.size(); i++) {
            two_e[i] = 2 * e[i];
            g[i] = gelu_d(v[i]);
            eg[i] = 1.13 * e[i] + GELU_REL * fabs(g[i]) + GELU_ABS; /* max |gelu'| = 1.129 */
            og[i] = 2 * eg[i];
        }
        within_ulp(name, pc, ph, &two_e);
        snprintf(name, sizeof name, "linear_gelu_fwd_bf16_out_cuda_within_1_ulp_of_cpu_%s", tag);
        within_ulp(name, oc, oh, &og);
        snprintf(name, sizeof name, "linear_gelu_fwd_bf16_pre_cpu_rounds_x_w_plus_bf16_bias_%s", tag);
        rounds_from(name, ph, v, e);
        snprintf(name, sizeof name, "linear_gelu_fwd_bf16_pre_cuda_rounds_x_w_plus_bf16_bias_%s", tag);
        rounds_from(name, pc, v, e);
        snprintf(name, sizeof name, "linear_gelu_fwd_bf16_out_cpu_rounds_gelu_of_f32_pre_%s", tag);
        rounds_from(name, oh, g, eg);
        snprintf(name, sizeof name, "linear_gelu_fwd_bf16_out_cuda_rounds_gelu_of_f32_pre_%s", tag);
        rounds_from(name, oc, g, eg);
        snprintf(name, sizeof name, "linear_gelu_fwd_bf16_cuda_%s_%s",
                 gelu_fused ? "ran_the_gelu_aux_bias_epilogue" : "fell_back_to_separate_ops", tag);
        snprintf(what, sizeof what, "GELU_AUX_BIAS runs %ld -> %ld, GELU_AUX %ld -> %ld", c0, dt_emu_lt_count(2), c3,
                 dt_emu_lt_count(3));
        path(name, gelu_fused ? dt_emu_lt_count(2) == c0 + 1 : dt_emu_lt_count(2) == c0 && dt_emu_lt_count(3) == c3,
             gelu_fused, what);
    }
    dt_emu_lt_refuse(0);
    pair_t *all[] = {&x, &w, &b, &out, &pre};
    for (pair_t *p : all) release(*p);
}

/* dt_linear_bwd with a bf16 x and w: dx, dw, dbias accumulate; CUDA against the CPU. */
static void linear_bwd(int64_t N, int64_t O, int64_t I, int refuse) {
    char name[200], tag[48];
    snprintf(tag, sizeof tag, "N%lld_O%lld_I%lld%s", (long long)N, (long long)O, (long long)I, refuse ? "_refused" : "");
    pair_t x = make(DT_BF16, N, I, 40), w = make(DT_BF16, O, I, 41), g = make(DT_F32, N, O, 42);
    pair_t dx = make(DT_F32, N, I, 43), dw = make(DT_F32, O, I, 44), db = make(DT_F32, O, 0, 45);
    std::vector<float> X = values(x.h), W = values(w.h), G = values(g.h), Gb(G);
    std::vector<float> dx0 = values(dx.h), dw0 = values(dw.h), db0 = values(db.h);
    for (float &t : Gb) t = bf16_round(t); /* dout as both sides' bf16 GEMMs read it */
    dt_emu_lt_refuse(refuse ? 0x1fu : 0u);
    long c4 = dt_emu_lt_count(4);
    path_begin();
    snprintf(name, sizeof name, "linear_bwd_bf16_x_cuda_equals_cpu_%s", tag);
    if (ok2(name, dt_linear_bwd(&ctx, &dx.h, &dw.h, &db.h, &g.h, &x.h, &w.h),
            dt_linear_bwd(&ctx, &dx.d, &dw.d, &db.d, &g.d, &x.d, &w.d))) {
        std::vector<float> cpu_dx = values(dx.h), cpu_dw = values(dw.h), cpu_db = values(db.h);
        std::vector<double> mx(dx0.size()), mw(dw0.size()), mb(db0.size());
        for (size_t i = 0; i < mx.size(); i++) mx[i] = fabs(dx0[i]);
        for (size_t i = 0; i < mw.size(); i++) mw[i] = fabs(dw0[i]);
        for (size_t i = 0; i < mb.size(); i++) mb[i] = fabs(db0[i]);
        std::vector<double> gsum(mb.size(), 0.0);
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++) {
                double gv = Gb[(size_t)(n * O + o)];
                gsum[(size_t)o] += fabs(G[(size_t)(n * O + o)]);
                mb[(size_t)o] += fabs(G[(size_t)(n * O + o)]);
                for (int64_t i = 0; i < I; i++) {
                    mx[(size_t)(n * I + i)] += fabs(gv * W[(size_t)(o * I + i)]);
                    mw[(size_t)(o * I + i)] += fabs(gv * X[(size_t)(n * I + i)]);
                }
            }
        std::vector<double> bx(mx.size()), bw(mw.size()), bb(mb.size());
        for (size_t i = 0; i < bx.size(); i++) bx[i] = 2 * SUM_X * gam((double)O + 1) * mx[i];
        for (size_t i = 0; i < bw.size(); i++) bw[i] = 2 * SUM_X * gam((double)N + 1) * mw[i];
        for (size_t i = 0; i < bb.size(); i++) bb[i] = 2 * SUM_X * gam((double)N + 1) * mb[i] + gsum[i] / 512;
        snprintf(name, sizeof name, "linear_bwd_bf16_x_cuda_dx_within_f32_sums_of_cpu_%s", tag);
        within(name, values(dx.d), std::vector<double>(cpu_dx.begin(), cpu_dx.end()), bx);
        snprintf(name, sizeof name, "linear_bwd_bf16_x_cuda_dw_within_f32_sums_of_cpu_%s", tag);
        within(name, values(dw.d), std::vector<double>(cpu_dw.begin(), cpu_dw.end()), bw);
        snprintf(name, sizeof name, "linear_bwd_bf16_x_cuda_dbias_within_bf16_dout_of_cpu_%s", tag);
        within(name, values(db.d), std::vector<double>(cpu_db.begin(), cpu_db.end()), bb);
        snprintf(name, sizeof name, "linear_bwd_bf16_x_cuda_%s_%s", refuse ? "fell_back" : "ran_the_bgradb_epilogue", tag);
        path(name, dt_emu_lt_count(4) == c4 + !refuse, !refuse, "BGRADB epilogue runs not as expected");
    }
    dt_emu_lt_refuse(0);
    pair_t *all[] = {&x, &w, &g, &dx, &dw, &db};
    for (pair_t *p : all) release(*p);
}

/* ---------------------------------------------------------------- bad inputs */

static void bad_inputs(void) {
    const int64_t N = 4, O = 8, I = 16;
    pair_t x16 = make(DT_BF16, N, I, 50), x32 = make(DT_F32, N, I, 51), w32 = make(DT_F32, O, I, 52);
    pair_t w16 = make(DT_BF16, O, I, 53), b = make(DT_F32, O, 0, 54), o32 = make(DT_F32, N, O, 55);
    pair_t o16 = make(DT_BF16, N, O, 56), p32 = make(DT_F32, N, O, 57), p16 = make(DT_BF16, N, O, 58);
    pair_t g = make(DT_F32, N, O, 59), dx = make(DT_F32, N, I, 60), dw = make(DT_F32, O, I, 61);
    pair_t lw = make(DT_F32, I, 0, 62);
    dt_status st;
    st = dt_linear_fwd(&ctx, &o32.d, &x16.d, &w32.d, &b.d);
    dt_test_error("linear_fwd_cuda_bf16_x_f32_w_is_named", st, dt_ctx_error(&ctx), "x is bf16");
    DT_TEST_CHECK("linear_fwd_cuda_bf16_x_f32_w_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
    st = dt_linear_fwd(&ctx, &o16.d, &x32.d, &w32.d, &b.d);
    dt_test_error("linear_fwd_cuda_bf16_out_f32_w_is_named", st, dt_ctx_error(&ctx), "out is bf16");
    DT_TEST_CHECK("linear_fwd_cuda_bf16_out_f32_w_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
    st = dt_linear_bwd(&ctx, &dx.d, &dw.d, NULL, &g.d, &x16.d, &w32.d);
    dt_test_error("linear_bwd_cuda_bf16_x_f32_w_is_named", st, dt_ctx_error(&ctx), "x is bf16");
    DT_TEST_CHECK("linear_bwd_cuda_bf16_x_f32_w_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
    st = dt_linear_gelu_fwd(&ctx, &o16.d, &p32.d, &x16.d, &w16.d, &b.d);
    dt_test_error("linear_gelu_fwd_cuda_bf16_out_f32_pre_is_named", st, dt_ctx_error(&ctx), "out is bf16");
    DT_TEST_CHECK("linear_gelu_fwd_cuda_bf16_out_f32_pre_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
    st = dt_linear_gelu_fwd(&ctx, &o16.d, &p16.d, &x32.d, &w32.d, &b.d);
    dt_test_error("linear_gelu_fwd_cuda_bf16_out_and_pre_f32_w_is_named", st, dt_ctx_error(&ctx), "w is f32");
    DT_TEST_CHECK("linear_gelu_fwd_cuda_bf16_out_and_pre_f32_w_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
    { /* a bf16 out over x's own memory: the layernorm and the GELU would read what they overwrite */
        dt_tensor alias = x32.d;
        alias.dtype = DT_BF16;
        st = dt_layernorm_fwd(&ctx, &alias, NULL, NULL, &x32.d, &lw.d, NULL, 1e-5f);
        dt_test_error("layernorm_fwd_cuda_bf16_out_sharing_x_is_named", st, dt_ctx_error(&ctx), "shares memory with x");
        dt_tensor alias_h = x32.h;
        alias_h.dtype = DT_BF16;
        st = dt_layernorm_fwd(&ctx, &alias_h, NULL, NULL, &x32.h, &lw.h, NULL, 1e-5f);
        dt_test_error("layernorm_fwd_cpu_bf16_out_sharing_x_is_named", st, dt_ctx_error(&ctx), "shares memory with x");
        st = dt_gelu_fwd(&ctx, &alias, &x32.d);
        dt_test_error("gelu_fwd_cuda_bf16_out_sharing_x_is_named", st, dt_ctx_error(&ctx), "shares memory with x");
    }
    DT_TEST_CHECK("bad_inputs_cuda_nothing_pending", dt_ctx_sync(&ctx) == DT_OK);
    pair_t *all[] = {&x16, &x32, &w32, &w16, &b, &o32, &o16, &p32, &p16, &g, &dx, &dw, &lw};
    for (pair_t *p : all) release(*p);
}

/* Attention writing a bf16 out (bf16 qkv): on CUDA the flash kernel's f32 value rounded once (the
   same kernel's f32 out, rounded, bit for bit), on the CPU the f32 op's out rounded (att kept);
   H query heads over Hkv kv heads of size 64. The backward never reads out (the flash backward
   reruns its forward in f32; the CPU's reads att). */
static void attention(int64_t B, int64_t T, int H, int Hkv) {
    const int64_t hs = 64, C = H * hs, W = C + 2 * Hkv * hs;
    char name[160], tag[48];
    snprintf(tag, sizeof tag, "b%lld_t%lld_h%d_kv%d", (long long)B, (long long)T, H, Hkv);
    pair_t q = make(DT_BF16, B * T, W, 61), o32 = make(DT_F32, B * T, C, 62), o16 = make(DT_BF16, B * T, C, 63);
    pair_t att = make(DT_F32, B * H * T, T, 64);
    dt_tensor q3[2], a32[2], a16[2], at4;
    int64_t s3q[3] = {B, T, W}, s3o[3] = {B, T, C}, s4[4] = {B, H, T, T};
    dt_tensor_reshape(&ctx, &q3[0], &q.h, 3, s3q); dt_tensor_reshape(&ctx, &q3[1], &q.d, 3, s3q);
    dt_tensor_reshape(&ctx, &a32[0], &o32.h, 3, s3o); dt_tensor_reshape(&ctx, &a32[1], &o32.d, 3, s3o);
    dt_tensor_reshape(&ctx, &a16[0], &o16.h, 3, s3o); dt_tensor_reshape(&ctx, &a16[1], &o16.d, 3, s3o);
    dt_tensor_reshape(&ctx, &at4, &att.h, 4, s4);
    snprintf(name, sizeof name, "attention_bf16_out_cuda_is_its_f32_out_rounded_%s", tag);
    if (ok2(name, dt_attention_gqa_fwd(&ctx, &a32[1], NULL, &q3[1], H, Hkv),
            dt_attention_gqa_fwd(&ctx, &a16[1], NULL, &q3[1], H, Hkv))) {
        std::vector<float> f = values(o32.d), r(f.size());
        for (size_t i = 0; i < f.size(); i++) r[i] = bf16_round(f[i]);
        same_bits(name, values(o16.d), r);
    }
    snprintf(name, sizeof name, "attention_bf16_out_cpu_is_its_f32_out_rounded_%s", tag);
    if (ok2(name, dt_attention_gqa_fwd(&ctx, &a32[0], &at4, &q3[0], H, Hkv),
            dt_attention_gqa_fwd(&ctx, &a16[0], &at4, &q3[0], H, Hkv))) {
        std::vector<float> f = values(o32.h), r(f.size());
        for (size_t i = 0; i < f.size(); i++) r[i] = bf16_round(f[i]);
        same_bits(name, values(o16.h), r);
    }
    /* the backward takes no bf16 dout: f32 gradients */
    snprintf(name, sizeof name, "attention_bwd_bf16_dout_is_named_%s", tag);
    {
        pair_t dq = make(DT_F32, B * T, W, 65);
        dt_tensor dq3;
        dt_tensor_reshape(&ctx, &dq3, &dq.d, 3, s3q);
        dt_test_error(name, dt_attention_gqa_bwd(&ctx, &dq3, &a16[1], &q3[1], NULL, H, Hkv), dt_ctx_error(&ctx), "dout");
        release(dq);
    }
    release(q); release(o32); release(o16); release(att);
}

int main(void) {
    dt_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &cd)) { dt_test_fail("ctx_init_cuda", "%s", dt_ctx_error(&ctx)); return dt_test_finish(); }
    const int64_t R = rows(37, 5), N = rows(37, 9);
    layernorm(R, 100); /* C % 4 == 0: the float4 loads, 8-byte stores of four */
    layernorm(R, 101); /* the scalar path */
    layernorm(R, 768);
    gelu(1001);
    gelu(1024);
    for (int refuse = 0; refuse <= 1; refuse++) {
        linear_fwd(N, 64, 48, refuse);
        linear_fwd(N, 24, 48, refuse); /* O % 8 == 0: GELU_AUX_BIAS has an algorithm */
        linear_fwd(N, 20, 48, refuse); /* O % 8 != 0: the GELU's separate ops */
        linear_bwd(N, 64, 48, refuse);
        linear_bwd(N, 20, 48, refuse);
    }
    attention(2, rows(37, 9), 2, 2);
    attention(1, rows(70, 17), 4, 2); /* grouped-query, past one 64-row tile */
    bad_inputs();
    DT_TEST_CHECK("emulator_reported_nothing", dt_emu_report_count() == 0);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
