// mpi-driver
/* tests/mpi_dlrm_edges.c - examples/dlrm at its edges (each check below failed on the code
   before its fix):
     dlrm_empty_local_batch_*   a rank with an empty (micro-)batch (--batch 3 at np 4, --batch 8
                                --accum 4 at np 3 and 4) trains: same final loss as np 1
                                (1e-5 relative, the bar for the final line)
     dlrm_table_rows_*          20 steps at np 1 and np 4, checkpointed: every row of every
                                table agrees (SGD: tight; Adagrad: within what f32 rounding of
                                a near-zero gradient can do to Adagrad's first steps, see
                                table_rows())
   and the ones added with them further down (resume, .bin cache, --table-sizes, eval, log).

   Run directly (not under mpirun): it starts $DT_MPIRUN -np N build/examples/dlrm itself.
   build/examples/dlrm comes from ./build.sh. */
#define _POSIX_C_SOURCE 200809L
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define F 26
static const char *DLRM = "build/examples/dlrm";

static DT_TEST__PRINTF(3, 4) int expect(const char *name, int ok, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    if (ok) return dt_test_pass(name);
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dt_test_fail(name, "%s", why);
}

static const char *mpirun(void) {
    const char *m = getenv("DT_MPIRUN");
    return m && *m ? m : "mpirun --oversubscribe";
}

/* Runs `$DT_MPIRUN -np np build/examples/dlrm flags` (np 0: without mpirun); its exit status
   (0 = success), its output in `out` (a file) and, when text is not NULL, the output's first
   n - 1 bytes in text. */
static int run_dlrm(int np, const char *flags, const char *out, char *text, size_t n) {
    char cmd[4096];
    int rc;
    if (np) snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s %s > %s 2>&1 < /dev/null", mpirun(), np, DLRM, flags, out);
    else snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s %s > %s 2>&1 < /dev/null", DLRM, flags, out);
    rc = system(cmd);
    if (text) {
        FILE *fp = fopen(out, "r");
        size_t k = 0;
        if (fp) { k = fread(text, 1, n - 1, fp); fclose(fp); }
        text[k] = 0;
    }
    if (rc) fprintf(stderr, "  (exit %d) %s\n", rc, cmd);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The L of the "final: loss L auc A" line in text; NAN without one. */
static double final_loss(const char *text) {
    const char *p = strstr(text, "final: loss ");
    return p ? strtod(p + 12, NULL) : NAN;
}

static char *slurp(const char *path) {
    FILE *fp = fopen(path, "rb");
    char *s;
    long n;
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END); n = ftell(fp); fseek(fp, 0, SEEK_SET);
    s = (char *)malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, fp) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(fp);
    return s;
}

/* ---------------------------------------------------------------- empty local batches */

static void empty_local_batch(void) {
    static const char *cases[][2] = {{"--batch 3", "4"}, {"--batch 8 --accum 4", "4"}, {"--batch 8 --accum 4", "3"}};
    char flags[512], out[512], text[8192], name[160];
    const char *tmp = dt_test_tmpdir();
    int c;
    for (c = 0; c < 3; c++) {
        double ref, got;
        int np = atoi(cases[c][1]);
        snprintf(flags, sizeof flags, "%s --steps 6 --seed 5 --rows 4096 --quiet --eval-samples 64", cases[c][0]);
        snprintf(out, sizeof out, "%s/empty_np1_%d.out", tmp, c);
        if (run_dlrm(1, flags, out, text, sizeof text)) { dt_test_fail("dlrm_empty_local_batch_np1_runs", "see %s", out); continue; }
        ref = final_loss(text);
        snprintf(out, sizeof out, "%s/empty_np%d_%d.out", tmp, np, c);
        snprintf(name, sizeof name, "dlrm_empty_local_batch_runs (np %d, %s)", np, cases[c][0]);
        if (!expect(name, run_dlrm(np, flags, out, text, sizeof text) == 0, "exit non-zero: %.300s", text)) continue;
        got = final_loss(text);
        snprintf(name, sizeof name, "dlrm_empty_local_batch_final_loss_equals_np1 (np %d, %s)", np, cases[c][0]);
        expect(name, fabs(got - ref) <= 1e-5 * fabs(ref), "np %d final loss %.9g, np 1 %.9g", np, got, ref);
    }
}

/* ---------------------------------------------------------------- table rows */

