// tests/cuda_emu/k_embed_copies.cpp - kernels/dt_embed_copies.cu on the emulator: many copies in
// one launch (requests' pooled rows into a response, and back), against host loops over the
// same ranges (the CPU path of dt_embed.h copies them one by one).
#include <cuda_runtime.h>
#include <vector>
#include "dt_tensor.h"
#include "kernels/dt_kernels.h"
#include "tests/dt_test.h"
#include "k_common.h" /* k_refused */

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

/* 5 requests' rows in a 3000-element buffer (one longer than a block's stride). */
static const int NC = 5;
static const int64_t SRC_OFF[NC] = {0, 40, 41, 500, 2000}, LEN[NC] = {37, 1, 0, 1100, 999};
static const int64_t LEN_SMALL[NC] = {37, 1, 0, 150, 99}; /* DT_K_SMALL (TSan): one block per copy */

template <typename T> static void check_copies(const char *tag) {
    std::vector<T> rows(3000), resp(2200, (T)0), want = resp, back(3000, (T)0), want_back = back;
    std::vector<int64_t> soff(SRC_OFF, SRC_OFF + NC), len(LEN, LEN + NC), doff(NC);
    int64_t max_len = 0;
    for (int c = 0; c < NC; c++) {
        len[c] = ksz(LEN[c], LEN_SMALL[c]);
        if (len[c] > max_len) max_len = len[c];
    }
    char name[160];
    int64_t o = 0;
    for (size_t i = 0; i < rows.size(); i++) rows[i] = (T)(i * 2654435761u);
    for (int c = 0; c < NC; c++) {
        doff[c] = o;
        for (int64_t e = 0; e < len[c]; e++) {
            want[o + e] = rows[soff[c] + e];
            want_back[soff[c] + e] = want[o + e];
        }
        o += len[c];
    }
    T *d_a = dev(rows), *d_b = dev(resp), *d_back = dev(back);
    int64_t *d_so = dev(soff), *d_do = dev(doff), *d_len = dev(len);
    int st = dt_k_embed_copies(d_b, d_a, d_do, d_so, d_len, NC, max_len, (int)sizeof(T), NULL);
    snprintf(name, sizeof name, "embed_copies_rows_into_response_%s", tag);
    if (DT_TEST_CHECK(name, st == 0)) dt_test_equal_bytes(name, host(d_b, want.size()).data(), want.data(), want.size() * sizeof(T));
    st = dt_k_embed_copies(d_back, d_b, d_so, d_do, d_len, NC, max_len, (int)sizeof(T), NULL);
    snprintf(name, sizeof name, "embed_copies_response_back_into_rows_%s", tag);
    if (DT_TEST_CHECK(name, st == 0))
        dt_test_equal_bytes(name, host(d_back, back.size()).data(), want_back.data(), back.size() * sizeof(T));
    cudaFree(d_a); cudaFree(d_b); cudaFree(d_back); cudaFree(d_so); cudaFree(d_do); cudaFree(d_len);
}

int main(void) {
    check_copies<uint32_t>("32bit");
    check_copies<uint16_t>("16bit");
    check_copies<uint64_t>("64bit");
    check_copies<uint8_t>("bytes");
    {
        float *d = NULL;
        cudaMalloc((void **)&d, 64);
        DT_TEST_CHECK("embed_copies_elem_bytes_3_is_invalid_value",
                      dt_k_embed_copies(d, d, (const int64_t *)d, (const int64_t *)d, (const int64_t *)d, 1, 4, 3, NULL) ==
                          (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("embed_copies_negative_max_len_is_invalid_value",
                      dt_k_embed_copies(d, d, (const int64_t *)d, (const int64_t *)d, (const int64_t *)d, 1, -1, 4, NULL) ==
                          (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("embed_copies_zero_copies_is_ok", dt_k_embed_copies(d, d, NULL, NULL, NULL, 0, 0, 4, NULL) == 0);
        /* each copy reads its offsets and length, then the elements: NULL faulted in the kernel */
        const int64_t *o = (const int64_t *)d;
        k_refused("embed_copies_NULL_len_is_invalid_value", dt_k_embed_copies(d, d, o, o, NULL, 2, 4, 4, NULL));
        k_refused("embed_copies_NULL_dst_off_is_invalid_value", dt_k_embed_copies(d, d, NULL, o, o, 2, 4, 4, NULL));
        k_refused("embed_copies_NULL_src_off_is_invalid_value", dt_k_embed_copies(d, d, o, NULL, o, 2, 4, 4, NULL));
        k_refused("embed_copies_NULL_dst_is_invalid_value", dt_k_embed_copies(NULL, d, o, o, o, 2, 4, 4, NULL));
        k_refused("embed_copies_NULL_src_is_invalid_value", dt_k_embed_copies(d, NULL, o, o, o, 2, 4, 4, NULL));
        { /* max_len only sizes the grid: INT64_MAX rounds up without overflow and copies as 4 does */
            std::vector<uint32_t> h = {1, 2, 3, 4, 0, 0, 0, 0};
            std::vector<int64_t> meta = {4, 0, 4}; /* dst_off, src_off, len */
            uint32_t *b = dev(h);
            int64_t *m = dev(meta);
            int st = dt_k_embed_copies(b, b, m, m + 1, m + 2, 1, INT64_MAX, 4, NULL);
            std::vector<uint32_t> got = host(b, 8);
            dt_test_check_all("embed_copies_max_len_int64_max_copies", st == 0 && got[4] == 1 && got[7] == 4,
                              "status %d, got[4..7] %u %u %u %u (want 1 2 3 4)", st, got[4], got[5], got[6], got[7]);
            cudaFree(b); cudaFree(m);
        }
        DT_TEST_CHECK("embed_copies_max_len_0_with_NULL_is_ok", dt_k_embed_copies(NULL, NULL, NULL, NULL, NULL, 2, 0, 4, NULL) == 0);
        cudaFree(d);
    }
    return dt_test_finish();
}
