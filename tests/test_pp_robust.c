/* tests/test_pp_robust.c - the pipeline code of dt_parallel.h on schedules and descs a user got
   wrong, on one process (pp 1, where chunks hand over in memory): a list edited in place (an
   action's chunk -1 or 4096, a micro-batch, op or peer out of range, a message in a one-stage
   pipeline, a schedule's sizes or counts) is DT_ERR_ARG from dt_pp_run naming the stage, the
   action's index, the field, its value and the range, before the runtime uses any of it as an
   index (the run under ASan+UBSan is part of the test: a report there is the bug), and the same
   from the simulator; a BW whose gradient was never produced is an order error, not a read
   before the pool; every refused run gives its bytes back and the intact schedule still runs.
   Sizes beyond DT_PP_MAX_STAGES / _MICRO / _CHUNKS / _PASSES are refused by name and the
   limits themselves are accepted; dt_pp_schedule_format refuses a table whose width is
   infinite, beyond 1e6 slots or beyond 1e7 cells before converting it to an integer (run last:
   a UBSan report ends the asan run). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;
static dt_comm *world;
static dt_layout *lay;

/* PASS iff st is `want` and the ctx message holds `words`. */
static int expect(const char *name, dt_status st, dt_status want, const char *words) {
    const char *msg = dt_ctx_error(&C);
    if (st != want)
        return dt_test_fail(name, "status %d (%s), want %d (%s); message \"%s\"", (int)st, dt_status_name(st), (int)want,
                            dt_status_name(want), msg);
    if (!strstr(msg, words)) return dt_test_fail(name, "message \"%s\", want it to mention \"%s\"", msg, words);
    return dt_test_pass(name);
}

static dt_pp_schedule *make(dt_pp_kind k, int p, int m, int v) {
    dt_pp_desc d;
    dt_pp_schedule *s = NULL;
    memset(&d, 0, sizeof d);
    d.kind = k, d.stages = p, d.micro = m, d.chunks = v;
    if (dt_pp_schedule_create(&C, &s, &d)) {
        dt_test_fail("setup_schedule", "%s", dt_ctx_error(&C));
        exit(1);
    }
    return s;
}

/* ---------------------------------------------------------------- the runtime on edited lists */

/* A model that touches only what the runtime hands it: the forward writes its output, the
   backward its input gradient (both may be NULL at the ends). */
static int calls;
static dt_status m_forward(void *user, int chunk, int micro, dt_tensor *out, const dt_tensor *in) {
    (void)user, (void)in;
    calls++;
    return out ? dt_tensor_fill(&C, out, (double)(chunk * 10 + micro)) : DT_OK;
}
static dt_status m_backward(void *user, int chunk, int micro, dt_tensor *din, const dt_tensor *dout, dt_pp_part part) {
    (void)user, (void)chunk, (void)micro, (void)part;
    calls++;
    if (dout && dout->numel != 4) return dt_ctx_set_error(&C, DT_ERR_STATE, "dout has %lld elements", (long long)dout->numel);
    return din ? dt_tensor_fill(&C, din, 1.0) : DT_OK;
}

static dt_pp_model model(void) {
    dt_pp_model m;
    memset(&m, 0, sizeof m);
    m.forward = m_forward;
    m.backward = m_backward;
    m.act.ndim = 2;
    m.act.shape[0] = 2;
    m.act.shape[1] = 2;
    return m;
}

/* Index of the first action with this op (and chunk, micro) on stage 0; -1 when none. */
static int find(const dt_pp_schedule *s, dt_pp_op op, int chunk, int micro) {
    int j;
    for (j = 0; j < s->count[0]; j++)
        if (s->actions[0][j].op == op && s->actions[0][j].chunk == chunk && s->actions[0][j].micro == micro) return j;
    return -1;
}

/* Runs s as edited, expects `want` naming `words`, then checks that the run gave every byte back. */
static void run_edited(const char *name, const dt_pp_schedule *s, dt_status want, const char *words) {
    dt_pp_model m = model();
    size_t before = C.bytes_in_use;
    char leak[160];
    dt_status st = dt_pp_run(lay, NULL, s, &m, NULL);
    expect(name, st, want, words);
    snprintf(leak, sizeof leak, "%s_gives_its_bytes_back", name);
    if (C.bytes_in_use == before) dt_test_pass(leak);
    else dt_test_fail(leak, "%zu bytes in use after the run, %zu before", C.bytes_in_use, before);
}