/* Table `t` (C1..C26) of checkpoint directory dir (DIR/embed/step_...) as one [rows, dim] f32
   array, put together from the rank files' shards as manifest.json places them. NULL on a
   problem (a FAIL line says which). */
static float *load_table(const char *dir, const char *t, int64_t *rows, int64_t *dim) {
    char path[1024], key[128];
    char *man, *p, *end;
    float *out = NULL;
    long long g0, g1;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    man = slurp(path);
    if (!man) { dt_test_fail("dlrm_ckpt_readable", "cannot read %s", path); return NULL; }
    snprintf(key, sizeof key, "\"%s\":{", t);
    p = strstr(man, key);
    if (!p || !(p = strstr(p, "\"global_shape\":[")) || sscanf(p, "\"global_shape\":[%lld,%lld]", &g0, &g1) != 2) {
        dt_test_fail("dlrm_ckpt_readable", "%s: no global_shape for %s", path, t);
        free(man);
        return NULL;
    }
    *rows = g0; *dim = g1;
    out = (float *)calloc((size_t)(g0 * g1) + 1, sizeof(float));
    p = strstr(p, "\"shards\":[");
    end = p ? strstr(p, "}]}") : NULL; /* the end of the shard list */
    while (out && p && (p = strstr(p + 1, "{\"rank\":")) && p < end) {
        long long r, s0, s1, n0, n1, i;
        dt_ctx ctx;
        dt_st_file f;
        dt_tensor x;
        dt_tensor_desc td = {DT_DTYPE_DEFAULT};
        if (sscanf(p, "{\"rank\":%lld,\"start\":[%lld,%lld],\"shape\":[%lld,%lld]}", &r, &s0, &s1, &n0, &n1) != 5) break;
        snprintf(path, sizeof path, "%s/rank_%05lld.safetensors", dir, r);
        dt_ctx_init(&ctx, NULL);
        td.shape[0] = n0; td.shape[1] = n1; td.ndim = 2;
        if (dt_tensor_create(&ctx, &x, &td) || dt_safetensors_open(&ctx, &f, path)) {
            dt_test_fail("dlrm_ckpt_readable", "%s: %s", path, dt_ctx_error(&ctx));
            free(out); out = NULL;
        } else {
            if (dt_safetensors_read(&ctx, &f, &x, t)) {
                dt_test_fail("dlrm_ckpt_readable", "%s: %s", path, dt_ctx_error(&ctx));
                free(out); out = NULL;
            } else {
                for (i = 0; i < n0; i++) memcpy(out + (s0 + i) * g1 + s1, (float *)x.data + i * n1, (size_t)n1 * sizeof(float));
            }
            dt_safetensors_close(&ctx, &f);
            dt_tensor_free(&ctx, &x);
        }
        dt_ctx_shutdown(&ctx);
    }
    free(man);
    return out;
}

/* 20 steps at np 1 and at np `np`, the same flags, each saving its step-20 checkpoint; every
   row of every table compared. The tables' own arithmetic is exact (a row is updated by its
   owner from the same gradient sums, in the same order, whatever the sharding); what differs
   is the dense part: the ranks' MLP gradients are all-reduced in rank order, one process sums
   its whole batch in GEMM order, so the weights, and from them the gradients reaching the
   tables, differ by f32 reassociation, ~1e-7 relative, growing over the 20 steps.
   SGD: a row moves by -lr * g each step, smoothly in g, so the rows differ by about
   1e-7 * (how far they moved): |a - b| <= 1e-5 * (|a| + emb_lr) is a margin of ~100 over that.
   Adagrad: a row's first update is lr * g / (sqrt(g^2) + eps) = lr * sign(g): where a row's
   gradient is near 0 (contributions that cancel), a 1e-7 rounding difference can flip its
   sign and move the value by up to 2 * lr, and later steps (divided by the small accumulated
   sum) stay sensitive. So for Adagrad a value may differ beyond the SGD bound only where the
   accumulated squared gradient ("sum", same row) is small: sum < (1e-3)^2 * steps, i.e. the
   gradient stayed below 1e-3 (the typical element is ~1e-2). And the count of such values is
   reported. */
