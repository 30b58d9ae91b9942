// tests/cuda_emu/k_gemm.cpp - kernels/dt_gemm.cu (cuBLAS, mapped to CBLAS by the emulator)
// against dt_matmul_fwd / _bwd: the row-major <-> column-major operand swap, every transpose
// pair, batches (b shared or batched), alpha / beta, bf16 / f16 inputs, TF32. And the handle of a
// CUDA ctx: cuBLAS's workspace is dt's, allocated once at the first GEMM through dt_cuda_alloc
// (counted), kept by the handle through later GEMMs and a change of the ctx's stream, freed by
// dt_ctx_shutdown.
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "kernels/dt_kernels.h"
#include "tests/dt_test.h"
#include "k_common.h"

static void *dev(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 4) != cudaSuccess) return NULL;
    if (bytes) cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    return d;
}
static std::vector<float> host(const float *d, size_t n) {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
}
static std::vector<float> rnd(size_t n, uint64_t stream) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = 2.0f * dt_rng_uniform(11, stream, i) - 1.0f;
    return v;
}
static dt_tensor wrap(std::vector<float> &v, int ndim, int64_t a, int64_t b, int64_t c) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = v.data(); t.dtype = DT_F32; t.device = DT_CPU; t.ndim = ndim;
    if (ndim == 2) { t.shape[0] = b; t.shape[1] = c; }
    else { t.shape[0] = a; t.shape[1] = b; t.shape[2] = c; }
    t.numel = (int64_t)v.size();
    return t;
}
/* in_dtype 2 / 3: the values rounded to bf16 / f16 (what the GPU reads), and their storage */
static std::vector<uint16_t> round16(std::vector<float> &v, int dt) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); i++) {
        h[i] = dt == 2 ? dt_f32_to_bf16(v[i]) : dt_f32_to_f16(v[i]);
        v[i] = dt == 2 ? dt_bf16_to_f32(h[i]) : dt_f16_to_f32(h[i]);
    }
    return h;
}

/* out = alpha op(a) op(b) + beta out, CPU vs cuBLAS, then the backward. */
static void check(dt_ctx *ctx, cublasHandle_t h, int64_t batch, int shared_b, int64_t M, int64_t N, int64_t K, int ta,
                  int tb, int in_dtype, int tf32, double rtol) {
    char tag[96], name[160];
    double atol = tf32 ? rtol : rtol * 0.1; /* TF32 errors do not shrink with the value */
    int nd = batch > 1 ? 3 : 2, st;
    std::vector<float> a = rnd((size_t)(batch * M * K), 1), b = rnd((size_t)((shared_b ? 1 : batch) * K * N), 2);
    std::vector<float> out = rnd((size_t)(batch * M * N), 3), dout = rnd(out.size(), 4);
    std::vector<float> da = rnd(a.size(), 5), db = rnd(b.size(), 6), out0 = out, da0 = da, db0 = db;
    std::vector<uint16_t> a16, b16;
    snprintf(tag, sizeof tag, "b%lld%s_%lldx%lldx%lld_t%d%d_%s%s", (long long)batch, shared_b ? "s" : "",
             (long long)M, (long long)N, (long long)K, ta, tb, in_dtype == 1 ? "f32" : in_dtype == 2 ? "bf16" : "f16",
             tf32 ? "_tf32" : "");
    if (in_dtype != 1) { a16 = round16(a, in_dtype); b16 = round16(b, in_dtype); }
    dt_tensor A = wrap(a, nd, batch, ta ? K : M, ta ? M : K);
    dt_tensor Bt = wrap(b, shared_b ? 2 : nd, batch, tb ? N : K, tb ? K : N);
    dt_tensor O = wrap(out, nd, batch, M, N), G = wrap(dout, nd, batch, M, N);
    dt_tensor dA = wrap(da, nd, batch, ta ? K : M, ta ? M : K), dB = wrap(db, shared_b ? 2 : nd, batch, tb ? N : K, tb ? K : N);
    size_t esz = in_dtype == 1 ? 4 : 2;
    void *d_a = dev(in_dtype == 1 ? (void *)a.data() : (void *)a16.data(), a.size() * esz);
    void *d_b = dev(in_dtype == 1 ? (void *)b.data() : (void *)b16.data(), b.size() * esz);
    float *d_o = (float *)dev(out0.data(), out0.size() * 4);
    st = dt_matmul_fwd(ctx, &O, &A, &Bt, ta, tb, 0.75f, 0.5f);
    if (st) { dt_test_fail("matmul_fwd_cpu_reference", "%s", dt_ctx_error(ctx)); return; }
    st = dt_k_matmul_fwd(h, d_o, d_a, d_b, in_dtype, batch, M, N, K, ta, tb, M * K, shared_b ? 0 : K * N, M * N, 0.75f,
                         0.5f, tf32, NULL);
    snprintf(name, sizeof name, "matmul_fwd_matches_cpu_%s", tag);
    if (DT_TEST_CHECK(name, st == 0))
        dt_test_allclose(name, host(d_o, out.size()).data(), out.data(), out.size(), atol, rtol);
    if (in_dtype == 1) { /* the backward: f32 GEMMs with beta = 1 */
        float *d_g = (float *)dev(dout.data(), dout.size() * 4), *d_da = (float *)dev(da0.data(), da0.size() * 4);
        float *d_db = (float *)dev(db0.data(), db0.size() * 4);
        dt_matmul_bwd(ctx, &dA, &dB, &G, &A, &Bt, ta, tb, 0.75f);
        st = dt_k_matmul_bwd(h, d_da, d_db, d_g, (const float *)d_a, (const float *)d_b, batch, M, N, K, ta, tb, M * K,
                             shared_b ? 0 : K * N, 0.75f, tf32, NULL);
        snprintf(name, sizeof name, "matmul_bwd_da_accumulates_as_cpu_%s", tag);
        if (DT_TEST_CHECK(name, st == 0)) {
            dt_test_allclose(name, host(d_da, da.size()).data(), da.data(), da.size(), atol, rtol);
            snprintf(name, sizeof name, "matmul_bwd_db_accumulates_as_cpu_%s", tag);
            dt_test_allclose(name, host(d_db, db.size()).data(), db.data(), db.size(), atol, rtol);
        }
        cudaFree(d_g); cudaFree(d_da); cudaFree(d_db);
    }
    cudaFree(d_a); cudaFree(d_b); cudaFree(d_o);
}

