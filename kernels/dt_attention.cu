/* kernels/dt_attention.cu - causal multi-head self-attention (GPT-2, as dt_attention_fwd / _bwd
   in dt_tensor.h): qkv [B,T,3C] packed q|k|v, H heads of hs = C/H, scale 1/sqrt(hs).

   The baseline mirrors the CPU op loop for loop, one query row per block:
     fwd  scores row (b,h,t): a[t2] = q.k[t2] * scale for t2 <= t, block max, exp, block sum,
          divide; zeros above the diagonal. Then out[b,t,c] = sum_t2 a[t2] v[t2] (in t2 order,
          one thread per output element).
     bwd  per query row: datt[t2] = dout.v[t2], dot = sum a datt, dpre = a (datt - dot) scale
          (kept in shared memory for dq and in device scratch for the key side); then per key
          row t2: dk += sum_t dpre[t][t2] q[t], dv += sum_t a[t][t2] dout[t]. Every output
          element is written by one thread: no atomics, the same bits every run.
   The fused forward (flash attention, Dao et al. 2022) never stores the T x T scores: one block
   per 32 queries of a (b, h); the key / value rows pass through shared memory in tiles of 32,
   and each thread keeps its query's running max m, sum l and output row (online softmax:
   when a score s > m arrives, l and the row are rescaled by exp(m - s)).
   Its backward (below, FlashAttention-2) recomputes the probabilities per tile from q, k and
   the forward's lse. Sums over the whole row (max, sum) use block reductions in the baseline
   and a sequential online pass in the fused kernels, so the two differ from the CPU and each
   other by fp32 reassociation (~1e-6 relative), not bitwise. */
#include "dt_cuda.cuh"
#include <math.h>
#include <stdint.h>

#define DT_K__ATT_TILE 32
#define DT_K__SMEM_MAX 49152 /* without opting in (cudaFuncSetAttribute), 48 KiB per block */

static int dt_k__threads(int64_t n, int cap) {
    int64_t t = n > cap ? cap : dt_k__ceil_div(n, 32) * 32;
    if (t < 32) t = 32;
    return (int)(t > cap ? cap : t);
}

static float dt_k__att_scale(int64_t hs) { return hs ? 1.0f / sqrtf((float)hs) : 0.0f; }

/* One block per score row (b, h, t). */
static __global__ void dt_k__att_scores(float *__restrict__ att, const float *__restrict__ qkv, int64_t T, int64_t C,
                                 int H, int64_t hs, float scale) {
    int64_t row = blockIdx.x, t = row % T, bh = row / T, b = bh / H, t2, i;
    int h = (int)(bh % H);
    const float *q = qkv + (b * T + t) * 3 * C + h * hs;
    float *a = att + row * T;
    float mx = -INFINITY, sum = 0.0f;
    for (t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const float *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
        float d = 0.0f;
        for (i = 0; i < hs; i++) d += q[i] * k[i];
        a[t2] = d * scale;
        mx = fmaxf(mx, a[t2]);
    }
    mx = dt_k_block_max(mx);
    for (t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) { /* each thread rereads only its own entries */
        float e = expf(a[t2] - mx);
        a[t2] = e;
        sum += e;
    }
    sum = dt_k_block_sum(sum);
    for (t2 = threadIdx.x; t2 < T; t2 += blockDim.x) a[t2] = t2 <= t ? a[t2] / sum : 0.0f; /* causal mask */
}

/* out[b,t,c] = sum_{t2 <= t} att[b,h,t,t2] v[b,t2,c], one thread per element. */
static __global__ void dt_k__att_values(float *__restrict__ out, const float *__restrict__ att,
                                 const float *__restrict__ qkv, int64_t B, int64_t T, int64_t C, int H, int64_t hs) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n = B * T * C;
    for (; idx < n; idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t c = idx % C, bt = idx / C, t = bt % T, b = bt / T, h = c / hs, t2;
        const float *a = att + ((b * H + h) * T + t) * T;
        const float *v = qkv + b * T * 3 * C + 2 * C + c;
        float o = 0.0f;
        for (t2 = 0; t2 <= t; t2++) o += a[t2] * v[t2 * 3 * C];
        out[idx] = o;
    }
}

