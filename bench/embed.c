/* bench/embed.c - dt_embed.h on one process: pooled lookup forward + backward + fused sparse
   Adagrad, against torch.nn.EmbeddingBag (sparse=True) + torch.optim.Adagrad run by
   bench/embed_torch.py in the same run (same tables, batch shape and id distribution, one
   thread); the bytes of rows gathered per second by the gather + pool pass alone (the owner's
   dt__em_serve, timed on its own: this file compiles dt_embed.h's implementation, so it calls
   the private function on the requests a real forward_begin built, before forward_end pools
   them again) and by the whole forward, against memcpy of a buffer larger than the last-level
   cache measured in the same run; and a step on a 10M-row table against the same step on a
   100k-row table (no step may cost O(rows)), with the peer's own 10M / 100k ratio on the same
   two tables (sparse SGD) beside it. Prints a table and the ratios.
   Times are this thread's CPU time (CLOCK_THREAD_CPUTIME_ID here, time.thread_time() in the
   peer; both run one thread), so that the time slices a shared machine gives to other processes
   do not count; their cache and DRAM traffic still does: compare the ratios of one run, not
   absolute figures across runs.
   Then tiered tables (dt_embed.h tier DISK): a table of G GiB (default 8) in a file with a cache
   of G/8 GiB in memory, against the same table resident, in one run: one table of dim 64 (f32,
   row-wise Adagrad) read by 8 features, batch 2048, bags of 1..7 ids drawn from a Zipf law of
   exponent 1.05 (the synthetic DLRM data's: examples/dlrm/dlrm_data.h) spread over the table by
   a fixed bijection, a fresh batch every step; each step also runs a dense stand-in (pooled
   [2048, 512] x [512, 256] forward and backward, the work a DLRM step has beside its tables)
   that the prefetch can hide behind. Wall-clock samples/s (the prefetch runs on a second
   thread), rounds interleaved resident / tiered with prefetch / tiered without, median of 3
   rounds of 48 steps after 96 warm-up steps. The hit rate is the cache's (ids whose row was
   cached when first looked up), the prefetch wait the share of the tiered steps spent waiting
   for rows still on their way. Ends with one line:
       tiered: table T GiB cache C GiB hit H% prefetch-wait W% ratio R (resident = 1)

       build/bench/embed [T R D B L steps]     defaults 8 100000 64 2048 4 20
       build/bench/embed --tiers [GiB [log_rows]]  the tiered comparison only (default 8 GiB; the
                                                  table's log_rows, default its rows)
       build/bench/embed --single [steps]      the single-table step against FBGEMM's TBE and torch's
                                               EmbeddingBag only (issue 25; peers: $DT_PEERS_PYTHON) */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* madvise */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __linux__
#include <sys/mman.h>
#endif
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "bench.h"

#ifndef __cplusplus
extern FILE *popen(const char *command, const char *type);
extern int pclose(FILE *stream);
#endif

static dt_ctx C, CH; /* CH: the same with huge_alloc */

/* A dt_ctx_desc.allocator that asks Linux for transparent huge pages (2 MiB) on blocks of 4 MiB
   or more: a 10M-row table in 4 KiB pages costs a TLB miss (and a page walk that itself misses
   the cache) per random row; in 2 MiB pages the TLB covers far more of it. What a user of dt can
   do with the allocator hook. dt allocates through whatever allocator the ctx has, then advises
   shards of 4 MiB or more into huge pages itself (dt_embed.h, "Memory"; -DDT_EMBED_NO_HUGEPAGE
   for malloc's 4 KiB pages); this allocator asks before the first touch, for every such block. */
#define HUGE_BYTES ((size_t)2 << 20)
static void *huge_alloc(size_t bytes, void *user) {
    void *p = NULL;
    (void)user;
    if (bytes < 2 * HUGE_BYTES) return malloc(bytes);
    if (posix_memalign(&p, HUGE_BYTES, (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES)) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, (bytes + HUGE_BYTES - 1) / HUGE_BYTES * HUGE_BYTES, MADV_HUGEPAGE); /* a hint */
#endif
    return p;
}
static void huge_release(void *p, void *user) { (void)user; free(p); }

/* This thread's CPU seconds (see the top comment). */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
#define now_s cpu_s

static void die(const char *what) {
    fprintf(stderr, "bench/embed: %s: %s\n", what, dt_ctx_error(&C));
    exit(1);
}

typedef struct bbatch {
    int64_t *lengths, *ids, n_ids;
    dt_kjt k;
} bbatch;

