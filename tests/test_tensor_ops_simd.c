// with: tests/tensor_ops_nosimd.c
/* tests/test_tensor_ops_simd.c - gelu, layernorm and softmax_xent on 4-lane vectors (SSE2 here,
   on x86-64; gelu on 8, AVX2, where the CPU has it) against (1) the same ops built with
   DT_TENSOR_NO_SIMD in another translation unit (tests/tensor_ops_nosimd.c), and gelu's 8 lanes
   against its 4: the same bits, since every lane does the scalar IEEE operation;
   (2) references computed in double with libm's exp and tanh, within the bounds dt_tensor.h
   states (the errors measured are printed as "info:" lines); (3) special values, in-place
   calls, rows that give the same bits wherever they sit, and bad inputs that are named.
   Shapes have odd widths (1, 3, 7, 8, 13, 773) so that every tail of the 8-lane loops runs. */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_test.h"
#include "tensor_ops_nosimd.h"

static dt_ctx C;

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) { /* xorshift64*: uniform in (0, 1) */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return ((double)((rng_state * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static void fill_normal(float *a, int64_t n, double mean, double std) {
    int64_t i;
    for (i = 0; i < n; i++) a[i] = (float)(mean + std * sqrt(-2.0 * log(urand())) * cos(6.283185307179586 * urand()));
}

/* a [rows, cols] f32 tensor (cols < 0: 1-d) holding a copy of src (NULL: zeros) */
static dt_tensor mk(const float *src, int64_t rows, int64_t cols) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = rows;
    if (cols >= 0) d.shape[1] = cols;
    d.ndim = cols >= 0 ? 2 : 1;
    if (dt_tensor_create(&C, &t, &d)) { fprintf(stderr, "create: %s\n", dt_ctx_error(&C)); exit(2); }
    if (src) memcpy(t.data, src, dt_tensor_bytes(&t));
    else memset(t.data, 0, dt_tensor_bytes(&t));
    return t;
}
static dt_tensor mk_targets(const int32_t *src, int64_t rows) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_I32; d.shape[0] = rows; d.ndim = 1;
    if (dt_tensor_create(&C, &t, &d)) { fprintf(stderr, "create: %s\n", dt_ctx_error(&C)); exit(2); }
    memcpy(t.data, src, dt_tensor_bytes(&t));
    return t;
}
static float *F(dt_tensor *t) { return (float *)t->data; }
static void *xmalloc(size_t n) {
    void *p = calloc(n ? n : 1, 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}
static float *fbuf(int64_t n) { return (float *)xmalloc((size_t)n * sizeof(float)); }

/* The error of got against want (double) in units of the float spacing at want. */
static double ulps(float got, double want) {
    float wf = (float)want;
    double spacing = (double)nextafterf(fabsf(wf), INFINITY) - fabsf(wf);
    return fabs((double)got - want) / spacing;
}

/* largest |got - want| / (atol + |want|) over n: the rtol at which allclose(atol, rtol) just passes */
static double worst_rel(const float *got, const double *want, int64_t n, double atol, int64_t *at) {
    double worst = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]) / (atol + fabs(want[i]));
        if (!(e <= worst)) { worst = e; if (at) *at = i; } /* NaN is worst of all */
    }
    return worst;
}

static int check_rel(const char *name, const float *got, const double *want, int64_t n, double atol, double rtol) {
    int64_t at = 0;
    double w = worst_rel(got, want, n, atol, &at);
    printf("info: %s: max |got - want| / (%.0e + |want|) = %.3g (bound %.1g)\n", name, atol, w, rtol);
    if (w <= rtol) return dt_test_pass(name);
    return dt_test_fail(name, "at [%lld]: got %.9g, want %.9g; |diff| / (%.0e + |want|) = %.3g > %.3g", (long long)at,
                        (double)got[at], want[at], atol, w, rtol);
}

/* ---------------------------------------------------------------- exp */

/* dt__v_exp against exp() in double on a grid of [-87.33, 88] (4 million points, ~2^-15 apart)
   and near 0 (where exp's tail and Cody-Waite matter), lane 0 and lane 3 alike. */
