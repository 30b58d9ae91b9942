/* tests/tensor_attn_portable.c - the second copy of dt_tensor.h in tests/test_tensor_attn.c,
   built without DT_CBLAS (the test runner passes -DDT_CBLAS to every unit: undone here), so
   attention's products run on dt's portable blocked GEMM. DT_STATIC, a translation unit of its
   own, built with that test (its "// with:" line), never on its own. */
#define DT_STATIC
#undef DT_CBLAS
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "tensor_attn_portable.h"

static dt_ctx pctx;

static int mk(dt_tensor *t, const float *src, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.ndim = ndim;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2; d.shape[3] = d3;
    if (dt_tensor_create(&pctx, t, &d)) return 1;
    if (src) memcpy(t->data, src, dt_tensor_bytes(t));
    else memset(t->data, 0, dt_tensor_bytes(t));
    return 0;
}

static void out_and_free(dt_tensor *t, float *dst) {
    if (dst) memcpy(dst, t->data, dt_tensor_bytes(t));
    dt_tensor_free(&pctx, t);
}

int portable_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int H) {
    dt_tensor o, a, x;
    int st;
    if (!pctx.initialised) dt_ctx_init(&pctx, NULL);
    if (mk(&o, NULL, 3, B, T, C, 0) || mk(&a, NULL, 4, B, H, T, T) || mk(&x, qkv, 3, B, T, 3 * C, 0)) return 1;
    st = dt_attention_fwd(&pctx, &o, &a, &x, H);
    out_and_free(&o, out); out_and_free(&a, att); out_and_free(&x, NULL);
    return st;
}

int portable_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int64_t B,
                           int64_t T, int64_t C, int H) {
    dt_tensor d, g, x, a;
    int st;
    if (!pctx.initialised) dt_ctx_init(&pctx, NULL);
    if (mk(&d, dqkv, 3, B, T, 3 * C, 0) || mk(&g, dout, 3, B, T, C, 0) || mk(&x, qkv, 3, B, T, 3 * C, 0) ||
        mk(&a, att, 4, B, H, T, T))
        return 1;
    st = dt_attention_bwd(&pctx, &d, &g, &x, &a, H);
    out_and_free(&d, dqkv); out_and_free(&g, NULL); out_and_free(&x, NULL); out_and_free(&a, NULL);
    return st;
}

void portable_shutdown(void) {
    if (pctx.initialised) dt_ctx_shutdown(&pctx);
}
