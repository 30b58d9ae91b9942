/* kernels/dt_flash.cu - causal attention on the tensor cores: FlashAttention-2 (Dao 2023) with bf16
   q, k, v, f32 accumulation and statistics, mma.sync m16n8k16 through kernels/dt_mma.cuh.

   Forward, one block of 4 warps per (64 queries, b, h); warp w owns queries q0 + 16w .. +15:

        Q tile --(once)--> registers (A fragments, 16 x hs per warp)
        for each K/V tile of 64 keys up to the diagonal (tiles above it never load):
                                V tile --cp.async--> shared memory (in flight during S)
            S  = Q K^T          mma, K read as B's transpose (ldmatrix) 16 x 64 per warp, f32
                                next K tile --cp.async--> shared memory (in flight until P V)
            m' = max(m, rowmax S), P = exp(S - m'), l = l e^(m - m') + rowsum P, O = O e^(m - m')
            O += P V            P's accumulators ARE the A fragments of the next mma (bf16),
                                V's B fragments by ldmatrix.trans
        out = O / l,  lse = m + log l   (natural log of the scaled scores: what ring attention merges)

   The tiles' rows are padded by 8 (no bank conflicts) and come by cp.async, 16 bytes a copy,
   which does not pass through the registers: FlashAttention-2's overlap of loads and multiplies
   with one K and one V tile of shared memory.

   The rows of S a lane holds (g and g + 8, columns 2t, 2t + 1 of each 8-column block) are the
   rows and columns its A fragment of P needs (dt_mma.cuh's layout), so P never leaves the
   registers; a row's max and sum are finished over the 4 lanes that share it (xor 1, 2).

   Backward (FlashAttention-2's, deterministic): a prep pass D = rowsum(dout * out) (f32) and
   dout in bf16; then one pass per 64 keys (dk, dv: a warp per 16 keys, looping over the query
   tiles at and under the diagonal and over the query heads sharing the K/V head) and one pass
   per 64 queries (dq), each recomputing P = exp(S - lse) from q, k and the forward's lse:
        dV += P^T dO,   dP = dO V^T,   dS = P (dP - D) scale,   dK += dS^T Q,   dQ += dS K.
   Every output element is summed by one lane in a fixed order: no atomics, the same bits every
   run. Two passes recompute S twice, the price of no atomics. Each pass streams its tiles (Q and
   dO, or K and V) through two buffers, the next tile's cp.async in flight while the warps work
   on this one.

   Grouped-query attention: H query heads share H_kv K/V heads (head h reads K/V head
   h / (H / H_kv)); the dk/dv pass sums the group's query heads in order.

   Blocks (dt_k_flash.block; context parallelism's ring, dt_parallel.h >>cp): the same kernels on
   query rows [q_row, q_row + q_rows) at positions q_pos.. against key rows [k_row, k_row + k_rows)
   at positions k_pos.., a query seeing the keys at positions up to its own. The forward merges
   the block into out and lse as the online softmax does a tile (lse is the running statistic):
        lse' = log(e^lse + e^lse_blk),  out' = out e^(lse - lse') + out_blk e^(lse_blk - lse')
   by the lane that owns the element, so blocks merge in any order; the backward is the whole
   one's with the merged lse and out (P = exp(S - lse) is already the whole row's probability),
   each block adding its part of dq, dk, dv.

   Precision: P and dS are rounded to bf16 before their mma (as FlashAttention-2), dO too; the
   rest is f32. Against an f64 reference on the same bf16 inputs the error is some 1e-3
   relative (tests/cuda_emu/k_flash.cpp states the bound it checks).

   Needs compute capability 8.0 (mma.sync with bf16): the launchers return cudaErrorNotSupported
   below it, and an sm_75 build (DT_CUDA_ARCH) compiles these kernels empty.
                                                                  MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <math.h>

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define DT_K__FLASH_MMA 1
#include "dt_mma.cuh"
#else
#define DT_K__FLASH_MMA 0
#endif

#define DT_K__FL_WARPS 4
#define DT_K__FL_ROWS 64      /* queries of a forward / dq block, keys of a dk/dv block: 16 a warp */
#define DT_K__FL_KEYS 64      /* keys of a forward K/V tile */
#define DT_K__FL_BWD_TILE 32  /* keys of a dq pass tile, queries of a dk/dv pass tile */
#define DT_K__FL_LOG2E 1.4426950408889634f
/* Blocks an SM must hold (registers for): 3 up to hs 64, where ptxas otherwise took 170 for the
   dk/dv pass (2 blocks of 128 threads an SM) and fits in 168 without spills; 1 above, where the
   passes take 200 to 255 registers and a bound would spill. */
#define DT_K__FL_MIN_BLOCKS(hs) ((hs) <= 64 ? 3 : 1)
#ifndef DT_K__FL_PLANT /* tests/cuda_emu/k_flash.cpp builds a copy with a bug planted: 1 a fragment, 2 a barrier */
#define DT_K__FL_PLANT 0
#endif

/* The shared-memory row of a tile: hs + 8 bf16. The fragments come from ldmatrix, which reads
   an 8 x 8 matrix (8 rows of 16 bytes, one column offset) a shared-memory cycle: with rows
   (hs + 8) / 2 = 4 (2m + 1) words apart (hs = 16m, m = 1..8), row r starts 4r (2m + 1) words on,
   and for r = 0..7 that is 8 different groups of 4 banks (mod 32): no bank conflicts. A row is a
   multiple of 16 bytes, so the 16-byte stores and ldmatrix's rows stay aligned. */
