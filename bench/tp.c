// np: 2
/* bench/tp.c - a Megatron MLP block (layernorm, column-parallel C -> 4C, GELU, row-parallel
   4C -> C, residual), forward + backward, timed in one run:
     single   the block with dt_tensor.h ops on rank 0 alone (the others wait asleep): the peer
     tp 1     the block through dt_tp_* on a layout of one rank (no communication): their cost
     tp 2     the block split over 2 ranks, sp 0 (all-reduces) and sp 1 (all-gather +
              reduce-scatter), when the world has 2 ranks or more (ranks past 2 wait asleep)
   For each: the median step time (the slowest rank's, from a barrier), the time spent in tp
   collectives (dt_comm_stats: post to completion, so the column-parallel backward's all-reduce
   counts in full although the dW GEMM runs while it travels), its fraction of the step, the
   speedup over the single-rank block and the scaling efficiency speedup / tp.

       mpirun --oversubscribe -np 2 build/bench/tp               (./build.sh bench runs it)
       DT_BENCH_N=512 DT_BENCH_C=512 DT_BENCH_REPS=21 mpirun ...   (rows, width, steps)

   One BLAS thread per rank (build.sh sets OPENBLAS_NUM_THREADS=1), so tp 2 uses two cores
   where the single-rank block uses one. */
#define _POSIX_C_SOURCE 200809L
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

static dt_ctx ctx;
static int64_t N = 256, C = 256, H = 1024;
static int REPS = 15, WR;