/* Query side of the backward, one block per row (b, h, t): dpre into scratch and shared
   memory, dq += sum_t2 dpre[t2] k[t2]. */
static __global__ void dt_k__att_bwd_q(float *__restrict__ dqkv, float *__restrict__ dpre_out,
                                const float *__restrict__ dout, const float *__restrict__ qkv,
                                const float *__restrict__ att, int64_t T, int64_t C, int H, int64_t hs, float scale) {
    DT_K_SHARED_DYNAMIC(float, dp);
    int64_t row = blockIdx.x, t = row % T, bh = row / T, b = bh / H, t2, i;
    int h = (int)(bh % H);
    const float *a = att + row * T;
    const float *g = dout + (b * T + t) * C + h * hs;
    float *dq = dqkv + (b * T + t) * 3 * C + h * hs;
    float dot = 0.0f;
    for (t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        const float *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
        float d = 0.0f;
        for (i = 0; i < hs; i++) d += v[i] * g[i];
        dp[t2] = d;
        dot += a[t2] * d;
    }
    dot = dt_k_block_sum(dot);
    for (t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
        dp[t2] = a[t2] * (dp[t2] - dot) * scale;
        dpre_out[row * T + t2] = dp[t2];
    }
    __syncthreads(); /* dq reads every thread's dpre */
    for (i = threadIdx.x; i < hs; i += blockDim.x) {
        float acc = 0.0f;
        for (t2 = 0; t2 <= t; t2++) acc += dp[t2] * qkv[(b * T + t2) * 3 * C + C + h * hs + i];
        dq[i] += acc;
    }
}

/* Key side, one block per key row (b, h, t2): dk += sum_{t >= t2} dpre[t][t2] q[t],
   dv += sum_{t >= t2} a[t][t2] dout[t]. */
static __global__ void dt_k__att_bwd_kv(float *__restrict__ dqkv, const float *__restrict__ dpre,
                                 const float *__restrict__ dout, const float *__restrict__ qkv,
                                 const float *__restrict__ att, int64_t T, int64_t C, int H, int64_t hs) {
    int64_t row = blockIdx.x, t2 = row % T, bh = row / T, b = bh / H, t, i;
    int h = (int)(bh % H);
    float *dk = dqkv + (b * T + t2) * 3 * C + C + h * hs, *dv = dk + C;
    for (i = threadIdx.x; i < hs; i += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (t = t2; t < T; t++) {
            int64_t r = (bh * T + t) * T + t2;
            ak += dpre[r] * qkv[(b * T + t) * 3 * C + h * hs + i];
            av += att[r] * dout[(b * T + t) * C + h * hs + i];
        }
        dk[i] += ak;
        dv[i] += av;
    }
}

/* B T n_head rows within int (the grids), B T C elements within int64: each product checked by
   division before it is formed. */
static int dt_k__att_args(int64_t B, int64_t T, int64_t C, int n_head) {
    if (B < 0 || T < 0 || C < 0 || n_head <= 0 || C % n_head) return 0;
    if (!B || !T) return 1;
    return B <= 2147483647LL / T && B * T <= 2147483647LL / n_head && C <= INT64_MAX / (B * T);
}

extern "C" int dt_k_attention_fwd(float *out, float *att, const float *qkv, int64_t B, int64_t T, int64_t C,
                                  int n_head, void *stream) {
    int64_t hs, rows, n;
    int st;
    if (!dt_k__att_args(B, T, C, n_head)) return (int)cudaErrorInvalidValue;
    hs = C / n_head;
    rows = B * n_head * T;
    if (rows == 0) return 0;
    if (!att || (C > 0 && (!qkv || !out))) return (int)cudaErrorInvalidValue; /* the kernels read qkv, write att, out */
    DT_K_LAUNCH(dt_k__att_scores, (unsigned)rows, dt_k__threads(T, 256), 0, stream, att, qkv, T, C, n_head, hs,
                dt_k__att_scale(hs));
    if ((st = DT_K_CHECK())) return st;
    n = B * T * C;
    if (n == 0) return 0;
    DT_K_LAUNCH(dt_k__att_values, (unsigned)(dt_k__ceil_div(n, 256) < 65535 ? dt_k__ceil_div(n, 256) : 65535), 256, 0,
                stream, out, att, qkv, B, T, C, n_head, hs);
    return DT_K_CHECK();
}

