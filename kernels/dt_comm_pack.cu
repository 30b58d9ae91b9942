/* kernels/dt_comm_pack.cu - packing for communication: many (src, dst, n) copies in one launch
   (gradient buckets: parameter ranges into one contiguous buffer and back, optionally scaled
   by 1 / world after an all-reduce), and rank-major blocks of a column-sharded matrix (what an
   all-to-all sends and receives).

   One launch instead of one cudaMemcpyAsync per range: a bucket of 25 MB of small parameters
   (biases, norms) is hundreds of ranges, and each memcpy call costs a few microseconds of host
   time. blockIdx.y walks the copies, blockIdx.x and the threads the elements of one copy. */
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

static __global__ void dt_k__copies_scaled(float *dst, const float *src, const int64_t *dst_off, const int64_t *src_off,
                                    const int64_t *len, int n_copies, float alpha) {
    int c;
    for (c = blockIdx.y; c < n_copies; c += gridDim.y) {
        int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = len[c];
        float *d = dst + dst_off[c];
        const float *s = src + src_off[c];
        for (; e < n; e += (int64_t)gridDim.x * blockDim.x) d[e] = alpha * s[e];
    }
}

extern "C" int dt_k_comm_copies(void *dst, const void *src, const int64_t *dst_off, const int64_t *src_off,
                                const int64_t *len, int n_copies, int64_t max_len, int elem_bytes, int is_f32,
                                float alpha, void *stream) {
    int64_t gx = (max_len + 128 * 8 - 1) / (128 * 8);
    dim3 grid((unsigned)(gx > 1024 ? 1024 : gx < 1 ? 1 : gx), n_copies < 65535 ? (unsigned)n_copies : 65535u);
    if (n_copies < 0 || max_len < 0 || (is_f32 != 0 && is_f32 != 1) || (is_f32 && elem_bytes != 4) ||
        (!is_f32 && alpha != 1.0f) || (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8))
        return (int)cudaErrorInvalidValue;
    if (n_copies == 0 || max_len == 0) return 0;
    if (is_f32 && alpha != 1.0f)
        DT_K_LAUNCH(dt_k__copies_scaled, grid, 128, 0, stream, (float *)dst, (const float *)src, dst_off, src_off, len,
                    n_copies, alpha);
    else if (elem_bytes == 8)
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

/* Element (r, c) of the [rows, cols] matrix <-> its place in rank k's block (k owns columns
   [k*cols/W, (k+1)*cols/W)): block k starts at rows * c0_k and is [rows, c1_k - c0_k]. */
template <typename T>
static __global__ void dt_k__shard_blocks(T *dst, const T *src, int64_t rows, int64_t cols, int W, int pack) {
    int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; x < rows * cols; x += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = x / cols, c = x % cols, c0, c1, y;
        int k = (int)(c * W / cols); /* a guess within one of the owner; fixed below */
        while (k > 0 && cols * k / W > c) k--;
        while (k + 1 < W && cols * (k + 1) / W <= c) k++;
        c0 = cols * k / W;
        c1 = cols * (k + 1) / W;
        y = rows * c0 + r * (c1 - c0) + (c - c0);
        if (pack) dst[y] = src[x];
        else dst[x] = src[y];
    }
}

static int dt_k__shard_blocks_launch(void *dst, const void *src, int64_t rows, int64_t cols, int W, int elem_bytes,
                               int pack, void *stream) {
    int64_t n, b;
    if (rows < 0 || cols < 0 || W < 1 || (cols > 0 && rows > INT64_MAX / cols) || cols > INT64_MAX / W ||
        (elem_bytes != 2 && elem_bytes != 4 && elem_bytes != 8))
        return (int)cudaErrorInvalidValue;
    n = rows * cols;
    if (n == 0) return 0;
    b = (n + 255) / 256;
    if (b > 65535) b = 65535;
    if (elem_bytes == 8)
        DT_K_LAUNCH(dt_k__shard_blocks<uint64_t>, (unsigned)b, 256, 0, stream, (uint64_t *)dst, (const uint64_t *)src, rows,
                    cols, W, pack);
    else if (elem_bytes == 4)
        DT_K_LAUNCH(dt_k__shard_blocks<uint32_t>, (unsigned)b, 256, 0, stream, (uint32_t *)dst, (const uint32_t *)src, rows,
                    cols, W, pack);
    else
        DT_K_LAUNCH(dt_k__shard_blocks<uint16_t>, (unsigned)b, 256, 0, stream, (uint16_t *)dst, (const uint16_t *)src, rows,
                    cols, W, pack);
    return DT_K_CHECK();
}

extern "C" int dt_k_comm_pack_blocks(void *dst, const void *src, int64_t rows, int64_t cols, int W, int elem_bytes,
                                     void *stream) {
    return dt_k__shard_blocks_launch(dst, src, rows, cols, W, elem_bytes, 1, stream);
}

extern "C" int dt_k_comm_unpack_blocks(void *dst, const void *src, int64_t rows, int64_t cols, int W, int elem_bytes,
                                       void *stream) {
    return dt_k__shard_blocks_launch(dst, src, rows, cols, W, elem_bytes, 0, stream);
}
