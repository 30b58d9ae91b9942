/* kernels/dt_opt.cu - the optimizer over dt_opt.h's flat arena: fused multi-tensor SGD / AdamW /
   Adagrad (one launch for every parameter), bf16 / f16 values with optional f32 master weights,
   and the grads' one pass (unscale, inf/nan flag, sum of squares for the global norm).

   The update math is dt_sgd_update / dt_adam_update / dt_adagrad_update's, operation for
   operation in the same order, with the per-step scalars computed in double on the host and
   rounded to float once, as there. Each element finds its parameter (segment) by a binary
   search of seg_end: log2(parameters) cached loads, cheaper than one launch per parameter.
   dt_k_grad_pass_lanes, the grads' pass, has the CPU's bits: its sums keep the CPU's four-lane
   order, so they are serial per tensor. */
#include "dt_cuda.cuh"
#include <math.h>
#include <stdint.h>

#define DT_K__OPT_THREADS 256

/* The segment (parameter) that element i belongs to: the first s with i < seg_end[s]. */
__device__ static int dt_k__seg(const int64_t *seg_end, int n_seg, int64_t i) {
    int lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (i < seg_end[mid]) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

__device__ static float dt_k__load_w(const void *w, int dt, const float *master, int64_t i) {
    if (master) return master[i];
    if (dt == 2) return dt_k_bf16_to_f32(((const uint16_t *)w)[i]);
    if (dt == 3) return dt_k_f16_to_f32(((const uint16_t *)w)[i]);
    return ((const float *)w)[i];
}

__device__ static void dt_k__store_w(void *w, int dt, float *master, int64_t i, float x) {
    if (master) master[i] = x;
    if (dt == 2) ((uint16_t *)w)[i] = dt_k_f32_to_bf16(x);
    else if (dt == 3) ((uint16_t *)w)[i] = dt_k_f32_to_f16(x);
    else if (w && (float *)w != master) ((float *)w)[i] = x;
}

/* The per-step scalars, as the CPU functions compute them. */
struct dt_k__sgd { float lrf, mom, damp; int nesterov, first; };
struct dt_k__adam { float step_size, bc2_sqrt, b1, omb1, b2, omb2, epsf; double lr; int decoupled; };
struct dt_k__adagrad { float clr, epsf; };

/* One element of dt_sgd_update (wd is this parameter's weight decay, as (float) there). */
__device__ static float dt_k__step(const dt_k__sgd &k, float w, float g, float wd, float *buf) {
    float d = g;
    if (wd != 0.0f) d += wd * w;
    if (k.mom != 0.0f) {
        float b = k.first ? d : k.mom * *buf + k.damp * d;
        *buf = b;
        d = k.nesterov ? d + k.mom * b : b;
    }
    return w - k.lrf * d;
}

static __global__ void dt_k__sgd_kernel(void *w, int wdt, float *master, const float *__restrict__ g, float *buf, int64_t n,
                                 const int64_t *__restrict__ seg_end, const double *__restrict__ seg_wd, int n_seg,
                                 dt_k__sgd k, float gm, const int *skip) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (skip && *skip) return;
    for (; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float wd = (float)seg_wd[dt_k__seg(seg_end, n_seg, i)], x = dt_k__load_w(w, wdt, master, i);
        float b0 = 0.0f, *b = buf ? buf + i : &b0;
        x = dt_k__step(k, x, gm == 1.0f ? g[i] : g[i] * gm, wd, b);
        dt_k__store_w(w, wdt, master, i, x);
    }
}

