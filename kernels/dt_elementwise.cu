/* kernels/dt_elementwise.cu - elementwise ops and casts (kernels/dt_kernels.h, "elementwise and
   casts"), each the same arithmetic as its dt_tensor.h op, and dt_k_error_string.
   Grid-stride loops over int64_t indices: any n, a bounded grid.      MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"

#include <stdio.h>

#define DT_K__THREADS 256
#define DT_K__MAX_BLOCKS 4096u
#define DT_K__GELU_S 0.7978845608028654f /* sqrt(2 / pi), as dt_tensor.h */

/* The status names: CUDA's, or cuBLAS's (1000 + cublasStatus_t), for dt's error messages. */
const char *dt_k_error_string(int status) {
    switch (status) {
    case 1000: return "CUBLAS_STATUS_SUCCESS";
    case 1001: return "CUBLAS_STATUS_NOT_INITIALIZED: cuBLAS not initialized";
    case 1003: return "CUBLAS_STATUS_ALLOC_FAILED: cuBLAS could not allocate";
    case 1007: return "CUBLAS_STATUS_INVALID_VALUE: invalid argument to cuBLAS";
    case 1008: return "CUBLAS_STATUS_ARCH_MISMATCH: not supported by this GPU";
    case 1011: return "CUBLAS_STATUS_MAPPING_ERROR: cuBLAS could not access GPU memory";
    case 1013: return "CUBLAS_STATUS_EXECUTION_FAILED: the cuBLAS kernel failed";
    case 1014: return "CUBLAS_STATUS_INTERNAL_ERROR: cuBLAS internal error";
    case 1015: return "CUBLAS_STATUS_NOT_SUPPORTED: not supported by cuBLAS";
    case 1016: return "CUBLAS_STATUS_LICENSE_ERROR: cuBLAS licence error";
    default: break;
    }
    if (status >= 1000) return "unknown cuBLAS status";
    {
        /* "cudaErrorInvalidValue: invalid argument"; one buffer per host thread */
        static thread_local char buf[192];
        snprintf(buf, sizeof buf, "%s: %s", cudaGetErrorName((cudaError_t)status),
                 cudaGetErrorString((cudaError_t)status));
        return buf;
    }
}

/* n >= 0, and rows * C fits: else cudaErrorInvalidValue (the CPU op would say why). */
static int dt_k__size_ok(int64_t rows, int64_t C) {
    return rows >= 0 && C >= 0 && (C == 0 || rows <= INT64_MAX / C);
}

#define DT_K__GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* Launches kernel over n items, or nothing for n == 0. */
#define DT_K__LAUNCH_N(kernel, n, stream, ...)                                                           \
    do {                                                                                                 \
        if ((n) < 0) return (int)cudaErrorInvalidValue;                                                  \
        if ((n) == 0) return 0;                                                                          \
        DT_K_LAUNCH(kernel, dt_k__blocks((n), DT_K__THREADS, DT_K__MAX_BLOCKS), DT_K__THREADS, 0, stream, \
                    __VA_ARGS__);                                                                        \
        return DT_K_CHECK();                                                                             \
    } while (0)

/* ---------------------------------------------------------------- bias */

__global__ void dt_k__bias_add_fwd(float *out, const float *__restrict__ bias, int64_t n, int64_t C) {
    DT_K__GRID_STRIDE(i, n) out[i] += bias[i % C];
}

/* One thread per column, rows in order, in double: the CPU's sum exactly. */
__global__ void dt_k__bias_add_bwd(float *dbias, const float *__restrict__ dout, int64_t rows, int64_t C) {
    DT_K__GRID_STRIDE(c, C) {
        double s = 0;
        for (int64_t r = 0; r < rows; r++) s += dout[r * C + c];
        dbias[c] += (float)s;
    }
}

int dt_k_bias_add_fwd(float *out, const float *bias, int64_t rows, int64_t C, void *stream) {
    if (!dt_k__size_ok(rows, C)) return (int)cudaErrorInvalidValue;
    DT_K__LAUNCH_N(dt_k__bias_add_fwd, rows * C, stream, out, bias, rows * C, C);
}

