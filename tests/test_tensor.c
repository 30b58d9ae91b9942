/* tests/test_tensor.c - unit tests of dt_tensor.h: hand-computed values, naive references,
   finite-difference gradient checks of every backward, RNG known answers and shard
   invariance, safetensors round trips and bad files, and the named errors. */
#include "dt_tensor.h"
#include "dt_test.h"

static dt_ctx C;

/* ---------------------------------------------------------------- small helpers */

static dt_tensor mk(dt_dtype dt, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2; d.shape[3] = d3;
    if (dt_tensor_create(&C, &t, &d)) { fprintf(stderr, "create failed: %s\n", dt_ctx_error(&C)); exit(2); }
    return t;
}
static dt_tensor f32(int64_t d0, int64_t d1) { return mk(DT_F32, d0, d1, 0, 0); }
static float *F(dt_tensor *t) { return (float *)t->data; }

static void randn(dt_tensor *t, const char *name, double std) {
    dt_init_desc d;
    memset(&d, 0, sizeof d);
    d.kind = DT_INIT_NORMAL; d.seed = 1234; d.name = name; d.std = std;
    dt_tensor_init(&C, t, &d);
}

static void set(dt_tensor *t, const float *v) { memcpy(t->data, v, dt_tensor_bytes(t)); }

/* ---------------------------------------------------------------- dtypes */

static void test_dtypes(void) {
    uint32_t i;
    int bad_bf = 0, bad_h = 0;
    DT_TEST_CHECK("bf16_one", dt_f32_to_bf16(1.0f) == 0x3F80);
    /* 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even keeps 0x3F80 */
    DT_TEST_CHECK("bf16_tie_rounds_to_even_down", dt_f32_to_bf16(1.00390625f) == 0x3F80);
    DT_TEST_CHECK("bf16_tie_rounds_to_even_up", dt_f32_to_bf16(1.01171875f) == 0x3F82);
    DT_TEST_CHECK("bf16_above_tie_rounds_up", dt_f32_to_bf16(1.0040000f) == 0x3F81);
    DT_TEST_CHECK("bf16_nan_stays_nan", isnan(dt_bf16_to_f32(dt_f32_to_bf16(NAN))));
    DT_TEST_CHECK("f16_one", dt_f32_to_f16(1.0f) == 0x3C00);
    DT_TEST_CHECK("f16_minus_two", dt_f32_to_f16(-2.0f) == 0xC000);
    DT_TEST_CHECK("f16_max", dt_f32_to_f16(65504.0f) == 0x7BFF);
    DT_TEST_CHECK("f16_overflow_to_inf", dt_f32_to_f16(65520.0f) == 0x7C00);
    DT_TEST_CHECK("f16_below_overflow_rounds_to_max", dt_f32_to_f16(65519.0f) == 0x7BFF);
    DT_TEST_CHECK("f16_smallest_subnormal", dt_f32_to_f16(5.9604645e-8f) == 0x0001);
    DT_TEST_CHECK("f16_tie_rounds_to_even", dt_f32_to_f16(1.00048828125f) == 0x3C00 &&
                                                dt_f32_to_f16(1.00146484375f) == 0x3C02);
    DT_TEST_CHECK("f16_point_one", dt_f32_to_f16(0.1f) == 0x2E66);
    DT_TEST_CHECK("f16_nan_stays_nan", isnan(dt_f16_to_f32(dt_f32_to_f16(NAN))));
    /* every finite 16-bit pattern survives a round trip through f32 */
    for (i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float fb = dt_bf16_to_f32(h), fh = dt_f16_to_f32(h);
        if (!isnan(fb) && dt_f32_to_bf16(fb) != h) bad_bf++;
        if (!isnan(fh) && dt_f32_to_f16(fh) != h) bad_h++;
    }
    DT_TEST_CHECK("bf16_round_trip_all_patterns", bad_bf == 0);
    DT_TEST_CHECK("f16_round_trip_all_patterns", bad_h == 0);
    DT_TEST_CHECK("dtype_sizes", dt_dtype_size(DT_F32) == 4 && dt_dtype_size(DT_BF16) == 2 &&
                                     dt_dtype_size(DT_I64) == 8 && dt_dtype_size(DT_U8) == 1 &&
                                     dt_dtype_size(DT_DTYPE_DEFAULT) == 4);
}

/* ---------------------------------------------------------------- context and tensors */

typedef struct { long allocs, frees; } counting;
static void *count_alloc(size_t n, void *u) { ((counting *)u)->allocs++; return malloc(n); }
static void count_release(void *p, void *u) { ((counting *)u)->frees++; free(p); }

static void test_tensors(void) {
    dt_ctx c2;
    dt_ctx_desc cd;
    counting cnt = {0, 0};
    dt_tensor t, v, w;
    dt_tensor_desc d;
    int64_t shape[2] = {2, 3};
    dt_status st;
    float vals[6] = {1, 2, 3, 4, 5, 6};

    memset(&cd, 0, sizeof cd);
    cd.allocator.alloc_fn = count_alloc;
    cd.allocator.release_fn = count_release;
    cd.allocator.user = &cnt;
    dt_ctx_init(&c2, &cd);
    memset(&d, 0, sizeof d);
    d.shape[0] = 100; d.shape[1] = 10;
    dt_tensor_create(&c2, &t, &d);
    DT_TEST_CHECK("allocator_counts_bytes", c2.bytes_in_use == 4000 && cnt.allocs == 1);
    DT_TEST_CHECK("create_zero_fills", F(&t)[0] == 0 && F(&t)[999] == 0);
    DT_TEST_CHECK("data_is_64_byte_aligned", ((uintptr_t)t.data % 64) == 0);
    dt_tensor_free(&c2, &t);
    DT_TEST_CHECK("free_returns_bytes_and_peak_stays", c2.bytes_in_use == 0 && c2.bytes_peak == 4000 && cnt.frees == 1);
    dt_ctx_shutdown(&c2);

    memset(&cd, 0, sizeof cd);
    cd.allocator.alloc_fn = count_alloc;
    st = dt_ctx_init(&c2, &cd);
    dt_test_error("ctx_half_allocator_is_named", st, dt_ctx_error(&c2), "release_fn");

    t = f32(6, 0);
    set(&t, vals);
    st = dt_tensor_view(&C, &v, &t, 2, 2, (int64_t[]){2, 2});
    DT_TEST_CHECK("view_shares_memory", st == 0 && F(&v) == F(&t) + 2 && v.numel == 4 && F(&v)[3] == 6 && !v.owns);
    /* shape {2,3} starting at 1 needs 6 elements of 5 left */
    dt_test_error("view_out_of_range_is_named", dt_tensor_view(&C, &v, &t, 1, 2, (int64_t[]){2, 3}),
                  dt_ctx_error(&C), "exceeds");
    st = dt_tensor_reshape(&C, &v, &t, 2, shape);
    DT_TEST_CHECK("reshape_keeps_data", st == 0 && v.ndim == 2 && v.shape[1] == 3 && F(&v)[5] == 6);
    dt_test_error("reshape_wrong_numel_is_named", dt_tensor_reshape(&C, &v, &t, 2, (int64_t[]){4, 2}),
                  dt_ctx_error(&C), "8 elements");
    w = f32(6, 0);
    dt_tensor_copy(&C, &w, &t);
    DT_TEST_CHECK("copy_copies", memcmp(w.data, t.data, 24) == 0);
    dt_tensor_fill(&C, &w, 2.5);
    DT_TEST_CHECK("fill_fills", F(&w)[0] == 2.5f && F(&w)[5] == 2.5f);
    {
        dt_tensor b = mk(DT_BF16, 6, 0, 0, 0), back = f32(6, 0), i = mk(DT_I32, 6, 0, 0, 0);
        dt_tensor_cast(&C, &b, &t);
        dt_tensor_cast(&C, &back, &b);
        DT_TEST_CHECK("cast_f32_bf16_f32_exact_for_small_ints", memcmp(back.data, t.data, 24) == 0);
        dt_tensor_cast(&C, &i, &t);
        DT_TEST_CHECK("cast_f32_to_i32", ((int32_t *)i.data)[5] == 6);
        dt_test_error("copy_dtype_mismatch_is_named", dt_tensor_copy(&C, &b, &t), dt_ctx_error(&C), "bf16");
        dt_tensor_free(&C, &b); dt_tensor_free(&C, &back); dt_tensor_free(&C, &i);
    }
    memset(&d, 0, sizeof d);
    d.device = DT_CUDA_DEVICE;
    d.shape[0] = 4;
    st = dt_tensor_create(&C, &v, &d);
#ifndef DT_CUDA
    dt_test_error("cuda_tensor_without_cuda_is_named", st, dt_ctx_error(&C), "built without DT_CUDA");
#endif
    memset(&d, 0, sizeof d);
    d.shape[0] = 4; d.shape[1] = -2;
    dt_test_error("negative_dim_is_named", dt_tensor_create(&C, &v, &d), dt_ctx_error(&C), "desc.shape[1] = -2");
    d.shape[1] = 0; d.shape[2] = 3;
    dt_test_error("dim_after_zero_is_named", dt_tensor_create(&C, &v, &d), dt_ctx_error(&C), "comes after the 1 dims");
    memset(&d, 0, sizeof d);
    d.dtype = (dt_dtype)42; d.shape[0] = 1;
    dt_test_error("bad_dtype_is_named", dt_tensor_create(&C, &v, &d), dt_ctx_error(&C), "desc.dtype = 42");
    dt_tensor_free(&C, &t);
    dt_tensor_free(&C, &w);
}

