// tests/cuda_emu/k_opt.cpp - kernels/dt_opt.cu on the emulator against dt_opt.h's update math
// (dt_sgd_update / dt_adam_update / dt_adagrad_update, called per parameter on the CPU), over a
// flat arena of three parameters with different weight decays, with f32 values, bf16 values
// with f32 master weights, and bf16 / f16 values without.
#include <cuda_runtime.h>
#include <vector>
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
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
    cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}
template <typename T> static std::vector<T> host(const T *d, size_t n) {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}
static std::vector<float> rnd(size_t n, uint64_t stream, float lo, float hi) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * dt_rng_uniform(5, stream, i);
    return v;
}

/* The arena: parameters of 37, 5 and 100 elements, weight decay 0.1, 0 (no_decay), 0.01. */
static const int NSEG = 3;
static const int64_t SEG_END[NSEG] = {37, 42, 142}, N = 142;
static const double SEG_WD[NSEG] = {0.1, 0.0, 0.01};

enum { SGD, ADAM, ADAGRAD };

/* The CPU: each parameter through dt_opt.h's function, g * grad_mul first (as clipping does). */
static void cpu_step(int kind, std::vector<float> &w, std::vector<float> g, std::vector<float> &s1,
                     std::vector<float> &s2, int64_t t, float gm) {
    int i;
    for (size_t k = 0; k < g.size(); k++) if (gm != 1.0f) g[k] *= gm;
    for (i = 0; i < NSEG; i++) {
        int64_t a = i ? SEG_END[i - 1] : 0, n = SEG_END[i] - a;
        if (kind == SGD) dt_sgd_update(&w[a], &g[a], &s1[a], n, 0.05, 0.9, 0.1, SEG_WD[i], 1, t == 1);
        if (kind == ADAM) dt_adam_update(&w[a], &g[a], &s1[a], &s2[a], n, 1e-2, 0.9, 0.95, 1e-8, SEG_WD[i], 1, t);
        if (kind == ADAGRAD) dt_adagrad_update(&w[a], &g[a], &s1[a], n, 0.1, 0.01, SEG_WD[i], 1e-10, t);
    }
}

static int gpu_step(int kind, void *w, int wdt, float *master, const float *g, float *s1, float *s2, const int64_t *se,
                    const double *sw, int64_t t, float gm, const int *skip) {
    if (kind == SGD) return dt_k_sgd_update(w, wdt, master, g, s1, N, se, sw, NSEG, 0.05, 0.9, 0.1, 1, t == 1, gm, skip, NULL);
    if (kind == ADAM)
        return dt_k_adam_update(w, wdt, master, g, s1, s2, N, se, sw, NSEG, 1e-2, 0.9, 0.95, 1e-8, 1, t, gm, skip, NULL);
    return dt_k_adagrad_update(w, wdt, master, g, s1, N, se, sw, NSEG, 0.1, 0.01, 1e-10, t, gm, skip, NULL);
}

static uint16_t to16(float x, int dt) { return dt == DT_BF16 ? dt_f32_to_bf16(x) : dt_f32_to_f16(x); }
static float from16(uint16_t x, int dt) { return dt == DT_BF16 ? dt_bf16_to_f32(x) : dt_f16_to_f32(x); }

