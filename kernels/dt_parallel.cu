/* kernels/dt_parallel.cu - the kernels of dt_parallel.h's tensor-parallel layers on CUDA tensors
   (kernels/dt_kernels.h, "tensor parallel"): the vocab-parallel embedding (rows outside this
   rank's vocab range give zeros, the sum over tp fills them) and cross entropy (per row the max,
   the sum of exp and the target logit; the logits never leave the device, the loss is written to
   the device), and the column copies of dt_concat / dt_split (qkv packing of examples/gpt).

   Nothing here waits for the host or allocates: scratch comes from the caller (dt_parallel.h
   takes it from dt_cuda_scratch), and the per-row values cross the tp ranks through dt_comm on
   device buffers between the launches.
   The embedding backward must not race on a row that several ids share, and must not depend on
   timing: the (row, position) pairs are sorted (one block, bitonic: the key holds the position,
   so the order is unique), then the first position of each row's run adds the run's dout rows in
   position order into that row, one thread per column. That is the CPU loop's order for every
   element, so the sums are the CPU's bit for bit, with no atomics.
   The cross entropy is one block per row, reading the row coalesced: the block's max, then its
   sum of exp(z - max) (each term <= 1; per-thread partial sums, then the fixed tree of
   dt_k_block_sum: deterministic, within (nv / threads + 10) ulps of the exact sum, not the CPU's
   column-order double sum). Across tp the local sum is rescaled to the global max. The
   loss is the mean of the rows' losses, summed in double by one block in a fixed order.
                                                                    MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <math.h>
#include <stdint.h>

static __device__ __forceinline__ int64_t dt_k__pl_id(const void *ids, int ids_i64, int64_t n) {
    return ids_i64 ? ((const int64_t *)ids)[n] : (int64_t)((const int32_t *)ids)[n];
}

/* Threads per row of n columns: whole warps (the block reductions need them), about 8 columns
   each, 32..512: a GPT vocab gets 512 threads, a small one a warp rather than idle threads. */
static int dt_k__pl_threads(int64_t n) {
    int64_t t = n > 8 * 512 ? 512 : dt_k__ceil_div(dt_k__ceil_div(n, 8), 32) * 32;
    return t < 32 ? 32 : t > 512 ? 512 : (int)t;
}

/* out[n, :] = table[ids[n] - vocab_start, :] when that row is this rank's, else 0. */
static __global__ void dt_k__tp_embedding_fwd(float *out, const float *__restrict__ table, const void *ids, int ids_i64,
                                              int64_t N, int64_t Vl, int64_t C, int64_t vocab_start) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = i / C, c = i - n * C, r = dt_k__pl_id(ids, ids_i64, n) - vocab_start;
        out[i] = r >= 0 && r < Vl ? table[r * C + c] : 0.0f;
    }
}

#define DT_K__PL_NONE 0xffffffffffffffffull /* the key of an id another rank holds: sorts last */

/* One block: keys[i] = (row << 32) | i for the ids of this rank (i < N), DT_K__PL_NONE for the
   others and the padding up to P (a power of two), then a bitonic sort of the P keys in place.
   Keys are unique, so the result does not depend on the compare order. */
static __global__ void dt_k__tp_embedding_sort(uint64_t *keys, const void *ids, int ids_i64, int64_t N, int64_t P,
                                               int64_t Vl, int64_t vocab_start) {
    for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
        int64_t r = i < N ? dt_k__pl_id(ids, ids_i64, i) - vocab_start : -1;
        keys[i] = r >= 0 && r < Vl ? ((uint64_t)r << 32) | (uint64_t)i : DT_K__PL_NONE;
    }
    for (int64_t k = 2; k <= P; k <<= 1)
        for (int64_t j = k >> 1; j > 0; j >>= 1) {
            __syncthreads(); /* the block's global writes of the last round are seen */
            for (int64_t i = threadIdx.x; i < P; i += blockDim.x) {
                int64_t m = i ^ j;
                if (m <= i) continue;
                uint64_t a = keys[i], b = keys[m];
                if ((a > b) == ((i & k) == 0)) { keys[i] = b; keys[m] = a; }
            }
        }
}

/* Block per sorted position i that starts a row's run: dtable[row, c] += dout[n, c] for the run's
   positions n, in increasing n (the CPU's order), each column by one thread. */
