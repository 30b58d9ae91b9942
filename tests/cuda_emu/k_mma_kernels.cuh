/* tests/cuda_emu/k_mma_kernels.cuh - test kernels of kernels/dt_mma.cuh: run on the emulator by
   tests/cuda_emu/k_mma.cpp, compiled by nvcc for sm_80 and sm_90 (and their PTX grepped for
   mma.sync) by tests/run.sh's group ptx:dt_mma, so both build the same code. Test-only.
   The templates take their shared memory dynamically (DT_K_SHARED_DYNAMIC): g++ 12 ignores the
   section attribute that makes a __shared__ array visible to the emulator (poisoned with NaN at
   each block start, readable by ldmatrix) on a static variable of a template. */
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
   the warp's tile (and 8 and 9) trade their k pairs 2-3 and 10-11; the emulator must show it.
   LDSM = 1 loads B with ldmatrix (dt_mma_load_bt2 / load_b2: both warps' fragments at once, the
   warp keeping its own), and then PLANT swaps lanes 1 and 5 in B's load instead: they give each
   other's row address, so B's rows (or, transposed, columns) 1 and 5 trade places. */
enum { K_MMA_BM = 32, K_MMA_BN = 16, K_MMA_BK = 16, K_MMA_SHARED = (K_MMA_BM + K_MMA_BN) * K_MMA_BK * 2 };
template <int BT, int PLANT, int LDSM>
__global__ void k_mma_tiles(float *C, const __nv_bfloat16 *A, const __nv_bfloat16 *B, int M, int N, int K) {
    DT_K_SHARED_DYNAMIC(__nv_bfloat16, sa);  /* [K_MMA_BM x K_MMA_BK], then sb (K_MMA_SHARED bytes) */
    __nv_bfloat16 *sb = sa + K_MMA_BM * K_MMA_BK; /* [K_MMA_BK x K_MMA_BN]: [k][n], or [n][k] when BT */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int row0 = blockIdx.y * K_MMA_BM, col0 = blockIdx.x * K_MMA_BN;
    int wr = (warp >> 1) * 16, wc = (warp & 1) * 8;
    int swap = PLANT && (lane == 1 || lane == 5) ? lane ^ 4 : lane, la = LDSM ? lane : swap;
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
        if (LDSM) {
            dt_mma_frag_b b0, b1;
            if (BT) dt_mma_load_bt2(&b0, &b1, sb, K_MMA_BK, swap);
            else dt_mma_load_b2(&b0, &b1, sb, K_MMA_BN, swap);
            b = wc ? b1 : b0;
        } else if (BT) dt_mma_load_bt(&b, sb + wc * K_MMA_BK, K_MMA_BK, lane);
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

/* One ldmatrix by one warp. src [K_LDSM_ROWS x K_LDSM_COLS] (16-bit, row-major) is staged in
   shared memory; lane l gives the address of row rows[l] at column cols[l] (a multiple of 8), so
   the test picks the rows of the four 8 x 8 matrices; lane l writes its registers to R[4 l ..].
   MODE 0: x4; 1: x4.trans; 2: the addresses in global memory (src itself); 3: lane 5's address
   2 bytes past its row's start (off a 16-byte boundary). */
enum { K_LDSM_ROWS = 40, K_LDSM_COLS = 24 };
template <int MODE>
__global__ void k_ldsm(uint32_t *R, const uint16_t *src, const int *rows, const int *cols) {
    DT_K_SHARED_DYNAMIC(uint16_t, s); /* [K_LDSM_ROWS x K_LDSM_COLS] */
    int lane = threadIdx.x & 31;
    for (int i = lane; i < K_LDSM_ROWS * K_LDSM_COLS; i += 32) s[i] = src[i];
    __syncwarp();
    const uint16_t *p = (MODE == 2 ? src : s) + rows[lane] * K_LDSM_COLS + cols[lane] + (MODE == 3 && lane == 5);
    uint32_t r[4];
    if (MODE == 1) dt_mma_ldsm_x4_trans(r, p);
    else dt_mma_ldsm_x4(r, p);
    for (int i = 0; i < 4; i++) R[lane * 4 + i] = r[i];
}

/* A block of 128 threads stores a 64 x 16 tile (16 bytes a thread: thread t row t / 2), then
   each warp reads with ldmatrix the 16 rows warp w + 1 (mod 4) stored: R[4 tid ..]. BARRIER 0
   leaves out the __syncthreads between, so warps read rows other warps may not have stored: the
   NaN poison in every thread order of the emulator. */
template <int BARRIER>
__global__ void k_ldsm_barrier(uint32_t *R, const uint16_t *src) {
    DT_K_SHARED_DYNAMIC(uint16_t, s); /* [64 x 16] */
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    dt_k_store_vec<uint4>(s + tid * 8, dt_k_load_vec<uint4>(src + tid * 8));
    if (BARRIER) __syncthreads();
    int row = ((warp + 1) & 3) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), col = (lane >> 4) * 8;
    uint32_t r[4];
    dt_mma_ldsm_x4(r, s + row * 16 + col);
    for (int i = 0; i < 4; i++) R[tid * 4 + i] = r[i];
}

