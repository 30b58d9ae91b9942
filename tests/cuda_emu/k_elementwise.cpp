/* tests/cuda_emu/k_elementwise.cpp - kernels/dt_elementwise.cu on the CUDA emulator against the
   dt_tensor.h CPU ops on random inputs (tests/run.sh runs it in every DT_EMU_MODE and under TSan).
   Elementwise kernels do the CPU's float arithmetic per element, so most checks are near-exact. */
#include "dt_tensor.h"
#include "k_common.h"

static dt_ctx ctx;

static void check_bias(void) {
    const int64_t R = k_size(7, 3), C = 37;
    std::vector<float> out = k_random(R * C), bias = k_random(C), dbias0 = k_random(C);
    float *d_out = k_upload(out), *d_bias = k_upload(bias), *d_db = k_upload(dbias0);
    dt_tensor t_out = k_cpu(&ctx, out, R, C), t_bias = k_cpu(&ctx, bias, C), t_db = k_cpu(&ctx, dbias0, C);
    if (k_ok("bias_add_fwd_matches_cpu", dt_k_bias_add_fwd(d_out, d_bias, R, C, NULL))) {
        dt_bias_add_fwd(&ctx, &t_out, &t_bias);
        dt_test_allclose("bias_add_fwd_matches_cpu", k_download(d_out, R * C).data(), (float *)t_out.data, R * C, 0, 1e-6);
    }
    /* dbias starts non-zero: the kernel must add to it */
    if (k_ok("bias_add_bwd_accumulates_like_cpu", dt_k_bias_add_bwd(d_db, d_out, R, C, NULL))) {
        dt_bias_add_bwd(&ctx, &t_db, &t_out);
        dt_test_allclose("bias_add_bwd_accumulates_like_cpu", k_download(d_db, C).data(), (float *)t_db.data, C, 0, 1e-6);
    }
    DT_TEST_CHECK("bias_add_fwd_overflowing_rows_times_c_is_invalid_value",
                  dt_k_bias_add_fwd(d_out, d_bias, INT64_MAX / 2, 3, NULL) == cudaErrorInvalidValue);
    dt_tensor_free(&ctx, &t_out), dt_tensor_free(&ctx, &t_bias), dt_tensor_free(&ctx, &t_db);
}

/* fwd(out, x) and bwd(dx, dout, x) of a unary op against the CPU's, x with a NaN and zeros in it. */
typedef int (*k_fwd_fn)(float *, const float *, int64_t, void *);
typedef int (*k_bwd_fn)(float *, const float *, const float *, int64_t, void *);
typedef dt_status (*cpu_fwd_fn)(dt_ctx *, dt_tensor *, const dt_tensor *);
typedef dt_status (*cpu_bwd_fn)(dt_ctx *, dt_tensor *, const dt_tensor *, const dt_tensor *);
static void check_unary(const char *fwd_name, const char *bwd_name, k_fwd_fn kf, k_bwd_fn kb, cpu_fwd_fn cf,
                        cpu_bwd_fn cb) {
    const int64_t n = k_size(1000, 300); /* not a multiple of the block: the grid-stride tail runs */
    std::vector<float> x = k_random(n, -4, 4), dout = k_random(n), dx0 = k_random(n);
    x[3] = 0.0f, x[4] = -0.0f, x[5] = NAN;
    float *d_x = k_upload(x), *d_out = k_upload(std::vector<float>(n, 0)), *d_dout = k_upload(dout), *d_dx = k_upload(dx0);
    dt_tensor t_x = k_cpu(&ctx, x, n), t_out = k_cpu(&ctx, std::vector<float>(n, 0), n);
    dt_tensor t_dout = k_cpu(&ctx, dout, n), t_dx = k_cpu(&ctx, dx0, n);
    if (k_ok(fwd_name, kf(d_out, d_x, n, NULL))) {
        cf(&ctx, &t_out, &t_x);
        dt_test_allclose(fwd_name, k_download(d_out, n).data(), (float *)t_out.data, n, 1e-7, 1e-6);
    }
    if (k_ok(bwd_name, kb(d_dx, d_dout, d_x, n, NULL))) {
        cb(&ctx, &t_dx, &t_dout, &t_x);
        /* The CPU's gelu' runs on dt's exp (within 1.3e-7 of a double reference); the kernel's on
           tanhf, a few ulps of the derivative's cancellation away (3e-6 seen): f32's 1e-5. */
        dt_test_allclose(bwd_name, k_download(d_dx, n).data(), (float *)t_dx.data, n, 1e-6, 1e-5);
    }
    dt_tensor_free(&ctx, &t_x), dt_tensor_free(&ctx, &t_out), dt_tensor_free(&ctx, &t_dout), dt_tensor_free(&ctx, &t_dx);
}

