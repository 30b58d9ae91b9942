// np: 4
/* bench/pipeline.c - dt_parallel.h's pipeline schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1):
   the bubble and peak activation memory the simulator predicts against the papers' closed forms
   (parts 1-5, rank 0 alone), then the same measured on the runtime (part 6, every rank):
       GPipe, 1F1B    bubble (p-1)/(m+p-1)            peak activations m (GPipe), p (1F1B, stage 0)
       interleaved    bubble (p-1)/(v m+p-1)          peak (2(p-1) + (v-1)p + 1) / v = p + (p-1)/v
                                                      stage-worths (Korthikanti et al. 2022: p (1 + (p-1)/(pv)))
       ZB-H1          bubble (p-1)(F+BI-BW) / (m(F+BI+BW) + (p-1)(F+BI-BW))     peak p, as 1F1B
   Times in parts 1-5 are in units of one stage's forward (F = 1, B = 2, split BI = BW = 1 unless a
   row says otherwise); bubble = idle share of all stages over the step. Peak = most micro-batches
   whose forward ran and whose backward (or BW) has not, on the worst stage, in stage-worths of
   activations (an interleaved chunk holds 1/v of a stage's layers).
   Part 6 runs dt_pp_run at pp = the world (4 ranks on this 2-core machine: oversubscribed) on an
   MLP of 8 linear+GELU layers (two per stage, 512 wide, 64 rows per micro-batch: a stage's
   forward is milliseconds) with m = 8, and measures each stage's busy time from the dt_trace
   timeline (the union of its compute spans) rather than from the wall clock: bubble = 1 - sum
   of busy / (p x makespan), makespan from the first compute span to the last over all stages.
   Beside it the closed form, and the simulator at the F, B, BI, BW costs measured in the same
   run (what the schedule would give on dedicated cores). Oversubscribed, stages that compute at
   the same time share the cores, so their spans stretch into what would be idle time: the
   measured bubble comes out lower than on dedicated cores; read it against the simulated one.
   What the timeline of such a run shows (dt_trace_write on a 1F1B run, at load average 12 on 2
   cores, 22 Nov 2026): the steps take 4-5x the simulator's makespan at the measured costs, the
   spans of the stages alternate with idle gaps of tens of ms, and a send completes only when its
   sender next enters dt_comm: Open MPI here has no single-copy path
   (btl_vader_single_copy_mechanism none, build.sh's setting), so a message above the eager
   limit (4 KB; an activation here is 128 KB) moves only while both ends are inside MPI, and a
   send posted just before a compute lands after it. A pipeline over MPI on CPUs needs the model
   to poll the comm between layers, or a progress thread; on NCCL the copy engine moves it.
   Memory: the most bytes a stage held above its start (ctx->bytes_in_use after each action: the
   model's saved activations plus the runtime's buffers), in chunk-micro-batches of activations,
   against the schedule's bound (the excess: receives posted ahead and messages in flight).

   build (what ./build.sh does; it includes dt_comm.h, so build.sh uses mpicc -DDT_MPI):
       mpicc -std=c99 -O2 -g -Wall -Wextra -Werror -DDT_MPI -DDT_CBLAS -I. bench/pipeline.c \
           -o build/bench/pipeline -lopenblas -lm
   run:  mpirun --oversubscribe -np 4 build/bench/pipeline   (one process: parts 1-5 only) */
#define _POSIX_C_SOURCE 200809L

#define DT_IMPLEMENTATION
#include "../dt_tensor.h"
#include "../dt_comm.h"
#include "../dt_opt.h"
#include "../dt_parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

static dt_ctx C;

/* Simulates one schedule; returns 0 and fills stats (and the first stage's bound), or prints why not. */
static int run(dt_pp_kind kind, int p, int m, int v, int ahead, const dt_pp_sim_desc *sd, dt_pp_stats *stats,
               double *sim_seconds) {
    dt_pp_desc d;
    dt_pp_schedule *s = NULL;
    double t0;
    int rc = 0;
    memset(&d, 0, sizeof d);
    d.kind = kind, d.stages = p, d.micro = m, d.chunks = v, d.recv_ahead = ahead;
    if (dt_pp_schedule_create(&C, &s, &d)) {
        printf("  %s p %d m %d v %d: %s\n", dt_pp_kind_name(kind), p, m, v, dt_ctx_error(&C));
        return 1;
    }
    t0 = now_s();
    if (dt_pp_schedule_simulate(s, stats, sd)) {
        printf("  %s p %d m %d v %d: %s\n", dt_pp_kind_name(kind), p, m, v, dt_ctx_error(&C));
        rc = 1;
    }
    if (sim_seconds) *sim_seconds = now_s() - t0;
    dt_pp_schedule_free(s);
    return rc;
}

