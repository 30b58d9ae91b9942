/* tests/test_bf16_acts.c - bf16 activations on the CPU: the ops that make a GEMM's input
   (dt_layernorm_fwd, dt_gelu_fwd, dt_linear_fwd, dt_linear_gelu_fwd) write it in bf16 when given a
   bf16 out, and the ops that read one (dt_linear_fwd / _bwd with a bf16 w, dt_gelu_bwd) take it as
   it is. What each must equal:
   - layernorm, gelu: the f32 op's result rounded once to bf16, bit for bit (the same f32 values,
     then one rounding to nearest even); gelu_bwd from a bf16 x: the f32 op on that x's values, bit
     for bit;
   - a linear reading a bf16 x: the same op on an f32 x holding the same values, bit for bit (a
     bf16 w rounds x to bf16 on its way in: the same operands, the same GEMM);
   - a linear writing a bf16 out (and pre): a double sum of the bf16 operands plus the bias rounded
     to bf16 (as cuBLASLt reads a bias beside a bf16 D), then rounded once. The f32 sum is within
     (K + 1) 2^-24 (|bias| + sum |x w|) of the double one, and the rounding adds half a bf16 ulp,
     2^-9 |value| (or one whole ulp, 2^-8, where the f32 sum sits near a rounding boundary);
     the GELU's f32 evaluation (1e-6 relative, dt_gelu_fwd's contract) is inside the same ulp.
   Each check prints the worst element against its bound. Bad dtypes are named. */
#include "dt_tensor.h"
#include "dt_test.h"

#include <math.h>

static dt_ctx C;

static dt_tensor mk(dt_dtype dt, int64_t r, int64_t c) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt; d.ndim = c >= 0 ? 2 : 1; d.shape[0] = r; d.shape[1] = c >= 0 ? c : 0; /* c < 0: a vector [r] */
    if (dt_tensor_create(&C, &t, &d)) { dt_test_fail("setup_create", "%s", dt_ctx_error(&C)); exit(1); }
    return t;
}

