/* tests/cuda_emu/k_elementwise.cpp - kernels/dt_elementwise.cu on the CUDA emulator against the
   dt_tensor.h CPU ops on random inputs (tests/run.sh runs it in every DT_EMU_MODE and under TSan).
   Elementwise kernels do the CPU's float arithmetic per element, so most checks are near-exact;
   each runs on aligned buffers (the float4 path, then the n % 4 tail) and on views one element
   in (the scalar path), and the emulator's count of vector accesses says which path ran. The
   bias backward is a two-stage column sum: within its derived bound of the CPU's (double) sum,
   and the same bits every run and thread order. */
#include "dt_tensor.h"
#include "k_common.h"
#ifndef DT_EMU_STUBS /* a real GPU build compiles this with the host compiler: no device intrinsics */
#include "dt_cuda.cuh" /* dt_k__ceil_div and dt_k__blocks, the launchers' grid sizes */
#endif

static dt_ctx ctx;

/* The path a launch took, from the emulator's count of vector accesses around it; and no report
   (a misaligned vector access would be one). */
struct k_path {
    long long vec0;
    int reports0;
    k_path() : vec0(dt_emu_vector_accesses()), reports0(dt_emu_report_count()) {}
    void check(const char *name, bool want_vector) const {
#ifdef DT_EMU_STUBS /* a GPU: the path is not observable (a misaligned vector access faults there) */
        dt_test_skip(name, "the launch's path is observable on the emulator only");
        return;
#endif
        long long nvec = dt_emu_vector_accesses() - vec0;
        int nrep = dt_emu_report_count() - reports0;
        if ((nvec > 0) == want_vector && nrep == 0) dt_test_pass(name);
        else dt_test_fail(name, "%lld vector accesses (want %s), %d emulator reports (want 0): %s", nvec,
                          want_vector ? "some" : "none", nrep, nrep ? dt_emu_last_report() : "");
    }
};

/* bias_add_fwd on [R, C] at element offset off: the vector path needs C % 4 == 0 and off == 0. */
static void check_bias_fwd(int64_t C, int64_t off) {
    char name[128], pname[128];
    const int64_t R = k_size(7, 3);
    const bool vec = C % 4 == 0 && off == 0;
    std::vector<float> buf = k_random(R * C + off), bias = k_random(C + off);
    std::vector<float> out(buf.begin() + off, buf.end()), b(bias.begin() + off, bias.end());
    float *d_out = k_upload(buf), *d_bias = k_upload(bias);
    dt_tensor t_out = k_cpu(&ctx, out, R, C), t_bias = k_cpu(&ctx, b, C);
    snprintf(name, sizeof name, "bias_add_fwd_matches_cpu_c%lld%s", (long long)C, off ? "_view_at_offset_1" : "");
    snprintf(pname, sizeof pname, "bias_add_fwd_c%lld%s_takes_the_%s_path", (long long)C,
             off ? "_view_at_offset_1" : "", vec ? "float4" : "scalar");
    k_path path;
    if (k_ok(name, dt_k_bias_add_fwd(d_out + off, d_bias + off, R, C, NULL))) {
        path.check(pname, vec);
        dt_bias_add_fwd(&ctx, &t_out, &t_bias);
        dt_test_allclose(name, k_download(d_out + off, R * C).data(), (float *)t_out.data, R * C, 0, 1e-6);
    }
    dt_tensor_free(&ctx, &t_out), dt_tensor_free(&ctx, &t_bias);
}

/* dbias[C] += column sums of dout[R, C], R rows in chunks of 64. The CPU sums each column in
   double and rounds once, then adds to dbias0 (one more rounding): within gamma(2) S of the
   exact sum, S = |dbias0| + sum|dout|. The kernel: a chunk's rows (at most 63 additions in a
   chain), the chunks' partials (nchunks - 1), the total into dbias0 (1): within gamma(k) S,
   k = 63 + (nchunks - 1) + 1. So |gpu - cpu| <= (gamma(k) + gamma(2)) S. */
