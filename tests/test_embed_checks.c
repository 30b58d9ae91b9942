/* tests/test_embed_checks.c - dt_embed.h in one process, the checks an audit found missing:
   gradient accumulation on a dynamic table (an evicted id's pending gradient must not land on
   the id that takes its slot: the micro-batches admit, evict and update exactly as one batch),
   dt_embed_hash_id pinned to values computed independently (Python, the formula written out
   below), f16 table storage (forward = the stored halves widened; update within f16 rounding),
   named errors for eps = inf and for a table too large to allocate, for desc.dp_max_bytes = NaN
   (named, not blamed on batch_hint) and for admit_after / hash_shards on a static table,
   dt_embed_plan_format / _print given NULL (an empty string, nothing printed), and a dynamic
   table's checkpoint refused by a static table of the same name and shape. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

static dt_ctx C;

static dt_embed *dyn_table(int64_t rows, int shards, int admit, dt_embed_eviction ev, dt_embed_optim kind) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(&t, 0, sizeof t);
    t.name = "t"; t.rows = rows; t.dim = 2; t.dynamic = 1; t.hash_shards = shards; t.admit_after = admit;
    t.eviction = ev; t.optim.kind = kind; t.optim.lr = 1.0;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.seed = 3;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "dyn_table: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

static void lookup1(dt_embed *e, int64_t id, float v[2]) {
    int64_t len[1] = {1};
    dt_kjt k;
    dt_tensor o = dt_test_t2(&C, 1, 2);
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = 1; k.lengths = len; k.ids = &id;
    if (dt_embed_forward(e, &o, &k)) fprintf(stderr, "lookup1: %s\n", dt_ctx_error(&C));
    v[0] = ((float *)o.data)[0]; v[1] = ((float *)o.data)[1];
    dt_tensor_free(&C, &o);
}

/* The audit's case: capacity 16 = one slot per id-hash shard, X and Y in the same shard. One
   batch [X, Y]: X takes the slot, Y's victim is X (used by the batch): Y rejected, its row stays
   at its initial values. Micro-batches [X] then [Y] (Y's gradient 0) must do the same; before
   the fix the second micro-batch evicted X and Y's row received X's pending gradient. */
static void accumulation_keeps_pending_slots(void) {
    int64_t X = 42, Y = -1, x, len[1] = {1};
    uint64_t sh = dt_embed_hash_id(42) % 16;
    dt_embed *e = dyn_table(16, 16, 1, DT_EVICT_LRU, DT_EMBED_SGD), *fresh = dyn_table(16, 16, 1, DT_EVICT_LRU, DT_EMBED_SGD);
    dt_tensor o = dt_test_t2(&C, 1, 2);
    dt_kjt k;
    dt_embed_stats st;
    float y0[2], y1[2];
    int ok;
    for (x = 1000; Y < 0; x++) if (dt_embed_hash_id(x) % 16 == sh) Y = x;
    lookup1(fresh, Y, y0); /* Y's initial row */
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = 1; k.lengths = len;
    dt_embed_set_sync(e, 0);
    k.ids = &X;
    ok = !dt_embed_forward(e, &o, &k);
    ((float *)o.data)[0] = ((float *)o.data)[1] = 100;
    ok = ok && !dt_embed_backward(e, &o);
    dt_embed_set_sync(e, 1);
    k.ids = &Y;
    ok = ok && !dt_embed_forward(e, &o, &k);
    memset(&st, 0, sizeof st);
    dt_embed_stats_get(e, &st);
    ((float *)o.data)[0] = ((float *)o.data)[1] = 0;
    ok = ok && !dt_embed_backward(e, &o);
    lookup1(e, Y, y1);
    dt_test_check_all("embed_dynamic_accumulation_does_not_evict_a_slot_with_a_pending_gradient",
                      ok && st.step_rejected == 1 && st.step_evicted == 0 && y1[0] == y0[0] && y1[1] == y0[1],
                      "second micro-batch: admitted %lld evicted %lld rejected %lld (want 0 0 1); Y's row %g %g, its "
                      "initial row %g %g (%s)", (long long)st.step_admitted, (long long)st.step_evicted,
                      (long long)st.step_rejected, y1[0], y1[1], y0[0], y0[1], ok ? "ran" : dt_ctx_error(&C));
    dt_tensor_free(&C, &o);
    dt_embed_free(e);
    dt_embed_free(fresh);
}

