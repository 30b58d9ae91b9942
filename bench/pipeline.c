/* bench/pipeline.c - predicted bubble and peak activation memory of dt_parallel.h's pipeline
   schedules (GPipe, 1F1B, interleaved 1F1B, ZB-H1), from the schedule simulator, against the
   papers' closed forms:
       GPipe, 1F1B    bubble (p-1)/(m+p-1)            peak activations m (GPipe), p (1F1B, stage 0)
       interleaved    bubble (p-1)/(v m+p-1)          peak (2(p-1) + (v-1)p + 1) / v = p + (p-1)/v
                                                      stage-worths (Korthikanti et al. 2022: p (1 + (p-1)/(pv)))
       ZB-H1          bubble (p-1)(F+BI-BW) / (m(F+BI+BW) + (p-1)(F+BI-BW))     peak p, as 1F1B
   Times are in units of one stage's forward (F = 1, B = 2, split BI = BW = 1 unless a row says
   otherwise); bubble = idle share of all stages over the step. Peak = most micro-batches whose
   forward ran and whose backward (or BW) has not, on the worst stage, in stage-worths of
   activations (an interleaved chunk holds 1/v of a stage's layers).
   This is the prediction half of the pipeline benchmark; the bubble measured on the runtime
   (per-stage busy time from the timeline) comes with the runtime.

   build (what ./build.sh does; it includes dt_comm.h, so build.sh uses mpicc -DDT_MPI):
       mpicc -std=c99 -O2 -g -Wall -Wextra -Werror -DDT_MPI -DDT_CBLAS -I. bench/pipeline.c \
           -o build/bench/pipeline -lopenblas -lm
   run:  build/bench/pipeline            (one process; no MPI calls are made) */
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

int main(void) {
    dt_ctx_init(&C, NULL);
    printf("bench/pipeline: predicted pipeline bubbles and activation memory (simulated schedules vs papers)\n");
    grid();
    zb_costs();
    comm_effects();
    tables();
    cost();
    dt_ctx_shutdown(&C);
    return 0;
}