static void check_bias_bwd(const char *tag, int64_t R, int64_t C) {
    char name[128];
    const int64_t chunk = 64, nchunks = (R + chunk - 1) / chunk;
    std::vector<float> dout = k_random(R * C), dbias0 = k_random(C);
    float *d_dout = k_upload(dout), *d_db = k_upload(dbias0);
    size_t bytes = dt_k_bias_add_bwd_scratch(R, C);
    size_t want_bytes = nchunks > 1 ? (size_t)(nchunks * C) * sizeof(float) : 0;
    float *d_part = bytes ? k_upload(std::vector<float>(bytes / sizeof(float), 0)) : NULL;
    dt_tensor t_dout = k_cpu(&ctx, dout, R, C), t_db = k_cpu(&ctx, dbias0, C);

    snprintf(name, sizeof name, "bias_add_bwd_scratch_is_a_float_per_column_and_chunk_%s", tag);
    if (bytes == want_bytes) dt_test_pass(name);
    else dt_test_fail(name, "dt_k_bias_add_bwd_scratch(%lld, %lld) = %zu, want %zu", (long long)R, (long long)C, bytes,
                      want_bytes);
    if (nchunks > 1) {
        snprintf(name, sizeof name, "bias_add_bwd_without_scratch_is_invalid_value_%s", tag);
        DT_TEST_CHECK(name, dt_k_bias_add_bwd(d_db, d_dout, R, C, NULL, NULL) == cudaErrorInvalidValue);
    }
    dt_bias_add_bwd(&ctx, &t_db, &t_dout);
    std::vector<double> bound(C);
    const double k = (double)((R < chunk ? R : chunk) - 1) + (double)(nchunks - 1) + 1;
    for (int64_t c = 0; c < C; c++) {
        double S = fabs((double)dbias0[c]);
        for (int64_t r = 0; r < R; r++) S += fabs((double)dout[r * C + c]);
        bound[c] = (k_gamma(k) + k_gamma(2)) * S;
    }
    /* dbias starts non-zero: the kernel must add to it */
    auto run = [&]() {
        cudaMemcpy(d_db, dbias0.data(), C * sizeof(float), cudaMemcpyHostToDevice);
        int st = dt_k_bias_add_bwd(d_db, d_dout, R, C, d_part, NULL);
        std::vector<float> got = k_download(d_db, C);
        if (st) got.assign(C, NAN);
        return got;
    };
    snprintf(name, sizeof name, "bias_add_bwd_accumulates_like_cpu_within_derived_bound_%s", tag);
    std::vector<float> got = run();
    k_within_bound(name, got.data(), (float *)t_db.data, bound.data(), C);
    snprintf(name, sizeof name, "bias_add_bwd_same_bits_every_run_and_thread_order_%s", tag);
    k_same_bits_in_every_order(name, run);
    dt_tensor_free(&ctx, &t_dout), dt_tensor_free(&ctx, &t_db);
}

static void check_bias(void) {
    float *d_out = k_upload(std::vector<float>(8, 0)), *d_bias = k_upload(std::vector<float>(4, 0));
    check_bias_fwd(37, 0); /* C % 4 != 0: scalar */
    check_bias_fwd(64, 0); /* float4 */
    check_bias_fwd(64, 1); /* a view one float in: scalar, no misaligned access */
    check_bias_bwd("r7_c37", k_size(7, 3), 37);       /* one chunk: stage 1 adds into dbias, no scratch */
    check_bias_bwd("r150_c37", k_size(150, 70), 37);  /* 3 chunks (the last of 22 rows) */
    check_bias_bwd("r100_c300", k_size(100, 66), 300); /* 2 chunks, two blocks of columns */
    DT_TEST_CHECK("bias_add_fwd_overflowing_rows_times_c_is_invalid_value",
                  dt_k_bias_add_fwd(d_out, d_bias, INT64_MAX / 2, 3, NULL) == cudaErrorInvalidValue);
}