/* ---------------------------------------------------------------- RNG */

static void test_rng(void) {
    /* Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors). */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                       {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    static const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    static const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                        {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    int k, bad = 0, r, c;
    dt_tensor whole, shard;
    dt_init_desc d;
    double mean = 0, var = 0, umin = 1, umax = 0;
    for (k = 0; k < 3; k++) {
        uint32_t out[4];
        dt_philox4x32(ctr[k], key[k], out);
        if (memcmp(out, want[k], 16) != 0) {
            bad++;
            dt_test_fail("philox_known_answers", "vector %d: got %08x %08x %08x %08x, want %08x %08x %08x %08x", k,
                         out[0], out[1], out[2], out[3], want[k][0], want[k][1], want[k][2], want[k][3]);
        }
    }
    if (!bad) dt_test_pass("philox_known_answers");

    /* a [3,4] shard at (2,5) of a [6,10] tensor, initialised alone, equals that slice */
    whole = f32(6, 10);
    shard = f32(3, 4);
    memset(&d, 0, sizeof d);
    d.kind = DT_INIT_NORMAL; d.seed = 7; d.name = "w"; d.std = 0.02;
    dt_tensor_init(&C, &whole, &d);
    d.global_shape[0] = 6; d.global_shape[1] = 10; d.start[0] = 2; d.start[1] = 5;
    dt_tensor_init(&C, &shard, &d);
    for (bad = 0, r = 0; r < 3; r++)
        for (c = 0; c < 4; c++) bad += F(&shard)[r * 4 + c] != F(&whole)[(r + 2) * 10 + c + 5];
    DT_TEST_CHECK("init_shard_equals_slice_of_whole", bad == 0);
    d.start[1] = 7;
    dt_test_error("init_shard_outside_global_is_named", dt_tensor_init(&C, &shard, &d), dt_ctx_error(&C),
                  "outside the global extent");
    d.name = "other"; d.start[1] = 5;
    dt_tensor_init(&C, &shard, &d);
    DT_TEST_CHECK("init_depends_on_name", F(&shard)[0] != F(&whole)[2 * 10 + 5]);
    dt_tensor_free(&C, &whole);
    dt_tensor_free(&C, &shard);

    /* moments of 200k draws: mean 0 +- 5 sigma/sqrt(n), var 1 +- 2% */
    for (k = 0; k < 200000; k++) {
        double x = dt_rng_normal(3, 9, (uint64_t)k), u = dt_rng_uniform(3, 9, (uint64_t)k);
        mean += x; var += x * x;
        if (u < umin) umin = u;
        if (u > umax) umax = u;
    }
    mean /= 200000; var = var / 200000 - mean * mean;
    dt_test_close("normal_mean_near_zero", mean, 0.0, 5.0 / sqrt(200000.0));
    dt_test_close("normal_variance_near_one", var, 1.0, 0.02);
    DT_TEST_CHECK("uniform_in_unit_interval", umin >= 0.0 && umax < 1.0 && umin < 1e-3 && umax > 0.999);
    {
        dt_tensor w = f32(64, 256);
        double s2 = 0;
        memset(&d, 0, sizeof d);
        d.kind = DT_INIT_SCALED_NORMAL; d.seed = 1; d.name = "lin";
        dt_tensor_init(&C, &w, &d);
        dt_sumsq(&C, &s2, &w);
        /* std = 1/sqrt(fan_in = 256) */
        dt_test_close("scaled_normal_std_is_one_over_sqrt_fan_in", sqrt(s2 / (double)w.numel), 1.0 / 16.0, 0.002);
        dt_tensor_free(&C, &w);
    }
}

/* ---------------------------------------------------------------- ops: hand values and references */

static void naive_gemm(int ta, int tb, int M, int N, int K, float alpha, const float *A, const float *B, float beta,
                       float *Cm) {
    int i, j, k;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) {
            double s = 0;
            for (k = 0; k < K; k++) s += (double)(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
            Cm[i * N + j] = (float)(alpha * s + beta * Cm[i * N + j]);
        }
}

static void test_matmul(void) {
    static const int sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {97, 65, 300}, {6, 16, 256}, {130, 1030, 257}};
    char name[96];
    int s, ta, tb, k;
    float a22[4] = {1, 2, 3, 4}, b22[4] = {5, 6, 7, 8}, want22[4] = {19, 22, 43, 50};
    dt_tensor a = f32(2, 2), b = f32(2, 2), c = f32(2, 2), bad;
    set(&a, a22); set(&b, b22);
    dt_matmul_fwd(&C, &c, &a, &b, 0, 0, 1.0f, 0.0f);
    dt_test_allclose("matmul_2x2_by_hand", F(&c), want22, 4, 0, 0);
    bad = f32(3, 2);
    dt_test_error("matmul_wrong_shape_is_named", dt_matmul_fwd(&C, &c, &a, &bad, 0, 0, 1, 0), dt_ctx_error(&C),
                  "inner dims differ");
    dt_test_error("matmul_wrong_out_is_named", dt_matmul_fwd(&C, &bad, &a, &b, 0, 0, 1, 0), dt_ctx_error(&C),
                  "out shape [3, 2]; expected [2, 2]");
    dt_tensor_free(&C, &a); dt_tensor_free(&C, &b); dt_tensor_free(&C, &c); dt_tensor_free(&C, &bad);

    for (s = 0; s < 5; s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++) {
                int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
                dt_tensor A = ta ? f32(K, M) : f32(M, K), B = tb ? f32(N, K) : f32(K, N);
                dt_tensor O = f32(M, N), R = f32(M, N), P = f32(M, N);
                randn(&A, "A", 1); randn(&B, "B", 1); randn(&O, "O", 1);
                dt_tensor_copy(&C, &R, &O);
                dt_tensor_copy(&C, &P, &O);
                naive_gemm(ta, tb, M, N, K, 0.5f, F(&A), F(&B), 0.25f, F(&R));
                dt_matmul_fwd(&C, &O, &A, &B, ta, tb, 0.5f, 0.25f);
                snprintf(name, sizeof name, "matmul_matches_naive_%dx%dx%d_ta%d_tb%d", M, N, K, ta, tb);
                dt_test_allclose(name, F(&O), F(&R), (size_t)(M * N), 1e-4, 1e-4);
                dt_gemm_portable(&C, ta, tb, M, N, K, 0.5f, F(&A), ta ? M : K, F(&B), tb ? K : N, 0.25f, F(&P), N);
                snprintf(name, sizeof name, "portable_gemm_matches_naive_%dx%dx%d_ta%d_tb%d", M, N, K, ta, tb);
                dt_test_allclose(name, F(&P), F(&R), (size_t)(M * N), 1e-4, 1e-4);
                dt_tensor_free(&C, &A); dt_tensor_free(&C, &B); dt_tensor_free(&C, &O); dt_tensor_free(&C, &R);
                dt_tensor_free(&C, &P);
            }
    { /* batched with a shared 2-D b equals per-batch 2-D matmuls */
        dt_tensor A = mk(DT_F32, 3, 4, 5, 0), B = f32(5, 6), O = mk(DT_F32, 3, 4, 6, 0), want = mk(DT_F32, 3, 4, 6, 0);
        randn(&A, "A", 1); randn(&B, "B", 1);
        for (k = 0; k < 3; k++) naive_gemm(0, 0, 4, 6, 5, 1, F(&A) + k * 20, F(&B), 0, F(&want) + k * 24);
        dt_matmul_fwd(&C, &O, &A, &B, 0, 0, 1, 0);
        dt_test_allclose("matmul_batched_shared_b", F(&O), F(&want), 72, 1e-5, 1e-5);
        dt_tensor_free(&C, &A); dt_tensor_free(&C, &B); dt_tensor_free(&C, &O); dt_tensor_free(&C, &want);
    }
}

static void test_ops_by_hand(void) {
    dt_tensor x = f32(1, 4), o = f32(1, 4), w = f32(4, 0), b = f32(4, 0), mean = f32(1, 0), rstd = f32(1, 0);
    float xv[4] = {1, 2, 3, 4}, ones[4] = {1, 1, 1, 1}, want[4];
    float loss;
    int64_t nv;
    int i;
    double s;
    set(&x, xv); set(&w, ones);
    dt_layernorm_fwd(&C, &o, &mean, &rstd, &x, &w, &b, 1e-5f);
    for (i = 0; i < 4; i++) want[i] = (float)((xv[i] - 2.5) / sqrt(1.25 + 1e-5));
    dt_test_allclose("layernorm_by_hand", F(&o), want, 4, 1e-6, 1e-6);
    dt_test_close("layernorm_saves_mean", F(&mean)[0], 2.5, 1e-7);
    dt_test_error("layernorm_bad_eps_is_named", dt_layernorm_fwd(&C, &o, NULL, NULL, &x, &w, &b, 0.0f),
                  dt_ctx_error(&C), "eps = 0");
    {
        float gx[3] = {1.0f, 0.0f, -1.0f}, gw[3] = {0.8411920f, 0.0f, -0.1588080f};
        dt_tensor g = f32(3, 0), go = f32(3, 0);
        set(&g, gx);
        dt_gelu_fwd(&C, &go, &g);
        dt_test_allclose("gelu_tanh_by_hand", F(&go), gw, 3, 1e-6, 0);
        dt_relu_fwd(&C, &go, &g);
        DT_TEST_CHECK("relu_by_hand", F(&go)[0] == 1 && F(&go)[1] == 0 && F(&go)[2] == 0);
        dt_tensor_free(&C, &g); dt_tensor_free(&C, &go);
    }
    {
        float lv[5] = {0, 0, 1, 2, 3};
        int32_t tv[2] = {0, 2};
        dt_tensor l2 = f32(1, 2), p2 = f32(1, 2), l3 = f32(1, 3), p3 = f32(1, 3), t = mk(DT_I32, 1, 0, 0, 0);
        dt_tensor lt = f32(2, 3), pt = f32(2, 3), t2 = mk(DT_I32, 2, 0, 0, 0);
        set(&l2, lv); set(&l3, lv + 2);
        ((int32_t *)t.data)[0] = 0;
        dt_softmax_xent_fwd(&C, &loss, &nv, &p2, &l2, &t, -1);
        dt_test_close("xent_uniform_two_classes_is_ln2", loss, log(2.0), 1e-6);
        ((int32_t *)t.data)[0] = 2;
        dt_softmax_xent_fwd(&C, &loss, &nv, &p3, &l3, &t, -1);
        dt_test_close("xent_by_hand", loss, log(exp(1.0) + exp(2.0) + exp(3.0)) - 3.0, 1e-6);
        memcpy(F(&lt), lv + 2, 12); memcpy(F(&lt) + 3, lv + 2, 12);
        tv[0] = -100; tv[1] = 2;
        memcpy(t2.data, tv, 8);
        dt_softmax_xent_fwd(&C, &loss, &nv, &pt, &lt, &t2, -100);
        DT_TEST_CHECK("xent_ignore_index_skips_rows", nv == 1 && fabsf(loss - (float)(log(exp(1.0) + exp(2.0) + exp(3.0)) - 3.0)) < 1e-6f);
        ((int32_t *)t.data)[0] = 3;
        dt_test_error("xent_target_out_of_range_is_named", dt_softmax_xent_fwd(&C, &loss, &nv, &p3, &l3, &t, -1),
                      dt_ctx_error(&C), "targets[0] = 3");
        dt_tensor_free(&C, &l2); dt_tensor_free(&C, &p2); dt_tensor_free(&C, &l3); dt_tensor_free(&C, &p3);
        dt_tensor_free(&C, &t); dt_tensor_free(&C, &lt); dt_tensor_free(&C, &pt); dt_tensor_free(&C, &t2);
    }
    {
        float z[2] = {0, 2}, y[2] = {1, 0};
        dt_tensor zt = f32(2, 0), yt = f32(2, 0);
        set(&zt, z); set(&yt, y);
        dt_bce_logits_fwd(&C, &loss, &zt, &yt);
        dt_test_close("bce_by_hand", loss, (log(2.0) + log(1.0 + exp(2.0))) / 2, 1e-6);
        z[0] = 200; y[0] = 0; z[1] = -200; y[1] = 1;
        set(&zt, z); set(&yt, y);
        dt_bce_logits_fwd(&C, &loss, &zt, &yt);
        dt_test_close("bce_stable_for_large_logits", loss, 200.0, 1e-3);
        dt_tensor_free(&C, &zt); dt_tensor_free(&C, &yt);
    }
    dt_sum(&C, &s, &x);
    dt_test_close("sum_by_hand", s, 10.0, 0);
    dt_sumsq(&C, &s, &x);
    dt_test_close("sumsq_by_hand", s, 30.0, 0);
    dt_axpy(&C, &o, 2.0f, &x);
    dt_add(&C, &o, &o, &x);
    dt_scale(&C, &o, 0.5f);
    for (i = 0; i < 4; i++) want[i] = 0.5f * ((float)((xv[i] - 2.5) / sqrt(1.25 + 1e-5)) + 3 * xv[i]);
    dt_test_allclose("axpy_add_scale_by_hand", F(&o), want, 4, 1e-6, 1e-6);
    {
        float tab[6] = {1, 2, 3, 4, 5, 6}, g[6] = {1, 1, 10, 10, 100, 100}, wantg[6] = {10, 10, 0, 0, 101, 101};
        int64_t ids[3] = {2, 0, 2};
        dt_tensor table = f32(3, 2), out = f32(3, 2), idt = mk(DT_I64, 3, 0, 0, 0), dout = f32(3, 2), dtab = f32(3, 2);
        float wantf[6] = {5, 6, 1, 2, 5, 6};
        set(&table, tab); memcpy(idt.data, ids, 24); set(&dout, g);
        dt_embedding_fwd(&C, &out, &table, &idt);
        dt_test_allclose("embedding_gather_by_hand", F(&out), wantf, 6, 0, 0);
        dt_embedding_bwd(&C, &dtab, &dout, &idt);
        dt_test_allclose("embedding_scatter_add_repeated_ids", F(&dtab), wantg, 6, 0, 0);
        ((int64_t *)idt.data)[1] = 10;
        dt_test_error("embedding_id_out_of_range_is_named", dt_embedding_fwd(&C, &out, &table, &idt),
                      dt_ctx_error(&C), "ids[1] = 10 is outside");
        dt_tensor_free(&C, &table); dt_tensor_free(&C, &out); dt_tensor_free(&C, &idt); dt_tensor_free(&C, &dout);
        dt_tensor_free(&C, &dtab);
    }
    {
        float dv[2] = {1, 2}, ev[4] = {3, 4, 5, 6}, wantd[5] = {1, 2, 11, 17, 39};
        dt_tensor dense = f32(1, 2), emb = mk(DT_F32, 1, 2, 2, 0), out = f32(1, 5);
        set(&dense, dv); set(&emb, ev);
        dt_dot_interaction_fwd(&C, &out, &dense, &emb);
        dt_test_allclose("dot_interaction_by_hand", F(&out), wantd, 5, 0, 0);
        dt_tensor_free(&C, &dense); dt_tensor_free(&C, &emb); dt_tensor_free(&C, &out);
    }
    {
        float av[4] = {1, 2, 3, 4}, bv[2] = {9, 8}, wantc[6] = {1, 2, 9, 3, 4, 8};
        dt_tensor a = f32(2, 2), bb = f32(2, 1), c = f32(2, 3), a2 = f32(2, 2), b2 = f32(2, 1);
        const dt_tensor *ins[2];
        dt_tensor *outs[2];
        ins[0] = &a; ins[1] = &bb; outs[0] = &a2; outs[1] = &b2;
        set(&a, av); set(&bb, bv);
        dt_concat_fwd(&C, &c, ins, 2);
        dt_test_allclose("concat_last_dim_by_hand", F(&c), wantc, 6, 0, 0);
        dt_split_fwd(&C, outs, 2, &c);
        DT_TEST_CHECK("split_inverts_concat", memcmp(a2.data, av, 16) == 0 && memcmp(b2.data, bv, 8) == 0);
        dt_tensor_free(&C, &bb);
        bb = f32(2, 2);
        ins[1] = &bb;
        dt_test_error("concat_width_mismatch_is_named", dt_concat_fwd(&C, &c, ins, 2), dt_ctx_error(&C), "sum to 4");
        dt_tensor_free(&C, &a); dt_tensor_free(&C, &bb); dt_tensor_free(&C, &c); dt_tensor_free(&C, &a2);
        dt_tensor_free(&C, &b2);
    }
    {   /* T = 2, one head: row 0 attends to itself only, so out[0] = v[0] */
        dt_tensor qkv = mk(DT_F32, 1, 2, 6, 0), out = mk(DT_F32, 1, 2, 2, 0), att = mk(DT_F32, 1, 1, 2, 2);
        float q[12] = {1, 0, 1, 0, 10, 20, /* t=1 */ 0, 1, 0, 1, 30, 40};
        double a0 = exp(0.0 / sqrt(2.0)), a1 = exp(1.0 / sqrt(2.0));
        float want_o[4] = {10, 20, (float)((10 * a0 + 30 * a1) / (a0 + a1)), (float)((20 * a0 + 40 * a1) / (a0 + a1))};
        set(&qkv, q);
        dt_attention_fwd(&C, &out, &att, &qkv, 1);
        dt_test_allclose("attention_causal_by_hand", F(&out), want_o, 4, 1e-5, 1e-5);
        DT_TEST_CHECK("attention_masks_the_future", F(&att)[1] == 0.0f && F(&att)[0] == 1.0f);
        dt_test_error("attention_bad_heads_is_named", dt_attention_fwd(&C, &out, &att, &qkv, 3), dt_ctx_error(&C),
                      "n_head = 3");
        dt_tensor_free(&C, &qkv); dt_tensor_free(&C, &out); dt_tensor_free(&C, &att);
    }
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &o); dt_tensor_free(&C, &w); dt_tensor_free(&C, &b);
    dt_tensor_free(&C, &mean); dt_tensor_free(&C, &rstd);
}