/* T features, B samples, bags of 1..2L-1 ids, ids u^2 * R (power law, as embed_torch.py). */
static void make_batch(bbatch *bb, int T, int64_t R, int64_t B, int L, uint64_t seed) {
    int64_t i, j, o = 0, n = (int64_t)T * B;
    bb->lengths = (int64_t *)malloc(sizeof(int64_t) * (size_t)n);
    for (i = 0; i < n; i++) {
        bb->lengths[i] = 1 + (int64_t)(dt_rng_uniform(seed, 1, (uint64_t)i) * (float)(2 * L - 1));
        if (bb->lengths[i] > 2 * L - 1) bb->lengths[i] = 2 * L - 1;
        o += bb->lengths[i];
    }
    bb->n_ids = o;
    bb->ids = (int64_t *)malloc(sizeof(int64_t) * (size_t)o);
    for (j = 0; j < o; j++) {
        float u = dt_rng_uniform(seed, 2, (uint64_t)j);
        bb->ids[j] = (int64_t)(u * u * (float)R);
        if (bb->ids[j] >= R) bb->ids[j] = R - 1;
    }
    memset(&bb->k, 0, sizeof bb->k);
    bb->k.n_features = T; bb->k.batch = B; bb->k.lengths = bb->lengths; bb->k.ids = bb->ids;
}

static dt_embed *make(dt_ctx *ctx, int T, int64_t R, int D, dt_embed_optim kind) {
    dt_embed_table_desc *t = (dt_embed_table_desc *)calloc((size_t)T, sizeof *t);
    char (*names)[16] = (char (*)[16])calloc((size_t)T, 16);
    dt_embed_desc d;
    dt_embed *e = NULL;
    int i;
    for (i = 0; i < T; i++) {
        snprintf(names[i], 16, "t%d", i);
        t[i].name = names[i]; t[i].rows = R; t[i].dim = D; t[i].optim.kind = kind;
    }
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = T; d.seed = 1;
    if (dt_embed_create(ctx, &e, &d)) die("dt_embed_create");
    free(t); free(names);
    return e;
}

/* Median seconds of the gather + pool pass alone over `steps` forwards: forward_begin (at one
   rank it also delivers the requests), then the owner's pooling of them, timed (the rows cold
   as in a real forward: the previous step gathered another batch), then forward_end and the
   backward as usual. One rank pools its resident tables in place (no requests: dt_embed.h,
   "shardings"): there the pass timed is that pooling, run a second time after begin's (the
   rows warm from the first: an upper bound on the pass's speed). */
static double gather_pass(dt_embed *e, bbatch *bb, int nb, int steps) {
    int64_t D = dt_embed_pooled_dim(e), B = bb[0].k.batch, tot = 0;
    dt_tensor out, dout;
    dt_tensor_desc td;
    double *tg = (double *)malloc(sizeof(double) * (size_t)steps), r;
    int s, W = e->size, k;
    memset(&td, 0, sizeof td);
    td.shape[0] = B; td.shape[1] = D; td.ndim = 2;
    if (dt_tensor_create(&C, &out, &td) || dt_tensor_create(&C, &dout, &td)) die("tensor");
    memset(dout.data, 0, dt_tensor_bytes(&dout));
    for (s = 0; s < steps + 2; s++) {
        double t0;
        if (dt_embed_forward_begin(e, &bb[s % nb].k)) die("forward_begin");
        if (e->tabs[0].local) { /* one rank: the tables are pooled in place (the local path), no requests */
            t0 = now_s();
            if (dt__em_dp_lookup(e)) die("local lookup"); /* again: it writes its bags, does not add */
            if (s >= 2) tg[s - 2] = now_s() - t0;
            if (dt_embed_forward_end(e, &out)) die("forward_end");
            if (dt_embed_backward(e, &dout)) die("backward");
            continue;
        }
        if (dt__em_serve(e, (const int64_t *)e->rbuf_i.data, (const float *)e->rbuf_f.data, e->cnt + 3 * W,
                         e->cnt + 5 * W, NULL)) /* counts the result floats, as forward_end does */
            die("serve");
        for (k = 0, tot = 0; k < W; k++) tot += e->cnt[5 * W + k];
        if (dt__em_need(e, &e->resp, DT_F32, tot + 1)) die("resp");
        t0 = now_s();
        if (dt__em_serve(e, (const int64_t *)e->rbuf_i.data, (const float *)e->rbuf_f.data, e->cnt + 3 * W,
                         e->cnt + 5 * W, (float *)e->resp.data))
            die("serve");
        if (s >= 2) tg[s - 2] = now_s() - t0;
        if (dt_embed_forward_end(e, &out)) die("forward_end");
        if (dt_embed_backward(e, &dout)) die("backward");
    }
    r = median(tg, steps);
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &dout);
    free(tg);
    return r;
}

/* Median seconds of forward and of forward + backward over `steps` steps. */
static void run(dt_embed *e, bbatch *bb, int nb, int steps, double *fwd, double *step) {
    int64_t D = dt_embed_pooled_dim(e), B = bb[0].k.batch, i;
    dt_tensor out, dout;
    dt_tensor_desc td;
    double *tf = (double *)malloc(sizeof(double) * (size_t)steps), *ts = (double *)malloc(sizeof(double) * (size_t)steps);
    int s;
    memset(&td, 0, sizeof td);
    td.shape[0] = B; td.shape[1] = D; td.ndim = 2;
    if (dt_tensor_create(&C, &out, &td) || dt_tensor_create(&C, &dout, &td)) die("tensor");
    for (i = 0; i < B * D; i++) ((float *)dout.data)[i] = dt_rng_normal(9, 0, (uint64_t)i);
    for (s = 0; s < steps + 2; s++) {
        double t0 = now_s(), t1;
        if (dt_embed_forward(e, &out, &bb[s % nb].k)) die("forward");
        t1 = now_s();
        if (dt_embed_backward(e, &dout)) die("backward");
        if (s >= 2) { tf[s - 2] = t1 - t0; ts[s - 2] = now_s() - t0; } /* two warm-up steps */
    }
    *fwd = median(tf, steps);
    *step = median(ts, steps);
    dt_tensor_free(&C, &out); dt_tensor_free(&C, &dout);
    free(tf); free(ts);
}