extern "C" int dt_k_attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *att, int64_t B,
                                  int64_t T, int64_t C, int n_head, float *scratch, void *stream) {
    int64_t hs, rows;
    float *dpre = scratch; /* the caller's, stream-ordered: nothing to free, nothing to wait for */
    int st;
    if (!dt_k__att_args(B, T, C, n_head) || (uint64_t)T * sizeof(float) > DT_K__SMEM_MAX)
        return (int)cudaErrorInvalidValue;
    hs = C / n_head;
    rows = B * n_head * T;
    if (rows == 0 || hs == 0 || !dqkv) return 0; /* C = 0: no gradient to write */
    if (!dpre || !dout || !qkv || !att) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__att_bwd_q, (unsigned)rows, dt_k__threads(T, 256), (size_t)T * sizeof(float), stream, dqkv, dpre,
                dout, qkv, att, T, C, n_head, hs, dt_k__att_scale(hs));
    st = DT_K_CHECK();
    if (!st) {
        DT_K_LAUNCH(dt_k__att_bwd_kv, (unsigned)rows, dt_k__threads(hs, 128), 0, stream, dqkv, dpre, dout, qkv, att,
                    T, C, n_head, hs);
        st = DT_K_CHECK();
    }
    return st;
}

/* The keys and values of rows [k0, k0 + BT) of head h into Ks, Vs [BT, hs] (zeros past T), by
   all BT threads of the block; the barrier before: every thread is done with the previous tile;
   after: the tile is in. */
static __device__ __forceinline__ void dt_k__att_load_kv(float *Ks, float *Vs, const float *__restrict__ qkv,
                                                         int64_t b, int64_t k0, int64_t T, int64_t C, int h,
                                                         int64_t hs, int BT) {
    int64_t idx;
    __syncthreads();
    for (idx = threadIdx.x; idx < BT * hs; idx += BT) {
        int64_t r = idx / hs, c = idx % hs, tk = k0 + r;
        const float *src = qkv + (b * T + tk) * 3 * C + C + h * hs + c;
        Ks[idx] = tk < T ? src[0] : 0.0f;
        Vs[idx] = tk < T ? src[C] : 0.0f;
    }
    __syncthreads();
}

/* The fused forward. Block (b, h, query tile qt) of DT_K__ATT_TILE threads, thread = query. */
static __global__ void dt_k__att_flash(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ qkv,
                                int64_t T, int64_t C, int H, int64_t hs, float scale) {
    DT_K_SHARED_DYNAMIC(float, sm);
    const int BT = DT_K__ATT_TILE;
    int64_t nqt = (T + BT - 1) / BT, blk = blockIdx.x, qt = blk % nqt, bh = blk / nqt, b = bh / H;
    int h = (int)(bh % H), tid = threadIdx.x, j;
    int64_t q0 = qt * BT, t = q0 + tid, k0, i, kend = q0 + BT < T ? q0 + BT : T;
    float *Qs = sm, *Ks = sm + BT * hs, *Vs = Ks + BT * hs, *Os = Vs + BT * hs;
    float *q = Qs + tid * hs, *o = Os + tid * hs;
    float m = -INFINITY, l = 0.0f;
    const int valid = t < T;
    for (i = 0; i < hs; i++) { /* this thread's own rows: no barrier needed */
        q[i] = valid ? qkv[(b * T + t) * 3 * C + h * hs + i] : 0.0f;
        o[i] = 0.0f;
    }
    for (k0 = 0; k0 < kend; k0 += BT) {
        dt_k__att_load_kv(Ks, Vs, qkv, b, k0, T, C, h, hs, BT);
        if (!valid) continue;
        for (j = 0; j < BT && k0 + j <= t; j++) {
            const float *k = Ks + j * hs, *v = Vs + j * hs;
            float s = 0.0f, p;
            for (i = 0; i < hs; i++) s += q[i] * k[i];
            s *= scale;
            if (s > m) { /* a new max: rescale what was summed so far */
                float corr = expf(m - s);
                l = l * corr + 1.0f;
                for (i = 0; i < hs; i++) o[i] = o[i] * corr + v[i];
                m = s;
            } else {
                p = expf(s - m);
                l += p;
                for (i = 0; i < hs; i++) o[i] += p * v[i];
            }
        }
    }
    if (!valid) return;
    for (i = 0; i < hs; i++) out[(b * T + t) * C + h * hs + i] = o[i] / l;
    if (lse) lse[bh * T + t] = m + logf(l);
}