/* ---------------------------------------------------------------- finite-difference gradient checks

   Loss L = sum(out * R) for a fixed random R (or the op's own scalar loss). The analytic
   gradient is the op's backward with dout = R; the numeric one is the central difference
   (L(x+h) - L(x-h)) / 2h in float32 with h = 1e-2, which has error ~h^2 |f'''| + eps |L| / h,
   about 1e-4 here: the tolerance 2e-3 + 2e-2 |g| is 10x above that and far below what a wrong
   formula gives. Up to 40 elements of each input are probed. */

typedef struct gc {
    const char *name;
    int n_in;
    dt_tensor *in[4], *gin[4];
    const char *in_names[4];
    dt_tensor *out, *R;
    float loss;
    dt_status (*fwd)(struct gc *g);
    dt_status (*bwd)(struct gc *g);
    int ia, ib; /* op arguments (transposes, heads, ...) */
    dt_tensor *aux[3];
} gc;
/* a failed call returns its status (the library's own TRY is private to its implementation) */
#define GC_TRY(x) do { dt_status gc_s_ = (x); if (gc_s_) return gc_s_; } while (0)

static double gc_loss(gc *g) {
    double s = 0;
    int64_t i;
    if (g->fwd(g)) { fprintf(stderr, "%s fwd: %s\n", g->name, dt_ctx_error(&C)); return NAN; }
    if (!g->out) return g->loss;
    for (i = 0; i < g->out->numel; i++) s += (double)F(g->out)[i] * F(g->R)[i];
    return s;
}

