// np: 1 2 3 4
/* tests/mpi_embed.c - sharded embedding tables against the single-rank computation.
   Every rank builds the model twice: sharded over the world, and whole in a private group of
   one (dt_comm_split with color = rank), and feeds the whole global batch to the single-rank
   copy and its own slice to the sharded one. The tables cover every sharding kind x pooling
   (sum, mean, sequence) x weighted, every sparse optimizer, bf16 storage and one table serving
   two features. Lookups, sequence rows and, after training steps, every row of every shard
   must equal the single-rank values bit for bit. Also: duplicate ids in a bag and across
   ranks, empty bags, a rank with an empty local batch and one that receives no ids, all ids on
   one owner, an id out of range (named error on every rank), checkpoints saved at one world
   size / plan and loaded at others, and the incremental export. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;
static int R, W;

#define NT 24   /* 4 kinds x 3 poolings x 2 weighted */
#define NF 25   /* one feature per table, plus a second feature on table 0 */
#define GB 11   /* global batch */

static dt_embed_table_desc TABS[NT];
static dt_embed_feature_desc FEATS[NF];
static char TNAMES[NT][32];

static const dt_embed_sharding KINDS[4] = {DT_SHARD_TABLE, DT_SHARD_ROW, DT_SHARD_COLUMN, DT_SHARD_DATA};
static const dt_embed_pooling POOLS[3] = {DT_POOL_SUM, DT_POOL_MEAN, DT_POOL_NONE};

/* The tables; `plan` 0: as listed, 1: another plan (kinds rotated), for resharding. */
static void tables(int plan, int size) {
    int i;
    memset(TABS, 0, sizeof TABS);
    for (i = 0; i < NT; i++) {
        dt_embed_table_desc *t = &TABS[i];
        int kind = (i / 6 + plan) % 4;
        snprintf(TNAMES[i], sizeof TNAMES[i], "t%02d", i);
        t->name = TNAMES[i];
        t->rows = 13 + i % 5;
        /* mostly narrow; dims 37 and 128 take one rank's local path too (rows up to 512 bytes) */
        t->dim = i % 8 == 5 ? 37 : i % 8 == 6 ? 128 : 3 + i % 4;
        t->pooling = POOLS[i % 3];
        t->weighted = (i / 3) % 2;
        t->sharding = KINDS[kind];
        t->optim.kind = (dt_embed_optim)(1 + i % 4);
        /* row-wise Adagrad needs whole rows: not on a table that either plan splits by columns */
        if ((KINDS[(i / 6) % 4] == DT_SHARD_COLUMN || KINDS[(i / 6 + 1) % 4] == DT_SHARD_COLUMN) &&
            t->optim.kind == DT_EMBED_ROWWISE_ADAGRAD)
            t->optim.kind = DT_EMBED_ADAGRAD;
        if (t->optim.kind == DT_EMBED_SGD || t->optim.kind == DT_EMBED_ADAM) t->optim.lr = 0.05;
        if (i % 7 == 3) t->dtype = DT_BF16;
        if (KINDS[kind] == DT_SHARD_TABLE) { t->pin_owner = 1; t->owner = (i * 3) % size; }
        t->init.kind = DT_INIT_NORMAL;
        t->init.std = 0.5;
    }
    for (i = 0; i < NT; i++) { FEATS[i].name = TNAMES[i]; FEATS[i].table = i; }
    FEATS[NT].name = "t00_again";
    FEATS[NT].table = 0;
}