static void table_rows(const char *opt, int np, const char *extra) {
    char flags[1024], out[512], dir1[512], dirn[512], name[200], t[64], ts[64];
    const char *tmp = dt_test_tmpdir();
    double emb_lr = !strcmp(opt, "sgd") ? 0.1 : 0.05, worst = 0;
    long long beyond = 0, values = 0;
    int f, ok = 1, is_sgd = !strcmp(opt, "sgd");
    snprintf(dir1, sizeof dir1, "%s/rows_%s_np1", tmp, opt);
    snprintf(dirn, sizeof dirn, "%s/rows_%s_np%d", tmp, opt, np);
    snprintf(flags, sizeof flags, "--steps 20 --seed 7 --batch 256 --opt %s --quiet --eval-every 1000 --eval-samples 512 --ckpt %s %s",
             opt, dir1, extra);
    snprintf(out, sizeof out, "%s/rows_%s_np1.out", tmp, opt);
    snprintf(name, sizeof name, "dlrm_table_rows_%s_np1_runs", opt);
    if (!expect(name, run_dlrm(1, flags, out, NULL, 0) == 0, "see %s", out)) return;
    snprintf(flags, sizeof flags, "--steps 20 --seed 7 --batch 256 --opt %s --quiet --eval-every 1000 --eval-samples 512 --ckpt %s %s",
             opt, dirn, extra);
    snprintf(out, sizeof out, "%s/rows_%s_np%d.out", tmp, opt, np);
    snprintf(name, sizeof name, "dlrm_table_rows_%s_np%d_runs", opt, np);
    if (!expect(name, run_dlrm(np, flags, out, NULL, 0) == 0, "see %s", out)) return;
    strcat(dir1, "/embed/step_00000020");
    strcat(dirn, "/embed/step_00000020");
    for (f = 1; f <= F && ok; f++) {
        int64_t r1, d1, rn, dn, i;
        float *a, *b, *sa = NULL;
        snprintf(t, sizeof t, "param/embed/C%d/weight", f);
        snprintf(ts, sizeof ts, "param/embed/C%d/sum", f);
        a = load_table(dir1, t, &r1, &d1);
        b = load_table(dirn, t, &rn, &dn);
        if (!is_sgd) sa = load_table(dir1, ts, &r1, &d1);
        if (!a || !b || (!is_sgd && !sa) || r1 != rn || d1 != dn) {
            ok = 0;
            if (a && b) dt_test_fail("dlrm_table_rows_same_shape", "%s: np 1 [%lld, %lld], np %d [%lld, %lld]", t,
                                     (long long)r1, (long long)d1, np, (long long)rn, (long long)dn);
        } else {
            for (i = 0; i < r1 * d1 && ok; i++) {
                double diff = fabs((double)a[i] - (double)b[i]), bound = 1e-5 * (fabs((double)a[i]) + emb_lr);
                values++;
                if (diff / (fabs((double)a[i]) + emb_lr) > worst && diff <= bound) worst = diff / (fabs((double)a[i]) + emb_lr);
                if (diff <= bound) continue;
                if (!is_sgd && sa[i] < 1e-6 * 20) { beyond++; continue; } /* a near-zero Adagrad gradient */
                snprintf(name, sizeof name, "dlrm_table_rows_%s_np%d_equal_np1", opt, np);
                dt_test_fail(name, "%s row %lld col %lld: np 1 %.9g, np %d %.9g (|diff| %.3g > %.3g%s)", t,
                             (long long)(i / d1), (long long)(i % d1), a[i], np, b[i], diff, bound,
                             is_sgd ? "" : "; its Adagrad sum is not near 0");
                ok = 0;
            }
        }
        free(a); free(b); free(sa);
    }
    snprintf(name, sizeof name, "dlrm_table_rows_%s_np%d_equal_np1", opt, np);
    if (ok) dt_test_pass(name);
    printf("  %s np %d vs np 1: %lld table values, largest |diff| / (|w| + lr) within the bound %.3g, %lld beyond it "
           "(Adagrad, gradient near 0)\n", opt, np, values, worst, beyond);
}

int main(void) {
    FILE *fp = fopen(DLRM, "rb");
    if (!fp) {
        dt_test_fail("dlrm_built", "%s is missing: run ./build.sh", DLRM);
        return dt_test_finish();
    }
    fclose(fp);
    empty_local_batch();
    table_rows("sgd", 4, "--rows 100000 --row-wise-over 50000");
    table_rows("adagrad", 4, "--rows 100000 --row-wise-over 50000");
    return dt_test_finish();
}
