/* tests/cuda_emu/k_reduce.cpp - kernels/dt_reduce.cu (layernorm) on the CUDA emulator against
   dt_tensor.h's CPU ops on random inputs, in every DT_EMU_MODE and under TSan. The row kernels
   sum in a different order than the CPU (trees of warps), so values agree to a relative 1e-5.
   The dw/db column sums are two-stage (chunks of 64 rows, then the chunks' partials): compared
   with the CPU's row-order sum within a bound derived from both orders, with the exact sum within
   the two-stage bound alone, and bit for bit across runs and thread orders. */
#include "dt_tensor.h"
#include "k_common.h"

static dt_ctx ctx;

static void check_layernorm_bwd(const char *tag, int64_t R, int64_t C, float *d_x, float *d_w, float *d_mean,
                                float *d_rstd, float *d_dout, float *d_dx, float *d_dw, float *d_db, dt_tensor *tx,
                                dt_tensor *tw, dt_tensor *tmean, dt_tensor *trstd, dt_tensor *tdout, dt_tensor *tdx,
                                dt_tensor *tdw, dt_tensor *tdb);

/* Forward and backward on [R, C] against the CPU. with_b: bias and saved statistics; grads
   start non-zero (the kernels add). */
static void check_layernorm(const char *tag, int64_t R, int64_t C, int with_b) {
    char name[128];
    std::vector<float> x = k_random(R * C, -3, 3), w = k_random(C), b = k_random(C), dout = k_random(R * C);
    std::vector<float> dx0 = k_random(R * C), dw0 = k_random(C), db0 = k_random(C);
    for (int64_t i = 0; i < C; i++) x[i] = 3.0f + 1e-3f * (float)i; /* a row with a large mean: two passes matter */
    float *d_x = k_upload(x), *d_w = k_upload(w), *d_b = k_upload(b), *d_out = k_upload(std::vector<float>(R * C, 0));
    float *d_mean = k_upload(std::vector<float>(R, 0)), *d_rstd = k_upload(std::vector<float>(R, 0));
    float *d_dout = k_upload(dout), *d_dx = k_upload(dx0), *d_dw = k_upload(dw0), *d_db = k_upload(db0);
    dt_tensor t_x = k_cpu(&ctx, x, R, C), t_w = k_cpu(&ctx, w, C), t_b = k_cpu(&ctx, b, C);
    dt_tensor t_out = k_cpu(&ctx, std::vector<float>(R * C, 0), R, C), t_mean = k_cpu(&ctx, std::vector<float>(R, 0), R);
    dt_tensor t_rstd = k_cpu(&ctx, std::vector<float>(R, 0), R), t_dout = k_cpu(&ctx, dout, R, C);
    dt_tensor t_dx = k_cpu(&ctx, dx0, R, C), t_dw = k_cpu(&ctx, dw0, C), t_db = k_cpu(&ctx, db0, C);
    const float eps = 1e-5f;

    dt_layernorm_fwd(&ctx, &t_out, &t_mean, &t_rstd, &t_x, &t_w, with_b ? &t_b : NULL, eps);
    snprintf(name, sizeof name, "layernorm_fwd_matches_cpu_%s", tag);
#ifndef DT_EMU_STUBS
    long long vec0 = dt_emu_vector_accesses();
    int rep0 = dt_emu_report_count();
#endif
    int st = dt_k_layernorm_fwd(d_out, with_b ? d_mean : NULL, with_b ? d_rstd : NULL, d_x, d_w, with_b ? d_b : NULL, eps, R,
                                C, NULL);
#ifndef DT_EMU_STUBS
    /* rows of a multiple of 4 floats go by 16-byte loads, others one float at a time: no misaligned access */
    snprintf(name, sizeof name, "layernorm_fwd_loads_by_16_bytes_iff_c_is_a_multiple_of_4_%s", tag);
    if (!DT_TEST_CHECK(name, (dt_emu_vector_accesses() > vec0) == (C % 4 == 0) && dt_emu_report_count() == rep0))
        printf("  %lld vector accesses, %d reports\n", dt_emu_vector_accesses() - vec0, dt_emu_report_count() - rep0);
    snprintf(name, sizeof name, "layernorm_fwd_matches_cpu_%s", tag);
#endif
    if (k_ok(name, st)) {
        std::vector<float> got = k_download(d_out, R * C), want = k_values(t_out);
        if (with_b) { /* the statistics too, after the outputs */
            std::vector<float> m = k_download(d_mean, R), s = k_download(d_rstd, R);
            got.insert(got.end(), m.begin(), m.end()), got.insert(got.end(), s.begin(), s.end());
            want.insert(want.end(), (float *)t_mean.data, (float *)t_mean.data + R);
            want.insert(want.end(), (float *)t_rstd.data, (float *)t_rstd.data + R);
        }
        dt_test_allclose(name, got.data(), want.data(), got.size(), 1e-5, 1e-5);
    }
    if (with_b) check_layernorm_bwd(tag, R, C, d_x, d_w, d_mean, d_rstd, d_dout, d_dx, d_dw, d_db, &t_x, &t_w, &t_mean,
                                    &t_rstd, &t_dout, &t_dx, &t_dw, &t_db);
    dt_tensor *all[] = {&t_x, &t_w, &t_b, &t_out, &t_mean, &t_rstd, &t_dout, &t_dx, &t_dw, &t_db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_free(&ctx, all[i]);
}

static void check_layernorm_bwd(const char *tag, int64_t R, int64_t C, float *d_x, float *d_w, float *d_mean,
                                float *d_rstd, float *d_dout, float *d_dx, float *d_dw, float *d_db, dt_tensor *tx,
                                dt_tensor *tw, dt_tensor *tmean, dt_tensor *trstd, dt_tensor *tdout, dt_tensor *tdx,
                                dt_tensor *tdw, dt_tensor *tdb) {
    char name[128];
    dt_tensor &t_mean = *tmean, &t_rstd = *trstd, &t_dx = *tdx;
    /* the backward from the CPU's saved statistics, so only the backward is compared */
    cudaMemcpy(d_mean, t_mean.data, R * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_rstd, t_rstd.data, R * sizeof(float), cudaMemcpyHostToDevice);
    dt_layernorm_bwd(&ctx, &t_dx, tdw, tdb, tdout, tx, tw, &t_mean, &t_rstd);
    snprintf(name, sizeof name, "layernorm_bwd_dx_accumulates_like_cpu_%s", tag);
    if (k_ok(name, dt_k_layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, R, C, NULL, NULL)))
        dt_test_allclose(name, k_download(d_dx, R * C).data(), (float *)t_dx.data, R * C, 1e-5, 1e-5);
    /* dw and db (added to here too): check_dwdb, against their derived bounds */
    DT_TEST_CHECK("layernorm_fwd_eps_zero_is_invalid_value",
                  dt_k_layernorm_fwd(d_dx, NULL, NULL, d_x, d_w, NULL, 0.0f, R, C, NULL) == cudaErrorInvalidValue);
    DT_TEST_CHECK("layernorm_bwd_without_mean_is_invalid_value",
                  dt_k_layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, NULL, d_rstd, R, C, NULL, NULL) ==
                      cudaErrorInvalidValue);
}

