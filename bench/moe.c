// np: 4
/* bench/moe.c - dt_parallel.h's mixture-of-experts layer (dt_moe_fwd / _bwd / _step_end), one
   training step (forward + backward) timed at ep 1, 2 and 4, beside its peer measured in the
   same run on the same ranks and tokens:
     dense   the dense MLP of the same C and F (dt_linear_fwd, dt_gelu_fwd, dt_linear_fwd and
             their backwards) over each rank's tokens: one expert's shape, so top-k routing
             does k times its FLOPs per token (less the dropped assignments)
     moe     E experts, top-k, at capacity DT_BENCH_CAP and dropless, ep = the ranks used
   Each rank holds the same number of tokens at every ep (weak scaling: an ep group of g ranks
   is g data-parallel ranks whose tokens visit each other's experts), so the ideal step time is
   the same at every ep. Ranks past the group's size wait asleep (sleepy_barrier); at ep 4 on a
   2-core machine two ranks share each core, so read ep 4 against the dense peer of its own
   row, measured likewise 4 ranks on 2 cores, not against ep 1.

   Both are timed from a barrier to a barrier: the group's step, as a training step that syncs
   its gradients would see it. (Timed to each rank's own end, two ranks sharing a core can run
   the dense MLP one after the other, each alone on the core for its whole step, where the
   MoE's all-to-alls make them share it: the peer would look twice as fast as it is.)

   Printed per configuration: the median step time (the slowest rank's, barrier to barrier) and
   the layer's own split of it into router, dispatch, experts and combine (dt_moe_stats after
   dt_moe_step_end each step: each phase's slowest rank per step, then the median over steps);
   the ratios to the dense peer; and the all-to-all traffic over l->ep_comm, checked against
   its formula. dt_comm_stats counts the bytes an all-to-allv sends, a rank's block to itself
   included; dispatch and combine, forward and backward, are 4 all-to-allvs that send S, R, S
   and R rows of C floats (S: kept assignments of the rank's tokens, R: rows its experts
   received; both read from dt_comm_recv_counts in an observer, and the S summed over the
   group checked against dt_moe_stats' assigned - dropped), so bytes = 2 (S + R) C 4. The
   off-rank bytes are those bytes less the blocks a rank sent itself (the same sizes as it
   received from itself), against uniform routing's N k C 4 (ep - 1) / ep per all-to-all.

       mpirun --oversubscribe -np 4 build/bench/moe                 (./build.sh bench runs it)
       DT_BENCH_REPS=11 DT_BENCH_E=8 DT_BENCH_K=2 DT_BENCH_C=256 DT_BENCH_F=1024 DT_BENCH_SEQ=128
       DT_BENCH_SEQS=8 DT_BENCH_CAP=1.25 mpirun ...    (steps, experts, top-k, width, hidden,
                                                         rows a sequence, sequences a rank,
                                                         capacity factor; dropless always runs)

   One BLAS thread per rank (build.sh sets OPENBLAS_NUM_THREADS=1). */
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
static int64_t E = 8, K = 2, C = 256, F = 1024, T = 128, NS = 8, N;
static double CAP = 1.25;
static int REPS = 11, WR;