static dt_embed *make(dt_comm *c, int plan) {
    dt_embed_desc d;
    dt_embed *e = NULL;
    tables(plan, dt_comm_size(c));
    memset(&d, 0, sizeof d);
    d.tables = TABS; d.n_tables = NT; d.features = FEATS; d.n_features = NF; d.comm = c; d.seed = 11;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* The global batch of step s: a pure function of (s, sample, feature). mode 1: every id 0 (all
   on one owner); mode 2: empty bags everywhere but sample 0. */
typedef struct batch {
    int64_t lengths[NF * GB];
    int64_t ids[NF * GB * 4];
    float weights[NF * GB * 4];
} batch;

static int64_t bag_len(int s, int b, int f, int mode) {
    if (mode == 2) return b == 0 ? 2 : 0;
    return (int64_t)(dt_rng_uniform(100 + s, (uint64_t)f, (uint64_t)b) * 4.0f); /* 0..3: empties included */
}

/* The batch of samples [b0, b0 + n) of the global batch, feature-major (as dt_kjt wants). */
static void make_batch(batch *bt, dt_kjt *k, int s, int mode, int64_t b0, int64_t n) {
    int f;
    int64_t b, j, o = 0;
    for (f = 0; f < NF; f++)
        for (b = 0; b < n; b++) {
            int64_t len = bag_len(s, (int)(b0 + b), f, mode);
            const dt_embed_table_desc *t = &TABS[FEATS[f].table];
            bt->lengths[f * n + b] = len;
            for (j = 0; j < len; j++) {
                float u = dt_rng_uniform(200 + s, (uint64_t)(f * 64 + j), (uint64_t)(b0 + b));
                /* u^2: small ids are frequent, so ids repeat within bags and across ranks */
                bt->ids[o] = mode == 1 ? 0 : (int64_t)(u * u * (float)t->rows);
                if (bt->ids[o] >= t->rows) bt->ids[o] = t->rows - 1;
                bt->weights[o] = 0.5f + dt_rng_uniform(300 + s, (uint64_t)(f * 64 + j), (uint64_t)(b0 + b));
                o++;
            }
        }
    memset(k, 0, sizeof *k);
    k->n_features = NF; k->batch = n; k->lengths = bt->lengths; k->ids = bt->ids; k->weights = bt->weights;
}

/* Rank r's slice of the global batch: uneven, and rank 0 empty when W > 1 (an empty local batch). */
static void my_slice(int r, int w, int64_t *b0, int64_t *n) {
    int64_t start[8], i;
    if (w == 1) { *b0 = 0; *n = GB; return; }
    start[0] = 0; start[1] = 0; /* rank 0 gets nothing */
    for (i = 2; i <= w; i++) start[i] = (GB * (i - 1)) / (w - 1);
    *b0 = start[r]; *n = start[r + 1] - start[r];
}

/* dloss/dpooled for global sample b, column c (and for sequence rows, id occurrence, column). */
static float dval(int s, int64_t b, int64_t c) { return dt_rng_normal(400 + s, (uint64_t)c, (uint64_t)b); }

/* Forward (and backward when train) on e with samples [b0, b0+n) of step s's global batch; the
   pooled output goes to out. Returns the status. */
static dt_status step(dt_embed *e, dt_tensor *out, int s, int mode, int64_t b0, int64_t n, int train) {
    static batch bt;
    dt_kjt k;
    dt_tensor dout;
    dt_status st;
    int64_t D = dt_embed_pooled_dim(e), b, c, f;
    make_batch(&bt, &k, s, mode, b0, n);
    st = dt_embed_forward(e, out, &k);
    if (st || !train) return st;
    dout = dt_test_t2(&C, n, D);
    for (b = 0; b < n; b++)
        for (c = 0; c < D; c++) ((float *)dout.data)[b * D + c] = dval(s, b0 + b, c);
    for (f = 0; f < NF; f++) {
        dt_tensor g;
        if (dt_embed_feature_offset(e, (int)f) >= 0) continue;
        int64_t skip = 0, dim;
        dt_embed_sequence_grad(e, &g, (int)f);
        dim = g.shape[1];
        for (b = 0; b < b0; b++) skip += bag_len(s, (int)b, (int)f, mode);
        /* the grad of sequence row k of feature f: a function of (feature, global occurrence, column) */
        for (b = 0; b < g.numel; b++)
            ((float *)g.data)[b] = dval(s + 50 * (int)f, skip + b / dim, b % dim);
    }
    st = dt_embed_backward(e, &dout);
    dt_tensor_free(&C, &dout);
    return st;
}

/* Bitwise: rows [b0, b0+n) of ref equal mine. */
static int64_t diff_rows(const dt_tensor *mine, const dt_tensor *ref, int64_t b0, int64_t n, int64_t D) {
    int64_t k, bad = 0;
    for (k = 0; k < n * D; k++)
        if (memcmp((const float *)mine->data + k, (const float *)ref->data + b0 * D + k, 4) != 0) {
            if (!bad) fprintf(stderr, "[rank %d] pooled[%lld][%lld] = %.9g, single rank %.9g\n", R,
                              (long long)(k / D), (long long)(k % D), ((const float *)mine->data)[k],
                              ((const float *)ref->data)[b0 * D + k]);
            bad++;
        }
    return bad;
}

/* Bitwise: every local shard of e equals the same rows / columns of ref's whole tables. */
static int64_t diff_tables(dt_embed *e, dt_embed *ref) {
    int64_t bad = 0, x, c;
    int t;
    for (t = 0; t < NT; t++) {
        dt_tensor a, b;
        int64_t r0, c0, r0b, c0b;
        size_t es;
        dt_embed_local_shard(e, &a, &r0, &c0, t);
        dt_embed_local_shard(ref, &b, &r0b, &c0b, t);
        es = dt_dtype_size(a.dtype);
        if (a.numel == 0) continue;
        for (x = 0; x < a.shape[0]; x++)
            for (c = 0; c < a.shape[1]; c++)
                if (memcmp((const char *)a.data + (size_t)(x * a.shape[1] + c) * es,
                           (const char *)b.data + (size_t)((r0 + x) * b.shape[1] + c0 + c) * es, es) != 0) {
                    if (!bad) fprintf(stderr, "[rank %d] table %s row %lld col %lld differs from single rank\n", R,
                                      TNAMES[t], (long long)(r0 + x), (long long)(c0 + c));
                    bad++;
                }
    }
    return bad;
}

/* The sequence rows of e's local batch equal the single-rank ones of the same samples. */
static int64_t diff_seq(dt_embed *e, dt_embed *ref, int s, int64_t b0, int64_t n) {
    static batch bt;
    dt_kjt k;
    int f;
    int64_t bad = 0;
    make_batch(&bt, &k, s, 0, 0, GB);
    for (f = 0; f < NF; f++) {
        dt_tensor a, r;
        int64_t skip = 0, b, dim;
        if (dt_embed_feature_offset(e, f) >= 0) continue;
        dt_embed_sequence(e, &a, f);
        dt_embed_sequence(ref, &r, f);
        dim = r.shape[1];
        for (b = 0; b < b0; b++) skip += bt.lengths[f * GB + b];
        (void)n;
        if (a.numel && memcmp(a.data, (const float *)r.data + skip * dim, (size_t)a.numel * 4) != 0) bad++;
    }
    return bad;
}

static void check_lookups_and_training(dt_embed *e, dt_embed *ref, int64_t b0, int64_t n) {
    int64_t D = dt_embed_pooled_dim(e), bad = 0, bad_seq = 0;
    dt_tensor out = dt_test_t2(&C, n, D), rout = dt_test_t2(&C, GB, D);
    int s;
    /* lookups before any update */
    if (step(e, &out, 0, 0, b0, n, 0) || step(ref, &rout, 0, 0, 0, GB, 0))
        dt_test_fail("embed_lookup_runs", "%s", dt_ctx_error(&C));
    bad = diff_rows(&out, &rout, b0, n, D);
    bad_seq = diff_seq(e, ref, 0, b0, n);
    dt_test_check_all("embed_every_kind_x_pooling_x_weighted_equals_single_rank_lookup", bad == 0 && bad_seq == 0,
                      "%lld pooled values and %lld sequence features differ", (long long)bad, (long long)bad_seq);
    /* training: 3 steps, then a step with every id 0 (one owner for the row-wise tables; the
       other ranks receive no ids) and one with nearly every bag empty */
    bad = 0;
    for (s = 0; s < 5; s++) {
        int mode = s == 3 ? 1 : s == 4 ? 2 : 0;
        dt_status a = step(e, &out, s, mode, b0, n, 1), b2 = step(ref, &rout, s, mode, 0, GB, 1);
        if (a || b2) { dt_test_fail("embed_training_runs", "step %d: %s", s, dt_ctx_error(&C)); break; }
        bad += diff_rows(&out, &rout, b0, n, D);
        if (s < 3) bad_seq += diff_seq(e, ref, s, b0, n);
    }
    dt_test_check_all("embed_training_steps_equal_single_rank_outputs", bad == 0 && bad_seq == 0,
                      "%lld pooled values, %lld sequence features differ over 5 steps", (long long)bad,
                      (long long)bad_seq);
    bad = diff_tables(e, ref);
    dt_test_check_all("embed_training_steps_equal_single_rank_rows", bad == 0, "%lld table elements differ",
                      (long long)bad);
    dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &rout);
}