static __global__ void dt_k__tp_embedding_bwd(float *dtable, const float *__restrict__ dout,
                                              const uint64_t *__restrict__ keys, int64_t N, int64_t C) {
    for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
        uint64_t key = keys[i], row = key >> 32;
        if (key == DT_K__PL_NONE || (i > 0 && keys[i - 1] >> 32 == row)) continue;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = dtable[(int64_t)row * C + c];
            for (int64_t j = i; j < N && keys[j] != DT_K__PL_NONE && keys[j] >> 32 == row; j++)
                acc += dout[(int64_t)(keys[j] & 0xffffffffu) * C + c];
            dtable[(int64_t)row * C + c] = acc;
        }
    }
}

/* Block per row r of logits [N, Vl] (nv real columns): mloc[r] = mglob[r] = the max of the real
   columns (-inf without one), sz[2r] = sum of exp(z - max), sz[2r+1] = the target's logit (0 when
   another rank holds it or it is ignored). vec (Vl a multiple of 4, logits 16-byte aligned: every
   row is): the real columns four at a time by 16-byte loads, the last nv % 4 one at a time. */
static __global__ void dt_k__tp_xent_rows(float *mloc, float *mglob, float *sz, const float *__restrict__ logits,
                                          const int32_t *__restrict__ targets, int ignore_index, int64_t N,
                                          int64_t Vl, int64_t nv, int64_t vocab_start, int vec) {
    const int64_t n4 = vec ? nv / 4 : 0;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const float *z = logits + r * Vl;
        float mx = -INFINITY, s = 0.0f;
        for (int64_t c = threadIdx.x; c < n4; c += blockDim.x) {
            float4 a = dt_k_load4(z + 4 * c);
            mx = fmaxf(fmaxf(mx, a.x), fmaxf(a.y, fmaxf(a.z, a.w)));
        }
        for (int64_t c = 4 * n4 + threadIdx.x; c < nv; c += blockDim.x) mx = fmaxf(mx, z[c]);
        mx = dt_k_block_max(mx);
        for (int64_t c = threadIdx.x; c < n4; c += blockDim.x) {
            float4 a = dt_k_load4(z + 4 * c);
            s += expf(a.x - mx); s += expf(a.y - mx); s += expf(a.z - mx); s += expf(a.w - mx);
        }
        for (int64_t c = 4 * n4 + threadIdx.x; c < nv; c += blockDim.x) s += expf(z[c] - mx);
        s = dt_k_block_sum(s);
        if (threadIdx.x == 0) {
            int64_t t = (int64_t)targets[r] - vocab_start;
            mloc[r] = mglob[r] = mx;
            sz[2 * r] = s;
            sz[2 * r + 1] = targets[r] != ignore_index && t >= 0 && t < nv ? z[t] : 0.0f;
        }
    }
}

/* After the max over tp: each rank's sum of exp(z - its max) becomes a sum of exp(z - the max). */
static __global__ void dt_k__tp_xent_rescale(float *sz, const float *__restrict__ mloc, const float *__restrict__ mglob,
                                             int64_t N) {
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < N; r += (int64_t)gridDim.x * blockDim.x) {
        if (mloc[r] == -INFINITY) sz[2 * r] = 0.0f; /* no real column here */
        else if (mloc[r] != mglob[r]) sz[2 * r] *= expf(mloc[r] - mglob[r]);
    }
}

/* One block: stats[r] = (max, log s + max), and slot = (mean over the rows not ignored of
   log s + max - z_target, their count), both sums in double in a fixed order. */
static __global__ void dt_k__tp_xent_loss(double *slot, float *stats, const float *__restrict__ mglob,
                                          const float *__restrict__ sz, const int32_t *__restrict__ targets,
                                          int ignore_index, int64_t N) {
    double sum = 0.0, cnt = 0.0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) {
        double mx = mglob[r], ls = log((double)sz[2 * r]);
        if (stats) {
            stats[2 * r] = (float)mx;
            stats[2 * r + 1] = (float)(ls + mx);
        }
        if (targets[r] != ignore_index) {
            sum += ls + mx - (double)sz[2 * r + 1];
            cnt += 1.0;
        }
    }
    sum = dt_k_block_sum(sum);
    cnt = dt_k_block_sum(cnt);
    if (threadIdx.x == 0) {
        slot[0] = cnt > 0 ? sum / cnt : 0.0;
        slot[1] = cnt;
    }
}

