// emu-modes: parallel forward reverse random:1 random:2 threads (threads: the emulator's host-thread path through warp gathers and barriers)
/* tests/cuda_emu/k_mma.cpp - the emulator's tensor-core and 16-bit float support: kernels/dt_mma.cuh's
   mma.sync m16n8k16 (bf16 and f16 inputs, f32 accumulators) and its fragment helpers, and the
   __nv_bfloat16 / __half conversions of tests/cuda_emu/include/cuda_bf16.h, cuda_fp16.h. Runs in
   every DT_EMU_MODE, with host threads (threads) and under TSan; the kernels (__global__, named
   here so that bench/gpu/run.sh builds this file with nvcc -x cu) are
   tests/cuda_emu/k_mma_kernels.cuh, which nvcc also builds alone (tests/run.sh group ptx:dt_mma).

   Reference: the product of the bf16 (f16) rounded inputs in double, plus C. Inside an mma the
   order and precision of the sums are unspecified on the hardware (the emulator computes the exact
   sum, rounded once), so a result is compared with a bound that holds for any order of f32
   additions: each product of two 8-bit (11-bit) significands is exact in f32, and a sum of K
   products plus C in any order of f32 additions is within
       gamma(K + 1) (sum_k |a_ik b_kj| + |c_ij|),   gamma(k) = k u / (1 - k u),  u = 2^-24
   of the exact one. A fragment in the wrong place is an error of the size of the entries (~1),
   far outside it. Bits: the same in every thread order. Conversions: bit for bit dt_tensor.h's
   dt_f32_to_bf16 / dt_f32_to_f16 and back, except NaN, which the hardware makes the canonical
   0x7fff where dt_tensor.h keeps the sign (and bf16's payload). */
#include "dt_tensor.h"
#include "k_common.h"
#include "k_mma_kernels.cuh"

#include <float.h>

/* ---------------------------------------------------------------- conversions */

/* The bits of f32 -> bf16 and -> f16 for one input, against dt_tensor.h (NaN: canonical). */
static int conv_ok(float f, unsigned *got16, unsigned *want16, int half) {
    unsigned g = half ? __half_as_ushort(__float2half(f)) : __bfloat16_as_ushort(__float2bfloat16(f));
    unsigned w = half ? dt_f32_to_f16(f) : dt_f32_to_bf16(f);
    if (f != f) w = 0x7fffu; /* the hardware's canonical NaN */
    *got16 = g, *want16 = w;
    return g == w;
}

static void check_conversion_class(const char *cls, const std::vector<float> &in) {
    for (int half = 0; half < 2; half++) {
        char name[96];
        size_t bad = 0, first = 0;
        unsigned g0 = 0, w0 = 0;
        for (size_t i = 0; i < in.size(); i++) {
            unsigned g, w;
            if (!conv_ok(in[i], &g, &w, half) && bad++ == 0) first = i, g0 = g, w0 = w;
        }
        snprintf(name, sizeof name, "%s_conversion_equals_dt_tensor_%s", half ? "f16" : "bf16", cls);
        if (!bad) dt_test_pass(name);
        else
            dt_test_fail(name, "%zu of %zu differ; first: f32 bits 0x%08x gives 0x%04x, want 0x%04x", bad, in.size(),
                         k_bits(in[first]), g0, w0);
    }
}

