// mpi-driver
/* tests/mpi_gpt_pp.c - examples/gpt under pipeline parallelism trains the model of the single
   process. Issue 10's check, as written there: `--steps 5 --seed 3 --micro 4` (the default
   GPT: 4 blocks, width 128, 4 heads, context 64, batch 8) at np 1, and under --pp 2 --schedule
   1f1b (np 2), --pp 4 --schedule gpipe (np 4), --pp 2 --schedule interleaved (np 2, 2 chunks per
   stage), --pp 4 --schedule zb (np 4) and --tp 2 --pp 2 --schedule 1f1b (np 4), end on the np-1
   loss of every step and the grad norm of step 1 within fp32 bounds, and (each run saves a
   checkpoint at its end, read back whole through dt_checkpoint_load's resharding: every stage
   wrote its own tensors) on its weights within Adam's per-element bound (tests/gpt_driver.h). Also dp 2 x pp 2 with ZeRO 1, an uneven split (3 blocks
   over 2 stages), and --micro 2 at pp 2 (the loss does not depend on the number of
   micro-batches). A checkpoint saved at pp 2 after 3 steps resumes at pp 1 (np 1) to the
   straight run's loss and weights. Bad pipeline configurations exit 1 naming the problem, and
   --help lists the flags.

   Run directly (not under mpirun): it starts $DT_MPIRUN -np N build/examples/gpt itself.
   build/examples/gpt comes from ./build.sh. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* The runs differ by fp32 reassociation only (the tied head's gradient is added to wte's on
   stage 0 as one sum over the micro-batches, tp splits inner sums, dp sums grads in another
   order): the losses of every step, the grad norm of step 1 and the weights are compared within
   the bounds tests/gpt_driver.h derives from fp32 rounding and Adam's update. */
#define BATCH 8 /* examples/gpt's default --batch */

static const char *BASE = "--steps 5 --seed 3 --micro 4 --quiet"; /* the flags */

#include "gpt_driver.h"

/* The default model (width 128, padded vocab 256, context 64) with `layers` blocks. */
static gpt_shape shape_of(int layers) {
    gpt_shape s = {layers, 128, 256, 64, 0};
    return s;
}


/* ---------------------------------------------------------------- equivalence */

typedef struct ref { double loss; dt_params w; int layers; char log[512]; double wbound; } ref;

/* np 1 with the flags (its checkpoint at the end): the reference of a group of runs. */
static int reference(ref *r, const char *tag, const char *extra, int layers) {
    char flags[2048], out[512], dir[512], name[200];
    snprintf(out, sizeof out, "%s/%s.out", dt_test_tmpdir(), tag);
    snprintf(dir, sizeof dir, "%s/ckpt_%s", dt_test_tmpdir(), tag);
    snprintf(r->log, sizeof r->log, "%s/%s.jsonl", dt_test_tmpdir(), tag);
    snprintf(flags, sizeof flags, "%s%s --ckpt %s --log %s", BASE, extra, dir, r->log);
    snprintf(name, sizeof name, "gpt_pp_%s_runs", tag);
    if (!dt_test_expect(name, run(1, flags, out) == 0, "np 1: gpt %s failed (output in %s)", flags, out)) return 0;
    r->loss = final_loss(out, NULL, 0);
    r->layers = layers;
    r->wbound = weight_bound_of(r->log);
    snprintf(name, sizeof name, "gpt_pp_%s_checkpoint_loads", tag);
    if (!dt_test_expect(name, r->loss == r->loss && load_weights(&r->w, dir, shape_of(layers)), "loss %g, checkpoint %s", r->loss, dir))
        return 0;
    printf("  %s: np 1 final loss %.9g\n", tag, r->loss);
    return 1;
}

