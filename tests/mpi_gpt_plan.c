// mpi-driver
/* tests/mpi_gpt_plan.c - examples/gpt --plan and --layout auto (dt_plan.h): --plan measures the
   machine at the run's world size, prints the five best layouts and its prediction for the layout
   given (Ulysses, offload and expert parallel too), and exits; --layout auto trains on the first one, to the loss of the one-rank run (every
   layout trains the same model); the profile file is kept and read again; a profile of another
   world, a model the planner does not model and a bad --layout value are named.

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

#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-function" /* the driver's checkpoint helpers: not needed here */
#endif
#include "gpt_driver.h"

static const char *MODEL = "--layers 2 --width 64 --heads 4 --seq 32 --batch 8 --steps 4 --seed 3";

/* The number after `key` on the first line of path that holds `line_has` (NAN if none) */
static double number_after(const char *path, const char *line_has, const char *key) {
    FILE *fp = fopen(path, "r");
    char line[4096];
    double v = NAN;
    if (!fp) return v;
    while (isnan(v) && fgets(line, sizeof line, fp)) {
        const char *at = strstr(line, line_has) ? strstr(line, key) : NULL;
        if (at) v = strtod(at + strlen(key), NULL);
    }
    fclose(fp);
    return v;
}

/* The CUDA plan (the emulator's build of examples/gpt, where nvcc built one) at cp 2: Ulysses keeps
   its heads' q, k, v of the whole sequence in bf16 where the ring keeps the logsumexp, and the
   plan's activations differ between the two as the runs' activation tensors do (each printed to
   0.01 MB; the difference is 0.19 MB, 0.39 if uqkv were counted in f32) */
static void cuda_plan_ulysses_memory(void) {
    static const char *EMU = "build/examples/emu/gpt", *kind[2] = {"ring", "ulysses"};
    static const char *M = "--device cuda --dtype bf16 --layers 2 --width 64 --heads 4 --seq 128 --batch 4 --cp 2";
    char cmd[2048], out[512];
    double pred[2], meas[2];
    int k;
    FILE *probe = fopen(EMU, "rb");
    if (!probe) {
        dt_test_skip("gpt_cuda_plan_ulysses_memory_as_run", "%s not built (no nvcc)", EMU);
        return;
    }
    fclose(probe);
    snprintf(out, sizeof out, "%s/cuda_plan.out", dt_test_tmpdir());
    for (k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} %s -np 2 %s %s --cp-kind %s --plan > %s "
                 "2>&1 < /dev/null", dt_test_mpirun(), EMU, M, kind[k], out);
        pred[k] = system(cmd) == 0 ? number_after(out, "plan: the layout given", "activations ") : NAN;
        snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} %s -np 2 %s %s --cp-kind %s --steps 1 "
                 "> %s 2>&1 < /dev/null", dt_test_mpirun(), EMU, M, kind[k], out);
        meas[k] = system(cmd) == 0 ? number_after(out, "activation memory per rank", "the activation tensors ") : NAN;
    }
    dt_test_check_all("gpt_cuda_plan_ulysses_memory_as_run",
                      fabs((pred[1] - pred[0]) - (meas[1] - meas[0])) <= 0.02 && meas[1] - meas[0] > 0.1,
                      "activations predicted %.2f (ring) and %.2f (ulysses) MB, the runs' %.2f and %.2f", pred[0],
                      pred[1], meas[0], meas[1]);
}

