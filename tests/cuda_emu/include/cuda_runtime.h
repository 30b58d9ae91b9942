/* tests/cuda_emu/include/cuda_runtime.h - the CUDA emulator's stand-in for <cuda_runtime.h>.
   Test-only: it lets the kernels/ .cu files compile with g++ (-x c++ -Itests/cuda_emu/include) and run on
   the host. How the emulation works, its modes and what it cannot see: the top comment of
   tests/cuda_emu/cuda_emu.cpp. This header provides the subset of CUDA that kernels/dt_cuda.cuh
   allows (THE KERNEL CONTRACT); anything else fails to compile, which is the point.

   Device code: __global__/__device__/__host__ vanish; __shared__ becomes a static placed in the
   section "dt_emu_shared" (so the emulator can poison every shared array with NaN at each block
   start); threadIdx and friends are per-thread variables; __syncthreads, warp operations and
   atomics call the emulator, recording __FILE__/__LINE__ for its reports. */
#ifndef DT_CUDA_EMU_RUNTIME_H
#define DT_CUDA_EMU_RUNTIME_H

#define DT_CUDA_EMU 1

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifndef __cplusplus
#error "the CUDA emulator compiles .cu files as C++ (g++ -x c++)"
#endif

#include <functional>

/* ---------------------------------------------------------------- qualifiers */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* One static copy per kernel body is enough: blocks run one at a time. The section lets the
   emulator find (and poison) every __shared__ array of the program at once. */
#define __shared__ __attribute__((section("dt_emu_shared"))) static

/* ---------------------------------------------------------------- vector types, indices */

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) uint2 { unsigned int x, y; };
struct __align__(16) uint4 { unsigned int x, y, z, w; };
static inline float2 make_float2(float x, float y) { float2 v = {x, y}; return v; }
static inline float4 make_float4(float x, float y, float z, float w) { float4 v = {x, y, z, w}; return v; }
static inline int2 make_int2(int x, int y) { int2 v = {x, y}; return v; }
static inline int4 make_int4(int x, int y, int z, int w) { int4 v = {x, y, z, w}; return v; }
static inline uint2 make_uint2(unsigned int x, unsigned int y) { uint2 v = {x, y}; return v; }
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
    uint4 v = {x, y, z, w};
    return v;
}

/* Each emulated CUDA thread is a host thread: its indices live in thread-local storage. */
extern thread_local uint3 dt_emu_threadIdx, dt_emu_blockIdx;
extern thread_local dim3 dt_emu_blockDim, dt_emu_gridDim;
#define threadIdx dt_emu_threadIdx
#define blockIdx dt_emu_blockIdx
#define blockDim dt_emu_blockDim
#define gridDim dt_emu_gridDim
static const int warpSize = 32;

/* ---------------------------------------------------------------- errors, streams, events */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorMisalignedAddress = 716,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

typedef struct dt_emu_stream *cudaStream_t;
typedef struct dt_emu_event *cudaEvent_t;
#define cudaStreamDefault 0x0u
#define cudaStreamNonBlocking 0x1u
#define cudaEventDefault 0x0u
#define cudaEventDisableTiming 0x2u

/* Host API. Work on a stream runs in stream order, at once by default (see "streams and events"
   in cuda_emu.cpp for DT_EMU_STREAMS=deferred); the copies and memsets check their ranges against the
   allocation registry (a bad one is an error status and a report on stderr, with the caller's
   __FILE__:__LINE__ through the macros below). */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
/* The attributes dt asks for; the emulated devices say compute capability 8.0 (not Hopper). */
typedef enum cudaDeviceAttr {
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76
} cudaDeviceAttr;
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
/* The device's memory: DT_EMU_DEVICE_BYTES (default 16 GiB) in all, less what cudaMalloc holds now
   (every emulated device shares the one registry) */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t dt_emu_malloc(const char *file, int line, void **ptr, size_t bytes);
