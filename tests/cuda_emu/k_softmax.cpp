/* tests/cuda_emu/k_softmax.cpp - kernels/dt_softmax.cu (the device losses and sums) on the CUDA
   emulator against dt_tensor.h's CPU ops, in every DT_EMU_MODE and under TSan: softmax + cross
   entropy (loss and n_valid into a loss slot, probabilities, the backward with n_valid counted
   on the device), binary cross entropy with logits, dt_sum / dt_sumsq's two-stage sum.

   Tolerances, u = 2^-24 (float), ud = 2^-53 (double). A row of softmax xent: s = the float sum
   of V terms exp(z - max) in (0, 1] (each within 2 ulp) has relative error <= (V + 2) u, so
   log s is within (V + 3) u + u |log s|; lse = max + log s and loss = lse - z[t] round once
   each: |err_row| <= u (V + 3 + |log s| + |lse| + |loss|). The CPU's own row has the same
   bound (8-lane float sums), the means in double add nothing visible: |gpu - cpu| <= 2 max_row
   bound. probs = exp(z - lse): relative error <= |err(lse)| + u |z - lse| + 2u, twice for the
   two sides. The bce loss: the same double element losses, summed in another order: within
   n ud sum|l| of each other before the cast to float, so within 2 u |loss| after. Sums: within
   n ud sum|x| (sumsq: sum x^2) of the exact sum. The backward kernels do the CPU's float
   operations: bitwise equal given the same probabilities. Every result is also checked bitwise
   against a second run (the reductions' order is fixed by n, not by timing). The row passes and
   bce's backward go by 16-byte loads where the rows (the elements) are a multiple of 4 and every
   pointer aligned: the emulator's count of vector accesses says the path (exactly the planned
   accesses, or none at an odd offset / a V not a multiple of 4), and the bounds above hold on
   either (they do not depend on the order of a row's sum). */
#include "dt_tensor.h"
#include "k_common.h"
#include <math.h>

static dt_ctx ctx;
static const int IGNORE = -100;
static const double U = 1.0 / 16777216.0, UD = 1.0 / 9007199254740992.0;

static void *scratch_for(int64_t rows) {
    void *p = NULL;
    if (cudaMalloc(&p, dt_k_loss_scratch_bytes(rows)) != cudaSuccess) exit(2);
    k_allocs.push_back(p);
    return p;
}

static dt_tensor i32_cpu(const std::vector<int32_t> &t) {
    dt_tensor x;
    dt_tensor_desc td;
    memset(&td, 0, sizeof td);
    td.dtype = DT_I32, td.shape[0] = (int64_t)t.size(), td.ndim = 1;
    dt_tensor_create(&ctx, &x, &td);
    memcpy(x.data, t.data(), t.size() * sizeof(int32_t));
    return x;
}

/* [R, V] logits at scale; off: the device logits, probs and dlogits one float past a 16-byte
   boundary (a view at an odd offset: the scalar path even for V a multiple of 4). */
static void check_xent(const char *tag, int64_t R, int64_t V, float scale, int off = 0) {
    char name[128];
    const int vec = V % 4 == 0 && !off;
    std::vector<float> z = k_random(R * V, -scale, scale), g0 = k_random(R * V, -0.1f, 0.1f);
    std::vector<int32_t> t(R);
    for (int64_t r = 0; r < R; r++) t[r] = (int32_t)(k_uniform(0, 1) * (float)V) % (int32_t)V;
    if (R > 1) t[1] = IGNORE; /* ignored rows: no loss, no gradient, not counted */
    if (R > 3) t[R - 1] = IGNORE;
    auto up = [&](const std::vector<float> &h) { /* off floats of padding first */
        std::vector<float> p(off, 0.0f);
        p.insert(p.end(), h.begin(), h.end());
        return k_upload(p) + off;
    };
    float *d_z = up(z), *d_p = up(std::vector<float>(R * V, 0)), *d_g = up(g0);
    int64_t valid = 0;
    for (int64_t r = 0; r < R; r++) valid += t[r] != IGNORE;
    int32_t *d_t = k_upload(t);
    double *d_slot = k_upload(std::vector<double>(2, -1.0));
    void *scratch = scratch_for(R);

    dt_tensor t_z = k_cpu(&ctx, z, R, V), t_p = k_cpu(&ctx, std::vector<float>(R * V, 0), R, V), t_g = k_cpu(&ctx, g0, R, V);
    dt_tensor t_t = i32_cpu(t);
    float loss = 0;
    int64_t n_valid = 0;
    dt_softmax_xent_fwd(&ctx, &loss, &n_valid, &t_p, &t_z, &t_t, IGNORE);

    /* the derived bound, from a double reference per row */
    double bound = 0, prob_rtol = 0;
    for (int64_t r = 0; r < R; r++) {
        double mx = -INFINITY, s = 0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, z[r * V + v]);
        for (int64_t v = 0; v < V; v++) s += exp(z[r * V + v] - mx);
        double lse = mx + log(s), zmax = 0;
        double lr = t[r] == IGNORE ? 0 : lse - z[r * V + t[r]];
        for (int64_t v = 0; v < V; v++) zmax = fmax(zmax, fabs(z[r * V + v] - lse));
        double row = U * ((double)V + 3 + fabs(log(s)) + fabs(lse) + fabs(lr));
        bound = fmax(bound, 2 * row);
        prob_rtol = fmax(prob_rtol, 2 * (row + U * zmax + 2 * U));
    }

