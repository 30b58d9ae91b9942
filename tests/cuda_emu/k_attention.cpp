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

/* dt_k_attention_block_fwd / _bwd (one ring step of context parallelism) against the CPU's
   dt_attention_block_fwd / _bwd on the same operands: out and lse merged into a random state
   (rows with a held value and rows still at -inf), the gradients added to random ones; within
   1e-5 + 1e-5 |ref| (the kernel sums in key order one row per thread, the CPU through GEMMs). */
static double worst_of(const std::vector<float> &got, const std::vector<float> &want, double abs_, double rel,
                       size_t *at) {
    double w = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double e = fabs((double)got[i] - (double)want[i]) / (abs_ + rel * fabs((double)want[i]));
        if (!(e <= w)) { w = e; *at = i; }
    }
    return w;
}
static void check_block(dt_ctx *ctx, const char *tag, int64_t B, int H, int Hkv, int64_t hs, int64_t Tq, int64_t Tk,
                        int64_t q_row, int64_t q_rows, int64_t q_pos, int64_t k_row, int64_t k_rows, int64_t k_pos) {
    char name[160];
    int64_t Wq = (H + 2 * Hkv) * hs + 3, Wkv = 2 * Hkv * hs, C = H * hs; /* Wq: q rows wider than H hs */
    size_t nq = (size_t)(B * Tq * Wq), nk = (size_t)(B * Tk * Wkv), no = (size_t)(B * Tq * C), nl = (size_t)(B * H * Tq);
    std::vector<float> q = rnd(nq, 11, -1, 1), kv = rnd(nk, 12, -1, 1), out = rnd(no, 13, -1, 1), lse(nl);
    std::vector<float> dout = rnd(no, 14, -1, 1), dq = rnd(nq, 15, -0.5f, 0.5f), dkv = rnd(nk, 16, -0.5f, 0.5f);
    for (size_t i = 0; i < nl; i++) lse[i] = i % 3 ? 0.5f + dt_rng_uniform(7, 17, i) : -INFINITY;
    for (size_t i = 0; i < nl; i++) /* a row at -inf holds nothing yet: its out is 0, as the contract says */
        if (lse[i] == -INFINITY) {
            int64_t bh = (int64_t)i / Tq, t = (int64_t)i % Tq, b = bh / H, h = bh % H;
            for (int64_t c = 0; c < hs; c++) out[(size_t)((b * Tq + t) * C + h * hs + c)] = 0.0f;
        }
    float *d_q = dev(q), *d_kv = dev(kv), *d_out = dev(out), *d_lse = dev(lse), *d_dout = dev(dout), *d_dq = dev(dq),
          *d_dkv = dev(dkv);
    std::vector<float> c_out = out, c_lse = lse, c_dq = dq, c_dkv = dkv;
    dt_tensor tq = wrap(q, 3, B, Tq, Wq, 0), tk = wrap(kv, 3, B, Tk, Wkv, 0), to = wrap(c_out, 3, B, Tq, C, 0);
    dt_tensor tl = wrap(c_lse, 3, B, H, Tq, 0), tg = wrap(dout, 3, B, Tq, C, 0), tdq = wrap(c_dq, 3, B, Tq, Wq, 0);
    dt_tensor tdk = wrap(c_dkv, 3, B, Tk, Wkv, 0);
    dt_attn_block d;
    dt_k_attn_block a;
    size_t at = 0;
    double w;
    memset(&d, 0, sizeof d);
    d.n_head = H; d.n_kv_head = Hkv; d.q_row = q_row; d.q_rows = q_rows; d.q_pos = q_pos;
    d.k_row = k_row; d.k_rows = k_rows; d.k_pos = k_pos;
    a.B = B; a.Tq = Tq; a.Wq = Wq; a.Tk = Tk; a.Wkv = Wkv; a.hs = hs; a.H = H; a.Hkv = Hkv;
    a.q_row = q_row; a.q_rows = q_rows; a.q_pos = q_pos; a.k_row = k_row; a.k_rows = k_rows; a.k_pos = k_pos;
    if (dt_attention_block_fwd(ctx, &to, &tl, &tq, &tk, &d) ||
        dt_attention_block_bwd(ctx, &tdq, &tdk, &tg, &tq, &tk, &to, &tl, &d)) {
        dt_test_fail("block_cpu_reference_runs", "%s", dt_ctx_error(ctx));
        return;
    }
    snprintf(name, sizeof name, "block_fwd_returns_0_%s", tag);
    DT_TEST_CHECK(name, dt_k_attention_block_fwd(d_out, d_lse, d_q, d_kv, &a, NULL) == 0);
    w = worst_of(host(d_out, no), c_out, 1e-5, 1e-5, &at);
    snprintf(name, sizeof name, "block_fwd_out_equals_cpu_%s", tag);
    dt_test_expect(name, w <= 1, "element %zu: %.9g, cpu %.9g", at, host(d_out, no)[at], c_out[at]);
    w = worst_of(host(d_lse, nl), c_lse, 1e-5, 1e-5, &at);
    snprintf(name, sizeof name, "block_fwd_lse_equals_cpu_%s", tag);
    dt_test_expect(name, w <= 1 || (c_lse[at] == -INFINITY && host(d_lse, nl)[at] == -INFINITY),
                   "element %zu: %.9g, cpu %.9g", at, host(d_lse, nl)[at], c_lse[at]);
    /* the backward from the CPU's final out and lse (the same on both sides) */
    cudaMemcpy(d_out, c_out.data(), no * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_lse, c_lse.data(), nl * sizeof(float), cudaMemcpyHostToDevice);
    snprintf(name, sizeof name, "block_bwd_returns_0_%s", tag);
    DT_TEST_CHECK(name, dt_k_attention_block_bwd(d_dq, d_dkv, d_dout, d_q, d_kv, d_out, d_lse, &a, NULL) == 0);
    w = worst_of(host(d_dq, nq), c_dq, 1e-5, 1e-5, &at);
    snprintf(name, sizeof name, "block_bwd_dq_equals_cpu_%s", tag);
    dt_test_expect(name, w <= 1, "element %zu: %.9g, cpu %.9g", at, host(d_dq, nq)[at], c_dq[at]);
    w = worst_of(host(d_dkv, nk), c_dkv, 1e-5, 1e-5, &at);
    snprintf(name, sizeof name, "block_bwd_dkv_equals_cpu_%s", tag);
    dt_test_expect(name, w <= 1, "element %zu: %.9g, cpu %.9g", at, host(d_dkv, nk)[at], c_dkv[at]);
    cudaFree(d_q); cudaFree(d_kv); cudaFree(d_out); cudaFree(d_lse); cudaFree(d_dout); cudaFree(d_dq); cudaFree(d_dkv);
}

