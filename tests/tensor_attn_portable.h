/* tests/tensor_attn_portable.h - dt_attention_fwd/_bwd from a second copy of dt_tensor.h built
   without DT_CBLAS (tests/tensor_attn_portable.c): the same ops on dt's blocked GEMM. Raw arrays
   in and out; qkv [B,T,3C], out [B,T,C], att [B,H,T,T]. Each returns the dt_status. */
#ifndef TENSOR_ATTN_PORTABLE_H
#define TENSOR_ATTN_PORTABLE_H
#include <stdint.h>
int portable_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C, int H);
int portable_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int64_t B,
                           int64_t T, int64_t C, int H);
void portable_shutdown(void); /* gives the ctx back (and its scratch) */
#endif