static float from_bits(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void check_conversions(void) {
    std::vector<float> v;
    v = k_random(1000, -1e4f, 1e4f);
    check_conversion_class("normals", v);
    /* ties: the dropped bits exactly half an ulp, the kept lowest bit even and odd (bf16: low 16
       bits 0x8000; f16 normals: low 13 bits 0x1000) */
    v.clear();
    for (unsigned e = 100; e < 140; e++)
        for (unsigned m = 0; m < 8; m++) {
            v.push_back(from_bits(e << 23 | m << 16 | 0x8000u));
            v.push_back(from_bits(1u << 31 | e << 23 | m << 13 | 0x1000u));
        }
    check_conversion_class("ties", v);
    /* f32 subnormals, and f16's subnormal range (2^-24 .. 2^-14) with its ties */
    v.clear();
    for (unsigned m = 1; m < 0x800000u; m = m * 3 + 1) v.push_back(from_bits(m)), v.push_back(-from_bits(m));
    for (int q = 0; q < 2048; q++)
        v.push_back((float)q * 0.5f / 16777216.0f), v.push_back((float)q * 0.37f / 16777216.0f);
    check_conversion_class("subnormals", v);
    v = {INFINITY, -INFINITY, 0.0f, -0.0f};
    check_conversion_class("inf_and_zero", v);
    v = {NAN, -NAN, from_bits(0x7f800001u), from_bits(0xff800001u), from_bits(0x7fc00000u), from_bits(0x7fbfffffu),
         from_bits(0xffffffffu), from_bits(0x7f8f0000u)};
    check_conversion_class("nan", v);
    /* the largest finite values and past them: bf16 rounds FLT_MAX to inf, f16 65520 and up */
    v = {FLT_MAX, -FLT_MAX, from_bits(0x7f7f7fffu), from_bits(0x7f7f8000u), 65504.0f, 65519.996f, 65520.0f, -65520.0f,
         1e5f, 3.3895314e38f};
    check_conversion_class("max_finite_overflow", v);
    /* a sweep of the whole f32 range, every step-th pattern */
    v.clear();
    unsigned step = (unsigned)k_size(65521, 4194301);
    for (uint64_t u = 0; u <= 0xffffffffull; u += step) v.push_back(from_bits((unsigned)u));
    check_conversion_class("sweep", v);

    /* back to f32: every 16-bit pattern (a half NaN: any NaN; the hardware's is canonical) */
    size_t bad_bf = 0, bad_h = 0;
    for (unsigned h = 0; h < 65536; h++) {
        float gb = __bfloat162float(__ushort_as_bfloat16((unsigned short)h)), wb = dt_bf16_to_f32((uint16_t)h);
        float gh = __half2float(__ushort_as_half((unsigned short)h)), wh = dt_f16_to_f32((uint16_t)h);
        if (k_bits(gb) != k_bits(wb)) bad_bf++;
        if (wh == wh ? k_bits(gh) != k_bits(wh) : gh == gh) bad_h++;
    }
    dt_test_check_all("bf16_to_f32_equals_dt_tensor_all_65536", bad_bf == 0, "%zu of 65536 differ", bad_bf);
    dt_test_check_all("f16_to_f32_equals_dt_tensor_all_65536", bad_h == 0, "%zu of 65536 differ", bad_h);
    /* the pair helpers put x in the low half, as the registers of a fragment */
    __nv_bfloat162 p = __floats2bfloat162_rn(1.0f, -2.0f);
    float2 q = __bfloat1622float2(p);
    DT_TEST_CHECK("bf16_pair_helpers_round_trip", q.x == 1.0f && q.y == -2.0f && __high2float(p) == -2.0f);
    __half2 hp = __floats2half2_rn(0.5f, 3.0f);
    DT_TEST_CHECK("f16_pair_helpers_round_trip", __low2float(hp) == 0.5f && __half22float2(hp).y == 3.0f);
}

/* ---------------------------------------------------------------- the layout */

/* dt_mma.cuh's layout functions against this file's reading of the PTX ISA's figures. */
static void check_layout_functions(void) {
    size_t bad = 0;
    char first[128] = "";
    for (int lane = 0; lane < 32; lane++) {
        int g = lane / 4, t = lane % 4;
        for (int e = 0; e < 16; e++) { /* e: a0..a7, b0..b3, c0..c3 */
            int i = e < 8 ? e : (e - 8) & 3, row, col, got_r, got_c;
            char m = e < 8 ? 'a' : e < 12 ? 'b' : 'c';
            if (m == 'a') {
                row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8, col = i < 4 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8;
                got_r = dt_mma_a_row(lane, i), got_c = dt_mma_a_col(lane, i);
            } else if (m == 'b') {
                row = i < 2 ? t * 2 + (i & 1) : t * 2 + (i & 1) + 8, col = g;
                got_r = dt_mma_b_row(lane, i), got_c = dt_mma_b_col(lane, i);
            } else {
                row = i < 2 ? g : g + 8, col = t * 2 + (i & 1);
                got_r = dt_mma_c_row(lane, i), got_c = dt_mma_c_col(lane, i);
            }
            if ((got_r != row || got_c != col) && bad++ == 0)
                snprintf(first, sizeof first, "lane %d %c%d at (%d, %d), the PTX ISA says (%d, %d)", lane, m, i, got_r,
                         got_c, row, col);
        }
    }
    dt_test_check_all("mma_layout_functions_match_ptx_isa", bad == 0, "%zu wrong; first: %s", bad, first);
}

/* ---------------------------------------------------------------- mma against a plain product */

/* want = A B + C in double from the rounded inputs (a, b as floats), bound as the top comment. */
static void reference(const std::vector<float> &a, const std::vector<float> &b, const std::vector<float> &c, int M,
                      int N, int K, bool bt, std::vector<float> *want, std::vector<double> *bound) {
    want->assign((size_t)M * N, 0.0f), bound->assign((size_t)M * N, 0.0);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = c[(size_t)i * N + j], mag = fabs(s);
            for (int k = 0; k < K; k++) {
                double p = (double)a[(size_t)i * K + k] * (bt ? b[(size_t)j * K + k] : b[(size_t)k * N + j]);
                s += p, mag += fabs(p);
            }
            (*want)[(size_t)i * N + j] = (float)s;
            (*bound)[(size_t)i * N + j] = k_gamma(K + 1) * mag + fabs(s) / 16777216.0; /* + want's own rounding */
        }
}