/* One block: *count = the targets not ignored (exact: integers in double). */
static __global__ void dt_k__tp_xent_count(double *count, const int32_t *__restrict__ targets, int ignore_index,
                                           int64_t N) {
    double c = 0.0;
    for (int64_t r = threadIdx.x; r < N; r += blockDim.x) c += targets[r] != ignore_index ? 1.0 : 0.0;
    c = dt_k_block_sum(c);
    if (threadIdx.x == 0) *count = c;
}

/* dlogits[r, c] = s (exp(z - lse) - [c == t]) on a real column (c < nv) of a row not ignored
   (skip = 0), else 0: every element is written, so the caller zero-fills nothing. */
static __device__ __forceinline__ float dt_k__xent_g(float z, float lse, float s, int64_t c, int64_t t, int64_t nv,
                                                     int skip) {
    return skip || c >= nv ? 0.0f : s * (expf(z - lse) - (c == t ? 1.0f : 0.0f));
}

/* Block per row, one pass: read the row's logits, its lse and target, write its dlogits (as
   llm.c's fused classifier), s = dloss / n_valid with n_valid read from the device (the CPU's
   scale, computed the same way). Threads over columns, coalesced; vec = 1 (the launcher checked
   that Vl is a multiple of 4 and both pointers 16-byte aligned, so every row is): one float4 per
   thread and step. Each element is read before it is written by the same thread, so dlogits may
   be logits itself (no __restrict__ on them). */
static __global__ void dt_k__tp_xent_bwd(float *dlogits, const float *logits, const float *__restrict__ stats,
                                         const int32_t *__restrict__ targets, int ignore_index, float dloss,
                                         const double *__restrict__ count, int64_t N, int64_t Vl, int64_t nv,
                                         int64_t vocab_start, int vec) {
    int64_t n = (int64_t)*count;
    float s = n ? dloss / (float)n : 0.0f;
    for (int64_t r = blockIdx.x; r < N; r += gridDim.x) {
        const float *z = logits + r * Vl;
        float *g = dlogits + r * Vl, lse = stats[2 * r + 1];
        int64_t t = targets[r];
        int skip = n == 0 || t == ignore_index;
        t -= vocab_start;
        if (vec) {
            for (int64_t c = 4 * (int64_t)threadIdx.x; c < Vl; c += 4 * (int64_t)blockDim.x) {
                float4 v = dt_k_load4(z + c);
                v.x = dt_k__xent_g(v.x, lse, s, c, t, nv, skip);
                v.y = dt_k__xent_g(v.y, lse, s, c + 1, t, nv, skip);
                v.z = dt_k__xent_g(v.z, lse, s, c + 2, t, nv, skip);
                v.w = dt_k__xent_g(v.w, lse, s, c + 3, t, nv, skip);
                dt_k_store4(g + c, v);
            }
        } else {
            for (int64_t c = threadIdx.x; c < Vl; c += blockDim.x) g[c] = dt_k__xent_g(z[c], lse, s, c, t, nv, skip);
        }
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

/* dst[r ds + c] (=, or +=) src[r ss + c] over [R, C], one thread an element. */
static __global__ void dt_k__cols_copy(float *__restrict__ dst, int64_t ds, const float *__restrict__ src, int64_t ss,
                                       int64_t R, int64_t C, int accumulate) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < R * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / C, c = i - r * C;
        float v = src[r * ss + c];
        dst[r * ds + c] = accumulate ? dst[r * ds + c] + v : v;
    }
}

/* dt_k__cols_copy of 2-byte elements (bf16 bits), copied as they are. */
static __global__ void dt_k__cols_copy16(uint16_t *__restrict__ dst, int64_t ds, const uint16_t *__restrict__ src,
                                         int64_t ss, int64_t R, int64_t C) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < R * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / C, c = i - r * C;
        dst[r * ds + c] = src[r * ss + c];
    }
}

/* Element (b, t, e) of seq [B, T, w] and its place in shards [cp, B, T / cp, w]: position t is in
   chunk k = t / ch (ch = T / (2 cp)); rank k holds chunk k first, rank 2 cp - 1 - k holds it
   second (dt_cp_position, inverted). */
static __global__ void dt_k__cp_rows(float *seq, float *shards, int64_t B, int64_t T, int cp, int64_t w, int to_seq) {
    int64_t Tl = T / cp, ch = cp > 1 ? T / (2 * (int64_t)cp) : T;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < B * T * w; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = i % w, bt = i / w, t = bt % T, b = bt / T, k = t / ch, rank, j;
        if (k < cp) rank = k, j = t - k * ch;
        else rank = 2 * (int64_t)cp - 1 - k, j = ch + t - k * ch;
        float *s = shards + ((rank * B + b) * Tl + j) * w + e;
        if (to_seq) seq[i] = *s;
        else *s = seq[i];
    }
}

