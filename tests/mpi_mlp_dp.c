// np: 1 2 3 4
/* tests/mpi_mlp_dp.c - examples/mlp trained data parallel on every rank of the world equals
   the same training on one rank: per-step losses and final weights within fp32 reassociation
   tolerance (each rank's GEMMs sum fewer rows, the bucketer averages in rank order). The
   1-rank reference runs on each rank in a group of its own. Also: a data-parallel run is
   bitwise repeatable, and the model learns. */
#define MLP_NO_MAIN
#include "../examples/mlp/mlp.c"
#include "dt_test.h"

enum { STEPS = 200 };

int main(void) {
    dt_ctx ctx_storage, *ctx = &ctx_storage;
    dt_comm *world = NULL, *alone = NULL;
    dt_params dp, dp2, one;
    model m_dp, m_dp2, m_one;
    opts o = {STEPS, 60, 32, 7, 0.2f, NULL, 1};
    float l_dp[STEPS], l_dp2[STEPS], l_one[STEPS], e_dp, e_dp2, e_one;
    double worst = 0;
    int i, at = 0, ok, rank;
    dt_ctx_init(ctx, NULL);
    CHECK(dt_comm_create_world(ctx, &world, NULL));
    rank = dt_comm_rank(world);
    CHECK(dt_comm_split(world, &alone, rank, 0)); /* a group of one: the single-process run */
    memset(&dp, 0, sizeof dp);
    memset(&dp2, 0, sizeof dp2);
    memset(&one, 0, sizeof one);
    e_dp = train(ctx, world, &o, &dp, &m_dp, l_dp);
    e_dp2 = train(ctx, world, &o, &dp2, &m_dp2, l_dp2);
    e_one = train(ctx, alone, &o, &one, &m_one, l_one);

    for (i = 0; i < STEPS; i++) {
        double d = fabs((double)l_dp[i] - l_one[i]) / (fabs((double)l_one[i]) + 1e-6);
        if (d > worst) { worst = d; at = i; }
    }
    dt_test_check_all("mlp_dp_losses_equal_single_rank", worst <= 1e-4,
                      "step %d: loss %.9g on the world, %.9g on one rank (rel diff %.3g > 1e-4)", at + 1,
                      (double)l_dp[at], (double)l_one[at], worst);
    for (ok = 1, i = 0; i < dp.count && ok; i++) {
        const dt_tensor *g = &dp.items[i]->value, *w = &one.items[i]->value;
        int64_t k;
        for (k = 0; k < g->numel && ok; k++) {
            float a = ((const float *)g->data)[k], b = ((const float *)w->data)[k];
            ok = fabs((double)a - b) <= 1e-5 + 1e-4 * fabs((double)b);
            if (!ok)
                dt_test_check_all("mlp_dp_weights_equal_single_rank", 0, "%s[%lld]: %.9g on the world, %.9g on one rank",
                                  dp.items[i]->name, (long long)k, (double)a, (double)b);
        }
    }
    if (ok) dt_test_check_all("mlp_dp_weights_equal_single_rank", 1, "%s", "");
    dt_test_check_all("mlp_dp_eval_loss_equals_single_rank", fabs((double)e_dp - e_one) <= 1e-4 * fabs((double)e_one),
                      "eval loss %.9g on the world, %.9g on one rank", (double)e_dp, (double)e_one);
    ok = memcmp(l_dp, l_dp2, sizeof l_dp) == 0 && e_dp == e_dp2;
    for (i = 0; i < dp.count && ok; i++)
        ok = memcmp(dp.items[i]->value.data, dp2.items[i]->value.data, dt_tensor_bytes(&dp.items[i]->value)) == 0;
    dt_test_check_all("mlp_dp_run_is_bitwise_repeatable", ok, "eval loss %.9g then %.9g", (double)e_dp, (double)e_dp2);
    dt_test_check_all("mlp_learns", l_dp[STEPS - 1] < 0.7f * l_dp[0], "loss %.4f at step 1, %.4f at step %d",
                      (double)l_dp[0], (double)l_dp[STEPS - 1], STEPS);

    dt_params_free(ctx, &dp);
    dt_params_free(ctx, &dp2);
    dt_params_free(ctx, &one);
    i = dt_test_finish();
    dt_comm_free(alone);
    dt_comm_free(world);
    dt_ctx_shutdown(ctx);
    return i;
}
