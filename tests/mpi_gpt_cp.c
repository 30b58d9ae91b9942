// mpi-driver
/* tests/mpi_gpt_cp.c - context parallelism in examples/gpt: the tiny GPT of tests/mpi_gpt.c
   (2 layers, width 32, 4 heads, context 16, batch 8, fp32, seed 3, 5 steps) with its sequence
   split over cp ranks (zigzag chunks, ring attention: dt_parallel.h's >>cp) matches the np-1
   run: the loss of every step and the grad norm of step 1 within tests/gpt_driver.h's derived
   fp32 bounds (which are below the 1e-5 relative), and every weight of the final
   checkpoint within Adam's per-element bound. Layouts: cp 2 and cp 4 alone, cp 2 x tp 2 (with
   and without sequence parallelism), cp 2 x dp 2 with ZeRO 1 and 3, cp 2 with ZeRO 2, full and
   selective recompute, 2 micro-batches, cp 2 x pp 2; the same for Ulysses (--cp-kind ulysses)
   at cp 2 and 4, with tp 2 and with pp 2; --recompute gemm-last (layernorm and gelu recomputed from
   the GEMM outputs kept, attention's lse kept instead of its scores) at np 1, with cp 2 (and pp 2),
   tp 2 with sp and ZeRO 2, and Ulysses cp 4; --offload-activations (blocks' saved tensors to host
   and back) at np 1, with cp 2 and selective recompute, cp 2 x pp 2, tp 2 sp ZeRO 3 gemm-last, and
   its peak: 4 blocks offloaded with 2 slots resident drop dt_peak_bytes by 2 blocks, and only 2
   come back from host (the forward's last 2 stay in their slots). A checkpoint saved at cp 4 resumes at cp 1
   and one saved at cp 1 resumes at cp 4, both to the straight run's loss and weights (cp changes
   nothing in the weights). Bad cp sizes exit 1 naming the problem. Each rank's attention work
   (pairs scored, printed in the plan line) is the same on every cp rank.

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
static const char *TINY = "--seed 3 --quiet --layers 2 --width 32 --heads 4 --seq 16 --batch 8";

#include "gpt_driver.h"

static gpt_shape SHAPE = {2, 32, 256, 16, 0};

/* The shape of a model's checkpoint: --kv-heads K gives k and v K x head size (8) rows. */
static gpt_shape model_shape(const char *model) {
    gpt_shape s = {2, 32, 256, 16, 0};
    const char *at = strstr(model, "--kv-heads ");
    if (at) s.kvw = 8 * atoi(at + strlen("--kv-heads "));
    return s;
}

/* The np-1 run a layout must equal: the MHA model's, or a grouped-query one's (--kv-heads). */
typedef struct refrun {
    double loss, wbound;
    dt_params w;
    char log[512], model[64];
    int ok;
} refrun;
static refrun refs[3];
static double ref_loss, ref_wbound;
static dt_params ref_w;
static char ref_log[512];


/* "--cp 2 --zero 1" -> "cp_2_zero_1" */
static void tag_of(char *tag, size_t n, const char *flags) {
    size_t i, k = 0;
    for (i = 0; flags[i] && k + 1 < n; i++)
        if (flags[i] != '-') tag[k++] = flags[i] == ' ' ? '_' : flags[i];
    tag[k] = 0;
    if (k && tag[0] == '_') memmove(tag, tag + 1, k);
}

/* The np-1 reference of a model ("" or "--kv-heads K"); the globals above point at the one in use. */
static int use_ref(int i, const char *model) {
    refrun *r = &refs[i];
    if (!r->ok) {
        char out[512], dir[512], flags[2048], name[160], tag[64];
        tag_of(tag, sizeof tag, model);
        snprintf(out, sizeof out, "%s/np1%s.out", dt_test_tmpdir(), tag);
        snprintf(dir, sizeof dir, "%s/ckpt_np1%s", dt_test_tmpdir(), tag);
        snprintf(r->log, sizeof r->log, "%s/np1%s.jsonl", dt_test_tmpdir(), tag);
        snprintf(flags, sizeof flags, "%s --steps 5 %s --ckpt %s --log %s", TINY, model, dir, r->log);
        snprintf(name, sizeof name, "gpt_np1%s%s_reference_runs", *tag ? "_" : "", tag);
        if (!dt_test_expect(name, run(1, flags, out) == 0, "output in %s", out)) return 0;
        r->loss = final_loss(out, NULL, 0);
        r->wbound = weight_bound_of(r->log);
        snprintf(name, sizeof name, "gpt_np1%s%s_checkpoint_loads", *tag ? "_" : "", tag);
        if (!dt_test_expect(name, load_weights(&r->w, dir, model_shape(model)), "checkpoint %s does not load", dir)) return 0;
        printf("  np 1 %s final loss %.9g\n", model, r->loss);
        r->ok = 1;
    }
    ref_loss = r->loss;
    ref_wbound = r->wbound;
    ref_w = r->w;
    SHAPE = model_shape(model);
    snprintf(ref_log, sizeof ref_log, "%s", r->log);
    return 1;
}

