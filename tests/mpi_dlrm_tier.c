// mpi-driver
/* tests/mpi_dlrm_tier.c - examples/dlrm with tiered tables (--tier disk: each rank's shards in
   files, a cache of 2% of the rows in memory) trains exactly as with resident tables: every
   logged loss and the final AUC bit for bit (%.9g), with dt_embed_prefetch (--prefetch 1, the
   default) and without, at np 1 and 3, on a mixed plan (row-wise, table-wise, data-parallel
   tables) with gradient accumulation and evaluation steps between. A run killed with SIGKILL
   part-way resumes from its last checkpoint and logs the losses of an uninterrupted run, and no
   slow-tier file is left behind. --cache-rows 0 and --cache-rows without --tier are refused.

   Run directly (not under mpirun): it starts $DT_MPIRUN -np N build/examples/dlrm itself and
   reads the JSON-lines metrics each run writes. build/examples/dlrm comes from ./build.sh. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_test.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000; ts.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

#define STEPS 12
static const char *DLRM = "build/examples/dlrm";
static const char *FLAGS = "--rows 100000 --row-wise-over 50000 --accum 2 --eval-every 4 --eval-samples 512 --seed 5 "
                           "--batch 256 --quiet --print-every 1";

static int run(const char *cmd, const char *out) {
    char full[8192];
    snprintf(full, sizeof full, "%s > %s 2>&1 < /dev/null", cmd, out);
    return system(full);
}

/* The losses of the steps logged in a metrics file, by step number (1-based; 0 where missing). */
static int losses(const char *path, double *out, int n) {
    FILE *fp = fopen(path, "r");
    char line[4096];
    int k = 0;
    memset(out, 0, sizeof(double) * (size_t)(n + 1));
    if (!fp) return 0;
    while (fgets(line, sizeof line, fp)) {
        const char *p = strstr(line, "\"loss\":"), *q = strstr(line, "\"step\":");
        int s = q ? atoi(q + 7) : 0;
        if (p && s >= 1 && s <= n) { out[s] = strtod(p + 7, NULL); k++; }
    }
    fclose(fp);
    return k;
}

/* The "final:" line's AUC from a run's output. */
static double final_auc(const char *path) {
    FILE *fp = fopen(path, "r");
    char line[4096];
    double auc = -1;
    if (!fp) return -1;
    while (fgets(line, sizeof line, fp)) {
        const char *p = strstr(line, "final: loss");
        if (p && strstr(p, "auc ")) auc = strtod(strstr(p, "auc ") + 4, NULL);
    }
    fclose(fp);
    return auc;
}

static int tier_files_left(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *x;
    int n = 0;
    if (!d) return 0;
    while ((x = readdir(d)) != NULL) n += strstr(x->d_name, ".tier") != NULL;
    closedir(d);
    return n;
}

static void equal_to_resident(int np) {
    static const char *variants[3] = {"", "--tier disk --cache-rows 0.02 --tier-dir %s",
                                      "--tier disk --cache-rows 0.02 --prefetch 0 --tier-dir %s"};
    double l[3][STEPS + 1], auc[3];
    char cmd[4096], log[512], out[512], check[160], extra[600];
    int v, s, n[3];
    const char *tmp = dt_test_tmpdir();
    for (v = 0; v < 3; v++) {
        snprintf(extra, sizeof extra, variants[v], tmp);
        snprintf(log, sizeof log, "%s/tier_np%d_v%d.jsonl", tmp, np, v);
        snprintf(out, sizeof out, "%s/tier_np%d_v%d.out", tmp, np, v);
        snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s --steps %d %s --log %s %s", dt_test_mpirun(), np,
                 DLRM, STEPS, FLAGS, log, extra);
        snprintf(check, sizeof check, "dlrm_tier_np%d_variant%d_runs", np, v);
        if (!DT_TEST_CHECK(check, run(cmd, out) == 0)) { fprintf(stderr, "  command: %s (output in %s)\n", cmd, out); return; }
        n[v] = losses(log, l[v], STEPS);
        auc[v] = final_auc(out);
    }
    for (v = 1; v < 3; v++) {
        snprintf(check, sizeof check, "dlrm_tier_np%d_%s_losses_and_auc_bitwise_equal_resident", np,
                 v == 1 ? "prefetch" : "no_prefetch");
        for (s = 1; s <= STEPS && n[v] == STEPS && n[0] == STEPS && l[v][s] == l[0][s]; s++) {}
        dt_test_expect(check, s == STEPS + 1 && auc[v] == auc[0] && auc[0] > 0,
                       "%d / %d loss lines; step %d: tiered %.9g, resident %.9g; auc %.6f vs %.6f", n[v], n[0], s,
                       s <= STEPS ? l[v][s] : 0, s <= STEPS ? l[0][s] : 0, auc[v], auc[0]);
    }
    snprintf(check, sizeof check, "dlrm_tier_np%d_leaves_no_slow_tier_file", np);
    dt_test_expect(check, tier_files_left(tmp) == 0, "%d *.tier files in %s", tier_files_left(tmp), tmp);
}

