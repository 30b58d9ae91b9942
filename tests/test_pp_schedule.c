/* tests/test_pp_schedule.c - the pipeline schedules of dt_parallel.h on one process: every
   schedule for p in 1..8, m in 1..32, v in 1..4 (where the kind allows it), with receives posted
   1 and 2 ahead, runs to the end in the simulator (blocking sends) and passes its checks; the
   simulated times equal a plain dataflow computation done here (no messages, unbounded buffers);
   the activations in flight counted here from the lists equal the simulator's peaks and never
   pass the bound; the bubbles equal the closed forms; the tables of p 2 m 4 1F1B, p 4 m 8
   interleaved v 2 and p 4 m 8 ZB-H1 equal the ones derived by hand from the papers' rules; broken
   schedules (two actions swapped, a duplicate, a bound too small, a field out of range) are named;
   bad descs are named. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;

static const dt_pp_kind KINDS[4] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_ZB_H1};

static int valid(dt_pp_kind k, int p, int m, int v) {
    if (v > 1 && k != DT_PP_INTERLEAVED) return 0;
    if (k == DT_PP_INTERLEAVED && m % p != 0) return 0;
    return 1;
}

static dt_pp_schedule *make(dt_pp_kind k, int p, int m, int v, int ahead) {
    dt_pp_desc d;
    dt_pp_schedule *s = NULL;
    memset(&d, 0, sizeof d);
    d.kind = k, d.stages = p, d.micro = m, d.chunks = v, d.recv_ahead = ahead;
    if (dt_pp_schedule_create(&C, &s, &d)) return NULL;
    return s;
}

static double cost_of(const dt_pp_action *a, int v, double f, double b, double bi, double bw) {
    double c = a->op == DT_PP_F ? f : a->op == DT_PP_B ? b : a->op == DT_PP_BI ? bi : bw;
    return c / v;
}

/* The reference: each stage runs its computes in list order, each as soon as the compute it
   depends on has ended (F(k,i) on F(k-1,i); B/BI(k,i) on F(k,i) and the backward of (k+1,i);
   BW on BI), with no messages at all (a dependency across stages arrives `comm` later). Fills
   ref[st][j] for computes; returns the makespan, or -1 when it got stuck. */
static double dataflow(const dt_pp_schedule *s, double **ref, double f, double b, double bi, double bw, double comm) {
    int p = s->stages, m = s->micro, v = s->chunks, V = p * v, st, left, moved;
    size_t n = (size_t)V * (size_t)m;
    double *fe = (double *)malloc(3 * n * sizeof(double)), *be = fe + n, *we = fe + 2 * n, *clock;
    int *pc = (int *)calloc((size_t)p, sizeof(int));
    double makespan = 0, hop = p > 1 ? comm : 0.0;
    size_t i;
    clock = (double *)calloc((size_t)p, sizeof(double));
    for (i = 0; i < 3 * n; i++) fe[i] = -1;
    do {
        left = 0, moved = 0;
        for (st = 0; st < p; st++) {
            for (; pc[st] < s->count[st]; pc[st]++) {
                const dt_pp_action *a = &s->actions[st][pc[st]];
                int k = a->chunk * p + st, x = k * m + a->micro;
                double ready = clock[st];
                if (a->op > DT_PP_BW) { ref[st][pc[st]] = -1; continue; }
                if (a->op == DT_PP_F && k > 0) {
                    if (fe[x - m] < 0) break;
                    if (fe[x - m] + hop > ready) ready = fe[x - m] + hop;
                }
                if (a->op == DT_PP_B || a->op == DT_PP_BI) {
                    if (fe[x] < 0 || (k < V - 1 && be[x + m] < 0)) break;
                    if (fe[x] > ready) ready = fe[x];
                    if (k < V - 1 && be[x + m] + hop > ready) ready = be[x + m] + hop;
                }
                if (a->op == DT_PP_BW) {
                    if (be[x] < 0) break;
                    if (be[x] > ready) ready = be[x];
                }
                ref[st][pc[st]] = ready;
                clock[st] = ready + cost_of(a, v, f, b, bi, bw);
                if (clock[st] > makespan) makespan = clock[st];
                if (a->op == DT_PP_F) fe[x] = clock[st];
                if (a->op == DT_PP_B || a->op == DT_PP_BI) be[x] = clock[st];
                if (a->op == DT_PP_B || a->op == DT_PP_BW) we[x] = clock[st];
                moved = 1;
            }
            if (pc[st] < s->count[st]) left = 1;
        }
    } while (left && moved);
    free(fe), free(pc), free(clock);
    return left ? -1.0 : makespan;
}

/* Activations in flight per stage from the lists alone: +1 at F, -1 at B or BW. */
static int count_peak(const dt_pp_schedule *s, int st) {
    int j, now = 0, peak = 0;
    for (j = 0; j < s->count[st]; j++) {
        dt_pp_op op = s->actions[st][j].op;
        if (op == DT_PP_F && ++now > peak) peak = now;
        if (op == DT_PP_B || op == DT_PP_BW) now--;
    }
    return peak;
}

/* ---------------------------------------------------------------- the grid */

