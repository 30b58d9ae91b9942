/* tests/test_bf16_gemm.c - dt_linear with a bf16 weight on the CPU: x and dout rounded to bf16,
   bf16 products, f32 sums, f32 outputs. Every output element is compared with a double-precision
   sum of the same rounded operands; a sum of K products in f32 (in any order) is within
   (K + 1) * 2^-24 * (|c0| + sum |a b|) of it (c0: what dx / dw held before, the += of the
   backward), so the bound is derived, not tuned. Shapes cross the AMX kernel's edges: tiles of 16,
   blocks of 32 x 32, k in steps of 32 and blocks of 512, rows in blocks of 64, columns in blocks
   of 1024, and K = 0.

   The program runs once as the process finds the CPU (AMX where it has AMX-BF16; else, where it
   has AVX512_BF16, VDPBF16PS or the fallback as dt's probe of its rate found, with the probe's
   figure in the name; else the fallback), once in a child with DT_CPU_BF16=f32 (the f32
   fallback), and once with DT_CPU_BF16=avx512 where the CPU has AVX512_BF16 and the first run
   took another way. Every way must be within the bound; bad dtypes and a bad DT_CPU_BF16 are
   named. */
#define _POSIX_C_SOURCE 200809L
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "dt_tensor.h"
#include "dt_test.h"

static dt_ctx C;

static dt_tensor mk(dt_dtype dt, int64_t r, int64_t c) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt; d.ndim = 2; d.shape[0] = r; d.shape[1] = c;
    if (dt_tensor_create(&C, &t, &d)) { dt_test_fail("setup_create", "%s", dt_ctx_error(&C)); exit(1); }
    return t;
}

static uint64_t g_seed = 12345;
static float rnd(void) { /* uniform in [-2, 2), some exponents apart */
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(g_seed >> 40) / (double)(1ull << 24) * 4.0 - 2.0);
}
static double rb(float v) { return dt_bf16_to_f32(dt_f32_to_bf16(v)); }

/* err / bound at worst over an output [R x Cc]: out[r][c] against c0[r][c] + sum_k a(r, k) b(k, c) */
typedef struct { const float *a; int64_t ars, aks; const void *b; int bbf; int64_t bks, bcs; } prod;
static double pv(const prod *p, int64_t r, int64_t k, int64_t c, double *abs_) {
    double a = rb(p->a[r * p->ars + k * p->aks]);
    double b = p->bbf ? dt_bf16_to_f32(((const uint16_t *)p->b)[k * p->bks + c * p->bcs])
                      : rb(((const float *)p->b)[k * p->bks + c * p->bcs]);
    *abs_ = fabs(a * b);
    return a * b;
}
static double worst_of(const prod *p, const float *out, const float *c0, int64_t R, int64_t Cc, int64_t K,
                       int64_t *wr, int64_t *wc, double *got, double *want) {
    double worst = 0.0;
    int64_t r, c, k;
    for (r = 0; r < R; r++)
        for (c = 0; c < Cc; c++) {
            double s = c0 ? c0[r * Cc + c] : 0.0, sa = fabs(s), e, bound, ab;
            for (k = 0; k < K; k++) { s += pv(p, r, k, c, &ab); sa += ab; }
            bound = (double)(K + 1) * ldexp(1.0, -24) * sa + 1e-30;
            e = fabs(out[r * Cc + c] - s) / bound;
            if (e > worst || e != e) { worst = e != e ? INFINITY : e; *wr = r; *wc = c; *got = out[r * Cc + c]; *want = s; }
        }
    return worst;
}

