/* tests/cuda_emu/include/cublasLt.h - the CUDA emulator's stand-in for <cublasLt.h>: the cuBLASLt
   calls THE KERNEL CONTRACT allows (kernels/dt_gemm.cu's fused-epilogue GEMMs), with the real
   header's names, values and signatures, run through CBLAS in f32 on the host
   (tests/cuda_emu/cuda_emu.cpp, "cuBLASLt").

   What runs: one matmul D = epilogue(alpha op(A) op(B) + beta C), column-major, host pointer mode,
   no batches; A and B of one type (f32, bf16 or f16; widened to f32, TF32-rounded under
   CUBLAS_COMPUTE_32F_FAST_TF32), C and D f32 or bf16 (rounded to nearest even once, at the end),
   f32 accumulation. Epilogues: DEFAULT, BIAS, GELU(_AUX)(_BIAS) (bias first, then GELU's tanh
   form in f32; _AUX also writes the GELU's input) and BGRADB (the bias gradient: the sums of
   op(B)'s columns over k, in k order). Anything else is CUBLAS_STATUS_NOT_SUPPORTED with a report.
   The heuristic, as the real one, returns no algorithm (CUBLAS_STATUS_NOT_SUPPORTED) where the
   GELU's aux leading dimension is not a multiple of 8, and for the epilogues a test refuses
   (dt_emu_lt_refuse), so a caller's fallback paths run here too; shapes that disagree are
   CUBLAS_STATUS_INVALID_VALUE (a caller's bug), with a report;
   cublasLtMatmul checks that A, B, C, D lie in their allocations and are as aligned as the
   preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES promised the heuristic (default 256,
   as cuBLASLt's), and that bias, aux and workspace lie in device memory.
   What it cannot see: the sum order of a real algorithm and its GELU's own rounding (compare with
   a tolerance); which algorithm the heuristic would pick; speed. */
#ifndef DT_CUDA_EMU_CUBLASLT_H
#define DT_CUDA_EMU_CUBLASLT_H

#include "cublas_v2.h"

typedef struct dt_emu_lt *cublasLtHandle_t;
typedef struct dt_emu_lt_desc *cublasLtMatmulDesc_t;
typedef struct dt_emu_lt_layout *cublasLtMatrixLayout_t;
typedef struct dt_emu_lt_pref *cublasLtMatmulPreference_t;

typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,                 /* int32_t (cublasOperation_t) */
    CUBLASLT_MATMUL_DESC_TRANSB = 4,                 /* int32_t */
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,               /* uint32_t (cublasLtEpilogue_t) */
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,           /* void * */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,  /* void * */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,       /* int64_t */
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22, /* int32_t (cudaDataType), default -1: D's */
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26         /* int32_t (cudaDataType), default -1: D's */
} cublasLtMatmulDescAttributes_t;

typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_AUX = 32 | 128,
    CUBLASLT_EPILOGUE_GELU_BIAS = 32 | 4,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 32 | 128 | 4,
    CUBLASLT_EPILOGUE_DGELU = 64 | 128,
    CUBLASLT_EPILOGUE_BGRADA = 256,
    CUBLASLT_EPILOGUE_BGRADB = 512
} cublasLtEpilogue_t;

typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,  /* uint64_t, default 0 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5, /* uint32_t, default 256 */
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sizeInBytes);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                              const void *A, cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSizeInBytes, cudaStream_t stream);

/* Test hook: how many cublasLtMatmul calls ran each epilogue since the process started
   (index: DEFAULT 0, BIAS 1, GELU_AUX_BIAS 2, GELU_AUX 3, BGRADB 4, other 5), and how many
   heuristic queries found no algorithm (index 6). */
long dt_emu_lt_count(int index);
/* Test hook: from now on the heuristic finds no algorithm for the epilogues whose count index
   (above, 0..4) is set in mask, as a GPU may (0: the default, every one has an algorithm). */
void dt_emu_lt_refuse(unsigned mask);

#endif /* DT_CUDA_EMU_CUBLASLT_H */