static double memcpy_gbs(size_t bytes) {
    char *a = (char *)malloc(bytes), *b = (char *)malloc(bytes);
    double t[7];
    int i;
    memset(a, 1, bytes); memset(b, 2, bytes);
    for (i = 0; i < 7; i++) {
        double t0 = now_s();
        memcpy(b, a, bytes);
        t[i] = now_s() - t0;
        a[i] = b[bytes - 1 - (size_t)i]; /* keep the copies observable */
    }
    free(a); free(b);
    return (double)bytes / median(t, 7) / 1e9;
}

/* samples/s of bench/embed_torch.py on these shapes (0: not run), with $DT_PEERS_PYTHON (./build.sh
   bench: the pinned peers' venv, build/peers) or /usr/bin/python3 */
static double torch_run(int T, int64_t R, int D, int64_t B, int L, int steps, const char *opt, const char *peer) {
    char cmd[1400], line[256];
    const char *py = getenv("DT_PEERS_PYTHON");
    double sps = 0;
    FILE *p;
    if (!py || !*py || strlen(py) > 1000 || strchr(py, '\'') || strchr(py, ' ')) py = "/usr/bin/python3";
    snprintf(cmd, sizeof cmd, "%s bench/embed_torch.py %d %lld %d %lld %d %d %s %s 2>&1", py, T, (long long)R, D,
             (long long)B, L, steps, opt, peer);
    if ((p = popen(cmd, "r"))) {
        while (fgets(line, sizeof line, p))
            if (sscanf(line, "torch samples/s %lf", &sps) == 1) break;
        pclose(p);
    }
    return sps;
}

/* ---------------------------------------------------------------- the single-table step */

/* One table of R rows x D (f32, sum pooling), batch 2048, bags of 1..7 power-law ids, 1 thread:
   dt_embed's forward + backward + update against FBGEMM's CPU TBE (one op, the update fused in
   its backward) and torch's EmbeddingBag + sparse optimizer, for R 100k and 10M, D 16 and 128,
   SGD and Adagrad; rounds interleaved (dt, tbe, bag; 3 of them), each side's median step, then
   the median over rounds. dt's table is made each round (constant values: they change no
   memory access; random ones take ~50 s at 10M x 128) and freed before the peers run, so the
   three never hold their tables at once. */
static void single_grid(int steps) {
    static const int64_t Rs[2] = {100000, 10000000};
    static const int Ds[2] = {16, 128};
    const int64_t B = 2048;
    const int L = 4, rounds = 3;
    int ri, di, oi, r, i;
    printf("bench/embed --single: one table, dt_embed vs FBGEMM TBE (CPU) and torch EmbeddingBag, batch %lld, bags "
           "1..%d, 1 thread, %d rounds interleaved, medians; step ms\n", (long long)B, 2 * L - 1, rounds);
    printf("%-9s %4s %-8s %9s %9s %9s %10s %10s\n", "rows", "dim", "optim", "dt", "tbe", "bag", "tbe / dt", "bag / dt");
    for (ri = 0; ri < 2; ri++) {
        bbatch bb[4];
        for (i = 0; i < 4; i++) make_batch(&bb[i], 1, Rs[ri], B, L, 300 + (uint64_t)i);
        for (di = 0; di < 2; di++)
            for (oi = 0; oi < 2; oi++) {
                double td[3], tt[3], tg[3], f, m[3];
                const char *on = oi ? "adagrad" : "sgd";
                for (r = 0; r < rounds; r++) {
                    dt_embed_table_desc t;
                    dt_embed_desc d;
                    dt_embed *e = NULL;
                    double sps;
                    memset(&t, 0, sizeof t);
                    t.name = "t"; t.rows = Rs[ri]; t.dim = Ds[di];
                    t.optim.kind = oi ? DT_EMBED_ADAGRAD : DT_EMBED_SGD;
                    t.init.kind = DT_INIT_CONST; t.init.value = 0.01;
                    memset(&d, 0, sizeof d);
                    d.tables = &t; d.n_tables = 1; d.seed = 1;
                    if (dt_embed_create(&C, &e, &d)) die("dt_embed_create (single)");
                    run(e, bb, 4, steps, &f, &td[r]);
                    dt_embed_free(e);
                    sps = torch_run(1, Rs[ri], Ds[di], B, L, steps, on, "tbe");
                    tt[r] = sps > 0 ? (double)B / sps : 0;
                    sps = torch_run(1, Rs[ri], Ds[di], B, L, steps, on, "bag");
                    tg[r] = sps > 0 ? (double)B / sps : 0;
                }
                m[0] = median(td, rounds); m[1] = median(tt, rounds); m[2] = median(tg, rounds);
                printf("%-9lld %4d %-8s %9.3f %9.3f %9.3f %10.2f %10.2f\n", (long long)Rs[ri], Ds[di], on, m[0] * 1e3,
                       m[1] * 1e3, m[2] * 1e3, m[1] / m[0], m[2] / m[0]);
                fflush(stdout);
            }
        for (i = 0; i < 4; i++) { free(bb[i].lengths); free(bb[i].ids); }
    }
    printf("(a peer's 0.000: it did not run; ratios > 1: dt is faster; issue 25's target tbe / dt >= 1.0)\n");
}

