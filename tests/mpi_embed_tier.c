// np: 1 2 3 4
// tsan: 2
/* tests/mpi_embed_tier.c - tiered tables (tier DISK: each rank's shard and optimizer state in a
   file, a cache of hot rows in memory) against the same tables resident, on the same ranks and
   plan: every kind of sharding (row, table, column, data-parallel, table-row, dynamic), every
   optimizer, f32 / bf16 / f16 rows, sum / mean / sequence pooling, weighted ids. The pooled
   outputs, the sequence rows and (after dt_embed_flush) the shards must be equal bit for bit at
   every step, for caches of all rows, 10% and 1% of them, LRU and LFU, with and without
   dt_embed_prefetch, with gradient accumulation, with logs of written-back rows so short (1 and 7
   records) that they fold into the table many times a step; checkpoints load from tiered into resident
   tables and back. A cache of exactly one step's distinct rows works; one row less is a named
   error on every rank. Bad descs and a forward of another batch than the prefetched one are
   named errors. (The resident tables equal a single rank's: tests/mpi_embed*.c.) The prefetch's
   lookups of static LRU tables run on its helper thread beside the update (the suite also runs
   this program under ThreadSanitizer: "// tsan: 2"); one config keeps them in the caller's. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;
static int R, W;

#define GB 24 /* global batch */
#define NT 6
#define PD (8 + 8 + 4 + 4 + 4) /* pooled dim: row 8, col 8, dp 4, trow 4, dyn 4 ("tab" is a sequence) */
static const int64_t ROWS[NT] = {20000, 10000, 8000, 2000, 12000, 4000};
static const int DIM[NT] = {8, 4, 8, 4, 4, 4};

typedef struct cfg {
    const char *name;
    int frac;                     /* cache_rows = rows / frac (at least one batch's ids); 1 = all rows */
    dt_embed_eviction evict;
    int prefetch, accum;
    int64_t log_rows;             /* tier DISK's log of written-back rows (0: as many as rows; small: many folds) */
} cfg;

