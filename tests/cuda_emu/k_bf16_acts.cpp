// tests/cuda_emu/k_bf16_acts.cpp - dt_tensor.h's bf16 activations on CUDA tensors (the emulator)
// against the same ops on CPU tensors: a layernorm that writes bf16, GELU reading and writing bf16,
// and dt_linear with a bf16 w reading a bf16 x and writing a bf16 out (and pre), through
// cuBLASLt's epilogues with a bf16 D and through the separate ops when the heuristic refuses.
// And the bf16 gradients beside a bf16 w (as llm.c keeps them): dt_gelu_bwd with dx, dout, x each
// f32 or bf16, dt_linear_bwd with a bf16 dout and / or a bf16 dx, dt_bias_add_bwd with a bf16 dout.
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
//   - GELU backward with bf16 gradients (every mix of dx, dout, x in f32 / bf16 with dx or dout
//     bf16): the inputs are bf16 values, an f32 one holds them widened, so each form is the f32
//     op on the widened values: an f32 dx its bits, a bf16 dx its bits rounded once, on each
//     device (the same f32 arithmetic; every bf16 operand a view off alignment, the kernel's
//     scalar loop: the same bits). CUDA against the CPU: an f32 dx within the bound d above, a
//     bf16 dx within d + ulp.
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
//   - linear bwd with bf16 gradients (four runs from the same values: dout and the initial dx
//     bf16 values, an f32 one holding them widened). A bf16 dout is read as it is: dx, dw and
//     dbias are bit for bit those of the f32 dout holding its values, on each device (the same
//     GEMM operands; BGRADB or the bias kernel sums the same values), CUDA within the sum bounds
//     above of the CPU, dbias without the 2^-9 term (both sum the same bf16 values); and
//     dt_bias_add_bwd alike. A bf16 dx (nonzero at the start) is its f32 value v' rounded once,
//     where v' and the f32 dx run's v from the same start are both sums of dx0 and the same
//     products: |v' - v| <= e = 2 gamma(O + 1) (sum |dout w| + |dx0|), so on each device the bf16
//     dx is the rounding of some f32 in [v - e, v + e] (rounds_from, within ulp + e), and CUDA
//     within ulp + e of the CPU; on the emulator (its GEMM widens a bf16 C, runs the f32 GEMM,
//     rounds) bit for bit v rounded. dw and dbias are bit for bit the f32 dx run's; with O = 0
//     the bf16 dx keeps its bits. Both bf16: bit for bit the bf16 dx run's with the f32 dout. I =
//     4096 puts the CPU's bf16 dx in blocks of 2^20 / I = 256 rows (three, two on small inputs).
// Which path ran: ctx->counters.lt_fused / lt_separate and the emulator's count of each epilogue
// (dt_emu_lt_count); dt_emu_lt_refuse makes the heuristic refuse every epilogue, so the separate
// ops run (on a GPU both are SKIP: its heuristic decides, and the value checks hold either way).
// Bad inputs: a bf16 x or out with an f32 w, a bf16 out with an f32 pre, a bf16 dout or dx with
// an f32 w, an f16 dx or dout to the GELU backward (DT_ERR_DTYPE naming the argument); a bf16 out
// sharing x's memory, a bf16 dx sharing an f32 dout's or x's (an error, not a crash).
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <math.h>
#include <initializer_list>
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

/* A CPU tensor [a] or [a, b] of dtype dt with values uniform in [lo, hi) (bf16: rounded), and its CUDA copy
   (ndim 2: [a, b] even where b is 0). */
