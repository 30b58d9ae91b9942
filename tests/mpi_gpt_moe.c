// mpi-driver
/* tests/mpi_gpt_moe.c - mixture of experts in examples/gpt: the tiny GPT of tests/mpi_gpt.c
   (2 layers, width 32, 4 heads, context 16, batch 8, fp32, seed 3, 5 steps) with both MLPs made 8
   experts, top-2, under expert parallelism, against the np-1 run of the same model: every step's
   loss and the step-1 grad norm within tests/gpt_driver.h's derived fp32 bounds, the final loss
   within 1e-5 relative, every weight of the final checkpoint (the experts reassembled by index)
   within Adam's per-element bound, and every step's aux loss within 1e-6 relative, tokens dropped
   and their fingerprint (which (token, choice) pairs) equal. Models: capacity 1.25 and dropless,
   each with the aux loss and with DeepSeek-V3's bias, Switch's and renormalised gates, a shared
   expert. Layouts: ep 2 and ep 4 alone, ep 2 x tp 2 (also with sequence parallel), ep 2 x dp 2
   with ZeRO 1, 2 and 3 (edp 2: the experts' grads averaged over their replicas), ep 2 x pp 2
   (GPipe, the default for the aux loss; 1F1B for the bias), 2 micro-batches (bias), and dropless
   at cp 2 (a sequence's tokens on two ranks: the aux loss's f and the bias's load are sums over
   dp x cp) with ep 2 and 4, tp 2, ZeRO 3 and pp 2. A checkpoint saved at ep 4 resumes at ep 2
   and ep 1 (experts resharded by index; the bias rides in the train state) to the straight run's
   loss and weights. Bad flags exit 1 naming the problem.

   Run directly (not under mpirun): it starts $DT_MPIRUN -np N build/examples/gpt itself. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define BATCH 8
#define E 8
static const char *TINY = "--seed 3 --quiet --layers 2 --width 32 --heads 4 --seq 16 --batch 8 --moe-experts 8";

#include "gpt_driver.h"

static gpt_shape SHAPE = {2, 32, 256, 16, 0};

/* The whole parameters of the MoE model: the dense ones less each block's MLP (unless shared),
   the router [E, C] and the experts fc [E, 4C, C], fc.b [E, 4C], proj [E, C, 4C], proj.b [E, C]. */
static void moe_whole(dt_params *ps, int shared, int every) {
    static const char *names[16] = {"ln1.w", "ln1.b", "attn.q.w", "attn.k.w", "attn.v.w", "attn.q.b", "attn.k.b",
                                    "attn.v.b", "attn.proj.w", "attn.proj.b", "ln2.w", "ln2.b", "mlp.fc.w",
                                    "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"};
    const int64_t w = SHAPE.width;
    const int64_t shapes[16][2] = {{w, 0}, {w, 0}, {w, w}, {w, w}, {w, w}, {w, 0}, {w, 0}, {w, 0}, {w, w},
                                   {w, 0}, {w, 0}, {w, 0}, {4 * w, w}, {4 * w, 0}, {w, 4 * w}, {w, 0}};
    char name[64];
    int l, k;
    dt_param_desc d;
    memset(ps, 0, sizeof *ps);
#define ADD(n_, a_, b_, c_) do { memset(&d, 0, sizeof d); d.name = (n_); d.shape[0] = (a_); d.shape[1] = (b_); \
                                 d.shape[2] = (c_); \
                                 if (dt_params_add(&g_ctx, ps, NULL, &d)) { fprintf(stderr, "%s\n", dt_ctx_error(&g_ctx)); exit(1); } } while (0)
    ADD("wte", SHAPE.vp, w, 0);
    ADD("wpe", SHAPE.tctx, w, 0);
    ADD("ln_f.w", w, 0, 0);
    ADD("ln_f.b", w, 0, 0);
    for (l = 0; l < SHAPE.layers; l++) {
        int moe = l % every == every - 1;
        for (k = 0; k < (shared || !moe ? 16 : 12); k++) {
            snprintf(name, sizeof name, "h.%d.%s", l, names[k]);
            ADD(name, shapes[k][0], shapes[k][1], 0);
        }
        if (!moe) continue;
        snprintf(name, sizeof name, "h.%d.moe.router.w", l); ADD(name, E, w, 0);
        snprintf(name, sizeof name, "h.%d.moe.fc.w", l); ADD(name, E, 4 * w, w);
        snprintf(name, sizeof name, "h.%d.moe.fc.b", l); ADD(name, E, 4 * w, 0);
        snprintf(name, sizeof name, "h.%d.moe.proj.w", l); ADD(name, E, w, 4 * w);
        snprintf(name, sizeof name, "h.%d.moe.proj.b", l); ADD(name, E, w, 0);
    }
