/* kernels/dt_embed.cu - embedding kernels: the dense gather / scatter of dt_embedding_fwd /
   _bwd; dt_embed.h's bag pooling (sum, mean, weighted) and its backward; id bucketization by
   owner; gradient dedup by a stable sort; the fused sparse row update (SGD, Adagrad, row-wise
   Adagrad); the DLRM dot interaction forward and backward.

   Exactness: pooling sums each bag in bag order from 0, one thread per column, as the CPU
   does, so the pooled vectors are the CPU's bits. The sparse update sums each row's gradient
   contributions in one order, fixed by a STABLE sort of the rows (equal rows keep the order the
   caller gave: dt_embed.h's (sample, feature, position) order), so it is the same bits every
   run. Only dt_k_embed_pool_bwd_dense adds with atomicAdd (order varies). The dot interaction
   sums through cuBLAS's GEMMs, in their order (fixed run to run, not the CPU's).

   Sorting without CUB: counting passes. A pass puts n keys into nb buckets stably in three
   launches (a grid-wide prefix needs a grid-wide sync): (1) each block counts the keys of its
   chunk of blockDim keys per bucket (shared-memory atomics); (2) one block turns the counts
   into each (block, bucket)'s first output position, bucket-major then block order; (3) each
   key goes to its (block, bucket) start + the number of keys before it in its chunk with the
   same bucket (a scan of the chunk in shared memory: O(chunk) per key, simple and stable).
   Bucketization is one pass with bucket = owner; the dedup sort is an LSD radix sort, one
   pass per byte of the largest row. */
#include "dt_cuda.cuh"
#include <math.h>
#include <stdint.h>

#define DT_K__CHUNK 256  /* keys per block in a counting pass */
#define DT_K__SMEM_MAX 49152

static int dt_k__thr(int64_t n, int cap) {
    int64_t t = n > cap ? cap : dt_k__ceil_div(n, 32) * 32;
    if (t < 32) t = 32;
    return (int)(t > cap ? cap : t);
}
static unsigned dt_k__grid(int64_t n, int threads) {
    int64_t b = dt_k__ceil_div(n, threads);
    return (unsigned)(b > 65535 ? 65535 : b < 1 ? 1 : b);
}

__device__ static int64_t dt_k__id(const void *ids, int i64, int64_t i) {
    return i64 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
}

__device__ static float dt_k__ld(const void *t, int dt, int64_t i) {
    if (dt == 2) return dt_k_bf16_to_f32(((const uint16_t *)t)[i]);
    if (dt == 3) return dt_k_f16_to_f32(((const uint16_t *)t)[i]);
    return ((const float *)t)[i];
}
__device__ static void dt_k__st(void *t, int dt, int64_t i, float x) {
    if (dt == 2) ((uint16_t *)t)[i] = dt_k_f32_to_bf16(x);
    else if (dt == 3) ((uint16_t *)t)[i] = dt_k_f32_to_f16(x);
    else ((float *)t)[i] = x;
}

/* ---------------------------------------------------------------- dense gather / scatter */

static __global__ void dt_k__emb_fwd(float *out, const float *table, const void *ids, int i64, int64_t N, int64_t V,
                              int64_t D, int *bad) {
    int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; x < N * D; x += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = x / D, d = x % D, id = dt_k__id(ids, i64, n);
        int ok = id >= 0 && id < V;
        if (!ok && bad) atomicMax(bad, 1);
        out[x] = ok ? table[id * D + d] : 0.0f;
    }
}

/* Block (c, s) sums into columns [32c, 32c + 32) (a warp's coalesced row segment; grid-stride
   over column chunks) of the table rows id with id % S == s; its thread row ty owns the ids of
   that class with (id / S) % ny == ty. The ids go through shared memory in tiles and every thread
   walks each whole tile in order, so each (id, column) is summed by one thread, in id order from
   the value it had: no atomics, the CPU op's order and bits, whatever the timing. */
#define DT_K__EMB_TILE 256
static __global__ void dt_k__emb_bwd(float *dtable, const float *dout, const void *ids, int i64, int64_t N, int64_t V,
                                     int64_t D, int64_t S) {
    __shared__ int64_t tile[DT_K__EMB_TILE];
    __shared__ int owner[DT_K__EMB_TILE]; /* the thread row that adds tile[k], or -1: decided once per tile */
    int64_t s = blockIdx.y, ny = blockDim.y;
    int ty = (int)threadIdx.y;
    int64_t nthreads = (int64_t)blockDim.x * blockDim.y, tid = (int64_t)threadIdx.y * blockDim.x + threadIdx.x;
    for (int64_t c0 = (int64_t)blockIdx.x * 32; c0 < D; c0 += (int64_t)gridDim.x * 32) {
        int64_t d = c0 + threadIdx.x;
        for (int64_t n0 = 0; n0 < N; n0 += DT_K__EMB_TILE) {
            int64_t m = N - n0 < DT_K__EMB_TILE ? N - n0 : DT_K__EMB_TILE;
            __syncthreads(); /* every thread is done with the previous tile */
            for (int64_t k = tid; k < m; k += nthreads) {
                int64_t id = dt_k__id(ids, i64, n0 + k);
                tile[k] = id;
                /* a bad id belongs to no one (the device check reports it) */
                owner[k] = id < 0 || id >= V || id % S != s ? -1 : (int)((id / S) % ny);
            }
            __syncthreads();
            if (d >= D) continue;
            for (int64_t k = 0; k < m; k++)
                if (owner[k] == ty) dtable[tile[k] * D + d] += dout[(n0 + k) * D + d];
        }
    }
}

static __global__ void dt_k__emb_bad(const void *ids, int i64, int64_t N, int64_t V, int *bad) {
    for (int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; n < N; n += (int64_t)gridDim.x * blockDim.x) {
        int64_t id = dt_k__id(ids, i64, n);
        if (id < 0 || id >= V) atomicMax(bad, 1);
    }
}

static int dt_k__emb_args(int ids_i64, int64_t N, int64_t V, int64_t D) {
    return (ids_i64 == 0 || ids_i64 == 1) && N >= 0 && V >= 0 && D >= 0 && (D == 0 || N <= INT64_MAX / D);
}

extern "C" int dt_k_embedding_fwd(float *out, const float *table, const void *ids, int ids_i64, int64_t N, int64_t V,
                                  int64_t D, int *bad_id, void *stream) {
    if (!dt_k__emb_args(ids_i64, N, V, D)) return (int)cudaErrorInvalidValue;
    if (N * D == 0) return 0;
    if (!out || !ids || (V && !table)) return (int)cudaErrorInvalidValue; /* V 0: every id is bad, no row read */
    DT_K_LAUNCH(dt_k__emb_fwd, dt_k__grid(N * D, 256), 256, 0, stream, out, table, ids, ids_i64, N, V, D, bad_id);
    return DT_K_CHECK();
}