/* A [r, c] f32 CUDA tensor of values in [-1, 1). */
static dt_tensor cuda_mat(dt_ctx *c, int64_t r, int64_t cols, uint64_t seed) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32, d.ndim = 2, d.shape[0] = r, d.shape[1] = cols, d.device = DT_CUDA_DEVICE;
    memset(&t, 0, sizeof t);
    if (dt_tensor_create(c, &t, &d) == DT_OK) {
        std::vector<float> v = rnd((size_t)(r * cols), seed);
        cudaMemcpy(t.data, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
    }
    return t;
}

/* The workspace the handle holds now: the emulator knows it; on a GPU it is not observable (the
   check then takes dt's word for it). */
static int handle_holds(dt_ctx *c) {
#ifdef DT_CUDA_EMU
    void *ws = NULL;
    size_t n = 0;
    return dt_emu_cublas_workspace((cublasHandle_t)c->cublas, &ws, &n) == CUBLAS_STATUS_SUCCESS &&
           ws == c->cublas_workspace && n == c->cublas_workspace_bytes;
#else
    return c->cublas_workspace != NULL;
#endif
}

static void workspace(void) {
    dt_ctx c;
    dt_ctx_desc cd;
    cudaStream_t s2 = NULL;
    int dev = 0, major = 0;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&c, &cd)) {
        dt_test_fail("cuda_ctx_init", "%s", dt_ctx_error(&c));
        return;
    }
    dt_tensor a = cuda_mat(&c, 4, 8, 41), b = cuda_mat(&c, 8, 5, 42), o = cuda_mat(&c, 4, 5, 43);
    dt_tensor da = cuda_mat(&c, 4, 8, 44), db = cuda_mat(&c, 8, 5, 45);
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    const size_t want = (size_t)(major >= 9 ? 32 : 4) << 20; /* Hopper and later: 32 MiB */
    dt_ctx_counters_reset(&c);
    dt_status st = dt_matmul_fwd(&c, &o, &a, &b, 0, 0, 1.0f, 0.0f);
    if (!dt_test_check_all("cublas_workspace_is_dts_counted_allocation_at_the_first_gemm",
                           st == DT_OK && c.counters.allocs == 1 && c.cublas_workspace &&
                               c.cublas_workspace_bytes == want && handle_holds(&c),
                           "status %d (%s), allocs %lld, workspace %p of %zu bytes (want %zu), held by the handle %d",
                           (int)st, dt_ctx_error(&c), (long long)c.counters.allocs, c.cublas_workspace,
                           c.cublas_workspace_bytes, want, c.cublas ? handle_holds(&c) : -1)) {
        dt_ctx_shutdown(&c);
        return;
    }
    /* later GEMMs (a backward, another shape) allocate nothing and keep the workspace: a
       launcher that called cublasSetStream each time would drop it back to cuBLAS's pool */
    dt_ctx_counters_reset(&c);
    st = dt_matmul_bwd(&c, &da, &db, &o, &a, &b, 0, 0, 1.0f);
    if (!st) st = dt_matmul_fwd(&c, &o, &a, &b, 0, 0, 0.5f, 1.0f);
    dt_test_check_all("cublas_workspace_kept_through_later_gemms",
                      st == DT_OK && c.counters.allocs == 0 && c.counters.frees == 0 && handle_holds(&c),
                      "status %d, allocs %lld, frees %lld, held by the handle %d", (int)st,
                      (long long)c.counters.allocs, (long long)c.counters.frees, handle_holds(&c));
    /* the ctx moves to another stream: the handle follows with the same workspace */
    if (cudaStreamCreate(&s2) == cudaSuccess) {
        cudaStream_t cur = NULL;
        c.cuda_stream = s2;
        st = dt_matmul_fwd(&c, &o, &a, &b, 0, 0, 1.0f, 0.0f);
        cublasGetStream((cublasHandle_t)c.cublas, &cur);
        dt_test_check_all("cublas_workspace_follows_the_ctx_to_a_new_stream",
                          st == DT_OK && cur == s2 && handle_holds(&c), "status %d, stream %s, held %d", (int)st,
                          cur == s2 ? "the new one" : "another", handle_holds(&c));
        dt_ctx_sync(&c);
        c.cuda_stream = NULL;
        st = dt_matmul_fwd(&c, &o, &a, &b, 0, 0, 1.0f, 0.0f);
        dt_ctx_sync(&c);
        cudaStreamDestroy(s2);
        DT_TEST_CHECK("cublas_back_on_the_default_stream_keeps_the_workspace", st == DT_OK && handle_holds(&c));
    }
    dt_tensor_free(&c, &a), dt_tensor_free(&c, &b), dt_tensor_free(&c, &o);
    dt_tensor_free(&c, &da), dt_tensor_free(&c, &db);