/* ---------------------------------------------------------------- tiered tables */

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TB 2048 /* samples per step */
#define TF 8    /* features reading the one table */
#define TD 64   /* its dim */
#define TDENSE 256

/* Step s's batch: TF features x TB bags of 1..7 ids, Zipf(1.05) over the R rows: k + 1 =
   (1 + u ((R + 1)^(1 - s) - 1))^(1 / (1 - s)) (dlrm_data.h's inverse CDF), then row = (k a + c)
   mod R, a fixed bijection, so the hot rows are spread over the file as ids hashed into a table
   would be. */
static void tier_batch(bbatch *bb, int64_t R, int s) {
    const double zs = 1.05, za = pow((double)R + 1.0, 1.0 - zs) - 1.0, zi = 1.0 / (1.0 - zs);
    const uint64_t a = 2654435761u % (uint64_t)R ? 2654435761u % (uint64_t)R : 1, c = 12345 % (uint64_t)R;
    int64_t i, n = (int64_t)TF * TB, o = 0;
    for (i = 0; i < n; i++) {
        bb->lengths[i] = 1 + (int64_t)(dt_rng_uniform(7000 + (uint64_t)s, 1, (uint64_t)i) * 7.0f);
        if (bb->lengths[i] > 7) bb->lengths[i] = 7;
        o += bb->lengths[i];
    }
    for (i = 0; i < o; i++) {
        /* u from two draws (48 bits): one float's 24 would leave most of the tail's rows undrawable */
        double u = ((double)(int64_t)(dt_rng_uniform(7000 + (uint64_t)s, 2, (uint64_t)i) * 16777216.0f) +
                    (double)dt_rng_uniform(7000 + (uint64_t)s, 3, (uint64_t)i)) / 16777216.0,
               k = pow(1.0 + u * za, zi) - 1.0;
        uint64_t kk = k < 0 ? 0 : k >= (double)R ? (uint64_t)R - 1 : (uint64_t)k;
        bb->ids[i] = (int64_t)((unsigned __int128)(kk * a + c) % (uint64_t)R); /* no overflow */
    }
    bb->n_ids = o;
    memset(&bb->k, 0, sizeof bb->k);
    bb->k.n_features = TF; bb->k.batch = TB; bb->k.lengths = bb->lengths; bb->k.ids = bb->ids;
}

static int64_t TIER_LOG; /* the tiered table's log_rows (0: the default, its rows) */
static dt_embed *tier_make(int64_t R, int tiered, int64_t cache) {
    dt_embed_table_desc t;
    dt_embed_feature_desc f[TF];
    dt_embed_desc d;
    dt_embed *e = NULL;
    int i;
    memset(&t, 0, sizeof t);
    t.name = "big"; t.rows = R; t.dim = TD; t.optim.kind = DT_EMBED_ROWWISE_ADAGRAD;
    t.init.kind = DT_INIT_CONST; t.init.value = 0.01; /* the values do not change the speed; random ones
                                                         take dt_tensor_init ~80 s per 8 GiB here */
    if (tiered) { t.tier = DT_TIER_DISK; t.cache_rows = cache; t.log_rows = TIER_LOG; }
    memset(f, 0, sizeof f);
    for (i = 0; i < TF; i++) { f[i].name = "f"; f[i].table = 0; }
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.features = f; d.n_features = TF; d.seed = 1;
    if (dt_embed_create(&C, &e, &d)) die("dt_embed_create (tiers)");
    return e;
}

typedef struct tier_run {
    dt_embed *e;
    dt_tensor out, dout, h, dh, w, dw;
    bbatch bb[2];                /* this step's batch and the next (made before the step is timed) */
    int step;                    /* batches used so far: step i reads batch i */
    double pf_s;                 /* seconds in dt_embed_prefetch */
} tier_run;

/* n steps of r's embedding (batches r->step, r->step + 1, ...), the seconds of each into t (if
   not NULL). With prefetch, each forward is followed by dt_embed_prefetch of the next batch, and
   the forward of a prefetched batch only ends it; the last step prefetches nothing, so the next
   call may run without prefetch. */