static void test_exp(void) {
    double worst = 0, wx = 0;
    int64_t i, n = 4000000;
    float lanes[4], x;
    int special_ok;
    for (i = 0; i <= n; i++) {
        double e;
        x = (float)(-87.33 + (88.0 + 87.33) * (double)i / (double)n);
        if (i % 2) x = (float)ldexp(((double)(i % 1000) - 500.0) / 500.0, -(int)(i % 40)); /* |x| <= 1 */
        dt__v_store(lanes, dt__v_exp(dt__v_set(x)));
        e = ulps(lanes[i & 3], exp((double)x));
        if (e > worst) { worst = e; wx = x; }
    }
    printf("info: exp_within_1ulp_of_double_exp: max error %.3f ulp at x = %.9g\n", worst, wx);
    if (worst <= 1.0) dt_test_pass("exp_within_1ulp_of_double_exp");
    else dt_test_fail("exp_within_1ulp_of_double_exp", "max error %.3f ulp at x = %.9g; want <= 1", worst, wx);

    {   /* flush below ln(FLT_MIN), saturation above 88, NaN stays NaN, exp(0) = 1 exactly */
        float in[4] = {-88.0f, -INFINITY, 0.0f, 100.0f}, out[4], nan_out[4];
        dt__v_store(out, dt__v_exp(dt__v_load(in)));
        dt__v_store(nan_out, dt__v_exp(dt__v_set(NAN)));
        special_ok = out[0] == 0.0f && out[1] == 0.0f && out[2] == 1.0f && isfinite(out[3]) &&
                     fabs(out[3] / exp(88.0) - 1) < 1e-6 && isnan(nan_out[0]);
        if (special_ok) dt_test_pass("exp_flushes_saturates_keeps_nan");
        else dt_test_fail("exp_flushes_saturates_keeps_nan", "exp(-88) %g, exp(-inf) %g, exp(0) %.9g, exp(100) %g "
                          "(want 0, 0, 1, e^88 = %g), exp(NaN) %g", out[0], out[1], out[2], out[3], exp(88.0),
                          nan_out[0]);
    }
}

/* ---------------------------------------------------------------- gelu */

/* 0.5 v (1 + tanh u) loses every digit to cancellation where tanh u nears -1, even in double
   (v < -6): the reference is the same function as v sigmoid(2u), in double. */
static double gelu_ref(double v) { return v / (1.0 + exp(-2.0 * 0.7978845608028654 * (v + 0.044715 * v * v * v))); }
static double gelu_grad_ref(double v) {
    double u = 0.7978845608028654 * (v + 0.044715 * v * v * v), th = tanh(u);
    return 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
}

