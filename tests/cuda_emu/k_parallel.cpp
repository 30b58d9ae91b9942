// tests/cuda_emu/k_parallel.cpp - dt_parallel.h built with DT_CUDA on the emulator: the vocab-parallel
// embedding and cross entropy (kernels/dt_parallel.cu) on CUDA tensors against the same calls on
// CPU tensors (a tp world of 1: the math per rank), their launchers at another rank's vocab
// range against host loops of the CPU function's formulas, dt_concat / dt_split on CUDA tensors,
// the arena on CUDA parameters, and bad inputs named (ids and targets out of range, mixed devices).
#include <cuda_runtime.h>
#include <math.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_kernels.h" /* the launchers it calls directly (the implementation includes it too) */
#include "tests/dt_test.h"

static dt_ctx ctx;

/* A CPU tensor with random values (ids / targets: integers in [0, vmax)) and its CUDA copy. */
struct pair_t { dt_tensor h, d; };
static pair_t make(dt_dtype dt, int ndim, int64_t a, int64_t b = 0, uint64_t seed = 1, int64_t vmax = 0) {
    pair_t p;
    dt_tensor_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = dt; desc.ndim = ndim;
    desc.shape[0] = a; desc.shape[1] = b;
    desc.device = DT_CPU;
    dt_tensor_create(&ctx, &p.h, &desc);
    desc.device = DT_CUDA_DEVICE;
    dt_tensor_create(&ctx, &p.d, &desc);
    for (int64_t i = 0; i < p.h.numel; i++) {
        float u = dt_rng_uniform(31, seed, (uint64_t)i);
        if (dt == DT_F32) ((float *)p.h.data)[i] = 4.0f * u - 2.0f;
        if (dt == DT_I32) ((int32_t *)p.h.data)[i] = (int32_t)(u * (float)vmax) % (int32_t)vmax;
        if (dt == DT_I64) ((int64_t *)p.h.data)[i] = (int64_t)(u * (float)vmax) % vmax;
    }
    dt_tensor_copy(&ctx, &p.d, &p.h);
    return p;
}
static void release(pair_t &p) { dt_tensor_free(&ctx, &p.h); dt_tensor_free(&ctx, &p.d); }
static std::vector<float> down(const dt_tensor &d) {
    std::vector<float> v((size_t)d.numel);
    if (d.numel) cudaMemcpy(v.data(), d.data, (size_t)d.numel * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}
/* PASS iff the CUDA tensor's values equal the CPU tensor's within rtol (0: bit for bit). */
static void same(const char *name, pair_t &p, double rtol) {
    std::vector<float> got = down(p.d);
    if (rtol == 0) dt_test_equal_bytes(name, got.data(), p.h.data, dt_tensor_bytes(&p.h));
    else dt_test_allclose(name, got.data(), (const float *)p.h.data, (size_t)p.h.numel, rtol * 0.1, rtol);
}
static int ok2(const char *name, dt_status a, dt_status b) {
    if (a == DT_OK && b == DT_OK) return 1;
    return dt_test_fail(name, "cpu status %d, cuda status %d: %s", (int)a, (int)b, dt_ctx_error(&ctx));
}

static void embedding(dt_layout *l) {
    const int64_t N = 24, V = 40, C = 12;
    pair_t table = make(DT_F32, 2, V, C, 1), ids = make(DT_I32, 1, N, 0, 2, V), out = make(DT_F32, 2, N, C, 3);
    pair_t dout = make(DT_F32, 2, N, C, 4), dtable = make(DT_F32, 2, V, C, 5);
    ((int32_t *)ids.h.data)[5] = ((int32_t *)ids.h.data)[9] = 7; /* a repeated id: two rows add into one */
    dt_tensor_copy(&ctx, &ids.d, &ids.h);
    if (ok2("tp_embedding_fwd_cuda_runs", dt_tp_embedding_fwd(l, &out.h, NULL, &table.h, &ids.h, 0, V, 0),
            dt_tp_embedding_fwd(l, &out.d, NULL, &table.d, &ids.d, 0, V, 0)))
        same("tp_embedding_fwd_cuda_equals_cpu_bitwise", out, 0);
    if (ok2("tp_embedding_bwd_cuda_runs", dt_tp_embedding_bwd(l, &dtable.h, NULL, &dout.h, &ids.h, 0, V, 0),
            dt_tp_embedding_bwd(l, &dtable.d, NULL, &dout.d, &ids.d, 0, V, 0)))
        same("tp_embedding_bwd_cuda_accumulates_as_cpu_bitwise", dtable, 0);
    /* the launchers at rank 0 and 1 of 2 (vocab rows [0, 20), [20, 40)): other rows give zeros and
       add nothing */
    for (int rank = 0; rank < 2; rank++) {
        const int64_t Vl = V / 2, vs = rank * Vl;
        char nm[96];
        std::vector<float> t = down(table.d), o, g, want((size_t)(N * C)), gw((size_t)(Vl * C));
        const int32_t *id = (const int32_t *)ids.h.data;
        const float *d = (const float *)dout.h.data;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                int64_t r = id[n] - vs;
                want[(size_t)(n * C + c)] = r >= 0 && r < Vl ? t[(size_t)((vs + r) * C + c)] : 0.0f;
                if (r >= 0 && r < Vl) gw[(size_t)(r * C + c)] += d[n * C + c];
            }
        float *shard = (float *)table.d.data + vs * C; /* this rank's rows of the table */
        int e = dt_k_tp_embedding_fwd((float *)out.d.data, shard, ids.d.data, 0, N, Vl, C, vs, NULL);
        o = down(out.d);
        snprintf(nm, sizeof nm, "tp_embedding_fwd_rank%d_masks_other_ranks_rows", rank);
        if (DT_TEST_CHECK("tp_embedding_fwd_launcher_runs", e == 0))
            dt_test_allclose(nm, o.data(), want.data(), want.size(), 0, 0);
        dt_tensor_fill(&ctx, &dtable.d, 0.0);
        e = dt_k_tp_embedding_bwd((float *)dtable.d.data, (const float *)dout.d.data, ids.d.data, 0, N, Vl, C, vs, NULL);
        g = down(dtable.d);
        snprintf(nm, sizeof nm, "tp_embedding_bwd_rank%d_adds_only_its_rows", rank);
        if (DT_TEST_CHECK("tp_embedding_bwd_launcher_runs", e == 0))
            dt_test_allclose(nm, g.data(), gw.data(), gw.size(), 0, 0);
    }
    /* bad inputs */
    ((int32_t *)ids.h.data)[3] = (int32_t)V;
    dt_tensor_copy(&ctx, &ids.d, &ids.h);
    dt_test_error("tp_embedding_fwd_cuda_id_out_of_vocab_is_named",
                  dt_tp_embedding_fwd(l, &out.d, NULL, &table.d, &ids.d, 0, V, 0), dt_ctx_error(&ctx), "ids[3] = 40");
    DT_TEST_CHECK("tp_embedding_fwd_cuda_id_out_of_vocab_is_range", ctx.last_status == DT_ERR_RANGE);
    ((int32_t *)ids.h.data)[3] = 0;
    dt_tensor_copy(&ctx, &ids.d, &ids.h);
    dt_test_error("tp_embedding_fwd_mixed_devices_is_named",
                  dt_tp_embedding_fwd(l, &out.d, NULL, &table.h, &ids.d, 0, V, 0), dt_ctx_error(&ctx), "cuda");
    DT_TEST_CHECK("tp_embedding_fwd_mixed_devices_is_device_error", ctx.last_status == DT_ERR_DEVICE);
    release(table); release(ids); release(out); release(dout); release(dtable);
}