static void check_out_of_range(dt_embed *e, int64_t b0, int64_t n) {
    static batch bt;
    dt_kjt k;
    int64_t D = dt_embed_pooled_dim(e);
    dt_tensor out = dt_test_t2(&C, n, D);
    dt_status st;
    const char *want = "\"t00\"";
    int bad_rank = W - 1;
    make_batch(&bt, &k, 0, 0, b0, n);
    if (R == bad_rank) { /* the first bag of feature 0 with an id: id 1000 */
        int64_t i, o = 0;
        for (i = 0; i < n; i++) {
            if (bt.lengths[i] > 0) { bt.ids[o] = 1000; break; }
            o += bt.lengths[i];
        }
    }
    st = dt_embed_forward(e, &out, &k);
    if (R == bad_rank)
        dt_test_check_all("embed_id_out_of_range_is_named", st == DT_ERR_RANGE && strstr(dt_ctx_error(&C), want) &&
                          strstr(dt_ctx_error(&C), "id 1000") && strstr(dt_ctx_error(&C), "feature 0") &&
                          strstr(dt_ctx_error(&C), "sample"), "status %d, message \"%s\"", (int)st, dt_ctx_error(&C));
    else
        dt_test_check_all("embed_id_out_of_range_fails_on_every_rank", st == DT_ERR_RANGE, "status %d, message \"%s\"",
                          (int)st, dt_ctx_error(&C));
    dt_tensor_free(&C, &out);
}