static void test_gelu(void) {
    int64_t n = 200003, i; /* odd: a tail of 3 */
    float *x = fbuf(n), *y = fbuf(n), *y2 = fbuf(n), *g = fbuf(n), *dx = fbuf(n), *dx2 = fbuf(n), *old = fbuf(n);
    double *want = (double *)xmalloc((size_t)n * sizeof(double));
    dt_tensor xt, yt, gt, dxt;
    for (i = 0; i < n; i++) x[i] = (float)(-12.0 + 24.0 * (double)i / (double)(n - 1)); /* the whole curve */
    fill_normal(g, n, 0.0, 1.0);
    memset(dx2, 0, (size_t)n * sizeof(float));
    xt = mk(x, n, -1); yt = mk(NULL, n, -1); gt = mk(g, n, -1); dxt = mk(dx, n, -1);

    dt_gelu_fwd(&C, &yt, &xt);
    nosimd_gelu_fwd(y2, x, n);
    dt_test_equal_bytes("gelu_fwd_simd_equals_scalar_bitwise", F(&yt), y2, (size_t)n * sizeof(float));
    for (i = 0; i < n; i++) want[i] = gelu_ref(x[i]);
    {   /* relative: 1e-6, plus the rounding of the argument 2u in float (4 roundings: 2e-7 |2u|),
           which the exp turns into a relative error, ~1e-5 at v = -9 where gelu ~ 1e-28; below
           1e-30 anything counts as 0 (past v = -9.3 exp(-2u) saturates at e^88, and gelu gives
           v / e^88 ~ 1e-37 where the true value is smaller still, 1e-61 at v = -12) */
        int64_t bad = 0, at = 0;
        double worst = 0;
        for (i = 0; i < n; i++) {
            double u2 = 2.0 * 0.7978845608028654 * fabs(x[i] + 0.044715 * x[i] * x[i] * x[i]);
            double e = fabs(F(&yt)[i] - want[i]) / ((1e-6 + 2e-7 * u2) * fabs(want[i]) + 1e-30);
            if (!(e <= worst)) { worst = e; at = i; }
            if (!(e <= 1.0)) bad++;
        }
        printf("info: gelu_fwd_matches_double_reference: worst error / bound = %.3g at v = %g\n", worst, x[at]);
        if (!bad) dt_test_pass("gelu_fwd_matches_double_reference");
        else dt_test_fail("gelu_fwd_matches_double_reference", "%lld of %lld off; worst at v = %.9g: got %.9g, want %.9g (%.3g x the bound)",
                          (long long)bad, (long long)n, x[at], F(&yt)[at], want[at], worst);
        check_rel("gelu_fwd_matches_double_reference_v_over_-3", F(&yt) + n * 3 / 8, want + n * 3 / 8, n - n * 3 / 8, 0.0, 1e-6);
    }
    for (i = 0; i < n; i++) { /* the old loop (libm tanhf), for the record */
        float v = x[i];
        old[i] = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
    printf("info: the old loop (tanhf) on the same measure: %.3g (at v > -3 only: %.3g)\n",
           worst_rel(old, want, n, 1e-30, NULL), worst_rel(old + n * 3 / 8, want + n * 3 / 8, n - n * 3 / 8, 1e-30, NULL));

    dt_gelu_bwd(&C, &dxt, &gt, &xt);
    nosimd_gelu_bwd(dx2, g, x, n);
    dt_test_equal_bytes("gelu_bwd_simd_equals_scalar_bitwise", F(&dxt), dx2, (size_t)n * sizeof(float));
    for (i = 0; i < n; i++) want[i] = (double)g[i] * gelu_grad_ref(x[i]);
    /* gelu' ~ 1 has a zero near v = -0.75: relative to 1 + |want| */
    check_rel("gelu_bwd_matches_double_reference", F(&dxt), want, n, 1.0, 1e-6);

    {   /* special values: NaN stays NaN, +inf stays +inf, 0 -> 0, the far tails; in place */
        float sv[7] = {NAN, INFINITY, 0.0f, 30.0f, -30.0f, 1e20f, -1.0f};
        dt_tensor s = mk(sv, 7, -1);
        dt_gelu_fwd(&C, &s, &s);
        if (isnan(F(&s)[0]) && F(&s)[1] == INFINITY && F(&s)[2] == 0.0f && F(&s)[3] == 30.0f &&
            fabsf(F(&s)[4]) < 1e-30f && F(&s)[5] == 1e20f && fabs(F(&s)[6] - gelu_ref(-1.0)) < 1e-7)
            dt_test_pass("gelu_special_values_in_place");
        else dt_test_fail("gelu_special_values_in_place", "gelu(NaN, inf, 0, 30, -30, 1e20, -1) = %g %g %g %g %g %g %.9g; "
                          "want NaN inf 0 30 ~0 1e20 %.9g", F(&s)[0], F(&s)[1], F(&s)[2], F(&s)[3], F(&s)[4], F(&s)[5],
                          F(&s)[6], gelu_ref(-1.0));
        dt_tensor_free(&C, &s);
    }
    {   /* bad inputs keep their named errors */
        dt_tensor a = mk(NULL, 5, -1), b = mk(NULL, 6, -1);
        dt_test_error("gelu_fwd_numel_mismatch_is_named", dt_gelu_fwd(&C, &b, &a), dt_ctx_error(&C), "out");
        dt_test_error("gelu_bwd_dout_mismatch_is_named", dt_gelu_bwd(&C, &a, &b, &a), dt_ctx_error(&C), "dout");
        dt_tensor_free(&C, &a); dt_tensor_free(&C, &b);
    }
    dt_tensor_free(&C, &xt); dt_tensor_free(&C, &yt); dt_tensor_free(&C, &gt); dt_tensor_free(&C, &dxt);
    free(x); free(y); free(y2); free(g); free(dx); free(dx2); free(old); free(want);
}

/* The 8-lane gelu (AVX2) against the 4-lane one (SSE2) and the plain C twin, bit for bit: each
   lane does the same IEEE operations in the same order. Lengths around the vector widths (every
   tail of the 4- and 8-lane loops, and none), values where the arithmetic is awkward: NaN, the
   infinities, +-0, subnormals, the exp's clamps (+-88 in 2u), the float range's ends, and a
   spread of ordinary ones; in place too (out = x), and the backward accumulating into dx. Two
   NaNs of different payloads meeting in one operation (the exp's 2^n bits of a NaN lane) leave
   IEEE 754 free to return either, and a compiler free to commute a commutative intrinsic (Clang
   14 -O2 does: -nan on one path, nan on the other; GCC 12 gives the same bits): so a NaN matches
   any NaN, and every other value bitwise. */
static const float GELU_ODD[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, -1e-45f, 1.1754942e-38f,
                                 -1.1754942e-38f, 3.4028235e38f, -3.4028235e38f, 1e20f, -1e20f, 88.0f, -88.0f,
                                 9.3f, -9.3f, 9.2f, -9.26f, 30.0f, -30.0f, 1e-8f, -1e-8f, 0.75f, -0.75f, 1.0f, -1.0f};

/* want and got equal as bits, or both NaN; the first index where not, or -1 */
static int64_t first_unequal(const float *got, const float *want, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) && !(got[i] != got[i] && want[i] != want[i])) return i;
    return -1;
}

