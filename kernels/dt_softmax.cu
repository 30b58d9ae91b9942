/* kernels/dt_softmax.cu - softmax + cross entropy (kernels/dt_kernels.h, "softmax and cross
   entropy"): the forward keeps one logsumexp per row, the probabilities are written from it
   (dt_softmax_xent_fwd's API keeps them), and the backward reads them, op for op the CPU's.
                                                                    MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"

/* Threads per row: enough warps to cover V once, at most 512. */
static int dt_k__xent_threads(int64_t V) {
    int64_t t = (V + 31) / 32 * 32;
    return t < 32 ? 32 : t > 512 ? 512 : (int)t;
}

/* One block per row (grid-stride over rows): the max, then the sum of exp(z - max) in float
   (each term <= 1, the largest exactly 1, so the sum is accurate), lse = max + log(sum). */
__global__ void dt_k__softmax_xent_fwd(float *losses, float *lse, const float *__restrict__ logits,
                                       const int32_t *__restrict__ targets, int ignore_index, int64_t rows,
                                       int64_t V) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *z = logits + r * V;
        float mx = -INFINITY, s = 0.0f, l;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
        mx = dt_k_block_max(mx);
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) s += expf(z[v] - mx);
        s = dt_k_block_sum(s);
        l = mx + logf(s);
        if (threadIdx.x == 0) {
            int32_t t = targets[r];
            lse[r] = l;
            if (t == ignore_index) losses[r] = 0.0f;
            else if (t < 0 || (int64_t)t >= V) losses[r] = NAN; /* the CPU op's DT_ERR_RANGE */
            else losses[r] = l - z[t];
        }
    }
}

/* Elementwise: probs[r, v] = exp(z - lse[r]). probs may be logits: each thread reads its one
   element before it writes it. */
__global__ void dt_k__softmax_xent_probs(float *probs, const float *logits, const float *__restrict__ lse, int64_t n,
                                         int64_t V) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        probs[i] = expf(logits[i] - lse[i / V]);
}

/* The CPU op's backward from stored probabilities, op for op: g += s p, and on the target column
   g + s (p - 1). dlogits may be probs (same element, read before written). */
__global__ void dt_k__softmax_xent_bwd_probs(float *dlogits, const float *probs, const int32_t *__restrict__ targets,
                                             int ignore_index, float s, int64_t n, int64_t V) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / V, v = i - r * V;
        int32_t t = targets[r];
        if (t == ignore_index || t < 0 || (int64_t)t >= V) continue;
        dlogits[i] = v == t ? dlogits[i] + s * (probs[i] - 1.0f) : dlogits[i] + s * probs[i];
    }
}

int dt_k_softmax_xent_fwd(float *losses, float *lse, const float *logits, const int32_t *targets, int ignore_index,
                          int64_t rows, int64_t V, void *stream) {
    if (rows < 0 || V < 0 || (V && rows > INT64_MAX / V)) return (int)cudaErrorInvalidValue;
    if (rows == 0) return 0;
    DT_K_LAUNCH(dt_k__softmax_xent_fwd, rows > 65535 ? 65535u : (unsigned int)rows, dt_k__xent_threads(V), 0, stream,
                losses, lse, logits, targets, ignore_index, rows, V);
    return DT_K_CHECK();
}

int dt_k_softmax_xent_probs(float *probs, const float *logits, const float *lse, int64_t rows, int64_t V,
                            void *stream) {
    if (rows < 0 || V < 0 || (V && rows > INT64_MAX / V)) return (int)cudaErrorInvalidValue;
    if (rows * V == 0) return 0;
    DT_K_LAUNCH(dt_k__softmax_xent_probs, dt_k__blocks(rows * V, 256, 4096u), 256, 0, stream, probs, logits, lse,
                rows * V, V);
    return DT_K_CHECK();
}

int dt_k_softmax_xent_bwd_probs(float *dlogits, const float *probs, const int32_t *targets, int ignore_index,
                                float dloss, int64_t n_valid, int64_t rows, int64_t V, void *stream) {
    if (rows < 0 || V < 0 || n_valid < 0 || n_valid > rows || (V && rows > INT64_MAX / V))
        return (int)cudaErrorInvalidValue;
    if (n_valid == 0 || rows * V == 0) return 0;
    DT_K_LAUNCH(dt_k__softmax_xent_bwd_probs, dt_k__blocks(rows * V, 256, 4096u), 256, 0, stream, dlogits, probs,
                targets, ignore_index, dloss / (float)n_valid, rows * V, V);
    return DT_K_CHECK();
}