/* The planner on the world: a small table replicated, a big one row-wise (W > 1), two mid ones
   table-wise on different ranks, a pinned one where it was pinned; the plan prints. */
static void check_planner(dt_comm *world) {
    dt_embed_table_desc t[5];
    dt_embed_desc d;
    dt_embed *e = NULL;
    int o2 = -1, o3 = -1, o4 = -1, ok;
    char buf[4096];
    memset(t, 0, sizeof t);
    t[0].name = "small"; t[0].rows = 100; t[0].dim = 8;
    t[1].name = "big"; t[1].rows = 100000; t[1].dim = 8;
    t[2].name = "mid_a"; t[2].rows = 5000; t[2].dim = 8;
    t[3].name = "mid_b"; t[3].rows = 5000; t[3].dim = 8;
    t[4].name = "pinned"; t[4].rows = 5000; t[4].dim = 8; t[4].pin_owner = 1; t[4].owner = W - 1;
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = 5; d.comm = world; d.dp_max_bytes = 16384; d.print_plan = 1;
    if (dt_embed_create(&C, &e, &d)) { dt_test_fail("embed_planner_create", "%s", dt_ctx_error(&C)); return; }
    dt_embed_plan_format(e, buf, sizeof buf);
    dt_embed_table_sharding(e, 2, &o2);
    dt_embed_table_sharding(e, 3, &o3);
    dt_embed_table_sharding(e, 4, &o4);
    {   /* the three equal table-wise tables spread: per-rank counts differ by at most one */
        int per[8] = {0, 0, 0, 0, 0, 0, 0, 0}, r, mx = 0, mn = 99;
        per[o2 & 7]++; per[o3 & 7]++; per[o4 & 7]++;
        for (r = 0; r < W && r < 8; r++) { if (per[r] > mx) mx = per[r]; if (per[r] < mn) mn = per[r]; }
        ok = dt_embed_table_sharding(e, 0, NULL) == DT_SHARD_DATA &&
             dt_embed_table_sharding(e, 1, NULL) == (W > 1 ? DT_SHARD_ROW : DT_SHARD_TABLE) &&
             dt_embed_table_sharding(e, 2, NULL) == DT_SHARD_TABLE && dt_embed_table_sharding(e, 3, NULL) == DT_SHARD_TABLE &&
             (W == 1 || mx - mn <= 1) && o4 == W - 1 && strstr(buf, "lookup B/step") != NULL;
    }
    dt_test_check_all("embed_planner_balances_and_keeps_pins", ok, "mid owners %d %d, pinned on %d; plan:\n%s", o2, o3, o4, buf);
    dt_embed_free(e);
}

