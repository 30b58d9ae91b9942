// mpi-driver
/* tests/mpi_dlrm_edges.c - examples/dlrm at its edges (each check below failed on the code
   before its fix, except the table rows, which held: see table_rows()):
     dlrm_empty_local_batch_*   a rank with an empty (micro-)batch (--batch 3 at np 4, --batch 8
                                --accum 4 at np 3 and 4) trains: same final loss as np 1
                                (within DENSE_REL(6), the fp32 bound of tests/mpi_dlrm.c)
     dlrm_table_rows_*          np 1 and np 4 (np 2 when quick), checkpointed: every row of every
                                table agrees (SGD 20 steps: within DENSE_REL(20) (|w| + lr); Adagrad 3
                                steps: the same bound, beyond it only where the row's gradients are
                                rounding noise (sum near 0), see table_rows())
     dlrm_bin_*                 FILE.tsv.bin is reused only when converted from the same TSV
                                (size, mtime) with the same table sizes and --skip-bad; each
                                difference converts again, saying what differed
     dlrm_table_sizes_*         --table-sizes N or n1,...,n26 sets the tables' rows (the .bin's
                                header; the hashing itself: tests/dlrm_reference.py), above
                                Kaggle's cardinalities too; bad lists and a .bin of other sizes
                                are named errors (exit 2)
     dlrm_resume_*              --resume refuses another --batch, --seed or --data (exit 2,
                                both values named) and --steps below the checkpoint's; at
                                --steps = its step it says there is nothing to train and its
                                final line is the checkpoint's loss and AUC; data_cursor is
                                steps x batch; --dtype bf16 resumes bit for bit (the masters are
                                in the checkpoint), and with the other --dtype trains on, saying
                                what it took (resume_dtype_checks)
     dlrm_plan_*, dlrm_shard_plan_*   the planner (dt_plan.h >>dlrm): --plan ranks the plans and
                                prints --shard's prediction, untrained (exit 0); --shard plan trains
                                with --shard auto's losses bit for bit at np 2 and 3, logs step_s,
                                prints its peak memory; --accum, --overlap, --tier with the planner,
                                --plan-memory without it and a budget nothing fits are named (exit 2);
                                --plan-profile writes the profile, then plans from it to the same prediction
     dlrm_log_*, dlrm_steps0_*, dlrm_one_class_*   the JSON lines' auc/logloss only on steps
                                that evaluate (null on others); --steps 0 prints "final: loss
                                nan" and the model's AUC, and a line saying why the loss is nan;
                                one-class held-out labels: auc nan, a warning, training goes on,
                                the final line prints
     dlrm_lr_zero_*             --lr 0 --emb-lr 0 is a real 0 (not the default): the log says lr 0,
                                and 2 steps leave the AUC of the untrained model
     dlrm_flag_*                a bad value (trailing text, empty, nan, overflow, a list's trailing
                                comma, --table-sizes above the synthetic data's 2^31, --cross-rank
                                at the cross layers' width, --data a directory) exits 2 naming the
                                flag and the value; --cross with --arch dlrm warns; --help exits 0;
                                a .bin whose sample count overflows is named as overflowing

   Run directly (not under mpirun): it starts $DT_MPIRUN -np N build/examples/dlrm itself.
   build/examples/dlrm comes from ./build.sh. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#define F 26
static const char *DLRM = "build/examples/dlrm";

/* Runs `$DT_MPIRUN -np np build/examples/dlrm flags` (np 0: without mpirun); its exit status
   (0 = success), its output in `out` (a file) and, when text is not NULL, the output's first
   n - 1 bytes in text. */