/* 16-bit inputs rounded from random floats: the bits, and their values as floats. */
static void random_16(size_t n, int f16, std::vector<uint16_t> *bits, std::vector<float> *vals) {
    std::vector<float> r = k_random(n);
    bits->resize(n), vals->resize(n);
    for (size_t i = 0; i < n; i++) {
        (*bits)[i] = f16 ? __half_as_ushort(__float2half(r[i])) : __bfloat16_as_ushort(__float2bfloat16(r[i]));
        (*vals)[i] = f16 ? dt_f16_to_f32((*bits)[i]) : dt_bf16_to_f32((*bits)[i]);
    }
}

static void check_raw(int f16) {
    char name[96];
    std::vector<uint16_t> ab, bb;
    std::vector<float> av, bv, c = k_random(16 * 8), want;
    std::vector<double> bound;
    random_16(16 * 16, f16, &ab, &av);
    random_16(16 * 8, f16, &bb, &bv);
    reference(av, bv, c, 16, 8, 16, false, &want, &bound);
    float *d_d = k_upload(std::vector<float>(16 * 8, 0.0f)), *d_c = k_upload(c);
    uint16_t *d_a = k_upload(ab), *d_b = k_upload(bb);
    snprintf(name, sizeof name, "mma_m16n8k16_%s_raw_fragments_match_product", f16 ? "f16" : "bf16");
    if (k_ok(name, k_mma_raw_launch(f16, d_d, d_a, d_b, d_c)))
        k_within_bound(name, k_download(d_d, 16 * 8).data(), want.data(), bound.data(), want.size());
}

/* The tiled kernel on [M x K] x [K x N] (or W [N x K] transposed), C starting non-zero; B's
   fragments by ldmatrix when ldsm. */
