/* tests/cuda_emu/k_reduce.cpp - kernels/dt_reduce.cu (layernorm) on the CUDA emulator against
   dt_tensor.h's CPU ops on random inputs, in every DT_EMU_MODE and under TSan.

   The row kernels (forward, dx) do the CPU op's float operations with the sums in another order
   (a warp's lanes, then its butterfly, against the CPU's 8 lanes), so each side is compared with
   the exact value within its own derived bound and the two with the sum of both (fwd_bound and
   dx_bound say how), and the bits are the same in every thread order. The dw/db column sums are
   two-stage (chunks of 64 rows, then the chunks' partials): compared with the CPU's row-order
   sum within a bound derived from both orders, with the exact sum within the two-stage bound
   alone, and bit for bit across runs, thread orders and the 16-byte and scalar paths. Which path
   ran is checked by counting the emulator's vector accesses: exactly the 16-byte plan (with the
   weights' copy into shared memory where they fit), or none. */
#include "dt_tensor.h"
#include "k_common.h"

static dt_ctx ctx;
static const double U = 1.0 / 16777216.0;

/* What the launchers' plans are (kernels/dt_reduce.cu): 8 rows (warps) a block, at most 1024
   blocks; the weights in shared memory when C floats (2C with b) fit in 48 KiB. */
static int64_t ln_blocks(int64_t R) { return (R + 7) / 8 < 1024 ? (R + 7) / 8 : 1024; }
static int ln_weights_shared(int64_t C, int n) { return C > 0 && C * n * 4 <= 48 * 1024; }

/* The longest chain of roundings a row's sum goes through: the CPU adds 8 lanes of ceil(C/8)
   terms, then a0 + a1 and the 4-lane hsum (3); the kernel 32 lanes of ceil(C/32) terms (the
   16-byte path: ceil(C/128) float4s of 4, at most 3 more), then the warp's 5 butterfly steps. */
static double chain_cpu(int64_t C) { return (double)((C + 7) / 8) + 3; }
static double chain_gpu(int64_t C) { return (double)((C + 31) / 32) + 3 + 5; }

/* One side's error bound for the forward, per output, from first-order error analysis of the
   corrected two-pass statistics with chain k (Higham ch. 3; gamma = k_gamma). mu, var, rho: the
   exact statistics (double), A0 = mean|x|, A1 = mean|x - mu|.
     m0 = fl(S / C) is within D = gamma(k + 1) A0 of mu; e = fl(sum fl(x - m0) / C) within
     gamma(k + 2)(A1 + D) + u D of mu - m0; m = fl(m0 + e) rounds once more:
         dm <= gamma(k + 3)(A1 + D) + 2u |mu|.
     v = fl(fl(sum d^2) / C - fl(e^2)) (d = fl(x - m0): 3 roundings a term, then the chain):
         dv <= gamma(k + 5)(var + D^2) + 3 gamma(k + 2)(A1 + D) D + u var,
     and s = fl(1 / sqrt(v + eps)) (in double) is within the relative ds <= dv / (2 (var + eps)) + 2u
     of rho. An output y = fl(fl(fl(fl(x - m) s) w) + b) then is within
         |w| rho (1 + ds) (|x - mu| (ds + gamma(3)) + dm (1 + gamma(3))) + gamma(2) |y*|
   of y* = (x - mu) rho w + b; mean within dm; rstd within rho ds. */
struct ln_side {
    double dm, ds;
};
static ln_side ln_side_bound(double k, double mu, double var, double eps, double A0, double A1) {
    double D = k_gamma(k + 1) * A0, dm = k_gamma(k + 3) * (A1 + D) + 2 * U * fabs(mu);
    double dv = k_gamma(k + 5) * (var + D * D) + 3 * k_gamma(k + 2) * (A1 + D) * D + U * var;
    return ln_side{dm, dv / (2 * (var + eps)) + 2 * U};
}

