// with: tests/tensor_attn_portable.c
/* tests/test_tensor_attn.c - attention on GEMMs (dt__gemm per batch and head on strided views of
   qkv, the softmax on dt__v_exp), bias_add_bwd on whole rows and bias_add_fwd in 8-blocks, against:
   (1) the scalar loops they replaced (copied below, as they were up to commit 3dbc65d): within
       stated bounds, since the sums run in another order and exp is dt__v_exp (<= 1 ulp);
   (2) the same ops on dt's portable GEMM (tests/tensor_attn_portable.c, built without DT_CBLAS);
   (3) central finite differences of a scalar loss, in double around the float op;
   (4) themselves: bits that do not change run to run or with OpenBLAS's thread count, masked
       entries that are exactly 0, gradients that accumulate, bad inputs that are named.
   Shapes put T below, on and across the 64-row blocks (1, 7, 13, 64, 65, 150) and head sizes of
   1, 3, 8, 16, so that every tail of the 8-lane loops and of the blocks runs. */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_test.h"
#include "tensor_attn_portable.h"

#ifdef DT_CBLAS
void openblas_set_num_threads(int n);
#endif

static dt_ctx C;

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static double urand(void) { /* xorshift64*: uniform in (0, 1) */
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return ((double)((rng_state * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static void fill_uniform(float *a, int64_t n, double lo, double hi) {
    int64_t i;
    for (i = 0; i < n; i++) a[i] = (float)(lo + (hi - lo) * urand());
}

static dt_tensor mk(int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3, const float *src) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.ndim = ndim;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2; d.shape[3] = d3;
    if (dt_tensor_create(&C, &t, &d)) { fprintf(stderr, "create: %s\n", dt_ctx_error(&C)); exit(2); }
    if (src) memcpy(t.data, src, dt_tensor_bytes(&t));
    else memset(t.data, 0, dt_tensor_bytes(&t));
    return t;
}
static float *F(dt_tensor *t) { return (float *)t->data; }
static float *fbuf(int64_t n) {
    float *p = (float *)calloc((size_t)(n ? n : 1), sizeof(float));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}
static void fill_nan(float *a, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) a[i] = NAN;
}

/* ---------------------------------------------------------------- the old scalar loops (reference) */

static void old_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C_, int n_head) {
    int64_t hs = C_ / n_head, b, t, t2, i;
    int h;
    float scale = hs ? 1.0f / sqrtf((float)hs) : 0.0f;
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < n_head; h++) {
                const float *q = qkv + (b * T + t) * 3 * C_ + h * hs;
                float *a = att + ((b * n_head + h) * T + t) * T;
                float *o = out + (b * T + t) * C_ + h * hs;
                float mx = -FLT_MAX, sum = 0;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (b * T + t2) * 3 * C_ + C_ + h * hs;
                    float d = 0;
                    for (i = 0; i < hs; i++) d += q[i] * k[i];
                    a[t2] = d * scale;
                    if (a[t2] > mx) mx = a[t2];
                }
                for (t2 = 0; t2 <= t; t2++) { a[t2] = expf(a[t2] - mx); sum += a[t2]; }
                for (t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
                for (i = 0; i < hs; i++) o[i] = 0;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (b * T + t2) * 3 * C_ + 2 * C_ + h * hs;
                    for (i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
}

static void old_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int64_t B,
                              int64_t T, int64_t C_, int n_head) {
    int64_t hs = C_ / n_head, b, t, t2, i;
    int h;
    float scale = hs ? 1.0f / sqrtf((float)hs) : 0.0f, *datt = fbuf(T);
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++)
            for (h = 0; h < n_head; h++) {
                const float *a = att + ((b * n_head + h) * T + t) * T;
                const float *g = dout + (b * T + t) * C_ + h * hs;
                const float *q = qkv + (b * T + t) * 3 * C_ + h * hs;
                float *dq = dqkv + (b * T + t) * 3 * C_ + h * hs;
                float dot = 0;
                for (t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + (b * T + t2) * 3 * C_ + 2 * C_ + h * hs;
                    float *dv = dqkv + (b * T + t2) * 3 * C_ + 2 * C_ + h * hs;
                    float d = 0;
                    for (i = 0; i < hs; i++) { d += v[i] * g[i]; dv[i] += a[t2] * g[i]; }
                    datt[t2] = d;
                    dot += a[t2] * d;
                }
                for (t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + (b * T + t2) * 3 * C_ + C_ + h * hs;
                    float *dk = dqkv + (b * T + t2) * 3 * C_ + C_ + h * hs;
                    float dpre = a[t2] * (datt[t2] - dot) * scale;
                    for (i = 0; i < hs; i++) { dq[i] += dpre * k[i]; dk[i] += dpre * q[i]; }
                }
            }
    free(datt);
}

