/* kernels/dt_gemm.cu - dt_matmul_fwd / _bwd through cuBLAS (row-major, as dt_tensor.h).

   cuBLAS is column-major. A row-major [M,N] matrix read column-major is its transpose, so the
   row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T: swap the operands (and M
   with N), keep each operand's own transpose flag. No data moves.
   f32: cublasSgemm(StridedBatched); TF32 and bf16 / f16 inputs: cublasGemmEx (f32 accumulation,
   an f32 output or one of the inputs' type), one call per batch (the contract's cuBLAS subset has
   no batched GemmEx).
   dt_linear's GEMMs with a bias, a GELU or a bias gradient go through cuBLASLt instead, whose
   epilogues do that work inside the GEMM (the end of this file). */
#include "dt_cuda.cuh"
#include <cublasLt.h>
#include <cublas_v2.h>

#define DT_K__INT_MAX 2147483647LL

static int dt_k__blas(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + (int)s; }

/* One row-major GEMM (a batch of them when stride_c > 0 and batch > 1): C = alpha op(A) op(B) +
   beta C. lda / ldb: the row lengths of A and B as stored. */
static int dt_k__gemm(cublasHandle_t h, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const void *A, int64_t lda, int64_t sA, const void *B, int64_t ldb, int64_t sB, float beta,
                      void *C, int64_t ldc, int64_t sC, int64_t batch, int in_dtype, int tf32, int out_dtype) {
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    size_t esize = in_dtype == 1 ? 4 : 2;
    int64_t i;
    if (M == 0 || N == 0 || batch == 0) return 0;
    if (in_dtype == 1 && !tf32) {
        if (batch == 1)
            return dt_k__blas(cublasSgemm(h, opb, opa, (int)N, (int)M, (int)K, &alpha, (const float *)B,
                                          (int)(ldb ? ldb : 1), (const float *)A, (int)(lda ? lda : 1), &beta,
                                          (float *)C, (int)ldc));
        return dt_k__blas(cublasSgemmStridedBatched(h, opb, opa, (int)N, (int)M, (int)K, &alpha, (const float *)B,
                                                    (int)(ldb ? ldb : 1), (long long)sB, (const float *)A,
                                                    (int)(lda ? lda : 1), (long long)sA, &beta, (float *)C, (int)ldc,
                                                    (long long)sC, (int)batch));
    }
    {
        cudaDataType_t ty = in_dtype == 1 ? CUDA_R_32F : in_dtype == 2 ? CUDA_R_16BF : CUDA_R_16F;
        cublasComputeType_t ct = in_dtype == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        for (i = 0; i < batch; i++) {
            int st = dt_k__blas(cublasGemmEx(h, opb, opa, (int)N, (int)M, (int)K, &alpha,
                                             (const char *)B + (size_t)(i * sB) * esize, ty, (int)(ldb ? ldb : 1),
                                             (const char *)A + (size_t)(i * sA) * esize, ty, (int)(lda ? lda : 1),
                                             &beta, (char *)C + (size_t)(i * sC) * (out_dtype == 1 ? 4 : 2),
                                             out_dtype == 1 ? CUDA_R_32F : ty, (int)ldc, ct, CUBLAS_GEMM_DEFAULT));
            if (st) return st;
        }
    }
    return 0;
}

/* The handle's stream, set only when it differs: cublasSetStream also drops a workspace given
   by cublasSetWorkspace (cuBLAS then takes its own, a cudaMalloc nobody counts), and dt gives
   the handle its stream and workspace once, when it makes it. */
static int dt_k__stream(cublasHandle_t h, void *stream) {
    cudaStream_t cur = NULL;
    int st = dt_k__blas(cublasGetStream(h, &cur));
    if (st || cur == (cudaStream_t)stream) return st;
    return dt_k__blas(cublasSetStream(h, (cudaStream_t)stream));
}

static int dt_k__sizes_ok(int64_t batch, int64_t M, int64_t N, int64_t K) {
    return batch >= 0 && M >= 0 && N >= 0 && K >= 0 && M <= DT_K__INT_MAX && N <= DT_K__INT_MAX &&
           K <= DT_K__INT_MAX;
}