/* Many ids over few slots (2 shards x 3 slots), 4 steps of 12 samples: one batch per step vs 3
   accumulated micro-batches of 4 consecutive samples. Lookups, every slot's value and the
   admitted / evicted / rejected totals must be equal bit for bit (LRU and LFU, admit_after 1
   and 2, SGD and Adagrad). */
static void accumulation_equals_one_batch(void) {
    static const char *evn[2] = {"lru", "lfu"};
    int v;
    for (v = 0; v < 8; v++) {
        dt_embed_eviction ev = (v & 1) ? DT_EVICT_LFU : DT_EVICT_LRU;
        int admit = (v & 2) ? 2 : 1;
        dt_embed_optim kind = (v & 4) ? DT_EMBED_ADAGRAD : DT_EMBED_SGD;
        dt_embed *one = dyn_table(6, 2, admit, ev, kind), *acc = dyn_table(6, 2, admit, ev, kind);
        int64_t len[12], ids[12], bad_out = 0, s, b, m;
        dt_tensor o12 = dt_test_t2(&C, 12, 2), d12 = dt_test_t2(&C, 12, 2), o4 = dt_test_t2(&C, 4, 2), d4 = dt_test_t2(&C, 4, 2), w1, w2;
        dt_embed_stats a, r;
        char name[128];
        int ok = 1;
        for (b = 0; b < 12; b++) len[b] = 1;
        for (s = 0; s < 4 && ok; s++) {
            dt_kjt k;
            for (b = 0; b < 12; b++) {
                ids[b] = (int64_t)((uint64_t)(1 + (int64_t)(dt_rng_uniform(70 + (uint64_t)s, 0, (uint64_t)b) * 11)) * 0x9E3779B97F4A7C15ull);
                ((float *)d12.data)[2 * b] = dt_rng_normal(80 + (uint64_t)s, 0, (uint64_t)b);
                ((float *)d12.data)[2 * b + 1] = dt_rng_normal(80 + (uint64_t)s, 1, (uint64_t)b);
            }
            memset(&k, 0, sizeof k);
            k.n_features = 1; k.batch = 12; k.lengths = len; k.ids = ids;
            ok = !dt_embed_forward(one, &o12, &k) && !dt_embed_backward(one, &d12);
            for (m = 0; m < 3 && ok; m++) {
                k.batch = 4; k.ids = ids + 4 * m;
                memcpy(d4.data, (float *)d12.data + 8 * m, 8 * sizeof(float));
                ok = !dt_embed_set_sync(acc, m == 2) && !dt_embed_forward(acc, &o4, &k) && !dt_embed_backward(acc, &d4);
                if (ok && memcmp(o4.data, (float *)o12.data + 8 * m, 8 * sizeof(float)) != 0) bad_out++;
            }
        }
        memset(&a, 0, sizeof a);
        memset(&r, 0, sizeof r);
        dt_embed_stats_get(acc, &a);
        dt_embed_stats_get(one, &r);
        dt_embed_local_shard(one, &w1, NULL, NULL, 0);
        dt_embed_local_shard(acc, &w2, NULL, NULL, 0);
        snprintf(name, sizeof name, "embed_dynamic_%s_admit%d_%s_accumulated_micro_batches_equal_one_batch", evn[v & 1],
                 admit, kind == DT_EMBED_SGD ? "sgd" : "adagrad");
        dt_test_check_all(name, ok && bad_out == 0 && memcmp(w1.data, w2.data, 12 * sizeof(float)) == 0 &&
                          a.admitted == r.admitted && a.evicted == r.evicted && a.rejected == r.rejected &&
                          r.evicted > 0 && r.rejected > 0,
                          "%s; %lld micro-batch lookups differ; slots %s; admitted %lld / %lld, evicted %lld / %lld, "
                          "rejected %lld / %lld (micro-batches / one batch; evicted and rejected must be > 0)",
                          ok ? "ran" : dt_ctx_error(&C), (long long)bad_out,
                          memcmp(w1.data, w2.data, 12 * sizeof(float)) ? "differ" : "equal", (long long)a.admitted,
                          (long long)r.admitted, (long long)a.evicted, (long long)r.evicted, (long long)a.rejected,
                          (long long)r.rejected);
        dt_tensor_free(&C, &o12); dt_tensor_free(&C, &d12); dt_tensor_free(&C, &o4); dt_tensor_free(&C, &d4);
        dt_embed_free(one);
        dt_embed_free(acc);
    }
}