static uint64_t g_seed = 777;
static float rnd(void) { /* uniform in [-2, 2) */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_seed >> 40) / (double)(1ull << 24) * 4.0 - 2.0);
}
static void fill(dt_tensor *t) { /* f32: random; bf16: random, rounded */
    int64_t i;
    for (i = 0; i < t->numel; i++) {
        float v = rnd();
        if (t->dtype == DT_BF16) ((uint16_t *)t->data)[i] = dt_f32_to_bf16(v);
        else ((float *)t->data)[i] = v;
    }
}
static float at(const dt_tensor *t, int64_t i) {
    return t->dtype == DT_BF16 ? dt_bf16_to_f32(((const uint16_t *)t->data)[i]) : ((const float *)t->data)[i];
}
/* an f32 copy of t's values */
static dt_tensor as_f32(const dt_tensor *t) {
    dt_tensor f = mk(DT_F32, t->shape[0], t->ndim > 1 ? t->shape[1] : -1);
    int64_t i;
    for (i = 0; i < t->numel; i++) ((float *)f.data)[i] = at(t, i);
    return f;
}
static double rb(double v) { return dt_bf16_to_f32(dt_f32_to_bf16((float)v)); }
static double gelu_d(double v) { return 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

/* got (bf16) against round(f32) of f32's values, bit for bit */
static void same_rounded(const char *name, const dt_tensor *got, const dt_tensor *f32) {
    int64_t i, bad = -1;
    for (i = 0; i < got->numel && bad < 0; i++)
        if (((const uint16_t *)got->data)[i] != dt_f32_to_bf16(((const float *)f32->data)[i])) bad = i;
    if (bad < 0) dt_test_pass(name);
    else
        dt_test_fail(name, "element %lld: 0x%04x (%.9g), the f32 op's %.9g rounds to 0x%04x", (long long)bad,
                     ((const uint16_t *)got->data)[bad], (double)at(got, bad), (double)((const float *)f32->data)[bad],
                     dt_f32_to_bf16(((const float *)f32->data)[bad]));
}

static void same_bits(const char *name, const dt_tensor *a, const dt_tensor *b) {
    dt_test_equal_bytes(name, a->data, b->data, dt_tensor_bytes(a));
}

/* out[N, O] (bf16) against the double sums of x w^T + rb(bias), then f (identity or gelu), within
   2^-8 |value| + (K + 1) 2^-24 (|bias| + sum |x w|) |f'| (|gelu'| <= 1.13) */
static void linear_bound(const char *name, const dt_tensor *out, const dt_tensor *x, const dt_tensor *w,
                         const dt_tensor *bias, int gelu) {
    int64_t N = x->shape[0], K = x->shape[1], O = w->shape[0], n, o, k, wn = -1, wo = -1;
    double worst = 0, wgot = 0, wwant = 0, wbound = 0;
    for (n = 0; n < N; n++)
        for (o = 0; o < O; o++) {
            double s = bias ? rb(at(bias, o)) : 0, mag = fabs(s), v, got, bound;
            for (k = 0; k < K; k++) {
                double p = (double)at(x, n * K + k) * at(w, o * K + k);
                s += p;
                mag += fabs(p);
            }
            v = gelu ? gelu_d(s) : s;
            got = at(out, n * O + o);
            bound = ldexp(fabs(v), -8) + (double)(K + 1) * ldexp(mag, -24) * (gelu ? 1.13 : 1.0) + 1e-30;
            if (fabs(got - v) / bound > worst) {
                worst = fabs(got - v) / bound;
                wn = n, wo = o, wgot = got, wwant = v, wbound = bound;
            }
        }
    if (worst <= 1.0) dt_test_pass(name);
    else
        dt_test_fail(name, "out[%lld][%lld] = %.9g, the double sum %.9g: |diff| %.3g > bound %.3g", (long long)wn,
                     (long long)wo, wgot, wwant, fabs(wgot - wwant), wbound);
}

static void check_layernorm(void) {
    int64_t R = 19, Cs[3] = {7, 64, 768};
    int i;
    for (i = 0; i < 3; i++) {
        dt_tensor x = mk(DT_F32, R, Cs[i]), w = mk(DT_F32, Cs[i], -1), b = mk(DT_F32, Cs[i], -1);
        dt_tensor o32 = mk(DT_F32, R, Cs[i]), o16 = mk(DT_BF16, R, Cs[i]), m1 = mk(DT_F32, R, -1), r1 = mk(DT_F32, R, -1);
        dt_tensor m2 = mk(DT_F32, R, -1), r2 = mk(DT_F32, R, -1);
        char name[96];
        fill(&x); fill(&w); fill(&b);
        DT_TEST_CHECK("layernorm_f32_runs", dt_layernorm_fwd(&C, &o32, &m1, &r1, &x, &w, &b, 1e-5f) == DT_OK);
        snprintf(name, sizeof name, "layernorm_bf16_out_runs_c%lld", (long long)Cs[i]);
        DT_TEST_CHECK(name, dt_layernorm_fwd(&C, &o16, &m2, &r2, &x, &w, &b, 1e-5f) == DT_OK);
        snprintf(name, sizeof name, "layernorm_bf16_out_is_the_f32_out_rounded_c%lld", (long long)Cs[i]);
        same_rounded(name, &o16, &o32);
        snprintf(name, sizeof name, "layernorm_bf16_out_keeps_the_stats_c%lld", (long long)Cs[i]);
        DT_TEST_CHECK(name, !memcmp(m1.data, m2.data, dt_tensor_bytes(&m1)) && !memcmp(r1.data, r2.data, dt_tensor_bytes(&r1)));
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &b); dt_tensor_free(&C, &o32);
        dt_tensor_free(&C, &o16); dt_tensor_free(&C, &m1); dt_tensor_free(&C, &r1); dt_tensor_free(&C, &m2);
        dt_tensor_free(&C, &r2);
    }
}