#define CK(x) do { dt_status s_ = (x); if (s_) { \
    fprintf(stderr, "[rank %d] %s:%d: %s: %s\n", WR, __FILE__, __LINE__, #x, dt_ctx_error(&ctx)); \
    MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

static int64_t env_int(const char *name, int64_t def) {
    const char *v = getenv(name);
    return v && atoll(v) > 0 ? atoll(v) : def;
}

static double env_double(const char *name, double def) {
    const char *v = getenv(name);
    return v && atof(v) > 0 ? atof(v) : def;
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

/* A zeroed f32 tensor of 1-3 dims (trailing zeros: fewer dims). */
static void mk(dt_tensor *t, int64_t d0, int64_t d1, int64_t d2) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32;
    d.shape[0] = d0;
    d.shape[1] = d1;
    d.shape[2] = d2;
    d.ndim = d2 ? 3 : d1 ? 2 : 1;
    CK(dt_tensor_create(&ctx, t, &d));
}

/* N(0, std) values of rows [start, start + rows) of a tensor of `global` rows (the rest of the
   shape t's): the tokens of a rank, the experts of an ep rank, from one global tensor. */
static void init(dt_tensor *t, const char *name, double std, int64_t global, int64_t start) {
    dt_init_desc in;
    int i;
    memset(&in, 0, sizeof in);
    in.kind = DT_INIT_NORMAL;
    in.seed = 7;
    in.name = name;
    in.std = std;
    for (i = 0; i < t->ndim; i++) in.global_shape[i] = t->shape[i];
    in.global_shape[0] = global;
    in.start[0] = start;
    CK(dt_tensor_init(&ctx, t, &in));
}

static void free_all(dt_tensor **t, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) dt_tensor_free(&ctx, t[i]);
}

/* This rank's tokens and their output grads: rows [rank N, (rank + 1) N) of one global batch,
   so rank 0 holds the same tokens at every ep. */
typedef struct tokens { dt_tensor x, dy, dx; } tokens;

/* ---------------------------------------------------------------- the dense peer */

typedef struct dense {
    dt_tensor w1, b1, w2, b2, h, a, y;     /* params [F, C], [F], [C, F], [C]; forward */
    dt_tensor dh, da, dw1, db1, dw2, db2;  /* backward */
} dense;

static void dense_make(dense *d) {
    mk(&d->w1, F, C, 0); init(&d->w1, "dense.w1", 0.02, F, 0);
    mk(&d->b1, F, 0, 0); init(&d->b1, "dense.b1", 0.02, F, 0);
    mk(&d->w2, C, F, 0); init(&d->w2, "dense.w2", 0.02, C, 0);
    mk(&d->b2, C, 0, 0); init(&d->b2, "dense.b2", 0.02, C, 0);
    mk(&d->h, N, F, 0); mk(&d->a, N, F, 0); mk(&d->y, N, C, 0);
    mk(&d->dh, N, F, 0); mk(&d->da, N, F, 0);
    mk(&d->dw1, F, C, 0); mk(&d->db1, F, 0, 0); mk(&d->dw2, C, F, 0); mk(&d->db2, C, 0, 0);
}

/* Forward and backward (grads and dx accumulate, as in a real step). */
static void dense_step(dense *d, tokens *tk) {
    CK(dt_linear_fwd(&ctx, &d->h, &tk->x, &d->w1, &d->b1));
    CK(dt_gelu_fwd(&ctx, &d->a, &d->h));
    CK(dt_linear_fwd(&ctx, &d->y, &d->a, &d->w2, &d->b2));
    CK(dt_tensor_fill(&ctx, &d->da, 0));
    CK(dt_tensor_fill(&ctx, &d->dh, 0));
    CK(dt_linear_bwd(&ctx, &d->da, &d->dw2, &d->db2, &tk->dy, &d->a, &d->w2));
    CK(dt_gelu_bwd(&ctx, &d->dh, &d->da, &d->h));
    CK(dt_linear_bwd(&ctx, &tk->dx, &d->dw1, &d->db1, &d->dh, &tk->x, &d->w1));
}

/* Median over REPS steps of the slowest rank of the group, barrier to barrier. */
static double dense_measure(tokens *tk, MPI_Comm group) {
    dense d;
    double *t = (double *)malloc(sizeof(double) * (size_t)REPS), r;
    int i;
    dense_make(&d);
    for (i = 0; i < 2; i++) dense_step(&d, tk); /* warm: page faults, BLAS buffers */
    for (i = 0; i < REPS; i++) {
        double t0, dt1;
        MPI_Barrier(group);
        t0 = now_s();
        dense_step(&d, tk);
        MPI_Barrier(group);
        dt1 = now_s() - t0;
        MPI_Allreduce(&dt1, &t[i], 1, MPI_DOUBLE, MPI_MAX, group);
    }
    r = median(t, REPS);
    free(t);
    {
        dt_tensor *all[] = {&d.w1, &d.b1, &d.w2, &d.b2, &d.h, &d.a, &d.y, &d.dh, &d.da, &d.dw1, &d.db1, &d.dw2, &d.db2};
        free_all(all, sizeof all / sizeof all[0]);
    }
    return r;
}