/* ---------------------------------------------------------------- helpers */

/* max |got - want| / (max |want| over the tensor): the error of a result whose elements are sums
   of terms of either sign, measured against the tensor's scale (an element near 0 has no useful
   relative error) */
static double normwise(const float *got, const float *want, int64_t n) {
    double m = 0, d = 0;
    int64_t i;
    for (i = 0; i < n; i++) {
        if (fabs(want[i]) > m) m = fabs(want[i]);
        if (fabs((double)got[i] - want[i]) > d || got[i] != got[i]) d = got[i] != got[i] ? INFINITY : fabs((double)got[i] - want[i]);
    }
    return m > 0 ? d / m : d;
}

typedef struct shape { int64_t B, T, C; int H; } shape;

/* Runs dt's fwd and bwd on one random problem: outputs (NaN-filled before, so every entry must be
   written) and dqkv (from zero) into the buffers given. */
static int run_dt(const shape *s, const float *qkv, const float *dout, float *out, float *att, float *dqkv) {
    dt_tensor x = mk(3, s->B, s->T, 3 * s->C, 0, qkv), o = mk(3, s->B, s->T, s->C, 0, NULL);
    dt_tensor a = mk(4, s->B, s->H, s->T, s->T, NULL), g = mk(3, s->B, s->T, s->C, 0, dout);
    dt_tensor d = mk(3, s->B, s->T, 3 * s->C, 0, NULL);
    int st;
    fill_nan(F(&o), o.numel); fill_nan(F(&a), a.numel);
    st = dt_attention_fwd(&C, &o, &a, &x, s->H);
    if (!st) st = dt_attention_bwd(&C, &d, &g, &x, &a, s->H);
    memcpy(out, o.data, dt_tensor_bytes(&o)); memcpy(att, a.data, dt_tensor_bytes(&a));
    memcpy(dqkv, d.data, dt_tensor_bytes(&d));
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &a); dt_tensor_free(&C, &g);
    dt_tensor_free(&C, &d);
    if (st) fprintf(stderr, "attention: %s\n", dt_ctx_error(&C));
    return st;
}

/* The bounds (normwise, see above) against the scalar loops: out and dqkv are sums of up to T
   (or hs) products in another order, att differs by exp's ulp and a multiply by 1/sum for the
   divide. Measured worst over these shapes, seeds fixed: printed as info lines. */
#define ATT_TOL 1e-6
#define OUT_TOL 1e-6
#define DQKV_TOL 2e-6