static void check_gelu(void) {
    int64_t n = 2500; /* past one of the op's 1024-element blocks, and a tail */
    dt_tensor x16 = mk(DT_BF16, n, -1), x32, o32 = mk(DT_F32, n, -1), o16 = mk(DT_BF16, n, -1), of = mk(DT_F32, n, -1);
    dt_tensor g = mk(DT_F32, n, -1), dx1 = mk(DT_F32, n, -1), dx2 = mk(DT_F32, n, -1);
    fill(&x16); fill(&g); fill(&dx1);
    memcpy(dx2.data, dx1.data, dt_tensor_bytes(&dx1)); /* the backward adds to what dx holds */
    x32 = as_f32(&x16);
    DT_TEST_CHECK("gelu_f32_runs", dt_gelu_fwd(&C, &o32, &x32) == DT_OK);
    DT_TEST_CHECK("gelu_bf16_to_bf16_runs", dt_gelu_fwd(&C, &o16, &x16) == DT_OK);
    same_rounded("gelu_bf16_out_is_the_f32_out_rounded", &o16, &o32);
    DT_TEST_CHECK("gelu_bf16_to_f32_runs", dt_gelu_fwd(&C, &of, &x16) == DT_OK);
    same_bits("gelu_bf16_x_f32_out_is_the_f32_op", &of, &o32);
    DT_TEST_CHECK("gelu_f32_to_bf16_runs", dt_gelu_fwd(&C, &o16, &x32) == DT_OK);
    same_rounded("gelu_f32_x_bf16_out_is_the_f32_out_rounded", &o16, &o32);
    { /* in place, as the f32 op: out = x, the same bf16 elements (each block read before written) */
        dt_tensor y16 = mk(DT_BF16, n, -1);
        memcpy(y16.data, x16.data, dt_tensor_bytes(&x16));
        if (DT_TEST_CHECK("gelu_bf16_in_place_runs", dt_gelu_fwd(&C, &y16, &y16) == DT_OK))
            same_rounded("gelu_bf16_in_place_is_the_f32_out_rounded", &y16, &o32);
        dt_tensor_free(&C, &y16);
    }
    DT_TEST_CHECK("gelu_bwd_runs", dt_gelu_bwd(&C, &dx1, &g, &x32) == DT_OK && dt_gelu_bwd(&C, &dx2, &g, &x16) == DT_OK);
    same_bits("gelu_bwd_bf16_x_is_the_f32_op_on_its_values", &dx2, &dx1);
    { /* bf16 gradients: dout read as its values, a bf16 dx = the f32 op on dx's values, rounded once */
        dt_tensor g16 = mk(DT_BF16, n, -1), g32, d16 = mk(DT_BF16, n, -1), d32, e16 = mk(DT_BF16, n, -1);
        dt_tensor e32 = mk(DT_F32, n, -1);
        fill(&g16); fill(&d16);
        g32 = as_f32(&g16);
        d32 = as_f32(&d16);
        memcpy(e32.data, dx1.data, dt_tensor_bytes(&dx1));
        memcpy(dx2.data, dx1.data, dt_tensor_bytes(&dx1));
        DT_TEST_CHECK("gelu_bwd_bf16_dout_runs", dt_gelu_bwd(&C, &dx1, &g32, &x32) == DT_OK &&
                                                 dt_gelu_bwd(&C, &dx2, &g16, &x16) == DT_OK);
        same_bits("gelu_bwd_bf16_dout_is_the_f32_op_on_its_values", &dx2, &dx1);
        memcpy(e16.data, d16.data, dt_tensor_bytes(&d16));
        DT_TEST_CHECK("gelu_bwd_bf16_dx_runs", dt_gelu_bwd(&C, &d32, &g32, &x32) == DT_OK &&
                                               dt_gelu_bwd(&C, &d16, &g16, &x16) == DT_OK);
        same_rounded("gelu_bwd_bf16_dx_is_the_f32_op_rounded", &d16, &d32);
        DT_TEST_CHECK("gelu_bwd_bf16_dx_f32_dout_x_runs", dt_gelu_bwd(&C, &e16, &g32, &x32) == DT_OK);
        same_bits("gelu_bwd_bf16_dx_reads_f32_dout_and_x_alike", &e16, &d16);
        dt_tensor_free(&C, &g16); dt_tensor_free(&C, &g32); dt_tensor_free(&C, &d16); dt_tensor_free(&C, &d32);
        dt_tensor_free(&C, &e16); dt_tensor_free(&C, &e32);
    }
    {
        dt_tensor h = mk(DT_F16, n, -1);
        dt_test_error("gelu_f16_x_is_named", dt_gelu_fwd(&C, &o32, &h), dt_ctx_error(&C), "x");
        dt_tensor_free(&C, &h);
    }
    dt_tensor_free(&C, &x16); dt_tensor_free(&C, &x32); dt_tensor_free(&C, &o32); dt_tensor_free(&C, &o16);
    dt_tensor_free(&C, &of); dt_tensor_free(&C, &g); dt_tensor_free(&C, &dx1); dt_tensor_free(&C, &dx2);
}