extern "C" int dt_k_embedding_bwd(float *dtable, const float *dout, const void *ids, int ids_i64, int64_t N,
                                  int64_t V, int64_t D, int *bad_id, void *stream) {
    int64_t cols, S, ny;
    if (!dt_k__emb_args(ids_i64, N, V, D)) return (int)cudaErrorInvalidValue;
    if (N * D == 0 || V == 0 || !dtable) return 0;
    if (!ids || !dout) return (int)cudaErrorInvalidValue;
    if (bad_id) { /* the backward skips them; say so as the forward does */
        DT_K_LAUNCH(dt_k__emb_bad, dt_k__grid(N, 256), 256, 0, stream, ids, ids_i64, N, V, bad_id);
        if (int st = DT_K_CHECK()) return st;
    }
    /* S row classes x column chunks: enough blocks to fill a GPU (~256) without each thread's walk
       over the N ids dominating; ny thread rows share a block's class by (id / S) % ny */
    cols = dt_k__ceil_div(D, 32);
    S = 256 / cols;
    S = S < 1 ? 1 : S > V ? V : S > 65535 ? 65535 : S;
    ny = 4;
    DT_K_LAUNCH(dt_k__emb_bwd, dim3((unsigned)(cols < 65535 ? cols : 65535), (unsigned)S), dim3(32, (unsigned)ny), 0,
                stream, dtable, dout, ids, ids_i64, N, V, D, S);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- pooling */

/* One block per bag, one thread per column: the bag in order, from 0, as the CPU. */
static __global__ void dt_k__pool_fwd(float *out, const int64_t *out_off, const void *table, int dt,
                                      const int64_t *rows, const float *w, const int64_t *offs, int64_t D, int64_t ld,
                                      int mean) {
    int64_t b = blockIdx.x, j0 = offs[b], j1 = offs[b + 1], c, j, o = out_off ? out_off[b] : b * D;
    for (c = threadIdx.x; c < D; c += blockDim.x) {
        float acc = 0.0f;
        for (j = j0; j < j1; j++) {
            float v;
            if (rows[j] < 0) continue; /* a dynamic id not admitted: zeros */
            v = dt_k__ld(table, dt, rows[j] * ld + c);
            acc += w ? w[j] * v : v;
        }
        if (mean && j1 > j0) acc /= (float)(j1 - j0);
        out[o + c] = acc;
    }
}

/* grads[i, :] = w_i * dout[bag(i), :] (dout / length for mean), one block per bag; bag b's
   gradient row starts at dout_off[b] (NULL: b * D). */
static __global__ void dt_k__pool_bwd(float *grads, const float *dout, const int64_t *dout_off, const float *w,
                                      const int64_t *offs, int64_t n_bags, int64_t D, int mean) {
    int64_t b, j, c;
    for (b = blockIdx.x; b < n_bags; b += gridDim.x) {
        int64_t j0 = offs[b], j1 = offs[b + 1], o = dout_off ? dout_off[b] : b * D;
        for (c = threadIdx.x; c < D; c += blockDim.x) {
            float src = dout[o + c];
            if (mean && j1 > j0) src /= (float)(j1 - j0);
            for (j = j0; j < j1; j++) grads[j * D + c] = w ? w[j] * src : src;
        }
    }
}

/* One block per run r (grid-stride), one thread per column: out[dst + c] = (accum ? out[dst +
   c] : 0) + the run's segments in their order (a segment covers columns [c0, c0 + nc) of the
   run, read at src[src_off + c - c0]), then / div[r]. The adds are dst[c] += src[c] in the
   caller's segment order, as the CPU's scatter does, so the same bits. */
static __global__ void dt_k__gather_sum(float *out, const float *src, const int64_t *run, const int64_t *seg,
                                        const float *div, int64_t n_runs, int64_t n_segs, int accum) {
    int64_t r, c, s;
    for (r = blockIdx.x; r < n_runs; r += gridDim.x) {
        int64_t dst = run[3 * r], len = run[3 * r + 1], s0 = run[3 * r + 2];
        int64_t s1 = r + 1 < n_runs ? run[3 * (r + 1) + 2] : n_segs;
        for (c = threadIdx.x; c < len; c += blockDim.x) {
            float acc = accum ? out[dst + c] : 0.0f;
            for (s = s0; s < s1; s++) {
                int64_t c0 = seg[3 * s + 1], nc = seg[3 * s + 2];
                if (c >= c0 && c < c0 + nc) acc += src[seg[3 * s] + c - c0];
            }
            if (div) acc /= div[r];
            out[dst + c] = acc;
        }
    }
}

static __global__ void dt_k__pool_bwd_dense(float *dtable, const float *dout, const int64_t *rows, const float *w,
                                     const int64_t *offs, int64_t D, int mean) {
    int64_t b = blockIdx.x, j0 = offs[b], j1 = offs[b + 1], c, j;
    for (c = threadIdx.x; c < D; c += blockDim.x) {
        float src = dout[b * D + c];
        if (mean && j1 > j0) src /= (float)(j1 - j0);
        for (j = j0; j < j1; j++)
            if (rows[j] >= 0) atomicAdd(dtable + rows[j] * D + c, w ? w[j] * src : src);
    }
}

extern "C" int dt_k_embed_pool_fwd_at(float *out, const int64_t *out_offsets, const void *table, int table_dtype,
                                      const int64_t *rows, const float *weights, const int64_t *offsets,
                                      int64_t n_bags, int64_t D, int64_t ld, int mean, void *stream) {
    if (n_bags < 0 || n_bags > 2147483647LL || D < 0 || ld < D || table_dtype < 1 || table_dtype > 3 ||
        (mean != 0 && mean != 1) || (D && n_bags > INT64_MAX / D))
        return (int)cudaErrorInvalidValue;
    if (n_bags == 0 || D == 0) return 0;
    if (!out || !offsets) return (int)cudaErrorInvalidValue; /* rows, table: as many as offsets[n_bags] says */
    DT_K_LAUNCH(dt_k__pool_fwd, (unsigned)n_bags, dt_k__thr(D, 256), 0, stream, out, out_offsets, table, table_dtype,
                rows, weights, offsets, D, ld, mean);
    return DT_K_CHECK();
}

extern "C" int dt_k_embed_pool_fwd(float *out, const void *table, int table_dtype, const int64_t *rows,
                                   const float *weights, const int64_t *offsets, int64_t n_bags, int64_t D,
                                   int64_t ld, int mean, void *stream) {
    return dt_k_embed_pool_fwd_at(out, NULL, table, table_dtype, rows, weights, offsets, n_bags, D, ld, mean, stream);
}

extern "C" int dt_k_embed_pool_bwd(float *grads, const float *dout, const int64_t *dout_offsets,
                                   const float *weights, const int64_t *offsets, int64_t n_bags, int64_t D, int mean,
                                   void *stream) {
    if (n_bags < 0 || D < 0 || (mean != 0 && mean != 1) || (D && n_bags > INT64_MAX / D))
        return (int)cudaErrorInvalidValue;
    if (n_bags == 0 || D == 0) return 0;
    if (!dout || !offsets) return (int)cudaErrorInvalidValue; /* grads: as many rows as offsets[n_bags] says */
    DT_K_LAUNCH(dt_k__pool_bwd, dt_k__grid(n_bags, 1), dt_k__thr(D, 256), 0, stream, grads, dout, dout_offsets,
                weights, offsets, n_bags, D, mean);
    return DT_K_CHECK();
}

extern "C" int dt_k_embed_gather_sum(float *out, const float *src, const int64_t *runs, const int64_t *segs,
                                     const float *div, int64_t n_runs, int64_t n_segs, int64_t max_len, int accum,
                                     void *stream) {
    if (n_runs < 0 || n_segs < 0 || max_len < 0 || (accum != 0 && accum != 1) || n_runs > INT64_MAX / 3 ||
        n_segs > INT64_MAX / 3)
        return (int)cudaErrorInvalidValue;
    if (n_runs == 0 || max_len == 0) return 0;
    if (!out || !runs || (n_segs && !segs)) return (int)cudaErrorInvalidValue; /* src: where the segments say */
    DT_K_LAUNCH(dt_k__gather_sum, dt_k__grid(n_runs, 1), dt_k__thr(max_len, 256), 0, stream, out, src, runs, segs,
                div, n_runs, n_segs, accum);
    return DT_K_CHECK();
}

extern "C" int dt_k_embed_pool_bwd_dense(float *dtable, const float *dout, const int64_t *rows, const float *weights,
                                         const int64_t *offsets, int64_t n_bags, int64_t D, int mean, void *stream) {
    if (n_bags < 0 || n_bags > 2147483647LL || D < 0 || (mean != 0 && mean != 1) || (D && n_bags > INT64_MAX / D))
        return (int)cudaErrorInvalidValue;
    if (n_bags == 0 || D == 0) return 0;
    if (!dout || !offsets) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__pool_bwd_dense, (unsigned)n_bags, dt_k__thr(D, 256), 0, stream, dtable, dout, rows, weights,
                offsets, D, mean);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- the batch on the device */

/* dt_embed_hash_id: one splitmix64 step (the id as a uint64 plus the golden ratio, then the
   finaliser), as dt_embed.h. */
__device__ static uint64_t dt_k__embed_hash(int64_t id) {
    uint64_t z = (uint64_t)id + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The length of item q: lengths[q], or (desc != NULL) bag q = b m + k of a group of m features
   read from the kjt, feature k's input desc[2 k]: in_offs[fin B + b + 1] - in_offs[fin B + b]. */
__device__ static int64_t dt_k__bag_len(int64_t q, const int64_t *lengths, const int64_t *in_offs,
                                        const int64_t *desc, int m, int64_t B) {
    int64_t b, x;
    if (!desc) return lengths[q];
    b = q / m;
    x = desc[2 * (q % m)] * B + b;
    return in_offs[x + 1] - in_offs[x];
}

/* offs[0..n]: the exclusive prefix sums of the n lengths, and *total = offs[n] when total is not
   NULL. One block: each thread sums a contiguous chunk, thread 0 scans the 256 partials, each
   thread writes its chunk. Integer sums: exact in any order. */
static __global__ void dt_k__scan_len(int64_t *offs, int64_t *total, const int64_t *lengths, const int64_t *in_offs,
                                      const int64_t *desc, int m, int64_t B, int64_t n) {
    __shared__ int64_t part[256];
    int64_t per = dt_k__ceil_div(n, blockDim.x), i0 = threadIdx.x * per, i1 = i0 + per, s = 0, i;
    if (i0 > n) i0 = n;
    if (i1 > n) i1 = n;
    for (i = i0; i < i1; i++) s += dt_k__bag_len(i, lengths, in_offs, desc, m, B);
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t acc = 0, v;
        unsigned k;
        for (k = 0; k < blockDim.x; k++) { v = part[k]; part[k] = acc; acc += v; }
        offs[n] = acc;
        if (total) *total = acc;
    }
    __syncthreads();
    s = part[threadIdx.x];
    for (i = i0; i < i1; i++) {
        offs[i] = s;
        s += dt_k__bag_len(i, lengths, in_offs, desc, m, B);
    }
}

/* Bag q = b m + k of the group: its ids as rows (the id, or its hash mod hash_rows, minus row0),
   its weights (1 without), and where its pooled vector sits: b ldo + desc[2 k + 1]. A block
   per bag, threads over its ids. */
static __global__ void dt_k__bags(int64_t *rows, float *w, int64_t *doff, const int64_t *offs, const int64_t *in_offs,
                                  const void *ids, int i64, const float *weights, const int64_t *desc, int m,
                                  int64_t B, int64_t row0, int64_t hash_rows, int64_t ldo) {
    int64_t q, j;
    for (q = blockIdx.x; q < m * B; q += gridDim.x) {
        int64_t b = q / m, k = q % m, src = in_offs[desc[2 * k] * B + b], o = offs[q], n = offs[q + 1] - o;
        for (j = threadIdx.x; j < n; j += blockDim.x) {
            int64_t id = dt_k__id(ids, i64, src + j);
            rows[o + j] = (hash_rows > 0 ? (int64_t)(dt_k__embed_hash(id) % (uint64_t)hash_rows) : id) - row0;
            if (w) w[o + j] = weights ? weights[src + j] : 1.0f;
        }
        if (threadIdx.x == 0 && doff) doff[q] = b * ldo + desc[2 * k + 1];
    }
}

extern "C" int dt_k_embed_kjt_offsets(int64_t *in_offs, const int64_t *lengths, int64_t n, void *stream) {
    if (n < 0 || !in_offs || (n > 0 && !lengths)) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__scan_len, 1, 256, 0, stream, in_offs, (int64_t *)NULL, lengths, (const int64_t *)NULL,
                (const int64_t *)NULL, 1, (int64_t)0, n);
    return DT_K_CHECK();
}

