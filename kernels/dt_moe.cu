/* kernels/dt_moe.cu - the kernels of dt_parallel.h's mixture-of-experts layer on CUDA tensors
   (kernels/dt_kernels.h, ">>moe"): the router's softmax and top-k, the capacity per sequence, the
   per-expert counts and send slots, the row copies of dispatch and combine, and their backward.
   The experts' GEMMs are dt_gemm.cu's grouped cuBLAS call (one per GEMM over all local experts),
   their biases added and summed by expert segment here.

   Every kernel computes each output in the CPU path's order (dt_parallel.h, >>moe): a token's
   softmax and choice by one thread, a sequence's capacity by one thread walking it in GShard's
   order, an expert's slots by one thread walking the tokens in order, a token's combine over its
   choices j = 0 .. k-1, the gates' grads as double sums over the columns in order. So the same
   inputs give the CPU's choices, counts, slots and copies exactly, and its values within the
   device expf's ulps in the softmax and nvcc's fused multiply-adds (the combine). No atomics,
   no allocation, no wait for the host (dt_parallel.h reads the counts back: the all-to-all's
   sizes).                                                           MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <math.h>
#include <stdint.h>

/* a or b negative, or a * b past int64 (checked by division before a launcher forms it). */
static int dt_k__moe_bad(int64_t a, int64_t b) { return a < 0 || b < 0 || (b && a > INT64_MAX / b); }

/* One thread per token: p = softmax(logits) in place (max subtracted, the sum in double), then
   the k largest of p (+ bias) with ties to the lower index, and the gates. */
static __global__ void dt_k__moe_route(float *probs, int *idx, float *gate, const float *__restrict__ bias,
                                       int64_t N, int E, int k, int renorm) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < N; t += (int64_t)gridDim.x * blockDim.x) {
        float *p = probs + t * E, mx = p[0];
        double sum = 0, sel = 0;
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - mx));
        for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bs = 0;
            for (int e = 0; e < E; e++) {
                float s = bias ? p[e] + bias[e] : p[e];
                int i = 0;
                while (i < j && idx[t * k + i] != e) i++;
                if (i < j) continue;
                if (best < 0 || s > bs) { best = e; bs = s; }
            }
            idx[t * k + j] = best;
            gate[t * k + j] = p[best];
            sel += p[best];
        }
        if (renorm && sel > 0)
            for (int j = 0; j < k; j++) gate[t * k + j] = (float)(gate[t * k + j] / sel);
    }
}

static __device__ uint64_t dt_k__moe_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One thread per sequence s: its first choices in order, then its second ..., each kept while its
   expert has taken fewer than cap (slot 0) or dropped (slot -1); seqstat[2 s] dropped,
   [2 s + 1] the sum of the dropped pairs' 20-bit fingerprints. used: [S, E] scratch. */
static __global__ void dt_k__moe_capacity(int64_t *slot, int64_t *seqstat, int64_t *used, const int *__restrict__ idx,
                                          int64_t S, int64_t T, int E, int k, int64_t cap, int64_t seq0) {
    for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < S; s += (int64_t)gridDim.x * blockDim.x) {
        int64_t *u = used + s * E, dropped = 0, print = 0;
        for (int e = 0; e < E; e++) u[e] = 0;
        for (int j = 0; j < k; j++)
            for (int64_t t = s * T; t < (s + 1) * T; t++) {
                int e = idx[t * k + j];
                if (!cap || u[e] < cap) {
                    u[e]++;
                    slot[t * k + j] = 0;
                } else {
                    uint64_t id = (uint64_t)(seq0 + s) * (uint64_t)T + (uint64_t)(t - s * T);
                    slot[t * k + j] = -1;
                    dropped++;
                    print += (int64_t)(dt_k__moe_mix(id * (uint64_t)k + (uint64_t)j) & 0xfffffu);
                }
            }
        seqstat[2 * s] = dropped;
        seqstat[2 * s + 1] = print;
    }
}

/* One thread per expert e: stat[e] assignments routed to it, stat[E + e] the sum of p_e over the
   tokens (in token order, double), stat[2E + e] the kept ones. */