/* Three steps of `kind` with values of dtype wdt (with or without a master copy). */
static void check(int kind, int wdt, int use_master) {
    static const char *kn[] = {"sgd_update", "adam_update", "adagrad_update"};
    char tag[96], name[160];
    std::vector<int64_t> se(SEG_END, SEG_END + NSEG);
    std::vector<double> sw(SEG_WD, SEG_WD + NSEG);
    std::vector<float> w = rnd(N, 1, -1, 1), s1(N, 0.0f), s2(N, 0.0f);
    std::vector<uint16_t> w16(N);
    int64_t *d_se = dev(se), t;
    double *d_sw = dev(sw);
    float *d_s1 = dev(s1), *d_s2 = dev(s2), *d_m = NULL;
    void *d_w;
    int ok = 1;
    snprintf(tag, sizeof tag, "%s%s", wdt == DT_F32 ? "f32" : wdt == DT_BF16 ? "bf16" : "f16",
             use_master ? "_master" : "");
    if (wdt != DT_F32) { /* the values are what a 16-bit tensor can hold */
        for (int64_t i = 0; i < N; i++) { w16[i] = to16(w[i], wdt); if (!use_master) w[i] = from16(w16[i], wdt); }
        d_w = dev(w16);
    } else {
        d_w = dev(w);
    }
    if (use_master) d_m = dev(w);
    for (t = 1; t <= 3; t++) {
        float gm = t == 2 ? 0.5f : 1.0f; /* step 2 as clipped */
        std::vector<float> g = rnd(N, 10 + t, -1, 1);
        float *d_g = dev(g);
        int st = gpu_step(kind, d_w, wdt, d_m, d_g, d_s1, d_s2, d_se, d_sw, t, gm, NULL);
        ok &= st == 0;
        cpu_step(kind, w, g, s1, s2, t, gm);
        if (wdt != DT_F32 && !use_master) /* a 16-bit value without a master is rounded after each step */
            for (int64_t i = 0; i < N; i++) w[i] = from16(to16(w[i], wdt), wdt);
        cudaFree(d_g);
    }
    snprintf(name, sizeof name, "%s_3_steps_return_0_%s", kn[kind], tag);
    DT_TEST_CHECK(name, ok);
    if (wdt == DT_F32) {
        snprintf(name, sizeof name, "%s_w_matches_cpu_%s", kn[kind], tag);
        dt_test_allclose(name, host((float *)d_w, N).data(), w.data(), N, 1e-7, 1e-6);
    } else {
        std::vector<uint16_t> got = host((uint16_t *)d_w, N);
        std::vector<float> gw(N), want(N);
        for (int64_t i = 0; i < N; i++) { gw[i] = from16(got[i], wdt); want[i] = from16(to16(w[i], wdt), wdt); }
        snprintf(name, sizeof name, "%s_16bit_w_is_rounded_cpu_update_%s", kn[kind], tag);
        dt_test_allclose(name, gw.data(), want.data(), N, 1e-7, wdt == DT_BF16 ? 1e-2 : 1e-3);
    }
    if (use_master) {
        snprintf(name, sizeof name, "%s_master_matches_cpu_%s", kn[kind], tag);
        dt_test_allclose(name, host(d_m, N).data(), w.data(), N, 1e-7, 1e-6);
    }
    snprintf(name, sizeof name, "%s_state_matches_cpu_%s", kn[kind], tag);
    dt_test_allclose(name, host(d_s1, N).data(), s1.data(), N, 1e-7, 1e-6);
    if (kind == ADAM) {
        snprintf(name, sizeof name, "%s_second_moment_matches_cpu_%s", kn[kind], tag);
        dt_test_allclose(name, host(d_s2, N).data(), s2.data(), N, 1e-9, 1e-6);
    }
    { /* a step with *skip = 1 (found_inf) writes nothing */
        std::vector<int> one(1, 1);
        std::vector<float> g = rnd(N, 99, -1, 1);
        int *d_skip = dev(one);
        float *d_g = dev(g);
        size_t wb = (size_t)N * (wdt == DT_F32 ? 4 : 2);
        std::vector<unsigned char> before(wb), after(wb);
        std::vector<float> s1b = host(d_s1, N);
        cudaMemcpy(before.data(), d_w, wb, cudaMemcpyDeviceToHost);
        gpu_step(kind, d_w, wdt, d_m, d_g, d_s1, d_s2, d_se, d_sw, 4, 1.0f, d_skip);
        cudaMemcpy(after.data(), d_w, wb, cudaMemcpyDeviceToHost);
        snprintf(name, sizeof name, "%s_skip_flag_leaves_w_untouched_%s", kn[kind], tag);
        dt_test_equal_bytes(name, after.data(), before.data(), wb);
        snprintf(name, sizeof name, "%s_skip_flag_leaves_state_untouched_%s", kn[kind], tag);
        dt_test_equal_bytes(name, host(d_s1, N).data(), s1b.data(), (size_t)N * 4);
        cudaFree(d_skip); cudaFree(d_g);
    }
    cudaFree(d_se); cudaFree(d_sw); cudaFree(d_s1); cudaFree(d_s2); cudaFree(d_m); cudaFree(d_w);
}

int main(void) {
    int kind;
    /* the update kernels have no barrier: TSan (DT_K_SMALL) sees one of each kind */
    for (kind = SGD; kind <= ADAGRAD; kind++) {
        check(kind, DT_F32, 0);
        if (ksz(1, 0)) check(kind, DT_BF16, 1);
    }
    if (ksz(1, 0)) {
        check(ADAM, DT_BF16, 0);
        check(ADAGRAD, DT_F16, 0);
    }
    {
        float *d = NULL;
        cudaMalloc((void **)&d, 64);
        DT_TEST_CHECK("adam_update_t_0_is_invalid_value",
                      dt_k_adam_update(d, DT_F32, NULL, d, d, d, 4, (const int64_t *)d, (const double *)d, 1, 1e-3, 0.9,
                                       0.999, 1e-8, 1, 0, 1.0f, NULL, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("sgd_update_w_dtype_i32_is_invalid_value",
                      dt_k_sgd_update(d, DT_I32, NULL, d, d, 4, (const int64_t *)d, (const double *)d, 1, 0.1, 0, 0, 0,
                                      1, 1.0f, NULL, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("sgd_update_momentum_without_buf_is_invalid_value",
                      dt_k_sgd_update(d, DT_F32, NULL, d, NULL, 4, (const int64_t *)d, (const double *)d, 1, 0.1, 0.9,
                                      0, 0, 1, 1.0f, NULL, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("adagrad_update_no_segments_is_invalid_value",
                      dt_k_adagrad_update(d, DT_F32, NULL, d, d, 4, (const int64_t *)d, (const double *)d, 0, 0.1, 0,
                                          1e-10, 1, 1.0f, NULL, NULL) == (int)cudaErrorInvalidValue);
        cudaFree(d);
    }
    return dt_test_finish();
}