/* ---------------------------------------------------------------- the MoE layer */

typedef struct moe_params {
    dt_tensor rt, w1, b1, w2, b2;          /* [E, C], [E/ep, F, C], [E/ep, F], [E/ep, C, F], [E/ep, C] */
    dt_tensor drt, dw1, db1, dw2, db2;
    dt_tensor y;
} moe_params;

static void moe_make(moe_params *p, const dt_layout *l) {
    int64_t El = E / l->ep, e0 = El * l->ep_rank;
    mk(&p->rt, E, C, 0); init(&p->rt, "moe.router", 0.02, E, 0);
    mk(&p->w1, El, F, C); init(&p->w1, "moe.w1", 0.02, E, e0);
    mk(&p->b1, El, F, 0); init(&p->b1, "moe.b1", 0.02, E, e0);
    mk(&p->w2, El, C, F); init(&p->w2, "moe.w2", 0.02, E, e0);
    mk(&p->b2, El, C, 0); init(&p->b2, "moe.b2", 0.02, E, e0);
    mk(&p->drt, E, C, 0); mk(&p->dw1, El, F, C); mk(&p->db1, El, F, 0); mk(&p->dw2, El, C, F); mk(&p->db2, El, C, 0);
    mk(&p->y, N, C, 0);
}

/* The rows each all-to-allv on ep_comm received, in call order within a step, and of them
   those from this rank itself (dt_comm_recv_counts, read as each call completes: a read of
   the comm's last counts, not a call on it, which an observer must not make). */
typedef struct a2a_log {
    int calls, rank;
    int64_t rows[4], self[4];
} a2a_log;

static void a2a_observe(const dt_comm *c, dt_coll kind, double bytes, double t_post, double t_done, void *user) {
    a2a_log *g = (a2a_log *)user;
    const int64_t *rc = dt_comm_recv_counts(c);
    int q, n = dt_comm_size(c);
    (void)bytes; (void)t_post; (void)t_done;
    if (kind != DT_COLL_ALLTOALLV) return;
    if (g->calls < 4) {
        g->rows[g->calls] = g->self[g->calls] = 0;
        for (q = 0; rc && q < n; q++) {
            g->rows[g->calls] += rc[q] / C;
            if (q == g->rank) g->self[g->calls] += rc[q] / C;
        }
    }
    g->calls++;
}

/* One configuration's figures, for the table (rank 0's copy is the group's). */
typedef struct row {
    int ep;
    double cap;                 /* 0: dropless */
    double step, ph[4];         /* seconds: median step; median of router, dispatch, experts, combine */
    double a2a_share;           /* median of the group's mean (dispatch + combine) / step of a rank */
    double dense;               /* the dense peer's median step on the same ranks */
    double dropped;             /* share of assignments over capacity */
    double sent, formula, off;  /* bytes a step, the group's mean per rank: dt_comm_stats, 2 (S+R) C 4, off-rank */
    int ok;                     /* the bytes equal the formula on every rank and step, and S sums to kept */
} row;

/* One step of the layer: forward, backward (grads and dx accumulate), step_end (its stats into st). */
static void moe_step(dt_moe *m, dt_moe_acts *a, moe_params *p, tokens *tk, int64_t seq0, dt_moe_stats *st) {
    CK(dt_moe_fwd(m, a, &p->y, &tk->x, seq0, &p->rt, &p->w1, &p->b1, &p->w2, &p->b2));
    CK(dt_moe_bwd(m, a, &tk->dx, &p->drt, &p->dw1, &p->db1, &p->dw2, &p->db2, &tk->dy, &tk->x, &p->rt, &p->w1,
                  &p->w2, 1.0f));
    CK(dt_moe_step_end(m, st));
}

