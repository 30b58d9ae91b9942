// np: 1 2 4
/* tests/mpi_embed_consistency.c - dt_embed.h over several ranks, three promises an audit found
   broken: (1) gradient accumulation on dynamic tables: micro-batches of consecutive global
   samples, sharded over the world, admit, evict, reject and update exactly as one batch of their
   union in a single process (lookups, slots, counts bit for bit; LRU and LFU); (2) a dynamic
   table's checkpoint loads into another hash_shards, at the world size and in smaller groups:
   every id keeps its row and state (training continues as the table resumed with the saved
   hash_shards), and shards too small for their ids are refused on every rank; (3) ranks that pass different table descs get DT_ERR_ARG on
   every rank naming the first differing field and the ranks (no hang, no wrong values). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;
static int R, W;

#define GB 12  /* samples per step */
#define MB 4   /* samples per micro-batch */

static dt_embed *make(dt_comm *c, dt_embed_eviction ev, int admit, int shards) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(&t, 0, sizeof t);
    t.name = "dyn"; t.rows = 8; t.dim = 2; t.dynamic = 1; t.hash_shards = shards; t.admit_after = admit;
    t.eviction = ev; t.optim.kind = DT_EMBED_ADAGRAD; t.optim.lr = 0.5;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = c; d.seed = 11;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* Global sample b of step s: one id out of 14 (so 8 slots overflow), and its output gradient. */
static int64_t id_of(int s, int64_t b) {
    return (int64_t)((uint64_t)(1 + (int64_t)(dt_rng_uniform(50 + (uint64_t)s, 0, (uint64_t)b) * 14)) * 0x9E3779B97F4A7C15ull);
}
static float grad_of(int s, int64_t b, int c) { return dt_rng_normal(60 + (uint64_t)s, (uint64_t)c, (uint64_t)b); }

/* Forward + backward of global samples [g0, g0 + n) of step s on e (this rank's part of them). */
static dt_status fwd_bwd(dt_embed *e, dt_tensor *out, int s, int64_t g0, int64_t n) {
    int64_t len[GB], ids[GB], b;
    dt_tensor dout = dt_test_t2(&C, n, 2);
    dt_kjt k;
    dt_status st;
    for (b = 0; b < n; b++) {
        len[b] = 1; ids[b] = id_of(s, g0 + b);
        ((float *)dout.data)[2 * b] = grad_of(s, g0 + b, 0);
        ((float *)dout.data)[2 * b + 1] = grad_of(s, g0 + b, 1);
    }
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = n; k.lengths = len; k.ids = ids;
    st = dt_embed_forward(e, out, &k);
    if (!st) st = dt_embed_backward(e, &dout);
    dt_tensor_free(&C, &dout);
    return st;
}

static void accumulation(dt_comm *world, dt_comm *self, dt_embed_eviction ev, int admit) {
    dt_embed *e = make(world, ev, admit, 4), *ref = make(self, ev, admit, 4);
    dt_tensor rout = dt_test_t2(&C, GB, 2), a, b;
    dt_embed_stats sa, sr;
    double cnt[3];
    int64_t bad_out = 0, r0, rr;
    int s, m, ok = 1, bad_slots;
    char name[128];
    for (s = 0; s < 5 && ok; s++) {
        ok = !fwd_bwd(ref, &rout, s, 0, GB);
        for (m = 0; m < GB / MB && ok; m++) { /* micro-batch m: global samples [m MB, (m + 1) MB), sliced over ranks */
            int64_t b0 = (int64_t)MB * R / W, n = (int64_t)MB * (R + 1) / W - b0;
            dt_tensor out = dt_test_t2(&C, n, 2);
            ok = !dt_embed_set_sync(e, m == GB / MB - 1) && !fwd_bwd(e, &out, s, m * MB + b0, n);
            if (ok && n && memcmp(out.data, (float *)rout.data + 2 * (m * MB + b0), (size_t)n * 8) != 0) bad_out++;
            dt_tensor_free(&C, &out);
        }
    }
    if (!ok) fprintf(stderr, "[rank %d] %s\n", R, dt_ctx_error(&C));
    memset(&sa, 0, sizeof sa);
    memset(&sr, 0, sizeof sr);
    dt_embed_stats_get(e, &sa);
    dt_embed_stats_get(ref, &sr);
    cnt[0] = (double)sa.admitted; cnt[1] = (double)sa.evicted; cnt[2] = (double)sa.rejected;
    dt_comm_allreduce_f64(world, cnt, 3, DT_REDUCE_SUM);
    dt_embed_local_shard(e, &a, &r0, NULL, 0);
    dt_embed_local_shard(ref, &b, &rr, NULL, 0);
    bad_slots = a.numel && memcmp(a.data, (const float *)b.data + r0 * 2, (size_t)a.numel * 4) != 0;
    snprintf(name, sizeof name, "embed_dynamic_%s_admit%d_accumulated_micro_batches_equal_one_batch_at_np1",
             ev == DT_EVICT_LFU ? "lfu" : "lru", admit);
    dt_test_check_all(name, ok && bad_out == 0 && !bad_slots && cnt[0] == (double)sr.admitted &&
                      cnt[1] == (double)sr.evicted && cnt[2] == (double)sr.rejected && sr.evicted > 0 && sr.rejected > 0,
                      "%s; %lld micro-batch lookups differ, slots %s; admitted %g / %lld, evicted %g / %lld, rejected "
                      "%g / %lld (world's micro-batches / one batch at np 1; evicted and rejected must be > 0)",
                      ok ? "ran" : "failed", (long long)bad_out, bad_slots ? "differ" : "equal", cnt[0],
                      (long long)sr.admitted, cnt[1], (long long)sr.evicted, cnt[2], (long long)sr.rejected);
    dt_tensor_free(&C, &rout);
    dt_embed_free(e);
    dt_embed_free(ref);
}