static void gradcheck(gc *g) {
    int k, n;
    char name[128];
    if (g->out) {
        dt_tensor_desc d;
        int j;
        memset(&d, 0, sizeof d);
        for (j = 0; j < g->out->ndim; j++) d.shape[j] = g->out->shape[j];
        dt_tensor_create(&C, g->R, &d);
        randn(g->R, "R", 1);
    }
    gc_loss(g);
    for (k = 0; k < g->n_in; k++) dt_tensor_fill(&C, g->gin[k], 0.0);
    if (g->bwd(g)) { dt_test_fail(g->name, "bwd: %s", dt_ctx_error(&C)); return; }
    for (k = 0; k < g->n_in; k++) {
        int64_t stride = g->in[k]->numel / 40 + 1, i;
        int bad = 0;
        double worst_num = 0, worst_ana = 0;
        for (n = 0, i = 0; i < g->in[k]->numel; i += stride, n++) {
            float *x = F(g->in[k]) + i, keep = *x, h = 1e-2f;
            double lp, lm, num, ana = F(g->gin[k])[i];
            *x = keep + h; lp = gc_loss(g);
            *x = keep - h; lm = gc_loss(g);
            *x = keep;
            num = (lp - lm) / (2.0 * h);
            if (!(fabs(num - ana) <= 2e-3 + 2e-2 * fabs(num)) && !bad++) { worst_num = num; worst_ana = ana; }
        }
        snprintf(name, sizeof name, "gradcheck_%s_d%s", g->name, g->in_names[k]);
        if (bad) dt_test_fail(name, "%d of %d probes off; e.g. numeric %.6g vs analytic %.6g", bad, n, worst_num, worst_ana);
        else dt_test_pass(name);
    }
    /* gradients accumulate: a second backward doubles them */
    {
        float before = F(g->gin[0])[0];
        g->bwd(g);
        snprintf(name, sizeof name, "%s_bwd_accumulates", g->name);
        dt_test_close(name, F(g->gin[0])[0], 2.0 * before, 1e-5 + 1e-5 * fabs(before));
    }
}

static dt_status mm_f(gc *g) { return dt_matmul_fwd(&C, g->out, g->in[0], g->in[1], g->ia, g->ib, 1.5f, 0.0f); }
static dt_status mm_b(gc *g) { return dt_matmul_bwd(&C, g->gin[0], g->gin[1], g->R, g->in[0], g->in[1], g->ia, g->ib, 1.5f); }
static dt_status lin_f(gc *g) { return dt_linear_fwd(&C, g->out, g->in[0], g->in[1], g->in[2]); }
static dt_status lin_b(gc *g) { return dt_linear_bwd(&C, g->gin[0], g->gin[1], g->gin[2], g->R, g->in[0], g->in[1]); }
/* linear then GELU in one call (aux[0] = pre); its backward is gelu_bwd into aux[1], then linear_bwd
   (pre made again first: the probes' forwards leave the last perturbed input's) */
