// np: 1 2 3 4
/* tests/mpi_embed_dynamic.c - dynamic tables (any 64-bit id, admission after 2 sightings, a
   capacity smaller than the ids seen, LRU eviction) sharded over the world against the same
   table in a private group of one: the lookups, the slots (ids and values) and the counts of
   admitted, evicted and rejected ids must be equal at every world size. Then a checkpoint saved
   at the world size loads in groups of 1, 2 and 3 ranks and continues exactly as the
   single-rank table reloaded from the same checkpoint. All of it twice: LRU, then LFU eviction.
   LFU also against a hand-derived sequence of admissions, evictions (by count, ties by least
   recent use) and rejections (the victim was used in the same forward), and the same sequence
   resumed from a checkpoint saved halfway (the counts must come back). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;
static int R, W;
static dt_embed_eviction EVICT; /* of the tables make() builds */

static const char *nm(const char *base) { /* the test name, "_lfu" for the LFU pass */
    static char buf[160];
    snprintf(buf, sizeof buf, "%s%s", base, EVICT == DT_EVICT_LFU ? "_lfu" : "");
    return buf;
}

#define GB 10
#define NIDS 40

static dt_embed *make(dt_comm *c) {
    dt_embed_table_desc t[2];
    dt_embed_desc d;
    dt_embed_feature_desc f[3];
    dt_embed *e = NULL;
    memset(t, 0, sizeof t);
    memset(f, 0, sizeof f);
    f[0].table = 0; f[1].table = 1; f[2].table = 0; /* "dyn" serves features 0 and 2 */
    t[0].name = "dyn"; t[0].rows = 24; t[0].dim = 4; t[0].dynamic = 1; t[0].admit_after = 2; t[0].hash_shards = 8;
    t[0].optim.kind = DT_EMBED_ADAGRAD; t[0].weighted = 1;
    t[1].name = "dynseq"; t[1].rows = 17; t[1].dim = 3; t[1].dynamic = 1; t[1].hash_shards = 5;
    t[1].pooling = DT_POOL_NONE; t[1].optim.kind = DT_EMBED_ADAM;
    t[0].eviction = t[1].eviction = EVICT;
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = 2; d.features = f; d.n_features = 3; d.comm = c; d.seed = 3;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

static int64_t LEN[3 * GB], IDS[3 * GB * 4];
static float WTS[3 * GB * 4];

/* Samples [b0, b0 + n) of step s: 0..3 ids per bag from NIDS large ids, small ones frequent. */
static void batch(dt_kjt *k, int s, int64_t b0, int64_t n) {
    int f;
    int64_t b, j, o = 0;
    for (f = 0; f < 3; f++)
        for (b = 0; b < n; b++) {
            int64_t len = (int64_t)(dt_rng_uniform(10 + s, (uint64_t)f, (uint64_t)(b0 + b)) * 4.0f);
            LEN[f * n + b] = len;
            for (j = 0; j < len; j++) {
                float u = dt_rng_uniform(20 + s, (uint64_t)(f * 8 + j), (uint64_t)(b0 + b));
                int64_t k2 = (int64_t)(u * u * NIDS);
                IDS[o] = (int64_t)((uint64_t)(k2 + 1) * 0x9E3779B97F4A7C15ull); /* any 64-bit value, negative too */
                WTS[o] = 1.0f + 0.25f * (float)j;
                o++;
            }
        }
    memset(k, 0, sizeof *k);
    k->n_features = 3; k->batch = n; k->lengths = LEN; k->ids = IDS; k->weights = WTS;
}

static void slice(int r, int w, int64_t *b0, int64_t *n) {
    *b0 = (GB * (int64_t)r) / w;
    *n = (GB * (int64_t)(r + 1)) / w - *b0;
}

/* Forward + backward of step s. ahead: step s was begun already; its end is followed by the
   begin of step s + 1 before this backward (the overlapped order). */
static dt_status step(dt_embed *e, dt_tensor *out, int s, int64_t b0, int64_t n, int ahead) {
    dt_kjt k;
    dt_tensor dout, g;
    int64_t b, c, skip = 0, j;
    dt_status st;
    if (ahead) {
        if ((st = dt_embed_forward_end(e, out))) return st;
        batch(&k, s + 1, b0, n);
        if ((st = dt_embed_forward_begin(e, &k))) return st;
    } else {
        batch(&k, s, b0, n);
        if ((st = dt_embed_forward(e, out, &k))) return st;
    }
    dout = dt_test_t2(&C, n, 8);
    for (b = 0; b < n; b++)
        for (c = 0; c < 8; c++) ((float *)dout.data)[b * 8 + c] = dt_rng_normal(30 + s, (uint64_t)c, (uint64_t)(b0 + b));
    dt_embed_sequence_grad(e, &g, 1);
    for (b = 0; b < b0; b++) skip += (int64_t)(dt_rng_uniform(10 + s, 1, (uint64_t)b) * 4.0f);
    for (j = 0; j < g.numel; j++) ((float *)g.data)[j] = dt_rng_normal(40 + s, (uint64_t)(j % 3), (uint64_t)(skip + j / 3));
    st = dt_embed_backward(e, &dout);
    dt_tensor_free(&C, &dout);
    return st;
}

/* Bitwise: e's local slots (values) equal ref's same global slots. */
static int64_t diff_slots(dt_embed *e, dt_embed *ref) {
    int t;
    int64_t bad = 0;
    for (t = 0; t < 2; t++) {
        dt_tensor a, b;
        int64_t r0, rr;
        dt_embed_local_shard(e, &a, &r0, NULL, t);
        dt_embed_local_shard(ref, &b, &rr, NULL, t);
        if (a.numel && memcmp(a.data, (const float *)b.data + r0 * a.shape[1], (size_t)a.numel * 4) != 0) bad++;
    }
    return bad;
}

static void run(dt_embed *e, dt_embed *ref, int s0, int s1, int64_t b0, int64_t n, int64_t *bad_out, int64_t *bad_seq,
                double cnt[6]) {
    dt_tensor out = dt_test_t2(&C, n, 8), rout = dt_test_t2(&C, GB, 8);
    int s;
    for (s = s0; s < s1; s++) {
        dt_embed_stats a, r;
        memset(&a, 0, sizeof a);
        memset(&r, 0, sizeof r);
        dt_tensor sq, rsq;
        if (step(e, &out, s, b0, n, 0) || step(ref, &rout, s, 0, GB, 0)) {
            dt_test_fail("embed_dynamic_step_runs", "step %d: %s", s, dt_ctx_error(&C));
            break;
        }
        if (memcmp(out.data, (float *)rout.data + b0 * 8, (size_t)n * 32) != 0) (*bad_out)++;
        dt_embed_sequence(e, &sq, 1);
        dt_embed_sequence(ref, &rsq, 1);
        {
            int64_t skip = 0, b;
            for (b = 0; b < b0; b++) skip += LEN[GB + b];
            if (sq.numel && memcmp(sq.data, (float *)rsq.data + skip * 3, (size_t)sq.numel * 4) != 0) (*bad_seq)++;
        }
        dt_embed_stats_get(e, &a);
        dt_embed_stats_get(ref, &r);
        cnt[0] += (double)a.step_admitted; cnt[1] += (double)a.step_evicted; cnt[2] += (double)a.step_rejected;
        if (R == 0) { cnt[3] += (double)r.step_admitted; cnt[4] += (double)r.step_evicted; cnt[5] += (double)r.step_rejected; }
    }
    dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &rout);
}