#ifndef DT_EMU_STUBS
    long long vec0 = dt_emu_vector_accesses();
    int rep0 = dt_emu_report_count();
#endif
    int st = dt_k_softmax_xent_fwd(d_slot, d_p, d_z, d_t, IGNORE, R, V, scratch, NULL);
#ifndef DT_EMU_STUBS
    /* per row: the max, the sum, then the probabilities (a load and a store per float4) */
    snprintf(name, sizeof name, "softmax_xent_fwd_loads_by_16_bytes_iff_v_is_a_multiple_of_4_and_aligned_%s", tag);
    k_check_accesses(name, vec0, rep0, vec ? R * 4 * (V / 4) : 0);
#endif
    snprintf(name, sizeof name, "softmax_xent_fwd_mean_loss_within_derived_bound_of_cpu_%s", tag);
    if (k_ok(name, st)) {
        std::vector<double> slot = k_download(d_slot, 2);
        std::vector<float> p = k_download(d_p, R * V);
        dt_test_close(name, (float)slot[0], loss, bound + U * fabs(loss)); /* + the cast to float */
        snprintf(name, sizeof name, "softmax_xent_fwd_n_valid_counts_rows_not_ignored_%s", tag);
        if (slot[1] == (double)n_valid) dt_test_pass(name);
        else dt_test_fail(name, "n_valid %g on the device, %lld on the cpu", slot[1], (long long)n_valid);
        snprintf(name, sizeof name, "softmax_xent_fwd_probs_within_derived_bound_of_cpu_%s", tag);
        dt_test_allclose(name, p.data(), (float *)t_p.data, R * V, 1e-30, prob_rtol);
        /* determinism: the same bits again, and in place (probs = logits) the same probs */
        snprintf(name, sizeof name, "softmax_xent_fwd_same_bits_every_run_and_in_place_%s", tag);
        float *d_z2 = up(z);
        if (k_ok(name, dt_k_softmax_xent_fwd(d_slot, d_z2, d_z2, d_t, IGNORE, R, V, scratch, NULL))) {
            std::vector<double> slot2 = k_download(d_slot, 2);
            std::vector<float> p2 = k_download(d_z2, R * V);
            if (memcmp(slot.data(), slot2.data(), 16) == 0 && memcmp(p.data(), p2.data(), p.size() * 4) == 0)
                dt_test_pass(name);
            else dt_test_fail(name, "loss %.17g then %.17g, or the probabilities differ", slot[0], slot2[0]);
        }
    }
    /* the backward from the cpu's probabilities: the cpu's float operations, bitwise */
    snprintf(name, sizeof name, "softmax_xent_bwd_equals_cpu_bitwise_%s", tag);
    dt_softmax_xent_bwd(&ctx, &t_g, &t_p, &t_t, IGNORE, 0.75f);
    float *d_pc = up(k_values(t_p));
#ifndef DT_EMU_STUBS
    vec0 = dt_emu_vector_accesses(), rep0 = dt_emu_report_count();
#endif
    st = dt_k_softmax_xent_bwd(d_g, d_pc, d_t, IGNORE, 0.75f, R, V, scratch, NULL);
#ifndef DT_EMU_STUBS
    {   /* per row not ignored: probs and dlogits loaded, dlogits stored */
        char pname[160];
        snprintf(pname, sizeof pname, "softmax_xent_bwd_loads_by_16_bytes_iff_v_is_a_multiple_of_4_and_aligned_%s", tag);
        k_check_accesses(pname, vec0, rep0, vec ? valid * 3 * (V / 4) : 0);
    }
