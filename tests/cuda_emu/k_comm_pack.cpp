// tests/cuda_emu/k_comm_pack.cpp - kernels/dt_comm_pack.cu on the emulator: many copies in one
// launch (bucket pack / unpack, scaled by 1 / world), and rank-major shard blocks, against host
// loops over the same ranges (the CPU path of dt_comm.h / dt_embed.h copies them one by one).
#include <cuda_runtime.h>
#include <vector>
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "kernels/dt_kernels.h"
#include "tests/dt_test.h"

/* DT_K_SMALL=1 (the ThreadSanitizer run of tests/run.sh): the small size. */
static int64_t ksz(int64_t normal, int64_t small) {
    const char *e = getenv("DT_K_SMALL");
    return e && e[0] == '1' ? small : normal;
}

template <typename T> static T *dev(const std::vector<T> &h) {
    T *d = NULL;
    if (cudaMalloc((void **)&d, h.size() * sizeof(T) + 8) != cudaSuccess) return NULL;
    if (!h.empty()) cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}
template <typename T> static std::vector<T> host(const T *d, size_t n) {
    std::vector<T> h(n);
    if (n) cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}

/* x *= a on the bits of an f32 (the scaled unpack); other widths are never scaled. */
static void scale_bits(uint32_t &x, float a) {
    float f;
    memcpy(&f, &x, 4);
    f *= a;
    memcpy(&x, &f, 4);
}
template <typename T> static void scale_bits(T &, float) {}
static void set_f32(uint32_t &x, float f) { memcpy(&x, &f, 4); }
template <typename T> static void set_f32(T &, float) {}

/* A bucket of 5 parameter ranges of a 3000-element arena (one longer than a block's stride). */
static const int NC = 5;
static const int64_t SRC_OFF[NC] = {0, 40, 41, 500, 2000}, LEN[NC] = {37, 1, 0, 1100, 999};
static const int64_t LEN_SMALL[NC] = {37, 1, 0, 150, 99}; /* DT_K_SMALL (TSan): one block per copy */

template <typename T> static void check_copies(const char *tag, int is_f32, float alpha) {
    std::vector<T> arena(3000), bucket(2200, (T)0), want = bucket, back(3000, (T)0), want_back = back;
    std::vector<int64_t> soff(SRC_OFF, SRC_OFF + NC), len(LEN, LEN + NC), doff(NC);
    int64_t max_len = 0;
    for (int c = 0; c < NC; c++) {
        len[c] = ksz(LEN[c], LEN_SMALL[c]);
        if (len[c] > max_len) max_len = len[c];
    }
    char name[160];
    int64_t o = 0;
    for (size_t i = 0; i < arena.size(); i++) {
        if (is_f32) set_f32(arena[i], dt_rng_uniform(1, 1, i) - 0.5f);
        else arena[i] = (T)(i * 2654435761u);
    }
    for (int c = 0; c < NC; c++) {
        doff[c] = o;
        for (int64_t e = 0; e < len[c]; e++) {
            T x = arena[soff[c] + e];
            if (is_f32 && alpha != 1.0f) scale_bits(x, alpha);
            want[o + e] = x;
            want_back[soff[c] + e] = want[o + e];
        }
        o += len[c];
    }
    T *d_a = dev(arena), *d_b = dev(bucket), *d_back = dev(back);
    int64_t *d_so = dev(soff), *d_do = dev(doff), *d_len = dev(len);
    int st = dt_k_comm_copies(d_b, d_a, d_do, d_so, d_len, NC, max_len, (int)sizeof(T), is_f32, alpha, NULL);
    snprintf(name, sizeof name, "comm_copies_pack_ranges_into_bucket_%s", tag);
    if (DT_TEST_CHECK(name, st == 0)) dt_test_equal_bytes(name, host(d_b, want.size()).data(), want.data(), want.size() * sizeof(T));
    st = dt_k_comm_copies(d_back, d_b, d_so, d_do, d_len, NC, max_len, (int)sizeof(T), 0, 1.0f, NULL);
    snprintf(name, sizeof name, "comm_copies_unpack_bucket_into_ranges_%s", tag);
    if (DT_TEST_CHECK(name, st == 0))
        dt_test_equal_bytes(name, host(d_back, back.size()).data(), want_back.data(), back.size() * sizeof(T));
    cudaFree(d_a); cudaFree(d_b); cudaFree(d_back); cudaFree(d_so); cudaFree(d_do); cudaFree(d_len);
}