extern "C" int dt_k_attention_fwd_flash(float *out, float *lse, const float *qkv, int64_t B, int64_t T, int64_t C,
                                        int n_head, void *stream) {
    int64_t hs, blocks;
    size_t smem;
    if (!dt_k__att_args(B, T, C, n_head)) return (int)cudaErrorInvalidValue;
    hs = C / n_head;
    smem = (size_t)(4 * DT_K__ATT_TILE * hs) * sizeof(float);
    if (smem > DT_K__SMEM_MAX) return (int)cudaErrorInvalidValue;
    blocks = B * n_head * dt_k__ceil_div(T, DT_K__ATT_TILE);
    if (blocks == 0) return 0;
    if (C > 0 && (!out || !qkv)) return (int)cudaErrorInvalidValue; /* lse may be NULL: not written */
    DT_K_LAUNCH(dt_k__att_flash, (unsigned)blocks, DT_K__ATT_TILE, smem, stream, out, lse, qkv, T, C, n_head, hs,
                dt_k__att_scale(hs));
    return DT_K_CHECK();
}

/* The fused backward (FlashAttention-2's, Dao 2023), never storing the T x T matrices. With the
   forward's out and lse: D[t] = dout[t] . out[t] (= sum_t2 a[t][t2] datt[t2], the softmax
   backward's row sum), and per (query t, key t2 <= t), recomputed from q, k and lse:
       p = exp(q.k scale - lse[t]),  dp = dout[t] . v[t2],  ds = p (dp - D[t]) scale
       dv[t2] += p dout[t],  dk[t2] += ds q[t],  dq[t] += ds k[t2].
   Two passes, so that every output row is summed by one thread in a fixed order (no atomics:
   the same bits every run): one block per (b, h, key tile) walks the query tiles from its own
   diagonal down and owns dk, dv of its keys; one block per (b, h, query tile) walks the key
   tiles up to its diagonal and owns dq. Thread = key (resp. query) of the tile; the other side
   passes through shared memory in tiles; the thread's own rows (k, v, dk, dv resp. q, dout, dq)
   sit in shared memory too (hs is known only at run time). Tile 32, or 16 when hs > 64 keeps
   the 6 tiles under 48 KiB. lse and D are read from global memory by all threads at once (one
   broadcast load each). */
static int dt_k__att_bwd_tile(int64_t hs) {
    return (uint64_t)(6 * 32 * hs) * sizeof(float) <= DT_K__SMEM_MAX ? 32 : 16;
}

/* D[bh T + t] = dout[b, t, head h] . out[b, t, head h], one thread per row, in column order. */
static __global__ void dt_k__att_flash_d(float *__restrict__ D, const float *__restrict__ dout,
                                         const float *__restrict__ out, int64_t rows, int64_t T, int64_t C, int H,
                                         int64_t hs) {
    int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i;
    for (; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = r % T, bh = r / T, b = bh / H, off = (b * T + t) * C + (bh % H) * hs;
        float d = 0.0f;
        for (i = 0; i < hs; i++) d += dout[off + i] * out[off + i];
        D[r] = d;
    }
}

/* The two passes share their operands and the block geometry: block (b, h, tile of BT rows).
   KEYS = 1, the key side: thread = key tk; dk, dv += over the queries t >= tk. KEYS = 0, the
   query side: thread = query t; dq += over the keys t2 <= t. */