#undef ADD
}

static int load_moe(dt_params *ps, const char *dir, int shared, int every) {
    dt_checkpoint_desc cd = {0};
    moe_whole(ps, shared, every);
    cd.dir = dir;
    if (dt_checkpoint_load(&g_ctx, ps, NULL, NULL, &cd)) {
        printf("  cannot load %s: %s\n", dir, dt_ctx_error(&g_ctx));
        dt_params_free(&g_ctx, ps);
        return 0;
    }
    return 1;
}

typedef struct refrun {
    double loss, wbound;
    dt_params w;
    char log[512], model[128];
    int ok, shared, every;
} refrun;
static refrun refs[6], *REF;

static void tag_of(char *tag, size_t n, const char *flags) {
    size_t i, k = 0;
    for (i = 0; flags[i] && k + 1 < n; i++)
        if (flags[i] != '-') tag[k++] = flags[i] == ' ' ? '_' : flags[i] == '.' ? 'p' : flags[i];
    tag[k] = 0;
    if (k && tag[0] == '_') memmove(tag, tag + 1, k);
}

/* The np-1 run of a model (its flags after TINY). */
static int use_ref(int i, const char *model) {
    refrun *r = &refs[i];
    if (!r->ok) {
        char out[512], dir[512], flags[2048], name[256], tag[128];
        tag_of(tag, sizeof tag, model);
        snprintf(r->model, sizeof r->model, "%s", model);
        r->shared = strstr(model, "--moe-shared 1") != NULL;
        r->every = strstr(model, "--moe-every ") ? atoi(strstr(model, "--moe-every ") + 12) : 1;
        snprintf(out, sizeof out, "%s/np1_%s.out", dt_test_tmpdir(), tag);
        snprintf(dir, sizeof dir, "%s/ckpt_np1_%s", dt_test_tmpdir(), tag);
        snprintf(r->log, sizeof r->log, "%s/np1_%s.jsonl", dt_test_tmpdir(), tag);
        snprintf(flags, sizeof flags, "%s --steps 5 %s --ckpt %s --log %s", TINY, model, dir, r->log);
        snprintf(name, sizeof name, "gpt_moe_np1_%s_reference_runs", tag);
        if (!dt_test_expect(name, run(1, flags, out) == 0, "output in %s", out)) return 0;
        r->loss = final_loss(out, NULL, 0);
        r->wbound = weight_bound_of(r->log);
        snprintf(name, sizeof name, "gpt_moe_np1_%s_checkpoint_loads", tag);
        if (!dt_test_expect(name, load_moe(&r->w, dir, r->shared, r->every), "checkpoint %s does not load", dir)) return 0;
        printf("  np 1 %s final loss %.9g\n", model, r->loss);
        r->ok = 1;
    }
    REF = r;
    return 1;
}

/* The routing columns of a run's log against the reference's, every step: aux within 1e-6
   relative, dropped and the fingerprint of which were dropped equal. */
