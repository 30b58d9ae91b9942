/* kernels/dt_mma.cuh - warp-level matrix multiply-accumulate on the tensor cores (mma.sync m16n8k16, bf16 or
   f16 inputs, f32 accumulators), for kernels that include it after dt_cuda.cuh.

   One warp multiplies a 16 x 16 tile of A by a 16 x 8 tile of B and adds a 16 x 8 tile of C:
   D = A B + C. No lane holds a whole matrix: each holds a fragment, at the places the PTX ISA
   fixes ("Matrix Fragments for mma.m16n8k16 with floating point type"). With
       g = lane >> 2 (groupID),  t = lane % 4 (threadID_in_group),
   A  (16 x 16, .row): a0..a7, two per 32-bit register (lower index in the lower half)
        row = g      for a0 a1 a4 a5,   g + 8 for a2 a3 a6 a7
        col = 2t + (i & 1)  for a0..a3,  2t + 8 + (i & 1) for a4..a7
   B  (16 x 8, .col): b0..b3, two per register
        row = 2t + (i & 1)  for b0 b1,   2t + 8 + (i & 1) for b2 b3;   col = g
   C, D (16 x 8, f32): c0..c3
        row = g for c0 c1,  g + 8 for c2 c3;   col = 2t + (i & 1)

         k:   0 1   2 3   4 5   6 7   8 9  ..  14 15
   A row g:  [ 4g  | 4g+1| 4g+2| 4g+3| 4g  ..  4g+3 ]   (the lanes holding each pair; row g + 8 alike)
   B col g:  [ 4g  | 4g+1| 4g+2| 4g+3| 4g  ..  4g+3 ]   (down the column)
   D:        lane 4g + t holds rows g and g + 8, columns 2t and 2t + 1.

   On a GPU (__CUDA_ARCH__ >= 800) dt_mma_m16n8k16_bf16 / _f16 are the instruction itself (inline
   PTX). On the emulator (tests/cuda_emu) they are a warp-collective operation: the 32 lanes meet
   at one barrier (dt_emu_warp_gather), every lane sees the whole warp's fragments, reads the rows
   of A and columns of B it needs where the layout above puts them, and computes its own elements
   of D. So a kernel that loads a fragment
   from the wrong place gets a wrong D on the emulator, as on the GPU. Like the instruction, every
   lane of the warp must call it (converged, .aligned); a lane missing is reported.

   What the emulator cannot see: the order and internal precision of the sums inside one mma are
   unspecified on the hardware; the emulator computes the exact A B + C (in double) rounded once
   to f32. Compare kernels with a reference within a bound for an f32 sum of K terms (|err| <=
   gamma(K + 1) (sum_k |a_ik b_kj| + |c_ij|), gamma(k) = k u / (1 - k u), u = 2^-24), never bit
   for bit; the emulator's own results are the same bits in every thread order.

   The load and store helpers read and write row-major tiles (shared or global memory) at the
   places above; `lane` is the calling lane (dt_mma_lane()). Pairs are read as one 32-bit load, so
   a tile's base and its leading dimension ld must keep pairs 4-byte aligned (ld even).
   ldmatrix (dt_mma_ldsm_x4, and dt_mma_load_bt2 / load_b2 on it) makes two B fragments from
   shared memory in one instruction; cp.async (dt_mma_cp_async16) fills shared memory from global
   memory while the warp goes on. Their sections below say how the emulator checks them.
                                                                  MIT licence (see dt_tensor.h) */
#ifndef DT_MMA_CUH
#define DT_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "dt_cuda.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/dt_mma.cuh: mma.sync m16n8k16 with bf16 needs sm_80 or newer"
#endif

typedef struct { uint32_t x[4]; } dt_mma_frag_a; /* A: 8 bf16/f16, pairs a0a1, a2a3, a4a5, a6a7 */
typedef struct { uint32_t x[2]; } dt_mma_frag_b; /* B: 4 bf16/f16, pairs b0b1, b2b3 */
typedef struct { float x[4]; } dt_mma_frag_c;    /* C and D: 4 floats */

/* ---------------------------------------------------------------- the layout (PTX ISA, above) */

