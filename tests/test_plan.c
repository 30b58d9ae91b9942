/* tests/test_plan.c - dt_plan.h's model on hand-derived cases: a profile written by hand (every
   figure chosen), the step and memory each layout must get from it worked out here from the
   formulas the header states, and the bad layouts and profile files it must name. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_embed.h"
#include "dt_plan.h"
#include "dt_test.h"
#include <time.h>

static dt_ctx g_ctx;

/* a model of 4 layers, width 64, 4 heads, vocab 256, T 32, batch 16 */
static dt_plan_model model(void) {
    dt_plan_model m;
    memset(&m, 0, sizeof m);
    m.layers = 4; m.width = 64; m.heads = 4; m.kv_heads = 4; m.vocab = 256; m.seq = 32; m.batch = 16; m.dtype = DT_F32;
    return m;
}

/* block params on one tp rank, by hand: ln 4C, qkv 3C(C+1)/tp, proj C C/tp + C, fc 4C(C+1)/tp, proj 4C C/tp + C */
static double block_params(double C, double tp) {
    return 4 * C + 3 * C * (C + 1) / tp + C * C / tp + C + 4 * C * (C + 1) / tp + 4 * C * C / tp + C;
}

/* A profile by hand: a block's forward costs 1 ms per 1000 rows, its backward 2, attention 0.3,
   the layernorms and gelu 0.1, gelu alone 0.05, embedding 0.01 / 0.02, head 0.2 / 0.4 (all
   linear in rows through 0); collectives alpha 1e-4 s + 1e-9 s per byte; no overlap; the
   optimizer 2e-9 s a parameter, copies 1e-10 s a byte; pipelines without message delay. */
static void hand_profile_upto(dt_plan_profile *p, int world, const dt_plan_model *m, int max_tp, int max_cp) {
    int tp, cp, sp, lse, k, size;
    memset(p, 0, sizeof *p);
    snprintf(p->machine, sizeof p->machine, "by hand");
    p->world = world; p->hosts = 1; p->cores = 2;
    p->model = *m;
    p->opt_s_per_param = 2e-9; p->copy_s_per_byte = 1e-10; p->overlap = 0;
    for (tp = 1; tp <= world && tp <= max_tp; tp *= 2)
        for (cp = 1; cp * tp <= world && cp <= max_cp; cp *= 2)
            for (sp = 0; sp <= 1; sp++)
                for (lse = 0; lse <= 1; lse++) {
                    dt_plan_split *s = &p->splits[p->n_splits++];
                    int j;
                    s->tp = tp; s->cp = cp; s->sp = sp; s->lse = lse;
                    s->rows[0] = 16; s->rows[1] = 512;
                    for (j = 0; j < 2; j++) {
                        double r = (double)s->rows[j] / 1000.0;
                        s->fwd[j] = 1e-3 * r; s->bwd[j] = 2e-3 * r; s->attn[j] = 0.3e-3 * r; s->cheap[j] = 0.1e-3 * r;
                        s->gelu[j] = 0.05e-3 * r; s->embed_fwd[j] = 0.01e-3 * r; s->embed_bwd[j] = 0.02e-3 * r;
                        s->head_fwd[j] = 0.2e-3 * r; s->head_bwd[j] = 0.4e-3 * r;
                    }
                }
    for (size = 2; size <= world; size *= 2)
        for (k = 0; k < DT_PLAN_COLL_KINDS; k++) {
            dt_plan_coll *c = &p->colls[p->n_colls++];
            c->kind = (dt_plan_coll_kind)k; c->size = size; c->alpha = 1e-4; c->beta = 1e-9;
        }
}

static void hand_profile(dt_plan_profile *p, int world, const dt_plan_model *m) { hand_profile_upto(p, world, m, 4, 4); }

static double coll(double bytes) { return 1e-4 + 1e-9 * bytes; }