static void compare_routing(const char *prefix, const char *log) {
    double a[GD_MAX_STEPS], b[GD_MAX_STEPS], c[GD_MAX_STEPS], d[GD_MAX_STEPS];
    int na = log_values(log, "moe_aux", a, GD_MAX_STEPS), nb = log_values(REF->log, "moe_aux", b, GD_MAX_STEPS), t;
    char name[320];
    snprintf(name, sizeof name, "%s_aux_loss_per_step_equals_np1", prefix);
    for (t = 0; t < na && t < nb; t++)
        if (!(fabs(a[t] - b[t]) <= 1e-6 * fabs(b[t]))) break;
    dt_test_expect(name, na == nb && na > 0 && t == na, "%d / %d steps logged; step %d: aux %.12g, np 1 %.12g", na, nb,
                   t + 1, t < na ? a[t] : 0, t < nb ? b[t] : 0);
    na = log_values(log, "moe_dropped", a, GD_MAX_STEPS);
    nb = log_values(REF->log, "moe_dropped", b, GD_MAX_STEPS);
    log_values(log, "moe_drop_print", c, GD_MAX_STEPS);
    log_values(REF->log, "moe_drop_print", d, GD_MAX_STEPS);
    for (t = 0; t < na && t < nb; t++)
        if (a[t] != b[t] || c[t] != d[t]) break;
    snprintf(name, sizeof name, "%s_same_tokens_dropped_per_step_as_np1", prefix);
    dt_test_expect(name, na == nb && na > 0 && t == na, "step %d: dropped %.0f (print %.0f), np 1 %.0f (%.0f)", t + 1,
                   t < na ? a[t] : 0, t < na ? c[t] : 0, t < nb ? b[t] : 0, t < nb ? d[t] : 0);
}

/* One run at np ranks with flags: per-step losses, routing and final weights against np 1's. */
static void equal_to_np1(int np, const char *extra) {
    char name[256], flags[2048], out[512], dir[512], tag[200], log[512];
    const char *tmp = dt_test_tmpdir(), *which;
    double worst, diff;
    dt_params w;
    char both[512];
    snprintf(both, sizeof both, "%s %s", REF->model, extra);
    tag_of(tag, sizeof tag, both);
    snprintf(out, sizeof out, "%s/%s.out", tmp, tag);
    snprintf(dir, sizeof dir, "%s/ckpt_%s", tmp, tag);
    snprintf(log, sizeof log, "%s/%s.jsonl", tmp, tag);
    snprintf(flags, sizeof flags, "%s --steps 5 %s --ckpt %s --log %s", TINY, both, dir, log);
    snprintf(name, sizeof name, "gpt_moe_%s_runs", tag);
    if (!dt_test_expect(name, run(np, flags, out) == 0, "np %d: gpt %s failed (output in %s)", np, flags, out)) return;
    snprintf(name, sizeof name, "gpt_moe_%s", tag);
    compare_logs(name, log, REF->log, SHAPE, BATCH);
    compare_routing(name, log);
    snprintf(name, sizeof name, "gpt_moe_%s_final_loss_within_1e-5_of_np1", tag);
    dt_test_expect(name, fabs(final_loss(out, NULL, 0) - REF->loss) <= 1e-5 * fabs(REF->loss), "final loss %.9g, np 1 %.9g",
                   final_loss(out, NULL, 0), REF->loss);
    snprintf(name, sizeof name, "gpt_moe_%s_checkpoint_loads", tag);
    if (!dt_test_expect(name, load_moe(&w, dir, REF->shared, REF->every), "checkpoint %s does not load", dir)) return;
    snprintf(name, sizeof name, "gpt_moe_%s_weights_equal_np1", tag);
    worst = weights_worst(&w, &REF->w, REF->wbound, &which, &diff);
    dt_test_expect(name, worst <= 1, "an element of %s differs from np 1's by %.3g (> Adam's bound %.3g)", which, diff,
                   REF->wbound);
    dt_params_free(&g_ctx, &w);
}

/* Saved after 3 steps at (np_a, flags_a), resumed to 5 at (np_b, flags_b): the straight np-1
   run's loss and weights. */