extern "C" int dt_k_embed_bags(int64_t *rows, float *weights_out, int64_t *offs, int64_t *dout_offs, int64_t *total,
                               const int64_t *in_offs, const void *ids, int ids_i64, const float *weights,
                               const int64_t *desc, int m, int64_t B, int64_t row0, int64_t hash_rows, int64_t ldo,
                               void *stream) {
    int64_t nb;
    int st;
    if (m < 1 || B < 0 || hash_rows < 0 || !offs || !in_offs || !desc || !rows || (ids_i64 != 0 && ids_i64 != 1) ||
        B > (((int64_t)1 << 40) / m))
        return (int)cudaErrorInvalidValue;
    nb = (int64_t)m * B;
    DT_K_LAUNCH(dt_k__scan_len, 1, 256, 0, stream, offs, total, (const int64_t *)NULL, in_offs, desc, m, B, nb);
    if ((st = DT_K_CHECK()) || nb == 0) return st;
    DT_K_LAUNCH(dt_k__bags, dt_k__grid(nb, 1), 64, 0, stream, rows, weights_out, dout_offs, offs, in_offs, ids, ids_i64,
                weights, desc, m, B, row0, hash_rows, ldo);
    return DT_K_CHECK();
}

/* One thread: the table-major copies of a data-parallel backward from the received blocks (rank
   r's: [T counts][its rows, table by table]) and its floats (rank r's: each table's counts x
   dims[t] floats): desc = rows dst, src, len, then floats dst, src, len, W T each, (rank, table)
   at r T + t; the destinations table-major (table, then rank). */
static __global__ void dt_k__dp_copies(int64_t *desc, const int64_t *blocks, const int64_t *dims, int W, int T) {
    const int64_t WT = (int64_t)W * T; /* W T in int wrapped past 2^31 (rank, table) pairs */
    int64_t *rd = desc, *rs = rd + WT, *rl = rs + WT, *fd = rl + WT, *fs = fd + WT, *fl = fs + WT;
    int64_t base = 0, fbase = 0, o = 0, fo = 0;
    int64_t r, t;
    if (threadIdx.x || blockIdx.x) return;
    for (r = 0; r < W; r++) {
        int64_t p = base + T, fp = fbase;
        for (t = 0; t < T; t++) {
            int64_t c = blocks[base + t];
            rl[r * T + t] = c; rs[r * T + t] = p; p += c;
            fl[r * T + t] = c * dims[t]; fs[r * T + t] = fp; fp += c * dims[t];
        }
        base = p; fbase = fp;
    }
    for (t = 0; t < T; t++)
        for (r = 0; r < W; r++) {
            rd[r * T + t] = o; o += rl[r * T + t];
            fd[r * T + t] = fo; fo += fl[r * T + t];
        }
}

extern "C" int dt_k_embed_dp_copies(int64_t *desc, const int64_t *blocks, const int64_t *dims, int W, int T,
                                    void *stream) {
    if (W < 1 || T < 1 || !desc || !blocks || !dims) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__dp_copies, 1, 32, 0, stream, desc, blocks, dims, W, T);
    return DT_K_CHECK();
}

/* Sums of three values over a block (256 threads at most): each thread's exclusive prefix in
   ex[3], the block's totals in tot[3] (shared). Thread 0 scans sequentially: integers, exact. */
