/* kernels/dt_parallel.cu - the kernels of dt_parallel.h's tensor-parallel layers on CUDA tensors
   (kernels/dt_kernels.h, "tensor parallel"): the vocab-parallel embedding (rows outside this
   rank's vocab range give zeros, the sum over tp fills them) and cross entropy (per row the max,
   the target logit and the sum of exp in double; the logits never leave the device), and the
   column copies of dt_concat / dt_split (qkv packing of examples/gpt).

   Exactness first: each one does the CPU function's arithmetic in the CPU function's order, so a
   CUDA run of examples/gpt equals its CPU run within the exp's rounding. The backward of the
   embedding gives each column to one thread, which adds the rows in id order (no atomics: the
   same sums, bit for bit, every run); the cross entropy's row sums are one thread per row, a
   loop over the row in column order, in double. Both are O(rows) or O(columns) per thread:
   right for the sizes tp leaves on a rank, not tuned.                MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <math.h>
#include <stdint.h>

static __device__ __forceinline__ int64_t dt_k__pl_id(const void *ids, int ids_i64, int64_t n) {
    return ids_i64 ? ((const int64_t *)ids)[n] : (int64_t)((const int32_t *)ids)[n];
}

/* out[n, :] = table[ids[n] - vocab_start, :] when that row is this rank's, else 0. */
static __global__ void dt_k__tp_embedding_fwd(float *out, const float *__restrict__ table, const void *ids, int ids_i64,
                                              int64_t N, int64_t Vl, int64_t C, int64_t vocab_start) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / C, c = i - n * C, r = dt_k__pl_id(ids, ids_i64, n) - vocab_start;
        out[i] = r >= 0 && r < Vl ? table[r * C + c] : 0.0f;
    }
}

/* dtable[ids[n] - vocab_start, c] += dout[n, c] for this rank's rows: thread c adds column c,
   n = 0, 1, ... in order (the CPU loop's order for every element). */
static __global__ void dt_k__tp_embedding_bwd(float *dtable, const float *__restrict__ dout, const void *ids,
                                              int ids_i64, int64_t N, int64_t Vl, int64_t C, int64_t vocab_start) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x)
        for (int64_t n = 0; n < N; n++) {
            int64_t r = dt_k__pl_id(ids, ids_i64, n) - vocab_start;
            if (r >= 0 && r < Vl) dtable[r * C + c] += dout[n * C + c];
        }
}

/* One thread per row r of logits [N, Vl] (nv real columns). buf: [N] maxima, then [N] pairs.
   phase 0: buf[r] = max of the row (-inf without a real column);
   phase 1: buf[N + 2r] = the target's logit (0 when another rank holds it or it is ignored),
            buf[N + 2r + 1] = sum of exp(z - buf[r]) in double, column order;
   phase 2: stats[r] = (max, log s + max) as floats, buf[r] = log s + max - z_target (double). */
static __global__ void dt_k__tp_xent_fwd(double *buf, float *stats, const float *__restrict__ logits,
                                         const int32_t *__restrict__ targets, int ignore_index, int64_t N, int64_t Vl,
                                         int64_t nv, int64_t vocab_start, int phase) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < N; r += (int64_t)gridDim.x * blockDim.x) {
        const float *z = logits + r * Vl;
        if (phase == 0) {
            float mx = -INFINITY;
            for (int64_t c = 0; c < nv; c++) if (z[c] > mx) mx = z[c];
            buf[r] = mx;
        } else if (phase == 1) {
            float mx = (float)buf[r]; /* a float that went through a double: exact */
            int64_t t = (int64_t)targets[r] - vocab_start;
            double s = 0;
            for (int64_t c = 0; c < nv; c++) s += expf(z[c] - mx);
            buf[N + 2 * r] = targets[r] != ignore_index && t >= 0 && t < nv ? (double)z[t] : 0.0;
            buf[N + 2 * r + 1] = s;
        } else {
            double mx = buf[r], zt = buf[N + 2 * r], ls = log(buf[N + 2 * r + 1]);
            if (stats) {
                stats[2 * r] = (float)mx;
                stats[2 * r + 1] = (float)(ls + mx);
            }
            buf[r] = ls + mx - zt;
        }
    }
}

/* dlogits[r, c] += s (exp(z - lse[r]) - [c == target]) on the real columns of rows not ignored. */
static __global__ void dt_k__tp_xent_bwd(float *dlogits, const float *__restrict__ logits, const float *__restrict__ stats,
                                         const int32_t *__restrict__ targets, int ignore_index, float s, int64_t N,
                                         int64_t Vl, int64_t nv, int64_t vocab_start) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * Vl; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / Vl, c = i - r * Vl, t = targets[r];
        if (c >= nv || t == ignore_index) continue;
        t -= vocab_start;
        dlogits[i] += s * (expf(logits[i] - stats[2 * r + 1]) - (c == t ? 1.0f : 0.0f));
    }
}