/* A batch's stride: not negative, and the last batch's offset (batch - 1) stride within int64. */
static int dt_k__stride_ok(int64_t batch, int64_t stride) {
    return stride >= 0 && (batch <= 1 || stride <= INT64_MAX / (batch - 1));
}

extern "C" int dt_k_matmul_fwd_t(void *cublas, void *out, int out_dtype, const void *a, const void *b, int in_dtype,
                                 int64_t batch, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                                 int64_t stride_a, int64_t stride_b, int64_t stride_out, float alpha, float beta,
                                 int tf32, void *stream) {
    cublasHandle_t h = (cublasHandle_t)cublas;
    int st;
    if (!h || !dt_k__sizes_ok(batch, M, N, K) || (in_dtype < 1 || in_dtype > 3) || (tf32 != 0 && tf32 != 1) ||
        (trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1) || (out_dtype != 1 && out_dtype != in_dtype))
        return (int)cudaErrorInvalidValue;
    /* cublasSgemmStridedBatched counts the batches in an int: a larger batch would run a
       truncated count and report success */
    if (batch > DT_K__INT_MAX || !dt_k__stride_ok(batch, stride_a) || !dt_k__stride_ok(batch, stride_b) ||
        !dt_k__stride_ok(batch, stride_out))
        return (int)cudaErrorInvalidValue;
    /* outputs of two batches that overlap would be written by both, in an order cuBLAS leaves open */
    if (batch > 1 && stride_out < M * N) return (int)cudaErrorInvalidValue;
    /* K == 0 reads neither a nor b (out = beta out) */
    if (M && N && batch && (!out || (K && (!a || !b)))) return (int)cudaErrorInvalidValue;
    if ((st = dt_k__stream(h, stream))) return st;
    if (M == 0 || N == 0 || batch == 0) return 0;
    /* K == 0: cuBLAS scales C by beta, as the CPU op does */
    return dt_k__gemm(h, trans_a, trans_b, M, N, K, alpha, a, trans_a ? M : K, stride_a, b, trans_b ? K : N,
                      stride_b, beta, out, N, stride_out, batch, in_dtype, tf32, out_dtype);
}

extern "C" int dt_k_matmul_fwd(void *cublas, float *out, const void *a, const void *b, int in_dtype, int64_t batch,
                               int64_t M, int64_t N, int64_t K, int trans_a, int trans_b, int64_t stride_a,
                               int64_t stride_b, int64_t stride_out, float alpha, float beta, int tf32,
                               void *stream) {
    return dt_k_matmul_fwd_t(cublas, out, 1, a, b, in_dtype, batch, M, N, K, trans_a, trans_b, stride_a, stride_b,
                             stride_out, alpha, beta, tf32, stream);
}

/* The CPU op's GEMMs: with Ao = op(A) [M,K], Bo = op(B) [K,N]: dAo = alpha dout Bo^T and
   dBo = alpha Ao^T dout; a transposed operand receives the transpose (one GEMM, flags flipped). */
extern "C" int dt_k_matmul_bwd(void *cublas, float *da, float *db, const float *dout, const float *a, const float *b,
                               int64_t batch, int64_t M, int64_t N, int64_t K, int trans_a, int trans_b,
                               int64_t stride_a, int64_t stride_b, float alpha, int tf32, void *stream) {
    cublasHandle_t h = (cublasHandle_t)cublas;
    int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N, i;
    int st;
    if (!h || !dt_k__sizes_ok(batch, M, N, K) || (tf32 != 0 && tf32 != 1) || (trans_a != 0 && trans_a != 1) ||
        (trans_b != 0 && trans_b != 1))
        return (int)cudaErrorInvalidValue;
    /* dout's batches are M N apart; stride 0 (a or b shared) sums the batches' gradients */
    if (!dt_k__stride_ok(batch, stride_a) || !dt_k__stride_ok(batch, stride_b) || !dt_k__stride_ok(batch, M * N))
        return (int)cudaErrorInvalidValue;
    /* an empty product adds nothing; any other reads dout, a and b (the CPU op takes all three) */
    if (batch && M && N && K && (da || db) && (!dout || !a || !b)) return (int)cudaErrorInvalidValue;
    if ((st = dt_k__stream(h, stream))) return st;
    if (!batch || !M || !N || !K) return 0;
    for (i = 0; i < batch; i++) {
        const float *A = a + i * stride_a, *B = b + i * stride_b, *D = dout + i * M * N;
        if (da) {
            float *dA = da + i * stride_a;
            st = !trans_a
                     ? dt_k__gemm(h, 0, !trans_b, M, K, N, alpha, D, N, 0, B, ldb, 0, 1.0f, dA, lda, 0, 1, 1, tf32, 1)
                     : dt_k__gemm(h, trans_b, 1, K, M, N, alpha, B, ldb, 0, D, N, 0, 1.0f, dA, lda, 0, 1, 1, tf32, 1);
            if (st) return st;
        }
        if (db) {
            float *dB = db + i * stride_b;
            st = !trans_b
                     ? dt_k__gemm(h, !trans_a, 0, K, N, M, alpha, A, lda, 0, D, N, 0, 1.0f, dB, ldb, 0, 1, 1, tf32, 1)
                     : dt_k__gemm(h, 1, trans_a, N, K, M, alpha, D, N, 0, A, lda, 0, 1.0f, dB, ldb, 0, 1, 1, tf32, 1);
            if (st) return st;
        }
    }
    return 0;
}