/* The bound on |gpu - cpu| for each output of the forward: out [R, C], then mean [R] and rstd [R]. */
static std::vector<double> fwd_bound(const std::vector<float> &x, const std::vector<float> &w, const float *b,
                                     int64_t R, int64_t C, double eps) {
    std::vector<double> bound(R * C + 2 * R);
    for (int64_t r = 0; r < R; r++) {
        const float *xr = &x[r * C];
        double mu = 0, var = 0, A0 = 0, A1 = 0;
        for (int64_t c = 0; c < C; c++) mu += xr[c], A0 += fabs((double)xr[c]);
        mu /= (double)(C ? C : 1), A0 /= (double)(C ? C : 1);
        for (int64_t c = 0; c < C; c++) var += (xr[c] - mu) * (xr[c] - mu), A1 += fabs(xr[c] - mu);
        var /= (double)(C ? C : 1), A1 /= (double)(C ? C : 1);
        double rho = 1 / sqrt(var + eps);
        ln_side g = ln_side_bound(chain_gpu(C), mu, var, eps, A0, A1), h = ln_side_bound(chain_cpu(C), mu, var, eps, A0, A1);
        for (int64_t c = 0; c < C; c++) {
            double y = (xr[c] - mu) * rho * w[c] + (b ? b[c] : 0.0), e = 0;
            for (const ln_side &s : {g, h})
                e += fabs((double)w[c]) * rho * (1 + s.ds) *
                         (fabs(xr[c] - mu) * (s.ds + k_gamma(3)) + s.dm * (1 + k_gamma(3))) + k_gamma(2) * fabs(y);
            bound[r * C + c] = e;
        }
        bound[R * C + r] = g.dm + h.dm;
        bound[R * C + R + r] = rho * (g.ds + h.ds);
    }
    return bound;
}

/* The bound on |gpu - cpu| for dx, both from the same m and s (the CPU's): nrm = fl(fl(x - m) s)
   and gw = fl(g w) are the same on both sides; gm = sum gw / C (chain k, the division) is within
   gamma(k + 1) sum|gw| / C, gnm = sum gw nrm / C within gamma(k + 2) sum|gw nrm| / C (each term
   one rounding more); then t = fl(fl(fl(gw - gm) - fl(nrm gnm)) s) and dx = fl(dx0 + t):
       |dx - dx*| <= s (dgm + |nrm| dgnm + gamma(3) (|gw| + |gm| + |nrm gnm|)) + u |dx*|
   per side, dx* the exact value from the same gw, nrm; the bound is the sum of both sides'. */
static std::vector<double> dx_bound(const std::vector<float> &x, const std::vector<float> &w,
                                    const std::vector<float> &g, const float *mean, const float *rstd,
                                    const std::vector<float> &dx0, int64_t R, int64_t C) {
    std::vector<double> bound(R * C);
    for (int64_t r = 0; r < R; r++) {
        double s = rstd[r], gm = 0, gnm = 0, agm = 0, agnm = 0;
        std::vector<double> nrm(C), gw(C);
        for (int64_t c = 0; c < C; c++) {
            nrm[c] = (float)((float)(x[r * C + c] - mean[r]) * rstd[r]), gw[c] = (float)(g[r * C + c] * w[c]);
            gm += gw[c], gnm += gw[c] * nrm[c], agm += fabs(gw[c]), agnm += fabs(gw[c] * nrm[c]);
        }
        gm /= (double)C, gnm /= (double)C, agm /= (double)C, agnm /= (double)C;
        for (int64_t c = 0; c < C; c++) {
            double t = (gw[c] - gm - nrm[c] * gnm) * s, e = 0;
            for (double k : {chain_gpu(C), chain_cpu(C)})
                e += s * (k_gamma(k + 1) * agm + fabs(nrm[c]) * k_gamma(k + 2) * agnm +
                          k_gamma(3) * (fabs(gw[c]) + fabs(gm) + fabs(nrm[c] * gnm))) +
                     U * fabs(dx0[r * C + c] + t);
            bound[r * C + c] = e;
        }
    }
    return bound;
}

