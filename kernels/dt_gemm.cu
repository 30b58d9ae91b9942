/* kernels/dt_gemm.cu - dt_matmul_fwd / _bwd through cuBLAS (row-major, as dt_tensor.h).

   cuBLAS is column-major. A row-major [M,N] matrix read column-major is its transpose, so the
   row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T: swap the operands (and M
   with N), keep each operand's own transpose flag. No data moves.
   f32: cublasSgemm(StridedBatched); TF32 and bf16 / f16 inputs: cublasGemmEx (f32 output, f32
   accumulation), one call per batch (the contract's cuBLAS subset has no batched GemmEx). */
#include "dt_cuda.cuh"
#include <cublas_v2.h>

#define DT_K__INT_MAX 2147483647LL

static int dt_k__blas(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + (int)s; }

/* One row-major GEMM (a batch of them when stride_c > 0 and batch > 1): C = alpha op(A) op(B) +
   beta C. lda / ldb: the row lengths of A and B as stored. */
static int dt_k__gemm(cublasHandle_t h, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const void *A, int64_t lda, int64_t sA, const void *B, int64_t ldb, int64_t sB, float beta,
                      float *C, int64_t ldc, int64_t sC, int64_t batch, int in_dtype, int tf32) {
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    size_t esize = in_dtype == 1 ? 4 : 2;
    int64_t i;
    if (M == 0 || N == 0 || batch == 0) return 0;
    if (in_dtype == 1 && !tf32) {
        if (batch == 1)
            return dt_k__blas(cublasSgemm(h, opb, opa, (int)N, (int)M, (int)K, &alpha, (const float *)B,
                                          (int)(ldb ? ldb : 1), (const float *)A, (int)(lda ? lda : 1), &beta, C,
                                          (int)ldc));
        return dt_k__blas(cublasSgemmStridedBatched(h, opb, opa, (int)N, (int)M, (int)K, &alpha, (const float *)B,
                                                    (int)(ldb ? ldb : 1), (long long)sB, (const float *)A,
                                                    (int)(lda ? lda : 1), (long long)sA, &beta, C, (int)ldc,
                                                    (long long)sC, (int)batch));
    }
    {
        cudaDataType_t ty = in_dtype == 1 ? CUDA_R_32F : in_dtype == 2 ? CUDA_R_16BF : CUDA_R_16F;
        cublasComputeType_t ct = in_dtype == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        for (i = 0; i < batch; i++) {
            int st = dt_k__blas(cublasGemmEx(h, opb, opa, (int)N, (int)M, (int)K, &alpha,
                                             (const char *)B + (size_t)(i * sB) * esize, ty, (int)(ldb ? ldb : 1),
                                             (const char *)A + (size_t)(i * sA) * esize, ty, (int)(lda ? lda : 1),
                                             &beta, C + i * sC, CUDA_R_32F, (int)ldc, ct, CUBLAS_GEMM_DEFAULT));
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

extern "C" int dt_k_matmul_fwd(void *cublas, float *out, const void *a, const void *b, int in_dtype, int64_t batch,
                               int64_t M, int64_t N, int64_t K, int trans_a, int trans_b, int64_t stride_a,
                               int64_t stride_b, int64_t stride_out, float alpha, float beta, int tf32,
                               void *stream) {
    cublasHandle_t h = (cublasHandle_t)cublas;
    int st;
    if (!h || !dt_k__sizes_ok(batch, M, N, K) || (in_dtype < 1 || in_dtype > 3) || (tf32 != 0 && tf32 != 1) ||
        (trans_a != 0 && trans_a != 1) || (trans_b != 0 && trans_b != 1))
        return (int)cudaErrorInvalidValue;
    if ((st = dt_k__stream(h, stream))) return st;
    if (M == 0 || N == 0 || batch == 0) return 0;
    /* K == 0: cuBLAS scales C by beta, as the CPU op does */
    return dt_k__gemm(h, trans_a, trans_b, M, N, K, alpha, a, trans_a ? M : K, stride_a, b, trans_b ? K : N,
                      stride_b, beta, out, N, stride_out, batch, in_dtype, tf32);
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
    if ((st = dt_k__stream(h, stream))) return st;
    for (i = 0; i < batch; i++) {
        const float *A = a + i * stride_a, *B = b + i * stride_b, *D = dout + i * M * N;
        if (da) {
            float *dA = da + i * stride_a;
            st = !trans_a ? dt_k__gemm(h, 0, !trans_b, M, K, N, alpha, D, N, 0, B, ldb, 0, 1.0f, dA, lda, 0, 1, 1, tf32)
                          : dt_k__gemm(h, trans_b, 1, K, M, N, alpha, B, ldb, 0, D, N, 0, 1.0f, dA, lda, 0, 1, 1, tf32);
            if (st) return st;
        }
        if (db) {
            float *dB = db + i * stride_b;
            st = !trans_b ? dt_k__gemm(h, !trans_a, 0, K, N, M, alpha, A, lda, 0, D, N, 0, 1.0f, dB, ldb, 0, 1, 1, tf32)
                          : dt_k__gemm(h, 1, trans_a, N, K, M, alpha, D, N, 0, A, lda, 0, 1.0f, dB, ldb, 0, 1, 1, tf32);
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
