// mpi-driver
/* tests/mpi_gpt.c - examples/gpt trains the same model under every layout: 5 steps of a tiny
   GPT (2 layers, width 32, 4 heads, context 16, batch 8, fp32, seed 3) at np 1 and at
   (dp, tp) = (2,1) (1,2) (2,2) (4,1) (1,4), each with ZeRO 0-3, with and without sequence
   parallelism, with full and selective recompute and with 2 micro-batches, match the np-1 run:
   the loss of every step and the grad norm of step 1 within fp32 bounds, and (every run saves a
   checkpoint at its end, read back whole through dt_checkpoint_load's resharding) every weight
   within Adam's per-element bound (both derived in tests/gpt_driver.h). A run stopped at step 3
   (tp 2, np 2) resumes at tp 1 x dp 2 and at np 1 to the straight run's loss and weights within
   those bounds, and bitwise at its own layout. Bad layouts
   and bad data exit 1 with a message naming the problem. The PyTorch peer (bench/gpt.py
   --check), a GPT-2 written from its definition, gives the loss dt computed from the same
   weights and tokens, and from them one AdamW step lands on dt's next weights (SKIP without
   torch). --dtype bf16 trains within bf16 of fp32, and its layouts agree (bf16_checks).

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

/* The runs differ by fp32 reassociation only (tp splits GEMM inner sums and the softmax's
   sums, dp sums grads in another order): tests/gpt_driver.h derives the bounds. */
#define BATCH 8 /* TINY's --batch */
#define L 2
#define C 32
#define VP 256
#define TCTX 16

static const char *TINY = "--seed 3 --quiet --layers 2 --width 32 --heads 4 --seq 16 --batch 8";

#include "gpt_driver.h"

static const gpt_shape SHAPE = {L, C, VP, TCTX, 0}; /* the model TINY asks for */

/* ---------------------------------------------------------------- parallel equivalence */

static double ref_loss, ref_wbound; /* np 1's final loss and Adam's per-element bound from its lr */
static dt_params ref_w;
static char ref_log[512];            /* np 1's --log */

/* One run at (dp, tp) with extra flags: its final loss and weights against np 1's. */
static void equal_to_np1(int dp, int tp, const char *extra, int check_weights) {
    char name[256], flags[2048], out[512], dir[512], tag[200], log[512];
    const char *tmp = dt_test_tmpdir(), *which;
    double worst, diff;
    int i, k = 0;
    dt_params w;
    snprintf(tag, sizeof tag, "dp%d_tp%d%s", dp, tp, extra);
    for (i = 0; tag[i]; i++) /* "--zero 1 --sp 1" -> "_zero_1_sp_1" */
        if (tag[i] != '-') tag[k++] = tag[i] == ' ' ? '_' : tag[i];
    tag[k] = 0;
    snprintf(out, sizeof out, "%s/%s.out", tmp, tag);
    snprintf(dir, sizeof dir, "%s/ckpt_%s", tmp, tag);
    snprintf(log, sizeof log, "%s/%s.jsonl", tmp, tag);
    snprintf(flags, sizeof flags, "%s --steps 5 --tp %d %s --ckpt %s --log %s", TINY, tp, extra, dir, log);
    snprintf(name, sizeof name, "gpt_%s_runs", tag);
    if (!dt_test_expect(name, run(dp * tp, flags, out) == 0, "np %d: gpt %s failed (output in %s)", dp * tp, flags, out)) return;
    snprintf(name, sizeof name, "gpt_%s", tag);
    compare_logs(name, log, ref_log, SHAPE, BATCH);
    if (!check_weights) return;
    snprintf(name, sizeof name, "gpt_%s_weights_equal_np1", tag);
    if (!dt_test_expect(name, load_weights(&w, dir, SHAPE), "checkpoint %s does not load", dir)) return;
    worst = weights_worst(&w, &ref_w, ref_wbound, &which, &diff);
    dt_test_expect(name, worst <= 1, "an element of %s differs from np 1's by %.3g (> Adam's bound %.3g)", which, diff, ref_wbound);
    dt_params_free(&g_ctx, &w);
}