/* bf16 gradients beside a bf16 w: a bf16 dout is read as its values (dx, dw and dbias the bits of
   an f32 dout holding them: the GEMM rounds an f32 dout to those values anyway); a bf16 dx is
   round(dx + dout w), the f32 sum plus dx's value rounded once. Against the f32-dx op on the same
   values: the two f32 results are each within K 2^-24 sum |terms| of the exact one and may differ
   by that twice (the bf16 path adds in row blocks); rounded, within one bf16 ulp (<= 2^-7 |v|) more. */
static void check_linear_grads(int64_t N, int64_t O, int64_t K, const dt_tensor *w, const dt_tensor *x16,
                               const char *tag) {
    dt_tensor g16 = mk(DT_BF16, N, O), g32, dw1 = mk(DT_F32, O, K), dw2 = mk(DT_F32, O, K), db1 = mk(DT_F32, O, -1);
    dt_tensor db2 = mk(DT_F32, O, -1), dx1 = mk(DT_F32, N, K), dx2 = mk(DT_F32, N, K), d16 = mk(DT_BF16, N, K), d32;
    char name[128];
    int64_t i, bad = -1;
    double worst = 0;
    fill(&g16); fill(&d16);
    g32 = as_f32(&g16);
    d32 = as_f32(&d16);
    memset(dw1.data, 0, dt_tensor_bytes(&dw1)); memset(dw2.data, 0, dt_tensor_bytes(&dw2));
    memset(db1.data, 0, dt_tensor_bytes(&db1)); memset(db2.data, 0, dt_tensor_bytes(&db2));
    memset(dx1.data, 0, dt_tensor_bytes(&dx1)); memset(dx2.data, 0, dt_tensor_bytes(&dx2));
    snprintf(name, sizeof name, "linear_bwd_bf16_dout_is_the_f32_dout_op_%s", tag);
    if (DT_TEST_CHECK(name, dt_linear_bwd(&C, &dx1, &dw1, &db1, &g32, x16, w) == DT_OK &&
                            dt_linear_bwd(&C, &dx2, &dw2, &db2, &g16, x16, w) == DT_OK)) {
        same_bits(name, &dx2, &dx1);
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_dw_is_the_f32_dout_op_%s", tag);
        same_bits(name, &dw2, &dw1);
        snprintf(name, sizeof name, "linear_bwd_bf16_dout_dbias_is_the_f32_dout_op_%s", tag);
        same_bits(name, &db2, &db1);
    }
    /* a bf16 dx: against d32 (the same starting values) after the f32-dx op */
    snprintf(name, sizeof name, "linear_bwd_bf16_dx_is_the_f32_dx_op_rounded_%s", tag);
    if (DT_TEST_CHECK(name, dt_linear_bwd(&C, &d32, NULL, NULL, &g16, x16, w) == DT_OK &&
                            dt_linear_bwd(&C, &d16, NULL, NULL, &g16, x16, w) == DT_OK)) {
        for (i = 0; i < d16.numel; i++) {
            int64_t r = i / K, c = i % K, o;
            double mag = 0, v = ((const float *)d32.data)[i], got = at(&d16, i), bound, e;
            for (o = 0; o < O; o++) mag += fabs((double)at(&g16, r * O + o) * at(w, o * K + c));
            bound = ldexp(fabs(v), -7) + 2.0 * (double)(O + 1) * ldexp(mag + fabs(v), -24) + 1e-30;
            e = fabs(got - v) / bound;
            if (e > worst) worst = e, bad = i;
        }
        if (worst <= 1.0) dt_test_pass(name);
        else
            dt_test_fail(name, "dx[%lld] = %.9g, the f32 op's %.9g (worst |diff| / bound %.3g)", (long long)bad,
                         (double)at(&d16, bad), (double)((const float *)d32.data)[bad], worst);
    }
    dt_tensor_free(&C, &g16); dt_tensor_free(&C, &g32); dt_tensor_free(&C, &dw1); dt_tensor_free(&C, &dw2);
    dt_tensor_free(&C, &db1); dt_tensor_free(&C, &db2); dt_tensor_free(&C, &dx1); dt_tensor_free(&C, &dx2);
    dt_tensor_free(&C, &d16); dt_tensor_free(&C, &d32);
}

