// tests/cuda_emu/k_ops.cpp - dt_tensor.h built with DT_CUDA on the emulator: the public ops on
// CUDA tensors (dispatched to kernels/) against the same ops on CPU tensors, forward and
// backward (attention also without att: the fused kernels), and a mixed-device call named as an error.
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
        if (ok2("embedding_fwd_cuda_tensors_match_cpu", dt_embedding_fwd(&ctx, &eo.h, &table.h, &ids.h),
                dt_embedding_fwd(&ctx, &eo.d, &table.d, &ids.d)))
            same("embedding_fwd_cuda_tensors_match_cpu", eo, 0);
        if (ok2("embedding_bwd_cuda_tensors_match_cpu", dt_embedding_bwd(&ctx, &dtab.h, &eo.h, &ids.h),
                dt_embedding_bwd(&ctx, &dtab.d, &eo.d, &ids.d)))
            same("embedding_bwd_cuda_tensors_match_cpu", dtab, 1e-6);
        { /* an id out of range on the device: named with its index, as on the CPU; nothing launched */
            int64_t bad = 9;
            cudaMemcpy((int64_t *)ids.d.data + 3, &bad, 8, cudaMemcpyHostToDevice);
            dt_test_error("embedding_fwd_cuda_id_out_of_range_is_named", dt_embedding_fwd(&ctx, &eo.d, &table.d, &ids.d),
                          dt_ctx_error(&ctx), "ids[3] = 9");
        }
        dt_test_error("attention_fwd_cuda_n_head_not_dividing_C_is_named", dt_attention_fwd(&ctx, &out.d, &att.d, &qkv.d, 4),
                      dt_ctx_error(&ctx), "n_head = 4");
        pair_t *all[] = {&qkv, &out, &att, &dqkv, &table, &ids, &eo, &dtab};
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
        dt_test_error("attention_fwd_cpu_no_att_is_named", dt_attention_fwd(&ctx, &out.h, NULL, &qkv.h, 2),
                      dt_ctx_error(&ctx), "att is NULL");
        dt_test_error("attention_fwd_cuda_no_att_head_size_97_is_named", dt_attention_fwd(&ctx, &bigo.d, NULL, &big.d, 1),
                      dt_ctx_error(&ctx), "head size C / n_head = 97");
        dt_test_error("attention_bwd_cuda_no_att_dout_shape_is_named",
                      dt_attention_bwd(&ctx, &dqkv.d, &qkv.d, &qkv.d, NULL, 2), dt_ctx_error(&ctx), "dout shape");
        pair_t *all[] = {&qkv, &out, &att, &dqkv, &dout, &big, &bigo};
        for (pair_t *p : all) release(*p);
    }
    { /* softmax_xent keeps probs on cuda as on the cpu; loss and n_valid are host values */
        const int64_t R = 6, V = 37; /* V not a multiple of 4 or 32: the CPU's padded lanes, a partial warp */
        pair_t z = make(DT_F32, 2, R, V, 0, 0, 40), p = make(DT_F32, 2, R, V, 0, 0, 41), t = make(DT_I32, 1, R, 0, 0, 0, 42, V);
        pair_t g = make(DT_F32, 2, R, V, 0, 0, 43);
        int32_t ign = -1;
        float lh = 0, ld = 0;
        int64_t nh = 0, nd = 0;
        for (int k = 0; k < 2; k++) { /* rows 1 and 4 ignored: no loss, no gradient, not counted */
            ((int32_t *)t.h.data)[k ? 4 : 1] = ign;
            cudaMemcpy((int32_t *)t.d.data + (k ? 4 : 1), &ign, 4, cudaMemcpyHostToDevice);
        }
        for (int64_t i = 0; i < z.h.numel; i++) ((float *)z.h.data)[i] *= 8.0f; /* logits in [-8, 8): a peaked softmax */
        dt_tensor_copy(&ctx, &z.d, &z.h);
        if (ok2("softmax_xent_fwd_cuda_tensors_match_cpu", dt_softmax_xent_fwd(&ctx, &lh, &nh, &p.h, &z.h, &t.h, -1),
                dt_softmax_xent_fwd(&ctx, &ld, &nd, &p.d, &z.d, &t.d, -1))) {
            dt_test_close("softmax_xent_fwd_cuda_loss_matches_cpu", ld, lh, 1e-5 * fabs(lh));
            DT_TEST_CHECK("softmax_xent_fwd_cuda_n_valid_counts_rows_not_ignored", nd == 4 && nh == 4);
            same("softmax_xent_fwd_cuda_probs_match_cpu", p, 1e-5);
        }
        if (ok2("softmax_xent_bwd_cuda_tensors_match_cpu", dt_softmax_xent_bwd(&ctx, &g.h, &p.h, &t.h, -1, 0.75f),
                dt_softmax_xent_bwd(&ctx, &g.d, &p.d, &t.d, -1, 0.75f)))
            same("softmax_xent_bwd_cuda_accumulates_like_cpu", g, 1e-5);
        /* in place, as the CPU op allows: probs = logits, then dlogits = probs */
        if (ok2("softmax_xent_fwd_in_place_cuda_matches_cpu", dt_softmax_xent_fwd(&ctx, &lh, NULL, &z.h, &z.h, &t.h, -1),
                dt_softmax_xent_fwd(&ctx, &ld, NULL, &z.d, &z.d, &t.d, -1))) {
            dt_test_close("softmax_xent_fwd_in_place_cuda_loss_matches_cpu", ld, lh, 1e-5 * fabs(lh));
            same("softmax_xent_fwd_in_place_cuda_probs_match_cpu", z, 1e-5);
        }
        if (ok2("softmax_xent_bwd_in_place_cuda_matches_cpu", dt_softmax_xent_bwd(&ctx, &z.h, &z.h, &t.h, -1, 1.0f),
                dt_softmax_xent_bwd(&ctx, &z.d, &z.d, &t.d, -1, 1.0f)))
            same("softmax_xent_bwd_in_place_cuda_matches_cpu", z, 1e-5);
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
        { /* bad inputs: named as on the cpu, nothing launched */
            int32_t bad = (int32_t)V;
            cudaMemcpy((int32_t *)t.d.data + 2, &bad, 4, cudaMemcpyHostToDevice);
            dt_test_error("softmax_xent_fwd_cuda_target_out_of_range_is_named",
                          dt_softmax_xent_fwd(&ctx, &ld, NULL, &p.d, &g.d, &t.d, -1), dt_ctx_error(&ctx), "targets[2] = 37");
            DT_TEST_CHECK("softmax_xent_fwd_cuda_target_out_of_range_is_DT_ERR_RANGE",
                          dt_softmax_xent_fwd(&ctx, &ld, NULL, &p.d, &g.d, &t.d, -1) == DT_ERR_RANGE);
            dt_test_error("softmax_xent_bwd_cuda_target_out_of_range_is_named",
                          dt_softmax_xent_bwd(&ctx, &g.d, &p.d, &t.d, -1, 1.0f), dt_ctx_error(&ctx), "targets[2] = 37");
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
            dt_test_error("softmax_xent_fwd_cuda_null_loss_is_named",
                          dt_softmax_xent_fwd(&ctx, NULL, NULL, &p.d, &g.d, &t.d, -1), dt_ctx_error(&ctx), "loss is NULL");
        }
        release(z); release(p); release(t); release(g);
    }
    { /* axpy (the SGD step of examples/mlp on cuda parameters) */
        pair_t y = make(DT_F32, 2, 7, 9, 0, 0, 50), x = make(DT_F32, 1, 63, 0, 0, 0, 51), x2 = make(DT_F32, 1, 5, 0, 0, 0, 52);
        if (ok2("axpy_cuda_tensors_match_cpu", dt_axpy(&ctx, &y.h, -0.3f, &x.h), dt_axpy(&ctx, &y.d, -0.3f, &x.d)))
            same("axpy_cuda_tensors_match_cpu", y, 0); /* one float multiply-add: the same bits */
        dt_test_error("axpy_cuda_numel_mismatch_is_named", dt_axpy(&ctx, &y.d, 1.0f, &x2.d), dt_ctx_error(&ctx),
                      "y has 63 elements, x has 5");
        dt_test_error("axpy_cuda_mixed_devices_is_named", dt_axpy(&ctx, &y.d, 1.0f, &x.h), dt_ctx_error(&ctx), "x is on cpu");
        release(y); release(x); release(x2);
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