/* ---------------------------------------------------------------- --dtype bf16

   The linears multiply bf16 (x, dout rounded on the way in) and add in f32 (dt_linear's bf16
   GEMMs: AMX where the CPU has it, else f32 GEMMs of the rounded values). Against fp32 (the
   reference above) every step's loss is within 2^-9 relative, one bf16 rounding of the loss
   (measured: 1.2e-4 at worst, step 2). The layouts and the other way of multiplying (the f32
   fallback, DT_CPU_BF16=f32) against the bf16 run at np 1: the same products, the f32 sums in
   another order, but an input that lands the other side of a bf16 rounding moves by 2^-8: within
   1e-4 relative (measured: 4.4e-7 at tp 2, 3.6e-6 for the fallback, dp 2 and pp 2 the same
   digits). */
static void bf16_checks(void) {
    char flags[2048], out[512], log[512], ref[512], name[160];
    double want[8], got[8], f32[8], worst;
    int n, nr, nf, s, k;
    static const struct { int np; const char *extra, *tag; } runs[] = {
        {1, "", "fallback"}, {2, "--tp 2 --sp 1", "tp2_sp"}, {2, "--zero 1", "dp2_zero1"}, {2, "--pp 2", "pp2"}};
    snprintf(ref, sizeof ref, "%s/bf16_np1.jsonl", dt_test_tmpdir());
    snprintf(out, sizeof out, "%s/bf16_np1.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "%s --steps 5 --dtype bf16 --log %s", TINY, ref);
    if (!dt_test_expect("gpt_bf16_np1_runs", run(1, flags, out) == 0, "gpt %s failed (output in %s)", flags, out)) return;
    nr = log_values(ref, "loss", want, 8);
    nf = log_values(ref_log, "loss", f32, 8);
    for (worst = 0, s = 0; s < nr && s < nf; s++)
        if (fabs(want[s] - f32[s]) / fabs(f32[s]) > worst || want[s] != want[s]) worst = want[s] != want[s] ? INFINITY : fabs(want[s] - f32[s]) / fabs(f32[s]);
    dt_test_expect("gpt_bf16_losses_within_bf16_of_fp32", nr == 5 && nf == 5 && worst <= ldexp(1.0, -9),
                   "%d and %d steps logged; worst relative difference %.3g (bound 2^-9 = %.3g); step 2: bf16 %.9g, "
                   "fp32 %.9g", nr, nf, worst, ldexp(1.0, -9), nr > 1 ? want[1] : NAN, nf > 1 ? f32[1] : NAN);
    for (k = 0; k < (int)(sizeof runs / sizeof runs[0]); k++) {
        snprintf(log, sizeof log, "%s/bf16_%s.jsonl", dt_test_tmpdir(), runs[k].tag);
        snprintf(out, sizeof out, "%s/bf16_%s.out", dt_test_tmpdir(), runs[k].tag);
        snprintf(flags, sizeof flags, "%s --steps 5 --dtype bf16 %s --log %s", TINY, runs[k].extra, log);
        snprintf(name, sizeof name, "gpt_bf16_%s_losses_equal_np1", runs[k].tag);
        if (!k) setenv("DT_CPU_BF16", "f32", 1);
        s = run(runs[k].np, flags, out);
        if (!k) unsetenv("DT_CPU_BF16");
        if (s != 0) { dt_test_fail(name, "np %d: gpt %s failed (output in %s)", runs[k].np, flags, out); continue; }
        n = log_values(log, "loss", got, 8);
        for (worst = 0, s = 0; s < n && s < nr; s++)
            if (fabs(got[s] - want[s]) / fabs(want[s]) > worst || got[s] != got[s]) worst = got[s] != got[s] ? INFINITY : fabs(got[s] - want[s]) / fabs(want[s]);
        dt_test_expect(name, n == nr && worst <= 1e-4, "%d steps logged (np 1: %d); worst relative difference %.3g (bound "
                       "1e-4); last: %.9g, np 1 %.9g", n, nr, worst, n ? got[n - 1] : NAN, nr ? want[nr - 1] : NAN);
    }
    /* --stochastic-rounding 1: ZeRO 1's shards round each element as np 1 rounds the whole tensor
       (the bits are a function of seed, step, name and the element's global index). Measured:
       2.8e-6 relative at worst; a shard rounding with its local index (a planted bug) 4.5e-5;
       rounding to nearest instead 9.6e-5. Bound 2e-5. */
    {
        static const char *const sr_runs[2][2] = {{"", "bf16_sr_np1"}, {"--zero 1", "bf16_sr_dp2_zero1"}};
        double sr_ref[8];
        int n_ref = 0;
        for (k = 0; k < 2; k++) {
            snprintf(log, sizeof log, "%s/%s.jsonl", dt_test_tmpdir(), sr_runs[k][1]);
            snprintf(out, sizeof out, "%s/%s.out", dt_test_tmpdir(), sr_runs[k][1]);
            snprintf(flags, sizeof flags, "%s --steps 5 --dtype bf16 --stochastic-rounding 1 %s --log %s", TINY,
                     sr_runs[k][0], log);
            snprintf(name, sizeof name, "gpt_%s_runs", sr_runs[k][1]);
            if (!dt_test_expect(name, run(k + 1, flags, out) == 0, "np %d: gpt %s failed (output in %s)", k + 1, flags, out))
                return;
            if (!k) { n_ref = log_values(log, "loss", sr_ref, 8); continue; }
            n = log_values(log, "loss", got, 8);
            for (worst = 0, s = 0; s < n && s < n_ref; s++)
                if (!(fabs(got[s] - sr_ref[s]) / fabs(sr_ref[s]) <= worst)) worst = fabs(got[s] - sr_ref[s]) / fabs(sr_ref[s]);
            dt_test_expect("gpt_bf16_sr_dp2_zero1_losses_equal_np1", n == n_ref && n == 5 && worst <= 2e-5,
                           "%d steps logged (np 1: %d); worst relative difference %.3g (bound 2e-5); last %.9g, np 1 %.9g",
                           n, n_ref, worst, n ? got[n - 1] : NAN, n_ref ? sr_ref[n_ref - 1] : NAN);
        }
    }
}

/* ---------------------------------------------------------------- resume */

static void resume_checks(void) {
    char flags[2048], out[512], dir[512], dir2[512], text[64], text_ref[64];
    const char *tmp = dt_test_tmpdir(), *which;
    double straight, got, rel, diff;
    dt_params w_straight, w;
    int np;
    /* straight: 5 steps at tp 2 np 2 */
    snprintf(dir, sizeof dir, "%s/resume_straight", tmp);
    snprintf(out, sizeof out, "%s/resume_straight.out", tmp);
    snprintf(flags, sizeof flags, "%s --steps 5 --tp 2 --ckpt %s", TINY, dir);
    if (!DT_TEST_CHECK("gpt_resume_straight_run", run(2, flags, out) == 0)) return;
    straight = final_loss(out, text_ref, sizeof text_ref);
    if (!load_weights(&w_straight, dir, SHAPE)) return;
    /* stopped at 3 at tp 2, resumed at tp 2 np 2 (bitwise), tp 1 dp 2, np 1 (within the bounds) */
    for (np = 0; np < 3; np++) {
        static const char *how[3] = {"--tp 2", "--tp 1", "--tp 1"};
        static const int nps[3] = {2, 2, 1};
        static const char *names[3] = {"tp2_np2", "tp1_dp2", "np1"};
        char name[160];
        snprintf(dir2, sizeof dir2, "%s/resume_%s", tmp, names[np]);
        snprintf(out, sizeof out, "%s/resume_first_%s.out", tmp, names[np]);
        snprintf(flags, sizeof flags, "%s --steps 5 --stop-at 3 --tp 2 --ckpt %s", TINY, dir2);
        snprintf(name, sizeof name, "gpt_resume_%s_first_part_stops_at_3", names[np]);
        if (!dt_test_expect(name, run(2, flags, out) == 0, "output in %s", out)) continue;
        snprintf(out, sizeof out, "%s/resume_second_%s.out", tmp, names[np]);
        snprintf(flags, sizeof flags, "%s --steps 5 --resume %s --ckpt %s", TINY, how[np], dir2);
        snprintf(name, sizeof name, "gpt_resume_saved_tp2_np2_resumed_%s_runs", names[np]);
        if (!dt_test_expect(name, run(nps[np], flags, out) == 0, "output in %s", out)) continue;
        got = final_loss(out, text, sizeof text);
        if (np == 0) {
            snprintf(name, sizeof name, "gpt_resume_same_layout_bitwise_loss");
            dt_test_expect(name, !strcmp(text, text_ref) && text[0], "resumed final loss '%s', straight '%s'", text, text_ref);
        } else {
            rel = fabs(got - straight) / fabs(straight);
            snprintf(name, sizeof name, "gpt_resume_saved_tp2_np2_resumed_%s_loss", names[np]);
            dt_test_expect(name, rel <= loss_bound(SHAPE, BATCH, 5), "final loss %.9g, straight run %.9g (relative %.3g > "
                           "bound %.3g)", got, straight, rel, loss_bound(SHAPE, BATCH, 5));
        }
        if (!load_weights(&w, dir2, SHAPE)) continue;
        /* bitwise at its own layout (a bound of 0 makes any difference infinite) */
        rel = weights_worst(&w, &w_straight, np == 0 ? 0 : ref_wbound, &which, &diff);
        snprintf(name, sizeof name, "gpt_resume_saved_tp2_np2_resumed_%s_weights%s", names[np], np == 0 ? "_bitwise" : "");
        dt_test_expect(name, np == 0 ? rel == 0 : rel <= 1, "an element of %s differs from the straight run's by %.3g "
                       "(bound %.3g)", which, diff, np == 0 ? 0 : ref_wbound);
        dt_params_free(&g_ctx, &w);
    }
    dt_params_free(&g_ctx, &w_straight);
    /* a checkpoint of another model: fewer layers would load the first ones, other heads split the
       same qkv another way; both named (the checkpoint keeps its "model" key) */
    snprintf(flags, sizeof flags, "--steps 6 --resume --ckpt %s --layers 1", dir);
    gd_named_error("gpt_resume_other_layers_named", 1, TINY, flags, "was trained with layers 2 heads 4");
    snprintf(flags, sizeof flags, "--steps 6 --resume --ckpt %s --heads 2", dir);
    gd_named_error("gpt_resume_other_heads_named", 1, TINY, flags, "this run asks for layers 2 heads 2");
}

/* ---------------------------------------------------------------- bad input */

static void named_error(const char *name, int np, const char *flags, const char *needle) {
    gd_named_error(name, np, TINY, flags, needle);
}

static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count, int body_tokens, uint16_t tok) {
    int32_t h[256];
    int i;
    FILE *fp = fopen(path, "wb");
    memset(h, 0, sizeof h);
    h[0] = magic; h[1] = version; h[2] = count;
    fwrite(h, sizeof h, 1, fp);
    for (i = 0; i < body_tokens; i++) { uint16_t t = (uint16_t)(i == 7 ? tok : i % 50000); fwrite(&t, 2, 1, fp); }
    fclose(fp);
}