#endif
    if (k_ok(name, st)) dt_test_allclose(name, k_download(d_g, R * V).data(), (float *)t_g.data, R * V, 0, 0);
    dt_tensor_free(&ctx, &t_z), dt_tensor_free(&ctx, &t_p), dt_tensor_free(&ctx, &t_g), dt_tensor_free(&ctx, &t_t);
}

static void check_xent_edges(void) {
    const int64_t R = 3, V = 40;
    std::vector<float> z = k_random(R * V), g0(R * V, 0.5f);
    std::vector<int32_t> t = {5, 40, -1}, ign = {IGNORE, IGNORE, IGNORE};
    float *d_z = k_upload(z), *d_g = k_upload(g0), *d_p = k_upload(std::vector<float>(R * V, 0));
    int32_t *d_t = k_upload(t), *d_ign = k_upload(ign);
    double *d_slot = k_upload(std::vector<double>(2, -1.0));
    void *scratch = scratch_for(R);
    if (k_ok("softmax_xent_fwd_target_outside_v_gives_nan_loss",
             dt_k_softmax_xent_fwd(d_slot, d_p, d_z, d_t, IGNORE, R, V, scratch, NULL))) {
        std::vector<double> l = k_download(d_slot, 2);
        if (l[0] != l[0] && l[1] == 3) dt_test_pass("softmax_xent_fwd_target_outside_v_gives_nan_loss");
        else dt_test_fail("softmax_xent_fwd_target_outside_v_gives_nan_loss", "loss %g, n %g; want NaN, 3", l[0], l[1]);
    }
    if (k_ok("softmax_xent_fwd_all_ignored_is_zero_loss_zero_count",
             dt_k_softmax_xent_fwd(d_slot, NULL, d_z, d_ign, IGNORE, R, V, scratch, NULL))) {
        std::vector<double> l = k_download(d_slot, 2);
        DT_TEST_CHECK("softmax_xent_fwd_all_ignored_is_zero_loss_zero_count", l[0] == 0 && l[1] == 0);
    }
    if (k_ok("softmax_xent_bwd_no_valid_rows_adds_nothing",
             dt_k_softmax_xent_bwd(d_g, d_z, d_ign, IGNORE, 1.0f, R, V, scratch, NULL)))
        dt_test_allclose("softmax_xent_bwd_no_valid_rows_adds_nothing", k_download(d_g, R * V).data(), g0.data(), R * V, 0, 0);
    DT_TEST_CHECK("softmax_xent_fwd_negative_rows_is_invalid_value",
                  dt_k_softmax_xent_fwd(d_slot, d_p, d_z, d_t, IGNORE, -1, V, scratch, NULL) == cudaErrorInvalidValue);
    DT_TEST_CHECK("softmax_xent_fwd_no_scratch_is_invalid_value",
                  dt_k_softmax_xent_fwd(d_slot, d_p, d_z, d_t, IGNORE, R, V, NULL, NULL) == cudaErrorInvalidValue);
}

/* A pointer the launch reads, NULL where the size says data is there, faulted inside a kernel:
   refused. Rows past what a scratch size can count (the size wrapped to a few KiB) too. */