struct pair_t { dt_tensor h, d; };
static pair_t make(dt_dtype dt, int64_t a, int64_t b, uint64_t seed, float lo = -1.0f, float hi = 1.0f, int ndim = 0) {
    pair_t p;
    dt_tensor_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = dt;
    desc.ndim = ndim ? ndim : b ? 2 : 1;
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
    pair_t p = make(DT_F32, t.shape[0], t.ndim > 1 ? t.shape[1] : 0, seed, -1.0f, 1.0f, t.ndim);
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
/* v with each value rounded once to bf16 (what a bf16 output of the same f32 values holds) */
static std::vector<float> rounded(std::vector<float> v) {
    for (float &t : v) t = bf16_round(t);
    return v;
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
            snprintf(name, sizeof name, "layernorm_fwd_cpu_bf16_out_is_its_f32_out_rounded_once_%s", tag);
            same_bits(name, cpu, rounded(values(o32.h)));
            snprintf(name, sizeof name, "layernorm_fwd_cuda_bf16_out_is_its_f32_out_rounded_once_%s", tag);
            same_bits(name, cu, rounded(values(o32.d)));
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
        if (ok2(name, DT_OK, sv)) same_bits(name, values(v16), rounded(values(v32)));
        release(b16); release(b32);
    }
    pair_t *all[] = {&x, &w, &b, &o16, &o32, &mean, &rstd, &m32, &r32};
    for (pair_t *p : all) release(*p);
}

/* ---------------------------------------------------------------- GELU */