/* with_bias: the forward adds a bias (where the AMX tiles start), the reference's c0 */
static void one_shape(const char *way, int64_t N, int64_t In, int64_t Out, int with_bias) {
    dt_tensor x = mk(DT_F32, N, In), w = mk(DT_BF16, Out, In), out = mk(DT_F32, N, Out), dout = mk(DT_F32, N, Out);
    dt_tensor dx = mk(DT_F32, N, In), dw = mk(DT_F32, Out, In), bias = mk(DT_F32, 1, Out);
    float *dx0 = malloc(sizeof(float) * (size_t)(N * In + 1)), *dw0 = malloc(sizeof(float) * (size_t)(Out * In + 1));
    float *b0 = malloc(sizeof(float) * (size_t)(N * Out + 1));
    int64_t i, wr = 0, wc = 0;
    double got = 0, want = 0, worst;
    char name[160];
    dt_status st;
    prod p;
    for (i = 0; i < N * In; i++) ((float *)x.data)[i] = rnd();
    for (i = 0; i < Out * In; i++) ((uint16_t *)w.data)[i] = dt_f32_to_bf16(rnd());
    for (i = 0; i < N * Out; i++) ((float *)dout.data)[i] = rnd();
    for (i = 0; i < N * In; i++) ((float *)dx.data)[i] = dx0[i] = rnd();
    for (i = 0; i < Out * In; i++) ((float *)dw.data)[i] = dw0[i] = rnd();
    for (i = 0; i < N * Out; i++) ((float *)out.data)[i] = 1e30f; /* fwd overwrites */
    for (i = 0; i < Out; i++) ((float *)bias.data)[i] = rnd();
    for (i = 0; i < N * Out; i++) b0[i] = ((float *)bias.data)[i % Out];

    st = dt_linear_fwd(&C, &out, &x, &w, with_bias ? &bias : NULL);
    snprintf(name, sizeof name, "%s_fwd%s_within_bound_N%lld_In%lld_Out%lld", way, with_bias ? "_bias" : "", (long long)N,
             (long long)In, (long long)Out);
    p.a = (const float *)x.data; p.ars = In; p.aks = 1; p.b = w.data; p.bbf = 1; p.bks = 1; p.bcs = In;
    worst = st ? INFINITY : worst_of(&p, (const float *)out.data, with_bias ? b0 : NULL, N, Out, In, &wr, &wc, &got, &want);
    if (!dt_test_check_all(name, worst <= 1.0, "%s; worst out[%lld][%lld] = %.9g, want %.9g: %.3g of the bound",
                           st ? dt_ctx_error(&C) : "ok", (long long)wr, (long long)wc, got, want, worst))
        goto done;

    st = dt_linear_bwd(&C, &dx, &dw, NULL, &dout, &x, &w);
    snprintf(name, sizeof name, "%s_dx_within_bound_N%lld_In%lld_Out%lld", way, (long long)N, (long long)In, (long long)Out);
    p.a = (const float *)dout.data; p.ars = Out; p.aks = 1; p.b = w.data; p.bbf = 1; p.bks = In; p.bcs = 1;
    worst = st ? INFINITY : worst_of(&p, (const float *)dx.data, dx0, N, In, Out, &wr, &wc, &got, &want);
    dt_test_check_all(name, worst <= 1.0, "%s; worst dx[%lld][%lld] = %.9g, want %.9g: %.3g of the bound",
                      st ? dt_ctx_error(&C) : "ok", (long long)wr, (long long)wc, got, want, worst);
    snprintf(name, sizeof name, "%s_dw_within_bound_N%lld_In%lld_Out%lld", way, (long long)N, (long long)In, (long long)Out);
    p.a = (const float *)dout.data; p.ars = 1; p.aks = Out; p.b = x.data; p.bbf = 0; p.bks = In; p.bcs = 1;
    worst = st ? INFINITY : worst_of(&p, (const float *)dw.data, dw0, Out, In, N, &wr, &wc, &got, &want);
    dt_test_check_all(name, worst <= 1.0, "%s; worst dw[%lld][%lld] = %.9g, want %.9g: %.3g of the bound",
                      st ? dt_ctx_error(&C) : "ok", (long long)wr, (long long)wc, got, want, worst);
done:
    free(dx0); free(dw0); free(b0);
    dt_tensor_free(&C, &bias);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &dout); dt_tensor_free(&C, &dx); dt_tensor_free(&C, &dw);
}

/* The product of a row with a NaN is NaN; the other rows stay finite. */
static void nan_row(const char *way) {
    dt_tensor x = mk(DT_F32, 40, 70), w = mk(DT_BF16, 33, 70), out = mk(DT_F32, 40, 33);
    int64_t i, bad = 0;
    char name[96];
    for (i = 0; i < 40 * 70; i++) ((float *)x.data)[i] = rnd();
    for (i = 0; i < 33 * 70; i++) ((uint16_t *)w.data)[i] = dt_f32_to_bf16(rnd());
    ((float *)x.data)[17 * 70 + 69] = NAN;
    dt_linear_fwd(&C, &out, &x, &w, NULL);
    for (i = 0; i < 40 * 33; i++) {
        float v = ((float *)out.data)[i];
        if ((i / 33 == 17) != (v != v)) bad++;
    }
    snprintf(name, sizeof name, "%s_nan_reaches_its_row_only", way);
    dt_test_check_all(name, bad == 0, "%lld elements wrong (row 17 NaN, the rest finite)", (long long)bad);
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &w); dt_tensor_free(&C, &out);
}