static unsigned bits(float f) { uint32_t u; memcpy(&u, &f, sizeof u); return (unsigned)u; }

/* 1 when got matches want (see first_unequal), else a failure of `name` naming the element */
static int expect_same(const char *name, const float *got, const float *want, int64_t n, const char *what) {
    int64_t at = first_unequal(got, want, n);
    if (at < 0) return 1;
    dt_test_fail(name, "length %lld: %s [%lld] = %.9g (0x%08x), want %.9g (0x%08x)", (long long)n, what, (long long)at,
                 (double)got[at], bits(got[at]), (double)want[at], bits(want[at]));
    return 0;
}

static void test_gelu_avx2(void) {
#ifdef DT__TENSOR_AVX2
    static const int64_t lens[] = {0, 1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 23, 31, 33, 63, 65, 773, 4099};
    const int64_t nl = (int64_t)(sizeof lens / sizeof lens[0]), nodd = (int64_t)(sizeof GELU_ODD / sizeof GELU_ODD[0]);
    int64_t k, i, worst_n = 4099;
    float *x = fbuf(worst_n), *g = fbuf(worst_n), *y4 = fbuf(worst_n), *y8 = fbuf(worst_n), *y1 = fbuf(worst_n);
    float *d4 = fbuf(worst_n), *d8 = fbuf(worst_n), *d1 = fbuf(worst_n), *d0 = fbuf(worst_n);
    int ok = 1;
    const char *name = "gelu_avx2_equals_sse2_and_scalar_bitwise";
    uint64_t rng_saved = rng_state; /* the later tests draw what they drew before this one */
    if (!dt__have_avx2()) {
        dt_test_skip(name, "this CPU has no AVX2 (the 4-lane path runs)");
        free(x); free(g); free(y4); free(y8); free(y1); free(d4); free(d8); free(d1); free(d0);
        return;
    }
    for (k = 0; k < nl; k++) {
        int64_t n = lens[k];
        fill_normal(x, n, 0.0, 4.0);
        fill_normal(g, n, 0.0, 1.0);
        fill_normal(d0, n, 0.0, 1.0);
        for (i = 0; i < n; i++) /* the odd values, spread over the lanes (and the tails) */
            if ((i * 7 + k) % 3 == 0) x[i] = GELU_ODD[(i + k) % nodd];
        for (i = 0; i < n; i += 5) g[i] = GELU_ODD[(i * 3 + k) % nodd] * (i % 2 ? 1.0f : 1e-30f);
        dt__v_gelu_fwd_rows(y4, x, n);
        dt__w_gelu_fwd_rows(y8, x, n);
        nosimd_gelu_fwd(y1, x, n);
        ok &= expect_same(name, y8, y4, n, "fwd avx2 vs sse2");
        ok &= expect_same(name, y8, y1, n, "fwd avx2 vs scalar");
        memcpy(y8, x, (size_t)n * sizeof(float));
        dt__w_gelu_fwd_rows(y8, y8, n); /* in place */
        ok &= expect_same(name, y8, y4, n, "fwd avx2 in place vs sse2");
        memcpy(d4, d0, (size_t)n * sizeof(float)); memcpy(d8, d0, (size_t)n * sizeof(float)); memcpy(d1, d0, (size_t)n * sizeof(float));
        dt__v_gelu_bwd_rows(d4, g, x, n);
        dt__w_gelu_bwd_rows(d8, g, x, n);
        nosimd_gelu_bwd(d1, g, x, n);
        ok &= expect_same(name, d8, d4, n, "bwd avx2 vs sse2");
        ok &= expect_same(name, d8, d1, n, "bwd avx2 vs scalar");
    }
    rng_state = rng_saved;
    if (ok) dt_test_pass(name);
    printf("info: %s: %lld lengths from 0 to %lld, %lld odd values among normal ones\n", name, (long long)nl,
           (long long)worst_n, (long long)nodd);
    free(x); free(g); free(y4); free(y8); free(y1); free(d4); free(d8); free(d1); free(d0);
#else
    dt_test_skip("gelu_avx2_equals_sse2_and_scalar_bitwise", "built without the 8-lane path (not x86-64 with GCC or "
                 "Clang, or DT_TENSOR_NO_SIMD / DT_TENSOR_NO_AVX2)");
#endif
}