static dt_embed *make(dt_comm *c, const cfg *k, dt_status *st_out, const char *dir) {
    dt_embed_table_desc t[NT];
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_status st;
    int i;
    memset(t, 0, sizeof t);
    t[0].name = "row"; t[0].sharding = DT_SHARD_ROW; t[0].optim.kind = DT_EMBED_ADAGRAD; t[0].weighted = 1;
    t[1].name = "tab"; t[1].sharding = DT_SHARD_TABLE; t[1].pin_owner = 1; t[1].owner = W - 1;
    t[1].optim.kind = DT_EMBED_ADAM; t[1].pooling = DT_POOL_NONE;
    t[2].name = "col"; t[2].sharding = DT_SHARD_COLUMN; t[2].dtype = DT_BF16; t[2].pooling = DT_POOL_MEAN;
    t[3].name = "dp"; t[3].sharding = DT_SHARD_DATA; t[3].optim.kind = DT_EMBED_ROWWISE_ADAGRAD;
    t[4].name = "trow"; t[4].sharding = DT_SHARD_TABLE_ROW; t[4].group_size = W % 2 == 0 ? 2 : W;
    t[4].optim.kind = DT_EMBED_ROWWISE_ADAGRAD; t[4].dtype = DT_F16;
    t[5].name = "dyn"; t[5].dynamic = 1; t[5].hash_shards = 8; t[5].optim.kind = DT_EMBED_ADAGRAD;
    for (i = 0; i < NT; i++) {
        t[i].rows = ROWS[i];
        t[i].dim = DIM[i];
        if (k) {
            int64_t cr = ROWS[i] / k->frac;
            t[i].tier = DT_TIER_DISK;
            t[i].cache_rows = cr < 3 * GB ? 3 * GB : cr; /* at least a global batch's ids (<= 3 per bag) */
            t[i].cache_eviction = k->evict;
            t[i].log_rows = k->log_rows;
        }
    }
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = NT; d.comm = c; d.seed = 11; d.tier_dir = dir;
    st = dt_embed_create(&C, &e, &d);
    if (st_out) { *st_out = st; return e; }
    if (st) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* The batch of step s, samples [b0, b0 + n) of the global batch, into buffer set s % 2 (so that
   the batch given to dt_embed_prefetch stays intact while the current one is in use). 0..3 ids
   per bag, power-law: row = u^3 x rows (few hot rows, a long tail); dynamic ids from 6000 keys. */
static int64_t LEN[2][NT * GB], IDS[2][NT * GB * 3];
static float WTS[2][NT * GB * 3];
static void batch(dt_kjt *k, int s, int64_t b0, int64_t n) {
    int f, q = s & 1;
    int64_t b, j, o = 0;
    for (f = 0; f < NT; f++)
        for (b = 0; b < n; b++) {
            int64_t len = (int64_t)(dt_rng_uniform(100 + s, (uint64_t)f, (uint64_t)(b0 + b)) * 4.0f);
            LEN[q][f * n + b] = len;
            for (j = 0; j < len; j++) {
                float u = dt_rng_uniform(200 + s, (uint64_t)(f * 8 + j), (uint64_t)(b0 + b));
                int64_t x = (int64_t)(u * u * u * (float)(f == 5 ? 6000 : ROWS[f]));
                IDS[q][o] = f == 5 ? (int64_t)((uint64_t)(x + 1) * 0x9E3779B97F4A7C15ull) : x;
                WTS[q][o] = 0.5f + 0.25f * (float)j;
                o++;
            }
        }
    memset(k, 0, sizeof *k);
    k->n_features = NT; k->batch = n; k->lengths = LEN[q]; k->ids = IDS[q]; k->weights = WTS[q];
}

/* A few steps. tiered: prefetch the next batch after each forward when asked; accum: pairs of
   micro-batches (sync 0, then 1). Returns the steps whose outputs differ (or -1 on an error). */
static int64_t run(dt_embed *e, dt_embed *ref, const cfg *k, int s0, int s1, int64_t b0, int64_t n) {
    dt_tensor out = dt_test_t2(&C, n, PD), rout = dt_test_t2(&C, n, PD), dout = dt_test_t2(&C, n, PD), g, gr, sq, rsq;
    int64_t bad = 0, b, c, j;
    int s, which;
    dt_kjt kj;
    for (s = s0; s < s1; s++) {
        for (which = 0; which < 2; which++) {
            dt_embed *x = which ? ref : e;
            int pf = !which && k && k->prefetch;
            int sync = !(k && k->accum) || (s & 1);
            batch(&kj, s, b0, n);
            if (dt_embed_set_sync(x, sync) || dt_embed_forward(x, which ? &rout : &out, &kj)) goto fail;
            if (pf && s + 1 < s1) { /* the next batch's rows come while this step runs */
                dt_kjt nx;
                batch(&nx, s + 1, b0, n);
                if (dt_embed_prefetch(x, &nx)) goto fail;
            }
        }
        if (memcmp(out.data, rout.data, (size_t)(n * PD) * 4) != 0) bad++;
        dt_embed_sequence(e, &sq, 1);
        dt_embed_sequence(ref, &rsq, 1);
        if (sq.numel != rsq.numel || (sq.numel && memcmp(sq.data, rsq.data, (size_t)sq.numel * 4) != 0)) bad++;
        for (b = 0; b < n; b++)
            for (c = 0; c < PD; c++) ((float *)dout.data)[b * PD + c] = dt_rng_normal(300 + s, (uint64_t)c, (uint64_t)(b0 + b));
        dt_embed_sequence_grad(e, &g, 1);
        dt_embed_sequence_grad(ref, &gr, 1);
        for (j = 0; j < g.numel; j++) ((float *)g.data)[j] = ((float *)gr.data)[j] = dt_rng_normal(400 + s, 0, (uint64_t)j);
        if (dt_embed_backward(e, &dout) || dt_embed_backward(ref, &dout)) goto fail;
    }
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &rout); dt_tensor_free(&C, &dout);
    return bad;
fail:
    dt_test_fail("embed_tier_steps_run", "%s", dt_ctx_error(&C));
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &rout); dt_tensor_free(&C, &dout);
    return -1;
}

