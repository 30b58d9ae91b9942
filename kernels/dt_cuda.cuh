/* kernels/dt_cuda.cuh - what every .cu file in kernels/ includes first: the launch macro, the error check,
   dynamic shared memory, bf16/f16 conversions and warp/block reductions.

   The same .cu sources build two ways:
     nvcc -c kernels/dt_x.cu                    the real thing (DT_K_LAUNCH is <<< >>>);
     g++ -x c++ -Itests/cuda_emu/include ...    the test-only CPU emulator (tests/cuda_emu/), whose
                                                fake <cuda_runtime.h> defines DT_CUDA_EMU.
   So kernels use only what both understand (THE KERNEL CONTRACT, tests/cuda_emu/cuda_emu.cpp):
   launch through DT_K_LAUNCH, never <<< >>>; no inline PTX outside kernels/dt_mma.cuh (the
   tensor cores' mma.sync and ldmatrix, which the emulator runs as warp-collective operations,
   and cp.async, which it makes at the thread's wait), no CUB, cooperative groups, printf,
   managed memory; a grid-wide sync is two launches. __nv_bfloat16
   and __half (cuda_bf16.h, cuda_fp16.h) with their conversions, yes; their arithmetic
   operators, no (the emulator deletes them: compute in float).

   Conventions of the kernels (kernels/dt_kernels.h says the ABI): launchers return 0 or the
   cudaError_t of the failing call as an int; gradients accumulate (+=); sizes are int64_t and a
   launcher checks them (negative, or a product that overflows: cudaErrorInvalidValue) before it
   launches, and a NULL pointer the launch would dereference where its host sizes say there is
   data, as a kernel would fault (every .cu file here; an array sized on the device, by offsets
   or kept rows, is not the launcher's to judge); a grid rounds up through dt_k__ceil_div; a size
   of 0 launches nothing.                                         MIT licence (see dt_tensor.h) */
#ifndef DT_CUDA_CUH
#define DT_CUDA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "dt_kernels.h"

#ifdef DT_CUDA_EMU
/* The emulator runs the kernel once per CUDA thread: the lambda captures the arguments by value
   (as a launch does) and each host thread calls the kernel with them. */
#define DT_K_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...)                                           \
    (void)dt_emu_launch(#kernel, __FILE__, __LINE__, dim3(grid), dim3(block), (size_t)(shmem_bytes),        \
                        (cudaStream_t)(stream), [=]() { kernel(__VA_ARGS__); })
#define DT_K_SHARED_DYNAMIC(type, name) type *name = (type *)dt_emu_dynamic_shared()
#else
#define DT_K_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
    kernel<<<(grid), (block), (shmem_bytes), (cudaStream_t)(stream)>>>(__VA_ARGS__)
/* One byte array for every kernel (two kernels of one file may want different types). */
#define DT_K_SHARED_DYNAMIC(type, name)                             \
    extern __shared__ __align__(16) unsigned char dt_k__dynamic_shared[]; \
    type *name = (type *)dt_k__dynamic_shared
#endif

/* 0, or the error of the last launch (and clears it). */
#define DT_K_CHECK() ((int)cudaGetLastError())

/* n / d rounded up, for n >= 0 and d > 0: without the n + d - 1 that overflows int64 near
   INT64_MAX (undefined behaviour, in practice a negative grid). Host and device: a kernel that
   splits n items into per-thread chunks rounds up with it too. */
static inline __host__ __device__ int64_t dt_k__ceil_div(int64_t n, int64_t d) { return n / d + (n % d != 0); }

/* A 1-D grid of `threads`-thread blocks covering n items with a grid-stride loop: at most
   max_blocks blocks (the loop does the rest). n > 0. */
static inline unsigned int dt_k__blocks(int64_t n, int threads, unsigned int max_blocks) {
    int64_t b = dt_k__ceil_div(n, threads);
    return b > (int64_t)max_blocks ? max_blocks : (unsigned int)b;
}

/* Device helpers here are static: a __shared__ array inside an inline function shared by two
   .cu files would be one COMDAT object, which the emulator's placement of __shared__ arrays (one
   linker section) cannot merge; static gives each .cu file its own, which is all a block needs.
   A template keeps its shared memory dynamic (DT_K_SHARED_DYNAMIC), as kernels/dt_flash.cu's do:
   g++ 12 ignores the section attribute on a static variable of a template, so a __shared__
   array there would be outside the emulator's view (no NaN poison at block start, and ldmatrix
   reports it as outside shared memory); the emulator's build (tests/cuda_emu/emu_build.sh)
   rejects one, naming it. */