static void tier_steps(tier_run *r, int64_t R, int n, int prefetch, double *t) {
    int i;
    for (i = 0; i < n; i++) {
        bbatch *cur = &r->bb[r->step & 1], *nx = &r->bb[(r->step + 1) & 1];
        double t0;
        if (!prefetch || i == 0) tier_batch(cur, R, r->step); /* else made (and prefetched) last step */
        if (prefetch && i + 1 < n) tier_batch(nx, R, r->step + 1);
        t0 = wall_s();
        if (dt_embed_forward(r->e, &r->out, &cur->k)) die("tiers forward");
        if (prefetch && i + 1 < n) {
            double tp = wall_s();
            if (dt_embed_prefetch(r->e, &nx->k)) die("tiers prefetch");
            r->pf_s += wall_s() - tp;
        }
        /* the dense stand-in: h = out W, then dW = out^T dh and dout = dh W^T */
        if (dt_matmul_fwd(&C, &r->h, &r->out, &r->w, 0, 0, 1.0f, 0.0f)) die("dense");
        memcpy(r->dh.data, r->h.data, dt_tensor_bytes(&r->h));
        memset(r->dout.data, 0, dt_tensor_bytes(&r->dout));
        if (dt_matmul_bwd(&C, &r->dout, &r->dw, &r->dh, &r->out, &r->w, 0, 0, 1e-6f)) die("dense bwd");
        if (dt_embed_backward(r->e, &r->dout)) die("tiers backward");
        if (t) t[i] = wall_s() - t0;
        r->step++;
    }
}

static void tier_run_init(tier_run *r, dt_embed *e) {
    dt_tensor_desc td;
    int64_t i;
    memset(r, 0, sizeof *r);
    r->e = e;
    memset(&td, 0, sizeof td);
    td.ndim = 2;
    td.shape[0] = TB; td.shape[1] = TF * TD;
    if (dt_tensor_create(&C, &r->out, &td) || dt_tensor_create(&C, &r->dout, &td)) die("tensor");
    td.shape[1] = TDENSE;
    if (dt_tensor_create(&C, &r->h, &td) || dt_tensor_create(&C, &r->dh, &td)) die("tensor");
    td.shape[0] = TF * TD;
    if (dt_tensor_create(&C, &r->w, &td) || dt_tensor_create(&C, &r->dw, &td)) die("tensor");
    for (i = 0; i < r->w.numel; i++) ((float *)r->w.data)[i] = 0.05f * dt_rng_normal(77, 0, (uint64_t)i);
    for (i = 0; i < 2; i++) {
        r->bb[i].lengths = (int64_t *)malloc(sizeof(int64_t) * (size_t)(TF * TB));
        r->bb[i].ids = (int64_t *)malloc(sizeof(int64_t) * (size_t)(TF * TB * 7));
    }
}

static void tier_run_free(tier_run *r) {
    int i;
    dt_tensor_free(&C, &r->out); dt_tensor_free(&C, &r->dout); dt_tensor_free(&C, &r->h);
    dt_tensor_free(&C, &r->dh); dt_tensor_free(&C, &r->w); dt_tensor_free(&C, &r->dw);
    for (i = 0; i < 2; i++) { free(r->bb[i].lengths); free(r->bb[i].ids); }
    dt_embed_free(r->e);
}

/* The resident table first (warm-up, 3 rounds), then it is freed and the tiered table runs (until
   its cache is full and has evicted a quarter of it: the steady state; then 3 rounds each of
   prefetch on and off, interleaved). Sequential because both alive (8 GiB resident + the file's
   8 GiB of page cache + the cache, on 24 GiB) push part of the file out of the page cache and
   the tier then reads the disk: measured at 0.29 of the resident rate that way (bench/RESULTS.md);
   a tiered table is for when the resident one does not fit, so the fair comparison gives each
   the machine's memory in turn. */
