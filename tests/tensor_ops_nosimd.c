/* tests/tensor_ops_nosimd.c - the second copy of dt_tensor.h in tests/test_tensor_ops_simd.c,
   built with DT_TENSOR_NO_SIMD: gelu, layernorm and softmax_xent on the plain C twin of the
   4-lane vectors. A translation unit of its own (DT_STATIC, as a library that vendors dt would
   be), built with that test (its "// with:" line), never on its own. Raw arrays in and out. */
#define DT_STATIC
#ifndef DT_TENSOR_NO_SIMD /* a build may pass it for both units (-DDT_TENSOR_NO_SIMD) */
#define DT_TENSOR_NO_SIMD
#endif
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "tensor_ops_nosimd.h"

static dt_ctx nctx;

/* a [rows, cols] f32 tensor (cols < 0: 1-d of rows) holding a copy of src (may be NULL: zeros) */
static int mk(dt_tensor *t, const float *src, int64_t rows, int64_t cols) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = rows;
    if (cols >= 0) d.shape[1] = cols;
    d.ndim = cols >= 0 ? 2 : 1;
    if (dt_tensor_create(&nctx, t, &d)) return 1;
    if (src) memcpy(t->data, src, dt_tensor_bytes(t));
    else memset(t->data, 0, dt_tensor_bytes(t));
    return 0;
}

static void out_and_free(dt_tensor *t, float *dst) {
    if (dst) memcpy(dst, t->data, dt_tensor_bytes(t));
    dt_tensor_free(&nctx, t);
}

int nosimd_has_sse2(void) {
#ifdef DT__TENSOR_SSE2
    return 1;
#else
    return 0;
#endif
}

int nosimd_gelu_fwd(float *out, const float *x, int64_t n) {
    dt_tensor o, xt;
    int st;
    if (!nctx.initialised) dt_ctx_init(&nctx, NULL);
    if (mk(&o, NULL, n, -1) || mk(&xt, x, n, -1)) return 1;
    st = dt_gelu_fwd(&nctx, &o, &xt);
    out_and_free(&o, out); out_and_free(&xt, NULL);
    return st;
}

int nosimd_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n) {
    dt_tensor d, g, xt;
    int st;
    if (!nctx.initialised) dt_ctx_init(&nctx, NULL);
    if (mk(&d, dx, n, -1) || mk(&g, dout, n, -1) || mk(&xt, x, n, -1)) return 1;
    st = dt_gelu_bwd(&nctx, &d, &g, &xt);
    out_and_free(&d, dx); out_and_free(&g, NULL); out_and_free(&xt, NULL);
    return st;
}

int nosimd_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                         int64_t rows, int64_t cols, float eps) {
    dt_tensor o, m, r, xt, wt, bt;
    int st;
    if (!nctx.initialised) dt_ctx_init(&nctx, NULL);
    if (mk(&o, NULL, rows, cols) || mk(&m, NULL, rows, -1) || mk(&r, NULL, rows, -1) || mk(&xt, x, rows, cols) ||
        mk(&wt, w, cols, -1) || mk(&bt, b, cols, -1))
        return 1;
    st = dt_layernorm_fwd(&nctx, &o, &m, &r, &xt, &wt, &bt, eps);
    out_and_free(&o, out); out_and_free(&m, mean); out_and_free(&r, rstd);
    out_and_free(&xt, NULL); out_and_free(&wt, NULL); out_and_free(&bt, NULL);
    return st;
}

int nosimd_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                         const float *mean, const float *rstd, int64_t rows, int64_t cols) {
    dt_tensor d, dwt, dbt, g, xt, wt, m, r;
    int st;
    if (!nctx.initialised) dt_ctx_init(&nctx, NULL);
    if (mk(&d, dx, rows, cols) || mk(&dwt, dw, cols, -1) || mk(&dbt, db, cols, -1) || mk(&g, dout, rows, cols) ||
        mk(&xt, x, rows, cols) || mk(&wt, w, cols, -1) || mk(&m, mean, rows, -1) || mk(&r, rstd, rows, -1))
        return 1;
    st = dt_layernorm_bwd(&nctx, &d, &dwt, &dbt, &g, &xt, &wt, &m, &r);
    out_and_free(&d, dx); out_and_free(&dwt, dw); out_and_free(&dbt, db);
    out_and_free(&g, NULL); out_and_free(&xt, NULL); out_and_free(&wt, NULL); out_and_free(&m, NULL);
    out_and_free(&r, NULL);
    return st;
}

int nosimd_softmax_xent_fwd(float *loss, float *probs, const float *logits, const int32_t *targets, int64_t rows,
                            int64_t cols, int ignore_index) {
    dt_tensor p, z, t;
    dt_tensor_desc d;
    int st;
    if (!nctx.initialised) dt_ctx_init(&nctx, NULL);
    memset(&d, 0, sizeof d);
    d.dtype = DT_I32; d.shape[0] = rows; d.ndim = 1;
    if (mk(&p, NULL, rows, cols) || mk(&z, logits, rows, cols) || dt_tensor_create(&nctx, &t, &d)) return 1;
    memcpy(t.data, targets, dt_tensor_bytes(&t));
    st = dt_softmax_xent_fwd(&nctx, loss, NULL, &p, &z, &t, ignore_index);
    out_and_free(&p, probs); out_and_free(&z, NULL); dt_tensor_free(&nctx, &t);
    return st;
}

int nosimd_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int64_t rows, int64_t cols,
                            int ignore_index, float dloss) {
    dt_tensor g, p, t;
    dt_tensor_desc d;
    int st;
    if (!nctx.initialised) dt_ctx_init(&nctx, NULL);
    memset(&d, 0, sizeof d);
    d.dtype = DT_I32; d.shape[0] = rows; d.ndim = 1;
    if (mk(&g, dlogits, rows, cols) || mk(&p, probs, rows, cols) || dt_tensor_create(&nctx, &t, &d)) return 1;
    memcpy(t.data, targets, dt_tensor_bytes(&t));
    st = dt_softmax_xent_bwd(&nctx, &g, &p, &t, ignore_index, dloss);
    out_and_free(&g, dlogits); out_and_free(&p, NULL); dt_tensor_free(&nctx, &t);
    return st;
}

void nosimd_shutdown(void) {
    if (nctx.initialised) dt_ctx_shutdown(&nctx);
}
