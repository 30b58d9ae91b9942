/* kernels/dt_softmax.cu - the losses and sums of dt_tensor.h on the device (kernels/dt_kernels.h,
   ">>xent"): softmax + cross entropy, binary cross entropy with logits, and the sums dt_sum /
   dt_sumsq, all ending in one two-stage reduction so a training step never waits for a loss.

   The reduction: stage 1 cuts the n items into nb = dt_k__loss_blocks(n) contiguous chunks, one
   block each; its threads sum their items in double (thread t: items t, t + 256, ... of the
   chunk), then the block's tree (dt_k_block_sum) gives partial[b] and the chunk's count. Stage 2
   is one block that combines the nb partials the same way. nb and every tree depend on n only,
   so the result is the same bits run after run, whatever the timing; it is not the CPU's serial
   order (the tests bound the difference). Everything is written, nothing accumulated: the slot
   need not be zeroed.                                           MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <math.h>

#define DT_K__LOSS_THREADS 256
#define DT_K__LOSS_MAX_BLOCKS 256 /* stage 2: one item per thread */

/* Threads per row: enough warps to cover V once, at most 512. */
static int dt_k__xent_threads(int64_t V) {
    int64_t t = V > 512 ? 512 : dt_k__ceil_div(V, 32) * 32;
    return t < 32 ? 32 : t > 512 ? 512 : (int)t;
}

/* Stage-1 blocks for n items: about 4 items per thread, at most DT_K__LOSS_MAX_BLOCKS. */
static int64_t dt_k__loss_blocks(int64_t n) {
    int64_t b = n <= 0 ? 0 : dt_k__ceil_div(n, 4 * DT_K__LOSS_THREADS);
    return b < 1 ? 1 : b > DT_K__LOSS_MAX_BLOCKS ? DT_K__LOSS_MAX_BLOCKS : b;
}

/* The most rows a loss takes: their float losses and the partials fit a size_t (past it the
   scratch size wrapped to a few KiB, and the launch wrote rows floats into it). */
#define DT_K__LOSS_ROWS_MAX ((INT64_MAX - 8192) / 4)

extern "C" size_t dt_k_loss_scratch_bytes(int64_t rows) { /* 0 for rows the launchers refuse */
    size_t r = rows > 0 ? (size_t)rows : 0;
    if (rows > DT_K__LOSS_ROWS_MAX) return 0;
    /* row losses (floats), rounded up to 256 bytes, then the partials: (sum, count) per block */
    return (r * sizeof(float) + 255) / 256 * 256 + 2 * DT_K__LOSS_MAX_BLOCKS * sizeof(double) + 2 * sizeof(double);
}

/* What stage 1 sums, per item i: */
enum {
    DT_K__SUM_ROWLOSS = 0, /* xent: a[i] (a row's loss) where targets[i] != ignore; counted there */
    DT_K__SUM_COUNT = 1,   /* xent backward: only the count of targets[i] != ignore */
    DT_K__SUM_BCE = 2,     /* bce: the stable element loss of logits a[i], labels b[i]; every item counted */
    DT_K__SUM_PLAIN = 3,   /* dt_sum: a[i] */
    DT_K__SUM_SQ = 4       /* dt_sumsq: a[i] * a[i] */
};

static __device__ __forceinline__ void dt_k__sum_item(int mode, const float *a, const float *b, const int32_t *t,
                                                      int ignore, int64_t i, double *s, double *c) {
    if (mode == DT_K__SUM_ROWLOSS || mode == DT_K__SUM_COUNT) {
        if (t[i] == ignore) return;
        if (mode == DT_K__SUM_ROWLOSS) *s += (double)a[i];
        *c += 1.0;
    } else if (mode == DT_K__SUM_BCE) {
        double z = a[i], y = b[i];
        *s += (z > 0 ? z : 0) - z * y + log1p(exp(-fabs(z))); /* dt_bce_logits_fwd's, never exp of a large z */
        *c += 1.0;
    } else {
        double v = a[i];
        *s += mode == DT_K__SUM_SQ ? v * v : v;
        *c += 1.0;
    }
}

/* Stage 1: partial[2b], partial[2b + 1] = the sum and count of chunk b (the chunk is n / nb
   items rounded up; the last may be shorter or empty). */