template <int KEYS>
static __global__ void dt_k__att_flash_bwd(float *__restrict__ dqkv, const float *__restrict__ dout,
                                           const float *__restrict__ qkv, const float *__restrict__ lse,
                                           const float *__restrict__ D, int64_t T, int64_t C, int H, int64_t hs,
                                           float scale) {
    DT_K_SHARED_DYNAMIC(float, sm);
    const int BT = (int)blockDim.x;
    int64_t nt = (T + BT - 1) / BT, blk = blockIdx.x, bh = blk / nt, b = bh / H, t0 = (blk % nt) * BT;
    int h = (int)(bh % H), tid = threadIdx.x, j;
    int64_t i;
    if (KEYS) {
        int64_t tk = t0 + tid, q0, idx;
        float *Qs = sm, *Gs = Qs + BT * hs, *k = Gs + BT * hs + tid * hs, *v = k + BT * hs, *dk = v + BT * hs,
              *dv = dk + BT * hs;
        const int valid = tk < T;
        for (i = 0; i < hs; i++) { /* this thread's own rows: no barrier needed */
            k[i] = valid ? qkv[(b * T + tk) * 3 * C + C + h * hs + i] : 0.0f;
            v[i] = valid ? qkv[(b * T + tk) * 3 * C + 2 * C + h * hs + i] : 0.0f;
            dk[i] = 0.0f;
            dv[i] = 0.0f;
        }
        for (q0 = t0; q0 < T; q0 += BT) { /* queries before the tile's first key do not see it (causal) */
            __syncthreads(); /* every thread is done with the previous tile */
            for (idx = tid; idx < BT * hs; idx += BT) {
                int64_t r = idx / hs, c = idx % hs, tq = q0 + r;
                Qs[idx] = tq < T ? qkv[(b * T + tq) * 3 * C + h * hs + c] : 0.0f;
                Gs[idx] = tq < T ? dout[(b * T + tq) * C + h * hs + c] : 0.0f;
            }
            __syncthreads(); /* the tile is in */
            if (!valid) continue;
            for (j = 0; j < BT && q0 + j < T; j++) {
                const float *q = Qs + j * hs, *g = Gs + j * hs;
                float s = 0.0f, dp = 0.0f, p, ds;
                if (q0 + j < tk) continue; /* the causal mask */
                for (i = 0; i < hs; i++) s += q[i] * k[i];
                p = expf(s * scale - lse[bh * T + q0 + j]);
                for (i = 0; i < hs; i++) dp += g[i] * v[i];
                ds = p * (dp - D[bh * T + q0 + j]) * scale;
                for (i = 0; i < hs; i++) {
                    dv[i] += p * g[i];
                    dk[i] += ds * q[i];
                }
            }
        }
        if (!valid) return;
        for (i = 0; i < hs; i++) {
            dqkv[(b * T + tk) * 3 * C + C + h * hs + i] += dk[i];
            dqkv[(b * T + tk) * 3 * C + 2 * C + h * hs + i] += dv[i];
        }
    } else {
        int64_t t = t0 + tid, k0, kend = t0 + BT < T ? t0 + BT : T;
        float *Ks = sm, *Vs = Ks + BT * hs, *q = Vs + BT * hs + tid * hs, *g = q + BT * hs, *dq = g + BT * hs;
        const int valid = t < T;
        const float lt = valid ? lse[bh * T + t] : 0.0f, Dt = valid ? D[bh * T + t] : 0.0f;
        for (i = 0; i < hs; i++) {
            q[i] = valid ? qkv[(b * T + t) * 3 * C + h * hs + i] : 0.0f;
            g[i] = valid ? dout[(b * T + t) * C + h * hs + i] : 0.0f;
            dq[i] = 0.0f;
        }
        for (k0 = 0; k0 < kend; k0 += BT) { /* keys past the tile's last query are masked for all */
            dt_k__att_load_kv(Ks, Vs, qkv, b, k0, T, C, h, hs, BT);
            if (!valid) continue;
            for (j = 0; j < BT && k0 + j <= t; j++) {
                const float *kr = Ks + j * hs, *vr = Vs + j * hs;
                float s = 0.0f, dp = 0.0f, p, ds;
                for (i = 0; i < hs; i++) s += q[i] * kr[i];
                p = expf(s * scale - lt);
                for (i = 0; i < hs; i++) dp += g[i] * vr[i];
                ds = p * (dp - Dt) * scale;
                for (i = 0; i < hs; i++) dq[i] += ds * kr[i];
            }
        }
        if (!valid) return;
        for (i = 0; i < hs; i++) dqkv[(b * T + t) * 3 * C + h * hs + i] += dq[i];
    }
}

