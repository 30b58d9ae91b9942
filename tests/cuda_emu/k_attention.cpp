// tests/cuda_emu/k_attention.cpp - kernels/dt_attention.cu on the emulator against dt_tensor.h's
// dt_attention_fwd / _bwd (the CPU op), and the fused forward and backward against the baseline
// kernels and the CPU op: T not a multiple of the tile, one and several heads, B 1 and 2, a head
// size over 64 (the backward's 16-row tiles); the fused backward is also the same bits twice.
// The backward launchers take their scratch from the caller (dt_cuda_scratch in dt_tensor.h): a
// missing one is an error, and neither allocates (the emulator's counters).
#include <cuda_runtime.h>
#include <vector>
#include "dt_tensor.h"
#include "kernels/dt_kernels.h"
#include "tests/dt_test.h"

/* DT_K_SMALL=1 (the ThreadSanitizer run of tests/run.sh): the small size. */
static int64_t ksz(int64_t normal, int64_t small) {
    const char *e = getenv("DT_K_SMALL");
    return e && e[0] == '1' ? small : normal;
}

static float *dev(const std::vector<float> &h) {
    float *d = NULL;
    if (cudaMalloc((void **)&d, h.size() * sizeof(float) + 4) != cudaSuccess) return NULL;
    cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    return d;
}
static std::vector<float> host(const float *d, size_t n) {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
}
static std::vector<float> rnd(size_t n, uint64_t stream, float lo, float hi) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * dt_rng_uniform(7, stream, i);
    return v;
}
static dt_tensor wrap(std::vector<float> &v, int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = v.data(); t.dtype = DT_F32; t.device = DT_CPU; t.ndim = ndim;
    t.shape[0] = a; t.shape[1] = b; t.shape[2] = c; t.shape[3] = d;
    t.numel = (int64_t)v.size();
    return t;
}