/* PASS iff none of the runs failed; the FAIL line counts them and shows the first. */
static int verdict(const char *name, int bad, int runs, const char *first) {
    if (bad == 0) return dt_test_pass(name);
    return dt_test_fail(name, "%d of %d runs; first: %s", bad, runs, first);
}

static void test_grid(void) {
    int ki, p, m, v, ai, st, j, n = 0, bad_run = 0, bad_ref = 0, bad_peak = 0, tight = 0, bad_closed = 0,
        bad_zb = 0, zb_worse = 0, zb_peak = 0, bad_dep = 0, bad_mk = 0, bad_mkref = 0, stage_runs = 0;
    char first_run[700] = "", first_ref[200] = "", first_peak[200] = "", first_closed[200] = "", first_zb[200] = "",
         first_dep[200] = "", first_mk[200] = "", first_mkref[200] = "";
    for (ki = 0; ki < 4; ki++)
        for (p = 1; p <= 8; p++)
            for (m = 1; m <= 32; m++)
                for (v = 1; v <= 4; v++)
                    for (ai = 0; ai < 3; ai++) {
                        static const int AHEAD[3] = {1, 2, 1000};
                        dt_pp_kind k = KINDS[ki];
                        int ahead = AHEAD[ai];
                        double ref_makespan;
                        dt_pp_schedule *s;
                        dt_pp_stats stats;
                        double **ref;
                        if (!valid(k, p, m, v)) continue;
                        n++;
                        s = make(k, p, m, v, ahead);
                        if (!s || dt_pp_schedule_simulate(s, &stats, NULL)) {
                            if (!bad_run++)
                                snprintf(first_run, sizeof first_run, "%s p %d m %d v %d ahead %d: %s", dt_pp_kind_name(k),
                                         p, m, v, ahead, dt_ctx_error(&C));
                            dt_pp_schedule_free(s);
                            continue;
                        }
                        /* peaks: counted here == simulated <= bound; and the bound is reached */
                        for (st = 0; st < p; st++) {
                            int c = count_peak(s, st);
                            if (c != s->peak[st] || c > s->bound[st]) {
                                if (!bad_peak++)
                                    snprintf(first_peak, sizeof first_peak, "%s p %d m %d v %d stage %d: counted %d, "
                                             "simulated %d, bound %d", dt_pp_kind_name(k), p, m, v, st, c, s->peak[st],
                                             s->bound[st]);
                            }
                            if (c == s->bound[st]) tight++;
                            stage_runs++;
                        }
                        /* dependencies hold in the simulated times (F after the previous virtual stage's F,
                           backward after its forward and after the next virtual stage's backward) */
                        {
                            int V = p * v, x;
                            size_t nn = (size_t)V * (size_t)m;
                            double *fs = (double *)malloc(4 * nn * sizeof(double)), *fe = fs + nn, *bs = fs + 2 * nn,
                                   *be = fs + 3 * nn;
                            for (x = 0; x < (int)nn; x++) fs[x] = fe[x] = bs[x] = be[x] = -1;
                            for (st = 0; st < p; st++)
                                for (j = 0; j < s->count[st]; j++) {
                                    const dt_pp_action *a = &s->actions[st][j];
                                    x = (a->chunk * p + st) * m + a->micro;
                                    if (a->op == DT_PP_F) fs[x] = s->start[st][j], fe[x] = fs[x] + 1.0 / v;
                                    if (a->op == DT_PP_B || a->op == DT_PP_BI)
                                        bs[x] = s->start[st][j], be[x] = bs[x] + (a->op == DT_PP_B ? 2.0 : 1.0) / v;
                                }
                            for (x = 0; x < (int)nn; x++) {
                                int kk = x / m;
                                const char *why = NULL;
                                if (kk > 0 && fs[x] < fe[x - m] - 1e-9) why = "F before the previous virtual stage's F ended";
                                else if (bs[x] < fe[x] - 1e-9) why = "backward before its forward ended";
                                else if (kk < V - 1 && bs[x] < be[x + m] - 1e-9) why = "backward before the next virtual stage's";
                                if (why && !bad_dep++)
                                    snprintf(first_dep, sizeof first_dep, "%s p %d m %d v %d virtual %d micro %d: %s",
                                             dt_pp_kind_name(k), p, m, v, kk, x % m, why);
                            }
                            free(fs);
                        }
                        /* the simulated times equal the dataflow reference (receives 2 ahead: blocking sends
                           never delay a compute) */
                        ref = (double **)malloc(sizeof(double *) * (size_t)p);
                        for (st = 0; st < p; st++) ref[st] = (double *)malloc(sizeof(double) * (size_t)(s->count[st] + 1));
                        ref_makespan = dataflow(s, ref, 1, 2, 1, 1, 0);
                        if (ref_makespan < 0) {
                            if (!bad_ref++)
                                snprintf(first_ref, sizeof first_ref, "%s p %d m %d v %d: the reference got stuck",
                                         dt_pp_kind_name(k), p, m, v);
                        } else if (stats.makespan != ref_makespan) {
                            /* receives posted 1 or 2 ahead may delay a compute (a send blocks until its
                               receive is posted) but never the end of the step */
                            if (!bad_mkref++)
                                snprintf(first_mkref, sizeof first_mkref, "%s p %d m %d v %d ahead %d: makespan %.15g, "
                                         "reference %.15g", dt_pp_kind_name(k), p, m, v, ahead, stats.makespan,
                                         ref_makespan);
                        } else if (ahead == 1000) { /* every receive posted at the start: unbounded buffers */
                            for (st = 0; st < p; st++)
                                for (j = 0; j < s->count[st]; j++)
                                    if (s->actions[st][j].op <= DT_PP_BW && fabs(ref[st][j] - s->start[st][j]) > 1e-9) {
                                        if (!bad_ref++)
                                            snprintf(first_ref, sizeof first_ref, "%s p %d m %d v %d stage %d action %d: "
                                                     "simulated start %.6g, reference %.6g", dt_pp_kind_name(k), p, m, v,
                                                     st, j, s->start[st][j], ref[st][j]);
                                        st = p;
                                        break;
                                    }
                        }
                        for (st = 0; st < p; st++) free(ref[st]);
                        free(ref);
                        /* closed forms, F = 1, B = 2 (BI = BW = 1) */
                        if (k != DT_PP_ZB_H1 && fabs(stats.bubble - stats.bubble_formula) > 1e-12) {
                            if (!bad_closed++)
                                snprintf(first_closed, sizeof first_closed, "%s p %d m %d v %d ahead %d: bubble %.15g, "
                                         "closed form %.15g", dt_pp_kind_name(k), p, m, v, ahead, stats.bubble,
                                         stats.bubble_formula);
                        }
                        if ((k == DT_PP_GPIPE || k == DT_PP_1F1B) && stats.makespan != 3.0 * (m + p - 1)) {
                            if (!bad_mk++)
                                snprintf(first_mk, sizeof first_mk, "%s p %d m %d: makespan %.15g, want 3(m+p-1) = %d",
                                         dt_pp_kind_name(k), p, m, stats.makespan, 3 * (m + p - 1));
                        }
                        if (k == DT_PP_ZB_H1) {
                            /* the paper's formula holds once the pipeline fills (m >= p); at any m,
                               ZB-H1 is never worse than 1F1B and peaks at 1F1B's peak min(p, m) */
                            double one = (p - 1.0) / (m + p - 1.0);
                            if (m >= p && fabs(stats.bubble - stats.bubble_formula) > 1e-12 && !bad_zb++)
                                snprintf(first_zb, sizeof first_zb, "p %d m %d ahead %d: bubble %.15g, paper %.15g", p, m,
                                         ahead, stats.bubble, stats.bubble_formula);
                            if (stats.bubble > one + 1e-12) zb_worse++;
                            if (stats.peak_max != (p < m ? p : m)) zb_peak++;
                        }
                        dt_pp_schedule_free(s);
                    }
    if (!verdict("every_schedule_runs_to_the_end_and_passes_the_checks", bad_run, n, first_run)) return;
    printf("  (%d schedules: 4 kinds, p 1..8, m 1..32, v 1..4, receives 1, 2 and all ahead)\n", n);
    verdict("simulated_times_respect_every_dependency", bad_dep, n, first_dep);
    verdict("simulated_times_with_all_receives_posted_equal_dataflow_reference", bad_ref, n, first_ref);
    verdict("makespan_with_receives_1_or_2_ahead_equals_dataflow_reference", bad_mkref, n, first_mkref);
    verdict("activations_in_flight_counted_from_lists_equal_simulated_within_bound", bad_peak, n, first_peak);
    /* the bounds are the papers' and the schedules meet them exactly: none is loose */
    if (tight == stage_runs) dt_test_pass("every_stage_reaches_its_activation_bound");
    else dt_test_fail("every_stage_reaches_its_activation_bound", "%d of %d stage runs stay below", stage_runs - tight,
                      stage_runs);
    verdict("gpipe_1f1b_interleaved_bubble_equals_closed_form", bad_closed, n, first_closed);
    verdict("gpipe_1f1b_makespan_is_3_m_plus_p_minus_1", bad_mk, n, first_mk);
    verdict("zb_h1_bubble_equals_paper_formula_when_m_ge_p", bad_zb, n, first_zb);
    DT_TEST_CHECK("zb_h1_bubble_never_above_1f1b", zb_worse == 0);
    DT_TEST_CHECK("zb_h1_peak_equals_1f1b_peak_min_p_m", zb_peak == 0);
}