static void pure_dp_step(void) {
    dt_plan_model m = model();
    dt_plan_profile p;
    dt_plan_layout l;
    dt_plan_prediction pr;
    double rows, F, B, psi, want;
    hand_profile(&p, 2, &m);
    memset(&l, 0, sizeof l);
    l.dp = 2; l.micro = 2;
    if (!DT_TEST_CHECK("plan_pure_dp_predicts", dt_plan_predict(&g_ctx, &p, &l, &pr) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        return;
    }
    /* per micro-batch: 16 / 2 / 2 = 4 sequences of 32 = 128 rows; 4 blocks + embedding + head */
    rows = 128;
    F = 4 * 1e-3 * rows / 1000 + 0.01e-3 * rows / 1000 + 0.2e-3 * rows / 1000;
    B = 4 * 2e-3 * rows / 1000 + 0.02e-3 * rows / 1000 + 0.4e-3 * rows / 1000;
    psi = 4 * block_params(64, 1) + 256 * 64 + 32 * 64 + 2 * 64;
    /* DDP: the all-reduce of 4 psi bytes, none hidden (overlap 0); AdamW on psi; loss and norm all-reduces */
    want = 2 * (F + B) + coll(4 * psi) + 2e-9 * psi + 2 * coll(8);
    dt_test_close("plan_pure_dp_step_is_the_hand_sum", pr.step_s, want, 1e-12);
    dt_test_close("plan_pure_dp_tokens_per_s", pr.tokens_per_s, 16.0 * 32 / want, 1e-6);
    dt_test_close("plan_pure_dp_compute_split", pr.compute_s, 2 * (F + B), 1e-12);
    dt_test_close("plan_pure_dp_exposed_comm_is_the_allreduce", pr.comm_s, coll(4 * psi), 1e-12);
    DT_TEST_CHECK("plan_pure_dp_has_no_bubble", pr.bubble_s == 0);
    /* half the all-reduce hidden behind the last backward (it is shorter than that window here) */
    p.overlap = 0.5;
    dt_plan_predict(&g_ctx, &p, &l, &pr);
    dt_test_close("plan_overlap_hides_its_share_of_the_allreduce", pr.comm_s, 0.5 * coll(4 * psi), 1e-12);
}

/* ZeRO's copies, counted by hand from dt_zero's code in passes over the whole model's bytes
   (copy_s_per_byte 1e-10 a byte, psi params of 4 bytes): stage 1 packs the grads and unpacks the
   values once a step (2 x (4 + 4) psi); stage 2 fills the unit grads, fills the pack and packs
   (3 x 4 psi) every micro-batch and gathers the values at the step (2 x 4 psi); stage 3 also
   gathers twice a micro-batch (3 x 4 psi each). */
static void zero_copies(void) {
    dt_plan_model m = model();
    dt_plan_profile p;
    dt_plan_layout l;
    dt_plan_prediction a, b;
    double psi = 4 * block_params(64, 1) + 256 * 64 + 32 * 64 + 2 * 64, per[4] = {0, 2 * 8, 0, 0}, micro[4] = {0, 0, 12, 36};
    int z;
    per[2] = 2 * 4; /* stage 2's step: the values */
    hand_profile(&p, 2, &m);
    for (z = 1; z <= 3; z++) {
        char name[96];
        memset(&l, 0, sizeof l);
        l.dp = 2; l.zero = z; l.micro = 1;
        if (dt_plan_predict(&g_ctx, &p, &l, &a)) { DT_TEST_CHECK("plan_zero_copies_predict", 0); return; }
        l.micro = 2;
        if (dt_plan_predict(&g_ctx, &p, &l, &b)) { DT_TEST_CHECK("plan_zero_copies_predict", 0); return; }
        /* micro 2 against 1: the per-micro-batch passes once more (the AdamW and all-reduces alike) */
        snprintf(name, sizeof name, "plan_zero%d_copies_per_micro_batch", z);
        dt_test_close(name, b.optimizer_s - a.optimizer_s, 1e-10 * psi * micro[z], 1e-15);
        snprintf(name, sizeof name, "plan_zero%d_copies_at_micro_1", z);
        dt_test_close(name, a.optimizer_s - 2e-9 * psi / 2 - 2 * coll(8), 1e-10 * psi * (per[z] + micro[z]), 1e-15);
    }
}

static void pipeline_stage_times(void) {
    dt_plan_model m = model();
    dt_plan_profile p;
    dt_plan_layout l;
    dt_plan_prediction pr;
    double rows, f, b, f0, b0, f1, b1, want;
    hand_profile(&p, 2, &m);
    /* no embedding or head cost, no message cost: every stage alike, so 1F1B's makespan is the
       textbook (m + p - 1)(F + B) */
    {
        int i, j;
        for (i = 0; i < p.n_splits; i++)
            for (j = 0; j < 2; j++)
                p.splits[i].embed_fwd[j] = p.splits[i].embed_bwd[j] = p.splits[i].head_fwd[j] = p.splits[i].head_bwd[j] = 0;
        for (i = 0; i < p.n_colls; i++)
            if (p.colls[i].kind == DT_PLAN_SENDRECV) p.colls[i].alpha = p.colls[i].beta = 0;
    }
    memset(&l, 0, sizeof l);
    l.pp = 2; l.micro = 4; l.schedule = DT_PP_1F1B;
    if (!DT_TEST_CHECK("plan_pipeline_predicts", dt_plan_predict(&g_ctx, &p, &l, &pr) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        return;
    }
    rows = 16.0 / 4 * 32; /* dp 1, 4 micro-batches of 4 sequences */
    f = 2 * 1e-3 * rows / 1000; /* two blocks a stage */
    b = 2 * 2e-3 * rows / 1000;
    want = (4 + 2 - 1) * (f + b);
    /* the step adds the optimizer over the larger stage's params and the loss / norm all-reduces */
    {
        double psi0 = 2 * block_params(64, 1) + 256 * 64 + 32 * 64, psi1 = 2 * block_params(64, 1) + 2 * 64;
        double psi = psi0 > psi1 ? psi0 : psi1;
        dt_test_close("plan_1f1b_makespan_is_m_plus_p_minus_1_stages", pr.step_s - 2e-9 * psi - 2 * coll(8), want,
                      1e-12);
        dt_test_close("plan_1f1b_bubble_is_p_minus_1_stage_steps", pr.bubble_s, (2 - 1) * (f + b), 1e-12);
    }
    /* a heavier last stage (the head): stage 1 costs f1, b1; the simulator with those stage times
       (stage_f / stage_b) gives what one works out by hand for 1F1B at p = 2, m = 2: stage 1 runs
       F0 B0 F1 B1 back to back from f0 on, and stage 0's B1 follows it: f0 + 2 f1 + 2 b1 + b0 (the
       mean stage would give 1.5 (f0 + f1 + b0 + b1)) */
    {
        int i, j;
        for (i = 0; i < p.n_splits; i++)
            for (j = 0; j < 2; j++) {
                p.splits[i].head_fwd[j] = 3e-3 * (double)p.splits[i].rows[j] / 1000;
                p.splits[i].head_bwd[j] = 5e-3 * (double)p.splits[i].rows[j] / 1000;
            }
    }
    l.micro = 2;
    dt_plan_predict(&g_ctx, &p, &l, &pr);
    rows = 8.0 * 32;
    f0 = 2 * 1e-3 * rows / 1000; b0 = 2 * 2e-3 * rows / 1000;
    f1 = f0 + 3e-3 * rows / 1000; b1 = b0 + 5e-3 * rows / 1000;
    {
        double psi0 = 2 * block_params(64, 1) + 256 * 64 + 32 * 64, psi1 = 2 * block_params(64, 1) + 2 * 64;
        double psi = psi0 > psi1 ? psi0 : psi1;
        dt_test_close("plan_pipeline_uses_each_stages_own_time", pr.step_s - 2e-9 * psi - 2 * coll(8),
                      f0 + 2 * f1 + 2 * b1 + b0, 1e-12);
    }
}

/* dt_zero_memory's formulas (dt_parallel.h >>zero): f32 Adam 16psi, 8psi + 8psi/N, 4psi + 12psi/N,
   16psi/N; bf16 values 18psi, 6psi + 12psi/N, 2psi + 16psi/N, 18psi/N (+ the f32 working copy
   examples/gpt keeps of bf16 values, 4psi) */
static void zero_memory(void) {
    dt_plan_model m = model();
    dt_plan_profile p;
    dt_plan_layout l;
    dt_plan_prediction pr;
    double psi = 4 * block_params(64, 1) + 256 * 64 + 32 * 64 + 2 * 64, N = 4;
    static const double f32[4][2] = {{16, 0}, {8, 8}, {4, 12}, {0, 16}}, bf16[4][2] = {{18, 0}, {6, 12}, {2, 16}, {0, 18}};
    int z, d;
    char name[96];
    for (d = 0; d < 2; d++) {
        m.dtype = d ? DT_BF16 : DT_F32;
        hand_profile(&p, 4, &m);
        for (z = 0; z < 4; z++) {
            const double *f = d ? bf16[z] : f32[z];
            memset(&l, 0, sizeof l);
            l.dp = 4; l.zero = z;
            dt_plan_predict(&g_ctx, &p, &l, &pr);
            snprintf(name, sizeof name, "plan_zero%d_%s_memory_is_deepspeeds_formula", z, d ? "bf16" : "f32");
            dt_test_close(name, pr.mem_params + pr.mem_grads + pr.mem_optimizer - (d ? 4 * psi : 0),
                          f[0] * psi + f[1] * psi / N, 1e-6);
        }
    }
}

static void activations(void) {
    dt_plan_model m = model();
    dt_plan_profile p;
    dt_plan_layout l;
    dt_plan_prediction a, b, c;
    hand_profile(&p, 2, &m);
    memset(&l, 0, sizeof l);
    l.dp = 2;
    dt_plan_predict(&g_ctx, &p, &l, &a);
    l.micro = 2;
    dt_plan_predict(&g_ctx, &p, &l, &b);
    l.micro = 1; l.recompute = DT_PLAN_RECOMPUTE_FULL;
    dt_plan_predict(&g_ctx, &p, &l, &c);
    /* T = 32 < C = 64: every activation term is linear in the rows, so half the rows is half the bytes */
    dt_test_close("plan_activations_halve_with_twice_the_micro_batches", b.mem_activations, a.mem_activations / 2, 1e-3);
    DT_TEST_CHECK("plan_full_recompute_keeps_less", c.mem_activations < a.mem_activations);
    DT_TEST_CHECK("plan_full_recompute_costs_a_forward_more", c.compute_s > a.compute_s);
}

static void search(void) {
    dt_plan_model m = model();
    dt_plan_profile *p = (dt_plan_profile *)calloc(1, sizeof *p);
    dt_plan_prediction top[5];
    dt_plan_search_desc sd;
    int n = 0, total = 0, i, sorted = 1;
    double t0;
    hand_profile(p, 4, &m);
    DT_TEST_CHECK("plan_search_runs", dt_plan_search(&g_ctx, p, NULL, top, 5, &n, &total) == DT_OK);
    for (i = 1; i < n; i++) if (top[i].tokens_per_s > top[i - 1].tokens_per_s) sorted = 0;
    DT_TEST_CHECK("plan_search_returns_five_best_first", n == 5 && total >= 5 && sorted);
    /* every layout it returns predicts the same again on its own */
    for (i = 0; i < n; i++) {
        dt_plan_prediction again;
        dt_plan_predict(&g_ctx, p, &top[i].layout, &again);
        if (again.step_s != top[i].step_s) sorted = 0;
    }
    DT_TEST_CHECK("plan_search_rows_are_the_layouts_predictions", sorted);
    /* a budget below the best's memory: everything returned fits it */
    memset(&sd, 0, sizeof sd);
    sd.mem_budget = top[0].mem_total * 0.6;
    dt_plan_search(&g_ctx, p, &sd, top, 5, &n, &total);
    for (i = 0, sorted = n > 0; i < n; i++) if (top[i].mem_total > sd.mem_budget) sorted = 0;
    DT_TEST_CHECK("plan_search_keeps_within_the_memory_budget", sorted);
    sd.mem_budget = 1;
    dt_plan_search(&g_ctx, p, &sd, top, 5, &n, &total);
    DT_TEST_CHECK("plan_search_with_no_room_finds_nothing", n == 0 && total == 0);
    /* 1024 ranks (splits up to tp 1024 by hand): the time is printed, not asserted */
    free(p);
    p = (dt_plan_profile *)calloc(1, sizeof *p);
    m.layers = 96; m.width = 12288; m.heads = 96; m.kv_heads = 96; m.vocab = 51200; m.seq = 2048; m.batch = 1536;
    hand_profile_upto(p, 1024, &m, 8, 4);
    t0 = dt_comm_now();
    dt_plan_search(&g_ctx, p, NULL, top, 5, &n, &total);
    printf("  (a search over %d layouts of 1024 ranks took %.3f s)\n", total, dt_comm_now() - t0);
    DT_TEST_CHECK("plan_search_answers_for_1024_ranks", n == 5);
    free(p);
}

static void bad_layouts(void) {
    dt_plan_model m = model();
    dt_plan_layout l;
    dt_status st;
    memset(&l, 0, sizeof l);
    l.tp = 3;
    st = dt_plan_layout_check(&g_ctx, &m, 6, &l, NULL);
    dt_test_error("plan_tp_not_dividing_heads_is_named", st, dt_ctx_error(&g_ctx), "tp 3 does not divide heads 4");
    memset(&l, 0, sizeof l);
    l.tp = 2;
    st = dt_plan_layout_check(&g_ctx, &m, 3, &l, NULL);
    dt_test_error("plan_layout_not_dividing_world_is_named", st, dt_ctx_error(&g_ctx), "does not divide the world size 3");
    memset(&l, 0, sizeof l);
    l.micro = 3;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_batch_not_multiple_is_named", st, dt_ctx_error(&g_ctx), "batch 16 is not a multiple of dp x micro = 2 x 3");
    memset(&l, 0, sizeof l);
    l.pp = 2; l.zero = 2;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_zero2_with_pipeline_is_named", st, dt_ctx_error(&g_ctx), "zero 2 with pp 2");
    memset(&l, 0, sizeof l);
    l.pp = 2; l.micro = 3; l.schedule = DT_PP_INTERLEAVED;
    m.batch = 48;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_interleaved_micro_is_named", st, dt_ctx_error(&g_ctx), "micro 3 is not a multiple of pp 2");
    m = model();
    memset(&l, 0, sizeof l);
    l.cp = 3;
    st = dt_plan_layout_check(&g_ctx, &m, 3, &l, NULL);
    dt_test_error("plan_seq_not_multiple_of_2cp_is_named", st, dt_ctx_error(&g_ctx), "seq 32 is not a multiple of 2 x cp = 6");
    m.width = 66;
    memset(&l, 0, sizeof l);
    st = dt_plan_layout_check(&g_ctx, &m, 1, &l, NULL);
    dt_test_error("plan_bad_model_is_named", st, dt_ctx_error(&g_ctx), "model->width = 66, heads = 4");
    m = model();
    memset(&l, 0, sizeof l);
    l.zero = 4;
    st = dt_plan_layout_check(&g_ctx, &m, 1, &l, NULL);
    dt_test_error("plan_zero_out_of_range_is_named", st, dt_ctx_error(&g_ctx), "zero = 4, expected 0 .. 3");
    {
        dt_plan_profile p;
        dt_plan_prediction pr;
        hand_profile(&p, 2, &m);
        p.n_splits = 1; /* tp 1 cp 1 sp 0 lse 0 only */
        memset(&l, 0, sizeof l);
        l.tp = 2;
        st = dt_plan_predict(&g_ctx, &p, &l, &pr);
        dt_test_error("plan_missing_split_is_a_named_state_error", st == DT_ERR_STATE ? st : 0, dt_ctx_error(&g_ctx),
                      "no block timed at tp 2 cp 1 sp 0");
        p.cores = 0;
        st = dt_plan_predict(&g_ctx, &p, &l, &pr);
        dt_test_error("plan_profile_without_cores_is_named", st, dt_ctx_error(&g_ctx), "cores 0");
        p.cores = 2;
        p.n_colls = DT_PLAN_MAX_COLLS + 1;
        {
            int cnt = 0;
            st = dt_plan_search(&g_ctx, &p, NULL, &pr, 1, &cnt, NULL);
        }
        dt_test_error("plan_profile_counts_past_the_arrays_are_named", st, dt_ctx_error(&g_ctx), "n_colls 129");
    }
    {   /* ZB-H1 with sp or recompute: examples/gpt runs the whole backward as BI, so the pipeline
           is 1F1B's; without them the split fills the bubble */
        dt_plan_profile p;
        dt_plan_prediction split, whole, f1b;
        hand_profile(&p, 2, &m);
        memset(&l, 0, sizeof l);
        l.pp = 2; l.micro = 4; l.schedule = DT_PP_ZB_H1;
        dt_plan_predict(&g_ctx, &p, &l, &split);
        l.recompute = DT_PLAN_RECOMPUTE_FULL;
        dt_plan_predict(&g_ctx, &p, &l, &whole);
        l.schedule = DT_PP_1F1B;
        dt_plan_predict(&g_ctx, &p, &l, &f1b);
        DT_TEST_CHECK("plan_zb_split_backward_has_less_bubble", split.bubble_s < f1b.bubble_s);
        dt_test_close("plan_zb_with_recompute_is_1f1bs_pipeline", whole.bubble_s, f1b.bubble_s, 1e-6 * f1b.bubble_s);
    }
}

/* dt_pp_sim_desc.stage_f / stage_b (dt_parallel.h), which the planner feeds: both or neither,
   finite and >= 0, each named */
static void simulator_stage_costs(void) {
    dt_pp_desc pd;
    dt_pp_schedule *s = NULL;
    dt_pp_sim_desc sd;
    dt_pp_stats st;
    double f[2] = {1, 3}, b[2] = {2, 6}, bad[2] = {1, -1};
    dt_status e;
    memset(&pd, 0, sizeof pd);
    pd.kind = DT_PP_GPIPE; pd.stages = 2; pd.micro = 1;
    if (!DT_TEST_CHECK("plan_simulator_schedule_builds", dt_pp_schedule_create(&g_ctx, &s, &pd) == DT_OK)) return;
    memset(&sd, 0, sizeof sd);
    sd.stage_f = f; sd.stage_b = b;
    e = dt_pp_schedule_simulate(s, &st, &sd);
    /* one micro-batch through two stages: F0 F1 B1 B0 in a row */
    dt_test_close("plan_simulator_takes_each_stages_costs", e ? -1 : st.makespan, 1 + 3 + 6 + 2, 1e-12);
    sd.stage_b = NULL;
    e = dt_pp_schedule_simulate(s, &st, &sd);
    dt_test_error("plan_simulator_stage_f_without_stage_b_is_named", e, dt_ctx_error(&g_ctx), "expected both or neither");
    sd.stage_b = bad;
    e = dt_pp_schedule_simulate(s, &st, &sd);
    dt_test_error("plan_simulator_negative_stage_cost_is_named", e, dt_ctx_error(&g_ctx), "stage_b[1] = -1");
    dt_pp_schedule_free(s);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(text, f); fclose(f); }
}

/* the file's text into text[0 .. cap) (empty when it cannot be read) */
static void read_file(const char *path, char *text, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(text, 1, cap - 1, f) : 0;
    if (f) fclose(f);
    text[n] = '\0';
}

static void files(void) {
    dt_plan_model m = model();
    dt_plan_profile a, b;
    dt_status st;
    char path[512];
    static char text[1 << 16];
    const char *d = dt_test_tmpdir();
    hand_profile(&a, 2, &m);
    a.n_pipes = 1; a.pipes[0].pp = 2; a.pipes[0].bytes[0] = 1000; a.pipes[0].bytes[1] = 2000;
    a.pipes[0].delay[0] = 1e-3; a.pipes[0].delay[1] = 3e-3;
    snprintf(path, sizeof path, "%s/prof.json", d);
    DT_TEST_CHECK("plan_profile_saves", dt_plan_profile_save(&g_ctx, &a, path) == DT_OK);
    dt_test_error("plan_profile_save_unwritable_is_named", dt_plan_profile_save(&g_ctx, &a, "/nonexistent/dir/p.json"),
                  dt_ctx_error(&g_ctx), "dt_plan_profile_save: cannot write /nonexistent/dir/p.json");
    st = dt_plan_profile_load(&g_ctx, &b, path);
    if (DT_TEST_CHECK("plan_profile_loads_what_it_saved", st == DT_OK)) {
        int same = a.world == b.world && a.n_splits == b.n_splits && a.n_colls == b.n_colls && a.n_pipes == b.n_pipes &&
                   !memcmp(&a.model, &b.model, sizeof a.model), i;
        for (i = 0; same && i < a.n_splits; i++)
            same = a.splits[i].tp == b.splits[i].tp && a.splits[i].rows[1] == b.splits[i].rows[1] &&
                   fabs(a.splits[i].bwd[1] - b.splits[i].bwd[1]) <= 1e-9 * a.splits[i].bwd[1];
        for (i = 0; same && i < a.n_colls; i++)
            same = a.colls[i].kind == b.colls[i].kind && fabs(a.colls[i].beta - b.colls[i].beta) <= 1e-17;
        same = same && fabs(b.pipes[0].delay[1] - 3e-3) < 1e-12;
        DT_TEST_CHECK("plan_profile_round_trips", same);
    } else
        printf("  %s\n", dt_ctx_error(&g_ctx));
    snprintf(path, sizeof path, "%s/none.json", d);
    st = dt_plan_profile_load(&g_ctx, &b, path);
    dt_test_error("plan_profile_missing_file_is_named", st, dt_ctx_error(&g_ctx), "cannot open");
    snprintf(path, sizeof path, "%s/bad.json", d);
    write_file(path, "{\"dt_plan_profile\": 1, \"world\": ");
    st = dt_plan_profile_load(&g_ctx, &b, path);
    dt_test_error("plan_profile_truncated_json_is_named", st, dt_ctx_error(&g_ctx), "bad.json");
    write_file(path, "{\"world\": 2}");
    st = dt_plan_profile_load(&g_ctx, &b, path);
    dt_test_error("plan_profile_foreign_json_is_named", st, dt_ctx_error(&g_ctx), "not a dt_plan profile");
    /* a saved file with one field broken: a negative alpha */
    snprintf(path, sizeof path, "%s/prof.json", d);
    {
        char *at;
        read_file(path, text, sizeof text);
        at = strstr(text, "\"alpha\": ");
        if (at) { memmove(at + 10, at + 9, strlen(at + 9) + 1); at[9] = '-'; }
        snprintf(path, sizeof path, "%s/neg.json", d);
        write_file(path, text);
        st = dt_plan_profile_load(&g_ctx, &b, path);
        dt_test_error("plan_profile_negative_alpha_is_named", st, dt_ctx_error(&g_ctx), "collectives[0].alpha");
        at = strstr(text, "\"layers\": 4");
        if (at) at[10] = 'x';
        write_file(path, text);
        st = dt_plan_profile_load(&g_ctx, &b, path);
        dt_test_error("plan_profile_bad_model_field_is_named", st, dt_ctx_error(&g_ctx), "neg.json");
    }
    /* a count that is a fraction: named, not cut to an integer */
    snprintf(path, sizeof path, "%s/prof.json", d);
    {
        char *at;
        read_file(path, text, sizeof text);
        at = strstr(text, "\"tp\": 1");
        if (at) { memmove(at + 8, at + 6, strlen(at + 6) + 1); memcpy(at + 6, "1.5", 3); }
        snprintf(path, sizeof path, "%s/frac.json", d);
        write_file(path, text);
        st = dt_plan_profile_load(&g_ctx, &b, path);
        dt_test_error("plan_profile_fractional_count_is_named", st, dt_ctx_error(&g_ctx), "splits[0].tp = 1.5, expected an integer");
    }
}

/* ---- on paper: a machine's published figures (dt_plan_profile_paper) ---- */

/* text = src with its first `from` replaced by `to` */
static void swap_text(char *text, size_t cap, const char *src, const char *from, const char *to) {
    const char *at = strstr(src, from);
    if (!at) { snprintf(text, cap, "%s", src); return; }
    snprintf(text, cap, "%.*s%s%s", (int)(at - src), src, to, at + strlen(from));
}

/* 4 ranks a host; 1 TFLOP/s at half efficiency everywhere; HBM 100 GB/s at half; links: 10 GB/s
   busbw inside a host (10 us), 1 GB/s a NIC (100 us across), sends 5 / 1 GB/s; nothing overlaps */
static dt_plan_machine hand_machine(void) {
    dt_plan_machine mc;
    memset(&mc, 0, sizeof mc);
    snprintf(mc.name, sizeof mc.name, "by hand");
    mc.ranks_per_host = 4; mc.flops = 1e12; mc.gemm_eff = 0.5; mc.attn_fwd_eff = 0.5; mc.attn_bwd_eff = 0.25;
    mc.mem_bw = 1e11; mc.mem_eff = 0.5; mc.mem_bytes = 1e10; mc.reserved_bytes = 1e9; mc.act_bytes = 2;
    mc.intra_bw = 1e10; mc.intra_alpha = 1e-5; mc.nic_bw = 1e9; mc.inter_alpha = 1e-4;
    mc.p2p_intra_bw = 5e9; mc.p2p_inter_bw = 1e9;
    return mc;
}

/* one block's forward and backward on paper at N rows, tp = sp = cp = 1, from the header's words:
   GEMMs 2 N C (C + 2 Ckv + C + 2 F) at gemm_eff, attention 2 b T^2 C at attn_fwd_eff (backward 2.5x
   at attn_bwd_eff), 4 N C (layernorms) + 6 N C (residuals) + 2 N F (gelu) elements of 2 bytes at
   mem_eff (the backward twice) */
static void paper_block(const dt_plan_machine *mc, double C, double F, double T, double N, double *f, double *b) {
    double gemm = 2 * N * C * (C + 2 * C + C + 2 * F) / (mc->flops * mc->gemm_eff), bs = N / T;
    double attn = 2 * bs * T * T * C, bw = mc->mem_bw * mc->mem_eff, elem = 2 * (4 * N * C + 6 * N * C + 2 * N * F) / bw;
    *f = gemm + attn / (mc->flops * mc->attn_fwd_eff) + elem;
    *b = 2 * gemm + 2.5 * attn / (mc->flops * mc->attn_bwd_eff) + 2 * elem;
}

static void paper(void) {
    dt_plan_machine mc = hand_machine();
    dt_plan_model m = model();
    dt_plan_profile *p = (dt_plan_profile *)calloc(1, sizeof *p);
    dt_plan_layout l;
    dt_plan_prediction pr, top[5];
    dt_status st;
    double N, f, b, ef, eb, hf, hb, psi, C = 64, V = 256, bw = 1e11 * 0.5, ar, want, t0;
    int n = 0, total = 0;
    m.dtype = DT_BF16;
    /* 8 ranks on 2 hosts, dp 8: the all-reduce spans the hosts, 4 NICs of a host at once */
    if (!DT_TEST_CHECK("plan_paper_profile_made", dt_plan_profile_paper(&g_ctx, &mc, &m, 8, p) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        free(p);
        return;
    }
    DT_TEST_CHECK("plan_paper_profile_counts_hosts", p->hosts == 2 && p->paper == 1);
    memset(&l, 0, sizeof l);
    l.dp = 8;
    st = dt_plan_predict(&g_ctx, p, &l, &pr);
    DT_TEST_CHECK("plan_paper_predicts_pure_dp", st == DT_OK);
    N = 16.0 / 8 * 32; /* 2 sequences of 32 */
    paper_block(&mc, C, 4 * C, 32, N, &f, &b);
    ef = 2 * 2 * N * C / bw; eb = ef;                             /* the embedding's rows */
    hf = 2 * N * C * V / 0.5e12 + (4.0 * 2 * N * V + 2 * 2 * N * C) / bw; /* logits, the f32 loss pass, ln_f */
    hb = 2 * (2 * N * C * V / 0.5e12) + (4.0 * 2 * N * V + 2 * 2 * N * C) / bw;
    psi = 4 * block_params(C, 1) + V * C + 32 * C + 2 * C;
    ar = 1e-4 * 3 + 4 * psi * 2 * 7 / 8 / 4e9;                    /* log2 8 = 3 hops; 4 NICs x 1 GB/s */
    want = 4 * (f + b) + ef + eb + hf + hb + ar + (28.0 + 2) / bw * psi + 2 * (1e-4 * 3 + 8.0 * 2 * 7 / 8 / 4e9);
    dt_test_close("plan_paper_pure_dp_step_is_the_hand_sum", pr.step_s, want, 1e-9);
    dt_test_close("plan_paper_allreduce_across_hosts_at_four_nics", pr.comm_s, ar, 1e-9);
    dt_test_close("plan_paper_mfu_is_model_flops_over_peak", pr.mfu,
                  dt_plan_model_flops(&m) * 16 * 32 / pr.step_s / (8 * 1e12), 1e-12);
    /* activations on paper: 2 bytes an element, attention keeps lse only (no [T, T]) */
    {
        double Nl = N, Ffl = 4 * C, att = 2.0 * 4 * 32; /* b H T lse */
        double core = Nl * C + 2 * Nl + Nl * C + 2 * Nl + N * 3 * C + N * C + Nl * C + N * Ffl;
        double e = 4 * (Nl * C + core + att + N * Ffl) + Nl * C * 2 + 2 * Nl + N * V + 4 * N + N * C + Nl * C +
                   Nl * C * 2 + N * C * 3 + N * 3 * C + N * C + N * Ffl * 2 + N * V;
        dt_test_close("plan_paper_activations_are_bf16_with_flash", pr.mem_activations, 2 * e, 1e-12);
        dt_test_close("plan_paper_params_are_bf16_and_the_f32_working_copy", pr.mem_params, 6 * psi, 1e-12);
    }
    /* dp 2 x tp 4: tp's group is a host (its all-reduces at 10 GB/s), dp's pairs are 4 ranks apart:
       one NIC each, 1 GB/s */
    l.dp = 2; l.tp = 4;
    st = dt_plan_predict(&g_ctx, p, &l, &pr);
    psi = 4 * block_params(C, 4) + V / 4 * C + 32 * C + 2 * C;
    dt_test_close("plan_paper_dp_pairs_across_hosts_use_one_nic", st == DT_OK ? pr.comm_s : -1,
                  1e-4 + 4 * psi * 2 * 1 / 2 / 1e9, 1e-9);
    /* the same on a host of 8: all inside */
    mc.ranks_per_host = 8;
    dt_plan_profile_paper(&g_ctx, &mc, &m, 8, p);
    st = dt_plan_predict(&g_ctx, p, &l, &pr);
    dt_test_close("plan_paper_dp_pairs_inside_a_host_at_busbw", st == DT_OK ? pr.comm_s : -1,
                  1e-5 + 4 * psi * 2 * 1 / 2 / 1e10, 1e-9);
    mc.ranks_per_host = 4;
    /* Megatron's count of a step's FLOPs: 72 B s l h^2 (1 + s / 6h + V / 12 l h) (Narayanan et al. 2021) */
    {
        dt_plan_model g;
        double h = 12288, s = 2048, L = 96, Vg = 51200;
        memset(&g, 0, sizeof g);
        g.layers = 96; g.width = 12288; g.heads = 96; g.vocab = 51200; g.seq = 2048; g.batch = 1536;
        dt_test_close("plan_model_flops_is_megatrons_formula", dt_plan_model_flops(&g),
                      72 * L * h * h * (1 + s / (6 * h) + Vg / (12 * L * h)), 1e-12 * 1.1e12);
        g.kv_heads = 8; g.width = 8192; g.heads = 64; g.ffn = 28672; g.gated = 1; g.layers = 80; g.vocab = 128256;
        h = 8192; L = 80; Vg = 128256;
        dt_test_close("plan_model_flops_of_a_gated_gqa_model", dt_plan_model_flops(&g),
                      6 * (L * (h * (h + 2 * 1024) + h * h + 3 * h * 28672) + Vg * h) + 12 * L * s * h, 1e-12 * 1e12);
    }
    /* the search on paper prunes what cannot win: its first five are the best five of all layouts
       predicted one by one (64 ranks, 2 hosts of 32, the model at 4 layers) */
    {
        dt_plan_model g = model();
        dt_plan_prediction all;
        int tp, cp, pp, zero, sp, rec, sch, i, same, round, pipes = 0;
        int64_t micro;
        double best[5] = {0, 0, 0, 0, 0}, budget = 0; /* round 1: half of what round 0's first holds */
        g.dtype = DT_BF16; g.batch = 128;
        mc.ranks_per_host = 32;
        dt_plan_profile_paper(&g_ctx, &mc, &g, 64, p);
        for (round = 0; round < 2; round++) { /* then within half the memory of the first: it binds */
            dt_plan_search_desc sd;
            memset(&sd, 0, sizeof sd);
            sd.mem_budget = round ? 0.5 * budget : mc.mem_bytes - mc.reserved_bytes;
            sd.recompute = 1;
            st = dt_plan_search(&g_ctx, p, &sd, top, 5, &n, &total);
            DT_TEST_CHECK(round ? "plan_paper_search_runs_within_a_budget" : "plan_paper_search_runs",
                          st == DT_OK && n == 5);
            if (!round) budget = top[0].mem_total;
            for (i = 0; i < 5; i++) best[i] = 0;
            for (tp = 1; tp <= 4; tp *= 2)
                for (cp = 1; cp <= 16; cp *= 2)
                    for (pp = 1; pp <= 4; pp *= 2)
                        for (micro = 1; micro <= 128; micro *= 2)
                            for (sch = pp > 1 ? DT_PP_GPIPE : 0; sch <= (pp > 1 ? DT_PP_ZB_H1 : 0); sch++)
                                for (zero = 0; zero <= 3; zero++)
                                    for (sp = 0; sp <= (tp > 1); sp++) /* sp 1 at tp 1 is sp 0 */
                                        for (rec = 0; rec < DT_PLAN_RECOMPUTE_COUNT; rec++) {
                                            memset(&l, 0, sizeof l);
                                            l.tp = tp; l.cp = cp; l.pp = pp; l.micro = (int)micro; l.zero = zero;
                                            l.sp = sp; l.schedule = (dt_pp_kind)sch;
                                            l.recompute = (dt_plan_recompute)rec;
                                            if (dt_plan_predict(&g_ctx, p, &l, &all) != DT_OK ||
                                                all.mem_total > sd.mem_budget)
                                                continue;
                                            if (round && l.pp > 1) pipes++;
                                            for (i = 4; i >= 0 && all.tokens_per_s > best[i]; i--) {
                                                if (i < 4) best[i + 1] = best[i];
                                                best[i] = all.tokens_per_s;
                                            }
                                        }
            for (i = 0, same = n == 5; i < n; i++) same = same && fabs(top[i].tokens_per_s - best[i]) <= 1e-9 * best[i];
            if (!DT_TEST_CHECK(round ? "plan_paper_search_within_a_budget_first_five_are_the_best_five"
                                     : "plan_paper_search_first_five_are_the_best_five", same))
                for (i = 0; i < n; i++) printf("  %d: search %.6g, one by one %.6g\n", i, top[i].tokens_per_s, best[i]);
            if (round && !DT_TEST_CHECK("plan_paper_search_within_a_budget_ranks_a_layout_that_fits_first",
                                        top[0].mem_total <= sd.mem_budget && pipes > 5)) {
                char ls[160];
                printf("  budget %.4g MB: first %s (%.4g MB), %d pipelines fit\n", sd.mem_budget / 1e6,
                       dt_plan_layout_string(&top[0].layout, ls, sizeof ls), top[0].mem_total / 1e6, pipes);
            }
        }
        mc.ranks_per_host = 4;
    }
    /* GPT-3's shape on 1024 ranks answers in well under a second (printed, not asserted) */
    {
        dt_plan_model g;
        memset(&g, 0, sizeof g);
        g.layers = 96; g.width = 12288; g.heads = 96; g.vocab = 51200; g.seq = 2048; g.batch = 1536; g.dtype = DT_BF16;
        mc.ranks_per_host = 8; mc.mem_bytes = 8e10;
        dt_plan_profile_paper(&g_ctx, &mc, &g, 1024, p);
        t0 = dt_comm_now();
        st = dt_plan_search(&g_ctx, p, NULL, top, 5, &n, &total);
        printf("  (a paper search over %d layouts of 1024 ranks took %.3f s)\n", total, dt_comm_now() - t0);
        DT_TEST_CHECK("plan_paper_search_answers_for_1024_ranks", st == DT_OK && n == 5 && top[0].mem_total <= 8e10 - 1e9);
        mc = hand_machine();
    }
    /* what it refuses, by name */
    mc.ranks_per_host = 0;
    st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, p);
    dt_test_error("plan_paper_bad_ranks_per_host_is_named", st, dt_ctx_error(&g_ctx), "ranks_per_host = 0");
    mc = hand_machine();
    mc.gemm_eff = 1.5;
    st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, p);
    dt_test_error("plan_paper_bad_efficiency_is_named", st, dt_ctx_error(&g_ctx), "gemm_eff = 1.5");
    mc = hand_machine();
    mc.reserved_bytes = 2e10;
    st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, p);
    dt_test_error("plan_paper_reserved_above_memory_is_named", st, dt_ctx_error(&g_ctx), "reserved_bytes");
    mc = hand_machine();
    dt_plan_profile_paper(&g_ctx, &mc, &m, 8, p);
    st = dt_plan_profile_save(&g_ctx, p, "/nonexistent/x.json");
    dt_test_error("plan_paper_profile_is_not_saved", st, dt_ctx_error(&g_ctx), "machine file");
    m.ffn = -1;
    st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, p);
    dt_test_error("plan_model_bad_ffn_is_named", st, dt_ctx_error(&g_ctx), "ffn = -1");
    /* machine files: every field read back; a missing, a bad and a fractional one named */
    {
        static const char good[] =
            "{\"dt_plan_machine\": 1, \"name\": \"hand\", \"sources\": [\"here\"], \"ranks_per_host\": 4, "
            "\"flops\": 1e12, \"gemm_eff\": 0.5, \"attn_fwd_eff\": 0.5, \"attn_bwd_eff\": 0.25, \"mem_bw\": 1e11, "
            "\"mem_eff\": 0.5, \"mem_bytes\": 1e10, \"reserved_bytes\": 1e9, \"act_bytes\": 2, \"intra_bw\": 1e10, "
            "\"intra_alpha\": 1e-5, \"nic_bw\": 1e9, \"inter_alpha\": 1e-4, \"p2p_intra_bw\": 5e9, "
            "\"p2p_inter_bw\": 1e9, \"overlap\": 0, \"tp_overlap\": 0, \"h2d_bw\": 0}";
        char path[512], text[2048];
        dt_plan_machine got, want_mc = hand_machine();
        snprintf(path, sizeof path, "%s/machine.json", dt_test_tmpdir());
        write_file(path, good);
        st = dt_plan_machine_load(&g_ctx, &got, path);
        snprintf(got.name, sizeof got.name, "by hand");
        DT_TEST_CHECK("plan_machine_file_loads", st == DT_OK && !memcmp(&got, &want_mc, sizeof got));
        if (st) printf("  %s\n", dt_ctx_error(&g_ctx));
        swap_text(text, sizeof text, good, "\"nic_bw\"", "\"NIC_bw\"");
        write_file(path, text);
        st = dt_plan_machine_load(&g_ctx, &got, path);
        dt_test_error("plan_machine_missing_field_is_named", st, dt_ctx_error(&g_ctx), "nic_bw = (missing)");
        swap_text(text, sizeof text, good, "\"h2d_bw\"", "\"h2d\"");
        write_file(path, text);
        st = dt_plan_machine_load(&g_ctx, &got, path);
        dt_test_error("plan_machine_missing_host_link_is_named", st, dt_ctx_error(&g_ctx), "h2d_bw = (missing)");
        swap_text(text, sizeof text, good, "\"mem_eff\": 0.5", "\"mem_eff\": 7.5");
        write_file(path, text);
        st = dt_plan_machine_load(&g_ctx, &got, path);
        dt_test_error("plan_machine_bad_field_is_named", st, dt_ctx_error(&g_ctx), "mem_eff = 7.5");
        swap_text(text, sizeof text, good, "\"ranks_per_host\": 4", "\"ranks_per_host\": 4.5");
        write_file(path, text);
        st = dt_plan_machine_load(&g_ctx, &got, path);
        dt_test_error("plan_machine_fractional_ranks_per_host_is_named", st, dt_ctx_error(&g_ctx), "ranks_per_host");
    }
    /* the machine files the repository ships (docs/machines): they load, and the DGX H100 one puts
       the Megatron-LM README's 177B layout (tp 8, pp 6, dp 48 on 2304 GPUs, batch 1152 of 4096
       tokens; published 432.8 TFLOP/s a GPU) within 25% of what was published (bench/plan_paper
       prints the rest) */
    {
        static const char *const files[] = {"docs/machines/h100-dgx.json", "docs/machines/a100-dgx.json"};
        dt_plan_machine got;
        int f, ok = 1;
        for (f = 0; f < 2; f++)
            if (dt_plan_machine_load(&g_ctx, &got, files[f])) {
                ok = 0;
                printf("  %s\n", dt_ctx_error(&g_ctx));
            }
        DT_TEST_CHECK("plan_shipped_machine_files_load", ok);
        if (ok && dt_plan_machine_load(&g_ctx, &got, files[0]) == DT_OK) {
            dt_plan_model g;
            double tf;
            memset(&g, 0, sizeof g);
            g.layers = 96; g.width = 12288; g.heads = 96; g.vocab = 131072; g.seq = 4096; g.batch = 1152;
            g.dtype = DT_BF16;
            memset(&l, 0, sizeof l);
            l.tp = 8; l.pp = 6; l.micro = 24; l.zero = 1; l.sp = 1; l.schedule = DT_PP_INTERLEAVED;
            st = dt_plan_profile_paper(&g_ctx, &got, &g, 2304, p);
            if (!st) st = dt_plan_predict(&g_ctx, p, &l, &pr);
            tf = st ? 0 : pr.mfu * got.flops / 1e12;
            if (!DT_TEST_CHECK("plan_paper_h100_177b_within_25_percent_of_published", fabs(tf / 432.8 - 1) < 0.25))
                printf("  predicted %.1f TFLOP/s a GPU, published 432.8 (%s)\n", tf, st ? dt_ctx_error(&g_ctx) : "");
        }
    }
    free(p);
}

