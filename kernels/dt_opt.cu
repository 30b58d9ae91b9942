/* kernels/dt_opt.cu - the optimizer of dt_opt.h on the device, with no host round trip in a step:
   the grads' one pass (unscale, inf/nan flag, sums of squares for the global norm) as a two-stage
   reduction over all parameters, the decisions (skip, clip factor, loss scale) in a one-thread
   kernel, and multi-tensor SGD / Adam(W) / Adagrad: one launch for every parameter.

       grads (n_seg tensors, one flat index space)
         --dt_k__grad_pass: block b sums its fixed chunk, per norm class--> partials[b][cls]
         --dt_k__grad_combine: one block adds the partials in a fixed order--> cls[c], found_inf
         (dt_opt.h all-reduces clsf[c] = (float)cls[c] / found_inf on the device over other ranks)
         --dt_k__opt_finish (one thread)--> skip, grad_mul (the clip factor), scale, step
         --dt_k__opt_update: reads skip and grad_mul from device memory--> w, master, state

   The sum order depends on the number of elements only (the chunk of a block is fixed by it),
   never on timing: deterministic run to run, but not the CPU's four-lane order. Both sum exact
   products (a float squared is exact in double), so they differ by at most 2 (n - 1) 2^-53 of
   the sum of squares (n the elements): the tests' bound.

   The update math is dt_sgd_update / dt_adam_update / dt_adagrad_update's, operation for
   operation in the same order; each parameter's float scalars (its group's lr, the bias
   corrections, the decay) are computed in double, as dt_opt.h computes them on the host, once
   per parameter a thread enters. Each thread walks the parameters (segments) of its block's
   chunk in order, so finding a segment costs one comparison per element. The update moves four
   elements a thread with 16-byte loads and stores (weights, grads, state; the bf16 copy 8) where
   they lie in one parameter and are aligned, and one at a time elsewhere: memory-bound, it
   should run near the GPU's copy bandwidth (issue 19's 0.7 of a device copy: not yet measured
   on a GPU). */
#include "dt_cuda.cuh"
#include <math.h>
#include <float.h>
#include <stdint.h>

#define DT_K__OPT_THREADS 128
#define DT_K__OPT_PER_THREAD 16 /* elements per thread and block chunk: a block sums 2048 */
#define DT_K__OPT_MAX_BLOCKS 2048 /* 128-thread blocks: every thread slot of an H100 */

/* The blocks of a pass over n elements (the partials' count): a function of n alone. */
extern "C" int dt_k_opt_blocks(int64_t n) {
    int64_t per = (int64_t)DT_K__OPT_THREADS * DT_K__OPT_PER_THREAD, b = n <= 0 ? 0 : dt_k__ceil_div(n, per);
    return n <= 0 ? 0 : b > DT_K__OPT_MAX_BLOCKS ? DT_K__OPT_MAX_BLOCKS : (int)b;
}

/* Block b's chunk of [0, n): [b * chunk, min(n, (b + 1) * chunk)), formed without n + gridDim - 1
   or lo + chunk (each overflows int64 near INT64_MAX). */
__device__ static void dt_k__chunk(int64_t n, int64_t *lo, int64_t *hi) {
    int64_t chunk = dt_k__ceil_div(n, gridDim.x);
    *lo = (int64_t)blockIdx.x * chunk;
    *hi = chunk < n - *lo ? *lo + chunk : n;
}

