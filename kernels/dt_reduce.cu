/* kernels/dt_reduce.cu - reductions and layernorm (kernels/dt_kernels.h, "reductions and
   layernorm"): dt_k_layernorm_fwd / _bwd.
   Every sum has a fixed order (no atomics), so a result does not change from run to run; a sum
   over rows is two-stage (per-chunk partials in the caller's scratch, then their sum).
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

/* dw[c] += sum over rows of nrm * g, db[c] += sum of g, in two stages (a grid-wide sum is two
   launches): stage 1, block (x, y) sums the rows of chunk y (DT_K_LN_BWD_ROWS of them) for its
   columns, one thread per column, row by row, into the chunk's partials (a warp reads 32
   consecutive floats of a row); stage 2, one thread per column adds the chunks' partials in chunk
   order and adds the total into dw / db. Each sum has one order whatever the timing, so the bits
   are the same every run; they are not the CPU's (a row-order sum), only within
   ((R - 1) + (nchunks - 1) + 1) u sum|terms| of the exact sum (R rows a chunk, u = 2^-24). With
   one chunk, stage 1 adds into dw / db itself: 0 + p = p, so the bits are those of two stages. */
#define DT_K_LN_BWD_ROWS 64

static __host__ __device__ __forceinline__ int64_t dt_k__ln_bwd_chunks(int64_t rows) {
    return (rows + DT_K_LN_BWD_ROWS - 1) / DT_K_LN_BWD_ROWS;
}

/* pw, pb: [nchunks, C] partials, or (direct) dw, db themselves, added to. */
__global__ void dt_k__layernorm_bwd_dwdb_part(float *pw, float *pb, int direct, const float *__restrict__ dout,
                                              const float *__restrict__ x, const float *__restrict__ mean,
                                              const float *__restrict__ rstd, int64_t rows, int64_t C) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nchunks = dt_k__ln_bwd_chunks(rows);
    if (c >= C) return;
    for (int64_t k = blockIdx.y; k < nchunks; k += gridDim.y) {
        int64_t r0 = k * DT_K_LN_BWD_ROWS, r1 = r0 + DT_K_LN_BWD_ROWS < rows ? r0 + DT_K_LN_BWD_ROWS : rows;
        float aw = 0.0f, ab = 0.0f;
        for (int64_t r = r0; r < r1; r++) {
            float g = dout[r * C + c];
            ab += g;
            aw += (x[r * C + c] - mean[r]) * rstd[r] * g;
        }
        if (direct) {
            if (pw) pw[c] += aw;
            if (pb) pb[c] += ab;
        } else {
            if (pw) pw[k * C + c] = aw;
            if (pb) pb[k * C + c] = ab;
        }
    }
}

__global__ void dt_k__layernorm_bwd_dwdb_sum(float *dw, float *db, const float *__restrict__ pw,
                                             const float *__restrict__ pb, int64_t nchunks, int64_t C) {
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t k = 0; k < nchunks; k++) {
            if (dw) sw += pw[k * C + c];
            if (db) sb += pb[k * C + c];
        }
        if (dw) dw[c] += sw;
        if (db) db[c] += sb;
    }
}

size_t dt_k_layernorm_bwd_scratch(int64_t rows, int64_t C) {
    int64_t nchunks;
    if (rows <= 0 || C <= 0 || rows > INT64_MAX / C) return 0;
    nchunks = dt_k__ln_bwd_chunks(rows);
    return nchunks > 1 ? (size_t)nchunks * (size_t)C * 2 * sizeof(float) : 0;
}

int dt_k_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, int64_t rows, int64_t C, void *scratch, void *stream) {
    int st;
    if (rows < 0 || C < 0 || (C && rows > INT64_MAX / C) || !mean || !rstd) return (int)cudaErrorInvalidValue;
    if (rows == 0 || C == 0) return 0;
    if ((dw || db) && dt_k_layernorm_bwd_scratch(rows, C) && !scratch) return (int)cudaErrorInvalidValue;
    if (dx) {
        DT_K_LAUNCH(dt_k__layernorm_bwd_dx, rows > 65535 ? 65535u : (unsigned int)rows, dt_k__ln_threads(C), 0, stream,
                    dx, dout, x, w, mean, rstd, rows, C);
        if ((st = DT_K_CHECK())) return st;
    }
    if (dw || db) {
        int threads = dt_k__ln_threads(C);
        int64_t nchunks = dt_k__ln_bwd_chunks(rows), cols = (C + threads - 1) / threads;
        float *pw = (float *)scratch, *pb = nchunks > 1 ? pw + nchunks * C : NULL;
        unsigned int gy = nchunks > 65535 ? 65535u : (unsigned int)nchunks; /* gridDim.y; the kernel loops */
        if (cols > 2147483647) return (int)cudaErrorInvalidValue; /* gridDim.x */
        if (nchunks == 1) {
            DT_K_LAUNCH(dt_k__layernorm_bwd_dwdb_part, dim3((unsigned int)cols, 1), threads, 0, stream, dw, db, 1, dout,
                        x, mean, rstd, rows, C);
            return DT_K_CHECK();
        }
        DT_K_LAUNCH(dt_k__layernorm_bwd_dwdb_part, dim3((unsigned int)cols, gy), threads, 0, stream, dw ? pw : NULL,
                    db ? pb : NULL, 0, dout, x, mean, rstd, rows, C);
        if ((st = DT_K_CHECK())) return st;
        DT_K_LAUNCH(dt_k__layernorm_bwd_dwdb_sum, dt_k__blocks(C, 128, 65535u), 128, 0, stream, dw, db, pw, pb, nchunks,
                    C);
        return DT_K_CHECK();
    }
    return 0;
}
