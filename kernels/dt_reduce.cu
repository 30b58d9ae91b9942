/* kernels/dt_reduce.cu - reductions and layernorm (kernels/dt_kernels.h, "reductions and
   layernorm"): dt_k_layernorm_fwd / _bwd.
   Every sum has a fixed order (no atomics), so a result does not change from run to run; a sum
   over rows is two-stage (per-chunk partials in the caller's scratch, then their sum).
                                                                    MIT licence (see dt_tensor.h) */
#include "dt_cuda.cuh"
#include <float.h>

/* ---------------------------------------------------------------- layernorm */

/* The row kernels (forward, dx) give each row one warp, DT_K__LN_WARPS rows to a block, so a row
   needs no barrier and no shared memory for its sums (the warp's butterfly); the block shares the
   weights instead: it copies w (and b) into shared memory once and every row it takes reads them
   there, not from global memory again. That needs C (2C with b) floats of dynamic shared memory,
   at most DT_K__LN_SHARED_MAX bytes (what a launch may ask without opting in): C <= 12288, or
   6144 with b. Past that the kernel reads the weights from global memory (the <false> copy), the
   same operations. The grid is at most DT_K__LN_MAX_BLOCKS blocks (a grid-stride loop over rows
   beyond), so a block copies the weights once for many rows when there are many. */
#define DT_K__LN_WARPS 8
#define DT_K__LN_SHARED_MAX (48 * 1024)
#define DT_K__LN_MAX_BLOCKS 1024u

/* The 16-byte path: rows of a multiple of 4 floats, every pointer aligned (NULL counts as aligned). */
static int dt_k__ln_vec(int64_t C, const void *a, const void *b, const void *c, const void *d) {
    return C % 4 == 0 && dt_k_aligned(a, 16) && dt_k_aligned(b, 16) && dt_k_aligned(c, 16) && dt_k_aligned(d, 16);
}

/* Shared-memory bytes for n rows of C weights, or 0 when they do not fit (read from global). */
static size_t dt_k__ln_shared(int64_t C, int n) {
    return C > 0 && C <= DT_K__LN_SHARED_MAX / (int64_t)(n * sizeof(float)) ? (size_t)C * n * sizeof(float) : 0;
}

