// np: 1 2 4
/* tests/mpi_parallel_layout.c - the process grid of dt_parallel.h: for every factorisation
   dp x cp x tp x pp of the world, each rank's coordinates follow Megatron's order
   rank = tp + TP * (cp + CP * (dp + DP * pp)) (checked against the formula inverted by hand and
   against dt_layout_rank_at and, at cp 1, dt_layout_rank_of and the order of before cp,
   tp + TP * (dp + DP * pp)), each group (dp, tp, pp, cp, dpcp, dptp) holds exactly the world
   ranks that share the other coordinates, in order of the varying ones (dt_comm_world_rank; dpcp
   by cp + CP * dp, dptp by tp + TP * (cp + CP * dp)), and a sum over each group equals the sum of
   those world ranks computed here (the groups really communicate). Also: the picture of
   dt_layout_describe has every rank's line with its coordinates and the formula with cp, the
   layout string names cp only when cp > 1, the batch ranges of the dp ranks tile the global
   batch (cp ranks of a dp rank read the same samples), and bad sizes are named errors (a negative
   cp, a cp that does not divide the world). Ranks asking for different grids (dp x tp = W/2 x 2
   beside dp = W; cp 2 beside tp 2), or one rank with a bad desc, fail on every rank, naming the
   first size that differs and the ranks; descs equal after the defaults pass. On Linux, with more
   ranks than CPUs, describe says how many ranks are not bound to a CPU (counted here with
   sched_getaffinity against sysconf's online CPUs), and says nothing of it with enough CPUs;
   dt_comm_cpus gives the counts sysconf and sched_getaffinity give. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_getaffinity: the binding read another way than dt's /proc lists */
#endif
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;

#ifdef __linux__
#include <sched.h>
#include <unistd.h>
/* describe's note on a host with more ranks than CPUs (this test runs on one host): the number of
   ranks not bound to one CPU, each rank's affinity read with sched_getaffinity */
static void oversubscription_noted(dt_comm *world, int W, int R) {
    int on = -1, al = -1;
    cpu_set_t set;
    double loose, online = (double)sysconf(_SC_NPROCESSORS_ONLN);
    dt_layout *l = NULL;
    dt_strbuf sb;
    char want[160];
    int ok;
    CPU_ZERO(&set);
    loose = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= online && online > 1;
    dt_comm_allreduce_f64(world, &loose, 1, DT_REDUCE_SUM);
    if (dt_layout_create(world, &l, NULL)) {
        dt_test_check_all("describe_notes_ranks_over_cpus", 0, "layout: %s", dt_ctx_error(&C));
        return;
    }
    memset(&sb, 0, sizeof sb);
    sb.ctx = &C;
    ok = dt_layout_describe(l, &sb) == DT_OK && sb.text;
    if (W <= online) { /* enough CPUs: no note */
        ok = ok && !strstr(sb.text, " CPUs");
        snprintf(want, sizeof want, "no note of ranks on CPUs (%d ranks, %.0f CPUs)", W, online);
    } else if (loose > 0) {
        snprintf(want, sizeof want, "%.0f of the %d ranks on hosts with more ranks than CPUs (up to %d on %.0f CPUs) are "
                 "not bound", loose, W, W, online);
        ok = ok && strstr(sb.text, want) && strstr(sb.text, "--bind-to core:overload-allowed");
    } else {
        snprintf(want, sizeof want, "%d ranks on hosts with more ranks than CPUs (up to %d on %.0f CPUs), each bound "
                 "to one", W, W, online);
        ok = ok && strstr(sb.text, want);
    }
    if (R == 0 && W > online) printf("%s", sb.text);
    dt_comm_cpus(&on, &al); /* the same counts another way: sysconf's CPUs, sched_getaffinity's */
    { /* a rank without a buffer is named; the others take part as usual (none is left waiting) and
         get the note describe printed */
        char buf[512];
        int good;
        dt_status st = dt_comm_cpu_note(world, R == 0 ? NULL : buf, R == 0 ? 0 : sizeof buf);
        if (R == 0) {
            dt_test_error("cpu_note_without_a_buffer_is_named", st, dt_ctx_error(&C), "out is NULL and n = 0");
            good = 1;
        } else
            good = st == DT_OK && sb.text && (buf[0] ? strstr(sb.text, buf) != NULL : !strstr(sb.text, " CPUs"));
        dt_test_check_all("cpu_note_beside_a_bad_rank_matches_describe", good, "rank %d: status %d, note \"%.300s\"", R,
                          (int)st, R == 0 ? "" : buf);
    }
    dt_test_check_all("comm_cpus_match_sysconf_and_affinity", on == (int)online && al == CPU_COUNT(&set),
                      "dt_comm_cpus: online %d allowed %d; sysconf %.0f, sched_getaffinity %d", on, al, online,
                      CPU_COUNT(&set));
    dt_test_check_all("describe_notes_ranks_over_cpus", ok, "want \"%s\" in:\n%s", want, sb.text ? sb.text : "(none)");
    dt_strbuf_free(&sb);
    dt_layout_free(l);
}
#endif

