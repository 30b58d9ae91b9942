// mpi-driver
/* tests/mpi_dlrm.c - examples/dlrm at 1 to 4 ranks trains the same model: the per-step losses of
   20 steps at np 2, 3 and 4 equal the np-1 run's within fp32 reassociation (the embeddings are
   exact by construction; the dense all-reduce sums in another order than one process does: an
   fp32 bound per step, see step_bound), for
   DLRM with a mixed plan (row-wise, table-wise, data-parallel tables), for DCNv2, and with
   gradient accumulation; a resumed run continues bitwise (same np) or within the same tolerance
   (saved at np 4, resumed at np 2); on hosts modelled (--host-size 2) the all-to-alls in two
   levels (--hier on) change nothing (hosts_modelled); a malformed TSV line is a named error naming file, line
   and field, and --skip-bad counts it.

   Run directly (not under mpirun): it starts $DT_MPIRUN -np N build/examples/dlrm itself and
   reads the JSON-lines metrics each run writes. build/examples/dlrm comes from ./build.sh. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 20
/* The dense grads are summed over ranks in rank order, one process sums its whole batch in GEMM
   order (and the BLAS picks its own blocking: OPENBLAS_CORETYPE, the thread count, even the
   buffers' alignment): fp32 reassociation; the embedding tables add nothing (exact). A sum of K
   fp32 terms in any order is within K u sum|terms| (u = 2^-24); the longest sums here are the
   top MLP's input (27 x 26 / 2 pairwise dots + the dense vector, < 512 terms) and the batch
   mean (256); a step chains at most 10 of them (bottom MLP 2, cross layers 3, interaction, top
   MLP 3, loss), whose relative errors add to first order; each step adds its own: step t's
   loss is within t x 10 x 512 x u relative. */
#define DLRM_K 512
#define DLRM_DEPTH 10
static double step_bound(int t) { return (double)t * DLRM_DEPTH * DLRM_K * 5.9604644775390625e-8; }

static const char *DLRM = "build/examples/dlrm";

/* Runs the command; 0 when it exited 0. Its output goes to `out` (a file). */
static int run(const char *cmd, const char *out) {
    char full[4096];
    snprintf(full, sizeof full, "%s > %s 2>&1 < /dev/null", cmd, out);
    return system(full);
}

/* The losses of steps 1..n from a metrics file (one JSON line per step, "loss" field). */
static int losses(const char *path, double *out, int n) {
    FILE *fp = fopen(path, "r");
    char line[4096];
    int k = 0;
    if (!fp) return 0;
    while (k < n && fgets(line, sizeof line, fp)) {
        const char *p = strstr(line, "\"loss\":");
        if (p) out[k++] = strtod(p + 7, NULL);
    }
    fclose(fp);
    return k;
}

/* Trains with `flags` at np 1..4 and checks every step's loss against np 1. */
static void equal_at_every_np(const char *name, const char *flags) {
    double ref[STEPS], got[STEPS];
    char cmd[2048], log[512], out[512], check[160];
    int np, s;
    const char *tmp = dt_test_tmpdir();
    for (np = 1; np <= (dt_test_short_run() ? 2 : 4); np++) {
        double worst = 0;
        int worst_step = 0, n;
        snprintf(log, sizeof log, "%s/%s_np%d.jsonl", tmp, name, np);
        snprintf(out, sizeof out, "%s/%s_np%d.out", tmp, name, np);
        snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s --steps %d --seed 7 --batch 256 --quiet "
                 "--print-every 1 --eval-every 1000 --eval-samples 512 --log %s %s", dt_test_mpirun(), np, DLRM, STEPS, log, flags);
        snprintf(check, sizeof check, "%s_np%d_runs", name, np);
        if (!DT_TEST_CHECK(check, run(cmd, out) == 0)) { fprintf(stderr, "  command: %s (output in %s)\n", cmd, out); continue; }
        n = losses(log, np == 1 ? ref : got, STEPS);
        snprintf(check, sizeof check, "%s_np%d_logs_every_step", name, np);
        if (!dt_test_expect(check, n == STEPS, "%d loss lines in %s, expected %d", n, log, STEPS)) continue;
        if (np == 1) continue;
        for (s = 0; s < STEPS; s++) { /* worst in units of its step's bound */
            double rel = fabs(got[s] - ref[s]) / fabs(ref[s]);
            if (!(rel / step_bound(s + 1) <= worst)) { worst = rel / step_bound(s + 1); worst_step = s; }
        }
        snprintf(check, sizeof check, "%s_np%d_losses_equal_np1", name, np);
        dt_test_expect(check, worst <= 1, "step %d: np %d loss %.9g, np 1 loss %.9g (relative %.3g > bound %.3g)",
                      worst_step + 1, np, got[worst_step], ref[worst_step], worst * step_bound(worst_step + 1),
                      step_bound(worst_step + 1));
        if (worst > 0) printf("  %s np %d: largest loss difference %.3g of its bound (step %d)\n", name, np, worst, worst_step + 1);
    }
}