#define DT_K__FL_LD(hs) ((hs) + 8)

#if DT_K__FLASH_MMA
/* rows [r0, r0 + n) of a tensor (row r at src + r * stride, hs bf16 each) into tile (ld), 16
   bytes a thread a step; rows at or past T are zeros. The block's threads share the work. With
   ASYNC (DT_K__FL_ASYNC) the rows before T come by cp.async, in flight until the thread's
   dt_mma_cp_async_wait; else by 16-byte loads through the registers. */
enum { DT_K__FL_SYNC = 0, DT_K__FL_ASYNC = 1 };
template <int HS, int ASYNC = DT_K__FL_SYNC>
static __device__ __forceinline__ void dt_k__fl_tile(uint16_t *tile, const uint16_t *__restrict__ src,
                                                     int64_t stride, int64_t r0, int n, int64_t T) {
    const int per_row = HS / 8;
    for (int i = threadIdx.x; i < n * per_row; i += blockDim.x) {
        int r = i / per_row, c = (i % per_row) * 8;
        uint16_t *dst = tile + r * DT_K__FL_LD(HS) + c;
        if (r0 + r >= T) dt_k_store_vec<uint4>(dst, make_uint4(0u, 0u, 0u, 0u));
        else if (ASYNC) dt_mma_cp_async16(dst, src + (r0 + r) * stride + c);
        else dt_k_store_vec<uint4>(dst, dt_k_load_vec<uint4>(src + (r0 + r) * stride + c));
    }
}

/* The A fragment (16 x 16, k = columns 16j .. 16j + 15) of a 16-row block whose f32 values are
   in accumulators s[2j] (columns 16j .. +7) and s[2j + 1] (+8 .. +15), rounded to bf16. */
static __device__ __forceinline__ void dt_k__fl_c_to_a(dt_mma_frag_a *a, const dt_mma_frag_c &lo,
                                                       const dt_mma_frag_c &hi) {
    a->x[0] = dt_mma_pack(dt_k_f32_to_bf16(lo.x[0]), dt_k_f32_to_bf16(lo.x[1]));
#if DT_K__FL_PLANT == 1 /* rows g + 8 and g, k pairs 0-7 and 8-15 traded */
    a->x[2] = dt_mma_pack(dt_k_f32_to_bf16(lo.x[2]), dt_k_f32_to_bf16(lo.x[3]));
    a->x[1] = dt_mma_pack(dt_k_f32_to_bf16(hi.x[0]), dt_k_f32_to_bf16(hi.x[1]));
#else
    a->x[1] = dt_mma_pack(dt_k_f32_to_bf16(lo.x[2]), dt_k_f32_to_bf16(lo.x[3]));
    a->x[2] = dt_mma_pack(dt_k_f32_to_bf16(hi.x[0]), dt_k_f32_to_bf16(hi.x[1]));
#endif
    a->x[3] = dt_mma_pack(dt_k_f32_to_bf16(hi.x[2]), dt_k_f32_to_bf16(hi.x[3]));
}

/* acc[n] (n < N / 8) = A B^T over hs: A the warp's 16 rows (fragments a[hs / 16]), B the tile's
   rows 8n .. 8n + 7 (ld): scores of 16 rows against N rows of a tile. B's fragments come two at
   a time from one ldmatrix (rows 8n .. 8n + 15). */
template <int HS, int N>
static __device__ __forceinline__ void dt_k__fl_abt(dt_mma_frag_c *acc, const dt_mma_frag_a *a, const uint16_t *tile,
                                                    int lane) {
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
        dt_mma_zero_c(&acc[n]), dt_mma_zero_c(&acc[n + 1]);
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            dt_mma_frag_b b0, b1;
            dt_mma_load_bt2(&b0, &b1, tile + n * 8 * DT_K__FL_LD(HS) + kk * 16, DT_K__FL_LD(HS), lane);
            dt_mma_m16n8k16_bf16(&acc[n], a[kk], b0, acc[n]);
            dt_mma_m16n8k16_bf16(&acc[n + 1], a[kk], b1, acc[n + 1]);
        }
    }
}

/* o[n] (n < hs / 8) += P V: P the warp's 16 x K values in accumulators p[K / 8] (rounded to
   bf16 here), V the tile's K rows of hs (ld), two B fragments (16 columns) an ldmatrix.trans. */
template <int HS, int K>
static __device__ __forceinline__ void dt_k__fl_pv(dt_mma_frag_c *o, const dt_mma_frag_c *p, const uint16_t *tile,
                                                   int lane) {
#pragma unroll
    for (int j = 0; j < K / 16; j++) {
        dt_mma_frag_a a;
        dt_k__fl_c_to_a(&a, p[2 * j], p[2 * j + 1]);
#pragma unroll
        for (int n = 0; n < HS / 8; n += 2) {
            dt_mma_frag_b b0, b1;
            dt_mma_load_b2(&b0, &b1, tile + j * 16 * DT_K__FL_LD(HS) + n * 8, DT_K__FL_LD(HS), lane);
            dt_mma_m16n8k16_bf16(&o[n], a, b0, o[n]);
            dt_mma_m16n8k16_bf16(&o[n + 1], a, b1, o[n + 1]);
        }
    }
}