static void test_matches_old(void) {
    static const shape shapes[] = {
        {2, 1, 8, 2}, {1, 7, 24, 3}, {2, 13, 32, 4}, {1, 64, 32, 2}, {1, 65, 48, 3}, {2, 150, 64, 4}, {1, 9, 3, 3},
        {1, 300, 16, 1},
    };
    int si, ns = (int)(sizeof shapes / sizeof shapes[0]);
    double worst[3] = {0, 0, 0}, worst_p = 0;
    int ok = 1, masked_ok = 1, rows_ok = 1, port_ok = 1;
    char msg[256] = "";
    for (si = 0; si < ns; si++) {
        const shape *s = &shapes[si];
        int64_t nq = s->B * s->T * 3 * s->C, no = s->B * s->T * s->C, na = s->B * s->H * s->T * s->T, b, h, t, j;
        float *qkv = fbuf(nq), *dout = fbuf(no), *out = fbuf(no), *att = fbuf(na), *dq = fbuf(nq);
        float *ro = fbuf(no), *ra = fbuf(na), *rd = fbuf(nq), *po = fbuf(no), *pa = fbuf(na), *pd = fbuf(nq);
        double e[3];
        fill_uniform(qkv, nq, -2, 2); fill_uniform(dout, no, -1, 1);
        if (run_dt(s, qkv, dout, out, att, dq)) { ok = 0; break; }
        old_attention_fwd(ro, ra, qkv, s->B, s->T, s->C, s->H);
        old_attention_bwd(rd, dout, qkv, ra, s->B, s->T, s->C, s->H);
        e[0] = normwise(att, ra, na); e[1] = normwise(out, ro, no); e[2] = normwise(dq, rd, nq);
        for (j = 0; j < 3; j++) if (e[j] > worst[j]) worst[j] = e[j];
        if ((e[0] > ATT_TOL || e[1] > OUT_TOL || e[2] > DQKV_TOL) && ok) {
            ok = 0;
            snprintf(msg, sizeof msg, "B%lld T%lld C%lld H%d: att %.3g (tol %g), out %.3g (tol %g), dqkv %.3g (tol %g)",
                     (long long)s->B, (long long)s->T, (long long)s->C, s->H, e[0], ATT_TOL, e[1], OUT_TOL, e[2], DQKV_TOL);
        }
        for (b = 0; b < s->B; b++) /* masked: exactly +0; each row sums to 1 */
            for (h = 0; h < s->H; h++)
                for (t = 0; t < s->T; t++) {
                    const float *r = att + ((b * s->H + h) * s->T + t) * s->T;
                    double sum = 0;
                    for (j = 0; j < s->T; j++) {
                        if (j > t && (r[j] != 0.0f || signbit(r[j]))) masked_ok = 0;
                        sum += r[j];
                    }
                    if (fabs(sum - 1.0) > 1e-5 * (t + 1)) rows_ok = 0;
                }
        /* the portable GEMM: the same algorithm, another sum order inside the GEMMs */
        if (portable_attention_fwd(po, pa, qkv, s->B, s->T, s->C, s->H) ||
            portable_attention_bwd(pd, dout, qkv, pa, s->B, s->T, s->C, s->H))
            port_ok = 0;
        e[0] = normwise(pa, att, na); e[1] = normwise(po, out, no); e[2] = normwise(pd, dq, nq);
        if (e[0] > ATT_TOL || e[1] > OUT_TOL || e[2] > DQKV_TOL) port_ok = 0;
        for (j = 0; j < 3; j++) if (e[j] > worst_p) worst_p = e[j];
        free(qkv); free(dout); free(out); free(att); free(dq); free(ro); free(ra); free(rd); free(po); free(pa); free(pd);
    }
    printf("info: attention vs the old scalar loops, worst normwise error: att %.3g, out %.3g, dqkv %.3g\n",
           worst[0], worst[1], worst[2]);
    printf("info: attention on OpenBLAS vs on the portable GEMM, worst normwise difference %.3g\n", worst_p);
    if (ok) dt_test_pass("attention_gemm_matches_old_scalar_loops");
    else dt_test_fail("attention_gemm_matches_old_scalar_loops", "%s", msg);
    DT_TEST_CHECK("attention_masked_entries_are_exact_zeros", masked_ok);
    DT_TEST_CHECK("attention_rows_sum_to_one", rows_ok);
    if (port_ok) dt_test_pass("attention_portable_gemm_matches_cblas");
    else dt_test_fail("attention_portable_gemm_matches_cblas", "worst normwise difference %.3g (tols %g %g %g)", worst_p,
                      ATT_TOL, OUT_TOL, DQKV_TOL);
}

/* Same bits on a second run, and with OpenBLAS on 2 threads instead of 1. */
static void test_deterministic(void) {
    shape s = {2, 150, 64, 4};
    int64_t nq = s.B * s.T * 3 * s.C, no = s.B * s.T * s.C, na = s.B * s.H * s.T * s.T;
    float *qkv = fbuf(nq), *dout = fbuf(no), *o1 = fbuf(no), *a1 = fbuf(na), *d1 = fbuf(nq);
    float *o2 = fbuf(no), *a2 = fbuf(na), *d2 = fbuf(nq);
    fill_uniform(qkv, nq, -2, 2); fill_uniform(dout, no, -1, 1);
#ifdef DT_CBLAS
    openblas_set_num_threads(1);
#endif
    run_dt(&s, qkv, dout, o1, a1, d1);
    run_dt(&s, qkv, dout, o2, a2, d2);
    dt_test_equal_bytes("attention_same_bits_run_to_run",  d2, d1, (size_t)nq * sizeof(float));
#ifdef DT_CBLAS
    openblas_set_num_threads(2);
    run_dt(&s, qkv, dout, o2, a2, d2);
    openblas_set_num_threads(1);
    DT_TEST_CHECK("attention_same_bits_with_2_blas_threads",
                  !memcmp(o1, o2, (size_t)no * 4) && !memcmp(a1, a2, (size_t)na * 4) && !memcmp(d1, d2, (size_t)nq * 4));
#endif
    free(qkv); free(dout); free(o1); free(a1); free(d1); free(o2); free(a2); free(d2);
}