static void check_linear(int64_t N, int64_t O, int64_t K) {
    dt_tensor w = mk(DT_BF16, O, K), x16 = mk(DT_BF16, N, K), x32, bias = mk(DT_F32, O, -1);
    dt_tensor o32a = mk(DT_F32, N, O), o32b = mk(DT_F32, N, O), o16 = mk(DT_BF16, N, O), p16 = mk(DT_BF16, N, O);
    dt_tensor g = mk(DT_F32, N, O), dw1 = mk(DT_F32, O, K), dw2 = mk(DT_F32, O, K), dx1 = mk(DT_F32, N, K);
    dt_tensor dx2 = mk(DT_F32, N, K);
    char name[128], tag[48];
    snprintf(tag, sizeof tag, "n%lld_o%lld_k%lld", (long long)N, (long long)O, (long long)K);
    fill(&w); fill(&x16); fill(&bias); fill(&g);
    x32 = as_f32(&x16);
    /* bias values off the bf16 grid: the bf16 output path must round them as cuBLASLt reads them */
    snprintf(name, sizeof name, "linear_bf16_x_f32_out_is_the_f32_x_op_%s", tag);
    if (DT_TEST_CHECK(name, dt_linear_fwd(&C, &o32a, &x32, &w, &bias) == DT_OK &&
                            dt_linear_fwd(&C, &o32b, &x16, &w, &bias) == DT_OK))
        same_bits(name, &o32b, &o32a);
    snprintf(name, sizeof name, "linear_bf16_out_within_the_bound_%s", tag);
    if (DT_TEST_CHECK(name, dt_linear_fwd(&C, &o16, &x16, &w, &bias) == DT_OK)) linear_bound(name, &o16, &x16, &w, &bias, 0);
    snprintf(name, sizeof name, "linear_bf16_out_from_f32_x_within_the_bound_%s", tag);
    if (DT_TEST_CHECK(name, dt_linear_fwd(&C, &o16, &x32, &w, NULL) == DT_OK)) linear_bound(name, &o16, &x16, &w, NULL, 0);
    snprintf(name, sizeof name, "linear_gelu_bf16_out_and_pre_within_the_bound_%s", tag);
    if (DT_TEST_CHECK(name, dt_linear_gelu_fwd(&C, &o16, &p16, &x16, &w, &bias) == DT_OK)) {
        char n2[160];
        snprintf(n2, sizeof n2, "%s_pre", name);
        linear_bound(n2, &p16, &x16, &w, &bias, 0);
        snprintf(n2, sizeof n2, "%s_out", name);
        linear_bound(n2, &o16, &x16, &w, &bias, 1);
    }
    snprintf(name, sizeof name, "linear_bwd_bf16_x_is_the_f32_x_op_%s", tag);
    if (DT_TEST_CHECK(name, dt_linear_bwd(&C, &dx1, &dw1, NULL, &g, &x32, &w) == DT_OK &&
                            dt_linear_bwd(&C, &dx2, &dw2, NULL, &g, &x16, &w) == DT_OK)) {
        same_bits(name, &dw2, &dw1);
        snprintf(name, sizeof name, "linear_bwd_bf16_x_dx_is_the_f32_x_op_%s", tag);
        same_bits(name, &dx2, &dx1);
    }
    check_linear_grads(N, O, K, &w, &x16, tag);
    dt_tensor_free(&C, &w); dt_tensor_free(&C, &x16); dt_tensor_free(&C, &x32); dt_tensor_free(&C, &bias);
    dt_tensor_free(&C, &o32a); dt_tensor_free(&C, &o32b); dt_tensor_free(&C, &o16); dt_tensor_free(&C, &p16);
    dt_tensor_free(&C, &g); dt_tensor_free(&C, &dw1); dt_tensor_free(&C, &dw2); dt_tensor_free(&C, &dx1);
    dt_tensor_free(&C, &dx2);
}