/* Each batch begun before the previous one's backward (dt_embed_forward_begin ahead): the same
   lookups, admissions and rows as the plain order, since rows are gathered (and ids admitted)
   at the end, after the previous update. A second begin without its end is DT_ERR_STATE. */
static void ahead_equals_plain(dt_comm *world, dt_comm *self, int64_t b0, int64_t n) {
    dt_embed *e = make(world), *ref = make(self);
    dt_tensor out = dt_test_t2(&C, n, 8), rout = dt_test_t2(&C, GB, 8);
    dt_kjt k;
    dt_status st2;
    int s;
    int64_t bad = 0;
    batch(&k, 0, b0, n);
    if (dt_embed_forward_begin(e, &k)) dt_test_fail(nm("embed_dynamic_ahead_runs"), "%s", dt_ctx_error(&C));
    for (s = 0; s < 6; s++) {
        if (step(e, &out, s, b0, n, 1) || step(ref, &rout, s, 0, GB, 0)) {
            dt_test_fail(nm("embed_dynamic_ahead_runs"), "step %d: %s", s, dt_ctx_error(&C));
            break;
        }
        if (n && memcmp(out.data, (float *)rout.data + b0 * 8, (size_t)n * 32) != 0) bad++;
    }
    batch(&k, 6, b0, n);
    st2 = dt_embed_forward_begin(e, &k); /* step 6 is begun already */
    if (dt_embed_forward_end(e, &out)) dt_test_fail(nm("embed_dynamic_ahead_runs"), "end: %s", dt_ctx_error(&C));
    batch(&k, 6, 0, GB);
    if (dt_embed_forward(ref, &rout, &k)) dt_test_fail(nm("embed_dynamic_ahead_runs"), "ref: %s", dt_ctx_error(&C));
    if (n && memcmp(out.data, (float *)rout.data + b0 * 8, (size_t)n * 32) != 0) bad++;
    bad += diff_slots(e, ref);
    dt_test_check_all(nm("embed_dynamic_begin_ahead_of_backward_equals_plain_order"), bad == 0,
                      "%lld steps or tables differ", (long long)bad);
    dt_test_check_all(nm("embed_dynamic_second_begin_without_end_is_a_state_error"), st2 == DT_ERR_STATE,
                      "status %d (%s)", (int)st2, dt_ctx_error(&C));
    dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &rout);
    dt_embed_free(e);
    dt_embed_free(ref);
}