extern "C" int dt_k_attention_bwd_flash(float *dqkv, const float *dout, const float *qkv, const float *out,
                                        const float *lse, int64_t B, int64_t T, int64_t C, int n_head, float *scratch,
                                        void *stream) {
    int64_t hs, rows, blocks;
    float *D = scratch; /* the caller's, stream-ordered */
    int st, bt;
    if (!dt_k__att_args(B, T, C, n_head)) return (int)cudaErrorInvalidValue;
    hs = C / n_head;
    bt = dt_k__att_bwd_tile(hs);
    if ((uint64_t)(6 * bt * hs) * sizeof(float) > DT_K__SMEM_MAX) return (int)cudaErrorInvalidValue;
    rows = B * n_head * T;
    if (rows == 0 || hs == 0 || !dqkv) return 0; /* C = 0: no gradient to write */
    if (!dout || !qkv || !out || !lse || !D) return (int)cudaErrorInvalidValue;
    blocks = dt_k__ceil_div(rows, 256);
    DT_K_LAUNCH(dt_k__att_flash_d, (unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, stream, D, dout, out, rows, T, C,
                n_head, hs);
    st = DT_K_CHECK();
    blocks = B * n_head * dt_k__ceil_div(T, bt);
    if (!st) {
        DT_K_LAUNCH(dt_k__att_flash_bwd<1>, (unsigned)blocks, bt, (size_t)(6 * bt * hs) * sizeof(float), stream, dqkv,
                    dout, qkv, lse, D, T, C, n_head, hs, dt_k__att_scale(hs));
        st = DT_K_CHECK();
    }
    if (!st) {
        DT_K_LAUNCH(dt_k__att_flash_bwd<0>, (unsigned)blocks, bt, (size_t)(5 * bt * hs) * sizeof(float), stream, dqkv,
                    dout, qkv, lse, D, T, C, n_head, hs, dt_k__att_scale(hs));
        st = DT_K_CHECK();
    }
    return st;
}

/* ---- one (query block, key block) pair with its logsumexp: dt_attention_block_fwd / _bwd on the
   device (context parallelism's ring step). One thread per (b, h, query row) forward and for dq,
   one per (b, kv head, key row) for dk and dv: every output row summed by one thread in key (or
   head, query) order, no atomics, the same bits every run. The scores are recomputed where they
   are needed instead of kept (two dot products per pair forward, three backward): simple, not
   fast; the tensor-core kernels of dt_flash.cu are where speed lives. */

/* Keys [0, n) of the block that query row i sees. */
static __device__ int64_t dt_k__ablk_nvis(const dt_k_attn_block *a, int64_t i) {
    int64_t n = a->q_pos + i - a->k_pos + 1;
    return n < 0 ? 0 : n > a->k_rows ? a->k_rows : n;
}

/* Thread idx's query row: batch *b, head *h (and its kv head *hk), row *i of the block; the keys it
   sees. 0 when idx is past the rows or the row sees no key of the block. */
static __device__ int64_t dt_k__ablk_row(const dt_k_attn_block *a, int64_t idx, int64_t *b, int *h, int *hk,
                                         int64_t *i) {
    if (idx >= a->B * a->H * a->q_rows) return 0;
    *i = idx % a->q_rows;
    *h = (int)((idx / a->q_rows) % a->H);
    *b = idx / a->q_rows / a->H;
    *hk = *h / (a->H / a->Hkv);
    return dt_k__ablk_nvis(a, *i);
}

static __device__ float dt_k__dot(const float *x, const float *y, int64_t n) {
    float s = 0.0f;
    int64_t c;
    for (c = 0; c < n; c++) s += x[c] * y[c];
    return s;
}

static __global__ void dt_k__ablk_fwd(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ q,
                                      const float *__restrict__ kv, dt_k_attn_block a, float scale) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i, b, j, c, n;
    int h, hk;
    const float *qp, *kp, *vp;
    float *op, *lp, m = -INFINITY, sum = 0.0f, lb, ln, wa, wb;
    n = dt_k__ablk_row(&a, idx, &b, &h, &hk, &i);
    if (!n) return;
    qp = q + (b * a.Tq + a.q_row + i) * a.Wq + h * a.hs;
    kp = kv + (b * a.Tk + a.k_row) * a.Wkv + hk * a.hs;
    vp = kp + a.Hkv * a.hs;
    op = out + (b * a.Tq + a.q_row + i) * (a.H * a.hs) + h * a.hs;
    lp = lse + (b * a.H + h) * a.Tq + a.q_row + i;
    for (j = 0; j < n; j++) { /* the block's max and sum */
        float s = dt_k__dot(qp, kp + j * a.Wkv, a.hs) * scale;
        if (s > m) { sum = sum * expf(m - s) + 1.0f; m = s; }
        else sum += expf(s - m);
    }
    lb = m + logf(sum);
    if (*lp == -INFINITY) { ln = lb; wa = 0.0f; }
    else {
        float mx = *lp > lb ? *lp : lb;
        ln = mx + logf(expf(*lp - mx) + expf(lb - mx));
        wa = expf(*lp - ln);
    }
    wb = expf(lb - ln);
    for (c = 0; c < a.hs; c++) op[c] = wa > 0.0f ? op[c] * wa : 0.0f; /* what the row held, weighted (nothing
                                                                          yet: 0), then the block's rows */
    for (j = 0; j < n; j++) {
        float p = expf(dt_k__dot(qp, kp + j * a.Wkv, a.hs) * scale - lb) * wb;
        const float *v = vp + j * a.Wkv;
        for (c = 0; c < a.hs; c++) op[c] += p * v[c];
    }
    *lp = ln;
}