cudaError_t dt_emu_free(const char *file, int line, void *ptr);
cudaError_t dt_emu_memcpy_blocking(const char *file, int line, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t dt_emu_memcpy(const char *file, int line, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                          cudaStream_t stream);
cudaError_t dt_emu_memset(const char *file, int line, void *dst, int value, size_t bytes, cudaStream_t stream);
#define cudaMalloc(ptr, bytes) dt_emu_malloc(__FILE__, __LINE__, (void **)(ptr), (bytes))
#define cudaFree(ptr) dt_emu_free(__FILE__, __LINE__, (void *)(ptr))
/* Pinned host memory, mapped for kernels (the device pointer is the host pointer). */
#define cudaHostAllocDefault 0x0u
#define cudaHostAllocPortable 0x1u
#define cudaHostAllocMapped 0x2u
cudaError_t dt_emu_host_alloc(const char *file, int line, void **ptr, size_t bytes, unsigned int flags);
cudaError_t dt_emu_free_host(const char *file, int line, void *ptr);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags);
#define cudaHostAlloc(ptr, bytes, flags) dt_emu_host_alloc(__FILE__, __LINE__, (void **)(ptr), (bytes), (flags))
#define cudaMallocHost(ptr, bytes) dt_emu_host_alloc(__FILE__, __LINE__, (void **)(ptr), (bytes), 0u)
#define cudaFreeHost(ptr) dt_emu_free_host(__FILE__, __LINE__, (void *)(ptr))
/* cudaMemcpy to or from the host waits for the device, as on a GPU: counted as a sync */
#define cudaMemcpy(dst, src, bytes, kind) dt_emu_memcpy_blocking(__FILE__, __LINE__, (dst), (src), (bytes), (kind))
#define cudaMemcpyAsync(dst, src, bytes, kind, ...) \
    dt_emu_memcpy(__FILE__, __LINE__, (dst), (src), (bytes), (kind), dt_emu_stream_arg(__VA_ARGS__))
#define cudaMemset(dst, value, bytes) dt_emu_memset(__FILE__, __LINE__, (dst), (value), (bytes), 0)
#define cudaMemsetAsync(dst, value, bytes, ...) \
    dt_emu_memset(__FILE__, __LINE__, (dst), (value), (bytes), dt_emu_stream_arg(__VA_ARGS__))
static inline cudaStream_t dt_emu_stream_arg(void) { return 0; }
static inline cudaStream_t dt_emu_stream_arg(cudaStream_t s) { return s; }
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

/* ---------------------------------------------------------------- launching */

/* What DT_K_LAUNCH expands to (kernels/dt_cuda.cuh): runs body once per CUDA thread of every
   block of grid, blocks one at a time. Sets the last error (and returns it) on a bad
   configuration or when the emulator reports a bug in the kernel. */
cudaError_t dt_emu_launch(const char *kernel, const char *file, int line, dim3 grid, dim3 block,
                          size_t shmem_bytes, cudaStream_t stream, const std::function<void()> &body);
/* The block's dynamic shared memory (DT_K_SHARED_DYNAMIC), poisoned with NaN at each block start. */
void *dt_emu_dynamic_shared(void);
/* A vector access of `bytes` bytes at p (dt_k_load_vec / dt_k_store_vec in kernels/dt_cuda.cuh):
   a GPU faults unless p is `bytes`-aligned, so a misaligned one is reported and fails the launch
   with cudaErrorMisalignedAddress, as it would on a GPU. */
void dt_emu_vector_access(const void *p, size_t bytes, int store);
/* How many vector accesses the kernels made so far (a test sees which path a launcher took). */
long long dt_emu_vector_accesses(void);
/* An instruction that reads only shared memory (ldmatrix, kernels/dt_mma.cuh) reading `bytes`
   bytes at p, which must be `bytes`-aligned: one lies in a __shared__ array or the block's dynamic
   shared memory, else it is reported and fails the launch (cudaErrorIllegalAddress; a misaligned
   one cudaErrorMisalignedAddress), as a GPU faults. Returns 1 when p is fine to read.
   dt_emu_is_shared only asks (no report). */