/* One run at np ranks with flags: its per-step losses and final weights against np 1's. */
static void equal_to_np1(int np, const char *extra) {
    char name[256], flags[2048], out[512], dir[512], tag[200], log[512];
    const char *tmp = dt_test_tmpdir(), *which;
    double worst, diff;
    dt_params w;
    tag_of(tag, sizeof tag, extra);
    snprintf(out, sizeof out, "%s/%s.out", tmp, tag);
    snprintf(dir, sizeof dir, "%s/ckpt_%s", tmp, tag);
    snprintf(log, sizeof log, "%s/%s.jsonl", tmp, tag);
    snprintf(flags, sizeof flags, "%s --steps 5 %s --ckpt %s --log %s", TINY, extra, dir, log);
    snprintf(name, sizeof name, "gpt_%s_runs", tag);
    if (!dt_test_expect(name, run(np, flags, out) == 0, "np %d: gpt %s failed (output in %s)", np, flags, out)) return;
    snprintf(name, sizeof name, "gpt_%s", tag);
    compare_logs(name, log, ref_log, SHAPE, BATCH);
    snprintf(name, sizeof name, "gpt_%s_final_loss_within_1e-5_of_np1", tag);
    dt_test_expect(name, fabs(final_loss(out, NULL, 0) - ref_loss) <= 1e-5 * fabs(ref_loss), "final loss %.9g, np 1 %.9g",
                   final_loss(out, NULL, 0), ref_loss);
    snprintf(name, sizeof name, "gpt_%s_checkpoint_loads", tag);
    if (!dt_test_expect(name, load_weights(&w, dir, SHAPE), "checkpoint %s does not load", dir)) return;
    snprintf(name, sizeof name, "gpt_%s_weights_equal_np1", tag);
    worst = weights_worst(&w, &ref_w, ref_wbound, &which, &diff);
    dt_test_expect(name, worst <= 1, "an element of %s differs from np 1's by %.3g (> Adam's bound %.3g)", which, diff,
                   ref_wbound);
    dt_params_free(&g_ctx, &w);
}

/* Saved after 3 steps at (np_a, flags_a), resumed to 5 at (np_b, flags_b): the loss and weights of
   the straight np-1 run. */
static void reshard(int np_a, const char *flags_a, int np_b, const char *flags_b) {
    char name[256], flags[2048], out[512], dir[512], ta[100], tb[100];
    const char *tmp = dt_test_tmpdir(), *which;
    double got, diff, worst;
    dt_params w;
    tag_of(ta, sizeof ta, flags_a);
    tag_of(tb, sizeof tb, flags_b);
    snprintf(dir, sizeof dir, "%s/reshard_%s_to_%s", tmp, ta, tb);
    snprintf(out, sizeof out, "%s/reshard_%s_first.out", tmp, ta);
    snprintf(flags, sizeof flags, "%s --steps 5 --stop-at 3 %s --ckpt %s", TINY, flags_a, dir);
    snprintf(name, sizeof name, "gpt_saved_%s_stops_at_3", ta);
    if (!dt_test_expect(name, run(np_a, flags, out) == 0, "output in %s", out)) return;
    snprintf(out, sizeof out, "%s/reshard_%s_to_%s.out", tmp, ta, tb);
    snprintf(flags, sizeof flags, "%s --steps 5 --resume %s --ckpt %s", TINY, flags_b, dir);
    snprintf(name, sizeof name, "gpt_saved_%s_resumed_%s_runs", ta, tb);
    if (!dt_test_expect(name, run(np_b, flags, out) == 0, "output in %s", out)) return;
    got = final_loss(out, NULL, 0);
    snprintf(name, sizeof name, "gpt_saved_%s_resumed_%s_loss_equals_np1", ta, tb);
    dt_test_expect(name, fabs(got - ref_loss) <= loss_bound(SHAPE, BATCH, 5) * fabs(ref_loss),
                   "final loss %.9g, np 1 straight %.9g (bound %.3g relative)", got, ref_loss, loss_bound(SHAPE, BATCH, 5));
    snprintf(name, sizeof name, "gpt_saved_%s_resumed_%s_checkpoint_loads", ta, tb);
    if (!dt_test_expect(name, load_weights(&w, dir, SHAPE), "checkpoint %s does not load", dir)) return;
    snprintf(name, sizeof name, "gpt_saved_%s_resumed_%s_weights_equal_np1", ta, tb);
    worst = weights_worst(&w, &ref_w, ref_wbound, &which, &diff);
    dt_test_expect(name, worst <= 1, "an element of %s differs from np 1's by %.3g (> Adam's bound %.3g)", which, diff,
                   ref_wbound);
    dt_params_free(&g_ctx, &w);
}