/* The grouped GEMM of count row-major problems C_i[M_i, N_i] = alpha op(A_i) op(B_i) + beta C_i
   (sizes per problem, host arrays; A, B, C device arrays of device pointers), one
   cublasSgemmGroupedBatched call with a group per problem (the operands swapped as above). */
#define DT_K__GROUPED_MAX 256
extern "C" int dt_k_gemm_grouped(void *cublas, int count, int trans_a, int trans_b, const int64_t *M, const int64_t *N,
                                 const int64_t *K, float alpha, float beta, const float *const *A,
                                 const float *const *B, float *const *C, void *stream) {
    cublasHandle_t h = (cublasHandle_t)cublas;
    cublasOperation_t oa[DT_K__GROUPED_MAX], ob[DT_K__GROUPED_MAX];
    int m[DT_K__GROUPED_MAX], n[DT_K__GROUPED_MAX], k[DT_K__GROUPED_MAX], lda[DT_K__GROUPED_MAX],
        ldb[DT_K__GROUPED_MAX], ldc[DT_K__GROUPED_MAX], gs[DT_K__GROUPED_MAX], i, st;
    float al[DT_K__GROUPED_MAX], be[DT_K__GROUPED_MAX];
    if (!h || count < 0 || count > DT_K__GROUPED_MAX || (trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1))
        return (int)cudaErrorInvalidValue;
    if (count && (!M || !N || !K || !A || !B || !C)) return (int)cudaErrorInvalidValue;
    for (i = 0; i < count; i++) {
        if (!dt_k__sizes_ok(1, M[i], N[i], K[i]) || M[i] < 1 || N[i] < 1) return (int)cudaErrorInvalidValue;
        oa[i] = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N; /* cuBLAS's A is our B (column-major C^T = B^T A^T) */
        ob[i] = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
        m[i] = (int)N[i];
        n[i] = (int)M[i];
        k[i] = (int)K[i];
        lda[i] = (int)(trans_b ? (K[i] ? K[i] : 1) : N[i]);
        ldb[i] = (int)(trans_a ? M[i] : (K[i] ? K[i] : 1));
        ldc[i] = (int)N[i];
        gs[i] = 1;
        al[i] = alpha;
        be[i] = beta;
    }
    if ((st = dt_k__stream(h, stream))) return st;
    if (!count) return 0;
    return dt_k__blas(cublasSgemmGroupedBatched(h, oa, ob, m, n, k, al, B, lda, A, ldb, be, C, ldc, count, gs));
}

/* ---------------------------------------------------------------- cuBLASLt: fused epilogues

   A separate pass over a [N, Out] output for the bias, another for the GELU and another over dout
   for the bias gradient each move as many bytes as the GEMM writes; cuBLASLt's epilogues do them
   while the tile is in registers (as llm.c's matmul_cublaslt). One row-major GEMM C[M,N] =
   op(A) op(B) is cuBLASLt's column-major C^T = op(B)^T op(A)^T, as above: the bias (length = D's
   rows) runs along our columns, the GELU's input (aux) is laid out as C, and BGRADB (the sums of
   cuBLAS's op(B) over k, length = D's columns) is the sums of our op(A)'s rows over K.
   Descriptors are made and destroyed per call (host memory only; no device allocation). */

