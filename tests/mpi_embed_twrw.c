// np: 1 2 4
/* tests/mpi_embed_twrw.c - table-wise-row-wise sharding (DT_SHARD_TABLE_ROW): tables split
   row-wise over a group of group_size consecutive ranks (2 at np 4, 1 below: a table per rank)
   against the same tables whole in a private group of one. Lookups (sum, mean, sequence,
   weighted), 5 training steps (outputs and rows) must equal the single-rank run bit for bit;
   the rows must sit on the planned group only; the planner must choose table-row for tables
   that fit in a group and spread them over the groups; checkpoints must reshard both ways
   (table-row at np W -> other plans at np 1, 2, 3, and a group of 2 -> table-row at np W); bad
   group sizes are named. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;
static int R, W, G;

#define NT 5
#define GB 9

static dt_embed_table_desc TABS[NT];
static const char *NAMES[NT] = {"sum", "mean", "seq", "wsum", "pinned"};

/* plan 0: every table table-row over groups of G (the last pinned to the last group); plan 1:
   row-wise, table-wise, data-parallel, row-wise, table-wise (the checkpoints' other plan). */
static void tables(int plan, int g, int size) {
    static const int64_t rows[NT] = {37, 29, 23, 31, 19};
    static const int dims[NT] = {4, 3, 2, 5, 4};
    static const dt_embed_optim opts[NT] = {DT_EMBED_SGD, DT_EMBED_ADAGRAD, DT_EMBED_ADAM, DT_EMBED_ROWWISE_ADAGRAD,
                                            DT_EMBED_ADAGRAD};
    static const dt_embed_sharding other[NT] = {DT_SHARD_ROW, DT_SHARD_TABLE, DT_SHARD_DATA, DT_SHARD_ROW, DT_SHARD_TABLE};
    int i;
    memset(TABS, 0, sizeof TABS);
    for (i = 0; i < NT; i++) {
        dt_embed_table_desc *t = &TABS[i];
        t->name = NAMES[i]; t->rows = rows[i]; t->dim = dims[i]; t->optim.kind = opts[i];
        t->sharding = plan == 0 ? DT_SHARD_TABLE_ROW : other[i];
        t->group_size = plan == 0 ? g : 0;
    }
    TABS[1].pooling = DT_POOL_MEAN;
    TABS[2].pooling = DT_POOL_NONE;
    TABS[3].weighted = 1;
    TABS[0].weighted = 1;
    TABS[4].pin_owner = 1;
    TABS[4].owner = plan == 0 ? size - 1 : 0;
}