static void reshard(int np_a, const char *flags_a, int np_b, const char *flags_b) {
    char name[640], flags[2048], out[512], dir[512], ta[200], tb[100], both[512];
    const char *tmp = dt_test_tmpdir(), *which;
    double got, diff, worst;
    dt_params w;
    snprintf(both, sizeof both, "%s %s", REF->model, flags_a);
    tag_of(ta, sizeof ta, both);
    tag_of(tb, sizeof tb, flags_b);
    snprintf(dir, sizeof dir, "%s/reshard_%s_to_%s", tmp, ta, tb);
    snprintf(out, sizeof out, "%s/reshard_%s_first.out", tmp, ta);
    snprintf(flags, sizeof flags, "%s --steps 5 --stop-at 3 %s --ckpt %s", TINY, both, dir);
    snprintf(name, sizeof name, "gpt_moe_saved_%s_stops_at_3", ta);
    if (!dt_test_expect(name, run(np_a, flags, out) == 0, "output in %s", out)) return;
    snprintf(out, sizeof out, "%s/reshard_%s_to_%s.out", tmp, ta, tb);
    snprintf(flags, sizeof flags, "%s --steps 5 --resume %s %s --ckpt %s", TINY, REF->model, flags_b, dir);
    snprintf(name, sizeof name, "gpt_moe_saved_%s_resumed_%s_runs", ta, tb);
    if (!dt_test_expect(name, run(np_b, flags, out) == 0, "output in %s", out)) return;
    got = final_loss(out, NULL, 0);
    snprintf(name, sizeof name, "gpt_moe_saved_%s_resumed_%s_loss_equals_np1", ta, tb);
    dt_test_expect(name, fabs(got - REF->loss) <= loss_bound(SHAPE, BATCH, 5) * fabs(REF->loss),
                   "final loss %.9g, np 1 straight %.9g (bound %.3g relative)", got, REF->loss, loss_bound(SHAPE, BATCH, 5));
    snprintf(name, sizeof name, "gpt_moe_saved_%s_resumed_%s_checkpoint_loads", ta, tb);
    if (!dt_test_expect(name, load_moe(&w, dir, REF->shared, REF->every), "checkpoint %s does not load", dir)) return;
    snprintf(name, sizeof name, "gpt_moe_saved_%s_resumed_%s_weights_equal_np1", ta, tb);
    worst = weights_worst(&w, &REF->w, REF->wbound, &which, &diff);
    dt_test_expect(name, worst <= 1, "an element of %s differs from np 1's by %.3g (> Adam's bound %.3g)", which, diff,
                   REF->wbound);
    dt_params_free(&g_ctx, &w);
}

static void named_error(const char *name, int np, const char *flags, const char *needle) {
    gd_named_error(name, np, TINY, flags, needle);
}