/* ---------------------------------------------------------------- tables against the papers */

static int table_is(const char *name, dt_pp_kind k, int p, int m, int v, const char *want) {
    dt_pp_schedule *s = make(k, p, m, v, 0);
    dt_strbuf b;
    int ok;
    memset(&b, 0, sizeof b);
    b.ctx = &C;
    if (!s || dt_pp_schedule_format(s, &b, NULL)) {
        dt_test_fail(name, "%s", dt_ctx_error(&C));
        dt_pp_schedule_free(s);
        return 0;
    }
    ok = strcmp(b.text, want) == 0;
    if (ok) dt_test_pass(name);
    else dt_test_fail(name, "got\n%swant\n%s", b.text, want);
    dt_strbuf_free(&b);
    dt_pp_schedule_free(s);
    return ok;
}

/* The compute actions of stage st as "F0a B3b ..." (chunk letters only when v > 1). */
static void compute_order(const dt_pp_schedule *s, int st, char *buf, size_t n) {
    int j;
    size_t len = 0;
    buf[0] = '\0';
    for (j = 0; j < s->count[st] && len < n; j++) {
        const dt_pp_action *a = &s->actions[st][j];
        if (a->op > DT_PP_BW) continue;
        len += (size_t)snprintf(buf + len, n - len, "%s%s%d", len ? " " : "",
                                a->op == DT_PP_F ? "F" : a->op == DT_PP_BW ? "W" : "B", a->micro);
        if (s->chunks > 1 && len < n) len += (size_t)snprintf(buf + len, n - len, "%c", 'a' + a->chunk);
    }
}