static void xent(dt_layout *l) {
    const int64_t N = 20, Vp = 48, V = 45; /* 3 padding columns, never a target */
    pair_t logits = make(DT_F32, 2, N, Vp, 11), tg = make(DT_I32, 1, N, 0, 12, V), stats = make(DT_F32, 2, N, 2, 13);
    pair_t dl = make(DT_F32, 2, N, Vp, 14);
    float lc = 0, lg = 0;
    int64_t nc = 0, ng = 0;
    ((int32_t *)tg.h.data)[4] = -1; /* ignored rows */
    ((int32_t *)tg.h.data)[17] = -1;
    dt_tensor_copy(&ctx, &tg.d, &tg.h);
    if (ok2("tp_xent_fwd_cuda_runs", dt_tp_xent_fwd(l, &lc, &nc, &stats.h, &logits.h, &tg.h, 0, V, -1),
            dt_tp_xent_fwd(l, &lg, &ng, &stats.d, &logits.d, &tg.d, 0, V, -1))) {
        dt_test_close("tp_xent_fwd_cuda_loss_equals_cpu", lg, lc, 1e-6 * fabs((double)lc));
        DT_TEST_CHECK("tp_xent_fwd_cuda_counts_the_rows_not_ignored", ng == nc && nc == N - 2);
        same("tp_xent_fwd_cuda_stats_equal_cpu", stats, 1e-6);
    }
    if (ok2("tp_xent_bwd_cuda_runs", dt_tp_xent_bwd(l, &dl.h, &logits.h, &stats.h, &tg.h, 0, V, -1, 0.75f),
            dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.d, &tg.d, 0, V, -1, 0.75f)))
        same("tp_xent_bwd_cuda_accumulates_as_cpu", dl, 1e-6);
    /* the launcher at rank 1 of 2 (columns [24, 48) of the padded vocab; 21 real ones): phases
       0 and 1 against the CPU function's loops, by hand */
    {
        const int64_t Vl = Vp / 2, vs = Vl, nv = V - vs;
        std::vector<float> z = down(logits.d);
        std::vector<double> want(3 * N), got(3 * N);
        const int32_t *t = (const int32_t *)tg.h.data;
        double *buf = NULL;
        cudaMalloc((void **)&buf, sizeof(double) * 3 * N);
        /* rank 1's logits: columns [24, 48) of each row, contiguous in a [N, 24] copy */
        std::vector<float> zl((size_t)(N * Vl));
        for (int64_t r = 0; r < N; r++)
            for (int64_t c = 0; c < Vl; c++) zl[(size_t)(r * Vl + c)] = z[(size_t)(r * Vp + vs + c)];
        float *dz = NULL;
        cudaMalloc((void **)&dz, sizeof(float) * N * Vl);
        cudaMemcpy(dz, zl.data(), sizeof(float) * N * Vl, cudaMemcpyHostToDevice);
        for (int64_t r = 0; r < N; r++) {
            float mx = -INFINITY;
            double s = 0;
            for (int64_t c = 0; c < nv; c++) if (zl[(size_t)(r * Vl + c)] > mx) mx = zl[(size_t)(r * Vl + c)];
            for (int64_t c = 0; c < nv; c++) s += expf(zl[(size_t)(r * Vl + c)] - mx);
            int64_t tt = t[r] - vs;
            want[(size_t)r] = mx;
            want[(size_t)(N + 2 * r)] = t[r] != -1 && tt >= 0 && tt < nv ? zl[(size_t)(r * Vl + tt)] : 0.0;
            want[(size_t)(N + 2 * r + 1)] = s;
        }
        int e = dt_k_tp_xent_fwd(buf, NULL, dz, (const int32_t *)tg.d.data, -1, N, Vl, nv, vs, 0, NULL);
        if (!e) e = dt_k_tp_xent_fwd(buf, NULL, dz, (const int32_t *)tg.d.data, -1, N, Vl, nv, vs, 1, NULL);
        cudaMemcpy(got.data(), buf, sizeof(double) * 3 * N, cudaMemcpyDeviceToHost);
        double worst = 0;
        for (size_t i = 0; i < want.size(); i++) {
            double d = fabs(got[i] - want[i]) / (fabs(want[i]) > 1 ? fabs(want[i]) : 1.0);
            if (!(d <= worst)) worst = d;
        }
        if (DT_TEST_CHECK("tp_xent_fwd_launcher_rank1_runs", e == 0))
            dt_test_check_all("tp_xent_fwd_rank1_max_target_and_sum_equal_host_loops", worst <= 1e-12,
                              "largest relative difference %.3g (row 0: max %.9g / %.9g, sum %.17g / %.17g)", worst,
                              got[0], want[0], got[(size_t)N + 1], want[(size_t)N + 1]);
        cudaFree(buf);
        cudaFree(dz);
    }
    /* bad inputs */
    dt_test_error("tp_xent_bwd_mixed_devices_is_named",
                  dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.h, &tg.d, 0, V, -1, 1.0f), dt_ctx_error(&ctx), "stats");
    ((int32_t *)tg.h.data)[6] = (int32_t)V; /* a padding column is not a target */
    dt_tensor_copy(&ctx, &tg.d, &tg.h);
    dt_test_error("tp_xent_fwd_cuda_target_in_padding_is_named",
                  dt_tp_xent_fwd(l, &lg, &ng, &stats.d, &logits.d, &tg.d, 0, V, -1), dt_ctx_error(&ctx),
                  "targets[6] = 45");
    DT_TEST_CHECK("tp_xent_fwd_cuda_target_in_padding_is_range", ctx.last_status == DT_ERR_RANGE);
    release(logits); release(tg); release(stats); release(dl);
}