/* The end of a run prints each block's expert load, one line per expert, shares summing to 1. */
static void histogram(void) {
    char out[512], flags[1024], line[4096];
    FILE *fp;
    double sum = 0, kept[2 * E], load[2 * E], want[2 * 4] = {0}, worst = 0;
    int lines = 0, n_load = 0, i, b, d, r, e;
    snprintf(out, sizeof out, "%s/moe_hist.out", dt_test_tmpdir());
    /* one step: the histogram's kept rows (over the run) are the step's, which --moe-load's figures
       come from too (the run's later half) */
    snprintf(flags, sizeof flags, "--seed 3 --layers 2 --width 32 --heads 4 --seq 16 --batch 8 --steps 1 "
             "--moe-experts 8 --ep 2");
    if (!dt_test_expect("gpt_moe_histogram_run", run(2, flags, out) == 0, "output in %s", out)) return;
    if ((fp = fopen(out, "r"))) {
        while (fgets(line, sizeof line, fp)) {
            const char *at = strstr(line, "  block "), *k = strstr(line, " kept "), *ml = strstr(line, "moe: --moe-load ");
            if (at && strstr(line, " expert ")) {
                double share = atof(strstr(line, " expert ") + 12);
                if (lines < 2 * E) kept[lines] = k ? atof(k + 6) : -1;
                /* kept: rows computed over the uniform share T k / E, at most the capacity (1.25 x 4 = 5 of a
                   sequence's 4) and at most what was assigned (share x E; both printed to 3 decimals) */
                if (!k || kept[lines < 2 * E ? lines : 0] > fmin(1.25, (share + 5e-4) * E) + 5e-4) worst = 1;
                lines++;
                sum += share;
            }
            if (ml) {
                char *q = (char *)ml + 16;
                while (n_load < 2 * E && *q && *q != '\n') {
                    load[n_load++] = strtod(q, &q);
                    if (*q == ',') q++;
                }
            }
        }
        fclose(fp);
    }
    dt_test_expect("gpt_moe_prints_the_load_histogram", lines == 2 * E && fabs(sum - 2.0) < 0.01,
                   "%d lines (want %d), shares summing to %.4f (want 2: one per block); output in %s", lines, 2 * E, sum,
                   out);
    dt_test_expect("gpt_moe_kept_within_capacity_and_assigned", lines == 2 * E && worst == 0,
                   "an expert's kept rows over its uniform share above min(1.25, share x E); output in %s", out);
    /* --moe-load: per block, per ep dividing 8 (1, 2, 4, 8), the busiest ep rank's kept rows over its
       uniform share: the largest mean of the histogram's kept figures over a rank's 8 / ep experts */
    for (b = 0, i = 0; b < 2 && lines == 2 * E; b++)
        for (d = 1; d <= E; d *= 2, i++) {
            want[i] = 0;
            for (r = 0; r < d; r++) {
                double m = 0;
                for (e = r * (E / d); e < (r + 1) * (E / d); e++) m += kept[b * E + e] / (E / d);
                want[i] = fmax(want[i], m);
            }
        }
    for (i = 0; i < n_load && lines == 2 * E; i++)
        if (fabs(load[i] - want[i]) > 1e-3) break;
    dt_test_expect("gpt_moe_prints_the_busiest_ep_ranks_as_moe_load", n_load == 8 && lines == 2 * E && i == n_load,
                   "%d values (want 8), value %d %.4f against the histogram's %.4f; output in %s", n_load, i,
                   i < n_load ? load[i] : 0, i < n_load && i < 8 ? want[i] : 0, out);
}

