// np: 1 2 4
/* tests/mpi_opt_accum.c - gradient accumulation with the data-parallel bucketer: W ranks each
   run 4/W micro-batches of 8 samples (the global batch is 32), the bucketer syncs only on the
   last micro-step (dt_opt_micro_begin switches it) and averages over the ranks. The grads and
   the updated weights equal one single-process step on the batch of 32 (within 1e-6). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"
#include "opt/mlp.h"

static dt_ctx C;

int main(void) {
    dt_comm *world;
    dt_bucketer *b = NULL;
    mlp big, dp;
    dt_optimizer *ob = NULL, *od = NULL;
    dt_opt_desc d;
    float gb[MLP_NPARAM], gd[MLP_NPARAM], vb[MLP_NPARAM], vd[MLP_NPARAM], seed = 0, maxg = 0;
    int R, W, M, micro, i, k, ok;
    dt_status st = DT_OK;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    M = 4 / W; /* micro-steps per rank: 4 x 8 samples over the world */

    mlp_init(&big, &C, DT_F32, 21);
    mlp_init(&dp, &C, DT_F32, 21);
    memset(&d, 0, sizeof d);
    d.kind = DT_OPT_ADAMW; d.lr = 0.01;
    dt_opt_create(&C, &ob, &big.ps, &d);
    d.accum_steps = M;
    d.comm = world;
    dt_opt_create(&C, &od, &dp.ps, &d);
    dt_bucketer_create(world, &b, &dp.ps, NULL);

    mlp_run(&big, 7, 0, 32, 1.0f); /* the reference: one batch of 32 on this process */
    for (micro = 0; micro < M && !st; micro++) {
        int64_t first = 8 * (R * M + micro); /* rank R's samples: [8RM, 8RM + 8M) */
        st = dt_opt_micro_begin(od, &seed, b, micro);
        mlp_run(&dp, 7, first, 8, seed);
        for (k = dp.ps.count - 1; k >= 0 && !st; k--) st = dt_bucketer_mark_ready(b, dp.ps.items[k]);
    }
    if (!st) st = dt_bucketer_finish(b);
    dt_test_check_all("accum_with_bucketer_runs", st == DT_OK, "%s", dt_ctx_error(&C));
    mlp_flat(&big, gb, 0);
    mlp_flat(&dp, gd, 0);
    for (i = 0; i < MLP_NPARAM; i++) maxg = fabsf(gb[i]) > maxg ? fabsf(gb[i]) : maxg;
    for (i = 0, ok = 1; i < MLP_NPARAM; i++)
        if (fabsf(gd[i] - gb[i]) > 1e-6f * maxg + 1e-6f * fabsf(gb[i])) ok = 0;
    dt_test_check_all("accum_micro_steps_over_ranks_equal_batch_32_grads", ok, "first grads %.9g vs %.9g", gd[0], gb[0]);
    dt_opt_step(ob, NULL);
    dt_opt_step(od, NULL);
    mlp_flat(&big, vb, 1);
    mlp_flat(&dp, vd, 1);
    for (i = 0, ok = 1; i < MLP_NPARAM; i++)
        if (fabsf(vd[i] - vb[i]) > 1e-6f * fabsf(vb[i]) + 1e-7f) ok = 0;
    dt_test_check_all("accum_step_over_ranks_equals_batch_32_step", ok, "first weights %.9g vs %.9g", vd[0], vb[0]);

    dt_bucketer_free(b);
    dt_opt_free(ob);
    dt_opt_free(od);
    dt_params_free(&C, &big.ps);
    dt_params_free(&C, &dp.ps);
    {
        int rc = dt_test_finish();
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