static void check_tiles(int M, int N, int K, int bt, int ldsm) {
    char name[128];
    std::vector<uint16_t> ab, bb;
    std::vector<float> av, bv, c = k_random((size_t)M * N), want;
    std::vector<double> bound;
    random_16((size_t)M * K, 0, &ab, &av);
    random_16((size_t)K * N, 0, &bb, &bv);
    reference(av, bv, c, M, N, K, bt, &want, &bound);
    __nv_bfloat16 *d_a = (__nv_bfloat16 *)k_upload(ab), *d_b = (__nv_bfloat16 *)k_upload(bb);
    float *d_c = k_upload(c);
    const char *tag = bt ? (ldsm ? "bt2_ldmatrix" : "bt") : (ldsm ? "b2_ldmatrix_trans" : "b");
    auto run = [&](int plant) {
        cudaMemcpy(d_c, c.data(), c.size() * sizeof(float), cudaMemcpyHostToDevice);
        int st = k_mma_tiles_launch(bt, plant, ldsm, d_c, d_a, d_b, M, N, K);
        std::vector<float> got = k_download(d_c, c.size());
        if (st) got.assign(c.size(), NAN);
        return got;
    };
    snprintf(name, sizeof name, "mma_tiles_%s_m%d_n%d_k%d_match_product", tag, M, N, K);
    std::vector<float> got = run(0);
    k_within_bound(name, got.data(), want.data(), bound.data(), want.size());
    snprintf(name, sizeof name, "mma_tiles_%s_same_bits_in_every_order", tag);
    k_same_bits_in_every_order(name, [&]() { return run(0); });
    /* the planted bug: lanes 1 and 5 trade A fragments (ldsm: B's row addresses); many results
       must leave the bound */
    std::vector<float> planted = run(1);
    size_t outside = 0;
    for (size_t i = 0; i < want.size(); i++) outside += !(fabs((double)planted[i] - want[i]) <= bound[i]);
    snprintf(name, sizeof name, "mma_tiles_%s_planted_fragment_bug_is_caught", tag);
    dt_test_check_all(name, outside > 0, "%zu of %zu results outside the bound with lanes 1 and 5 swapped", outside,
                      want.size());
}

/* ---------------------------------------------------------------- ldmatrix */

/* Lane l's register i as this file reads the PTX ISA's ldmatrix figure: matrix i's rows are the
   rows lanes 8i .. 8i + 7 point at; lane l = 4g + t gets (g, 2t), (g, 2t + 1), or with .trans
   (2t, g), (2t + 1, g). src [K_LDSM_ROWS x K_LDSM_COLS]; row r of matrix i starts at src +
   rows[8i + r] * K_LDSM_COLS + cols[8i + r]. */
