// tests/cuda_emu/k_opt.cpp - kernels/dt_opt.cu on the emulator. (1) The multi-tensor updates
// (dt_k_opt_update, one launch over a parameter table) against dt_opt.h's update math
// (dt_sgd_update / dt_adam_update / dt_adagrad_update, called per parameter on the CPU), with
// f32 values, bf16 values with f32 master weights, and bf16 / f16 values without; the clip factor
// and the skip read from device memory. (2) The grads' pass (dt_k_opt_grad_pass) and the
// decisions (dt_k_opt_finish): the unscale multiply bitwise, the sums of squares per norm class
// within the bound of their sum order, bitwise equal to a host mirror of the kernels' fixed order
// (so the same in every thread and block order the emulator runs) and across two runs, the
// inf/nan flag, the skip, the loss scaler's update and the clip factor as dt_opt_step's.
#include <math.h>
#include <float.h>
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

/* ---------------------------------------------------------------- (1) the updates */

/* The parameters: 37, 5 and 100 elements, weight decay 0.1, 0 (no_decay), 0.01, lr scale 1, 1,
   0.5 (a group of its own); they live in one arena here, each its own table entry. */
static const int NSEG = 3;
static const int64_t SEG_START[NSEG] = {0, 37, 42}, N = 142;
static const double SEG_WD[NSEG] = {0.1, 0.0, 0.01}, SEG_LRS[NSEG] = {1.0, 1.0, 0.5};

enum { SGD = 1, ADAM = 2, ADAMW = 3, ADAGRAD = 4 };

/* The CPU: each parameter through dt_opt.h's function, g * grad_mul first (as clipping does). */
static void cpu_step(int kind, std::vector<float> &w, std::vector<float> g, std::vector<float> &s1,
                     std::vector<float> &s2, int64_t t, float gm) {
    for (size_t k = 0; k < g.size(); k++) if (gm != 1.0f) g[k] *= gm;
    for (int i = 0; i < NSEG; i++) {
        int64_t a = SEG_START[i], n = (i + 1 < NSEG ? SEG_START[i + 1] : N) - a;
        double lr = SEG_LRS[i];
        if (kind == SGD) dt_sgd_update(&w[a], &g[a], &s1[a], n, 0.05 * lr, 0.9, 0.1, SEG_WD[i], 1, t == 1);
        if (kind == ADAM || kind == ADAMW)
            dt_adam_update(&w[a], &g[a], &s1[a], &s2[a], n, 1e-2 * lr, 0.9, 0.95, 1e-8, SEG_WD[i], kind == ADAMW, t);
        if (kind == ADAGRAD) dt_adagrad_update(&w[a], &g[a], &s1[a], n, 0.1 * lr, 0.01, SEG_WD[i], 1e-10, t);
    }
}

static dt_k_opt_hyper hyper(int kind, int64_t t) {
    dt_k_opt_hyper h;
    memset(&h, 0, sizeof h);
    h.kind = kind; h.t = t; h.first = t == 1;
    if (kind == SGD) { h.lr = 0.05; h.momentum = 0.9; h.dampening = 0.1; h.nesterov = 1; }
    if (kind == ADAM || kind == ADAMW) { h.lr = 1e-2; h.beta1 = 0.9; h.beta2 = 0.95; h.eps = 1e-8; }
    if (kind == ADAGRAD) { h.lr = 0.1; h.lr_decay = 0.01; h.eps = 1e-10; }
    return h;
}

/* The device table of the arena's three parameters. */
static dt_k_opt_seg *table(void *w, int wdt, float *master, float *g, float *s1, float *s2) {
    std::vector<dt_k_opt_seg> seg(NSEG);
    size_t wsz = wdt == DT_F32 ? 4 : 2;
    for (int i = 0; i < NSEG; i++) {
        int64_t a = SEG_START[i];
        memset(&seg[i], 0, sizeof seg[i]);
        seg[i].w = (unsigned char *)w + a * wsz;
        seg[i].master = master ? master + a : NULL;
        seg[i].g = g + a;
        seg[i].s0 = s1 + a;
        seg[i].s1 = s2 + a;
        seg[i].start = a;
        seg[i].wd = SEG_WD[i];
        seg[i].lr_scale = SEG_LRS[i];
        seg[i].w_dtype = wdt;
    }
    return dev(seg);
}