__global__ void dt_k__sum_stage1(double *partial, int mode, const float *a, const float *b, const int32_t *t,
                                 int ignore, int64_t n, int64_t chunk) {
    int64_t lo = (int64_t)blockIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double s = 0.0, c = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) dt_k__sum_item(mode, a, b, t, ignore, i, &s, &c);
    s = dt_k_block_sum(s);
    c = dt_k_block_sum(c);
    if (threadIdx.x == 0) {
        partial[2 * blockIdx.x] = s;
        partial[2 * blockIdx.x + 1] = c;
    }
}

/* Stage 2, one block: out[0] = sum (mean: sum / count, 0 when the count is 0), out[1] = count. */
__global__ void dt_k__sum_stage2(double *out, const double *partial, int64_t nb, int mean) {
    double s = 0.0, c = 0.0;
    for (int64_t i = threadIdx.x; i < nb; i += blockDim.x) {
        s += partial[2 * i];
        c += partial[2 * i + 1];
    }
    s = dt_k_block_sum(s);
    c = dt_k_block_sum(c);
    if (threadIdx.x == 0) {
        out[0] = mean ? (c > 0 ? s / c : 0.0) : s;
        out[1] = c;
    }
}

/* The two stages over n items into out[0..1]; partial: 2 * DT_K__LOSS_MAX_BLOCKS doubles. */
static int dt_k__sum(double *out, double *partial, int mode, const float *a, const float *b, const int32_t *t,
                     int ignore, int64_t n, int mean, void *stream) {
    int64_t nb = dt_k__loss_blocks(n), chunk = n > 0 ? dt_k__ceil_div(n, nb) : 0;
    int st;
    DT_K_LAUNCH(dt_k__sum_stage1, (unsigned)nb, DT_K__LOSS_THREADS, 0, stream, partial, mode, a, b, t, ignore, n,
                chunk);
    if ((st = DT_K_CHECK())) return st;
    DT_K_LAUNCH(dt_k__sum_stage2, 1, DT_K__LOSS_THREADS, 0, stream, out, (const double *)partial, nb, mean);
    return DT_K_CHECK();
}

/* Where the pieces of a loss scratch lie: row losses, partials, and (the backward) its count. */
static float *dt_k__scratch_rows(void *scratch) { return (float *)scratch; }
static double *dt_k__scratch_partial(void *scratch, int64_t rows) {
    return (double *)((char *)scratch + ((size_t)rows * sizeof(float) + 255) / 256 * 256);
}

/* ---------------------------------------------------------------- softmax + cross entropy */

/* The 16-byte path of the row kernels: rows of a multiple of 4 floats and every pointer aligned
   (NULL counts as aligned); else one float at a time (a view at an odd offset). A thread's float4
   is four adjacent columns, so the same operations on each element as the scalar path: only the
   order of the row's sum of exponentials changes (within the same bound, the test's). */
static int dt_k__xent_vec(int64_t V, const void *a, const void *b) {
    return V % 4 == 0 && dt_k_aligned(a, 16) && dt_k_aligned(b, 16);
}

/* One block per row (grid-stride over rows), reading the row coalesced (vec: by float4s): the
   max, the sum of exp(z - max) in float (each term <= 1, the largest exactly 1, so the sum is
   accurate), lse = max + log(sum); losses[r] = lse - z[t] (0 when ignored, NaN for a target
   outside [0, V): the device check dt_tensor.h queued reports it); then probs = exp(z - lse).
   probs may be logits: z[t] is read, and every thread is past its reads of the row (the
   barrier), before any write. */
__global__ void dt_k__softmax_xent_fwd(float *losses, float *probs, const float *logits,
                                       const int32_t *__restrict__ targets, int ignore_index, int64_t rows,
                                       int64_t V, int vec) {
    const int64_t V4 = vec ? V / 4 : 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *z = logits + r * V;
        float mx = -INFINITY, s = 0.0f, l;
        for (int64_t v = threadIdx.x; v < V4; v += blockDim.x) {
            float4 a = dt_k_load4(z + 4 * v);
            mx = fmaxf(fmaxf(mx, a.x), fmaxf(a.y, fmaxf(a.z, a.w)));
        }
        for (int64_t v = 4 * V4 + threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
        mx = dt_k_block_max(mx);
        for (int64_t v = threadIdx.x; v < V4; v += blockDim.x) {
            float4 a = dt_k_load4(z + 4 * v);
            s += expf(a.x - mx), s += expf(a.y - mx), s += expf(a.z - mx), s += expf(a.w - mx);
        }
        for (int64_t v = 4 * V4 + threadIdx.x; v < V; v += blockDim.x) s += expf(z[v] - mx);
        s = dt_k_block_sum(s);
        l = mx + logf(s);
        if (threadIdx.x == 0) {
            int32_t t = targets[r];
            if (t == ignore_index) losses[r] = 0.0f;
            else if (t < 0 || (int64_t)t >= V) losses[r] = NAN;
            else losses[r] = l - z[t];
        }
        __syncthreads();
        if (probs) {
            float *p = probs + r * V;
            for (int64_t v = threadIdx.x; v < V4; v += blockDim.x) {
                float4 a = dt_k_load4(z + 4 * v);
                dt_k_store4(p + 4 * v, make_float4(expf(a.x - l), expf(a.y - l), expf(a.z - l), expf(a.w - l)));
            }
            for (int64_t v = 4 * V4 + threadIdx.x; v < V; v += blockDim.x) p[v] = expf(z[v] - l);
        }
    }
}