/* Columns [col0, col0 + C) of whole [R, W] and part [R, C], one way or the other, = or +=. */
static __global__ void dt_k__concat(float *whole, float *part, int64_t R, int64_t W, int64_t col0, int64_t C,
                                    int to_whole, int accumulate) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < R * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / C, c = i - r * C;
        float *w = whole + r * W + col0 + c, *p = part + i;
        if (to_whole) *w = accumulate ? *w + *p : *p;
        else *p = accumulate ? *p + *w : *w;
    }
}

static int dt_k__pl_bad(int64_t a, int64_t b) { return a < 0 || b < 0 || (b && a > INT64_MAX / b); }

int dt_k_tp_embedding_fwd(float *out, const float *table, const void *ids, int ids_i64, int64_t N, int64_t Vl,
                          int64_t C, int64_t vocab_start, void *stream) {
    if (dt_k__pl_bad(N, C) || dt_k__pl_bad(Vl, C) || (ids_i64 != 0 && ids_i64 != 1)) return (int)cudaErrorInvalidValue;
    if (N * C == 0) return 0;
    DT_K_LAUNCH(dt_k__tp_embedding_fwd, dt_k__blocks(N * C, 256, 4096u), 256, 0, stream, out, table, ids, ids_i64, N, Vl,
                C, vocab_start);
    return DT_K_CHECK();
}

int dt_k_tp_embedding_bwd(float *dtable, const float *dout, const void *ids, int ids_i64, int64_t N, int64_t Vl,
                          int64_t C, int64_t vocab_start, void *stream) {
    if (dt_k__pl_bad(N, C) || dt_k__pl_bad(Vl, C) || (ids_i64 != 0 && ids_i64 != 1)) return (int)cudaErrorInvalidValue;
    if (N * C == 0) return 0;
    DT_K_LAUNCH(dt_k__tp_embedding_bwd, dt_k__blocks(C, 64, 4096u), 64, 0, stream, dtable, dout, ids, ids_i64, N, Vl, C,
                vocab_start);
    return DT_K_CHECK();
}

int dt_k_tp_xent_fwd(double *buf, float *stats, const float *logits, const int32_t *targets, int ignore_index,
                     int64_t N, int64_t Vl, int64_t nv, int64_t vocab_start, int phase, void *stream) {
    if (dt_k__pl_bad(N, Vl) || nv < 0 || nv > Vl || phase < 0 || phase > 2) return (int)cudaErrorInvalidValue;
    if (N == 0) return 0;
    DT_K_LAUNCH(dt_k__tp_xent_fwd, dt_k__blocks(N, 64, 4096u), 64, 0, stream, buf, stats, logits, targets, ignore_index,
                N, Vl, nv, vocab_start, phase);
    return DT_K_CHECK();
}

int dt_k_tp_xent_bwd(float *dlogits, const float *logits, const float *stats, const int32_t *targets, int ignore_index,
                     float dloss, int64_t n_valid, int64_t N, int64_t Vl, int64_t nv, int64_t vocab_start,
                     void *stream) {
    if (dt_k__pl_bad(N, Vl) || nv < 0 || nv > Vl || n_valid < 0 || n_valid > N) return (int)cudaErrorInvalidValue;
    if (n_valid == 0 || N * Vl == 0) return 0;
    /* the CPU's scale, computed the same way */
    DT_K_LAUNCH(dt_k__tp_xent_bwd, dt_k__blocks(N * Vl, 256, 4096u), 256, 0, stream, dlogits, logits, stats, targets,
                ignore_index, dloss / (float)n_valid, N, Vl, nv, vocab_start);
    return DT_K_CHECK();
}

int dt_k_concat(float *whole, float *part, int64_t R, int64_t W, int64_t col0, int64_t C, int to_whole, int accumulate,
                void *stream) {
    if (dt_k__pl_bad(R, W) || col0 < 0 || C < 0 || col0 > W - C || (to_whole != 0 && to_whole != 1) ||
        (accumulate != 0 && accumulate != 1))
        return (int)cudaErrorInvalidValue;
    if (R * C == 0) return 0;
    DT_K_LAUNCH(dt_k__concat, dt_k__blocks(R * C, 256, 4096u), 256, 0, stream, whole, part, R, W, col0, C, to_whole,
                accumulate);
    return DT_K_CHECK();
}
