// np: 4
/* bench/comm.c - dt_comm.h collectives beside the same calls made with raw MPI, in one run.

   For each group size (2, then 4 when the world has 4 ranks; ranks outside the group sleep) and
   each collective, the bus bandwidth of dt and of raw MPI from 1 KB to DT_BENCH_MAX_MB (default
   256 MB) in steps of 4x, medians of several reps, and dt/raw. Sizes follow nccl-tests: the
   buffer for all-reduce and broadcast, the whole (size x block) buffer for reduce-scatter,
   all-gather and all-to-all; busbw = size / time x (2(n-1)/n all-reduce, (n-1)/n reduce-scatter,
   all-gather, all-to-all, 1 broadcast). Time is the slowest rank's, from a barrier to return.
   Then gradient sync of 200 tensors of 10k floats: the bucketer against one all-reduce each.

       mpirun --oversubscribe -np 4 build/bench/comm          (./build.sh bench runs it)
       DT_BENCH_MAX_MB=64 mpirun ...                             (a shorter sweep)
       DT_BENCH_ONLY=allreduce,buckets mpirun ...                 (only these parts)

   The raw peers: MPI_Allreduce (in place), MPI_Reduce_scatter_block, MPI_Allgather, MPI_Bcast,
   MPI_Alltoall on a communicator of the same ranks. dt's all-reduce and reduce-scatter add in
   rank order itself (see dt_comm.h, "Sum order"), so they are the same-size message moved by
   MPI all-gather / all-to-all plus a local sum, against MPI's own reduction. */
#define _POSIX_C_SOURCE 200809L
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

enum { ALLREDUCE, REDUCE_SCATTER, ALLGATHER, BROADCAST, ALLTOALL, NCOLL };
static const char *const NAMES[NCOLL] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall"};
static const dt_coll KINDS[NCOLL] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER, DT_COLL_BROADCAST,
                                     DT_COLL_ALLTOALL};

static dt_ctx ctx;
static int R, NW;

/* Whether DT_BENCH_ONLY (a comma-separated list of collective names and "buckets") asks for
   this part; unset or empty: every part. */
static int wanted(const char *name) {
    const char *only = getenv("DT_BENCH_ONLY"), *p;
    size_t n = strlen(name);
    if (!only || !only[0]) return 1;
    for (p = only; (p = strstr(p, name)) != NULL; p += n)
        if ((p == only || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return 1;
    return 0;
}

/* Ranks outside the measured group wait here without spinning on a core. */
static void sleepy_barrier(void) {
    MPI_Request r;
    int done = 0;
    struct timespec ts = {0, 1000000};
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    while (!done) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) nanosleep(&ts, NULL);
    }
}

/* One call, dt or raw; a is the buffer (all-reduce, broadcast) or the input, b the output. */
static int run_one(int coll, int raw, dt_comm *g, MPI_Comm rc, dt_tensor *a, dt_tensor *b, int64_t count, int n) {
    dt_tensor in, out;
    int64_t blk = count / n;
    if (!raw) {
        switch (coll) {
        case ALLREDUCE:
            dt_tensor_view(&ctx, &in, a, 0, 1, &count);
            return dt_comm_allreduce(g, &in, DT_REDUCE_SUM);
        case REDUCE_SCATTER:
            dt_tensor_view(&ctx, &in, a, 0, 1, &count);
            dt_tensor_view(&ctx, &out, b, 0, 1, &blk);
            return dt_comm_reduce_scatter(g, &out, &in, DT_REDUCE_SUM);
        case ALLGATHER:
            dt_tensor_view(&ctx, &in, a, 0, 1, &blk);
            dt_tensor_view(&ctx, &out, b, 0, 1, &count);
            return dt_comm_allgather(g, &out, &in);
        case BROADCAST:
            dt_tensor_view(&ctx, &in, a, 0, 1, &count);
            return dt_comm_broadcast(g, &in, 0);
        default:
            dt_tensor_view(&ctx, &in, a, 0, 1, &count);
            dt_tensor_view(&ctx, &out, b, 0, 1, &count);
            return dt_comm_alltoall(g, &out, &in);
        }
    }
    switch (coll) {
    case ALLREDUCE: return MPI_Allreduce(MPI_IN_PLACE, a->data, (int)count, MPI_FLOAT, MPI_SUM, rc);
    case REDUCE_SCATTER: return MPI_Reduce_scatter_block(a->data, b->data, (int)blk, MPI_FLOAT, MPI_SUM, rc);
    case ALLGATHER: return MPI_Allgather(a->data, (int)blk, MPI_FLOAT, b->data, (int)blk, MPI_FLOAT, rc);
    case BROADCAST: return MPI_Bcast(a->data, (int)count, MPI_FLOAT, 0, rc);
    default: return MPI_Alltoall(a->data, (int)blk, MPI_FLOAT, b->data, (int)blk, MPI_FLOAT, rc);
    }
}