/* REPS timed steps (after two warm ones) of the layer at capacity cap on layout l. */
static void moe_measure(dt_layout *l, double cap, tokens *tk, MPI_Comm group, row *out) {
    moe_params p;
    dt_moe *m = NULL;
    dt_moe_acts *a = NULL;
    dt_moe_desc md;
    dt_moe_stats st;
    a2a_log lg;
    double *t = (double *)malloc(sizeof(double) * (size_t)REPS * 6), mine[6], all[6], byt[3] = {0, 0, 0}, sum[3];
    int64_t seq0 = (int64_t)l->dpcp_rank * NS, S = 0, R = 0, kept = 0;
    int i, j, ok = 1, all_ok;
    memset(&md, 0, sizeof md);
    md.experts = (int)E;
    md.top_k = (int)K;
    md.width = C;
    md.hidden = F;
    md.seq = T;
    md.capacity = cap;
    CK(dt_moe_create(l, &m, &md));
    CK(dt_moe_acts_create(m, &a));
    moe_make(&p, l);
    memset(&lg, 0, sizeof lg);
    lg.rank = l->ep_rank;
    CK(dt_comm_set_observer(l->ep_comm, a2a_observe, &lg));
    for (i = 0; i < 2; i++) moe_step(m, a, &p, tk, seq0, &st);
    for (i = 0; i < REPS; i++) {
        dt_comm_stat cs;
        double t0, formula;
        lg.calls = 0;
        dt_comm_stats_reset(l->ep_comm);
        MPI_Barrier(group);
        t0 = now_s();
        moe_step(m, a, &p, tk, seq0, &st);
        MPI_Barrier(group);
        mine[0] = now_s() - t0;
        mine[1] = st.router_s; mine[2] = st.dispatch_s; mine[3] = st.experts_s; mine[4] = st.combine_s;
        /* the slowest rank of each phase may be a different rank (their maxima can add up to more
           than the step): the all-to-all phases' share is taken per rank, then averaged */
        mine[5] = (st.dispatch_s + st.combine_s) / mine[0];
        MPI_Allreduce(mine, all, 5, MPI_DOUBLE, MPI_MAX, group);
        MPI_Allreduce(&mine[5], &all[5], 1, MPI_DOUBLE, MPI_SUM, group);
        all[5] /= l->ep;
        for (j = 0; j < 6; j++) t[j * REPS + i] = all[j];
        /* calls 1 and 3 bring the rows to this rank's experts (R), 2 and 4 the tokens' back (S) */
        CK(dt_comm_stats(l->ep_comm, &cs, DT_COLL_ALLTOALLV));
        R = lg.rows[0];
        S = lg.rows[1];
        formula = 2.0 * (double)(S + R) * (double)C * 4;
        ok &= lg.calls == 4 && cs.calls == 4 && lg.rows[2] == R && lg.rows[3] == S && cs.bytes == formula;
        byt[0] = cs.bytes;
        byt[1] = formula;
        byt[2] = cs.bytes - (double)(lg.self[0] + lg.self[1] + lg.self[2] + lg.self[3]) * (double)C * 4;
    }
    CK(dt_comm_set_observer(l->ep_comm, NULL, NULL));
    MPI_Allreduce(&S, &kept, 1, MPI_INT64_T, MPI_SUM, group);
    ok &= kept == st.assigned - st.dropped;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, group);
    MPI_Allreduce(byt, sum, 3, MPI_DOUBLE, MPI_SUM, group);
    out->ep = l->ep;
    out->cap = cap;
    out->step = median(t, REPS);
    for (j = 0; j < 4; j++) out->ph[j] = median(t + (j + 1) * REPS, REPS);
    out->a2a_share = median(t + 5 * REPS, REPS);
    out->dropped = st.assigned ? (double)st.dropped / (double)st.assigned : 0;
    out->sent = sum[0] / l->ep;
    out->formula = sum[1] / l->ep;
    out->off = sum[2] / l->ep;
    out->ok = all_ok;
    free(t);
    {
        dt_tensor *ts[] = {&p.rt, &p.w1, &p.b1, &p.w2, &p.b2, &p.drt, &p.dw1, &p.db1, &p.dw2, &p.db2, &p.y};
        free_all(ts, sizeof ts / sizeof ts[0]);
    }
    dt_moe_acts_free(a);
    dt_moe_free(m);
}