/* A measured profile of two hosts: a group measured across them costs what crosses, one inside
   what stays (dp pairs 2 ranks apart on hosts of 2 cross; tp pairs do not) */
static void cross_hosts(void) {
    dt_plan_model m = model();
    dt_plan_profile *p = (dt_plan_profile *)calloc(1, sizeof *p);
    dt_plan_layout l;
    dt_plan_prediction pr;
    double psi;
    int k;
    hand_profile(p, 4, &m);
    p->hosts = 2;
    for (k = 0; k < DT_PLAN_COLL_KINDS; k++) { /* the same sizes again, across: 100 x slower per byte */
        dt_plan_coll *c = &p->colls[p->n_colls++];
        c->kind = (dt_plan_coll_kind)k; c->size = 2; c->cross = 1; c->alpha = 1e-4; c->beta = 1e-7;
    }
    memset(&l, 0, sizeof l);
    l.dp = 2; l.tp = 2;
    DT_TEST_CHECK("plan_cross_predicts", dt_plan_predict(&g_ctx, p, &l, &pr) == DT_OK);
    psi = 4 * block_params(64, 2) + 256 / 2 * 64 + 32 * 64 + 2 * 64;
    dt_test_close("plan_dp_pairs_across_hosts_take_the_cross_figures", pr.comm_s, 1e-4 + 1e-7 * 4 * psi, 1e-12);
    l.dp = 4; l.tp = 1; /* dp 4 spans the hosts: the pairs measured across, scaled by the ring's 2 (n - 1) / n */
    DT_TEST_CHECK("plan_cross_scales_the_largest_group_across", dt_plan_predict(&g_ctx, p, &l, &pr) == DT_OK);
    psi = 4 * block_params(64, 1) + 256 * 64 + 32 * 64 + 2 * 64;
    dt_test_close("plan_cross_group_of_four_from_the_pairs", pr.comm_s, 1e-4 * 2 + 1e-7 * 4 * psi * 1.5, 1e-12);
    free(p);
}