static void check_binary(void) {
    const int64_t n = k_size(777, 100);
    std::vector<float> a = k_random(n), b = k_random(n), dout = k_random(n), g0 = k_random(n), g1 = k_random(n);
    float *d_a = k_upload(a), *d_b = k_upload(b), *d_out = k_upload(std::vector<float>(n, 0));
    dt_tensor t_a = k_cpu(&ctx, a, n), t_b = k_cpu(&ctx, b, n), t_out = k_cpu(&ctx, std::vector<float>(n, 0), n);
    dt_tensor t_dout = k_cpu(&ctx, dout, n), t_g0 = k_cpu(&ctx, g0, n), t_g1 = k_cpu(&ctx, g1, n);

    if (k_ok("add_matches_cpu", dt_k_add(d_out, d_a, d_b, n, NULL))) {
        dt_add(&ctx, &t_out, &t_a, &t_b);
        dt_test_allclose("add_matches_cpu", k_download(d_out, n).data(), (float *)t_out.data, n, 0, 1e-7);
    }
    if (k_ok("mul_fwd_matches_cpu", dt_k_mul_fwd(d_out, d_a, d_b, n, NULL))) {
        dt_mul_fwd(&ctx, &t_out, &t_a, &t_b);
        dt_test_allclose("mul_fwd_matches_cpu", k_download(d_out, n).data(), (float *)t_out.data, n, 0, 1e-7);
    }
    if (k_ok("axpy_accumulates_like_cpu", dt_k_axpy(d_out, 0.5f, d_a, n, NULL))) {
        dt_axpy(&ctx, &t_out, 0.5f, &t_a);
        dt_test_allclose("axpy_accumulates_like_cpu", k_download(d_out, n).data(), (float *)t_out.data, n, 0, 1e-7);
    }
    if (k_ok("add_out_aliasing_a_matches_cpu", dt_k_add(d_out, d_out, d_b, n, NULL))) {
        dt_add(&ctx, &t_out, &t_out, &t_b);
        dt_test_allclose("add_out_aliasing_a_matches_cpu", k_download(d_out, n).data(), (float *)t_out.data, n, 0, 1e-7);
    }
    float *d_dout = k_upload(dout), *d_g0 = k_upload(g0), *d_g1 = k_upload(g1);
    if (k_ok("mul_bwd_accumulates_like_cpu", dt_k_mul_bwd(d_g0, d_g1, d_dout, d_a, d_b, n, NULL))) {
        dt_mul_bwd(&ctx, &t_g0, &t_g1, &t_dout, &t_a, &t_b);
        std::vector<float> got = k_download(d_g0, n), want = k_values(t_g0), got1 = k_download(d_g1, n),
                           want1 = k_values(t_g1);
        got.insert(got.end(), got1.begin(), got1.end()); /* da then db, one check */
        want.insert(want.end(), want1.begin(), want1.end());
        dt_test_allclose("mul_bwd_accumulates_like_cpu", got.data(), want.data(), 2 * n, 0, 1e-7);
    }
    /* x * x: a == b, da == db, both terms land (da's first) */
    if (k_ok("mul_bwd_same_input_gets_both_terms", dt_k_mul_bwd(d_g0, d_g0, d_dout, d_a, d_a, n, NULL))) {
        dt_mul_bwd(&ctx, &t_g0, &t_g0, &t_dout, &t_a, &t_a);
        dt_test_allclose("mul_bwd_same_input_gets_both_terms", k_download(d_g0, n).data(), (float *)t_g0.data, n, 0, 1e-7);
    }
    DT_TEST_CHECK("relu_fwd_of_zero_elements_is_a_no_op", dt_k_relu_fwd(d_out, d_a, 0, NULL) == 0);
    DT_TEST_CHECK("relu_fwd_negative_n_is_invalid_value", dt_k_relu_fwd(d_out, d_a, -1, NULL) == cudaErrorInvalidValue);
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
    if (k_ok("tensor_cast_f32_to_bf16_bitwise", dt_k_tensor_cast(d_h, DT_BF16, d_f, DT_F32, n, NULL)))
        dt_test_equal_bytes("tensor_cast_f32_to_bf16_bitwise", k_download(d_h, n).data(), want.data(), n * 2);
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

int main(void) {
    dt_ctx_init(&ctx, NULL);
    check_bias();
    check_unary("relu_fwd_matches_cpu", "relu_bwd_accumulates_like_cpu", dt_k_relu_fwd, dt_k_relu_bwd, dt_relu_fwd,
                dt_relu_bwd);
    check_unary("gelu_fwd_matches_cpu", "gelu_bwd_accumulates_like_cpu", dt_k_gelu_fwd, dt_k_gelu_bwd, dt_gelu_fwd,
                dt_gelu_bwd);
    check_binary();
    check_casts();
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