static void check_refusals(void) {
    const int64_t R = 3, V = 8;
    float *d = k_upload(std::vector<float>(R * V, 0.25f));
    int32_t *t = k_upload(std::vector<int32_t>(R, 1));
    double *slot = k_upload(std::vector<double>(2, 0.0));
    void *scratch = scratch_for(R);
    const int64_t huge = (int64_t)1 << 62; /* rows * V fits int64, rows * 4 bytes does not fit size_t */
    k_refused("softmax_xent_fwd_NULL_targets_is_invalid_value", dt_k_softmax_xent_fwd(slot, d, d, NULL, IGNORE, R, V, scratch, NULL));
    k_refused("softmax_xent_fwd_NULL_targets_v_0_is_invalid_value", dt_k_softmax_xent_fwd(slot, NULL, NULL, NULL, IGNORE, R, 0, scratch, NULL));
    k_refused("softmax_xent_fwd_NULL_logits_is_invalid_value", dt_k_softmax_xent_fwd(slot, d, NULL, t, IGNORE, R, V, scratch, NULL));
    k_refused("softmax_xent_bwd_NULL_probs_is_invalid_value", dt_k_softmax_xent_bwd(d, NULL, t, IGNORE, 1.0f, R, V, scratch, NULL));
    k_refused("softmax_xent_bwd_NULL_targets_is_invalid_value", dt_k_softmax_xent_bwd(d, d, NULL, IGNORE, 1.0f, R, V, scratch, NULL));
    k_refused("softmax_xent_fwd_rows_past_the_scratch_size_is_invalid_value",
              dt_k_softmax_xent_fwd(slot, NULL, d, t, IGNORE, huge, 1, scratch, NULL));
    DT_TEST_CHECK("loss_scratch_bytes_of_rows_past_size_t_is_0", dt_k_loss_scratch_bytes(huge) == 0);
    k_refused("bce_logits_fwd_NULL_labels_is_invalid_value", dt_k_bce_logits_fwd(slot, d, NULL, 8, scratch, NULL));
    k_refused("bce_logits_fwd_NULL_logits_is_invalid_value", dt_k_bce_logits_fwd(slot, NULL, d, 8, scratch, NULL));
    k_refused("bce_logits_bwd_NULL_logits_is_invalid_value", dt_k_bce_logits_bwd(d, NULL, d, 1.0f, 8, NULL));
    k_refused("bce_logits_bwd_NULL_labels_is_invalid_value", dt_k_bce_logits_bwd(d, d, NULL, 1.0f, 8, NULL));
    k_refused("sum_NULL_x_is_invalid_value", dt_k_sum(slot, NULL, 8, 0, scratch, NULL));
    k_refused("scale_NULL_x_is_invalid_value", dt_k_scale(NULL, 2.0f, 8, NULL));
    /* what the launch does not touch may stay NULL: n = 0, and a NULL dlogits (no gradient) */
    DT_TEST_CHECK("sum_n_0_with_NULL_x_is_ok", dt_k_sum(slot, NULL, 0, 0, scratch, NULL) == 0);
    DT_TEST_CHECK("scale_n_0_with_NULL_is_ok", dt_k_scale(NULL, 2.0f, 0, NULL) == 0);
    DT_TEST_CHECK("softmax_xent_bwd_NULL_dlogits_is_ok", dt_k_softmax_xent_bwd(NULL, NULL, NULL, IGNORE, 1.0f, R, V, scratch, NULL) == 0);
    DT_TEST_CHECK("softmax_xent_fwd_rows_0_with_NULL_is_ok", dt_k_softmax_xent_fwd(slot, NULL, NULL, NULL, IGNORE, 0, V, scratch, NULL) == 0);
}

static void check_bce(const char *tag, int64_t n) {
    char name[128];
    std::vector<float> z = k_random(n, -30.0f, 30.0f), y(n), g0 = k_random(n, -0.1f, 0.1f);
    for (int64_t i = 0; i < n; i++) y[i] = k_uniform(0, 1) < 0.5f ? 0.0f : 1.0f;
    float *d_z = k_upload(z), *d_y = k_upload(y), *d_g = k_upload(g0);
    double *d_slot = k_upload(std::vector<double>(2, -1.0));
    void *scratch = scratch_for(0);
    dt_tensor t_z = k_cpu(&ctx, z, n), t_y = k_cpu(&ctx, y, n), t_g = k_cpu(&ctx, g0, n);
    float loss = 0;
    dt_bce_logits_fwd(&ctx, &loss, &t_z, &t_y);
    dt_bce_logits_bwd(&ctx, &t_g, &t_z, &t_y, 0.5f);
    snprintf(name, sizeof name, "bce_logits_fwd_mean_within_derived_bound_of_cpu_%s", tag);
    if (k_ok(name, dt_k_bce_logits_fwd(d_slot, d_z, d_y, n, scratch, NULL))) {
        std::vector<double> s = k_download(d_slot, 2);
        dt_test_close(name, (float)s[0], loss, 2 * U * fabs(loss));
        snprintf(name, sizeof name, "bce_logits_fwd_counts_every_element_%s", tag);
        DT_TEST_CHECK(name, s[1] == (double)n);
        snprintf(name, sizeof name, "bce_logits_fwd_same_bits_every_run_%s", tag);
        dt_k_bce_logits_fwd(d_slot, d_z, d_y, n, scratch, NULL);
        std::vector<double> s2 = k_download(d_slot, 2);
        dt_test_equal_bytes(name, s2.data(), s.data(), 16);
    }
    snprintf(name, sizeof name, "bce_logits_bwd_equals_cpu_bitwise_%s", tag);
#ifndef DT_EMU_STUBS
    long long vec0 = dt_emu_vector_accesses();
    int rep0 = dt_emu_report_count();
#endif
    int st = dt_k_bce_logits_bwd(d_g, d_z, d_y, 0.5f, n, NULL);
    if (k_ok(name, st)) dt_test_allclose(name, k_download(d_g, n).data(), (float *)t_g.data, n, 0, 0);
#ifndef DT_EMU_STUBS
    /* aligned: n / 4 float4s of dlogits, logits and labels loaded, dlogits stored; the last n % 4 one by one */
    snprintf(name, sizeof name, "bce_logits_bwd_loads_by_16_bytes_all_but_the_last_n_mod_4_%s", tag);
    k_check_accesses(name, vec0, rep0, 4 * (n / 4));
    /* at an odd offset: one at a time, the same bits */
    std::vector<float> pz(1, 0.0f), pg(1, 0.0f);
    pz.insert(pz.end(), z.begin(), z.end()), pg.insert(pg.end(), g0.begin(), g0.end());
    float *o_z = k_upload(pz) + 1, *o_g = k_upload(pg) + 1;
    vec0 = dt_emu_vector_accesses(), rep0 = dt_emu_report_count();
    st = dt_k_bce_logits_bwd(o_g, o_z, d_y, 0.5f, n, NULL);
    snprintf(name, sizeof name, "bce_logits_bwd_at_an_odd_offset_loads_by_4_bytes_%s", tag);
    k_check_accesses(name, vec0, rep0, 0);
    snprintf(name, sizeof name, "bce_logits_bwd_at_an_odd_offset_equals_cpu_bitwise_%s", tag);
    if (k_ok(name, st)) dt_test_allclose(name, k_download(o_g, n).data(), (float *)t_g.data, n, 0, 0);
#endif
    dt_tensor_free(&ctx, &t_z), dt_tensor_free(&ctx, &t_y), dt_tensor_free(&ctx, &t_g);
}