/* After dt_embed_flush: every local shard (the slow tier) equals the resident one, bit for bit. */
static int64_t diff_shards(dt_embed *e, dt_embed *ref) {
    int t;
    int64_t bad = 0;
    if (dt_embed_flush(e)) return 99;
    for (t = 0; t < NT; t++) {
        dt_tensor a, b;
        dt_embed_local_shard(e, &a, NULL, NULL, t);
        dt_embed_local_shard(ref, &b, NULL, NULL, t);
        if (a.numel != b.numel || (a.numel && memcmp(a.data, b.data, dt_tensor_bytes(&a)) != 0)) bad++;
    }
    return bad;
}

static void slice(int64_t *b0, int64_t *n) {
    *b0 = (GB * (int64_t)R) / W;
    *n = (GB * (int64_t)(R + 1)) / W - *b0;
}

static void equivalence(dt_comm *world, const cfg *k) {
    char name[160];
    int64_t b0, n, bad, shards;
    double st[6] = {0, 0, 0, 0, 0, 0};
    int t;
    dt_embed *e = make(world, k, NULL, dt_test_tmpdir()), *ref = make(world, NULL, NULL, NULL);
    slice(&b0, &n);
    bad = run(e, ref, k, 0, 8, b0, n);
    shards = diff_shards(e, ref);
    for (t = 0; t < NT; t++) {
        dt_embed_tier_stats ts;
        dt_embed_tier_stats_get(e, t, &ts);
        st[0] += (double)ts.misses; st[1] += (double)ts.evicted; st[2] += (double)ts.prefetched;
        st[3] += (double)ts.hits; st[4] += (double)ts.written_back; st[5] += (double)ts.folds;
    }
    dt_comm_allreduce_f64(world, st, 6, DT_REDUCE_SUM);
    snprintf(name, sizeof name, "embed_tier_%s_equals_resident_bit_for_bit", k->name);
    dt_test_check_all(name, bad == 0 && shards == 0, "%lld steps' outputs and %lld shards differ from the resident "
                      "tables", (long long)bad, (long long)shards);
    snprintf(name, sizeof name, "embed_tier_%s_counts", k->name);
    if (k->frac == 1)
        dt_test_check_all(name, st[0] > 0 && st[1] == 0 && st[3] > 0, "misses %g evicted %g hits %g; expected "
                          "misses > 0, no eviction (the cache holds every row), hits > 0", st[0], st[1], st[3]);
    else
        dt_test_check_all(name, st[0] > 0 && st[1] > 0 && st[4] > 0 && (!k->prefetch || st[2] > 0),
                          "misses %g evicted %g prefetched %g written back %g; expected all > 0 (prefetched: with "
                          "prefetch)", st[0], st[1], st[2], st[4]);
    if (k->log_rows > 0) { /* the log filled and was folded while training, not only by the flush */
        snprintf(name, sizeof name, "embed_tier_%s_folds_while_training", k->name);
        dt_test_check_all(name, st[5] > (double)NT * W, "folds %g on %d ranks x %d tables; expected more than the "
                          "flush's one a table", st[5], W, NT);
    }
    dt_embed_free(e);
    dt_embed_free(ref);
}

/* A checkpoint of the tiered tables loads into resident ones (and back) and both continue equal. */
static void checkpoints(dt_comm *world) {
    cfg k = {"ckpt", 100, DT_EVICT_LRU, 1, 0, 0};
    dt_embed *e = make(world, &k, NULL, dt_test_tmpdir()), *ref = make(world, NULL, NULL, NULL);
    dt_checkpoint_desc cd;
    dt_train_state ts;
    char dir[1024];
    int64_t b0, n, bad = 0;
    dt_status s1, s2;
    slice(&b0, &n);
    bad += run(e, ref, &k, 0, 3, b0, n) != 0;
    snprintf(dir, sizeof dir, "%s/tier_ckpt", dt_test_tmpdir());
    memset(&cd, 0, sizeof cd);
    cd.dir = dir; cd.comm = world;
    memset(&ts, 0, sizeof ts);
    ts.step = 3;
    s1 = dt_embed_checkpoint_save(e, &ts, &cd);
    dt_embed_free(ref);
    ref = make(world, NULL, NULL, NULL);
    s2 = dt_embed_checkpoint_load(ref, NULL, &cd); /* tiered -> resident */
    if (s1 || s2) dt_test_fail("embed_tier_checkpoint_runs", "%s", dt_ctx_error(&C));
    bad += run(e, ref, &k, 3, 6, b0, n) != 0;
    ts.step = 6;
    s1 = dt_embed_checkpoint_save(ref, &ts, &cd);
    dt_embed_free(e);
    e = make(world, &k, NULL, dt_test_tmpdir());
    s2 = dt_embed_checkpoint_load(e, NULL, &cd); /* resident -> tiered */
    if (s1 || s2) dt_test_fail("embed_tier_checkpoint_runs", "%s", dt_ctx_error(&C));
    bad += run(e, ref, &k, 6, 9, b0, n) != 0;
    bad += diff_shards(e, ref);
    dt_test_check_all("embed_tier_checkpoints_load_either_way_and_continue_equal", bad == 0,
                      "%lld runs or shards differ", (long long)bad);
    dt_embed_free(e);
    dt_embed_free(ref);
}

