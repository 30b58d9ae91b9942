/* tests/embed_nosimd.c - the second copy of dt in tests/test_embed_simd.c, built with
   DT_EMBED_NO_SIMD and DT_TENSOR_NO_SIMD (plain C pooling, gradient sums and dot interaction),
   DT_STATIC so it lives beside the SSE2 copy. Built with that test (its "// with:" line), never
   on its own. */
#define DT_STATIC
#ifndef DT_EMBED_NO_SIMD
#define DT_EMBED_NO_SIMD
#endif
#ifndef DT_TENSOR_NO_SIMD
#define DT_TENSOR_NO_SIMD
#endif
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "embed_simd_case.h"
#include "embed_nosimd.h"

int nosimd_embed_has_sse2(void) {
#if defined(DT__EM_SSE2) || defined(DT__TENSOR_SSE2)
    return 1;
#else
    return 0;
#endif
}

int64_t nosimd_embed_run(float *out) {
    dt_ctx c;
    int64_t n;
    if (dt_ctx_init(&c, NULL)) return -1;
    n = esc_run(&c, out);
    if (n < 0) fprintf(stderr, "nosimd_embed_run: %s\n", dt_ctx_error(&c));
    dt_ctx_shutdown(&c);
    return n;
}

int nosimd_dot(float *out, float *ddense, float *demb, const float *dense, const float *emb, const float *dout,
               int64_t B, int64_t F, int64_t D) {
    dt_ctx c;
    int st;
    if (dt_ctx_init(&c, NULL)) return 1;
    st = esc_dot(&c, out, ddense, demb, dense, emb, dout, B, F, D);
    dt_ctx_shutdown(&c);
    return st;
}