/* dq (q's layout) += per query row: p = exp(s - lse), dp = dout . v, ds = p (dp - D) scale. */
static __global__ void dt_k__ablk_dq(float *__restrict__ dq, const float *__restrict__ dout,
                                     const float *__restrict__ q, const float *__restrict__ kv,
                                     const float *__restrict__ out, const float *__restrict__ lse, dt_k_attn_block a,
                                     float scale) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, i, b, j, c, n, C = a.H * a.hs, row;
    int h, hk;
    const float *qp, *kp, *vp, *gp;
    float *dqp, D, l;
    n = dt_k__ablk_row(&a, idx, &b, &h, &hk, &i);
    if (!n) return;
    row = b * a.Tq + a.q_row + i;
    qp = q + row * a.Wq + h * a.hs;
    dqp = dq + row * a.Wq + h * a.hs;
    gp = dout + row * C + h * a.hs;
    D = dt_k__dot(gp, out + row * C + h * a.hs, a.hs);
    l = lse[(b * a.H + h) * a.Tq + a.q_row + i];
    kp = kv + (b * a.Tk + a.k_row) * a.Wkv + hk * a.hs;
    vp = kp + a.Hkv * a.hs;
    for (j = 0; j < n; j++) {
        float p = expf(dt_k__dot(qp, kp + j * a.Wkv, a.hs) * scale - l);
        float ds = p * (dt_k__dot(gp, vp + j * a.Wkv, a.hs) - D) * scale;
        for (c = 0; c < a.hs; c++) dqp[c] += ds * kp[j * a.Wkv + c];
    }
}

/* dk, dv (kv's layout) += per key row, over the query heads of its group and the rows that see it. */
static __global__ void dt_k__ablk_dkv(float *__restrict__ dkv, const float *__restrict__ dout,
                                      const float *__restrict__ q, const float *__restrict__ kv,
                                      const float *__restrict__ out, const float *__restrict__ lse, dt_k_attn_block a,
                                      float scale) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, j, b, i, i0, c, C = a.H * a.hs, krow;
    int hk, h, g = a.H / a.Hkv;
    const float *kp, *vp;
    float *dkp, *dvp;
    if (idx >= a.B * a.Hkv * a.k_rows) return;
    j = idx % a.k_rows;
    hk = (int)((idx / a.k_rows) % a.Hkv);
    b = idx / a.k_rows / a.Hkv;
    krow = b * a.Tk + a.k_row + j;
    kp = kv + krow * a.Wkv + hk * a.hs;
    vp = kp + a.Hkv * a.hs;
    dkp = dkv + krow * a.Wkv + hk * a.hs;
    dvp = dkp + a.Hkv * a.hs;
    i0 = a.k_pos + j - a.q_pos; /* the first query row that sees key j */
    if (i0 < 0) i0 = 0;
    for (h = hk * g; h < (hk + 1) * g; h++)
        for (i = i0; i < a.q_rows; i++) {
            int64_t row = b * a.Tq + a.q_row + i;
            const float *qp = q + row * a.Wq + h * a.hs, *gp = dout + row * C + h * a.hs;
            float D = dt_k__dot(gp, out + row * C + h * a.hs, a.hs);
            float p = expf(dt_k__dot(qp, kp, a.hs) * scale - lse[(b * a.H + h) * a.Tq + a.q_row + i]);
            float ds = p * (dt_k__dot(gp, vp, a.hs) - D) * scale;
            for (c = 0; c < a.hs; c++) {
                dkp[c] += ds * qp[c];
                dvp[c] += p * gp[c];
            }
        }
}

