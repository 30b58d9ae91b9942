/* tests/tensor_ops_nosimd.h - how tests/test_tensor_ops_simd.c reaches the DT_TENSOR_NO_SIMD
   copy of the ops in tests/tensor_ops_nosimd.c: raw arrays, the same arguments as the ops
   (rows x cols, row-major), a dt_status as int. */
#ifndef TENSOR_OPS_NOSIMD_H
#define TENSOR_OPS_NOSIMD_H
#include <stdint.h>
int nosimd_has_sse2(void); /* 0: that copy was built on the plain C twin, as it should be */
int nosimd_gelu_fwd(float *out, const float *x, int64_t n);
int nosimd_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n);
int nosimd_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                         int64_t rows, int64_t cols, float eps);
int nosimd_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                         const float *mean, const float *rstd, int64_t rows, int64_t cols);
int nosimd_softmax_xent_fwd(float *loss, float *probs, const float *logits, const int32_t *targets, int64_t rows,
                            int64_t cols, int ignore_index);
int nosimd_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int64_t rows, int64_t cols,
                            int ignore_index, float dloss);
void nosimd_shutdown(void);
#endif
