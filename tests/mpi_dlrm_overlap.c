// mpi-driver
/* tests/mpi_dlrm_overlap.c - examples/dlrm --overlap 1 (the next batch's id exchange posted
   during this batch's dense forward and backward, dt_embed_progress between layers) gives the
   losses of --overlap 0 bit for bit, as logged (%.9g, which prints any two different f32 losses
   differently), at np 2 and 4: a mixed plan (row-wise, table-wise and data-parallel tables,
   whose lookups move to the end when begun ahead), gradient accumulation (a batch begun ahead
   of a backward that only accumulates) and evaluation steps between (no batch begun across
   them). --overlap 2 is refused.

   Run directly (not under mpirun): it starts $DT_MPIRUN -np N build/examples/dlrm itself and
   reads the JSON-lines metrics each run writes. build/examples/dlrm comes from ./build.sh. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 10

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

/* --overlap 1 against --overlap 0 at np 2 and 4: every step's logged loss equal. */
static void overlap_equal(const char *name, const char *flags) {
    double a[STEPS], b[STEPS];
    char cmd[2048], log[512], out[512], check[160];
    int np, ov, s, n[2] = {0, 0};
    const char *tmp = dt_test_tmpdir();
    for (np = 2; np <= (dt_test_short_run() ? 2 : 4); np += 2) {
        for (ov = 0; ov < 2; ov++) {
            snprintf(log, sizeof log, "%s/%s_np%d_ov%d.jsonl", tmp, name, np, ov);
            snprintf(out, sizeof out, "%s/%s_np%d_ov%d.out", tmp, name, np, ov);
            snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s --steps %d --seed 5 --batch 256 --quiet "
                     "--print-every 1 --eval-samples 256 --log %s --overlap %d %s", dt_test_mpirun(), np, DLRM, STEPS, log, ov,
                     flags);
            snprintf(check, sizeof check, "%s_np%d_overlap%d_runs", name, np, ov);
            if (!DT_TEST_CHECK(check, run(cmd, out) == 0)) { fprintf(stderr, "  command: %s (output in %s)\n", cmd, out); return; }
            n[ov] = losses(log, ov ? b : a, STEPS);
        }
        snprintf(check, sizeof check, "%s_np%d_losses_bitwise_equal_without_overlap", name, np);
        for (s = 0; s < STEPS && n[0] == STEPS && n[1] == STEPS && a[s] == b[s]; s++) {}
        dt_test_expect(check, s == STEPS, "%d / %d loss lines; step %d: --overlap 1 loss %.9g, --overlap 0 %.9g", n[1], n[0],
               s + 1, s < STEPS ? b[s] : 0, s < STEPS ? a[s] : 0);
    }
}

int main(void) {
    char cmd[1024], out[512];
    FILE *fp = fopen(DLRM, "rb");
    if (!fp) {
        dt_test_fail("dlrm_built", "%s is missing: run ./build.sh", DLRM);
        return dt_test_finish();
    }
    fclose(fp);
    /* steps 3, 6, 9 evaluate; accumulation over 2 micro-batches */
    overlap_equal("dlrm_overlap_mixed_plan_accum2", "--rows 100000 --row-wise-over 50000 --accum 2 --eval-every 3");
    snprintf(out, sizeof out, "%s/overlap_bad.out", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s --steps 1 --overlap 2", DLRM);
    dt_test_expect("dlrm_overlap_2_is_refused", run(cmd, out) != 0, "--overlap 2 ran; see %s", out);
    return dt_test_finish();
}