static void suite(dt_comm *world, dt_comm *self, int64_t b0, int64_t n) {
    dt_comm *grp;
    dt_embed *e, *ref;
    int64_t bad_out = 0, bad_seq = 0, bad;
    double cnt[6] = {0, 0, 0, 0, 0, 0};
    dt_checkpoint_desc cd;
    char dir[1024];
    int g;
    ahead_equals_plain(world, self, b0, n);
    e = make(world);
    ref = make(self);
    run(e, ref, 0, 8, b0, n, &bad_out, &bad_seq, cnt);
    dt_comm_allreduce_f64(world, cnt, 6, DT_REDUCE_SUM);
    dt_test_check_all(nm("embed_dynamic_lookups_equal_single_rank"), bad_out == 0 && bad_seq == 0,
                      "%lld pooled and %lld sequence steps differ", (long long)bad_out, (long long)bad_seq);
    dt_test_check_all(nm("embed_dynamic_admit_evict_reject_counts_equal_single_rank"),
                      cnt[0] == cnt[3] && cnt[1] == cnt[4] && cnt[2] == cnt[5] && cnt[1] > 0 && cnt[2] > 0,
                      "world admitted %g evicted %g rejected %g; single rank %g %g %g (evicted and rejected must be > 0)",
                      cnt[0], cnt[1], cnt[2], cnt[3], cnt[4], cnt[5]);
    bad = diff_slots(e, ref);
    dt_test_check_all(nm("embed_dynamic_slots_equal_single_rank"), bad == 0, "%lld tables differ", (long long)bad);

    snprintf(dir, sizeof dir, "%s/mpi_embed_dynamic_np%d_%d", dt_test_tmpdir(), W, (int)EVICT);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.comm = world;
    if (dt_embed_checkpoint_save(e, NULL, &cd)) dt_test_fail(nm("embed_dynamic_checkpoint_save"), "%s", dt_ctx_error(&C));
    for (g = 1; g <= 3 && g <= W; g++) {
        int in_full = (R / g + 1) * g <= W;
        char name[96];
        bad = 0;
        dt_comm_split(world, &grp, in_full ? R / g : -1, R);
        if (grp) {
            dt_embed *x = make(grp);
            int64_t sb0, sn, bo = 0, bs = 0;
            double c2[6] = {0, 0, 0, 0, 0, 0};
            cd.comm = grp;
            if (dt_embed_checkpoint_load(x, NULL, &cd)) dt_test_fail(nm("embed_dynamic_checkpoint_load"), "%s", dt_ctx_error(&C));
            cd.comm = self;
            if (dt_embed_checkpoint_load(ref, NULL, &cd)) dt_test_fail(nm("embed_dynamic_checkpoint_load_ref"), "%s", dt_ctx_error(&C));
            bad = diff_slots(x, ref);
            slice(dt_comm_rank(grp), g, &sb0, &sn);
            run(x, ref, 8, 11, sb0, sn, &bo, &bs, c2);
            bad += bo + bs + diff_slots(x, ref);
            dt_embed_free(x);
            dt_comm_free(grp);
        }
        snprintf(name, sizeof name, "embed_dynamic_checkpoint_np%d_loads_and_continues_at_np%d%s", W, g,
                 EVICT == DT_EVICT_LFU ? "_lfu" : "");
        dt_test_check_all(name, bad == 0, "%lld differences from the single-rank table", (long long)bad);
    }
    dt_embed_free(e);
    dt_embed_free(ref);
}

