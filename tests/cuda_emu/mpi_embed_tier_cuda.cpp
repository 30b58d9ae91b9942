// np: 1 2 3 4
// tests/cuda_emu/mpi_embed_tier_cuda.cpp - dt_embed.h's tier HOST on the emulator: cuda tables whose
// shard and optimizer state live in pinned host memory under a device cache, against the same
// cuda tables resident, on the same ranks and plan: row-wise (weighted sum, Adagrad), table-wise
// (mean, Adam), column-wise (bf16, SGD), table-row (f16, row-wise Adagrad), data-parallel
// (Adagrad: tier HOST without a cache, the kernels on the host memory), and a dynamic table (Adam, admit_after 1 or 2, under capacity pressure) tiered
// too. The pooled outputs (and, with a sequence feature, the sequence rows) must
// be equal bit for bit at every step and, after dt_embed_flush, every shard, for caches of all
// rows, 10% and 1% of them (at least one step's ids), LRU and LFU, with dt_embed_prefetch (the
// copy stream), gradient accumulation, and the host path of a sequence feature; a checkpoint of
// tiered tables loads into resident ones and back. A cache of exactly one step's distinct rows
// trains equal to the resident table; one row less is DT_ERR_RANGE on every rank naming
// cache_rows. What is refused is named: a cache asked for a data-parallel tier HOST table, tier
// DISK on cuda; the planner never replicates a tier HOST table. (Resident cuda tables equal the
// cpu ones: mpi_embed.cpp.) Device tensors go through dt_comm's staged path (-DDT_MPI, no NCCL).
// Streams run deferred (DT_EMU_STREAMS, unless set): a missing wait for the copy stream shows.
// emu-modes: parallel
#include <math.h>
#include <cuda_runtime.h>
#include <vector>
#define DT_CUDA
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "tests/dt_test.h"

static dt_ctx C;
static int R, W;

enum { GB = 12, NT = 6, MAXL = 3 };
static const int64_t ROWS[NT] = {4000, 3000, 2000, 3000, 50, 96};
static const int DIM[NT] = {8, 4, 8, 4, 4, 4};

typedef struct cfg {
    const char *name;
    int frac;                     /* cache_rows = rows / frac (at least a global batch's ids); 1 = all rows */
    dt_embed_eviction evict;
    int prefetch, accum, seq;     /* seq: table 1 is a sequence feature (the host path) */
    int dyn;                      /* a dynamic table too (table 5; ids from 400 keys, capacity 96) */
} cfg;

static int n_tabs(const cfg *k) { return k->dyn ? NT : NT - 1; }

static std::vector<float> host_copy(const dt_tensor *t) {
    std::vector<float> v;
    dt_tensor h, f;
    if (t->numel == 0) return v;
    if (dt_tensor_create_like(&C, &h, t, DT_DTYPE_DEFAULT, DT_CPU)) return v;
    if (!dt_tensor_copy(&C, &h, t) && !dt_tensor_create_like(&C, &f, &h, DT_F32, DT_CPU)) {
        if (!dt_tensor_cast(&C, &f, &h)) v.assign((float *)f.data, (float *)f.data + f.numel);
        dt_tensor_free(&C, &f);
    }
    dt_tensor_free(&C, &h);
    return v;
}

static int pooled_dim(const cfg *k) { return 8 + (k->seq ? 0 : 4) + 8 + 4 + 4 + (k->dyn ? 4 : 0); }

