/* tests/cuda_emu/k_mma_kernels.cuh - test kernels of kernels/dt_mma.cuh: run on the emulator by
   tests/cuda_emu/k_mma.cpp, compiled by nvcc for sm_80 and sm_90 (and their PTX grepped for
   mma.sync) by tests/run.sh's group ptx:dt_mma, so both build the same code. Test-only. */
#ifndef DT_K_MMA_KERNELS_CUH
#define DT_K_MMA_KERNELS_CUH

#include "dt_cuda.cuh"
#include "dt_mma.cuh"

/* One warp, one mma, the fragments built by this file's own reading of the PTX ISA's figures
   (not by dt_mma.cuh's layout functions): A [16 x 16] and B [16 x 8] row-major 16-bit, C and D
   [16 x 8] row-major f32. So a wrong layout in the header or in the emulator shows. */
template <int F16>
__global__ void k_mma_raw(float *D, const uint16_t *A, const uint16_t *B, const float *C) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    dt_mma_frag_a a;
    dt_mma_frag_b b;
    dt_mma_frag_c c, d;
    /* a0 a1: (g, 2t..2t+1); a2 a3: (g+8, 2t..); a4 a5: (g, 2t+8..); a6 a7: (g+8, 2t+8..) */
    const int ar[4] = {g, g + 8, g, g + 8}, ac[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int j = 0; j < 4; j++) a.x[j] = dt_mma_pack(A[ar[j] * 16 + ac[j]], A[ar[j] * 16 + ac[j] + 1]);
    /* b0 b1: (2t..2t+1, g); b2 b3: (2t+8.., g) */
    for (int j = 0; j < 2; j++) b.x[j] = dt_mma_pack(B[(2 * t + 8 * j) * 8 + g], B[(2 * t + 8 * j + 1) * 8 + g]);
    /* c0 c1: (g, 2t..2t+1); c2 c3: (g+8, 2t..) */
    for (int i = 0; i < 4; i++) c.x[i] = C[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)];
    if (F16) dt_mma_m16n8k16_f16(&d, a, b, c);
    else dt_mma_m16n8k16_bf16(&d, a, b, c);
    for (int i = 0; i < 4; i++) D[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = d.x[i];
}

/* C [M x N] = A [M x K] B (+ C), bf16 inputs, f32 C, all row-major; B given as [K x N], or as
   its transpose W [N x K] (BT = 1). A block of 4 warps computes a 32 x 16 tile of C: warp w the
   16 x 8 tile at rows 16 (w >> 1), columns 8 (w & 1). Per k step of 16 the block stages A's 32 x
   16 and B's 16 x 16 slice in shared memory with 16-byte loads (8 bf16; K and N multiples of 16,
   so rows stay aligned), and each warp loads its fragments from there with dt_mma.cuh's helpers.
   PLANT = 1 plants a layout bug: lanes 1 and 5 load each other's A fragment, so rows 0 and 1 of
   the warp's tile (and 8 and 9) trade their k pairs 2-3 and 10-11; the emulator must show it. */
enum { K_MMA_BM = 32, K_MMA_BN = 16, K_MMA_BK = 16 };
template <int BT, int PLANT>
__global__ void k_mma_tiles(float *C, const __nv_bfloat16 *A, const __nv_bfloat16 *B, int M, int N, int K) {
    __shared__ __align__(16) __nv_bfloat16 sa[K_MMA_BM * K_MMA_BK];
    __shared__ __align__(16) __nv_bfloat16 sb[K_MMA_BK * K_MMA_BN]; /* [k][n], or [n][k] when BT */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int row0 = blockIdx.y * K_MMA_BM, col0 = blockIdx.x * K_MMA_BN;
    int wr = (warp >> 1) * 16, wc = (warp & 1) * 8;
    int la = PLANT && (lane == 1 || lane == 5) ? lane ^ 4 : lane;
    dt_mma_frag_a a;
    dt_mma_frag_b b;
    dt_mma_frag_c acc;
    (void)M;
    dt_mma_load_c(&acc, C + (size_t)(row0 + wr) * N + col0 + wc, N, lane);
    for (int k0 = 0; k0 < K; k0 += K_MMA_BK) {
        /* 32 x 16 of A: 64 uint4; 16 x 16 of B: 32 uint4; 128 threads, one each */
        if (tid < 64) {
            int r = tid >> 1, c = (tid & 1) * 8;
            dt_k_store_vec<uint4>(sa + r * K_MMA_BK + c, dt_k_load_vec<uint4>(A + (size_t)(row0 + r) * K + k0 + c));
        } else if (tid < 96) {
            int r = (tid - 64) >> 1, c = (tid & 1) * 8;
            const __nv_bfloat16 *src = BT ? B + (size_t)(col0 + r) * K + k0 + c : B + (size_t)(k0 + r) * N + col0 + c;
            dt_k_store_vec<uint4>(sb + r * 16 + c, dt_k_load_vec<uint4>(src));
        }
        __syncthreads();
        dt_mma_load_a(&a, sa + wr * K_MMA_BK, K_MMA_BK, la);
        if (BT) dt_mma_load_bt(&b, sb + wc * K_MMA_BK, K_MMA_BK, lane);
        else dt_mma_load_b(&b, sb + wc, K_MMA_BN, lane);
        dt_mma_m16n8k16_bf16(&acc, a, b, acc);
        __syncthreads(); /* the next step's staging overwrites what this one read */
    }
    dt_mma_store_c(C + (size_t)(row0 + wr) * N + col0 + wc, N, acc, lane);
}

/* Half of the warp calls the mma, the other half returns first: undefined on a GPU, reported by
   the emulator. */
__global__ void k_mma_half_warp(float *D) {
    dt_mma_frag_a a = {{0, 0, 0, 0}};
    dt_mma_frag_b b = {{0, 0}};
    dt_mma_frag_c c = {{0, 0, 0, 0}};
    if ((threadIdx.x & 31) >= 16) return;
    dt_mma_m16n8k16_bf16(&c, a, b, c);
    D[threadIdx.x] = c.x[0];
}

/* Launchers (0 or the launch's error). */
inline int k_mma_raw_launch(int f16, float *D, const uint16_t *A, const uint16_t *B, const float *C) {
    if (f16) DT_K_LAUNCH(k_mma_raw<1>, 1, 32, 0, 0, D, A, B, C);
    else DT_K_LAUNCH(k_mma_raw<0>, 1, 32, 0, 0, D, A, B, C);
    return DT_K_CHECK();
}
/* M a multiple of 32, N and K of 16. */
inline int k_mma_tiles_launch(int bt, int plant, float *C, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
                                     int M, int N, int K) {
    typedef void (*kernel_fn)(float *, const __nv_bfloat16 *, const __nv_bfloat16 *, int, int, int);
    kernel_fn k = bt ? (plant ? k_mma_tiles<1, 1> : k_mma_tiles<1, 0>)
                     : (plant ? k_mma_tiles<0, 1> : k_mma_tiles<0, 0>);
    dim3 grid((unsigned)(N / K_MMA_BN), (unsigned)(M / K_MMA_BM));
    DT_K_LAUNCH(k, grid, 128, 0, 0, C, A, B, M, N, K);
    return DT_K_CHECK();
}
inline int k_mma_half_warp_launch(float *D) {
    DT_K_LAUNCH(k_mma_half_warp, 1, 32, 0, 0, D);
    return DT_K_CHECK();
}

#endif /* DT_K_MMA_KERNELS_CUH */