/* ---------------------------------------------------------------- LFU by hand
   One id-hash shard of 3 slots, one id per sample. Per forward: the global ids and the expected
   (admitted, evicted, rejected) summed over ranks, derived by hand. Counts after step 5: A 2,
   B 2, C 1 (stamps A 2, B 5, C 4): D evicts C (LRU would evict A); C comes back evicting D
   (count 1); A is still there; E evicts B (counts A 3, B 2, C 2: the tie B / C goes to B, used
   less recently); B evicts E; in [C F G], F evicts B and G finds the victim F used by the same
   forward: rejected; G then evicts F. */
#define A_ 1001
static const int64_t SEQ[13][4] = {{1, A_}, {1, A_}, {1, A_ + 1}, {1, A_ + 2}, {1, A_ + 1}, {1, A_ + 3}, {1, A_ + 2},
                                   {1, A_}, {1, A_ + 2}, {1, A_ + 4}, {1, A_ + 1}, {3, A_ + 2, A_ + 5, A_ + 6}, {1, A_ + 6}};
static const int WANT[13][3] = {{1, 0, 0}, {0, 0, 0}, {1, 0, 0}, {1, 0, 0}, {0, 0, 0}, {1, 1, 0}, {1, 1, 0},
                                {0, 0, 0}, {0, 0, 0}, {1, 1, 0}, {1, 1, 0}, {1, 1, 1}, {1, 1, 0}};