/* ---- DLRM: the tables' plans (dt_plan_dlrm_*) ---- */

/* Two ranks, three tables (0 and 1 alike and big, 2 small); column-wise and table-row not
   measured. Seconds and bytes chosen so that every plan's sum is easy to follow. */
static void dlrm_profile(dt_plan_dlrm_profile *p) {
    int t;
    memset(p, 0, sizeof *p);
    snprintf(p->machine, sizeof p->machine, "by hand");
    p->world = 2; p->hosts = 1; p->n_tables = 3; p->dim_total = 24; p->batch = 100;
    p->dense_s = 1e-3; p->base_bytes = 1e6; p->dense_peak = 2e5;
    p->x_fwd = 1e-4; p->x_bwd = 2e-4; p->x_bytes = 1000;
    for (t = 0; t < 3; t++) {
        double s = t < 2 ? 1 : 0.05; /* the small table: 1/20 of a big one */
        dt_plan_table_cost *c;
        c = &p->cost[t][DT_SHARD_TABLE];
        c->ok = 1; c->fwd[0] = 3e-4 * s; c->fwd[1] = 5e-5 * s; c->bwd[0] = 4e-4 * s; c->bwd[1] = 0;
        c->bytes[0] = 1e5 * s; c->bytes[1] = 0; c->peak[0] = 1e4 * s; c->peak[1] = 2e3 * s;
        c = &p->cost[t][DT_SHARD_ROW];
        c->ok = 1; c->fwd[0] = c->fwd[1] = 2e-4 * s; c->bwd[0] = c->bwd[1] = 2.5e-4 * s;
        c->bytes[0] = c->bytes[1] = 5e4 * s; c->peak[0] = c->peak[1] = 2e3 * s;
        c = &p->cost[t][DT_SHARD_DATA];
        c->ok = 1; c->fwd[0] = c->fwd[1] = 1e-4 * s; c->bwd[0] = c->bwd[1] = 6e-4 * s;
        c->bytes[0] = c->bytes[1] = 1e5 * s; c->peak[0] = c->peak[1] = 5e3 * s;
        p->auto_kind[t] = DT_SHARD_ROW;
    }
}

static dt_plan_dlrm_plan dlrm_plan(dt_embed_sharding k0, int o0, dt_embed_sharding k1, int o1, dt_embed_sharding k2,
                                   int o2) {
    dt_plan_dlrm_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.n_tables = 3;
    pl.kind[0] = k0; pl.owner[0] = o0; pl.kind[1] = k1; pl.owner[1] = o1; pl.kind[2] = k2; pl.owner[2] = o2;
    return pl;
}

/* the DLRM profile's file: every field back, bit for bit; a broken one named */
static void dlrm_files(void) {
    dt_plan_dlrm_profile a, b;
    dt_status st;
    char path[512], bad[512];
    static char text[1 << 16], broken[1 << 16];
    dlrm_profile(&a);
    a.whole_fwd[DT_SHARD_ROW] = 1.25e-3; a.scale_bwd[DT_SHARD_DATA] = 1.0 / 3; a.auto_owner[1] = 1;
    a.auto_kind[2] = DT_SHARD_TABLE; a.measure_s = 2.5;
    snprintf(path, sizeof path, "%s/dlrm_prof.json", dt_test_tmpdir());
    DT_TEST_CHECK("plan_dlrm_profile_saves", dt_plan_dlrm_profile_save(&g_ctx, &a, path) == DT_OK);
    st = dt_plan_dlrm_profile_load(&g_ctx, &b, path);
    if (st) printf("  %s\n", dt_ctx_error(&g_ctx));
    DT_TEST_CHECK("plan_dlrm_profile_round_trips_bit_for_bit", st == DT_OK && !memcmp(&a, &b, sizeof a));
    read_file(path, text, sizeof text);
    snprintf(bad, sizeof bad, "%s/dlrm_bad.json", dt_test_tmpdir());
    swap_text(broken, sizeof broken, text, "\"auto_owner\": 1", "\"auto_owner\": 2"); /* a rank past the world */
    write_file(bad, broken);
    st = dt_plan_dlrm_profile_load(&g_ctx, &b, bad);
    dt_test_error("plan_dlrm_profile_owner_past_the_world_is_named", st, dt_ctx_error(&g_ctx), "tables[1].auto_owner");
    swap_text(broken, sizeof broken, text, "\"ok\": 1", "\"ok\": 0.5");
    write_file(bad, broken);
    st = dt_plan_dlrm_profile_load(&g_ctx, &b, bad);
    dt_test_error("plan_dlrm_profile_fractional_flag_is_named", st, dt_ctx_error(&g_ctx), "cost[");
    swap_text(broken, sizeof broken, text, "\"dense_s\": ", "\"dense_s\": -");
    write_file(bad, broken);
    st = dt_plan_dlrm_profile_load(&g_ctx, &b, bad);
    dt_test_error("plan_dlrm_profile_negative_time_is_named", st, dt_ctx_error(&g_ctx), "dense_s");
    dt_test_error("plan_dlrm_profile_save_unwritable_is_named",
                  dt_plan_dlrm_profile_save(&g_ctx, &a, "/nonexistent/dir/d.json"), dt_ctx_error(&g_ctx),
                  "dt_plan_dlrm_profile_save: cannot write /nonexistent/dir/d.json");
    swap_text(broken, sizeof broken, text, "\"row\"", "\"rows\"");
    write_file(bad, broken);
    st = dt_plan_dlrm_profile_load(&g_ctx, &b, bad);
    dt_test_error("plan_dlrm_profile_unknown_kind_is_named", st, dt_ctx_error(&g_ctx), "kinds");
    write_file(bad, "{\"dt_plan_profile\": 1}");
    st = dt_plan_dlrm_profile_load(&g_ctx, &b, bad);
    dt_test_error("plan_dlrm_profile_foreign_file_is_named", st, dt_ctx_error(&g_ctx), "not a dt_plan DLRM profile");
}