/* One table-wise table on rank 0; every global batch holds D distinct ids, one per sample: a
   cache of D rows trains equal to the resident table, D - 1 rows is DT_ERR_RANGE on every rank,
   naming cache_rows. */
#define D GB
static dt_embed *one(dt_comm *c, int64_t cache) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(&t, 0, sizeof t);
    t.name = "one"; t.rows = 1000; t.dim = 4; t.sharding = DT_SHARD_TABLE; t.pin_owner = 1; t.owner = 0;
    t.optim.kind = DT_EMBED_ADAGRAD;
    if (cache) { t.tier = DT_TIER_DISK; t.cache_rows = cache; }
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = c; d.seed = 5; d.tier_dir = dt_test_tmpdir();
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "one: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}
static dt_status one_step(dt_embed *e, int s, int64_t b0, int64_t n, dt_tensor *out) {
    int64_t len[GB], ids[GB], b;
    dt_kjt k;
    dt_tensor dout;
    dt_status st;
    for (b = 0; b < n; b++) { len[b] = 1; ids[b] = ((b0 + b) * 37 + s * 101) % 1000; } /* D distinct per step */
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = n; k.lengths = len; k.ids = ids;
    if ((st = dt_embed_forward(e, out, &k))) return st;
    dout = dt_test_t2(&C, n, 4);
    for (b = 0; b < n * 4; b++) ((float *)dout.data)[b] = 0.1f * (float)(b % 7) - 0.3f;
    st = dt_embed_backward(e, &dout);
    dt_tensor_free(&C, &dout);
    return st;
}
static void one_batch(dt_comm *world) {
    int64_t b0, n, bad = 0;
    int s;
    dt_embed *e, *ref = one(world, 0);
    dt_tensor out, rout;
    dt_status st;
    slice(&b0, &n);
    out = dt_test_t2(&C, n, 4); rout = dt_test_t2(&C, n, 4);
    e = one(world, D);
    for (s = 0; s < 5; s++) {
        if (one_step(e, s, b0, n, &out) || one_step(ref, s, b0, n, &rout)) { bad = -1; break; }
        if (memcmp(out.data, rout.data, (size_t)n * 16) != 0) bad++;
    }
    dt_test_check_all("embed_tier_cache_of_one_batch_equals_resident", bad == 0, "%lld steps differ (%s)",
                      (long long)bad, bad < 0 ? dt_ctx_error(&C) : "");
    dt_embed_free(e);
    e = one(world, D - 1);
    st = one_step(e, 0, b0, n, &out);
    dt_test_check_all("embed_tier_cache_smaller_than_a_batch_is_named_on_every_rank",
                      st == DT_ERR_RANGE && (R != 0 || strstr(dt_ctx_error(&C), "cache_rows") != NULL),
                      "status %d: %s", (int)st, dt_ctx_error(&C));
    dt_embed_free(e);
    dt_embed_free(ref);
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &rout);
}