/* PASS iff within the bound (k_within_bound), and a line saying how close: max |diff| / bound. */
static void within(const char *name, const float *got, const float *want, const double *bound, size_t n) {
    double worst = 0, maxdiff = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        maxdiff = fmax(maxdiff, d);
        if (bound[i] > 0) worst = fmax(worst, d / bound[i]);
    }
    if (k_within_bound(name, got, want, bound, n)) printf("  %s: max |diff| %.3g, max |diff| / bound %.3g\n", name, maxdiff, worst);
}

/* Forward and dx on [R, C] against the CPU, with b (and the backward) or without. off: the
   device copies of x, out, dout and dx sit one float past a 16-byte boundary (a view at an odd
   offset), so even a C that is a multiple of 4 takes the scalar path. orders: the same bits
   again in each of the emulator's thread orders (8 more launches: a few cases only; every case
   runs in each order of tests/run.sh anyway). Grads start non-zero (the kernels add). */
static void check_layernorm(int64_t R, int64_t C, int with_b, int off, int orders) {
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "r%lld_c%lld%s%s", (long long)R, (long long)C, with_b ? "" : "_no_bias", off ? "_offset" : "");
    std::vector<float> x = k_random(R * C, -3, 3), w = k_random(C), b = k_random(C), dout = k_random(R * C);
    std::vector<float> dx0 = k_random(R * C);
    for (int64_t i = 0; i < C; i++) x[i] = 3.0f + 1e-3f * (float)i; /* a row with a large mean: two passes matter */
    auto up = [&](const std::vector<float> &h) { /* off floats of padding first */
        std::vector<float> p(off, 0.0f);
        p.insert(p.end(), h.begin(), h.end());
        return k_upload(p) + off;
    };
    float *d_x = up(x), *d_w = k_upload(w), *d_b = k_upload(b), *d_out = up(std::vector<float>(R * C, 0));
    float *d_mean = k_upload(std::vector<float>(R, 0)), *d_rstd = k_upload(std::vector<float>(R, 0));
    float *d_dout = up(dout), *d_dx = up(dx0);
    dt_tensor t_x = k_cpu(&ctx, x, R, C), t_w = k_cpu(&ctx, w, C), t_b = k_cpu(&ctx, b, C);
    dt_tensor t_out = k_cpu(&ctx, std::vector<float>(R * C, 0), R, C), t_mean = k_cpu(&ctx, std::vector<float>(R, 0), R);
    dt_tensor t_rstd = k_cpu(&ctx, std::vector<float>(R, 0), R), t_dout = k_cpu(&ctx, dout, R, C);
    dt_tensor t_dx = k_cpu(&ctx, dx0, R, C);
    const float eps = 1e-5f;
    const int vec = C % 4 == 0 && !off;

    dt_layernorm_fwd(&ctx, &t_out, &t_mean, &t_rstd, &t_x, &t_w, with_b ? &t_b : NULL, eps);
    auto fwd = [&]() {
        int st = dt_k_layernorm_fwd(d_out, d_mean, d_rstd, d_x, d_w, with_b ? d_b : NULL, eps, R, C, NULL);
        std::vector<float> got = k_download(d_out, R * C), m = k_download(d_mean, R), s = k_download(d_rstd, R);
        got.insert(got.end(), m.begin(), m.end()), got.insert(got.end(), s.begin(), s.end());
        if (st) got.assign(got.size(), NAN);
        return got;
    };
#ifndef DT_EMU_STUBS
    long long vec0 = dt_emu_vector_accesses();
    int rep0 = dt_emu_report_count();
#endif
    std::vector<float> got = fwd();
#ifndef DT_EMU_STUBS
    /* per row: x twice (the statistics), then x, w (b) and the store; per block: the copy of w
       (and b) into shared memory, a load and a store per float4, where they fit */
    snprintf(name, sizeof name, "layernorm_fwd_loads_by_16_bytes_iff_c_is_a_multiple_of_4_and_aligned_%s", tag);
    k_check_accesses(name, vec0, rep0, vec ? (C / 4) * (R * (5 + with_b) +
                                                      ln_blocks(R) * 2 * (1 + with_b) * ln_weights_shared(C, 1 + with_b))
                                         : 0);