/* The block's ranges inside its tensors, and every product the launches form (the rows of the
   grids within int, the widths within int64) checked by division first. */
static int dt_k__ablk_ok(const dt_k_attn_block *a) {
    const int64_t I = 2147483647LL;
    if (!a || a->B < 0 || a->H <= 0 || a->Hkv <= 0 || a->H % a->Hkv || a->hs < 0 || a->q_rows < 0 || a->k_rows < 0 ||
        a->q_row < 0 || a->k_row < 0 || a->Tq < 0 || a->Tk < 0 || a->q_row > a->Tq - a->q_rows ||
        a->k_row > a->Tk - a->k_rows || a->hs > INT64_MAX / 2 / a->H)
        return 0;
    if (a->B && (a->Tq > I / a->B / a->H || a->Tk > I / a->B / a->Hkv)) return 0; /* B H Tq, B Hkv Tk rows */
    if (a->B && a->Tq && a->Wq > INT64_MAX / a->B / a->Tq) return 0;                /* q's elements */
    if (a->B && a->Tk && a->Wkv > INT64_MAX / a->B / a->Tk) return 0;               /* kv's */
    return a->Wq >= a->H * a->hs && a->Wkv == 2 * a->Hkv * a->hs;
}

extern "C" int dt_k_attention_block_fwd(float *out, float *lse, const float *q, const float *kv,
                                        const dt_k_attn_block *a, void *stream) {
    int64_t n;
    if (!dt_k__ablk_ok(a)) return (int)cudaErrorInvalidValue;
    n = a->B * a->H * a->q_rows;
    if (!n || !a->k_rows) return 0;
    if (!lse || (a->hs && (!out || !q || !kv))) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__ablk_fwd, (unsigned)dt_k__ceil_div(n, 128), 128, 0, stream, out, lse, q, kv, *a,
                dt_k__att_scale(a->hs));
    return DT_K_CHECK();
}

extern "C" int dt_k_attention_block_bwd(float *dq, float *dkv, const float *dout, const float *q, const float *kv,
                                        const float *out, const float *lse, const dt_k_attn_block *a, void *stream) {
    int64_t n;
    int st = 0;
    if (!dt_k__ablk_ok(a)) return (int)cudaErrorInvalidValue;
    if (!a->B || !a->q_rows || !a->k_rows) return 0;
    if ((dq || dkv) && (!lse || (a->hs && (!dout || !q || !kv || !out)))) return (int)cudaErrorInvalidValue;
    if (dq) {
        n = a->B * a->H * a->q_rows;
        DT_K_LAUNCH(dt_k__ablk_dq, (unsigned)dt_k__ceil_div(n, 128), 128, 0, stream, dq, dout, q, kv, out, lse, *a,
                    dt_k__att_scale(a->hs));
        st = DT_K_CHECK();
    }
    if (dkv && !st) {
        n = a->B * a->Hkv * a->k_rows;
        DT_K_LAUNCH(dt_k__ablk_dkv, (unsigned)dt_k__ceil_div(n, 128), 128, 0, stream, dkv, dout, q, kv, out, lse, *a,
                    dt_k__att_scale(a->hs));
        st = DT_K_CHECK();
    }
    return st;
}