/* fwd(out, x) and bwd(dx, dout, x) of a unary op against the CPU's, x with a NaN and zeros in it. */
typedef int (*k_fwd_fn)(float *, const float *, int64_t, void *);
typedef int (*k_bwd_fn)(float *, const float *, const float *, int64_t, void *);
typedef dt_status (*cpu_fwd_fn)(dt_ctx *, dt_tensor *, const dt_tensor *);
typedef dt_status (*cpu_bwd_fn)(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *);
static void check_unary(const char *fwd_name, const char *bwd_name, k_fwd_fn kf, k_bwd_fn kb, cpu_fwd_fn cf,
                        cpu_bwd_fn cb, int64_t off) {
    char fname[128], bname[128], pname[160];
    const int64_t n = k_size(1001, 301) - off; /* not a multiple of the block, nor of 4: both tails run */
    std::vector<float> x = k_random(n + off, -4, 4), dout = k_random(n + off), dx0 = k_random(n + off);
    x[off + 3] = 0.0f, x[off + 4] = -0.0f, x[off + 5] = NAN;
    float *d_x = k_upload(x) + off, *d_out = k_upload(std::vector<float>(n + off, 0)) + off;
    float *d_dout = k_upload(dout) + off, *d_dx = k_upload(dx0) + off;
    dt_tensor t_x = k_cpu(&ctx, std::vector<float>(x.begin() + off, x.end()), n);
    dt_tensor t_out = k_cpu(&ctx, std::vector<float>(n, 0), n);
    dt_tensor t_dout = k_cpu(&ctx, std::vector<float>(dout.begin() + off, dout.end()), n);
    dt_tensor t_dx = k_cpu(&ctx, std::vector<float>(dx0.begin() + off, dx0.end()), n);
    const char *sfx = off ? "_view_at_offset_1" : "";
    snprintf(fname, sizeof fname, "%s%s", fwd_name, sfx);
    snprintf(bname, sizeof bname, "%s%s", bwd_name, sfx);
    {
        k_path path;
        if (k_ok(fname, kf(d_out, d_x, n, NULL))) {
            snprintf(pname, sizeof pname, "%s_takes_the_%s_path", fname, off ? "scalar" : "float4");
            path.check(pname, off == 0);
            cf(&ctx, &t_out, &t_x);
            dt_test_allclose(fname, k_download(d_out, n).data(), (float *)t_out.data, n, 1e-7, 1e-6);
        }
    }
    k_path path;
    if (k_ok(bname, kb(d_dx, d_dout, d_x, n, NULL))) {
        snprintf(pname, sizeof pname, "%s_takes_the_%s_path", bname, off ? "scalar" : "float4");
        path.check(pname, off == 0);
        cb(&ctx, &t_dx, &t_dout, &t_x);
        /* The CPU's gelu' runs on dt's exp (within 1.3e-7 of a double reference); the kernel's on
           expf in the same form, a few ulps away: f32's 1e-5. */
        dt_test_allclose(bname, k_download(d_dx, n).data(), (float *)t_dx.data, n, 1e-6, 1e-5);
    }
    dt_tensor_free(&ctx, &t_x), dt_tensor_free(&ctx, &t_out);
    dt_tensor_free(&ctx, &t_dout), dt_tensor_free(&ctx, &t_dx);
}

