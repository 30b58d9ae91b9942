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
#include <string.h>

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

#endif /* DT_K_COMMON_H */