/* A launcher's refusal: cudaErrorInvalidValue, before anything launches. */
static void refused(const char *name, int st) {
    if (st == (int)cudaErrorInvalidValue) dt_test_pass(name);
    else dt_test_fail(name, "launcher returned %d; want %d (cudaErrorInvalidValue)", st, (int)cudaErrorInvalidValue);
}

int main(void) {
    dt_ctx ctx;
    dt_ctx_init(&ctx, NULL);
    /* T = 35 (33 small): the fused kernel's second query tile is partial and sees two key tiles */
    check(&ctx, "two_query_tiles_C8_H2", 1, ksz(35, 33), 8, 2);
    check(&ctx, "B2_T5_C6_H3", 2, 5, 6, 3);
    check(&ctx, "B2_T35_C4_H1_one_head", 2, ksz(35, 33), 4, 1);
    check(&ctx, "hs72_tile16_T20", 1, ksz(20, 18), 72, 1); /* the backward's 16-row tiles, partial */
    /* the blocks of a ring: the diagonal, a whole block below it, one above (a no-op), an offset
       that cuts the block, grouped-query heads, rows inside larger tensors */
    check_block(&ctx, "diagonal_B2_H2", 2, 2, 2, 4, 8, 8, 0, 8, 16, 0, 8, 16);
    check_block(&ctx, "whole_below_gqa_H4_K2", 1, 4, 2, 4, 8, 8, 4, 4, 40, 0, 8, 8);
    check_block(&ctx, "above_is_noop_K1", 1, 4, 1, 4, 8, 8, 0, 4, 0, 2, 4, 20);
    check_block(&ctx, "cut_by_the_mask_rows_inside", 2, 3, 3, 5, 10, 12, 3, 6, 7, 2, 9, 5);
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
        {
            dt_k_attn_block a;
            memset(&a, 0, sizeof a);
            a.B = 1; a.Tq = 4; a.Wq = 24; a.Tk = 4; a.Wkv = 16; a.hs = 4; a.H = 4; a.Hkv = 3; a.q_rows = 4; a.k_rows = 4;
            DT_TEST_CHECK("block_fwd_kv_heads_not_dividing_is_invalid_value",
                          dt_k_attention_block_fwd(d, d, d, d, &a, NULL) == (int)cudaErrorInvalidValue);
            a.Hkv = 2; a.q_row = 1;
            DT_TEST_CHECK("block_bwd_rows_past_the_tensor_is_invalid_value",
                          dt_k_attention_block_bwd(d, d, d, d, d, d, d, &a, NULL) == (int)cudaErrorInvalidValue);
            /* sums and products past int64 or the grids' int: refused before they are formed
               (q_row + q_rows wrapped negative and passed; B H Tq rows past 2^31 made a grid that
               covers a fraction of them) */
            a.q_row = INT64_MAX; a.q_rows = 2;
            refused("block_fwd_q_row_plus_rows_past_int64_is_invalid_value", dt_k_attention_block_fwd(d, d, d, d, &a, NULL));
            a.q_row = 0; a.q_rows = 4; a.B = (int64_t)1 << 31;
            refused("block_fwd_rows_past_int_is_invalid_value", dt_k_attention_block_fwd(d, d, d, d, &a, NULL));
            a.B = 1; a.hs = INT64_MAX / 4; a.Wq = INT64_MAX; a.Wkv = 0;
            refused("block_fwd_head_size_past_int64_is_invalid_value", dt_k_attention_block_fwd(d, d, d, d, &a, NULL));
            /* a valid block, a NULL tensor the kernels read or write: refused (it faulted inside) */
            a.hs = 4; a.H = 2; a.Hkv = 2; a.Wq = 8; a.Wkv = 16; a.Tq = a.Tk = 2; a.q_rows = a.k_rows = 2; a.q_pos = 1;
            refused("block_fwd_NULL_lse_is_invalid_value", dt_k_attention_block_fwd(d, NULL, d, d, &a, NULL));
            refused("block_fwd_NULL_kv_is_invalid_value", dt_k_attention_block_fwd(d, d, d, NULL, &a, NULL));
            refused("block_bwd_NULL_dout_is_invalid_value", dt_k_attention_block_bwd(d, d, NULL, d, d, d, d, &a, NULL));
            refused("block_bwd_dkv_only_NULL_q_is_invalid_value", dt_k_attention_block_bwd(NULL, d, d, NULL, d, d, d, &a, NULL));
            DT_TEST_CHECK("block_bwd_no_gradients_with_NULL_inputs_is_ok",
                          dt_k_attention_block_bwd(NULL, NULL, NULL, NULL, NULL, NULL, NULL, &a, NULL) == 0);
        }
        /* B 1, T 2, C 8, 2 heads: fits d; each pointer the launch reads or writes, NULL */
        refused("attention_fwd_NULL_att_is_invalid_value", dt_k_attention_fwd(d, NULL, d, 1, 2, 8, 2, NULL));
        refused("attention_fwd_NULL_qkv_is_invalid_value", dt_k_attention_fwd(d, d, NULL, 1, 2, 8, 2, NULL));
        refused("attention_fwd_NULL_out_is_invalid_value", dt_k_attention_fwd(NULL, d, d, 1, 2, 8, 2, NULL));
        refused("attention_bwd_NULL_dout_is_invalid_value", dt_k_attention_bwd(d, NULL, d, d, 1, 2, 8, 2, d, NULL));
        refused("attention_bwd_NULL_att_is_invalid_value", dt_k_attention_bwd(d, d, d, NULL, 1, 2, 8, 2, d, NULL));
        refused("attention_fwd_flash_NULL_qkv_is_invalid_value", dt_k_attention_fwd_flash(d, NULL, NULL, 1, 2, 8, 2, NULL));
        refused("attention_fwd_flash_NULL_out_is_invalid_value", dt_k_attention_fwd_flash(NULL, NULL, d, 1, 2, 8, 2, NULL));
        DT_TEST_CHECK("attention_bwd_NULL_dqkv_is_ok", dt_k_attention_bwd(NULL, NULL, NULL, NULL, 1, 2, 8, 2, NULL, NULL) == 0);
        refused("attention_fwd_B_times_T_past_int64_is_invalid_value",
                  dt_k_attention_fwd(d, d, d, (int64_t)1 << 33, (int64_t)1 << 33, 8, 2, NULL));
        refused("attention_fwd_elements_past_int64_is_invalid_value",
                  dt_k_attention_fwd(d, d, d, 1, 2, INT64_MAX - 1, 1, NULL));
        DT_TEST_CHECK("attention_fwd_empty_batch_is_ok", dt_k_attention_fwd(d, d, d, 0, 4, 8, 2, NULL) == 0 &&
                                                             dt_k_attention_fwd_flash(d, d, d, 0, 4, 8, 2, NULL) == 0 &&
                                                             dt_k_attention_bwd(d, d, d, d, 0, 4, 8, 2, d, NULL) == 0);
        cudaFree(d);
    }
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