static void test_tables(void) {
    dt_pp_schedule *s;
    char got[1024];
    /* PipeDream-Flush (Narayanan et al. 2021, fig. 4 top; 0-based): stage 0 warms up with one
       forward, then F/B pairs; F = 1 slot, B = 2. Hand-derived: stage 1 gets F0 at 1, its B0 ends
       at 4, so stage 0's B0 runs 4..6, ... makespan 3 (m + p - 1) = 15. */
    table_is("table_1f1b_p2_m4_matches_pipedream_flush", DT_PP_1F1B, 2, 4, 1,
             "stage 0 | F0 F1 .  .  B0 -- F2 B1 -- F3 B2 -- .  B3 --\n"
             "stage 1 | .  F0 B0 -- F1 B1 -- F2 B2 -- F3 B3 -- .  .\n");
    /* Megatron interleaved (Narayanan et al. 2021, fig. 4 bottom: p 4, m 8, v 2; 0-based, a/b the
       chunks). Stage 0 warms up with 2 (p-1) + (v-1) p = 10 forwards (micro-batches 0-3 through
       chunk a, 0-3 through chunk b, 4-5 through a), then pairs, then drains; the last stage warms
       up with 4. */
    s = make(DT_PP_INTERLEAVED, 4, 8, 2, 0);
    if (s) {
        compute_order(s, 0, got, sizeof got);
        if (strcmp(got, "F0a F1a F2a F3a F0b F1b F2b F3b F4a F5a F6a B0b F7a B1b F4b B2b F5b B3b F6b B0a F7b B1a "
                        "B2a B3a B4b B5b B6b B7b B4a B5a B6a B7a") == 0)
            dt_test_pass("interleaved_p4_m8_v2_stage0_order_matches_megatron");
        else
            dt_test_fail("interleaved_p4_m8_v2_stage0_order_matches_megatron", "got %s", got);
        compute_order(s, 3, got, sizeof got);
        if (strcmp(got, "F0a F1a F2a F3a F0b B0b F1b B1b F2b B2b F3b B3b F4a B0a F5a B1a F6a B2a F7a B3a F4b B4b "
                        "F5b B5b F6b B6b F7b B7b B4a B5a B6a B7a") == 0)
            dt_test_pass("interleaved_p4_m8_v2_stage3_order_matches_megatron");
        else
            dt_test_fail("interleaved_p4_m8_v2_stage3_order_matches_megatron", "got %s", got);
        dt_pp_schedule_free(s);
    }
    /* Slots of half a unit (a chunk's F). Hand-checked: stage 3's F0b starts at slot 7 (chunk b
       of micro 0 after four chunk-a forwards on stage 0 and three hops), its B0b at 8-9, stage 2's
       B0b at 10-11, stage 0's at 14-15; the bubble is (p-1)/(vm+p-1) = 3/19. */
    table_is("table_interleaved_p4_m8_v2_matches_megatron", DT_PP_INTERLEAVED, 4, 8, 2,
             "stage 0 | F0a F1a F2a F3a F0b F1b F2b F3b F4a F5a F6a .   .   .   B0b --  F7a B1b --  .   F4b B2b --  F5b "
             "B3b --  F6b B0a --  F7b B1a --  B2a --  .   B3a --  .   B4b --  .   B5b --  .   B6b --  .   B7b --  B4a --  "
             "B5a --  B6a --  B7a --\n"
             "stage 1 | .   F0a F1a F2a F3a F0b F1b F2b F3b F4a .   .   B0b --  F5a B1b --  F6a B2b --  F7a B3b --  F4b "
             "B0a --  F5b B1a --  F6b B2a --  F7b B3a --  .   B4b --  .   B5b --  .   B6b --  .   B7b --  B4a --  B5a --  "
             "B6a --  B7a --  .   .\n"
             "stage 2 | .   .   F0a F1a F2a F3a F0b F1b F2b .   B0b --  F3b B1b --  F4a B2b --  F5a B3b --  F6a B0a --  "
             "F7a B1a --  F4b B2a --  F5b B3a --  F6b B4b --  F7b B5b --  .   B6b --  .   B7b --  B4a --  B5a --  B6a --  "
             "B7a --  .   .   .   .\n"
             "stage 3 | .   .   .   F0a F1a F2a F3a F0b B0b --  F1b B1b --  F2b B2b --  F3b B3b --  F4a B0a --  F5a B1a "
             "--  F6a B2a --  F7a B3a --  F4b B4b --  F5b B5b --  F6b B6b --  F7b B7b --  B4a --  B5a --  B6a --  B7a --  .   .   .   .   .   .\n");
    /* ZB-H1 (Qi et al. 2023, fig. 3 top), F = B = W = 1: stage s holds s W passes back; stage 0
       idles p-1 = 3 slots once (waiting for B0) and never again, every stage ends at 3m + p - 1
       = 27 with p-1 idle slots: a third of 1F1B's 3 (p-1). */
    table_is("table_zb_h1_p4_m8_matches_zero_bubble_paper", DT_PP_ZB_H1, 4, 8, 1,
             "stage 0 | F0 F1 F2 F3 .  .  .  B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7\n"
             "stage 1 | .  F0 F1 F2 .  .  B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7\n"
             "stage 2 | .  .  F0 F1 .  B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7\n"
             "stage 3 | .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7\n");
}