static uint32_t ldsm_want(const std::vector<uint16_t> &src, const int *rows, const int *cols, int lane, int i,
                          int trans) {
    int g = lane / 4, t = lane % 4;
    auto at = [&](int r, int c) { return src[(size_t)rows[8 * i + r] * K_LDSM_COLS + cols[8 * i + r] + c]; };
    uint16_t lo = trans ? at(2 * t, g) : at(g, 2 * t), hi = trans ? at(2 * t + 1, g) : at(g, 2 * t + 1);
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* dt_mma_ldsm_x4 and _trans against ldsm_want, rows and columns of the four matrices scattered
   over the tile; then the bad addresses the emulator reports (a GPU faults). */
static void check_ldsm(void) {
    std::vector<uint16_t> src(K_LDSM_ROWS * K_LDSM_COLS);
    for (size_t i = 0; i < src.size(); i++) src[i] = (uint16_t)(i * 2654435761u >> 7); /* distinct enough */
    int rows[32], cols[32];
    for (int l = 0; l < 32; l++) rows[l] = (l * 7 + 3) % K_LDSM_ROWS, cols[l] = 8 * ((l * 5) % 3);
    uint16_t *d_src = k_upload(src);
    int *d_rows = k_upload(std::vector<int>(rows, rows + 32)), *d_cols = k_upload(std::vector<int>(cols, cols + 32));
    uint32_t *d_r = k_upload(std::vector<uint32_t>(128, 0u));
    for (int trans = 0; trans < 2; trans++) {
        char name[96], first[160] = "";
        size_t bad = 0;
        snprintf(name, sizeof name, "ldmatrix_x4%s_registers_match_ptx_isa", trans ? "_trans" : "");
        if (!k_ok(name, k_ldsm_launch(trans, d_r, d_src, d_rows, d_cols))) continue;
        std::vector<uint32_t> got = k_download(d_r, 128);
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) {
                uint32_t w = ldsm_want(src, rows, cols, l, i, trans);
                if (got[4 * l + i] != w && bad++ == 0)
                    snprintf(first, sizeof first, "lane %d r[%d] = 0x%08x, want 0x%08x", l, i, got[4 * l + i], w);
            }
        dt_test_check_all(name, bad == 0, "%zu of 128 registers wrong; first: %s", bad, first);
    }
#ifdef DT_EMU_STUBS
    dt_test_skip("ldmatrix_bad_addresses_are_reported", "on a GPU they are faults, not reports");
    dt_test_skip("ldmatrix_missing_barrier_is_caught", "the emulator's thread orders show it");
#else
    int before = dt_emu_report_count();
    int st = k_ldsm_launch(2, d_r, d_src, d_rows, d_cols);
    const char *rep = dt_emu_last_report();
    DT_TEST_CHECK("ldmatrix_of_global_memory_is_reported",
                  st == cudaErrorIllegalAddress && dt_emu_report_count() > before && strstr(rep, "ldmatrix") &&
                      strstr(rep, "outside shared memory"));
    before = dt_emu_report_count();
    st = k_ldsm_launch(3, d_r, d_src, d_rows, d_cols);
    rep = dt_emu_last_report();
    DT_TEST_CHECK("ldmatrix_off_a_16_byte_boundary_is_reported",
                  st == cudaErrorMisalignedAddress && dt_emu_report_count() > before && strstr(rep, "ldmatrix") &&
                      strstr(rep, "thread 5 ") && strstr(rep, "boundary"));
    /* a 64 x 16 tile, each warp reading the rows the next warp stored: exact with the barrier,
       NaN (or another thread's stale row) without it, in every thread order */
    std::vector<uint16_t> tile(64 * 16);
    for (size_t i = 0; i < tile.size(); i++) tile[i] = (uint16_t)(0x3f80u + i % 97); /* bf16 1.0 .. */
    uint16_t *d_tile = k_upload(tile);
    uint32_t *d_out = k_upload(std::vector<uint32_t>(128 * 4, 0u));
    auto run = [&](int barrier) {
        std::vector<uint32_t> out(128 * 4, 0u);
        if (k_ldsm_barrier_launch(barrier, d_out, d_tile) == 0) out = k_download(d_out, out.size());
        return out;
    };
    std::vector<uint32_t> want(128 * 4);
    for (int tid = 0; tid < 128; tid++) {
        int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
        for (int i = 0; i < 4; i++) { /* matrix i: rows 8 (i & 1) .., columns 8 (i >> 1) .. of the next warp's 16 */
            int r = ((warp + 1) & 3) * 16 + (i & 1) * 8 + g, c = (i >> 1) * 8 + 2 * t;
            want[4 * tid + i] = (uint32_t)tile[r * 16 + c] | (uint32_t)tile[r * 16 + c + 1] << 16;
        }
    }
    DT_TEST_CHECK("ldmatrix_after_a_barrier_reads_the_tile", run(1) == want);
#ifdef __SANITIZE_THREAD__
    dt_test_skip("ldmatrix_missing_barrier_is_caught", "ThreadSanitizer reports that race itself (and stops the test)");
    return;
#endif
    static const char *const modes[] = {"parallel", "forward", "reverse", "random:1", "random:2", "random:7"};
    std::string own = dt_emu_mode(), missed;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        dt_emu_set_mode(modes[m]);
        if (run(0) == want) missed += std::string(missed.empty() ? "" : ", ") + modes[m];
        dt_emu_set_mode(own.c_str());
    }
    dt_test_check_all("ldmatrix_missing_barrier_is_caught", missed.empty(),
                      "without the __syncthreads the warps read the whole tile in the order(s) %s", missed.c_str());
