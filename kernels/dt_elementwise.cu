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
        /* "cudaErrorInvalidValue: invalid argument"; each host thread's last 4 answers stay valid
           (two in one printf each print their own) */
        static thread_local char buf[4][192];
        static thread_local unsigned next;
        char *b = buf[next++ % 4];
        snprintf(b, sizeof buf[0], "%s: %s", cudaGetErrorName((cudaError_t)status),
                 cudaGetErrorString((cudaError_t)status));
        return b;
    }
}

/* n >= 0, and rows * C fits: else cudaErrorInvalidValue (the CPU op would say why). */
static int dt_k__size_ok(int64_t rows, int64_t C) {
    return rows >= 0 && C >= 0 && (C == 0 || rows <= INT64_MAX / C);
}

#define DT_K__GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
/* The same from element `from` on: the scalar tail after a vector loop. */
#define DT_K__GRID_STRIDE_FROM(i, from, n)                                                               \
    for (int64_t i = (from) + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                     \
         i += (int64_t)gridDim.x * blockDim.x)

/* Launches kernel over n items, or nothing for n == 0. */
#define DT_K__LAUNCH_N(kernel, n, stream, ...)                                                           \
    do {                                                                                                 \
        if ((n) < 0) return (int)cudaErrorInvalidValue;                                                  \
        if ((n) == 0) return 0;                                                                          \
        DT_K_LAUNCH(kernel, dt_k__blocks((n), DT_K__THREADS, DT_K__MAX_BLOCKS), DT_K__THREADS, 0, stream, \
                    __VA_ARGS__);                                                                        \
        return DT_K_CHECK();                                                                             \
    } while (0)

/* The memory-bound kernels move 16 bytes per load and store (float4) when every pointer they get
   is 16-byte aligned (vec = 1: the launcher checks, so the branch is the same for the whole
   grid): n / 4 vector steps, then the n % 4 tail one element at a time. A view at an odd offset
   takes the scalar path (vec = 0). Both paths do each element's own scalar arithmetic (the lanes
   below), so the bits do not depend on the path. The grid covers n / 4 items on the vector path.
   given: the launcher's pointers are non-NULL (NULL with n > 0 would fault inside the kernel). */
#define DT_K__LAUNCH_V(kernel, n, vec, given, stream, ...)                                               \
    do {                                                                                                 \
        if ((n) < 0 || ((n) > 0 && !(given))) return (int)cudaErrorInvalidValue;                        \
        if ((n) == 0) return 0;                                                                          \
        DT_K_LAUNCH(kernel, dt_k__blocks((vec) ? dt_k__ceil_div((n), 4) : (n), DT_K__THREADS, DT_K__MAX_BLOCKS), \
                    DT_K__THREADS, 0, stream, __VA_ARGS__);                                              \
        return DT_K_CHECK();                                                                             \
    } while (0)

static int dt_k__vec3(const void *a, const void *b, const void *c) {
    return dt_k_aligned(a, 16) && dt_k_aligned(b, 16) && dt_k_aligned(c, 16);
}

/* f applied lane by lane. */
template <typename F> static __device__ __forceinline__ float4 dt_k__lanes(F f, float4 a) {
    return make_float4(f(a.x), f(a.y), f(a.z), f(a.w));
}
template <typename F> static __device__ __forceinline__ float4 dt_k__lanes(F f, float4 a, float4 b) {
    return make_float4(f(a.x, b.x), f(a.y, b.y), f(a.z, b.z), f(a.w, b.w));
}
template <typename F> static __device__ __forceinline__ float4 dt_k__lanes(F f, float4 a, float4 b, float4 c) {
    return make_float4(f(a.x, b.x, c.x), f(a.y, b.y, c.y), f(a.z, b.z, c.z), f(a.w, b.w, c.w));
}

/* ---------------------------------------------------------------- bias */

/* vec: out and bias aligned and C % 4 == 0, so the 4 elements of a step are in one row and
   their 4 biases are one aligned float4. */
__global__ void dt_k__bias_add_fwd(float *out, const float *__restrict__ bias, int64_t n, int64_t C, int vec) {
    auto f = [](float o, float b) { return o + b; };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4)
        dt_k_store4(out + 4 * i, dt_k__lanes(f, dt_k_load4(out + 4 * i), dt_k_load4(bias + (4 * i) % C)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) out[i] = f(out[i], bias[i % C]);
}