static dt_status lg_f(gc *g) { return dt_linear_gelu_fwd(&C, g->out, g->aux[0], g->in[0], g->in[1], g->in[2]); }
static dt_status lg_b(gc *g) {
    GC_TRY(dt_linear_fwd(&C, g->aux[0], g->in[0], g->in[1], g->in[2]));
    GC_TRY(dt_tensor_fill(&C, g->aux[1], 0.0));
    GC_TRY(dt_gelu_bwd(&C, g->aux[1], g->R, g->aux[0]));
    return dt_linear_bwd(&C, g->gin[0], g->gin[1], g->gin[2], g->aux[1], g->in[0], g->in[1]);
}
static dt_status bias_f(gc *g) { GC_TRY(dt_tensor_copy(&C, g->out, g->in[0])); return dt_bias_add_fwd(&C, g->out, g->in[1]); }
static dt_status bias_b(gc *g) { GC_TRY(dt_axpy(&C, g->gin[0], 1, g->R)); return dt_bias_add_bwd(&C, g->gin[1], g->R); }
static dt_status relu_f(gc *g) { return dt_relu_fwd(&C, g->out, g->in[0]); }
static dt_status relu_b(gc *g) { return dt_relu_bwd(&C, g->gin[0], g->R, g->in[0]); }
static dt_status mul_f(gc *g) { return dt_mul_fwd(&C, g->out, g->in[0], g->in[1]); }
static dt_status mul_b(gc *g) { return dt_mul_bwd(&C, g->gin[0], g->gin[1], g->R, g->in[0], g->in[1]); }
static dt_status gelu_f(gc *g) { return dt_gelu_fwd(&C, g->out, g->in[0]); }
static dt_status gelu_b(gc *g) { return dt_gelu_bwd(&C, g->gin[0], g->R, g->in[0]); }
static dt_status ln_f(gc *g) { return dt_layernorm_fwd(&C, g->out, g->aux[0], g->aux[1], g->in[0], g->in[1], g->in[2], 1e-5f); }
static dt_status ln_b(gc *g) {
    return dt_layernorm_bwd(&C, g->gin[0], g->gin[1], g->gin[2], g->R, g->in[0], g->in[1], g->aux[0], g->aux[1]);
}
static dt_status xent_f(gc *g) { return dt_softmax_xent_fwd(&C, &g->loss, NULL, g->aux[0], g->in[0], g->aux[1], 1); }
static dt_status xent_b(gc *g) { return dt_softmax_xent_bwd(&C, g->gin[0], g->aux[0], g->aux[1], 1, 1.0f); }
static dt_status bce_f(gc *g) { return dt_bce_logits_fwd(&C, &g->loss, g->in[0], g->aux[0]); }
static dt_status bce_b(gc *g) { return dt_bce_logits_bwd(&C, g->gin[0], g->in[0], g->aux[0], 1.0f); }
static dt_status emb_f(gc *g) { return dt_embedding_fwd(&C, g->out, g->in[0], g->aux[0]); }
static dt_status emb_b(gc *g) { return dt_embedding_bwd(&C, g->gin[0], g->R, g->aux[0]); }
static dt_status att_f(gc *g) { return dt_attention_fwd(&C, g->out, g->aux[0], g->in[0], g->ia); }
static dt_status att_b(gc *g) { return dt_attention_bwd(&C, g->gin[0], g->R, g->in[0], g->aux[0], g->ia); }
static dt_status dot_f(gc *g) { return dt_dot_interaction_fwd(&C, g->out, g->in[0], g->in[1]); }
static dt_status dot_b(gc *g) { return dt_dot_interaction_bwd(&C, g->gin[0], g->gin[1], g->R, g->in[0], g->in[1]); }
static dt_status cat_f(gc *g) { const dt_tensor *p[2]; p[0] = g->in[0]; p[1] = g->in[1]; return dt_concat_fwd(&C, g->out, p, 2); }
static dt_status cat_b(gc *g) { dt_tensor *p[2]; p[0] = g->gin[0]; p[1] = g->gin[1]; return dt_concat_bwd(&C, p, 2, g->R); }
/* split as a loss: L = sum(part0 * R0) + sum(part1 * R1) with R = [R0 | R1] laid out like the input */
static dt_status split_f(gc *g) {
    dt_tensor *p[2];
    p[0] = g->aux[0]; p[1] = g->aux[1];
    GC_TRY(dt_split_fwd(&C, p, 2, g->in[0]));
    { const dt_tensor *q[2]; q[0] = g->aux[0]; q[1] = g->aux[1]; return dt_concat_fwd(&C, g->out, q, 2); }
}
static dt_status split_b(gc *g) {
    dt_tensor *p[2];
    const dt_tensor *q[2];
    dt_tensor_fill(&C, g->aux[0], 0); dt_tensor_fill(&C, g->aux[1], 0);
    p[0] = g->aux[0]; p[1] = g->aux[1];
    GC_TRY(dt_concat_bwd(&C, p, 2, g->R)); /* douts of the parts */
    q[0] = g->aux[0]; q[1] = g->aux[1];
    return dt_split_bwd(&C, g->gin[0], q, 2);
}

static void run_gc(const char *name, int n_in, dt_tensor *ins, const char *const *names, dt_tensor *out,
                   dt_status (*f)(gc *), dt_status (*b)(gc *), int ia, int ib, dt_tensor *aux) {
    gc g;
    dt_tensor grads[4], R;
    int k;
    memset(&g, 0, sizeof g);
    g.name = name; g.n_in = n_in; g.out = out; g.R = &R; g.fwd = f; g.bwd = b; g.ia = ia; g.ib = ib;
    for (k = 0; k < n_in; k++) {
        dt_tensor_desc d;
        int j;
        memset(&d, 0, sizeof d);
        for (j = 0; j < ins[k].ndim; j++) d.shape[j] = ins[k].shape[j];
        dt_tensor_create(&C, &grads[k], &d);
        g.in[k] = &ins[k]; g.gin[k] = &grads[k]; g.in_names[k] = names[k];
    }
    for (k = 0; k < 3 && aux; k++) g.aux[k] = &aux[k];
    gradcheck(&g);
    for (k = 0; k < n_in; k++) { dt_tensor_free(&C, &grads[k]); dt_tensor_free(&C, &ins[k]); }
    if (out) { dt_tensor_free(&C, out); dt_tensor_free(&C, &R); }
}

