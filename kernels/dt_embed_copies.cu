/* kernels/dt_embed_copies.cu - dt_embed.h's owner side of a CUDA forward: the pooled rows of every
   request moved to their places in the response, many (src, dst, n) copies in one launch
   (kernels/dt_kernels.h, "embedding response copies").

   One launch instead of one cudaMemcpyAsync per request: a forward serves thousands of requests,
   and each memcpy call costs a few microseconds of host time. blockIdx.y walks the copies,
   blockIdx.x and the threads the elements of one copy.            MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <stdint.h>

template <typename T>
static __global__ void dt_k__copies(T *dst, const T *src, const int64_t *dst_off, const int64_t *src_off, const int64_t *len,
                             int n_copies) {
    int c;
    for (c = blockIdx.y; c < n_copies; c += gridDim.y) {
        int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = len[c];
        T *d = dst + dst_off[c];
        const T *s = src + src_off[c];
        for (; e < n; e += (int64_t)gridDim.x * blockDim.x) d[e] = s[e];
    }
}

extern "C" int dt_k_embed_copies(void *dst, const void *src, const int64_t *dst_off, const int64_t *src_off,
                                 const int64_t *len, int n_copies, int64_t max_len, int elem_bytes, void *stream) {
    int64_t gx = max_len < 0 ? 0 : dt_k__ceil_div(max_len, 128 * 8);
    dim3 grid((unsigned)(gx > 1024 ? 1024 : gx < 1 ? 1 : gx), n_copies < 65535 ? (unsigned)n_copies : 65535u);
    if (n_copies < 0 || max_len < 0 || (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8))
        return (int)cudaErrorInvalidValue;
    if (n_copies == 0 || max_len == 0) return 0;
    if (!dst || !src || !dst_off || !src_off || !len) return (int)cudaErrorInvalidValue; /* each copy reads them */
    if (elem_bytes == 8)
        DT_K_LAUNCH(dt_k__copies<uint64_t>, grid, 128, 0, stream, (uint64_t *)dst, (const uint64_t *)src, dst_off,
                    src_off, len, n_copies);
    else if (elem_bytes == 4)
        DT_K_LAUNCH(dt_k__copies<uint32_t>, grid, 128, 0, stream, (uint32_t *)dst, (const uint32_t *)src, dst_off,
                    src_off, len, n_copies);
    else if (elem_bytes == 2)
        DT_K_LAUNCH(dt_k__copies<uint16_t>, grid, 128, 0, stream, (uint16_t *)dst, (const uint16_t *)src, dst_off,
                    src_off, len, n_copies);
    else
        DT_K_LAUNCH(dt_k__copies<uint8_t>, grid, 128, 0, stream, (uint8_t *)dst, (const uint8_t *)src, dst_off,
                    src_off, len, n_copies);
    return DT_K_CHECK();
}