static void test_runtime_fields(void) {
    /* interleaved p 1 m 2 v 2: two chunks, so the runtime holds buffers between them; list
       F0a F0b B0b F1a B0a F1b B1b B1a */
    dt_pp_schedule *s = make(DT_PP_INTERLEAVED, 1, 2, 2);
    dt_pp_model m = model();
    dt_pp_action keep;
    int jb = find(s, DT_PP_B, 0, 0), jf = find(s, DT_PP_F, 1, 1), count = s->count[0];
    char want[200];
    calls = 0;
    if (!DT_TEST_CHECK("intact_schedule_runs", dt_pp_run(lay, NULL, s, &m, NULL) == DT_OK && calls == 8)) {
        fprintf(stderr, "%s\n", dt_ctx_error(&C));
        dt_pp_schedule_free(s);
        return;
    }
    if (!DT_TEST_CHECK("list_has_b_c0_m0_and_f_c1_m1", jb >= 0 && jf >= 0)) {
        dt_pp_schedule_free(s);
        return;
    }
    keep = s->actions[0][jb];
    /* the chunk of a backward: the runtime used it to index its per-chunk table */
    s->actions[0][jb].chunk = -1;
    snprintf(want, sizeof want, "dt_pp_run: fields: stage 0, action %d (B m0 c-1): chunk = -1, expected 0 .. 1", jb);
    run_edited("run_backward_chunk_minus_1_is_named", s, DT_ERR_ARG, want);
    s->actions[0][jb].chunk = 4096;
    snprintf(want, sizeof want, "action %d (B m0 c4096): chunk = 4096, expected 0 .. 1 (s->chunks - 1)", jb);
    run_edited("run_backward_chunk_4096_is_named", s, DT_ERR_ARG, want);
    s->actions[0][jb] = keep;
    /* micro-batch, op, peer of a forward */
    keep = s->actions[0][jf];
    s->actions[0][jf].micro = 2;
    snprintf(want, sizeof want, "action %d (F m2 c1): micro = 2, expected 0 .. 1 (s->micro - 1)", jf);
    run_edited("run_forward_micro_2_of_2_is_named", s, DT_ERR_ARG, want);
    s->actions[0][jf].micro = -7;
    run_edited("run_forward_micro_minus_7_is_named", s, DT_ERR_ARG, "micro = -7, expected 0 .. 1");
    s->actions[0][jf] = keep;
    s->actions[0][jf].op = (dt_pp_op)99;
    snprintf(want, sizeof want, "action %d (? m1 c1): op = 99, expected one of F .. RECV_GRAD (1 .. 8)", jf);
    run_edited("run_op_99_is_named", s, DT_ERR_ARG, want);
    s->actions[0][jf].op = DT_PP_NOP;
    run_edited("run_op_nop_is_named", s, DT_ERR_ARG, "op = 0, expected one of F .. RECV_GRAD");
    s->actions[0][jf] = keep;
    s->actions[0][jf].peer = 3;
    run_edited("run_compute_with_a_peer_is_named", s, DT_ERR_ARG, "peer = 3, expected -1 (a compute has no peer)");
    s->actions[0][jf] = keep;
    s->actions[0][jf].op = DT_PP_SEND_ACT;
    s->actions[0][jf].peer = 0;
    run_edited("run_message_at_one_stage_is_named", s, DT_ERR_ARG, "a message in a one-stage pipeline");
    s->actions[0][jf] = keep;
    /* the schedule's own sizes and counts */
    s->chunks = 0;
    run_edited("run_schedule_chunks_0_is_named", s, DT_ERR_ARG, "s->chunks = 0, expected 1 .. DT_PP_MAX_CHUNKS");
    s->chunks = 2;
    s->micro = DT_PP_MAX_MICRO + 1;
    run_edited("run_schedule_micro_above_limit_is_named", s, DT_ERR_ARG, "s->micro = 1048577, expected 1 .. DT_PP_MAX_MICRO");
    s->micro = 2;
    s->count[0] = -1;
    run_edited("run_negative_count_is_named", s, DT_ERR_ARG, "s->count[0] = -1");
    s->count[0] = count;
    /* fields all in range, order broken: a BW of chunk 0 (whose gradient B0b hands over) as the
       list's second action reads a gradient nobody produced */
    s->actions[0][1].op = DT_PP_BW;
    s->actions[0][1].chunk = 0;
    s->actions[0][1].micro = 0;
    s->count[0] = 2;
    run_edited("run_bw_before_its_gradient_is_an_order_error", s, DT_ERR_STATE, "action 1 (BW chunk 0 micro 0)");
    dt_pp_schedule_free(s);
    /* and the simulator names the same fields with the same words */
    s = make(DT_PP_INTERLEAVED, 1, 2, 2);
    s->actions[0][jb].chunk = 4096;
    expect("simulate_chunk_4096_is_named", dt_pp_schedule_simulate(s, NULL, NULL), DT_ERR_ARG,
           "dt_pp_schedule_simulate: fields: stage 0");
    expect("simulate_chunk_4096_names_value_and_range", dt_pp_schedule_simulate(s, NULL, NULL), DT_ERR_ARG,
           "chunk = 4096, expected 0 .. 1");
    s->actions[0][jb].chunk = 0;
    DT_TEST_CHECK("intact_schedule_runs_after_every_refusal", dt_pp_run(lay, NULL, s, &m, NULL) == DT_OK);
    dt_pp_schedule_free(s);
    /* zero bubble at one stage: BW before its BI */
    s = make(DT_PP_ZB_H1, 1, 2, 1);
    {
        int jbw = find(s, DT_PP_BW, 0, 0);
        dt_pp_action a = s->actions[0][jbw];
        s->actions[0][jbw] = s->actions[0][jbw - 1];
        s->actions[0][jbw - 1] = a;
        expect("simulate_bw_before_bi_is_an_order_error", dt_pp_schedule_simulate(s, NULL, NULL), DT_ERR_STATE,
               "a BW before its BI");
    }
    dt_pp_schedule_free(s);
}