static int run_dlrm(int np, const char *flags, const char *out, char *text, size_t n) {
    char cmd[4096];
    int rc;
    if (np) snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s %s > %s 2>&1 < /dev/null", dt_test_mpirun(), np, DLRM, flags, out);
    else snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s %s > %s 2>&1 < /dev/null", DLRM, flags, out);
    rc = system(cmd);
    if (text) {
        FILE *fp = fopen(out, "r");
        size_t k = 0;
        if (fp) { k = fread(text, 1, n - 1, fp); fclose(fp); }
        text[k] = 0;
    }
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The L of the "final: loss L auc A" line in text; NAN without one. */
static double final_loss(const char *text) {
    const char *p = strstr(text, "final: loss ");
    return p ? strtod(p + 12, NULL) : NAN;
}

/* The last 400 bytes of a run's output (its first lines are the plan) for a FAIL line. */
#define TAIL(t) ((t) + (strlen(t) > 400 ? strlen(t) - 400 : 0))

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

/* The relative fp32 bound on the dense part after t steps (tests/mpi_dlrm.c's step_bound): sums
   of at most 512 terms, 10 chained per step, u = 2^-24. */
#define DENSE_REL(t) ((double)(t) * 10 * 512 * 5.9604644775390625e-8)

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
        if (!dt_test_expect(name, run_dlrm(np, flags, out, text, sizeof text) == 0, "exit non-zero: %.300s", text)) continue;
        got = final_loss(text);
        snprintf(name, sizeof name, "dlrm_empty_local_batch_final_loss_equals_np1 (np %d, %s)", np, cases[c][0]);
        dt_test_expect(name, fabs(got - ref) <= DENSE_REL(6) * fabs(ref), "np %d final loss %.9g, np 1 %.9g (bound %.3g relative)", np,
                       got, ref, DENSE_REL(6));
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

/* N steps at np 1 and at np `np` (SGD 20, Adagrad 3), the same flags, each saving its last checkpoint; every
   row of every table compared. The tables' own arithmetic is exact (a row is updated by its
   owner from the same gradient sums, in the same order, whatever the sharding); what differs
   is the dense part: the ranks' MLP gradients are all-reduced in rank order, one process sums
   its whole batch in GEMM order, so the weights, and from them the gradients reaching the
   tables, differ by f32 reassociation, growing over the 20 steps. tests/mpi_dlrm.c bounds the
   relative difference of the dense part at step t by t x 10 x 512 x u (u = 2^-24: sums of at
   most 512 terms, at most 10 of them chained per step; the BLAS's blocking, which
   OPENBLAS_CORETYPE and even buffer alignment change, is just another order).
   SGD, 20 steps: a row moves by -lr * g each step, smoothly in g, so the rows differ by at most
   that relative bound of step 20 times how far they can have moved:
   |a - b| <= DENSE_REL(20) (|a| + emb_lr).
   Adagrad, 3 steps: each update is lr * g_t / sqrt(G_t + eps) with G_t = sum of g_s^2 so far,
   smooth in g where G_t is not small, so the same bound holds there (DENSE_REL(3)). Where a row's
   gradients are small next to their rounding (contributions that cancel, G_t below (1e-3)^2 per
   step, the saved "sum") a step is ~lr * sign(noise), whose sign differs between sum orders:
   there the only bound is the two runs' largest joint movement, 2 lr steps, and such values are
   counted. Only 3 steps: this config's loss spikes at step 2 (14.2), and from there the
   trajectory amplifies rounding differences exponentially (by step 20 the loss differs by 7e-5
   relative between BLAS kernels of one process, tests/mpi_dlrm.c), so a per-row bound over 20
   Adagrad steps could only be the 2 lr steps that catches nothing. */
static void table_rows(const char *opt, int np, const char *extra) {
    char flags[1024], out[512], dir1[512], dirn[512], name[200], t[64], ts[64];
    const char *tmp = dt_test_tmpdir();
    double emb_lr = !strcmp(opt, "sgd") ? 0.1 : 0.05, worst = 0;
    long long beyond = 0, values = 0;
    int f, ok = 1, is_sgd = !strcmp(opt, "sgd"), steps = is_sgd ? 20 : 3;
    snprintf(dir1, sizeof dir1, "%s/rows_%s_np1", tmp, opt);
    snprintf(dirn, sizeof dirn, "%s/rows_%s_np%d", tmp, opt, np);
    snprintf(flags, sizeof flags, "--steps %d --seed 7 --batch 256 --opt %s --quiet --eval-every 1000 --eval-samples 512 --ckpt %s %s",
             steps, opt, dir1, extra);
    snprintf(out, sizeof out, "%s/rows_%s_np1.out", tmp, opt);
    snprintf(name, sizeof name, "dlrm_table_rows_%s_np1_runs", opt);
    if (!dt_test_expect(name, run_dlrm(1, flags, out, NULL, 0) == 0, "see %s", out)) return;
    snprintf(flags, sizeof flags, "--steps %d --seed 7 --batch 256 --opt %s --quiet --eval-every 1000 --eval-samples 512 --ckpt %s %s",
             steps, opt, dirn, extra);
    snprintf(out, sizeof out, "%s/rows_%s_np%d.out", tmp, opt, np);
    snprintf(name, sizeof name, "dlrm_table_rows_%s_np%d_runs", opt, np);
    if (!dt_test_expect(name, run_dlrm(np, flags, out, NULL, 0) == 0, "see %s", out)) return;
    snprintf(dir1 + strlen(dir1), sizeof dir1 - strlen(dir1), "/embed/step_%08d", steps);
    snprintf(dirn + strlen(dirn), sizeof dirn - strlen(dirn), "/embed/step_%08d", steps);
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
                double diff = fabs((double)a[i] - (double)b[i]), bound = DENSE_REL(steps) * (fabs((double)a[i]) + emb_lr);
                values++;
                if (diff / (fabs((double)a[i]) + emb_lr) > worst && diff <= bound) worst = diff / (fabs((double)a[i]) + emb_lr);
                if (diff <= bound) continue;
                if (!is_sgd && sa[i] < 1e-6 * steps && diff <= 2 * emb_lr * steps) { beyond++; continue; } /* noise */
                snprintf(name, sizeof name, "dlrm_table_rows_%s_np%d_equal_np1", opt, np);
                dt_test_fail(name, "%s row %lld col %lld: np 1 %.9g, np %d %.9g (|diff| %.3g > %.3g%s)", t,
                             (long long)(i / d1), (long long)(i % d1), a[i], np, b[i], diff, bound,
                             is_sgd ? "" : sa[i] < 1e-6 * steps ? "; beyond Adagrad's largest movement 2 lr steps" :
                             "; its Adagrad sum is not near 0");
                ok = 0;
            }
        }
        free(a); free(b); free(sa);
    }
    snprintf(name, sizeof name, "dlrm_table_rows_%s_np%d_equal_np1", opt, np);
    if (ok) dt_test_pass(name);
    printf("  %s np %d vs np 1: %lld table values, largest |diff| / (|w| + lr) within the bound %.3g, %lld beyond it "
           "(Adagrad, a step of rounding noise)\n", opt, np, values, worst, beyond);
}

/* ---------------------------------------------------------------- resume */

/* The value of "key": in a file's text (a manifest), as a number; NAN when absent. */
static double json_num(const char *text, const char *key) {
    char k[128];
    const char *p;
    snprintf(k, sizeof k, "\"%s\":", key);
    p = text ? strstr(text, k) : NULL;
    if (!p) return NAN;
    p += strlen(k);
    if (*p == '"') p++;
    return strtod(p, NULL);
}

static double final_auc(const char *text) {
    const char *p = strstr(text, "final: loss ");
    return p && (p = strstr(p, " auc ")) ? strtod(p + 5, NULL) : NAN;
}