static void named_error(const char *name, int np, const char *flags, const char *needle) {
    gd_named_error(name, np, TINY, flags, needle);
}

/* The plan line at cp 4 states the ring's pairs per rank; every rank's count is equal (the
   zigzag): 2cp-1 full chunk pairs plus two diagonals, c = T / 2cp, per sequence and head. */
static void balance(void) {
    char out[512], flags[1024], line[4096];
    FILE *fp;
    long long pairs = -1;
    snprintf(out, sizeof out, "%s/plan_cp4.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "--seed 3 --layers 2 --width 32 --heads 4 --seq 16 --batch 8 --steps 1 --cp 4");
    if (!dt_test_expect("gpt_cp4_plan_runs", run(4, flags, out) == 0, "output in %s", out)) return;
    if ((fp = fopen(out, "r"))) {
        while (fgets(line, sizeof line, fp)) {
            const char *at = strstr(line, "attention pairs per rank ");
            if (at) pairs = atoll(at + strlen("attention pairs per rank "));
        }
        fclose(fp);
    }
    /* c = 2: (2*4 - 1) * 4 + 2 * 3 = 34 */
    dt_test_expect("gpt_cp4_plan_states_the_pairs_per_rank", pairs == 34, "plan line says %lld pairs, expected 34 (output "
                   "in %s)", pairs, out);
}

/* --offload-activations 1 on a 4-layer model: the activation peak (dt_peak_bytes) drops by the two
   blocks beyond the two slots that stay, as the offload line states a block's bytes. */
static double number_after(const char *path, const char *key) {
    char line[4096];
    double v = -1;
    FILE *fp = fopen(path, "r");
    if (!fp) return -1;
    while (fgets(line, sizeof line, fp)) {
        const char *at = strstr(line, key);
        if (at) v = atof(at + strlen(key));
    }
    fclose(fp);
    return v;
}
static void offload_memory(void) {
    char out0[512], out1[512], flags[1024];
    double p0, p1, blk;
    snprintf(out0, sizeof out0, "%s/offload0.out", dt_test_tmpdir());
    snprintf(out1, sizeof out1, "%s/offload1.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "--seed 3 --layers 4 --width 32 --heads 4 --seq 16 --batch 8 --steps 3");
    if (!dt_test_expect("gpt_offload_baseline_runs", run(1, flags, out0) == 0, "output in %s", out0)) return;
    strcat(flags, " --offload-activations 1");
    if (!dt_test_expect("gpt_offload_runs", run(1, flags, out1) == 0, "output in %s", out1)) return;
    p0 = number_after(out0, "activation memory per rank: ");
    p1 = number_after(out1, "activation memory per rank: ");
    blk = number_after(out1, "blocks, ");
    /* the same arithmetic on the same numbers: the loss to the last printed digit (a block that
       came back with another's tensors would not) */
    dt_test_expect("gpt_offload_4_blocks_same_loss", final_loss(out1, NULL, 0) == final_loss(out0, NULL, 0),
                   "final loss %.9g with offload, %.9g without", final_loss(out1, NULL, 0), final_loss(out0, NULL, 0));
    /* the backward starts with the 2 blocks the slots still hold: only the other 2 come back */
    dt_test_expect("gpt_offload_4_blocks_copies_back_only_the_2_not_resident", number_after(out1, "copied back ") == 2.0,
                   "copied back %.2f blocks per micro-batch, expected 2 (4 offloaded, the last 2 resident; output %s)",
                   number_after(out1, "copied back "), out1);
    dt_test_expect("gpt_offload_4_blocks_drops_the_peak_by_2_blocks", blk > 0 && fabs((p0 - p1) - 2 * blk) <= 0.02 + 1e-3 * p0,
                   "peak %.2f MB without, %.2f MB with offload, a block %.2f MB: expected a drop of 2 blocks (outputs %s, %s)",
                   p0, p1, blk, out0, out1);
}

int main(void) {
    int i;
    int quick = dt_test_short_run(); /* quick, or the sanitizer build: the 2-rank layouts */
    FILE *probe = fopen(GPT, "rb");
    dt_ctx_init(&g_ctx, NULL);
    if (!probe) {
        dt_test_fail("gpt_built", "%s is missing: run ./build.sh first", GPT);
        return dt_test_finish();
    }
    fclose(probe);
    if (!use_ref(0, "")) return dt_test_finish();
    equal_to_np1(2, "--cp 2");
    equal_to_np1(2, "--cp 2 --zero 2 --recompute selective");
    equal_to_np1(2, "--cp 2 --cp-kind ulysses");
    equal_to_np1(1, "--recompute gemm-last");
    equal_to_np1(2, "--cp 2 --recompute gemm-last");
    equal_to_np1(1, "--offload-activations 1");
    offload_memory();
    if (!quick) {
        equal_to_np1(2, "--cp 2 --offload-activations 1 --recompute selective");
        equal_to_np1(4, "--cp 2 --pp 2 --micro 2 --offload-activations 1");
        equal_to_np1(4, "--tp 2 --sp 1 --zero 3 --offload-activations 0.5 --recompute gemm-last");
        equal_to_np1(4, "--tp 2 --sp 1 --zero 2 --recompute gemm-last");
        equal_to_np1(4, "--cp 2 --pp 2 --micro 2 --recompute gemm-last");
        equal_to_np1(4, "--cp 4 --cp-kind ulysses --zero 1 --recompute gemm-last");
        equal_to_np1(4, "--cp 4");
        equal_to_np1(4, "--cp 2 --tp 2");
        equal_to_np1(4, "--cp 2 --tp 2 --sp 1 --zero 1");
        equal_to_np1(4, "--cp 2 --zero 1");   /* dp 2 x cp 2 */
        equal_to_np1(4, "--cp 2 --zero 3 --recompute full --micro 2");
        equal_to_np1(4, "--cp 2 --pp 2 --micro 2");
        equal_to_np1(4, "--cp 4 --cp-kind ulysses --zero 3");
        equal_to_np1(4, "--cp 2 --tp 2 --cp-kind ulysses --recompute selective");
        equal_to_np1(4, "--cp 2 --cp-kind ulysses --pp 2 --micro 2 --zero 1");
        reshard(4, "--cp 4", 1, "--cp 1");
        reshard(1, "--cp 1", 4, "--cp 4");
        balance();
    }
    /* grouped-query attention (--kv-heads): its own np-1 model, every layout equal to it; the
       ring's K/V traffic drops by heads / kv heads (mpi_parallel_cp_attn counts it) */
    if (use_ref(1, "--kv-heads 2")) {
        equal_to_np1(2, "--kv-heads 2 --cp 2");
        if (!quick) {
            equal_to_np1(4, "--kv-heads 2 --tp 4 --zero 1"); /* each kv head on 2 of the 4 tp ranks */
            equal_to_np1(4, "--kv-heads 2 --cp 2 --tp 2");
            equal_to_np1(4, "--kv-heads 2 --cp 2 --cp-kind ulysses --zero 1");
            equal_to_np1(4, "--kv-heads 2 --tp 2 --zero 3");
        }
    }
    if (!quick && use_ref(2, "--kv-heads 1")) {
        equal_to_np1(1, "--kv-heads 1 --recompute gemm-last");
        equal_to_np1(2, "--kv-heads 1 --cp 2");
        equal_to_np1(4, "--kv-heads 1 --cp 4");
        equal_to_np1(4, "--kv-heads 1 --pp 2 --micro 2 --cp 2 --recompute gemm-last");
        equal_to_np1(2, "--kv-heads 1 --tp 2 --micro 2");              /* the kv head whole on both tp ranks */
        equal_to_np1(4, "--kv-heads 1 --tp 2 --sp 1 --cp 2 --zero 3"); /* ... with sp, the ring, ZeRO 3 */
        equal_to_np1(4, "--kv-heads 1 --tp 4");
    }
    named_error("gpt_cp_not_dividing_world_named", 2, "--cp 3", "does not divide the world size 2");
    named_error("gpt_seq_not_multiple_of_2cp_named", 2, "--cp 2 --seq 18", "--seq 18 is not a multiple of 2 x --cp = 4");
    named_error("gpt_cp_kind_unknown_named", 1, "--cp-kind star", "--cp-kind is");
    named_error("gpt_ulysses_heads_not_dividing_cp_named", 2, "--cp 2 --heads 1 --cp-kind ulysses",
                "heads per tp rank do not divide over --cp 2");
    named_error("gpt_kv_heads_not_dividing_heads_named", 1, "--kv-heads 3", "--kv-heads 3 does not divide --heads 4");
    named_error("gpt_ulysses_kv_heads_not_dividing_cp_named", 2, "--kv-heads 1 --cp 2 --cp-kind ulysses",
                "kv heads per tp rank, which do not divide over --cp 2");
    for (i = 0; i < 3; i++)
        if (refs[i].ok) dt_params_free(&g_ctx, &refs[i].w);
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
}