static int dt_k__pl_bad(int64_t a, int64_t b) { return a < 0 || b < 0 || (b && a > INT64_MAX / b); }

/* The sort's key count: N rounded up to a power of two (1 for N <= 1). */
static int64_t dt_k__pl_pow2(int64_t N) {
    int64_t p = 1;
    while (p < N) p <<= 1;
    return p;
}

int dt_k_tp_embedding_fwd(float *out, const float *table, const void *ids, int ids_i64, int64_t N, int64_t Vl,
                          int64_t C, int64_t vocab_start, void *stream) {
    if (dt_k__pl_bad(N, C) || dt_k__pl_bad(Vl, C) || (ids_i64 != 0 && ids_i64 != 1)) return (int)cudaErrorInvalidValue;
    if (N * C == 0) return 0;
    if (!out || !ids || (Vl && !table)) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__tp_embedding_fwd, dt_k__blocks(N * C, 256, 4096u), 256, 0, stream, out, table, ids, ids_i64, N, Vl,
                C, vocab_start);
    return DT_K_CHECK();
}

size_t dt_k_tp_embedding_bwd_scratch(int64_t N) {
    return N < 0 || N > 0xffffffffll ? 0 : (size_t)dt_k__pl_pow2(N) * sizeof(uint64_t);
}

int dt_k_tp_embedding_bwd(float *dtable, const float *dout, const void *ids, int ids_i64, int64_t N, int64_t Vl,
                          int64_t C, int64_t vocab_start, void *scratch, void *stream) {
    int64_t P;
    if (dt_k__pl_bad(N, C) || dt_k__pl_bad(Vl, C) || (ids_i64 != 0 && ids_i64 != 1) || N > 0xffffffffll ||
        Vl >= 0xffffffffll || (N && !scratch))
        return (int)cudaErrorInvalidValue;
    if (N * C == 0) return 0;
    if (!ids || (Vl && (!dtable || !dout))) return (int)cudaErrorInvalidValue; /* no row here: nothing read */
    P = dt_k__pl_pow2(N);
    DT_K_LAUNCH(dt_k__tp_embedding_sort, 1, P / 2 < 32 ? 32 : P / 2 > 1024 ? 1024 : (int)(P / 2), 0, stream,
                (uint64_t *)scratch, ids, ids_i64, N, P, Vl, vocab_start);
    DT_K_LAUNCH(dt_k__tp_embedding_bwd, N > 65535 ? 65535u : (unsigned int)N, dt_k__pl_threads(C), 0, stream, dtable,
                dout, (const uint64_t *)scratch, N, C);
    return DT_K_CHECK();
}

int dt_k_tp_xent_fwd(float *mloc, float *mglob, float *sz, const float *logits, const int32_t *targets,
                     int ignore_index, int64_t N, int64_t Vl, int64_t nv, int64_t vocab_start, void *stream) {
    if (dt_k__pl_bad(N, Vl) || nv < 0 || nv > Vl) return (int)cudaErrorInvalidValue;
    if (N == 0) return 0;
    if (!mloc || !mglob || !sz || !targets || (nv && !logits)) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__tp_xent_rows, N > 65535 ? 65535u : (unsigned int)N, dt_k__pl_threads(nv), 0, stream, mloc, mglob,
                sz, logits, targets, ignore_index, N, Vl, nv, vocab_start, Vl % 4 == 0 && dt_k_aligned(logits, 16));
    return DT_K_CHECK();
}

int dt_k_tp_xent_rescale(float *sz, const float *mloc, const float *mglob, int64_t N, void *stream) {
    if (N < 0 || (N > 0 && (!sz || !mloc || !mglob))) return (int)cudaErrorInvalidValue;
    if (N == 0) return 0;
    DT_K_LAUNCH(dt_k__tp_xent_rescale, dt_k__blocks(N, 256, 4096u), 256, 0, stream, sz, mloc, mglob, N);
    return DT_K_CHECK();
}

