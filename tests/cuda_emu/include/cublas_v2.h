/* tests/cuda_emu/include/cublas_v2.h - the CUDA emulator's stand-in for <cublas_v2.h>: the cuBLAS
   calls THE KERNEL CONTRACT allows, run through CBLAS (OpenBLAS) on the host. Column-major, host
   pointer mode (alpha and beta are host pointers), as cuBLAS's default. Matrices must lie in
   memory from cudaMalloc, inside their allocation: anything else is CUBLAS_STATUS_INVALID_VALUE
   with a report (see tests/cuda_emu/cuda_emu.cpp). bf16/f16 inputs are widened to f32;
   CUBLAS_COMPUTE_32F_FAST_TF32 rounds the f32 inputs to TF32 (10 mantissa bits) first, so a
   TF32 path shows TF32-sized errors. The emulator does not reproduce a tensor core's sum order. */
#ifndef DT_CUDA_EMU_CUBLAS_V2_H
#define DT_CUDA_EMU_CUBLAS_V2_H

#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;

typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;

typedef enum {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77
} cublasComputeType_t;

typedef enum { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 } cublasGemmAlgo_t;

typedef struct dt_emu_cublas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);
cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream);
/* A workspace from cudaMalloc (inside one allocation) for the handle's GEMMs; as cuBLAS does,
   cublasSetStream drops it again (back to the library's own pool). */
cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes);
/* Test hook: the workspace the handle holds now (NULL, 0 = cuBLAS's own pool). */
cublasStatus_t dt_emu_cublas_workspace(cublasHandle_t handle, void **workspace, size_t *bytes);
cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                         int m, int n, int k, const float *alpha, const float *A, int lda,
                                         long long strideA, const float *B, int ldb, long long strideB,
                                         const float *beta, float *C, int ldc, long long strideC, int batchCount);
/* cuBLAS 12.5's grouped GEMM: group g's group_size[g] problems share its ops, sizes, lds and scalars
   (host arrays); Aarray, Barray, Carray are device arrays of device pointers, one per problem. */
cublasStatus_t cublasSgemmGroupedBatched(cublasHandle_t handle, const cublasOperation_t transa_array[],
                                         const cublasOperation_t transb_array[], const int m_array[],
                                         const int n_array[], const int k_array[], const float alpha_array[],
                                         const float *const Aarray[], const int lda_array[],
                                         const float *const Barray[], const int ldb_array[],
                                         const float beta_array[], float *const Carray[], const int ldc_array[],
                                         int group_count, const int group_size[]);
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo);
/* batchCount cublasGemmEx problems, problem i's matrices at A + i strideA, B + i strideB,
   C + i strideC (strides in elements of each matrix's type). */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo);

#endif /* DT_CUDA_EMU_CUBLAS_V2_H */