static void dlrm_plans(void) {
    dt_plan_dlrm_profile p;
    dt_plan_dlrm_plan pl;
    dt_plan_dlrm_prediction pr, top[16];
    double f, b, want, best = 1e30, best_fit = 1e30, budget;
    int n = 0, i, ok;
    dt_status st;
    dlrm_profile(&p);
    /* table 0 on rank 0, table 1 on rank 1, table 2 replicated: each rank owns one big table and
       asks the other's; the small one is local work on both */
    pl = dlrm_plan(DT_SHARD_TABLE, 0, DT_SHARD_TABLE, 1, DT_SHARD_DATA, 0);
    if (!DT_TEST_CHECK("plan_dlrm_predicts", dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        return;
    }
    f = 3e-4 + 5e-5 + 0.05 * 1e-4; /* own + ask + data: the same on both ranks */
    b = 4e-4 + 0 + 0.05 * 6e-4;
    want = 1e-3 + (1e-4 + f) + (2e-4 + b);
    dt_test_close("plan_dlrm_step_is_dense_plus_each_phase_exchange_and_busiest_rank", pr.step_s, want, 1e-15);
    dt_test_close("plan_dlrm_forward_split", pr.fwd_s, 1e-4 + f, 1e-15);
    dt_test_close("plan_dlrm_exchange_split", pr.exchange_s, 3e-4, 1e-15);
    dt_test_close("plan_dlrm_balanced_has_no_imbalance", pr.imbalance_s, 0, 1e-15);
    dt_test_close("plan_dlrm_samples_per_s", pr.samples_per_s, 100 / want, 1e-6);
    /* memory: base + dense peak + one embedding + a big table (own) + the small replica; transients:
       the owned table's, the asked one's, the replica's */
    dt_test_close("plan_dlrm_memory_is_the_hand_sum", pr.mem_total,
                  1e6 + 2e5 + 1000 + 1e5 + 0.05 * 1e5 + 1e4 + 2e3 + 0.05 * 5e3, 1e-6);
    /* both big tables on rank 0: rank 0 works for both, rank 1 only asks */
    pl = dlrm_plan(DT_SHARD_TABLE, 0, DT_SHARD_TABLE, 0, DT_SHARD_TABLE, 1);
    dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr);
    f = 2 * 3e-4 + 0.05 * 5e-5; /* rank 0: owns 0 and 1, asks 2 */
    b = 2 * 4e-4;
    want = 1e-3 + 1e-4 + f + 2e-4 + b;
    dt_test_close("plan_dlrm_one_rank_owning_both_is_the_busiest", pr.step_s, want, 1e-15);
    DT_TEST_CHECK("plan_dlrm_busiest_rank_named", pr.busiest == 0);
    /* rank 1's work: asks 0 and 1, owns 2: the mean of the two ranks' work, and the busiest above it */
    dt_test_close("plan_dlrm_imbalance_is_busiest_less_mean", pr.imbalance_s,
                  f + b - 0.5 * ((f + b) + (2 * 5e-5 + 0.05 * 3e-4 + 0.05 * 4e-4)), 1e-15);
    /* every table replicated: no exchange in the forward, the backward's sparse all-reduce */
    pl = dlrm_plan(DT_SHARD_DATA, 0, DT_SHARD_DATA, 0, DT_SHARD_DATA, 0);
    dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr);
    dt_test_close("plan_dlrm_data_parallel_forward_has_no_exchange", pr.fwd_s, 2.05 * 1e-4, 1e-15);
    dt_test_close("plan_dlrm_data_parallel_step", pr.step_s, 1e-3 + 2.05 * 1e-4 + 2e-4 + 2.05 * 6e-4, 1e-15);
    /* the search against every plan there is (4 choices a table: table on 0 or 1, row, data) */
    for (i = 0; i < 64; i++) {
        dt_embed_sharding ks[4] = {DT_SHARD_TABLE, DT_SHARD_TABLE, DT_SHARD_ROW, DT_SHARD_DATA};
        int os[4] = {0, 1, 0, 0};
        pl = dlrm_plan(ks[i % 4], os[i % 4], ks[i / 4 % 4], os[i / 4 % 4], ks[i / 16], os[i / 16]);
        dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr);
        if (pr.step_s < best) best = pr.step_s;
    }
    st = dt_plan_dlrm_search(&g_ctx, &p, 0, top, 16, &n);
    DT_TEST_CHECK("plan_dlrm_search_runs", st == DT_OK && n >= 4);
    for (i = 1, ok = 1; i < n; i++) ok = ok && top[i].step_s >= top[i - 1].step_s;
    DT_TEST_CHECK("plan_dlrm_search_ranks_best_first", ok);
    if (n < 1 || !dt_test_close("plan_dlrm_search_finds_the_best_of_all_64_plans", top[0].step_s, best, 1e-3 * best))
        printf("  first: %s %.9g, best of all %.9g\n", n ? top[0].plan.name : "-", n ? top[0].step_s : 0, best);
    for (i = 0, ok = 0; i < n; i++) ok += !strcmp(top[i].plan.name, "auto");
    DT_TEST_CHECK("plan_dlrm_search_ranks_dt_embeds_own_plan", ok == 1);
    /* a budget under the fastest plan's memory: the best plan that fits, found again by brute force */
    budget = top[0].mem_total - 1;
    for (i = 0; i < 64; i++) {
        dt_embed_sharding ks[4] = {DT_SHARD_TABLE, DT_SHARD_TABLE, DT_SHARD_ROW, DT_SHARD_DATA};
        int os[4] = {0, 1, 0, 0};
        pl = dlrm_plan(ks[i % 4], os[i % 4], ks[i / 4 % 4], os[i / 4 % 4], ks[i / 16], os[i / 16]);
        dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr);
        if (pr.mem_total <= budget && pr.step_s < best_fit) best_fit = pr.step_s;
    }
    st = dt_plan_dlrm_search(&g_ctx, &p, budget, top, 16, &n);
    for (i = 0, ok = st == DT_OK && n >= 1; ok && i < n; i++) ok = top[i].mem_total <= budget;
    if (!DT_TEST_CHECK("plan_dlrm_search_keeps_to_the_memory_budget", ok))
        printf("  status %d, %d plans; first %s, %.0f bytes; budget %.0f\n", (int)st, n, n ? top[0].plan.name : "-",
               n ? top[0].mem_total : 0, budget);
    if (n >= 1) dt_test_close("plan_dlrm_search_finds_the_best_plan_that_fits", top[0].step_s, best_fit, 1e-3 * best_fit);
    st = dt_plan_dlrm_search(&g_ctx, &p, 1, top, 16, &n);
    DT_TEST_CHECK("plan_dlrm_search_nothing_fits_one_byte", st == DT_OK && n == 0);
    /* bad plans and arguments are named */
    pl = dlrm_plan(DT_SHARD_TABLE, 0, DT_SHARD_COLUMN, 0, DT_SHARD_DATA, 0);
    st = dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr);
    dt_test_error("plan_dlrm_unmeasured_kind_is_named", st, dt_ctx_error(&g_ctx), "plan.kind[1] = 4 (column)");
    pl = dlrm_plan(DT_SHARD_TABLE, 2, DT_SHARD_ROW, 0, DT_SHARD_DATA, 0);
    st = dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr);
    dt_test_error("plan_dlrm_owner_outside_the_world_is_named", st, dt_ctx_error(&g_ctx), "plan.owner[0] = 2");
    pl.n_tables = 2;
    st = dt_plan_dlrm_predict(&g_ctx, &p, &pl, &pr);
    dt_test_error("plan_dlrm_plan_of_other_tables_is_named", st, dt_ctx_error(&g_ctx), "plan.n_tables = 2");
    st = dt_plan_dlrm_search(&g_ctx, &p, -5, top, 16, &n);
    dt_test_error("plan_dlrm_negative_budget_is_named", st, dt_ctx_error(&g_ctx), "mem_budget = -5");
    st = dt_plan_dlrm_search(&g_ctx, &p, 0, top, 0, &n);
    dt_test_error("plan_dlrm_search_max_0_is_named", st, dt_ctx_error(&g_ctx), "max >= 1");
    st = dt_plan_dlrm_predict(&g_ctx, NULL, &pl, &pr);
    dt_test_error("plan_dlrm_null_profile_is_named", st, dt_ctx_error(&g_ctx), "p is NULL");
    st = dt_plan_dlrm_measure(NULL, NULL, NULL);
    DT_TEST_CHECK("plan_dlrm_measure_without_a_world_is_refused", st == DT_ERR_ARG);
}

/* Ulysses (cp by all-to-alls): its own timed block, its memory by hand (the whole sequence's
   [T, T] of H / cp heads and uqkv where the ring keeps lse), its limits named, its file field */