static void bad_input(void) {
    char path[512], flags[1024];
    const char *tmp = dt_test_tmpdir();
    named_error("gpt_tp_not_dividing_world_named", 2, "--tp 3", "does not divide the world size");
    named_error("gpt_tp_not_dividing_heads_named", 2, "--tp 2 --heads 3 --width 48", "does not divide --heads 3");
    named_error("gpt_tp_not_dividing_padded_vocab_named", 3, "--tp 3 --heads 3 --width 48", "does not divide the padded vocab 256");
    named_error("gpt_batch_not_dividing_dp_named", 2, "--batch 3", "--batch 3 is not a multiple of dp x micro");
    named_error("gpt_pp_with_zero3_named", 2, "--pp 2 --zero 3", "--zero 3 with --pp 2: the pipeline takes ZeRO 0 or 1");
    snprintf(path, sizeof path, "%s/bad_magic.bin", tmp);
    write_shard(path, 12345, 1, 100, 100, 1);
    snprintf(flags, sizeof flags, "--shards %s", path);
    named_error("gpt_shard_bad_magic_named", 1, flags, "has magic 12345, expected 20240520");
    snprintf(path, sizeof path, "%s/truncated.bin", tmp);
    write_shard(path, 20240520, 1, 100, 60, 1);
    snprintf(flags, sizeof flags, "--shards %s", path);
    named_error("gpt_shard_truncated_named", 1, flags, "is truncated");
    snprintf(path, sizeof path, "%s/big_token.bin", tmp);
    write_shard(path, 20240520, 1, 100, 100, 50257);
    snprintf(flags, sizeof flags, "--shards %s", path);
    named_error("gpt_shard_token_out_of_vocab_named", 1, flags, "token 7 is 50257, expected < 50257");
    snprintf(flags, sizeof flags, "--shards %s", tmp); /* a directory */
    named_error("gpt_shard_directory_named", 1, flags, "cannot read shard");
    named_error("gpt_seed_past_int64_named", 1, "--seed 9223372036854775808", "--seed wants an integer in [0, 9223372036854775807]");
    /* the paths rank 0 writes at the end are checked before the first step, on every rank */
    snprintf(path, sizeof path, "%s/a_file", tmp);
    fclose(fopen(path, "w"));
    snprintf(flags, sizeof flags, "--steps 200 --ckpt %s", path);
    named_error("gpt_ckpt_a_file_named_at_start", 2, flags, "is not a directory");
    named_error("gpt_trace_unwritable_named_at_start", 2, "--steps 200 --trace /nonexistent_dt_dir/t.json",
                "cannot write --trace /nonexistent_dt_dir/t.json");
    { /* --lr 0 is a frozen run (dt_opt reads lr 0 as its default 1e-3: gpt passes DT_OPT_ZERO) */
        char out[512], log[512];
        double lr[4];
        int n;
        snprintf(log, sizeof log, "%s/lr0.jsonl", tmp);
        snprintf(out, sizeof out, "%s/lr0.out", tmp);
        snprintf(flags, sizeof flags, "%s --steps 3 --print-every 1 --lr 0 --log %s", TINY, log);
        if (dt_test_expect("gpt_lr0_runs", run(1, flags, out) == 0, "output in %s", out)) {
            n = log_values(log, "lr", lr, 4);
            dt_test_expect("gpt_lr0_trains_at_lr_0", n == 3 && lr[0] == 0 && lr[2] == 0, "%d steps logged, lr %g .. %g",
                           n, n ? lr[0] : NAN, n ? lr[n - 1] : NAN);
        }
    }
}