/* ---------------------------------------------------------------- layernorm */

static void test_layernorm(void) {
    static const int64_t widths[] = {1, 3, 7, 8, 13, 773};
    int k;
    for (k = 0; k < (int)(sizeof widths / sizeof widths[0]); k++) {
        int64_t Cw = widths[k], R = 37, n = R * Cw, r, c;
        float *x = fbuf(n), *w = fbuf(Cw), *b = fbuf(Cw), *g = fbuf(n);
        float *o2 = fbuf(n), *m2 = fbuf(R), *s2 = fbuf(R), *dx2 = fbuf(n), *dw2 = fbuf(Cw), *db2 = fbuf(Cw);
        double *want = (double *)xmalloc((size_t)n * sizeof(double)), *wdw = (double *)xmalloc((size_t)Cw * sizeof(double));
        double *wdb = (double *)xmalloc((size_t)Cw * sizeof(double));
        dt_tensor xt, wt, bt, ot, mt, st, gt, dxt, dwt, dbt;
        char name[96];
        fill_normal(x, n, 3.0, 2.0); /* an offset mean, as activations have */
        fill_normal(w, Cw, 1.0, 0.3);
        fill_normal(b, Cw, 0.0, 0.5);
        fill_normal(g, n, 0.0, 1.0);
        xt = mk(x, R, Cw); wt = mk(w, Cw, -1); bt = mk(b, Cw, -1); ot = mk(NULL, R, Cw); mt = mk(NULL, R, -1);
        st = mk(NULL, R, -1); gt = mk(g, R, Cw); dxt = mk(NULL, R, Cw); dwt = mk(NULL, Cw, -1); dbt = mk(NULL, Cw, -1);
        dt_layernorm_fwd(&C, &ot, &mt, &st, &xt, &wt, &bt, 1e-5f);
        nosimd_layernorm_fwd(o2, m2, s2, x, w, b, R, Cw, 1e-5f);
        snprintf(name, sizeof name, "layernorm_fwd_simd_equals_scalar_bitwise_C%lld", (long long)Cw);
        if (dt_test_equal_bytes(name, F(&ot), o2, (size_t)n * sizeof(float))) {
            snprintf(name, sizeof name, "layernorm_mean_rstd_simd_equals_scalar_bitwise_C%lld", (long long)Cw);
            DT_TEST_CHECK(name, !memcmp(F(&mt), m2, (size_t)R * 4) && !memcmp(F(&st), s2, (size_t)R * 4));
        }
        /* the reference in double, two passes */
        for (r = 0; r < R; r++) {
            double m = 0, v = 0, s;
            for (c = 0; c < Cw; c++) m += x[r * Cw + c];
            m /= (double)Cw;
            for (c = 0; c < Cw; c++) v += (x[r * Cw + c] - m) * (x[r * Cw + c] - m);
            s = 1.0 / sqrt(v / (double)Cw + 1e-5);
            for (c = 0; c < Cw; c++) want[r * Cw + c] = (x[r * Cw + c] - m) * s * w[c] + b[c];
        }
        /* out ~ N(b, w): an error of the float mean (~1e-7 here) shows in every output, so the
           bound is relative to 1 + |want| */
        snprintf(name, sizeof name, "layernorm_fwd_matches_double_reference_C%lld", (long long)Cw);
        check_rel(name, F(&ot), want, n, 1.0, 1e-6);

        dt_layernorm_bwd(&C, &dxt, &dwt, &dbt, &gt, &xt, &wt, &mt, &st);
        nosimd_layernorm_bwd(dx2, dw2, db2, g, x, w, m2, s2, R, Cw);
        snprintf(name, sizeof name, "layernorm_bwd_simd_equals_scalar_bitwise_C%lld", (long long)Cw);
        DT_TEST_CHECK(name, !memcmp(F(&dxt), dx2, (size_t)n * 4) && !memcmp(F(&dwt), dw2, (size_t)Cw * 4) &&
                                !memcmp(F(&dbt), db2, (size_t)Cw * 4));
        /* the reference in double: dx = s (gw - mean(gw) - nrm mean(gw nrm)), from the double fwd */
        memset(wdw, 0, (size_t)Cw * sizeof(double));
        memset(wdb, 0, (size_t)Cw * sizeof(double));
        for (r = 0; r < R; r++) {
            double m = 0, v = 0, s, gm = 0, gnm = 0;
            for (c = 0; c < Cw; c++) m += x[r * Cw + c];
            m /= (double)Cw;
            for (c = 0; c < Cw; c++) v += (x[r * Cw + c] - m) * (x[r * Cw + c] - m);
            s = 1.0 / sqrt(v / (double)Cw + 1e-5);
            for (c = 0; c < Cw; c++) {
                double nrm = (x[r * Cw + c] - m) * s, gw = (double)g[r * Cw + c] * w[c];
                gm += gw; gnm += gw * nrm;
                wdw[c] += nrm * g[r * Cw + c];
                wdb[c] += g[r * Cw + c];
            }
            gm /= (double)Cw; gnm /= (double)Cw;
            for (c = 0; c < Cw; c++) {
                double nrm = (x[r * Cw + c] - m) * s, gw = (double)g[r * Cw + c] * w[c];
                /* dx is s times a difference of terms ~ |gw| ~ 1: compared divided by s (short
                   rows of close values have s ~ 10) */
                want[r * Cw + c] = gw - gm - nrm * gnm;
                dx2[r * Cw + c] = F(&dxt)[r * Cw + c] / F(&st)[r];
            }
        }
        snprintf(name, sizeof name, "layernorm_bwd_dx_matches_double_reference_C%lld", (long long)Cw);
        check_rel(name, dx2, want, n, 1.0, 1e-6);
        snprintf(name, sizeof name, "layernorm_bwd_dw_db_match_double_reference_C%lld", (long long)Cw);
        {
            /* sums over 37 rows of terms ~ 1: relative to sqrt(37) + |want| */
            double e1 = worst_rel(F(&dwt), wdw, Cw, 6.0, NULL), e2 = worst_rel(F(&dbt), wdb, Cw, 6.0, NULL);
            if (e1 <= 1e-6 && e2 <= 1e-6) dt_test_pass(name);
            else dt_test_fail(name, "dw %.3g, db %.3g; want <= 1e-6 of (6 + |want|)", e1, e2);
        }
        {   /* a row gives the same bits wherever it sits (alone, unaligned): rows can be sharded */
            int64_t rr = R / 2;
            float *buf = fbuf(Cw + 1);
            dt_tensor one, o1, m1, s1;
            memcpy(buf + 1, x + rr * Cw, (size_t)Cw * sizeof(float));
            one = mk(buf + 1, 1, Cw); o1 = mk(NULL, 1, Cw); m1 = mk(NULL, 1, -1); s1 = mk(NULL, 1, -1);
            dt_layernorm_fwd(&C, &o1, &m1, &s1, &one, &wt, &bt, 1e-5f);
            snprintf(name, sizeof name, "layernorm_row_alone_same_bits_C%lld", (long long)Cw);
            DT_TEST_CHECK(name, !memcmp(F(&o1), F(&ot) + rr * Cw, (size_t)Cw * 4) && F(&m1)[0] == F(&mt)[rr]);
            dt_tensor_free(&C, &one); dt_tensor_free(&C, &o1); dt_tensor_free(&C, &m1); dt_tensor_free(&C, &s1);
            free(buf);
        }
        dt_tensor_free(&C, &xt); dt_tensor_free(&C, &wt); dt_tensor_free(&C, &bt); dt_tensor_free(&C, &ot);
        dt_tensor_free(&C, &mt); dt_tensor_free(&C, &st); dt_tensor_free(&C, &gt); dt_tensor_free(&C, &dxt);
        dt_tensor_free(&C, &dwt); dt_tensor_free(&C, &dbt);
        free(x); free(w); free(b); free(g); free(o2); free(m2); free(s2); free(dx2); free(dw2); free(db2);
        free(want); free(wdw); free(wdb);
    }
    {   /* a constant row: variance 0, out = b exactly; in place (out = x) */
        float xv[5] = {7, 7, 7, 7, 7}, wv[5] = {1, 2, 3, 4, 5}, bv[5] = {0.5f, -1, 2, 0, 3};
        dt_tensor x = mk(xv, 1, 5), w = mk(wv, 5, -1), b = mk(bv, 5, -1), m = mk(NULL, 1, -1), s = mk(NULL, 1, -1);
        dt_layernorm_fwd(&C, &x, &m, &s, &x, &w, &b, 1e-5f);
        if (!memcmp(F(&x), bv, sizeof bv) && F(&m)[0] == 7.0f) dt_test_pass("layernorm_constant_row_in_place_gives_b");
        else dt_test_fail("layernorm_constant_row_in_place_gives_b", "out %g %g %g %g %g, mean %g; want %g %g %g %g %g, 7",
                          F(&x)[0], F(&x)[1], F(&x)[2], F(&x)[3], F(&x)[4], F(&m)[0], bv[0], bv[1], bv[2], bv[3], bv[4]);
        dt_test_error("layernorm_eps_nan_is_named", dt_layernorm_fwd(&C, &x, &m, &s, &x, &w, &b, NAN), dt_ctx_error(&C),
                      "eps = nan");
        dt_tensor_free(&C, &w);
        w = mk(wv, 4, -1);
        dt_test_error("layernorm_w_numel_mismatch_is_named", dt_layernorm_fwd(&C, &x, &m, &s, &x, &w, &b, 1e-5f),
                      dt_ctx_error(&C), "w numel");
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &b); dt_tensor_free(&C, &m);
        dt_tensor_free(&C, &s);
    }
}