static void test_gradients(void) {
    static const char *ab[] = {"a", "b"}, *xwb[] = {"x", "w", "b"}, *x1[] = {"x"}, *logits[] = {"logits"},
                      *table[] = {"table"}, *qkv[] = {"qkv"}, *de[] = {"dense", "emb"}, *parts[] = {"part0", "part1"};
    dt_tensor in[4], out, aux[3];
    int ta, tb, i;
    char name[64];
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++) {
            in[0] = ta ? f32(5, 3) : f32(3, 5);
            in[1] = tb ? f32(4, 5) : f32(5, 4);
            randn(&in[0], "a", 1); randn(&in[1], "b", 1);
            out = f32(3, 4);
            snprintf(name, sizeof name, "matmul_ta%d_tb%d", ta, tb);
            run_gc(name, 2, in, ab, &out, mm_f, mm_b, ta, tb, NULL);
        }
    in[0] = mk(DT_F32, 2, 3, 5, 0); in[1] = mk(DT_F32, 2, 5, 4, 0);
    randn(&in[0], "a", 1); randn(&in[1], "b", 1);
    out = mk(DT_F32, 2, 3, 4, 0);
    run_gc("matmul_batched", 2, in, ab, &out, mm_f, mm_b, 0, 0, NULL);
    in[0] = mk(DT_F32, 2, 3, 5, 0); in[1] = f32(5, 4);
    randn(&in[0], "a", 1); randn(&in[1], "b", 1);
    out = mk(DT_F32, 2, 3, 4, 0);
    run_gc("matmul_batched_shared_b", 2, in, ab, &out, mm_f, mm_b, 0, 0, NULL);

    in[0] = mk(DT_F32, 2, 3, 6, 0); in[1] = f32(4, 6); in[2] = f32(4, 0);
    randn(&in[0], "x", 1); randn(&in[1], "w", 0.5); randn(&in[2], "b", 1);
    out = mk(DT_F32, 2, 3, 4, 0);
    run_gc("linear", 3, in, xwb, &out, lin_f, lin_b, 0, 0, NULL);

    in[0] = mk(DT_F32, 2, 3, 6, 0); in[1] = f32(4, 6); in[2] = f32(4, 0);
    randn(&in[0], "x", 1); randn(&in[1], "w", 0.5); randn(&in[2], "b", 1);
    out = mk(DT_F32, 2, 3, 4, 0);
    aux[0] = mk(DT_F32, 2, 3, 4, 0); aux[1] = mk(DT_F32, 2, 3, 4, 0);
    run_gc("linear_gelu", 3, in, xwb, &out, lg_f, lg_b, 0, 0, aux);
    dt_tensor_free(&C, &aux[0]); dt_tensor_free(&C, &aux[1]);

    in[0] = f32(5, 3); in[1] = f32(3, 0);
    randn(&in[0], "x", 1); randn(&in[1], "b", 1);
    out = f32(5, 3);
    { static const char *xb[] = {"x", "bias"}; run_gc("bias_add", 2, in, xb, &out, bias_f, bias_b, 0, 0, NULL); }

    in[0] = f32(6, 7);
    randn(&in[0], "x", 1);
    for (i = 0; i < 42; i++) if (fabsf(F(&in[0])[i]) < 0.05f) F(&in[0])[i] = 0.5f; /* h = 0.01 never crosses the kink */
    out = f32(6, 7);
    run_gc("relu", 1, in, x1, &out, relu_f, relu_b, 0, 0, NULL);
    in[0] = f32(6, 7);
    randn(&in[0], "x", 2);
    out = f32(6, 7);
    run_gc("gelu", 1, in, x1, &out, gelu_f, gelu_b, 0, 0, NULL);
    in[0] = f32(4, 5); in[1] = f32(4, 5);
    randn(&in[0], "a", 1); randn(&in[1], "b", 1);
    out = f32(4, 5);
    run_gc("mul", 2, in, ab, &out, mul_f, mul_b, 0, 0, NULL);

    in[0] = mk(DT_F32, 2, 3, 8, 0); in[1] = f32(8, 0); in[2] = f32(8, 0);
    randn(&in[0], "x", 1); randn(&in[1], "w", 1); randn(&in[2], "b", 1);
    out = mk(DT_F32, 2, 3, 8, 0);
    aux[0] = f32(6, 0); aux[1] = f32(6, 0);
    run_gc("layernorm", 3, in, xwb, &out, ln_f, ln_b, 0, 0, aux);
    dt_tensor_free(&C, &aux[0]); dt_tensor_free(&C, &aux[1]);

    in[0] = f32(5, 7);
    randn(&in[0], "logits", 2);
    aux[0] = f32(5, 7); aux[1] = mk(DT_I32, 5, 0, 0, 0);
    { int32_t t[5] = {3, 1, 6, 0, 2}; memcpy(aux[1].data, t, sizeof t); } /* row 1 is ignore_index = 1 */
    run_gc("softmax_xent", 1, in, logits, NULL, xent_f, xent_b, 0, 0, aux);
    dt_tensor_free(&C, &aux[0]); dt_tensor_free(&C, &aux[1]);

    in[0] = f32(4, 3);
    randn(&in[0], "logits", 2);
    aux[0] = f32(4, 3);
    for (i = 0; i < 12; i++) F(&aux[0])[i] = (float)(i % 3 == 0) * 0.9f; /* soft labels too */
    run_gc("bce_logits", 1, in, logits, NULL, bce_f, bce_b, 0, 0, aux);
    dt_tensor_free(&C, &aux[0]);

    in[0] = f32(5, 3);
    randn(&in[0], "table", 1);
    aux[0] = mk(DT_I32, 2, 3, 0, 0);
    { int32_t ids[6] = {4, 0, 4, 2, 1, 4}; memcpy(aux[0].data, ids, sizeof ids); }
    out = mk(DT_F32, 2, 3, 3, 0);
    run_gc("embedding", 1, in, table, &out, emb_f, emb_b, 0, 0, aux);
    dt_tensor_free(&C, &aux[0]);

    in[0] = mk(DT_F32, 2, 4, 12, 0);
    randn(&in[0], "qkv", 1);
    aux[0] = mk(DT_F32, 2, 2, 4, 4);
    out = mk(DT_F32, 2, 4, 4, 0);
    run_gc("attention", 1, in, qkv, &out, att_f, att_b, 2, 0, aux);
    dt_tensor_free(&C, &aux[0]);

    in[0] = f32(3, 4); in[1] = mk(DT_F32, 3, 3, 4, 0);
    randn(&in[0], "dense", 1); randn(&in[1], "emb", 1);
    out = f32(3, 4 + 6);
    run_gc("dot_interaction", 2, in, de, &out, dot_f, dot_b, 0, 0, NULL);

    in[0] = f32(3, 2); in[1] = f32(3, 5);
    randn(&in[0], "p0", 1); randn(&in[1], "p1", 1);
    out = f32(3, 7);
    run_gc("concat", 2, in, parts, &out, cat_f, cat_b, 0, 0, NULL);

    in[0] = f32(3, 7);
    randn(&in[0], "x", 1);
    aux[0] = f32(3, 2); aux[1] = f32(3, 5);
    out = f32(3, 7);
    run_gc("split", 1, in, x1, &out, split_f, split_b, 0, 0, aux);
    dt_tensor_free(&C, &aux[0]); dt_tensor_free(&C, &aux[1]);
}

/* ---------------------------------------------------------------- params and safetensors */

static void path_in_tmp(char *buf, size_t n, const char *file) { snprintf(buf, n, "%s/%s", dt_test_tmpdir(), file); }

static int write_file(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    fwrite(data, 1, n, fp);
    fclose(fp);
    return 1;
}

static size_t read_file(const char *path, unsigned char *buf, size_t cap) {
    FILE *fp = fopen(path, "rb");
    size_t n;
    if (!fp) return 0;
    n = fread(buf, 1, cap, fp);
    fclose(fp);
    return n;
}

static int contains(const unsigned char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle), i;
    for (i = 0; i + k <= n; i++) if (memcmp(hay + i, needle, k) == 0) return 1;
    return 0;
}