/* attention with a bf16 qkv writing a bf16 out: the f32 op's out rounded (att kept as ever) */
static void check_attention(void) {
    int64_t B = 2, T = 13, H = 2, hs = 16, W = H * hs; /* W: the width (C is the ctx) */
    dt_tensor q = mk(DT_BF16, B * T, 3 * W), o32 = mk(DT_F32, B * T, W), o16 = mk(DT_BF16, B * T, W);
    dt_tensor att = mk(DT_F32, B * H * T, T), q3, a, b, at4;
    int64_t s3q[3], s3o[3], s4[4];
    s3q[0] = B; s3q[1] = T; s3q[2] = 3 * W; s3o[0] = B; s3o[1] = T; s3o[2] = W;
    s4[0] = B; s4[1] = H; s4[2] = T; s4[3] = T;
    fill(&q);
    if (DT_TEST_CHECK("attention_setup", dt_tensor_reshape(&C, &q3, &q, 3, s3q) == DT_OK &&
                                         dt_tensor_reshape(&C, &a, &o32, 3, s3o) == DT_OK &&
                                         dt_tensor_reshape(&C, &b, &o16, 3, s3o) == DT_OK &&
                                         dt_tensor_reshape(&C, &at4, &att, 4, s4) == DT_OK) &&
        DT_TEST_CHECK("attention_bf16_out_runs", dt_attention_fwd(&C, &a, &at4, &q3, (int)H) == DT_OK &&
                                                 dt_attention_fwd(&C, &b, &at4, &q3, (int)H) == DT_OK))
        same_rounded("attention_bf16_out_is_the_f32_out_rounded", &o16, &o32);
    { /* a bf16 dqkv: the f32 dqkv's result from the same start, rounded once */
        dt_tensor g = mk(DT_F32, B * T, W), d16 = mk(DT_BF16, B * T, 3 * W), d32, g3, e16, e32;
        fill(&g); fill(&d16);
        d32 = as_f32(&d16);
        if (DT_TEST_CHECK("attention_bwd_bf16_dqkv_runs",
                          dt_tensor_reshape(&C, &g3, &g, 3, s3o) == DT_OK &&
                          dt_tensor_reshape(&C, &e16, &d16, 3, s3q) == DT_OK &&
                          dt_tensor_reshape(&C, &e32, &d32, 3, s3q) == DT_OK &&
                          dt_attention_bwd(&C, &e32, &g3, &q3, &at4, (int)H) == DT_OK &&
                          dt_attention_bwd(&C, &e16, &g3, &q3, &at4, (int)H) == DT_OK))
            same_rounded("attention_bwd_bf16_dqkv_is_the_f32_dqkv_op_rounded", &d16, &d32);
        dt_tensor_free(&C, &g); dt_tensor_free(&C, &d16); dt_tensor_free(&C, &d32);
    }
    dt_tensor_free(&C, &q); dt_tensor_free(&C, &o32); dt_tensor_free(&C, &o16); dt_tensor_free(&C, &att);
}