/* ---------------------------------------------------------------- the table */

static void print_table(const row *rows, int n, int size) {
    int i;
    double gfl = 3.0 * 2 * 2 * (double)N * (double)C * (double)F * 1e-9; /* 2 GEMMs, fwd + 2x bwd */
    printf("bench/moe: MoE layer (dt_moe_fwd + _bwd + _step_end) vs the dense MLP of one expert's shape, forward + "
           "backward\nE = %lld experts, top-%lld, C = %lld, F = %lld, seq = %lld, %lld sequences = %lld tokens per "
           "rank at every ep (dense: %.2f GFLOP a step per rank; MoE ~%lldx); median of %d steps; 1 BLAS thread per "
           "rank; world %d rank(s)\n\n", (long long)E, (long long)K, (long long)C, (long long)F, (long long)T,
           (long long)NS, (long long)N, gfl, (long long)K, REPS, size);
    printf("columns: ep = ranks in the ep group (each its own N tokens); cap = capacity factor; step = MoE step ms "
           "(barrier to barrier, slowest rank, median); router / dispatch / experts / combine = dt_moe_stats phase ms "
           "(slowest rank per step, median); d+c = dispatch + combine as a share of a rank's step (mean over ranks, "
           "median); dense = dense MLP step ms on the same ranks and tokens (likewise); moe/dense = step / dense; "
           "exp/2dense = experts / (%lld x dense); drop = assignments over capacity; a2a sent = MB a rank's 4 "
           "all-to-allvs sent a step (dt_comm_stats, own block included; mean over ranks); 2(S+R)C4 = the formula's MB "
           "(S, R from dt_comm_recv_counts); =? = equal on every rank and step, and sum S = assigned - dropped; "
           "off-rank = MB of a2a sent to other ranks (measured: a2a sent less own blocks); uniform = 4 x N k C 4 "
           "(ep-1)/ep MB\n\n", (long long)K);
    printf("| ep | cap | step ms | router | dispatch | experts | combine | d+c | dense ms | moe/dense | exp/2dense | "
           "drop | a2a sent MB | 2(S+R)C4 MB | =? | off-rank MB | uniform MB |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (i = 0; i < n; i++) {
        const row *r = &rows[i];
        double uni = 4.0 * (double)N * (double)K * (double)C * 4 * (r->ep - 1) / r->ep;
        char cap[32];
        if (r->cap > 0) snprintf(cap, sizeof cap, "%.2f", r->cap);
        else snprintf(cap, sizeof cap, "dropless");
        printf("| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2f | %.2f | %.1f%% | %.3f | %.3f | "
               "%s | %.3f | %.3f |\n", r->ep, cap, r->step * 1e3, r->ph[0] * 1e3, r->ph[1] * 1e3, r->ph[2] * 1e3,
               r->ph[3] * 1e3, 100 * r->a2a_share, r->dense * 1e3, r->step / r->dense,
               r->ph[2] / (K * r->dense), 100 * r->dropped, r->sent * 1e-6, r->formula * 1e-6, r->ok ? "yes" : "NO",
               r->off * 1e-6, uni * 1e-6);
    }
}

/* One line: at capacity DT_BENCH_CAP, per ep, the MoE against its dense peer and the share of a
   rank's step in the all-to-all phases; whether every byte count matched. */
