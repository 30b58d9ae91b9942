// np: 1 2 4
/* tests/mpi_plan_dlrm.c - dt_plan_dlrm_measure on real ranks with real tables (four, of other
   sizes, widths and optimizers): the caller's dense step is called in every whole run; every kind
   dt_embed can do is measured for every table and the ones it refuses are not (column-wise with
   row-wise Adagrad; table-row on one host); every rank holds the same profile and so ranks the
   same plans; and the bytes the profile predicts a plan's tables hold on each rank are what
   dt_embed_create then takes on that rank (within 1% + 4 KB), for every plan the search ranks;
   dt_embed's own plan is predicted with the transient the profile measured of it whole, a plan one
   table away from it with its kinds' scaled sum; `--shard table`'s plan with the transient measured
   of all tables table-wise as dt_embed places them. The bad descs are named. No timing is asserted: the timings are checked by bench/plan. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_embed.h"
#include "dt_plan.h"
#include "dt_test.h"

#define NT 4
#define B 32

static int g_calls;

/* a dense step that is collective, as the caller's is (its all-reduce) */
static dt_status dense(void *u) {
    double x = 1;
    g_calls++;
    return dt_comm_allreduce_f64((dt_comm *)u, &x, 1, DT_REDUCE_SUM);
}

/* FNV-1a over the profile but its host name and measuring time */
static double digest(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    uint64_t h = 1469598103934665603ULL;
    for (i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return (double)(h >> 12);
}

static int same_everywhere(dt_comm *w, double d) {
    double v[2];
    v[0] = d; v[1] = -d;
    dt_comm_allreduce_f64(w, v, 2, DT_REDUCE_MAX);
    return v[0] == -v[1];
}

int main(void) {
    static const int64_t rows[NT] = {3000, 40, 5000, 700};
    static const int dims[NT] = {8, 8, 16, 4};
    static const dt_embed_optim opts[NT] = {DT_EMBED_SGD, DT_EMBED_ADAGRAD, DT_EMBED_ROWWISE_ADAGRAD, DT_EMBED_ADAM};
    static const char *names[NT] = {"a", "b", "c", "d"};
    dt_ctx ctx;
    dt_comm *w = NULL;
    dt_embed_table_desc td[NT];
    dt_plan_dlrm_desc desc;
    dt_plan_dlrm_profile *p = (dt_plan_dlrm_profile *)calloc(1, sizeof *p);
    dt_plan_dlrm_prediction top[8];
    int64_t lengths[NT * B], ids[NT * B * 3], n = 0;
    dt_kjt k;
    int t, b, i, W, me, ok, count = 0, worst_plan = -1;
    double worst = 0, got_worst = 0, want_worst = 0;
    dt_status st;
    dt_ctx_init(&ctx, NULL);
    if (dt_comm_create_world(&ctx, &w, NULL) || !p) { printf("FAIL plan_dlrm_world: %s\n", dt_ctx_error(&ctx)); return 1; }
    W = dt_comm_size(w);
    me = dt_comm_rank(w);
    memset(td, 0, sizeof td);
    for (t = 0; t < NT; t++) {
        td[t].name = names[t]; td[t].rows = rows[t]; td[t].dim = dims[t]; td[t].optim.kind = opts[t];
    }
    for (t = 0; t < NT; t++) /* bags of 0 to 3 ids, spread over the rows, other on each rank */
        for (b = 0; b < B; b++) {
            int len = (int)((t + b + me) % 4), j;
            lengths[t * B + b] = len;
            for (j = 0; j < len; j++) ids[n++] = (int64_t)(((uint64_t)(me * B + b) * 2654435761u + (uint64_t)j * 40503u) %
                                                           (uint64_t)rows[t]);
        }
    memset(&k, 0, sizeof k);
    k.n_features = NT; k.batch = B; k.lengths = lengths; k.ids = ids; k.ids_dtype = DT_I64;
    memset(&desc, 0, sizeof desc);
    desc.tables = td; desc.n_tables = NT; desc.batch = &k; desc.global_batch = (int64_t)B * W;
    desc.dense = dense; desc.user = w; desc.repeats = 3;
    if (!DT_TEST_CHECK("plan_dlrm_measures", (st = dt_plan_dlrm_measure(w, &desc, p)) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&ctx));
        return dt_test_finish();
    }
    if (me == 0) printf("  (measured in %.2f s; dense %.3g s, exchange %.3g + %.3g s)\n", p->measure_s, p->dense_s, p->x_fwd, p->x_bwd);
    /* once, then between forward and backward: (batches + repeats) x (dt_embed's plan + each kind whole) */
    DT_TEST_CHECK("plan_dlrm_calls_the_dense_step_in_every_whole_run", g_calls >= 1 + 4 * 2 && same_everywhere(w, g_calls));
    DT_TEST_CHECK("plan_dlrm_profile_knows_its_world", p->world == W && p->n_tables == NT && p->batch == B * W &&
                  p->dim_total == 36 && p->base_bytes > 0 && p->dense_s > 0);
    for (t = 0, ok = 1; t < NT; t++) {
        ok = ok && p->cost[t][DT_SHARD_TABLE].ok && p->cost[t][DT_SHARD_ROW].ok && p->cost[t][DT_SHARD_DATA].ok;
        ok = ok && p->cost[t][DT_SHARD_COLUMN].ok == (opts[t] != DT_EMBED_ROWWISE_ADAGRAD);
        ok = ok && p->cost[t][DT_SHARD_TABLE_ROW].ok == (p->group > 0);
        for (i = DT_SHARD_TABLE; i < DT_SHARD_COUNT; i++)
            ok = ok && p->cost[t][i].fwd[0] >= 0 && p->cost[t][i].fwd[1] >= 0 && p->cost[t][i].bwd[0] >= 0 &&
                 p->cost[t][i].bytes[0] >= 0 && p->cost[t][i].bytes[1] >= 0 && p->cost[t][i].peak[0] >= 0;
        ok = ok && p->auto_kind[t] >= DT_SHARD_TABLE && p->auto_kind[t] < DT_SHARD_COUNT;
    }
    DT_TEST_CHECK("plan_dlrm_measures_every_kind_dt_embed_does_and_no_other", ok);
    {
        dt_plan_dlrm_profile c = *p;
        memset(c.machine, 0, sizeof c.machine);
        c.measure_s = 0;
        DT_TEST_CHECK("plan_dlrm_profile_is_the_same_on_every_rank", same_everywhere(w, digest(&c, sizeof c)));
    }
    st = dt_plan_dlrm_search(&ctx, p, 0, top, 8, &count);
    DT_TEST_CHECK("plan_dlrm_search_ranks_plans", st == DT_OK && count >= 3); /* table, row, data at least */
    DT_TEST_CHECK("plan_dlrm_every_rank_ranks_the_same_first_plan",
                  count > 0 && same_everywhere(w, digest(&top[0].plan, sizeof top[0].plan)));
    /* every ranked plan made for real: the bytes each rank's tables take, against the profile's sum */
    for (i = 0; i < count; i++) {
        dt_embed_table_desc tp[NT];
        dt_embed_desc ed;
        dt_embed *e = NULL;
        size_t before = ctx.bytes_in_use;
        double got, want = p->x_bytes, err;
        memcpy(tp, td, sizeof tp);
        for (t = 0; t < NT; t++) {
            tp[t].sharding = top[i].plan.kind[t];
            tp[t].pin_owner = top[i].plan.kind[t] == DT_SHARD_TABLE || top[i].plan.kind[t] == DT_SHARD_TABLE_ROW;
            tp[t].owner = top[i].plan.owner[t];
        }
        memset(&ed, 0, sizeof ed);
        ed.tables = tp; ed.n_tables = NT; ed.comm = w; ed.seed = 3; ed.batch_hint = B * W;
        if ((st = dt_embed_create(&ctx, &e, &ed))) { dt_test_fail("plan_dlrm_plans_can_be_made", "%s", dt_ctx_error(&ctx)); break; }
        got = (double)(ctx.bytes_in_use - before);
        for (t = 0; t < NT; t++) {
            const dt_plan_table_cost *c = &p->cost[t][top[i].plan.kind[t]];
            int own = top[i].plan.kind[t] == DT_SHARD_TABLE ? me == top[i].plan.owner[t]
                    : top[i].plan.kind[t] == DT_SHARD_TABLE_ROW ? me >= top[i].plan.owner[t] &&
                                                                  me < top[i].plan.owner[t] + p->group
                    : 1;
            want += c->bytes[own ? 0 : 1];
        }
        dt_embed_free(e);
        err = fabs(got - want) - (0.01 * want + 4096);
        if (err > worst || worst_plan < 0) { worst = err; worst_plan = i; got_worst = got; want_worst = want; }
    }
    {
        double v = worst;
        dt_comm_allreduce_f64(w, &v, 1, DT_REDUCE_MAX);
        if (!DT_TEST_CHECK("plan_dlrm_predicted_table_bytes_are_what_dt_embed_takes", count > 0 && v <= 0) && worst == v)
            printf("  rank %d, plan %s: took %.0f bytes, predicted %.0f\n", me, top[worst_plan].plan.name, got_worst,
                   want_worst);
    }
    /* dt_embed's own plan is predicted with its transient measured whole (the largest rank's peak
       above its tables in the profile's run of it), and a plan differing in one table is not */
    {
        dt_plan_dlrm_plan pl;
        dt_plan_dlrm_prediction a, o;
        int moved = -1;
        memset(&pl, 0, sizeof pl);
        pl.n_tables = NT;
        for (t = 0; t < NT; t++) { pl.kind[t] = p->auto_kind[t]; pl.owner[t] = p->auto_owner[t]; }
        st = dt_plan_dlrm_predict(&ctx, p, &pl, &a);
        if (!DT_TEST_CHECK("plan_dlrm_own_plan_transient_is_measured_whole",
                           st == DT_OK && p->whole_peak[DT_SHARD_AUTO] > 0 && p->scale_peak[DT_SHARD_AUTO] > 0 &&
                           fabs(a.mem_transient - p->whole_peak[DT_SHARD_AUTO]) <= 1e-9 * p->whole_peak[DT_SHARD_AUTO]))
            printf("  predicted transient %.0f bytes, measured whole %.0f (scale %g)\n", a.mem_transient,
                   p->whole_peak[DT_SHARD_AUTO], p->scale_peak[DT_SHARD_AUTO]);
        for (t = 0; t < NT && moved < 0; t++) /* one table to another measured kind */
            for (i = DT_SHARD_TABLE; i < DT_SHARD_COUNT && moved < 0; i++)
                if (i != (int)pl.kind[t] && i != DT_SHARD_TABLE && i != DT_SHARD_TABLE_ROW && p->cost[t][i].ok) {
                    pl.kind[t] = (dt_embed_sharding)i;
                    moved = t;
                }
        if (moved >= 0 && dt_plan_dlrm_predict(&ctx, p, &pl, &o) == DT_OK) {
            double raw = 0, m = -1;
            int r;
            for (r = 0; r < W; r++) { /* the fullest rank's transient, each table by its kind's scale only */
                double bytes = p->x_bytes, pk = 0;
                for (t = 0; t < NT; t++) {
                    int role = pl.kind[t] == DT_SHARD_TABLE ? (r == pl.owner[t] ? 0 : 1) : 0;
                    double sc = p->scale_peak[pl.kind[t]] > 0 ? p->scale_peak[pl.kind[t]] : 1;
                    bytes += p->cost[t][pl.kind[t]].bytes[role];
                    pk += sc * p->cost[t][pl.kind[t]].peak[role];
                }
                if (bytes + pk > m) { m = bytes + pk; raw = pk; }
            }
            if (!DT_TEST_CHECK("plan_dlrm_other_plans_are_not_scaled_as_its_own", fabs(o.mem_transient - raw) <= 1e-9 * raw))
                printf("  table %d moved: transient %.0f, the kinds' sum %.0f\n", moved, o.mem_transient, raw);
        }
    }
    /* table-wise whole is measured as dt_embed places it (largest first, on the rank holding least),
       so `--shard table`'s plan is predicted with the transient measured of it, whatever the
       profile's timings were */
    if (p->whole_peak[DT_SHARD_TABLE] > 0) {
        dt_embed_table_desc tp[NT];
        dt_embed_desc ed;
        dt_embed *e = NULL;
        dt_plan_dlrm_plan pl;
        dt_plan_dlrm_prediction a;
        memcpy(tp, td, sizeof tp);
        for (t = 0; t < NT; t++) tp[t].sharding = DT_SHARD_TABLE;
        memset(&ed, 0, sizeof ed);
        ed.tables = tp; ed.n_tables = NT; ed.comm = w; ed.seed = 3; ed.batch_hint = B * W;
        st = dt_embed_create(&ctx, &e, &ed);
        if (st == DT_OK) st = dt_plan_dlrm_plan_of(e, NT, "table", &pl);
        if (st == DT_OK) st = dt_plan_dlrm_predict(&ctx, p, &pl, &a);
        if (!DT_TEST_CHECK("plan_dlrm_table_wise_transient_is_measured_as_dt_embed_places_it",
                           st == DT_OK && fabs(a.mem_transient - p->whole_peak[DT_SHARD_TABLE]) <=
                                              1e-9 * p->whole_peak[DT_SHARD_TABLE]))
            printf("  %s; predicted transient %.0f bytes, measured whole %.0f (scale %g)\n", st ? dt_ctx_error(&ctx) : "",
                   st ? 0.0 : a.mem_transient, p->whole_peak[DT_SHARD_TABLE], p->scale_peak[DT_SHARD_TABLE]);
        dt_embed_free(e);
    }
    /* hosts modelled (host_size 2 at np 4): table-row is measured, its group the first host's two
       ranks; a rank outside the group holds none of the table (its bytes were once the group's:
       the roles were rank 0 against the rest), a rank inside it half the rows */
    if (W == 4) {
        dt_comm_desc hd;
        dt_comm *hw = NULL;
        dt_plan_dlrm_profile *q = (dt_plan_dlrm_profile *)calloc(1, sizeof *q);
        dt_plan_dlrm_desc d2 = desc;
        memset(&hd, 0, sizeof hd);
        hd.host_size = 2;
        st = q ? dt_comm_create_world(&ctx, &hw, &hd) : DT_ERR_OOM;
        d2.user = hw;
        if (!st) st = dt_plan_dlrm_measure(hw, &d2, q);
        if (!DT_TEST_CHECK("plan_dlrm_measures_on_modelled_hosts", st == DT_OK && q->group == 2))
            printf("  status %d, group %d: %s\n", st, q ? q->group : -1, dt_ctx_error(&ctx));
        else {
            const dt_plan_table_cost *c = &q->cost[2][DT_SHARD_TABLE_ROW], *tw = &q->cost[2][DT_SHARD_TABLE];
            /* table "c": 5000 rows x 16 f32 + row-wise Adagrad's 5000: the table-wise owner's bytes, halved */
            if (!DT_TEST_CHECK("plan_dlrm_table_row_bytes_by_role", c->ok && c->bytes[1] < 0.01 * tw->bytes[0] &&
                               fabs(c->bytes[0] - tw->bytes[0] / 2) <= 0.01 * tw->bytes[0] + 4096))
                printf("  table-row: group rank %.0f bytes, other %.0f; table-wise owner %.0f\n", c->bytes[0],
                       c->bytes[1], tw->bytes[0]);
        }
        dt_comm_free(hw);
        free(q);
    }
    /* bad descs, named (every rank alike: nothing collective runs) */
    {
        dt_plan_dlrm_desc bad = desc;
        dt_kjt kb = k;
        bad.n_tables = 0;
        dt_test_error("plan_dlrm_no_tables_is_named", dt_plan_dlrm_measure(w, &bad, p), dt_ctx_error(&ctx),
                      "desc.n_tables = 0");
        bad = desc; kb.n_features = 3; bad.batch = &kb;
        dt_test_error("plan_dlrm_batch_of_other_features_is_named", dt_plan_dlrm_measure(w, &bad, p), dt_ctx_error(&ctx),
                      "batch 0: 3 features of 32 samples");
        bad = desc; bad.repeats = 99;
        dt_test_error("plan_dlrm_repeats_past_15_is_named", dt_plan_dlrm_measure(w, &bad, p), dt_ctx_error(&ctx),
                      "desc.repeats = 99");
        bad = desc; bad.global_batch = 0;
        dt_test_error("plan_dlrm_global_batch_0_is_named", dt_plan_dlrm_measure(w, &bad, p), dt_ctx_error(&ctx),
                      "desc.global_batch = 0");
    }
    free(p);
    ok = dt_test_finish();
    dt_comm_free(w);
    dt_ctx_shutdown(&ctx);
    return ok;
}