__device__ static void dt_k__scan3(int64_t (*part)[256], int64_t *tot, const int64_t *v, int64_t *ex) {
    int k;
    for (k = 0; k < 3; k++) part[k][threadIdx.x] = v[k];
    __syncthreads();
    if (threadIdx.x == 0)
        for (k = 0; k < 3; k++) {
            int64_t acc = 0, x;
            unsigned i;
            for (i = 0; i < blockDim.x; i++) { x = part[k][i]; part[k][i] = acc; acc += x; }
            tot[k] = acc;
        }
    __syncthreads();
    for (k = 0; k < 3; k++) ex[k] = part[k][threadIdx.x];
    __syncthreads(); /* part is reused by the next scan */
}

__device__ static int dt_k__row_owner(int64_t rows, int W, int64_t x) {
    int64_t q = rows / W, m = rows % W, big = m * (q + 1);
    return x < big ? (int)(x / (q + 1)) : (int)(m + (x - big) / q);
}

/* The requests of one bag (dt_embed.h's dt__em_generate, rule for rule): how many, and the u-th's
   destination, ids (m, first in the kjt), position in the bag, columns [c0, c0 + nc). fd is the
   feature's descriptor (DT_K_EMBED_FD int64: see dt_kernels.h). */
__device__ static int64_t dt_k__units(const int64_t *fd, int64_t n, int W) {
    int64_t u = 0;
    int k;
    switch (fd[0]) {
    case 1: return 1;
    case 2: case 3: return n;
    case 4:
        for (k = 0; k < W; k++) u += fd[4] * (k + 1) / W - fd[4] * k / W > 0;
        return u;
    default: return 0;
    }
}
__device__ static int64_t dt_k__rowof(const int64_t *fd, int64_t id) {
    return fd[5] ? (int64_t)(dt_k__embed_hash(id) % (uint64_t)fd[3]) : id;
}
__device__ static void dt_k__unit(const int64_t *fd, int64_t u, int64_t src, int64_t n, const void *ids, int i64,
                                  int W, int *dest, int64_t *m, int64_t *pos, int64_t *c0, int64_t *nc,
                                  int64_t *first) {
    int k;
    *m = n; *pos = 0; *c0 = 0; *nc = fd[4]; *first = src;
    if (fd[0] == 1) *dest = (int)fd[1];
    else if (fd[0] == 2 || fd[0] == 3) {
        int64_t row = dt_k__rowof(fd, dt_k__id(ids, i64, src + u));
        *dest = fd[0] == 2 ? dt_k__row_owner(fd[3], W, row) : (int)fd[1] + dt_k__row_owner(fd[3], (int)fd[2], row);
        *m = 1; *pos = u; *first = src + u;
    } else {
        for (k = 0; k < W; k++) {
            int64_t a = fd[4] * k / W, b = fd[4] * (k + 1) / W;
            if (b - a == 0) continue;
            if (u-- == 0) { *dest = k; *c0 = a; *nc = b - a; return; }
        }
    }
}

/* One block. Phase 0: the forward's runs (feature-major bag r = f B + b: its place in the
   pooled output, its dim, its first segment) and divisors. Phase 1, destination by
   destination: each thread counts its chunk's requests to d (bags in sample-major order, the
   generation order), a block scan gives their places, and the chunk is written: headers (f,
   global sample, position, ids), rows, weights, and each request's segment records. */
static __global__ void dt_k__requests(int64_t *sh, int64_t *sp, float *sf, int64_t *runs, int64_t *fseg,
                                      int64_t *brun, int64_t *bseg, float *dv, const int64_t *in_offs,
                                      const void *ids, int i64, const float *weights, const int64_t *fdesc, int F,
                                      int64_t B, int W, int64_t g0, int64_t ldo) {
    __shared__ int64_t part[3][256];
    __shared__ int64_t tot[3], base[3];
    int64_t R = (int64_t)F * B, per = dt_k__ceil_div(R, blockDim.x), q0 = threadIdx.x * per, q1 = q0 + per;
    int64_t v[3], ex[3], q, u;
    int d;
    if (q0 > R) q0 = R;
    if (q1 > R) q1 = R;
    v[0] = v[1] = v[2] = 0;
    for (q = q0; q < q1; q++) {
        const int64_t *fd = fdesc + (q / B) * DT_K_EMBED_FD;
        int64_t x = fd[6] * B + q % B;
        v[0] += dt_k__units(fd, in_offs[x + 1] - in_offs[x], W);
    }
    dt_k__scan3(part, tot, v, ex);
    for (q = q0; q < q1; q++) {
        const int64_t *fd = fdesc + (q / B) * DT_K_EMBED_FD;
        int64_t b = q % B, x = fd[6] * B + b, n = in_offs[x + 1] - in_offs[x];
        runs[3 * q] = b * ldo + fd[7]; runs[3 * q + 1] = fd[4]; runs[3 * q + 2] = ex[0];
        dv[q] = fd[8] && n > 0 && fd[0] != 0 ? (float)n : 1.0f;
        ex[0] += dt_k__units(fd, n, W);
    }
    if (threadIdx.x == 0) base[0] = base[1] = base[2] = 0;
    __syncthreads(); /* the runs' first segments are read below */
    for (d = 0; d < W; d++) {
        int pass;
        v[0] = v[1] = v[2] = 0;
        for (pass = 0; pass < 2; pass++) {
            if (pass == 1) dt_k__scan3(part, tot, v, ex);
            for (q = q0; q < q1; q++) { /* sample-major: q = b F + f */
                int64_t b = q / F, f = q % F;
                const int64_t *fd = fdesc + f * DT_K_EMBED_FD;
                int64_t x = fd[6] * B + b, src = in_offs[x], n = in_offs[x + 1] - src, nu = dt_k__units(fd, n, W);
                for (u = 0; u < nu; u++) {
                    int dest = -1;
                    int64_t m, pos, c0, nc, first, j, k, hq, pp, rr;
                    dt_k__unit(fd, u, src, n, ids, i64, W, &dest, &m, &pos, &c0, &nc, &first);
                    if (dest != d) continue;
                    if (pass == 0) { v[0]++; v[1] += m; v[2] += nc; continue; }
                    hq = base[0] + ex[0]; pp = base[1] + ex[1]; rr = base[2] + ex[2];
                    sh[4 * hq] = f; sh[4 * hq + 1] = g0 + b; sh[4 * hq + 2] = pos; sh[4 * hq + 3] = m;
                    for (j = 0; j < m; j++) {
                        sp[pp + j] = dt_k__rowof(fd, dt_k__id(ids, i64, first + j));
                        if (sf) sf[pp + j] = fd[9] && weights ? weights[first + j] : 1.0f;
                    }
                    k = runs[3 * (f * B + b) + 2] + u;
                    fseg[3 * k] = rr; fseg[3 * k + 1] = c0; fseg[3 * k + 2] = nc;
                    brun[3 * k] = rr; brun[3 * k + 1] = nc; brun[3 * k + 2] = k;
                    bseg[3 * k] = b * ldo + fd[7] + c0; bseg[3 * k + 1] = 0; bseg[3 * k + 2] = nc;
                    dv[R + k] = fd[8] && n > 0 ? (float)n : 1.0f;
                    ex[0]++; ex[1] += m; ex[2] += nc;
                }
            }
        }
        __syncthreads(); /* every thread has written with the old bases */
        if (threadIdx.x == 0) { base[0] += tot[0]; base[1] += tot[1]; base[2] += tot[2]; }
        __syncthreads();
    }
}

extern "C" int dt_k_embed_requests(int64_t *send_hdr, int64_t *send_rows, float *send_w, int64_t *runs,
                                   int64_t *fsegs, int64_t *bruns, int64_t *bsegs, float *div, const int64_t *in_offs,
                                   const void *ids, int ids_i64, const float *weights, const int64_t *fdesc, int F,
                                   int64_t B, int W, int64_t g0, int64_t ldo, void *stream) {
    if (F < 1 || B < 0 || W < 1 || !in_offs || !fdesc || !runs || !div || (ids_i64 != 0 && ids_i64 != 1) ||
        B > INT64_MAX / 3 / F) /* runs[3 F B] */
        return (int)cudaErrorInvalidValue;
    if (B == 0) return 0;
    DT_K_LAUNCH(dt_k__requests, 1, 256, 0, stream, send_hdr, send_rows, send_w, runs, fsegs, bruns, bsegs, div, in_offs,
                ids, ids_i64, weights, fdesc, F, B, W, g0, ldo);
    return DT_K_CHECK();
}