#endif
    {
        std::vector<float> want = k_values(t_out);
        want.insert(want.end(), (float *)t_mean.data, (float *)t_mean.data + R);
        want.insert(want.end(), (float *)t_rstd.data, (float *)t_rstd.data + R);
        std::vector<double> bound = fwd_bound(x, w, with_b ? b.data() : NULL, R, C, eps);
        snprintf(name, sizeof name, "layernorm_fwd_out_mean_rstd_match_cpu_within_derived_bound_%s", tag);
        within(name, got.data(), want.data(), bound.data(), got.size());
        snprintf(name, sizeof name, "layernorm_fwd_same_bits_every_run_and_thread_order_%s", tag);
        if (orders) k_same_bits_in_every_order(name, fwd);
    }
    if (with_b) {
        /* the backward from the CPU's saved statistics, so only the backward is compared */
        cudaMemcpy(d_mean, t_mean.data, R * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemcpy(d_rstd, t_rstd.data, R * sizeof(float), cudaMemcpyHostToDevice);
        dt_layernorm_bwd(&ctx, &t_dx, NULL, NULL, &t_dout, &t_x, &t_w, &t_mean, &t_rstd);
        auto bwd = [&]() {
            cudaMemcpy(d_dx, dx0.data(), R * C * sizeof(float), cudaMemcpyHostToDevice);
            int st = dt_k_layernorm_bwd(d_dx, NULL, NULL, d_dout, d_x, d_w, d_mean, d_rstd, R, C, NULL, NULL);
            std::vector<float> got = k_download(d_dx, R * C);
            if (st) got.assign(got.size(), NAN);
            return got;
        };
#ifndef DT_EMU_STUBS
        vec0 = dt_emu_vector_accesses(), rep0 = dt_emu_report_count();
#endif
        std::vector<float> gdx = bwd();
#ifndef DT_EMU_STUBS
        /* per row: x, dout, w (the sums), then x, dout, w, dx and the store; per block: w's copy */
        snprintf(name, sizeof name, "layernorm_bwd_dx_loads_by_16_bytes_iff_c_is_a_multiple_of_4_and_aligned_%s", tag);
        k_check_accesses(name, vec0, rep0, vec ? (C / 4) * (R * 8 + ln_blocks(R) * 2 * ln_weights_shared(C, 1)) : 0);
#endif
        std::vector<double> bound = dx_bound(x, w, dout, (float *)t_mean.data, (float *)t_rstd.data, dx0, R, C);
        snprintf(name, sizeof name, "layernorm_bwd_dx_accumulates_like_cpu_within_derived_bound_%s", tag);
        within(name, gdx.data(), (float *)t_dx.data, bound.data(), gdx.size());
        snprintf(name, sizeof name, "layernorm_bwd_dx_same_bits_every_run_and_thread_order_%s", tag);
        if (orders) k_same_bits_in_every_order(name, bwd);
    }
    dt_tensor *all[] = {&t_x, &t_w, &t_b, &t_out, &t_mean, &t_rstd, &t_dout, &t_dx};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) dt_tensor_free(&ctx, all[i]);
}