/* Element i of lane's fragment of A, B or C/D: its row and column (host too, for tests). */
#define DT_MMA__LAYOUT static __host__ __device__ __forceinline__ int
DT_MMA__LAYOUT dt_mma_a_row(int lane, int i) { return (lane >> 2) + ((i >> 1) & 1) * 8; }
DT_MMA__LAYOUT dt_mma_a_col(int lane, int i) { return (lane & 3) * 2 + (i & 1) + (i >> 2) * 8; }
DT_MMA__LAYOUT dt_mma_b_row(int lane, int i) { return (lane & 3) * 2 + (i & 1) + (i >> 1) * 8; }
DT_MMA__LAYOUT dt_mma_b_col(int lane, int i) { (void)i; return lane >> 2; }
DT_MMA__LAYOUT dt_mma_c_row(int lane, int i) { return (lane >> 2) + (i >> 1) * 8; }
DT_MMA__LAYOUT dt_mma_c_col(int lane, int i) { return (lane & 3) * 2 + (i & 1); }
#undef DT_MMA__LAYOUT

/* The calling thread's lane: its linear index in the block, mod 32 (warps are cut from it). */
static __device__ __forceinline__ int dt_mma_lane(void) {
    return (int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) & 31u);
}

/* Two 16-bit values in one register, lo in the lower half (the order of a fragment's pairs). */
static __device__ __forceinline__ uint32_t dt_mma_pack(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

/* ---------------------------------------------------------------- mma */

#ifdef DT_CUDA_EMU
/* Each lane's registers, as the gather hands them to every lane. */
typedef struct { uint32_t a[4], b[2]; float c[4]; } dt_mma__regs;

static inline float dt_mma__elem(uint32_t reg, int hi, int f16) {
    uint16_t h = (uint16_t)(hi ? reg >> 16 : reg & 0xffffu);
    return f16 ? __half2float(__ushort_as_half(h)) : __bfloat162float(__ushort_as_bfloat16(h));
}

/* Where each element of A (16 x 16) and B (16 x 8) is held: lane * 8 + element, the inverse of
   the layout functions above (built from them once, so they stay the one statement of the layout). */
struct dt_mma__where {
    unsigned char a[16][16], b[16][8];
    dt_mma__where() {
        for (int l = 0; l < 32; l++) {
            for (int i = 0; i < 8; i++) a[dt_mma_a_row(l, i)][dt_mma_a_col(l, i)] = (unsigned char)(l * 8 + i);
            for (int i = 0; i < 4; i++) b[dt_mma_b_row(l, i)][dt_mma_b_col(l, i)] = (unsigned char)(l * 8 + i);
        }
    }
};

/* D = A B + C, exact in double, rounded once to f32 (the hardware's order is unspecified). A lane
   reads the rows of A and the columns of B its four elements of D need from the lanes that hold
   them (as the layout says), so a fragment loaded from the wrong place gives a wrong D. */
static inline void dt_mma__emu(dt_mma_frag_c *d, const dt_mma_frag_a &a, const dt_mma_frag_b &b,
                               const dt_mma_frag_c &c, int f16, const char *what, const char *file, int line) {
    static const dt_mma__where where;
    dt_mma__regs mine, all[32];
    int lane = dt_mma_lane();
    memcpy(mine.a, a.x, sizeof mine.a), memcpy(mine.b, b.x, sizeof mine.b), memcpy(mine.c, c.x, sizeof mine.c);
    dt_emu_warp_gather(file, line, what, 0xffffffffu, &mine, all, sizeof mine);
    for (int i = 0; i < 4; i++) {
        int r = dt_mma_c_row(lane, i), col = dt_mma_c_col(lane, i);
        double s = c.x[i];
        for (int k = 0; k < 16; k++) {
            int wa = where.a[r][k], wb = where.b[k][col];
            float av = dt_mma__elem(all[wa >> 3].a[(wa & 7) >> 1], wa & 1, f16);
            float bv = dt_mma__elem(all[wb >> 3].b[(wb & 7) >> 1], wb & 1, f16);
            s += (double)av * (double)bv;
        }
        d->x[i] = (float)s;
    }
}
/* __builtin_FILE/LINE as default arguments: the caller's place, for the emulator's reports. */
static inline void dt_mma_m16n8k16_bf16(dt_mma_frag_c *d, const dt_mma_frag_a &a, const dt_mma_frag_b &b,
                                        const dt_mma_frag_c &c, const char *file = __builtin_FILE(),
                                        int line = __builtin_LINE()) {
    dt_mma__emu(d, a, b, c, 0, "mma.sync.m16n8k16.bf16", file, line);
}
static inline void dt_mma_m16n8k16_f16(dt_mma_frag_c *d, const dt_mma_frag_a &a, const dt_mma_frag_b &b,
                                       const dt_mma_frag_c &c, const char *file = __builtin_FILE(),
                                       int line = __builtin_LINE()) {
    dt_mma__emu(d, a, b, c, 1, "mma.sync.m16n8k16.f16", file, line);
}
#else
#define DT_MMA__ASM(types)                                                                                   \
    asm volatile("mma.sync.aligned.m16n8k16.row.col." types " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "     \
                 "{%10,%11,%12,%13};\n"                                                                      \
                 : "=f"(d->x[0]), "=f"(d->x[1]), "=f"(d->x[2]), "=f"(d->x[3])                                \
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]),             \
                   "f"(c.x[0]), "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]))