/* ---------------------------------------------------------------- broken schedules */

static int find(const dt_pp_schedule *s, int st, dt_pp_op op, int micro) {
    int j;
    for (j = 0; j < s->count[st]; j++)
        if (s->actions[st][j].op == op && s->actions[st][j].micro == micro) return j;
    return -1;
}

static void swap(dt_pp_schedule *s, int st, int a, int b) {
    dt_pp_action t = s->actions[st][a];
    s->actions[st][a] = s->actions[st][b];
    s->actions[st][b] = t;
}

/* Moves action `from` of stage st to position `to`, shifting the ones between. */
static void move(dt_pp_schedule *s, int st, int from, int to) {
    dt_pp_action t = s->actions[st][from];
    int d = to > from ? 1 : -1, j;
    for (j = from; j != to; j += d) s->actions[st][j] = s->actions[st][j + d];
    s->actions[st][to] = t;
}

static void test_broken(void) {
    dt_pp_schedule *s;
    dt_status st;
    int a, b;
    /* Deadlock: the last of 2 stages runs F2 where B0 was. F2 needs stage 0's activation 2, which
       stage 0 sends after its B0, which needs the gradient of B0 from stage 1: neither moves. */
    s = make(DT_PP_1F1B, 2, 4, 1, 3);
    a = s ? find(s, 1, DT_PP_B, 0) : -1, b = s ? find(s, 1, DT_PP_F, 2) : -1;
    if (a >= 0 && b >= 0) {
        swap(s, 1, a, b);
        st = dt_pp_schedule_simulate(s, NULL, NULL);
        if (dt_test_error("swapped_b0_f2_is_a_deadlock", st, dt_ctx_error(&C), "deadlock")) {
            dt_test_error("deadlock_names_stage0_blocked_action", st, dt_ctx_error(&C), "stage 0 at");
            dt_test_error("deadlock_names_stage1_blocked_action", st, dt_ctx_error(&C), "stage 1 at");
            dt_test_error("deadlock_says_what_stage1_waits_for", st, dt_ctx_error(&C),
                          "F m2 c0 waits for the activation from stage 0");
            DT_TEST_CHECK("deadlock_is_dt_err_state", st == DT_ERR_STATE);
        }
    } else {
        dt_test_fail("swapped_b0_f2_is_a_deadlock", "could not build the schedule: %s", dt_ctx_error(&C));
    }
    dt_pp_schedule_free(s);
    /* Deadlock of the sends alone: each stage posts its receive only after its own send, and a
       send waits for the receive (stage 0 sends activation 1 before posting the receive of
       gradient 0, stage 1 sends gradient 0 before posting the receive of activation 1). With
       buffered sends this would run; the simulator's synchronous sends must catch it. */
    s = make(DT_PP_1F1B, 2, 2, 1, 1);
    a = s ? find(s, 0, DT_PP_RECV_GRAD, 0) : -1, b = s ? find(s, 0, DT_PP_B, 0) : -1;
    if (a == 0 && b > 0 && find(s, 1, DT_PP_RECV_ACT, 1) >= 0 && find(s, 1, DT_PP_SEND_GRAD, 0) >= 0) {
        move(s, 0, a, b - 1); /* [F0 SEND_ACT0 F1 SEND_ACT1 RECV_GRAD0 B0 ...] */
        move(s, 1, find(s, 1, DT_PP_RECV_ACT, 1), find(s, 1, DT_PP_SEND_GRAD, 0));
        st = dt_pp_schedule_simulate(s, NULL, NULL);
        dt_test_error("sends_waiting_on_each_other_are_a_deadlock", st, dt_ctx_error(&C),
                      "stage 0 at 3 SEND_ACT m1 c0 ->1 waits for stage 1 to post RECV_ACT; stage 1 at 3 SEND_GRAD m0 c0 "
                      "->0 waits for stage 0 to post RECV_GRAD");
    } else {
        dt_test_fail("sends_waiting_on_each_other_are_a_deadlock", "the 1F1B p 2 m 2 lists are not as expected");
    }
    dt_pp_schedule_free(s);
    /* Order: a backward swapped before its forward */
    s = make(DT_PP_1F1B, 4, 8, 1, 0);
    a = s ? find(s, 3, DT_PP_F, 0) : -1, b = s ? find(s, 3, DT_PP_B, 0) : -1;
    if (a >= 0 && b >= 0) {
        swap(s, 3, a, b);
        st = dt_pp_schedule_simulate(s, NULL, NULL);
        dt_test_error("swapped_f_b_is_an_order_violation", st, dt_ctx_error(&C), "order: stage 3");
        dt_test_error("order_violation_says_why", st, dt_ctx_error(&C), "backward before its forward");
    }
    dt_pp_schedule_free(s);
    /* Order: a send swapped before the compute that produces it */
    s = make(DT_PP_GPIPE, 3, 4, 1, 0);
    a = s ? find(s, 1, DT_PP_F, 1) : -1, b = s ? find(s, 1, DT_PP_SEND_ACT, 1) : -1;
    if (a >= 0 && b >= 0) {
        swap(s, 1, a, b);
        dt_test_error("send_before_its_forward_is_an_order_violation", dt_pp_schedule_simulate(s, NULL, NULL),
                      dt_ctx_error(&C), "sent before the F that produces it");
    }
    dt_pp_schedule_free(s);
    /* Order: BW before its BI in ZB-H1 */
    s = make(DT_PP_ZB_H1, 2, 4, 1, 0);
    a = s ? find(s, 0, DT_PP_BI, 0) : -1, b = s ? find(s, 0, DT_PP_BW, 0) : -1;
    if (a >= 0 && b >= 0) {
        swap(s, 0, a, b);
        dt_test_error("bw_before_bi_is_an_order_violation", dt_pp_schedule_simulate(s, NULL, NULL), dt_ctx_error(&C),
                      "a BW before its BI");
    }
    dt_pp_schedule_free(s);
    /* Count: a forward run twice (the second F of micro 1 replaces F of micro 2) */
    s = make(DT_PP_GPIPE, 1, 4, 1, 0);
    a = s ? find(s, 0, DT_PP_F, 2) : -1;
    if (a >= 0) {
        s->actions[0][a].micro = 1;
        dt_test_error("duplicate_forward_is_named", dt_pp_schedule_simulate(s, NULL, NULL), dt_ctx_error(&C),
                      "count: stage 0, action 2 (F m1 c0): a second F");
    }
    dt_pp_schedule_free(s);
    /* Count: a forward with no backward (the last B dropped) */
    s = make(DT_PP_1F1B, 1, 3, 1, 0);
    if (s) {
        s->count[0]--;
        dt_test_error("missing_backward_is_named", dt_pp_schedule_simulate(s, NULL, NULL), dt_ctx_error(&C),
                      "stage 0, chunk 0, micro 2 has no backward");
        s->count[0]++;
    }
    dt_pp_schedule_free(s);
    /* Memory: 1F1B's first stage holds p activations; a bound of p - 1 is exceeded */
    s = make(DT_PP_1F1B, 4, 8, 1, 0);
    if (s) {
        s->bound[0] = 3;
        dt_test_error("activations_above_bound_are_named", dt_pp_schedule_simulate(s, NULL, NULL), dt_ctx_error(&C),
                      "memory: stage 0, action 8 (F m3 c0): 4 activations in flight, above the schedule's bound of 3");
    }
    dt_pp_schedule_free(s);
    /* Fields */
    s = make(DT_PP_1F1B, 2, 2, 1, 0);
    if (s) {
        dt_pp_action keep = s->actions[1][0];
        s->actions[1][0].op = (dt_pp_op)99;
        dt_test_error("op_out_of_range_is_named", dt_pp_schedule_simulate(s, NULL, NULL), dt_ctx_error(&C),
                      "fields: stage 1, action 0 (? m0 c0): op = 99, expected one of F .. RECV_GRAD");
        s->actions[1][0] = keep;
        s->actions[1][0].peer = 1;
        dt_test_error("wrong_peer_is_named", dt_pp_schedule_simulate(s, NULL, NULL), dt_ctx_error(&C),
                      "peer = 1, expected 0 (the stage of the neighbouring virtual stage)");
        s->actions[1][0] = keep;
        s->actions[1][0].micro = 2;
        dt_test_error("micro_out_of_range_is_named", dt_pp_schedule_simulate(s, NULL, NULL), dt_ctx_error(&C),
                      "micro = 2, expected 0 .. 1 (s->micro - 1)");
        s->actions[1][0] = keep;
        DT_TEST_CHECK("restored_schedule_runs_again", dt_pp_schedule_simulate(s, NULL, NULL) == DT_OK);
    }
    dt_pp_schedule_free(s);
}