static __global__ void dt_k__moe_counts(double *stat, const int *__restrict__ idx, const int64_t *__restrict__ slot,
                                        const float *__restrict__ probs, int64_t N, int E, int k) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < E; e += (int64_t)gridDim.x * blockDim.x) {
        double routed = 0, psum = 0, kept = 0;
        for (int64_t t = 0; t < N; t++) {
            psum += probs[t * E + e];
            for (int j = 0; j < k; j++)
                if (idx[t * k + j] == e) {
                    routed += 1;
                    kept += slot[t * k + j] >= 0;
                }
        }
        stat[e] = routed;
        stat[E + e] = psum;
        stat[2 * (int64_t)E + e] = kept;
    }
}

/* One thread per expert e: its kept assignments get the send rows [sum of the kept of experts
   < e, ...) in token order. */
static __global__ void dt_k__moe_slots(int64_t *slot, const int *__restrict__ idx, const double *__restrict__ stat,
                                       int64_t N, int E, int k) {
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < E; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t at = 0;
        for (int64_t i = 0; i < e; i++) at += (int64_t)stat[2 * (int64_t)E + i];
        for (int64_t t = 0; t < N; t++)
            for (int j = 0; j < k; j++)
                if (idx[t * k + j] == e && slot[t * k + j] >= 0) slot[t * k + j] = at++;
    }
}

/* send[slot[t, j]] = x[t] for the kept assignments. */
static __global__ void dt_k__moe_pack(float *send, const float *__restrict__ x, const int64_t *__restrict__ slot,
                                      int64_t N, int k, int64_t C) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * k * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t a = i / C, c = i - a * C, s = slot[a];
        if (s >= 0) send[s * C + c] = x[(a / k) * C + c];
    }
}

/* to: dst[i] = src[perm[i]]; else dst[perm[i]] = src[i] (rows of C). */
static __global__ void dt_k__moe_permute(float *dst, const float *__restrict__ src, const int64_t *__restrict__ perm,
                                         int64_t R, int64_t C, int to) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < R * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / C, c = i - r * C;
        if (to) dst[i] = src[perm[r] * C + c];
        else dst[perm[r] * C + c] = src[i];
    }
}

/* y[t] = sum over j = 0 .. k-1 of the kept g_tj ret[slot_tj], from 0 in that order. */
static __global__ void dt_k__moe_combine(float *y, const float *__restrict__ ret, const int64_t *__restrict__ slot,
                                         const float *__restrict__ gate, int64_t N, int k, int64_t C) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / C, c = i - t * C;
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            int64_t s = slot[t * k + j];
            if (s >= 0) acc += gate[t * k + j] * ret[s * C + c];
        }
        y[i] = acc;
    }
}

/* One thread per (t, j): dret[slot] = g dy[t]; dg[t, j] = dy[t] . ret[slot] (double, columns in
   order), 0 where dropped. */
static __global__ void dt_k__moe_combine_bwd(float *dret, float *dg, const float *__restrict__ dy,
                                             const float *__restrict__ ret, const int64_t *__restrict__ slot,
                                             const float *__restrict__ gate, int64_t N, int k, int64_t C) {
    for (int64_t a = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; a < N * k; a += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = slot[a], t = a / k;
        double dot = 0;
        if (s >= 0)
            for (int64_t c = 0; c < C; c++) {
                dot += (double)dy[t * C + c] * ret[s * C + c];
                dret[s * C + c] = gate[a] * dy[t * C + c];
            }
        dg[a] = (float)dot;
    }
}

/* dx[t] += back[slot_tj] for j = 0 .. k-1 (kept), in that order. */
static __global__ void dt_k__moe_dispatch_bwd(float *dx, const float *__restrict__ back, const int64_t *__restrict__ slot,
                                              int64_t N, int k, int64_t C) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < N * C; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / C, c = i - t * C;
        float acc = dx[i];
        for (int j = 0; j < k; j++) {
            int64_t s = slot[t * k + j];
            if (s >= 0) acc += back[s * C + c];
        }
        dx[i] = acc;
    }
}

/* One thread per token: dp from the gates' grads (renorm: (dg_j - sum_i dg_i g_i) / S) plus the
   aux loss's auxd[e], then dz = p (dp - p . dp). */