int main(void) {
    char flags[1024], out[512], prof[512], ref_out[512];
    double ref, got;
    int lean = dt_test_short_run();
    FILE *probe = fopen(GPT, "rb");
    dt_ctx_init(&g_ctx, NULL);
    if (!probe) {
        dt_test_fail("gpt_built", "%s is missing: run ./build.sh first", GPT);
        return dt_test_finish();
    }
    fclose(probe);
    snprintf(prof, sizeof prof, "%s/plan_np2.json", dt_test_tmpdir());
    snprintf(out, sizeof out, "%s/plan.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "%s --tp 2 --plan --plan-profile %s", MODEL, prof);
    if (DT_TEST_CHECK("gpt_plan_exits_0", run(2, flags, out) == 0)) {
        DT_TEST_CHECK("gpt_plan_prints_the_table_of_five", file_has(out, "rank layout") && file_has(out, "5    dp "));
        DT_TEST_CHECK("gpt_plan_predicts_the_layout_given", file_has(out, "plan: the layout given (dp 1 tp 2 pp 1 cp 1"));
        DT_TEST_CHECK("gpt_plan_writes_its_profile", file_has(prof, "\"dt_plan_profile\": 1"));
        DT_TEST_CHECK("gpt_plan_trains_nothing", !file_has(out, "final: loss"));
    }
    /* the same again from the file: "read from --plan-profile" */
    if (DT_TEST_CHECK("gpt_plan_reads_its_profile", run(2, flags, out) == 0))
        DT_TEST_CHECK("gpt_plan_says_it_read_the_profile", file_has(out, "read from --plan-profile"));
    /* Ulysses and activation offload are layouts it predicts too (from the same file) */
    snprintf(flags, sizeof flags, "%s --cp 2 --cp-kind ulysses --offload-activations 1 --plan --plan-profile %s", MODEL,
             prof);
    DT_TEST_CHECK("gpt_plan_predicts_ulysses_with_offload",
                  run(2, flags, out) == 0 &&
                      file_has(out, "plan: the layout given (dp 1 tp 1 pp 1 cp 2 ulysses, micro 1, zero 0, sp 0, "
                                    "recompute none, offload 1): predicted step"));
    /* a MoE model: expert parallel is a layout it predicts, and --layout auto trains a MoE model to
       its one-rank loss (balanced by the bias: any micro-batching the search picks runs); not in
       quick or the sanitizer build (dt_test_short_run: that build instruments this driver, whose
       code here is the dense case's again, not build/examples/gpt) */
    if (!lean) {
        char mflags[1024], mprof[512], moe_ref[512];
        double mref, mgot;
        snprintf(mprof, sizeof mprof, "%s/plan_moe_np2.json", dt_test_tmpdir());
        snprintf(mflags, sizeof mflags, "%s --moe-experts 4 --moe-balance bias --ep 2 --plan --plan-profile %s", MODEL,
                 mprof);
        DT_TEST_CHECK("gpt_plan_predicts_expert_parallel",
                      run(2, mflags, out) == 0 &&
                          file_has(out, "plan: the layout given (dp 2 tp 1 pp 1 cp 1 ep 2, micro 1, zero 0, sp 0, "
                                        "recompute none): predicted step"));
        snprintf(moe_ref, sizeof moe_ref, "%s/moe_np1.out", dt_test_tmpdir());
        snprintf(mflags, sizeof mflags, "%s --moe-experts 4 --moe-balance bias --quiet", MODEL);
        run(1, mflags, moe_ref);
        mref = final_loss(moe_ref, NULL, 0);
        snprintf(mflags, sizeof mflags, "%s --moe-experts 4 --moe-balance bias --layout auto --plan-profile %s", MODEL,
                 mprof);
        if (DT_TEST_CHECK("gpt_layout_auto_runs_a_moe_model", run(2, mflags, out) == 0)) {
            mgot = final_loss(out, NULL, 0);
            dt_test_close("gpt_layout_auto_trains_the_one_rank_moe_model", mgot, mref, 1e-4 * fabs(mref));
        }
    }
    /* --layout auto trains on the first layout, to the one-rank loss */
    snprintf(ref_out, sizeof ref_out, "%s/np1.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "%s --quiet", MODEL);
    run(1, flags, ref_out);
    ref = final_loss(ref_out, NULL, 0);
    snprintf(flags, sizeof flags, "%s --layout auto --plan-profile %s", MODEL, prof);
    if (DT_TEST_CHECK("gpt_layout_auto_runs", run(2, flags, out) == 0)) {
        got = final_loss(out, NULL, 0);
        DT_TEST_CHECK("gpt_layout_auto_says_what_it_chose", file_has(out, "layout auto: dp "));
        dt_test_close("gpt_layout_auto_trains_the_one_rank_model", got, ref, 1e-4 * fabs(ref));
    }
    /* --sample runs at pp 1 and cp 1 only: --layout auto keeps to those */
    snprintf(flags, sizeof flags, "%s --layout auto --plan-profile %s --sample 8", MODEL, prof);
    if (!lean)
        DT_TEST_CHECK("gpt_layout_auto_with_sample_keeps_to_pp1_cp1",
                      run(2, flags, out) == 0 && file_has(out, "pp 1 cp 1, ") && file_has(out, "final: loss"));
    /* a profile of 2 ranks for a run of 1; what the planner does not model; a bad value */
    snprintf(flags, sizeof flags, "--plan --plan-profile %s", prof);
    gd_named_error("gpt_plan_profile_of_another_world_is_named", 1, MODEL, flags, "was measured for 2 ranks");
    gd_named_error("gpt_plan_of_f16_is_named", 1, MODEL, "--plan --dtype f16", "the planner models the CPU in f32 or bf16");
    gd_named_error("gpt_layout_bad_value_is_named", 1, MODEL, "--layout fast", "--layout is auto");
    /* a layout flag beside --layout auto would be replaced without a word */
    gd_named_error("gpt_layout_auto_with_tp_is_named", 2, MODEL, "--layout auto --tp 2", "--layout auto chooses the layout "
                   "itself (tp, pp, cp, zero, sp, micro, recompute, ep, schedule, offload): drop --tp");
    gd_named_error("gpt_moe_every_past_the_layers_is_named", 1, MODEL, "--moe-experts 4 --moe-every 9",
                   "no block would be MoE");
    if (!lean) cuda_plan_ulysses_memory(); /* 11 s of emulated CUDA runs */
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
}