int main(void) {
    int i, quick = dt_test_short_run(); /* quick, or the sanitizer build: the 2-rank layouts */
    FILE *probe = fopen(GPT, "rb");
    dt_ctx_init(&g_ctx, NULL);
    (void)load_weights; /* gpt_driver.h's loader of the dense model: moe_whole's names here */
    if (!probe) {
        dt_test_fail("gpt_built", "%s is missing: run ./build.sh first", GPT);
        return dt_test_finish();
    }
    fclose(probe);
    /* Switch: capacity 1.25, the aux loss, raw gates */
    if (use_ref(0, "--moe-renorm 0")) {
        equal_to_np1(2, "--ep 2");
        if (!quick) {
            equal_to_np1(4, "--ep 4");
            equal_to_np1(4, "--ep 2 --tp 2");
            equal_to_np1(4, "--ep 2 --zero 1");
            equal_to_np1(4, "--ep 2 --zero 3");
            equal_to_np1(4, "--ep 2 --pp 2 --micro 2");
        }
    }
    /* Mixtral's renormalised gates with the aux loss */
    if (use_ref(1, "--moe-renorm 1")) {
        equal_to_np1(2, "--ep 2 --zero 3");
        if (!quick) {
            equal_to_np1(4, "--ep 4 --zero 1");
            equal_to_np1(4, "--ep 2 --zero 2");
            equal_to_np1(4, "--ep 2 --tp 2 --sp 1");
            equal_to_np1(4, "--ep 2 --pp 2 --micro 2 --zero 1");
        }
    }
    /* dropless, DeepSeek-V3's bias */
    if (use_ref(2, "--moe-capacity 0 --moe-balance bias")) {
        equal_to_np1(2, "--ep 2 --micro 2");
        if (!quick) {
            equal_to_np1(1, "--micro 2");
            equal_to_np1(4, "--cp 2 --ep 2 --tp 2");             /* dropless at cp > 1: a sequence over 2 ranks */
            equal_to_np1(4, "--ep 4");
            equal_to_np1(4, "--ep 2 --tp 2 --zero 1");
            equal_to_np1(4, "--ep 2 --zero 3");
            equal_to_np1(4, "--ep 2 --pp 2 --micro 2");            /* 1F1B: the bias needs no f in the backward */
            reshard(4, "--ep 4", 2, "--ep 2");
            reshard(4, "--ep 4", 1, "--ep 1");
        }
    }
    /* dropless with the aux loss, and its f over the global batch at cp > 1 */
    if (!quick && use_ref(4, "--moe-capacity 0")) {
        equal_to_np1(2, "--ep 2");
        equal_to_np1(4, "--ep 4");
        equal_to_np1(4, "--ep 2 --tp 2");
        equal_to_np1(4, "--ep 2 --zero 1");
        equal_to_np1(2, "--cp 2");
        equal_to_np1(4, "--cp 2 --ep 4 --zero 3");
        equal_to_np1(4, "--cp 2 --ep 2 --pp 2 --micro 2");
    }
    /* capacity 1.25 with the bias */
    if (!quick && use_ref(5, "--moe-balance bias")) {
        equal_to_np1(2, "--ep 2");
        equal_to_np1(4, "--ep 4");
        equal_to_np1(4, "--ep 2 --tp 2");
        equal_to_np1(4, "--ep 2 --zero 1");
        equal_to_np1(4, "--ep 2 --zero 3");
        equal_to_np1(4, "--ep 2 --pp 2 --micro 2");
    }
    /* a shared expert beside the routed ones, capacity 1.25 */
    if (!quick && use_ref(3, "--moe-shared 1 --moe-every 2")) {
        equal_to_np1(4, "--ep 2 --tp 2");
        reshard(4, "--ep 4 --zero 1", 1, "");
    }
    if (!quick) histogram();
    named_error("gpt_moe_ep_not_dividing_dp_named", 2, "--ep 4", "--ep 4 does not divide dp x cp = 2 x 1");
    named_error("gpt_moe_experts_not_multiple_of_ep_named", 2, "--ep 2 --moe-experts 3",
                "--moe-experts 3 is not a multiple of --ep 2");
    named_error("gpt_moe_topk_above_experts_named", 1, "--moe-topk 9", "--moe-topk 9 exceeds --moe-experts 8");
    named_error("gpt_moe_aux_with_1f1b_named", 2, "--pp 2 --micro 2 --schedule 1f1b",
                "--moe-balance aux with --schedule 1f1b");
    named_error("gpt_moe_aux_with_micro_at_pp1_named", 1, "--micro 2", "--moe-balance aux with --micro 2 at --pp 1");
    named_error("gpt_moe_capacity_with_cp_named", 2, "--cp 2", "--moe-experts with --cp 2 and --moe-capacity 1.25");
    named_error("gpt_moe_with_recompute_named", 1, "--recompute full", "--moe-experts with --recompute full");
    named_error("gpt_ep_without_moe_named", 2, "--moe-experts 0 --ep 2", "--ep 2 without --moe-experts");
    named_error("gpt_moe_balance_unknown_named", 1, "--moe-balance loss", "--moe-balance is aux or bias");
    named_error("gpt_moe_load_count_named", 1, "--moe-load 1,1",
                "--moe-load has 2 values: expected one per ep dividing --moe-experts 8 (4) or per MoE block");
    named_error("gpt_moe_load_value_named", 1, "--moe-load 1,x", "--moe-load wants a number in [0, 1e+06], got 'x'");
    for (i = 0; i < 6; i++)
        if (refs[i].ok) dt_params_free(&g_ctx, &refs[i].w);
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
}