static void test_params_and_safetensors(void) {
    dt_params ps, ps2;
    dt_param_desc pd;
    dt_param *w, *b, *shard;
    char path[512], bad[512];
    static unsigned char buf[1 << 16];
    size_t n;
    dt_st_file f;
    dt_status st;
    int i;

    memset(&ps, 0, sizeof ps);
    memset(&pd, 0, sizeof pd);
    pd.name = "fc.w"; pd.shape[0] = 8; pd.shape[1] = 6;
    pd.init.kind = DT_INIT_SCALED_NORMAL; pd.init.seed = 5;
    dt_params_add(&C, &ps, &w, &pd);
    memset(&pd, 0, sizeof pd);
    pd.name = "fc.b"; pd.shape[0] = 8; pd.no_decay = 1;
    pd.init.kind = DT_INIT_CONST; pd.init.value = 0.5;
    dt_params_add(&C, &ps, &b, &pd);
    memset(&pd, 0, sizeof pd);
    pd.name = "fc.w"; pd.shape[0] = 8;
    dt_test_error("params_duplicate_name_is_named", dt_params_add(&C, &ps, NULL, &pd), dt_ctx_error(&C), "\"fc.w\"");
    DT_TEST_CHECK("params_count_and_numel", ps.count == 2 && dt_params_numel(&ps) == 56 && dt_params_find(&ps, "fc.b") == b);
    DT_TEST_CHECK("params_grad_is_zero_f32", w->grad.dtype == DT_F32 && F(&w->grad)[47] == 0 && F(&b->value)[7] == 0.5f);

    /* a column shard [8, 3] at (0, 3) of the same logical "fc.w" gets the same values */
    memset(&ps2, 0, sizeof ps2);
    memset(&pd, 0, sizeof pd);
    pd.name = "fc.w"; pd.shape[0] = 8; pd.shape[1] = 3; pd.global_shape[0] = 8; pd.global_shape[1] = 6; pd.start[1] = 3;
    pd.init.kind = DT_INIT_SCALED_NORMAL; pd.init.seed = 5;
    dt_params_add(&C, &ps2, &shard, &pd);
    {
        int bad_n = 0, r, c;
        for (r = 0; r < 8; r++) for (c = 0; c < 3; c++) bad_n += F(&shard->value)[r * 3 + c] != F(&w->value)[r * 6 + 3 + c];
        DT_TEST_CHECK("param_shard_init_equals_slice", bad_n == 0 && shard->sharded == 1 && w->sharded == 0);
    }
    dt_params_free(&C, &ps2);

    path_in_tmp(path, sizeof path, "params.safetensors");
    st = dt_params_save(&C, &ps, path);
    DT_TEST_CHECK("params_save_ok", st == 0);
    n = read_file(path, buf, sizeof buf);
    {
        uint64_t hl = 0;
        for (i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
        DT_TEST_CHECK("safetensors_layout", n == 8 + hl + 56 * 4 && hl % 8 == 0 && buf[8] == '{' &&
                                                contains(buf + 8, (size_t)hl, "\"fc.w\":{\"dtype\":\"F32\",\"shape\":[8,6],\"data_offsets\":[0,192]}"));
    }
    memset(&ps2, 0, sizeof ps2);
    memset(&pd, 0, sizeof pd);
    pd.name = "fc.w"; pd.shape[0] = 8; pd.shape[1] = 6;
    dt_params_add(&C, &ps2, NULL, &pd);
    pd.name = "fc.b"; pd.shape[0] = 8; pd.shape[1] = 0;
    dt_params_add(&C, &ps2, NULL, &pd);
    st = dt_params_load(&C, &ps2, path);
    DT_TEST_CHECK("params_round_trip_bitwise", st == 0 &&
                  memcmp(ps2.items[0]->value.data, w->value.data, 192) == 0 &&
                  memcmp(ps2.items[1]->value.data, b->value.data, 32) == 0);
    dt_params_free(&C, &ps2);
    memset(&pd, 0, sizeof pd);
    pd.name = "fc.w"; pd.shape[0] = 6; pd.shape[1] = 8;
    dt_params_add(&C, &ps2, NULL, &pd);
    dt_test_error("params_load_wrong_shape_is_named", dt_params_load(&C, &ps2, path), dt_ctx_error(&C), "\"fc.w\" dim 0 is 8");
    DT_TEST_CHECK("params_load_mismatch_leaves_values", F(&ps2.items[0]->value)[0] == 0.0f);
    dt_params_free(&C, &ps2);

    { /* a file written byte by byte as the reference implementation lays it out, all dtypes + metadata */
        const char hdr[] = "{\"__metadata__\":{\"who\":\"hand\"},\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                           "\"b\":{\"dtype\":\"I64\",\"shape\":[1,1],\"data_offsets\":[4,12]},"
                           "\"c\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[12,13]}}";
        unsigned char file[512];
        size_t hl = sizeof hdr - 1, k;
        uint16_t a[2] = {0x3F80, 0xC000};
        int64_t bv = -7;
        dt_tensor ta = mk(DT_BF16, 2, 0, 0, 0), tb = mk(DT_I64, 1, 1, 0, 0), tc;
        dt_tensor_desc d;
        for (k = 0; k < 8; k++) file[k] = (unsigned char)(hl >> (8 * k));
        memcpy(file + 8, hdr, hl);
        memcpy(file + 8 + hl, a, 4);
        memcpy(file + 8 + hl + 4, &bv, 8);
        file[8 + hl + 12] = 200;
        path_in_tmp(path, sizeof path, "hand.safetensors");
        write_file(path, file, 8 + hl + 13);
        st = dt_safetensors_open(&C, &f, path);
        memset(&d, 0, sizeof d);
        d.dtype = DT_U8;
        tc.ndim = 0;
        dt_tensor_create(&C, &tc, &d); /* scalar: ndim 0, one element */
        if (DT_TEST_CHECK("safetensors_reads_reference_layout", st == 0 && f.n_entries == 3)) {
            dt_safetensors_read(&C, &f, &ta, "a");
            dt_safetensors_read(&C, &f, &tb, "b");
            st = dt_safetensors_read(&C, &f, &tc, "c");
            DT_TEST_CHECK("safetensors_values_all_dtypes", dt_bf16_to_f32(((uint16_t *)ta.data)[1]) == -2.0f &&
                                                               ((int64_t *)tb.data)[0] == -7 && st == 0 &&
                                                               ((uint8_t *)tc.data)[0] == 200);
            DT_TEST_CHECK("safetensors_metadata", dt_safetensors_meta(&f, "who") && strcmp(dt_safetensors_meta(&f, "who"), "hand") == 0);
            dt_test_error("safetensors_read_wrong_dtype_is_named", dt_safetensors_read(&C, &f, &ta, "b"), dt_ctx_error(&C), "i64");
            dt_safetensors_close(&C, &f);
        }
        /* every truncation of this file is an error, never a crash */
        {
            int bad_cut = 0;
            size_t cut;
            for (cut = 0; cut < 8 + hl + 13; cut++) {
                path_in_tmp(bad, sizeof bad, "cut.safetensors");
                write_file(bad, file, cut);
                if (dt_safetensors_open(&C, &f, bad) == 0) {
                    dt_safetensors_close(&C, &f);
                    if (!bad_cut++) dt_test_fail("safetensors_every_truncation_is_an_error", "cut at %zu opened", cut);
                }
            }
            if (!bad_cut) dt_test_pass("safetensors_every_truncation_is_an_error");
            write_file(bad, file, 8 + hl + 6);
            dt_test_error("safetensors_truncated_data_is_named", dt_safetensors_open(&C, &f, bad), dt_ctx_error(&C),
                          "truncated");
        }
        memcpy(file, "\0\0\0\0\0\1\0\0", 8); /* header length 2^40 */
        write_file(bad, file, 8 + hl + 13);
        dt_test_error("safetensors_oversized_header_is_named", dt_safetensors_open(&C, &f, bad), dt_ctx_error(&C),
                      "header");
        dt_tensor_free(&C, &ta); dt_tensor_free(&C, &tb); dt_tensor_free(&C, &tc);
    }
    {
        const char *junk = "This is a plain text file and not a safetensors file at all.\n";
        path_in_tmp(bad, sizeof bad, "foreign.safetensors");
        write_file(bad, junk, strlen(junk));
        dt_test_error("safetensors_foreign_file_is_named", dt_safetensors_open(&C, &f, bad), dt_ctx_error(&C), "foreign.safetensors");
        {
            const char hdr[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}";
            unsigned char file[128];
            size_t hl = sizeof hdr - 1, k;
            for (k = 0; k < 8; k++) file[k] = (unsigned char)(hl >> (8 * k));
            memcpy(file + 8, hdr, hl);
            memset(file + 8 + hl, 0, 8);
            write_file(bad, file, 8 + hl + 8);
            dt_test_error("safetensors_inconsistent_offsets_are_named", dt_safetensors_open(&C, &f, bad),
                          dt_ctx_error(&C), "do not hold 2 f32");
        }
        dt_test_error("safetensors_missing_file_is_named", dt_safetensors_open(&C, &f, "/nonexistent/x.safetensors"),
                      dt_ctx_error(&C), "/nonexistent/x.safetensors");
    }
    dt_params_free(&C, &ps);
}

static void test_header_api(void) {
    char longname[201], path[512];
    const char *names[1];
    const dt_tensor *ts[1];
    dt_tensor t = f32(2, 3), back = f32(2, 3);
    dt_strbuf b;
    dt_st_file f;
    dt_status st;
    int i;
    memset(longname, 'n', 200);
    longname[200] = 0;
    for (i = 0; i < 6; i++) F(&t)[i] = (float)i - 2.5f;
    names[0] = longname; ts[0] = &t;
    path_in_tmp(path, sizeof path, "long.safetensors");
    st = dt_safetensors_save(&C, path, ts, names, 1, NULL, 0);
    if (DT_TEST_CHECK("safetensors_long_entry_name_saves", st == 0)) {
        st = dt_safetensors_open(&C, &f, path);
        if (DT_TEST_CHECK("safetensors_long_entry_name_opens", st == 0 && f.n_entries == 1)) {
            st = dt_safetensors_read(&C, &f, &back, longname);
            DT_TEST_CHECK("safetensors_long_entry_name_round_trip", st == 0 && memcmp(back.data, t.data, 24) == 0);
            dt_safetensors_close(&C, &f);
        }
    }
    memset(&b, 0, sizeof b);
    b.ctx = &C;
    st = dt_safetensors_header(&C, &b, ts, names, 1, NULL, 0);
    DT_TEST_CHECK("safetensors_header_is_padded", st == 0 && b.len % 8 == 0 && b.text[0] == '{');
    st = dt_safetensors_parse(&C, &f, b.text, b.len, 24, "mem");
    DT_TEST_CHECK("safetensors_parse_in_memory", st == 0 && f.fp == NULL && f.n_entries == 1 &&
                                                     f.entries[0].end == 24 && f.entries[0].shape[1] == 3);
    dt_safetensors_close(&C, &f);
    dt_test_error("safetensors_parse_short_data_is_named", dt_safetensors_parse(&C, &f, b.text, b.len, 20, "mem"),
                  dt_ctx_error(&C), "dt_safetensors_parse: mem");
    { /* dt_safetensors_prefix: the bytes dt_safetensors_save writes before the data, and the size of the
         file it writes (the file saved above from the same tensor and name) */
        dt_strbuf pb;
        uint64_t fb = 0, hl = 0;
        long size = -1;
        FILE *fp = fopen(path, "rb");
        const char *bad[1] = {"__metadata__"};
        if (fp && fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
        if (fp) fclose(fp);
        memset(&pb, 0, sizeof pb);
        pb.ctx = &C;
        dt_strbuf_str(&pb, "ab"); /* appends: what was there stays */
        st = dt_safetensors_prefix(&C, &pb, &fb, ts, names, 1, NULL, 0);
        if (st == 0 && fb == (uint64_t)size) dt_test_pass("safetensors_prefix_file_bytes_equal_saved_file_size");
        else dt_test_fail("safetensors_prefix_file_bytes_equal_saved_file_size", "status %d, file_bytes %llu, "
                          "saved file %ld bytes", (int)st, (unsigned long long)fb, size);
        if (st == 0 && pb.len == 2 + 8 + b.len && memcmp(pb.text, "ab", 2) == 0 &&
            dt_safetensors_header_len(&C, &hl, (const unsigned char *)pb.text + 2, fb, "prefix") == 0 && hl == b.len &&
            memcmp(pb.text + 10, b.text, b.len) == 0)
            dt_test_pass("safetensors_prefix_is_length_then_header");
        else dt_test_fail("safetensors_prefix_is_length_then_header", "prefix %zu bytes, header %zu bytes, decoded "
                          "length %llu", pb.len, b.len, (unsigned long long)hl);
        st = dt_safetensors_prefix(&C, &pb, &fb, ts, bad, 1, NULL, 0);
        if (st == DT_ERR_ARG && pb.len == 2 + 8 + b.len) dt_test_pass("safetensors_prefix_error_appends_nothing");
        else dt_test_fail("safetensors_prefix_error_appends_nothing", "status %d, %zu bytes after, %zu before",
                          (int)st, pb.len, 2 + 8 + b.len);
        dt_strbuf_free(&pb);
    }
    names[0] = "__metadata__";
    dt_test_error("safetensors_header_reserved_name_is_named", dt_safetensors_header(&C, &b, ts, names, 1, NULL, 0),
                  dt_ctx_error(&C), "reserved");
    dt_strbuf_free(&b);
    memset(&b, 0, sizeof b);
    b.ctx = &C;
    dt_strbuf_printf(&b, "%s|%d", longname, 42); /* longer than the 256-byte stack buffer */
    dt_strbuf_printf(&b, "%s", longname);
    DT_TEST_CHECK("strbuf_printf_long", !b.failed && b.len == 203 + 200 && strncmp(b.text + 200, "|42n", 4) == 0);
    dt_strbuf_free(&b);
    dt_tensor_free(&C, &t);
    dt_tensor_free(&C, &back);
}

static void test_json(void) {
    const char *text = "{\"a\": [1, 2.5e3, -0.125], \"s\": \"x\\\"y\\u00e9\\ud83d\\ude00\", \"t\": true, \"n\": null, \"o\": {}}";
    dt_json *j = NULL;
    dt_status st = dt_json_parse(&C, &j, text, strlen(text));
    if (DT_TEST_CHECK("json_parses", st == 0 && j && j->type == DT_JSON_OBJECT && j->count == 5)) {
        const dt_json *a = dt_json_get(j, "a"), *s = dt_json_get(j, "s");
        DT_TEST_CHECK("json_numbers", a && a->count == 3 && a->items[1].number == 2500.0 && a->items[2].number == -0.125);
        DT_TEST_CHECK("json_string_escapes_to_utf8", s && strcmp(s->string, "x\"y\xc3\xa9\xf0\x9f\x98\x80") == 0);
        DT_TEST_CHECK("json_literals", dt_json_get(j, "t")->number == 1 && dt_json_get(j, "n")->type == DT_JSON_NULL &&
                                           dt_json_get(j, "missing") == NULL);
    }
    dt_json_free(&C, j);
    {
        static const char *bad[] = {"{", "{\"a\" 1}", "[1,]", "\"abc", "{\"a\":1}x", "tru", "[1 2]", "{\"a\":-}"};
        int k, ok = 1;
        for (k = 0; k < 8; k++) {
            j = NULL;
            if (dt_json_parse(&C, &j, bad[k], strlen(bad[k])) == 0 || j) { ok = 0; dt_test_fail("json_rejects_bad_text", "accepted %s", bad[k]); }
        }
        if (ok) dt_test_pass("json_rejects_bad_text");
        dt_test_error("json_error_names_offset", dt_json_parse(&C, &j, "[1 2]", 5), dt_ctx_error(&C), "at byte 3");
    }
    {
        char deep[200];
        memset(deep, '[', 100); memset(deep + 100, ']', 100);
        dt_test_error("json_depth_limit", dt_json_parse(&C, &j, deep, 200), dt_ctx_error(&C), "deeper than 64");
    }
    {
        char buf[64];
        dt_json *back = NULL;
        size_t n = dt_json_escape(buf, sizeof buf, "q\"\\\n\x01");
        st = dt_json_parse(&C, &back, buf, n);
        DT_TEST_CHECK("json_escape_round_trip", st == 0 && strcmp(back->string, "q\"\\\n\x01") == 0);
        dt_json_free(&C, back);
    }
}

int main(void) {
    dt_ctx_init(&C, NULL);
    test_dtypes();
    test_tensors();
    test_rng();
    test_matmul();
    test_ops_by_hand();
    test_gradients();
    test_params_and_safetensors();
    test_header_api();
    test_json();
    dt_ctx_shutdown(&C);
    DT_TEST_CHECK("no_bytes_leaked", C.bytes_in_use == 0);
    return dt_test_finish();
}