/* Column sums in two stages (a grid-wide sum is two launches), the same bits every run: stage 1,
   block (x, y) sums the DT_K_COLSUM_ROWS rows of chunk y for its columns, one thread per column,
   row by row (a warp reads 32 consecutive floats of a row), into part[y, c]; stage 2, one thread
   per column adds the partials in chunk order and adds the total to dbias. In float: the sum of
   n terms is within ((R - 1) + (nchunks - 1) + 1) u sum|dout| of the exact one (R rows a chunk,
   u = 2^-24; about 200 u at 8192 rows), far inside the noise of a gradient, and half the bytes of
   double partials. With one chunk, stage 1 adds into dbias itself (the same bits). */
#define DT_K_COLSUM_ROWS 64

static __host__ __device__ __forceinline__ int64_t dt_k__colsum_chunks(int64_t rows) {
    return (rows + DT_K_COLSUM_ROWS - 1) / DT_K_COLSUM_ROWS;
}

__global__ void dt_k__bias_add_bwd_part(float *part, int direct, const float *__restrict__ dout, int64_t rows,
                                        int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nchunks = dt_k__colsum_chunks(rows);
    if (c >= C) return;
    for (int64_t k = blockIdx.y; k < nchunks; k += gridDim.y) {
        int64_t r0 = k * DT_K_COLSUM_ROWS, r1 = r0 + DT_K_COLSUM_ROWS < rows ? r0 + DT_K_COLSUM_ROWS : rows;
        float s = 0.0f;
        for (int64_t r = r0; r < r1; r++) s += dout[r * C + c];
        if (direct) part[c] += s;
        else part[k * C + c] = s;
    }
}

__global__ void dt_k__bias_add_bwd_sum(float *dbias, const float *__restrict__ part, int64_t nchunks, int64_t C) {
    DT_K__GRID_STRIDE(c, C) {
        float s = 0.0f;
        for (int64_t k = 0; k < nchunks; k++) s += part[k * C + c];
        dbias[c] += s;
    }
}

int dt_k_bias_add_fwd(float *out, const float *bias, int64_t rows, int64_t C, void *stream) {
    int vec = C % 4 == 0 && dt_k__vec3(out, bias, NULL);
    if (!dt_k__size_ok(rows, C)) return (int)cudaErrorInvalidValue;
    DT_K__LAUNCH_V(dt_k__bias_add_fwd, rows * C, vec, out && bias, stream, out, bias, rows * C, C, vec);
}

size_t dt_k_bias_add_bwd_scratch(int64_t rows, int64_t C) {
    int64_t nchunks;
    if (rows <= 0 || C <= 0 || rows > INT64_MAX / C) return 0;
    nchunks = dt_k__colsum_chunks(rows);
    return nchunks > 1 ? (size_t)nchunks * (size_t)C * sizeof(float) : 0;
}

int dt_k_bias_add_bwd(float *dbias, const float *dout, int64_t rows, int64_t C, void *scratch, void *stream) {
    int threads, st;
    int64_t nchunks, cols;
    if (!dt_k__size_ok(rows, C)) return (int)cudaErrorInvalidValue;
    if (rows == 0 || C == 0) return 0;
    if (!dbias || !dout || (dt_k_bias_add_bwd_scratch(rows, C) && !scratch)) return (int)cudaErrorInvalidValue;
    threads = C >= 256 ? 256 : (int)((C + 31) / 32 * 32);
    nchunks = dt_k__colsum_chunks(rows), cols = (C + threads - 1) / threads;
    if (cols > 2147483647) return (int)cudaErrorInvalidValue; /* gridDim.x */
    if (nchunks == 1) {
        DT_K_LAUNCH(dt_k__bias_add_bwd_part, dim3((unsigned int)cols, 1), threads, 0, stream, dbias, 1, dout, rows, C);
        return DT_K_CHECK();
    }
    DT_K_LAUNCH(dt_k__bias_add_bwd_part, dim3((unsigned int)cols, nchunks > 65535 ? 65535u : (unsigned int)nchunks),
                threads, 0, stream, (float *)scratch, 0, dout, rows, C);
    if ((st = DT_K_CHECK())) return st;
    DT_K__LAUNCH_N(dt_k__bias_add_bwd_sum, C, stream, dbias, (const float *)scratch, nchunks, C);
}