/* ---------------------------------------------------------------- size limits */

static void bad_sizes(const char *name, dt_pp_kind k, int p, int m, int v, const char *words) {
    dt_pp_desc d;
    dt_pp_schedule *s = NULL;
    dt_status st;
    memset(&d, 0, sizeof d);
    d.kind = k, d.stages = p, d.micro = m, d.chunks = v;
    st = dt_pp_schedule_create(&C, &s, &d);
    expect(name, st, DT_ERR_ARG, words);
    if (!st) dt_pp_schedule_free(s);
}

static void good_sizes(const char *name, dt_pp_kind k, int p, int m, int v) {
    dt_pp_desc d;
    dt_pp_schedule *s = NULL;
    dt_status st;
    memset(&d, 0, sizeof d);
    d.kind = k, d.stages = p, d.micro = m, d.chunks = v;
    st = dt_pp_schedule_create(&C, &s, &d);
    if (st == DT_OK && s->stages == p && s->micro == m && s->chunks == v) dt_test_pass(name);
    else dt_test_fail(name, "status %d: %s", (int)st, dt_ctx_error(&C));
    dt_pp_schedule_free(s);
}

static void test_limits(void) {
    /* the limits are accepted (in combinations that build fast), one more is refused by name */
    good_sizes("stages_at_limit_is_accepted", DT_PP_GPIPE, DT_PP_MAX_STAGES, 1, 1);
    bad_sizes("stages_above_limit_is_named", DT_PP_GPIPE, DT_PP_MAX_STAGES + 1, 1, 1,
              "desc->stages = 4097, expected 1 .. DT_PP_MAX_STAGES = 4096");
    bad_sizes("stages_16384_is_named", DT_PP_1F1B, 16384, 1, 1, "desc->stages = 16384");
    bad_sizes("stages_1048577_is_named", DT_PP_1F1B, 1048577, 1, 1, "desc->stages = 1048577");
    good_sizes("micro_at_limit_is_accepted", DT_PP_GPIPE, 1, DT_PP_MAX_MICRO, 1); /* also DT_PP_MAX_PASSES */
    bad_sizes("micro_above_limit_is_named", DT_PP_GPIPE, 1, DT_PP_MAX_MICRO + 1, 1,
              "desc->micro = 1048577, expected 1 .. DT_PP_MAX_MICRO = 1048576");
    good_sizes("chunks_at_limit_is_accepted", DT_PP_INTERLEAVED, 1, 1, DT_PP_MAX_CHUNKS);
    bad_sizes("chunks_above_limit_is_named", DT_PP_INTERLEAVED, 1, 1, DT_PP_MAX_CHUNKS + 1,
              "desc->chunks = 1025, expected 1 .. DT_PP_MAX_CHUNKS = 1024");
    bad_sizes("passes_above_limit_are_named", DT_PP_1F1B, DT_PP_MAX_STAGES, 257, 1,
              "desc->stages x desc->chunks x desc->micro = 4096 x 1 x 257 = 1052672 passes, expected at most "
              "DT_PP_MAX_PASSES = 1048576");
    bad_sizes("interleaved_passes_above_limit_are_named", DT_PP_INTERLEAVED, 64, 1024, 32, "= 2097152 passes");
    bad_sizes("int_max_everything_is_named", DT_PP_INTERLEAVED, 2147483647, 2147483647, 2147483647,
              "desc->stages = 2147483647");
    good_sizes("a_normal_size_is_accepted", DT_PP_INTERLEAVED, 8, 64, 4);
}