/* The backward's bound between the CPU's and CUDA's f32 dx (the header's): dout G, x X, dx R. */
static std::vector<double> gelu_bwd_bound(const std::vector<float> &G, const std::vector<float> &X,
                                          const std::vector<float> &R) {
    std::vector<double> b(G.size());
    for (size_t i = 0; i < b.size(); i++)
        b[i] = fabs(G[i]) * (1e-5 * fabs(gelu_grad_d(X[i])) + ldexp(1.0, -20)) + 2 * U * fabs(R[i]) + 1e-7;
    return b;
}

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
    std::vector<float> ref_h = values(r32.h), ref_d = values(r32.d), rnd_h = rounded(ref_h), rnd_d = rounded(ref_d);
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
        /* in place (out = x, the same elements), as the f32 op: each device's bits of before */
        pair_t y = make(DT_BF16, n, 0, 28);
        dt_tensor_copy(&ctx, &y.h, &x16.h);
        dt_tensor_copy(&ctx, &y.d, &x16.d);
        snprintf(name, sizeof name, "gelu_fwd_bf16_in_place_same_bits_%s", tag);
        if (ok2(name, dt_gelu_fwd(&ctx, &y.h, &y.h), dt_gelu_fwd(&ctx, &y.d, &y.d))) {
            same_bits(name, values(y.h), cpu);
            same_bits(name, values(y.d), cu);
        }
        release(bx); release(bo); release(y);
    }
    snprintf(name, sizeof name, "gelu_fwd_f32_to_bf16_cuda_within_1_ulp_of_cpu_%s", tag);
    if (ok2(name, dt_gelu_fwd(&ctx, &o16.h, &xf.h), dt_gelu_fwd(&ctx, &o16.d, &xf.d))) {
        std::vector<float> cu = values(o16.d), cpu = values(o16.h);
        within_ulp(name, cu, cpu, NULL);
        if (ok2("gelu_fwd_f32_reference", dt_gelu_fwd(&ctx, &r32.h, &xf.h), dt_gelu_fwd(&ctx, &r32.d, &xf.d))) {
            snprintf(name, sizeof name, "gelu_fwd_f32_to_bf16_cpu_is_f32_gelu_rounded_once_%s", tag);
            same_bits(name, cpu, rounded(values(r32.h)));
            snprintf(name, sizeof name, "gelu_fwd_f32_to_bf16_cuda_is_f32_gelu_rounded_once_%s", tag);
            same_bits(name, cu, rounded(values(r32.d)));
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
            within(name, cu, std::vector<double>(cpu.begin(), cpu.end()), gelu_bwd_bound(G, X, cpu));
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

/* The backward with bf16 gradients: each of dx, dout, x f32 or bf16, at least dx or dout bf16 (a
   bf16 x alone: gelu()). Every form runs from the same values: x, dout and the initial dx are
   bf16 values, an f32 one holds them widened. The f32 op on them all widened is what each form
   computes in f32, on each device; a bf16 dx is that rounded once. */
static const char *tname(dt_dtype d) { return d == DT_BF16 ? "bf16" : "f32"; }
static void gelu_bwd_grads(int64_t n) {
    char name[200], tag[64];
    pair_t x16 = make(DT_BF16, n, 0, 70, -4.0f, 4.0f), g16 = make(DT_BF16, n, 0, 71), d16 = make(DT_BF16, n, 0, 72);
    pair_t x32 = widened(x16.h, 73), g32 = widened(g16.h, 74), r32 = widened(d16.h, 75);
    pair_t *all[] = {&x16, &g16, &d16, &x32, &g32, &r32};
    snprintf(name, sizeof name, "gelu_bwd_f32_reference_n%lld", (long long)n);
    if (!ok2(name, dt_gelu_bwd(&ctx, &r32.h, &g32.h, &x32.h), dt_gelu_bwd(&ctx, &r32.d, &g32.d, &x32.d))) {
        for (pair_t *p : all) release(*p);
        return;
    }
    std::vector<float> X = values(x16.h), G = values(g16.h), ref_h = values(r32.h), ref_d = values(r32.d);
    std::vector<float> rnd_h = rounded(ref_h), rnd_d = rounded(ref_d);
    std::vector<double> bound = gelu_bwd_bound(G, X, ref_h);
    for (int c = 0; c < 8; c++) {
        dt_dtype tdx = c & 4 ? DT_BF16 : DT_F32, tg = c & 2 ? DT_BF16 : DT_F32, tx = c & 1 ? DT_BF16 : DT_F32;
        if (tdx == DT_F32 && tg == DT_F32) continue;
        pair_t &g = tg == DT_BF16 ? g16 : g32, &x = tx == DT_BF16 ? x16 : x32;
        pair_t dx = tdx == DT_BF16 ? make(DT_BF16, n, 0, 72) : widened(d16.h, 76);
        snprintf(tag, sizeof tag, "%s_dx_%s_dout_%s_x_n%lld", tname(tdx), tname(tg), tname(tx), (long long)n);
        snprintf(name, sizeof name, "gelu_bwd_%s_cuda_%s_of_cpu", tag,
                 tdx == DT_BF16 ? "within_1_ulp_and_f32_bound" : "within_f32_bound");
        if (ok2(name, dt_gelu_bwd(&ctx, &dx.h, &g.h, &x.h), dt_gelu_bwd(&ctx, &dx.d, &g.d, &x.d))) {
            std::vector<float> cu = values(dx.d), cpu = values(dx.h);
            if (tdx == DT_BF16) within_ulp(name, cu, cpu, &bound);
            else within(name, cu, std::vector<double>(cpu.begin(), cpu.end()), bound);
            /* the same f32 arithmetic on the same values, a bf16 dx rounded once: bit for bit */
            snprintf(name, sizeof name, "gelu_bwd_%s_cpu_is_the_f32_op%s", tag, tdx == DT_BF16 ? "_rounded_once" : "");
            same_bits(name, cpu, tdx == DT_BF16 ? rnd_h : ref_h);
            snprintf(name, sizeof name, "gelu_bwd_%s_cuda_is_the_f32_op%s", tag, tdx == DT_BF16 ? "_rounded_once" : "");
            same_bits(name, cu, tdx == DT_BF16 ? rnd_d : ref_d);
            /* each bf16 operand a view 2 bytes past 8-byte alignment (the scalar loop; an f32 one
               a fresh copy, dx from the initial values): the same bits */
            const pair_t *init[3] = {&d16, &g16, &x16};
            const dt_dtype ty[3] = {tdx, tg, tx};
            pair_t buf[3];
            dt_tensor v[3];
            int64_t shape[1] = {n};
            dt_status sv = DT_OK;
            for (int k = 0; k < 3; k++) {
                if (ty[k] == DT_F32) {
                    buf[k] = widened(init[k]->h, 77 + (uint64_t)k);
                    v[k] = buf[k].d;
                    continue;
                }
                buf[k] = make(DT_BF16, n + 1, 0, 80 + (uint64_t)k);
                memcpy((uint16_t *)buf[k].h.data + 1, init[k]->h.data, (size_t)n * 2);
                dt_tensor_copy(&ctx, &buf[k].d, &buf[k].h);
                if (!sv) sv = dt_tensor_view(&ctx, &v[k], &buf[k].d, 1, 1, shape);
            }
            snprintf(name, sizeof name, "gelu_bwd_%s_bf16_views_at_offset_1_cuda_same_bits", tag);
            if (!sv) sv = dt_gelu_bwd(&ctx, &v[0], &v[1], &v[2]);
            if (ok2(name, DT_OK, sv)) same_bits(name, values(v[0]), cu);
            for (pair_t &b : buf) release(b);
        }
        release(dx);
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

/* The backward's bounds between two f32 results from the same operands (the header's): dx within
   2 gamma(O + 1) (sum_o |dout w| + |dx0|), dw within 2 gamma(N + 1) (sum_n |dout x| + |dw0|), dbias
   within 2 gamma(N + 1) (sum_n |dout| + |db0|). Gb: dout as the GEMMs read it (bf16 values); G: as
   the bias sums read it; gsum: sum_n |G|. */
static void linear_bwd_bounds(const std::vector<float> &X, const std::vector<float> &W, const std::vector<float> &G,
                              const std::vector<float> &Gb, const std::vector<float> &DX0, const std::vector<float> &DW0,
                              const std::vector<float> &DB0, int64_t N, int64_t O, int64_t I, std::vector<double> &bx,
                              std::vector<double> &bw, std::vector<double> &bb, std::vector<double> &gsum) {
    std::vector<double> mx(DX0.size()), mw(DW0.size()), mb(DB0.size());
    for (size_t i = 0; i < mx.size(); i++) mx[i] = fabs(DX0[i]);
    for (size_t i = 0; i < mw.size(); i++) mw[i] = fabs(DW0[i]);
    for (size_t i = 0; i < mb.size(); i++) mb[i] = fabs(DB0[i]);
    gsum.assign(mb.size(), 0.0);
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
    bx.resize(mx.size()), bw.resize(mw.size()), bb.resize(mb.size());
    for (size_t i = 0; i < bx.size(); i++) bx[i] = 2 * SUM_X * gam((double)O + 1) * mx[i];
    for (size_t i = 0; i < bw.size(); i++) bw[i] = 2 * SUM_X * gam((double)N + 1) * mw[i];
    for (size_t i = 0; i < bb.size(); i++) bb[i] = 2 * SUM_X * gam((double)N + 1) * mb[i];
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
        std::vector<double> bx, bw, bb, gsum;
        linear_bwd_bounds(X, W, G, Gb, dx0, dw0, db0, N, O, I, bx, bw, bb, gsum);
        for (size_t i = 0; i < bb.size(); i++) bb[i] += gsum[i] / 512; /* the epilogue sums the rounded dout */
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

/* The values of several tensors, one after another. */
static std::vector<float> values_of(std::initializer_list<const dt_tensor *> ts) {
    std::vector<float> v;
    for (const dt_tensor *t : ts) {
        std::vector<float> u = values(*t);
        v.insert(v.end(), u.begin(), u.end());
    }
    return v;
}

/* dt_linear_bwd with bf16 gradients beside a bf16 x and w: a bf16 dout and / or a bf16 dx (its
   initial value nonzero). Four runs on each device from the same values (dout's and dx's bf16
   values, an f32 one holding them widened): r[k] with k = 2 (dx bf16) + (dout bf16). Then
   dt_bias_add_bwd with the bf16 dout. */
static void linear_bwd_grads(int64_t N, int64_t O, int64_t I, int refuse) {
    char name[200], tag[64], what[96];
    snprintf(tag, sizeof tag, "N%lld_O%lld_I%lld%s", (long long)N, (long long)O, (long long)I, refuse ? "_refused" : "");
    pair_t x = make(DT_BF16, N, I, 90), w = make(DT_BF16, O, I, 91), g16 = make(DT_BF16, N, O, 92, -1.0f, 1.0f, 2);
    pair_t g32 = widened(g16.h, 93), d16 = make(DT_BF16, N, I, 94);
    struct { pair_t dx, dw, db; } r[4];
    static const char *const form[4] = {"f32_dout_f32_dx", "bf16_dout", "bf16_dx", "bf16_dout_bf16_dx"};
    std::vector<float> X = values(x.h), W = values(w.h), G = values(g16.h), DX0 = values(d16.h), DW0, DB0;
    std::vector<double> bx, bw, bb, gsum;
    int ran = 0;
    for (int k = 0; k < 4; k++) {
        r[k].dx = k & 2 ? make(DT_BF16, N, I, 94) : widened(d16.h, 95);
        r[k].dw = make(DT_F32, O, I, 96);
        r[k].db = make(DT_F32, O, 0, 97);
    }
    DW0 = values(r[0].dw.h), DB0 = values(r[0].db.h);
    linear_bwd_bounds(X, W, G, G, DX0, DW0, DB0, N, O, I, bx, bw, bb, gsum);
    dt_emu_lt_refuse(refuse ? 0x1fu : 0u);
    for (int k = 0; k < 4; k++) {
        pair_t &g = k & 1 ? g16 : g32;
        long c4 = dt_emu_lt_count(4);
        path_begin();
        snprintf(name, sizeof name, "linear_bwd_%s_runs_%s", form[k], tag);
        if (!ok2(name, dt_linear_bwd(&ctx, &r[k].dx.h, &r[k].dw.h, &r[k].db.h, &g.h, &x.h, &w.h),
                 dt_linear_bwd(&ctx, &r[k].dx.d, &r[k].dw.d, &r[k].db.d, &g.d, &x.d, &w.d)))
            continue;
        ran |= 1 << k;
        if ((k & 1) && O > 0) { /* O = 0: nothing for an epilogue to do (the GEMM returns at once) */
            snprintf(name, sizeof name, "linear_bwd_%s_cuda_%s_%s", form[k],
                     refuse ? "fell_back" : "ran_the_bgradb_epilogue", tag);
            snprintf(what, sizeof what, "BGRADB epilogue runs %ld -> %ld", c4, dt_emu_lt_count(4));
            path(name, dt_emu_lt_count(4) == c4 + !refuse, !refuse, what);
        }
    }
    dt_emu_lt_refuse(0);
    if ((ran & 3) == 3) { /* a bf16 dout: the f32 dout's values, read as they are */
        std::vector<float> cdx = values(r[1].dx.h), cdw = values(r[1].dw.h), cdb = values(r[1].db.h);
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_cuda_dx_within_f32_sums_of_cpu_%s", tag);
        within(name, values(r[1].dx.d), std::vector<double>(cdx.begin(), cdx.end()), bx);
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_cuda_dw_within_f32_sums_of_cpu_%s", tag);
        within(name, values(r[1].dw.d), std::vector<double>(cdw.begin(), cdw.end()), bw);
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_cuda_dbias_within_f32_sums_of_cpu_%s", tag);
        within(name, values(r[1].db.d), std::vector<double>(cdb.begin(), cdb.end()), bb);
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_cpu_dx_dw_dbias_are_the_f32_douts_%s", tag);
        same_bits(name, values_of({&r[1].dx.h, &r[1].dw.h, &r[1].db.h}), values_of({&r[0].dx.h, &r[0].dw.h, &r[0].db.h}));
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_cuda_dx_dw_dbias_are_the_f32_douts_%s", tag);
        same_bits(name, values_of({&r[1].dx.d, &r[1].dw.d, &r[1].db.d}), values_of({&r[0].dx.d, &r[0].dw.d, &r[0].db.d}));
    }
    if ((ran & 5) == 5) { /* a bf16 dx: the f32 dx's value (from the same start) rounded once */
        std::vector<float> cu = values(r[2].dx.d), cpu = values(r[2].dx.h), f_h = values(r[0].dx.h), f_d = values(r[0].dx.d);
        snprintf(name, sizeof name, "linear_bwd_bf16_dx_cuda_within_1_ulp_and_f32_sums_of_cpu_%s", tag);
        within_ulp(name, cu, cpu, &bx);
        std::vector<double> vh(f_h.begin(), f_h.end()), vd(f_d.begin(), f_d.end());
        snprintf(name, sizeof name, "linear_bwd_bf16_dx_cpu_rounds_its_f32_dx_within_f32_sums_%s", tag);
        rounds_from(name, cpu, vh, bx);
        snprintf(name, sizeof name, "linear_bwd_bf16_dx_cuda_rounds_its_f32_dx_within_f32_sums_%s", tag);
        rounds_from(name, cu, vd, bx);
#ifndef DT_EMU_STUBS
        /* the emulator's GEMM widens a bf16 C, runs the f32 GEMM and rounds: the same sums */
        snprintf(name, sizeof name, "linear_bwd_bf16_dx_cuda_is_its_f32_dx_rounded_once_%s", tag);
        same_bits(name, cu, rounded(f_d));
#endif
        snprintf(name, sizeof name, "linear_bwd_bf16_dx_cpu_dw_dbias_as_with_an_f32_dx_%s", tag);
        same_bits(name, values_of({&r[2].dw.h, &r[2].db.h}), values_of({&r[0].dw.h, &r[0].db.h}));
        snprintf(name, sizeof name, "linear_bwd_bf16_dx_cuda_dw_dbias_as_with_an_f32_dx_%s", tag);
        same_bits(name, values_of({&r[2].dw.d, &r[2].db.d}), values_of({&r[0].dw.d, &r[0].db.d}));
        if (O == 0) { /* nothing summed: dx as it was, bit for bit */
            snprintf(name, sizeof name, "linear_bwd_bf16_dx_no_out_features_cpu_keeps_dx_%s", tag);
            same_bits(name, cpu, DX0);
            snprintf(name, sizeof name, "linear_bwd_bf16_dx_no_out_features_cuda_keeps_dx_%s", tag);
            same_bits(name, cu, DX0);
        }
    }
    if ((ran & 12) == 12) { /* both bf16: the bf16 dx's run with the f32 dout's values */
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_bf16_dx_cuda_dx_within_1_ulp_and_f32_sums_of_cpu_%s", tag);
        within_ulp(name, values(r[3].dx.d), values(r[3].dx.h), &bx);
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_bf16_dx_cpu_dx_dw_dbias_are_the_f32_douts_%s", tag);
        same_bits(name, values_of({&r[3].dx.h, &r[3].dw.h, &r[3].db.h}), values_of({&r[2].dx.h, &r[2].dw.h, &r[2].db.h}));
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_bf16_dx_cuda_dx_dw_dbias_are_the_f32_douts_%s", tag);
        same_bits(name, values_of({&r[3].dx.d, &r[3].dw.d, &r[3].db.d}), values_of({&r[2].dx.d, &r[2].dw.d, &r[2].db.d}));
    }
    if (!refuse) { /* dt_bias_add_bwd alone: the CPU's double sums, CUDA's widened copy and f32 kernel */
        pair_t b16 = make(DT_F32, O, 0, 97), b32 = make(DT_F32, O, 0, 97);
        snprintf(name, sizeof name, "bias_add_bwd_bf16_dout_cuda_within_f32_sums_of_cpu_%s", tag);
        if (ok2(name, dt_bias_add_bwd(&ctx, &b16.h, &g16.h), dt_bias_add_bwd(&ctx, &b16.d, &g16.d))) {
            std::vector<float> cpu = values(b16.h);
            within(name, values(b16.d), std::vector<double>(cpu.begin(), cpu.end()), bb);
            snprintf(name, sizeof name, "bias_add_bwd_bf16_dout_is_the_f32_douts_%s", tag);
            if (ok2(name, dt_bias_add_bwd(&ctx, &b32.h, &g32.h), dt_bias_add_bwd(&ctx, &b32.d, &g32.d))) {
                snprintf(name, sizeof name, "bias_add_bwd_bf16_dout_cpu_is_the_f32_douts_%s", tag);
                same_bits(name, cpu, values(b32.h));
                snprintf(name, sizeof name, "bias_add_bwd_bf16_dout_cuda_is_the_f32_douts_%s", tag);
                same_bits(name, values(b16.d), values(b32.d));
            }
        }
        release(b16); release(b32);
    }
    for (auto &t : r) release(t.dx), release(t.dw), release(t.db);
    pair_t *all[] = {&x, &w, &g16, &g32, &d16};
    for (pair_t *p : all) release(*p);
}

/* ---------------------------------------------------------------- bad inputs */

static void bad_inputs(void) {
    const int64_t N = 4, O = 8, I = 16;
    pair_t x16 = make(DT_BF16, N, I, 50), x32 = make(DT_F32, N, I, 51), w32 = make(DT_F32, O, I, 52);
    pair_t w16 = make(DT_BF16, O, I, 53), b = make(DT_F32, O, 0, 54), o32 = make(DT_F32, N, O, 55);
    pair_t o16 = make(DT_BF16, N, O, 56), p32 = make(DT_F32, N, O, 57), p16 = make(DT_BF16, N, O, 58);
    pair_t g = make(DT_F32, N, O, 59), dx = make(DT_F32, N, I, 60), dw = make(DT_F32, O, I, 61);
    pair_t lw = make(DT_F32, I, 0, 62), g16 = make(DT_BF16, N, O, 63), dx16 = make(DT_BF16, N, I, 64);
    pair_t a32 = make(DT_F32, 64, 0, 65), a16 = make(DT_BF16, 64, 0, 66);
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
    /* bf16 gradients go with a bf16 w */
    st = dt_linear_bwd(&ctx, &dx.d, &dw.d, NULL, &g16.d, &x32.d, &w32.d);
    dt_test_error("linear_bwd_cuda_bf16_dout_f32_w_is_named", st, dt_ctx_error(&ctx), "dout is bf16 but w is f32");
    DT_TEST_CHECK("linear_bwd_cuda_bf16_dout_f32_w_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
    st = dt_linear_bwd(&ctx, &dx16.d, &dw.d, NULL, &g.d, &x32.d, &w32.d);
    dt_test_error("linear_bwd_cuda_bf16_dx_f32_w_is_named", st, dt_ctx_error(&ctx), "dx is bf16 but w is f32");
    DT_TEST_CHECK("linear_bwd_cuda_bf16_dx_f32_w_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
    st = dt_linear_bwd(&ctx, &dx16.h, &dw.h, NULL, &g.h, &x32.h, &w32.h);
    dt_test_error("linear_bwd_cpu_bf16_dx_f32_w_is_named", st, dt_ctx_error(&ctx), "dx is bf16 but w is f32");
    { /* the GELU backward takes f32 or bf16 gradients only */
        dt_tensor h16 = a32.d;
        h16.dtype = DT_F16; /* a16's first half, as f16 */
        st = dt_gelu_bwd(&ctx, &h16, &a16.d, &a16.d);
        dt_test_error("gelu_bwd_cuda_f16_dx_is_named", st, dt_ctx_error(&ctx), "dx has dtype f16");
        DT_TEST_CHECK("gelu_bwd_cuda_f16_dx_is_DT_ERR_DTYPE", st == DT_ERR_DTYPE);
        st = dt_gelu_bwd(&ctx, &a16.d, &h16, &a32.d);
        dt_test_error("gelu_bwd_cuda_f16_dout_is_named", st, dt_ctx_error(&ctx), "dout has dtype f16");
    }
    { /* a bf16 dx over an f32 dout's (or x's) memory: elements of other sizes meet at other offsets */
        dt_tensor alias = a32.d, alias_h = a32.h;
        alias.dtype = alias_h.dtype = DT_BF16;
        st = dt_gelu_bwd(&ctx, &alias, &a32.d, &a16.d);
        dt_test_error("gelu_bwd_cuda_bf16_dx_sharing_f32_dout_is_named", st, dt_ctx_error(&ctx), "dx shares memory with dout");
        st = dt_gelu_bwd(&ctx, &alias_h, &a32.h, &a16.h);
        dt_test_error("gelu_bwd_cpu_bf16_dx_sharing_f32_dout_is_named", st, dt_ctx_error(&ctx), "dx shares memory with dout");
        st = dt_gelu_bwd(&ctx, &alias, &a16.d, &a32.d);
        dt_test_error("gelu_bwd_cuda_bf16_dx_sharing_f32_x_is_named", st, dt_ctx_error(&ctx), "dx shares memory with x");
    }
    DT_TEST_CHECK("bad_inputs_cuda_nothing_pending", dt_ctx_sync(&ctx) == DT_OK);
    pair_t *all[] = {&x16, &x32, &w32, &w16, &b, &o32, &o16, &p32, &p16, &g, &dx, &dw, &lw, &g16, &dx16, &a32, &a16};
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
            dt_attention_gqa_fwd(&ctx, &a16[1], NULL, &q3[1], H, Hkv)))
        same_bits(name, values(o16.d), rounded(values(o32.d)));
    snprintf(name, sizeof name, "attention_bf16_out_cpu_is_its_f32_out_rounded_%s", tag);
    if (ok2(name, dt_attention_gqa_fwd(&ctx, &a32[0], &at4, &q3[0], H, Hkv),
            dt_attention_gqa_fwd(&ctx, &a16[0], &at4, &q3[0], H, Hkv)))
        same_bits(name, values(o16.h), rounded(values(o32.h)));
    /* the backward takes no bf16 dout: f32 gradients */
    snprintf(name, sizeof name, "attention_bwd_bf16_dout_is_named_%s", tag);
    {
        pair_t dq = make(DT_F32, B * T, W, 65);
        dt_tensor dq3;
        dt_tensor_reshape(&ctx, &dq3, &dq.d, 3, s3q);
        dt_test_error(name, dt_attention_gqa_bwd(&ctx, &dq3, &a16[1], &q3[1], NULL, H, Hkv), dt_ctx_error(&ctx), "dout");
        release(dq);
    }
    /* a bf16 dqkv: the f32 dqkv's result from the same start (its bf16 values widened), rounded
       once, bit for bit on each device (the same f32 sums, one more rounding) */
    {
        pair_t g = make(DT_F32, B * T, C, 66), d16 = make(DT_BF16, B * T, W, 67), d32 = widened(d16.h, 68);
        dt_tensor g3[2], e16[2], e32[2];
        const char *dev[2] = {"cpu", "cuda"};
        for (int k = 0; k < 2; k++) {
            dt_tensor_reshape(&ctx, &g3[k], k ? &g.d : &g.h, 3, s3o);
            dt_tensor_reshape(&ctx, &e16[k], k ? &d16.d : &d16.h, 3, s3q);
            dt_tensor_reshape(&ctx, &e32[k], k ? &d32.d : &d32.h, 3, s3q);
        }
        for (int k = 0; k < 2; k++) {
            const dt_tensor *at = k ? NULL : &at4;
            snprintf(name, sizeof name, "attention_bwd_bf16_dqkv_%s_is_its_f32_dqkv_rounded_%s", dev[k], tag);
            if (k == 0) dt_attention_gqa_fwd(&ctx, &a32[0], &at4, &q3[0], H, Hkv); /* att for the CPU's backward */
            if (ok2(name, dt_attention_gqa_bwd(&ctx, &e32[k], &g3[k], &q3[k], at, H, Hkv),
                    dt_attention_gqa_bwd(&ctx, &e16[k], &g3[k], &q3[k], at, H, Hkv)))
                same_bits(name, values(k ? d16.d : d16.h), rounded(values(k ? d32.d : d32.h)));
        }
        snprintf(name, sizeof name, "attention_bwd_bf16_dqkv_with_f32_qkv_is_named_%s", tag);
        {
            pair_t q32 = widened(q.h, 69);
            dt_tensor q32_3;
            dt_tensor_reshape(&ctx, &q32_3, &q32.h, 3, s3q);
            dt_attention_gqa_fwd(&ctx, &a32[0], &at4, &q32_3, H, Hkv);
            dt_test_error(name, dt_attention_gqa_bwd(&ctx, &e16[0], &g3[0], &q32_3, &at4, H, Hkv), dt_ctx_error(&ctx),
                          "dqkv");
            release(q32);
        }
        release(g); release(d16); release(d32);
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
    gelu_bwd_grads(1001); /* the kernel's 4-wide steps and a scalar tail */
    gelu_bwd_grads(1024);
    for (int refuse = 0; refuse <= 1; refuse++) {
        linear_fwd(N, 64, 48, refuse);
        linear_fwd(N, 24, 48, refuse); /* O % 8 == 0: GELU_AUX_BIAS has an algorithm */
        linear_fwd(N, 20, 48, refuse); /* O % 8 != 0: the GELU's separate ops */
        linear_bwd(N, 64, 48, refuse);
        linear_bwd(N, 20, 48, refuse);
        linear_bwd_grads(N, 64, 48, refuse);
        linear_bwd_grads(N, 20, 48, refuse);
        linear_bwd_grads(rows(600, 300), 8, 4096, refuse); /* the CPU's bf16 dx in blocks of 2^20 / I = 256 rows */
    }
    linear_bwd_grads(N, 0, 48, 0); /* no out features: dx keeps its value */
    attention(2, rows(37, 9), 2, 2);
    attention(1, rows(70, 17), 4, 2); /* grouped-query, past one 64-row tile */
    bad_inputs();
    DT_TEST_CHECK("emulator_reported_nothing", dt_emu_report_count() == 0);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