/* One block. Each received request's first id (a scan of the lengths) and its result's place in
   the response (a scan of the owner's columns), then, table by table, its requests in arrival
   order (the CPU's (global sample, feature, position) order): rows (local), bag offsets, the
   results' places, weights. */
static __global__ void dt_k__serve_layout(int64_t *meta, float *mw, int64_t *scr, const int64_t *rh, const int64_t *rp,
                                          const float *rf, const int64_t *fdesc, int64_t nq, int T) {
    __shared__ int64_t part[3][256];
    __shared__ int64_t tot[3], ib, wb;
    int64_t per = dt_k__ceil_div(nq, blockDim.x), q0 = threadIdx.x * per, q1 = q0 + per, v[3], ex[3], q, j;
    int t;
    if (q0 > nq) q0 = nq;
    if (q1 > nq) q1 = nq;
    v[0] = v[1] = v[2] = 0;
    for (q = q0; q < q1; q++) { v[0] += rh[4 * q + 3]; v[1] += fdesc[rh[4 * q] * DT_K_EMBED_FD + 11]; }
    dt_k__scan3(part, tot, v, ex);
    for (q = q0; q < q1; q++) {
        scr[q] = ex[0]; scr[nq + q] = ex[1];
        ex[0] += rh[4 * q + 3]; ex[1] += fdesc[rh[4 * q] * DT_K_EMBED_FD + 11];
    }
    if (threadIdx.x == 0) ib = wb = 0;
    __syncthreads();
    for (t = 0; t < T; t++) {
        int pass;
        v[0] = v[1] = v[2] = 0;
        for (pass = 0; pass < 2; pass++) {
            if (pass == 1) dt_k__scan3(part, tot, v, ex);
            for (q = q0; q < q1; q++) {
                const int64_t *fd = fdesc + rh[4 * q] * DT_K_EMBED_FD;
                int64_t m = rh[4 * q + 3], *rows, *offs, *dst;
                if (fd[10] != t) continue;
                if (pass == 0) { v[0]++; v[1] += m; continue; }
                rows = meta + ib; offs = rows + tot[1]; dst = offs + tot[0] + 1;
                offs[ex[0]] = ex[1]; dst[ex[0]] = scr[nq + q];
                for (j = 0; j < m; j++) {
                    rows[ex[1] + j] = rp[scr[q] + j] - fd[12];
                    mw[wb + ex[1] + j] = rf ? rf[scr[q] + j] : 1.0f;
                }
                ex[0]++; ex[1] += m;
            }
        }
        __syncthreads(); /* every thread has written with the old bases */
        if (threadIdx.x == 0) {
            meta[ib + tot[1] + tot[0]] = tot[1]; /* offs[nb] = n */
            ib += tot[1] + 2 * tot[0] + 1; wb += tot[1];
        }
        __syncthreads();
    }
}

extern "C" int dt_k_embed_serve_layout(int64_t *meta, float *weights_out, int64_t *scratch, const int64_t *recv_hdr,
                                       const int64_t *recv_rows, const float *recv_w, const int64_t *fdesc,
                                       int64_t n_requests, int T, void *stream) {
    if (n_requests < 0 || n_requests > INT64_MAX / 4 || T < 1 || !meta || !weights_out || !fdesc || /* recv_hdr[4 n] */
        (n_requests > 0 && (!scratch || !recv_hdr)))
        return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__serve_layout, 1, 256, 0, stream, meta, weights_out, scratch, recv_hdr, recv_rows, recv_w, fdesc,
                n_requests, T);
    return DT_K_CHECK();
}

/* *acc += *x (one thread): device counters read only when asked (dt_embed's stats). */
static __global__ void dt_k__add_i64(int64_t *acc, const int64_t *x) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *acc += *x;
}

extern "C" int dt_k_embed_add_i64(int64_t *acc, const int64_t *x, void *stream) {
    if (!acc || !x) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__add_i64, 1, 32, 0, stream, acc, x);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- counting passes */

/* The bucket of key x: mode 0 the row-wise owner of row x (rows over W ranks; -1 outside
   [0, rows)), mode 1 byte `shift / 8` of x (masked to nb buckets, a power of two), a negative x
   read as `rows` (so the rows to skip sort after every real row). */
__device__ static int dt_k__bucket(int64_t x, int mode, int64_t rows, int W, int shift, int nb) {
    if (mode == 1) {
        uint64_t k = x < 0 ? (uint64_t)rows : (uint64_t)x;
        return (int)((k >> shift) & (uint64_t)(nb - 1)); /* nb: 256, or 1 */
    }
    if (x < 0 || x >= rows) return -1;
    {
        int64_t q = rows / W, m = rows % W, big = m * (q + 1);
        return x < big ? (int)(x / (q + 1)) : (int)(m + (x - big) / q);
    }
}

/* (1) counts[blk * nb + k] = keys of block blk's chunk in bucket k. */
static __global__ void dt_k__count(int *counts, const int64_t *keys, int64_t n, int nb, int mode, int64_t rows, int W,
                            int shift, int *bad) {
    DT_K_SHARED_DYNAMIC(int, h);
    int64_t i = (int64_t)blockIdx.x * DT_K__CHUNK + threadIdx.x;
    int k;
    for (k = threadIdx.x; k < nb; k += blockDim.x) h[k] = 0;
    __syncthreads();
    if (i < n) {
        k = dt_k__bucket(keys[i], mode, rows, W, shift, nb);
        if (k >= 0) atomicAdd(h + k, 1);
        else if (bad) atomicMax(bad, 1);
    }
    __syncthreads();
    for (k = threadIdx.x; k < nb; k += blockDim.x) counts[(int64_t)blockIdx.x * nb + k] = h[k];
}

/* (2) One block: counts become each (block, bucket)'s first output position; totals[k] (may be
   NULL) = the keys in bucket k. */
static __global__ void dt_k__scan(int *counts, int64_t *totals, int nblk, int nb) {
    DT_K_SHARED_DYNAMIC(int, start);
    int k, b;
    for (k = threadIdx.x; k < nb; k += blockDim.x) { /* within bucket k, in block order */
        int run = 0;
        for (b = 0; b < nblk; b++) {
            int c = counts[(int64_t)b * nb + k];
            counts[(int64_t)b * nb + k] = run;
            run += c;
        }
        start[k] = run;
        if (totals) totals[k] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* bucket starts: a serial scan of at most a few thousand buckets */
        int run = 0;
        for (k = 0; k < nb; k++) {
            int c = start[k];
            start[k] = run;
            run += c;
        }
    }
    __syncthreads();
    for (k = threadIdx.x; k < nb; k += blockDim.x)
        for (b = 0; b < nblk; b++) counts[(int64_t)b * nb + k] += start[k];
}

/* (3) Stable scatter: dest = start of (block, bucket) + earlier keys of the chunk in the bucket.
   With out_keys: out_keys[dest] = key, out_idx[dest] = in_idx[i] (a sort pass); else dest[i]. */