/* Seconds of one call: from a barrier to the slowest rank's return. */
static double timed(int coll, int raw, dt_comm *g, MPI_Comm rc, dt_tensor *a, dt_tensor *b, int64_t count, int n) {
    double t0, t, tmax;
    MPI_Barrier(rc);
    t0 = MPI_Wtime();
    if (run_one(coll, raw, g, rc, a, b, count, n) != 0) {
        fprintf(stderr, "bench/comm: %s %s failed: %s\n", raw ? "raw" : "dt", NAMES[coll], dt_ctx_error(&ctx));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    t = MPI_Wtime() - t0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, rc);
    return tmax;
}

static void size_str(char *buf, size_t n, double bytes) {
    if (bytes >= 1 << 20) snprintf(buf, n, "%g MB", bytes / (1 << 20));
    else snprintf(buf, n, "%g KB", bytes / 1024);
}

/* The sweep for one group; returns the smallest dt/raw from 1 MB up, per collective. */
static void sweep(dt_comm *g, MPI_Comm rc, int n, int64_t max_bytes, double *worst) {
    dt_tensor a, b;
    dt_tensor_desc d;
    int coll;
    int64_t bytes;
    memset(&d, 0, sizeof d);
    d.shape[0] = max_bytes / 4;
    dt_tensor_create(&ctx, &a, &d);
    dt_tensor_create(&ctx, &b, &d);
    /* zeros: in-place sums repeated many times stay finite (the arithmetic costs the same) */
    if (R == 0) {
        printf("\n%d ranks: busbw GB/s, median of reps (time in ms)\n", n);
        printf("%-15s %9s %5s %12s %12s %10s %10s %7s\n", "collective", "size", "reps", "dt busbw", "raw busbw", "dt ms",
               "raw ms", "dt/raw");
    }
    for (coll = 0; coll < NCOLL; coll++) {
        worst[coll] = 1e30;
        if (!wanted(NAMES[coll])) continue;
        for (bytes = 1024; bytes <= max_bytes; bytes *= 4) {
            int64_t count = bytes / 4 / n * n;
            int reps = bytes <= (64 << 10) ? 41 : bytes <= (4 << 20) ? 15 : bytes <= (64 << 20) ? 7 : 5, k;
            double td[64], tr[64], md, mr, f = dt_coll_bus_factor(KINDS[coll], n), sz = (double)count * 4;
            char s[32];
            timed(coll, 0, g, rc, &a, &b, count, n); /* warm-up: page faults, scratch pool */
            timed(coll, 1, g, rc, &a, &b, count, n);
            for (k = 0; k < reps; k++) { /* interleaved, so drift hits both alike */
                td[k] = timed(coll, 0, g, rc, &a, &b, count, n);
                tr[k] = timed(coll, 1, g, rc, &a, &b, count, n);
            }
            md = median(td, reps);
            mr = median(tr, reps);
            if (bytes >= (1 << 20) && mr / md < worst[coll]) worst[coll] = mr / md;
            size_str(s, sizeof s, sz);
            if (R == 0)
                printf("%-15s %9s %5d %12.3f %12.3f %10.3f %10.3f %7.2f\n", NAMES[coll], s, reps, sz / md / 1e9 * f,
                       sz / mr / 1e9 * f, md * 1e3, mr * 1e3, mr / md);
            fflush(stdout);
        }
    }
    dt_tensor_free(&ctx, &a);
    dt_tensor_free(&ctx, &b);
}