static void tiers(double gib) {
    int64_t R = (int64_t)(gib * 1073741824.0 / (TD * 4.0)), cache = R / 8;
    const int per = 48, rounds = 3;
    tier_run res, tie;
    double *t[3], med[3], t0, hit, wait_share, spent = 0, ms[3][3] = {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
    dt_embed_tier_stats a, b, cur;
    int r, v, warm = 0, i;
    if (R < 1024) { fprintf(stderr, "bench/embed --tiers: %g GiB is too small\n", gib); exit(1); }
    printf("bench/embed --tiers: one table %lld rows x %d f32 (%.2f GiB, row-wise Adagrad), cache %lld rows (%.2f GiB), "
           "%d features x batch %d, bags 1..7, Zipf 1.05, dense stand-in [%d, %d] x [%d, %d]\n", (long long)R, TD,
           (double)R * TD * 4 / 1073741824.0, (long long)cache, (double)cache * TD * 4 / 1073741824.0, TF, TB, TB,
           TF * TD, TF * TD, TDENSE);
    fflush(stdout);
    for (v = 0; v < 3; v++) t[v] = (double *)malloc(sizeof(double) * (size_t)(rounds * per));
    t0 = wall_s();
    tier_run_init(&res, tier_make(R, 0, 0));
    printf("  resident table made in %.1f s\n", wall_s() - t0);
    tier_steps(&res, R, 64, 0, NULL);
    for (r = 0; r < rounds; r++) {
        dt_embed_stats s0, s1;
        dt_embed_stats_get(res.e, &s0);
        tier_steps(&res, R, per, 0, t[0] + r * per);
        dt_embed_stats_get(res.e, &s1);
        if (r == 0) memset(ms[0], 0, sizeof ms[0]);
        ms[0][0] += (s1.seconds_fwd - s0.seconds_fwd) * 1e3; ms[0][1] += (s1.seconds_bwd - s0.seconds_bwd) * 1e3;
    }
    tier_run_free(&res); /* its 8 GiB go back before the tiered table is made */
    t0 = wall_s();
    tier_run_init(&tie, tier_make(R, 1, cache));
    printf("  tiered table (a file in $TMPDIR or /tmp) made in %.1f s\n", wall_s() - t0);
    fflush(stdout);
    t0 = wall_s();
    do { /* warm-up: until the cache is full and has evicted for a while (at most 4000 steps) */
        tier_steps(&tie, R, 16, 1, NULL);
        warm += 16;
        dt_embed_tier_stats_get(tie.e, 0, &cur);
    } while ((cur.cached < cur.cache_rows || cur.evicted < cache / 4) && warm < 4000);
    printf("  warm-up: %d steps (%.0f s), the cache %lld of %lld rows, %lld evicted so far\n", warm, wall_s() - t0,
           (long long)cur.cached, (long long)cur.cache_rows, (long long)cur.evicted);
    fflush(stdout);
    dt_embed_tier_stats_get(tie.e, 0, &a);
    for (r = 0; r < rounds; r++)
        for (v = 1; v < 3; v++) {
            tier_run *x = &tie;
            double pf0 = x->pf_s;
            dt_embed_stats s0, s1;
            dt_embed_stats_get(x->e, &s0);
            tier_steps(x, R, per, v == 1, t[v] + r * per);
            dt_embed_stats_get(x->e, &s1);
            if (r == 0) memset(ms[v], 0, sizeof ms[v]);
            ms[v][0] += (s1.seconds_fwd - s0.seconds_fwd) * 1e3; ms[v][1] += (s1.seconds_bwd - s0.seconds_bwd) * 1e3;
            ms[v][2] += (x->pf_s - pf0) * 1e3;
        }
    dt_embed_tier_stats_get(tie.e, 0, &b);
    for (v = 0; v < 3; v++) {
        for (i = 0; i < rounds * per; i++) if (v > 0) spent += t[v][i];
        med[v] = median(t[v], rounds * per);
    }
    hit = 100.0 * (double)(b.hits - a.hits) / (double)(b.hits - a.hits + b.misses - a.misses);
    wait_share = 100.0 * (b.seconds_wait - a.seconds_wait) / spent;
    printf("%-52s %12s\n", "figure (median step of 3 rounds x 48; tiered interleaved)", "value");
    printf("%-52s %12.0f\n", "resident, samples/s", TB / med[0]);
    printf("%-52s %12.0f\n", "tiered with prefetch, samples/s", TB / med[1]);
    printf("%-52s %12.0f\n", "tiered without prefetch, samples/s", TB / med[2]);
    printf("%-52s %12.2f   (target >= 0.7)\n", "ratio tiered (prefetch) / resident", med[0] / med[1]);
    printf("%-52s %12.2f\n", "ratio tiered (no prefetch) / resident", med[0] / med[2]);
    printf("%-52s %12.1f\n", "cache hit rate, % (ids whose row was cached)", hit);
    printf("%-52s %12.0f\n", "rows read from the file per step", (double)(b.prefetched - a.prefetched +
           b.fetched - a.fetched) / (2.0 * rounds * per));
    printf("%-52s %12.1f\n", "MB in / step", (b.bytes_in - a.bytes_in) / 1e6 / (2.0 * rounds * per));
    printf("%-52s %12.1f\n", "MB written back / step", (b.bytes_out - a.bytes_out) / 1e6 / (2.0 * rounds * per));
    printf("%-52s %12.2f\n", "prefetch wait, % of the tiered steps", wait_share);
    for (v = 0; v < 3; v++)
        printf("  %-24s a step: embedding forward %6.2f ms, backward %6.2f ms, dt_embed_prefetch %6.2f ms\n",
               v == 0 ? "resident" : v == 1 ? "tiered, prefetch" : "tiered, no prefetch", ms[v][0] / (rounds * per),
               ms[v][1] / (rounds * per), ms[v][2] / (rounds * per));
    { /* the log's folds: a half folds in the background every log_rows / 2 write-backs (with the
         default log, every R / 2: none in these rounds at 8 GiB; pass a smaller log_rows to see
         them); the means include any step that waited for one; the flush folds the rest */
        dt_embed_tier_stats f;
        double mean[3] = {0, 0, 0}, wb = (double)(b.written_back - a.written_back) / (2.0 * rounds * per);
        for (v = 0; v < 3; v++) {
            for (i = 0; i < rounds * per; i++) mean[v] += t[v][i];
            mean[v] /= rounds * per;
        }
        printf("%-52s %12.2f\n", "ratio of the mean steps (prefetch) / resident", mean[0] / mean[1]);
        printf("%-52s %12lld\n", "log folds during the rounds", (long long)(b.folds - a.folds));
        printf("%-52s %12.3f\n", "  the caller's seconds in them", b.seconds_fold - a.seconds_fold);
        t0 = wall_s();
        if (dt_embed_flush(tie.e)) die("tiers flush");
        dt_embed_tier_stats_get(tie.e, 0, &f);
        printf("  log of %lld records (a half folds every %.0f steps); dt_embed_flush %.1f s, folding %lld rows "
               "home in %.1f s\n", (long long)(TIER_LOG ? TIER_LOG : R), wb > 0 ? (double)(TIER_LOG ? TIER_LOG : R) / 2 / wb : 0.0,
               wall_s() - t0, (long long)(f.folded - b.folded), f.seconds_fold - b.seconds_fold);
    }
    printf("tiered: table %.3g GiB cache %.3g GiB hit %.1f%% prefetch-wait %.1f%% ratio %.2f (resident = 1)\n",
           (double)R * TD * 4 / 1073741824.0, (double)cache * TD * 4 / 1073741824.0, hit, wait_share, med[0] / med[1]);
    tier_run_free(&tie);
    for (v = 0; v < 3; v++) free(t[v]);
}

int main(int argc, char **argv) {
    int T = 8, D = 64, L = 4, steps = 20, i;
    int64_t R = 100000, B = 2048, ids = 0;
    bbatch bb[4];
    dt_embed *e;
    double fwd, step, mc, torch_sps = 0, tbe_sps = 0, big_step, small_step, f2, gat, gat_h, fwd_h, step_h;
    dt_ctx_desc hd;
    if (argc > 1 && !strcmp(argv[1], "--single")) {
        dt_ctx_init(&C, NULL);
        single_grid(argc > 2 ? atoi(argv[2]) > 0 ? atoi(argv[2]) : 20 : 20);
        dt_ctx_shutdown(&C);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--tiers")) {
        double g = argc > 2 ? atof(argv[2]) : 8.0;
        if (!(g > 0) || g > 1e6) { fprintf(stderr, "bench/embed --tiers: GiB = '%s'; expected > 0\n", argv[2]); return 1; }
        if (argc > 3) {
            double lr = atof(argv[3]);
            if (!(lr >= 1 && lr < 2147483648.0)) {
                fprintf(stderr, "bench/embed --tiers: log_rows = '%s'; expected 1 .. 2^31 - 1\n", argv[3]);
                return 1;
            }
            TIER_LOG = (int64_t)lr;
        }
        dt_ctx_init(&C, NULL);
        tiers(g);
        dt_ctx_shutdown(&C);
        return 0;
    }
    if (argc > 1) T = atoi(argv[1]);
    if (argc > 2) R = atoll(argv[2]);
    if (argc > 3) D = atoi(argv[3]);
    if (argc > 4) B = atoll(argv[4]);
    if (argc > 5) L = atoi(argv[5]);
    if (argc > 6) steps = atoi(argv[6]);
    if (T < 1 || R < 1 || D < 1 || B < 1 || L < 1 || steps < 1) { fprintf(stderr, "bench/embed: bad arguments\n"); return 1; }
    dt_ctx_init(&C, NULL);
    printf("bench/embed: %d tables x %lld rows x %d (f32, sum pooling, Adagrad), batch %lld, bags of 1..%d ids, "
           "1 thread, median of %d steps\n", T, (long long)R, D, (long long)B, 2 * L - 1, steps);
    for (i = 0; i < 4; i++) { make_batch(&bb[i], T, R, B, L, 100 + (uint64_t)i); ids += bb[i].n_ids; }
    ids /= 4;
    mc = memcpy_gbs((size_t)256 << 20); /* 8x the 32 MiB L3 of the machine in bench/RESULTS.md */
    e = make(&C, T, R, D, DT_EMBED_ADAGRAD);
    run(e, bb, 4, steps, &fwd, &step);
    gat = gather_pass(e, bb, 4, steps);
    dt_embed_free(e);
    memset(&hd, 0, sizeof hd);
    hd.allocator.alloc_fn = huge_alloc; hd.allocator.release_fn = huge_release;
    if (dt_ctx_init(&CH, &hd)) die("dt_ctx_init");
    e = make(&CH, T, R, D, DT_EMBED_ADAGRAD); /* the same tables in 2 MiB pages */
    run(e, bb, 4, steps, &fwd_h, &step_h);
    gat_h = gather_pass(e, bb, 4, steps);
    dt_embed_free(e);
    torch_sps = torch_run(T, R, D, B, L, steps, "adagrad", "bag"); /* the PyTorch peer, same shapes, now */
    tbe_sps = torch_run(T, R, D, B, L, steps, "adagrad", "tbe");   /* FBGEMM's table-batched kernel, TorchRec's */
    printf("%-52s %12s\n", "figure", "value");
    printf("%-52s %12.0f\n", "dt_embed fwd+bwd+Adagrad, samples/s", (double)B / step);
    printf("%-52s %12.0f\n", "the same, tables in 2 MiB pages (huge_alloc)", (double)B / step_h);
    if (torch_sps > 0) {
        printf("%-52s %12.0f\n", "torch EmbeddingBag + sparse Adagrad, samples/s", torch_sps);
        printf("%-52s %12.2f   (target >= 1.5)\n", "ratio dt / torch", (double)B / step / torch_sps);
    } else printf("%-52s %12s\n", "torch peer", "not run (needs $DT_PEERS_PYTHON or /usr/bin/python3 with torch)");
    if (tbe_sps > 0) {
        printf("%-52s %12.0f\n", "FBGEMM TBE (CPU) + exact Adagrad, samples/s", tbe_sps);
        printf("%-52s %12.2f\n", "ratio dt / FBGEMM TBE", (double)B / step / tbe_sps);
    } else printf("%-52s %12s\n", "FBGEMM TBE peer", "not run (needs fbgemm-gpu-cpu: ./build.sh bench's build/peers)");
    printf("%-52s %12.2f\n", "gather + pool pass: rows gathered, GB/s", (double)ids * D * 4 / gat / 1e9);
    printf("%-52s %12.2f\n", "whole forward: rows gathered, GB/s", (double)ids * D * 4 / fwd / 1e9);
    printf("%-52s %12.2f\n", "memcpy 256 MiB, GB/s (bytes copied)", mc);
    printf("%-52s %12.2f   (target >= 0.5)\n", "ratio gathered / memcpy (gather + pool pass)",
           (double)ids * D * 4 / gat / 1e9 / mc);
    printf("%-52s %12.2f\n", "ratio gathered / memcpy (whole forward)", (double)ids * D * 4 / fwd / 1e9 / mc);
    printf("%-52s %12.2f\n", "ratio gathered / memcpy (pass, 2 MiB pages)", (double)ids * D * 4 / gat_h / 1e9 / mc);
    printf("%-52s %12.2f\n", "ratio gathered / memcpy (forward, 2 MiB pages)", (double)ids * D * 4 / fwd_h / 1e9 / mc);
    /* no O(rows) step: the same batch shape on 10M rows and on 100k rows (dim 16, SGD), with
       malloc's 4 KiB pages and with huge_alloc's 2 MiB pages */
    {
        bbatch b2[4], b3[4];
        double big_h, small_h;
        for (i = 0; i < 4; i++) {
            make_batch(&b2[i], 1, 10000000, B, L, 200 + (uint64_t)i);
            make_batch(&b3[i], 1, 100000, B, L, 200 + (uint64_t)i);
        }
        e = make(&C, 1, 10000000, 16, DT_EMBED_SGD);
        run(e, b2, 4, steps, &f2, &big_step);
        dt_embed_free(e);
        e = make(&C, 1, 100000, 16, DT_EMBED_SGD);
        run(e, b3, 4, steps, &f2, &small_step);
        dt_embed_free(e);
        e = make(&CH, 1, 10000000, 16, DT_EMBED_SGD);
        run(e, b2, 4, steps, &f2, &big_h);
        dt_embed_free(e);
        e = make(&CH, 1, 100000, 16, DT_EMBED_SGD);
        run(e, b3, 4, steps, &f2, &small_h);
        dt_embed_free(e);
        for (i = 0; i < 4; i++) { free(b2[i].lengths); free(b2[i].ids); free(b3[i].lengths); free(b3[i].ids); }
        printf("%-52s %12.3f\n", "step on 10M rows, ms", big_step * 1e3);
        printf("%-52s %12.3f\n", "step on 100k rows, ms", small_step * 1e3);
        printf("%-52s %12.2f   (about 1: no O(rows) work)\n", "ratio 10M / 100k", big_step / small_step);
        printf("%-52s %12.3f\n", "step on 10M rows, 2 MiB pages (huge_alloc), ms", big_h * 1e3);
        printf("%-52s %12.3f\n", "step on 100k rows, 2 MiB pages, ms", small_h * 1e3);
        printf("%-52s %12.2f\n", "ratio 10M / 100k, 2 MiB pages", big_h / small_h);
        { /* the peer on the same two tables (one table, dim 16, sparse SGD): what the memory system
             charges a 10M-row table there */
            double tb = torch_run(1, 10000000, 16, B, L, steps, "sgd", "bag"),
                   tsm = torch_run(1, 100000, 16, B, L, steps, "sgd", "bag");
            if (tb > 0 && tsm > 0) {
                printf("%-52s %12.3f\n", "torch step on 10M rows (SGD), ms", (double)B / tb * 1e3);
                printf("%-52s %12.3f\n", "torch step on 100k rows (SGD), ms", (double)B / tsm * 1e3);
                printf("%-52s %12.2f\n", "torch ratio 10M / 100k", tsm / tb);
            }
        }
        dt_ctx_shutdown(&CH);
    }
    for (i = 0; i < 4; i++) { free(bb[i].lengths); free(bb[i].ids); }
    single_grid(steps);
    tiers(8.0);
    dt_ctx_shutdown(&C);
    return 0;
}