/* ---------------------------------------------------------------- softmax_xent */

static void test_softmax_xent(void) {
    static const int64_t widths[] = {1, 3, 7, 8, 13, 773};
    int k;
    for (k = 0; k < (int)(sizeof widths / sizeof widths[0]); k++) {
        int64_t V = widths[k], R = 29, n = R * V, r, v, nv = 0;
        float *z = fbuf(n), *p2 = fbuf(n), *g2 = fbuf(n), loss, loss2;
        double *want = (double *)xmalloc((size_t)n * sizeof(double)), wloss = 0;
        int32_t *t = (int32_t *)xmalloc((size_t)R * sizeof(int32_t));
        dt_tensor zt, pt, tt, gt;
        char name[96];
        fill_normal(z, n, 1.0, 3.0);
        for (r = 0; r < R; r++) t[r] = r % 5 == 2 ? -100 : (int32_t)((r * 7) % V); /* some rows ignored */
        zt = mk(z, R, V); pt = mk(NULL, R, V); tt = mk_targets(t, R); gt = mk(NULL, R, V);
        for (v = 0; v < n; v++) F(&gt)[v] = g2[v] = 0.125f;
        dt_softmax_xent_fwd(&C, &loss, NULL, &pt, &zt, &tt, -100);
        nosimd_softmax_xent_fwd(&loss2, p2, z, t, R, V, -100);
        snprintf(name, sizeof name, "softmax_xent_fwd_simd_equals_scalar_bitwise_V%lld", (long long)V);
        DT_TEST_CHECK(name, !memcmp(F(&pt), p2, (size_t)n * 4) && !memcmp(&loss, &loss2, 4));
        for (r = 0; r < R; r++) { /* the reference in double */
            double mx = -INFINITY, sum = 0;
            for (v = 0; v < V; v++) if (z[r * V + v] > mx) mx = z[r * V + v];
            for (v = 0; v < V; v++) sum += exp(z[r * V + v] - mx);
            for (v = 0; v < V; v++) want[r * V + v] = exp(z[r * V + v] - mx) / sum;
            if (t[r] != -100) { wloss += log(sum) + mx - z[r * V + t[r]]; nv++; }
        }
        wloss /= (double)nv;
        /* relative: exp's 1 ulp, 1/sum's, and z - max rounded in float (as the old loop did),
           which is 6e-8 |z - max|, ~1e-6 for the logits here (std 3) */
        snprintf(name, sizeof name, "softmax_probs_match_double_reference_V%lld", (long long)V);
        check_rel(name, F(&pt), want, n, 1e-30, 2e-6);
        for (r = 0; r < R; r++) { /* the old loop: libm expf, sums in double, for the record */
            float mx = -FLT_MAX;
            double sum = 0;
            for (v = 0; v < V; v++) if (z[r * V + v] > mx) mx = z[r * V + v];
            for (v = 0; v < V; v++) { p2[r * V + v] = expf(z[r * V + v] - mx); sum += p2[r * V + v]; }
            for (v = 0; v < V; v++) p2[r * V + v] = (float)(p2[r * V + v] / sum);
        }
        printf("info: the old loop (expf, double sums) on the same measure: %.3g\n", worst_rel(p2, want, n, 1e-30, NULL));
        nosimd_softmax_xent_fwd(&loss2, p2, z, t, R, V, -100);
        snprintf(name, sizeof name, "softmax_xent_loss_matches_double_reference_V%lld", (long long)V);
        dt_test_close(name, loss, wloss, 1e-6 * fabs(wloss) + 1e-7);

        dt_softmax_xent_bwd(&C, &gt, &pt, &tt, -100, 2.0f);
        nosimd_softmax_xent_bwd(g2, p2, t, R, V, -100, 2.0f);
        snprintf(name, sizeof name, "softmax_xent_bwd_simd_equals_scalar_bitwise_V%lld", (long long)V);
        dt_test_equal_bytes(name, F(&gt), g2, (size_t)n * 4);
        for (r = 0; r < R; r++)
            for (v = 0; v < V; v++)
                want[r * V + v] = 0.125 + (t[r] == -100 ? 0.0 : 2.0 / (double)nv * (want[r * V + v] - (v == t[r])));
        snprintf(name, sizeof name, "softmax_xent_bwd_matches_double_reference_V%lld", (long long)V);
        check_rel(name, F(&gt), want, n, 1e-7, 1e-6);
        dt_tensor_free(&C, &zt); dt_tensor_free(&C, &pt); dt_tensor_free(&C, &tt); dt_tensor_free(&C, &gt);
        free(z); free(p2); free(g2); free(want); free(t);
    }
    {   /* -inf logits get probability 0 exactly; huge logits stay finite; probs may be the logits */
        float zv[8] = {-INFINITY, 0.0f, 1.0f, -INFINITY, 1e30f, 1e30f, -1e30f, 0.0f}, loss, want;
        int32_t tv[2] = {2, 0};
        dt_tensor z = mk(zv, 2, 4), p = mk(NULL, 2, 4), t = mk_targets(tv, 2);
        dt_softmax_xent_fwd(&C, &loss, NULL, &p, &z, &t, -1);
        want = (float)((log(1.0 + exp(1.0)) - 1.0 + log(2.0)) / 2.0);
        if (F(&p)[0] == 0.0f && F(&p)[3] == 0.0f && F(&p)[4] == 0.5f && F(&p)[5] == 0.5f && F(&p)[6] == 0.0f &&
            F(&p)[7] == 0.0f && fabsf(loss - want) < 1e-6f)
            dt_test_pass("softmax_minus_inf_and_huge_logits");
        else dt_test_fail("softmax_minus_inf_and_huge_logits", "probs %g %g %g %g / %g %g %g %g, loss %.9g; want 0 . . 0 / "
                          "0.5 0.5 0 0, loss %.9g", F(&p)[0], F(&p)[1], F(&p)[2], F(&p)[3], F(&p)[4], F(&p)[5],
                          F(&p)[6], F(&p)[7], loss, want);
        dt_softmax_xent_fwd(&C, &loss, NULL, &z, &z, &t, -1); /* in place: the target logit is read first */
        if (!memcmp(F(&z), F(&p), sizeof zv) && fabsf(loss - want) < 1e-6f) dt_test_pass("softmax_xent_in_place_same_probs_and_loss");
        else dt_test_fail("softmax_xent_in_place_same_probs_and_loss", "loss %.9g, want %.9g; probs same: %d", loss, want,
                          !memcmp(F(&z), F(&p), sizeof zv));
        tv[1] = -5;
        dt_tensor_free(&C, &t);
        t = mk_targets(tv, 2);
        dt_test_error("softmax_xent_negative_target_is_named", dt_softmax_xent_fwd(&C, &loss, NULL, &p, &z, &t, -1),
                      dt_ctx_error(&C), "targets[1] = -5");
        dt_test_error("softmax_xent_targets_f32_is_named", dt_softmax_xent_fwd(&C, &loss, NULL, &p, &z, &p, -1),
                      dt_ctx_error(&C), "targets");
        dt_tensor_free(&C, &z); dt_tensor_free(&C, &p); dt_tensor_free(&C, &t);
    }
}

int main(void) {
    dt_ctx_init(&C, NULL);
    printf("info: this copy runs %s; the DT_TENSOR_NO_SIMD copy %s\n",
#ifdef DT__TENSOR_SSE2
           "SSE2",
#else
           "the plain C twin too (no SSE2, or DT_TENSOR_NO_SIMD for both)",
#endif
           nosimd_has_sse2() ? "uses SSE2 (wrong)" : "is plain C");
    DT_TEST_CHECK("nosimd_copy_is_plain_c", !nosimd_has_sse2());
    test_exp();
    test_gelu();
    test_gelu_avx2();
    test_layernorm();
    test_softmax_xent();
    nosimd_shutdown();
    DT_TEST_CHECK("all_bytes_returned", C.bytes_in_use == 0);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