/* ---------------------------------------------------------------- bad descs */

static void bad_desc(const char *name, dt_pp_kind k, int p, int m, int v, int n_layers, int ahead, const char *want) {
    dt_pp_desc d;
    dt_pp_schedule *s = (dt_pp_schedule *)&d; /* must come back NULL */
    dt_status st;
    memset(&d, 0, sizeof d);
    d.kind = k, d.stages = p, d.micro = m, d.chunks = v, d.n_layers = n_layers, d.recv_ahead = ahead;
    st = dt_pp_schedule_create(&C, &s, &d);
    if (dt_test_error(name, st, dt_ctx_error(&C), want) && s != NULL) dt_test_fail(name, "*out is not NULL on error");
    if (!st) dt_pp_schedule_free(s);
}

static void test_bad_descs(void) {
    dt_pp_schedule *s = NULL;
    dt_pp_desc d;
    dt_pp_sim_desc sd;
    dt_pp_stats stats;
    bad_desc("negative_stages_is_named", DT_PP_1F1B, -1, 4, 1, 0, 0, "desc->stages = -1, expected 1 .. DT_PP_MAX_STAGES = 4096");
    bad_desc("negative_micro_is_named", DT_PP_GPIPE, 2, -3, 1, 0, 0, "desc->micro = -3, expected 1 .. DT_PP_MAX_MICRO");
    bad_desc("negative_chunks_is_named", DT_PP_INTERLEAVED, 2, 4, -1, 0, 0, "desc->chunks = -1, expected 1 .. DT_PP_MAX_CHUNKS");
    bad_desc("chunks_with_1f1b_is_named", DT_PP_1F1B, 2, 4, 2, 0, 0, "desc->chunks = 2 with kind 1f1b, expected 1");
    bad_desc("chunks_with_zb_is_named", DT_PP_ZB_H1, 2, 4, 3, 0, 0, "desc->chunks = 3 with kind zb-h1, expected 1");
    bad_desc("interleaved_fewer_micro_than_stages_is_named", DT_PP_INTERLEAVED, 4, 2, 2, 0, 0,
             "desc->micro = 2 is fewer than desc->stages = 4");
    bad_desc("interleaved_micro_not_multiple_of_stages_is_named", DT_PP_INTERLEAVED, 4, 6, 2, 0, 0,
             "desc->micro = 6 is not a multiple of desc->stages = 4");
    bad_desc("more_virtual_stages_than_layers_is_named", DT_PP_INTERLEAVED, 2, 4, 2, 3, 0,
             "2 x 2 = 4 virtual stages but desc->n_layers = 3");
    bad_desc("more_stages_than_layers_is_named", DT_PP_1F1B, 4, 4, 1, 2, 0, "4 x 1 = 4 virtual stages but desc->n_layers = 2");
    bad_desc("negative_n_layers_is_named", DT_PP_1F1B, 2, 4, 1, -1, 0, "desc->n_layers = -1");
    bad_desc("negative_recv_ahead_is_named", DT_PP_1F1B, 2, 4, 1, 0, -2, "desc->recv_ahead = -2");
    bad_desc("kind_out_of_range_is_named", (dt_pp_kind)9, 2, 4, 1, 0, 0, "desc->kind = 9");
    bad_desc("huge_sizes_are_named", DT_PP_INTERLEAVED, 1000000, 1000000, 1000, 0, 0,
             "desc->stages = 1000000, expected 1 .. DT_PP_MAX_STAGES");
    dt_test_error("null_desc_is_named", dt_pp_schedule_create(&C, &s, NULL), dt_ctx_error(&C), "desc is NULL");
    memset(&d, 0, sizeof d);
    dt_test_error("null_out_is_named", dt_pp_schedule_create(&C, NULL, &d), dt_ctx_error(&C), "out is NULL");
    /* n_layers exactly p * v is fine */
    d.kind = DT_PP_INTERLEAVED, d.stages = 2, d.micro = 4, d.chunks = 2, d.n_layers = 4;
    DT_TEST_CHECK("n_layers_equal_to_virtual_stages_is_accepted", dt_pp_schedule_create(&C, &s, &d) == DT_OK);
    dt_pp_schedule_free(s);
    /* zero desc: one stage, one micro-batch, 1F1B */
    memset(&d, 0, sizeof d);
    s = NULL;
    if (DT_TEST_CHECK("zero_desc_is_one_stage_one_micro_1f1b", dt_pp_schedule_create(&C, &s, &d) == DT_OK && s &&
                                                                    s->kind == DT_PP_1F1B && s->stages == 1 &&
                                                                    s->micro == 1 && s->chunks == 1 && s->count[0] == 2)) {
        memset(&sd, 0, sizeof sd);
        sd.f = -1;
        dt_test_error("negative_cost_is_named", dt_pp_schedule_simulate(s, &stats, &sd), dt_ctx_error(&C),
                      "desc->f = -1, expected a finite cost >= 0");
        sd.f = 0, sd.b = NAN;
        dt_test_error("nan_cost_is_named", dt_pp_schedule_simulate(s, &stats, &sd), dt_ctx_error(&C), "desc->b = nan");
        sd.b = 2, sd.bi = 3;
        dt_test_error("bi_above_b_is_named", dt_pp_schedule_simulate(s, &stats, &sd), dt_ctx_error(&C),
                      "desc->bi = 3 leaves bw = b - bi = -1");
        /* one stage: no bubble, makespan F + B */
        sd.bi = 0, sd.f = 1.5, sd.b = 2.5;
        if (DT_TEST_CHECK("one_stage_simulates", dt_pp_schedule_simulate(s, &stats, &sd) == DT_OK)) {
            dt_test_close("one_stage_makespan_is_f_plus_b", stats.makespan, 4.0, 0.0);
            dt_test_close("one_stage_bubble_is_zero", stats.bubble, 0.0, 0.0);
        }
    }
    dt_pp_schedule_free(s);
    DT_TEST_CHECK("null_schedule_simulate_is_an_error", dt_pp_schedule_simulate(NULL, &stats, NULL) != DT_OK);
    dt_pp_schedule_free(NULL); /* a no-op */
}