static void ulysses(void) {
    dt_plan_model m = model();
    dt_plan_profile p, q;
    dt_plan_layout l;
    dt_plan_prediction ring, uly, top[256];
    dt_status st;
    char path[512];
    int i, n = 0, total = 0, found = 0;
    hand_profile(&p, 2, &m);
    {   /* the Ulysses block: 5 ms forward and 7 ms backward per 1000 rows (the ring's: 1 and 2) */
        dt_plan_split *s = &p.splits[p.n_splits++];
        int j;
        *s = p.splits[0];
        s->cp = 2; s->lse = 0; s->ulysses = 1;
        for (j = 0; j < 2; j++) {
            s->fwd[j] = 5e-3 * (double)s->rows[j] / 1000.0;
            s->bwd[j] = 7e-3 * (double)s->rows[j] / 1000.0;
        }
    }
    memset(&l, 0, sizeof l);
    l.cp = 2;
    st = dt_plan_predict(&g_ctx, &p, &l, &ring);
    l.ulysses = 1;
    if (!DT_TEST_CHECK("plan_ulysses_predicts", st == DT_OK && dt_plan_predict(&g_ctx, &p, &l, &uly) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        return;
    }
    {   /* 16 sequences of 16 rows a rank: 256 rows; 4 blocks, the embedding and the head */
        double r = 256 / 1000.0, want = 4 * (5e-3 + 7e-3) * r + (0.01e-3 + 0.02e-3 + 0.2e-3 + 0.4e-3) * r;
        dt_test_close("plan_ulysses_uses_its_own_block_times", uly.compute_s, want, 1e-9);
    }
    {   /* per block: b (H / cp) T^2 scores and N x 3C of uqkv, where the ring keeps b H (T / cp) lse */
        double b = 16, H = 4, T = 32, N = 16 * 16, C = 64;
        double diff = 4 * 4 * (b * (H / 2) * T * T + N * 3 * C - b * H * (T / 2));
        dt_test_close("plan_ulysses_memory_is_the_rings_plus_its_scores_by_hand", uly.mem_activations - ring.mem_activations,
                      diff, 1e-9);
    }
    st = dt_plan_search(&g_ctx, &p, NULL, top, 256, &n, &total);
    for (i = 0; st == DT_OK && i < n; i++) found += top[i].layout.ulysses;
    DT_TEST_CHECK("plan_search_tries_ulysses", st == DT_OK && found > 0);
    /* limits: the heads per tp rank must divide by cp; 0 or 1; not on paper */
    memset(&l, 0, sizeof l);
    l.cp = 8; l.ulysses = 1;
    m.seq = 64;
    st = dt_plan_layout_check(&g_ctx, &m, 8, &l, NULL);
    dt_test_error("plan_ulysses_heads_not_dividing_is_named", st, dt_ctx_error(&g_ctx), "which cp 8 must divide");
    m = model();
    l.cp = 2; l.ulysses = 2;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_ulysses_out_of_range_is_named", st, dt_ctx_error(&g_ctx), "ulysses = 2, expected 0 or 1");
    l.ulysses = 1; l.cp = 1;
    DT_TEST_CHECK("plan_ulysses_at_cp1_is_plain_attention",
                  dt_plan_layout_check(&g_ctx, &m, 2, &l, &l) == DT_OK && l.ulysses == 0);
    {   /* on paper (bf16, flash), 8 ranks, dp 4 cp 2: the cp pairs inside a host. Per block, against
           the ring: Ulysses' exchange ux in the forward and the backward (f32 rows: two all-to-alls
           each, costed as all-gathers of the same bytes, and their copies), and its backward runs
           the forward's attention fa again; the ring's exposed sends (cpc - fa in the forward; in
           the backward K/V again and cp = 2 sums of dK/dV in f32, cpb - ba; here both exposed) go.
           Memory: uqkv (N x 3C, 2 bytes) where
           the ring keeps lse (b H T / cp) */
        dt_plan_machine mc = hand_machine();
        dt_plan_profile *pp = (dt_plan_profile *)malloc(sizeof *pp);
        dt_plan_prediction pr_ring, pr_uly;
        dt_plan_search_desc sd;
        double b = 4, T = 32, C = 64, H = 4, N = b * T / 2, bw = 1e11 * 0.5;
        double attn = 2 * b * T * T * C / 2, fa = attn / (1e12 * 0.5), ba = 2.5 * attn / (1e12 * 0.25);
        double io = 1e-5 + 4 * N * 3 * C / 2 / 1e10 + 1e-5 + 4 * N * C / 2 / 1e10, mv = 16 * N * 4 * C / bw;
        double ux = io + mv, cpc = 1e-5 + N * 2 * C * 2 / 5e9, cpb = cpc + 2 * (1e-5 + N * 2 * C * 4 / 5e9);
        m.dtype = DT_BF16;
        memset(&l, 0, sizeof l);
        l.cp = 2;
        st = pp ? dt_plan_profile_paper(&g_ctx, &mc, &m, 8, pp) : DT_ERR_OOM;
        if (!st) st = dt_plan_predict(&g_ctx, pp, &l, &pr_ring);
        l.ulysses = 1;
        if (!st) st = dt_plan_predict(&g_ctx, pp, &l, &pr_uly);
        if (DT_TEST_CHECK("plan_ulysses_on_paper_predicts", st == DT_OK && cpc > fa && cpb > ba)) {
            dt_test_close("plan_ulysses_on_paper_compute_by_hand", pr_uly.compute_s - pr_ring.compute_s,
                          4 * ((ux) + (fa + ux) - (cpc - fa) - (cpb - ba)), 1e-12);
            dt_test_close("plan_ulysses_on_paper_memory_is_uqkv_not_lse", pr_uly.mem_activations - pr_ring.mem_activations,
                          2 * 4 * (N * 3 * C - b * H * T / 2), 1e-9);
        } else
            printf("  %s\n", dt_ctx_error(&g_ctx));
        /* the search on paper tries it; no_ring leaves Ulysses alone at cp > 1 */
        memset(&sd, 0, sizeof sd);
        sd.no_ring = 1;
        n = 0;
        st = pp ? dt_plan_search(&g_ctx, pp, &sd, top, 256, &n, &total) : DT_ERR_OOM;
        for (i = 0, found = 0; st == DT_OK && i < n; i++) found += top[i].layout.cp > 1 && !top[i].layout.ulysses;
        DT_TEST_CHECK("plan_search_no_ring_tries_no_ring", st == DT_OK && n > 0 && found == 0);
        sd.no_ring = 0;
        st = pp ? dt_plan_search(&g_ctx, pp, &sd, top, 256, &n, &total) : DT_ERR_OOM;
        for (i = 0, found = 0; st == DT_OK && i < n; i++) found |= (top[i].layout.cp > 1) << top[i].layout.ulysses;
        DT_TEST_CHECK("plan_search_on_paper_tries_both_cp_kinds", st == DT_OK && found == 3);
        m.dtype = DT_F32;
        free(pp);
    }
    /* the file keeps the field; ulysses with lse 1 is named */
    snprintf(path, sizeof path, "%s/uly.json", dt_test_tmpdir());
    st = dt_plan_profile_save(&g_ctx, &p, path);
    if (!st) st = dt_plan_profile_load(&g_ctx, &q, path);
    DT_TEST_CHECK("plan_ulysses_split_round_trips", st == DT_OK && q.n_splits == p.n_splits &&
                                                         q.splits[p.n_splits - 1].ulysses == 1 &&
                                                         q.splits[0].ulysses == 0);
    {
        static char text[1 << 16], bad[1 << 16];
        read_file(path, text, sizeof text);
        swap_text(bad, sizeof bad, text, "\"lse\": 0, \"ulysses\": 1", "\"lse\": 1, \"ulysses\": 1");
        write_file(path, bad);
        st = dt_plan_profile_load(&g_ctx, &q, path);
        dt_test_error("plan_ulysses_keeping_lse_is_named", st, dt_ctx_error(&g_ctx), "ulysses = 1 with cp 2, lse 1");
    }
}

/* Activation offload on paper (a CUDA machine): three slots, the copies on a side stream beside the
   compute at the machine's h2d_bw. dp 8 on 8 ranks, 2 sequences of 32 a rank, 4 blocks, bf16, flash
   (lse kept): a stage's forward is its compute or its first block and the copies out after it,
   whichever is longer; the backward the same with the one block copied back (4 out, 3 stay). */
static void paper_offload(void) {
    dt_plan_machine mc = hand_machine();
    dt_plan_model m = model();
    dt_plan_profile *pp = (dt_plan_profile *)malloc(sizeof *pp);
    dt_plan_prediction none, all, half, fast, top[8];
    dt_plan_layout l;
    dt_plan_search_desc sd;
    dt_status st;
    double N = 64, C = 64, V = 256, f, b, ef, eb, hf, hb, bw = 1e11 * 0.5, own, c;
    int n = 0, total = 0;
    if (!pp) return;
    m.dtype = DT_BF16;
    memset(&l, 0, sizeof l);
    l.offload = 1;
    st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, pp);
    if (!st) st = dt_plan_predict(&g_ctx, pp, &l, &all);
    dt_test_error("plan_offload_on_paper_without_a_host_link_is_named", st, dt_ctx_error(&g_ctx), "h2d_bw 0");
    { /* a block's own tensors, 2 bytes an element: as plan_paper_activations_are_bf16_with_flash counts them */
        double att = 2.0 * 4 * 32, core = N * C + 2 * N + N * C + 2 * N + N * 3 * C + N * C + N * C + N * 4 * C;
        own = 2 * (N * C + core + att + N * 4 * C);
    }
    paper_block(&mc, C, 4 * C, 32, N, &f, &b);
    ef = 2 * 2 * N * C / bw; eb = ef;
    hf = 2 * N * C * V / 0.5e12 + (4.0 * 2 * N * V + 2 * 2 * N * C) / bw;
    hb = 2 * (2 * N * C * V / 0.5e12) + (4.0 * 2 * N * V + 2 * 2 * N * C) / bw;
    mc.h2d_bw = 1e6; /* a slow link: the copies are the stage's time */
    c = own / mc.h2d_bw;
    st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, pp);
    l.offload = 0;
    if (!st) st = dt_plan_predict(&g_ctx, pp, &l, &none);
    l.offload = 1;
    if (!st) st = dt_plan_predict(&g_ctx, pp, &l, &all);
    l.offload = 0.5;
    if (!st) st = dt_plan_predict(&g_ctx, pp, &l, &half);
    mc.h2d_bw = 1e15; /* a fast one: the copies hide */
    if (!st) st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, pp);
    l.offload = 1;
    if (!st) st = dt_plan_predict(&g_ctx, pp, &l, &fast);
    if (!DT_TEST_CHECK("plan_paper_offload_predicts", st == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        free(pp);
        return;
    }
    dt_test_close("plan_paper_offload_no_copies_is_the_compute", none.compute_s, 4 * (f + b) + ef + eb + hf + hb, 1e-9);
    dt_test_close("plan_paper_offload_slow_link_four_out_one_back", all.compute_s, f + 4 * c + b + c, 1e-9);
    dt_test_close("plan_paper_offload_keeps_three_slots_of_four_blocks", none.mem_activations - all.mem_activations, own,
                  1e-9);
    dt_test_close("plan_paper_offload_half_is_two_out_none_back", half.compute_s, f + 2 * c + 4 * b + eb + hb, 1e-9);
    dt_test_close("plan_paper_offload_half_saves_nothing_over_its_slots", half.mem_activations, none.mem_activations,
                  1e-12);
    dt_test_close("plan_paper_offload_fast_link_hides_the_copies", fast.step_s, none.step_s, 1e-12);
    /* the search offloads only where the layout without it does not fit */
    memset(&sd, 0, sizeof sd);
    sd.mem_budget = none.mem_total - 0.5 * own;
    sd.max_micro = 1;
    st = dt_plan_search(&g_ctx, pp, &sd, top, 8, &n, &total);
    {
        int i, offs = 0, needed = 1;
        for (i = 0; i < n; i++) {
            dt_plan_prediction twin;
            dt_plan_layout tl = top[i].layout;
            if (!(top[i].layout.offload > 0)) continue;
            offs++;
            tl.offload = 0;
            if (dt_plan_predict(&g_ctx, pp, &tl, &twin) || twin.mem_total <= sd.mem_budget) needed = 0;
        }
        DT_TEST_CHECK("plan_paper_search_offloads_to_fit_a_budget", st == DT_OK && n >= 1 && offs >= 1 &&
                                                                   top[0].mem_total <= sd.mem_budget);
        DT_TEST_CHECK("plan_paper_search_offloads_only_what_does_not_fit_without", needed);
        if (st || !offs || !needed)
            for (i = 0; i < n; i++) printf("  %d: dp %d tp %d pp %d zero %d offload %g: %.6g tokens/s, %.6g bytes of %.6g\n",
                                           i, top[i].layout.dp, top[i].layout.tp, top[i].layout.pp, top[i].layout.zero,
                                           top[i].layout.offload, top[i].tokens_per_s, top[i].mem_total, sd.mem_budget);
    }
    sd.mem_budget = 0;
    st = dt_plan_search(&g_ctx, pp, &sd, top, 8, &n, &total);
    {
        int i, off = 0;
        for (i = 0; i < n; i++) off += top[i].layout.offload > 0;
        DT_TEST_CHECK("plan_paper_search_with_room_does_not_offload", st == DT_OK && n >= 1 && off == 0);
    }
    mc.h2d_bw = 5e5;
    st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, pp);
    dt_test_error("plan_paper_tiny_host_link_is_named", st, dt_ctx_error(&g_ctx), "h2d_bw = 500000");
    free(pp);
}

/* Activation offload: a block's own tensors copied out after its forward and (but for the two
   slots' last blocks) back before its backward, at the profile's copy rate; the device keeps two
   slots instead of the blocks. By hand at 4 blocks, and a budget only offload meets. */
static void offload(void) {
    dt_plan_model m = model();
    dt_plan_profile p;
    dt_plan_layout l;
    dt_plan_prediction none, all, half, top[8];
    dt_plan_search_desc sd;
    dt_status st;
    int n = 0, total = 0;
    /* one block's own tensors at dp 1, micro 1, recompute none: 16 sequences of 32, C 64, 4 heads, [T, T] kept */
    double b = 16, T = 32, N = 512, C = 64, H = 4;
    double own = 4 * (N * C + (N * C + 2 * N + N * C + 2 * N + N * 3 * C + N * C + N * C + N * 4 * C) + b * H * T * T +
                      N * 4 * C);
    double r = N / 1000.0, base = 4 * (1e-3 + 2e-3) * r + (0.01e-3 + 0.02e-3 + 0.2e-3 + 0.4e-3) * r;
    hand_profile(&p, 1, &m);
    memset(&l, 0, sizeof l);
    st = dt_plan_predict(&g_ctx, &p, &l, &none);
    l.offload = 1;
    if (!st) st = dt_plan_predict(&g_ctx, &p, &l, &all);
    l.offload = 0.5;
    if (!st) st = dt_plan_predict(&g_ctx, &p, &l, &half);
    if (!DT_TEST_CHECK("plan_offload_predicts", st == DT_OK)) { printf("  %s\n", dt_ctx_error(&g_ctx)); return; }
    dt_test_close("plan_offload_costs_four_copies_out_and_two_back", all.compute_s, base + 6 * own * 1e-10, 1e-9);
    dt_test_close("plan_offload_keeps_two_slots_of_four_blocks", none.mem_activations - all.mem_activations, 2 * own,
                  1e-9);
    dt_test_close("plan_offload_half_is_two_blocks_out_none_back", half.compute_s, base + 2 * own * 1e-10, 1e-9);
    dt_test_close("plan_offload_half_saves_nothing_over_its_slots", half.mem_activations, none.mem_activations, 1e-12);
    /* a budget between the two: only offload fits (the search tries it when there is a budget) */
    memset(&sd, 0, sizeof sd);
    sd.mem_budget = none.mem_total - own;
    sd.max_micro = 1;
    st = dt_plan_search(&g_ctx, &p, &sd, top, 8, &n, &total);
    DT_TEST_CHECK("plan_search_offloads_to_fit_a_budget", st == DT_OK && n >= 1 && top[0].layout.offload == 1 &&
                                                             top[0].mem_total <= sd.mem_budget);
    memset(&sd, 0, sizeof sd);
    st = dt_plan_search(&g_ctx, &p, &sd, top, 8, &n, &total);
    DT_TEST_CHECK("plan_search_without_a_budget_does_not_offload", st == DT_OK && n >= 1 && top[0].layout.offload == 0);
    /* limits */
    l.offload = 1.5;
    st = dt_plan_layout_check(&g_ctx, &m, 1, &l, NULL);
    dt_test_error("plan_offload_out_of_range_is_named", st, dt_ctx_error(&g_ctx), "offload = 1.5, expected 0 .. 1");
    l.offload = NAN;
    st = dt_plan_layout_check(&g_ctx, &m, 1, &l, NULL);
    dt_test_error("plan_offload_nan_is_named", st, dt_ctx_error(&g_ctx), "offload = nan");
    memset(&l, 0, sizeof l);
    l.pp = 2; l.micro = 2; l.schedule = DT_PP_ZB_H1; l.offload = 1;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_offload_with_zb_is_named", st, dt_ctx_error(&g_ctx), "offload 1 with zb-h1");
    paper_offload();
}


/* ---- mixture of experts: the layer timed apart, expert parallel, its memory ---- */

/* model() with 4 experts, top 2, in blocks 1 and 3, balanced by the bias; a world of 2 whose
   profile times the MoE layer at ep 1 (3 ms forward, 5 backward per 1000 rows; the dense MLP it
   replaces 0.4 and 0.8) and ep 2 (2 and 4); its acts 1000 bytes a row, the layer's 500 */