/* ---------------------------------------------------------------- bf16 / f16 storage (uint16_t) */

/* Bit for bit dt_tensor.h's conversions: round to nearest even, NaN stays NaN (quiet). */
static __device__ __forceinline__ float dt_k_bf16_to_f32(uint16_t h) { return __uint_as_float((unsigned int)h << 16); }

static __device__ __forceinline__ uint16_t dt_k_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float dt_k_f16_to_f32(uint16_t h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24 */
        float f = (float)m * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

static __device__ __forceinline__ uint16_t dt_k_f32_to_f16(float f) {
    unsigned int u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                   /* a subnormal half: count 2^-24 units */
        float scaled = __uint_as_float(a) * 16777216.0f;     /* exact: a power of two */
        unsigned int q = (unsigned int)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    return (uint16_t)(sign | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - ((127u - 15u) << 10)));
}

/* ---------------------------------------------------------------- vector loads and stores */

/* One access of sizeof(V) bytes (float4, int4, uint4: 16; float2, uint2: 8): a memory-bound
   kernel moves 16 bytes per instruction instead of 4. p must be sizeof(V)-aligned, or the GPU
   faults (cudaErrorMisalignedAddress): a launcher takes the vector path only when every pointer
   is aligned (dt_k_aligned), else the scalar one (a view at an odd offset). The emulator checks
   the alignment of each access, and copies bytes so that the host never traps. */
template <typename V> static __device__ __forceinline__ V dt_k_load_vec(const void *p) {
#ifdef DT_CUDA_EMU
    V v;
    dt_emu_vector_access(p, sizeof(V), 0);
    memcpy(&v, p, sizeof(V));
    return v;
#else
    return *(const V *)p;
#endif
}
template <typename V> static __device__ __forceinline__ void dt_k_store_vec(void *p, V v) {
#ifdef DT_CUDA_EMU
    dt_emu_vector_access(p, sizeof(V), 1);
    memcpy(p, &v, sizeof(V));
#else
    *(V *)p = v;
#endif
}
static __device__ __forceinline__ float4 dt_k_load4(const float *p) { return dt_k_load_vec<float4>(p); }
static __device__ __forceinline__ void dt_k_store4(float *p, float4 v) { dt_k_store_vec<float4>(p, v); }

/* Host side: p is a multiple of `bytes` (NULL counts as aligned: an absent operand). */
static inline int dt_k_aligned(const void *p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

/* ---------------------------------------------------------------- warp and block reductions */

/* Butterfly (xor) reductions over the full warp: every lane ends with the same bits, because
   each step adds the same two numbers on both lanes. */
template <typename T> static __device__ __forceinline__ T dt_k_warp_sum(T v) { /* float or double */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
static __device__ __forceinline__ float dt_k_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block reductions: blockDim.x a multiple of 32, at most 1024, blockDim.y = blockDim.z = 1;
   every thread of the block calls them (they hold __syncthreads) and gets the result. Each warp
   sums its lanes, lane 0 of each puts its warp's sum into the shared array, and every warp then
   sums that array itself. The first __syncthreads keeps a previous call's readers from seeing
   this call's writes. */
template <typename T> static __device__ __forceinline__ T dt_k__warp_partials(T v, T *partial, T pad) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return lane < nwarps ? partial[lane] : pad;
}
static __device__ __forceinline__ float dt_k_block_sum(float v) {
    __shared__ float dt_k__partial[32];
    return dt_k_warp_sum(dt_k__warp_partials(dt_k_warp_sum(v), dt_k__partial, 0.0f));
}
static __device__ __forceinline__ double dt_k_block_sum(double v) {
    __shared__ double dt_k__partial_d[32];
    return dt_k_warp_sum(dt_k__warp_partials(dt_k_warp_sum(v), dt_k__partial_d, 0.0));
}
static __device__ __forceinline__ float dt_k_block_max(float v) {
    __shared__ float dt_k__partial_max[32];
    return dt_k_warp_max(dt_k__warp_partials(dt_k_warp_max(v), dt_k__partial_max, -INFINITY));
}

#endif /* DT_CUDA_CUH */
