/* tests/gpt_driver.h - what the tests that drive build/examples/gpt share (tests/mpi_gpt.c,
   tests/mpi_gpt_pp.c): start it under $DT_MPIRUN, read its `final: loss`, and read a checkpoint
   of any layout back whole (dt_checkpoint_load reshards) to compare weights. Include after
   dt_tensor.h, dt_comm.h, dt_opt.h and dt_test.h, in one test file. */
#ifndef DT_TESTS_GPT_DRIVER_H
#define DT_TESTS_GPT_DRIVER_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *GPT = "build/examples/gpt";
static dt_ctx g_ctx;

/* Runs gpt at np with the flags; its output into `out`; returns the exit status. One BLAS thread
   per rank unless the environment says otherwise (the ranks already fill a small machine). */
static int run(int np, const char *flags, const char *out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} %s -np %d %s %s > %s 2>&1 < /dev/null",
             dt_test_mpirun(), np, GPT, flags, out);
    return system(cmd);
}

/* The number after the last "final: loss " of a file (NAN if none); its text too when text is
   not NULL, for bitwise checks. */
static double final_loss(const char *path, char *text, size_t n) {
    FILE *fp = fopen(path, "r");
    char line[4096];
    double v = NAN;
    if (text && n) text[0] = 0;
    if (!fp) return v;
    while (fgets(line, sizeof line, fp))
        if (!strncmp(line, "final: loss ", 12)) {
            v = strtod(line + 12, NULL);
            if (text) {
                size_t k = strcspn(line + 12, "\n");
                if (k >= n) k = n - 1;
                memcpy(text, line + 12, k);
                text[k] = 0;
            }
        }
    fclose(fp);
    return v;
}

static int file_has(const char *path, const char *needle) {
    FILE *fp = fopen(path, "r");
    char line[4096];
    int found = 0;
    if (!fp) return 0;
    while (!found && fgets(line, sizeof line, fp)) found = strstr(line, needle) != NULL;
    fclose(fp);
    return found;
}

/* The shape of the GPT a test runs (examples/gpt's --layers, --width, padded vocab, --seq). */
typedef struct gpt_shape { int layers; int64_t width, vp, tctx, kvw; } gpt_shape; /* kvw: the k / v rows
                                                                                     (--kv-heads x head size; 0 = width) */

/* The model's parameters, whole (global shapes), by name: what a checkpoint of any layout
   reassembles into. */
static void whole_params(dt_params *ps, gpt_shape s) {
    static const char *names[16] = {"ln1.w", "ln1.b", "attn.q.w", "attn.k.w", "attn.v.w", "attn.q.b", "attn.k.b",
                                    "attn.v.b", "attn.proj.w", "attn.proj.b", "ln2.w", "ln2.b", "mlp.fc.w",
                                    "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"};
    const int64_t w = s.width, kv = s.kvw ? s.kvw : s.width;
    const int64_t shapes[16][2] = {{w, 0}, {w, 0}, {w, w}, {kv, w}, {kv, w}, {w, 0}, {kv, 0}, {kv, 0}, {w, w},
                                   {w, 0}, {w, 0}, {w, 0}, {4 * w, w}, {4 * w, 0}, {w, 4 * w}, {w, 0}};
    char name[64];
    int l, k;
    dt_param_desc d;
    memset(ps, 0, sizeof *ps);
#define ADD(n_, a_, b_) do { memset(&d, 0, sizeof d); d.name = (n_); d.shape[0] = (a_); d.shape[1] = (b_); \
                             if (dt_params_add(&g_ctx, ps, NULL, &d)) { fprintf(stderr, "%s\n", dt_ctx_error(&g_ctx)); exit(1); } } while (0)
    ADD("wte", s.vp, w);
    ADD("wpe", s.tctx, w);
    ADD("ln_f.w", w, 0);
    ADD("ln_f.b", w, 0);
    for (l = 0; l < s.layers; l++)
        for (k = 0; k < 16; k++) {
            snprintf(name, sizeof name, "h.%d.%s", l, names[k]);
            ADD(name, shapes[k][0], shapes[k][1]);
        }
#undef ADD
}