/* ---------------------------------------------------------------- activations */

/* NaN passes through relu, forward and backward, as on the CPU (and in PyTorch). */
static __device__ __forceinline__ float dt_k__relu(float v) { return v > 0.0f || v != v ? v : 0.0f; }
static __device__ __forceinline__ float dt_k__relu_grad(float g, float v) { return v > 0.0f || v != v ? g : 0.0f; }
/* GELU's tanh form as the CPU evaluates it, v s with s = (1 + tanh u) / 2 = 1 / (1 + e^-2u), from
   a = e^-2|u| <= 1 (so nothing overflows and nothing cancels: 1 + tanh u and 1 - tanh^2 u lose
   their relative precision for u < -2 when taken from tanhf); the gradient is s + 2 v s (1 - s) u',
   s (1 - s) = a / (1 + a)^2. */
static __device__ __forceinline__ float dt_k__gelu_s(float u, float *s1ms) {
    float a = expf(-2.0f * fabsf(u)), r = 1.0f / (1.0f + a);
    if (s1ms) *s1ms = a * r * r;
    return u >= 0.0f ? r : a * r;
}
static __device__ __forceinline__ float dt_k__gelu(float v) {
    return v * dt_k__gelu_s(DT_K__GELU_S * (v + 0.044715f * v * v * v), NULL);
}
static __device__ __forceinline__ float dt_k__gelu_grad(float g, float v) {
    float sm, s = dt_k__gelu_s(DT_K__GELU_S * (v + 0.044715f * v * v * v), &sm);
    return (s + 2.0f * v * sm * DT_K__GELU_S * (1.0f + 3.0f * 0.044715f * v * v)) * g;
}