static uint16_t to16(float x, int dt) { return dt == DT_BF16 ? dt_f32_to_bf16(x) : dt_f32_to_f16(x); }
static float from16(uint16_t x, int dt) { return dt == DT_BF16 ? dt_bf16_to_f32(x) : dt_f16_to_f32(x); }

/* Three steps of `kind` with values of dtype wdt (with or without a master copy). */
static void check(int kind, int wdt, int use_master) {
    static const char *kn[] = {"", "sgd_update", "adam_update", "adamw_update", "adagrad_update"};
    char tag[96], name[160];
    std::vector<float> w = rnd(N, 1, -1, 1), s1(N, 0.0f), s2(N, 0.0f);
    std::vector<uint16_t> w16(N);
    float *d_s1 = dev(s1), *d_s2 = dev(s2), *d_m = NULL, *d_g = dev(std::vector<float>(N, 0.0f));
    float *d_gm = dev(std::vector<float>(1, 1.0f));
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
    dt_k_opt_seg *d_seg = table(d_w, wdt, d_m, d_g, d_s1, d_s2);
    for (int64_t t = 1; t <= 3; t++) {
        float gm = t == 2 ? 0.5f : 1.0f; /* step 2 as clipped: the factor read from device memory */
        std::vector<float> g = rnd(N, 10 + t, -1, 1);
        dt_k_opt_hyper h = hyper(kind, t);
        cudaMemcpy(d_g, g.data(), N * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemcpy(d_gm, &gm, sizeof gm, cudaMemcpyHostToDevice);
        ok &= dt_k_opt_update(d_seg, NSEG, N, &h, t == 3 ? NULL : d_gm, NULL, NULL) == 0;
        cpu_step(kind, w, g, s1, s2, t, gm);
        if (wdt != DT_F32 && !use_master) /* a 16-bit value without a master is rounded after each step */
            for (int64_t i = 0; i < N; i++) w[i] = from16(to16(w[i], wdt), wdt);
    }
    snprintf(name, sizeof name, "%s_3_steps_return_0_%s", kn[kind], tag);
    DT_TEST_CHECK(name, ok);
    /* the kernels do the CPU's float ops in its order (bitwise on the emulator: g++ contracts no
       FMA; nvcc may, so a GPU can differ in the last bit: 1e-6 relative over three steps) */
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
    if (kind == ADAM || kind == ADAMW) {
        snprintf(name, sizeof name, "%s_second_moment_matches_cpu_%s", kn[kind], tag);
        dt_test_allclose(name, host(d_s2, N).data(), s2.data(), N, 1e-9, 1e-6);
    }
    { /* a step with *skip = 1 (found_inf) writes nothing */
        std::vector<int> one(1, 1);
        std::vector<float> g = rnd(N, 99, -1, 1);
        int *d_skip = dev(one);
        size_t wb = (size_t)N * (wdt == DT_F32 ? 4 : 2);
        std::vector<unsigned char> before(wb), after(wb);
        std::vector<float> s1b = host(d_s1, N);
        dt_k_opt_hyper h = hyper(kind, 4);
        cudaMemcpy(d_g, g.data(), N * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemcpy(before.data(), d_w, wb, cudaMemcpyDeviceToHost);
        dt_k_opt_update(d_seg, NSEG, N, &h, d_gm, d_skip, NULL);
        cudaMemcpy(after.data(), d_w, wb, cudaMemcpyDeviceToHost);
        snprintf(name, sizeof name, "%s_skip_flag_leaves_w_untouched_%s", kn[kind], tag);
        dt_test_equal_bytes(name, after.data(), before.data(), wb);
        snprintf(name, sizeof name, "%s_skip_flag_leaves_state_untouched_%s", kn[kind], tag);
        dt_test_equal_bytes(name, host(d_s1, N).data(), s1b.data(), (size_t)N * 4);
        cudaFree(d_skip);
    }
    cudaFree(d_seg); cudaFree(d_s1); cudaFree(d_s2); cudaFree(d_m); cudaFree(d_w); cudaFree(d_g); cudaFree(d_gm);
}

/* ---------------------------------------------------------------- (2) the grads' pass */

/* The host mirror of the kernels' fixed order: dt_k_block_sum over 128 threads (each warp's
   butterfly, then the warps' sums through the same butterfly). a + b and b + a are the same
   double, so the butterfly's lanes agree and the order is a function of the inputs alone. */
static double mirror_warp(std::vector<double> v) {
    for (int o = 16; o > 0; o >>= 1) {
        std::vector<double> nv(32);
        for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
        v = nv;
    }
    return v[0];
}
static double mirror_block_sum(const std::vector<double> &t) { /* t: 128 threads' values */
    std::vector<double> part(32, 0.0);
    for (int w = 0; w < 4; w++) part[w] = mirror_warp(std::vector<double>(t.begin() + 32 * w, t.begin() + 32 * w + 32));
    return mirror_warp(part);
}
/* cls[c] as dt_k_opt_grad_pass computes it: block b of nb sums its chunk, thread j the elements
   lo + j, lo + j + 128, ... in order, each parameter's run apart, added to its class's sum when
   the thread leaves it; then one block adds the partials (thread j the blocks j, j + 128, ...). */
static std::vector<double> mirror_pass(const std::vector<float> &g, const std::vector<int> &seg_of,
                                       const std::vector<int> &cls_of, int n_cls) {
    int64_t n = (int64_t)g.size();
    int nb = dt_k_opt_blocks(n);
    int64_t chunk = (n + nb - 1) / nb;
    std::vector<std::vector<double>> part(nb, std::vector<double>(n_cls, 0.0));
    for (int b = 0; b < nb; b++) {
        std::vector<std::vector<double>> t(n_cls, std::vector<double>(128, 0.0));
        int64_t lo = b * chunk, hi = std::min(n, lo + chunk);
        for (int j = 0; j < 128; j++) {
            double a = 0;
            int64_t i = lo + j;
            for (; i < hi; i += 128) {
                if (i - 128 >= lo && seg_of[i] != seg_of[i - 128]) {
                    t[cls_of[i - 128]][j] += a;
                    a = 0;
                }
                a += (double)g[i] * (double)g[i];
            }
            if (lo + j < hi) t[cls_of[i - 128]][j] += a;
        }
        for (int c = 0; c < n_cls; c++) part[b][c] = mirror_block_sum(t[c]);
    }
    std::vector<double> out(n_cls);
    for (int c = 0; c < n_cls; c++) {
        std::vector<double> t(128, 0.0);
        for (int j = 0; j < 128; j++)
            for (int b = j; b < nb; b += 128) t[j] += part[b][c];
        out[c] = mirror_block_sum(t);
    }
    return out;
}

/* Parameters of the pass: four in one arena, the third in norm class 1 (summed over a comm). */
static void grad_pass_checks(void) {
    const int64_t n0 = ksz(3001, 700), sizes[4] = {n0, 17, 2 * n0 + 5, 1};
    const int NS = 4, NCLS = 2;
    int64_t n = 0;
    std::vector<dt_k_opt_seg> seg(NS);
    std::vector<int> cls_of, seg_of;
    for (int i = 0; i < NS; i++) {
        memset(&seg[i], 0, sizeof seg[i]);
        seg[i].start = n;
        seg[i].cls = i == 2;
        for (int64_t k = 0; k < sizes[i]; k++) cls_of.push_back(seg[i].cls), seg_of.push_back(i);
        n += sizes[i];
    }
    /* magnitudes 2^-5 .. 2^5 with 24 significant bits: the sums of squares round, so their order shows */
    std::vector<float> g(n);
    for (int64_t i = 0; i < n; i++)
        g[i] = (2.0f * dt_rng_uniform(7, 1, (uint64_t)i) - 1.0f) * 1024.0f * (float)ldexp(1.0, (int)((i * 7) % 11) - 5);
    float *d_g = dev(g);
    for (int i = 0; i < NS; i++) seg[i].g = d_g + seg[i].start;
    dt_k_opt_seg *d_seg = dev(seg);
    int nb = dt_k_opt_blocks(n);
    double *d_part = dev(std::vector<double>((size_t)nb * (NCLS + 1), 0.0));
    double *d_cls = dev(std::vector<double>(NCLS, 0.0));
    float *d_clsf = dev(std::vector<float>(NCLS, 0.0f));
    dt_k_opt_state st0;
    memset(&st0, 0, sizeof st0);
    st0.scale = 1024.0;
    st0.growth_tracker = 1;
    dt_k_opt_state *d_st = dev(std::vector<dt_k_opt_state>(1, st0));
    const float mul = (float)(1.0 / 1024.0);
    char name[200];

    DT_TEST_CHECK("opt_grad_pass_uses_several_blocks", nb >= 2);
    DT_TEST_CHECK("opt_grad_pass_returns_0",
                  dt_k_opt_grad_pass(d_seg, NS, n, NCLS, d_part, d_cls, d_clsf, d_st, mul, 1, NULL) == 0);
    { /* the unscale: g * mul, the CPU's float multiply */
        std::vector<float> want(g);
        for (auto &x : want) x *= mul;
        g = host(d_g, n);
        dt_test_allclose("opt_grad_pass_unscale_bitwise_cpu", g.data(), want.data(), (size_t)n, 0, 0);
    }
    std::vector<double> got = host(d_cls, NCLS), mirror = mirror_pass(g, seg_of, cls_of, NCLS);
    for (int c = 0; c < NCLS; c++) {
        /* each x * x is exact in double; a sum of m non-negative terms in any order is within
           (m - 1) 2^-53 of the exact sum, so two orders differ by at most 2 (m - 1) 2^-53 sum */
        long double exact = 0;
        double serial = 0, m = 0;
        for (int64_t i = 0; i < n; i++)
            if (cls_of[i] == c) { exact += (long double)g[i] * g[i]; serial += (double)g[i] * (double)g[i]; m++; }
        snprintf(name, sizeof name, "opt_grad_pass_class%d_sumsq_within_order_bound_of_serial_sum", c);
        dt_test_close(name, got[c], serial, 2 * (m - 1) * ldexp(1.0, -53) * (double)exact);
        snprintf(name, sizeof name, "opt_grad_pass_class%d_sumsq_equals_fixed_order_mirror_bitwise", c);
        if (!DT_TEST_CHECK(name, got[c] == mirror[c])) printf("  device %.17g, mirror %.17g\n", got[c], mirror[c]);
    }
    std::vector<float> gotf = host(d_clsf, NCLS);
    DT_TEST_CHECK("opt_grad_pass_float_copy_of_classes", gotf[0] == (float)got[0] && gotf[1] == (float)got[1]);
    { /* a second run on the same grads (multiply off): the same bits */
        dt_k_opt_grad_pass(d_seg, NS, n, NCLS, d_part, d_cls, d_clsf, d_st, 1.0f, 0, NULL);
        std::vector<double> again = host(d_cls, NCLS);
        DT_TEST_CHECK("opt_grad_pass_deterministic_across_runs", again[0] == got[0] && again[1] == got[1]);
    }
    /* the decisions: clip 0.5 of a norm far above it; dynamic scaling with tracker 1 of interval 2 */
    dt_k_opt_finish_args fa;
    memset(&fa, 0, sizeof fa);
    fa.scaling = 1; fa.dynamic = 1; fa.want_norm = 1; fa.growth_interval = 2;
    fa.clip_norm = 0.5; fa.growth_factor = 2; fa.backoff_factor = 0.5;
    DT_TEST_CHECK("opt_finish_returns_0", dt_k_opt_finish(d_st, d_cls, d_clsf, NCLS, 0, &fa, NULL) == 0);
    dt_k_opt_state st = host(d_st, 1)[0];
    double norm = sqrt(got[0] + got[1]), coef = 0.5 / (norm + 1e-6);
    dt_test_close("opt_finish_norm_is_sqrt_of_class_sum", st.grad_norm, norm, 0);
    DT_TEST_CHECK("opt_finish_clip_factor_as_dt_clip", st.grad_mul == (float)coef && coef < 1);
    DT_TEST_CHECK("opt_finish_clean_step_no_skip_step_counted", st.skip == 0 && st.step == 1 && st.skipped == 0);
    DT_TEST_CHECK("opt_finish_scale_grows_after_interval", st.scale == 2048.0 && st.growth_tracker == 0);
    /* class 1 all-reduced over its comm: the finish takes clsf[1] (here: 4x as if 4 ranks) */
    {
        std::vector<float> red(NCLS);
        red[0] = 0; red[1] = 4 * gotf[1];
        cudaMemcpy(d_clsf, red.data(), sizeof(float) * NCLS, cudaMemcpyHostToDevice);
        fa.reduced = 2;
        dt_k_opt_finish(d_st, d_cls, d_clsf, NCLS, 0, &fa, NULL);
        st = host(d_st, 1)[0];
        dt_test_close("opt_finish_reduced_class_read_from_float_copy", st.grad_norm, sqrt(got[0] + (double)red[1]), 0);
        fa.reduced = 0;
    }
    /* an inf: flagged, the step skipped, the scale backed off, the norm inf */
    {
        float inf = INFINITY;
        cudaMemcpy(d_g + sizes[0] + 3, &inf, sizeof inf, cudaMemcpyHostToDevice);
        dt_k_opt_grad_pass(d_seg, NS, n, NCLS, d_part, d_cls, d_clsf, d_st, 1.0f, 0, NULL);
        dt_k_opt_finish(d_st, d_cls, d_clsf, NCLS, 0, &fa, NULL);
        st = host(d_st, 1)[0];
        DT_TEST_CHECK("opt_grad_pass_flags_inf", st.found_inf == 1.0f);
        DT_TEST_CHECK("opt_finish_inf_skips_and_backs_off",
                      st.skip == 1 && st.skipped == 1 && st.step == 2 && st.scale == 2048.0 * 0.5 &&
                          st.grad_norm == HUGE_VAL && st.grad_mul == 1.0f);
        if (!DT_TEST_CHECK("opt_finish_inf_skip_counts", st.step == 2 && st.skipped == 1))
            printf("  step %lld skipped %lld\n", (long long)st.step, (long long)st.skipped);
    }
    DT_TEST_CHECK("opt_grad_pass_too_many_classes_is_invalid_value",
                  dt_k_opt_grad_pass(d_seg, NS, n, DT_K_OPT_MAX_CLS + 1, d_part, d_cls, d_clsf, d_st, 1.0f, 0, NULL) ==
                      (int)cudaErrorInvalidValue);
    cudaFree(d_g); cudaFree(d_seg); cudaFree(d_part); cudaFree(d_cls); cudaFree(d_clsf); cudaFree(d_st);
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
    grad_pass_checks();
    {
        float *d = NULL;
        dt_k_opt_hyper h = hyper(ADAMW, 0); /* t 0 */
        cudaMalloc((void **)&d, 64);
        DT_TEST_CHECK("opt_update_t_0_is_invalid_value",
                      dt_k_opt_update((const dt_k_opt_seg *)d, 1, 4, &h, NULL, NULL, NULL) == (int)cudaErrorInvalidValue);
        h = hyper(7, 1);
        DT_TEST_CHECK("opt_update_kind_7_is_invalid_value",
                      dt_k_opt_update((const dt_k_opt_seg *)d, 1, 4, &h, NULL, NULL, NULL) == (int)cudaErrorInvalidValue);
        h = hyper(SGD, 1);
        DT_TEST_CHECK("opt_update_no_segments_is_invalid_value",
                      dt_k_opt_update((const dt_k_opt_seg *)d, 0, 4, &h, NULL, NULL, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("opt_update_n_0_launches_nothing",
                      dt_k_opt_update(NULL, 0, 0, &h, NULL, NULL, NULL) == 0);
        cudaFree(d);
    }
    {   /* n + 2047 would overflow int64 (a negative count of blocks) */
        volatile int64_t big = INT64_MAX;
        int nb = dt_k_opt_blocks(big);
        dt_test_check_all("opt_blocks_of_int64_max_is_the_cap", nb == 2048, "got %d, want 2048", nb);
    }
    return dt_test_finish();
}