static dt_embed *make(dt_comm *c, const cfg *k, int tiered) {
    dt_embed_table_desc t[NT];
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(t, 0, sizeof t);
    t[0].name = "row"; t[0].sharding = DT_SHARD_ROW; t[0].optim.kind = DT_EMBED_ADAGRAD; t[0].weighted = 1;
    t[1].name = "tab"; t[1].sharding = DT_SHARD_TABLE; t[1].pin_owner = 1; t[1].owner = W - 1;
    t[1].optim.kind = DT_EMBED_ADAM; t[1].pooling = k->seq ? DT_POOL_NONE : DT_POOL_MEAN;
    t[2].name = "col"; t[2].sharding = DT_SHARD_COLUMN; t[2].dtype = DT_BF16;
    t[3].name = "trow"; t[3].sharding = DT_SHARD_TABLE_ROW; t[3].group_size = W % 2 == 0 ? 2 : W;
    t[3].optim.kind = DT_EMBED_ROWWISE_ADAGRAD; t[3].dtype = DT_F16;
    t[4].name = "dp"; t[4].sharding = DT_SHARD_DATA; t[4].optim.kind = DT_EMBED_ADAGRAD; /* tiered: no cache */
    t[5].name = "dyn"; t[5].dynamic = 1; t[5].hash_shards = 8; t[5].optim.kind = DT_EMBED_ADAM;
    /* admit_after 2 rejects ids; 1 admits more while a small cache is full of changed rows (and
       checkpoints hold no sightings: a resumed run would admit later) */
    t[5].admit_after = k->frac >= 100 ? 1 : 2;
    for (int i = 0; i < NT; i++) {
        t[i].rows = ROWS[i];
        t[i].dim = DIM[i];
        t[i].optim.lr = 0.05;
        if (tiered && i == 4) t[i].tier = DT_TIER_HOST; /* data-parallel: the host memory itself */
        else if (tiered) {
            int64_t cr = ROWS[i] / k->frac;
            t[i].tier = DT_TIER_HOST;
            t[i].cache_rows = cr < MAXL * GB ? MAXL * GB : cr; /* at least a global batch's ids */
            t[i].cache_eviction = k->evict;
        }
    }
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = n_tabs(k); d.comm = c; d.seed = 11; d.device = DT_CUDA_DEVICE;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* The batch of step s, samples [b0, b0 + n) of the global batch, into buffer set s % 2 (the batch
   given to dt_embed_prefetch stays intact while the current one is in use). 0..3 ids per bag,
   power-law: row = u^3 x rows (few hot rows, a long tail); the dynamic table's ids uniform over
   400 keys (its 96 slots are short). */
static int64_t LEN[2][NT * GB], IDS[2][NT * GB * MAXL];
static float WTS[2][NT * GB * MAXL];
static void batch(dt_kjt *k, int s, int64_t b0, int64_t n, int nt) {
    int f, q = s & 1;
    int64_t b, j, o = 0;
    for (f = 0; f < nt; f++)
        for (b = 0; b < n; b++) {
            int64_t len = (int64_t)(dt_rng_uniform(100 + s, (uint64_t)f, (uint64_t)(b0 + b)) * (MAXL + 1));
            LEN[q][f * n + b] = len;
            for (j = 0; j < len; j++) {
                float u = dt_rng_uniform(200 + s, (uint64_t)(f * 8 + j), (uint64_t)(b0 + b));
                int64_t x = f == 5 ? (int64_t)(u * 400.0f) : (int64_t)(u * u * u * (float)ROWS[f]);
                IDS[q][o] = f == 5 ? (int64_t)((uint64_t)(x + 1) * 0x9E3779B97F4A7C15ull) : x;
                WTS[q][o] = 0.5f + 0.25f * (float)j;
                o++;
            }
        }
    memset(k, 0, sizeof *k);
    k->n_features = nt; k->batch = n; k->lengths = LEN[q]; k->ids = IDS[q]; k->weights = WTS[q];
}

static dt_tensor dev2(int64_t r, int64_t c) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32; d.ndim = 2; d.shape[0] = r; d.shape[1] = c; d.device = DT_CUDA_DEVICE;
    if (dt_tensor_create(&C, &t, &d)) { fprintf(stderr, "dev2: %s\n", dt_ctx_error(&C)); exit(2); }
    return t;
}