/* Each binary kernel at element offset off (1: every pointer one float past 16-byte alignment). */
static void check_binary(int64_t off) {
    char name[160];
    const char *sfx = off ? "_view_at_offset_1" : "";
    const int64_t n = k_size(777, 101) - off;
    std::vector<float> a = k_random(n), b = k_random(n), dout = k_random(n), g0 = k_random(n), g1 = k_random(n);
    auto up = [off](const std::vector<float> &v) {
        std::vector<float> h(off, NAN);
        h.insert(h.end(), v.begin(), v.end());
        return k_upload(h) + off;
    };
    float *d_a = up(a), *d_b = up(b), *d_out = up(std::vector<float>(n, 0));
    dt_tensor t_a = k_cpu(&ctx, a, n), t_b = k_cpu(&ctx, b, n), t_out = k_cpu(&ctx, std::vector<float>(n, 0), n);
    dt_tensor t_dout = k_cpu(&ctx, dout, n), t_g0 = k_cpu(&ctx, g0, n), t_g1 = k_cpu(&ctx, g1, n);
#define K_NAME(s) (snprintf(name, sizeof name, "%s%s", (s), sfx), name)
#define K_PATH(s, call)                                                                               \
    do {                                                                                             \
        k_path path_;                                                                                \
        int st_ = (call);                                                                            \
        char pn_[192];                                                                               \
        snprintf(pn_, sizeof pn_, "%s%s_takes_the_%s_path", (s), sfx, off ? "scalar" : "float4");    \
        if (k_ok(K_NAME(s), st_)) path_.check(pn_, off == 0);                                         \
    } while (0)

    K_PATH("add_matches_cpu", dt_k_add(d_out, d_a, d_b, n, NULL));
    dt_add(&ctx, &t_out, &t_a, &t_b);
    dt_test_allclose(K_NAME("add_matches_cpu"), k_download(d_out, n).data(), (float *)t_out.data, n, 0, 1e-7);
    K_PATH("mul_fwd_matches_cpu", dt_k_mul_fwd(d_out, d_a, d_b, n, NULL));
    dt_mul_fwd(&ctx, &t_out, &t_a, &t_b);
    dt_test_allclose(K_NAME("mul_fwd_matches_cpu"), k_download(d_out, n).data(), (float *)t_out.data, n, 0, 1e-7);
    K_PATH("axpy_accumulates_like_cpu", dt_k_axpy(d_out, 0.5f, d_a, n, NULL));
    dt_axpy(&ctx, &t_out, 0.5f, &t_a);
    dt_test_allclose(K_NAME("axpy_accumulates_like_cpu"), k_download(d_out, n).data(), (float *)t_out.data, n, 0, 1e-7);
    K_PATH("add_out_aliasing_a_matches_cpu", dt_k_add(d_out, d_out, d_b, n, NULL));
    dt_add(&ctx, &t_out, &t_out, &t_b);
    dt_test_allclose(K_NAME("add_out_aliasing_a_matches_cpu"), k_download(d_out, n).data(), (float *)t_out.data, n, 0,
                     1e-7);
    float *d_dout = up(dout), *d_g0 = up(g0), *d_g1 = up(g1);
    K_PATH("mul_bwd_accumulates_like_cpu", dt_k_mul_bwd(d_g0, d_g1, d_dout, d_a, d_b, n, NULL));
    {
        dt_mul_bwd(&ctx, &t_g0, &t_g1, &t_dout, &t_a, &t_b);
        std::vector<float> got = k_download(d_g0, n), want = k_values(t_g0), got1 = k_download(d_g1, n),
                           want1 = k_values(t_g1);
        got.insert(got.end(), got1.begin(), got1.end()); /* da then db, one check */
        want.insert(want.end(), want1.begin(), want1.end());
        dt_test_allclose(K_NAME("mul_bwd_accumulates_like_cpu"), got.data(), want.data(), 2 * n, 0, 1e-7);
    }
    /* x * x: a == b, da == db, both terms land (da's first) */
    K_PATH("mul_bwd_same_input_gets_both_terms", dt_k_mul_bwd(d_g0, d_g0, d_dout, d_a, d_a, n, NULL));
    dt_mul_bwd(&ctx, &t_g0, &t_g0, &t_dout, &t_a, &t_a);
    dt_test_allclose(K_NAME("mul_bwd_same_input_gets_both_terms"), k_download(d_g0, n).data(), (float *)t_g0.data, n, 0,
                     1e-7);
#undef K_PATH
#undef K_NAME
    if (!off) {
        DT_TEST_CHECK("relu_fwd_of_zero_elements_is_a_no_op", dt_k_relu_fwd(d_out, d_a, 0, NULL) == 0);
        DT_TEST_CHECK("relu_fwd_negative_n_is_invalid_value",
                      dt_k_relu_fwd(d_out, d_a, -1, NULL) == cudaErrorInvalidValue);
    }
    dt_tensor_free(&ctx, &t_a), dt_tensor_free(&ctx, &t_b), dt_tensor_free(&ctx, &t_out);
    dt_tensor_free(&ctx, &t_dout), dt_tensor_free(&ctx, &t_g0), dt_tensor_free(&ctx, &t_g1);
}

/* Casts bit for bit against dt_tensor.h's scalar conversions, on the hard cases: ties, NaN,
   infinities, overflow to inf, subnormals. */