/* The warp's 16 rows of a tile (row0 of the tile) as A fragments. */
template <int HS>
static __device__ __forceinline__ void dt_k__fl_rows_a(dt_mma_frag_a *a, const uint16_t *tile, int row0, int lane) {
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++)
        dt_mma_load_a(&a[kk], tile + row0 * DT_K__FL_LD(HS) + kk * 16, DT_K__FL_LD(HS), lane);
}

/* Accumulators (16 rows x hs) added to the rows of dst at element off + r * stride + c for rows
   r0 + r < T: f32, or (dst16 non-NULL) bf16, the f32 sum rounded once. */
template <int HS>
static __device__ __forceinline__ void dt_k__fl_add_rows(float *dst, uint16_t *dst16, int64_t off, int64_t stride,
                                                         const dt_mma_frag_c *acc, int64_t r0, int64_t T, int lane) {
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int64_t r = r0 + dt_mma_c_row(lane, i), e = off + r * stride + n * 8 + dt_mma_c_col(lane, i);
            if (r >= T) continue;
            if (dst16) dst16[e] = dt_k_f32_to_bf16(dt_k_bf16_to_f32(dst16[e]) + acc[n].x[i]); /* rounded once */
            else dst[e] += acc[n].x[i];
        }
}
#endif

/* ---------------------------------------------------------------- forward */

template <int HS>
static __global__ void __launch_bounds__(32 * DT_K__FL_WARPS, DT_K__FL_MIN_BLOCKS(HS))
dt_k__fl_fwd(dt_k_flash a, float scale2) {
#if DT_K__FLASH_MMA
    DT_K_SHARED_DYNAMIC(uint16_t, sm);
    const int LD = DT_K__FL_LD(HS);
    uint16_t *sk = sm, *sv = sm + DT_K__FL_KEYS * LD;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* rows and keys of the block (the whole sequence outside block mode: the launcher fills them) */
    const int64_t nq = a.q_rows, nk = a.k_rows, dpos = a.q_pos - a.k_pos; /* key c visible to query r: c <= r + dpos */
    const int64_t q0 = (int64_t)blockIdx.x * DT_K__FL_ROWS, bh = blockIdx.y, b = bh / a.H;
    const int h = (int)(bh % a.H), hk = h / (a.H / a.H_kv);
    const uint16_t *qb = a.q + (b * a.T + a.q_row) * a.q_stride + (int64_t)h * HS;
    const uint16_t *kb = a.k + (b * a.Tk + a.k_row) * a.kv_stride + (int64_t)hk * HS;
    const uint16_t *vb = a.v + (b * a.Tk + a.k_row) * a.kv_stride + (int64_t)hk * HS;
    const int64_t rw = q0 + warp * 16; /* the warp's first query */
    dt_mma_frag_a qf[HS / 16];
    dt_mma_frag_c o[HS / 8], s[DT_K__FL_KEYS / 8];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    /* the keys any query of the block sees: up to the diagonal, tiles above it never load */
    const int64_t kend = nk < q0 + DT_K__FL_ROWS + dpos ? nk : q0 + DT_K__FL_ROWS + dpos;
    dt_k__fl_tile<HS>(sv, qb, a.q_stride, q0, DT_K__FL_ROWS, nq); /* Q staged through the V tile */
    __syncthreads();
    dt_k__fl_rows_a<HS>(qf, sv, warp * 16, lane);
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dt_mma_zero_c(&o[n]);
    /* The loads overlap the multiplies, FlashAttention-2's way: V's tile is in flight during
       S = Q K^T, the next K's during the softmax and O += P V. One group a tile a thread. */
    if (kend > 0) dt_k__fl_tile<HS, DT_K__FL_ASYNC>(sk, kb, a.kv_stride, 0, DT_K__FL_KEYS, nk);
    dt_mma_cp_async_commit();
    for (int64_t k0 = 0; k0 < kend; k0 += DT_K__FL_KEYS) {
        dt_mma_cp_async_wait<0>(); /* this thread's copies of the K tile */
#if DT_K__FL_PLANT != 2
        __syncthreads(); /* every thread's; and every warp is done with the V tile before (or Q) */
#endif
        dt_k__fl_tile<HS, DT_K__FL_ASYNC>(sv, vb, a.kv_stride, k0, DT_K__FL_KEYS, nk);
        dt_mma_cp_async_commit();
        dt_k__fl_abt<HS, DT_K__FL_KEYS>(s, qf, sk, lane);
        __syncthreads(); /* every warp is done with the K tile */
        if (k0 + DT_K__FL_KEYS < kend)
            dt_k__fl_tile<HS, DT_K__FL_ASYNC>(sk, kb, a.kv_stride, k0 + DT_K__FL_KEYS, DT_K__FL_KEYS, nk);
        dt_mma_cp_async_commit();
        float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}, mn[2], alpha[2];
#pragma unroll
        for (int n = 0; n < DT_K__FL_KEYS / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) { /* scale (log2 units), the causal mask and the end of the keys */
                int64_t r = rw + dt_mma_c_row(lane, i), c = k0 + n * 8 + dt_mma_c_col(lane, i);
                float x = c <= r + dpos && c < nk ? s[n].x[i] * scale2 : -INFINITY;
                s[n].x[i] = x;
                mx[i >> 1] = fmaxf(mx[i >> 1], x);
            }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
            mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
            mn[j] = fmaxf(m[j], mx[j]);
            /* a row with no key yet (mn = -inf) keeps O = 0, l = 0: no -inf - -inf */
            alpha[j] = mn[j] == -INFINITY ? 1.0f : exp2f(m[j] - mn[j]);
        }