/* Steps s0..s1 on the tiered e and the resident ref. Returns the steps whose outputs differ (-1: an error). */
static int64_t run(dt_embed *e, dt_embed *ref, const cfg *k, int s0, int s1, int64_t b0, int64_t n) {
    int PD = pooled_dim(k);
    dt_tensor out = dev2(n, PD), rout = dev2(n, PD), dout = dev2(n, PD), sq, rsq, g, gr;
    std::vector<float> hd((size_t)(n * PD));
    int64_t bad = 0;
    dt_kjt kj;
    for (int s = s0; s < s1; s++) {
        for (int which = 0; which < 2; which++) {
            dt_embed *x = which ? ref : e;
            int pf = !which && k->prefetch;
            int sync = !k->accum || (s & 1);
            batch(&kj, s, b0, n, n_tabs(k));
            if (dt_embed_set_sync(x, sync) || dt_embed_forward(x, which ? &rout : &out, &kj)) goto fail;
            if (pf && s + 1 < s1) { /* the next batch's rows come on the copy stream while this step runs */
                dt_kjt nx;
                batch(&nx, s + 1, b0, n, n_tabs(k));
                if (dt_embed_prefetch(x, &nx)) goto fail;
            }
        }
        if (host_copy(&out) != host_copy(&rout)) bad++;
        if (k->seq) {
            dt_embed_sequence(e, &sq, 1);
            dt_embed_sequence(ref, &rsq, 1);
            if (sq.numel != rsq.numel || (sq.numel && memcmp(sq.data, rsq.data, (size_t)sq.numel * 4) != 0)) bad++;
            dt_embed_sequence_grad(e, &g, 1);
            dt_embed_sequence_grad(ref, &gr, 1);
            for (int64_t j = 0; j < g.numel; j++)
                ((float *)g.data)[j] = ((float *)gr.data)[j] = dt_rng_normal(400 + s, 0, (uint64_t)j);
        }
        for (int64_t b = 0; b < n; b++)
            for (int c = 0; c < PD; c++) hd[(size_t)(b * PD + c)] = dt_rng_normal(300 + s, (uint64_t)c, (uint64_t)(b0 + b));
        cudaMemcpy(dout.data, hd.data(), hd.size() * 4, cudaMemcpyHostToDevice);
        if (dt_embed_backward(e, &dout) || dt_embed_backward(ref, &dout)) goto fail;
    }
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &rout); dt_tensor_free(&C, &dout);
    return bad;
fail:
    dt_test_fail("embed_cuda_tier_steps_run", "%s", dt_ctx_error(&C));
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &rout); dt_tensor_free(&C, &dout);
    return -1;
}

/* After dt_embed_flush: every local shard (the slow tier, in pinned host memory) equals the
   resident one on the device, bit for bit. */