#endif
}

/* Part of a warp at an mma: a GPU's result is undefined, the emulator reports it. */
static void check_half_warp(void) {
#ifdef DT_EMU_STUBS
    dt_test_skip("mma_by_half_a_warp_is_reported", "on a GPU it is undefined behaviour, not a report");
    return;
#endif
    float *d = k_upload(std::vector<float>(32, 0.0f));
    int before = dt_emu_report_count();
    int st = k_mma_half_warp_launch(d);
    const char *rep = dt_emu_last_report();
    DT_TEST_CHECK("mma_by_half_a_warp_is_reported",
                  st == cudaErrorLaunchFailure && dt_emu_report_count() > before && strstr(rep, "mma.sync") &&
                      strstr(rep, "never arrive"));
}

/* ---------------------------------------------------------------- cp.async */

/* The copies land by the waits; on the emulator not before (NaN until then); bad addresses and
   copies never waited for are reported. */
static void check_cp_async(void) {
    std::vector<uint16_t> src(64 * 8 + 8), nan(512, 0xffffu);
    for (size_t i = 0; i < src.size(); i++) src[i] = (uint16_t)(0x3f80u + i % 251);
    std::vector<uint16_t> whole(src.begin(), src.begin() + 512), half(whole);
    for (size_t i = 256; i < 512; i++) half[i] = 0xffffu;
    uint16_t *d_src = k_upload(src), *d_out = k_upload(std::vector<uint16_t>(2048, 0u));
    if (k_ok("cp_async_runs", k_cp_async_launch(0, d_out, d_src))) {
        std::vector<uint16_t> got = k_download(d_out, 1024);
        DT_TEST_CHECK("cp_async_all_landed_after_wait_0",
                      std::vector<uint16_t>(got.begin() + 512, got.end()) == whole);
#ifndef DT_EMU_STUBS /* on a GPU the newest group may have landed before its wait too */
        DT_TEST_CHECK("cp_async_wait_1_leaves_the_newest_group_in_flight_nan",
                      std::vector<uint16_t>(got.begin(), got.begin() + 512) == half);
#endif
    }
#ifdef DT_EMU_STUBS
    dt_test_skip("cp_async_misuse_is_reported", "on a GPU these are faults or races, not reports");
#else
    if (k_ok("cp_async_read_before_the_wait_runs", k_cp_async_launch(1, d_out, d_src)))
        DT_TEST_CHECK("cp_async_read_before_the_wait_is_nan", k_download(d_out, 512) == nan);
    struct { int mode; cudaError_t st; const char *name, *says; } bad[] = {
        {2, cudaErrorMisalignedAddress, "cp_async_misaligned_source_is_reported", "not on a boundary"},
        {3, cudaErrorIllegalAddress, "cp_async_to_global_memory_is_reported", "outside shared memory"},
        {4, cudaErrorLaunchFailure, "cp_async_never_waited_for_is_reported", "never waited for"},
    };
    for (auto &c : bad) {
        int before = dt_emu_report_count();
        int st = k_cp_async_launch(c.mode, d_out, d_src);
        const char *rep = dt_emu_last_report();
        dt_test_check_all(c.name, st == c.st && dt_emu_report_count() > before && strstr(rep, "cp.async") &&
                                      strstr(rep, c.says),
                          "status %d (want %d), report: %s", st, (int)c.st, rep);
    }
#endif
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    check_conversions();
    check_layout_functions();
    check_raw(0);
    check_raw(1);
    for (int ldsm = 0; ldsm < 2; ldsm++) {
        check_tiles(k_size(64, 32), 32, k_size(64, 32), 0, ldsm);
        check_tiles(k_size(64, 32), 32, k_size(64, 32), 1, ldsm);
    }
    check_ldsm();
    check_cp_async();
    check_half_warp();
    k_free_all();
    return dt_test_finish();
}
