/* kernels/dt_reduce.cu - reductions and layernorm (kernels/dt_kernels.h, "reductions and
   layernorm"): dt_k_layernorm_fwd / _bwd.
   Every sum has a fixed order (no atomics), so a result does not change from run to run; a sum
   over rows is two-stage (per-chunk partials in the caller's scratch, then their sum).
                                                                    MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"

#define DT_K__RED_THREADS 256

/* ---------------------------------------------------------------- layernorm */

/* The 16-byte path: rows of a multiple of 4 floats, every pointer aligned (NULL counts as aligned). */
static int dt_k__ln_vec(int64_t C, const void *a, const void *b, const void *c, const void *d) {
    return C % 4 == 0 && dt_k_aligned(a, 16) && dt_k_aligned(b, 16) && dt_k_aligned(c, 16) && dt_k_aligned(d, 16);
}

/* Threads per row: enough warps to cover C once, at most 256. */
static int dt_k__ln_threads(int64_t C) {
    int64_t t = (C + 31) / 32 * 32;
    return t < 32 ? 32 : t > 256 ? 256 : (int)t;
}

/* One block per row (grid-stride over rows). Mean, then the variance around it (two passes, as
   the CPU: no cancellation), both summed in double as on the CPU: a float mean of a row whose
   mean is large against its spread is off by enough to show after the scaling by rstd.
   vec (C a multiple of 4, every pointer 16-byte aligned: the launcher's dt_k__ln_vec): a thread
   takes four columns at a time by 16-byte loads and stores; else one (a view at an odd offset). */
__global__ void dt_k__layernorm_fwd(float *out, float *mean, float *rstd, const float *__restrict__ x,
                                    const float *__restrict__ w, const float *__restrict__ b, float eps, int64_t rows,
                                    int64_t C, int vec) {
    const int64_t C4 = vec ? C / 4 : 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C;
        double s = 0.0, v = 0.0;
        float m, rs;
        for (int64_t c = threadIdx.x; c < C4; c += blockDim.x) {
            float4 a = dt_k_load4(xr + 4 * c);
            s += a.x; s += a.y; s += a.z; s += a.w;
        }
        for (int64_t c = 4 * C4 + threadIdx.x; c < C; c += blockDim.x) s += xr[c];
        s = dt_k_block_sum(s);
        m = C ? (float)(s / (double)C) : 0.0f; /* an empty row has mean 0 and variance 0, as on the CPU */
        for (int64_t c = threadIdx.x; c < C4; c += blockDim.x) {
            float4 a = dt_k_load4(xr + 4 * c);
            float d0 = a.x - m, d1 = a.y - m, d2 = a.z - m, d3 = a.w - m;
            v += (double)d0 * d0; v += (double)d1 * d1; v += (double)d2 * d2; v += (double)d3 * d3;
        }
        for (int64_t c = 4 * C4 + threadIdx.x; c < C; c += blockDim.x) {
            float d = xr[c] - m;
            v += (double)d * d;
        }
        v = dt_k_block_sum(v);
        if (C) v /= (double)C;
        rs = (float)(1.0 / sqrt(v + eps));
        for (int64_t c = threadIdx.x; c < C4; c += blockDim.x) {
            float4 a = dt_k_load4(xr + 4 * c), wv = dt_k_load4(w + 4 * c);
            float4 bv = b ? dt_k_load4(b + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            dt_k_store4(out + r * C + 4 * c, make_float4((a.x - m) * rs * wv.x + bv.x, (a.y - m) * rs * wv.y + bv.y,
                                                         (a.z - m) * rs * wv.z + bv.z, (a.w - m) * rs * wv.w + bv.w));
        }
        for (int64_t c = 4 * C4 + threadIdx.x; c < C; c += blockDim.x)
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
                mean, rstd, x, w, b, eps, rows, C, dt_k__ln_vec(C, out, x, w, b));
    return DT_K_CHECK();
}

/* dx += (g*w - mean(g*w) - nrm * mean(g*w*nrm)) * rstd, one block per row; vec: four columns at
   a time by 16-byte loads and stores, as the forward. */
__global__ void dt_k__layernorm_bwd_dx(float *dx, const float *__restrict__ dout, const float *__restrict__ x,
                                       const float *__restrict__ w, const float *__restrict__ mean,
                                       const float *__restrict__ rstd, int64_t rows, int64_t C, int vec) {
    const int64_t C4 = vec ? C / 4 : 0;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C, *g = dout + r * C;
        float m = mean[r], s = rstd[r], gm = 0.0f, gnm = 0.0f;
        for (int64_t c = threadIdx.x; c < C4; c += blockDim.x) {
            float4 a = dt_k_load4(xr + 4 * c), gv = dt_k_load4(g + 4 * c), wv = dt_k_load4(w + 4 * c);
            float n0 = (a.x - m) * s, n1 = (a.y - m) * s, n2 = (a.z - m) * s, n3 = (a.w - m) * s;
            float w0 = gv.x * wv.x, w1 = gv.y * wv.y, w2 = gv.z * wv.z, w3 = gv.w * wv.w;
            gm += w0; gm += w1; gm += w2; gm += w3;
            gnm += w0 * n0; gnm += w1 * n1; gnm += w2 * n2; gnm += w3 * n3;
        }
        for (int64_t c = 4 * C4 + threadIdx.x; c < C; c += blockDim.x) {
            float nrm = (xr[c] - m) * s, gw = g[c] * w[c];
            gm += gw;
            gnm += gw * nrm;
        }
        gm = dt_k_block_sum(gm);
        gnm = dt_k_block_sum(gnm);
        if (C) gm /= (float)C, gnm /= (float)C;
        for (int64_t c = threadIdx.x; c < C4; c += blockDim.x) {
            float4 a = dt_k_load4(xr + 4 * c), gv = dt_k_load4(g + 4 * c), wv = dt_k_load4(w + 4 * c);
            float4 d = dt_k_load4(dx + r * C + 4 * c);
            d.x += (gv.x * wv.x - gm - (a.x - m) * s * gnm) * s;
            d.y += (gv.y * wv.y - gm - (a.y - m) * s * gnm) * s;
            d.z += (gv.z * wv.z - gm - (a.z - m) * s * gnm) * s;
            d.w += (gv.w * wv.w - gm - (a.w - m) * s * gnm) * s;
            dt_k_store4(dx + r * C + 4 * c, d);
        }
        for (int64_t c = 4 * C4 + threadIdx.x; c < C; c += blockDim.x) {
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
                    dx, dout, x, w, mean, rstd, rows, C, dt_k__ln_vec(C, dx, dout, x, w));
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