/* A checkpoint of 3 steps (--batch 64 --seed 5) is resumed with another --batch, --seed or
   --data: a named refusal (exit 2) naming both values; --steps below its step: refused too;
   --steps equal to it: nothing trained, said so, and the final line gives the checkpoint's
   recorded loss and the AUC of the loaded model (= the first run's final line). A resume with
   the same flags records data_cursor = steps x batch. */
static void resume_checks(const char *tsv) {
    char flags[1024], out[512], dir[512], text[16384], path[1024], first[16384];
    const char *tmp = dt_test_tmpdir();
    const char *base = "--rows 4096 --eval-samples 128 --print-every 1 --eval-every 1000";
    char *man;
    int rc;
    snprintf(dir, sizeof dir, "%s/resume_ck", tmp);
    snprintf(flags, sizeof flags, "%s --steps 3 --batch 64 --seed 5 --ckpt %s", base, dir);
    snprintf(out, sizeof out, "%s/resume_first.out", tmp);
    if (!dt_test_expect("dlrm_resume_first_run", run_dlrm(1, flags, out, first, sizeof first) == 0, "see %s", out)) return;
    snprintf(flags, sizeof flags, "%s --steps 5 --batch 128 --seed 5 --ckpt %s --resume", base, dir);
    snprintf(out, sizeof out, "%s/resume_batch.out", tmp);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    dt_test_expect("dlrm_resume_other_batch_is_refused", rc == 2 && strstr(text, "--batch 128") && strstr(text, "192 samples") &&
           strstr(text, "--batch 64") && !strstr(text, "final:"), "exit %d, output: ...%s", rc, TAIL(text));
    snprintf(flags, sizeof flags, "%s --steps 5 --batch 64 --seed 9 --ckpt %s --resume", base, dir);
    snprintf(out, sizeof out, "%s/resume_seed.out", tmp);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_resume_other_seed_is_refused", rc == 2 && strstr(text, "--seed 5") && strstr(text, "--seed 9"),
           "exit %d, output: ...%s", rc, TAIL(text));
    snprintf(flags, sizeof flags, "%s --steps 5 --batch 64 --seed 5 --ckpt %s --resume --data %s", base, dir, tsv);
    snprintf(out, sizeof out, "%s/resume_data.out", tmp);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_resume_other_data_is_refused", rc == 2 && strstr(text, "--data synthetic") && strstr(text, tsv),
           "exit %d, output: ...%s", rc, TAIL(text));
    snprintf(flags, sizeof flags, "%s --steps 2 --batch 64 --seed 5 --ckpt %s --resume", base, dir);
    snprintf(out, sizeof out, "%s/resume_past.out", tmp);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_resume_past_steps_is_refused", rc == 2 && strstr(text, "at step 3, past --steps 2"),
           "exit %d, output: ...%s", rc, TAIL(text));
    snprintf(flags, sizeof flags, "%s --steps 3 --batch 64 --seed 5 --ckpt %s --resume", base, dir);
    snprintf(out, sizeof out, "%s/resume_done.out", tmp);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    dt_test_expect("dlrm_resume_finished_run_says_nothing_to_train", rc == 0 && strstr(text, "nothing to train"),
           "exit %d, output: ...%s", rc, TAIL(text));
    dt_test_expect("dlrm_resume_finished_run_final_line_is_the_checkpoints",
           final_loss(text) == final_loss(first) && fabs(final_auc(text) - final_auc(first)) <= 1e-4,
           "resumed: loss %.9g auc %.4f; the run that saved it: loss %.9g auc %.4f", final_loss(text), final_auc(text),
           final_loss(first), final_auc(first));
    snprintf(flags, sizeof flags, "%s --steps 5 --batch 64 --seed 5 --ckpt %s --resume", base, dir);
    snprintf(out, sizeof out, "%s/resume_on.out", tmp);
    if (!dt_test_expect("dlrm_resume_same_flags_trains", run_dlrm(2, flags, out, text, sizeof text) == 0, "see %s", out)) return;
    snprintf(path, sizeof path, "%s/dense/step_00000005/manifest.json", dir);
    man = slurp(path);
    dt_test_expect("dlrm_resume_records_data_cursor", json_num(man, "data_cursor") == 5 * 64,
           "%s: data_cursor %g, expected 5 x 64 = 320", path, json_num(man, "data_cursor"));
    free(man);
}

/* --dtype and checkpoints. A checkpoint of bf16 weights holds their f32 masters (dt_opt.h), so
   a bf16 run resumed at step 3 ends on the uninterrupted run's loss bit for bit (without the
   masters it would go on from the rounded values); resumed with the other --dtype it trains
   (dt_checkpoint_load gives an f32 weight the master, a bf16 one the f32 weight rounded) and
   a line says which it got; the f32 run from the bf16 checkpoint ends on another loss than the
   bf16 run's (it trained in f32). One checkpoint directory per resume: a resume saves again. */