#ifdef DT_CUDA_EMU
    {
        void *ws = c.cublas_workspace;
        char why[256];
        dt_ctx_shutdown(&c);
        DT_TEST_CHECK("cublas_workspace_freed_by_ctx_shutdown", !dt_emu_device_range(ws, 1, why, sizeof why));
    }
#else
    dt_ctx_shutdown(&c);
#endif
}

/* What the launchers refuse before cuBLAS sees it; d: 64 device bytes (16 floats). */
static void bad_arguments(cublasHandle_t h, float *d) {
    const int64_t big = ((int64_t)1 << 32) + 1; /* an int batch count would be 1 */
    const float *c = d;
    int64_t M[1] = {2}, N[1] = {2}, K[1] = {2};
    const float **P = NULL;
    k_refused("matmul_fwd_batch_over_int_range_is_invalid_value",
              dt_k_matmul_fwd(h, d, d, d, 1, big, 1, 1, 1, 0, 0, 0, 0, 1, 1.0f, 0.0f, 0, NULL));
    k_refused("matmul_fwd_overlapping_batch_outputs_is_invalid_value", /* stride_out 1 < M N = 4 */
              dt_k_matmul_fwd(h, d, d, d, 1, 2, 2, 2, 2, 0, 0, 4, 4, 1, 1.0f, 0.0f, 0, NULL));
    k_refused("matmul_fwd_negative_stride_is_invalid_value",
              dt_k_matmul_fwd(h, d + 8, d, d, 1, 2, 2, 2, 1, 0, 0, -2, 0, 4, 1.0f, 0.0f, 0, NULL));
    k_refused("matmul_fwd_stride_past_int64_is_invalid_value",
              dt_k_matmul_fwd(h, d, d, d, 1, 3, 1, 1, 1, 0, 0, INT64_MAX / 2 + 1, 0, 1, 1.0f, 0.0f, 0, NULL));
    k_refused("matmul_fwd_NULL_out_is_invalid_value",
              dt_k_matmul_fwd(h, NULL, d, d, 1, 1, 2, 2, 2, 0, 0, 0, 0, 0, 1.0f, 0.0f, 0, NULL));
    k_refused("matmul_fwd_t_bf16_NULL_b_is_invalid_value",
              dt_k_matmul_fwd_t(h, d, 2, d, NULL, 2, 1, 2, 2, 2, 0, 0, 0, 0, 0, 1.0f, 0.0f, 0, NULL));
    {   /* K = 0 reads neither a nor b: out = beta out */
        float two[4] = {2, 2, 2, 2};
        cudaMemcpy(d, two, sizeof two, cudaMemcpyHostToDevice);
        int st = dt_k_matmul_fwd(h, d, NULL, NULL, 1, 1, 2, 2, 0, 0, 0, 0, 0, 0, 1.0f, 0.5f, 0, NULL);
        std::vector<float> o = host(d, 4);
        dt_test_check_all("matmul_fwd_K0_NULL_a_b_scales_out_by_beta", st == 0 && o[0] == 1.0f && o[3] == 1.0f,
                          "status %d (%s), out[0] %g out[3] %g (want 0, 1, 1)", st, dt_k_error_string(st),
                          (double)o[0], (double)o[3]);
    }
    k_refused("matmul_bwd_NULL_dout_is_invalid_value",
              dt_k_matmul_bwd(h, d, d, NULL, c, c, 1, 2, 2, 2, 0, 0, 0, 0, 1.0f, 0, NULL));
    k_refused("matmul_bwd_NULL_a_with_da_is_invalid_value", /* a is not read for da; the CPU op takes it */
              dt_k_matmul_bwd(h, d, NULL, c, NULL, c, 1, 2, 2, 2, 0, 0, 0, 0, 1.0f, 0, NULL));
    k_refused("matmul_bwd_negative_stride_is_invalid_value",
              dt_k_matmul_bwd(h, d + 8, NULL, c, c, c + 8, 2, 1, 1, 2, 0, 0, -2, 0, 1.0f, 0, NULL));
    k_refused("gemm_grouped_NULL_sizes_is_invalid_value",
              dt_k_gemm_grouped(h, 1, 0, 0, NULL, NULL, NULL, 1.0f, 0.0f, NULL, NULL, NULL, NULL));
    k_refused("gemm_grouped_NULL_pointer_arrays_is_invalid_value",
              dt_k_gemm_grouped(h, 1, 0, 0, M, N, K, 1.0f, 0.0f, P, P, NULL, NULL));
    k_refused("gemm_grouped_negative_K_is_invalid_value",
              (K[0] = -1, dt_k_gemm_grouped(h, 1, 0, 0, M, N, K, 1.0f, 0.0f, (const float *const *)d,
                                            (const float *const *)d, (float *const *)d, NULL)));
    DT_TEST_CHECK("gemm_grouped_count_0_with_NULL_arrays_is_ok",
                  dt_k_gemm_grouped(h, 0, 0, 0, NULL, NULL, NULL, 1.0f, 0.0f, NULL, NULL, NULL, NULL) == 0);
}