static dt_plan_model moe_model(void) {
    dt_plan_model m = model();
    m.experts = 4; m.top_k = 2; m.moe_every = 2; m.capacity = 1.25; m.balance = DT_MOE_BIAS;
    return m;
}

static void moe_profile(dt_plan_profile *p, const dt_plan_model *m) {
    int ep, j;
    hand_profile_upto(p, 2, m, 1, 1);
    for (ep = 1; ep <= 2; ep++) {
        dt_plan_moe *x = &p->moes[p->n_moes++];
        x->tp = 1; x->cp = 1; x->sp = 0; x->ep = ep;
        x->rows[0] = 16; x->rows[1] = 512;
        for (j = 0; j < 2; j++) {
            double r = (double)x->rows[j] / 1000.0;
            x->fwd[j] = (ep == 1 ? 3e-3 : 2e-3) * r; x->bwd[j] = (ep == 1 ? 5e-3 : 4e-3) * r;
            x->mlp_fwd[j] = 0.4e-3 * r; x->mlp_bwd[j] = 0.8e-3 * r;
            x->acts[j] = 1000.0 * (double)x->rows[j]; x->layer[j] = 500.0 * (double)x->rows[j];
        }
    }
}

/* ---- what dt_zero holds above its persistent buffers (the transient) ---- */

/* dt_plan replays dt_zero's calls; here the peaks are derived by hand from dt_parallel.h's >>zero
   for D = 2 reduce-scatters in flight (the default). A unit of n elements over N = 2 ranks: a
   rank's rows g = n / 2, its reduce-scatter's buffers 4 g (N + 1) = 6 n, its scratch 4 g (N - 1)
   = 2 n from the communicator's pool, whose slots are kept at 1.125 x the largest need. The
   profile's ops hold nothing extra, so mem_transient is dt_zero's alone. */
static void zero_transient(void) {
    dt_plan_model m = model();
    dt_plan_profile *p = (dt_plan_profile *)malloc(sizeof *p);
    dt_plan_layout l;
    dt_plan_prediction pr;
    double C = 64, n0 = 256 * C + 32 * C + 2 * C, b = block_params(C, 1), x, bx, want;
    int z;
    if (!DT_TEST_CHECK("plan_zero_transient_profile_allocates", p != NULL)) return;
#if DT_ZERO_RS_IN_FLIGHT == 2
    hand_profile(p, 2, &m);
    /* dense, 4 blocks: stage 0 all buckets' slots at once (1.125 x 4 psi (N - 1) / N); stage 1 the
       largest unit's reduce-scatter and slot at the step; stage 2 at block 0's grad_ready unit 0's
       full grads 4 n0, the block's 4 b with its reduce-scatter, the block's before it still in
       flight, or at unit 0's its grads and reduce-scatter beside block 0's; the pool two blocks'
       slots or a block's and unit 0's; stage 3 also the stale prefetch of block 0, the gathered
       block and the prefetch of the next (3 x 4 b), or unit 0's values at the end */
    for (z = 0; z <= 3; z++) {
        double big = n0 > b ? n0 : b, pool = 2.25 * b + 2.25 * (n0 > b ? n0 : b);
        char name[80];
        memset(&l, 0, sizeof l);
        l.zero = z;
        if (z == 0) want = 1.125 * 4 * (4 * b + n0) / 2;
        else if (z == 1) want = 6 * big + 2.25 * big;
        else if (z == 2) want = fmax(4 * n0 + 4 * b + 12 * b, 4 * n0 + 6 * n0 + 6 * b) + pool;
        else want = fmax(12 * b + 4 * n0 + 4 * b + 12 * b, 4 * n0 + 4 * n0 + 6 * n0 + 6 * b) + pool;
        snprintf(name, sizeof name, "plan_zero%d_transient_by_hand", z);
        if (DT_TEST_CHECK(name, dt_plan_predict(&g_ctx, p, &l, &pr) == DT_OK))
            dt_test_close(name, pr.mem_transient, want, 1e-12);
    }
    /* dp 1 (tp 2): dt_zero still packs and reduce-scatters each unit over its group of one (g = n,
       4 n x 2 bytes, a 1-byte scratch slot): at block 1's grad_ready unit 0's grads, the block's
       full grads and its pair, block 2's pair still in flight (4 n0 + 20 b), or at unit 0's
       (12 n0 + 8 b); two slots of 1 byte */
    {
        double b2 = block_params(C, 2), u2 = 128 * C + 32 * C + 2 * C;
        memset(&l, 0, sizeof l);
        l.tp = 2; l.zero = 2;
        want = fmax(4 * u2 + 20 * b2, 12 * u2 + 8 * b2) + 2;
        if (DT_TEST_CHECK("plan_zero2_dp1_transient_by_hand", dt_plan_predict(&g_ctx, p, &l, &pr) == DT_OK))
            dt_test_close("plan_zero2_dp1_transient_by_hand", pr.mem_transient, want, 1e-12);
    }
    /* a MoE model of two MoE blocks (4 experts at ep 1: every rank holds all, synced over edp = 2
       in units of their own). Stage 2's backward, block 1 then 0, each the experts' unit x first:
         block 1: 4 n0 + 4 x + 4 bx + 6 x            (x's reduce-scatter posted)
                  4 n0 + 4 bx + 6 x + 6 bx           (bx's beside it)
         block 0: 4 n0 + 6 x + 6 bx + 4 x + 4 bx     (both full grads taken: the peak of the blocks)
                  ... x's finished before the next one (at most 2 in flight)
         unit 0:  4 n0 + 6 bx + 6 n0                 (x0 finished, b0's still in flight)
       pools: the dp x cp one two slots (a block's and unit 0's), the edp one an expert unit's */
    m = moe_model();
    m.layers = 2; m.moe_every = 1;
    moe_profile(p, &m);
    x = 4 * (2 * C * 256 + 256 + C);
    bx = b + 4 * C - (256 * (C + 1) + 256 * C + C);
    memset(&l, 0, sizeof l);
    l.zero = 2;
    want = fmax(4 * n0 + 10 * x + 10 * bx, 10 * n0 + 6 * bx) + 2.25 * (bx + n0 + x);
    if (DT_TEST_CHECK("plan_moe_zero2_transient_by_hand", dt_plan_predict(&g_ctx, p, &l, &pr) == DT_OK))
        dt_test_close("plan_moe_zero2_transient_by_hand", pr.mem_transient, want, 1e-12);
    /* at ep 2 each rank holds x2 = x / 2 (2 experts) and is their only holder (edp 1): an expert
       unit's reduce-scatter holds 4 x2 (1 + 1) and no scratch (a slot of 1 byte). The peak is at
       block 0 again, 4 n0 + 8 x2 + 6 bx + 4 x2 + 4 bx, or at unit 0 as before */
    l.ep = 2;
    want = fmax(4 * n0 + 12 * x / 2 + 10 * bx, 10 * n0 + 6 * bx) + 2.25 * (bx + n0) + 1;
    if (DT_TEST_CHECK("plan_moe_zero2_ep2_transient_by_hand", dt_plan_predict(&g_ctx, p, &l, &pr) == DT_OK))
        dt_test_close("plan_moe_zero2_ep2_transient_by_hand", pr.mem_transient, want, 1e-12);
#endif
    free(p);
}