#define CK(x) do { dt_status s_ = (x); if (s_) { \
    fprintf(stderr, "[rank %d] %s:%d: %s: %s\n", WR, __FILE__, __LINE__, #x, dt_ctx_error(&ctx)); \
    MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int64_t env_int(const char *name, int64_t def) {
    const char *v = getenv(name);
    return v && atoll(v) > 0 ? atoll(v) : def;
}

/* Ranks that take no part in a measurement wait here without spinning on a core. */
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

static dt_tensor *tensor(int64_t r, int64_t c) {
    dt_tensor *t = (dt_tensor *)calloc(1, sizeof *t);
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32;
    d.shape[0] = r;
    d.shape[1] = c;
    d.ndim = c ? 2 : 1;
    CK(dt_tensor_create(&ctx, t, &d));
    return t;
}

static void init(dt_tensor *t, const char *name, double mean, double std, const dt_param_desc *shard) {
    dt_init_desc in;
    memset(&in, 0, sizeof in);
    in.kind = DT_INIT_NORMAL;
    in.seed = 5;
    in.name = name;
    in.mean = mean;
    in.std = std;
    if (shard) {
        memcpy(in.global_shape, shard->global_shape, sizeof in.global_shape);
        memcpy(in.start, shard->start, sizeof in.start);
    }
    CK(dt_tensor_init(&ctx, t, &in));
}

/* The block's tensors on one tp rank (l NULL: the whole block, plain ops). */
typedef struct block {
    dt_layout *l;
    int sp;
    int64_t nl, Hl;
    dt_tensor *x, *dy, *lw, *lb, *w1, *b1, *w2, *b2;                       /* inputs, params */
    dt_tensor *ln, *mu, *rs, *xbuf, *h, *a, *y, *partial, *out;            /* forward */
    dt_tensor *dx, *dln, *dh, *da, *dxbuf, *dw1, *db1, *dw2, *db2, *dlw, *dlb; /* backward */
} block;

static dt_tensor *param(dt_layout *l, dt_tp_kind kind, const char *name, int64_t r, int64_t c, double mean, double std) {
    dt_param_desc d;
    dt_tensor *t;
    if (!l) { t = tensor(r, c); init(t, name, mean, std, NULL); return t; }
    memset(&d, 0, sizeof d);
    CK(dt_tp_param_desc(l, &d, kind, r, c));
    t = tensor(d.shape[0], d.ndim > 1 ? d.shape[1] : 0);
    init(t, name, mean, std, &d);
    return t;
}

static void block_make(block *b, dt_layout *l, int sp) {
    int tp = l ? l->tp : 1;
    memset(b, 0, sizeof *b);
    b->l = l; b->sp = sp;
    b->nl = sp ? N / tp : N; b->Hl = H / tp;
    b->x = tensor(b->nl, C); init(b->x, "x", 0, 1, NULL);
    b->dy = tensor(b->nl, C); init(b->dy, "dy", 0, 1, NULL);
    b->lw = param(l, DT_TP_REPLICATED, "ln.w", C, 0, 1, 0.1);
    b->lb = param(l, DT_TP_REPLICATED, "ln.b", C, 0, 0, 0.1);
    b->w1 = param(l, DT_TP_COLUMN, "w1", H, C, 0, 0.02);
    b->b1 = param(l, DT_TP_COLUMN, "b1", H, 0, 0, 0.02);
    b->w2 = param(l, DT_TP_ROW, "w2", C, H, 0, 0.02);
    b->b2 = param(l, DT_TP_REPLICATED, "b2", C, 0, 0, 0.02);
    b->ln = tensor(b->nl, C); b->mu = tensor(b->nl, 0); b->rs = tensor(b->nl, 0);
    b->xbuf = tensor(N, C); b->h = tensor(N, b->Hl); b->a = tensor(N, b->Hl);
    b->y = tensor(b->nl, C); b->partial = tensor(N, C); b->out = tensor(b->nl, C);
    b->dx = tensor(b->nl, C); b->dln = tensor(b->nl, C); b->dh = tensor(N, b->Hl); b->da = tensor(N, b->Hl);
    b->dxbuf = tensor(N, C);
    b->dw1 = tensor(b->Hl, C); b->db1 = tensor(b->Hl, 0); b->dw2 = tensor(C, b->Hl); b->db2 = tensor(C, 0);
    b->dlw = tensor(C, 0); b->dlb = tensor(C, 0);
}

static void block_free(block *b) {
    dt_tensor **all[] = {&b->x, &b->dy, &b->lw, &b->lb, &b->w1, &b->b1, &b->w2, &b->b2, &b->ln, &b->mu, &b->rs,
                         &b->xbuf, &b->h, &b->a, &b->y, &b->partial, &b->out, &b->dx, &b->dln, &b->dh, &b->da,
                         &b->dxbuf, &b->dw1, &b->db1, &b->dw2, &b->db2, &b->dlw, &b->dlb};
    size_t i;
    for (i = 0; i < sizeof all / sizeof all[0]; i++) { dt_tensor_free(&ctx, *all[i]); free(*all[i]); }
}

/* One training step of the block: forward, backward (grads accumulate, as in a real step). */
static void block_step(block *b) {
    dt_layout *l = b->l;
    int sp = b->sp;
    CK(dt_layernorm_fwd(&ctx, b->ln, b->mu, b->rs, b->x, b->lw, b->lb, 1e-5f));
    if (l) CK(dt_tp_column_linear_fwd(l, b->h, sp ? b->xbuf : NULL, b->ln, b->w1, b->b1, sp));
    else CK(dt_linear_fwd(&ctx, b->h, b->ln, b->w1, b->b1));
    CK(dt_gelu_fwd(&ctx, b->a, b->h));
    if (l) CK(dt_tp_row_linear_fwd(l, b->y, b->partial, b->a, b->w2, b->b2, sp));
    else CK(dt_linear_fwd(&ctx, b->y, b->a, b->w2, b->b2));
    CK(dt_add(&ctx, b->out, b->x, b->y));
    CK(dt_tensor_copy(&ctx, b->dx, b->dy));
    CK(dt_tensor_fill(&ctx, b->da, 0));
    CK(dt_tensor_fill(&ctx, b->dh, 0));
    CK(dt_tensor_fill(&ctx, b->dln, 0));
    if (l) CK(dt_tp_row_linear_bwd(l, b->da, b->dw2, b->db2, b->partial, b->dy, b->a, b->w2, sp));
    else CK(dt_linear_bwd(&ctx, b->da, b->dw2, b->db2, b->dy, b->a, b->w2));
    CK(dt_gelu_bwd(&ctx, b->dh, b->da, b->h));
    if (l) CK(dt_tp_column_linear_bwd(l, b->dln, b->dw1, b->db1, b->dxbuf, b->dh, sp ? b->xbuf : b->ln, b->w1, sp));
    else CK(dt_linear_bwd(&ctx, b->dln, b->dw1, b->db1, b->dh, b->ln, b->w1));
    CK(dt_layernorm_bwd(&ctx, b->dx, b->dlw, b->dlb, b->dln, b->x, b->lw, b->mu, b->rs));
    if (l && sp) { /* the sharded region's grads, summed over tp before a step */
        CK(dt_tp_allreduce(l, b->dlw));
        CK(dt_tp_allreduce(l, b->dlb));
        CK(dt_tp_allreduce(l, b->db2));
    }
}

typedef struct result { double step, comm; } result;

/* Median step time over the ranks in `group` (the slowest rank of each step), and the mean time
   per step in tp collectives (the slowest rank's). Ranks outside the group call sleepy_barrier. */
static result measure(block *b, MPI_Comm group) {
    double *t = (double *)malloc(sizeof(double) * (size_t)REPS), comm = 0;
    result r;
    int i, k;
    dt_coll kinds[3] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER};
    for (i = 0; i < 2; i++) block_step(b); /* warm: scratch, page faults */
    if (b->l) dt_comm_stats_reset(b->l->tp_comm);
    for (i = 0; i < REPS; i++) {
        double t0, dt1;
        MPI_Barrier(group);
        t0 = now_s();
        block_step(b);
        dt1 = now_s() - t0;
        MPI_Allreduce(&dt1, &t[i], 1, MPI_DOUBLE, MPI_MAX, group);
    }
    if (b->l)
        for (k = 0; k < 3; k++) {
            dt_comm_stat s;
            CK(dt_comm_stats(b->l->tp_comm, &s, kinds[k]));
            comm += s.seconds;
        }
    comm /= REPS;
    MPI_Allreduce(&comm, &r.comm, 1, MPI_DOUBLE, MPI_MAX, group);
    r.step = median(t, REPS);
    free(t);
    return r;
}