__global__ void dt_k__relu_fwd(float *out, const float *x, int64_t n, int vec) {
    auto f = [](float v) { return dt_k__relu(v); };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) dt_k_store4(out + 4 * i, dt_k__lanes(f, dt_k_load4(x + 4 * i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) out[i] = f(x[i]);
}

__global__ void dt_k__relu_bwd(float *dx, const float *__restrict__ dout, const float *__restrict__ x, int64_t n,
                               int vec) {
    auto f = [](float d, float g, float v) { return d + dt_k__relu_grad(g, v); };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4)
        dt_k_store4(dx + 4 * i,
                    dt_k__lanes(f, dt_k_load4(dx + 4 * i), dt_k_load4(dout + 4 * i), dt_k_load4(x + 4 * i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) dx[i] = f(dx[i], dout[i], x[i]);
}

__global__ void dt_k__gelu_fwd(float *out, const float *x, int64_t n, int vec) {
    auto f = [](float v) { return dt_k__gelu(v); };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) dt_k_store4(out + 4 * i, dt_k__lanes(f, dt_k_load4(x + 4 * i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) out[i] = f(x[i]);
}

__global__ void dt_k__gelu_bwd(float *dx, const float *__restrict__ dout, const float *__restrict__ x, int64_t n,
                               int vec) {
    auto f = [](float d, float g, float v) { return d + dt_k__gelu_grad(g, v); };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4)
        dt_k_store4(dx + 4 * i,
                    dt_k__lanes(f, dt_k_load4(dx + 4 * i), dt_k_load4(dout + 4 * i), dt_k_load4(x + 4 * i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) dx[i] = f(dx[i], dout[i], x[i]);
}

int dt_k_relu_fwd(float *out, const float *x, int64_t n, void *stream) {
    int vec = dt_k__vec3(out, x, NULL);
    DT_K__LAUNCH_V(dt_k__relu_fwd, n, vec, out && x, stream, out, x, n, vec);
}
int dt_k_relu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream) {
    int vec = dt_k__vec3(dx, dout, x);
    DT_K__LAUNCH_V(dt_k__relu_bwd, n, vec, dx && dout && x, stream, dx, dout, x, n, vec);
}
int dt_k_gelu_fwd(float *out, const float *x, int64_t n, void *stream) {
    int vec = dt_k__vec3(out, x, NULL);
    DT_K__LAUNCH_V(dt_k__gelu_fwd, n, vec, out && x, stream, out, x, n, vec);
}
int dt_k_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n, void *stream) {
    int vec = dt_k__vec3(dx, dout, x);
    DT_K__LAUNCH_V(dt_k__gelu_bwd, n, vec, dx && dout && x, stream, dx, dout, x, n, vec);
}

/* ---------------------------------------------------------------- add, axpy, mul */

/* No __restrict__ where the CPU op lets the output alias an input: each thread reads its
   elements before it writes them, on both paths. */
__global__ void dt_k__add(float *out, const float *a, const float *b, int64_t n, int vec) {
    auto f = [](float p, float q) { return p + q; };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) dt_k_store4(out + 4 * i, dt_k__lanes(f, dt_k_load4(a + 4 * i), dt_k_load4(b + 4 * i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) out[i] = f(a[i], b[i]);
}
__global__ void dt_k__axpy(float *y, float alpha, const float *x, int64_t n, int vec) {
    auto f = [alpha](float p, float q) { return p + alpha * q; };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) dt_k_store4(y + 4 * i, dt_k__lanes(f, dt_k_load4(y + 4 * i), dt_k_load4(x + 4 * i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) y[i] = f(y[i], x[i]);
}
__global__ void dt_k__mul_fwd(float *out, const float *a, const float *b, int64_t n, int vec) {
    auto f = [](float p, float q) { return p * q; };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) dt_k_store4(out + 4 * i, dt_k__lanes(f, dt_k_load4(a + 4 * i), dt_k_load4(b + 4 * i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) out[i] = f(a[i], b[i]);
}
/* da first, then db, per element: with da == db both terms land in the CPU's order (the vector
   path stores da's 4 before it loads db's). */
__global__ void dt_k__mul_bwd(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n,
                              int vec) {
    auto f = [](float acc, float g, float v) { return acc + g * v; };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) {
        float4 g = dt_k_load4(dout + 4 * i);
        if (da) dt_k_store4(da + 4 * i, dt_k__lanes(f, dt_k_load4(da + 4 * i), g, dt_k_load4(b + 4 * i)));
        if (db) dt_k_store4(db + 4 * i, dt_k__lanes(f, dt_k_load4(db + 4 * i), g, dt_k_load4(a + 4 * i)));
    }
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) {
        if (da) da[i] = f(da[i], dout[i], b[i]);
        if (db) db[i] = f(db[i], dout[i], a[i]);
    }
}

int dt_k_add(float *out, const float *a, const float *b, int64_t n, void *stream) {
    int vec = dt_k__vec3(out, a, b);
    DT_K__LAUNCH_V(dt_k__add, n, vec, out && a && b, stream, out, a, b, n, vec);
}
int dt_k_axpy(float *y, float alpha, const float *x, int64_t n, void *stream) {
    int vec = dt_k__vec3(y, x, NULL);
    DT_K__LAUNCH_V(dt_k__axpy, n, vec, y && x, stream, y, alpha, x, n, vec);
}
int dt_k_mul_fwd(float *out, const float *a, const float *b, int64_t n, void *stream) {
    int vec = dt_k__vec3(out, a, b);
    DT_K__LAUNCH_V(dt_k__mul_fwd, n, vec, out && a && b, stream, out, a, b, n, vec);
}
int dt_k_mul_bwd(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n, void *stream) {
    int vec = dt_k__vec3(da, db, dout) && dt_k__vec3(a, b, NULL);
    if (!da && !db) return n < 0 ? (int)cudaErrorInvalidValue : 0;
    DT_K__LAUNCH_V(dt_k__mul_bwd, n, vec, dout && (!da || b) && (!db || a), stream, da, db, dout, a, b, n, vec);
}

/* ---------------------------------------------------------------- casts */

enum { DT_K__F32 = 1, DT_K__BF16 = 2, DT_K__F16 = 3 }; /* dt_dtype's values */

static __device__ __forceinline__ float dt_k__from16(uint16_t h, int dtype) {
    return dtype == DT_K__BF16 ? dt_k_bf16_to_f32(h) : dt_k_f16_to_f32(h);
}
static __device__ __forceinline__ uint16_t dt_k__to16(float f, int dtype) {
    return dtype == DT_K__BF16 ? dt_k_f32_to_bf16(f) : dt_k_f32_to_f16(f);
}

/* The vector path moves 4 elements a step: a float4 on the f32 side, a uint2 (4 x 16 bits, the
   first element in the low half of .x, as memory holds them) on the 16-bit side. */
__global__ void dt_k__cast(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n, int vec) {
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) {
        float4 f;
        if (src_dtype == DT_K__F32) f = dt_k_load4((const float *)src + 4 * i);
        else {
            uint2 h = dt_k_load_vec<uint2>((const uint16_t *)src + 4 * i);
            f = make_float4(dt_k__from16((uint16_t)h.x, src_dtype), dt_k__from16((uint16_t)(h.x >> 16), src_dtype),
                            dt_k__from16((uint16_t)h.y, src_dtype), dt_k__from16((uint16_t)(h.y >> 16), src_dtype));
        }
        if (dst_dtype == DT_K__F32) dt_k_store4((float *)dst + 4 * i, f);
        else {
            uint2 h;
            h.x = (unsigned int)dt_k__to16(f.x, dst_dtype) | (unsigned int)dt_k__to16(f.y, dst_dtype) << 16;
            h.y = (unsigned int)dt_k__to16(f.z, dst_dtype) | (unsigned int)dt_k__to16(f.w, dst_dtype) << 16;
            dt_k_store_vec<uint2>((uint16_t *)dst + 4 * i, h);
        }
    }
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) {
        float f = src_dtype == DT_K__F32 ? ((const float *)src)[i]
                                         : dt_k__from16(((const uint16_t *)src)[i], src_dtype);
        if (dst_dtype == DT_K__F32) ((float *)dst)[i] = f;
        else ((uint16_t *)dst)[i] = dt_k__to16(f, dst_dtype);
    }
}

int dt_k_tensor_cast(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n, void *stream) {
    int vec;
    if (dst_dtype < DT_K__F32 || dst_dtype > DT_K__F16 || src_dtype < DT_K__F32 || src_dtype > DT_K__F16 || n < 0)
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    if (dst_dtype == src_dtype) { /* a copy, every bit kept (NaN payloads too) */
        size_t elem = dst_dtype == DT_K__F32 ? 4 : 2;
        if ((uint64_t)n > SIZE_MAX / elem || !dst || !src) return (int)cudaErrorInvalidValue;
        if (dst == src) return 0;
        return (int)cudaMemcpyAsync(dst, src, (size_t)n * elem, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    }
    vec = dt_k_aligned(dst, dst_dtype == DT_K__F32 ? 16 : 8) && dt_k_aligned(src, src_dtype == DT_K__F32 ? 16 : 8);
    DT_K__LAUNCH_V(dt_k__cast, n, vec, dst && src, stream, dst, dst_dtype, src, src_dtype, n, vec);
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
    if ((elem != 1 && elem != 2 && elem != 4 && elem != 8) || (n > 0 && !p)) return (int)cudaErrorInvalidValue;
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
    if (n < 0 || site <= 0 || (n > 0 && (!word || !ids))) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    while (threads > 32 && (int64_t)threads / 2 >= n) threads /= 2; /* small checks, small blocks (the emulator too) */
    DT_K_LAUNCH(dt_k__check_range, 1, threads, 0, stream, word, ids, ids_i64, n, lo, hi, has_skip, skip, site);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- GELU on bf16 activations

   The same formulas as dt_k__gelu / _grad, with x (and out) f32 or bf16: the forward rounds its
   f32 result once; the backward's dx and dout may be bf16 too (dx + dout gelu'(x) in f32, a
   bf16 dx rounded once: the MLP's pre-activation and its gradient kept in bf16, as llm.c keeps
   them). Four elements a step by 16 bytes on an f32 side, 8 on a bf16 side (dt_k__ld4 /
   dt_k__st4), where every pointer is so aligned. */
static __device__ __forceinline__ float4 dt_k__ld4(const void *p, int dtype, int64_t i4) {
    if (dtype == DT_K__F32) return dt_k_load4((const float *)p + 4 * i4);
    uint2 h = dt_k_load_vec<uint2>((const uint16_t *)p + 4 * i4);
    return make_float4(dt_k_bf16_to_f32((uint16_t)h.x), dt_k_bf16_to_f32((uint16_t)(h.x >> 16)),
                       dt_k_bf16_to_f32((uint16_t)h.y), dt_k_bf16_to_f32((uint16_t)(h.y >> 16)));
}
static __device__ __forceinline__ void dt_k__st4(void *p, int dtype, int64_t i4, float4 f) {
    if (dtype == DT_K__F32) { dt_k_store4((float *)p + 4 * i4, f); return; }
    uint2 h;
    h.x = (unsigned int)dt_k_f32_to_bf16(f.x) | (unsigned int)dt_k_f32_to_bf16(f.y) << 16;
    h.y = (unsigned int)dt_k_f32_to_bf16(f.z) | (unsigned int)dt_k_f32_to_bf16(f.w) << 16;
    dt_k_store_vec<uint2>((uint16_t *)p + 4 * i4, h);
}
static __device__ __forceinline__ float dt_k__ld1(const void *p, int dtype, int64_t i) {
    return dtype == DT_K__F32 ? ((const float *)p)[i] : dt_k_bf16_to_f32(((const uint16_t *)p)[i]);
}

__global__ void dt_k__gelu_fwd_t(void *out, int out_dtype, const void *x, int x_dtype, int64_t n, int vec) {
    auto f = [](float v) { return dt_k__gelu(v); };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4) dt_k__st4(out, out_dtype, i, dt_k__lanes(f, dt_k__ld4(x, x_dtype, i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) {
        float v = f(dt_k__ld1(x, x_dtype, i));
        if (out_dtype == DT_K__F32) ((float *)out)[i] = v;
        else ((uint16_t *)out)[i] = dt_k_f32_to_bf16(v);
    }
}

__global__ void dt_k__gelu_bwd_t(void *dx, int dx_dtype, const void *dout, int dout_dtype, const void *x,
                                 int x_dtype, int64_t n, int vec) {
    auto f = [](float d, float g, float v) { return d + dt_k__gelu_grad(g, v); };
    int64_t n4 = vec ? n / 4 : 0;
    DT_K__GRID_STRIDE(i, n4)
        dt_k__st4(dx, dx_dtype, i, dt_k__lanes(f, dt_k__ld4(dx, dx_dtype, i), dt_k__ld4(dout, dout_dtype, i),
                                               dt_k__ld4(x, x_dtype, i)));
    DT_K__GRID_STRIDE_FROM(i, 4 * n4, n) {
        float v = f(dt_k__ld1(dx, dx_dtype, i), dt_k__ld1(dout, dout_dtype, i), dt_k__ld1(x, x_dtype, i));
        if (dx_dtype == DT_K__F32) ((float *)dx)[i] = v;
        else ((uint16_t *)dx)[i] = dt_k_f32_to_bf16(v);
    }
}

static int dt_k__act_dtype_ok(int d) { return d == DT_K__F32 || d == DT_K__BF16; }
static int dt_k__aligned_t(const void *p, int dtype) { return !p || dt_k_aligned(p, dtype == DT_K__F32 ? 16 : 8); }

int dt_k_gelu_fwd_t(void *out, int out_dtype, const void *x, int x_dtype, int64_t n, void *stream) {
    int vec;
    if (!dt_k__act_dtype_ok(out_dtype) || !dt_k__act_dtype_ok(x_dtype)) return (int)cudaErrorInvalidValue;
    vec = dt_k__aligned_t(out, out_dtype) && dt_k__aligned_t(x, x_dtype);
    DT_K__LAUNCH_V(dt_k__gelu_fwd_t, n, vec, out && x, stream, out, out_dtype, x, x_dtype, n, vec);
}
int dt_k_gelu_bwd_t(void *dx, int dx_dtype, const void *dout, int dout_dtype, const void *x, int x_dtype, int64_t n,
                    void *stream) {
    int vec;
    if (!dt_k__act_dtype_ok(dx_dtype) || !dt_k__act_dtype_ok(dout_dtype) || !dt_k__act_dtype_ok(x_dtype))
        return (int)cudaErrorInvalidValue;
    vec = dt_k__aligned_t(dx, dx_dtype) && dt_k__aligned_t(dout, dout_dtype) && dt_k__aligned_t(x, x_dtype);
    DT_K__LAUNCH_V(dt_k__gelu_bwd_t, n, vec, dx && dout && x, stream, dx, dx_dtype, dout, dout_dtype, x, x_dtype, n,
                   vec);
}