/* ---------------------------------------------------------------- the table's width */

static void test_format_width(void) {
    dt_pp_schedule *s = make(DT_PP_1F1B, 2, 2, 1);
    dt_pp_sim_desc sd;
    dt_strbuf b;
    memset(&b, 0, sizeof b);
    b.ctx = &C;
    memset(&sd, 0, sizeof sd);
    /* a backward 1e600 forwards long: the width is inf as a double, and no integer */
    sd.f = 1e-300, sd.b = 1e300;
    expect("format_infinite_width_is_named", dt_pp_schedule_format(s, &b, &sd), DT_ERR_ARG, "slots wide");
    /* finite but beyond 1e6 slots (the cast would fit; the table would not) */
    sd.f = 1, sd.b = 1e7;
    expect("format_1e7_slots_is_named", dt_pp_schedule_format(s, &b, &sd), DT_ERR_ARG, "expected at most 1e6 slots");
    /* the width of an int64 and more */
    sd.f = 1e-10, sd.b = 1e10;
    expect("format_2e20_slots_is_named", dt_pp_schedule_format(s, &b, &sd), DT_ERR_ARG, "slots wide");
    DT_TEST_CHECK("format_refusals_write_nothing", b.len == 0);
    sd.f = 1, sd.b = 2;
    if (expect("format_normal_costs_draw", dt_pp_schedule_format(s, &b, &sd), DT_OK, ""))
        DT_TEST_CHECK("format_draws_two_rows", strstr(b.text, "stage 0 |") && strstr(b.text, "stage 1 |"));
    dt_strbuf_free(&b);
    dt_pp_schedule_free(s);
    /* narrow enough, but 128 rows of it: beyond 1e7 cells */
    s = make(DT_PP_GPIPE, 128, 1, 1);
    memset(&b, 0, sizeof b);
    b.ctx = &C;
    sd.f = 1, sd.b = 700;
    expect("format_beyond_1e7_cells_is_named", dt_pp_schedule_format(s, &b, &sd), DT_ERR_ARG, "x 128 stages");
    dt_strbuf_free(&b);
    dt_pp_schedule_free(s);
}

int main(void) {
    dt_layout_desc ld;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) {
        fprintf(stderr, "%s\n", dt_ctx_error(&C));
        return 2;
    }
    memset(&ld, 0, sizeof ld);
    if (dt_layout_create(world, &lay, &ld)) {
        fprintf(stderr, "%s\n", dt_ctx_error(&C));
        return 2;
    }
    test_runtime_fields();
    test_limits();
    test_format_width(); /* last: before the fix, a UBSan report here ends the asan run */
    dt_layout_free(lay);
    dt_comm_free(world);
    DT_TEST_CHECK("all_bytes_returned", C.bytes_in_use == 0);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
