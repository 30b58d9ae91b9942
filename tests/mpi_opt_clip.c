// np: 1 2 4
/* tests/mpi_opt_clip.c - the global gradient norm across ranks counts every parameter once:
   a replicated parameter once, slices of a parameter sharded over the world (dim 0 and dim 1)
   summed over the world, a parameter sharded over a sub-group (per-parameter comm) summed over
   that group only, disjoint per-rank parameters (pipeline stages) summed over stage_comm. Each
   equals the norm of the whole tensors on one rank. Also: the loss scaler's overflow decision is
   agreed by every rank (an inf on the last rank only skips the step everywhere). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"

static dt_ctx C;
static int R, W;

/* The gradient of element k of logical tensor `which`: the same on every layout. */
static float g_of(int which, int64_t k) { return (float)(0.5 * sin(0.37 * (double)k + 1.1 * which) + 0.02 * which); }

/* Adds a parameter whose slice is [start, start + shape) of global, grads from g_of. */
static dt_param *add(dt_params *ps, const char *name, int which, int nd, const int64_t *global, const int64_t *start,
                     const int64_t *shape) {
    dt_param_desc d;
    dt_param *p = NULL;
    int64_t i, r, c;
    memset(&d, 0, sizeof d);
    d.name = name;
    for (i = 0; i < nd; i++) { d.global_shape[i] = global[i]; d.start[i] = start[i]; d.shape[i] = shape[i]; }
    if (dt_params_add(&C, ps, &p, &d)) { fprintf(stderr, "add: %s\n", dt_ctx_error(&C)); exit(2); }
    if (nd == 1) {
        for (i = 0; i < shape[0]; i++) ((float *)p->grad.data)[i] = g_of(which, start[0] + i);
    } else {
        for (r = 0; r < shape[0]; r++)
            for (c = 0; c < shape[1]; c++)
                ((float *)p->grad.data)[r * shape[1] + c] = g_of(which, (start[0] + r) * global[1] + start[1] + c);
    }
    return p;
}

/* sum over a whole logical tensor of g^2, as one rank holding it all would compute it */
static double sumsq(int which, int64_t n) {
    double s = 0;
    int64_t k;
    for (k = 0; k < n; k++) s += (double)g_of(which, k) * (double)g_of(which, k);
    return s;
}

