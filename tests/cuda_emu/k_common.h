/* tests/cuda_emu/k_common.h - what the emulated kernel tests (tests/cuda_emu/k_*.cpp) share:
   device buffers, random inputs and CPU tensors for the reference ops of dt_tensor.h.
   The test file includes dt_tensor.h, then this; tests/run.sh links the implementations
   (tests/dt_impl.c, compiled once for the emulator, with DT_CUDA when the test defines it). */
#ifndef DT_K_COMMON_H
#define DT_K_COMMON_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include <string>
#include <vector>

#include "dt_kernels.h"
#include "dt_tensor.h"
#include "dt_test.h"

/* DT_K_SMALL=1 (the ThreadSanitizer runs): smaller inputs, big only where the case needs it. */
static inline int64_t k_size(int64_t normal, int64_t small) {
    const char *e = getenv("DT_K_SMALL");
    return e && e[0] == '1' ? small : normal;
}

/* Deterministic inputs: the same numbers in every mode, so a mode's failure is the mode's. */
static uint64_t k_rng_state = 0x2545f4914f6cdd1dull;
static inline float k_uniform(float lo, float hi) {
    k_rng_state ^= k_rng_state << 13, k_rng_state ^= k_rng_state >> 7, k_rng_state ^= k_rng_state << 17;
    return lo + (hi - lo) * (float)((k_rng_state >> 40) * (1.0 / 16777216.0));
}
static inline std::vector<float> k_random(size_t n, float lo = -2.0f, float hi = 2.0f) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = k_uniform(lo, hi);
    return v;
}

/* A device copy of host data (freed by k_free_all at the end of main). */
static std::vector<void *> k_allocs;
template <typename T> static T *k_upload(const std::vector<T> &h) {
    void *p = NULL;
    size_t bytes = h.size() * sizeof(T);
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
        exit(2);
    }
    if (bytes) cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice);
    k_allocs.push_back(p);
    return (T *)p;
}
template <typename T> static std::vector<T> k_download(const T *d, size_t n) {
    std::vector<T> h(n);
    if (n && cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy back failed\n");
        exit(2);
    }
    return h;
}
static inline void k_free_all(void) {
    for (size_t i = 0; i < k_allocs.size(); i++) cudaFree(k_allocs[i]);
    k_allocs.clear();
}

/* A CPU tensor of shape {d0, d1} (d1 = 0: 1-D) holding a copy of data. */
static inline dt_tensor k_cpu(dt_ctx *ctx, const std::vector<float> &data, int64_t d0, int64_t d1 = 0) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32;
    d.shape[0] = d0;
    d.shape[1] = d1;
    d.ndim = d1 ? 2 : 1;
    if (dt_tensor_create(ctx, &t, &d)) {
        fprintf(stderr, "dt_tensor_create: %s\n", dt_ctx_error(ctx));
        exit(2);
    }
    if (!data.empty()) memcpy(t.data, data.data(), data.size() * sizeof(float));
    return t;
}
static inline std::vector<float> k_values(const dt_tensor &t) {
    return std::vector<float>((const float *)t.data, (const float *)t.data + t.numel);
}

/* A launcher returned 0; else FAIL naming the status. */
static inline int k_ok(const char *name, int status) {
    if (status == 0) return 1;
    dt_test_fail(name, "launcher returned %d (%s)", status, dt_k_error_string(status));
    return 0;
}

/* A launcher refused its arguments (cudaErrorInvalidValue); else FAIL naming the status it gave. */
static inline int k_refused(const char *name, int status) {
    if (status == (int)cudaErrorInvalidValue) return dt_test_pass(name);
    return dt_test_fail(name, "launcher returned %d (%s); want %d (cudaErrorInvalidValue)", status,
                        dt_k_error_string(status), (int)cudaErrorInvalidValue);
}

/* ---------------------------------------------------------------- reductions: bounds and bits */

/* u = 2^-24, the unit roundoff of float; gamma(k) = k u / (1 - k u) bounds the relative error of
   k roundings in a row: a float sum of n terms in any order (a tree, chunks, then their sum)
   whose longest chain of additions is k is within gamma(k) sum|x_i| of the exact sum. */
static inline double k_gamma(double k) {
    const double u = 1.0 / 16777216.0;
    return k * u / (1.0 - k * u);
}

/* PASS iff |got[i] - want[i]| <= bound[i] for every i; the FAIL line names the first i outside
   its bound with both values, the difference and the bound, and how many were outside. */
static inline int k_within_bound(const char *name, const float *got, const float *want, const double *bound,
                                 size_t n) {
    size_t i, bad = 0, first = 0;
    for (i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= bound[i]) && bad++ == 0) first = i;
    }
    if (!bad) return dt_test_pass(name);
    return dt_test_fail(name, "%zu of %zu outside the bound; first [%zu]: got %.9g, want %.9g, |diff| %.3g > %.3g",
                        bad, n, first, (double)got[first], (double)want[first],
                        fabs((double)got[first] - (double)want[first]), bound[first]);
}

/* Runs `run` (a launch from the same inputs each time, returning its output) twice in the
   process's own thread order, then once in each of the emulator's orders (dt_emu_set_mode), and
   back: PASS iff every result has the bits of the first. A sum whose order depended on thread
   timing would differ between the serial orders. */
/* A float's bits, on the host (the device's __float_as_uint is not host code on a GPU build). */
static inline unsigned k_bits(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}

template <typename F> static int k_same_bits_in_every_order(const char *name, F run) {
    static const char *const modes[] = {"parallel", "forward", "reverse", "random:1", "random:2", "random:7"};
    std::string own = dt_emu_mode();
    std::vector<float> first = run(), again = run();
    if (again.size() != first.size() || memcmp(again.data(), first.data(), first.size() * sizeof(float)))
        return dt_test_fail(name, "two runs in the order %s differ", own.c_str());
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        dt_emu_set_mode(modes[i]);
        std::vector<float> got = run();
        dt_emu_set_mode(own.c_str());
        if (got.size() != first.size())
            return dt_test_fail(name, "order %s: %zu values, want %zu", modes[i], got.size(), first.size());
        for (size_t j = 0; j < first.size(); j++)
            if (memcmp(&got[j], &first[j], sizeof(float)))
                return dt_test_fail(name, "order %s: [%zu] = %.9g (bits 0x%08x); order %s gave %.9g (0x%08x)",
                                    modes[i], j, (double)got[j], k_bits(got[j]), own.c_str(),
                                    (double)first[j], k_bits(first[j]));
    }
    return dt_test_pass(name);
}

#ifndef DT_EMU_STUBS
/* The vector accesses (dt_k_load_vec / dt_k_store_vec) since vec0, and no emulator report since
   rep0 (no misaligned access): PASS iff exactly want. A GPU build (bench/gpu) cannot count them. */
static inline void k_check_accesses(const char *name, long long vec0, int rep0, long long want) {
    long long got = dt_emu_vector_accesses() - vec0;
    if (got == want && dt_emu_report_count() == rep0) dt_test_pass(name);
    else dt_test_fail(name, "%lld vector accesses, want %lld; %d emulator reports", got, want, dt_emu_report_count() - rep0);
}
#endif

#endif /* DT_K_COMMON_H */