int main(void) {
    dt_comm *world = NULL, *alone = NULL, *pair = NULL;
    dt_layout *l1 = NULL, *l2 = NULL;
    MPI_Comm solo, duo;
    result single = {0, 0}, tp1 = {0, 0}, tp2[2] = {{0, 0}, {0, 0}};
    block b;
    int size, sp;
    double flops;
    N = env_int("DT_BENCH_N", N);
    C = env_int("DT_BENCH_C", C);
    H = 4 * C;
    REPS = (int)env_int("DT_BENCH_REPS", REPS);
    dt_ctx_init(&ctx, NULL);
    CK(dt_comm_create_world(&ctx, &world, NULL));
    WR = dt_comm_rank(world);
    size = dt_comm_size(world);
    if (N % 2 || H % 2) { if (!WR) fprintf(stderr, "bench/tp: N and C must be even\n"); return 1; }
    flops = 3.0 * 2 * 2 * (double)N * (double)C * (double)H; /* two GEMMs, forward + 2x backward */
    MPI_Comm_split(MPI_COMM_WORLD, WR == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
    MPI_Comm_split(MPI_COMM_WORLD, WR < 2 ? 0 : MPI_UNDEFINED, WR, &duo);
    CK(dt_comm_split(world, &alone, WR == 0 ? 0 : -1, 0));
    CK(dt_comm_split(world, &pair, WR < 2 ? 0 : -1, WR));

    if (WR == 0) {
        dt_layout_desc d = {1, 1, 1, 1, 1}; /* dp, tp, pp, cp, ep */
        block_make(&b, NULL, 0);
        single = measure(&b, solo);
        block_free(&b);
        CK(dt_layout_create(alone, &l1, &d));
        block_make(&b, l1, 0);
        tp1 = measure(&b, solo);
        block_free(&b);
        dt_layout_free(l1);
    }
    sleepy_barrier();
    if (size >= 2 && WR < 2) {
        dt_layout_desc d = {1, 2, 1, 1, 1}; /* dp, tp, pp, cp, ep */
        CK(dt_layout_create(pair, &l2, &d));
        for (sp = 0; sp <= 1; sp++) {
            block_make(&b, l2, sp);
            tp2[sp] = measure(&b, duo);
            block_free(&b);
        }
        dt_layout_free(l2);
    }
    sleepy_barrier();
    if (WR == 0) {
        printf("bench/tp: Megatron MLP block (layernorm, column C->4C, GELU, row 4C->C, residual), forward + "
               "backward\nN = %lld rows, C = %lld, H = %lld; %.2f GFLOP per step; median of %d steps; 1 BLAS "
               "thread per rank\n\n", (long long)N, (long long)C, (long long)H, flops * 1e-9, REPS);
        printf("| config | ms / step | GFLOP/s | tp comm ms / step | comm fraction | speedup vs single | efficiency |\n");
        printf("|---|---|---|---|---|---|---|\n");
        printf("| single rank, dt_tensor ops | %.2f | %.1f | | | 1.00 | |\n", single.step * 1e3, flops / single.step * 1e-9);
        printf("| tp 1 (dt_tp_*, layout of one) | %.2f | %.1f | %.3f | %.1f%% | %.2f | |\n", tp1.step * 1e3,
               flops / tp1.step * 1e-9, tp1.comm * 1e3, 100 * tp1.comm / tp1.step, single.step / tp1.step);
        if (size >= 2)
            for (sp = 0; sp <= 1; sp++)
                printf("| tp 2, sp %d (%s) | %.2f | %.1f | %.3f | %.1f%% | %.2f | %.2f |\n", sp,
                       sp ? "all-gather + reduce-scatter" : "all-reduces", tp2[sp].step * 1e3,
                       flops / tp2[sp].step * 1e-9, tp2[sp].comm * 1e3, 100 * tp2[sp].comm / tp2[sp].step,
                       single.step / tp2[sp].step, single.step / tp2[sp].step / 2);
        else
            printf("| tp 2 | (needs mpirun -np 2) | | | | | |\n");
        printf("\nefficiency = speedup / tp; comm counts post to completion (the column-parallel backward's "
               "all-reduce overlaps the dW GEMM)\n");
    }
    if (solo != MPI_COMM_NULL) MPI_Comm_free(&solo);
    if (duo != MPI_COMM_NULL) MPI_Comm_free(&duo);
    dt_comm_free(pair);
    dt_comm_free(alone);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return 0;
}