/* dw and db over R rows (several chunks of 64, the last one short) and C columns (C > 256: two
   blocks of columns), dx left out. The bound: the terms t_r = (x - m) s g are computed alike on
   both sides (the same three roundings; a GPU's contracted multiply-add is one rounding fewer,
   the +1 below). The CPU adds R terms into dw0 in row order: R additions in a chain. The kernel
   adds a chunk's rows (at most 63 additions), then the chunks' partials (nchunks - 1), then the
   total into dw0 (1): k = 63 + (nchunks - 1) + 1 + 1. So, with S = |dw0| + sum|t_r|,
       |gpu - exact| <= gamma(k) S,   |cpu - exact| <= gamma(R + 1) S,
       |gpu - cpu| <= (gamma(k) + gamma(R + 1)) S;
   the exact sum (in double: R + 1 terms, off by R 2^-53 S at most, nothing against these) must
   be within gamma(k) S of the kernel's. */
static void check_dwdb(const char *tag, int64_t R, int64_t C) {
    char name[128];
    const int64_t chunk = 64, nchunks = (R + chunk - 1) / chunk;
    std::vector<float> x = k_random(R * C, -3, 3), dout = k_random(R * C), dw0 = k_random(C), db0 = k_random(C);
    std::vector<float> mean(R), rstd(R);
    for (int64_t r = 0; r < R; r++) mean[r] = k_uniform(-0.5f, 0.5f), rstd[r] = k_uniform(0.5f, 2.0f);
    float *d_x = k_upload(x), *d_dout = k_upload(dout), *d_mean = k_upload(mean), *d_rstd = k_upload(rstd);
    float *d_w = k_upload(std::vector<float>(C, 1.0f)), *d_dw = k_upload(dw0), *d_db = k_upload(db0);
    size_t bytes = dt_k_layernorm_bwd_scratch(R, C);
    float *d_part = bytes ? k_upload(std::vector<float>(bytes / sizeof(float), 0)) : NULL;
    dt_tensor t_x = k_cpu(&ctx, x, R, C), t_dout = k_cpu(&ctx, dout, R, C);
    dt_tensor t_w = k_cpu(&ctx, std::vector<float>(C, 1.0f), C);
    dt_tensor t_mean = k_cpu(&ctx, mean, R), t_rstd = k_cpu(&ctx, rstd, R), t_dw = k_cpu(&ctx, dw0, C);
    dt_tensor t_db = k_cpu(&ctx, db0, C);

    /* one chunk: stage 1 adds into dw / db itself, no scratch */
    const size_t want_bytes = nchunks > 1 ? (size_t)(2 * nchunks * C) * sizeof(float) : 0;
    snprintf(name, sizeof name, "layernorm_bwd_scratch_is_two_floats_per_column_and_chunk_%s", tag);
    if (bytes == want_bytes) dt_test_pass(name);
    else dt_test_fail(name, "dt_k_layernorm_bwd_scratch(%lld, %lld) = %zu, want %zu", (long long)R, (long long)C,
                      bytes, want_bytes);
    if (nchunks > 1) {
        snprintf(name, sizeof name, "layernorm_bwd_dw_without_scratch_is_invalid_value_%s", tag);
        DT_TEST_CHECK(name, dt_k_layernorm_bwd(NULL, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, R, C, NULL, NULL) ==
                                cudaErrorInvalidValue);
    }

    dt_layernorm_bwd(&ctx, NULL, &t_dw, &t_db, &t_dout, &t_x, &t_w, &t_mean, &t_rstd);
    /* S and the exact sums, per output: dw then db */
    std::vector<double> S(2 * C), exact(2 * C), bound_cpu(2 * C), bound_exact(2 * C);
    std::vector<float> want = k_values(t_dw), exact_f(2 * C);
    want.insert(want.end(), (float *)t_db.data, (float *)t_db.data + C);
    for (int64_t c = 0; c < C; c++) {
        double sw = fabs((double)dw0[c]), sb = fabs((double)db0[c]), ew = dw0[c], eb = db0[c];
        for (int64_t r = 0; r < R; r++) {
            float g = dout[r * C + c], t = (x[r * C + c] - mean[r]) * rstd[r] * g;
            sw += fabs((double)t), ew += t;
            sb += fabs((double)g), eb += g;
        }
        S[c] = sw, S[C + c] = sb, exact[c] = ew, exact[C + c] = eb;
    }
    const double k = (double)((R < chunk ? R : chunk) - 1) + (double)(nchunks - 1) + 1 + 1;
    for (int64_t i = 0; i < 2 * C; i++) {
        bound_cpu[i] = (k_gamma(k) + k_gamma((double)R + 1)) * S[i];
        bound_exact[i] = k_gamma(k) * S[i] + fabs(exact[i] - (double)(float)exact[i]);
        exact_f[i] = (float)exact[i];
    }
    auto run = [&]() {
        cudaMemcpy(d_dw, dw0.data(), C * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemcpy(d_db, db0.data(), C * sizeof(float), cudaMemcpyHostToDevice);
        int st = dt_k_layernorm_bwd(NULL, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, R, C, d_part, NULL);
        std::vector<float> got = k_download(d_dw, C), gb = k_download(d_db, C);
        got.insert(got.end(), gb.begin(), gb.end());
        if (st) got.assign(2 * C, NAN);
        return got;
    };
    snprintf(name, sizeof name, "layernorm_bwd_dw_db_match_cpu_within_derived_bound_%s", tag);
    std::vector<float> got = run();
    k_within_bound(name, got.data(), want.data(), bound_cpu.data(), got.size());
    snprintf(name, sizeof name, "layernorm_bwd_dw_db_within_two_stage_bound_of_exact_sum_%s", tag);
    k_within_bound(name, got.data(), exact_f.data(), bound_exact.data(), got.size());
    snprintf(name, sizeof name, "layernorm_bwd_dw_db_same_bits_every_run_and_thread_order_%s", tag);
    k_same_bits_in_every_order(name, run);
    /* dw alone (db NULL) gives dw's bits of the pair */
    cudaMemcpy(d_dw, dw0.data(), C * sizeof(float), cudaMemcpyHostToDevice);
    snprintf(name, sizeof name, "layernorm_bwd_dw_alone_same_bits_as_with_db_%s", tag);
    if (k_ok(name, dt_k_layernorm_bwd(NULL, d_dw, NULL, d_dout, d_x, d_w, d_mean, d_rstd, R, C, d_part, NULL)))
        dt_test_equal_bytes(name, k_download(d_dw, C).data(), got.data(), C * sizeof(float));
    dt_tensor *all[] = {&t_x, &t_dout, &t_w, &t_mean, &t_rstd, &t_dw, &t_db};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_free(&ctx, all[i]);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    dt_ctx_init(&ctx, NULL);
    check_layernorm("c100", k_size(5, 2), 100, 1); /* 128 threads, the last warp part-filled */
    check_layernorm("c300_no_bias", k_size(3, 2), 300, 0); /* 256 threads, two columns each */
    check_layernorm("c101_scalar", k_size(4, 2), 101, 1); /* not a multiple of 4: one float at a time */
    check_layernorm("c1100", k_size(3, 2), 1100, 1); /* 275 float4 over 256 threads: some take two */
    check_dwdb("r200_c100", k_size(200, 70), 100);  /* 4 chunks (the last of 8 rows), one block of columns */
    check_dwdb("r130_c300", k_size(130, 66), 300);  /* 3 chunks, two blocks of 256 columns */
    check_dwdb("r40_c100", k_size(40, 20), 100);    /* one chunk: no scratch, no second stage */
    k_free_all();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
