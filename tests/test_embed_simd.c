// with: tests/embed_nosimd.c
/* tests/test_embed_simd.c - the fast paths of dt_embed.h (SSE2 pooling and gradient sums, row
   prefetches) and of dt_dot_interaction (4-lane vectors) give the bits of their plain C twins:
   (1) a training run over every pooling kind, dtype and sparse optimizer (tests/embed_simd_case.h)
   here and in tests/embed_nosimd.c, built with DT_EMBED_NO_SIMD and DT_TENSOR_NO_SIMD;
   (2) the first step's pooled sums against a hand f32 sum in bag order, and its updated rows
   against SGD by hand; (3) dot interaction forward and backward against the plain loops written
   out here (the order dt_tensor.h documents), at odd widths, and against the twin; (4) bad
   shapes are still named. */
#define DT_STATIC
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"
#include "embed_simd_case.h"
#include "embed_nosimd.h"

static dt_ctx C;

/* PASS iff got and want hold the same bits; else the first difference, both values. */
static int same_bits(const char *name, const float *got, const float *want, int64_t n) {
    int64_t i, bad = 0, first = -1;
    for (i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float))) { if (first < 0) first = i; bad++; }
    if (!bad) return dt_test_pass(name);
    return dt_test_fail(name, "%lld of %lld floats differ; first at %lld: got %.9g, want %.9g", (long long)bad,
                        (long long)n, (long long)first, (double)got[first], (double)want[first]);
}

static void test_training_twin(void) {
    float *a = (float *)malloc(sizeof(float) * ESC_MAX_FLOATS), *b = (float *)malloc(sizeof(float) * ESC_MAX_FLOATS);
    int64_t na, nb;
    if (!a || !b) { dt_test_fail("embed_twin_alloc", "malloc"); free(a); free(b); return; }
    DT_TEST_CHECK("embed_nosimd_copy_is_plain_c", !nosimd_embed_has_sse2());
    na = esc_run(&C, a);
    nb = nosimd_embed_run(b);
    if (na < 0) dt_test_fail("embed_simd_run", "%s", dt_ctx_error(&C));
    else if (nb != na) dt_test_fail("embed_simd_twin_sizes", "SIMD copy wrote %lld floats, plain C %lld", (long long)na,
                                    (long long)nb);
    else same_bits("embed_simd_training_equals_plain_c_bitwise", a, b, na);
    free(a); free(b);
}

/* One table of 1000 x 64 (four cache lines a row: every prefetch of a row runs), bags of 0..9
   ids with duplicates; SGD lr 1 so that w_new = w - g exactly checks the summed gradients. */
static void test_pool_and_update_by_hand(void) {
    enum { R = 1000, D = 64, B = 300 };
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    int64_t lengths[B], ids[B * 9], n = 0, i, j, c, r0, c0;
    float *before = (float *)malloc(sizeof(float) * R * D), *want = (float *)malloc(sizeof(float) * B * D);
    double *gsum = (double *)calloc((size_t)R * D, sizeof(double));
    dt_tensor out, dout, w;
    dt_tensor_desc td;
    dt_kjt k;
    double worst = 0;
    memset(&t, 0, sizeof t);
    t.name = "wide"; t.rows = R; t.dim = D; t.optim.kind = DT_EMBED_SGD; t.optim.lr = 1.0;
    t.init.kind = DT_INIT_NORMAL; t.init.std = 1;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.seed = 3;
    if (dt_embed_create(&C, &e, &d)) { dt_test_fail("pool_by_hand_create", "%s", dt_ctx_error(&C)); return; }
    for (i = 0; i < B; i++) {
        lengths[i] = (int64_t)(dt_rng_uniform(5, 0, (uint64_t)i) * 10.0f) % 10;
        for (j = 0; j < lengths[i]; j++, n++) ids[n] = (int64_t)(dt_rng_uniform(5, 1, (uint64_t)n) * 200.0f) % 200;
    }
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = B; k.lengths = lengths; k.ids = ids;
    memset(&td, 0, sizeof td);
    td.shape[0] = B; td.shape[1] = D; td.ndim = 2;
    if (dt_tensor_create(&C, &out, &td) || dt_tensor_create(&C, &dout, &td)) exit(2);
    for (i = 0; i < B * D; i++) ((float *)dout.data)[i] = dt_rng_normal(6, 0, (uint64_t)i);
    dt_embed_local_shard(e, &w, &r0, &c0, 0);
    memcpy(before, w.data, sizeof(float) * R * D);
    for (i = 0, n = 0; i < B; i++) { /* acc = ((0 + row_0) + row_1) + ..., f32, bag order */
        for (c = 0; c < D; c++) want[i * D + c] = 0.0f;
        for (j = 0; j < lengths[i]; j++, n++)
            for (c = 0; c < D; c++) {
                want[i * D + c] += before[ids[n] * D + c];
                gsum[ids[n] * D + c] += ((float *)dout.data)[i * D + c];
            }
    }
    if (dt_embed_forward(e, &out, &k) || dt_embed_backward(e, &dout)) {
        dt_test_fail("pool_by_hand_step", "%s", dt_ctx_error(&C));
    } else {
        same_bits("pool_sum_equals_hand_f32_sum_in_bag_order", (const float *)out.data, want, B * D);
        for (i = 0; i < R * D; i++) { /* w - 1 * g, g summed in f32 (order checked by the twin) */
            double got = ((float *)w.data)[i], ref = (double)before[i] - gsum[i];
            double err = fabs(got - ref) / (1.0 + fabs(ref));
            if (err > worst) worst = err;
        }
        dt_test_close("sgd_update_equals_w_minus_summed_grad", worst, 0.0, 1e-5);
    }
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &dout);
    dt_embed_free(e);
    free(before); free(want); free(gsum);
}