static dt_embed *make_big(dt_comm *c, int rows, int shards) { /* rows >= the 14 ids: nothing evicted */
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(&t, 0, sizeof t);
    t.name = "dyn"; t.rows = rows; t.dim = 2; t.dynamic = 1; t.hash_shards = shards; t.eviction = DT_EVICT_LFU;
    t.optim.kind = DT_EMBED_ADAGRAD; t.optim.lr = 0.5;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = c; d.seed = 11;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make_big: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* The rows of ids 1..14 (every id id_of gives), looked up on c (this rank's slice), summed over c
   into all[14 * 2] on every rank of it. */
static int lookup_all(dt_embed *e, dt_comm *c, double all[28]) {
    int w = dt_comm_size(c), r = dt_comm_rank(c);
    int64_t b0 = 14 * (int64_t)r / w, n = 14 * (int64_t)(r + 1) / w - b0, len[14], ids[14], b;
    dt_tensor out = dt_test_t2(&C, n, 2);
    dt_kjt k;
    int bad;
    memset(all, 0, 28 * sizeof(double));
    for (b = 0; b < n; b++) { len[b] = 1; ids[b] = (int64_t)((uint64_t)(b0 + b + 1) * 0x9E3779B97F4A7C15ull); }
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = n; k.lengths = len; k.ids = ids;
    bad = dt_embed_forward(e, &out, &k) != DT_OK;
    for (b = 0; b < 2 * n; b++) all[2 * b0 + b] = ((float *)out.data)[b];
    dt_comm_allreduce_f64(c, all, 28, DT_REDUCE_SUM);
    dt_tensor_free(&C, &out);
    return bad;
}

/* Saved at the world size with hash_shards 4, loaded into hash_shards 2 and 8 on the world and in
   groups of 1, 2 and 3 ranks: every saved id keeps its row (the lookups equal the table resumed
   with hash_shards 4), and two more training steps (Adagrad: the state moved too) stay equal.
   Loaded into 32 shards of 1 slot, some shard gets 2 of the 14 ids: refused on every rank. */
static void checkpoint_other_hash_shards(dt_comm *world) {
    static const int shards[2] = {2, 8};
    dt_embed *e = make_big(world, 32, 4), *x;
    dt_checkpoint_desc cd;
    char dir[1024], name[128];
    dt_status st;
    int s, g, q;
    snprintf(dir, sizeof dir, "%s/mpi_embed_consistency_np%d", dt_test_tmpdir(), W);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    for (s = 0; s < 3; s++) {
        int64_t b0 = (int64_t)GB * R / W, n = (int64_t)GB * (R + 1) / W - b0;
        dt_tensor out = dt_test_t2(&C, n, 2);
        if (fwd_bwd(e, &out, s, b0, n)) dt_test_fail("embed_dynamic_checkpoint_train_runs", "%s", dt_ctx_error(&C));
        dt_tensor_free(&C, &out);
    }
    if (dt_embed_checkpoint_save(e, NULL, &cd)) dt_test_fail("embed_dynamic_checkpoint_save_runs", "%s", dt_ctx_error(&C));
    dt_embed_free(e);
    for (q = 0; q < 2; q++)
        for (g = 1; g <= 4 && g <= W; g++) {
            int in_full = (R / g + 1) * g <= W, bad = 0, step;
            dt_comm *grp = NULL, *c;
            dt_embed *ref = make_big(world, 32, 4);
            double a[28], b[28];
            cd.comm = NULL;
            if (dt_embed_checkpoint_load(ref, NULL, &cd)) bad += 100;
            if (g == W) { grp = NULL; c = world; }
            else { dt_comm_split(world, &grp, in_full ? R / g : -1, R); c = grp; }
            x = c ? make_big(c, 32, shards[q]) : NULL;
            if (x) {
                cd.comm = c;
                if (dt_embed_checkpoint_load(x, NULL, &cd)) { bad += 100; fprintf(stderr, "[rank %d] %s\n", R, dt_ctx_error(&C)); }
            }
            for (step = 0; step < 3; step++) { /* lookups, then a training step on both */
                int rb = lookup_all(ref, world, a);
                if (x) {
                    bad += rb + lookup_all(x, c, b);
                    if (memcmp(a, b, sizeof a) != 0) bad++;
                }
                if (step < 2) {
                    int64_t b0 = (int64_t)GB * R / W, n = (int64_t)GB * (R + 1) / W - b0;
                    dt_tensor out = dt_test_t2(&C, n, 2);
                    if (fwd_bwd(ref, &out, 5 + step, b0, n)) bad += 100;
                    dt_tensor_free(&C, &out);
                    if (x) {
                        int w2 = dt_comm_size(c), r2 = dt_comm_rank(c);
                        int64_t c0 = (int64_t)GB * r2 / w2, cn = (int64_t)GB * (r2 + 1) / w2 - c0;
                        out = dt_test_t2(&C, cn, 2);
                        if (fwd_bwd(x, &out, 5 + step, c0, cn)) bad += 100;
                        dt_tensor_free(&C, &out);
                    }
                }
            }
            snprintf(name, sizeof name, "embed_dynamic_checkpoint_np%d_hash_shards_4_loads_into_%d_at_np%d_and_continues",
                     W, shards[q], g);
            dt_test_check_all(name, bad == 0, "%d differences from the table resumed with hash_shards 4", bad);
            dt_embed_free(x);
            dt_embed_free(ref);
            if (grp) dt_comm_free(grp);
        }
    x = make_big(world, 32, 32);
    cd.comm = NULL;
    st = dt_embed_checkpoint_load(x, NULL, &cd);
    dt_test_check_all("embed_dynamic_checkpoint_into_shards_too_small_is_refused_on_every_rank",
                      st == DT_ERR_UNSUPPORTED && (strstr(dt_ctx_error(&C), "id-hash shard") ||
                                                   strstr(dt_ctx_error(&C), "another rank")),
                      "status %d, message \"%s\"", (int)st, dt_ctx_error(&C));
    dt_embed_free(x);
}

/* Two tables and two features; rank `who` changes one field. */
typedef struct change { const char *what; int field; double value; const char *want; } change;

static dt_status make_mixed(dt_comm *c, const change *ch, int who, dt_embed **out) {
    dt_embed_table_desc t[3];
    dt_embed_feature_desc f[2];
    dt_embed_desc d;
    memset(t, 0, sizeof t);
    memset(f, 0, sizeof f);
    t[0].name = "C0"; t[0].rows = 100; t[0].dim = 16;
    t[1].name = "C1"; t[1].rows = 50; t[1].dim = 16; t[1].dynamic = 1; t[1].hash_shards = 4;
    t[2].name = "C2"; t[2].rows = 10; t[2].dim = 4;
    f[0].name = "f0"; f[0].table = 0; f[1].name = "f1"; f[1].table = 1;
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = 2; d.features = f; d.n_features = 2; d.comm = c; d.seed = 5;
    if (R == who)
        switch (ch->field) {
        case 0: t[1].dim = (int)ch->value; break;
        case 1: t[0].rows = (int64_t)ch->value; break;
        case 2: t[0].optim.lr = ch->value; break;
        case 3: t[1].hash_shards = (int)ch->value; break;
        case 4: d.seed = (uint64_t)ch->value; break;
        case 5: f[1].table = (int)ch->value; break;
        case 6: t[1].name = "X1"; break;
        case 7: t[0].dtype = DT_BF16; break;
        case 8: t[0].sharding = DT_SHARD_TABLE; t[0].pin_owner = 1; t[0].owner = (int)ch->value; break;
        case 9: d.n_tables = 3; break;
        case 10: t[1].dim = 0; break; /* invalid on that rank alone */
        case 11: d.n_tables = 0; break;
        case 12: d.n_inputs = 1; break; /* both features read kjt feature 0 (features[f].input = 0) */
        default: break;
        }
    *out = NULL;
    return dt_embed_create(&C, out, &d);
}

static void mismatched_descs(dt_comm *world) {
    static const change ch[] = {
        {"dim", 0, 32, "tables[1] (\"C1\").dim = 16 on rank 0 but 32 on rank 1"},
        {"rows", 1, 101, "tables[0] (\"C0\").rows = 100 on rank 0 but 101 on rank 1"},
        {"lr", 2, 0.5, "tables[0] (\"C0\").optim.lr = 0 on rank 0 but 0.5 on rank 1"},
        {"hash_shards", 3, 8, "tables[1] (\"C1\").hash_shards = 4 on rank 0 but 8 on rank 1"},
        {"seed", 4, 6, "desc.seed = 5 on rank 0 but 6 on rank 1"},
        {"feature_table", 5, 0, "features[1].table = 1 on rank 0 but 0 on rank 1"},
        {"name", 6, 0, "tables[1] (\""},
        {"dtype", 7, 0, "tables[0] (\"C0\").dtype = 0 on rank 0 but"},
        {"pinned_owner", 8, 0, "tables[0] (\"C0\").sharding = 0 on rank 0 but"},
        {"table_count", 9, 0, "desc.n_tables = "},
        {"feature_input", 12, 0, "features[1].input = 1 on rank 0 but 0 on rank 1"},
    };
    size_t i;
    for (i = 0; i < sizeof ch / sizeof ch[0]; i++) {
        dt_embed *e;
        dt_status st = make_mixed(world, &ch[i], 1, &e);
        char name[128];
        snprintf(name, sizeof name, "embed_create_names_a_%s_differing_between_ranks", ch[i].what);
        dt_test_check_all(name, st == DT_ERR_ARG && e == NULL && strstr(dt_ctx_error(&C), ch[i].want) != NULL,
                          "status %d, message \"%s\", want DT_ERR_ARG mentioning \"%s\"", (int)st, dt_ctx_error(&C),
                          ch[i].want);
        dt_embed_free(e);
    }
    {   /* a desc invalid on one rank only: that rank names it, the others point at it; nobody hangs */
        static const change bad = {"bad", 10, 0, ""};
        dt_embed *e;
        dt_status st = make_mixed(world, &bad, W - 1, &e);
        dt_test_check_all("embed_create_bad_desc_on_one_rank_fails_on_every_rank", st == DT_ERR_ARG && e == NULL &&
                          strstr(dt_ctx_error(&C), R == W - 1 ? "dim = 0" : "another rank") != NULL,
                          "status %d, message \"%s\"", (int)st, dt_ctx_error(&C));
        dt_embed_free(e);
    }
    {   /* the same for a desc that fails the first checks (no tables) */
        static const change bad = {"bad", 11, 0, ""};
        dt_embed *e;
        dt_status st = make_mixed(world, &bad, 0, &e);
        dt_test_check_all("embed_create_no_tables_on_one_rank_fails_on_every_rank", st == DT_ERR_ARG && e == NULL &&
                          strstr(dt_ctx_error(&C), R == 0 ? "n_tables = 0" : "another rank") != NULL,
                          "status %d, message \"%s\"", (int)st, dt_ctx_error(&C));
        dt_embed_free(e);
    }
    {   /* and equal descs still create */
        static const change none = {"none", -1, 0, ""};
        dt_embed *e;
        dt_status st = make_mixed(world, &none, 1, &e);
        dt_test_check_all("embed_create_equal_descs_pass_the_check", st == DT_OK && e != NULL, "status %d: %s", (int)st,
                          dt_ctx_error(&C));
        dt_embed_free(e);
    }
}

int main(void) {
    dt_comm *world, *self;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    dt_comm_split(world, &self, R, 0);
    accumulation(world, self, DT_EVICT_LRU, 1);
    accumulation(world, self, DT_EVICT_LFU, 1);
    accumulation(world, self, DT_EVICT_LRU, 2);
    checkpoint_other_hash_shards(world);
    if (W >= 2) mismatched_descs(world);
    dt_comm_free(self);
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