static void check_casts(void) {
    std::vector<float> f = k_random(k_size(500, 50), -70000, 70000);
    const float special[] = {0.0f, -0.0f, NAN, -NAN, INFINITY, -INFINITY, 65504.0f, 65519.0f, 65520.0f, 1e-8f,
                             -3e-7f, 5.9604645e-8f, 2.9802322e-8f, 8.940697e-8f, 6.1035156e-5f, 1.0f + 1.0f / 256,
                             1.0f + 3.0f / 256, 3.4e38f, 1e-40f, 1.00048828125f, 1.00146484375f};
    f.insert(f.begin(), special, special + sizeof special / sizeof special[0]);
    const int64_t n = (int64_t)f.size();
    float *d_f = k_upload(f);
    uint16_t *d_h = k_upload(std::vector<uint16_t>(n, 0));
    std::vector<uint16_t> want(n);

    for (int i = 0; i < n; i++) want[i] = dt_f32_to_bf16(f[i]);
    {
        k_path path;
        if (k_ok("tensor_cast_f32_to_bf16_bitwise", dt_k_tensor_cast(d_h, DT_BF16, d_f, DT_F32, n, NULL))) {
            path.check("tensor_cast_f32_to_bf16_takes_the_vector_path", true);
            dt_test_equal_bytes("tensor_cast_f32_to_bf16_bitwise", k_download(d_h, n).data(), want.data(), n * 2);
        }
    }
    /* one element in: the 16-bit side is 2 bytes past 8-byte alignment, the f32 side 4 past 16 */
    {
        k_path path;
        if (k_ok("tensor_cast_f32_to_bf16_view_at_offset_1_bitwise",
                 dt_k_tensor_cast(d_h + 1, DT_BF16, d_f + 1, DT_F32, n - 1, NULL))) {
            path.check("tensor_cast_f32_to_bf16_view_at_offset_1_takes_the_scalar_path", false);
            dt_test_equal_bytes("tensor_cast_f32_to_bf16_view_at_offset_1_bitwise", k_download(d_h + 1, n - 1).data(),
                                want.data() + 1, (n - 1) * 2);
        }
    }
    for (int i = 0; i < n; i++) want[i] = dt_f32_to_f16(f[i]);
    if (k_ok("tensor_cast_f32_to_f16_bitwise", dt_k_tensor_cast(d_h, DT_F16, d_f, DT_F32, n, NULL)))
        dt_test_equal_bytes("tensor_cast_f32_to_f16_bitwise", k_download(d_h, n).data(), want.data(), n * 2);

    /* every 7th 16-bit pattern, widened */
    std::vector<uint16_t> h;
    for (uint32_t u = 0; u < 65536; u += (uint32_t)k_size(7, 257)) h.push_back((uint16_t)u);
    const int64_t m = (int64_t)h.size();
    uint16_t *d_h2 = k_upload(h), *d_h3 = k_upload(std::vector<uint16_t>(m, 0));
    float *d_f2 = k_upload(std::vector<float>(m, 0));
    std::vector<float> wantf(m);
    for (int64_t i = 0; i < m; i++) wantf[i] = dt_bf16_to_f32(h[i]);
    if (k_ok("tensor_cast_bf16_to_f32_bitwise", dt_k_tensor_cast(d_f2, DT_F32, d_h2, DT_BF16, m, NULL)))
        dt_test_equal_bytes("tensor_cast_bf16_to_f32_bitwise", k_download(d_f2, m).data(), wantf.data(), m * 4);
    {
        k_path path;
        if (k_ok("tensor_cast_bf16_to_f32_view_at_offset_1_bitwise",
                 dt_k_tensor_cast(d_f2 + 1, DT_F32, d_h2 + 1, DT_BF16, m - 1, NULL))) {
            path.check("tensor_cast_bf16_to_f32_view_at_offset_1_takes_the_scalar_path", false);
            dt_test_equal_bytes("tensor_cast_bf16_to_f32_view_at_offset_1_bitwise", k_download(d_f2 + 1, m - 1).data(),
                                wantf.data() + 1, (m - 1) * 4);
        }
    }
    for (int64_t i = 0; i < m; i++) wantf[i] = dt_f16_to_f32(h[i]);
    if (k_ok("tensor_cast_f16_to_f32_bitwise", dt_k_tensor_cast(d_f2, DT_F32, d_h2, DT_F16, m, NULL)))
        dt_test_equal_bytes("tensor_cast_f16_to_f32_bitwise", k_download(d_f2, m).data(), wantf.data(), m * 4);
    std::vector<uint16_t> want16(m);
    for (int64_t i = 0; i < m; i++) want16[i] = dt_f32_to_f16(dt_bf16_to_f32(h[i]));
    if (k_ok("tensor_cast_bf16_to_f16_goes_through_f32", dt_k_tensor_cast(d_h3, DT_F16, d_h2, DT_BF16, m, NULL)))
        dt_test_equal_bytes("tensor_cast_bf16_to_f16_goes_through_f32", k_download(d_h3, m).data(), want16.data(), m * 2);
    if (k_ok("tensor_cast_same_dtype_copies_every_bit", dt_k_tensor_cast(d_h3, DT_BF16, d_h2, DT_BF16, m, NULL)))
        dt_test_equal_bytes("tensor_cast_same_dtype_copies_every_bit", k_download(d_h3, m).data(), h.data(), m * 2);
    DT_TEST_CHECK("tensor_cast_integer_dtype_is_invalid_value",
                  dt_k_tensor_cast(d_f2, DT_I32, d_h2, DT_F32, m, NULL) == cudaErrorInvalidValue);
}

/* NULL with n > 0 faults inside a kernel: the launchers refuse it; n = 0 touches nothing. And the
   grid size of n items rounds up without n + 3 (or n + threads - 1), which overflows near
   INT64_MAX. */