int dt_k_bias_add_bwd(float *dbias, const float *dout, int64_t rows, int64_t C, void *stream) {
    if (!dt_k__size_ok(rows, C)) return (int)cudaErrorInvalidValue;
    DT_K__LAUNCH_N(dt_k__bias_add_bwd, C, stream, dbias, dout, rows, C);
}

/* ---------------------------------------------------------------- activations */

/* NaN passes through relu, forward and backward, as on the CPU (and in PyTorch). */
__global__ void dt_k__relu_fwd(float *out, const float *x, int64_t n) {
    DT_K__GRID_STRIDE(i, n) {
        float v = x[i];
        out[i] = v > 0.0f || v != v ? v : 0.0f;
    }
}

__global__ void dt_k__relu_bwd(float *dx, const float *__restrict__ dout, const float *__restrict__ x, int64_t n) {
    DT_K__GRID_STRIDE(i, n) {
        float v = x[i];
        dx[i] += v > 0.0f || v != v ? dout[i] : 0.0f;
    }
}

__global__ void dt_k__gelu_fwd(float *out, const float *x, int64_t n) {
    DT_K__GRID_STRIDE(i, n) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(DT_K__GELU_S * (v + 0.044715f * v * v * v)));
    }
}

__global__ void dt_k__gelu_bwd(float *dx, const float *__restrict__ dout, const float *__restrict__ x, int64_t n) {
    DT_K__GRID_STRIDE(i, n) {
        float v = x[i];
        float u = DT_K__GELU_S * (v + 0.044715f * v * v * v);
        float th = tanhf(u), sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * v * sech2 * DT_K__GELU_S * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] += g * dout[i];
    }
}

int dt_k_relu_fwd(float *out, const float *x, int64_t n, void *stream) {
    DT_K__LAUNCH_N(dt_k__relu_fwd, n, stream, out, x, n);
}
int dt_k_relu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream) {
    DT_K__LAUNCH_N(dt_k__relu_bwd, n, stream, dx, dout, x, n);
}
int dt_k_gelu_fwd(float *out, const float *x, int64_t n, void *stream) {
    DT_K__LAUNCH_N(dt_k__gelu_fwd, n, stream, out, x, n);
}
int dt_k_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream) {
    DT_K__LAUNCH_N(dt_k__gelu_bwd, n, stream, dx, dout, x, n);
}

/* ---------------------------------------------------------------- add, axpy, mul */

/* No __restrict__ where the CPU op lets the output alias an input. */
__global__ void dt_k__add(float *out, const float *a, const float *b, int64_t n) {
    DT_K__GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}
__global__ void dt_k__axpy(float *y, float alpha, const float *x, int64_t n) {
    DT_K__GRID_STRIDE(i, n) y[i] += alpha * x[i];
}
__global__ void dt_k__mul_fwd(float *out, const float *a, const float *b, int64_t n) {
    DT_K__GRID_STRIDE(i, n) out[i] = a[i] * b[i];
}
/* da first, then db, per element: with da == db both terms land in the CPU's order. */
__global__ void dt_k__mul_bwd(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n) {
    DT_K__GRID_STRIDE(i, n) {
        if (da) da[i] += dout[i] * b[i];
        if (db) db[i] += dout[i] * a[i];
    }
}

int dt_k_add(float *out, const float *a, const float *b, int64_t n, void *stream) {
    DT_K__LAUNCH_N(dt_k__add, n, stream, out, a, b, n);
}
int dt_k_axpy(float *y, float alpha, const float *x, int64_t n, void *stream) {
    DT_K__LAUNCH_N(dt_k__axpy, n, stream, y, alpha, x, n);
}
int dt_k_mul_fwd(float *out, const float *a, const float *b, int64_t n, void *stream) {
    DT_K__LAUNCH_N(dt_k__mul_fwd, n, stream, out, a, b, n);
}
int dt_k_mul_bwd(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n, void *stream) {
    if (!da && !db) return n < 0 ? (int)cudaErrorInvalidValue : 0;
    DT_K__LAUNCH_N(dt_k__mul_bwd, n, stream, da, db, dout, a, b, n);
}

/* ---------------------------------------------------------------- casts */

enum { DT_K__F32 = 1, DT_K__BF16 = 2, DT_K__F16 = 3 }; /* dt_dtype's values */