static __global__ void dt_k__scatter(int64_t *dest, int64_t *out_keys, int64_t *out_idx, const int *counts,
                              const int64_t *keys, const int64_t *in_idx, int64_t n, int nb, int mode, int64_t rows,
                              int W, int shift) {
    __shared__ int bk[DT_K__CHUNK];
    int64_t i = (int64_t)blockIdx.x * DT_K__CHUNK + threadIdx.x;
    int k = -1, j, rank = 0;
    if (i < n) k = dt_k__bucket(keys[i], mode, rows, W, shift, nb);
    bk[threadIdx.x] = k;
    __syncthreads();
    if (i >= n) return;
    if (k < 0) { /* outside every owner's rows (bucketize only) */
        if (dest) dest[i] = -1;
        return;
    }
    for (j = 0; j < (int)threadIdx.x; j++) rank += bk[j] == k;
    {
        int64_t d = (int64_t)counts[(int64_t)blockIdx.x * nb + k] + rank;
        if (out_keys) {
            out_keys[d] = keys[i];
            out_idx[d] = in_idx ? in_idx[i] : i;
        } else {
            dest[i] = d;
        }
    }
}

static int dt_k__pass(int64_t *dest, int64_t *okeys, int64_t *oidx, int64_t *totals, int *counts, const int64_t *keys,
                      const int64_t *idx, int64_t n, int nb, int mode, int64_t rows, int W, int shift, int *bad,
                      void *stream) {
    int nblk = (int)dt_k__ceil_div(n, DT_K__CHUNK), st;
    DT_K_LAUNCH(dt_k__count, (unsigned)nblk, DT_K__CHUNK, (size_t)nb * sizeof(int), stream, counts, keys, n, nb, mode,
                rows, W, shift, bad);
    if ((st = DT_K_CHECK())) return st;
    DT_K_LAUNCH(dt_k__scan, 1, dt_k__thr(nb, 256), (size_t)nb * sizeof(int), stream, counts, totals, nblk, nb);
    if ((st = DT_K_CHECK())) return st;
    DT_K_LAUNCH(dt_k__scatter, (unsigned)nblk, DT_K__CHUNK, 0, stream, dest, okeys, oidx, counts, keys, idx, n, nb,
                mode, rows, W, shift);
    return DT_K_CHECK();
}

/* 0 for what dt_k_embed_bucketize refuses (n past int, W outside [1, 4096]): no size to overflow */
extern "C" size_t dt_k_embed_bucketize_scratch(int64_t n, int W) {
    if (n < 0 || n > 2147483647LL || W < 1 || W > 4096) return 0;
    int64_t nblk = dt_k__ceil_div(n, DT_K__CHUNK);
    return (size_t)(nblk > 0 ? nblk : 1) * (size_t)W * sizeof(int);
}

extern "C" int dt_k_embed_bucketize(int64_t *counts, int64_t *dest, const int64_t *ids, int64_t n, int64_t rows,
                                    int W, int *bad_id, void *scratch, void *stream) {
    if (n < 0 || n > 2147483647LL || rows < 0 || W < 1 || W > 4096 || !counts || (n > 0 && (!scratch || !ids || !dest)))
        return (int)cudaErrorInvalidValue;
    if (n == 0) return (int)cudaMemsetAsync(counts, 0, (size_t)W * sizeof(int64_t), (cudaStream_t)stream);
    return dt_k__pass(dest, NULL, NULL, counts, (int *)scratch, ids, NULL, n, W, 0, rows, W, 0, bad_id, stream);
}

/* seg and n_uniq from the sorted keys: one block; thread t takes a contiguous chunk, counts its
   run heads, a serial scan of the per-thread counts gives where its heads go. */
static __global__ void dt_k__segments(int64_t *seg, int64_t *n_uniq, const int64_t *skeys, int64_t n) {
    __shared__ int64_t cnt[256];
    int64_t per = dt_k__ceil_div(n, blockDim.x), i0 = threadIdx.x * per, i1 = i0 + per, i, c = 0;
    if (i1 > n) i1 = n;
    for (i = i0; i < i1; i++) c += i == 0 || skeys[i] != skeys[i - 1];
    cnt[threadIdx.x] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t run = 0;
        int t;
        for (t = 0; t < (int)blockDim.x; t++) {
            int64_t x = cnt[t];
            cnt[t] = run;
            run += x;
        }
        *n_uniq = run;
        seg[run] = n;
    }
    __syncthreads();
    c = cnt[threadIdx.x];
    for (i = i0; i < i1; i++)
        if (i == 0 || skeys[i] != skeys[i - 1]) seg[c++] = i;
}

/* keys twice, indices once (the other index buffer is `order`), the block counts */
extern "C" size_t dt_k_embed_dedup_scratch(int64_t n) { /* 0 for an n dt_k_embed_dedup refuses */
    if (n < 0 || n > 2147483647LL) return 0;
    int64_t nblk = dt_k__ceil_div(n, DT_K__CHUNK);
    if (n < 1) n = 1;
    return (size_t)(3 * n) * sizeof(int64_t) + (size_t)(nblk > 0 ? nblk : 1) * 256 * sizeof(int);
}

extern "C" int dt_k_embed_dedup(int64_t *order, int64_t *seg, int64_t *n_uniq, const int64_t *rows, int64_t n,
                                int64_t n_rows, void *scratch, void *stream) {
    int64_t *buf = (int64_t *)scratch, *ka, *kb, *kc, *ia, *ib, *t;
    const int64_t *src;
    int *counts;
    int st = 0, shift, passes = 0;
    uint64_t top = (uint64_t)(n_rows > 0 ? n_rows : 0); /* n_rows itself: a negative row's key */
    if (n < 0 || n > 2147483647LL || n_rows < 0 || !order || !seg || !n_uniq || (n > 0 && (!scratch || !rows)))
        return (int)cudaErrorInvalidValue;
    if (n == 0) {
        if ((st = (int)cudaMemsetAsync(n_uniq, 0, sizeof(int64_t), (cudaStream_t)stream))) return st;
        return (int)cudaMemsetAsync(seg, 0, sizeof(int64_t), (cudaStream_t)stream);
    }
    while (top) { passes++; top >>= 8; }
    if (passes == 0) passes = 1; /* the pass also copies the keys and writes `order` */
    ka = buf; kb = buf + n; ib = buf + 2 * n; counts = (int *)(buf + 3 * n);
    /* the pass count decides which index buffer is first, so the last pass writes `order` */
    ia = passes % 2 ? ib : order;
    ib = passes % 2 ? order : ib;
    src = rows; /* the first pass reads the caller's rows; then the two key buffers alternate */
    for (shift = 0; !st && shift < 8 * passes; shift += 8) {
        st = dt_k__pass(NULL, ka, ib, NULL, counts, src, shift ? ia : NULL, n, 256, 1, n_rows, 1, shift, NULL,
                        stream);
        src = ka;
        kc = ka; ka = kb; kb = kc;
        t = ia; ia = ib; ib = t;
    }
    if (!st) {
        DT_K_LAUNCH(dt_k__segments, 1, dt_k__thr(n, 256), 0, stream, seg, n_uniq, src, n);
        st = DT_K_CHECK();
    }
    return st;
}

/* ---------------------------------------------------------------- sparse update */