static void bad_inputs(void) {
    dt_tensor x = mk(DT_F32, 4, 8), xb = mk(DT_BF16, 4, 8), w = mk(DT_BF16, 3, 8), out = mk(DT_F32, 4, 3);
    dt_tensor outb = mk(DT_BF16, 4, 3), dwb = mk(DT_BF16, 3, 8), w7 = mk(DT_BF16, 3, 7), dw = mk(DT_F32, 3, 7);
    dt_tensor wf = mk(DT_F32, 3, 8), xh = mk(DT_F16, 4, 8);
    dt_status st;
    /* bf16 activations go with a bf16 w only (tests/test_bf16_acts.c has them with one) */
    st = dt_linear_fwd(&C, &out, &xb, &wf, NULL);
    dt_test_check_all("bf16_x_with_f32_w_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&C), "x is bf16"),
                      "status %d: %s", (int)st, dt_ctx_error(&C));
    st = dt_linear_fwd(&C, &outb, &x, &wf, NULL);
    dt_test_check_all("bf16_out_with_f32_w_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&C), "out is bf16"),
                      "status %d: %s", (int)st, dt_ctx_error(&C));
    st = dt_linear_fwd(&C, &out, &xh, &w, NULL);
    dt_test_check_all("f16_x_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&C), "x"), "status %d: %s", (int)st,
                      dt_ctx_error(&C));
    dt_tensor_free(&C, &wf); dt_tensor_free(&C, &xh);
    st = dt_linear_fwd(&C, &out, &x, &w7, NULL);
    dt_test_check_all("bf16_w_shape_is_named", st == DT_ERR_SHAPE && strstr(dt_ctx_error(&C), "w.shape[1]"),
                      "status %d: %s", (int)st, dt_ctx_error(&C));
    st = dt_linear_bwd(&C, NULL, &dwb, NULL, &out, &x, &w);
    dt_test_check_all("bf16_dw_is_named", st == DT_ERR_DTYPE && strstr(dt_ctx_error(&C), "dw"), "status %d: %s",
                      (int)st, dt_ctx_error(&C));
    st = dt_linear_bwd(&C, NULL, &dw, NULL, &out, &x, &w);
    dt_test_check_all("bf16_dw_shape_is_named", st == DT_ERR_SHAPE && strstr(dt_ctx_error(&C), "dw"), "status %d: %s",
                      (int)st, dt_ctx_error(&C));
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &xb); dt_tensor_free(&C, &w); dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &outb); dt_tensor_free(&C, &dwb); dt_tensor_free(&C, &w7); dt_tensor_free(&C, &dw);
}


/* Attention with a bf16 qkv [B, T, (H + 2K) hs] (att f32) against a double computation from the
   same bf16 values. The kernel rounds P, dout and dS to bf16 (u = 2^-9 relative each) on their
   way into the products and sums in f32; propagated, with A[t][k] = sum_d |g[t][d] v[k][d]|:
     out[t][d]: u sum_k P |v|             dv[k][d]: 2u sum_t P |g|
     dS[t][k]:  E = scale P (u A + u sum_k' P A) + u |dS|   (the dP and its row sum from a rounded g)
     dq[t][d]:  sum_k E |k|               dk[k][d]: sum_t E |q|
   each doubled for the f32 scores, softmax and sums (2^-24 each, far smaller), plus 1e-6 of the
   largest value. */