static void equal_to_np1(const ref *r, const char *tag, int np, const char *extra) {
    char name[256], flags[2048], out[512], dir[512], log[512];
    const char *which;
    double worst, diff;
    dt_params w;
    snprintf(out, sizeof out, "%s/%s.out", dt_test_tmpdir(), tag);
    snprintf(dir, sizeof dir, "%s/ckpt_%s", dt_test_tmpdir(), tag);
    snprintf(log, sizeof log, "%s/%s.jsonl", dt_test_tmpdir(), tag);
    snprintf(flags, sizeof flags, "%s%s --ckpt %s --log %s", BASE, extra, dir, log);
    snprintf(name, sizeof name, "gpt_%s_runs", tag);
    if (!dt_test_expect(name, run(np, flags, out) == 0, "np %d: gpt %s failed (output in %s)", np, flags, out)) return;
    snprintf(name, sizeof name, "gpt_%s", tag);
    compare_logs(name, log, r->log, shape_of(r->layers), BATCH);
    snprintf(name, sizeof name, "gpt_%s_checkpoint_loads", tag);
    if (!dt_test_expect(name, load_weights(&w, dir, shape_of(r->layers)), "checkpoint %s does not load", dir)) return;
    snprintf(name, sizeof name, "gpt_%s_weights_equal_np1", tag);
    worst = weights_worst(&w, &r->w, r->wbound, &which, &diff);
    dt_test_expect(name, worst <= 1, "an element of %s differs from np 1's by %.3g (> Adam's bound %.3g)", which, diff, r->wbound);
    dt_params_free(&g_ctx, &w);
}