/* L = sum(out * w): dL/dqkv by the backward against central differences of L in double. */
static void test_finite_differences(void) {
    shape s = {1, 70, 12, 3};
    int64_t nq = s.B * s.T * 3 * s.C, no = s.B * s.T * s.C, na = s.B * s.H * s.T * s.T, i, k;
    float *qkv = fbuf(nq), *w = fbuf(no), *out = fbuf(no), *att = fbuf(na), *dq = fbuf(nq);
    double worst = 0, eps = 1e-2;
    int bad = 0;
    fill_uniform(qkv, nq, -1, 1); fill_uniform(w, no, -1, 1);
    run_dt(&s, qkv, w, out, att, dq);
    for (k = 0; k < 60; k++) {
        int64_t idx = (int64_t)(urand() * (double)nq);
        float keep = qkv[idx];
        double lp = 0, lm = 0, fd, tol;
        float *dummy = fbuf(nq);
        if (k < 6) idx = (k % 3) * s.C + (k / 3) * (s.T - 1) * 3 * s.C; /* q, k, v of the first and last token */
        keep = qkv[idx];
        qkv[idx] = keep + (float)eps;
        run_dt(&s, qkv, w, out, att, dummy);
        for (i = 0; i < no; i++) lp += (double)out[i] * w[i];
        qkv[idx] = keep - (float)eps;
        run_dt(&s, qkv, w, out, att, dummy);
        for (i = 0; i < no; i++) lm += (double)out[i] * w[i];
        qkv[idx] = keep;
        fd = (lp - lm) / (2 * eps);
        tol = 5e-4 + 1e-3 * fabs(fd); /* eps^2 curvature and float rounding of L */
        if (fabs(fd - dq[idx]) > worst) worst = fabs(fd - dq[idx]);
        if (fabs(fd - dq[idx]) > tol && !bad++)
            dt_test_fail("attention_bwd_matches_finite_differences", "dqkv[%lld]: backward %.6g, differences %.6g",
                         (long long)idx, (double)dq[idx], fd);
        free(dummy);
    }
    printf("info: attention backward vs central differences (eps %g), worst |diff| %.3g\n", eps, worst);
    if (!bad) dt_test_pass("attention_bwd_matches_finite_differences");
    free(qkv); free(w); free(out); free(att); free(dq);
}

/* dqkv += : a second backward into the first's result gives twice it. */
static void test_accumulates(void) {
    shape s = {1, 80, 16, 2};
    int64_t nq = s.B * s.T * 3 * s.C, no = s.B * s.T * s.C, na = s.B * s.H * s.T * s.T, i;
    float *qkv = fbuf(nq), *dout = fbuf(no), *out = fbuf(no), *att = fbuf(na), *d1 = fbuf(nq), *want = fbuf(nq);
    dt_tensor x, a, g, d;
    fill_uniform(qkv, nq, -2, 2); fill_uniform(dout, no, -1, 1);
    run_dt(&s, qkv, dout, out, att, d1);
    for (i = 0; i < nq; i++) want[i] = 2 * d1[i];
    x = mk(3, s.B, s.T, 3 * s.C, 0, qkv); a = mk(4, s.B, s.H, s.T, s.T, att); g = mk(3, s.B, s.T, s.C, 0, dout);
    d = mk(3, s.B, s.T, 3 * s.C, 0, d1);
    dt_attention_bwd(&C, &d, &g, &x, &a, s.H);
    dt_test_allclose("attention_bwd_accumulates_into_dqkv", F(&d), want, (size_t)nq, 1e-6, 1e-5);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &a); dt_tensor_free(&C, &g); dt_tensor_free(&C, &d);
    free(qkv); free(dout); free(out); free(att); free(d1); free(want);
}