/* ---------------------------------------------------------------- the timeline */

/* --trace at np 2 (tp 2, ZeRO 3): one Chrome-trace file with both ranks' compute spans and
   collectives, and the run's loss unchanged by tracing. */
static void trace_check(void) {
    char flags[1024], out[512], path[512], line[4096];
    FILE *fp;
    int ranks[2] = {0, 0}, compute = 0, comm = 0;
    snprintf(path, sizeof path, "%s/trace.json", dt_test_tmpdir());
    snprintf(out, sizeof out, "%s/trace.out", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "%s --steps 5 --tp 2 --zero 3 --trace %s", TINY, path);
    if (!dt_test_expect("gpt_trace_run", run(2, flags, out) == 0, "output in %s", out)) return;
    dt_test_expect("gpt_trace_does_not_change_the_loss", fabs(final_loss(out, NULL, 0) - ref_loss) <= loss_bound(SHAPE, BATCH, 5) * fabs(ref_loss),
           "final loss %.9g, np 1 %.9g", final_loss(out, NULL, 0), ref_loss);
    if (!dt_test_expect("gpt_trace_file_written", (fp = fopen(path, "r")) != NULL, "no %s", path)) return;
    while (fgets(line, sizeof line, fp)) {
        if (strstr(line, "\"pid\":0,")) ranks[0]++;
        if (strstr(line, "\"pid\":1,")) ranks[1]++;
        if (strstr(line, "\"name\":\"layernorm fwd\"")) compute++;
        if (strstr(line, "\"cat\":\"comm\"")) comm++;
    }
    fclose(fp);
    /* 5 steps x 2 blocks x (2 layernorms + ...) per rank: dozens of each */
    dt_test_expect("gpt_trace_holds_both_ranks_compute_and_collectives", ranks[0] > 20 && ranks[1] > 20 && compute >= 2 * 5 * 5
           && comm > 20, "events of rank 0: %d, rank 1: %d; layernorm fwd spans %d (expected >= 50); collectives %d",
           ranks[0], ranks[1], compute, comm);
}