extern "C" int dt_k_lt_create(void **lt) {
    cublasLtHandle_t h = NULL;
    int st;
    if (!lt) return (int)cudaErrorInvalidValue;
    st = dt_k__blas(cublasLtCreate(&h));
    *lt = st ? NULL : (void *)h;
    return st;
}

extern "C" int dt_k_lt_destroy(void *lt) { return lt ? dt_k__blas(cublasLtDestroy((cublasLtHandle_t)lt)) : 0; }

/* The largest power of two (at most 256, cuBLASLt's default promise) dividing an address: what
   the heuristic may assume of it. A view into a tensor can start anywhere. */
static uint32_t dt_k__align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}

struct dt_k__lt_gemm {
    int ta, tb;                 /* row-major: C[M,N] (ld ldc) = op(A)[M,K] op(B)[K,N] + beta C */
    int64_t M, N, K, lda, ldb, ldc;
    const void *A, *B;
    void *C;
    float beta;
    int c_dtype;                /* C's (and D's, bias's, aux's): 1 f32, else in_dtype */
    uint32_t epilogue;          /* CUBLASLT_EPILOGUE_* */
    void *bias;                 /* BIAS: [N] read; BGRADB: [M] written */
    void *aux;                 /* GELU_AUX: [M,N] ld ldc written */
};

static int dt_k__lt_run(cublasLtHandle_t h, const dt_k__lt_gemm *g, int in_dtype, int tf32, void *ws, size_t ws_bytes,
                        cudaStream_t stream) {
    cudaDataType_t ty = in_dtype == 1 ? CUDA_R_32F : in_dtype == 2 ? CUDA_R_16BF : CUDA_R_16F;
    cudaDataType_t tc = g->c_dtype == 1 ? CUDA_R_32F : ty;
    cublasComputeType_t ct = in_dtype == 1 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    /* cuBLAS's A is our B, its B our A; each layout is the matrix as stored, before its op */
    int32_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint64_t ws64 = ws ? ws_bytes : 0;
    uint32_t al[4] = {dt_k__align_of(g->B), dt_k__align_of(g->A), dt_k__align_of(g->C), dt_k__align_of(g->C)};
    float alpha = 1.0f, beta = g->beta;
    int64_t aux_ld = g->ldc;
    cublasLtMatmulDesc_t d = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0, st, i;
    st = dt_k__blas(cublasLtMatmulDescCreate(&d, ct, CUDA_R_32F));
    if (!st) st = dt_k__blas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    if (!st) st = dt_k__blas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (!st) st = dt_k__blas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &g->epilogue,
                                                            sizeof g->epilogue));
    if (!st && g->bias)
        st = dt_k__blas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias));
    if (!st && g->aux) {
        st = dt_k__blas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux,
                                                       sizeof g->aux));
        if (!st)
            st = dt_k__blas(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                           sizeof aux_ld));
    }
    if (!st) st = dt_k__blas(cublasLtMatrixLayoutCreate(&la, ty, (uint64_t)(g->tb ? g->K : g->N),
                                                        (uint64_t)(g->tb ? g->N : g->K), g->ldb));
    if (!st) st = dt_k__blas(cublasLtMatrixLayoutCreate(&lb, ty, (uint64_t)(g->ta ? g->M : g->K),
                                                        (uint64_t)(g->ta ? g->K : g->M), g->lda));
    if (!st) st = dt_k__blas(cublasLtMatrixLayoutCreate(&lc, tc, (uint64_t)g->N, (uint64_t)g->M, g->ldc));
    if (!st) st = dt_k__blas(cublasLtMatmulPreferenceCreate(&pref));
    if (!st) st = dt_k__blas(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws64,
                                                                  sizeof ws64));
    for (i = 0; i < 4 && !st; i++)
        st = dt_k__blas(cublasLtMatmulPreferenceSetAttribute(
            pref, (cublasLtMatmulPreferenceAttributes_t)(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i), &al[i],
            sizeof al[i]));
    /* the heuristic's "no" (CUBLAS_STATUS_NOT_SUPPORTED, or no result) is the caller's fallback:
       nothing has run yet, and which problems it takes differs between versions and GPUs; any
       other status is an error of ours, reported (so is cublasLtMatmul's own NOT_SUPPORTED, which
       also comes back as DT_K_NO_ALGO: nothing ran then either) */
    if (!st) {
        st = dt_k__blas(cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, lc, pref, 1, &res, &n_res));
        if (!st && n_res < 1) st = DT_K_NO_ALGO;
    }
    if (!st)
        st = dt_k__blas(cublasLtMatmul(h, d, &alpha, g->B, la, g->A, lb, &beta, g->C, lc, g->C, lc, &res.algo, ws,
                                       ws64, stream));
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (d) cublasLtMatmulDescDestroy(d);
    return st;
}