/* 10 steps straight vs 5 steps + checkpoint + --resume for 5 more: the last loss. */
static void resume_continues(const char *name, int np_save, int np_resume, double tol) {
    char cmd[2048], out[512], log[512], dir[512], check[160];
    double straight[10], resumed[10];
    int n;
    const char *tmp = dt_test_tmpdir();
    snprintf(dir, sizeof dir, "%s/ckpt_%s", tmp, name);
    snprintf(log, sizeof log, "%s/%s_straight.jsonl", tmp, name);
    snprintf(out, sizeof out, "%s/%s_straight.out", tmp, name);
    snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s --steps 10 --seed 3 --batch 128 --quiet "
             "--print-every 1 --eval-every 1000 --eval-samples 256 --log %s", dt_test_mpirun(), np_save, DLRM, log);
    if (!DT_TEST_CHECK("dlrm_straight_run_for_resume", run(cmd, out) == 0)) return;
    n = losses(log, straight, 10);
    snprintf(log, sizeof log, "%s/%s_resumed.jsonl", tmp, name);
    snprintf(out, sizeof out, "%s/%s_first.out", tmp, name);
    snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s --steps 5 --seed 3 --batch 128 --quiet "
             "--print-every 1 --eval-every 1000 --eval-samples 256 --ckpt %s --ckpt-every 5", dt_test_mpirun(), np_save,
             DLRM, dir);
    snprintf(check, sizeof check, "%s_first_half_saves", name);
    if (!DT_TEST_CHECK(check, run(cmd, out) == 0)) return;
    snprintf(out, sizeof out, "%s/%s_second.out", tmp, name);
    snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s --steps 10 --seed 3 --batch 128 --quiet "
             "--print-every 1 --eval-every 1000 --eval-samples 256 --ckpt %s --resume --log %s", dt_test_mpirun(), np_resume,
             DLRM, dir, log);
    snprintf(check, sizeof check, "%s_second_half_resumes", name);
    if (!dt_test_expect(check, run(cmd, out) == 0, "see %s", out)) return;
    snprintf(check, sizeof check, "%s_continues_the_straight_run", name);
    if (losses(log, resumed, 5) != 5 || n != 10) { dt_test_fail(check, "missing loss lines"); return; }
    {
        double rel = fabs(resumed[4] - straight[9]) / fabs(straight[9]);
        if (tol == 0)
            dt_test_expect(check, memcmp(&resumed[4], &straight[9], sizeof(double)) == 0,
                          "step 10 resumed %.9g, straight %.9g (expected bitwise)", resumed[4], straight[9]);
        else
            dt_test_expect(check, rel <= tol, "step 10 resumed %.9g, straight %.9g (relative %.3g > %g)", resumed[4],
                          straight[9], rel, tol);
    }
}

/* Hosts modelled (--host-size 2 at np 4): the embedding's all-to-alls in two levels (--hier on:
   every one, as the end's line says; off: none) move the same rows, so every logged loss is
   bitwise the same as with auto (both sum the dense grads host by host) and, with --hier off
   (rank order), bitwise the plain 4-rank run's; on against off differs only by the dense sum's
   order: within the per-step fp32 bound. */
static void hosts_modelled(void) {
    static const char *modes[4] = {"on", "auto", "off", "plain"};
    double l[4][STEPS];
    char cmd[2048], log[512], out[4][512], check[160], want[64];
    int k, s, n[4];
    const char *tmp = dt_test_tmpdir();
    for (k = 0; k < 4; k++) {
        char extra[64] = "";
        if (k < 3) snprintf(extra, sizeof extra, "--host-size 2 --hier %s", modes[k]);
        snprintf(log, sizeof log, "%s/hosts_%s.jsonl", tmp, modes[k]);
        snprintf(out[k], sizeof out[k], "%s/hosts_%s.out", tmp, modes[k]);
        snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np 4 %s --steps %d --seed 7 --batch 256 --print-every 0 "
                 "--eval-every 1000 --eval-samples 512 --rows 100000 --row-wise-over 50000 --log %s %s", dt_test_mpirun(),
                 DLRM, STEPS, log, extra);
        snprintf(check, sizeof check, "dlrm_hosts_hier_%s_runs", modes[k]);
        if (!DT_TEST_CHECK(check, run(cmd, out[k]) == 0)) { fprintf(stderr, "  command: %s (output in %s)\n", cmd, out[k]); return; }
        n[k] = losses(log, l[k], STEPS);
    }
    for (k = 0; k < 3; k += 2) { /* the end's line: every all-to-all in two levels with on, none with off */
        FILE *fp = fopen(out[k], "r");
        char line[512];
        long long a = -1, b = -2;
        while (fp && fgets(line, sizeof line, fp))
            if (sscanf(line, "all-to-alls across 2 hosts x 2 ranks: %lld of %lld", &a, &b) == 2) break;
        if (fp) fclose(fp);
        snprintf(want, sizeof want, k == 0 ? "all %lld" : "none of %lld", b);
        snprintf(check, sizeof check, "dlrm_hosts_hier_%s_says_how_its_all_to_alls_went", modes[k]);
        dt_test_expect(check, b > 0 && a == (k == 0 ? b : 0), "%lld of %lld in two levels, want %s (%s)", a, b, want, out[k]);
    }
    for (s = 0; s < STEPS && n[0] == STEPS && n[1] == STEPS && l[0][s] == l[1][s]; s++) {}
    dt_test_expect("dlrm_hosts_hier_on_bitwise_equals_auto", s == STEPS, "step %d: on %.9g, auto %.9g (%d, %d lines)",
                   s + 1, s < STEPS ? l[0][s] : 0, s < STEPS ? l[1][s] : 0, n[0], n[1]);
    for (s = 0; s < STEPS && n[2] == STEPS && n[3] == STEPS && l[2][s] == l[3][s]; s++) {}
    dt_test_expect("dlrm_hosts_hier_off_bitwise_equals_one_host", s == STEPS, "step %d: off %.9g, one host %.9g",
                   s + 1, s < STEPS ? l[2][s] : 0, s < STEPS ? l[3][s] : 0);
    for (s = 0; s < STEPS && n[0] == STEPS && fabs(l[0][s] - l[2][s]) <= step_bound(s + 1) * fabs(l[2][s]); s++) {}
    dt_test_expect("dlrm_hosts_hier_on_equals_off_within_fp32", s == STEPS, "step %d: on %.9g, off %.9g (bound %.3g "
                   "relative)", s + 1, s < STEPS ? l[0][s] : 0, s < STEPS ? l[2][s] : 0, step_bound(s + 1));
}

