// tests/cuda_emu/k_ops.cpp - dt_tensor.h built with DT_CUDA on the emulator: the public ops on
// CUDA tensors (dispatched to kernels/) against the same ops on CPU tensors, forward and
// backward (attention also without att: the fused kernels), and a mixed-device call named as an error.
// Then, per op family, the proof that a CUDA op stays on the device: after one warm-up call, a
// second call makes no device allocation, no free, no device-to-host copy and no host wait
// (ctx->counters, which must agree with what the emulator saw: dt_emu_get_counters).
//
// Tolerances (u = 2^-24): softmax xent's row loss and probabilities are within
// u (V + 3 + |log s| + |lse| + |loss|) (+ u |z - lse| + 2u relative for a probability) of exact
// on each side (tests/cuda_emu/k_softmax.cpp derives it); with |z| <= Z and s <= V that is at
// most xent_tol = 2 u (V + 8 + 4 (Z + log V)) between the two. The embedding backward sums each
// (id, column) in id order, as the CPU: bitwise. BCE's element losses are the CPU's doubles
// summed in another order: within 2 u |loss| after the cast to float. dt_sum: within
// n 2^-53 sum|x| of the CPU's double sum.
#include <cuda_runtime.h>
#include <math.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "tests/dt_test.h"

static dt_ctx ctx;

/* A CPU tensor with random values (ids: integers in [0, vmax)) and its CUDA copy. */
struct pair_t { dt_tensor h, d; };
static pair_t make(dt_dtype dt, int ndim, int64_t a, int64_t b = 0, int64_t c = 0, int64_t d = 0, uint64_t seed = 1,
                   int64_t vmax = 0) {
    pair_t p;
    dt_tensor_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = dt; desc.ndim = ndim;
    desc.shape[0] = a; desc.shape[1] = b; desc.shape[2] = c; desc.shape[3] = d;
    desc.device = DT_CPU;
    dt_tensor_create(&ctx, &p.h, &desc);
    desc.device = DT_CUDA_DEVICE;
    dt_tensor_create(&ctx, &p.d, &desc);
    for (int64_t i = 0; i < p.h.numel; i++) {
        float u = dt_rng_uniform(21, seed, (uint64_t)i);
        if (dt == DT_F32) ((float *)p.h.data)[i] = 2.0f * u - 1.0f;
        if (dt == DT_I32) ((int32_t *)p.h.data)[i] = (int32_t)(u * (float)vmax) % (int32_t)vmax;
        if (dt == DT_I64) ((int64_t *)p.h.data)[i] = (int64_t)(u * (float)vmax) % vmax;
    }
    dt_tensor_copy(&ctx, &p.d, &p.h);
    return p;
}
static void release(pair_t &p) { dt_tensor_free(&ctx, &p.h); dt_tensor_free(&ctx, &p.d); }

/* PASS iff the CUDA tensor's values equal the CPU tensor's within rtol. */
static void same(const char *name, pair_t &p, double rtol) {
    std::vector<float> got((size_t)p.h.numel);
    dt_tensor h;
    dt_tensor_create_like(&ctx, &h, &p.d, DT_DTYPE_DEFAULT, DT_CPU);
    dt_tensor_copy(&ctx, &h, &p.d);
    dt_test_allclose(name, (const float *)h.data, (const float *)p.h.data, (size_t)p.h.numel, rtol * 0.1, rtol);
    dt_tensor_free(&ctx, &h);
}
static double xent_tol(double V, double Z) { return 2.0 / 16777216.0 * (V + 8 + 4 * (Z + log(V))); }

/* The second call of op (after `warm` warm-up calls) on the device only: no allocation, free,
   device-to-host copy or wait in ctx->counters (reset first), each count equal to the
   emulator's own; h2d_bytes as given (the op's inputs from the host). by_design_d2h: the op
   returns a host value (dt_sum): exactly one copy down and its one wait. */
template <typename F> static void on_device_only(const char *name, F op, int64_t h2d_bytes = 0, int by_design_d2h = 0) {
    dt_emu_counters e0, e1;
    dt_status st = op();
    if (st) { dt_test_fail(name, "warm-up call: %s", dt_ctx_error(&ctx)); return; }
    dt_ctx_counters_reset(&ctx);
    dt_emu_get_counters(&e0);
    st = op();
    dt_emu_get_counters(&e1);
    const dt_cuda_counters &c = ctx.counters;
    if (st) { dt_test_fail(name, "second call: %s", dt_ctx_error(&ctx)); return; }
    int64_t want_d2h = by_design_d2h ? 1 : 0;
    int ours = c.allocs == 0 && c.frees == 0 && c.syncs == want_d2h && c.d2h_calls == want_d2h && c.h2d_bytes == h2d_bytes &&
               (by_design_d2h || c.d2h_bytes == 0);
    int agree = e1.syncs - e0.syncs == c.syncs && e1.allocs - e0.allocs == c.allocs && e1.frees - e0.frees == c.frees &&
                e1.h2d_bytes - e0.h2d_bytes == c.h2d_bytes && e1.h2d_calls - e0.h2d_calls == c.h2d_calls &&
                e1.d2h_bytes - e0.d2h_bytes == c.d2h_bytes && e1.d2h_calls - e0.d2h_calls == c.d2h_calls;
    if (ours && agree) { dt_test_pass(name); return; }
    dt_test_fail(name, "ctx counters: syncs %lld allocs %lld frees %lld h2d %lld B / %lld d2h %lld B / %lld (want syncs "
                 "%lld allocs 0 frees 0 h2d %lld B d2h calls %lld); the emulator saw syncs %lld allocs %lld frees %lld h2d "
                 "%lld B / %lld d2h %lld B / %lld", (long long)c.syncs, (long long)c.allocs, (long long)c.frees,
                 (long long)c.h2d_bytes, (long long)c.h2d_calls, (long long)c.d2h_bytes, (long long)c.d2h_calls,
                 (long long)want_d2h, (long long)h2d_bytes, (long long)want_d2h, e1.syncs - e0.syncs,
                 e1.allocs - e0.allocs, e1.frees - e0.frees, e1.h2d_bytes - e0.h2d_bytes, e1.h2d_calls - e0.h2d_calls,
                 e1.d2h_bytes - e0.d2h_bytes, e1.d2h_calls - e0.d2h_calls);
}

static int ok2(const char *name, dt_status a, dt_status b) {
    if (a == DT_OK && b == DT_OK) return 1;
    return dt_test_fail(name, "cpu status %d, cuda status %d: %s", (int)a, (int)b, dt_ctx_error(&ctx));
}