static dt_embed *make_lfu(dt_comm *c) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(&t, 0, sizeof t);
    t.name = "lfu"; t.rows = 3; t.dim = 1; t.dynamic = 1; t.hash_shards = 1; t.eviction = DT_EVICT_LFU;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = c; d.seed = 9;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make_lfu: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* Forwards s0 .. s1-1 of SEQ on e (this rank's slice of each); the steps whose counts differ. */
static int run_seq(dt_embed *e, dt_comm *c, int s0, int s1, const char *where) {
    int s, bad = 0, w = dt_comm_size(c), r = dt_comm_rank(c);
    for (s = s0; s < s1; s++) {
        int64_t L = SEQ[s][0], b0 = L * r / w, n = L * (r + 1) / w - b0, len[4] = {1, 1, 1, 1}, b;
        double v[3];
        dt_kjt k;
        dt_tensor out = dt_test_t2(&C, n, 1);
        dt_embed_stats st;
        memset(&k, 0, sizeof k);
        k.n_features = 1; k.batch = n; k.lengths = len; k.ids = &SEQ[s][1 + b0];
        if (dt_embed_forward(e, &out, &k)) { dt_test_fail("embed_dynamic_lfu_runs", "%s", dt_ctx_error(&C)); exit(1); }
        for (b = 0; b < n; b++) /* a rejected id looks up 0, an admitted one its (non-zero) row */
            if ((((float *)out.data)[b] == 0) != (WANT[s][2] && SEQ[s][1 + b0 + b] == A_ + 6)) bad++;
        memset(&st, 0, sizeof st);
        dt_embed_stats_get(e, &st);
        v[0] = (double)st.step_admitted; v[1] = (double)st.step_evicted; v[2] = (double)st.step_rejected;
        dt_comm_allreduce_f64(c, v, 3, DT_REDUCE_SUM);
        if (v[0] != WANT[s][0] || v[1] != WANT[s][1] || v[2] != WANT[s][2]) {
            if (!bad) fprintf(stderr, "[rank %d] %s: forward %d: admitted %g evicted %g rejected %g; want %d %d %d\n", R,
                              where, s + 1, v[0], v[1], v[2], WANT[s][0], WANT[s][1], WANT[s][2]);
            bad++;
        }
        dt_tensor_free(&C, &out);
    }
    return bad;
}

static void lfu_by_hand(dt_comm *world, dt_comm *self) {
    dt_embed *e = make_lfu(world), *x;
    dt_checkpoint_desc cd;
    char dir[1024];
    int bad;
    snprintf(dir, sizeof dir, "%s/mpi_embed_dynamic_lfu_np%d", dt_test_tmpdir(), W);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.comm = world;
    bad = run_seq(e, world, 0, 5, "world");
    if (dt_embed_checkpoint_save(e, NULL, &cd)) dt_test_fail("embed_dynamic_lfu_checkpoint_save", "%s", dt_ctx_error(&C));
    bad += run_seq(e, world, 5, 13, "world");
    dt_test_check_all("embed_dynamic_lfu_evicts_least_frequent_then_least_recent_by_hand", bad == 0,
                      "%d forwards differ from the hand-derived counts", bad);
    dt_embed_free(e);
    /* resumed from the checkpoint of forward 5: here, and in a group of one */
    x = make_lfu(world);
    bad = dt_embed_checkpoint_load(x, NULL, &cd) ? 100 : run_seq(x, world, 5, 13, "resumed");
    dt_embed_free(x);
    x = make_lfu(self);
    cd.comm = self;
    bad += dt_embed_checkpoint_load(x, NULL, &cd) ? 100 : run_seq(x, self, 5, 13, "resumed at np 1");
    dt_embed_free(x);
    dt_test_check_all("embed_dynamic_lfu_resumed_from_checkpoint_evicts_the_same_ids", bad == 0,
                      "%d forwards differ from the hand-derived counts (%s)", bad, bad >= 100 ? dt_ctx_error(&C) : "");
    {   /* bad eviction values: named */
        dt_embed_table_desc t;
        dt_embed_desc d;
        dt_status st1, st2;
        char m1[512];
        memset(&t, 0, sizeof t);
        t.name = "fixed"; t.rows = 8; t.dim = 1; t.eviction = DT_EVICT_LFU; /* not dynamic */
        memset(&d, 0, sizeof d);
        d.tables = &t; d.n_tables = 1; d.comm = world;
        x = NULL;
        st1 = dt_embed_create(&C, &x, &d);
        snprintf(m1, sizeof m1, "%s", dt_ctx_error(&C));
        t.dynamic = 1; t.eviction = (dt_embed_eviction)7;
        st2 = dt_embed_create(&C, &x, &d);
        dt_test_check_all("embed_dynamic_bad_eviction_is_named", st1 == DT_ERR_ARG && st2 == DT_ERR_ARG && x == NULL &&
                          strstr(m1, "eviction = 2") && strstr(dt_ctx_error(&C), "eviction = 7"),
                          "statuses %d %d, messages \"%s\" / \"%s\"", (int)st1, (int)st2, m1, dt_ctx_error(&C));
    }
}

int main(void) {
    dt_comm *world, *self;
    int64_t b0, n;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    dt_comm_split(world, &self, R, 0);
    slice(R, W, &b0, &n);
    EVICT = DT_EVICT_LRU;
    suite(world, self, b0, n);
    EVICT = DT_EVICT_LFU;
    suite(world, self, b0, n);
    lfu_by_hand(world, self);
    dt_comm_free(self);
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