static void check_sum(const char *tag, int64_t n) {
    char name[128];
    std::vector<float> x = k_random(n, -3.0f, 3.0f);
    float *d_x = k_upload(x);
    double *d_out = k_upload(std::vector<double>(2, -1.0));
    void *scratch = scratch_for(0);
    for (int sq = 0; sq < 2; sq++) {
        long double exact = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            long double v = sq ? (long double)x[i] * x[i] : (long double)x[i];
            exact += v, mag += fabsl(v);
        }
        snprintf(name, sizeof name, "%s_two_stage_within_n_ud_sum_abs_of_exact_%s", sq ? "sumsq" : "sum", tag);
        if (k_ok(name, dt_k_sum(d_out, d_x, n, sq, scratch, NULL))) {
            std::vector<double> o = k_download(d_out, 2);
            dt_test_close(name, o[0], (double)exact, (double)n * UD * (double)mag);
            snprintf(name, sizeof name, "%s_two_stage_same_bits_every_run_%s", sq ? "sumsq" : "sum", tag);
            dt_k_sum(d_out, d_x, n, sq, scratch, NULL);
            std::vector<double> o2 = k_download(d_out, 2);
            dt_test_equal_bytes(name, o2.data(), o.data(), 16);
        }
    }
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    dt_ctx_init(&ctx, NULL);
    /* V: one column, part of a warp, float4s over part of the block (100) or not (101), several a
       thread (1100: 275 float4s over 288 threads; 4096: 1024 over 512); rows: one, 7, 33 (2 for
       7 on the TSan run's small inputs: a race is within a row's block, and v4096's 7 rows took 7 s
       of its 31) */
    static const int64_t vs[] = {1, 3, 100, 101, 300, 1100, 4096};
    for (int64_t V : vs) {
        char tag[32];
        snprintf(tag, sizeof tag, "r%lld_v%lld", (long long)k_size(7, 2), (long long)V);
        check_xent(tag, k_size(7, 2), V, 4.0f);
    }
    check_xent("r1_v300", 1, 300, 4.0f);
    check_xent("r33_v101", k_size(33, 9), 101, 4.0f);
    check_xent("r33_v1100", k_size(33, 9), 1100, 4.0f);
    check_xent("r5_v300_offset", 5, 300, 4.0f, 1); /* a multiple of 4 at an odd offset: the scalar path */
    check_xent("v37", k_size(5, 4), 37, 4.0f);       /* one warp and a few lanes idle */
    check_xent("large_logits", 4, 64, 1000.0f);      /* exp would overflow without the max */
    check_xent_edges();
    check_refusals();
    check_bce("n37", 37);
    check_bce("n3000", k_size(3000, 1100));          /* several stage-1 blocks */
    check_sum("n1", 1);
    check_sum("n5000", k_size(5000, 1100));
    k_free_all();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