static dt_embed *make(dt_comm *c, int plan, int g) {
    dt_embed_desc d;
    dt_embed *e = NULL;
    tables(plan, g, dt_comm_size(c));
    memset(&d, 0, sizeof d);
    d.tables = TABS; d.n_tables = NT; d.comm = c; d.seed = 5;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

static int64_t LEN[NT * GB], IDS[NT * GB * 4];
static float WTS[NT * GB * 4];

/* Samples [b0, b0 + n) of step s's global batch: 0..3 ids per bag, small ids frequent. */
static void batch(dt_kjt *k, int s, int64_t b0, int64_t n) {
    int f;
    int64_t b, j, o = 0;
    for (f = 0; f < NT; f++)
        for (b = 0; b < n; b++) {
            int64_t len = (int64_t)(dt_rng_uniform(30 + s, (uint64_t)f, (uint64_t)(b0 + b)) * 4.0f);
            LEN[f * n + b] = len;
            for (j = 0; j < len; j++) {
                float u = dt_rng_uniform(40 + s, (uint64_t)(f * 8 + j), (uint64_t)(b0 + b));
                IDS[o] = (int64_t)(u * u * (float)TABS[f].rows);
                if (IDS[o] >= TABS[f].rows) IDS[o] = TABS[f].rows - 1;
                WTS[o] = 0.5f + dt_rng_uniform(50 + s, (uint64_t)(f * 8 + j), (uint64_t)(b0 + b));
                o++;
            }
        }
    memset(k, 0, sizeof *k);
    k->n_features = NT; k->batch = n; k->lengths = LEN; k->ids = IDS; k->weights = WTS;
}

static void slice(int r, int w, int64_t *b0, int64_t *n) {
    *b0 = (GB * (int64_t)r) / w;
    *n = (GB * (int64_t)(r + 1)) / w - *b0;
}

static float dval(int s, int64_t b, int64_t c) { return dt_rng_normal(60 + s, (uint64_t)c, (uint64_t)b); }

/* Forward (and backward when train) of samples [b0, b0 + n) of step s. */
static dt_status step(dt_embed *e, dt_tensor *out, int s, int64_t b0, int64_t n, int train) {
    dt_kjt k;
    dt_tensor dout, g;
    int64_t D = dt_embed_pooled_dim(e), b, c, skip = 0;
    dt_status st;
    batch(&k, s, b0, n);
    st = dt_embed_forward(e, out, &k);
    if (st || !train) return st;
    dout = dt_test_t2(&C, n, D);
    for (b = 0; b < n; b++)
        for (c = 0; c < D; c++) ((float *)dout.data)[b * D + c] = dval(s, b0 + b, c);
    dt_embed_sequence_grad(e, &g, 2);
    {   /* the grad of sequence occurrence k: a function of its global position */
        dt_kjt all;
        batch(&all, s, 0, GB);
        for (b = 0; b < b0; b++) skip += LEN[2 * GB + b];
        batch(&k, s, b0, n); /* restore this rank's batch in the shared arrays */
    }
    for (b = 0; b < g.numel; b++) ((float *)g.data)[b] = dval(s + 90, skip + b / g.shape[1], b % g.shape[1]);
    st = dt_embed_backward(e, &dout);
    dt_tensor_free(&C, &dout);
    return st;
}

static int64_t diff_out(const dt_tensor *mine, const dt_tensor *ref, int64_t b0, int64_t n, int64_t D) {
    int64_t k, bad = 0;
    for (k = 0; k < n * D; k++)
        if (memcmp((const float *)mine->data + k, (const float *)ref->data + b0 * D + k, 4) != 0) {
            if (!bad) fprintf(stderr, "[rank %d] pooled[%lld][%lld] = %.9g, single rank %.9g\n", R, (long long)(k / D),
                              (long long)(k % D), ((const float *)mine->data)[k], ((const float *)ref->data)[b0 * D + k]);
            bad++;
        }
    return bad;
}

/* The sequence rows of feature 2 equal the single-rank ones of the same samples. */
static int64_t diff_seq(dt_embed *e, dt_embed *ref, int s, int64_t b0) {
    dt_tensor a, r;
    dt_kjt k;
    int64_t skip = 0, b;
    batch(&k, s, 0, GB);
    for (b = 0; b < b0; b++) skip += LEN[2 * GB + b];
    dt_embed_sequence(e, &a, 2);
    dt_embed_sequence(ref, &r, 2);
    if (!a.numel) return 0;
    if (memcmp(a.data, (const float *)r.data + skip * r.shape[1], (size_t)a.numel * 4) != 0) {
        fprintf(stderr, "[rank %d] sequence rows differ: %.9g vs %.9g\n", R, ((float *)a.data)[0],
                ((float *)r.data)[skip * r.shape[1]]);
        return 1;
    }
    return 0;
}

/* Every local shard of e equals the same rows of ref's whole tables, bit for bit. */
static int64_t diff_tables(dt_embed *e, dt_embed *ref) {
    int64_t bad = 0, x;
    int t;
    for (t = 0; t < NT; t++) {
        dt_tensor a, b;
        int64_t r0, c0, r0b, c0b;
        dt_embed_local_shard(e, &a, &r0, &c0, t);
        dt_embed_local_shard(ref, &b, &r0b, &c0b, t);
        for (x = 0; x < a.shape[0] && a.numel; x++)
            if (memcmp((const float *)a.data + x * a.shape[1], (const float *)b.data + (r0 + x) * b.shape[1] + c0,
                       (size_t)a.shape[1] * 4) != 0) {
                if (!bad) fprintf(stderr, "[rank %d] table %s row %lld differs from single rank: %.9g vs %.9g\n", R,
                                  NAMES[t], (long long)(r0 + x), ((float *)a.data)[x * a.shape[1]],
                                  ((float *)b.data)[(r0 + x) * b.shape[1] + c0]);
                bad++;
            }
    }
    return bad;
}

static void check_placement(dt_embed *e) {
    int t, ok = 1, own = -1;
    char buf[2048], want[32];
    for (t = 0; t < NT; t++) {
        dt_tensor v;
        int64_t r0, c0, rows = TABS[t].rows, q = rows / G, m = rows % G, k;
        int first = t == 4 ? (W - 1) / G * G : -1;
        dt_embed_sharding kind = dt_embed_table_sharding(e, t, &own);
        dt_embed_local_shard(e, &v, &r0, &c0, t);
        if (kind != DT_SHARD_TABLE_ROW || own % G != 0 || (first >= 0 && own != first)) ok = 0;
        k = R - own; /* my place in the table's group, or outside it */
        if (k >= 0 && k < G) {
            int64_t s0 = q * k + (k < m ? k : m), s1 = q * (k + 1) + (k + 1 < m ? k + 1 : m);
            if (r0 != s0 || v.shape[0] != s1 - s0 || v.shape[1] != TABS[t].dim) ok = 0;
        } else if (v.numel != 0) ok = 0;
        if (!ok) { fprintf(stderr, "[rank %d] table %s: kind %d group %d rows %lld+%lld\n", R, NAMES[t], (int)kind, own,
                           (long long)r0, (long long)v.shape[0]); break; }
    }
    dt_embed_plan_format(e, buf, sizeof buf);
    snprintf(want, sizeof want, "%d-%d", (W - 1) / G * G, (W - 1) / G * G + G - 1);
    dt_test_check_all("twrw_rows_sit_on_the_group_only", ok && strstr(buf, "table-row") && strstr(buf, want),
                      "plan:\n%s(want kind table-row, ranks %s)", buf, want);
}

static void check_planner(dt_comm *world) {
    dt_embed_table_desc t[3];
    dt_embed_desc d;
    dt_embed *e = NULL;
    int o1 = -1, o2 = -1, ok;
    dt_embed_sharding k1, k2;
    char buf[2048];
    memset(t, 0, sizeof t);
    t[0].name = "small"; t[0].rows = 100; t[0].dim = 8;
    t[1].name = "mid1"; t[1].rows = 30000; t[1].dim = 16; t[1].group_size = G;
    t[2].name = "mid2"; t[2].rows = 30000; t[2].dim = 16; t[2].group_size = G;
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = 3; d.comm = world;
    if (dt_embed_create(&C, &e, &d)) { dt_test_fail("twrw_planner_create", "%s", dt_ctx_error(&C)); return; }
    k1 = dt_embed_table_sharding(e, 1, &o1);
    k2 = dt_embed_table_sharding(e, 2, &o2);
    dt_embed_plan_format(e, buf, sizeof buf);
    /* each mid table is more than a rank's share (total / W) and at most a group's (total G / W):
       table-row when there are several groups of more than one rank, one table per group */
    if (G > 1 && G < W) ok = k1 == DT_SHARD_TABLE_ROW && k2 == DT_SHARD_TABLE_ROW && o1 == 0 && o2 == G;
    else ok = k1 == DT_SHARD_TABLE && k2 == DT_SHARD_TABLE; /* W <= 2: each exactly a rank's share */
    dt_test_check_all("twrw_planner_puts_group_sized_tables_on_different_groups", ok,
                      "kinds %d %d, groups at %d %d; plan:\n%s", (int)k1, (int)k2, o1, o2, buf);
    dt_embed_free(e);
}

static void check_bad_groups(dt_comm *world) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_status st;
    int bad[3] = {-1, W + 1, W == 4 ? 3 : 0}, i;
    char want[64];
    for (i = 0; i < 3; i++) {
        if (!bad[i]) continue;
        memset(&t, 0, sizeof t);
        t.name = "t"; t.rows = 10; t.dim = 2; t.sharding = DT_SHARD_TABLE_ROW; t.group_size = bad[i];
        memset(&d, 0, sizeof d);
        d.tables = &t; d.n_tables = 1; d.comm = world;
        st = dt_embed_create(&C, &e, &d);
        snprintf(want, sizeof want, "group_size = %d", bad[i]);
        dt_test_check_all(i == 0 ? "twrw_negative_group_size_is_named" : i == 1 ? "twrw_group_larger_than_world_is_named"
                                                                                : "twrw_group_not_dividing_world_is_named",
                          st == DT_ERR_ARG && e == NULL && strstr(dt_ctx_error(&C), want) != NULL,
                          "status %d, message \"%s\"; want DT_ERR_ARG naming \"%s\"", (int)st, dt_ctx_error(&C), want);
    }
    /* group_size 0: the ranks of this host (all of them here), table-row over the whole world */
    memset(&t, 0, sizeof t);
    t.name = "t"; t.rows = 10; t.dim = 2; t.sharding = DT_SHARD_TABLE_ROW;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = world;
    st = dt_embed_create(&C, &e, &d);
    if (!st) {
        dt_tensor v;
        int64_t r0, c0;
        int own = -1;
        dt_embed_local_shard(e, &v, &r0, &c0, 0);
        dt_embed_table_sharding(e, 0, &own);
        dt_test_check_all("twrw_group_size_0_is_the_host", own == 0 && r0 == (10 / W) * R + (R < 10 % W ? R : 10 % W),
                          "group at %d, my rows from %lld", own, (long long)r0);
        dt_embed_free(e);
    } else dt_test_fail("twrw_group_size_0_is_the_host", "%s", dt_ctx_error(&C));
    /* hosts modelled (desc.host_size 2 at np 4): group_size 0 is a modelled host, as the planner's
       and the two-level exchanges' hosts (it was the machine's, every rank here) */
    if (W == 4) {
        dt_comm_desc hd;
        dt_comm *hw = NULL;
        memset(&hd, 0, sizeof hd);
        hd.host_size = 2;
        st = dt_comm_create_world(&C, &hw, &hd);
        d.comm = hw;
        if (!st) st = dt_embed_create(&C, &e, &d);
        if (!st) {
            dt_tensor v;
            int64_t r0 = -1, c0;
            int own = -1;
            dt_embed_local_shard(e, &v, &r0, &c0, 0);
            dt_embed_table_sharding(e, 0, &own);
            dt_test_check_all("twrw_group_size_0_is_a_modelled_host", own == 0 && (R >= 2 || (r0 == 5 * R && v.shape[0] == 5)),
                              "group at %d, my rows from %lld (%lld of them)", own, (long long)r0,
                              (long long)(R < 2 ? v.shape[0] : 0));
            dt_embed_free(e);
        } else dt_test_fail("twrw_group_size_0_is_a_modelled_host", "%s", dt_ctx_error(&C));
        dt_comm_free(hw);
        d.comm = world;
    }
}