static void moe(void) {
    dt_plan_model m = moe_model(), dm = model();
    dt_plan_profile *p = (dt_plan_profile *)malloc(sizeof *p), *q = (dt_plan_profile *)malloc(sizeof *q);
    dt_plan_layout l;
    dt_plan_prediction e1, e2, dense, top[256];
    dt_status st;
    char path[512];
    static char text[1 << 17], text2[1 << 17];
    double C = 64, F = 256, E = 4, r = 256 / 1000.0, psi, px1, px2, dmoe, mlp;
    int i, n = 0, total = 0, found = 0;
    if (!DT_TEST_CHECK("plan_moe_profiles_allocate", p && q)) { free(p); free(q); return; }
    moe_profile(p, &m);
    memset(&l, 0, sizeof l);
    st = dt_plan_predict(&g_ctx, p, &l, &e1);
    l.ep = 2;
    if (!DT_TEST_CHECK("plan_moe_predicts", st == DT_OK && dt_plan_predict(&g_ctx, p, &l, &e2) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        free(p); free(q);
        return;
    }
    /* dp 2: 8 sequences of 32 rows a rank, 256 rows; 4 blocks, two of them MoE (their MLP's time
       replaced by the layer's), the embedding and the head */
    dt_test_close("plan_moe_blocks_use_the_layers_times_by_hand", e1.compute_s,
                  4 * 3e-3 * r + 2 * ((3e-3 - 0.4e-3) + (5e-3 - 0.8e-3)) * r + (0.01e-3 + 0.02e-3 + 0.2e-3 + 0.4e-3) * r, 1e-9);
    dt_test_close("plan_moe_ep2_uses_its_own_times_by_hand", e2.compute_s,
                  4 * 3e-3 * r + 2 * ((2e-3 - 0.4e-3) + (4e-3 - 0.8e-3)) * r + (0.01e-3 + 0.02e-3 + 0.2e-3 + 0.4e-3) * r, 1e-9);
    /* the trained router's loads (model.expert_load: per ep dividing E = 4, that is 1, 2 and 4, the
       busiest ep rank's rows over its uniform share). Block 1 [.875 .9 1.2], block 3 [.8 1.25 1.5]:
       a block's experts take k = 2 dense MLPs' time at 1, so each gains (w - 1) 2 (0.4 + 0.8) ms
       per 1000 rows: ep 1 (-.125 - .2), ep 2 (-.1 + .25) */
    {
        static const double per_block[6] = {.875, .9, 1.2, .8, 1.25, 1.5}, alike[3] = {.8, 1.25, 1.5};
        static const double too_big[3] = {1, 2.5, 1}, nan_load[3] = {1, 1, NAN};
        dt_plan_prediction w1, w2;
        double mlp_s = 2 * (0.4e-3 + 0.8e-3) * r;
        p->model.expert_load = per_block;
        p->model.n_expert_load = 6;
        memset(&l, 0, sizeof l);
        st = dt_plan_predict(&g_ctx, p, &l, &w1);
        l.ep = 2;
        if (DT_TEST_CHECK("plan_moe_loads_predict", st == DT_OK && dt_plan_predict(&g_ctx, p, &l, &w2) == DT_OK)) {
            dt_test_close("plan_moe_loads_drop_rows_at_ep1_by_hand", w1.compute_s - e1.compute_s, (-0.125 - 0.2) * mlp_s,
                          1e-9);
            dt_test_close("plan_moe_loads_wait_for_the_busiest_ep_rank_by_hand", w2.compute_s - e2.compute_s,
                          (-0.1 + 0.25) * mlp_s, 1e-9);
        } else
            printf("  %s\n", dt_ctx_error(&g_ctx));
        p->model.expert_load = alike; /* every MoE block alike */
        p->model.n_expert_load = 3;
        if (DT_TEST_CHECK("plan_moe_loads_of_every_block_predict", dt_plan_predict(&g_ctx, p, &l, &w2) == DT_OK))
            dt_test_close("plan_moe_loads_of_every_block_by_hand", w2.compute_s - e2.compute_s, 2 * 0.25 * mlp_s, 1e-9);
        p->model.n_expert_load = 4;
        st = dt_plan_predict(&g_ctx, p, &l, &w2);
        dt_test_error("plan_moe_loads_bad_count_is_named", st, dt_ctx_error(&g_ctx), "n_expert_load = 4");
        p->model.expert_load = too_big; /* an expert takes a token once: at most E / k = 2 */
        p->model.n_expert_load = 3;
        st = dt_plan_predict(&g_ctx, p, &l, &w2);
        dt_test_error("plan_moe_loads_above_e_over_k_is_named", st, dt_ctx_error(&g_ctx), "expert_load[1] = 2.5");
        p->model.expert_load = nan_load;
        st = dt_plan_predict(&g_ctx, p, &l, &w2);
        dt_test_error("plan_moe_loads_nan_is_named", st, dt_ctx_error(&g_ctx), "expert_load[2] = nan");
        p->model.expert_load = NULL;
        st = dt_plan_predict(&g_ctx, p, &l, &w2);
        dt_test_error("plan_moe_loads_count_without_values_is_named", st, dt_ctx_error(&g_ctx), "expert_load = (nil)");
        p->model.n_expert_load = 0;
    }
    /* parameters: each MoE block loses its dense MLP and gains the router E C, and E / ep experts
       of 2 C F + F + C */
    mlp = F * (C + 1) + F * C + C;
    dmoe = E * C - mlp;
    px1 = 2 * E * (2 * C * F + F + C);
    px2 = px1 / 2;
    psi = 4 * block_params(C, 1) + 256 * C + 32 * C + 2 * C + 2 * dmoe;
    dt_test_close("plan_moe_params_by_hand", e1.mem_params, 4 * (psi + px1), 1e-9);
    dt_test_close("plan_moe_ep2_holds_half_the_experts", e2.mem_params, 4 * (psi + px2), 1e-9);
    /* DDP with expert units: two bucketers, each with its own flat grads, beside the arena's */
    dt_test_close("plan_moe_ddp_grads_twice_by_hand", e1.mem_grads, 8 * (psi + px1), 1e-9);
    /* the sync: dense grads over dp x cp = 2, the experts' over edp = 2 at ep 1 and 1 (none) at ep 2 */
    dt_test_close("plan_moe_sync_by_hand", e1.comm_s, coll(4 * psi) + coll(4 * px1), 1e-9);
    dt_test_close("plan_moe_ep2_experts_need_no_sync", e2.comm_s, coll(4 * psi), 1e-9);
    /* the optimizer, the loss and norm, and each MoE layer's routing counts at the step's end */
    /* (the counts: 3E + 3 doubles, dt_moe's per-expert assignments, probabilities and kept rows,
       the dropped, their fingerprint and the tokens) */
    dt_test_close("plan_moe_step_end_by_hand", e1.optimizer_s, 2e-9 * (psi + px1) + 2 * coll(8) + 2 * coll((3 * E + 3) * 8),
                  1e-9);
    /* activations: the dense model's, a set's three [N, C] MoE tensors (moeout [Nl, C]), each MoE
       block's routed rows and its layer's buffers */
    moe_profile(q, &dm);
    memset(&l, 0, sizeof l);
    st = dt_plan_predict(&g_ctx, q, &l, &dense);
    if (DT_TEST_CHECK("plan_moe_dense_predicts", st == DT_OK))
        dt_test_close("plan_moe_activations_by_hand", e1.mem_activations - dense.mem_activations,
                      4 * 3 * 256 * C + 2 * 1000 * 256 + 2 * 500 * 256, 1e-9);
    /* the search tries ep */
    st = dt_plan_search(&g_ctx, p, NULL, top, 256, &n, &total);
    for (i = 0; st == DT_OK && i < n; i++) found |= top[i].layout.ep == 2;
    DT_TEST_CHECK("plan_search_tries_ep", st == DT_OK && found && top[0].layout.ep == 2);
    /* what examples/gpt refuses, and what the planner does not model */
    memset(&l, 0, sizeof l);
    l.ep = 2;
    st = dt_plan_layout_check(&g_ctx, &dm, 2, &l, NULL);
    dt_test_error("plan_ep_with_a_dense_model_is_named", st, dt_ctx_error(&g_ctx), "ep 2 with a dense model");
    l.ep = 4;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_ep_not_dividing_is_named", st, dt_ctx_error(&g_ctx), "ep 4 must divide dp x cp = 2 x 1");
    memset(&l, 0, sizeof l);
    l.cp = 2;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_moe_capacity_with_cp_is_named", st, dt_ctx_error(&g_ctx), "capacity is counted per sequence");
    memset(&l, 0, sizeof l);
    l.recompute = DT_PLAN_RECOMPUTE_FULL;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_moe_recompute_is_named", st, dt_ctx_error(&g_ctx), "would route its tokens again");
    memset(&l, 0, sizeof l);
    l.pp = 2; l.schedule = DT_PP_ZB_H1; l.micro = 2;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_moe_zb_is_named", st, dt_ctx_error(&g_ctx), "zb-h1");
    m.balance = DT_MOE_AUX;
    l.schedule = DT_PP_1F1B;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_moe_aux_with_1f1b_is_named", st, dt_ctx_error(&g_ctx), "balance aux with 1f1b");
    l.schedule = DT_PP_DEFAULT;
    DT_TEST_CHECK("plan_moe_aux_runs_gpipe", dt_plan_layout_check(&g_ctx, &m, 2, &l, &l) == DT_OK &&
                  l.schedule == DT_PP_GPIPE);
    memset(&l, 0, sizeof l);
    l.micro = 2;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_moe_aux_with_micro_is_named", st, dt_ctx_error(&g_ctx), "balance aux with micro 2 at pp 1");
    m = moe_model();
    m.top_k = 5;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_moe_topk_out_of_range_is_named", st, dt_ctx_error(&g_ctx), "model->top_k = 5");
    m = moe_model();
    m.capacity = NAN;
    st = dt_plan_layout_check(&g_ctx, &m, 2, &l, NULL);
    dt_test_error("plan_moe_capacity_nan_is_named", st, dt_ctx_error(&g_ctx), "model->capacity = nan");
    m = moe_model();
    {   /* on paper: refused by name */
        dt_plan_machine mc = hand_machine();
        st = dt_plan_profile_paper(&g_ctx, &mc, &m, 8, q);
        dt_test_error("plan_moe_on_paper_is_named", st, dt_ctx_error(&g_ctx), "from a measured profile only");
    }
    /* the file: round trip, older files dense, a MoE model without its layer named */
    snprintf(path, sizeof path, "%s/moe.json", dt_test_tmpdir());
    st = dt_plan_profile_save(&g_ctx, p, path);
    if (!st) st = dt_plan_profile_load(&g_ctx, q, path);
    if (DT_TEST_CHECK("plan_moe_profile_loads_what_it_saved", st == DT_OK))
        DT_TEST_CHECK("plan_moe_profile_round_trips", !memcmp(&p->model, &q->model, sizeof p->model) &&
                      q->n_moes == 2 && q->moes[1].ep == 2 && q->moes[1].rows[1] == 512 &&
                      fabs(q->moes[1].layer[1] - 256000.0) < 1e-6 && fabs(q->moes[0].bwd[0] - p->moes[0].bwd[0]) < 1e-18);
    else
        printf("  %s\n", dt_ctx_error(&g_ctx));
    read_file(path, text, sizeof text);
    swap_text(text2, sizeof text2, text, "\"moes\": [", "\"no_moes\": [");
    write_file(path, text2);
    st = dt_plan_profile_load(&g_ctx, q, path);
    dt_test_error("plan_moe_profile_without_its_layer_is_named", st, dt_ctx_error(&g_ctx), "but no moes");
    swap_text(text2, sizeof text2, text, "\"ep\": 2", "\"ep\": 0");
    write_file(path, text2);
    st = dt_plan_profile_load(&g_ctx, q, path);
    dt_test_error("plan_moe_profile_bad_ep_is_named", st, dt_ctx_error(&g_ctx), "moes[1].ep");
    swap_text(text2, sizeof text2, text, "\"balance\": \"bias\"", "\"balance\": \"most\"");
    write_file(path, text2);
    st = dt_plan_profile_load(&g_ctx, q, path);
    dt_test_error("plan_moe_profile_bad_balance_is_named", st, dt_ctx_error(&g_ctx), "model.balance");
    free(p);
    free(q);
}


/* ---- the pipeline's message delay per schedule: each takes its own pipe, else 1F1B's ---- */

static void pipe_set(dt_plan_profile *p, int n, const dt_pp_kind *kinds, const double *delays) {
    int i;
    p->n_pipes = n;
    for (i = 0; i < n; i++) {
        p->pipes[i].pp = 2; p->pipes[i].kind = kinds[i];
        p->pipes[i].bytes[0] = p->pipes[i].bytes[1] = 1000;
        p->pipes[i].delay[0] = p->pipes[i].delay[1] = delays[i];
    }
}

static void pipe_kinds(void) {
    dt_plan_model m = model();
    dt_plan_profile *p = (dt_plan_profile *)malloc(sizeof *p), *q = (dt_plan_profile *)malloc(sizeof *q);
    dt_plan_layout l;
    dt_plan_prediction a, b, c;
    static const dt_pp_kind both[2] = {DT_PP_1F1B, DT_PP_GPIPE}, one[1] = {DT_PP_1F1B};
    static const double two_d[2] = {1e-3, 5e-3}, d5[1] = {5e-3}, d1[1] = {1e-3};
    char path[512];
    static char text[1 << 16], text2[1 << 16];
    dt_status st;
    if (!DT_TEST_CHECK("plan_pipe_kinds_allocate", p && q)) { free(p); free(q); return; }
    hand_profile(p, 2, &m);
    *q = *p;
    pipe_set(p, 2, both, two_d);
    memset(&l, 0, sizeof l);
    l.pp = 2; l.micro = 4; l.schedule = DT_PP_GPIPE;
    st = dt_plan_predict(&g_ctx, p, &l, &a);
    pipe_set(q, 1, one, d5);
    if (!st) st = dt_plan_predict(&g_ctx, q, &l, &b);
    pipe_set(q, 1, one, d1);
    if (!st) st = dt_plan_predict(&g_ctx, q, &l, &c);
    if (DT_TEST_CHECK("plan_pipe_kinds_predict", st == DT_OK)) {
        dt_test_close("plan_gpipe_takes_its_own_delay", a.step_s, b.step_s, 1e-12);
        DT_TEST_CHECK("plan_gpipe_delay_matters", fabs(a.step_s - c.step_s) > 1e-6);
    } else
        printf("  %s\n", dt_ctx_error(&g_ctx));
    l.schedule = DT_PP_ZB_H1; /* no pipe of its own: 1F1B's */
    st = dt_plan_predict(&g_ctx, p, &l, &a);
    if (!st) st = dt_plan_predict(&g_ctx, q, &l, &b);
    if (DT_TEST_CHECK("plan_zb_predicts", st == DT_OK)) dt_test_close("plan_zb_without_its_pipe_takes_1f1bs", a.step_s, b.step_s, 1e-12);
    snprintf(path, sizeof path, "%s/pipes.json", dt_test_tmpdir());
    st = dt_plan_profile_save(&g_ctx, p, path);
    if (!st) st = dt_plan_profile_load(&g_ctx, q, path);
    DT_TEST_CHECK("plan_pipe_kind_round_trips", st == DT_OK && q->n_pipes == 2 && q->pipes[1].kind == DT_PP_GPIPE &&
                  q->pipes[0].kind == DT_PP_1F1B && fabs(q->pipes[1].delay[0] - 5e-3) < 1e-15);
    read_file(path, text, sizeof text);
    swap_text(text2, sizeof text2, text, "\"kind\": \"gpipe\"", "\"kind\": \"fast\"");
    write_file(path, text2);
    st = dt_plan_profile_load(&g_ctx, q, path);
    dt_test_error("plan_pipe_bad_kind_is_named", st, dt_ctx_error(&g_ctx), "pipes[1].kind");
    swap_text(text2, sizeof text2, text, "\"kind\": \"gpipe\", ", "");
    write_file(path, text2);
    st = dt_plan_profile_load(&g_ctx, q, path);
    DT_TEST_CHECK("plan_pipe_without_kind_is_1f1bs", st == DT_OK && q->pipes[1].kind == DT_PP_1F1B);
    free(p);
    free(q);
}

/* dt_pp_run's message buffers at pp 2, m 4, counted by hand from the schedules' lists (sends held
   until the stage next waits for a receive, receives until their micro-batch's last backward):
   GPipe's stage 0 posts RG0 RG1, then F0..F3 send without a wait in between: 2 + 4 = 6. 1F1B's
   stage 0: RG0 RG1 F0 SA0 F1 (4 held: 2 receives, SA0, F1's output), then B0 waits and frees the
   sends; stage 1: RA0 RA1 F0 RA2 B0 (3 receives and B0's gradient: 4). ZB-H1's stage 1: RA0 RA1
   F0 RA2 BI0 (4), SG0, F1 waits (3), RA3 (4), BI1 (5). */
static void pipe_buffers(void) {
    dt_plan_model m = model();
    dt_plan_profile *p = (dt_plan_profile *)malloc(sizeof *p);
    static const dt_pp_kind kinds[3] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_ZB_H1};
    static const int want[3] = {6, 4, 5};
    static const double d[3] = {1e-3, 1e-3, 1e-3};
    dt_plan_layout l;
    dt_plan_prediction a, g;
    int k;
    if (!DT_TEST_CHECK("plan_pp_buffers_allocate", p != NULL)) return;
    hand_profile(p, 2, &m);
    pipe_set(p, 3, kinds, d);
    for (k = 0; k < 3; k++) {
        char name[96];
        memset(&l, 0, sizeof l);
        l.pp = 2; l.micro = 4; l.schedule = kinds[k];
        snprintf(name, sizeof name, "plan_pp_buffers_%s_pp2_m4_is_%d", dt_pp_kind_name(kinds[k]), want[k]);
        if (dt_plan_predict(&g_ctx, p, &l, &a)) {
            DT_TEST_CHECK(name, 0);
            printf("  %s\n", dt_ctx_error(&g_ctx));
            continue;
        }
        if (!DT_TEST_CHECK(name, a.pp_buffers == want[k])) printf("  got %d\n", a.pp_buffers);
    }
    /* the buffers are in the memory, each one micro-batch's [rows, C] of f32: GPipe's stage 0
       holds all 4 micro-batches' sets and 6 buffers, which give a set's bytes; 1F1B's holds 2 sets
       and 4 buffers */
    memset(&l, 0, sizeof l);
    l.pp = 2; l.micro = 4; l.schedule = DT_PP_GPIPE;
    if (!dt_plan_predict(&g_ctx, p, &l, &g)) {
        double msg = (double)(m.batch / 4) * m.seq * m.width * 4, set = (g.mem_activations - 6 * msg) / 4;
        l.schedule = DT_PP_1F1B;
        if (!DT_TEST_CHECK("plan_pp_buffers_sets_in_flight", g.in_flight == 4 && g.pp_buffers == 6 &&
                                                              !dt_plan_predict(&g_ctx, p, &l, &a) && a.in_flight == 2))
            printf("  gpipe: %d sets, %d buffers; 1f1b: %d sets\n", g.in_flight, g.pp_buffers, a.in_flight);
        else dt_test_close("plan_pp_buffers_in_memory", a.mem_activations, 2 * set + 4 * msg, 1e-9 * a.mem_activations);
    }
    free(p);
}

int main(void) {
    dt_ctx_init(&g_ctx, NULL);
    pure_dp_step();
    zero_copies();
    pipeline_stage_times();
    zero_memory();
    activations();
    search();
    bad_layouts();
    simulator_stage_costs();
    files();
    paper();
    cross_hosts();
    dlrm_plans();
    dlrm_files();
    ulysses();
    offload();
    zero_transient();
    moe();
    pipe_kinds();
    pipe_buffers();
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
}
