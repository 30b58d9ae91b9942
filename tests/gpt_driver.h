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

/* Runs gpt at np with the flags; its output into `out`; returns the exit status. */
static int run(int np, const char *flags, const char *out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "OPENBLAS_NUM_THREADS=1 %s -np %d %s %s > %s 2>&1 < /dev/null", dt_test_mpirun(), np, GPT, flags, out);
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
typedef struct gpt_shape { int layers; int64_t width, vp, tctx; } gpt_shape;

/* The model's parameters, whole (global shapes), by name: what a checkpoint of any layout
   reassembles into. */
static void whole_params(dt_params *ps, gpt_shape s) {
    static const char *names[16] = {"ln1.w", "ln1.b", "attn.q.w", "attn.k.w", "attn.v.w", "attn.q.b", "attn.k.b",
                                    "attn.v.b", "attn.proj.w", "attn.proj.b", "ln2.w", "ln2.b", "mlp.fc.w",
                                    "mlp.fc.b", "mlp.proj.w", "mlp.proj.b"};
    const int64_t w = s.width;
    const int64_t shapes[16][2] = {{w, 0}, {w, 0}, {w, w}, {w, w}, {w, w}, {w, 0}, {w, 0}, {w, 0}, {w, w},
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

/* The worst over tensors of |a - b| / |b| (L2 norms of the whole tensor); *which = its name.
   In norms because Adam divides each grad by its own running RMS: where a grad is tiny (the
   key weights of near-uniform attention at init) its rounding difference becomes a visible
   step, so the elementwise worst case of a tensor (measured: 1.07e-5 of its largest value for
   h.1.attn.k.w at tp 4) says less than the tensor's relative error (about 1e-7 here).
   The key biases are left out: their gradient is zero in exact arithmetic (adding q.b_k to
   every score of a row leaves its softmax unchanged), so what they get is rounding noise,
   which Adam turns into lr-sized steps of random sign: they differ between any two sum orders
   (measured: by about their own size) and never change the loss. Every other tensor counts. */
static double weights_diff(const dt_params *a, const dt_params *b, const char **which) {
    double worst = 0;
    int i;
    int64_t k;
    *which = "";
    for (i = 0; i < a->count && i < b->count; i++) {
        const float *x = (const float *)a->items[i]->value.data, *y = (const float *)b->items[i]->value.data;
        double dd = 0, bb = 0, rel;
        size_t n = strlen(a->items[i]->name);
        if (n >= 8 && !strcmp(a->items[i]->name + n - 8, "attn.k.b")) continue;
        for (k = 0; k < a->items[i]->value.numel; k++) {
            double d = (double)x[k] - (double)y[k];
            dd += d * d;
            bb += (double)y[k] * (double)y[k];
        }
        rel = sqrt(dd) / (bb > 0 ? sqrt(bb) : 1);
        if (rel > worst || rel != rel) { worst = rel != rel ? INFINITY : rel; *which = a->items[i]->name; }
    }
    return worst;
}

#endif