/* One shape: the CPU op and the kernels on the same random qkv / dout / initial dqkv. */
static void check(dt_ctx *ctx, const char *tag, int64_t B, int64_t T, int64_t C, int H) {
    char name[128];
    size_t nq = (size_t)(B * T * 3 * C), no = (size_t)(B * T * C), na = (size_t)(B * H * T * T);
    std::vector<float> qkv = rnd(nq, 1, -2, 2), dout = rnd(no, 2, -1, 1), dqkv0 = rnd(nq, 3, -0.5f, 0.5f);
    std::vector<float> out(no), att(na), dqkv = dqkv0;
    dt_tensor tq = wrap(qkv, 3, B, T, 3 * C, 0), to = wrap(out, 3, B, T, C, 0), ta = wrap(att, 4, B, H, T, T);
    dt_tensor tg = wrap(dout, 3, B, T, C, 0), tdq = wrap(dqkv, 3, B, T, 3 * C, 0);
    float *d_qkv = dev(qkv), *d_out = dev(std::vector<float>(no, 7.0f)), *d_att = dev(std::vector<float>(na, 7.0f));
    float *d_dout = dev(dout), *d_dqkv = dev(dqkv0), *d_fl = dev(std::vector<float>(no, 7.0f));
    float *d_lse = dev(std::vector<float>((size_t)(B * H * T), 7.0f));
    int st;
    dt_attention_fwd(ctx, &to, &ta, &tq, H);
    dt_attention_bwd(ctx, &tdq, &tg, &tq, &ta, H);

    st = dt_k_attention_fwd(d_out, d_att, d_qkv, B, T, C, H, NULL);
    snprintf(name, sizeof name, "attention_fwd_returns_0_%s", tag);
    DT_TEST_CHECK(name, st == 0);
    snprintf(name, sizeof name, "attention_fwd_out_matches_cpu_%s", tag);
    dt_test_allclose(name, host(d_out, no).data(), out.data(), no, 1e-6, 1e-5);
    snprintf(name, sizeof name, "attention_fwd_att_matches_cpu_with_zeros_above_diagonal_%s", tag);
    dt_test_allclose(name, host(d_att, na).data(), att.data(), na, 1e-7, 1e-5);

    float *d_scr = dev(std::vector<float>(na, 7.0f)); /* B*H*T*T: the baseline's; B*H*T: the fused one's */
    dt_emu_counters c0, c1;
    dt_emu_get_counters(&c0);
    st = dt_k_attention_bwd(d_dqkv, d_dout, d_qkv, d_att, B, T, C, H, d_scr, NULL);
    dt_emu_get_counters(&c1);
    snprintf(name, sizeof name, "attention_bwd_allocates_nothing_and_never_waits_%s", tag);
    if (c1.allocs == c0.allocs && c1.frees == c0.frees && c1.syncs == c0.syncs) dt_test_pass(name);
    else dt_test_fail(name, "allocs %lld, frees %lld, syncs %lld during the launch; want 0", c1.allocs - c0.allocs,
                      c1.frees - c0.frees, c1.syncs - c0.syncs);
    snprintf(name, sizeof name, "attention_bwd_dqkv_accumulates_as_cpu_%s", tag);
    if (DT_TEST_CHECK(name, st == 0)) {
        snprintf(name, sizeof name, "attention_bwd_dqkv_matches_cpu_%s", tag);
        dt_test_allclose(name, host(d_dqkv, nq).data(), dqkv.data(), nq, 1e-6, 1e-5);
    }

    st = dt_k_attention_fwd_flash(d_fl, d_lse, d_qkv, B, T, C, H, NULL);
    snprintf(name, sizeof name, "attention_fwd_flash_returns_0_%s", tag);
    DT_TEST_CHECK(name, st == 0);
    snprintf(name, sizeof name, "attention_fwd_flash_matches_baseline_kernel_%s", tag);
    dt_test_allclose(name, host(d_fl, no).data(), host(d_out, no).data(), no, 1e-6, 1e-5);
    snprintf(name, sizeof name, "attention_fwd_flash_matches_cpu_%s", tag);
    dt_test_allclose(name, host(d_fl, no).data(), out.data(), no, 1e-6, 1e-5);
    { /* lse: log sum_t2<=t exp(q.k scale), in double on the host */
        std::vector<float> want((size_t)(B * H * T));
        int64_t hs = C / H, b, t, t2, i;
        int h;
        double scale = hs ? 1.0 / sqrt((double)hs) : 0.0;
        for (b = 0; b < B; b++)
            for (h = 0; h < H; h++)
                for (t = 0; t < T; t++) {
                    double mx = -1e300, s = 0, sc[512];
                    for (t2 = 0; t2 <= t; t2++) {
                        double d = 0;
                        for (i = 0; i < hs; i++)
                            d += (double)qkv[(b * T + t) * 3 * C + h * hs + i] *
                                 qkv[(b * T + t2) * 3 * C + C + h * hs + i];
                        sc[t2] = d * scale;
                        if (sc[t2] > mx) mx = sc[t2];
                    }
                    for (t2 = 0; t2 <= t; t2++) s += exp(sc[t2] - mx);
                    want[(size_t)((b * H + h) * T + t)] = (float)(mx + log(s));
                }
        snprintf(name, sizeof name, "attention_fwd_flash_lse_is_row_logsumexp_%s", tag);
        dt_test_allclose(name, host(d_lse, want.size()).data(), want.data(), want.size(), 1e-5, 1e-5);
    }
    { /* the fused backward from the fused forward's out and lse, onto the same initial dqkv */
        float *d_fdq = dev(dqkv0), *d_fdq2 = dev(dqkv0);
        std::vector<float> base = host(d_dqkv, nq);
        dt_emu_get_counters(&c0);
        st = dt_k_attention_bwd_flash(d_fdq, d_dout, d_qkv, d_fl, d_lse, B, T, C, H, d_scr, NULL);
        dt_emu_get_counters(&c1);
        snprintf(name, sizeof name, "attention_bwd_flash_allocates_nothing_and_never_waits_%s", tag);
        if (c1.allocs == c0.allocs && c1.frees == c0.frees && c1.syncs == c0.syncs) dt_test_pass(name);
        else dt_test_fail(name, "allocs %lld, frees %lld, syncs %lld during the launch; want 0", c1.allocs - c0.allocs,
                          c1.frees - c0.frees, c1.syncs - c0.syncs);
        snprintf(name, sizeof name, "attention_bwd_flash_returns_0_%s", tag);
        if (DT_TEST_CHECK(name, st == 0)) {
            std::vector<float> got = host(d_fdq, nq);
            snprintf(name, sizeof name, "attention_bwd_flash_dqkv_matches_cpu_%s", tag);
            dt_test_allclose(name, got.data(), dqkv.data(), nq, 1e-6, 1e-5);
            snprintf(name, sizeof name, "attention_bwd_flash_dqkv_matches_baseline_kernel_%s", tag);
            dt_test_allclose(name, got.data(), base.data(), nq, 1e-6, 1e-5);
            dt_k_attention_bwd_flash(d_fdq2, d_dout, d_qkv, d_fl, d_lse, B, T, C, H, d_scr, NULL);
            snprintf(name, sizeof name, "attention_bwd_flash_same_bits_every_run_%s", tag);
            dt_test_allclose(name, host(d_fdq2, nq).data(), got.data(), nq, 0, 0);
        }
        cudaFree(d_fdq); cudaFree(d_fdq2);
    }
    cudaFree(d_qkv); cudaFree(d_out); cudaFree(d_att); cudaFree(d_dout); cudaFree(d_dqkv); cudaFree(d_fl);
    cudaFree(d_lse); cudaFree(d_scr);
}