static void resume_dtype_checks(void) {
    static const char *ck[3] = {"dtype_ck_bf16", "dtype_ck_bf16_to_f32", "dtype_ck_f32_to_bf16"};
    static const char *saved[3] = {"bf16", "bf16", "f32"}, *resumed[3] = {"bf16", "f32", "bf16"};
    char flags[1024], out[512], dir[512], text[16384], whole[16384];
    const char *tmp = dt_test_tmpdir();
    const char *base = "--rows 4096 --eval-samples 128 --eval-every 1000 --batch 64 --seed 5 --quiet";
    double got[3];
    int i, rc[3];
    snprintf(flags, sizeof flags, "%s --steps 5 --dtype bf16", base);
    snprintf(out, sizeof out, "%s/dtype_whole.out", tmp);
    if (!dt_test_expect("dlrm_dtype_bf16_trains", run_dlrm(1, flags, out, whole, sizeof whole) == 0 &&
                        isfinite(final_loss(whole)), "see %s", out))
        return;
    for (i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/%s", tmp, ck[i]);
        snprintf(flags, sizeof flags, "rm -rf %s", dir);
        if (system(flags) != 0) { dt_test_fail("dlrm_dtype_ckpt_dir_cleared", "%s", flags); return; }
        snprintf(flags, sizeof flags, "%s --steps 3 --dtype %s --ckpt %s", base, saved[i], dir);
        snprintf(out, sizeof out, "%s/%s_first.out", tmp, ck[i]);
        if (!dt_test_expect("dlrm_dtype_checkpoint_saved", run_dlrm(1, flags, out, NULL, 0) == 0, "see %s", out)) return;
        snprintf(flags, sizeof flags, "%s --steps 5 --dtype %s --ckpt %s --resume", base, resumed[i], dir);
        snprintf(out, sizeof out, "%s/%s_resumed.out", tmp, ck[i]);
        rc[i] = run_dlrm(1, flags, out, text, sizeof text);
        got[i] = final_loss(text);
        if (i == 0)
            dt_test_expect("dlrm_resume_bf16_ends_on_the_uninterrupted_loss_bit_for_bit", rc[0] == 0 &&
                           got[0] == final_loss(whole) && !strstr(text, "was trained with --dtype"),
                           "exit %d, resumed final loss %.9g, uninterrupted %.9g; output: ...%s", rc[0], got[0],
                           final_loss(whole), TAIL(text));
        else if (i == 1)
            dt_test_expect("dlrm_resume_bf16_checkpoint_in_f32_takes_the_masters_and_says_so", rc[1] == 0 &&
                           strstr(text, "was trained with --dtype bf16; this run goes on in f32 from its f32 master weights") &&
                           isfinite(got[1]) && got[1] != final_loss(whole),
                           "exit %d, final loss %.9g (the bf16 run's %.9g); output: ...%s", rc[1], got[1],
                           final_loss(whole), TAIL(text));
        else
            dt_test_expect("dlrm_resume_f32_checkpoint_in_bf16_rounds_and_says_so", rc[2] == 0 &&
                           strstr(text, "was trained with --dtype f32; this run goes on in bf16 from its f32 weights "
                                        "rounded to bf16") && isfinite(got[2]),
                           "exit %d, final loss %.9g; output: ...%s", rc[2], got[2], TAIL(text));
    }
}

/* ---------------------------------------------------------------- eval, log, final line */

/* The JSON lines carry auc / logloss on the steps that evaluate and null on the others; --steps
   0 prints "final: loss nan" (no step trained) and the AUC of the initial model; a held-out set
   of one class (the TSV's last 2 labels are 0) gives auc nan with a warning, training goes on
   and the final line prints. */
static void eval_checks(const char *tsv) {
    char flags[1024], out[512], log[512], text[16384], name[128];
    const char *tmp = dt_test_tmpdir();
    char *lines, *p;
    int s, rc;
    snprintf(log, sizeof log, "%s/eval.jsonl", tmp);
    snprintf(flags, sizeof flags, "--rows 4096 --eval-samples 128 --steps 4 --eval-every 2 --batch 64 --log %s", log);
    snprintf(out, sizeof out, "%s/eval.out", tmp);
    if (!dt_test_expect("dlrm_eval_run", run_dlrm(2, flags, out, text, sizeof text) == 0, "see %s", out)) return;
    lines = slurp(log);
    for (s = 1, p = lines; s <= 4 && p; s++, p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *eol = strchr(p, '\n'), *a = strstr(p, "\"auc\":"), *l = strstr(p, "\"logloss\":");
        int evaluates = s % 2 == 0, ok;
        ok = a && l && (!eol || (a < eol && l < eol)) &&
             (evaluates ? (a[6] == '0' || a[6] == '1') && l[10] != 'n' : !strncmp(a + 6, "null", 4) && !strncmp(l + 10, "null", 4));
        snprintf(name, sizeof name, "dlrm_log_auc_only_on_eval_steps (step %d)", s);
        dt_test_expect(name, ok, "line %d: %.300s", s, p);
        if (s == 4 && a) dt_test_expect("dlrm_log_last_auc_is_the_final_lines", fabs(strtod(a + 6, NULL) - final_auc(text)) <= 1e-4,
                                "log %.6f, final line %.4f", strtod(a + 6, NULL), final_auc(text));
    }
    free(lines);
    snprintf(out, sizeof out, "%s/steps0.out", tmp);
    rc = run_dlrm(1, "--rows 4096 --eval-samples 128 --steps 0", out, text, sizeof text);
    dt_test_expect("dlrm_steps0_final_line_says_no_loss", rc == 0 && strstr(text, "final: loss nan auc 0.") && !strstr(text, "auc 0.5000"),
           "exit %d, output: ...%s", rc, TAIL(text));
    dt_test_expect("dlrm_steps0_says_why_the_loss_is_nan", strstr(text, "--steps 0 trains no step: the final loss is nan") != NULL,
           "output: ...%s", TAIL(text));
    { /* --lr 0 --emb-lr 0: a real 0 (dt_opt's and dt_embed's desc take 0 as "default": DT_OPT_ZERO) */
        double auc0 = final_auc(text);
        snprintf(flags, sizeof flags, "--rows 4096 --eval-samples 128 --steps 2 --batch 64 --lr 0 --emb-lr 0 --log %s", log);
        snprintf(out, sizeof out, "%s/lr0.out", tmp);
        rc = run_dlrm(1, flags, out, text, sizeof text);
        lines = slurp(log);
        dt_test_expect("dlrm_lr_zero_is_logged_as_zero", rc == 0 && lines && strstr(lines, "\"lr\":0,\"emb_lr\":0,"),
                       "exit %d, log: %.300s", rc, lines ? lines : "(none)");
        free(lines);
        dt_test_expect("dlrm_lr_zero_leaves_the_untrained_auc", rc == 0 && final_auc(text) == auc0,
                       "2 steps at lr 0: auc %.4f, untrained %.4f", final_auc(text), auc0);
    }
    snprintf(flags, sizeof flags, "--data %s --steps 3 --batch 64 --eval-samples 2 --eval-every 1", tsv);
    snprintf(out, sizeof out, "%s/one_class.out", tmp);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_one_class_eval_is_auc_nan_and_trains_on", rc == 0 && strstr(text, "AUC is undefined") &&
           strstr(text, "step 3/3") && strstr(text, "final: loss ") && isnan(final_auc(text)) && !isnan(final_loss(text)),
           "exit %d, output: ...%s", rc, TAIL(text));
}

