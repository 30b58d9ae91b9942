// tests/cuda_emu/k_moe.cpp - dt_parallel.h's mixture-of-experts layer (dt_moe_fwd / _bwd /
// _step_end) on CUDA tensors (kernels/dt_moe.cu for the routing, capacity, slots, copies and
// combine; dt_tensor.h's CUDA ops for the experts' GEMMs) against the same calls on CPU tensors, a
// world of one rank (ep 1): capacity 1.25 with the aux loss and Switch's gates, dropless with the
// bias and renormalised gates, 2 micro-batches. Checked: y within 1e-6 + 1e-5 |cpu| (the device
// expf's ulps in the softmax, cuBLAS's sum order), dx and every grad within 1e-5 + 1e-4 |cpu|,
// the step's aux loss within 1e-6 relative, dropped count, fingerprint and per-expert load
// equal, the bias update equal; a second step allocates nothing on the device and waits once per
// forward (the counts the all-to-all's sizes need) and not in the backward.
#include <cuda_runtime.h>
#include <math.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "tests/dt_test.h"
#include "k_common.h" /* k_refused */

static dt_ctx ctx;

#define E 8
#define K 2
#define CW 16
#define F 32
#define T 8
#define S 4
#define N (S * T)

static dt_tensor mk(dt_device dev, int nd, int64_t d0, int64_t d1, int64_t d2) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32; d.device = dev; d.ndim = nd;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2;
    if (dt_tensor_create(&ctx, &t, &d) || dt_tensor_fill(&ctx, &t, 0.0)) {
        fprintf(stderr, "%s\n", dt_ctx_error(&ctx));
        exit(2);
    }
    return t;
}
static std::vector<float> down(const dt_tensor &d) {
    std::vector<float> v((size_t)d.numel);
    if (d.device == DT_CPU) memcpy(v.data(), d.data, (size_t)d.numel * sizeof(float));
    else cudaMemcpy(v.data(), d.data, (size_t)d.numel * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}

/* One layer's tensors on a device, filled from the same seeds. */
struct layer_t {
    dt_tensor x[2], y[2], dy[2], dx[2], rt, w1, b1, w2, b2, drt, dw1, db1, dw2, db2;
};
static void fill(dt_tensor *t, uint64_t seed, float scale) {
    std::vector<float> v((size_t)t->numel);
    for (int64_t i = 0; i < t->numel; i++) v[(size_t)i] = scale * (2.0f * dt_rng_uniform(17, seed, (uint64_t)i) - 1.0f);
    if (t->device == DT_CPU) memcpy(t->data, v.data(), v.size() * sizeof(float));
    else cudaMemcpy(t->data, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
}
static layer_t make(dt_device dev) {
    layer_t L;
    for (int i = 0; i < 2; i++) {
        L.x[i] = mk(dev, 2, N, CW, 0); fill(&L.x[i], 1 + i, 1.0f);
        L.dy[i] = mk(dev, 2, N, CW, 0); fill(&L.dy[i], 3 + i, 0.5f);
        L.y[i] = mk(dev, 2, N, CW, 0);
        L.dx[i] = mk(dev, 2, N, CW, 0);
    }
    L.rt = mk(dev, 2, E, CW, 0); fill(&L.rt, 5, 0.8f);
    L.w1 = mk(dev, 3, E, F, CW); fill(&L.w1, 6, 0.3f);
    L.b1 = mk(dev, 2, E, F, 0); fill(&L.b1, 7, 0.1f);
    L.w2 = mk(dev, 3, E, CW, F); fill(&L.w2, 8, 0.3f);
    L.b2 = mk(dev, 2, E, CW, 0); fill(&L.b2, 9, 0.1f);
    L.drt = mk(dev, 2, E, CW, 0); L.dw1 = mk(dev, 3, E, F, CW); L.db1 = mk(dev, 2, E, F, 0);
    L.dw2 = mk(dev, 3, E, CW, F); L.db2 = mk(dev, 2, E, CW, 0);
    return L;
}
static void drop(layer_t &L) {
    dt_tensor *all[] = {&L.x[0], &L.x[1], &L.y[0], &L.y[1], &L.dy[0], &L.dy[1], &L.dx[0], &L.dx[1], &L.rt, &L.w1,
                        &L.b1, &L.w2, &L.b2, &L.drt, &L.dw1, &L.db1, &L.dw2, &L.db2};
    for (dt_tensor *t : all) dt_tensor_free(&ctx, t);
}

/* micro forwards, then their backwards (GPipe's order: the aux loss needs every forward first),
   then the step's end. */
static int step(dt_moe *m, dt_moe_acts **a, layer_t &L, int micro, dt_moe_stats *st) {
    for (int i = 0; i < micro; i++)
        if (dt_moe_fwd(m, a[i], &L.y[i], &L.x[i], (int64_t)i * S, &L.rt, &L.w1, &L.b1, &L.w2, &L.b2)) return 1;
    for (int i = 0; i < micro; i++)
        if (dt_moe_bwd(m, a[i], &L.dx[i], &L.drt, &L.dw1, &L.db1, &L.dw2, &L.db2, &L.dy[i], &L.x[i], &L.rt, &L.w1,
                       &L.w2, 1.0f))
            return 1;
    return dt_moe_step_end(m, st) != DT_OK;
}

static void close_all(const char *name, const dt_tensor &got, const dt_tensor &want, double atol, double rtol) {
    std::vector<float> g = down(got), w = down(want);
    dt_test_allclose(name, g.data(), w.data(), g.size(), atol, rtol);
}

static void run_case(dt_layout *l, const char *tag, double capacity, int renorm, dt_moe_balance bal, int micro) {
    dt_moe_desc md;
    dt_moe *mc = NULL, *mg = NULL;
    dt_moe_acts *ac[2] = {NULL, NULL}, *ag[2] = {NULL, NULL};
    dt_moe_stats sc, sg;
    char name[160];
    memset(&md, 0, sizeof md);
    md.experts = E; md.top_k = K; md.width = CW; md.hidden = F; md.seq = T; md.capacity = capacity;
    md.renorm = renorm; md.balance = bal; md.aux_coef = 0.05; md.bias_rate = 0.01; md.micro = micro;
    if (dt_moe_create(l, &mc, &md) || dt_moe_create(l, &mg, &md)) {
        dt_test_fail("moe_create", "%s", dt_ctx_error(&ctx));
        return;
    }
    for (int i = 0; i < micro; i++) { dt_moe_acts_create(mc, &ac[i]); dt_moe_acts_create(mg, &ag[i]); }
    for (int e = 0; e < E; e++) dt_moe_bias(mc)[e] = dt_moe_bias(mg)[e] = bal == DT_MOE_BIAS ? 0.01f * (float)(e % 3) : 0;
    layer_t H = make(DT_CPU), G = make(DT_CUDA_DEVICE);
    snprintf(name, sizeof name, "moe_cuda_%s_step_runs", tag);
    int bad = step(mc, ac, H, micro, &sc) || step(mg, ag, G, micro, &sg);
    if (!dt_test_expect(name, !bad, "%s", dt_ctx_error(&ctx))) return;
    for (int i = 0; i < micro; i++) {
        snprintf(name, sizeof name, "moe_cuda_%s_y%d_equals_cpu", tag, i);
        close_all(name, G.y[i], H.y[i], 1e-6, 1e-5);
        snprintf(name, sizeof name, "moe_cuda_%s_dx%d_equals_cpu", tag, i);
        close_all(name, G.dx[i], H.dx[i], 1e-5, 1e-4);
    }
    snprintf(name, sizeof name, "moe_cuda_%s_router_grad_equals_cpu", tag);
    close_all(name, G.drt, H.drt, 1e-5, 1e-4);
    snprintf(name, sizeof name, "moe_cuda_%s_expert_grads_equal_cpu", tag);
    close_all(name, G.dw1, H.dw1, 1e-5, 1e-4);
    close_all(name, G.db1, H.db1, 1e-5, 1e-4);
    close_all(name, G.dw2, H.dw2, 1e-5, 1e-4);
    close_all(name, G.db2, H.db2, 1e-5, 1e-4);
    snprintf(name, sizeof name, "moe_cuda_%s_routing_stats_equal_cpu", tag);
    int same_load = 1;
    for (int e = 0; e < E; e++) same_load &= sg.load[e] == sc.load[e] && sg.kept[e] == sc.kept[e];
    dt_test_expect(name, fabs(sg.aux - sc.aux) <= 1e-6 * fabs(sc.aux) && sg.dropped == sc.dropped &&
                   sg.drop_print == sc.drop_print && sg.assigned == sc.assigned && same_load,
                   "aux %.12g / %.12g, dropped %lld / %lld, print %llx / %llx, load and kept %s", sg.aux, sc.aux,
                   (long long)sg.dropped, (long long)sc.dropped, (unsigned long long)sg.drop_print,
                   (unsigned long long)sc.drop_print, same_load ? "same" : "differs");
    if (capacity > 0) {
        snprintf(name, sizeof name, "moe_cuda_%s_drops_some", tag);
        dt_test_expect(name, sc.dropped > 0, "dropped %lld", (long long)sc.dropped);
    }
    snprintf(name, sizeof name, "moe_cuda_%s_bias_update_equals_cpu", tag);
    dt_test_expect(name, !memcmp(dt_moe_bias(mg), dt_moe_bias(mc), E * sizeof(float)), "the biases differ");
    /* a second step: the device's buffers were made by the first */
    {
        dt_ctx_counters_reset(&ctx);
        bad = step(mg, ag, G, micro, &sg);
        dt_cuda_counters c = ctx.counters;
        snprintf(name, sizeof name, "moe_cuda_%s_second_step_allocates_nothing_and_waits_once_per_forward", tag);
        dt_test_expect(name, !bad && c.allocs == 0 && c.frees == 0 && c.syncs <= micro,
                       "allocs %lld frees %lld syncs %lld (forwards %d)", (long long)c.allocs, (long long)c.frees,
                       (long long)c.syncs, micro);
    }
    drop(H);
    drop(G);
    for (int i = 0; i < micro; i++) { dt_moe_acts_free(ac[i]); dt_moe_acts_free(ag[i]); }
    dt_moe_free(mc);
    dt_moe_free(mg);
}

static void bad_inputs(dt_layout *l) {
    dt_moe_desc md;
    dt_moe *m = NULL;
    dt_moe_acts *a = NULL;
    memset(&md, 0, sizeof md);
    md.experts = E; md.width = CW; md.hidden = F; md.seq = T;
    if (dt_moe_create(l, &m, &md) || dt_moe_acts_create(m, &a)) return;
    layer_t G = make(DT_CUDA_DEVICE);
    dt_tensor hx = mk(DT_CPU, 2, N, CW, 0);
    dt_test_error("moe_cuda_mixed_devices_named",
                  dt_moe_fwd(m, a, &G.y[0], &hx, 0, &G.rt, &G.w1, &G.b1, &G.w2, &G.b2), dt_ctx_error(&ctx),
                  "y is on cuda; expected cpu");
    dt_tensor_free(&ctx, &hx);
    drop(G);
    dt_moe_acts_free(a);
    dt_moe_free(m);
}

/* The launchers called directly: a NULL array the host sizes say holds data faulted inside a
   kernel (a SEGV on the emulator), and a product past int64 wrapped to a small count and
   launched (N k C = 2^64 + 4 copied 4 rows and returned 0): refused before anything launches. */
static void launcher_refusals(void) {
    float *d = NULL;
    cudaMalloc((void **)&d, 1024 * sizeof(float));
    cudaMemset(d, 0, 1024 * sizeof(float));
    int *ix = (int *)d;
    int64_t *sl = (int64_t *)d;
    const int64_t big = ((int64_t)1 << 62) + 1; /* times 4: 2^64 + 4, which wrapped to 4 */
    k_refused("moe_route_NULL_probs_is_invalid_value", dt_k_moe_route(NULL, ix, d, NULL, 4, 4, 2, 0, NULL));
    k_refused("moe_route_NULL_gate_is_invalid_value", dt_k_moe_route(d, ix, NULL, NULL, 4, 4, 2, 0, NULL));
    k_refused("moe_capacity_NULL_idx_is_invalid_value", dt_k_moe_capacity(sl, sl, sl, NULL, 2, 2, 4, 2, 1, 0, NULL));
    k_refused("moe_capacity_NULL_used_is_invalid_value", dt_k_moe_capacity(sl, sl, NULL, ix, 2, 2, 4, 2, 1, 0, NULL));
    k_refused("moe_capacity_S_T_k_past_int64_is_invalid_value", dt_k_moe_capacity(sl, sl, sl, ix, big, 1, 4, 4, 1, 0, NULL));
    k_refused("moe_counts_NULL_stat_is_invalid_value", dt_k_moe_counts(NULL, ix, sl, d, 4, 4, 2, NULL));
    k_refused("moe_counts_NULL_probs_is_invalid_value", dt_k_moe_counts((double *)d, ix, sl, NULL, 4, 4, 2, NULL));
    k_refused("moe_slots_NULL_stat_is_invalid_value", dt_k_moe_slots(sl, ix, NULL, 4, 4, 2, NULL));
    k_refused("moe_pack_NULL_slot_is_invalid_value", dt_k_moe_pack(d, d, NULL, 4, 2, 4, NULL));
    k_refused("moe_pack_N_k_C_past_int64_is_invalid_value", dt_k_moe_pack(d, d, sl, big, 4, 1, NULL));
    k_refused("moe_permute_R_C_past_int64_is_invalid_value", dt_k_moe_permute(d, d, sl, big, 4, 1, NULL));
    k_refused("moe_permute_NULL_perm_is_invalid_value", dt_k_moe_permute(d, d, NULL, 4, 4, 1, NULL));
    k_refused("moe_combine_NULL_gate_is_invalid_value", dt_k_moe_combine(d, d, sl, NULL, 4, 2, 4, NULL));
    k_refused("moe_combine_N_k_past_int64_is_invalid_value", dt_k_moe_combine(d, d, sl, d, big, 4, 1, NULL));
    k_refused("moe_combine_bwd_NULL_dg_is_invalid_value", dt_k_moe_combine_bwd(d, NULL, d, d, sl, d, 4, 2, 4, NULL));
    k_refused("moe_combine_bwd_NULL_dy_is_invalid_value", dt_k_moe_combine_bwd(d, d, NULL, d, sl, d, 4, 2, 4, NULL));
    k_refused("moe_dispatch_bwd_NULL_dx_is_invalid_value", dt_k_moe_dispatch_bwd(NULL, d, sl, 4, 2, 4, NULL));
    k_refused("moe_router_bwd_NULL_auxd_is_invalid_value", dt_k_moe_router_bwd(d, d, ix, d, d, NULL, 4, 4, 2, 0, NULL));
    k_refused("moe_router_bwd_renorm_NULL_gate_is_invalid_value", dt_k_moe_router_bwd(d, d, ix, NULL, d, d, 4, 4, 2, 1, NULL));
    k_refused("moe_bias_rows_NULL_eoff_is_invalid_value", dt_k_moe_bias_rows(d, d, NULL, 2, 4, NULL));
    k_refused("moe_bias_rows_El_cols_past_int64_is_invalid_value", dt_k_moe_bias_rows(d, d, sl, 4, big, NULL));
    k_refused("moe_bias_grad_NULL_db_is_invalid_value", dt_k_moe_bias_grad(NULL, d, sl, 2, 4, 1.0f, NULL));
    /* what the launch does not read may stay NULL: no token, no router renorm's gate */
    DT_TEST_CHECK("moe_slots_N_0_with_NULL_is_ok", dt_k_moe_slots(NULL, NULL, NULL, 0, 4, 2, NULL) == 0);
    DT_TEST_CHECK("moe_route_N_0_with_NULL_is_ok", dt_k_moe_route(NULL, NULL, NULL, NULL, 0, 4, 2, 0, NULL) == 0);
    cudaFree(d);
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
    run_case(l, "cap1p25_aux", 1.25, 0, DT_MOE_AUX, 1);
    run_case(l, "dropless_bias_renorm", 0, 1, DT_MOE_BIAS, 1);
    /* micro-batches: the same kernels as the two above, orchestrated twice a step (not on the TSan
       run's small inputs, where it took 12 of k_moe's 22 s) */
    if (k_size(1, 0)) run_case(l, "cap1_aux_renorm_micro2", 1.0, 1, DT_MOE_AUX, 2);
    bad_inputs(l);
    launcher_refusals();
    dt_layout_free(l);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