static void bad_inputs(dt_comm *world) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_status st;
    memset(&t, 0, sizeof t);
    t.name = "bad"; t.rows = 100; t.dim = 4;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = world;
    t.tier = DT_TIER_DISK; t.cache_rows = -1;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_negative_cache_rows_is_named", st, dt_ctx_error(&C), "cache_rows = -1");
    t.tier = DT_TIER_NONE; t.cache_rows = 10;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_cache_rows_without_a_tier_is_named", st, dt_ctx_error(&C), "cache_rows = 10");
    t.cache_rows = 0; t.cache_eviction = DT_EVICT_LFU;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_cache_eviction_without_a_tier_is_named", st, dt_ctx_error(&C), "cache_eviction");
    t.cache_eviction = DT_EVICT_DEFAULT; t.tier = (dt_embed_tier)77;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_unknown_tier_is_named", st, dt_ctx_error(&C), "tier = 77");
    t.tier = DT_TIER_HOST;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_host_on_cpu_tables_is_named", st, dt_ctx_error(&C), "tier = HOST");
    t.tier = DT_TIER_DISK; t.log_rows = -3;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_negative_log_rows_is_named", st, dt_ctx_error(&C), "log_rows = -3");
    t.tier = DT_TIER_NONE; t.log_rows = 5;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_log_rows_without_tier_disk_is_named", st, dt_ctx_error(&C), "log_rows = 5");
    t.log_rows = 0;
    t.tier = DT_TIER_DISK; d.tier_dir = "/nonexistent/dt-tier-dir";
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_tier_unwritable_tier_dir_is_named", st, dt_ctx_error(&C), "tier_dir");
    if (e) dt_embed_free(e);
    {   /* a forward of another batch than the prefetched one: DT_ERR_ARG on every rank */
        cfg k = {"pf", 10, DT_EVICT_LRU, 1, 0, 0};
        dt_embed *x = make(world, &k, NULL, dt_test_tmpdir());
        int64_t b0, n;
        dt_kjt k0, k1;
        dt_tensor out;
        slice(&b0, &n);
        out = dt_test_t2(&C, n, PD);
        batch(&k0, 0, b0, n);
        st = dt_embed_forward(x, &out, &k0);
        batch(&k1, 1, b0, n);
        if (!st) st = dt_embed_prefetch(x, &k1);
        if (st) dt_test_fail("embed_tier_prefetch_runs", "%s", dt_ctx_error(&C));
        batch(&k1, 2, b0, n); /* not the prefetched batch on rank 0 */
        if (R != 0) batch(&k1, 1, b0, n);
        st = dt_embed_forward(x, &out, &k1);
        dt_test_check_all("embed_tier_forward_of_another_batch_than_prefetched_is_named", st == DT_ERR_ARG &&
                          strstr(dt_ctx_error(&C), "prefetch") != NULL, "status %d: %s", (int)st, dt_ctx_error(&C));
        batch(&k1, 3, b0, n); /* and then the embedding goes on */
        st = dt_embed_forward(x, &out, &k1);
        dt_test_check_all("embed_tier_forward_after_a_refused_prefetch_runs", st == DT_OK, "%s", dt_ctx_error(&C));
        dt_tensor_free(&C, &out);
        dt_embed_free(x);
    }
}

int main(void) {
    dt_comm *world = NULL;
    static const cfg cfgs[] = {
        {"all_rows", 1, DT_EVICT_LRU, 0, 0, 0},
        {"tenth", 10, DT_EVICT_LRU, 0, 0, 0},
        {"hundredth", 100, DT_EVICT_LRU, 0, 0, 0},
        {"hundredth_prefetch", 100, DT_EVICT_LRU, 1, 0, 0},
        {"tenth_lfu_prefetch", 10, DT_EVICT_LFU, 1, 0, 0},
        {"hundredth_lfu", 100, DT_EVICT_LFU, 0, 0, 0},
        {"tenth_prefetch_accumulate", 10, DT_EVICT_LRU, 1, 1, 0},
        {"hundredth_prefetch_log_7", 100, DT_EVICT_LRU, 1, 0, 7},
        {"tenth_lfu_log_1", 10, DT_EVICT_LFU, 0, 1, 1},
    };
    size_t i;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    for (i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) equivalence(world, &cfgs[i]);
    { /* every lookup in dt_embed_prefetch's own thread (as LFU's are): the same rows */
        static const cfg k = {"hundredth_prefetch_lookups_in_caller", 100, DT_EVICT_LRU, 1, 0, 0};
        setenv("DT_EMBED_PREFETCH_SYNC", "1", 1);
        equivalence(world, &k);
        unsetenv("DT_EMBED_PREFETCH_SYNC");
    }
    checkpoints(world);
    one_batch(world);
    bad_inputs(world);
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