int main(void) {
    dt_comm *world, *self, *grp;
    dt_embed *e, *ref, *e2;
    int64_t b0, n;
    int g;
    char dir[1024];
    dt_checkpoint_desc cd;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    if (dt_comm_split(world, &self, R, 0)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    my_slice(R, W, &b0, &n);
    e = make(world, 0);
    ref = make(self, 0);
    check_lookups_and_training(e, ref, b0, n);
    check_out_of_range(e, b0, n);

    /* checkpoints: save at W under plan 0; load at group sizes 1, 2, 3 under plan 1 */
    snprintf(dir, sizeof dir, "%s/mpi_embed_np%d", dt_test_tmpdir(), W);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.comm = world;
    if (dt_embed_checkpoint_save(e, NULL, &cd)) dt_test_fail("embed_checkpoint_save", "%s", dt_ctx_error(&C));
    for (g = 1; g <= 3 && g <= W; g++) {
        int color = R / g, in_full = (R / g + 1) * g <= W;
        int64_t bad = 0, sb0, sn;
        dt_comm_split(world, &grp, in_full ? color : -1, R);
        if (grp) {
            dt_embed *x = make(grp, 1);
            dt_tensor out, rout;
            int64_t D = dt_embed_pooled_dim(x);
            cd.comm = grp;
            if (dt_embed_checkpoint_load(x, NULL, &cd)) dt_test_fail("embed_checkpoint_load", "%s", dt_ctx_error(&C));
            bad = diff_tables(x, ref);
            /* one more step on both: the optimizer state came back too */
            my_slice(dt_comm_rank(grp), g, &sb0, &sn);
            out = dt_test_t2(&C, sn, D);
            rout = dt_test_t2(&C, GB, D);
            if (step(x, &out, 7, 0, sb0, sn, 1) || step(ref, &rout, 7, 0, 0, GB, 1))
                dt_test_fail("embed_checkpoint_continue", "%s", dt_ctx_error(&C));
            bad += diff_tables(x, ref);
            /* undo ref's extra step for the next group: reload ref from the checkpoint */
            cd.comm = self;
            if (dt_embed_checkpoint_load(ref, NULL, &cd)) dt_test_fail("embed_checkpoint_load_ref", "%s", dt_ctx_error(&C));
            dt_embed_free(x);
            dt_tensor_free(&C, &out);
            dt_tensor_free(&C, &rout);
            dt_comm_free(grp);
        }
        {
            char name[96];
            snprintf(name, sizeof name, "embed_checkpoint_np%d_loads_at_np%d_other_plan", W, g);
            dt_test_check_all(name, bad == 0, "%lld elements differ from the single-rank run", (long long)bad);
        }
    }

    /* 2 -> W: ranks 0 and 1 load the world's checkpoint (W -> 2), save it as a group of 2, and the
       world loads that under the other plan (2 -> 3 at np 3, 2 -> 4 at np 4) */
    if (W >= 3) {
        char dir2[1100];
        int64_t bad = 0;
        dt_embed *x;
        snprintf(dir2, sizeof dir2, "%s/mpi_embed_np%d_by2", dt_test_tmpdir(), W);
        dt_comm_split(world, &grp, R < 2 ? 0 : -1, R);
        if (grp) {
            dt_checkpoint_desc c2 = cd;
            x = make(grp, 0);
            c2.comm = grp;
            if (dt_embed_checkpoint_load(x, NULL, &c2)) dt_test_fail("embed_checkpoint_load_2", "%s", dt_ctx_error(&C));
            c2.dir = dir2;
            if (dt_embed_checkpoint_save(x, NULL, &c2)) dt_test_fail("embed_checkpoint_save_2", "%s", dt_ctx_error(&C));
            dt_embed_free(x);
            dt_comm_free(grp);
        }
        dt_comm_barrier(world);
        x = make(world, 1);
        cd.dir = dir2;
        cd.comm = world;
        if (dt_embed_checkpoint_load(x, NULL, &cd)) dt_test_fail("embed_checkpoint_load_from_2", "%s", dt_ctx_error(&C));
        bad = diff_tables(x, ref);
        {
            char name[96];
            snprintf(name, sizeof name, "embed_checkpoint_np2_loads_at_np%d_other_plan", W);
            dt_test_check_all(name, bad == 0, "%lld elements differ from the single-rank run", (long long)bad);
        }
        dt_embed_free(x);
    }
    check_planner(world);
    (void)e2;
    dt_embed_free(e);
    dt_embed_free(ref);
    dt_comm_free(self);
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