/* ---------------------------------------------------------------- costs and messages */

static void test_costs(void) {
    dt_pp_schedule *s = make(DT_PP_1F1B, 4, 8, 1, 0);
    dt_pp_sim_desc sd;
    dt_pp_stats stats;
    if (!s) return;
    /* the closed form holds at any F and B: (p-1)(F+B) idle per stage */
    memset(&sd, 0, sizeof sd);
    sd.f = 1.25, sd.b = 3.5;
    if (DT_TEST_CHECK("1f1b_other_costs_simulate", dt_pp_schedule_simulate(s, &stats, &sd) == DT_OK)) {
        dt_test_close("1f1b_makespan_at_other_costs_is_m_plus_p_minus_1_times_f_plus_b", stats.makespan, 11 * 4.75, 1e-12);
        dt_test_close("1f1b_bubble_at_other_costs_is_closed_form", stats.bubble, 3.0 / 11.0, 1e-12);
    }
    dt_pp_schedule_free(s);
    /* a message latency c: one micro-batch crosses 2 (p-1) boundaries, so the step takes
       p (F + B) + 2 (p-1) c (hand-derived, p 4: 12 + 6c) */
    s = make(DT_PP_GPIPE, 4, 1, 1, 0);
    memset(&sd, 0, sizeof sd);
    sd.comm = 0.25;
    if (s && DT_TEST_CHECK("comm_latency_simulates", dt_pp_schedule_simulate(s, &stats, &sd) == DT_OK))
        dt_test_close("comm_latency_one_micro_adds_2_p_minus_1_hops", stats.makespan, 12 + 6 * 0.25, 0.0);
    dt_pp_schedule_free(s);
    /* and at many micro-batches the simulator with every receive posted early equals the dataflow
       reference with the same latency */
    {
        int ki, bad = 0, st;
        char first[600] = "";
        for (ki = 0; ki < 4; ki++) {
            double **ref, mk;
            s = make(KINDS[ki], 4, 8, KINDS[ki] == DT_PP_INTERLEAVED ? 2 : 1, 1000);
            if (!s || dt_pp_schedule_simulate(s, &stats, &sd)) {
                if (!bad++) snprintf(first, sizeof first, "%s: %s", dt_pp_kind_name(KINDS[ki]), dt_ctx_error(&C));
                dt_pp_schedule_free(s);
                continue;
            }
            ref = (double **)malloc(sizeof(double *) * 4);
            for (st = 0; st < 4; st++) ref[st] = (double *)malloc(sizeof(double) * (size_t)(s->count[st] + 1));
            mk = dataflow(s, ref, 1, 2, 1, 1, 0.25);
            if (fabs(mk - stats.makespan) > 1e-9 && !bad++)
                snprintf(first, sizeof first, "%s: makespan %.9g, reference %.9g", dt_pp_kind_name(KINDS[ki]),
                         stats.makespan, mk);
            for (st = 0; st < 4; st++) free(ref[st]);
            free(ref);
            dt_pp_schedule_free(s);
        }
        verdict("comm_latency_matches_dataflow_reference_p4_m8", bad, 4, first);
    }
    /* the first virtual stage never receives an activation, the last never a gradient; each
       stage of 1F1B p 3 m 2 lists exactly its messages */
    s = make(DT_PP_1F1B, 3, 2, 1, 1);
    if (s) {
        int st, j, sends = 0, recvs = 0, bad = 0;
        for (st = 0; st < 3; st++)
            for (j = 0; j < s->count[st]; j++) {
                dt_pp_op op = s->actions[st][j].op;
                if (op == DT_PP_SEND_ACT || op == DT_PP_SEND_GRAD) sends++;
                if (op == DT_PP_RECV_ACT || op == DT_PP_RECV_GRAD) recvs++;
                if ((st == 0 && (op == DT_PP_RECV_ACT || op == DT_PP_SEND_GRAD)) ||
                    (st == 2 && (op == DT_PP_SEND_ACT || op == DT_PP_RECV_GRAD)))
                    bad++;
            }
        /* 2 boundaries x 2 micro-batches x (activation + gradient) */
        DT_TEST_CHECK("messages_are_one_per_boundary_micro_and_direction", sends == 8 && recvs == 8 && bad == 0);
    }
    dt_pp_schedule_free(s);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    test_grid();
    test_tables();
    test_broken();
    test_bad_descs();
    test_costs();
    dt_test_close("no_bytes_held_after_every_free", (double)C.bytes_in_use, 0.0, 0.0);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