int dt_emu_shared_access(const char *file, int line, const char *what, const void *p, size_t bytes);
int dt_emu_is_shared(const void *p, size_t bytes);
/* cp.async (kernels/dt_mma.cuh's dt_mma_cp_async16 and friends): `bytes` bytes from global memory
   at src to shared memory at dst, as sm_80's cp.async.cg. On a GPU the bytes land at some time
   between the issue and the issuing thread's wait; the emulator fills dst with NaN at the issue
   and makes the copy (reads src, writes dst) only at that wait, so a read of dst in between, by
   any thread (a missing barrier before the issue or after the wait), sees NaN. dst must lie in
   shared memory, dst and src on
   `bytes` boundaries (else reported, as ldmatrix's rows). commit closes the thread's open group;
   wait(n) makes the copies of every group committed before the newest n. A thread that ends with
   copies it never waited for is reported. */
void dt_emu_cp_async(const char *file, int line, void *dst, const void *src, size_t bytes);
void dt_emu_cp_async_commit(void);
void dt_emu_cp_async_wait(int n);

/* ---------------------------------------------------------------- barriers and warp operations */

enum dt_emu_warp_op { DT_EMU_SYNCWARP, DT_EMU_SHFL, DT_EMU_SHFL_XOR, DT_EMU_SHFL_DOWN, DT_EMU_SHFL_UP,
                      DT_EMU_BALLOT, DT_EMU_ALL, DT_EMU_ANY, DT_EMU_GATHER };
void dt_emu_syncthreads(const char *file, int line);
/* One warp operation: a barrier of the lanes named in mask; returns this lane's result (the
   payload of its source lane, or the vote). value: the lane's payload (up to 8 bytes). */
uint64_t dt_emu_warp(const char *file, int line, int op, unsigned int mask, uint64_t value, int arg, int width);

/* A warp-collective exchange of more than a shuffle's 8 bytes (the emulated mma of
   kernels/dt_mma.cuh): every lane named in mask passes `bytes` bytes at mine and receives all
   32 lanes' payloads, lane j's at all + j * bytes (a lane not named, or absent, gives 0xff
   bytes: NaN). One barrier, checked as the other warp operations are; what names the operation
   in reports (a string literal). */
void dt_emu_warp_gather(const char *file, int line, const char *what, unsigned int mask, const void *mine, void *all,
                        size_t bytes);