static __device__ __forceinline__ void dt_mma_m16n8k16_bf16(dt_mma_frag_c *d, const dt_mma_frag_a &a,
                                                            const dt_mma_frag_b &b, const dt_mma_frag_c &c) {
#ifdef __CUDA_ARCH__
    DT_MMA__ASM("f32.bf16.bf16.f32");
#else
    (void)d, (void)a, (void)b, (void)c;
#endif
}
static __device__ __forceinline__ void dt_mma_m16n8k16_f16(dt_mma_frag_c *d, const dt_mma_frag_a &a,
                                                           const dt_mma_frag_b &b, const dt_mma_frag_c &c) {
#ifdef __CUDA_ARCH__
    DT_MMA__ASM("f32.f16.f16.f32");
#else
    (void)d, (void)a, (void)b, (void)c;
#endif
}
#undef DT_MMA__ASM
#endif

/* ---------------------------------------------------------------- loads and stores */

/* One pair of 16-bit elements: p must be 4-byte aligned (the emulator checks, a GPU faults). */
template <typename T> static __device__ __forceinline__ uint32_t dt_mma__pair(const T *p) {
    static_assert(sizeof(T) == 2, "fragments hold 16-bit elements (__nv_bfloat16, __half, uint16_t)");
    return dt_k_load_vec<uint32_t>(p);
}

/* A from a row-major 16 x 16 tile: element (r, k) at tile[r * ld + k]. */
template <typename T>
static __device__ __forceinline__ void dt_mma_load_a(dt_mma_frag_a *a, const T *tile, int ld, int lane) {
#pragma unroll
    for (int j = 0; j < 4; j++)
        a->x[j] = dt_mma__pair(tile + dt_mma_a_row(lane, 2 * j) * ld + dt_mma_a_col(lane, 2 * j));
}

/* B from a row-major 16 x 8 tile (k rows, n columns): (k, n) at tile[k * ld + n]. A pair runs
   down a column here, so it is two 16-bit loads. */
template <typename T>
static __device__ __forceinline__ void dt_mma_load_b(dt_mma_frag_b *b, const T *tile, int ld, int lane) {
    static_assert(sizeof(T) == 2, "fragments hold 16-bit elements (__nv_bfloat16, __half, uint16_t)");
    const uint16_t *u = (const uint16_t *)tile;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int r = dt_mma_b_row(lane, 2 * j), c = dt_mma_b_col(lane, 2 * j);
        b->x[j] = dt_mma_pack(u[r * ld + c], u[(r + 1) * ld + c]);
    }
}

/* B from its transpose, a row-major 8 x 16 tile (n rows, k columns): (k, n) at tile[n * ld + k],
   as a linear layer's weight [out, in] or attention's K [keys, head]: one 32-bit load a pair. */
template <typename T>
static __device__ __forceinline__ void dt_mma_load_bt(dt_mma_frag_b *b, const T *tile, int ld, int lane) {
#pragma unroll
    for (int j = 0; j < 2; j++)
        b->x[j] = dt_mma__pair(tile + dt_mma_b_col(lane, 2 * j) * ld + dt_mma_b_row(lane, 2 * j));
}

