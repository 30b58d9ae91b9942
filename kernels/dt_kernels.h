/* kernels/dt_kernels.h - the C ABI of dt's CUDA kernels (the .cu files in kernels/). No CUDA types: the dt
   headers call these under DT_CUDA, and a user builds them with
       nvcc -O2 -c kernels/dt_*.cu           (then links the objects with -lcudart -lcublas)
   Every launcher has the name stem of the CPU op it mirrors (dt_layernorm_fwd -> dt_k_layernorm_fwd),
   takes device pointers, sizes and the stream (a cudaStream_t passed as void *, NULL = the default
   stream) last, and returns 0 or the cudaError_t of the failing launch (dt_k_error_string names it).
   Gradients accumulate (+=), as in dt_tensor.h.                       MIT licence (see dt_tensor.h) */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The message of a status these functions return ("cudaErrorInvalidValue: invalid argument"). */
const char *dt_k_error_string(int status);

/* ---------------------------------------------------------------- elementwise and casts */

/* Each as its dt_tensor.h op, on n (or rows x C) floats; out may alias an input where the CPU op
   allows it. bias_add_bwd sums each column in double, row by row: bit for bit the CPU's sum. */
int dt_k_bias_add_fwd(float *out, const float *bias, int64_t rows, int64_t C, void *stream);
int dt_k_bias_add_bwd(float *dbias, const float *dout, int64_t rows, int64_t C, void *stream);
int dt_k_relu_fwd(float *out, const float *x, int64_t n, void *stream);
int dt_k_relu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream);
int dt_k_gelu_fwd(float *out, const float *x, int64_t n, void *stream);
int dt_k_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream);
int dt_k_add(float *out, const float *a, const float *b, int64_t n, void *stream);
int dt_k_scale(float *x, float alpha, int64_t n, void *stream);
int dt_k_axpy(float *y, float alpha, const float *x, int64_t n, void *stream);
int dt_k_mul_fwd(float *out, const float *a, const float *b, int64_t n, void *stream);
/* da or db may be NULL; da == db (a == b, x * x) gets both terms, da's first, as on the CPU. */
int dt_k_mul_bwd(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n, void *stream);
/* dst = (dst_dtype) src for n elements; dtypes are dt_dtype values: DT_F32 = 1, DT_BF16 = 2,
   DT_F16 = 3 (bf16 <-> f16 goes through f32); round to nearest even, NaN stays NaN, as
   dt_tensor_cast. Other dtypes: cudaErrorInvalidValue. */
int dt_k_tensor_cast(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n, void *stream);

/* ---------------------------------------------------------------- reductions and layernorm */

/* *out = sum of x (sumsq: of x * x) in double, like dt_sum / dt_sumsq: blocks sum slices into
   work (DT_K_REDUCE_WORK doubles of device memory), a second pass sums those in a fixed order,
   so the result does not depend on timing. out and work are device pointers. */
#define DT_K_REDUCE_WORK 64
int dt_k_sum(double *out, double *work, const float *x, int64_t n, void *stream);
int dt_k_sumsq(double *out, double *work, const float *x, int64_t n, void *stream);
/* LayerNorm over rows of C (one block per row); mean, rstd and b may be NULL. eps > 0. */
int dt_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                       float eps, int64_t rows, int64_t C, void *stream);
/* dx, dw, db += (each may be NULL); mean and rstd from the forward. dw and db are summed over the
   rows in row order by one thread per column: deterministic, as the CPU's. */
int dt_k_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, int64_t rows, int64_t C, void *stream);

/* ---------------------------------------------------------------- softmax and cross entropy */

/* Fused softmax + cross entropy that never stores the probabilities. logits [rows, V],
   targets i32 [rows]. fwd writes losses[r] = logsumexp(row) - logits[r, t] (0 on a row whose
   target is ignore_index; NaN when the target is outside [0, V), which dt_softmax_xent_fwd
   reports as DT_ERR_RANGE) and lse[r] = the row's logsumexp. The mean loss of the CPU op is
   the sum of losses over n_valid (the rows not ignored).
   bwd: dlogits += dloss / n_valid * (softmax(row) - onehot(target)) on the rows not ignored,
   the softmax recomputed as exp(logits - lse). n_valid = 0 adds nothing. */
int dt_k_softmax_xent_fwd(float *losses, float *lse, const float *logits, const int32_t *targets, int ignore_index,
                          int64_t rows, int64_t V, void *stream);
int dt_k_softmax_xent_bwd(float *dlogits, const float *logits, const float *lse, const int32_t *targets,
                          int ignore_index, float dloss, int64_t n_valid, int64_t rows, int64_t V, void *stream);

/* ---------------------------------------------------------------- attention */

/* ---------------------------------------------------------------- embedding */

/* ---------------------------------------------------------------- optimizer */

/* ---------------------------------------------------------------- comm packing */

#ifdef __cplusplus
}
#endif
#endif /* DT_KERNELS_H */