template <typename T> static inline uint64_t dt_emu_pack(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffles of more than 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename T> static inline T dt_emu_unpack(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}
template <typename T>
static inline T dt_emu_shfl(const char *f, int l, int op, unsigned int mask, T v, int arg, int width = 32) {
    return dt_emu_unpack<T>(dt_emu_warp(f, l, op, mask, dt_emu_pack(v), arg, width));
}
#define __syncthreads() dt_emu_syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) (void)dt_emu_warp(__FILE__, __LINE__, DT_EMU_SYNCWARP, dt_emu_mask_arg(__VA_ARGS__), 0, 0, 32)
static inline unsigned int dt_emu_mask_arg(void) { return 0xffffffffu; }
static inline unsigned int dt_emu_mask_arg(unsigned int m) { return m; }
#define __shfl_sync(mask, ...) dt_emu_shfl(__FILE__, __LINE__, DT_EMU_SHFL, (mask), __VA_ARGS__)
#define __shfl_xor_sync(mask, ...) dt_emu_shfl(__FILE__, __LINE__, DT_EMU_SHFL_XOR, (mask), __VA_ARGS__)
#define __shfl_down_sync(mask, ...) dt_emu_shfl(__FILE__, __LINE__, DT_EMU_SHFL_DOWN, (mask), __VA_ARGS__)
#define __shfl_up_sync(mask, ...) dt_emu_shfl(__FILE__, __LINE__, DT_EMU_SHFL_UP, (mask), __VA_ARGS__)
#define __ballot_sync(mask, pred) \
    ((unsigned int)dt_emu_warp(__FILE__, __LINE__, DT_EMU_BALLOT, (mask), (pred) ? 1u : 0u, 0, 32))
#define __all_sync(mask, pred) ((int)dt_emu_warp(__FILE__, __LINE__, DT_EMU_ALL, (mask), (pred) ? 1u : 0u, 0, 32))
#define __any_sync(mask, pred) ((int)dt_emu_warp(__FILE__, __LINE__, DT_EMU_ANY, (mask), (pred) ? 1u : 0u, 0, 32))

/* ---------------------------------------------------------------- atomics (relaxed, as on a GPU) */

static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned int atomicAdd(unsigned int *p, unsigned int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline float atomicAdd(float *p, float v) {
    float old, next;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do next = old + v;
    while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
static inline int atomicMax(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
static inline int atomicMin(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    return old;
}
static inline int atomicCAS(int *p, int expected, int desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected; /* the old value, whether or not it was swapped */
}
static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long expected, unsigned long long desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return expected;
}
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }

/* ---------------------------------------------------------------- math and bits */

/* The fast intrinsics are the precise host functions: the emulator checks logic, not ulps.
   (__expf and __logf are glibc's own, declared by <math.h>: expf and logf.) */
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }

/* ---------------------------------------------------------------- emulator controls (tests) */

/* The mode this process runs kernels in (DT_EMU_MODE: "parallel", "forward", "reverse",
   "random:SEED"); and the emulator's reports: how many so far, the text of the last one. */
const char *dt_emu_mode(void);
/* Switches the thread order of the launches that follow (a mode name as DT_EMU_MODE; the
   random:SEED order restarts from its seed): 0, or -1 for a name that is not a mode (nothing
   changes). For tests that compare one kernel's bits across orders inside one process. */
int dt_emu_set_mode(const char *mode);
int dt_emu_report_count(void);
/* What the program asked of the "device" so far, counted by the runtime itself (what dt's own
   ctx->counters must agree with): host waits (stream, device and event synchronisations),
   cudaMalloc / cudaFree, and copies by direction (bytes and calls). */
typedef struct dt_emu_counters {
    long long syncs, allocs, frees, h2d_bytes, h2d_calls, d2h_bytes, d2h_calls;
} dt_emu_counters;
void dt_emu_get_counters(dt_emu_counters *c);
const char *dt_emu_last_report(void);
/* Out of memory on purpose: dt_emu_fail_alloc(n) makes the n-th allocation from now (cudaMalloc
   or pinned host memory of a byte or more; 1: the next) fail with cudaErrorMemoryAllocation, as a
   full GPU's does; 0 turns it off (DT_EMU_FAIL_ALLOC=N sets it at the start, counting from the
   first). dt_emu_allocations: how many of those were asked for so far (failed ones too);
   dt_emu_live_allocations: how many are held now (device and pinned). */
void dt_emu_fail_alloc(long long n);
long long dt_emu_allocations(void);
long long dt_emu_live_allocations(void);
/* DT_EMU_STREAMS: "immediate" (default) or "deferred" (work on created streams waits until
   something waits for it; see cuda_emu.cpp). */
const char *dt_emu_streams_mode(void);

/* For the fake NCCL (tests/cuda_emu/nccl_emu.cpp): queue work on a stream. step runs when the
   stream gets to it, and again until it sets *done (an operation waiting for its peers); a
   status other than cudaSuccess fails it. Whether a stream is valid (0 is); whether
   [p, p + bytes) lies in one cudaMalloc allocation (else why says what is wrong). */
cudaError_t dt_emu_enqueue(cudaStream_t stream, const char *what, const std::function<cudaError_t(bool *)> &step);
int dt_emu_valid_stream(cudaStream_t stream);
int dt_emu_device_range(const void *p, size_t bytes, char *why, size_t why_len);

#endif /* DT_CUDA_EMU_RUNTIME_H */