int main(void) {
    dt_ctx ctx;
    cublasHandle_t h = NULL;
    int ta, tb;
    dt_ctx_init(&ctx, NULL);
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        dt_test_fail("matmul_cublas_create", "cublasCreate failed");
        return dt_test_finish();
    }
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++) check(&ctx, h, 1, 0, 5, 7, 3, ta, tb, 1, 0, 1e-5);
    check(&ctx, h, 3, 0, 4, 6, 5, 0, 1, 1, 0, 1e-5);  /* strided batched */
    check(&ctx, h, 3, 1, 4, 6, 5, 1, 0, 1, 0, 1e-5);  /* b shared by the batches: db sums them */
    check(&ctx, h, 2, 0, 6, 5, 33, 0, 0, 2, 0, 1e-5); /* bf16 inputs, f32 accumulation */
    check(&ctx, h, 1, 0, 6, 5, 33, 1, 1, 3, 0, 1e-5); /* f16 */
    check(&ctx, h, 2, 0, 6, 5, 33, 0, 1, 1, 1, 3e-3); /* TF32: 10 mantissa bits in the products */
    {
        float *d = NULL;
        cudaMalloc((void **)&d, 64);
        DT_TEST_CHECK("matmul_fwd_trans_a_2_is_invalid_value",
                      dt_k_matmul_fwd(h, d, d, d, 1, 1, 1, 1, 1, 2, 0, 1, 1, 1, 1.0f, 0.0f, 0, NULL) ==
                          (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("matmul_fwd_in_dtype_i32_is_invalid_value",
                      dt_k_matmul_fwd(h, d, d, d, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1.0f, 0.0f, 0, NULL) ==
                          (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("matmul_fwd_M_over_int_range_is_invalid_value",
                      dt_k_matmul_fwd(h, d, d, d, 1, 1, 3000000000LL, 1, 1, 0, 0, 1, 1, 1, 1.0f, 0.0f, 0, NULL) ==
                          (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("matmul_bwd_NULL_handle_is_invalid_value",
                      dt_k_matmul_bwd(NULL, d, d, d, d, d, 1, 1, 1, 1, 0, 0, 1, 1, 1.0f, 0, NULL) ==
                          (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("matmul_fwd_empty_is_ok",
                      dt_k_matmul_fwd(h, d, d, d, 1, 0, 4, 4, 4, 0, 0, 16, 16, 16, 1.0f, 0.0f, 0, NULL) == 0);
        bad_arguments(h, d);
        cudaFree(d);
    }
    cublasDestroy(h);
    dt_ctx_shutdown(&ctx);
    workspace();
    return dt_test_finish();
}