/* cp.async by one warp: lane l copies 16-byte chunk l of src (group 0) and chunk 32 + l (group
   1) into shared memory, then every lane reads all 64 chunks into out[0 ..] after waiting for
   all but the newest group and a barrier, and into out[512 ..] after waiting for all. MODE 0 as
   said; 1: the first read before any wait; 2: lane 3's source 2 bytes off its chunk; 3: the
   destination in global memory; 4: no wait at all. */
template <int MODE>
__global__ void k_cp_async(uint16_t *out, const uint16_t *src) {
    DT_K_SHARED_DYNAMIC(uint16_t, s); /* 64 chunks of 8 */
    int lane = threadIdx.x & 31;
    uint16_t *dst = MODE == 3 ? out + 1024 : s;
    dt_mma_cp_async16(dst + lane * 8, src + lane * 8 + (MODE == 2 && lane == 3));
    dt_mma_cp_async_commit();
    dt_mma_cp_async16(dst + (32 + lane) * 8, src + (32 + lane) * 8);
    dt_mma_cp_async_commit();
    if (MODE == 0) dt_mma_cp_async_wait<1>();
    __syncthreads();
    if (lane == 0)
        for (int i = 0; i < 512; i++) out[i] = s[i];
    __syncthreads();
    if (MODE != 4) dt_mma_cp_async_wait<0>();
    __syncthreads();
    if (lane == 0)
        for (int i = 0; i < 512; i++) out[512 + i] = s[i];
}

/* Launchers (0 or the launch's error). */
inline int k_cp_async_launch(int mode, uint16_t *out, const uint16_t *src) {
    typedef void (*kernel_fn)(uint16_t *, const uint16_t *);
    const kernel_fn k[5] = {k_cp_async<0>, k_cp_async<1>, k_cp_async<2>, k_cp_async<3>, k_cp_async<4>};
    DT_K_LAUNCH(k[mode], 1, 32, 64 * 16, 0, out, src);
    return DT_K_CHECK();
}
inline int k_ldsm_launch(int mode, uint32_t *R, const uint16_t *src, const int *rows, const int *cols) {
    typedef void (*kernel_fn)(uint32_t *, const uint16_t *, const int *, const int *);
    const kernel_fn k[4] = {k_ldsm<0>, k_ldsm<1>, k_ldsm<2>, k_ldsm<3>};
    DT_K_LAUNCH(k[mode], 1, 32, K_LDSM_ROWS * K_LDSM_COLS * 2, 0, R, src, rows, cols);
    return DT_K_CHECK();
}
inline int k_ldsm_barrier_launch(int barrier, uint32_t *R, const uint16_t *src) {
    if (barrier) DT_K_LAUNCH(k_ldsm_barrier<1>, 1, 128, 64 * 16 * 2, 0, R, src);
    else DT_K_LAUNCH(k_ldsm_barrier<0>, 1, 128, 64 * 16 * 2, 0, R, src);
    return DT_K_CHECK();
}
inline int k_mma_raw_launch(int f16, float *D, const uint16_t *A, const uint16_t *B, const float *C) {
    if (f16) DT_K_LAUNCH(k_mma_raw<1>, 1, 32, 0, 0, D, A, B, C);
    else DT_K_LAUNCH(k_mma_raw<0>, 1, 32, 0, 0, D, A, B, C);
    return DT_K_CHECK();
}
/* M a multiple of 32, N and K of 16. */
inline int k_mma_tiles_launch(int bt, int plant, int ldsm, float *C, const __nv_bfloat16 *A, const __nv_bfloat16 *B,
                              int M, int N, int K) {
    typedef void (*kernel_fn)(float *, const __nv_bfloat16 *, const __nv_bfloat16 *, int, int, int);
    const kernel_fn ks[2][2][2] = {
        {{k_mma_tiles<0, 0, 0>, k_mma_tiles<0, 0, 1>}, {k_mma_tiles<0, 1, 0>, k_mma_tiles<0, 1, 1>}},
        {{k_mma_tiles<1, 0, 0>, k_mma_tiles<1, 0, 1>}, {k_mma_tiles<1, 1, 0>, k_mma_tiles<1, 1, 1>}}};
    kernel_fn k = ks[!!bt][!!plant][!!ldsm];
    dim3 grid((unsigned)(N / K_MMA_BN), (unsigned)(M / K_MMA_BM));
    DT_K_LAUNCH(k, grid, 128, K_MMA_SHARED, 0, C, A, B, M, N, K);
    return DT_K_CHECK();
}
inline int k_mma_half_warp_launch(float *D) {
    DT_K_LAUNCH(k_mma_half_warp, 1, 32, 0, 0, D);
    return DT_K_CHECK();
}

#endif /* DT_K_MMA_KERNELS_CUH */