/* The bias and aux vectors: the heuristic reads their alignment from the pointers, but llm.c and
   others found misaligned ones failing on A100/H100 all the same; dt's views can start anywhere,
   so a vector not on 16 bytes takes the separate ops (NULL: none asked for). */
static int dt_k__lt_aligned(const void *p) { return !p || (uintptr_t)p % 16 == 0; }

static int dt_k__lt_args(void *lt, int in_dtype, int64_t N, int64_t Out, int64_t In, int tf32) {
    return lt && dt_k__sizes_ok(1, N, Out, In) && in_dtype >= 1 && in_dtype <= 3 && (tf32 == 0 || tf32 == 1);
}

extern "C" int dt_k_linear_lt_fwd(void *lt, void *out, void *pre, const void *x, const void *w, const void *bias,
                                  int in_dtype, int out_dtype, int64_t N, int64_t Out, int64_t In, int tf32, void *workspace,
                                  size_t workspace_bytes, void *stream) {
    dt_k__lt_gemm g;
    if (!dt_k__lt_args(lt, in_dtype, N, Out, In, tf32) || !out || !x || !w || (out_dtype != 1 && out_dtype != in_dtype))
        return (int)cudaErrorInvalidValue;
    if (N == 0 || Out == 0) return 0;
    if (In == 0) return DT_K_NO_ALGO; /* out = bias: the unfused ops say so more plainly than a k = 0 GEMM */
    if (pre && Out % 8) return DT_K_NO_ALGO; /* the GELU's input: "ld must be divisible by 8" (cuBLASLt) */
    if (!dt_k__lt_aligned(bias) || !dt_k__lt_aligned(pre)) return DT_K_NO_ALGO;
    g.ta = 0; g.tb = 1; g.M = N; g.N = Out; g.K = In; g.lda = In; g.ldb = In; g.ldc = Out;
    g.A = x; g.B = w; g.C = out; g.beta = 0.0f; g.c_dtype = out_dtype;
    g.bias = (void *)bias;
    g.aux = pre;
    g.epilogue = pre ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                     : (bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    return dt_k__lt_run((cublasLtHandle_t)lt, &g, in_dtype, tf32, workspace, workspace_bytes, (cudaStream_t)stream);
}

extern "C" int dt_k_linear_lt_dw(void *lt, float *dw, float *dbias, const void *dout, const void *x, int in_dtype,
                                 int64_t N, int64_t Out, int64_t In, int tf32, void *workspace, size_t workspace_bytes,
                                 void *stream) {
    dt_k__lt_gemm g;
    if (!dt_k__lt_args(lt, in_dtype, N, Out, In, tf32) || !dw || !dbias || !dout || !x)
        return (int)cudaErrorInvalidValue;
    if (Out == 0) return 0;
    /* N = 0: nothing to add to dw, dbias 0; In = 0: no dw, dbias still dout's sums: not GEMMs */
    if (N == 0 || In == 0 || !dt_k__lt_aligned(dbias)) return DT_K_NO_ALGO;
    /* dw[Out,In] += dout^T x: op(A) = dout^T (A stored [N,Out]), B = x; BGRADB sums op(A)'s rows */
    g.ta = 1; g.tb = 0; g.M = Out; g.N = In; g.K = N; g.lda = Out; g.ldb = In; g.ldc = In;
    g.A = dout; g.B = x; g.C = dw; g.beta = 1.0f; g.c_dtype = 1;
    g.bias = dbias;
    g.aux = NULL;
    g.epilogue = CUBLASLT_EPILOGUE_BGRADB;
    return dt_k__lt_run((cublasLtHandle_t)lt, &g, in_dtype, tf32, workspace, workspace_bytes, (cudaStream_t)stream);
}