#pragma unroll
        for (int n = 0; n < DT_K__FL_KEYS / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float p = mn[i >> 1] == -INFINITY ? 0.0f : exp2f(s[n].x[i] - mn[i >> 1]);
                s[n].x[i] = p;
                sum[i >> 1] += p;
            }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], 1);
            sum[j] += __shfl_xor_sync(0xffffffffu, sum[j], 2);
            l[j] = l[j] * alpha[j] + sum[j];
            m[j] = mn[j];
        }
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[n].x[i] *= alpha[i >> 1];
        dt_mma_cp_async_wait<1>(); /* this thread's V copies (the next K tile's may still fly) */
        __syncthreads();           /* every thread's */
        dt_k__fl_pv<HS, DT_K__FL_KEYS>(o, s, sv, lane);
    }
    const int64_t o0 = (b * a.T + a.q_row) * a.out_stride + (int64_t)h * HS;
    float *ob = a.out16 ? NULL : a.out + o0, *lb = a.lse + bh * a.T + a.q_row;
    uint16_t *ob16 = a.out16 ? a.out16 + o0 : NULL;
    /* each row's weights: of what out held (wa) and of this O (wb); outside block mode out = O / l */
    float wa[2] = {0.0f, 0.0f}, wb[2], ln[2];
    for (int j = 0; j < 2; j++) {
        int64_t r = rw + (lane >> 2) + 8 * j;
        float lse_b = (m[j] + log2f(l[j])) * 0.69314718055994531f, old = -INFINITY;
        if (a.block && r < nq && l[j] > 0.0f) old = lb[r];
        ln[j] = lse_b;
        if (old != -INFINITY) { /* log(e^old + e^lse_b), from the larger */
            float mx = fmaxf(old, lse_b);
            ln[j] = mx + logf(expf(old - mx) + expf(lse_b - mx));
            wa[j] = expf(old - ln[j]);
        }
        wb[j] = expf(lse_b - ln[j]); /* 1 outside block mode: out = O / l exactly */
    }
    __syncwarp(); /* every lane has read its rows' lse before the row's first lane writes it */
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int64_t r = rw + dt_mma_c_row(lane, i), at = r * a.out_stride + n * 8 + dt_mma_c_col(lane, i);
            if (r >= nq || l[i >> 1] == 0.0f) continue; /* past the rows, or a row that sees no key here */
            if (ob16) { /* outside block mode (wa 0, wb 1): the f32 value below, rounded once */
                ob16[at] = dt_k_f32_to_bf16(0.0f + o[n].x[i] / l[i >> 1] * wb[i >> 1]);
                continue;
            }
            ob[at] = (wa[i >> 1] > 0.0f ? ob[at] * wa[i >> 1] : 0.0f) + o[n].x[i] / l[i >> 1] * wb[i >> 1];
        }
    if ((lane & 3) == 0)
        for (int j = 0; j < 2; j++) {
            int64_t r = rw + (lane >> 2) + 8 * j;
            if (r < nq && l[j] > 0.0f) lb[r] = ln[j];
        }
#else
    (void)a, (void)scale2;
#endif
}

/* ---------------------------------------------------------------- backward */

/* dout rounded to bf16 into d16 [B, T, H hs], and D[bh, t] = sum over the head of that dout times
   out (f32, a warp per row, the warp tree's order): the block's query rows q_row .. + q_rows. */
static __global__ void dt_k__fl_prep(dt_k_flash a, uint16_t *d16, float *D) {
    const int64_t rows = a.B * a.q_rows * a.H, hs = a.hs;
    const int lane = threadIdx.x & 31;
    for (int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows;
         row += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        const int64_t h = row % a.H, bi = row / a.H, t = a.q_row + bi % a.q_rows, b = bi / a.q_rows, bt = b * a.T + t;
        const float *dr = a.dout + bt * a.out_stride + h * hs, *orow = a.out + bt * a.out_stride + h * hs;
        uint16_t *d = d16 + (bt * a.H + h) * hs;
        float acc = 0.0f;
        for (int64_t c = lane; c < hs; c += 32) { /* D from the rounded dout the mma sees: sum_u P (dP - D) = 0 */
            uint16_t h16 = dt_k_f32_to_bf16(dr[c]);
            acc += dt_k_bf16_to_f32(h16) * orow[c];
            d[c] = h16;
        }
        acc = dt_k_warp_sum(acc);
        if (lane == 0) D[(b * a.H + h) * a.T + t] = acc;
    }
}

/* The dk/dv pass's tiles of query head h, queries q0 .. q0 + 31 of the block: q and the rounded
   dout by cp.async into tiles (Q, then dO), their rows' lse (log2 units) and D into stat[0 ..
   31] and stat[32 ..] (0 past the rows). */