/* ---------------------------------------------------------------- ldmatrix: fragments from shared memory

   ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: the warp reads four 8 x 8 matrices of 16-bit
   elements from shared memory in one instruction. Lane 8i + r gives the address of row r of
   matrix i (8 elements, 16 bytes on a 16-byte boundary); lane l = 4g + t receives in r[i] matrix
   i's elements (g, 2t) and (g, 2t + 1), lower index in the lower half; with .trans, (2t, g) and
   (2t + 1, g): the matrix transposed. Those are the places of an mma fragment's pairs (above), so
   one ldmatrix makes two B fragments, where the loads above make them with 4 (load_bt) or 8
   (load_b) shared-memory instructions of 32 or 16 bits a lane: a 16-bit load moves half the bytes
   a 32-bit one does in the same shared-memory cycle.

   On the emulator it is a warp-collective operation like the mma: each lane reads the row at its
   address as it arrives, the rows meet at one barrier, and each lane takes its elements from the
   rows the layout names, so a lane giving the wrong row address gets the wrong elements, as on
   the GPU. A row outside shared memory or off a 16-byte boundary is reported (a GPU faults). */
#ifdef DT_CUDA_EMU
static inline void dt_mma__ldsm_emu(uint32_t r[4], const void *row, int trans, const char *file, int line) {
    const char *what =
        trans ? "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" : "ldmatrix.sync.aligned.m8n8.x4.shared.b16";
    uint16_t mine[8], all[32][8];
    int lane = dt_mma_lane(), g = lane >> 2, t = lane & 3;
    /* the lane's row, read as it arrives (so a missing barrier before it reads the NaN poison in
       every thread order), or NaN where it may not be read (reported) */
    if (dt_emu_shared_access(file, line, what, row, 16)) memcpy(mine, row, sizeof mine);
    else memset(mine, 0xff, sizeof mine);
    dt_emu_warp_gather(file, line, what, 0xffffffffu, mine, all, sizeof mine);
    for (int i = 0; i < 4; i++)
        r[i] = trans ? dt_mma_pack(all[8 * i + 2 * t][g], all[8 * i + 2 * t + 1][g])
                     : dt_mma_pack(all[8 * i + g][2 * t], all[8 * i + g][2 * t + 1]);
}
static __device__ __forceinline__ void dt_mma_ldsm_x4(uint32_t r[4], const void *row,
                                                      const char *file = __builtin_FILE(),
                                                      int line = __builtin_LINE()) {
    dt_mma__ldsm_emu(r, row, 0, file, line);
}
static __device__ __forceinline__ void dt_mma_ldsm_x4_trans(uint32_t r[4], const void *row,
                                                            const char *file = __builtin_FILE(),
                                                            int line = __builtin_LINE()) {
    dt_mma__ldsm_emu(r, row, 1, file, line);
}
#else
#define DT_MMA__LDSM(suffix)                                                                                 \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" suffix ".shared.b16 {%0,%1,%2,%3}, [%4];\n"               \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])                                            \
                 : "r"((uint32_t)__cvta_generic_to_shared(row)))
static __device__ __forceinline__ void dt_mma_ldsm_x4(uint32_t r[4], const void *row) {
#ifdef __CUDA_ARCH__
    DT_MMA__LDSM("");
#else
    (void)r, (void)row;
#endif
}
static __device__ __forceinline__ void dt_mma_ldsm_x4_trans(uint32_t r[4], const void *row) {
#ifdef __CUDA_ARCH__
    DT_MMA__LDSM(".trans");
#else
    (void)r, (void)row;
#endif
}
#undef DT_MMA__LDSM
#endif

/* ---------------------------------------------------------------- cp.async: global to shared memory

   cp.async.cg.shared.global (sm_80): dt_mma_cp_async16(dst, src) starts a 16-byte copy from
   global memory at src to shared memory at dst (both on 16-byte boundaries) that does not pass
   through the thread's registers, so a tile's next load can be in flight while the warps
   multiply the one before. dt_mma_cp_async_commit() closes the thread's group of copies;
   dt_mma_cp_async_wait<N>() returns once every group it committed, but the newest N, has landed.
   That covers the thread's own copies only: the block reads a tile after its threads' waits and
   a __syncthreads, and a tile is loaded again only after a __syncthreads that every reader of
   it has passed. On the emulator (tests/cuda_emu) the destination holds NaN from the issue until
   the thread's wait, so a read on either side of a missing barrier shows there. */
