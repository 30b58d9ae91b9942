/* tests/embed_nosimd.h - how tests/test_embed_simd.c reaches the plain-C copy of dt in
   tests/embed_nosimd.c: raw arrays in and out. */
#ifndef EMBED_NOSIMD_H
#define EMBED_NOSIMD_H
#include <stdint.h>
int nosimd_embed_has_sse2(void); /* 0: that copy runs the plain C loops, as it should */
int64_t nosimd_embed_run(float *out); /* esc_run's floats, or -1 */
int nosimd_dot(float *out, float *ddense, float *demb, const float *dense, const float *emb, const float *dout,
               int64_t B, int64_t F, int64_t D);
#endif