/* ---------------------------------------------------------------- flags */

/* Every bad value is named: exit 2, the flag and the value in the message (each was taken
   before: atof's "0.05abc" as 0.05, "abc" as the default, an overflowing seed clamped, ...). */
static void flag_checks(void) {
    static const struct { const char *flags, *says; } bad[] = {
        {"--lr abc", "--lr wants a number in [0, 100], got 'abc'"},
        {"--lr 0.05abc", "--lr wants a number in [0, 100], got '0.05abc'"},
        {"--emb-lr nan", "--emb-lr wants a number in [0, 100], got 'nan'"},
        {"--emb-lr 101", "--emb-lr wants a number in [0, 100], got '101'"},
        {"--steps ''", "--steps wants an integer in [0, 1099511627776], got ''"},
        {"--seed 99999999999999999999", "--seed wants an integer in [0, 9223372036854775807], got '99999999999999999999'"},
        {"--timeout 5abc", "--timeout wants a number in [0.001, 1e+09], got '5abc'"},
        {"--timeout abc", "--timeout wants a number in [0.001, 1e+09], got 'abc'"},
        {"--table-sizes 1099511627776", "sizes in [1, 2^31] (--data synthetic's limit"},
        {"--bottom 64,32,", "--bottom wants 1 to 8 widths in [1, 65536] like 64,32, got '64,32,'"},
        {"--top ''", "--top wants 1 to 8 widths in [1, 65536] like 64,32, got ''"},
        {"--arch dcn --cross-rank 432", "--cross-rank 432 is not below the cross layers' width 432 (27 x --dim 16)"},
        {"--arch dcn --dim 4 --cross-rank 500", "--cross-rank 500 is not below the cross layers' width 108"},
        {"--hier sometimes", "--hier wants auto, on or off, got 'sometimes'"},
        {"--arch dnc", "--arch wants dlrm or dcn, got 'dnc'"},
        {"--dtype f16", "--dtype wants f32 or bf16 (the dense linears' weights; the tables stay f32), got 'f16'"},
    };
    char flags[1024], out[512], text[16384], name[200];
    const char *tmp = dt_test_tmpdir();
    size_t i;
    int rc;
    snprintf(out, sizeof out, "%s/flags.out", tmp);
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(flags, sizeof flags, "--steps 0 --rows 4096 --eval-samples 128 %s", bad[i].flags);
        rc = run_dlrm(1, flags, out, text, sizeof text);
        snprintf(name, sizeof name, "dlrm_flag_bad_value_is_named (%s)", bad[i].flags);
        dt_test_expect(name, rc == 2 && strstr(text, bad[i].says), "exit %d, wanted \"%s\", output: ...%s", rc, bad[i].says,
                       TAIL(text));
    }
    snprintf(flags, sizeof flags, "--steps 0 --data %s", tmp); /* fopen opens it; its first read failed, "after line 0" */
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_flag_data_directory_is_named", rc == 2 && strstr(text, "is a directory") && strstr(text, tmp),
                   "exit %d, output: ...%s", rc, TAIL(text));
    rc = run_dlrm(1, "--steps 0 --rows 4096 --eval-samples 128 --arch dcn --dim 4 --cross-rank 107", out, text, sizeof text);
    dt_test_expect("dlrm_flag_cross_rank_below_the_width_runs", rc == 0 && strstr(text, "final: loss nan"),
                   "exit %d, output: ...%s", rc, TAIL(text));
    rc = run_dlrm(1, "--steps 0 --rows 4096 --eval-samples 128 --cross 3", out, text, sizeof text);
    dt_test_expect("dlrm_flag_cross_with_arch_dlrm_warns", rc == 0 && strstr(text, "warning: --cross and --cross-rank") &&
                   strstr(text, "--arch dlrm has none"), "exit %d, output: ...%s", rc, TAIL(text));
    rc = run_dlrm(0, "--help", out, text, sizeof text);
    dt_test_expect("dlrm_flag_help_exits_0", rc == 0 && strstr(text, "flags: --steps N") && !strstr(text, "unknown flag"),
                   "exit %d, output: ...%s", rc, TAIL(text));
}

/* ---------------------------------------------------------------- TSV, .bin, table sizes */

/* A Criteo-shaped TSV of n lines (label 1 on every 4th line from 0, so the last lines of 700
   are 0s); `salt` changes the ids. */
static int write_tsv(const char *path, int n, int salt) {
    FILE *fp = fopen(path, "w");
    int i, f;
    if (!fp) return 0;
    for (i = 0; i < n; i++) {
        fprintf(fp, "%d", i % 4 == 0);
        for (f = 0; f < 13; f++) fprintf(fp, "\t%d", (i * 7 + f) % 50);
        for (f = 0; f < 26; f++) fprintf(fp, "\t%x", (unsigned)((i * 31 + f * 17 + salt) * 2654435761u));
        fprintf(fp, "\n");
    }
    return fclose(fp) == 0;
}