template <int HS>
static __device__ __forceinline__ void dt_k__fl_qtile(const dt_k_flash &a, const uint16_t *d16, const float *D,
                                                      int64_t b, int h, int64_t q0, uint16_t *tiles, float *stat) {
    const int NQ = DT_K__FL_BWD_TILE;
    const int64_t nq = a.q_rows, row0 = b * a.T + a.q_row; /* the block's first query row in q, d16 */
    const float *lb = a.lse + (b * a.H + h) * a.T + a.q_row, *Db = D + (b * a.H + h) * a.T + a.q_row;
    dt_k__fl_tile<HS, DT_K__FL_ASYNC>(tiles, a.q + row0 * a.q_stride + (int64_t)h * HS, a.q_stride, q0, NQ, nq);
    dt_k__fl_tile<HS, DT_K__FL_ASYNC>(tiles + NQ * DT_K__FL_LD(HS), d16 + (row0 * a.H + h) * HS, (int64_t)a.H * HS,
                                      q0, NQ, nq);
    for (int i = threadIdx.x; i < NQ; i += blockDim.x) {
        int64_t r = q0 + i;
        stat[i] = r < nq ? lb[r] * DT_K__FL_LOG2E : 0.0f;
        stat[NQ + i] = r < nq ? Db[r] : 0.0f;
    }
}

/* dk, dv for 64 keys of (b, K/V head hk): warp w holds keys k0 + 16w .. +15 as A fragments
   (K and V), and per query tile of 32 (at and under the diagonal) computes the transposed
   scores S^T = K Q^T, P^T = exp(S^T scale - lse), then dV += P^T dO, dP^T = V dO^T,
   dS^T = P^T (dP^T - D) scale, dK += dS^T Q; over the query heads of the group in order. */
template <int HS>
static __global__ void __launch_bounds__(32 * DT_K__FL_WARPS, DT_K__FL_MIN_BLOCKS(HS))
dt_k__fl_dkdv(dt_k_flash a, const uint16_t *d16, const float *D, float scale) {
#if DT_K__FLASH_MMA
    DT_K_SHARED_DYNAMIC(uint16_t, sm);
    const int LD = DT_K__FL_LD(HS), NQ = DT_K__FL_BWD_TILE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = a.H / a.H_kv;
    const int64_t nq = a.q_rows, nk = a.k_rows, dpos = a.q_pos - a.k_pos; /* key c visible to query r: c <= r + dpos */
    const int64_t k0 = (int64_t)blockIdx.x * DT_K__FL_ROWS, bk = blockIdx.y, b = bk / a.H_kv;
    const int hk = (int)(bk % a.H_kv);
    const int64_t kw = k0 + warp * 16; /* the warp's first key */
    const int64_t qfirst = k0 - dpos > 0 ? (k0 - dpos) / NQ * NQ : 0; /* the first query tile that sees a key here */
    const uint16_t *kb = a.k + (b * a.Tk + a.k_row) * a.kv_stride + (int64_t)hk * HS;
    const uint16_t *vb = a.v + (b * a.Tk + a.k_row) * a.kv_stride + (int64_t)hk * HS;
    /* two buffers of a Q and a dO tile (NQ rows each) and of their rows' lse (log2 units) and D */
    float *sstat = (float *)(sm + 4 * NQ * LD);
    dt_mma_frag_a kf[HS / 16], vf[HS / 16];
    dt_mma_frag_c dk[HS / 8], dv[HS / 8], s[NQ / 8], dp[NQ / 8];
    /* K and V rows through shared memory (64 rows each: the tiles' space, before it is theirs) */
    dt_k__fl_tile<HS>(sm, kb, a.kv_stride, k0, DT_K__FL_ROWS, nk);
    dt_k__fl_tile<HS>(sm + DT_K__FL_ROWS * LD, vb, a.kv_stride, k0, DT_K__FL_ROWS, nk);
    __syncthreads();
    dt_k__fl_rows_a<HS>(kf, sm, warp * 16, lane);
    dt_k__fl_rows_a<HS>(vf, sm + DT_K__FL_ROWS * LD, warp * 16, lane);
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dt_mma_zero_c(&dk[n]), dt_mma_zero_c(&dv[n]);
    __syncthreads(); /* every warp has its K and V: the space is the Q / dO tiles' now */
    /* the (query head, query tile) pairs in order, the next pair's tiles in flight (cp.async)
       while the warps work on this one's */
    const int hend = (hk + 1) * group;
    int h = hk * group;
    int64_t q0 = qfirst;
    bool have = qfirst < nq;
    if (have) dt_k__fl_qtile<HS>(a, d16, D, b, h, q0, sm, sstat);
    dt_mma_cp_async_commit();
    for (int j = 0; have; j++) {
        int hn = h;
        int64_t qn = q0 + NQ;
        if (qn >= nq) hn++, qn = qfirst;
        const bool next = hn < hend;
        const int cur = j & 1;
        if (next) dt_k__fl_qtile<HS>(a, d16, D, b, hn, qn, sm + (cur ^ 1) * 2 * NQ * LD, sstat + (cur ^ 1) * 2 * NQ);
        dt_mma_cp_async_commit();
        dt_mma_cp_async_wait<1>(); /* this thread's copies of this pair's tiles */
        __syncthreads();           /* every thread's */
        {
            uint16_t *sq = sm + cur * 2 * NQ * LD, *sd = sq + NQ * LD;
            const float *slse = sstat + cur * 2 * NQ, *sD = slse + NQ;
            dt_k__fl_abt<HS, NQ>(s, kf, sq, lane);  /* S^T: keys x queries */
            dt_k__fl_abt<HS, NQ>(dp, vf, sd, lane); /* dP^T = V dO^T */
#pragma unroll
            for (int n = 0; n < NQ / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int64_t key = kw + dt_mma_c_row(lane, i);
                    int qi = n * 8 + dt_mma_c_col(lane, i);
                    int64_t qr = q0 + qi;
                    float p = key <= qr + dpos && qr < nq && key < nk
                                  ? exp2f(s[n].x[i] * scale * DT_K__FL_LOG2E - slse[qi]) : 0.0f;
                    s[n].x[i] = p;
                    dp[n].x[i] = p * (dp[n].x[i] - sD[qi]) * scale;
                }
            dt_k__fl_pv<HS, NQ>(dv, s, sd, lane);  /* dV += P^T dO */
            dt_k__fl_pv<HS, NQ>(dk, dp, sq, lane); /* dK += dS^T Q */
        }
        __syncthreads(); /* every warp is done with these tiles: the next pair's next load goes into them */
        h = hn, q0 = qn, have = next;
    }
    {
        const int64_t krow0 = b * a.Tk + a.k_row;
        const int64_t off = krow0 * a.dkv_stride + (int64_t)hk * HS;
        dt_k__fl_add_rows<HS>(a.dk, a.dk16, off, a.dkv_stride, dk, kw, nk, lane);
        dt_k__fl_add_rows<HS>(a.dv, a.dv16, off, a.dkv_stride, dv, kw, nk, lane);
    }
#else
    (void)a, (void)d16, (void)D, (void)scale;
#endif
}

