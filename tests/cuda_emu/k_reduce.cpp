/* tests/cuda_emu/k_reduce.cpp - kernels/dt_reduce.cu (layernorm) on the CUDA emulator against
   dt_tensor.h's CPU ops on random inputs, in every DT_EMU_MODE and under TSan. The kernels sum
   in a different order than the CPU (trees of warps), so values agree to a relative 1e-5; the
   dw/db column sums are the CPU's own order and agree to 1e-6. */
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
    if (k_ok(name, dt_k_layernorm_fwd(d_out, with_b ? d_mean : NULL, with_b ? d_rstd : NULL, d_x, d_w,
                                      with_b ? d_b : NULL, eps, R, C, NULL))) {
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
    dt_tensor &t_mean = *tmean, &t_rstd = *trstd, &t_dx = *tdx, &t_dw = *tdw, &t_db = *tdb;
    /* the backward from the CPU's saved statistics, so only the backward is compared */
    cudaMemcpy(d_mean, t_mean.data, R * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(d_rstd, t_rstd.data, R * sizeof(float), cudaMemcpyHostToDevice);
    dt_layernorm_bwd(&ctx, &t_dx, &t_dw, &t_db, tdout, tx, tw, &t_mean, &t_rstd);
    snprintf(name, sizeof name, "layernorm_bwd_dx_accumulates_like_cpu_%s", tag);
    if (k_ok(name, dt_k_layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, d_mean, d_rstd, R, C, NULL))) {
        dt_test_allclose(name, k_download(d_dx, R * C).data(), (float *)t_dx.data, R * C, 1e-5, 1e-5);
        std::vector<float> got = k_download(d_dw, C), want = k_values(t_dw), gb = k_download(d_db, C);
        got.insert(got.end(), gb.begin(), gb.end());
        want.insert(want.end(), (float *)t_db.data, (float *)t_db.data + C);
        snprintf(name, sizeof name, "layernorm_bwd_dw_db_accumulate_like_cpu_%s", tag);
        dt_test_allclose(name, got.data(), want.data(), got.size(), 1e-6, 1e-6);
    }
    DT_TEST_CHECK("layernorm_fwd_eps_zero_is_invalid_value",
                  dt_k_layernorm_fwd(d_dx, NULL, NULL, d_x, d_w, NULL, 0.0f, R, C, NULL) == cudaErrorInvalidValue);
    DT_TEST_CHECK("layernorm_bwd_without_mean_is_invalid_value",
                  dt_k_layernorm_bwd(d_dx, d_dw, d_db, d_dout, d_x, d_w, NULL, d_rstd, R, C, NULL) == cudaErrorInvalidValue);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    dt_ctx_init(&ctx, NULL);
    check_layernorm("c100", k_size(5, 2), 100, 1); /* 128 threads, the last warp part-filled */
    check_layernorm("c300_no_bias", k_size(3, 2), 300, 0); /* 256 threads, two columns each */
    k_free_all();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