/* Block-stride over the unique rows; thread per column; g of the row kept in shared memory. */
static __global__ void dt_k__sparse_update(void *table, int dt, float *state, const float *grads, const int64_t *rows,
                                    const int64_t *order, const int64_t *seg, const int64_t *n_uniq, int64_t D,
                                    int64_t ld, int kind, float lrf, float epsf, double lr, double eps) {
    DT_K_SHARED_DYNAMIC(float, gs);
    __shared__ double part[256];
    int64_t u, c, j, nu = *n_uniq;
    int step;
    for (u = blockIdx.x; u < nu; u += gridDim.x) {
        int64_t j0 = seg[u], j1 = seg[u + 1], row = rows[order[j0]];
        double ss = 0.0;
        float m = 0.0f;
        if (row < 0) continue; /* a dynamic id not admitted (block-uniform: no barrier skipped by half) */
        for (c = threadIdx.x; c < D; c += blockDim.x) {
            float g = 0.0f;
            for (j = j0; j < j1; j++) g += grads[order[j] * D + c];
            gs[c] = g;
            ss += (double)g * (double)g;
        }
        if (kind == 3) { /* row-wise Adagrad: one state per row from the row's mean square */
            part[threadIdx.x] = ss;
            __syncthreads();
            for (step = blockDim.x / 2; step > 0; step /= 2) {
                if ((int)threadIdx.x < step) part[threadIdx.x] += part[threadIdx.x + step];
                __syncthreads();
            }
            if (threadIdx.x == 0) state[row] = state[row] + (float)(part[0] / (double)D);
            __syncthreads();
            m = (float)(lr / (sqrt((double)state[row]) + eps));
        }
        for (c = threadIdx.x; c < D; c += blockDim.x) {
            int64_t x = row * ld + c;
            float w = dt_k__ld(table, dt, x), g = gs[c];
            if (kind == 2) {
                float s = state[x] + g * g;
                state[x] = s;
                w -= lrf * (g / (sqrtf(s) + epsf));
            } else if (kind == 3) {
                w -= m * g;
            } else {
                w -= lrf * g;
            }
            dt_k__st(table, dt, x, w);
        }
        __syncthreads(); /* part[] and state[row] are reused by the next row */
    }
}

extern "C" int dt_k_embed_sparse_update(void *table, int table_dtype, float *state, const float *grads,
                                        const int64_t *rows, const int64_t *order, const int64_t *seg,
                                        const int64_t *n_uniq, int64_t n, int64_t D, int64_t ld, int kind, double lr,
                                        double eps, void *stream) {
    int threads = 32;
    if (n < 0 || D < 0 || ld < D || kind < 1 || kind > 3 || table_dtype < 1 || table_dtype > 3 ||
        (uint64_t)D * sizeof(float) > DT_K__SMEM_MAX / 2 || (kind != 1 && !state && n > 0))
        return (int)cudaErrorInvalidValue;
    if (n == 0 || D == 0) return 0;
    if (!table || !grads || !rows || !order || !seg || !n_uniq) return (int)cudaErrorInvalidValue;
    while (threads < 256 && threads < D) threads *= 2; /* a power of two for the tree */
    DT_K_LAUNCH(dt_k__sparse_update, dt_k__grid(n, 1), threads, (size_t)D * sizeof(float), stream, table,
                table_dtype, state, grads, rows, order, seg, n_uniq, D, ld, kind, (float)lr, (float)eps, lr, eps);
    return DT_K_CHECK();
}

/* Lazy Adam on the deduplicated rows, dt_adam_update's scalar loop (no weight decay) op for op:
   g summed over the row's run as above, then m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g g;
   w -= step (m / (sqrt(v) / bc2 + eps)) with the per-step scalars rounded once on the host. */
static __global__ void dt_k__sparse_adam(void *table, int dt, float *m, float *v, const float *grads,
                                         const int64_t *rows, const int64_t *order, const int64_t *seg,
                                         const int64_t *n_uniq, int64_t D, int64_t ld, float b1, float omb1,
                                         float b2, float omb2, float step, float bc2, float epsf) {
    int64_t u, c, j, nu = *n_uniq;
    for (u = blockIdx.x; u < nu; u += gridDim.x) {
        int64_t j0 = seg[u], j1 = seg[u + 1], row = rows[order[j0]];
        if (row < 0) continue; /* a dynamic id not admitted */
        for (c = threadIdx.x; c < D; c += blockDim.x) {
            int64_t x = row * ld + c;
            float g = 0.0f, w = dt_k__ld(table, dt, x), mi, vi, denom;
            for (j = j0; j < j1; j++) g += grads[order[j] * D + c];
            mi = b1 * m[x] + omb1 * g;
            vi = b2 * v[x] + omb2 * (g * g);
            m[x] = mi;
            v[x] = vi;
            denom = sqrtf(vi) / bc2 + epsf;
            dt_k__st(table, dt, x, w - step * (mi / denom));
        }
    }
}

extern "C" int dt_k_embed_sparse_adam(void *table, int table_dtype, float *m, float *v, const float *grads,
                                      const int64_t *rows, const int64_t *order, const int64_t *seg,
                                      const int64_t *n_uniq, int64_t n, int64_t D, int64_t ld, double lr,
                                      double beta1, double beta2, double eps, int64_t t, void *stream) {
    double bc1, bc2;
    int threads = dt_k__thr(D, 256);
    if (n < 0 || D < 0 || ld < D || t < 1 || table_dtype < 1 || table_dtype > 3 || (n > 0 && (!m || !v)))
        return (int)cudaErrorInvalidValue;
    if (n == 0 || D == 0) return 0;
    if (!table || !grads || !rows || !order || !seg || !n_uniq) return (int)cudaErrorInvalidValue;
    bc1 = 1.0 - pow(beta1, (double)t);
    bc2 = 1.0 - pow(beta2, (double)t);
    DT_K_LAUNCH(dt_k__sparse_adam, dt_k__grid(n, 1), threads, 0, stream, table, table_dtype, m, v, grads, rows,
                order, seg, n_uniq, D, ld, (float)beta1, (float)(1.0 - beta1), (float)beta2, (float)(1.0 - beta2),
                (float)(lr / bc1), (float)sqrt(bc2), (float)eps);
    return DT_K_CHECK();
}

/* ---------------------------------------------------------------- DLRM dot interaction

   As DLRM and TorchRec do it (torch.bmm): the sample's F+1 vectors packed as the rows of
   X_b [F+1, D] (the dense vector, then the F pooled embeddings), Z_b = X_b X_b^T for every b in
   one strided batched GEMM, and the strictly lower triangle of Z_b gathered into out (row i's
   pairs j < i, i ascending: the CPU op's order). Backward: S_b = dZ_b + dZ_b^T (dZ_b the lower
   triangle of dout's pair columns, so S_b is symmetric with a zero diagonal), dX_b = S_b X_b in
   one more batched GEMM, then dX split into ddense (plus the pass-through columns) and demb.
   The per-sample kernels this replaced kept X_b in shared memory and summed each pair in a
   scalar loop: F+1 threads reading one row at stride D hit the same banks (and the shared size
   capped (F+1) D at 48 KiB); the GEMM puts the sums on cuBLAS's tiles.

   cuBLAS is column-major: a row-major [R, C] matrix is read as its column-major transpose (see
   dt_gemm.cu). Z_b (symmetric) is the same either way; X_b row-major [F+1, D] is the
   column-major [D, F+1] matrix X_b^T with ld D, so Z_b = op_T(X_b^T) X_b^T and
   dX_b^T = X_b^T S_b (S_b symmetric).

   No bf16 variant: per sample the GEMM does 2 (F+1)^2 D flops on (F+1) D inputs and (F+1)^2
   outputs (DLRM's F 26, D 64: about 10 flops a byte), which the f32 units keep up with, so the
   kernels are bound by memory and a bf16 copy of X would save only X's reads, while every pair
   (the top MLP's input, read directly) would lose 16 bits of its mantissa's inputs. */

#include <cublas_v2.h>

/* The scratch layout, each part 256-byte aligned: X [B, F+1, D], then Z or S [B, F+1, F+1],
   then (backward) dX [B, F+1, D]. */
static size_t dt_k__dot_part(int64_t elems) { return ((size_t)elems * sizeof(float) + 255) & ~(size_t)255; }

extern "C" size_t dt_k_dot_interaction_scratch(int64_t B, int64_t F, int64_t D, int bwd) {
    int64_t n1 = F + 1;
    if (B < 0 || F < 0 || D < 0 || F >= 2147483647LL || D > 2147483647LL) return 0;
    if ((double)B * (double)n1 * (double)(n1 + 2 * D) * 4.0 > 1e18) return 0; /* past any device */
    return dt_k__dot_part(B * n1 * D) * (bwd ? 2 : 1) + dt_k__dot_part(B * n1 * n1);
}