/* The table sizes in a .bin's header (dlrm_data.h: u64[26] at byte 48). */
static int bin_sizes(const char *path, long long *sizes) {
    unsigned char h[256];
    FILE *fp = fopen(path, "rb");
    int f, k, ok;
    if (!fp) return 0;
    ok = fread(h, 1, 256, fp) == 256;
    fclose(fp);
    for (f = 0; f < 26 && ok; f++) {
        unsigned long long v = 0;
        for (k = 7; k >= 0; k--) v = v << 8 | h[48 + 8 * f + k];
        sizes[f] = (long long)v;
    }
    return ok;
}

/* FILE.tsv.bin is reused only as converted: the same --rows / --table-sizes / --skip-bad and
   the TSV unchanged; otherwise converted again (saying why); --table-sizes sets each table's
   rows (the .bin's header), bad lists are named errors. */
static void bin_checks(const char *tsv) {
    char flags[1024], out[512], bin[600], text[16384];
    const char *tmp = dt_test_tmpdir();
    long long sizes[26] = {0};
    int rc, f, ok;
    snprintf(bin, sizeof bin, "%s.bin", tsv);
    snprintf(flags, sizeof flags, "--data %s --steps 1 --batch 64 --eval-samples 128 --rows 16384", tsv);
    snprintf(out, sizeof out, "%s/bin1.out", tmp);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_bin_converted_once", rc == 0 && strstr(text, "converted ") && bin_sizes(bin, sizes) && sizes[0] == 1460,
           "exit %d, C1 %lld rows, output: ...%s", rc, sizes[0], TAIL(text));
    snprintf(out, sizeof out, "%s/bin2.out", tmp);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    dt_test_expect("dlrm_bin_reused_when_unchanged", rc == 0 && !strstr(text, "converted ") && strstr(text, "final: loss"),
           "exit %d, output: ...%s", rc, TAIL(text));
    snprintf(flags, sizeof flags, "--data %s --steps 1 --batch 64 --eval-samples 128 --rows 100", tsv);
    snprintf(out, sizeof out, "%s/bin3.out", tmp);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    dt_test_expect("dlrm_bin_reconverted_for_other_rows", rc == 0 && strstr(text, "re-converting") &&
           strstr(text, "1460 rows in C1, this run wants 100") && bin_sizes(bin, sizes) && sizes[0] == 100,
           "exit %d, C1 %lld rows, output: ...%s", rc, sizes[0], TAIL(text));
    snprintf(flags, sizeof flags, "--data %s --steps 1 --batch 64 --eval-samples 128 --rows 100 --skip-bad", tsv);
    snprintf(out, sizeof out, "%s/bin4.out", tmp);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_bin_reconverted_for_skip_bad", rc == 0 && strstr(text, "re-converting") && strstr(text, "skip_bad 1"),
           "exit %d, output: ...%s", rc, TAIL(text));
    if (!write_tsv(tsv, 764, 3)) { dt_test_fail("dlrm_tsv_written", "cannot write %s", tsv); return; }
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_bin_reconverted_for_an_edited_tsv", rc == 0 && strstr(text, "re-converting") && strstr(text, "764 samples"),
           "exit %d, output: ...%s", rc, TAIL(text));
    snprintf(flags, sizeof flags, "--data %s --steps 1 --batch 64 --eval-samples 128 --table-sizes "
             "5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,3000", tsv);
    snprintf(out, sizeof out, "%s/bin5.out", tmp);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    ok = rc == 0 && bin_sizes(bin, sizes);
    for (f = 0; f < 25 && ok; f++) ok = sizes[f] == 5 + f;
    dt_test_expect("dlrm_table_sizes_list_sets_each_table", ok && sizes[25] == 3000 && strstr(text, "final: loss"),
           "exit %d, C1 %lld C25 %lld C26 %lld rows, output: ...%s", rc, sizes[0], sizes[24], sizes[25], TAIL(text));
    snprintf(flags, sizeof flags, "--data %s --steps 1 --batch 64 --eval-samples 128 --table-sizes 200000", tsv);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    ok = rc == 0 && bin_sizes(bin, sizes);
    for (f = 0; f < 26 && ok; f++) ok = sizes[f] == 200000;
    dt_test_expect("dlrm_table_sizes_one_for_all_above_kaggles", ok, "exit %d, C1 %lld rows (Kaggle's 1460), output: ...%s",
           rc, sizes[0], TAIL(text));
    snprintf(flags, sizeof flags, "--data %s --steps 1 --batch 64 --eval-samples 128 --table-sizes 300", bin);
    rc = run_dlrm(1, flags, out, text, sizeof text);
    dt_test_expect("dlrm_table_sizes_against_a_bin_of_others_is_named", rc == 2 && strstr(text, "200000 rows in C1") &&
           strstr(text, "asks for 300"), "exit %d, output: ...%s", rc, TAIL(text));
    {
        static const char *bad[][2] = {{"5,6", "(2 sizes)"}, {"0", "a bad size 1"}, {"7,x", "a bad size 2"},
                                       {"9,", "a bad size 1"},
                                       {"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27", "size 27"}};
        int b;
        for (b = 0; b < 5; b++) {
            char name[128];
            snprintf(flags, sizeof flags, "--steps 0 --table-sizes %s", bad[b][0]);
            rc = run_dlrm(1, flags, out, text, sizeof text);
            snprintf(name, sizeof name, "dlrm_table_sizes_bad_list_is_named ('%s')", bad[b][0]);
            dt_test_expect(name, rc == 2 && strstr(text, "--table-sizes wants 1 or 26 sizes") && strstr(text, bad[b][1]),
                   "exit %d, output: ...%s", rc, TAIL(text));
        }
    }
    { /* a header of 2^62 samples: its byte size overflows (it said "needs 0" bytes) */
        char huge[600], *all = slurp(bin);
        long n = 0;
        FILE *fp;
        snprintf(huge, sizeof huge, "%s/huge.bin", tmp);
        if (all && (fp = fopen(bin, "rb"))) { fseek(fp, 0, SEEK_END); n = ftell(fp); fclose(fp); }
        if (!all || n < 256 || !(fp = fopen(huge, "wb"))) { dt_test_fail("dlrm_bin_huge_written", "cannot copy %s", bin); free(all); return; }
        memset(all + 16, 0, 8);
        all[23] = 0x40; /* u64 sample count at byte 16, little-endian: 2^62 */
        fwrite(all, 1, (size_t)n, fp);
        fclose(fp);
        free(all);
        snprintf(flags, sizeof flags, "--data %s --steps 1 --batch 64 --eval-samples 128", huge);
        rc = run_dlrm(1, flags, out, text, sizeof text);
        dt_test_expect("dlrm_bin_huge_sample_count_is_named_an_overflow", rc != 0 && strstr(text, "4611686018427387904 samples overflow") &&
                       !strstr(text, "needs 0"), "exit %d, output: ...%s", rc, TAIL(text));
    }
}