/* dq for 64 queries of (b, h): warp w holds its 16 queries' q and dO as A fragments and, per
   K/V tile of 32 keys up to the diagonal, S = Q K^T, P = exp(S scale - lse), dP = dO V^T,
   dS = P (dP - D) scale, dQ += dS K. */
template <int HS>
static __global__ void __launch_bounds__(32 * DT_K__FL_WARPS, DT_K__FL_MIN_BLOCKS(HS))
dt_k__fl_dq(dt_k_flash a, const uint16_t *d16, const float *D, float scale) {
#if DT_K__FLASH_MMA
    DT_K_SHARED_DYNAMIC(uint16_t, sm);
    const int LD = DT_K__FL_LD(HS), NK = DT_K__FL_BWD_TILE;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t nq = a.q_rows, nk = a.k_rows, dpos = a.q_pos - a.k_pos; /* key c visible to query r: c <= r + dpos */
    const int64_t q0 = (int64_t)blockIdx.x * DT_K__FL_ROWS, bh = blockIdx.y, b = bh / a.H;
    const int h = (int)(bh % a.H), hk = h / (a.H / a.H_kv);
    const int64_t rw = q0 + warp * 16, row0 = b * a.T + a.q_row; /* the block's first query row in q, d16 */
    const uint16_t *qb = a.q + row0 * a.q_stride + (int64_t)h * HS, *db = d16 + (row0 * a.H + h) * HS;
    const uint16_t *kb = a.k + (b * a.Tk + a.k_row) * a.kv_stride + (int64_t)hk * HS;
    const uint16_t *vb = a.v + (b * a.Tk + a.k_row) * a.kv_stride + (int64_t)hk * HS;
    const int64_t kend = nk < q0 + DT_K__FL_ROWS + dpos ? nk : q0 + DT_K__FL_ROWS + dpos; /* keys any query here sees */
    dt_mma_frag_a qf[HS / 16], df[HS / 16];
    dt_mma_frag_c dq[HS / 8], s[NK / 8], dp[NK / 8];
    float lse2[2], Dr[2];
    dt_k__fl_tile<HS>(sm, qb, a.q_stride, q0, DT_K__FL_ROWS, nq);
    dt_k__fl_tile<HS>(sm + DT_K__FL_ROWS * LD, db, (int64_t)a.H * HS, q0, DT_K__FL_ROWS, nq);
    __syncthreads();
    dt_k__fl_rows_a<HS>(qf, sm, warp * 16, lane);
    dt_k__fl_rows_a<HS>(df, sm + DT_K__FL_ROWS * LD, warp * 16, lane);
    for (int j = 0; j < 2; j++) {
        int64_t r = rw + (lane >> 2) + 8 * j;
        lse2[j] = r < nq ? a.lse[bh * a.T + a.q_row + r] * DT_K__FL_LOG2E : 0.0f;
        Dr[j] = r < nq ? D[bh * a.T + a.q_row + r] : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dt_mma_zero_c(&dq[n]);
    __syncthreads(); /* every warp has its q and dO: the space is two buffers of a K and a V tile now */
    /* the next K/V tile in flight (cp.async) while the warps work on this one */
    if (kend > 0) {
        dt_k__fl_tile<HS, DT_K__FL_ASYNC>(sm, kb, a.kv_stride, 0, NK, nk);
        dt_k__fl_tile<HS, DT_K__FL_ASYNC>(sm + NK * LD, vb, a.kv_stride, 0, NK, nk);
    }
    dt_mma_cp_async_commit();
    for (int64_t k0 = 0, j = 0; k0 < kend; k0 += NK, j++) {
        uint16_t *sk = sm + (j & 1) * 2 * NK * LD, *sv = sk + NK * LD, *next = sm + ((j + 1) & 1) * 2 * NK * LD;
        if (k0 + NK < kend) {
            dt_k__fl_tile<HS, DT_K__FL_ASYNC>(next, kb, a.kv_stride, k0 + NK, NK, nk);
            dt_k__fl_tile<HS, DT_K__FL_ASYNC>(next + NK * LD, vb, a.kv_stride, k0 + NK, NK, nk);
        }
        dt_mma_cp_async_commit();
        dt_mma_cp_async_wait<1>(); /* this thread's copies of this tile */
        __syncthreads();           /* every thread's */
        dt_k__fl_abt<HS, NK>(s, qf, sk, lane);  /* S = Q K^T */
        dt_k__fl_abt<HS, NK>(dp, df, sv, lane); /* dP = dO V^T */
#pragma unroll
        for (int n = 0; n < NK / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int64_t r = rw + dt_mma_c_row(lane, i), c = k0 + n * 8 + dt_mma_c_col(lane, i);
                float p = c <= r + dpos && r < nq && c < nk
                              ? exp2f(s[n].x[i] * scale * DT_K__FL_LOG2E - lse2[i >> 1]) : 0.0f;
                dp[n].x[i] = p * (dp[n].x[i] - Dr[i >> 1]) * scale;
            }
        dt_k__fl_pv<HS, NK>(dq, dp, sk, lane); /* dQ += dS K */
        __syncthreads(); /* every warp is done with this tile: the next tile's next load goes into it */
    }
    dt_k__fl_add_rows<HS>(a.dq, a.dq16, row0 * a.dq_stride + (int64_t)h * HS, a.dq_stride, dq, rw, nq, lane);
#else
    (void)a, (void)d16, (void)D, (void)scale;
#endif
}

/* ---------------------------------------------------------------- launchers */

/* The checks the launchers make (bwd 0 forward, 1 backward, 2 the backward's prep): sizes, heads,
   head size, strides and alignment (16-byte loads), the block inside its buffers, compute
   capability >= 8.0. *x: a's call with the block filled in (outside block mode: the whole [B, T]
   against itself). */
static int dt_k__fl_check(const dt_k_flash *a, int bwd, dt_k_flash *x) {
    int dev = 0, major = 0;
    const int64_t lim = (int64_t)1 << 60;
    if (!a || a->B < 0 || a->T < 0 || a->H <= 0 || a->H_kv <= 0 || a->H % a->H_kv) return (int)cudaErrorInvalidValue;
    *x = *a;
    if (!a->block) {
        x->Tk = x->q_rows = x->k_rows = a->T;
        x->q_row = x->k_row = x->q_pos = x->k_pos = 0;
        x->prepped = 0;
    } else if (a->Tk < 0 || a->q_row < 0 || a->q_rows < 0 || a->q_row > a->T - a->q_rows || a->k_row < 0 ||
               a->k_rows < 0 || a->k_row > a->Tk - a->k_rows || a->q_pos < 0 || a->q_pos > lim || a->k_pos < 0 ||
               a->k_pos > lim)
        return (int)cudaErrorInvalidValue;
    if (a->hs != 16 && a->hs != 32 && a->hs != 64 && a->hs != 96 && a->hs != 128) return (int)cudaErrorInvalidValue;
    if (a->q_stride < (int64_t)a->H * a->hs || a->kv_stride < (int64_t)a->H_kv * a->hs ||
        a->out_stride < (int64_t)a->H * a->hs || a->q_stride % 8 || a->kv_stride % 8)
        return (int)cudaErrorInvalidValue;
    {
        const int64_t st[5] = {a->q_stride, a->kv_stride, a->out_stride, a->dq_stride, a->dkv_stride};
        int64_t mx = 1, T = x->T > x->Tk ? x->T : x->Tk;
        for (int i = 0; i < 5; i++) {
            if (st[i] < 0 || st[i] > ((int64_t)1 << 40)) return (int)cudaErrorInvalidValue;
            mx = st[i] > mx ? st[i] : mx;
        }
        /* grid y = B H <= 65535; every (b T + t) stride within int64 */
        if (a->B > 65535 / a->H || (a->B && T > INT64_MAX / 4 / a->B / mx)) return (int)cudaErrorInvalidValue;
    }
    if (x->q_rows > (int64_t)DT_K__FL_ROWS * 2147483647 || x->k_rows > (int64_t)DT_K__FL_ROWS * 2147483647)
        return (int)cudaErrorInvalidValue; /* grid x */
    if (!a->q || !a->k || !a->v || !a->lse || !dt_k_aligned(a->q, 16) || !dt_k_aligned(a->k, 16) ||
        !dt_k_aligned(a->v, 16))
        return (int)cudaErrorInvalidValue;
    /* out, or (the forward outside block mode) out16 instead */
    if (a->out16 ? (a->out || bwd || a->block) : !a->out) return (int)cudaErrorInvalidValue;
    /* the f32 and bf16 pointers on their elements' alignment (NULL passes: checked above and below);
       a GPU faults on a misaligned access */
    {
        const void *f32[6] = {a->out, a->lse, a->dout, a->dq, a->dk, a->dv};
        const void *b16[4] = {a->out16, a->dq16, a->dk16, a->dv16};
        for (int i = 0; i < 6; i++)
            if (!dt_k_aligned(f32[i], 4)) return (int)cudaErrorInvalidValue;
        for (int i = 0; i < 4; i++)
            if (!dt_k_aligned(b16[i], 2)) return (int)cudaErrorInvalidValue;
    }
    if (bwd && (!a->dout || !a->scratch || !dt_k_aligned(a->scratch, 16))) return (int)cudaErrorInvalidValue;
    if (bwd == 1) { /* bwd 2: the prep alone */
        int f32 = a->dq && a->dk && a->dv && !a->dq16 && !a->dk16 && !a->dv16;
        int b16 = !a->dq && !a->dk && !a->dv && a->dq16 && a->dk16 && a->dv16 && !a->block;
        if ((!f32 && !b16) || a->dq_stride < (int64_t)a->H * a->hs || a->dkv_stride < (int64_t)a->H_kv * a->hs)
            return (int)cudaErrorInvalidValue;
    }
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return (int)cudaErrorInvalidDevice;
    return major < 8 ? (int)cudaErrorNotSupported : 0;
}

static size_t dt_k__fl_smem(int hs, int rows) { return (size_t)(2 * rows * DT_K__FL_LD(hs)) * sizeof(uint16_t); }

#define DT_K__FL_HS(X) X(16) X(32) X(64) X(96) X(128)

extern "C" int dt_k_flash_fwd(const dt_k_flash *a, void *stream) {
    dt_k_flash x;
    int st = dt_k__fl_check(a, 0, &x);
    if (st || !x.B || !x.q_rows || !x.k_rows) return st; /* a block of no keys leaves out and lse as they were */
    dim3 grid((unsigned)((x.q_rows + DT_K__FL_ROWS - 1) / DT_K__FL_ROWS), (unsigned)(x.B * x.H));
    float scale2 = 1.0f / sqrtf((float)x.hs) * DT_K__FL_LOG2E;
    switch (x.hs) {
#define DT_K__FL_CASE(hs)                                                                                    \
    case hs:                                                                                                 \
        DT_K_LAUNCH(dt_k__fl_fwd<hs>, grid, 32 * DT_K__FL_WARPS, dt_k__fl_smem(hs, DT_K__FL_KEYS), stream, x, \
                    scale2);                                                                                 \
        break;
        DT_K__FL_HS(DT_K__FL_CASE)
#undef DT_K__FL_CASE
    }
    return DT_K_CHECK();
}

/* dout in bf16 [B, T, H hs], 16-byte aligned, then D [B, H, T] f32; 0 on a size that overflows. */
extern "C" size_t dt_k_flash_bwd_scratch(int64_t B, int64_t T, int H, int hs) {
    if (B < 0 || T < 0 || H < 0 || hs < 0 || (B && T && T > INT64_MAX / 8 / B / ((int64_t)H * ((int64_t)hs + 1) + 1))) return 0;
    return (size_t)((B * T * H * hs * 2 + 15) / 16 * 16 + B * H * T * 4);
}

/* The scratch's two parts: dout in bf16, D. */
static void dt_k__fl_parts(const dt_k_flash *x, uint16_t **d16, float **D) {
    *d16 = (uint16_t *)x->scratch;
    *D = (float *)((char *)x->scratch + (x->B * x->T * x->H * x->hs * 2 + 15) / 16 * 16);
}

static int dt_k__fl_prep_launch(const dt_k_flash *x, void *stream) {
    const int64_t rows = x->B * x->q_rows * x->H;
    uint16_t *d16;
    float *D;
    dt_k__fl_parts(x, &d16, &D);
    DT_K_LAUNCH(dt_k__fl_prep, dt_k__blocks(rows * 32, 256, 65535), 256, 0, stream, *x, d16, D);
    return DT_K_CHECK();
}

extern "C" int dt_k_flash_bwd_prep(const dt_k_flash *a, void *stream) {
    dt_k_flash x;
    int st = dt_k__fl_check(a, 2, &x);
    if (st || !x.B || !x.q_rows) return st;
    return dt_k__fl_prep_launch(&x, stream);
}

extern "C" int dt_k_flash_bwd(const dt_k_flash *a, void *stream) {
    dt_k_flash x;
    uint16_t *d16;
    float *D;
    int st = dt_k__fl_check(a, 1, &x);
    if (st || !x.B || !x.q_rows || !x.k_rows) return st;
    dt_k__fl_parts(&x, &d16, &D);
    float scale = 1.0f / sqrtf((float)x.hs);
    unsigned ktiles = (unsigned)((x.k_rows + DT_K__FL_ROWS - 1) / DT_K__FL_ROWS);
    unsigned qtiles = (unsigned)((x.q_rows + DT_K__FL_ROWS - 1) / DT_K__FL_ROWS);
    if (!x.prepped && (st = dt_k__fl_prep_launch(&x, stream))) return st;
    switch (x.hs) {
#define DT_K__FL_CASE(hs)                                                                                         \
    case hs:                                                                                                      \
        DT_K_LAUNCH(dt_k__fl_dkdv<hs>, dim3(ktiles, (unsigned)(x.B * x.H_kv)), 32 * DT_K__FL_WARPS,               \
                    dt_k__fl_smem(hs, DT_K__FL_ROWS) + 4 * DT_K__FL_BWD_TILE * sizeof(float), stream, x, d16, D,  \
                    scale);                                                                                       \
        if ((st = DT_K_CHECK())) return st;                                                                       \
        DT_K_LAUNCH(dt_k__fl_dq<hs>, dim3(qtiles, (unsigned)(x.B * x.H)), 32 * DT_K__FL_WARPS,                    \
                    dt_k__fl_smem(hs, DT_K__FL_ROWS), stream, x, d16, D, scale);                                  \
        break;
        DT_K__FL_HS(DT_K__FL_CASE)
#undef DT_K__FL_CASE
    }
    return DT_K_CHECK();
}