static void attention_case(const char *way, int64_t B, int64_t T, int H, int K, int64_t hs) {
    int64_t W = (H + 2 * K) * hs, Cq = H * hs, b, t, k, d, i;
    int h;
    double u = ldexp(1.0, -9), scale = 1.0 / sqrt((double)hs), worst[5] = {0, 0, 0, 0, 0};
    const char *what[5] = {"out", "dq", "dk", "dv", "att"};
    dt_tensor qkv = mk(DT_BF16, B * T, W), out = mk(DT_F32, B * T, Cq), dout = mk(DT_F32, B * T, Cq);
    dt_tensor dqkv = mk(DT_F32, B * T, W), att;
    dt_tensor_desc ad;
    char name[160];
    dt_status st;
    double *P = calloc((size_t)(T * T), sizeof(double)), *dS = calloc((size_t)(T * T), sizeof(double));
    double *E = calloc((size_t)(T * T), sizeof(double)), *A = calloc((size_t)(T * T), sizeof(double));
    memset(&ad, 0, sizeof ad);
    ad.dtype = DT_F32; ad.ndim = 4; ad.shape[0] = B; ad.shape[1] = H; ad.shape[2] = T; ad.shape[3] = T;
    if (dt_tensor_create(&C, &att, &ad)) { dt_test_fail("setup_att", "%s", dt_ctx_error(&C)); exit(1); }
    qkv.ndim = 3; qkv.shape[0] = B; qkv.shape[1] = T; qkv.shape[2] = W; /* views of the 2-D buffers */
    out.ndim = 3; out.shape[0] = B; out.shape[1] = T; out.shape[2] = Cq;
    dout.ndim = 3; dout.shape[0] = B; dout.shape[1] = T; dout.shape[2] = Cq;
    dqkv.ndim = 3; dqkv.shape[0] = B; dqkv.shape[1] = T; dqkv.shape[2] = W;
    for (i = 0; i < B * T * W; i++) ((uint16_t *)qkv.data)[i] = dt_f32_to_bf16(rnd());
    for (i = 0; i < B * T * Cq; i++) ((float *)dout.data)[i] = rnd();
    memset(dqkv.data, 0, dt_tensor_bytes(&dqkv));
    st = dt_attention_gqa_fwd(&C, &out, &att, &qkv, H, K);
    if (!st) st = dt_attention_gqa_bwd(&C, &dqkv, &dout, &qkv, &att, H, K);
    snprintf(name, sizeof name, "%s_attention_runs_B%lld_T%lld_H%d_K%d_hs%lld", way, (long long)B, (long long)T, H, K,
             (long long)hs);
    if (!dt_test_check_all(name, st == DT_OK, "%s", dt_ctx_error(&C))) goto done;
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++) {
            const uint16_t *x = (const uint16_t *)qkv.data + b * T * W;
            int64_t qo = h * hs, ko = Cq + (h / (H / K)) * hs, vo = ko + K * hs;
#define QKV(r, c) ((double)dt_bf16_to_f32(x[(r) * W + (c)]))
#define G(r, c) ((double)((const float *)dout.data)[(b * T + (r)) * Cq + h * hs + (c)])
            for (t = 0; t < T; t++) { /* P, A, dS, E of row t */
                double mx = -INFINITY, sum = 0, D = 0, DA = 0;
                for (k = 0; k <= t; k++) {
                    double sc = 0;
                    for (d = 0; d < hs; d++) sc += QKV(t, qo + d) * QKV(k, ko + d);
                    P[t * T + k] = sc * scale;
                    if (P[t * T + k] > mx) mx = P[t * T + k];
                }
                for (k = 0; k <= t; k++) { P[t * T + k] = exp(P[t * T + k] - mx); sum += P[t * T + k]; }
                for (k = 0; k <= t; k++) {
                    double dp = 0, a = 0;
                    P[t * T + k] /= sum;
                    for (d = 0; d < hs; d++) { dp += G(t, d) * QKV(k, vo + d); a += fabs(G(t, d) * QKV(k, vo + d)); }
                    dS[t * T + k] = dp; A[t * T + k] = a;
                    D += P[t * T + k] * dp; DA += P[t * T + k] * a;
                }
                for (k = 0; k <= t; k++) {
                    dS[t * T + k] = P[t * T + k] * (dS[t * T + k] - D) * scale;
                    E[t * T + k] = scale * P[t * T + k] * (u * A[t * T + k] + u * DA) + u * fabs(dS[t * T + k]);
                }
                for (k = 0; k < T; k++) { /* att: the f32 softmax of f32 scores, within 1e-5 of P */
                    double e = fabs(((const float *)att.data)[((b * H + h) * T + t) * T + k] - (k <= t ? P[t * T + k] : 0));
                    if (e / 1e-5 > worst[4]) worst[4] = e / 1e-5;
                }
            }
            for (t = 0; t < T; t++)
                for (d = 0; d < hs; d++) {
                    double o = 0, ob = 0, dq = 0, dqb = 0, got;
                    for (k = 0; k <= t; k++) {
                        o += P[t * T + k] * QKV(k, vo + d); ob += P[t * T + k] * fabs(QKV(k, vo + d));
                        dq += dS[t * T + k] * QKV(k, ko + d); dqb += E[t * T + k] * fabs(QKV(k, ko + d));
                    }
                    got = ((const float *)out.data)[(b * T + t) * Cq + h * hs + d];
                    if (fabs(got - o) / (2 * u * ob + 1e-6) > worst[0]) worst[0] = fabs(got - o) / (2 * u * ob + 1e-6);
                    got = ((const float *)dqkv.data)[(b * T + t) * W + qo + d];
                    if (fabs(got - dq) / (2 * dqb + 1e-6) > worst[1]) worst[1] = fabs(got - dq) / (2 * dqb + 1e-6);
                }
            if (K == H) /* dk, dv of one query head each (under GQA a group adds into them) */
                for (k = 0; k < T; k++)
                    for (d = 0; d < hs; d++) {
                        double dk = 0, dkb = 0, dv = 0, dvb = 0, got;
                        for (t = k; t < T; t++) {
                            dk += dS[t * T + k] * QKV(t, qo + d); dkb += E[t * T + k] * fabs(QKV(t, qo + d));
                            dv += P[t * T + k] * G(t, d); dvb += P[t * T + k] * fabs(G(t, d));
                        }
                        got = ((const float *)dqkv.data)[(b * T + k) * W + ko + d];
                        if (fabs(got - dk) / (2 * dkb + 1e-6) > worst[2]) worst[2] = fabs(got - dk) / (2 * dkb + 1e-6);
                        got = ((const float *)dqkv.data)[(b * T + k) * W + vo + d];
                        if (fabs(got - dv) / (4 * u * dvb + 1e-6) > worst[3]) worst[3] = fabs(got - dv) / (4 * u * dvb + 1e-6);
                    }
#undef QKV
#undef G
        }
    for (i = 0; i < 5; i++) {
        if (i >= 2 && i <= 3 && K != H) continue;
        snprintf(name, sizeof name, "%s_attention_%s_within_bound_B%lld_T%lld_H%d_K%d_hs%lld", way, what[i], (long long)B,
                 (long long)T, H, K, (long long)hs);
        dt_test_check_all(name, worst[i] <= 1.0, "worst element %.3g of its bound", worst[i]);
    }
