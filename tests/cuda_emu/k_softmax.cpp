/* tests/cuda_emu/k_softmax.cpp - kernels/dt_softmax.cu (softmax + cross entropy) on the CUDA
   emulator against dt_softmax_xent_fwd / _bwd of dt_tensor.h, in every DT_EMU_MODE and under
   TSan. The forward keeps a logsumexp per row, the probabilities are written from it: loss and
   gradient must be the CPU's (relative 1e-5). */
#include "dt_tensor.h"
#include "k_common.h"

static dt_ctx ctx;
static const int IGNORE = -100;

static void check_xent(const char *tag, int64_t R, int64_t V, float scale) {
    char name[128];
    std::vector<float> z = k_random(R * V, -scale, scale), g0 = k_random(R * V, -0.1f, 0.1f);
    std::vector<int32_t> t(R);
    for (int64_t r = 0; r < R; r++) t[r] = (int32_t)(k_uniform(0, 1) * (float)V) % (int32_t)V;
    t[1] = IGNORE; /* ignored rows: no loss, no gradient */
    if (R > 3) t[R - 1] = IGNORE;
    float *d_z = k_upload(z), *d_loss = k_upload(std::vector<float>(R, 0)), *d_lse = k_upload(std::vector<float>(R, 0));
    float *d_g = k_upload(g0), *d_p = k_upload(std::vector<float>(R * V, 0));
    int32_t *d_t = k_upload(t);

    dt_tensor t_z = k_cpu(&ctx, z, R, V), t_p = k_cpu(&ctx, std::vector<float>(R * V, 0), R, V), t_g = k_cpu(&ctx, g0, R, V);
    dt_tensor t_t;
    dt_tensor_desc td;
    memset(&td, 0, sizeof td);
    td.dtype = DT_I32, td.shape[0] = R, td.ndim = 1;
    dt_tensor_create(&ctx, &t_t, &td);
    memcpy(t_t.data, t.data(), R * sizeof(int32_t));
    float loss = 0;
    int64_t n_valid = 0;
    dt_softmax_xent_fwd(&ctx, &loss, &n_valid, &t_p, &t_z, &t_t, IGNORE);

    snprintf(name, sizeof name, "softmax_xent_fwd_mean_loss_matches_cpu_%s", tag);
    if (k_ok(name, dt_k_softmax_xent_fwd(d_loss, d_lse, d_z, d_t, IGNORE, R, V, NULL))) {
        std::vector<float> losses = k_download(d_loss, R), lse = k_download(d_lse, R);
        double sum = 0, worst = 0;
        int zero_ignored = 1;
        for (int64_t r = 0; r < R; r++) {
            sum += losses[r];
            if (t[r] == IGNORE && losses[r] != 0.0f) zero_ignored = 0;
            double mx = -INFINITY, s = 0; /* logsumexp in double, directly */
            for (int64_t v = 0; v < V; v++) mx = z[r * V + v] > mx ? z[r * V + v] : mx;
            for (int64_t v = 0; v < V; v++) s += exp(z[r * V + v] - mx);
            double want = mx + log(s);
            worst = fmax(worst, fabs(lse[r] - want) / fmax(1.0, fabs(want)));
        }
        dt_test_close(name, sum / (double)n_valid, loss, 1e-5 * fabs(loss) + 1e-6);
        snprintf(name, sizeof name, "softmax_xent_fwd_lse_is_logsumexp_%s", tag);
        if (worst <= 1e-6) dt_test_pass(name);
        else dt_test_fail(name, "largest relative difference from a double logsumexp %.3g > 1e-6", worst);
        snprintf(name, sizeof name, "softmax_xent_fwd_ignored_rows_have_zero_loss_%s", tag);
        DT_TEST_CHECK(name, zero_ignored);
    }
    snprintf(name, sizeof name, "softmax_xent_bwd_accumulates_like_cpu_%s", tag);
    dt_softmax_xent_bwd(&ctx, &t_g, &t_p, &t_t, IGNORE, 0.75f);
    if (k_ok(name, dt_k_softmax_xent_probs(d_p, d_z, d_lse, R, V, NULL)) &&
        k_ok(name, dt_k_softmax_xent_bwd_probs(d_g, d_p, d_t, IGNORE, 0.75f, n_valid, R, V, NULL)))
        dt_test_allclose(name, k_download(d_g, R * V).data(), (float *)t_g.data, R * V, 1e-6, 1e-5);
    dt_tensor_free(&ctx, &t_z), dt_tensor_free(&ctx, &t_p), dt_tensor_free(&ctx, &t_g), dt_tensor_free(&ctx, &t_t);
}

static void check_edges(void) {
    const int64_t R = 3, V = 40;
    std::vector<float> z = k_random(R * V), g0(R * V, 0.5f);
    std::vector<int32_t> t = {5, 40, -1}; /* 40 and -1: outside [0, V) and not ignored */
    float *d_z = k_upload(z), *d_loss = k_upload(std::vector<float>(R, 0)), *d_lse = k_upload(std::vector<float>(R, 0));
    float *d_g = k_upload(g0);
    int32_t *d_t = k_upload(t);
    if (k_ok("softmax_xent_fwd_target_outside_v_gives_nan_loss", dt_k_softmax_xent_fwd(d_loss, d_lse, d_z, d_t, IGNORE, R, V, NULL))) {
        std::vector<float> l = k_download(d_loss, R);
        if (l[0] == l[0] && l[1] != l[1] && l[2] != l[2]) dt_test_pass("softmax_xent_fwd_target_outside_v_gives_nan_loss");
        else dt_test_fail("softmax_xent_fwd_target_outside_v_gives_nan_loss", "losses %g %g %g; want finite, NaN, NaN",
                          l[0], l[1], l[2]);
    }
    if (k_ok("softmax_xent_bwd_no_valid_rows_adds_nothing",
             dt_k_softmax_xent_bwd_probs(d_g, d_z, d_t, IGNORE, 1.0f, 0, R, V, NULL)))
        dt_test_allclose("softmax_xent_bwd_no_valid_rows_adds_nothing", k_download(d_g, R * V).data(), g0.data(), R * V, 0, 0);
    DT_TEST_CHECK("softmax_xent_bwd_n_valid_above_rows_is_invalid_value",
                  dt_k_softmax_xent_bwd_probs(d_g, d_z, d_t, IGNORE, 1.0f, R + 1, R, V, NULL) == cudaErrorInvalidValue);
    DT_TEST_CHECK("softmax_xent_fwd_negative_rows_is_invalid_value",
                  dt_k_softmax_xent_fwd(d_loss, d_lse, d_z, d_t, IGNORE, -1, V, NULL) == cudaErrorInvalidValue);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    dt_ctx_init(&ctx, NULL);
    check_xent("v300", k_size(6, 3), 300, 4.0f);     /* 320 threads: the last warp part-filled */
    check_xent("v37", k_size(5, 4), 37, 4.0f);       /* one warp and a few lanes idle */
    check_xent("large_logits", 4, 64, 1000.0f);      /* exp would overflow without the max */
    check_edges();
    k_free_all();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