static void check_refusals(void) {
    float *d = k_upload(std::vector<float>(16, 1.0f));
    k_refused("gelu_fwd_t_NULL_out_is_invalid_value", dt_k_gelu_fwd_t(NULL, 2, d, 1, 8, NULL));
    k_refused("gelu_fwd_t_NULL_x_is_invalid_value", dt_k_gelu_fwd_t(d, 1, NULL, 2, 8, NULL));
    k_refused("gelu_bwd_t_NULL_dout_is_invalid_value", dt_k_gelu_bwd_t(d, 1, NULL, 2, d, 1, 8, NULL));
    k_refused("gelu_bwd_t_NULL_x_is_invalid_value", dt_k_gelu_bwd_t(d, 2, d, 1, NULL, 1, 8, NULL));
    k_refused("tensor_cast_NULL_src_is_invalid_value", dt_k_tensor_cast(d, DT_BF16, NULL, DT_F32, 8, NULL));
    k_refused("tensor_cast_same_dtype_NULL_dst_is_invalid_value", dt_k_tensor_cast(NULL, DT_F32, d, DT_F32, 8, NULL));
    k_refused("relu_fwd_NULL_x_is_invalid_value", dt_k_relu_fwd(d, NULL, 8, NULL));
    k_refused("add_NULL_b_is_invalid_value", dt_k_add(d, d, NULL, 8, NULL));
    k_refused("mul_bwd_da_without_b_is_invalid_value", dt_k_mul_bwd(d, NULL, d, d, NULL, 8, NULL));
    k_refused("bias_add_bwd_NULL_dout_is_invalid_value", dt_k_bias_add_bwd(d, NULL, 2, 4, NULL, NULL));
    k_refused("fill_NULL_is_invalid_value", dt_k_fill(NULL, 0, 4, 8, NULL));
    DT_TEST_CHECK("gelu_fwd_t_n_0_with_NULL_is_ok", dt_k_gelu_fwd_t(NULL, 2, NULL, 2, 0, NULL) == 0);
    DT_TEST_CHECK("mul_bwd_da_only_without_a_is_ok", dt_k_mul_bwd(d, NULL, d, NULL, d, 8, NULL) == 0);
#ifndef DT_EMU_STUBS /* host arithmetic, the same on a GPU build: checked here */
    volatile int64_t big = INT64_MAX; /* not folded: the arithmetic runs as a launcher's would */
    int64_t q = dt_k__ceil_div(big, 4), want = INT64_MAX / 4 + 1;
    unsigned int blocks = dt_k__blocks(big, 256, 1024u);
    dt_test_check_all("grid_of_int64_max_items_rounds_up_without_overflow", q == want && blocks == 1024u,
                      "ceil(INT64_MAX / 4) %lld (want %lld), blocks %u (want 1024)", (long long)q, (long long)want,
                      blocks);
#endif
}

int main(void) {
    dt_ctx_init(&ctx, NULL);
    check_bias();
    for (int64_t off = 0; off <= 1; off++) { /* aligned (float4), then one float in (scalar) */
        check_unary("relu_fwd_matches_cpu", "relu_bwd_accumulates_like_cpu", dt_k_relu_fwd, dt_k_relu_bwd, dt_relu_fwd,
                    dt_relu_bwd, off);
        check_unary("gelu_fwd_matches_cpu", "gelu_bwd_accumulates_like_cpu", dt_k_gelu_fwd, dt_k_gelu_bwd, dt_gelu_fwd,
                    dt_gelu_bwd, off);
        check_binary(off);
    }
    check_casts();
    check_refusals();
    { /* two messages in one printf each print their own (one shared buffer printed the second twice) */
        const char *a = dt_k_error_string((int)cudaErrorInvalidValue), *b = dt_k_error_string((int)cudaErrorMemoryAllocation);
        if (strstr(a, "cudaErrorInvalidValue") && strstr(b, "cudaErrorMemoryAllocation")) dt_test_pass("error_strings_are_each_their_own");
        else dt_test_fail("error_strings_are_each_their_own", "\"%s\" and \"%s\"", a, b);
    }
    {
        const char *s = dt_k_error_string(cudaErrorInvalidValue), *c = dt_k_error_string(1000 + 13);
        if (strstr(s, "cudaErrorInvalidValue") && strstr(c, "CUBLAS_STATUS_EXECUTION_FAILED"))
            dt_test_pass("error_string_names_cuda_and_cublas_statuses");
        else
            dt_test_fail("error_string_names_cuda_and_cublas_statuses", "got \"%s\" and \"%s\"", s, c);
    }
    k_free_all();
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
