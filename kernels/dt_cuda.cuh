/* kernels/dt_cuda.cuh - LOCAL STAND-IN written by branch kern to the kernel contract, until
   branch emu's version lands (then this file is replaced by theirs). */
#ifndef DT_CUDA_CUH
#define DT_CUDA_CUH
#include <cuda_runtime.h>
#include <stdint.h>
#include "dt_kernels.h"

#define DT_K_LAUNCH(kernel, grid, block, shmem_bytes, stream, ...) \
    kernel<<<(grid), (block), (shmem_bytes), (cudaStream_t)(stream)>>>(__VA_ARGS__)
#define DT_K_CHECK() ((int)cudaGetLastError())
#define DT_K_SHARED_DYNAMIC(type, name) extern __shared__ type name[]

__device__ static inline float dt_k_bf16_to_f32(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}
__device__ static inline uint16_t dt_k_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ static inline float dt_k_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f;
        return s ? -v : v;
    }
    if (e == 31) return __uint_as_float(s | 0x7f800000u | (m << 13));
    return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
}
__device__ static inline uint16_t dt_k_f32_to_f16(float f) {
    uint32_t u = __float_as_uint(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);
    if (a < 0x38800000u) { /* subnormal half */
        float v = __uint_as_float(a) * 16777216.0f; /* * 2^24: units of the smallest subnormal */
        uint32_t q = (uint32_t)v;
        float r = v - (float)q;
        if (r > 0.5f || (r == 0.5f && (q & 1u))) q++;
        return (uint16_t)(s | q);
    }
    a += 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(s | ((a - 0x38000000u) >> 13));
}
__device__ static inline float dt_k_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ static inline float dt_k_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ static inline float dt_k_block_sum(float v) {
    __shared__ float s[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = dt_k_warp_sum(v);
    __syncthreads();
    if (lane == 0) s[w] = v;
    __syncthreads();
    v = lane < nw ? s[lane] : 0.0f;
    return dt_k_warp_sum(v);
}
__device__ static inline float dt_k_block_max(float v) {
    __shared__ float s[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = dt_k_warp_max(v);
    __syncthreads();
    if (lane == 0) s[w] = v;
    __syncthreads();
    v = lane < nw ? s[lane] : -INFINITY;
    return dt_k_warp_max(v);
}
#endif