/* ---------------------------------------------------------------- the planner (dt_plan.h >>dlrm) */

static const char *PLAN_SMALL = "--batch 256 --rows 4000 --eval-samples 512";

static char g_plan_profile[600], g_plan_first[1 << 16];

/* --plan ranks the plans (dt_embed's own among them), prints --shard's prediction, trains nothing
   (and --plan-profile writes the profile it measured) */
static void plan_prints(void) {
    static char text[1 << 16];
    char flags[1024], out[600];
    int rc;
    snprintf(out, sizeof out, "%s/dlrm_plan.out", dt_test_tmpdir());
    snprintf(g_plan_profile, sizeof g_plan_profile, "%s/dlrm_plan_profile.json", dt_test_tmpdir());
    remove(g_plan_profile); /* measured here, written for plan_profile_file */
    snprintf(flags, sizeof flags, "%s --steps 5 --plan --plan-profile %s", PLAN_SMALL, g_plan_profile);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    snprintf(g_plan_first, sizeof g_plan_first, "%s", text);
    if (!DT_TEST_CHECK("dlrm_plan_prints_exits_0", rc == 0)) printf("  %s\n", TAIL(text));
    DT_TEST_CHECK("dlrm_plan_prints_the_ranking", strstr(text, "rank plan ") && strstr(text, "first-ranked (") &&
                  strstr(text, " auto ") && strstr(text, " row "));
    DT_TEST_CHECK("dlrm_plan_prints_the_given_shards_prediction",
                  strstr(text, "plan: --shard auto: predicted step ") && strstr(text, " MB a rank"));
    DT_TEST_CHECK("dlrm_plan_does_not_train", !strstr(text, "final: loss"));
}

/* --shard plan trains on the first-ranked plan with --shard auto's losses bit for bit (any plan
   gives the one-rank result: dt_embed.h "exactness"); its log has step_s, its end the peak memory */
static void plan_trains(int np) {
    static char text[1 << 16];
    char flags[1024], out[600], log[600], name[128], line[4096];
    double a, b;
    int rc, n = 0, with = 0;
    FILE *fp;
    snprintf(out, sizeof out, "%s/dlrm_plan.out", dt_test_tmpdir());
    snprintf(log, sizeof log, "%s/dlrm_plan_%d.jsonl", dt_test_tmpdir(), np);
    snprintf(flags, sizeof flags, "%s --steps 12 --shard auto --quiet", PLAN_SMALL);
    rc = run_dlrm(np, flags, out, text, sizeof text);
    a = final_loss(text);
    snprintf(flags, sizeof flags, "%s --steps 12 --shard plan --log %s", PLAN_SMALL, log);
    rc = rc ? rc : run_dlrm(np, flags, out, text, sizeof text);
    b = final_loss(text);
    snprintf(name, sizeof name, "dlrm_shard_plan_trains_as_auto_bit_for_bit_np%d", np);
    if (!DT_TEST_CHECK(name, rc == 0 && a == a && a == b)) printf("  auto %.9g, plan %.9g (rc %d)\n%s\n", a, b, rc, TAIL(text));
    snprintf(name, sizeof name, "dlrm_shard_plan_prints_its_prediction_np%d", np);
    DT_TEST_CHECK(name, strstr(text, "plan: --shard plan: predicted step ") != NULL);
    snprintf(name, sizeof name, "dlrm_shard_plan_prints_peak_memory_np%d", np);
    DT_TEST_CHECK(name, strstr(text, "peak memory per rank: ") != NULL);
    fp = fopen(log, "r");
    while (fp && fgets(line, sizeof line, fp)) { n++; with += strstr(line, "\"step_s\":") != NULL; }
    if (fp) fclose(fp);
    snprintf(name, sizeof name, "dlrm_log_has_step_s_np%d", np);
    DT_TEST_CHECK(name, n == 12 && with == 12);
}

/* --plan-profile: plan_prints' run measured and wrote the file; this one plans from it to the same
   prediction without measuring; a run of another batch is refused, named */