static __global__ void dt_k__moe_router_bwd(float *dz, const float *__restrict__ probs, const int *__restrict__ idx,
                                            const float *__restrict__ gate, const float *__restrict__ dg,
                                            const float *__restrict__ auxd, int64_t N, int E, int k, int renorm) {
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < N; t += (int64_t)gridDim.x * blockDim.x) {
        const float *p = probs + t * E;
        float *d = dz + t * E;
        double dot = 0, sel = 0, gd = 0;
        for (int e = 0; e < E; e++) d[e] = auxd[e];
        if (renorm) {
            for (int j = 0; j < k; j++) {
                sel += p[idx[t * k + j]];
                gd += (double)dg[t * k + j] * gate[t * k + j];
            }
            for (int j = 0; j < k && sel > 0; j++) d[idx[t * k + j]] += (float)((dg[t * k + j] - gd) / sel);
        } else
            for (int j = 0; j < k; j++) d[idx[t * k + j]] += dg[t * k + j];
        for (int e = 0; e < E; e++) dot += (double)p[e] * d[e];
        for (int e = 0; e < E; e++) d[e] = (float)(p[e] * (d[e] - dot));
    }
}

/* out[r, c] += bias[e, c] for the expert e whose rows [eoff[e], eoff[e+1]) hold r (a binary search). */
static __global__ void dt_k__moe_bias_rows(float *out, const float *__restrict__ bias, const int64_t *__restrict__ eoff,
                                           int El, int64_t cols) {
    int64_t R = eoff[El];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < R * cols; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        int lo = 0, hi = El - 1;
        while (lo < hi) { /* the last e with eoff[e] <= r */
            int mid = lo + (hi - lo + 1) / 2; /* (lo + hi + 1) / 2 without the int overflow */
            if (eoff[mid] <= r) lo = mid;
            else hi = mid - 1;
        }
        out[i] += bias[(int64_t)lo * cols + c];
    }
}

/* One thread per (expert, column): the column's sum over the expert's rows in order, in double,
   rounded, then db += alpha x that (as dt_bias_add_bwd into a zeroed row, then dt_axpy). */
static __global__ void dt_k__moe_bias_grad(float *db, const float *__restrict__ g, const int64_t *__restrict__ eoff,
                                           int El, int64_t cols, float alpha) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)El * cols;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = i / cols, c = i - e * cols;
        double sum = 0;
        for (int64_t r = eoff[e]; r < eoff[e + 1]; r++) sum += g[r * cols + c];
        db[i] += alpha * (float)sum;
    }
}

int dt_k_moe_bias_rows(float *out, const float *bias, const int64_t *eoff, int El, int64_t cols, void *stream) {
    if (El < 1 || dt_k__moe_bad(cols, El) || !eoff || (cols && !bias)) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_bias_rows, 256u, 256, 0, stream, out, bias, eoff, El, cols);
    return DT_K_CHECK();
}

int dt_k_moe_bias_grad(float *db, const float *g, const int64_t *eoff, int El, int64_t cols, float alpha, void *stream) {
    if (El < 1 || dt_k__moe_bad(cols, El)) return (int)cudaErrorInvalidValue;
    if (!cols) return 0;
    if (!db || !eoff) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_bias_grad, dt_k__blocks((int64_t)El * cols, 128, 4096u), 128, 0, stream, db, g, eoff, El,
                cols, alpha);
    return DT_K_CHECK();
}

int dt_k_moe_route(float *probs, int *idx, float *gate, const float *bias, int64_t N, int E, int k, int renorm,
                   void *stream) {
    if (dt_k__moe_bad(N, E) || E < 1 || k < 1 || k > E) return (int)cudaErrorInvalidValue;
    if (!N) return 0;
    if (!probs || !idx || !gate) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_route, dt_k__blocks(N, 128, 4096u), 128, 0, stream, probs, idx, gate, bias, N, E, k, renorm);
    return DT_K_CHECK();
}

int dt_k_moe_capacity(int64_t *slot, int64_t *seqstat, int64_t *used, const int *idx, int64_t S, int64_t T, int E,
                      int k, int64_t cap, int64_t seq0, void *stream) {
    if (dt_k__moe_bad(S, T) || dt_k__moe_bad(S * T, k) || dt_k__moe_bad(S, E) || E < 1 || k < 1 || cap < 0 || seq0 < 0)
        return (int)cudaErrorInvalidValue;
    if (!S) return 0;
    if (!seqstat || !used || (T && (!slot || !idx))) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_capacity, dt_k__blocks(S, 64, 4096u), 64, 0, stream, slot, seqstat, used, idx, S, T, E, k,
                cap, seq0);
    return DT_K_CHECK();
}