/* [rows, cols] split by columns over W ranks: block k holds columns [k*cols/W, (k+1)*cols/W). */
template <typename T> static void check_blocks(const char *tag, int64_t rows, int64_t cols, int W) {
    std::vector<T> m(rows * cols), want(rows * cols);
    char name[160];
    int64_t y = 0;
    for (size_t i = 0; i < m.size(); i++) m[i] = (T)(i + 1);
    for (int k = 0; k < W; k++) {
        int64_t c0 = cols * k / W, c1 = cols * (k + 1) / W;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = c0; c < c1; c++) want[y++] = m[r * cols + c];
    }
    T *d_m = dev(m), *d_p = dev(std::vector<T>(m.size(), (T)0)), *d_u = dev(std::vector<T>(m.size(), (T)0));
    int st = dt_k_comm_pack_blocks(d_p, d_m, rows, cols, W, (int)sizeof(T), NULL);
    snprintf(name, sizeof name, "comm_pack_blocks_is_rank_major_%s", tag);
    if (DT_TEST_CHECK(name, st == 0)) dt_test_equal_bytes(name, host(d_p, m.size()).data(), want.data(), m.size() * sizeof(T));
    st = dt_k_comm_unpack_blocks(d_u, d_p, rows, cols, W, (int)sizeof(T), NULL);
    snprintf(name, sizeof name, "comm_unpack_blocks_inverts_pack_%s", tag);
    if (DT_TEST_CHECK(name, st == 0)) dt_test_equal_bytes(name, host(d_u, m.size()).data(), m.data(), m.size() * sizeof(T));
    cudaFree(d_m); cudaFree(d_p); cudaFree(d_u);
}

int main(void) {
    check_copies<uint32_t>("f32", 1, 1.0f);
    check_copies<uint32_t>("f32_scaled_by_1_over_4", 1, 0.25f);
    check_copies<uint16_t>("16bit", 0, 1.0f);
    check_copies<uint64_t>("64bit", 0, 1.0f);
    check_copies<uint8_t>("bytes", 0, 1.0f);
    check_blocks<uint32_t>("5x7_W3_uneven", 5, 7, 3);
    check_blocks<uint16_t>("4x3_W4_a_rank_without_columns", 4, 3, 4);
    check_blocks<uint64_t>("3x8_W2", 3, 8, 2);
    {
        float *d = NULL;
        cudaMalloc((void **)&d, 64);
        DT_TEST_CHECK("comm_copies_elem_bytes_3_is_invalid_value",
                      dt_k_comm_copies(d, d, (const int64_t *)d, (const int64_t *)d, (const int64_t *)d, 1, 4, 3, 0, 1.0f,
                                       NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("comm_copies_alpha_on_non_f32_is_invalid_value",
                      dt_k_comm_copies(d, d, (const int64_t *)d, (const int64_t *)d, (const int64_t *)d, 1, 4, 2, 0, 0.5f,
                                       NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("comm_copies_negative_max_len_is_invalid_value",
                      dt_k_comm_copies(d, d, (const int64_t *)d, (const int64_t *)d, (const int64_t *)d, 1, -1, 4, 1, 1.0f,
                                       NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("comm_pack_blocks_W_0_is_invalid_value",
                      dt_k_comm_pack_blocks(d, d, 2, 2, 0, 4, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("comm_copies_zero_copies_is_ok",
                      dt_k_comm_copies(d, d, NULL, NULL, NULL, 0, 0, 4, 1, 1.0f, NULL) == 0);
        cudaFree(d);
    }
    return dt_test_finish();
}
