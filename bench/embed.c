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

       build/bench/embed [T R D B L steps]     defaults 8 100000 64 2048 4 20 */
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
   backward as usual. */
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

/* samples/s of bench/embed_torch.py on these shapes (0: not run) */
static double torch_run(int T, int64_t R, int D, int64_t B, int L, int steps, const char *opt) {
    char cmd[512], line[256];
    double sps = 0;
    FILE *p;
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 bench/embed_torch.py %d %lld %d %lld %d %d %s 2>&1", T, (long long)R, D,
             (long long)B, L, steps, opt);
    if ((p = popen(cmd, "r"))) {
        while (fgets(line, sizeof line, p))
            if (sscanf(line, "torch samples/s %lf", &sps) == 1) break;
        pclose(p);
    }
    return sps;
}

int main(int argc, char **argv) {
    int T = 8, D = 64, L = 4, steps = 20, i;
    int64_t R = 100000, B = 2048, ids = 0;
    bbatch bb[4];
    dt_embed *e;
    double fwd, step, mc, torch_sps = 0, big_step, small_step, f2, gat, gat_h, fwd_h, step_h;
    dt_ctx_desc hd;
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
    torch_sps = torch_run(T, R, D, B, L, steps, "adagrad"); /* the PyTorch peer, same shapes, now */
    printf("%-52s %12s\n", "figure", "value");
    printf("%-52s %12.0f\n", "dt_embed fwd+bwd+Adagrad, samples/s", (double)B / step);
    printf("%-52s %12.0f\n", "the same, tables in 2 MiB pages (huge_alloc)", (double)B / step_h);
    if (torch_sps > 0) {
        printf("%-52s %12.0f\n", "torch EmbeddingBag + sparse Adagrad, samples/s", torch_sps);
        printf("%-52s %12.2f   (target >= 1.5)\n", "ratio dt / torch", (double)B / step / torch_sps);
    } else printf("%-52s %12s\n", "torch peer", "not run (needs /usr/bin/python3 with torch)");
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
            double tb = torch_run(1, 10000000, 16, B, L, steps, "sgd"), tsm = torch_run(1, 100000, 16, B, L, steps, "sgd");
            if (tb > 0 && tsm > 0) {
                printf("%-52s %12.3f\n", "torch step on 10M rows (SGD), ms", (double)B / tb * 1e3);
                printf("%-52s %12.3f\n", "torch step on 100k rows (SGD), ms", (double)B / tsm * 1e3);
                printf("%-52s %12.2f\n", "torch ratio 10M / 100k", tsm / tb);
            }
        }
        dt_ctx_shutdown(&CH);
    }
    for (i = 0; i < 4; i++) { free(bb[i].lengths); free(bb[i].ids); }
    dt_ctx_shutdown(&C);
    return 0;
}