static void grid(void) {
    static const int PS[3] = {2, 4, 8}, MS[4] = {1, 2, 4, 8}; /* m = p * MS */
    int pi, mi, v, failures = 0, rows = 0, off = 0;
    double worst = 0;
    printf("\n1. bubble and peak activations, simulated vs closed form (F = 1, B = 2; ZB: BI = BW = 1)\n");
    printf("%-12s %3s %4s %2s %9s %9s %9s %9s %9s %7s\n", "schedule", "p", "m", "v", "makespan", "bubble", "formula",
           "sim-form", "peak", "bound");
    for (pi = 0; pi < 3; pi++)
        for (mi = 0; mi < 4; mi++) {
            int p = PS[pi], m = p * MS[mi];
            dt_pp_kind kinds[6] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_INTERLEAVED, DT_PP_INTERLEAVED,
                                   DT_PP_ZB_H1};
            int vs[6] = {1, 1, 2, 3, 4, 1}, k;
            for (k = 0; k < 6; k++) {
                dt_pp_stats st;
                double diff;
                v = vs[k];
                if (run(kinds[k], p, m, v, 0, NULL, &st, NULL)) {
                    failures++;
                    continue;
                }
                diff = st.bubble - st.bubble_formula;
                if (diff > worst || -diff > worst) worst = diff > 0 ? diff : -diff;
                if (diff > 1e-12 || diff < -1e-12) off++;
                rows++;
                printf("%-12s %3d %4d %2d %9.3f %9.4f %9.4f %9.1e %9.3f %7.3f\n", dt_pp_kind_name(kinds[k]), p, m, v,
                       st.makespan, st.bubble, st.bubble_formula, diff, (double)st.peak_max / v,
                       (double)st.bound_max / v);
            }
        }
    printf("%d schedules, %d failed, %d off their closed form (largest |sim - formula| %.2g)\n", rows, failures, off,
           worst);
}

/* ZB-H1 at other F : BI : BW ratios. The handcrafted order (BW held back s places on stage s)
   meets the paper's formula while BW <= BI; a heavier BW than BI leaves it above (the paper's
   automatic scheduler, not done here, places W by the actual costs). */
static void zb_costs(void) {
    static const double COST[4][3] = {{1, 1, 1}, {1, 1.2, 0.8}, {1, 1.5, 0.5}, {1, 0.8, 1.2}};
    int c, p = 4, m = 16;
    printf("\n2. ZB-H1 vs 1F1B at other costs (p %d, m %d; 1F1B's B = BI + BW)\n", p, m);
    printf("%4s %4s %4s %11s %11s %11s %11s\n", "F", "BI", "BW", "zb bubble", "zb formula", "1f1b bubble", "zb/1f1b");
    for (c = 0; c < 4; c++) {
        dt_pp_sim_desc sd;
        dt_pp_stats zb, one;
        memset(&sd, 0, sizeof sd);
        sd.f = COST[c][0], sd.bi = COST[c][1], sd.bw = COST[c][2], sd.b = sd.bi + sd.bw;
        if (run(DT_PP_ZB_H1, p, m, 1, 0, &sd, &zb, NULL) || run(DT_PP_1F1B, p, m, 1, 0, &sd, &one, NULL)) continue;
        printf("%4.1f %4.1f %4.1f %11.4f %11.4f %11.4f %11.3f\n", sd.f, sd.bi, sd.bw, zb.bubble, zb.bubble_formula,
               one.bubble, zb.bubble / one.bubble);
    }
}