/* Loads the newest checkpoint of dir into whole params; 0 on failure (the reason printed). */
static int load_weights(dt_params *ps, const char *dir, gpt_shape s) {
    dt_checkpoint_desc cd = {0};
    whole_params(ps, s);
    cd.dir = dir;
    if (dt_checkpoint_load(&g_ctx, ps, NULL, NULL, &cd)) {
        printf("  cannot load %s: %s\n", dir, dt_ctx_error(&g_ctx));
        dt_params_free(&g_ctx, ps);
        return 0;
    }
    return 1;
}

/* A run of gpt at np with `base --steps 1 flags` that must fail: exit status non-zero and a
   message containing needle, checked as `name` (its output in the test's tmpdir). */
static void gd_named_error(const char *name, int np, const char *base, const char *flags, const char *needle) {
    char out[512], full[1024];
    int st;
    snprintf(out, sizeof out, "%s/%s.out", dt_test_tmpdir(), name);
    snprintf(full, sizeof full, "%s --steps 1 %s", base, flags);
    st = run(np, full, out);
    dt_test_expect(name, st != 0 && file_has(out, needle), "np %d gpt %s: exit status %d, expected non-zero and a message "
                   "containing '%s' (output in %s)", np, full, st, needle, out);
}

/* ---------------------------------------------------------------- tolerances

   Two layouts run the same arithmetic with the sums in another order: tp splits inner products
   and the softmax's sums, dp and pp add the micro-batches' gradients in another order, and the
   BLAS picks its own blocking (OPENBLAS_CORETYPE, its thread count). The bounds below follow
   from fp32 rounding and from Adam's update, not from what one machine measured.

   Loss and gradient norm. A sum of K fp32 terms in any order is within K u sum|terms| of the
   exact sum (u = 2^-24). The longest sum of the model is K = max(4 width (the MLP's inner
   product), padded vocab (the softmax), tokens per batch (the loss's mean and each weight
   gradient)); a step chains 2 layers + 1 such sums (attention and MLP per block, then the
   head), whose relative errors add to first order. So at step 1, where both runs start from
   the same weights, the loss and the global grad norm (the gradients' one observable in the
   log) differ by at most (2 layers + 1) K u relative; each further step adds its own rounding
   (over these few steps training does not amplify it), so step t gets t times that.

   Weights. Adam moves an element by lr_t m^/(sqrt(v^) + eps) per update; where the gradient
   is rounding noise (v tiny: the key biases, whose exact gradient is 0, near-zero MLP biases)
   that step is ~lr_t sign(noise), and its sign differs between sum orders. No element can
   differ by more than the two runs' largest total movement, 2 sum_t lr_t r_t, where r_t bounds
   |m^/sqrt(v^)| at update t (Cauchy-Schwarz over the two moving averages; 1 at t = 1). AdamW's
   decay lr wd w is the same function of w in both runs (second order in their difference).
   That is a per-element bound; the sensitive checks are the per-step losses above. */
#define GD_U 5.9604644775390625e-8 /* 2^-24 */
#define GD_MAX_STEPS 64

/* examples/gpt's AdamW betas (GPT-2 / llm.c) */
#define GD_BETA1 0.9
#define GD_BETA2 0.95

/* The numbers after "key": in the JSON lines of an examples/gpt --log file, in step order;
   their count. */
static int log_values(const char *path, const char *key, double *v, int max) {
    FILE *fp = fopen(path, "r");
    char line[4096], pat[64];
    int n = 0;
    if (!fp) return 0;
    snprintf(pat, sizeof pat, "\"%s\":", key);
    while (n < max && fgets(line, sizeof line, fp)) {
        const char *at = strstr(line, pat);
        if (at) v[n++] = strtod(at + strlen(pat), NULL);
    }
    fclose(fp);
    return n;
}

/* The relative bound on the loss (and grad norm) of step `step` (1-based), see above. */
static double loss_bound(gpt_shape s, int64_t batch, int step) {
    int64_t k = 4 * s.width;
    if (s.vp > k) k = s.vp;
    if (batch * s.tctx > k) k = batch * s.tctx;
    return (double)step * (2.0 * s.layers + 1.0) * (double)k * GD_U;
}