/* ---------------------------------------------------------------- the PyTorch peer */

static void torch_peer(void) {
    char cmd[1024], out[512], line[1024];
    const char *py = "/usr/bin/python3";
    FILE *fp;
    int st, verdict = -1, same = 0, different = 0;
    if ((fp = fopen("build/peers/bin/python", "r"))) { /* the pinned peers' venv, where ./build.sh bench made it */
        fclose(fp);
        py = "build/peers/bin/python";
    }
    snprintf(out, sizeof out, "%s/torch_peer.out", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s bench/gpt.py --check --workdir %s > %s 2>&1", py, dt_test_tmpdir(), out);
    st = system(cmd);
    if ((fp = fopen(out, "r"))) {
        while (fgets(line, sizeof line, fp)) {
            if (!strncmp(line, "SKIP", 4)) verdict = 2;
            if (!strncmp(line, "check: same", 11)) same++;
            if (!strncmp(line, "check: DIFFERENT", 16)) different++;
            if (!strncmp(line, "check:", 6) || !strncmp(line, "SKIP", 4)) printf("  %s", line);
        }
        fclose(fp);
    }
    if (verdict == 2) { dt_test_skip("gpt_torch_peer_same_loss_and_update", "PyTorch not importable by %s", py); return; }
    dt_test_expect("gpt_torch_peer_same_loss_and_update", st == 0 && same == 2 && different == 0,
           "bench/gpt.py --check: exit %d, %d 'same' and %d 'DIFFERENT' lines, expected 2 and 0 (output in %s)", st,
           same, different, out);
}

int main(void) {
    char out[512], dir[512], flags[2048];
    static const int layouts[5][2] = {{2, 1}, {1, 2}, {2, 2}, {4, 1}, {1, 4}};
    int i, z, quick = dt_test_quick();
    FILE *probe = fopen(GPT, "rb");
    dt_ctx_init(&g_ctx, NULL);
    if (!probe) {
        dt_test_fail("gpt_built", "%s is missing: run ./build.sh first", GPT);
        return dt_test_finish();
    }
    fclose(probe);
    /* the reference: one process */
    snprintf(out, sizeof out, "%s/np1.out", dt_test_tmpdir());
    snprintf(dir, sizeof dir, "%s/ckpt_np1", dt_test_tmpdir());
    snprintf(ref_log, sizeof ref_log, "%s/np1.jsonl", dt_test_tmpdir());
    snprintf(flags, sizeof flags, "%s --steps 5 --ckpt %s --log %s", TINY, dir, ref_log);
    if (!DT_TEST_CHECK("gpt_np1_reference_runs", run(1, flags, out) == 0)) return dt_test_finish();
    ref_loss = final_loss(out, NULL, 0);
    ref_wbound = weight_bound_of(ref_log);
    if (!dt_test_expect("gpt_np1_prints_final_loss", ref_loss == ref_loss && ref_loss > 0, "no 'final: loss' line in %s", out)
        || !DT_TEST_CHECK("gpt_np1_checkpoint_loads", load_weights(&ref_w, dir, SHAPE)))
        return dt_test_finish();
    printf("  np 1 final loss %.9g\n", ref_loss);
#ifdef __SANITIZE_ADDRESS__
    /* The sanitizer build instruments this driver, not build/examples/gpt (the same binary as
       the plain run's): one layout checks the driver's own code; the matrix runs in the plain build. */
    equal_to_np1(2, 2, " --zero 1 --sp 1", 1);
    bad_input();
    dt_params_free(&g_ctx, &ref_w);
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
#endif
    bf16_checks();
    for (i = 0; i < 5; i++) {
        int dp = layouts[i][0], tp = layouts[i][1];
        if (quick && dp * tp != 2) continue;
        for (z = 0; z <= 3; z++) {
            char extra[200];
            snprintf(extra, sizeof extra, " --zero %d", z);
            equal_to_np1(dp, tp, extra, 1);
            if (tp > 1) { snprintf(extra, sizeof extra, " --zero %d --sp 1", z); equal_to_np1(dp, tp, extra, 1); }
            if (z == 0 || z == 3) {
                snprintf(extra, sizeof extra, " --zero %d --recompute full", z); equal_to_np1(dp, tp, extra, 0);
                snprintf(extra, sizeof extra, " --zero %d --recompute selective%s", z, tp > 1 ? " --sp 1" : "");
                equal_to_np1(dp, tp, extra, 0);
                snprintf(extra, sizeof extra, " --zero %d --micro 2", z); equal_to_np1(dp, tp, extra, 1);
            }
        }
    }
    if (quick) { /* tests/run.sh quick: the 2-rank layouts only */
        dt_params_free(&g_ctx, &ref_w);
        dt_ctx_shutdown(&g_ctx);
        return dt_test_finish();
    }
    resume_checks();
    bad_input();
    trace_check();
    torch_peer();
    dt_params_free(&g_ctx, &ref_w);
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
}