int dt_k_moe_counts(double *stat, const int *idx, const int64_t *slot, const float *probs, int64_t N, int E, int k,
                    void *stream) {
    if (dt_k__moe_bad(N, E) || dt_k__moe_bad(N, k) || E < 1 || k < 1 || !stat || (N && (!idx || !slot || !probs)))
        return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_counts, dt_k__blocks(E, 64, 4096u), 64, 0, stream, stat, idx, slot, probs, N, E, k);
    return DT_K_CHECK();
}

int dt_k_moe_slots(int64_t *slot, const int *idx, const double *stat, int64_t N, int E, int k, void *stream) {
    if (dt_k__moe_bad(N, E) || dt_k__moe_bad(N, k) || E < 1 || k < 1) return (int)cudaErrorInvalidValue;
    if (!N) return 0; /* no token: no slot to write */
    if (!slot || !idx || !stat) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_slots, dt_k__blocks(E, 64, 4096u), 64, 0, stream, slot, idx, stat, N, E, k);
    return DT_K_CHECK();
}

int dt_k_moe_pack(float *send, const float *x, const int64_t *slot, int64_t N, int k, int64_t C, void *stream) {
    if (dt_k__moe_bad(N, k) || dt_k__moe_bad(N * k, C) || k < 1) return (int)cudaErrorInvalidValue;
    if (!N || !C) return 0;
    if (!x || !slot) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_pack, dt_k__blocks(N * k * C, 256, 4096u), 256, 0, stream, send, x, slot, N, k, C);
    return DT_K_CHECK();
}

int dt_k_moe_permute(float *dst, const float *src, const int64_t *perm, int64_t R, int64_t C, int to, void *stream) {
    if (dt_k__moe_bad(R, C) || (to != 0 && to != 1)) return (int)cudaErrorInvalidValue;
    if (!R || !C) return 0;
    if (!dst || !src || !perm) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_permute, dt_k__blocks(R * C, 256, 4096u), 256, 0, stream, dst, src, perm, R, C, to);
    return DT_K_CHECK();
}

int dt_k_moe_combine(float *y, const float *ret, const int64_t *slot, const float *gate, int64_t N, int k, int64_t C,
                     void *stream) {
    if (dt_k__moe_bad(N, C) || dt_k__moe_bad(N, k) || k < 1) return (int)cudaErrorInvalidValue;
    if (!N || !C) return 0;
    if (!y || !slot || !gate) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_combine, dt_k__blocks(N * C, 256, 4096u), 256, 0, stream, y, ret, slot, gate, N, k, C);
    return DT_K_CHECK();
}

int dt_k_moe_combine_bwd(float *dret, float *dg, const float *dy, const float *ret, const int64_t *slot,
                         const float *gate, int64_t N, int k, int64_t C, void *stream) {
    if (dt_k__moe_bad(N, C) || dt_k__moe_bad(N, k) || k < 1) return (int)cudaErrorInvalidValue;
    if (!N) return 0;
    if (!dg || !slot || (C && (!dy || !gate))) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_combine_bwd, dt_k__blocks(N * k, 128, 4096u), 128, 0, stream, dret, dg, dy, ret, slot, gate,
                N, k, C);
    return DT_K_CHECK();
}

int dt_k_moe_dispatch_bwd(float *dx, const float *back, const int64_t *slot, int64_t N, int k, int64_t C, void *stream) {
    if (dt_k__moe_bad(N, C) || dt_k__moe_bad(N, k) || k < 1) return (int)cudaErrorInvalidValue;
    if (!N || !C) return 0;
    if (!dx || !slot) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_dispatch_bwd, dt_k__blocks(N * C, 256, 4096u), 256, 0, stream, dx, back, slot, N, k, C);
    return DT_K_CHECK();
}

int dt_k_moe_router_bwd(float *dz, const float *probs, const int *idx, const float *gate, const float *dg,
                        const float *auxd, int64_t N, int E, int k, int renorm, void *stream) {
    if (dt_k__moe_bad(N, E) || E < 1 || k < 1 || k > E) return (int)cudaErrorInvalidValue;
    if (!N) return 0;
    if (!dz || !probs || !idx || !dg || !auxd || (renorm && !gate)) return (int)cudaErrorInvalidValue;
    DT_K_LAUNCH(dt_k__moe_router_bwd, dt_k__blocks(N, 128, 4096u), 128, 0, stream, dz, probs, idx, gate, dg, auxd, N, E,
                k, renorm);
    return DT_K_CHECK();
}