static int64_t diff_shards(dt_embed *e, dt_embed *ref, int nt) {
    int64_t bad = 0;
    if (dt_embed_flush(e)) return 99;
    for (int t = 0; t < nt; t++) {
        dt_tensor a, b;
        int64_t r0a, r0b, c0a, c0b;
        dt_embed_local_shard(e, &a, &r0a, &c0a, t);
        dt_embed_local_shard(ref, &b, &r0b, &c0b, t);
        if (r0a != r0b || c0a != c0b || host_copy(&a) != host_copy(&b)) bad++;
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
    double st[5] = {0, 0, 0, 0, 0};
    dt_embed *e = make(world, k, 1), *ref = make(world, k, 0);
    slice(&b0, &n);
    bad = run(e, ref, k, 0, 10, b0, n);
    shards = diff_shards(e, ref, n_tabs(k));
    for (int t = 0; t < n_tabs(k); t++) {
        dt_embed_tier_stats ts;
        dt_embed_tier_stats_get(e, t, &ts);
        st[0] += (double)ts.misses; st[1] += (double)ts.evicted; st[2] += (double)ts.prefetched;
        st[3] += (double)ts.hits; st[4] += (double)ts.written_back;
    }
    dt_comm_allreduce_f64(world, st, 5, DT_REDUCE_SUM);
    { /* the data-parallel table is tiered without a cache: its rows never pass through one */
        dt_embed_tier_stats ts;
        dt_embed_tier_stats_get(e, 4, &ts);
        snprintf(name, sizeof name, "embed_cuda_tier_%s_np%d_data_parallel_table_has_no_cache", k->name, W);
        dt_test_check_all(name, ts.cache_rows == 0 && ts.hits + ts.misses == 0, "cache_rows %lld hits %lld misses "
                          "%lld; expected 0 (the kernels use the host memory itself)", (long long)ts.cache_rows,
                          (long long)ts.hits, (long long)ts.misses);
    }
    if (k->dyn) { /* the dynamic table's admissions: the same ids, and it was under pressure */
        dt_embed_stats a, g;
        double v[3];
        dt_embed_stats_get(e, &a);
        dt_embed_stats_get(ref, &g);
        snprintf(name, sizeof name, "embed_cuda_tier_%s_np%d_dynamic_counts_equal_resident", k->name, W);
        dt_test_check_all(name, a.admitted == g.admitted && a.evicted == g.evicted && a.rejected == g.rejected,
                          "admitted/evicted/rejected tiered %lld/%lld/%lld, resident %lld/%lld/%lld",
                          (long long)a.admitted, (long long)a.evicted, (long long)a.rejected, (long long)g.admitted,
                          (long long)g.evicted, (long long)g.rejected);
        v[0] = (double)a.admitted; v[1] = (double)a.evicted; v[2] = (double)a.rejected;
        dt_comm_allreduce_f64(world, v, 3, DT_REDUCE_SUM);
        snprintf(name, sizeof name, "embed_cuda_tier_%s_np%d_dynamic_table_under_pressure", k->name, W);
        dt_test_check_all(name, v[0] > 0 && (k->frac >= 100 ? v[1] > 0 : v[2] > 0), "admitted %g evicted %g "
                          "rejected %g; expected admissions, and evictions (admit_after 1) or rejections (2)", v[0],
                          v[1], v[2]);
    }
    snprintf(name, sizeof name, "embed_cuda_tier_%s_np%d_equals_resident_bit_for_bit", k->name, W);
    dt_test_check_all(name, bad == 0 && shards == 0, "%lld steps' outputs and %lld shards differ from the resident "
                      "tables", (long long)bad, (long long)shards);
    snprintf(name, sizeof name, "embed_cuda_tier_%s_np%d_counts", k->name, W);
    if (k->frac == 1)
        dt_test_check_all(name, st[0] > 0 && st[1] == 0 && st[3] > 0, "misses %g evicted %g hits %g; expected "
                          "misses > 0, no eviction (the cache holds every row), hits > 0", st[0], st[1], st[3]);
    else /* (a tenth of the rows holds this test's few steps of a power law: evictions at 1%) */
        dt_test_check_all(name, st[0] > 0 && (k->frac < 100 || st[1] > 0) && st[4] > 0 && (!k->prefetch || st[2] > 0),
                          "misses %g evicted %g prefetched %g written back %g; expected all > 0 (evicted: at 1%%, "
                          "prefetched: with prefetch)", st[0], st[1], st[2], st[4]);
    dt_embed_free(e);
    dt_embed_free(ref);
}

/* A checkpoint of the tiered tables loads into resident ones (and back) and both continue equal:
   the files are the same. */
static void checkpoints(dt_comm *world) {
    cfg k = {"ckpt", 100, DT_EVICT_LRU, 1, 0, 0, 1};
    dt_embed *e = make(world, &k, 1), *ref = make(world, &k, 0);
    dt_checkpoint_desc cd;
    dt_train_state ts;
    char dir[1024];
    int64_t b0, n, bad = 0;
    dt_status s1, s2;
    slice(&b0, &n);
    bad += run(e, ref, &k, 0, 3, b0, n) != 0;
    snprintf(dir, sizeof dir, "%s/cuda_tier_ckpt", dt_test_tmpdir());
    memset(&cd, 0, sizeof cd);
    cd.dir = dir; cd.comm = world;
    memset(&ts, 0, sizeof ts);
    ts.step = 3;
    s1 = dt_embed_checkpoint_save(e, &ts, &cd);
    dt_embed_free(ref);
    ref = make(world, &k, 0);
    s2 = dt_embed_checkpoint_load(ref, NULL, &cd); /* tiered -> resident */
    if (s1 || s2) dt_test_fail("embed_cuda_tier_checkpoint_runs", "%s", dt_ctx_error(&C));
    bad += run(e, ref, &k, 3, 5, b0, n) != 0;
    ts.step = 5;
    s1 = dt_embed_checkpoint_save(ref, &ts, &cd);
    dt_embed_free(e);
    e = make(world, &k, 1);
    s2 = dt_embed_checkpoint_load(e, NULL, &cd); /* resident -> tiered */
    if (s1 || s2) dt_test_fail("embed_cuda_tier_checkpoint_runs", "%s", dt_ctx_error(&C));
    bad += run(e, ref, &k, 5, 7, b0, n) != 0;
    bad += diff_shards(e, ref, n_tabs(&k));
    snprintf(dir, sizeof dir, "embed_cuda_tier_np%d_checkpoints_load_either_way_and_continue_equal", W);
    dt_test_check_all(dir, bad == 0, "%lld runs or shards differ", (long long)bad);
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
    if (cache) { t.tier = DT_TIER_HOST; t.cache_rows = cache; }
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = c; d.seed = 5; d.device = DT_CUDA_DEVICE;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "one: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}
static dt_status one_step(dt_embed *e, int s, int64_t b0, int64_t n, dt_tensor *out) {
    int64_t len[GB], ids[GB];
    dt_kjt k;
    std::vector<float> hd((size_t)(n * 4));
    for (int64_t b = 0; b < n; b++) { len[b] = 1; ids[b] = ((b0 + b) * 37 + s * 101) % 1000; } /* D distinct per step */
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = n; k.lengths = len; k.ids = ids;
    dt_status st = dt_embed_forward(e, out, &k);
    if (st) return st;
    dt_tensor dout = dev2(n, 4);
    for (int64_t b = 0; b < n * 4; b++) hd[(size_t)b] = 0.1f * (float)(b % 7) - 0.3f;
    cudaMemcpy(dout.data, hd.data(), hd.size() * 4, cudaMemcpyHostToDevice);
    st = dt_embed_backward(e, &dout);
    dt_tensor_free(&C, &dout);
    return st;
}
static void one_batch(dt_comm *world) {
    char name[160];
    int64_t b0, n, bad = 0;
    dt_embed *e, *ref = one(world, 0);
    dt_status st;
    slice(&b0, &n);
    dt_tensor out = dev2(n, 4), rout = dev2(n, 4);
    e = one(world, D);
    for (int s = 0; s < 5; s++) {
        if (one_step(e, s, b0, n, &out) || one_step(ref, s, b0, n, &rout)) { bad = -1; break; }
        if (host_copy(&out) != host_copy(&rout)) bad++;
    }
    if (bad >= 0) bad += diff_shards(e, ref, 1);
    snprintf(name, sizeof name, "embed_cuda_tier_np%d_cache_of_one_batch_equals_resident", W);
    dt_test_check_all(name, bad == 0, "%lld steps or shards differ (%s)", (long long)bad, bad < 0 ? dt_ctx_error(&C) : "");
    dt_embed_free(e);
    e = one(world, D - 1);
    st = one_step(e, 0, b0, n, &out);
    snprintf(name, sizeof name, "embed_cuda_tier_np%d_cache_smaller_than_a_batch_is_named_on_every_rank", W);
    dt_test_check_all(name, st == DT_ERR_RANGE && (R != 0 || strstr(dt_ctx_error(&C), "cache_rows") != NULL),
                      "status %d: %s", (int)st, dt_ctx_error(&C));
    dt_embed_free(e);
    dt_embed_free(ref);
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &rout);
}

/* At np 1 (nothing staged through the host by dt_comm), a step of tiered tables with a 1% cache
   (after a few: the buffers start at twice the first step's need) allocates and frees nothing,
   copies nothing down and waits for nothing, on the ctx's counters and the emulator's, though
   its rows miss and evict; with dt_embed_prefetch too (its copy stream is ordered by events,
   not by the host). */
static void stays_on_device(dt_comm *world) {
    char name[160];
    for (int pf = 0; pf < 2 && W == 1; pf++) {
        cfg k = {"counters", 100, DT_EVICT_LRU, pf, 0, 0, 0};
        int PD = pooled_dim(&k), ok = 1, S = 6;
        dt_embed *e = make(world, &k, 1);
        dt_tensor out = dev2(GB, PD), dout = dev2(GB, PD);
        std::vector<float> hd((size_t)(GB * PD), 0.01f);
        dt_emu_counters c0, c1;
        dt_embed_tier_stats t0, t1;
        dt_kjt kj, nx;
        cudaMemcpy(dout.data, hd.data(), hd.size() * 4, cudaMemcpyHostToDevice);
        for (int s = 0; s < S && ok; s++) { /* the last step counted */
            if (s == S - 1) { dt_ctx_counters_reset(&C); dt_emu_get_counters(&c0); dt_embed_tier_stats_get(e, 0, &t0); }
            batch(&kj, s, 0, GB, n_tabs(&k));
            ok = !dt_embed_forward(e, &out, &kj);
            if (ok && pf) { batch(&nx, s + 1, 0, GB, n_tabs(&k)); ok = !dt_embed_prefetch(e, &nx); }
            ok = ok && !dt_embed_backward(e, &dout);
        }
        dt_emu_get_counters(&c1);
        dt_embed_tier_stats_get(e, 0, &t1);
        dt_cuda_counters n = C.counters;
        snprintf(name, sizeof name, "embed_cuda_tier%s_np1_counted_step_misses_and_evicts", pf ? "_prefetch" : "");
        dt_test_check_all(name, t1.misses > t0.misses && t1.evicted > t0.evicted, "misses %lld evicted %lld in the step",
                          (long long)(t1.misses - t0.misses), (long long)(t1.evicted - t0.evicted));
        snprintf(name, sizeof name, "embed_cuda_tier%s_np1_steps_run", pf ? "_prefetch" : "");
        if (!DT_TEST_CHECK(name, ok)) fprintf(stderr, "  %s\n", dt_ctx_error(&C));
        snprintf(name, sizeof name, "embed_cuda_tier%s_np1_step_allocates_nothing_copies_nothing_down_waits_for_nothing",
                 pf ? "_prefetch" : "");
        dt_test_check_all(name, ok && n.allocs == 0 && n.frees == 0 && n.syncs == 0 && n.d2h_bytes == 0 &&
                          c1.allocs == c0.allocs && c1.frees == c0.frees && c1.syncs == c0.syncs &&
                          c1.d2h_bytes == c0.d2h_bytes, "ctx allocs %lld frees %lld syncs %lld d2h %lld bytes; "
                          "runtime allocs %lld frees %lld syncs %lld d2h %lld bytes", (long long)n.allocs,
                          (long long)n.frees, (long long)n.syncs, (long long)n.d2h_bytes, c1.allocs - c0.allocs,
                          c1.frees - c0.frees, c1.syncs - c0.syncs, c1.d2h_bytes - c0.d2h_bytes);
        if (pf) (void)dt_embed_forward(e, &out, &nx); /* the prefetched batch */
        dt_tensor_free(&C, &out); dt_tensor_free(&C, &dout);
        dt_embed_free(e);
    }
}

static void refusals(dt_comm *world) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    dt_status st;
    memset(&t, 0, sizeof t);
    t.name = "bad"; t.rows = 100; t.dim = 4; t.tier = DT_TIER_HOST;
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.comm = world; d.device = DT_CUDA_DEVICE;
    t.sharding = DT_SHARD_DATA; t.cache_rows = 10;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_cuda_tier_host_data_parallel_with_a_cache_is_named", st, dt_ctx_error(&C), "cache_rows = 10");
    t.cache_rows = 0;
    t.sharding = DT_SHARD_AUTO; t.tier = DT_TIER_DISK;
    st = dt_embed_create(&C, &e, &d);
    dt_test_error("embed_cuda_tier_disk_is_named_unsupported", st, dt_ctx_error(&C), "tier = DISK on cuda");
    t.tier = DT_TIER_HOST; /* a small table the planner would replicate: not when tier HOST */
    st = dt_embed_create(&C, &e, &d);
    if (!DT_TEST_CHECK("embed_cuda_tier_host_small_table_creates", st == DT_OK)) fprintf(stderr, "  %s\n", dt_ctx_error(&C));
    else {
        dt_test_check_all("embed_cuda_tier_host_is_never_planned_data_parallel",
                          dt_embed_table_sharding(e, 0, NULL) != DT_SHARD_DATA, "planned %d",
                          (int)dt_embed_table_sharding(e, 0, NULL));
        dt_embed_free(e);
    }
}

