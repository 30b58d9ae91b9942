// np: 1 2 4
/* tests/mpi_parallel_layout.c - the process grid of dt_parallel.h: for every factorisation
   dp x tp x pp of the world, each rank's coordinates follow Megatron's order
   rank = tp + TP * (dp + DP * pp) (checked against the formula inverted by hand and against
   dt_layout_rank_of), each group (dp, tp, pp, dptp) holds exactly the world ranks that share the
   other coordinates, in order of the varying one (dt_comm_world_rank), and a sum over each group
   equals the sum of those world ranks computed here (the groups really communicate). Also: the
   picture of dt_layout_describe names every rank, the batch ranges of the dp ranks tile the
   global batch, and bad sizes are named errors. Ranks asking for different grids (dp x tp =
   W/2 x 2 beside dp = W), or one rank with a bad desc, fail on every rank, naming the first size
   that differs and the ranks; descs equal after the defaults pass. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;

/* Checks the groups of l; returns 1 when all are right, with the first problem in why. */
static int groups_ok(dt_layout *l, char *why, size_t n) {
    dt_comm *g[4];
    const char *gname[4] = {"dp", "tp", "pp", "dptp"};
    int k, i;
    g[0] = l->dp_comm; g[1] = l->tp_comm; g[2] = l->pp_comm; g[3] = l->dptp_comm;
    for (k = 0; k < 4; k++) {
        int want_size = k == 0 ? l->dp : k == 1 ? l->tp : k == 2 ? l->pp : l->dp * l->tp;
        int want_rank = k == 0 ? l->dp_rank : k == 1 ? l->tp_rank : k == 2 ? l->pp_rank : l->tp_rank + l->tp * l->dp_rank;
        double sum = l->rank, want_sum = 0;
        if (!g[k]) { snprintf(why, n, "%s_comm is NULL", gname[k]); return 0; }
        if (dt_comm_size(g[k]) != want_size || dt_comm_rank(g[k]) != want_rank) {
            snprintf(why, n, "%s_comm size %d rank %d, want %d %d", gname[k], dt_comm_size(g[k]), dt_comm_rank(g[k]),
                     want_size, want_rank);
            return 0;
        }
        if (strcmp(dt_comm_name(g[k]), gname[k]) != 0) {
            snprintf(why, n, "%s_comm is named \"%s\"", gname[k], dt_comm_name(g[k]));
            return 0;
        }
        for (i = 0; i < want_size; i++) {
            int wr = k == 0 ? dt_layout_rank_of(l, i, l->tp_rank, l->pp_rank)
                     : k == 1 ? dt_layout_rank_of(l, l->dp_rank, i, l->pp_rank)
                     : k == 2 ? dt_layout_rank_of(l, l->dp_rank, l->tp_rank, i)
                              : dt_layout_rank_of(l, i / l->tp, i % l->tp, l->pp_rank);
            /* the same, from the formula written out: rank = tp + TP * (dp + DP * pp) */
            int dp = k == 0 ? i : k == 3 ? i / l->tp : l->dp_rank;
            int tp = k == 1 ? i : k == 3 ? i % l->tp : l->tp_rank;
            int pp = k == 2 ? i : l->pp_rank;
            int formula = tp + l->tp * (dp + l->dp * pp);
            if (wr != formula || dt_comm_world_rank(g[k], i) != formula) {
                snprintf(why, n, "%s_comm rank %d is world rank %d, rank_of says %d, the formula %d", gname[k], i,
                         dt_comm_world_rank(g[k], i), wr, formula);
                return 0;
            }
            want_sum += formula;
        }
        if (dt_comm_allreduce_f64(g[k], &sum, 1, DT_REDUCE_SUM) != DT_OK || sum != want_sum) {
            snprintf(why, n, "sum of world ranks over %s_comm = %g, want %g (%.200s)", gname[k], sum, want_sum,
                     dt_ctx_error(&C));
            return 0;
        }
    }
    return 1;
}

/* Every rank must ask for the same grid: ranks asking dp x tp = W/2 x 2 beside ranks asking
   dp = W would split different groups and train diverging models. */