static void check_layernorm_args(void) {
    float *d = k_upload(std::vector<float>(64, 1.0f));
    DT_TEST_CHECK("layernorm_fwd_eps_zero_is_invalid_value",
                  dt_k_layernorm_fwd(d, NULL, NULL, d, d, NULL, 0.0f, 4, 16, NULL) == cudaErrorInvalidValue);
    DT_TEST_CHECK("layernorm_bwd_without_mean_is_invalid_value",
                  dt_k_layernorm_bwd(d, d, d, d, d, d, NULL, d, 4, 16, NULL, NULL) == cudaErrorInvalidValue);
    /* eps as dt_layernorm_fwd takes it: finite and > 0 */
    k_refused("layernorm_fwd_eps_inf_is_invalid_value",
              dt_k_layernorm_fwd(d, NULL, NULL, d, d, NULL, INFINITY, 4, 16, NULL));
    k_refused("layernorm_fwd_bf16_eps_nan_is_invalid_value",
              dt_k_layernorm_fwd_bf16((uint16_t *)d, NULL, NULL, d, d, NULL, NAN, 4, 16, NULL));
    k_refused("layernorm_fwd_bf16_NULL_out_is_invalid_value",
              dt_k_layernorm_fwd_bf16(NULL, NULL, NULL, d, d, NULL, 1e-5f, 4, 16, NULL));
    k_refused("layernorm_fwd_NULL_w_is_invalid_value",
              dt_k_layernorm_fwd(d, NULL, NULL, d, NULL, NULL, 1e-5f, 4, 16, NULL));
    k_refused("layernorm_fwd_NULL_x_is_invalid_value",
              dt_k_layernorm_fwd(d, NULL, NULL, NULL, d, NULL, 1e-5f, 4, 16, NULL));
    k_refused("layernorm_bwd_dx_without_w_is_invalid_value",
              dt_k_layernorm_bwd(d, NULL, NULL, d, d, NULL, d, d, 4, 16, NULL, NULL));
    k_refused("layernorm_bwd_NULL_dout_is_invalid_value",
              dt_k_layernorm_bwd(NULL, d, d, NULL, d, d, d, d, 4, 16, NULL, NULL));
    DT_TEST_CHECK("layernorm_fwd_no_rows_with_NULL_pointers_is_ok",
                  dt_k_layernorm_fwd(NULL, NULL, NULL, NULL, NULL, NULL, 1e-5f, 0, 16, NULL) == 0);
}

/* dw and db over R rows (several chunks of 64, the last one short) and C columns, dx left out.
   The bound: the terms t_r = (x - m) s g are computed alike on both sides (the same three
   roundings; a GPU's contracted multiply-add is one rounding fewer, the +1 below). The CPU adds
   R terms into dw0 in row order: R additions in a chain. The kernel adds a chunk's rows (at most
   63 additions), then the chunks' partials (nchunks - 1), then the total into dw0 (1):
   k = 63 + (nchunks - 1) + 1 + 1. So, with S = |dw0| + sum|t_r|,
       |gpu - exact| <= gamma(k) S,   |cpu - exact| <= gamma(R + 1) S,
       |gpu - cpu| <= (gamma(k) + gamma(R + 1)) S;
   the exact sum (in double: R + 1 terms, off by R 2^-53 S at most, nothing against these) must
   be within gamma(k) S of the kernel's. The same columns at an odd offset (the scalar path) sum
   in the same order: the same bits. */
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
    auto run_on = [&](const float *gx, const float *gdout) {
        cudaMemcpy(d_dw, dw0.data(), C * sizeof(float), cudaMemcpyHostToDevice);
        cudaMemcpy(d_db, db0.data(), C * sizeof(float), cudaMemcpyHostToDevice);
        int st = dt_k_layernorm_bwd(NULL, d_dw, d_db, gdout, gx, d_w, d_mean, d_rstd, R, C, d_part, NULL);
        std::vector<float> got = k_download(d_dw, C), gb = k_download(d_db, C);
        got.insert(got.end(), gb.begin(), gb.end());
        if (st) got.assign(2 * C, NAN);
        return got;
    };
    auto run = [&]() { return run_on(d_x, d_dout); };
#ifndef DT_EMU_STUBS
    long long vec0 = dt_emu_vector_accesses();
    int rep0 = dt_emu_report_count();
#endif
    std::vector<float> got = run();