/* Saved at pp 2 after 3 of 5 steps, resumed at pp 1 on one rank: the straight run's loss and weights. */
static void resume_across_pp(const ref *r) {
    char flags[2048], out[512], dir[512];
    const char *which;
    double got, rel, diff;
    dt_params w;
    snprintf(dir, sizeof dir, "%s/ckpt_resume_pp2", dt_test_tmpdir());
    snprintf(out, sizeof out, "%s/resume_pp2_first.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "%s --pp 2 --schedule 1f1b --stop-at 3 --ckpt %s", BASE, dir);
    if (!dt_test_expect("gpt_pp2_stops_at_3_with_a_checkpoint", run(2, flags, out) == 0, "output in %s", out)) return;
    snprintf(out, sizeof out, "%s/resume_pp1_second.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "%s --resume --ckpt %s", BASE, dir);
    if (!dt_test_expect("gpt_pp2_checkpoint_resumes_at_pp1", run(1, flags, out) == 0, "output in %s", out)) return;
    got = final_loss(out, NULL, 0);
    rel = fabs(got - r->loss) / fabs(r->loss);
    dt_test_expect("gpt_saved_pp2_resumed_pp1_loss_equals_straight_run", rel <= loss_bound(shape_of(r->layers), BATCH, 5),
           "final loss %.9g, straight %.9g (relative %.3g > bound %.3g)", got, r->loss, rel, loss_bound(shape_of(r->layers), BATCH, 5));
    if (!dt_test_expect("gpt_saved_pp2_resumed_pp1_weights_load", load_weights(&w, dir, shape_of(r->layers)), "%s", dir)) return;
    rel = weights_worst(&w, &r->w, r->wbound, &which, &diff);
    dt_test_expect("gpt_saved_pp2_resumed_pp1_weights_equal_straight_run", rel <= 1, "an element of %s differs by %.3g (> "
           "Adam's bound %.3g)", which, diff, r->wbound);
    dt_params_free(&g_ctx, &w);
}

static void named_error(const char *name, int np, const char *flags, const char *needle) {
    gd_named_error(name, np, "--quiet", flags, needle);
}

static void bad_input(void) {
    char out[512];
    int st;
    named_error("gpt_pp_more_stages_than_blocks_named", 4, "--pp 4 --layers 3",
                "--pp 4 x 1 chunks per stage (--schedule 1f1b) = 4 virtual stages but --layers 3");
    named_error("gpt_pp_interleaved_fewer_micro_than_stages_named", 2, "--pp 2 --schedule interleaved --micro 1",
                "desc->micro = 1 is fewer than desc->stages = 2");
    named_error("gpt_pp_interleaved_chunks_need_blocks_named", 2, "--pp 2 --schedule interleaved --layers 3 --micro 2",
                "= 4 virtual stages but --layers 3");
    named_error("gpt_pp_zero2_named", 2, "--pp 2 --zero 2", "--zero 2 with --pp 2: the pipeline takes ZeRO 0 or 1");
    named_error("gpt_pp_unknown_schedule_named", 1, "--schedule pipedream", "--schedule is gpipe, 1f1b, interleaved or zb");
    named_error("gpt_pp_not_dividing_world_named", 2, "--pp 4", "--tp 1 x --pp 4 does not divide the world size 2");
    snprintf(out, sizeof out, "%s/uneven.out", dt_test_tmpdir());
    dt_test_expect("gpt_pp_uneven_split_reported", run(2, "--steps 1 --layers 3 --pp 2", out) == 0 &&
           file_has(out, "blocks per virtual stage: 2 1 (uneven)"), "output in %s", out);
    { /* without mpirun: --help exits before MPI_Finalize, which mpirun reports as a failure */
        char cmd[1024];
        snprintf(out, sizeof out, "%s/help.out", dt_test_tmpdir());
        snprintf(cmd, sizeof cmd, "%s --help > %s 2>&1 < /dev/null", GPT, out);
        st = system(cmd);
    }
    dt_test_expect("gpt_help_lists_pp_schedule_micro", st == 0 && file_has(out, "--pp N") &&
           file_has(out, "--schedule S") && file_has(out, "gpipe, 1f1b, interleaved") && file_has(out, "--micro N"),
           "--help output in %s", out);
}

int main(void) {
    ref r, r3;
    int quick = dt_test_quick();
    FILE *probe = fopen(GPT, "rb");
    dt_ctx_init(&g_ctx, NULL);
    if (!probe) {
        dt_test_fail("gpt_built", "%s is missing: run ./build.sh first", GPT);
        return dt_test_finish();
    }
    fclose(probe);
    if (!reference(&r, "np1", "", 4)) return dt_test_finish();
#ifdef __SANITIZE_ADDRESS__
    /* the sanitizer build instruments this driver, not build/examples/gpt: one run checks the
       driver's code, the rest runs in the plain build */
    equal_to_np1(&r, "pp2_1f1b", 2, " --pp 2 --schedule 1f1b");
    bad_input();
    dt_params_free(&g_ctx, &r.w);
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
#endif
    /* the five (tests/run.sh quick: the 2-rank ones only) */
    equal_to_np1(&r, "pp2_1f1b", 2, " --pp 2 --schedule 1f1b");
    if (!quick) equal_to_np1(&r, "pp4_gpipe", 4, " --pp 4 --schedule gpipe");
    equal_to_np1(&r, "pp2_interleaved", 2, " --pp 2 --schedule interleaved");
    if (!quick) equal_to_np1(&r, "pp4_zb", 4, " --pp 4 --schedule zb");
    if (!quick) equal_to_np1(&r, "tp2_pp2_1f1b", 4, " --tp 2 --pp 2 --schedule 1f1b");
    /* and: data parallel with ZeRO 1, fewer micro-batches, an uneven split */
    if (!quick) equal_to_np1(&r, "dp2_pp2_zero1_1f1b", 4, " --pp 2 --zero 1 --schedule 1f1b");
    {
        ref r2 = r;
        char flags[64];
        snprintf(flags, sizeof flags, " --pp 2 --schedule zb --micro 2"); /* after BASE's --micro 4: the last wins */
        equal_to_np1(&r2, "pp2_zb_micro2", 2, flags);
    }
    if (reference(&r3, "np1_layers3", " --layers 3", 3)) {
        equal_to_np1(&r3, "pp2_gpipe_layers3_uneven", 2, " --layers 3 --pp 2 --schedule gpipe");
        dt_params_free(&g_ctx, &r3.w);
    }
    if (!quick) {
        resume_across_pp(&r);
        bad_input();
    }
    dt_params_free(&g_ctx, &r.w);
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
}