/* X_b = [dense_b; emb_b]; out's first D columns (the dense pass-through) too, when out is set. */
static __global__ void dt_k__dot_pack(float *X, float *out, const float *dense, const float *emb, int64_t B, int64_t F,
                                      int64_t D, int64_t W) {
    int64_t n1d = (F + 1) * D, n = B * n1d, x;
    for (x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n; x += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = x / n1d, r = x % n1d;
        float v = r < D ? dense[b * D + r] : emb[b * F * D + r - D];
        X[x] = v;
        if (out && r < D) out[b * W + r] = v;
    }
}

/* out[b, D + i(i-1)/2 + j] = Z_b[i, j] for i > j (Z NULL: D = 0, every pair is 0). */
static __global__ void dt_k__dot_gather(float *out, const float *Z, int64_t B, int64_t F, int64_t D, int64_t W) {
    int64_t n1 = F + 1, n = B * n1 * n1, x;
    for (x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n; x += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = x / (n1 * n1), r = x % (n1 * n1), i = r / n1, j = r % n1;
        if (i > j) out[b * W + D + i * (i - 1) / 2 + j] = Z ? Z[x] : 0.0f;
    }
}

/* S_b[i, j] = S_b[j, i] = dout[b, D + i(i-1)/2 + j] for i > j; S_b[i, i] = 0. */
static __global__ void dt_k__dot_scatter(float *S, const float *dout, int64_t B, int64_t F, int64_t D, int64_t W) {
    int64_t n1 = F + 1, n = B * n1 * n1, x;
    for (x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n; x += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = x / (n1 * n1), r = x % (n1 * n1), i = r / n1, j = r % n1;
        const float *g = dout + b * W + D;
        S[x] = i > j ? g[i * (i - 1) / 2 + j] : i < j ? g[j * (j - 1) / 2 + i] : 0.0f;
    }
}

/* ddense_b += dout_b[0..D) + dX_b[0]; demb_b[k] += dX_b[k + 1] (either may be NULL). The
   pass-through is added first, as the CPU op adds it before the pairs. */
static __global__ void dt_k__dot_split(float *ddense, float *demb, const float *dX, const float *dout, int64_t B,
                                       int64_t F, int64_t D, int64_t W) {
    int64_t n1d = (F + 1) * D, n = B * n1d, x;
    for (x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n; x += (int64_t)gridDim.x * blockDim.x) {
        int64_t b = x / n1d, r = x % n1d;
        float g = dX ? dX[x] : 0.0f;
        if (r < D) {
            if (ddense) ddense[b * D + r] = (ddense[b * D + r] + dout[b * W + r]) + g;
        } else if (demb)
            demb[b * F * D + r - D] += g;
    }
}

static int dt_k__dot_blas(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + (int)s; }

/* The handle's stream, set only when it differs (cublasSetStream drops the workspace dt gave
   the handle: dt_gemm.cu's dt_k__stream says more). */
static int dt_k__dot_stream(cublasHandle_t h, void *stream) {
    cudaStream_t cur = NULL;
    int st = dt_k__dot_blas(cublasGetStream(h, &cur));
    if (st || cur == (cudaStream_t)stream) return st;
    return dt_k__dot_blas(cublasSetStream(h, (cudaStream_t)stream));
}

/* cuBLAS's sizes and batch count are ints: B, F + 1 and D must fit. */
static int dt_k__dot_args(void *cublas, int64_t B, int64_t F, int64_t D, void *scratch, int bwd) {
    if (B < 0 || B > 2147483647LL || F < 0 || F >= 2147483647LL || D < 0 || D > 2147483647LL) return 0;
    return B == 0 || (dt_k_dot_interaction_scratch(B, F, D, bwd) && cublas && scratch);
}

extern "C" int dt_k_dot_interaction_fwd(void *cublas, float *out, const float *dense, const float *emb, int64_t B,
                                        int64_t F, int64_t D, void *scratch, void *stream) {
    cublasHandle_t h = (cublasHandle_t)cublas;
    int64_t n1 = F + 1, W = D + n1 * F / 2;
    float *X, *Z, one = 1.0f, zero = 0.0f;
    int st;
    if (!dt_k__dot_args(cublas, B, F, D, scratch, 0)) return (int)cudaErrorInvalidValue;
    if (B == 0 || W == 0) return 0;
    if (!out || (D && (!dense || (F && !emb)))) return (int)cudaErrorInvalidValue;
    X = (float *)scratch;
    Z = (float *)((char *)scratch + dt_k__dot_part(B * n1 * D));
    DT_K_LAUNCH(dt_k__dot_pack, dt_k__grid(B * n1 * D, 256), 256, 0, stream, X, out, dense, emb, B, F, D, W);
    if ((st = DT_K_CHECK())) return st;
    if (F == 0) return 0; /* no pairs */
    if (D > 0) {
        if ((st = dt_k__dot_stream(h, stream))) return st;
        st = dt_k__dot_blas(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)n1, (int)n1, (int)D, &one, X,
                                                      (int)D, (long long)(n1 * D), X, (int)D, (long long)(n1 * D),
                                                      &zero, Z, (int)n1, (long long)(n1 * n1), (int)B));
        if (st) return st;
    }
    DT_K_LAUNCH(dt_k__dot_gather, dt_k__grid(B * n1 * n1, 256), 256, 0, stream, out, D > 0 ? Z : NULL, B, F, D, W);
    return DT_K_CHECK();
}

extern "C" int dt_k_dot_interaction_bwd(void *cublas, float *ddense, float *demb, const float *dout, const float *dense,
                                        const float *emb, int64_t B, int64_t F, int64_t D, void *scratch,
                                        void *stream) {
    cublasHandle_t h = (cublasHandle_t)cublas;
    int64_t n1 = F + 1, W = D + n1 * F / 2;
    float *X, *S, *dX, one = 1.0f, zero = 0.0f;
    int st;
    if (!dt_k__dot_args(cublas, B, F, D, scratch, 1)) return (int)cudaErrorInvalidValue;
    if (B == 0 || D == 0 || (!ddense && !demb)) return 0;
    if (((ddense || F) && !dout) || (F && (!dense || !emb))) return (int)cudaErrorInvalidValue;
    X = (float *)scratch;
    S = (float *)((char *)scratch + dt_k__dot_part(B * n1 * D));
    dX = (float *)((char *)S + dt_k__dot_part(B * n1 * n1));
    if (F > 0) { /* F = 0: no pairs, only the pass-through */
        DT_K_LAUNCH(dt_k__dot_pack, dt_k__grid(B * n1 * D, 256), 256, 0, stream, X, (float *)NULL, dense, emb, B, F,
                    D, W);
        if ((st = DT_K_CHECK())) return st;
        DT_K_LAUNCH(dt_k__dot_scatter, dt_k__grid(B * n1 * n1, 256), 256, 0, stream, S, dout, B, F, D, W);
        if ((st = DT_K_CHECK())) return st;
        if ((st = dt_k__dot_stream(h, stream))) return st;
        st = dt_k__dot_blas(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)D, (int)n1, (int)n1, &one, X,
                                                      (int)D, (long long)(n1 * D), S, (int)n1, (long long)(n1 * n1),
                                                      &zero, dX, (int)D, (long long)(n1 * D), (int)B));
        if (st) return st;
    }
    DT_K_LAUNCH(dt_k__dot_split, dt_k__grid(B * n1 * D, 256), 256, 0, stream, ddense, demb, F > 0 ? dX : NULL, dout,
                B, F, D, W);
    return DT_K_CHECK();
}