int main(void) {
    dt_comm *world, *tp = NULL;
    dt_params ps, stage;
    dt_param *pa, *pb, *pr, *pt;
    dt_grad_norm_desc nd;
    dt_comm *comms[4];
    double norm = -1, want, want_stage;
    int64_t gA[2] = {8, 3}, sA[2], cA[2], gB[2] = {3, 8}, sB[2], cB[2], gR[1] = {5}, z[2] = {0, 0};
    int64_t gT[1] = {6}, sT[1], cT[1], gS[1] = {4}, sS[1] = {0};
    int tp_size, tp_rank, i, okc;
    char name[32];
    float want_g;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    /* tensor-parallel pairs: ranks {0,1}, {2,3} (size 1 when W = 1) */
    dt_comm_split(world, &tp, R / 2, R);
    tp_size = dt_comm_size(tp);
    tp_rank = dt_comm_rank(tp);

    memset(&ps, 0, sizeof ps);
    sA[0] = R * (8 / W); sA[1] = 0; cA[0] = 8 / W; cA[1] = 3;          /* rows of A */
    sB[0] = 0; sB[1] = R * (8 / W); cB[0] = 3; cB[1] = 8 / W;          /* columns of B */
    sT[0] = tp_rank * (6 / tp_size); cT[0] = 6 / tp_size;              /* T split over the pair */
    pa = add(&ps, "A", 1, 2, gA, sA, cA);
    pb = add(&ps, "B", 2, 2, gB, sB, cB);
    pr = add(&ps, "R", 3, 1, gR, z, gR);
    pt = add(&ps, "T", 4, 1, gT, sT, cT);
    (void)pr;
    want = sqrt(sumsq(1, 24) + sumsq(2, 24) + sumsq(3, 5) + sumsq(4, 6));

    memset(&nd, 0, sizeof nd);
    nd.shard_comm = world;
    comms[0] = comms[1] = comms[2] = NULL;
    comms[3] = tp;
    nd.param_comms = comms;
    dt_grad_norm(&C, &norm, &ps, &nd);
    okc = fabs(norm - want) <= 1e-12 * want;
    dt_test_check_all("norm_counts_replicated_once_and_sums_shards", okc, "got %.17g want %.17g", norm, want);

    /* clipping to a quarter of the norm scales every slice by the same coefficient */
    dt_clip_grad_norm(&C, &ps, &norm, want / 4, &nd);
    want_g = g_of(1, sA[0] * 3 + 2) * (float)((want / 4) / (want + 1e-6));
    okc = fabsf(((float *)pa->grad.data)[2] - want_g) <= 1e-6f * fabsf(want_g) + 1e-7f;
    dt_test_check_all("clip_scales_every_shard_alike", okc, "got %.9g want %.9g", ((float *)pa->grad.data)[2], want_g);
    dt_grad_norm(&C, &norm, &ps, &nd);
    dt_test_check_all("clipped_norm_is_max_norm", fabs(norm - want / 4) <= 1e-6 * want, "got %.9g want %.9g", norm,
                      want / 4);

    /* the optimizer reports the same global norm (grads restored first) */
    {
        dt_optimizer *o = NULL;
        dt_opt_desc d;
        dt_opt_step_info info;
        dt_params_free(&C, &ps);
        memset(&ps, 0, sizeof ps);
        pa = add(&ps, "A", 1, 2, gA, sA, cA);
        pb = add(&ps, "B", 2, 2, gB, sB, cB);
        pr = add(&ps, "R", 3, 1, gR, z, gR);
        pt = add(&ps, "T", 4, 1, gT, sT, cT);
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_SGD; d.lr = 0.1; d.clip_norm = 1e9;
        d.comm = world;
        d.norm = nd;
        if (dt_opt_create(&C, &o, &ps, &d)) fprintf(stderr, "%s\n", dt_ctx_error(&C));
        dt_opt_step(o, &info);
        dt_test_check_all("opt_step_norm_equals_single_rank_norm", fabs(info.grad_norm - want) <= 1e-12 * want,
                          "got %.17g want %.17g", info.grad_norm, want);
        dt_opt_free(o);
    }
    (void)pb; (void)pt;

    /* pipeline stages: each rank its own parameter, totals summed over stage_comm */
    memset(&stage, 0, sizeof stage);
    snprintf(name, sizeof name, "stage%d", R);
    add(&stage, name, 10 + R, 1, gS, sS, gS);
    want_stage = 0;
    for (i = 0; i < W; i++) want_stage += sumsq(10 + i, 4);
    want_stage = sqrt(want_stage);
    memset(&nd, 0, sizeof nd);
    nd.stage_comm = world;
    dt_grad_norm(&C, &norm, &stage, &nd);
    dt_test_check_all("stage_norm_sums_disjoint_params", fabs(norm - want_stage) <= 1e-12 * want_stage,
                      "got %.17g want %.17g", norm, want_stage);
    dt_params_free(&C, &stage);

    /* overflow on the last rank only: every rank skips, backs off, keeps its weights */
    {
        dt_params sp;
        dt_param *p;
        dt_optimizer *o = NULL;
        dt_opt_desc d;
        dt_opt_step_info info;
        float before;
        memset(&sp, 0, sizeof sp);
        p = add(&sp, "w", 5, 1, gS, sS, gS);
        memset(&d, 0, sizeof d);
        d.kind = DT_OPT_ADAMW;
        d.loss_scale.mode = DT_LOSS_SCALE_DYNAMIC;
        d.comm = world;
        dt_opt_create(&C, &o, &sp, &d);
        if (R == W - 1) ((float *)p->grad.data)[1] = INFINITY;
        before = ((float *)p->value.data)[0];
        dt_opt_step(o, &info);
        dt_test_check_all("overflow_on_one_rank_skips_on_all", info.skipped == 1 && o->scaler.scale == 32768 &&
                                                                   ((float *)p->value.data)[0] == before,
                          "skipped %d scale %g", info.skipped, o->scaler.scale);
        ((float *)p->grad.data)[1] = 1.0f;
        dt_opt_step(o, &info);
        dt_test_check_all("clean_step_after_overflow_updates", info.skipped == 0 && o->step == 1, "skipped %d step %lld",
                          info.skipped, (long long)o->step);
        dt_opt_free(o);
        dt_params_free(&C, &sp);
    }

    dt_params_free(&C, &ps);
    dt_comm_free(tp);
    {
        int rc = dt_test_finish();
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