static void concat() {
    pair_t q = make(DT_F32, 2, 6, 4, 21), k = make(DT_F32, 2, 6, 4, 22), v = make(DT_F32, 2, 6, 5, 23);
    pair_t qkv = make(DT_F32, 2, 6, 13, 24);
    const dt_tensor *ph[3] = {&q.h, &k.h, &v.h}, *pd[3] = {&q.d, &k.d, &v.d};
    dt_tensor *wh[3] = {&q.h, &k.h, &v.h}, *wd[3] = {&q.d, &k.d, &v.d};
    if (ok2("concat_fwd_cuda_runs", dt_concat_fwd(&ctx, &qkv.h, ph, 3), dt_concat_fwd(&ctx, &qkv.d, pd, 3)))
        same("concat_fwd_cuda_equals_cpu_bitwise", qkv, 0);
    dt_scale(&ctx, &qkv.h, 0.5f);
    dt_tensor_copy(&ctx, &qkv.d, &qkv.h);
    if (ok2("split_fwd_cuda_runs", dt_split_fwd(&ctx, wh, 3, &qkv.h), dt_split_fwd(&ctx, wd, 3, &qkv.d))) {
        same("split_fwd_cuda_equals_cpu_bitwise_q", q, 0);
        same("split_fwd_cuda_equals_cpu_bitwise_v", v, 0);
    }
    if (ok2("concat_bwd_cuda_runs", dt_concat_bwd(&ctx, wh, 3, &qkv.h), dt_concat_bwd(&ctx, wd, 3, &qkv.d)))
        same("concat_bwd_cuda_accumulates_as_cpu", k, 0);
    dt_test_error("concat_fwd_cuda_widths_that_do_not_sum_are_named",
                  dt_concat_fwd(&ctx, &qkv.d, pd, 2), dt_ctx_error(&ctx), "sum to 8");
    dt_test_error("concat_fwd_cuda_mixed_devices_are_named",
                  dt_concat_fwd(&ctx, &qkv.d, ph, 3), dt_ctx_error(&ctx), "part 0 is on cpu");
    release(q); release(k); release(v); release(qkv);
}