/* A TSV with one malformed line: a named error by default, counted and skipped with --skip-bad. */
static void tsv_errors(void) {
    char path[512], cmd[2048], out[512], text[4096];
    FILE *fp;
    int i, f;
    const char *tmp = dt_test_tmpdir();
    snprintf(path, sizeof path, "%s/small.tsv", tmp);
    fp = fopen(path, "w");
    if (!fp) { dt_test_fail("dlrm_tsv_written", "cannot write %s", path); return; }
    for (i = 0; i < 700; i++) {
        fprintf(fp, "%d", i % 4 == 0);
        for (f = 0; f < 13; f++) fprintf(fp, "\t%d", (i * 7 + f) % 50);
        for (f = 0; f < 26; f++) fprintf(fp, "\t%x", (unsigned)((i * 31 + f * 17) % 997));
        fprintf(fp, "\n");
        if (i == 300) fprintf(fp, "1\t2\t3\tnot-a-number\n"); /* line 302 */
    }
    fclose(fp);
    snprintf(out, sizeof out, "%s/tsv_strict.out", tmp);
    snprintf(cmd, sizeof cmd, "%s --data %s --steps 2 --batch 64 --eval-samples 128 --quiet", DLRM, path);
    dt_test_expect("dlrm_malformed_tsv_line_fails", run(cmd, out) != 0, "the run succeeded on a malformed file");
    fp = fopen(out, "r");
    text[0] = 0;
    if (fp) { size_t k = fread(text, 1, sizeof text - 1, fp); text[k] = 0; fclose(fp); }
    dt_test_expect("dlrm_malformed_tsv_line_is_named", strstr(text, "line 302") && strstr(text, "small.tsv"),
                  "the error does not name file and line 302: %.300s", text);
    snprintf(out, sizeof out, "%s/tsv_skip.out", tmp);
    snprintf(cmd, sizeof cmd, "%s --data %s --steps 2 --batch 64 --eval-samples 128 --skip-bad", DLRM, path);
    dt_test_expect("dlrm_skip_bad_trains", run(cmd, out) == 0, "see %s", out);
    fp = fopen(out, "r");
    text[0] = 0;
    if (fp) { size_t k = fread(text, 1, sizeof text - 1, fp); text[k] = 0; fclose(fp); }
    dt_test_expect("dlrm_skip_bad_counts_the_line", strstr(text, "1 lines skipped") != NULL && strstr(text, "final: loss"),
                  "no '1 lines skipped' and final line in: %.300s", text);
}

int main(void) {
    FILE *fp = fopen(DLRM, "rb");
    if (!fp) {
        dt_test_fail("dlrm_built", "%s is missing: run ./build.sh", DLRM);
        return dt_test_finish();
    }
    fclose(fp);
    equal_at_every_np("dlrm_mixed_plan", "--rows 100000 --row-wise-over 50000");
    equal_at_every_np("dcn", "--arch dcn --rows 4096");
    equal_at_every_np("dlrm_accum2_sgd", "--accum 2 --opt sgd --rows 4096");
    hosts_modelled();
    if (dt_test_short_run()) return dt_test_finish();
    resume_continues("dlrm_resume_same_np", 2, 2, 0);
    resume_continues("dlrm_resume_np4_to_np2", 4, 2, step_bound(10));
    tsv_errors();
    return dt_test_finish();
}