/* One column of the backward: g + s p, on the target column g + s (p - 1). */
static __device__ __forceinline__ float dt_k__xent_grad(float g, float p, float s, int64_t v, int32_t t) {
    return v == t ? g + s * (p - 1.0f) : g + s * p;
}

/* One block per row: dlogits += s p, and on the target column s (p - 1), s = dloss / n_valid with
   n_valid the device count (count[1]); the CPU op's operations, by float4s when vec. Ignored
   rows and targets outside [0, V) (reported by the device check) add nothing. dlogits may be
   probs (same element, read before written by the same thread). */
__global__ void dt_k__softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *__restrict__ targets,
                                       int ignore_index, float dloss, const double *count, int64_t rows, int64_t V,
                                       int vec) {
    const int64_t V4 = vec ? V / 4 : 0;
    int64_t n = (int64_t)count[1];
    float s;
    if (n == 0) return;
    s = dloss / (float)n;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int32_t t = targets[r];
        const float *p = probs + r * V;
        float *g = dlogits + r * V;
        if (t == ignore_index || t < 0 || (int64_t)t >= V) continue;
        for (int64_t v = threadIdx.x; v < V4; v += blockDim.x) {
            float4 pv = dt_k_load4(p + 4 * v), gv = dt_k_load4(g + 4 * v);
            dt_k_store4(g + 4 * v, make_float4(dt_k__xent_grad(gv.x, pv.x, s, 4 * v, t), dt_k__xent_grad(gv.y, pv.y, s, 4 * v + 1, t),
                                               dt_k__xent_grad(gv.z, pv.z, s, 4 * v + 2, t), dt_k__xent_grad(gv.w, pv.w, s, 4 * v + 3, t)));
        }
        for (int64_t v = 4 * V4 + threadIdx.x; v < V; v += blockDim.x) g[v] = dt_k__xent_grad(g[v], p[v], s, v, t);
    }
}

static int dt_k__xent_args(int64_t rows, int64_t V) {
    return rows >= 0 && V >= 0 && (V == 0 || rows <= INT64_MAX / V) && rows <= DT_K__LOSS_ROWS_MAX;
}

extern "C" int dt_k_softmax_xent_fwd(double *loss_slot, float *probs, const float *logits, const int32_t *targets,
                                     int ignore_index, int64_t rows, int64_t V, void *scratch, void *stream) {
    int st;
    if (!dt_k__xent_args(rows, V) || !loss_slot || !scratch || (rows > 0 && (!targets || (V > 0 && !logits))))
        return (int)cudaErrorInvalidValue;
    if (rows > 0 && V > 0) {
        DT_K_LAUNCH(dt_k__softmax_xent_fwd, rows > 65535 ? 65535u : (unsigned int)rows, dt_k__xent_threads(V), 0,
                    stream, dt_k__scratch_rows(scratch), probs, logits, targets, ignore_index, rows, V,
                    dt_k__xent_vec(V, probs, logits));
        if ((st = DT_K_CHECK())) return st;
    }
    /* V = 0: no row has a valid target (the check says so); counted as the CPU does, loss 0 */
    return dt_k__sum(loss_slot, dt_k__scratch_partial(scratch, rows), V > 0 ? DT_K__SUM_ROWLOSS : DT_K__SUM_COUNT,
                     dt_k__scratch_rows(scratch), NULL, targets, ignore_index, rows, 1, stream);
}