static void layouts_that_differ_between_ranks(dt_comm *world, int W, int R) {
    dt_layout *l = (dt_layout *)1;
    dt_layout_desc d;
    dt_status st;
    char want[128];
    if (W < 2 || W % 2) {
        if (R == 0) dt_test_skip("layout_differing_between_ranks_is_named_on_every_rank", "needs an even np >= 2");
        return;
    }
    memset(&d, 0, sizeof d);
    if (R < W / 2) { d.dp = W / 2; d.tp = 2; }
    else d.dp = W;
    st = dt_layout_create(world, &l, &d);
    snprintf(want, sizeof want, "desc.dp = %d on rank 0 but %d on rank %d", W / 2, W, W / 2);
    dt_test_check_all("layout_differing_between_ranks_is_named_on_every_rank", st == DT_ERR_ARG && l == NULL &&
                      strstr(dt_ctx_error(&C), want) != NULL, "status %d, message \"%.200s\", want \"%s\"", (int)st,
                      dt_ctx_error(&C), want);
    if (st == DT_OK) dt_layout_free(l);
    /* equal after the defaults: dp 0 = W / (tp x pp) */
    memset(&d, 0, sizeof d);
    if (R == 0) d.tp = 1;
    else d.dp = W;
    l = NULL;
    st = dt_layout_create(world, &l, &d);
    dt_test_check_all("layout_equal_after_defaults_passes_the_check", st == DT_OK && l && l->dp == W, "status %d: %.200s",
                      (int)st, dt_ctx_error(&C));
    dt_layout_free(l);
    /* a desc bad on one rank alone: that rank names it, the others point at it; nobody waits */
    memset(&d, 0, sizeof d);
    if (R == W - 1) d.tp = -2;
    l = (dt_layout *)1;
    st = dt_layout_create(world, &l, &d);
    dt_test_check_all("layout_bad_desc_on_one_rank_fails_on_every_rank", st == DT_ERR_ARG && l == NULL &&
                      strstr(dt_ctx_error(&C), R == W - 1 ? "desc.tp = -2" : "another rank") != NULL,
                      "status %d, message \"%.200s\"", (int)st, dt_ctx_error(&C));
}