/* Receives posted fewer places ahead, and a message latency: what they cost the step. */
static void comm_effects(void) {
    static const dt_pp_kind KINDS[4] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_ZB_H1};
    int k, p = 4, m = 8;
    printf("\n3. makespan vs receives posted ahead and message latency (p %d, m %d, interleaved v 2)\n", p, m);
    printf("%-12s %10s %10s %10s %12s %12s\n", "schedule", "ahead 1", "ahead 2", "ahead all", "comm 0.1", "comm 0.5");
    for (k = 0; k < 4; k++) {
        dt_pp_stats a1, a2, aa, c1, c5;
        dt_pp_sim_desc sd;
        int v = KINDS[k] == DT_PP_INTERLEAVED ? 2 : 1;
        memset(&sd, 0, sizeof sd);
        if (run(KINDS[k], p, m, v, 1, NULL, &a1, NULL) || run(KINDS[k], p, m, v, 2, NULL, &a2, NULL) ||
            run(KINDS[k], p, m, v, 1000, NULL, &aa, NULL))
            continue;
        sd.comm = 0.1;
        if (run(KINDS[k], p, m, v, 0, &sd, &c1, NULL)) continue;
        sd.comm = 0.5;
        if (run(KINDS[k], p, m, v, 0, &sd, &c5, NULL)) continue;
        printf("%-12s %10.2f %10.2f %10.2f %12.2f %12.2f\n", dt_pp_kind_name(KINDS[k]), a1.makespan, a2.makespan,
               aa.makespan, c1.makespan, c5.makespan);
    }
}

static void tables(void) {
    static const dt_pp_kind KINDS[4] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_ZB_H1};
    int k;
    printf("\n4. the schedules, p 4, m 8 (one column per slot of the cheapest op; -- continues an op)\n");
    for (k = 0; k < 4; k++) {
        dt_pp_desc d;
        dt_pp_schedule *s = NULL;
        dt_strbuf b;
        memset(&d, 0, sizeof d);
        memset(&b, 0, sizeof b);
        b.ctx = &C;
        d.kind = KINDS[k], d.stages = 4, d.micro = 8, d.chunks = KINDS[k] == DT_PP_INTERLEAVED ? 2 : 1;
        if (dt_pp_schedule_create(&C, &s, &d) || dt_pp_schedule_format(s, &b, NULL)) {
            printf("%s: %s\n", dt_pp_kind_name(KINDS[k]), dt_ctx_error(&C));
        } else {
            int st;
            printf("%s%s:\n%s", dt_pp_kind_name(KINDS[k]), d.chunks > 1 ? " (v 2: a, b the chunks)" : "", b.text);
            printf("  per stage (busy, bubble, peak / bound in chunk-micro-batches):");
            for (st = 0; st < s->stages; st++)
                printf("  %d: %.1f %.3f %d/%d", st, s->busy[st], s->stage_bubble[st], s->peak[st], s->bound[st]);
            printf("\n");
        }
        dt_strbuf_free(&b);
        dt_pp_schedule_free(s);
    }
}

/* How long the simulator takes on a big schedule (it runs once per step configuration). */
static void cost(void) {
    dt_pp_stats st;
    double t[5];
    int i;
    for (i = 0; i < 5; i++)
        if (run(DT_PP_INTERLEAVED, 16, 256, 4, 0, NULL, &st, &t[i])) return;
    printf("\n5. simulator time: interleaved p 16, m 256, v 4 (16 x 1024 chunk-micro-batches, F and B each): "
           "%.2f ms (median of 5)\n", 1e3 * median(t, 5));
}

/* ---- 6. measured on the runtime */

#define MP 4         /* stages (the world) */
#define MM 8         /* micro-batches */
#define ML 8         /* layers: 2 per stage, 1 per interleaved chunk */
#define MH 512       /* width */
#define MN 64        /* rows per micro-batch */
#define MSTEPS 3     /* measured steps per schedule (after one warm-up) */

typedef struct mstage {   /* one stage of the bench MLP */
    int p, v, st, first[2 * MP + 1];
    dt_tensor w[ML], gw[ML];
    dt_tensor x0[2 * MM], dy[2 * MM];                  /* first stage's input, last stage's dloss */
    const dt_tensor *in[2 * MM];
    dt_tensor h[2 * MM][ML], a[2 * MM][ML], dh[2 * MM][ML];
    double t_op[4], n_op[4]; /* seconds and count of F, B, BI, BW: the simulator's costs */
} mstage;

static dt_comm *mworld;

static void mk(dt_tensor *t, int64_t a, int64_t b) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = a, d.shape[1] = b;
    if (dt_tensor_create(&C, t, &d)) { fprintf(stderr, "bench/pipeline: %s\n", dt_ctx_error(&C)); exit(1); }
}