/* dt_embed_hash_id(id) = splitmix64's step: z = (uint64)id + 0x9e3779b97f4a7c15; z = (z ^ z>>30) *
   0xbf58476d1ce4e5b9; z = (z ^ z>>27) * 0x94d049bb133111eb; z ^ z>>31, all mod 2^64. The values
   below were computed with that formula in Python (/usr/bin/python3, integers mod 2**64); the first
   is also splitmix64's well-known first output for seed 0. */
static void hash_id_pinned(void) {
    static const int64_t id[7] = {0, 1, 42, -1, INT64_MIN, INT64_MAX, 123456789012345LL};
    static const uint64_t want[7] = {0xe220a8397b1dcdafull, 0x910a2dec89025cc1ull, 0xbdd732262feb6e95ull,
                                     0xe4d971771b652c20ull, 0x481ec0a212a9f3dbull, 0x2a67d7552e039ea7ull,
                                     0xd85e134b80be5cfbull};
    int i, bad = -1;
    for (i = 0; i < 7 && bad < 0; i++) if (dt_embed_hash_id(id[i]) != want[i]) bad = i;
    dt_test_check_all("embed_hash_id_values_are_pinned", bad < 0, "dt_embed_hash_id(%lld) = %016llx, pinned %016llx",
                      bad >= 0 ? (long long)id[bad] : 0LL, bad >= 0 ? (unsigned long long)dt_embed_hash_id(id[bad]) : 0ULL,
                      bad >= 0 ? (unsigned long long)want[bad] : 0ULL);
}

/* f16 storage: the forward pools the stored halves widened to f32 (bag order, from 0), exactly;
   an SGD / Adagrad update is the f32 formula on the widened row, rounded to f16 once. */
static void f16_table(void) {
    int o;
    for (o = 0; o < 2; o++) {
        dt_embed_table_desc t;
        dt_embed_desc d;
        dt_embed *e = NULL;
        dt_tensor sh, out = dt_test_t2(&C, 2, 3);
        const uint16_t *h;
        float w0[18], ref[6];
        int64_t len[2] = {2, 1}, ids[3] = {1, 4, 1};
        float wt[3] = {0.5f, 2.0f, -1.0f};
        double worst = 0, g1, g4, n1, n4, lim;
        dt_kjt k;
        int i, c, fwd_bad = 0;
        char name[96];
        memset(&t, 0, sizeof t);
        t.name = "h"; t.rows = 6; t.dim = 3; t.dtype = DT_F16; t.weighted = 1;
        t.optim.kind = o ? DT_EMBED_ADAGRAD : DT_EMBED_SGD; t.optim.lr = 0.1;
        memset(&d, 0, sizeof d);
        d.tables = &t; d.n_tables = 1; d.seed = 2;
        if (dt_embed_create(&C, &e, &d)) { dt_test_fail("embed_f16_create", "%s", dt_ctx_error(&C)); return; }
        dt_embed_local_shard(e, &sh, NULL, NULL, 0);
        h = (const uint16_t *)sh.data;
        for (i = 0; i < 18; i++) w0[i] = dt_f16_to_f32(h[i]);
        memset(&k, 0, sizeof k);
        k.n_features = 1; k.batch = 2; k.lengths = len; k.ids = ids; k.weights = wt;
        if (dt_embed_forward(e, &out, &k)) { dt_test_fail("embed_f16_forward", "%s", dt_ctx_error(&C)); return; }
        for (c = 0; c < 3; c++) {
            float a = 0.0f;
            a += wt[0] * w0[3 + c];
            a += wt[1] * w0[12 + c];
            ref[c] = a;
            a = 0.0f;
            a += wt[2] * w0[3 + c];
            ref[3 + c] = a;
        }
        for (i = 0; i < 6; i++) if (((float *)out.data)[i] != ref[i]) fwd_bad = i + 1;
        if (o == 0)
            dt_test_check_all("embed_f16_forward_equals_widened_stored_rows_exactly", fwd_bad == 0,
                              "out[%d] = %.9g, widened-row sum %.9g", fwd_bad - 1, fwd_bad ? ((float *)out.data)[fwd_bad - 1] : 0.0,
                              fwd_bad ? ref[fwd_bad - 1] : 0.0);
        for (i = 0; i < 6; i++) ((float *)out.data)[i] = 0.1f * (float)(i + 1);
        if (dt_embed_backward(e, &out)) { dt_test_fail("embed_f16_backward", "%s", dt_ctx_error(&C)); return; }
        lim = 0;
        for (c = 0; c < 3; c++) { /* row 1: 0.5 d0 - d1; row 4: 2 d0 (first Adagrad step: s = g^2) */
            g1 = 0.5 * (double)(0.1f * (float)(c + 1)) - (double)(0.1f * (float)(c + 4));
            g4 = 2.0 * (double)(0.1f * (float)(c + 1));
            n1 = w0[3 + c] - 0.1 * (o ? g1 / (fabs(g1) + 1e-10) : g1);
            n4 = w0[12 + c] - 0.1 * (o ? g4 / (fabs(g4) + 1e-10) : g4);
            /* half an f16 ulp of the result (2^-11 relative, 2^-25 near 0) plus f32 slack */
            worst = fmax(worst, fabs(dt_f16_to_f32(h[3 + c]) - n1) / (fabs(n1) * 0x1p-11 + 0x1p-25 + 1e-6 * fabs(n1)));
            worst = fmax(worst, fabs(dt_f16_to_f32(h[12 + c]) - n4) / (fabs(n4) * 0x1p-11 + 0x1p-25 + 1e-6 * fabs(n4)));
        }
        snprintf(name, sizeof name, "embed_f16_%s_update_within_f16_rounding", o ? "adagrad" : "sgd");
        dt_test_check_all(name, worst <= 1.0, "worst error %.3g half-ulps of the f64 formula", worst);
        (void)lim;
        dt_tensor_free(&C, &out);
        dt_embed_free(e);
    }
}