/* Seconds (slowest rank) of one gradient sync of ps: through bucketer bk (grads marked ready in
   backward order, then finish), or one dt all-reduce per tensor (bk NULL, raw 0), or one raw
   MPI_Allreduce per tensor (raw 1). */
static double sync_once(dt_bucketer *bk, dt_comm *g, MPI_Comm rc, dt_params *ps, int raw) {
    double t0, t, tm;
    int i;
    MPI_Barrier(rc);
    t0 = MPI_Wtime();
    if (bk) {
        for (i = ps->count - 1; i >= 0; i--) dt_bucketer_mark_ready(bk, ps->items[i]);
        dt_bucketer_finish(bk);
    } else if (!raw) {
        for (i = ps->count - 1; i >= 0; i--) dt_comm_allreduce(g, &ps->items[i]->grad, DT_REDUCE_AVG);
    } else {
        for (i = ps->count - 1; i >= 0; i--)
            MPI_Allreduce(MPI_IN_PLACE, ps->items[i]->grad.data, (int)ps->items[i]->grad.numel, MPI_FLOAT, MPI_SUM, rc);
    }
    t = MPI_Wtime() - t0;
    MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, rc);
    return tm;
}

/* 200 grads of 10k floats: the bucketer (default 25 MB buckets, 1 MB first; grads copied in and
   out, or grads as views into the buckets) against one dt all-reduce per tensor and one raw
   MPI_Allreduce per tensor. */
static void bucketing(dt_comm *g, MPI_Comm rc, int n) {
    enum { NT = 200, REPS = 15 };
    dt_params ps;
    dt_bucketer *bk = NULL, *bv = NULL;
    dt_bucketer_desc views;
    double tb[REPS], tv[REPS], tp[REPS], tr[REPS], tf[REPS], tfr[REPS], mb, mv, mp, mr, mf, mfr;
    int i, k, nb;
    memset(&ps, 0, sizeof ps);
    for (i = 0; i < NT; i++) {
        dt_param_desc d;
        char name[16];
        memset(&d, 0, sizeof d);
        snprintf(name, sizeof name, "g%d", i);
        d.name = name;
        d.shape[0] = 10000;
        dt_params_add(&ctx, &ps, NULL, &d);
    }
    dt_bucketer_create(g, &bk, &ps, NULL);
    nb = dt_bucketer_count(bk);
    for (k = -1; k < REPS; k++) { /* k = -1: warm-up; the three ways interleaved */
        double t = sync_once(bk, g, rc, &ps, 0);
        if (k >= 0) tb[k] = t;
        t = sync_once(NULL, g, rc, &ps, 0);
        if (k >= 0) tp[k] = t;
        t = sync_once(NULL, g, rc, &ps, 1);
        if (k >= 0) tr[k] = t;
    }
    dt_bucketer_free(bk);
    memset(&views, 0, sizeof views);
    views.grad_views = 1;
    dt_bucketer_create(g, &bv, &ps, &views);
    for (k = -1; k < REPS; k++) {
        double t = sync_once(bv, g, rc, &ps, 0);
        if (k >= 0) tv[k] = t;
    }
    dt_bucketer_free(bv);
    {   /* the floor for any bucketing: all the gradient bytes in one all-reduce */
        dt_tensor flat;
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.shape[0] = (int64_t)NT * 10000;
        dt_tensor_create(&ctx, &flat, &d);
        for (k = -1; k < REPS; k++) {
            double t0, t, tm;
            MPI_Barrier(rc);
            t0 = MPI_Wtime();
            dt_comm_allreduce(g, &flat, DT_REDUCE_AVG);
            t = MPI_Wtime() - t0;
            MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, rc);
            if (k >= 0) tf[k] = tm;
            MPI_Barrier(rc);
            t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, flat.data, (int)flat.numel, MPI_FLOAT, MPI_SUM, rc);
            t = MPI_Wtime() - t0;
            MPI_Allreduce(&t, &tm, 1, MPI_DOUBLE, MPI_MAX, rc);
            if (k >= 0) tfr[k] = tm;
        }
        dt_tensor_free(&ctx, &flat);
    }
    mb = median(tb, REPS);
    mv = median(tv, REPS);
    mp = median(tp, REPS);
    mr = median(tr, REPS);
    mf = median(tf, REPS);
    mfr = median(tfr, REPS);
    if (R == 0) {
        printf("\n%d ranks: gradient sync of %d tensors x 10k f32 (%.1f MB), %d buckets, median of %d\n", n, NT,
               NT * 40000.0 / (1 << 20), nb, REPS);
        printf("  dt_comm_allreduce per tensor                 %8.3f ms\n", mp * 1e3);
        printf("  raw MPI_Allreduce per tensor                 %8.3f ms\n", mr * 1e3);
        printf("  bucketer, grads copied in and out            %8.3f ms   speedup %.2fx over dt per tensor, %.2fx over raw\n",
               mb * 1e3, mp / mb, mr / mb);
        printf("  bucketer, grads as bucket views (grad_views) %8.3f ms   speedup %.2fx over dt per tensor, %.2fx over raw\n",
               mv * 1e3, mp / mv, mr / mv);
        printf("  floor: one all-reduce of all %.1f MB         %8.3f ms dt, %.3f ms raw: no bucketing can beat %.2fx over dt per tensor\n",
               NT * 40000.0 / (1 << 20), mf * 1e3, mfr * 1e3, mp / mf);
    }
    dt_params_free(&ctx, &ps);
}