/* The segment that flat index i belongs to: the last s with seg[s].start <= i. */
__device__ static int dt_k__seg(const dt_k_opt_seg *seg, int n_seg, int64_t i) {
    int lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seg[mid].start <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The end of segment s: where the next one starts, or n. */
__device__ static int64_t dt_k__seg_end(const dt_k_opt_seg *seg, int n_seg, int s, int64_t n) {
    return s + 1 < n_seg ? seg[s + 1].start : n;
}

/* ---------------------------------------------------------------- the grads' pass */

/* Stage 1: block b multiplies its chunk by mul (when scale), flags inf / NaN, and sums x * x in
   double per norm class: partials[b * (n_cls + 1) + c], and the block's flag at [.. + n_cls]. */
static __global__ void dt_k__grad_pass(const dt_k_opt_seg *__restrict__ seg, int n_seg, int64_t n, int n_cls,
                                       double *partials, float mul, int scale) {
    double acc[DT_K_OPT_MAX_CLS], a = 0.0; /* a: the current parameter's sum, added to its class at its end */
    int64_t lo, hi, i, end, start = 0;
    int s, c, cls = 0, bad = 0;
    float *g = 0;
    for (c = 0; c < n_cls; c++) acc[c] = 0.0;
    dt_k__chunk(n, &lo, &hi);
    i = lo + threadIdx.x;
    if (i < hi) {
        s = dt_k__seg(seg, n_seg, i);
        end = dt_k__seg_end(seg, n_seg, s, n);
        g = seg[s].g; start = seg[s].start; cls = seg[s].cls;
        for (; i < hi; i += blockDim.x) {
            float x;
            if (i >= end) {
                acc[cls] += a;
                a = 0.0;
                while (i >= end) end = dt_k__seg_end(seg, n_seg, ++s, n);
                g = seg[s].g; start = seg[s].start; cls = seg[s].cls;
            }
            x = g[i - start];
            if (scale) {
                x *= mul;
                g[i - start] = x;
            }
            bad |= (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
            a += (double)x * (double)x;
        }
        acc[cls] += a;
    }
    for (c = 0; c < n_cls; c++) { /* every thread calls the block sum (it holds barriers) */
        double t = dt_k_block_sum(acc[c]);
        if (threadIdx.x == 0) partials[(int64_t)blockIdx.x * (n_cls + 1) + c] = t;
    }
    {
        double t = dt_k_block_sum(bad ? 1.0 : 0.0);
        if (threadIdx.x == 0) partials[(int64_t)blockIdx.x * (n_cls + 1) + n_cls] = t;
    }
}

/* Stage 2, one block: cls[c] = the partials of class c added in a fixed order (thread t the
   blocks t, t + blockDim, ..., then the block sum), st->found_inf = any block's flag. */
static __global__ void dt_k__grad_combine(const double *partials, int n_blocks, int n_cls, double *cls, float *clsf,
                                          dt_k_opt_state *st) {
    int c, b;
    for (c = 0; c <= n_cls; c++) {
        double v = 0.0, t;
        for (b = threadIdx.x; b < n_blocks; b += blockDim.x) v += partials[(int64_t)b * (n_cls + 1) + c];
        t = dt_k_block_sum(v);
        if (threadIdx.x == 0) {
            if (c < n_cls) {
                cls[c] = t;
                clsf[c] = (float)t;
            } else {
                st->found_inf = t > 0.0 ? 1.0f : 0.0f;
            }
        }
    }
}

extern "C" int dt_k_opt_grad_pass(const dt_k_opt_seg *seg, int n_seg, int64_t n, int n_cls, double *partials,
                                  double *cls, float *clsf, dt_k_opt_state *st, float mul, int scale, void *stream) {
    int nb = dt_k_opt_blocks(n);
    if (n < 0 || n_seg < 0 || n_cls < 1 || n_cls > DT_K_OPT_MAX_CLS || (scale != 0 && scale != 1) || !cls || !clsf || !st ||
        (n > 0 && (!seg || n_seg == 0 || !partials)))
        return (int)cudaErrorInvalidValue;
    if (n == 0) { /* no grads: no sums, no flag */
        cudaError_t e = cudaMemsetAsync(cls, 0, sizeof(double) * (size_t)n_cls, (cudaStream_t)stream);
        if (e == cudaSuccess) e = cudaMemsetAsync(clsf, 0, sizeof(float) * (size_t)n_cls, (cudaStream_t)stream);
        if (e == cudaSuccess)
            e = cudaMemsetAsync(&st->found_inf, 0, sizeof st->found_inf, (cudaStream_t)stream);
        return (int)e;
    }
    DT_K_LAUNCH(dt_k__grad_pass, (unsigned)nb, DT_K__OPT_THREADS, 0, stream, seg, n_seg, n, n_cls, partials, mul, scale);
    DT_K_LAUNCH(dt_k__grad_combine, 1, DT_K__OPT_THREADS, 0, stream, partials, nb, n_cls, cls, clsf, st);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- the decisions of a step */

/* One thread, the host's dt_opt_step between the pass and the update: the norm (sum of the
   classes in order, or st->sumsq when phase 2 and the caller all-reduced it over the stages),
   the clip factor of torch.nn.utils.clip_grad_norm_, the skip when scaling found an inf / NaN,
   dt_loss_scaler_update, the step count. Phase 1 only writes st->sumsq (for that all-reduce). */
static __global__ void dt_k__opt_finish(dt_k_opt_state *st, const double *cls, const float *clsf, int n_cls,
                                        int phase, dt_k_opt_finish_args a) {
    double total = 0.0;
    int c, found;
    if (phase != 2)
        for (c = 0; c < n_cls; c++) total += (a.reduced >> c) & 1 ? (double)clsf[c] : cls[c];
    if (phase == 1) {
        st->sumsq_f = (float)total;
        return;
    }
    if (phase == 2) total = (double)st->sumsq_f;
    st->sumsq = total;
    found = a.scaling && st->found_inf != 0.0f;
    st->skip = found;
    st->grad_mul = 1.0f;
    if (found) {
        st->grad_norm = HUGE_VAL;
    } else if (a.want_norm) {
        double norm = sqrt(total), coef = a.clip_norm > 0 ? a.clip_norm / (norm + 1e-6) : 1.0;
        st->grad_norm = norm;
        if (isfinite(norm) && coef < 1.0) st->grad_mul = (float)coef;
    } else {
        st->grad_norm = 0.0;
    }
    if (!found) st->step++;
    if (!a.scaling) return;
    /* dt_loss_scaler_update, line for line */
    if (found && st->skipped < INT64_MAX) st->skipped++;
    if (!a.dynamic) return;
    if (found) {
        double backed = st->scale * a.backoff_factor;
        if (backed >= FLT_MIN) st->scale = backed;
        st->growth_tracker = 0;
    } else if ((int64_t)st->growth_tracker + 1 >= a.growth_interval) {
        double grown = st->scale * a.growth_factor;
        if (grown <= FLT_MAX) st->scale = grown;
        st->growth_tracker = 0;
    } else {
        st->growth_tracker++;
    }
}

extern "C" int dt_k_opt_finish(dt_k_opt_state *st, const double *cls, const float *clsf, int n_cls, int phase,
                               const dt_k_opt_finish_args *args, void *stream) {
    if (!st || !args || phase < 0 || phase > 2 || n_cls < 0 || n_cls > DT_K_OPT_MAX_CLS ||
        (n_cls > 0 && (!cls || !clsf)))
        return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__opt_finish, 1, 1, 0, stream, st, cls, clsf, n_cls, phase, *args);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- the updates */

__device__ static float dt_k__load_w(const dt_k_opt_seg &s, int64_t i) {
    if (s.master) return s.master[i];
    if (s.w_dtype == 2) return dt_k_bf16_to_f32(((const uint16_t *)s.w)[i]);
    if (s.w_dtype == 3) return dt_k_f16_to_f32(((const uint16_t *)s.w)[i]);
    return ((const float *)s.w)[i];
}

/* Stochastic rounding: dt_opt.h's dt__sr_mix / dt__sr_key / dt__sr_bf16, the same bits. */
__device__ static uint64_t dt_k__sr_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ static uint64_t dt_k__sr_key(uint64_t seed, uint64_t stream, int64_t t) {
    return dt_k__sr_mix(seed ^ dt_k__sr_mix(stream ^ dt_k__sr_mix((uint64_t)t)));
}

__device__ static uint16_t dt_k__sr_bf16(float x, uint64_t key, int64_t g) {
    uint32_t u = __float_as_uint(x), r = (uint32_t)(dt_k__sr_mix(key + (uint64_t)g * 0x9E3779B97F4A7C15ull) >> 48);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return dt_k_f32_to_bf16(x);
    return (uint16_t)((u + r) >> 16);
}

/* Element i of segment s in its whole tensor. A whole tensor or a shard of whole rows is one
   level, a single row of sr_n2 (sr_base + i); divisions only where a dim is split inside a row. */
__device__ static int64_t dt_k__sr_index(const dt_k_opt_seg &s, int64_t i) {
    int64_t row;
    if (i < s.sr_n2) return s.sr_base + i;
    row = i / s.sr_n2;
    return s.sr_base + (row / s.sr_n1) * s.sr_g0 + (row % s.sr_n1) * s.sr_g1 + (i - row * s.sr_n2);
}

__device__ static void dt_k__store_w(const dt_k_opt_seg &s, int64_t i, float x, int sr, uint64_t key) {
    if (s.master) s.master[i] = x;
    if (s.w_dtype == 2 && sr) ((uint16_t *)s.w)[i] = dt_k__sr_bf16(x, key, dt_k__sr_index(s, i));
    else if (s.w_dtype == 2) ((uint16_t *)s.w)[i] = dt_k_f32_to_bf16(x);
    else if (s.w_dtype == 3) ((uint16_t *)s.w)[i] = dt_k_f32_to_f16(x);
    else if (s.w && (float *)s.w != s.master) ((float *)s.w)[i] = x;
}

/* A segment's float scalars, as the CPU function computes them from its (double) arguments. */
struct dt_k__scal {
    float lrf, wdf, mom, damp;     /* sgd: lr, wd, momentum, 1 - dampening */
    float step_size, bc2_sqrt, b1, omb1, b2, omb2, epsf, l2, decay; /* adam */
    float clr;                     /* adagrad */
    int decoupled, wd_nonzero;
    uint64_t sr_key;               /* stochastic rounding's key of this parameter and step */
};

__device__ static dt_k__scal dt_k__scalars(const dt_k_opt_hyper &h, const dt_k_opt_seg &s) {
    dt_k__scal k;
    double lr = h.lr * s.lr_scale;
    k.lrf = (float)lr; k.wdf = (float)s.wd;
    k.mom = (float)h.momentum; k.damp = (float)(1.0 - h.dampening);
    k.step_size = (float)(lr / h.bc1); k.bc2_sqrt = (float)sqrt(h.bc2);
    k.b1 = (float)h.beta1; k.omb1 = (float)(1.0 - h.beta1); k.b2 = (float)h.beta2; k.omb2 = (float)(1.0 - h.beta2);
    k.epsf = (float)h.eps;
    k.decoupled = h.kind == 3;
    k.l2 = k.decoupled ? 0.0f : (float)s.wd;
    k.decay = (float)(1.0 - lr * s.wd);
    k.wd_nonzero = s.wd != 0.0;
    k.clr = (float)(lr / h.lr_den);
    k.sr_key = h.sr ? dt_k__sr_key(h.sr_seed, s.sr_stream, h.t) : 0;
    return k;
}

/* The math of one element of dt_sgd_update / dt_adam_update / dt_adagrad_update on values: w
   (widened), g (times the clip factor), s0, s1 in; w, s0, s1 out. */
__device__ static __forceinline__ void dt_k__math(const dt_k_opt_hyper &h, const dt_k__scal &k, float &w, float g,
                                                  float &s0, float &s1) {
    if (h.kind == 1) {
        float d = g;
        if (k.wdf != 0.0f) d += k.wdf * w;
        if (k.mom != 0.0f) {
            float b = h.first ? d : k.mom * s0 + k.damp * d;
            s0 = b;
            d = h.nesterov ? d + k.mom * b : b;
        }
        w = w - k.lrf * d;
    } else if (h.kind == 4) {
        float sum;
        if (k.wdf != 0.0f) g += k.wdf * w;
        sum = s0 + g * g;
        s0 = sum;
        w = w - k.clr * (g / (sqrtf(sum) + k.epsf));
    } else {
        float m, v, denom;
        if (k.l2 != 0.0f) g += k.l2 * w;
        if (k.decoupled && k.wd_nonzero) w *= k.decay;
        m = k.b1 * s0 + k.omb1 * g;
        v = k.b2 * s1 + k.omb2 * (g * g);
        s0 = m;
        s1 = v;
        denom = sqrtf(v) / k.bc2_sqrt + k.epsf;
        w = w - k.step_size * (m / denom);
    }
}

/* Element i of segment s, loads and stores of one element each. */
__device__ static void dt_k__update_one(const dt_k_opt_hyper &h, const dt_k__scal &k, const dt_k_opt_seg &s,
                                        int64_t i, float gm) {
    float w = dt_k__load_w(s, i), g = gm == 1.0f ? s.g[i] : s.g[i] * gm;
    float s0 = s.s0 ? s.s0[i] : 0.0f, s1 = s.s1 ? s.s1[i] : 0.0f;
    dt_k__math(h, k, w, g, s0, s1);
    if (s.s0) s.s0[i] = s0;
    if (s.s1) s.s1[i] = s1;
    dt_k__store_w(s, i, w, h.sr, k.sr_key);
}

/* p is global memory (every pointer of a segment is): said to nvcc, which cannot see it through
   the table, so that it emits ld.global / st.global rather than generic accesses. */
template <typename T> static __device__ __forceinline__ T *dt_k__gl(T *p) {
#ifndef DT_CUDA_EMU
    __builtin_assume(__isGlobal(p));
#endif
    return p;
}

/* Elements i .. i + 3 of segment s by 16-byte loads and stores (8 for a 16-bit value): when its
   f32 copy (the master, or an f32 value) and grad, state and value pointers are aligned there.
   The same math per lane, so the same bits as four dt_k__update_one. */
__device__ static int dt_k__update_four(const dt_k_opt_hyper &h, const dt_k__scal &k, const dt_k_opt_seg &s, int64_t i,
                                        float gm) {
    float *f = s.master ? s.master : s.w_dtype == 1 ? (float *)s.w : NULL; /* the f32 weights */
    float4 w4, g4, a4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b4 = a4;
    float w[4], g[4], a[4], b[4];
    int l;
    const int f32_copy = s.master && s.w_dtype == 1 && (float *)s.w != s.master; /* an f32 value beside its master */
    if (!f || ((uintptr_t)(f + i) | (uintptr_t)(s.g + i) | (s.s0 ? (uintptr_t)(s.s0 + i) : 0) |
               (s.s1 ? (uintptr_t)(s.s1 + i) : 0) | (f32_copy ? (uintptr_t)((float *)s.w + i) : 0)) % 16 ||
        (s.w_dtype != 1 && (uintptr_t)((uint16_t *)s.w + i) % 8))
        return 0;
    f = dt_k__gl(f + i); /* from here on: element i's addresses */
    w4 = dt_k_load4(f); g4 = dt_k_load4(dt_k__gl(s.g + i));
    if (s.s0) a4 = dt_k_load4(dt_k__gl(s.s0 + i));
    if (s.s1) b4 = dt_k_load4(dt_k__gl(s.s1 + i));
    w[0] = w4.x; w[1] = w4.y; w[2] = w4.z; w[3] = w4.w;
    g[0] = g4.x; g[1] = g4.y; g[2] = g4.z; g[3] = g4.w;
    a[0] = a4.x; a[1] = a4.y; a[2] = a4.z; a[3] = a4.w;
    b[0] = b4.x; b[1] = b4.y; b[2] = b4.z; b[3] = b4.w;
    for (l = 0; l < 4; l++) dt_k__math(h, k, w[l], gm == 1.0f ? g[l] : g[l] * gm, a[l], b[l]);
    if (s.s0) dt_k_store4(dt_k__gl(s.s0 + i), make_float4(a[0], a[1], a[2], a[3]));
    if (s.s1) dt_k_store4(dt_k__gl(s.s1 + i), make_float4(b[0], b[1], b[2], b[3]));
    if (f32_copy) dt_k_store4(dt_k__gl((float *)s.w + i), make_float4(w[0], w[1], w[2], w[3]));
    dt_k_store4(f, make_float4(w[0], w[1], w[2], w[3]));
    if (s.w_dtype != 1) { /* the rounded copy: four 16-bit values in one 8-byte store */
        uint16_t r[4];
        uint2 v;
        for (l = 0; l < 4; l++)
            r[l] = s.w_dtype == 3 ? dt_k_f32_to_f16(w[l]) : h.sr ? dt_k__sr_bf16(w[l], k.sr_key, dt_k__sr_index(s, i + l))
                                                                : dt_k_f32_to_bf16(w[l]);
        v.x = (unsigned)r[0] | (unsigned)r[1] << 16;
        v.y = (unsigned)r[2] | (unsigned)r[3] << 16;
        dt_k_store_vec<uint2>(dt_k__gl((uint16_t *)s.w + i), v);
    }
    return 1;
}

/* Each thread takes four consecutive elements at a time (a block's chunk rounded to fours, so
   the groups line up with 16-byte boundaries where a parameter does): dt_k__update_four where
   the four are in one parameter and aligned, else one element at a time. */
static __global__ void dt_k__opt_update(const dt_k_opt_seg *__restrict__ seg, int n_seg, int64_t n, dt_k_opt_hyper h,
                                        const float *grad_mul, const int *skip) {
    int64_t chunk, lo, hi, q, i, end;
    int s;
    float gm;
    dt_k__scal k;
    dt_k_opt_seg cur; /* the parameter's pointers in registers: the stores below cannot alias them */
    if (skip && *skip) return;
    gm = grad_mul ? *grad_mul : 1.0f;
    chunk = dt_k__ceil_div(dt_k__ceil_div(n, gridDim.x), 4) * 4; /* as dt_k__chunk, then to fours */
    lo = (int64_t)blockIdx.x * chunk;
    hi = chunk < n - lo ? lo + chunk : n;
    q = lo + 4 * (int64_t)threadIdx.x;
    if (q >= hi) return;
    s = dt_k__seg(seg, n_seg, q);
    end = dt_k__seg_end(seg, n_seg, s, n);
    cur = seg[s];
    k = dt_k__scalars(h, cur);
    for (; q < hi; q += 4 * (int64_t)blockDim.x) {
        if (q >= end) {
            while (q >= end) end = dt_k__seg_end(seg, n_seg, ++s, n);
            cur = seg[s];
            k = dt_k__scalars(h, cur);
        }
        if (q + 4 <= end && q + 4 <= hi && dt_k__update_four(h, k, cur, q - cur.start, gm)) continue;
        for (i = q; i < q + 4 && i < hi; i++) { /* a parameter's edge, a misaligned view, the end */
            if (i >= end) {
                while (i >= end) end = dt_k__seg_end(seg, n_seg, ++s, n);
                cur = seg[s];
                k = dt_k__scalars(h, cur);
            }
            dt_k__update_one(h, k, cur, i - cur.start, gm);
        }
    }
}

extern "C" int dt_k_opt_update(const dt_k_opt_seg *seg, int n_seg, int64_t n, const dt_k_opt_hyper *hyper,
                               const float *grad_mul, const int *skip, void *stream) {
    dt_k_opt_hyper h;
    if (!hyper || n < 0 || n_seg < 0 || (n > 0 && (!seg || n_seg == 0))) return (int)cudaErrorInvalidValue;
    h = *hyper;
    if (h.kind < 1 || h.kind > 4 || h.t < 1 || (h.nesterov != 0 && h.nesterov != 1) || (h.first != 0 && h.first != 1) ||
        (h.sr != 0 && h.sr != 1))
        return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    /* the per-step scalars that do not depend on the parameter, in double as on the host */
    h.bc1 = 1.0 - pow(h.beta1, (double)h.t);
    h.bc2 = 1.0 - pow(h.beta2, (double)h.t);
    h.lr_den = 1.0 + (double)(h.t - 1) * h.lr_decay;
    DT_K_LAUNCH(dt_k__opt_update, (unsigned)dt_k_opt_blocks(n), DT_K__OPT_THREADS, 0, stream, seg, n_seg, n, h, grad_mul,
                skip);
    return DT_K_CHECK();
}