/* A ctx allocator that refuses blocks over 1 GiB: a 10^9-row table's shard cannot be had. */
static void *small_alloc(size_t bytes, void *user) { (void)user; return bytes > ((size_t)1 << 30) ? NULL : malloc(bytes); }
static void small_free(void *p, void *user) { (void)user; free(p); }

static void named_errors(void) {
    dt_embed_table_desc t[2];
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_status st;
    dt_ctx small;
    dt_ctx_desc cd;
    memset(t, 0, sizeof t);
    t[0].name = "a"; t[0].rows = 10; t[0].dim = 2;
    t[1].name = "big_table"; t[1].rows = 1000000000; t[1].dim = 16;
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = 1;
    t[0].optim.eps = INFINITY;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_optim_eps_inf_is_named", st == DT_ERR_ARG && e == NULL, dt_ctx_error(&C), "eps inf");
    t[0].optim.eps = 0;
    memset(&cd, 0, sizeof cd);
    cd.allocator.alloc_fn = small_alloc; cd.allocator.release_fn = small_free;
    dt_ctx_init(&small, &cd);
    d.n_tables = 2;
    st = dt_embed_create(&small, &e, &d);
    dt_test_error("embed_table_too_large_to_allocate_names_the_table", st == DT_ERR_OOM && e == NULL,
                  dt_ctx_error(&small), "tables[1] (\"big_table\")");
    dt_ctx_shutdown(&small);
}

/* The same desc errors, one field at a time: each names its own field and value. */
static void named_desc_errors(void) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_status st;
    memset(&t, 0, sizeof t);
    t.name = "a"; t.rows = 10; t.dim = 2;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1;
    d.dp_max_bytes = NAN;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_dp_max_bytes_nan_is_named", st == DT_ERR_ARG && e == NULL, dt_ctx_error(&C),
                  "desc.dp_max_bytes = nan");
    d.dp_max_bytes = 0;
    t.admit_after = 5;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_admit_after_on_a_static_table_is_named", st == DT_ERR_ARG && e == NULL, dt_ctx_error(&C),
                  "tables[0] (\"a\").admit_after = 5; expected 0 .. 2^30, and 0 unless the table is dynamic");
    t.admit_after = 0;
    t.hash_shards = 4;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_hash_shards_on_a_static_table_is_named", st == DT_ERR_ARG && e == NULL, dt_ctx_error(&C),
                  "tables[0] (\"a\").hash_shards = 4; expected 0 unless the table is dynamic");
}