#ifdef DT_CUDA_EMU
static inline void dt_mma_cp_async16(void *dst, const void *src, const char *file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
    dt_emu_cp_async(file, line, dst, src, 16);
}
static inline void dt_mma_cp_async_commit(void) { dt_emu_cp_async_commit(); }
template <int N> static inline void dt_mma_cp_async_wait(void) { dt_emu_cp_async_wait(N); }
#else
static __device__ __forceinline__ void dt_mma_cp_async16(void *dst, const void *src) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src));
#else
    (void)dst, (void)src;
#endif
}
static __device__ __forceinline__ void dt_mma_cp_async_commit(void) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N> static __device__ __forceinline__ void dt_mma_cp_async_wait(void) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
#endif

/* Two B fragments from the transpose of a 16 x 16 B, a row-major tile in shared memory with n
   rows and k columns ((k, n) at tile[n * ld + k], as load_bt): b0 of rows 0..7, b1 of rows
   8..15. Matrix i of the ldmatrix: rows 8 (i >> 1) .., columns 8 (i & 1) ... tile and ld keep
   rows on 16-byte boundaries (ld % 8 == 0). */
template <typename T>
static __device__ __forceinline__ void dt_mma_load_bt2(dt_mma_frag_b *b0, dt_mma_frag_b *b1, const T *tile, int ld,
                                                       int lane) {
    static_assert(sizeof(T) == 2, "fragments hold 16-bit elements (__nv_bfloat16, __half, uint16_t)");
    uint32_t r[4];
    int i = lane >> 3;
    dt_mma_ldsm_x4(r, tile + ((i >> 1) * 8 + (lane & 7)) * ld + (i & 1) * 8);
    b0->x[0] = r[0], b0->x[1] = r[1], b1->x[0] = r[2], b1->x[1] = r[3];
}

/* Two B fragments from a row-major 16 x 16 tile in shared memory, k rows and n columns ((k, n)
   at tile[k * ld + n], as load_b): b0 of columns 0..7, b1 of columns 8..15, transposed on the
   way (.trans). Matrix i: rows 8 (i & 1) .., columns 8 (i >> 1) ... Rows on 16-byte boundaries. */
template <typename T>
static __device__ __forceinline__ void dt_mma_load_b2(dt_mma_frag_b *b0, dt_mma_frag_b *b1, const T *tile, int ld,
                                                      int lane) {
    static_assert(sizeof(T) == 2, "fragments hold 16-bit elements (__nv_bfloat16, __half, uint16_t)");
    uint32_t r[4];
    int i = lane >> 3;
    dt_mma_ldsm_x4_trans(r, tile + ((i & 1) * 8 + (lane & 7)) * ld + (i >> 1) * 8);
    b0->x[0] = r[0], b0->x[1] = r[1], b1->x[0] = r[2], b1->x[1] = r[3];
}

/* C or D to / from a row-major 16 x 8 f32 tile: (r, n) at tile[r * ld + n]. */
static __device__ __forceinline__ void dt_mma_load_c(dt_mma_frag_c *c, const float *tile, int ld, int lane) {
#pragma unroll
    for (int i = 0; i < 4; i++) c->x[i] = tile[dt_mma_c_row(lane, i) * ld + dt_mma_c_col(lane, i)];
}
static __device__ __forceinline__ void dt_mma_store_c(float *tile, int ld, const dt_mma_frag_c &c, int lane) {
#pragma unroll
    for (int i = 0; i < 4; i++) tile[dt_mma_c_row(lane, i) * ld + dt_mma_c_col(lane, i)] = c.x[i];
}
static __device__ __forceinline__ void dt_mma_zero_c(dt_mma_frag_c *c) {
#pragma unroll
    for (int i = 0; i < 4; i++) c->x[i] = 0.0f;
}

#endif /* DT_MMA_CUH */