int main(void) {
    dt_comm *w = NULL;
    int64_t max_bytes = 256 << 20;
    const char *env = getenv("DT_BENCH_MAX_MB");
    int sizes[2] = {2, 4}, s;
    double worst[2][NCOLL];
    dt_ctx_init(&ctx, NULL);
    if (dt_comm_create_world(&ctx, &w, NULL)) {
        fprintf(stderr, "bench/comm: %s\n", dt_ctx_error(&ctx));
        return 1;
    }
    if (env && atoi(env) > 0) max_bytes = (int64_t)atoi(env) << 20;
    R = dt_comm_rank(w);
    NW = dt_comm_size(w);
    if (R == 0) {
        char host[MPI_MAX_PROCESSOR_NAME];
        int len;
        time_t now = time(NULL);
        MPI_Get_processor_name(host, &len);
        printf("bench/comm: dt_comm.h vs raw MPI, world of %d ranks on %s, %s", NW, host, ctime(&now));
        printf("sizes 1 KB .. %lld MB; ranks outside the measured group sleep\n", (long long)(max_bytes >> 20));
    }
    for (s = 0; s < 2; s++) {
        int n = sizes[s];
        dt_comm *g = NULL;
        MPI_Comm rc = MPI_COMM_NULL;
        if (n > NW) break;
        dt_comm_split(w, &g, R < n ? 0 : -1, R);
        MPI_Comm_split(MPI_COMM_WORLD, R < n ? 0 : MPI_UNDEFINED, R, &rc);
        if (g) {
            sweep(g, rc, n, max_bytes, worst[s]);
            if (wanted("buckets")) bucketing(g, rc, n);
            MPI_Comm_free(&rc);
            dt_comm_free(g);
        }
        sleepy_barrier();
    }
    if (R == 0) {
        int c;
        printf("\nsmallest dt/raw (time ratio raw/dt) from 1 MB up:\n");
        for (c = 0; c < NCOLL; c++) {
            if (!wanted(NAMES[c])) continue;
            printf("  %-15s", NAMES[c]);
            for (s = 0; s < 2 && sizes[s] <= NW; s++) printf("  np %d: %.2f", sizes[s], worst[s][c]);
            printf("\n");
        }
    }
    dt_comm_free(w);
    dt_ctx_shutdown(&ctx);
    return 0;
}