static dt_status ms_forward(void *user, int c, int i, dt_tensor *out, const dt_tensor *in) {
    mstage *S = (mstage *)user;
    int k = c * S->p + S->st, lo = S->first[k], hi = S->first[k + 1], j, slot = c * MM + i;
    double t0 = now_s();
    if (!in) {
        mk(&S->x0[slot], MN, MH);
        dt_tensor_fill(&C, &S->x0[slot], 0.01 * (i + 1));
        in = &S->x0[slot];
    }
    S->in[slot] = in;
    for (j = lo; j < hi; j++) {
        mk(&S->h[slot][j], MN, MH);
        mk(&S->a[slot][j], MN, MH);
        DT__TRY(dt_linear_fwd(&C, &S->h[slot][j], j == lo ? in : &S->a[slot][j - 1], &S->w[j], NULL));
        DT__TRY(dt_gelu_fwd(&C, &S->a[slot][j], &S->h[slot][j]));
    }
    if (out) DT__TRY(dt_tensor_copy(&C, out, &S->a[slot][hi - 1]));
    else { /* the loss's gradient: a stand-in of the same size */
        mk(&S->dy[slot], MN, MH);
        dt_tensor_fill(&C, &S->dy[slot], 1e-3);
    }
    S->t_op[0] += now_s() - t0, S->n_op[0]++;
    return DT_OK;
}

static dt_status ms_backward(void *user, int c, int i, dt_tensor *din, const dt_tensor *dout, dt_pp_part part) {
    mstage *S = (mstage *)user;
    int k = c * S->p + S->st, lo = S->first[k], hi = S->first[k + 1], j, slot = c * MM + i;
    int op = part == DT_PP_PART_INPUT ? 2 : part == DT_PP_PART_WEIGHT ? 3 : 1;
    dt_tensor cur, prev;
    double t0 = now_s();
    if (!dout) dout = &S->dy[slot];
    memset(&cur, 0, sizeof cur);
    for (j = hi - 1; j >= lo; j--) {
        const dt_tensor *x = j == lo ? S->in[slot] : &S->a[slot][j - 1];
        if (part != DT_PP_PART_WEIGHT) {
            dt_tensor *dx = j > lo ? &prev : din;
            mk(&S->dh[slot][j], MN, MH);
            if (j > lo) mk(&prev, MN, MH);
            DT__TRY(dt_gelu_bwd(&C, &S->dh[slot][j], j == hi - 1 ? dout : &cur, &S->h[slot][j]));
            DT__TRY(dt_linear_bwd(&C, dx, part == DT_PP_PART_INPUT ? NULL : &S->gw[j], NULL, &S->dh[slot][j], x,
                                     &S->w[j]));
            dt_tensor_free(&C, &cur);
            if (j > lo) cur = prev;
        } else {
            DT__TRY(dt_linear_bwd(&C, NULL, &S->gw[j], NULL, &S->dh[slot][j], x, &S->w[j]));
        }
    }
    if (part != DT_PP_PART_INPUT) { /* the micro-batch is done on this chunk */
        for (j = lo; j < hi; j++) {
            dt_tensor_free(&C, &S->h[slot][j]);
            dt_tensor_free(&C, &S->a[slot][j]);
            dt_tensor_free(&C, &S->dh[slot][j]);
        }
        dt_tensor_free(&C, &S->x0[slot]);
        dt_tensor_free(&C, &S->dy[slot]);
    }
    S->t_op[op] += now_s() - t0, S->n_op[op]++;
    return DT_OK;
}