static __global__ void dt_k__adam_kernel(void *w, int wdt, float *master, const float *__restrict__ g, float *m, float *v,
                                  int64_t n, const int64_t *__restrict__ seg_end, const double *__restrict__ seg_wd,
                                  int n_seg, dt_k__adam k, float gm, const int *skip) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (skip && *skip) return;
    for (; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double wd = seg_wd[dt_k__seg(seg_end, n_seg, i)];
        float l2 = k.decoupled ? 0.0f : (float)wd, decay = (float)(1.0 - k.lr * wd);
        float wi = dt_k__load_w(w, wdt, master, i), gi = gm == 1.0f ? g[i] : g[i] * gm, mi, vi, denom;
        if (l2 != 0.0f) gi += l2 * wi;
        if (k.decoupled && wd != 0.0) wi *= decay;
        mi = k.b1 * m[i] + k.omb1 * gi;
        vi = k.b2 * v[i] + k.omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        denom = sqrtf(vi) / k.bc2_sqrt + k.epsf;
        dt_k__store_w(w, wdt, master, i, wi - k.step_size * (mi / denom));
    }
}

static __global__ void dt_k__adagrad_kernel(void *w, int wdt, float *master, const float *__restrict__ g, float *sum,
                                     int64_t n, const int64_t *__restrict__ seg_end,
                                     const double *__restrict__ seg_wd, int n_seg, dt_k__adagrad k, float gm,
                                     const int *skip) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (skip && *skip) return;
    for (; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float wd = (float)seg_wd[dt_k__seg(seg_end, n_seg, i)];
        float wi = dt_k__load_w(w, wdt, master, i), gi = gm == 1.0f ? g[i] : g[i] * gm, s;
        if (wd != 0.0f) gi += wd * wi;
        s = sum[i] + gi * gi;
        sum[i] = s;
        dt_k__store_w(w, wdt, master, i, wi - k.clr * (gi / (sqrtf(s) + k.epsf)));
    }
}

static unsigned dt_k__opt_grid(int64_t n) {
    int64_t b = (n + DT_K__OPT_THREADS - 1) / DT_K__OPT_THREADS;
    return (unsigned)(b > 4096 ? 4096 : b); /* grid-stride beyond */
}

static int dt_k__opt_args(const void *w, int wdt, const float *master, const float *g, int64_t n,
                          const int64_t *seg_end, const double *seg_wd, int n_seg) {
    if (n < 0 || wdt < 1 || wdt > 3 || (wdt != 1 && !w && !master)) return 0;
    if (n > 0 && (!g || !seg_end || !seg_wd || n_seg <= 0 || (!w && !master))) return 0;
    return 1;
}

extern "C" int dt_k_sgd_update(void *w, int w_dtype, float *master, const float *g, float *buf, int64_t n,
                               const int64_t *seg_end, const double *seg_wd, int n_seg, double lr, double momentum,
                               double dampening, int nesterov, int first, float grad_mul, const int *skip,
                               void *stream) {
    dt_k__sgd k;
    if (!dt_k__opt_args(w, w_dtype, master, g, n, seg_end, seg_wd, n_seg) || (nesterov != 0 && nesterov != 1) ||
        (first != 0 && first != 1) || (momentum != 0.0 && !buf && n > 0))
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    k.lrf = (float)lr; k.mom = (float)momentum; k.damp = (float)(1.0 - dampening);
    k.nesterov = nesterov; k.first = first;
    DT_K_LAUNCH(dt_k__sgd_kernel, dt_k__opt_grid(n), DT_K__OPT_THREADS, 0, stream, w, w_dtype, master, g, buf, n,
                seg_end, seg_wd, n_seg, k, grad_mul, skip);
    return DT_K_CHECK();
}

