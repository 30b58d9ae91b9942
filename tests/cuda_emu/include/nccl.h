/* tests/cuda_emu/include/nccl.h - the CUDA emulator's stand-in for <nccl.h>: NCCL over MPI on the
   emulator's device memory (host memory). Test-only, like the fake <cuda_runtime.h> beside it;
   the implementation and what it does and does not do: tests/cuda_emu/nccl_emu.cpp.
   The names, types and values are NCCL's (2.28), for the calls dt_comm.h makes and a few more. */
#ifndef DT_CUDA_EMU_NCCL_H
#define DT_CUDA_EMU_NCCL_H

#include <stddef.h>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 22800

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

typedef enum { ncclSuccess = 0,
               ncclUnhandledCudaError = 1,
               ncclSystemError = 2,
               ncclInternalError = 3,
               ncclInvalidArgument = 4,
               ncclInvalidUsage = 5,
               ncclRemoteError = 6,
               ncclInProgress = 7,
               ncclNumResults = 8 } ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum { ncclInt8 = 0, ncclChar = 0,
               ncclUint8 = 1,
               ncclInt32 = 2, ncclInt = 2,
               ncclUint32 = 3,
               ncclInt64 = 4,
               ncclUint64 = 5,
               ncclFloat16 = 6, ncclHalf = 6,
               ncclFloat32 = 7, ncclFloat = 7,
               ncclFloat64 = 8, ncclDouble = 8,
               ncclBfloat16 = 9,
               ncclFloat8e4m3 = 10,
               ncclFloat8e5m2 = 11,
               ncclNumTypes = 12 } ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

/* ---------------------------------------------------------------- fake controls (tests) */

/* The next call of the NCCL function named `call` ("ncclAllReduce", "ncclCommInitRank", ...)
   fails at once with `result` (its message in ncclGetLastError says it was injected). */
void dt_emu_nccl_fail_next(const char *call, ncclResult_t result);
/* The next operation to run on a stream never completes and makes its communicator's async error
   `result` (what a lost peer or a network error looks like): cudaEventQuery stays
   cudaErrorNotReady, ncclCommGetAsyncError returns it; ncclCommAbort releases the stream. */
void dt_emu_nccl_fail_async(ncclResult_t result);
/* How many times `call` was entered (any result) since the process started. */
int dt_emu_nccl_calls(const char *call);

#endif /* DT_CUDA_EMU_NCCL_H */