/* r_t: the largest |m^_t / sqrt(v^_t)| of Adam at update t (1-based), bias corrections included:
   m_t = (1-b1) sum_j b1^(t-j) g_j, v_t = (1-b2) sum_j b2^(t-j) g_j^2, and Cauchy-Schwarz. */
static double adam_ratio(double b1, double b2, int t) {
    double c = 0, q = b1 * b1 / b2, p = 1;
    int j;
    for (j = 0; j < t; j++, p *= q) c += p;
    return (1 - b1) / (1 - pow(b1, t)) * sqrt((1 - pow(b2, t)) / (1 - b2)) * sqrt(c);
}

/* 2 sum_t lr_t r_t over the lr of each update (from the reference's --log). */
static double adam_bound(const double *lr, int steps) {
    double b = 0;
    int t;
    for (t = 0; t < steps; t++) b += 2 * lr[t] * adam_ratio(GD_BETA1, GD_BETA2, t + 1);
    return b;
}

/* The worst over every element of |a - b| / bound (<= 1 passes; bound 0: 0 iff bitwise equal);
   *which = its tensor's name, *diff = its |a - b|. */
static double weights_worst(const dt_params *a, const dt_params *b, double bound, const char **which, double *diff) {
    double worst = 0;
    int i;
    int64_t k;
    *which = "";
    *diff = 0;
    for (i = 0; i < a->count && i < b->count; i++) {
        const float *x = (const float *)a->items[i]->value.data, *y = (const float *)b->items[i]->value.data;
        for (k = 0; k < a->items[i]->value.numel; k++) {
            double d = fabs((double)x[k] - (double)y[k]), r = d != d ? INFINITY : bound > 0 ? d / bound : d > 0 ? INFINITY : 0;
            if (r > worst) { worst = r; *which = a->items[i]->name; *diff = d; }
        }
    }
    return worst;
}

/* A run's --log against the reference's: the loss of every step within loss_bound (name
   <prefix>_losses_per_step_equal_np1) and the grad norm of step 1 within the step-1 bound
   (<prefix>_grad_norm_step1_equals_np1). */
static void compare_logs(const char *prefix, const char *log, const char *ref_log, gpt_shape s, int64_t batch) {
    double a[GD_MAX_STEPS], b[GD_MAX_STEPS], rel = 0;
    int na = log_values(log, "loss", a, GD_MAX_STEPS), nb = log_values(ref_log, "loss", b, GD_MAX_STEPS), t;
    char name[320];
    snprintf(name, sizeof name, "%s_losses_per_step_equal_np1", prefix);
    if (na != nb || na <= 0) {
        dt_test_fail(name, "%d steps logged in %s, %d in %s", na, log, nb, ref_log);
        return;
    }
    for (t = 0; t < na; t++) {
        rel = fabs(a[t] - b[t]) / fabs(b[t]);
        if (!(rel <= loss_bound(s, batch, t + 1))) break;
    }
    dt_test_expect(name, t == na, "step %d: loss %.9g, np 1 %.9g (relative %.3g > bound %.3g)", t + 1, t < na ? a[t] : 0,
                   t < na ? b[t] : 0, rel, loss_bound(s, batch, t + 1));
    na = log_values(log, "grad_norm", a, 1);
    nb = log_values(ref_log, "grad_norm", b, 1);
    rel = na == 1 && nb == 1 ? fabs(a[0] - b[0]) / fabs(b[0]) : NAN;
    snprintf(name, sizeof name, "%s_grad_norm_step1_equals_np1", prefix);
    dt_test_expect(name, rel <= loss_bound(s, batch, 1), "grad norm %.9g, np 1 %.9g (relative %.3g > bound %.3g)",
                   na ? a[0] : NAN, nb ? b[0] : NAN, rel, loss_bound(s, batch, 1));
}

/* The reference's lr per update, and the per-element weight bound from them. */
static double weight_bound_of(const char *ref_log) {
    double lr[GD_MAX_STEPS];
    int n = log_values(ref_log, "lr", lr, GD_MAX_STEPS);
    return n > 0 ? adam_bound(lr, n) : NAN;
}

#endif
