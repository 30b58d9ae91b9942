/* kernels/dt_reduce.cu - reductions and layernorm (kernels/dt_kernels.h, "reductions and
   layernorm"): dt_k_layernorm_fwd / _bwd.
   Every sum has a fixed order (no atomics), so a result does not change from run to run.
                                                                    MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"

#define DT_K__RED_THREADS 256

/* ---------------------------------------------------------------- layernorm */

/* Threads per row: enough warps to cover C once, at most 256. */
static int dt_k__ln_threads(int64_t C) {
    int64_t t = (C + 31) / 32 * 32;
    return t < 32 ? 32 : t > 256 ? 256 : (int)t;
}

/* One block per row (grid-stride over rows). Mean, then the variance around it (two passes, as
   the CPU: no cancellation), both summed in double as on the CPU: a float mean of a row whose
   mean is large against its spread is off by enough to show after the scaling by rstd. */
__global__ void dt_k__layernorm_fwd(float *out, float *mean, float *rstd, const float *__restrict__ x,
                                    const float *__restrict__ w, const float *__restrict__ b, float eps, int64_t rows,
                                    int64_t C) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C;
        double s = 0.0, v = 0.0;
        float m, rs;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += xr[c];
        s = dt_k_block_sum(s);
        m = C ? (float)(s / (double)C) : 0.0f; /* an empty row has mean 0 and variance 0, as on the CPU */
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float d = xr[c] - m;
            v += (double)d * d;
        }
        v = dt_k_block_sum(v);
        if (C) v /= (double)C;
        rs = (float)(1.0 / sqrt(v + eps));
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            out[r * C + c] = (xr[c] - m) * rs * w[c] + (b ? b[c] : 0.0f);
        if (threadIdx.x == 0) {
            if (mean) mean[r] = m;
            if (rstd) rstd[r] = rs;
        }
    }
}

int dt_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                       float eps, int64_t rows, int64_t C, void *stream) {
    if (rows < 0 || C < 0 || !(eps > 0.0f) || (C && rows > INT64_MAX / C)) return (int)cudaErrorInvalidValue;
    if (rows == 0) return 0;
    DT_K_LAUNCH(dt_k__layernorm_fwd, rows > 65535 ? 65535u : (unsigned int)rows, dt_k__ln_threads(C), 0, stream, out,
                mean, rstd, x, w, b, eps, rows, C);
    return DT_K_CHECK();
}

/* dx += (g*w - mean(g*w) - nrm * mean(g*w*nrm)) * rstd, one block per row. */
__global__ void dt_k__layernorm_bwd_dx(float *dx, const float *__restrict__ dout, const float *__restrict__ x,
                                       const float *__restrict__ w, const float *__restrict__ mean,
                                       const float *__restrict__ rstd, int64_t rows, int64_t C) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C, *g = dout + r * C;
        float m = mean[r], s = rstd[r], gm = 0.0f, gnm = 0.0f;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float nrm = (xr[c] - m) * s, gw = g[c] * w[c];
            gm += gw;
            gnm += gw * nrm;
        }
        gm = dt_k_block_sum(gm);
        gnm = dt_k_block_sum(gnm);
        if (C) gm /= (float)C, gnm /= (float)C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float nrm = (xr[c] - m) * s, gw = g[c] * w[c];
            dx[r * C + c] += (gw - gm - nrm * gnm) * s;
        }
    }
}

/* dw[c] += sum over rows of nrm * g, db[c] += sum of g: one thread per column walks the rows in
   order, adding into the float as the CPU does, so the sums are the CPU's own. */
__global__ void dt_k__layernorm_bwd_dwdb(float *dw, float *db, const float *__restrict__ dout,
                                         const float *__restrict__ x, const float *__restrict__ mean,
                                         const float *__restrict__ rstd, int64_t rows, int64_t C) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        float aw = dw ? dw[c] : 0.0f, ab = db ? db[c] : 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            float g = dout[r * C + c];
            ab += g;
            aw += (x[r * C + c] - mean[r]) * rstd[r] * g;
        }
        if (dw) dw[c] = aw;
        if (db) db[c] = ab;
    }
}

int dt_k_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, int64_t rows, int64_t C, void *stream) {
    int st;
    if (rows < 0 || C < 0 || (C && rows > INT64_MAX / C) || !mean || !rstd) return (int)cudaErrorInvalidValue;
    if (rows == 0 || C == 0) return 0;
    if (dx) {
        DT_K_LAUNCH(dt_k__layernorm_bwd_dx, rows > 65535 ? 65535u : (unsigned int)rows, dt_k__ln_threads(C), 0, stream,
                    dx, dout, x, w, mean, rstd, rows, C);
        if ((st = DT_K_CHECK())) return st;
    }
    if (dw || db) {
        DT_K_LAUNCH(dt_k__layernorm_bwd_dwdb, dt_k__blocks(C, 128, 65535u), 128, 0, stream, dw, db, dout, x, mean, rstd,
                    rows, C);
        return DT_K_CHECK();
    }
    return 0;
}