int main(void) {
    dt_ctx ctx;
    dt_ctx_init(&ctx, NULL);
    /* T = 35 (33 small): the fused kernel's second query tile is partial and sees two key tiles */
    check(&ctx, "two_query_tiles_C8_H2", 1, ksz(35, 33), 8, 2);
    check(&ctx, "B2_T5_C6_H3", 2, 5, 6, 3);
    check(&ctx, "B2_T35_C4_H1_one_head", 2, ksz(35, 33), 4, 1);
    check(&ctx, "hs72_tile16_T20", 1, ksz(20, 18), 72, 1); /* the backward's 16-row tiles, partial */
    { /* bad arguments are statuses, never a launch */
        float *d = NULL;
        cudaMalloc((void **)&d, 64 * sizeof(float));
        DT_TEST_CHECK("attention_fwd_n_head_not_dividing_C_is_invalid_value",
                      dt_k_attention_fwd(d, d, d, 1, 2, 8, 3, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_bwd_n_head_0_is_invalid_value",
                      dt_k_attention_bwd(d, d, d, d, 1, 2, 8, 0, d, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_bwd_no_scratch_is_invalid_value",
                      dt_k_attention_bwd(d, d, d, d, 1, 2, 8, 2, NULL, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_bwd_flash_no_scratch_is_invalid_value",
                      dt_k_attention_bwd_flash(d, d, d, d, d, 1, 2, 8, 2, NULL, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_fwd_flash_head_size_over_96_is_invalid_value",
                      dt_k_attention_fwd_flash(d, NULL, d, 1, 1, 97, 1, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_fwd_flash_negative_T_is_invalid_value",
                      dt_k_attention_fwd_flash(d, NULL, d, 1, -1, 8, 2, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_bwd_flash_head_size_over_128_is_invalid_value",
                      dt_k_attention_bwd_flash(d, d, d, d, d, 1, 1, 129, 1, d, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_bwd_flash_null_lse_is_invalid_value",
                      dt_k_attention_bwd_flash(d, d, d, d, NULL, 1, 2, 8, 2, d, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("attention_bwd_flash_empty_batch_is_ok", dt_k_attention_bwd_flash(d, d, d, d, d, 0, 4, 8, 2, d, NULL) == 0);
        DT_TEST_CHECK("attention_fwd_empty_batch_is_ok", dt_k_attention_fwd(d, d, d, 0, 4, 8, 2, NULL) == 0 &&
                                                             dt_k_attention_fwd_flash(d, d, d, 0, 4, 8, 2, NULL) == 0 &&
                                                             dt_k_attention_bwd(d, d, d, d, 0, 4, 8, 2, d, NULL) == 0);
        cudaFree(d);
    }
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