static void arena() {
    dt_params ps;
    dt_param *p = NULL;
    dt_param_desc d;
    dt_arena *a = NULL;
    memset(&ps, 0, sizeof ps);
    memset(&d, 0, sizeof d);
    d.name = "w"; d.shape[0] = 5; d.shape[1] = 3; d.init.kind = DT_INIT_NORMAL; d.init.std = 1; d.init.seed = 3;
    dt_params_add(&ctx, &ps, &p, &d);
    d.name = "b"; d.shape[0] = 7; d.shape[1] = 0;
    dt_params_add(&ctx, &ps, &p, &d);
    std::vector<float> w0 = down(ps.items[0]->value), b0 = down(ps.items[1]->value);
    if (DT_TEST_CHECK("arena_create_on_cuda_params", dt_arena_create(&ctx, &a, &ps, NULL) == DT_OK)) {
        std::vector<float> w1 = down(ps.items[0]->value), b1 = down(ps.items[1]->value);
        DT_TEST_CHECK("arena_cuda_buffers_live_on_cuda", a->device == DT_CUDA_DEVICE &&
                      a->values[DT_F32].device == DT_CUDA_DEVICE && a->grads.device == DT_CUDA_DEVICE &&
                      ps.items[1]->value.data == (float *)a->values[DT_F32].data + 15);
        dt_test_allclose("arena_cuda_keeps_the_values_w", w1.data(), w0.data(), w0.size(), 0, 0);
        dt_test_allclose("arena_cuda_keeps_the_values_b", b1.data(), b0.data(), b0.size(), 0, 0);
        dt_arena_free(a);
    }
    dt_params_free(&ctx, &ps);
    /* one parameter on the host, one on the device */
    memset(&ps, 0, sizeof ps);
    d.name = "dev"; d.device = DT_CUDA_DEVICE;
    dt_params_add(&ctx, &ps, &p, &d);
    d.name = "host"; d.device = DT_CPU;
    dt_params_add(&ctx, &ps, &p, &d);
    dt_test_error("arena_mixed_devices_is_named", dt_arena_create(&ctx, &a, &ps, NULL), dt_ctx_error(&ctx),
                  "parameter \"host\" has its value on cpu");
    DT_TEST_CHECK("arena_mixed_devices_is_device_error", ctx.last_status == DT_ERR_DEVICE && a == NULL);
    dt_params_free(&ctx, &ps);
}

int main(void) {
    dt_ctx_desc cd;
    dt_comm *world = NULL;
    dt_layout *l = NULL;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &cd) || dt_comm_create_world(&ctx, &world, NULL) || dt_layout_create(world, &l, NULL)) {
        dt_test_fail("setup_cuda_ctx_and_layout", "%s", dt_ctx_error(&ctx));
        return dt_test_finish();
    }
    embedding(l);
    xent(l);
    concat();
    arena();
    dt_layout_free(l);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