done:
    free(P); free(dS); free(E); free(A);
    dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &dout);
    dt_tensor_free(&C, &dqkv); dt_tensor_free(&C, &att);
}


/* dt_convert f32 -> bf16 (8 lanes where the CPU has AVX2) gives dt_f32_to_bf16's bits for every
   pattern: random words (NaN, infinities, subnormals among them) and the rounding ties. */
static unsigned want_of(uint32_t w) {
    float f;
    memcpy(&f, &w, sizeof f);
    return dt_f32_to_bf16(f);
}
static void convert_bits(void) {
    int64_t n = 100003, i, bad = 0, first = -1;
    uint32_t *u = malloc(sizeof(uint32_t) * (size_t)n);
    uint16_t *d = malloc(sizeof(uint16_t) * (size_t)n);
    float f;
    dt_status st;
    for (i = 0; i < n; i++) {
        g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = (uint32_t)(g_seed >> 32);
        if (i % 7 == 0) u[i] = (u[i] & 0xffff0000u) | (i % 14 ? 0x8000u : 0x7fffu); /* ties and near-ties */
        if (i % 11 == 0) u[i] = 0x7f800000u | (u[i] & 0x807fffffu);                   /* inf and NaN */
    }
    st = dt_convert(&C, d, DT_BF16, u, DT_F32, n);
    for (i = 0; i < n; i++) {
        memcpy(&f, &u[i], sizeof f);
        if (d[i] != dt_f32_to_bf16(f)) { bad++; if (first < 0) first = i; }
    }
    dt_test_check_all("convert_to_bf16_is_the_scalar_rounding", st == DT_OK && bad == 0,
                      "status %d; %lld of %lld differ, first at %lld (0x%08x -> 0x%04x, want 0x%04x)", (int)st,
                      (long long)bad, (long long)n, (long long)first, first >= 0 ? u[first] : 0u,
                      first >= 0 ? d[first] : 0u, first >= 0 ? want_of(u[first]) : 0u);
    free(u); free(d);
}