/* One schedule: a warm-up step, then MSTEPS measured; prints a row on rank 0. */
static void measure_one(dt_layout *l, dt_trace *tr, dt_pp_kind kind, int v) {
    mstage *S = (mstage *)calloc(1, sizeof *S);
    dt_pp_desc d;
    dt_pp_schedule *s = NULL;
    dt_pp_model pm;
    dt_pp_run_desc rd;
    dt_pp_stats sim;
    dt_pp_sim_desc sd;
    double bub[MSTEPS], span[MSTEPS], bsum[MSTEPS], floor_s, cores = (double)sysconf(_SC_NPROCESSORS_ONLN), sbusy[MP], spk[MP], spkb[MP], sbound[MP], act_bytes;
    int step, j, k, lo, hi, p = l->pp;
    if (!S) return;
    S->p = p, S->v = v, S->st = l->pp_rank;
    dt_pp_split(&C, S->first, ML, p * v);
    for (k = 0; k < v; k++) {
        int kk = k * p + S->st;
        for (j = S->first[kk]; j < S->first[kk + 1]; j++) {
            mk(&S->w[j], MH, MH);
            mk(&S->gw[j], MH, MH);
            dt_tensor_fill(&C, &S->w[j], 1.0 / MH);
        }
    }
    memset(&d, 0, sizeof d);
    d.kind = kind, d.stages = p, d.micro = MM, d.chunks = v, d.n_layers = ML;
    if (dt_pp_schedule_create(&C, &s, &d)) { fprintf(stderr, "bench/pipeline: %s\n", dt_ctx_error(&C)); exit(1); }
    memset(&pm, 0, sizeof pm);
    pm.user = S;
    pm.forward = ms_forward;
    pm.backward = ms_backward;
    pm.act.shape[0] = MN, pm.act.shape[1] = MH;
    memset(&rd, 0, sizeof rd);
    rd.trace = tr;
    for (j = 0; j < MP; j++) sbusy[j] = spk[j] = spkb[j] = sbound[j] = 0;
    for (step = -1; step < MSTEPS; step++) {
        dt_pp_run_stats rs;
        double lo_t, hi_t, busy, mk_span;
        dt_comm_barrier(mworld);
        if (dt_pp_run(l, &rs, s, &pm, &rd)) { fprintf(stderr, "bench/pipeline: %s\n", dt_ctx_error(&C)); exit(1); }
        if (step < 0) { memset(S->t_op, 0, sizeof S->t_op); memset(S->n_op, 0, sizeof S->n_op); continue; }
        lo_t = rs.first, hi_t = rs.last, busy = rs.busy;
        dt_comm_allreduce_f64(l->pp_comm, &lo_t, 1, DT_REDUCE_MIN); /* one host: one CLOCK_MONOTONIC */
        dt_comm_allreduce_f64(l->pp_comm, &hi_t, 1, DT_REDUCE_MAX);
        dt_comm_allreduce_f64(l->pp_comm, &busy, 1, DT_REDUCE_SUM);
        mk_span = hi_t - lo_t;
        bub[step] = 1 - busy / (p * mk_span);
        span[step] = mk_span;
        bsum[step] = busy;
        sbusy[S->st] += rs.busy / mk_span / MSTEPS;
        if ((double)rs.peak_ctx_bytes > spkb[S->st]) spkb[S->st] = (double)rs.peak_ctx_bytes;
        spk[S->st] = rs.peak;
        sbound[S->st] = rs.bound;
    }
    dt_comm_allreduce_f64(l->pp_comm, sbusy, MP, DT_REDUCE_SUM);
    dt_comm_allreduce_f64(l->pp_comm, spk, MP, DT_REDUCE_SUM);
    dt_comm_allreduce_f64(l->pp_comm, spkb, MP, DT_REDUCE_SUM);
    dt_comm_allreduce_f64(l->pp_comm, sbound, MP, DT_REDUCE_SUM);
    /* the costs measured here, per stage-worth of layers, for the simulator (averaged over stages) */
    for (j = 0; j < 4; j++) {
        double t = S->t_op[j], n = S->n_op[j];
        dt_comm_allreduce_f64(l->pp_comm, &t, 1, DT_REDUCE_SUM);
        dt_comm_allreduce_f64(l->pp_comm, &n, 1, DT_REDUCE_SUM);
        S->t_op[j] = n > 0 ? t / n * v : 0;
    }
    memset(&sd, 0, sizeof sd);
    sd.f = S->t_op[0];
    if (kind == DT_PP_ZB_H1) sd.bi = S->t_op[2], sd.bw = S->t_op[3], sd.b = sd.bi + sd.bw;
    else sd.b = S->t_op[1];
    dt_pp_schedule_simulate(s, &sim, &sd);
    /* on fewer cores than stages the step can be no shorter than all the compute shared out */
    floor_s = median(bsum, MSTEPS) / (cores < 1 ? 1 : cores);
    if (floor_s < sim.makespan) floor_s = sim.makespan;
    /* activation bytes of one chunk-micro-batch: h and a per layer, and its input */
    lo = S->first[0], hi = S->first[1];
    act_bytes = (double)(2 * (hi - lo) + 1) * MN * MH * sizeof(float);
    if (l->rank == 0) {
        printf("%-12s %2d %6.2f %6.2f %6.2f %6.2f %8.1f %8.1f %8.1f %9.4f %9.4f %9.4f %9.4f |", dt_pp_kind_name(kind),
               v, 1e3 * S->t_op[0], 1e3 * (kind == DT_PP_ZB_H1 ? S->t_op[2] + S->t_op[3] : S->t_op[1]),
               1e3 * S->t_op[2], 1e3 * S->t_op[3], 1e3 * median(span, MSTEPS), 1e3 * sim.makespan, 1e3 * floor_s,
               median(bub, MSTEPS), 1 - median(bsum, MSTEPS) / (p * floor_s), sim.bubble, sim.bubble_formula);
        for (j = 0; j < p; j++) printf(" %4.2f", 1 - sbusy[j]);
        printf(" |");
        for (j = 0; j < p; j++) printf(" %.0f/%.0f %.1f", spk[j], sbound[j], spkb[j] / act_bytes);
        printf("\n");
    }
    for (j = 0; j < ML; j++) { dt_tensor_free(&C, &S->w[j]); dt_tensor_free(&C, &S->gw[j]); }
    dt_pp_schedule_free(s);
    free(S);
}