extern "C" int dt_k_adam_update(void *w, int w_dtype, float *master, const float *g, float *m, float *v, int64_t n,
                                const int64_t *seg_end, const double *seg_wd, int n_seg, double lr, double beta1,
                                double beta2, double eps, int decoupled, int64_t t, float grad_mul, const int *skip,
                                void *stream) {
    dt_k__adam k;
    double bc1, bc2;
    if (!dt_k__opt_args(w, w_dtype, master, g, n, seg_end, seg_wd, n_seg) || (decoupled != 0 && decoupled != 1) ||
        t < 1 || (n > 0 && (!m || !v)))
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    bc1 = 1.0 - pow(beta1, (double)t);
    bc2 = 1.0 - pow(beta2, (double)t);
    k.step_size = (float)(lr / bc1); k.bc2_sqrt = (float)sqrt(bc2);
    k.b1 = (float)beta1; k.omb1 = (float)(1.0 - beta1); k.b2 = (float)beta2; k.omb2 = (float)(1.0 - beta2);
    k.epsf = (float)eps; k.lr = lr; k.decoupled = decoupled;
    DT_K_LAUNCH(dt_k__adam_kernel, dt_k__opt_grid(n), DT_K__OPT_THREADS, 0, stream, w, w_dtype, master, g, m, v, n,
                seg_end, seg_wd, n_seg, k, grad_mul, skip);
    return DT_K_CHECK();
}

extern "C" int dt_k_adagrad_update(void *w, int w_dtype, float *master, const float *g, float *sum, int64_t n,
                                   const int64_t *seg_end, const double *seg_wd, int n_seg, double lr, double lr_decay,
                                   double eps, int64_t t, float grad_mul, const int *skip, void *stream) {
    dt_k__adagrad k;
    if (!dt_k__opt_args(w, w_dtype, master, g, n, seg_end, seg_wd, n_seg) || t < 1 || (n > 0 && !sum))
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    k.clr = (float)(lr / (1.0 + (double)(t - 1) * lr_decay));
    k.epsf = (float)eps;
    DT_K_LAUNCH(dt_k__adagrad_kernel, dt_k__opt_grid(n), DT_K__OPT_THREADS, 0, stream, w, w_dtype, master, g, sum, n,
                seg_end, seg_wd, n_seg, k, grad_mul, skip);
    return DT_K_CHECK();
}

/* dt_opt.h's CPU pass (dt__grad_pass), bit for bit, over n_t tensors in one launch, one block per
   tensor. First every thread of the block multiplies and flags a stride of elements (parallel,
   no sums); then lane l = thread l < 4 adds (double)x * x over the elements i with i % 4 == l
   in element order, as the CPU's lane l does, and thread 0 combines (l0 + l1) + (l2 + l3).
   Those lane sums are serial: a double addition's rounding depends on the order, and keeping
   the CPU's order is what makes a CUDA run's norm, and so its clipping, the CPU run's. */
#define DT_K__LANE_THREADS 32
static __global__ void dt_k__grad_pass_lanes(float *const *gs, const int64_t *ns, int *found_inf, double *sumsq,
                                             float mul, int scale) {
    __shared__ double lane[4];
    float *g = gs[blockIdx.x];
    int64_t n = ns[blockIdx.x], i;
    int bad = 0;
    for (i = threadIdx.x; i < n; i += blockDim.x) {
        float x = g[i];
        if (scale) {
            x *= mul;
            g[i] = x;
        }
        bad |= (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
    }
    if (bad && found_inf) atomicMax(found_inf, 1);
    __syncthreads(); /* the multiplied grads, written by every thread, read by the four lanes */
    if (threadIdx.x < 4) {
        double s = 0.0;
        for (i = threadIdx.x; i < n; i += 4) s += (double)g[i] * (double)g[i];
        lane[threadIdx.x] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) sumsq[blockIdx.x] = (lane[0] + lane[1]) + (lane[2] + lane[3]);
}

extern "C" int dt_k_grad_pass_lanes(float *const *g, const int64_t *n, int n_t, int *found_inf, double *sumsq,
                                    float mul, int scale, void *stream) {
    if (n_t < 0 || (scale != 0 && scale != 1) || (n_t > 0 && (!g || !n || !sumsq))) return (int)cudaErrorInvalidValue;
    if (n_t == 0) return 0;
    DT_K_LAUNCH(dt_k__grad_pass_lanes, (unsigned)n_t, DT_K__LANE_THREADS, 0, stream, g, n, found_inf, sumsq, mul, scale);
    return DT_K_CHECK();
}