int main(void) {
    dt_ctx_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &cd)) { dt_test_fail("ctx_init_cuda", "%s", dt_ctx_error(&ctx)); return dt_test_finish(); }
    { /* matmul, batched with b shared, both transposes; and its backward */
        pair_t a = make(DT_F32, 3, 2, 5, 3, 0, 1), b = make(DT_F32, 2, 4, 5, 0, 0, 2), o = make(DT_F32, 3, 2, 3, 4, 0, 3);
        pair_t da = make(DT_F32, 3, 2, 5, 3, 0, 4), db = make(DT_F32, 2, 4, 5, 0, 0, 5);
        if (ok2("matmul_fwd_cuda_tensors_match_cpu", dt_matmul_fwd(&ctx, &o.h, &a.h, &b.h, 1, 1, 0.5f, 0.25f),
                dt_matmul_fwd(&ctx, &o.d, &a.d, &b.d, 1, 1, 0.5f, 0.25f)))
            same("matmul_fwd_cuda_tensors_match_cpu", o, 1e-5);
        if (ok2("matmul_bwd_cuda_tensors_match_cpu", dt_matmul_bwd(&ctx, &da.h, &db.h, &o.h, &a.h, &b.h, 1, 1, 0.5f),
                dt_matmul_bwd(&ctx, &da.d, &db.d, &o.d, &a.d, &b.d, 1, 1, 0.5f))) {
            same("matmul_bwd_da_cuda_tensors_match_cpu", da, 1e-5);
            same("matmul_bwd_db_cuda_tensors_match_cpu", db, 1e-5);
        }
        dt_test_error("matmul_fwd_mixed_devices_is_named", dt_matmul_fwd(&ctx, &o.d, &a.h, &b.d, 1, 1, 1.0f, 0.0f),
                      dt_ctx_error(&ctx), "a is on cpu");
        dt_test_error("matmul_fwd_cuda_shape_mismatch_is_named_as_on_cpu",
                      dt_matmul_fwd(&ctx, &o.d, &a.d, &b.d, 0, 1, 1.0f, 0.0f), dt_ctx_error(&ctx), "inner dims differ");
        release(a); release(b); release(o); release(da); release(db);
    }
    { /* dt_ctx_desc.tf32 = 1: dt_linear's GEMMs on TF32 (inputs rounded to 10 mantissa bits). Each
         output within the bound of two TF32 roundings of every product plus an f32 sum of K terms,
         (2 u_tf32 + u_tf32^2 + gamma(K)) sum_k |x w| with u_tf32 = 2^-11; some output must also lie
         outside the f32 bound gamma(K) sum |x w| (else TF32 was not used); with tf32 = 0 the same
         GEMM equals the CPU's f32 within the f32 bound. */
        const int64_t N = 16, I = 40, O = 24;
        pair_t x = make(DT_F32, 2, N, I, 0, 0, 80), w = make(DT_F32, 2, O, I, 0, 0, 81), y = make(DT_F32, 2, N, O, 0, 0, 82);
        std::vector<double> mag((size_t)(N * O), 0.0);
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++)
                for (int64_t i = 0; i < I; i++)
                    mag[(size_t)(n * O + o)] += fabs((double)((float *)x.h.data)[n * I + i] * ((float *)w.h.data)[o * I + i]);
        const double ut = 1.0 / 2048.0, g32 = I * (1.0 / 16777216.0) / (1.0 - I / 16777216.0);
        for (int tf = 0; tf <= 1; tf++) {
            char name[96];
            ctx.tf32 = tf;
            snprintf(name, sizeof name, "linear_fwd_cuda_tf32_%d_within_its_bound", tf);
            if (!ok2(name, dt_linear_fwd(&ctx, &y.h, &x.h, &w.h, NULL), dt_linear_fwd(&ctx, &y.d, &x.d, &w.d, NULL)))
                continue;
            std::vector<float> got((size_t)y.h.numel);
            cudaMemcpy(got.data(), y.d.data, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
            size_t bad = 0, past_f32 = 0, first = 0;
            for (size_t i = 0; i < got.size(); i++) {
                double d = fabs((double)got[i] - ((float *)y.h.data)[i]);
                double bound = ((tf ? 2 * ut + ut * ut : 0.0) + 2 * g32) * mag[i];
                if (!(d <= bound) && bad++ == 0) first = i;
                past_f32 += d > 2 * g32 * mag[i];
            }
            dt_test_check_all(name, !bad, "%zu of %zu outside; first [%zu]: cuda %.9g, cpu %.9g", bad, got.size(), first,
                              (double)got[first], (double)((float *)y.h.data)[first]);
            if (tf) {
                snprintf(name, sizeof name, "linear_fwd_cuda_tf32_1_rounds_to_tf32");
                dt_test_check_all(name, past_f32 > 0, "no output differs from f32 by more than the f32 bound");
            }
        }
        ctx.tf32 = 0;
        release(x); release(w); release(y);
    }
    { /* a bf16 weight on cuda: dt_linear's GEMMs in bf16 on the tensor cores (cublasGemmEx and
         cuBLASLt, f32 accumulate), x and dout rounded to bf16 on the way in. Against the CPU's f32 linear on the
         same (bf16) weight, element by element within the roundings' bound: fwd u_b sum_i |x w|,
         dx u_b sum_o |dout w|, dw 2 u_b sum_n |dout x| (u_b = 2^-8), plus f32 sums (2 gamma(K))
         and the accumulation into the initial dx, dw; some element must leave the f32 bound. */
        const int64_t N = 16, I = 40, O = 24;
        pair_t x = make(DT_F32, 2, N, I, 0, 0, 90), w = make(DT_F32, 2, O, I, 0, 0, 91), b = make(DT_F32, 1, O, 0, 0, 0, 92);
        pair_t y = make(DT_F32, 2, N, O, 0, 0, 93), g = make(DT_F32, 2, N, O, 0, 0, 94), dx = make(DT_F32, 2, N, I, 0, 0, 95);
        pair_t dw = make(DT_F32, 2, O, I, 0, 0, 96), db = make(DT_F32, 1, O, 0, 0, 0, 97);
        dt_tensor w16, w16h;
        dt_tensor_create_like(&ctx, &w16, &w.d, DT_BF16, DT_CUDA_DEVICE);
        dt_tensor_create_like(&ctx, &w16h, &w.h, DT_BF16, DT_CPU);
        dt_tensor_cast(&ctx, &w16h, &w.h);
        dt_tensor_cast(&ctx, &w.h, &w16h); /* the CPU's weight: the bf16 values */
        dt_tensor_copy(&ctx, &w16, &w16h);
        const float *X = (const float *)x.h.data, *W = (const float *)w.h.data, *G = (const float *)g.h.data;
        const double ub = 1.0 / 256.0, u = 1.0 / 16777216.0;
        std::vector<float> dx0((const float *)dx.h.data, (const float *)dx.h.data + dx.h.numel);
        std::vector<float> dw0((const float *)dw.h.data, (const float *)dw.h.data + dw.h.numel);
        std::vector<float> db0((const float *)db.h.data, (const float *)db.h.data + db.h.numel);
        auto check = [&](const char *name, pair_t &p, const std::vector<double> &mag, double rel, int64_t K,
                         const std::vector<float> *init, bool need_past = true) {
            std::vector<float> got((size_t)p.h.numel);
            cudaMemcpy(got.data(), p.d.data, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
            size_t bad = 0, past = 0, first = 0;
            double gk = 2.0 * K * u / (1.0 - K * u);
            for (size_t i = 0; i < got.size(); i++) {
                double want = ((const float *)p.h.data)[i], d = fabs(got[i] - want);
                double f32b = gk * mag[i] + (init ? 2 * u * (fabs((*init)[i]) + fabs(want)) : 0.0);
                if (!(d <= rel * mag[i] + f32b) && bad++ == 0) first = i;
                past += d > f32b;
            }
            dt_test_check_all(name, !bad && (past > 0 || !need_past), "%zu of %zu outside (first [%zu]: cuda %.9g, cpu %.9g); %zu past "
                              "the f32 bound (want > 0)", bad, got.size(), first, (double)got[first],
                              (double)((const float *)p.h.data)[first], past);
        };
        if (ok2("linear_fwd_bf16_w_cuda_within_bf16_bound", dt_linear_fwd(&ctx, &y.h, &x.h, &w.h, &b.h),
                dt_linear_fwd(&ctx, &y.d, &x.d, &w16, &b.d))) {
            std::vector<double> mag((size_t)(N * O), 0.0);
            for (int64_t n = 0; n < N; n++)
                for (int64_t o = 0; o < O; o++)
                    for (int64_t i = 0; i < I; i++) mag[(size_t)(n * O + o)] += fabs((double)X[n * I + i] * W[o * I + i]);
            check("linear_fwd_bf16_w_cuda_within_bf16_bound", y, mag, ub, I, NULL);
        }
        if (ok2("linear_bwd_bf16_w_cuda_within_bf16_bound", dt_linear_bwd(&ctx, &dx.h, &dw.h, &db.h, &g.h, &x.h, &w.h),
                dt_linear_bwd(&ctx, &dx.d, &dw.d, &db.d, &g.d, &x.d, &w16))) {
            std::vector<double> mx((size_t)(N * I), 0.0), mw((size_t)(O * I), 0.0);
            for (int64_t n = 0; n < N; n++)
                for (int64_t o = 0; o < O; o++)
                    for (int64_t i = 0; i < I; i++) {
                        mx[(size_t)(n * I + i)] += fabs((double)G[n * O + o] * W[o * I + i]);
                        mw[(size_t)(o * I + i)] += fabs((double)G[n * O + o] * X[n * I + i]);
                    }
            check("linear_bwd_dx_bf16_w_cuda_within_bf16_bound", dx, mx, ub, O, &dx0);
            check("linear_bwd_dw_bf16_w_cuda_within_bf16_bound", dw, mw, 2 * ub + ub * ub, N, &dw0);
            /* dout's column sums from the dw GEMM's epilogue (cuBLASLt's BGRADB), so of the bf16 dout
               it read: within 2^-9 of each |dout| and the f32 sums */
            std::vector<double> mb((size_t)O, 0.0);
            for (int64_t n = 0; n < N; n++)
                for (int64_t o = 0; o < O; o++) mb[(size_t)o] += fabs((double)G[n * O + o]);
            bool fused_here = true; /* on a GPU (bench/gpu) its heuristic may refuse BGRADB: exact f32 sums */
#ifdef DT_EMU_STUBS
            fused_here = false;
#endif
            check("linear_bwd_dbias_bf16_w_cuda_within_bf16_rounding_of_dout", db, mb, ub / 2, N, &db0, fused_here);
        }
        /* the CPU's own bf16 GEMMs (AMX, or f32 GEMMs of the rounded operands) make the same
           products as the tensor cores: the two differ by their f32 sums only, 2 gamma(I) sum |x w| */
        if (ok2("linear_fwd_bf16_w_on_cpu_equals_the_tensor_cores_within_f32", dt_linear_fwd(&ctx, &y.h, &x.h, &w16h, NULL),
                dt_linear_fwd(&ctx, &y.d, &x.d, &w16, NULL))) {
            std::vector<float> got((size_t)y.h.numel);
            cudaMemcpy(got.data(), y.d.data, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
            size_t bad = 0, first = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t o = 0; o < O; o++) {
                    double mag = 0.0, gk = 2.0 * I * u / (1.0 - I * u);
                    size_t i = (size_t)(n * O + o);
                    for (int64_t k = 0; k < I; k++) mag += (1.0 + ub) * fabs((double)X[n * I + k] * W[o * I + k]);
                    if (!(fabs(got[i] - ((const float *)y.h.data)[i]) <= 2 * gk * mag) && bad++ == 0) first = i;
                }
            dt_test_check_all("linear_fwd_bf16_w_on_cpu_equals_the_tensor_cores_within_f32", !bad,
                              "%zu of %zu outside (first [%zu]: cuda %.9g, cpu %.9g); dt_cpu_bf16_gemm: %s", bad,
                              got.size(), first, (double)got[first], (double)((const float *)y.h.data)[first],
                              dt_cpu_bf16_gemm());
        }
        dt_tensor_free(&ctx, &w16), dt_tensor_free(&ctx, &w16h);
        pair_t *all[] = {&x, &w, &b, &y, &g, &dx, &dw, &db};
        for (pair_t *p : all) release(*p);
    }
    { /* linear (+ bias), gelu, layernorm: forward then backward, as in an MLP block */
        const int64_t N = 6, I = 5, O = 7;
        pair_t x = make(DT_F32, 2, N, I, 0, 0, 10), w = make(DT_F32, 2, O, I, 0, 0, 11), bias = make(DT_F32, 1, O, 0, 0, 0, 12);
        pair_t y = make(DT_F32, 2, N, O, 0, 0, 13), g = make(DT_F32, 2, N, O, 0, 0, 14), lw = make(DT_F32, 1, O, 0, 0, 0, 15);
        pair_t lb = make(DT_F32, 1, O, 0, 0, 0, 16), ln = make(DT_F32, 2, N, O, 0, 0, 17), mean = make(DT_F32, 1, N, 0, 0, 0, 18);
        pair_t rstd = make(DT_F32, 1, N, 0, 0, 0, 19), dy = make(DT_F32, 2, N, O, 0, 0, 20), dx = make(DT_F32, 2, N, I, 0, 0, 21);
        pair_t dw = make(DT_F32, 2, O, I, 0, 0, 22), dbias = make(DT_F32, 1, O, 0, 0, 0, 23), dg = make(DT_F32, 2, N, O, 0, 0, 24);
        pair_t dlw = make(DT_F32, 1, O, 0, 0, 0, 25), dlb = make(DT_F32, 1, O, 0, 0, 0, 26), dln = make(DT_F32, 2, N, O, 0, 0, 27);
        if (ok2("linear_fwd_cuda_tensors_match_cpu", dt_linear_fwd(&ctx, &y.h, &x.h, &w.h, &bias.h),
                dt_linear_fwd(&ctx, &y.d, &x.d, &w.d, &bias.d)))
            same("linear_fwd_cuda_tensors_match_cpu", y, 1e-5);
        if (ok2("gelu_fwd_cuda_tensors_match_cpu", dt_gelu_fwd(&ctx, &g.h, &y.h), dt_gelu_fwd(&ctx, &g.d, &y.d)))
            same("gelu_fwd_cuda_tensors_match_cpu", g, 1e-5);
        if (ok2("layernorm_fwd_cuda_tensors_match_cpu",
                dt_layernorm_fwd(&ctx, &ln.h, &mean.h, &rstd.h, &g.h, &lw.h, &lb.h, 1e-5f),
                dt_layernorm_fwd(&ctx, &ln.d, &mean.d, &rstd.d, &g.d, &lw.d, &lb.d, 1e-5f))) {
            same("layernorm_fwd_cuda_tensors_match_cpu", ln, 1e-5);
            same("layernorm_fwd_rstd_cuda_tensors_match_cpu", rstd, 1e-5);
        }
        if (ok2("layernorm_bwd_cuda_tensors_match_cpu",
                dt_layernorm_bwd(&ctx, &dg.h, &dlw.h, &dlb.h, &dln.h, &g.h, &lw.h, &mean.h, &rstd.h),
                dt_layernorm_bwd(&ctx, &dg.d, &dlw.d, &dlb.d, &dln.d, &g.d, &lw.d, &mean.d, &rstd.d))) {
            same("layernorm_bwd_dx_cuda_tensors_match_cpu", dg, 1e-5);
            same("layernorm_bwd_dw_cuda_tensors_match_cpu", dlw, 1e-5);
        }
        if (ok2("gelu_bwd_cuda_tensors_match_cpu", dt_gelu_bwd(&ctx, &dy.h, &dg.h, &y.h), dt_gelu_bwd(&ctx, &dy.d, &dg.d, &y.d)))
            same("gelu_bwd_cuda_tensors_match_cpu", dy, 1e-5);
        if (ok2("linear_bwd_cuda_tensors_match_cpu", dt_linear_bwd(&ctx, &dx.h, &dw.h, &dbias.h, &dy.h, &x.h, &w.h),
                dt_linear_bwd(&ctx, &dx.d, &dw.d, &dbias.d, &dy.d, &x.d, &w.d))) {
            same("linear_bwd_dx_cuda_tensors_match_cpu", dx, 1e-5);
            same("linear_bwd_dw_cuda_tensors_match_cpu", dw, 1e-5);
            same("linear_bwd_dbias_cuda_tensors_match_cpu", dbias, 1e-5);
        }
        { /* relu, in place as the CPU op allows (out = x), and its backward */
            pair_t r = make(DT_F32, 2, N, O, 0, 0, 28), dr = make(DT_F32, 2, N, O, 0, 0, 29);
            if (ok2("relu_fwd_in_place_cuda_tensors_match_cpu", dt_relu_fwd(&ctx, &r.h, &r.h), dt_relu_fwd(&ctx, &r.d, &r.d)))
                same("relu_fwd_in_place_cuda_tensors_match_cpu", r, 0);
            if (ok2("relu_bwd_cuda_tensors_match_cpu", dt_relu_bwd(&ctx, &dr.h, &dy.h, &r.h), dt_relu_bwd(&ctx, &dr.d, &dy.d, &r.d)))
                same("relu_bwd_cuda_tensors_match_cpu", dr, 1e-5); /* dy came from gelu_bwd: equal within 1e-5 */
            release(r); release(dr);
        }
        dt_test_error("layernorm_fwd_cuda_eps_0_is_named", dt_layernorm_fwd(&ctx, &ln.d, NULL, NULL, &g.d, &lw.d, NULL, 0.0f),
                      dt_ctx_error(&ctx), "eps");
        /* outputs over inputs, on the device as on the CPU: the dw / db pass reads x after the dx
           pass has written dx (over x it gave dw off by hundreds), the forward's statistics are
           written while x is read */
        dt_test_error("layernorm_bwd_cuda_dx_is_x_is_named",
                      dt_layernorm_bwd(&ctx, &g.d, &dlw.d, &dlb.d, &dln.d, &g.d, &lw.d, &mean.d, &rstd.d), dt_ctx_error(&ctx),
                      "dt_layernorm_bwd: dx shares memory with x");
        dt_test_error("layernorm_fwd_cuda_mean_is_rstd_is_named",
                      dt_layernorm_fwd(&ctx, &ln.d, &mean.d, &mean.d, &g.d, &lw.d, &lb.d, 1e-5f), dt_ctx_error(&ctx),
                      "dt_layernorm_fwd: mean shares memory with rstd");
        pair_t *all[] = {&x, &w, &bias, &y, &g, &lw, &lb, &ln, &mean, &rstd, &dy, &dx, &dw, &dbias, &dg, &dlw, &dlb, &dln};
        for (pair_t *p : all) release(*p);
    }
    { /* attention and embedding */
        pair_t qkv = make(DT_F32, 3, 2, 5, 18, 0, 30), out = make(DT_F32, 3, 2, 5, 6, 0, 31);
        pair_t att = make(DT_F32, 4, 2, 2, 5, 5, 32), dqkv = make(DT_F32, 3, 2, 5, 18, 0, 33);
        pair_t table = make(DT_F32, 2, 9, 4, 0, 0, 34), ids = make(DT_I64, 1, 7, 0, 0, 0, 35, 9);
        pair_t eo = make(DT_F32, 2, 7, 4, 0, 0, 36), dtab = make(DT_F32, 2, 9, 4, 0, 0, 37);
        if (ok2("attention_fwd_cuda_tensors_match_cpu", dt_attention_fwd(&ctx, &out.h, &att.h, &qkv.h, 2),
                dt_attention_fwd(&ctx, &out.d, &att.d, &qkv.d, 2))) {
            same("attention_fwd_cuda_tensors_match_cpu", out, 1e-5);
            same("attention_fwd_att_cuda_tensors_match_cpu", att, 1e-5);
        }
        if (ok2("attention_bwd_cuda_tensors_match_cpu", dt_attention_bwd(&ctx, &dqkv.h, &out.h, &qkv.h, &att.h, 2),
                dt_attention_bwd(&ctx, &dqkv.d, &out.d, &qkv.d, &att.d, 2)))
            same("attention_bwd_cuda_tensors_match_cpu", dqkv, 1e-5);
        { /* grouped-query, f32 with att: the kv head repeated into the multi-head kernels, its dk, dv
             summed back over the two query heads */
            pair_t gq = make(DT_F32, 3, 2, 5, 12, 0, 40), go = make(DT_F32, 3, 2, 5, 6, 0, 41);
            pair_t ga = make(DT_F32, 4, 2, 2, 5, 5, 42), gd = make(DT_F32, 3, 2, 5, 12, 0, 43);
            if (ok2("attention_gqa_fwd_cuda_tensors_match_cpu", dt_attention_gqa_fwd(&ctx, &go.h, &ga.h, &gq.h, 2, 1),
                    dt_attention_gqa_fwd(&ctx, &go.d, &ga.d, &gq.d, 2, 1))) {
                same("attention_gqa_fwd_cuda_tensors_match_cpu", go, 1e-5);
                same("attention_gqa_fwd_att_cuda_tensors_match_cpu", ga, 1e-5);
            }
            if (ok2("attention_gqa_bwd_cuda_tensors_match_cpu", dt_attention_gqa_bwd(&ctx, &gd.h, &go.h, &gq.h, &ga.h, 2, 1),
                    dt_attention_gqa_bwd(&ctx, &gd.d, &go.d, &gq.d, &ga.d, 2, 1)))
                same("attention_gqa_bwd_cuda_tensors_match_cpu", gd, 1e-5);
            on_device_only("attention_gqa_fwd_bwd_cuda_second_call_stays_on_device", [&] {
                dt_status st = dt_attention_gqa_fwd(&ctx, &go.d, &ga.d, &gq.d, 2, 1);
                return st ? st : dt_attention_gqa_bwd(&ctx, &gd.d, &go.d, &gq.d, &ga.d, 2, 1);
            });
            dt_test_error("attention_gqa_f32_cuda_without_att_is_named", dt_attention_gqa_fwd(&ctx, &go.d, NULL, &gq.d, 2, 1),
                          dt_ctx_error(&ctx), "pass att");
            release(gq); release(go); release(ga); release(gd);
        }
        on_device_only("attention_fwd_bwd_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_attention_fwd(&ctx, &out.d, &att.d, &qkv.d, 2);
            return st ? st : dt_attention_bwd(&ctx, &dqkv.d, &out.d, &qkv.d, &att.d, 2);
        });
        if (ok2("embedding_fwd_cuda_tensors_match_cpu", dt_embedding_fwd(&ctx, &eo.h, &table.h, &ids.h),
                dt_embedding_fwd(&ctx, &eo.d, &table.d, &ids.d)))
            same("embedding_fwd_cuda_tensors_match_cpu", eo, 0);
        if (ok2("embedding_bwd_cuda_tensors_match_cpu", dt_embedding_bwd(&ctx, &dtab.h, &eo.h, &ids.h),
                dt_embedding_bwd(&ctx, &dtab.d, &eo.d, &ids.d)))
            same("embedding_bwd_cuda_equals_cpu_bitwise", dtab, 0); /* each (id, column) in id order */
        on_device_only("embedding_fwd_bwd_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_embedding_fwd(&ctx, &eo.d, &table.d, &ids.d);
            return st ? st : dt_embedding_bwd(&ctx, &dtab.d, &eo.d, &ids.d);
        });
        DT_TEST_CHECK("embedding_cuda_checks_pass_at_the_sync", dt_ctx_sync(&ctx) == DT_OK);
        { /* an id out of range on the device: the op queues the check and returns; the next sync
             names the op, the index and the value, as the CPU op does */
            int64_t bad = 9;
            cudaMemcpy((int64_t *)ids.d.data + 3, &bad, 8, cudaMemcpyHostToDevice);
            DT_TEST_CHECK("embedding_fwd_cuda_id_out_of_range_returns_before_the_check",
                          dt_embedding_fwd(&ctx, &eo.d, &table.d, &ids.d) == DT_OK);
            dt_status st = dt_ctx_sync(&ctx);
            dt_test_error("embedding_fwd_cuda_id_out_of_range_is_named_at_the_sync", st, dt_ctx_error(&ctx),
                          "dt_embedding_fwd: ids[3] = 9 is outside [0, 9)");
            DT_TEST_CHECK("embedding_fwd_cuda_id_out_of_range_is_DT_ERR_RANGE", st == DT_ERR_RANGE);
            DT_TEST_CHECK("embedding_cuda_range_error_is_reported_once", dt_ctx_sync(&ctx) == DT_OK);
            DT_TEST_CHECK("embedding_bwd_cuda_id_out_of_range_returns_before_the_check",
                          dt_embedding_bwd(&ctx, &dtab.d, &eo.d, &ids.d) == DT_OK);
            dt_test_error("embedding_bwd_cuda_id_out_of_range_is_named_at_the_sync", dt_ctx_sync(&ctx), dt_ctx_error(&ctx),
                          "dt_embedding_bwd: ids[3] = 9 is outside [0, 9)");
        }
        dt_test_error("attention_fwd_cuda_n_head_not_dividing_C_is_named", dt_attention_fwd(&ctx, &out.d, &att.d, &qkv.d, 4),
                      dt_ctx_error(&ctx), "n_head = 4");
        pair_t *all[] = {&qkv, &out, &att, &dqkv, &table, &ids, &eo, &dtab};
        for (pair_t *p : all) release(*p);
    }
    { /* embedding backward with many repeated ids over several column chunks (D = 70) and row
         classes: bitwise the CPU's (id order per (id, column)), the same bits twice; i32 ids */
        pair_t table = make(DT_F32, 2, 11, 70, 0, 0, 60), ids = make(DT_I32, 1, 300, 0, 0, 0, 61, 11);
        pair_t g = make(DT_F32, 2, 300, 70, 0, 0, 62), dt1 = make(DT_F32, 2, 11, 70, 0, 0, 63);
        pair_t dt2 = make(DT_F32, 2, 11, 70, 0, 0, 63);
        if (ok2("embedding_bwd_repeated_ids_cuda_equals_cpu_bitwise", dt_embedding_bwd(&ctx, &dt1.h, &g.h, &ids.h),
                dt_embedding_bwd(&ctx, &dt1.d, &g.d, &ids.d)))
            same("embedding_bwd_repeated_ids_cuda_equals_cpu_bitwise", dt1, 0);
        if (ok2("embedding_bwd_repeated_ids_cuda_same_bits_every_run", DT_OK, dt_embedding_bwd(&ctx, &dt2.d, &g.d, &ids.d))) {
            dt_embedding_bwd(&ctx, &dt2.h, &g.h, &ids.h); /* dt2.h: dt1.h's inputs, run again on the cpu */
            same("embedding_bwd_repeated_ids_cuda_same_bits_every_run", dt2, 0);
        }
        pair_t *all[] = {&table, &ids, &g, &dt1, &dt2};
        for (pair_t *p : all) release(*p);
    }
    { /* attention without att on cuda: the fused (flash) kernels, against the CPU op with att;
         T = 35: a full and a partial tile of 32 */
        pair_t qkv = make(DT_F32, 3, 2, 35, 24, 0, 50), out = make(DT_F32, 3, 2, 35, 8, 0, 51);
        pair_t att = make(DT_F32, 4, 2, 2, 35, 35, 52), dqkv = make(DT_F32, 3, 2, 35, 24, 0, 53);
        pair_t dout = make(DT_F32, 3, 2, 35, 8, 0, 54), big = make(DT_F32, 3, 1, 2, 3 * 97, 0, 55);
        pair_t bigo = make(DT_F32, 3, 1, 2, 97, 0, 56);
        if (ok2("attention_fwd_cuda_no_att_fused_matches_cpu", dt_attention_fwd(&ctx, &out.h, &att.h, &qkv.h, 2),
                dt_attention_fwd(&ctx, &out.d, NULL, &qkv.d, 2)))
            same("attention_fwd_cuda_no_att_fused_matches_cpu", out, 1e-5);
        if (ok2("attention_bwd_cuda_no_att_fused_matches_cpu", dt_attention_bwd(&ctx, &dqkv.h, &dout.h, &qkv.h, &att.h, 2),
                dt_attention_bwd(&ctx, &dqkv.d, &dout.d, &qkv.d, NULL, 2)))
            same("attention_bwd_cuda_no_att_fused_accumulates_as_cpu", dqkv, 1e-5);
        on_device_only("attention_fused_fwd_bwd_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_attention_fwd(&ctx, &out.d, NULL, &qkv.d, 2);
            return st ? st : dt_attention_bwd(&ctx, &dqkv.d, &dout.d, &qkv.d, NULL, 2);
        });
        dt_test_error("attention_fwd_cpu_no_att_is_named", dt_attention_fwd(&ctx, &out.h, NULL, &qkv.h, 2),
                      dt_ctx_error(&ctx), "att is NULL");
        dt_test_error("attention_fwd_cuda_no_att_head_size_97_is_named", dt_attention_fwd(&ctx, &bigo.d, NULL, &big.d, 1),
                      dt_ctx_error(&ctx), "head size C / n_head = 97");
        dt_test_error("attention_bwd_cuda_no_att_dout_shape_is_named",
                      dt_attention_bwd(&ctx, &dqkv.d, &qkv.d, &qkv.d, NULL, 2), dt_ctx_error(&ctx), "dout shape");
        pair_t *all[] = {&qkv, &out, &att, &dqkv, &dout, &big, &bigo};
        for (pair_t *p : all) release(*p);
    }
    { /* attention with a bf16 qkv on cuda: the tensor-core kernels (kernels/dt_flash.cu, bounded
         element by element in k_flash.cpp), against the CPU op on the same (bf16-rounded) values.
         This checks the wiring (heads, strides, scratch, +=): a misplaced row or head is an error
         of the size of the values; bf16's own is some 1e-2 of |want| + rms, allowed 5e-2 here. */
        /* 2 heads of 32; T past one tile of 64; one sequence on the host-thread runs' small inputs
           (DT_K_SMALL=1: TSan, threads), where this block took 8 of k_ops' 13 s */
        const char *small = getenv("DT_K_SMALL");
        const int64_t B = small && small[0] == '1' ? 1 : 2, T = 70, C = 64;
        pair_t qkv = make(DT_F32, 3, B, T, 3 * C, 0, 70), out = make(DT_F32, 3, B, T, C, 0, 71);
        pair_t att = make(DT_F32, 4, B, 2, T, T, 72), dqkv = make(DT_F32, 3, B, T, 3 * C, 0, 73);
        pair_t dout = make(DT_F32, 3, B, T, C, 0, 74);
        dt_tensor q16, q16h;
        dt_tensor_create_like(&ctx, &q16, &qkv.d, DT_BF16, DT_CUDA_DEVICE);
        dt_tensor_create_like(&ctx, &q16h, &qkv.h, DT_BF16, DT_CPU);
        dt_tensor_cast(&ctx, &q16h, &qkv.h); /* the CPU reference runs on the rounded values */
        dt_tensor_cast(&ctx, &qkv.h, &q16h);
        dt_tensor_cast(&ctx, &q16, &qkv.d);
        auto near = [&](const char *name, pair_t &p) {
            std::vector<float> got((size_t)p.h.numel);
            cudaMemcpy(got.data(), p.d.data, got.size() * sizeof(float), cudaMemcpyDeviceToHost);
            const float *want = (const float *)p.h.data;
            double ss = 0.0, worst = 0.0;
            size_t at = 0;
            for (size_t i = 0; i < got.size(); i++) ss += (double)want[i] * want[i];
            double rms = sqrt(ss / (double)got.size());
            for (size_t i = 0; i < got.size(); i++) {
                double e = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + rms);
                if (!(e <= worst)) worst = e != e ? INFINITY : e, at = i;
            }
            dt_test_check_all(name, worst <= 5e-2, "[%zu] cuda %.7g, cpu %.7g: %.3g of |cpu| + rms (allowed 5e-2)",
                              at, (double)got[at], (double)want[at], worst);
        };
        if (ok2("attention_fwd_bf16_qkv_cuda_tensor_cores_match_cpu",
                dt_attention_fwd(&ctx, &out.h, &att.h, &qkv.h, 2), dt_attention_fwd(&ctx, &out.d, NULL, &q16, 2)))
            near("attention_fwd_bf16_qkv_cuda_tensor_cores_match_cpu", out);
        if (ok2("attention_bwd_bf16_qkv_cuda_tensor_cores_accumulate_as_cpu",
                dt_attention_bwd(&ctx, &dqkv.h, &dout.h, &qkv.h, &att.h, 2),
                dt_attention_bwd(&ctx, &dqkv.d, &dout.d, &q16, NULL, 2)))
            near("attention_bwd_bf16_qkv_cuda_tensor_cores_accumulate_as_cpu", dqkv);
        on_device_only("attention_bf16_fwd_bwd_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_attention_fwd(&ctx, &out.d, NULL, &q16, 2);
            return st ? st : dt_attention_bwd(&ctx, &dqkv.d, &dout.d, &q16, NULL, 2);
        });
        dt_test_error("attention_fwd_bf16_qkv_with_att_is_named", dt_attention_fwd(&ctx, &out.d, &att.d, &q16, 2),
                      dt_ctx_error(&ctx), "att must be NULL");
        dt_test_error("attention_fwd_bf16_qkv_head_size_8_is_named", dt_attention_fwd(&ctx, &out.d, NULL, &q16, 8),
                      dt_ctx_error(&ctx), "head size C / n_head = 8");
        dt_test_error("attention_bwd_bf16_qkv_dqkv_shape_is_named",
                      dt_attention_bwd(&ctx, &out.d, &dout.d, &q16, NULL, 2), dt_ctx_error(&ctx), "dqkv");
        { /* dqkv is added into while qkv and dout are read: over either it is named, as on the CPU
             (on the tensor cores it returned DT_OK with gradients off by units) */
            dt_tensor dv;
            int64_t sh[3] = {B, T, C};
            dt_test_error("attention_bwd_bf16_qkv_dqkv_is_qkv_is_named", dt_attention_bwd(&ctx, &q16, &dout.d, &q16, NULL, 2),
                          dt_ctx_error(&ctx), "dt_attention_bwd: dqkv shares memory with qkv");
            if (DT_TEST_CHECK("attention_bwd_dout_view_inside_dqkv_made", dt_tensor_view(&ctx, &dv, &dqkv.d, 0, 3, sh) == DT_OK))
                dt_test_error("attention_bwd_bf16_qkv_dout_inside_dqkv_is_named",
                              dt_attention_bwd(&ctx, &dqkv.d, &dv, &q16, NULL, 2), dt_ctx_error(&ctx),
                              "dt_attention_bwd: dqkv shares memory with dout");
            dt_test_error("attention_gqa_bwd_bf16_qkv_dqkv_is_qkv_is_named",
                          dt_attention_gqa_bwd(&ctx, &q16, &dout.d, &q16, NULL, 2, 2), dt_ctx_error(&ctx),
                          "dqkv shares memory with qkv");
        }
        /* a bf16 qkv on the CPU (att kept): bf16 products there too */
        if (ok2("attention_fwd_bf16_qkv_on_cpu_matches_the_tensor_cores", dt_attention_fwd(&ctx, &out.h, &att.h, &q16h, 2),
                dt_attention_fwd(&ctx, &out.d, NULL, &q16, 2)))
            near("attention_fwd_bf16_qkv_on_cpu_matches_the_tensor_cores", out);
        dt_tensor_free(&ctx, &q16), dt_tensor_free(&ctx, &q16h);
        pair_t *all[] = {&qkv, &out, &att, &dqkv, &dout};
        for (pair_t *p : all) release(*p);
    }
    { /* softmax_xent keeps probs on cuda as on the cpu; the loss stays on the device unless asked for */
        const int64_t R = 6, V = 37; /* V not a multiple of 4 or 32: the CPU's padded lanes, a partial warp */
        pair_t z = make(DT_F32, 2, R, V, 0, 0, 40), p = make(DT_F32, 2, R, V, 0, 0, 41), t = make(DT_I32, 1, R, 0, 0, 0, 42, V);
        pair_t g = make(DT_F32, 2, R, V, 0, 0, 43);
        int32_t ign = -1;
        float lh = 0, ld = 0;
        int64_t nh = 0, nd = 0;
        const double tol = xent_tol((double)V, 8.0);
        for (int k = 0; k < 2; k++) { /* rows 1 and 4 ignored: no loss, no gradient, not counted */
            ((int32_t *)t.h.data)[k ? 4 : 1] = ign;
            cudaMemcpy((int32_t *)t.d.data + (k ? 4 : 1), &ign, 4, cudaMemcpyHostToDevice);
        }
        for (int64_t i = 0; i < z.h.numel; i++) ((float *)z.h.data)[i] *= 8.0f; /* logits in [-8, 8): a peaked softmax */
        dt_tensor_copy(&ctx, &z.d, &z.h);
        if (ok2("softmax_xent_fwd_cuda_tensors_match_cpu", dt_softmax_xent_fwd(&ctx, &lh, &nh, &p.h, &z.h, &t.h, -1),
                dt_softmax_xent_fwd(&ctx, &ld, &nd, &p.d, &z.d, &t.d, -1))) {
            dt_test_close("softmax_xent_fwd_cuda_loss_within_derived_bound_of_cpu", ld, lh, tol);
            DT_TEST_CHECK("softmax_xent_fwd_cuda_n_valid_counts_rows_not_ignored", nd == 4 && nh == 4);
            same("softmax_xent_fwd_cuda_probs_within_derived_bound_of_cpu", p, tol);
        }
        { /* loss NULL: nothing read back, nothing waited for; dt_cuda_read_loss reads the same loss later */
            float l2 = -1;
            int64_t n2 = -1;
            dt_ctx_counters_reset(&ctx);
            if (ok2("softmax_xent_fwd_cuda_null_loss_reads_nothing", DT_OK,
                    dt_softmax_xent_fwd(&ctx, NULL, NULL, &p.d, &z.d, &t.d, -1)))
                DT_TEST_CHECK("softmax_xent_fwd_cuda_null_loss_reads_nothing",
                              ctx.counters.d2h_calls == 0 && ctx.counters.syncs == 0);
            if (ok2("softmax_xent_cuda_read_loss_later_gives_the_loss", DT_OK, dt_cuda_read_loss(&ctx, &l2, &n2, "k_ops")))
                DT_TEST_CHECK("softmax_xent_cuda_read_loss_later_gives_the_loss", l2 == ld && n2 == nd);
        }
        dt_tensor_copy(&ctx, &p.d, &p.h); /* the backward from the cpu's probabilities: the cpu's operations */
        if (ok2("softmax_xent_bwd_cuda_tensors_match_cpu", dt_softmax_xent_bwd(&ctx, &g.h, &p.h, &t.h, -1, 0.75f),
                dt_softmax_xent_bwd(&ctx, &g.d, &p.d, &t.d, -1, 0.75f)))
            same("softmax_xent_bwd_cuda_equals_cpu_bitwise", g, 0);
        on_device_only("softmax_xent_fwd_bwd_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_softmax_xent_fwd(&ctx, NULL, NULL, &p.d, &z.d, &t.d, -1);
            return st ? st : dt_softmax_xent_bwd(&ctx, &g.d, &p.d, &t.d, -1, 0.75f);
        });
        /* in place, as the CPU op allows: probs = logits, then dlogits = probs */
        dt_tensor_copy(&ctx, &z.d, &z.h);
        if (ok2("softmax_xent_fwd_in_place_cuda_matches_cpu", dt_softmax_xent_fwd(&ctx, &lh, NULL, &z.h, &z.h, &t.h, -1),
                dt_softmax_xent_fwd(&ctx, &ld, NULL, &z.d, &z.d, &t.d, -1))) {
            dt_test_close("softmax_xent_fwd_in_place_cuda_loss_within_derived_bound_of_cpu", ld, lh, tol);
            same("softmax_xent_fwd_in_place_cuda_probs_within_derived_bound_of_cpu", z, tol);
        }
        dt_tensor_copy(&ctx, &z.d, &z.h);
        if (ok2("softmax_xent_bwd_in_place_cuda_matches_cpu", dt_softmax_xent_bwd(&ctx, &z.h, &z.h, &t.h, -1, 1.0f),
                dt_softmax_xent_bwd(&ctx, &z.d, &z.d, &t.d, -1, 1.0f)))
            same("softmax_xent_bwd_in_place_cuda_equals_cpu_bitwise", z, 0);
        { /* every target ignored: loss 0, n_valid 0, the gradient untouched, as on the cpu */
            pair_t ti = make(DT_I32, 1, R, 0, 0, 0, 44, V), g2 = make(DT_F32, 2, R, V, 0, 0, 45);
            std::vector<int32_t> all(R, -1);
            cudaMemcpy(ti.d.data, all.data(), R * 4, cudaMemcpyHostToDevice);
            ld = 1; nd = 1;
            if (ok2("softmax_xent_all_ignored_cuda_is_zero", DT_OK, dt_softmax_xent_fwd(&ctx, &ld, &nd, &p.d, &g2.d, &ti.d, -1)))
                DT_TEST_CHECK("softmax_xent_all_ignored_cuda_is_zero", ld == 0.0f && nd == 0);
            if (ok2("softmax_xent_bwd_all_ignored_cuda_adds_nothing", DT_OK,
                    dt_softmax_xent_bwd(&ctx, &g2.d, &p.d, &ti.d, -1, 1.0f)))
                same("softmax_xent_bwd_all_ignored_cuda_adds_nothing", g2, 0);
            release(ti); release(g2);
        }
        { /* bad inputs: shapes named as on the cpu, nothing launched; a target out of range found
             on the device, named (op, index, value) by the loss read or the next sync */
            int32_t bad = (int32_t)V;
            cudaMemcpy((int32_t *)t.d.data + 2, &bad, 4, cudaMemcpyHostToDevice);
            dt_test_error("softmax_xent_fwd_cuda_target_out_of_range_is_named_by_the_loss_read",
                          dt_softmax_xent_fwd(&ctx, &ld, NULL, &p.d, &g.d, &t.d, -1), dt_ctx_error(&ctx),
                          "dt_softmax_xent_fwd: targets[2] = 37 is outside [0, 37)");
            DT_TEST_CHECK("softmax_xent_fwd_cuda_target_out_of_range_is_DT_ERR_RANGE",
                          dt_softmax_xent_fwd(&ctx, &ld, NULL, &p.d, &g.d, &t.d, -1) == DT_ERR_RANGE);
            DT_TEST_CHECK("softmax_xent_bwd_cuda_target_out_of_range_returns_before_the_check",
                          dt_softmax_xent_bwd(&ctx, &g.d, &p.d, &t.d, -1, 1.0f) == DT_OK);
            dt_test_error("softmax_xent_bwd_cuda_target_out_of_range_is_named_at_the_sync", dt_ctx_sync(&ctx),
                          dt_ctx_error(&ctx), "dt_softmax_xent_bwd: targets[2] = 37 is outside [0, 37)");
            DT_TEST_CHECK("softmax_xent_fwd_cuda_null_loss_target_out_of_range_returns",
                          dt_softmax_xent_fwd(&ctx, NULL, NULL, &p.d, &g.d, &t.d, -1) == DT_OK);
            dt_test_error("softmax_xent_fwd_cuda_null_loss_target_out_of_range_is_named_at_the_sync", dt_ctx_sync(&ctx),
                          dt_ctx_error(&ctx), "targets[2] = 37");
            dt_test_error("softmax_xent_fwd_cuda_targets_on_cpu_is_named",
                          dt_softmax_xent_fwd(&ctx, &ld, NULL, &p.d, &g.d, &t.h, -1), dt_ctx_error(&ctx), "targets is on cpu");
            dt_test_error("softmax_xent_fwd_cuda_f32_targets_is_named",
                          dt_softmax_xent_fwd(&ctx, &ld, NULL, &p.d, &g.d, &g.d, -1), dt_ctx_error(&ctx), "targets");
            bad = 0;
            cudaMemcpy((int32_t *)t.d.data + 2, &bad, 4, cudaMemcpyHostToDevice);
            pair_t narrow = make(DT_F32, 2, R, V - 1, 0, 0, 46);
            dt_test_error("softmax_xent_fwd_cuda_probs_shape_is_named",
                          dt_softmax_xent_fwd(&ctx, &ld, NULL, &narrow.d, &p.d, &t.d, -1), dt_ctx_error(&ctx),
                          "probs shape [6, 36] does not match logits");
            dt_test_error("softmax_xent_bwd_cuda_dlogits_shape_is_named",
                          dt_softmax_xent_bwd(&ctx, &narrow.d, &p.d, &t.d, -1, 1.0f), dt_ctx_error(&ctx),
                          "dlogits shape [6, 36] does not match probs");
            release(narrow);
            DT_TEST_CHECK("softmax_xent_cuda_nothing_pending_after_the_fix", dt_ctx_sync(&ctx) == DT_OK);
        }
        release(z); release(p); release(t); release(g);
    }
    { /* bce with logits: the loss on the device (labels there, or on the host: copied up) */
        const int64_t B = 300;
        pair_t z = make(DT_F32, 2, B, 1, 0, 0, 70), y = make(DT_F32, 1, B, 0, 0, 0, 71), g = make(DT_F32, 2, B, 1, 0, 0, 72);
        float lh = 0, ld = 0, lu = 0;
        for (int64_t i = 0; i < B; i++) {
            ((float *)z.h.data)[i] *= 20.0f;
            ((float *)y.h.data)[i] = ((float *)y.h.data)[i] > 0 ? 1.0f : 0.0f;
        }
        dt_tensor_copy(&ctx, &z.d, &z.h);
        dt_tensor_copy(&ctx, &y.d, &y.h);
        if (ok2("bce_logits_fwd_cuda_matches_cpu", dt_bce_logits_fwd(&ctx, &lh, &z.h, &y.h),
                dt_bce_logits_fwd(&ctx, &ld, &z.d, &y.d)))
            dt_test_close("bce_logits_fwd_cuda_loss_within_2u_of_cpu", ld, lh, 2.0 / 16777216.0 * fabs(lh));
        if (ok2("bce_logits_fwd_cuda_host_labels_match", DT_OK, dt_bce_logits_fwd(&ctx, &lu, &z.d, &y.h)))
            DT_TEST_CHECK("bce_logits_fwd_cuda_host_labels_match", lu == ld);
        if (ok2("bce_logits_bwd_cuda_equals_cpu_bitwise", dt_bce_logits_bwd(&ctx, &g.h, &z.h, &y.h, 0.5f),
                dt_bce_logits_bwd(&ctx, &g.d, &z.d, &y.d, 0.5f)))
            same("bce_logits_bwd_cuda_equals_cpu_bitwise", g, 0);
        on_device_only("bce_logits_fwd_bwd_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_bce_logits_fwd(&ctx, NULL, &z.d, &y.d);
            return st ? st : dt_bce_logits_bwd(&ctx, &g.d, &z.d, &y.d, 0.5f);
        });
        on_device_only("bce_logits_fwd_bwd_cuda_host_labels_go_up_once_each", [&] {
            dt_status st = dt_bce_logits_fwd(&ctx, NULL, &z.d, &y.h);
            return st ? st : dt_bce_logits_bwd(&ctx, &g.d, &z.d, &y.h, 0.5f);
        }, 2 * B * 4);
        dt_test_error("bce_logits_fwd_cuda_cpu_logits_is_named", dt_bce_logits_fwd(&ctx, &ld, &z.h, &y.d), dt_ctx_error(&ctx),
                      "logits is on cpu");
        release(z); release(y); release(g);
    }
    { /* dt_sum / dt_sumsq: a device sum, the double comes back (the op's one copy and wait) */
        pair_t x = make(DT_F32, 2, 40, 33, 0, 0, 80);
        double sh = 0, sd = 0, mag = 0;
        for (int64_t i = 0; i < x.h.numel; i++) mag += fabs(((float *)x.h.data)[i]);
        for (int sq = 0; sq < 2; sq++) {
            const char *nm = sq ? "sumsq_cuda_within_n_ud_sum_abs_of_cpu" : "sum_cuda_within_n_ud_sum_abs_of_cpu";
            if (ok2(nm, sq ? dt_sumsq(&ctx, &sh, &x.h) : dt_sum(&ctx, &sh, &x.h), sq ? dt_sumsq(&ctx, &sd, &x.d) : dt_sum(&ctx, &sd, &x.d)))
                dt_test_close(nm, sd, sh, 2.0 * (double)x.h.numel / 9007199254740992.0 * (sq ? sh : mag));
        }
        on_device_only("sum_cuda_second_call_one_copy_down_one_wait_by_design", [&] { return dt_sumsq(&ctx, &sd, &x.d); },
                       0, 1);
        release(x);
    }
    { /* axpy (the SGD step of examples/mlp on cuda parameters) */
        pair_t y = make(DT_F32, 2, 7, 9, 0, 0, 50), x = make(DT_F32, 1, 63, 0, 0, 0, 51), x2 = make(DT_F32, 1, 5, 0, 0, 0, 52);
        if (ok2("axpy_cuda_tensors_match_cpu", dt_axpy(&ctx, &y.h, -0.3f, &x.h), dt_axpy(&ctx, &y.d, -0.3f, &x.d)))
            same("axpy_cuda_tensors_match_cpu", y, 0); /* one float multiply-add: the same bits */
        dt_test_error("axpy_cuda_numel_mismatch_is_named", dt_axpy(&ctx, &y.d, 1.0f, &x2.d), dt_ctx_error(&ctx),
                      "y has 63 elements, x has 5");
        dt_test_error("axpy_cuda_mixed_devices_is_named", dt_axpy(&ctx, &y.d, 1.0f, &x.h), dt_ctx_error(&ctx), "x is on cpu");
        { /* the elementwise family: add, mul (fwd, bwd), scale, axpy */
            pair_t a = make(DT_F32, 1, 63, 0, 0, 0, 53), b = make(DT_F32, 1, 63, 0, 0, 0, 54), o = make(DT_F32, 1, 63, 0, 0, 0, 55);
            if (ok2("scale_cuda_equals_cpu_bitwise", dt_scale(&ctx, &a.h, 0.37f), dt_scale(&ctx, &a.d, 0.37f)))
                same("scale_cuda_equals_cpu_bitwise", a, 0); /* one float multiply */
            on_device_only("elementwise_cuda_second_call_stays_on_device", [&] {
                dt_status st = dt_add(&ctx, &o.d, &a.d, &b.d);
                if (!st) st = dt_mul_fwd(&ctx, &o.d, &a.d, &b.d);
                if (!st) st = dt_mul_bwd(&ctx, &a.d, &b.d, &o.d, &x.d, &y.d);
                if (!st) st = dt_scale(&ctx, &o.d, 0.5f);
                return st ? st : dt_axpy(&ctx, &y.d, 0.1f, &x.d);
            });
            release(a); release(b); release(o);
        }
        release(y); release(x); release(x2);
    }
    { /* concat / split, dot interaction: their second calls stay on the device */
        const int64_t B = 5, F = 3, D = 4, W = D + (F + 1) * F / 2;
        pair_t a = make(DT_F32, 2, B, D, 0, 0, 90), e = make(DT_F32, 3, B, F, D, 0, 91), e2 = make(DT_F32, 2, B, F * D, 0, 0, 92);
        pair_t cat = make(DT_F32, 2, B, D + F * D, 0, 0, 93), out = make(DT_F32, 2, B, W, 0, 0, 94);
        pair_t da = make(DT_F32, 2, B, D, 0, 0, 95), de = make(DT_F32, 3, B, F, D, 0, 96);
        const dt_tensor *parts[2] = {&a.d, &e2.d};
        dt_tensor *outs[2] = {&da.d, &e2.d};
        on_device_only("concat_split_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_concat_fwd(&ctx, &cat.d, parts, 2);
            if (!st) st = dt_concat_bwd(&ctx, outs, 2, &cat.d);
            if (!st) st = dt_split_fwd(&ctx, outs, 2, &cat.d);
            return st ? st : dt_split_bwd(&ctx, &cat.d, (const dt_tensor *const *)outs, 2);
        });
        on_device_only("dot_interaction_cuda_second_call_stays_on_device", [&] {
            dt_status st = dt_dot_interaction_fwd(&ctx, &out.d, &a.d, &e.d);
            return st ? st : dt_dot_interaction_bwd(&ctx, &da.d, &de.d, &out.d, &a.d, &e.d);
        });
        pair_t *all[] = {&a, &e, &e2, &cat, &out, &da, &de};
        for (pair_t *p : all) release(*p);
    }
    { /* casts on the device: f32 -> bf16 / f16 -> f32 (and bf16 <-> f16) give the CPU's bits */
        static const dt_dtype pairs[5][2] = {{DT_F32, DT_BF16}, {DT_F32, DT_F16}, {DT_BF16, DT_F32}, {DT_F16, DT_F32},
                                             {DT_BF16, DT_F16}};
        pair_t x = make(DT_F32, 1, 1003, 0, 0, 0, 41);
        for (int k = 0; k < 5; k++) {
            pair_t src = make(pairs[k][0], 1, 1003), dst = make(pairs[k][1], 1, 1003);
            char name[96];
            std::vector<uint8_t> got((size_t)dt_tensor_bytes(&dst.h));
            dt_tensor h;
            ok2("cast_setup", dt_tensor_cast(&ctx, &src.h, &x.h), dt_tensor_cast(&ctx, &src.d, &x.d));
            snprintf(name, sizeof name, "cast_%s_to_%s_cuda_equals_cpu_bitwise", dt_dtype_name(pairs[k][0]),
                     dt_dtype_name(pairs[k][1]));
            if (ok2(name, dt_tensor_cast(&ctx, &dst.h, &src.h), dt_tensor_cast(&ctx, &dst.d, &src.d))) {
                dt_tensor_create_like(&ctx, &h, &dst.d, DT_DTYPE_DEFAULT, DT_CPU);
                dt_tensor_copy(&ctx, &h, &dst.d);
                size_t n = (size_t)dt_tensor_bytes(&h), bad = n;
                for (size_t i = 0; i < n && bad == n; i++)
                    if (((const uint8_t *)h.data)[i] != ((const uint8_t *)dst.h.data)[i]) bad = i;
                DT_TEST_CHECK(name, bad == n);
                dt_tensor_free(&ctx, &h);
            }
            release(src);
            release(dst);
        }
        {
            pair_t b16 = make(DT_BF16, 1, 1003), h16 = make(DT_F16, 1, 1003);
            on_device_only("cast_cuda_second_call_stays_on_device", [&] {
                dt_status st = dt_tensor_cast(&ctx, &b16.d, &x.d);
                return st ? st : dt_tensor_cast(&ctx, &h16.d, &b16.d);
            });
            release(b16); release(h16);
        }
        pair_t i32 = make(DT_I32, 1, 1003, 0, 0, 0, 3, 100);
        dt_status st = dt_tensor_cast(&ctx, &i32.d, &x.d);
        dt_test_error("cast_cuda_to_i32_is_unsupported_named", st, dt_ctx_error(&ctx), "i32");
        DT_TEST_CHECK("cast_cuda_to_i32_status", st == DT_ERR_UNSUPPORTED);
        st = dt_tensor_cast(&ctx, &x.d, &x.h);
        dt_test_error("cast_cpu_src_to_cuda_dst_is_device_error", st, dt_ctx_error(&ctx), "src is on cpu");
        DT_TEST_CHECK("cast_mixed_devices_status", st == DT_ERR_DEVICE);
        release(i32);
        release(x);
    }
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