/* /proc/cpuinfo's flags: 2 with amx_bf16, amx_tile and avx512_bf16, 1 with avx512_bf16 only, else 0 */
static int cpu_bf16(void) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    int amx = 0, bf = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "flags", 5)) {
            amx = strstr(line, " amx_bf16") && strstr(line, " amx_tile");
            bf = strstr(line, " avx512_bf16") != NULL;
            break;
        }
    fclose(f);
    return bf ? 1 + amx : 0;
}

/* this program again in a child with DT_CPU_BF16=env (the way is chosen once a process) */
static void child(char **argv, const char *env, const char *arg) {
    int status = 0;
    pid_t pid;
    char name[96];
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        char *args[3];
        args[0] = argv[0]; args[1] = (char *)arg; args[2] = NULL;
        setenv("DT_CPU_BF16", env, 1);
        execv(argv[0], args);
        _exit(127);
    }
    if (pid > 0) waitpid(pid, &status, 0);
    snprintf(name, sizeof name, "child_DT_CPU_BF16_%s_ran_and_passed", env);
    dt_test_check_all(name, pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "pid %d, status %d", (int)pid,
                      status);
}

int main(int argc, char **argv) {
    static const int64_t shapes[][3] = {
        {1, 1, 1},     {3, 5, 2},      {16, 32, 16},  {17, 33, 15},   {32, 64, 32},   {33, 31, 47},   {64, 96, 100},
        {65, 513, 40}, {70, 1030, 33}, {130, 40, 70}, {8, 20, 1100},  {2, 3, 0},      {0, 4, 5},      {5, 0, 4},
        {129, 257, 1025}};
    const char *env = getenv("DT_CPU_BF16"), *path, *way;
    int cpu = cpu_bf16(), want;
    size_t s;
    if (dt_ctx_init(&C, NULL)) return 1;
    path = dt_cpu_bf16_gemm();
    printf("# dt_cpu_bf16_gemm: %s%s%s%s\n", path, env ? " (the child run, DT_CPU_BF16=" : "", env ? env : "", env ? ")" : "");
    if (argc > 1 && !strcmp(argv[1], "--name-only")) { /* a DT_CPU_BF16 that is none of the three */
        dt_test_check_all("bad_DT_CPU_BF16_is_named_and_falls_back",
                          !strncmp(path, "f32 GEMMs", 9) && strstr(path, "DT_CPU_BF16") != NULL, "\"%s\"", path);
        dt_ctx_shutdown(&C);
        return dt_test_finish();
    }
    want = env && !strcmp(env, "f32") ? 0 : env && !strcmp(env, "avx512") && cpu == 2 ? 1 : cpu;
    if (want == 1 && !env && !strncmp(path, "f32 GEMMs", 9) && strstr(path, "VDPBF16PS makes"))
        want = 0; /* the probe found VDPBF16PS slower than f32 FMAs (an Intel core without AMX) */
    way = want == 2 ? "amx" : want == 1 ? "avx512" : env && !strcmp(env, "f32") ? "fallback" : "f32";
    dt_test_check_all("way_is_the_one_the_cpu_and_env_ask_for",
                      !strncmp(path, want == 2 ? "amx-bf16" : want == 1 ? "avx512-bf16" : "f32 GEMMs",
                               want == 2 ? 8 : want == 1 ? 11 : 9),
                      "dt_cpu_bf16_gemm \"%s\"; /proc/cpuinfo: %s; DT_CPU_BF16 %s", path,
                      cpu == 2 ? "amx_bf16 + avx512_bf16" : cpu ? "avx512_bf16, no amx" : "neither", env ? env : "unset");
    if (env && (!strcmp(env, "f32") || (!strcmp(env, "avx512") && cpu)))
        dt_test_check_all("forced_way_is_named", strstr(path, "DT_CPU_BF16=") != NULL, "\"%s\"", path);
    for (s = 0; s < sizeof shapes / sizeof shapes[0]; s++) one_shape(way, shapes[s][0], shapes[s][1], shapes[s][2], (int)(s & 1));
    nan_row(way);
    attention_case(way, 2, 70, 2, 2, 16);
    attention_case(way, 1, 130, 4, 2, 32);
    attention_case(way, 1, 65, 1, 1, 64);
    if (!env) {
        bad_inputs();
        convert_bits();
        child(argv, "f32", NULL);
        if (cpu && strcmp(way, "avx512")) child(argv, "avx512", NULL);
        child(argv, "vnni", "--name-only");
    }
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