/* The coordinates (dp, cp, tp, pp) of member i of group k of l: the group's own varying
   coordinates from i, the others this rank's. */
enum { G_DP, G_TP, G_PP, G_CP, G_DPCP, G_DPTP, G_N };
static void member(const dt_layout *l, int k, int i, int c[4]) {
    c[0] = l->dp_rank; c[1] = l->cp_rank; c[2] = l->tp_rank; c[3] = l->pp_rank;
    switch (k) {
    case G_DP: c[0] = i; break;
    case G_TP: c[2] = i; break;
    case G_PP: c[3] = i; break;
    case G_CP: c[1] = i; break;
    case G_DPCP: c[1] = i % l->cp; c[0] = i / l->cp; break;                        /* i = cp + CP * dp */
    default: c[2] = i % l->tp; c[1] = (i / l->tp) % l->cp; c[0] = i / (l->tp * l->cp); /* tp + TP * (cp + CP * dp) */
    }
}

/* Checks the groups of l; returns 1 when all are right, with the first problem in why. */
static int groups_ok(dt_layout *l, char *why, size_t n) {
    dt_comm *g[G_N];
    const char *gname[G_N] = {"dp", "tp", "pp", "cp", "dpcp", "dptp"};
    int k, i;
    g[G_DP] = l->dp_comm; g[G_TP] = l->tp_comm; g[G_PP] = l->pp_comm; g[G_CP] = l->cp_comm;
    g[G_DPCP] = l->dpcp_comm; g[G_DPTP] = l->dptp_comm;
    for (k = 0; k < G_N; k++) {
        int want_size = k == G_DP ? l->dp : k == G_TP ? l->tp : k == G_PP ? l->pp : k == G_CP ? l->cp
                        : k == G_DPCP ? l->dp * l->cp : l->dp * l->cp * l->tp;
        int want_rank = k == G_DP ? l->dp_rank : k == G_TP ? l->tp_rank : k == G_PP ? l->pp_rank
                        : k == G_CP ? l->cp_rank : k == G_DPCP ? l->cp_rank + l->cp * l->dp_rank
                        : l->tp_rank + l->tp * (l->cp_rank + l->cp * l->dp_rank);
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
            int c[4], wr, formula;
            member(l, k, i, c);
            wr = dt_layout_rank_at(l, c[0], c[1], c[2], c[3]);
            /* the same, from the formula written out: rank = tp + TP * (cp + CP * (dp + DP * pp)) */
            formula = c[2] + l->tp * (c[1] + l->cp * (c[0] + l->dp * c[3]));
            if (wr != formula || dt_comm_world_rank(g[k], i) != formula ||
                (c[1] == 0 && dt_layout_rank_of(l, c[0], c[2], c[3]) != formula)) {
                snprintf(why, n, "%s_comm rank %d is world rank %d, rank_at says %d, rank_of %d, the formula %d",
                         gname[k], i, dt_comm_world_rank(g[k], i), wr, dt_layout_rank_of(l, c[0], c[2], c[3]), formula);
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
    /* no two fields share a comm: dt_layout_free frees each once */
    for (k = 0; k < G_N; k++)
        for (i = k + 1; i < G_N; i++)
            if (g[k] == g[i]) {
                snprintf(why, n, "%s_comm and %s_comm are the same comm", gname[k], gname[i]);
                return 0;
            }
    return 1;
}

/* The picture of dt_layout_describe: this rank's line of the table carries its coordinates,
   the formula line names tp, cp and dp, and each stage has its grid. */
static int describe_ok(dt_layout *l, const char *text, char *why, size_t n) {
    char line[128], coords[64];
    const char *at, *end;
    int r;
    if (l->cp > 1) snprintf(line, sizeof line, "(rank = tp + %d * (cp + %d * (dp + %d * pp)))", l->tp, l->cp, l->dp);
    else snprintf(line, sizeof line, "(rank = tp + %d * (dp + %d * pp))", l->tp, l->dp); /* cp 1: as before cp */
    if (!strstr(text, line)) { snprintf(why, n, "describe has no \"%s\"", line); return 0; }
    if (!strstr(text, "  rank  host                  dp  cp  tp  pp\n")) {
        snprintf(why, n, "describe has no header with a cp column");
        return 0;
    }
    for (r = 0; r < l->size; r++) {
        snprintf(line, sizeof line, "\n  %4d  ", r);
        if (!strstr(text, line)) { snprintf(why, n, "describe has no line for rank %d", r); return 0; }
    }
    snprintf(line, sizeof line, "\n  %4d  ", l->rank);
    at = strstr(text, line) + 1;
    end = strchr(at, '\n');
    snprintf(coords, sizeof coords, " %3d %3d %3d %3d", l->dp_rank, l->cp_rank, l->tp_rank, l->pp_rank);
    if (!end || (size_t)(end - at) < strlen(coords) || strncmp(end - strlen(coords), coords, strlen(coords)) != 0) {
        snprintf(why, n, "describe's line of rank %d is \"%.*s\", want it to end in \"%s\" (dp cp tp pp)", l->rank,
                 end ? (int)(end - at) : 40, at, coords);
        return 0;
    }
    for (r = 0; r < l->pp; r++) {
        snprintf(line, sizeof line, "stage pp=%d: world rank at (%s row", r, l->cp > 1 ? "dp cp" : "dp");
        if (!strstr(text, line)) { snprintf(why, n, "describe has no \"%s\"", line); return 0; }
    }
    /* this rank's row of its stage's grid: the (dp, cp) label, then the ranks of its tp group */
    if (l->cp > 1) snprintf(line, sizeof line, "\n   dp%-3d cp%-3d", l->dp_rank, l->cp_rank);
    else snprintf(line, sizeof line, "\n   dp%-3d", l->dp_rank);
    for (r = 0; r < l->tp; r++)
        snprintf(line + strlen(line), sizeof line - strlen(line), " %5d",
                 r + l->tp * (l->cp_rank + l->cp * (l->dp_rank + l->dp * l->pp_rank)));
    strcat(line, "\n");
    if (!strstr(text, line)) { snprintf(why, n, "describe has no grid row \"%s\"", line + 1); return 0; }
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
    /* cp 2 beside tp 2: the same dp, the first size that differs is cp */
    memset(&d, 0, sizeof d);
    if (R < W / 2) d.cp = 2;
    else d.tp = 2;
    l = (dt_layout *)1;
    st = dt_layout_create(world, &l, &d);
    snprintf(want, sizeof want, "desc.cp = 2 on rank 0 but 1 on rank %d", W / 2);
    dt_test_check_all("layout_cp_differing_between_ranks_is_named_on_every_rank", st == DT_ERR_ARG && l == NULL &&
                      strstr(dt_ctx_error(&C), want) != NULL, "status %d, message \"%.200s\", want \"%s\"", (int)st,
                      dt_ctx_error(&C), want);
    if (st == DT_OK) dt_layout_free(l);
    /* cp 0 and cp 1 are the same layout */
    memset(&d, 0, sizeof d);
    if (R % 2) d.cp = 1;
    l = NULL;
    st = dt_layout_create(world, &l, &d);
    dt_test_check_all("layout_cp_0_and_cp_1_are_the_same", st == DT_OK && l && l->cp == 1 && l->cp_rank == 0 &&
                      l->dpcp == W && l->dpcp_rank == R, "status %d: %.200s", (int)st, dt_ctx_error(&C));
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

/* One layout dp x cp x tp x pp: sizes, coordinates, groups, string, picture, batch range.
   Returns 1 when all are right, with the first problem in why. Collective over world. */
static int factorisation_ok(dt_comm *world, int dp, int cp, int tp, int pp, int explicit_dp, int explicit_cp,
                            char *why, size_t n) {
    dt_layout *l = NULL;
    dt_layout_desc d;
    dt_strbuf sb;
    char buf[64], want[64], why2[700];
    int W = dt_comm_size(world), R = dt_comm_rank(world), ok;
    dt_status st;
    memset(&d, 0, sizeof d);
    d.tp = tp;
    d.pp = pp;
    d.dp = explicit_dp ? dp : 0;
    d.cp = explicit_cp || cp > 1 ? cp : 0;
    st = dt_layout_create(world, &l, &d);
    ok = st == DT_OK;
    if (!ok) snprintf(why, n, "dp %d cp %d tp %d pp %d: %.300s", dp, cp, tp, pp, dt_ctx_error(&C));
    if (ok && (l->dp != dp || l->cp != cp || l->tp != tp || l->pp != pp || l->size != W || l->rank != R ||
               l->dpcp != dp * cp)) {
        snprintf(why, n, "sizes dp %d cp %d tp %d pp %d dpcp %d, want %d %d %d %d %d", l->dp, l->cp, l->tp, l->pp,
                 l->dpcp, dp, cp, tp, pp, dp * cp);
        ok = 0;
    }
    /* coordinates: the inverse of rank = tp + TP * (cp + CP * (dp + DP * pp)) */
    if (ok && (l->tp_rank != R % tp || l->cp_rank != (R / tp) % cp || l->dp_rank != (R / (tp * cp)) % dp ||
               l->pp_rank != R / (tp * cp * dp) || l->dpcp_rank != l->cp_rank + cp * l->dp_rank ||
               dt_layout_rank_at(l, l->dp_rank, l->cp_rank, l->tp_rank, l->pp_rank) != R)) {
        snprintf(why, n, "dp %d cp %d tp %d pp %d: rank %d at (dp %d, cp %d, tp %d, pp %d), dpcp_rank %d; rank_at "
                 "gives back %d", dp, cp, tp, pp, R, l->dp_rank, l->cp_rank, l->tp_rank, l->pp_rank, l->dpcp_rank,
                 dt_layout_rank_at(l, l->dp_rank, l->cp_rank, l->tp_rank, l->pp_rank));
        ok = 0;
    }
    /* cp 1: the order of before cp, rank = tp + TP * (dp + DP * pp), through rank_of too */
    if (ok && cp == 1 && (l->tp_rank != R % tp || l->dp_rank != (R / tp) % dp || l->pp_rank != R / (tp * dp) ||
                          dt_layout_rank_of(l, l->dp_rank, l->tp_rank, l->pp_rank) != R)) {
        snprintf(why, n, "dp %d tp %d pp %d (cp 1): rank %d at (dp %d, tp %d, pp %d), rank_of gives back %d", dp, tp, pp,
                 R, l->dp_rank, l->tp_rank, l->pp_rank, dt_layout_rank_of(l, l->dp_rank, l->tp_rank, l->pp_rank));
        ok = 0;
    }
    if (ok && (dt_layout_rank_of(l, dp, 0, 0) != -1 || dt_layout_rank_of(l, 0, -1, 0) != -1 ||
               dt_layout_rank_of(l, 0, 0, pp) != -1 || dt_layout_rank_at(l, 0, cp, 0, 0) != -1 ||
               dt_layout_rank_at(l, 0, -1, 0, 0) != -1)) {
        snprintf(why, n, "rank_of / rank_at out of range is not -1");
        ok = 0;
    }
    if (ok && !groups_ok(l, why2, sizeof why2)) {
        snprintf(why, n, "dp %d cp %d tp %d pp %d: %.600s", dp, cp, tp, pp, why2);
        ok = 0;
    }
    if (ok) {
        if (cp == 1) snprintf(want, sizeof want, "dp=%d,tp=%d,pp=%d", dp, tp, pp);
        else snprintf(want, sizeof want, "dp=%d,cp=%d,tp=%d,pp=%d", dp, cp, tp, pp);
        if (strcmp(dt_layout_string(l, buf, sizeof buf), want) != 0) {
            snprintf(why, n, "layout string \"%s\", want \"%s\"", buf, want);
            ok = 0;
        }
    }
    if (ok) { /* the picture: a table line per rank and a grid per stage */
        memset(&sb, 0, sizeof sb);
        sb.ctx = &C;
        st = dt_layout_describe(l, &sb);
        if (st) { snprintf(why, n, "describe: %.200s", dt_ctx_error(&C)); ok = 0; }
        if (ok && !describe_ok(l, sb.text, why2, sizeof why2)) {
            snprintf(why, n, "dp %d cp %d tp %d pp %d: %.600s", dp, cp, tp, pp, why2);
            ok = 0;
        }
        /* pictures in the log */
        if (ok && R == 0 && W == 4 && pp == 1 && ((tp == 2 && cp == 1) || (cp == 2 && dp == 2))) printf("%s", sb.text);
        dt_strbuf_free(&sb);
    }
    if (ok) { /* the dp ranks' batch ranges tile [0, 12 * dp) in dp order; cp ranks share theirs */
        int64_t first = -1, count = -1;
        st = dt_layout_batch_range(l, 12 * (int64_t)dp, &first, &count);
        if (st || first != 12 * (int64_t)l->dp_rank || count != 12) {
            snprintf(why, n, "batch_range: first %lld count %lld, want %d 12 (%.200s)", (long long)first,
                     (long long)count, 12 * l->dp_rank, st ? dt_ctx_error(&C) : "ok");
            ok = 0;
        }
    }
    dt_layout_free(l);
    return ok;
}

int main(void) {
    dt_comm *world;
    dt_layout *l = NULL;
    dt_layout_desc d;
    char why[1024], buf[64];
    int W, R, cp, tp, pp, cp1, all_ok;
    dt_status st;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);

    /* every factorisation of the world: those with cp 1 (the grid of before cp, whose ranks
       must not have moved), then those with cp > 1 */
    for (cp1 = 1; cp1 >= 0; cp1--) {
        char name[96];
        int n_fact = 0;
        all_ok = 1;
        why[0] = 0;
        for (cp = 1; cp <= W; cp++)
            for (tp = 1; tp <= W; tp++)
                for (pp = 1; pp <= W; pp++) {
                    if ((cp == 1) != cp1 || W % (cp * tp * pp)) continue;
                    /* derived dp and explicit dp alike; cp 1 given as 0 (the default) and as 1 */
                    if (!factorisation_ok(world, W / (cp * tp * pp), cp, tp, pp, n_fact % 2, n_fact % 4 < 2, why,
                                          sizeof why))
                        all_ok = 0;
                    n_fact++;
                }
        if (cp1) snprintf(name, sizeof name, "layout_coordinates_and_groups_of_all_%d_factorisations", n_fact);
        else snprintf(name, sizeof name, "layout_cp_coordinates_and_groups_of_all_%d_factorisations_with_cp_over_1",
                      n_fact);
        if (n_fact) dt_test_check_all(name, all_ok, "%s", why);
        else if (R == 0) dt_test_skip("layout_cp_coordinates_and_groups_with_cp_over_1", "needs np >= 2");
    }

    /* the default desc (NULL): all data parallel */
    st = dt_layout_create(world, &l, NULL);
    dt_test_check_all("layout_null_desc_is_all_dp", st == DT_OK && l->dp == W && l->tp == 1 && l->pp == 1 &&
                      l->cp == 1 && l->dp_rank == R, "%s", dt_ctx_error(&C));
    if (l) {
        int64_t a, b;
        st = dt_layout_batch_range(l, 4 * (int64_t)W + 1, &a, &b);
        if (R == 0 && W > 1) dt_test_error("batch_not_divisible_by_dp_is_named", st, dt_ctx_error(&C), "divisible by dp");
        if (R == 0 && W == 1) dt_test_skip("batch_not_divisible_by_dp_is_named", "every batch divides dp = 1");
        st = dt_layout_batch_range(l, -4, &a, &b);
        if (R == 0) dt_test_error("negative_batch_is_named", st, dt_ctx_error(&C), "global_batch = -4");
        st = dt_layout_batch_range(l, 4, NULL, &b);
        if (R == 0) dt_test_error("batch_range_null_first_is_named", st, dt_ctx_error(&C), "first is NULL");
        if (R == 0) DT_TEST_CHECK("rank_of_null_is_minus_one", dt_layout_rank_of(NULL, 0, 0, 0) == -1 &&
                                  dt_layout_rank_at(NULL, 0, 0, 0, 0) == -1);
        dt_layout_free(l);
        l = NULL;
    }

    layouts_that_differ_between_ranks(world, W, R);
#ifdef __linux__
    oversubscription_noted(world, W, R);
#endif

    /* bad sizes: named on every rank, nothing made */
    memset(&d, 0, sizeof d);
    d.dp = W + 1;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) {
        char want[64];
        snprintf(want, sizeof want, "world size %d", W);
        dt_test_error("dp_not_matching_world_is_named", st, dt_ctx_error(&C), want);
        snprintf(want, sizeof want, "dp x cp x tp x pp = %d x 1 x 1 x 1", W + 1);
        dt_test_error("dp_not_matching_world_names_every_size", st, dt_ctx_error(&C), want);
        DT_TEST_CHECK("failed_create_leaves_out_null", l == NULL);
    }
    memset(&d, 0, sizeof d);
    d.tp = 3;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) dt_test_error("tp_not_dividing_world_is_named", st, dt_ctx_error(&C), "cp x tp x pp = 1 x 3 x 1");
    /* cp: a negative size, one that does not divide the world (dp derived and dp given) */
    memset(&d, 0, sizeof d);
    d.cp = -1;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) dt_test_error("negative_cp_is_named", st, dt_ctx_error(&C), "desc.cp = -1");
    memset(&d, 0, sizeof d);
    d.cp = 3;
    d.tp = W % 2 ? 1 : 2;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) {
        char want[96];
        snprintf(want, sizeof want, "cp x tp x pp = 3 x %d x 1 = %d does not divide the world size %d", d.tp, 3 * d.tp,
                 W);
        dt_test_error("cp_not_dividing_world_is_named", st, dt_ctx_error(&C), want);
    }
    memset(&d, 0, sizeof d);
    d.dp = 1;
    d.cp = 2 * W;
    st = dt_layout_create(world, &l, &d);
    if (R == 0) {
        char want[96];
        snprintf(want, sizeof want, "dp x cp x tp x pp = 1 x %d x 1 x 1 = %d does not equal the world size %d", 2 * W,
                 2 * W, W);
        dt_test_error("cp_with_dp_not_matching_world_is_named", st, dt_ctx_error(&C), want);
        DT_TEST_CHECK("failed_cp_create_leaves_out_null", l == NULL);
    }
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