int main(void) {
    dt_comm *world = NULL;
    /* deferred streams (cuda_emu.cpp): work on the prefetch's copy stream runs only when something
       waits for it, so a forward that read the cache without waiting reads stale rows */
    setenv("DT_EMU_STREAMS", "deferred", 0);
    static const cfg cfgs[] = {
        {"all_rows", 1, DT_EVICT_LRU, 0, 0, 0, 1},
        {"tenth", 10, DT_EVICT_LRU, 0, 0, 0, 1},
        {"hundredth", 100, DT_EVICT_LRU, 0, 0, 0, 1},
        {"hundredth_prefetch", 100, DT_EVICT_LRU, 1, 0, 0, 1},
        {"tenth_lfu_prefetch", 10, DT_EVICT_LFU, 1, 0, 0, 1},
        {"tenth_prefetch_accumulate", 10, DT_EVICT_LRU, 1, 1, 0, 0}, /* (sync 0: not with dynamic tables on cuda) */
        {"hundredth_sequence_prefetch", 100, DT_EVICT_LRU, 1, 0, 1, 1},
        {"tenth_sequence_accumulate", 10, DT_EVICT_LFU, 0, 1, 1, 0}, /* the host's pending sums, then slots */
    };
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) equivalence(world, &cfgs[i]);
    checkpoints(world);
    one_batch(world);
    stays_on_device(world);
    refusals(world);
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