/* dst[0..C) = src[0..C) by the whole block, four floats at a time when vec. */
static __device__ __forceinline__ void dt_k__ln_stage(float *dst, const float *__restrict__ src, int64_t C, int vec) {
    const int64_t C4 = vec ? C / 4 : 0;
    for (int64_t c = threadIdx.x; c < C4; c += blockDim.x) dt_k_store4(dst + 4 * c, dt_k_load4(src + 4 * c));
    for (int64_t c = 4 * C4 + threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

/* The CPU op's arithmetic (dt_layernorm_fwd: the corrected two-pass statistics, in float), the
   sums in another order: lane l of the row's warp adds columns l, l + 32, ... (vec: the float4s
   l, l + 32, ..., each's four in turn), then the warp's butterfly adds the 32 lanes. m is the
   float mean, e = mean(x - m) its error, v = mean((x - m)^2) - e^2 the variance about m + e (the
   CPU's comment says why); s in double, once a row, as the CPU. SHW: w and b in shared memory;
   OBF: out in bf16 (each value rounded once; four by an 8-byte store on the vector path). */
template <bool SHW, bool OBF>
__global__ void dt_k__layernorm_fwd(void *out_, float *mean, float *rstd, const float *__restrict__ x,
                                    const float *__restrict__ w, const float *__restrict__ b, float eps, int64_t rows,
                                    int64_t C, int vec) {
    DT_K_SHARED_DYNAMIC(float, sh);
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int64_t C4 = vec ? C / 4 : 0;
    const float *wp = w, *bp = b;
    if (SHW) { /* every thread of the block is here: the barrier before any row */
        dt_k__ln_stage(sh, w, C, vec);
        if (b) dt_k__ln_stage(sh + C, b, C, vec);
        __syncthreads();
        wp = sh, bp = b ? sh + C : NULL;
    }
    for (int64_t r = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * nw) {
        const float *xr = x + r * C;
        float *o = (float *)out_ + r * C;           /* !OBF */
        uint16_t *oh = (uint16_t *)out_ + r * C;    /* OBF */
        float m = 0.0f, e = 0.0f, v = 0.0f, s;
        for (int64_t c = lane; c < C4; c += 32) {
            float4 a = dt_k_load4(xr + 4 * c);
            m += a.x, m += a.y, m += a.z, m += a.w;
        }
        for (int64_t c = 4 * C4 + lane; c < C; c += 32) m += xr[c];
        m = dt_k_warp_sum(m) / (float)(C ? C : 1); /* an empty row: mean 0, variance 0, as on the CPU */
        for (int64_t c = lane; c < C4; c += 32) {
            float4 a = dt_k_load4(xr + 4 * c);
            float d0 = a.x - m, d1 = a.y - m, d2 = a.z - m, d3 = a.w - m;
            e += d0, e += d1, e += d2, e += d3;
            v += d0 * d0, v += d1 * d1, v += d2 * d2, v += d3 * d3;
        }
        for (int64_t c = 4 * C4 + lane; c < C; c += 32) {
            float d = xr[c] - m;
            e += d, v += d * d;
        }
        e = dt_k_warp_sum(e) / (float)(C ? C : 1);
        v = dt_k_warp_sum(v) / (float)(C ? C : 1) - e * e;
        if (v < 0) v = 0;
        m += e;
        s = (float)(1.0 / sqrt((double)v + eps));
        for (int64_t c = lane; c < C4; c += 32) {
            float4 a = dt_k_load4(xr + 4 * c), wv = dt_k_load4(wp + 4 * c);
            float4 bv = bp ? dt_k_load4(bp + 4 * c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float4 y = make_float4((a.x - m) * s * wv.x + bv.x, (a.y - m) * s * wv.y + bv.y,
                                   (a.z - m) * s * wv.z + bv.z, (a.w - m) * s * wv.w + bv.w);
            if (OBF) {
                uint2 h;
                h.x = (unsigned int)dt_k_f32_to_bf16(y.x) | (unsigned int)dt_k_f32_to_bf16(y.y) << 16;
                h.y = (unsigned int)dt_k_f32_to_bf16(y.z) | (unsigned int)dt_k_f32_to_bf16(y.w) << 16;
                dt_k_store_vec<uint2>(oh + 4 * c, h);
            } else
                dt_k_store4(o + 4 * c, y);
        }
        for (int64_t c = 4 * C4 + lane; c < C; c += 32) {
            float y = (xr[c] - m) * s * wp[c] + (bp ? bp[c] : 0.0f);
            if (OBF) oh[c] = dt_k_f32_to_bf16(y);
            else o[c] = y;
        }
        if (lane == 0) {
            if (mean) mean[r] = m;
            if (rstd) rstd[r] = s;
        }
    }
}

/* Blocks for the row kernels: a warp a row, at most DT_K__LN_MAX_BLOCKS. rows > 0. */
static unsigned int dt_k__ln_blocks(int64_t rows) { return dt_k__blocks(rows, DT_K__LN_WARPS, DT_K__LN_MAX_BLOCKS); }

/* The kernel for a SHW with this launcher's OBF (a macro: DT_K_LAUNCH's arguments split at commas). */
#define DT_K__LN_FWD(shw) dt_k__layernorm_fwd<shw, OBF>
template <bool OBF>
static int dt_k__layernorm_fwd_launch(void *out, float *mean, float *rstd, const float *x, const float *w,
                                      const float *b, float eps, int64_t rows, int64_t C, void *stream) {
    int vec;
    size_t shw;
    /* eps as dt_layernorm_fwd takes it: finite and > 0 (an infinite eps makes every rstd 0) */
    if (rows < 0 || C < 0 || !(eps > 0.0f && eps <= FLT_MAX) || (C && rows > INT64_MAX / C))
        return (int)cudaErrorInvalidValue;
    if (rows && C && (!out || !x || !w)) return (int)cudaErrorInvalidValue; /* b, mean, rstd optional */
    if (rows == 0) return 0;
    vec = dt_k__ln_vec(C, OBF ? NULL : out, x, w, b) && (!OBF || dt_k_aligned(out, 8));
    shw = dt_k__ln_shared(C, b ? 2 : 1);
    if (shw)
        DT_K_LAUNCH(DT_K__LN_FWD(true), dt_k__ln_blocks(rows), 32 * DT_K__LN_WARPS, shw, stream, out,
                    mean, rstd, x, w, b, eps, rows, C, vec);
    else
        DT_K_LAUNCH(DT_K__LN_FWD(false), dt_k__ln_blocks(rows), 32 * DT_K__LN_WARPS, 0, stream, out,
                    mean, rstd, x, w, b, eps, rows, C, vec);
    return DT_K_CHECK();
}

int dt_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                       float eps, int64_t rows, int64_t C, void *stream) {
    return dt_k__layernorm_fwd_launch<false>(out, mean, rstd, x, w, b, eps, rows, C, stream);
}
int dt_k_layernorm_fwd_bf16(uint16_t *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                            float eps, int64_t rows, int64_t C, void *stream) {
    return dt_k__layernorm_fwd_launch<true>(out, mean, rstd, x, w, b, eps, rows, C, stream);
}

/* dx += (g w - mean(g w) - nrm mean(g w nrm)) s, the CPU op's operations (dt_layernorm_bwd), a
   warp a row as the forward (its sums in the forward's lane order), w in shared memory (SHW). */
template <bool SHW>
__global__ void dt_k__layernorm_bwd_dx(float *dx, const float *__restrict__ dout, const float *__restrict__ x,
                                       const float *__restrict__ w, const float *__restrict__ mean,
                                       const float *__restrict__ rstd, int64_t rows, int64_t C, int vec) {
    DT_K_SHARED_DYNAMIC(float, sh);
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const int64_t C4 = vec ? C / 4 : 0;
    const float *wp = w;
    if (SHW) {
        dt_k__ln_stage(sh, w, C, vec);
        __syncthreads();
        wp = sh;
    }
    for (int64_t r = (int64_t)blockIdx.x * nw + (threadIdx.x >> 5); r < rows; r += (int64_t)gridDim.x * nw) {
        const float *xr = x + r * C, *g = dout + r * C;
        float *d = dx + r * C;
        float m = mean[r], s = rstd[r], gm = 0.0f, gnm = 0.0f;
        for (int64_t c = lane; c < C4; c += 32) {
            float4 a = dt_k_load4(xr + 4 * c), gv = dt_k_load4(g + 4 * c), wv = dt_k_load4(wp + 4 * c);
            float n0 = (a.x - m) * s, n1 = (a.y - m) * s, n2 = (a.z - m) * s, n3 = (a.w - m) * s;
            float w0 = gv.x * wv.x, w1 = gv.y * wv.y, w2 = gv.z * wv.z, w3 = gv.w * wv.w;
            gm += w0, gm += w1, gm += w2, gm += w3;
            gnm += w0 * n0, gnm += w1 * n1, gnm += w2 * n2, gnm += w3 * n3;
        }
        for (int64_t c = 4 * C4 + lane; c < C; c += 32) {
            float nrm = (xr[c] - m) * s, gw = g[c] * wp[c];
            gm += gw, gnm += gw * nrm;
        }
        gm = dt_k_warp_sum(gm) / (float)(C ? C : 1);
        gnm = dt_k_warp_sum(gnm) / (float)(C ? C : 1);
        for (int64_t c = lane; c < C4; c += 32) {
            float4 a = dt_k_load4(xr + 4 * c), gv = dt_k_load4(g + 4 * c), wv = dt_k_load4(wp + 4 * c);
            float4 dv = dt_k_load4(d + 4 * c);
            dv.x += (gv.x * wv.x - gm - (a.x - m) * s * gnm) * s;
            dv.y += (gv.y * wv.y - gm - (a.y - m) * s * gnm) * s;
            dv.z += (gv.z * wv.z - gm - (a.z - m) * s * gnm) * s;
            dv.w += (gv.w * wv.w - gm - (a.w - m) * s * gnm) * s;
            dt_k_store4(d + 4 * c, dv);
        }
        for (int64_t c = 4 * C4 + lane; c < C; c += 32) {
            float nrm = (xr[c] - m) * s, gw = g[c] * wp[c];
            d[c] += (gw - gm - nrm * gnm) * s;
        }
    }
}

/* dw[c] += sum over rows of nrm * g, db[c] += sum of g, in two stages (a grid-wide sum is two
   launches): stage 1, block (x, y) sums the rows of chunk y (DT_K_LN_BWD_ROWS of them) for its
   columns, row by row, into the chunk's partials; a thread takes four adjacent columns by 16-byte
   loads (vec: C a multiple of 4, every pointer aligned), else one, so a warp reads 512 (128)
   consecutive bytes of a row. Stage 2, a thread per four (one) columns adds the chunks' partials
   in chunk order and adds the total into dw / db. Each column's sums have one order, the same
   on both paths and whatever the timing, so the bits are the same every run; they are not the
   CPU's (a row-order sum), only within ((R - 1) + (nchunks - 1) + 1) u sum|terms| of the exact
   sum (R rows a chunk, u = 2^-24). With one chunk, stage 1 adds into dw / db itself: 0 + p = p,
   so the bits are those of two stages. */
#define DT_K_LN_BWD_ROWS 64

static __host__ __device__ __forceinline__ int64_t dt_k__ln_bwd_chunks(int64_t rows) {
    return (rows + DT_K_LN_BWD_ROWS - 1) / DT_K_LN_BWD_ROWS;
}

/* p[i..i+4) += a (add) or = a, by one 16-byte access (vec) or four; p NULL: nothing. */
static __device__ __forceinline__ void dt_k__ln_put(float *p, int64_t i, float4 a, int vec, int add) {
    if (!p) return;
    if (vec) {
        if (add) {
            float4 o = dt_k_load4(p + i);
            a = make_float4(o.x + a.x, o.y + a.y, o.z + a.z, o.w + a.w);
        }
        dt_k_store4(p + i, a);
    } else {
        p[i] = add ? p[i] + a.x : a.x; /* the scalar path's thread has one column: a.x */
    }
}

/* pw, pb: [nchunks, C] partials, or (direct) dw, db themselves, added to. */
__global__ void dt_k__layernorm_bwd_dwdb_part(float *pw, float *pb, int direct, const float *__restrict__ dout,
                                              const float *__restrict__ x, const float *__restrict__ mean,
                                              const float *__restrict__ rstd, int64_t rows, int64_t C, int vec) {
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * (vec ? 4 : 1), nchunks = dt_k__ln_bwd_chunks(rows);
    if (c >= C) return;
    for (int64_t k = blockIdx.y; k < nchunks; k += gridDim.y) {
        int64_t r0 = k * DT_K_LN_BWD_ROWS, r1 = r0 + DT_K_LN_BWD_ROWS < rows ? r0 + DT_K_LN_BWD_ROWS : rows;
        float4 aw = make_float4(0.0f, 0.0f, 0.0f, 0.0f), ab = aw;
        if (vec) {
            for (int64_t r = r0; r < r1; r++) {
                float4 g = dt_k_load4(dout + r * C + c), a = dt_k_load4(x + r * C + c);
                float m = mean[r], s = rstd[r];
                ab.x += g.x, ab.y += g.y, ab.z += g.z, ab.w += g.w;
                aw.x += (a.x - m) * s * g.x, aw.y += (a.y - m) * s * g.y;
                aw.z += (a.z - m) * s * g.z, aw.w += (a.w - m) * s * g.w;
            }
        } else {
            for (int64_t r = r0; r < r1; r++) {
                float g = dout[r * C + c];
                ab.x += g;
                aw.x += (x[r * C + c] - mean[r]) * rstd[r] * g;
            }
        }
        dt_k__ln_put(pw, direct ? c : k * C + c, aw, vec, direct);
        dt_k__ln_put(pb, direct ? c : k * C + c, ab, vec, direct);
    }
}

__global__ void dt_k__layernorm_bwd_dwdb_sum(float *dw, float *db, const float *__restrict__ pw,
                                             const float *__restrict__ pb, int64_t nchunks, int64_t C, int vec) {
    const int step = vec ? 4 : 1;
    for (int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * step; c < C;
         c += (int64_t)gridDim.x * blockDim.x * step) {
        float4 sw = make_float4(0.0f, 0.0f, 0.0f, 0.0f), sb = sw;
        for (int64_t k = 0; k < nchunks; k++) {
            if (vec) {
                if (dw) {
                    float4 p = dt_k_load4(pw + k * C + c);
                    sw.x += p.x, sw.y += p.y, sw.z += p.z, sw.w += p.w;
                }
                if (db) {
                    float4 p = dt_k_load4(pb + k * C + c);
                    sb.x += p.x, sb.y += p.y, sb.z += p.z, sb.w += p.w;
                }
            } else {
                if (dw) sw.x += pw[k * C + c];
                if (db) sb.x += pb[k * C + c];
            }
        }
        dt_k__ln_put(dw, c, sw, vec, 1);
        dt_k__ln_put(db, c, sb, vec, 1);
    }
}

size_t dt_k_layernorm_bwd_scratch(int64_t rows, int64_t C) {
    int64_t nchunks;
    if (rows <= 0 || C <= 0 || rows > INT64_MAX / C) return 0;
    nchunks = dt_k__ln_bwd_chunks(rows);
    return nchunks > 1 ? (size_t)nchunks * (size_t)C * 2 * sizeof(float) : 0;
}

/* dw, db: two stages, or one (one chunk); vec as the part kernel's comment says. */
static int dt_k__layernorm_bwd_dwdb(float *dw, float *db, const float *dout, const float *x, const float *mean,
                                    const float *rstd, int64_t rows, int64_t C, void *scratch, void *stream) {
    int64_t nchunks = dt_k__ln_bwd_chunks(rows);
    float *pw = (float *)scratch, *pb = nchunks > 1 ? pw + nchunks * C : NULL;
    int vec = dt_k__ln_vec(C, dw, db, dout, x) && dt_k_aligned(scratch, 16), st;
    int64_t items = vec ? C / 4 : C, threads = (items + 31) / 32 * 32 < 256 ? (items + 31) / 32 * 32 : 256;
    int64_t cols = (items + threads - 1) / threads;
    unsigned int gy = nchunks > 65535 ? 65535u : (unsigned int)nchunks; /* gridDim.y; the kernel loops */
    if (cols > 2147483647) return (int)cudaErrorInvalidValue;          /* gridDim.x */
    if (nchunks == 1) {
        DT_K_LAUNCH(dt_k__layernorm_bwd_dwdb_part, dim3((unsigned int)cols, 1), (int)threads, 0, stream, dw, db, 1, dout,
                    x, mean, rstd, rows, C, vec);
        return DT_K_CHECK();
    }
    DT_K_LAUNCH(dt_k__layernorm_bwd_dwdb_part, dim3((unsigned int)cols, gy), (int)threads, 0, stream, dw ? pw : NULL,
                db ? pb : NULL, 0, dout, x, mean, rstd, rows, C, vec);
    if ((st = DT_K_CHECK())) return st;
    DT_K_LAUNCH(dt_k__layernorm_bwd_dwdb_sum, dt_k__blocks(items, 128, 65535u), 128, 0, stream, dw, db, pw, pb,
                nchunks, C, vec);
    return DT_K_CHECK();
}

int dt_k_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x, const float *w,
                       const float *mean, const float *rstd, int64_t rows, int64_t C, void *scratch, void *stream) {
    int st;
    if (rows < 0 || C < 0 || (C && rows > INT64_MAX / C) || !mean || !rstd) return (int)cudaErrorInvalidValue;
    if (rows == 0 || C == 0) return 0;
    if ((dx || dw || db) && (!dout || !x || (dx && !w))) return (int)cudaErrorInvalidValue;
    if ((dw || db) && dt_k_layernorm_bwd_scratch(rows, C) && !scratch) return (int)cudaErrorInvalidValue;
    if (dx) {
        int vec = dt_k__ln_vec(C, dx, dout, x, w);
        size_t shw = dt_k__ln_shared(C, 1);
        if (shw)
            DT_K_LAUNCH(dt_k__layernorm_bwd_dx<true>, dt_k__ln_blocks(rows), 32 * DT_K__LN_WARPS, shw, stream, dx, dout,
                        x, w, mean, rstd, rows, C, vec);
        else
            DT_K_LAUNCH(dt_k__layernorm_bwd_dx<false>, dt_k__ln_blocks(rows), 32 * DT_K__LN_WARPS, 0, stream, dx, dout,
                        x, w, mean, rstd, rows, C, vec);
        if ((st = DT_K_CHECK())) return st;
    }
    return dw || db ? dt_k__layernorm_bwd_dwdb(dw, db, dout, x, mean, rstd, rows, C, scratch, stream) : 0;
}