static void check_bad(void) {
    dt_tensor w32 = mk(DT_F32, 8, 4), w16 = mk(DT_BF16, 8, 4), x16 = mk(DT_BF16, 3, 4), x32 = mk(DT_F32, 3, 4);
    dt_tensor o16 = mk(DT_BF16, 3, 8), o32 = mk(DT_F32, 3, 8), f16 = mk(DT_F16, 3, 8), lw = mk(DT_F32, 4, -1);
    dt_tensor view;
    int64_t s[2] = {3, 4};
    fill(&w32); fill(&w16); fill(&x16); fill(&x32); fill(&lw);
    dt_test_error("linear_bf16_x_with_f32_w_is_named", dt_linear_fwd(&C, &o32, &x16, &w32, NULL), dt_ctx_error(&C),
                  "x is bf16 but w is f32");
    dt_test_error("linear_bf16_out_with_f32_w_is_named", dt_linear_fwd(&C, &o16, &x32, &w32, NULL), dt_ctx_error(&C),
                  "out is bf16 but w is f32");
    dt_test_error("linear_f16_out_is_named", dt_linear_fwd(&C, &f16, &x16, &w16, NULL), dt_ctx_error(&C), "out");
    dt_test_error("linear_gelu_mixed_out_pre_is_named", dt_linear_gelu_fwd(&C, &o16, &o32, &x16, &w16, NULL),
                  dt_ctx_error(&C), "pre is f32, out is bf16");
    dt_test_error("linear_bwd_bf16_x_with_f32_w_is_named", dt_linear_bwd(&C, NULL, NULL, NULL, &o32, &x16, &w32),
                  dt_ctx_error(&C), "x is bf16 but w is f32");
    dt_test_error("linear_bwd_bf16_dout_with_f32_w_is_named", dt_linear_bwd(&C, NULL, NULL, NULL, &o16, &x32, &w32),
                  dt_ctx_error(&C), "dout is bf16 but w is f32");
    dt_test_error("linear_bwd_bf16_dx_with_f32_w_is_named", dt_linear_bwd(&C, &x16, NULL, NULL, &o32, &x32, &w32),
                  dt_ctx_error(&C), "dx is bf16 but w is f32");
    dt_test_error("linear_bwd_f16_dx_is_named", dt_linear_bwd(&C, &f16, NULL, NULL, &o16, &x16, &w16),
                  dt_ctx_error(&C), "dx");
    dt_test_error("gelu_bwd_f16_dx_is_named", dt_gelu_bwd(&C, &f16, &o32, &o32), dt_ctx_error(&C), "dx");
    dt_test_error("bias_bwd_f16_dout_is_named", dt_bias_add_bwd(&C, &lw, &f16), dt_ctx_error(&C), "dout");
    /* a bf16 out over the f32 x it reads: refused before anything is written */
    DT_TEST_CHECK("setup_view", dt_tensor_view(&C, &view, &x32, 0, 2, s) == DT_OK);
    view.dtype = DT_BF16;
    dt_test_error("layernorm_bf16_out_over_x_is_named", dt_layernorm_fwd(&C, &view, NULL, NULL, &x32, &lw, NULL, 1e-5f),
                  dt_ctx_error(&C), "shares memory with x");
    dt_test_error("gelu_bwd_bf16_dx_over_f32_dout_is_named", dt_gelu_bwd(&C, &view, &x32, &x16), dt_ctx_error(&C),
                  "shares memory with dout");
    dt_tensor_free(&C, &w32); dt_tensor_free(&C, &w16); dt_tensor_free(&C, &x16); dt_tensor_free(&C, &x32);
    dt_tensor_free(&C, &o16); dt_tensor_free(&C, &o32); dt_tensor_free(&C, &f16); dt_tensor_free(&C, &lw);
}

int main(void) {
    if (dt_ctx_init(&C, NULL)) return 1;
    check_layernorm();
    check_gelu();
    check_linear(37, 64, 48);
    check_linear(5, 3, 200);
    check_linear(300, 1100, 16); /* rows beyond one of the bf16 output's f32 blocks (2^18 / O = 238) */
    check_linear(1, 8, 0);       /* K = 0: out = the rounded bias */
    check_linear(22000, 8, 48);  /* a bf16 dx beyond one of its f32 row blocks (2^20 / K = 21845) */
    check_attention();
    check_bad();
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