extern "C" int dt_k_softmax_xent_bwd(float *dlogits, const float *probs, const int32_t *targets, int ignore_index,
                                     float dloss, int64_t rows, int64_t V, void *scratch, void *stream) {
    double *partial, *count;
    int st;
    if (!dt_k__xent_args(rows, V) || !scratch) return (int)cudaErrorInvalidValue;
    if (rows * V == 0 || !dlogits) return 0;
    if (!probs || !targets) return (int)cudaErrorInvalidValue;
    partial = dt_k__scratch_partial(scratch, rows);
    count = partial + 2 * DT_K__LOSS_MAX_BLOCKS;
    if ((st = dt_k__sum(count, partial, DT_K__SUM_COUNT, NULL, NULL, targets, ignore_index, rows, 0, stream)))
        return st;
    DT_K_LAUNCH(dt_k__softmax_xent_bwd, rows > 65535 ? 65535u : (unsigned int)rows, dt_k__xent_threads(V), 0, stream,
                dlogits, probs, targets, ignore_index, dloss, (const double *)count, rows, V,
                dt_k__xent_vec(V, dlogits, probs));
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- binary cross entropy */

/* dlogits += s (sigmoid(z) - y), s = dloss / n, the CPU op's float operations; vec (every pointer
   16-byte aligned): four elements a thread by 16-byte loads and stores, the last n % 4 one by one. */
static __device__ __forceinline__ float dt_k__bce_grad(float g, float z, float y, float s) {
    float sig = z >= 0 ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
    return g + s * (sig - y);
}

__global__ void dt_k__bce_bwd(float *dlogits, const float *logits, const float *labels, float s, int64_t n, int vec) {
    const int64_t n4 = vec ? n / 4 : 0, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 g = dt_k_load4(dlogits + 4 * i), z = dt_k_load4(logits + 4 * i), y = dt_k_load4(labels + 4 * i);
        dt_k_store4(dlogits + 4 * i, make_float4(dt_k__bce_grad(g.x, z.x, y.x, s), dt_k__bce_grad(g.y, z.y, y.y, s),
                                                 dt_k__bce_grad(g.z, z.z, y.z, s), dt_k__bce_grad(g.w, z.w, y.w, s)));
    }
    for (int64_t i = 4 * n4 + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dlogits[i] = dt_k__bce_grad(dlogits[i], logits[i], labels[i], s);
}

extern "C" int dt_k_bce_logits_fwd(double *loss_slot, const float *logits, const float *labels, int64_t n,
                                   void *scratch, void *stream) {
    if (n < 0 || !loss_slot || !scratch || (n > 0 && (!logits || !labels))) return (int)cudaErrorInvalidValue;
    return dt_k__sum(loss_slot, dt_k__scratch_partial(scratch, 0), DT_K__SUM_BCE, logits, labels, NULL, 0, n, 1,
                     stream);
}

extern "C" int dt_k_bce_logits_bwd(float *dlogits, const float *logits, const float *labels, float dloss, int64_t n,
                                   void *stream) {
    int vec;
    if (n < 0) return (int)cudaErrorInvalidValue;
    if (n == 0 || !dlogits) return 0;
    if (!logits || !labels) return (int)cudaErrorInvalidValue;
    vec = dt_k__xent_vec(0, dlogits, logits) && dt_k_aligned(labels, 16);
    DT_K_LAUNCH(dt_k__bce_bwd, dt_k__blocks(vec && n >= 4 ? n / 4 : n, 256, 4096u), 256, 0, stream, dlogits, logits,
                labels, dloss / (float)n, n, vec);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- sums, scale */

extern "C" int dt_k_sum(double *out, const float *x, int64_t n, int sq, void *scratch, void *stream) {
    if (n < 0 || !out || !scratch || (n > 0 && !x)) return (int)cudaErrorInvalidValue;
    return dt_k__sum(out, dt_k__scratch_partial(scratch, 0), sq ? DT_K__SUM_SQ : DT_K__SUM_PLAIN, x, NULL, NULL, 0, n,
                     0, stream);
}

__global__ void dt_k__scale(float *x, float alpha, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = alpha * x[i];
}

extern "C" int dt_k_scale(float *x, float alpha, int64_t n, void *stream) {
    if (n < 0 || (n > 0 && !x)) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    DT_K_LAUNCH(dt_k__scale, dt_k__blocks(n, 256, 4096u), 256, 0, stream, x, alpha, n);
    return DT_K_CHECK();
}