static void print_summary(const row *rows, int n) {
    int i, ok = 1;
    for (i = 0; i < n; i++) ok &= rows[i].ok;
    printf("\nsummary (cap %.2f; ep:", rows[0].cap);
    for (i = 0; i < n; i += 2) printf(" %d", rows[i].ep);
    printf("): MoE / dense step");
    for (i = 0; i < n; i += 2) printf(" %.2f", rows[i].step / rows[i].dense);
    printf(", experts / (%lld x dense)", (long long)K);
    for (i = 0; i < n; i += 2) printf(" %.2f", rows[i].ph[2] / (K * rows[i].dense));
    printf(", dispatch + combine");
    for (i = 0; i < n; i += 2) printf(" %.0f%%", 100 * rows[i].a2a_share);
    printf(" of a rank's step; all-to-all bytes = 2 (S + R) C 4 on every rank and step: %s\n", ok ? "yes" : "NO");
}

int main(void) {
    static const int eps[3] = {1, 2, 4};
    dt_comm *world = NULL, *groups[3] = {NULL, NULL, NULL};
    MPI_Comm mgroups[3];
    row rows[6];
    int size, maxep, g, n = 0, all_ok = 1;
    E = env_int("DT_BENCH_E", E);
    K = env_int("DT_BENCH_K", K);
    C = env_int("DT_BENCH_C", C);
    F = env_int("DT_BENCH_F", F);
    T = env_int("DT_BENCH_SEQ", T);
    NS = env_int("DT_BENCH_SEQS", NS);
    CAP = env_double("DT_BENCH_CAP", CAP);
    REPS = (int)env_int("DT_BENCH_REPS", REPS);
    N = NS * T;
    dt_ctx_init(&ctx, NULL);
    CK(dt_comm_create_world(&ctx, &world, NULL));
    WR = dt_comm_rank(world);
    size = dt_comm_size(world);
    maxep = size >= 4 ? 4 : size >= 2 ? 2 : 1;
    if (E % maxep || K > E) {
        if (!WR) fprintf(stderr, "bench/moe: DT_BENCH_E = %lld must be a multiple of %d (the largest ep) and >= "
                         "DT_BENCH_K = %lld\n", (long long)E, maxep, (long long)K);
        dt_comm_free(world);
        dt_ctx_shutdown(&ctx);
        return 1;
    }
    for (g = 0; g < 3; g++) {
        int in = WR < eps[g] && eps[g] <= size;
        MPI_Comm_split(MPI_COMM_WORLD, in ? 0 : MPI_UNDEFINED, WR, &mgroups[g]);
        CK(dt_comm_split(world, &groups[g], in ? 0 : -1, WR));
    }
    for (g = 0; g < 3 && eps[g] <= size; g++) {
        if (groups[g]) {
            dt_layout *l = NULL;
            dt_layout_desc d = {0, 1, 1, 1, eps[g]}; /* dp (= the group), tp, pp, cp, ep */
            tokens tk;
            double dense_s;
            mk(&tk.x, N, C, 0); init(&tk.x, "x", 1.0, 4 * N, WR * N);
            mk(&tk.dy, N, C, 0); init(&tk.dy, "dy", 1.0, 4 * N, WR * N);
            mk(&tk.dx, N, C, 0);
            CK(dt_layout_create(groups[g], &l, &d));
            dense_s = dense_measure(&tk, mgroups[g]);
            moe_measure(l, CAP, &tk, mgroups[g], &rows[n]);
            moe_measure(l, 0, &tk, mgroups[g], &rows[n + 1]);
            rows[n].dense = rows[n + 1].dense = dense_s;
            all_ok &= rows[n].ok && rows[n + 1].ok;
            dt_layout_free(l);
            {
                dt_tensor *all[] = {&tk.x, &tk.dy, &tk.dx};
                free_all(all, 3);
            }
        }
        n += 2;
        sleepy_barrier();
    }
    if (WR == 0) {
        print_table(rows, n, size);
        print_summary(rows, n);
        if (size < 4) printf("(ep %s: needs mpirun -np 4)\n", size < 2 ? "2 and 4" : "4");
    }
    for (g = 0; g < 3; g++) {
        if (mgroups[g] != MPI_COMM_NULL) MPI_Comm_free(&mgroups[g]);
        dt_comm_free(groups[g]);
    }
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return all_ok ? 0 : 1;
}