/* SIGKILL while training (once step 6 is logged: after the checkpoint of step 4, before or
   during that of step 8, whose save first writes the changed cached rows back), then --resume
   from the last checkpoint: every step from there equals an uninterrupted run's. */
static void killed_resumes(void) {
    const char *tmp = dt_test_tmpdir();
    char cmd[4096], out[512], log[512], ref_log[512], ck[512], tdir[512], check[160];
    double a[2 * STEPS + 1], b[2 * STEPS + 1];
    int s, n;
    pid_t pid;
    snprintf(ck, sizeof ck, "%s/kill_ckpt", tmp);
    snprintf(tdir, sizeof tdir, "%s/kill_tier", tmp);
    snprintf(log, sizeof log, "%s/kill.jsonl", tmp);
    snprintf(ref_log, sizeof ref_log, "%s/kill_ref.jsonl", tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tdir);
    if (system(cmd) != 0) { dt_test_fail("dlrm_tier_kill_setup", "cannot make %s", tdir); return; }
    /* the reference: uninterrupted, 2 x STEPS steps */
    snprintf(out, sizeof out, "%s/kill_ref.out", tmp);
    snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np 2 %s --steps %d %s --log %s --tier disk --cache-rows 0.02 "
             "--tier-dir %s", dt_test_mpirun(), DLRM, 2 * STEPS, FLAGS, ref_log, tdir);
    if (!DT_TEST_CHECK("dlrm_tier_kill_reference_runs", run(cmd, out) == 0)) return;
    /* the victim: checkpoints every 4 steps; killed once its log shows step 6 */
    snprintf(out, sizeof out, "%s/kill.out", tmp);
    snprintf(cmd, sizeof cmd, "exec env OPENBLAS_NUM_THREADS=1 %s -np 2 %s --steps %d %s --log %s --tier disk --cache-rows "
             "0.02 --tier-dir %s --ckpt %s --ckpt-every 4 > %s 2>&1 < /dev/null", dt_test_mpirun(), DLRM, 2 * STEPS, FLAGS,
             log, tdir, ck, out);
    pid = fork();
    if (pid == 0) { execl("/bin/sh", "sh", "-c", cmd, (char *)NULL); _exit(127); }
    for (s = 0; s < 6000; s++) { /* up to 60 s */
        if (losses(log, a, 2 * STEPS) >= 6) break;
        sleep_ms(10);
    }
    kill(pid, SIGKILL); /* mpirun: its ranks go down with it, as a lost node's would */
    {
        int st;
        waitpid(pid, &st, 0);
    }
    (void)system("pkill -9 -f 'examples/dlrm.*kill_ckpt' >/dev/null 2>&1");
    sleep_ms(200);
    /* resume to the end */
    snprintf(out, sizeof out, "%s/kill_resume.out", tmp);
    snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np 2 %s --steps %d %s --log %s --tier disk --cache-rows 0.02 "
             "--tier-dir %s --ckpt %s --ckpt-every 4 --resume", dt_test_mpirun(), DLRM, 2 * STEPS, FLAGS, log, tdir, ck);
    if (!DT_TEST_CHECK("dlrm_tier_killed_run_resumes", run(cmd, out) == 0)) {
        fprintf(stderr, "  command: %s (output in %s)\n", cmd, out);
        return;
    }
    losses(ref_log, b, 2 * STEPS);
    n = losses(log, a, 2 * STEPS);
    for (s = 2 * STEPS; s > 4 && a[s] == b[s]; s--) {}
    snprintf(check, sizeof check, "dlrm_tier_killed_run_resumed_equals_uninterrupted");
    dt_test_expect(check, s == 4 && n >= 2 * STEPS - 4, "step %d: resumed %.9g, uninterrupted %.9g (%d lines)", s,
                   a[s], b[s], n);
    dt_test_expect("dlrm_tier_killed_run_leaves_no_slow_tier_file", tier_files_left(tdir) == 0,
                   "%d *.tier files in %s", tier_files_left(tdir), tdir);
}

int main(void) {
    char cmd[1024], out[512];
    FILE *fp = fopen(DLRM, "rb");
    if (!fp) {
        dt_test_fail("dlrm_built", "%s is missing: run ./build.sh", DLRM);
        return dt_test_finish();
    }
    fclose(fp);
    equal_to_resident(1);
    if (!dt_test_short_run()) equal_to_resident(3);
    killed_resumes();
    snprintf(out, sizeof out, "%s/tier_bad.out", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s --steps 1 --tier disk --cache-rows 0", DLRM);
    dt_test_expect("dlrm_tier_cache_rows_0_is_refused", run(cmd, out) != 0, "--cache-rows 0 ran; see %s", out);
    snprintf(cmd, sizeof cmd, "%s --steps 1 --cache-rows 100", DLRM);
    dt_test_expect("dlrm_cache_rows_without_tier_is_refused", run(cmd, out) != 0, "--cache-rows without --tier ran; "
                   "see %s", out);
    return dt_test_finish();
}