/* Scores far apart (|q.k| ~ 1e3): no overflow, probabilities still sum to 1, no NaN. */
static void test_large_scores(void) {
    shape s = {1, 20, 8, 1};
    int64_t nq = s.B * s.T * 3 * s.C, no = s.B * s.T * s.C, na = s.T * s.T, i;
    float *qkv = fbuf(nq), *dout = fbuf(no), *out = fbuf(no), *att = fbuf(na), *dq = fbuf(nq);
    float *ro = fbuf(no), *ra = fbuf(na);
    int finite = 1;
    fill_uniform(qkv, nq, -30, 30); fill_uniform(dout, no, -1, 1);
    run_dt(&s, qkv, dout, out, att, dq);
    old_attention_fwd(ro, ra, qkv, s.B, s.T, s.C, s.H);
    for (i = 0; i < nq; i++) finite &= isfinite(dq[i]) != 0;
    for (i = 0; i < no; i++) finite &= isfinite(out[i]) != 0;
    DT_TEST_CHECK("attention_large_scores_stay_finite", finite);
    dt_test_allclose("attention_large_scores_match_old", att, ra, (size_t)na, 1e-5, 1e-4);
    free(qkv); free(dout); free(out); free(att); free(dq); free(ro); free(ra);
}

/* Empty shapes and C = 0 (no features: uniform attention over the past, out has no columns). */
static void test_edges(void) {
    dt_tensor x = mk(3, 1, 5, 0, 0, NULL), o = mk(3, 1, 5, 0, 0, NULL), a = mk(4, 1, 1, 5, 5, NULL);
    dt_tensor d = mk(3, 1, 5, 0, 0, NULL);
    float ra[25], ro[1];
    int st;
    old_attention_fwd(ro, ra, NULL, 1, 5, 0, 1);
    st = dt_attention_fwd(&C, &o, &a, &x, 1);
    DT_TEST_CHECK("attention_c0_ok", st == DT_OK);
    dt_test_allclose("attention_c0_is_uniform_over_the_past", F(&a), ra, 25, 1e-7, 1e-6);
    DT_TEST_CHECK("attention_c0_bwd_ok", dt_attention_bwd(&C, &d, &o, &x, &a, 1) == DT_OK);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &a); dt_tensor_free(&C, &d);
    x = mk(3, 2, 0, 24, 0, NULL); o = mk(3, 2, 0, 8, 0, NULL); a = mk(4, 2, 2, 0, 0, NULL); d = mk(3, 2, 0, 24, 0, NULL);
    st = dt_attention_fwd(&C, &o, &a, &x, 2);
    if (!st) st = dt_attention_bwd(&C, &d, &o, &x, &a, 2);
    DT_TEST_CHECK("attention_t0_is_ok", st == DT_OK);
    DT_TEST_CHECK("attention_null_dqkv_is_skipped", dt_attention_bwd(&C, NULL, &o, &x, &a, 2) == DT_OK);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &a); dt_tensor_free(&C, &d);
}

static void test_bad_inputs(void) {
    dt_tensor x = mk(3, 2, 6, 24, 0, NULL), o = mk(3, 2, 6, 8, 0, NULL), a = mk(4, 2, 2, 6, 6, NULL);
    dt_tensor a5 = mk(4, 2, 2, 6, 5, NULL), x25 = mk(3, 2, 6, 25, 0, NULL), d = mk(3, 2, 6, 23, 0, NULL);
    dt_tensor o7 = mk(3, 2, 7, 8, 0, NULL);
    dt_test_error("attention_att_shape_is_named", dt_attention_fwd(&C, &o, &a5, &x, 2), dt_ctx_error(&C),
                  "att shape [2, 2, 6, 5]; expected [2, 2, 6, 6]");
    dt_test_error("attention_qkv_not_3c_is_named", dt_attention_fwd(&C, &o, &a, &x25, 2), dt_ctx_error(&C),
                  "qkv.shape[2] = 25 is not 3*C");
    dt_test_error("attention_zero_heads_is_named", dt_attention_fwd(&C, &o, &a, &x, 0), dt_ctx_error(&C),
                  "n_head = 0 must be > 0 and divide C = 8");
    dt_test_error("attention_out_shape_is_named", dt_attention_fwd(&C, &o7, &a, &x, 2), dt_ctx_error(&C),
                  "out shape [2, 7, 8]; expected [2, 6, 8]");
    dt_test_error("attention_bwd_dqkv_shape_is_named", dt_attention_bwd(&C, &d, &o, &x, &a, 2), dt_ctx_error(&C),
                  "dqkv");
    dt_test_error("attention_bwd_att_shape_is_named", dt_attention_bwd(&C, &x25, &o, &x, &a5, 2), dt_ctx_error(&C),
                  "att shape");
    dt_test_error("attention_bwd_dqkv_is_qkv_is_named", dt_attention_bwd(&C, &x, &o, &x, &a, 2), dt_ctx_error(&C),
                  "dt_attention_bwd: dqkv shares memory with qkv");
    DT_TEST_CHECK("attention_null_ctx_is_arg", dt_attention_fwd(NULL, &o, &a, &x, 2) == DT_ERR_ARG);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &a); dt_tensor_free(&C, &a5);
    dt_tensor_free(&C, &x25); dt_tensor_free(&C, &d); dt_tensor_free(&C, &o7);
}