/* Fills a stack region with 'A's, where dt_embed_plan_print's buffer will be: before the fix it
   printed that (and, with no NUL in it, read past it; ASan: stack-buffer-overflow). */
static void dirty_stack(void) {
    volatile char junk[16384];
    size_t i;
    for (i = 0; i < sizeof junk; i++) junk[i] = 'A';
}

static void plan_of_null(void) {
    char buf[16];
    size_t n;
    memset(buf, 'A', sizeof buf);
    n = dt_embed_plan_format(NULL, buf, sizeof buf);
    dt_test_check_all("embed_plan_format_of_null_is_an_empty_string", n == 0 && buf[0] == 0,
                      "returned %zu, buf[0] = 0x%02x (want 0 and an empty string)", n, (unsigned)(unsigned char)buf[0]);
    dirty_stack();
    dt_embed_plan_print(NULL); /* a no-op (the ASan run catches a read of the stack) */
}

/* A dynamic table's checkpoint (rows by slot, plus slot_id / slot_stamp) loaded into a static
   table of the same name, rows, dim and optimizer: refused, naming the table, the table left as it
   was. A static table's own checkpoint still loads. */
static void dynamic_checkpoint_into_static(void) {
    dt_embed *dyn = dyn_table(20, 2, 1, DT_EVICT_LRU, DT_EMBED_SGD), *sta, *sta2;
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_checkpoint_desc cd;
    dt_tensor w, w2;
    char dir[512], dir2[512];
    float v[2], before[40];
    dt_status st, st2;
    memset(&t, 0, sizeof t);
    t.name = "t"; t.rows = 20; t.dim = 2; t.optim.lr = 1.0;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.seed = 3;
    if (dt_embed_create(&C, &sta, &d) || dt_embed_create(&C, &sta2, &d)) {
        dt_test_fail("embed_dynamic_checkpoint_into_static_create", "%s", dt_ctx_error(&C));
        return;
    }
    lookup1(dyn, 7, v); /* admits id 7 into some slot */
    snprintf(dir, sizeof dir, "%s/embed_dyn_ckpt", dt_test_tmpdir());
    snprintf(dir2, sizeof dir2, "%s/embed_static_ckpt", dt_test_tmpdir());
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    if (dt_embed_checkpoint_save(dyn, NULL, &cd)) {
        dt_test_fail("embed_dynamic_checkpoint_into_static_save", "%s", dt_ctx_error(&C));
        return;
    }
    dt_embed_local_shard(sta, &w, NULL, NULL, 0);
    memcpy(before, w.data, sizeof before);
    st = dt_embed_checkpoint_load(sta, NULL, &cd);
    dt_test_error("embed_dynamic_checkpoint_into_static_table_is_refused", st == DT_ERR_FORMAT, dt_ctx_error(&C),
                  "table \"t\" is dynamic in the checkpoint");
    dt_test_check_all("embed_dynamic_checkpoint_into_static_table_leaves_it_unchanged",
                      memcmp(before, w.data, sizeof before) == 0, "the static table's rows changed");
    cd.dir = dir2;
    st = dt_embed_checkpoint_save(sta, NULL, &cd);
    st2 = st ? st : dt_embed_checkpoint_load(sta2, NULL, &cd);
    dt_embed_local_shard(sta2, &w2, NULL, NULL, 0);
    dt_test_check_all("embed_static_checkpoint_into_static_table_loads", !st2 && memcmp(before, w2.data, sizeof before) == 0,
                      "%s", st2 ? dt_ctx_error(&C) : "rows differ from the saved ones");
    dt_embed_free(dyn);
    dt_embed_free(sta);
    dt_embed_free(sta2);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    named_desc_errors();
    plan_of_null();
    dynamic_checkpoint_into_static();
    accumulation_keeps_pending_slots();
    accumulation_equals_one_batch();
    hash_id_pinned();
    f16_table();
    named_errors();
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