#ifndef DT_EMU_STUBS
    /* stage 1: dout and x of each row; then dw and db added to (one chunk), or the partials
       stored, loaded again by stage 2 and the totals added to dw and db */
    snprintf(name, sizeof name, "layernorm_bwd_dw_db_load_by_16_bytes_iff_c_is_a_multiple_of_4_%s", tag);
    k_check_accesses(name, vec0, rep0, C % 4 ? 0 : (C / 4) * (2 * R + 4 + (nchunks > 1 ? 4 * nchunks : 0)));
#endif
    snprintf(name, sizeof name, "layernorm_bwd_dw_db_match_cpu_within_derived_bound_%s", tag);
    within(name, got.data(), want.data(), bound_cpu.data(), got.size());
    snprintf(name, sizeof name, "layernorm_bwd_dw_db_within_two_stage_bound_of_exact_sum_%s", tag);
    within(name, got.data(), exact_f.data(), bound_exact.data(), got.size());
    snprintf(name, sizeof name, "layernorm_bwd_dw_db_same_bits_every_run_and_thread_order_%s", tag);
    k_same_bits_in_every_order(name, run);
    if (C % 4 == 0) { /* x and dout one float past a 16-byte boundary: the scalar path, the same sums */
        std::vector<float> px(1, 0.0f), pg(1, 0.0f);
        px.insert(px.end(), x.begin(), x.end()), pg.insert(pg.end(), dout.begin(), dout.end());
        float *o_x = k_upload(px) + 1, *o_dout = k_upload(pg) + 1;
#ifndef DT_EMU_STUBS
        vec0 = dt_emu_vector_accesses(), rep0 = dt_emu_report_count();
#endif
        std::vector<float> scalar = run_on(o_x, o_dout);
        snprintf(name, sizeof name, "layernorm_bwd_dw_db_scalar_path_same_bits_as_16_byte_path_%s", tag);
#ifndef DT_EMU_STUBS
        if (dt_emu_vector_accesses() != vec0 || dt_emu_report_count() != rep0)
            dt_test_fail(name, "%lld vector accesses at an odd offset, want 0", dt_emu_vector_accesses() - vec0);
        else
#endif
            dt_test_equal_bytes(name, scalar.data(), got.data(), got.size() * sizeof(float));
    }
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
    /* C: one column, a part-filled warp, float4s over part of a warp (100) or not (101), several
       a lane (300, 1100), a full 1024-float4 row (4096); rows: one, part of a block (7), more
       than a block of 8 rows (33, 70: blocks that share the weights' copy). */
    static const int64_t cs[] = {1, 3, 100, 101, 300, 1100, 4096};
    static const int64_t rs[] = {1, 7, 33};
    for (int64_t C : cs)
        for (int64_t R : rs) check_layernorm(C == 4096 && R == 33 ? k_size(33, 9) : R, C, 1, 0, R == 7 && C >= 100);
    check_layernorm(k_size(70, 17), 100, 1, 0, 0);
    check_layernorm(k_size(70, 17), 101, 1, 0, 0);
    check_layernorm(7, 300, 0, 0, 1);  /* no bias: w alone in shared memory */
    check_layernorm(9, 300, 1, 1, 1);  /* a multiple of 4 at an odd offset: the scalar path */
    check_layernorm(3, 8192, 1, 0, 1); /* w and b past 48 KiB: read from global memory */
    if (k_size(1, 0)) check_layernorm(8200, 4, 1, 0, 0); /* past 1024 blocks: the grid strides (not small: slow) */
    check_layernorm_args();
    check_dwdb("r200_c100", k_size(200, 70), 100);  /* 4 chunks (the last of 8 rows), one block of columns */
    check_dwdb("r130_c1100", k_size(130, 66), 1100); /* 3 chunks, two blocks of 256 float4s */
    check_dwdb("r130_c301", k_size(130, 66), 301);  /* not a multiple of 4: two blocks of 256 columns */
    check_dwdb("r40_c100", k_size(40, 20), 100);    /* one chunk: no scratch, no second stage */
    check_dwdb("r7_c3", 7, 3);
    k_free_all();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