int main(void) {
    dt_comm *world, *self, *grp;
    dt_embed *e, *ref;
    dt_tensor out, rout;
    int64_t b0, n, bad = 0, bad_seq = 0, D;
    int s, g;
    char dir[1024];
    dt_checkpoint_desc cd;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    G = W >= 4 ? 2 : 1;
    if (dt_comm_split(world, &self, R, 0)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    slice(R, W, &b0, &n);
    e = make(world, 0, G);
    ref = make(self, 0, 1);
    check_placement(e);
    D = dt_embed_pooled_dim(e);
    out = dt_test_t2(&C, n, D);
    rout = dt_test_t2(&C, GB, D);
    if (step(e, &out, 0, b0, n, 0) || step(ref, &rout, 0, 0, GB, 0)) dt_test_fail("twrw_lookup_runs", "%s", dt_ctx_error(&C));
    bad = diff_out(&out, &rout, b0, n, D);
    bad_seq = diff_seq(e, ref, 0, b0);
    dt_test_check_all("twrw_sum_mean_none_weighted_lookups_equal_single_rank", bad == 0 && bad_seq == 0,
                      "%lld pooled values, %lld sequence features differ", (long long)bad, (long long)bad_seq);
    bad = bad_seq = 0;
    for (s = 0; s < 5; s++) {
        if (step(e, &out, s, b0, n, 1) || step(ref, &rout, s, 0, GB, 1)) {
            dt_test_fail("twrw_training_runs", "step %d: %s", s, dt_ctx_error(&C));
            break;
        }
        bad += diff_out(&out, &rout, b0, n, D);
        bad_seq += diff_seq(e, ref, s, b0);
    }
    dt_test_check_all("twrw_5_training_steps_equal_single_rank_outputs", bad == 0 && bad_seq == 0,
                      "%lld pooled values, %lld sequence features differ", (long long)bad, (long long)bad_seq);
    bad = diff_tables(e, ref);
    dt_test_check_all("twrw_5_training_steps_equal_single_rank_rows", bad == 0, "%lld rows differ", (long long)bad);

    /* checkpoints: table-row at np W -> the other plan at np 1, 2, 3 (one more step on both) */
    snprintf(dir, sizeof dir, "%s/mpi_embed_twrw_np%d", dt_test_tmpdir(), W);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.comm = world;
    if (dt_embed_checkpoint_save(e, NULL, &cd)) dt_test_fail("twrw_checkpoint_save", "%s", dt_ctx_error(&C));
    for (g = 1; g <= 3 && g <= W; g++) {
        int in_full = (R / g + 1) * g <= W;
        int64_t sb0, sn, nbad = 0;
        char name[96];
        dt_comm_split(world, &grp, in_full ? R / g : -1, R);
        if (grp) {
            dt_embed *x = make(grp, 1, 0);
            dt_tensor o2, r2;
            cd.comm = grp;
            if (dt_embed_checkpoint_load(x, NULL, &cd)) dt_test_fail("twrw_checkpoint_load", "%s", dt_ctx_error(&C));
            nbad = diff_tables(x, ref);
            slice(dt_comm_rank(grp), g, &sb0, &sn);
            o2 = dt_test_t2(&C, sn, D);
            r2 = dt_test_t2(&C, GB, D);
            if (step(x, &o2, 7, sb0, sn, 1) || step(ref, &r2, 7, 0, GB, 1))
                dt_test_fail("twrw_checkpoint_continue", "%s", dt_ctx_error(&C));
            nbad += diff_tables(x, ref);
            cd.comm = self; /* undo ref's extra step */
            if (dt_embed_checkpoint_load(ref, NULL, &cd)) dt_test_fail("twrw_checkpoint_load_ref", "%s", dt_ctx_error(&C));
            dt_embed_free(x);
            dt_tensor_free(&C, &o2);
            dt_tensor_free(&C, &r2);
            dt_comm_free(grp);
        }
        snprintf(name, sizeof name, "twrw_checkpoint_np%d_loads_at_np%d_other_plan", W, g);
        dt_test_check_all(name, nbad == 0, "%lld rows differ from the single-rank run", (long long)nbad);
    }
    /* and back: a group of min(2, W) ranks under the other plan saves; the world loads table-row */
    {
        char dir2[1100];
        int64_t nbad;
        dt_embed *x;
        snprintf(dir2, sizeof dir2, "%s/mpi_embed_twrw_np%d_back", dt_test_tmpdir(), W);
        dt_comm_split(world, &grp, R < 2 ? 0 : -1, R);
        if (grp) {
            dt_checkpoint_desc c2 = cd;
            x = make(grp, 1, 0);
            c2.comm = grp;
            if (dt_embed_checkpoint_load(x, NULL, &c2)) dt_test_fail("twrw_checkpoint_load_2", "%s", dt_ctx_error(&C));
            c2.dir = dir2;
            if (dt_embed_checkpoint_save(x, NULL, &c2)) dt_test_fail("twrw_checkpoint_save_2", "%s", dt_ctx_error(&C));
            dt_embed_free(x);
            dt_comm_free(grp);
        }
        dt_comm_barrier(world);
        x = make(world, 0, G);
        cd.dir = dir2;
        cd.comm = world;
        if (dt_embed_checkpoint_load(x, NULL, &cd)) dt_test_fail("twrw_checkpoint_load_back", "%s", dt_ctx_error(&C));
        nbad = diff_tables(x, ref);
        dt_test_check_all("twrw_checkpoint_of_other_plan_loads_as_table_row", nbad == 0,
                          "%lld rows differ from the single-rank run", (long long)nbad);
        dt_embed_free(x);
    }
    check_planner(world);
    check_bad_groups(world);
    dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &rout);
    dt_embed_free(e);
    dt_embed_free(ref);
    dt_comm_free(self);
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