int main(void) {
    dt_comm *world;
    dt_layout *l = NULL;
    dt_layout_desc d;
    dt_strbuf sb;
    char why[1024], buf[64];
    int W, R, dp, tp, pp, n_fact = 0, ok, all_ok;
    dt_status st;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);

    /* every factorisation of the world */
    all_ok = 1;
    why[0] = 0;
    for (tp = 1; tp <= W; tp++)
        for (pp = 1; pp <= W; pp++) {
            if (W % (tp * pp)) continue;
            dp = W / (tp * pp);
            memset(&d, 0, sizeof d);
            d.tp = tp;
            d.pp = pp;
            d.dp = (n_fact % 2) ? dp : 0; /* derived dp and explicit dp alike */
            n_fact++;
            st = dt_layout_create(world, &l, &d);
            ok = st == DT_OK;
            if (!ok) snprintf(why, sizeof why, "dp %d tp %d pp %d: %.300s", dp, tp, pp, dt_ctx_error(&C));
            if (ok && (l->dp != dp || l->tp != tp || l->pp != pp || l->size != W || l->rank != R)) {
                snprintf(why, sizeof why, "sizes %d %d %d, want %d %d %d", l->dp, l->tp, l->pp, dp, tp, pp);
                ok = 0;
            }
            /* coordinates: the inverse of rank = tp + TP * (dp + DP * pp) */
            if (ok && (l->tp_rank != R % tp || l->dp_rank != (R / tp) % dp || l->pp_rank != R / (tp * dp) ||
                       dt_layout_rank_of(l, l->dp_rank, l->tp_rank, l->pp_rank) != R)) {
                snprintf(why, sizeof why, "dp %d tp %d pp %d: rank %d at (dp %d, tp %d, pp %d)", dp, tp, pp, R,
                         l->dp_rank, l->tp_rank, l->pp_rank);
                ok = 0;
            }
            if (ok && (dt_layout_rank_of(l, dp, 0, 0) != -1 || dt_layout_rank_of(l, 0, -1, 0) != -1 ||
                       dt_layout_rank_of(l, 0, 0, pp) != -1)) {
                snprintf(why, sizeof why, "rank_of out of range is not -1");
                ok = 0;
            }
            if (ok) {
                char why2[600];
                if (!groups_ok(l, why2, sizeof why2)) {
                    snprintf(why, sizeof why, "dp %d tp %d pp %d: %.600s", dp, tp, pp, why2);
                    ok = 0;
                }
            }
            if (ok) {
                char want[64];
                snprintf(want, sizeof want, "dp=%d,tp=%d,pp=%d", dp, tp, pp);
                if (strcmp(dt_layout_string(l, buf, sizeof buf), want) != 0) {
                    snprintf(why, sizeof why, "layout string \"%s\", want \"%s\"", buf, want);
                    ok = 0;
                }
            }
            if (ok) { /* the picture: a table line per rank and a grid per stage */
                int r;
                memset(&sb, 0, sizeof sb);
                sb.ctx = &C;
                st = dt_layout_describe(l, &sb);
                if (st) { snprintf(why, sizeof why, "describe: %.200s", dt_ctx_error(&C)); ok = 0; }
                for (r = 0; ok && r < W; r++) {
                    char line[64];
                    snprintf(line, sizeof line, "\n  %4d  ", r);
                    if (!strstr(sb.text, line)) { snprintf(why, sizeof why, "describe has no line for rank %d", r); ok = 0; }
                }
                for (r = 0; ok && r < pp; r++) {
                    char line[64];
                    snprintf(line, sizeof line, "stage pp=%d", r);
                    if (!strstr(sb.text, line)) { snprintf(why, sizeof why, "describe has no grid of stage %d", r); ok = 0; }
                }
                if (ok && R == 0 && tp == 2 && pp == 1 && W == 4) printf("%s", sb.text); /* one picture in the log */
                dt_strbuf_free(&sb);
            }
            if (ok) { /* the dp ranks' batch ranges tile [0, 12 * dp) in dp order */
                int64_t first = -1, count = -1;
                st = dt_layout_batch_range(l, 12 * (int64_t)dp, &first, &count);
                if (st || first != 12 * (int64_t)l->dp_rank || count != 12) {
                    snprintf(why, sizeof why, "batch_range: first %lld count %lld, want %d 12 (%.200s)", (long long)first,
                             (long long)count, 12 * l->dp_rank, st ? dt_ctx_error(&C) : "ok");
                    ok = 0;
                }
            }
            dt_layout_free(l);
            l = NULL;
            if (!ok) all_ok = 0;
        }
    {
        char name[64];
        snprintf(name, sizeof name, "layout_coordinates_and_groups_of_all_%d_factorisations", n_fact);
        dt_test_check_all(name, all_ok, "%s", why);
    }

    /* the default desc (NULL): all data parallel */
    st = dt_layout_create(world, &l, NULL);
    dt_test_check_all("layout_null_desc_is_all_dp", st == DT_OK && l->dp == W && l->tp == 1 && l->pp == 1 &&
                      l->dp_rank == R, "%s", dt_ctx_error(&C));
    if (l) {
        int64_t a, b;
        st = dt_layout_batch_range(l, 4 * (int64_t)W + 1, &a, &b);
        if (R == 0 && W > 1) dt_test_error("batch_not_divisible_by_dp_is_named", st, dt_ctx_error(&C), "divisible by dp");
        if (R == 0 && W == 1) dt_test_skip("batch_not_divisible_by_dp_is_named", "every batch divides dp = 1");
        st = dt_layout_batch_range(l, -4, &a, &b);
        if (R == 0) dt_test_error("negative_batch_is_named", st, dt_ctx_error(&C), "global_batch = -4");
        st = dt_layout_batch_range(l, 4, NULL, &b);
        if (R == 0) dt_test_error("batch_range_null_first_is_named", st, dt_ctx_error(&C), "first is NULL");
        if (R == 0) DT_TEST_CHECK("rank_of_null_is_minus_one", dt_layout_rank_of(NULL, 0, 0, 0) == -1);
        dt_layout_free(l);
        l = NULL;
    }

    layouts_that_differ_between_ranks(world, W, R);

    /* bad sizes: named on every rank, nothing made */
    memset(&d, 0, sizeof d);
    d.dp = W + 1;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) {
        char want[64];
        snprintf(want, sizeof want, "world size %d", W);
        dt_test_error("dp_not_matching_world_is_named", st, dt_ctx_error(&C), want);
        dt_test_error("dp_not_matching_world_names_dp", st, dt_ctx_error(&C), "dp x tp x pp");
        DT_TEST_CHECK("failed_create_leaves_out_null", l == NULL);
    }
    memset(&d, 0, sizeof d);
    d.tp = 3;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) dt_test_error("tp_not_dividing_world_is_named", st, dt_ctx_error(&C), "tp x pp = 3 x 1");
    memset(&d, 0, sizeof d);
    d.tp = -2;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) dt_test_error("negative_tp_is_named", st, dt_ctx_error(&C), "desc.tp = -2");
    memset(&d, 0, sizeof d);
    d.pp = 2 * W;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) dt_test_error("pp_larger_than_world_is_named", st, dt_ctx_error(&C), "does not divide");
    st = dt_layout_create(world, NULL, NULL);
    if (R == 0) dt_test_error("null_out_is_named", st, dt_ctx_error(&C), "out is NULL");
    if (R == 0) DT_TEST_CHECK("null_world_is_arg_error", dt_layout_create(NULL, &l, NULL) == DT_ERR_ARG);
    dt_layout_free(NULL); /* a no-op */
    {
        char small[4];
        if (R == 0) DT_TEST_CHECK("layout_string_null_layout", strcmp(dt_layout_string(NULL, buf, sizeof buf), "(null)") == 0);
        dt_layout_create(world, &l, NULL);
        if (R == 0) DT_TEST_CHECK("layout_string_truncates", strlen(dt_layout_string(l, small, sizeof small)) == 3);
        dt_layout_free(l);
    }
    {
        int rc = dt_test_finish();
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