static __device__ __forceinline__ float dt_k__load(const void *p, int dtype, int64_t i) {
    if (dtype == DT_K__F32) return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dtype == DT_K__BF16 ? dt_k_bf16_to_f32(h) : dt_k_f16_to_f32(h);
}

__global__ void dt_k__cast(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n) {
    DT_K__GRID_STRIDE(i, n) {
        float f = dt_k__load(src, src_dtype, i);
        if (dst_dtype == DT_K__F32) ((float *)dst)[i] = f;
        else ((uint16_t *)dst)[i] = dst_dtype == DT_K__BF16 ? dt_k_f32_to_bf16(f) : dt_k_f32_to_f16(f);
    }
}

int dt_k_tensor_cast(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n, void *stream) {
    if (dst_dtype < DT_K__F32 || dst_dtype > DT_K__F16 || src_dtype < DT_K__F32 || src_dtype > DT_K__F16 || n < 0)
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (dst_dtype == src_dtype) { /* a copy, every bit kept (NaN payloads too) */
        size_t elem = dst_dtype == DT_K__F32 ? 4 : 2;
        if ((uint64_t)n > SIZE_MAX / elem) return (int)cudaErrorInvalidValue;
        if (dst == src) return 0;
        return (int)cudaMemcpyAsync(dst, src, (size_t)n * elem, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    }
    DT_K__LAUNCH_N(dt_k__cast, n, stream, dst, dst_dtype, src, src_dtype, n);
}

/* ---------------------------------------------------------------- fill and the device checks */

/* Element i = the `elem`-byte pattern `bits` (elem 1, 2, 4 or 8): dt_tensor_fill of any dtype
   without a host copy (a zero fill is a cudaMemsetAsync and never comes here). */
__global__ void dt_k__fill(void *p, uint64_t bits, int elem, int64_t n) {
    DT_K__GRID_STRIDE(i, n) {
        if (elem == 4) ((uint32_t *)p)[i] = (uint32_t)bits;
        else if (elem == 2) ((uint16_t *)p)[i] = (uint16_t)bits;
        else if (elem == 8) ((uint64_t *)p)[i] = bits;
        else ((uint8_t *)p)[i] = (uint8_t)bits;
    }
}

int dt_k_fill(void *p, uint64_t bits, int elem, int64_t n, void *stream) {
    if (elem != 1 && elem != 2 && elem != 4 && elem != 8) return (int)cudaErrorInvalidValue;
    DT_K__LAUNCH_N(dt_k__fill, n, stream, p, bits, elem, n);
}

/* One block: the smallest i with ids[i] outside [lo, hi) (and != skip when has_skip), found by a
   block-wide minimum, so the index reported does not depend on thread timing. The first failing
   check of a step wins: a later one sees word[0] != 0 and leaves the word alone. Stream order
   makes "later" well defined: one check runs after another. */
#define DT_K__CHECK_THREADS 1024
__global__ void dt_k__check_range(int64_t *word, const void *ids, int ids_i64, int64_t n, int64_t lo, int64_t hi,
                                  int has_skip, int64_t skip, int64_t site) {
    __shared__ int64_t best[DT_K__CHECK_THREADS];
    int64_t mine = INT64_MAX;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        int64_t v = ids_i64 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
        if ((v < lo || v >= hi) && !(has_skip && v == skip)) { mine = i; break; }
    }
    best[threadIdx.x] = mine;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if ((int)threadIdx.x < s && best[threadIdx.x + s] < best[threadIdx.x]) best[threadIdx.x] = best[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0 && best[0] != INT64_MAX && word[0] == 0) {
        int64_t i = best[0];
        word[0] = site;
        word[1] = i;
        word[2] = ids_i64 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
        word[3] = lo;
        word[4] = hi;
    }
}

int dt_k_check_range(int64_t *word, const void *ids, int ids_i64, int64_t n, int64_t lo, int64_t hi, int has_skip,
                     int64_t skip, int64_t site, void *stream) {
    int threads = DT_K__CHECK_THREADS;
    if (n < 0 || site <= 0) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    while (threads > 32 && (int64_t)threads / 2 >= n) threads /= 2; /* small checks, small blocks (the emulator too) */
    DT_K_LAUNCH(dt_k__check_range, 1, threads, 0, stream, word, ids, ids_i64, n, lo, hi, has_skip, skip, site);
    return DT_K_CHECK();
}