static void plan_profile_file(void) {
    static char text[1 << 16];
    char flags[1024], out[600];
    const char *a, *b;
    size_t la, lb;
    int rc;
    FILE *fp;
    snprintf(out, sizeof out, "%s/dlrm_plan.out", dt_test_tmpdir());
    if ((fp = fopen(g_plan_profile, "rb")) != NULL) fclose(fp);
    DT_TEST_CHECK("dlrm_plan_profile_measures_and_writes", fp != NULL);
    snprintf(flags, sizeof flags, "%s --steps 5 --plan --plan-profile %s", PLAN_SMALL, g_plan_profile);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    a = strstr(g_plan_first, "plan: --shard auto: predicted step ");
    b = strstr(text, "plan: --shard auto: predicted step ");
    la = a ? strcspn(a, "\n") : 0;
    lb = b ? strcspn(b, "\n") : 1;
    if (!DT_TEST_CHECK("dlrm_plan_profile_read_predicts_the_same", rc == 0 && a && b && la == lb && !memcmp(a, b, la)))
        printf("  measured: %.*s\n  read:     %.*s\n", (int)la, a ? a : "", (int)(b ? lb : 0), b ? b : "");
    { /* the profile is the tables', whatever --shard measured it: one written under --shard table predicts
         --shard auto's memory as the one written under --shard auto (its slot for dt_embed's own plan
         once held all-table-wise then: 7.88 MB against 8.01 here) */
        char other[600];
        double ma = -1, mb = -2;
        const char *pa, *pb;
        snprintf(other, sizeof other, "%s/dlrm_plan_profile_table.json", dt_test_tmpdir());
        remove(other);
        snprintf(flags, sizeof flags, "%s --steps 5 --plan --shard table --plan-profile %s", PLAN_SMALL, other);
        rc = run_dlrm(2, flags, out, text, sizeof text);
        snprintf(flags, sizeof flags, "%s --steps 5 --plan --plan-profile %s", PLAN_SMALL, other);
        if (!rc) rc = run_dlrm(2, flags, out, text, sizeof text);
        pa = a ? strstr(a, "), memory ") : NULL;
        pb = strstr(text, "plan: --shard auto: predicted step ");
        pb = pb ? strstr(pb, "), memory ") : NULL;
        if (pa) ma = atof(pa + 10);
        if (pb) mb = atof(pb + 10);
        if (!DT_TEST_CHECK("dlrm_plan_profile_of_shard_table_predicts_auto_as_its_own",
                           rc == 0 && ma > 0 && fabs(mb - ma) <= 0.005 * ma))
            printf("  --shard auto's memory: %.3f MB from the auto-measured profile, %.3f from the table-measured (rc %d)\n",
                   ma, mb, rc);
        remove(other);
    }
    snprintf(flags, sizeof flags, "--batch 128 --rows 4000 --eval-samples 512 --steps 5 --plan --plan-profile %s",
             g_plan_profile);
    rc = run_dlrm(2, flags, out, text, sizeof text);
    if (!DT_TEST_CHECK("dlrm_plan_profile_of_another_batch_is_named", rc != 0 && strstr(text, "remove the file")))
        printf("  rc %d\n%s\n", rc, TAIL(text));
}

/* what the planner does not model, --plan-memory without it, and a budget nothing fits: named */
static void plan_refuses(void) {
    static char text[1 << 16];
    static const struct { const char *name, *flags, *says; } c[] = {
        {"dlrm_plan_refuses_accum", "--plan --accum 2", "not with --accum > 1"},
        {"dlrm_plan_refuses_overlap", "--shard plan --overlap 1", "not with --accum > 1, --overlap 1"},
        {"dlrm_plan_refuses_tier", "--plan --tier disk", "--tier"},
        {"dlrm_plan_memory_without_plan_is_named", "--plan-memory 100", "--plan-memory is for --plan or --shard plan"},
        {"dlrm_plan_memory_nothing_fits_is_named", "--plan --plan-memory 1", "no plan of the tables fits --plan-memory 1 MB"},
    };
    size_t i;
    char out[600];
    snprintf(out, sizeof out, "%s/dlrm_plan.out", dt_test_tmpdir());
    for (i = 0; i < sizeof c / sizeof c[0]; i++) {
        char flags[512];
        int rc;
        snprintf(flags, sizeof flags, "%s --steps 3 %s", PLAN_SMALL, c[i].flags);
        rc = run_dlrm(2, flags, out, text, sizeof text);
        if (!DT_TEST_CHECK(c[i].name, rc != 0 && strstr(text, c[i].says) != NULL)) printf("  rc %d\n%s\n", rc, TAIL(text));
    }
}

int main(void) {
    FILE *fp = fopen(DLRM, "rb");
    if (!fp) {
        dt_test_fail("dlrm_built", "%s is missing: run ./build.sh", DLRM);
        return dt_test_finish();
    }
    fclose(fp);
    flag_checks();
    if (dt_test_short_run()) { /* the tables' equivalence and the planner's plan at 2 ranks only */
        table_rows("sgd", 2, "--rows 100000 --row-wise-over 50000");
        table_rows("adagrad", 2, "--rows 100000 --row-wise-over 50000");
        plan_trains(2);
        return dt_test_finish();
    }
    plan_prints();
    plan_profile_file();
    plan_trains(2);
    plan_trains(3);
    plan_refuses();
    empty_local_batch();
    table_rows("sgd", 4, "--rows 100000 --row-wise-over 50000");
    table_rows("adagrad", 4, "--rows 100000 --row-wise-over 50000");
    {
        char tsv[512];
        snprintf(tsv, sizeof tsv, "%s/day.tsv", dt_test_tmpdir());
        if (!write_tsv(tsv, 700, 0)) dt_test_fail("dlrm_tsv_written", "cannot write %s", tsv);
        else {
            bin_checks(tsv);
            write_tsv(tsv, 700, 0);
            resume_checks(tsv);
            resume_dtype_checks();
            eval_checks(tsv);
        }
    }
    return dt_test_finish();
}