/* The plain loops: out = [dense, <T_i, T_j> i > j], s = 0; s += x_d y_d; and the backward's
   gx += s y, gy += s x per pair in (i, j) order. */
static void dot_ref(float *out, float *gd, float *ge, const float *dense, const float *emb, const float *g, int64_t B,
                    int64_t F, int64_t D) {
    int64_t b, i, j, d, W = D + (F + 1) * F / 2;
    for (b = 0; b < B; b++) {
        float *o = out + b * W;
        const float *gg = g + b * W;
#define VEC(k) ((k) == 0 ? dense + b * D : emb + (b * F + (k) - 1) * D)
        for (d = 0; d < D; d++) { o[d] = dense[b * D + d]; gd[b * D + d] += gg[d]; }
        o += D; gg += D;
        for (i = 1; i <= F; i++)
            for (j = 0; j < i; j++) {
                const float *x = VEC(i), *y = VEC(j);
                float s = 0, gs = *gg++;
                float *gx = ge + (b * F + i - 1) * D, *gy = j == 0 ? gd + b * D : ge + (b * F + j - 1) * D;
                for (d = 0; d < D; d++) s += x[d] * y[d];
                *o++ = s;
                for (d = 0; d < D; d++) gx[d] += gs * y[d];
                for (d = 0; d < D; d++) gy[d] += gs * x[d];
            }
#undef VEC
    }
}

static void test_dot(void) {
    static const int64_t shapes[][3] = {{3, 1, 1}, {2, 3, 5}, {4, 4, 16}, {3, 26, 16}, {2, 7, 13}, {2, 5, 37}, {1, 0, 3},
                                        {2, 40, 16}, {2, 33, 20}, {3, 26, 7}, {1, 2, 36}};
    int s;
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int64_t B = shapes[s][0], F = shapes[s][1], D = shapes[s][2], W = D + (F + 1) * F / 2, i;
        float *dense = (float *)malloc(sizeof(float) * (size_t)(B * D)), *emb = (float *)malloc(sizeof(float) * (size_t)(B * F * D + 1));
        float *g = (float *)malloc(sizeof(float) * (size_t)(B * W)), *o[3], *gd[3], *ge[3];
        char name[96];
        int v;
        for (v = 0; v < 3; v++) {
            o[v] = (float *)malloc(sizeof(float) * (size_t)(B * W));
            gd[v] = (float *)malloc(sizeof(float) * (size_t)(B * D));
            ge[v] = (float *)malloc(sizeof(float) * (size_t)(B * F * D + 1));
        }
        for (i = 0; i < B * D; i++) dense[i] = dt_rng_normal(31, (uint64_t)s, (uint64_t)i);
        for (i = 0; i < B * F * D; i++) emb[i] = dt_rng_normal(32, (uint64_t)s, (uint64_t)i);
        for (i = 0; i < B * W; i++) g[i] = dt_rng_normal(33, (uint64_t)s, (uint64_t)i);
        for (v = 0; v < 3; v++) { /* grads start nonzero: they accumulate */
            for (i = 0; i < B * D; i++) gd[v][i] = 0.25f * dense[i];
            for (i = 0; i < B * F * D; i++) ge[v][i] = -0.5f * emb[i];
        }
        dot_ref(o[0], gd[0], ge[0], dense, emb, g, B, F, D);
        if (esc_dot(&C, o[1], gd[1], ge[1], dense, emb, g, B, F, D)) dt_test_fail("dot_simd_run", "%s", dt_ctx_error(&C));
        if (nosimd_dot(o[2], gd[2], ge[2], dense, emb, g, B, F, D)) dt_test_fail("dot_nosimd_run", "status");
        for (v = 1; v < 3; v++) {
            const char *who = v == 1 ? "simd" : "plain_c";
            snprintf(name, sizeof name, "dot_fwd_%s_equals_loops_B%lld_F%lld_D%lld", who, (long long)B, (long long)F, (long long)D);
            same_bits(name, o[v], o[0], B * W);
            snprintf(name, sizeof name, "dot_bwd_ddense_%s_equals_loops_B%lld_F%lld_D%lld", who, (long long)B, (long long)F, (long long)D);
            same_bits(name, gd[v], gd[0], B * D);
            snprintf(name, sizeof name, "dot_bwd_demb_%s_equals_loops_B%lld_F%lld_D%lld", who, (long long)B, (long long)F, (long long)D);
            same_bits(name, ge[v], ge[0], B * F * D);
        }
        for (v = 0; v < 3; v++) { free(o[v]); free(gd[v]); free(ge[v]); }
        free(dense); free(emb); free(g);
    }
}

static void test_dot_bad(void) {
    dt_tensor a, b, o;
    dt_tensor_desc td;
    dt_status st;
    memset(&td, 0, sizeof td);
    td.ndim = 2; td.shape[0] = 2; td.shape[1] = 4;
    if (dt_tensor_create(&C, &a, &td)) exit(2);
    td.ndim = 3; td.shape[1] = 3; td.shape[2] = 4;
    if (dt_tensor_create(&C, &b, &td)) exit(2);
    td.ndim = 2; td.shape[1] = 9; td.shape[2] = 0; /* expected 4 + 6 = 10 */
    if (dt_tensor_create(&C, &o, &td)) exit(2);
    st = dt_dot_interaction_fwd(&C, &o, &a, &b);
    dt_test_error("dot_fwd_bad_out_width_is_named", st, dt_ctx_error(&C), "out.shape[1]");
    dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &o);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    test_training_twin();
    test_pool_and_update_by_hand();
    test_dot();
    test_dot_bad();
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