/* ---------------------------------------------------------------- bias_add */

/* The old loop: each column summed down the rows in double. The new one keeps that order per
   column, so the bits must be the same; dbias accumulates. */
static void test_bias_bwd(void) {
    static const int64_t dims[][2] = {{37, 1}, {37, 7}, {5, 8}, {300, 513}, {9, 1030}, {0, 12}, {1, 3}};
    int di, nd = (int)(sizeof dims / sizeof dims[0]), same = 1, acc_ok = 1, fwd_ok = 1;
    for (di = 0; di < nd; di++) {
        int64_t R = dims[di][0], Cn = dims[di][1], r, c;
        float *g = fbuf(R * Cn), *want = fbuf(Cn), *init = fbuf(Cn);
        dt_tensor gt, bt;
        fill_uniform(g, R * Cn, -3, 3); fill_uniform(init, Cn, -1, 1);
        for (c = 0; c < Cn; c++) {
            double s = 0;
            for (r = 0; r < R; r++) s += g[r * Cn + c];
            want[c] = (float)s;
        }
        gt = mk(2, R, Cn, 0, 0, g); bt = mk(1, Cn, 0, 0, 0, NULL);
        dt_bias_add_bwd(&C, &bt, &gt);
        if (memcmp(bt.data, want, (size_t)Cn * 4)) {
            if (same) fprintf(stderr, "bias_add_bwd R %lld C %lld: [0] got %.9g want %.9g\n", (long long)R, (long long)Cn,
                              (double)F(&bt)[0], (double)want[0]);
            same = 0;
        }
        memcpy(bt.data, init, (size_t)Cn * 4);
        dt_bias_add_bwd(&C, &bt, &gt);
        for (c = 0; c < Cn; c++) acc_ok &= F(&bt)[c] == init[c] + want[c];
        dt_tensor_free(&C, &gt); dt_tensor_free(&C, &bt);
        free(g); free(want); free(init);
    }
    for (di = 0; di < nd; di++) { /* fwd: one add per element, so exact; every tail of the 8-blocks */
        int64_t R = dims[di][0], Cn = dims[di][1], i;
        float *x = fbuf(R * Cn), *bias = fbuf(Cn);
        dt_tensor ot, bt;
        fill_uniform(x, R * Cn, -3, 3); fill_uniform(bias, Cn, -1, 1);
        ot = mk(2, R, Cn, 0, 0, x); bt = mk(1, Cn, 0, 0, 0, bias);
        dt_bias_add_fwd(&C, &ot, &bt);
        for (i = 0; i < R * Cn; i++) fwd_ok &= F(&ot)[i] == x[i] + bias[i % Cn];
        dt_tensor_free(&C, &ot); dt_tensor_free(&C, &bt);
        free(x); free(bias);
    }
    DT_TEST_CHECK("bias_add_fwd_adds_bias_to_every_row", fwd_ok);
    DT_TEST_CHECK("bias_add_bwd_same_bits_as_column_walk", same);
    DT_TEST_CHECK("bias_add_bwd_accumulates", acc_ok);
    {
        dt_tensor gt = mk(2, 4, 6, 0, 0, NULL), bt = mk(1, 5, 0, 0, 0, NULL);
        dt_test_error("bias_add_bwd_wrong_numel_is_named", dt_bias_add_bwd(&C, &bt, &gt), dt_ctx_error(&C), "dbias numel");
        DT_TEST_CHECK("bias_add_bwd_null_dbias_is_skipped", dt_bias_add_bwd(&C, NULL, &gt) == DT_OK);
        dt_tensor_free(&C, &gt); dt_tensor_free(&C, &bt);
    }
}

int main(void) {
    if (dt_ctx_init(&C, NULL)) return 2;
    test_matches_old();
    test_deterministic();
    test_finite_differences();
    test_accumulates();
    test_large_scores();
    test_edges();
    test_bad_inputs();
    test_bias_bwd();
    portable_shutdown();
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