static void measured(void) {
    dt_layout *l = NULL;
    dt_layout_desc ld;
    dt_trace *tr = NULL;
    int size = dt_comm_size(mworld);
    if (size != MP) {
        if (dt_comm_rank(mworld) == 0)
            printf("\n6. measured on the runtime: needs %d ranks (mpirun --oversubscribe -np %d), have %d: skipped\n",
                   MP, MP, size);
        return;
    }
    memset(&ld, 0, sizeof ld);
    ld.pp = MP;
    if (dt_layout_create(mworld, &l, &ld) || dt_trace_create(mworld, &tr)) {
        fprintf(stderr, "bench/pipeline: %s\n", dt_ctx_error(&C));
        exit(1);
    }
    if (l->rank == 0) {
        FILE *f = fopen("/proc/loadavg", "r");
        double load = -1;
        printf("\n6. measured on dt_pp_run: p %d (oversubscribed on this machine's cores), m %d, %d layers of %d x %d, "
               "%d rows per micro-batch; median of %d steps\n", MP, MM, ML, MH, MH, MN, MSTEPS);
        printf("   F, B, BI, BW: ms per stage-worth of layers, measured; the step (first compute to last, all stages), "
               "the simulator's at those costs,\n   and the floor on this machine's %.0f cores (the larger of the "
               "simulator's and all stages' busy time / cores);\n   bubble from the timeline's busy time, the one the "
               "floor would give, the simulator's and the closed form;\n   per stage: bubble, then in flight "
               "(peak/bound) and the peak bytes held in chunk-micro-batches of activations\n",
               (double)sysconf(_SC_NPROCESSORS_ONLN));
        if (f) {
            if (fscanf(f, "%lf", &load) != 1) load = -1;
            fclose(f);
        }
        printf("   load average %.1f at the start (a shared machine: above the core count, every rank waits for a "
               "core and spans stretch)\n", load);
        printf("%-12s %2s %6s %6s %6s %6s %8s %8s %8s %9s %9s %9s %9s | %-23s | %s\n", "schedule", "v", "F", "B", "BI",
               "BW", "step ms", "sim ms", "floor ms", "measured", "at floor", "simulated", "formula", "stage bubbles", "peak/bound, held");
    }
    measure_one(l, tr, DT_PP_GPIPE, 1);
    measure_one(l, tr, DT_PP_1F1B, 1);
    measure_one(l, tr, DT_PP_INTERLEAVED, 2);
    measure_one(l, tr, DT_PP_ZB_H1, 1);
    dt_trace_free(tr);
    dt_layout_free(l);
}

int main(void) {
    /* Open MPI ranks that wait give the core away (this machine runs the 4 stages on 2 cores);
       set before MPI starts, an mpirun -x or the environment still wins */
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &mworld, NULL)) {
        fprintf(stderr, "bench/pipeline: %s\n", dt_ctx_error(&C));
        return 1;
    }
    if (dt_comm_rank(mworld) == 0) {
        printf("bench/pipeline: pipeline bubbles and activation memory (simulated schedules vs papers, then measured)\n");
        grid();
        zb_costs();
        comm_effects();
        tables();
        cost();
        fflush(stdout);
    }
    measured();
    dt_comm_free(mworld);
    dt_ctx_shutdown(&C);
    return 0;
}