int dt_k_tp_xent_loss(double *slot, float *stats, const float *mglob, const float *sz, const int32_t *targets,
                      int ignore_index, int64_t N, void *stream) {
    if (N < 0 || !slot || (N > 0 && (!mglob || !sz || !targets))) return (int)cudaErrorInvalidValue;
    /* also for N = 0: the slot says (0, 0) */
    DT_K_LAUNCH(dt_k__tp_xent_loss, 1, dt_k__pl_threads(N < 4096 ? N : 4096), 0, stream, slot, stats, mglob, sz,
                targets, ignore_index, N);
    return DT_K_CHECK();
}

int dt_k_tp_xent_bwd(float *dlogits, const float *logits, const float *stats, const int32_t *targets, int ignore_index,
                     float dloss, double *count, int64_t N, int64_t Vl, int64_t nv, int64_t vocab_start, void *stream) {
    int vec;
    if (dt_k__pl_bad(N, Vl) || nv < 0 || nv > Vl || !count) return (int)cudaErrorInvalidValue;
    if (N * Vl == 0) return 0;
    if (!dlogits || !logits || !stats || !targets) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__tp_xent_count, 1, dt_k__pl_threads(N < 4096 ? N : 4096), 0, stream, count, targets, ignore_index,
                N);
    vec = Vl % 4 == 0 && dt_k_aligned(dlogits, 16) && dt_k_aligned(logits, 16);
    DT_K_LAUNCH(dt_k__tp_xent_bwd, N > 65535 ? 65535u : (unsigned int)N, dt_k__pl_threads(vec ? Vl / 4 : Vl), 0, stream,
                dlogits, logits, stats, targets, ignore_index, dloss, (const double *)count, N, Vl, nv, vocab_start,
                vec);
    return DT_K_CHECK();
}

int dt_k_cols_copy(float *dst, int64_t ds, const float *src, int64_t ss, int64_t R, int64_t C, int accumulate,
                   void *stream) {
    if (dt_k__pl_bad(R, C) || ds < C || ss < C || (R > 1 && (dt_k__pl_bad(R - 1, ds) || dt_k__pl_bad(R - 1, ss))) ||
        (accumulate != 0 && accumulate != 1) || (R * C != 0 && (!dst || !src)))
        return (int)cudaErrorInvalidValue;
    if (R * C == 0) return 0;
    DT_K_LAUNCH(dt_k__cols_copy, dt_k__blocks(R * C, 256, 4096u), 256, 0, stream, dst, ds, src, ss, R, C, accumulate);
    return DT_K_CHECK();
}

int dt_k_cols_copy16(uint16_t *dst, int64_t ds, const uint16_t *src, int64_t ss, int64_t R, int64_t C, void *stream) {
    if (dt_k__pl_bad(R, C) || ds < C || ss < C || (R > 1 && (dt_k__pl_bad(R - 1, ds) || dt_k__pl_bad(R - 1, ss))) ||
        (R * C != 0 && (!dst || !src)))
        return (int)cudaErrorInvalidValue;
    if (R * C == 0) return 0;
    DT_K_LAUNCH(dt_k__cols_copy16, dt_k__blocks(R * C, 256, 4096u), 256, 0, stream, dst, ds, src, ss, R, C);
    return DT_K_CHECK();
}

int dt_k_cp_rows(float *seq, float *shards, int64_t B, int64_t T, int cp, int64_t w, int to_seq, void *stream) {
    if (cp < 1 || dt_k__pl_bad(B, T) || dt_k__pl_bad(B * T, w) || (cp > 1 && T % (2 * (int64_t)cp)) ||
        (to_seq != 0 && to_seq != 1) || (B * T * w != 0 && (!seq || !shards)))
        return (int)cudaErrorInvalidValue;
    if (B * T * w == 0) return 0;
    DT_K_LAUNCH(dt_k__cp_rows, dt_k__blocks(B * T * w, 256, 4096u), 256, 0, stream, seq, shards, B, T, cp, w, to_seq);
    return DT_K_CHECK();
}

int dt_k_concat(float *whole, float *part, int64_t R, int64_t W, int64_t col0, int64_t C, int to_whole, int accumulate,
                void *stream) {
    if (dt_k__pl_bad(R, W) || col0 < 0 || C < 0 || col0 > W - C || (to_whole != 0 && to_whole != 1) ||
        (accumulate != 0 && accumulate != 1))
        return (int)cudaErrorInvalidValue;
    if (R * C == 0) return 0;
    if (!whole || !part) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__concat, dt_k__blocks(R * C, 256, 4096u), 256, 0, stream, whole, part, R, W, col0, C, to_whole,
                accumulate);
    return DT_K_CHECK();
}
